"""A minimal SPMD estimator used by mpiml's own tests (and as a template).

:class:`MinimalSPMDTransformer` centres data on the weighted global mean: it
validates parameters and data, agrees on input problems across ranks,
communicates once per ``fit`` and declares what a model file keeps.
"""

from numbers import Real

from sklearn.base import TransformerMixin

from ..base import SPMDEstimator
from ._param_validation import Interval, StrOptions
from ._validation import validate_data, validate_sample_weight

__all__ = ["MinimalSPMDTransformer"]


class MinimalSPMDTransformer(TransformerMixin, SPMDEstimator):
    """Subtract the (weighted) global mean of the features.

    Parameters
    ----------
    shift : float, default=0.0
        Added to the output.
    mode : {"mean", "none"}, default="mean"
        "none" learns a zero offset.
    comm : Communicator, default=None
        World communicator when None.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        Global weighted mean, replicated on every rank.
    n_samples_seen_ : int
        Global number of rows, replicated.
    n_features_in_ : int
        Number of features seen in ``fit``.

    Notes
    -----
    One allreduce of ``[weighted sums | weight total | rows]`` per ``fit``.
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "shift": [Interval(Real, None, None, closed="neither")],
        "mode": [StrOptions({"mean", "none"})],
    }
    _saved_attributes = ("mean_", "n_samples_seen_")

    def __init__(self, shift=0.0, *, mode="mean", comm=None):
        self.shift = shift
        self.mode = mode
        self.comm = comm

    def fit(self, X, y=None, sample_weight=None):
        self._validate_params()
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm)
        sw = validate_sample_weight(sample_weight, X, xp=xp, comm=comm)
        part = xp.concatenate([sw @ X, xp.stack([sw.sum(), xp.asarray(X.shape[0], dtype=X.dtype)])])
        total = comm.allreduce(part) if comm.size > 1 else part
        self.mean_ = total[:-2] / total[-2] if self.mode == "mean" else xp.zeros_like(total[:-2])
        self.n_samples_seen_ = int(total[-1])
        return self

    def transform(self, X):
        self._check_is_fitted()
        X, xp = validate_data(self, X, comm=self._get_comm(), reset=False)
        return X - self.mean_ + self.shift
