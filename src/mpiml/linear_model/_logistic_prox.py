"""L1 and elastic-net penalised logistic regression: a distributed proximal Newton method.

The objective is scikit-learn's for ``penalty="l1"`` / ``"elasticnet"``::

    F(w) = f(w) + l1 · Σ_j |w_j|      (penalised coordinates j only)

where ``f`` is the smooth part evaluated by :class:`~._logistic_loss.Objective` (the
weighted mean log loss plus the L2 share ``l2 ||w||² / 2``), with
``l1 = l1_ratio / (C Σw)`` and ``l2 = (1 - l1_ratio) / (C Σw)``.

Each outer iteration needs ``f``, its gradient and its Hessian at the current point:
one :meth:`Objective.evaluate` call, that is one packed allreduce. The step then
comes from the local (replicated, communication-free) minimisation of the quadratic
model plus the L1 term,

    min_z  gᵀ(z - w) + ½ (z - w)ᵀ H (z - w) + l1 Σ |z_j|,

by cyclic coordinate descent, and a backtracking line search on ``F`` along
``z - w`` (each trial point: one more evaluation, whose Hessian serves the next
iteration if the point is accepted). Every rank holds the same bits of ``g`` and
``H`` (the reductions are identical everywhere), so every rank takes the same
decisions and the ranks stay in lockstep.

Convergence: the largest component of the proximal-gradient residual
``w - prox(w - ∇f(w))``, which is zero exactly at the minimiser, must fall to
``tol`` (the analogue of the projected-gradient test of the L-BFGS solver).
The method converges quadratically near the solution, so scikit-learn's SAGA or
LIBLINEAR solution is reached well within their own tolerances.

The Hessian is dense, ``(k (d+1))²`` numbers: this solver suits problems up to a
few thousand features per class, as Newton-Cholesky does.
"""

import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from ._logistic_loss import lbfgs

__all__ = ["SparseCoefMixin", "dense_coef", "fista", "prox_newton", "soft_threshold", "solve_like"]

#: the largest ``k (d + 1)`` whose dense Hessian the proximal Newton method forms
NEWTON_MAX_PARAMS = 3000


class SparseCoefMixin:
    """scikit-learn's ``sparsify`` / ``densify``: ``coef_`` as a sparse matrix (SciPy, or ``cupyx`` on
    the device) after an L1 fit with many zeros, and back (local, no communication)."""

    def sparsify(self):
        """Convert ``coef_`` to a CSR matrix; returns the estimator."""
        self._check_is_fitted("coef_")
        coef = self.coef_
        if hasattr(coef, "toarray"):
            return self
        if isinstance(coef, np.ndarray):
            import scipy.sparse as sp

            self.coef_ = sp.csr_matrix(coef)
        else:
            import cupyx.scipy.sparse as csp

            self.coef_ = csp.csr_matrix(coef)
        return self

    def densify(self):
        """Convert a sparse ``coef_`` back to a dense array; returns the estimator."""
        self._check_is_fitted("coef_")
        self.coef_ = dense_coef(self.coef_)
        return self


def dense_coef(coef):
    """``coef_`` as a dense array (it is sparse after :meth:`SparseCoefMixin.sparsify`)."""
    return coef.toarray() if hasattr(coef, "toarray") else coef


def soft_threshold(v, t):
    """``sign(v) max(|v| - t, 0)`` element-wise (``t`` may be an array of thresholds)."""
    return np.sign(v) * np.maximum(np.abs(v) - t, 0.0)


def _penalty(obj, l1, w):
    return l1 * float(np.abs(np.where(obj.penalised, w, 0.0)).sum())


def _residual(w, g, lam, free=None):
    """``max |w - prox(w - g)|`` (free coordinates): zero exactly at a minimiser of ``f + Σ lam_j |w_j|``."""
    r = np.abs(w - soft_threshold(w - g, lam))
    if free is not None:
        r = r[free]
    return float(np.max(r)) if r.size else 0.0


def _quadratic_step(w, g, H, lam, free, *, tol, max_sweeps=500):
    """Minimise ``gᵀ(z-w) + ½ (z-w)ᵀH(z-w) + Σ lam_j |z_j|`` over the free coordinates by cyclic
    coordinate descent (no communication); returns ``z``."""
    z = w.copy()
    r = np.zeros_like(w)  # H (z - w)
    diag = np.diag(H).copy()
    active = np.flatnonzero(free & (diag > 0))
    for _ in range(max_sweeps):
        biggest = 0.0
        for j in active:
            grad_j = g[j] + r[j]
            new = soft_threshold(z[j] - grad_j / diag[j], lam[j] / diag[j])
            delta = new - z[j]
            if delta != 0.0:
                z[j] = new
                r += delta * H[:, j]
                biggest = max(biggest, abs(delta))
        if biggest <= tol:
            break
    return z


def _newton_step(w, g, H, free):
    """The plain Newton step on the free coordinates (no L1 share), by Cholesky or least squares."""
    step = np.zeros_like(w)
    idx = np.flatnonzero(free)
    Hf, gf = H[np.ix_(idx, idx)], g[idx]
    try:
        with warnings.catch_warnings():  # an ill-conditioned Hessian (e.g. separable, no penalty): least squares
            warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
            step[idx] = scipy.linalg.solve(Hf, -gf, assume_a="pos")
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError, scipy.linalg.LinAlgWarning, ValueError):
        step[idx] = scipy.linalg.lstsq(Hf, -gf)[0]
    return step


def _warn_not_converged(solver):
    if solver == "liblinear":
        msg = "Liblinear failed to converge, increase the number of iterations."
    else:
        msg = "The max_iter was reached which means the coef_ did not converge"
    warnings.warn(msg, ConvergenceWarning, stacklevel=4)


def solve_like(obj, w0, *, l1, solver, max_iter, tol, verbose=0):
    """The solver standing for scikit-learn's ``"sag"`` and ``"saga"``, and for any L1 share of the
    penalty (``"liblinear"``'s L2 runs LIBLINEAR's own methods, :mod:`._liblinear`): proximal Newton while the dense Hessian is affordable, else L-BFGS
    (no L1 share) or FISTA; returns ``(w, n_iter)`` and warns with scikit-learn's text for that solver."""
    if obj.n_params <= NEWTON_MAX_PARAMS:
        return prox_newton(obj, w0, l1=l1, max_iter=max_iter, tol=tol, solver=solver, verbose=verbose)
    if l1 > 0:
        return fista(obj, w0, l1=l1, max_iter=max_iter, tol=tol, solver=solver, verbose=verbose)
    if max_iter == 0:
        _warn_not_converged(solver)
        return np.asarray(w0, dtype=np.float64), 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w, n_iter, _ = lbfgs(obj, w0, max_iter=max_iter, tol=tol, verbose=verbose)
    for item in caught:
        if issubclass(item.category, ConvergenceWarning):
            _warn_not_converged(solver)
        else:
            warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
    return w, n_iter


def fista(obj, w0, *, l1, max_iter, tol, solver, verbose=0):
    """Accelerated proximal gradient with backtracking (one allreduce per evaluation, no Hessian)."""
    lam = np.where(obj.penalised, l1, 0.0)
    x = np.asarray(w0, dtype=np.float64).copy()
    y, t, L = x.copy(), 1.0, 1.0
    n_iter, converged = 0, False
    while n_iter < max_iter:
        n_iter += 1
        fy, gy = obj.evaluate(y)
        for _ in range(60):
            x_new = soft_threshold(y - gy / L, lam / L)
            fx, gx = obj.evaluate(x_new)
            d = x_new - y
            if fx <= fy + float(gy @ d) + 0.5 * L * float(d @ d) * (1 + 1e-12) + 1e-14 * abs(fy):
                break
            L *= 2.0
        if verbose and obj.comm.rank == 0:
            print(f"iteration {n_iter}: objective {fx + _penalty(obj, l1, x_new):.10g}", flush=True)
        if _residual(x_new, gx, lam) <= tol:
            x, converged = x_new, True
            break
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = x_new + ((t - 1.0) / t_new) * (x_new - x)
        x, t, L = x_new, t_new, L * 0.9
    if not converged:
        _warn_not_converged(solver)
    return x, n_iter


def prox_newton(obj, w0, *, l1, max_iter, tol, solver, verbose=0):
    """Minimise ``obj`` + ``l1 ||w||₁`` (penalised coordinates) from ``w0``; returns ``(w, n_iter)``.

    ``solver`` names scikit-learn's solver, for the text of the convergence warning.

    Stops when the (proximal) Newton step, which in the quadratic regime is the distance to the
    minimiser, is at most ``tol`` relative to the coefficients (``max(1, max|w|)``); that last
    step is taken whole, without an evaluation, which squares the error. (A residual of the
    averaged objective below ``tol`` would leave the coefficients ``tol / λ_min(H)`` away: 4e-4 on
    a small, weakly penalised problem where scikit-learn's own solvers stop 1e-5 from it.)  Without
    any penalty the minimiser may not exist (separable classes: the steps grow), so there a residual
    below ``tol`` also stops, as scikit-learn's L-BFGS does.  So does a residual below ``tol`` once
    the steps stop contracting (rounding, e.g. float32 rows with a poorly conditioned Hessian, sets a
    floor under them).
    """
    lam = np.where(obj.penalised, l1, 0.0)
    free = np.ones(obj.n_params, dtype=bool)
    if not obj.binary and obj.l2 == 0 and obj.fi and not obj.penalised.reshape(obj.k, -1)[0, -1]:
        # the multinomial is invariant to a constant added to every (unpenalised) intercept
        free.reshape(obj.k, -1)[-1, -1] = False
    w = np.asarray(w0, dtype=np.float64).copy()
    f, g, H = obj.evaluate(w, hessian=True)
    F = f + _penalty(obj, l1, w)
    n_iter = 0
    converged = _residual(w, g, lam, free) == 0.0
    eps = 16 * np.finfo(obj.X.dtype).eps
    unpenalised = obj.l2 == 0 and l1 == 0
    previous = np.inf
    while not converged and n_iter < max_iter:
        if unpenalised and _residual(w, g, lam, free) <= tol:
            converged = True
            break
        n_iter += 1
        if l1 > 0:
            step = _quadratic_step(w, g, H, lam, free, tol=max(tol * 1e-2, 1e-12)) - w
        else:
            step = _newton_step(w, g, H, free)
        size = np.max(np.abs(step), initial=0.0)
        if np.isfinite(size) and size <= tol * max(1.0, float(np.max(np.abs(w), initial=0.0))):
            w, converged = w + step, True
            break
        if not size < 0.5 * previous and _residual(w, g, lam, free) <= tol:
            converged, n_iter = True, n_iter - 1  # (this step is not taken)
            break
        previous = size
        z = w + step
        # predicted decrease of F (negative for a descent direction)
        delta = float(g @ step) + _penalty(obj, l1, z) - _penalty(obj, l1, w)
        t, accepted = 1.0, False
        for _ in range(30):
            w_new = w + t * step
            f_new, g_new, H_new = obj.evaluate(w_new, hessian=True)
            F_new = f_new + _penalty(obj, l1, w_new)
            if F_new <= F + 1e-4 * t * delta or abs(F_new - F) <= abs(F) * eps:
                accepted = True
                break
            t *= 0.5
        if not accepted:
            break
        w, f, g, H, F = w_new, f_new, g_new, H_new, F_new
        if verbose and obj.comm.rank == 0:
            print(f"iteration {n_iter}: objective {F:.10g}", flush=True)
    if not converged:
        _warn_not_converged(solver)
    return w, n_iter
