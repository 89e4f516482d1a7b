"""Level-wise growth of a batch of trees from binned rows, one histogram allreduce per level.

Every tree of a batch advances one level at a time.  For the nodes of the
level (all trees of the batch together), each rank sums its rows into a
histogram ``(node, feature, bin, channel)``, the histograms are summed over
ranks with one allreduce (several when they exceed a byte budget), and every
rank evaluates the same splits on the same numbers, then routes its own rows
to the children.  The trees are therefore replicated without any broadcast.

Channels are integer-valued float64 (fixed point, see :mod:`._hist`):

* classification: ``[weight of class 0, ..., weight of class K-1]``;
* regression: ``[weight, weight * y]``;
* a leading ``rows`` channel only when ``min_samples_leaf > 1`` (it counts
  rows with non-zero weight on each side of a split);
* per node: the rows, and for regression ``sum(weight * y**2)`` (the purity test).

Sums of integers below 2**53 are exact in any order, so the reduced histogram
(and so every split) is bit-identical on every rank and for every rank count.
Split evaluation and the tree bookkeeping read only per-node results on the
host; rows stay on their device.
"""

import math
import os
import time

import numpy as np

from ._hist import STREAM_FEATURES, hash_uniform, poisson_weights

__all__ = ["GrowSpec", "TreeGrower"]

#: Largest histogram (bytes) summed by one allreduce; larger levels are cut in node chunks.
HIST_BYTES = int(os.environ.get("MPIML_RF_HIST_BYTES", 64 << 20))
#: Largest ``rows x features`` handled by one ``bincount`` (bounds the temporary keys).
KEY_ELEMENTS = 1 << 24
#: Largest ``trees x local rows`` grown together (bounds the per-tree row state).
BATCH_ELEMENTS = int(os.environ.get("MPIML_RF_BATCH_ELEMENTS", 1 << 26))


def power_of_two_below(x):
    """The largest power of two not above ``x`` (a scale that divides exactly)."""
    return 2.0 ** math.floor(math.log2(x))


class GrowSpec:
    """What a :class:`TreeGrower` needs; plain attributes (see :meth:`TreeGrower.__init__`)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _xlogx(xp, a):
    return xp.where(a > 0, a * xp.log(xp.where(a > 0, a, 1.0)), 0.0)


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


class TreeGrower:
    """Grows trees level by level on this rank's binned rows.

    Parameters
    ----------
    spec : GrowSpec
        ``Xb`` (n, F) bins, ``n_bins`` (F,) host ints, ``edges``/``values``
        (host lists from :func:`._hist.bin_edges`), ``y`` (classification:
        int class codes; regression: float64 targets), ``weight`` (n,)
        float64 real weights (sample weight times class weight), ``row_index``
        (n,) int64 counters of the bootstrap draws, ``n_classes`` (0 for
        regression), ``criterion``, ``max_depth`` (None: unlimited),
        ``min_samples_split``, ``min_samples_leaf`` (ints), ``min_weight_fraction_leaf``, ``max_features``
        (int), ``bootstrap_rate`` (None: no bootstrap, else the Poisson rate),
        ``seed``, ``max_local_rows`` (the largest shard of the ranks that grow
        together: it sets the trees per batch), ``scales`` (``s_w``, ``s_y``, ``s_y2``: powers of two),
        ``y_tol`` (variance under which a regression node is pure), ``verbose``
        and ``rank`` (progress lines on rank 0), ``comm``
        (None: no communication), ``xp``.
    """

    def __init__(self, spec):
        self.s = spec
        self.xp = spec.xp
        self.n, self.F = spec.Xb.shape
        self.B = int(max(spec.n_bins)) if len(spec.n_bins) else 1
        self.K = spec.n_classes
        # a per-bin row count is needed only to enforce min_samples_leaf > 1: with 1, a side with
        # weight has a row; node row counts travel in the per-node extras
        self.D = 1 if spec.min_samples_leaf > 1 else 0
        self.C = self.D + (self.K if self.K else 2)
        self.E = 1 if self.K else 2                  # per node: rows (and sum of weight * y**2)
        self.stats = {"hist_s": 0.0, "allreduce_s": 0.0, "split_s": 0.0, "route_s": 0.0,
                      "allreduce_bytes": 0, "allreduce_calls": 0, "levels": 0}

    # ------------------------------------------------------------------ per-tree row state
    def _row_state(self, tree):
        s, xp = self.s, self.xp
        w = s.weight
        if s.bootstrap_rate is not None:
            w = w * poisson_weights(xp, s.seed, tree, s.row_index, s.bootstrap_rate)
        wq = xp.rint(w * s.scales[0])
        node = xp.where(wq > 0, 0, -1).astype(xp.int32)
        if self.K:
            return node, wq, None, None
        wy = xp.rint(w * s.y * s.scales[1])
        wy2 = xp.rint(w * s.y * s.y * s.scales[2])
        return node, wq, wy, wy2

    def _feature_sets(self, tree, node_ids):
        """``(len(node_ids), F)`` random permutations of the features, one per node (host).

        The order is a permutation keyed by ``(seed, tree, node id)``; its
        first ``max_features`` entries are the node's features; when they are
        all constant in the node, the first non-constant one after them is used.  Among splits
        of equal quality the one on the earliest feature of the order wins
        (then the lowest bin), as scikit-learn's random feature order does.
        """
        F, m = self.F, self.s.max_features
        keys = np.asarray(node_ids, dtype=np.int64)[:, None] * F + np.arange(F, dtype=np.int64)
        u = hash_uniform(np, self.s.seed, STREAM_FEATURES, tree, keys)
        return np.argsort(u, axis=1, kind="stable")

    # ------------------------------------------------------------------ histograms
    def _local_histogram(self, states, parts, fsel, n_slots):
        """This rank's histogram of the slots ``parts``, flattened.

        ``parts`` is a list of ``(t, lo, hi, slot0, lookup)``: the nodes
        ``lo..hi-1`` of tree ``t`` are the slots from ``slot0`` on; ``lookup``
        (None: all of them, in order) maps ``node - lo`` to a slot offset, -1
        for nodes left out.
        """
        xp, s = self.xp, self.s
        m = fsel.shape[1]
        B, C = self.B, self.C
        size = n_slots * m * B * C
        hist = xp.zeros(size, dtype=xp.float64)
        D, E = self.D, self.E
        extra = xp.zeros(n_slots * E, dtype=xp.float64)
        fsel_x = xp.asarray(fsel)
        jj = xp.arange(m, dtype=xp.int64)
        step = max(1, KEY_ELEMENTS // max(m, 1))
        for t, lo, hi, slot0, lookup in parts:
            node, wq, wy, wy2 = states[t]
            rows = xp.nonzero((node >= lo) & (node < hi))[0]
            n_part = hi - lo if lookup is None else int(lookup.max()) + 1
            if lookup is not None:
                lookup_x = xp.asarray(lookup)
                rows = rows[lookup_x[node[rows] - lo] >= 0]
            span = n_part * m * B * C
            view = hist[slot0 * m * B * C:slot0 * m * B * C + span]
            for a in range(0, int(rows.shape[0]), step):
                r = rows[a:a + step]
                slot = (node[r] - lo).astype(xp.int64)
                if lookup is not None:
                    slot = lookup_x[slot].astype(xp.int64)
                bins = xp.take_along_axis(s.Xb[r], fsel_x[slot + slot0], axis=1).astype(xp.int64)
                key = (((slot[:, None] * m + jj) * B + bins) * C).ravel()
                nr = r.shape[0]
                keys, wts = [], []
                if D:
                    keys.append(key)
                    wts.append(xp.ones(key.shape[0], dtype=xp.float64))
                if self.K:
                    keys.append(key + D + xp.broadcast_to(s.y[r].astype(xp.int64)[:, None], (nr, m)).ravel())
                    wts.append(xp.broadcast_to(wq[r][:, None], (nr, m)).ravel())
                else:
                    keys += [key + D, key + D + 1]
                    wts += [xp.broadcast_to(wq[r][:, None], (nr, m)).ravel(),
                            xp.broadcast_to(wy[r][:, None], (nr, m)).ravel()]
                view += xp.bincount(xp.concatenate(keys), weights=xp.concatenate(wts), minlength=span)
                ex = extra[slot0 * E:(slot0 + n_part) * E]
                ex += xp.bincount(slot * E, minlength=n_part * E).astype(xp.float64)
                if not self.K:
                    ex += xp.bincount(slot * E + 1, weights=wy2[r], minlength=n_part * E)
        return hist, extra, m

    def _reduce(self, hist, extra):
        comm, xp = self.s.comm, self.xp
        if comm is None or comm.size == 1:
            return hist, extra
        buf = xp.concatenate([hist, extra])
        _sync(xp)
        t0 = time.perf_counter()
        buf = comm.allreduce(buf)
        _sync(xp)
        self.stats["allreduce_s"] += time.perf_counter() - t0
        self.stats["allreduce_bytes"] += int(buf.nbytes)
        self.stats["allreduce_calls"] += 1
        return buf[:hist.size], buf[hist.size:]

    # ------------------------------------------------------------------ split evaluation
    def _evaluate(self, hist, extra, n_slots, m, depth, root_weight, first_only=False):
        """Per-slot decisions (host arrays) from the reduced histogram (same on every rank).

        Only non-empty bins are split candidates (a split after an empty bin
        repeats the one before it), so the work is proportional to the
        non-empty bins: per-(node, feature) prefix sums are exact int64 sums.
        Ties go to the lowest (feature position, bin).  With ``first_only``
        only the first feature that is not constant in the node is a candidate
        (the features drawn after ``max_features`` constant ones).
        """
        xp, s = self.xp, self.s
        B, C, D = self.B, self.C, self.D
        sw = s.scales[0]
        H = hist.reshape(n_slots, m, B, C)
        ex = extra.reshape(n_slots, self.E)
        tot = H[:, 0].sum(axis=1)                                # (S, C): every row is in one bin per feature
        # (S, m, B) bins holding rows: the row count, the weight (regression), or the class weights (all >= 1)
        occupied = H.sum(axis=3) > 0 if (self.K and not D) else H[..., 0] > 0
        nz = xp.flatnonzero(occupied.ravel())                    # non-empty (slot, feature, bin)
        G = H.reshape(-1, C)[nz].astype(xp.int64)
        seg = nz // B
        first = xp.searchsorted(seg, seg, side="left")
        cs = xp.cumsum(G, axis=0)
        left_i = cs - (cs[first] - G[first])
        slot = seg // m
        left = left_i.astype(xp.float64)
        right = tot[slot] - left
        msl = s.min_samples_leaf
        if self.K:
            wl, wr, wt = left[:, D:] / sw, right[:, D:] / sw, tot[:, D:] / sw
            WL, WR, W = wl.sum(-1), wr.sum(-1), wt.sum(-1)
            Wd = xp.where(W > 0, W, 1)
            p = wt / Wd[:, None]
            if s.criterion == "gini":
                proxy = (wl * wl).sum(-1) / xp.where(WL > 0, WL, 1) + (wr * wr).sum(-1) / xp.where(WR > 0, WR, 1)
                parent = (wt * wt).sum(-1) / Wd
                impurity = 1.0 - (p * p).sum(-1)
            else:
                proxy = _xlogx(xp, wl).sum(-1) + _xlogx(xp, wr).sum(-1) - _xlogx(xp, WL) - _xlogx(xp, WR)
                parent = _xlogx(xp, wt).sum(-1) - _xlogx(xp, W)
                impurity = -(_xlogx(xp, p).sum(-1)) / math.log(2.0)
            value = p
            pure = (wt > 0).sum(-1) <= 1
        else:
            WL, WR, W = left[:, D] / sw, right[:, D] / sw, tot[:, D] / sw
            q = s.scales[1]
            SL, SR, S1 = left[:, D + 1] / q, right[:, D + 1] / q, tot[:, D + 1] / q
            proxy = SL * SL / xp.where(WL > 0, WL, 1) + SR * SR / xp.where(WR > 0, WR, 1)
            Wd = xp.where(W > 0, W, 1)
            parent = S1 * S1 / Wd
            mean = S1 / Wd
            impurity = xp.maximum(ex[:, 1] / s.scales[2] / Wd - mean * mean, 0.0)
            value = mean[:, None]
            pure = impurity <= s.y_tol
        valid = (WL > 0) & (WR > 0)
        if D:
            valid &= (left[:, 0] >= msl) & (right[:, 0] >= msl)
        varying = occupied.sum(axis=2) >= 2                      # (S, m): not constant in the node
        if first_only:
            first_varying = xp.argmax(varying, axis=1)
            valid &= (seg % m) == first_varying[slot]
        mwl = None
        if s.min_weight_fraction_leaf > 0:
            rw = W if root_weight is None else xp.asarray(root_weight)
            mwl = s.min_weight_fraction_leaf * rw
            valid &= (WL >= mwl[slot]) & (WR >= mwl[slot])
        dense = xp.full(n_slots * m * B, -xp.inf, dtype=xp.float64)
        dense[nz] = xp.where(valid, proxy, -xp.inf)
        flat = dense.reshape(n_slots, m * B)
        best = xp.argmax(flat, axis=1)
        best_val = xp.take_along_axis(flat, best[:, None], axis=1)[:, 0]
        best_j, best_b = best // B, best % B
        counts = ex[:, 0]
        # the non-empty bins of the chosen feature next to the split, for thresholds between values present
        chosen = xp.take_along_axis(occupied, best_j[:, None, None].astype(xp.int64), axis=1)[:, 0, :]
        idx = xp.arange(B)
        below = xp.where(chosen & (idx <= best_b[:, None]), idx, -1).max(axis=1)
        above = xp.where(chosen & (idx > best_b[:, None]), idx, B).min(axis=1)
        host = {k: (v.get() if xp is not np else np.asarray(v)) for k, v in dict(
            best_val=best_val, best_j=best_j, best_b=best_b, parent=parent, counts=counts, W=W,
            impurity=impurity, value=value, pure=pure, below=below, above=above,
            varying=varying.any(axis=1)).items()}
        leaf = ~np.isfinite(host["best_val"]) | host["pure"] | (host["counts"] < s.min_samples_split) | \
            (host["counts"] < 2 * msl)
        if mwl is not None:
            leaf |= host["W"] < 2 * (mwl.get() if xp is not np else mwl)
        if s.max_depth is not None:
            leaf |= depth >= s.max_depth
        # nodes that would split but whose drawn features are all constant: draw further features
        host["retry"] = leaf & ~host["varying"] & ~(host["pure"] | (host["counts"] < s.min_samples_split) |
                                                     (host["counts"] < 2 * msl))
        if mwl is not None:
            host["retry"] &= ~(host["W"] < 2 * (mwl.get() if xp is not np else mwl))
        if s.max_depth is not None and depth >= s.max_depth:
            host["retry"][:] = False
        host["leaf"] = leaf
        host["decrease"] = np.where(leaf, 0.0, np.maximum(host["best_val"] - host["parent"], 0.0))
        return host

    def _bin_tables(self):
        """Padded ``(F, B)`` tables of bin values (NaN where bins are not single values) and edges."""
        if getattr(self, "_tables", None) is None:
            F, B = self.F, self.B
            vals = np.full((F, B), np.nan)
            edges = np.full((F, max(B - 1, 1)), np.nan)
            for f in range(F):
                e = self.s.edges[f]
                edges[f, :len(e)] = e
                if self.s.values[f] is not None:
                    vals[f, :len(self.s.values[f])] = self.s.values[f]
            self._tables = (vals, edges, np.array([v is not None for v in self.s.values], dtype=bool))
        return self._tables

    def _thresholds(self, f, b, below, above):
        """Thresholds of splits after bin ``b`` of features ``f``.

        Where bins are single values: half way between the last value present
        in the node at or below ``b`` (bin ``below``) and the first one above
        it (bin ``above``), as an exact tree; otherwise the bin edge.
        """
        vals, edges, exact = self._bin_tables()
        thr = edges[f, np.minimum(b, edges.shape[1] - 1)]
        ex = exact[f] & (below >= 0) & (above < self.B)
        if ex.any():
            vlo, vhi = vals[f[ex], below[ex]], vals[f[ex], above[ex]]
            mid = (vlo + vhi) / 2.0
            thr[ex] = np.where(mid >= vhi, vlo, mid)           # adjacent floats: the midpoint rounds up
        return thr

    # ------------------------------------------------------------------ growing
    def grow(self, trees):
        """Grow the trees with global indices ``trees``; returns a list of per-tree dicts of host arrays."""
        out = []
        # the same on every rank (the batches decide the sequence of allreduces): from the largest shard
        per_batch = max(1, BATCH_ELEMENTS // max(self.s.max_local_rows, 1))
        for a in range(0, len(trees), per_batch):
            t0 = time.perf_counter()
            batch = list(trees[a:a + per_batch])
            out.extend(self._grow_batch(batch))
            if getattr(self.s, "verbose", 0) and getattr(self.s, "rank", 0) == 0:
                print(f"grew trees {batch[0]}-{batch[-1]} in {time.perf_counter() - t0:.2f} s "
                      f"({len(trees) - a - len(batch)} to go)", flush=True)
        return out

    def _grow_batch(self, trees):
        xp, s = self.xp, self.s
        T = len(trees)
        states = [self._row_state(t) for t in trees]
        recs = [{k: [] for k in _RECORDS} for _ in range(T)]
        importances = np.zeros((T, self.F))
        ranges = np.zeros((T, 2), dtype=np.int64)
        ranges[:, 1] = 1                            # node ids [lo, hi) of the current level, per tree
        roots = None
        depth = 0
        while (ranges[:, 1] > ranges[:, 0]).any():
            self.stats["levels"] += 1
            k = ranges[:, 1] - ranges[:, 0]
            base = np.concatenate([[0], np.cumsum(k)])
            n_slots = int(base[-1])
            slot_tree = np.repeat(np.arange(T), k)
            perm = np.concatenate([self._feature_sets(trees[t], np.arange(*ranges[t])) for t in range(T) if k[t] > 0])
            m = min(s.max_features, self.F)
            fsel_all = perm[:, :m]
            per_chunk = max(1, HIST_BYTES // (m * self.B * self.C * 8))
            decisions = []
            for c0 in range(0, n_slots, per_chunk):
                c1 = min(n_slots, c0 + per_chunk)
                parts = [(t, int(ranges[t, 0] + max(c0 - base[t], 0)), int(ranges[t, 0] + min(c1 - base[t], k[t])),
                          int(max(base[t] - c0, 0)), None) for t in range(T) if base[t] < c1 and base[t + 1] > c0]
                fsel = fsel_all[c0:c1]
                _sync(xp)
                t0 = time.perf_counter()
                hist, extra, m = self._local_histogram(states, parts, fsel, c1 - c0)
                _sync(xp)
                self.stats["hist_s"] += time.perf_counter() - t0
                hist, extra = self._reduce(hist, extra)
                t0 = time.perf_counter()
                root_w = None if roots is None else roots[slot_tree[c0:c1]]
                dec = self._evaluate(hist, extra, c1 - c0, m, depth, root_w)
                dec["feature"] = fsel[np.arange(c1 - c0), dec["best_j"]]
                decisions.append(dec)
                self.stats["split_s"] += time.perf_counter() - t0
            dec = {key: np.concatenate([d[key] for d in decisions]) for key in decisions[0]}
            if m < self.F and dec["retry"].any():
                self._draw_further(states, ranges, base, slot_tree, perm[:, m:], dec, depth, roots)
            if roots is None:
                roots = dec["W"].copy()
            t0 = time.perf_counter()
            ranges = self._record_and_route(states, recs, importances, ranges, base, dec)
            _sync(xp)
            self.stats["route_s"] += time.perf_counter() - t0
            depth += 1
        out = []
        for t, rec in enumerate(recs):
            tree = {key: np.concatenate(rec[key]).astype(dtype) for key, dtype in _RECORDS.items()}
            tree["value"] = tree["value"].reshape(len(tree["feature"]), -1)
            tree["importances"] = importances[t]
            out.append(tree)
        return out

    def _draw_further(self, states, ranges, base, slot_tree, rest, dec, depth, roots):
        """Second pass for the nodes whose drawn features were all constant (scikit-learn's rule).

        Histograms of the remaining features, in the node's order, for those
        nodes only (one more allreduce per chunk); the first non-constant
        feature is the only candidate.  ``dec`` is updated in place.
        """
        xp = self.xp
        idx = np.nonzero(dec["retry"])[0]
        m2 = rest.shape[1]
        per_chunk = max(1, HIST_BYTES // (m2 * self.B * self.C * 8))
        for a in range(0, len(idx), per_chunk):
            sel = idx[a:a + per_chunk]
            parts = []
            for t in np.unique(slot_tree[sel]):
                mine = sel[slot_tree[sel] == t]
                lo, hi = int(ranges[t, 0]), int(ranges[t, 1])
                lookup = np.full(hi - lo, -1, dtype=np.int64)
                lookup[mine - base[t]] = np.arange(len(mine))
                parts.append((int(t), lo, hi, int(np.searchsorted(sel, mine[0])), lookup))
            _sync(xp)
            t0 = time.perf_counter()
            hist, extra, _ = self._local_histogram(states, parts, rest[sel], len(sel))
            _sync(xp)
            self.stats["hist_s"] += time.perf_counter() - t0
            hist, extra = self._reduce(hist, extra)
            t0 = time.perf_counter()
            root_w = None if roots is None else roots[slot_tree[sel]]
            again = self._evaluate(hist, extra, len(sel), m2, depth, root_w, first_only=True)
            again["feature"] = rest[sel][np.arange(len(sel)), again["best_j"]]
            for key in ("leaf", "feature", "best_b", "below", "above", "decrease"):
                dec[key][sel] = again[key]
            self.stats["split_s"] += time.perf_counter() - t0

    def _record_and_route(self, states, recs, importances, ranges, base, dec):
        """Append the level's nodes to the records, number the children, move rows to them."""
        xp, s = self.xp, self.s
        n_slots = len(dec["leaf"])
        split = ~dec["leaf"]
        f = dec["feature"].astype(np.int64)
        b = dec["best_b"].astype(np.int64)
        thr = np.full(n_slots, -2.0)
        if split.any():
            thr[split] = self._thresholds(f[split], b[split], dec["below"][split], dec["above"][split])
        new_ranges = ranges.copy()
        for t in range(len(ranges)):
            lo, hi = int(ranges[t, 0]), int(ranges[t, 1])
            a, z = int(base[t]), int(base[t + 1])
            if z == a:
                new_ranges[t] = (hi, hi)
                continue
            sp = split[a:z]
            order = np.cumsum(sp) - 1
            left = np.where(sp, hi + 2 * order, -1).astype(np.int32)
            right = np.where(sp, left + 1, -1).astype(np.int32)
            rec = recs[t]
            rec["feature"].append(np.where(sp, f[a:z], -2))
            rec["threshold"].append(thr[a:z])
            rec["left"].append(left)
            rec["right"].append(right)
            rec["value"].append(dec["value"][a:z])
            rec["n_node_samples"].append(dec["counts"][a:z])
            rec["weighted_n_node_samples"].append(dec["W"][a:z])
            rec["impurity"].append(dec["impurity"][a:z])
            np.add.at(importances[t], f[a:z][sp], dec["decrease"][a:z][sp])
            n_new = 2 * int(sp.sum())
            new_ranges[t] = (hi, hi + n_new)
            node = states[t][0]
            rows = xp.nonzero(node >= 0)[0]
            if rows.shape[0] == 0:
                continue
            q = (node[rows] - lo).astype(xp.int64)
            fx = xp.asarray(np.where(sp, f[a:z], 0))[q]
            bx = xp.asarray(np.where(sp, b[a:z], 0))[q]
            go_left = s.Xb[rows, fx].astype(xp.int64) <= bx
            node[rows] = xp.where(go_left, xp.asarray(left)[q], xp.asarray(right)[q])
        return new_ranges


#: Per-node records of a tree and their dtypes.
_RECORDS = {"feature": np.int32, "threshold": np.float64, "left": np.int32, "right": np.int32,
            "value": np.float64, "n_node_samples": np.int64, "weighted_n_node_samples": np.float64,
            "impurity": np.float64}
