"""Fused distance + k-selection on CuPy arrays: the ``k`` nearest rows of ``X`` for every query.

The kernels (``select.cu`` beside this module) never write the ``(n_queries, n_index)``
distance matrix: a block keeps a tile of queries and streams tiles of index rows, computes
their distances in registers and keeps each query's ``k`` best in shared memory, behind a
running ``k``-th threshold (one compare per candidate for almost all of them).  The index is
cut into splits so that every SM is busy; a merge kernel ranks the splits' sorted lists.

Nothing compiles at import; :func:`_module` loads the instantiations one call needs (a shipped
cubin, this machine's cache, else NVRTC once, see :mod:`mpiml.kernels._loader`), memoised per device.
"""

import numpy as np

__all__ = ["METRICS", "MAX_K", "topk", "within", "exact_sq", "plan", "gemm_plan"]

#: metric -> MODE of the kernel
METRICS = {"sqeuclidean": 0, "euclidean": 0, "cosine": 1, "inner_product": 2, "manhattan": 3, "chebyshev": 4,
           "minkowski": 5}
_THREADS = 256
_NT = 128          # index rows per tile
_DK = 32           # dimensions per shared-memory chunk
_CONFIGS = ((4, 16), (2, 16), (1, 16), (1, 8))   # (TM, TY): QT = TM * TY queries per block
_SMEM_GOOD = 110 * 1024   # two blocks per SM
_SMEM_MAX = 200 * 1024
MAX_K = 1024
#: bytes of the per-split partial lists allowed per launch (larger query sets go in batches)
_PARTIAL_BYTES = 256 << 20

#: the GEMM route (cuBLAS dot products of a fixed-shape tile, then mpiml_knn_tile_select) serves these metrics
GEMM_METRICS = ("sqeuclidean", "euclidean", "cosine", "inner_product")
#: from this many dimensions on, by itemsize.  Measured on one H100 (4096 queries x 10^6 rows, k = 10,
#: benchmarks/ml/knn_gemm_route.py): float32 1.06x at d = 128, 1.15x at 192, 1.38x at 256; float64 4.8x at
#: d = 128 (DGEMM runs on the FP64 tensor cores; below 128 not measured, so the fused kernel stays there)
_GEMM_MIN_D = {4: 192, 8: 128}
#: the fixed tile: query rows x index rows (a first choice, not swept yet), warps of a selection block
_GEMM_QUERIES = 1024
_GEMM_ROWS = 16384
_TS_WARPS = 4
#: most column splits of a tile (each split keeps its own running list of every query)
_TS_SPLITS = 16

_MODULES = {}
_DEVICE = {}


def _module(expressions):
    """The compiled ``select.cu`` with the name ``expressions`` on the current device (memoised)."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), tuple(expressions))
    mod = _MODULES.get(key)
    if mod is None:
        # shipped, cached or compiled once, the call's instantiations in one program (mpiml.kernels._loader)
        from .._loader import load_module

        mod = _MODULES[key] = load_module(("select/select.cu",), list(expressions))
    return mod


def _device():
    """(SMs, shared bytes an SM) of the current device (memoised: reading attributes is slow)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    if dev not in _DEVICE:
        attrs = cupy.cuda.Device(dev).attributes
        _DEVICE[dev] = (attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024))
    return _DEVICE[dev]


def _sms():
    return _device()[0]


def _ctype(dtype):
    return "float" if np.dtype(dtype) == np.float32 else "double"


def _smem(itemsize, qt, k):
    """Shared bytes: query and row chunks, the tile's values, and (selection) the lists, the k-th
    values and the flags of the queries."""
    lists = itemsize * (qt * k + qt) + 4 * (qt * k + qt) if k else 0
    return itemsize * (_DK * (qt + 4) + _DK * (_NT + 4) + qt * _NT) + lists


def _config(dtype, k):
    """``(TM, TY, shared bytes)``: the largest query tile whose lists fit two blocks an SM, else
    the smallest (float64 leaves out 4 x 8 accumulators a thread, which would leave one block an SM)."""
    itemsize = np.dtype(dtype).itemsize
    fits = [(tm, ty) for tm, ty in _CONFIGS if not (itemsize == 8 and tm == 4)]
    tm, ty = next((c for c in fits if _smem(itemsize, c[0] * c[1], k) <= _SMEM_GOOD), fits[-1])
    smem = _smem(itemsize, tm * ty, k)
    if smem > _SMEM_MAX:
        raise ValueError(f"k = {k} does not fit the selection kernel's shared memory")
    return tm, ty, smem


def _splits(nq, m, k, qt, resident):
    """``(splits, split_rows)``: cut the index so that the grid (query tiles x splits) fills at
    least two waves of ``resident`` blocks, with the last wave nearly full; a split keeps at
    least eight tiles of rows and ``4 k`` rows."""
    q_tiles = max(1, -(-nq // qt))
    most = int(max(1, min(m // max(8 * _NT, 4 * k), 256)))
    best = 1
    if q_tiles < 2 * resident:  # else enough query tiles: no split at all
        options = [(s, s * q_tiles / resident) for s in range(1, most + 1)]
        full = [(s, w) for s, w in options if w >= 2]
        good = [s for s, w in full if w / np.ceil(w) >= 0.9]
        if good:
            best = good[0]
        elif full:
            best = max(full, key=lambda sw: (sw[1] / np.ceil(sw[1]), -sw[0]))[0]
        else:
            best = most
    split_rows = -(-m // best)
    split_rows = -(-split_rows // _NT) * _NT
    return -(-m // split_rows), split_rows


def plan(dtype, k, metric, nq, m, sms=132, per_sm=2):
    """``(TM, TY, splits, split_rows, shared bytes)`` of one launch (pure: testable without a GPU)."""
    tm, ty, smem = _config(dtype, k)
    splits, split_rows = _splits(nq, m, k, tm * ty, sms * per_sm)
    return tm, ty, splits, split_rows, smem


def gemm_plan(dtype, k, metric, d):
    """The GEMM route's launch plan, or None when the fused kernel runs (pure: testable without a GPU).

    The route is taken for the GEMM-form metrics (:data:`GEMM_METRICS`) from ``d`` of
    ``_GEMM_MIN_D`` on: there the dot products are a GEMM that cuBLAS runs near the peak, while the
    register-tiled SIMT kernel reaches well under half of it.  Returns a dict: ``queries`` and
    ``rows`` (the fixed shape of a tile: query rows x index rows), ``dp`` (``d`` rounded up to 16
    bytes: the GEMM's inner dimension), ``splits`` and ``split_cols`` (column splits of a tile, each
    with a running list of ``k`` entries a query), ``smem`` (shared bytes of a block) and
    ``tile_bytes``.  Whether the route is taken, and the tile's shape, depend only on (``metric``,
    ``d``, dtype) -- never on the number of queries or index rows, which differ between ranks --
    so that every rank count computes every pair by the same GEMM (see :func:`topk`).
    """
    dtype = np.dtype(dtype)
    if metric not in GEMM_METRICS or d < _GEMM_MIN_D[dtype.itemsize]:
        return None
    return _gemm_shape(dtype, k, d)


def _gemm_shape(dtype, k, d):
    """:func:`gemm_plan`'s dict, whatever ``d``."""
    dtype = np.dtype(dtype)
    per16 = 16 // dtype.itemsize
    qb, cb = _GEMM_QUERIES, _GEMM_ROWS
    # splits: enough warps to fill the GPU, but each split's columns at least 8 k (its list is read
    # and written back once per tile) and a whole number of 128-column steps
    splits = int(max(1, min(_TS_SPLITS, cb // max(128, 8 * k))))
    split_cols = -(-cb // splits)
    split_cols = -(-split_cols // 128) * 128
    splits = -(-cb // split_cols)
    return {"queries": qb, "rows": cb, "dp": -(-d // per16) * per16, "splits": splits, "split_cols": split_cols,
            "smem": _TS_WARPS * k * (dtype.itemsize + 4), "tile_bytes": qb * cb * dtype.itemsize}


def _resident(fn, smem):
    """Blocks of ``fn`` resident on one SM (registers and shared memory)."""
    regs = max(1, (int(fn.num_regs) + 7) // 8 * 8)
    smem_sm = _device()[1]
    return int(max(1, min(65536 // (regs * _THREADS), smem_sm // (smem + 1024), 8)))


def _aux(A, mode, norms, cupy):
    """Per-row terms of the epilogue: squared norms (euclidean), inverse norms (0 for a zero row,
    cosine), each row summed in order by one thread (a row's value does not depend on the batch)."""
    n, d = A.shape
    if mode > 1 or n == 0:
        return cupy.zeros(1, dtype=A.dtype)
    out = cupy.empty(n, dtype=A.dtype)
    norms((int(min(-(-n // _THREADS), 65535)),), (_THREADS,), (A, np.int32(n), np.int32(d), out))
    return out


def _route_kernels(sel_expr, Q, X, mode, smem, cupy):
    """What both routes of :func:`topk` fetch, from one module: the selection kernel ``sel_expr`` (allowed
    ``smem`` bytes of dynamic shared memory), the merge of the splits' lists, and the per-row terms of
    ``X`` and ``Q`` by the norms kernel of their dtype and ``mode`` (:func:`_aux`).

    Returns ``(select, merge, x_terms, q_terms)``."""
    ctype = _ctype(X.dtype)
    merge_expr = f"mpiml_knn_merge<{ctype}>"
    norms_expr = f"mpiml_knn_norms<{ctype}, {min(mode, 1)}>"
    mod = _module((sel_expr, merge_expr, norms_expr))
    sel, merge, norms = (mod.get_function(e) for e in (sel_expr, merge_expr, norms_expr))
    if smem > 48 * 1024:
        sel.max_dynamic_shared_size_bytes = smem
    return sel, merge, _aux(X, mode, norms, cupy), _aux(Q, mode, norms, cupy)


def exact_sq(Q, X, idx):
    """Squared distances ``|X[idx[i, j]] - Q[i]|²`` from the differences (CuPy, dtype of ``X``).

    One warp a pair, with a fixed order of additions: a pair's value is the same whatever
    else is computed with it.
    """
    import cupy

    X = cupy.ascontiguousarray(X)
    Q = cupy.ascontiguousarray(Q, dtype=X.dtype)
    idx = cupy.ascontiguousarray(idx, dtype=cupy.int64)
    nq, k = idx.shape
    out = cupy.empty((nq, k), dtype=X.dtype)
    if out.size == 0:
        return out
    expr = f"mpiml_knn_exact_sq<{_ctype(X.dtype)}>"
    fn = _module((expr,)).get_function(expr)
    warps = _THREADS // 32
    fn((int(min(-(-out.size // warps), 65535 * 8)),), (_THREADS,),
       (Q, X, np.int32(X.shape[1]), idx, np.int32(nq), np.int32(k), out))
    return out


def _aligned_zeros(shape, dtype, cupy, align=256):
    """A C-contiguous zero array whose data starts on an ``align``-byte boundary."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    flat = cupy.zeros(n + align // dtype.itemsize, dtype=dtype)
    off = (-flat.data.ptr % align) // dtype.itemsize
    return flat[off:off + n].reshape(shape)


def _gemm_consts(cublas):
    from cupy_backends.cuda.api import runtime

    return {"r32": getattr(runtime, "CUDA_R_32F", 0), "r64": getattr(runtime, "CUDA_R_64F", 1),
            "c32": getattr(cublas, "CUBLAS_COMPUTE_32F", 68), "c64": getattr(cublas, "CUBLAS_COMPUTE_64F", 70),
            "algo": getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1), "n": getattr(cublas, "CUBLAS_OP_N", 0),
            "t": getattr(cublas, "CUBLAS_OP_T", 1)}


def _gemm_topk(Q, X, k, mode, gp, dist, idx):
    """The GEMM route of :func:`topk` (its docstring says why every GEMM has one shape): for each batch
    of ``gp["queries"]`` queries, each chunk of ``gp["rows"]`` index rows: the tile of dot products by
    cuBLAS, then ``mpiml_knn_tile_select`` into the splits' running lists; the lists merged into
    ``dist`` / ``idx`` after the last chunk.  Everything is enqueued on CuPy's current stream, with no
    host synchronisation."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    dtype = X.dtype
    nq, d = Q.shape
    m = X.shape[0]
    qb, cb, dp = gp["queries"], gp["rows"], gp["dp"]
    splits, split_cols, smem = gp["splits"], gp["split_cols"], gp["smem"]
    sel, merge, xaux, qaux = _route_kernels(f"mpiml_knn_tile_select<{_ctype(dtype)}, {mode}>", Q, X, mode, smem,
                                            cupy)
    # X is read in place where its rows are whole 16-byte multiples and it starts on a 256-byte
    # boundary (then every full chunk does: cb * dp * itemsize is a multiple of 256); else each chunk
    # is staged.  The last, partial chunk is always staged (padded with zero rows).
    inplace = d == dp and X.data.ptr % 256 == 0
    n_full = m // cb if inplace else 0
    xbuf = _aligned_zeros((cb, dp), dtype, cupy) if n_full * cb < m else None
    if inplace and xbuf is not None:
        xbuf[:m - n_full * cb, :d] = X[n_full * cb:]
    qbuf = _aligned_zeros((qb, dp), dtype, cupy)
    tile = _aligned_zeros((qb, cb), dtype, cupy)
    pv = cupy.empty((qb, splits, k), dtype=dtype)
    pi = cupy.empty((qb, splits, k), dtype=cupy.int32)
    c = _gemm_consts(cublas)
    f32 = dtype == np.float32
    ctype_id, compute = (c["r32"], c["c32"]) if f32 else (c["r64"], c["c64"])
    one, zero = np.array(1, dtype=dtype), np.array(0, dtype=dtype)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    mode_saved = cublas.getMathMode(handle) if hasattr(cublas, "getMathMode") else None
    if mode_saved:  # no TF32 (nor any other reduced precision) for the dot products
        cublas.setMathMode(handle, 0)
    pointer_saved = cublas.getPointerMode(handle) if hasattr(cublas, "getPointerMode") else None
    if pointer_saved:  # alpha and beta are host scalars
        cublas.setPointerMode(handle, 0)
    atomics_saved = cublas.getAtomicsMode(handle) if hasattr(cublas, "getAtomicsMode") else None
    if atomics_saved:  # no atomics: a GEMM's sums in one order, run after run
        cublas.setAtomicsMode(handle, 0)
    try:
        for s in range(0, nq, qb):
            n = min(qb, nq - s)
            qbuf[:n, :d] = Q[s:s + n]
            if n < qb:
                qbuf[n:] = 0
            qa = qaux[s:] if mode <= 1 else qaux
            pv.fill(np.inf)
            pi.fill(0x7FFFFFFF)
            for c0 in range(0, m, cb):
                r = min(cb, m - c0)
                if inplace and r == cb:
                    a_ptr = X.data.ptr + c0 * dp * dtype.itemsize
                else:
                    if not inplace:
                        xbuf[:r, :d] = X[c0:c0 + r]
                        if r < cb:
                            xbuf[r:] = 0
                    a_ptr = xbuf.data.ptr
                # column-major: tile^T (cb x qb) = chunk (cb x dp, stored as dp x cb) ^T . queries (dp x qb)
                cublas.gemmEx(handle, c["t"], c["n"], cb, qb, dp, one.ctypes.data, a_ptr, ctype_id, dp,
                              qbuf.data.ptr, ctype_id, dp, zero.ctypes.data, tile.data.ptr, ctype_id, cb,
                              compute, c["algo"])
                sel((-(-n // _TS_WARPS), splits), (_TS_WARPS * 32,),
                    (tile, np.int32(cb), np.int32(n), np.int32(r), np.int32(c0), np.int32(split_cols), qa, xaux,
                     np.int32(k), pv, pi), shared_mem=smem)
            total = n * splits * k
            merge((int(min(-(-total // _THREADS), 65535)),), (_THREADS,),
                  (pv, pi, np.int32(n), np.int32(splits), np.int32(k), dist[s:s + n], idx[s:s + n]))
    finally:
        if mode_saved:
            cublas.setMathMode(handle, mode_saved)
        if pointer_saved:
            cublas.setPointerMode(handle, pointer_saved)
        if atomics_saved:
            cublas.setAtomicsMode(handle, atomics_saved)


def _inputs(Q, X, metric, p, kernel):
    """``(Q, X)`` C-contiguous on the device in one float dtype (that of ``X``, float64 for other
    dtypes), after the checks both kernels share: a known metric, matching columns, 32-bit row
    indices, a positive minkowski power."""
    import cupy

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {sorted(METRICS)})")
    X = cupy.ascontiguousarray(X)
    if X.dtype not in (np.float32, np.float64):
        X = X.astype(np.float64)
    Q = cupy.ascontiguousarray(Q, dtype=X.dtype)
    if X.shape[1] != Q.shape[1]:
        raise ValueError(f"Q has {Q.shape[1]} columns, X has {X.shape[1]}")
    if X.shape[0] >= 2 ** 31 - 1 or Q.shape[0] >= 2 ** 31 - 1:
        raise ValueError(f"the {kernel} kernel indexes rows with 32-bit integers")
    if metric == "minkowski" and (p is None or not p > 0):
        raise ValueError(f"minkowski needs a power p > 0, got {p!r}")
    return Q, X


def topk(Q, X, k, *, metric="sqeuclidean", p=None, route="auto"):
    """``(distances, indices)`` of the ``k`` nearest rows of ``X`` for every row of ``Q`` (CuPy).

    Indices are rows of ``X`` (int64), ordered by (distance, row): ties keep the lower row.
    ``metric``: ``"sqeuclidean"``, ``"euclidean"`` (selected and reported in the GEMM form
    ``max(|q|² + |x|² - 2 q.x, 0)``, its square root for euclidean), ``"cosine"``,
    ``"inner_product"`` (``-q.x``), ``"manhattan"``, ``"chebyshev"``, ``"minkowski"`` (power
    ``p``).  ``Q`` and ``X`` are float32 or float64 (``Q`` is cast to the dtype of ``X``).

    ``route``: ``"auto"`` (:func:`gemm_plan` decides), ``"fused"`` (the fused kernel) or ``"gemm"``
    (the GEMM route, GEMM-form metrics only).  The GEMM route, taken by ``"auto"`` for the GEMM-form
    metrics at large ``d``: cuBLAS (FP32 without TF32, or FP64) computes the dot products of a batch
    of queries with a chunk of index rows into a tile in device memory, and ``mpiml_knn_tile_select``
    applies the epilogue and keeps each query's ``k`` best behind a ``k``-th threshold, across the
    chunks.  Results must not depend on how the index or the queries are split between ranks (or
    batches): the value that selects a pair has to be the same bits whichever tile computed it.
    cuBLAS picks its algorithm -- and with it the order in which the ``d`` products of a dot product
    are added -- from the GEMM's shape, leading dimensions and pointer alignment, so every GEMM here
    has one fixed shape (``queries x rows x dp`` of :func:`gemm_plan`, chosen from ``d`` and the
    dtype alone): the last query batch and the last index chunk are padded with zero rows to it,
    rows shorter than 16 bytes' multiples are padded with zero columns, and every operand starts on
    a 256-byte boundary (else it is staged in an aligned buffer).  Within one algorithm every output
    element sums its products the same way, so a pair's value does not depend on its place in the
    tile, on the other rows, or on the rank count.
    """
    import cupy

    Q, X = _inputs(Q, X, metric, p, "selection")
    nq, d = Q.shape
    m = X.shape[0]
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] (rows of X), got {k}")
    if k > MAX_K:
        raise ValueError(f"k = {k} is above the selection kernel's {MAX_K}")
    dtype = X.dtype
    dist = cupy.empty((nq, k), dtype=dtype)
    idx = cupy.empty((nq, k), dtype=cupy.int64)
    if nq == 0:
        return dist, idx
    mode = METRICS[metric]
    if route not in ("auto", "fused", "gemm"):
        raise ValueError(f"route must be 'auto', 'fused' or 'gemm', got {route!r}")
    if route == "gemm" and metric not in GEMM_METRICS:
        raise ValueError(f"the GEMM route serves {GEMM_METRICS}, not {metric!r}")
    gp = None
    if route == "gemm":
        gp = _gemm_shape(dtype, k, d)
    elif route == "auto":
        gp = gemm_plan(dtype, k, metric, d)
    if gp is not None:
        _gemm_topk(Q, X, k, mode, gp, dist, idx)
        if metric == "euclidean":
            cupy.sqrt(dist, out=dist)
        return dist, idx
    tm, ty, smem = _config(dtype, k)
    vec = d % (16 // dtype.itemsize) == 0 and X.data.ptr % 16 == 0 and Q.data.ptr % 16 == 0
    sel_expr = f"mpiml_knn_select<{_ctype(dtype)}, {mode}, {tm}, {ty}, {'true' if vec else 'false'}>"
    sel, merge, xaux, qaux = _route_kernels(sel_expr, Q, X, mode, smem, cupy)
    splits, split_rows = _splits(nq, m, k, tm * ty, _sms() * _resident(sel, smem))
    pw = dtype.type(p if metric == "minkowski" else 1.0)
    qt = tm * ty
    per_query = splits * k * (dtype.itemsize + 4)
    batch = max(qt, (_PARTIAL_BYTES // per_query) // qt * qt)
    for s in range(0, nq, batch):
        e = min(nq, s + batch)
        n = e - s
        pv = cupy.empty((n, splits, k), dtype=dtype)
        pi = cupy.empty((n, splits, k), dtype=cupy.int32)
        qs = Q[s:e]
        qa = qaux[s:e] if qaux.shape[0] == nq else qaux
        sel((-(-n // qt), splits), (_THREADS,),
            (qs, np.int32(n), np.int32(d), X, np.int32(m), qa, xaux, pw, np.int32(k), np.int32(split_rows), pv, pi),
            shared_mem=smem)
        total = n * splits * k
        blocks = int(min(-(-total // _THREADS), 65535))
        merge((blocks,), (_THREADS,), (pv, pi, np.int32(n), np.int32(splits), np.int32(k), dist[s:e], idx[s:e]))
    if metric == "euclidean":
        cupy.sqrt(dist, out=dist)
    return dist, idx


def within(Q, X, bound, *, metric="sqeuclidean", p=None):
    """Every pair (query, row of ``X``) whose value is at most ``bound``, without the distance matrix.

    Values as :func:`topk` selects them (``"euclidean"`` and ``"sqeuclidean"``: the squared GEMM
    form).  A count pass sizes the output, a fill pass writes it.  Returns ``(indptr, cols,
    vals)`` on the device: the pairs of query ``i`` are ``cols[indptr[i]:indptr[i + 1]]`` (int64
    rows of ``X``) in no particular order, with their values.
    """
    import cupy

    Q, X = _inputs(Q, X, metric, p, "radius")
    nq, d = Q.shape
    m = X.shape[0]
    dtype = X.dtype
    indptr = cupy.zeros(nq + 1, dtype=cupy.int64)
    if nq == 0 or m == 0:
        return indptr, cupy.empty(0, dtype=cupy.int64), cupy.empty(0, dtype=dtype)
    mode, ctype = METRICS[metric], _ctype(dtype)
    tm, ty = (4, 16) if dtype.itemsize == 4 else (2, 16)
    smem = _smem(dtype.itemsize, tm * ty, 0)
    vec = d % (16 // dtype.itemsize) == 0 and X.data.ptr % 16 == 0 and Q.data.ptr % 16 == 0
    flag = "true" if vec else "false"
    exprs = tuple(f"mpiml_knn_radius<{ctype}, {mode}, {tm}, {ty}, {flag}, {f}>" for f in ("false", "true"))
    norms_expr = f"mpiml_knn_norms<{ctype}, {min(mode, 1)}>"
    mod = _module(exprs + (norms_expr,))
    count, fill, norms = (mod.get_function(e) for e in exprs + (norms_expr,))
    for fn in (count, fill):
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
    splits, split_rows = _splits(nq, m, 1, tm * ty, _sms() * _resident(count, smem))
    xaux, qaux = _aux(X, mode, norms, cupy), _aux(Q, mode, norms, cupy)
    pw = dtype.type(p if metric == "minkowski" else 1.0)
    bound = dtype.type(bound)
    grid = (-(-nq // (tm * ty)), splits)
    counts = cupy.zeros(nq, dtype=cupy.uint64)
    null = cupy.empty(0, dtype=cupy.int64)
    args = (Q, np.int32(nq), np.int32(d), X, np.int32(m), qaux, xaux, pw, bound, np.int32(split_rows))
    count(grid, (_THREADS,), args + (counts, null, counts, null, cupy.empty(0, dtype=dtype)), shared_mem=smem)
    cupy.cumsum(counts.astype(cupy.int64), out=indptr[1:])
    total = int(indptr[-1])
    cols = cupy.empty(total, dtype=cupy.int64)
    vals = cupy.empty(total, dtype=dtype)
    if total:
        cursor = cupy.zeros(nq, dtype=cupy.uint64)
        fill(grid, (_THREADS,), args + (counts, indptr, cursor, cols, vals), shared_mem=smem)
    return indptr, cols, vals
