"""The Numba kernels of a level's numbers and decisions on a host rank that grows alone (imported on first use).

A level of the fused host path (:meth:`._grower.TreeGrower._fused_level`) made about a hundred NumPy calls
around its compiled search: the nodes' numbers from their channel totals (:func:`._split.node_stats`), the
nodes that are leaves by them (:func:`._split.leaf_by_own_numbers`), the best feature of each node
(:func:`._split.choose`) and the decisions (:func:`._split.decide`).  With several threads of a rank each growing
its own trees (two a thread at 8 ranks of 8 threads and 128 trees), that Python holds the one GIL of the rank
between the threads' kernels: 1.6-1.9 ms a level a thread.  Here each is one call per level that releases the GIL.

Only the criteria of the compiled search run here (gini with fewer than 8 classes, squared error with one
output), with the IEEE operations of the NumPy code in the same order (sums over classes left to right, as
NumPy's for fewer than 8; ``np.maximum(x, 0.0)`` keeps ``x`` when ``x >= 0`` or NaN), so the decisions, and the
trees, are the same; ``MPIML_RF_DECIDE_KERNEL=0`` keeps the NumPy code (for comparisons).
"""

import numpy as np

from ..utils._jit import numba

_nb = numba()

_jit = _nb.njit(cache=True, nogil=True)


@_jit
def _max0(x):
    """``np.maximum(x, 0.0)``."""
    return x if (x >= 0.0 or np.isnan(x)) else 0.0


@_jit
def node_numbers(tot, ex, root_w, has_root, K, D, sw, sy, s2, y_tol, mwf, two_mwf, min_split, two_msl,
                 W, parent, impurity, value, pure, rw, mwl, skip):
    """Per node, from its channel totals ``tot`` (S, C) and extras ``ex`` (S, E): the weight, the score of no
    split, the impurity, the value, purity, the root's weight, the smallest weight of a child (``mwf`` > 0) and
    whether it is a leaf by these numbers alone (:func:`._split.node_stats` then
    :func:`._split.leaf_by_own_numbers`)."""
    S, C = tot.shape
    for i in range(S):
        if K:
            w = 0.0
            sq = 0.0
            nz = 0
            for c in range(D, C):
                x = tot[i, c] / sw
                w += x
                sq += x * x
                if x > 0:
                    nz += 1
            wd = w if w > 0 else 1.0
            pp = 0.0
            for c in range(D, C):
                p = (tot[i, c] / sw) / wd
                value[i, c - D] = p
                pp += p * p
            parent[i] = sq / wd
            impurity[i] = 1.0 - pp
            pure[i] = nz <= 1
        else:
            w = tot[i, D] / sw
            s1 = tot[i, D + 1] / sy
            wd = w if w > 0 else 1.0
            mean = s1 / wd
            parent[i] = s1 * s1 / wd
            impurity[i] = _max0(ex[i, 1] / s2 / wd - mean * mean)
            value[i, 0] = mean
            pure[i] = impurity[i] <= y_tol
        W[i] = w
        r = root_w[i] if has_root else w
        rw[i] = r
        if mwf > 0:
            mwl[i] = mwf * r
        n = ex[i, 0]
        small = pure[i] or n < min_split or n < two_msl
        if mwf > 0:
            small = small or w < two_mwf * r
        skip[i] = small


@_jit
def decisions(val, b, wl, below, above, occ, order, skip, parent, W, rw, at_depth, mid,
              o_val, o_j, o_b, o_wl, o_wr, o_below, o_above, o_varying, o_feature, o_leaf, o_retry, o_decrease):
    """Per node, the first feature of the largest score among its candidates (:func:`._split.choose`) and the
    decisions of :func:`._split.decide` (``skip``: a leaf by its own numbers; ``mid``: min_impurity_decrease)."""
    S, m = val.shape
    for i in range(S):
        j = 0
        best = val[i, 0]
        varying = occ[i, 0] >= 2
        for k in range(1, m):
            if val[i, k] > best:
                best = val[i, k]
                j = k
            if occ[i, k] >= 2:
                varying = True
        o_val[i] = best
        o_j[i] = j
        o_b[i] = b[i, j]
        o_wl[i] = wl[i, j]
        o_wr[i] = W[i] - wl[i, j]
        o_below[i] = below[i, j]
        o_above[i] = above[i, j]
        o_varying[i] = varying
        o_feature[i] = order[i, j]
        finite = np.isfinite(best)
        decrease = best - parent[i] if finite else 0.0
        weak = not finite
        if mid > 0:
            r = rw[i] if rw[i] > 0 else 1.0
            weak = weak or decrease / r + 1e-7 < mid       # (gini, squared error: no scale)
        leaf = weak or skip[i] or at_depth
        o_leaf[i] = leaf
        o_retry[i] = leaf and not varying and not skip[i] and not at_depth
        o_decrease[i] = 0.0 if leaf else _max0(decrease)


@_jit
def record(leaf, feature, best_b, below, above, decrease, missing_left, has_missing, k, first_child, vals, edges,
           exact, B, o_feature, o_threshold, o_left, o_right, o_decrease, o_missing, n_split):
    """A level's node records (:meth:`._grower.TreeGrower._record` with :func:`._split.thresholds`): per node its
    feature (-2 for a leaf), threshold (-2.0), children (numbered after the tree's current level, ``first_child``
    per tree, in the order of its split nodes), decrease and missing-value side; ``n_split`` per tree (``k`` nodes
    of the level each)."""
    E = edges.shape[1]
    i = 0
    for t in range(k.shape[0]):
        done = 0
        for _ in range(k[t]):
            if leaf[i]:
                o_feature[i] = -2
                o_threshold[i] = -2.0
                o_left[i] = -1
                o_right[i] = -1
                o_decrease[i] = 0.0
                o_missing[i] = False
            else:
                f = feature[i]
                b = best_b[i]
                thr = edges[f, min(b, E - 1)]
                lo, hi = below[i], above[i]
                if exact[f] and lo >= 0 and hi < B and not np.isnan(vals[f, hi]):
                    vlo, vhi = vals[f, lo], vals[f, hi]
                    mid = (vlo + vhi) / 2.0
                    thr = vlo if mid >= vhi else mid       # adjacent floats: the midpoint rounds up
                o_feature[i] = f
                o_threshold[i] = thr
                o_left[i] = first_child[t] + 2 * done
                o_right[i] = first_child[t] + 2 * done + 1
                o_decrease[i] = decrease[i]
                o_missing[i] = has_missing and missing_left[i]
                done += 1
            i += 1
        n_split[t] = done
