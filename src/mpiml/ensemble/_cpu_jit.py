"""The Numba kernels of :mod:`mpiml.ensemble._cpu_kernels`, at module level (imported on first use).

Longer than 800 lines because a kernel's callees must sit in its file (see below): a level of a tree thread
(:func:`level_head_serial`) calls the totals, the fused search and the level's numbers and decisions.

They live at module level, not in a function, so that Numba's on-disk cache finds them
again in every later process: kernels defined inside a function and calling each other
through closure cells got a new cache key per process and were compiled again by every
rank of every job (about 5 s a process on a 2-core machine).  Everything here is in one
file on purpose: Numba's cache is invalidated by this file's time stamp, and a kernel's
callees are compiled into it, so a change to any of them must reach all.
"""

import numpy as np

from ..utils._jit import numba

_nb = numba()

_jit = _nb.njit(cache=True, nogil=True)
_pjit = _nb.njit(cache=True, nogil=True, parallel=True)


@_jit
def add_rows(cols, row, w, wy, y, e0, e1, fs, K, D, h):
    """Sum the elements ``e0:e1`` into the ``(len(fs), B, C)`` histograms ``h`` of the features ``fs``
    (one feature at a time: its column of bins stays in cache while the node's rows are gathered)."""
    for j in range(fs.shape[0]):
        col = cols[fs[j]]
        hj = h[j]
        for e in range(e0, e1):
            r = row[e]
            b = col[r]
            if D:
                hj[b, 0] += 1.0
            if K:
                hj[b, D + y[r]] += w[e]
            else:
                hj[b, D] += w[e]
                hj[b, D + 1] += wy[e]


@_pjit
def hist(cols, row, w, wy, y, seg_start, seg_len, fsel, K, D, out):
    for i in _nb.prange(fsel.shape[0]):
        add_rows(cols, row, w, wy, y, seg_start[i], seg_start[i] + seg_len[i], fsel[i], K, D, out[i])


@_jit
def hist_serial(cols, row, w, wy, y, seg_start, seg_len, fsel, K, D, out):
    """:func:`hist` on the calling thread (the kernels of a thread that grows its own trees, see
    :func:`mpiml.ensemble._cpu_kernels.serial`; the parallel layer cannot be entered from two threads)."""
    for i in range(fsel.shape[0]):
        add_rows(cols, row, w, wy, y, seg_start[i], seg_start[i] + seg_len[i], fsel[i], K, D, out[i])


@_jit
def _gini_proxy(cum, tot, D, C, isw, WL, WR):
    """Gini's proxy of a cut (the left and right class weights' sums of squares over their totals): the
    scans of every bin and of occupied bins share it."""
    sl = 0.0
    sr = 0.0
    for c in range(D, C):
        lw = cum[c] * isw
        rw = (tot[c] - cum[c]) * isw
        sl += lw * lw
        sr += rw * rw
    return sl / WL + sr / WR


@_jit
def scan(cb, h, nb, B, tot, cum, mwl, has_mwl, sw, sy, K, D, msl):
    """Best split of one (node, feature) histogram: bins ``cb[:nb]`` (increasing) with sums ``h[:nb]``
    (a dense histogram: ``cb`` = 0..B-1; a compact one: its non-empty bins); the NumPy search's arithmetic."""
    C = h.shape[1]
    isw, isy = 1.0 / sw, 1.0 / sy
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
        # sw and sy are powers of two: multiplying by their inverses is the division, exactly
        WL = 0.0
        WR = 0.0
        if K:
            for c in range(D, C):
                WL += cum[c] * isw
                WR += (tot[c] - cum[c]) * isw
        else:
            WL = cum[D] * isw
            WR = (tot[D] - cum[D]) * isw
        if b == 0:
            wl0 = WL
        valid = WL > 0 and WR > 0
        if D:
            valid = valid and cum[0] >= msl and tot[0] - cum[0] >= msl
        if has_mwl:
            valid = valid and WL >= mwl and WR >= mwl
        if not valid:
            continue
        if K:
            proxy = _gini_proxy(cum, tot, D, C, isw, WL, WR)
        else:
            SL = cum[D + 1] * isy
            SR = (tot[D + 1] - cum[D + 1]) * isy
            proxy = SL * SL / WL + SR * SR / WR
        if proxy > best:
            best, best_b, best_wl = proxy, b, WL
            below, above, pending = b, B, True
    if best == -np.inf:                        # no valid split: bin 0, as an argmax over -inf
        best_b, best_wl = 0, wl0
        below, above = (0 if bin0 else -1), first_after0
    return best, best_b, best_wl, below, above, occupied


try:  # the count of trailing zero bits, one instruction (Numba's own intrinsic)
    from numba.cpython.unsafe.numbers import trailing_zeros as _tz
except ImportError:  # pragma: no cover - a Numba without it: a de Bruijn table
    _DEBRUIJN = np.array([0, 1, 2, 53, 3, 7, 54, 27, 4, 38, 41, 8, 34, 55, 48, 28, 62, 5, 39, 46, 44, 42, 22, 9,
                          24, 35, 59, 56, 49, 18, 29, 11, 63, 52, 6, 26, 37, 40, 33, 47, 61, 45, 43, 21, 23, 58, 17,
                          10, 51, 25, 36, 32, 60, 20, 57, 16, 50, 31, 19, 15, 30, 14, 13, 12], dtype=np.int64)

    @_jit
    def _tz(x):
        return _DEBRUIJN[((x & (~x + np.uint64(1))) * np.uint64(0x022FDD63CC95386D)) >> np.uint64(58)]


@_jit
def scan_occupied(cb, h, nb, B, tot, cum, mwl, has_mwl, sw, sy, K, D, msl):
    """:func:`scan` of a histogram whose ``nb`` bins are all non-empty (:func:`drain`'s): the same results
    with less work a bin.

    The weights are integers (fixed point) below 2**53, so a side's total weight is the same number summed
    in any order: it is kept as one running sum (``WL = cumW * isw`` is :func:`scan`'s sum over classes of
    ``cum[c] * isw``, exactly), and the sums of squares, which round, keep :func:`scan`'s order.  The
    nearest non-empty bins around the best are read from ``cb`` after the loop.
    """
    C = h.shape[1]
    isw, isy = 1.0 / sw, 1.0 / sy
    totW = 0.0
    if K:
        for c in range(D, C):
            totW += tot[c]
            cum[c] = 0.0
    else:
        totW = tot[D]
    cumW, cumY, cumN = 0.0, 0.0, 0.0
    totY = 0.0 if K else tot[D + 1]
    totN = tot[0] if D else 0.0
    best, best_k, best_wl = -np.inf, -1, 0.0
    for k in range(nb):
        if K:
            for c in range(D, C):
                v = h[k, c]
                cum[c] += v
                cumW += v
        else:
            cumW += h[k, D]
            cumY += h[k, D + 1]
        if D:
            cumN += h[k, 0]
        WL = cumW * isw
        WR = (totW - cumW) * isw
        if not (WL > 0 and WR > 0):
            continue
        if D and not (cumN >= msl and totN - cumN >= msl):
            continue
        if has_mwl and not (WL >= mwl and WR >= mwl):
            continue
        if K:
            proxy = _gini_proxy(cum, tot, D, C, isw, WL, WR)
        else:
            SL = cumY * isy
            SR = (totY - cumY) * isy
            proxy = SL * SL / WL + SR * SR / WR
        if proxy > best:
            best, best_k, best_wl = proxy, k, WL
    if best_k >= 0:
        return best, cb[best_k], best_wl, cb[best_k], (cb[best_k + 1] if best_k + 1 < nb else B), nb
    # no valid split: bin 0, as an argmax over -inf
    bin0 = nb > 0 and cb[0] == 0
    wl0 = 0.0
    if bin0:
        for c in range(D, C) if K else range(D, D + 1):
            wl0 += h[0, c] * isw
    first = 1 if bin0 else 0
    return -np.inf, 0, wl0, (0 if bin0 else -1), (cb[first] if first < nb else B), nb


@_jit
def accumulate(cols, row, w, wy, y, e0, n, fs, K, D, mask, acc):
    """The sums of the elements ``e0:e0+n`` in the bins of the features ``fs`` (``acc[j]``, ``(B, C)`` each, at
    the bin's row) and the bins they touch (bitmap ``mask[j]``, 64 bins a word).

    One pass over the elements for every feature: an element's row, weight and class are read once and
    the features' updates are independent of each other (the histogram of one feature alone waits on
    its own last update whenever consecutive rows share a bin).
    """
    m = fs.shape[0]
    for e in range(e0, e0 + n):
        r = row[e]
        we = w[e]
        c = D + y[r] if K else D
        wye = 0.0 if K else wy[e]
        for j in range(m):
            b = cols[fs[j], r]
            mask[j, b >> 6] |= np.uint64(1) << np.uint64(b & 63)
            if D:
                acc[j, b, 0] += 1.0
            acc[j, b, c] += we
            if not K:
                acc[j, b, D + 1] += wye


@_jit
def drain(mask, acc, cb, h):
    """The non-empty bins in increasing order (``cb``) and their sums (rows of ``h``) from one feature's
    bitmap and sums (:func:`accumulate`), which are left all zero again; returns their number.

    The set bits of the bitmap give the bins in order, so the cost is the bins occupied, never all ``B``.
    Every element has a positive weight, so a touched bin is a non-empty one.
    """
    C = acc.shape[1]
    nb = 0
    for q in range(mask.shape[0]):
        x = mask[q]
        while x:
            b = (q << 6) + np.int64(_tz(x))
            x &= x - np.uint64(1)
            cb[nb] = b
            for c in range(C):
                h[nb, c] = acc[b, c]
                acc[b, c] = 0.0
            nb += 1
        mask[q] = 0
    return nb


@_jit
def accumulate_classes(cols, row, w, y, e0, n, fs, mask, acc):
    """:func:`accumulate` of classification without the row-count channel (``D == 0``): the class is the
    channel, no test per element."""
    m = fs.shape[0]
    for e in range(e0, e0 + n):
        r = row[e]
        we = w[e]
        c = y[r]
        for j in range(m):
            b = cols[fs[j], r]
            mask[j, b >> 6] |= np.uint64(1) << np.uint64(b & 63)
            acc[j, b, c] += we


@_jit
def drain_scan(mask, acc, B, tot, K, mwl, has_mwl, sw, sy):
    """:func:`scan_occupied` of :func:`drain`'s bins, in one pass over the bitmap, for the two cases of two
    channels without a row count (``D == 0``): two classes (gini, ``K == 2``) and one output's squared error
    (``K == 0``).  The running sums stay in registers (the general scan keeps them in an array: about 40
    cycles a bin, half the time of a fused level); every score is the same IEEE expression in the same
    order as :func:`scan_occupied`'s and :func:`_gini_proxy`'s, so the results are equal bit for bit.
    ``acc`` and ``mask`` are left all zero, as :func:`drain` leaves them."""
    isw, isy = 1.0 / sw, 1.0 / sy
    t0 = tot[0]
    t1 = tot[1]
    totW = (0.0 + t0) + t1 if K else t0
    c0 = 0.0
    c1 = 0.0
    best, best_b, best_wl = -np.inf, -1, 0.0
    above, pending = B, False
    occupied = 0
    first, second = -1, B          # the first occupied bin, the first occupied bin other than 0
    wl0 = 0.0
    for q in range(mask.shape[0]):
        x = mask[q]
        while x:
            b = (q << 6) + np.int64(_tz(x))
            x &= x - np.uint64(1)
            h0 = acc[b, 0]
            h1 = acc[b, 1]
            acc[b, 0] = 0.0
            acc[b, 1] = 0.0
            occupied += 1
            if first < 0:
                first = b
                if b == 0:
                    wl0 = (0.0 + h0 * isw) + h1 * isw if K else 0.0 + h0 * isw
                else:
                    second = b
            elif second == B:
                second = b
            if pending:
                above = b
                pending = False
            c0 += h0
            c1 += h1
            cumW = c0 + c1 if K else c0            # integers below 2**53: the class sums' sum, exactly
            WL = cumW * isw
            WR = (totW - cumW) * isw
            if not (WL > 0 and WR > 0):
                continue
            if has_mwl and not (WL >= mwl and WR >= mwl):
                continue
            if K:
                l0 = c0 * isw
                l1 = c1 * isw
                r0 = (t0 - c0) * isw
                r1 = (t1 - c1) * isw
                proxy = ((0.0 + l0 * l0) + l1 * l1) / WL + ((0.0 + r0 * r0) + r1 * r1) / WR
            else:
                SL = c1 * isy
                SR = (t1 - c1) * isy
                proxy = SL * SL / WL + SR * SR / WR
            if proxy > best:
                best, best_b, best_wl = proxy, b, WL
                above, pending = B, True
        mask[q] = 0
    if best_b >= 0:
        return best, best_b, best_wl, best_b, above, occupied
    # no valid split: bin 0, as an argmax over -inf
    return -np.inf, 0, wl0, (0 if first == 0 else -1), second, occupied


@_jit
def _split_pair(p, every, H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above, o_occ):
    m = fpos.shape[1]
    B, C = H.shape[2], H.shape[3]
    s = p // m
    j = p - s * m
    cum = np.empty(C)
    v, b, wl, lo, hi, occ = scan(every, H[s, fpos[s, j]], B, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D, msl)
    o_val[s, j], o_b[s, j], o_wl[s, j], o_below[s, j], o_above[s, j], o_occ[s, j] = v, b, wl, lo, hi, occ


@_pjit
def split(H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above, o_occ):
    every = np.arange(H.shape[2])
    for p in _nb.prange(fpos.shape[0] * fpos.shape[1]):
        _split_pair(p, every, H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above,
                    o_occ)


@_jit
def split_serial(H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above, o_occ):
    every = np.arange(H.shape[2])
    for p in range(fpos.shape[0] * fpos.shape[1]):
        _split_pair(p, every, H, fpos, tot, mwl, has_mwl, sw, sy, K, D, msl, o_val, o_b, o_wl, o_below, o_above,
                    o_occ)


@_jit
def _fused_part(p, P, cols, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl, nodes,
                bounds, o_val, o_b, o_wl, o_below, o_above, o_occ):
    """Part ``p`` of ``P`` of :func:`fused`: an equal run of the chunks, its buffers allocated once."""
    S, m = fsel.shape
    C = tot.shape[1]
    fast = D == 0 and (K == 2 or K == 0)          # two channels: drain_scan
    nc = bounds.shape[0] - 1
    acc = np.zeros((m, B, C))                    # zero between nodes: drain() clears what it reads
    mask = np.zeros((m, (B + 63) >> 6), dtype=np.uint64)
    h = np.empty((B, C))
    cum = np.empty(C)
    cb = np.empty(B, dtype=np.int64)
    for t in range(p * nc // P, (p + 1) * nc // P):
        for i in range(bounds[t], bounds[t + 1]):
            s = nodes[i]
            if K and D == 0:
                accumulate_classes(cols, row, w, y, seg_start[s], seg_len[s], fsel[s], mask, acc)
            else:
                accumulate(cols, row, w, wy, y, seg_start[s], seg_len[s], fsel[s], K, D, mask, acc)
            for j in range(m):
                if fast:
                    res = drain_scan(mask[j], acc[j], B, tot[s], K, mwl[s], has_mwl, sw, sy)
                else:
                    nb = drain(mask[j], acc[j], cb, h)
                    res = scan_occupied(cb, h, nb, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D, msl)
                o_val[s, j], o_b[s, j], o_wl[s, j], o_below[s, j], o_above[s, j], o_occ[s, j] = res


@_pjit
def fused(cols, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl, nodes, bounds,
          o_val, o_b, o_wl, o_below, o_above, o_occ, P):
    """The nodes ``nodes[bounds[t]:bounds[t + 1]]`` in chunk ``t`` (chunks of about equal work), each node's
    histograms in a per-thread buffer, searched at once.  ``P`` parts (the threads) take equal runs of
    chunks, as a ``prange`` over the chunks would hand them out, and allocate their buffers once (up to
    1024 chunks a level each allocated and zeroed its own)."""
    for p in _nb.prange(P):
        _fused_part(p, P, cols, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl,
                    nodes, bounds, o_val, o_b, o_wl, o_below, o_above, o_occ)


@_jit
def fused_serial(cols, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl, nodes,
                 bounds, o_val, o_b, o_wl, o_below, o_above, o_occ, P):
    """:func:`fused` on the calling thread."""
    for p in range(P):
        _fused_part(p, P, cols, row, w, wy, y, seg_start, seg_len, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl,
                    nodes, bounds, o_val, o_b, o_wl, o_below, o_above, o_occ)


@_pjit
def fused_parts(cols, row, w, wy, y, fsel, B, tot, mwl, has_mwl, sw, sy, K, D, msl, nodes, first, p_start, p_len,
                o_val, o_b, o_wl, o_below, o_above, o_occ):
    """Nodes too big for one thread: node ``nodes[i]``'s elements are cut into the parts
    ``first[i]:first[i + 1]`` (``p_start``, ``p_len``), summed in parallel into their own histograms, which are
    then added (integers: the same sums in any order) and searched in parallel over (node, feature)."""
    S, m = fsel.shape
    C = tot.shape[1]
    W = (B + 63) >> 6
    P = p_start.shape[0]
    acc = np.zeros((P, m, B, C))
    mask = np.zeros((P, m, W), dtype=np.uint64)
    for p in _nb.prange(P):
        i = 0
        while first[i + 1] <= p:
            i += 1
        if K and D == 0:
            accumulate_classes(cols, row, w, y, p_start[p], p_len[p], fsel[nodes[i]], mask[p], acc[p])
        else:
            accumulate(cols, row, w, wy, y, p_start[p], p_len[p], fsel[nodes[i]], K, D, mask[p], acc[p])
    for q in _nb.prange(nodes.shape[0] * m):
        i = q // m
        j = q - i * m
        s = nodes[i]
        p0 = first[i]
        for p in range(p0 + 1, first[i + 1]):       # into the first part: its bitmap and its sums
            for wq in range(W):
                x = mask[p, j, wq]
                mask[p0, j, wq] |= x
                while x:
                    b = (wq << 6) + np.int64(_tz(x))
                    x &= x - np.uint64(1)
                    for c in range(C):
                        acc[p0, j, b, c] += acc[p, j, b, c]
        if D == 0 and (K == 2 or K == 0):
            res = drain_scan(mask[p0, j], acc[p0, j], B, tot[s], K, mwl[s], has_mwl, sw, sy)
        else:
            h = np.empty((B, C))
            cum = np.empty(C)
            cb = np.empty(B, dtype=np.int64)
            nb = drain(mask[p0, j], acc[p0, j], cb, h)
            res = scan_occupied(cb, h, nb, B, tot[s], cum, mwl[s], has_mwl, sw, sy, K, D, msl)
        o_val[s, j], o_b[s, j], o_wl[s, j], o_below[s, j], o_above[s, j], o_occ[s, j] = res


@_jit
def _move_slot(s, cols, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w, t_wy,
               t_wy2, n_left):
    f = feature[s]
    if f < 0:
        return
    t = tbin[s]
    col = cols[f]
    left = dest[s]
    right = starts[s]                  # the right elements wait in the slot's own scratch range
    for e in range(starts[s], starts[s + 1]):
        r = row[e]
        if col[r] <= t:
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


@_pjit
def move(cols, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w, t_wy, t_wy2,
         n_left):
    for s in _nb.prange(starts.shape[0] - 1):
        _move_slot(s, cols, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w,
                   t_wy, t_wy2, n_left)


@_jit
def move_serial(cols, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w, t_wy,
                t_wy2, n_left):
    for s in range(starts.shape[0] - 1):
        _move_slot(s, cols, row, w, wy, wy2, reg, starts, feature, tbin, dest, o_row, o_w, o_wy, o_wy2, t_row, t_w,
                   t_wy, t_wy2, n_left)


@_jit
def _total_slot(s, row, w, wy, wy2, y, starts, K, D, tot, extra):
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


@_pjit
def totals(row, w, wy, wy2, y, starts, K, D, tot, extra):
    for s in _nb.prange(starts.shape[0] - 1):
        _total_slot(s, row, w, wy, wy2, y, starts, K, D, tot, extra)


@_jit
def totals_serial(row, w, wy, wy2, y, starts, K, D, tot, extra):
    for s in range(starts.shape[0] - 1):
        _total_slot(s, row, w, wy, wy2, y, starts, K, D, tot, extra)


_C_A = np.uint64(0xBF58476D1CE4E5B9)
_C_B = np.uint64(0x94D049BB133111EB)


@_jit
def mix(z):
    z = (z ^ (z >> np.uint64(30))) * _C_A
    z = (z ^ (z >> np.uint64(27))) * _C_B
    return z ^ (z >> np.uint64(31))


@_jit
def _order_slot(s, lead, trees, nodes, out, shift, packed):
    F = out.shape[1]
    head = mix(lead ^ (np.uint64(trees[s]) * _C_A))
    if packed:
        # ascending (draw, feature) words: the stable order of the draws.  The draws are uniform, so
        # placing each word by its top bits (a counting sort on them) leaves the insertion sort that
        # follows about one move a word instead of F / 4
        key = np.empty(F, dtype=np.uint64)
        tmp = np.empty(F, dtype=np.uint64)
        count = np.zeros((1 << shift) + 1, dtype=np.int64)     # words by their top bits: < 2**shift
        for j in range(F):
            z = np.uint64(nodes[s] * F + j) * _C_B + head
            v = ((mix(mix(z)) >> np.uint64(11)) << np.uint64(shift)) | np.uint64(j)
            tmp[j] = v
            count[np.int64(v >> np.uint64(53)) + 1] += 1
        for q in range(1 << shift):
            count[q + 1] += count[q]
        for j in range(F):
            q = np.int64(tmp[j] >> np.uint64(53))
            key[count[q]] = tmp[j]
            count[q] += 1
        for j in range(1, F):
            v = key[j]
            k = j - 1
            while k >= 0 and key[k] > v:
                key[k + 1] = key[k]
                k -= 1
            key[k + 1] = v
        lo = (np.uint64(1) << np.uint64(shift)) - np.uint64(1)
        for j in range(F):
            out[s, j] = np.int64(key[j] & lo)
        return
    u = np.empty(F)
    for j in range(F):
        z = np.uint64(nodes[s] * F + j) * _C_B + head
        z = mix(mix(z))
        u[j] = np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    for j in range(F):                       # stable insertion sort of the draws
        k = j - 1
        while k >= 0 and u[out[s, k]] > u[j]:
            out[s, k + 1] = out[s, k]
            k -= 1
        out[s, k + 1] = j


@_jit
def _order_shift(F):
    shift = 0
    while (1 << shift) < F:
        shift += 1
    return shift


@_pjit
def orders(lead, trees, nodes, out):
    shift = _order_shift(out.shape[1])
    packed = shift <= 11                         # a draw's 53 bits and the feature's index in one word
    for s in _nb.prange(out.shape[0]):
        _order_slot(s, lead, trees, nodes, out, shift, packed)


@_jit
def orders_serial(lead, trees, nodes, out):
    shift = _order_shift(out.shape[1])
    packed = shift <= 11
    for s in range(out.shape[0]):
        _order_slot(s, lead, trees, nodes, out, shift, packed)


@_pjit
def transpose(a, out):
    """``out[j, i] = a[i, j]``, by blocks of rows in parallel (a block's rows are read once, in cache)."""
    n, d = a.shape
    for blk in _nb.prange((n + 255) >> 8):
        i0 = blk << 8
        i1 = min(n, i0 + 256)
        for j in range(d):
            for i in range(i0, i1):
                out[j, i] = a[i, j]


@_pjit
def bins(X, table, lens, out):
    """``#(table[j] < x)`` of every entry, by blocks of rows (a block's columns are read one at a time, with
    that feature's edges in cache).  Up to 255 edges: a binary search without branches, unrolled, over
    rows of ``table`` padded with +inf to 256 (the comparisons become arithmetic: a branch mispredicted
    half the time, and a loop over the steps, made it 5x slower); more: a plain binary search."""
    n, d = X.shape
    P = table.shape[1]
    for blk in _nb.prange((n + 511) >> 9):
        i0 = blk << 9
        i1 = min(n, i0 + 512)
        for j in range(d):
            t = table[j]
            if P == 256:
                for i in range(i0, i1):
                    x = np.float64(X[i, j])
                    lo = 128 * np.int64(t[127] < x)
                    lo += 64 * np.int64(t[lo + 63] < x)
                    lo += 32 * np.int64(t[lo + 31] < x)
                    lo += 16 * np.int64(t[lo + 15] < x)
                    lo += 8 * np.int64(t[lo + 7] < x)
                    lo += 4 * np.int64(t[lo + 3] < x)
                    lo += 2 * np.int64(t[lo + 1] < x)
                    lo += np.int64(t[lo] < x)
                    out[i, j] = lo + np.int64(t[lo] < x)
            else:
                for i in range(i0, i1):
                    x = np.float64(X[i, j])
                    lo, hi = 0, lens[j]
                    while lo < hi:
                        mid = (lo + hi) >> 1
                        if t[mid] < x:
                            lo = mid + 1
                        else:
                            hi = mid
                    out[i, j] = lo


@_jit
def boot_guide(cum, lo, S, N, Q, base, out):
    """Per local row slot ``i`` (global ``lo + i``: bucket ``j`` of block ``b``), the first local row whose
    cumulated weight exceeds the bucket's share of the block's weight: where a draw of that bucket starts
    looking (any start is corrected by :func:`boot`, so this needs no exactness)."""
    n = cum.shape[0]
    r = 0
    for i in range(n):
        g = lo + i
        b = g // S
        size = min(S, N - b * S)
        t = base[b] + (g - b * S) * (Q[b] / size)
        while r < n - 1 and cum[r] <= t:
            r += 1
        out[i] = r


@_jit
def _first_above(cum, v, lo, hi):
    while lo < hi:                               # the first row whose cumulated weight exceeds v
        mid = (lo + hi) >> 1
        if cum[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def boot(lead, key, k0, k1, first, Q, base, b0, g0, S, N, weighted, cum, guide, start, c_lo, c_hi, out):
    head = mix(lead ^ (np.uint64(key) * _C_A))
    n = out.shape[0]
    j = 0
    for k in range(k0, k1):
        while k >= first[j + 1]:                 # the draws run block after block
            j += 1
        z = np.uint64(k) * _C_B + head
        z = mix(mix(z))
        u = np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        q = Q[b0 + j]
        off = np.floor(u * q)
        if off > q - 1.0:
            off = q - 1.0
        v = base[b0 + j] + off
        if weighted:
            if v >= c_lo and v < c_hi:
                b = b0 + j
                blk_lo, blk_hi = max(0, b * S - g0), min(n, (b + 1) * S - g0)    # the block's rows
                size = min(S, N - b * S)
                jj = np.int64(u * size)
                if jj >= size:
                    jj = size - 1
                idx = b * S + jj - g0            # the guide of the draw's bucket, when the slot is ours
                if idx >= 0 and idx < n:
                    r = min(max(guide[idx + start] - start, blk_lo), blk_hi - 1)
                    if r > blk_lo and cum[r - 1] > v:
                        r = _first_above(cum, v, blk_lo, r)
                    else:
                        while cum[r] <= v:
                            r += 1
                else:
                    r = _first_above(cum, v, blk_lo, blk_hi)
                out[r] += 1.0
        else:
            r = np.int64(v) - g0
            if r >= 0 and r < n:
                out[r] += 1.0


# ---------------------------------------------------------------------- a level's numbers and decisions
# A level of the fused host path (a rank that grows alone) made about a hundred NumPy calls around its compiled
# search: the nodes' numbers from their channel totals (``_split.node_stats``), the nodes that are leaves by them
# (``_split.leaf_by_own_numbers``), the best feature of each node (``_split.choose``), the decisions
# (``_split.decide``) and the records (``TreeGrower._record``).  With several threads of a rank each growing its
# own trees (two a thread at 8 ranks of 8 threads and 128 trees), that Python holds the rank's one GIL between
# the threads' kernels: 1.6-1.9 ms a level a thread.  Here they are compiled, for the criteria of the compiled
# search (gini with fewer than 8 classes, squared error with one output), with the IEEE operations of the NumPy
# code in the same order (sums over classes left to right, as NumPy's for fewer than 8; ``np.maximum(x, 0.0)``
# keeps ``x`` when ``x >= 0`` or NaN): the same decisions and trees (``MPIML_RF_DECIDE_KERNEL=0`` keeps NumPy's).

@_jit
def _max0(x):
    """``np.maximum(x, 0.0)``."""
    return x if (x >= 0.0 or np.isnan(x)) else 0.0


@_jit
def node_numbers(tot, ex, root_w, has_root, K, D, sw, sy, s2, y_tol, mwf, two_mwf, min_split, two_msl,
                 W, parent, impurity, value, pure, rw, mwl, skip):
    """Per node, from its channel totals ``tot`` (S, C) and extras ``ex`` (S, E): the weight, the score of no
    split, the impurity, the value, purity, the root's weight, the smallest weight of a child (``mwf`` > 0) and
    whether it is a leaf by these numbers alone (:func:`._split.node_stats` then
    :func:`._split.leaf_by_own_numbers`)."""
    S, C = tot.shape
    for i in range(S):
        if K:
            w = 0.0
            sq = 0.0
            nz = 0
            for c in range(D, C):
                x = tot[i, c] / sw
                w += x
                sq += x * x
                if x > 0:
                    nz += 1
            wd = w if w > 0 else 1.0
            pp = 0.0
            for c in range(D, C):
                p = (tot[i, c] / sw) / wd
                value[i, c - D] = p
                pp += p * p
            parent[i] = sq / wd
            impurity[i] = 1.0 - pp
            pure[i] = nz <= 1
        else:
            w = tot[i, D] / sw
            s1 = tot[i, D + 1] / sy
            wd = w if w > 0 else 1.0
            mean = s1 / wd
            parent[i] = s1 * s1 / wd
            impurity[i] = _max0(ex[i, 1] / s2 / wd - mean * mean)
            value[i, 0] = mean
            pure[i] = impurity[i] <= y_tol
        W[i] = w
        r = root_w[i] if has_root else w
        rw[i] = r
        if mwf > 0:
            mwl[i] = mwf * r
        n = ex[i, 0]
        small = pure[i] or n < min_split or n < two_msl
        if mwf > 0:
            small = small or w < two_mwf * r
        skip[i] = small


@_jit
def decisions(val, b, wl, below, above, occ, order, skip, parent, W, rw, at_depth, mid,
              o_val, o_j, o_b, o_wl, o_wr, o_below, o_above, o_varying, o_feature, o_leaf, o_retry, o_decrease):
    """Per node, the first feature of the largest score among its candidates (:func:`._split.choose`) and the
    decisions of :func:`._split.decide` (``skip``: a leaf by its own numbers; ``mid``: min_impurity_decrease)."""
    S, m = val.shape
    for i in range(S):
        j = 0
        best = val[i, 0]
        varying = occ[i, 0] >= 2
        for k in range(1, m):
            if val[i, k] > best:
                best = val[i, k]
                j = k
            if occ[i, k] >= 2:
                varying = True
        o_val[i] = best
        o_j[i] = j
        o_b[i] = b[i, j]
        o_wl[i] = wl[i, j]
        o_wr[i] = W[i] - wl[i, j]
        o_below[i] = below[i, j]
        o_above[i] = above[i, j]
        o_varying[i] = varying
        o_feature[i] = order[i, j]
        finite = np.isfinite(best)
        decrease = best - parent[i] if finite else 0.0
        weak = not finite
        if mid > 0:
            r = rw[i] if rw[i] > 0 else 1.0
            weak = weak or decrease / r + 1e-7 < mid       # (gini, squared error: no scale)
        leaf = weak or skip[i] or at_depth
        o_leaf[i] = leaf
        o_retry[i] = leaf and not varying and not skip[i] and not at_depth
        o_decrease[i] = 0.0 if leaf else _max0(decrease)


@_jit
def record(leaf, feature, best_b, below, above, decrease, missing_left, has_missing, k, first_child, vals, edges,
           exact, B, o_feature, o_threshold, o_left, o_right, o_decrease, o_missing, n_split):
    """A level's node records (:meth:`._grower.TreeGrower._record` with :func:`._split.thresholds`): per node its
    feature (-2 for a leaf), threshold (-2.0), children (numbered after the tree's current level, ``first_child``
    per tree, in the order of its split nodes), decrease and missing-value side; ``n_split`` per tree (``k`` nodes
    of the level each)."""
    E = edges.shape[1]
    i = 0
    for t in range(k.shape[0]):
        done = 0
        for _ in range(k[t]):
            if leaf[i]:
                o_feature[i] = -2
                o_threshold[i] = -2.0
                o_left[i] = -1
                o_right[i] = -1
                o_decrease[i] = 0.0
                o_missing[i] = False
            else:
                f = feature[i]
                b = best_b[i]
                thr = edges[f, min(b, E - 1)]
                lo, hi = below[i], above[i]
                if exact[f] and lo >= 0 and hi < B and not np.isnan(vals[f, hi]):
                    vlo, vhi = vals[f, lo], vals[f, hi]
                    mid = (vlo + vhi) / 2.0
                    thr = vlo if mid >= vhi else mid       # adjacent floats: the midpoint rounds up
                o_feature[i] = f
                o_threshold[i] = thr
                o_left[i] = first_child[t] + 2 * done
                o_right[i] = first_child[t] + 2 * done + 1
                o_decrease[i] = decrease[i]
                o_missing[i] = has_missing and missing_left[i]
                done += 1
            i += 1
        n_split[t] = done


@_jit
def level_head(cols, row, w, wy, wy2, y, starts, lead, trees, nodes_of, perm, m, B, K, D, sw, sy, s2, y_tol, mwf,
               min_split, msl, root_w, has_root, at_depth, mid, tot, extra, W, parent, impurity, value, pure, rw, mwl,
               skip, nodes, c_val, c_b, c_wl, c_below, c_above, c_occ, o_val, o_j, o_b, o_wl, o_wr, o_below, o_above,
               o_varying, o_feature, o_leaf, o_retry, o_decrease):
    """A level of one thread's trees up to its decisions, in one call: the slots' totals (:func:`totals_serial`),
    their numbers (:func:`node_numbers`), the feature orders (:func:`orders_serial`) and the fused search of the
    nodes that are not leaves by those numbers (as :func:`fused_serial` on one chunk; a leaf gets no valid
    candidate and the identity order, which nothing reads: about half the nodes of a deep level) and the
    decisions (:func:`decisions`).  The outputs are zeroed or written whole here; ``nodes`` is scratch."""
    S = starts.shape[0] - 1
    F = perm.shape[1]
    for s in range(S):
        for c in range(tot.shape[1]):
            tot[s, c] = 0.0
        for c in range(extra.shape[1]):
            extra[s, c] = 0.0
        _total_slot(s, row, w, wy, wy2, y, starts, K, D, tot, extra)
    node_numbers(tot, extra, root_w, has_root, K, D, sw, sy, s2, y_tol, mwf, 2 * mwf, min_split, 2 * msl, W, parent,
                 impurity, value, pure, rw, mwl, skip)
    shift = _order_shift(F)
    packed = shift <= 11
    n = 0
    for s in range(S):
        if skip[s]:
            for j in range(F):
                perm[s, j] = j
            for j in range(m):
                c_val[s, j] = -np.inf
                c_b[s, j] = 0
                c_wl[s, j] = 0.0
                c_below[s, j] = -1
                c_above[s, j] = B
                c_occ[s, j] = 0
        else:
            _order_slot(s, lead, trees, nodes_of, perm, shift, packed)
            nodes[n] = s
            n += 1
    order = np.ascontiguousarray(perm[:, :m])          # (the search's layout: the kernels' one compilation)
    if n:
        bounds = np.zeros(2, dtype=np.int64)
        bounds[1] = n
        _fused_part(0, 1, cols, row, w, wy, y, starts[:-1], starts[1:] - starts[:-1], order, B, tot, mwl, mwf > 0,
                    sw, sy, K, D, np.float64(msl), nodes[:n], bounds, c_val, c_b, c_wl, c_below, c_above, c_occ)
    decisions(c_val, c_b, c_wl, c_below, c_above, c_occ, order, skip, parent, W, rw, at_depth, mid, o_val, o_j, o_b,
              o_wl, o_wr, o_below, o_above, o_varying, o_feature, o_leaf, o_retry, o_decrease)
