"""Fused distance kernels (``distances.cu``) for CuPy arrays: arg-min, Lloyd step, pairwise, top-k.

Every distance-based estimator calls these.  The ``.cu`` source is read with
:mod:`importlib.resources` and compiled through ``cupy.RawModule(name_expressions=...)``
the first time one instantiation is needed; modules are memoized per device (CuPy's
disk cache keeps the binaries between runs).  Nothing compiles at import.

Inputs: CuPy arrays, float32 or float64 (``C``, weights and shifts are cast to the
dtype of ``X``), any strides (non-contiguous input is copied once), any ``d`` and
``k``; zero rows is allowed.  Ties go to the lower index, like scikit-learn.
"""

from importlib import resources

import numpy as np

__all__ = [
    "argmin_sqeuclidean",
    "lloyd_step",
    "lloyd_step_packed",
    "pairwise_distances",
    "topk",
    "kernel_plan",
]

_THREADS = 256
_METRICS = {"sqeuclidean": 0, "inner_product": 1, "cosine": 2, "euclidean": 3}

# Tile shapes, per dtype: (largest k it is meant for, (TM, TN, CG, DK, MINB)).
# A block of 256 threads covers BM = (256 / CG) * TM rows and BN = CG * TN columns; DK features
# are staged at a time (capped by d); MINB blocks per SM is the register budget asked for.
_CONFIGS = {
    np.dtype(np.float32): (
        (16, (4, 4, 4, 16, 2)),       # BM 256, BN 16
        (32, (4, 4, 8, 32, 2)),       # BM 128, BN 32
        (64, (8, 4, 16, 16, 2)),      # BM 128, BN 64
        (None, (8, 8, 16, 32, 1)),    # BM 128, BN 128
    ),
    np.dtype(np.float64): (
        (16, (2, 4, 4, 8, 2)),        # BM 128, BN 16
        (64, (4, 4, 16, 16, 2)),      # BM 64, BN 64
        (None, (4, 8, 16, 16, 1)),    # BM 64, BN 128
    ),
}
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_ACC_BUDGET_PAD = 2048            # shared memory bytes kept free per block (static arrays, reserve)
_NULL = np.uint64(0)              # a null pointer argument (8 bytes, like a device pointer)
# From this many centres on the dot products go through cuBLAS (GEMM + an arg-min epilogue) instead
# of the fused register tile (measured on an H200: k = 1024, d = 256 float32 19.3 ms vs 22.7 ms; at
# k = 64 the fused kernel wins at every d, 18.7 vs 37.7 ms at d = 1024)
_GEMM_FROM_K = 256
_GEMM_BLOCK_BYTES = 256 << 20     # bytes of one block of dot products on the GEMM path

_SOURCE = None
_MODULES = {}
_DEVICE = {}


def _cupy():
    import cupy

    return cupy


def _source():
    global _SOURCE
    if _SOURCE is None:
        _SOURCE = resources.files("mpiml.kernels").joinpath("distances.cu").read_text()
    return _SOURCE


def _function(expr):
    """The compiled kernel ``expr`` on the current device (compiled on first use)."""
    cupy = _cupy()
    key = (cupy.cuda.runtime.getDevice(), expr)
    fn = _MODULES.get(key)
    if fn is None:
        mod = cupy.RawModule(code=_source(), options=("--std=c++17",), name_expressions=[expr])
        fn = mod.get_function(expr)
        _MODULES[key] = fn
    return fn


def _device():
    """(SM count, shared memory per SM, per block opt-in) of the current device."""
    cupy = _cupy()
    dev = cupy.cuda.runtime.getDevice()
    info = _DEVICE.get(dev)
    if info is None:
        attrs = cupy.cuda.Device(dev).attributes
        info = (attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024),
                attrs.get("MaxSharedMemoryPerBlockOptin", 227 * 1024))
        _DEVICE[dev] = info
    return info


def _dtype(X):
    dt = np.dtype(X.dtype)
    if dt not in _CTYPE:
        raise TypeError(f"distance kernels take float32 or float64 arrays, got {dt}")
    return dt


def _tile(dtype, k, d):
    for kmax, cfg in _CONFIGS[dtype]:
        if kmax is None or k <= kmax:
            tm, tn, cg, dk, minb = cfg
            break
    # fewer staged features when d is small (zeros beyond d cost arithmetic)
    while dk > 8 and dk // 2 >= d:
        dk //= 2
    return tm, tn, cg, dk, minb


def _vec(dtype, d, *arrays):
    """Vector width of the global loads: 16 bytes when every row starts 16-byte aligned."""
    vw = 16 // dtype.itemsize
    if d % vw:
        return 1
    for a in arrays:
        if a is not None and a.data.ptr % 16:
            return 1
    return vw


def _expr(plan):
    if plan["mode"] in _METRICS:
        return (f"mpiml_distances_pairwise<{plan['ctype']}, {plan['TM']}, {plan['TN']}, {plan['CG']}, {plan['DK']}, "
                f"{plan['VW']}, {plan['MINB']}, {_METRICS[plan['mode']]}>")
    return (f"mpiml_distances_argmin<{plan['ctype']}, {plan['accum']}, {plan['TM']}, {plan['TN']}, {plan['CG']}, "
            f"{plan['DK']}, {plan['VW']}, {plan['MINB']}, {1 if plan['mode'] == 'lloyd' else 0}>")


def kernel_plan(dtype, k, d, *, mode="lloyd", accum=None, vw=None, tile=None):
    """What one launch would use: a dict with the kernel expression, tile, shared memory, copies.

    ``mode`` is ``"assign"``, ``"lloyd"`` or a metric name of :func:`pairwise_distances`.
    ``accum``: type of the block-private Lloyd sums (``"float"`` or ``"double"``; default the
    data's type: a block adds a few hundred rows per cell, then blocks are added in float64).
    ``tile``: ``(TM, TN, CG, DK, MINB)`` instead of the table's (benchmarks).
    """
    dtype = np.dtype(dtype)
    tm, tn, cg, dk, minb = tile if tile is not None else _tile(dtype, k, d)
    bm, bn = (_THREADS // cg) * tm, cg * tn
    if _THREADS % bm or cg > 32 or cg & (cg - 1):
        raise ValueError(f"tile {(tm, tn, cg, dk, minb)}: {bm} rows per tile must divide {_THREADS} threads "
                         f"and CG must be a power of two <= 32")
    ctype = _CTYPE[dtype]
    if vw is None:
        vw = 16 // dtype.itemsize if d % (16 // dtype.itemsize) == 0 else 1
    isz = dtype.itemsize
    staging = dk * (bm + bn) * isz
    plan = {"mode": mode, "ctype": ctype, "TM": tm, "TN": tn, "CG": cg, "DK": dk, "BM": bm, "BN": bn, "VW": vw,
            "MINB": minb}
    if mode in _METRICS:
        plan["smem"] = staging + _THREADS * isz
        plan["groups"] = 0
        plan["expr"] = _expr(plan)
        return plan
    accum = accum or ("float" if dtype == np.float32 else "double")
    asz = 8 if accum == "double" else 4
    base = 2 * staging + _THREADS * isz + bm * (isz + 4) + (k * asz if mode == "lloyd" else 0)
    groups = 0
    if mode == "lloyd":
        per_block = _smem_per_block(minb)
        cell_bytes = k * d * asz
        g = 1
        while g * 2 <= _THREADS and base + 2 * g * cell_bytes <= per_block and _THREADS // (2 * g) >= min(d, 32):
            g *= 2
        if base + g * cell_bytes <= per_block:
            groups = g
    plan["groups"] = groups
    plan["smem"] = base + groups * k * d * asz
    plan["accum"] = accum
    plan["expr"] = _expr(plan)
    return plan


def _smem_per_block(blocks_per_sm):
    """Shared memory one block may take so that ``blocks_per_sm`` blocks share an SM."""
    _, smem_sm, optin = _device() if _have_device() else (132, 228 * 1024, 227 * 1024)
    if blocks_per_sm > 1:
        return min(optin, smem_sm // blocks_per_sm - _ACC_BUDGET_PAD)
    return optin - _ACC_BUDGET_PAD


def _have_device():
    try:
        return _cupy().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _grid(fn, plan, n_tiles):
    """Blocks of a persistent launch: as many as are resident on every SM at once, at most one per tile."""
    sms, smem_sm, _ = _device()
    regs = max(1, (int(fn.num_regs) + 7) // 8 * 8)
    per_sm = max(1, min(65536 // (regs * _THREADS), smem_sm // (plan["smem"] + 1024), 8))
    return int(max(1, min(n_tiles, sms * per_sm)))


def _launch(fn, plan, grid, args):
    if plan["smem"] > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = plan["smem"]
    fn((grid,), (_THREADS,), args, shared_mem=plan["smem"])


def _prepare(X, C, *others):
    cupy = _cupy()
    if X.ndim != 2 or C.ndim != 2:
        raise ValueError(f"X and C must be 2-D, got {X.ndim}-D and {C.ndim}-D")
    dtype = _dtype(X)
    if X.shape[1] != C.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features but C has {C.shape[1]}")
    X = cupy.ascontiguousarray(X)
    C = cupy.ascontiguousarray(C, dtype=dtype)
    rest = [None if o is None else cupy.ascontiguousarray(o, dtype=dtype).ravel() for o in others]
    return (dtype, X, C, *rest)


def _method(method, k, d):
    if method not in ("auto", "fused", "gemm"):
        raise ValueError(f"method must be 'auto', 'fused' or 'gemm', got {method!r}")
    if method == "auto":
        return "gemm" if k >= _GEMM_FROM_K else "fused"
    return method


def _argmin_launch(X, C, shift, w, labels, mind, out, *, lloyd, accum=None, tile=None, method="auto"):
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    k = C.shape[0]
    plan = kernel_plan(dtype, k, d, mode="lloyd" if lloyd else "assign", accum=accum,
                       vw=_vec(dtype, d, X, C, shift), tile=tile)
    plan["method"] = method = _method(method, k, d)
    if n == 0:
        return plan
    if method == "gemm":
        _gemm_launch(X, C, shift, w, labels, mind, out, lloyd=lloyd, accum=plan["accum"] if lloyd else None)
        return plan
    fn = _function(plan["expr"])
    c_sq = (C * C).sum(axis=1)
    grid = _grid(fn, plan, (n + plan["BM"] - 1) // plan["BM"])
    S = k * d if plan["groups"] else 0
    P = S + k + 2
    part = cupy.empty(grid * P if lloyd else 1, dtype=cupy.float64)
    _launch(fn, plan, grid,
            (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, C, c_sq, np.int32(k),
             _NULL if w is None else w, labels, mind, out, part, np.int32(plan["groups"])))
    if lloyd:
        red = _function("mpiml_distances_reduce_partials")
        blocks = int(min(1024, (P + 255) // 256))
        red((blocks,), (256,), (part, np.int32(grid), np.int64(P), out[k * d - S:]))
        if not plan["groups"]:
            _label_sums(X, shift, w, labels, k, out, plan["accum"])
    plan["grid"] = grid
    return plan


def _gemm_launch(X, C, shift, w, labels, mind, out, *, lloyd, accum):
    """Dot products by cuBLAS in row blocks, the arg-min epilogue kernel, then (Lloyd) the sums pass."""
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    k = C.shape[0]
    c_sq = (C * C).sum(axis=1)
    old = labels.copy() if lloyd else None
    fn = _function(f"mpiml_distances_argmin_gemm<{_CTYPE[dtype]}>")
    sms = _device()[0]
    step = int(max(1, min(n, _GEMM_BLOCK_BYTES // (k * dtype.itemsize))))
    for s in range(0, n, step):
        e = min(n, s + step)
        Xs = X[s:e] - shift if shift is not None else X[s:e]
        G = Xs @ C.T
        x_sq = (Xs * Xs).sum(axis=1)
        grid = int(min(sms * 8, (e - s + 7) // 8))
        fn((grid,), (_THREADS,), (G, np.int64(e - s), np.int32(k), c_sq, x_sq, labels[s:e], mind[s:e]))
    if lloyd:
        w64 = w.astype(cupy.float64)
        out[k * d:k * d + k] += cupy.bincount(labels, weights=w64, minlength=k)
        out[-2] += w64 @ mind.astype(cupy.float64)
        out[-1] += cupy.count_nonzero(old != labels)
        _label_sums(X, shift, w, labels, k, out, accum)


def _label_sums(X, shift, w, labels, k, out, accum):
    """The per-cluster sums by a second pass over ``X`` (column slabs of 32, label ranges that fit)."""
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    sms, smem_sm, optin = _device()
    budget = optin - _ACC_BUDGET_PAD
    asz = 8 if accum == "double" else 4
    # label ranges of kc clusters per pass: a large k takes several passes, never a narrower accumulator
    # (float64 data summed in float32 drifted by 3e-8 relative at k = 1024, seen on an H200)
    kc = min(k, budget // (32 * asz))
    copies = int(max(1, min(_THREADS // 32, budget // (kc * 32 * asz))))
    smem = copies * kc * 32 * asz
    fn = _function(f"mpiml_distances_label_sums<{_CTYPE[dtype]}, {accum}>")
    if smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = smem
    n_cc = (d + 31) // 32
    per_sm = max(1, min(8, smem_sm // (smem + 1024)))
    splits = max(1, min((n + 255) // 256, -(-sms * per_sm // n_cc)))
    rows = -(-n // splits)
    for k0 in range(0, k, kc):
        fn((n_cc * splits,), (_THREADS,),
           (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, labels, w, np.int32(k0),
            np.int32(min(kc, k - k0)), np.int32(copies), np.int64(rows), out), shared_mem=smem)


def argmin_sqeuclidean(X, C, *, shift=None, tile=None, method="auto"):
    """Nearest row of ``C`` for every row of ``X`` under squared Euclidean distance.

    Parameters
    ----------
    X : cupy.ndarray of shape (n, d), float32 or float64
    C : cupy.ndarray of shape (k, d)
        Cast to the dtype of ``X``.
    shift : cupy.ndarray of shape (d,), default=None
        Subtracted from every row of ``X`` (``C`` is then given in shifted coordinates).
    tile : tuple, default=None
        A tile shape to try instead of the table's (see :func:`kernel_plan`).
    method : {"auto", "fused", "gemm"}, default="auto"
        ``"fused"``: one register-tiled kernel; ``"gemm"``: cuBLAS products in row blocks and an
        arg-min epilogue kernel; ``"auto"``: ``"gemm"`` from ``k >= 256`` on.

    Returns
    -------
    labels : cupy.ndarray of shape (n,), int32
        Index of the nearest row of ``C`` (the lower index on exact ties).
    distances : cupy.ndarray of shape (n,)
        Squared distance to it (dtype of ``X``, clamped at 0).
    """
    cupy = _cupy()
    dtype, X, C, shift = _prepare(X, C, shift)
    n = X.shape[0]
    labels = cupy.empty(n, dtype=cupy.int32)
    mind = cupy.empty(n, dtype=dtype)
    dummy = cupy.zeros(1, dtype=cupy.float64)
    _argmin_launch(X, C, shift, None, labels, mind, dummy, lloyd=False, tile=tile, method=method)
    return labels, mind


def lloyd_step_packed(X, C, sample_weight=None, *, shift=None, labels=None, mind=None, accum=None, tile=None,
                      method="auto"):
    """One local Lloyd step, packed for one allreduce.

    Returns a float64 vector ``[sums (k*d, shifted coordinates) | weight per cluster (k) |
    inertia | changed labels]``.  ``labels`` (int32, previous labels on entry, ``-1`` for none)
    and ``mind`` are overwritten in place when given.  ``accum`` (``"double"`` or ``"float"``) is
    the type of the block-private sums, ``tile`` a tile shape to try (see :func:`kernel_plan`),
    ``method`` as in :func:`argmin_sqeuclidean`.
    """
    cupy = _cupy()
    dtype, X, C, shift, w = _prepare(X, C, shift, sample_weight)
    n, d = X.shape
    k = C.shape[0]
    if w is None:
        w = cupy.ones(n, dtype=dtype)
    if labels is None:
        labels = cupy.full(n, -1, dtype=cupy.int32)
    if mind is None:
        mind = cupy.empty(n, dtype=dtype)
    out = cupy.zeros(k * d + k + 2, dtype=cupy.float64)
    _argmin_launch(X, C, shift, w, labels, mind, out, lloyd=True, accum=accum, tile=tile, method=method)
    return out


def lloyd_step(X, C, sample_weight=None, *, shift=None, accum=None, method="auto"):
    """One local Lloyd step: ``(sums, counts, inertia, labels)``.

    ``sums`` (k, d) float64 are the weighted sums of the rows nearest each centre (in shifted
    coordinates when ``shift`` is given), ``counts`` (k,) float64 their weights, ``inertia`` the
    weighted sum of squared distances (a float), ``labels`` (n,) int32.
    """
    cupy = _cupy()
    n = X.shape[0]
    k, d = C.shape
    labels = cupy.full(n, -1, dtype=cupy.int32)
    packed = lloyd_step_packed(X, C, sample_weight, shift=shift, labels=labels, accum=accum, method=method)
    return packed[:k * d].reshape(k, d), packed[k * d:k * d + k], float(packed[-2]), labels


def pairwise_distances(X, Y, *, metric="sqeuclidean", shift=None, y_shifted=False, out=None):
    """Distances of every row of ``X`` to every row of ``Y``: an (n, m) array of the dtype of ``X``.

    ``metric``: ``"sqeuclidean"``, ``"euclidean"``, ``"inner_product"`` (``-x.y``, smaller is
    nearer) or ``"cosine"`` (``1 - x.y / (|x| |y|)``, 1 for a zero row).  ``shift`` is subtracted
    from the rows of both (Euclidean metrics only); with ``y_shifted`` only from those of ``X``
    (``Y`` is already in shifted coordinates).
    """
    cupy = _cupy()
    if metric not in _METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {sorted(_METRICS)})")
    dtype, X, Y, shift = _prepare(X, Y, shift)
    if shift is not None and metric in ("inner_product", "cosine"):
        raise ValueError(f"shift applies to Euclidean metrics, not {metric!r}")
    n, d = X.shape
    m = Y.shape[0]
    if out is None:
        out = cupy.empty((n, m), dtype=dtype)
    if n == 0 or m == 0:
        return out
    if metric in ("sqeuclidean", "euclidean"):
        Ys = Y - shift if shift is not None and not y_shifted else Y
        y_aux = (Ys * Ys).sum(axis=1)
    elif metric == "cosine":
        nrm = cupy.sqrt((Y * Y).sum(axis=1))
        y_aux = cupy.where(nrm > 0, 1 / cupy.where(nrm > 0, nrm, 1), 0).astype(dtype)
    else:
        y_aux = cupy.zeros(1, dtype=dtype)
    plan = kernel_plan(dtype, m, d, mode=metric, vw=_vec(dtype, d, X, Y, shift))
    fn = _function(plan["expr"])
    n_tiles = ((n + plan["BM"] - 1) // plan["BM"]) * ((m + plan["BN"] - 1) // plan["BN"])
    y_shift = _NULL if shift is None or y_shifted else shift
    _launch(fn, plan, _grid(fn, plan, n_tiles),
            (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, Y, np.int64(m), y_shift, y_aux, out))
    return out


def topk(Q, X, k, *, metric="sqeuclidean", block_bytes=256 << 20):
    """The ``k`` nearest rows of ``X`` for every row of ``Q``: ``(distances, indices)``.

    Indices are local to ``X`` (int64), sorted by distance, ties broken by the lower index
    (like scikit-learn's brute force).  ``metric`` as in :func:`pairwise_distances`; for
    ``"inner_product"`` the distance is ``-q.x`` (the largest products come first).
    Queries are processed in blocks whose distance matrix stays under ``block_bytes``.
    """
    cupy = _cupy()
    m = X.shape[0]
    if not 1 <= k <= m:
        raise ValueError(f"k must be in [1, {m}] (rows of X), got {k}")
    dtype = _dtype(Q)
    nq = Q.shape[0]
    dist = cupy.empty((nq, k), dtype=dtype)
    idx = cupy.empty((nq, k), dtype=cupy.int64)
    step = max(1, int(block_bytes // max(1, m * dtype.itemsize)))
    for s in range(0, nq, step):
        D = pairwise_distances(Q[s:s + step], X, metric=metric)
        order = cupy.argsort(D, axis=1)[:, :k]        # CuPy's sort is stable: equal distances keep index order
        idx[s:s + step] = order
        dist[s:s + step] = cupy.take_along_axis(D, order, axis=1)
    return dist, idx
