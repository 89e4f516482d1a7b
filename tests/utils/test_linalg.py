"""Distributed QR (TSQR, CholeskyQR2) at 1, 2, 3 and 4 ranks: one launch per rank count.

The checks live in ``linalg_spmd_script.py``, launched with the validation checks (``_utils_launches.py``);
single-process argument checks are here.
"""

import numpy as np
import pytest

from mpiml.comm import get_comm
from mpiml.utils._linalg import cholesky_qr2, orthonormalize, tsqr

import _utils_launches


@pytest.fixture
def utils_launches(tmp_path_factory):
    return _utils_launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_linalg_spmd(utils_launches, n):
    utils_launches.verdict(n, "linalg")


def test_bad_arguments():
    comm = get_comm("self")
    A = np.ones((4, 2))
    with pytest.raises(ValueError, match="method must be"):
        tsqr(A, comm, method="ring")
    with pytest.raises(ValueError, match="on_failure must be"):
        cholesky_qr2(A, comm, on_failure="ignore")
    with pytest.raises(ValueError, match="method must be"):
        orthonormalize(A, comm, method="lu")
    with pytest.raises(ValueError, match="2-D"):
        tsqr(np.ones(3), comm)


def _with_duplicates(A):
    """``A`` (CSR) with its first stored value split into two entries, stored in reverse row order (unsorted)."""
    import scipy.sparse as sp

    coo = A.tocoo()
    rows, cols, vals = coo.row.tolist(), coo.col.tolist(), coo.data.tolist()
    rows.append(rows[0])
    cols.append(cols[0])
    vals[0] /= 4.0
    vals.append(3.0 * vals[0])
    order = np.lexsort((-np.array(cols), np.array(rows)))
    indptr = np.concatenate([[0], np.cumsum(np.bincount(np.array(rows), minlength=A.shape[0]))])
    return sp.csr_matrix((np.array(vals)[order], np.array(cols)[order], indptr), shape=A.shape)


def _sparse_cases():
    import scipy.sparse as sp

    A = sp.random(300, 40, density=0.2, format="csr", random_state=np.random.default_rng(3))
    unsorted = A.copy()
    for r in range(0, 300, 2):      # reversed indices in every other row: not canonical, no duplicates
        a, b = unsorted.indptr[r], unsorted.indptr[r + 1]
        unsorted.indices[a:b] = unsorted.indices[a:b][::-1].copy()
        unsorted.data[a:b] = unsorted.data[a:b][::-1].copy()
    return {"canonical": A, "unsorted": unsorted, "duplicates": _with_duplicates(A)}


@pytest.mark.parametrize("case", ["canonical", "unsorted", "duplicates"])
def test_column_sq_dev_of_sparse_rows_leaves_the_matrix_alone(case):
    """The squared deviations of the stored matrix (duplicates summed), a copy only when not canonical, and
    no flag cached on the caller's matrix (SciPy caches has_canonical_format on the matrix it checks)."""
    import scipy.sparse as sp

    from mpiml.utils._linalg import column_sq_dev, summed_duplicates

    A = _sparse_cases()[case]
    A = sp.csr_matrix((A.data, A.indices, A.indptr), shape=A.shape)   # fresh: no cached flag
    before = (A.data.copy(), A.indices.copy(), A.indptr.copy(), set(vars(A)))
    dense = A.toarray()
    mean = dense.mean(axis=0) + 0.1
    np.testing.assert_allclose(column_sq_dev(A, mean), ((dense - mean) ** 2).sum(axis=0), rtol=1e-12)
    B = summed_duplicates(A)
    assert (B is A) == (case == "canonical")
    np.testing.assert_array_equal(B.toarray(), dense)
    assert B is A or B.has_canonical_format
    assert set(vars(A)) == before[3], "a flag was cached on the caller's matrix"
    for got, want in zip((A.data, A.indices, A.indptr), before[:3]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["canonical", "unsorted", "duplicates"])
def test_column_sq_dev_of_cupyx_rows_sorts_only_when_needed(case, monkeypatch):
    """On cupyx (which says False for any matrix built from arrays) the indices are checked on the device: a
    canonical matrix is read as it is (no copy, no sort), the others summed on a copy; the host's numbers."""
    import cupy
    import cupyx.scipy.sparse as csp

    from mpiml.utils._linalg import column_sq_dev, summed_duplicates

    H = _sparse_cases()[case]
    A = csp.csr_matrix((cupy.asarray(H.data), cupy.asarray(H.indices), cupy.asarray(H.indptr)), shape=H.shape)
    flag = A.has_canonical_format
    sorts = []
    original = csp.csr_matrix.sum_duplicates

    def counted(self):
        sorts.append(self is A)
        return original(self)

    monkeypatch.setattr(csp.csr_matrix, "sum_duplicates", counted)
    dense = H.toarray()
    mean = dense.mean(axis=0) + 0.1
    got = column_sq_dev(A, cupy.asarray(mean))
    np.testing.assert_allclose(cupy.asnumpy(got), ((dense - mean) ** 2).sum(axis=0), rtol=1e-12)
    assert (not sorts) if case == "canonical" else (sorts and not any(sorts)), sorts   # never the caller's matrix
    assert (summed_duplicates(A) is A) == (case == "canonical")
    assert A.has_canonical_format == flag and A.nnz == H.nnz
    np.testing.assert_array_equal(cupy.asnumpy(A.indices), H.indices)
