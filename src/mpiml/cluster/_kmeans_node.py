"""The Lloyd step of CPU ranks on one node: the node's rows in node memory, their parts shared by every thread.

With each rank stepping over its own rows, a Lloyd iteration of R ranks lasts as long as its slowest rank's
step, and which rank is slowest changes from one iteration to the next (a vCPU descheduled, a core's other
hardware thread busy, another rank's thread on the core): on 8 ranks of 8 threads of the 64-core host each rank
waited 0.18-0.23 s of a 0.99 s fit for the others, its own work 0.76-0.81 s (key ``kmeans_0240`` of
benchmarks/results/ml_cpu_64core_4xh100.json).  Where ranks outnumber the cores (4 ranks on 2) a rank whose
core runs another rank is late to every iteration.

Here, when every rank of the communicator shares one node (and the rows fit :data:`NODE_BYTES`), the fit copies
each rank's rows once into node memory (its own part of the windows: first touched by that rank), and every
step's parts (:func:`n_parts`, of the node's rows) are taken by the threads of *all* the ranks from one
counter in that memory, as the threads of one rank take a rank's (:mod:`mpiml.cluster._kmeans_cpu`): the
threads of a slow rank take fewer parts.  Each part writes its own partial sums there; after a barrier every
rank adds them in part order (the same bits on every rank, and for any number of ranks or threads), so no
allreduce is needed.  Counter and partials come in two sets, used in turn by consecutive steps: a rank that
starts the next step while another still adds this step's partials writes the other set.

Where ranks outnumber the node's cores (:func:`mpiml.utils._threads.node_workers`), only as many ranks as there are
cores run the steps (the *workers*): the others sleep through the iterations, on a counter in node memory, until
the workers publish the final centres there (:meth:`NodeLloyd.finish`); their rows' labels and distances are
written in node memory by the workers' threads.  No part then waits for a thread whose core another rank holds,
and no rank with nothing to do wakes at every step to take a core from one that computes.  An empty cluster is
moved by the workers over the node's rows (:meth:`NodeLloyd.relocate`: the rows and order that the ranks' offers
give).  The steps' barriers are counters in node memory (:class:`mpiml.utils._node_memory.NodeBarrier`): the last
rank to arrive ends one, where an MPI barrier moves on only as fast as its slowest-scheduled rank polls.
"""

import os

import numpy as np

__all__ = ["NODE_BYTES", "start", "NodeLloyd"]

#: The node's rows (all ranks) are copied into node memory up to this many bytes (``MPIML_KMEANS_NODE_BYTES``) and
#: an eighth of the node's memory; beyond, or with ``MPIML_KMEANS_NODE=0``, each rank steps over its own rows and
#: the ranks allreduce.
NODE_BYTES = 8 << 30
#: Parts of the node's rows at most (a function of the shape alone: the bits do not depend on the ranks)
_MAX_PARTS = 512
_MIN_ROWS = 2048
#: Bytes of one set of partial sums at most.
_PARTIAL_BYTES = 32 << 20
#: Partials (parts x packed entries) below which every rank adds them all itself (no second barrier)
_SPLIT_SUM = 1 << 18
#: int64 slots between the two counters and the barrier's (a cache line apart)
_COUNTER_STRIDE = 8
#: Whether the last fit of this process stepped over the node's rows, and on windows kept from the fit before
LAST = {"node": False, "reused": False}
#: A fit's windows of at most this many bytes on every rank are kept for the next fit of the same shapes (an
#: ``n_init`` run, a refit): allocating them and first touching their pages was most of the set-up
KEEP_BYTES = 256 << 20
#: id of an mpi4py communicator -> (the communicator, the shapes, the NodeLloyd): the kept windows
_KEPT = {}
_COPY = []
_ADD = []


def n_parts(n, k, d):
    """Parts of the node's ``n`` rows (see the module notes)."""
    by_memory = _PARTIAL_BYTES // max(1, (k * d + k + 2) * 8)
    return int(max(1, min(_MAX_PARTS, n // _MIN_ROWS, by_memory)))


def start(shard, weight, labels, mind, k):
    """A :class:`NodeLloyd` for this fit's Lloyd steps, or None (rows not dense on the host, one rank, ranks on
    several nodes, too many bytes, ``MPIML_KMEANS_NODE=0``).  Collective over ``shard.comm`` when it returns one;
    the choice is the same on every rank (its inputs are agreed)."""
    comm, X = shard.comm, shard.X
    LAST["node"] = False
    if comm.size == 1 or not isinstance(X, np.ndarray) or os.environ.get("MPIML_KMEANS_NODE", "1") == "0":
        return None
    from ..utils._threads import one_node_comm

    raw = one_node_comm(comm)   # (collective the first time: before any choice that could differ between nodes)
    if raw is None:
        return None
    limit = int(os.environ.get("MPIML_KMEANS_NODE_BYTES", NODE_BYTES))
    try:   # the copy of the rows takes at most an eighth of the node's memory (the same figure on every rank)
        limit = min(limit, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8)
    except (ValueError, OSError, AttributeError):
        pass
    if int(shard.n_total) * X.shape[1] * X.dtype.itemsize > limit:
        return None
    counts = tuple(comm.allgather_obj(int(X.shape[0])))
    key = (counts, X.shape[1], X.dtype.str, mind is not None, weight is None, int(k))
    kept = _KEPT.pop(id(raw), None)
    if kept is not None and kept[0] is raw and kept[1] == key:
        node, LAST["reused"] = kept[2], True
    else:
        if kept is not None and kept[0] is raw:
            kept[2].close()
        from ..utils._node_memory import room_for

        rows = sum(counts) * (X.shape[1] * X.dtype.itemsize + 4 + (X.dtype.itemsize if mind is not None else 0) +
                              (8 if weight is not None else 0))
        if not comm.allreduce_obj(bool(room_for(rows)), op="min"):   # the node's shared memory too small
            return None
        node, LAST["reused"] = NodeLloyd(raw, comm, X, weight, labels, mind, k, counts), False
        if not node.failed:
            from ..utils._threads import node_workers

            node.workers = node_workers(comm, raw)   # (collective the first time, on every rank alike)
        if comm.allreduce_obj(bool(node.failed), op="max"):
            node.close()
            return None
    node.begin(X, weight, labels, mind)
    node.key = key
    LAST["node"] = True
    return node


class NodeLloyd:
    """The windows of a fit's node-wide Lloyd steps; ``labels`` and ``mind`` are this rank's rows of them."""

    def __init__(self, raw, comm, X, weight, labels, mind, k, counts):
        from ..comm.backends.mpi import mpi_module
        from ..utils._node_memory import node_arrays

        self.comm, self.raw, self.MPI = comm, raw, mpi_module()
        n, d = X.shape
        self.k, self.d, self.dtype = int(k), int(d), X.dtype
        counts = np.asarray(counts, dtype=np.int64)
        self.N = int(counts.sum())
        self.offset = int(counts[:comm.rank].sum())
        self.parts = n_parts(self.N, self.k, self.d)
        self.keep_mind, self.unit = mind is not None, weight is None
        first = np.r_[1, np.zeros(comm.size - 1, dtype=np.int64)]   # rank 0 allocates the shared scalars
        P, kd = self.parts, self.k * self.d
        layout = {"X": counts * d * X.dtype.itemsize, "labels": counts * 4,
                  "sums": first * 2 * P * kd * 8, "counts": first * 2 * P * self.k * 8, "stats": first * 2 * P * 2 * 8,
                  "packed": first * 2 * (kd + self.k + 2) * 8, "counter": first * 4 * _COUNTER_STRIDE * 8,
                  "result": first * (kd + 2) * 8}
        if self.keep_mind:
            layout["mind"] = counts * X.dtype.itemsize
        if not self.unit:
            layout["w"] = counts * 8
        self.bytes = max(int(sum(int(v[j]) for v in layout.values())) for j in range(comm.size))
        self.wins, self.mem, self.failed, self.workers = {}, {}, False, comm.size
        from ..utils._node_memory import node_pids

        self.pids = node_pids(raw)       # (a rank that dies is found by the others' waits: NodeBarrier)
        try:
            self.wins, self.mem = node_arrays(self.MPI, raw, layout, comm.rank)
            self.failed = any(m is None for m in self.mem.values())
        except Exception:   # an MPI without shared windows here (agreed by the caller)
            self.failed = True

    def begin(self, X, weight, labels, mind):
        """Write this rank's rows (and labels, weights) into node memory; every rank's before any step."""
        from ..utils._node_memory import sync

        m, N, P, k, d = self.mem, self.N, self.parts, self.k, self.d
        self.X = m["X"].view(self.dtype).reshape(N, d)
        self.labels_all = m["labels"].view(np.int32)
        self.mind_all = m["mind"].view(self.dtype) if self.keep_mind else np.empty(0, dtype=self.dtype)
        self.w = m["w"].view(np.float64) if not self.unit else np.ones(1)
        self.sums_p = m["sums"].view(np.float64).reshape(2, P, k, d)
        self.counts_p = m["counts"].view(np.float64).reshape(2, P, k)
        self.stats_p = m["stats"].view(np.float64).reshape(2, P, 2)
        self.packed = m["packed"].view(np.float64).reshape(2, k * d + k + 2)
        self.counter = m["counter"].view(np.int64)
        self.result = m["result"].view(np.float64)
        from ..utils._node_memory import NodeBarrier

        at, done = 2 * _COUNTER_STRIDE, 3 * _COUNTER_STRIDE
        self.idle = self.comm.rank >= self.workers
        # the steps' barrier: the workers'; the end's: every rank's
        self.barrier = NodeBarrier(self.counter[at:at + 1], self.workers, self.wins, self.pids[:self.workers])
        self.done = NodeBarrier(self.counter[done:done + 1], self.comm.size, self.wins, self.pids)
        mine = slice(self.offset, self.offset + X.shape[0])
        for w in self.wins.values():
            w.Lock_all(self.MPI.MODE_NOCHECK)
        _copy_rows()(self.X[mine], np.ascontiguousarray(X))   # by this rank's threads: its pages, its NUMA node
        self.labels_all[mine] = labels
        if not self.unit:
            self.w[mine] = weight
        if self.comm.rank == 0:
            self.counter[:] = 0
        self.labels = self.labels_all[mine]          # this rank's rows: views of node memory
        self.mind = self.mind_all[mine] if self.keep_mind else None
        self.step_count = 0
        sync(self.wins)
        self.comm.barrier()          # (the barrier's counter zeroed: every rank left its last use, at start's
        sync(self.wins)              # allgather)

    def step(self, C, shift):
        """The packed ``[sums | counts | inertia | changed]`` of one Lloyd step over the node's rows from the
        shifted centres ``C`` (the same array on every worker); labels and distances updated in place.  Called by
        the workers alone (an idle rank waits in :meth:`finish`)."""
        from ..utils._threads_jit import workers
        from ._kmeans_cpu import _lloyd_kernel, block_rows, nb

        i = self.step_count
        slot, other = i % 2, (i + 1) % 2
        if self.comm.rank == 0:   # the other set's counter: every rank finished taking from it before this step
            self.counter[other * _COUNTER_STRIDE] = 0
        k, d = self.k, self.d
        CT = np.ascontiguousarray(C.T, dtype=self.dtype)
        C64 = C.astype(np.float64, copy=False)
        c_sq = np.einsum("ij,ij->i", C64, C64)
        shift = np.zeros(d, dtype=self.dtype) if shift is None else np.ascontiguousarray(shift, dtype=self.dtype)
        at = slot * _COUNTER_STRIDE
        _lloyd_kernel(self.X, shift, CT, c_sq, self.w, self.unit, self.labels_all, self.mind_all, self.keep_mind,
                      self.parts, block_rows(k, d), workers(self.parts, nb.get_num_threads()),
                      self.counter[at:at + 1], self.sums_p[slot], self.counts_p[slot], self.stats_p[slot], True)
        self.barrier.wait()                           # every part of this step done (the workers')
        # the parts' partials added in part order: by every rank alone where they are few, else each rank its
        # share of the packed vector's entries and one more barrier (the sum alone read 8 MB of partials a step
        # at k = 64, d = 32, 512 parts; a barrier of 4 ranks on 2 cores costs ~0.4 ms)
        r, total = self.comm.rank, k * d + k + 2
        self.step_count += 1
        if self.parts * total < _SPLIT_SUM:
            packed = np.zeros(total)
            _add_columns(self.sums_p[slot], self.counts_p[slot], self.stats_p[slot], packed, 0, total)
            return packed
        w = self.workers
        _add_columns(self.sums_p[slot], self.counts_p[slot], self.stats_p[slot], self.packed[slot],
                     r * total // w, (r + 1) * total // w)
        self.barrier.wait()                           # every entry added
        return self.packed[slot].copy()

    def relocate(self, sums, counts, shift):
        """Move the empty clusters of ``counts`` onto the node's rows farthest from their centres, in place (a worker;
        :func:`mpiml.cluster._kmeans._relocate_empty_clusters` over the node's rows, read in node memory: the same
        rows as the ranks' offers, larger distance first, then smaller row index, rows on a centre left out)."""
        empty = np.nonzero(counts == 0)[0]
        mind = self.mind_all.astype(np.float64)
        order = np.argsort(-mind, kind="stable")
        order = order[mind[order] > 0][:len(empty)]
        for new_id, row in zip(empty, order):
            w = 1.0 if self.unit else float(self.w[row])
            old = int(self.labels_all[row])
            x = (self.X[row] - shift).astype(np.float64) if shift is not None else self.X[row].astype(np.float64)
            sums[old] -= x * w
            sums[new_id] = x * w
            counts[new_id] = w
            counts[old] -= w

    def finish(self, centres=None, n_iter=0, seconds=0.0):
        """The end of the iterations, on every rank: a worker (rank 0) publishes the final ``centres`` (the
        working dtype), the iterations' count and their seconds; an idle rank, asleep since :meth:`begin`, reads
        them.  Returns ``(centres, n_iter, seconds)``."""
        kd = self.k * self.d
        if self.comm.rank == 0:
            self.result[:kd] = np.asarray(centres, dtype=np.float64).reshape(-1)
            self.result[kd], self.result[kd + 1] = n_iter, seconds
        self.done.wait(self.idle)
        if not self.idle:
            return centres, n_iter, seconds
        out = self.result[:kd].reshape(self.k, self.d).astype(self.dtype)
        return out, int(self.result[kd]), float(self.result[kd + 1])

    def release(self):
        """The end of a fit: the windows kept for the next fit of the same shapes (:data:`KEEP_BYTES`), else
        freed (collective)."""
        if self.bytes > KEEP_BYTES:
            self.close()
            return
        for w in self.wins.values():
            w.Unlock_all()
        self.labels = self.mind = None
        _KEPT[id(self.raw)] = (self.raw, self.key, self)

    def close(self):
        """Free the windows (collective); ``labels`` and ``mind`` are no longer valid after."""
        from ..utils._node_memory import free

        if not self.failed and self.wins:
            for w in self.wins.values():
                try:
                    w.Unlock_all()
                except Exception:   # never locked (begin did not run)
                    pass
        self.labels = self.mind = None
        for name in ("X", "labels_all", "mind_all", "w", "sums_p", "counts_p", "stats_p", "packed", "counter",
                     "result", "barrier", "done"):
            self.__dict__.pop(name, None)
        free(self.wins, self.mem)


def _add_columns(sums_p, counts_p, stats_p, packed, c0, c1):
    """Entries ``c0:c1`` of the packed ``[sums | counts | inertia | changed]``: each the sum over the parts in
    part order (the additions of :func:`mpiml.cluster._kmeans_cpu._add_parts`, entry by entry)."""
    if not _ADD:
        from ._kmeans_cpu import nb

        @nb.njit(cache=True, nogil=True)
        def add(sums_p, counts_p, stats_p, packed, c0, c1):
            parts, k, d = sums_p.shape
            kd = k * d
            flat = sums_p.reshape(parts, kd)
            for c in range(c0, c1):
                packed[c] = 0.0
            for part in range(parts):              # rows of the partials read in order (each entry: part order)
                for c in range(c0, min(c1, kd)):
                    packed[c] += flat[part, c]
                for c in range(max(c0, kd), min(c1, kd + k)):
                    packed[c] += counts_p[part, c - kd]
                for c in range(max(c0, kd + k), c1):
                    packed[c] += stats_p[part, c - kd - k]
        _ADD.append(add)
    _ADD[0](sums_p, counts_p, stats_p, packed, c0, c1)


def _copy_rows():
    """A compiled ``dst[:] = src`` over row blocks in parallel (this rank's threads first touch the pages)."""
    if not _COPY:
        from ._kmeans_cpu import nb

        @nb.njit(cache=True, parallel=True, nogil=True)
        def copy(dst, src):
            n = src.shape[0]
            blocks = (n + 1023) // 1024
            for b in nb.prange(blocks):
                for i in range(b * 1024, min(n, (b + 1) * 1024)):
                    dst[i] = src[i]

        _COPY.append(copy)
    return _COPY[0]
