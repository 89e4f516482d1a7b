"""The ``"arpack"`` solver: thick-restart block Lanczos on the distributed ``XᵀX`` (see :func:`block_lanczos_svd`).

It touches the data only through the products of :mod:`._solvers` (``X V`` and ``Xᵀ U`` summed over ranks), so
dense, sparse and implicitly centred shards take the same path; every rank runs the same arithmetic on the
replicated basis, so every rank takes the same branches and the same number of restarts.
"""

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from ._solvers import _matvec, _rmatvec, gaussian_matrix

__all__ = ["block_lanczos_svd"]


#: Block size of :func:`block_lanczos_svd` (at most ``k``).  One vector a product, as ARPACK: the fewest products to
#: a given residual (on a flat spectrum, 40,000 x 3,000 at density 0.005: 175 products for k = 2 against 406 with
#: blocks of two, 620 against 694 for k = 50), also the fastest on one H100 (0.361 s against 0.425 s with blocks of
#: 16, key arpack_block_0540 of benchmarks/results/tsvd_sparse_1xh100.json); a repeated singular value is still
#: found (the rounding seeds its other directions, fully re-orthogonalised, long before the residuals reach the
#: tolerance).
_LANCZOS_BLOCK = 1


def _lanczos_sizes(k, d, block, ncv):
    """``(b, ncv, keep)``: block size, basis size and the Ritz vectors a restart keeps (``k <= keep <= ncv - b``)."""
    b = max(1, min(k, _LANCZOS_BLOCK if block is None else int(block), d - k))
    ncv = min(d, max(20, 3 * k + 4 * b)) if ncv is None else min(d, max(int(ncv), k + b))
    keep = min(k + (ncv - k) // 2, ncv - b)
    return b, ncv, keep


def _orth_against(W, K, xp):
    """``W`` with the span of ``K`` removed (twice: classical Gram-Schmidt, re-orthogonalised), orthonormal;
    also the coefficients ``(Kᵀ W, R)`` with ``W = K (Kᵀ W) + Q R``."""
    h = None
    if K is not None:
        scale = xp.sqrt((W * W).sum(axis=0).max())
        for _ in range(2):
            c = K.T @ W
            W = W - K @ c
            h = c if h is None else h + c
    if W.shape[1] == 1:   # one vector (the default block): its norm, no QR call
        r = xp.sqrt((W * W).sum())
        Q, R = W / xp.where(r > 0, r, 1.0), r.reshape(1, 1)
    else:
        Q, R = xp.linalg.qr(W, mode="reduced")
    # a block that was (nearly) in span(K) came back as rounding noise (or zero): its Q is not orthogonal to K (or not
    # unit), clean it again (one read of the device's verdict)
    if K is not None and not float(xp.abs(xp.diagonal(R)).min() / xp.maximum(scale, 1e-300)) > 1e-8:
        Q = xp.linalg.qr(Q, mode="reduced")[0]   # unit columns, even from a zero block
        Q = xp.linalg.qr(Q - K @ (K.T @ Q), mode="reduced")[0]
    return Q, h, R


def block_lanczos_svd(X, n_components, *, comm, xp, tol=0.0, random_state=None, ncv=None, block=None,
                      max_restarts=300):
    """Top singular triplets of the row-distributed ``X`` by thick-restarted block Lanczos on ``X^T X``.

    The ARPACK-like solver: the Krylov basis lives in the ``d``-dimensional
    space of the features and is replicated; the only use of the data is
    ``V -> X^T (X V)``, one allreduce of ``d x b`` float64 per block product.

    Parameters
    ----------
    X : ndarray of shape (n_local, d)
    n_components : int
        ``k``; requires ``k < d``.
    comm : Communicator
    xp : module
    tol : float, default=0.0
        Stop when every wanted Ritz pair has ``||C v - theta v|| <= tol * theta_max``
        (``C = X^T X``; the Lanczos estimate of the residual, as ARPACK's);
        0 means a floor of ``1000 * eps`` of the data's dtype.
    random_state : int, RandomState instance or None
        Start block (Gaussian, the same on every rank).
    ncv : int, default=None
        Basis size; default ``min(d, max(20, 3k + 4b))``.
    block : int, default=None
        Block size ``b``; default 1 (:data:`_LANCZOS_BLOCK`).
    max_restarts : int, default=300

    Returns
    -------
    U_local : ndarray of shape (n_local, k)
        ``X V / s`` on this rank's rows (zero columns for zero singular values).
    s : ndarray of shape (k,), replicated
    Vt : ndarray of shape (k, d), replicated, unflipped.
    n_restarts : int

    Notes
    -----
    A thick restart (Wu and Simon's) keeps ``keep = k + (ncv - k) / 2`` Ritz
    vectors, not only the ``k`` wanted ones, and goes on from the Krylov
    continuation of the last block (orthogonal to the whole basis, it holds
    every Ritz vector's residual).  Keeping only ``k`` (a subspace iteration
    whose polynomial has degree ``(ncv - k) / b``) and going on from the Ritz
    vectors' own residuals (rounding noise once they are nearly converged)
    stalled on flat spectra: 300 restarts without converging on a random
    sparse 40,000 x 3,000 matrix, where ARPACK takes 0.5-1 s.  The projected
    matrix is gathered from the Gram-Schmidt coefficients (no product of the
    basis with its image), the basis is fully re-orthogonalised.

    Communicated per block product: one allreduce of ``d x b`` float64, with
    block size ``b`` (default 1); a restart makes ``(ncv - keep) / b`` block
    products.  Working on ``X^T X`` squares the condition number, like ARPACK
    on the normal operator: the top singular values are accurate to about
    ``eps * s_1^2 / s_k``.
    """
    n_local, d = X.shape
    k = n_components
    b, ncv, keep = _lanczos_sizes(k, d, block, ncv)
    floor = 1e3 * float(np.finfo(X.dtype).eps)
    tol_eff = max(float(tol), floor)

    def apply(V):
        return _rmatvec(X, _matvec(X, V), comm, xp)

    K = xp.empty((d, ncv), dtype=xp.float64)                       # the basis, replicated
    T = xp.zeros((ncv, ncv), dtype=xp.float64)                     # Kᵀ C K, from the Gram-Schmidt coefficients
    K[:, :b] = _orth_against(gaussian_matrix(random_state, (d, b), comm, xp, xp.float64), None, xp)[0]
    j = 0                                                          # first column of the block to expand
    n_restarts = 0
    converged = False
    for n_restarts in range(1, max_restarts + 1):
        while True:
            m = j + b
            Q, h, R = _orth_against(apply(K[:, j:m]), K[:, :m], xp)
            T[:m, j:m] = h
            T[j:m, :j] = h[:j].T
            if m + b > ncv or m >= d:
                break
            K[:, m:m + b] = Q
            T[m:m + b, j:m] = R
            T[j:m, m:m + b] = R.T
            j = m
        theta, S = xp.linalg.eigh((T[:m, :m] + T[:m, :m].T) / 2)
        order = xp.argsort(-theta)
        theta, S = theta[order], S[:, order]
        # the Ritz vectors' residuals: C K S - K S diag(theta) = Q R S[j:m] (the continuation of the last block)
        resid = xp.sqrt(((R @ S[j:m, :k]) ** 2).sum(axis=0))
        top = max(float(theta[0]), 0.0)
        if m >= d or bool((resid <= tol_eff * max(top, 1e-300)).all()):
            converged = True
            break
        # thick restart: keep Ritz vectors (orthonormal, C-diagonal), then the continuation, orthogonal to them all
        K[:, :keep] = K[:, :m] @ S[:, :keep]
        K[:, keep:keep + b] = Q
        T[:] = 0
        T[:keep, :keep] = xp.diag(theta[:keep])
        j = keep
    if not converged:
        warnings.warn(f"block Lanczos did not converge in {max_restarts} restarts (largest relative residual "
                      f"{float(resid.max()) / max(top, 1e-300):.3g} > tol {tol_eff:.3g})",
                      ConvergenceWarning, stacklevel=3)
    theta_k = xp.clip(theta[:k], 0, None)
    s = xp.sqrt(theta_k)
    Vt = (K[:, :m] @ S[:, :k]).T                                   # (k, d)
    XV = _matvec(X, Vt.T)
    inv = xp.where(s > 0, 1.0 / xp.where(s > 0, s, 1.0), 0.0).astype(X.dtype)
    U = XV * inv[None, :]
    return U, s.astype(X.dtype), Vt.astype(X.dtype), n_restarts
