"""A level of global training over several ranks in which each rank searches a share of the histograms.

With one allreduce per level every rank receives every reduced histogram and
searches every node: the bytes received and the search do not shrink with the
rows per rank.  Here the level's histograms are *reduce-scattered* instead:

1. each rank builds its histograms of the level as before, laid out so that the
   rows of the reduce-scatter are independent search units -- ``(node, drawn
   feature)`` pairs when every node draws its own features (no subtraction), or
   whole features over all nodes when the histograms cover every feature (so
   that the parent's share, kept by the same rank, subtracts from the built
   child's: sibling subtraction stays local);
2. one ``reduce_scatter`` gives rank ``r`` the reduced histograms of its block
   of rows (``numpy.array_split`` blocks of a row count padded to a multiple of
   the ranks: equal blocks), and one small ``allreduce`` gives every rank every
   node's channel totals and extras (``nodes x (C + E)`` numbers);
3. each rank runs the compiled split search (the kernel of the one-allreduce
   path, one thread per pair) on its rows only, and one ``allgather`` of six
   numbers per pair (score, bin, left weight, the neighbouring non-empty bins,
   the non-empty bin count) gives every rank every pair's best split;
4. every rank then keeps the best feature of each node and applies the leaf
   rules as before (:func:`._split.choose`, :func:`._split.decide`).

A reduce-scatter moves half the bytes of an allreduce, the search is divided
among the ranks, and no rank holds every reduced histogram.  The per-pair
search is the same kernel on the same exact integer sums, so the decisions --
and the trees -- are those of the one-allreduce path, at every rank count.

Used by :class:`._grower.TreeGrower` when ``MPIML_RF_SCATTER=1`` on several ranks
(GPU or host ranks growing level by level) with the compiled split search (gini
with fewer than 8 classes, squared error, no missing values); the default is one
allreduce per level (see :func:`applies` for the measurement behind that).
"""

import os
import time

import numpy as np

from ._split import built_nodes, choose, decide, node_stats

__all__ = ["applies", "split_level"]

#: The numbers gathered per (node, feature) pair: score, bin, left weight, below, above, non-empty bins.
_FIELDS = 6


def applies(g):
    """Whether grower ``g`` grows its levels with :func:`split_level`: only when asked for
    (``MPIML_RF_SCATTER=1``), on several ranks, with the compiled search (agreed inputs only).

    Not the default: measured on 4 x H100 (2026-11-27), the communicator's reduce-scatter of these
    sizes took 26 ms a level where its allreduce of twice the bytes took 1.9 ms, and the split phase
    did not shrink when each rank searched a quarter of the pairs (see docs/ensemble.md)."""
    comm = g.s.comm
    if comm is None or comm.size == 1 or g._candidate_search(g.C) is None:
        return False
    return os.environ.get("MPIML_RF_SCATTER", "0") == "1"


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _collect(g, sends, small):
    """This rank's blocks of the reduced ``sends`` (a reduce-scatter each) and the reduced ``small`` (an
    allreduce)."""
    xp, comm, st = g.xp, g.s.comm, g.stats
    _sync(xp)
    g._skew_wait()
    t0 = time.perf_counter()
    mine = [comm.reduce_scatter(send) for send in sends]
    _sync(xp)
    t1 = time.perf_counter()
    small = comm.allreduce(small)
    _sync(xp)
    t2 = time.perf_counter()
    st["reduce_scatter_s"] += t1 - t0
    st["allreduce_s"] += t2 - t1
    for send in sends:
        st["reduce_scatter_bytes"] += int(send.nbytes)
        st["reduce_scatter_calls"] += 1
        st["reduce_scatter_int32_calls"] = st.get("reduce_scatter_int32_calls", 0) + int(send.dtype == np.int32)
    st["allreduce_bytes"] += int(small.nbytes)
    st["allreduce_calls"] += 1
    return mine, small


def _gather(g, packed):
    """Every rank's ``packed`` rows, in rank order (one allgather)."""
    xp, comm = g.xp, g.s.comm
    _sync(xp)
    t0 = time.perf_counter()
    out = comm.allgather(packed)
    _sync(xp)
    g.stats["allgather_s"] += time.perf_counter() - t0
    g.stats["allgather_bytes"] += int(out.nbytes)
    g.stats["allgather_calls"] += 1
    return out


def _int32_sums(g, el, depth):
    """Whether the level's weight channels travel as int32: integer weights (fixed-point scale 1: the
    bootstrap's draw counts, or integer sample weights) whose largest tree weight over every rank -- a bound
    of every bin's sum and of every row count -- stays below 2**31.  Classification's channels are all
    weights (half the bytes of float64); regression's ``w * y`` stays float64 (12 bytes a bin instead of
    16).  Exact either way.  Decided at a batch's root level (one allreduce of the trees' weights) and
    kept for its levels below; the same answer on every rank."""
    if g.s.scales[0] != 1.0 or g.Q != 1 or os.environ.get("MPIML_RF_INT32_SUMS", "1") == "0":
        return False
    if depth > 0 and getattr(g, "_int32_ok", None) is not None:
        return g._int32_ok
    xp, T = g.xp, len(el.starts) - 1          # the root level: one slot per tree
    local = xp.bincount(el.seg, weights=el.w, minlength=T) if el.w.shape[0] else xp.zeros(T)
    local = np.asarray(local.get() if xp is not np else local, dtype=np.float64)
    g._int32_ok = bool(g.s.comm.allreduce(local).max() < 2.0 ** 31)     # the largest tree's weight
    return g._int32_ok


def _padded(xp, a, rows):
    """``a`` (2-d) with zero rows appended up to ``rows`` rows (``a`` itself when it has them)."""
    if a.shape[0] == rows:
        return a
    out = xp.zeros((rows,) + a.shape[1:], dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


def split_level(g, el, perm, depth, root_w, parent, keep):
    """Decisions of one level of grower ``g`` (as :meth:`._grower.TreeGrower._split_level`).

    ``parent`` (sibling subtraction, histograms of every feature): this rank's
    share of the split nodes' reduced histograms above ``(features, nodes, B, C)``,
    their extras, which child to build, and their totals; None builds every node.
    Returns the decisions and the same for the next level (None: build every node).
    """
    xp, s, comm = g.xp, g.s, g.s.comm
    R, r = comm.size, comm.rank
    S = len(el.starts) - 1
    m, F, B, C, E = g.m, g.F, g.B, g.C, g.E
    full = g.full
    FH = F if full else m
    fr = -(-F // R)                                      # features per rank (full histograms)
    per_chunk = max(2, s.hist_bytes // (FH * B * C * 8)) // 2 * 2     # whole sibling pairs
    ident = xp.arange(F, dtype=xp.int32)
    search = g._candidate_search(C)
    narrow = _int32_sums(g, el, depth)
    decisions, kept_h, kept_e, kept_t, kept_bytes = [], [], [], [], 0
    for c0 in range(0, S, per_chunk):
        c1 = min(S, c0 + per_chunk)
        n = c1 - c0
        built = built_nodes(c0, c1, parent)
        nb = len(built)
        fsel = xp.broadcast_to(ident, (nb, F)) if full else perm[xp.asarray(built), :m]
        _sync(xp)
        t0 = time.perf_counter()
        dtype = (np.int32 if g.K else np.int64) if narrow else np.float64
        hb, eb = g._build(el, built, fsel, feature_major=full, dtype=dtype)
        # (nb, C): a row is in one bin of every feature
        tb = (hb[0] if full else hb[:, 0]).sum(axis=1, dtype=xp.float64)
        rows = fr * R if full else -(-(nb * m) // R) * R
        parts = [hb]
        if narrow and not g.K:           # regression: [rows,] w as int32, w * y as float64
            nw = C - 1
            parts = [xp.ascontiguousarray(hb[..., :nw], dtype=xp.int32),
                     xp.ascontiguousarray(hb[..., nw:], dtype=xp.float64)]
        sends = [_padded(xp, a.reshape(F if full else nb * m, -1), rows) for a in parts]
        _sync(xp)
        g.stats["hist_s"] += time.perf_counter() - t0
        g.stats["hist_nodes_built"] += nb
        got, small = _collect(g, sends, xp.concatenate([tb.ravel(), eb.ravel()]))
        tb, eb = small[:nb * C].reshape(nb, C), small[nb * C:].reshape(nb, E)
        t0 = time.perf_counter()
        if len(got) == 1:
            mine = got[0].astype(xp.float64, copy=False)
        else:
            mine = xp.empty((got[0].shape[0], got[0].shape[1] // (C - 1), C), dtype=xp.float64)
            mine[..., :C - 1] = got[0].reshape(mine.shape[0], -1, C - 1)
            mine[..., C - 1:] = got[1].reshape(mine.shape[0], -1, 1)
            mine = mine.reshape(mine.shape[0], -1)
        if full:
            hr = mine.reshape(fr, nb, B, C)
            if parent is not None:             # the other child of each pair: parent - built child
                g.stats["hist_nodes_derived"] += nb
                lb, lo, px = xp.asarray(built - c0), xp.asarray((built ^ 1) - c0), xp.asarray(built // 2)
                H = xp.empty((fr, n, B, C), dtype=xp.float64)
                H[:, lb] = hr
                H[:, lo] = parent[0][:, px] - hr
                tot = xp.empty((n, C), dtype=xp.float64)
                ex = xp.empty((n, E), dtype=xp.float64)
                tot[lb], tot[lo] = tb, parent[3][px] - tb
                ex[lb], ex[lo] = eb, parent[1][px] - eb
            else:
                H, tot, ex = hr, tb, eb
            Hp = H.reshape(fr * n, 1, B, C)                  # pair q = (feature r * fr + q // n, node q % n)
            node = xp.tile(xp.arange(n, dtype=xp.int64), fr)
        else:
            H, tot, ex = None, tb, eb
            Pr = mine.shape[0]
            Hp = mine.reshape(Pr, 1, B, C)                   # pair p = (node p // m, drawn feature p % m)
            node = xp.minimum((r * Pr + xp.arange(Pr, dtype=xp.int64)) // m, n - 1)    # padding: any node
        order = perm[c0:c1]
        rw = None if root_w is None else root_w[c0:c1]
        st = node_stats(g, tot, ex, rw)
        mwl = None if st["mwl"] is None else st["mwl"][node]
        cand = search(Hp, xp.zeros((Hp.shape[0], 1), dtype=xp.int64), xp.ascontiguousarray(tot[node]), mwl,
                      s.scales[0], s.scales[1], g.K, bool(g.D), s.min_samples_leaf)
        packed = xp.stack([c.reshape(-1).astype(xp.float64) for c in cand], axis=1)
        g.stats["split_s"] += time.perf_counter() - t0
        every = _gather(g, packed)
        t0 = time.perf_counter()
        if full:   # (features, nodes) -> each node's drawn features, in its order
            every = every[:F * n].reshape(F, n, _FIELDS).transpose(1, 0, 2)
            every = xp.take_along_axis(every, order[:, :m].astype(xp.int64)[:, :, None], axis=1)
        else:
            every = every[:n * m].reshape(n, m, _FIELDS)
        cand = tuple(every[:, :, i] if i in (0, 2) else every[:, :, i].astype(xp.int64) for i in range(_FIELDS))
        dec = decide(g, choose(xp, cand), st, ex, order[:, :m], depth)
        dec["missing_left"] = np.zeros(len(dec["leaf"]), dtype=bool)
        if m < F and dec["retry"].any():
            g._draw_further(el, None, ex, np.arange(c0, c1), order, dec, depth, rw)
        decisions.append(dec)
        if keep and full:
            sp = np.nonzero(~dec["leaf"])[0]
            kept_bytes += len(sp) * fr * B * C * 8           # this rank's share (the same count on every rank)
            if kept_bytes <= s.sub_bytes:
                spx = xp.asarray(sp)
                kept_h.append(H[:, spx])
                kept_e.append(ex[spx])
                kept_t.append(tot[spx])
        g.stats["split_s"] += time.perf_counter() - t0
    dec = {key: np.concatenate([d[key] for d in decisions]) for key in decisions[0]}
    nxt = None
    if keep and full and kept_bytes <= s.sub_bytes and kept_h:
        sp = ~dec["leaf"]
        nxt = (xp.concatenate(kept_h, axis=1), xp.concatenate(kept_e), dec["best_wl"][sp] <= dec["best_wr"][sp],
               xp.concatenate(kept_t))
    return dec, nxt
