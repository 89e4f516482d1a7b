"""The shared fitting of the random forests: validation, the bins, the growers (global or local), the
pruning and the flat trees (:class:`_BaseForest`)."""

import math
import os
import time
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.utils.validation import column_or_1d

from .._array import get_namespace, is_device_array, to_numpy
from ..base import SPMDEstimator
from ..utils._param_validation import InvalidParameterError, Interval, RealNotInt, StrOptions
from ..utils._validation import check_random_state, row_counts, validate_data, validate_sample_weight
from ._flat import TREE_ARRAYS, pack_trees
from ._grower import GrowSpec, TreeGrower, power_of_two_below
from ._bootstrap import Bootstrap
from ._hist import FIXED_POINT_BITS, apply_bins, bin_edges, sample_rows
from ._predict import _ForestPrediction, densified
from ._prune import prune_best_first, prune_cost_complexity
from ._tree import ForestTreeClassifier, ForestTreeRegressor

#: Rows gathered (over all ranks, in expectation) to choose the bin edges.
BIN_SAMPLE_ROWS = 200_000
#: Host ranks split the bin edges' work by features from this many gathered sample entries on
#: (``MPIML_RF_SHARED_EDGES``: another count; the tests' small data sets set 0).
SHARED_EDGES_ENTRIES = 1 << 16


def _shared_edges(comm, local, max_bins, exact, missing):
    """:func:`bin_edges` of the ranks' samples ``local`` (this rank's rows) with each host rank sorting a share of
    the features (rank ``r``: features ``r, r + R, ...``, whose columns of every rank's sample it alone receives:
    one ``gatherv`` to each owner), then one ``allgather_obj`` of the edges.  Every rank sorted every column of
    the gathered sample before (0.3 s on one thread for 2e5 x 32 rows, the same on every rank however many
    there were), and every rank received all of it (51 MB a rank at 2e5 x 32 float64), not its columns alone.
    A column's edges depend on its values alone: the same edges as one rank's."""
    F, R, r = local.shape[1], comm.size, comm.rank
    mine = np.arange(r, F, R)
    part = ([], [])
    for j in range(min(R, F)):
        got = comm.gatherv(np.ascontiguousarray(local[:, j::R]), root=j)
        if j == r:
            part = bin_edges(np.ascontiguousarray(got), max_bins, exact=exact,
                             missing=None if missing is None else np.asarray(missing)[mine])
    edges, values = [None] * F, [None] * F
    for j, (e, v) in zip(range(R), comm.allgather_obj(part)):
        for f, ef, vf in zip(range(j, F, R), e, v):
            edges[f], values[f] = ef, vf
    return edges, values


FRIEDMAN_MSE_WARNING = ('Value `"friedman_mse"` for `criterion` is deprecated and will be removed in 1.11. It '
                        'maps to `"squared_error"` as both were always equivalent. Use '
                        '`criterion="squared_error"` to remove this warning.')
#: Bound of the trees' keys (scikit-learn's ``MAX_INT``).
MAX_INT = np.iinfo(np.int32).max
#: Target bins of ``criterion="absolute_error"`` (more distinct targets: quantile bins).
TARGET_BINS = 64

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


def _batch_elements(xp):
    """Trees x local rows grown together: ``MPIML_RF_BATCH_ELEMENTS``, else 2**28 on GPUs, 2**26 on hosts."""
    env = os.environ.get("MPIML_RF_BATCH_ELEMENTS")
    if env:
        return int(env)
    return 1 << 28 if xp is not np else 1 << 26


def _level_budgets(xp):
    """This rank's byte budgets of a level: ``(histograms per allreduce, kept histograms for subtraction)``.

    ``MPIML_RF_HIST_BYTES`` / ``MPIML_RF_SUB_BYTES`` when set; else, on GPUs, a sixteenth of the free device
    memory clipped to [256 MiB, 1 GiB] and a tenth of it (at least 1 GiB); 64 MiB and 1 GiB on hosts.  The
    ranks agree on the smallest (the budgets set the sequence of allreduces).  A level's split search costs
    about a hundred small GPU operations per histogram chunk whatever its size, so the larger chunk is what
    makes the regressor scale: 100 trees of depth 12 on 4e7 x 32, 4 x H100, 1 -> 4 GPUs 2.48x with 256 MiB,
    3.43x with 1 GiB (split 12.5 -> 4.5 ms a tree at 4 GPUs; ``scripts/device_pass.sh profile``).
    """
    hist = os.environ.get("MPIML_RF_HIST_BYTES")
    sub = os.environ.get("MPIML_RF_SUB_BYTES")
    if xp is np:
        return int(hist or 64 << 20), int(sub or 1 << 30)
    free = xp.cuda.runtime.memGetInfo()[0] if hist is None or sub is None else 0
    return (int(hist or min(1 << 30, max(256 << 20, free // 16))),
            int(sub or max(1 << 30, free // 10)))


def _agree_max(comm, values):
    """Element-wise maximum over ranks of a short list of floats (one small allreduce)."""
    arr = np.asarray(values, dtype=np.float64)
    return comm.allreduce(arr, op="max") if comm.size > 1 else arr


def _tree_matrix(trees, n_values):
    """Per-node rows of the :data:`TREE_ARRAYS` (``value`` as ``n_values`` columns), float64."""
    if not trees:
        return np.zeros((0, len(TREE_ARRAYS) - 1 + n_values))
    flat = pack_trees(trees, n_values)
    cols = [flat[name].reshape(len(flat["feature"]), -1).astype(np.float64) for name, _ in TREE_ARRAYS]
    return np.concatenate(cols, axis=1)


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
class _BaseForest(_ForestPrediction, SPMDEstimator):
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
        "max_samples": [None, Interval(RealNotInt, 0.0, None, closed="neither"),
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
    _saved_attributes = ("tree_offsets_",) + _TREE_ATTRS + ("feature_importances_", "n_outputs_", "_tree_keys_")

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
        criterion = self._criterion_name()
        if criterion == "friedman_mse":
            warnings.warn(FRIEDMAN_MSE_WARNING, FutureWarning)
            criterion = "squared_error"
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm, accept_sparse=["csr", "csc"], ensure_all_finite="allow-nan")
        X = densified(X)                  # bins are per-feature columns: sparse shards are expanded
        # features with missing values on some rank (one allreduce of a flag per feature): a bin of their own
        local_nan = (to_numpy(xp.isnan(X).any(axis=0)) if X.shape[0] else np.zeros(X.shape[1], dtype=bool))
        self._missing = _agree_max(comm, local_nan.astype(np.float64)) > 0 if X.shape[1] else local_nan
        targets = self._validate_y(y, X, comm)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=np.float64, only_non_negative=True, comm=comm)
        counts = row_counts(X.shape[0], comm)
        n_total, offset = int(counts.sum()), int(counts[:comm.rank].sum())
        # scikit-learn's combined weights: the sample weights times the expanded class weights (None: neither);
        # with bootstrap the rows are drawn in proportion to them, else the trees weigh the rows by them
        expanded = self._expanded_class_weight(targets, None if sample_weight is None else sw, xp, comm)
        if expanded is None:
            self._sample_weight = None if sample_weight is None else sw
        else:
            self._sample_weight = expanded if sample_weight is None else sw * expanded
        weight = sw if self._sample_weight is None else self._sample_weight
        self._n_samples_bootstrap = None
        mf = _n_features_to_draw(self.max_features, X.shape[1], name)
        old_trees = []
        if self.warm_start and getattr(self, "tree_offsets_", None) is not None:
            n_old = self.n_estimators_
            if self.n_estimators < n_old:
                raise ValueError(f"n_estimators={self.n_estimators} must be larger or equal to "
                                 f"len(estimators_)={n_old} when warm_start==True")
            if self.n_estimators == n_old:
                warnings.warn("Warm-start fitting without increasing n_estimators does not fit new trees.")
                if self.oob_score and not hasattr(self, "oob_score_"):
                    self._set_oob_score_and_attributes(X, targets, counts, offset, self._seed_, comm)
                return self
            old_trees = self._trees_as_dicts()
            old_keys = self._fitted_keys()
            # the seed of the first fit (a loaded model: its first tree's key, as the first fit took)
            seed = getattr(self, "_seed_", None)
            seed = int(old_keys[0]) if seed is None else seed
        else:
            old_keys, seed = [], None
        keys = self._draw_keys(comm, old_keys, self.n_estimators)
        if seed is None:
            seed = int(keys[0])     # the seed of the bins' sample: the first key, whatever n_estimators
        new_ids = list(range(len(old_trees), self.n_estimators))
        subsample = self._is_classifier and self.class_weight == "balanced_subsample" and self.bootstrap
        # absolute error: the trees grow on target bins (classes whose weights give the medians)
        grown = targets
        if criterion == "absolute_error":
            grown, self._y_values = self._target_bins(targets, xp, seed, offset, n_total, comm)
        glob = self.training == "global"
        self._fit_stats = {"training": self.training, "ranks": comm.size}
        # best-first growth of at most max_leaf_nodes leaves never goes deeper than max_leaf_nodes - 1
        depth = self.max_depth
        if self.max_leaf_nodes is not None:
            depth = self.max_leaf_nodes - 1 if depth is None else min(depth, self.max_leaf_nodes - 1)

        def grower_for(Xl, wl, tl, offset_, n_rows, comm_):
            # fixed-point scales from the largest weight and target over the rows this grower sees
            # agreed: the largest weight and |target|, whether some weight is not an integer, and the
            # smallest batch of elements and level budgets a rank asks for (they set the sequence of allreduces)
            local = [float(xp.max(wl)) if wl.shape[0] else 0.0,
                     float(xp.max(xp.abs(tl))) if (wl.shape[0] and not self._n_codes_) else 0.0,
                     float(bool(wl.shape[0]) and bool(xp.any(wl != xp.rint(wl)))),
                     -float(_batch_elements(xp)), *(-float(b) for b in _level_budgets(xp))]
            mw, my, fractional, batch, hist_bytes, sub_bytes = (
                _agree_max(comm_, local) if comm_ is not None else np.asarray(local)).tolist()
            boot = None
            if self.bootstrap:
                # the draws of these rows (every rank's, or this rank's alone): max_samples of the exact
                # total weight, so the number of draws does not depend on the rank count either
                boot = Bootstrap(xp, 0, n_rows, offset_, Xl.shape[0], weights=wl if drawn_weights else None,
                                 comm=comm_)
                n_draws = boot.m = self._n_draws(n_rows, boot.weight_sum())
                self._bootstrap_ = (n_draws, n_rows, boot.state)
                self._n_samples_bootstrap = n_draws
                # a tree weighs its rows by their draw counts (times the subsample's class weights): integers
                # summing to n_draws per tree
                mw, fractional, n_sum = 1.0, float(subsample), n_draws
            else:
                n_sum = n_rows
            budget = 2.0 ** FIXED_POINT_BITS / max(n_sum, 1)
            s_w = power_of_two_below(budget / mw) if mw > 0 else 1.0
            if not fractional and mw <= budget:
                s_w = 1.0          # integer weights are their own fixed point: small sums, 32-bit GPU atomics
            s_y = power_of_two_below(budget / (mw * my)) if mw > 0 and my > 0 else 1.0
            # the per-row extra: sum over outputs of y**2, or y log y (Poisson: below max(y log y, 1/e))
            y2 = (max(my * abs(math.log(my)), 1.0 / math.e) if criterion == "poisson" and my > 0
                  else my * my * self.n_outputs_)
            s_y2 = power_of_two_below(budget / (mw * y2)) if mw > 0 and my > 0 else 1.0
            t0 = time.perf_counter()
            edges, values = self._bins(Xl, xp, seed, offset_, n_rows, comm_)
            self._fit_stats["bins_s"] = time.perf_counter() - t0
            spec = GrowSpec(
                Xb=apply_bins(Xl, edges, xp), n_bins=[len(e) + 1 for e in edges], edges=edges, values=values,
                y=tl, weight=wl, n_classes=self._n_codes_,
                y_values=getattr(self, "_y_values", None) if criterion == "absolute_error" else None,
                n_outputs=self.n_outputs_,
                missing_bin=[len(e) if m else -1 for e, m in zip(edges, self._missing)],
                criterion=criterion, max_depth=depth,
                min_samples_split=max(_n_from(self.min_samples_split, n_rows), 2),
                min_samples_leaf=_n_from(self.min_samples_leaf, n_rows), max_features=mf,
                min_weight_fraction_leaf=self.min_weight_fraction_leaf,
                min_impurity_decrease=self.min_impurity_decrease, balanced_subsample=subsample,
                bootstrap=boot, tree_keys=keys, scales=(s_w, s_y, s_y2),
                max_local_rows=int(counts.max()) if comm_ is not None else Xl.shape[0], batch_elements=int(-batch),
                hist_bytes=int(-hist_bytes), sub_bytes=int(-sub_bytes),
                y_tol=max(np.finfo(np.float64).eps, 1e-9 * my * my), verbose=self.verbose, rank=comm.rank,
                pruned=self.max_leaf_nodes is not None or self.ccp_alpha > 0, comm=comm_, xp=xp)
            return TreeGrower(spec)

        drawn_weights = self._sample_weight is not None
        if glob:
            grower = grower_for(X, weight, grown, offset, n_total, comm)
            trees = grower.grow(new_ids)
            self._fit_stats.update(grower.stats)
            del grower                                   # it holds the binned rows and the row weights
        else:
            trees = self._fit_local(X, weight, grown, counts, comm, grower_for, new_ids)
        t_trees = time.perf_counter()
        trees = [self._prune(self._output_values(t), X.shape[1]) for t in trees]
        self._seed_, self._tree_keys_ = seed, keys
        self._n_local_rows_, self._row_offset_, self._fit_row_counts_ = X.shape[0], offset, counts
        self._set_trees(old_trees + trees, xp)
        self._fit_stats["set_trees_s"] = time.perf_counter() - t_trees
        if self.oob_score:
            t0 = time.perf_counter()
            self._set_oob_score_and_attributes(X, targets, counts, offset, seed, comm)
            self._fit_stats["oob_s"] = time.perf_counter() - t0
        self._fit_stats["fit_s"] = time.perf_counter() - t_start
        return self

    def _criterion_name(self):
        """``criterion`` as its name; a scikit-learn criterion object (``sklearn.tree._criterion.MSE``, ...,
        accepted by scikit-learn's trees) as the name scikit-learn's trees give its class."""
        c = self.criterion
        if isinstance(c, str):
            return c
        from sklearn.tree._classes import CRITERIA_CLF, CRITERIA_REG

        table = CRITERIA_CLF if self._is_classifier else CRITERIA_REG
        for name, cls in table.items():
            if type(c) is cls:
                return name
        raise ValueError(f"criterion={c!r}: of scikit-learn's criterion objects, {type(self).__name__} takes "
                         f"those of {sorted({cls.__name__ for cls in table.values()})} (as the criteria "
                         f"{sorted(table)}); got one of class {type(c).__name__}")

    def _n_draws(self, n_rows, weight_sum):
        """Bootstrap draws per tree (scikit-learn's): ``n_rows``, the ``max_samples`` count, or the fraction
        ``max_samples`` of the weight sum (of ``n_rows`` without weights), at least 1."""
        ms = self.max_samples
        if ms is None:
            return int(n_rows)
        if isinstance(ms, Integral):
            return int(ms)
        n = max(int(ms * weight_sum), 1)
        if n < max(10, n_rows ** (1 / 3)):
            what = (f"the number of samples is {n_rows} " if self._sample_weight is None
                    else f"the total sum of sample weights is {weight_sum} ")
            warnings.warn(f"Using the fractional value max_samples={ms} when {what}results in a low number ({n}) "
                          "of bootstrap samples. We recommend passing `max_samples` as an integer instead.")
        return n

    def _draw_keys(self, comm, old, n):
        """The keys of trees ``0 .. n - 1`` (their ``random_state``; every draw of a tree is keyed by its key),
        ``old`` those of the trees already fitted (warm start).

        scikit-learn's: successive ``randint(2**31 - 1)`` of ``check_random_state(random_state)``, the fitted
        trees' draws skipped, so the trees' ``random_state`` are those scikit-learn's forest gives its trees;
        rank 0's when ``random_state`` is not an int (None or a ``RandomState`` instance).
        """
        fixed = getattr(self, "_fixed_tree_keys", None)
        if fixed is not None:                      # a tree of ``estimators_`` refitted alone keeps its key
            return np.asarray(list(fixed)[:n], dtype=np.int64)
        rs = check_random_state(self.random_state)
        if len(old):
            rs.randint(MAX_INT, size=len(old))
        new = rs.randint(MAX_INT, size=n - len(old)).astype(np.int64)
        if comm.size > 1 and not isinstance(self.random_state, Integral):
            new = np.asarray(comm.bcast_obj(new.tolist()), dtype=np.int64)
        return np.concatenate([np.asarray(old, dtype=np.int64), new])

    def _validate_y_class_weight(self, y, sample_weight=None):
        """The step of ``fit`` that checks ``y`` and expands ``class_weight`` (scikit-learn's method of the same
        name): ``y`` of shape ``(n, n_outputs)`` or ``(n,)`` on this rank, agreed with every rank (the classes,
        the weighted class counts of ``"balanced"``).

        Returns
        -------
        y : ndarray
            Class codes (classification) or the float64 targets, one row per row of ``y``.
        expanded_class_weight : ndarray of shape (n,) or None
            Per-row class weights; None without ``class_weight`` or for ``"balanced_subsample"`` with
            bootstrap (computed per tree from its draws).
        """
        comm = self._get_comm()
        xp = get_namespace(y) if is_device_array(y) else np
        if getattr(y, "ndim", 1) == 2 and y.shape[1] == 1:
            y = y[:, 0]
        rows = xp.zeros((y.shape[0], 0))
        codes = self._validate_y(y, rows, comm)
        sw = None if sample_weight is None else xp.asarray(sample_weight, dtype=xp.float64)
        return codes, self._expanded_class_weight(codes, sw, xp, comm)

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
                                  "impurity", "missing_left")}}
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

    def _fit_local(self, X, weight, targets, counts, comm, grower_for, tree_ids):
        """cuML's scheme: each rank grows its share of the trees on its own rows; one allgather."""
        owners = [r for r in range(comm.size) if counts[r] > 0]
        mine = [t for t in tree_ids if owners[t % len(owners)] == comm.rank]
        trees = []
        if mine:
            grower = grower_for(X, weight, targets, 0, X.shape[0], None)
            trees = grower.grow(mine)
            self._fit_stats.update(grower.stats)
        if comm.size == 1:
            return trees
        n_values = self._n_codes_ if self._is_classifier else self.n_outputs_     # the grower's node values
        mat = _tree_matrix(trees, n_values)
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

    def _bins(self, X, xp, seed, offset, n_rows, comm):
        """Bin edges agreed by the ranks of ``comm`` (None: this rank alone); ``offset``: the first row's index."""
        keep = sample_rows(xp, seed, offset, X.shape[0], n_rows, BIN_SAMPLE_ROWS)
        sample = X if keep is None else X[keep]
        sample = np.ascontiguousarray(to_numpy(sample))
        missing = self._missing if self._missing.any() else None
        if comm is not None and comm.size > 1:
            least = int(os.environ.get("MPIML_RF_SHARED_EDGES", SHARED_EDGES_ENTRIES))
            entries = comm.allreduce(np.array([float(sample.shape[0] * sample.shape[1])]))[0]
            if xp is np and entries >= least and sample.shape[1] > 1:
                return _shared_edges(comm, sample, self.max_bins, keep is None, missing)
            sample = comm.allgatherv(sample)
        return bin_edges(sample, self.max_bins, exact=keep is None, xp=xp, missing=missing)

    def _target_bins(self, y, xp, seed, offset, n_total, comm):
        """Codes of the targets' bins and each bin's value, the same on every rank.

        At most :data:`TARGET_BINS` distinct targets over every rank: one bin per value (exact medians);
        otherwise bins between quantiles of a sample (as the features' bins) valued by the mean target of
        the sample's rows in them: the medians are then those of the bin values.
        """
        yh = np.asarray(to_numpy(y), dtype=np.float64)
        local = np.unique(yh)
        seen = [local.tolist()] if comm.size == 1 else comm.allgather_obj(
            local.tolist() if len(local) <= TARGET_BINS else None)
        if all(v is not None for v in seen):
            values = np.unique(np.concatenate([np.asarray(v, dtype=np.float64) for v in seen]))
            if len(values) <= TARGET_BINS:
                self._n_codes_ = len(values)
                return xp.asarray(np.searchsorted(values, yh).astype(np.int32)), values
        keep = sample_rows(np, seed, offset, len(yh), n_total, BIN_SAMPLE_ROWS)
        sample = np.ascontiguousarray((yh if keep is None else yh[keep])[:, None])
        if comm.size > 1:
            sample = comm.allgatherv(sample)
        edges = bin_edges(sample, TARGET_BINS, exact=False)[0][0]
        codes = np.searchsorted(edges, yh, side="left")
        K = len(edges) + 1
        # each bin's value: the mean of the sample's targets in it (the sample is in global row order on every
        # rank, so the sums, and the trees, do not depend on the rank count)
        s_codes = np.searchsorted(edges, sample[:, 0], side="left")
        n_in = np.bincount(s_codes, minlength=K)
        values = np.bincount(s_codes, weights=sample[:, 0], minlength=K) / np.where(n_in > 0, n_in, 1)
        self._n_codes_ = K
        return xp.asarray(codes.astype(np.int32)), values

    @property
    def feature_importances_(self):
        """Mean decrease in impurity per feature (normalised per tree, then in total)."""
        self._check_is_fitted()
        return self._feature_importances

    @feature_importances_.setter
    def feature_importances_(self, value):           # model files set it back
        self._feature_importances = value

    @property
    def estimator(self):
        """The template of the trees (scikit-learn's ``estimator``): an unfitted per-tree estimator."""
        return ForestTreeClassifier() if self._is_classifier else ForestTreeRegressor()

    estimator_ = estimator

    def _n_values(self):
        """Values per node of the fitted trees: the classes of every output, or one per regression output."""
        return int(sum(self._output_classes()))

    def _max_features_drawn(self):
        """Features examined per node (scikit-learn's ``max_features_``)."""
        return _n_features_to_draw(self.max_features, self.n_features_in_, type(self).__name__)

    def _set_trees(self, trees, xp):
        flat = pack_trees(trees, self._n_values())
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
        self._feature_importances = xp.asarray(mean)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.allow_nan = True
        tags.target_tags.multi_output = True
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
