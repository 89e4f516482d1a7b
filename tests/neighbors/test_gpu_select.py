"""The fused distance + k-selection kernel (mpiml.kernels.select) against a NumPy brute force (GPU host)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

METRICS = ("sqeuclidean", "euclidean", "cosine", "inner_product", "manhattan", "chebyshev", "minkowski")


def reference(Q, X, metric, p=3.0):
    """(n, m) selection values in float64, as the kernel defines them."""
    Q, X = Q.astype(np.float64), X.astype(np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        D = np.maximum((Q * Q).sum(1)[:, None] + (X * X).sum(1)[None, :] - 2 * Q @ X.T, 0)
        return np.sqrt(D) if metric == "euclidean" else D
    if metric == "cosine":
        nq, nx = np.linalg.norm(Q, axis=1), np.linalg.norm(X, axis=1)
        iq, ix = np.where(nq > 0, 1 / np.where(nq > 0, nq, 1), 0), np.where(nx > 0, 1 / np.where(nx > 0, nx, 1), 0)
        return np.maximum(1 - (Q @ X.T) * iq[:, None] * ix[None, :], 0)
    if metric == "inner_product":
        return -(Q @ X.T)
    diff = np.abs(Q[:, None, :] - X[None, :, :])
    if metric == "manhattan":
        return diff.sum(2)
    if metric == "chebyshev":
        return diff.max(2) if X.shape[1] else np.zeros((Q.shape[0], X.shape[0]))
    return (diff ** p).sum(2) ** (1 / p)


def ref_topk(D, k):
    order = np.lexsort((np.broadcast_to(np.arange(D.shape[1]), D.shape), D), axis=1)[:, :k]
    return np.take_along_axis(D, order, 1), order


def run(Q, X, k, metric, p=3.0):
    import cupy as cp

    from mpiml.kernels.select import topk

    d, i = topk(cp.asarray(Q), cp.asarray(X), k, metric=metric, p=p if metric == "minkowski" else None)
    return d.get(), i.get()


def check_random(Q, X, k, metric, dtype):
    D = reference(Q, X, metric)
    rd, ri = ref_topk(D, k)
    d, i = run(Q.astype(dtype), X.astype(dtype), k, metric)
    assert d.dtype == dtype and i.dtype == np.int64 and d.shape == (Q.shape[0], k)
    # every row a valid, distinct index, listed by non-decreasing distance
    assert ((i >= 0) & (i < X.shape[0])).all()
    assert all(len(set(r)) == k for r in i)
    assert (np.diff(d, axis=1) >= 0).all()
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    scale = np.abs(D).max() + 1
    # the chosen rows are the k nearest (their true distances are the reference's k smallest)
    true = np.sort(np.take_along_axis(D, i, 1), axis=1)
    np.testing.assert_allclose(true, rd, rtol=rtol, atol=rtol * scale)
    np.testing.assert_allclose(d, rd, rtol=rtol, atol=rtol * scale)
    if dtype == np.float64:
        # rows whose k + 1 nearest are well apart have one answer; elsewhere (e.g. cosine in one
        # dimension: every distance 0 or 2) rounding orders mathematically equal distances
        near = np.sort(D, axis=1)[:, :k + 1]
        apart = (np.diff(near, axis=1) > 1e-9 * scale).all(axis=1)
        np.testing.assert_array_equal(i[apart], ri[apart])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_random(metric, dtype, k):
    rs = np.random.RandomState(k)
    m = max(1500, 2 * k)
    X, Q = rs.randn(m, 24), rs.randn(70, 24)
    check_random(Q, X, k, metric, dtype)


@pytest.mark.parametrize("d", [1, 3, 32, 40, 128])
@pytest.mark.parametrize("metric", ["sqeuclidean", "cosine", "manhattan"])
def test_dimensions(metric, d):
    """Aligned and unaligned rows, one and several chunks of dimensions."""
    rs = np.random.RandomState(d)
    X, Q = rs.randn(3000, d), rs.randn(130, d)
    check_random(Q, X, 16, metric, np.float64)
    check_random(Q, X, 16, metric, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "manhattan", "chebyshev", "minkowski"])
@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_ties_lower_index(metric, dtype, k):
    """Small integer rows repeated many times: exact arithmetic, every tie goes to the lower row."""
    rs = np.random.RandomState(7)
    base = rs.randint(-2, 3, size=(6, 5)).astype(np.float64)
    X = base[rs.randint(0, 6, size=max(2000, k + 10))]
    Q = np.concatenate([base, rs.randint(-2, 3, size=(40, 5))]).astype(np.float64)
    D = reference(Q, X, metric)
    rd, ri = ref_topk(D, k)
    d, i = run(Q.astype(dtype), X.astype(dtype), k, metric)
    np.testing.assert_array_equal(i, ri)
    np.testing.assert_allclose(d, rd, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, 64, 200])
def test_k_above_rows_of_a_block(k):
    """Index shorter than a tile and than a split: empty slots must never be reported."""
    rs = np.random.RandomState(k)
    for m in (k, k + 1, 129, 300):
        if m < k:
            continue
        X, Q = rs.randn(m, 8), rs.randn(33, 8)
        check_random(Q, X, k, "sqeuclidean", np.float64)
        check_random(Q, X, min(k, m), "manhattan", np.float32)


def test_zero_rows_cosine_and_no_queries():
    import cupy as cp

    from mpiml.kernels.select import topk

    rs = np.random.RandomState(0)
    X = rs.randn(500, 6)
    X[::7] = 0
    Q = rs.randn(20, 6)
    Q[3] = 0
    check_random(Q, X, 9, "cosine", np.float64)
    d, i = topk(cp.empty((0, 6)), cp.asarray(X), 4, metric="cosine")
    assert d.shape == (0, 4) and i.shape == (0, 4)
    with pytest.raises(ValueError):
        topk(cp.asarray(Q), cp.asarray(X), 501)


def test_many_queries_and_splits():
    """Several query batches and index splits at once (the merge of the splits' lists)."""
    from mpiml.kernels import select

    rs = np.random.RandomState(3)
    X, Q = rs.randn(200_000, 16).astype(np.float32), rs.randn(3000, 16).astype(np.float32)
    tm, ty, splits, _, _ = select.plan(np.float32, 50, "sqeuclidean", Q.shape[0], X.shape[0], 132)
    assert splits > 1
    check_random(Q[:300], X, 50, "sqeuclidean", np.float32)
    d, i = run(Q, X, 50, "sqeuclidean")
    d2, i2 = run(Q[1000:1300], X, 50, "sqeuclidean")
    np.testing.assert_array_equal(i[1000:1300], i2)  # a query's answer does not depend on its batch
    np.testing.assert_array_equal(d[1000:1300], d2)


def test_exact_sq():
    import cupy as cp

    from mpiml.kernels.select import exact_sq

    rs = np.random.RandomState(1)
    X, Q = rs.randn(400, 37), rs.randn(50, 37)
    idx = rs.randint(0, 400, size=(50, 11))
    want = ((X[idx] - Q[:, None, :]) ** 2).sum(2)
    got = exact_sq(cp.asarray(Q), cp.asarray(X), cp.asarray(idx)).get()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    same = exact_sq(cp.asarray(Q[5:9]), cp.asarray(X), cp.asarray(idx[5:9])).get()
    np.testing.assert_array_equal(same, got[5:9])
    assert (exact_sq(cp.asarray(X[:3]), cp.asarray(X), cp.arange(3)[:, None]).get() == 0).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", METRICS)
def test_within(metric, dtype):
    """The count + fill passes find exactly the pairs whose value is within the bound."""
    import cupy as cp

    from mpiml.kernels.select import within

    rs = np.random.RandomState(11)
    X, Q = rs.randn(5000, 12), rs.randn(90, 12)
    D = reference(Q, X, "sqeuclidean" if metric == "euclidean" else metric)  # euclidean: the squared GEMM form
    bound = float(np.quantile(D, 0.01))
    indptr, cols, vals = within(cp.asarray(Q.astype(dtype)), cp.asarray(X.astype(dtype)), bound, metric=metric,
                                p=3.0 if metric == "minkowski" else None)
    indptr, cols, vals = indptr.get(), cols.get(), vals.get()
    assert indptr[0] == 0 and (np.diff(indptr) >= 0).all() and indptr[-1] == cols.size == vals.size
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    scale = np.abs(D).max() + 1
    for i in range(Q.shape[0]):
        got = np.sort(cols[indptr[i]:indptr[i + 1]])
        assert len(set(got)) == got.size
        np.testing.assert_allclose(vals[indptr[i]:indptr[i + 1]], D[i, cols[indptr[i]:indptr[i + 1]]], rtol=rtol,
                                   atol=rtol * scale)
        sure = np.flatnonzero(D[i] <= bound - rtol * scale)   # certainly inside
        maybe = np.flatnonzero(D[i] <= bound + rtol * scale)  # possibly inside (rounding)
        assert np.isin(sure, got).all() and np.isin(got, maybe).all()


def test_within_nothing_and_everything():
    import cupy as cp

    from mpiml.kernels.select import within

    rs = np.random.RandomState(2)
    X, Q = cp.asarray(rs.randn(300, 5)), cp.asarray(rs.randn(7, 5))
    indptr, cols, _ = within(Q, X, -1.0, metric="manhattan")
    assert int(indptr[-1]) == 0 and cols.size == 0
    indptr, cols, _ = within(Q, X, 1e9, metric="manhattan")
    assert (cp.diff(indptr) == 300).all()
    assert (cp.sort(cols[indptr[3]:indptr[4]]) == cp.arange(300)).all()
