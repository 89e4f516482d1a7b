"""Linear models on CuPy shards against the NumPy path and scikit-learn (GPU host only)."""

import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

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
@pytest.mark.parametrize("n", [1, 2, 4])
def test_linear_gpu_spmd(mpi, n):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    mpi(os.path.join(HERE, "linear_gpu_script.py"), n, timeout=240)
