"""One tree of a fitted forest as a scikit-learn-style estimator (the items of ``estimators_``).

A forest keeps its trees in flat arrays (:mod:`._flat`).  ``forest.estimators_[t]`` is a
:class:`ForestTreeClassifier` or :class:`ForestTreeRegressor` holding tree ``t``'s slices as
host (NumPy) arrays, with scikit-learn's decision-tree surface: the forest's parameters,
``tree_`` (:class:`TreeStructure`: ``node_count``, ``children_left``, ``feature``,
``threshold``, ``value`` of shape ``(node_count, n_outputs, max_n_classes)``, ...,
``apply``, ``predict``, ``decision_path``), ``predict``, ``predict_proba``, ``apply``,
``decision_path``, ``get_depth``, ``get_n_leaves`` and ``feature_importances_``.  Nothing
is communicated: a tree acts on the rows it is given.

Nodes are numbered breadth-first (scikit-learn numbers them depth-first); a row goes left
when ``x[feature] <= threshold``, and a missing value (NaN) goes to the side the split
learned (``missing_go_to_left``).
"""

from numbers import Integral

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from .._array import to_numpy
from ..comm import get_comm
from ..utils._validation import validate_data

__all__ = ["TreeStructure", "ForestTreeClassifier", "ForestTreeRegressor", "tree_depths"]


def tree_depths(left, right):
    """Depth of every node of one tree (children have larger ids than their parent: breadth-first)."""
    n = len(left)
    depth = np.zeros(n, dtype=np.int64)
    frontier = np.zeros(1, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    d = 0
    while frontier.size:
        depth[frontier] = d
        inner = frontier[left[frontier] >= 0]
        frontier = np.concatenate([left[inner], right[inner]]).astype(np.int64)
        d += 1
    return depth


def _dense_host(X):
    if sp.issparse(X):
        X = X.toarray()
    elif hasattr(X, "toarray") and not isinstance(X, np.ndarray):     # cupyx.scipy.sparse
        X = X.toarray()
    return np.asarray(to_numpy(X) if not isinstance(X, np.ndarray) else X, dtype=np.float64)


class TreeStructure:
    """The arrays of one fitted tree under scikit-learn's ``tree_`` names (host NumPy, read only use).

    Attributes
    ----------
    node_count, capacity, n_leaves, max_depth, n_features, n_outputs, max_n_classes : int
    n_classes : ndarray of shape (n_outputs,)
        Classes per output (1 for regression).
    children_left, children_right : ndarray of shape (node_count,)
        Child ids, -1 at leaves.
    feature : ndarray of shape (node_count,)
        Split feature, -2 at leaves.
    threshold : ndarray of shape (node_count,)
        Go left when ``x[feature] <= threshold``; -2 at leaves.
    missing_go_to_left : ndarray of shape (node_count,), uint8
        Side of a missing value (NaN) at each split.
    value : ndarray of shape (node_count, n_outputs, max_n_classes)
        Weighted class fractions (classification) or mean targets (regression).
    impurity, n_node_samples, weighted_n_node_samples : ndarray of shape (node_count,)
    """

    def __init__(self, arrays, n_features, n_classes):
        self.children_left = np.asarray(arrays["children_left"], dtype=np.intp)
        self.children_right = np.asarray(arrays["children_right"], dtype=np.intp)
        self.feature = np.asarray(arrays["feature"], dtype=np.intp)
        leaf = self.children_left < 0
        self.threshold = np.where(leaf, -2.0, np.asarray(arrays["threshold"], dtype=np.float64))
        mleft = arrays.get("missing_left")
        self.missing_go_to_left = (np.zeros(len(leaf), dtype=np.uint8) if mleft is None
                                   else np.asarray(mleft, dtype=np.uint8))
        self.impurity = np.asarray(arrays["impurity"], dtype=np.float64)
        self.n_node_samples = np.asarray(arrays["n_node_samples"], dtype=np.intp)
        self.weighted_n_node_samples = np.asarray(arrays["weighted_n_node_samples"], dtype=np.float64)
        self.n_classes = np.asarray(n_classes, dtype=np.intp)
        self.n_outputs = len(self.n_classes)
        self.max_n_classes = int(self.n_classes.max())
        flat = np.asarray(arrays["value"], dtype=np.float64).reshape(len(leaf), -1)
        value = np.zeros((len(leaf), self.n_outputs, self.max_n_classes))
        start = 0
        for o, k in enumerate(self.n_classes):
            value[:, o, :k] = flat[:, start:start + k]
            start += k
        self.value = value
        self.node_count = self.capacity = len(leaf)
        self.n_leaves = int(leaf.sum())
        self.n_features = int(n_features)
        self.max_depth = int(tree_depths(self.children_left, self.children_right).max()) if len(leaf) else 0

    def _check(self, X):
        X = _dense_host(X)
        if X.ndim != 2:
            raise ValueError(f"Expected a 2D array of shape (n_samples, {self.n_features}), got {X.ndim}D "
                             "instead. Reshape your data either using array.reshape(-1, 1) if your data has "
                             "a single feature or array.reshape(1, -1) if it contains a single sample.")
        if X.shape[1] != self.n_features:
            raise ValueError(f"X has {X.shape[1]} features, but the tree is expecting {self.n_features} "
                             "features as input.")
        return X

    def _step(self, X, node, rows):
        f = self.feature[node]
        x = X[rows, f]
        go_left = np.where(np.isnan(x), self.missing_go_to_left[node] == 1, x <= self.threshold[node])
        return np.where(go_left, self.children_left[node], self.children_right[node])

    def apply(self, X):
        """Leaf id reached by every row of ``X``."""
        X = self._check(X)
        node = np.zeros(X.shape[0], dtype=np.intp)
        active = np.arange(X.shape[0])
        while active.size:
            inner = self.children_left[node[active]] >= 0
            active = active[inner]
            if not active.size:
                break
            node[active] = self._step(X, node[active], active)
        return node

    def decision_path(self, X):
        """CSR indicator ``(n_samples, node_count)`` of the nodes every row passes through."""
        X = self._check(X)
        n = X.shape[0]
        node = np.zeros(n, dtype=np.intp)
        rows_parts, node_parts = [np.arange(n)], [node.copy()]
        active = np.arange(n)
        while active.size:
            active = active[self.children_left[node[active]] >= 0]
            if not active.size:
                break
            node[active] = self._step(X, node[active], active)
            rows_parts.append(active)
            node_parts.append(node[active].copy())
        rows, cols = np.concatenate(rows_parts), np.concatenate(node_parts)
        return sp.csr_matrix((np.ones(len(rows), dtype=np.int64), (rows, cols)), shape=(n, self.node_count))

    def predict(self, X):
        """``value`` of the leaf of every row: ``(n, max_n_classes)`` for one output, else 3-d."""
        out = self.value[self.apply(X)]
        return out.reshape(out.shape[0], self.max_n_classes) if self.n_outputs == 1 else out

    def compute_feature_importances(self, normalize=True):
        """Weighted impurity decrease of the splits on each feature (normalised to sum 1)."""
        imp = np.zeros(self.n_features)
        inner = np.nonzero(self.children_left >= 0)[0]
        if inner.size:
            w, i = self.weighted_n_node_samples, self.impurity
            lc, rc = self.children_left[inner], self.children_right[inner]
            dec = w[inner] * i[inner] - w[lc] * i[lc] - w[rc] * i[rc]
            np.add.at(imp, self.feature[inner], dec)
            imp /= w[0]
        if normalize and imp.sum() > 0:
            imp /= imp.sum()
        return imp


class _ForestTree(BaseEstimator):
    """Shared surface of the per-tree estimators (see the module docstring)."""

    #: The forest class that grows a lone tree in :meth:`fit` (set by :mod:`._forest`, which sits above).
    _forest_class = None

    def _adopt(self, structure, n_features_in, n_outputs, max_features_, fit_ranks=1):
        self.tree_ = structure
        self._fit_ranks = fit_ranks          # a rank of a forest fitted over several may predict on no rows
        self.n_features_in_ = n_features_in
        self.n_outputs_ = n_outputs
        self.max_features_ = max_features_
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True          # as the forest: sparse rows are expanded (fit and predict)
        tags.input_tags.allow_nan = True       # a missing value goes to the side its split learned
        return tags

    def _validate_X_predict(self, X, check_input):
        """``X`` checked as scikit-learn's trees check it (fitted, 2-d, ``n_features_in_`` columns, no inf).

        With ``check_input=False`` only the fitted state is checked (the caller vouches for ``X``).
        """
        check_is_fitted(self, "tree_")
        if check_input:
            X, _ = validate_data(self, X, comm=get_comm("self"), reset=False, accept_sparse=["csr", "csc"],
                                 ensure_all_finite="allow-nan")
        return X

    def _leaf_values(self, X, check_input):
        """``tree_.value`` at the leaf of every row of ``X``."""
        X = self._validate_X_predict(X, check_input)
        return self.tree_.value[self.tree_.apply(X)]

    def apply(self, X, check_input=True):
        """Leaf id reached by every row of ``X`` (host arrays)."""
        return self.tree_.apply(self._validate_X_predict(X, check_input))

    def decision_path(self, X, check_input=True):
        """CSR indicator of the nodes every row passes through."""
        return self.tree_.decision_path(self._validate_X_predict(X, check_input))

    def get_depth(self):
        """Depth of the tree (a lone root: 0)."""
        check_is_fitted(self, "tree_")
        return self.tree_.max_depth

    def get_n_leaves(self):
        """Number of leaves."""
        check_is_fitted(self, "tree_")
        return self.tree_.n_leaves

    @property
    def feature_importances_(self):
        """Normalised total impurity decrease per feature."""
        check_is_fitted(self, "tree_")
        return self.tree_.compute_feature_importances()

    def fit(self, X, y, sample_weight=None, check_input=True):
        """Grow this tree alone on the given rows (one process, no bootstrap), with these parameters.

        The feature orders are drawn from ``random_state`` as the forest draws them for the tree of that key:
        a tree of ``estimators_`` refitted on its ``estimators_samples_`` is the tree again.
        """
        forest_cls = self._forest_class
        params = {k: v for k, v in self.get_params().items() if k in forest_cls().get_params()}
        rs = self.random_state
        key = int(rs) if isinstance(rs, Integral) else int(check_random_state(rs).randint(np.iinfo(np.int32).max))
        forest = forest_cls(n_estimators=1, bootstrap=False, comm=get_comm("self"), **params)
        forest._fixed_tree_keys = [key]
        forest.fit(X, y, sample_weight=sample_weight)
        tree = forest.estimators_[0]
        self.__dict__.update({k: v for k, v in vars(tree).items() if k.endswith("_")})
        self._fit_ranks = 1
        return self


class ForestTreeClassifier(ClassifierMixin, _ForestTree):
    """One classification tree of a fitted :class:`~mpiml.ensemble.RandomForestClassifier`."""

    def __init__(self, *, criterion="gini", splitter="best", max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_weight_fraction_leaf=0.0, max_features=None, random_state=None,
                 max_leaf_nodes=None, min_impurity_decrease=0.0, class_weight=None, ccp_alpha=0.0,
                 monotonic_cst=None):
        self.criterion = criterion
        self.splitter = splitter
        self.max_depth = max_depth
        self.min_samples_split = min_samples_split
        self.min_samples_leaf = min_samples_leaf
        self.min_weight_fraction_leaf = min_weight_fraction_leaf
        self.max_features = max_features
        self.random_state = random_state
        self.max_leaf_nodes = max_leaf_nodes
        self.min_impurity_decrease = min_impurity_decrease
        self.class_weight = class_weight
        self.ccp_alpha = ccp_alpha
        self.monotonic_cst = monotonic_cst

    def predict_proba(self, X, check_input=True):
        """Class fractions of the leaf of every row: ``(n, n_classes)``, a list per output when several."""
        value = self._leaf_values(X, check_input)
        if self.n_outputs_ == 1:
            return value[:, 0, :self.tree_.n_classes[0]]
        return [value[:, o, :k] for o, k in enumerate(self.tree_.n_classes)]

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        proba = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            return np.log(proba) if self.n_outputs_ == 1 else [np.log(p) for p in proba]

    def predict(self, X, check_input=True):
        """Most probable class of every row (per output when several)."""
        proba = self.predict_proba(X, check_input)
        if self.n_outputs_ == 1:
            return self.classes_[np.argmax(proba, axis=1)]
        return np.stack([c[np.argmax(p, axis=1)] for c, p in zip(self.classes_, proba)], axis=1)


class ForestTreeRegressor(RegressorMixin, _ForestTree):
    """One regression tree of a fitted :class:`~mpiml.ensemble.RandomForestRegressor`."""

    def __init__(self, *, criterion="squared_error", splitter="best", max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_weight_fraction_leaf=0.0, max_features=None, random_state=None,
                 max_leaf_nodes=None, min_impurity_decrease=0.0, ccp_alpha=0.0, monotonic_cst=None):
        self.criterion = criterion
        self.splitter = splitter
        self.max_depth = max_depth
        self.min_samples_split = min_samples_split
        self.min_samples_leaf = min_samples_leaf
        self.min_weight_fraction_leaf = min_weight_fraction_leaf
        self.max_features = max_features
        self.random_state = random_state
        self.max_leaf_nodes = max_leaf_nodes
        self.min_impurity_decrease = min_impurity_decrease
        self.ccp_alpha = ccp_alpha
        self.monotonic_cst = monotonic_cst

    def predict(self, X, check_input=True):
        """Mean target of the leaf of every row: ``(n,)``, or ``(n, n_outputs)``."""
        value = self._leaf_values(X, check_input)[:, :, 0]
        return value[:, 0] if self.n_outputs_ == 1 else value
