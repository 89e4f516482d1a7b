"""The compiled replicated algebra of the direct least squares (``_small_jit``) against the NumPy path.

GPU fits take it after their Gram reduction; here it runs on host matrices (one compile, cached) and,
through ``_lsq_direct._COMPILED_ON_HOST``, inside the estimators: the route, ``κ``, ``G`` and
``coef_`` must be the NumPy path's bits, the intercept within rounding, and anything off the common
case must fall back.
"""

import numpy as np
import pytest

from mpiml.linear_model import LinearRegression, Ridge
from mpiml.linear_model import _lsq_direct
from mpiml.linear_model._lsq_direct import NormalEquations
from mpiml.linear_model._lsq_solvers import lstsq_from_gram_cholesky, ridge_from_gram

_EPS = np.finfo(np.float64).eps


def _gram(rs, n, d, t, scale, shift, cond=None, duplicate=False):
    X = rs.randn(n, d) * scale + shift
    if cond is not None and d > 1:
        U, _ = np.linalg.qr(rs.randn(n, d))
        X = (U * np.logspace(0, -np.log10(cond), d)) @ np.linalg.qr(rs.randn(d, d))[0] * scale + shift
    if duplicate and d > 1:
        X[:, -1] = X[:, 0]
    Y = X @ rs.randn(d, t) + rs.randn(n, t)
    A = np.hstack([X, Y, np.ones((n, 1))])
    Z = A.T @ A
    return (Z + Z.T) / 2


def _cases():
    rs = np.random.RandomState(0)
    for i in range(120):
        d = int(rs.choice([1, 2, 5, 17, 64, 65]))
        t = int(rs.randint(1, 4))
        kind = i % 6
        Z = _gram(rs, max(3 * d, 300), d, t, scale=float(rs.choice([1e-3, 1.0, 1e3])),
                  shift=float(rs.choice([0.0, 1.0, 1e4 if kind == 2 else 10.0])),
                  cond={3: 1e6, 4: 1e12}.get(kind), duplicate=kind == 5)
        yield Z, d, bool(i % 5), float(rs.choice([0.0, 0.0, 1e-3, 2.0])), bool(i % 3), \
            np.float32 if i % 2 else np.float64


def test_compiled_algebra_is_the_numpy_path():
    from mpiml.linear_model import _small_jit as jit

    taken = fell_back = 0
    for Z, d, fit_intercept, alpha, auto, dtype in _cases():
        t = Z.shape[0] - d - 1
        ne = NormalEquations(Z, d, fit_intercept)
        if auto:
            route, kappa = ne.choose(dtype, alpha, fit_intercept)
        else:
            route = "centred" if fit_intercept and ne.needs_centred_pass(alpha) else "normal"
            kappa = ne.condition(alpha)
        ridge = alpha > 0
        threshold = 100 * max(d, 1) * _EPS if ridge else max(1e-6 * 1e-6, 100 * _EPS)
        u = float(np.finfo(dtype).eps / 2)
        got_route, got_kappa, coef, means, G = jit.direct_normal(Z, d, fit_intercept, auto, alpha, u, threshold)
        factor = ne.factor(alpha)
        if route != "normal" or not factor.bound * threshold < 1.0:
            assert got_route == jit.FALLBACK, (route, d, alpha)
            fell_back += 1
            continue
        if ridge:
            ref = ridge_from_gram(ne.G, ne.B, np.full(t, alpha), factor, alpha)
        else:
            ref, rank, _ = lstsq_from_gram_cholesky(ne.G, ne.B, 1e-6, factor)
            assert rank == d
        assert got_route == jit.NORMAL
        assert got_kappa == kappa
        np.testing.assert_array_equal(G, ne.G)
        np.testing.assert_array_equal(coef, ref.T)
        if fit_intercept:
            np.testing.assert_array_equal(means, np.concatenate([ne.x_mean, ne.y_mean]))
        else:
            np.testing.assert_array_equal(means, np.zeros(d + t))
        taken += 1
    assert taken > 40 and fell_back > 20


def test_compiled_algebra_non_finite_and_empty():
    from mpiml.linear_model import _small_jit as jit

    Z = _gram(np.random.RandomState(1), 50, 3, 1, 1.0, 0.0)
    for bad in (np.nan, np.inf):
        Zb = Z.copy()
        Zb[1, 2] = Zb[2, 1] = bad
        assert jit.direct_normal(Zb, 3, True, True, 0.0, 2.0 ** -24, 1e-12)[0] == jit.NONFINITE
    Zo = Z.copy()
    Zo[:3, -1] = Zo[-1, :3] = 1e300    # finite sums whose centring overflows: the NumPy path decides
    assert jit.direct_normal(Zo, 3, True, True, 0.0, 2.0 ** -24, 1e-12)[0] == jit.FALLBACK
    Zc = Z.copy()
    Zc[0, :] = Zc[:, 0] = 0.0           # a zero column: not positive definite
    assert jit.direct_normal(Zc, 3, False, True, 0.0, 2.0 ** -24, 1e-12)[0] == jit.FALLBACK


def _fits(X, y, sw=None):
    yield LinearRegression(), X, y, sw
    yield LinearRegression(fit_intercept=False), X, y, sw
    yield LinearRegression(solver="normal"), X, y, sw
    yield Ridge(alpha=0.5), X, y, sw
    yield Ridge(alpha=[1.0, 1.0]), X, np.c_[y, -2 * y], sw
    yield Ridge(alpha=[1.0, 3.0]), X, np.c_[y, -2 * y], sw    # two penalties: no shortcut
    yield Ridge(solver="cholesky", alpha=0.0), X, y, sw
    yield LinearRegression(), X, np.c_[y, y + 1], sw


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_estimators_through_the_compiled_algebra(dtype, monkeypatch, direct_normal_routes):
    from mpiml.linear_model import _small_jit as jit

    routes = direct_normal_routes
    rs = np.random.RandomState(3)
    n, d = 3000, 12
    X = (rs.randn(n, d) * np.arange(1, d + 1) + 2.0).astype(dtype)
    y = (X @ rs.randn(d) + rs.randn(n)).astype(dtype)
    Xdup = X.copy()
    Xdup[:, 5] = Xdup[:, 2]                    # rank-deficient: the eigenvalues decide (fallback)
    U, _ = np.linalg.qr(rs.randn(n, d))
    Xill = ((U * np.logspace(0, -7, d)) @ np.linalg.qr(rs.randn(d, d))[0] + 3.0).astype(dtype)   # TSQR
    sw = rs.uniform(0.5, 2.0, n).astype(dtype)
    cases = list(_fits(X, y)) + list(_fits(X, y, sw)) + list(_fits(Xdup, y)) + list(_fits(Xill, y))
    for est, Xc, yc, w in cases:
        monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_HOST", False)
        ref = est.fit(Xc, yc, sample_weight=w)
        ref_coef, ref_icpt, ref_solver, ref_info = ref.coef_.copy(), np.copy(ref.intercept_), ref.solver_, \
            dict(ref._solver_info)
        ref_rank = getattr(ref, "rank_", None)
        ref_sing = ref.singular_.copy() if ref_rank is not None else None
        monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_HOST", True)
        got = est.fit(Xc, yc, sample_weight=w)
        assert got.solver_ == ref_solver and got._solver_info == ref_info
        np.testing.assert_array_equal(got.coef_, ref_coef)
        assert got.coef_.dtype == ref_coef.dtype and got.coef_.shape == ref_coef.shape
        np.testing.assert_array_equal(got.intercept_, ref_icpt)   # (ranks may take either path: the same bits)
        assert np.asarray(got.intercept_).dtype == np.asarray(ref_icpt).dtype
        if ref_rank is not None:
            assert got.rank_ == ref_rank
            np.testing.assert_array_equal(got.singular_, ref_sing)
    assert routes.count(jit.NORMAL) >= 8 and routes.count(jit.FALLBACK) >= 4


def test_compiled_algebra_keeps_the_input_errors(monkeypatch):
    monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_HOST", True)
    rs = np.random.RandomState(4)
    X, y = rs.randn(500, 3), rs.randn(500)
    X[3, 1] = np.nan
    for est in (LinearRegression(), Ridge()):
        with pytest.raises(ValueError, match="Input X contains NaN"):
            est.fit(X, y)


def test_first_fits_do_not_wait_for_the_compiled_algebra(monkeypatch):
    """Until the loader thread has the compiled function, fits take the NumPy algebra (no Numba on their path);
    the first one starts the loader; afterwards the compiled path gives the same bits."""
    import threading

    monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_HOST", True)
    monkeypatch.setattr(_lsq_direct, "_JIT", [])
    gate = threading.Event()
    started = []
    real_load = _lsq_direct._load_compiled

    def slow_load():
        started.append(True)
        gate.wait(60)
        real_load()

    monkeypatch.setattr(_lsq_direct, "_load_compiled", slow_load)
    monkeypatch.setattr(_lsq_direct, "_JIT_LOADER", [])
    rs = np.random.RandomState(6)
    X = rs.randn(2000, 7) + 1.0
    y = X @ rs.randn(7) + rs.randn(2000)
    first = LinearRegression().fit(X, y)
    assert _lsq_direct._JIT == [] and len(_lsq_direct._JIT_LOADER) == 1   # not ready: the NumPy path ran
    second = Ridge(alpha=0.5).fit(X, y)
    assert _lsq_direct._JIT == [] and len(_lsq_direct._JIT_LOADER) == 1   # one loader only
    gate.set()
    assert _lsq_direct.wait_compiled_algebra(120) and started == [True]
    a, b = LinearRegression().fit(X, y), Ridge(alpha=0.5).fit(X, y)
    np.testing.assert_array_equal(a.coef_, first.coef_)
    np.testing.assert_array_equal(a.intercept_, first.intercept_)
    np.testing.assert_array_equal(b.coef_, second.coef_)
    np.testing.assert_array_equal(b.intercept_, second.intercept_)
