"""Dask-driven clustering: ``fit`` on a dask array or dataframe, ``predict`` -> dask array.

>>> from mpiml.dask.cluster import KMeans
>>> km = KMeans(n_clusters=8, random_state=0).fit(X)     # X: dask array on the workers
>>> km.cluster_centers_                                  # NumPy (or CuPy) on the client
>>> labels = km.predict(X)                               # a dask array, computed on the workers
"""

from sklearn.base import ClusterMixin, TransformerMixin

from ..cluster import KMeans as _KMeans
from ._estimator import DaskSPMDEstimator

__all__ = ["KMeans"]


class KMeans(ClusterMixin, TransformerMixin, DaskSPMDEstimator, spmd=_KMeans):
    """:class:`mpiml.cluster.KMeans` driven from a Dask client.

    The parameters are those of :class:`mpiml.cluster.KMeans` (without ``comm``).
    ``fit`` runs the SPMD k-means on the workers that hold the blocks of ``X``
    (see :class:`~mpiml.dask._estimator.DaskSPMDEstimator`); ``cluster_centers_``,
    ``inertia_``, ``n_iter_`` come back to the client. ``labels_`` describes
    each rank's rows and stays there: use ``predict(X)`` (lazy) or
    ``fit_predict``. ``partial_fit`` is one mini-batch step over all blocks;
    ``score`` is the global one.
    """

    _local_attributes = ("labels_",)
    _block_methods = ("predict", "transform")
