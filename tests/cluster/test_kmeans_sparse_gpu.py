"""KMeans on cupyx.scipy.sparse CSR rows (mpiml.cluster._kmeans_sparse_gpu).

The module is written once for both namespaces, so its arithmetic is checked here on SciPy CSR
with NumPy against the host path of ``_kmeans_ops`` (which every CPU test covers); the GPU tests
(marked ``gpu``) run the estimator on cupyx CSR and compare with the same fit on SciPy CSR.
"""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from mpiml.cluster import _kmeans_ops as ops
from mpiml.cluster import _kmeans_sparse_gpu as sgpu

HERE = os.path.dirname(os.path.abspath(__file__))


def _rows(n=700, d=40, density=0.1, seed=0, dtype=np.float64):
    rs = np.random.RandomState(seed)
    X = sp.random(n, d, density=density, format="csr", random_state=rs, dtype=dtype)
    C = rs.rand(6, d).astype(dtype) * 0.3
    return X, C


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch_size", [None, 97])
def test_sparse_module_equals_host_path(dtype, batch_size):
    X, C = _rows(dtype=dtype)
    w = np.random.RandomState(1).rand(X.shape[0]).astype(dtype)
    zero = np.zeros(X.shape[1], dtype=dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    lab_h, mind_h, _ = ops.assign(X, zero, C)
    lab_s, mind_s = sgpu.assign(X, zero, C, batch_size=batch_size)
    assert lab_s.dtype == np.int32 and mind_s.dtype == dtype
    np.testing.assert_array_equal(lab_s, lab_h)
    np.testing.assert_allclose(mind_s, mind_h, **tol)
    np.testing.assert_allclose(sgpu.euclidean_distances(X, zero, C, batch_size=batch_size),
                               ops.euclidean_distances(X, zero, C), **tol)
    np.testing.assert_allclose(sgpu.sq_distances(X[:50], C), ops.sq_distances(X[:50], C), **tol)
    labels_h = np.full(X.shape[0], -1, np.int32)
    labels_s = labels_h.copy()
    labels_s[::3] = lab_h[::3]  # some rows keep their label: "changed" counts only the others
    labels_h[::3] = lab_h[::3]
    mind_a, mind_b = np.empty(X.shape[0], dtype), np.empty(X.shape[0], dtype)
    packed_h = ops.lloyd_step(X, w, zero, C, labels_h, mind_a)
    packed_s = sgpu.lloyd_step(X, w, zero, C, labels_s, mind_b, batch_size=batch_size)
    assert packed_s.dtype == np.float64 and packed_s.shape == packed_h.shape
    np.testing.assert_allclose(packed_s, packed_h, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    assert packed_s[-1] == packed_h[-1] == np.count_nonzero(np.arange(X.shape[0]) % 3)
    np.testing.assert_array_equal(labels_s, labels_h)


def test_dispatch_hook_picks_the_sparse_gpu_module_only_for_cupyx():
    X, _ = _rows()
    assert ops._sparse_gpu(X) is None and ops.is_sparse(X)
    assert ops._sparse_gpu(np.zeros((2, 2))) is None and not ops.is_sparse(np.zeros((2, 2)))



def _gpu_data(n=3000, d=300, seed=0):
    rs = np.random.RandomState(seed)
    centres = sp.random(5, d, density=0.2, random_state=rs, format="csr").toarray() * 5
    labels = rs.randint(0, 5, n)
    noise = sp.random(n, d, density=0.03, random_state=rs, format="csr")
    X = sp.csr_matrix(centres[labels] * (rs.rand(n, d) < 0.5)) + noise
    return X.tocsr()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_kmeans_on_cupyx_csr_equals_scipy(dtype):
    import cupy
    import cupyx.scipy.sparse as csp

    from mpiml.cluster import KMeans
    from mpiml.comm import get_comm

    X = _gpu_data().astype(dtype)
    Xg = csp.csr_matrix(X)
    init = X[:5].toarray()
    one = get_comm("self")
    cpu = KMeans(5, init=init, n_init=1, max_iter=20, comm=one).fit(X)
    gpu = KMeans(5, init=init, n_init=1, max_iter=20, comm=one).fit(Xg)
    assert isinstance(gpu.cluster_centers_, cupy.ndarray) and isinstance(gpu.labels_, cupy.ndarray)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gpu.cluster_centers_.get(), cpu.cluster_centers_, rtol=tol, atol=tol)
    np.testing.assert_array_equal(gpu.labels_.get(), cpu.labels_)
    assert gpu.inertia_ == pytest.approx(cpu.inertia_, rel=tol)
    assert gpu.n_iter_ == cpu.n_iter_
    np.testing.assert_array_equal(gpu.predict(Xg[:500]).get(), cpu.predict(X[:500]))
    np.testing.assert_allclose(gpu.transform(Xg[:500]).get(), cpu.transform(X[:500]), rtol=tol, atol=tol)
    assert gpu.score(Xg) == pytest.approx(cpu.score(X), rel=tol)
    # every init method runs on the sparse GPU rows and gives a comparable clustering
    for method in ("k-means++", "random", "k-means||"):
        g = KMeans(5, init=method, random_state=0, max_iter=30, comm=one).fit(Xg)
        c = KMeans(5, init=method, random_state=0, max_iter=30, comm=one).fit(X)
        assert g.inertia_ == pytest.approx(c.inertia_, rel=0.05), method
    # partial_fit (mini-batch steps) on sparse GPU rows
    pf = KMeans(5, init=init, comm=one)
    for s in range(0, X.shape[0], 1000):
        pf.partial_fit(Xg[s:s + 1000])
    assert pf.cluster_centers_.shape == (5, X.shape[1]) and pf.n_steps_ == 3


@pytest.mark.gpu
@pytest.mark.mpi
def test_gpu_sparse_kmeans_two_ranks_one_gpu(mpi):
    mpi(os.path.join(HERE, "kmeans_sparse_gpu_script.py"), 2, timeout=180)
