"""Nearest neighbours on sparse rows: SciPy CSR shards on 1-4 ranks (``neighbors_sparse_spmd_script.py``),
and the sparse distance helpers against dense ones on one process."""

import os

import numpy as np
import pytest
import scipy.sparse as sp

from mpiml.neighbors import _sparse
from mpiml.neighbors._ring import local_distances

import _neighbors_launches

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _neighbors_launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sparse_neighbors_spmd(launches, n):
    launches.verdict(n, "sparse")    # neighbors_sparse_spmd_script.py, in the folder's shared launches


@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean", "cosine", "manhattan"])
def test_sparse_distance_blocks_equal_dense(metric):
    rs = np.random.RandomState(0)
    X = rs.randn(70, 9) * (rs.rand(70, 9) < 0.3)
    Q = rs.randn(15, 9) * (rs.rand(15, 9) < 0.3)
    X[3] = 0.0
    want = local_distances(Q, X, metric, np)
    for q, x in ((sp.csr_matrix(Q), sp.csr_matrix(X)), (Q, sp.csr_matrix(X)), (sp.csr_matrix(Q), X)):
        got = _sparse.distances(q, _sparse.prepare(x, metric, np), np)
        assert isinstance(got, np.ndarray) and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_manhattan_blocks_smaller_than_the_data(monkeypatch):
    # tiny temporary blocks: every chunked loop runs many times
    monkeypatch.setattr(_sparse, "HOST_BLOCK_BYTES", 256)
    rs = np.random.RandomState(1)
    X = rs.randn(40, 30) * (rs.rand(40, 30) < 0.2)
    Q = rs.randn(11, 30) * (rs.rand(11, 30) < 0.2)
    want = local_distances(Q, X, "manhattan", np)
    got = _sparse.distances(sp.csr_matrix(Q), _sparse.prepare(sp.csr_matrix(X), "manhattan", np), np)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    pairs = _sparse.pair_sq_distances(sp.csr_matrix(Q), sp.csr_matrix(X), np.arange(11), np.arange(11) * 3, np)
    np.testing.assert_allclose(pairs, ((Q - X[np.arange(11) * 3]) ** 2).sum(1), rtol=1e-12)


def test_duplicate_entries_are_summed_before_norms():
    # a CSR with a duplicated (row, column) entry means their sum, as in SciPy
    A = sp.csr_matrix((np.array([1.0, 2.0, 5.0]), np.array([0, 0, 1]), np.array([0, 2, 3])), shape=(2, 2))
    assert not A.has_canonical_format
    C = _sparse.canonical(A)
    np.testing.assert_allclose(_sparse.row_sq_norms(C, np), [9.0, 25.0])
    assert not A.has_canonical_format  # the caller's matrix is left alone
