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
  children's segments;
* :func:`segment_totals`, :func:`feature_orders`, :func:`apply_bins`,
  :func:`bootstrap_counts`: the per-node totals, the per-node feature orders
  (the same hash draws, a stable sort), the bins of the rows and a tree's
  bootstrap counts (the same draws as :mod:`._bootstrap`'s array path);
* :func:`level_numbers`, :func:`level_decisions`, :func:`level_record`: a level's node numbers, decisions
  and records (the NumPy code of :mod:`._split` and the grower's records, the same IEEE operations in the
  same order), and :func:`level_head` on one thread: a level's totals, numbers, orders, search and
  decisions in one call (a level's Python held the GIL that a rank's tree threads share).

The bins come as columns ``(n_features, n_rows)``: a node's rows are gathered
from one feature's column at a time, which stays in cache.

Numba compiles each kernel (:mod:`._cpu_jit`) at its first call and caches
the machine code on disk (``cache=True``), so only the first fit on a machine
pays the compilation.  Nothing is imported or compiled at import.
"""

import importlib.util
import os
import threading

import numpy as np

__all__ = ["enabled", "thread_count", "apply_bins", "segment_totals", "feature_orders", "build_histograms",
           "split_candidates", "node_candidates", "partition", "bootstrap_counts", "bootstrap_guide", "level_numbers",
           "level_decisions", "level_record", "level_head"]

_KERNELS = None
_SERIAL = {}            # the kernels of a thread that runs them on itself (see serial)
_THREAD = threading.local()
_UNSET = object()


def enabled():
    """Whether the host path uses these kernels: Numba importable and ``MPIML_RF_CPU_KERNEL`` not ``0``
    (the NumPy path then, with the same trees)."""
    if os.environ.get("MPIML_RF_CPU_KERNEL", "1") == "0":
        return False
    # found, not imported: the first import of Numba is mpiml.utils._jit's, which sets its cache folder
    # (MPIML_KERNEL_CACHE) before Numba reads it
    return importlib.util.find_spec("numba") is not None


def thread_count():
    """Threads of this rank's kernels: the limit of :mod:`mpiml.utils._threads` (this rank's share of
    the node's cores, or the user's ``OMP_NUM_THREADS``) once set, else Numba's own count; 1 in a thread
    that runs the kernels on itself (:func:`serial`)."""
    if getattr(_THREAD, "serial", False):
        return 1
    from ..utils._threads import numba_threads

    return numba_threads() or _jit_numba().get_num_threads()


class serial:
    """``with serial():`` the calling thread runs the kernels on itself (their ``*_serial`` twins): for a rank
    whose threads each grow their own trees (Numba's parallel layer takes one caller at a time)."""

    def __enter__(self):
        self._before = getattr(_THREAD, "serial", False)
        _THREAD.serial = True
        return self

    def __exit__(self, *exc):
        _THREAD.serial = self._before
        return False


def _jit_numba():
    from ..utils._jit import numba

    return numba()


def _kernels():
    """The compiled kernels (:mod:`._cpu_jit`, imported on first use with Numba, its threading layer and
    this rank's thread count set by :mod:`mpiml.utils._jit`)."""
    global _KERNELS
    if _KERNELS is None:
        from . import _cpu_jit

        _KERNELS = {name: getattr(_cpu_jit, name) for name in
                    ("totals", "orders", "bins", "hist", "split", "fused", "fused_parts", "move", "boot",
                     "boot_guide", "transpose", "node_numbers", "decisions", "record", "level_head")}
        _SERIAL.update(_KERNELS)
        _SERIAL.update({name: getattr(_cpu_jit, name + "_serial") for name in ("totals", "orders", "hist", "fused",
                                                                               "move", "split")})
    if getattr(_THREAD, "serial", False):
        return _SERIAL
    # the thread count of the calling thread (Numba's is per thread), set again only when this rank's limit
    # changed: setting it costs ~0.1 ms, 5 % of a small fit's host time at five kernel calls a level
    from ..utils._threads import numba_threads

    n = numba_threads()
    if getattr(_THREAD, "threads", _UNSET) != n:
        _jit_numba()
        _THREAD.threads = n
    return _KERNELS


def sort_rows(a):
    """Sort every row of ``a`` in place (``a.sort(axis=1)``, the same result), the rows spread over this rank's
    threads when it has several: the bin edges' sort of every feature's sample was one thread's work on
    every rank (0.13 s of a 1.9 s forest fit on one thread).  NumPy's sort (vectorised, and it releases the
    GIL) on a pool of Python threads, one row at a time."""
    threads = min(thread_count() if enabled() else 1, a.shape[0]) if a.ndim == 2 else 1
    if threads <= 1 or a.size < (1 << 16):
        a.sort(axis=1)
        return a
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: a[i].sort(), range(a.shape[0])))
    return a


def sorted_columns(sample):
    """The columns of ``sample`` (``(n, d)``) as rows of a new float64 array ``(d, n)``, each sorted (NumPy's
    order: NaN last): the bin edges' input.  The transposing copy (a compiled kernel, by blocks of rows in
    parallel) and the sorts (:func:`sort_rows`) on the rank's threads: 0.5 s on one thread for 2e5 x 32 rows,
    the same on every rank of a forest grown tree-parallel."""
    a = np.asarray(sample, dtype=np.float64)
    if a.ndim == 2 and a.size >= (1 << 16) and a.flags.c_contiguous and enabled():
        cols = np.empty((a.shape[1], a.shape[0]))
        _kernels()["transpose"](a, cols)
    else:
        cols = np.array(a.T, order="C", copy=True)
    return sort_rows(cols)


def apply_bins(X, edges, dtype):
    """Bin index of every entry of ``X`` (host rows): ``#(edges[j] < x)``, as ``searchsorted(side="left")``."""
    n, d = X.shape
    most = max((len(e) for e in edges), default=0)
    # up to 255 edges: rows of 256, the last +inf (never below x), for the kernel's unrolled search
    table = np.full((d, 256 if most < 256 else most), np.inf)
    for j, e in enumerate(edges):
        table[j, :len(e)] = e
    lens = np.array([len(e) for e in edges], dtype=np.int64)
    out = np.empty((n, d), dtype=dtype)
    if n and d:
        _kernels()["bins"](X, table, lens, out)
    return out


def build_histograms(cols, row, w, wy, y, seg_start, seg_len, fsel, n_bins, n_classes, count_rows):
    """Histograms ``(segments, FH, bins, channels)`` (float64) of element segments, as the NumPy path's.

    Parameters as :func:`mpiml.kernels.histograms.build_histograms` (host arrays), except that the
    bins come as ``cols``, the ``(n_features, n_rows)`` columns (a node's rows are gathered from
    one column at a time, which stays in cache): ``wy`` None for classification, ``y`` None for
    regression.
    """
    k = _kernels()
    n, FH = len(seg_len), int(fsel.shape[1])
    C = int(count_rows) + (n_classes if n_classes else 2)
    out = np.zeros((n, FH, n_bins, C), dtype=np.float64)
    if n == 0 or FH == 0:
        return out
    dummy_f = w if wy is None else wy
    dummy_i = row if y is None else y
    k["hist"](cols, row, w, dummy_f, dummy_i, np.ascontiguousarray(seg_start, dtype=np.int64),
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


def node_candidates(cols, row, w, wy, y, seg_start, seg_len, fsel, n_bins, tot, mwl, sw, sy, n_classes, count_rows,
                    min_samples_leaf, skip=None):
    """:func:`build_histograms` then :func:`split_candidates` per node, without writing the histograms out.

    ``fsel`` (S, m) holds the candidate features themselves (rows of ``cols``).  The nodes go to the
    threads in chunks of about equal work; a node with more work than a thread's share (the first levels
    of few trees: 4 trees' roots for 8 threads) is cut into parts summed in parallel
    (:func:`_big_node_parts`), so the threads never wait on one node.  Nodes where ``skip`` (bool (S,)) is
    true are not searched: no valid split (-inf at bin 0, no occupied bin).
    """
    S, m = fsel.shape
    outs = _candidate_outputs(S, m)
    if not (S and m):
        return outs
    nodes = None                           # the nodes searched (the kernels index every array by node)
    if skip is not None and skip.any():
        for o, v in zip(outs, (-np.inf, 0, 0.0, -1, n_bins, 0)):
            o[skip] = v
        nodes = np.flatnonzero(~skip)
        if not len(nodes):
            return outs
    has_mwl = mwl is not None
    k = _kernels()
    seg_start = np.ascontiguousarray(seg_start, dtype=np.int64)
    seg_len = np.ascontiguousarray(seg_len, dtype=np.int64)
    fsel = np.ascontiguousarray(fsel, dtype=np.int64)
    C = tot.shape[1]
    threads = thread_count()
    lens = seg_len if nodes is None else seg_len[nodes]
    big, first, p_start, p_len = _big_node_parts(seg_start if nodes is None else seg_start[nodes], lens, threads,
                                                 m * n_bins * C * 8)
    small = np.arange(S, dtype=np.int64) if nodes is None else nodes
    if len(big):
        keep = np.ones(len(small), dtype=bool)
        keep[big] = False
        big = small[big]
        small, lens = small[keep], lens[keep]
    args = (w if wy is None else wy, row if y is None else y)
    common = (n_bins, tot, mwl if has_mwl else np.zeros(S), has_mwl, float(sw), float(sy), n_classes, int(count_rows),
              float(min_samples_leaf))
    if len(small):
        # one thread takes every chunk in order, and a node's search does not depend on the chunks: one chunk
        bounds = (_chunks_of_equal_work(lens, n_bins, len(small)) if threads > 1
                  else np.array([0, len(small)], dtype=np.int64))
        k["fused"](cols, row, w, *args, seg_start, seg_len, fsel, *common, small, bounds, *outs,
                   max(1, min(threads, len(bounds) - 1)))
    if len(big):
        k["fused_parts"](cols, row, w, *args, fsel, *common, big, first, p_start, p_len, *outs)
    return outs


#: Elements of a part of a big node (fewer: the parts' histograms cost more than they save).
_MIN_PART = 4096
#: Bytes of the parts' histograms at most.
_PART_BYTES = 64 << 20


def _big_node_parts(seg_start, seg_len, threads, hist_bytes):
    """``(nodes, first, start, length)``: the nodes with more elements than a quarter of a thread's share of the
    level and at least ``2 * _MIN_PART`` of them, each cut into parts of about that quarter share (node ``i``'s
    parts are ``first[i]:first[i + 1]``); nothing with one thread."""
    empty = np.zeros(0, dtype=np.int64)
    total = int(seg_len.sum())
    if threads <= 1 or total == 0:
        return empty, np.zeros(1, dtype=np.int64), empty, empty
    target = max(_MIN_PART, total // (4 * threads))
    big = np.nonzero(seg_len >= 2 * target)[0].astype(np.int64)
    if len(big) == 0:
        return big, np.zeros(1, dtype=np.int64), empty, empty
    parts = -(-seg_len[big] // target)
    limit = max(len(big), _PART_BYTES // max(1, hist_bytes))
    while parts.sum() > limit and parts.max() > 1:    # within the memory bound: fewer parts of the largest
        parts = np.maximum(1, parts - (parts == parts.max()))
    first = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64)
    start, length = [], []
    for s, n, q in zip(seg_start[big], seg_len[big], parts):
        cuts = s + (np.arange(q + 1) * n) // q
        start.append(cuts[:-1])
        length.append(np.diff(cuts))
    return big, first, np.concatenate(start).astype(np.int64), np.concatenate(length).astype(np.int64)


def _chunks_of_equal_work(seg_len, n_bins, S):
    """Boundaries of at most 1024 contiguous chunks of nodes of about equal work for :func:`node_candidates`
    (the threads take equal runs of chunks: chunks of equal node counts left one thread the big nodes).

    A node of ``n`` rows costs about ``n + min(n, B)`` a feature (its rows, then its occupied bins), plus a
    few words of the bitmap of occupied bins.
    """
    n = np.asarray(seg_len, dtype=np.float64)
    cost = n + np.minimum(n, n_bins) + 4.0
    ends = np.cumsum(cost)
    chunks = min(S, 1024)
    bounds = np.searchsorted(ends, ends[-1] * np.arange(1, chunks) / chunks, side="right")
    return np.unique(np.concatenate([[0], bounds, [S]])).astype(np.int64)


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


def _numbers_out(S, n_values):
    """The arrays :func:`._cpu_jit.node_numbers` writes, by name."""
    return {"W": np.empty(S), "parent": np.empty(S), "impurity": np.empty(S), "value": np.empty((S, n_values)),
            "pure": np.empty(S, dtype=bool), "root_w": np.empty(S), "mwl": np.empty(S), "skip": np.empty(S, dtype=bool)}


def _decisions_out(S):
    """The arrays :func:`._cpu_jit.decisions` writes, by name (its argument order)."""
    f8, i8, b1 = (lambda: np.empty(S)), (lambda: np.empty(S, dtype=np.int64)), (lambda: np.empty(S, dtype=bool))
    return {"best_val": f8(), "best_j": i8(), "best_b": i8(), "best_wl": f8(), "best_wr": f8(), "below": i8(),
            "above": i8(), "varying": b1(), "feature": i8(), "leaf": b1(), "retry": b1(), "decrease": f8()}


def level_numbers(tot, ex, root_w, n_classes, count_rows, scales, y_tol, min_weight_fraction_leaf,
                  min_samples_split, min_samples_leaf):
    """:func:`._split.node_stats` and :func:`._split.leaf_by_own_numbers` of a level in one compiled call (gini
    with fewer than 8 classes or squared error with one output): a dict with ``W``, ``parent``, ``impurity``,
    ``value``, ``pure``, ``root_w``, ``mwl`` (None without ``min_weight_fraction_leaf``) and ``skip`` (the nodes
    that are leaves by these numbers alone)."""
    S, C = tot.shape
    D = int(count_rows)
    n_values = C - D if n_classes else 1
    out = _numbers_out(S, n_values)
    mwf = float(min_weight_fraction_leaf)
    has_root = root_w is not None
    _kernels()["node_numbers"](np.ascontiguousarray(tot, dtype=np.float64), np.ascontiguousarray(ex, dtype=np.float64),
                               np.ascontiguousarray(root_w, dtype=np.float64) if has_root else np.zeros(0), has_root,
                               int(n_classes), D, float(scales[0]), float(scales[1]), float(scales[2]), float(y_tol),
                               mwf, 2 * mwf, int(min_samples_split), 2 * int(min_samples_leaf), out["W"],
                               out["parent"], out["impurity"], out["value"], out["pure"], out["root_w"], out["mwl"],
                               out["skip"])
    if not mwf > 0:
        out["mwl"] = None
    return out


def level_decisions(cand, order, st, ex, at_depth, min_impurity_decrease):
    """:func:`._split.choose` and :func:`._split.decide` of a level in one compiled call, from the candidates of
    :func:`node_candidates` and the numbers of :func:`level_numbers`: the same dict of host arrays."""
    val, b, wl, below, above, occ = cand
    S = val.shape[0]
    out = _decisions_out(S)
    if S and val.shape[1]:
        _kernels()["decisions"](val, b, wl, below, above, occ, np.ascontiguousarray(order, dtype=np.int64),
                                st["skip"], st["parent"], st["W"], st["root_w"], bool(at_depth),
                                float(min_impurity_decrease), *out.values())
    out.update({key: st[key] for key in ("parent", "W", "impurity", "pure", "root_w", "value")}, counts=ex[:, 0])
    return out


def level_head(cols, row, w, wy, wy2, y, starts, lead, trees, nodes, n_features, m, n_bins, n_classes, count_rows,
               scales, y_tol, min_weight_fraction_leaf, min_samples_split, min_samples_leaf, root_w, at_depth,
               min_impurity_decrease):
    """A level up to its decisions on the calling thread alone (a tree thread), in one compiled call: the slots'
    totals, :func:`level_numbers`, the feature orders of the nodes searched (``trees``, ``nodes``: each slot's tree
    key and node id, as :func:`feature_orders`), the search of :func:`node_candidates` and :func:`level_decisions`.
    Returns ``(numbers, decisions, extras, orders)`` as those give them (``extras``: :func:`segment_totals`' second
    array; ``orders``: the identity for the nodes that are leaves by their numbers)."""
    S = len(starts) - 1
    D = int(count_rows)
    C = D + (n_classes if n_classes else 2)
    st, dec = _numbers_out(S, C - D if n_classes else 1), _decisions_out(S)
    tot, extra = np.empty((S, C)), np.empty((S, 1 if n_classes else 2))
    perm = np.empty((S, n_features), dtype=np.int64)
    cand = _candidate_outputs(S, m)
    mwf = float(min_weight_fraction_leaf)
    has_root = root_w is not None
    _kernels()["level_head"](cols, row, w, w if wy is None else wy, w if wy2 is None else wy2, row if y is None else y,
                             np.ascontiguousarray(starts, dtype=np.int64), np.uint64(lead),
                             np.ascontiguousarray(trees, dtype=np.int64), np.ascontiguousarray(nodes, dtype=np.int64),
                             perm, int(m), int(n_bins), int(n_classes), D, float(scales[0]), float(scales[1]),
                             float(scales[2]), float(y_tol), mwf, int(min_samples_split), int(min_samples_leaf),
                             np.ascontiguousarray(root_w, dtype=np.float64) if has_root else np.zeros(0), has_root,
                             bool(at_depth), float(min_impurity_decrease), tot, extra, st["W"], st["parent"],
                             st["impurity"], st["value"], st["pure"], st["root_w"], st["mwl"], st["skip"],
                             np.empty(S, dtype=np.int64), *cand, *dec.values())
    if not mwf > 0:
        st["mwl"] = None
    dec.update({key: st[key] for key in ("parent", "W", "impurity", "pure", "root_w", "value")}, counts=extra[:, 0])
    return st, dec, extra, perm


def level_record(leaf, feature, best_b, below, above, decrease, missing_left, k, first_child, vals, edges, exact,
                 n_bins, out, n_split):
    """The node records of a level into ``out`` (``feature``, ``threshold``, ``left``, ``right``, ``decrease``,
    ``missing_left`` arrays) and each tree's split count into ``n_split``: :func:`._cpu_jit.record`."""
    has_missing = missing_left is not None
    _kernels()["record"](leaf, np.ascontiguousarray(feature, dtype=np.int64), best_b, below, above, decrease,
                         np.asarray(missing_left, dtype=bool) if has_missing else leaf, has_missing,
                         np.ascontiguousarray(k, dtype=np.int64), np.ascontiguousarray(first_child, dtype=np.int64),
                         vals, edges, exact, int(n_bins), out["feature"], out["threshold"], out["left"], out["right"],
                         out["decrease"], out["missing_left"], n_split)


def feature_orders(lead, trees, nodes, n_features):
    """Per node the permutation of the features keyed by ``(seed, tree, node)``: the stable argsort of
    :func:`mpiml.ensemble._hist.hash_uniform` draws (``lead`` its seed-and-stream word), as the array path."""
    out = np.empty((len(nodes), n_features), dtype=np.int64)
    if len(nodes):
        _kernels()["orders"](np.uint64(lead), np.ascontiguousarray(trees, dtype=np.int64),
                             np.ascontiguousarray(nodes, dtype=np.int64), out)
    return out


def bootstrap_guide(cum, lo, S, N, Q, base):
    """Where the draws of each bucket of the weighted bootstrap start their search (local row ids)."""
    out = np.zeros(len(cum), dtype=np.int64)
    if len(cum):
        _kernels()["boot_guide"](np.ascontiguousarray(cum, dtype=np.float64), np.int64(lo), np.int64(S), np.int64(N),
                                 np.ascontiguousarray(Q, dtype=np.float64), np.ascontiguousarray(base, dtype=np.float64),
                                 out)
    return out


def bootstrap_counts(lead, key, k0, k1, first, Q, base, b0, g0, S, N, cum, guide, start, c_lo, c_hi, out):
    """Adds to ``out`` the draws ``k0 .. k1 - 1`` of one tree that land on the rows ``g0 .. g0 + len(out) - 1``
    (:meth:`mpiml.ensemble._bootstrap.Bootstrap.counts`: the same hash draws and float64 arithmetic, one pass;
    weighted draws find their row from ``guide`` (:func:`bootstrap_guide` of the rank's rows, ``start``: the
    first row of ``out`` among them) and a short walk)."""
    weighted = cum is not None
    empty_f, empty_i = np.zeros(0), np.zeros(0, dtype=np.int64)
    _kernels()["boot"](np.uint64(lead), np.int64(key), np.int64(k0), np.int64(k1),
                       np.ascontiguousarray(first, dtype=np.int64), np.ascontiguousarray(Q, dtype=np.float64),
                       np.ascontiguousarray(base, dtype=np.float64), np.int64(b0), np.int64(g0), np.int64(S),
                       np.int64(N), weighted, np.ascontiguousarray(cum if weighted else empty_f, dtype=np.float64),
                       guide if weighted else empty_i, np.int64(start), float(c_lo), float(c_hi), out)


def partition(cols, row, w, wy, wy2, starts, feature, threshold_bin):
    """Stable partition of a level's elements into the children of the split slots.

    ``feature`` is -1 for a leaf slot (its elements are dropped), else the split
    feature; an element goes left when its row's bin (``cols[feature, row]``) is ``<= threshold_bin``.
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
    _kernels()["move"](cols, row, w, wy if reg else w, wy2 if reg else w, reg, starts, feature, threshold_bin, dest,
                       out_row, out_w, out_wy, out_wy2, tmp_row, tmp_w, tmp_wy, tmp_wy2, n_left)
    counts = np.stack([n_left, np.diff(starts) - n_left], axis=1)[split]
    return (out_row, out_w, out_wy if reg else None, out_wy2 if reg else None), counts
