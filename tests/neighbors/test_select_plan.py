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
    for name in ("mpiml_knn_select", "mpiml_knn_merge", "mpiml_knn_norms", "mpiml_knn_exact_sq", "mpiml_knn_tile_select"):
        assert name in src


# ---------------------------------------------------------------------- the GEMM route
@pytest.mark.parametrize("metric", select.GEMM_METRICS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_route_from_the_threshold_on(metric, dtype):
    lo = select._GEMM_MIN_D[np.dtype(dtype).itemsize]
    assert select.gemm_plan(dtype, 10, metric, lo - 1) is None
    assert select.gemm_plan(dtype, 10, metric, lo) is not None
    assert select.gemm_plan(dtype, 10, metric, 960) is not None
    assert select.gemm_plan(dtype, 10, metric, 32) is None


def test_gemm_threshold_by_dtype():
    """The measured crossover (one H100): float32 from d = 192, float64 (DGEMM on the FP64 tensor
    cores) from d = 128; below, the fused kernel."""
    assert select.gemm_plan(np.float32, 10, "euclidean", 128) is None
    assert select.gemm_plan(np.float32, 10, "euclidean", 192) is not None
    assert select.gemm_plan(np.float64, 10, "euclidean", 127) is None
    assert select.gemm_plan(np.float64, 10, "euclidean", 128) is not None


@pytest.mark.parametrize("metric", ["manhattan", "chebyshev", "minkowski"])
def test_gemm_route_only_for_gemm_forms(metric):
    assert select.gemm_plan(np.float32, 10, metric, 960) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 10, 100, 257, 1000, 1024])
@pytest.mark.parametrize("d", [256, 300, 961, 960, 2048])
def test_gemm_plan_shapes(dtype, k, d):
    dtype = np.dtype(dtype)
    gp = select.gemm_plan(dtype, k, "sqeuclidean", d)
    # 16-byte rows: the GEMM's inner dimension covers d and is a multiple of 16 bytes
    assert gp["dp"] >= d and gp["dp"] * dtype.itemsize % 16 == 0 and gp["dp"] - d < 16 // dtype.itemsize
    # whole chunks start on 256-byte boundaries when X does
    assert gp["rows"] * gp["dp"] * dtype.itemsize % 256 == 0
    # the splits cover the tile's columns in 128-column steps, none empty
    assert gp["split_cols"] % 128 == 0
    assert (gp["splits"] - 1) * gp["split_cols"] < gp["rows"] <= gp["splits"] * gp["split_cols"]
    assert 1 <= gp["splits"] <= select._TS_SPLITS
    assert gp["split_cols"] >= min(gp["rows"], 8 * k) or gp["splits"] == 1
    # one block's lists fit the default shared memory (k up to MAX_K, float64 included)
    assert gp["smem"] <= 48 * 1024
    assert gp["tile_bytes"] <= 256 << 20


def test_gemm_shape_does_not_depend_on_the_problem_size():
    """What sets the GEMM's shape is (d, dtype) only: the query and row counts differ between ranks."""
    import inspect

    assert list(inspect.signature(select.gemm_plan).parameters) == ["dtype", "k", "metric", "d"]
    a, b = select.gemm_plan(np.float32, 1, "cosine", 960), select.gemm_plan(np.float32, 1024, "euclidean", 960)
    assert (a["queries"], a["rows"], a["dp"]) == (b["queries"], b["rows"], b["dp"])


def _nvrtc_available():
    from mpiml.kernels import _loader

    try:
        return 90 in _loader._CtypesNVRTC().archs()
    except OSError:
        return False


@pytest.mark.skipif(not _nvrtc_available(), reason="no NVRTC library")
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_gemm_route_kernels_compile(arch):
    """Every instantiation the GEMM route launches (scripts/nvrtc_check.py's compile, no GPU)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exprs = []
    for ct in ("float", "double"):
        exprs += [f"mpiml_knn_tile_select<{ct}, {mode}>" for mode in (0, 1, 2)]
        exprs += [f"mpiml_knn_merge<{ct}>", f"mpiml_knn_norms<{ct}, 0>", f"mpiml_knn_norms<{ct}, 1>"]
    cmd = [sys.executable, os.path.join(root, "scripts", "nvrtc_check.py"),
           os.path.join(root, "src", "mpiml", "kernels", "select", "select.cu"), "--arch", arch]
    for e in exprs:
        cmd += ["--expr", e]
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src"))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith(f"ok: ") and all(e in out.stdout for e in exprs)
    assert "warning" not in (out.stdout + out.stderr).lower()
