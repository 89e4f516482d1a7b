"""Random forests over the rows of every rank (SPMD): global (exact, all rows) or local training."""

import math
import os
import time
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d

from .._array import get_namespace, is_device_array, to_numpy
from .._errors import DistributedInputError
from ..base import SPMDEstimator
from ..utils._param_validation import InvalidParameterError, Interval, RealNotInt, StrOptions
from ..utils._validation import agree_on_error, check_random_state, row_counts, validate_data, validate_sample_weight
from ._flat import TREE_ARRAYS, apply_forest, pack_trees
from ._grower import GrowSpec, TreeGrower, power_of_two_below
from ._hist import (FIXED_POINT_BITS, STREAM_BOOTSTRAP, apply_bins, bin_edges, hash_uniform, poisson_max,
                    poisson_table, sample_rows)
from ._prune import prune_best_first, prune_cost_complexity

__all__ = ["RandomForestClassifier", "RandomForestRegressor"]

#: Rows gathered (over all ranks, in expectation) to choose the bin edges.
BIN_SAMPLE_ROWS = 200_000

_TREE_ATTRS = tuple(f"tree_{name}_" for name, _ in TREE_ARRAYS)


# ---------------------------------------------------------------------- private helpers
def _n_from(value, n):
    """``min_samples_*`` as a number of rows: ints as given, fractions of ``n`` rounded up."""
    if isinstance(value, Integral):
        return int(value)
    return max(1, int(math.ceil(value * n)))


def _n_features_to_draw(max_features, n_features, name):
    if max_features is None:
        return n_features
    if isinstance(max_features, str):
        f = math.sqrt if max_features == "sqrt" else math.log2
        return max(1, int(f(n_features)))
    if isinstance(max_features, Integral):
        if max_features > n_features:
            raise ValueError(f"max_features must be in (0, n_features={n_features}] for {name}; "
                             f"got {max_features}")
        return int(max_features)
    return max(1, int(max_features * n_features))


def _global_r2(yt, pred, w, comm):
    """R² over the rows of every rank (one allgather of four floats per rank)."""
    W = float(w.sum())
    mean = float((w * yt).sum() / W) if W > 0 else 0.0
    part = np.array([W, mean, float((w * (yt - mean) ** 2).sum()), float((w * (yt - pred) ** 2).sum())])
    parts = comm.allgather(part[None, :]) if comm.size > 1 else part[None, :]
    W = parts[:, 0].sum()
    if W <= 0:
        return 0.0
    mean = (parts[:, 0] * parts[:, 1]).sum() / W
    ss_tot = parts[:, 2].sum() + (parts[:, 0] * (parts[:, 1] - mean) ** 2).sum()
    ss_res = parts[:, 3].sum()
    if ss_tot == 0:
        return 1.0 if ss_res == 0 else 0.0
    return float(1.0 - ss_res / ss_tot)


def _batch_elements(xp):
    """Trees x local rows grown together: ``MPIML_RF_BATCH_ELEMENTS``, else 2**28 on GPUs, 2**26 on hosts."""
    env = os.environ.get("MPIML_RF_BATCH_ELEMENTS")
    if env:
        return int(env)
    return 1 << 28 if xp is not np else 1 << 26


def _level_budgets(xp):
    """This rank's byte budgets of a level: ``(histograms per allreduce, kept histograms for subtraction)``.

    ``MPIML_RF_HIST_BYTES`` / ``MPIML_RF_SUB_BYTES`` when set; else 256 MiB and a tenth of the free device
    memory (at least 1 GiB) on GPUs, 64 MiB and 1 GiB on hosts.  The ranks agree on the smallest (the
    budgets set the sequence of allreduces).
    """
    hist = os.environ.get("MPIML_RF_HIST_BYTES")
    sub = os.environ.get("MPIML_RF_SUB_BYTES")
    if xp is np:
        return int(hist or 64 << 20), int(sub or 1 << 30)
    free = xp.cuda.runtime.memGetInfo()[0] if sub is None else 0
    return int(hist or 256 << 20), int(sub or max(1 << 30, free // 10))


def _agree_max(comm, values):
    """Element-wise maximum over ranks of a short list of floats (one small allreduce)."""
    arr = np.asarray(values, dtype=np.float64)
    return comm.allreduce(arr, op="max") if comm.size > 1 else arr


def _tree_matrix(trees, n_values):
    """Per-node rows ``[feature, threshold, left, right, n, weighted n, impurity, value...]`` (float64)."""
    flat = pack_trees(trees, n_values)
    cols = [flat[name].reshape(len(flat["feature"]), -1).astype(np.float64) for name, _ in TREE_ARRAYS]
    return np.concatenate(cols, axis=1) if cols else np.zeros((0, 7 + n_values))


def _trees_from_matrix(mat, counts, n_values):
    trees, start = [], 0
    names = [name for name, _ in TREE_ARRAYS]
    widths = [n_values if name == "value" else 1 for name in names]
    for c in counts:
        block = mat[start:start + c]
        start += c
        tree, col = {}, 0
        for name, width, (_, dtype) in zip(names, widths, TREE_ARRAYS):
            part = block[:, col:col + width]
            col += width
            key = {"children_left": "left", "children_right": "right"}.get(name, name)
            tree[key] = part.astype(dtype) if name == "value" else part[:, 0].astype(dtype)
        trees.append(tree)
    return trees


# ---------------------------------------------------------------------- the estimators
class _BaseForest(SPMDEstimator):
    """Shared fitting and prediction of :class:`RandomForestClassifier` and :class:`RandomForestRegressor`."""

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_estimators": [Interval(Integral, 1, None, closed="left")],
        "max_depth": [Interval(Integral, 1, None, closed="left"), None],
        "min_samples_split": [Interval(Integral, 2, None, closed="left"),
                              Interval(RealNotInt, 0.0, 1.0, closed="right")],
        "min_samples_leaf": [Interval(Integral, 1, None, closed="left"),
                             Interval(RealNotInt, 0.0, 1.0, closed="neither")],
        "min_weight_fraction_leaf": [Interval(Real, 0.0, 0.5, closed="both")],
        "max_features": [Interval(Integral, 1, None, closed="left"),
                         Interval(RealNotInt, 0.0, 1.0, closed="right"), StrOptions({"sqrt", "log2"}), None],
        "bootstrap": ["boolean"],
        "max_samples": [None, Interval(RealNotInt, 0.0, 1.0, closed="right"),
                        Interval(Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
        "n_jobs": [Integral, None],
        "verbose": ["verbose"],
        "max_leaf_nodes": [Interval(Integral, 2, None, closed="left"), None],
        "min_impurity_decrease": [Interval(Real, 0.0, None, closed="left")],
        "oob_score": ["boolean", callable],
        "warm_start": ["boolean"],
        "ccp_alpha": [Interval(Real, 0.0, None, closed="left")],
        "monotonic_cst": ["array-like", None],
        "max_bins": [Interval(Integral, 2, 256, closed="both")],
        "training": [StrOptions({"global", "local"})],
    }
    _saved_attributes = ("tree_offsets_",) + _TREE_ATTRS + ("feature_importances_", "n_outputs_")

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y, sample_weight=None):
        """Grow the forest on the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float32 and float64 are kept).
        y : array-like of shape (n_local_samples,)
            This rank's targets.
        sample_weight : array-like of shape (n_local_samples,), default=None
            Weights of this rank's rows.

        Returns
        -------
        self
        """
        t_start = time.perf_counter()
        self._validate_params()
        name = type(self).__name__
        if not self.bootstrap and self.max_samples is not None:
            raise ValueError("`max_sample` cannot be set if `bootstrap=False`. Either switch to `bootstrap=True` "
                             "or set `max_sample=None`.")
        if not self.bootstrap and self.oob_score:
            raise ValueError("Out of bag estimation only available if bootstrap=True")
        if self.monotonic_cst is not None:
            raise InvalidParameterError(
                f"The 'monotonic_cst' parameter of {name} must be None (monotonic constraints are not supported "
                f"by mpiml's forests). Got {self.monotonic_cst!r} instead.")
        criterion = self.criterion
        if criterion == "friedman_mse":
            warnings.warn('Value `"friedman_mse"` for `criterion` is deprecated and will be removed in 1.11. It '
                          'maps to `"squared_error"` as both were always equivalent. Use '
                          '`criterion="squared_error"` to remove this warning.', FutureWarning)
            criterion = "squared_error"
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm)
        targets = self._validate_y(y, X, comm)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=np.float64, only_non_negative=True, comm=comm)
        counts = row_counts(X.shape[0], comm)
        n_total, offset = int(counts.sum()), int(counts[:comm.rank].sum())
        if self.bootstrap and isinstance(self.max_samples, Integral) and self.max_samples > n_total:
            raise ValueError(f"`max_samples` must be <= n_samples={n_total} but got value {self.max_samples}")
        mf = _n_features_to_draw(self.max_features, X.shape[1], name)
        old_trees = []
        if self.warm_start and getattr(self, "tree_offsets_", None) is not None:
            n_old = self.n_estimators_
            if self.n_estimators < n_old:
                raise ValueError(f"n_estimators={self.n_estimators} must be larger or equal to "
                                 f"len(estimators_)={n_old} when warm_start==True")
            if self.n_estimators == n_old:
                warnings.warn("Warm-start fitting without increasing n_estimators does not fit new trees.")
                return self
            old_trees = self._trees_as_dicts()
            # the seed of the first fit (a loaded model draws it again: the same for an int random_state)
            seed = getattr(self, "_seed_", None)
            seed = self._seed(comm) if seed is None else seed
        else:
            seed = self._seed(comm)
        new_ids = list(range(len(old_trees), self.n_estimators))
        subsample = self._is_classifier and self.class_weight == "balanced_subsample" and self.bootstrap
        weight = sw * self._class_weights(targets, xp, comm)
        glob = self.training == "global"
        self._fit_stats = {"training": self.training, "ranks": comm.size}
        # best-first growth of at most max_leaf_nodes leaves never goes deeper than max_leaf_nodes - 1
        depth = self.max_depth
        if self.max_leaf_nodes is not None:
            depth = self.max_leaf_nodes - 1 if depth is None else min(depth, self.max_leaf_nodes - 1)

        def grower_for(Xl, wl, tl, index, n_rows, comm_):
            # fixed-point scales from the largest weight and target over the rows this grower sees
            lam = self._poisson_rate(n_rows)
            kmax = poisson_max(lam) if lam is not None else 1
            # agreed: the largest weight and |target|, whether some weight is not an integer, and the
            # smallest batch of elements and level budgets a rank asks for (they set the sequence of allreduces)
            local = [float(xp.max(wl)) if wl.shape[0] else 0.0,
                     float(xp.max(xp.abs(tl))) if (wl.shape[0] and not self._is_classifier) else 0.0,
                     float(subsample or (bool(wl.shape[0]) and bool(xp.any(wl != xp.rint(wl))))),
                     -float(_batch_elements(xp)), *(-float(b) for b in _level_budgets(xp))]
            mw, my, fractional, batch, hist_bytes, sub_bytes = (
                _agree_max(comm_, local) if comm_ is not None else np.asarray(local)).tolist()
            budget = 2.0 ** FIXED_POINT_BITS / (max(n_rows, 1) * kmax)
            s_w = power_of_two_below(budget / mw) if mw > 0 else 1.0
            if not fractional and mw <= budget:
                s_w = 1.0          # integer weights are their own fixed point: small sums, 32-bit GPU atomics
            s_y = power_of_two_below(budget / (mw * my)) if mw > 0 and my > 0 else 1.0
            s_y2 = power_of_two_below(budget / (mw * my * my)) if mw > 0 and my > 0 else 1.0
            t0 = time.perf_counter()
            edges, values = self._bins(Xl, xp, seed, index, n_rows, comm_)
            self._fit_stats["bins_s"] = time.perf_counter() - t0
            spec = GrowSpec(
                Xb=apply_bins(Xl, edges, xp), n_bins=[len(e) + 1 for e in edges], edges=edges, values=values,
                y=tl, weight=wl, row_index=index, n_classes=len(self.classes_) if self._is_classifier else 0,
                criterion=criterion, max_depth=depth,
                min_samples_split=max(_n_from(self.min_samples_split, n_rows), 2),
                min_samples_leaf=_n_from(self.min_samples_leaf, n_rows), max_features=mf,
                min_weight_fraction_leaf=self.min_weight_fraction_leaf,
                min_impurity_decrease=self.min_impurity_decrease, balanced_subsample=subsample,
                bootstrap_rate=lam, seed=seed, scales=(s_w, s_y, s_y2),
                max_local_rows=int(counts.max()) if comm_ is not None else Xl.shape[0], batch_elements=int(-batch),
                hist_bytes=int(-hist_bytes), sub_bytes=int(-sub_bytes),
                y_tol=max(np.finfo(np.float64).eps, 1e-9 * my * my), verbose=self.verbose, rank=comm.rank,
                comm=comm_, xp=xp)
            return TreeGrower(spec)

        if glob:
            index = xp.arange(offset, offset + X.shape[0], dtype=xp.int64)
            grower = grower_for(X, weight, targets, index, n_total, comm)
            trees = grower.grow(new_ids)
            self._fit_stats.update(grower.stats)
            del grower                                   # it holds the binned rows and the row weights
        else:
            trees = self._fit_local(X, weight, targets, counts, comm, grower_for, new_ids)
        trees = [self._prune(t, X.shape[1]) for t in trees]
        self._seed_ = seed
        self._set_trees(old_trees + trees, xp)
        if self.oob_score:
            t0 = time.perf_counter()
            self._set_oob_score(X, targets, counts, offset, seed, comm)
            self._fit_stats["oob_s"] = time.perf_counter() - t0
        self._fit_stats["fit_s"] = time.perf_counter() - t_start
        return self

    def _poisson_rate(self, n_rows):
        """The Poisson rate of the bootstrap weights (None without bootstrap)."""
        if not self.bootstrap:
            return None
        ms = self.max_samples
        if ms is None:
            return 1.0
        return ms / n_rows if isinstance(ms, Integral) else max(round(ms * n_rows), 1) / n_rows

    def _prune(self, tree, n_features):
        if self.max_leaf_nodes is not None:
            tree = prune_best_first(tree, self.max_leaf_nodes, n_features)
        if self.ccp_alpha > 0:
            tree = prune_cost_complexity(tree, self.ccp_alpha, n_features)
        return tree

    def _trees_as_dicts(self):
        """The fitted trees as the grower's per-tree dicts (host arrays), for warm starts."""
        imps = getattr(self, "_tree_importances", None)
        out = []
        for i in range(self.n_estimators_):
            t = {name: to_numpy(a) for name, a in self.get_tree(i).items()}
            tree = {"left": t["children_left"], "right": t["children_right"], **{
                k: t[k] for k in ("feature", "threshold", "value", "n_node_samples", "weighted_n_node_samples",
                                  "impurity")}}
            if imps is not None:
                tree["importances"] = imps[i]
            else:                      # a loaded model: the decrease of each split from the node impurities
                inner = tree["left"] >= 0
                w, imp = tree["weighted_n_node_samples"], tree["impurity"]
                l, r = tree["left"][inner], tree["right"][inner]
                dec = w[inner] * imp[inner] - w[l] * imp[l] - w[r] * imp[r]
                tree["importances"] = np.bincount(tree["feature"][inner], weights=dec, minlength=self.n_features_in_)
            out.append(tree)
        return out

    def _set_oob_score(self, X, targets, counts, offset, seed, comm):
        """Out-of-bag predictions of the local rows and the global out-of-bag score.

        A row is out of bag for a tree when its Poisson weight for that tree is
        0 (global training: keyed by the global row index, as in the fit); with
        ``training="local"`` every row of another rank is out of bag for the
        trees this rank did not grow.
        """
        xp = get_namespace(X)
        n, T = X.shape[0], self.n_estimators_
        K = len(self.classes_) if self._is_classifier else 1
        glob = self.training == "global"
        if glob:
            index, rate = xp.arange(offset, offset + n, dtype=xp.int64), self._poisson_rate(int(counts.sum()))
            mine = np.ones(T, dtype=bool)
        else:
            owners = [r for r in range(comm.size) if counts[r] > 0]
            index, rate = xp.arange(n, dtype=xp.int64), self._poisson_rate(max(n, 1))
            mine = np.array([owners[t % len(owners)] == comm.rank for t in range(T)])
        p0 = float(poisson_table(rate)[0])                # a weight is 0 when the draw is below P(0)
        sums = xp.zeros((n, K), dtype=xp.float64)
        seen = xp.zeros(n, dtype=xp.float64)
        a = self._walk_arrays(xp)
        tree_ids = xp.asarray(np.arange(T, dtype=np.int64))
        mine_x = xp.asarray(mine)
        step = max(1, (1 << 22) // max(T, 1))
        for s0 in range(0, n, step):
            Xb = X[s0:s0 + step]
            leaves = apply_forest(Xb, a["feature"], a["threshold"], a["children_left"], a["children_right"],
                                  a["offsets"], xp)
            u = hash_uniform(xp, seed, STREAM_BOOTSTRAP, tree_ids[None, :], index[s0:s0 + step, None])
            oob = xp.where(mine_x[None, :], u < p0, True)
            val = a["value"][leaves]                                       # (rows, trees, K)
            sums[s0:s0 + step] = (val * oob[:, :, None]).sum(axis=1)
            seen[s0:s0 + step] = oob.sum(axis=1)
        missing = float(xp.sum(seen == 0)) if n else 0.0
        if comm.size > 1:
            missing = float(comm.allreduce(np.array([missing]))[0])
        if missing > 0:
            warnings.warn("Some inputs do not have OOB scores. This probably means too few trees were used to "
                          "compute any reliable OOB estimates.", UserWarning)
        pred = sums / xp.where(seen > 0, seen, 1.0)[:, None]
        if self._is_classifier:
            self.oob_decision_function_ = pred
            codes = xp.argmax(pred, axis=1)
            if callable(self.oob_score):
                yt = self._gathered(self.classes_[to_numpy(targets)], comm)
                yp = self._gathered(self.classes_[to_numpy(codes)], comm)
                self.oob_score_ = float(self.oob_score(yt, yp))
            else:
                part = np.array([float(xp.sum(codes == targets)), float(n)])
                tot = comm.allreduce(part) if comm.size > 1 else part
                self.oob_score_ = float(tot[0] / tot[1]) if tot[1] > 0 else 0.0
        else:
            self.oob_prediction_ = pred[:, 0]
            if callable(self.oob_score):
                self.oob_score_ = float(self.oob_score(self._gathered(to_numpy(targets), comm),
                                                       self._gathered(to_numpy(pred[:, 0]), comm)))
            else:
                self.oob_score_ = _global_r2(to_numpy(targets), to_numpy(pred[:, 0]), np.ones(n), comm)

    @staticmethod
    def _gathered(a, comm):
        a = np.ascontiguousarray(np.asarray(a))
        return comm.allgatherv(a) if comm.size > 1 else a

    def _fit_local(self, X, weight, targets, counts, comm, grower_for, tree_ids):
        """cuML's scheme: each rank grows its share of the trees on its own rows; one allgather."""
        xp = get_namespace(X)
        owners = [r for r in range(comm.size) if counts[r] > 0]
        mine = [t for t in tree_ids if owners[t % len(owners)] == comm.rank]
        trees = []
        if mine:
            index = xp.arange(X.shape[0], dtype=xp.int64)
            grower = grower_for(X, weight, targets, index, X.shape[0], None)
            trees = grower.grow(mine)
            self._fit_stats.update(grower.stats)
        if comm.size == 1:
            return trees
        n_values = len(self.classes_) if self._is_classifier else 1
        mat = _tree_matrix(trees, n_values) if trees else np.zeros((0, 7 + n_values))
        t0 = time.perf_counter()
        everything = comm.allgatherv(np.ascontiguousarray(mat))
        meta = comm.allgather_obj((mine, [len(t["feature"]) for t in trees],
                                   [t["importances"].tolist() for t in trees]))
        self._fit_stats.update(allgather_s=time.perf_counter() - t0, allgather_bytes=int(everything.nbytes))
        by_id, start = {}, 0
        for ids, sizes, imps in meta:
            block = everything[start:start + sum(sizes)]
            start += sum(sizes)
            for tid, tree, imp in zip(ids, _trees_from_matrix(block, sizes, n_values), imps):
                tree["importances"] = np.asarray(imp)
                by_id[tid] = tree
        return [by_id[t] for t in tree_ids]

    def _bins(self, X, xp, seed, index, n_rows, comm):
        """Bin edges agreed by the ranks of ``comm`` (None: this rank alone)."""
        offset = int(index[0]) if index.shape[0] else 0
        keep = sample_rows(xp, seed, offset, X.shape[0], n_rows, BIN_SAMPLE_ROWS)
        sample = X if keep is None else X[keep]
        sample = np.ascontiguousarray(to_numpy(sample))
        if comm is not None and comm.size > 1:
            sample = comm.allgatherv(sample)
        return bin_edges(sample, self.max_bins, exact=keep is None, xp=xp)

    def _seed(self, comm):
        rs = check_random_state(self.random_state)
        seed = int(rs.randint(np.iinfo(np.int32).max))
        return comm.bcast_obj(seed) if comm.size > 1 else seed

    def _set_trees(self, trees, xp):
        n_values = len(self.classes_) if self._is_classifier else 1
        flat = pack_trees(trees, n_values)
        self.tree_offsets_ = xp.asarray(flat["offsets"])
        for name, _ in TREE_ARRAYS:
            setattr(self, f"tree_{name}_", xp.asarray(flat[name]))
        self._tree_importances = np.stack([np.asarray(t["importances"], dtype=np.float64) for t in trees]) \
            if trees else np.zeros((0, self.n_features_in_))
        imps = []
        for t in trees:
            if len(t["feature"]) > 1:
                total = t["importances"].sum()
                imps.append(t["importances"] / total if total > 0 else t["importances"])
        F = self.n_features_in_
        if imps:
            mean = np.mean(imps, axis=0)
            mean = mean / mean.sum() if mean.sum() > 0 else mean
        else:
            mean = np.zeros(F)
        self.feature_importances_ = xp.asarray(mean)
        self.n_outputs_ = 1

    # ------------------------------------------------------------------ using the trees
    def get_tree(self, i):
        """The arrays of tree ``i``: feature, threshold, children_left/right (tree-local), value, ...

        Returns
        -------
        dict of ndarray
            Keys ``feature``, ``threshold``, ``children_left``, ``children_right``,
            ``value``, ``n_node_samples``, ``weighted_n_node_samples``, ``impurity``.
        """
        self._check_is_fitted()
        a, b = int(self.tree_offsets_[i]), int(self.tree_offsets_[i + 1])
        return {name: getattr(self, f"tree_{name}_")[a:b] for name, _ in TREE_ARRAYS}

    @property
    def n_estimators_(self):
        """Number of fitted trees."""
        return int(self.tree_offsets_.shape[0]) - 1

    def _local_X(self, X):
        """Validate local rows without communicating; an empty shard is valid when there are several ranks."""
        from ..comm import get_comm

        self._check_is_fitted()
        shape = getattr(X, "shape", None)
        if shape is not None and len(shape) == 2 and shape[0] == 0 and self._get_comm().size > 1:
            if shape[1] != self.n_features_in_:
                raise ValueError(f"X has {shape[1]} features, but {type(self).__name__} is expecting "
                                 f"{self.n_features_in_} features as input.")
            xp = get_namespace(X)
            return xp.zeros((0, shape[1]), dtype=X.dtype if X.dtype.kind == "f" else xp.float64), xp
        return validate_data(self, X, comm=get_comm("self"), reset=False)

    def _walk_arrays(self, xp):
        """The flat tree arrays on ``xp`` (copied to or from the device when the model lives elsewhere)."""
        if xp is np:
            conv = to_numpy
        else:
            def conv(a):
                return a if is_device_array(a) else xp.asarray(a)
        arrays = {name: conv(getattr(self, f"tree_{name}_")) for name in
                  ("feature", "threshold", "children_left", "children_right", "value")}
        arrays["offsets"] = conv(self.tree_offsets_)
        return arrays

    def _leaves(self, X, xp):
        a = self._walk_arrays(xp)
        return apply_forest(X, a["feature"], a["threshold"], a["children_left"], a["children_right"],
                            a["offsets"], xp), a

    def apply(self, X):
        """Index of the leaf reached by each local row in each tree (tree-local node ids).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)

        Returns
        -------
        ndarray of shape (n_local_samples, n_estimators), int64
        """
        X, xp = self._local_X(X)
        leaves, a = self._leaves(X, xp)
        return leaves - a["offsets"][:-1][None, :].astype(xp.int64)

    def _mean_value(self, X):
        X, xp = self._local_X(X)
        leaves, a = self._leaves(X, xp)
        value = a["value"]
        out = xp.zeros((X.shape[0], value.shape[1]), dtype=xp.float64)
        for t in range(leaves.shape[1]):
            out += value[leaves[:, t]]
        return out / max(leaves.shape[1], 1), xp

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        tags.target_tags.multi_output = False
        return tags

    def _check_y_common(self, y, X):
        """``y`` as a 1-d array: numeric device arrays stay on their device (labels and checks run there)."""
        name = type(self).__name__
        if y is None:
            raise ValueError(f"{name} requires y to be passed, but the target y is None.")
        if is_device_array(y) and is_device_array(X) and y.dtype.kind in "biuf":
            if y.ndim == 2 and y.shape[1] == 1:
                warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape "
                              "of y to (n_samples, ), for example using ravel().", DataConversionWarning)
                y = y.ravel()
            if y.ndim != 1:
                raise ValueError(f"y should be a 1d array, got an array of shape {tuple(y.shape)} instead.")
        else:
            y = to_numpy(y) if is_device_array(y) else y
            y = column_or_1d(y, warn=True)
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                             f"[{X.shape[0]}, {y.shape[0]}]")
        return y


class RandomForestClassifier(ClassifierMixin, _BaseForest):
    """A random forest classifier trained on the rows of every rank (SPMD), on NumPy or CuPy shards.

    Parameters
    ----------
    n_estimators : int, default=100
        Number of trees.
    criterion : {"gini", "entropy", "log_loss"}, default="gini"
        Split quality ("entropy" and "log_loss" are the same: Shannon entropy).
    max_depth : int or None, default=None
        Maximum depth; None grows until leaves are pure or too small.
    min_samples_split : int or float, default=2
        Minimum rows (with non-zero weight) to split a node; a float is a
        fraction of the rows, rounded up.
    min_samples_leaf : int or float, default=1
        Minimum rows in each child of a split.
    min_weight_fraction_leaf : float, default=0.0
        Minimum weight in each child of a split, as a fraction of the tree's
        total weight (bootstrap weights included).
    max_features : {"sqrt", "log2"}, int, float or None, default="sqrt"
        Features drawn (without replacement) at each node.
    max_leaf_nodes : int or None, default=None
        Best-first growth with at most this many leaves (scikit-learn's rule; the
        tree is grown to depth ``max_leaf_nodes - 1`` and pruned best-first).
    min_impurity_decrease : float, default=0.0
        A node splits only when the weighted impurity decrease
        ``N_t / N * (impurity - N_L / N_t * left - N_R / N_t * right)`` reaches this.
    bootstrap : bool, default=True
        Weigh rows by Poisson draws (``global``: keyed by the global row index,
        so the forest does not depend on the number of ranks).
    max_samples : int, float or None, default=None
        With ``bootstrap``: expected rows per tree (the Poisson rate is
        ``max_samples / n_samples``); None is all rows.
    oob_score : bool or callable, default=False
        Score the forest on the out-of-bag rows (accuracy, or ``oob_score(y, pred)``).
    warm_start : bool, default=False
        Keep the fitted trees and grow only the new ones (those a single fit of
        ``n_estimators`` trees grows).
    ccp_alpha : float, default=0.0
        Minimal cost-complexity pruning of every tree.
    monotonic_cst : None
        Only None: monotonic constraints are refused (scikit-learn's error shape).
    class_weight : "balanced", "balanced_subsample", dict or None, default=None
        Weights of the classes; "balanced" uses the global class counts,
        ``n_samples / (n_classes * count)``; "balanced_subsample" the counts of
        each tree's bootstrap draws over every rank.
    random_state : int, RandomState instance or None, default=None
        Seed of the bootstrap and the feature draws (one seed agreed by all ranks).
    n_jobs : int or None, default=None
        Accepted for compatibility; the ranks are the parallelism.
    verbose : int, default=0
        Print one line per batch of trees on rank 0.
    max_bins : int, default=256
        Bins per feature (2 to 256).  Features with at most ``max_bins``
        distinct values get one bin per value and thresholds half way between
        values, as an exact tree would choose.
    training : {"global", "local"}, default="global"
        ``"global"``: every tree sees every row of every rank (histograms
        summed by allreduce); ``"local"``: each rank grows
        ``n_estimators / size`` trees on its own rows (cuML's scheme) and the
        trees are gathered.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels of every rank, sorted; host (NumPy), replicated.
    n_classes_ : int
        Number of classes.
    n_features_in_ : int
        Number of features.
    n_outputs_ : int
        1 (one target).
    oob_score_ : float
        With ``oob_score``: the out-of-bag score over every rank's rows (replicated).
    oob_decision_function_ : ndarray of shape (n_local_samples, n_classes)
        With ``oob_score``: out-of-bag class probabilities of this rank's rows (local).
    feature_importances_ : ndarray of shape (n_features,)
        Mean decrease in impurity, normalised per tree and in total (as
        scikit-learn); replicated, NumPy or CuPy like ``X``.
    tree_offsets_ : ndarray of shape (n_estimators + 1,)
        Tree ``t`` owns nodes ``tree_offsets_[t]:tree_offsets_[t + 1]`` of the
        flat node arrays below.
    tree_feature_, tree_threshold_, tree_children_left_, tree_children_right_ : ndarray of shape (n_nodes,)
        Split feature (-2 at leaves), threshold (go left when ``x <= threshold``),
        tree-local child indices (-1 at leaves).
    tree_value_ : ndarray of shape (n_nodes, n_classes)
        Weighted class fractions of every node.
    tree_n_node_samples_, tree_weighted_n_node_samples_, tree_impurity_ : ndarray of shape (n_nodes,)
        Rows (with non-zero weight), their total weight, and the impurity of every node.

    All fitted attributes are replicated on every rank; :meth:`get_tree` returns
    one tree's arrays.

    Notes
    -----
    Per fit: the validation agreement (``allgather_obj`` of small tuples), the
    labels of every rank (``allgather_obj``), row counts (allgather), one
    allreduce of two floats (largest weight and target), the seed (bcast), and
    the bin sample (``allgatherv`` of at most ~200 000 rows in total).

    ``training="global"``: per tree level, **one** allreduce of the float64
    histograms of every open node of a batch of trees (all trees whose row
    state fits in memory), ``nodes x max_features x bins x n_classes x 8``
    bytes (one more channel when ``min_samples_leaf > 1``) plus 8 bytes per
    node; one more allreduce on levels where some node's drawn features are
    all constant; levels larger than ``MPIML_RF_HIST_BYTES`` (64 MiB, GPUs 256 MiB) are cut
    into several allreduces.  Histograms are fixed-point integers in float64, so
    every rank and every rank count sees the same sums and grows the same trees.

    ``training="local"``: no communication while growing; one ``allgatherv``
    of the trees (about ``(8 + n_classes) x 8`` bytes per node) and one
    ``allgather_obj`` of their sizes.

    :meth:`predict`, :meth:`predict_proba` and :meth:`apply` act on local rows
    and communicate nothing; :meth:`score` is global (one allreduce of two floats).
    """

    _is_classifier = True
    _parameter_constraints = {
        **_BaseForest._parameter_constraints,
        "criterion": [StrOptions({"gini", "entropy", "log_loss"})],
        "class_weight": [StrOptions({"balanced", "balanced_subsample"}), dict, None],
    }
    _saved_attributes = _BaseForest._saved_attributes + ("classes_", "n_classes_")

    def __init__(self, n_estimators=100, *, criterion="gini", max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_weight_fraction_leaf=0.0, max_features="sqrt", max_leaf_nodes=None,
                 min_impurity_decrease=0.0, bootstrap=True, oob_score=False, n_jobs=None, random_state=None,
                 verbose=0, warm_start=False, class_weight=None, ccp_alpha=0.0, max_samples=None, monotonic_cst=None,
                 max_bins=256, training="global", comm=None):
        self.n_estimators = n_estimators
        self.criterion = criterion
        self.max_depth = max_depth
        self.min_samples_split = min_samples_split
        self.min_samples_leaf = min_samples_leaf
        self.min_weight_fraction_leaf = min_weight_fraction_leaf
        self.max_features = max_features
        self.max_leaf_nodes = max_leaf_nodes
        self.min_impurity_decrease = min_impurity_decrease
        self.bootstrap = bootstrap
        self.oob_score = oob_score
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.class_weight = class_weight
        self.ccp_alpha = ccp_alpha
        self.max_samples = max_samples
        self.monotonic_cst = monotonic_cst
        self.max_bins = max_bins
        self.training = training
        self.comm = comm

    def _validate_y(self, y, X, comm):
        """Local label checks, one agreement on the classes of every rank; returns the codes on X's device."""
        error, labels, kind, inverse = None, None, None, None
        try:
            y = self._check_y_common(y, X)
            ns = get_namespace(y) if is_device_array(y) else np
            if y.dtype.kind == "f" and y.size and not bool(ns.isfinite(y).all()):
                raise ValueError("Input y contains NaN." if bool(ns.isnan(y).any()) else
                                 "Input y contains infinity or a value too large for dtype('float64').")
            if y.size and y.dtype.kind == "O":
                check_classification_targets(y)          # mixed objects: scikit-learn's message
            if ns is np:
                labels, inverse = np.unique(y, return_inverse=True)
            else:
                labels = to_numpy(ns.unique(y))
            if y.size:
                # on the distinct labels: the same verdict as on y for 1-d targets, without a pass over y
                check_classification_targets(labels)
            kind = "str" if labels.dtype.kind in "UOS" else "num"
            if labels.dtype.kind == "O" and not all(isinstance(v, str) for v in labels.tolist()):
                kind = "num"
        except Exception as exc:
            error = exc
        if comm.size == 1:
            if error is not None:
                raise error
            classes = labels
        else:
            gathered = comm.allgather_obj((None if error is None else str(error), kind,
                                           None if labels is None else labels.tolist()))
            if any(g[0] for g in gathered):
                agree_on_error(comm, error, prefix="Invalid input y")
            kinds = {g[1] for g in gathered if g[2]}
            if len(kinds) > 1:
                strs = [r for r, g in enumerate(gathered) if g[2] and g[1] == "str"]
                nums = [r for r, g in enumerate(gathered) if g[2] and g[1] == "num"]
                raise DistributedInputError(f"y holds string labels on rank(s) {strs} but numbers on rank(s) "
                                            f"{nums}; every rank must use labels of one kind.")
            merged = [v for g in gathered if g[2] for v in g[2]]
            classes = np.unique(np.asarray(merged, dtype=object if kinds == {"str"} else None))
            if kinds == {"str"}:
                classes = classes.astype(str)
        self.classes_ = classes
        self.n_classes_ = len(classes)
        xp = get_namespace(X)
        if is_device_array(y):                           # numeric labels on the device: codes by bisection
            return xp.searchsorted(xp.asarray(classes), y).astype(xp.int32) if y.size else xp.zeros(0, xp.int32)
        codes = np.zeros(0, dtype=np.int32)
        if y.size:
            lookup = {label: i for i, label in enumerate(classes.tolist())}
            codes = np.array([lookup[label] for label in labels.tolist()], dtype=np.int32)[inverse.ravel()]
        return xp.asarray(codes)

    def _class_weights(self, codes, xp, comm):
        cw = self.class_weight
        if cw is None:
            return 1.0
        K = len(self.classes_)
        if cw == "balanced_subsample" and self.bootstrap:
            return 1.0                                   # per tree, from its bootstrap counts (the grower)
        if isinstance(cw, str):  # "balanced" (and "balanced_subsample" without bootstrap): global class counts
            local = np.bincount(to_numpy(codes), minlength=K).astype(np.float64)
            total = comm.allreduce(local) if comm.size > 1 else local
            per_class = total.sum() / (K * np.where(total > 0, total, 1))
        else:
            per_class = np.ones(K)
            for label, w in cw.items():
                hit = np.nonzero(self.classes_ == label)[0]
                if hit.size == 0:
                    raise ValueError(f"The classes, {[label]}, are not in class_weight")
                per_class[hit[0]] = w
        return xp.asarray(per_class)[codes]

    def predict_proba(self, X):
        """Mean over trees of the class fractions of the leaf each local row reaches (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples, n_classes), float64
        """
        proba, _ = self._mean_value(X)
        return proba

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        proba = self.predict_proba(X)
        xp = get_namespace(proba)
        with np.errstate(divide="ignore"):
            return xp.log(proba)

    def predict(self, X):
        """The most probable class of each local row (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,)
            Labels from ``classes_`` (on the device of ``X`` for numeric labels).
        """
        proba, xp = self._mean_value(X)
        idx = xp.argmax(proba, axis=1)
        if xp is not np and self.classes_.dtype.kind in "biuf":
            return xp.asarray(self.classes_)[idx]
        return self.classes_[to_numpy(idx)]

    def score(self, X, y, sample_weight=None):
        """Accuracy over the rows of every rank (one allreduce of two floats).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
        y : array-like of shape (n_local_samples,)
        sample_weight : array-like of shape (n_local_samples,), default=None

        Returns
        -------
        float
        """
        comm = self._get_comm()
        error, part = None, np.zeros(2)
        try:
            pred = to_numpy(self.predict(X))
            yt = to_numpy(y) if is_device_array(y) else np.asarray(y)
            yt = column_or_1d(yt)
            w = np.ones(len(yt)) if sample_weight is None else np.asarray(to_numpy(sample_weight), dtype=np.float64)
            if len(yt) != len(pred) or len(w) != len(pred):
                raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                 f"[{len(pred)}, {len(yt)}]")
            part = np.array([float(np.sum(w * (pred == yt))), float(np.sum(w))])
        except Exception as exc:
            error = exc
        agree_on_error(comm, error, prefix="Cannot score")
        total = comm.allreduce(part) if comm.size > 1 else part
        return float(total[0] / total[1]) if total[1] > 0 else 0.0


class RandomForestRegressor(RegressorMixin, _BaseForest):
    """A random forest regressor trained on the rows of every rank (SPMD), on NumPy or CuPy shards.

    Parameters
    ----------
    n_estimators : int, default=100
        Number of trees.
    criterion : {"squared_error", "friedman_mse"}, default="squared_error"
        Split quality: reduction of the weighted variance ("friedman_mse" is the
        same, with scikit-learn's deprecation warning).
    max_depth : int or None, default=None
        Maximum depth; None grows until leaves are pure or too small.
    min_samples_split : int or float, default=2
        Minimum rows to split a node (a float is a fraction of the rows).
    min_samples_leaf : int or float, default=1
        Minimum rows in each child of a split.
    min_weight_fraction_leaf : float, default=0.0
        Minimum weight in each child of a split, as a fraction of the tree's
        total weight (bootstrap weights included).
    max_features : {"sqrt", "log2"}, int, float or None, default=1.0
        Features drawn at each node (1.0: all, scikit-learn's default).
    max_leaf_nodes, min_impurity_decrease, oob_score, warm_start, ccp_alpha, monotonic_cst
        As in :class:`RandomForestClassifier` (the out-of-bag score is R²).
    bootstrap : bool, default=True
        Weigh rows by Poisson draws keyed by the global row index.
    max_samples : int, float or None, default=None
        With ``bootstrap``: expected rows per tree.
    random_state : int, RandomState instance or None, default=None
        Seed of the bootstrap and the feature draws.
    n_jobs : int or None, default=None
        Accepted for compatibility.
    verbose : int, default=0
        Print one line per batch of trees on rank 0.
    max_bins : int, default=256
        Bins per feature (2 to 256).
    training : {"global", "local"}, default="global"
        See :class:`RandomForestClassifier`.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    n_features_in_, n_outputs_, feature_importances_, tree_offsets_, tree_feature_, tree_threshold_, \
tree_children_left_, tree_children_right_, tree_n_node_samples_, tree_weighted_n_node_samples_, tree_impurity_
        As in :class:`RandomForestClassifier`; replicated on every rank.
    tree_value_ : ndarray of shape (n_nodes, 1)
        Weighted mean target of every node.
    oob_score_, oob_prediction_ : float, ndarray of shape (n_local_samples,)
        With ``oob_score``: global out-of-bag R² (replicated) and this rank's out-of-bag predictions.

    Notes
    -----
    As :class:`RandomForestClassifier`, with two histogram channels
    (weight, weight * y; a row count too when ``min_samples_leaf > 1``) and
    two values per node (rows, weight * y**2) in the per-level allreduce.  :meth:`score` is global: one ``allgather`` of four
    floats per rank (weight, mean, centred sum of squares, residual sum of squares).
    """

    _is_classifier = False
    _parameter_constraints = {
        **_BaseForest._parameter_constraints,
        "criterion": [StrOptions({"squared_error", "friedman_mse"})],
    }

    def __init__(self, n_estimators=100, *, criterion="squared_error", max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_weight_fraction_leaf=0.0, max_features=1.0, max_leaf_nodes=None,
                 min_impurity_decrease=0.0, bootstrap=True, oob_score=False, n_jobs=None, random_state=None,
                 verbose=0, warm_start=False, ccp_alpha=0.0, max_samples=None, monotonic_cst=None, max_bins=256,
                 training="global", comm=None):
        self.n_estimators = n_estimators
        self.criterion = criterion
        self.max_depth = max_depth
        self.min_samples_split = min_samples_split
        self.min_samples_leaf = min_samples_leaf
        self.min_weight_fraction_leaf = min_weight_fraction_leaf
        self.max_features = max_features
        self.max_leaf_nodes = max_leaf_nodes
        self.min_impurity_decrease = min_impurity_decrease
        self.bootstrap = bootstrap
        self.oob_score = oob_score
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.ccp_alpha = ccp_alpha
        self.max_samples = max_samples
        self.monotonic_cst = monotonic_cst
        self.max_bins = max_bins
        self.training = training
        self.comm = comm

    def _validate_y(self, y, X, comm):
        error, yf = None, None
        try:
            y = self._check_y_common(y, X)
            ns = get_namespace(y) if is_device_array(y) else np
            try:
                yf = y.astype(ns.float64) if ns is not np else np.asarray(y, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"y must hold numbers for {type(self).__name__}; got dtype {y.dtype}") from None
            if yf.size and not bool(ns.isfinite(yf).all()):
                raise ValueError("Input y contains NaN." if bool(ns.isnan(yf).any()) else
                                 "Input y contains infinity or a value too large for dtype('float64').")
        except Exception as exc:
            error = exc
        agree_on_error(comm, error, prefix="Invalid input y")
        return get_namespace(X).asarray(yf)

    def _class_weights(self, targets, xp, comm):
        return 1.0

    def predict(self, X):
        """Mean over trees of the leaf values reached by each local row (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,), float64
        """
        value, _ = self._mean_value(X)
        return value[:, 0]

    def score(self, X, y, sample_weight=None):
        """R² over the rows of every rank (one allgather of four floats per rank).

        Returns
        -------
        float
        """
        comm = self._get_comm()
        error, part = None, np.zeros(4)
        try:
            pred = to_numpy(self.predict(X))
            yt = column_or_1d(to_numpy(y) if is_device_array(y) else np.asarray(y)).astype(np.float64)
            w = np.ones(len(yt)) if sample_weight is None else np.asarray(to_numpy(sample_weight), dtype=np.float64)
            if len(yt) != len(pred) or len(w) != len(pred):
                raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                 f"[{len(pred)}, {len(yt)}]")
        except Exception as exc:
            error = exc
        agree_on_error(comm, error, prefix="Cannot score")
        if error is not None:                            # pragma: no cover - agree_on_error raised
            raise error
        return _global_r2(yt, pred, w, comm)
