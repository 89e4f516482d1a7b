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

__all__ = ["check_sparse_intercept", "reported_solver"]


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
