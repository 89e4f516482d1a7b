"""Logistic regression over the rows of every rank (SPMD), on NumPy or CuPy shards.

The objective is scikit-learn's: the weighted mean of the log loss over all
rows plus ``||W||² / (2 C Σw)``.  Every rank evaluates its rows' share of the
loss and gradient (and Hessian for Newton) and one packed allreduce sums
them; the optimiser then runs identically on every rank.

Keeping the ranks in lockstep
-----------------------------
An optimiser that runs on every rank must take the same decisions everywhere
(line-search steps, convergence tests, iteration counts), or the ranks stop
calling the same collectives and the job hangs.  Two things make sure of it:

1. every reduction is :func:`~mpiml.linear_model._base.allreduce_identical`
   (binomial reduce to rank 0, then broadcast), so every rank receives the
   same bits, and the optimisers (scipy's L-BFGS-B, the Newton loop below)
   are deterministic functions of those bits;
2. as a guard against what (1) cannot promise (different library builds or
   thread counts on different ranks), each packed reduction carries a 12-bit
   fingerprint ``f`` of the coefficients this rank evaluated at, as ``f`` and
   ``f²``.  The sums are exact integers, and ``p Σf² = (Σf)²`` holds exactly
   when all ranks sent the same ``f``; otherwise every rank raises the same
   :class:`mpiml.CommError` at the same evaluation instead of drifting apart.
"""

import warnings
import zlib
from numbers import Integral, Real

import numpy as np
import scipy.linalg
import scipy.optimize
from sklearn.base import ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.class_weight import compute_class_weight

from .._errors import CommError
from ..base import SPMDEstimator
from ..utils._param_validation import Interval, StrOptions
from ..utils._validation import validate_sample_weight
from ._base import allreduce_identical, as_like, chunk_rows, global_classes, local_X, validate_X_y

__all__ = ["LogisticRegression"]


# ---------------------------------------------------------------------- private compute helpers
def _fingerprint(w):
    return float(zlib.crc32(np.ascontiguousarray(w, dtype=np.float64).tobytes()) & 0xFFF)


def _softmax_stats(raw, xp):
    """``(log-sum-exp per row, probabilities)`` of a raw prediction matrix, overflow-safe."""
    m = raw.max(axis=1, keepdims=True)
    e = xp.exp(raw - m)
    s = e.sum(axis=1, keepdims=True)
    return (m + xp.log(s))[:, 0], e / s


def _expit(raw, xp):
    return xp.exp(-xp.logaddexp(0.0, -raw))


class _Objective:
    """The distributed logistic objective on validated shards.

    Parameters are laid out as ``W`` of shape ``(n_rows_w, d + fit_intercept)``
    flattened in C order: one row for a binary problem (the positive class),
    one row per class for a multinomial one; the last column is the intercept.
    """

    def __init__(self, X, y_idx, sw, *, n_classes, fit_intercept, l2, sw_sum, comm, xp):
        self.X, self.y_idx, self.sw = X, y_idx, sw
        self.binary = n_classes == 2
        self.k = 1 if self.binary else n_classes
        self.n_classes = n_classes
        self.d = X.shape[1]
        self.fi = int(fit_intercept)
        self.l2, self.sw_sum = l2, sw_sum
        self.comm, self.xp = comm, xp
        self.n_evals = 0
        if self.binary:
            self.y01 = (y_idx == 1).astype(X.dtype)

    @property
    def n_params(self):
        return self.k * (self.d + self.fi)

    def _split(self, w):
        W = np.asarray(w, dtype=np.float64).reshape(self.k, self.d + self.fi)
        return W[:, :self.d], (W[:, self.d] if self.fi else np.zeros(self.k))

    def raw(self, X, w):
        """Raw predictions ``X Wᵀ + b`` of shape (n,) (binary) or (n, n_classes)."""
        xp = self.xp
        coef, intercept = self._split(w)
        raw = X @ xp.asarray(coef.T.astype(X.dtype)) + xp.asarray(intercept.astype(X.dtype))
        return raw[:, 0] if self.binary else raw

    def _local(self, w, hessian):
        """This rank's ``[Σ w·loss | gradient | (Hessian)]`` as host float64 (unscaled)."""
        xp, X, sw = self.xp, self.X, self.sw
        n, D = X.shape[0], self.d + self.fi
        npar = self.n_params
        out = np.zeros(1 + npar + (npar * npar if hessian else 0))
        if n == 0:
            return out
        raw = self.raw(X, w)
        if self.binary:
            loss = xp.logaddexp(0.0, raw) - self.y01 * raw
            p = _expit(raw, xp)
            G = (sw * (p - self.y01))[:, None]
        else:
            lse, P = _softmax_stats(raw, xp)
            loss = lse - xp.take_along_axis(raw, self.y_idx[:, None], axis=1)[:, 0]
            G = P.copy()
            G[xp.arange(n), self.y_idx] -= 1
            G *= sw[:, None]
        out[0] = float(sw.astype(xp.float64) @ loss.astype(xp.float64))
        grad = np.zeros((self.k, D))
        # Gᵀ X in X's dtype (no float64 copy of a float32 shard per evaluation, as scikit-learn), float64 after
        grad[:, :self.d] = as_like((G.T.astype(X.dtype) @ X).astype(xp.float64), np)
        if self.fi:
            grad[:, self.d] = as_like(G.astype(xp.float64).sum(axis=0), np)
        out[1:1 + npar] = grad.ravel()
        if hessian:
            out[1 + npar:] = self._local_hessian(p if self.binary else P).ravel()
        return out

    def _local_hessian(self, prob):
        """``Σ_rows w·x̃ x̃ᵀ ⊗ (diag(p) - p pᵀ)`` with ``x̃ = [x, 1]``, float64, chunked."""
        xp, X, sw = self.xp, self.X, self.sw
        D, k = self.d + self.fi, self.k
        H = xp.zeros((k * D, k * D), dtype=xp.float64)
        step = max(1, chunk_rows(k * D, xp=xp) // max(1, k))
        for s in range(0, X.shape[0], step):
            Xa = X[s:s + step].astype(xp.float64)
            if self.fi:
                Xa = xp.concatenate([Xa, xp.ones((Xa.shape[0], 1), dtype=xp.float64)], axis=1)
            w = sw[s:s + step].astype(xp.float64)
            if self.binary:
                p = prob[s:s + step].astype(xp.float64)
                H += (Xa * (w * p * (1 - p))[:, None]).T @ Xa
                continue
            P = prob[s:s + step].astype(xp.float64)
            for c in range(k):  # block diagonal: Σ w p_c x̃ x̃ᵀ
                H[c * D:(c + 1) * D, c * D:(c + 1) * D] += (Xa * (w * P[:, c])[:, None]).T @ Xa
            B = ((w[:, None] * P)[:, :, None] * Xa[:, None, :]).reshape(Xa.shape[0], k * D)
            C = (P[:, :, None] * Xa[:, None, :]).reshape(Xa.shape[0], k * D)
            H -= B.T @ C
        return as_like(H, np)

    def evaluate(self, w, hessian=False):
        """Global ``(loss, gradient[, Hessian])`` at ``w``: one packed allreduce, identical on every rank."""
        w = np.asarray(w, dtype=np.float64)
        local = self._local(w, hessian)
        fp = _fingerprint(w)
        packed = allreduce_identical(self.comm, np.concatenate([local, [fp, fp * fp]]))
        self.n_evals += 1
        s1, s2 = packed[-2], packed[-1]
        if self.comm.size * s2 != s1 * s1:
            raise CommError("LogisticRegression: the ranks evaluated the objective at different coefficients "
                            f"(evaluation {self.n_evals}); their optimisers diverged, which needs identical "
                            "numerical libraries on every rank")
        npar = self.n_params
        coef, _ = self._split(w)
        penalised = np.zeros((self.k, self.d + self.fi), dtype=bool)
        penalised[:, :self.d] = True
        penalised = penalised.ravel()
        loss = packed[0] / self.sw_sum + 0.5 * self.l2 * float(coef.ravel() @ coef.ravel())
        grad = packed[1:1 + npar] / self.sw_sum + self.l2 * np.where(penalised, w, 0.0)
        if not hessian:
            return loss, grad
        H = packed[1 + npar:1 + npar + npar * npar].reshape(npar, npar) / self.sw_sum
        H[np.diag_indices(npar)] += self.l2 * penalised
        return loss, grad, H


def _lbfgs(obj, w0, *, max_iter, tol):
    """scipy's L-BFGS-B on every rank with scikit-learn's options; returns ``(w, n_iter, result)``."""
    res = scipy.optimize.minimize(obj.evaluate, w0, method="L-BFGS-B", jac=True,
                                  options={"maxiter": max_iter, "maxls": 50, "gtol": tol,
                                           "ftol": 64 * np.finfo(float).eps})
    n_iter = min(int(res.nit), max_iter)
    if res.status != 0:
        msg = (f"lbfgs failed to converge after {n_iter} iteration(s) (status={res.status}):\n{res.message}\n")
        if n_iter == max_iter:
            msg += f"\nIncrease the number of iterations to improve the convergence (max_iter={max_iter})."
        msg += ("\nYou might also want to scale the data as shown in:\n"
                "    https://scikit-learn.org/stable/modules/preprocessing.html")
        warnings.warn(msg, ConvergenceWarning, stacklevel=4)
    return res.x, n_iter, res


def _newton_cholesky(obj, w0, *, max_iter, tol):
    """Damped Newton with symmetric-solver steps and Armijo backtracking (scikit-learn's rules).

    One allreduce of ``[loss | gradient | Hessian]`` per trial point; the
    accepted trial's Hessian serves the next step.  Falls back to L-BFGS on a
    singular Hessian, a non-descent step or a failed line search.
    """
    k, D = obj.k, obj.d + obj.fi
    free = np.ones((k, D), dtype=bool)
    if not obj.binary:
        if obj.l2 == 0:
            free[-1, :] = False  # the multinomial is invariant to adding a vector to every class
        elif obj.fi:
            free[-1, -1] = False  # ... and to adding a constant to every (unpenalised) intercept
    free = free.ravel()
    w = np.asarray(w0, dtype=np.float64).copy()
    f, g, H = obj.evaluate(w, hessian=True)
    eps = 16 * np.finfo(obj.X.dtype).eps
    it, converged, fallback = 1, False, False
    while it <= max_iter and not converged:
        try:
            step = np.zeros_like(w)
            with warnings.catch_warnings():
                warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
                step[free] = scipy.linalg.solve(H[np.ix_(free, free)], -g[free], assume_a="sym",
                                                check_finite=False)
        except (np.linalg.LinAlgError, scipy.linalg.LinAlgWarning) as exc:
            warnings.warn("The inner solver of the Newton-Cholesky solver stumbled upon a singular or very "
                          f"ill-conditioned Hessian matrix at iteration {it}. It will now resort to lbfgs "
                          f"instead.\nThe original Linear Algebra message was:\n{exc}",
                          scipy.linalg.LinAlgWarning, stacklevel=4)
            fallback = True
            break
        gtn = float(g @ step)
        if gtn > 0:
            fallback = True
            break
        t, accepted = 1.0, False
        for _ in range(21):
            w_new = w + t * step
            f_new, g_new, H_new = obj.evaluate(w_new, hessian=True)
            improvement = f_new - f
            if improvement <= t * 0.00048828125 * gtn:
                accepted = True
            elif abs(improvement) <= abs(f * eps) and np.abs(g_new).sum() < np.abs(g).sum():
                accepted = True
            if accepted:
                break
            t *= 0.5
        if not accepted:
            warnings.warn(f"Line search of the Newton-Cholesky solver at iteration #{it} did not converge after "
                          "21 line search refinement iterations. It will now resort to lbfgs instead.",
                          ConvergenceWarning, stacklevel=4)
            fallback = True
            break
        H_old = H
        w, f, g, H = w_new, f_new, g_new, H_new
        if np.max(np.abs(g)) <= tol and 0.5 * float(step @ H_old @ step) <= tol:
            converged = True
        it += 1
    n_iter = it - 1
    if not converged:
        if fallback:
            w, extra, _ = _lbfgs(obj, w, max_iter=max(max_iter - n_iter, 0), tol=tol)
            n_iter += extra
        else:
            warnings.warn(f"Newton solver did not converge after {n_iter} iterations.", ConvergenceWarning,
                          stacklevel=4)
    return w, n_iter


def _centre_multinomial(W, obj):
    """Fix the representation the multinomial leaves free (scikit-learn's convention)."""
    if obj.binary:
        return W
    if obj.l2 == 0:
        return W - W.mean(axis=0)
    if obj.fi:
        W = W.copy()
        W[:, -1] -= W[:, -1].mean()
    return W


class LogisticRegression(ClassifierMixin, SPMDEstimator):
    """Logistic regression (binary or multinomial) over the rows of every rank (SPMD), NumPy or CuPy.

    Every rank calls :meth:`fit` with its own rows and labels; ``classes_`` is
    the sorted union of the labels of every rank and the coefficients are the
    same on every rank, equal up to the solver tolerance to scikit-learn's on
    the concatenated rows.

    Parameters
    ----------
    penalty : {"l2", None}, default="l2"
        ``"l2"``: add ``||W||² / (2 C)`` to the summed loss (the intercept is
        not penalised); None: no penalty (``C`` is ignored).
    C : float, default=1.0
        Inverse of the penalty strength, positive; ``np.inf`` means no penalty.
    fit_intercept : bool, default=True
        Whether to fit an intercept.
    class_weight : dict, "balanced" or None, default=None
        Weights per class, multiplied with ``sample_weight``.  ``"balanced"``
        uses ``Σw / (n_classes · Σw per class)`` over the rows of every rank.
    max_iter : int, default=100
        Maximum iterations of the solver.
    tol : float, default=1e-4
        Stop when the largest absolute entry of the gradient (projected, for
        L-BFGS) is at most ``tol``; Newton also requires half the Newton
        decrement to be at most ``tol``.
    solver : {"lbfgs", "newton-cholesky"}, default="lbfgs"
        ``"lbfgs"``: scipy's L-BFGS-B, one allreduce per function evaluation.
        ``"newton-cholesky"``: Newton steps from the full Hessian, for
        ``n_classes · n_features`` up to a few thousand.
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

    * per fit: the labels of every rank (one ``allgather_obj`` of the local
      unique labels) and one allreduce of the ``n_classes`` weighted class
      counts (``Σw``, the balanced weights);
    * ``"lbfgs"``: **one** allreduce per function evaluation, of ``m·D + 3``
      values ``[loss | gradient | fingerprint]`` (``mpiml.profile`` shows
      exactly one per evaluation);
    * ``"newton-cholesky"``: one allreduce per trial point of the line search
      (usually one per iteration) of ``m·D + (m·D)² + 3`` values
      ``[loss | gradient | Hessian | fingerprint]``.

    Every reduction is a binomial reduce to rank 0 followed by a broadcast, so
    every rank receives the same bits and the optimiser's decisions (step
    sizes, convergence, iteration counts) agree; a fingerprint of the
    coefficients in each reduction turns any divergence into the same
    :class:`mpiml.CommError` on every rank (see the module docstring).  The
    small linear algebra (L-BFGS updates, Cholesky of the Hessian) runs on the
    host in float64; the row-wise work (``X W``, the loss, ``Gᵀ X``, the
    Hessian's ``X̃ᵀ diag(h) X̃``) runs on the device of ``X``.

    Conditioning: L-BFGS needs no factorisation and is the safer choice for
    nearly collinear features; Newton-Cholesky factorises a Hessian whose
    condition number grows like that of ``XᵀX`` (weighted by ``p(1 - p)``)
    and falls back to L-BFGS when Cholesky fails, as scikit-learn's does.
    With separable classes and no penalty the coefficients diverge and a
    :class:`~sklearn.exceptions.ConvergenceWarning` is issued.

    :meth:`predict`, :meth:`predict_proba` and :meth:`decision_function` act
    on local rows; :meth:`score` (accuracy) is global: one allreduce of two
    values.
    """

    _parameter_constraints = {
        **SPMDEstimator._parameter_constraints,
        "penalty": [StrOptions({"l2"}), None],
        "C": [Interval(Real, 0, None, closed="neither")],
        "fit_intercept": ["boolean"],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"lbfgs", "newton-cholesky"})],
    }
    _saved_attributes = ("classes_", "coef_", "intercept_", "n_iter_")

    def __init__(self, penalty="l2", *, C=1.0, fit_intercept=True, class_weight=None, max_iter=100, tol=1e-4,
                 solver="lbfgs", comm=None):
        self.penalty = penalty
        self.C = C
        self.fit_intercept = fit_intercept
        self.class_weight = class_weight
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.comm = comm

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags

    # ------------------------------------------------------------------ fitting
    def _row_weights(self, y_idx, sw, classes, xp, comm):
        """Per-row weights (sample × class weight) and their global sum (one allreduce)."""
        k = len(classes)
        counts = np.zeros(k)
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

    def fit(self, X, y, sample_weight=None):
        """Fit the model to the rows of every rank.

        Parameters
        ----------
        X : array-like of shape (n_local_samples, n_features)
            This rank's rows (NumPy or CuPy; float64 and float32 are kept).
        y : array-like of shape (n_local_samples,)
            Labels of this rank's rows: any type NumPy sorts (CuPy: numbers).
        sample_weight : array-like of shape (n_local_samples,), default=None
            Non-negative weights of this rank's rows.

        Returns
        -------
        self : LogisticRegression
        """
        self._validate_params()
        comm = self._get_comm()
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=False, multi_output=False)
        sw = validate_sample_weight(sample_weight, X, xp=xp, dtype=X.dtype, only_non_negative=True, comm=comm)
        classes = global_classes(y, comm)
        if classes.size < 2:
            raise ValueError("This solver needs samples of at least 2 classes in the data, but the data "
                             f"contains only one class: {classes[0]!r}" if classes.size else
                             "This solver needs samples of at least 2 classes in the data, but the data is empty")
        if self.penalty is None and self.C != 1.0:
            warnings.warn("Setting penalty=None will ignore the C parameter", UserWarning, stacklevel=2)
        y_idx = (xp.searchsorted(xp.asarray(classes), y) if xp is not np
                 else np.searchsorted(classes, y)).astype(xp.int64)
        sw, sw_sum = self._row_weights(y_idx, sw, classes, xp, comm)
        if not sw_sum > 0:
            raise ValueError("The weighted sum of the rows is zero (sample_weight times class_weight).")
        no_penalty = self.penalty is None or np.isinf(self.C)
        obj = _Objective(X, y_idx, sw, n_classes=len(classes), fit_intercept=self.fit_intercept,
                         l2=0.0 if no_penalty else 1.0 / (self.C * sw_sum), sw_sum=sw_sum, comm=comm, xp=xp)
        w0 = np.zeros(obj.n_params)
        if self.solver == "lbfgs":
            w, n_iter, res = _lbfgs(obj, w0, max_iter=self.max_iter, tol=self.tol)
            self._n_fun_evals_scipy = int(res.nfev)
        else:
            w, n_iter = _newton_cholesky(obj, w0, max_iter=self.max_iter, tol=self.tol)
        self._n_fun_evals = obj.n_evals
        W = _centre_multinomial(np.asarray(w).reshape(obj.k, obj.d + obj.fi), obj)
        self.classes_ = classes
        self.coef_ = as_like(W[:, :obj.d], xp, X.dtype)
        self.intercept_ = as_like(W[:, obj.d] if obj.fi else np.zeros(obj.k), xp, X.dtype)
        self.n_iter_ = np.array([n_iter], dtype=np.int32)
        return self

    # ------------------------------------------------------------------ using the model
    def decision_function(self, X):
        """Raw scores of this rank's rows (no communication).

        Returns
        -------
        ndarray of shape (n_local_samples,) for two classes, else (n_local_samples, n_classes)
        """
        X, xp = local_X(self, X)
        scores = X @ as_like(self.coef_, xp, X.dtype).T + as_like(self.intercept_, xp, X.dtype)
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
            p1 = _expit(scores, xp)
            return xp.stack([1 - p1, p1], axis=1)
        return _softmax_stats(scores, xp)[1]

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
        X, y, xp = validate_X_y(self, X, y, comm=comm, y_numeric=False, multi_output=False, reset=False)
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
