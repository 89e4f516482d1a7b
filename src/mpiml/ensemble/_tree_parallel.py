"""Several host ranks grow whole trees each, on every rank's rows: the forest's CPU growth across ranks.

Level-wise growth over R ranks (:class:`._grower.TreeGrower`) sums every level's
histograms with collectives and searches every node of a level on every rank (or,
for nodes with fewer rows than bins, on one owner rank): on CPUs that per-level work
and the collectives do not shrink with the rows of a rank, and two ranks on one node
were slower than one on deep trees.  The binned rows are small (a byte a feature a
row), so when every rank can hold all of them, each rank gathers them (one
``allgatherv`` each of bins, targets and weights) and grows its share of
the trees alone (a block of consecutive trees), with the one-rank kernels (no histogram is
written out, no collective per level); one ``allgatherv`` per per-node array exchanges the
trees, straight into the forest's arrays.

The rows come in global order with their weights, so each tree is the one a single
process grows (the same bootstrap draws, feature orders and splits): the same forest as
level-wise growth, at any rank count.

Where the ranks of one node outnumber its cores (:func:`mpiml.utils._threads.node_workers`: 4 ranks on 2 cores),
only as many ranks as there are cores grow trees; the others wait for the exchange.  Ranks that share a core
grew their trees side by side, each slowed by the other and the last one holding up the exchange (0.14-0.17 s
at 4 ranks on the 2-core VM against 0.09 s at 2).
"""

import os
import time

import numpy as np

__all__ = ["applies", "grow"]

#: Largest bytes of gathered rows per rank (the bins twice, as rows and as columns, plus 32 bytes a row).
DEFAULT_BYTES = 1 << 30


def applies(grower, trees):
    """Whether ``grower`` (a host grower of several ranks) grows ``trees`` tree-parallel: at least two
    trees, and every rank's binned rows within ``MPIML_RF_TREE_PARALLEL_BYTES`` (default 1 GiB) per rank.
    Agreed inputs only (the row count is summed over the ranks), so every rank decides alike."""
    comm = grower.s.comm
    if not grower.cpu or comm is None or comm.size == 1 or len(trees) < 2:
        return False
    budget = float(os.environ.get("MPIML_RF_TREE_PARALLEL_BYTES", DEFAULT_BYTES))
    n_total = int(comm.allreduce(np.array([float(grower.n)]))[0])
    return n_total * (2 * grower.F * grower.s.Xb.dtype.itemsize + 32) <= budget


def _allgather_bins(comm, Xb):
    """Every rank's binned rows, in rank order (moved as 4-byte words: the collectives take no bytes)."""
    Xb = np.ascontiguousarray(Xb)
    width = Xb.shape[1] * Xb.itemsize
    pad = np.zeros((Xb.shape[0], -width % 4), dtype=np.uint8)
    words = np.ascontiguousarray(np.concatenate([Xb.view(np.uint8).reshape(Xb.shape[0], width), pad], axis=1))
    return comm.allgatherv(words.view(np.int32)).view(np.uint8)[:, :width].copy().view(Xb.dtype)


def grow(grower, trees):
    """The per-tree dicts of ``trees`` (as :meth:`._grower.TreeGrower.grow`), each grown by one rank: rank ``r``
    the ``r``-th of ``R`` consecutive blocks of ``trees``, so that the gathered arrays hold the trees in order."""
    s, comm = grower.s, grower.s.comm
    t0 = time.perf_counter()
    every = _allgather_bins(comm, s.Xb)
    weight = comm.allgatherv(np.ascontiguousarray(s.weight, dtype=np.float64))
    boot = s.bootstrap
    if boot is not None:                       # the same draws, over every row from the first
        boot = type(boot)(np, boot.m, boot.N, 0, boot.N, weights=weight, state={**boot.state, "before": 0.0})
    spec = type(s)(**{**s.__dict__, "Xb": every, "y": comm.allgatherv(np.ascontiguousarray(s.y)),
                       "weight": weight, "bootstrap": boot,
                       "comm": None, "max_local_rows": int(every.shape[0]),
                       "verbose": s.verbose if comm.rank == 0 else 0})
    alone = type(grower)(spec)                 # a grower of this rank alone, on every row
    (R, node), r = _growers(comm), comm.rank
    mine = list(trees[len(trees) * r // R:len(trees) * (r + 1) // R]) if r < R else []
    t1 = time.perf_counter()
    grown = alone.grow(mine) if mine else []
    if node is not None and R < comm.size:     # the ranks without trees asleep until the growers are done
        node.wait(idle=r >= R)
    t2 = time.perf_counter()
    for key, value in alone.stats.items():
        grower.stats[key] = grower.stats.get(key, 0) + value
    # the node counts (and the value's columns) first: their gather waits for the slowest rank, the rest of the
    # exchange is its own cost
    cols = int(np.asarray(grown[0]["value"]).size // max(1, len(grown[0]["feature"]))) if grown else 0
    head = comm.allgatherv(np.array([len(t["feature"]) for t in grown] + [cols], dtype=np.int64))
    t3 = time.perf_counter()
    per_rank = [len(trees) * (j + 1) // R - len(trees) * j // R if j < R else 0 for j in range(comm.size)]
    out = _exchange(comm, grown, head, per_rank, grower.F, getattr(s, "pruned", True), node)
    # where a rank's time goes (the benchmark reads them): gathering the rows, growing its trees, waiting for the
    # other ranks' trees, the exchange
    grower.stats.update(tree_parallel=1, gather_rows_s=t1 - t0, grow_own_s=t2 - t1, exchange_wait_s=t3 - t2,
                        exchange_s=time.perf_counter() - t3, own_trees=len(mine))
    return out


def _growers(comm):
    """``(ranks that grow trees (the first ones), a node barrier or None)``: every rank, but where all share one
    node, one a core of the node at most, and the others wait for them on a barrier in node memory (asleep, not
    polling an MPI collective; :func:`mpiml.utils._node_memory.node_barrier`).  A collective the first time per
    communicator; the same count on every rank."""
    from ..utils._threads import node_workers, one_node_comm

    raw = one_node_comm(comm)
    if raw is None:
        return comm.size, None
    workers = node_workers(comm, raw)
    if workers == comm.size:
        return workers, None
    from ..utils._node_memory import node_barrier

    try:
        return workers, node_barrier(raw)
    except Exception:   # no shared windows with this MPI: the ranks wait in the exchange's collective
        return workers, None


#: The per-node arrays of a grown tree that travel (``value`` has a column per class or output), and the
#: dtype each travels as (the collectives take no bytes: the 0/1 flags go as bools).
_TRAVEL = (("feature", np.int32), ("threshold", np.float64), ("left", np.int32), ("right", np.int32),
           ("value", np.float64), ("n_node_samples", np.int64), ("weighted_n_node_samples", np.float64),
           ("impurity", np.float64), ("decrease", np.float64), ("missing_left", np.bool_))


def _exchange(comm, grown, head, per_rank, n_features, pruned=True, node=None):
    """Every tree, in order, from every rank's consecutive block ``grown``, in one ``allgatherv``: each rank's
    per-node arrays (its trees concatenated) and importances packed into one buffer, 8-byte aligned; ``head``:
    every rank's trees' node counts followed by its value's columns (0 without trees), ``per_rank`` every rank's
    tree count.  The forest's arrays are the ranks' parts concatenated (one copy; the trees views of them, which
    :func:`._flat.pack_trees` then takes without a copy).  The splits' impurity decreases travel only for the
    pruning (``pruned``) that reads them (the importances are each tree's already): 8 of a node's 69 bytes.

    One collective for the whole exchange: an ``allgatherv`` per per-node array (eleven) cost 15 ms of a
    0.16 s fit at 4 ranks on 2 cores, where each collective waits for ranks the scheduler has not run yet.
    (The trees are most of the bytes of a forest: 128 full depth trees of 2e5 rows, about 270 MB.)  With
    ``node`` (ranks beyond the node's cores, :func:`_growers`) the buffers meet in node memory instead: an
    ``allgatherv`` of 4 MB at 4 ranks on 2 cores took 25-50 ms, its chunks each waiting for a rank's next poll."""
    keys = [(key, dtype) for key, dtype in _TRAVEL if key != "decrease" or pruned]
    counts, cols, at = [], [], 0
    for n in per_rank:
        counts.append(head[at:at + n])
        cols.append(int(head[at + n]))
        at += n + 1
    width = max(cols) if cols else 0
    travel = {key: (np.uint8 if dtype == np.bool_ else dtype) for key, dtype in keys}

    def layout(nodes, trees):
        sizes = [nodes * np.dtype(travel[key]).itemsize * (width if key == "value" else 1) for key, _ in keys]
        sizes.append(trees * n_features * 8)
        return [int(-(-b // 8) * 8) for b in sizes], sizes

    padded, exact = layout(sum(len(t["feature"]) for t in grown), len(grown))
    buf = np.zeros(sum(padded), dtype=np.uint8)
    pos = 0
    for (key, _), room, nbytes in zip(keys, padded, exact):
        if grown:
            part = np.concatenate([np.asarray(t[key]).reshape(-1) for t in grown]).astype(travel[key], copy=False)
            buf[pos:pos + nbytes] = part.view(np.uint8)
        pos += room
    if grown:
        imps = np.ascontiguousarray(np.stack([t["importances"] for t in grown]), dtype=np.float64)
        buf[pos:pos + exact[-1]] = imps.reshape(-1).view(np.uint8)
    shared = _node_gather(comm, node, buf, [sum(layout(int(np.sum(c)), len(c))[0]) for c in counts]) \
        if node is not None else None
    got = shared[0] if shared is not None else comm.allgatherv(buf.view(np.int64)).view(np.uint8)
    pieces = {key: [] for key, _ in keys}
    pieces["importances"] = []
    start = 0
    for j, c in enumerate(counts):
        rp, re = layout(int(np.sum(c)), len(c))
        pos = start
        for (key, _), room, nbytes in zip(keys, rp, re):
            pieces[key].append(got[pos:pos + nbytes].view(travel[key]))
            pos += room
        pieces["importances"].append(got[pos:pos + re[-1]].view(np.float64).reshape(len(c), n_features))
        start += sum(rp)
    every = np.concatenate(counts).astype(np.int64) if counts else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(every)]).astype(np.int64)
    full = {key: np.concatenate(pieces[key]) for key, _ in keys}
    full["value"] = full["value"].reshape(int(offsets[-1]), -1)
    imps = np.concatenate(pieces.pop("importances"))
    if shared is not None:                     # every rank has copied the trees out: the window freed
        del got, pieces
        shared[1]()
    return [{**{key: a[offsets[i]:offsets[i + 1]] for key, a in full.items()}, "importances": imps[i]}
            for i in range(len(every))]


def _node_gather(comm, node, buf, sizes):
    """``(every rank's ``buf`` in rank order, a view of node memory; a call that frees it (collective, after every
    rank has copied out what it needs))``, or None where MPI gave no window laid out in rank order (the caller
    gathers with ``allgatherv``; the same answer on every rank)."""
    from ..comm.backends.mpi import mpi_module
    from ..utils._node_memory import free, node_arrays, sync

    MPI, raw = mpi_module(), comm._world.comm
    wins, mem = node_arrays(MPI, raw, {"trees": np.asarray(sizes, dtype=np.int64)}, comm.rank)
    if comm.allreduce_obj(mem["trees"] is None, op="max"):
        free(wins, mem)
        return None
    win, every = wins["trees"], mem["trees"]
    win.Lock_all(MPI.MODE_NOCHECK)
    at = int(np.sum(sizes[:comm.rank]))
    every[at:at + buf.size] = buf
    win.Sync()
    node.wait()                                # every rank's trees in place

    def done():
        win.Sync()
        node.wait()                            # every rank's copies made
        win.Unlock_all()
        free(wins, mem)

    win.Sync()
    return every, done
