"""The family's entry points: one Lloyd step (:func:`lloyd_step_packed`, :func:`lloyd_step`), the arg-min
(:func:`argmin_sqeuclidean`) and the centres' update on the device (:func:`lloyd_update`), with the choice of
kernel (``_method``: small, tensor-core, SIMT register tile or cuBLAS) that sends a launch to
:mod:`._small`, :mod:`._tc` or :mod:`._simt`.
"""

import os

import numpy as np

from ._common import (_CTYPE, _GEMM_FROM_K, _NULL, _cdiv, _cupy, _function, _grid, _launch, _prepare,
                      _reduce_partials, _step_buffers, _vec, tc_supported)
from ._simt import _gemm_launch, _label_sums, kernel_plan
from ._small import _SMALL_MAX, _small_launch, _small_param_fits
from ._tc import _tc_launch

__all__ = ["argmin_sqeuclidean", "lloyd_step", "lloyd_step_packed", "lloyd_update"]

_METHODS = ("auto", "fused", "gemm", "tc", "small")


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
