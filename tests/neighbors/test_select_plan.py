"""The launch plan of the fused selection kernel (pure Python; no GPU needed)."""

import numpy as np
import pytest

from mpiml.kernels import select


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 10, 32, 100, 257, 1000, 1024])
@pytest.mark.parametrize("nq,m", [(1, 1024), (10_000, 4_000_000), (3, 5), (100_000, 2000), (70, 1500)])
def test_plan_covers_the_index(dtype, k, nq, m):
    if k > m:
        pytest.skip("k above the rows")
    tm, ty, splits, split_rows, smem = select.plan(dtype, k, "sqeuclidean", nq, m, 132)
    assert (tm, ty) in select._CONFIGS
    assert split_rows % select._NT == 0
    assert (splits - 1) * split_rows < m <= splits * split_rows  # every split holds rows
    assert smem <= select._SMEM_MAX
    assert 1 <= splits <= 256
    if np.dtype(dtype).itemsize == 8:
        assert tm < 4


def test_plan_fills_the_gpu():
    # few queries: the index is split so that the grid has several blocks an SM
    tm, ty, splits, _, _ = select.plan(np.float32, 10, "sqeuclidean", 10_000, 4_000_000, 132)
    assert -(-10_000 // (tm * ty)) * splits >= 4 * 132
    # a large k takes fewer queries a block
    assert select.plan(np.float32, 1000, "sqeuclidean", 10_000, 4_000_000, 132)[:2] == (1, 8)


def test_kernel_source_is_packaged():
    from importlib import resources

    src = resources.files("mpiml.kernels.select").joinpath("select.cu").read_text()
    for name in ("mpiml_knn_select", "mpiml_knn_merge", "mpiml_knn_norms", "mpiml_knn_exact_sq"):
        assert name in src
