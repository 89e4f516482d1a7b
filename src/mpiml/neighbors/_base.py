"""Exact nearest neighbours over a sharded index (SPMD): NearestNeighbors and the shared base.

``fit`` keeps this rank's rows as its shard of the index (nothing is copied to other
ranks) and agrees on the row counts; ``kneighbors`` is collective: the shards travel
around the ring of ranks (:mod:`mpiml.neighbors._ring`) while each rank keeps the
running top-k of its own queries.  A global index is the row's position in the
concatenation of the shards in rank order.

The index and the queries may each be dense (NumPy or CuPy) or sparse (SciPy CSR on
CPU ranks, ``cupyx.scipy.sparse`` CSR on GPU ranks); sparse rows are never densified.
"""

import math
import warnings
from numbers import Integral, Real

import numpy as np
# scikit-learn recognises a neighbours estimator by these mixins (isinstance); see NearestNeighbors
from sklearn.neighbors._base import KNeighborsMixin, RadiusNeighborsMixin

from .._array import get_namespace
from ..base import SPMDEstimator
from ..utils._param_validation import InvalidParameterError, Interval, StrOptions
from ..utils._validation import row_counts, validate_data
from . import _sparse
from ._metrics import (check_semimetric, index_rows, metric_constraint, precomputed_index, resolve_host_metric,
                       sparse_accepts)
from ._ring import EXCHANGES, ring_kneighbors, ring_radius

__all__ = ["NearestNeighbors"]

#: Metric names (scikit-learn's, aliases included) -> the distance computed.
METRICS = {"euclidean": "euclidean", "l2": "euclidean", "sqeuclidean": "sqeuclidean", "cosine": "cosine",
           "manhattan": "manhattan", "l1": "manhattan", "cityblock": "manhattan", "chebyshev": "chebyshev",
           "infinity": "chebyshev", "minkowski": "minkowski", "p": "minkowski"}
#: Distances computed on sparse rows (scikit-learn's brute force accepts the same ones, except
#: sqeuclidean, which it refuses on sparse input and mpiml computes).
SPARSE_METRICS = ("cityblock", "cosine", "euclidean", "l1", "l2", "manhattan", "sqeuclidean")
#: scikit-learn's tree algorithms give the same (exact) neighbours as brute force; mpiml runs brute force.
ALGORITHMS = ("auto", "ball_tree", "kd_tree", "brute")


def resolve_metric(owner, metric, p, metric_params, algorithm):
    """``(distance, p, effective_metric_, effective_metric_params_)`` as scikit-learn resolves them.

    ``metric="minkowski"`` with ``p`` 1, 2 or inf is manhattan, euclidean or chebyshev;
    ``p`` given in ``metric_params`` wins over the ``p`` parameter (with scikit-learn's
    warning).  Every other metric scikit-learn's brute force accepts (its rarer names,
    ``metric_params`` beyond ``p``, ``DistanceMetric`` objects, callables) is computed on the
    host by :mod:`mpiml.neighbors._metrics`.
    """
    host = not isinstance(metric, str) or metric not in METRICS  # the rarer metrics: _metrics.HostMetric
    params = dict(metric_params or {})
    if "p" in params:
        warnings.warn("Parameter p is found in metric_params. The corresponding parameter from __init__ "
                      "is ignored.", SyntaxWarning, stacklevel=3)
        p = params.pop("p")
        if not isinstance(p, Real) or isinstance(p, bool) or not p > 0:
            raise InvalidParameterError(f"The 'p' parameter of {owner} must be a float in the range (0.0, inf]. "
                                        f"Got {p!r} instead.")
    if "w" in params and params["w"] is None:  # scikit-learn's own unweighted value
        del params["w"]
    if host or params:
        return resolve_host_metric(owner, metric, p, params, algorithm)
    if algorithm in ("kd_tree", "ball_tree"):
        from sklearn.neighbors import VALID_METRICS

        if metric not in VALID_METRICS[algorithm]:
            raise ValueError(f"Metric '{metric}' not valid. Use sorted(sklearn.neighbors.VALID_METRICS"
                             f"['{algorithm}']) to get valid options. Metric can also be a callable function.")
    distance = METRICS[metric]
    effective, effective_params = metric, {}
    if distance == "minkowski":
        p = float(p) if p is not None else 2.0
        if p == 1:
            distance, effective = "manhattan", "manhattan"
        elif p == 2:
            distance, effective = "euclidean", "euclidean"
        elif math.isinf(p):
            distance, effective = "chebyshev", "chebyshev"
        else:
            check_semimetric(p, algorithm)
            effective_params = {"p": p, "w": None}
    return distance, p, effective, effective_params


def _check_sparse_metric(metric, X):
    """scikit-learn's refusal of a metric it cannot compute on sparse rows (the input kind may
    differ across ranks: the caller agrees on the verdict)."""
    if _sparse.is_sparse(X) and metric not in SPARSE_METRICS and not sparse_accepts(metric):
        raise ValueError(f"Metric '{metric}' not valid for sparse input. Valid metrics for sparse input: "
                         f"{list(SPARSE_METRICS)}.")


def _as_csr(X):
    return _sparse.canonical(X) if _sparse.is_sparse(X) else X


class _NeighborsBase(SPMDEstimator):
    """Fitting (the shard and the agreed row counts) and the collective neighbour search."""

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_neighbors": [Interval(Integral, 1, None, closed="left"), None],
        "algorithm": [StrOptions(set(ALGORITHMS))],
        "leaf_size": [Interval(Integral, 1, None, closed="left")],
        "metric": metric_constraint(METRICS),
        "p": [Interval(Real, 0, None, closed="right"), None],
        "metric_params": [dict, None],
        "n_jobs": [Integral, None],
        "exchange": [StrOptions(set(EXCHANGES))],
    }
    #: Model files also hold the index and its targets (see _get_saved_state).
    _saved_attributes = ("n_samples_fit_", "effective_metric_", "effective_metric_params_")

    # ------------------------------------------------------------------ fit
    def _validate_fit_params(self):
        self._validate_params()
        self._distance, self._p, self._effective, self._effective_params = resolve_metric(
            type(self).__name__, self.metric, self.p, self.metric_params, self.algorithm)

    def _validate_index(self, X):
        """Validate this rank's index rows (collective); sparse rows become canonical CSR."""
        X, xp = validate_data(self, X, comm=self._get_comm(), accept_sparse="csr")
        X = _as_csr(X)
        self._check_sparse_input(X, index=True)
        return X, xp

    def _check_sparse_input(self, X, *, index=False):
        """scikit-learn's refusal of a metric on sparse rows, and (for the index) one kind of
        shard on every rank (the ring sends CSR arrays or dense rows), agreed in one collective.

        Queries need no agreement when the metric works on sparse rows (nothing can fail).
        """
        comm = self._get_comm()
        if not index and self._effective in SPARSE_METRICS:
            return
        error = None
        try:
            _check_sparse_metric(self._effective, X)
        except ValueError as exc:
            error = str(exc)
        facts = [(error, _sparse.is_sparse(X))] if comm.size == 1 else comm.allgather_obj(
            (error, _sparse.is_sparse(X)))
        errors = [e for e, _ in facts if e is not None]
        if errors:
            raise ValueError(errors[0])
        kinds = [k for _, k in facts]
        if index and len(set(kinds)) > 1:
            from .._errors import DistributedInputError

            raise DistributedInputError(
                f"X is sparse on rank(s) {[r for r, k in enumerate(kinds) if k]} but dense on rank(s) "
                f"{[r for r, k in enumerate(kinds) if not k]}: every rank's shard of the index must be of one kind")
        if index and _sparse.is_sparse(X) and self.algorithm in ("kd_tree", "ball_tree"):
            warnings.warn("cannot use tree with sparse input: using brute force", UserWarning, stacklevel=3)

    def _fit_index(self, X, Y=None):
        """Keep ``X`` (validated) as this rank's shard; ``Y`` (n, t) float64 travels with it."""
        comm = self._get_comm()
        self._shard_X = X
        self._shard_Y = Y
        counts = row_counts(X.shape[0], comm)
        self._shard_counts = counts
        self._shard_offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.n_samples_fit_ = int(counts.sum())
        self._precomputed_rows = None
        if self._effective == "precomputed":  # the index is the rows' global numbers (mpiml.neighbors._metrics)
            self._precomputed_rows = X
            self._shard_X = precomputed_index(X, int(self._shard_offsets[comm.rank]), self.n_samples_fit_,
                                              get_namespace(X))
        self.effective_metric_ = self._effective
        self.effective_metric_params_ = dict(self._effective_params)
        self._fit_method = "brute"
        return self

    def _train_queries(self):
        """The fitted rows as queries (``X=None``): the rows of a precomputed matrix, or the shard."""
        rows = getattr(self, "_precomputed_rows", None)
        return self._shard_X if rows is None else rows

    @property
    def _fit_X(self):
        """This rank's rows of the index (scikit-learn's name, read by its ``kneighbors_graph``)."""
        return self._train_queries()

    def _metric_args(self):
        """(distance, p) for the ring; restored from the parameters after a model file is loaded."""
        if not hasattr(self, "_distance"):
            self._validate_fit_params()
        return self._distance, self._p

    # ------------------------------------------------------------------ search
    def _queries(self, X):
        """This rank's validated queries (collective), in the index's dtype."""
        comm = self._get_comm()
        self._metric_args()
        Q, xp = validate_data(self, X, comm=comm, reset=False, accept_sparse="csr")
        Q = _as_csr(Q)
        self._check_sparse_input(Q)
        Xi = self._shard_X
        if Q.dtype != Xi.dtype:
            Q = Q.astype(Xi.dtype)
        if get_namespace(Q) is not get_namespace(Xi):
            # the kinds of queries and of the index were each agreed across ranks: every rank raises
            raise ValueError(f"queries are {'CuPy' if xp is not np else 'NumPy'} arrays but the index was fitted "
                             "on the other kind")
        return Q, xp

    def _search(self, X, n_neighbors, *, with_payload):
        """Validated queries (or the fitted rows when ``X`` is None) -> (dist, gidx, payload, xp)."""
        self._check_is_fitted("n_samples_fit_")
        comm = self._get_comm()
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        if not isinstance(k, Integral) or isinstance(k, bool):
            raise TypeError(f"n_neighbors does not take {type(k)} value, enter integer value")
        if k < 1:
            raise ValueError(f"Expected n_neighbors > 0. Got {k!r}")
        query_is_train = X is None
        if query_is_train:
            Q = self._train_queries()
            xp = get_namespace(Q)
            k_search = k + 1
        else:
            Q, xp = self._queries(X)
            k_search = k
        if k_search > self.n_samples_fit_:
            if query_is_train:  # scikit-learn's wording: the rows themselves are not counted
                raise ValueError(f"Expected n_neighbors < n_samples_fit, but n_neighbors = {k}, "
                                 f"n_samples_fit = {self.n_samples_fit_}, n_samples = {self.n_samples_fit_}")
            # every rank is here (the test is on replicated numbers): one message with the global query count
            n_queries = int(row_counts(Q.shape[0], comm).sum())
            raise ValueError(f"Expected n_neighbors <= n_samples_fit, but n_neighbors = {k_search}, "
                             f"n_samples_fit = {self.n_samples_fit_}, n_samples = {n_queries}")
        Xi = self._shard_X
        Y = self._shard_Y if with_payload else None
        metric, p = self._metric_args()
        dist, gidx, pay = ring_kneighbors(Q, Xi, Y, k_search, metric=metric, p=p, comm=comm,
                                          offsets=self._shard_offsets, counts=self._shard_counts,
                                          exchange=self.exchange, xp=xp)
        if dist is None:  # no queries on this rank
            dist = xp.empty((0, k_search), dtype=Xi.dtype)
            gidx = xp.empty((0, k_search), dtype=xp.int64)
            pay = None if Y is None else xp.empty((0, k_search, Y.shape[1]))
        if query_is_train:
            dist, gidx, pay = _drop_self(dist, gidx, pay, int(self._shard_offsets[comm.rank]), xp)
        return dist, gidx, pay, xp

    def kneighbors(self, X=None, n_neighbors=None, return_distance=True):
        """The ``n_neighbors`` nearest rows of the global index for this rank's queries.

        Collective: every rank must call it (with its own queries, possibly none).

        Parameters
        ----------
        X : array-like of shape (n_local_queries, n_features), default=None
            This rank's queries; None means this rank's fitted rows, each not counted
            as its own neighbour (scikit-learn's convention).
        n_neighbors : int, default=None
            Defaults to the ``n_neighbors`` parameter.
        return_distance : bool, default=True

        Returns
        -------
        neigh_dist : ndarray of shape (n_local_queries, n_neighbors)
            Only when ``return_distance``.
        neigh_ind : ndarray of shape (n_local_queries, n_neighbors)
            Global indices (int64), ordered by distance, ties by index.
        """
        dist, gidx, _, _ = self._search(X, n_neighbors, with_payload=False)
        return (dist, gidx) if return_distance else gidx

    def radius_neighbors(self, X=None, radius=None, return_distance=True, sort_results=False):
        """Every global index row within ``radius`` of each of this rank's queries (collective).

        Meant for small radii: each query's neighbours are kept on this rank's host as
        they are found.  Results are sorted by (distance, global index) with
        ``sort_results``, else by global index (scikit-learn's brute-force order).

        Returns
        -------
        neigh_dist : ndarray of shape (n_local_queries,) of arrays
            Only when ``return_distance``.
        neigh_ind : ndarray of shape (n_local_queries,) of int64 arrays
        """
        self._check_is_fitted("n_samples_fit_")
        comm = self._get_comm()
        if sort_results and not return_distance:
            raise ValueError("return_distance must be True if sort_results is True.")
        radius = getattr(self, "radius", None) if radius is None else radius
        if radius is None or not radius >= 0:
            raise ValueError(f"radius must be a non-negative number; got {radius!r}")
        if X is None:
            Q = self._train_queries()
            xp = get_namespace(Q)
        else:
            Q, xp = self._queries(X)
        metric, p = self._metric_args()
        dists, inds = ring_radius(Q, self._shard_X, radius, metric=metric, p=p, comm=comm,
                                  offsets=self._shard_offsets, counts=self._shard_counts, exchange=self.exchange,
                                  xp=xp)
        if X is None:
            offset = int(self._shard_offsets[comm.rank])
            for r in range(len(inds)):
                keep = inds[r] != offset + r
                dists[r], inds[r] = dists[r][keep], inds[r][keep]
        if not sort_results:  # scikit-learn's brute-force order: by index
            for r in range(len(inds)):
                order = np.argsort(inds[r], kind="stable")
                dists[r], inds[r] = dists[r][order], inds[r][order]
        neigh_ind = np.empty(len(inds), dtype=object)
        neigh_ind[:] = inds
        if not return_distance:
            return neigh_ind
        neigh_dist = np.empty(len(dists), dtype=object)
        neigh_dist[:] = dists
        return neigh_dist, neigh_ind

    def radius_neighbors_graph(self, X=None, radius=None, mode="connectivity", sort_results=False):
        """Sparse graph (CSR, host) of this rank's queries to the global rows within ``radius``.

        Shape ``(n_local_queries, n_samples_fit_)``; ``mode`` as in :meth:`kneighbors_graph`.
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError(f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" '
                             "instead")
        from scipy.sparse import csr_matrix

        dist, ind = self.radius_neighbors(X, radius, return_distance=True, sort_results=sort_results)
        counts = np.array([len(i) for i in ind], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(counts)])
        cols = np.concatenate(list(ind)) if len(ind) else np.empty(0, np.int64)
        data = np.concatenate(list(dist)) if mode == "distance" and len(dist) else np.ones(len(cols))
        return csr_matrix((data.astype(np.float64), cols, indptr), shape=(len(ind), self.n_samples_fit_))

    def kneighbors_graph(self, X=None, n_neighbors=None, mode="connectivity"):
        """Sparse graph (CSR) of this rank's queries to their global neighbours.

        Shape ``(n_local_queries, n_samples_fit_)``; ``mode`` is ``"connectivity"``
        (ones) or ``"distance"``.  SciPy CSR for NumPy input, cupyx CSR for CuPy.
        """
        if mode not in ("connectivity", "distance"):
            raise ValueError(f'Unsupported mode, must be one of "connectivity", or "distance" but got "{mode}" '
                             "instead")
        dist, gidx, _, xp = self._search(X, n_neighbors, with_payload=False)
        n, k = gidx.shape
        data = xp.ones(n * k) if mode == "connectivity" else dist.ravel()
        indptr = xp.arange(0, n * k + 1, k)
        if xp is np:
            from scipy.sparse import csr_matrix
        else:
            from cupyx.scipy.sparse import csr_matrix
        return csr_matrix((data, gidx.ravel(), indptr), shape=(n, self.n_samples_fit_))

    # ------------------------------------------------------------------ model files
    def _get_saved_state(self):
        self._check_is_fitted("n_samples_fit_")
        if self._shard_counts.size > 1:
            raise ValueError(f"{type(self).__name__} fitted on {self._shard_counts.size} ranks keeps its index "
                             "sharded and cannot be written by rank 0 alone; fit it on one process "
                             "(comm=get_comm('self')) on the gathered rows to save it")
        state = super()._get_saved_state()
        state["_shard_X"] = self._shard_X
        if self._shard_Y is not None:
            state["_shard_Y"] = self._shard_Y
        return state

    def _set_saved_state(self, state):
        state = dict(state)
        X = state.pop("_shard_X")
        Y = state.pop("_shard_Y", None)
        super()._set_saved_state(state)
        self._shard_X, self._shard_Y = X, Y
        self._shard_counts = np.array([X.shape[0]], dtype=np.int64)
        self._shard_offsets = np.zeros(1, dtype=np.int64)
        self._fit_method = "brute"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.pairwise = self.metric == "precomputed"  # cross-validation splits both axes
        return tags


def _drop_self(dist, gidx, pay, offset, xp):
    """scikit-learn's rule for ``X=None``: drop each row's own index, or the first column if absent
    (a duplicate of the row took its place)."""
    n, k1 = gidx.shape
    own = xp.arange(offset, offset + n, dtype=gidx.dtype)[:, None]
    is_self = gidx == own
    # mark one column to drop per row: the own index where present, else the first column
    has = is_self.any(axis=1)
    drop = xp.where(has, xp.argmax(is_self, axis=1), 0)
    keep = xp.ones((n, k1), dtype=bool)
    keep[xp.arange(n), drop] = False
    dist = dist[keep].reshape(n, k1 - 1)
    gidx = gidx[keep].reshape(n, k1 - 1)
    if pay is not None:
        pay = pay[keep].reshape(n, k1 - 1, pay.shape[-1])
    return dist, gidx, pay


class NearestNeighbors(_NeighborsBase, KNeighborsMixin, RadiusNeighborsMixin):
    """Unsupervised exact nearest neighbours over the rows of every rank (SPMD), NumPy or CuPy.

    Each rank calls :meth:`fit` with its rows: they stay on that rank as its shard of the
    index.  :meth:`kneighbors` is collective and answers this rank's queries against the
    whole (global) index, with global indices (rows of lower ranks + local index).

    The class derives from scikit-learn's ``KNeighborsMixin`` and ``RadiusNeighborsMixin``
    (the classifier and regressor from ``KNeighborsMixin``) so that scikit-learn recognises
    it where it asks ``isinstance`` (its ``kneighbors_graph`` / ``radius_neighbors_graph``
    functions reuse a fitted estimator); every public method of those mixins is mpiml's
    own, and ``_fit_X``, the one private name their functions read, is this rank's shard.

    Parameters
    ----------
    n_neighbors : int, default=5
    radius : float, default=1.0
        Default radius of :meth:`radius_neighbors`.
    algorithm : {"auto", "ball_tree", "kd_tree", "brute"}, default="auto"
        Always brute force (the trees give the same exact neighbours); ``"kd_tree"`` and
        ``"ball_tree"`` refuse the metrics scikit-learn's trees refuse, and warn and use
        brute force on sparse input, as scikit-learn does.
    leaf_size : int, default=30
        Accepted and ignored (no tree).
    metric : str, default="minkowski"
        ``"minkowski"`` (with ``p``), ``"euclidean"``/``"l2"``, ``"sqeuclidean"``,
        ``"cosine"``, ``"manhattan"``/``"l1"``/``"cityblock"``, ``"chebyshev"``.
        Sparse input takes euclidean, sqeuclidean, cosine and manhattan (and their
        aliases; ``"minkowski"`` with ``p`` 1 or 2). Others raise scikit-learn's errors.
    p : float, default=2
        Power of the Minkowski metric: 1 is manhattan, 2 euclidean, inf chebyshev,
        other values the general Minkowski distance (dense input).
    metric_params : dict, default=None
        Only ``{"p": ...}`` (which overrides ``p``, with scikit-learn's warning).
    n_jobs : int or None, default=None
        Accepted and ignored: parallelism comes from the ranks (and the GPU).
    exchange : {"overlap", "blocking", "onesided"}, default="overlap"
        How index blocks travel around the ring (see Notes); identical results.
    comm : Communicator or None, default=None

    Attributes
    ----------
    n_samples_fit_ : int
        Rows of the global index (replicated).
    effective_metric_ : str
        Replicated; scikit-learn's (``"euclidean"`` for minkowski with p = 2).
    effective_metric_params_ : dict
        Replicated; ``{"p": p, "w": None}`` for the general Minkowski metric, else empty.
    n_features_in_ : int
        Replicated.

    Notes
    -----
    Communicated per ``fit``: one allgather of one int64 per rank (the row counts) plus
    the input agreement.  Per ``kneighbors``: one agreement of the queries' shape, then
    ``p - 1`` ring steps each sending this rank's current index block (``n_local * d``
    values, plus targets for the supervised estimators; for a sparse index its CSR
    arrays, ``nnz`` values and indices and ``n_local + 1`` offsets) to the right neighbour.
    ``"overlap"`` posts the send and receive before computing on the current block,
    ``"blocking"`` after, ``"onesided"`` puts the block into a three-slot circular buffer
    of the neighbour (MPI RMA window with a flag per slot; device blocks staged through
    host memory).
    """

    _parameter_constraints = {
        **_NeighborsBase._parameter_constraints,
        "radius": [Interval(Real, 0, None, closed="both"), None],
    }

    def __init__(self, *, n_neighbors=5, radius=1.0, algorithm="auto", leaf_size=30, metric="minkowski", p=2,
                 metric_params=None, n_jobs=None, exchange="overlap", comm=None):
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.algorithm = algorithm
        self.leaf_size = leaf_size
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.n_jobs = n_jobs
        self.exchange = exchange
        self.comm = comm

    def fit(self, X, y=None):
        """Keep this rank's rows as its shard of the index (collective: agrees on the input).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            NumPy or CuPy rows, SciPy sparse (CPU ranks) or ``cupyx.scipy.sparse``
            (GPU ranks); sparse input is kept as CSR.
        y : Ignored
        """
        self._validate_fit_params()
        X, _ = self._validate_index(index_rows(X))
        return self._fit_index(X)
