"""PCA and TruncatedSVD on CuPy rows against the NumPy path (GPU host only), one process and 2 ranks."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("solver", ["covariance_eigh", "randomized", "full"])
def test_pca_on_cupy_matches_host(solver):
    import cupy as cp

    from mpiml.decomposition import PCA

    X = np.random.RandomState(0).randn(4000, 20) @ np.random.RandomState(1).randn(20, 20)
    h = PCA(n_components=5, svd_solver=solver, random_state=0).fit(X)
    g = PCA(n_components=5, svd_solver=solver, random_state=0).fit(cp.asarray(X))
    assert isinstance(g.components_, cp.ndarray)
    np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g.explained_variance_.get(), h.explained_variance_, rtol=1e-8)
    T = g.transform(cp.asarray(X))
    assert isinstance(T, cp.ndarray)
    np.testing.assert_allclose(T.get(), h.transform(X), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("algorithm", ["randomized", "arpack"])
def test_truncated_svd_on_cupy_matches_host(algorithm):
    import cupy as cp

    from mpiml.decomposition import TruncatedSVD

    X = np.abs(np.random.RandomState(2).randn(3000, 30))
    h = TruncatedSVD(n_components=4, algorithm=algorithm, random_state=0).fit(X)
    g = TruncatedSVD(n_components=4, algorithm=algorithm, random_state=0).fit(cp.asarray(X))
    np.testing.assert_allclose(g.singular_values_.get(), h.singular_values_, rtol=1e-6)
    np.testing.assert_allclose(np.abs(g.components_.get()), np.abs(h.components_), rtol=1e-5, atol=1e-7)


GPU_SPMD = """
import numpy as np, cupy as cp
import mpiml
from mpiml.comm import get_comm
from mpiml.decomposition import PCA, TruncatedSVD
from _spmd import assert_close, finish
mpiml.init(device="gpu")
comm = get_comm()
X = np.random.RandomState(0).randn(6000, 16) @ np.random.RandomState(1).randn(16, 16)
lo, hi = comm.rank * 6000 // comm.size, (comm.rank + 1) * 6000 // comm.size
ref = PCA(n_components=4, comm=mpiml.get_comm("self")).fit(X)
got = PCA(n_components=4).fit(cp.asarray(X[lo:hi]))
assert_close(got.components_, ref.components_, "PCA components on GPU shards", rtol=1e-6, atol=1e-8)
ref = TruncatedSVD(n_components=3, random_state=0, comm=mpiml.get_comm("self")).fit(X)
got = TruncatedSVD(n_components=3, random_state=0).fit(cp.asarray(X[lo:hi]))
assert_close(got.singular_values_, ref.singular_values_, "TruncatedSVD on GPU shards", rtol=1e-6)
finish(comm)
"""


@pytest.mark.mpi
def test_decomposition_on_two_gpus(mpi):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    mpi(None, 2, code=GPU_SPMD, timeout=180)


def test_sparse_cupyx_matches_scipy():
    """PCA (implicit centring) and TruncatedSVD on cupyx CSR equal the SciPy CSR results."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.decomposition import PCA, TruncatedSVD

    rs = np.random.RandomState(0)
    X = sp.random(3000, 60, density=0.1, random_state=rs, format="csr")
    X = sp.csr_matrix(X @ sp.diags(2.0 * 0.9 ** np.arange(60)))
    Xg = csp.csr_matrix(X)
    for solver in ("auto", "arpack", "covariance_eigh"):
        g = PCA(5, svd_solver=solver, random_state=0).fit(Xg)
        h = PCA(5, svd_solver=solver, random_state=0).fit(X)
        assert g._fit_svd_solver == h._fit_svd_solver and isinstance(g.components_, cp.ndarray)
        np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(g.explained_variance_ratio_.get(), h.explained_variance_ratio_, rtol=1e-8)
        T = g.transform(Xg)
        assert isinstance(T, cp.ndarray)
        np.testing.assert_allclose(T.get(), h.transform(X), rtol=1e-6, atol=1e-8)
    for algorithm in ("randomized", "arpack"):
        g = TruncatedSVD(5, algorithm=algorithm, random_state=0).fit(Xg)
        h = TruncatedSVD(5, algorithm=algorithm, random_state=0).fit(X)
        np.testing.assert_allclose(g.singular_values_.get(), h.singular_values_, rtol=1e-7)
        np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(g.explained_variance_ratio_.get(), h.explained_variance_ratio_, rtol=1e-7)
        np.testing.assert_allclose(g.transform(Xg).get(), h.transform(X), rtol=1e-6, atol=1e-8)
    g32 = TruncatedSVD(4, random_state=0).fit(Xg.astype(cp.float32))
    assert g32.components_.dtype == cp.float32
    np.testing.assert_allclose(g32.singular_values_.get(), TruncatedSVD(4, random_state=0).fit(X).singular_values_,
                               rtol=1e-4)
    with pytest.raises(TypeError, match='while "full" was passed'):
        PCA(3, svd_solver="full").fit(Xg)
    with pytest.raises(TypeError, match="dense data is required"):
        PCA(3).fit(Xg).score(Xg)


def test_pca_arpack_many_components_cupyx_sparse_equals_dense():
    """Ten components on a clustered spectrum: the cupyx CSR fit (implicit centring) equals the dense CuPy one
    and the host one (scikit-learn's test_pca_sparse asks rtol 1e-7)."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.decomposition import PCA

    rs = np.random.RandomState(5)
    X = sp.csr_matrix(sp.random(2000, 150, density=0.3, random_state=rs, format="csr")
                      @ sp.diags(rs.random_sample(150) * 10))
    s = PCA(10, svd_solver="arpack", random_state=0).fit(csp.csr_matrix(X))
    d = PCA(10, svd_solver="arpack", random_state=0).fit(cp.asarray(X.toarray()))
    h = PCA(10, svd_solver="arpack", random_state=0).fit(X)
    for name in ("components_", "explained_variance_", "singular_values_"):
        np.testing.assert_allclose(getattr(s, name).get(), getattr(d, name).get(), rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(getattr(s, name).get(), getattr(h, name), rtol=1e-7, atol=1e-12)
