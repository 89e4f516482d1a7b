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

__all__ = ["METRICS", "MAX_K", "topk", "within", "exact_sq", "plan"]

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


def topk(Q, X, k, *, metric="sqeuclidean", p=None):
    """``(distances, indices)`` of the ``k`` nearest rows of ``X`` for every row of ``Q`` (CuPy).

    Indices are rows of ``X`` (int64), ordered by (distance, row): ties keep the lower row.
    ``metric``: ``"sqeuclidean"``, ``"euclidean"`` (selected and reported in the GEMM form
    ``max(|q|² + |x|² - 2 q.x, 0)``, its square root for euclidean), ``"cosine"``,
    ``"inner_product"`` (``-q.x``), ``"manhattan"``, ``"chebyshev"``, ``"minkowski"`` (power
    ``p``).  ``Q`` and ``X`` are float32 or float64 (``Q`` is cast to the dtype of ``X``).
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
    ctype = _ctype(dtype)
    tm, ty, smem = _config(dtype, k)
    vec = d % (16 // dtype.itemsize) == 0 and X.data.ptr % 16 == 0 and Q.data.ptr % 16 == 0
    sel_expr = f"mpiml_knn_select<{ctype}, {mode}, {tm}, {ty}, {'true' if vec else 'false'}>"
    merge_expr = f"mpiml_knn_merge<{ctype}>"
    norms_expr = f"mpiml_knn_norms<{ctype}, {min(mode, 1)}>"
    mod = _module((sel_expr, merge_expr, norms_expr))
    sel, merge, norms = (mod.get_function(e) for e in (sel_expr, merge_expr, norms_expr))
    if smem > 48 * 1024:
        sel.max_dynamic_shared_size_bytes = smem
    splits, split_rows = _splits(nq, m, k, tm * ty, _sms() * _resident(sel, smem))
    xaux = _aux(X, mode, norms, cupy)
    qaux = _aux(Q, mode, norms, cupy)
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
