"""Fused distance kernels (``distances.cu``) for CuPy arrays: arg-min, Lloyd step and update, pairwise, top-k.

Every distance-based estimator calls these.  An instantiation is loaded through
:mod:`mpiml.kernels._loader` (a shipped cubin, this machine's cache, else NVRTC once)
the first time it is needed; kernels are memoized per device.  Nothing compiles at import.

Inputs: CuPy arrays, float32 or float64 (``C``, weights and shifts are cast to the
dtype of ``X``), any strides (non-contiguous input is copied once), any ``d`` and
``k``; zero rows is allowed.  Ties go to the lower index, like scikit-learn.
"""

import functools
import os
import threading

import numpy as np

__all__ = [
    "argmin_sqeuclidean",
    "lloyd_step",
    "lloyd_step_packed",
    "lloyd_update",
    "pairwise_distances",
    "topk",
    "kernel_plan",
    "tc_plan",
    "small_plan",
    "tc_supported",
    "pack_centres",
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

# Tensor-core kernels (distances_tc.cu), per dtype: (WMT m-tiles per warp, largest DK).  A block of 8
# warps takes BM = 8 * WMT * MT rows (MT = 16 rows per float32 m-tile, 8 per float64 m-tile).
_TC_CONFIGS = {np.dtype(np.float32): (2, 64), np.dtype(np.float64): (2, 64)}
_TC_FUSED_MAX_K = 64              # the one-hot fused sums keep k x 8 features per warp in registers
_TC_ACCUM = "pass"                # how the Lloyd sums are made from k = 17 on by default (see tc_plan)
# k and d both at most this may go to the whole-rows-in-registers kernel (mpiml_distances_small, method
# "small"; 0: never): see _method for where it is the default and the measurements
_SMALL_MAX = 32
# centres and their norms of at most this many bytes go in the small kernel's parameters (the classic 4 KB
# limit of a launch's parameters, less the other arguments)
_SMALL_PARAM_BYTES = 3968
# its tiles in shared memory (in flight + 1) and rows a thread (see small_plan).  Measured on an H200, Lloyd
# step at 10^7 rows (small_kernel_h200_2026-11-24{,b}.json in benchmarks/HISTORY.md): two tiles everywhere (three:
# 0.64 vs 0.49 ms float32 d = k = 16, 1.15 vs 0.85 float64); float32 rows of 16 features or fewer two rows a
# thread (0.490 vs 0.509 ms at d = k = 16 with the centres as parameters; 1.141 vs 1.386 at d = k = 32 from
# shared memory), wider rows with the centres as parameters one (0.840 vs 1.033 at d 32, k 16); float64 one
# (1.04 vs 0.85 ms at d = k = 16)
_SMALL_STAGES = {np.dtype(np.float32): 2, np.dtype(np.float64): 2}
# float32 small shapes whose padded centres x features (KP x DQ, DQ = 8, 16 or 32) are at most this many go to
# the small kernel's tensor-core form (mpiml_distances_small_tc; 0: never): see small_plan
_SMALL_TC_CELLS = 256
_TC_SUMS_ROWS = 128               # rows per tile of the one-hot sums pass
_TC_SUMS = "simt"                 # the sums pass of the tensor-core path by default (see sums_plan)
_TOTALS_ROWS = 16384              # rows a block of mpiml_distances_step_totals (<= 64 weights a cell)
# (tiles in flight, rows a warp of a tile) of mpiml_distances_sums_simt by (float32 copies, blocks an SM): two
# tiles of 160 rows beat three of 64 (2.22 vs 2.66 ms at 2e6 x 1024, 0.73 vs 0.87 at 1e7 x 64, k = 64, on an
# H200: fewer barriers and flush checks a row; lloyd_variants_h200_2026-11-24_sums_tiles*.json); 160 is the
# most that leaves two blocks an SM room for k = 64; the first that fits k is taken
_SUMS_TILES = {(True, 2): ((2, 20), (2, 16), (3, 8)), (True, 1): ((3, 8),), (False, 1): ((4, None),),
               (False, 2): ((2, None),)}
_TC_STAGES = 2                    # buffers of the copies of X (the copies run STAGES - 1 steps ahead)
_METHODS = ("auto", "fused", "gemm", "tc", "small")

_MODULES = {}
_DEVICE = {}


def _cupy():
    import cupy

    return cupy


def _function(expr, source=None):
    """The compiled kernel ``expr`` on the current device (compiled on first use).

    ``source``: the ``.cu`` file; by default ``distances_tc.cu`` for the tensor-core kernels,
    ``distances.cu`` for the others.
    """
    cupy = _cupy()
    if source is None:
        source = "distances_tc.cu" if expr.startswith(("mpiml_distances_tc", "mpiml_distances_sums_tc",
                                                        "mpiml_distances_sums_simt", "mpiml_distances_small",
                                                        "mpiml_distances_step_totals",
                                                        "mpiml_tc_", "mpiml_small_")) else "distances.cu"
    key = (cupy.cuda.runtime.getDevice(), expr)
    entry = _MODULES.get(key)
    if entry is None:
        from ._loader import load_module

        # MPIML_KERNEL_LINEINFO=1: source lines in the binaries, for Nsight Compute's source view
        opts = ("--std=c++17",) + (("-lineinfo",) if os.environ.get("MPIML_KERNEL_LINEINFO") == "1" else ())
        # a form that reads its constant bank gets a module of its own (the bank is one per module); any
        # other compiles with the small kernels of its source that the same call launches next
        bank = expr.startswith("mpiml_distances_small<") and expr.endswith(", true>")
        ct = "double" if "<double" in expr else "float"
        also = () if bank else (
            (f"mpiml_distances_step_totals<{ct}>", f"mpiml_small_bank_pack<{ct}>") if source == "distances_tc.cu"
            else ("mpiml_distances_reduce_partials", f"mpiml_lloyd_update<{ct}>"))
        if expr.startswith("mpiml_distances_tc<"):         # <T, WMT, BN, DK, ...>: its centres' packing kernel
            t, _, bn, dk = expr[len("mpiml_distances_tc<"):].split(", ")[:4]
            also += (f"mpiml_tc_pack<{t}, {bn}, {dk}>",)
        mod = load_module((source,), [expr], opts, also=also)
        entry = _MODULES[key] = (mod.get_function(expr), mod)
    return entry[0]


def _device():
    """(SM count, shared memory per SM, per block opt-in, compute capability) of the current device."""
    cupy = _cupy()
    dev = cupy.cuda.runtime.getDevice()
    info = _DEVICE.get(dev)
    if info is None:
        d = cupy.cuda.Device(dev)
        attrs = d.attributes
        info = (attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024),
                attrs.get("MaxSharedMemoryPerBlockOptin", 227 * 1024), int(d.compute_capability))
        _DEVICE[dev] = info
    return info


def _memo_plan(fn):
    """Memoize a plan per (arguments, device), returning a copy (callers add keys to it): a Lloyd step asks for
    its plans every iteration, and the Python of them (100-600 us, more than a step at 10^7 x 16) ran while
    the GPU waited for its first launch."""
    cache = {}

    @functools.wraps(fn)
    def plan(*args, **kwargs):
        try:
            key = (args, tuple(sorted(kwargs.items())), _device() if _have_device() else None)
            hit = cache.get(key)
        except TypeError:                    # an unhashable argument (a tile given as a list)
            return fn(*args, **kwargs)
        if hit is None:
            hit = cache[key] = fn(*args, **kwargs)
        return dict(hit)
    return plan


def tc_supported():
    """True when the current device has the matrix units of the tensor-core kernels (sm_80 or later:
    TF32 ``mma.sync``, float64 DMMA, ``cp.async``)."""
    return _have_device() and _device()[3] >= 80


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


@_memo_plan
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
    _, smem_sm, optin, _ = _device() if _have_device() else (132, 228 * 1024, 227 * 1024, 90)
    if blocks_per_sm > 1:
        return min(optin, smem_sm // blocks_per_sm - _ACC_BUDGET_PAD)
    return optin - _ACC_BUDGET_PAD


_ONES = {}


def _unit_weights(n, dtype):
    """``n`` unit weights for the kernels that read a weight a row: a view of one vector of ones kept per
    device and dtype (grown as needed), not a fill of ``n`` values every step."""
    cupy = _cupy()
    key = (cupy.cuda.runtime.getDevice(), np.dtype(dtype).str)
    ones = _ONES.get(key)
    if ones is None or ones.size < n:
        ones = _ONES[key] = cupy.ones(max(n, 1), dtype=dtype)
    return ones[:n]


def _step_buffers(n, dtype, w, mind, *, lloyd, reads_w=True, writes_mind=True):
    """``(w, mind)`` of a launch: unit weights where a Lloyd kernel reads a weight a row and none were given,
    a distance buffer where the kernel writes one and none was given."""
    if lloyd and reads_w and w is None:
        w = _unit_weights(n, dtype)
    if writes_mind and mind is None:
        mind = _cupy().empty(n, dtype=dtype)
    return w, mind


@functools.lru_cache(maxsize=1)
def _have_device():
    try:
        return _cupy().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _grid(fn, plan, n_tiles):
    """Blocks of a persistent launch: as many as are resident on every SM at once, at most one per tile."""
    sms, smem_sm, _, _ = _device()
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
    # C, weights and shifts may come from the host (NumPy); host centres stay there until a launcher needs
    # them on the device (the small kernel takes them as parameters: no copy, no wait)
    C = np.ascontiguousarray(C, dtype=dtype) if isinstance(C, np.ndarray) else cupy.ascontiguousarray(C, dtype=dtype)
    rest = [None if o is None else cupy.ascontiguousarray(cupy.asarray(o, dtype=dtype)).ravel() for o in others]
    return (dtype, X, C, *rest)


def _method(method, k, d, dtype=np.float32, lloyd=True):
    """The kernel family of a launch.  ``"auto"``, where the device has the tensor-core kernels
    (compute capability 8.0 or later): ``"tc"``, except float64 from k = 256 on, which goes through
    cuBLAS (``"gemm"``: DGEMM on the FP64 tensor cores beats DMMA ``mma.sync`` there).  Measured on an
    H200 at 10^6 x 256, k = 1024: float32 Lloyd step tc 14.2 ms vs gemm 19.4 ms
    (``lloyd_variants_h200_2026-11-24_k1024.json``, benchmarks/HISTORY.md), float64 gemm 21.7 vs tc 37.2 ms.
    ``"small"`` (whole rows in registers) for k, d <= 32 where it beats the tensor-core kernel: float32
    Lloyd steps, float32 arg-mins of k x d <= 512, and float64 where the centres fit the kernel's parameters
    (k x d up to 16 x 16 or 32 x 8).  Measured at 10^7 rows, centres from the host as KMeans passes them
    (``small_kernel_h200_2026-11-24b.json``, benchmarks/HISTORY.md), small vs tc, ms: float32 Lloyd 0.49 vs 0.67
    (d = k = 16), 1.15 vs 1.51 (32, 32), 0.39 vs 0.64 (8, 8), 0.84 vs 1.24 (d 32, k 16), 0.41 vs 0.79
    (d 3, k 5); float32 arg-min 0.24 vs 0.33 (16, 16) but 0.74 vs 0.70 (32, 32); float64 Lloyd 0.85 vs 0.95
    (16, 16), 0.62 vs 0.76 (8, 8), 0.64 vs 0.85 (3, 5); from shared memory (k x d too large for the
    parameters) float64 is within 4 % of tc (1.69 vs 1.75 at d 32, k 16; 2.21 vs 2.25 at 32, 32).
    Without them the SIMT register tile (``"fused"``, ``"gemm"`` from k = 256).  The environment
    variable ``MPIML_DISTANCES_METHOD`` overrides ``"auto"`` (benchmarks, tests)."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, got {method!r}")
    if method == "auto":
        forced = os.environ.get("MPIML_DISTANCES_METHOD", "auto")
        if forced not in _METHODS:
            raise ValueError(f"MPIML_DISTANCES_METHOD must be one of {_METHODS}, got {forced!r}")
        method = forced
    if method == "auto":
        if tc_supported():
            if k <= _SMALL_MAX and d <= _SMALL_MAX and (
                    _small_param_fits(dtype, k, d) if np.dtype(dtype) == np.float64 else lloyd or k * d <= 512):
                return "small"
            if k >= _GEMM_FROM_K and np.dtype(dtype) == np.float64:
                return "gemm"
            return "tc"
        if k >= _GEMM_FROM_K and (lloyd or np.dtype(dtype) == np.float64):
            return "gemm"
        return "fused"
    if method in ("tc", "small") and not tc_supported():
        raise ValueError(f"method={method!r} needs a GPU of compute capability 8.0 or later")
    if method == "small" and not (k <= _SMALL_MAX and d <= _SMALL_MAX):
        raise ValueError(f"method='small' takes k and d up to {_SMALL_MAX}, got k={k}, d={d}")
    return method


def _argmin_launch(X, C, shift, w, labels, mind, out, *, lloyd, accum=None, tile=None, method="auto"):
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    k = C.shape[0]
    method = _method(method, k, d, dtype, lloyd)
    if method != "small":                # (the small kernel's launcher sees which of its forms needs these)
        if isinstance(C, np.ndarray):
            C = cupy.asarray(C)
        w, mind = _step_buffers(n, dtype, w, mind, lloyd=lloyd)
    if method == "tc":
        return _tc_launch(X, C, shift, w, labels, mind, out, lloyd=lloyd, tile=tile)
    if method == "small":
        # tile: the number of stages, or (stages, rows a thread[, centres as parameters[, tensor-core form]])
        st, r, pc, tc = ((tile, None, None, None) if isinstance(tile, (int, np.integer))
                         else (tuple(tile) + (None,) * 4)[:4] if tile else (None,) * 4)
        return _small_launch(X, C, shift, w, labels, mind, out, lloyd=lloyd, stages=st, rows=r, param_centres=pc,
                             tc=tc)
    plan = kernel_plan(dtype, k, d, mode="lloyd" if lloyd else "assign", accum=accum,
                       vw=_vec(dtype, d, X, C, shift), tile=tile)
    plan["method"] = method
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
        _reduce_partials(part, grid, P, out[k * d - S:])
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


def _reduce_partials(part, nblocks, P, out):
    """``out[:P] += `` the ``nblocks`` rows of ``P`` float64 partials in ``part``, added in a fixed order
    (``mpiml_distances_reduce_partials``: the same bits on every run; 32 columns a block)."""
    red = _function("mpiml_distances_reduce_partials")
    red((int(min(4096, _cdiv(P, 32))),), (256,), (part, np.int32(nblocks), np.int64(P), out))


def _step_totals(fresh, labels, w, mind, k, out, dtype, rows=_TOTALS_ROWS):
    """``out[:k + 2] +=`` the weights per cluster, inertia and changed labels of a Lloyd step from the arg-min
    kernel's labels ``fresh`` and distances ``mind``; ``labels`` (the previous ones) take ``fresh``
    (``mpiml_distances_step_totals``: ``rows`` rows a block, partials added in block order; ``w`` of
    ``dtype``, or None for unit weights)."""
    cupy = _cupy()
    n = labels.shape[0]
    blocks = max(1, _cdiv(n, rows))
    fn = _function(f"mpiml_distances_step_totals<{_CTYPE[np.dtype(dtype)]}>")
    part = cupy.empty(blocks * (k + 2), dtype=cupy.float64)
    _launch(fn, {"smem": max(k * _THREADS * np.dtype(dtype).itemsize, 2048)}, blocks,
            (fresh, labels, _NULL if w is None else w, mind, np.int64(n), np.int32(k), np.int32(rows), part))
    _reduce_partials(part, blocks, k + 2, out)


def _label_sums(X, shift, w, labels, k, out, accum):
    """The per-cluster sums by a second pass over ``X`` (column slabs of 32, label ranges that fit)."""
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    sms, smem_sm, optin, _ = _device()
    budget = optin - _ACC_BUDGET_PAD
    asz = 8 if accum == "double" else 4
    # label ranges of kc clusters per pass: a large k takes several passes, never a narrower accumulator
    # (float64 data summed in float32 drifted by 3e-8 relative at k = 1024, seen on an H200)
    kc = min(k, budget // (32 * asz))
    copies = int(max(1, min(_THREADS // 32, budget // (kc * 32 * asz))))
    smem = copies * kc * 32 * asz
    fn = _function(f"mpiml_distances_label_sums<{_CTYPE[dtype]}, {accum}>")
    n_cc = (d + 31) // 32
    per_sm = max(1, min(8, smem_sm // (smem + 1024)))
    splits = _wave_splits(n_cc, sms * per_sm, (n + 255) // 256)
    rows = -(-n // splits)
    for k0 in range(0, k, kc):
        _launch(fn, {"smem": smem}, n_cc * splits,
                (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, labels, w, np.int32(k0),
                 np.int32(min(kc, k - k0)), np.int32(copies), np.int64(rows), out))


# ---------------------------------------------------------------------- tensor-core kernels
def _cdiv(a, b):
    return -(-int(a) // int(b))


def _tf32(x, xp):
    """TF32 part of float32 ``x`` (round to nearest, ties away; low 13 bits zero): the bits of
    ``mpiml_tf32`` in ``distances_tc.cu``."""
    b = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    return ((b + xp.uint32(0x1000)) & xp.uint32(0xFFFFE000)).view(xp.float32)


def pack_centres(C, bn, dk, xp=None):
    """The centres in the fragment order of ``mpiml_distances_tc`` (flat, zero-padded).

    Shape ``(nJ, nF, dk / 8, bn / 8, 32, FV)`` for centre chunks of ``bn`` and feature slabs of
    ``dk``: lane ``4g + t`` of n-tile ``nt`` of 8-feature group ``q`` holds, for centre
    ``j = jc * bn + nt * 8 + g`` and features ``f = fc * dk + q * 8 + ...``:
    float32 ``[big(C[j, 2t]), big(C[j, 2t+1]), small(C[j, 2t]), small(C[j, 2t+1])]`` (3xTF32 split),
    float64 ``[C[j, t], C[j, 4 + t]]``.  Works on NumPy or CuPy arrays.
    """
    if xp is None:
        xp = np if isinstance(C, np.ndarray) else _cupy()
    k, d = C.shape
    nJ, nF = -(-k // bn), -(-d // dk)
    Cp = xp.zeros((nJ * bn, nF * dk), dtype=C.dtype)
    Cp[:k, :d] = C
    kg, ntn = dk // 8, bn // 8
    jc = xp.arange(nJ).reshape(nJ, 1, 1, 1, 1, 1)
    fc = xp.arange(nF).reshape(1, nF, 1, 1, 1, 1)
    q = xp.arange(kg).reshape(1, 1, kg, 1, 1, 1)
    nt = xp.arange(ntn).reshape(1, 1, 1, ntn, 1, 1)
    g = xp.arange(8).reshape(1, 1, 1, 1, 8, 1)
    t = xp.arange(4).reshape(1, 1, 1, 1, 1, 4)
    j = jc * bn + nt * 8 + g
    f = fc * dk + q * 8
    if np.dtype(C.dtype) == np.float32:
        v0, v1 = Cp[j, f + 2 * t], Cp[j, f + 2 * t + 1]
        b0, b1 = _tf32(v0, xp), _tf32(v1, xp)
        s0, s1 = _tf32(v0 - b0, xp), _tf32(v1 - b1, xp)
        out = xp.stack([b0, b1, s0, s1], axis=-1)
    else:
        out = xp.stack([Cp[j, f + t], Cp[j, f + 4 + t]], axis=-1)
    return xp.ascontiguousarray(out.reshape(nJ, nF, kg, ntn, 32, -1)).ravel()


@_memo_plan
def tc_plan(dtype, k, d, *, mode="lloyd", vw=None, tile=None, accum=None):
    """What one tensor-core launch would use: tile, shared memory, fusion of the sums, kernel name.

    ``tile``: ``(WMT, BN, DK[, MINB[, STAGES]])`` instead of the defaults (benchmarks).  ``accum``: how the
    Lloyd sums are made, ``"mma"`` (fused: one-hot products on the tensor cores; the default for k <= 16),
    ``"smem"`` (fused: block-private copies in shared memory) or ``"pass"`` (a sums pass after the
    kernel, see :func:`sums_plan`; the default from k = 17 on).
    """
    dtype = np.dtype(dtype)
    isz = dtype.itemsize
    f32 = dtype == np.float32
    mt = 16 if f32 else 8
    pad = 8 if f32 else 4
    wmt, dk_max = _TC_CONFIGS[dtype]
    bn = 16 if k <= 16 else 32 if k <= 32 else 64
    # features of a slab: d rounded up to 16, 32 or 64, and 32 for wider rows, except float32 with several centre
    # chunks (k > 64), where a slab of 64 halves the passes over the centres (10^6 x 256, k = 1024: arg-min
    # 10.8 vs 12.1 ms; at 2 10^6 x 1024, k = 64 a slab of 32 is faster: 6.0 vs 6.7 ms)
    dk = 16 if d <= 16 else 32 if d <= 32 else 64 if d <= 64 or (f32 and k > 64) else 32
    dk = min(dk, dk_max)
    # one-hot products where k is small (measured faster at k = 16: 0.69 vs 0.74 ms float32, 1.00 vs 1.04 ms
    # float64 at 10^7 x 16), above that the SIMT sums pass after a lean kernel (10^7 x 64, k = 64: 3.26 vs 3.54 ms
    # float32, 5.55 vs 6.37 ms float64 against the fused copies; lloyd_variants_h200_2026-11-24_final.json)
    accum = accum or ("mma" if k <= 16 else _TC_ACCUM)
    if tile is None and bn == 16:
        # k <= 16: four m-tiles a warp (10^7 x 16 float64: assign 0.46 vs 0.55 ms, Lloyd 0.96 vs 1.00; float32:
        # assign 0.32 vs 0.36, Lloyd 0.67 vs 0.70; lloyd_variants_h200_2026-11-24_stages.json)
        wmt = 4
    if accum not in ("smem", "mma", "pass"):
        raise ValueError(f"accum must be 'smem', 'mma' or 'pass', got {accum!r}")
    stages = _TC_STAGES
    if tile is not None:
        wmt, bn, dk = tile[:3]
        stages = tile[4] if len(tile) > 4 else stages
    if vw is None:
        vw = 16 // isz if d % (16 // isz) == 0 else 1
    vec = vw * isz
    lloyd = mode == "lloyd"
    budget = _smem_per_block(1)

    def layout(wmt, dk, groups=0):
        nF, nJ = -(-d // dk), -(-k // bn)
        bm = 8 * wmt * mt
        xs = bm * (dk + pad)
        cs = dk * bn * (2 if f32 else 1)
        ch = (256 // k if k <= 256 else 1) if lloyd else 0
        smem = (stages * xs + (1 if nF * nJ == 1 else stages) * cs + nF * dk + bm) * isz + bm * 4 + ch * k * 8
        smem += stages * bm * (isz + 4) if lloyd else 0
        smem += groups * k * dk * isz + (k * dk * 8 if groups and f32 else 0)
        return nF, nJ, bm, xs, smem

    nF, nJ, bm, xs, smem = layout(wmt, dk)
    while smem > budget and dk > 16 and tile is None:
        dk //= 2
        nF, nJ, bm, xs, smem = layout(wmt, dk)
    if smem > budget:
        raise ValueError(f"tensor-core tile {(wmt, bn, dk)} needs {smem} bytes of shared memory (> {budget})")
    fused = lloyd and nF == 1 and accum != "pass"
    groups, mtk = 0, 0
    if fused and accum == "mma":
        fused = k <= _TC_FUSED_MAX_K
        mtk = -(-k // mt) if fused else 0
        if fused and (8 // (dk // 8)) * mtk * mt * dk * 8 > stages * xs * isz:   # row groups' sums meet in X buffers
            fused, mtk = False, 0
    elif fused:
        # copies of the sums: as many as leave every thread a column (at most 256 / DK), fewer when
        # shared memory is short; a smaller row tile (WMT) before fewer than two copies
        fused = False
        for w_try in ([wmt] if tile is not None else sorted({wmt, 1}, reverse=True)):
            g = 256 // dk
            while g >= 1:
                lay = layout(w_try, dk, g)
                if lay[4] <= budget and (g >= 2 or w_try == 1 or tile is not None):
                    wmt, (nF, nJ, bm, xs, smem), groups, fused, mtk = w_try, lay, g, True, -1
                    break
                g //= 2
            if fused:
                break
    # two blocks per SM (at most 128 registers a thread) where the tile is small: more rows in flight
    two = _smem_per_block(1) + _ACC_BUDGET_PAD
    minb = 2 if (bn <= 32 and dk <= 32 and 2 * (smem + 1024) <= two) else 1
    if tile is None and not fused and bn == 64 and k <= 64 and (not f32 or not lloyd or nF == 1):
        # 33-64 centres without fused sums: one m-tile a warp, two blocks an SM.  Measured on an H200 at 10^7 x 64
        # against one block an SM: assign 1.84 vs 2.23 ms, Lloyd kernel 2.13 vs 2.37 ms (float32), 3.86 vs 4.67
        # (float64; lloyd_variants_h200_2026-11-24_final.json); at 2 10^6 x 1024 float64 12.2 vs 13.4 ms against
        # two m-tiles a warp, but float32 there 6.4 vs 6.2 (lloyd_variants_h200_2026-11-24.json), so not for
        # float32 rows of several slabs
        lay = layout(1, dk)
        if 2 * (lay[4] + 1024) <= two:
            wmt, (nF, nJ, bm, xs, smem), minb = 1, lay, 2
    if tile is not None and len(tile) > 3:
        minb = tile[3]
    ctype = _CTYPE[dtype]
    expr = (f"mpiml_distances_tc<{ctype}, {wmt}, {bn}, {dk}, {vec}, {1 if lloyd else 0}, {mtk}, {minb}"
            + (f", {stages}>" if stages != 2 else ">"))
    return {"mode": mode, "method": "tc", "ctype": ctype, "WMT": wmt, "BN": bn, "DK": dk, "BM": bm, "VEC": vec,
            "nF": nF, "nJ": nJ, "smem": smem, "fused": fused, "MTK": mtk, "MINB": minb, "STAGES": stages,
            "groups": groups,
            "accum": accum if fused else "pass", "expr": expr, "pack": f"mpiml_tc_pack<{ctype}, {bn}, {dk}>"}


def _tc_launch(X, C, shift, w, labels, mind, out, *, lloyd, tile=None, accum=None, sums=None):
    """The tensor-core kernel (+ the reduction of its partials, or for a float32 Lloyd step of k <= 64 with a
    sums pass the arg-min kernel + the totals pass; + the sums pass when not fused).

    ``sums``: the kind of sums pass (see :func:`sums_plan`), or ``"label"`` for the SIMT family's column
    pass (``mpiml_distances_label_sums``: one pass for any k, shared and float64 atomics, so not
    bit-reproducible); ``"none"`` skips it (benchmarks time the kernel alone).
    """
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    k = C.shape[0]
    plan = tc_plan(dtype, k, d, mode="lloyd" if lloyd else "assign", vw=_vec(dtype, d, X, shift), tile=tile,
                   accum=accum)
    # float32 where k fits one chunk and a sums pass follows: the arg-min kernel, then a pass over its output
    # for the weights per cluster, inertia and changed labels (mpiml_distances_step_totals), instead of the
    # Lloyd kernel: at 10^7 x 64, k = 64 (H200) its weights count took 0.16 ms and its inertia and changed
    # labels 0.14 more over the arg-min kernel; the pass takes ~0.06.  float64: the count cost nothing there.
    apart = lloyd and dtype == np.float32 and plan["nJ"] == 1 and plan["MTK"] == 0
    if apart:
        plan = dict(tc_plan(dtype, k, d, mode="assign", vw=_vec(dtype, d, X, shift), tile=tile), totals="pass")
    if n == 0:
        return plan
    fn = _function(plan["expr"])
    bn, dk, nJ, nF = plan["BN"], plan["DK"], plan["nJ"], plan["nF"]
    # the centres in fragment order (float32: TF32 big and small parts) and their norms, one small launch
    Cp = cupy.empty(nJ * nF * dk * bn * (2 if dtype == np.float32 else 1), dtype=dtype)
    c_sq = cupy.empty(nJ * bn, dtype=dtype)
    pack = _function(plan["pack"], "distances_tc.cu")
    pack((int(min(1024, _cdiv(Cp.size // (16 // dtype.itemsize), _THREADS))),), (_THREADS,),
         (C, np.int32(k), np.int32(d), np.int32(nJ), np.int32(nF), Cp, c_sq))
    grid = _grid(fn, plan, (n + plan["BM"] - 1) // plan["BM"])
    S = k * d if plan["fused"] else 0
    P = S + k + 2
    part = cupy.empty(grid * P if lloyd and not apart else 1, dtype=cupy.float64)
    if sums is None and k >= _GEMM_FROM_K:
        # one pass for any k, where the reproducible passes take one per cluster range: 5.4 ms against 8.3
        # (SIMT, 7 ranges) at 10^6 x 256, k = 1024 float32
        sums = "label"
    fresh = cupy.empty(n, dtype=cupy.int32) if apart else labels
    _launch(fn, plan, grid,
            (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, Cp, c_sq, np.int32(k),
             np.int32(plan["nJ"]), _NULL if w is None else w, fresh, mind, part, np.int32(plan["groups"])))
    if lloyd:
        if apart:
            _step_totals(fresh, labels, w, mind, k, out[k * d:], dtype)
        else:
            _reduce_partials(part, grid, P, out[k * d - S:])
        if plan["fused"] or sums == "none":
            pass
        elif sums == "label":
            _label_sums(X, shift, w, labels, k, out, "float" if dtype == np.float32 else "double")
            plan["sums"] = {"kind": "label"}
        else:
            plan["sums"] = _sums_pass(X, shift, w, labels, k, out, kind=sums)
    plan["grid"] = grid
    return plan


def _small_dims(dtype, k, d):
    """The small kernel's padded row (DP features, a multiple of 16 bytes) and centre count (KP: 8, 16, 32)."""
    ev = 16 // np.dtype(dtype).itemsize
    return -(-d // ev) * ev, 8 if k <= 8 else 16 if k <= 16 else 32


def _small_tc_dims(k, d):
    """The tensor-core small kernel's padded row (DQ: 8, 16 or 32 features) and centre count (KP: 8, 16, 32)."""
    return 8 if d <= 8 else 16 if d <= 16 else 32, 8 if k <= 8 else 16 if k <= 16 else 32


def _small_tc_fits(dtype, k, d):
    """Whether float32 ``k`` centres of ``d`` features go to ``mpiml_distances_small_tc``."""
    if np.dtype(dtype) != np.float32 or not (1 <= k <= _SMALL_MAX and 1 <= d <= _SMALL_MAX):
        return False
    dq, kp = _small_tc_dims(k, d)
    return kp * dq <= _SMALL_TC_CELLS


def _small_param_fits(dtype, k, d):
    """Whether the small kernel's padded centres and norms fit its parameters."""
    dp, kp = _small_dims(dtype, k, d)
    return (kp * dp + kp) * np.dtype(dtype).itemsize <= _SMALL_PARAM_BYTES


def _small_stages(smem, stages):
    """The most tiles in flight, from ``stages`` down to 2, whose shared memory ``smem(stages)`` fits a block."""
    while smem(stages) > _smem_per_block(1) and stages > 2:
        stages -= 1
    if stages < 2 or smem(stages) > _smem_per_block(1):
        raise ValueError(f"the small kernel needs 2 or more stages that fit shared memory, got {stages}")
    return stages


def _small_tc_plan(k, d, mode, vw, stages, rows, unit):
    """small_plan of ``mpiml_distances_small_tc`` (float32): tiles of 256 R rows, 2 R m-tiles of 16 a warp;
    ``unit``: a Lloyd step of unit weights (MODE 2: no weights read or staged, no distances written)."""
    dq, kp = _small_tc_dims(k, d)
    if vw is None:
        vw = 4 if d % 4 == 0 else 1
    lloyd = mode == "lloyd"
    cells = -(-kp // 16) * (dq // 8 + 1) * 4          # a lane's values of the sums (MC x NF x 4)
    unit = bool(unit and lloyd)
    per_row = (4 if unit else 8) if lloyd else 0       # previous labels (and weights) of a staged row

    def smem(st, r):       # tiles, their labels (weights) | float64 sums a thread | one-hot table (Lloyd)
        return st * 256 * r * (dq * 4 + per_row) + ((cells * _THREADS + (kp + 1) * -(-kp // 16) * 8) * 8
                                                     if lloyd else 0)

    # 8-feature rows: tiles of 1024 where two blocks an SM still fit (10^7 rows, unit weights, ms: 8 x 8 0.17
    # vs 0.18 at 512, d 8 k 32 0.30 vs 0.33); 16: 512 (0.32 vs 0.33 at 256, 0.38 at 1024); 32: 256 (0.47 vs
    # 0.60 at 512)
    if rows:
        r = rows
    elif dq == 8:
        r = 4 if smem(2, 4) <= _smem_per_block(2) else 2
    else:
        r = 2 if dq == 16 else 1
    if r not in (1, 2, 4):
        raise ValueError(f"rows must be 1, 2 or 4, got {r}")
    br = 256 * r
    stages = _small_stages(lambda st: smem(st, r), stages or _SMALL_STAGES[np.dtype(np.float32)])
    mode_arg = (2 if unit else 1) if lloyd else 0
    expr = f"mpiml_distances_small_tc<{dq}, {kp}, {mode_arg}, {stages}, {2 * r}, {vw * 4}"
    # expr_cm: the form that reads centres on the device from memory (CM)
    return {"mode": mode, "method": "small", "tc": True, "unit": unit, "ctype": "float", "DP": dq, "KP": kp,
            "VEC": vw * 4, "STAGES": stages, "R": r, "PC": True, "BM": br, "smem": smem(stages, r),
            "accum": "float", "expr": expr + ">", "expr_cm": expr + ", 2, true>"}


@_memo_plan
def small_plan(dtype, k, d, *, mode="lloyd", vw=None, stages=None, rows=None, param_centres=None, tc=None,
               unit=False):
    """What one launch of the whole-rows-in-registers kernel (``mpiml_distances_small``) would use.

    For ``d`` and ``k`` up to 32: the row is padded to ``DP`` features (a multiple of 16 bytes), the centres
    to ``KP`` (8, 16 or 32; the padding ones never win), ``rows`` (R) rows a thread, tiles of 256 R rows,
    ``stages`` tiles in shared memory (defaults ``_SMALL_STAGES``; float32 rows of up to 16 features, or with
    the centres in shared memory, two rows a thread, else one; fewer stages when shared memory is short).
    ``param_centres`` (``PC``): the centres and their norms go in the kernel's parameters (default: where
    they fit ``_SMALL_PARAM_BYTES``), else the kernel reads them from shared memory.

    ``tc``: the tensor-core form (``mpiml_distances_small_tc``, float32 with ``KP x DQ <= _SMALL_TC_CELLS``,
    rows padded to DQ = 8, 16 or 32 features): 3xTF32 distances and one-hot sums on the tensor cores, the
    centres as parameters (centres given on the device: read from memory, ``expr_cm``), ``rows`` R giving
    tiles of 256 R rows (2 R m-tiles of 16 a warp; default 4 for 8 features where two blocks an SM fit, else
    2, and 1 for 32 features).  Default: Lloyd steps where it fits, arg-mins where at least half of the padded
    KP x DQ is real.  Measured on an H200 at 10^7 rows
    (``small_kernel_h200_2026-11-24d.json`` in benchmarks/HISTORY.md, before the unit-weight form),
    tensor-core vs SIMT form, ms: Lloyd 0.35 vs 0.49 (d = k = 16), 0.24 vs 0.38 (8, 8), 0.49 vs 0.68 (d 32,
    k 8), 0.40 vs 0.47 (d 12, k 9), 0.26 vs 0.41 (d 3, k 5); arg-min 0.18 vs 0.23 (16, 16), 0.11 vs 0.15
    (8, 8), but 0.22 vs 0.18 (d 12, k 9).  Two tiles in flight beat three (0.35 vs 0.40-0.41 ms at 16 x 16:
    three leave one block an SM or tiles of 256 rows).  ``unit``: a Lloyd step without weights (unit
    weights) and without a distance buffer, which the tensor-core form takes without reading any weights or
    writing distances (the SIMT form reads a vector of ones): 10^7 x 16 0.315 vs 0.360 ms given ones, 8 x 8
    0.169 vs 0.212 (``small_kernel_h200_2026-11-24e.json``).
    """
    dtype = np.dtype(dtype)
    if not (1 <= k <= _SMALL_MAX and 1 <= d <= _SMALL_MAX):
        raise ValueError(f"the small kernel takes k and d from 1 to {_SMALL_MAX}, got k={k}, d={d}")
    if tc is None:
        # the arg-min alone pays for padded centres and features on the tensor cores: there the SIMT form wins
        # where they are mostly padding (10^7 rows, ms: d 12, k 9 0.18 vs 0.22; d 3, k 5 0.10 vs 0.13)
        dq, kp = _small_tc_dims(k, d)
        tc = (_small_tc_fits(dtype, k, d) and param_centres in (None, True)
              and (mode == "lloyd" or 2 * k * d >= kp * dq))
    elif tc and not _small_tc_fits(dtype, k, d):
        raise ValueError(f"the tensor-core small kernel takes float32 with {_SMALL_TC_CELLS} or fewer padded "
                         f"centres x features, got {dtype.name}, k={k}, d={d}")
    if tc:
        if param_centres is False:
            raise ValueError("the tensor-core small kernel takes its centres as parameters")
        return _small_tc_plan(k, d, mode, vw, stages, rows, unit)
    isz = dtype.itemsize
    narrow = dtype == np.float32
    ev = 16 // isz
    dp, kp = _small_dims(dtype, k, d)
    sx = dp if (dp // ev) % 2 else dp + ev
    if vw is None:
        vw = ev if d % ev == 0 else 1
    lloyd = mode == "lloyd"
    asz = 4 if narrow else 8
    pc = _small_param_fits(dtype, k, d) if param_centres is None else bool(param_centres)
    r = rows or (2 if narrow and not (pc and dp > 16) else 1)
    if r not in (1, 2, 4):
        raise ValueError(f"rows must be 1, 2 or 4, got {r}")
    br = 256 * r

    def smem(st):
        copies = 16 if narrow and dp <= 16 else 8     # a copy of the sums per warp, per half warp (see the kernel)
        b = (kp * dp + kp) * 8 * narrow + (copies * kp * dp + 8 * kp) * asz if lloyd else 0
        b += st * br * sx * isz + (kp * dp + kp + dp) * isz
        return b + (st * br * (isz + 4) + br * 4 if lloyd else 0)

    stages = _small_stages(smem, stages or _SMALL_STAGES[dtype])
    ct = _CTYPE[dtype]
    if pc and not _small_param_fits(dtype, k, d):
        raise ValueError(f"{kp} x {dp} centres do not fit the kernel's parameters")
    expr = (f"mpiml_distances_small<{ct}, {'float' if narrow else 'double'}, {dp}, {kp}, {vw * isz}, "
            f"{1 if lloyd else 0}, {stages}, {r}, {'true' if pc else 'false'}>")
    plan = {"mode": mode, "method": "small", "ctype": ct, "DP": dp, "KP": kp, "SX": sx, "VEC": vw * isz,
            "STAGES": stages, "R": r, "PC": pc, "BM": br, "smem": smem(stages),
            "accum": "float" if narrow else "double", "expr": expr}
    if pc:
        # expr_cb: the form that reads the centres from its constant bank (centres on the device)
        plan["expr_cb"] = expr[:-1] + ", true>"
    return plan


def _small_centres_arg(plan, dtype, C, k, d, *, bank=False):
    """The kernel's by-value centres argument: ``[centres KP x DP | norms KP]`` (zero padded, +inf norms past
    k) where the plan has them as parameters, else (or ``bank``: the form that reads its constant bank) one
    unused value.  ``C``: host centres (NumPy, as KMeans's host loop holds them; device centres go to the forms
    that read them on the device), or None: zeros.  The norms are summed feature by feature in float64 (the
    order of the forms that read their centres on the device: the same bits)."""
    params = plan["PC"] and not bank
    n_val = plan["KP"] * plan["DP"] + plan["KP"] if params else 1
    buf = np.zeros(n_val, dtype=dtype)
    if params and C is not None:
        kp, dp = plan["KP"], plan["DP"]
        Ch = np.asarray(C, dtype=dtype).reshape(k, d)
        buf[:kp * dp].reshape(kp, dp)[:k, :d] = Ch
        buf[kp * dp:kp * dp + k] = np.add.accumulate(Ch.astype(np.float64) ** 2, axis=1)[:, -1]
        buf[kp * dp + k:] = np.inf
    return buf.view(np.dtype({"names": ["v"], "formats": [(dtype, (n_val,))]}, align=True))


_ZERO_PARAMS = {}


def _small_zero_params(plan, dtype, bank=False):
    """The parameters argument of a launch that reads its centres from memory or, ``bank``, from its constant
    bank (kept per plan: no fill a step)."""
    key = (plan["expr"], np.dtype(dtype).str, bank)
    pc = _ZERO_PARAMS.get(key)
    if pc is None:
        pc = _ZERO_PARAMS[key] = _small_centres_arg(plan, dtype, None, 0, 0, bank=bank)
    return pc


_BANKS = {}
_BANK_LOCK = threading.Lock()


def _small_bank_fill(plan, C):
    """Queue the copy of device centres ``C`` (k x d, contiguous) into the constant bank of ``plan["expr_cb"]``
    on the current stream, packed by ``mpiml_small_bank_pack`` (zero padded, the norms in the parameters'
    order), and return the bank's record ``[symbol, event of its last use]``: the caller launches the kernel
    and then :func:`_small_bank_used`, under ``_BANK_LOCK``.  The bank is one per module (per instantiation and
    device), so the fill first waits for its last use, on whatever stream that was (on this one: already in
    order; compared by event, not by stream handle, which a new stream may reuse)."""
    cupy = _cupy()
    expr = plan["expr_cb"]
    dev = cupy.cuda.runtime.getDevice()
    entry = _BANKS.get((dev, expr))
    if entry is None:
        _function(expr)
        sym = _MODULES[(dev, expr)][1].get_global("mpiml_small_bank_" + ("f" if plan["ctype"] == "float" else "d"))
        entry = _BANKS[(dev, expr)] = [sym, None]
    stream = cupy.cuda.get_current_stream()
    if entry[1] is not None:
        stream.wait_event(entry[1])
    k, d = C.shape
    kp, dp = plan["KP"], plan["DP"]
    buf = cupy.empty(kp * dp + kp, dtype=C.dtype)
    _function(f"mpiml_small_bank_pack<{plan['ctype']}>")((1,), (_THREADS,), (C, np.int32(k), np.int32(d),
                                                                              np.int32(kp), np.int32(dp), buf))
    entry[0].copy_from_device_async(buf.data, buf.nbytes, stream)
    return entry


def _small_bank_used(entry):
    """Record the bank's last use: the work queued so far on the current stream."""
    if entry[1] is None:
        entry[1] = _cupy().cuda.Event(disable_timing=True)
    entry[1].record(_cupy().cuda.get_current_stream())


def _small_launch(X, C, shift, w, labels, mind, out, *, lloyd, stages=None, rows=None, param_centres=None,
                  tc=None):
    """The whole-rows-in-registers kernel or its tensor-core form (+ the reduction of its partials for a
    Lloyd step)."""
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    k = C.shape[0]
    plan = small_plan(dtype, k, d, mode="lloyd" if lloyd else "assign", vw=_vec(dtype, d, X, shift),
                      stages=stages, rows=rows, param_centres=param_centres, tc=tc,
                      unit=w is None and mind is None)
    if n == 0:
        return plan
    # the tensor-core form's Lloyd step of unit weights reads none and writes no distances (given a buffer,
    # the step takes the weighted form and a vector of ones), and its Lloyd steps write distances only when
    # given a buffer
    w, mind = _step_buffers(n, dtype, w, mind, lloyd=lloyd, reads_w=not plan.get("unit"),
                            writes_mind=not (lloyd and plan.get("tc")))
    expr = plan["expr"]
    bank = None
    on_device = not isinstance(C, np.ndarray)
    if plan.get("tc") and on_device:
        # centres on the device: the tensor-core form that reads them from memory (a copy to the host for the
        # parameters would wait for the stream)
        pc, expr = _small_zero_params(plan, dtype), plan["expr_cm"]
    elif plan["PC"] and on_device:
        # the same: the SIMT form that reads them from its constant bank, filled by a queued copy
        pc, expr, bank, C = _small_zero_params(plan, dtype, bank=True), plan["expr_cb"], C, _NULL
    else:
        pc = _small_centres_arg(plan, dtype, C, k, d)
        if plan["PC"]:
            C = _NULL                    # the kernel reads its centres from its parameters only
        elif isinstance(C, np.ndarray):
            C = cupy.asarray(C)
    fn = _function(expr)
    grid = _grid(fn, plan, _cdiv(n, plan["BM"]))
    P = k * d + k + 2
    part = cupy.empty(grid * P if lloyd else 1, dtype=cupy.float64)
    args = (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, C, np.int32(k),
            _NULL if w is None else w, labels, _NULL if mind is None else mind, part, pc)
    if bank is None:
        _launch(fn, plan, grid, args)
    else:
        with _BANK_LOCK:                 # the fill, the launch and the record of its use, one thread at a time
            entry = _small_bank_fill(plan, bank)
            _launch(fn, plan, grid, args)
            _small_bank_used(entry)
    if lloyd:
        _reduce_partials(part, grid, P, out)
    plan["grid"] = grid
    return plan


@_memo_plan
def sums_plan(dtype, k, d, vw=None, kind=None, stages=None, per_sm=None, rows_per_warp=None):
    """The sums pass of the tensor-core path (the Lloyd sums from the labels, when not fused).

    ``kind``: ``"simt"`` (plain adds in warp-private copies, ``mpiml_distances_sums_simt``: float32 copies
    flushed to float64 for float32 data, float64 copies for float64), ``"simt64"`` (float64 copies for
    either) or ``"mma"`` (one-hot products on the tensor cores, ``mpiml_distances_sums_tc``); default
    ``_TC_SUMS``.  Returns the slab of features (``DS``) and the cluster range (``KC``) of a block, rows
    per tile, shared memory, blocks per SM and the kernel name.  ``stages`` (tiles in flight),
    ``per_sm`` (blocks an SM: 1 or 2) and ``rows_per_warp`` (of a tile, a multiple of 4) override the
    measured defaults of the SIMT pass (``_SUMS_TILES``).
    """
    dtype = np.dtype(dtype)
    isz = dtype.itemsize
    f32 = dtype == np.float32
    kind = kind or _TC_SUMS
    if kind not in ("simt", "simt64", "mma"):
        raise ValueError(f"kind must be 'simt', 'simt64' or 'mma', got {kind!r}")
    if vw is None:
        vw = 16 // isz if d % (16 // isz) == 0 else 1
    if kind in ("simt", "simt64"):
        # the layout of mpiml_distances_sums_simt: [STAGES x 8 RW rows of 32 features, weights, labels |
        # 8 copies of kc x 32]; float32 copies add into float64 totals in registers (TC cells a thread)
        narrow = f32 and kind == "simt"
        ds = 32
        if per_sm not in (None, 1, 2):
            raise ValueError(f"per_sm must be 1 or 2, got {per_sm}")
        if rows_per_warp is not None and (rows_per_warp < 4 or rows_per_warp % 4):
            raise ValueError(f"rows_per_warp must be a positive multiple of 4, got {rows_per_warp}")
        per_kc = 8 * ds * (4 if narrow else 8)

        def fit(ps, st, rw):
            kc = (_smem_per_block(ps) - st * 8 * rw * (ds * isz + isz + 4)) // per_kc
            return min(kc, 256) if narrow else kc      # at most 32 float64 totals a thread (in registers)

        def tiles(ps):
            opts = [(stages or st, rows_per_warp or (rw if narrow else 64 // isz))    # float64 copies: 16 KB a tile
                    for st, rw in _SUMS_TILES[(narrow, ps)]]
            return next((o for o in opts if fit(ps, *o) >= k), opts[-1])

        ps = per_sm or (2 if narrow and fit(2, *tiles(2)) >= k else 1)
        st, rw = tiles(ps)
        kc = int(min(k, fit(ps, st, rw)))
        if st < 2 or kc < 1:
            raise ValueError(f"{st} stages of {8 * rw} rows do not fit shared memory with {ps} blocks an SM")
        acc = "float" if narrow else "double"
        tc = -(-kc * ds // _THREADS) if narrow else 0
        return {"kind": kind, "DS": ds, "KC": kc, "VEC": vw * isz, "rows": 8 * rw, "stages": st, "per_sm": ps,
                "smem": st * 8 * rw * (ds * isz + isz + 4) + kc * per_kc,
                "expr": f"mpiml_distances_sums_simt<{_CTYPE[dtype]}, {acc}, {vw * isz}, {st}, {ps}, {rw}, {tc}>"}
    mt = 16 if f32 else 8
    mtk = min(8, -(-k // mt))
    rows = _TC_SUMS_ROWS
    smem = 2 * rows * (64 + (8 if f32 else 4)) * isz + 2 * rows * (isz + 4)
    return {"kind": kind, "DS": 64, "MTK": mtk, "KC": mtk * mt, "VEC": vw * isz, "smem": smem, "rows": rows,
            "per_sm": 2, "expr": f"mpiml_distances_sums_tc<{_CTYPE[dtype]}, {mtk}, {vw * isz}>"}


@functools.lru_cache(maxsize=256)
def _wave_splits(items, slots, most):
    """Row ranges of a pass whose ``items`` blocks each take every row, at most ``most``: the fewest whose
    time, ``waves / ranges`` with a partial last wave counted whole, is within 2 % of the best (9 ranges
    of 32 feature slabs on 264 slots ran 288 blocks: a second wave of 24 that took a third of the pass,
    seen by Nsight on an H200)."""
    top = max(1, min(most, 4 * _cdiv(slots, items)))
    cost = [(_cdiv(s * items, slots) / s, s) for s in range(1, top + 1)]
    best = min(c for c, _ in cost)
    return min(s for c, s in cost if c <= 1.02 * best)


def _sums_pass(X, shift, w, labels, k, out, kind=None, stages=None, per_sm=None, rows_per_warp=None):
    """Per-cluster sums from the labels, added to ``out[:k*d]``: per-block partials summed in a fixed order."""
    cupy = _cupy()
    dtype = np.dtype(X.dtype)
    n, d = X.shape
    plan = sums_plan(dtype, k, d, vw=_vec(dtype, d, X, shift), kind=kind, stages=stages, per_sm=per_sm,
                     rows_per_warp=rows_per_warp)
    fn = _function(plan["expr"])
    sms = _device()[0]
    n_slabs, n_kc = _cdiv(d, plan["DS"]), _cdiv(k, plan["KC"])
    rows = plan["rows"]
    splits = _wave_splits(n_slabs * n_kc, plan["per_sm"] * sms, min(_cdiv(n, rows), max(1, 2**28 // (8 * k * d))))
    per_block = _cdiv(_cdiv(n, splits), rows) * rows
    splits = _cdiv(n, per_block)
    part = cupy.empty(splits * k * d, dtype=cupy.float64)
    head = (X, np.int64(n), np.int32(d), _NULL if shift is None else shift, labels, w, np.int32(k))
    tail = (np.int64(per_block), part)
    _launch(fn, plan, n_slabs * n_kc * splits, head + ((np.int32(plan["KC"]),) if plan["kind"] != "mma" else ()) + tail)
    _reduce_partials(part, splits, k * d, out[:k * d])
    plan["splits"] = splits
    return plan


def argmin_sqeuclidean(X, C, *, shift=None, tile=None, method="auto"):
    """Nearest row of ``C`` for every row of ``X`` under squared Euclidean distance.

    Parameters
    ----------
    X : cupy.ndarray of shape (n, d), float32 or float64
    C : cupy.ndarray or numpy.ndarray of shape (k, d)
        Cast to the dtype of ``X``.  The small kernel takes host centres as parameters, device centres
        from memory or a constant bank filled by a queued copy: neither waits for the stream.
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
    if labels is None:
        labels = cupy.full(n, -1, dtype=cupy.int32)
    out = cupy.zeros(k * d + k + 2, dtype=cupy.float64)
    _argmin_launch(X, C, shift, w, labels, mind, out, lloyd=True, accum=accum, tile=tile, method=method)
    return out


_TICKETS = {}
_UPDATE_BLOCKS = 256              # at most this many blocks of mpiml_lloyd_update (each cell of 4 or more a thread)


def _ticket():
    """The zeroed counter of ``mpiml_lloyd_update``'s last block, one per device and stream (each launch leaves
    it at zero again): no memset a launch."""
    cupy = _cupy()
    key = (cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr)
    t = _TICKETS.get(key)
    if t is None:
        t = _TICKETS[key] = cupy.zeros(1, dtype=cupy.uint32)
    return t


def _device_address(a):
    """The device's address of host array ``a`` where the device can write it (pinned memory, mapped: under
    unified addressing, every ``cudaHostAlloc``), else None."""
    cupy = _cupy()
    try:
        attrs = cupy.cuda.runtime.pointerGetAttributes(a.ctypes.data)
    except Exception:                    # pageable memory (older runtimes raise)
        return None
    return int(attrs.devicePointer) or None


def lloyd_update(packed, C, out=None, tail=None):
    """The centres' update of a Lloyd iteration on the device, one launch (``mpiml_lloyd_update``).

    ``packed``: the step's float64 totals ``[sums (k*d) | weights (k) | inertia | changed]`` (summed over the
    ranks); ``C`` (k, d) the centres the step used.  Returns ``(new, tail)``: ``new`` (k, d) of ``C``'s dtype,
    ``sums / weights`` computed in float64 and rounded once (a cluster of no weight keeps its centre: the same
    bits as the host's update), and ``tail`` float64 ``[inertia, changed, squared shift of the centres,
    clusters of no weight]`` (the shift added in a fixed order: the same bits on every run).  ``out`` may be
    given; ``tail`` too, on the device or in pinned host memory (NumPy: the kernel writes it there directly
    where the device can address it, else an asynchronous copy follows; read it after the stream).  Nothing
    waits for the stream.
    """
    cupy = _cupy()
    C = cupy.ascontiguousarray(C)
    k, d = C.shape
    if packed.dtype != np.float64 or packed.size != k * d + k + 2:
        raise ValueError(f"packed must hold k*d + k + 2 = {k * d + k + 2} float64 values, "
                         f"got {packed.size} {packed.dtype}")
    out = cupy.empty_like(C) if out is None else out
    if tail is None:
        tail = cupy.empty(4, dtype=cupy.float64)
    to_host = isinstance(tail, np.ndarray)
    if to_host and (tail.dtype != np.float64 or tail.size != 4 or not tail.flags.c_contiguous):
        raise ValueError("tail must be 4 contiguous float64 values")
    address = _device_address(tail) if to_host else None
    dst = np.uint64(address) if address else cupy.empty(4, dtype=cupy.float64) if to_host else tail
    blocks = max(1, min(_cdiv(k * d, 4 * 256), _UPDATE_BLOCKS))
    part = cupy.empty(2 * blocks, dtype=cupy.float64)
    fn = _function(f"mpiml_lloyd_update<{_CTYPE[np.dtype(C.dtype)]}>")
    fn((blocks,), (256,), (cupy.ascontiguousarray(packed), C, np.int32(k), np.int32(d), out, part, _ticket(), dst))
    if to_host and not address:
        cupy.cuda.runtime.memcpyAsync(tail.ctypes.data, dst.data.ptr, 32, cupy.cuda.runtime.memcpyDeviceToHost,
                                      cupy.cuda.get_current_stream().ptr)
    return out, tail


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
    Y = cupy.asarray(Y)
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
