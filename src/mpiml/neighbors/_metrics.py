"""Every metric scikit-learn's brute-force neighbours accept, computed on the host block by block.

The common metrics (euclidean, sqeuclidean, cosine, manhattan, chebyshev, minkowski)
have their own kernels (:mod:`mpiml.neighbors._ring`, :mod:`mpiml.kernels.select`).
Every other metric scikit-learn's brute force accepts -- the names of
``sklearn.metrics.pairwise.PAIRWISE_DISTANCE_FUNCTIONS`` and the SciPy metrics it
allows (seuclidean, mahalanobis, braycurtis, canberra, haversine, the boolean ones,
...), weighted minkowski (``metric_params={"w": ...}``), ``DistanceMetric`` objects and
callables -- is a :class:`HostMetric`: the distances of a rank's queries to the rows of a
visiting block of the index are computed by scikit-learn's ``pairwise_distances`` (or
the ``DistanceMetric``'s ``pairwise``) on host copies of the two blocks, with the
``metric_params`` given, and returned in the namespace and dtype of the queries. The
ring, the top-k merge and the radius search are the same as for the common metrics, so
the result does not depend on the number of ranks. CuPy shards are copied to the host
for these metrics (correct first; the common metrics stay on the device).

Metrics whose parameters scikit-learn (SciPy) would otherwise estimate from the data at
hand -- ``V`` of seuclidean, ``VI`` of mahalanobis -- must be given in
``metric_params``: estimated per block they would depend on how the index is sharded,
so they are refused without them, naming the parameter.
"""

import warnings

import numpy as np

__all__ = ["HostMetric", "index_rows", "precomputed_index", "ALL_METRICS", "BRUTE_METRICS", "metric_constraint", "sparse_accepts", "SPARSE_BRUTE_METRICS", "resolve_host_metric", "host_topk"]


def _valid_metrics():
    from sklearn.neighbors import VALID_METRICS, VALID_METRICS_SPARSE

    return tuple(sorted(set(VALID_METRICS["brute"]))), tuple(sorted(set(VALID_METRICS_SPARSE["brute"])))


#: the metric names scikit-learn's brute force accepts (dense / sparse rows)
BRUTE_METRICS, SPARSE_BRUTE_METRICS = _valid_metrics()
#: every name scikit-learn's neighbours accept as ``metric`` (its parameter constraint)
ALL_METRICS = frozenset(BRUTE_METRICS) | frozenset(
    m for ms in __import__("sklearn.neighbors", fromlist=["VALID_METRICS"]).VALID_METRICS.values() for m in ms)
#: metric -> the parameter it needs to be independent of the sharding
_NEEDS = {"seuclidean": "V", "mahalanobis": "VI"}


def _host(a):
    """A host (NumPy / SciPy) copy of a NumPy, CuPy, SciPy or cupyx block."""
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()
    return a


class HostMetric:
    """A metric computed on the host with scikit-learn, for the rows of one block at a time."""

    def __init__(self, metric, params):
        self.metric = metric
        self.params = dict(params)

    def __eq__(self, other):  # never equal to a metric name: the name tests of the ring stay False
        return isinstance(other, HostMetric) and other.metric is self.metric and other.params == self.params

    __hash__ = object.__hash__

    def __repr__(self):
        return f"HostMetric({self.metric!r})"

    def distances(self, Q, X, xp):
        """Distances of every row of ``Q`` to every row of ``X`` (namespace and dtype of ``Q``)."""
        from sklearn.metrics import DistanceMetric, pairwise_distances

        Qh, Xh = _host(Q), _host(X)
        if self.metric == "precomputed":
            return xp.asarray(_precomputed_columns(Qh, np.asarray(Xh)[:, 0].astype(np.int64), Q.dtype))
        if Qh.shape[0] == 0 or Xh.shape[0] == 0:
            D = np.zeros((Qh.shape[0], Xh.shape[0]))
        elif isinstance(self.metric, DistanceMetric):
            D = self.metric.pairwise(np.asarray(Qh, dtype=np.float64), np.asarray(Xh, dtype=np.float64))
        else:
            D = pairwise_distances(Qh, Xh, metric=self.metric, ensure_all_finite=False, **self.params)
        D = np.asarray(D)
        dtype = Q.dtype if getattr(Q, "dtype", None) in (np.float32, np.float64) else np.float64
        return xp.asarray(D.astype(dtype, copy=False))


def metric_constraint(own_names):
    """The ``metric`` parameter constraint: scikit-learn's names, callables and ``DistanceMetric`` objects."""
    from sklearn.metrics import DistanceMetric

    from ..utils._param_validation import StrOptions

    return [StrOptions(set(own_names) | set(ALL_METRICS)), callable, DistanceMetric]


def sparse_accepts(metric):
    """Whether scikit-learn's brute force takes sparse rows with this (effective) metric."""
    from sklearn.metrics import DistanceMetric

    return callable(metric) or isinstance(metric, DistanceMetric) or metric in SPARSE_BRUTE_METRICS


def _precomputed_columns(Qh, ids, dtype):
    """The columns ``ids`` of a block of precomputed distances; on sparse rows a pair not stored is
    not a neighbour (infinitely far), as in scikit-learn's precomputed graphs."""
    import scipy.sparse as sp

    dtype = dtype if dtype in (np.float32, np.float64) else np.float64
    if sp.issparse(Qh):
        block = Qh.tocsc()[:, ids].tocoo()
        D = np.full(block.shape, np.inf, dtype=dtype)
        D[block.row, block.col] = block.data
        return D
    return np.asarray(Qh)[:, ids].astype(dtype, copy=False)


def precomputed_index(X, offset, n_total, xp):
    """The index shard standing for this rank's rows of a precomputed distance matrix: their global
    numbers as a float64 column (the ring sends them; a visiting block's numbers pick the columns
    of the queries' precomputed distances). scikit-learn's square-matrix rule first."""
    if X.shape[1] != n_total:
        raise ValueError(f"Precomputed matrix must be square. Input is a {n_total}x{X.shape[1]} matrix.")
    return xp.arange(offset, offset + X.shape[0], dtype=xp.float64)[:, None]


def index_rows(X):
    """The rows behind a fitted index passed as ``X`` to ``fit`` (scikit-learn accepts a fitted
    neighbours estimator, a ``BallTree`` or a ``KDTree``): for an mpiml estimator, this rank's
    rows; anything else is returned unchanged."""
    from sklearn.neighbors import BallTree, KDTree

    if isinstance(X, (BallTree, KDTree)):
        return np.asarray(X.data)
    rows = getattr(X, "_fit_X", None) if hasattr(X, "kneighbors") and hasattr(X, "n_samples_fit_") else None
    return X if rows is None else rows


def check_semimetric(p, algorithm):
    """scikit-learn's rule for the Minkowski semi-metrics (``0 < p < 1``): an error with a tree
    algorithm, else a warning (brute force, which is what runs)."""
    if p is None or not 0 < p < 1:
        return
    if algorithm in ("kd_tree", "ball_tree"):
        raise ValueError(f'algorithm="{algorithm}" does not support 0 < p < 1 for the Minkowski metric. To '
                         'resolve this problem either set p >= 1 or algorithm="brute".')
    warnings.warn("Mind that for 0 < p < 1, Minkowski metrics are not distance metrics. Continuing the execution "
                  "with `algorithm='brute'`.", UserWarning, stacklevel=5)


def resolve_host_metric(owner, metric, p, params, algorithm):
    """``(HostMetric, p, effective_metric_, effective_metric_params_)`` for a metric the dedicated
    kernels do not compute, with scikit-learn's errors; ``params`` is ``metric_params`` without ``p``."""
    from sklearn.metrics import DistanceMetric
    from sklearn.neighbors import VALID_METRICS

    if callable(metric) and not isinstance(metric, DistanceMetric):
        if algorithm == "kd_tree":
            raise ValueError(f"kd_tree does not support callable metric '{metric}'Function call overhead will "
                             "resultin very poor performance.")
        return HostMetric(metric, params), p, metric, dict(params)
    if isinstance(metric, DistanceMetric):
        return HostMetric(metric, {}), p, metric, dict(params)
    if metric == "precomputed":
        return HostMetric("precomputed", {}), p, "precomputed", {}
    check = algorithm if algorithm in ("kd_tree", "ball_tree") else "brute"
    if metric not in VALID_METRICS[check]:
        raise ValueError(f"Metric '{metric}' not valid. Use sorted(sklearn.neighbors.VALID_METRICS['{check}']) "
                         "to get valid options. Metric can also be a callable function.")
    if metric in _NEEDS and _NEEDS[metric] not in params:
        raise ValueError(f"metric={metric!r} needs metric_params={{{_NEEDS[metric]!r}: ...}} with mpiml.neighbors: "
                         "estimated from the rows at hand it would depend on how the index is sharded")
    effective_params = dict(params)
    if metric in ("minkowski", "p"):
        p = float(p if p is not None else 2.0)
        if algorithm == "kd_tree" and params.get("w") is not None:
            raise ValueError("algorithm='kd_tree' does not support the weighted Minkowski metric (metric_params "
                             "'w'): use algorithm='brute' or 'ball_tree'")
        check_semimetric(p, algorithm)
        effective_params = {"p": p, **params}
        metric = "minkowski"
    return HostMetric(metric, effective_params), p, metric, effective_params


def host_topk(Q, X, k, metric, xp, smallest_k, block_bytes):
    """``(distances, local indices)`` of the ``k`` nearest rows of ``X`` under a :class:`HostMetric`,
    by blocks of queries (``smallest_k``: the ring's selection, ties to the lower index)."""
    nq, m = Q.shape[0], X.shape[0]
    dist = xp.empty((nq, k), dtype=Q.dtype if Q.dtype in (np.float32, np.float64) else np.float64)
    idx = xp.empty((nq, k), dtype=xp.int64)
    step = max(1, int(block_bytes // max(1, m * 8)))
    for s in range(0, nq, step):
        D = metric.distances(Q[s:s + step], X, xp)
        idx[s:s + step] = smallest_k(D, k, xp)
        dist[s:s + step] = xp.take_along_axis(D, idx[s:s + step], axis=1)
    return dist, idx
