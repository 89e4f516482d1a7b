"""Logistic regression over the rows of every rank (SPMD), on dense or sparse shards.

The objective, its distributed evaluation and the solvers live in
:mod:`._logistic_loss`; this module holds the estimator: scikit-learn's
parameters with their meaning (the 1.8+ ``penalty`` deprecation, ``l1_ratio``,
``dual``, ``intercept_scaling``, ``warm_start``, ...), the class weights, and
the local prediction methods.
"""

import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.class_weight import compute_class_weight

from ..base import SPMDEstimator
from ..utils._param_validation import Hidden, Interval, StrOptions
from ..utils._linalg import is_sparse
from ..utils._validation import agree_on_error, validate_sample_weight
from ._base import (allreduce_identical, allreduce_identical_device, as_like, fitted_like, global_classes, local_X,
                    raise_if_nonfinite, validate_X_y)
from ._logistic_loss import (EarlyPass, Objective, centre_multinomial, expit, lbfgs, newton_cg, newton_cholesky,
                             softmax_stats)
from ._liblinear import DUAL_GATHER_BYTES, dual_coordinate_descent, tolerance_scale, tron, warn_if_not_converged
from ._logistic_prox import SparseCoefMixin, dense_coef, solve_like

__all__ = ["LogisticRegression"]

try:  # scikit-learn >= 1.9: the (experimental) public callback API
    from sklearn.callback import CallbackSupportMixin as _CallbackSupport
    from sklearn.callback import with_callbacks as _with_callbacks
except ImportError:  # older scikit-learn: no callbacks to call
    class _CallbackSupport:  # noqa: D101
        pass

    def _with_callbacks(method):
        return method

# The names the previous releases of this module exported (tests and tools use them).
_Objective, _expit, _softmax_stats = Objective, expit, softmax_stats

#: scikit-learn's solver names and the algorithm that runs them here (see the class docstring).
_SOLVERS = {"lbfgs": "lbfgs", "newton-cholesky": "newton-cholesky", "newton-cg": "newton-cg",
            "sag": "lbfgs", "saga": "lbfgs", "liblinear": "lbfgs"}


def _check_solver(solver, penalty, dual):
    """scikit-learn's solver/penalty/dual compatibility rules (the same messages)."""
    if solver not in ("liblinear", "saga") and penalty not in ("l2", None):
        raise ValueError(f"Solver {solver} supports only 'l2' or None penalties, got {penalty} penalty.")
    if solver != "liblinear" and dual:
        raise ValueError(f"Solver {solver} supports only dual=False, got dual={dual}")
    if penalty == "elasticnet" and solver != "saga":
        raise ValueError(f"Only 'saga' solver supports elasticnet penalty, got solver={solver}.")
    if solver == "liblinear" and penalty is None:
        raise ValueError("C=np.inf as well as penalty=None is not supported for the liblinear solver")


class _LbfgsHooks:
    """scikit-learn's callback hooks around the L-BFGS iterations (its task layout).

    One subtask per iteration named ``"lbfgs-iter"``: it begins with the
    coefficients at the start of the iteration and ends with those at its end
    (``fitted_estimator`` is a copy of the estimator holding them, as a fit
    stopped there would); the subtask begun after the last iteration ends
    empty.  Every rank calls its own callbacks with its own rows; the
    coefficients are the same bits on every rank.
    """

    def __init__(self, ctx, estimator, X, y, metadata, to_attributes, w0):
        self.ctx, self.estimator, self.X, self.y, self.metadata = ctx, estimator, X, y, metadata
        self.to_attributes = to_attributes
        self.current = self._begin(w0)

    def _begin(self, w):
        sub = self.ctx.subcontext(task_name="lbfgs-iter")
        sub.call_on_fit_task_begin(estimator=self.estimator, X=self.X, y=self.y, metadata=self.metadata,
                                   reconstruction_attributes=lambda: self.to_attributes(w))
        return sub

    def __call__(self, w):
        w = np.array(w, copy=True)
        self.current.call_on_fit_task_end(estimator=self.estimator, X=self.X, y=self.y, metadata=self.metadata,
                                          reconstruction_attributes=lambda: self.to_attributes(w))
        self.current = self._begin(w)

    def close(self):
        self.current.call_on_fit_task_end(estimator=self.estimator)


def _int64_indexed(X):
    """Whether ``X`` (as given) is a sparse matrix with 64-bit indices."""
    return is_sparse(X) and any(getattr(getattr(X, a, None), "dtype", None) == np.int64
                                for a in ("indices", "indptr"))


def _large_sparse_or_values(solver, X, int64_indexed):
    """This rank's reason to refuse ``X`` as scikit-learn's liblinear / sag / saga do (or None)."""
    if solver not in ("liblinear", "sag", "saga"):
        return None
    if int64_indexed:
        return (f"Only sparse matrices with 32-bit integer indices are accepted by solver={solver!r} (as in "
                "scikit-learn); got int64 indices. The solvers 'lbfgs', 'newton-cg' and 'newton-cholesky' "
                "accept them.")
    values = X.data if is_sparse(X) else X  # (a sparse shard's implicit zeros cannot exceed 1e30)
    if solver == "liblinear" and values.size:
        if float(values.max()) > 1e30:  # (one device-to-host scalar for a CuPy shard)
            return ("Using the 'liblinear' solver while X contains a maximum value > 1e30 results in a frozen "
                    "fit. Please choose another solver or rescale the input X.")
    return None


class LogisticRegression(ClassifierMixin, SparseCoefMixin, _CallbackSupport, SPMDEstimator):
    """Logistic regression (binary or multinomial) over the rows of every rank (SPMD), dense or sparse.

    Every rank calls :meth:`fit` with its own rows and labels; ``classes_`` is
    the sorted union of the labels of every rank and the coefficients are the
    same on every rank, equal up to the solver tolerance to scikit-learn's on
    the concatenated rows.  Shards may be NumPy, CuPy, SciPy sparse (CSR) or
    ``cupyx`` sparse; sparse shards are never densified.

    Parameters
    ----------
    penalty : {"l1", "l2", "elasticnet", None}, default="deprecated"
        Deprecated by scikit-learn 1.8 (a FutureWarning when set, as there):
        use ``l1_ratio`` and ``C``.  ``"l1"`` (solvers ``"liblinear"`` and
        ``"saga"``) and ``"elasticnet"`` (``"saga"``) run the proximal Newton
        method of ``_logistic_prox``, as does ``l1_ratio > 0``.
    C : float, default=1.0
        Inverse of the penalty strength, in ``(0, inf]``; ``np.inf`` means no
        penalty.
    l1_ratio : float, default=0.0
        The elastic-net mixing: the penalty is ``(1 - l1_ratio) ||w||² / 2 +
        l1_ratio ||w||₁`` over ``C``; above 0 only with ``"saga"`` (1 also with
        ``"liblinear"``), as in scikit-learn.
    dual : bool, default=False
        Only with ``solver="liblinear"`` (scikit-learn's rule).  ``True``:
        LIBLINEAR's dual coordinate descent, rows visited in a
        ``random_state``-seeded order (the rows are gathered on rank 0, see
        :mod:`._liblinear`); ``False``: LIBLINEAR's trust-region Newton method.
    tol : float, default=1e-4
        Stop when the largest absolute entry of the gradient (projected, for
        L-BFGS) is at most ``tol``; Newton-Cholesky also requires half the
        Newton decrement to be at most ``tol``.
    fit_intercept : bool, default=True
        Whether to fit an intercept.
    intercept_scaling : float, default=1
        ``solver="liblinear"`` only: the intercept is the weight of a constant
        feature of this value and is penalised with the coefficients (that
        solver's objective); ``intercept_ = intercept_scaling * weight``.
    class_weight : dict, "balanced" or None, default=None
        Weights per class, multiplied with ``sample_weight``.  ``"balanced"``
        uses ``Σw / (n_classes · Σw per class)`` over the rows of every rank.
    random_state : int, RandomState instance or None, default=None
        The order in which ``solver="liblinear", dual=True`` visits the rows
        (a permutation of the global rows per epoch: the result does not
        depend on the rank count).  No effect elsewhere (scikit-learn's
        ``"sag"``/``"saga"`` shuffle with it; the method here is deterministic).
    solver : {"lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"}, default="lbfgs"
        ``"lbfgs"``: scipy's L-BFGS-B, one allreduce per function evaluation.
        ``"newton-cholesky"``: Newton steps from the full Hessian, for
        ``n_classes · n_features`` up to a few thousand.  ``"newton-cg"``:
        Newton steps from conjugate gradients on Hessian-vector products (one
        allreduce each; no Hessian is formed, so it suits many features).
        ``"sag"`` and ``"saga"`` (stochastic, without an efficient SPMD form)
        run a proximal Newton method on the same objective, L1 share included
        (one allreduce per evaluation of the loss, gradient and Hessian), hence
        reach the same minimiser; beyond a few thousand coefficients, L-BFGS
        (L2) or FISTA (with an L1 share).  ``"liblinear"`` (LIBLINEAR's
        objective: penalised intercept, binary problems only, float64, rows of
        non-positive weight left out, ``warm_start`` ignored, as there) runs
        LIBLINEAR's own algorithms with the L2 penalty, so it stops where
        LIBLINEAR stops (:mod:`._liblinear`), and the proximal Newton method
        with the L1 penalty.
        As scikit-learn's, ``"liblinear"``, ``"sag"`` and ``"saga"`` refuse
        sparse ``X`` with int64 indices and ``"liblinear"`` values above 1e30
        (the same ValueError on every rank when any shard has them).
    max_iter : int, default=100
        Maximum iterations of the solver.
    verbose : int, default=0
        Positive: rank 0 prints the loss at every iteration.
    warm_start : bool, default=False
        Start from the coefficients of the previous fit (scikit-learn's rule
        and its error for a shape that does not fit).
    n_jobs : int or None, default=None
        No effect, as in scikit-learn 1.8+ (which warns with a FutureWarning
        when it is set; so does this class).
    comm : Communicator or None, default=None
        Communicator of the ranks that share the data; None is the world.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Sorted union of the labels of every rank (host NumPy), replicated.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Replicated; NumPy or CuPy like ``X``, dtype of ``X``.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Replicated; zeros when ``fit_intercept=False``.
    n_iter_ : ndarray of shape (1,), int32
        Iterations of the solver (replicated).
    n_features_in_ : int
        Number of features.

    Notes
    -----
    Communicated, with ``m = n_classes`` (1 for a binary problem), ``D =
    n_features + fit_intercept`` and float64 host buffers:

    * per fit: the input agreement (one ``allgather_obj`` of the local
      checks; one more for ``sample_weight`` when some rank has weights), the
      labels of every rank (one ``allgather_obj`` of the local unique labels;
      on GPU ranks they travel with the agreement) and one allreduce of the
      ``n_classes`` weighted class counts (``Σw``, the balanced weights; on GPU
      ranks without sample or class weights ``Σw`` is the agreed row count);
    * ``"lbfgs"``: **one** allreduce per function evaluation, of ``m·D + 3``
      values ``[loss | gradient | fingerprint]`` (``mpiml.profile`` shows
      exactly one per evaluation);
    * ``"newton-cholesky"``: one allreduce per trial point of the line search
      (usually one per iteration) of ``m·D + (m·D)² + 3`` values
      ``[loss | gradient | Hessian | fingerprint]``;
    * ``"newton-cg"``: one allreduce of ``m·D + 3`` values per trial point
      and one of ``m·D + 2`` per Hessian-vector product (at most 200 per
      Newton step).
    * ``"liblinear"``, L2: ``dual=False`` as ``"newton-cg"`` (one allreduce per
      trial point and per conjugate-gradient step) plus one of 2 row counts;
      ``dual=True``: one ``gatherv`` of the rows to rank 0 (CSR) and one
      broadcast of ``D + 1`` values.

    Every reduction is a binomial reduce to rank 0 followed by a broadcast, so
    every rank receives the same bits and the optimiser's decisions (step
    sizes, convergence, iteration counts) agree; a fingerprint of the
    coefficients in each reduction turns any divergence into the same
    :class:`mpiml.CommError` on every rank.  The small linear algebra (L-BFGS
    updates, Cholesky of the Hessian) runs on the host in float64; the
    row-wise work (``X W``, the loss, ``Xᵀ G``, the Hessian's
    ``X̃ᵀ diag(h) X̃``, a sparse product for sparse shards) runs on the
    device of ``X``.

    Conditioning: L-BFGS needs no factorisation and is the safer choice for
    nearly collinear features; Newton-Cholesky factorises a Hessian whose
    condition number grows like that of ``XᵀX`` (weighted by ``p(1 - p)``)
    and falls back to L-BFGS when Cholesky fails, as scikit-learn's does.
    With separable classes and no penalty the coefficients diverge and a
    :class:`~sklearn.exceptions.ConvergenceWarning` is issued.

    Callbacks (:meth:`set_callbacks`, scikit-learn >= 1.9): with ``"lbfgs"``,
    scikit-learn's task tree, one subtask per iteration; each rank calls its
    own callbacks with its own rows and the replicated coefficients.

    :meth:`predict`, :meth:`predict_proba` and :meth:`decision_function` act
    on local rows; :meth:`score` (accuracy) is global: one allreduce of two
    values.
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "penalty": [StrOptions({"l1", "l2", "elasticnet"}), None, Hidden(StrOptions({"deprecated"}))],
        "C": [Interval(Real, 0, None, closed="right")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both"), None],
        "dual": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "intercept_scaling": [Interval(Real, 0, None, closed="neither")],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "random_state": ["random_state"],
        "solver": [StrOptions(set(_SOLVERS))],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "n_jobs": [None, Integral],
    }
    _saved_attributes = ("classes_", "coef_", "intercept_", "n_iter_")

    def __init__(self, penalty="deprecated", *, C=1.0, l1_ratio=0.0, dual=False, tol=1e-4, fit_intercept=True,
                 intercept_scaling=1, class_weight=None, random_state=None, solver="lbfgs", max_iter=100,
                 verbose=0, warm_start=False, n_jobs=None, comm=None):
        self.penalty = penalty
        self.C = C
        self.l1_ratio = l1_ratio
        self.dual = dual
        self.tol = tol
        self.fit_intercept = fit_intercept
        self.intercept_scaling = intercept_scaling
        self.class_weight = class_weight
        self.random_state = random_state
        self.solver = solver
        self.max_iter = max_iter
        self.verbose = verbose
        self.warm_start = warm_start
        self.n_jobs = n_jobs
        self.comm = comm

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags

    def set_callbacks(self, *callbacks):
        """Set scikit-learn callbacks (``sklearn.callback``, scikit-learn >= 1.9); called with
        ``solver="lbfgs"`` only, as there.  Each rank calls its own callbacks with its own rows.

        Returns
        -------
        self : LogisticRegression
        """
        if not hasattr(_CallbackSupport, "set_callbacks"):
            raise NotImplementedError("callbacks need scikit-learn >= 1.9 (sklearn.callback)")
        if self.solver != "lbfgs":
            warnings.warn(f"Callbacks are only supported in {type(self).__name__} for solver='lbfgs'. This "
                          f"estimator has solver='{self.solver}', callbacks will be ignored during the solving "
                          "of the regression.", UserWarning, stacklevel=2)
        return super().set_callbacks(*callbacks)

    def _fitted_attributes(self, w, obj, l1, xp, out):
        """``coef_`` and ``intercept_`` from the solver's flat coefficients (the representation scikit-learn
        reports for the multinomial)."""
        W = np.asarray(w).reshape(obj.k, obj.d + obj.fi)
        if l1 == 0 or obj.l2 > 0:  # (the L1 norm of the coefficients is not invariant to centring them)
            W = centre_multinomial(W, obj)
        elif not obj.binary and obj.fi:
            W = W.copy()
            W[:, -1] -= W[:, -1].mean()
        intercept = W[:, obj.d] * obj.scale if obj.fi else np.zeros(obj.k)
        if xp is np:
            return {"coef_": as_like(W[:, :obj.d], xp, out), "intercept_": as_like(intercept, xp, out)}
        # on a GPU one copy to the device holds both (views of one buffer, cast on the host as before)
        both = fitted_like(np.concatenate([W[:, :obj.d].ravel(), intercept]), xp, out)
        kd = obj.k * obj.d
        return {"coef_": both[:kd].reshape(obj.k, obj.d), "intercept_": both[kd:]}

    # ------------------------------------------------------------------ parameters
    def _resolve_penalty(self):
        """The effective penalty and C, with scikit-learn's warnings and errors (before any communication)."""
        if self.penalty == "deprecated":
            if self.l1_ratio == 0 or self.l1_ratio is None:
                penalty = "l2"
                if self.l1_ratio is None:
                    warnings.warn("'l1_ratio=None' was deprecated in version 1.8 and will trigger an error in "
                                  "1.10. Use 0<=l1_ratio<=1 instead.", FutureWarning, stacklevel=3)
            elif self.l1_ratio == 1:
                penalty = "l1"
            else:
                penalty = "elasticnet"
            if self.C == np.inf:
                penalty = None
        else:
            penalty = self.penalty
            warnings.warn("'penalty' was deprecated in version 1.8 and will be removed in 1.10. To avoid this "
                          "warning, leave 'penalty' set to its default value and use 'l1_ratio' or 'C' instead. "
                          "Use l1_ratio=0 instead of penalty='l2', l1_ratio=1 instead of penalty='l1', l1_ratio "
                          "set to a float between 0 and 1 instead of penalty='elasticnet', and C=np.inf instead "
                          "of penalty=None.", FutureWarning, stacklevel=3)
        _check_solver(self.solver, penalty, self.dual)
        if penalty != "elasticnet" and self.l1_ratio is not None and 0 < self.l1_ratio < 1:
            warnings.warn(f"l1_ratio parameter is only used when penalty is 'elasticnet'. Got (penalty={penalty})",
                          UserWarning, stacklevel=3)
        if (self.penalty == "l2" and self.l1_ratio != 0) or (self.penalty == "l1" and self.l1_ratio != 1):
            warnings.warn(f"Inconsistent values: penalty={self.penalty} with l1_ratio={self.l1_ratio}. penalty is "
                          "deprecated. Please use l1_ratio only.", UserWarning, stacklevel=3)
        if penalty == "elasticnet" and self.l1_ratio is None:
            raise ValueError("l1_ratio must be specified when penalty is elasticnet.")
        C = self.C
        if self.penalty is None:
            if self.C != 1.0:
                warnings.warn("Setting penalty=None will ignore the C and l1_ratio parameters", UserWarning,
                              stacklevel=3)
            C, penalty = np.inf, "l2"
        if self.n_jobs is not None:
            warnings.warn(f"'n_jobs' has no effect since 1.8 and will be removed in 1.10. You provided "
                          f"'n_jobs={self.n_jobs}', please leave it unspecified.", FutureWarning, stacklevel=3)
        return penalty, C

    def _row_weights(self, y_idx, sw, classes, xp, comm):
        """Per-row weights (sample × class weight) and their global sum (one allreduce)."""
        k = len(classes)
        counts = np.zeros(k)
        if xp is not np and k <= 8:
            # a few classes on a GPU: one masked sum per class (a weighted bincount into k bins is k
            # float64 atomics hammered by every row: ~10 ms at 4e7 rows and two classes), summed over the
            # ranks on the device (every rank takes this path: the namespace and the classes are agreed)
            sw64 = sw.astype(xp.float64, copy=False)
            parts = ([xp.where(y_idx == c, sw64, 0.0).sum() for c in range(k)] if y_idx.shape[0]
                     else [xp.zeros((), dtype=xp.float64)] * k)
            counts = allreduce_identical_device(comm, xp.stack(parts))
        else:
            if y_idx.shape[0]:
                counts = as_like(xp.bincount(y_idx, weights=sw.astype(xp.float64), minlength=k), np)
            counts = allreduce_identical(comm, counts)
        if self.class_weight is None:
            cw = np.ones(k)
        elif isinstance(self.class_weight, str):  # "balanced", from the global weighted counts
            cw = np.divide(counts.sum(), k * counts, out=np.zeros(k), where=counts > 0)
        else:
            cw = compute_class_weight(self.class_weight, classes=classes, y=classes)
        if self.class_weight is not None:
            sw = sw * as_like(cw, xp, sw.dtype)[y_idx]
        return sw, float(cw @ counts)

    def _initial_point(self, obj):
        """Zeros, or the previous fit's coefficients with ``warm_start`` (scikit-learn's shape rule)."""
        w0 = np.zeros((obj.k, obj.d + obj.fi))
        coef = getattr(self, "coef_", None) if self.warm_start else None
        if coef is None:
            return w0.ravel()
        coef = as_like(dense_coef(coef), np).astype(np.float64)
        if obj.fi:
            coef = np.concatenate([coef, as_like(self.intercept_, np).reshape(-1, 1) / obj.scale], axis=1)
        if coef.shape != w0.shape:
            want = f"{w0.shape}" if not obj.binary else f"{(w0.shape[1],)} or {w0.shape}"
            raise ValueError(f"Initialization coef is of shape {coef.shape}, expected shape {want}")
        return coef.ravel()

    def _liblinear_l2(self, obj, y_idx, C):
        """``solver="liblinear"`` with the L2 penalty: LIBLINEAR's trust-region Newton method
        (``dual=False``) or dual coordinate descent (``dual=True``), with its stopping rules
        (see :mod:`._liblinear`); starts from zero whatever ``warm_start`` says, as there."""
        if self.dual:
            C_rows = C * as_like(obj.sw, np).astype(np.float64)
            found = dual_coordinate_descent(obj, C_rows, eps=self.tol, max_iter=self.max_iter,
                                            random_state=self.random_state,
                                            verbose=self.verbose and obj.comm.rank == 0)
            if found is not None:
                warn_if_not_converged(found[1], self.max_iter)
                return found
            warnings.warn(f"dual=True: the rows of every rank exceed {DUAL_GATHER_BYTES >> 20} MiB, more than the "
                          "dual coordinate descent gathers on one rank; the same problem is solved in the primal "
                          "(random_state has no effect).", UserWarning, stacklevel=3)
        kept = obj.sw > 0
        counts = np.zeros(2)
        if obj.X.shape[0]:
            counts[:] = float((kept & (y_idx == 1)).sum()), float(kept.sum())
        counts = allreduce_identical(obj.comm, counts)
        w, n_iter = tron(obj, eps=self.tol * tolerance_scale(counts[0], counts[1]), max_iter=self.max_iter,
                         verbose=self.verbose)
        warn_if_not_converged(n_iter, self.max_iter)
        return w, n_iter

    # ------------------------------------------------------------------ fitting
    @_with_callbacks
    def fit(self, X, y, sample_weight=None):
        """Fit the model to the rows of every rank.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_local_samples, n_features)
            This rank's rows (NumPy, CuPy, SciPy or ``cupyx`` sparse; float64
            and float32 are kept).  Every rank passes the same kind.
        y : array-like of shape (n_local_samples,)
            Labels of this rank's rows: any type NumPy sorts (CuPy: numbers).
        sample_weight : array-like of shape (n_local_samples,), default=None
            Weights of this rank's rows (their global sum must not be zero).

        Returns
        -------
        self : LogisticRegression
        """
        self._validate_params()
        penalty, C = self._resolve_penalty()
        comm = self._get_comm()
        int64_indexed = _int64_indexed(X)
        # L-BFGS (L2 or no penalty): a dense CuPy X's NaN/infinity shows in the first evaluation's gradient,
        # so validation skips its own read of X (see below)
        lbfgs_l2 = _SOLVERS[self.solver] == "lbfgs" and penalty in ("l2", None)
        found = {}   # the union of the labels, where validation finds it (a device y) with its agreement
        early = []   # L-BFGS on a binary dense CuPy shard: its first evaluation's kernel runs while the ranks agree
        warm = getattr(self, "coef_", None) if self.warm_start else None

        def launch_first(Xv, yv, labels):
            if self.solver == "lbfgs" and penalty in ("l2", None) and self.class_weight is None \
                    and EarlyPass.applies(Xv, labels, sample_weight=sample_weight, warm_coef=warm):
                early.append(EarlyPass(Xv, yv, labels, self.fit_intercept))

        X, y, xp, any_weights = validate_X_y(self, X, y, comm=comm, y_numeric=False, multi_output=False,
                                             accept_sparse=True, defer_finite=lbfgs_l2, classes_into=found,
                                             sample_weight_given=sample_weight is not None,
                                             before_agreement=launch_first)
        deferred = lbfgs_l2 and xp is not np and not is_sparse(X)    # as validation decided: the same on every rank
        if self.solver in ("liblinear", "sag", "saga"):  # scikit-learn's refusals for these solvers
            agree_on_error(comm, _large_sparse_or_values(self.solver, X, int64_indexed), error_class=ValueError)
        if self.solver == "liblinear" and X.dtype != np.float64:
            X = X.astype(xp.float64)  # LIBLINEAR works on float64 rows (scikit-learn converts them too)
        # scikit-learn's LogisticRegression accepts negative sample weights; so does this one.  When no rank
        # was given weights (agreed with the input), the unit weights need no checks and no agreement
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=X.dtype, comm=comm) if any_weights else None
        classes = found["classes"] if "classes" in found else global_classes(y, comm)
        if self.solver == "liblinear" and classes.size > 2:
            raise ValueError("The 'liblinear' solver does not support multiclass classification (n_classes >= 3). "
                             "Either use another solver or wrap the estimator in a OneVsRestClassifier to keep "
                             "applying a one-versus-rest scheme.")
        if classes.size < 2:
            raise ValueError("This solver needs samples of at least 2 classes in the data, but the data "
                             f"contains only one class: {classes[0]!r}" if classes.size else
                             "This solver needs samples of at least 2 classes in the data, but the data is empty")
        # the first evaluation launched during validation serves when the agreed input is what it assumed
        prepared = (early[0].take(X, y, classes) if early and not any_weights and "rows" in found else None)
        self._early_first_pass = prepared is not None   # (tests and profiles look)
        if sw is None:
            sw = early[0].sw if prepared is not None else xp.ones(X.shape[0], dtype=X.dtype)
        # (the fused binary path needs no class indices beyond the 0/1 labels the early pass made)
        if prepared is not None:
            y_idx = None
        elif xp is np and classes.size == 2:   # host labels of two classes: one compare (a search: 0.6 ms at 1e5 rows)
            y_idx = (y == classes[1]).astype(np.int64)
        else:
            y_idx = (xp.searchsorted(xp.asarray(classes), y) if xp is not np
                     else np.searchsorted(classes, y)).astype(xp.int64)
        if self.solver == "liblinear":  # LIBLINEAR leaves out the rows whose weight is not positive
            sw = xp.where(sw > 0, sw, xp.zeros_like(sw))
        if not any_weights and self.class_weight is None and "rows" in found:   # (agreed: no rank has weights)
            # unit weights: their global sum is the row count validation agreed on (the same float the
            # class sums of ones add up to, without their reductions and allreduce)
            sw_sum = float(found["rows"])
        else:
            sw, sw_sum = self._row_weights(y_idx, sw, classes, xp, comm)
        if sw_sum == 0 or not np.isfinite(sw_sum):
            raise ValueError("The weighted sum of the rows is zero (sample_weight times class_weight).")
        liblinear = self.solver == "liblinear"
        # the L1 share of the penalty (l1 / elasticnet): solved by the proximal Newton method
        l1_ratio = {"l1": 1.0, "elasticnet": float(self.l1_ratio or 0.0)}.get(penalty, 0.0)
        l1 = 0.0 if np.isinf(C) else l1_ratio / (C * sw_sum)
        obj = Objective(X, y_idx, sw, n_classes=len(classes), fit_intercept=self.fit_intercept,
                        l2=0.0 if np.isinf(C) else (1.0 - l1_ratio) / (C * sw_sum), sw_sum=sw_sum, comm=comm, xp=xp,
                        intercept_scaling=self.intercept_scaling if liblinear else 1.0,
                        penalise_intercept=liblinear, prepared=prepared)
        # (scikit-learn's liblinear ignores warm_start: LIBLINEAR always starts from zero)
        w0 = np.zeros(obj.n_params) if liblinear else self._initial_point(obj)
        algorithm = _SOLVERS[self.solver]
        out = np.float64 if liblinear else X.dtype  # scikit-learn's liblinear returns float64 always
        ctx = metadata = None
        if hasattr(self, "_init_callback_context"):  # scikit-learn's callback task tree (one subtask per iteration)
            ctx = self._init_callback_context(max_subtasks=max(self.max_iter, 1) + 1)
            metadata = {"sample_weight": sample_weight} if sample_weight is not None else None
            ctx.call_on_fit_task_begin(estimator=self, X=X, y=y, metadata=metadata)
        if liblinear and l1 == 0:
            w, n_iter = self._liblinear_l2(obj, y_idx, C)
        elif l1 > 0 or self.solver in ("sag", "saga", "liblinear"):
            w, n_iter = solve_like(obj, w0, l1=l1, solver=self.solver, max_iter=self.max_iter, tol=self.tol,
                                   verbose=self.verbose)
        elif algorithm == "lbfgs":
            if prepared is not None:
                obj.keep_local(early[0].w0, early[0].local)
            if deferred:   # the finite check validation left out: on the optimiser's first evaluation (its set-up
                # runs meanwhile, while the first kernel does)
                def check_first(loss, grad):
                    if not (np.isfinite(loss) and np.all(np.isfinite(grad))):
                        raise_if_nonfinite(self, X, y, comm=comm, xp=xp)   # raises on every rank unless it overflowed
                obj.check_first(check_first)
            hooks = None
            if ctx is not None and getattr(self, "_skl_callbacks", None):
                hooks = _LbfgsHooks(ctx, self, X, y, metadata, lambda w: {
                    "classes_": classes, **self._fitted_attributes(w, obj, 0.0, xp, out)}, w0)
            w, n_iter, res = lbfgs(obj, w0, max_iter=self.max_iter, tol=self.tol, verbose=self.verbose,
                                   on_iteration=hooks)
            if hooks is not None:
                hooks.close()
            self._n_fun_evals_scipy = int(res.nfev)
        elif algorithm == "newton-cholesky":
            w, n_iter = newton_cholesky(obj, w0, max_iter=self.max_iter, tol=self.tol, verbose=self.verbose)
        else:
            w, n_iter = newton_cg(obj, w0, max_iter=self.max_iter, tol=self.tol, verbose=self.verbose)
        self._n_fun_evals = obj.n_evals
        self.classes_ = classes
        for name, value in self._fitted_attributes(w, obj, l1, xp, out).items():
            setattr(self, name, value)
        self.n_iter_ = np.array([n_iter], dtype=np.int32)
        if ctx is not None:
            ctx.call_on_fit_task_end(estimator=self, X=X, y=y, metadata=metadata, reconstruction_attributes={})
        return self

    # ------------------------------------------------------------------ using the model
    def decision_function(self, X):
        """Raw scores of this rank's rows (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,) for two classes, else (n_local_samples, n_classes)
        """
        X, xp = local_X(self, X)
        scores = X @ as_like(dense_coef(self.coef_), xp, X.dtype).T + as_like(self.intercept_, xp, X.dtype)
        return scores[:, 0] if scores.shape[1] == 1 else scores

    def predict_proba(self, X):
        """Class probabilities of this rank's rows (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples, n_classes)
        """
        from .._array import get_namespace

        scores = self.decision_function(X)
        xp = get_namespace(scores)
        if scores.ndim == 1:
            p1 = expit(scores, xp)
            return xp.stack([1 - p1, p1], axis=1)
        return softmax_stats(scores, xp)[1]

    def _predict_proba_lr(self, X):
        """One-vs-rest probabilities: the logistic of each class's score, normalised over the classes
        (scikit-learn's linear-classifier helper; local, no communication)."""
        from .._array import get_namespace

        scores = self.decision_function(X)
        xp = get_namespace(scores)
        p = expit(scores, xp)
        if p.ndim == 1:
            return xp.stack([1 - p, p], axis=1)
        return p / p.sum(axis=1, keepdims=True)

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba` (no communication)."""
        from .._array import get_namespace

        p = self.predict_proba(X)
        return get_namespace(p).log(p)

    def predict(self, X):
        """Predicted labels of this rank's rows (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,)
            Labels from ``classes_``; on the device of ``X`` when they are numbers.
        """
        from .._array import get_namespace

        scores = self.decision_function(X)
        xp = get_namespace(scores)
        idx = (scores > 0).astype(xp.int64) if scores.ndim == 1 else scores.argmax(axis=1)
        if xp is not np and self.classes_.dtype.kind in "biuf":
            return xp.asarray(self.classes_)[idx]
        return self.classes_[as_like(idx, np)]

    def score(self, X, y, sample_weight=None):
        """Accuracy over the rows of every rank (one allreduce of ``[Σw·correct, Σw]``).

        Returns
        -------
        float
            The same on every rank.
        """
        comm = self._get_comm()
        self._check_is_fitted()
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=False, multi_output=False, reset=False,
                                accept_sparse=True)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=xp.float64, comm=comm, allow_all_zero=True)
        pred = self.predict(X)
        pack = np.zeros(2)
        if X.shape[0]:
            if xp is not np and self.classes_.dtype.kind in "biuf":
                correct = (pred == y).astype(xp.float64)
            else:
                correct = xp.asarray((as_like(pred, np) == as_like(y, np)).astype(np.float64))
            pack[:] = float(sw @ correct), float(sw.sum())
        pack = allreduce_identical(comm, pack)
        return float(pack[0] / pack[1]) if pack[1] > 0 else 0.0
