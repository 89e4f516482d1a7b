"""The gathered k-NN search of CPU ranks (``strategy="gather"``): the whole index on every rank, or once in node memory.

:func:`gathered_kneighbors` serves :func:`mpiml.neighbors._ring.ring_kneighbors` where the index fits
(see docs/neighbors.md, "CPU ranks gather an index that fits").  Two forms, the same lists:

* **one node** (every rank of the communicator on one shared-memory node, MPI underneath): one MPI
  shared-memory window holds the index, every rank's queries and their running lists, once for the
  node; each rank writes its own rows there, then every rank's threads take the query blocks of *all*
  the ranks' queries from one atomic counter in that memory (:func:`mpiml.neighbors._cpu.merge_block`
  given ``counter``), as the threads of one rank take a rank's: a rank whose blocks run slower (harder
  queries, a busier core) no longer holds the others up, which splitting the work by the ranks'
  queries did (the slowest rank decides);
* **otherwise**: each rank gathers the index (one ``allgatherv``) and searches its own queries.

The lists are exact (value, global index) lists of every row whichever thread of whichever rank
searched a query, so both forms give the ring's result.

Where ranks outnumber the node's cores (:func:`mpiml.utils._threads.node_workers`), only as many ranks as there
are cores search (their threads take every rank's blocks); the others write their rows and queries, then sleep
until the search ends (4 ranks' threads on 2 cores searched in 0.19 s where 2 ranks' took 0.11: a block whose
thread lost its core held the end up).  The waits after the rows are written are counters in node memory
(:class:`mpiml.utils._node_memory.NodeBarrier`), not MPI barriers.
"""

import os
import time

import numpy as np

from ..utils._node_memory import NodeBarrier, free, node_arrays, room_for, sync

__all__ = ["gathered_kneighbors", "node_comm", "SHARED"]

#: Search in node memory where every rank shares one node (False, or ``MPIML_KNN_SHARED=0``: each rank
#: gathers the index; tests and A/B runs).
SHARED = True
#: seconds of the last one-node search's phases on this rank (read by ``mpiml bench ml --device cpu``)
LAST = {}
#: A search's windows of at most this many bytes on every rank are kept for the next search of the same sizes
#: (see :func:`_windows`); larger ones are freed after their search.
KEEP_BYTES = 64 << 20
#: id of an mpi4py communicator -> (the communicator, the sizes, the windows, their memory): the kept windows
_KEPT = {}
#: Bytes of the window of the blocks' counter (int64 0) and the node barrier's (int64 8, a cache line on)
_COUNTER_BYTES = 128
_BARRIER_SLOT = 8


def node_comm(comm):
    """The mpi4py communicator under ``comm`` when all its ranks share one node (and MPI can open a shared
    window on it), else None (also with ``SHARED`` False or ``MPIML_KNN_SHARED=0``).  A collective the first time
    per communicator (a shared-memory split)."""
    if not SHARED or os.environ.get("MPIML_KNN_SHARED", "1") == "0":
        return None
    from ..utils._threads import one_node_comm

    return one_node_comm(comm)


def _per_rank(cpu, Q, X, Y, k, metric, p, comm):
    every = comm.allgatherv(np.ascontiguousarray(X))
    pay = None if Y is None else comm.allgatherv(np.ascontiguousarray(Y, dtype=np.float64))
    bd, bi = cpu.new_lists(Q.shape[0], k)
    if Q.shape[0]:
        cpu.merge_block(Q, every, 0, bd, bi, metric, p)
    return bd, bi, None if pay is None else _payload(cpu, bi, pay)


def _payload(cpu, bi, Yall):
    """The targets of the lists ``bi`` (global rows of ``Yall``)."""
    t = Yall.shape[1]
    empty = np.full(bi.shape, np.iinfo(np.int64).max, dtype=np.int64)
    return cpu.carry_payload(empty, np.zeros(bi.shape + (t,)), bi, 0, Yall)


def _key(parts):
    """The sizes of a search's windows, as the kept windows are matched."""
    return tuple((name, tuple(int(v) for v in sizes)) for name, sizes in parts.items())


def _windows(MPI, raw, parts, r):
    """``(windows, their memory as arrays or None, kept state or None)`` for a search of these ``parts`` sizes: the
    windows kept from the last search on ``raw`` when the sizes are the same (with their state: the node barrier,
    whose count goes on from search to search, and the searching threads), else new ones (the kept ones of other
    sizes freed first).  The same choice on every rank: the sizes are the ranks' agreed counts.

    Allocating and freeing were a fixed cost of every search: on 8 ranks of the 64-core host (3e5 x 32 index,
    40000 queries) 1.5 ms to allocate, 21 ms to write the rows into fresh pages (their first touch) and 46 ms
    to free, of a 1.09 s search (key ``knn_0240``); on 2 ranks of the development VM 2 + 6-11 + 3-7 ms of
    0.15 s.  Searches of the same sizes (repeated or batched queries on one index) reuse the pages."""
    key = _key(parts)
    kept = _KEPT.pop(id(raw), None)
    if kept is not None and kept[0] is raw and kept[1] == key:
        return kept[2], kept[3], kept[4]
    if kept is not None and kept[0] is raw:
        free(kept[2], kept[3])
    return (*node_arrays(MPI, raw, parts, r), None)


def _in_node(cpu, raw, Q, X, Y, k, metric, p, comm, qcounts, offsets, counts):
    """The one-node form (see the module notes).  Each array is a window of which each rank allocates its own
    rows (its index rows, its queries and their lists): a window's memory is first touched, and on some MPIs
    cleared, by the rank that allocates it.  With one window allocated by rank 0, rank 0's own work took 80 ms
    more than the other ranks' at 3e5 x 32 on 8 ranks of the 64-core host, and they waited that long."""
    from ..comm.backends.mpi import mpi_module
    from ..utils._jit import numba

    MPI = mpi_module()
    clock = [time.perf_counter()]
    LAST.clear()

    def lap(name):
        now = time.perf_counter()
        LAST[name] = round(now - clock[0], 6)
        clock[0] = now

    r, d, dt = comm.rank, X.shape[1], X.dtype
    N, nq = int(np.sum(counts)), int(np.sum(qcounts))
    qoff = np.concatenate([[0], np.cumsum(qcounts)]).astype(np.int64)
    t = None if Y is None else Y.shape[1]
    from ..utils._threads import node_workers

    # the ranks that search: one a core of the node at most (the others' blocks are searched by their threads)
    workers = node_workers(comm, raw)
    searches = r < workers
    n_rows, q_rows = np.asarray(counts, dtype=np.int64), np.asarray(qcounts, dtype=np.int64)
    parts = {"X": n_rows * d * dt.itemsize, "Q": q_rows * d * dt.itemsize, "bd": q_rows * k * 8,
             "bi": q_rows * k * 8, "counter": np.r_[_COUNTER_BYTES, np.zeros(comm.size - 1, dtype=np.int64)]}
    if t is not None:
        parts["Y"] = n_rows * t * 8
    shared_screen = metric in ("euclidean", "sqeuclidean")
    if shared_screen:   # the screen's rows, prepared by each rank for its own rows (see _prepare_screen)
        sdt = cpu._screen_dtype(X, metric)
        if sdt == np.float32 and cpu.FUSED:  # packed: each rank's part holds the groups its first row starts
            from . import _fused

            xbytes = _packed_parts(offsets, N, _fused.W) * (d * _fused.W * sdt.itemsize)
            qbytes = _packed_parts(qoff[:-1], nq, _fused.R) * (d * _fused.R * sdt.itemsize)
        else:
            xbytes, qbytes = n_rows * d * sdt.itemsize, q_rows * d * sdt.itemsize
        parts.update(XS=xbytes, xn=n_rows * 8, xs=n_rows * 8, QS=qbytes, qn=q_rows * 8, qs=q_rows * 8,
                     big=np.full(comm.size, 8, dtype=np.int64))
    wins, mem, state = {}, {}, None
    kept = _KEPT.get(id(raw))
    if not (kept is not None and kept[0] is raw and kept[1] == _key(parts)):
        # windows to allocate: where the node's shared memory is too small for them, each rank gathers the index
        total = int(sum(int(np.sum(sizes)) for sizes in parts.values()))
        if not comm.allreduce_obj(bool(room_for(total)), op="min"):
            return _per_rank(cpu, Q, X, Y, k, metric, p, comm)
    try:
        wins, mem, state = _windows(MPI, raw, parts, r)
        failed = any(m is None for m in mem.values())
        lap("allocate_s")
    except Exception:  # an MPI without shared windows here (agreed below): the per-rank form, from now on
        failed = True
    reused = state is not None                  # (kept windows worked before: nothing to agree on)
    if not reused and comm.allreduce_obj(bool(failed), op="max"):
        from ..utils._threads import not_one_node

        not_one_node(raw)
        for w in wins.values():
            w.Free()
        return _per_rank(cpu, Q, X, Y, k, metric, p, comm)
    try:
        counter = mem["counter"].view(np.int64)
        Xall, Qall = mem["X"].view(dt).reshape(N, d), mem["Q"].view(dt).reshape(nq, d)
        bd, bi = mem["bd"].view(np.float64).reshape(nq, k), mem["bi"].view(np.int64).reshape(nq, k)
        Yall = None if t is None else mem["Y"].view(np.float64).reshape(N, t)
        for w in wins.values():
            w.Lock_all(MPI.MODE_NOCHECK)

        mine = slice(int(offsets[r]), int(offsets[r]) + X.shape[0])
        Xall[mine] = X
        if Yall is not None:
            Yall[mine] = Y
        Qall[qoff[r]:qoff[r + 1]] = Q
        bd[qoff[r]:qoff[r + 1]], bi[qoff[r]:qoff[r + 1]] = cpu.new_lists(int(qcounts[r]), k)
        if reused:
            # every rank passed the last search's barriers, so none takes a block of it any more; the barrier's
            # count goes on (no collective here: each one of 3-4 ranks on 2 cores waits for the scheduler)
            barrier, threads = state["barrier"], state["threads"]
            if r == 0:
                counter[:1] = 0                 # the blocks' counter
            lap("write_s")
            barrier.wait()                      # every rank's rows in place
        else:
            if r == 0:
                counter[:] = 0                  # the blocks' counter and the barrier's
            # the threads that take blocks, of every rank (kept with the windows: the blocks are cut the same on
            # every rank whatever a rank's thread count is later)
            threads = int(comm.allreduce_obj(int(numba().get_num_threads()) if searches else 0))
            lap("write_s")
            sync(wins)
            comm.barrier()                      # every rank's rows in place
            sync(wins)
            barrier = NodeBarrier(counter[_BARRIER_SLOT:_BARRIER_SLOT + 1], comm.size, wins)
        lap("wait_rows_s")
        prepared = _prepare_screen(cpu, mem, barrier, comm, Qall, Xall, workers, metric) if shared_screen else None
        lap("screen_s")
        if not searches:
            pass
        elif prepared is None:
            cpu.merge_block(Qall, Xall, 0, bd, bi, metric, p, counter[:1], threads)
        else:
            cpu.search_screened(Qall, Xall, *prepared, 0, k, metric, bd, bi, counter[:1], threads)
        lap("search_s")
        barrier.wait(idle=not searches)         # every block searched
        lap("wait_search_s")
        mine_q = slice(int(qoff[r]), int(qoff[r + 1]))
        out = bd[mine_q].copy(), bi[mine_q].copy()
        pay = None if Yall is None else _payload(cpu, out[1], Yall)
        keep = max(int(sum(int(sizes[j]) for sizes in parts.values())) for j in range(comm.size)) <= KEEP_BYTES
        if keep:
            barrier.wait(idle=not searches)      # every rank has copied its rows out before any writes again
        for w in wins.values():
            w.Unlock_all()
    except BaseException:
        free(wins, mem)                          # (every rank fails here alike, or the job aborts)
        raise
    LAST["reused"] = reused
    if keep:
        _KEPT[id(raw)] = (raw, _key(parts), wins, mem, {"barrier": barrier, "threads": threads})
    else:
        free(wins, mem)                          # collective: every rank has copied its rows out
    lap("free_s")
    return out[0], out[1], pay


def _packed_parts(starts, n, width):
    """Groups of ``width`` rows of a packed array (:func:`mpiml.neighbors._fused.pack_rows`) of ``n`` rows whose
    part each rank allocates: from the group of its first row (``starts``) to the next rank's, the last rank's
    to the end (a rank's rows are mostly in its own part; a group across two ranks is written by both)."""
    first = -(-np.asarray(starts, dtype=np.int64) // width)
    ends = np.r_[first[1:], -(-n // width)]
    return np.maximum(ends - first, 0)


def _share(n, parts, j):
    """Rows ``j``-th of ``parts`` equal shares of ``n`` rows."""
    return slice(n * j // parts, n * (j + 1) // parts)


def _prepare_screen(cpu, mem, barrier, comm, Qall, Xall, workers, metric):
    """The screen's rows of every index row and query (``mpiml.neighbors._cpu._topk_screened``: shifted by the
    mean of about a thousand index rows, rounded once) in node memory, an equal share of the rows by each of the
    ``workers`` ranks that search, then ``(QS, XS, qn, xn, qs, xs, big)`` for
    :func:`mpiml.neighbors._cpu.search_screened`; None where the screen must run in float64 instead (norms beyond
    float32's range: every rank sees it) -- the search then prepares its own.  Each rank prepared the whole index
    before: 12-18 ms of each of 8 ranks' search on the 64-core host (key ``knn_0240``), the same work on every
    rank.  The ranks beyond the node's cores prepare nothing (where 3 ranks shared 2 cores, a third of the rows
    each, the two that search waited for the third's share, run on a core one of them needed) and sleep."""
    N, d = Xall.shape
    nq = Qall.shape[0]
    r = comm.rank
    mine, mine_q = (_share(N, workers, r), _share(nq, workers, r)) if r < workers else (slice(0, 0), slice(0, 0))
    sdt = cpu._screen_dtype(Xall, metric)
    xn, xs, qn, qs = (mem[n].view(np.float64) for n in ("xn", "xs", "qn", "qs"))
    big = mem["big"].view(np.float64)
    # the same rows, the same order, the same shift on every rank
    shift = Xall[::max(1, N // 1024)].mean(axis=0, dtype=np.float64)
    if sdt == np.float32 and cpu.FUSED:
        from . import _fused

        XS = mem["XS"].view(sdt).reshape(_fused.packed_shape(N, d, _fused.W))
        QS = mem["QS"].view(sdt).reshape(_fused.packed_shape(nq, d, _fused.R))
        _fused.pack_rows(Xall[mine], shift, mine.start, XS, xn[mine], xs[mine])
        _fused.pack_rows(Qall[mine_q], shift, mine_q.start, QS, qn[mine_q], qs[mine_q])
        if r == workers - 1:                    # the padding of the last groups (no rank's rows)
            _fused.zero_padding(XS, N)
            _fused.zero_padding(QS, nq)
    else:
        XS, QS = mem["XS"].view(sdt).reshape(N, d), mem["QS"].view(sdt).reshape(nq, d)
        cpu._screen_rows(Xall[mine], shift, XS[mine], xn[mine], xs[mine])
        cpu._screen_rows(Qall[mine_q], shift, QS[mine_q], qn[mine_q], qs[mine_q])
    big[r] = max(float(xs[mine].max()) if xs[mine].size else 0.0, float(qs[mine_q].max()) if qs[mine_q].size else 0.0)
    barrier.wait(idle=r >= workers)             # every rank's screen rows in place
    top = float(big.max())
    if sdt != Xall.dtype and not top <= cpu._F32_MAX_NORM:
        return None
    return QS, XS, qn, xn, qs, xs, top


def gathered_kneighbors(cpu, Q, X, Y, k, *, metric, p, comm, qcounts, offsets, counts):
    """``(compared values, global indices, targets or None)`` of this rank's queries over every rank's rows
    (dense host rows, the compiled module ``cpu``); the caller finishes the values."""
    raw = node_comm(comm) if metric in ("euclidean", "sqeuclidean", "cosine") and int(np.sum(qcounts)) else None
    if raw is None:
        return _per_rank(cpu, Q, X, Y, k, metric, p, comm)
    return _in_node(cpu, raw, np.ascontiguousarray(Q), np.ascontiguousarray(X), Y, k, metric, p, comm, qcounts,
                    offsets, counts)
