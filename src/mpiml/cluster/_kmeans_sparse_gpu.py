"""k-means on ``cupyx.scipy.sparse`` CSR rows (GPU ranks): distances and sums through cuSPARSE.

The local compute of :mod:`mpiml.cluster._kmeans_ops` for sparse rows on a GPU, with the
same conventions (centres already shifted; sparse rows are never centred, so the shift is
zero and ignored here; the packed ``[sums | weights | inertia | changed]`` vector):

* distances: ``|x|² - 2 x·c + |c|²`` where ``X_chunk @ C.T`` is one SpMM (CSR times the
  dense ``d x k`` centres, which ``C.T`` already lays out column-major for cuSPARSE, so
  nothing is copied), the row norms from the stored values;
* per-cluster sums: ``X_chunk.T @ W`` with ``W`` the ``n_chunk x k`` one-hot weights, one
  SpMM with the CSR operand transposed (no CSC copy of the rows), in float64.

Rows are processed in chunks so that the ``n_chunk x k`` blocks stay near
:data:`BLOCK_BYTES`; the ``d x k`` float64 sums (``8 k d`` bytes: 512 MiB at ``d = 10^6``,
``k = 64``) are the only buffer of the size of the centres.  Nothing here is specific to
CuPy: on SciPy CSR with NumPy the same functions run on the host (the tests use that).
"""

import numpy as np

__all__ = ["lloyd_step", "assign", "euclidean_distances", "sq_distances", "PACK_EXTRA"]

PACK_EXTRA = 2
#: Bytes of the per-chunk temporaries (distances, one-hot weights, float64 copy of the values).
BLOCK_BYTES = 256 << 20


def _xp(X):
    if type(X).__module__.startswith("cupyx"):
        import cupy

        return cupy
    return np


def _chunk_rows(X, k, batch_size=None):
    if batch_size:
        return max(1, int(batch_size))
    n = max(1, X.shape[0])
    per_row = 3 * k * 8 + (int(X.nnz) // n + 1) * (X.dtype.itemsize + 8 + 8)
    return int(max(1024, BLOCK_BYTES // per_row))


def _row_sq_norms(Xc, xp):
    return xp.asarray(Xc.multiply(Xc).sum(axis=1)).ravel().astype(Xc.dtype, copy=False)


def _sq_block(Xc, CT, c_sq, xp):
    """(n_chunk, k) squared distances, clipped at 0 (dtype of ``Xc``)."""
    D = xp.asarray(Xc @ CT)  # SpMM
    D = D.astype(Xc.dtype, copy=False)
    D *= -2
    D += c_sq[None, :]
    D += _row_sq_norms(Xc, xp)[:, None]
    return xp.maximum(D, 0, out=D)


def _prepared(C, xp):
    C = xp.ascontiguousarray(C)
    return C.T, (C * C).sum(axis=1)  # C.T is column-major: cuSPARSE takes it as it is


def sq_distances(Xc, C, c_sq=None):
    """Squared distances of the sparse rows ``Xc`` to the centres ``C`` (one block)."""
    xp = _xp(Xc)
    CT, sq = _prepared(C, xp)
    return _sq_block(Xc, CT, sq if c_sq is None else c_sq, xp)


def assign(X, shift, C, *, batch_size=None):
    """Labels (int32) and squared distance to the nearest centre of every sparse row."""
    xp = _xp(X)
    n, k = X.shape[0], C.shape[0]
    labels = xp.empty(n, dtype=xp.int32)
    mind = xp.empty(n, dtype=X.dtype)
    CT, c_sq = _prepared(C, xp)
    step = _chunk_rows(X, k, batch_size)
    for s in range(0, n, step):
        e = min(n, s + step)
        D = _sq_block(X[s:e], CT, c_sq, xp)
        lab = xp.argmin(D, axis=1)
        labels[s:e] = lab
        mind[s:e] = xp.take_along_axis(D, lab[:, None], axis=1)[:, 0]
    return labels, mind


def euclidean_distances(X, shift, C, *, batch_size=None):
    """(n, k) Euclidean distances of the sparse rows to the centres."""
    xp = _xp(X)
    n, k = X.shape[0], C.shape[0]
    out = xp.empty((n, k), dtype=X.dtype)
    CT, c_sq = _prepared(C, xp)
    step = _chunk_rows(X, k, batch_size)
    for s in range(0, n, step):
        out[s:s + step] = xp.sqrt(_sq_block(X[s:s + step], CT, c_sq, xp))
    return out


def lloyd_step(X, sample_weight, shift, C, labels, mind, *, batch_size=None):
    """One local E-step and the local M-step sums for sparse rows (see
    :func:`mpiml.cluster._kmeans_ops.lloyd_step`); returns the packed float64 vector."""
    xp = _xp(X)
    n, d = X.shape
    k = C.shape[0]
    CT, c_sq = _prepared(C, xp)
    sums_t = xp.zeros((d, k), dtype=xp.float64)  # the sums, transposed: what X.T @ W gives
    w64 = xp.ones(n) if sample_weight is None else sample_weight.astype(xp.float64, copy=False)
    inertia = xp.zeros((), dtype=xp.float64)
    changed = xp.zeros((), dtype=xp.int64)
    step = _chunk_rows(X, k, batch_size)
    for s in range(0, n, step):
        e = min(n, s + step)
        Xc = X[s:e]
        D = _sq_block(Xc, CT, c_sq, xp)
        lab = xp.argmin(D, axis=1).astype(xp.int32)
        md = xp.take_along_axis(D, lab[:, None].astype(xp.int64), axis=1)[:, 0]
        changed += xp.count_nonzero(lab != labels[s:e])
        labels[s:e] = lab
        if mind is not None:
            mind[s:e] = md
        wc = w64[s:e]
        inertia += (wc * md.astype(xp.float64)).sum()
        W = xp.zeros((e - s, k), dtype=xp.float64)
        W[xp.arange(e - s), lab] = wc
        sums_t += xp.asarray(Xc.astype(xp.float64).T @ W)  # SpMM with the CSR operand transposed
    packed = xp.zeros(k * d + k + PACK_EXTRA, dtype=xp.float64)
    packed[:k * d] = sums_t.T.ravel()
    packed[k * d:k * d + k] = xp.bincount(labels, weights=w64, minlength=k)[:k]
    packed[-2] = inertia
    packed[-1] = changed
    return packed
