"""Per-node histograms of binned rows on the GPU (``histograms.cu``), for the forests' level-wise growth.

The rows of a tree level are "elements" grouped by node: segment ``i`` of the
element arrays holds the rows of node ``i`` (:mod:`mpiml.ensemble._grower`
keeps them partitioned).  :func:`build_histograms` sums the elements of the
requested segments into ``(segment, feature, bin, channel)`` histograms with
one kernel launch: one block per work item (segment, tile of features, range
of at most ``rows_per_item`` elements), a histogram tile privatised in shared
memory, then a merge of its non-zero entries into global memory.

Sums are 64-bit integers (the weights are fixed-point integers): exact, so the
result does not depend on the order of the atomics, and equals the NumPy path
bit for bit.  The family's kernels are loaded together through
:mod:`mpiml.kernels._loader` (shipped, cached or compiled once) on first use and
memoised per device.
"""

import os

import numpy as np

__all__ = ["build_histograms", "partition_rows", "split_candidates", "tile_features", "plan_items"]

_THREADS = 256
#: Shared memory asked for per block without an opt-in (bytes).
_SMEM_DEFAULT = 48 * 1024
#: Elements per work item: at least this many (a block zeroes and merges its tile once) ...
_MIN_ROWS_PER_ITEM = 1024
#: ... and at most this many (narrow 32-bit accumulators must not overflow; blocks stay balanced).
_MAX_ROWS_PER_ITEM = 32768
#: Work items aimed at per streaming multiprocessor on large levels.
_ITEMS_PER_SM = 4

_FUNCTIONS = {}
_DEVICES = {}


def _device_info():
    """(SM count, largest opt-in shared memory per block) of the current device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    info = _DEVICES.get(dev)
    if info is None:
        attrs = cupy.cuda.Device(dev).attributes
        info = (attrs["MultiProcessorCount"], attrs.get("MaxSharedMemoryPerBlockOptin", _SMEM_DEFAULT))
        _DEVICES[dev] = info
    return info


def _function(classification=None, count_rows=None, wide=None, expr=None):
    """A kernel instantiation on the current device, compiled on first use."""
    import cupy

    if expr is None:
        expr = (f"mpiml_hist_build<{'true' if classification else 'false'}, {int(count_rows)}, "
                f"{'true' if wide else 'false'}>")
    key = (cupy.cuda.runtime.getDevice(), expr)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        # a tree level needs a build, the route and a move: the family's kernels load as one cubin
        from .._loader import load

        exprs = [f"mpiml_hist_build<{c}, {d}, {w}>"
                 for c in ("false", "true") for d in (0, 1) for w in ("false", "true")]
        exprs += ["mpiml_hist_route", "mpiml_hist_move<false>", "mpiml_hist_move<true>", "mpiml_hist_split<false>",
                  "mpiml_hist_split<true>", "mpiml_hist_build_reg<0>", "mpiml_hist_build_reg<1>"]
        fns = load(("forest/histograms.cu",), exprs + ([expr] if expr not in exprs else []))
        _FUNCTIONS.update(((key[0], e), f) for e, f in fns.items())
        fn = fns[expr]
    return fn


def tile_features(n_features, n_bins, n_channels, wide, smem_limit, words=None):
    """Features per shared-memory tile (0 when not even one feature's tile fits in ``smem_limit`` bytes);
    ``words``: 32-bit words per bin when given (else channels, twice when ``wide``)."""
    per_feature = n_bins * 4 * (words if words is not None else n_channels * (2 if wide else 1))
    return int(min(n_features, smem_limit // per_feature))


def plan_items(seg_start, seg_len, n_features, tile, rows_per_item):
    """Work items ``(output segment, first feature, first element, end element)`` as an int32 array (host).

    Empty segments get no item (their histograms stay zero).
    """
    seg_start = np.asarray(seg_start, dtype=np.int64)
    seg_len = np.asarray(seg_len, dtype=np.int64)
    chunks = -(-seg_len // rows_per_item)
    n_chunks = int(chunks.sum())
    owner = np.repeat(np.arange(len(seg_len), dtype=np.int64), chunks)
    first = np.repeat(np.cumsum(chunks) - chunks, chunks)
    begin = seg_start[owner] + (np.arange(n_chunks, dtype=np.int64) - first) * rows_per_item
    end = np.minimum(begin + rows_per_item, seg_start[owner] + seg_len[owner])
    tiles = np.arange(0, n_features, tile, dtype=np.int64)
    items = np.empty((n_chunks, len(tiles), 4), dtype=np.int64)
    items[:, :, 0] = owner[:, None]
    items[:, :, 1] = tiles[None, :]
    items[:, :, 2] = begin[:, None]
    items[:, :, 3] = end[:, None]
    return items.reshape(-1, 4).astype(np.int32)


def build_histograms(Xb, elem_row, elem_w, elem_wy, y, seg_start, seg_len, fsel, n_bins, n_classes, count_rows,
                     max_weight):
    """Histograms of the element segments ``[seg_start[i], seg_start[i] + seg_len[i])``.

    Parameters
    ----------
    Xb : cupy.ndarray of uint8, shape (n_rows, n_features)
        Binned rows (C order).
    elem_row : cupy.ndarray of int32, shape (n_elements,)
        Row of every element.
    elem_w : cupy.ndarray of float64, shape (n_elements,)
        Fixed-point weight of every element (integer-valued).
    elem_wy : cupy.ndarray of float64 or None
        Regression: fixed-point weight * y of every element; None for classification.
    y : cupy.ndarray of int32 or None
        Classification: class code of every row.
    seg_start, seg_len : host int arrays, shape (n_segments,)
        The element segments to sum (output segment ``i``).
    fsel : cupy.ndarray of int32, shape (n_segments, FH)
        Features of each segment's histogram, in output order.
    n_bins : int
        Bins per feature (at most 256).
    n_classes : int
        Classes (0: regression).
    count_rows : bool
        Whether channel 0 counts the rows.
    max_weight : float
        The largest ``elem_w`` (chooses 32-bit accumulators when no sum can reach 2^32).

    Returns
    -------
    cupy.ndarray of int64, shape (n_segments, FH, n_bins, channels)
        Or None when one feature's tile does not fit in a block's shared memory
        (the caller then sums with ``bincount``).
    """
    import cupy

    n_seg = len(seg_len)
    FH = int(fsel.shape[1])
    cls = n_classes > 0
    D = 1 if count_rows else 0
    C = D + (n_classes if cls else 2)
    hist = cupy.zeros((n_seg, FH, n_bins, C), dtype=cupy.int64)
    total = int(np.sum(seg_len)) if n_seg else 0
    if total == 0 or FH == 0:
        return hist
    n_sm, smem_optin = _device_info()
    rows = int(np.clip(-(-total // (n_sm * _ITEMS_PER_SM)), _MIN_ROWS_PER_ITEM, _MAX_ROWS_PER_ITEM))
    small_w = max_weight * rows < 2.0 ** 32 and float(max_weight).is_integer()
    wide = not (cls and small_w)
    # regression with small integer weights (the bootstrap's counts): the weight narrow, weight * y wide; only
    # when asked for (MPIML_RF_GPU_NARROW_WEIGHT=1): on one H100 the regressor's histograms took 62.3 ms a tree
    # with it against 54.7 ms with the wide kernel (2026-11-27, 4e7 x 32, 100 trees of depth 12)
    mixed = not cls and small_w and os.environ.get("MPIML_RF_GPU_NARROW_WEIGHT", "0") == "1"
    words = D + 3 if mixed else C * (2 if wide else 1)
    tile = tile_features(FH, n_bins, C, wide, _SMEM_DEFAULT, words)
    smem_limit = _SMEM_DEFAULT
    if tile == 0:
        tile = tile_features(FH, n_bins, C, wide, smem_optin, words)
        smem_limit = smem_optin
        if tile == 0:
            return None
    items = plan_items(seg_start, seg_len, FH, tile, rows)
    smem = tile * n_bins * words * 4
    fn = _function(expr=f"mpiml_hist_build_reg<{D}>") if mixed else _function(cls, D, wide)
    if smem > _SMEM_DEFAULT:
        fn.max_dynamic_shared_size_bytes = smem_limit
    Xb = cupy.ascontiguousarray(Xb)
    dummy_f = elem_w if elem_wy is None else elem_wy
    dummy_i = elem_row if y is None else y
    fn((items.shape[0],), (_THREADS,),
       (Xb, np.int64(Xb.shape[1]), elem_row, elem_w, dummy_f, dummy_i, cupy.ascontiguousarray(fsel, dtype=cupy.int32),
        np.int32(FH), cupy.asarray(items), np.int32(tile), np.int32(n_bins), np.int32(n_classes), hist),
       shared_mem=smem)
    return hist


def partition_rows(Xb, seg, row, w, wy, wy2, code, starts):
    """Move the elements of a level into the segments of the next one (stable), in two kernels and a scan.

    Parameters
    ----------
    Xb : cupy.ndarray of uint8, shape (n_rows, n_features)
    seg, row : cupy.ndarray of int32, shape (n_elements,)
        Slot and row of every element (elements grouped by slot).
    w, wy, wy2 : cupy.ndarray of float64 (``wy``, ``wy2`` None for classification)
        The elements' fixed-point channels, moved along.
    code : host int array, shape (n_slots,)
        -1 for a leaf, else ``feature * 256 + bin`` (left when the row's bin is <= bin).
    starts : host int64 array, shape (n_slots + 1,)
        Segment boundaries.

    Returns
    -------
    (row, seg, w, wy, wy2) of the kept elements (seg: ``2 r`` left, ``2 r + 1`` right child of the
    ``r``-th split slot), and the host counts ``(n_slots, 2)`` of left and right elements per slot.
    """
    import cupy

    n = int(row.shape[0])
    S = len(starts) - 1
    code = np.asarray(code, dtype=np.int64)
    flags = cupy.empty(n, dtype=cupy.int64)
    blocks = (max(1, -(-n // _THREADS)),)
    if n:
        _function(expr="mpiml_hist_route")(blocks, (_THREADS,), (seg, row, cupy.asarray(code.astype(np.int32)), Xb,
                                                                 np.int64(Xb.shape[1]), np.int64(n), flags))
    csp = cupy.concatenate([cupy.zeros(1, dtype=cupy.int64), cupy.cumsum(flags)])
    a = csp[cupy.asarray(starts[:-1])]
    b = csp[cupy.asarray(starts[1:])]
    low = np.int64(0xFFFFFFFF)
    counts = cupy.stack([(b & low) - (a & low), (b >> 32) - (a >> 32)], axis=1)
    counts_h = counts.get().reshape(S, 2)
    n_new = int(counts_h.sum())
    rank = cupy.asarray((np.cumsum(code >= 0) - 1).astype(np.int32))
    reg = wy is not None
    out_row = cupy.empty(n_new, dtype=cupy.int32)
    out_seg = cupy.empty(n_new, dtype=cupy.int32)
    out_w = cupy.empty(n_new, dtype=cupy.float64)
    out_wy = cupy.empty(n_new, dtype=cupy.float64) if reg else out_w
    out_wy2 = cupy.empty(n_new, dtype=cupy.float64) if reg else out_w
    if n and n_new:
        _function(expr=f"mpiml_hist_move<{'true' if reg else 'false'}>")(
            blocks, (_THREADS,), (np.int64(n), seg, flags, csp[1:], a >> 32, b & low, rank, row, w,
                                  wy if reg else w, wy2 if reg else w, out_row, out_seg, out_w, out_wy, out_wy2))
    return (out_row, out_seg, out_w, out_wy if reg else None, out_wy2 if reg else None), counts_h


#: Most channels :func:`split_candidates` handles (a thread's prefix sums live in registers).
SPLIT_MAX_CHANNELS = 8


def split_candidates(H, fpos, tot, mwl, sw, sy, n_classes, count_rows, min_samples_leaf):
    """The best split of every (node, candidate feature) pair of reduced histograms, one warp per pair.

    The GPU twin of :func:`mpiml.ensemble._cpu_kernels.split_candidates` (same parameters, CuPy
    arrays; gini for ``n_classes > 0``, squared error for 0; at most :data:`SPLIT_MAX_CHANNELS`
    channels).  Returns ``(best_val, best_b, best_wl, below, above, n_occupied)``, each ``(S, m)``.
    """
    import cupy

    S, m = (int(d) for d in fpos.shape)
    _, FH, B, C = (int(d) for d in H.shape)
    if C > SPLIT_MAX_CHANNELS:
        raise ValueError(f"split_candidates handles at most {SPLIT_MAX_CHANNELS} channels, got {C}")
    outs = (cupy.empty((S, m), dtype=cupy.float64), cupy.empty((S, m), dtype=cupy.int64),
            cupy.empty((S, m), dtype=cupy.float64), cupy.empty((S, m), dtype=cupy.int64),
            cupy.empty((S, m), dtype=cupy.int64), cupy.empty((S, m), dtype=cupy.int64))
    n = S * m
    if n == 0:
        return outs
    has_mwl = mwl is not None
    fn = _function(expr=f"mpiml_hist_split<{'true' if n_classes else 'false'}>")
    fn((-(-n * 32 // _THREADS),), (_THREADS,),                     # a warp per pair
       (cupy.ascontiguousarray(H, dtype=cupy.float64), np.int64(FH), np.int32(B), np.int32(C),
        cupy.ascontiguousarray(fpos, dtype=cupy.int64), np.int32(m), np.int64(S),
        cupy.ascontiguousarray(tot, dtype=cupy.float64),
        cupy.ascontiguousarray(mwl, dtype=cupy.float64) if has_mwl else outs[0], np.int32(has_mwl),
        np.float64(sw), np.float64(sy), np.int32(bool(count_rows)), np.float64(min_samples_leaf)) + outs)
    return outs
