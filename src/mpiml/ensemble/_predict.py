"""Using the fitted trees: the walk of the flat arrays (``apply``, the mean of the leaf values), the
out-of-bag estimates and the global R² (:class:`_ForestPrediction`, a mixin of the forests)."""

import warnings
from numbers import Integral

import numpy as np
import scipy.sparse as sp

from .._array import get_namespace, is_device_array, to_numpy
from ..utils._validation import validate_data
from ._flat import TREE_ARRAYS, apply_forest
from ._bootstrap import Bootstrap
from ._tree import ForestTreeClassifier, ForestTreeRegressor, TreeStructure

#: The forest parameters a tree of ``estimators_`` carries (scikit-learn's decision-tree parameters).
_TREE_PARAMS = ("criterion", "max_depth", "min_samples_split", "min_samples_leaf", "min_weight_fraction_leaf",
                "max_features", "max_leaf_nodes", "min_impurity_decrease", "ccp_alpha", "monotonic_cst")


def densified(X):
    """A validated shard as a dense array on its device (SciPy and cupyx sparse matrices are expanded)."""
    if sp.issparse(X) or (not hasattr(X, "__cuda_array_interface__") and hasattr(X, "toarray")):
        return X.toarray()
    return X


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



class _ForestPrediction:
    """Prediction, ``apply`` and the out-of-bag estimates of a fitted forest (flat tree arrays)."""

    def _set_oob_score_and_attributes(self, X, targets, counts, offset, seed, comm):
        """Out-of-bag predictions of the local rows and the global out-of-bag score.

        A row is out of bag for a tree when the tree's bootstrap did not draw it (global training: the draws
        of the fit, over every rank's rows, so the out-of-bag results do not depend on the rank count
        either); with ``training="local"`` every row of another rank is out of bag for the trees this rank
        did not grow.
        """
        xp = get_namespace(X)
        n, T = X.shape[0], self.n_estimators_
        K = self._n_values()
        glob = self.training == "global"
        if glob:
            mine = np.ones(T, dtype=bool)
        else:
            owners = [r for r in range(comm.size) if counts[r] > 0]
            mine = np.array([owners[t % len(owners)] == comm.rank for t in range(T)])
        boot = self._fitted_bootstrap(xp) if mine.any() else None
        keys = self._fitted_keys()
        sums = xp.zeros((n, K), dtype=xp.float64)
        seen = xp.zeros(n, dtype=xp.float64)
        a = self._walk_arrays(xp)
        offs = np.asarray(to_numpy(self.tree_offsets_), dtype=np.int64)
        for t in range(T):                         # one tree at a time over every local row
            lo, hi = int(offs[t]), int(offs[t + 1])
            leaves = apply_forest(X, a["feature"][lo:hi], a["threshold"][lo:hi], a["children_left"][lo:hi],
                                  a["children_right"][lo:hi], np.array([0, hi - lo]), xp,
                                  a["missing_left"][lo:hi])[:, 0]
            val = a["value"][lo:hi][leaves]                                  # (rows, K)
            if mine[t]:
                oob = (boot.counts([keys[t]])[0] == 0).astype(xp.float64)
                sums += val * oob[:, None]
                seen += oob
            else:
                sums += val
                seen += 1.0
        missing = float(xp.sum(seen == 0)) if n else 0.0
        if comm.size > 1:
            missing = float(comm.allreduce(np.array([missing]))[0])
        if missing > 0:
            warnings.warn("Some inputs do not have OOB scores. This probably means too few trees were used to "
                          "compute any reliable OOB estimates.", UserWarning)
        pred = sums / xp.where(seen > 0, seen, 1.0)[:, None]
        if self._is_classifier and self.n_outputs_ > 1:
            # binary outputs only (multilabel-indicator): (rows, 2, outputs); the score: rows with every output right
            Q = self.n_outputs_
            self.oob_decision_function_ = pred.reshape(n, Q, 2).transpose(0, 2, 1)
            codes = xp.argmax(self.oob_decision_function_, axis=1)
            truth = xp.asarray(self._joint_)[targets]
            if callable(self.oob_score):
                self.oob_score_ = float(self.oob_score(self._gathered(to_numpy(truth), comm),
                                                       self._gathered(to_numpy(codes), comm)))
            else:
                part = np.array([float(xp.sum((codes == truth).all(axis=1))), float(n)])
                tot = comm.allreduce(part) if comm.size > 1 else part
                self.oob_score_ = float(tot[0] / tot[1]) if tot[1] > 0 else 0.0
        elif self._is_classifier:
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
        elif self.n_outputs_ > 1:
            self.oob_prediction_ = pred
            yt, yp = to_numpy(targets), to_numpy(pred)
            if callable(self.oob_score):
                self.oob_score_ = float(self.oob_score(self._gathered(yt, comm), self._gathered(yp, comm)))
            else:                                        # the mean of the outputs' R² (scikit-learn's r2_score)
                self.oob_score_ = float(np.mean([_global_r2(yt[:, q], yp[:, q], np.ones(n), comm)
                                                 for q in range(self.n_outputs_)]))
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
        return {name: self._tree_array(name)[a:b] for name, _ in TREE_ARRAYS}

    def _tree_array(self, name):
        """A flat tree array; the missing-value sides of a model saved before they existed are all right (0)."""
        if name == "missing_left" and getattr(self, "tree_missing_left_", None) is None:
            return np.zeros(self.tree_feature_.shape[0], dtype=np.uint8)
        return getattr(self, f"tree_{name}_")

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
        X, xp = validate_data(self, X, comm=get_comm("self"), reset=False, accept_sparse=["csr", "csc"],
                              ensure_all_finite="allow-nan")
        return densified(X), xp

    def _walk_arrays(self, xp):
        """The flat tree arrays on ``xp`` (copied to or from the device when the model lives elsewhere)."""
        if xp is np:
            conv = to_numpy
        else:
            def conv(a):
                return a if is_device_array(a) else xp.asarray(a)
        arrays = {name: conv(self._tree_array(name)) for name in
                  ("feature", "threshold", "children_left", "children_right", "value", "missing_left")}
        arrays["offsets"] = conv(self.tree_offsets_)
        return arrays

    def _leaves(self, X, xp):
        a = self._walk_arrays(xp)
        return apply_forest(X, a["feature"], a["threshold"], a["children_left"], a["children_right"],
                            a["offsets"], xp, a["missing_left"]), a

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

    # ------------------------------------------------------------------ the trees as estimators
    def _fitted_keys(self):
        """The keys of the fitted trees (their ``random_state``; a model saved without them: those an int
        ``random_state`` gives, else those of 0)."""
        keys = getattr(self, "_tree_keys_", None)
        if keys is None:
            rs = self.random_state if isinstance(self.random_state, Integral) else 0
            keys = np.random.RandomState(rs).randint(np.iinfo(np.int32).max, size=self.n_estimators_)
        return np.asarray(to_numpy(keys), dtype=np.int64)

    def _fitted_bootstrap(self, xp):
        """The :class:`._bootstrap.Bootstrap` of the last fit over this rank's rows (no communication)."""
        n_draws, n_rows, state = self._bootstrap_
        offset = self._row_offset_ if self.training == "global" else 0
        w = self._sample_weight
        if w is not None:
            w = xp.asarray(to_numpy(w)) if xp is np else xp.asarray(w)
        return Bootstrap(xp, n_draws, n_rows, offset, self._n_local_rows_, weights=w, state=state)

    @property
    def estimators_(self):
        """The fitted trees as per-tree estimators (host copies; see :mod:`mpiml.ensemble._tree`)."""
        self._check_is_fitted()
        key = id(self.tree_offsets_)
        cached = getattr(self, "_estimators_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        cls = ForestTreeClassifier if self._is_classifier else ForestTreeRegressor
        params = {k: getattr(self, k) for k in _TREE_PARAMS}
        if self._is_classifier:
            params["class_weight"] = self.class_weight
        n_classes = self._output_classes()
        mf = self._max_features_drawn()
        out = []
        keys = self._fitted_keys()
        for t in range(self.n_estimators_):
            arrays = {k: to_numpy(v) for k, v in self.get_tree(t).items()}
            tree = cls(**params, random_state=int(keys[t]))
            tree._adopt(TreeStructure(arrays, self.n_features_in_, n_classes), self.n_features_in_,
                        self.n_outputs_, mf, fit_ranks=self._get_comm().size)
            if self._is_classifier:
                tree.classes_, tree.n_classes_ = self.classes_, self.n_classes_
            out.append(tree)
        self._estimators_cache = (key, out)
        return out

    def __len__(self):
        return self.n_estimators_

    def __getitem__(self, index):
        return self.estimators_[index]

    def __iter__(self):
        return iter(self.estimators_)

    @property
    def estimators_samples_(self):
        """Per tree, the indices of this rank's rows in its bootstrap, each repeated as often as drawn.

        The bootstrap draws exactly ``max_samples`` rows per tree over every rank (with probabilities
        proportional to the rows' weights): this rank's share of them, recomputed from the tree's key on
        each call (no communication).  Without bootstrap every row once.  Local training: the trees this
        rank did not grow are empty.
        """
        self._check_is_fitted()
        n, T = self._n_local_rows_, self.n_estimators_
        if not self.bootstrap:
            return [np.arange(n, dtype=np.int32) for _ in range(T)]
        counts = self._fit_row_counts_
        if self.training == "global":
            mine = np.ones(T, dtype=bool)
        else:
            owners = [r for r in range(len(counts)) if counts[r] > 0]
            rank = self._get_comm().rank
            mine = np.array([owners[t % len(owners)] == rank for t in range(T)])
        boot = self._fitted_bootstrap(np) if mine.any() else None
        keys = self._fitted_keys()
        rows = np.arange(n, dtype=np.int32)
        return [np.repeat(rows, boot.counts([keys[t]])[0].astype(np.int64)) if mine[t] else np.zeros(0, np.int32)
                for t in range(T)]

    def decision_path(self, X):
        """The nodes each local row passes through in every tree (no communication).

        Returns
        -------
        indicator : scipy.sparse.csr_matrix of shape (n_local_samples, n_nodes)
            Host matrix; column ``n_nodes_ptr[t] + i`` is node ``i`` of tree ``t``.
        n_nodes_ptr : ndarray of shape (n_estimators + 1,)
            Column ranges of the trees (``tree_offsets_`` on the host).
        """
        X, _ = self._local_X(X)
        X = to_numpy(X)
        paths = [tree.tree_.decision_path(X) for tree in self.estimators_]
        ptr = np.asarray(to_numpy(self.tree_offsets_), dtype=np.int64)
        indicator = sp.hstack(paths).tocsr() if paths else sp.csr_matrix((X.shape[0], 0))
        return indicator, ptr
