"""The SIMT kernels of the family (``simt.cu``): the register-tiled arg-min and Lloyd step, the arg-min epilogue
of a cuBLAS product, the column-slab sums pass, and the pairwise distances with the top-k built on them.

The register tile is the family's kernel where there are no tensor cores (before sm_80) and its sums pass is
the one-pass form for large k.  :func:`pairwise_distances` is the transform of KMeans and the nearest
neighbours' blocks of distances where k is past the selection kernels' (:mod:`mpiml.kernels.select`).
"""

import numpy as np

from ._common import (_ACC_BUDGET_PAD, _CTYPE, _NULL, _THREADS, _cupy, _device, _dtype, _function, _grid, _launch,
                      _memo_plan, _prepare, _smem_per_block, _vec, _wave_splits)

__all__ = ["kernel_plan", "pairwise_distances", "topk"]

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
_GEMM_BLOCK_BYTES = 256 << 20     # bytes of one block of dot products on the GEMM path


def _tile(dtype, k, d):
    for kmax, cfg in _CONFIGS[dtype]:
        if kmax is None or k <= kmax:
            tm, tn, cg, dk, minb = cfg
            break
    # fewer staged features when d is small (zeros beyond d cost arithmetic)
    while dk > 8 and dk // 2 >= d:
        dk //= 2
    return tm, tn, cg, dk, minb


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
