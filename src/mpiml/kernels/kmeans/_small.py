"""The small kernels of the family (``small.cu``, ``small_tc.cu``): whole rows in a thread's registers for k and d
up to 32, where a step reads X at bandwidth and its arithmetic is small; the SIMT form takes its centres as
parameters, from shared memory or from a constant bank filled by a queued copy, the float32 tensor-core form
as parameters or from memory.
"""

import threading

import numpy as np

from . import _common
from ._common import (_CTYPE, _NULL, _THREADS, _cdiv, _cupy, _function, _grid, _launch, _memo_plan,
                      _reduce_partials, _smem_per_block, _step_buffers, _vec)

__all__ = ["small_plan"]

# k and d both at most this may go to the whole-rows-in-registers kernel (mpiml_distances_small, method
# "small"; 0: never): see _lloyd._method for where it is the default and the measurements
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
        mod = _common._MODULES[(dev, expr)][1]
        sym = mod.get_global("mpiml_small_bank_" + ("f" if plan["ctype"] == "float" else "d"))
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
