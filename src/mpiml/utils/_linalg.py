"""Distributed dense linear algebra on row-distributed matrices (SPMD), NumPy or CuPy.

A matrix ``A`` of shape ``(n, d)`` is spread over the ranks of a communicator
by rows: rank ``r`` holds the block ``A_r`` of ``n_r`` rows, and the global
row order is the rank order.  The functions here are collective: every rank
calls them with its own block and the same keyword arguments.

* :func:`tsqr` — tall-skinny QR by a reduction of the ranks' R factors
  (communication-avoiding QR); as stable as Householder QR for any ``A``.
* :func:`cholesky_qr2` — two rounds of Gram matrix + Cholesky, one allreduce
  each; faster, stable while ``cond(A)`` is below about ``1e7``.
* :func:`orthonormalize` — an orthonormal basis of the columns of ``A`` by
  either method (what randomised SVD calls between power iterations).
* :func:`gram` — ``(A - shift)^T (A - shift)`` accumulated in float64.
* :func:`augmented_gram` — ``[A | Y | 1]ᵀ W [A | Y | 1]`` in float64 from one
  read of ``A``: the Gram matrix, the cross products and the column sums at once.
* :func:`svd_flip_rows` — scikit-learn's ``svd_flip(u, v, u_based_decision=False)``
  sign rule on the replicated factor.

Sparse shards (SciPy CSR on the host, ``cupyx.scipy.sparse`` CSR on a GPU) are
served by the helpers of the last section: :func:`is_sparse`, :func:`to_csr`,
:func:`sparse_gram` (``AᵀA`` by a sparse product, never densifying ``A``),
:func:`scale_rows`, :func:`column_sums` and :func:`column_sq_dev` (dense or sparse).
Everything else here (the QR factorisations) needs dense blocks.

Both QR functions return ``R`` replicated on every rank with a non-negative
diagonal, so ``R`` is the unique R factor of the global ``A`` when ``A`` has
full column rank, whatever the number of ranks.  Every function uses the
namespace of its input (``numpy`` or ``cupy``, whose ``linalg`` has ``qr``,
``cholesky``, ``eigh`` and ``svd``): the host and the GPU run the same code.
"""

import numpy as np

from .._array import get_namespace, to_numpy

__all__ = ["tsqr", "cholesky_qr2", "orthonormalize", "gram", "augmented_gram", "svd_flip_rows",
           "NotPositiveDefiniteError",
           "is_sparse", "to_csr", "sparse_gram", "scale_rows", "column_sums", "column_sq_dev", "summed_duplicates",
           "densify_rows"]

#: Tag of the point-to-point messages of the TSQR tree (the user's p2p context).
_TSQR_TAG = 2571

#: ``method="auto"`` of :func:`tsqr` gathers every R on every rank while the
#: gathered stack stays below this many bytes and the communicator this small;
#: beyond, it climbs a binary tree (2 log2(p) messages of at most d x d).
_GATHER_MAX_BYTES = 32 << 20
_GATHER_MAX_RANKS = 16

#: :func:`cholesky_qr2` gives up (and falls back or raises) when the first R
#: factor's 2-norm condition number exceeds this: CholeskyQR2 loses
#: orthogonality beyond about ``u**-0.5`` of the float64 Gram (u = 1.1e-16).
CHOLQR2_MAX_COND = 1e7


class NotPositiveDefiniteError(np.linalg.LinAlgError):
    """The Gram matrix of :func:`cholesky_qr2` is not (numerically) positive definite."""


# ---------------------------------------------------------------------- small helpers
def _allreduce(comm, x):
    return comm.allreduce(x) if comm.size > 1 else x


def _local_qr(A, xp):
    """Reduced QR of a local block: ``Q`` (n, k), ``R`` (k, d), ``k = min(n, d)``; empty blocks too."""
    n, d = A.shape
    if n == 0 or d == 0:
        return xp.zeros((n, 0), dtype=A.dtype), xp.zeros((0, d), dtype=A.dtype)
    return xp.linalg.qr(A, mode="reduced")


def _diag_signs(R, xp):
    """+1/-1 per row of ``R`` making its diagonal non-negative (0 counts as +)."""
    m = min(R.shape)
    diag = xp.diagonal(R)[:m]
    return xp.where(diag < 0, -1.0, 1.0).astype(R.dtype)


def gram(A, *, shift=None, chunk_rows=None):
    """``(A - shift)^T (A - shift)`` of a local block, accumulated in float64.

    Parameters
    ----------
    A : ndarray of shape (n, d)
        NumPy or CuPy.
    shift : ndarray of shape (d,), default=None
        Subtracted from every row first (the global mean for a covariance).
    chunk_rows : int, default=None
        Rows upcast at a time when ``A`` is not float64 (bounds the extra
        memory); None picks about 64 MiB of float64.  A sparse ``A`` is not
        densified: ``AᵀA`` is a sparse product and the shift is applied to
        the ``d x d`` result.

    Returns
    -------
    ndarray of shape (d, d), float64, on the namespace of ``A``.
    """
    xp = get_namespace(A)
    n, d = A.shape
    if is_sparse(A):
        # (A - 1 sᵀ)ᵀ(A - 1 sᵀ) = AᵀA - s cᵀ - c sᵀ + n s sᵀ with c the column sums: A stays sparse
        G = sparse_gram(A)
        if shift is not None and n:
            s = xp.asarray(shift, dtype=xp.float64)
            c = column_sums(A)
            G -= xp.outer(s, c) + xp.outer(c, s) - n * xp.outer(s, s)
        return G
    if shift is None and A.dtype == xp.float64:
        return A.T @ A
    if shift is None and xp is not np:
        # one read of A by the Gram kernel (or cuBLAS on one reused float64 buffer), no float64 copy per chunk
        return xp.ascontiguousarray(augmented_gram(A)[:d, :d])
    step = chunk_rows or max(1, (64 << 20) // (8 * max(d, 1)))
    out = xp.zeros((d, d), dtype=xp.float64)
    sh = None if shift is None else xp.asarray(shift, dtype=xp.float64)
    for s in range(0, n, step):
        block = A[s:s + step].astype(xp.float64)
        if sh is not None:
            block -= sh
        out += block.T @ block
    return out


def augmented_gram(A, Y=None, weights=None, *, chunk_bytes=None):
    """``Zᵀ diag(weights) Z`` with ``Z = [A | Y | 1]`` of a local dense block, float64, one read of ``A``.

    Parameters
    ----------
    A : ndarray of shape (n, d)
        Dense NumPy or CuPy block, float32 or float64.
    Y : ndarray of shape (n, t), default=None
        Extra columns (the targets of a regression); None for ``t = 0``.
    weights : ndarray of shape (n,), default=None
        Row weights; None means ones.
    chunk_bytes : int, default=None
        Bytes of the float64 row block formed at a time (8 MiB on the host,
        256 MiB on a GPU).

    Returns
    -------
    ndarray of shape (k, k), ``k = d + t + 1``, float64, on the namespace of ``A``.
        The upper-left block is ``AᵀWA``, the last column holds the weighted
        column sums of ``A`` and ``Y`` and, last, the weight total.

    Notes
    -----
    On a GPU with ``k <= 124`` a kernel (:mod:`mpiml.kernels.linear`) reads
    ``A`` once and forms every product and sum in float64 (a product of two
    float32 values is exact in float64).  Otherwise the rows go through a
    reused float64 buffer ``[A | Y | 1]`` a block at a time and BLAS (cuBLAS)
    forms ``ZᵀZ``.  Non-finite input makes the result non-finite.
    """
    xp = get_namespace(A)
    n, d = A.shape
    if Y is None:
        Y = xp.zeros((n, 0), dtype=A.dtype)
    t = Y.shape[1]
    k = d + t + 1
    if xp is not np:
        from ..kernels import linear as kernels

        # the kernel reads Y and the weights in A's dtype: only when that loses nothing
        same = Y.dtype == A.dtype and (weights is None or weights.dtype == A.dtype)
        if kernels.supported(A) and k <= kernels.GRAM_MAX_COLUMNS and same:
            return kernels.augmented_gram(A, Y, weights)
    if n == 0:
        return xp.zeros((k, k), dtype=xp.float64)
    if xp is np and weights is None:
        # the host's unweighted Gram (PCA, least squares without weights): AᵀA of cache-sized row blocks as they
        # are (no copy into a float64 [A | Y | 1] buffer, no column of ones, no padding: 1.6x fewer flops at 32
        # features, and one read of float64 rows where the copy read and wrote them too), AᵀY and YᵀY of the
        # same blocks while in cache, and the column sums on the side
        G = np.zeros((k, k))
        step = max(256, (2 << 20) // (8 * max(d, 1)))
        sums = np.zeros(d + t)
        ones = np.ones(min(step, n))
        with np.errstate(over="ignore", invalid="ignore"):
            for s in range(0, n, step):
                block = A[s:s + step].astype(np.float64, copy=False)
                G[:d, :d] += np.dot(block.T, block)
                sums[:d] += ones[:block.shape[0]] @ block  # (a GEMV: a strided sum over rows costs as much)
                if t:
                    yb = Y[s:s + step].astype(np.float64, copy=False)
                    G[:d, d:d + t] += np.dot(block.T, yb)
                    G[d:d + t, d:d + t] += np.dot(yb.T, yb)
                    sums[d:] += ones[:yb.shape[0]] @ yb
        G[d:d + t, :d] = G[:d, d:d + t].T
        G[:d + t, d + t] = G[d + t, :d + t] = sums
        G[d + t, d + t] = n
        return G
    # rows padded with zero columns to a multiple of 8 values (64 bytes): aligned rows for the GEMM; on the
    # host only past 256 columns, where alignment wins (513 -> 520: 1.2x), not below, where the padding's extra
    # products cost more (34 -> 40: 1.6x slower, 66 -> 72: 1.1x; OpenBLAS, one core)
    kp = (k + 7) // 8 * 8 if xp is not np or k > 256 else k
    G = xp.zeros((kp, kp), dtype=xp.float64)
    nbytes = chunk_bytes or ((8 << 20) if xp is np else (256 << 20))
    step = max(1024, nbytes // (8 * kp))
    buf = xp.zeros((min(step, n), kp), dtype=xp.float64)
    buf[:, k - 1] = 1.0
    with np.errstate(over="ignore", invalid="ignore"):  # overflowing squares are the caller's to find
        for s in range(0, n, step):
            e = min(n, s + step)
            Z = buf[:e - s]
            Z[:, :d] = A[s:e]
            if t:
                Z[:, d:d + t] = Y[s:e]
            if weights is None:
                G += Z.T @ Z
            else:
                G += (Z * xp.asarray(weights[s:e], dtype=xp.float64)[:, None]).T @ Z
    return xp.ascontiguousarray(G[:k, :k]) if kp != k else G


def svd_flip_rows(Vt, U=None):
    """Make the largest-magnitude entry of every row of ``Vt`` positive.

    scikit-learn's ``svd_flip(U, Vt, u_based_decision=False)`` (the rule its
    PCA and TruncatedSVD use), computed on the replicated ``Vt`` so every rank
    flips alike; ``U`` (local rows) gets the same column signs.  Unlike
    ``numpy.sign``, a row that is entirely zero keeps its sign (factor +1).

    Returns
    -------
    U, Vt : ndarrays (``U`` None when not given), flipped in place.
    """
    xp = get_namespace(Vt)
    if Vt.shape[0] == 0:
        return U, Vt
    idx = xp.argmax(xp.abs(Vt), axis=1)
    picked = xp.take_along_axis(Vt, idx[:, None], axis=1)[:, 0]
    signs = xp.where(picked < 0, -1.0, 1.0).astype(Vt.dtype)
    Vt *= signs[:, None]
    if U is not None:
        U *= signs[None, :].astype(U.dtype)
    return U, Vt


# ---------------------------------------------------------------------- TSQR
def _tsqr_gather(Q1, R1, comm, xp, want_q):
    """Every rank gathers every (padded) R, stacks them and factors the stack itself.

    One allgather of ``(d + 1) x d`` values per rank: the R factor padded to
    ``d`` rows plus a header row holding its true row count.
    """
    k, d = R1.shape
    block = xp.zeros((d + 1, d), dtype=R1.dtype)
    if d:
        block[0, 0] = k
    block[1:1 + k] = R1
    stacked = comm.allgather(block).reshape(comm.size, d + 1, d)
    counts = [int(c) for c in to_numpy(stacked[:, 0, 0])] if d else [0] * comm.size
    S = xp.concatenate([stacked[j, 1:1 + counts[j]] for j in range(comm.size)], axis=0)
    Qs, R = _local_qr(S, xp)
    signs = _diag_signs(R, xp)
    R = R * signs[:, None]
    if not want_q:
        return None, R
    off = sum(counts[:comm.rank])
    return Q1 @ (Qs[off:off + k] * signs[None, :]), R


def _tsqr_tree(Q1, R1, comm, xp, want_q):
    """Binary reduction tree of R factors to rank 0, then back down.

    Up: at level ``s`` (1, 2, 4, ...) rank ``r`` with ``r % 2s == s`` sends
    its R to ``r - s``, which stacks it under its own and refactors.  Down:
    rank 0 fixes the signs and returns, along the same edges, the final R and
    (with ``want_q``) each child's block of the product of the tree's Q factors.
    """
    rank, size = comm.rank, comm.size
    R = R1
    merges = []  # (Q of the merge, rows of this rank's part, child rank)
    parent = None
    step = 1
    while step < size:
        if rank % (2 * step) == step:
            comm.send(xp.ascontiguousarray(R), rank - step, tag=_TSQR_TAG)
            parent = rank - step
            break
        if rank + step < size:
            Rc = comm.recv(rank + step, tag=_TSQR_TAG)
            Qn, Rn = _local_qr(xp.concatenate([R, Rc], axis=0), xp)
            merges.append((Qn, R.shape[0], rank + step))
            R = Rn
        step *= 2
    if parent is None:
        signs = _diag_signs(R, xp)
        R = R * signs[:, None]
        T = xp.diag(signs) if want_q else None
    else:
        R = comm.recv(parent, tag=_TSQR_TAG)
        T = comm.recv(parent, tag=_TSQR_TAG) if want_q else None
    for Qn, k_own, child in reversed(merges):
        comm.send(R, child, tag=_TSQR_TAG)
        if want_q:
            full = Qn @ T
            comm.send(xp.ascontiguousarray(full[k_own:]), child, tag=_TSQR_TAG)
            T = full[:k_own]
    return (Q1 @ T if want_q else None), R


def tsqr(A_local, comm, *, want_q=False, method="auto"):
    """QR factorisation of a row-distributed tall-skinny matrix (TSQR).

    Each rank factors its block ``A_r = Q_r R_r`` locally; the small ``R_r``
    are then combined (stacked and factored again) until one ``R`` remains,
    which every rank receives.  The result satisfies ``A = Q R`` with ``Q``
    having orthonormal columns (this rank holds the rows of ``Q`` matching its
    rows of ``A``).

    Parameters
    ----------
    A_local : ndarray of shape (n_local, d)
        This rank's rows (NumPy or CuPy; float32 or float64).  Ranks may hold
        zero rows or fewer rows than ``d``.
    comm : Communicator
        Every rank of ``comm`` must call this with the same ``d``, ``want_q``
        and ``method``.
    want_q : bool, default=False
        Also return this rank's rows of ``Q``.
    method : {"auto", "allgather", "tree"}, default="auto"
        ``"allgather"``: every rank gathers all R factors and factors their
        stack (one collective).  ``"tree"``: binary reduction tree over
        point-to-point to rank 0, then down the same tree.  ``"auto"``:
        allgather while the stack is small (at most 16 ranks and 32 MiB),
        tree otherwise.

    Returns
    -------
    Q_local : ndarray of shape (n_local, m) or None
        This rank's rows of ``Q`` (``m = min(n, d)``, ``n`` the global row
        count); None unless ``want_q``.
    R : ndarray of shape (m, d)
        Upper triangular with a non-negative diagonal, the same on every rank.

    Notes
    -----
    Communicated, with ``p`` ranks and ``b = d * itemsize`` bytes per row:

    - ``"allgather"``: one allgather of ``(d + 1) * b`` bytes per rank; every
      rank factors the ``(p d) x d`` stack (the same arithmetic on every rank,
      so the same R on homogeneous ranks).
    - ``"tree"``: up, ``ceil(log2 p)`` rounds of one ``send`` of at most
      ``d * b`` bytes; down, the same edges carry the final R (``d * b``) and,
      with ``want_q``, a ``d x d`` block of Q.  Rank 0 alone decides R, so it is
      bit-identical everywhere.

    The computation is Householder QR throughout, so ``Q`` is orthonormal to
    working precision even when ``A`` is rank-deficient (then R has zeros, or
    rounding-level values, on its diagonal and is not unique).
    """
    if method not in ("auto", "allgather", "tree"):
        raise ValueError(f"method must be 'auto', 'allgather' or 'tree'; got {method!r}")
    xp = get_namespace(A_local)
    if A_local.ndim != 2:
        raise ValueError(f"tsqr needs a 2-D block; got shape {tuple(A_local.shape)}")
    Q1, R1 = _local_qr(A_local, xp)
    if comm.size == 1:
        signs = _diag_signs(R1, xp)
        return (Q1 * signs[None, :] if want_q else None), R1 * signs[:, None]
    if method == "auto":
        d = A_local.shape[1]
        small = comm.size * (d + 1) * d * A_local.dtype.itemsize <= _GATHER_MAX_BYTES
        method = "allgather" if small and comm.size <= _GATHER_MAX_RANKS else "tree"
    if method == "allgather":
        return _tsqr_gather(Q1, R1, comm, xp, want_q)
    return _tsqr_tree(Q1, R1, comm, xp, want_q)


# ---------------------------------------------------------------------- CholeskyQR2
def _triangular_inverse(R, xp):
    return xp.linalg.solve(R, xp.eye(R.shape[0], dtype=R.dtype))


def _cholesky_round(A, comm, xp, *, check_cond):
    """One CholeskyQR round: ``G = allreduce(A^T A)``, ``R = chol(G)^T``, ``Q = A R^-1``.

    Returns ``(Q, R)`` or ``(None, reason)`` when ``G`` is not usable; the
    decision depends only on the replicated ``G``, so every rank agrees.
    """
    G = _allreduce(comm, gram(A))
    d = G.shape[0]
    # the d x d algebra on the host (d is small; on a GPU this is one copy instead of several solver
    # launches and synchronisations), the same arithmetic on every rank
    G = to_numpy(G)
    try:
        L = np.linalg.cholesky(G)
    except np.linalg.LinAlgError:
        return None, "the Gram matrix is not positive definite"
    if not bool(np.isfinite(L).all()) or (d and float(np.min(np.abs(np.diagonal(L)))) == 0.0):
        return None, "the Gram matrix is not positive definite"
    R = L.T
    if check_cond and d:
        s = np.linalg.svd(R, compute_uv=False)
        cond = float(s[0] / s[-1]) if s[-1] > 0 else np.inf
        if not cond <= CHOLQR2_MAX_COND:
            return None, f"cond(A) is about {cond:.3g}, above the limit {CHOLQR2_MAX_COND:.0e} of CholeskyQR2"
    Q = A @ xp.asarray(_triangular_inverse(R, np).astype(A.dtype))
    return Q, xp.asarray(R)


def cholesky_qr2(A_local, comm, *, on_failure="tsqr"):
    """QR factorisation of a row-distributed matrix by CholeskyQR2.

    Two rounds of: Gram matrix ``G = A^T A`` summed over ranks (float64),
    ``R = cholesky(G)^T``, ``Q = A R^-1``.  The second round re-orthonormalises
    the first round's ``Q``; the final R is ``R2 @ R1``.

    Parameters
    ----------
    A_local : ndarray of shape (n_local, d)
        This rank's rows (NumPy or CuPy).  The global ``n`` must be at least ``d``.
    comm : Communicator
        Every rank must call this.
    on_failure : {"tsqr", "raise"}, default="tsqr"
        What to do when the Gram matrix is not positive definite or ``A`` is
        too ill-conditioned for CholeskyQR2 (first R factor's condition number
        above ``1e7``): fall back to :func:`tsqr` (``want_q=True``), or raise
        :class:`NotPositiveDefiniteError` on every rank.

    Returns
    -------
    Q_local : ndarray of shape (n_local, d)
        This rank's rows of ``Q``, dtype of ``A``.
    R : ndarray of shape (d, d)
        Upper triangular, positive diagonal, replicated; float64 (float32
        input: float32).

    Notes
    -----
    Communicated: two allreduces of a float64 ``d x d`` matrix
    (``8 d^2`` bytes each); nothing else (the fallback adds those of
    :func:`tsqr`).  Every rank repeats the ``d x d`` Cholesky, triangular
    inverse and (round 1) singular values of R on identical data.

    The Gram matrix squares the condition number: the first round's ``Q`` is
    orthonormal only to ``cond(A)^2 * u``; the second round brings it to
    working precision provided ``cond(A) <~ u^-1/2`` (Fukaya et al., 2014).
    For float32 data the Gram is still float64, but ``Q`` is formed in float32.
    """
    if on_failure not in ("tsqr", "raise"):
        raise ValueError(f"on_failure must be 'tsqr' or 'raise'; got {on_failure!r}")
    xp = get_namespace(A_local)
    if A_local.ndim != 2:
        raise ValueError(f"cholesky_qr2 needs a 2-D block; got shape {tuple(A_local.shape)}")
    Q1, R1 = _cholesky_round(A_local, comm, xp, check_cond=True)
    if Q1 is None:
        if on_failure == "raise":
            raise NotPositiveDefiniteError(f"CholeskyQR2 cannot factor A: {R1}; use tsqr instead")
        return tsqr(A_local, comm, want_q=True)
    Q, R2 = _cholesky_round(Q1, comm, xp, check_cond=False)
    if Q is None:  # cannot happen after a successful first round unless Q1 overflowed
        if on_failure == "raise":
            raise NotPositiveDefiniteError(f"CholeskyQR2 cannot factor A: {R2} (second round)")
        return tsqr(A_local, comm, want_q=True)
    R = R2 @ R1
    return Q, R.astype(A_local.dtype, copy=False)


def orthonormalize(A_local, comm, *, method="tsqr"):
    """An orthonormal basis of the columns of a row-distributed ``A`` (this rank's rows).

    Parameters
    ----------
    A_local : ndarray of shape (n_local, d)
    comm : Communicator
    method : {"tsqr", "cholesky_qr2"}, default="tsqr"
        :func:`tsqr` with ``want_q=True``, or :func:`cholesky_qr2` falling
        back to TSQR when the Gram is unusable.

    Returns
    -------
    ndarray of shape (n_local, min(n, d))
    """
    if method == "tsqr":
        return tsqr(A_local, comm, want_q=True)[0]
    if method == "cholesky_qr2":
        return cholesky_qr2(A_local, comm, on_failure="tsqr")[0]
    raise ValueError(f"method must be 'tsqr' or 'cholesky_qr2'; got {method!r}")


# ---------------------------------------------------------------------- sparse shards
def is_sparse(A):
    """True for SciPy sparse matrices/arrays and ``cupyx.scipy.sparse`` matrices."""
    if type(A).__module__.startswith("cupyx.scipy.sparse"):
        return True
    import scipy.sparse as sp

    return sp.issparse(A)


def _sparse_module(A):
    if type(A).__module__.startswith("cupyx"):
        import cupyx.scipy.sparse as sparse
    else:
        import scipy.sparse as sparse
    return sparse


def to_csr(A, dtype=None):
    """``A`` as a CSR matrix of its own library (host or device), optionally cast.

    Other formats (CSC, COO, ...) are converted; a CSR matrix of the right
    dtype is returned as is (no copy).
    """
    if A.format != "csr":
        A = A.tocsr()
    if dtype is not None and A.dtype != dtype:
        A = A.astype(dtype)
    return A


def _row_ids(A, xp):
    """The row index of every stored entry of a CSR matrix (length nnz)."""
    if xp is np:
        return np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    return A.tocoo().row


def scale_rows(A, s):
    """``diag(s) @ A`` for a CSR ``A`` (a new matrix; ``A`` is not modified)."""
    xp = get_namespace(s)
    sparse = _sparse_module(A)
    data = A.data * s.astype(A.dtype, copy=False)[_row_ids(A, xp)]
    return sparse.csr_matrix((data, A.indices, A.indptr), shape=A.shape)


def sparse_gram(A, weights=None):
    """``Aᵀ diag(weights) A`` of a local CSR block as a dense float64 matrix.

    One sparse-times-sparse product (cuSPARSE SpGEMM on a GPU): ``A`` is never
    densified, only the ``d x d`` result is.  ``A`` is cast to float64 first
    when it is not (a copy of the stored values).
    """
    xp = get_namespace(A)
    A = to_csr(A, np.float64)
    B = A if weights is None else scale_rows(A, xp.asarray(weights, dtype=xp.float64))
    G = (A.T @ B)
    G = G.toarray() if is_sparse(G) else xp.asarray(G)
    return G


def column_sums(A, weights=None):
    """Weighted column sums ``weightsᵀ A`` of a local block, float64, 1-D (dense or sparse ``A``)."""
    xp = get_namespace(A)
    d = A.shape[1]
    if A.shape[0] == 0:
        return xp.zeros(d, dtype=xp.float64)
    if is_sparse(A):
        A = to_csr(A)
        if weights is None and xp is not np:
            from ..kernels import sparse as kernels

            if kernels.supported(A):  # float64 atomics from the rows (no float64 copy of the values, no bincount)
                return kernels.csr_rmatmul_scatter(A, xp.ones(A.shape[0], dtype=A.dtype))
        vals = A.data.astype(xp.float64)
        if weights is not None:
            vals = vals * xp.asarray(weights, dtype=xp.float64)[_row_ids(A, xp)]
        return xp.bincount(A.indices, weights=vals, minlength=d).astype(xp.float64, copy=False)
    if weights is None:
        return A.sum(axis=0, dtype=xp.float64)
    return xp.asarray(weights, dtype=xp.float64) @ A.astype(xp.float64, copy=False)


def column_sq_dev(A, mean, chunk_rows=None):
    """Per column ``Σ_rows (a - mean)²`` of a local block (dense or sparse), float64, 1-D.

    For a sparse block the implicit zeros contribute ``(n_rows - stored) mean²``
    and the stored values ``Σ (a - mean)²`` (the two-pass variance of
    scikit-learn's ``mean_variance_axis``, without densifying; duplicate
    entries are summed first, on a copy, only when the indices are not
    canonical: see :func:`summed_duplicates`).  A dense block is upcast a row
    chunk at a time.  Summed over ranks with the global ``mean``, this is the
    global sum of squared deviations.
    """
    xp = get_namespace(A)
    n, d = A.shape
    mean = xp.asarray(mean, dtype=xp.float64)
    if is_sparse(A):
        A = summed_duplicates(to_csr(A))
        dev = A.data.astype(xp.float64) - mean[A.indices]
        sq = xp.bincount(A.indices, weights=dev * dev, minlength=d).astype(xp.float64, copy=False)
        stored = xp.bincount(A.indices, minlength=d).astype(xp.float64)
        return sq + (n - stored) * mean * mean
    out = xp.zeros(d, dtype=xp.float64)
    step = chunk_rows or max(1, (64 << 20) // (8 * max(d, 1)))
    for s in range(0, n, step):
        block = A[s:s + step].astype(xp.float64) - mean
        out += (block * block).sum(axis=0)
    return out


def summed_duplicates(A):
    """A CSR matrix (SciPy or ``cupyx``) whose stored entries are ``A``'s with each (row, column) once.

    ``A`` itself when its indices are canonical (sorted, no duplicates), else a copy with its duplicates
    summed (a sort of the copy).  Nothing is set on ``A``: SciPy's ``has_canonical_format`` caches its
    answer on the matrix it checks, so a twin over the same arrays is checked instead (one read of the
    indices); ``cupyx`` knows the format only of matrices it made canonical itself (a matrix built from
    arrays says False), so its indices are checked on the device: strictly increasing within each row (one
    elementwise pass and a wait, where the copy and its sort took ~212 ms at 1e8 values).
    """
    if A.nnz < 2:
        return A
    if type(A).__module__.startswith("scipy"):
        if getattr(A, "_has_canonical_format", None):      # (an answer SciPy has cached already)
            return A
        twin = type(A)((A.data, A.indices, A.indptr), shape=A.shape, copy=False)
        if twin.has_canonical_format:
            return A
        twin = twin.copy()
    else:
        if A.has_canonical_format or _device_canonical(A):
            return A
        twin = A.copy()
    twin.sum_duplicates()
    return twin


def _device_canonical(A):
    """Whether every row of a ``cupyx`` CSR ``A`` (``nnz >= 2``) has strictly increasing column indices."""
    import cupy

    nnz = int(A.nnz)
    starts = cupy.zeros(nnz + 1, dtype=cupy.bool_)
    starts[A.indptr] = True                              # (the first entry of every non-empty row)
    ind = A.indices[:nnz]
    return bool(((ind[1:] > ind[:-1]) | starts[1:nnz]).all())


def densify_rows(A, start, stop, dtype=None):
    """Rows ``start:stop`` of a dense or sparse block as a dense array (only that block is densified)."""
    block = A[start:stop]
    if is_sparse(block):
        block = block.toarray()
    return block if dtype is None else block.astype(dtype, copy=False)
