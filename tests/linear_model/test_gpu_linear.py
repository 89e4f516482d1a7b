"""Linear models on CuPy shards against the NumPy path and scikit-learn (GPU host only)."""

import numpy as np
import pytest

from . import _launches

pytestmark = pytest.mark.gpu


def test_one_gpu_matches_host():
    import cupy as cp
    from sklearn.datasets import make_classification

    from mpiml.linear_model import LinearRegression, LogisticRegression

    X, y = make_classification(n_samples=3000, n_features=10, random_state=0)
    for solver in ("normal", "tsqr"):
        g = LinearRegression(solver=solver).fit(cp.asarray(X), cp.asarray(y.astype(float)))
        h = LinearRegression(solver=solver).fit(X, y.astype(float))
        np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-10, atol=1e-12)
    g = LogisticRegression(tol=1e-10).fit(cp.asarray(X), cp.asarray(y))
    h = LogisticRegression(tol=1e-10).fit(X, y)
    np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-7)
    assert isinstance(g.predict(cp.asarray(X)), cp.ndarray)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_linear_gpu_spmd(tmp_path_factory, n):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    _launches.gpu_launches(tmp_path_factory).verdict(n, "linear_gpu")   # linear_gpu_script.py (_launches.py)


def test_sparse_cupyx_matches_scipy():
    """cupyx CSR shards give the SciPy CSR results (every solver), outputs on the device."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

    rs = np.random.RandomState(0)
    X = sp.random(2000, 40, density=0.1, random_state=rs, format="csr")
    X.data += 0.5
    y = X @ rs.randn(40) + 0.1 * rs.randn(2000) + 1.0
    w = rs.uniform(0.5, 2.0, 2000)
    Xg, yg, wg = csp.csr_matrix(X), cp.asarray(y), cp.asarray(w)
    for solver in ("normal", "tsqr", "lsqr"):
        g = LinearRegression(solver=solver, tol=1e-12).fit(Xg, yg, sample_weight=wg)
        h = LinearRegression(solver=solver, tol=1e-12).fit(X, y, sample_weight=w)
        assert isinstance(g.coef_, cp.ndarray)
        np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-8, atol=1e-10)
        pred = g.predict(Xg)
        assert isinstance(pred, cp.ndarray)
        np.testing.assert_allclose(pred.get(), h.predict(X), rtol=1e-8, atol=1e-8)
    for solver in ("cholesky", "svd", "lsqr", "sparse_cg"):
        g = Ridge(alpha=2.0, solver=solver, tol=1e-12).fit(Xg, cp.stack([yg, -yg], axis=1))
        h = Ridge(alpha=2.0, solver=solver, tol=1e-12).fit(X, np.c_[y, -y])
        np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-8, atol=1e-10)
    g = Ridge(alpha=2.0, positive=True).fit(Xg, yg)
    np.testing.assert_allclose(g.coef_.get(), Ridge(alpha=2.0, positive=True).fit(X, y).coef_, rtol=1e-8, atol=1e-10)
    g32 = Ridge(alpha=2.0).fit(Xg.astype(cp.float32), yg.astype(cp.float32))
    assert g32.coef_.dtype == cp.float32
    np.testing.assert_allclose(g32.coef_.get(), Ridge(alpha=2.0).fit(X, y).coef_, rtol=1e-4, atol=1e-5)
    labels = np.digitize(np.asarray(X[:, :3].sum(axis=1)).ravel(), [0.8, 1.3])  # 3 classes
    for solver in ("lbfgs", "newton-cholesky", "newton-cg"):
        g = LogisticRegression(solver=solver, tol=1e-10, max_iter=300).fit(Xg, cp.asarray(labels))
        h = LogisticRegression(solver=solver, tol=1e-10, max_iter=300).fit(X, labels)
        np.testing.assert_allclose(g.coef_.get(), h.coef_, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(g.predict_proba(Xg).get(), h.predict_proba(X), rtol=1e-6, atol=1e-9)
    for fmt in ("csc", "coo"):
        g = LinearRegression().fit(Xg.asformat(fmt), yg)
        np.testing.assert_allclose(g.coef_.get(), LinearRegression().fit(X, y).coef_, rtol=1e-9, atol=1e-12)
    with pytest.raises(TypeError, match="dense data is required"):
        LinearRegression(positive=True).fit(Xg, yg)
