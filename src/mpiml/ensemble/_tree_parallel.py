"""Several host ranks grow whole trees each, on every rank's rows: the forest's CPU growth across ranks.

Level-wise growth over R ranks (:class:`._grower.TreeGrower`) sums every level's
histograms with collectives and searches every node of a level on every rank (or,
for nodes with fewer rows than bins, on one owner rank): on CPUs that per-level work
and the collectives do not shrink with the rows of a rank, and two ranks on one node
were slower than one on deep trees.  The binned rows are small (a byte a feature a
row), so when every rank can hold all of them, each rank gathers them (one
``allgatherv`` each of bins, targets and weights) and grows its share of
the trees alone, round robin, with the one-rank fused kernels (no histogram is written
out, no collective per level); one allgather exchanges the trees.

The rows come in global order with their weights, so each tree is the one a single
process grows (the same bootstrap draws, feature orders and splits): the same forest as
level-wise growth, at any rank count.
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
    """The per-tree dicts of ``trees`` (as :meth:`._grower.TreeGrower.grow`), each grown by one rank."""
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
    mine = list(trees[comm.rank::comm.size])
    t1 = time.perf_counter()
    grown = alone.grow(mine) if mine else []
    t2 = time.perf_counter()
    for key, value in alone.stats.items():
        grower.stats[key] = grower.stats.get(key, 0) + value
    by_id = {}
    for ids, those in zip(*_exchange(comm, mine, grown)):
        by_id.update(zip(ids, those))
    # where a rank's time goes (the benchmark reads them): gathering the rows, growing its trees, the exchange
    grower.stats.update(tree_parallel=1, gather_rows_s=t1 - t0, grow_own_s=t2 - t1,
                        exchange_s=time.perf_counter() - t2, own_trees=len(mine))
    return [by_id[t] for t in trees]


def _exchange(comm, mine, grown):
    """Every rank's ``(tree ids, tree dicts)`` lists, in rank order: the arrays of this rank's trees packed into
    one buffer, one ``allgatherv`` of the buffers and one ``allgather_obj`` of where each array lies; every
    rank's trees are then views of the gathered buffer.  The trees are most of the bytes of a forest (128 full
    depth trees of 2e5 rows: about 270 MB), and ``allgather_obj`` of them pickled, gathered, cut and unpickled
    every rank's share: four copies on every rank, of bytes that do not shrink with the ranks."""
    layout, at = [], 0
    for tree in grown:
        entry = {}
        for key, a in tree.items():
            a = np.asarray(a)
            entry[key] = (a.dtype.str, a.shape, at)
            at += -(-a.nbytes // 8) * 8
        layout.append(entry)
    buf = np.zeros(at // 8, dtype=np.int64)
    raw = buf.view(np.uint8)
    for tree, entry in zip(grown, layout):
        for key, (_, _, off) in entry.items():
            a = np.ascontiguousarray(tree[key])
            raw[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
    every = comm.allgatherv(buf).view(np.uint8)
    ids, trees, start = [], [], 0
    for theirs, entries, words in comm.allgather_obj((mine, layout, buf.size)):
        chunk = every[start * 8:(start + words) * 8]
        start += words
        ids.append(theirs)
        trees.append([{key: chunk[off:off + int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize]
                       .view(dt).reshape(shape) for key, (dt, shape, off) in entry.items()} for entry in entries])
    return ids, trees
