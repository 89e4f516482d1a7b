"""Direct least squares on dense shards: one pass over ``X``, then normal equations or TSQR.

One pass over the shard forms the float64 Gram matrix of the augmented matrix
``Z = [X | Y | 1]`` (rows weighted): ``ZᵀWZ`` holds ``XᵀWX``, ``XᵀWY``, the
weighted column sums of ``X`` and ``Y`` and the weight total, so **one**
allreduce of ``k²`` float64 values (``k = d + t + 1``) carries everything the
normal equations need, the means included.  On a GPU a kernel
(:mod:`mpiml.kernels.linear`) reads float32 or float64 ``X`` once and forms
every product and sum in float64 (a product of two float32 values is exact in
float64); on the host, float64 row blocks go through BLAS.

The centred system follows in float64: ``G = XᵀWX - s sᵀ / Σw`` (``s`` the
column sums).  Its accuracy is judged from the same matrix, before solving:

* ``κ``: the condition number of ``G`` scaled to unit diagonal (the normal
  equations are invariant to column scaling), LAPACK's estimate from its
  Cholesky factor (with ``alpha I`` added for ridge);
* ``δ = ε₆₄ (d + c)``: the relative error of ``G``, from the float64
  rounding of its ``d``-term row products and the cancellation of the
  centring, ``c = max_j (XᵀWX)_jj / G_jj - 1`` (the squared ratio of a
  column's mean to its standard deviation);
* the normal equations' relative error in the coefficients is about ``κ δ``.

``solver="auto"`` takes the normal equations when ``κ δ <= max(√κ u, 1e-10)``,
``u`` the unit roundoff of the data's dtype: no worse than a backward-stable
solver working in that dtype (``√κ u``, what scikit-learn's ``lstsq`` reaches
on float32 data), and never worse than ``1e-10`` relative on float64 data.
When only the cancellation is to blame (``κ ε₆₄ d`` passes), a second pass
forms the Gram of the exactly centred rows; otherwise TSQR runs (its error is
about ``√κ ε₆₄``).  Every rank holds the same reduced matrix, so every rank
makes the same choice.
"""

import contextlib
import math
import os
import threading

import numpy as np

from .._array import is_device_array
from ..utils._linalg import augmented_gram as local_augmented_gram
from ..utils._linalg import is_sparse
from ._base import allreduce_identical, allreduce_identical_device, as_like, pinned_buffer

__all__ = ["augmented_gram", "NormalEquations", "NORMAL_RTOL_FLOOR", "early_local_gram", "Shortcut",
           "wait_compiled_algebra"]

#: "auto" accepts the normal equations on float64 data while their estimated
#: relative error in the coefficients stays below this.
NORMAL_RTOL_FLOOR = 1e-10

_EPS64 = np.finfo(np.float64).eps
_UNIT_ROUNDOFF = {}   # dtype -> eps / 2


def augmented_gram(X, Y, sw, *, comm, xp, local=None):
    """Global ``ZᵀWZ`` with ``Z = [X | Y | 1]``: host float64 ``(k, k)``, one allreduce, the same bits everywhere.

    ``X`` is a dense shard, ``Y`` its 2-D targets, ``sw`` the row weights or
    None; ``local``, this rank's ``ZᵀWZ`` when it was launched already
    (:func:`early_local_gram`).  Non-finite values anywhere in the inputs make
    the result non-finite.  A device Gram matrix is summed on the device where
    the communicator can (:func:`allreduce_identical_device`).
    """
    if local is None:
        if (xp is np and X.shape[1] + Y.shape[1] + 1 <= _HOST_KERNEL_COLUMNS
                and X.shape[0] * X.shape[1] >= _HOST_KERNEL_MIN_VALUES):
            from ._cpu_kernels import augmented_gram as host_gram   # (Numba: imported at the first host fit)

            local = host_gram(X, Y, sw)   # one compiled pass over the rows on this rank's threads
        else:
            local = local_augmented_gram(X, Y, sw)
    k = local.shape[0]
    if is_device_array(local):   # (through a pinned buffer: one asynchronous copy instead of CuPy's pageable one)
        return allreduce_identical_device(comm, local.ravel(), host=_pinned(k * k)).reshape(k, k)
    return allreduce_identical(comm, as_like(local, np).ravel()).reshape(k, k)


_PINNED = threading.local()   # per thread: {size: pinned float64 buffer}


def _pinned(size):
    """A pinned float64 host buffer of ``size`` values for a reduced Gram matrix, made once per thread and size."""
    bufs = getattr(_PINNED, "bufs", None)
    if bufs is None:
        bufs = _PINNED.bufs = {}
    return pinned_buffer(bufs, size)


class EarlyGram:
    """This rank's Gram matrix launched before the input checks are agreed (see :func:`early_local_gram`)."""

    def __init__(self, X, y, local):
        self.X, self.y, self.local = X, y, local

    def take(self, X, y, sw):
        """The launched matrix when the validated ``X``, ``y`` are the arrays it read (and no weights), else None."""
        return self.local if X is self.X and y is self.y and sw is None else None


def early_local_gram(X, y, sample_weight):
    """Launch this rank's Gram kernel on a plain dense CuPy shard before validation; an :class:`EarlyGram` or None.

    Validation agrees on every rank's input (a host round between ranks, about
    a millisecond at 4 ranks); the kernel does not depend on it, so it runs
    meanwhile.  Taken only for what validation leaves as it is (a C-contiguous
    float32/float64 CuPy ``X``, a CuPy ``y`` of its dtype with one row per row
    of ``X``, no sample weights); the fit uses the result only when the
    validated arrays are these very arrays, and discards it when validation
    raises.  Nothing is communicated.
    """
    if sample_weight is not None or not is_device_array(X) or not is_device_array(y):
        return None
    from ..kernels import linear as kernels

    if not kernels.supported(X) or not X.flags.c_contiguous or X.shape[0] == 0 or X.shape[1] == 0:
        return None
    if y.dtype != X.dtype or y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
        return None
    if X.shape[1] + (y.shape[1] if y.ndim == 2 else 1) + 1 > kernels.GRAM_MAX_COLUMNS:
        return None
    return EarlyGram(X, y, kernels.augmented_gram(X, y))   # (a 1-d y is read as its one column)


class NormalEquations:
    """The centred normal equations read off a global augmented Gram matrix, and their accuracy.

    Attributes: ``G`` (d, d) and ``B`` (d, t) of the centred (or, without an
    intercept, raw) weighted data, ``x_mean``, ``y_mean`` (None without an
    intercept), ``sw_sum``, ``cancellation`` (``c`` of the module notes) and
    ``raw_diag`` (the diagonal of ``XᵀWX``).
    """

    def __init__(self, Z, d, fit_intercept):
        t = Z.shape[0] - d - 1
        self.d, self.t = d, t
        self.sw_sum = float(Z[-1, -1])
        self.raw_diag = Z.diagonal()[:d]     # (a read-only view of Z)
        if fit_intercept:
            # [G | B] of the centred data from one outer product of the sums [sx | sy] (the same values as
            # two products, in fewer small operations: this runs on the fit's path after the Gram)
            s = Z[:d + t, -1]
            n = self.sw_sum if self.sw_sum != 0 else 1.0
            means = s / n
            self.x_mean, self.y_mean = means[:d], means[d:]
            # (in place where the values allow: each d x d temporary is a fresh allocation on the fit's path)
            C = s[:d, None] * s      # (np.outer's product, without its reshapes)
            C /= n
            np.subtract(Z[:d, :d + t], C, out=C)
            G = C[:, :d]
            Gs = G + G.T
            Gs /= 2
            self.G = Gs
            self.B = C[:, d:]
        else:
            self.x_mean = self.y_mean = None
            self.G, self.B = Z[:d, :d].copy(), Z[:d, d:d + t].copy()
        self.cancellation = 0.0
        if fit_intercept:
            # (a masked division: no np.errstate, whose context costs more than this arithmetic on the fit's path)
            diag = self.G.diagonal()
            ratio = np.divide(self.raw_diag, diag, out=np.full(d, np.inf), where=diag > 0)
            self.cancellation = max(float(ratio.max(initial=1.0)) - 1.0, 0.0)
        self._factors = {}

    def factor(self, alpha=0.0):
        """The :class:`~._lsq_solvers.ScaledCholesky` of ``G + alpha I``, made once per ``alpha``.

        It serves the condition estimate (:meth:`condition`) and then the
        solve itself: one factorisation of the ``d x d`` matrix per fit.
        """
        from ._lsq_solvers import ScaledCholesky

        key = float(alpha)
        found = self._factors.get(key)
        if found is None:
            if key:   # G + alpha I (the diagonal added in place of a copy: no identity matrix formed)
                A = self.G.copy()
                A.flat[::self.d + 1] += key
            else:
                A = self.G
            found = self._factors[key] = ScaledCholesky(A)
        return found

    def condition(self, alpha=0.0):
        """Condition number of ``G + alpha I`` scaled to unit diagonal (inf when not positive definite).

        LAPACK's estimate from the Cholesky factor (``dpotrf`` + ``dpocon``,
        ``O(d²)`` after the factorisation): the 1-norm condition number, within
        a factor ``d`` of the 2-norm one and usually within 3 of its own true
        value; far cheaper than an eigendecomposition of the ``d x d`` matrix.
        """
        if self.d == 0:
            return 1.0
        return self.factor(alpha).kappa

    def error_estimate(self, kappa, centred_pass=False):
        """Relative error of the normal equations' coefficients, about ``κ δ``."""
        c = 0.0 if centred_pass else self.cancellation
        return kappa * _EPS64 * (self.d + c)

    @staticmethod
    def tolerance(kappa, dtype):
        """The error a backward-stable solver in ``dtype`` would make (``√κ u``), at least ``1e-10``."""
        # (math: the same correctly rounded root)
        return max(math.sqrt(kappa) * _unit_roundoff(dtype), NORMAL_RTOL_FLOOR)

    def choose(self, dtype, alpha=0.0, fit_intercept=True):
        """``"normal"``, ``"centred"`` (a second, exactly centred Gram pass) or ``"tsqr"`` (see the module notes)."""
        kappa = self.condition(alpha)
        if not np.isfinite(kappa):
            return "tsqr", kappa
        tol = self.tolerance(kappa, dtype)
        if self.error_estimate(kappa) <= tol:
            return "normal", kappa
        if fit_intercept and self.error_estimate(kappa, centred_pass=True) <= tol:
            return "centred", kappa
        return "tsqr", kappa

    def needs_centred_pass(self, alpha=0.0):
        """For an explicit ``"normal"`` solver: whether the centring cancellation dominates the error."""
        if self.cancellation <= self.d:
            return False
        kappa = self.condition(alpha)
        return not np.isfinite(kappa) or self.error_estimate(kappa) > NORMAL_RTOL_FLOOR


class Shortcut:
    """How an estimator's normal-equations solve reads in the compiled common case (:mod:`._small_jit`).

    ``threshold``: the factor's condition bound times it must stay below 1 for the Cholesky solve
    to stand (the estimator's own rule: ``max(tol², 100 ε)`` for LinearRegression, ``100 d ε`` for
    Ridge); ``extra(G)``: the ``extra`` its ``solve_gram`` returns for a full-rank solve from the
    centred Gram matrix ``G``.
    """

    __slots__ = ("threshold", "extra")

    def __init__(self, threshold, extra):
        self.threshold, self.extra = float(threshold), extra


#: Device rows take the compiled shortcut (:func:`_compiled`); ``MPIML_LINEAR_COMPILED_ALGEBRA=0`` (an A/B
#: switch, read at import) keeps them on the NumPy path.
_COMPILED_ON_DEVICE = os.environ.get("MPIML_LINEAR_COMPILED_ALGEBRA", "1") != "0"
#: Host rows take it too (tests: the NumPy path's fits through it, the same bits); off, so that a process
#: fitting host shards never loads Numba for it.
_COMPILED_ON_HOST = False


def _unit_roundoff(dtype):
    u = _UNIT_ROUNDOFF.get(dtype)
    if u is None:
        u = _UNIT_ROUNDOFF[np.dtype(dtype)] = float(np.finfo(np.dtype(dtype)).eps / 2)
    return u


_JIT = []                 # the compiled module once loaded (None if it could not be), appended by the loader
_JIT_LOADER = []          # the loader thread, once started
_JIT_LOCK = threading.Lock()


def _compiled_module():
    """:mod:`._small_jit` once loaded, else None: the first call starts loading it (Numba's import and the
    function's load or compile, ~0.5-3 s) in a daemon thread, so that no fit waits for it; fits take the
    NumPy algebra until it is ready (the same bits, see :func:`_compiled`)."""
    if _JIT:
        return _JIT[0]
    if not _JIT_LOADER:
        with _JIT_LOCK:
            if not _JIT_LOADER:
                thread = threading.Thread(target=_load_compiled, name="mpiml-linear-algebra-jit", daemon=True)
                _JIT_LOADER.append(thread)
                thread.start()
    return None


def _load_compiled():
    try:
        from . import _small_jit as jit

        jit.warm()
    except Exception:   # noqa: BLE001 - no Numba (or it failed): the NumPy algebra serves every fit
        jit = None
    _JIT.append(jit)


def wait_compiled_algebra(timeout=None):
    """Start loading the compiled algebra if needed and wait for it (``timeout`` seconds at most).

    For benchmarks of the steady state (a fit never waits for it). True when it is ready.
    """
    if not _JIT:
        _compiled_module()
        _JIT_LOADER[0].join(timeout)
    return bool(_JIT) and _JIT[0] is not None


def _intercept(coef, x_mean, y_mean):
    """``ȳ - C x̄`` for ``coef`` (t, d) C-ordered: both algebra paths form it here, so that a rank taking either
    path gets the same bits (the product's summation order depends on the layout)."""
    return y_mean - coef @ x_mean


def _compiled(Z, d, fit_intercept, solver, alpha, dtype, shortcut):
    """:func:`solve_direct`'s result from the reduced ``Z`` by one compiled call, or None (the NumPy path runs).

    Device rows only, up to :data:`SMALL_ALGEBRA_FEATURES` (inside the one-BLAS-thread context), once the
    compiled function is loaded (:func:`_compiled_module`; until then the NumPy path).  The route, ``κ``,
    ``G``, the means and ``coef_`` are the NumPy path's bits (see :mod:`._small_jit`) and the intercept is
    formed the same way, so ranks that take different paths (one loaded it sooner) agree bit for bit.
    """
    if d > SMALL_ALGEBRA_FEATURES:
        return None
    jit = _compiled_module()
    if jit is None:
        return None
    route, kappa, coef, means, G = jit.direct_normal(Z, d, bool(fit_intercept), solver == "auto", float(alpha),
                                                     _unit_roundoff(dtype), shortcut.threshold)
    if route != jit.NORMAL:
        return None
    t = coef.shape[0]
    intercept = _intercept(coef, means[:d], means[d:]) if fit_intercept else np.zeros(t)
    return (coef, intercept, shortcut.extra(G), "normal",
            {"condition": kappa if solver == "auto" else None, "route": "normal"})


#: Up to this many features the replicated ``d x d`` algebra runs on one BLAS thread: waking the rank's
#: pool for a 64 x 64 factorisation costs more than the factorisation.
SMALL_ALGEBRA_FEATURES = 256


#: Host rows take the compiled Gram (:mod:`._cpu_kernels`) with up to this many columns ``d + t + 1`` (more go
#: through BLAS on the rank's pool, :func:`mpiml.utils._linalg.augmented_gram`, as fast there) and from this
#: many values ``n d`` on (below, the NumPy path costs well under a millisecond, and a process that only fits
#: small shards, as most tests do, never loads Numba: ~0.5 s a process).
_HOST_KERNEL_COLUMNS = 256
_HOST_KERNEL_MIN_VALUES = 1 << 16


def _small_algebra(d):
    """One BLAS thread for the small replicated solves (see :data:`SMALL_ALGEBRA_FEATURES`)."""
    if d > SMALL_ALGEBRA_FEATURES:
        return contextlib.nullcontext()
    from ..utils._threads import one_blas_thread

    return one_blas_thread()


def dense_direct_applies(X, positive):
    """Whether the one-pass direct path applies: a dense shard (host or device) and no sign constraint."""
    return not positive and not is_sparse(X) and (isinstance(X, np.ndarray) or is_device_array(X))


def solve_direct(X, y, sw, *, fit_intercept, comm, xp, solver, solve_gram, solve_r, on_nonfinite, alpha=0.0,
                 early=None, shortcut=None):
    """One-pass normal equations or TSQR on a dense shard; ``(coef (t, d), intercept (t,), extra, used, info)``.

    ``solver``: ``"auto"`` (see the module notes), ``"normal"`` (the normal
    equations; a second, exactly centred pass when the centring cancellation
    dominates their error) or ``"tsqr"``.  ``solve_gram(G, B[, factor])`` and
    ``solve_r(R, Z)`` return ``(coef (d, t), extra)`` as for
    :func:`._lsq_solvers.solve_least_squares`; ``factor``, when passed, is the
    :class:`~._lsq_solvers.ScaledCholesky` of ``G + alpha I``.  ``early``: an :class:`EarlyGram`
    launched before validation (used when it read these arrays).  ``shortcut``: a :class:`Shortcut`
    when ``solve_gram``'s full-rank Cholesky solve may run compiled on device rows (the whole
    replicated algebra in one call, the NumPy path's bits; anything else falls back to the NumPy
    path below).  ``on_nonfinite()`` is called on
    every rank when the reduced Gram matrix is not finite: it raises the input
    error, or returns when the inputs are finite (float64 overflow of the
    squares), and TSQR then runs.  ``used`` is ``"normal"`` or ``"tsqr"``;
    ``info`` holds the condition estimate and the route taken.

    Communicated: one allreduce of ``k²`` float64 (``k = d + t + 1``), plus,
    on the centred route, one of ``d² + d t``, or, on the TSQR route, one
    allgather of a ``(d + t)²`` factor per rank.
    """
    from ._lsq_solvers import as_2d_targets

    Y = as_2d_targets(y)
    d = X.shape[1]
    if xp is not np and d <= SMALL_ALGEBRA_FEATURES:
        # rows on the device: the host's BLAS work of the fit is the small algebra alone, so its one-thread
        # context is entered once, while the Gram kernel runs (the host waits for it next), not after
        with _small_algebra(d):
            return _solve_direct(X, y, Y, sw, fit_intercept=fit_intercept, comm=comm, xp=xp, solver=solver,
                                 solve_gram=solve_gram, solve_r=solve_r, on_nonfinite=on_nonfinite, alpha=alpha,
                                 early=early, small=contextlib.nullcontext, shortcut=shortcut)
    return _solve_direct(X, y, Y, sw, fit_intercept=fit_intercept, comm=comm, xp=xp, solver=solver,
                         solve_gram=solve_gram, solve_r=solve_r, on_nonfinite=on_nonfinite, alpha=alpha, early=early,
                         small=lambda: _small_algebra(d), shortcut=shortcut)


def _solve_direct(X, y, Y, sw, *, fit_intercept, comm, xp, solver, solve_gram, solve_r, on_nonfinite, alpha, early,
                  small, shortcut):
    """:func:`solve_direct`'s body; ``small()`` is the context of the replicated small solves."""
    from ._lsq_solvers import gram, tsqr_r, weighted_means

    d, t = X.shape[1], Y.shape[1]
    info = {"condition": None, "route": None}
    ne = None
    if solver != "tsqr":
        Z = augmented_gram(X, Y, sw, comm=comm, xp=xp, local=None if early is None else early.take(X, y, sw))
        done = (None if shortcut is None or not (_COMPILED_ON_HOST if xp is np else _COMPILED_ON_DEVICE)
                else _compiled(Z, d, fit_intercept, solver, alpha, X.dtype, shortcut))
        if done is not None:
            return done
        if np.isfinite(Z).all():
            ne = NormalEquations(Z, d, fit_intercept)
        else:
            on_nonfinite()  # raises on every rank unless the squares overflowed
    if ne is None:
        route = "tsqr"
        if fit_intercept:
            x_mean, y_mean, sw_sum = weighted_means(X, Y, sw, comm=comm, xp=xp)
        else:
            x_mean = y_mean = sw_sum = None
    else:
        x_mean, y_mean, sw_sum = ne.x_mean, ne.y_mean, ne.sw_sum
        with small():
            if solver == "auto":
                route, info["condition"] = ne.choose(X.dtype, alpha, fit_intercept)
            else:
                route = "centred" if fit_intercept and ne.needs_centred_pass(alpha) else "normal"
            if route == "normal":   # the factor the condition estimate made serves the solve
                coef, extra = solve_gram(ne.G, ne.B, ne.factor(alpha))
    info["route"] = route
    if route == "tsqr":
        R = tsqr_r(X, Y, sw, x_mean, y_mean, comm=comm, xp=xp)
        with small():
            coef, extra = solve_r(R[:d, :d], R[:d, d:])
    elif route == "centred":
        G, B = gram(X, Y, sw, x_mean, y_mean, sw_sum, comm=comm, xp=xp)
        with small():
            coef, extra = solve_gram(G, B)
    coef = np.ascontiguousarray(coef.T)
    intercept = _intercept(coef, x_mean, y_mean) if fit_intercept else np.zeros(t)
    return coef, intercept, extra, ("tsqr" if route == "tsqr" else "normal"), info
