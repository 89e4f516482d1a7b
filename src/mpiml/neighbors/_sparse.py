"""Distances between rows of which one side or both are sparse (CSR), on the host or the GPU.

The same code runs on SciPy CSR with NumPy (CPU ranks) and on ``cupyx.scipy.sparse``
CSR with CuPy (GPU ranks, where the products go to cuSPARSE through CuPy): nothing
here is densified beyond one block of distances.

* euclidean / sqeuclidean: ``|q|² - 2 q·x + |x|²``, the inner products a sparse
  product (SpGEMM when both sides are sparse, SpMM when one is dense), the squared
  norms from the stored values;
* cosine: the same inner products of rows scaled to unit norm (a zero row is at
  distance 1 from everything, as in :func:`mpiml.neighbors._ring.local_distances`);
* manhattan: ``|a|₁ + Σ_{c ∈ supp(b)} (|a_c - b_c| - |a_c|)`` with ``a`` a dense row and
  ``b`` a sparse one: the stored entries of ``b`` are gathered against each dense row
  and summed back per row of ``b`` with one sparse product; when both sides are
  sparse, the query side is densified a few rows at a time.

The distances that are reported are recomputed exactly for the selected pairs
(:func:`pair_sq_distances`: the sparse difference of the two rows, so identical rows
are at distance exactly 0, as on the dense path).
"""

import numpy as np

__all__ = ["is_sparse", "sparse_module", "csr_like", "canonical", "prepare", "distances", "pair_sq_distances",
           "row_sq_norms", "row_of_entries"]

#: Bytes of one temporary block (a block of distances, gathered values) on the host and on a GPU.
HOST_BLOCK_BYTES = 32 << 20
DEVICE_BLOCK_BYTES = 512 << 20


def is_sparse(X):
    """True for SciPy and ``cupyx.scipy.sparse`` matrices and arrays."""
    mod = type(X).__module__
    return mod.startswith("scipy.sparse") or mod.startswith("cupyx.scipy.sparse")


def sparse_module(xp):
    """``scipy.sparse`` for NumPy, ``cupyx.scipy.sparse`` for CuPy."""
    if xp is np:
        import scipy.sparse as sp

        return sp
    import cupyx.scipy.sparse as csp

    return csp


def block_bytes(xp):
    return HOST_BLOCK_BYTES if xp is np else DEVICE_BLOCK_BYTES


def csr_like(data, indices, indptr, n_cols, xp):
    """A CSR matrix of SciPy (NumPy arrays) or cupyx (CuPy arrays) from its three arrays.

    cupyx keeps 32-bit indices where they fit (cuSPARSE's common case).
    """
    n_rows = int(indptr.shape[0]) - 1
    if xp is not np and n_cols < 2**31 and int(indices.shape[0]) < 2**31:
        indices, indptr = indices.astype(xp.int32, copy=False), indptr.astype(xp.int32, copy=False)
    return sparse_module(xp).csr_matrix((data, indices, indptr), shape=(n_rows, int(n_cols)))


def row_of_entries(A, xp):
    """The row of every stored entry of the CSR matrix ``A`` (int64, ``nnz`` values)."""
    nnz = int(A.indptr[-1]) if A.shape[0] else 0
    return xp.searchsorted(A.indptr.astype(xp.int64), xp.arange(nnz, dtype=xp.int64), side="right") - 1


def _row_sums(values, A, xp):
    """Per-row sums of ``values`` given per stored entry of ``A`` (dtype of ``values``)."""
    if A.shape[0] == 0:
        return xp.zeros(0, dtype=values.dtype)
    return xp.bincount(row_of_entries(A, xp), weights=values, minlength=A.shape[0]).astype(values.dtype)


def row_sq_norms(A, xp):
    """Squared Euclidean norm of every row (dtype of ``A``)."""
    if is_sparse(A):
        return _row_sums(A.data * A.data, A, xp)
    return (A * A).sum(axis=1)


def _row_l1(A, xp):
    if is_sparse(A):
        return _row_sums(xp.abs(A.data), A, xp)
    return xp.abs(A).sum(axis=1)


def _scaled_rows(A, scale, xp):
    """Every row of ``A`` times ``scale[row]`` (sparse stays sparse)."""
    if is_sparse(A):
        data = A.data * scale[row_of_entries(A, xp)]
        return csr_like(data, A.indices, A.indptr, A.shape[1], xp)
    return A * scale[:, None]


def _mean_nnz(A):
    return int(A.nnz) // max(1, A.shape[0])


def canonical(A):
    """``A`` as CSR without duplicate entries (a copy only when ``A`` has duplicates or unsorted
    indices): the norms are taken from the stored values."""
    A = A.tocsr()
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    return A


def _dense(A, xp):
    return xp.asarray(A.toarray()) if is_sparse(A) else A


class Prepared:
    """What a block of index rows contributes to every query chunk, computed once per block.

    ``X`` the rows (cosine: scaled to unit norm), ``XT`` their transpose as CSR when ``X`` is
    sparse (so that a sparse query chunk times it is one SpGEMM, with no transposition per
    chunk), ``norms`` the squared norms (euclidean), the L1 norms (manhattan) or the
    non-zero mask (cosine).
    """

    __slots__ = ("X", "XT", "norms", "metric")

    def __init__(self, X, metric, xp):
        self.metric = metric
        self.XT = None
        if metric in ("euclidean", "sqeuclidean"):
            self.norms = row_sq_norms(X, xp)
        elif metric == "cosine":
            n = xp.sqrt(row_sq_norms(X, xp))
            self.norms = n > 0
            X = _scaled_rows(X, 1.0 / xp.where(self.norms, n, 1), xp)
        else:  # manhattan
            self.norms = _row_l1(X, xp)
        self.X = X
        if is_sparse(X) and metric != "manhattan":
            self.XT = X.T.tocsr()


def prepare(X, metric, xp):
    return Prepared(X, metric, xp)


def _inner(Q, P, xp):
    """Dense ``Q @ X.T`` for the prepared block ``P`` (any mix of sparse and dense)."""
    X = P.X
    if is_sparse(Q):
        if is_sparse(X):
            return _dense(Q @ P.XT, xp)  # SpGEMM, then one dense block
        return xp.asarray(Q @ X.T)       # SpMM
    if is_sparse(X):
        return xp.ascontiguousarray(xp.asarray(X @ Q.T).T)  # SpMM on the transposed problem
    return Q @ X.T


def distances(Q, P, xp):
    """Dense ``(len(Q), len(P.X))`` distances of query rows ``Q`` to a prepared index block."""
    metric = P.metric
    dtype = Q.dtype
    if metric in ("euclidean", "sqeuclidean"):
        D = _inner(Q, P, xp).astype(dtype, copy=False)
        D *= -2
        D += row_sq_norms(Q, xp)[:, None]
        D += P.norms[None, :].astype(dtype, copy=False)
        xp.maximum(D, 0, out=D)
        return xp.sqrt(D, out=D) if metric == "euclidean" else D
    if metric == "cosine":
        n = xp.sqrt(row_sq_norms(Q, xp))
        qz = n > 0
        Qn = _scaled_rows(Q, 1.0 / xp.where(qz, n, 1), xp)
        D = 1.0 - _inner(Qn, P, xp).astype(dtype, copy=False)
        D[~qz, :] = 1.0
        D[:, ~P.norms] = 1.0
        return xp.maximum(D, 0, out=D)
    return _manhattan(Q, P.X, P.norms, xp).astype(dtype, copy=False)


def _manhattan_dense_sparse(A, B, xp):
    """L1 distances of dense rows ``A`` to sparse rows ``B``: ``(len(A), len(B))``."""
    nnz = int(B.indptr[-1]) if B.shape[0] else 0
    out = xp.empty((A.shape[0], B.shape[0]), dtype=A.dtype)
    l1 = xp.abs(A).sum(axis=1)
    # S sums the stored entries of every row of B: row j of S has ones at B's entries of row j
    if nnz == 0:
        out[...] = l1[:, None]
        return out
    S = csr_like(xp.ones(nnz, dtype=A.dtype), xp.arange(nnz, dtype=xp.int64), B.indptr, nnz, xp)
    step = max(1, int(block_bytes(xp) // max(1, 2 * nnz * A.dtype.itemsize)))
    for s in range(0, A.shape[0], step):
        G = A[s:s + step][:, B.indices]
        H = xp.abs(G - B.data[None, :]) - xp.abs(G)
        out[s:s + step] = l1[s:s + step, None] + xp.asarray(S @ H.T).T
    return out


def _manhattan(Q, X, x_l1, xp):
    if not is_sparse(X):
        if is_sparse(Q):  # |q - x| is symmetric: the dense side plays the rows
            return _manhattan_dense_sparse(X, Q, xp).T
        return xp.abs(Q[:, None, :] - X[None, :, :]).sum(axis=2)
    if not is_sparse(Q):
        return _manhattan_dense_sparse(Q, X, xp)
    # both sparse: densify a few query rows at a time
    out = xp.empty((Q.shape[0], X.shape[0]), dtype=Q.dtype)
    step = max(1, int(block_bytes(xp) // max(1, Q.shape[1] * Q.dtype.itemsize)))
    for s in range(0, Q.shape[0], step):
        out[s:s + step] = _manhattan_dense_sparse(_dense(Q[s:s + step], xp), X, xp)
    return out


def pair_sq_distances(Q, X, qrows, xrows, xp):
    """Exact squared distances ``|Q[qrows[p]] - X[xrows[p]]|²`` for pairs ``p`` (1-D index arrays).

    Computed from the differences of the two rows (a sparse difference when both are
    sparse, dense rows otherwise), so identical rows are at distance exactly 0.
    """
    n = int(qrows.shape[0])
    out = xp.empty(n, dtype=Q.dtype)
    both = is_sparse(Q) and is_sparse(X)
    if both:  # the two rows and their difference, values and indices
        per_pair = 3 * (Q.dtype.itemsize + 8) * (_mean_nnz(Q) + _mean_nnz(X) + 1)
    else:
        per_pair = 2 * Q.shape[1] * Q.dtype.itemsize
    step = max(1, int(block_bytes(xp) // max(1, per_pair)))
    for s in range(0, n, step):
        A, B = Q[qrows[s:s + step]], X[xrows[s:s + step]]
        if both:
            diff = A - B
            out[s:s + step] = row_sq_norms(diff.tocsr(), xp)
        else:
            diff = _dense(A, xp) - _dense(B, xp)
            out[s:s + step] = (diff * diff).sum(axis=1)
    return out
