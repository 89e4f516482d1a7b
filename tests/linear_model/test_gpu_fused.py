"""The one-pass GPU kernels of the linear models (``mpiml.kernels.linear``) against NumPy (GPU host only)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,t", [(0, 3, 1), (1, 1, 1), (31, 5, 1), (33, 8, 2), (10007, 64, 1), (4099, 120, 2),
                                   (70001, 64, 1), (2000, 20, 1), (3001, 44, 3), (5000, 70, 1), (3001, 47, 0)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("tensor_cores,kernel", [(True, None), (True, "mma3"), (True, "mma3s64"), (True, "mma3g"),
                                                 (True, "mma"), (False, None)])
def test_augmented_gram_kernel(dtype, n, d, t, weighted, tensor_cores, kernel, monkeypatch):
    import cupy as cp

    from mpiml.kernels import linear
    from mpiml.kernels.linear import augmented_gram

    if tensor_cores and not linear._tensor_cores():
        pytest.skip("no float64 tensor cores on this GPU")
    # False: the CUDA-core kernel of older GPUs
    monkeypatch.setattr(linear, "_tensor_cores", lambda dev=None: tensor_cores)

    rs = np.random.RandomState(n + d)
    X = (rs.randn(n, d) * 3 + 2).astype(dtype)
    Y = rs.randn(n, t).astype(dtype)
    w = rs.uniform(0.5, 2.0, n).astype(dtype) if weighted else None
    args = (cp.asarray(X), cp.asarray(Y), None if w is None else cp.asarray(w))
    G = augmented_gram(*args, kernel=kernel).get()
    np.testing.assert_array_equal(augmented_gram(*args, kernel=kernel).get(), G)   # the same bits every run
    Z = np.c_[X.astype(np.float64), Y.astype(np.float64), np.ones(n)]
    ref = (Z * (1.0 if w is None else w.astype(np.float64)[:, None])).T @ Z
    np.testing.assert_allclose(G, ref, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(G, G.T)


@pytest.mark.parametrize("weighted", [False, True])
def test_gram_kernel_picked_by_timing(weighted, monkeypatch):
    """A shard of 2^20 rows or more times the tensor-core kernels once per class and keeps the fastest."""
    import cupy as cp

    from mpiml.kernels import linear

    if not linear._tensor_cores():
        pytest.skip("no float64 tensor cores on this GPU")
    monkeypatch.setattr(linear, "_PICKS", {})
    monkeypatch.setattr(linear, "_PICK_TIMES", {})
    monkeypatch.delenv("MPIML_LINEAR_GRAM", raising=False)
    rs = np.random.RandomState(7)
    n = linear._CALIBRATE_ROWS + 5
    X = rs.randn(n, 16).astype(np.float32)
    Y = rs.randn(n, 1).astype(np.float32)
    w = rs.uniform(0.5, 2.0, n).astype(np.float32) if weighted else None
    args = (cp.asarray(X), cp.asarray(Y), None if w is None else cp.asarray(w))
    G = linear.augmented_gram(*args).get()
    (key, pick), = linear._PICKS.items()
    assert pick in ("mma", "mma3", "mma3s64", "mma3g") and set(linear._PICK_TIMES[key]) >= {"mma", "mma3"}
    np.testing.assert_array_equal(linear.augmented_gram(*args, kernel=pick).get(), G)
    Z = np.c_[X.astype(np.float64), Y.astype(np.float64), np.ones(n)]
    ref = (Z * (1.0 if w is None else w.astype(np.float64)[:, None])).T @ Z
    np.testing.assert_allclose(G, ref, rtol=1e-11, atol=1e-6)
    monkeypatch.setenv("MPIML_LINEAR_GRAM", "mma3g")
    assert linear._pick_gram(args[0], args[1], args[2], 3) == "mma3g"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 7, 32, 64, 100, 256])
def test_logistic_kernel(dtype, d):
    import cupy as cp

    from mpiml.kernels.linear import logistic_pass

    rs = np.random.RandomState(d)
    n = 5003
    X = rs.randn(n, d).astype(dtype)
    y = (rs.rand(n) < 0.4).astype(dtype)
    sw = rs.uniform(0.5, 2.0, n).astype(dtype)
    coef, bias, vec, vb = rs.randn(d) * 0.3, 0.2, rs.randn(d), -0.7
    Xd = X.astype(np.float64)
    m = Xd @ coef + bias
    p = 1 / (1 + np.exp(-m))
    g = sw * (p - y)
    loss = sw @ (np.logaddexp(0, m) - y * m)
    out = logistic_pass(cp.asarray(X), cp.asarray(y), cp.asarray(sw), coef, bias).get()
    np.testing.assert_allclose(out, np.r_[loss, g.sum(), g @ Xd], rtol=1e-10, atol=1e-9)
    q = sw * p * (1 - p) * (Xd @ vec + vb)
    out = logistic_pass(cp.asarray(X), cp.asarray(y), cp.asarray(sw), coef, bias, vec, vb).get()
    np.testing.assert_allclose(out[1:], np.r_[q.sum(), q @ Xd], rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 5003])
def test_prepared_logistic_pass_repeats(dtype, n):
    """A LogisticPass evaluates point after point (one pinned staging buffer) as fresh logistic_pass calls do."""
    import cupy as cp

    from mpiml.kernels.linear import LogisticPass, logistic_pass

    rs = np.random.RandomState(n + 1)
    d = 33
    X = cp.asarray(rs.randn(n, d).astype(dtype))
    y = cp.asarray((rs.rand(n) < 0.4).astype(dtype))
    sw = cp.asarray(rs.uniform(0.5, 2.0, n).astype(dtype))
    for fi in (None, True, False):
        prepared = LogisticPass(X, y, sw, fit_intercept=fi, scale=1.5)
        pack = None if fi is None else (fi, 1.5, 7.0)
        points = [(rs.randn(d) * 0.3, 0.2, None, 0.0), (rs.randn(d), -0.1, rs.randn(d), 0.4), (np.zeros(d), 0.0,
                                                                                                None, 0.0)]
        outs = [prepared(c, b, v, vb, 0.0 if fi is None else 7.0) for c, b, v, vb in points]   # queued, no waits
        for (c, b, v, vb), out in zip(points, outs):
            np.testing.assert_array_equal(out.get(), logistic_pass(X, y, sw, c, b, v, vb, pack=pack).get())
        # an optimiser's way: launch, sums, wait for the result, the next launch "synced" (no event); then an
        # unsynced call again (it must wait for the unrecorded copy)
        for synced, (c, b, v, vb) in zip((False, True, True, False), points + points[:1]):
            prepared.launch(c, b, v, vb, synced=synced)
            got = prepared.sums(0.0 if fi is None else 7.0).get()
            np.testing.assert_array_equal(got, logistic_pass(X, y, sw, c, b, v, vb, pack=pack).get())
        outs = [prepared(c, b, v, vb, 0.0 if fi is None else 7.0) for c, b, v, vb in points]
        for (c, b, v, vb), out in zip(points, outs):
            np.testing.assert_array_equal(out.get(), logistic_pass(X, y, sw, c, b, v, vb, pack=pack).get())


def test_early_first_evaluation_same_bits(monkeypatch):
    """The first L-BFGS evaluation launched during validation gives the bits of a fit without it."""
    import cupy as cp
    from sklearn.datasets import make_classification

    from mpiml.linear_model import LogisticRegression
    from mpiml.linear_model._logistic_loss import EarlyPass

    X, y = make_classification(n_samples=30000, n_features=64, random_state=2)
    X = cp.asarray(X.astype(np.float32))
    for labels in (y, np.where(y == 1, 7.0, 3.0)):
        yd = cp.asarray(labels)
        a = LogisticRegression().fit(X, yd)
        assert a._early_first_pass
        with monkeypatch.context() as m:
            m.setattr(EarlyPass, "applies", staticmethod(lambda *args, **kw: False))
            b = LogisticRegression().fit(X, yd)
        assert not b._early_first_pass and a.n_iter_[0] == b.n_iter_[0] and a._n_fun_evals == b._n_fun_evals
        np.testing.assert_array_equal(a.coef_.get(), b.coef_.get())
        np.testing.assert_array_equal(a.intercept_.get(), b.intercept_.get())
        np.testing.assert_array_equal(a.classes_, np.unique(labels))
    # where it cannot apply: weights, a warm start, another solver, three classes
    yd = cp.asarray(y)
    assert not LogisticRegression().fit(X, yd, sample_weight=cp.ones(X.shape[0]))._early_first_pass
    warm = LogisticRegression(warm_start=True).fit(X, yd)
    assert warm._early_first_pass and not warm.fit(X, yd)._early_first_pass
    assert not LogisticRegression(solver="newton-cg").fit(X, yd)._early_first_pass
    assert not LogisticRegression().fit(X, cp.asarray(y + (np.arange(y.size) % 7 == 0)))._early_first_pass


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_auto_on_the_gpu_matches_the_host(dtype):
    import cupy as cp

    from mpiml.linear_model import LinearRegression, Ridge

    rs = np.random.RandomState(0)
    X = (rs.randn(200_000, 64) + 1.0).astype(dtype)
    y = (X @ rs.randn(64) + rs.randn(200_000)).astype(dtype)
    g = LinearRegression().fit(cp.asarray(X), cp.asarray(y))
    h = LinearRegression().fit(X, y)
    assert g.solver_ == h.solver_ == "normal" and isinstance(g.coef_, cp.ndarray)
    np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-6 if dtype == np.float32 else 1e-11)
    w = rs.uniform(0.5, 2.0, 200_000).astype(dtype)
    g = Ridge(alpha=5.0).fit(cp.asarray(X), cp.asarray(np.c_[y, -y]), sample_weight=cp.asarray(w))
    h = Ridge(alpha=5.0).fit(X, np.c_[y, -y], sample_weight=w)
    assert g.solver_ == "cholesky"
    np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-6 if dtype == np.float32 else 1e-11)


def test_ill_conditioned_on_the_gpu_takes_tsqr():
    import cupy as cp

    from mpiml.linear_model import LinearRegression

    rs = np.random.RandomState(1)
    U, _ = np.linalg.qr(rs.randn(5000, 6))
    X = (U * np.logspace(0, -8, 6)) @ np.linalg.qr(rs.randn(6, 6))[0] * 10 + 3.0
    y = X @ rs.randn(6)
    g = LinearRegression().fit(cp.asarray(X), cp.asarray(y))
    h = LinearRegression().fit(X, y)
    assert g.solver_ == h.solver_ == "tsqr"
    np.testing.assert_allclose(g.predict(cp.asarray(X)).get(), h.predict(X), rtol=1e-9, atol=1e-9)


def test_non_finite_input_on_the_gpu():
    import cupy as cp

    from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

    rs = np.random.RandomState(2)
    X, y = rs.randn(1000, 4).astype(np.float32), rs.randn(1000).astype(np.float32)
    Xn = X.copy()
    Xn[7, 2] = np.nan
    for est in (LinearRegression(), Ridge()):
        with pytest.raises(ValueError, match="Input X contains NaN"):
            est.fit(cp.asarray(Xn), cp.asarray(y))
        Xi = X.copy()
        Xi[3, 0] = np.inf
        with pytest.raises(ValueError, match="Input X contains infinity"):
            est.fit(cp.asarray(Xi), cp.asarray(y))
        yn = y.copy()
        yn[0] = np.nan
        with pytest.raises(ValueError, match="Input y contains NaN"):
            est.fit(cp.asarray(X), cp.asarray(yn))
    # LogisticRegression (L-BFGS) finds them in its first evaluation instead of a separate read of X
    labels = cp.asarray((y > 0).astype(np.int64))
    for Xbad, what in ((Xn, "NaN"), (Xi, "infinity")):
        for multi in (False, True):
            with pytest.raises(ValueError, match=f"Input X contains {what}"):
                LogisticRegression().fit(cp.asarray(Xbad), labels + (cp.arange(1000) % 3 == 0) * multi)
    clf = LogisticRegression().fit(cp.asarray(X), labels)
    ref = LogisticRegression().fit(X, (y > 0).astype(np.int64))
    np.testing.assert_allclose(clf.coef_.get(), ref.coef_, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("solver", ["lbfgs", "newton-cg"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_binary_logistic_matches_the_host(solver, dtype):
    import cupy as cp
    from sklearn.datasets import make_classification

    from mpiml.linear_model import LogisticRegression

    X, y = make_classification(n_samples=20000, n_features=40, random_state=0)
    X = X.astype(dtype)
    w = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    g = LogisticRegression(solver=solver, tol=1e-8, max_iter=500).fit(cp.asarray(X), cp.asarray(y),
                                                                      sample_weight=cp.asarray(w))
    h = LogisticRegression(solver=solver, tol=1e-8, max_iter=500).fit(X, y, sample_weight=w)
    if dtype == np.float64:
        np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(g.intercept_.get(), h.intercept_, rtol=1e-6, atol=1e-6)
        return
    # float32: the host path forms its products in float32 (as scikit-learn), which rounds its gradient
    # to ~5e-9 here (how, depends on the BLAS's summation order: the host's answer moves with its threads),
    # while the fused kernel sums in float64. make_classification's two redundant features are exact
    # combinations of others, so the Hessian's smallest eigenvalue is the penalty mu = 1/sum(w) (4e-5): a
    # gradient at tol=1e-8 leaves the coefficients up to ~tol/mu = 2.5e-4 from the optimum. So: the fused
    # fit must reach the optimum (the float64 gradient of the objective at its coefficients within 2 tol),
    # and the two fits lie as close as their float64 gradients allow (strong convexity:
    # |w1 - w2| <= (|grad f(w1)| + |grad f(w2)|) / mu, 2-norms).
    from mpiml.comm import get_comm
    from mpiml.linear_model._logistic_loss import Objective

    X64 = X.astype(np.float64)
    mu = 1.0 / w.sum()
    obj = Objective(X64, y.astype(np.int64), w, n_classes=2, fit_intercept=True, l2=mu, sw_sum=w.sum(),
                    comm=get_comm("self"), xp=np)
    flat = [np.concatenate([c.ravel(), i.ravel()]).astype(np.float64)
            for c, i in ((g.coef_.get(), g.intercept_.get()), (h.coef_, h.intercept_))]
    grads = [obj.evaluate(v)[1] for v in flat]
    assert np.abs(grads[0]).max() <= 2e-8, f"fused fit off the optimum: max|grad| = {np.abs(grads[0]).max():.3g}"
    bound = (np.linalg.norm(grads[0]) + np.linalg.norm(grads[1])) / mu
    assert np.linalg.norm(flat[0] - flat[1]) <= 1.01 * bound + 1e-7, (np.linalg.norm(flat[0] - flat[1]), bound)


def test_label_checks_on_the_gpu():
    """The label type of a device y comes from its distinct values without sorting it (binary: min, max, a count)."""
    import cupy as cp

    from mpiml.linear_model import LogisticRegression

    rs = np.random.RandomState(5)
    X = cp.asarray(rs.randn(300, 3))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        LogisticRegression().fit(X, cp.asarray(rs.randn(300)))
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        LogisticRegression().fit(X, cp.asarray(np.where(rs.rand(300) < 0.5, 0.5, 1.5)))   # two values, not integral
    clf = LogisticRegression().fit(X, cp.asarray(np.where(rs.rand(300) < 0.5, 3.0, 7.0)))   # two integral floats
    np.testing.assert_array_equal(clf.classes_, [3.0, 7.0])
    # the classes come with validation's agreement; NaN and infinity in y show among the distinct values
    clf = LogisticRegression().fit(X, cp.asarray(rs.randint(0, 3, 300)))
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    for bad, what in ((np.nan, "NaN"), (np.inf, "infinity")):
        labels = np.where(rs.rand(300) < 0.5, 0.0, 1.0)
        labels[4] = bad
        with pytest.raises(ValueError, match=f"Input y contains {what}"):
            LogisticRegression().fit(X, cp.asarray(labels))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float32, np.float64])
@pytest.mark.parametrize("values", [(0, 1), (1,), (0, 1, 1, 0, 1, 1), (0, 1, 2, 1)])
def test_device_labels_on_the_gpu(dtype, values):
    """The distinct labels of a CuPy y: min, max and whether another value exists (one copy), else unique."""
    import cupy as cp

    from mpiml.utils._supervised import _device_labels

    y = np.resize(np.asarray(values), 10007).astype(dtype)
    got = _device_labels(cp.asarray(y))
    np.testing.assert_array_equal(got, np.unique(y))
    assert got.dtype == y.dtype


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32, np.float64])
def test_label_scan_kernel(dtype):
    """mpiml_linear_labels: the smallest two distinct values and the largest of y in one read, over many blocks."""
    import cupy as cp

    from mpiml.kernels import linear
    from mpiml.utils._supervised import _device_labels

    rs = np.random.RandomState(11)
    n = 3_000_017
    cases = [np.zeros(n), np.where(rs.rand(n) < 0.3, 5.0, -2.0), np.where(rs.rand(n) < 0.999, 1.0, 0.0),
             rs.randint(0, 3, n).astype(float), np.full(7, 4.0), np.array([9.0, 3.0])]
    third = np.where(rs.rand(n) < 0.5, 0.0, 1.0)
    third[n - 5] = 2.0                     # one value in the last block only
    cases.append(third)
    between = np.where(rs.rand(n) < 0.5, 1.0, 4.0)
    between[17] = 3.0                      # above the second smallest seen so far, below the largest
    cases.append(between)
    for y in cases:
        y = y.astype(dtype)
        values, flags = linear.label_scan(cp.asarray(y))
        distinct = np.unique(y)
        assert values.dtype == y.dtype and not flags & linear.LABELS_NAN
        assert values[0] == distinct[0] and values[2] == distinct[-1]
        assert bool(flags & linear.LABELS_TWO) == (distinct.size > 1)
        if distinct.size > 1:
            assert values[1] == distinct[1]
        got = _device_labels(cp.asarray(y))
        np.testing.assert_array_equal(got, distinct)
        assert got.dtype == y.dtype
        # a strided view goes through a contiguous copy
        np.testing.assert_array_equal(_device_labels(cp.asarray(np.repeat(y, 2))[::2]), distinct)
    if np.dtype(dtype).kind == "f":
        y = np.where(rs.rand(n) < 0.5, 0.0, 1.0).astype(dtype)
        y[n // 2] = np.nan
        values, flags = linear.label_scan(cp.asarray(y))
        assert flags & linear.LABELS_NAN and values[0] == 0 and values[2] == 1
        got = _device_labels(cp.asarray(y))
        assert got.size == 3 and np.isnan(got[-1])
    assert linear.label_scan(cp.zeros(5, dtype=cp.uint8)) is None     # other dtypes: the reductions' path


def test_lbfgs_driver_on_device_rows_same_bits(monkeypatch):
    """A device LogisticRegression takes the direct L-BFGS-B loop: the same coefficients, bit for bit, and the
    same iteration and evaluation counts as through scipy's minimize (MPIML_LINEAR_LBFGS_DRIVER=scipy)."""
    import cupy as cp
    from sklearn.datasets import make_classification

    from mpiml.linear_model import LogisticRegression
    from mpiml.linear_model._logistic_loss import _direct_driver_agrees

    assert _direct_driver_agrees()
    X, y = make_classification(n_samples=20000, n_features=32, random_state=3)
    X, y = cp.asarray(X.astype(np.float32)), cp.asarray(y)
    fits = []
    for driver in ("direct", "scipy"):
        monkeypatch.setenv("MPIML_LINEAR_LBFGS_DRIVER", driver)
        fits.append(LogisticRegression().fit(X, y))
    a, b = fits
    np.testing.assert_array_equal(a.coef_.get(), b.coef_.get())
    np.testing.assert_array_equal(a.intercept_.get(), b.intercept_.get())
    assert a.n_iter_[0] == b.n_iter_[0] and a._n_fun_evals == b._n_fun_evals and a._n_fun_evals_scipy == \
        b._n_fun_evals_scipy


def test_fitted_attributes_copy_to_the_device():
    """fitted_like: a host array on the device by one plain copy, cast on the host; CuPy and NumPy pass through."""
    import cupy as cp

    from mpiml.linear_model._base import fitted_like

    rs = np.random.RandomState(3)
    for a in (rs.randn(3, 5), rs.randn(7), np.zeros((0, 4)), rs.randn(4)[::2]):
        for dtype in (np.float32, np.float64):
            got = fitted_like(a, cp, dtype)
            assert isinstance(got, cp.ndarray) and got.dtype == dtype and got.shape == a.shape
            np.testing.assert_array_equal(got.get(), a.astype(dtype))
    d = cp.arange(4.0)
    assert fitted_like(d, cp, np.float64) is d
    np.testing.assert_array_equal(fitted_like(np.arange(3.0), np, np.float32), np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_algebra_on_device_rows_same_bits(dtype, monkeypatch, direct_normal_routes):
    """Device fits solve the reduced Gram matrix in one compiled call (``_small_jit``): the NumPy path's bits
    of ``coef_`` and ``singular_`` (the Gram kernel is deterministic, so both see the same matrix)."""
    import cupy as cp

    from mpiml.linear_model import LinearRegression, Ridge, _lsq_direct
    from mpiml.linear_model import _small_jit as jit

    routes = direct_normal_routes
    rs = np.random.RandomState(5)
    X = cp.asarray((rs.randn(300_000, 64) * np.linspace(0.5, 3, 64) + 1.0).astype(dtype))
    y = cp.asarray((cp.asnumpy(X) @ rs.randn(64) + rs.randn(300_000)).astype(dtype))
    Y2 = cp.stack([y, 2 * y + 1], axis=1)
    cases = [(LinearRegression(), y), (Ridge(alpha=2.0), y), (LinearRegression(fit_intercept=False), y),
             (Ridge(alpha=[1.0, 1.0]), Y2), (LinearRegression(solver="normal"), Y2)]
    for est, target in cases:
        monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_DEVICE", False)
        ref = est.fit(X, target)
        want = (ref.coef_.get(), cp.asnumpy(cp.asarray(ref.intercept_)), ref.solver_,
                ref.singular_.copy() if hasattr(ref, "rank_") else None)
        monkeypatch.setattr(_lsq_direct, "_COMPILED_ON_DEVICE", True)
        got = est.fit(X, target)
        assert isinstance(got.coef_, cp.ndarray) and got.solver_ == want[2]
        np.testing.assert_array_equal(got.coef_.get(), want[0])
        np.testing.assert_array_equal(cp.asnumpy(cp.asarray(got.intercept_)), want[1])
        if want[3] is not None:
            np.testing.assert_array_equal(got.singular_, want[3])
    assert routes == [jit.NORMAL] * len(cases)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_augmented_gram_takes_a_1d_target(dtype):
    """A 1-d target is read in place as its one column (the fit's early launch passes ``y`` without a reshape)."""
    import cupy as cp

    from mpiml.kernels.linear import augmented_gram

    rs = np.random.RandomState(9)
    X = cp.asarray(rs.randn(5000, 10).astype(dtype))
    y = cp.asarray(rs.randn(5000).astype(dtype))
    np.testing.assert_array_equal(augmented_gram(X, y).get(), augmented_gram(X, y.reshape(-1, 1)).get())
    strided = cp.asarray(rs.randn(5000, 2).astype(dtype))[:, 1]     # not contiguous: copied first
    want = augmented_gram(X, cp.ascontiguousarray(strided).reshape(-1, 1)).get()
    np.testing.assert_array_equal(augmented_gram(X, strided).get(), want)
    w = cp.asarray(rs.uniform(0.5, 2.0, 5000).astype(dtype))
    np.testing.assert_array_equal(augmented_gram(X, y, w).get(), augmented_gram(X, y.reshape(-1, 1), w).get())
