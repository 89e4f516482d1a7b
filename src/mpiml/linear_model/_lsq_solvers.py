"""Least-squares solvers over the rows of every rank (SPMD), dense or sparse shards.

The problem is ``min ||sqrt(W) (Y - X C - 1 bᵀ)||² + Σ_j alpha_j ||c_j||²``.
With an intercept the data are centred on the global weighted means, which
removes ``b`` (``b = ȳ - Cᵀ x̄`` afterwards).  Three families of solvers reach
the minimiser; they touch ``X`` differently:

* **Gram** (``"normal"`` / ``"cholesky"``): ``XᵀWX`` and ``XᵀWY`` of the
  centred data, accumulated in float64 and summed with one allreduce; the
  small system is solved on every rank alike.  A dense shard is centred a row
  block at a time; a sparse shard is never densified: ``XᵀWX`` is a sparse
  product and the centring is applied to the ``d x d`` result
  (``XᵀWX - Σw x̄ x̄ᵀ``).
* **TSQR** (``"tsqr"`` / ``"svd"``): the triangular factor ``R`` of the
  centred, weighted ``[X | Y]``.  Dense row blocks are needed: a sparse shard
  is densified one row block at a time (bounded memory, ``d`` must be small).
* **Krylov** (``"lsqr"``, ``"sparse_cg"``): iterations that use ``X`` only
  through ``X v`` (local) and ``Xᵀ u`` (one allreduce of ``d + 1`` values per
  iteration); the centring is implicit (``X v - 1 x̄ᵀ v``).  They suit sparse
  shards with many features, where ``d x d`` matrices do not fit.

``positive=True`` is a non-negative least-squares problem on a square factor
(the TSQR ``R``, or a square root of the Gram matrix) solved by
:func:`scipy.optimize.nnls` on every rank alike: ``||X̃ c - ỹ||² = ||R c - z||² + const``.

Every reduction is :func:`~mpiml.linear_model._base.allreduce_identical`
(bit-identical on every rank), so the iterative solvers take the same
decisions everywhere.
"""

import functools
import zlib

import numpy as np
import scipy.linalg
import scipy.optimize

from .._errors import CommError
from ..utils._linalg import column_sums, densify_rows, is_sparse, sparse_gram, to_csr, tsqr
from ._base import allreduce_identical, as_like, chunk_rows

__all__ = ["solve_least_squares", "SPARSE_GRAM_MAX_FEATURES"]

#: With sparse X, ``solver="auto"`` forms the ``d x d`` Gram matrix (one
#: allreduce of ``8 d²`` bytes) up to this many features and runs a Krylov
#: solver above it.
SPARSE_GRAM_MAX_FEATURES = 2048

#: Stored values of a sparse row block converted to float64 at a time.
_SPARSE_CHUNK_NNZ = 1 << 24


# ---------------------------------------------------------------------- shared pieces
def as_2d_targets(y):
    return y.reshape(-1, 1) if y.ndim == 1 else y


def weighted_means(X, Y, sw, *, comm, xp):
    """Global weighted means of the columns of X and Y and the weight sum (one allreduce).

    ``sw=None`` means unit weights.  Returns host float64 ``(x_mean, y_mean, sw_sum)``.
    """
    d, t = X.shape[1], Y.shape[1]
    pack = np.zeros(d + t + 1)
    if X.shape[0]:
        if sw is None:
            if X.dtype == xp.float64 and not is_sparse(X):
                # a GEMV in X's dtype for float64 (much faster than a strided sum)
                pack[:d] = as_like(xp.ones(X.shape[0], dtype=X.dtype) @ X, np)
            else:
                pack[:d] = as_like(column_sums(X), np)
            pack[d:d + t] = as_like(Y.sum(axis=0, dtype=xp.float64), np)
            pack[-1] = X.shape[0]
        else:
            w = sw.astype(xp.float64)
            pack[:d] = as_like(column_sums(X, w), np)
            pack[d:d + t] = as_like(w @ Y.astype(xp.float64, copy=False), np)
            pack[-1] = float(w.sum())
    pack = allreduce_identical(comm, pack)
    return pack[:d] / pack[-1], pack[d:d + t] / pack[-1], float(pack[-1])


def _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
    """Yield dense float64 chunks ``sqrt(w) * (X - x_mean)`` and ``sqrt(w) * (Y - y_mean)``.

    Each chunk costs one pass over its rows (the subtraction or the cast makes
    the float64 copy; the scaling is in place); float64 input without centring
    or weights is used as is.  A sparse ``X`` is densified one chunk at a time.
    """
    step = chunk_rows(X.shape[1] + Y.shape[1], xp=xp)
    xm = None if x_mean is None else xp.asarray(x_mean)
    ym = None if y_mean is None else xp.asarray(y_mean)
    for s in range(0, X.shape[0], step):
        parts = []
        for A, m in ((densify_rows(X, s, s + step), xm), (Y[s:s + step], ym)):
            A = A if m is None else A - m  # m is float64, so the difference is a float64 copy
            parts.append(A.astype(xp.float64, copy=False))
        if sw is not None:
            root = xp.sqrt(sw[s:s + step].astype(xp.float64))[:, None]
            parts = [A * root for A in parts]
        yield parts[0], parts[1]


def _sparse_row_blocks(X):
    """Row ranges of a CSR shard holding about ``_SPARSE_CHUNK_NNZ`` stored values each."""
    n = X.shape[0]
    per_row = max(1.0, X.nnz / max(n, 1))
    step = max(1024, int(_SPARSE_CHUNK_NNZ / per_row))
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def gram(X, Y, sw, x_mean, y_mean, sw_sum, *, comm, xp):
    """Global ``(XᵀWX, XᵀWY)`` of the centred data in float64 on the host (one allreduce).

    Dense ``X``: centred row blocks.  Sparse ``X``: sparse products of float64
    row blocks, centred afterwards (``XᵀWX - Σw x̄ x̄ᵀ`` and ``XᵀWY - Σw x̄ ȳᵀ``),
    which loses about ``(|x̄| / std)²`` of relative accuracy per column
    (negligible for the usual sparse data, whose means are small).
    """
    d, t = X.shape[1], Y.shape[1]
    G = xp.zeros((d, d), dtype=xp.float64)
    B = xp.zeros((d, t), dtype=xp.float64)
    if is_sparse(X):
        for s, e in _sparse_row_blocks(X):
            block = to_csr(X[s:e], np.float64)
            w = None if sw is None else sw[s:e].astype(xp.float64)
            G += sparse_gram(block, w)
            WY = Y[s:e].astype(xp.float64) if w is None else Y[s:e].astype(xp.float64) * w[:, None]
            B += block.T @ WY
    else:
        for Xc, Yc in _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
            G += Xc.T @ Xc
            B += Xc.T @ Yc
    pack = np.concatenate([as_like(G, np).ravel(), as_like(B, np).ravel()])
    pack = allreduce_identical(comm, pack)
    G, B = pack[:d * d].reshape(d, d), pack[d * d:].reshape(d, t)
    if is_sparse(X) and x_mean is not None:
        G = G - sw_sum * np.outer(x_mean, x_mean)
        B = B - sw_sum * np.outer(x_mean, y_mean)
        G = (G + G.T) / 2
    return G, B


def _qr_r(A, xp):
    """The square upper-triangular factor of ``A`` (rows beyond its row count are zero)."""
    k = A.shape[1]
    R = xp.linalg.qr(A, mode="r") if A.shape[0] else xp.zeros((0, k), dtype=A.dtype)
    if R.shape[0] < k:
        R = xp.concatenate([R, xp.zeros((k - R.shape[0], k), dtype=R.dtype)])
    return R


def tsqr_r(X, Y, sw, x_mean, y_mean, *, comm, xp):
    """``R`` of the global centred, weighted ``[X | Y]`` (TSQR), the same on every rank.

    Locally the shard is reduced chunk by chunk (QR of the running ``R``
    stacked on the next chunk, so memory stays bounded); the local factors are
    then combined by :func:`mpiml.utils._linalg.tsqr` (one allgather of a
    ``(d + t)²`` factor per rank, or a binary tree beyond 16 ranks), which
    returns ``R`` with a non-negative diagonal, replicated on every rank.
    """
    k = X.shape[1] + Y.shape[1]
    R = xp.zeros((0, k), dtype=xp.float64)
    for Xc, Yc in _scaled_chunks(X, Y, sw, x_mean, y_mean, xp):
        R = _qr_r(xp.concatenate([R, xp.concatenate([Xc, Yc], axis=1)]), xp)
    _, R = tsqr(_qr_r(R, xp), comm)
    return as_like(R, np)


# ---------------------------------------------------------------------- small direct solves (replicated)
def lstsq_from_gram(G, B, cond):
    """Minimum-norm least squares from the normal equations; singular values of X and rank.

    Eigenvalues below ``(cond * largest singular value)²`` are treated as zero,
    which is scikit-learn's rule (``scipy.linalg.lstsq(..., cond=tol)``)
    expressed on ``XᵀX``.
    """
    lam, V = np.linalg.eigh(G)
    lam, V = lam[::-1], V[:, ::-1]
    sing = np.sqrt(np.clip(lam, 0.0, None))
    keep = sing > cond * sing[0] if sing.size and sing[0] > 0 else np.zeros(sing.shape, bool)
    Vk = V[:, keep]
    coef = Vk @ ((Vk.T @ B) / lam[keep][:, None])
    return coef, int(keep.sum()), sing


#: How far LAPACK's 1-norm condition estimate may fall below the true condition number before a
#: matrix's rank is taken from it: the estimate is a lower bound, in practice within a factor 3 (rarely
#: 10) of the truth; beyond this margin the eigenvalues decide, as without the estimate.
_ESTIMATE_MARGIN = 1e3


class ScaledCholesky:
    """The Cholesky factor of a symmetric ``A`` scaled to unit diagonal, ``S = D A D`` (``D = diag(A)^-1/2``).

    One ``O(d³/3)`` factorisation serves the condition estimate of ``S`` (LAPACK ``dpocon``, ``O(d²)``),
    an upper bound of the 2-norm condition number of ``A`` and the solve ``A x = b = D S⁻¹ D b``
    (equilibrated: the scaling costs nothing in accuracy, Cholesky being scale-invariant).  ``kappa`` is inf and
    ``factor`` None when ``A`` is not finite or not numerically positive definite.
    """

    def __init__(self, A):
        self.factor, self.kappa, self.bound = None, np.inf, np.inf
        d = A.shape[0]
        diag = A.diagonal()   # (array methods: NumPy's function forms add microseconds each on the fit's path)
        if d == 0 or not np.isfinite(A).all() or (diag <= 0).any():
            return
        self.root = 1.0 / np.sqrt(diag)
        S = A * self.root[:, None]
        S *= self.root[None, :]
        factor, info = scipy.linalg.lapack.dpotrf(S, lower=0, clean=1)
        if info != 0:
            return
        rcond, info = scipy.linalg.lapack.dpocon(factor, float(np.abs(S).sum(axis=0).max()))
        self.factor = factor
        if info == 0 and rcond > 0:
            self.kappa = float(1.0 / rcond)
            # κ₂(A) <= κ₂(S) max(diag) / min(diag), and κ₂(S) <= κ₁(S) for a symmetric S
            self.bound = self.kappa * _ESTIMATE_MARGIN * float(diag.max() / diag.min())

    def solve(self, B):
        """``A⁻¹ B`` (``B`` of shape (d, t)); non-finite when the factorisation failed."""
        if self.factor is None:
            return np.full(B.shape, np.nan)
        x, _ = scipy.linalg.lapack.dpotrs(self.factor, B * self.root[:, None], lower=0)
        return x * self.root[:, None]


def singular_values_from_gram(G):
    """The singular values of ``X`` from its Gram matrix ``G = XᵀX``, largest first (``eigvalsh``)."""
    return np.sqrt(np.clip(np.linalg.eigvalsh(G)[::-1], 0.0, None))


def lstsq_from_gram_cholesky(G, B, cond, factor=None):
    """:func:`lstsq_from_gram` by Cholesky when ``G`` has full rank under the ``cond`` rule.

    ``factor``: the :class:`ScaledCholesky` of ``G`` when the caller has it.  When its condition bound
    shows every singular value far above ``cond`` times the largest, the solve is that factor's and the
    singular values are left to compute when asked: returned as a picklable function of no arguments (the
    ``O(d³)`` eigenvalues cost several times the factorisation).  Otherwise they come from
    ``eigvalsh`` and decide: a rank-deficient ``G`` (or a failed factorisation) goes to
    :func:`lstsq_from_gram`, whose minimum-norm rule then applies.
    """
    d = G.shape[0]
    factor = ScaledCholesky(G) if factor is None else factor
    if d and factor.bound * max(cond * cond, 100 * np.finfo(np.float64).eps) < 1.0:
        coef = factor.solve(B)
        if np.isfinite(coef).all():
            return coef, d, functools.partial(singular_values_from_gram, G)
    sing = singular_values_from_gram(G)
    if sing.size and sing[0] > 0 and bool(np.all(sing > cond * sing[0])):
        try:
            coef = scipy.linalg.cho_solve(scipy.linalg.cho_factor(G, lower=False, check_finite=False), B,
                                          check_finite=False)
            if np.all(np.isfinite(coef)):
                return coef, int(sing.size), sing
        except np.linalg.LinAlgError:
            pass
    return lstsq_from_gram(G, B, cond)


def lstsq_from_r(R, Z, cond):
    """Minimum-norm least squares from the triangular factor; singular values and rank."""
    coef, _, rank, sing = scipy.linalg.lstsq(R, Z, cond=cond, check_finite=False)
    if sing is None:  # LAPACK drivers without singular values
        sing = scipy.linalg.svdvals(R)
    return coef, int(rank), sing


def ridge_from_gram(G, B, alphas, factor=None, factor_alpha=None):
    """Solve ``(G + alpha I) w = b`` per target (Cholesky; eigen-fallback when singular).

    The matrix counts as singular when Cholesky fails or its pivots say the
    smallest eigenvalue is at the rounding level of a float64 Gram matrix
    (``100 d ε`` of the largest); the eigen-fallback then drops those
    eigenvalues, which gives the minimum-norm solution for ``alpha = 0``.
    ``factor``: the :class:`ScaledCholesky` of ``G + factor_alpha I`` when the
    caller has it; targets of that penalty use it when its condition bound
    is far from singular (the pivots then cannot say singular either: a
    pivot's square lies between the smallest and the largest eigenvalue).
    """
    d, t = B.shape
    singular = 100 * max(d, 1) * np.finfo(np.float64).eps
    if factor is not None and factor_alpha is not None and d and factor.bound * singular < 1.0 \
            and all(float(a) == float(factor_alpha) for a in alphas):
        # every target has the factor's penalty (one target, most often): one solve of all of B, no gathers
        solved = factor.solve(B)
        if np.isfinite(solved).all():
            return solved
    coef = np.empty((d, t))
    groups = {}
    for j, a in enumerate(alphas):
        groups.setdefault(float(a), []).append(j)
    for a, cols in groups.items():
        if factor is not None and factor_alpha is not None and a == float(factor_alpha) and d \
                and factor.bound * singular < 1.0:
            solved = factor.solve(B[:, cols])
            if np.isfinite(solved).all():
                coef[:, cols] = solved
                continue
        A = G + a * np.eye(d)
        try:
            cho = scipy.linalg.cho_factor(A, lower=False, check_finite=False)
            pivots = np.abs(np.diag(cho[0]))
            if d and (pivots.min() / pivots.max()) ** 2 <= singular:
                raise np.linalg.LinAlgError("numerically singular")
            coef[:, cols] = scipy.linalg.cho_solve(cho, B[:, cols], check_finite=False)
        except np.linalg.LinAlgError:
            lam, V = np.linalg.eigh(A)
            keep = lam > max(lam.max(), 0.0) * singular
            Vk = V[:, keep]
            coef[:, cols] = Vk @ ((Vk.T @ B[:, cols]) / lam[keep][:, None])
    return coef


def ridge_from_r(R, Z, alphas):
    """Ridge from the triangular factor through its SVD: ``w = V diag(s / (s² + alpha)) Uᵀ z``."""
    U, s, Vt = scipy.linalg.svd(R, full_matrices=False, check_finite=False)
    UtZ = U.T @ Z
    coef = np.empty((R.shape[1], Z.shape[1]))
    # singular values at rounding level are zero: alpha = 0 on rank-deficient X gives the minimum-norm solution
    keep = s > (s[0] if s.size else 0.0) * R.shape[1] * np.finfo(np.float64).eps
    for j, a in enumerate(alphas):
        den = s * s + a
        f = np.divide(s, den, out=np.zeros_like(s), where=keep & (den > 0))
        coef[:, j] = Vt.T @ (f * UtZ[:, j])
    return coef


def factor_from_gram(G, B):
    """A square factor ``(R, Z)`` with ``RᵀR = G`` and ``RᵀZ = B`` (eigenvalues at rounding level dropped)."""
    lam, V = np.linalg.eigh(G)
    keep = lam > max(lam.max(initial=0.0), 0.0) * G.shape[0] * np.finfo(np.float64).eps
    root = np.sqrt(lam[keep])
    R = root[:, None] * V[:, keep].T
    Z = (V[:, keep].T @ B) / root[:, None]
    return R, Z


def nnls_from_factor(R, Z, alphas=None):
    """Non-negative (ridge) least squares ``min ||R c - z||² + alpha ||c||², c >= 0`` per target."""
    d, t = R.shape[1], Z.shape[1]
    coef = np.empty((d, t))
    for j in range(t):
        A, b = R, Z[:, j]
        if A.shape[0] == 0 and not (alphas is not None and alphas[j] > 0):
            coef[:, j] = 0.0  # X is constant: every coefficient is free; the minimum-norm choice
            continue
        if alphas is not None and alphas[j] > 0:
            A = np.vstack([R, np.sqrt(alphas[j]) * np.eye(d)])
            b = np.concatenate([b, np.zeros(d)])
        coef[:, j] = scipy.optimize.nnls(A, b, maxiter=max(3 * d, 50))[0]
    return coef


# ---------------------------------------------------------------------- Krylov solvers on the implicit operator
def _checked_allreduce(comm, local, replicated):
    """Allreduce ``local`` with a 12-bit fingerprint of the ``replicated`` vector each rank used.

    The Krylov loops branch on reduced values; the fingerprint turns ranks
    whose iterates drifted apart (different numerical libraries) into the same
    :class:`mpiml.CommError` everywhere instead of a hang (as in
    :mod:`._logistic_loss`).
    """
    if comm.size == 1:
        return local
    fp = float(zlib.crc32(np.ascontiguousarray(replicated, dtype=np.float64).tobytes()) & 0xFFF)
    packed = allreduce_identical(comm, np.concatenate([local, [fp, fp * fp]]))
    if comm.size * packed[-1] != packed[-2] * packed[-2]:
        raise CommError("least squares: the ranks iterated on different vectors (their solvers diverged, which "
                        "needs identical numerical libraries on every rank)")
    return packed[:-2]


class CentredOperator:
    """``A = sqrt(W) (X - 1 x̄ᵀ)`` of this rank's rows, used only through products.

    ``matvec(v)``: ``A v`` for a replicated vector ``v`` (host, or on X's
    device; local rows, no communication).  ``rmatvec(u)``: this rank's part of
    ``Aᵀ u`` on X's namespace, ``rmatvec_local(u)`` the same on the host; the
    global product is the sum over ranks.  ``X`` may be dense or sparse; it is
    never centred or copied.
    """

    def __init__(self, X, sw, x_mean, xp):
        self.X, self.xp = X, xp
        self.d = X.shape[1]
        self.mean = None if x_mean is None else np.asarray(x_mean, dtype=np.float64)
        self._mean_dev = None
        self.root = None if sw is None else xp.sqrt(sw.astype(xp.float64))
        # a cupyx CSR shard: mpiml.kernels.sparse (MPIML_SPARSE_PRODUCTS, see mpiml.kernels.sparse.PRODUCTS):
        # "kernels", X v and Xᵀ u from shared memory (the vector's slice of each column piece staged there,
        # the matrix streamed once: no transpose) when X's rows are sorted, else row dot products on X and
        # on Xᵀ stored as CSR (formed at the first Aᵀu, once per fit); "scatter", AᵀA p in one read of X
        # per iteration (:meth:`normal`, atomics, no transpose)
        self._kernels = self._XT = self._pieces = None
        self.fused = False
        if xp is not np and is_sparse(X):
            from ..kernels import sparse as sparse_kernels

            mode = sparse_kernels.products_mode()
            if mode != "cusparse":
                self._kernels = sparse_kernels.for_shard(X)
                self.fused = self._kernels is not None and mode == "scatter"
                if self._kernels is not None and mode == "kernels":
                    self._pieces = self._kernels.column_pieces(X)

    def matvec(self, v):
        """``A v`` for a replicated vector ``v`` (host or on X's device): this rank's rows, float64."""
        xp, X = self.xp, self.X
        v = xp.asarray(v, dtype=xp.float64)
        if self._pieces is not None:
            u = self._pieces.dot(v)
        elif self._kernels is not None:
            u = self._kernels.csr_matmul(X, v, out_dtype=np.float64)
        else:
            u = (X @ v.astype(X.dtype, copy=False)).astype(xp.float64, copy=False)
        if self.mean is not None:
            u = u - self._mean_on(xp) @ v  # a 0-d array: no wait for the device
        return u if self.root is None else u * self.root

    def rmatvec(self, u):
        """This rank's part of ``Aᵀ u`` as a float64 vector on X's namespace (no transfer)."""
        xp, X = self.xp, self.X
        if X.shape[0] == 0:
            return xp.zeros(self.d, dtype=xp.float64)
        su = u if self.root is None else u * self.root
        if self._pieces is not None:
            out = self._pieces.tdot(su.ravel())
        elif self._kernels is not None and self.fused:
            out = self._kernels.csr_rmatmul_scatter(X, su.ravel(), out_dtype=np.float64)
        elif self._kernels is not None and X.nnz:
            if self._XT is None:
                self._XT = X.T.tocsr()
            out = self._kernels.csr_matmul(self._XT, su.ravel(), out_dtype=np.float64)
        else:
            out = (X.T @ su.astype(X.dtype, copy=False)).astype(xp.float64, copy=False).ravel()
        if self.mean is not None:
            out = out - self._mean_on(xp) * su.sum()
        return out

    def normal(self, p):
        """This rank's part of ``Aᵀ A p`` for a replicated ``p`` on X's device, float64, in one read of X.

        Only when :attr:`fused` (a ``cupyx`` shard under ``MPIML_SPARSE_PRODUCTS=scatter``).
        """
        xp = self.xp
        if self.X.shape[0] == 0:
            return xp.zeros(self.d, dtype=xp.float64)
        m = None if self.mean is None else self._mean_on(xp)
        c = 0.0 if m is None else m @ p          # a 0-d array: no wait for the device
        if self.root is not None and getattr(self, "_w", None) is None:
            self._w = self.root * self.root
        y, ysum = self._kernels.csr_normal_vec(self.X, p, c, None if self.root is None else self._w)
        return y if m is None else y - m * ysum

    def rmatvec_local(self, u):
        """:meth:`rmatvec` as host float64."""
        return as_like(self.rmatvec(u), np)

    def _mean_on(self, xp):
        if xp is np:
            return self.mean
        if self._mean_dev is None:
            self._mean_dev = xp.asarray(self.mean)
        return self._mean_dev


def _sym_ortho(a, b):
    """A stable Givens rotation ``(c, s, r)`` with ``[c s; -s c] [a; b] = [r; 0]``."""
    if b == 0:
        return np.sign(a) if a != 0 else 1.0, 0.0, abs(a)
    if a == 0:
        return 0.0, np.sign(b), abs(b)
    if abs(b) > abs(a):
        tau = a / b
        s = np.sign(b) / np.sqrt(1 + tau * tau)
        return s * tau, s, b / s
    tau = b / a
    c = np.sign(a) / np.sqrt(1 + tau * tau)
    return c, c * tau, a / c


def lsqr(op, b, *, damp=0.0, atol=1e-6, btol=1e-6, conlim=1e8, iter_lim=None, comm):
    """LSQR (Paige and Saunders, 1982) on the row-distributed operator ``op``; returns ``(x, n_iter)``.

    ``b`` holds this rank's rows of the right-hand side; the iterate ``x``
    (host float64, length ``d``) is replicated.  The stopping rules are those
    of :func:`scipy.sparse.linalg.lsqr` with the same ``atol``, ``btol``,
    ``conlim`` and ``iter_lim`` (default ``2 d``), so the result matches its
    result on the gathered rows to the tolerance.

    Communicated per iteration: **one** allreduce of ``d + 1`` float64, the
    packed ``[Aᵀ u | ||u||²]`` (the norm of the distributed vector rides with
    the product).  Every scalar is computed from reduced, bit-identical values,
    so every rank stops at the same iteration.
    """
    d = op.d
    iter_lim = 2 * d if iter_lim is None else int(iter_lim)
    eps = np.finfo(np.float64).eps
    ctol = 1.0 / conlim if conlim > 0 else 0.0
    dampsq = damp * damp
    xp = op.xp
    u = b.astype(xp.float64, copy=True)

    def product(u_raw, v_used):
        pack = np.concatenate([op.rmatvec_local(u_raw), [float((u_raw * u_raw).sum()) if u_raw.size else 0.0]])
        pack = _checked_allreduce(comm, pack, v_used)
        return pack[:d], float(np.sqrt(pack[d]))

    x = np.zeros(d)
    Atu, beta = product(u, x)
    bnorm = beta
    if beta > 0:
        u = u / beta
        v = Atu / beta
        alfa = float(np.linalg.norm(v))
    else:
        v, alfa = x.copy(), 0.0
    if alfa > 0:
        v = v / alfa
    w = v.copy()
    rhobar, phibar = alfa, beta
    if alfa * beta == 0:
        return x, 0
    anorm = ddnorm = res2 = xxnorm = z = sn2 = 0.0
    cs2 = -1.0
    itn = 0
    while itn < iter_lim:
        itn += 1
        u = op.matvec(v) - alfa * u
        Atu, beta = product(u, v)
        if beta > 0:
            u = u / beta
            anorm = np.sqrt(anorm * anorm + alfa * alfa + beta * beta + dampsq)
            v = Atu / beta - beta * v
            alfa = float(np.linalg.norm(v))
            if alfa > 0:
                v = v / alfa
        if damp > 0:
            rhobar1 = np.sqrt(rhobar * rhobar + dampsq)
            cs1, sn1 = rhobar / rhobar1, damp / rhobar1
            psi = sn1 * phibar
            phibar = cs1 * phibar
        else:
            rhobar1, psi = rhobar, 0.0
        cs, sn, rho = _sym_ortho(rhobar1, beta)
        theta = sn * alfa
        rhobar = -cs * alfa
        phi = cs * phibar
        phibar = sn * phibar
        tau = sn * phi
        t1, t2 = phi / rho, -theta / rho
        dk = w / rho
        x = x + t1 * w
        w = v + t2 * w
        ddnorm += float(dk @ dk)
        delta = sn2 * rho
        gambar = -cs2 * rho
        rhs = phi - delta * z
        zbar = rhs / gambar
        xnorm = np.sqrt(xxnorm + zbar * zbar)
        gamma = np.sqrt(gambar * gambar + theta * theta)
        cs2, sn2 = gambar / gamma, theta / gamma
        z = rhs / gamma
        xxnorm += z * z
        acond = anorm * np.sqrt(ddnorm)
        res2 += psi * psi
        rnorm = np.sqrt(phibar * phibar + res2)
        arnorm = alfa * abs(tau)
        test1 = rnorm / bnorm
        test2 = arnorm / (anorm * rnorm + eps)
        test3 = 1.0 / (acond + eps)
        rtol = btol + atol * anorm * xnorm / bnorm
        if (1 + test3 <= 1 or 1 + test2 <= 1 or 1 + test1 / (1 + anorm * xnorm / bnorm) <= 1
                or test3 <= ctol or test2 <= atol or test1 <= rtol):
            break
    return x, itn


def _summed(comm, local, replicated, xp):
    """The sum over ranks of ``local`` (on X's namespace ``xp``), back on it; see :func:`_checked_allreduce`."""
    if comm.size == 1:
        return local
    host = _checked_allreduce(comm, as_like(local, np), as_like(replicated, np))
    return host if xp is np else xp.asarray(host)


def conjugate_gradient(op, b, *, alpha, tol, max_iter=None, comm):
    """CG on ``(AᵀA + alpha I) x = Aᵀb`` (scikit-learn's ``"sparse_cg"``); returns ``(x, n_iter, converged)``.

    Stops when ``||r|| <= tol ||Aᵀb||`` (SciPy's ``cg`` with ``rtol=tol``) or
    after ``max_iter`` iterations (default ``10 d``).  The iterate and the
    residual live on X's device (a GPU iteration moves no vector to the host
    on one rank; two scalars per iteration are read); one allreduce of ``d``
    float64 per iteration (``AᵀA p``) across ranks; the right-hand side costs
    one more.  ``x`` is returned as host float64.
    """
    d = op.d
    xp = op.xp
    max_iter = 10 * d if max_iter is None else int(max_iter)
    rhs = op.rmatvec(b.astype(xp.float64, copy=False))
    rhs = xp.asarray(allreduce_identical(comm, as_like(rhs, np))) if comm.size > 1 else rhs
    x = xp.zeros(d, dtype=xp.float64)
    bnorm = float(xp.sqrt(rhs @ rhs))
    if bnorm == 0:
        return as_like(x, np), 0, True
    r = rhs.copy()
    p = r.copy()
    rs = r @ r                            # scalars stay on X's device; the host reads two a step, at once
    rs_host = float(rs)
    it = 0
    while it < max_iter:
        if np.sqrt(rs_host) <= tol * bnorm:
            return as_like(x, np), it, True
        it += 1
        local = op.normal(p) if getattr(op, "fused", False) else op.rmatvec(op.matvec(p))
        Ap = _summed(comm, local, p, xp) + alpha * p
        pAp = p @ Ap
        with np.errstate(divide="ignore", invalid="ignore"):   # pAp <= 0 (host NumPy): dropped below
            step = rs / pAp
            x_next = x + step * p
            r_next = r - step * Ap
            rs_next = r_next @ r_next
        pAp_host, rs_next_host = (float(v) for v in as_like(xp.stack((pAp, rs_next)), np))
        if pAp_host <= 0:                 # breakdown: the step is dropped, as if never taken
            break
        x, r = x_next, r_next
        p = r + (rs_next / rs) * p
        rs, rs_host = rs_next, rs_next_host
    return as_like(x, np), it, bool(np.sqrt(rs_host) <= tol * bnorm)


# ---------------------------------------------------------------------- the driver
def solve_least_squares(X, y, sw, *, fit_intercept, method, comm, xp, solve_gram=None, solve_r=None,
                        solve_krylov=None):
    """Centre (when ``fit_intercept``), then solve by ``method`` in {"gram", "tsqr", "krylov"}.

    ``solve_gram(G, B)``, ``solve_r(R_xx, Z)`` or ``solve_krylov(op, Yc)``
    return ``(coef of shape (d, t), extra)``; ``Yc`` is this rank's centred,
    weighted targets (float64).  Returns host ``coef`` (t, d), ``intercept``
    (t,), ``extra``.
    """
    Y = as_2d_targets(y)
    d, t = X.shape[1], Y.shape[1]
    if fit_intercept:
        x_mean, y_mean, sw_sum = weighted_means(X, Y, sw, comm=comm, xp=xp)
    else:
        x_mean, y_mean, sw_sum = None, None, None
    if method == "tsqr":
        R = tsqr_r(X, Y, sw, x_mean, y_mean, comm=comm, xp=xp)
        coef, extra = solve_r(R[:d, :d], R[:d, d:])
    elif method == "gram":
        G, B = gram(X, Y, sw, x_mean, y_mean, sw_sum, comm=comm, xp=xp)
        coef, extra = solve_gram(G, B)
    else:
        op = CentredOperator(X, sw, x_mean, xp)
        Yc = Y.astype(xp.float64)
        if y_mean is not None:
            Yc = Yc - xp.asarray(y_mean)
        if op.root is not None:
            Yc = Yc * op.root[:, None]
        coef, extra = solve_krylov(op, Yc)
    coef = coef.T
    intercept = y_mean - coef @ x_mean if fit_intercept else np.zeros(t)
    return coef, intercept, extra
