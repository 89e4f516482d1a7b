"""Principal component analysis of rows spread over ranks (SPMD), on NumPy or CuPy shards."""

import math
from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin

from .._array import get_namespace, is_device_array, to_numpy
from .._errors import DistributedInputError
from ..base import SPMDEstimator
from ..utils._linalg import augmented_gram, column_sq_dev, column_sums, gram, is_sparse, svd_flip_rows, to_csr, tsqr
from ..utils._param_validation import Interval, RealNotInt, StrOptions
from ..utils._validation import validate_data
from ._lanczos import block_lanczos_svd
from ._solvers import CentredRows, randomized_svd

__all__ = ["PCA"]


# ---------------------------------------------------------------------- private compute helpers
def _allreduce(comm, x):
    if comm.size == 1:
        return x
    from ..utils._node_memory import sum_over_ranks

    return sum_over_ranks(comm, x)   # (ranks beyond the node's cores: through node memory)


def _global_mean(X, n_rows, *, comm, xp):
    """Column means over every rank's rows (one allreduce of ``d`` float64; dense or sparse ``X``)."""
    return _allreduce(comm, column_sums(X)) / n_rows


#: A covariance from the uncentred Gram matrix loses about ``ε (1 + mean² / variance)`` relative in its
#: worst column; beyond this ratio the rows are centred and the Gram formed again (a second read of X).
_MAX_CANCELLATION = 1e4


def _mean_and_covariance(X, n_rows, *, comm, xp):
    """Global mean and covariance of dense rows from one read of ``X`` and one allreduce of ``(d + 1)²`` float64.

    The Gram matrix of ``[X | 1]`` holds ``XᵀX`` and the column sums; the
    covariance is ``(XᵀX - n m mᵀ) / (n - 1)`` in float64 (scikit-learn's
    ``"covariance_eigh"`` forms it the same way, in the data's dtype).  When a
    column's mean is large against its spread (see ``_MAX_CANCELLATION``), the
    covariance is formed again from the centred rows.
    """
    d = X.shape[1]
    Z = _allreduce(comm, augmented_gram(X))
    mean = Z[:d, d] / n_rows
    C = Z[:d, :d] - n_rows * xp.outer(mean, mean)
    raw, centred = xp.diagonal(Z)[:d], xp.diagonal(C)
    worst = float(to_numpy(xp.max(raw / xp.where(centred > 0, centred, xp.inf)))) if d else 0.0
    if not np.isfinite(worst) or worst > _MAX_CANCELLATION:
        C = _allreduce(comm, gram(X, shift=mean))
    return mean, C / (n_rows - 1)


#: scikit-learn's TypeError for a sparse X with a solver that needs dense data.
_SPARSE_SOLVER_MESSAGE = ('PCA only support sparse inputs with the "arpack" and "covariance_eigh" solvers, while '
                          '"{}" was passed. See TruncatedSVD for a possible alternative.')


def validated_rows(estimator, X, comm, **kwargs):
    """:func:`validate_data` accepting sparse shards, then the row counts and whether any rank is sparse.

    One ``allgather`` of ``[rows, sparse]`` per rank (the row counts that the
    decompositions need anyway).  A ``cupyx`` sparse shard becomes CSR.
    """
    X, xp = validate_data(estimator, X, comm=comm, accept_sparse=("csr", "csc"), **kwargs)
    if is_sparse(X):
        X = to_csr(X)
    mine = np.array([X.shape[0], int(is_sparse(X))], dtype=np.int64)
    facts = mine[None] if comm.size == 1 else np.asarray(comm.allgather(mine[None]), dtype=np.int64).reshape(-1, 2)
    return X, xp, facts[:, 0], bool(facts[:, 1].any())


def _log_likelihood_of_rank(spectrum, rank, n_samples):
    """Minka's (2000) log-likelihood of a rank-``rank`` PCA model for a descending ``spectrum`` (host)."""
    d = spectrum.shape[0]
    eps = 1e-15
    if spectrum[rank - 1] < eps:
        return -np.inf
    i = np.arange(1, rank + 1)
    pu = -rank * math.log(2.0) + sum(math.lgamma((d - k + 1) / 2.0) for k in i) \
        - math.log(math.pi) * float(((d - i + 1) / 2.0).sum())
    pl = -float(np.log(spectrum[:rank]).sum()) * n_samples / 2.0
    v = max(eps, float(spectrum[rank:].sum()) / (d - rank))
    pv = -math.log(v) * n_samples * (d - rank) / 2.0
    m = d * rank - rank * (rank + 1.0) / 2.0
    pp = math.log(2.0 * math.pi) * (m + rank) / 2.0
    filled = spectrum.copy()
    filled[rank:] = v
    pa = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for a in range(rank):
            terms = (spectrum[a] - spectrum[a + 1:]) * (1.0 / filled[a + 1:] - 1.0 / filled[a])
            pa += float(np.log(terms).sum()) + (d - a - 1) * math.log(n_samples)
    return pu + pl + pv + pp - pa / 2.0 - rank * math.log(n_samples) / 2.0


def _infer_dimension(spectrum, n_samples):
    """The rank in ``[1, d - 1]`` of highest Minka log-likelihood (``n_components="mle"``)."""
    spectrum = np.asarray(spectrum, dtype=np.float64)
    ll = np.full(spectrum.shape[0], -np.inf)
    for rank in range(1, spectrum.shape[0]):
        ll[rank] = _log_likelihood_of_rank(spectrum, rank, n_samples)
    return int(np.argmax(ll))


def _centered(X, mean, copy):
    Xc = X.copy() if copy else X
    Xc -= mean.astype(X.dtype)
    return Xc


def _fast_logdet(A, xp):
    sign, ld = xp.linalg.slogdet(A)
    return float(ld) if float(sign) > 0 else -np.inf


class PCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, SPMDEstimator):
    """Principal component analysis of rows spread over ranks (SPMD), on NumPy or CuPy shards.

    Every rank calls :meth:`fit` with its own rows; the fitted model is the
    same on every rank and equals scikit-learn's PCA fitted on the
    concatenated rows (to rounding; signs by scikit-learn's ``svd_flip`` rule
    on the components).

    Parameters
    ----------
    n_components : int, float, "mle" or None, default=None
        Components to keep: an int; a float in (0, 1), the smallest number of
        components explaining more than that fraction of the variance
        (``"covariance_eigh"`` and ``"full"`` only); ``"mle"``, Minka's choice
        (needs ``n_samples >= n_features``); None, ``min(n_samples, n_features)``
        (``- 1`` with ``"arpack"``).  ``n_samples`` is the global row count.
    copy : bool, default=True
        False lets ``"full"``, ``"randomized"`` and ``"arpack"`` centre this
        rank's ``X`` in place (it is then overwritten); ``"covariance_eigh"``
        never modifies ``X``.
    whiten : bool, default=False
        Scale the projections to unit variance.
    svd_solver : {"auto", "covariance_eigh", "full", "randomized", "arpack"}, default="auto"
        ``"covariance_eigh"``: the covariance ``(X - mean)^T (X - mean) / (n - 1)``
        accumulated in float64 (one ``d x d`` allreduce), then ``eigh`` on every
        rank.  ``"full"``: exact SVD through a TSQR of the centred data (stable
        for any conditioning; one allgather or tree of ``d x d`` R factors).
        ``"randomized"``: Halko et al. with power iterations and distributed
        orthonormalisation (:mod:`mpiml.decomposition` notes).  ``"arpack"``:
        thick-restarted block Lanczos on the distributed ``X^T X`` (the same
        answer as ARPACK, not its iteration).  ``"auto"``: scikit-learn's policy
        on the global shape: ``"covariance_eigh"`` when ``d <= 1000`` and
        ``n >= 10 d``; else ``"full"`` when ``max(n, d) <= 500`` or ``"mle"``;
        else ``"randomized"`` when ``1 <= n_components < 0.8 min(n, d)``; else ``"full"``.
    tol : float, default=0.0
        ``"arpack"``: relative residual of the Ritz pairs (0: about ``1000 eps``).
    iterated_power : int or "auto", default="auto"
        Power iterations of ``"randomized"`` (``"auto"``: 7 if
        ``n_components < 0.1 min(n, d)``, else 4, as scikit-learn).
    n_oversamples : int, default=10
        Extra random vectors of ``"randomized"``.
    power_iteration_normalizer : {"auto", "QR", "LU", "none", "CholeskyQR2"}, default="auto"
        Orthonormalisation between power iterations.  ``"QR"`` and ``"LU"``: TSQR
        (LU has no communication-avoiding form; the subspace, hence the result,
        is the same); ``"CholeskyQR2"``: two Gram allreduces, TSQR when the
        iterate is too ill-conditioned; ``"auto"``: none for at most 2
        iterations, else ``"CholeskyQR2"``.
    random_state : int, RandomState instance or None, default=None
        Random matrix of ``"randomized"`` / start block of ``"arpack"``.  An
        int gives scikit-learn's draw on every rank; otherwise rank 0 draws
        and broadcasts.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Principal axes, replicated; NumPy or CuPy like ``X``, dtype of ``X``.
    explained_variance_ : ndarray of shape (n_components,)
        Replicated.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        Replicated.
    singular_values_ : ndarray of shape (n_components,)
        Of the global centred data; replicated.
    mean_ : ndarray of shape (n_features,)
        Global per-feature mean; replicated.
    n_components_ : int
    n_samples_ : int
        Global number of rows.
    noise_variance_ : float
        Probabilistic-PCA noise variance (as scikit-learn's: a NumPy scalar of
        the dtype of ``X``, or 0.0 when every component is kept).
    n_features_in_ : int

    Notes
    -----
    Communicated per fit, ``d`` features, ``p`` ranks, ``k`` components:

    - always: the input agreement (one small ``allgather_obj``), the row
      counts (allgather of one int64), the mean (allreduce of ``d`` float64);
    - ``"covariance_eigh"``: one allreduce of ``d x d`` float64 (``8 d^2`` bytes);
    - ``"full"``: one TSQR of the centred data (allgather of ``(d + 1) d``
      values per rank, or a tree of ``d x d`` messages);
    - ``"randomized"``: see :func:`mpiml.decomposition._solvers.randomized_svd`
      (per power iteration one allreduce of ``d x (k + n_oversamples)``
      float64 plus the normaliser's), plus one scalar allreduce (total variance);
    - ``"arpack"``: one allreduce of ``d`` float64 per product of ``XᵀX`` with
      a vector (blocks of one, as ARPACK's), plus one scalar allreduce.

    :meth:`transform`, :meth:`inverse_transform` and :meth:`score_samples` act
    on local rows and communicate nothing; :meth:`score` is global (one
    allreduce of two float64).
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "n_components": [Interval(Integral, 0, None, closed="left"), Interval(RealNotInt, 0, 1, closed="neither"),
                         StrOptions({"mle"}), None],
        "copy": ["boolean"],
        "whiten": ["boolean"],
        "svd_solver": [StrOptions({"auto", "full", "covariance_eigh", "arpack", "randomized"})],
        "tol": [Interval(Real, 0, None, closed="left")],
        "iterated_power": [StrOptions({"auto"}), Interval(Integral, 0, None, closed="left")],
        "n_oversamples": [Interval(Integral, 1, None, closed="left")],
        "power_iteration_normalizer": [StrOptions({"auto", "QR", "LU", "none", "CholeskyQR2"})],
        "random_state": ["random_state"],
    }
    _saved_attributes = ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_",
                         "mean_", "n_components_", "n_samples_", "noise_variance_")

    def __init__(self, n_components=None, *, copy=True, whiten=False, svd_solver="auto", tol=0.0,
                 iterated_power="auto", n_oversamples=10, power_iteration_normalizer="auto", random_state=None,
                 comm=None):
        self.n_components = n_components
        self.copy = copy
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.tol = tol
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.comm = comm

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self.svd_solver in ("auto", "arpack", "covariance_eigh")
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    # ------------------------------------------------------------------ fitting
    def _choose_solver(self, n, d, n_components):
        solver = self.svd_solver
        if solver != "auto":
            return solver
        if d <= 1000 and n >= 10 * d:
            return "covariance_eigh"
        if max(n, d) <= 500 or n_components == "mle":
            return "full"
        if 1 <= n_components < 0.8 * min(n, d):
            return "randomized"
        return "full"

    def _fit(self, X):
        """Fit; returns ``(X_transformed or None, X, x_is_centered, xp)`` for fit_transform."""
        self._validate_params()
        comm = self._get_comm()
        if is_sparse(X) and comm.size == 1 and self.svd_solver not in ("auto", "arpack", "covariance_eigh"):
            raise TypeError(_SPARSE_SOLVER_MESSAGE.format(self.svd_solver))  # scikit-learn's check, before the data's
        X, xp, counts, sparse = validated_rows(self, X, comm)
        if sparse and self.svd_solver not in ("auto", "arpack", "covariance_eigh"):
            raise TypeError(_SPARSE_SOLVER_MESSAGE.format(self.svd_solver))
        n, d = int(counts.sum()), X.shape[1]
        offset = int(counts[:comm.rank].sum())
        fixed = "arpack" if sparse and self.svd_solver == "auto" else self.svd_solver
        if self.n_components is None:
            n_components = min(n, d) - 1 if fixed == "arpack" else min(n, d)
        else:
            n_components = self.n_components
        solver = fixed if fixed != "auto" else self._choose_solver(n, d, n_components)
        self._fit_svd_solver = solver
        self._fit_sparse = sparse
        if solver == "covariance_eigh" and not sparse:
            self.mean_, C = _mean_and_covariance(X, n, comm=comm, xp=xp)
            return self._fit_full(X, n, d, n_components, solver, comm, xp, C=C)
        self.mean_ = _global_mean(X, n, comm=comm, xp=xp)
        if solver in ("full", "covariance_eigh"):
            return self._fit_full(X, n, d, n_components, solver, comm, xp)
        return self._fit_truncated(X, n, d, offset, n_components, solver, comm, xp)

    def _fit_full(self, X, n, d, n_components, solver, comm, xp, C=None):
        if n_components == "mle":
            if n < d:
                raise ValueError("n_components='mle' is only supported if n_samples >= n_features")
        elif not 0 <= n_components <= min(n, d):
            raise ValueError(f"n_components={n_components} must be between 0 and min(n_samples, n_features)="
                             f"{min(n, d)} with svd_solver={solver!r}")
        dtype = X.dtype
        x_is_centered = False
        if solver == "full":
            Xc = _centered(X, self.mean_, self.copy)
            x_is_centered = not self.copy
            _, R = tsqr(Xc, comm)
            _, S, Vt = xp.linalg.svd(R.astype(xp.float64), full_matrices=False)
            explained_variance = S ** 2 / (n - 1)
        else:
            if C is None:
                C = _allreduce(comm, gram(X, shift=self.mean_)) / (n - 1)
            evals, evecs = xp.linalg.eigh(C)
            evals, evecs = evals[::-1], evecs[:, ::-1]
            evals = xp.where(evals < 0, 0.0, evals)
            explained_variance = evals
            S = xp.sqrt(evals * (n - 1))
            Vt = xp.ascontiguousarray(evecs.T)
        _, Vt = svd_flip_rows(Vt)
        total_var = explained_variance.sum()
        ratio = explained_variance / total_var
        if n_components == "mle":
            n_components = _infer_dimension(to_numpy(explained_variance), n)
        elif 0 < n_components < 1.0:
            cumsum = np.cumsum(to_numpy(ratio))
            n_components = int(np.searchsorted(cumsum, n_components, side="right")) + 1
        if n_components < min(d, n):
            self.noise_variance_ = np.dtype(dtype).type(float(explained_variance[n_components:].mean()))
        else:
            self.noise_variance_ = 0.0
        self.n_samples_ = n
        self.n_components_ = int(n_components)
        self.components_ = xp.ascontiguousarray(Vt[:n_components].astype(dtype))
        self.explained_variance_ = explained_variance[:n_components].astype(dtype)
        self.explained_variance_ratio_ = ratio[:n_components].astype(dtype)
        self.singular_values_ = S[:n_components].astype(dtype)
        self.mean_ = self.mean_.astype(dtype)
        return None, X, x_is_centered, xp

    def _fit_truncated(self, X, n, d, offset, n_components, solver, comm, xp):
        if isinstance(n_components, str):
            raise ValueError(f"n_components={n_components!r} cannot be a string with svd_solver='{solver}'")
        if not 1 <= n_components <= min(n, d):
            raise ValueError(f"n_components={n_components!r} must be between 1 and min(n_samples, n_features)="
                             f"{min(n, d)!r} with svd_solver='{solver}'")
        if solver == "arpack" and n_components == min(n, d):
            raise ValueError(f"n_components={n_components!r} must be strictly less than min(n_samples, n_features)="
                             f"{min(n, d)!r} with svd_solver='{solver}'")
        dtype = X.dtype
        if self._fit_sparse:  # implicit centring: the sparse shard is never densified nor modified
            Xc, x_is_centered = CentredRows(X, self.mean_), False
        else:
            Xc = _centered(X, self.mean_, self.copy)
            x_is_centered = not self.copy
        if solver == "randomized":
            U, S, Vt = randomized_svd(Xc, n_components, comm=comm, xp=xp, n_rows=n, row_offset=offset,
                                      n_oversamples=self.n_oversamples, n_iter=self.iterated_power,
                                      power_iteration_normalizer=self.power_iteration_normalizer,
                                      random_state=self.random_state)
        else:
            U, S, Vt, self.n_iter_ = block_lanczos_svd(Xc, n_components, comm=comm, xp=xp, tol=self.tol,
                                                       random_state=self.random_state)
        U, Vt = svd_flip_rows(Vt, U)
        self.n_samples_ = n
        self.components_ = xp.ascontiguousarray(Vt)
        self.n_components_ = int(n_components)
        self.explained_variance_ = (S.astype(xp.float64) ** 2 / (n - 1)).astype(dtype)
        if self._fit_sparse:
            sq = column_sq_dev(X, self.mean_).sum(keepdims=True)
        else:
            sq = xp.zeros(1, dtype=xp.float64)
            sq[0] = (Xc.astype(xp.float64, copy=False) ** 2).sum() if Xc.size else 0.0
        total_var = float(to_numpy(_allreduce(comm, sq))[0] / np.float64(n - 1))
        self.explained_variance_ratio_ = (self.explained_variance_.astype(xp.float64) / total_var).astype(dtype)
        self.singular_values_ = S.astype(dtype)
        if self.n_components_ < min(d, n):
            self.noise_variance_ = np.dtype(dtype).type(
                (total_var - float(self.explained_variance_.astype(xp.float64).sum())) / (min(d, n) - n_components))
        else:
            self.noise_variance_ = 0.0
        self.mean_ = self.mean_.astype(dtype)
        out = None
        if solver == "randomized":  # scikit-learn returns U * S from the factorisation itself
            out = U * (math.sqrt(n - 1) if self.whiten else S[None, :])
        return out, X, x_is_centered, xp

    def fit(self, X, y=None):
        """Fit the model with the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float64 and float32 are kept).
        y : Ignored

        Returns
        -------
        self : PCA
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit, then return the projections of this rank's rows.

        Returns
        -------
        X_new : ndarray of shape (n_local_samples, n_components)
        """
        out, X, x_is_centered, xp = self._fit(X)
        if out is not None:
            return out
        return self._transform(X, xp, x_is_centered=x_is_centered)

    # ------------------------------------------------------------------ using the model
    def _local_input(self, X, features=True, accept_sparse=True):
        self._check_is_fitted()
        if features:
            X, xp = validate_local_rows(self, X, accept_sparse=accept_sparse)
        else:
            X, xp = _check_local(X)
        return X, xp, self._attributes_on(xp)

    def _attributes_on(self, xp):
        def on(a):
            if xp is np and is_device_array(a):
                return a.get()
            if xp is not np and not is_device_array(a):
                return xp.asarray(a)
            return a
        return {name: on(getattr(self, name)) for name in ("components_", "mean_", "explained_variance_")}

    def _transform(self, X, xp, x_is_centered=False):
        att = self._attributes_on(xp)
        C = att["components_"].astype(X.dtype, copy=False)
        out = X @ C.T
        if not x_is_centered:
            out -= (att["mean_"].astype(X.dtype, copy=False) @ C.T)[None, :]
        if self.whiten:
            scale = xp.sqrt(att["explained_variance_"]).astype(X.dtype, copy=False)
            scale = xp.where(scale < np.finfo(scale.dtype).eps, np.finfo(scale.dtype).eps, scale)
            out /= scale
        return out

    def transform(self, X):
        """Project this rank's rows on the principal axes (no communication).

        Returns
        -------
        X_new : ndarray of shape (n_local_samples, n_components)
        """
        X, xp, _ = self._local_input(X)
        return self._transform(X, xp)

    def inverse_transform(self, X):
        """Map projections of this rank's rows back to the feature space (no communication).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_components)

        Returns
        -------
        X_original : ndarray of shape (n_local_samples, n_features)
        """
        X, xp, att = self._local_input(X, features=False)
        C = att["components_"]
        if self.whiten:
            C = xp.sqrt(att["explained_variance_"])[:, None] * C
        return X @ C.astype(X.dtype, copy=False) + att["mean_"].astype(X.dtype, copy=False)

    def get_covariance(self):
        """Covariance of the data under the probabilistic PCA model (replicated, no communication).

        Returns
        -------
        cov : ndarray of shape (n_features, n_features)
        """
        self._check_is_fitted()
        xp = get_namespace(self.components_)
        C, ev = self.components_, self.explained_variance_
        if self.whiten:
            C = C * xp.sqrt(ev[:, None])
        diff = xp.where(ev > self.noise_variance_, ev - self.noise_variance_, 0.0).astype(C.dtype)
        cov = (C.T * diff) @ C
        cov[xp.arange(cov.shape[0]), xp.arange(cov.shape[0])] += self.noise_variance_
        return cov

    def get_precision(self):
        """Inverse of :meth:`get_covariance` (matrix inversion lemma; no communication).

        Returns
        -------
        precision : ndarray of shape (n_features, n_features)
        """
        self._check_is_fitted()
        xp = get_namespace(self.components_)
        d = self.components_.shape[1]
        if self.n_components_ == 0:
            return xp.eye(d) / self.noise_variance_
        if self.noise_variance_ == 0.0:
            return xp.linalg.inv(self.get_covariance())
        C, ev = self.components_, self.explained_variance_
        if self.whiten:
            C = C * xp.sqrt(ev[:, None])
        diff = xp.where(ev > self.noise_variance_, ev - self.noise_variance_, 0.0)
        small = C @ C.T / self.noise_variance_
        idx = xp.arange(small.shape[0])
        small[idx, idx] += 1.0 / diff
        precision = C.T @ xp.linalg.inv(small) @ C
        precision /= -(self.noise_variance_ ** 2)
        idx = xp.arange(d)
        precision[idx, idx] += 1.0 / self.noise_variance_
        return precision

    def _score_samples(self, X, xp):
        att = self._attributes_on(xp)
        Xr = X - att["mean_"].astype(X.dtype, copy=False)
        precision = self.get_precision()
        precision = precision.get() if xp is np and is_device_array(precision) else xp.asarray(precision)
        d = X.shape[1]
        ll = -0.5 * (Xr * (Xr @ precision)).sum(axis=1)
        ll -= 0.5 * (d * math.log(2.0 * math.pi) - _fast_logdet(precision, xp))
        return ll

    def score_samples(self, X):
        """Log-likelihood of each of this rank's rows under the model (no communication).

        Returns
        -------
        ll : ndarray of shape (n_local_samples,)
        """
        X, xp, _ = self._local_input(X, accept_sparse=False)
        return self._score_samples(X, xp)

    def score(self, X, y=None):
        """Average log-likelihood of the rows of every rank.

        Communicated: the input agreement (one small ``allgather_obj``) and one
        allreduce of two float64 (sum of log-likelihoods, row count).

        Returns
        -------
        float
        """
        self._check_is_fitted()
        comm = self._get_comm()
        X, xp = validate_data(self, X, comm=comm, reset=False)
        error = None
        try:
            X = _sparse_rows(X, False)
        except TypeError as exc:
            error = exc
        if comm.size > 1:
            texts = comm.allgather_obj(None if error is None else str(error))
            bad = [r for r, t in enumerate(texts) if t]
            if bad:
                raise DistributedInputError(f"Invalid input X on rank(s) {bad}: {texts[bad[0]]}")
        elif error is not None:
            raise error
        ll = self._score_samples(X, xp)
        pack = xp.zeros(2, dtype=xp.float64)
        pack[0] = ll.sum() if ll.shape[0] else 0.0
        pack[1] = ll.shape[0]
        pack = to_numpy(_allreduce(comm, pack))
        return float(pack[0] / pack[1])


def validate_local_rows(estimator, X, accept_sparse=True):
    """Validate this rank's rows for a local method (transform...): no communication.

    Unlike a single-process fit, a rank may hold no rows: an empty 2-D shard
    with the right number of features passes and gives empty results.  Sparse
    rows (SciPy or ``cupyx``) come back as CSR, or raise scikit-learn's
    TypeError when ``accept_sparse`` is False.
    """
    from ..comm import get_comm

    if getattr(X, "ndim", None) == 2 and X.shape[0] == 0 and hasattr(X, "dtype"):
        xp = get_namespace(X)
        X = _sparse_rows(X, accept_sparse)
        if X.shape[1] != estimator.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(estimator).__name__} is expecting "
                             f"{estimator.n_features_in_} features as input.")
        return (X if X.dtype in (xp.float32, xp.float64) else X.astype(xp.float64)), xp
    X, xp = validate_data(estimator, X, comm=get_comm("self"), reset=False,
                          accept_sparse=("csr", "csc") if accept_sparse else False)
    return _sparse_rows(X, accept_sparse), xp


def _sparse_rows(X, accept_sparse):
    """CSR for accepted sparse rows; scikit-learn's TypeError for a ``cupyx`` matrix where dense is required."""
    if not is_sparse(X):
        return X
    if not accept_sparse:
        raise TypeError("Sparse data was passed for X, but dense data is required. Use '.toarray()' to convert to "
                        "a dense numpy array.")
    return to_csr(X)


def _check_local(X):
    """Validate a local array given to inverse_transform (no feature-count check, no communication)."""
    from sklearn.utils.validation import check_array

    if is_device_array(X):
        xp = get_namespace(X)
        if X.ndim != 2:
            raise ValueError(f"Expected 2D array, got {X.ndim}D array instead.")
        if X.dtype not in (xp.float32, xp.float64):
            X = X.astype(xp.float64)
        return X, xp
    return check_array(X, input_name="X", dtype=[np.float64, np.float32], ensure_min_samples=0), np
