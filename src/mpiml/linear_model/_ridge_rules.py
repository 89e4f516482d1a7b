"""scikit-learn's warning for Ridge's ``"sag"`` on sparse rows with an intercept, and the ``solver_`` it reports.

scikit-learn warns that ``"sag"`` needs many iterations to fit the intercept of sparse
data unless ``max_iter`` is set or ``tol`` is small; the same warning is raised here
(on every rank: the kind of input is agreed across ranks before). scikit-learn also
refuses ``"svd"``, ``"cholesky"`` and ``"saga"`` there; mpiml's solvers all fit that
intercept exactly (the centring is implicit), so those combinations are solved rather
than refused. ``solver_`` names scikit-learn's choice: ``"sag"``/``"saga"`` when asked
(they run as ``"sparse_cg"`` here, to the same minimiser).
"""

import warnings

import numpy as np
import scipy.optimize
from sklearn.exceptions import ConvergenceWarning

__all__ = ["check_sparse_intercept", "reported_solver", "lbfgs_from_factor"]


def check_sparse_intercept(est, sparse):
    """scikit-learn's warning for ``"sag"`` on sparse rows with ``fit_intercept`` (no communication)."""
    if est.positive or not (sparse and est.fit_intercept):
        return
    if est.solver == "sag" and est.max_iter is None and est.tol > 1e-4:
        warnings.warn('"sag" solver requires many iterations to fit an intercept with sparse inputs. Either set the '
                      'solver to "auto" or "sparse_cg", or set a low "tol" and a high "max_iter" (especially if inputs '
                      "are not standardized).", UserWarning, stacklevel=3)


def reported_solver(est, ran):
    """``solver_``: scikit-learn's name for what was asked (``"sag"``/``"saga"``), else what ran."""
    return est.solver if est.solver in ("sag", "saga") and ran == "sparse_cg" else ran


def lbfgs_from_factor(R, Z, alphas, *, max_iter, tol):
    """``solver="lbfgs"`` with ``positive=True``: scikit-learn's bounded L-BFGS-B, on a square factor.

    ``½||R w - z||² + ½ alpha ||w||²`` has the gradient (and, up to a constant, the value) of
    scikit-learn's ``½||X̃ w - ỹ||² + ½ alpha ||w||²`` on the centred, weighted rows, since
    ``RᵀR = X̃ᵀX̃`` and ``Rᵀz = X̃ᵀỹ``: the same iterations with its ``tol`` and ``max_iter``
    (and its ConvergenceWarning), run on every rank alike on the replicated factor, with no
    communication.  Returns ``coef`` of shape ``(d, t)``.
    """
    d, t = R.shape[1], Z.shape[1]
    coef = np.empty((d, t))
    options = {} if max_iter is None else {"maxiter": int(max_iter)}
    for j in range(t):
        z, alpha = Z[:, j], float(alphas[j])

        def value_and_gradient(w):
            r = R @ w - z
            return 0.5 * float(r @ r) + 0.5 * alpha * float(w @ w), R.T @ r + alpha * w

        res = scipy.optimize.minimize(value_and_gradient, np.zeros(d), method="L-BFGS-B", jac=True, tol=tol,
                                      bounds=[(0, np.inf)] * d, options=options)
        if not res.success:
            warnings.warn(f"The lbfgs solver did not converge. Try increasing max_iter or tol. Currently: "
                          f"max_iter={max_iter} and tol={tol}", ConvergenceWarning, stacklevel=4)
        coef[:, j] = res.x
    return coef
