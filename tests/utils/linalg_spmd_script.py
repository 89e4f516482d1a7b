"""TSQR and CholeskyQR2 checks under ``mpiexec -n N``, run for test_linalg.py (through _utils_launches.py).

Every rank builds the same global matrices, keeps a shard of them (uneven,
one rank may be empty or hold fewer rows than columns), and compares the
distributed factors with NumPy's QR of the whole matrix.  Verdicts are
collective (tests/_spmd.py).
"""

import numpy as np
from sklearn.utils.extmath import svd_flip

from mpiml.comm import get_comm
from mpiml.utils._linalg import NotPositiveDefiniteError, cholesky_qr2, gram, orthonormalize, svd_flip_rows, tsqr

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size


def shard(a, bounds=None):
    """Uneven contiguous split (rank r holds a share proportional to r + 1), or explicit bounds."""
    n = a.shape[0]
    if bounds is None:
        w = np.arange(1, size + 1, dtype=np.float64)
        bounds = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])
    return a[bounds[rank]:bounds[rank + 1]]


def odd_bounds(n):
    """Rank 0 empty, rank 1 two rows (fewer than d), the rest split evenly (size >= 2)."""
    if size == 1:
        return [0, n]
    rest = np.linspace(2, n, size).round().astype(int).tolist()
    return [0, 0] + rest[1:] if size > 2 else [0, 0, n]


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def reference_qr(A):
    Q, R = np.linalg.qr(A)
    s = np.where(np.diag(R) < 0, -1.0, 1.0)
    return Q * s, R * s[:, None]


def same_everywhere(x, what):
    x = np.ascontiguousarray(x)
    mx = comm.allreduce(x, op="max") if size > 1 else x
    mn = comm.allreduce(x, op="min") if size > 1 else x
    check(np.array_equal(mx, mn), f"{what} differs across ranks")


def check_qr(A, bounds, tag, method, rtol=1e-10, dtype=np.float64):
    Al = shard(A, bounds).astype(dtype)
    Qref, Rref = reference_qr(A.astype(np.float64))
    Q, R = tsqr(Al, comm, want_q=True, method=method)
    _, R_only = tsqr(Al, comm, method=method)
    check(R.dtype == dtype and Q.dtype == dtype, f"{tag}: dtype {Q.dtype}/{R.dtype}, want {dtype}")
    check(R.shape == Rref.shape and Q.shape == (Al.shape[0], Rref.shape[0]), f"{tag}: shapes {Q.shape} {R.shape}")
    check(bool((np.diag(R) >= 0).all()), f"{tag}: negative diagonal of R")
    scale = np.abs(Rref).max()
    assert_close(R, Rref.astype(dtype), f"{tag}: R vs numpy", rtol=rtol, atol=rtol * scale)
    assert_close(R_only, R, f"{tag}: R without Q", rtol=0, atol=0, exact=True)
    Qg = gathered(Q).astype(np.float64)
    assert_close(Qg, Qref, f"{tag}: Q vs numpy", rtol=rtol * 10, atol=rtol * 10)
    same_everywhere(R, f"{tag}: R")


def main():
    rs = np.random.RandomState(0)
    A = rs.randn(61, 7) @ np.diag([1, 2, 3, 1e-1, 5, 1e2, 1])
    for method in ("allgather", "tree", "auto"):
        check_qr(A, None, f"uneven/{method}", method)
        check_qr(A, odd_bounds(61), f"empty rank/{method}", method)
        check_qr(A, None, f"float32/{method}", method, rtol=1e-4, dtype=np.float32)

    # rank-deficient: duplicated and zero columns; Q orthonormal, A = QR, R shared
    B = rs.randn(40, 6)
    B[:, 3] = B[:, 0]
    B[:, 5] = 0.0
    for method in ("allgather", "tree"):
        Q, R = tsqr(shard(B, odd_bounds(40)), comm, want_q=True, method=method)
        Qg = gathered(Q)
        assert_close(Qg.T @ Qg, np.eye(6), f"rank-deficient/{method}: Q^T Q", atol=1e-12)
        assert_close(Qg @ R, B, f"rank-deficient/{method}: QR", atol=1e-12)
        same_everywhere(R, f"rank-deficient/{method}: R")

    # fewer global rows than columns: R is (n, d) like numpy's reduced QR
    C = rs.randn(5, 9)
    for method in ("allgather", "tree"):
        check_qr(C, None, f"wide/{method}", method)

    # CholeskyQR2: well conditioned matches TSQR/numpy
    Qc, Rc = cholesky_qr2(shard(A), comm)
    Qref, Rref = reference_qr(A)
    assert_close(Rc, Rref, "cholqr2: R", rtol=1e-10, atol=1e-10 * np.abs(Rref).max())
    assert_close(gathered(Qc), Qref, "cholqr2: Q", rtol=1e-9, atol=1e-9)
    same_everywhere(Rc, "cholqr2: R")
    Qc32, Rc32 = cholesky_qr2(shard(A).astype(np.float32), comm)
    check(Qc32.dtype == np.float32 and Rc32.dtype == np.float32, "cholqr2 float32 dtypes")
    Qg = gathered(Qc32).astype(np.float64)
    assert_close(Qg.T @ Qg, np.eye(7), "cholqr2 float32: Q^T Q", atol=1e-5)

    # ill-conditioned (cond 1e10): fallback to TSQR, or the same error everywhere
    U, _ = np.linalg.qr(rs.randn(80, 6))
    V, _ = np.linalg.qr(rs.randn(6, 6))
    D = (U * np.logspace(0, -10, 6)) @ V.T
    Qd, Rd = cholesky_qr2(shard(D), comm)
    Qg = gathered(Qd)
    assert_close(Qg.T @ Qg, np.eye(6), "cholqr2 fallback: Q^T Q", atol=1e-12)
    assert_close(Qg @ Rd, D, "cholqr2 fallback: QR", atol=1e-13)
    msgs = []
    for M in (D, B):  # ill-conditioned, then singular
        try:
            cholesky_qr2(shard(M), comm, on_failure="raise")
            msgs.append(None)
        except NotPositiveDefiniteError as exc:
            msgs.append(str(exc))
    check(all(m is not None for m in msgs), f"on_failure='raise' did not raise: {msgs}")
    every = comm.allgather_obj(msgs) if size > 1 else [msgs]
    check(all(m == every[0] for m in every), f"error text differs across ranks: {every}")
    Qo = orthonormalize(shard(A), comm, method="cholesky_qr2")
    Qt = orthonormalize(shard(A), comm, method="tsqr")
    assert_close(Qo, Qt, "orthonormalize: both methods", atol=1e-9)

    # float64 Gram with a shift, chunked float32 upcast
    mu = A.mean(axis=0)
    G = comm.allreduce(gram(shard(A), shift=mu)) if size > 1 else gram(shard(A), shift=mu)
    assert_close(G, (A - mu).T @ (A - mu), "gram with shift", rtol=1e-12, atol=1e-10)
    G32 = gram(shard(A).astype(np.float32), chunk_rows=3)
    check(G32.dtype == np.float64, "gram of float32 is float64")

    # the sign rule of scikit-learn's svd_flip(u_based_decision=False)
    Vt = rs.randn(4, 9)
    Uu = rs.randn(12, 4)
    u_ref, v_ref = svd_flip(Uu.copy(), Vt.copy(), u_based_decision=False)
    u_got, v_got = svd_flip_rows(Vt.copy(), Uu.copy())
    assert_close(v_got, v_ref, "svd_flip_rows Vt", exact=True)
    assert_close(u_got, u_ref, "svd_flip_rows U", exact=True)


if __name__ == "__main__":
    guarded(main, comm)
