"""The replicated ``d x d`` algebra of the direct least-squares solvers in one compiled call (GPU ranks).

After the Gram allreduce of a dense fit every rank holds the same ``k x k`` matrix ``ZᵀWZ``
(``Z = [X | Y | 1]``).  The NumPy path (:class:`._lsq_direct.NormalEquations`,
:class:`._lsq_solvers.ScaledCholesky`, the solve and the intercept) makes some fifty small NumPy and
f2py-LAPACK calls on it, 5-10 us each on a GPU host: ~0.5 ms of the ~2.5 ms a 4-GPU fit takes, a
fixed cost that does not shrink with the rows.  :func:`direct_normal` does the same arithmetic in
one compiled call (~20 us): the finiteness check, the centring, the cancellation ``c``, the
scaling to unit diagonal, the Cholesky factor and LAPACK's condition estimate of ``G + αI``,
``solver="auto"``'s rule, the solve and the intercept.

Bits: the element-wise steps are the NumPy path's operations in its order (IEEE float64, no fast
math), and the factorisation, the estimate and the solve call the very LAPACK routines
(``dpotrf``, ``dpocon``, ``dpotrs`` of SciPy's LAPACK, through ``scipy.linalg.cython_lapack``) on the
same column-major matrices, so the route, ``κ``, the means and the coefficients are those of the NumPy
path (tested bit for bit); the caller forms the intercept ``ȳ - C x̄`` from them as the NumPy path does.

It serves the common case only: the normal equations chosen and their Cholesky factor far from
singular (the condition the NumPy path uses for its own shortcut).  Anything else (TSQR, the
centred second pass, a rank-deficient or singular system, several penalties) returns
:data:`FALLBACK` and the NumPy path runs from the start, as before.  Every rank holds the same
``Z`` and runs the same code, so every rank takes the same way.

The LAPACK entry points are registered with LLVM by name at import (``mpiml_dpotrf``, ...), so
the compiled function is cached on disk like the other kernels (a ctypes pointer would not be).
"""

import numpy as np

from ..utils._jit import numba

__all__ = ["direct_normal", "warm", "FALLBACK", "NONFINITE", "NORMAL"]

nb = numba()

#: Routes returned by :func:`direct_normal`.
NORMAL, FALLBACK, NONFINITE = 0, 1, 2


def _register_lapack():
    import llvmlite.binding as llvm
    from numba.extending import get_cython_function_address

    for name in ("dpotrf", "dpocon", "dpotrs"):
        llvm.add_symbol("mpiml_" + name, get_cython_function_address("scipy.linalg.cython_lapack", name))


_register_lapack()

_p = nb.types.voidptr
# scipy.linalg.cython_lapack: every argument by pointer (Fortran), ``int`` 32-bit
_DPOTRF = nb.types.ExternalFunction("mpiml_dpotrf", nb.types.void(_p, _p, _p, _p, _p))
_DPOCON = nb.types.ExternalFunction("mpiml_dpocon", nb.types.void(_p, _p, _p, _p, _p, _p, _p, _p, _p))
_DPOTRS = nb.types.ExternalFunction("mpiml_dpotrs", nb.types.void(_p, _p, _p, _p, _p, _p, _p, _p))

_EPS64 = float(np.finfo(np.float64).eps)
_MAX64 = float(np.finfo(np.float64).max)
_RTOL_FLOOR = 1e-10        # _lsq_direct.NORMAL_RTOL_FLOOR
_ESTIMATE_MARGIN = 1e3     # _lsq_solvers._ESTIMATE_MARGIN


@nb.njit(cache=True, nogil=True)
def _direct_normal(Z, d, fit_intercept, auto, alpha, u, threshold):
    """See :func:`direct_normal`; ``auto``: solver "auto" (else an explicit "normal")."""
    k = Z.shape[0]
    t = k - d - 1
    G = np.empty((d, d))
    coef = np.empty((t, d))
    means = np.zeros(d + t)     # [x̄ | ȳ] (zero without an intercept)
    nan = np.nan
    finite = True     # (a flag folded over every value: the loop vectorises, where a branch per value would not)
    for i in range(k):
        row = Z[i]
        for j in range(k):
            finite &= abs(row[j]) <= _MAX64
    if not finite:
        return NONFINITE, nan, coef, means, G
    if d == 0:
        return FALLBACK, nan, coef, means, G
    sw_sum = Z[k - 1, k - 1]
    # NormalEquations: [G | B] = Z[:d, :d+t] - s sᵀ / n, G symmetrised as (G + Gᵀ) / 2; each product s_i s_j
    # (the same bits either way round) divided once for G[i, j] and G[j, i]
    B = np.empty((d, t))
    c = 0.0
    if fit_intercept:
        n = sw_sum if sw_sum != 0 else 1.0
        for i in range(d + t):
            means[i] = Z[i, k - 1] / n
        for i in range(d):
            si = Z[i, k - 1]
            for j in range(i, d):
                q = (si * Z[j, k - 1]) / n
                g = ((Z[i, j] - q) + (Z[j, i] - q)) / 2
                G[i, j] = g
                G[j, i] = g
            for j in range(t):
                B[i, j] = Z[i, d + j] - (si * Z[d + j, k - 1]) / n
        # cancellation: max(raw_diag / diag) - 1 over the columns (inf where diag <= 0), at least 0
        top = 1.0
        for i in range(d):
            gi = G[i, i]
            r = Z[i, i] / gi if gi > 0 else np.inf
            if r > top or r != r:
                top = r
        c = top - 1.0
        if not c > 0.0:     # (max(c, 0.0) of Python floats: a NaN c stays NaN)
            c = 0.0 if c == c else c
    else:
        for i in range(d):
            for j in range(d):
                G[i, j] = Z[i, j]
            for j in range(t):
                B[i, j] = Z[i, d + j]
    for i in range(d):
        row = G[i]
        for j in range(d):
            finite &= abs(row[j]) <= _MAX64
    if not finite:
        return FALLBACK, nan, coef, means, G   # the centring overflowed
    # ScaledCholesky of A = G + alpha I: S = D A D (D = diag(A)^-1/2), column-major for LAPACK
    root = np.empty(d)
    for i in range(d):
        a = G[i, i] + alpha if alpha != 0.0 else G[i, i]
        if not a > 0:
            return FALLBACK, nan, coef, means, G
        root[i] = 1.0 / np.sqrt(a)
    F = np.empty((d, d))     # F[j, i] = S[i, j]: S in column-major order
    colsum = np.zeros(d)     # Σ_i |S[i, j]| in row order (NumPy's column sums), the rows taken in turn
    dmax = -np.inf
    dmin = np.inf
    for i in range(d):
        ri = root[i]
        a = G[i, i] + alpha if alpha != 0.0 else G[i, i]
        dmax = max(dmax, a)
        dmin = min(dmin, a)
        row = G[i]
        for j in range(i):
            v = (row[j] * ri) * root[j]
            F[j, i] = v
            colsum[j] += abs(v)
        v = (a * ri) * ri         # the diagonal of A = G + alpha I
        F[i, i] = v
        colsum[i] += v
        for j in range(i + 1, d):
            v = (row[j] * ri) * root[j]
            F[j, i] = v
            colsum[j] += abs(v)
    anorm = colsum.max()
    uplo = np.empty(1, np.uint8)
    uplo[0] = 85   # 'U'
    ni = np.empty(1, np.int32)
    ni[0] = d
    info = np.zeros(1, np.int32)
    _DPOTRF(uplo.ctypes, ni.ctypes, F.ctypes, ni.ctypes, info.ctypes)
    if info[0] != 0:
        return FALLBACK, nan, coef, means, G
    an = np.empty(1)
    an[0] = anorm
    rc = np.zeros(1)
    work = np.empty(3 * d)
    iwork = np.empty(d, np.int32)
    _DPOCON(uplo.ctypes, ni.ctypes, F.ctypes, ni.ctypes, an.ctypes, rc.ctypes, work.ctypes, iwork.ctypes,
            info.ctypes)
    rcond = rc[0]
    if info[0] != 0 or not rcond > 0:
        return FALLBACK, nan, coef, means, G
    kappa = 1.0 / rcond
    bound = kappa * _ESTIMATE_MARGIN * (dmax / dmin)
    if not np.isfinite(kappa):
        return FALLBACK, nan, coef, means, G
    err = kappa * _EPS64 * (d + c)
    if auto:
        tol = max(np.sqrt(kappa) * u, _RTOL_FLOOR)
        if not err <= tol:
            return FALLBACK, kappa, coef, means, G    # the centred pass or TSQR
    elif fit_intercept and c > d and err > _RTOL_FLOOR:
        return FALLBACK, kappa, coef, means, G        # the centred pass
    if not bound * threshold < 1.0:
        return FALLBACK, kappa, coef, means, G        # near singular: the eigenvalues decide
    # the solve: dpotrs on D B, then D x (ScaledCholesky.solve)
    Xf = np.empty((t, d))    # column-major (d, t)
    for i in range(d):
        for j in range(t):
            Xf[j, i] = B[i, j] * root[i]
    nr = np.empty(1, np.int32)
    nr[0] = t
    _DPOTRS(uplo.ctypes, ni.ctypes, nr.ctypes, F.ctypes, ni.ctypes, Xf.ctypes, ni.ctypes, info.ctypes)
    if info[0] != 0:
        return FALLBACK, kappa, coef, means, G
    for j in range(t):
        for i in range(d):
            v = Xf[j, i] * root[i]
            if not np.isfinite(v):
                return FALLBACK, kappa, coef, means, G
            coef[j, i] = v
    return NORMAL, kappa, coef, means, G


def direct_normal(Z, d, fit_intercept, auto, alpha, u, threshold):
    """The normal-equations fit from the reduced ``Z = ZᵀWZ`` in one compiled call, when it is the common case.

    ``auto``: ``solver="auto"`` (else an explicit ``"normal"``); ``alpha``: the penalty of the
    factorised ``G + αI``; ``u``: the unit roundoff of the data's dtype; ``threshold``: the solve
    happens when ``bound · threshold < 1`` (``bound`` the factor's upper bound of the 2-norm condition
    number; ``max(tol², 100 ε)`` for LinearRegression, ``100 d ε`` for Ridge, the NumPy path's rules).
    Returns ``(route, kappa, coef (t, d), means (d + t,), G (d, d))``, ``means`` ``[x̄ | ȳ]`` (zero without
    an intercept): ``route`` :data:`NORMAL` (the
    fit is done), :data:`NONFINITE` (``Z`` holds NaN or infinity) or :data:`FALLBACK` (run the NumPy
    path; ``coef`` and the rest are then meaningless).
    """
    return _direct_normal(Z, d, fit_intercept, auto, alpha, u, threshold)


def warm():
    """Load (or compile) :func:`direct_normal` for the argument types the fits pass, on a small matrix."""
    Z = np.eye(4)
    Z[3, 3] = 10.0
    direct_normal(Z, 2, True, True, 0.0, 2.0 ** -24, 1e-12)
