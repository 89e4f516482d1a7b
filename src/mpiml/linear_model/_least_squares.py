"""Least squares over the rows of every rank (SPMD): LinearRegression and Ridge.

The solvers live in :mod:`._lsq_solvers`: the normal equations (``"normal"``
/ ``"cholesky"``, one allreduce of the Gram matrix; sparse shards through
sparse products), a tall-skinny QR (``"tsqr"`` / ``"svd"``, backward stable),
and Krylov iterations on the implicitly centred operator (``"lsqr"``,
``"sparse_cg"``, for sparse data with many features).  ``positive=True`` is a
non-negative least-squares problem on a square factor of the data.
"""

import functools
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import MultiOutputMixin, RegressorMixin
from sklearn.exceptions import UndefinedMetricWarning

from ..base import SPMDEstimator
from ..utils._linalg import is_sparse
from ..utils._param_validation import Interval, StrOptions
from ..utils._validation import validate_sample_weight
from ._base import (allreduce_identical, as_like, fitted_like, local_X, overwrite_as_preprocessed, raise_if_nonfinite,
                    validate_X_y)
from ._lsq_direct import Shortcut, dense_direct_applies, early_local_gram, solve_direct
from ._lsq_solvers import (SPARSE_GRAM_MAX_FEATURES, as_2d_targets, conjugate_gradient, factor_from_gram, lsqr,
                           lstsq_from_gram, lstsq_from_gram_cholesky, lstsq_from_r, nnls_from_factor,
                           ridge_from_gram, ridge_from_r, singular_values_from_gram, solve_least_squares)
from ._ridge_rules import check_sparse_intercept, lbfgs_from_factor, reported_solver

__all__ = ["LinearRegression", "Ridge"]


class _LinearRegressorBase(MultiOutputMixin, RegressorMixin, SPMDEstimator):
    """Prediction and the global R² shared by LinearRegression and Ridge."""

    def _fit_common(self, X, y, sample_weight, accept_sparse=True, defer_finite=False):
        comm = self._get_comm()
        X, y, xp, any_weights = validate_X_y(self, X, y, comm=comm, y_numeric=True, multi_output=True,
                                             accept_sparse=accept_sparse, defer_finite=defer_finite,
                                             sample_weight_given=sample_weight is not None)
        if not any_weights:  # no rank has weights: nothing to check or agree on (the rows are not all empty)
            return X, y, None, xp, comm
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=X.dtype, only_non_negative=True, comm=comm)
        return X, y, (None if sample_weight is None else sw), xp, comm

    def _set_coef(self, coef, intercept, y, X, xp):
        dtype = X.dtype
        if y.ndim == 1:
            self.coef_ = fitted_like(coef[0], xp, dtype)
            # a NumPy scalar of X's dtype, as scikit-learn's (0.0 without an intercept, as there)
            self.intercept_ = np.dtype(dtype).type(intercept[0]) if self.fit_intercept else 0.0
        else:
            self.coef_ = fitted_like(coef, xp, dtype)
            self.intercept_ = fitted_like(intercept, xp, dtype) if self.fit_intercept else 0.0

    def _decision_function(self, X):
        X, xp = local_X(self, X)
        coef = as_like(self.coef_, xp, X.dtype)
        intercept = self.intercept_
        if np.ndim(intercept) == 0:
            intercept = float(intercept)  # a Python scalar keeps the dtype of the product
        else:
            intercept = as_like(intercept, xp, X.dtype)
        return X @ coef.T + intercept

    def predict(self, X):
        """Predictions for this rank's rows (no communication).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            NumPy, CuPy, SciPy sparse or ``cupyx`` sparse; the output follows
            its device (a dense array).

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
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
        sample_weight : array-like of shape (n_local_samples,), default=None

        Returns
        -------
        float
        """
        comm = self._get_comm()
        self._check_is_fitted()
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=True, multi_output=True, reset=False,
                                accept_sparse=True)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=xp.float64, comm=comm, allow_all_zero=True)
        Y = as_2d_targets(y).astype(xp.float64)
        P = as_2d_targets(self.predict(X)).astype(xp.float64)
        t = Y.shape[1]
        first = (np.concatenate([[float(sw.sum())], as_like(sw @ Y, np), [X.shape[0]]]) if X.shape[0]
                 else np.zeros(t + 2))  # [Σw | Σw·y | rows]
        first = allreduce_identical(comm, first)
        if first[-1] < 2:  # scikit-learn's r2_score: undefined below two rows (the count is global: every rank)
            warnings.warn("R^2 score is not well-defined with less than two samples.", UndefinedMetricWarning,
                          stacklevel=2)
            return float("nan")
        y_mean = xp.asarray(first[1:-1] / first[0])
        second = np.zeros(2 * t)
        if X.shape[0]:
            second[:t] = as_like(sw @ (Y - y_mean) ** 2, np)
            second[t:] = as_like(sw @ (Y - P) ** 2, np)
        second = allreduce_identical(comm, second)
        den, num = second[:t], second[t:]
        r2 = np.where(den > 0, 1.0 - num / np.where(den > 0, den, 1.0), np.where(num == 0, 1.0, 0.0))
        return float(np.mean(r2))


class LinearRegression(_LinearRegressorBase):
    """Ordinary least squares over the rows of every rank (SPMD), on dense or sparse shards.

    Every rank calls :meth:`fit` with its own rows (and their targets); the
    coefficients are the same on every rank and equal, up to rounding, to
    scikit-learn's on the concatenated rows.  Shards may be NumPy, CuPy,
    SciPy sparse (CSR; other formats are converted) or ``cupyx.scipy.sparse``;
    sparse shards are never densified by ``"normal"`` and ``"lsqr"``.

    Parameters
    ----------
    fit_intercept : bool, default=True
        Whether to fit an intercept (the data are centred on the global
        weighted mean; implicitly for sparse ``X``).
    copy_X : bool, default=True
        True: ``X`` is never modified (centring works on float64 copies of row
        chunks, or implicitly).  False: after the fit, a dense ``X`` that needed
        no conversion is left as scikit-learn leaves it, centred on the global
        (weighted) means when ``fit_intercept`` and its rows scaled by
        ``sqrt(sample_weight)`` (one more allreduce of ``n_features + 1``
        values); the solvers do not need it, so this saves no memory here.
    tol : float, default=1e-6
        Dense solvers: singular values of the centred, weighted ``X`` below
        ``tol`` times the largest are treated as zero (scikit-learn's
        ``cond``), giving the minimum-norm solution for rank-deficient ``X``.
        ``"lsqr"``: its ``atol`` and ``btol``, as scikit-learn uses ``tol`` on
        sparse data.
    n_jobs : int or None, default=None
        Accepted for compatibility; parallelism comes from the ranks.
    positive : bool, default=False
        Constrain the coefficients to be non-negative: a non-negative least
        squares problem on the TSQR factor (``"tsqr"``, ``"auto"``) or on a
        square root of the Gram matrix (``"normal"``), solved by
        :func:`scipy.optimize.nnls` on every rank, as scikit-learn does on the
        whole ``X``.  Dense ``X`` only (scikit-learn's TypeError otherwise).
    solver : {"auto", "normal", "tsqr", "lsqr"}, default="auto"
        ``"normal"``: normal equations (one allreduce; sparse ``X`` through
        sparse products); ``"tsqr"``: tall-skinny QR (one allgather of small
        factors; a sparse shard is densified one row block at a time);
        ``"lsqr"``: LSQR on the implicitly centred operator (one allreduce of
        ``d + 1`` values per iteration), scikit-learn's solver for sparse
        ``X``.  ``"auto"``: ``"normal"`` for dense ``X`` and for sparse ``X``
        with at most 2048 features, else ``"lsqr"``; ``"tsqr"`` with
        ``positive=True``.  See Notes for their accuracy.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Replicated on every rank; NumPy or CuPy like ``X``, dtype of ``X``.
    intercept_ : float or ndarray of shape (n_targets,)
        Replicated; a NumPy scalar of the dtype of ``X`` for a 1-d target
        (0.0 when ``fit_intercept=False``), as scikit-learn's.
    rank_ : int
        Numerical rank of the centred, weighted ``X`` (replicated); not set
        by ``"lsqr"`` nor with ``positive=True`` (as scikit-learn on sparse data).
    singular_ : ndarray of shape (n_features,)
        Singular values of the centred, weighted ``X``, host NumPy in the
        dtype of ``X``, replicated; set when ``rank_`` is.
    n_iter_ : ndarray of shape (n_targets,), int32
        Iterations of ``"lsqr"`` per target (only set by it).
    solver_ : str
        The solver used (``"normal"``, ``"tsqr"`` or ``"lsqr"``).
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
    * ``"lsqr"``: per target, one allreduce of ``d + 1`` values per
      iteration (``[Aᵀu | ||u||²]``);
    * plus the input agreement (one small ``allgather_obj`` for ``X`` and
      ``y`` together, and one for ``sample_weight`` when some rank has weights).

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
    above about ``1e-8`` times the largest.  On sparse ``X`` the centring of
    ``"normal"`` is applied to the Gram matrix (``XᵀWX - Σw x̄x̄ᵀ``), which
    costs a further factor ``(|x̄| / std)²`` per column; ``"lsqr"`` stops at
    scikit-learn's tolerance (``tol``), so its result agrees with the exact
    solution to about ``tol`` relative, as scikit-learn's does.

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
        "solver": [StrOptions({"auto", "normal", "tsqr", "lsqr"})],
    }
    _saved_attributes = ("coef_", "intercept_", "rank_", "singular_", "n_iter_", "solver_")

    def __init__(self, *, fit_intercept=True, copy_X=True, tol=1e-6, n_jobs=None, positive=False, solver="auto",
                 comm=None):
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.tol = tol
        self.n_jobs = n_jobs
        self.positive = positive
        self.solver = solver
        self.comm = comm

    def _resolve_solver(self, X):
        if self.positive:
            return "normal" if self.solver == "normal" else "tsqr"
        if self.solver != "auto":
            return self.solver
        if is_sparse(X) and X.shape[1] > SPARSE_GRAM_MAX_FEATURES:
            return "lsqr"
        return "normal"

    def fit(self, X, y, sample_weight=None):
        """Fit the least-squares model to the rows of every rank.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            This rank's rows (NumPy, CuPy, SciPy or ``cupyx`` sparse; float64
            and float32 are kept).  Every rank passes the same kind.
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
            Targets of this rank's rows.
        sample_weight : array-like of shape (n_local_samples,), default=None
            Non-negative weights of this rank's rows.

        Returns
        -------
        self : LinearRegression
        """
        # the dense direct solvers find NaN/infinity in their Gram matrix: no separate read of X for the check
        X_given = X
        direct = self.positive is False and self.solver in ("auto", "normal")
        # a plain CuPy shard: its Gram kernel runs while the parameters are checked and the ranks agree on
        # the input (its result is dropped if they fail)
        early = early_local_gram(X, y, sample_weight) if direct else None
        self._validate_params()
        if self.positive and self.solver == "lsqr":
            raise ValueError("solver='lsqr' does not support positive=True; use solver='auto', 'tsqr' or 'normal', "
                             "or set positive=False.")
        X, y, sw, xp, comm = self._fit_common(X, y, sample_weight, accept_sparse=not self.positive,
                                              defer_finite="host" if direct else False)
        solver = self._resolve_solver(X)
        for name in ("rank_", "_singular", "_singular_pending", "n_iter_", "_n_krylov_iter"):
            self.__dict__.pop(name, None)   # (not hasattr: it would compute a pending singular_)
        common = dict(fit_intercept=self.fit_intercept, comm=comm, xp=xp)
        if dense_direct_applies(X, self.positive) and self.solver in ("auto", "normal", "tsqr"):
            coef, intercept, (rank, sing), solver, self._solver_info = solve_direct(
                X, y, sw, solver=self.solver, early=early, **common,
                shortcut=Shortcut(max(self.tol * self.tol, 100 * np.finfo(np.float64).eps), _full_rank_extra),
                solve_gram=lambda G, B, factor=None: _split3(lstsq_from_gram_cholesky(G, B, self.tol, factor)),
                solve_r=lambda R, Z: _split3(lstsq_from_r(R, Z, self.tol)),
                on_nonfinite=lambda: raise_if_nonfinite(self, X, y, comm=comm, xp=xp))
            self.rank_ = rank
            if callable(sing):   # full rank by the condition bound: the eigenvalues when singular_ is read
                self._singular_pending = (sing, X.dtype)
            else:
                self.singular_ = np.asarray(sing, dtype=np.float64).astype(X.dtype)
        elif self.positive:
            coef, intercept, _ = solve_least_squares(
                X, y, sw, method="tsqr" if solver == "tsqr" else "gram", **common,
                solve_r=lambda R, Z: (nnls_from_factor(R, Z), None),
                solve_gram=lambda G, B: (nnls_from_factor(*factor_from_gram(G, B)), None))
        elif solver == "lsqr":
            coef, intercept, n_iter = solve_least_squares(
                X, y, sw, method="krylov", **common,
                solve_krylov=lambda op, Yc: _lsqr_targets(op, Yc, np.zeros(Yc.shape[1]), tol=self.tol,
                                                          max_iter=None, comm=comm))
            self.n_iter_ = self._n_krylov_iter = n_iter
        else:
            coef, intercept, (rank, sing) = solve_least_squares(
                X, y, sw, method="tsqr" if solver == "tsqr" else "gram", **common,
                solve_gram=lambda G, B: _split3(lstsq_from_gram(G, B, self.tol)),
                solve_r=lambda R, Z: _split3(lstsq_from_r(R, Z, self.tol)))
            self.rank_ = rank
            self.singular_ = np.asarray(sing, dtype=np.float64).astype(X.dtype)
        self._set_coef(coef, intercept, y, X, xp)
        self.solver_ = solver
        if not self.copy_X:  # scikit-learn's LinearRegression centres (and weights) a dense X in place
            overwrite_as_preprocessed(X, X_given, sw, fit_intercept=self.fit_intercept, comm=comm, xp=xp)
        return self

    @property
    def singular_(self):
        """Singular values of the centred, weighted ``X`` (see the class Attributes).

        A full-rank fit by the normal equations leaves them to the first read:
        their ``O(d³)`` eigenvalue problem costs more than the rest of the
        replicated algebra, and most callers never look at them.
        """
        state = self.__dict__
        pending = state.pop("_singular_pending", None)
        if pending is not None:
            values, dtype = pending
            state["_singular"] = np.asarray(values(), dtype=np.float64).astype(dtype)
        if "_singular" not in state:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute 'singular_'")
        return state["_singular"]

    @singular_.setter
    def singular_(self, value):
        self.__dict__.pop("_singular_pending", None)
        self.__dict__["_singular"] = value

    @singular_.deleter
    def singular_(self):
        if self.__dict__.pop("_singular", None) is None and self.__dict__.pop("_singular_pending", None) is None:
            raise AttributeError("singular_")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = not self.positive
        return tags


def _full_rank_extra(G):
    """``(rank_, singular_)`` of a full-rank normal-equations fit: the singular values when first read."""
    return G.shape[0], functools.partial(singular_values_from_gram, G)


def _no_extra(G):
    return None


def _split3(result):
    coef, rank, sing = result
    return coef, (rank, sing)


def _lsqr_targets(op, Yc, alphas, *, tol, max_iter, comm):
    """LSQR per target column (``damp = sqrt(alpha)``); ``(coef (d, t), n_iter int32 (t,))``."""
    t = Yc.shape[1]
    coef = np.empty((op.d, t))
    n_iter = np.empty(t, dtype=np.int32)
    for j in range(t):
        coef[:, j], n_iter[j] = lsqr(op, Yc[:, j], damp=float(np.sqrt(alphas[j])), atol=tol, btol=tol,
                                     iter_lim=max_iter, comm=comm)
    return coef, n_iter


def _cg_targets(op, Yc, alphas, *, tol, max_iter, comm):
    """Conjugate gradients per target column on ``(AᵀA + alpha I) c = Aᵀy``; ``(coef (d, t), n_iter (t,))``."""
    t = Yc.shape[1]
    coef = np.empty((op.d, t))
    n_iter = np.empty(t, dtype=np.int32)
    for j in range(t):
        # like scikit-learn's Ridge, an unconverged CG stops at max_iter without a warning
        coef[:, j], n_iter[j], _ = conjugate_gradient(op, Yc[:, j], alpha=float(alphas[j]), tol=tol,
                                                      max_iter=max_iter, comm=comm)
    return coef, n_iter


class Ridge(_LinearRegressorBase):
    """Least squares with an L2 penalty over the rows of every rank (SPMD), dense or sparse shards.

    Minimises ``||sqrt(W) (y - Xw - b)||² + alpha ||w||²`` (the intercept is
    not penalised), one problem per target, like scikit-learn's Ridge, whose
    parameters it takes with their meaning.  Shards may be NumPy, CuPy, SciPy
    sparse or ``cupyx`` sparse; only ``"svd"`` densifies a sparse shard (one
    row block at a time).

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Penalty strength, non-negative; one per target when an array.
    fit_intercept : bool, default=True
        Whether to fit an intercept (implicit centring for sparse ``X``).
    copy_X : bool, default=True
        Accepted for compatibility; ``X`` is never modified.
    max_iter : int or None, default=None
        Iterations of ``"lsqr"`` (default ``2 n_features``) and
        ``"sparse_cg"`` (default ``10 n_features``), as scikit-learn's.
    tol : float, default=1e-4
        ``"lsqr"``: its ``atol`` and ``btol``; ``"sparse_cg"``: relative
        residual ``||r|| <= tol ||Xᵀy||``.  The direct solvers are exact.
    solver : {"auto", "svd", "cholesky", "lsqr", "sparse_cg", "sag", "saga", "lbfgs"}, default="auto"
        ``"cholesky"`` (alias ``"normal"``): the normal equations
        ``(XᵀWX + alpha I) w = XᵀWy`` (one allreduce; sparse ``X`` through
        sparse products) solved by Cholesky, an eigendecomposition if the
        matrix is singular.  ``"svd"`` (alias ``"tsqr"``): the SVD of the TSQR
        factor ``R`` of ``[X | y]``.  ``"lsqr"``, ``"sparse_cg"``: Krylov
        iterations on the implicitly centred operator, one allreduce of
        ``d (+1)`` values per iteration.  ``"sag"`` and ``"saga"`` (stochastic
        solvers with no efficient SPMD form) run as ``"sparse_cg"``, which
        converges to the same minimiser; ``random_state`` then has no effect.
        ``"lbfgs"``: only with ``positive=True`` (scikit-learn's rule).
        ``"auto"``: ``"cholesky"``, except sparse ``X`` with more than 2048
        features: ``"sparse_cg"``.
    positive : bool, default=False
        Non-negative coefficients: a non-negative least-squares problem on
        ``[R; sqrt(alpha) I]`` (``R`` the TSQR factor for dense ``X``, a square
        root of the Gram matrix for sparse ``X``) solved exactly by
        :func:`scipy.optimize.nnls` on every rank; scikit-learn reaches the
        same minimiser with L-BFGS-B.  ``solver`` must be ``"auto"`` or
        ``"lbfgs"``; ``"lbfgs"`` runs scikit-learn's bounded L-BFGS-B (its
        ``max_iter``, ``tol`` and ConvergenceWarning) on that factor, on every
        rank alike without communication (``solver_ == "lbfgs"``).
    random_state : int, RandomState instance or None, default=None
        Accepted for compatibility (scikit-learn uses it for ``"sag"`` and
        ``"saga"`` only); the solvers here are deterministic.
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Replicated; NumPy or CuPy like ``X``, dtype of ``X``.  ``(n_features,)``
        also for a ``y`` of one column (whose ``intercept_`` has shape ``(1,)``),
        as scikit-learn's Ridge.
    intercept_ : float or ndarray of shape (n_targets,)
        Replicated; 0.0 when ``fit_intercept=False``.
    n_iter_ : None or ndarray of shape (n_targets,)
        Iterations of ``"lsqr"`` per target, and of the ``"sparse_cg"`` that
        runs ``"sag"`` / ``"saga"`` (bounded by ``max_iter``, as scikit-learn's
        epochs are); None for the other solvers (as scikit-learn).
    solver_ : str
        The solver that ran: ``"cholesky"``, ``"svd"``, ``"lsqr"``,
        ``"sparse_cg"`` or ``"nnls"`` (``positive=True``); ``"sag"``/``"saga"``
        when asked, as scikit-learn reports them.  Sparse rows with an intercept:
        scikit-learn's ``"sag"`` warning; every solver fits that intercept
        (scikit-learn refuses ``"svd"``, ``"cholesky"`` and ``"saga"`` there).
    n_features_in_ : int
        Number of features.

    Notes
    -----
    Communicated per fit: as :class:`LinearRegression` (the means, then one
    allreduce of ``d² + d·t`` values for ``"cholesky"``, one allgather of a
    ``(d + t)²`` factor per rank for ``"svd"``, or one allreduce of ``d``
    (``"sparse_cg"``) or ``d + 1`` (``"lsqr"``) values per iteration and
    target), all bit-identical on every rank.

    Accuracy: the penalty bounds the condition number of the normal
    equations by ``(σ_max² + alpha) / alpha``; with ``alpha`` small against
    ``σ_max²`` the limits of :class:`LinearRegression` apply (``"cholesky"``:
    about ``κ²·ε`` relative error; ``"svd"``: about ``κ·ε``).  With
    ``alpha=0`` and rank-deficient ``X``, ``"svd"`` returns the minimum-norm
    least-squares solution (singular values at rounding level count as zero),
    as does ``"cholesky"`` when the factorisation fails (its eigendecomposition
    fallback); scikit-learn's Ridge may return an arbitrary huge solution there.
    The iterative solvers stop at ``tol`` like scikit-learn's.  Unlike
    scikit-learn, ``"cholesky"`` and ``"svd"`` accept sparse ``X`` with
    ``fit_intercept=True`` (scikit-learn refuses them there).
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "alpha": [Interval(Real, 0, None, closed="left"), "array-like"],
        "fit_intercept": ["boolean"],
        "copy_X": ["boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"auto", "svd", "cholesky", "lsqr", "sparse_cg", "sag", "saga", "lbfgs", "normal",
                               "tsqr"})],
        "positive": ["boolean"],
        "random_state": ["random_state"],
    }
    _saved_attributes = ("coef_", "intercept_", "n_iter_", "solver_")

    def __init__(self, alpha=1.0, *, fit_intercept=True, copy_X=True, max_iter=None, tol=1e-4, solver="auto",
                 positive=False, random_state=None, comm=None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.copy_X = copy_X
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.positive = positive
        self.random_state = random_state
        self.comm = comm

    def _alphas(self, n_targets):
        alpha = np.asarray(self.alpha, dtype=np.float64).reshape(-1)
        if (alpha < 0).any() or not np.isfinite(alpha).all():
            raise ValueError(f"alpha must be non-negative and finite; got {self.alpha!r}")
        if alpha.size == 1:
            return np.repeat(alpha, n_targets)
        if alpha.size != n_targets:
            raise ValueError(f"Number of targets and number of penalties do not correspond: "
                             f"{alpha.size} != {n_targets}")
        return alpha

    def _check_solver_rules(self):
        """scikit-learn's parameter-combination errors, raised before any communication."""
        if self.solver == "lbfgs" and not self.positive:
            raise ValueError("'lbfgs' solver can be used only when positive=True. Please use another solver.")
        if self.positive and self.solver not in ("auto", "lbfgs"):
            raise ValueError(f"solver='{self.solver}' does not support positive fitting. Please set the solver to "
                             "'auto' or 'lbfgs', or set `positive=False`")

    def _resolve_solver(self, X):
        if self.positive:
            return "nnls"
        solver = {"normal": "cholesky", "tsqr": "svd", "sag": "sparse_cg", "saga": "sparse_cg"}.get(
            self.solver, self.solver)
        if solver == "auto":
            return "sparse_cg" if is_sparse(X) and X.shape[1] > SPARSE_GRAM_MAX_FEATURES else "cholesky"
        return solver

    def fit(self, X, y, sample_weight=None):
        """Fit the ridge model to the rows of every rank.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            This rank's rows (NumPy, CuPy, SciPy or ``cupyx`` sparse; float64
            and float32 are kept).  Every rank passes the same kind.
        y : array-like of shape (n_local_samples,) or (n_local_samples, n_targets)
        sample_weight : float or array-like of shape (n_local_samples,), default=None

        Returns
        -------
        self : Ridge
        """
        direct = self.positive is False and self.solver in ("auto", "cholesky", "normal")
        # a plain CuPy shard: its Gram kernel runs while the parameters are checked and the ranks agree on
        # the input (its result is dropped if they fail)
        early = early_local_gram(X, y, sample_weight) if direct else None
        self._validate_params()
        self._check_solver_rules()
        X, y, sw, xp, comm = self._fit_common(X, y, sample_weight, defer_finite="host" if direct else False)
        check_sparse_intercept(self, is_sparse(X))
        alphas = self._alphas(1 if y.ndim == 1 else y.shape[1])
        solver = self._resolve_solver(X)
        common = dict(fit_intercept=self.fit_intercept, comm=comm, xp=xp)
        n_iter = None
        if dense_direct_applies(X, self.positive) and solver in ("cholesky", "svd"):
            mode = {"auto": "auto", "cholesky": "normal", "normal": "normal"}.get(self.solver, "tsqr")
            smallest = float(np.min(alphas))
            # (one penalty for every target: the compiled shortcut's single solve, ridge_from_gram's rule)
            shortcut = (Shortcut(100 * max(X.shape[1], 1) * np.finfo(np.float64).eps, _no_extra)
                        if bool(np.all(alphas == smallest)) else None)
            coef, intercept, _, used, self._solver_info = solve_direct(
                X, y, sw, solver=mode, alpha=smallest, early=early, shortcut=shortcut, **common,
                solve_gram=lambda G, B, factor=None: (ridge_from_gram(G, B, alphas, factor, smallest), None),
                solve_r=lambda R, Z: (ridge_from_r(R, Z, alphas), None),
                on_nonfinite=lambda: raise_if_nonfinite(self, X, y, comm=comm, xp=xp))
            solver = "cholesky" if used == "normal" else "svd"
        elif solver == "nnls":
            sparse = is_sparse(X)
            if self.solver == "lbfgs":  # what was asked: scikit-learn's iterations, max_iter and tol
                solver = "lbfgs"
                on_factor = functools.partial(lbfgs_from_factor, max_iter=self.max_iter, tol=self.tol)
            else:
                on_factor = nnls_from_factor
            coef, intercept, _ = solve_least_squares(
                X, y, sw, method="gram" if sparse else "tsqr", **common,
                solve_r=lambda R, Z: (on_factor(R, Z, alphas), None),
                solve_gram=lambda G, B: (on_factor(*factor_from_gram(G, B), alphas), None))
        elif solver in ("lsqr", "sparse_cg"):
            run = _lsqr_targets if solver == "lsqr" else _cg_targets
            coef, intercept, n_iter = solve_least_squares(
                X, y, sw, method="krylov", **common,
                solve_krylov=lambda op, Yc: run(op, Yc, alphas, tol=self.tol, max_iter=self.max_iter, comm=comm))
        else:
            coef, intercept, _ = solve_least_squares(
                X, y, sw, method="tsqr" if solver == "svd" else "gram", **common,
                solve_gram=lambda G, B: (ridge_from_gram(G, B, alphas), None),
                solve_r=lambda R, Z: (ridge_from_r(R, Z, alphas), None))
        self._set_coef(coef, intercept, y, X, xp)
        if y.ndim == 2 and y.shape[1] == 1:  # scikit-learn's Ridge: a one-column y gives a 1-D coef_
            self.coef_ = self.coef_[0]
        self._n_krylov_iter = n_iter  # iterations of lsqr or sparse_cg (benchmarks count the passes over X)
        # scikit-learn reports lsqr's and sag/saga's iterations (those run as sparse_cg here: its count)
        self.n_iter_ = n_iter if solver == "lsqr" or self.solver in ("sag", "saga") else None
        self.solver_ = reported_solver(self, solver)
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
