"""Least squares over the rows of every rank (SPMD): LinearRegression and Ridge.

Two ways to the same solution:

* ``"normal"``: the weighted, centred Gram matrix ``XᵀWX`` and ``XᵀWy`` are
  accumulated locally in float64 and summed with one allreduce; the small
  system is solved on every rank alike (eigendecomposition for least squares,
  Cholesky for ridge).  Cheap, but it squares the condition number.
* ``"tsqr"``: a tall-skinny QR: each rank reduces ``[X | y]`` (centred,
  weighted) to a small triangular factor, the factors are gathered and
  reduced once more, and the system is solved from ``R``.  Backward stable
  like Householder QR on the gathered data.
"""

from numbers import Integral, Real

import numpy as np
import scipy.linalg
from sklearn.base import MultiOutputMixin, RegressorMixin

from ..base import SPMDEstimator
from ..utils._linalg import tsqr
from ..utils._param_validation import Interval, StrOptions
from ..utils._validation import validate_sample_weight
from ._base import allreduce_identical, as_like, chunk_rows, local_X, validate_X_y

__all__ = ["LinearRegression", "Ridge"]


# ---------------------------------------------------------------------- private compute helpers
def _as_2d_targets(y):
    return y.reshape(-1, 1) if y.ndim == 1 else y


def _weighted_means(X, Y, sw, *, comm, xp):
    """Global weighted means of the columns of X and Y and the weight sum (one allreduce).

    ``sw=None`` means unit weights.  Returns host float64 ``(x_mean, y_mean, sw_sum)``.
    """
    d, t = X.shape[1], Y.shape[1]
    pack = np.zeros(d + t + 1)
    if X.shape[0]:
        if sw is None:
            ones = xp.ones(X.shape[0], dtype=X.dtype)
            # a GEMV in X's dtype for float64 (much faster than a strided sum); float32 sums in float64
            pack[:d] = as_like(ones @ X if X.dtype == xp.float64 else X.sum(axis=0, dtype=xp.float64), np)
            pack[d:d + t] = as_like(Y.sum(axis=0, dtype=xp.float64), np)
            pack[-1] = X.shape[0]
        else:
            w = sw.astype(xp.float64)
            pack[:d] = as_like(w @ X.astype(xp.float64, copy=False), np)
            pack[d:d + t] = as_like(w @ Y.astype(xp.float64, copy=False), np)
            pack[-1] = float(w.sum())
    pack = allreduce_identical(comm, pack)
    return pack[:d] / pack[-1], pack[d:d + t] / pack[-1], float(pack[-1])


def _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
    """Yield float64 chunks ``sqrt(w) * (X - x_mean)`` and ``sqrt(w) * (Y - y_mean)``.

    Each chunk costs one pass over its rows (the subtraction or the cast makes
    the float64 copy; the scaling is in place); float64 input without centring
    or weights is used as is.
    """
    step = chunk_rows(X.shape[1] + Y.shape[1], xp=xp)
    xm = None if x_mean is None else xp.asarray(x_mean)
    ym = None if y_mean is None else xp.asarray(y_mean)
    for s in range(0, X.shape[0], step):
        parts = []
        for A, m in ((X[s:s + step], xm), (Y[s:s + step], ym)):
            A = A if m is None else A - m  # m is float64, so the difference is a float64 copy
            parts.append(A.astype(xp.float64, copy=False))
        if sw is not None:
            root = xp.sqrt(sw[s:s + step].astype(xp.float64))[:, None]
            parts = [A * root for A in parts]
        yield parts[0], parts[1]


def _gram(X, Y, sw, x_mean, y_mean, *, comm, xp):
    """Global ``(XᵀWX, XᵀWy)`` of the centred data in float64 on the host (one allreduce)."""
    d, t = X.shape[1], Y.shape[1]
    G = xp.zeros((d, d), dtype=xp.float64)
    B = xp.zeros((d, t), dtype=xp.float64)
    for Xc, Yc in _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
        G += Xc.T @ Xc
        B += Xc.T @ Yc
    pack = np.concatenate([as_like(G, np).ravel(), as_like(B, np).ravel()])
    pack = allreduce_identical(comm, pack)
    return pack[:d * d].reshape(d, d), pack[d * d:].reshape(d, t)


def _qr_r(A, xp):
    """The square upper-triangular factor of ``A`` (rows beyond its row count are zero)."""
    k = A.shape[1]
    R = xp.linalg.qr(A, mode="r") if A.shape[0] else xp.zeros((0, k), dtype=A.dtype)
    if R.shape[0] < k:
        R = xp.concatenate([R, xp.zeros((k - R.shape[0], k), dtype=R.dtype)])
    return R


def _tsqr_r(X, Y, sw, x_mean, y_mean, *, comm, xp):
    """``R`` of the global centred, weighted ``[X | Y]`` (TSQR), the same on every rank.

    Locally the shard is reduced chunk by chunk (QR of the running ``R``
    stacked on the next chunk, so memory stays bounded); the local factors are
    then combined by :func:`mpiml.utils._linalg.tsqr` (one allgather of a
    ``(d + t)²`` factor per rank, or a binary tree beyond 16 ranks), which
    returns ``R`` with a non-negative diagonal, replicated on every rank.
    """
    k = X.shape[1] + Y.shape[1]
    R = xp.zeros((0, k), dtype=xp.float64)
    for Xc, Yc in _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
        R = _qr_r(xp.concatenate([R, xp.concatenate([Xc, Yc], axis=1)]), xp)
    _, R = tsqr(_qr_r(R, xp), comm)
    return as_like(R, np)


def _lstsq_from_gram(G, B, cond):
    """Minimum-norm least squares from the normal equations; singular values of X and rank.

    Eigenvalues below ``(cond * largest singular value)²`` are treated as zero,
    which is scikit-learn's rule (``scipy.linalg.lstsq(..., cond=tol)``)
    expressed on ``XᵀX``.
    """
    lam, V = np.linalg.eigh(G)
    lam, V = lam[::-1], V[:, ::-1]
    sing = np.sqrt(np.clip(lam, 0.0, None))
    keep = sing > cond * sing[0] if sing.size and sing[0] > 0 else np.zeros(sing.shape, bool)
    Vk = V[:, keep]
    coef = Vk @ ((Vk.T @ B) / lam[keep][:, None])
    return coef, int(keep.sum()), sing


def _lstsq_from_r(R, Z, cond):
    """Minimum-norm least squares from the triangular factor; singular values and rank."""
    coef, _, rank, sing = scipy.linalg.lstsq(R, Z, cond=cond, check_finite=False)
    if sing is None:  # LAPACK drivers without singular values
        sing = scipy.linalg.svdvals(R)
    return coef, int(rank), sing


def _ridge_from_gram(G, B, alphas):
    """Solve ``(G + alpha I) w = b`` per target (Cholesky; eigen-fallback when singular)."""
    d, t = B.shape
    coef = np.empty((d, t))
    groups = {}
    for j, a in enumerate(alphas):
        groups.setdefault(float(a), []).append(j)
    for a, cols in groups.items():
        A = G + a * np.eye(d)
        try:
            coef[:, cols] = scipy.linalg.cho_solve(scipy.linalg.cho_factor(A, lower=False, check_finite=False),
                                                   B[:, cols], check_finite=False)
        except np.linalg.LinAlgError:
            lam, V = np.linalg.eigh(A)
            keep = lam > max(lam.max(), 0.0) * d * np.finfo(np.float64).eps
            Vk = V[:, keep]
            coef[:, cols] = Vk @ ((Vk.T @ B[:, cols]) / lam[keep][:, None])
    return coef


def _ridge_from_r(R, Z, alphas):
    """Ridge from the triangular factor through its SVD: ``w = V diag(s / (s² + alpha)) Uᵀ z``."""
    U, s, Vt = scipy.linalg.svd(R, full_matrices=False, check_finite=False)
    UtZ = U.T @ Z
    coef = np.empty((R.shape[1], Z.shape[1]))
    # singular values at rounding level are zero: alpha = 0 on rank-deficient X gives the minimum-norm solution
    keep = s > (s[0] if s.size else 0.0) * R.shape[1] * np.finfo(np.float64).eps
    for j, a in enumerate(alphas):
        den = s * s + a
        f = np.divide(s, den, out=np.zeros_like(s), where=keep & (den > 0))
        coef[:, j] = Vt.T @ (f * UtZ[:, j])
    return coef


def _solve_least_squares(X, y, sw, *, fit_intercept, solver, comm, xp, solve_gram, solve_r):
    """Centre, reduce and solve; returns host float64 ``(coef (t, d), intercept (t,), extra)``."""
    Y = _as_2d_targets(y)
    d, t = X.shape[1], Y.shape[1]
    if fit_intercept:
        x_mean, y_mean, _ = _weighted_means(X, Y, sw, comm=comm, xp=xp)
    else:
        x_mean, y_mean = None, None
    if solver == "tsqr":
        R = _tsqr_r(X, Y, sw, x_mean, y_mean, comm=comm, xp=xp)
        coef, extra = solve_r(R[:d, :d], R[:d, d:])
    else:
        G, B = _gram(X, Y, sw, x_mean, y_mean, comm=comm, xp=xp)
        coef, extra = solve_gram(G, B)
    coef = coef.T
    intercept = y_mean - coef @ x_mean if fit_intercept else np.zeros(t)
    return coef, intercept, extra


class _LinearRegressorBase(MultiOutputMixin, RegressorMixin, SPMDEstimator):
    """Prediction and the global R² shared by LinearRegression and Ridge."""

    def _fit_common(self, X, y, sample_weight):
        self._validate_params()
        comm = self._get_comm()
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=True, multi_output=True)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=X.dtype, only_non_negative=True, comm=comm)
        return X, y, sw, xp, comm

    def _set_coef(self, coef, intercept, y, X, xp):
        dtype = X.dtype
        if y.ndim == 1:
            self.coef_ = as_like(coef[0], xp, dtype)
            self.intercept_ = float(intercept[0]) if self.fit_intercept else 0.0
        else:
            self.coef_ = as_like(coef, xp, dtype)
            self.intercept_ = as_like(intercept, xp, dtype) if self.fit_intercept else 0.0

    def _decision_function(self, X):
        X, xp = local_X(self, X)
        coef = as_like(self.coef_, xp, X.dtype)
        intercept = self.intercept_
        if not isinstance(intercept, float):
            intercept = as_like(intercept, xp, X.dtype)
        return X @ coef.T + intercept

    def predict(self, X):
        """Predictions for this rank's rows (no communication).

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            NumPy or CuPy; the output follows it.

        Returns
        -------
        ndarray of shape (n_local_samples,) or (n_local_samples, n_targets)
        """
        return self._decision_function(X)

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination R² over the rows of every rank.

        Two allreduces: ``[Σw, Σw·y]`` for the weighted mean of ``y``, then
        ``[Σw·(y - ȳ)², Σw·(y - ŷ)²]``; outputs are averaged uniformly as in
        :func:`sklearn.metrics.r2_score`.  The same float on every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
        sample_weight : array-like of shape (n_local_samples,), default=None

        Returns
        -------
        float
        """
        comm = self._get_comm()
        self._check_is_fitted()
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=True, multi_output=True, reset=False)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=xp.float64, comm=comm, allow_all_zero=True)
        Y = _as_2d_targets(y).astype(xp.float64)
        P = _as_2d_targets(self.predict(X)).astype(xp.float64)
        t = Y.shape[1]
        first = np.concatenate([[float(sw.sum())], as_like(sw @ Y, np)]) if X.shape[0] else np.zeros(t + 1)
        first = allreduce_identical(comm, first)
        y_mean = xp.asarray(first[1:] / first[0])
        second = np.zeros(2 * t)
        if X.shape[0]:
            second[:t] = as_like(sw @ (Y - y_mean) ** 2, np)
            second[t:] = as_like(sw @ (Y - P) ** 2, np)
        second = allreduce_identical(comm, second)
        den, num = second[:t], second[t:]
        r2 = np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0), np.where(num == 0, 1.0, 0.0))
        return float(np.mean(r2))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class LinearRegression(_LinearRegressorBase):
    """Ordinary least squares over the rows of every rank (SPMD), on NumPy or CuPy shards.

    Every rank calls :meth:`fit` with its own rows (and their targets); the
    coefficients are the same on every rank and equal, up to rounding, to
    scikit-learn's on the concatenated rows.

    Parameters
    ----------
    fit_intercept : bool, default=True
        Whether to fit an intercept (the data are centred on the global
        weighted mean).
    copy_X : bool, default=True
        Accepted for compatibility; ``X`` is never modified (centring works on
        float64 copies of row chunks).
    tol : float, default=1e-6
        Singular values of the centred, weighted ``X`` below ``tol`` times the
        largest are treated as zero (scikit-learn's ``cond``), giving the
        minimum-norm solution for rank-deficient ``X``.
    n_jobs : int or None, default=None
        Accepted for compatibility; parallelism comes from the ranks.
    positive : bool, default=False
        Only ``False``: non-negative least squares is not implemented and
        ``positive=True`` raises ``ValueError`` in :meth:`fit`.
    solver : {"auto", "normal", "tsqr"}, default="auto"
        ``"normal"``: normal equations (one allreduce); ``"tsqr"``: tall-skinny
        QR (one allgather of small factors); ``"auto"`` is ``"normal"``.
        See Notes for their accuracy.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Replicated on every rank; NumPy or CuPy like ``X``, dtype of ``X``.
    intercept_ : float or ndarray of shape (n_targets,)
        Replicated; 0.0 when ``fit_intercept=False``.
    rank_ : int
        Numerical rank of the centred, weighted ``X`` (replicated).
    singular_ : ndarray of shape (n_features,)
        Singular values of the centred, weighted ``X``, host float64, replicated.
    solver_ : str
        The solver used (``"normal"`` or ``"tsqr"``).
    n_features_in_ : int
        Number of features.

    Notes
    -----
    Communicated per fit (float64, host buffers; ``d`` features, ``t`` targets,
    ``p`` ranks):

    * with ``fit_intercept``: one allreduce of ``d + t + 1`` values, the
      weighted sums of ``[X | y | 1]`` (the global means);
    * ``"normal"``: one allreduce of ``d² + d·t`` values, ``[XᵀWX | XᵀWy]``
      of the centred data;
    * ``"tsqr"``: one allgather of a ``(d + t)²`` triangular factor per rank;
    * plus the input agreement (one small ``allgather_obj`` for ``X``, one for
      ``y`` and one for ``sample_weight``).

    Every reduction is a binomial reduce-then-broadcast, so the fitted
    attributes are bit-identical on every rank; they depend on the number of
    ranks only through floating-point reassociation (about 1e-15 relative for
    well-conditioned data).

    Accuracy: with ``κ`` the condition number of the centred, weighted ``X``,
    the normal equations give a relative error in ``coef_`` of about ``κ²·ε``
    (ε = 2.2e-16; float64 accumulation even for float32 ``X``), so they suit
    ``κ ≲ 10⁵`` for 1e-6 accuracy and break down near ``κ ≈ 10⁸``, where
    ``XᵀX`` is numerically singular and small singular values fall under the
    ``tol`` rule (``rank_`` then under-counts).  TSQR's error is about ``κ·ε``,
    like scikit-learn's own ``lstsq``: use ``solver="tsqr"`` for ill-conditioned
    data.  ``singular_`` from the normal equations is accurate only for values
    above about ``1e-8`` times the largest.

    :meth:`predict` acts on local rows and communicates nothing; :meth:`score`
    is global (two allreduces of ``1 + t`` and ``2 t`` values).
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "fit_intercept": ["boolean"],
        "copy_X": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "n_jobs": [None, Integral],
        "positive": ["boolean"],
        "solver": [StrOptions({"auto", "normal", "tsqr"})],
    }
    _saved_attributes = ("coef_", "intercept_", "rank_", "singular_", "solver_")

    def __init__(self, *, fit_intercept=True, copy_X=True, tol=1e-6, n_jobs=None, positive=False, solver="auto",
                 comm=None):
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.tol = tol
        self.n_jobs = n_jobs
        self.positive = positive
        self.solver = solver
        self.comm = comm

    def fit(self, X, y, sample_weight=None):
        """Fit the least-squares model to the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float64 and float32 are kept).
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
            Targets of this rank's rows.
        sample_weight : array-like of shape (n_local_samples,), default=None
            Non-negative weights of this rank's rows.

        Returns
        -------
        self : LinearRegression
        """
        if self.positive:
            self._validate_params()
            raise ValueError("positive=True is not supported by mpiml's LinearRegression (non-negative least "
                             "squares needs an iterative solver); use positive=False.")
        X, y, sw, xp, comm = self._fit_common(X, y, sample_weight)
        sw = None if sample_weight is None else sw
        solver = "normal" if self.solver == "auto" else self.solver
        coef, intercept, (rank, sing) = _solve_least_squares(
            X, y, sw, fit_intercept=self.fit_intercept, solver=solver, comm=comm, xp=xp,
            solve_gram=lambda G, B: _split3(_lstsq_from_gram(G, B, self.tol)),
            solve_r=lambda R, Z: _split3(_lstsq_from_r(R, Z, self.tol)))
        self._set_coef(coef, intercept, y, X, xp)
        self.rank_ = rank
        self.singular_ = np.asarray(sing, dtype=np.float64)
        self.solver_ = solver
        return self


def _split3(result):
    coef, rank, sing = result
    return coef, (rank, sing)


class Ridge(_LinearRegressorBase):
    """Least squares with an L2 penalty over the rows of every rank (SPMD), NumPy or CuPy.

    Minimises ``||sqrt(W) (y - Xw - b)||² + alpha ||w||²`` (the intercept is
    not penalised), one problem per target.  The solvers are direct, so
    scikit-learn's ``max_iter``, ``tol`` and ``random_state`` have no
    counterpart here.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Penalty strength, non-negative; one per target when an array.
    fit_intercept : bool, default=True
        Whether to fit an intercept.
    copy_X : bool, default=True
        Accepted for compatibility; ``X`` is never modified.
    solver : {"auto", "cholesky", "normal", "svd", "tsqr"}, default="auto"
        ``"cholesky"`` (alias ``"normal"``, and what ``"auto"`` picks): the
        normal equations ``(XᵀWX + alpha I) w = XᵀWy`` solved by Cholesky (an
        eigendecomposition if the matrix is singular).  ``"svd"`` (alias
        ``"tsqr"``): the SVD of the TSQR factor ``R`` of ``[X | y]``.
    positive : bool, default=False
        Only ``False`` (``True`` raises ``ValueError`` in :meth:`fit`).
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Replicated; NumPy or CuPy like ``X``, dtype of ``X``.
    intercept_ : float or ndarray of shape (n_targets,)
        Replicated; 0.0 when ``fit_intercept=False``.
    n_iter_ : None
        The solvers are direct.
    solver_ : str
        ``"cholesky"`` or ``"svd"``.
    n_features_in_ : int
        Number of features.

    Notes
    -----
    Communicated per fit: as :class:`LinearRegression` (the means, then one
    allreduce of ``d² + d·t`` values for ``"cholesky"`` or one allgather of a
    ``(d + t)²`` factor per rank for ``"svd"``), all bit-identical on every rank.

    Accuracy: the penalty bounds the condition number of the normal
    equations by ``(σ_max² + alpha) / alpha``; with ``alpha`` small against
    ``σ_max²`` the limits of :class:`LinearRegression` apply (``"cholesky"``:
    about ``κ²·ε`` relative error; ``"svd"``: about ``κ·ε``).  With
    ``alpha=0`` and rank-deficient ``X``, ``"svd"`` returns the minimum-norm
    least-squares solution (singular values at rounding level count as zero),
    as does ``"cholesky"`` when the factorisation fails (its eigendecomposition
    fallback); scikit-learn's Ridge may return an arbitrary huge solution there.
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "alpha": [Interval(Real, 0, None, closed="left"), np.ndarray, list, tuple],
        "fit_intercept": ["boolean"],
        "copy_X": ["boolean"],
        "solver": [StrOptions({"auto", "cholesky", "normal", "svd", "tsqr"})],
        "positive": ["boolean"],
    }
    _saved_attributes = ("coef_", "intercept_", "n_iter_", "solver_")

    def __init__(self, alpha=1.0, *, fit_intercept=True, copy_X=True, solver="auto", positive=False, comm=None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.solver = solver
        self.positive = positive
        self.comm = comm

    def _alphas(self, n_targets):
        alpha = np.asarray(self.alpha, dtype=np.float64).reshape(-1)
        if (alpha < 0).any() or not np.isfinite(alpha).all():
            raise ValueError(f"alpha must be non-negative and finite; got {self.alpha!r}")
        if alpha.size == 1:
            return np.repeat(alpha, n_targets)
        if alpha.size != n_targets:
            raise ValueError(f"Number of targets and number of penalties do not correspond: "
                             f"{n_targets} != {alpha.size}")
        return alpha

    def fit(self, X, y, sample_weight=None):
        """Fit the ridge model to the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float64 and float32 are kept).
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
        sample_weight : float or array-like of shape (n_local_samples,), default=None

        Returns
        -------
        self : Ridge
        """
        self._validate_params()
        if self.positive:
            raise ValueError("positive=True is not supported by mpiml's Ridge; use positive=False.")
        X, y, sw, xp, comm = self._fit_common(X, y, sample_weight)
        sw = None if sample_weight is None else sw
        alphas = self._alphas(1 if y.ndim == 1 else y.shape[1])
        solver = "svd" if self.solver in ("svd", "tsqr") else "cholesky"
        coef, intercept, _ = _solve_least_squares(
            X, y, sw, fit_intercept=self.fit_intercept, solver="tsqr" if solver == "svd" else "normal",
            comm=comm, xp=xp, solve_gram=lambda G, B: (_ridge_from_gram(G, B, alphas), None),
            solve_r=lambda R, Z: (_ridge_from_r(R, Z, alphas), None))
        self._set_coef(coef, intercept, y, X, xp)
        self.n_iter_ = None
        self.solver_ = solver
        return self
