"""Level-wise growth over several host ranks: the nodes with fewer rows than bins, searched by owners.

A reduced histogram costs ``features x bins x channels`` numbers per node whatever its rows;
for a node with fewer rows (over all ranks) than bins, sending its rows is cheaper.  Each such
node is searched by one rank, its owner (contiguous shares of the nodes balanced by rows, the
same on every rank), which alone receives that node's rows (one ``gatherv`` per owner) and runs
the fused kernel of :mod:`._cpu_kernels` on them; the per-node results (totals, extras and the
per-feature candidates) are then gathered by every rank, which all take the same decisions.
Sums are exact and the rows keep the order of one process, so the trees are those of one
process.
"""

import time

import numpy as np

from . import _cpu_kernels
from ._split import choose, decide, node_stats

__all__ = ["decisions"]


def decisions(g, el, order, slots, depth, root_w, counts):
    """Decisions of the level's nodes ``slots`` of grower ``g`` (``counts``: their rows over all ranks;
    ``order``: their feature orders; ``el``: this rank's elements of the level)."""
    s, comm, m, K = g.s, g.s.comm, g.m, g.K
    t0 = time.perf_counter()
    counts = np.asarray(counts, dtype=np.int64)
    ends = np.cumsum(counts)
    owner = np.minimum((2 * ends - counts) * comm.size // max(2 * int(ends[-1]), 1), comm.size - 1)
    lens = el.lens()[slots]
    first = el.starts[slots]
    # this rank's rows of those nodes, by node, as float64 (exact: bins, classes, fixed-point weights)
    idx = np.repeat(first - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(int(lens.sum()))
    node = np.repeat(np.arange(len(slots), dtype=np.int64), lens)
    rows = el.row[idx]
    label = s.y[rows] if K else el.wy[idx]
    fields = [node, el.w[idx], label] + ([] if K else [el.wy2[idx]])
    nf = len(fields)
    packed = np.empty((len(idx), nf + m))
    for j, c in enumerate(fields):
        packed[:, j] = c
    packed[:, nf:] = g.cols[order[:, :m][node], rows[:, None]]
    cut = np.searchsorted(owner[node], np.arange(comm.size + 1))   # owners are contiguous and increasing
    mine = np.nonzero(owner == comm.rank)[0]
    got = None
    for o in range(comm.size):
        part = comm.gatherv(np.ascontiguousarray(packed[cut[o]:cut[o + 1]]), root=o)
        if o == comm.rank:
            got = part
    # the rows of this rank's nodes, in rank order then by node (stable): the order of one process
    got = got[np.argsort(got[:, 0], kind="stable")]
    n_rows = counts[mine]
    starts = np.concatenate([[0], np.cumsum(n_rows)]).astype(np.int64)
    cols = np.ascontiguousarray(got[:, nf:].T.astype(g.cols.dtype))
    row = np.arange(got.shape[0], dtype=np.int32)
    w = np.ascontiguousarray(got[:, 1])
    y = got[:, 2].astype(s.y.dtype) if K else None
    wy = None if K else np.ascontiguousarray(got[:, 2])
    wy2 = None if K else np.ascontiguousarray(got[:, 3])
    tot, ex = _cpu_kernels.segment_totals(row, w, wy, wy2, y, starts, K, bool(g.D))
    st = node_stats(g, tot, ex, None if root_w is None else root_w[mine])
    fsel = np.broadcast_to(np.arange(m, dtype=np.int64), (len(mine), m))
    cand = _cpu_kernels.node_candidates(cols, row, w, wy, y, starts[:-1], n_rows, fsel, g.B, tot, st["mwl"],
                                        s.scales[0], s.scales[1], K, bool(g.D), s.min_samples_leaf)
    C, E = tot.shape[1], ex.shape[1]
    every = comm.allgatherv(np.concatenate([tot, ex] + [np.asarray(c, dtype=np.float64) for c in cand], axis=1))
    tot, ex = every[:, :C], every[:, C:C + E]
    cand = tuple(every[:, C + E + i * m:C + E + (i + 1) * m] for i in range(6))
    cand = tuple(c if i in (0, 2) else c.astype(np.int64) for i, c in enumerate(cand))   # (val, b, wl, ...)
    st = node_stats(g, tot, ex, root_w)
    g.stats["hist_s"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    dec = decide(g, choose(np, cand), st, ex, order[:, :m], depth)
    if m < g.F and dec["retry"].any():
        g._draw_further(el, None, ex, slots, order, dec, depth, root_w)
    g.stats["split_s"] += time.perf_counter() - t0
    return dec
