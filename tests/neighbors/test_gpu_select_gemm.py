"""The GEMM route of mpiml.kernels.select.topk (cuBLAS tile + mpiml_knn_tile_select), GPU host.

Against the fused kernel (same neighbours, same order, ties included) and a NumPy brute force, and
identical results whatever the split of the index or of the queries (the promise of the fixed
GEMM shapes, see the docstring of ``topk``).
"""

import numpy as np
import pytest

from test_gpu_select import check_random, reference, ref_topk

pytestmark = pytest.mark.gpu

GEMM = ("sqeuclidean", "euclidean", "cosine", "inner_product")


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 64 queries x 2048 rows: many chunks and query batches on small data (the shape is still
    fixed for a whole test, as it is for every rank of a run)."""
    from mpiml.kernels import select

    monkeypatch.setattr(select, "_GEMM_QUERIES", 64)
    monkeypatch.setattr(select, "_GEMM_ROWS", 2048)


def _run(Q, X, k, metric, route):
    import cupy as cp

    from mpiml.kernels.select import topk

    d, i = topk(cp.asarray(Q), cp.asarray(X), k, metric=metric, route=route)
    return d.get(), i.get()


def _integer_data(d, m, nq, seed):
    """Small integers (exact dot products in float32 and float64), each row repeated many times (ties)."""
    rs = np.random.RandomState(seed)
    base = rs.randint(-2, 3, size=(40, d)).astype(np.float64)
    base[3] = 0  # a zero row (cosine: inverse norm 0)
    X = base[rs.randint(0, 40, size=m)]
    Q = np.concatenate([base[:10], rs.randint(-2, 3, size=(nq - 10, d))]).astype(np.float64)
    return Q, X


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", GEMM)
@pytest.mark.parametrize("k", [1, 10, 100, 1024])
@pytest.mark.parametrize("d", [256, 960])
def test_gemm_equals_fused_and_brute_force(small_tiles, d, k, metric, dtype):
    """Duplicated integer rows: the GEMM route's selection equals the fused kernel's (same rows, same
    order: ties to the lower row) and NumPy's; n_index is no multiple of the chunk, the queries no
    multiple of the batch."""
    Q, X = _integer_data(d, 2048 * 2 + 777, 150, seed=d + k)
    dg, ig = _run(Q.astype(dtype), X.astype(dtype), k, metric, "gemm")
    df, i_f = _run(Q.astype(dtype), X.astype(dtype), k, metric, "fused")
    assert dg.dtype == dtype and ig.dtype == np.int64 and ig.shape == (Q.shape[0], k)
    np.testing.assert_array_equal(ig, i_f)
    np.testing.assert_array_equal(dg, df)
    D = reference(Q, X, metric)
    rd, ri = ref_topk(D, k)
    if metric != "cosine":  # exact arithmetic: the same rows as NumPy
        np.testing.assert_array_equal(ig, ri)
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(dg, rd, rtol=rtol, atol=rtol * (np.abs(D).max() + 1))
    np.testing.assert_allclose(np.take_along_axis(D, ig, 1), rd, rtol=rtol, atol=rtol * (np.abs(D).max() + 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", GEMM)
@pytest.mark.parametrize("k", [1, 10, 100, 1024])
def test_gemm_random_against_numpy(small_tiles, monkeypatch, metric, dtype, k):
    """Random rows (the route forced for route="auto" at d = 256): the chosen rows are the k nearest."""
    from mpiml.kernels import select

    monkeypatch.setattr(select, "_GEMM_MIN_D", {4: 1, 8: 1})
    rs = np.random.RandomState(k)
    X, Q = rs.randn(2048 * 2 + 333, 256), rs.randn(100, 256)
    check_random(Q, X, k, metric, dtype)


def test_gemm_unaligned_rows_and_views(small_tiles):
    """d not a multiple of 16 bytes (zero columns pad the GEMM) and X a view off a 256-byte boundary
    (every chunk staged): the same answers as the fused kernel and as the aligned, in-place case."""
    import cupy as cp

    from mpiml.kernels.select import topk

    for d in (259, 256):
        Q, X = _integer_data(d, 5000, 70, seed=d)
        for dtype in (np.float32, np.float64):
            ref = _run(Q.astype(dtype), X.astype(dtype), 17, "sqeuclidean", "fused")
            Qd = cp.asarray(Q.astype(dtype))
            flat = cp.zeros(X.size + 8, dtype=dtype)
            Xoff = flat[8:].reshape(X.shape)  # starts 8 elements into an allocation
            Xoff[...] = cp.asarray(X.astype(dtype))
            assert Xoff.data.ptr % 256 != 0
            for Xv in (cp.asarray(X.astype(dtype)), Xoff):
                dist, idx = topk(Qd, Xv, 17, metric="sqeuclidean", route="gemm")
                np.testing.assert_array_equal(idx.get(), ref[1])
                np.testing.assert_array_equal(dist.get(), ref[0])


def _split_search(Q, X, bounds, k, metric):
    """topk of every part of the index (each its own allocation, as a rank's block), the candidates
    merged by (selection value, global row) as the ring merges them.  The selection values are what
    the route promises to compute the same way in any tile; the ring's euclidean distances are then
    recomputed from differences for the chosen rows."""
    import cupy as cp

    from mpiml.kernels.select import topk
    from mpiml.neighbors._ring import merge_topk

    state = (None, None, None)
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = cp.ascontiguousarray(X[a:b])
        d, i = topk(Q, part, min(k, b - a), metric=metric)
        state = merge_topk(*state, d, i + a, None, k, cp)
    return state[0].get(), state[1].get()


@pytest.mark.parametrize("tiles", ["real", "small"])
@pytest.mark.parametrize("metric,dtype,d", [("sqeuclidean", np.float32, 960), ("cosine", np.float32, 960),
                                            ("inner_product", np.float64, 256), ("sqeuclidean", np.float64, 300)])
def test_identical_whatever_the_split(monkeypatch, tiles, metric, dtype, d):
    """Random float rows (rounding matters): the index in 1, 2 or 3 parts and the queries in 1 or 2
    batches give bit-identical distances and rows."""
    import cupy as cp

    from mpiml.kernels import select

    if tiles == "small":
        monkeypatch.setattr(select, "_GEMM_QUERIES", 64)
        monkeypatch.setattr(select, "_GEMM_ROWS", 2048)
    rows = select._GEMM_ROWS
    m = 2 * rows + 4321
    rs = np.random.RandomState(d)
    X = cp.asarray(rs.randn(m, d).astype(dtype))
    Q = cp.asarray(rs.randn(300, d).astype(dtype))
    k = 10
    assert select.gemm_plan(dtype, k, metric, d) is not None
    whole = _split_search(Q, X, [0, m], k, metric)
    for bounds in ([0, rows // 2 + 1001, m], [0, 777, rows + 3333, m]):
        got = _split_search(Q, X, bounds, k, metric)
        np.testing.assert_array_equal(got[1], whole[1])
        np.testing.assert_array_equal(got[0], whole[0])
    parts = [_split_search(Q[a:b], X, [0, m], k, metric) for a, b in ((0, 123), (123, 300))]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), whole[1])
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), whole[0])


def test_float32_without_tf32():
    """float32 dot products keep float32's 24 bits: rows 1 + a 2^-12 (a = j mod 7) against a query of
    ones give 960 (1 + a 2^-12) exactly (every partial sum fits 22 bits); TF32 (10 bits) would round
    every row to 1, all values to -960, and pick rows 0..4 by the tie rule."""
    import cupy as cp

    from mpiml.kernels.select import topk

    a = np.arange(3000) % 7
    X = np.repeat((1 + a * 2.0 ** -12)[:, None], 960, axis=1).astype(np.float32)
    Q = np.ones((3, 960), dtype=np.float32)
    d, i = topk(cp.asarray(Q), cp.asarray(X), 5, metric="inner_product", route="gemm")
    np.testing.assert_array_equal(i.get(), np.tile([6, 13, 20, 27, 34], (3, 1)))
    np.testing.assert_array_equal(d.get(), np.full((3, 5), -960 * (1 + 6 * 2.0 ** -12), dtype=np.float32))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3])
def test_estimator_identical_at_any_rank_count(mpi, n):
    """NearestNeighbors on wide rows (the GEMM route) at 1, 2, 3 ranks (sharing GPUs if need be): the
    answer of one process with the whole index."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    mpi(os.path.join(here, "neighbors_gemm_gpu_script.py"), n, timeout=300)
