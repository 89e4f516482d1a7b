"""Exact nearest neighbours over a sharded index (SPMD): NearestNeighbors and the shared base.

``fit`` keeps this rank's rows as its shard of the index (nothing is copied to other
ranks) and agrees on the row counts; ``kneighbors`` is collective: the shards travel
around the ring of ranks (:mod:`mpiml.neighbors._ring`) while each rank keeps the
running top-k of its own queries.  A global index is the row's position in the
concatenation of the shards in rank order.
"""

from numbers import Integral, Real

import numpy as np

from .._array import get_namespace
from ..base import SPMDEstimator
from ..utils._param_validation import Interval, StrOptions
from ..utils._validation import row_counts, validate_data
from ._ring import EXCHANGES, ring_kneighbors, ring_radius

__all__ = ["NearestNeighbors"]

METRICS = ("euclidean", "sqeuclidean", "cosine", "manhattan")


def _check_metric(metric):
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} is not supported by mpiml.neighbors (supported: {list(METRICS)})")


class _NeighborsBase(SPMDEstimator):
    """Fitting (the shard and the agreed row counts) and the collective neighbour search."""

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"auto", "brute"})],
        "metric": [str],
        "n_jobs": [None, Integral],
        "exchange": [StrOptions(set(EXCHANGES))],
    }
    #: Model files also hold the index and its targets (see _get_saved_state).
    _saved_attributes = ("n_samples_fit_", "effective_metric_", "effective_metric_params_")

    # ------------------------------------------------------------------ fit
    def _fit_index(self, X, Y=None):
        """Keep ``X`` (validated) as this rank's shard; ``Y`` (n, t) float64 travels with it."""
        comm = self._get_comm()
        self._shard_X = X
        self._shard_Y = Y
        counts = row_counts(X.shape[0], comm)
        self._shard_counts = counts
        self._shard_offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.n_samples_fit_ = int(counts.sum())
        self.effective_metric_ = self.metric
        self.effective_metric_params_ = {}
        self._fit_method = "brute"
        return self

    def _validate_fit_params(self):
        self._validate_params()
        _check_metric(self.metric)

    # ------------------------------------------------------------------ search
    def _search(self, X, n_neighbors, *, with_payload):
        """Validated queries (or the fitted rows when ``X`` is None) -> (dist, gidx, payload, xp)."""
        self._check_is_fitted("n_samples_fit_")
        comm = self._get_comm()
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        if not isinstance(k, Integral) or isinstance(k, bool) or k < 1:
            raise ValueError(f"Expected n_neighbors > 0. Got {k!r}")
        query_is_train = X is None
        if query_is_train:
            Q = self._shard_X
            xp = get_namespace(Q)
            k_search = k + 1
        else:
            Q, xp = validate_data(self, X, comm=comm, reset=False)
            k_search = k
        if k_search > self.n_samples_fit_:
            raise ValueError(f"Expected n_neighbors <= n_samples_fit, but n_neighbors = {k_search}, "
                             f"n_samples_fit = {self.n_samples_fit_}, n_samples = {Q.shape[0]}")
        Xi = self._shard_X
        if Q.dtype != Xi.dtype:
            Q = Q.astype(Xi.dtype)
        if get_namespace(Q) is not get_namespace(Xi):
            # the kinds of queries and of the index were each agreed across ranks: every rank raises
            raise ValueError(f"queries are {'CuPy' if xp is not np else 'NumPy'} arrays but the index was fitted "
                             "on the other kind")
        Y = self._shard_Y if with_payload else None
        dist, gidx, pay = ring_kneighbors(Q, Xi, Y, k_search, metric=self.metric, comm=comm,
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
        they are found.  Results are always sorted by (distance, global index);
        ``sort_results`` is accepted for compatibility.

        Returns
        -------
        neigh_dist : ndarray of shape (n_local_queries,) of arrays
            Only when ``return_distance``.
        neigh_ind : ndarray of shape (n_local_queries,) of int64 arrays
        """
        self._check_is_fitted("n_samples_fit_")
        comm = self._get_comm()
        radius = self.radius if radius is None else radius
        if not radius >= 0:
            raise ValueError(f"radius must be a non-negative number; got {radius!r}")
        if X is None:
            Q, xp = self._shard_X, get_namespace(self._shard_X)
        else:
            Q, xp = validate_data(self, X, comm=comm, reset=False)
            Q = Q.astype(self._shard_X.dtype, copy=False)
        dists, inds = ring_radius(Q, self._shard_X, radius, metric=self.metric, comm=comm,
                                  offsets=self._shard_offsets, counts=self._shard_counts, exchange=self.exchange,
                                  xp=xp)
        if X is None:
            offset = int(self._shard_offsets[comm.rank])
            for r in range(len(inds)):
                keep = inds[r] != offset + r
                dists[r], inds[r] = dists[r][keep], inds[r][keep]
        neigh_ind = np.empty(len(inds), dtype=object)
        neigh_ind[:] = inds
        if not return_distance:
            return neigh_ind
        neigh_dist = np.empty(len(dists), dtype=object)
        neigh_dist[:] = dists
        return neigh_dist, neigh_ind

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
        tags.input_tags.sparse = False
        return tags


def _drop_self(dist, gidx, pay, offset, xp):
    """scikit-learn's rule for ``X=None``: drop each row's own index, or the last column if absent."""
    n, k1 = gidx.shape
    own = xp.arange(offset, offset + n, dtype=gidx.dtype)[:, None]
    is_self = gidx == own
    # mark one column to drop per row: the own index where present, else the last column
    has = is_self.any(axis=1)
    drop = xp.where(has, xp.argmax(is_self, axis=1), k1 - 1)
    keep = xp.ones((n, k1), dtype=bool)
    keep[xp.arange(n), drop] = False
    dist = dist[keep].reshape(n, k1 - 1)
    gidx = gidx[keep].reshape(n, k1 - 1)
    if pay is not None:
        pay = pay[keep].reshape(n, k1 - 1, pay.shape[-1])
    return dist, gidx, pay


class NearestNeighbors(_NeighborsBase):
    """Unsupervised exact nearest neighbours over the rows of every rank (SPMD), NumPy or CuPy.

    Each rank calls :meth:`fit` with its rows: they stay on that rank as its shard of the
    index.  :meth:`kneighbors` is collective and answers this rank's queries against the
    whole (global) index, with global indices (rows of lower ranks + local index).

    Parameters
    ----------
    n_neighbors : int, default=5
    radius : float, default=1.0
        Default radius of :meth:`radius_neighbors`.
    algorithm : {"auto", "brute"}, default="auto"
        Always brute force.
    leaf_size : int, default=30
        Accepted and ignored (no tree).
    metric : {"euclidean", "sqeuclidean", "cosine", "manhattan"}, default="euclidean"
        Others raise ``ValueError`` in :meth:`fit`.
    p : float, default=2
        Accepted for compatibility; only ``metric`` chooses the distance.
    metric_params : None
        Accepted for compatibility.
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
        Replicated.
    effective_metric_params_ : dict
        Always empty.
    n_features_in_ : int
        Replicated.

    Notes
    -----
    Communicated per ``fit``: one allgather of one int64 per rank (the row counts) plus
    the input agreement.  Per ``kneighbors``: one agreement of the queries' shape, then
    ``p - 1`` ring steps each sending this rank's current index block (``n_local * d``
    values, plus targets for the supervised estimators) to the right neighbour.
    ``"overlap"`` posts the send and receive before computing on the current block,
    ``"blocking"`` after, ``"onesided"`` puts the block into a three-slot circular buffer
    of the neighbour (MPI RMA window with a flag per slot; device blocks staged through
    host memory).
    """

    _parameter_constraints = {
        **_NeighborsBase._parameter_constraints,
        "radius": [Interval(Real, 0, None, closed="left")],
        "leaf_size": [Interval(Integral, 1, None, closed="left")],
        "p": [Interval(Real, 0, None, closed="right")],
        "metric_params": [None, dict],
    }

    def __init__(self, *, n_neighbors=5, radius=1.0, algorithm="auto", leaf_size=30, metric="euclidean", p=2,
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
        """Keep this rank's rows as its shard of the index (collective: agrees on the input)."""
        self._validate_fit_params()
        X, _ = validate_data(self, X, comm=self._get_comm())
        return self._fit_index(X)
