"""Dask-driven decompositions: ``fit`` on dask arrays or dataframes, ``transform`` -> dask array.

The SPMD estimators of :mod:`mpiml.decomposition` run on the workers that hold
the blocks (see :class:`~mpiml.dask._estimator.DaskSPMDEstimator`);
``components_``, ``explained_variance_``, ... come back to the client.
"""

from sklearn.base import TransformerMixin

from ..decomposition import PCA as _PCA
from ..decomposition import TruncatedSVD as _TruncatedSVD
from ._estimator import DaskSPMDEstimator

__all__ = ["PCA", "TruncatedSVD"]


class PCA(TransformerMixin, DaskSPMDEstimator, spmd=_PCA):
    """:class:`mpiml.decomposition.PCA` driven from a Dask client."""

    _block_methods = ("transform", "inverse_transform", "score_samples")


class TruncatedSVD(TransformerMixin, DaskSPMDEstimator, spmd=_TruncatedSVD):
    """:class:`mpiml.decomposition.TruncatedSVD` driven from a Dask client."""

    _block_methods = ("transform", "inverse_transform")
