"""k-nearest-neighbour classification and regression over a sharded index (SPMD).

The targets of the index rows travel with their block around the ring (class codes
or regression targets as float64 columns), so a rank predicts for its queries
without asking other ranks for labels afterwards.
"""

import warnings

import numpy as np
from sklearn.base import ClassifierMixin, MultiOutputMixin, RegressorMixin
from sklearn.exceptions import DataConversionWarning
from sklearn.neighbors._base import KNeighborsMixin  # recognised as scikit-learn's (see NearestNeighbors)

from .._array import get_namespace
from ..utils._param_validation import StrOptions
from ..utils._supervised import global_classes, validate_X_y
from ..utils._validation import agree_on_error
from ._base import _NeighborsBase, _as_csr
from ._metrics import index_rows

__all__ = ["KNeighborsClassifier", "KNeighborsRegressor"]


def _weights(dist, weights, xp):
    """Per-neighbour weights: ones, ``1/d`` where a row with a zero distance keeps only those, or
    a callable's (given the distances, returning an array of the same shape, as in scikit-learn)."""
    if weights is None or weights == "uniform":
        return xp.ones(dist.shape, dtype=xp.float64)
    if callable(weights):
        w = weights(dist)
        if getattr(w, "shape", None) != dist.shape:
            raise ValueError(f"the weights callable returned shape {getattr(w, 'shape', None)}; expected the "
                             f"shape of its argument {dist.shape}")
        return xp.asarray(w).astype(xp.float64)
    d = dist.astype(xp.float64)
    zero = d == 0
    with np.errstate(divide="ignore"):
        w = 1.0 / xp.where(zero, 1.0, d)
    rows = zero.any(axis=1)
    return xp.where(rows[:, None], zero.astype(xp.float64), w)


def _global_sum(comm, values):
    values = np.ascontiguousarray(values, dtype=np.float64)
    return values if comm.size == 1 else comm.allreduce(values, algorithm="binomial")


def _score_inputs(comm, n_pred, y, sample_weight):
    """Host ``y`` and weights for a global score; a length mismatch on any rank raises on every rank."""
    y = _to_host(y)
    w = np.ones(y.shape[0]) if sample_weight is None else _to_host(sample_weight).astype(np.float64).ravel()
    error = None
    if y.shape[0] != n_pred or w.shape[0] != n_pred:
        error = f"y has {y.shape[0]} rows and sample_weight {w.shape[0]}, but X has {n_pred}"
    agree_on_error(comm, error, error_class=ValueError)
    return y, w


def _to_host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


_DOC_COMMON = """
    n_neighbors : int, default=5
    weights : {"uniform", "distance"}, callable or None, default="uniform"
        ``"distance"``: weight ``1/d``; a query at distance 0 of some index rows uses
        only those (scikit-learn's rule).  A callable gets the distances (on the
        namespace of the queries) and returns weights of the same shape; None is uniform.
    algorithm : {"auto", "ball_tree", "kd_tree", "brute"}, default="auto"
        Always brute force (see :class:`NearestNeighbors`).
    leaf_size : int, default=30
        Accepted and ignored.
    p : float, default=2
        Power of the Minkowski metric (1 manhattan, 2 euclidean, inf chebyshev).
    metric : str, default="minkowski"
        As in :class:`NearestNeighbors` (sparse input included).
    metric_params : dict, default=None
        Only ``{"p": ...}``.
    n_jobs : int or None, default=None
        Accepted and ignored: parallelism comes from the ranks (and the GPU).
    exchange : {"overlap", "blocking", "onesided"}, default="overlap"
        How index blocks travel around the ring (see :class:`NearestNeighbors`).
    comm : Communicator or None, default=None
"""


class _SupervisedBase(_NeighborsBase):
    _parameter_constraints = {
        **_NeighborsBase._parameter_constraints,
        "weights": [StrOptions({"uniform", "distance"}), callable, None],
    }

    def __init__(self, n_neighbors=5, *, weights="uniform", algorithm="auto", leaf_size=30, p=2,
                 metric="minkowski", metric_params=None, n_jobs=None, exchange="overlap", comm=None):
        self.n_neighbors = n_neighbors
        self.weights = weights
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.p = p
        self.metric = metric
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.exchange = exchange
        self.comm = comm

    def _validate_training(self, X, y, *, y_numeric):
        """Validated ``X`` (dense, or canonical CSR) and ``y`` of this rank (collective)."""
        comm = self._get_comm()
        X, y, xp = validate_X_y(self, index_rows(X), y, comm=comm, y_numeric=y_numeric, multi_output=True,
                                accept_sparse="csr")
        X = _as_csr(X)
        self._check_sparse_input(X, index=True)
        return X, y, xp


class KNeighborsClassifier(MultiOutputMixin, ClassifierMixin, _SupervisedBase, KNeighborsMixin):
    """k-nearest-neighbour vote over the rows of every rank (SPMD), NumPy or CuPy.

    Parameters
    ----------""" + _DOC_COMMON + """
    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,) or list of them
        Sorted union of the labels of every rank (replicated, host); one array per
        output when ``y`` has several columns.
    outputs_2d_ : bool
        Whether ``y`` had several columns.
    n_samples_fit_ : int
        Rows of the global index (replicated).
    effective_metric_ : str
    n_features_in_ : int

    Notes
    -----
    ``fit`` communicates the input agreement, one ``allgather_obj`` of the local label
    sets and one allgather of the row counts.  ``predict``/``predict_proba`` run the
    collective ring search of :class:`NearestNeighbors`, with each index row's class
    code travelling with it.  ``score`` adds one allreduce of ``[correct, weight]``.
    """

    _saved_attributes = ("classes_", "n_samples_fit_", "effective_metric_", "effective_metric_params_",
                         "outputs_2d_")

    def fit(self, X, y):
        """Keep this rank's rows and labels as its shard of the index (collective).

        ``y`` of shape (n_local_samples,) or (n_local_samples, n_outputs): several
        outputs are predicted together (``classes_`` is then a list, one array per output).
        """
        self._validate_fit_params()
        comm = self._get_comm()
        X, y, xp = self._validate_training(X, y, y_numeric=False)
        y_host = _to_host(y)
        if y_host.ndim == 2 and y_host.shape[1] == 1:
            warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y "
                          "to (n_samples,), for example using ravel().", DataConversionWarning, stacklevel=2)
            y_host = y_host.ravel()
        self.outputs_2d_ = y_host.ndim == 2
        cols = y_host if self.outputs_2d_ else y_host[:, None]
        classes = [global_classes(cols[:, j], comm) for j in range(cols.shape[1])]
        self.classes_ = classes if self.outputs_2d_ else classes[0]
        codes = np.stack([np.searchsorted(c, cols[:, j]) for j, c in enumerate(classes)], axis=1) \
            if cols.shape[0] else np.zeros((0, cols.shape[1]))
        codes = codes.astype(np.float64)
        return self._fit_index(X, codes if xp is np else xp.asarray(codes))

    def _classes_list(self):
        return self.classes_ if self.outputs_2d_ else [self.classes_]

    def predict_proba(self, X):
        """Class probabilities of this rank's queries (collective ring search).

        Returns
        -------
        ndarray of shape (n_local_queries, n_classes), float64, on the namespace of ``X``;
        a list of them (one per output) when fitted on several outputs.
        """
        dist, _, codes, xp = self._search(X, None, with_payload=True)
        w = _weights(dist, self.weights, xp)
        out = []
        for j, classes in enumerate(self._classes_list()):
            code = codes[..., j].astype(xp.int64)
            n, c = code.shape[0], len(classes)
            proba = xp.zeros((n, c), dtype=xp.float64)
            rows = xp.broadcast_to(xp.arange(n)[:, None], code.shape)
            if xp is np:
                np.add.at(proba, (rows.ravel(), code.ravel()), w.ravel())
            else:
                import cupyx

                cupyx.scatter_add(proba, (rows.ravel(), code.ravel()), w.ravel())
            total = proba.sum(axis=1, keepdims=True)
            out.append(proba / xp.where(total > 0, total, 1.0))
        return out if self.outputs_2d_ else out[0]

    def predict(self, X):
        """The most probable class of each of this rank's queries (ties to the smallest class)."""
        probas = self.predict_proba(X)
        probas = probas if self.outputs_2d_ else [probas]
        xp = get_namespace(probas[0])
        preds = []
        for classes, proba in zip(self._classes_list(), probas):
            preds.append(classes[_to_host(proba.argmax(axis=1))])
        out = np.stack(preds, axis=1) if self.outputs_2d_ else preds[0]
        return out if xp is np or out.dtype.kind not in "biuf" else xp.asarray(out)

    def _set_saved_state(self, state):
        state = dict(state)
        self.outputs_2d_ = bool(state.pop("outputs_2d_", False))
        super()._set_saved_state(state)

    def score(self, X, y, sample_weight=None):
        """Mean accuracy over the queries of every rank (the same float on every rank)."""
        comm = self._get_comm()
        pred = _to_host(self.predict(X))
        y, w = _score_inputs(comm, pred.shape[0], y, sample_weight)
        if self.outputs_2d_:  # scikit-learn's accuracy: subset accuracy, binary outputs only
            if any(len(c) > 2 for c in self.classes_):
                raise ValueError("multiclass-multioutput is not supported")
            correct = (pred == y.reshape(pred.shape)).all(axis=1)
        else:
            correct = pred == y.ravel()
        tot = _global_sum(comm, [float(w[correct].sum()), float(w.sum())])
        return float(tot[0] / tot[1]) if tot[1] > 0 else 0.0

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = True
        return tags


class KNeighborsRegressor(MultiOutputMixin, RegressorMixin, _SupervisedBase, KNeighborsMixin):
    """k-nearest-neighbour (weighted) mean over the rows of every rank (SPMD), NumPy or CuPy.

    Parameters
    ----------""" + _DOC_COMMON + """
    Attributes
    ----------
    n_samples_fit_ : int
        Rows of the global index (replicated).
    effective_metric_ : str
    n_features_in_ : int

    Notes
    -----
    Targets travel with their index rows as float64 columns.  ``score`` (R² over every
    rank) adds two allreduces: ``[Σw, Σw·y]``, then ``[Σw·(y-ȳ)², Σw·(y-ŷ)²]``.
    """

    _saved_attributes = ("n_samples_fit_", "effective_metric_", "effective_metric_params_", "_y_1d")

    def fit(self, X, y):
        """Keep this rank's rows and targets as its shard of the index (collective)."""
        self._validate_fit_params()
        X, y, xp = self._validate_training(X, y, y_numeric=True)
        self._y_1d = y.ndim == 1
        Y = (y[:, None] if y.ndim == 1 else y).astype(xp.float64)
        return self._fit_index(X, Y)

    def predict(self, X):
        """Predictions for this rank's queries (collective ring search).

        Returns
        -------
        ndarray of shape (n_local_queries,) or (n_local_queries, n_targets), float64.
        """
        dist, _, Y, xp = self._search(X, None, with_payload=True)
        w = _weights(dist, self.weights, xp)
        pred = (Y * w[..., None]).sum(axis=1) / w.sum(axis=1)[:, None]
        return pred[:, 0] if self._y_1d else pred

    def score(self, X, y, sample_weight=None):
        """R² over the queries of every rank (outputs averaged uniformly); the same float everywhere."""
        comm = self._get_comm()
        P = _to_host(self.predict(X)).astype(np.float64)
        P = P[:, None] if P.ndim == 1 else P
        Y, w = _score_inputs(comm, P.shape[0], y, sample_weight)
        Y = Y.astype(np.float64)
        Y = Y[:, None] if Y.ndim == 1 else Y
        t = P.shape[1]
        first = _global_sum(comm, np.concatenate([[w.sum()], w @ Y if Y.shape[0] else np.zeros(t)]))
        mean = first[1:] / first[0]
        second = _global_sum(comm, np.concatenate([w @ (Y - mean) ** 2, w @ (Y - P) ** 2]) if Y.shape[0]
                             else np.zeros(2 * t))
        den, num = second[:t], second[t:]
        r2 = np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0), np.where(num == 0, 1.0, 0.0))
        return float(np.mean(r2))

    def _set_saved_state(self, state):
        state = dict(state)
        if "_y_1d" in state:
            self._y_1d = bool(state.pop("_y_1d"))
        super()._set_saved_state(state)
