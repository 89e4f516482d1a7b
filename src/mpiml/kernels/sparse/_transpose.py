"""The transposes of a ``cupyx`` CSR matrix (``Aᵀ`` stored as CSR, what ``XᵀU`` gathers from): cuSPARSE's, the
kernel one (atomic fill and sort) and the bucket one (a two-level stable counting sort), all giving the arrays of
``A.T.tocsr()``.  Part of :mod:`mpiml.kernels.sparse`, which re-exports the public names; CuPy is imported inside
the functions only."""

import os

import numpy as np

from ._launch import BUCKET_PER as _BUCKET_PER
from ._launch import SORT_WORDS as _SORT_WORDS
from ._launch import _THREADS, _TYPES, _blocks, _env_choice, _function, _sm_count, supported

#: How a fit forms ``Xᵀ`` as CSR (environment ``MPIML_SPARSE_TRANSPOSE``, read when the conversion starts):
#: ``"buckets"`` (default): :func:`csr_transpose_buckets` (a two-level stable counting sort, every write coalesced;
#: 4.84 ms at 10^8 values on an H100 in the pass of 22:50, fits 38.5 ms against 43.1 with cuSPARSE's; cuSPARSE's
#: where :func:`buckets_supported` says no); ``"cusparse"``: ``X.T.tocsr()`` (cuSPARSE's csr2csc, 8.9-9.1 ms
#: there); ``"kernel"``: :func:`csr_transpose` (11.6-12.0 ms: its atomic fill 6.5 ms, its sort 3.7).  The same
#: arrays every way.
TRANSPOSES = ("buckets", "cusparse", "kernel")
#: Most values a column of ``A`` may hold for :func:`csr_transpose` to sort its row of ``Aᵀ`` (in shared
#: memory: 4096 words and values are 32 to 64 KiB); longer rows stay in the fill's order.
TRANSPOSE_MAX_RUN = 4096


def transpose_mode():
    """How ``Xᵀ`` is formed, from ``MPIML_SPARSE_TRANSPOSE`` (see :data:`TRANSPOSES`)."""
    return _env_choice("MPIML_SPARSE_TRANSPOSE", TRANSPOSES)


def _sort_word(n_rows, pbits):
    return _SORT_WORDS[0] if max(int(n_rows) - 1, 0) < (1 << (32 - pbits)) else _SORT_WORDS[1]


def transpose_functions(dtype):
    """The kernels of :func:`csr_transpose` for values of ``dtype``, loaded: ``(counts, fill, {word: sort})``; a
    fit loads them on its own thread before its worker thread converts."""
    T = _TYPES[np.dtype(dtype)]
    counts = "mpiml_csr_col_counts_smem" if _env_choice("MPIML_SPARSE_TRANSPOSE_COUNTS", _COUNTS) == "smem" \
        else "mpiml_csr_col_counts"
    return (_function(counts), _function(f"mpiml_csr_transpose_fill<{T}>"),
            {w: _function(f"mpiml_csr_sort_runs<{T}, {w}>") for w in _SORT_WORDS})


#: How :func:`csr_transpose` counts the columns and fills (environment ``MPIML_SPARSE_TRANSPOSE_COUNTS``):
#: ``"global"`` (default): a global atomic a stored value to count, another to place it; ``"smem"``: the counts
#: by windows of columns in shared memory a block (one global atomic a column a block); ``"blocks"``: no global
#: atomic, a block's counts of its rows by windows in shared memory, scanned down the blocks, and the fill from
#: those starts by shared atomics (measured against each other in ``benchmarks/sparse/spmm_gpu.py``).
_COUNTS = ("global", "smem", "blocks")


def csr_transpose(A, max_run=None, moments=False, events=None):
    """``Aᵀ`` as a ``cupyx`` CSR matrix (see :func:`supported`), with no wait on the device.

    The column counts by atomics, their scan (``Aᵀ``'s row pointers), a fill that puts every stored value in
    its row of ``Aᵀ`` at a place taken by an atomic, then a block a row of ``Aᵀ`` sorts it by index in shared
    memory: for ``A`` without duplicate entries, the arrays of ``A.T.tocsr()`` exactly, whatever the order of
    the atomics (deterministic).  A row of ``Aᵀ`` longer than ``max_run`` (default :data:`TRANSPOSE_MAX_RUN`,
    rounded up to a power of two) stays in the fill's order (the same matrix; products on it sum in an order
    that varies); duplicates stay (as cuSPARSE keeps them), in an order that may vary.

    ``moments``: ``(Aᵀ, (s1, s2, flags))`` instead: per column of ``A`` the sum of its stored values and the sum
    of their squared deviations from their own mean (float64), and, as a device int32, the count of columns
    with a repeated row or left unsorted (then ``s2`` may not be the moment of the matrix and the indices of
    that row of ``Aᵀ`` are not increasing); computed by the sort while each column's values are in shared
    memory.  ``events``: a list that gets ``(phase, CUDA event)`` after each phase (the benchmark's breakdown).
    Memory: the counts and a cursor (``n_cols`` int32 each), two float64 vectors, besides ``Aᵀ``'s arrays.
    """
    import cupy

    n_rows, n_cols = A.shape
    nnz = int(A.nnz)
    limit = TRANSPOSE_MAX_RUN if max_run is None else max(2, int(max_run))
    pbits = max(1, int(limit - 1).bit_length())                 # the sort's places: p = 2^pbits >= limit
    p = 1 << pbits
    count_fn, fill_fn, sorts = transpose_functions(A.dtype)

    def phase(name):
        if events is not None:
            events.append((name, cupy.cuda.Event()))
            events[-1][1].record()

    phase("start")
    counts = cupy.zeros(n_cols + 1, dtype=cupy.int32)
    how = _env_choice("MPIML_SPARSE_TRANSPOSE_COUNTS", _COUNTS)
    blocked = None
    if nnz and n_rows and how == "blocks":
        optin = int(cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
        w = max(1024, (optin - 2048) // 4 // 32 * 32)
        nb = _sm_count()
        per = -(-n_rows // nb)
        bc = cupy.empty(nb * n_cols, dtype=cupy.int32)
        fn = _function("mpiml_csr_block_counts")
        fn.max_dynamic_shared_size_bytes = 4 * w
        fn((nb,), (1024,), (A.indptr, A.indices, np.int64(n_rows), np.int64(per), np.int32(n_cols), np.int32(w), bc),
           shared_mem=4 * w)
        _function("mpiml_csr_block_scan")((-(-n_cols // _THREADS),), (_THREADS,),
                                          (bc, np.int32(nb), np.int32(n_cols), counts[1:]))
        blocked = (w, nb, per, bc)
    elif nnz and n_rows and how == "smem":
        optin = int(cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
        w = max(1024, (optin - 2048) // 4 // 32 * 32)
        count_fn.max_dynamic_shared_size_bytes = 4 * w
        count_fn((_sm_count(),), (1024,), (A.indices, np.int64(nnz), np.int32(n_cols), np.int32(w), counts[1:]),
                 shared_mem=4 * w)
    elif nnz and n_rows:
        count_fn((int(min(-(-nnz // _THREADS), _sm_count() * 32)),), (_THREADS,),
                 (A.indices, np.int64(nnz), counts[1:]))
    phase("counts")
    ptr = cupy.cumsum(counts, dtype=cupy.int32)          # ptr[0] = 0: Aᵀ's row pointers
    rows_t = cupy.empty(nnz, dtype=cupy.int32)
    data_t = cupy.empty(nnz, dtype=A.dtype)
    s1 = cupy.zeros(n_cols, dtype=cupy.float64)
    s2 = cupy.zeros(n_cols, dtype=cupy.float64)
    flags = cupy.zeros(1, dtype=cupy.int32)
    if nnz and n_rows and blocked is not None:
        w, nb, per, bc = blocked
        phase("scan and allocation")
        fn = _function(f"mpiml_csr_block_fill<{_TYPES[np.dtype(A.dtype)]}>")
        fn.max_dynamic_shared_size_bytes = 4 * w
        fn((nb,), (1024,), (A.indptr, A.indices, A.data, np.int64(n_rows), np.int64(per), np.int32(n_cols),
                            np.int32(w), bc, ptr, rows_t, data_t), shared_mem=4 * w)
        phase("fill")
    elif nnz and n_rows:
        cursor = ptr[:-1].copy()
        phase("scan and allocation")
        fill_fn((_blocks(_THREADS // 32, n_rows),), (_THREADS,),
                (A.indptr, A.indices, A.data, np.int64(n_rows), cursor, rows_t, data_t))
        phase("fill")
    if nnz and n_rows:
        word = _sort_word(n_rows, pbits)
        sort_fn = sorts[word]
        smem = p * ((4 if word == _SORT_WORDS[0] else 8) + np.dtype(A.dtype).itemsize)
        if smem > 40 * 1024:      # with the kernel's static shared memory, past the 48 KiB default
            sort_fn.max_dynamic_shared_size_bytes = smem
        sort_fn((int(min(n_cols, _sm_count() * 16)),), (_THREADS,),
                (ptr, np.int64(n_cols), np.int32(p), np.int32(pbits), rows_t, data_t, s1, s2, flags),
                shared_mem=smem)
        phase("sort")
    XT = _csr_from_parts(data_t, rows_t, ptr, (n_cols, n_rows))
    return (XT, (s1, s2, flags)) if moments else XT


#: Threads of a block of the bucket transpose's kernels, and stored values a thread (by value type): a block
#: holds ``E = threads * per`` entries (8192 float32, 4096 float64) in shared memory.  Environment
#: ``MPIML_SPARSE_BUCKET_THREADS`` (256, 512 or 1024) sets it (the benchmark's sweep: smaller blocks, more of
#: them an SM, shorter runs).
BUCKET_THREADS = 1024


def _bucket_threads():
    return int(_env_choice("MPIML_SPARSE_BUCKET_THREADS", (str(BUCKET_THREADS), "256", "512", "1024")))
#: Most buckets (pass 1) and columns a bucket (pass 2): their per-warp counts are 2 bytes each in shared memory.
BUCKET_MAX = 1024


def bucket_shift(n_cols):
    """``s``: a bucket of the bucket transpose holds ``2^s`` columns, about as many as there are buckets
    (``s = floor(log2(n_cols) / 2)``, raised until there are at most :data:`BUCKET_MAX` buckets), or None when
    ``n_cols`` needs more than :data:`BUCKET_MAX` of each.  Environment ``MPIML_SPARSE_BUCKET_SHIFT`` sets it (the
    benchmark's sweep).  Pass 1 writes runs of about ``E / K`` entries, pass 2 about ``E / 2^s``: balanced."""
    n_cols = int(n_cols)
    forced = os.environ.get("MPIML_SPARSE_BUCKET_SHIFT")
    s = int(forced) if forced else max(0, (max(1, n_cols).bit_length() - 1) // 2)
    while -(-n_cols >> s) > BUCKET_MAX and not forced:
        s += 1
    if not 0 <= s <= 16 or (1 << s) > BUCKET_MAX or -(-n_cols >> s) > BUCKET_MAX:
        return None
    return s


def _bucket_smem(T, s, K, threads):
    """Dynamic shared memory of (pass 1, pass 2) of the bucket transpose for values of C type ``T``."""
    item = 4 if T == "float" else 8
    E = threads * _BUCKET_PER[T]
    nw = threads // 32
    return E * (item + 8) + K * nw * 2, E * (item + 6) + (1 << s) * (4 + nw * 2)


def buckets_supported(A):
    """Whether :func:`csr_transpose_buckets` takes ``A`` (see :func:`supported`): at most ``BUCKET_MAX²`` columns,
    fewer than ``2^31`` stored values, and its blocks' shared memory within the device's."""
    import cupy

    if not supported(A):
        return False
    s = bucket_shift(A.shape[1])
    if s is None or int(A.nnz) >= 2**31 - 2**16:
        return False
    dev = cupy.cuda.runtime.getDevice()
    if dev not in _OPTIN:       # reading a device's attributes costs more than a launch: once per device
        _OPTIN[dev] = int(cupy.cuda.Device(dev).attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))
    need = max(_bucket_smem(_TYPES[np.dtype(A.dtype)], s, -(-A.shape[1] >> s), _bucket_threads()))
    return need + 1024 <= _OPTIN[dev]


_OPTIN = {}


def csr_transpose_buckets(A, events=None):
    """``Aᵀ`` as a ``cupyx`` CSR matrix by a two-level stable counting sort (``mpiml_bt_*`` in ``spmm.cu``), with no
    wait on the device: the arrays of cuSPARSE's conversion (``A.T.tocsr()``), each row of ``Aᵀ`` in increasing
    index order whatever the order within ``A``'s rows (duplicates kept, in storage order).  For ``A`` that
    :func:`buckets_supported` takes.

    Columns go by buckets of ``2^s`` (:func:`bucket_shift`).  Three kernels and a scan: the count of each chunk of
    ``E`` stored values in each bucket; a block a chunk sorts it by bucket in shared memory (stable) and writes each
    bucket's run to the staging, bucket-major; a block a bucket counts its columns (``Aᵀ``'s row pointers) and
    sorts its entries tile by tile by column in shared memory (stable), each column's run written after the last.
    No global atomic, no scattered 4-byte write, no sort phase.  Memory besides ``Aᵀ``'s arrays: the staging (10
    bytes a float32 value, 14 a float64) and the counts (4 bytes a chunk and bucket).  ``events``: a list that gets
    ``(phase, CUDA event)`` after each phase (the benchmark's breakdown)."""
    import cupy

    n_rows, n_cols = A.shape
    nnz = int(A.nnz)
    T = _TYPES[np.dtype(A.dtype)]

    def phase(name):
        if events is not None:
            events.append((name, cupy.cuda.Event()))
            events[-1][1].record()

    phase("start")
    rows_t = cupy.empty(nnz, dtype=cupy.int32)
    data_t = cupy.empty(nnz, dtype=A.dtype)
    if nnz == 0 or n_rows == 0 or n_cols == 0:
        return _csr_from_parts(data_t, rows_t, cupy.zeros(n_cols + 1, dtype=cupy.int32), (n_cols, n_rows))
    s = bucket_shift(n_cols)
    if s is None:
        raise ValueError(f"the bucket transpose takes at most {BUCKET_MAX ** 2} columns; got {n_cols}")
    K = -(-n_cols >> s)
    per = _BUCKET_PER[T]
    threads = _bucket_threads()
    E = threads * per
    nchunks = -(-nnz // E)
    smem_a, smem_b = _bucket_smem(T, s, K, threads)
    starts = cupy.arange(nchunks, dtype=cupy.int64) * E
    chunk_row = (cupy.searchsorted(A.indptr.astype(cupy.int64), starts, side="right") - 1).astype(cupy.int32)
    counts = cupy.zeros(K * nchunks + 1, dtype=cupy.int32)
    counts_fn = _function(f"mpiml_bt_counts<{per}>")
    counts_fn((nchunks,), (threads,), (A.indices, np.int64(nnz), np.int32(s), np.int32(K), np.int32(nchunks), counts),
              shared_mem=4 * K)
    phase("counts")
    offsets = cupy.cumsum(counts, dtype=cupy.int32)      # offsets[k * nchunks + c]: (bucket, chunk)'s first place
    st_col = cupy.empty(nnz, dtype=cupy.uint16)
    st_row = cupy.empty(nnz, dtype=cupy.int32)
    st_val = cupy.empty(nnz, dtype=A.dtype)
    ptr = cupy.empty(n_cols + 1, dtype=cupy.int32)
    phase("scan and allocation")
    scatter = _function(f"mpiml_bt_scatter<{T}, {per}>")
    scatter.max_dynamic_shared_size_bytes = smem_a
    scatter((nchunks,), (threads,), (A.indptr, A.indices, A.data, np.int64(n_rows), np.int64(nnz), chunk_row,
                                     np.int32(s), np.int32(K), np.int32(nchunks), offsets, st_col, st_row, st_val),
            shared_mem=smem_a)
    phase("buckets")
    place = _function(f"mpiml_bt_place<{T}, {per}>")
    place.max_dynamic_shared_size_bytes = smem_b
    place((K,), (threads,), (st_col, st_row, st_val, offsets, np.int32(nchunks), np.int32(K), np.int32(s),
                             np.int32(n_cols), ptr, rows_t, data_t), shared_mem=smem_b)
    phase("columns")
    return _csr_from_parts(data_t, rows_t, ptr, (n_cols, n_rows))


def _csr_from_parts(data, indices, indptr, shape):
    """A ``cupyx`` CSR matrix of these arrays with no check of their contents (a constructor that checks the
    indices reads them back: a wait on the device)."""
    import cupyx.scipy.sparse as csp

    make = getattr(csp.csr_matrix, "_from_parts", None)
    if make is not None:
        try:
            return make(data, indices, indptr, shape)
        except TypeError:   # another signature: the plain way below
            pass
    M = csp.csr_matrix(shape, dtype=data.dtype)
    M.data, M.indices, M.indptr = data, indices, indptr
    return M
