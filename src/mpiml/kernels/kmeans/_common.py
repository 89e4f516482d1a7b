"""What every kernel of the k-means family shares: the device (or the one a build plans for), the programs and
their loading, plan memoisation, the checks and layout of the inputs, launch geometry, the fixed-order reduction
of per-block partials.

The CUDA sources are two programs, each compiled as one source from its files in order (see
:func:`mpiml.kernels._loader.load_module`): :data:`TC_FILES` (sm_80 and later: the tensor-core kernels, the
sums passes, the small kernels) and :data:`SIMT_FILES` (the register-tiled SIMT kernels, the reduction of the
partials and the centres' update).  Nothing compiles at import.
"""

import contextlib
import functools
import os

import numpy as np

#: The tensor-core program's files (relative to ``mpiml/kernels``), concatenated in this order.
TC_FILES = ("kmeans/tc_common.cuh", "kmeans/tc.cu", "kmeans/sums.cu", "kmeans/small.cu", "kmeans/small_tc.cu")
#: The SIMT program's file.
SIMT_FILES = ("kmeans/simt.cu",)
#: Name prefixes of the kernels of :data:`TC_FILES`.
TC_PREFIXES = ("mpiml_distances_tc", "mpiml_distances_sums_tc", "mpiml_distances_sums_simt", "mpiml_distances_small",
               "mpiml_distances_step_totals", "mpiml_tc_", "mpiml_small_")

_THREADS = 256
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_ACC_BUDGET_PAD = 2048            # shared memory bytes kept free per block (static arrays, reserve)
_NULL = np.uint64(0)              # a null pointer argument (8 bytes, like a device pointer)
# From this many centres on the dot products go through cuBLAS (GEMM + an arg-min epilogue) instead
# of the fused register tile (measured on an H200: k = 1024, d = 256 float32 19.3 ms vs 22.7 ms; at
# k = 64 the fused kernel wins at every d, 18.7 vs 37.7 ms at d = 1024)
_GEMM_FROM_K = 256

_MODULES = {}
_DEVICE = {}
#: (SM count, shared memory per SM, per block opt-in, compute capability) that the plans see instead of the
#: current device's, in :func:`emulated_device`
_EMULATED = None


def _cupy():
    import cupy

    return cupy


def _function(expr, source=None):
    """The compiled kernel ``expr`` on the current device (compiled on first use).

    ``source``: the program's files; by default :data:`TC_FILES` for the kernels of the tensor-core program,
    :data:`SIMT_FILES` for the others.
    """
    cupy = _cupy()
    if source is None:
        source = TC_FILES if expr.startswith(TC_PREFIXES) else SIMT_FILES
    key = (cupy.cuda.runtime.getDevice(), expr)
    entry = _MODULES.get(key)
    if entry is None:
        from .._loader import load_module

        # MPIML_KERNEL_LINEINFO=1: source lines in the binaries, for Nsight Compute's source view
        opts = ("--std=c++17",) + (("-lineinfo",) if os.environ.get("MPIML_KERNEL_LINEINFO") == "1" else ())
        # a form that reads its constant bank gets a module of its own (the bank is one per module); any
        # other compiles with the small kernels of its source that the same call launches next
        bank = expr.startswith("mpiml_distances_small<") and expr.endswith(", true>")
        ct = "double" if "<double" in expr else "float"
        also = () if bank else (
            (f"mpiml_distances_step_totals<{ct}>", f"mpiml_small_bank_pack<{ct}>") if source == TC_FILES
            else ("mpiml_distances_reduce_partials", f"mpiml_lloyd_update<{ct}>"))
        if expr.startswith("mpiml_distances_tc<"):         # <T, WMT, BN, DK, ...>: its centres' packing kernel
            t, _, bn, dk = expr[len("mpiml_distances_tc<"):].split(", ")[:4]
            also += (f"mpiml_tc_pack<{t}, {bn}, {dk}>",)
        mod = load_module(source, [expr], opts, also=also)
        entry = _MODULES[key] = (mod.get_function(expr), mod)
    return entry[0]


def _device():
    """(SM count, shared memory per SM, per block opt-in, compute capability) of the current device."""
    if _EMULATED is not None:
        return _EMULATED
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


@contextlib.contextmanager
def emulated_device(model):
    """The plans as they come out on a device of ``model``, ``(SMs, shared memory per SM, per block opt-in,
    compute capability)``, without a GPU: the build asks them for a typical device of each architecture."""
    global _EMULATED
    saved, _EMULATED = _EMULATED, tuple(model)
    try:
        yield
    finally:
        _EMULATED = saved


def _have_device():
    """Whether plans are made for a device: a GPU CuPy sees, or the one of :func:`emulated_device`."""
    return _EMULATED is not None or _probe_device()


@functools.lru_cache(maxsize=1)
def _probe_device():
    try:
        return _cupy().cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def tc_supported():
    """True when the current device has the matrix units of the tensor-core kernels (sm_80 or later:
    TF32 ``mma.sync``, float64 DMMA, ``cp.async``)."""
    return _have_device() and _device()[3] >= 80


def _dtype(X):
    dt = np.dtype(X.dtype)
    if dt not in _CTYPE:
        raise TypeError(f"distance kernels take float32 or float64 arrays, got {dt}")
    return dt


def _vec(dtype, d, *arrays):
    """Vector width of the global loads: 16 bytes when every row starts 16-byte aligned."""
    vw = 16 // dtype.itemsize
    if d % vw:
        return 1
    for a in arrays:
        if a is not None and a.data.ptr % 16:
            return 1
    return vw


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


def _reduce_partials(part, nblocks, P, out):
    """``out[:P] += `` the ``nblocks`` rows of ``P`` float64 partials in ``part``, added in a fixed order
    (``mpiml_distances_reduce_partials``: the same bits on every run; 32 columns a block)."""
    red = _function("mpiml_distances_reduce_partials")
    red((int(min(4096, _cdiv(P, 32))),), (256,), (part, np.int32(nblocks), np.int64(P), out))


def _cdiv(a, b):
    return -(-int(a) // int(b))


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
