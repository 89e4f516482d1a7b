"""KMeans on CuPy shards: the fused kernel against the NumPy path and scikit-learn (GPU host only)."""

import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(1000, 3, 5), (5000, 17, 40), (4097, 64, 64), (3000, 33, 12), (3000, 100, 300),
                                   (20000, 8, 1024)])
def test_fused_step_matches_host(n, d, k, dtype):
    import cupy as cp

    from mpiml.cluster import _gpu
    from mpiml.cluster import _kmeans_ops as ops

    rs = np.random.RandomState(0)
    Xh = (rs.randn(n, d) + 3 * rs.randint(0, 5, size=(n, 1))).astype(dtype)
    shift = Xh.mean(0).astype(dtype)
    Ch = (Xh[rs.choice(n, k, replace=False)] - shift).astype(dtype)
    w = rs.uniform(0.5, 2, n).astype(dtype)
    lab_h, md_h = np.full(n, -1, np.int32), np.empty(n, dtype)
    ph = ops.lloyd_step(Xh, w, shift, Ch, lab_h, md_h)
    lab, md = cp.full(n, -1, cp.int32), cp.empty(n, dtype)
    pd = _gpu.lloyd_step(cp.asarray(Xh), cp.asarray(w), cp.asarray(shift), cp.asarray(Ch), lab, md)
    agree = float((lab.get() == lab_h).mean())
    assert agree >= (1.0 if dtype == np.float64 else 0.999)
    tol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(md.get(), md_h, rtol=tol, atol=tol * float(md_h.max()))
    if agree == 1.0:
        np.testing.assert_allclose(pd.get()[:-1], ph[:-1], rtol=tol, atol=tol * np.abs(ph).max())
    labels, mind = _gpu.assign(cp.asarray(Xh), cp.asarray(shift), cp.asarray(Ch))
    assert bool((labels == lab).all())


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_kmeans_gpu_spmd(mpi, n):
    # ranks beyond the GPU count share GPUs (rank % devices): the results must not change
    mpi(os.path.join(HERE, "kmeans_gpu_script.py"), n, timeout=240)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("far", [False, True])
@pytest.mark.parametrize("d, k", [(40, 30), (16, 16), (5, 3), (24, 20)])
def test_device_loop_same_fit(dtype, far, d, k, monkeypatch):
    """Dense GPU fits keep the centres on the device and queue the next step before the host reads the
    iteration's scalars: the same centres, labels, inertia and iterations as the host's loop, bit for bit, for
    every kernel family (tensor-core, the small kernel's tensor-core and SIMT forms); with an empty cluster (a
    far initial centre) that iteration is relocated on the host from the step's labels computed again."""
    import cupy as cp

    from mpiml.cluster import KMeans
    from mpiml.cluster import _kmeans

    rs = np.random.RandomState(3)
    n = 6000
    X = (rs.randn(n, d) + 4 * rs.randint(0, 8, size=(n, 1))).astype(dtype)
    init = X[rs.choice(n, k, replace=False)].copy()
    if far:
        init[-1] += 1e4                           # no row is nearest: empty after the first step
    fits = []
    for device_loop in (False, True):
        monkeypatch.setattr(_kmeans, "_DEVICE_LOOP", device_loop)
        km = KMeans(k, init=init, n_init=1, max_iter=30, tol=1e-6).fit(cp.asarray(X))
        fits.append((cp.asnumpy(km.cluster_centers_), cp.asnumpy(km.labels_), km.inertia_, km.n_iter_))
    np.testing.assert_array_equal(fits[0][0], fits[1][0])
    np.testing.assert_array_equal(fits[0][1], fits[1][1])
    assert fits[0][2] == fits[1][2] and fits[0][3] == fits[1][3] and fits[0][3] > 1
    assert len(np.unique(fits[1][1])) == k
