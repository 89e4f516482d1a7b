"""The fused k-means kernel (``kernels/kmeans.cu``) for CuPy shards.

The ``.cu`` source is read with :mod:`importlib.resources`, compiled through
``cupy.RawModule(name_expressions=...)`` on first use and memoized per device
(CuPy's disk cache keeps the binary between runs).  Nothing compiles at import.
"""

import os
from importlib import resources

import numpy as np

__all__ = ["lloyd_step", "assign", "kernel_config"]

_THREADS = 256
_BC = 8
_DK = 16
_TM = {np.dtype(np.float32): 4, np.dtype(np.float64): 2}
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_TNS = (2, 4, 8)
_ACC_TWO_BLOCKS = 80 * 1024     # accumulator bytes per block that still let two blocks share an SM
_ACC_ONE_BLOCK = 200 * 1024     # all shared memory of a block at one block per SM
_MODULES = {}
_DEVICE_INFO = {}


def _source():
    return resources.files("mpiml.kernels").joinpath("kmeans.cu").read_text()


def _names():
    return [f"mpiml_kmeans_lloyd<{_CTYPE[dt]}, {_TM[dt]}, {tn}, {_BC}>" for dt in _TM for tn in _TNS]


def _module():
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    mod = _MODULES.get(dev)
    if mod is None:
        options = ("--std=c++17",) + tuple(os.environ.get("MPIML_KMEANS_NVRTC_FLAGS", "").split())
        mod = cupy.RawModule(code=_source(), options=options, name_expressions=_names())
        mod.compile()
        _MODULES[dev] = mod
    return mod


def _sm_count():
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    if dev not in _DEVICE_INFO:
        attrs = cupy.cuda.Device(dev).attributes
        _DEVICE_INFO[dev] = (attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024))
    return _DEVICE_INFO[dev]


def kernel_config(dtype, k, d, accumulate=True):
    """``(name, rows per tile, dynamic shared bytes, accumulator groups)`` for one launch.

    The per-cluster sums take ``groups`` private copies of ``k * (d + 1)`` doubles in
    shared memory (as many as threads and a budget allow, so that two blocks fit per
    SM; one copy at one block per SM when larger; none -- global atomics -- beyond).
    """
    dtype = np.dtype(dtype)
    tn = 8 if k > 32 else (4 if k > 16 else 2)
    tm = _TM[dtype]
    bm = (_THREADS // _BC) * tm
    bn = _BC * tn
    pad = 16 // dtype.itemsize
    staging = _DK * ((bm + pad) + (bn + pad)) * dtype.itemsize + bm * (dtype.itemsize + 4)
    cell_bytes = k * (d + 1) * 8
    groups = 0
    if accumulate:
        by_threads = max(1, _THREADS // (d + 1))
        if cell_bytes <= _ACC_TWO_BLOCKS:
            groups = min(by_threads, _ACC_TWO_BLOCKS // cell_bytes)
        elif cell_bytes + staging <= _ACC_ONE_BLOCK:
            groups = 1
    acc = ((groups * k * (d + 1) + 1) // 2) * 16
    name = f"mpiml_kmeans_lloyd<{_CTYPE[dtype]}, {tm}, {tn}, {_BC}>"
    return name, bm, acc + staging, groups


def _launch(X, w, shift, C, labels, mind, out, accumulate):
    import cupy

    n, d = X.shape
    k = C.shape[0]
    name, bm, smem, groups = kernel_config(X.dtype, k, d, accumulate)
    kern = _module().get_function(name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    sms, smem_sm = _sm_count()
    per_sm = max(1, min(2, (smem_sm - 2048) // max(smem, 1)))
    grid = int(max(1, min((n + bm - 1) // bm, sms * per_sm)))
    c_sq = (C * C).sum(axis=1)
    if shift is None:
        shift = cupy.zeros(d, dtype=X.dtype)
    if n == 0:
        return
    kern((grid,), (_THREADS,),
         (X, np.int64(n), np.int32(d), C, c_sq, np.int32(k), shift, w, labels, mind, out,
          np.int32(1 if accumulate else 0), np.int32(groups)),
         shared_mem=smem)


def _prepare(X, shift, C, w=None):
    import cupy

    X = cupy.ascontiguousarray(X)
    C = cupy.ascontiguousarray(C, dtype=X.dtype)
    if shift is not None:
        shift = cupy.ascontiguousarray(shift, dtype=X.dtype)
    if w is not None:
        w = cupy.ascontiguousarray(w, dtype=X.dtype)
    return X, shift, C, w


def lloyd_step(X, sample_weight, shift, C, labels, mind):
    """GPU version of :func:`mpiml.cluster._kmeans_ops.lloyd_step` (one fused kernel)."""
    import cupy

    X, shift, C, w = _prepare(X, shift, C, sample_weight)
    k, d = C.shape
    out = cupy.zeros(k * d + k + 2, dtype=cupy.float64)
    _launch(X, w, shift, C, labels, mind, out, True)
    return out


def assign(X, shift, C):
    """Labels (int32) and squared distances of every row to its nearest centre."""
    import cupy

    X, shift, C, _ = _prepare(X, shift, C)
    n = X.shape[0]
    labels = cupy.empty(n, dtype=cupy.int32)
    mind = cupy.empty(n, dtype=X.dtype)
    dummy = cupy.zeros(1, dtype=cupy.float64)
    _launch(X, mind, shift, C, labels, mind, dummy, False)
    return labels, mind
