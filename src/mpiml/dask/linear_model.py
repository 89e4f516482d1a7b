"""Dask-driven linear models: ``fit`` on dask arrays or dataframes, ``predict`` -> dask array.

The SPMD estimators of :mod:`mpiml.linear_model` run on the workers that hold
the blocks (see :class:`~mpiml.dask._estimator.DaskSPMDEstimator`); their
fitted attributes (``coef_``, ``intercept_``, ...) are replicated and come back
to the client; ``score`` is global.
"""

from sklearn.base import ClassifierMixin, RegressorMixin

from ..linear_model import LinearRegression as _LinearRegression
from ..linear_model import LogisticRegression as _LogisticRegression
from ..linear_model import Ridge as _Ridge
from ._estimator import DaskSPMDEstimator

__all__ = ["LinearRegression", "Ridge", "LogisticRegression"]


class LinearRegression(RegressorMixin, DaskSPMDEstimator, spmd=_LinearRegression):
    """:class:`mpiml.linear_model.LinearRegression` driven from a Dask client."""

    _block_methods = ("predict",)


class Ridge(RegressorMixin, DaskSPMDEstimator, spmd=_Ridge):
    """:class:`mpiml.linear_model.Ridge` driven from a Dask client."""

    _block_methods = ("predict",)


class LogisticRegression(ClassifierMixin, DaskSPMDEstimator, spmd=_LogisticRegression):
    """:class:`mpiml.linear_model.LogisticRegression` driven from a Dask client."""

    _block_methods = ("predict", "predict_proba", "decision_function")
