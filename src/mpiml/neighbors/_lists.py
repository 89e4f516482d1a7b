"""What the CPU searches share (:mod:`mpiml.neighbors._cpu`'s, and the fused screen of
:mod:`mpiml.neighbors._fused`): the running top-k lists (a pair's compared quantity, the (distance, index)
order, the insertion), the screen's float64 threshold, one row shifted for the screen, and the query blocks that
the threads take from a counter.  A module of its own so that both searches import it and neither the other.
"""

import numpy as np

from ..utils._jit import FASTMATH, numba

__all__ = ["METRICS", "shifted_row"]

nb = numba()

#: metric name -> code used inside the kernel
METRICS = {"euclidean": 0, "sqeuclidean": 1, "cosine": 2, "manhattan": 3, "chebyshev": 4, "minkowski": 5}
#: Query rows of a block at most (a GEMM tile's rows): fewer read the index tile for fewer queries.
_TILE_QUERIES = 320


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


@nb.njit(cache=True, inline="always")
def _bar(metric, a, worst, rel, slack):
    """The screen's threshold for a query of norm ``a`` whose ``k``-th value is ``worst``.

    Squared euclidean: ``|q|^2 + |x|^2 - 2 q.x``, rounding ``<= rel (|q| + |x|)^2 <= 2 rel (|q|^2 +
    |x|^2)``, so a column can beat ``worst`` only if ``(1 - 2 rel) |x|^2 - 2 g <= worst - (1 - 2 rel) |q|^2``
    (``screen[j] = (1 - 2 rel) |x_j|^2``).  Cosine, on unit rows: ``1 - g``, rounding ``<= rel``, so only if
    ``-g <= -(1 - rel - worst)`` (``screen[j] = 1``; a zero row, ``g = 0`` at distance 1, passes exactly when
    1 could beat ``worst``; a zero query passes everything).  ``slack``: an absolute allowance for
    underflow in the screen's precision (see :func:`_topk_screened`), far below any distance met in
    practice.
    """
    if metric == 2:
        return np.inf if a == 0.0 else -(1.0 - rel - worst) + slack
    return worst - (1.0 - 2.0 * rel) * a * a + slack


@nb.njit(cache=True, nogil=True, inline="always")
def shifted_row(a, shift, out):
    """``out[:] = a - shift`` (``shift``: float64, subtracted in float64, then rounded once to ``out``'s
    precision); returns the float64 norms of ``a`` and of ``a - shift`` (before the rounding).  One row of
    :func:`_screen_rows` and of :func:`mpiml.neighbors._fused.pack_rows`."""
    a2 = 0.0
    s2 = 0.0
    for f in range(a.shape[0]):
        v = np.float64(a[f])
        t = v - shift[f]
        a2 += v * v
        s2 += t * t
        out[f] = t
    return np.sqrt(a2), np.sqrt(s2)


def _query_blocks(nq, threads, most=None):
    """Query blocks of equal size, a multiple of ``threads`` of them, each of at most :data:`_TILE_QUERIES`
    rows where the queries allow it (Numba hands each thread an equal run of blocks: a count that is not a
    multiple left threads idle, and small blocks made the GEMM tiles read the index for few queries).

    Not more blocks than that: every block reads the whole index once, so halving the blocks' rows doubles
    the index's traffic.  On the 64-core host, one plain process searching 5000 queries against 3e5 x 32 in
    blocks of 156 rows (a rule of at least four blocks a thread, tried and dropped) spent 1.32x the CPU time
    a query of one rank's 40000 queries in blocks of 312 (key ``knn_0145``; the process's own fit included)."""
    per = max(1, -(-nq // (threads * (most or _TILE_QUERIES))))  # blocks a thread
    return int(max(1, min(nq, threads * per)))


def _query_bounds(nq, threads, most=None):
    """Query blocks for the threads' counter, as bounds ``[0, ..., nq]``: blocks of :func:`_query_blocks`'s size
    while the queries left are at least a block for every thread, then smaller ones (the queries left over the
    threads, down to a quarter of a block), so that the threads finish together.

    With equal blocks, a thread that ran slower (its core shared, its vCPU descheduled) held the search up by
    up to a block: 8 ranks of 8 threads on the 64-core host took 2 blocks a thread of 40000 queries, and the
    ranks' searches ended 0.88-1.13 s after they began (key ``knn_0240``), the first waiting for the last.  A
    block reads the whole index once; on one thread of the development VM blocks of 80-320 rows searched
    1280 queries against 10^5 x 32 in the same time (0.23-0.26 s), 40 rows took 15 % longer.  ``most``: the largest
    block (default :data:`_TILE_QUERIES`; the fused search counts groups of queries).
    """
    size = -(-nq // _query_blocks(nq, threads, most))
    least = max(1, min(size, max((most or _TILE_QUERIES) // 5, size // 4)))
    bounds, q = [0], 0
    while q < nq:
        step = min(size, max(least, -(-(nq - q) // max(1, threads))))
        q = min(nq, q + step)
        bounds.append(q)
    return np.asarray(bounds, dtype=np.int64)
