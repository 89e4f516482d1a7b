"""Split choice of a level from its reduced histograms: the same decisions on every rank.

Three steps, all over every node of a level at once:

1. :func:`node_stats`: per node, from its channel totals, the weight, the
   impurity, the value, purity and the parent's score;
2. the candidates: per (node, candidate feature) the best bin, either by a
   compiled kernel (:func:`mpiml.ensemble._cpu_kernels.split_candidates` on
   the host, ``mpiml_hist_split`` of :mod:`mpiml.kernels.forest.histograms` on the
   GPU: one pass over the histograms, nothing of their size allocated) or by
   :func:`dense_candidates`, whole-array operations (every criterion, and the
   features drawn after constant ones); :func:`choose` keeps the best feature
   of each node (ties to the earliest feature of the node's order, then the
   lowest bin);
3. :func:`decide`: the per-node numbers come to the host in one transfer and
   the leaf rules are applied there.

Every path evaluates the same IEEE expressions in the same order on the same
exact (integer-valued) sums, so the decisions, and the trees, do not depend on
the path or on the number of ranks.
"""

import math

import numpy as np

__all__ = ["node_stats", "dense_candidates", "choose", "decide", "leaf_by_own_numbers", "thresholds", "built_nodes"]


def _xlogx(xp, a):
    return xp.where(a > 0, a * xp.log(xp.where(a > 0, a, 1.0)), 0.0)


def _abs_cost(xp, wt, W, values):
    """Sum of weighted absolute deviations from the weighted median, and that median, of rows given as
    weights ``wt`` (N, K) over the sorted target ``values`` (K,)."""
    v = xp.asarray(values)
    med = v[xp.argmax(xp.cumsum(wt, axis=-1) >= (W / 2.0)[:, None], axis=-1)]
    return (wt * xp.abs(v[None, :] - med[:, None])).sum(-1), med


def _host(xp, a):
    return a.get() if xp is not np else np.asarray(a)


def node_stats(g, tot, ex, root_weight):
    """Per-node numbers from the channel totals ``tot`` (S, C) and extras ``ex`` (S, E) of grower ``g``.

    Returns a dict of ``xp`` arrays: ``W`` (weight), ``parent`` (the score of no
    split), ``impurity``, ``value`` (S, K or 1), ``pure``, ``root_w`` and ``mwl``
    (the smallest weight of a child, None without ``min_weight_fraction_leaf``).
    """
    xp, s, D = g.xp, g.s, g.D
    sw = s.scales[0]
    if g.K and s.criterion == "absolute_error":    # channels: the weights of the target bins
        wt = tot[:, D:] / sw
        W = wt.sum(-1)
        Wd = xp.where(W > 0, W, 1)
        cost, med = _abs_cost(xp, wt, W, s.y_values)
        parent, impurity = -cost, cost / Wd
        value = med[:, None]
        pure = (wt > 0).sum(-1) <= 1
    elif g.K:
        wt = tot[:, D:] / sw
        W = wt.sum(-1)
        Wd = xp.where(W > 0, W, 1)
        p = wt / Wd[:, None]
        if s.criterion == "gini":
            parent = (wt * wt).sum(-1) / Wd
            impurity = 1.0 - (p * p).sum(-1)
        else:
            parent = _xlogx(xp, wt).sum(-1) - _xlogx(xp, W)
            impurity = -(_xlogx(xp, p).sum(-1)) / math.log(2.0)
        value = p
        pure = (wt > 0).sum(-1) <= 1
    elif g.Q > 1:                     # several outputs: the mean of their squared errors (scikit-learn's)
        W = tot[:, D] / sw
        S1 = tot[:, D + 1:D + 1 + g.Q] / s.scales[1]
        Wd = xp.where(W > 0, W, 1)
        parent = (S1 * S1).sum(-1) / Wd / g.Q
        mean = S1 / Wd[:, None]
        impurity = xp.maximum(ex[:, 1] / s.scales[2] / Wd - (mean * mean).sum(-1), 0.0) / g.Q
        value = mean
        pure = impurity <= s.y_tol
    else:
        W = tot[:, D] / sw
        S1 = tot[:, D + 1] / s.scales[1]
        Wd = xp.where(W > 0, W, 1)
        mean = S1 / Wd
        if s.criterion == "poisson":
            # half Poisson deviance: only its part that depends on the split (sum y log(mean)) is compared;
            # the impurity is from the per-node sum of w y log y (the extras' second column)
            parent = _xlogx(xp, S1) - S1 * xp.log(Wd)
            impurity = xp.maximum(ex[:, 1] / s.scales[2] / Wd - _xlogx(xp, mean), 0.0)
        else:
            parent = S1 * S1 / Wd
            impurity = xp.maximum(ex[:, 1] / s.scales[2] / Wd - mean * mean, 0.0)
        value = mean[:, None]
        pure = impurity <= s.y_tol
    rw = W if root_weight is None else xp.asarray(root_weight)
    mwl = s.min_weight_fraction_leaf * rw if s.min_weight_fraction_leaf > 0 else None
    return {"W": W, "parent": parent, "impurity": impurity, "value": value, "pure": pure, "root_w": rw, "mwl": mwl}


def _scored(g, left, right, mwl):
    """Split scores (the proxy: larger is better), left weights and validity of candidate sides."""
    xp, s, D = g.xp, g.s, g.D
    sw = s.scales[0]
    if g.K and s.criterion == "absolute_error":
        wl, wr = left[:, D:] / sw, right[:, D:] / sw
        WL, WR = wl.sum(-1), wr.sum(-1)
        proxy = -(_abs_cost(xp, wl, WL, s.y_values)[0] + _abs_cost(xp, wr, WR, s.y_values)[0])
    elif g.K:
        wl, wr = left[:, D:] / sw, right[:, D:] / sw
        WL, WR = wl.sum(-1), wr.sum(-1)
        if s.criterion == "gini":
            proxy = (wl * wl).sum(-1) / xp.where(WL > 0, WL, 1) + (wr * wr).sum(-1) / xp.where(WR > 0, WR, 1)
        else:
            proxy = _xlogx(xp, wl).sum(-1) + _xlogx(xp, wr).sum(-1) - _xlogx(xp, WL) - _xlogx(xp, WR)
    else:
        WL, WR = left[:, D] / sw, right[:, D] / sw
        q = s.scales[1]
        WLd, WRd = xp.where(WL > 0, WL, 1), xp.where(WR > 0, WR, 1)
        if g.Q > 1:
            SL, SR = left[:, D + 1:D + 1 + g.Q] / q, right[:, D + 1:D + 1 + g.Q] / q
            proxy = ((SL * SL).sum(-1) / WLd + (SR * SR).sum(-1) / WRd) / g.Q
        else:
            SL, SR = left[:, D + 1] / q, right[:, D + 1] / q
            if s.criterion == "poisson":
                proxy = _xlogx(xp, SL) - SL * xp.log(WLd) + _xlogx(xp, SR) - SR * xp.log(WRd)
            else:
                proxy = SL * SL / WLd + SR * SR / WRd
    valid = (WL > 0) & (WR > 0)
    if not g.K and s.criterion == "poisson":
        valid &= (SL > 0) & (SR > 0)          # a child without a positive target sum has an infinite deviance
    if D:
        msl = s.min_samples_leaf
        valid &= (left[:, 0] >= msl) & (right[:, 0] >= msl)
    if mwl is not None:
        valid &= (WL >= mwl) & (WR >= mwl)
    return proxy, WL, valid


def dense_candidates(g, Hm, tot, mwl, first_only=False, nanb=None, fpos=None):
    """The best split of every node by whole-array operations over its histograms ``Hm`` (S, m, B, C).

    Only non-empty bins are split candidates (a split after an empty bin
    repeats the one before it), so the work is proportional to the non-empty
    bins: per-(node, feature) prefix sums are exact int64 sums.  Ties go to the
    lowest (feature position, bin).  With ``first_only`` only the first feature
    that is not constant in the node is a candidate (the features drawn after
    ``max_features`` constant ones).

    ``nanb`` (S, m): the missing-value bin of each candidate feature (-1: none); with it, each split
    is also scored with the missing values on the left, and an eighth array says per node whether
    the chosen split sends them left.

    ``fpos`` (S, m): the positions in ``Hm`` of each node's candidate features, in the node's order (then
    ``Hm`` is (S, F, B, C) and only its non-empty bins of those features are read, not copied in that order).

    Returns per node ``(best_val, best_j, best_b, best_wl, below, above, varying)``.
    """
    xp, D = g.xp, g.D
    n_slots, F, B, C = Hm.shape
    # (S, m, B) bins holding rows: the row count, the weight (regression), or the class weights (all >= 1)
    occupied = Hm.sum(axis=3) > 0 if (g.K and not D) else Hm[..., 0] > 0
    m, rows = F, None
    if fpos is not None:
        m = fpos.shape[1]
        occupied = xp.take_along_axis(occupied, fpos[:, :, None], axis=1)
        rows = (xp.arange(n_slots)[:, None] * F + fpos).reshape(-1)     # (slot, position) -> Hm's (slot, feature)
    nz = xp.flatnonzero(occupied.ravel())                    # non-empty (slot, feature, bin)
    src = nz if rows is None else rows[nz // B] * B + nz % B
    G = Hm.reshape(-1, C)[src].astype(xp.int64)
    seg = nz // B
    first = xp.searchsorted(seg, seg, side="left")
    cs = xp.cumsum(G, axis=0)
    left_i = cs - (cs[first] - G[first])
    slot = seg // m
    left = left_i.astype(xp.float64)
    mwl_e = None if mwl is None else mwl[slot]
    proxy, WL, valid = _scored(g, left, tot[slot] - left, mwl_e)
    mleft = None
    if nanb is not None:
        # missing values to the left as well: the node's missing-value bin joins the left side of every split
        # of its feature below that bin; the better side wins (ties: missing values right)
        nb = nanb.reshape(-1).astype(xp.int64)
        nb = xp.where(nb < B, nb, -1)                        # one-bin totals (the last level): no split
        hrows = xp.arange(n_slots * m) if rows is None else rows
        nan_h = Hm.reshape(n_slots * F, B, C)[hrows, xp.maximum(nb, 0)] * (nb >= 0)[:, None]
        below_nan = (nz % B) < nb[seg]
        left2 = left + nan_h[seg] * below_nan[:, None]
        proxy2, WL2, valid2 = _scored(g, left2, tot[slot] - left2, mwl_e)
        mleft = valid2 & (~valid | (proxy2 > proxy)) & below_nan & (nan_h[seg].sum(-1) > 0)
        proxy, WL, valid = xp.where(mleft, proxy2, proxy), xp.where(mleft, WL2, WL), valid | mleft
    varying = occupied.sum(axis=2) >= 2                      # (S, m): not constant in the node
    if first_only:
        first_varying = xp.argmax(varying, axis=1)
        valid &= (seg % m) == first_varying[slot]
    dense = xp.full(n_slots * m * B, -xp.inf, dtype=xp.float64)
    dense[nz] = xp.where(valid, proxy, -xp.inf)
    dense_wl = xp.zeros(n_slots * m * B, dtype=xp.float64)
    dense_wl[nz] = WL
    flat = dense.reshape(n_slots, m * B)
    best = xp.argmax(flat, axis=1)
    best_val = xp.take_along_axis(flat, best[:, None], axis=1)[:, 0]
    best_wl = xp.take_along_axis(dense_wl.reshape(n_slots, m * B), best[:, None], axis=1)[:, 0]
    best_j, best_b = best // B, best % B
    # the non-empty bins of the chosen feature next to the split, for thresholds between values present
    chosen = xp.take_along_axis(occupied, best_j[:, None, None].astype(xp.int64), axis=1)[:, 0, :]
    idx = xp.arange(B)
    below = xp.where(chosen & (idx <= best_b[:, None]), idx, -1).max(axis=1)
    above = xp.where(chosen & (idx > best_b[:, None]), idx, B).min(axis=1)
    out = (best_val, best_j, best_b, best_wl, below, above, varying.any(axis=1))
    if mleft is not None:
        dense_ml = xp.zeros(n_slots * m * B, dtype=bool)
        dense_ml[nz] = mleft
        out += (xp.take_along_axis(dense_ml.reshape(n_slots, m * B), best[:, None], axis=1)[:, 0],)
    return out


def choose(xp, cand):
    """Per node, the best of the per-feature candidates ``(val, b, wl, below, above, occupied)`` (each (S, m)).

    The first feature with the largest score wins (all -inf: the first), as an
    argmax over ``(feature position, bin)``; returns what :func:`dense_candidates` returns.
    """
    val, b, wl, below, above, occ = cand
    if val.shape[0] == 0:
        z = xp.zeros(0)
        return z, z, z, z, z, z, xp.zeros(0, dtype=bool)
    if xp is np:                 # (host: plain indexing, a fraction of take_along_axis's Python per call)
        j = val.argmax(axis=1)
        rows = np.arange(val.shape[0])

        def pick(a):
            return a[rows, j]

        return pick(val), j, pick(b), pick(wl), pick(below), pick(above), (occ >= 2).any(axis=1)
    j = xp.argmax(val, axis=1)[:, None]

    def pick(a):
        return xp.take_along_axis(a, j, axis=1)[:, 0]

    return pick(val), j[:, 0], pick(b), pick(wl), pick(below), pick(above), (occ >= 2).any(axis=1)


def leaf_by_own_numbers(s, pure, counts, W, root_w, has_mwl):
    """The nodes that are leaves whatever their split candidates (host arrays; ``s`` the grower's spec): pure, too
    few rows to split or to leave ``min_samples_leaf`` on each side, too little weight for two children."""
    small = pure | (counts < s.min_samples_split) | (counts < 2 * s.min_samples_leaf)
    if has_mwl:
        small |= W < 2 * s.min_weight_fraction_leaf * root_w
    return small


_INT_KEYS = ("best_j", "best_b", "below", "above", "feature")
_BOOL_KEYS = ("pure", "varying")


def decide(g, best, st, ex, order, depth):
    """Per-slot decisions (host arrays) from the chosen candidates ``best`` and the node stats ``st``."""
    xp, s = g.xp, g.s
    best_val, best_j, best_b, best_wl, below, above, varying = best
    n_slots = int(ex.shape[0])
    names = ("best_val", "best_j", "best_b", "parent", "counts", "W", "impurity", "pure", "below", "above",
             "varying", "feature", "best_wl", "root_w")
    value = st["value"]
    if xp is np:       # host arrays already: each number as its own copy (the same values as through the packing)
        feature = order[np.arange(n_slots), best_j.astype(np.int64)] if n_slots else best_j
        cols = (best_val, best_j, best_b, st["parent"], ex[:, 0], st["W"], st["impurity"], st["pure"], below, above,
                varying, feature, best_wl, st["root_w"])
        host = {name: np.asarray(c).astype(np.int64 if name in _INT_KEYS else bool if name in _BOOL_KEYS
                                           else np.float64) for name, c in zip(names, cols)}
        host["value"] = np.array(value, dtype=np.float64, order="C")
    else:
        feature = xp.take_along_axis(order, best_j[:, None].astype(xp.int64), axis=1)[:, 0] if n_slots else best_j
        cols = (best_val, best_j, best_b, st["parent"], ex[:, 0], st["W"], st["impurity"], st["pure"], below, above,
                varying, feature, best_wl, st["root_w"])
        n_values = int(value.shape[1])
        # one transfer of the per-slot numbers
        if n_slots:
            packed = _host(xp, xp.concatenate([xp.stack([c.astype(xp.float64) for c in cols]), value.T]))
        else:
            packed = np.zeros((len(cols) + n_values, 0))
        host = dict(zip(names, packed))
        for key in _INT_KEYS:
            host[key] = host[key].astype(np.int64)
        for key in _BOOL_KEYS:
            host[key] = host[key].astype(bool)
        host["value"] = np.ascontiguousarray(packed[len(cols):].T)      # the node values, in the same transfer
    host["best_wr"] = host["W"] - host["best_wl"]
    # a node is a leaf by its own numbers (before looking at split candidates) ...
    small = leaf_by_own_numbers(s, host["pure"], host["counts"], host["W"], host["root_w"], st["mwl"] is not None)
    at_depth = s.max_depth is not None and depth >= s.max_depth
    # ... or when no split is valid (or good enough)
    decrease = np.where(np.isfinite(host["best_val"]), host["best_val"] - host["parent"], 0.0)
    weak = ~np.isfinite(host["best_val"])
    if s.min_impurity_decrease > 0:
        # scikit-learn's weighted impurity decrease: (N_t / N) * (impurity - ...) with N the root's weight
        scale = math.log(2.0) if (g.K and s.criterion in ("entropy", "log_loss")) else 1.0
        rootw = np.where(host["root_w"] > 0, host["root_w"], 1.0)
        weak |= decrease / scale / rootw + 1e-7 < s.min_impurity_decrease
    leaf = weak | small | at_depth
    # nodes that would split but whose drawn features are all constant: draw further features
    host["retry"] = leaf & ~host["varying"] & ~small & (not at_depth)
    host["leaf"] = leaf
    host["decrease"] = np.where(leaf, 0.0, np.maximum(decrease, 0.0))
    return host


def _bin_tables(g):
    """Padded ``(F, B)`` tables of bin values (NaN where bins are not single values) and edges of grower ``g``."""
    if getattr(g, "_tables", None) is None:
        F, B = g.F, g.B
        vals = np.full((F, B), np.nan)
        edges = np.full((F, max(B - 1, 1)), np.nan)
        for f in range(F):
            e = g.s.edges[f]
            edges[f, :len(e)] = e
            if g.s.values[f] is not None:
                vals[f, :len(g.s.values[f])] = g.s.values[f]
        g._tables = (vals, edges, np.array([v is not None for v in g.s.values], dtype=bool))
    return g._tables


def thresholds(g, f, b, below, above):
    """Thresholds of splits after bin ``b`` of features ``f`` (host arrays) of grower ``g``.

    Where bins are single values: half way between the last value present
    in the node at or below ``b`` (bin ``below``) and the first one above
    it (bin ``above``), as an exact tree; otherwise the bin edge.
    """
    vals, edges, exact = _bin_tables(g)
    thr = edges[f, np.minimum(b, edges.shape[1] - 1)]
    ex = exact[f] & (below >= 0) & (above < g.B)
    ex[ex] &= ~np.isnan(vals[f[ex], above[ex]])            # the bin above is the missing values': the edge
    if ex.any():
        vlo, vhi = vals[f[ex], below[ex]], vals[f[ex], above[ex]]
        mid = (vlo + vhi) / 2.0
        thr[ex] = np.where(mid >= vhi, vlo, mid)           # adjacent floats: the midpoint rounds up
    return thr



def built_nodes(c0, c1, parent):
    """The nodes of the chunk ``[c0, c1)`` of a level whose histograms are built: with the parents' (``parent``)
    kept, one child of each sibling pair (the one with less weight; the other is the parent minus it, and
    ``built // 2`` the pair), else every node."""
    if parent is None:
        return np.arange(c0, c1)
    pairs = np.arange(c0 // 2, c1 // 2)
    return 2 * pairs + np.where(parent[2][pairs], 0, 1)
