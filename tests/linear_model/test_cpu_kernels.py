"""The compiled host passes of the linear models (mpiml.linear_model._cpu_kernels) against the NumPy paths."""

import numpy as np
import pytest
from sklearn import linear_model as sk

from mpiml.comm import get_comm
from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge, _cpu_kernels
from mpiml.linear_model import _logistic_loss, _lsq_direct
from mpiml.linear_model._logistic_loss import Objective
from mpiml.utils._linalg import augmented_gram as numpy_gram

N = 9000   # several parts (of 2048 rows and more), the last block of each uneven


def _layouts(X):
    """``X`` C-ordered, F-ordered, as columns of a wider C-ordered array, as rows of a longer F-ordered one (a
    rank's shard of a generated set: column-major, leading dimension past its rows), and every other row."""
    n = X.shape[0]
    wide = np.concatenate([X, X[:, :1]], axis=1)
    tall = np.asfortranarray(np.concatenate([X[:7], X, X[:5]]))
    every = np.repeat(X, 2, axis=0)
    return {"C": np.ascontiguousarray(X), "F": np.asfortranarray(X), "columns": wide[:, :-1], "rows": tall[7:7 + n],
            "every-other": every[::2]}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("t", [0, 1, 3])
def test_gram_matches_numpy(dtype, weighted, t):
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(N, 7)) + 4.0).astype(dtype)
    Y = rng.normal(size=(N, t)).astype(dtype)
    sw = rng.uniform(0.1, 3.0, size=N).astype(dtype) if weighted else None
    want = numpy_gram(X, Y, sw)
    for name, Xl in _layouts(X).items():
        got = _cpu_kernels.augmented_gram(Xl, Y, sw)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-9, err_msg=name)
        np.testing.assert_array_equal(got, got.T, err_msg=f"{name}: not symmetric")
    assert _cpu_kernels.augmented_gram(X[:0], Y[:0], None).shape == (8 + t, 8 + t)


@pytest.mark.parametrize("d", [1, 2, 3, 37])   # (37: uneven feature groups of the direct GEMMs, both layouts)
def test_gram_feature_counts(d):
    X = np.random.default_rng(5).normal(size=(N, d)) - 2.0
    Y = X[:, :1] * 3.0 + 1.0
    for name, Xl in _layouts(X).items():
        np.testing.assert_allclose(_cpu_kernels.augmented_gram(Xl, Y), numpy_gram(X, Y), rtol=1e-13, err_msg=name)


@pytest.mark.parametrize("failure", ["compile", "no-symbol", "wrong-numbers"])
def test_gram_falls_back_to_numpy_when_numbas_internal_gemm_fails(failure, monkeypatch):
    """The direct kernel calls Numba's internal ``numba_xxgemm``: where it does not compile, is no longer exported
    or gives wrong numbers, one warning, then NumPy's Gram (the same bits as calling it), not retried."""
    import numba

    from numba import _helperlib

    monkeypatch.setattr(_cpu_kernels, "_DIRECT_USABLE", None)
    if failure == "compile":
        def broken(*args):
            raise numba.core.errors.TypingError("Untyped global name 'numba_xxgemm'")
        monkeypatch.setattr(_cpu_kernels, "_gram_direct_kernel", broken)
    elif failure == "no-symbol":
        monkeypatch.setattr(_helperlib, "c_helpers", {k: v for k, v in _helperlib.c_helpers.items() if k != "xxgemm"})
    else:
        def wrong(R, tr, n, d, Y, groups, parts, block, workers, counter, out_p):
            out_p[:] = 1.0
        monkeypatch.setattr(_cpu_kernels, "_gram_direct_kernel", wrong)
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(N, 6)), rng.normal(size=(N, 2))
    with pytest.warns(RuntimeWarning, match="compiled Gram kernel .* unavailable"):
        got = _cpu_kernels.augmented_gram(X, Y)
    assert _cpu_kernels._DIRECT_USABLE is False
    np.testing.assert_array_equal(got, numpy_gram(X, Y))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")         # once: no second warning, no second try
        XF = np.asfortranarray(X)
        np.testing.assert_array_equal(_cpu_kernels.augmented_gram(XF, Y), numpy_gram(XF, Y))
        sw = rng.uniform(0.5, 2.0, size=N)      # (the weighted kernel does not use the internal entry)
        np.testing.assert_allclose(_cpu_kernels.augmented_gram(X, Y, sw), numpy_gram(X, Y, sw), rtol=1e-13, atol=1e-9)
    monkeypatch.undo()
    np.testing.assert_allclose(_cpu_kernels.augmented_gram(X, Y), numpy_gram(X, Y), rtol=1e-13, atol=1e-9)


def test_gram_finds_nonfinite():
    X = np.random.default_rng(1).normal(size=(N, 5))
    X[N - 3, 2] = np.nan
    assert not np.isfinite(_cpu_kernels.augmented_gram(X, np.zeros((N, 1)))).all()
    X[N - 3, 2] = np.inf
    assert not np.isfinite(_cpu_kernels.augmented_gram(np.asfortranarray(X), np.zeros((N, 1)))).all()


def test_bits_do_not_depend_on_threads():
    import numba

    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(N, 6)), rng.normal(size=(N, 1))
    y01 = (rng.random(N) > 0.5).astype(np.float64)
    assert _cpu_kernels._parts(N) > 1
    out = []
    before = numba.get_num_threads()
    try:
        for t in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(t)
            lp = _cpu_kernels.LogisticPass(X, y01, np.ones(N), fit_intercept=True)
            out.append((_cpu_kernels.augmented_gram(X, Y), lp(np.linspace(-1, 1, 6), 0.3)))
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_pass_matches_numpy(dtype, fit_intercept):
    """Loss and gradient of the compiled pass against the NumPy evaluation, margins up to |m| ~ 800 (the
    polynomial exp/log1p and the underflow cap)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, 9)).astype(dtype)
    X[:50] *= 300.0   # large margins: exp(-|m|) underflows
    y = (rng.random(N) > 0.4).astype(np.int64)
    sw = rng.uniform(0.2, 2.0, size=N).astype(dtype)
    for name, Xl in _layouts(X).items():
        obj = Objective(Xl, y, sw, n_classes=2, fit_intercept=fit_intercept, l2=1e-3, sw_sum=float(sw.sum()),
                        comm=get_comm("self"), xp=np)
        assert obj._host_pass is not None
        w = rng.normal(size=obj.n_params)
        fast = obj._local(w, False)
        obj._host_pass = None
        slow = obj._local(w, False)
        rtol = 1e-12 if dtype == np.float64 else 1e-5   # (NumPy's evaluation of float32 rows rounds in float32)
        np.testing.assert_allclose(fast, slow, rtol=rtol, atol=rtol * np.abs(slow).max(), err_msg=name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_multinomial_pass_matches_numpy(dtype, fit_intercept):
    rng = np.random.default_rng(6)
    X = rng.normal(size=(N, 9)).astype(dtype)
    X[:40] *= 200.0   # margins far apart: exp(m - max) underflows
    y = rng.integers(0, 4, size=N)
    sw = rng.uniform(0.2, 2.0, size=N).astype(dtype)
    for name, Xl in _layouts(X).items():
        obj = Objective(Xl, y, sw, n_classes=4, fit_intercept=fit_intercept, l2=1e-3, sw_sum=float(sw.sum()),
                        comm=get_comm("self"), xp=np)
        assert isinstance(obj._host_pass, _cpu_kernels.MultinomialPass)
        w = rng.normal(size=obj.n_params)
        fast = obj._local(w, False)
        obj._host_pass = None
        slow = obj._local(w, False)
        rtol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(fast, slow, rtol=rtol, atol=rtol * np.abs(slow).max(), err_msg=name)


def test_exp_and_log1p_polynomials():
    m = np.concatenate([np.linspace(-40, 40, 80001), [0.0, 1e-300, -700.0, 707.9]])
    X = m[:, None].copy()
    y01 = np.zeros(len(m))
    lp = _cpu_kernels.LogisticPass(X, y01, np.ones(len(m)), fit_intercept=False)
    loss = lp(np.ones(1), 0.0)[0]
    want = float(np.sum(np.logaddexp(0.0, m)))
    assert abs(loss - want) <= 1e-14 * want


def _big(monkeypatch):
    """Every host shard through the compiled passes (the thresholds lowered)."""
    monkeypatch.setattr(_lsq_direct, "_HOST_KERNEL_MIN_VALUES", 0)
    monkeypatch.setattr(_logistic_loss, "_HOST_PASS_MIN_VALUES", 0)


@pytest.mark.parametrize("layout", ["C", "F"])
def test_estimators_through_the_kernels_match_sklearn(layout, monkeypatch):
    _big(monkeypatch)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(3000, 6)) + 2.0
    X = np.asfortranarray(X) if layout == "F" else X
    y = X @ rng.normal(size=6) + 0.1 * rng.normal(size=3000)
    w = rng.uniform(0.5, 2.0, size=3000)
    m, s = LinearRegression().fit(X, y, sample_weight=w), sk.LinearRegression().fit(X, y, sample_weight=w)
    np.testing.assert_allclose(m.coef_, s.coef_, rtol=1e-9)
    np.testing.assert_allclose(Ridge(alpha=3.0).fit(X, y).coef_, sk.Ridge(alpha=3.0).fit(X, y).coef_, rtol=1e-9)
    yb = (X[:, 0] - X[:, 1] + 0.5 * rng.normal(size=3000) > 0).astype(int)
    for solver in ("lbfgs", "newton-cg", "newton-cholesky"):
        m = LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, yb, sample_weight=w)
        s = sk.LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, yb, sample_weight=w)
        np.testing.assert_allclose(m.coef_, s.coef_, rtol=1e-6, err_msg=solver)
        np.testing.assert_allclose(m.intercept_, s.intercept_, rtol=1e-6, atol=1e-8, err_msg=solver)
    ym = np.digitize(X[:, 2] - X[:, 3] + 0.3 * rng.normal(size=3000), [1.5, 2.5])   # three classes
    for solver in ("lbfgs", "newton-cg"):
        m = LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, ym, sample_weight=w)
        s = sk.LogisticRegression(solver=solver, tol=1e-10, max_iter=500).fit(X, ym, sample_weight=w)
        # (L-BFGS stops on a relative decrease of 64 eps: 2 more iterations here than scikit-learn's, ~3e-7 apart)
        np.testing.assert_allclose(m.coef_, s.coef_, rtol=0, atol=1e-6 * np.abs(s.coef_).max(),
                                   err_msg=f"multinomial {solver}")
    m = LogisticRegression().fit(X.astype(np.float32), yb)
    assert m.coef_.dtype == np.float32
    np.testing.assert_allclose(m.coef_, sk.LogisticRegression().fit(X, yb).coef_, rtol=1e-4)
