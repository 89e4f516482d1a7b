"""The compiled CPU k-NN selection (mpiml.neighbors._cpu) against a full sort of exact distances."""

import numpy as np
import pytest

from mpiml.neighbors import _cpu, _ring

EXACT = ("euclidean", "sqeuclidean", "manhattan", "chebyshev", "minkowski")


def _reference(Q, X, k, metric, p):
    """Every distance from differences in float64, ordered by (distance, index)."""
    Q64, X64 = Q.astype(np.float64), X.astype(np.float64)
    diff = np.abs(Q64[:, None, :] - X64[None, :, :])
    if metric in ("euclidean", "sqeuclidean"):
        D = (diff * diff).sum(axis=2)
        D = np.sqrt(D) if metric == "euclidean" else D
    elif metric == "manhattan":
        D = diff.sum(axis=2)
    elif metric == "chebyshev":
        D = diff.max(axis=2)
    elif metric == "minkowski":
        D = (diff ** p).sum(axis=2) ** (1.0 / p)
    else:
        nq, nx = np.linalg.norm(Q64, axis=1), np.linalg.norm(X64, axis=1)
        D = 1.0 - (Q64 @ X64.T) / np.outer(np.where(nq > 0, nq, 1), np.where(nx > 0, nx, 1))
        D[nq == 0, :] = 1.0
        D[:, nx == 0] = 1.0
        D = np.maximum(D, 0)
    order = np.lexsort((np.broadcast_to(np.arange(X.shape[0]), D.shape), D), axis=1)[:, :k]
    return np.take_along_axis(D, order, axis=1), order


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("metric", EXACT)
@pytest.mark.parametrize("k", [1, 7, 300])
def test_exact_ties_to_the_lower_index(metric, dtype, k):
    # small integers: every distance is exact and ties are everywhere
    rng = np.random.default_rng(3)
    X = rng.integers(0, 3, size=(300, 4)).astype(dtype)  # not a multiple of the index block
    Q = np.vstack([X[:5], rng.integers(0, 3, size=(38, 4))]).astype(dtype)  # queries equal to index rows
    p = 3.0 if metric == "minkowski" else None
    d, i = _cpu.topk(Q, X, k, metric, p)
    want_d, want_i = _reference(Q, X, k, metric, p)
    assert d.dtype == dtype and i.dtype == np.int64 and d.shape == (43, k)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(d, want_d.astype(dtype), rtol=1e-6)
    if metric in ("euclidean", "sqeuclidean", "manhattan", "chebyshev"):
        np.testing.assert_array_equal(d, want_d.astype(dtype))
    assert (d[:5, 0] == 0).all()


@pytest.mark.parametrize("metric", list(_cpu.METRICS))
def test_same_as_numpy_path_on_continuous_data(metric, monkeypatch):
    rng = np.random.default_rng(0)
    X, Q = rng.normal(size=(700, 9)), rng.normal(size=(50, 9))
    X[3] = 0.0  # a zero row (cosine: distance 1)
    Q[7] = 0.0  # a zero query (cosine: every distance 1, the lowest indices)
    p = 1.5 if metric == "minkowski" else None
    d, i = _ring.local_topk(Q, X, 10, metric, np, p)
    monkeypatch.setenv("MPIML_CPU_KERNELS", "0")
    d0, i0 = _ring.local_topk(Q, X, 10, metric, np, p)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_allclose(d, d0, rtol=1e-9, atol=1e-12)
    want_d, want_i = _reference(Q, X, 10, metric, p)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_allclose(d, want_d, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
def test_screen_keeps_the_exact_answer_far_from_the_origin(metric, dtype):
    # rows far from the origin: |q|^2 + |x|^2 - 2 q.x cancels badly; the screen's bound must still let the
    # true neighbours through, and their distances are measured from differences
    rng = np.random.default_rng(5)
    X = (1e3 + rng.normal(size=(3000, 6))).astype(dtype)
    Q = np.vstack([X[[10, 2999]], 1e3 + rng.normal(size=(40, 6))]).astype(dtype)
    d, i = _cpu.topk(Q, X, 5, metric)
    want_d, want_i = _reference(Q, X, 5, metric, None)
    if metric != "cosine":  # cosine of near-parallel rows is at the rounding level: no unique answer
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_array_equal(d[:2, 0], [0, 0])
    np.testing.assert_allclose(d, want_d.astype(dtype), rtol=1e-5, atol=1e-7)


def test_thread_count_changes_nothing():
    import numba

    rng = np.random.default_rng(1)
    X, Q = rng.normal(size=(1000, 5)), rng.normal(size=(101, 5))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _cpu.topk(Q, X, 5, "euclidean")
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = _cpu.topk(Q, X, 5, "euclidean")
    finally:
        numba.set_num_threads(before)
    for a, b in zip(one, many):
        np.testing.assert_array_equal(a, b)


def test_edges():
    X = np.arange(12.0).reshape(6, 2)
    d, i = _cpu.topk(np.empty((0, 2)), X, 3)
    assert d.shape == (0, 3) and i.shape == (0, 3)
    d, i = _cpu.topk(X[:1], X, 6)  # k = every row
    np.testing.assert_array_equal(i[0], np.arange(6))
    with pytest.raises(ValueError, match="k must be"):
        _cpu.topk(X, X, 7)
    with pytest.raises(ValueError, match="unknown metric"):
        _cpu.topk(X, X, 1, "hamming")


@pytest.mark.parametrize("scale", [1.0, 1e-41, 1e30, 1e20])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine"])
def test_float32_screen_gives_the_float64_answer(metric, scale, monkeypatch):
    # float64 rows are screened in float32: the same neighbours and distances as the float64 screen, with rows
    # near ties (a grid plus tiny offsets), rows in float32's subnormal range (1e-41) and rows whose squares
    # overflow float32 (1e20, 1e30: screened in float64 instead)
    rng = np.random.default_rng(11)
    X = rng.integers(0, 4, size=(2000, 5)) + rng.normal(scale=1e-9, size=(2000, 5))
    Q = np.vstack([X[:7], rng.integers(0, 4, size=(60, 5)) + rng.normal(scale=1e-9, size=(60, 5))])
    X, Q = X * scale, Q * scale
    got = _cpu.topk(Q, X, 9, metric)
    monkeypatch.setenv("MPIML_KNN_SCREEN", "float64")
    want = _cpu.topk(Q, X, 9, metric)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    if metric != "cosine":
        ref_d, ref_i = _reference(Q, X, 9, metric, None)
        np.testing.assert_array_equal(got[1], ref_i)
        np.testing.assert_allclose(got[0], ref_d, rtol=1e-12)


def test_query_blocks_are_equal_runs_of_the_threads():
    for nq in (1, 15, 16, 100, 2000, 2500, 20000):
        for threads in (1, 2, 8, 64):
            b = _cpu._query_blocks(nq, threads)
            assert 1 <= b <= nq
            assert b == nq or b % threads == 0
            assert -(-nq // b) <= _cpu._TILE_QUERIES or b == nq


def test_query_bounds_cover_the_queries_large_blocks_first():
    for nq in (1, 15, 16, 100, 2000, 2500, 20000, 40000):
        for threads in (1, 2, 8, 64):
            b = _cpu._query_bounds(nq, threads)
            sizes = np.diff(b)
            assert b[0] == 0 and b[-1] == nq and (sizes > 0).all()
            assert (np.diff(sizes[:-1]) <= 0).all()            # never larger later (the last takes what is left)
            assert sizes.max() <= max(_cpu._TILE_QUERIES, -(-nq // _cpu._query_blocks(nq, threads)))


@pytest.mark.parametrize("fused", [True, False])
def test_block_sizes_do_not_change_the_answer(monkeypatch, fused):
    rng = np.random.default_rng(7)
    X, Q = rng.normal(size=(3000, 5)), rng.normal(size=(900, 5))
    monkeypatch.setattr(_cpu, "FUSED", fused)
    got = _cpu.topk(Q, X, 7)
    # blocks of rows (BLAS tiles) or of groups of queries (fused): uneven, one of a single unit
    monkeypatch.setattr(_cpu, "_query_bounds", lambda n, threads, most=None: np.array(
        [0, 5, n // 2, n // 2 + 1, n], dtype=np.int64))
    want = _cpu.topk(Q, X, 7)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_static_schedule_gives_the_same_answer(monkeypatch):
    rng = np.random.default_rng(6)
    X, Q = rng.normal(size=(4000, 7)), rng.normal(size=(700, 7))
    got = _cpu.topk(Q, X, 6)
    monkeypatch.setenv("MPIML_CPU_SCHEDULE", "static")
    want = _cpu.topk(Q, X, 6)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
