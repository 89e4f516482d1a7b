"""The Lloyd step of dense host rows: one compiled kernel, BLAS products inside it.

The rows are cut into parts (:func:`n_parts`), which this rank's threads take one at a time
from a shared counter (:mod:`mpiml.utils._threads_jit`: a slow thread takes fewer parts).
Per block of a part (:func:`block_rows`, in a core's cache): the rows shifted, their
products with the centres ``G = Xs @ C.T`` by BLAS on the calling thread (the one part
where a tuned GEMM wins; BLAS's own pool is held to one thread meanwhile, so its threads
and the kernel's never compete), then one pass over the block while it is in cache: for
every row the nearest centre (``|c|^2 - 2 x.c``, the first on ties, as ``argmin``), its
squared distance, and its weighted contribution to that centre's sum and count, the
inertia and the count of changed labels.  The NumPy path made an ``argmin``, a gather, a
row-norm pass, a one-hot sparse product and, at the end, a ``bincount``.

Determinism: the parts depend only on the rows' count and ``(k, d)``, never on the
thread count or on which thread takes a part; part ``p`` adds into its own float64
partial sums, in row order, and the partials are added in part order at the end.  The same input gives the same bits with 1
or 64 threads.  The ranks' sums are then added by the caller's one allreduce.
"""

import numpy as np

from ..utils._jit import FASTMATH, numba
from ..utils._threads import one_blas_thread
from ..utils._threads_jit import fetch_add, workers

__all__ = ["lloyd_step", "assign", "column_sums", "n_parts", "block_rows"]

nb = numba()

#: Bound on the per-part partial sums (parts x k x d float64).
_PARTIAL_BYTES = 64 << 20
#: At most this many parts of a rank's rows (enough for the threads of one rank), each of at least _MIN_ROWS rows.
_MAX_PARTS = 64
_MIN_ROWS = 256
#: Bytes of a block's shifted rows and products (d + k float64 a row): in a core's L2 cache while
#: the block's pass reads them back.
_BLOCK_BYTES = 256 << 10


def block_rows(k, d):
    """Rows per block of a part (see :data:`_BLOCK_BYTES`), between 64 and 4096."""
    return int(min(4096, max(64, _BLOCK_BYTES // ((d + k) * 8))))


def n_parts(n, k, d):
    """Parts of ``n`` rows for the partial sums: a function of the shape alone (see module notes)."""
    by_memory = _PARTIAL_BYTES // max(1, (k * d + k + 2) * 8)
    return int(max(1, min(_MAX_PARTS, n // _MIN_ROWS, by_memory)))


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _lloyd_kernel(X, shift, CT, c_sq, w, unit, labels, mind, keep_mind, parts, block, workers, counter, sums_p,
                  counts_p, stats_p, zero_parts):
    """Parts of the rows taken by the threads from ``counter`` (:mod:`mpiml.utils._threads_jit`); per block
    of a part: the shifted rows, their products with the centres by BLAS (one thread: the parts run side by
    side) and one pass for labels, distances, sums.  ``zero_parts``: a part's partial sums are zeroed by the
    thread that takes it (partials in node memory reused from step to step, :mod:`mpiml.cluster._kmeans_node`);
    else they are zero on entry."""
    n, d = X.shape
    k = CT.shape[1]
    for _ in nb.prange(workers):
        Xs = np.empty_like(X[:min(block, n)])
        while True:
            part = fetch_add(counter)
            if part >= parts:
                break
            start = part * n // parts
            stop = (part + 1) * n // parts
            if zero_parts:
                sums_p[part] = 0.0
                counts_p[part] = 0.0
                stats_p[part] = 0.0
            inertia = 0.0
            changed = 0
            for b0 in range(start, stop, block):
                m = min(stop, b0 + block) - b0
                for i in range(m):
                    for f in range(d):
                        Xs[i, f] = X[b0 + i, f] - shift[f]
                G = np.dot(Xs[:m], CT)
                for i in range(m):
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
                    r = b0 + i
                    if labels[r] != label:
                        changed += 1
                    labels[r] = label
                    if keep_mind:
                        mind[r] = dist
                    wi = 1.0 if unit else w[r]
                    inertia += wi * dist
                    counts_p[part, label] += wi
                    for f in range(d):
                        sums_p[part, label, f] += wi * np.float64(Xs[i, f])
            stats_p[part, 0] += inertia
            stats_p[part, 1] += changed


@nb.njit(cache=True, nogil=True)
def _add_parts(sums_p, counts_p, stats_p, packed):
    """The parts' partial sums into ``packed``, in part order (the same additions as one part after another)."""
    parts, k, d = sums_p.shape
    for part in range(parts):
        for j in range(k):
            for f in range(d):
                packed[j * d + f] += sums_p[part, j, f]
        for j in range(k):
            packed[k * d + j] += counts_p[part, j]
        packed[k * d + k] += stats_p[part, 0]
        packed[k * d + k + 1] += stats_p[part, 1]


def lloyd_step(X, sample_weight, shift, C, labels, mind, packed):
    """Fill ``packed`` (``[sums | counts | inertia | changed]``, zeros on entry) from dense host rows.

    ``labels`` (int32, the previous step's) is updated in place; ``mind`` (or None) receives
    the squared distances, in the dtype of ``X``.
    """
    n, d = X.shape
    k = C.shape[0]
    CT = np.ascontiguousarray(C.T, dtype=X.dtype)
    C64 = C.astype(np.float64, copy=False)
    c_sq = np.einsum("ij,ij->i", C64, C64)
    # unit weights: one value, read for every row (an array of n ones was a serial 16 MB fill at 2e6 rows)
    unit = sample_weight is None
    w = np.ones(1) if unit else np.ascontiguousarray(sample_weight, dtype=np.float64)
    shift = np.zeros(d, dtype=X.dtype) if shift is None else np.ascontiguousarray(shift, dtype=X.dtype)
    parts = n_parts(n, k, d)
    sums_p = np.zeros((parts, k, d))
    counts_p = np.zeros((parts, k))
    stats_p = np.zeros((parts, 2))
    keep = mind is not None
    mind = mind if keep else np.empty(n, dtype=X.dtype)  # the kernel's argument must be an array
    if n:
        with one_blas_thread():
            _lloyd_kernel(np.ascontiguousarray(X), shift, CT, c_sq, w, unit, labels, mind, keep, parts,
                          block_rows(k, d), workers(parts, nb.get_num_threads()), np.zeros(1, np.int64), sums_p, counts_p,
                          stats_p, False)
    # in part order: the same bits whatever the thread count (compiled: 4 NumPy calls a part were a serial
    # millisecond an iteration for 64 parts, as long as the parallel step of a rank's share of 2e6 rows)
    _add_parts(sums_p, counts_p, stats_p, packed)
    return packed


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _column_kernel(X, centre, square, parts, out_p):
    """Per part of the rows (in parallel), the float64 column sums of ``X - centre`` (or of its squares)."""
    n, d = X.shape
    for part in nb.prange(parts):
        for i in range(part * n // parts, (part + 1) * n // parts):
            for f in range(d):
                v = np.float64(X[i, f]) - centre[f]
                out_p[part, f] += v * v if square else v


def column_sums(X, centre=None, *, square=False):
    """float64 column sums of dense host rows minus ``centre`` (or of their squares), on this rank's threads.

    The global statistics of a fit (the mean, then the variance about it) were two serial NumPy passes
    (the second through float64 copies of chunks): 1.7 Lloyd steps of one thread's time at 10^6 x 32,
    serial while the steps run on every thread.  Parts depend on the shape alone and are added in order,
    so the bits do not depend on the thread count.
    """
    n, d = X.shape
    parts = int(max(1, min(_MAX_PARTS, n // 4096)))
    out_p = np.zeros((parts, d))
    centre = np.zeros(d) if centre is None else np.ascontiguousarray(centre, dtype=np.float64)
    if n:
        _column_kernel(np.ascontiguousarray(X), centre, bool(square), parts, out_p)
    out = np.zeros(d)
    for part in range(parts):
        out += out_p[part]
    return out


def assign(X, shift, C, sample_weight=None):
    """``(labels int32, squared distances in the dtype of X, inertia)`` of the nearest centres of dense host
    rows; the inertia (float64, ``sum(sample_weight * distance)``) is None without ``sample_weight``."""
    k, d = C.shape
    labels = np.full(X.shape[0], -1, dtype=np.int32)
    mind = np.empty(X.shape[0], dtype=X.dtype)
    packed = lloyd_step(X, sample_weight, shift, C, labels, mind, np.zeros(k * d + k + 2))
    return labels, mind, (None if sample_weight is None else float(packed[k * d + k]))
