"""Exact k nearest rows on the CPU: a running top-k per query, compiled with Numba.

:func:`topk` is what :func:`mpiml.neighbors._ring.local_topk` runs for dense NumPy rows.
Per query the ``k`` best so far are kept in a small sorted array; a candidate costs one
compare against the running ``k``-th value, only a better one is inserted (the worse
ones shift down).  No distance matrix is kept and nothing is sorted.  Index rows are met
in increasing order and a candidate enters only if strictly better than the ``k``-th,
after every equal one: exact ties go to the lower index, as in scikit-learn's brute force.

* Euclidean, squared euclidean, cosine (:func:`_topk_screened`): tiles of ``Q @ X.T`` by
  BLAS (the fastest way to touch every pair; one BLAS thread per query block, the blocks in
  parallel, so BLAS's and Numba's threads never compete) *screen* the candidates with a proven bound
  on their rounding; a candidate that may beat the ``k``-th value is then measured exactly
  by :func:`_pair`, from differences in float64 (``sum (q - x)^2``), so a query equal to an
  index row is at distance exactly 0 and identical rows give identical distances.
  Cosine works on unit rows (parallel rows of any length tie exactly), a zero row at 1.
  float64 rows are screened in float32 (:func:`_screen_rows`: shifted by a mean of the index
  block's rows, rounded once; the bound covers that rounding): the screen only decides which pairs are
  measured, so the answer is the float64 one, and single-precision tiles are half the bytes
  and twice the lanes of the GEMM and the screen (about 70 % of the search's time).  A float32
  screen runs fused (:mod:`mpiml.neighbors._fused`, :data:`FUSED`): the products stay in registers
  and are compared there, no tile is written; BLAS tiles and :func:`_select_tile` screen in float64.
* Manhattan, chebyshev, minkowski (:func:`_topk_kernel`): queries in parallel blocks of
  :data:`_QUERY_BLOCK`, the index in cache-sized blocks of :data:`_INDEX_BLOCK` rows,
  distances accumulated in float64; minkowski compares ``sum |q - x|^p`` and takes the
  ``p``-th root of the ``k`` kept only.

Queries (or a tile's query rows) run in parallel: the threads of this rank, limited by
:mod:`mpiml.utils._threads`; the screened search's threads take query blocks from a shared
counter (:mod:`mpiml.utils._threads_jit`), so a slow thread takes fewer.
"""


import time

import numpy as np

from ..utils._jit import FASTMATH, numba
from ..utils._threads import one_blas_thread
from ..utils._threads_jit import fetch_add, workers
# the pieces both CPU searches use (also names of this module: _ring, the tests)
from ._lists import METRICS, _TILE_QUERIES, _bar, _beats, _insert, _pair  # noqa: F401
from ._lists import _query_blocks, _query_bounds, shifted_row  # noqa: F401

__all__ = ["topk", "merge_block", "new_lists", "finish", "carry_payload", "search_screened", "METRICS"]

nb = numba()

#: Queries per parallel task: enough per task to amortise reading an index block, few
#: enough that every thread gets blocks (a small query batch still spreads over the threads).
_QUERY_BLOCK = 16
#: seconds of the last screened search's serial preparation (the rows shifted and rounded for the screen)
PHASES = {}
#: Columns of a GEMM tile screened together by a vectorised minimum before any is looked at alone.
_GROUP = 32
#: Index rows per block: 256 rows of 64 float64 features are 128 KiB, an L2-sized tile.
_INDEX_BLOCK = 256


@nb.njit(cache=True, parallel=True, fastmath=FASTMATH)
def _topk_kernel(Q, X, offset, k, metric, p, qnorm, xnorm, bd_all, bi_all):
    """Merge the rows of ``X`` (global indices ``offset + j``) into the running lists ``bd_all``, ``bi_all``."""
    nq = Q.shape[0]
    m = X.shape[0]
    nblocks = (nq + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for b in nb.prange(nblocks):
        q0 = b * _QUERY_BLOCK
        q1 = min(nq, q0 + _QUERY_BLOCK)
        bd = bd_all[q0:q1]
        bi = bi_all[q0:q1]
        for x0 in range(0, m, _INDEX_BLOCK):
            x1 = min(m, x0 + _INDEX_BLOCK)
            for qi in range(q0, q1):
                r = qi - q0
                worst = bd[r, k - 1]
                q = Q[qi]
                qn = qnorm[qi]
                for j in range(x0, x1):
                    dist = _pair(q, X[j], metric, p, qn, xnorm[j])
                    if dist <= worst and _beats(dist, offset + j, bd, bi, r, k):
                        _insert(bd, bi, r, k, dist, offset + j)
                        worst = bd[r, k - 1]


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _select_tile(G, Q, X, x0, offset, metric, qn, xn, qs, screen, rel, slack, bd, bi):
    """Merge one tile of GEMM products ``G`` (of the screen's rows: ``QS @ XS[x0:x0 + G.shape[1]].T``)
    into the running lists.

    ``G`` only screens: a column is looked at exactly (by :func:`_pair`, from differences of
    ``Q`` and ``X``) when its screened value, less the rounding bound of the product, can beat
    the running ``k``-th value.  The bound of a dot product of length ``d`` summed in any
    order is ``gamma_d sum |q_f x_f| <= gamma_d |q| |x|`` (``rel`` >= twice ``gamma_d``), so
    no row that belongs in the top ``k`` is screened out, and what is kept is exact.  ``qs``:
    the norms of the screen's query rows (``qn``: of the rows themselves, for cosine).
    """
    nq = G.shape[0]
    width = G.shape[1]
    k = bd.shape[1]
    for r in range(nq):
        q = Q[r]
        a = qn[r]
        s = qs[r]
        worst = bd[r, k - 1]
        bar = _bar(metric, s, worst, rel, slack)
        for c0 in range(0, width, _GROUP):
            c1 = min(width, c0 + _GROUP)
            low = np.inf                      # a vectorised pass: does any column of the group pass?
            for c in range(c0, c1):
                v = -np.float64(G[r, c]) if metric == 2 else screen[x0 + c] - 2.0 * np.float64(G[r, c])
                low = min(low, v)
            if low > bar:
                continue
            for c in range(c0, c1):
                j = x0 + c
                g = np.float64(G[r, c])
                if metric == 2:
                    hit = -g * screen[j] <= bar
                else:
                    hit = screen[j] - 2.0 * g <= bar
                if hit:
                    dist = _pair(q, X[j], metric, 2.0, a, xn[j])
                    if dist <= worst and _beats(dist, offset + j, bd, bi, r, k):
                        _insert(bd, bi, r, k, dist, offset + j)
                        worst = bd[r, k - 1]
                        bar = _bar(metric, s, worst, rel, slack)


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _screened_blocks(Q, X, QS, XS, offset, k, metric, qn, xn, qs, screen, rel, slack, bounds, workers, bd_all,
                     bi_all, counter):
    """The query blocks ``bounds[b]:bounds[b + 1]`` (:func:`_query_bounds`: large first, smaller at the end),
    taken in order by the threads from the shared ``counter`` (zero on entry;
    :mod:`mpiml.utils._threads_jit`; in node memory, the threads of every rank of the node take from it:
    :mod:`mpiml.neighbors._node`); per block, tiles of the index: the tile's GEMM of the screen's rows
    ``QS``, ``XS`` (one BLAS thread: the threads of this rank run blocks side by side) then
    :func:`_select_tile` while the tile is in cache."""
    m = X.shape[0]
    nblocks = bounds.shape[0] - 1
    for _ in nb.prange(workers):
        while True:
            b = fetch_add(counter)
            if b >= nblocks:
                break
            q0 = bounds[b]
            q1 = bounds[b + 1]
            if q1 == q0:
                continue
            # an index tile of the block's GEMM: _TILE products at most (in cache for the selection)
            xstep = min(8192, max(_INDEX_BLOCK, _TILE // (q1 - q0)))
            bd = bd_all[q0:q1]
            bi = bi_all[q0:q1]
            QSb = QS[q0:q1]
            for x0 in range(0, m, xstep):
                x1 = min(m, x0 + xstep)
                G = np.dot(QSb, XS[x0:x1].T)
                _select_tile(G, Q[q0:q1], X, x0, offset, metric, qn[q0:q1], xn, qs[q0:q1], screen, rel, slack, bd,
                             bi)


@nb.njit(cache=True, parallel=True, nogil=True)
def _screen_rows(A, shift, out, norms, snorms):
    """``out = A - shift`` in the screen's precision, ``norms`` / ``snorms`` the float64 norms of the rows of ``A``
    and of ``A - shift`` (:func:`shifted_row`), in parallel over the rows."""
    for i in nb.prange(A.shape[0]):
        norms[i], snorms[i] = shifted_row(A[i], shift, out[i])


#: Entries of one GEMM tile (queries x index rows): written by BLAS and read once by the
#: selection while in cache (2^17 float32: 512 KiB, so that the two hardware threads of a core each
#: keep theirs in a 2 MiB L2; 2^18 was 2-4 % slower on one thread of this project's VM).
_TILE = 1 << 17
#: float64 rows screened in float32 (see the module notes); False: in float64 (for comparisons; also
#: ``MPIML_KNN_SCREEN=float64``).
SCREEN_FLOAT32 = True
#: float32 screens run fused (:mod:`mpiml.neighbors._fused`: products in registers); False: BLAS tiles and
#: :func:`_select_tile` (for comparisons)
FUSED = True
#: Largest row norm (after the shift) screened in float32: products and sums stay below float32's largest
#: value (2^62 squared is 2^124 < 2^128); rows beyond it are screened in float64.
_F32_MAX_NORM = 2.0 ** 62


def _screen_dtype(Q, metric):
    import os

    if Q.dtype != np.float64 or not SCREEN_FLOAT32 or os.environ.get("MPIML_KNN_SCREEN") == "float64":
        return Q.dtype
    return np.dtype(np.float32)


def _topk_screened(Q, X, offset, k, metric, bd, bi, counter=None, threads=None):
    """Euclidean, squared euclidean and cosine: tiles of ``Q @ X.T`` by BLAS screen the
    candidates, which :func:`_select_tile` then measures exactly into the running lists.

    The screen's rows: euclidean metrics shift both sides by the mean of about a thousand of the index
    block's rows (distances do not change; the rounding bound, relative to the shifted norms, shrinks for rows far from the
    origin), cosine takes unit rows; float64 rows are rounded to float32 once (:func:`_screen_dtype`).
    Bound: a product of the rounded rows, in any order, is within ``(d + 3) u |q| |x|`` of the exact
    one (``u`` the unit roundoff of the screen's precision: ``d`` roundings in the sum, three of the
    rounded operands), below the ``rel = 2 (d + 4) eps = 4 (d + 4) u`` that :func:`_bar` allows; the
    shift's float64 rounding and :func:`_pair`'s are far inside that margin.  Underflow in the screen's
    precision (subnormal values, each off by at most ``eta``, half its smallest step) adds at most
    ``eta (2 d + 1 + sqrt(d) (|q| + |x|))`` to a product: ``slack``, twice that at the largest norms.
    """
    t0 = time.perf_counter()
    nq, d = Q.shape
    m = X.shape[0]
    sdt = _screen_dtype(Q, metric)
    if metric == "cosine":  # unit rows in float64 (parallel rows of any length: the same unit row, distance)
        qn, xn = _norms(Q, "cosine"), _norms(X, "cosine")
        Q, X = _unit(Q, qn), _unit(X, xn)
        QS, XS, _, _, _, _ = _screen_of(Q, X, np.zeros(d), sdt)
        qs, xs, big = qn, None, 1.0
    else:
        # any shift is exact (distances do not change); the mean of about a thousand rows is as good as the full
        # mean at shrinking the norms, and costs no serial pass over the block
        shift = X[::max(1, m // 1024)].mean(axis=0, dtype=np.float64)
        QS, XS, qn, qs, xn, xs = _screen_of(Q, X, shift, sdt)
        big = max(float(qs.max()), float(xs.max()))
        if sdt != Q.dtype and not big <= _F32_MAX_NORM:  # far beyond float32's range (or not finite): float64
            QS, XS, qn, qs, xn, xs = _screen_of(Q, X, shift, Q.dtype)
    PHASES["screen_rows_s"] = time.perf_counter() - t0
    search_screened(Q, X, QS, XS, qn, xn, qs, xs, big, offset, k, metric, bd, bi, counter, threads)


def _screen_of(Q, X, shift, sdt):
    """``(QS, XS, qn, qs, xn, xs)``: the screen's rows of ``Q`` and ``X`` shifted by ``shift`` in ``sdt``, packed for
    the fused search where ``sdt`` is float32 (:func:`mpiml.neighbors._fused.pack_rows`), else plain rows for
    BLAS; the rows' norms and their shifted norms."""
    nq, d = Q.shape
    m = X.shape[0]
    qn, qs, xn, xs = np.empty(nq), np.empty(nq), np.empty(m), np.empty(m)
    if sdt == np.float32 and FUSED:
        from . import _fused

        QS = np.empty(_fused.packed_shape(nq, d, _fused.R), dtype=sdt)
        XS = np.empty(_fused.packed_shape(m, d, _fused.W), dtype=sdt)
        _fused.pack_rows(Q, shift, 0, QS, qn, qs)
        _fused.pack_rows(X, shift, 0, XS, xn, xs)
        _fused.zero_padding(QS, nq)
        _fused.zero_padding(XS, m)
    else:
        QS, XS = np.empty(Q.shape, dtype=sdt), np.empty(X.shape, dtype=sdt)
        _screen_rows(Q, shift, QS, qn, qs)
        _screen_rows(X, shift, XS, xn, xs)
    return QS, XS, qn, qs, xn, xs


def search_screened(Q, X, QS, XS, qn, xn, qs, xs, big, offset, k, metric, bd, bi, counter=None, threads=None):
    """The search of :func:`_topk_screened` on prepared screen rows ``QS``, ``XS`` (their shifted norms ``qs``,
    ``xs``; ``xs`` None for cosine, whose rows are unit rows; ``big`` the largest of those norms), also prepared
    in node memory by the ranks together (:mod:`mpiml.neighbors._node`)."""
    nq, d = Q.shape
    sdt = QS.dtype
    eps = float(np.finfo(sdt).eps)  # the product runs in the precision of its operands (a float64 bound)
    rel = 2.0 * (d + 4) * eps
    eta = float(np.finfo(sdt).smallest_subnormal) / 2
    slack = 2.0 * eta * (2 * d + 1 + np.sqrt(d) * 2.0 * (big + 1.0))
    screen = np.ones(X.shape[0]) if xs is None else (1.0 - 2.0 * rel) * xs * xs
    if QS.ndim == 3:  # packed float32 rows: the fused search
        from . import _fused

        with one_blas_thread():
            _fused.search_fused(Q, X, QS, XS, qn, xn, qs, screen, rel, slack, offset, metric, bd, bi,
                                np.zeros(1, np.int64) if counter is None else counter, threads)
        return
    # ``threads``: of every process taking blocks from ``counter`` (the same count on each: the same blocks)
    bounds = _query_bounds(nq, threads or nb.get_num_threads())
    with one_blas_thread():
        _screened_blocks(Q, X, QS, XS, offset, k, METRICS[metric], qn, xn, qs, screen, rel, slack, bounds,
                         workers(len(bounds) - 1, nb.get_num_threads()), bd, bi,
                         np.zeros(1, np.int64) if counter is None else counter)


def _unit(A, norms):
    return A.astype(np.float64) / np.where(norms > 0, norms, 1.0)[:, None]


def _norms(A, metric):
    if metric != "cosine":
        return np.zeros(A.shape[0])
    A64 = A.astype(np.float64, copy=False)
    return np.sqrt(np.einsum("ij,ij->i", A64, A64))


def new_lists(n_queries, k):
    """Empty running lists for :func:`merge_block`: ``(compared values float64, global indices int64)``,
    every slot ``(inf, int64 max)``."""
    return np.full((n_queries, k), np.inf), np.full((n_queries, k), np.iinfo(np.int64).max, dtype=np.int64)


def merge_block(Q, X, offset, bd, bi, metric="euclidean", p=None, counter=None, threads=None):
    """Merge the rows of ``X`` (global indices ``offset``, ``offset + 1``, ...) into the running lists.

    ``bd`` (float64) and ``bi`` (int64), of shape ``(n_queries, k)``, hold the compared values
    (squared euclidean for ``"euclidean"``, ``sum |q - x|^p`` for minkowski: see :func:`finish`)
    and global indices, sorted by (value, index); they are updated in place.  Blocks may come
    in any order: the result is the ``k`` smallest by (value, index) of every row met.

    ``counter`` (int64 ``[0]``, zero) and ``threads`` (euclidean, squared euclidean, cosine): the query blocks
    are taken from ``counter``, shared with other processes whose threads number ``threads`` in all, each
    running this call on the same arguments (:mod:`mpiml.neighbors._node`); a block's rows of the lists are
    written by whichever thread takes it.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {sorted(METRICS)})")
    k = bd.shape[1]
    if not Q.shape[0] or not X.shape[0] or not k:
        return bd, bi
    Q = np.ascontiguousarray(Q)
    X = np.ascontiguousarray(X, dtype=Q.dtype)
    if metric in ("euclidean", "sqeuclidean", "cosine"):
        _topk_screened(Q, X, int(offset), int(k), metric, bd, bi, counter, threads)
    else:
        power = float(p) if metric == "minkowski" else 2.0
        _topk_kernel(Q, X, int(offset), int(k), METRICS[metric], power, _norms(Q, metric), _norms(X, metric), bd, bi)
    return bd, bi


@nb.njit(cache=True, nogil=True)
def _carry(before, pay, after, offset, Y, out):
    n, k = after.shape
    m = Y.shape[0]
    t = Y.shape[1]
    for r in range(n):
        ptr = 0  # the entries kept from ``before`` are in the same order in ``after``
        for c in range(k):
            g = after[r, c]
            if offset <= g < offset + m:
                for f in range(t):
                    out[r, c, f] = Y[g - offset, f]
                continue
            while ptr < k and before[r, ptr] != g:
                ptr += 1
            if ptr < k:
                for f in range(t):
                    out[r, c, f] = pay[r, ptr, f]
                ptr += 1


def carry_payload(before, pay, after, offset, Y):
    """The payload ``(n, k, t)`` of the lists ``after`` a :func:`merge_block` of ``Y``'s rows at ``offset``:
    a row's own for the entries of the block, the one it had in ``before`` (with ``pay``) for the others."""
    out = np.zeros_like(pay)
    _carry(before, pay, after, int(offset), np.ascontiguousarray(Y, dtype=np.float64), out)
    return out


def finish(bd, metric, p=None, dtype=np.float64):
    """The distances of running lists' compared values: the square root (euclidean), the ``p``-th
    root (minkowski), in ``dtype``."""
    if metric == "euclidean":
        return np.sqrt(bd).astype(dtype, copy=False)
    if metric == "minkowski":
        return (bd ** (1.0 / float(p))).astype(dtype, copy=False)
    return bd.astype(dtype, copy=False)


def topk(Q, X, k, metric="euclidean", p=None):
    """``(distances, local indices)`` of the ``k`` nearest rows of ``X`` for every row of ``Q``.

    Parameters
    ----------
    Q : ndarray of shape (n_queries, d)
        Dense float32 or float64 query rows.
    X : ndarray of shape (m, d)
        Dense index rows, same dtype; ``1 <= k <= m``.
    metric : {"euclidean", "sqeuclidean", "cosine", "manhattan", "chebyshev", "minkowski"}
    p : float, default=None
        Minkowski's power (``metric="minkowski"`` only).

    Returns
    -------
    distances : ndarray of shape (n_queries, k), dtype of ``Q``
        Ascending per row.
    indices : ndarray of shape (n_queries, k), int64
        Rows of ``X``; exact ties ordered by index.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {sorted(METRICS)})")
    m = X.shape[0]
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] (the index rows), got {k}")
    bd, bi = merge_block(Q, X, 0, *new_lists(Q.shape[0], int(k)), metric, p)
    return finish(bd, metric, p, np.asarray(Q).dtype), bi
