"""The tensor-core kernels of the family (``tc.cu``, ``sums.cu``): the arg-min and Lloyd step on TF32 (3xTF32)
or float64 DMMA ``mma.sync``, the centres' packing in fragment order, and the sums passes that follow when the
step does not fuse its sums (one-hot products or SIMT adds), with the totals pass of the float32 arg-min path.

Plans (:func:`tc_plan`, :func:`sums_plan`) are pure functions of the shape and the device (memoised); the
launchers queue the kernels and the fixed-order reduction of their partials.
"""

import numpy as np

from ._common import (_ACC_BUDGET_PAD, _CTYPE, _GEMM_FROM_K, _NULL, _THREADS, TC_FILES, _cdiv, _cupy, _device,
                      _function, _grid, _launch, _memo_plan, _reduce_partials, _smem_per_block, _vec, _wave_splits)
from ._simt import _label_sums

__all__ = ["tc_plan", "sums_plan", "pack_centres"]

# Tensor-core kernels (tc.cu), per dtype: (WMT m-tiles per warp, largest DK).  A block of 8
# warps takes BM = 8 * WMT * MT rows (MT = 16 rows per float32 m-tile, 8 per float64 m-tile).
_TC_CONFIGS = {np.dtype(np.float32): (2, 64), np.dtype(np.float64): (2, 64)}
_TC_FUSED_MAX_K = 64              # the one-hot fused sums keep k x 8 features per warp in registers
_TC_ACCUM = "pass"                # how the Lloyd sums are made from k = 17 on by default (see tc_plan)
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


def _tf32(x, xp):
    """TF32 part of float32 ``x`` (round to nearest, ties away; low 13 bits zero): the bits of
    ``mpiml_tf32`` in ``tc_common.cuh``."""
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
    pack = _function(plan["pack"], TC_FILES)
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
