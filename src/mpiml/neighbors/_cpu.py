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
* Manhattan, chebyshev, minkowski (:func:`_topk_kernel`): queries in parallel blocks of
  :data:`_QUERY_BLOCK`, the index in cache-sized blocks of :data:`_INDEX_BLOCK` rows,
  distances accumulated in float64; minkowski compares ``sum |q - x|^p`` and takes the
  ``p``-th root of the ``k`` kept only.

Queries (or a tile's query rows) run in parallel over ``prange``: the threads of this
rank, limited by :mod:`mpiml.utils._threads`.
"""


import numpy as np

from ..utils._jit import FASTMATH, numba
from ..utils._threads import one_blas_thread

__all__ = ["topk", "merge_block", "new_lists", "finish", "carry_payload", "METRICS"]

nb = numba()

#: metric name -> code used inside the kernel
METRICS = {"euclidean": 0, "sqeuclidean": 1, "cosine": 2, "manhattan": 3, "chebyshev": 4, "minkowski": 5}
#: Queries per parallel task: enough per task to amortise reading an index block, few
#: enough that every thread gets blocks (a small query batch still spreads over the threads).
_QUERY_BLOCK = 16
#: Columns of a GEMM tile screened together by a vectorised minimum before any is looked at alone.
_GROUP = 32
#: Index rows per block: 256 rows of 64 float64 features are 128 KiB, an L2-sized tile.
_INDEX_BLOCK = 256


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _pair(q, x, metric, p, qn, xn):
    """The compared quantity for one pair (before the final transform)."""
    d = q.shape[0]
    acc = 0.0
    if metric <= 1:
        for f in range(d):
            t = np.float64(q[f]) - np.float64(x[f])
            acc += t * t
    elif metric == 2:  # q and x are unit rows here (qn, xn: the norms before, 0 for a zero row)
        if qn == 0.0 or xn == 0.0:
            return 1.0
        for f in range(d):
            acc += q[f] * x[f]
        acc = 1.0 - acc
        return acc if acc > 0.0 else 0.0
    elif metric == 3:
        for f in range(d):
            acc += abs(np.float64(q[f]) - np.float64(x[f]))
    elif metric == 4:
        for f in range(d):
            t = abs(np.float64(q[f]) - np.float64(x[f]))
            if t > acc:
                acc = t
    else:
        for f in range(d):
            acc += abs(np.float64(q[f]) - np.float64(x[f])) ** p
    return acc


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _beats(dist, j, bd, bi, r, k):
    """Whether ``(dist, j)`` belongs before the ``k``-th entry of row ``r`` in (distance, index) order."""
    worst = bd[r, k - 1]
    return dist < worst or (dist == worst and j < bi[r, k - 1])


@nb.njit(cache=True, fastmath=FASTMATH, inline="always")
def _insert(bd, bi, r, k, dist, j):
    """Put ``(dist, j)`` into row ``r`` of the lists sorted by (distance, index).

    The lists may hold entries of blocks met before (a ring's earlier visitors, of any
    global index), so an equal distance goes after the entries of lower index only.
    """
    pos = k - 1
    while pos > 0 and (bd[r, pos - 1] > dist or (bd[r, pos - 1] == dist and bi[r, pos - 1] > j)):
        bd[r, pos] = bd[r, pos - 1]
        bi[r, pos] = bi[r, pos - 1]
        pos -= 1
    bd[r, pos] = dist
    bi[r, pos] = j


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


@nb.njit(cache=True, inline="always")
def _bar(metric, a, worst, rel):
    """The screen's threshold for a query of norm ``a`` whose ``k``-th value is ``worst``.

    Squared euclidean: ``|q|^2 + |x|^2 - 2 q.x``, rounding ``<= rel (|q| + |x|)^2 <= 2 rel (|q|^2 +
    |x|^2)``, so a column can beat ``worst`` only if ``(1 - 2 rel) |x|^2 - 2 g <= worst - (1 - 2 rel) |q|^2``
    (``screen[j] = (1 - 2 rel) |x_j|^2``).  Cosine, on unit rows: ``1 - g``, rounding ``<= rel``, so only if
    ``-g <= -(1 - rel - worst)`` (``screen[j] = 1``; a zero row, ``g = 0`` at distance 1, passes exactly when
    1 could beat ``worst``; a zero query passes everything).
    """
    if metric == 2:
        return np.inf if a == 0.0 else -(1.0 - rel - worst)
    return worst - (1.0 - 2.0 * rel) * a * a


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _select_tile(G, Q, X, x0, offset, metric, qn, xn, screen, rel, bd, bi):
    """Merge one tile of GEMM products ``G = Q @ X[x0:x0 + G.shape[1]].T`` into the running lists.

    ``G`` only screens: a column is looked at exactly (by :func:`_pair`, from differences)
    when its screened value, less the rounding bound of the product, can beat the
    running ``k``-th value.  The bound of a dot product of length ``d`` summed in any
    order is ``gamma_d sum |q_f x_f| <= gamma_d |q| |x|`` (``rel`` >= twice ``gamma_d``), so
    no row that belongs in the top ``k`` is screened out, and what is kept is exact.
    """
    nq = G.shape[0]
    width = G.shape[1]
    k = bd.shape[1]
    for r in range(nq):
        q = Q[r]
        a = qn[r]
        worst = bd[r, k - 1]
        bar = _bar(metric, a, worst, rel)
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
                        bar = _bar(metric, a, worst, rel)


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _screened_blocks(Q, X, offset, k, metric, qn, xn, screen, rel, qstep, xstep, bd_all, bi_all):
    """Query blocks in parallel; per block, tiles of the index: the tile's GEMM (one BLAS thread: the
    threads of this rank run blocks side by side) then :func:`_select_tile` while the tile is in cache."""
    nq = Q.shape[0]
    m = X.shape[0]
    for b in nb.prange((nq + qstep - 1) // qstep):
        q0 = b * qstep
        q1 = min(nq, q0 + qstep)
        Qb = Q[q0:q1]
        bd = bd_all[q0:q1]
        bi = bi_all[q0:q1]
        for x0 in range(0, m, xstep):
            x1 = min(m, x0 + xstep)
            G = np.dot(Qb, X[x0:x1].T)
            _select_tile(G, Qb, X, x0, offset, metric, qn[q0:q1], xn, screen, rel, bd, bi)


#: Entries of one GEMM tile (queries x index rows): written by BLAS and read once by the
#: selection while in cache (2^18 float32: 1 MiB).
_TILE = 1 << 18
_TILE_QUERIES = 256


def _topk_screened(Q, X, offset, k, metric, bd, bi):
    """Euclidean, squared euclidean and cosine: tiles of ``Q @ X.T`` by BLAS screen the
    candidates, which :func:`_select_tile` then measures exactly into the running lists."""
    nq, d = Q.shape
    m = X.shape[0]
    qn, xn = _norms(Q, "cosine"), _norms(X, "cosine")
    if metric == "cosine":  # unit rows in float64 (parallel rows of any length: the same unit row, distance)
        Q, X = _unit(Q, qn), _unit(X, xn)
        screen = np.ones(m)
    eps = np.finfo(Q.dtype).eps  # the product runs in the precision of its operands
    rel = 2.0 * (d + 4) * eps
    if metric != "cosine":
        screen = (1.0 - 2.0 * rel) * xn * xn
    # at least 4 blocks a thread, when the queries allow it (a rank's share of a query batch may be small)
    qstep = int(min(_TILE_QUERIES, max(16, -(-nq // (4 * nb.get_num_threads())))))
    xstep = int(min(8192, max(_INDEX_BLOCK, _TILE // qstep)))
    with one_blas_thread():
        _screened_blocks(Q, X, offset, k, METRICS[metric], qn, xn, screen, rel, qstep, xstep, bd, bi)


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


def merge_block(Q, X, offset, bd, bi, metric="euclidean", p=None):
    """Merge the rows of ``X`` (global indices ``offset``, ``offset + 1``, ...) into the running lists.

    ``bd`` (float64) and ``bi`` (int64), of shape ``(n_queries, k)``, hold the compared values
    (squared euclidean for ``"euclidean"``, ``sum |q - x|^p`` for minkowski: see :func:`finish`)
    and global indices, sorted by (value, index); they are updated in place.  Blocks may come
    in any order: the result is the ``k`` smallest by (value, index) of every row met.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {sorted(METRICS)})")
    k = bd.shape[1]
    if not Q.shape[0] or not X.shape[0] or not k:
        return bd, bi
    Q = np.ascontiguousarray(Q)
    X = np.ascontiguousarray(X, dtype=Q.dtype)
    if metric in ("euclidean", "sqeuclidean", "cosine"):
        _topk_screened(Q, X, int(offset), int(k), metric, bd, bi)
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
