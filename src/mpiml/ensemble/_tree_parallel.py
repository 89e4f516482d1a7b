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
    R, r = comm.size, comm.rank
    mine = list(trees[len(trees) * r // R:len(trees) * (r + 1) // R])
    t1 = time.perf_counter()
    grown = alone.grow(mine) if mine else []
    t2 = time.perf_counter()
    for key, value in alone.stats.items():
        grower.stats[key] = grower.stats.get(key, 0) + value
    # the node counts first: their gather waits for the slowest rank, the rest of the exchange is its own cost
    counts = comm.allgatherv(np.array([len(t["feature"]) for t in grown], dtype=np.int64))
    t3 = time.perf_counter()
    out = _exchange(comm, grown, counts, grower.F, getattr(s, "pruned", True))
    # where a rank's time goes (the benchmark reads them): gathering the rows, growing its trees, waiting for the
    # other ranks' trees, the exchange
    grower.stats.update(tree_parallel=1, gather_rows_s=t1 - t0, grow_own_s=t2 - t1, exchange_wait_s=t3 - t2,
                        exchange_s=time.perf_counter() - t3, own_trees=len(mine))
    return out


#: The per-node arrays of a grown tree that travel (``value`` has a column per class or output), and the
#: dtype each travels as (the collectives take no bytes: the 0/1 flags go as bools).
_TRAVEL = (("feature", np.int32), ("threshold", np.float64), ("left", np.int32), ("right", np.int32),
           ("value", np.float64), ("n_node_samples", np.int64), ("weighted_n_node_samples", np.float64),
           ("impurity", np.float64), ("decrease", np.float64), ("missing_left", np.bool_))


def _exchange(comm, grown, counts, n_features, pruned=True):
    """Every tree, in order, from every rank's consecutive block ``grown``: one ``allgatherv`` per per-node array
    of this rank's trees concatenated, whose result is the forest's array (the trees as views of it, which
    :func:`._flat.pack_trees` then takes without a copy) and one of the importances; ``counts``: every tree's
    nodes, in order.  The splits' impurity decreases travel only for the pruning (``pruned``) that reads them
    (the importances are each tree's already): 8 of a node's 69 bytes.

    The trees are most of the bytes of a forest (128 full depth trees of 2e5 rows: about 270 MB); one buffer of
    every rank's trees cut into per-tree views and concatenated again by ``pack_trees`` wrote every byte twice
    more on every rank (0.12-0.2 s of a 1.4 s fit at 8 ranks of 8 threads on the 64-core host)."""
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    full = {}
    for key, dtype in _TRAVEL:           # (the values flat: a rank without trees knows no column count)
        if key == "decrease" and not pruned:
            continue
        parts = [np.asarray(t[key]).reshape(-1) for t in grown]
        mine = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros(0),
                                    dtype=np.uint8 if dtype == np.bool_ else dtype)
        got = comm.allgatherv(mine.view(np.bool_) if dtype == np.bool_ else mine)
        full[key] = got.view(np.uint8) if dtype == np.bool_ else got
    full["value"] = full["value"].reshape(int(offsets[-1]), -1)
    imps = comm.allgatherv(np.ascontiguousarray(
        np.stack([t["importances"] for t in grown]) if grown else np.zeros((0, n_features)), dtype=np.float64))
    return [{**{key: a[offsets[i]:offsets[i + 1]] for key, a in full.items()}, "importances": imps[i]}
            for i in range(len(counts))]
