"""The sparse kernel family (mpiml.kernels.sparse) against dense products, and the estimators that use it
(TruncatedSVD, sparse PCA, sparse Ridge) on cupyx CSR against SciPy CSR, at 1-4 ranks (GPU host only)."""

import os

import numpy as np
import pytest

from _spmd_cases import session_launches

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(os.path.abspath(__file__))
#: gpu_sparse_spmd_script.py at 1-4 ranks, and with the device algebra at 2 and 3, as cases of one launch per rank
#: count (tests/_spmd_cases.py): four launches instead of six, each a CuPy import and a CUDA context per rank.
_DEVICE_ALGEBRA = {"MPIML_SPARSE_TRANSPOSE": "buckets", "MPIML_RANDOMIZED_ALGEBRA": "device"}


def _launches(tmp_path_factory):
    script = os.path.join(HERE, "gpu_sparse_spmd_script.py")
    cases = {n: [{"name": "fits", "script": script}] for n in (1, 2, 3, 4)}
    for n in (2, 3):
        cases[n].append({"name": "fits_device_algebra", "script": script, "env": _DEVICE_ALGEBRA})
    return session_launches("decomposition_gpu_sparse", cases, tmp_path_factory, timeout=240)


def _csr(n, m, density, dtype, seed, empty_rows=True, duplicates=False):
    import scipy.sparse as sp

    # (a Generator: scipy.sparse.random with a RandomState permutes all n m positions, 22 s at 3000 x 150000)
    rs = np.random.default_rng(seed)
    A = sp.random(n, m, density=density, format="csr", random_state=rs, dtype=np.float64)
    A.data = rs.standard_normal(A.nnz)
    if empty_rows and n > 3:
        A = sp.csr_matrix(A.multiply(np.where(np.arange(n) % 7 == 3, 0.0, 1.0)[:, None]))
        A.eliminate_zeros()
    if duplicates:  # the first row's entries stored twice, unsorted
        coo = A.tocoo()
        r = np.concatenate([coo.row, np.zeros(3, dtype=coo.row.dtype)])
        c = np.concatenate([coo.col, np.array([2, 0, 2], dtype=coo.col.dtype)])
        v = np.concatenate([coo.data, np.array([1.0, 2.0, 3.0])])
        order = np.lexsort((c, r))[::-1]
        A = sp.csr_matrix((v[order], c[order], np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))])),
                          shape=(n, m))
    return A.astype(dtype)


@pytest.mark.parametrize("gather", ["vec4", "scalar"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("b", [1, 3, 8, 13, 16, 26, 32, 42, 64, 100, 128, 130, 300])
def test_csr_matmul_equals_dense(dtype, b, gather, monkeypatch):
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    if gather == "scalar" and (dtype == np.float64 or b > sparse.VEC4_MAX_COLUMNS):
        pytest.skip("only float32 blocks of up to 32 columns have a float4 gather to compare with")
    monkeypatch.setenv("MPIML_SPARSE_GATHER", gather)
    A = _csr(700, 450, 0.05, dtype, b)
    V = np.random.RandomState(b + 1).standard_normal((450, b))
    ref = A.astype(np.float64) @ V.astype(dtype).astype(np.float64)
    Ag = csp.csr_matrix(A)
    assert sparse.supported(Ag)
    for out in (dtype, np.float64):
        Y = sparse.csr_matmul(Ag, cp.asarray(V), out_dtype=out)
        assert Y.dtype == out and Y.shape == (700, b) and Y.flags.c_contiguous
        np.testing.assert_allclose(Y.get(), ref, rtol=1e-5 if out == np.float32 else 1e-12, atol=1e-5)
    # a column slice of a wider block (strided rows) and the deterministic sum
    W = cp.asarray(np.random.RandomState(3).standard_normal((450, b + 5)))
    Y1 = sparse.csr_matmul(Ag, W[:, 2:2 + b], out_dtype=np.float64)
    Y2 = sparse.csr_matmul(Ag, W[:, 2:2 + b], out_dtype=np.float64)
    assert bool((Y1 == Y2).all())
    np.testing.assert_allclose(Y1.get(), A.astype(np.float64) @ W[:, 2:2 + b].get().astype(dtype), rtol=1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
    # the transposed product: on a stored transpose (gather) and by atomics (scatter)
    U = np.random.RandomState(b + 2).standard_normal((700, b))
    refT = A.T.astype(np.float64) @ U.astype(dtype).astype(np.float64)
    T1 = sparse.csr_matmul(Ag.T.tocsr(), cp.asarray(U), out_dtype=np.float64)
    T2 = sparse.csr_rmatmul_scatter(Ag, cp.asarray(U), out_dtype=np.float64)
    for T in (T1, T2):
        assert T.shape == (450, b) and T.dtype == np.float64
        np.testing.assert_allclose(T.get(), refT, rtol=1e-10, atol=1e-5 if dtype == np.float32 else 1e-10)
    # the float4 gather a chunk of U's rows at a time (chunks made small here), added up in a fixed order
    monkeypatch.setattr(sparse, "GATHER_CHUNK_BYTES", 4096)
    monkeypatch.setattr(sparse, "_CHUNK_MIN_PER_ROW", 4)
    XT = Ag.T.tocsr()
    chunks = sparse.gather_chunks(XT, b)
    if gather == "vec4" and dtype == np.float32 and 2 <= b <= sparse.VEC4_MAX_COLUMNS:
        assert chunks is not None and chunks.K > 1
        T3 = sparse.csr_matmul(XT, cp.asarray(U), out_dtype=np.float64, chunks=chunks)
        np.testing.assert_allclose(T3.get(), refT, rtol=1e-10, atol=1e-5)
        assert bool((T3 == sparse.csr_matmul(XT, cp.asarray(U), out_dtype=np.float64, chunks=chunks)).all())
    else:
        assert chunks is None


def test_chunked_gather_of_a_tall_block(monkeypatch):
    """XᵀU by chunks of U's rows at the default 16 MB a chunk (U of 300,000 rows spans 3), against SciPy; U passed
    at an odd offset (a misaligned view: copied) and as a column slice; chunks cut from other arrays are ignored."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.kernels import sparse

    monkeypatch.setenv("MPIML_SPARSE_GATHER", "vec4")
    monkeypatch.setenv("MPIML_SPARSE_GATHER_CHUNK_BYTES", str(16 << 20))
    rs = np.random.default_rng(40)
    n, d, b = 300_000, 400, 26
    XT = sp.random(d, n, density=1000 / n, format="csr", random_state=rs, dtype=np.float64).astype(np.float32)
    XT.data = rs.standard_normal(XT.nnz).astype(np.float32)
    XTg = csp.csr_matrix(XT)
    chunks = sparse.gather_chunks(XTg, b)
    assert chunks is not None and chunks.K == 3
    flat = cp.asarray(rs.standard_normal(n * b + 1).astype(np.float32))
    U = flat[1:].reshape(n, b)                                 # 4 bytes past an aligned start
    ref = XT.astype(np.float64) @ U.get().astype(np.float64)
    Y1 = sparse.csr_matmul(XTg, U, out_dtype=np.float64, chunks=chunks)
    Y0 = sparse.csr_matmul(XTg, U, out_dtype=np.float64)
    np.testing.assert_allclose(Y1.get(), ref, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(Y0.get(), ref, rtol=1e-10, atol=1e-8)
    assert bool((Y1 == sparse.csr_matmul(XTg, U, out_dtype=np.float64, chunks=chunks)).all())
    W = cp.asarray(rs.standard_normal((n, b + 3)).astype(np.float32))
    np.testing.assert_allclose(sparse.csr_matmul(XTg, W[:, 1:1 + b], out_dtype=np.float64, chunks=chunks).get(),
                               XT.astype(np.float64) @ W[:, 1:1 + b].get().astype(np.float64), rtol=1e-10, atol=1e-8)
    other = csp.csr_matrix(XT)                                 # the same values in other arrays: chunks not used
    assert not chunks.of(other) and chunks.of(XTg)
    np.testing.assert_allclose(sparse.csr_matmul(other, U, out_dtype=np.float64, chunks=chunks).get(), ref,
                               rtol=1e-10, atol=1e-8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_vectors_and_empty_shapes(dtype):
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.kernels import sparse

    for density in (0.002, 0.05, 0.9):      # a few, some and many stored values a row: every lane count
        A = _csr(300, 200, density, dtype, 7)
        x = np.random.RandomState(8).standard_normal(200)
        y = sparse.csr_matmul(csp.csr_matrix(A), cp.asarray(x), out_dtype=np.float64)
        assert y.shape == (300,)
        np.testing.assert_allclose(y.get(), A.astype(np.float64) @ x.astype(dtype), rtol=1e-10, atol=1e-6)
        u = np.random.RandomState(9).standard_normal(300)
        t = sparse.csr_rmatmul_scatter(csp.csr_matrix(A), cp.asarray(u))
        assert t.shape == (200,)
        np.testing.assert_allclose(t.get(), A.T.astype(np.float64) @ u.astype(dtype), rtol=1e-10, atol=1e-6)
        # the normal operator of centred, weighted rows in one read
        m, w = np.random.RandomState(10).standard_normal(200), np.random.RandomState(11).uniform(0.5, 2, 300)
        xd = x.astype(dtype).astype(np.float64)
        for weights in (None, w):
            yv, ys = sparse.csr_normal_vec(csp.csr_matrix(A), cp.asarray(x), cp.asarray(m @ xd),
                                           None if weights is None else cp.asarray(weights))
            t_ref = A.astype(np.float64) @ xd - m @ xd
            if weights is not None:
                t_ref = t_ref * weights
            np.testing.assert_allclose(yv.get(), A.T.astype(np.float64) @ t_ref, rtol=1e-9, atol=1e-6)
            np.testing.assert_allclose(float(ys), t_ref.sum(), rtol=1e-9, atol=1e-6)
    for shape in ((0, 5), (5, 0), (4, 6)):
        Z = csp.csr_matrix(sp.csr_matrix(shape, dtype=dtype))
        assert float(abs(sparse.csr_matmul(Z, cp.ones((shape[1], 3)))).sum()) == 0.0
        assert sparse.csr_matmul(Z, cp.ones((shape[1], 3))).shape == (shape[0], 3)
        assert sparse.csr_rmatmul_scatter(Z, cp.ones((shape[0], 3))).shape == (shape[1], 3)
        s1, s2, canonical = sparse.csr_row_moments(Z)
        assert canonical and s1.shape == (shape[0],)


def test_csr_row_moments_and_canonical_check():
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    A = _csr(500, 80, 0.1, np.float32, 11)
    shift = np.random.RandomState(1).standard_normal(500)
    s1, s2, canonical = sparse.csr_row_moments(csp.csr_matrix(A), cp.asarray(shift))
    D = A.astype(np.float64)
    np.testing.assert_allclose(s1.get(), np.asarray(D.sum(axis=1)).ravel(), rtol=1e-12, atol=1e-12)
    dev = [((D.data[D.indptr[i]:D.indptr[i + 1]] - shift[i]) ** 2).sum() for i in range(500)]
    np.testing.assert_allclose(s2.get(), dev, rtol=1e-12, atol=1e-12)
    assert canonical
    B = _csr(50, 10, 0.3, np.float64, 12, duplicates=True)
    assert not sparse.csr_row_moments(csp.csr_matrix(B))[2]


@pytest.mark.parametrize("mode", ["kernels", "scatter", "cusparse"])
def test_truncated_svd_cupyx_modes_equal_scipy(mode, monkeypatch):
    """Every way of multiplying gives SciPy's TruncatedSVD; non-canonical input (duplicates) too."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.decomposition import PCA, TruncatedSVD

    monkeypatch.setenv("MPIML_SPARSE_PRODUCTS", mode)
    for dup in (False, True):
        X = _csr(2500, 300, 0.02, np.float64, 21, duplicates=dup)
        X.data = np.abs(X.data)
        Xg = csp.csr_matrix(X)
        for algorithm in ("randomized", "arpack"):
            h = TruncatedSVD(6, algorithm=algorithm, random_state=0).fit(X)
            g = TruncatedSVD(6, algorithm=algorithm, random_state=0).fit(Xg)
            np.testing.assert_allclose(g.singular_values_.get(), h.singular_values_, rtol=1e-8)
            np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
            np.testing.assert_allclose(g.explained_variance_.get(), h.explained_variance_, rtol=1e-8)
            np.testing.assert_allclose(g.explained_variance_ratio_.get(), h.explained_variance_ratio_, rtol=1e-8)
            np.testing.assert_allclose(g.transform(Xg).get(), h.transform(X), rtol=1e-6, atol=1e-8)
        h = PCA(5, svd_solver="arpack", random_state=0).fit(X)
        g = PCA(5, svd_solver="arpack", random_state=0).fit(Xg)
        np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
    # float32 shards, the default random_state (a device draw, another random matrix): on a decaying spectrum
    # the leading singular values of the host fit (a flat spectrum would differ by the approximation error)
    import scipy.sparse as sp

    X32 = _csr(4000, 500, 0.02, np.float64, 22)
    X32 = sp.csr_matrix(abs(X32) @ sp.diags(0.9 ** np.arange(500))).astype(np.float32)
    g = TruncatedSVD(8, n_iter=7).fit(csp.csr_matrix(X32))
    h = TruncatedSVD(8, n_iter=7, random_state=0).fit(X32.astype(np.float64))
    assert g.components_.dtype == cp.float32
    np.testing.assert_allclose(g.singular_values_.get()[:3], h.singular_values_[:3], rtol=1e-3)


def test_sparse_ridge_cupyx_equals_scipy(monkeypatch):
    """sparse_cg (the kernels' row dots on X and the stored Xᵀ) gives the SciPy CSR result."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.linear_model import Ridge

    X = _csr(3000, 2500, 0.01, np.float64, 31)
    y = X @ np.random.RandomState(2).standard_normal(2500) + 0.1 * np.random.RandomState(3).standard_normal(3000)
    for fit_intercept in (True, False):
        h = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-8, fit_intercept=fit_intercept).fit(X, y)
        for mode in ("kernels", "scatter", "cusparse"):
            monkeypatch.setenv("MPIML_SPARSE_PRODUCTS", mode)
            g = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-8, fit_intercept=fit_intercept).fit(csp.csr_matrix(X),
                                                                                                  cp.asarray(y))
            np.testing.assert_allclose(cp.asnumpy(g.coef_), h.coef_, rtol=1e-6, atol=1e-8)
            np.testing.assert_allclose(float(cp.asnumpy(g.intercept_)), float(h.intercept_), rtol=1e-6, atol=1e-8)
    sw = np.random.RandomState(4).uniform(0.5, 2, 3000)
    h = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-8).fit(X, y, sample_weight=sw)
    for mode in ("kernels", "scatter"):
        monkeypatch.setenv("MPIML_SPARSE_PRODUCTS", mode)
        g = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-8).fit(csp.csr_matrix(X), cp.asarray(y),
                                                               sample_weight=cp.asarray(sw))
        np.testing.assert_allclose(cp.asnumpy(g.coef_), h.coef_, rtol=1e-6, atol=1e-8)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sparse_fits_equal_at_any_rank_count(tmp_path_factory, n):
    """TruncatedSVD (both algorithms), sparse PCA and sparse Ridge on cupyx shards of the same rows at 1-4 ranks
    (ranks share the GPUs there are) equal the one-process SciPy fit to the docs' tolerance."""
    _launches(tmp_path_factory).verdict(n, "fits")


@pytest.mark.parametrize("b", [2, 8, 13, 26, 32])
def test_padded_products_chain(b):
    """A padded float32 product (the leading columns of a zero-padded block) equals the plain one, and the next
    product reads it as it is with the same result as from a contiguous copy."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    A = csp.csr_matrix(_csr(900, 300, 0.05, np.float32, b))
    AT = A.T.tocsr()
    V = cp.asarray(np.random.RandomState(b).standard_normal((300, b)).astype(np.float32))
    Y = sparse.csr_matmul(A, V, padded=True)
    assert Y.shape == (900, b)
    assert bool((Y == sparse.csr_matmul(A, V)).all())
    if b < 4 * sparse._vec4_lanes(b):                               # 2, 13, 26: padded to 8, 16, 32
        assert not Y.flags.c_contiguous and bool((Y.base[:, b:] == 0).all())
        assert sparse._padded_view(Y, Y.base.shape[1])
    Z = sparse.csr_matmul(AT, Y, out_dtype=np.float64)
    assert bool((Z == sparse.csr_matmul(AT, cp.ascontiguousarray(Y), out_dtype=np.float64)).all())
    W = cp.asarray(np.random.RandomState(1).standard_normal((300, 40)).astype(np.float32))
    assert not sparse._padded_view(W[:, 4:4 + min(b, 28)], 40)      # not the leading columns of its block


def test_scatter_with_float4_atomics():
    """The float4-atomic transposed product (for comparison in the benchmark) against the dense one."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    A = _csr(800, 300, 0.05, np.float32, 9)
    for b in (2, 7, 16, 26, 32):
        U = np.random.RandomState(b).standard_normal((800, b)).astype(np.float32)
        Y = sparse.csr_rmatmul_scatter4(csp.csr_matrix(A), cp.asarray(U))
        assert Y.shape == (300, b) and Y.dtype == cp.float32
        np.testing.assert_allclose(Y.get(), A.T.astype(np.float64) @ U.astype(np.float64), rtol=1e-4, atol=1e-4)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_sparse_fits_equal_at_any_rank_count_device_algebra(tmp_path_factory, n):
    """The same with the bucket transpose and the randomized SVD's CholeskyQR2 algebra on the device."""
    _launches(tmp_path_factory).verdict(n, "fits_device_algebra")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_transpose_equals_cusparse(dtype):
    """The kernel transpose gives the arrays of cuSPARSE's conversion (canonical input), whatever the order of its
    atomics (two runs equal), and the column moments; unsorted rows too; duplicates as the same matrix, flagged; a
    column past max_run: the same matrix, that row of Xᵀ unsorted and flagged."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    for n, m, density in ((700, 450, 0.05), (3000, 40, 0.5), (50, 5000, 0.01), (1, 7, 1.0), (9000, 3, 0.9)):
        A = csp.csr_matrix(_csr(n, m, density, dtype, n + m))
        T = sparse.csr_transpose(A)
        R = A.T.tocsr()
        if int(cp.diff(A.tocsc().indptr).max()) > sparse.TRANSPOSE_MAX_RUN:   # rows of Xᵀ too long for the sort
            assert bool((T.indptr == R.indptr).all())
            np.testing.assert_array_equal(T.get().toarray(), R.get().toarray())
            assert int(sparse.csr_transpose(A, moments=True)[1][2].get()[0]) > 0
            continue
        assert T.shape == (m, n) and T.dtype == A.dtype
        for name in ("indptr", "indices", "data"):
            assert bool((getattr(T, name) == getattr(R, name)).all()), (n, m, name)
        T2, (s1, s2, dups) = sparse.csr_transpose(A, moments=True)
        assert bool((T2.indices == T.indices).all()) and bool((T2.data == T.data).all())
        H = A.get().tocsc().astype(np.float64)
        cols = [H.data[H.indptr[j]:H.indptr[j + 1]] for j in range(m)]
        np.testing.assert_allclose(s1.get(), [c.sum() for c in cols], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s2.get(), [((c - c.mean()) ** 2).sum() if c.size else 0.0 for c in cols],
                                   rtol=1e-10, atol=1e-12)
        assert int(dups.get()[0]) == 0
    # rows with unsorted indices: the transpose is the same matrix, its rows sorted
    A = _csr(300, 200, 0.1, dtype, 5)
    B = A.copy()
    for i in range(B.shape[0]):
        lo, hi = B.indptr[i], B.indptr[i + 1]
        B.indices[lo:hi] = B.indices[lo:hi][::-1].copy()
        B.data[lo:hi] = B.data[lo:hi][::-1].copy()
    T = sparse.csr_transpose(csp.csr_matrix(B))
    R = csp.csr_matrix(A).T.tocsr()
    assert bool((T.indices == R.indices).all()) and bool((T.data == R.data).all())
    import scipy.sparse as sp

    D = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype), np.array([2, 2, 0, 1, 2]),
                       np.array([0, 2, 5])), shape=(2, 3))              # row 0 holds column 2 twice
    T, (_, _, dups) = sparse.csr_transpose(csp.csr_matrix(D), moments=True)
    assert int(dups.get()[0]) == 1
    u = np.random.RandomState(1).standard_normal(2).astype(dtype)
    np.testing.assert_allclose((T @ cp.asarray(u)).get(), D.T @ u, rtol=1e-5, atol=1e-5)
    T, (s1, _, flags) = sparse.csr_transpose(csp.csr_matrix(A), max_run=3, moments=True)   # rows of > 4 unsorted
    np.testing.assert_array_equal(T.get().toarray(), A.T.toarray())
    np.testing.assert_allclose(s1.get(), np.asarray(A.sum(axis=0)).ravel(), rtol=1e-5, atol=1e-5)
    assert int(flags.get()[0]) == int((np.diff(A.tocsc().indptr) > 4).sum())


def _assert_same_csr(T, R, what):
    """The same shape, dtype and arrays; else the first place that differs, with the arrays around it."""
    assert T.shape == R.shape and T.dtype == R.dtype, (what, T.shape, R.shape, T.dtype, R.dtype)
    for name in ("indptr", "indices", "data"):
        got, want = getattr(T, name).get(), getattr(R, name).get()
        if got.shape != want.shape or not (got == want).all():
            i = int(np.argmax(got != want)) if got.shape == want.shape else 0
            raise AssertionError(f"{what}: {name} differs (sizes {got.size}, {want.size}) first at {i}: got "
                                 f"{got[max(0, i - 3):i + 5]}, want {want[max(0, i - 3):i + 5]}; indptr head "
                                 f"{T.indptr.get()[:6]} vs {R.indptr.get()[:6]}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_csr_transpose_buckets_equals_cusparse(dtype, monkeypatch):
    """The bucket transpose gives the arrays of cuSPARSE's conversion: empty rows and columns, one column, widths
    that are not a power of two, chunks cut inside long rows, runs of empty rows across a chunk, several bucket
    widths (forced), rows with unsorted indices (its rows of Xᵀ still sorted), duplicates (storage order), and
    twice the same (deterministic)."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.kernels import sparse

    for n, m, density in ((700, 450, 0.05), (3000, 40, 0.5), (50, 5000, 0.01), (1, 7, 1.0), (9000, 3, 0.9),
                          (4000, 1, 0.7), (20000, 1000, 0.004), (300, 70001, 0.003), (2, 300000, 0.05)):
        A = csp.csr_matrix(_csr(n, m, density, dtype, n + m))
        assert sparse.buckets_supported(A)
        R = A.T.tocsr()
        T = sparse.csr_transpose_buckets(A)
        _assert_same_csr(T, R, (n, m))
        _assert_same_csr(sparse.csr_transpose_buckets(A), T, ("again", n, m))
    # empty columns by the thousand, a row longer than a block's entries, 30000 empty rows inside one chunk
    rs = np.random.RandomState(3)
    dense_row = sp.csr_matrix((rs.standard_normal(20000), (np.zeros(20000, dtype=int), rs.permutation(60000)[:20000])),
                              shape=(1, 60000))
    gap = sp.csr_matrix((30000, 60000))
    B = sp.vstack([_csr(500, 60000, 0.001, np.float64, 4), dense_row, gap, dense_row, _csr(500, 60000, 0.002,
                                                                                          np.float64, 5)]).tocsr()
    B.sort_indices()
    A = csp.csr_matrix(B.astype(dtype))
    R = A.T.tocsr()
    for shift, threads in (("6", "1024"), ("7", "256"), ("10", "512"), ("11", "1024"), ("", "1024")):
        monkeypatch.setenv("MPIML_SPARSE_BUCKET_SHIFT", shift)      # 11: more columns a bucket than taken (skipped)
        monkeypatch.setenv("MPIML_SPARSE_BUCKET_THREADS", threads)
        if sparse.bucket_shift(A.shape[1]) is None:
            continue
        _assert_same_csr(sparse.csr_transpose_buckets(A), R, ("shift", shift, threads))
    monkeypatch.delenv("MPIML_SPARSE_BUCKET_SHIFT")
    monkeypatch.delenv("MPIML_SPARSE_BUCKET_THREADS")
    # rows with unsorted indices: the same matrix, the rows of Xᵀ sorted
    H = _csr(3000, 2000, 0.01, dtype, 5)
    U = H.copy()
    for i in range(U.shape[0]):
        lo, hi = U.indptr[i], U.indptr[i + 1]
        U.indices[lo:hi] = U.indices[lo:hi][::-1].copy()
        U.data[lo:hi] = U.data[lo:hi][::-1].copy()
    _assert_same_csr(sparse.csr_transpose_buckets(csp.csr_matrix(U)), csp.csr_matrix(H).T.tocsr(), "unsorted")
    # duplicates: kept, in storage order within their row of Xᵀ
    D = sp.csr_matrix((np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype), np.array([2, 2, 0, 1, 2]),
                       np.array([0, 2, 5])), shape=(2, 3))
    T = sparse.csr_transpose_buckets(csp.csr_matrix(D))
    np.testing.assert_array_equal(T.indptr.get(), [0, 1, 2, 5])
    np.testing.assert_array_equal(T.indices.get(), [1, 1, 0, 0, 1])
    np.testing.assert_array_equal(T.data.get(), np.array([3.0, 4.0, 1.0, 2.0, 5.0], dtype=dtype))
    # nothing stored
    Z = sparse.csr_transpose_buckets(csp.csr_matrix((5, 4), dtype=dtype))
    assert Z.shape == (4, 5) and Z.nnz == 0 and bool((Z.indptr == 0).all())
    # a fit's side stream: the transpose of SparseRows equals cuSPARSE's
    from mpiml.decomposition._solvers import SparseRows

    monkeypatch.setenv("MPIML_SPARSE_TRANSPOSE", "buckets")
    A = csp.csr_matrix(_csr(5000, 800, 0.02, dtype, 6))
    op = SparseRows(A)
    _assert_same_csr(op.XT, A.T.tocsr(), "SparseRows")
    cp.cuda.Device().synchronize()


@pytest.mark.parametrize("how", ["smem", "blocks"])
def test_csr_transpose_shared_memory_counts(how, monkeypatch):
    """The transpose with its column counts by shared-memory windows (MPIML_SPARSE_TRANSPOSE_COUNTS=smem), or its
    counts and fill by blocks of rows with no global atomic (=blocks): the same arrays, at widths of one window
    and of several, with fewer rows than blocks too."""
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    monkeypatch.setenv("MPIML_SPARSE_TRANSPOSE_COUNTS", how)
    for n, m, density in ((700, 450, 0.05), (400, 150000, 0.0005), (30, 20, 0.3)):
        A = csp.csr_matrix(_csr(n, m, density, np.float32, m))
        T, R = sparse.csr_transpose(A), A.T.tocsr()
        for name in ("indptr", "indices", "data"):
            assert bool((getattr(T, name) == getattr(R, name)).all()), (n, m, name)


def test_small_cholinv_flags():
    """The device's l x l algebra of a CholeskyQR round: R and R⁻¹ as the host's, and its deferred checks."""
    import cupy as cp

    from mpiml.kernels import sparse

    rs = np.random.RandomState(8)
    for l in (1, 5, 26, 64):
        A = rs.standard_normal((4 * l + 10, l)) @ np.diag(np.logspace(0, 2, l))
        G = A.T @ A
        flag = cp.zeros(1, dtype=cp.int32)
        R, Rinv = sparse.small_cholinv(cp.asarray(G), flag, 1e7)
        np.testing.assert_allclose(R.get(), np.linalg.cholesky(G).T, rtol=1e-10, atol=1e-10 * np.abs(G).max() ** .5)
        np.testing.assert_allclose((R @ Rinv).get(), np.eye(l), atol=1e-10)
        assert int(flag.get()[0]) == 0
    G = np.diag([4.0, -1.0, 9.0])
    flag = cp.zeros(1, dtype=cp.int32)
    sparse.small_cholinv(cp.asarray(G), flag)
    assert int(flag.get()[0]) == 1
    A = rs.standard_normal((100, 10)) @ np.diag(np.logspace(0, 7.5, 10))     # cond 3e7: past the limit of 1e7
    flag = cp.zeros(1, dtype=cp.int32)
    sparse.small_cholinv(cp.asarray(A.T @ A), flag, 1e7)
    assert int(flag.get()[0]) & 2
    flag = cp.zeros(1, dtype=cp.int32)
    sparse.small_cholinv(cp.asarray(A.T @ A), flag, 0.0)
    assert not int(flag.get()[0]) & 2
    with pytest.raises(ValueError, match="1 to 64"):
        sparse.small_cholinv(cp.zeros((65, 65)), flag)


def test_small_svd_by_jacobi():
    """The device's SVD of a small square factor against NumPy's: values, the product, orthonormal factors."""
    import cupy as cp

    from mpiml.kernels import sparse

    rs = np.random.RandomState(9)
    for l in (1, 2, 5, 26, 27, 42, 64):
        R = np.triu(rs.standard_normal((l, l))) @ np.diag(np.logspace(0, 3, l))
        flag = cp.zeros(1, dtype=cp.int32)
        U, s, Vt = sparse.small_svd(cp.asarray(R), flag)
        assert int(flag.get()[0]) == 0
        np.testing.assert_allclose(s.get(), np.linalg.svd(R, compute_uv=False), rtol=1e-12, atol=1e-12 * abs(R).max())
        np.testing.assert_allclose((U * s[None, :] @ Vt).get(), R, atol=1e-12 * abs(R).max())
        np.testing.assert_allclose((U.T @ U).get(), np.eye(l), atol=1e-12)
        np.testing.assert_allclose((Vt @ Vt.T).get(), np.eye(l), atol=1e-12)


@pytest.mark.parametrize("transpose,algebra,checks", [("kernel", "device", "now"), ("buckets", "device", "now"),
                                                      ("buckets", "device", "deferred"), ("cusparse", "host", "now")])
def test_truncated_svd_device_algebra_equals_host(transpose, algebra, checks, monkeypatch):
    """TruncatedSVD with each transpose and either CholeskyQR2 algebra (every normaliser) gives the host fit; with
    the device's, an iterate past CholeskyQR2's limit fails the check and runs again with the host's, the check
    read at the range finder's end or after the fit's end was queued (MPIML_RANDOMIZED_CHECKS=deferred)."""
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    from mpiml.decomposition import PCA, TruncatedSVD
    from mpiml.decomposition._solvers import timeline

    monkeypatch.setenv("MPIML_SPARSE_TRANSPOSE", transpose)
    monkeypatch.setenv("MPIML_RANDOMIZED_ALGEBRA", algebra)
    monkeypatch.setenv("MPIML_RANDOMIZED_CHECKS", checks)
    X = _csr(2500, 300, 0.02, np.float64, 21)
    X.data = np.abs(X.data)
    Xg = csp.csr_matrix(X)
    for norm in ("auto", "CholeskyQR2", "QR", "none"):
        h = TruncatedSVD(6, power_iteration_normalizer=norm, random_state=0).fit(X)
        g = TruncatedSVD(6, power_iteration_normalizer=norm, random_state=0).fit(Xg)
        np.testing.assert_allclose(g.singular_values_.get(), h.singular_values_, rtol=1e-8)
        np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(g.explained_variance_ratio_.get(), h.explained_variance_ratio_, rtol=1e-8)
    D = np.random.RandomState(4).standard_normal((20000, 40)) @ np.diag(np.linspace(3, 0.1, 40))
    h = PCA(5, svd_solver="randomized", random_state=0).fit(D)
    g = PCA(5, svd_solver="randomized", random_state=0).fit(cp.asarray(D))
    np.testing.assert_allclose(g.components_.get(), h.components_, rtol=1e-6, atol=1e-8)
    # rank one plus noise at 1e-12: the iterate's condition passes CholeskyQR2's limit
    rs = np.random.RandomState(5)
    R1 = sp.csr_matrix(np.outer(rs.rand(3000), rs.rand(200)) + 1e-12 * rs.rand(3000, 200))
    h = TruncatedSVD(3, random_state=0).fit(R1)
    with timeline() as marks:
        g = TruncatedSVD(3, random_state=0).fit(csp.csr_matrix(R1))
    assert [m[0] for m in marks].count("X V 0") == (2 if algebra == "device" else 1)   # the device's, then the host's
    np.testing.assert_allclose(g.singular_values_.get()[0], h.singular_values_[0], rtol=1e-10)
    np.testing.assert_allclose(np.abs(g.components_.get()[0]), np.abs(h.components_[0]), rtol=1e-8, atol=1e-12)
    # float32: the leading singular values of the host fit
    X32 = _csr(4000, 500, 0.02, np.float64, 22)
    X32 = sp.csr_matrix(abs(X32) @ sp.diags(0.9 ** np.arange(500))).astype(np.float32)
    h = TruncatedSVD(8, n_iter=7, random_state=0).fit(X32.astype(np.float64))
    g = TruncatedSVD(8, n_iter=7, random_state=0).fit(csp.csr_matrix(X32))
    np.testing.assert_allclose(g.singular_values_.get()[:3], h.singular_values_[:3], rtol=1e-4)
    np.testing.assert_allclose(g.explained_variance_ratio_.get()[:3], h.explained_variance_ratio_[:3], rtol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_column_moments(dtype):
    import cupy as cp

    from mpiml.kernels import sparse

    rs = np.random.RandomState(5)
    for n, d in ((1000, 3), (777, 42), (5000, 512), (300, 1000), (0, 5), (1, 7)):
        X = (rs.standard_normal((n, d)) * 3 + 10).astype(dtype)
        shift = rs.standard_normal(d)
        s1, s2 = sparse.dense_column_moments(cp.asarray(X), cp.asarray(shift))
        X64 = X.astype(np.float64)
        np.testing.assert_allclose(s1.get(), X64.sum(axis=0), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(s2.get(), ((X64 - shift) ** 2).sum(axis=0), rtol=1e-12, atol=1e-9)
        assert bool((sparse.dense_column_moments(cp.asarray(X))[0] == s1).all())   # deterministic
    W = cp.asarray(rs.standard_normal((400, 50)).astype(dtype))
    s1, s2 = sparse.dense_column_moments(W[::3, 5:40])                           # a strided view
    np.testing.assert_allclose(s1.get(), W[::3, 5:40].get().astype(np.float64).sum(axis=0), rtol=1e-12, atol=1e-9)


def test_gram_and_cholesky_qr2_on_cupy_match_host():
    """The decompositions' Gram (one-read kernel) and CholeskyQR2 (d x d algebra on the host) on CuPy rows."""
    import cupy as cp

    from mpiml.comm import get_comm
    from mpiml.utils._linalg import cholesky_qr2, gram

    A = np.random.RandomState(6).standard_normal((20000, 42)).astype(np.float32)
    np.testing.assert_allclose(gram(cp.asarray(A)).get(), A.astype(np.float64).T @ A.astype(np.float64),
                               rtol=1e-12, atol=1e-9)
    Q, R = cholesky_qr2(cp.asarray(A), get_comm("self"))
    Qh, Rh = cholesky_qr2(A, get_comm("self"))
    np.testing.assert_allclose(R.get(), Rh, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(Q.get(), Qh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose((Q.T @ Q).get(), np.eye(42), atol=1e-5)


def test_replicated_svd_and_orth_on_gpu():
    """The replicated small factorisations of randomized_svd on a GPU: the wide SVD by QR + host SVD, the local
    orthonormalisation by CholeskyQR2 with its QR fallback (ill-conditioned and rank-deficient blocks)."""
    import cupy as cp

    from mpiml.decomposition._solvers import _local_orth, _wide_svd

    rs = np.random.RandomState(7)
    for m, d in ((26, 1000), (42, 512), (12, 5)):
        B = rs.standard_normal((m, d))
        U, s, Vt = _wide_svd(cp.asarray(B), cp)
        np.testing.assert_allclose(s.get(), np.linalg.svd(B, compute_uv=False), rtol=1e-12)
        np.testing.assert_allclose((U * s[None, :] @ Vt).get(), B, atol=1e-10)
    for cond in (1.0, 1e3, 1e10):
        Y = rs.standard_normal((2000, 20)) @ np.diag(np.logspace(0, np.log10(cond), 20))
        Q = _local_orth(cp.asarray(Y), cp)
        np.testing.assert_allclose((Q.T @ Q).get(), np.eye(20), atol=1e-8)
        P = Q.get() @ Q.get().T                                    # the span is Y's
        np.testing.assert_allclose(P @ Y, Y, rtol=1e-6, atol=1e-8 * np.abs(Y).max())
    Y = np.zeros((100, 4))
    Y[:, 0] = 1.0
    assert _local_orth(cp.asarray(Y), cp).shape[0] == 100


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [300, 70000, 150000])
def test_column_pieces_products(dtype, d):
    """The shared-memory one-vector products (sparse Ridge) at one and several column pieces; rows with
    unsorted indices refuse several pieces."""
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.kernels import sparse

    A = _csr(3000, d, min(0.05, 30.0 / d), dtype, d % 97)
    Ag = csp.csr_matrix(A)
    P = sparse.column_pieces(Ag)
    assert P is not None and P.K == -(-d // (P.cuts[1] - P.cuts[0]))
    x = np.random.RandomState(1).standard_normal(d)
    u = np.random.RandomState(2).standard_normal(3000)
    A64 = A.astype(np.float64)
    np.testing.assert_allclose(P.dot(cp.asarray(x)).get(), A64 @ x.astype(dtype), rtol=1e-10, atol=1e-6)
    np.testing.assert_allclose(P.tdot(cp.asarray(u)).get(), A64.T @ u.astype(dtype),
                               rtol=1e-5 if dtype == np.float32 else 1e-10, atol=1e-5)
    if P.K > 1:  # each row's stored values in decreasing column order
        rows = np.repeat(np.arange(3000), np.diff(A.indptr))
        perm = np.lexsort((-A.indices, rows))
        rev = csp.csr_matrix((cp.asarray(A.data[perm]), cp.asarray(A.indices[perm]), cp.asarray(A.indptr)),
                             shape=(3000, d))
        assert sparse.column_pieces(rev) is None
        np.testing.assert_allclose(sparse.csr_matmul(rev, cp.asarray(x), out_dtype=np.float64).get(),
                                   A64 @ x.astype(dtype), rtol=1e-10, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tall_transposed_product_batched(dtype, monkeypatch):
    """Xᵀ U of a tall dense block by the strided-batched GEMM (a partial last batch) equals the plain GEMM."""
    import cupy as cp

    from mpiml.decomposition import _solvers

    rs = np.random.RandomState(3)
    n = 4 * _solvers._TALL_BATCH_ROWS + 123
    X = rs.standard_normal((n, 37)).astype(dtype)
    U = rs.standard_normal((n, 11))
    ref = X.astype(np.float64).T @ U.astype(dtype).astype(np.float64)
    got = _solvers._tall_tmatmul(cp.asarray(X), cp.asarray(U), cp)
    assert got.dtype == cp.float64 and got.shape == (37, 11)
    np.testing.assert_allclose(got.get(), ref, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-2 if dtype == np.float32 else 1e-9)
    # it took the batched route (the plain GEMM agrees to the same tolerance)
    got2 = _solvers._batched_tmatmul(cp.asarray(X), cp.asarray(U.astype(dtype)), cp, _solvers._TALL_BATCH_ROWS)
    np.testing.assert_allclose(got2.get(), ref, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-2 if dtype == np.float32 else 1e-9)


def test_dense_truncated_svd_variances_on_cupy_match_host():
    """The one-read variances of dense CuPy shards (about a shift of the shard's first rows) equal the host's
    two-pass ones, columns with means far from zero included, at 1 and 3 shards of uneven sizes."""
    import cupy as cp

    from mpiml.comm import get_comm
    from mpiml.decomposition import TruncatedSVD
    from mpiml.decomposition._truncated_svd import _global_variances

    rs = np.random.RandomState(8)
    X = rs.standard_normal((6000, 12)) * np.logspace(-3, 2, 12) + np.linspace(-1e4, 1e6, 12)
    h = TruncatedSVD(4, random_state=0).fit(X)
    g = TruncatedSVD(4, random_state=0).fit(cp.asarray(X))
    np.testing.assert_allclose(g.explained_variance_.get(), h.explained_variance_, rtol=1e-8)
    np.testing.assert_allclose(g.explained_variance_ratio_.get(), h.explained_variance_ratio_, rtol=1e-8)
    Xt = X @ rs.standard_normal((12, 3))
    ref_full = X.var(axis=0).sum()
    got_full, got_t = _global_variances(cp.asarray(X), cp.asarray(Xt), 6000, comm=get_comm("self"), xp=cp)
    np.testing.assert_allclose(got_full, ref_full, rtol=1e-10)
    np.testing.assert_allclose(got_t.get(), Xt.var(axis=0), rtol=1e-10)
