"""Compiled CPU kernels of forest growth (Numba): histograms, split search, row partition.

The grower's NumPy path sums histograms with ``bincount`` over combined keys
and searches splits with whole-array operations; on the host both pass over
``nodes x features x bins x channels`` arrays several times and allocate
temporaries of that size.  These kernels do the same arithmetic in one pass,
in parallel over (node, feature) pairs or nodes (``prange``), each output
entry written by exactly one iteration, so the results do not depend on the
thread count:

* :func:`build_histograms`: integer-valued float64 sums (exact in any order),
  equal to the NumPy histograms bit for bit;
* :func:`split_candidates`: per (node, feature) the best bin, evaluated with
  the same IEEE operations in the same order as the NumPy search (gini and
  squared error; sums over classes left to right, as NumPy's for fewer than 8
  classes), so the chosen splits and the trees are the same;
* :func:`node_candidates`: the two above fused per node, for a rank that
  needs no allreduce: each node's histogram lives in a per-thread buffer and
  is never written out;
* :func:`partition`: the stable move of a level's elements into the
  children's segments.

Numba compiles each kernel at its first call and caches the machine code
next to this file (``cache=True``), so only the first fit on a machine pays
the compilation.  Nothing is compiled at import.
"""

import os

import numpy as np

__all__ = ["enabled", "thread_count", "apply_bins", "segment_totals", "feature_orders", "build_histograms", "split_candidates", "node_candidates", "partition"]

_KERNELS = None


def enabled():
    """Whether the host path uses these kernels: Numba importable and ``MPIML_RF_CPU_KERNEL`` not ``0``
    (the NumPy path then, with the same trees)."""
    if os.environ.get("MPIML_RF_CPU_KERNEL", "1") == "0":
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def thread_count():
    """Threads of this rank's kernels: ``MPIML_NUM_THREADS`` or ``OMP_NUM_THREADS`` when set, else this
    process's cores divided by the ranks the launcher placed on the node (Open MPI, MPICH and Slurm
    say how many), so that ranks sharing a node do not oversubscribe it."""
    for name in ("MPIML_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(name, "").strip().isdigit():
            return max(1, int(os.environ[name]))
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                      # not on Linux
        cores = os.cpu_count() or 1
    local = 1
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"):
        if os.environ.get(name, "").strip().isdigit():
            local = max(1, int(os.environ[name]))
            break
    return max(1, cores // local)


def _kernels():
    """The compiled kernels, defined on first use (Numba itself is imported lazily)."""
    global _KERNELS
    if _KERNELS is None:
        import numba

        numba.set_num_threads(min(thread_count(), numba.config.NUMBA_NUM_THREADS))
        _KERNELS = _define()
    return _KERNELS


def apply_bins(X, edges, dtype):
    """Bin index of every entry of ``X`` (host rows): ``#(edges[j] < x)``, as ``searchsorted(side="left")``."""
    n, d = X.shape
    table = np.full((d, max((len(e) for e in edges), default=0) or 1), np.inf)
    for j, e in enumerate(edges):
        table[j, :len(e)] = e
    lens = np.array([len(e) for e in edges], dtype=np.int64)
    out = np.empty((n, d), dtype=dtype)
    if n and d:
        _kernels()["bins"](X, table, lens, out)
    return out


def build_histograms(Xb, row, w, wy, y, seg_start, seg_len, fsel, n_bins, n_classes, count_rows):
    """Histograms ``(segments, FH, bins, channels)`` (float64) of element segments, as the NumPy path's.

    Parameters as :func:`mpiml.kernels.histograms.build_histograms` (host arrays):
    ``wy`` None for classification, ``y`` None for regression.
    """
    k = _kernels()
    n, FH = len(seg_len), int(fsel.shape[1])
    C = int(count_rows) + (n_classes if n_classes else 2)
    out = np.zeros((n, FH, n_bins, C), dtype=np.float64)
    if n == 0 or FH == 0:
        return out
    dummy_f = w if wy is None else wy
    dummy_i = row if y is None else y
    k["hist"](Xb, row, w, dummy_f, dummy_i, np.ascontiguousarray(seg_start, dtype=np.int64),
              np.ascontiguousarray(seg_len, dtype=np.int64), np.ascontiguousarray(fsel, dtype=np.int64),
              n_classes, int(count_rows), out)
    return out


def _candidate_outputs(S, m):
    return (np.empty((S, m), dtype=np.float64), np.empty((S, m), dtype=np.int64), np.empty((S, m), dtype=np.float64),
            np.empty((S, m), dtype=np.int64), np.empty((S, m), dtype=np.int64), np.empty((S, m), dtype=np.int64))


def split_candidates(H, fpos, tot, mwl, sw, sy, n_classes, count_rows, min_samples_leaf):
    """The best split of every (node, candidate feature) from reduced histograms.

    Parameters
    ----------
    H : float64 array of shape (S, FH, B, C)
        Reduced histograms (integer-valued).
    fpos : int array of shape (S, m)
        Position in ``H``'s second axis of each node's candidate features, in the node's order.
    tot : float64 array of shape (S, C)
        Channel totals of each node.
    mwl : float64 array of shape (S,) or None
        Smallest weight of a child (``min_weight_fraction_leaf`` times the root's weight).
    sw, sy : float
        Fixed-point scales of the weight and of ``weight * y`` (powers of two).
    n_classes : int
        0 for regression (squared error), else classes (gini).
    count_rows : bool
        Channel 0 counts rows (``min_samples_leaf > 1``).
    min_samples_leaf : int

    Returns
    -------
    best_val, best_b, best_wl, below, above, n_occupied : arrays of shape (S, m)
        The largest score of a valid split after bin ``best_b`` (-inf and bin 0 when
        there is none; ties to the lowest bin), the left weight there, the nearest
        non-empty bins at or below / above ``best_b`` (-1 / B when none), and the
        number of non-empty bins.
    """
    S, m = fpos.shape
    outs = _candidate_outputs(S, m)
    if S and m:
        has_mwl = mwl is not None
        _kernels()["split"](H, np.ascontiguousarray(fpos, dtype=np.int64), tot,
                            mwl if has_mwl else np.zeros(S), has_mwl, float(sw), float(sy), n_classes,
                            int(count_rows), float(min_samples_leaf), *outs)
    return outs


def node_candidates(Xb, row, w, wy, y, seg_start, seg_len, fsel, n_bins, tot, mwl, sw, sy, n_classes, count_rows,
                    min_samples_leaf):
    """:func:`build_histograms` then :func:`split_candidates` per node, without writing the histograms out.

    ``fsel`` (S, m) holds the candidate features themselves (columns of ``Xb``).
    """
    S, m = fsel.shape
    outs = _candidate_outputs(S, m)
    if S and m:
        has_mwl = mwl is not None
        _kernels()["fused"](Xb, row, w, w if wy is None else wy, row if y is None else y,
                            np.ascontiguousarray(seg_start, dtype=np.int64), np.ascontiguousarray(seg_len, dtype=np.int64),
                            np.ascontiguousarray(fsel, dtype=np.int64), n_bins, tot, mwl if has_mwl else np.zeros(S),
                            has_mwl, float(sw), float(sy), n_classes, int(count_rows), float(min_samples_leaf),
                            min(S, 1024), *outs)
    return outs


def segment_totals(row, w, wy, wy2, y, starts, n_classes, count_rows):
    """Per segment the channel totals ``(S, C)`` and the extras ``(S, E)`` (rows; regression: ``sum(wy2)``)."""
    S = len(starts) - 1
    D = int(count_rows)
    C = D + (n_classes if n_classes else 2)
    tot = np.zeros((S, C))
    extra = np.zeros((S, 1 if n_classes else 2))
    if S:
        _kernels()["totals"](row, w, w if wy is None else wy, w if wy2 is None else wy2, row if y is None else y,
                             np.ascontiguousarray(starts, dtype=np.int64), n_classes, D, tot, extra)
    return tot, extra


def feature_orders(lead, trees, nodes, n_features):
    """Per node the permutation of the features keyed by ``(seed, tree, node)``: the stable argsort of
    :func:`mpiml.ensemble._hist.hash_uniform` draws (``lead`` its seed-and-stream word), as the array path."""
    out = np.empty((len(nodes), n_features), dtype=np.int64)
    if len(nodes):
        _kernels()["orders"](np.uint64(lead), np.ascontiguousarray(trees, dtype=np.int64),
                             np.ascontiguousarray(nodes, dtype=np.int64), out)
    return out


def partition(Xb, row, w, wy, wy2, starts, feature, threshold_bin):
    """Stable partition of a level's elements into the children of the split slots.

    ``feature`` is -1 for a leaf slot (its elements are dropped), else the split
    feature; an element goes left when its row's bin is ``<= threshold_bin``.
    Returns ``(row, w, wy, wy2)`` of the next level (``wy``, ``wy2`` None for
    classification) and the ``(split slots, 2)`` counts of left and right elements.
    One pass over the elements: a slot's output starts where the sizes of the
    split slots before it end; its left elements go there directly, its right
    ones through a scratch copy placed after them.
    """
    S = len(starts) - 1
    feature = np.ascontiguousarray(feature, dtype=np.int64)
    threshold_bin = np.ascontiguousarray(threshold_bin, dtype=np.int64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    split = feature >= 0
    sizes = np.where(split, np.diff(starts), 0)
    dest = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    n_new = int(sizes.sum())
    reg = wy is not None
    n = row.shape[0]
    out_row, tmp_row = np.empty(n_new, dtype=np.int32), np.empty(n, dtype=np.int32)
    out_w, tmp_w = np.empty(n_new, dtype=np.float64), np.empty(n, dtype=np.float64)
    m = n_new if reg else 0
    out_wy, out_wy2 = np.empty(m, dtype=np.float64), np.empty(m, dtype=np.float64)
    tmp_wy, tmp_wy2 = np.empty(n if reg else 0, dtype=np.float64), np.empty(n if reg else 0, dtype=np.float64)
    n_left = np.zeros(S, dtype=np.int64)
    _kernels()["move"](Xb, row, w, wy if reg else w, wy2 if reg else w, reg, starts, feature, threshold_bin, dest,
                       out_row, out_w, out_wy, out_wy2, tmp_row, tmp_w, tmp_wy, tmp_wy2, n_left)
    counts = np.stack([n_left, np.diff(starts) - n_left], axis=1)[split]
    return (out_row, out_w, out_wy if reg else None, out_wy2 if reg else None), counts


def _define():
    import numba
    from numba import njit, prange

    jit = njit(cache=True, nogil=True)
    pjit = njit(cache=True, nogil=True, parallel=True)

    @jit
    def add_rows(Xb, row, w, wy, y, e0, e1, fs, K, D, h):
        """Sum the elements ``e0:e1`` into the ``(len(fs), B, C)`` histograms ``h`` of the features ``fs``
        (a row's bins are read together: one cache line per row)."""
        for e in range(e0, e1):
            r = row[e]
            we = w[e]
            ch = D + y[r] if K else D
            wye = 0.0 if K else wy[e]
            for j in range(fs.shape[0]):
                b = Xb[r, fs[j]]
                if D:
                    h[j, b, 0] += 1.0
                h[j, b, ch] += we
                if not K:
                    h[j, b, D + 1] += wye

    @pjit
    def hist(Xb, row, w, wy, y, seg_start, seg_len, fsel, K, D, out):
        for i in prange(fsel.shape[0]):
            add_rows(Xb, row, w, wy, y, seg_start[i], seg_start[i] + seg_len[i], fsel[i], K, D, out[i])

    @jit
    def scan(cb, h, nb, B, tot, cum, mwl, has_mwl, sw, sy, K, D, msl):
        """Best split of one (node, feature) histogram: bins ``cb[:nb]`` (increasing) with sums ``h[:nb]``
        (a dense histogram: ``cb`` = 0..B-1; a compact one: its non-empty bins); the NumPy search's arithmetic."""
        C = h.shape[1]
        for c in range(C):
            cum[c] = 0.0
        best, best_b, best_wl, wl0 = -np.inf, 0, 0.0, 0.0
        occupied, below, above, pending = 0, -1, B, False
        first_after0 = B
        bin0 = False
        for k in range(nb):
            b = cb[k]
            if D or K == 0:
                occ = h[k, 0] > 0
            else:
                occ = False
                for c in range(C):
                    if h[k, c] > 0:
                        occ = True
            if not occ:
                continue
            occupied += 1
            if b == 0:
                bin0 = True
            elif first_after0 == B:
                first_after0 = b
            if pending:
                above = b
                pending = False
            for c in range(C):
                cum[c] += h[k, c]
            if K:
                WL = 0.0
                WR = 0.0
                sl = 0.0
                sr = 0.0
                for c in range(D, C):
                    lw = cum[c] / sw
                    rw = (tot[c] - cum[c]) / sw
                    WL += lw
                    WR += rw
                    sl += lw * lw
                    sr += rw * rw
                proxy = sl / (WL if WL > 0 else 1.0) + sr / (WR if WR > 0 else 1.0)
            else:
                WL = cum[D] / sw
                WR = (tot[D] - cum[D]) / sw
                SL = cum[D + 1] / sy
                SR = (tot[D + 1] - cum[D + 1]) / sy
                proxy = SL * SL / (WL if WL > 0 else 1.0) + SR * SR / (WR if WR > 0 else 1.0)
            if b == 0:
                wl0 = WL
            valid = WL > 0 and WR > 0
            if D:
                valid = valid and cum[0] >= msl and tot[0] - cum[0] >= msl
            if has_mwl:
                valid = valid and WL >= mwl and WR >= mwl
            if valid and proxy > best:
                best, best_b, best_wl = proxy, b, WL
                below, above, pending = b, B, True
        if best == -np.inf:                        # no valid split: bin 0, as an argmax over -inf
            best_b, best_wl = 0, wl0
            below, above = (0 if bin0 else -1), first_after0
        return best, best_b, best_wl, below, above, occupied

    @jit
    def compact(Xb, row, w, wy, y, e0, n, f, K, D, key, cb, h):
        """The non-empty bins of feature ``f`` over the elements ``e0:e0+n`` (increasing, in ``cb``) and their
        sums (rows of ``h``), by sorting the elements' bins: for nodes with fewer rows than bins."""
        for i in range(n):
            key[i] = Xb[row[e0 + i], f]
        for i in range(1, n):                        # insertion sort of the few element indices by bin
            v = key[i]
            k = i - 1
            while k >= 0 and key[k] > v:
                key[k + 1] = key[k]
                k -= 1
            key[k + 1] = v
        nb = 0
        for i in range(n):
            if nb == 0 or cb[nb - 1] != key[i]:
                cb[nb] = key[i]
                h[nb, :] = 0.0
                nb += 1
        for i in range(n):                           # sums per bin (integers: exact in any order)
            e = e0 + i
            r = row[e]
            b = Xb[r, f]
            lo, hi = 0, nb
            while lo < hi:
                mid = (lo + hi) >> 1
                if cb[mid] < b:
                    lo = mid + 1
                else:
                    hi = mid
            if D:
                h[lo, 0] += 1.0
            if K:
                h[lo, D + y[r]] += w[e]
            else:
                h[lo, D] += w[e]
                h[lo, D + 1] += wy[e]
        return nb

    @pjit
    def split(H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above, o_occ):
        S, m = fpos.shape
        B, C = H.shape[2], H.shape[3]
        every = np.arange(B)
        for p in prange(S * m):
            s = p // m
            j = p - s * m
            cum = np.empty(C)
            v, b, wl, lo, hi, occ = scan(every, H[s, fpos[s, j]], B, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D,
                                         msl)
            o_val[s, j], o_b[s, j], o_wl[s, j], o_below[s, j], o_above[s, j], o_occ[s, j] = v, b, wl, lo, hi, occ

    @pjit
    def fused(Xb, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl, n_chunks,
              o_val, o_b, o_wl, o_below, o_above, o_occ):
        S, m = fsel.shape
        C = tot.shape[1]
        every = np.arange(B)
        for t in prange(n_chunks):                   # buffers once per chunk of nodes
            h = np.empty((m, B, C))
            cum = np.empty(C)
            cb = np.empty(B, dtype=np.int64)
            key = np.empty(B, dtype=np.int64)
            for s in range(S * t // n_chunks, S * (t + 1) // n_chunks):
                e0 = seg_start[s]
                n = seg_len[s]
                small = 4 * n < B
                if not small:
                    h[:, :, :] = 0.0
                    add_rows(Xb, row, w, wy, y, e0, e0 + n, fsel[s], K, D, h)
                for j in range(m):
                    if small:
                        nb = compact(Xb, row, w, wy, y, e0, n, fsel[s, j], K, D, key, cb, h[0])
                        res = scan(cb, h[0], nb, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D, msl)
                    else:
                        res = scan(every, h[j], B, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D, msl)
                    o_val[s, j], o_b[s, j], o_wl[s, j], o_below[s, j], o_above[s, j], o_occ[s, j] = res

    @pjit
    def move(Xb, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w, t_wy, t_wy2,
             n_left):
        for s in prange(starts.shape[0] - 1):
            f = feature[s]
            if f < 0:
                continue
            t = tbin[s]
            left = dest[s]
            right = starts[s]                  # the right elements wait in the slot's own scratch range
            for e in range(starts[s], starts[s + 1]):
                r = row[e]
                if Xb[r, f] <= t:
                    o_row[left] = r
                    o_w[left] = w[e]
                    if reg:
                        o_wy[left] = wy[e]
                        o_wy2[left] = wy2[e]
                    left += 1
                else:
                    t_row[right] = r
                    t_w[right] = w[e]
                    if reg:
                        t_wy[right] = wy[e]
                        t_wy2[right] = wy2[e]
                    right += 1
            n_left[s] = left - dest[s]
            for i in range(starts[s], right):
                o_row[left] = t_row[i]
                o_w[left] = t_w[i]
                if reg:
                    o_wy[left] = t_wy[i]
                    o_wy2[left] = t_wy2[i]
                left += 1

    @pjit
    def totals(row, w, wy, wy2, y, starts, K, D, tot, extra):
        for s in prange(starts.shape[0] - 1):
            for e in range(starts[s], starts[s + 1]):
                if D:
                    tot[s, 0] += 1.0
                if K:
                    tot[s, D + y[row[e]]] += w[e]
                else:
                    tot[s, D] += w[e]
                    tot[s, D + 1] += wy[e]
                    extra[s, 1] += wy2[e]
            extra[s, 0] = starts[s + 1] - starts[s]

    c_a = np.uint64(0xBF58476D1CE4E5B9)
    c_b = np.uint64(0x94D049BB133111EB)

    @jit
    def mix(z):
        z = (z ^ (z >> np.uint64(30))) * c_a
        z = (z ^ (z >> np.uint64(27))) * c_b
        return z ^ (z >> np.uint64(31))

    @pjit
    def orders(lead, trees, nodes, out):
        S, F = out.shape
        for s in prange(S):
            head = mix(lead ^ (np.uint64(trees[s]) * c_a))
            u = np.empty(F)
            for j in range(F):
                z = np.uint64(nodes[s] * F + j) * c_b + head
                z = mix(mix(z))
                u[j] = np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            for j in range(F):                       # stable insertion sort of the draws
                k = j - 1
                while k >= 0 and u[out[s, k]] > u[j]:
                    out[s, k + 1] = out[s, k]
                    k -= 1
                out[s, k + 1] = j

    @pjit
    def bins(X, table, lens, out):
        n, d = X.shape
        for i in prange(n):
            for j in range(d):
                x = np.float64(X[i, j])
                lo, hi = 0, lens[j]
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if table[j, mid] < x:
                        lo = mid + 1
                    else:
                        hi = mid
                out[i, j] = lo

    del numba
    return {"totals": totals, "orders": orders, "bins": bins, "hist": hist, "split": split, "fused": fused, "move": move}
