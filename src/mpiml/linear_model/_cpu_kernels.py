"""Compiled passes over dense host rows for the linear models: the augmented Gram matrix and the binary logistic
loss with its gradient, each reading ``X`` once on this rank's threads.

The rows are cut into parts (a function of the shape alone), which this rank's threads take one at
a time from a shared counter (:mod:`mpiml.utils._threads_jit`).  Part ``p`` adds into its own float64
partial sums, in row order, and the partials are added in part order at the end: the same input gives
the same bits with 1 or 64 threads.  The ranks' sums are then added by the caller's one allreduce.

* :func:`augmented_gram`: per block of a part (:data:`_GRAM_BLOCK_BYTES`, in a core's cache), the rows
  ``[x | y | 1]`` (and their weighted copy) formed in float64 in a buffer of the thread, and their
  product ``ZᵀWZ`` by BLAS on the calling thread (BLAS's own pool held to one thread meanwhile, so its
  threads and the kernel's never compete).  The NumPy path made four BLAS calls a block on the
  rank's whole pool (a wake-up of its threads each) plus, for F-ordered rows, strided reads.
* :func:`logistic_pass`: per row the margin ``x·w + b``, the loss ``log(1 + e^m) - y m`` and the
  gradient's contribution ``sw (expit(m) - y) x``, in float64, while the row is in cache: one read of
  ``X`` per evaluation where NumPy read it twice (``X w``, then ``Gᵀ X``) and made eight passes over
  the row vectors in between, on one thread.

Both take C- or F-ordered rows as they are (an F-ordered shard, as the generators of
:mod:`mpiml.datasets` make, is read column by column within a block); other strides are copied once.
"""

import math
import warnings

import numpy as np

from ..utils._jit import FASTMATH, numba
from ..utils._threads import one_blas_thread
from ..utils._threads_jit import fetch_add, workers

__all__ = ["augmented_gram", "LogisticPass", "MultinomialPass"]

nb = numba()

#: At most this many parts, each of at least this many rows.
_MAX_PARTS = 64
_MIN_ROWS = 2048
#: Bytes of a Gram block's float64 rows (and their weighted copy): in a core's L2 cache.
_GRAM_BLOCK_BYTES = 128 << 10
#: Rows per block of the logistic pass (its three row buffers, 48 KiB, stay in L2; an F-ordered block reads runs
#: of 16 KiB a column: 1.85 ms CPU an evaluation at 1e5 x 32, 2.1 with 512 rows).
_LOGISTIC_BLOCK = 2048


def _parts(n, k=1):
    """Parts of ``n`` rows (a function of the shape alone: the bits do not depend on the threads)."""
    by_memory = (64 << 20) // max(1, k * k * 8)
    return int(max(1, min(_MAX_PARTS, n // _MIN_ROWS, by_memory)))


def _rows_view(X):
    """``(R, transposed)`` for the kernels, without a copy where the rows allow: ``R`` C-contiguous, ``X`` itself,
    or ``Xᵀ`` of an F-ordered ``X``; a column-major (or row-major) ``X`` with a leading dimension larger than
    its rows (a block of rows of a bigger array, as a rank's shard of a generated F-ordered set) gives the
    C-contiguous view ``(d, ld)`` (or ``(n, ld)``) over its memory, of which the kernels read only the first
    ``n`` (or ``d``) entries of each row.  Other strides: a C-ordered copy."""
    n, d = X.shape
    item = X.itemsize
    s0, s1 = X.strides
    if X.flags.c_contiguous:
        return X, False
    if X.flags.f_contiguous:
        return X.T, True
    if n > 1 and d > 1 and s0 == item and s1 > 0 and s1 % item == 0 and s1 // item >= n:
        return np.lib.stride_tricks.as_strided(X, shape=(d, s1 // item), strides=(s1, item)), True
    if n > 1 and d > 1 and s1 == item and s0 > 0 and s0 % item == 0 and s0 // item >= d:
        return np.lib.stride_tricks.as_strided(X, shape=(n, s0 // item), strides=(s0, item)), False
    return np.ascontiguousarray(X), False


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _gram_kernel(R, tr, n, d, Y, w, unit, parts, block, workers, counter, out_p):
    """``out_p[p] = Zᵀ W Z`` of part ``p``'s rows, ``Z = [x | y | 1]`` (``R`` = X, or Xᵀ when ``tr``).

    (Rows and columns are read through views: an index ``b0 + i`` into ``R`` would carry Numba's
    negative-index check into the loop and keep it from vectorising, 2-3x slower.)
    """
    t = Y.shape[1]
    k = d + t + 1
    for _ in nb.prange(workers):
        zb = np.empty(block * k)
        zwb = np.empty(block * k) if not unit else zb
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            start = part * n // parts
            stop = (part + 1) * n // parts
            acc = out_p[part]
            for b0 in range(start, stop, block):
                m = min(stop, b0 + block) - b0
                Yb = Y[b0:b0 + m]
                wb = w[b0:b0 + m]
                if tr:   # a column-major block: every column a contiguous copy of a run of R's row
                    ZT = zb[:k * m].reshape((k, m))
                    for f in range(d):
                        src = R[f, b0:b0 + m]
                        dst = ZT[f]
                        for i in range(m):
                            dst[i] = src[i]
                    for j in range(t):
                        dst = ZT[d + j]
                        for i in range(m):
                            dst[i] = Yb[i, j]
                    ZT[k - 1, :] = 1.0
                    ZwT = zwb[:k * m].reshape((k, m))
                    if not unit:
                        for f in range(k):
                            src = ZT[f]
                            dst = ZwT[f]
                            for i in range(m):
                                dst[i] = np.float64(wb[i]) * src[i]
                    acc += np.dot(ZwT, ZT.T)
                else:
                    Z = zb[:m * k].reshape((m, k))
                    for i in range(m):
                        src = R[b0 + i]
                        dst = Z[i]
                        for f in range(d):
                            dst[f] = src[f]
                        for j in range(t):
                            dst[d + j] = Yb[i, j]
                        dst[k - 1] = 1.0
                    Zw = zwb[:m * k].reshape((m, k))
                    if not unit:
                        for i in range(m):
                            wi = np.float64(wb[i])
                            src = Z[i]
                            dst = Zw[i]
                            for f in range(k):
                                dst[f] = wi * src[f]
                    acc += np.dot(Zw.T, Z)


#: Numba's own entry to BLAS's ``dgemm`` (the one its ``np.dot`` calls: ``numba_xxgemm(kind, transa, transb, m, n,
#: k, alpha, a, lda, b, ldb, beta, c, ldc)``, column-major, SciPy's BLAS), declared here to pass a leading dimension:
#: a block of rows of ``X`` is then multiplied where it lies, C- or F-ordered, with no copy.  It is Numba's internal
#: entry, not its public API: should a Numba release rename, drop or change it, :func:`_direct_gram_usable` finds
#: out once per process and the unweighted float64 Gram falls back to NumPy's (with one warning).
try:
    _DGEMM = nb.types.ExternalFunction("numba_xxgemm", nb.types.intc(
        nb.types.char, nb.types.char, nb.types.char, nb.types.intp, nb.types.intp, nb.types.intp, nb.types.voidptr,
        nb.types.voidptr, nb.types.intp, nb.types.voidptr, nb.types.intp, nb.types.voidptr, nb.types.voidptr,
        nb.types.intp))
except (AttributeError, TypeError) as exc:   # (the kernel below then fails to compile: see _direct_gram_usable)
    _DGEMM = None
    _DGEMM_ERROR = exc
_D, _N, _T = 100, 110, 116   # 'd', 'n', 't'


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _gram_direct_kernel(R, tr, n, d, Y, groups, parts, block, workers, counter, out_p):
    """:func:`_gram_kernel` for float64 rows and unit weights, the lower triangle only: ``XᵀX`` by one ``dgemm``
    a group of features a block, on the rows where they lie (group ``[lo, hi)`` times features ``[lo, d)``: with
    ``q`` groups ``(q + 1) / 2q`` of the full product's work, see :func:`_gram_groups`), then ``Xᵀ y``, the
    column sums and ``yᵀ y`` while the block is in cache."""
    ld = R.shape[1]   # (the leading dimension: n, d, or more where R is a view over a bigger array's rows)
    t = Y.shape[1]
    k = d + t + 1
    one = np.ones(1)
    for _ in nb.prange(workers):
        xs = np.empty(d)
        xy = np.empty((t, d))
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            start = part * n // parts
            stop = (part + 1) * n // parts
            acc = out_p[part]
            xs[:] = 0.0
            xy[:] = 0.0
            # acc[r, c] (row stride k) is the column-major (c, r): group [lo, hi) fills acc[lo:d, lo:hi]
            for b0 in range(start, stop, block):
                m = min(stop, b0 + block) - b0
                Yb = Y[b0:b0 + m]
                if tr:   # X column-major (ld n): Xbᵀ Xb
                    for g in range(groups):
                        lo, hi = g * d // groups, (g + 1) * d // groups
                        _DGEMM(_D, _T, _N, hi - lo, d - lo, m, one.ctypes, R[lo:, b0:].ctypes, ld, R[lo:, b0:].ctypes,
                               ld, one.ctypes, acc[lo:, lo:].ctypes, k)
                    for f in range(d):
                        col = R[f, b0:b0 + m]
                        s = 0.0
                        for i in range(m):
                            s += col[i]
                        xs[f] += s
                        for j in range(t):
                            s = 0.0
                            for i in range(m):
                                s += col[i] * Yb[i, j]
                            xy[j, f] += s
                else:    # X row-major = Xᵀ column-major (ld d): (Xbᵀ)(Xbᵀ)ᵀ
                    for g in range(groups):
                        lo, hi = g * d // groups, (g + 1) * d // groups
                        _DGEMM(_D, _N, _T, hi - lo, d - lo, m, one.ctypes, R[b0:, lo:].ctypes, ld, R[b0:, lo:].ctypes,
                               ld, one.ctypes, acc[lo:, lo:].ctypes, k)
                    for i in range(m):
                        row = R[b0 + i]
                        for f in range(d):
                            xs[f] += row[f]
                        for j in range(t):
                            yv = Yb[i, j]
                            xyj = xy[j]
                            for f in range(d):
                                xyj[f] += row[f] * yv
                for j in range(t):
                    s = 0.0
                    for i in range(m):
                        s += Yb[i, j]
                    acc[k - 1, d + j] += s
                    for j2 in range(j, t):
                        s = 0.0
                        for i in range(m):
                            s += Yb[i, j] * Yb[i, j2]
                        acc[d + j2, d + j] += s
            for f in range(d):
                acc[k - 1, f] += xs[f]
                for j in range(t):
                    acc[d + j, f] += xy[j, f]
            acc[k - 1, k - 1] += stop - start


def _gram_groups(d, tr):
    """Feature groups of the direct Gram's GEMMs (group ``g`` times the features from its first on: ``(q + 1) / 2q``
    of the full product for ``q`` groups): groups of 16 features for C-ordered rows, of 4 for F-ordered ones, at
    most 8 (1e5 x 32 float64 on one core, best of 40: C-ordered 4.9 ms with 2 groups, 5.2-5.6 with 1, 4 or 8;
    F-ordered 4.7 with 8, 4.8 with 4, 5.3 with 2, 6.3 with 1)."""
    return int(max(1, min(8, d // (4 if tr else 16))))


def _run_direct(R, tr, n, d, Y64, parts, out_p):
    """:func:`_gram_direct_kernel` over ``parts`` parts on this rank's threads (BLAS held to one thread by the caller)."""
    rows = int(min(2048, max(64, _GRAM_BLOCK_BYTES // (8 * d))))
    _gram_direct_kernel(R, tr, n, d, Y64, _gram_groups(d, tr), parts, rows, workers(parts, nb.get_num_threads()),
                        np.zeros(1, np.int64), out_p)


#: Whether the direct Gram kernel compiles and agrees with NumPy in this process (None: not tried yet).
_DIRECT_USABLE = None


def _direct_gram_usable():
    """Whether :func:`_gram_direct_kernel` (Numba's internal ``numba_xxgemm``) works here: decided once per process.

    The first call checks that Numba still exports the entry (calling an unresolved symbol would abort the
    process, not raise), compiles the kernel (or loads it from the cache) and runs it on 300 x 5 rows, C- and
    F-ordered, against NumPy (a changed argument list gives wrong numbers, not an error).  On any failure it
    warns once and answers False from then on: the unweighted float64 Gram then goes through NumPy's
    :func:`mpiml.utils._linalg.augmented_gram` (the same matrix; 1e5 x 32 on one loaded core: C-ordered about as
    fast, F-ordered 2.5-3.5x slower: 17-27 ms against 5-9).
    """
    global _DIRECT_USABLE
    if _DIRECT_USABLE is None:
        _DIRECT_USABLE = _probe_direct_gram()
    return _DIRECT_USABLE


def _probe_direct_gram():
    from ..utils._linalg import augmented_gram as numpy_gram

    errors = (ImportError, AttributeError, TypeError, ValueError, NotImplementedError, RuntimeError, ArithmeticError,
              nb.core.errors.NumbaError)
    try:
        if _DGEMM is None:
            raise _DGEMM_ERROR
        from numba import _helperlib

        if "xxgemm" not in _helperlib.c_helpers:
            raise ImportError("numba._helperlib no longer exports xxgemm (numba_xxgemm)")
        rng = np.random.default_rng(0)
        X, Y = rng.standard_normal((300, 5)), rng.standard_normal((300, 1))
        for Xl in (X, np.asfortranarray(X)):
            R, tr = _rows_view(Xl)
            out = np.zeros((1, 7, 7))
            with one_blas_thread():
                _run_direct(R, tr, 300, 5, Y, 1, out)
            want = np.tril(numpy_gram(Xl, Y))
            if not np.allclose(np.tril(out[0]), want, rtol=1e-12, atol=1e-12):
                raise ArithmeticError(f"its Gram of 300 x 5 {'F' if tr else 'C'}-ordered rows differs from NumPy's")
    except errors as exc:
        warnings.warn(f"mpiml: the compiled Gram kernel (Numba's internal numba_xxgemm) is unavailable in numba "
                      f"{nb.__version__} ({type(exc).__name__}: {exc}); the host linear models form their Gram "
                      "matrices with NumPy instead (the same matrix, slower).", RuntimeWarning, stacklevel=4)
        return False
    return True


def augmented_gram(X, Y, sw=None):
    """This rank's ``ZᵀWZ``, ``Z = [X | Y | 1]`` (float64 ``(k, k)``, ``k = d + t + 1``), one read of ``X``.

    The same matrix as :func:`mpiml.utils._linalg.augmented_gram` (``XᵀWX``, ``XᵀWY``, ``YᵀWY``, the
    weighted column sums last, the weight total in the corner); non-finite input gives a non-finite
    result.  ``Y`` is 2-D; ``sw`` the row weights or None.  Unweighted float64 rows go through
    :func:`_gram_direct_kernel`, or NumPy's Gram where that kernel does not work (:func:`_direct_gram_usable`).
    """
    n, d = X.shape
    t = Y.shape[1]
    k = d + t + 1
    if n == 0:
        return np.zeros((k, k))
    R, tr = _rows_view(X)
    unit = sw is None
    direct = unit and R.dtype == np.float64 and n < 2 ** 31   # (BLAS's leading dimension is a 32-bit int)
    if direct and not _direct_gram_usable():
        from ..utils._linalg import augmented_gram as numpy_gram

        return numpy_gram(X, Y)
    Y64 = np.ascontiguousarray(Y, dtype=np.float64)
    w = np.ones(1) if unit else np.ascontiguousarray(sw, dtype=np.float64)
    parts = _parts(n, k)
    block = int(min(2048, max(64, _GRAM_BLOCK_BYTES // (8 * k * (1 if unit else 2)))))
    out_p = np.zeros((parts, k, k))
    with np.errstate(over="ignore", invalid="ignore"), one_blas_thread():
        if direct:
            _run_direct(R, tr, n, d, Y64, parts, out_p)
        else:
            _gram_kernel(R, tr, n, d, Y64, w, unit, parts, block, workers(parts, nb.get_num_threads()),
                         np.zeros(1, np.int64), out_p)
    G = out_p[0].copy()
    for p in range(1, parts):
        G += out_p[p]
    # symmetric bits: the lower triangle mirrored (the direct kernel fills only it; the weighted product WZ x Z
    # rounds its two triangles differently)
    return np.tril(G) + np.tril(G, -1).T


#: ``ln 2`` split for the exponential's range reduction (``k ln2_hi`` exact for the ``k`` that occur), and ``1/ln 2``.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _exp_reduced(r):
    """``e^r`` for ``|r| <= ln2 / 2``: Taylor to ``r^13`` (the next term is below 1e-17 relative)."""
    p = 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    return p * r + 1.0


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH, inline="always")
def _log1p_unit(e):
    """``log(1 + e)`` for ``0 <= e <= 1``: ``2 atanh(s)``, ``s = e / (2 + e) <= 1/3``, its series to ``s^35``."""
    s = e / (2.0 + e)
    s2 = s * s
    p = 1.0 / 35.0
    p = p * s2 + 1.0 / 33.0
    p = p * s2 + 1.0 / 31.0
    p = p * s2 + 1.0 / 29.0
    p = p * s2 + 1.0 / 27.0
    p = p * s2 + 1.0 / 25.0
    p = p * s2 + 1.0 / 23.0
    p = p * s2 + 1.0 / 21.0
    p = p * s2 + 1.0 / 19.0
    p = p * s2 + 1.0 / 17.0
    p = p * s2 + 1.0 / 15.0
    p = p * s2 + 1.0 / 13.0
    p = p * s2 + 1.0 / 11.0
    p = p * s2 + 1.0 / 9.0
    p = p * s2 + 1.0 / 7.0
    p = p * s2 + 1.0 / 5.0
    p = p * s2 + 1.0 / 3.0
    return 2.0 * s + 2.0 * s * s2 * p


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _logistic_kernel(R, tr, n, d, y01, w, unit, coef, bias, parts, block, workers, counter, out_p):
    """Per part: ``[Σ sw·loss | Σ g x | Σ g]`` with ``g = sw (expit(m) - y)``, ``m = x·coef + bias``.

    Per block: the margins; ``e = exp(-|m|)`` and ``log1p(e)`` by polynomials, without branches, so that
    the loop over the rows vectorises (the C library's scalar calls and a branch on the sign of every
    margin cost 3x the rest of the pass; both polynomials are within 2.2 ulp); then the gradient.  Rows
    and columns are read through views, as in :func:`_gram_kernel`.
    """
    for _ in nb.prange(workers):
        marg = np.empty(block)
        ev = np.empty(block)
        bits = np.empty(block, np.int64)
        scale = bits.view(np.float64)
        acc = np.empty(d)
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            start = part * n // parts
            stop = (part + 1) * n // parts
            acc[:] = 0.0
            loss = 0.0
            gsum = 0.0
            for b0 in range(start, stop, block):
                m = min(stop, b0 + block) - b0
                yb = y01[b0:b0 + m]
                wb = w[b0:b0 + m]
                if tr:   # (four columns a pass: a quarter of the passes over the margins)
                    marg[:m] = bias
                    f = 0
                    while f + 4 <= d:
                        c0, c1, c2, c3 = coef[f], coef[f + 1], coef[f + 2], coef[f + 3]
                        x0, x1 = R[f, b0:b0 + m], R[f + 1, b0:b0 + m]
                        x2, x3 = R[f + 2, b0:b0 + m], R[f + 3, b0:b0 + m]
                        for i in range(m):
                            marg[i] += ((np.float64(x0[i]) * c0 + np.float64(x1[i]) * c1)
                                        + (np.float64(x2[i]) * c2 + np.float64(x3[i]) * c3))
                        f += 4
                    for f in range(f, d):
                        c = coef[f]
                        col = R[f, b0:b0 + m]
                        for i in range(m):
                            marg[i] += np.float64(col[i]) * c
                else:
                    for i in range(m):
                        row = R[b0 + i]
                        s = 0.0
                        for f in range(d):
                            s += np.float64(row[f]) * coef[f]
                        marg[i] = s + bias
                for i in range(m):   # e^{-|m|} = 2^-k e^r, r = k ln2 - |m| (|m| capped where e^{-|m|} underflows)
                    a = min(abs(marg[i]), 708.0)
                    kf = math.floor(a * _INV_LN2 + 0.5)
                    ev[i] = _exp_reduced((kf * _LN2_HI - a) + kf * _LN2_LO)
                    bits[i] = (1023 - np.int64(kf)) << 52
                for i in range(m):
                    z = marg[i]
                    e = ev[i] * scale[i]
                    yi = np.float64(yb[i])
                    wi = 1.0 if unit else np.float64(wb[i])
                    lo = max(z, 0.0) + _log1p_unit(e) - yi * z
                    p = (1.0 if z >= 0.0 else e) / (1.0 + e)
                    g = wi * (p - yi)
                    loss += wi * lo
                    gsum += g
                    marg[i] = g
                if tr:
                    f = 0
                    while f + 4 <= d:
                        x0, x1 = R[f, b0:b0 + m], R[f + 1, b0:b0 + m]
                        x2, x3 = R[f + 2, b0:b0 + m], R[f + 3, b0:b0 + m]
                        s0 = s1 = s2 = s3 = 0.0
                        for i in range(m):
                            g = marg[i]
                            s0 += g * np.float64(x0[i])
                            s1 += g * np.float64(x1[i])
                            s2 += g * np.float64(x2[i])
                            s3 += g * np.float64(x3[i])
                        acc[f] += s0
                        acc[f + 1] += s1
                        acc[f + 2] += s2
                        acc[f + 3] += s3
                        f += 4
                    for f in range(f, d):
                        col = R[f, b0:b0 + m]
                        s = 0.0
                        for i in range(m):
                            s += marg[i] * np.float64(col[i])
                        acc[f] += s
                else:
                    for i in range(m):
                        g = marg[i]
                        row = R[b0 + i]
                        for f in range(d):
                            acc[f] += g * np.float64(row[f])
            out_p[part, 0] = loss
            out_p[part, 1:1 + d] = acc
            out_p[part, 1 + d] = gsum


#: Rows per block of the multinomial pass (its ``3 k`` row buffers in L2 up to a few tens of classes).
_MULTINOMIAL_BLOCK = 512


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _multinomial_kernel(R, tr, n, d, y_idx, w, unit, coef, bias, parts, block, workers, counter, out_p):
    """Per part: ``[Σ sw·loss | Σ G x (k x d) | Σ G (k)]``, ``G = sw (softmax(m) - onehot(y))``, ``m = W x + b``.

    Per block: the margins (``(k, rows)``), their row maxima, ``exp(m - max)`` by the polynomial of
    :func:`_logistic_kernel` (branch-free, vectorised over the rows), the log-sum-exp (one scalar ``log`` a
    row), then ``G`` in place of the exponentials and the gradient: one read of ``X``.
    """
    k = coef.shape[0]
    for _ in nb.prange(workers):
        M = np.empty((k, block))
        E = np.empty((k, block))
        bits = np.empty((k, block), np.int64)
        scale = bits.view(np.float64)
        mx = np.empty(block)
        ssum = np.empty(block)
        acc = np.empty((k, d))
        gsum = np.empty(k)
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            start = part * n // parts
            stop = (part + 1) * n // parts
            acc[:] = 0.0
            gsum[:] = 0.0
            loss = 0.0
            for b0 in range(start, stop, block):
                m = min(stop, b0 + block) - b0
                yb = y_idx[b0:b0 + m]
                wb = w[b0:b0 + m]
                if tr:
                    for c in range(k):
                        M[c, :m] = bias[c]
                    for f in range(d):
                        col = R[f, b0:b0 + m]
                        for c in range(k):
                            wc = coef[c, f]
                            Mc = M[c]
                            for i in range(m):
                                Mc[i] += np.float64(col[i]) * wc
                else:
                    for i in range(m):
                        row = R[b0 + i]
                        for c in range(k):
                            wrow = coef[c]
                            s = 0.0
                            for f in range(d):
                                s += np.float64(row[f]) * wrow[f]
                            M[c, i] = s + bias[c]
                mx[:m] = M[0, :m]
                for c in range(1, k):
                    Mc = M[c]
                    for i in range(m):
                        mx[i] = max(mx[i], Mc[i])
                ssum[:m] = 0.0
                for c in range(k):
                    Mc, Ec, bc, sc = M[c], E[c], bits[c], scale[c]
                    for i in range(m):   # e^{m - max} = 2^-k e^r, as in _logistic_kernel
                        a = min(mx[i] - Mc[i], 708.0)
                        kf = math.floor(a * _INV_LN2 + 0.5)
                        Ec[i] = _exp_reduced((kf * _LN2_HI - a) + kf * _LN2_LO)
                        bc[i] = (1023 - np.int64(kf)) << 52
                    for i in range(m):
                        Ec[i] *= sc[i]
                        ssum[i] += Ec[i]
                for i in range(m):
                    wi = 1.0 if unit else np.float64(wb[i])
                    loss += wi * (mx[i] + math.log(ssum[i]) - M[yb[i], i])
                    ssum[i] = 1.0 / ssum[i]
                for c in range(k):
                    Ec = E[c]
                    g_c = 0.0
                    for i in range(m):
                        wi = 1.0 if unit else np.float64(wb[i])
                        g = wi * (Ec[i] * ssum[i] - (1.0 if yb[i] == c else 0.0))
                        Ec[i] = g
                        g_c += g
                    gsum[c] += g_c
                if tr:
                    for f in range(d):
                        col = R[f, b0:b0 + m]
                        for c in range(k):
                            Ec = E[c]
                            s = 0.0
                            for i in range(m):
                                s += Ec[i] * np.float64(col[i])
                            acc[c, f] += s
                else:
                    for i in range(m):
                        row = R[b0 + i]
                        for c in range(k):
                            g = E[c, i]
                            ac = acc[c]
                            for f in range(d):
                                ac[f] += g * np.float64(row[f])
            out_p[part, 0] = loss
            for c in range(k):
                out_p[part, 1 + c * d:1 + (c + 1) * d] = acc[c]
                out_p[part, 1 + k * d + c] = gsum[c]


class LogisticPass:
    """The binary logistic loss and gradient of dense host rows, one compiled read of ``X`` per call.

    ``(coef, intercept) -> [Σ sw·loss | Σ g x | scale · Σ g]`` (float64; the last entry only with an
    intercept), unscaled, as :meth:`mpiml.linear_model._logistic_loss.Objective._local` packs it.
    """

    def __init__(self, X, y01, sw, *, fit_intercept, scale=1.0):
        self.n, self.d = X.shape
        self.R, self.tr = _rows_view(X)
        self.y01 = np.ascontiguousarray(y01)
        self.unit = sw is None
        self.w = np.ones(1) if self.unit else np.ascontiguousarray(sw)
        self.fi, self.scale = bool(fit_intercept), float(scale)
        self.parts = _parts(self.n)
        self.out_p = np.zeros((self.parts, self.d + 2))

    def __call__(self, coef, intercept):
        d = self.d
        out = np.zeros(1 + d + self.fi)
        if self.n == 0:
            return out
        self.out_p[:] = 0.0
        _logistic_kernel(self.R, self.tr, self.n, self.d, self.y01, self.w, self.unit,
                         np.ascontiguousarray(coef, dtype=np.float64), float(intercept), self.parts, _LOGISTIC_BLOCK,
                         workers(self.parts, nb.get_num_threads()), np.zeros(1, np.int64), self.out_p)
        total = self.out_p[0].copy()
        for p in range(1, self.parts):
            total += self.out_p[p]
        out[:1 + d] = total[:1 + d]
        if self.fi:
            out[1 + d] = self.scale * total[1 + d]
        return out


class MultinomialPass:
    """The multinomial logistic loss and gradient of dense host rows, one compiled read of ``X`` per call.

    ``(coef (k, d), intercept (k,)) -> [Σ sw·loss | grad (k, d + fit_intercept) flattened]`` (float64,
    unscaled, the intercept's column ``scale · Σ G``), as
    :meth:`mpiml.linear_model._logistic_loss.Objective._local` packs it.
    """

    def __init__(self, X, y_idx, sw, n_classes, *, fit_intercept, scale=1.0):
        self.n, self.d = X.shape
        self.k = int(n_classes)
        self.R, self.tr = _rows_view(X)
        self.y_idx = np.ascontiguousarray(y_idx, dtype=np.int64)
        self.unit = sw is None
        self.w = np.ones(1) if self.unit else np.ascontiguousarray(sw)
        self.fi, self.scale = bool(fit_intercept), float(scale)
        self.parts = _parts(self.n)
        self.out_p = np.zeros((self.parts, 1 + self.k * (self.d + 1)))

    def __call__(self, coef, intercept):
        k, d = self.k, self.d
        out = np.zeros(1 + k * (d + self.fi))
        if self.n == 0:
            return out
        self.out_p[:] = 0.0
        _multinomial_kernel(self.R, self.tr, self.n, d, self.y_idx, self.w, self.unit,
                            np.ascontiguousarray(coef, dtype=np.float64),
                            np.ascontiguousarray(intercept, dtype=np.float64), self.parts, _MULTINOMIAL_BLOCK,
                            workers(self.parts, nb.get_num_threads()), np.zeros(1, np.int64), self.out_p)
        total = self.out_p[0].copy()
        for p in range(1, self.parts):
            total += self.out_p[p]
        grad = out[1:].reshape(k, d + self.fi)
        out[0] = total[0]
        grad[:, :d] = total[1:1 + k * d].reshape(k, d)
        if self.fi:
            grad[:, d] = self.scale * total[1 + k * d:]
        return out
