"""Random forests over the rows of every rank (SPMD): global (exact, all rows) or local training."""

import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import ClassifierMixin, RegressorMixin
from sklearn.tree._criterion import Criterion
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import column_or_1d

from .._array import get_namespace, is_device_array, to_numpy
from .._errors import DistributedInputError
from ..utils._param_validation import Hidden, StrOptions
from ..utils._validation import agree_on_error
from ._base import FRIEDMAN_MSE_WARNING, _BaseForest
from ._predict import _global_r2
from ._tree import ForestTreeClassifier, ForestTreeRegressor

__all__ = ["RandomForestClassifier", "RandomForestRegressor"]


def _n_outputs_of(y, comm):
    """Columns of a 2-d ``y`` (1 for 1-d ``y`` and column vectors), agreed by the ranks."""
    shape = getattr(y, "shape", None)
    if shape is None and y is not None and not isinstance(y, str):
        try:
            shape = np.shape(y)
        except Exception:                                # ragged input: the checks below raise
            shape = None
    n = int(shape[1]) if shape is not None and len(shape) == 2 and shape[1] > 1 else 1
    if comm.size > 1:
        seen = comm.allgather_obj(n)
        if len(set(seen)) > 1:
            raise DistributedInputError(f"y has {seen[comm.rank]} output(s) on rank {comm.rank} but "
                                        f"{seen[0]} on rank 0; every rank must pass the same outputs.")
    return n


class RandomForestClassifier(ClassifierMixin, _BaseForest):
    """A random forest classifier trained on the rows of every rank (SPMD), on NumPy or CuPy shards.

    Parameters
    ----------
    n_estimators : int, default=100
        Number of trees.
    criterion : {"gini", "entropy", "log_loss"}, default="gini"
        Split quality ("entropy" and "log_loss" are the same: Shannon entropy).  A scikit-learn
        criterion object (``sklearn.tree._criterion.Gini`` / ``Entropy``, which scikit-learn's trees
        accept) stands for the criterion it computes.
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
    all constant; levels larger than ``MPIML_RF_HIST_BYTES`` (64 MiB; GPUs a
    sixteenth of the free memory, 256 MiB-1 GiB) are cut into several
    allreduces.  Histograms are fixed-point integers in float64, so
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
        "criterion": [StrOptions({"gini", "entropy", "log_loss"}), Hidden(Criterion)],
        "class_weight": [StrOptions({"balanced", "balanced_subsample"}), dict, list, None],
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
        """Classes of every rank (per output); returns the class codes on X's device.

        Several outputs (2-d ``y``): the trees grow on the *joint* labels (the combinations of the
        outputs' classes present over every rank, one agreement) and their leaf values are then
        marginalised per output (:meth:`_output_values`).
        """
        if sp.issparse(y):
            raise ValueError("sparse multilabel-indicator for y is not supported.")
        n_out = _n_outputs_of(y, comm)
        self.n_outputs_ = n_out
        if n_out == 1:
            self.classes_, codes = self._labels(y, X, comm)
            self.n_classes_ = len(self.classes_)
            self._joint_, self._n_codes_ = None, self.n_classes_
            return codes
        Y = np.asarray(to_numpy(y) if is_device_array(y) else y)
        per = [self._labels(Y[:, o], X, comm) for o in range(n_out)]
        self.classes_ = [c for c, _ in per]
        self.n_classes_ = [len(c) for c in self.classes_]
        codes = np.stack([to_numpy(c) for _, c in per], axis=1).astype(np.int64)
        if self.oob_score and max(self.n_classes_) > 2:
            raise ValueError("The type of target cannot be used to compute OOB estimates. Got "
                             "multiclass-multioutput while only the following are supported: continuous, "
                             "continuous-multioutput, binary, multiclass, multilabel-indicator.")
        if float(np.prod([float(k) for k in self.n_classes_])) >= 2.0 ** 62:
            raise ValueError(f"{type(self).__name__}: too many combinations of classes over the outputs "
                             f"({self.n_classes_}) for joint labels")
        strides = np.cumprod([1] + self.n_classes_[::-1][:-1])[::-1].astype(np.int64)
        key = codes @ strides
        present = np.unique(key)
        if comm.size > 1:
            present = np.unique(np.concatenate([np.asarray(p, dtype=np.int64) for p in comm.allgather_obj(
                present.tolist())]))
        self._joint_ = np.stack(np.unravel_index(present, self.n_classes_), axis=1).astype(np.int64)
        self._n_codes_ = len(present)
        return get_namespace(X).asarray(np.searchsorted(present, key).astype(np.int32))

    def _output_values(self, tree):
        """A grown tree with its node values as the concatenated class fractions of every output."""
        if self._joint_ is None:
            return tree
        value = np.asarray(tree["value"]).reshape(len(tree["feature"]), -1)
        parts = [value @ (self._joint_[:, o][:, None] == np.arange(k)[None, :]).astype(np.float64)
                 for o, k in enumerate(self.n_classes_)]
        return {**tree, "value": np.concatenate(parts, axis=1)}

    def _labels(self, y, X, comm):
        """Local label checks, one agreement on the classes of every rank: ``(classes, codes on X's device)``."""
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
        xp = get_namespace(X)
        if is_device_array(y):                           # numeric labels on the device: codes by bisection
            return classes, (xp.searchsorted(xp.asarray(classes), y).astype(xp.int32) if y.size
                             else xp.zeros(0, xp.int32))
        codes = np.zeros(0, dtype=np.int32)
        if y.size:
            lookup = {label: i for i, label in enumerate(classes.tolist())}
            codes = np.array([lookup[label] for label in labels.tolist()], dtype=np.int32)[inverse.ravel()]
        return classes, xp.asarray(codes)

    def _output_classes(self):
        """Classes per output."""
        return list(self.n_classes_) if self.n_outputs_ > 1 else [self.n_classes_]

    def _expanded_class_weight(self, codes, sample_weight, xp, comm):
        """Per-row class weights (scikit-learn's expanded class weights; several outputs: the product of the
        outputs' weights), or None: no ``class_weight``, or ``"balanced_subsample"`` with bootstrap (per tree,
        from its bootstrap counts, in the grower).  ``"balanced"`` counts the classes weighted by
        ``sample_weight`` over every rank."""
        cw = self.class_weight
        if cw is None:
            return None
        if cw == "balanced_subsample" and self.bootstrap:
            return None
        sw = None if sample_weight is None else to_numpy(sample_weight)
        if self._joint_ is None:
            return xp.asarray(self._per_class_weights(cw, self.classes_, codes, comm, sw))[codes]
        if not isinstance(cw, str) and (not isinstance(cw, (list, tuple)) or len(cw) != self.n_outputs_):
            raise ValueError("For multi-output, number of elements in class_weight should match number of "
                             "outputs.")
        out = np.ones(self._n_codes_)
        host = to_numpy(codes)
        for o, classes in enumerate(self.classes_):
            per_output = self._joint_[host, o]
            out_o = self._per_class_weights(cw if isinstance(cw, str) else cw[o], classes, per_output, comm, sw)
            out = out * out_o[self._joint_[:, o]]
        return xp.asarray(out)[codes]

    @staticmethod
    def _per_class_weights(cw, classes, codes, comm, sample_weight=None):
        K = len(classes)
        if isinstance(cw, str):  # "balanced" (and "balanced_subsample" without bootstrap): global weighted counts
            local = np.bincount(to_numpy(codes), weights=sample_weight, minlength=K).astype(np.float64)
            total = comm.allreduce(local) if comm.size > 1 else local
            return total.sum() / (K * np.where(total > 0, total, 1))
        per_class = np.ones(K)
        for label, w in cw.items():
            hit = np.nonzero(classes == label)[0]
            if hit.size == 0:
                raise ValueError(f"The classes, {[label]}, are not in class_weight")
            per_class[hit[0]] = w
        return per_class

    def predict_proba(self, X):
        """Mean over trees of the class fractions of the leaf each local row reaches (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples, n_classes), float64
        """
        self._check_is_fitted()
        proba, _ = self._mean_value(X)
        if self.n_outputs_ == 1:
            return proba
        cuts = np.cumsum(self.n_classes_)[:-1]
        return [proba[:, a:b] for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [proba.shape[1]]]))]

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`."""
        proba = self.predict_proba(X)
        xp = get_namespace(proba if self.n_outputs_ == 1 else proba[0])
        with np.errstate(divide="ignore"):
            return xp.log(proba) if self.n_outputs_ == 1 else [xp.log(p) for p in proba]

    def predict(self, X):
        """The most probable class of each local row (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,)
            Labels from ``classes_`` (on the device of ``X`` for numeric labels).
        """
        self._check_is_fitted()
        if self.n_outputs_ > 1:
            return np.stack([c[to_numpy(get_namespace(p).argmax(p, axis=1))]
                             for c, p in zip(self.classes_, self.predict_proba(X))], axis=1)
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
            yt = column_or_1d(yt) if self.n_outputs_ == 1 else yt
            w = np.ones(len(yt)) if sample_weight is None else np.asarray(to_numpy(sample_weight), dtype=np.float64)
            if len(yt) != len(pred) or len(w) != len(pred):
                raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                 f"[{len(pred)}, {len(yt)}]")
            hit = pred == yt if self.n_outputs_ == 1 else (pred == yt).all(axis=1)   # several outputs: all right
            part = np.array([float(np.sum(w * hit)), float(np.sum(w))])
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
    criterion : {"squared_error", "friedman_mse", "poisson", "absolute_error"}, default="squared_error"
        Split quality: reduction of the weighted variance ("friedman_mse" is the
        same, with scikit-learn's deprecation warning), the half Poisson deviance, or the absolute
        error (see the docs).  A scikit-learn criterion object (``sklearn.tree._criterion.MSE``,
        ``Poisson``, ``MAE``, which scikit-learn's trees accept) stands for the criterion it computes.
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
        "criterion": [StrOptions({"squared_error", "friedman_mse", "poisson", "absolute_error"}), Hidden(Criterion)],
    }

    def __init__(self, n_estimators=100, *, criterion="squared_error", max_depth=None, min_samples_split=2,
                 min_samples_leaf=1, min_weight_fraction_leaf=0.0, max_features=1.0, max_leaf_nodes=None,
                 min_impurity_decrease=0.0, bootstrap=True, oob_score=False, n_jobs=None, random_state=None,
                 verbose=0, warm_start=False, ccp_alpha=0.0, max_samples=None, monotonic_cst=None, max_bins=256,
                 training="global", comm=None):
        if isinstance(criterion, str) and criterion == "friedman_mse":     # scikit-learn warns on construction
            warnings.warn(FRIEDMAN_MSE_WARNING, FutureWarning)
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
        self.n_outputs_ = _n_outputs_of(y, comm)
        try:
            if self.n_outputs_ > 1:
                y = np.asarray(to_numpy(y) if is_device_array(y) else y)
                if y.shape[0] != X.shape[0]:
                    raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                     f"[{X.shape[0]}, {y.shape[0]}]")
            else:
                y = self._check_y_common(y, X)
            ns = get_namespace(y) if is_device_array(y) else np
            try:
                yf = y.astype(ns.float64) if ns is not np else np.asarray(y, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"y must hold numbers for {type(self).__name__}; got dtype {y.dtype}") from None
            if yf.size and not bool(ns.isfinite(yf).all()):
                raise ValueError("Input y contains NaN." if bool(ns.isnan(yf).any()) else
                                 "Input y contains infinity or a value too large for dtype('float64').")
            if self._criterion_name() == "poisson" and yf.size and bool((yf < 0).any()):
                raise ValueError("Some value(s) of y are negative which is not allowed for Poisson regression.")
        except Exception as exc:
            error = exc
        agree_on_error(comm, error, prefix="Invalid input y")
        self._n_codes_ = 0                               # absolute error: the target bins (set by the fit)
        if self._criterion_name() == "absolute_error" and self.n_outputs_ > 1:
            raise ValueError("criterion='absolute_error' takes one output in mpiml's forests; got "
                             f"{self.n_outputs_}")
        if self._criterion_name() == "poisson":
            total = np.array([float(yf.sum()) if yf.size else 0.0])
            if (comm.allreduce(total) if comm.size > 1 else total)[0] <= 0:
                raise ValueError("Sum of y is not strictly positive which is necessary for Poisson regression.")
        return get_namespace(X).asarray(yf)

    def _expanded_class_weight(self, targets, sample_weight, xp, comm):
        return None

    def _output_classes(self):
        """Values per node and output (1 for each output of a regression)."""
        return [1] * self.n_outputs_

    def _output_values(self, tree):
        return tree

    def predict(self, X):
        """Mean over trees of the leaf values reached by each local row (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,), float64
        """
        value, _ = self._mean_value(X)
        return value[:, 0] if self.n_outputs_ == 1 else value

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
            yt = to_numpy(y) if is_device_array(y) else np.asarray(y)
            yt = (column_or_1d(yt) if self.n_outputs_ == 1 else yt).astype(np.float64)
            w = np.ones(len(yt)) if sample_weight is None else np.asarray(to_numpy(sample_weight), dtype=np.float64)
            if len(yt) != len(pred) or len(w) != len(pred):
                raise ValueError(f"Found input variables with inconsistent numbers of samples: "
                                 f"[{len(pred)}, {len(yt)}]")
        except Exception as exc:
            error = exc
        agree_on_error(comm, error, prefix="Cannot score")
        if error is not None:                            # pragma: no cover - agree_on_error raised
            raise error
        if self.n_outputs_ > 1:                          # the mean of the outputs' R² (scikit-learn's default)
            return float(np.mean([_global_r2(yt[:, q], pred[:, q], w, comm) for q in range(self.n_outputs_)]))
        return _global_r2(yt, pred, w, comm)


# a tree of estimators_ refits itself as a one-tree forest: the forest classes, registered from above
ForestTreeClassifier._forest_class = RandomForestClassifier
ForestTreeRegressor._forest_class = RandomForestRegressor
