"""scikit-learn's ``solver="liblinear"`` with the L2 penalty: LIBLINEAR's algorithms and stopping rules, SPMD.

scikit-learn runs LIBLINEAR, whose answer at the default ``tol=1e-4`` is not the minimiser
but the point where LIBLINEAR's own algorithm stops (about 1e-5 from it on small problems),
and whose dual solver visits the rows in a ``random_state``-seeded order.  Code that compares
with it (scikit-learn's ``LogisticRegressionCV`` on the same data, for instance) sees those
differences, so this module follows the published algorithms rather than minimising to the
end by another method.  The objective is LIBLINEAR's::

    f(w) = ½ ||w||² + Σ_i C_i log(1 + exp(-y_i wᵀx_i)),   C_i = C · sample_weight_i · class_weight_{y_i}

with the intercept, when fitted, the weight of a constant feature of value
``intercept_scaling`` (penalised with the others).  Rows whose sample weight is not
positive are left out, as LIBLINEAR leaves them out.  It is ``C Σw`` times the
:class:`~._logistic_loss.Objective` of the estimator (``1 / Objective.l2``).

**Primal** (``dual=False``): the trust-region Newton method of Lin, Weng and Keerthi
("Trust region Newton method for large-scale logistic regression", JMLR 2008), in the form
LIBLINEAR 1.x runs it (scikit-learn ships that form): the trust region starts at
``||∇f(0)||``, each step is the truncated conjugate-gradient solution of the Newton system
inside the region (CG stopped at a residual of ``0.1 ||g||`` or on the boundary), the step
is taken when the actual reduction exceeds ``η₀ = 10⁻⁴`` of the predicted one, and the
region is updated from their ratio (``η₁ = 0.25``, ``η₂ = 0.75``; ``σ₁ = 0.25``,
``σ₂ = 0.5``, ``σ₃ = 4``, with the interpolated step bound of Lin and Moré 1999).  It stops
when ``||∇f(w)|| ≤ ε ||∇f(0)||`` with LIBLINEAR's scaling of the tolerance,
``ε = tol · max(min(#pos, #neg), 1) / #rows``, or after ``max_iter`` accepted steps.  SPMD:
each function evaluation is one packed allreduce ``[loss | gradient]`` and each
Hessian-vector product one allreduce, exactly as Newton-CG does; every decision is taken
from reduced numbers that are bit-identical on every rank, so the ranks stay in lockstep
and the iterates are LIBLINEAR's up to the rounding of the sums (independent of the rank
count to that rounding).

**Dual** (``dual=True``): the coordinate descent of Yu, Huang and Lin ("Dual coordinate
descent methods for logistic regression and maximum entropy models", Machine Learning
2011, Algorithm 5): the dual variables ``0 < α_i < C_i`` start at ``min(10⁻³ C_i, 10⁻⁸)``,
each epoch visits every row once in a fresh random order (``random_state``), each visit
minimises the one-variable subproblem by a safeguarded Newton method (at most 100 steps,
to a tolerance that starts at 10⁻² and shrinks tenfold, down to ``min(10⁻⁸, tol)``, after
an epoch that needed few Newton steps), and the solver stops when the largest subproblem
gradient of an epoch is below ``tol``, or after ``max_iter`` epochs.  The visits are
sequential over rows (each one changes ``w``, which the next one reads), so no rank can
run its rows without the others' updates; the rows are gathered on rank 0 (one
``gatherv``), which runs the epochs and broadcasts ``w``.  The order is a permutation of the
*global* row indices, so the result depends on ``random_state`` and not on the rank count.
Gathering is bounded by :data:`DUAL_GATHER_BYTES`; beyond it the primal method solves the
same problem (with a warning: ``random_state`` then has no effect).  The dual exists for
data with fewer rows than features, where the gather is small.
"""

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from ..utils._linalg import is_sparse
from ._base import allreduce_identical, as_like

__all__ = ["DUAL_GATHER_BYTES", "tolerance_scale", "tron", "dual_coordinate_descent", "warn_if_not_converged"]

#: The most bytes of rows (CSR: 12 per stored value, 32 per row) gathered on rank 0 for ``dual=True``.
DUAL_GATHER_BYTES = 1 << 30

# the trust-region rules (LIBLINEAR's TRON): acceptance and region-update thresholds
_ETA0, _ETA1, _ETA2 = 1e-4, 0.25, 0.75
_SIGMA1, _SIGMA2, _SIGMA3 = 0.25, 0.5, 4.0


def warn_if_not_converged(n_iter, max_iter):
    """scikit-learn's warning after a LIBLINEAR fit that used its whole budget."""
    if n_iter >= max_iter:
        warnings.warn("Liblinear failed to converge, increase the number of iterations.", ConvergenceWarning,
                      stacklevel=3)


def tolerance_scale(positive_rows, n_rows):
    """LIBLINEAR's factor on ``tol`` for its primal solvers: ``max(min(#pos, #neg), 1) / #rows``."""
    if n_rows <= 0:
        return 1.0
    return max(min(positive_rows, n_rows - positive_rows), 1.0) / n_rows


def _truncated_cg(hessp, g, delta, max_steps):
    """CG on ``H s = -g`` inside ``||s|| ≤ delta``; returns ``(s, r, steps)`` with ``r = -g - H s``.

    Stops at a residual of ``0.1 ||g||``, or on the boundary: the last direction is then
    followed to where it leaves the region (the positive root of ``||s + τ d|| = delta``).
    """
    s = np.zeros_like(g)
    r = -g
    d = r.copy()
    rr = float(r @ r)
    target = 0.1 * np.sqrt(float(g @ g))
    steps = 0
    while np.sqrt(rr) > target and steps < max_steps:
        steps += 1
        Hd = hessp(d)
        curvature = float(d @ Hd)
        if not curvature > 0:  # (a positive-definite Hessian never gets here; keep the step so far)
            break
        a = rr / curvature
        s_next = s + a * d
        if np.sqrt(float(s_next @ s_next)) > delta:
            sd, ss, dd = float(s @ d), float(s @ s), float(d @ d)
            room = delta * delta - ss
            root = np.sqrt(sd * sd + dd * room)
            tau = room / (sd + root) if sd >= 0 else (root - sd) / dd
            s = s + tau * d
            r = r - tau * Hd
            break
        s = s_next
        r = r - a * Hd
        rr_next = float(r @ r)
        d = r + (rr_next / rr) * d
        rr = rr_next
    return s, r, steps


def tron(obj, *, eps, max_iter, verbose=0):
    """Trust-region Newton from zero on LIBLINEAR's objective (``obj`` scaled by ``1 / obj.l2``).

    Returns ``(w, n_iter)``, ``n_iter`` the number of accepted steps (LIBLINEAR's count).
    """
    scale = 1.0 / obj.l2
    n = obj.n_params
    w = np.zeros(n)

    def evaluate(point):
        f, g = obj.evaluate(point)
        return scale * f, scale * g

    f, g = evaluate(w)
    stash = obj._stash  # the probabilities at w, which the Hessian-vector products read
    gnorm0 = np.sqrt(float(g @ g))
    delta = gnorm0
    it = 1
    search = gnorm0 > eps * gnorm0
    while it <= max_iter and search:
        s, r, cg_steps = _truncated_cg(lambda v: scale * obj.hessp(w, v), g, delta, max_steps=max(50, 2 * n))
        w_new = w + s
        gs = float(g @ s)
        predicted = -0.5 * (gs - float(s @ r))
        f_new, g_new = evaluate(w_new)
        actual = f - f_new
        snorm = np.sqrt(float(s @ s))
        if it == 1:
            delta = min(delta, snorm)
        # the step bound from the minimiser of the quadratic interpolating f along s
        curv = f_new - f - gs
        alpha = _SIGMA3 if curv <= 0 else max(_SIGMA1, -0.5 * (gs / curv))
        if actual < _ETA0 * predicted:
            delta = min(max(alpha, _SIGMA1) * snorm, _SIGMA2 * delta)
        elif actual < _ETA1 * predicted:
            delta = max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA2 * delta))
        elif actual < _ETA2 * predicted:
            delta = max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA3 * delta))
        else:
            delta = max(delta, min(alpha * snorm, _SIGMA3 * delta))
        if verbose and obj.comm.rank == 0:
            print(f"iter {it:2d} act {actual:5.3e} pre {predicted:5.3e} delta {delta:5.3e} f {f:5.3e} "
                  f"|g| {np.sqrt(float(g @ g)):5.3e} CG {cg_steps:3d}", flush=True)
        if actual > _ETA0 * predicted:
            it += 1
            w, f, g = w_new, f_new, g_new
            stash = obj._stash
            if np.sqrt(float(g @ g)) <= eps * gnorm0:
                break
        else:
            obj._stash = stash  # rejected: the next products are again at w
        if f < -1.0e32:
            break
        if abs(actual) <= 0 and predicted <= 0:
            break
        if abs(actual) <= 1.0e-12 * abs(f) and abs(predicted) <= 1.0e-12 * abs(f):
            break
    return w, it - 1


def _solve_dual(indptr, indices, data, n_features, bias, y, C, *, eps, max_iter, random_state, verbose):
    """The dual coordinate descent on gathered host rows (CSR, float64); returns ``(w, epochs)``."""
    from ._liblinear_cpu import dual_epoch as epoch  # (compiled at first use, cached on disk)

    rows = y.shape[0]
    w = np.zeros(n_features + (1 if bias > 0 else 0))
    alpha = np.empty(2 * rows)
    alpha[0::2] = np.minimum(1e-3 * C, 1e-8)
    alpha[1::2] = C - alpha[0::2]
    row_of = np.repeat(np.arange(rows), np.diff(indptr))
    xtx = np.bincount(row_of, weights=data * data, minlength=rows) + (bias * bias if bias > 0 else 0.0)
    start = alpha[0::2] * y  # w = Σ y_i α_i x_i
    w[:n_features] = np.bincount(indices, weights=start[row_of] * data, minlength=n_features)
    if bias > 0:
        w[-1] = float(start.sum()) * bias
    rng = check_random_state(random_state)
    inner_tol, inner_floor = 1e-2, min(1e-8, eps)
    it = 0
    while it < max_iter:
        order = rng.permutation(rows).astype(np.int64)
        gmax, newton_steps = epoch(indptr, indices, data, float(bias), y, C, xtx, alpha, w, order, inner_tol)
        it += 1
        if verbose:
            print(f"epoch {it}: max |subproblem gradient| {gmax:.3e}", flush=True)
        if gmax < eps:
            break
        if newton_steps <= rows // 10:
            inner_tol = max(inner_floor, 0.1 * inner_tol)
    return w, it


def _host_csr(X, keep):
    """This rank's kept rows as host CSR parts ``(row lengths, column indices, values)``: int64, int64, float64."""
    import scipy.sparse as sp

    if is_sparse(X):
        M = X.get() if hasattr(X, "get") else X
        M = sp.csr_matrix(M)[keep]
    else:
        M = sp.csr_matrix(as_like(X, np)[keep])  # (zeros are not stored, as LIBLINEAR stores rows)
    M.sum_duplicates()
    return np.diff(M.indptr).astype(np.int64), M.indices.astype(np.int64), M.data.astype(np.float64)


def dual_coordinate_descent(obj, C_rows, *, eps, max_iter, random_state, verbose=0):
    """LIBLINEAR's dual solver for L2-penalised logistic regression, the rows gathered on rank 0.

    ``C_rows``: this rank's ``C_i`` (host float64; rows with ``C_i <= 0`` take no part).
    Returns ``(w, n_iter)`` on every rank (the same bits), or None when the gathered rows
    would exceed :data:`DUAL_GATHER_BYTES` (the same decision on every rank).
    """
    comm = obj.comm
    keep = C_rows > 0
    y = np.where(as_like(obj.y01, np).astype(np.float64)[keep] > 0, 1.0, -1.0)
    lengths, indices, data = _host_csr(obj.X, keep)
    total = allreduce_identical(comm, np.array([12.0 * data.size + 32.0 * lengths.size]))[0]
    if total > DUAL_GATHER_BYTES:
        return None
    bias = obj.scale if obj.fi else -1.0
    parts = [lengths, indices, data, y, C_rows[keep]]
    if comm.size > 1:
        parts = [comm.gatherv(p, root=0) for p in parts]
    result = np.zeros(obj.n_params + 1)
    if comm.rank == 0:
        lengths, indices, data, y, C = parts
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        w, it = _solve_dual(indptr, indices, data, obj.d, bias, y, C, eps=eps, max_iter=max_iter,
                            random_state=random_state, verbose=verbose)
        result[:-1], result[-1] = w, it
    if comm.size > 1:
        result = comm.bcast(result, root=0)
    return result[:-1], int(result[-1])
