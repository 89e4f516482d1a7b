"""Level-wise growth of a batch of trees from binned rows, one histogram allreduce per level.

Longer than 800 lines because the GPU and host paths of a level (histograms, search, partition, the
level's allreduce and the batch's bookkeeping) share one decision code and must grow the same trees.

Every tree of a batch advances one level at a time.  The rows of the level are
held as *elements* ``(row, fixed-point weights)`` partitioned by node: the
elements of slot ``s`` (a node of the level; slots run over the trees of the
batch, then their nodes) are the segment ``starts[s]:starts[s+1]``.  Per level:

1. each rank sums the segments of the nodes it must build into histograms
   ``(node, feature, bin, channel)``: a shared-memory CUDA kernel on CuPy
   (:mod:`mpiml.kernels.forest.histograms`), ``bincount`` on NumPy;
2. the histograms are summed over ranks with one allreduce (several when they
   exceed a byte budget);
3. every rank evaluates the same splits on the same numbers (array operations
   over all nodes at once, no loop per node);
4. every rank partitions its own elements into the children (a stable
   partition by prefix sums, all trees at once); elements of leaves are dropped.

**Sibling subtraction.**  When histograms cover every feature (``max_features``
above half the features, so that building all of them on half the rows is
cheaper than the drawn ones on all rows), only the child with less weight of
each split is built and summed; its sibling is ``parent - child``.  That halves
the histogram work and the allreduce bytes of every level below the root.
**Last level.**  At ``max_depth`` every node is a leaf: only per-node totals are
summed.
**Host ranks** use the Numba kernels of :mod:`._cpu_kernels`: one rank alone
searches each node from a per-thread histogram (none is written out).  Several
host ranks whose binned rows fit a budget gather them all and grow whole trees
each (:mod:`._tree_parallel`: the same trees); otherwise they grow
level by level, and the nodes with fewer rows than bins are searched by one rank
each, which receives their rows, instead of reducing their histograms.

Channels are integer-valued (fixed point, see :mod:`._hist`):

* classification: ``[weight of class 0, ..., weight of class K-1]``;
* regression: ``[weight, weight * y]`` (``[weight, weight * y_1, ..., weight * y_Q]`` for ``Q``
  outputs: those grow on the array path, NumPy or CuPy, without the compiled kernels);
* a leading ``rows`` channel only when ``min_samples_leaf > 1`` (it counts
  rows with non-zero weight on each side of a split);
* per node: the rows, and for regression ``sum(weight * y**2)`` (the purity test).

Sums (and differences) of integers below 2**53 are exact in any order, so the
reduced histogram (and so every split) is bit-identical on every rank, for
every rank count, on NumPy and on CuPy.
"""

import math
import os
import time

import numpy as np

from . import _cpu_kernels, _owner_search, _scatter_split, _tree_parallel
from ._hist import STREAM_FEATURES, hash_uniform, stream_lead
from ._split import built_nodes, choose, decide, dense_candidates, leaf_by_own_numbers, node_stats, thresholds

__all__ = ["GrowSpec", "TreeGrower"]

#: ``MPIML_RF_GPU_KERNEL=0`` sums GPU histograms with ``bincount`` instead of the shared-memory kernel
#: (for comparisons; the trees are the same).
#: Largest ``elements x features`` handled by one ``bincount`` (bounds the temporary keys).
KEY_ELEMENTS = 1 << 24


def power_of_two_below(x):
    """The largest power of two not above ``x`` (a scale that divides exactly)."""
    return 2.0 ** math.floor(math.log2(x))


class GrowSpec:
    """What a :class:`TreeGrower` needs; plain attributes (see :meth:`TreeGrower.__init__`)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Elements:
    """The rows of a level, partitioned by slot: ``row`` (int32), ``w`` and, for regression, ``wy`` and
    ``wy2`` (float64 fixed point), ``seg`` (int32 slot of each element) on the device; ``starts``
    (host int64, slots + 1) the segment boundaries."""

    def __init__(self, row, seg, w, wy, wy2, starts):
        self.row, self._seg, self.w, self.wy, self.wy2, self.starts = row, seg, w, wy, wy2, starts
        self._wy2_sums = None
        self._lens = None

    @property
    def seg(self):
        """The slot of each element; None given (the host kernels, which read ``starts``): made on first use."""
        if self._seg is None:
            self._seg = np.repeat(np.arange(len(self.starts) - 1, dtype=np.int32), np.diff(self.starts))
        return self._seg

    def lens(self):
        """The elements of each slot (made once: a level asks several times)."""
        if self._lens is None:
            self._lens = np.diff(self.starts)
        return self._lens

    def wy2_prefix(self, xp):
        """Prefix sums of ``wy2`` (exact: integers below 2**53)."""
        if self._wy2_sums is None:
            self._wy2_sums = xp.concatenate([xp.zeros(1), xp.cumsum(self.wy2)])
        return self._wy2_sums


def _sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _host(xp, a):
    return a.get() if xp is not np else np.asarray(a)


class TreeGrower:
    """Grows trees level by level on this rank's binned rows.

    Parameters
    ----------
    spec : GrowSpec
        ``Xb`` (n, F) bins, ``n_bins`` (F,) host ints, ``edges``/``values``
        (host lists from :func:`._hist.bin_edges`), ``y`` (classification:
        int class codes; regression: float64 targets), ``weight`` (n,)
        float64 real weights (sample weight times class weight: the trees' weights without bootstrap,
        the draws' probabilities with it), ``n_classes`` (0 for
        regression), ``criterion``, ``max_depth`` (None: unlimited),
        ``min_samples_split``, ``min_samples_leaf`` (ints), ``min_weight_fraction_leaf``,
        ``min_impurity_decrease``, ``max_features`` (int), ``balanced_subsample`` (class weights per
        tree from its bootstrap counts), ``bootstrap`` (None: no bootstrap, else the
        :class:`._bootstrap.Bootstrap` of these rows: a tree's weights are its draw counts),
        ``tree_keys`` (host ints indexed by tree id: the key of every draw of the tree, its bootstrap
        and its feature orders), ``max_local_rows`` (the largest shard of the ranks that grow
        together) and ``batch_elements`` (agreed by them: together they set the trees per batch),
        ``hist_bytes`` (largest histogram of one allreduce) and ``sub_bytes`` (largest kept histograms
        of split nodes, for the sibling subtraction below them), both agreed,
        ``scales`` (``s_w``, ``s_y``, ``s_y2``: powers of two), ``y_tol`` (variance under which a
        regression node is pure), ``verbose`` and ``rank`` (progress lines on rank 0), ``comm``
        (None: no communication), ``xp``.
    """

    def __init__(self, spec):
        self.s = spec
        self.xp = spec.xp
        self.n, self.F = spec.Xb.shape
        self.B = int(max(spec.n_bins)) if len(spec.n_bins) else 1
        self.K = spec.n_classes
        self.Q = 1 if self.K else getattr(spec, "n_outputs", 1)      # regression outputs
        # a per-bin row count is needed only to enforce min_samples_leaf > 1: with 1, a side with
        # weight has a row; node row counts travel in the per-node extras
        self.D = 1 if spec.min_samples_leaf > 1 else 0
        self.C = self.D + (self.K if self.K else 1 + self.Q)
        self.E = 1 if self.K else 2                  # per node: rows (and sum of weight * y**2)
        self.m = min(spec.max_features, self.F)
        # histograms of every feature (and sibling subtraction) when that is the cheaper build:
        # F features on at most half the rows against m features on all of them
        self.full = 2 * self.m > self.F
        self.kernel = None
        if (self.xp is not np and spec.Xb.dtype == np.uint8 and self.Q == 1
                and os.environ.get("MPIML_RF_GPU_KERNEL", "1") != "0"):
            from ..kernels.forest import histograms

            self.kernel = histograms
        # compiled host kernels (Numba) unless ``MPIML_RF_CPU_KERNEL=0`` (the NumPy path, same trees)
        self.cpu = self.xp is np and self.Q == 1 and _cpu_kernels.enabled()
        # missing values: the bin of each feature's NaN (-1: none); their splits take the array search
        nan_bin = getattr(spec, "missing_bin", None)
        self.nan_bin = np.asarray(nan_bin) if nan_bin is not None and (np.asarray(nan_bin) >= 0).any() else None
        # the host kernels gather a node's rows from one feature's column of bins at a time
        self.cols = np.ascontiguousarray(spec.Xb.T) if self.cpu else None
        # a rank that grows alone needs no histogram of any node: the search reads a per-thread one
        self.alone = alone = spec.comm is None or spec.comm.size == 1
        self.fused = self.cpu and alone and self._candidate_search(self.C) is not None
        # its level's numbers and decisions compiled too (MPIML_RF_DECIDE_KERNEL=0: NumPy's, the same trees)
        self.decide_kernel = self.fused and os.environ.get("MPIML_RF_DECIDE_KERNEL", "1") != "0"
        # several host ranks: nodes with fewer rows than bins gather their rows instead of reducing histograms
        self.gather_small = (self.cpu and not alone and not self.full and self._candidate_search(self.C) is not None
                             and os.environ.get("MPIML_RF_GATHER_SMALL", "1") != "0")
        # several ranks with the compiled search: histograms reduce-scattered, each rank searches its share
        self.scatter = _scatter_split.applies(self)
        self.gather_small = self.gather_small and not self.scatter
        # MPIML_RF_LEVEL_PROFILE=1: a sync point before each level's collectives times the ranks' skew apart
        self.level_profile = os.environ.get("MPIML_RF_LEVEL_PROFILE", "0") == "1"
        self.stats = {"hist_s": 0.0, "allreduce_s": 0.0, "split_s": 0.0, "route_s": 0.0,
                      "allreduce_bytes": 0, "allreduce_calls": 0, "levels": 0, "hist_elements": 0,
                      "hist_nodes_built": 0, "hist_nodes_derived": 0, "wait_s": 0.0,
                      "reduce_scatter_s": 0.0, "reduce_scatter_bytes": 0, "reduce_scatter_calls": 0,
                      "allgather_s": 0.0, "allgather_bytes": 0, "allgather_calls": 0,
                      "elements_s": 0.0, "orders_s": 0.0, "record_s": 0.0}

    # ------------------------------------------------------------------ per-tree row state
    def _elements(self, trees):
        """The root elements of a batch: per tree the rows of non-zero weight, in row order."""
        s, xp = self.s, self.xp
        rows, ws, wys, wy2s, segs, counts = [], [], [], [], [], []
        draws = [None] * len(trees)
        cw = None
        if s.bootstrap is not None and getattr(s, "balanced_subsample", False):    # every tree's draws first
            draws = self._draws(trees)
            cw = self._subsample_class_weights(draws)
        elif (s.bootstrap is not None and self.cpu and getattr(s.bootstrap, "exact", False) and len(trees) > 1
              and _cpu_kernels.thread_count() > 1):
            # scikit-learn's draws of small data sets (at most 2**16 rows: every tree's counts fit), on the rank's
            # threads: NumPy draws them without the GIL, and they were the largest serial part of a small fit
            draws = self._draws(trees, _cpu_kernels.thread_count())
        for i, tree in enumerate(trees):
            # with bootstrap the rows were drawn in proportion to their weights: a tree weighs them by their
            # draw counts (scikit-learn's bootstrap); without, by their weights
            if s.bootstrap is not None and draws[i] is None:
                draws[i] = s.bootstrap.counts([s.tree_keys[tree]])[0]
            w = s.weight if draws[i] is None else draws[i]
            draws[i] = None                         # (one tree's counts alive at a time)
            if cw is not None:
                w = w * xp.asarray(cw[i])[s.y]
            wq = xp.rint(w * s.scales[0])
            r = xp.nonzero(wq > 0)[0]
            rows.append(r.astype(xp.int32))
            ws.append(wq[r])
            counts.append(int(r.shape[0]))
            segs.append(xp.full(counts[-1], i, dtype=xp.int32))      # made on the device, not sent from the host
            if not self.K:
                wr, yr = w[r], s.y[r]
                if self.Q > 1:
                    wys.append(xp.rint(wr[:, None] * yr * s.scales[1]))
                    wy2s.append(xp.rint(wr * (yr * yr).sum(axis=1) * s.scales[2]))
                else:
                    wys.append(xp.rint(wr * yr * s.scales[1]))
                    # the node impurity's extra: sum w y**2 (squared error) or sum w y log y (Poisson)
                    y2 = (xp.where(yr > 0, yr * xp.log(xp.where(yr > 0, yr, 1.0)), 0.0) if s.criterion == "poisson"
                          else yr * yr)
                    wy2s.append(xp.rint(wr * y2 * s.scales[2]))
        cat = (lambda parts: xp.concatenate(parts)) if len(trees) > 1 else (lambda parts: parts[0])
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        el = _Elements(cat(rows), cat(segs), cat(ws), cat(wys) if wys else None, cat(wy2s) if wy2s else None, starts)
        self._max_weight = float(el.w.max()) if el.w.shape[0] else 0.0
        return el

    def _draws(self, trees, threads=1):
        """Every tree's bootstrap counts (a list), on ``threads`` threads (the draws of a tree depend on its key
        alone: the same counts in any order)."""
        s = self.s

        def one(tree):
            return s.bootstrap.counts([s.tree_keys[tree]])[0]

        if threads <= 1:
            return [one(tree) for tree in trees]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(threads, len(trees))) as pool:
            return list(pool.map(one, trees))

    def _subsample_class_weights(self, draws):
        """``class_weight="balanced_subsample"``: per tree, ``n / (classes drawn * count)`` from the class
        counts of its bootstrap draws over every rank (one allreduce of trees x classes floats); 0 for the
        classes it did not draw (scikit-learn's ``compute_sample_weight("balanced", y, indices=...)``)."""
        xp, K, comm = self.xp, self.K, self.s.comm
        counts = np.stack([_host(xp, xp.bincount(self.s.y, weights=d, minlength=K)) if d.shape[0] else np.zeros(K)
                           for d in draws]).astype(np.float64)
        if comm is not None and comm.size > 1:
            counts = comm.allreduce(counts)
        drawn = (counts > 0).sum(axis=1, keepdims=True)
        return np.where(counts > 0, counts.sum(axis=1, keepdims=True) / (np.maximum(drawn, 1) *
                                                                           np.where(counts > 0, counts, 1)), 0.0)

    def _feature_sets(self, trees, ranges):
        """``(slots, F)`` random permutations of the features, one per node of the level (on ``xp``).

        The order is a permutation keyed by ``(tree key, node id)``; its
        first ``max_features`` entries are the node's features; when they are
        all constant in the node, the first non-constant one after them is used.  Among splits
        of equal quality the one on the earliest feature of the order wins
        (then the lowest bin), as scikit-learn's random feature order does.
        """
        xp, F = self.xp, self.F
        tree_of, node_of = self._slots_of(trees, ranges)
        if self.cpu:
            return _cpu_kernels.feature_orders(stream_lead(0, STREAM_FEATURES), tree_of, node_of, F)
        keys = xp.asarray(node_of)[:, None] * F + xp.arange(F, dtype=xp.int64)
        u = hash_uniform(xp, 0, STREAM_FEATURES, xp.asarray(tree_of)[:, None], keys)
        return np.argsort(u, axis=1, kind="stable") if xp is np else xp.argsort(u, axis=1)   # CuPy's is stable

    def _slots_of(self, trees, ranges):
        """Each slot's tree key and node id (host int64): the keys of its feature order.  The tree's key, not its
        place in the forest: a tree refitted alone on its sample draws the same."""
        k = ranges[:, 1] - ranges[:, 0]
        tree_of = np.repeat(np.asarray([self.s.tree_keys[t] for t in trees], dtype=np.int64), k)
        node_of = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges])
        return tree_of, node_of

    # ------------------------------------------------------------------ histograms
    def _build(self, el, slots, fsel, feature_major=False, dtype=np.float64):
        """This rank's histograms ``(len(slots), FH, B, C)`` (float64) and extras ``(len(slots), E)``
        of the segments ``slots`` (host ints), features ``fsel`` (``(len(slots), FH)`` on ``xp``);
        ``feature_major``: the histograms as ``(FH, len(slots), B, C)`` (C order); ``dtype``: theirs (an
        integer type only where every sum fits it)."""
        xp, s = self.xp, self.s
        B, C, D, K = self.B, self.C, self.D, self.K
        n, FH = len(slots), int(fsel.shape[1])
        seg_start = el.starts[slots]
        seg_len = el.starts[slots + 1] - seg_start
        self.stats["hist_elements"] += int(seg_len.sum()) * FH
        hist = None
        if self.kernel is not None and n:
            h = self.kernel.build_histograms(s.Xb, el.row, el.w, el.wy, s.y if K else None, seg_start, seg_len,
                                             fsel.astype(xp.int32), B, K, bool(D), self._max_weight)
            if h is not None:      # one pass: the int64 sums to float64, in the layout asked for
                hist = xp.ascontiguousarray(h.transpose(1, 0, 2, 3), dtype=dtype) if feature_major \
                    else h.astype(dtype)
                feature_major = False
        if hist is None and self.cpu:
            hist = _cpu_kernels.build_histograms(self.cols, el.row, el.w, el.wy, s.y if K else None, seg_start, seg_len,
                                                 fsel, B, K, bool(D))
        if hist is None:
            hist = self._bincount_histogram(el, seg_start, seg_len, fsel)
        if feature_major:
            hist = xp.ascontiguousarray(hist.transpose(1, 0, 2, 3))
        if hist.dtype != dtype:
            hist = hist.astype(dtype)
        extra = xp.zeros((n, self.E), dtype=xp.float64)
        if n:
            extra[:, 0] = xp.asarray(seg_len.astype(np.float64))
            if not K:
                cs = el.wy2_prefix(xp)
                extra[:, 1] = cs[xp.asarray(seg_start + seg_len)] - cs[xp.asarray(seg_start)]
        return hist, extra

    def _bincount_histogram(self, el, seg_start, seg_len, fsel):
        """The histograms by ``bincount`` over combined ``(slot, feature, bin, channel)`` keys."""
        xp, s = self.xp, self.s
        B, C, D, K = self.B, self.C, self.D, self.K
        n, FH = len(seg_len), int(fsel.shape[1])
        span = n * FH * B * C
        hist = xp.zeros(span, dtype=xp.float64)
        total = int(seg_len.sum())
        if total == 0:
            return hist.reshape(n, FH, B, C)
        slot_h = np.repeat(np.arange(n, dtype=np.int64), seg_len)
        idx_h = np.repeat(seg_start - (np.cumsum(seg_len) - seg_len), seg_len) + np.arange(total, dtype=np.int64)
        jj = xp.arange(FH, dtype=xp.int64)
        fsel = xp.asarray(fsel)
        step = max(1, KEY_ELEMENTS // max(FH, 1))
        for a in range(0, total, step):
            e = xp.asarray(idx_h[a:a + step])
            slot = xp.asarray(slot_h[a:a + step])
            r = el.row[e]
            bins = xp.take_along_axis(s.Xb[r], fsel[slot], axis=1).astype(xp.int64)
            key = (((slot[:, None] * FH + jj) * B + bins) * C).ravel()
            ne = e.shape[0]
            keys, wts = [], []
            if D:
                keys.append(key)
                wts.append(xp.ones(key.shape[0], dtype=xp.float64))
            w = xp.broadcast_to(el.w[e][:, None], (ne, FH)).ravel()
            if K:
                keys.append(key + D + xp.broadcast_to(s.y[r].astype(xp.int64)[:, None], (ne, FH)).ravel())
                wts.append(w)
            else:
                wy = el.wy[e].reshape(ne, self.Q)
                keys += [key + D] + [key + D + 1 + q for q in range(self.Q)]
                wts += [w] + [xp.broadcast_to(wy[:, q:q + 1], (ne, FH)).ravel() for q in range(self.Q)]
            hist += xp.bincount(xp.concatenate(keys), weights=xp.concatenate(wts), minlength=span)
        return hist.reshape(n, FH, B, C)

    def _totals(self, el):
        """Per-slot channel totals as a one-bin histogram ``(slots, 1, 1, C)`` and the extras (local)."""
        xp, s = self.xp, self.s
        C, D, K = self.C, self.D, self.K
        S = len(el.starts) - 1
        if self.cpu:
            tot, extra = _cpu_kernels.segment_totals(el.row, el.w, el.wy, el.wy2, s.y if K else None, el.starts, K,
                                                     bool(D))
            return tot.reshape(S, 1, 1, C), extra
        seg = el.seg.astype(xp.int64)
        tot = xp.zeros(S * C, dtype=xp.float64)
        if el.row.shape[0]:
            if D:
                tot += xp.bincount(seg * C, minlength=S * C).astype(xp.float64)
            if K:
                tot += xp.bincount(seg * C + D + s.y[el.row].astype(xp.int64), weights=el.w, minlength=S * C)
            else:
                tot += xp.bincount(seg * C + D, weights=el.w, minlength=S * C)
                wy = el.wy.reshape(-1, self.Q)
                for q in range(self.Q):
                    tot += xp.bincount(seg * C + D + 1 + q, weights=wy[:, q], minlength=S * C)
        slots = np.arange(S)
        extra = xp.zeros((S, self.E), dtype=xp.float64)
        extra[:, 0] = xp.asarray(el.lens().astype(np.float64))
        if not K and S:
            cs = el.wy2_prefix(xp)
            extra[:, 1] = cs[xp.asarray(el.starts[slots + 1])] - cs[xp.asarray(el.starts[slots])]
        return tot.reshape(S, 1, 1, C), extra

    def _skew_wait(self):
        """With ``MPIML_RF_LEVEL_PROFILE=1``, a sync point before a level's collectives: the time until every
        rank arrives (``stats["wait_s"]``) is the ranks' skew, not the transfer's."""
        if self.level_profile:
            t0 = time.perf_counter()
            self.s.comm.allreduce(self.xp.zeros(1))
            _sync(self.xp)
            self.stats["wait_s"] += time.perf_counter() - t0

    def _reduce(self, hist, extra):
        comm, xp = self.s.comm, self.xp
        if comm is None or comm.size == 1:
            return hist, extra
        buf = xp.concatenate([hist.ravel(), extra.ravel()])
        _sync(xp)
        self._skew_wait()
        t0 = time.perf_counter()
        buf = comm.allreduce(buf)
        _sync(xp)
        self.stats["allreduce_s"] += time.perf_counter() - t0
        self.stats["allreduce_bytes"] += int(buf.nbytes)
        self.stats["allreduce_calls"] += 1
        return buf[:hist.size].reshape(hist.shape), buf[hist.size:].reshape(extra.shape)

    # ------------------------------------------------------------------ split evaluation
    def _candidate_search(self, C):
        """The compiled per-(node, feature) split search for this forest, or None (whole-array search).

        Compiled: gini (fewer than 8 classes: sums over classes in NumPy's order) and squared error;
        ``MPIML_RF_SPLIT_KERNEL=0`` turns it off (the array search, for comparisons: the same trees).
        """
        if ((self.K and (self.s.criterion != "gini" or self.K >= 8)) or self.Q > 1 or self.s.criterion == "poisson"
                or getattr(self, "nan_bin", None) is not None):
            return None
        if os.environ.get("MPIML_RF_SPLIT_KERNEL", "1") == "0":
            return None
        if self.cpu:
            return _cpu_kernels.split_candidates
        if self.kernel is not None and C <= self.kernel.SPLIT_MAX_CHANNELS:
            return self.kernel.split_candidates
        return None

    def _evaluate(self, H, ex, order, depth, root_weight, first_only=False, fpos=None):
        """Per-slot decisions (host arrays) from the reduced histograms (same on every rank).

        ``H`` is ``(S, FH, B, C)``, ``ex`` the ``(S, E)`` extras, ``order`` the
        ``(S, m)`` candidate feature ids in the node's order and ``fpos`` their
        positions in ``H`` (None: ``H`` holds exactly them, in that order).
        With ``first_only`` only the first feature that is not constant in the
        node is a candidate (see :func:`._split.dense_candidates`).
        """
        xp, s = self.xp, self.s
        tot = H[:, 0].sum(axis=1)                 # (S, C): every row is in one bin of every feature
        st = node_stats(self, tot, ex, root_weight)
        search = None if first_only else self._candidate_search(H.shape[3])
        if search is not None:
            if fpos is None:
                fpos = xp.broadcast_to(xp.arange(order.shape[1], dtype=xp.int64), order.shape)
            cand = search(H, fpos, tot, st["mwl"], s.scales[0], s.scales[1], self.K, bool(self.D),
                          s.min_samples_leaf)
            best = choose(xp, cand)
        else:
            nanb = None if self.nan_bin is None else xp.asarray(self.nan_bin)[xp.asarray(order)]
            best = dense_candidates(self, H, tot, st["mwl"], first_only, nanb=nanb, fpos=fpos)
        dec = decide(self, best[:7], st, ex, order, depth)
        dec["missing_left"] = (_host(xp, best[7]).astype(bool) & ~dec["leaf"] if len(best) > 7
                               else np.zeros(len(dec["leaf"]), dtype=bool))
        return dec

    # ------------------------------------------------------------------ growing
    def grow(self, trees):
        """Grow the trees with global indices ``trees``; returns a list of per-tree dicts of host arrays."""
        if _tree_parallel.applies(self, trees):            # several host ranks: whole trees per rank
            return _tree_parallel.grow(self, trees)
        start = time.perf_counter()
        # a rank alone with at least as many trees as threads: each thread grows its own trees (fewer trees: the
        # threads share every level, or some would have none; MPIML_RF_TREE_THREADS=all: a thread a tree even
        # then, for A/B runs of a rank's few trees, e.g. 32 trees over 8 ranks of 8 threads)
        threads = _cpu_kernels.thread_count() if self.fused else 1
        mode = os.environ.get("MPIML_RF_TREE_THREADS", "1")
        if 1 < threads and mode != "0" and (threads <= len(trees) or (mode == "all" and len(trees) > 1)):
            out = self._grow_in_threads(trees, min(threads, len(trees)))
        else:
            out = self._grow_batches(trees)
        self.stats["grow_s"] = self.stats.get("grow_s", 0.0) + time.perf_counter() - start
        return out

    def _grow_in_threads(self, trees, threads):
        """A rank that grows alone on several threads: each thread grows whole trees with the kernels on itself
        (:func:`._cpu_kernels.serial`), as ranks grow whole trees (:mod:`._tree_parallel`), taking them from a
        shared queue in runs that shrink as the queue empties (a run is grown as one batch).

        One rank's level-wise growth on T threads ran its Python and NumPy between the kernels (decisions,
        records, the draws) on one thread while the others waited, and launched every kernel on all of them:
        on 2 cores one rank took 0.283 s where two ranks of one thread each took 0.137 s (2e4 x 32, 20 trees of
        depth 12).  Here a thread's Python runs while the others are in their kernels (which release the GIL).
        Every ``threads``-th tree per thread, fixed in advance, left a rank waiting on its unluckiest thread:
        at 8 ranks of 8 threads and 128 full-depth trees (two a thread) the threads of a rank took 0.46-0.77 s
        (64-core host, 04:30 pass); from the queue a thread that drew small trees takes the next one.  A tree
        is grown the same way whoever grows it: the same trees.  The phase times in ``stats`` are summed over
        the threads."""
        import copy
        import threading
        from concurrent.futures import ThreadPoolExecutor

        lock, taken = threading.Lock(), [0]

        def take():
            with lock:      # guided: a run of 1/(2 T) of what is left, one tree at the end (a run of 1 costs a tree
                left = len(trees) - taken[0]       # what a run of 2 does now that a level's Python is compiled)
                n = min(left, max(1, left // (2 * threads)))
                run = list(trees[taken[0]:taken[0] + n])
                taken[0] += n
                return run

        def work(_):
            g = copy.copy(self)
            g.stats = {k: type(v)(0) for k, v in self.stats.items()}
            t0, c0 = time.perf_counter(), time.thread_time()
            grown = {}
            with _cpu_kernels.serial():
                run = take()
                while run:
                    grown.update(zip(run, g._grow_batches(run, share=threads, left=lambda: len(trees) - taken[0])))
                    run = take()
            return grown, g.stats, time.perf_counter() - t0, time.thread_time() - c0

        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(work, range(threads)))
        by_id = {}
        for grown, st, *_ in results:
            by_id.update(grown)
            for k, v in st.items():
                self.stats[k] = self.stats.get(k, 0) + v
        # the threads' spread (the rank's growth ends with its slowest thread), and their CPU seconds against their
        # wall seconds: a thread off its core (waiting for the GIL between its kernels, or for a core) is the gap
        walls = [r[2] for r in results]
        self.stats.update(tree_threads=threads, thread_max_s=max(walls), thread_min_s=min(walls),
                          thread_wall_s=sum(walls), thread_cpu_s=sum(r[3] for r in results))
        return [by_id[t] for t in trees]

    def _grow_batches(self, trees, progress=True, share=1, left=None):
        """The trees in batches of the agreed elements (over ``share`` threads growing batches at once: each
        thread's batches take that share of the elements, so the rank's memory stays that of one batch);
        ``left()``: the trees still to grow, for the progress lines (default: those of ``trees``)."""
        out = []
        # the same on every rank (the batches decide the sequence of allreduces): agreed numbers only
        per_batch = max(1, self.s.batch_elements // max(self.s.max_local_rows, 1) // share)
        for a in range(0, len(trees), per_batch):
            t0 = time.perf_counter()
            batch = list(trees[a:a + per_batch])
            out.extend(self._grow_batch(batch))
            if progress and getattr(self.s, "verbose", 0) and getattr(self.s, "rank", 0) == 0:
                which = ((f"trees {batch[0]}-{batch[-1]}" if len(batch) > 1 else f"tree {batch[0]}")
                         + ("" if share == 1 else f" on one of {share} threads"))
                to_go = len(trees) - a - len(batch) if left is None else left()
                print(f"grew {which} in {time.perf_counter() - t0:.2f} s ({to_go} to go)", flush=True)
        return out

    def _grow_batch(self, trees):
        xp, s = self.xp, self.s
        T = len(trees)
        t0 = time.perf_counter()
        el = self._elements(trees)
        _sync(xp)
        self.stats["elements_s"] += time.perf_counter() - t0
        levels = []
        ranges = np.zeros((T, 2), dtype=np.int64)
        ranges[:, 1] = 1                            # node ids [lo, hi) of the current level, per tree
        roots = None
        parent = None                               # (hist, extra, build_left) of the split nodes above
        depth = 0
        # one thread's fused levels: a level up to its decisions in one compiled call (_head_level)
        head = self.fused and self.decide_kernel and _cpu_kernels.thread_count() == 1
        trees = list(trees)
        while (ranges[:, 1] > ranges[:, 0]).any():
            self.stats["levels"] += 1
            k = ranges[:, 1] - ranges[:, 0]
            slot_tree = np.repeat(np.arange(T), k)
            root_w = None if roots is None else roots[slot_tree]
            last = s.max_depth is not None and depth >= s.max_depth
            if head and not last:               # the orders inside (hist_s), for the nodes searched only
                dec, parent = self._head_level(el, trees, ranges, depth, root_w), None
            else:
                t0 = time.perf_counter()
                perm = self._feature_sets(trees, ranges)
                _sync(xp)
                self.stats["orders_s"] += time.perf_counter() - t0
                if last:
                    dec, parent = self._leaf_level(el, perm, depth, root_w), None
                else:
                    keep = (self.full and (s.max_depth is None or depth + 1 < s.max_depth)
                            and self._deriving_pays(el))
                    dec, parent = self._split_level(el, perm, depth, root_w, parent, keep)
            if roots is None:
                roots = dec["W"].copy()
            t0 = time.perf_counter()
            ranges = self._record(levels, ranges, dec)
            self.stats["record_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            el = self._partition(el, dec)
            _sync(xp)
            self.stats["route_s"] += time.perf_counter() - t0
            depth += 1
        return self._trees(levels, T)

    def _deriving_pays(self, el):
        """Whether the next level derives one child of each split node from its parent's histograms.

        Always on GPUs and with several ranks (deriving halves the kernel work or the allreduce). A host
        rank growing alone derives only while its nodes hold at least as many rows as their histograms
        have cells per feature (bins x channels): building a child costs its rows, deriving it the whole
        histogram several times over (kept, gathered, subtracted, stored) -- with the 64 target bins of
        ``absolute_error``, far more than the rows of all but the largest nodes.  The same trees either way.
        """
        if self.xp is not np or not self.alone:
            return True
        lens = el.lens()
        return int(lens.sum()) >= len(lens) * self.B * self.C

    def _leaf_level(self, el, perm, depth, root_w):
        """The last level (``depth == max_depth``): every node is a leaf; only per-node totals are summed."""
        xp = self.xp
        _sync(xp)
        t0 = time.perf_counter()
        H, extra = self._totals(el)
        _sync(xp)
        self.stats["hist_s"] += time.perf_counter() - t0
        H, extra = self._reduce(H, extra)
        t0 = time.perf_counter()
        dec = self._evaluate(H, extra, perm[:, :1], depth, root_w)
        self.stats["split_s"] += time.perf_counter() - t0
        return dec

    def _split_level(self, el, perm, depth, root_w, parent, keep):
        """Histograms (built or derived), allreduce and split choice of one level, in node chunks.

        ``parent`` holds the reduced histograms of the split nodes of the level
        above and which child to build (sibling subtraction), or None.
        Returns the decisions and what the next level needs for its subtraction
        (None when it must build every node).
        """
        xp, s = self.xp, self.s
        if self.fused:
            return self._fused_level(el, perm, depth, root_w), None
        if self.gather_small:
            return self._mixed_level(el, perm, depth, root_w), None
        if self.scatter:
            return _scatter_split.split_level(self, el, perm, depth, root_w, parent, keep)
        S = len(el.starts) - 1
        m, F, B, C = self.m, self.F, self.B, self.C
        FH = F if self.full else m
        per_chunk = max(2, s.hist_bytes // (FH * B * C * 8)) // 2 * 2     # whole sibling pairs
        ident = xp.arange(F, dtype=xp.int32)
        decisions, kept_h, kept_e, kept_bytes = [], [], [], 0
        for c0 in range(0, S, per_chunk):
            c1 = min(S, c0 + per_chunk)
            n = c1 - c0
            built = built_nodes(c0, c1, parent)
            fsel = xp.broadcast_to(ident, (len(built), F)) if self.full else perm[xp.asarray(built), :m]
            _sync(xp)
            t0 = time.perf_counter()
            hb, eb = self._build(el, built, fsel)
            _sync(xp)
            self.stats["hist_s"] += time.perf_counter() - t0
            self.stats["hist_nodes_built"] += len(built)
            hb, eb = self._reduce(hb, eb)
            t0 = time.perf_counter()
            if parent is not None:
                self.stats["hist_nodes_derived"] += len(built)
                H = xp.empty((n, FH, B, C), dtype=xp.float64)
                ex = xp.empty((n, self.E), dtype=xp.float64)
                local_b = xp.asarray(built - c0)
                local_o = xp.asarray((built ^ 1) - c0)
                ph, pe = parent[0][xp.asarray(built // 2)], parent[1][xp.asarray(built // 2)]
                H[local_b], ex[local_b] = hb, eb
                H[local_o], ex[local_o] = ph - hb, pe - eb
            else:
                H, ex = hb, eb
            order = perm[c0:c1]
            rw = None if root_w is None else root_w[c0:c1]
            dec = self._evaluate(H, ex, order[:, :m], depth, rw, fpos=order[:, :m] if self.full else None)
            if m < F and dec["retry"].any():
                self._draw_further(el, H if self.full else None, ex, np.arange(c0, c1), order, dec, depth, rw)
            decisions.append(dec)
            if keep:
                sp = np.nonzero(~dec["leaf"])[0]
                kept_bytes += len(sp) * FH * B * C * 8
                if kept_bytes <= s.sub_bytes:
                    kept_h.append(H[xp.asarray(sp)])
                    kept_e.append(ex[xp.asarray(sp)])
            self.stats["split_s"] += time.perf_counter() - t0
        dec = {key: np.concatenate([d[key] for d in decisions]) for key in decisions[0]}
        nxt = None
        if keep and kept_bytes <= s.sub_bytes and kept_h:
            sp = ~dec["leaf"]
            nxt = (xp.concatenate(kept_h), xp.concatenate(kept_e), dec["best_wl"][sp] <= dec["best_wr"][sp])
        return dec, nxt

    def _fused_level(self, el, perm, depth, root_w):
        """A level of a rank that grows alone, on the host: per node, histograms in a thread's buffer and
        the split search in one compiled pass (no histogram array, no allreduce)."""
        s, m, K = self.s, self.m, self.K
        t0 = time.perf_counter()
        tot, ex = self._totals(el)
        tot = tot[:, 0, 0]
        order = perm[:, :m]
        lens = el.lens()
        # nodes that are leaves by their own numbers are not searched (decide() makes them leaves whatever their
        # candidates; with unlimited depth about half the nodes of a level are such leaves, pure mostly)
        if self.decide_kernel:
            st = _cpu_kernels.level_numbers(tot, ex, root_w, K, self.D, s.scales, s.y_tol, s.min_weight_fraction_leaf,
                                            s.min_samples_split, s.min_samples_leaf)
            skip = st["skip"]
        else:
            st = node_stats(self, tot, ex, root_w)
            skip = leaf_by_own_numbers(s, np.asarray(st["pure"]), np.asarray(ex[:, 0]), np.asarray(st["W"]),
                                       np.asarray(st["root_w"]), st["mwl"] is not None)
        cand = _cpu_kernels.node_candidates(self.cols, el.row, el.w, el.wy, s.y if K else None, el.starts[:-1], lens,
                                            order, self.B, tot, st["mwl"], s.scales[0], s.scales[1], K, bool(self.D),
                                            s.min_samples_leaf, skip=skip)
        self.stats["hist_elements"] += int(lens.sum()) * m
        self.stats["hist_nodes_built"] += len(lens)
        self.stats["hist_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        if self.decide_kernel:
            dec = _cpu_kernels.level_decisions(cand, order, st, ex, s.max_depth is not None and depth >= s.max_depth,
                                               s.min_impurity_decrease)
        else:
            dec = decide(self, choose(self.xp, cand), st, ex, order, depth)
        if m < self.F and dec["retry"].any():
            self._draw_further(el, None, ex, np.arange(len(lens)), perm, dec, depth, root_w)
        self.stats["split_s"] += time.perf_counter() - t0
        return dec

    def _head_level(self, el, trees, ranges, depth, root_w):
        """:meth:`_fused_level` on one thread (a tree thread's): its totals, numbers, feature orders, search and
        decisions in one compiled call (:func:`._cpu_kernels.level_head`), the same decisions; the orders of the
        nodes that are leaves by their own numbers are not drawn (nothing reads them)."""
        s, m, K = self.s, self.m, self.K
        t0 = time.perf_counter()
        tree_of, node_of = self._slots_of(trees, ranges)
        st, dec, ex, perm = _cpu_kernels.level_head(
            self.cols, el.row, el.w, el.wy, el.wy2, s.y if K else None, el.starts, stream_lead(0, STREAM_FEATURES),
            tree_of, node_of, self.F, m, self.B, K, self.D, s.scales, s.y_tol, s.min_weight_fraction_leaf,
            s.min_samples_split, s.min_samples_leaf, root_w, s.max_depth is not None and depth >= s.max_depth,
            s.min_impurity_decrease)
        lens = el.lens()
        self.stats["hist_elements"] += int(el.starts[-1] - el.starts[0]) * m
        self.stats["hist_nodes_built"] += len(lens)
        self.stats["hist_s"] += time.perf_counter() - t0
        if m < self.F and dec["retry"].any():
            t0 = time.perf_counter()
            self._draw_further(el, None, ex, np.arange(len(lens)), perm, dec, depth, root_w)
            self.stats["split_s"] += time.perf_counter() - t0
        return dec

    def _mixed_level(self, el, perm, depth, root_w):
        """A level of several host ranks (every node builds its drawn features, no subtraction): nodes with
        fewer rows than bins over all ranks gather their rows to every rank (one ``allgatherv`` of about
        ``m + 24`` bytes a row) and are searched by the fused kernel; the others reduce histograms.

        Sums are exact, so both ways give every rank the same decisions as reducing every histogram.
        """
        s, comm, m, B = self.s, self.s.comm, self.m, self.B
        lens = el.lens()
        total = comm.allreduce(lens.astype(np.float64))
        small = total < B
        parts = {}
        for sel in (np.nonzero(small)[0], np.nonzero(~small)[0]):
            if len(sel) == 0:
                continue
            rw = None if root_w is None else root_w[sel]
            if small[sel[0]]:
                parts[0] = (sel, _owner_search.decisions(self, el, perm[sel], sel, depth, rw, total[sel]))
                continue
            per_chunk = max(1, s.hist_bytes // (m * B * self.C * 8))
            for a in range(0, len(sel), per_chunk):
                built = sel[a:a + per_chunk]
                order = perm[built]
                t0 = time.perf_counter()
                hb, eb = self._build(el, built, order[:, :m])
                self.stats["hist_s"] += time.perf_counter() - t0
                self.stats["hist_nodes_built"] += len(built)
                hb, eb = self._reduce(hb, eb)
                t0 = time.perf_counter()
                rwc = None if rw is None else rw[a:a + per_chunk]
                dec = self._evaluate(hb, eb, order[:, :m], depth, rwc)
                if m < self.F and dec["retry"].any():
                    self._draw_further(el, None, eb, built, order, dec, depth, rwc)
                self.stats["split_s"] += time.perf_counter() - t0
                parts[1 + a] = (built, dec)
        S = len(lens)
        first = next(iter(parts.values()))[1]
        out = {key: np.empty((S,) + np.shape(v)[1:], dtype=np.asarray(v).dtype) for key, v in first.items()}
        for slots, dec in parts.values():
            for key in out:
                out[key][slots] = dec[key]
        return out

    def _draw_further(self, el, H, ex, slots, order, dec, depth, root_w):
        """Second pass for the nodes whose drawn features were all constant (scikit-learn's rule).

        Histograms of the remaining features, in the node's order, for those
        nodes only: taken from ``H`` when it holds every feature, else built
        (one more allreduce); the first non-constant feature is the only
        candidate.  ``dec`` is updated in place.
        """
        xp = self.xp
        sel = np.nonzero(dec["retry"])[0]
        sel_x = xp.asarray(sel)
        rest = order[sel_x, self.m:]
        if H is not None:
            Hr = xp.take_along_axis(H[sel_x], rest[:, :, None, None], axis=1)
            exr = ex[sel_x]
        else:
            _sync(xp)
            t0 = time.perf_counter()
            Hr, exr = self._build(el, slots[sel], rest)
            _sync(xp)
            self.stats["hist_s"] += time.perf_counter() - t0
            Hr, exr = self._reduce(Hr, exr)
        rw = None if root_w is None else root_w[sel]
        again = self._evaluate(Hr, exr, rest, depth, rw, first_only=True)
        dec.setdefault("missing_left", np.zeros(len(dec["leaf"]), dtype=bool))
        for key in ("leaf", "feature", "best_b", "below", "above", "decrease", "best_wl", "best_wr", "missing_left"):
            dec[key][sel] = again[key]

    def _record(self, levels, ranges, dec):
        """Append the level's nodes to ``levels``, number the children (breadth first); new ranges.

        All trees at once: a node's children are numbered after the nodes of
        its tree's current level, in the order of the split nodes.
        """
        if self.decide_kernel:
            return self._record_compiled(levels, ranges, dec)
        split = ~dec["leaf"]
        f = dec["feature"]
        thr = np.full(len(split), -2.0)
        if split.any():
            thr[split] = thresholds(self, f[split], dec["best_b"][split], dec["below"][split], dec["above"][split])
        T = len(ranges)
        k = ranges[:, 1] - ranges[:, 0]
        slot_tree = np.repeat(np.arange(T), k)
        csp = np.concatenate([[0], np.cumsum(split)])
        order = csp[1:] - 1 - csp[np.concatenate([[0], np.cumsum(k)[:-1]])][slot_tree]   # rank among the tree's splits
        left = np.where(split, ranges[slot_tree, 1] + 2 * order, -1).astype(np.int32)
        levels.append((slot_tree, {
            "feature": np.where(split, f, -2), "threshold": thr, "left": left,
            "right": np.where(split, left + 1, -1).astype(np.int32), "value": dec["value"],
            "n_node_samples": dec["counts"], "weighted_n_node_samples": dec["W"], "impurity": dec["impurity"],
            "decrease": np.where(split, dec["decrease"], 0.0),
            "missing_left": np.where(split, dec.get("missing_left", False), False)}))
        n_split = np.bincount(slot_tree, weights=split, minlength=T).astype(np.int64)
        return np.stack([ranges[:, 1], ranges[:, 1] + 2 * n_split], axis=1)

    def _record_compiled(self, levels, ranges, dec):
        """:meth:`_record` in one compiled call (:func:`._cpu_jit.record`): the same records."""
        from ._split import _bin_tables

        vals, edges, exact = _bin_tables(self)
        S = len(dec["leaf"])
        k = ranges[:, 1] - ranges[:, 0]
        ml = dec.get("missing_left")
        rec = {"feature": np.empty(S, dtype=np.int64), "threshold": np.empty(S), "left": np.empty(S, dtype=np.int32),
               "right": np.empty(S, dtype=np.int32), "decrease": np.empty(S), "missing_left": np.empty(S, dtype=bool)}
        n_split = np.empty(len(k), dtype=np.int64)
        _cpu_kernels.level_record(dec["leaf"], dec["feature"], dec["best_b"], dec["below"], dec["above"],
                                  dec["decrease"], ml, k, ranges[:, 1], vals, edges, exact, self.B, rec, n_split)
        rec.update(value=dec["value"], n_node_samples=dec["counts"], weighted_n_node_samples=dec["W"],
                   impurity=dec["impurity"])
        levels.append((np.repeat(np.arange(len(k)), k), rec))
        return np.stack([ranges[:, 1], ranges[:, 1] + 2 * n_split], axis=1)

    def _trees(self, levels, T):
        """Per-tree dicts of host arrays (breadth-first nodes) from the records of every level."""
        tid = np.concatenate([lv[0] for lv in levels])
        by_tree = np.argsort(tid, kind="stable")              # levels in order within each tree
        cuts = np.cumsum(np.bincount(tid, minlength=T))[:-1]
        cols = {key: np.split(np.concatenate([lv[1][key] for lv in levels])[by_tree].astype(dtype), cuts)
                for key, dtype in _RECORDS.items()}
        out = []
        for t in range(T):
            tree = {key: cols[key][t] for key in _RECORDS}
            tree["value"] = tree["value"].reshape(len(tree["feature"]), -1)
            inner = tree["feature"] >= 0
            tree["importances"] = np.bincount(tree["feature"][inner], weights=tree["decrease"][inner],
                                              minlength=self.F).astype(np.float64)
            out.append(tree)
        return out

    def _partition(self, el, dec):
        """Elements of the children of the split nodes, left child then right, in slot order (stable).

        Child ``2 i`` (left) and ``2 i + 1`` (right) of the ``i``-th split
        node are the slots of the next level, in the order the records number
        them; elements of leaves are dropped.
        """
        xp, s = self.xp, self.s
        split_h = ~dec["leaf"]
        n_split = int(split_h.sum())
        if n_split == 0 or el.row.shape[0] == 0:
            empty_i = xp.zeros(0, dtype=xp.int32)
            empty_f = xp.zeros(0, dtype=xp.float64)
            empty_y = xp.zeros((0, self.Q), dtype=xp.float64) if self.Q > 1 else empty_f
            return _Elements(empty_i, empty_i, empty_f, None if self.K else empty_y, None if self.K else empty_f,
                             np.zeros(2 * n_split + 1, dtype=np.int64))
        nan_left = self.nan_bin is not None and bool(np.any(dec.get("missing_left", False)))
        if self.kernel is not None and not nan_left:
            code = np.where(split_h, dec["feature"] * 256 + dec["best_b"], -1)
            (row, seg, w, wy, wy2), counts = self.kernel.partition_rows(s.Xb, el.seg, el.row, el.w, el.wy, el.wy2,
                                                                        code, el.starts)
            counts = counts[split_h].reshape(-1)
            return _Elements(row, seg, w, wy, wy2, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        if self.cpu and not nan_left:
            (row, w, wy, wy2), counts = _cpu_kernels.partition(self.cols, el.row, el.w, el.wy, el.wy2, el.starts,
                                                               np.where(split_h, dec["feature"], -1), dec["best_b"])
            counts = counts.reshape(-1)          # the slots of the elements: made if a later step asks
            return _Elements(row, None, w, wy, wy2, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        starts = el.starts
        seg = el.seg
        sp = xp.asarray(split_h)[seg]
        fx = xp.asarray(np.where(split_h, dec["feature"], 0).astype(np.int32))[seg]
        bx = xp.asarray(np.where(split_h, dec["best_b"], 0).astype(np.int32))[seg]
        bins = s.Xb[el.row, fx].astype(xp.int32)
        go = bins <= bx
        if nan_left:                                 # missing values to the left where the split learned so
            nb = np.where(split_h & dec["missing_left"], self.nan_bin[np.where(split_h, dec["feature"], 0)], -1)
            go |= bins == xp.asarray(nb.astype(np.int32))[seg]
        is_l = sp & go
        is_r = sp & ~go
        cl = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(is_l, dtype=xp.int64)])
        cr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(is_r, dtype=xp.int64)])
        st, en = xp.asarray(starts[:-1]), xp.asarray(starts[1:])
        l0, r0 = cl[st], cr[st]
        nl, nr = cl[en] - l0, cr[en] - r0
        lstart = l0 + r0
        rstart = lstart + nl
        pos = xp.where(is_l, lstart[seg] + cl[:-1] - l0[seg], rstart[seg] + cr[:-1] - r0[seg])
        kept = xp.nonzero(sp)[0]
        pos = pos[kept]
        n_new = int(kept.shape[0])
        rank = xp.asarray((np.cumsum(split_h) - 1).astype(np.int32))

        def moved(a, dtype):
            out = xp.empty((n_new,) + tuple(a.shape[1:]), dtype=dtype)
            out[pos] = a[kept]
            return out

        new_seg = moved((2 * rank[seg] + is_r.astype(xp.int32)).astype(xp.int32), xp.int32)
        counts = _host(xp, xp.stack([nl, nr], axis=1)[xp.asarray(np.nonzero(split_h)[0])]).reshape(-1)
        new_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return _Elements(moved(el.row, xp.int32), new_seg, moved(el.w, xp.float64),
                         None if self.K else moved(el.wy, xp.float64), None if self.K else moved(el.wy2, xp.float64),
                         new_starts)


#: Per-node records of a tree and their dtypes.
_RECORDS = {"feature": np.int32, "threshold": np.float64, "left": np.int32, "right": np.int32,
            "value": np.float64, "n_node_samples": np.int64, "weighted_n_node_samples": np.float64,
            "impurity": np.float64, "decrease": np.float64, "missing_left": np.uint8}
