"""randomized_svd's range finder with the CholeskyQR2 algebra deferred as on a GPU (``device=True``), run on the
host with a NumPy stand-in for the device kernel: the same result as the host's algebra, and None (the caller then
runs the host's) when a deferred check fails."""

import numpy as np
import pytest
import scipy.sparse as sp

from mpiml.comm import get_comm
from mpiml.decomposition import _solvers


def _host_cholinv(G, flag, max_cond=0.0):
    """What mpiml_small_cholinv computes, on the host: R, R⁻¹ and the flags (1: not positive definite, 2: past
    max_cond by the Frobenius bound)."""
    G = np.asarray(G, dtype=np.float64)
    try:
        L = np.linalg.cholesky(G)
    except np.linalg.LinAlgError:
        flag[0] |= 1
        L = np.eye(G.shape[0])
    R = L.T
    Rinv = np.linalg.inv(R)
    if max_cond > 0 and not np.linalg.norm(R) * np.linalg.norm(Rinv) <= max_cond:
        flag[0] |= 2
    return R, Rinv


def _host_svd(R, flag):
    """What mpiml_small_svd computes, on the host."""
    return np.linalg.svd(np.asarray(R), full_matrices=False)


@pytest.fixture
def host_kernel(monkeypatch):
    monkeypatch.setattr(_solvers._sparse_kernels, "small_cholinv", _host_cholinv)
    monkeypatch.setattr(_solvers._sparse_kernels, "small_svd", _host_svd)


@pytest.mark.parametrize("steps", [(None, "cholesky_qr2", "cholesky_qr2"),
                                   ("cholesky_qr2", "cholesky_qr2", "cholesky_qr2"), ("tsqr", "tsqr", "tsqr")])
def test_deferred_algebra_equals_host(host_kernel, steps):
    comm = get_comm("self")
    rs = np.random.RandomState(0)
    X = sp.csr_matrix(sp.random(3000, 400, density=0.02, random_state=rs) @ sp.diags(0.95 ** np.arange(400)))
    Om = _solvers.gaussian_matrix(0, (400, 18), comm, np, np.float64)
    a = _solvers._range_svd(X, Om, comm, np, 5, *steps, device=False)
    b = _solvers._range_svd(X, Om, comm, np, 5, *steps, device=True)
    np.testing.assert_allclose(b[2], a[2], rtol=1e-12)
    np.testing.assert_allclose(np.abs((a[3][:8] * b[3][:8]).sum(axis=1)), 1.0, rtol=1e-10)


def test_implicit_final_step_equals_host(host_kernel):
    """The final step with Q left implicit (one Cholesky of Y's Gram matrix, Bᵀ = (Xᵀ Y) R⁻¹) gives the host's
    singular values and vectors; an iterate past its condition bound fails the check (None: the caller redoes)."""
    comm = get_comm("self")
    rs = np.random.RandomState(0)
    X = sp.csr_matrix(sp.random(3000, 400, density=0.02, random_state=rs) @ sp.diags(0.95 ** np.arange(400)))
    Om = _solvers.gaussian_matrix(0, (400, 18), comm, np, np.float64)
    a = _solvers._range_svd(X, Om, comm, np, 5, None, "cholesky_qr2", "cholesky_qr2", device=False)
    b = _solvers._range_svd(X, Om, comm, np, 5, None, "cholesky_qr2", "cholesky_qr2", device=True, implicit=True)
    assert b[0] is None
    np.testing.assert_allclose(b[2], a[2], rtol=1e-10)
    np.testing.assert_allclose(np.abs((a[3][:8] * b[3][:8]).sum(axis=1)), 1.0, rtol=1e-10)
    X1 = sp.csr_matrix(np.outer(rs.rand(1000), rs.rand(400)) + 1e-9 * rs.rand(1000, 400))   # rank one, nearly
    assert _solvers._range_svd(X1, Om, comm, np, 5, None, "cholesky_qr2", "cholesky_qr2", device=True,
                               implicit=True) is None


def test_failed_check_returns_none(host_kernel):
    comm = get_comm("self")
    rs = np.random.RandomState(1)
    X = sp.csr_matrix(np.outer(rs.rand(1000), rs.rand(300)) + 1e-9 * rs.rand(1000, 300))   # rank one, nearly
    Om = _solvers.gaussian_matrix(0, (300, 18), comm, np, np.float64)
    assert _solvers._range_svd(X, Om, comm, np, 5, None, "cholesky_qr2", "cholesky_qr2", device=True) is None
    assert _solvers._range_svd(X, Om, comm, np, 5, None, "cholesky_qr2", "cholesky_qr2", device=False) is not None


def test_algebra_mode_from_the_environment(monkeypatch):
    monkeypatch.setenv("MPIML_RANDOMIZED_ALGEBRA", "device")
    assert _solvers.algebra_mode() == "device"
    monkeypatch.setenv("MPIML_RANDOMIZED_ALGEBRA", "gpu")
    with pytest.raises(ValueError, match="MPIML_RANDOMIZED_ALGEBRA must be one of"):
        _solvers.algebra_mode()


def test_squared_deviations_from_a_sorted_transpose_add_duplicates_first():
    """The variances' path for a shard with duplicate entries (``_sq_dev_sorted``: Xᵀ's rows sorted, duplicates next to
    each other, as cuSPARSE's and the bucket transpose leave them) gives the squared deviations of the matrix whose
    duplicates are summed, implicit zeros included, empty rows and columns too."""
    import scipy.sparse as sp

    from mpiml.decomposition._truncated_svd import _sq_dev_sorted

    rs = np.random.RandomState(0)
    for n, d, nnz in ((30, 20, 150), (5, 40, 60), (50, 3, 200), (7, 7, 0)):
        r, c, v = rs.randint(0, n, nnz), rs.randint(0, d, nnz), rs.standard_normal(nnz)
        order = np.argsort(r, kind="stable")
        X = sp.csr_matrix((v[order], c[order], np.concatenate([[0], np.cumsum(np.bincount(r, minlength=n))])),
                          shape=(n, d))
        C = X.tocsc()                       # a counting sort by column: rows increasing, duplicates kept, adjacent
        XT = sp.csr_matrix((C.data, C.indices, C.indptr), shape=(d, n))
        m = rs.standard_normal(d)
        np.testing.assert_allclose(_sq_dev_sorted(XT, m, n, np), ((X.toarray() - m) ** 2).sum(), rtol=1e-12)
