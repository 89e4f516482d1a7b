"""Dask-driven nearest neighbours: ``fit`` on dask arrays, queries -> dask arrays.

The index stays sharded on the workers that hold the blocks (``_sharded``, see
:class:`~mpiml.dask._estimator.DaskSPMDEstimator`): every query method is an SPMD job
over those workers, the ring search of :mod:`mpiml.neighbors` among them.  Global
row indices are positions in the concatenation of the fitted blocks.  The client
gets rank 0's estimator without its shard (``_local_attributes``).
"""

from sklearn.base import ClassifierMixin, RegressorMixin

from ..neighbors import KNeighborsClassifier as _KNeighborsClassifier
from ..neighbors import KNeighborsRegressor as _KNeighborsRegressor
from ..neighbors import NearestNeighbors as _NearestNeighbors
from ._estimator import DaskSPMDEstimator

__all__ = ["NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor"]

_SHARD = ("_shard_X", "_shard_Y")


class NearestNeighbors(DaskSPMDEstimator, spmd=_NearestNeighbors):
    """:class:`mpiml.neighbors.NearestNeighbors` driven from a Dask client."""

    _sharded = True
    _query_methods = ("kneighbors",)
    _local_attributes = _SHARD


class KNeighborsClassifier(ClassifierMixin, DaskSPMDEstimator, spmd=_KNeighborsClassifier):
    """:class:`mpiml.neighbors.KNeighborsClassifier` driven from a Dask client."""

    _sharded = True
    _query_methods = ("kneighbors", "predict", "predict_proba")
    _local_attributes = _SHARD


class KNeighborsRegressor(RegressorMixin, DaskSPMDEstimator, spmd=_KNeighborsRegressor):
    """:class:`mpiml.neighbors.KNeighborsRegressor` driven from a Dask client."""

    _sharded = True
    _query_methods = ("kneighbors", "predict")
    _local_attributes = _SHARD
