"""Local k-means compute on this rank's rows: nearest centre, distances, per-cluster sums.

Everything here is local (no communication) and works in *shifted* coordinates:
the caller passes ``shift`` (the global mean of ``X``) and centres already
shifted by it, which keeps the ``||x||^2 - 2 x.c + ||c||^2`` expansion accurate
(scikit-learn centres the data for the same reason; here nothing is copied:
the shift is applied per chunk, or inside the GPU kernel while a tile is staged).

Dense host arrays go through the compiled one-pass step of :mod:`mpiml.cluster._kmeans_cpu`
(sparse ones through chunked matrix products); device arrays through the
fused kernel of :mod:`mpiml.cluster._gpu` (no ``n x k`` matrix is ever built).
"""

import os

import numpy as np

__all__ = [
    "dense_rows",
    "is_sparse",
    "shifted",
    "lloyd_step",
    "assign",
    "sq_distances",
    "euclidean_distances",
    "chunk_rows",
    "PACK_EXTRA",
]

#: After the k*d sums and k counts, the packed vector holds [inertia, n_changed].
PACK_EXTRA = 2

# Rows per host chunk: the (chunk x k) distance block and the shifted chunk stay
# around a few MiB (scikit-learn uses 256-row chunks per thread for the same reason).
_HOST_CHUNK_BYTES = 8 << 20
# Rows per device chunk: a GPU needs big launches (host-sized chunks of 4*10^7 rows made ~5,000 launches per
# pass: 1.1 s of the global statistics of a 4*10^7 x 64 fit on one H200), and a chunk of at most 2^31
# elements keeps CuPy on its 32-bit-index kernels (those of a 64-bit index compile on first use: 4 s)
_DEVICE_CHUNK_BYTES = 1 << 30


def chunk_rows(n_features, n_clusters, itemsize, batch_size=None, *, sparse=False, device=False):
    """Rows per chunk so that one chunk's working set stays bounded.

    A sparse chunk is never densified: only its ``chunk x n_clusters`` block counts.  ``device``: the
    chunk of a GPU array (1 GiB working set, fewer than 2^31 elements) instead of a host one (8 MiB).
    """
    if batch_size:
        return max(1, int(batch_size))
    if sparse:
        n_features = 0
    per_row = (n_features + n_clusters) * itemsize + n_features * 8
    if device:
        return int(max(256, min(_DEVICE_CHUNK_BYTES // max(per_row, 1), (1 << 31) // max(n_features + n_clusters, 1))))
    return int(max(256, min(65536, _HOST_CHUNK_BYTES // max(per_row, 1))))


def _cpu_kernels(X):
    """:mod:`mpiml.cluster._kmeans_cpu` (the compiled one-pass step) for dense host rows, else None.

    ``MPIML_CPU_KERNELS=0`` keeps the NumPy path (for comparisons), as does a missing Numba.
    """
    if is_sparse(X) or _is_device(X) or os.environ.get("MPIML_CPU_KERNELS", "1") == "0":
        return None
    if not _CPU:
        try:
            from . import _kmeans_cpu
        except ImportError:
            _kmeans_cpu = None
        _CPU.append(_kmeans_cpu)
    return _CPU[0]


_CPU = []  # the compiled module once imported (None without Numba): a function-level import cost microseconds a step


def _is_device(x):
    return type(x).__module__.startswith("cupy")


def is_sparse(X):
    """True for a SciPy sparse matrix or array (CSR after validation), or a cupyx.scipy.sparse one."""
    return type(X).__module__.startswith(("scipy.sparse", "cupyx.scipy.sparse"))


def _sparse_gpu(X):
    """:mod:`mpiml.cluster._kmeans_sparse_gpu` for cupyx.scipy.sparse rows, else None."""
    if type(X).__module__.startswith("cupyx.scipy.sparse"):
        from . import _kmeans_sparse_gpu

        return _kmeans_sparse_gpu
    return None


def shifted(X, shift):
    """``X - shift`` for dense rows; sparse rows are returned as they are.

    Sparse input is never centred (that would densify it): :class:`KMeans` uses a
    zero shift for it, so the two agree.
    """
    if is_sparse(X) or shift is None:
        return X
    return X - shift


def dense_rows(X, rows, shift):
    """The selected rows (a slice or an index array) as a dense array, minus ``shift``."""
    part = X[rows]
    if is_sparse(part):
        part = part.toarray()
        return part if shift is None else part - shift[None, :]
    return part - shift[None, :] if shift is not None else part


def _row_sq_norms(Xc):
    if is_sparse(Xc):
        return np.asarray(Xc.multiply(Xc).sum(axis=1), dtype=np.float64).ravel().astype(Xc.dtype, copy=False)
    return (Xc * Xc).sum(axis=1)


def sq_distances(Xc, C, c_sq=None):
    """Squared distances of the rows of ``Xc`` to the rows of ``C`` (both already shifted).

    Works on NumPy or CuPy; builds the full ``len(Xc) x len(C)`` block, so callers
    pass chunks.
    """
    if _sparse_gpu(Xc):
        return _sparse_gpu(Xc).sq_distances(Xc, C, c_sq)
    xp = np if not _is_device(Xc) else __import__("cupy")
    if c_sq is None:
        c_sq = (C * C).sum(axis=1)
    D = xp.asarray(Xc @ _contiguous_t(Xc, C))  # sparse @ dense gives a dense array
    D *= -2
    D += c_sq[None, :]
    D += _row_sq_norms(Xc)[:, None]
    xp.maximum(D, 0, out=D)
    return D


def euclidean_distances(X, shift, C, *, batch_size=None):
    """(n, k) Euclidean distances of the rows of ``X`` (shifted by ``shift``) to the shifted centres ``C``.

    Device arrays go through the fused pairwise kernel; host arrays through chunked BLAS products.
    """
    if _sparse_gpu(X):
        return _sparse_gpu(X).euclidean_distances(X, shift, C, batch_size=batch_size)
    if _is_device(X):
        from . import _gpu

        return _gpu.euclidean_distances(X, shift, C)
    out = np.empty((X.shape[0], C.shape[0]), dtype=X.dtype)
    step = chunk_rows(X.shape[1], C.shape[0], X.dtype.itemsize, batch_size, sparse=is_sparse(X))
    c_sq = (C * C).sum(axis=1)
    for s in range(0, X.shape[0], step):
        out[s:s + step] = np.sqrt(sq_distances(shifted(X[s:s + step], shift), C, c_sq))
    return out


def _contiguous_t(X, C):
    """``C.T`` laid out for ``X @ C.T``: SciPy's sparse-dense product copies a transposed
    operand on every call (64 MiB at d = 10^6, k = 8), so sparse callers make it once."""
    return np.ascontiguousarray(C.T) if is_sparse(X) else C.T


def _host_assign_chunk(Xc, shift, C, c_sq, CT=None):
    """(labels, min squared distance, shifted chunk) of one host chunk (dense or CSR)."""
    Xs = shifted(Xc, shift)
    G = np.asarray(Xs @ (C.T if CT is None else CT))
    G *= -2
    G += c_sq[None, :]
    labels = np.argmin(G, axis=1).astype(np.int32, copy=False)
    best = np.take_along_axis(G, labels[:, None].astype(np.intp), axis=1)[:, 0]
    x_sq = _row_sq_norms(Xs) if is_sparse(Xs) else np.einsum("ij,ij->i", Xs, Xs)
    mind = best + x_sq
    np.maximum(mind, 0, out=mind)
    return labels, mind, Xs


def assign(X, shift, C, *, batch_size=None, sample_weight=None):
    """Nearest centre of every local row.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        This rank's rows (NumPy or CuPy, float32 or float64).
    shift : ndarray of shape (d,) or None
        Subtracted from every row (``C`` is already in shifted coordinates).
    C : ndarray of shape (k, d)
        Shifted centres, same namespace and dtype as ``X``.
    batch_size : int, default=None
        Rows per chunk on the host.
    sample_weight : ndarray of shape (n,), default=None
        When given, the weighted local inertia is returned too.

    Returns
    -------
    labels : ndarray of shape (n,), int32
    mind : ndarray of shape (n,)
        Squared distance to the nearest centre (dtype of ``X``).
    inertia : float or None
        ``sum(sample_weight * mind)`` (float64) when ``sample_weight`` is given.
    """
    if _is_device(X):
        from . import _gpu

        _gpu = _sparse_gpu(X) or _gpu
        labels, mind = _gpu.assign(X, shift, C)
        inertia = None
        if sample_weight is not None:
            inertia = float((sample_weight.astype(np.float64) * mind).sum())
        return labels, mind, inertia
    cpu = _cpu_kernels(X)
    if cpu is not None:  # the inertia from the kernel's own sums (a BLAS dot woke BLAS's threads at every fit's end)
        return cpu.assign(X, shift, C, sample_weight)
    n, d = X.shape
    k = C.shape[0]
    labels = np.empty(n, dtype=np.int32)
    mind = np.empty(n, dtype=X.dtype)
    c_sq = np.einsum("ij,ij->i", C, C)
    CT = _contiguous_t(X, C)
    step = chunk_rows(d, k, X.dtype.itemsize, batch_size, sparse=is_sparse(X))
    for s in range(0, n, step):
        e = min(n, s + step)
        labels[s:e], mind[s:e], _ = _host_assign_chunk(X[s:e], shift, C, c_sq, CT)
    inertia = None
    if sample_weight is not None:
        inertia = float(np.dot(sample_weight.astype(np.float64, copy=False), mind.astype(np.float64, copy=False)))
    return labels, mind, inertia


def lloyd_step(X, sample_weight, shift, C, labels, mind, *, batch_size=None):
    """One local E-step plus the local part of the M-step.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        This rank's rows.
    sample_weight : ndarray of shape (n,) or None
        Row weights (dtype of ``X``); None: unit weights (dense GPU rows then
        read no weights).
    shift : ndarray of shape (d,)
        Subtracted from every row.
    C : ndarray of shape (k, d)
        Shifted centres.
    labels : ndarray of shape (n,), int32
        Previous labels on entry (``-1`` before the first step); this step's
        labels on return (updated in place).
    mind : ndarray of shape (n,) or None
        Overwritten with each row's squared distance to its (old) nearest centre
        (None: not kept).
    batch_size : int, default=None
        Rows per host chunk.

    Returns
    -------
    packed : ndarray of shape (k*d + k + 2,), float64
        ``[sums (k*d, shifted) | weight per cluster (k) | inertia | changed labels]``,
        ready for one allreduce (NumPy or CuPy, like ``X``).
    """
    if _sparse_gpu(X):
        return _sparse_gpu(X).lloyd_step(X, sample_weight, shift, C, labels, mind, batch_size=batch_size)
    if _is_device(X):
        from . import _gpu

        return _gpu.lloyd_step(X, sample_weight, shift, C, labels, mind)
    import scipy.sparse as sp

    n, d = X.shape
    k = C.shape[0]
    packed = np.zeros(k * d + k + PACK_EXTRA, dtype=np.float64)
    cpu = _cpu_kernels(X)
    if cpu is not None:
        return cpu.lloyd_step(X, sample_weight, shift, C, labels, mind, packed)
    sums = packed[:k * d].reshape(k, d)
    c_sq = np.einsum("ij,ij->i", C, C)
    CT = _contiguous_t(X, C)
    step = chunk_rows(d, k, X.dtype.itemsize, batch_size, sparse=is_sparse(X))
    changed = 0
    inertia = 0.0
    w64 = np.ones(n) if sample_weight is None else sample_weight.astype(np.float64, copy=False)
    for s in range(0, n, step):
        e = min(n, s + step)
        lab, md, Xs = _host_assign_chunk(X[s:e], shift, C, c_sq, CT)
        changed += int(np.count_nonzero(lab != labels[s:e]))
        labels[s:e] = lab
        if mind is not None:
            mind[s:e] = md
        wc = w64[s:e]
        inertia += float(np.dot(wc, md.astype(np.float64, copy=False)))
        onehot = sp.csr_matrix((wc, (lab, np.arange(e - s))), shape=(k, e - s))
        part = onehot @ Xs.astype(np.float64, copy=False)
        sums += part.toarray() if sp.issparse(part) else part
    packed[k * d:k * d + k] = np.bincount(labels, weights=w64, minlength=k)
    packed[-2] = inertia
    packed[-1] = changed
    return packed
