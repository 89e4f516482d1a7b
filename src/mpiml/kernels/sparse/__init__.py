"""The sparse kernel family: products of a ``cupyx`` CSR matrix with skinny dense blocks (``spmm.cu``).

cuSPARSE's SpMM runs far below the memory bandwidth for the shapes of the
truncated SVD and the Krylov solvers (a CSR matrix of ``10^8`` stored values
times a dense block of 1 to a few tens of columns): it reads the dense block
column by column, a 4-byte value per 32-byte sector.  These kernels read a
dense row-major block a row at a time instead (one coalesced read of ``b``
values per stored value, from L2 when the block fits there), so a product
costs about one read of the CSR arrays plus those gathers.

* :func:`csr_matmul` -- ``A @ V`` (``V`` of shape ``(n_cols, b)`` or ``(n_cols,)``), deterministic;
* :func:`csr_rmatmul_scatter` -- ``Aᵀ @ U`` without a transpose of ``A``, with atomics (not deterministic);
* :func:`csr_normal_vec` -- ``(A - 1mᵀ)ᵀ W (A - 1mᵀ) p`` in one read of ``A`` (sparse Ridge's CG), atomics;
* :func:`csr_row_moments` -- per row the sum and the shifted sum of squares of the stored values
  (run on a stored ``Xᵀ``: the column moments of ``X``), deterministic;
* :func:`dense_column_moments` -- the same per column of a dense CuPy matrix, one read, deterministic;
* :func:`column_pieces` -- one-vector products ``A x`` and ``Aᵀ u`` from shared memory (sparse Ridge);
* :func:`csr_transpose` -- ``Aᵀ`` as CSR (counts, a scan, an atomic fill and a sort of each row in shared
  memory), the same arrays as cuSPARSE's conversion (``A.T.tocsr()``) for canonical ``A``;
* :func:`csr_transpose_buckets` -- the same arrays by a two-level stable counting sort (no atomic in global
  memory, coalesced writes, no sort phase), for any order within ``A``'s rows;
* :func:`normal` -- a standard normal matrix from a seed (the randomized SVD's, when no ``random_state``).

Products accumulate in float64 whatever the values' dtype (float32 or float64)
and are written in the dtype asked for.  The kernels load through
:mod:`mpiml.kernels._loader` (shipped, cached or compiled once) on first use,
memoised per device.  CuPy is imported inside the functions only.
"""

import os
import sys

import numpy as np

__all__ = ["PRODUCTS", "products_mode", "GATHERS", "gather_mode", "gather_chunks", "GatherChunks", "for_shard",
           "supported", "csr_matmul", "csr_rmatmul_scatter", "csr_normal_vec", "csr_row_moments",
           "dense_column_moments", "column_pieces", "ColumnPieces", "plan", "FILES", "expressions", "TRANSPOSES",
           "transpose_mode", "csr_transpose", "csr_transpose_buckets", "buckets_supported", "bucket_shift",
           "BUCKET_MAX", "TRANSPOSE_MAX_RUN", "small_cholinv", "small_svd", "SMALL_MAX", "normal"]

from ._launch import (FILES, _PLANS, _THREADS, _TYPES, _blocks, _env_choice, _function,  # noqa: F401
                      _sm_count, expressions, supported)
from ._transpose import (BUCKET_MAX, TRANSPOSE_MAX_RUN, TRANSPOSES, bucket_shift, buckets_supported,
                         csr_transpose, csr_transpose_buckets, transpose_mode)

#: Columns of the dense block one launch takes (32 lanes x 4 columns each); wider blocks go by slices.
MAX_COLUMNS = 128
#: Widest block the float4 gather (``mpiml_csr_gather4``, float32 only) takes; :data:`GATHERS` picks it.
VEC4_MAX_COLUMNS = 32
#: How ``A @ V`` gathers the rows of a float32 ``V`` of 2 to 32 columns (environment ``MPIML_SPARSE_GATHER``):
#: ``"vec4"`` (default) pads ``V`` to 8, 16 or 32 columns and reads a row as float4s, 32 rows in flight a
#: warp; ``"scalar"`` keeps ``mpiml_csr_gather`` (a value a lane, 4 rows in flight a warp; float64 data
#: and wider blocks always take it).
GATHERS = ("vec4", "scalar")


def gather_mode():
    """The gather of float32 ``A @ V`` products, from ``MPIML_SPARSE_GATHER`` (see :data:`GATHERS`)."""
    return _env_choice("MPIML_SPARSE_GATHER", GATHERS)


def _vec4_lanes(b):
    """Lanes a stored value of the float4 gather: 2, 4 or 8 (columns padded to 8, 16 or 32)."""
    return 2 if b <= 8 else 4 if b <= 16 else 8


def plan(b):
    """(lanes per row G, columns per lane CPL) of the gather/scatter kernels for a block of ``b <= 128`` columns."""
    for g, c in _PLANS:
        if b <= g * c:
            return g, c
    raise ValueError(f"a launch takes at most {MAX_COLUMNS} columns; got {b}")


def _rowdot_lanes(A):
    per_row = A.nnz / max(1, A.shape[0])
    g = 4
    while g < 32 and g < per_row / 2:
        g *= 2
    return g


def csr_matmul(A, V, out_dtype=None, chunks=None, padded=False):
    """``A @ V`` for a ``cupyx`` CSR ``A`` (see :func:`supported`) and a dense CuPy ``V``.

    ``V`` of shape ``(n_cols, b)`` or ``(n_cols,)`` is cast to ``A``'s dtype
    (a copy only when it differs or is not C-contiguous); the result, of shape
    ``(n_rows, b)`` or ``(n_rows,)``, is C-contiguous in ``out_dtype``
    (default ``A``'s), summed in float64 in a fixed order (deterministic): the
    order of the stored values, or with the float4 gather (float32, 2 to 32
    columns, :data:`GATHERS`) each lane group's values in that order, the
    groups then added by a fixed tree.  ``chunks`` (:func:`gather_chunks` of
    ``A`` for this width; ignored by the other kernels): one launch a chunk of
    ``V``'s rows.  ``padded`` (float32 results of 2 to 32 columns, else
    ignored): the result is the first ``b`` columns of a C-contiguous block
    of 8, 16 or 32 columns (the rest zero), which the float4 gather of a next
    product reads as it is, with no padded copy (``Xᵀ (X V)``).
    """
    import cupy

    n_rows, n_cols = A.shape
    vec = V.ndim == 1
    if V.shape[0] != n_cols:
        raise ValueError(f"dimension mismatch: A has {n_cols} columns, V {V.shape[0]} rows")
    out_dtype = np.dtype(A.dtype if out_dtype is None else out_dtype)
    b = 1 if vec else V.shape[1]
    T, O = _TYPES[np.dtype(A.dtype)], _TYPES[out_dtype]
    if n_rows == 0 or b == 0 or A.nnz == 0 or n_cols == 0:
        return cupy.zeros((n_rows,) if vec else (n_rows, b), dtype=out_dtype)
    if not vec and b > 1 and T == "float" and b <= VEC4_MAX_COLUMNS and gather_mode() == "vec4":
        return _gather4(A, V, out_dtype, chunks, padded and out_dtype == np.float32)
    V = cupy.ascontiguousarray(V.astype(A.dtype, copy=False))
    if vec or b == 1:
        g = _rowdot_lanes(A)
        y = cupy.empty(n_rows, dtype=out_dtype)
        _function(f"mpiml_csr_rowdot<{T}, double, {O}, {g}>")(
            (_blocks(_THREADS // g, n_rows),), (_THREADS,),
            (A.indptr, A.indices, A.data, np.int64(n_rows), V.ravel(), y))
        return y if vec else y[:, None]
    Y = cupy.empty((n_rows, b), dtype=out_dtype)
    for s in range(0, b, MAX_COLUMNS):
        w = min(MAX_COLUMNS, b - s)
        g, c = plan(w)
        _function(f"mpiml_csr_gather<{T}, double, {O}, {g}, {c}>")(
            (_blocks(_THREADS // g, n_rows),), (_THREADS,),
            (A.indptr, A.indices, A.data, np.int64(n_rows), V[:, s:], np.int64(b), np.int32(w), Y[:, s:],
             np.int64(b)))
    return Y


def _padded_view(V, width):
    """Whether ``V`` is the leading columns of a C-contiguous float32 block of ``width`` columns (what
    ``csr_matmul(..., padded=True)`` returns): its rows' float4 loads then stay inside that block."""
    base = V.base
    return (V.dtype == np.float32 and base is not None and base.ndim == 2 and base.shape == (V.shape[0], width)
            and base.dtype == V.dtype and base.flags.c_contiguous and V.data.ptr == base.data.ptr
            and V.strides == base.strides and V.data.ptr % 16 == 0)


def _float4_rows(V, width, dtype):
    """``V`` as rows of ``width`` values of ``dtype`` that float4 loads read (16-byte aligned, ``width / 4`` float4s
    apart): ``V`` itself when it is such a block or the leading columns of one (:func:`_padded_view`), else a copy
    padded with zeros."""
    import cupy

    if V.dtype == dtype and (V.shape[1] == width and V.flags.c_contiguous and V.data.ptr % 16 == 0
                             or _padded_view(V, width)):
        return V
    b = V.shape[1]
    Vp = cupy.empty((V.shape[0], width), dtype=dtype)
    Vp[:, :b] = V
    if width > b:
        Vp[:, b:] = 0
    return Vp


def _gather4(A, V, out_dtype, chunks=None, padded=False):
    """``A @ V`` by ``mpiml_csr_gather4`` (float32 ``A``, ``2 <= b <= 32``): ``V`` cast and padded to 8, 16 or 32
    columns in one copy (rows of 16 * lanes bytes: aligned float4 loads, a 128-byte line a row at ``b > 16``),
    unless it is such a block already (:func:`_padded_view`); with :class:`GatherChunks` of ``A``, one launch a
    chunk of ``V``'s rows, added up in order; ``padded``: the result in such a block."""
    import cupy

    n_rows, n_cols = A.shape
    b = V.shape[1]
    lanes = _vec4_lanes(b)
    width = 4 * lanes
    V = _float4_rows(V, width, A.dtype)
    ldy = b
    if padded and width > b:
        Yp = cupy.empty((n_rows, width), dtype=out_dtype)
        Yp[:, b:] = 0
        Y, ldy = Yp[:, :b], width
    else:
        Y = cupy.empty((n_rows, b), dtype=out_dtype)
    fn = _function(f"mpiml_csr_gather4<{_TYPES[out_dtype]}, {lanes}>")
    grid = (_blocks(_THREADS // 32, n_rows),)
    if chunks is None or chunks.K == 1 or not chunks.of(A):
        fn(grid, (_THREADS,), (A.indptr, A.indptr[1:], A.indices, A.data, np.int64(n_rows), V,
                               np.int64(width // 4), np.int32(b), Y, np.int64(ldy), np.int32(0)))
        return Y
    ptr = chunks.ptr
    for k in range(chunks.K):
        fn(grid, (_THREADS,), (ptr[k * n_rows:], ptr[(k + 1) * n_rows:], A.indices, A.data, np.int64(n_rows), V,
                               np.int64(width // 4), np.int32(b), Y, np.int64(ldy), np.int32(k > 0)))
    return Y


#: Bytes of a dense block's rows one launch of the chunked float4 gather reads (:func:`gather_chunks`); 0 (the
#: default): never chunk.  Environment ``MPIML_SPARSE_GATHER_CHUNK_BYTES`` sets it when a fit starts (16 MB:
#: well inside an H100's 50 MB L2).  Off by default: the first GPU pass (2026-11-27 17:25) saw a device fault
#: right after a chunked product at 10^8 values, not reproduced by the tests, and no measurement of its gain.
GATHER_CHUNK_BYTES = 0
#: Fewest stored values a row of a chunk should average for chunking to pay (a warp takes 32 at once).
_CHUNK_MIN_PER_ROW = 96


class GatherChunks:
    """The column pieces of a CSR ``A`` that cut a dense block's rows into chunks that stay in L2.

    ``A @ V`` with ``V`` too large for L2 (``Xᵀ U`` on a stored ``Xᵀ``: ``U`` has
    a row per sample) misses L2 on most gathers; launched a chunk of ``V``'s
    rows at a time (``ptr``: :func:`mpiml_csr_split`'s row pointers of ``K``
    column pieces of ``A``), each launch's rows of ``V`` stay in L2 and the
    result is added up in a fixed order (deterministic).
    """

    def __init__(self, A, ptr, K):
        self.ptr, self.K = ptr, K
        self._of = _identity(A)

    def of(self, A):
        """Whether these chunks were cut from ``A``'s current arrays (a matrix whose arrays were replaced since,
        e.g. by ``sum_duplicates``, would make the row pointers stale)."""
        return self._of == _identity(A)


def _identity(A):
    return (A.shape, A.nnz, A.indptr.data.ptr, A.indices.data.ptr, A.data.data.ptr)


def gather_chunks(A, b):
    """:class:`GatherChunks` for ``A @ V`` with a float32 ``V`` of ``b`` columns, or None when one launch serves.

    None unless the float4 gather takes the product, ``V`` (``A``'s columns x
    the padded width) exceeds :data:`GATHER_CHUNK_BYTES`, a chunk's row of
    ``A`` still averages enough stored values, and ``A``'s rows have sorted
    indices (checked here: one small read back).
    """
    import cupy

    n_rows, n_cols = A.shape
    chunk = int(os.environ.get("MPIML_SPARSE_GATHER_CHUNK_BYTES", GATHER_CHUNK_BYTES))
    if not (supported(A) and np.dtype(A.dtype) == np.float32 and 2 <= b <= VEC4_MAX_COLUMNS
            and gather_mode() == "vec4" and n_rows and A.nnz and chunk > 0):
        return None
    K = -(-n_cols * 16 * _vec4_lanes(b) // chunk)
    K = min(K, max(1, int(A.nnz / n_rows / _CHUNK_MIN_PER_ROW)))
    if K <= 1:
        return None
    step = -(-n_cols // K)
    cuts = np.minimum(np.arange(K + 1, dtype=np.int64) * step, n_cols).astype(np.int32)
    ptr = cupy.empty((K + 1) * n_rows, dtype=cupy.int32)
    bad = cupy.zeros(1, dtype=cupy.int32)
    _function("mpiml_csr_split")((_blocks(_THREADS // 32, n_rows),), (_THREADS,),
                                 (A.indptr, A.indices, np.int64(n_rows), cupy.asarray(cuts), np.int32(K), ptr, bad))
    if int(bad.get()[0]):
        return None
    return GatherChunks(A, ptr, K)


def csr_rmatmul_scatter(A, U, out_dtype=np.float64):
    """``Aᵀ @ U`` for a ``cupyx`` CSR ``A`` and a dense CuPy ``U`` of shape ``(n_rows, b)``, by atomics.

    Returns a C-contiguous ``(n_cols, b)`` matrix in ``out_dtype`` (float32 or
    float64).  No transpose of ``A`` is formed; the summation order depends
    on scheduling (float results differ from run to run at rounding level).
    """
    import cupy

    n_rows, n_cols = A.shape
    if U.ndim == 1 or U.shape[1] == 1:
        y = cupy.zeros(n_cols, dtype=cupy.float64)
        if n_rows and A.nnz:
            g = _rowdot_lanes(A)
            u = cupy.ascontiguousarray(U.ravel().astype(A.dtype, copy=False))
            _function(f"mpiml_csr_scatter_vec<{_TYPES[np.dtype(A.dtype)]}, {g}>")(
                (_blocks(_THREADS // g, n_rows),), (_THREADS,), (A.indptr, A.indices, A.data, np.int64(n_rows), u, y))
        y = y.astype(out_dtype, copy=False)
        return y if U.ndim == 1 else y[:, None]
    b = U.shape[1]
    out_dtype = np.dtype(out_dtype)
    Y = cupy.zeros((n_cols, b), dtype=out_dtype)
    if n_rows == 0 or b == 0 or A.nnz == 0:
        return Y
    U = cupy.ascontiguousarray(U.astype(A.dtype, copy=False))
    T, O = _TYPES[np.dtype(A.dtype)], _TYPES[out_dtype]
    for s in range(0, b, MAX_COLUMNS):
        w = min(MAX_COLUMNS, b - s)
        g, c = plan(w)
        _function(f"mpiml_csr_scatter<{T}, {O}, {g}, {c}>")(
            (_blocks(_THREADS // g, n_rows),), (_THREADS,),
            (A.indptr, A.indices, A.data, np.int64(n_rows), U[:, s:], np.int64(b), np.int32(w), Y[:, s:],
             np.int64(b)))
    return Y


def csr_rmatmul_scatter4(A, U):
    """``Aᵀ @ U`` for a float32 ``cupyx`` CSR ``A`` and a float32 ``U`` of 2 to 32 columns by float4 atomics
    (``mpiml_csr_scatter4``; sm_90, four float atomics a float4 before), summed in float32 in an order that
    depends on scheduling.  Returns the first ``b`` columns of a C-contiguous (n_cols, 8|16|32) float32 block.
    For comparison (``benchmarks/sparse/spmm_gpu.py``): the fits keep float64 sums."""
    import cupy

    n_rows, n_cols = A.shape
    b = U.shape[1]
    if np.dtype(A.dtype) != np.float32 or not 2 <= b <= VEC4_MAX_COLUMNS:
        raise ValueError("csr_rmatmul_scatter4 takes float32 A and 2 to 32 columns")
    lanes = _vec4_lanes(b)
    width = 4 * lanes
    U = _float4_rows(U, width, A.dtype)
    Y = cupy.zeros((n_cols, width), dtype=cupy.float32)
    if n_rows and A.nnz:
        _function(f"mpiml_csr_scatter4<{lanes}>")((_blocks(_THREADS // 32, n_rows),), (_THREADS,),
                                                 (A.indptr, A.indices, A.data, np.int64(n_rows), U,
                                                  np.int64(lanes), np.int32(-(-b // 4)), Y))
    return Y[:, :b]


def csr_normal_vec(A, p, c=0.0, w=None):
    """``(Σ_i t_i a_i, Σ_i t_i)`` with ``t_i = w_i (a_i·p - c)`` over the rows ``a_i`` of a ``cupyx`` CSR ``A``.

    ``c``: a float or a CuPy scalar (0-d or 1 value; read on the device).

    One read of ``A`` (each row's values twice, the second time from cache):
    with ``c = m·p`` and ``w`` the sample weights, ``y - m ysum`` is
    ``(A - 1mᵀ)ᵀ diag(w) (A - 1mᵀ) p``, the normal operator of sparse Ridge's
    CG.  ``p`` is cast to ``A``'s dtype; sums in float64 by atomics (not
    deterministic).  Returns a float64 vector of length ``n_cols`` and a
    float64 0-d array.
    """
    import cupy

    n_rows, n_cols = A.shape
    y = cupy.zeros(n_cols, dtype=cupy.float64)
    ysum = cupy.zeros(1, dtype=cupy.float64)
    if n_rows == 0:
        return y, ysum[0]
    g = _rowdot_lanes(A)
    pv = cupy.ascontiguousarray(p.astype(A.dtype, copy=False))
    weighted = w is not None
    wv = cupy.ascontiguousarray(w, dtype=cupy.float64) if weighted else y
    cv = cupy.asarray(c, dtype=cupy.float64).reshape(1)   # a device scalar stays there: no synchronisation
    _function(f"mpiml_csr_normal_vec<{_TYPES[np.dtype(A.dtype)]}, {g}, {'true' if weighted else 'false'}>")(
        (_blocks(_THREADS // g, n_rows),), (_THREADS,),
        (A.indptr, A.indices, A.data, np.int64(n_rows), pv, wv, cv, y, ysum))
    return y, ysum[0]


def csr_row_moments(A, shift=None, check=True):
    """Per row of a ``cupyx`` CSR ``A``: ``Σ values`` and ``Σ (value - shift[row])²`` over the stored values.

    Returns ``(s1, s2, canonical)``: two float64 vectors and whether every
    row's indices strictly increase (sorted, no duplicates; when not, ``s2``
    is not the moment of the matrix, whose duplicate entries add up before
    squaring).  ``shift`` (float64, one per row) defaults to zero.  ``check=False``:
    ``canonical`` is None and nothing is read back (no wait on the device); ``check="device"``: the count of
    rows that are not canonical instead, a device int32 (1,) array, unread.
    """
    import cupy

    n_rows = A.shape[0]
    s1 = cupy.zeros(n_rows, dtype=cupy.float64)
    s2 = cupy.zeros(n_rows, dtype=cupy.float64)
    if n_rows == 0 or A.nnz == 0:
        return s1, s2, True
    sh = s1 if shift is None else cupy.ascontiguousarray(shift, dtype=cupy.float64)  # s1: zeros
    bad = cupy.zeros(1, dtype=cupy.int32)
    _function(f"mpiml_csr_row_moments<{_TYPES[np.dtype(A.dtype)]}>")(
        (_blocks(_THREADS // 32, n_rows),), (_THREADS,),
        (A.indptr, A.indices, A.data, np.int64(n_rows), sh, s1, s2, bad))
    if check == "device":
        return s1, s2, bad
    return s1, s2, (int(bad.get()[0]) == 0 if check else None)


def dense_column_moments(X, shift=None):
    """Per column of a dense 2-D CuPy ``X`` (float32/float64, rows of unit stride): ``(Σ x, Σ (x - shift)²)``.

    One read of ``X`` by a kernel (float64 sums, a fixed order: deterministic);
    ``shift`` (length ``d``) defaults to zero.  Returns two float64 vectors.
    """
    import cupy

    n, d = X.shape
    if n == 0 or d == 0:
        return cupy.zeros(d, dtype=cupy.float64), cupy.zeros(d, dtype=cupy.float64)
    if X.strides[1] != X.itemsize or X.strides[0] <= 0 or X.strides[0] % X.itemsize:
        X = cupy.ascontiguousarray(X)
    ld = X.strides[0] // X.itemsize
    sh = cupy.zeros(d, dtype=cupy.float64) if shift is None else cupy.ascontiguousarray(shift, dtype=cupy.float64)
    tc = 32
    while tc < min(d, _THREADS):
        tc *= 2
    # one wave of blocks (8 of 256 threads an SM), each a contiguous range of at least 64 rows
    rows = max(64, -(-n // (8 * _sm_count())))
    nblocks = -(-n // rows)
    partial = cupy.empty((nblocks, 2 * d), dtype=cupy.float64)
    _function(f"mpiml_dense_col_moments<{_TYPES[np.dtype(X.dtype)]}>")(
        (nblocks,), (_THREADS,), (X, np.int64(n), np.int32(d), np.int64(ld), np.int64(rows), np.int32(tc), sh,
                                  partial))
    tot = partial.sum(axis=0)
    return tot[:d], tot[d:]


class ColumnPieces:
    """A ``cupyx`` CSR matrix seen as ``K`` column pieces whose slice of a vector fits in shared memory.

    :meth:`dot` (``A x``) and :meth:`tdot` (``Aᵀ u``) launch one kernel a
    piece: a block first stages the piece's slice of ``x`` in shared memory
    (or accumulates its slice of ``Aᵀ u`` there), so the gathers and the
    scatters of a one-vector product never leave the SM and the matrix streams
    from memory once: about a read of the CSR arrays a product, where the
    L2-gathering kernels (:func:`csr_matmul`) move a 32-byte sector per stored
    value.  Built by :func:`column_pieces` (one pass over the indices when
    ``K > 1``).  :meth:`tdot` sums with atomics (not deterministic).
    """

    def __init__(self, A, ptr, cuts, smem, blocks):
        self.A, self.ptr, self.cuts = A, ptr, [int(c) for c in cuts]
        self.K = len(self.cuts) - 1
        self.smem, self.blocks = smem, blocks
        per_row = A.nnz / max(1, A.shape[0]) / self.K
        g = 4
        while g < 32 and g < per_row / 2:
            g *= 2
        self.lanes = g
        self.T = _TYPES[np.dtype(A.dtype)]

    def _launch(self, name, k, vec, out, *extra):
        A, n = self.A, self.A.shape[0]
        fn = _function(f"{name}<{self.T}, {self.lanes}>")
        lo, hi = self.cuts[k], self.cuts[k + 1]
        nbytes = (hi - lo) * A.dtype.itemsize
        if nbytes > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = nbytes
        fn((self.blocks,), (1024,), (self.ptr[k * n:], self.ptr[(k + 1) * n:], A.indices, A.data, np.int64(n), vec,
                                     np.int32(lo), np.int32(hi - lo), out) + extra, shared_mem=nbytes)

    def dot(self, x):
        """``A x`` as float64 (``x`` of length ``n_cols``, cast to ``A``'s dtype)."""
        import cupy

        A = self.A
        y = cupy.zeros(A.shape[0], dtype=cupy.float64)
        if A.shape[0] == 0 or A.nnz == 0:
            return y
        x = cupy.ascontiguousarray(x.astype(A.dtype, copy=False))
        for k in range(self.K):
            self._launch("mpiml_csr_piece_dot", k, x, y, np.int32(k > 0))
        return y

    def tdot(self, u):
        """``Aᵀ u`` as float64 (``u`` of length ``n_rows``, cast to ``A``'s dtype)."""
        import cupy

        A = self.A
        y = cupy.zeros(A.shape[1], dtype=cupy.float64)
        if A.shape[0] == 0 or A.nnz == 0:
            return y
        u = cupy.ascontiguousarray(u.astype(A.dtype, copy=False))
        for k in range(self.K):
            self._launch("mpiml_csr_piece_scatter", k, u, y)
        return y


#: Most column pieces :func:`column_pieces` cuts a matrix into (each piece reads the indices once to split).
MAX_PIECES = 8


def column_pieces(A, max_pieces=MAX_PIECES):
    """:class:`ColumnPieces` of a ``cupyx`` CSR ``A`` (see :func:`supported`), or None.

    None when ``A`` needs more than ``max_pieces`` pieces, or more than one
    and its rows' indices are not sorted (the pieces of a row must be
    contiguous).  A piece is as wide as the device's opt-in shared memory per
    block holds values of ``A``'s dtype (56,000 float32 on an H100).
    """
    import cupy

    n, d = A.shape
    dev = cupy.cuda.Device()
    attrs = dev.attributes
    optin = int(attrs.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
    per_sm = int(attrs.get("MaxSharedMemoryPerMultiprocessor", optin))
    item = np.dtype(A.dtype).itemsize
    width = max(256, (optin - 2048) // item // 256 * 256)
    K = max(1, -(-d // width))
    if K > max_pieces:
        return None
    cuts = np.minimum(np.arange(K + 1, dtype=np.int64) * width, d)
    if K == 1:
        ptr = cupy.concatenate([A.indptr[:-1], A.indptr[1:]])
    else:
        ptr = cupy.empty((K + 1) * n, dtype=cupy.int32)
        bad = cupy.zeros(1, dtype=cupy.int32)
        if n:
            _function("mpiml_csr_split")((_blocks(_THREADS // 32, n),), (_THREADS,),
                                         (A.indptr, A.indices, np.int64(n), cupy.asarray(cuts.astype(np.int32)),
                                          np.int32(K), ptr, bad))
            if int(bad.get()[0]):
                return None
    widest = int(np.diff(cuts).max()) * item if d else 0
    blocks = _sm_count() * max(1, min(2, per_sm // max(1, widest + 1024)))
    return ColumnPieces(A, ptr, cuts, widest, blocks)


# ---------------------------------------------------------------------- random matrix
def normal(seed, shape, dtype=np.float32):
    """A standard normal CuPy array of ``shape`` in ``dtype`` (float32 or float64) from an integer ``seed``, drawn by
    ``mpiml_normal`` (splitmix64 at a counter a pair, Box-Muller in double): one launch, nothing set up, the same
    values on every device for a seed."""
    import cupy

    dtype = np.dtype(dtype)
    out = cupy.empty(shape, dtype=dtype)
    n = int(out.size)
    if n:
        _function(f"mpiml_normal<{_TYPES[dtype]}>")((_blocks(_THREADS, -(-n // 2)),), (_THREADS,),
                                                   (np.uint64(int(seed) % 2**64), np.int64(n), out))
    return out


# ---------------------------------------------------------------------- small factorisations
#: Largest ``l`` :func:`small_cholinv` takes (MPIML_SMALL_MAX in spmm.cu).
SMALL_MAX = 64


def small_cholinv(G, flag, max_cond=0.0):
    """``(R, R⁻¹)`` of ``G = RᵀR`` (Cholesky) for a symmetric ``l x l`` CuPy ``G`` (``l <= SMALL_MAX``), float64,
    on the device with no read back: one kernel, the checks ORed into the int32 device scalar ``flag`` (1: not
    positive definite; 2: ``‖R‖_F ‖R⁻¹‖_F > max_cond``, an upper bound of ``cond(R)``; ``max_cond <= 0``: not
    checked), for the caller to read once later."""
    import cupy

    l = G.shape[0]
    if G.shape != (l, l) or not 1 <= l <= SMALL_MAX:
        raise ValueError(f"small_cholinv takes a square matrix of 1 to {SMALL_MAX} rows; got shape {G.shape}")
    G = cupy.ascontiguousarray(G, dtype=cupy.float64)
    R = cupy.empty((l, l), dtype=cupy.float64)
    Rinv = cupy.empty((l, l), dtype=cupy.float64)
    _function("mpiml_small_cholinv")((1,), (128,), (G, np.int32(l), np.float64(max_cond), R, Rinv, flag))
    return R, Rinv


def small_svd(R, flag):
    """``(U, s, Vt)`` with ``R = U diag(s) Vt`` for a square float64 CuPy ``R`` of 1 to :data:`SMALL_MAX` rows, on
    the device with no read back (one kernel, one-sided Jacobi; ``s`` descending): ``flag |= 4`` when 60 sweeps do
    not converge.  Signs as Jacobi leaves them (the callers flip by scikit-learn's rule)."""
    import cupy

    l = R.shape[0]
    if R.shape != (l, l) or not 1 <= l <= SMALL_MAX:
        raise ValueError(f"small_svd takes a square matrix of 1 to {SMALL_MAX} rows; got shape {R.shape}")
    R = cupy.ascontiguousarray(R, dtype=cupy.float64)
    U = cupy.empty((l, l), dtype=cupy.float64)
    Vt = cupy.empty((l, l), dtype=cupy.float64)
    s = cupy.empty(l, dtype=cupy.float64)
    fn = _function("mpiml_small_svd")
    smem = 2 * l * l * 8
    if smem > 40 * 1024:          # with the kernel's static shared memory, past the 48 KiB default
        fn.max_dynamic_shared_size_bytes = smem
    fn((1,), (1024,), (R, np.int32(l), U, s, Vt, flag), shared_mem=smem)
    return U, s, Vt


# ---------------------------------------------------------------------- which products a shard uses
#: How a ``cupyx`` CSR shard multiplies (environment ``MPIML_SPARSE_PRODUCTS``, read when a fit starts):
#: ``"kernels"`` (default): :mod:`mpiml.kernels.sparse` for ``X V`` and for ``Xᵀ U`` on ``Xᵀ`` stored as
#: CSR once per fit (deterministic); ``"scatter"``: the same ``X V``, ``Xᵀ U`` by atomics from the rows
#: of ``X`` (no transpose formed, not deterministic); ``"cusparse"``: cuSPARSE SpMM on ``X`` and the
#: stored ``Xᵀ`` (the path before the kernels).  The decompositions and the linear models' sparse
#: Krylov operator both read it.
PRODUCTS = ("kernels", "scatter", "cusparse")


def products_mode():
    """The products a ``cupyx`` CSR shard uses, from ``MPIML_SPARSE_PRODUCTS`` (read when a fit starts)."""
    return _env_choice("MPIML_SPARSE_PRODUCTS", PRODUCTS)


def for_shard(X):
    """:mod:`mpiml.kernels.sparse` when it takes the shard ``X`` (``cupyx`` CSR, float32/64, int32 indices)."""
    if type(X).__module__.startswith("cupyx"):
        if supported(X):
            return sys.modules[__name__]
    return None
