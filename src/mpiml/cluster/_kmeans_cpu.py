"""The Lloyd step of dense host rows in one pass, compiled with Numba.

For every row: shift it, its dot products with the ``k`` centres, the nearest centre
(``|c|^2 - 2 x.c``, the first on ties, as ``argmin``), its squared distance, and its
weighted contribution to that centre's sum, count and the inertia -- while the row is in
cache, where the NumPy path made a ``rows x k`` matrix by BLAS, then an ``argmin``, a
gather, a one-hot product and a ``bincount`` (five passes).

Determinism: the rows are cut into :func:`n_parts` contiguous parts that depend only on
``(n, k, d)``, never on the thread count; each part (one ``prange`` task) accumulates its
own float64 sums in row order, and the parts are added in part order.  The same input
gives the same bits with 1 or 64 threads.  The ranks' parts are then summed by the
caller's one allreduce, as before.
"""

import numpy as np

from ..utils._jit import FASTMATH, numba

__all__ = ["lloyd_step", "assign", "n_parts"]

nb = numba()

#: Bound on the per-part partial sums (parts x k x d float64).
_PARTIAL_BYTES = 64 << 20
#: At most this many parts (enough for the threads of one rank), each of at least _MIN_ROWS rows.
_MAX_PARTS = 64
_MIN_ROWS = 2048


def n_parts(n, k, d):
    """Parts of the rows for the partial sums: a function of the shape alone (see module notes)."""
    by_memory = _PARTIAL_BYTES // max(1, (k * d + k + 2) * 8)
    return int(max(1, min(_MAX_PARTS, n // _MIN_ROWS, by_memory)))


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _nearest(X, i, shift, C, c_sq, xs):
    """Shift row ``i`` into ``xs``; return ``(label, squared distance)`` of its nearest centre."""
    k, d = C.shape
    x_sq = 0.0
    for f in range(d):
        v = np.float64(X[i, f]) - shift[f]
        xs[f] = v
        x_sq += v * v
    best = np.inf
    label = 0
    for j in range(k):
        dot = 0.0
        for f in range(d):
            dot += xs[f] * C[j, f]
        val = c_sq[j] - 2.0 * dot
        if val < best:
            best = val
            label = j
    dist = best + x_sq
    return label, (dist if dist > 0.0 else 0.0)


@nb.njit(cache=True, parallel=True, fastmath=FASTMATH)
def _lloyd_kernel(X, w, shift, C, c_sq, labels, mind, keep_mind, parts, sums_p, counts_p, stats_p):
    n = X.shape[0]
    k, d = C.shape
    for part in nb.prange(parts):
        start = part * n // parts
        stop = (part + 1) * n // parts
        xs = np.empty(d)
        sums = sums_p[part]
        inertia = 0.0
        changed = 0
        for i in range(start, stop):
            label, dist = _nearest(X, i, shift, C, c_sq, xs)
            if labels[i] != label:
                changed += 1
            labels[i] = label
            if keep_mind:
                mind[i] = dist
            wi = w[i]
            inertia += wi * dist
            counts_p[part, label] += wi
            for f in range(d):
                sums[label, f] += wi * xs[f]
        stats_p[part, 0] = inertia
        stats_p[part, 1] = changed


@nb.njit(cache=True, parallel=True, fastmath=FASTMATH)
def _assign_kernel(X, shift, C, c_sq, labels, mind):
    n = X.shape[0]
    d = C.shape[1]
    blocks = (n + 255) // 256
    for b in nb.prange(blocks):
        xs = np.empty(d)
        for i in range(b * 256, min(n, (b + 1) * 256)):
            label, dist = _nearest(X, i, shift, C, c_sq, xs)
            labels[i] = label
            mind[i] = dist


def _prepare(X, shift, C):
    C64 = np.ascontiguousarray(C, dtype=np.float64)
    shift64 = np.zeros(X.shape[1]) if shift is None else np.asarray(shift, dtype=np.float64)
    return np.ascontiguousarray(X), shift64, C64, np.einsum("ij,ij->i", C64, C64)


def lloyd_step(X, sample_weight, shift, C, labels, mind, packed):
    """Fill ``packed`` (``[sums | counts | inertia | changed]``, zeros on entry) from dense host rows.

    ``labels`` (int32) is updated in place, ``mind`` (or None) receives the squared distances.
    """
    n, d = X.shape
    k = C.shape[0]
    X, shift64, C64, c_sq = _prepare(X, shift, C)
    w = np.ones(n) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=np.float64)
    parts = n_parts(n, k, d) if n else 1
    sums_p = np.zeros((parts, k, d))
    counts_p = np.zeros((parts, k))
    stats_p = np.zeros((parts, 2))
    keep = mind is not None
    _lloyd_kernel(X, w, shift64, C64, c_sq, labels, mind if keep else np.empty(0, X.dtype), keep, parts,
                  sums_p, counts_p, stats_p)
    sums = packed[:k * d].reshape(k, d)
    counts = packed[k * d:k * d + k]
    for part in range(parts):  # in part order: the same bits whatever the thread count
        sums += sums_p[part]
        counts += counts_p[part]
        packed[-2] += stats_p[part, 0]
        packed[-1] += stats_p[part, 1]
    return packed


def assign(X, shift, C):
    """``(labels int32, squared distances in the dtype of X)`` of the nearest centres of dense host rows."""
    X, shift64, C64, c_sq = _prepare(X, shift, C)
    labels = np.empty(X.shape[0], dtype=np.int32)
    mind = np.empty(X.shape[0], dtype=X.dtype)
    if X.shape[0]:
        _assign_kernel(X, shift64, C64, c_sq, labels, mind)
    return labels, mind
