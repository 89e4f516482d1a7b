"""The distributed exact k-NN search: index shards travel around a ring, queries stay home.

Why the index moves and not the queries: every rank must end with the global top-k
of *its own* queries.  If the index shard moves, each rank keeps one running
``(n_queries, k)`` list and merges every visiting block into it; nothing has to be
sent back and no rank ever holds a partial result of another's queries.  Moving the
queries instead would need a final exchange (or a reduce per step, as in cuML's
broadcast + reduce) of ``k`` candidates per query per rank.  Blocks visit rank ``r``
in the order ``r, r-1, r-2, ...``; a block's global offset is known from the row
counts agreed at ``fit``, so indices are global at once.  Neighbour payloads (class
codes, regression targets) travel with their block.

Three exchanges of the same ring, selected by ``exchange``; all give identical
results (the arithmetic per block and the merge order do not depend on it):

* ``"blocking"``: compute on block ``s``, then send it right and receive block ``s+1``
  from the left, waiting for both before the next computation;
* ``"overlap"``: double buffer; the send of block ``s`` and the receive of block
  ``s+1`` are posted (``comm.isend``/``comm.irecv``) *before* computing on block ``s``,
  so the transfer is hidden behind the distances;
* ``"onesided"``: each rank exposes an MPI RMA window holding a circular buffer of
  three slots, each with a flag.  At step ``s`` a rank puts its current block into
  slot ``(s+1) % 3`` of its right neighbour (after that slot's flag says it is free),
  raises the flag, and computes; the receiver copies slot ``(s+1) % 3`` out once its
  flag is up, lowers the flag, and computes on the copy at step ``s+1``.  Three slots let a sender run one step ahead
  of a slow receiver (MaTEx, seed 003).  Device blocks are staged through host memory.

When the queries are few relative to the index, :func:`ring_kneighbors` may instead gather
every rank's queries, search the local shard for all of them and send the candidate lists
back to their owners (``strategy="local"``, chosen by :func:`choose_strategy`): far fewer
bytes than ringing the index, the same result.  When every rank passes the *same* queries
(``"replicated"``, found by one agreement on a digest of the queries), each rank searches
its own shard for them and the ranks exchange their candidate lists (one allgather): the
ring or the local search would each search every query ``p`` times.  On CPU ranks
(:func:`choose_host_strategy`) distinct queries take the ring unless they are too few or too
unevenly spread over the ranks: the two searches cost the same pairs per rank when the
queries are spread evenly, and the ring keeps one running list per query (the compiled
kernel merges every block into it, :func:`mpiml.neighbors._cpu.merge_block`), so its
thresholds stay tight and no ``p``-way merge follows; an index that fits :data:`GATHER_BYTES` is gathered
instead and searched at once (``"gather"``: a ring step waited for the slower neighbour, docs/neighbors.md).

Merging: the running top-k and the block's top-k are concatenated and ordered by
(distance, global index) with two stable sorts, so exact ties go to the lower global
index, like scikit-learn's brute force.
"""

import hashlib
import os
import time

import numpy as np

from .. import _config
from .._array import get_namespace, is_device_array
from .._errors import CommTimeoutError
from . import _node, _sparse

__all__ = ["EXCHANGES", "STRATEGIES", "choose_strategy", "choose_host_strategy", "ring_kneighbors", "ring_radius",
           "ring_visit", "local_distances", "local_topk"]

EXCHANGES = ("blocking", "overlap", "onesided")
STRATEGIES = ("auto", "ring", "local", "gather")
#: Default search strategy of :func:`ring_kneighbors` (tests and benchmarks may pin it; so may
#: ``MPIML_KNN_STRATEGY``).  ``"auto"`` also finds replicated queries (see the module notes).
STRATEGY = "auto"
#: CPU ranks: the ring only when the busiest rank has at least this many queries.  A step's search
#: (queries x block rows x 2d flops, at ~10^11 flop/s a rank) then outlasts its block's transfer
#: (block rows x 8d bytes at a few GB/s), so the overlapped exchange hides the transfer.
_HOST_RING_MIN_QUERIES = 128
#: CPU ranks: the ring while its busiest rank's pairs are at most this many times the local search's
#: (whose per-query extras, p fresh lists and a p-way merge, the ring does not pay).
_HOST_RING_SLACK = 1.25
#: CPU ranks: the index is gathered on every rank instead of ringed (``strategy="gather"``) when its bytes
#: (rows and payload) are at most this many (``MPIML_KNN_GATHER_BYTES``; 0 never gathers).
GATHER_BYTES = 1 << 30
_TAG_X = 0x4E4E  # tags _TAG_X .. _TAG_X + 3: rows (or CSR data, indices, indptr), targets
_SLOTS = 3
#: Rows of queries per distance block on the host (bounds the (rows, m) temporary).
_HOST_BLOCK_BYTES = 32 << 20


# ---------------------------------------------------------------------- local distances
def local_distances(Q, X, metric, xp, p=None):
    """Distances of every row of ``Q`` to every row of ``X`` in the dtype of ``Q``.

    Euclidean metrics through a GEMM (``|q|² - 2 q.x + |x|²``, clipped at 0), cosine
    through normalised rows (1 for a zero row), manhattan, chebyshev and minkowski
    (power ``p``) by broadcasting in row chunks.
    Identical rows give identical distances, so constructed ties stay exact.  Sparse
    rows (either side) go through :mod:`mpiml.neighbors._sparse`.
    """
    if not isinstance(metric, str):  # the rarer metrics, on the host (mpiml.neighbors._metrics)
        return metric.distances(Q, X, xp)
    if _sparse.is_sparse(Q) or _sparse.is_sparse(X):
        return _sparse.distances(Q, _sparse.prepare(X, metric, xp), xp)
    if metric in ("euclidean", "sqeuclidean"):
        D = (Q * Q).sum(axis=1)[:, None] - 2.0 * (Q @ X.T) + (X * X).sum(axis=1)[None, :]
        xp.maximum(D, 0, out=D)
        return xp.sqrt(D, out=D) if metric == "euclidean" else D
    if metric == "cosine":
        def unit(A):
            n = xp.sqrt((A * A).sum(axis=1))
            return A / xp.where(n > 0, n, 1)[:, None], n > 0
        Qn, qz = unit(Q)
        Xn, xz = unit(X)
        D = 1.0 - Qn @ Xn.T
        D[~qz, :] = 1.0
        D[:, ~xz] = 1.0
        return xp.maximum(D, 0, out=D)
    # manhattan, chebyshev, minkowski
    D = xp.empty((Q.shape[0], X.shape[0]), dtype=Q.dtype)
    step = max(1, int(_HOST_BLOCK_BYTES // max(1, X.size * Q.dtype.itemsize)))
    for s in range(0, Q.shape[0], step):
        diff = xp.abs(Q[s:s + step, None, :] - X[None, :, :])
        if metric == "manhattan":
            D[s:s + step] = diff.sum(axis=2)
        elif metric == "chebyshev":
            D[s:s + step] = diff.max(axis=2) if X.shape[1] else 0
        else:
            D[s:s + step] = (diff ** p).sum(axis=2) ** (1.0 / p)
    return D


def local_topk(Q, X, k, metric, xp, p=None):
    """``(distances, local indices)`` of the ``k`` nearest rows of ``X`` (ties to the lower index).

    On CuPy with dense float rows and ``k`` up to :data:`mpiml.kernels.select.MAX_K`, the fused
    distance + selection kernel of :mod:`mpiml.kernels.select` (every metric; euclidean
    distances in the GEMM form, recomputed by the caller; wide rows of the GEMM-form metrics go
    through its GEMM route, cuBLAS tiles of one fixed shape); otherwise blocks of distances
    (sparse rows: the block's norms and transpose prepared once, :mod:`mpiml.neighbors._sparse`)
    and a selection per row.
    """
    if not isinstance(metric, str):  # the rarer metrics, on the host (mpiml.neighbors._metrics)
        from ._metrics import host_topk

        return host_topk(Q, X, k, metric, xp, _smallest_k, _HOST_BLOCK_BYTES)
    sparse = _sparse.is_sparse(Q) or _sparse.is_sparse(X)
    if xp is not np and not sparse:
        from ..kernels import select

        if k <= select.MAX_K and X.dtype in (np.float32, np.float64):
            return select.topk(Q, X, k, metric=metric, p=p)
        if metric in ("euclidean", "sqeuclidean", "cosine"):
            from ..kernels.kmeans import topk

            return topk(Q, X, k, metric=metric)
    cpu = _cpu_topk() if xp is np and not sparse else None
    if cpu is not None:  # dense host rows: the compiled kernel of mpiml.neighbors._cpu
        return cpu(Q, X, k, metric, p)
    nq, m = Q.shape[0], X.shape[0]
    dist = xp.empty((nq, k), dtype=Q.dtype)
    idx = xp.empty((nq, k), dtype=xp.int64)
    budget = _sparse.block_bytes(xp) if sparse else _HOST_BLOCK_BYTES
    step = max(1, int(budget // max(1, m * Q.dtype.itemsize)))
    prepared = _sparse.prepare(X, metric, xp) if sparse else None
    for s in range(0, nq, step):
        if sparse:
            D = _sparse.distances(Q[s:s + step], prepared, xp)
        else:
            D = local_distances(Q[s:s + step], X, metric, xp, p)
        idx[s:s + step] = _smallest_k(D, k, xp)
        dist[s:s + step] = xp.take_along_axis(D, idx[s:s + step], axis=1)
    return dist, idx


def _cpu_topk():
    """:func:`mpiml.neighbors._cpu.topk` (compiled, dense host rows), or None without Numba or with
    ``MPIML_CPU_KERNELS=0`` (the blocked NumPy path below, for comparisons)."""
    import os

    if os.environ.get("MPIML_CPU_KERNELS", "1") == "0":
        return None
    try:
        from ._cpu import topk
    except ImportError:
        return None
    return topk


def _smallest_k(D, k, xp):
    """Column indices of the ``k`` smallest entries of every row, by (value, column).

    A partial selection (``argpartition``) and a stable sort of the ``k`` picked; rows
    where the ``k``-th value is tied with unpicked columns (the selection may have
    taken a higher column) fall back to a stable sort of the whole row.
    """
    m = D.shape[1]
    if k >= m:
        return xp.argsort(D, axis=1, kind="stable")
    P = xp.argpartition(D, k - 1, axis=1)[:, :k]
    P = xp.sort(P, axis=1)  # column order first, so that the stable sort below breaks ties by column
    V = xp.take_along_axis(D, P, axis=1)
    order = xp.argsort(V, axis=1, kind="stable")
    P = xp.take_along_axis(P, order, axis=1)
    kth = xp.take_along_axis(V, order[:, -1:], axis=1)
    tied = xp.nonzero((D <= kth).sum(axis=1) > k)[0]
    if tied.size:
        P[tied] = xp.argsort(D[tied], axis=1, kind="stable")[:, :k]
    return P


def merge_topk(dist, gidx, pay, new_dist, new_gidx, new_pay, k, xp):
    """Keep the ``k`` smallest of two candidate lists per row, ordered by (distance, global index)."""
    if dist is None:
        D, G, P = new_dist, new_gidx, new_pay
    else:
        D = xp.concatenate([dist, new_dist], axis=1)
        G = xp.concatenate([gidx, new_gidx], axis=1)
        P = None if pay is None else xp.concatenate([pay, new_pay], axis=1)
    first = xp.argsort(G, axis=1, kind="stable")
    D, G = xp.take_along_axis(D, first, axis=1), xp.take_along_axis(G, first, axis=1)
    order = xp.argsort(D, axis=1, kind="stable")[:, :k]
    if P is not None:  # (n, candidates, t): the same permutations along axis 1
        P = xp.take_along_axis(xp.take_along_axis(P, first[..., None], axis=1), order[..., None], axis=1)
    return xp.take_along_axis(D, order, axis=1), xp.take_along_axis(G, order, axis=1), P


def _exact_sq(Q, X, idx, xp):
    """Squared distances of each query to its selected rows, by differences (no cancellation).

    The GEMM form selects the candidates; their reported distances are recomputed so
    that a query equal to an index row is at distance exactly 0 (as in scikit-learn).
    """
    if xp is not np and not (_sparse.is_sparse(Q) or _sparse.is_sparse(X)) and X.dtype in (np.float32, np.float64):
        from ..kernels.select import exact_sq

        return exact_sq(Q, X, idx)
    if _sparse.is_sparse(Q) or _sparse.is_sparse(X):
        qrows = xp.repeat(xp.arange(idx.shape[0], dtype=xp.int64), idx.shape[1])
        return _sparse.pair_sq_distances(Q, X, qrows, idx.ravel(), xp).reshape(idx.shape)
    out = xp.empty(idx.shape, dtype=Q.dtype)
    step = max(1, int(_HOST_BLOCK_BYTES // max(1, idx.shape[1] * Q.shape[1] * Q.dtype.itemsize)))
    for s in range(0, Q.shape[0], step):
        diff = X[idx[s:s + step]] - Q[s:s + step, None, :]
        out[s:s + step] = (diff * diff).sum(axis=2)
    return out


# ---------------------------------------------------------------------- the ring
class _Block:
    """One visiting index block: rows, payload rows (or None) and its global offset."""

    __slots__ = ("X", "Y", "offset")

    def __init__(self, X, Y, offset):
        self.X, self.Y, self.offset = X, Y, offset


def _search_block(Q, block, k, metric, p, state, xp):
    m = block.X.shape[0]
    if m == 0 or Q.shape[0] == 0:
        return state
    kk = min(k, m)
    d, i = local_topk(Q, block.X, kk, metric, xp, p)
    # the compiled host kernel measured its k exactly (float64 differences) and ordered them by (distance,
    # index): recomputing them was one thread's pass over every query's k rows (the serial part of 8 ranks'
    # search of 20000 queries on 64 cores), and so was ordering a first block's lists again
    host_exact = (xp is np and metric in ("euclidean", "sqeuclidean") and _cpu_topk() is not None
                  and not (_sparse.is_sparse(Q) or _sparse.is_sparse(block.X)))
    if metric in ("euclidean", "sqeuclidean") and not host_exact:
        d = _exact_sq(Q, block.X, i, xp)
        d = xp.sqrt(d) if metric == "euclidean" else d
    pay = None
    if block.Y is not None:
        pay = block.Y[i]  # (nq, kk, t)
    if host_exact and state[0] is None and d.dtype == np.float64:
        return d, i + block.offset, pay
    return merge_topk(*state, d, i + block.offset, pay, k, xp)


def choose_strategy(query_counts, index_counts, d, k, itemsize, t=0):
    """``"ring"`` or ``"local"``: the search that moves fewer bytes through the slowest rank.

    The ring sends the largest index block over every link ``p - 1`` times (each step waits
    for it); the local search receives every other rank's queries once and exchanges ``k``
    candidates (distance, global index, payload) per foreign query.  The inputs are
    replicated, so every rank takes the same branch.
    """
    p = len(index_counts)
    if p == 1:
        return "ring"
    row = d * itemsize + 8 * t
    ring = (p - 1) * int(np.max(index_counts)) * row
    total = int(np.sum(query_counts))
    foreign = total - int(np.min(query_counts))
    local = foreign * d * itemsize + 2 * foreign * k * (itemsize + 8 + 8 * t)
    return "local" if local < ring else "ring"


def choose_host_strategy(query_counts, index_counts, replicated=False, row_bytes=None):
    """``"replicated"``, ``"ring"``, ``"gather"`` or ``"local"`` for CPU ranks (replicated inputs: the same on
    every rank).  ``row_bytes``: an index row's bytes with its payload; where the ring would be taken and the
    whole index fits ``MPIML_KNN_GATHER_BYTES``, ``"gather"`` (see the module notes); None: the ring.

    Identical queries on every rank: ``"replicated"`` (each rank its shard, then the lists: the
    fewest pairs).  Distinct queries: the ring's busiest rank searches ``max(q) x N`` pairs, the
    local search's busiest ``Q x max(n)``; equal when queries and index are spread evenly, and then
    the ring wins by its one running list per query.  Queries piled on a few ranks (a ring step
    waits for its busiest rank) or too few to hide a block's transfer take the local search.
    """
    if len(index_counts) == 1:
        return "ring"
    if replicated:
        return "replicated"
    q_max, q_total = int(np.max(query_counts)), int(np.sum(query_counts))
    ring_pairs = q_max * int(np.sum(index_counts))
    local_pairs = q_total * int(np.max(index_counts))
    if q_max >= _HOST_RING_MIN_QUERIES and ring_pairs <= _HOST_RING_SLACK * local_pairs:
        budget = _config.env_number("MPIML_KNN_GATHER_BYTES", float(GATHER_BYTES), kind=float, minimum=0)
        if row_bytes is not None and int(np.sum(index_counts)) * row_bytes <= budget:
            return "gather"
        return "ring"
    return "local"


def _strategy():
    name = os.environ.get("MPIML_KNN_STRATEGY") or STRATEGY
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r} (MPIML_KNN_STRATEGY or STRATEGY)")
    return name


def _digest(Q):
    """Two int64 words of a digest of dense host rows (shape and values), zeros when there are none."""
    if not Q.shape[0]:
        return [0, 0]
    h = hashlib.blake2b(np.ascontiguousarray(Q).data, digest_size=16)
    h.update(np.array(Q.shape + (Q.dtype.num,), dtype=np.int64).tobytes())
    return np.frombuffer(h.digest(), dtype=np.int64).tolist()


def _host_agreement(Q, comm):
    """``(query counts, replicated, any sparse queries)`` of every rank: one allgather of four words."""
    sparse = _sparse.is_sparse(Q)
    row = np.array([Q.shape[0], int(sparse)] + ([0, 0] if sparse else _digest(Q)), dtype=np.int64)
    facts = np.asarray(comm.allgather(row)).reshape(comm.size, 4)
    qcounts = facts[:, 0].copy()
    replicated = bool(qcounts[0] > 0 and not facts[:, 1].any() and (facts == facts[0]).all())
    return qcounts, replicated, bool(facts[:, 1].any())


def _host_kernel(Q, X, metric, xp):
    """The compiled module (:mod:`mpiml.neighbors._cpu`) when it serves this search, else None."""
    if xp is not np or not isinstance(metric, str) or _sparse.is_sparse(Q) or _sparse.is_sparse(X):
        return None
    if _cpu_topk() is None:
        return None
    from . import _cpu

    return _cpu if metric in _cpu.METRICS else None


def _host_merge(cpu, Q, block, metric, p, state):
    """Merge ``block`` into the running ``(compared values, global indices, payload)`` of ``Q``."""
    bd, bi, pay = state
    m = block.X.shape[0]
    if not m or not Q.shape[0]:
        return state
    before = bi.copy() if pay is not None else None
    cpu.merge_block(Q, block.X, block.offset, bd, bi, metric, p)
    if pay is not None:
        pay = cpu.carry_payload(before, pay, bi, block.offset, block.Y)
    return bd, bi, pay


def _host_lists(Q, k, t):
    from . import _cpu

    bd, bi = _cpu.new_lists(Q.shape[0], k)
    return bd, bi, None if t is None else np.zeros((Q.shape[0], k, t))


def _host_finish(cpu, state, metric, p, dtype):
    bd, bi, pay = state
    return cpu.finish(bd, metric, p, dtype), bi, pay


def ring_kneighbors(Q, X, Y, k, *, metric, comm, offsets, counts, exchange, xp, p=None, strategy=None):
    """The global ``k`` nearest neighbours of this rank's queries ``Q`` over every rank's ``X``.

    Parameters
    ----------
    Q : (n_queries, d) array of this rank.
    X : (n_local, d) this rank's index shard; ``Y`` its payload ``(n_local, t)`` float64 or None.
    offsets, counts : global offset and row count of every rank's shard (host int64).
    exchange : one of :data:`EXCHANGES` (how the ring moves blocks).
    strategy : ``"ring"``, ``"local"`` or ``"auto"`` (default :data:`STRATEGY`): ``"local"``
        gathers every rank's queries, searches this rank's shard for all of them and sends
        the candidate lists back to their owners (dense rows only); ``"auto"`` picks by
        :func:`choose_strategy`.  Identical results.

    Returns
    -------
    dist (n_queries, k), global indices (n_queries, k) int64, payload (n_queries, k, t) or None.
    """
    strategy = _strategy() if strategy is None else strategy
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    t = None if Y is None else Y.shape[1]
    cpu = _host_kernel(Q, X, metric, xp)
    if comm.size > 1 and strategy != "ring" and not _sparse.is_sparse(X):
        if xp is np:  # CPU ranks: one agreement (every rank, whatever the kind of its queries)
            qcounts, replicated, any_sparse = _host_agreement(Q, comm)
            if not any_sparse:
                if strategy == "auto":
                    row_bytes = X.shape[1] * X.dtype.itemsize + (0 if t is None else 8 * t)
                    strategy = choose_host_strategy(qcounts, counts, replicated,
                                                    row_bytes if cpu is not None else None)
                elif replicated:  # pinned "local": the same answer, each query searched once
                    strategy = "replicated"
                if strategy == "replicated":
                    return _replicated_kneighbors(Q, X, Y, k, metric=metric, p=p, comm=comm, offsets=offsets,
                                                  xp=xp, cpu=cpu)
                if strategy == "gather" and cpu is not None:  # (mpiml.neighbors._node)
                    state = _node.gathered_kneighbors(cpu, Q, X, Y, k, metric=metric, p=p, comm=comm, qcounts=qcounts,
                                                      offsets=offsets, counts=counts)
                    return _host_finish(cpu, state, metric, p, X.dtype) if Q.shape[0] else (None, None, None)
                if strategy == "local":
                    return _local_kneighbors(Q, X, Y, k, metric=metric, p=p, comm=comm, offsets=offsets,
                                             qcounts=qcounts, xp=xp, cpu=cpu)
        elif not _sparse.is_sparse(Q):
            from ..utils._validation import row_counts

            qcounts = row_counts(Q.shape[0], comm)
            if strategy == "local" or choose_strategy(qcounts, counts, X.shape[1], k, X.dtype.itemsize,
                                                      0 if t is None else t) == "local":
                return _local_kneighbors(Q, X, Y, k, metric=metric, p=p, comm=comm, offsets=offsets,
                                         qcounts=qcounts, xp=xp)
    if cpu is not None:  # one running list per query, every visiting block merged into it by the kernel
        state = [_host_lists(Q, k, t)]

        def visit(block):
            state[0] = _host_merge(cpu, Q, block, metric, p, state[0])
    else:
        state = [(None, None, None)]

        def visit(block):
            state[0] = _search_block(Q, block, k, metric, p, state[0], xp)

    ring_visit(_Block(X, Y, int(offsets[comm.rank])), visit, comm=comm, offsets=offsets, counts=counts,
               exchange=exchange)
    if cpu is not None:
        return _host_finish(cpu, state[0], metric, p, X.dtype) if Q.shape[0] else (None, None, None)
    return state[0]


def _replicated_kneighbors(Q, X, Y, k, *, metric, p, comm, offsets, xp, cpu):
    """The same queries on every rank: each rank searches its shard, one allgather of the lists, one merge.

    Each query is searched once against each row (the ring and the local search would search it on
    every rank); the lists are padded to ``k`` with ``(inf, int64 max)`` and merged by (value, global
    index), so every rank ends with the same answer, equal to the ring's.
    """
    n = Q.shape[0]
    bd, bi, pay = _shard_lists(Q, _Block(X, Y, int(offsets[comm.rank])), k, metric, p, xp, cpu)
    parts = [bd, bi] + ([] if pay is None else [pay])
    got = [comm.allgather(xp.ascontiguousarray(a)) for a in parts]
    size = comm.size

    def side_by_side(a):  # (size * n, k, ...) -> (n, size * k, ...), rank after rank
        a = a.reshape((size, n) + a.shape[1:])
        return xp.concatenate(list(a), axis=1)

    state = merge_topk(None, None, None, side_by_side(got[0]), side_by_side(got[1]),
                       side_by_side(got[2]) if pay is not None else None, k, xp)
    if cpu is not None:
        return _host_finish(cpu, state, metric, p, X.dtype)
    return state


def _shard_lists(Q, block, k, metric, p, xp, cpu):
    """The ``k``-lists of ``Q`` against this rank's ``block`` alone, padded to ``k`` columns with
    ``(inf, int64 max)`` (a shard may hold fewer rows); compared values when ``cpu`` is the compiled module."""
    t = None if block.Y is None else block.Y.shape[1]
    if cpu is not None:
        return _host_merge(cpu, Q, block, metric, p, _host_lists(Q, k, t))
    return _padded(*_search_block(Q, block, k, metric, p, (None, None, None), xp), Q.shape[0], k, t, block.X.dtype,
                   xp)


def _padded(dist, gidx, pay, n, k, t, dtype, xp):
    """Candidate lists padded to ``k`` columns with ``(inf, int64 max)``."""
    if dist is None:
        dist = xp.empty((n, 0), dtype=dtype)
        gidx = xp.empty((n, 0), dtype=xp.int64)
        pay = None if t is None else xp.empty((n, 0, t))
    if dist.shape[1] < k:
        pad = k - dist.shape[1]
        dist = xp.concatenate([dist, xp.full((n, pad), np.inf, dtype=dist.dtype)], axis=1)
        gidx = xp.concatenate([gidx, xp.full((n, pad), np.iinfo(np.int64).max, dtype=xp.int64)], axis=1)
        if pay is not None:
            pay = xp.concatenate([pay, xp.zeros((n, pad, t), dtype=pay.dtype)], axis=1)
    return dist, gidx, pay


def _local_kneighbors(Q, X, Y, k, *, metric, p, comm, offsets, qcounts, xp, cpu=None):
    """Every rank's queries against this rank's shard; each owner merges the ranks' candidate lists.

    Lists are padded to ``k`` columns with ``(inf, int64 max)`` (a shard may hold fewer rows);
    the merge orders by (distance, global index), so the result does not depend on the order
    in which lists arrive and equals the ring's.  ``cpu``: the compiled module, whose lists
    travel as compared values (squared distances for euclidean) and are finished by the owner.
    """
    size, rank = comm.size, comm.rank
    Qall = comm.allgatherv(xp.ascontiguousarray(Q))
    qoff = np.concatenate([[0], np.cumsum(qcounts)]).astype(np.int64)
    dist, gidx, pay = _shard_lists(Qall, _Block(X, Y, int(offsets[rank])), k, metric, p, xp, cpu)
    parts = [dist, gidx] + ([] if pay is None else [pay])

    def rows(a, j):
        return xp.ascontiguousarray(a[qoff[j]:qoff[j + 1]])

    sends = [comm.isend(rows(a, j), j, tag=_TAG_X + i) for j in range(size) if j != rank for i, a in enumerate(parts)]
    recvs = {j: [comm.irecv(j, tag=_TAG_X + i) for i in range(len(parts))] for j in range(size) if j != rank}
    state = (None, None, None)
    for j in range(size):
        got = [rows(a, rank) for a in parts] if j == rank else [r.wait() for r in recvs[j]]
        state = merge_topk(*state, got[0], got[1], got[2] if pay is not None else None, k, xp)
    for s in sends:
        s.wait()
    if qcounts[rank] == 0:
        return None, None, None
    if cpu is not None:
        return _host_finish(cpu, state, metric, p, X.dtype)
    return state


def ring_radius(Q, X, radius, *, metric, comm, offsets, counts, exchange, xp, p=None):
    """Every index row within ``radius`` of each query: per query, (distances, global indices) sorted."""
    found = [[] for _ in range(Q.shape[0])]

    def visit(block):
        if block.X.shape[0] == 0 or Q.shape[0] == 0:
            return
        sparse = _sparse.is_sparse(Q) or _sparse.is_sparse(block.X)
        sq = metric in ("euclidean", "sqeuclidean")
        # the GEMM form picks candidates with a little slack; exact distances decide below
        slack = radius * 1e-6 + 1e-9 if sq else 0.0
        D = vals = None
        if xp is not np and not sparse and block.X.dtype in (np.float32, np.float64) and isinstance(metric, str):
            from ..kernels.select import within

            # a count pass then a fill pass on the device: no (queries x rows) matrix
            bound = (radius + slack) ** 2 if metric == "euclidean" else radius + slack
            indptr, cols, vals = within(Q, block.X, bound, metric=metric, p=p)
            rows = np.repeat(np.arange(Q.shape[0]), np.diff(indptr.get()))
            cols = cols.get()
        else:
            D = local_distances(Q, block.X, metric, xp, p)
            rows, cols = (a.get() if hasattr(a, "get") else a for a in xp.nonzero(D <= radius + slack))
        if rows.size:
            if sq:
                rows_x, cols_x = (xp.asarray(a) for a in (rows, cols))
                if sparse:
                    vals = _sparse.pair_sq_distances(Q, block.X, rows_x, cols_x, xp)
                else:
                    diff = block.X[cols_x] - Q[rows_x]
                    vals = (diff * diff).sum(axis=1)
                vals = xp.sqrt(vals) if metric == "euclidean" else vals
            elif D is not None:
                vals = D[rows, cols]
            vals = vals.get() if hasattr(vals, "get") else vals
            order = np.argsort(rows, kind="stable")  # group by query (one pass, not one per query)
            rows, cols, vals = rows[order], cols[order], vals[order]
            starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
            ends = np.r_[starts[1:], rows.size]
            for a, b in zip(starts, ends):
                found[rows[a]].append((vals[a:b], cols[a:b] + block.offset))

    ring_visit(_Block(X, None, int(offsets[comm.rank])), visit, comm=comm, offsets=offsets, counts=counts,
               exchange=exchange)
    out_d, out_i = [], []
    for parts in found:
        d = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
        g = np.concatenate([p[1] for p in parts]).astype(np.int64) if parts else np.empty(0, np.int64)
        keep = d <= radius  # the exact distances decide, not the GEMM form
        d, g = d[keep], g[keep]
        order = np.lexsort((g, d))
        out_d.append(d[order])
        out_i.append(g[order])
    return out_d, out_i


def ring_visit(home, visit, *, comm, offsets, counts, exchange):
    """Call ``visit(block)`` on every rank's index block, this rank's first (see module notes)."""
    p, r = comm.size, comm.rank
    if p == 1:
        visit(home)
        return
    if exchange == "onesided":
        _ring_onesided(home, visit, comm, offsets, counts)
        return
    right, left = (r + 1) % p, (r - 1) % p
    cur = home
    for s in range(p):
        src = (r - s - 1) % p  # owner of the block that arrives for step s + 1
        if exchange == "overlap" and s < p - 1:
            reqs = _post(cur, right, left, comm)
            visit(cur)
            cur = _finish(reqs, int(offsets[src]))
        else:
            visit(cur)
            if s < p - 1:
                cur = _finish(_post(cur, right, left, comm), int(offsets[src]))


def _parts(X):
    """The arrays that carry an index block: the rows, or a CSR matrix's data, indices and indptr."""
    if _sparse.is_sparse(X):
        return [X.data, X.indices, X.indptr]
    return [X]


def _post(block, right, left, comm):
    """Post the sends of ``block`` to ``right`` and the receives of the next block from ``left``.

    A sparse block travels as its three CSR arrays (``nnz`` values and indices, rows + 1
    offsets): never densified.  Every rank's block has the same kind (agreed at ``fit``).
    """
    parts = _parts(block.X)
    if block.Y is not None:
        parts.append(block.Y)
    # device blocks go device-direct (NCCL send/recv, stream-ordered) where the communicator has NCCL;
    # every rank posts its parts in the same order, as NCCL's pairing of sends and receives needs
    pairs = [comm.isendrecv(a, right, left, tag=_TAG_X + i) for i, a in enumerate(parts)]
    return pairs, _sparse.is_sparse(block.X), block.X.shape[1], block.Y is not None


def _finish(reqs, offset):
    pairs, sparse, d, has_y = reqs
    got = [r.wait() for r in pairs]
    Y = got.pop() if has_y else None
    if sparse:
        X = _sparse.csr_like(got[0], got[1], got[2], d, get_namespace(got[0]))
    else:
        X = got[0]
    return _Block(X, Y, offset)


# ---------------------------------------------------------------------- one-sided
def _mpi_comm(comm):
    """The mpi4py communicator under ``comm`` (one-sided needs MPI RMA windows)."""
    world = getattr(comm, "_world", None)
    raw = getattr(world, "comm", None)
    if raw is None:
        raise ValueError(f"exchange='onesided' needs the 'mpi' host backend; this communicator's is "
                         f"{getattr(comm, 'backend', '?')!r}")
    return raw


class _SlotWindow:
    """A circular buffer of three slots in every rank's memory, one int64 flag per slot.

    Layout of the window (bytes): ``[flag0 flag1 flag2 | slot0 | slot1 | slot2]``; a
    slot holds ``[n_rows (int64) | X rows | Y rows]``.  Flags: 0 free, 1 full.

    One passive-target epoch (``Lock_all``) spans the whole search: per-call exclusive
    locks would wait for the target to enter MPI (MPICH has no asynchronous progress),
    that is for its computation to end, which serialised the ring.  Flags are read and
    written with atomic RMA (``Fetch_and_op`` with ``NO_OP``, ``Accumulate`` with
    ``REPLACE``), so a rank polling its own flag while its neighbour raises it is well
    defined; ``Flush`` completes each operation at the target, so a block is in place
    before its flag goes up.
    """

    def __init__(self, raw, slot_bytes):
        from mpi4py import MPI

        self.MPI = MPI
        self.slot_bytes = int(slot_bytes)
        self.nbytes = 8 * _SLOTS + _SLOTS * self.slot_bytes
        self.rank = raw.Get_rank()
        self.win = MPI.Win.Allocate(self.nbytes, disp_unit=1, comm=raw)
        mem = np.frombuffer(self.win.tomemory(), dtype=np.uint8)
        self.win.Lock(self.rank)
        mem[:8 * _SLOTS] = 0
        self.win.Unlock(self.rank)
        raw.Barrier()
        self.win.Lock_all()
        self.deadline = _config.timeout()

    def _slot_disp(self, slot):
        return 8 * _SLOTS + slot * self.slot_bytes

    def _flag(self, target, slot):
        out = np.zeros(1, dtype=np.int64)
        self.win.Fetch_and_op([np.zeros(1, dtype=np.int64), self.MPI.INT64_T], [out, self.MPI.INT64_T], target,
                              8 * slot, op=self.MPI.NO_OP)
        self.win.Flush(target)
        return int(out[0])

    def _set_flag(self, target, slot, value):
        buf = np.array([value], dtype=np.int64)
        self.win.Accumulate([buf, self.MPI.INT64_T], target, target=(8 * slot, 1, self.MPI.INT64_T),
                            op=self.MPI.REPLACE)
        self.win.Flush(target)

    def wait_flag(self, target, slot, value, what):
        start = time.monotonic()
        pause = 2e-5
        while self._flag(target, slot) != value:
            if self.deadline is not None and time.monotonic() - start > self.deadline:
                raise CommTimeoutError(f"onesided k-NN ring: rank {self.rank} waited over {self.deadline} s "
                                       f"for {what} (rank {target}, slot {slot})")
            time.sleep(pause)  # back off: a spinning poller would steal the core of a computing peer
            pause = min(2 * pause, 1e-3)

    def put(self, target, slot, payload):
        """Write ``payload`` (uint8) into ``slot`` of ``target`` once it is free, then raise its flag."""
        self.wait_flag(target, slot, 0, "a free slot")
        self.win.Put([payload, self.MPI.BYTE], target, target=(self._slot_disp(slot), payload.size, self.MPI.BYTE))
        self.win.Flush(target)  # the block is complete at the target before the flag goes up
        self._set_flag(target, slot, 1)

    def take(self, slot):
        """Wait for ``slot`` of this rank to be full; return a copy of its bytes."""
        self.wait_flag(self.rank, slot, 1, "a full slot")
        buf = np.empty(self.slot_bytes, dtype=np.uint8)
        self.win.Get([buf, self.MPI.BYTE], self.rank, target=(self._slot_disp(slot), self.slot_bytes, self.MPI.BYTE))
        self.win.Flush(self.rank)
        self._set_flag(self.rank, slot, 0)  # copied out: the sender may refill the slot
        return buf

    def free(self):
        self.win.Unlock_all()
        self.win.Free()


def _host(a):
    return a.get() if is_device_array(a) else a


def _pack(block):
    """``[n_rows, nnz | rows | targets]`` as bytes; a sparse block's rows are ``indptr (int64) |
    indices (int64) | data``."""
    X = block.X
    if _sparse.is_sparse(X):
        nnz = int(X.nnz)
        rows = [_host(X.indptr).astype(np.int64), _host(X.indices).astype(np.int64), _host(X.data)]
    else:
        nnz = -1
        rows = [_host(X)]
    parts = [np.array([X.shape[0], nnz], dtype=np.int64)] + rows
    if block.Y is not None:
        parts.append(_host(block.Y))
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).ravel() for p in parts])


def _unpack(buf, d, x_dtype, t, offset, xp):
    n, nnz = (int(v) for v in buf[:16].view(np.int64))
    pos = 16

    def take(count, dtype):
        nonlocal pos
        nb = count * np.dtype(dtype).itemsize
        out = buf[pos:pos + nb].view(dtype)
        pos += nb
        return out if xp is np else xp.asarray(out)

    if nnz >= 0:
        indptr, indices, data = take(n + 1, np.int64), take(nnz, np.int64), take(nnz, x_dtype)
        X = _sparse.csr_like(data, indices, indptr, d, xp)
    else:
        X = take(n * d, x_dtype).reshape(n, d)
    Y = take(n * t, np.float64).reshape(n, t) if t is not None else None
    return _Block(X, Y, offset)


def _ring_onesided(home, visit, comm, offsets, counts):
    p, r = comm.size, comm.rank
    xp = get_namespace(home.X)
    d, x_dtype = home.X.shape[1], home.X.dtype
    t = None if home.Y is None else home.Y.shape[1]
    if _sparse.is_sparse(home.X):  # slots sized by the largest packed block of any rank (one allgather)
        slot = max(comm.allgather_obj(_pack(home).size))
    else:
        row_bytes = d * np.dtype(x_dtype).itemsize + (0 if t is None else 8 * t)
        slot = 16 + int(np.max(counts)) * row_bytes
    win = _SlotWindow(_mpi_comm(comm), slot)
    right = (r + 1) % p
    try:
        cur = home
        for s in range(p):
            if s < p - 1:
                win.put(right, (s + 1) % _SLOTS, _pack(cur))
            visit(cur)
            if s < p - 1:
                cur = _unpack(win.take((s + 1) % _SLOTS), d, x_dtype, t, int(offsets[(r - s - 1) % p]), xp)
        _mpi_comm(comm).Barrier()  # nobody frees the window while a peer still reads its flags
    finally:
        win.free()
