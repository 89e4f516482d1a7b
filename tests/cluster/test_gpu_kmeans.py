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
