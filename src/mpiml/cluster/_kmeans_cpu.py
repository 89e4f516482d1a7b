"""The Lloyd step of dense host rows: one BLAS product and one compiled pass per chunk of rows.

Per chunk of :data:`_CHUNK` rows: the rows shifted, their products with the centres
``G = Xs @ C.T`` by BLAS (the one part where a tuned GEMM wins), then one pass of a
Numba kernel over the chunk while it is in cache: for every row the nearest centre
(``|c|^2 - 2 x.c``, the first on ties, as ``argmin``), its squared distance, and its
weighted contribution to that centre's sum and count, the inertia and the count of
changed labels.  The NumPy path made, per chunk, an ``argmin``, a gather, a row-norm
pass, a one-hot sparse product and, at the end, a ``bincount``.

Determinism: each chunk's rows are cut into parts that depend only on the chunk's
length and ``(k, d)``, never on the thread count; part ``p`` of every chunk adds into
its own float64 partial sums, in row order, and the partials are added in part order at
the end.  The same input gives the same bits with 1 or 64 threads.  The ranks' sums are
then added by the caller's one allreduce, as before.
"""

import numpy as np

from ..utils._jit import FASTMATH, numba

__all__ = ["lloyd_step", "assign", "n_parts"]

nb = numba()

#: Bound on the per-part partial sums (parts x k x d float64).
_PARTIAL_BYTES = 64 << 20
#: At most this many parts of a chunk (enough for the threads of one rank), each of at least _MIN_ROWS rows.
_MAX_PARTS = 16
_MIN_ROWS = 256
#: Rows per chunk: the shifted chunk and its products (d + k values a row) stay in cache.
_CHUNK = 4096


def n_parts(n, k, d):
    """Parts of a chunk of ``n`` rows for the partial sums: a function of the shape alone (see module notes)."""
    by_memory = _PARTIAL_BYTES // max(1, (k * d + k + 2) * 8)
    return int(max(1, min(_MAX_PARTS, n // _MIN_ROWS, by_memory)))


@nb.njit(cache=True, parallel=True, fastmath=FASTMATH)
def _rest_kernel(Xs, G, c_sq, w, labels, mind, keep_mind, parts, sums_p, counts_p, stats_p):
    """Given ``G = Xs @ C.T`` of a chunk of shifted rows: labels, distances and the per-part sums, one pass."""
    n, d = Xs.shape
    k = G.shape[1]
    for part in nb.prange(parts):
        start = part * n // parts
        stop = (part + 1) * n // parts
        inertia = 0.0
        changed = 0
        for i in range(start, stop):
            best = np.inf
            label = 0
            for j in range(k):
                val = c_sq[j] - 2.0 * np.float64(G[i, j])
                if val < best:
                    best = val
                    label = j
            x_sq = 0.0
            for f in range(d):
                v = np.float64(Xs[i, f])
                x_sq += v * v
            dist = best + x_sq
            dist = dist if dist > 0.0 else 0.0
            if labels[i] != label:
                changed += 1
            labels[i] = label
            if keep_mind:
                mind[i] = dist
            wi = w[i]
            inertia += wi * dist
            counts_p[part, label] += wi
            for f in range(d):
                sums_p[part, label, f] += wi * np.float64(Xs[i, f])
        stats_p[part, 0] += inertia
        stats_p[part, 1] += changed


def lloyd_step(X, sample_weight, shift, C, labels, mind, packed):
    """Fill ``packed`` (``[sums | counts | inertia | changed]``, zeros on entry) from dense host rows.

    ``labels`` (int32, the previous step's) is updated in place; ``mind`` (or None) receives
    the squared distances, in the dtype of ``X``.
    """
    n, d = X.shape
    k = C.shape[0]
    CT = np.ascontiguousarray(C.T)
    C64 = C.astype(np.float64, copy=False)
    c_sq = np.einsum("ij,ij->i", C64, C64)
    w = np.ones(n) if sample_weight is None else np.ascontiguousarray(sample_weight, dtype=np.float64)
    shift = np.zeros(d, dtype=X.dtype) if shift is None else shift
    parts = n_parts(min(n, _CHUNK), k, d)
    sums_p = np.zeros((parts, k, d))
    counts_p = np.zeros((parts, k))
    stats_p = np.zeros((parts, 2))
    keep = mind is not None
    mind = mind if keep else np.empty(n, dtype=X.dtype)  # the kernel's argument must be an array
    for s in range(0, n, _CHUNK):
        e = min(n, s + _CHUNK)
        Xs = X[s:e] - shift
        G = Xs @ CT
        _rest_kernel(Xs, G, c_sq, w[s:e], labels[s:e], mind[s:e], keep, parts, sums_p,
                     counts_p, stats_p)
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
    k, d = C.shape
    labels = np.full(X.shape[0], -1, dtype=np.int32)
    mind = np.empty(X.shape[0], dtype=X.dtype)
    lloyd_step(X, None, shift, C, labels, mind, np.zeros(k * d + k + 2))
    return labels, mind
