"""``solver="auto"`` of LinearRegression and Ridge on dense data: normal equations when accurate, TSQR otherwise.

The choice comes from the one-pass augmented Gram matrix (see
``mpiml.linear_model._lsq_direct``); the coefficients must match
scikit-learn's either way.
"""

import numpy as np
import pytest
from sklearn import linear_model as sk

from mpiml.linear_model import LinearRegression, Ridge
from mpiml.linear_model._lsq_direct import NormalEquations, augmented_gram
from mpiml.comm import get_comm


def _ill_conditioned(n=400, d=6, cond=1e7, seed=0):
    rs = np.random.RandomState(seed)
    U, _ = np.linalg.qr(rs.randn(n, d))
    V, _ = np.linalg.qr(rs.randn(d, d))
    s = np.logspace(0, -np.log10(cond), d)
    X = (U * s) @ V.T * 10 + rs.randn(d)
    y = X @ rs.randn(d) + 1e-3 * rs.randn(n)
    return X, y


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_well_conditioned_takes_the_normal_equations(dtype):
    rs = np.random.RandomState(0)
    X = (rs.randn(2000, 8) * [1, 2, 3, 4, 5, 6, 7, 8] + 5).astype(dtype)
    y = (X @ rs.randn(8) + rs.randn(2000)).astype(dtype)
    est = LinearRegression().fit(X, y)
    assert est.solver_ == "normal" and est._solver_info["route"] == "normal"
    ref = sk.LinearRegression().fit(X.astype(np.float64), y.astype(np.float64))
    assert _rel(est.coef_, ref.coef_) < (1e-10 if dtype == np.float64 else 1e-5)
    assert abs(est.intercept_ - ref.intercept_) < (1e-8 if dtype == np.float64 else 1e-3)
    r = Ridge(alpha=3.0).fit(X, y)
    assert r.solver_ == "cholesky"
    assert _rel(r.coef_, sk.Ridge(alpha=3.0).fit(X.astype(np.float64), y.astype(np.float64)).coef_) < \
        (1e-10 if dtype == np.float64 else 1e-5)


def test_ill_conditioned_takes_tsqr():
    X, y = _ill_conditioned(cond=1e7)
    est = LinearRegression().fit(X, y)
    assert est.solver_ == "tsqr" and est._solver_info["condition"] > 1e12
    ref = sk.LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    assert _rel(est.coef_, ref.coef_) < 1e-6
    # the explicit normal equations square the condition number: far less accurate here
    normal = LinearRegression(solver="normal").fit(X, y)
    assert normal.solver_ == "normal"
    # Ridge: a penalty large against the small singular values restores the normal equations
    assert Ridge(alpha=1e-12).fit(X, y).solver_ == "svd"
    assert Ridge(alpha=10.0).fit(X, y).solver_ == "cholesky"


def test_float64_moderate_condition_goes_to_tsqr_but_float32_keeps_normal():
    X, y = _ill_conditioned(cond=1e4, seed=2)
    assert LinearRegression().fit(X, y).solver_ == "tsqr"
    X32, y32 = X.astype(np.float32), y.astype(np.float32)
    est = LinearRegression().fit(X32, y32)
    assert est.solver_ == "normal"
    ref = LinearRegression(solver="tsqr").fit(X32, y32)
    np.testing.assert_allclose(est.predict(X32), ref.predict(X32), rtol=1e-4, atol=1e-4)


def test_large_means_take_a_centred_second_pass():
    rs = np.random.RandomState(1)
    X = rs.randn(3000, 5) * 1e-3 + 1e3  # mean / std = 1e6: the uncentred Gram cancels 12 digits
    y = X @ rs.randn(5) + 1e-4 * rs.randn(3000)
    est = LinearRegression().fit(X, y)
    assert est._solver_info["route"] in ("centred", "tsqr")
    ref = sk.LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-6)
    exp = LinearRegression(solver="normal").fit(X, y)
    assert exp._solver_info["route"] == "centred"
    np.testing.assert_allclose(exp.coef_, ref.coef_, rtol=1e-6)


def test_rank_deficient_auto_is_minimum_norm():
    rs = np.random.RandomState(0)
    X = rs.randn(300, 4)
    X = np.c_[X, X[:, 0] + X[:, 2], np.ones(300) * 2.0]
    y = X @ rs.randn(6) + rs.randn(300)
    est = LinearRegression().fit(X, y)
    assert est.solver_ == "tsqr"
    ref = sk.LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    assert est.rank_ == ref.rank_


def test_augmented_gram_holds_every_moment():
    rs = np.random.RandomState(4)
    X, Y, w = rs.randn(500, 7), rs.randn(500, 2), rs.uniform(0.5, 2, 500)
    Z = augmented_gram(X, Y, w, comm=get_comm("self"), xp=np)
    A = np.c_[X, Y, np.ones(500)]
    np.testing.assert_allclose(Z, (A * w[:, None]).T @ A, rtol=1e-12)
    ne = NormalEquations(Z, 7, fit_intercept=True)
    xm = w @ X / w.sum()
    np.testing.assert_allclose(ne.x_mean, xm, rtol=1e-12)
    np.testing.assert_allclose(ne.G, ((X - xm) * w[:, None]).T @ (X - xm), rtol=1e-10, atol=1e-10)
    assert ne.cancellation < 1.0 and 1 <= ne.condition() < 10


def test_nan_and_overflow():
    rs = np.random.RandomState(0)
    X, y = rs.randn(100, 3), rs.randn(100)
    X[5, 1] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN"):
        LinearRegression().fit(X, y)
    X = rs.randn(100, 3) * 1e200  # finite, but its squares overflow float64: TSQR takes over
    y = X @ np.array([1.0, 2.0, 3.0]) * 1e-200
    est = LinearRegression().fit(X, y)
    assert est.solver_ == "tsqr"
    np.testing.assert_allclose(est.coef_, [1e-200, 2e-200, 3e-200], rtol=1e-8)


def test_deferred_finite_check_raises_the_usual_messages():
    """What a GPU fit raises when its Gram matrix is not finite (the check it deferred), on host arrays."""
    from mpiml.linear_model._base import raise_if_nonfinite

    comm = get_comm("self")
    X, y = np.ones((5, 2)), np.ones(5)
    raise_if_nonfinite(LinearRegression(), X, y, comm=comm, xp=np)  # finite: returns (an overflow)
    Xn = X.copy()
    Xn[1, 1] = np.nan
    with pytest.raises(ValueError, match="Input X contains NaN.\nLinearRegression does not accept missing"):
        raise_if_nonfinite(LinearRegression(), Xn, y, comm=comm, xp=np)
    yi = y.copy()
    yi[0] = np.inf
    with pytest.raises(ValueError, match="Input y contains infinity or a value too large for dtype"):
        raise_if_nonfinite(Ridge(), X, yi, comm=comm, xp=np)


def test_early_gram_is_used_only_for_the_arrays_it_read():
    """The Gram launched before validation serves the fit only when validation kept the very arrays."""
    from mpiml.linear_model._lsq_direct import EarlyGram, early_local_gram

    rs = np.random.RandomState(3)
    X, y = rs.randn(50, 3), rs.randn(50)
    assert early_local_gram(X, y, None) is None          # host arrays: nothing launched early
    marker = object()
    early = EarlyGram(X, y, marker)
    assert early.take(X, y, None) is marker
    assert early.take(X.copy(), y, None) is None          # validation converted X
    assert early.take(X, y.copy(), None) is None
    assert early.take(X, y, np.ones(50)) is None         # weights: a different matrix


def test_first_evaluation_check_runs_once_inside_the_optimiser():
    """LogisticRegression's deferred finite check runs on L-BFGS's first evaluation (scipy's set-up meanwhile):
    once, with that evaluation's loss and gradient, and its error leaves the optimiser as it is."""
    from mpiml.comm import get_comm
    from mpiml.linear_model._logistic_loss import Objective, lbfgs

    rs = np.random.RandomState(4)
    X = rs.randn(200, 4)
    y = (X[:, 0] > 0).astype(np.int64)
    obj = Objective(X, y, np.ones(200), n_classes=2, fit_intercept=True, l2=1e-2, sw_sum=200.0,
                    comm=get_comm("self"), xp=np)
    seen = []
    obj.check_first(lambda loss, grad: seen.append((loss, grad.copy())))
    w, _, res = lbfgs(obj, np.zeros(obj.n_params), max_iter=100, tol=1e-8)
    ref = obj.evaluate(np.zeros(obj.n_params))
    assert len(seen) == 1 and seen[0][0] == ref[0] and np.array_equal(seen[0][1], ref[1]) and res.success

    def refuse(loss, grad):
        raise ValueError("Input X contains NaN.")
    obj.check_first(refuse)
    with pytest.raises(ValueError, match="contains NaN"):
        lbfgs(obj, np.zeros(obj.n_params), max_iter=100, tol=1e-8)


def test_kept_first_evaluation_is_returned_once():
    """LogisticRegression's deferred finite check evaluates the first point ahead of L-BFGS, which reuses it."""
    from mpiml.comm import get_comm
    from mpiml.linear_model._logistic_loss import Objective

    rs = np.random.RandomState(4)
    X = rs.randn(200, 4)
    y = (X[:, 0] > 0).astype(np.int64)
    sw = np.ones(200)
    obj = Objective(X, y, sw, n_classes=2, fit_intercept=True, l2=1e-2, sw_sum=200.0, comm=get_comm("self"), xp=np)
    w0 = np.zeros(obj.n_params)
    first = obj.evaluate(w0)
    obj.keep(w0, first)
    again = obj.evaluate(w0.copy())
    assert obj.n_evals == 1 and again[0] == first[0] and np.array_equal(again[1], first[1])
    assert again[1] is not first[1]                       # the optimiser may write into its gradient
    obj.evaluate(w0)
    assert obj.n_evals == 2                               # kept once only
    obj.keep(w0, first)
    obj.evaluate(w0 + 1.0)
    assert obj.n_evals == 3                               # another point: evaluated


@pytest.mark.parametrize("n_classes,max_iter", [(2, 100), (3, 100), (2, 2)])
def test_lbfgs_direct_driver_matches_scipy(n_classes, max_iter):
    """The L-BFGS-B loop that device objectives take (scipy's routine without minimize's wrappers) gives
    minimize's iterates, evaluations, counts and messages bit for bit."""
    import scipy.optimize

    from mpiml.comm import get_comm
    from mpiml.linear_model._logistic_loss import Objective, _direct_driver_agrees, _lbfgsb_direct

    assert _direct_driver_agrees()
    rs = np.random.RandomState(8)
    X = rs.randn(300, 5)
    y = np.digitize(X[:, 0] + 0.5 * rs.randn(300), np.linspace(-1, 1, n_classes + 1)[1:-1]).astype(np.int64)
    runs = []
    for drive in ("minimize", "direct"):
        obj = Objective(X, y, np.ones(300), n_classes=n_classes, fit_intercept=True, l2=1e-3, sw_sum=300.0,
                        comm=get_comm("self"), xp=np)
        points, seen = [], []

        def fun(w):
            points.append(w.copy())
            return obj.evaluate(w)

        def callback(intermediate_result):
            seen.append(np.array(intermediate_result.x))
        options = {"maxiter": max_iter, "maxls": 50, "gtol": 1e-10, "ftol": 64 * np.finfo(float).eps}
        if drive == "minimize":
            res = scipy.optimize.minimize(fun, np.zeros(obj.n_params), method="L-BFGS-B", jac=True,
                                          callback=callback, options=options)
        else:
            res = _lbfgsb_direct(fun, np.zeros(obj.n_params), callback=callback, **options)
        runs.append((res, points, seen))
    (ref, ref_points, ref_seen), (got, points, seen) = runs
    assert len(points) == len(ref_points) > 2 and all(np.array_equal(a, b) for a, b in zip(points, ref_points))
    assert len(seen) == len(ref_seen) and all(np.array_equal(a, b) for a, b in zip(seen, ref_seen))
    assert np.array_equal(got.x, ref.x) and float(got.fun) == float(ref.fun) and np.array_equal(got.jac, ref.jac)
    assert (got.nit, got.nfev, got.status, got.message, got.success) == \
        (ref.nit, ref.nfev, ref.status, ref.message, ref.success)
    assert (got.status == 1) == (max_iter == 2)
