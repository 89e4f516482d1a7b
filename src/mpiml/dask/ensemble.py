"""Dask-driven random forests: ``fit`` on dask arrays or dataframes, ``predict`` -> dask array.

The SPMD forests of :mod:`mpiml.ensemble` (trees grown from histograms summed
over the ranks, replicated on every rank) run on the workers that hold the
blocks (see :class:`~mpiml.dask._estimator.DaskSPMDEstimator`); the fitted
forest comes back to the client.
"""

from sklearn.base import ClassifierMixin, RegressorMixin

from ..ensemble import RandomForestClassifier as _RandomForestClassifier
from ..ensemble import RandomForestRegressor as _RandomForestRegressor
from ._estimator import DaskSPMDEstimator

__all__ = ["RandomForestClassifier", "RandomForestRegressor"]


class RandomForestClassifier(ClassifierMixin, DaskSPMDEstimator, spmd=_RandomForestClassifier):
    """:class:`mpiml.ensemble.RandomForestClassifier` driven from a Dask client."""

    _block_methods = ("predict", "predict_proba", "predict_log_proba")


class RandomForestRegressor(RegressorMixin, DaskSPMDEstimator, spmd=_RandomForestRegressor):
    """:class:`mpiml.ensemble.RandomForestRegressor` driven from a Dask client."""

    _block_methods = ("predict",)
