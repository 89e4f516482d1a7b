"""PCA "covariance_eigh" on dense rows: mean and covariance from one read of X (the Gram of [X | 1])."""

import numpy as np
import pytest
from sklearn.decomposition import PCA as SkPCA

from mpiml.decomposition import PCA


@pytest.mark.parametrize("offset", [0.0, 5.0, 1e4])
def test_one_pass_covariance_matches_scikit_learn(offset):
    rs = np.random.RandomState(0)
    X = rs.randn(3000, 12) @ rs.randn(12, 12) + offset  # offset 1e4: the centred second pass
    ours = PCA(4, svd_solver="covariance_eigh").fit(X)
    ref = SkPCA(4, svd_solver="covariance_eigh").fit(X)
    np.testing.assert_allclose(ours.mean_, ref.mean_, rtol=1e-12)
    # the exact spectrum, from the centred rows (scikit-learn's uncentred float64 form cancels ~7 digits at 1e4)
    exact = np.linalg.eigvalsh(np.cov(X.T))[::-1][:4]
    np.testing.assert_allclose(ours.explained_variance_, exact, rtol=1e-10)
    np.testing.assert_allclose(ours.explained_variance_, ref.explained_variance_, rtol=1e-8 if offset < 1e3 else 1e-6)
    np.testing.assert_allclose(np.abs(ours.components_), np.abs(ref.components_), atol=1e-7)
    assert PCA(4).fit(X)._fit_svd_solver == "covariance_eigh"


@pytest.mark.gpu
@pytest.mark.parametrize("d", [16, 200])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_pass_covariance_on_the_gpu(d, dtype):
    import cupy as cp

    rs = np.random.RandomState(1)
    X = (rs.randn(50_000, d) @ rs.randn(d, d) * 0.1 + 3.0).astype(dtype)
    g = PCA(8).fit(cp.asarray(X))
    h = PCA(8).fit(X)
    assert g._fit_svd_solver == "covariance_eigh" and isinstance(g.components_, cp.ndarray)
    np.testing.assert_allclose(g.explained_variance_.get(), h.explained_variance_, rtol=1e-5)
    np.testing.assert_allclose(g.mean_.get(), h.mean_, rtol=1e-6)
    np.testing.assert_allclose(np.abs(g.components_.get()), np.abs(h.components_), atol=1e-4)
