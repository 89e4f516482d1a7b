"""The data side of forest training: counter-based random numbers, global bins, histograms.

Everything here is array-namespace code shared by NumPy and CuPy shards, so
the CPU tests run what the GPU runs.

* **Random numbers** come from a counter-based hash (splitmix64 finalisers)
  of ``(seed, stream, a, b)``: a draw depends only on its key, never on the
  rank that makes it, so draws keyed by a *global* index (a row, a tree's
  bootstrap draw) do not depend on the number of ranks.
* **Bins**: every rank keeps the rows whose hashed global index falls under a
  fixed rate (all rows when the data set is small), the kept rows are
  gathered, and every rank computes the same bin edges from the same sample.
  A feature with at most ``max_bins`` distinct values in the sample gets one
  bin per value (edges at the midpoints, as an exact tree would split);
  otherwise edges are midpoints of evenly spaced order statistics.
* **Histograms** are sums over rows of integer-valued float64 channels
  (fixed-point weights), by ``bincount`` over a combined
  ``(node, feature, bin, channel)`` key: every partial sum is an integer below
  2**53, so sums are exact, in any order, on any number of ranks.
"""

import numpy as np

__all__ = ["hash_uniform", "sample_rows", "bin_edges",
           "apply_bins", "FIXED_POINT_BITS"]

_C_STREAM = 0x9E3779B97F4A7C15
_C_A = 0xBF58476D1CE4E5B9
_C_B = 0x94D049BB133111EB
_MASK = (1 << 64) - 1

#: Fixed-point channels are scaled so that the sum of their magnitudes over all
#: rows of all ranks stays below 2**FIXED_POINT_BITS (< 2**53: exact in float64).
FIXED_POINT_BITS = 50

#: Streams of the counter-based generator.
STREAM_BOOTSTRAP = 1
STREAM_FEATURES = 2
STREAM_BINS = 3


def _mix_int(z):
    """The splitmix64 finaliser on a Python integer."""
    z = ((z ^ (z >> 30)) * _C_A) & _MASK
    z = ((z ^ (z >> 27)) * _C_B) & _MASK
    return z ^ (z >> 31)


def _mix(xp, z):
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_C_A)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_C_B)
    return z ^ (z >> xp.uint64(31))


def stream_lead(seed, stream):
    """The 64-bit word of ``(seed, stream)`` that :func:`hash_uniform` mixes with per-entry counters."""
    return ((int(seed) * _C_STREAM) ^ (int(stream) << 56)) & _MASK


def hash_head(seed, stream, a):
    """The 64-bit word that :func:`hash_uniform` adds to ``b * C_B`` for a Python-integer counter ``a``."""
    return _mix_int(((int(seed) * _C_STREAM) ^ (int(stream) << 56) ^ (int(a) * _C_A)) & _MASK)


def hash_uniform(xp, seed, stream, a, b):
    """Uniform floats in [0, 1) keyed by ``(seed, stream, a, b)``; ``b`` an integer array.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy``; the result lives there.
    seed, stream : int
        Python integers (the seed of the fit, the stream).
    a : int or ndarray of integers
        A counter (e.g. a tree index), or one per entry, broadcast against ``b``.
    b : ndarray of integers
        Counters, e.g. global row indices.

    Returns
    -------
    ndarray of float64, shape of ``b``
    """
    with np.errstate(over="ignore"):
        if isinstance(a, (int, np.integer)):
            head = xp.uint64(hash_head(seed, stream, a))
        else:                               # one counter ``a`` per entry (broadcast against ``b``)
            lead = xp.uint64(stream_lead(seed, stream))
            head = _mix(xp, lead ^ (xp.asarray(a).astype(xp.uint64) * xp.uint64(_C_A)))
        z = xp.asarray(b).astype(xp.uint64) * xp.uint64(_C_B) + head
        z = _mix(xp, _mix(xp, z))
    return (z >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))


def sample_rows(xp, seed, offset, n_local, n_total, target):
    """Local rows kept for the bin sample: all of them when ``n_total <= target``.

    A row is kept when the hash of its global index falls under
    ``target / n_total``, so the sample does not depend on the rank count.
    """
    if n_total <= target:
        return None
    u = hash_uniform(xp, seed, STREAM_BINS, 0, xp.arange(offset, offset + n_local, dtype=xp.int64))
    return xp.nonzero(u < target / n_total)[0]


#: The edge below a feature's missing-value bin: every finite value is at or under it, NaN (binned as +inf) above.
MISSING_EDGE = float(np.finfo(np.float64).max)


def bin_edges(sample, max_bins, exact, xp=np, missing=None):
    """Bin edges and bin values of every feature from the gathered ``sample`` (host arrays).

    Parameters
    ----------
    sample : ndarray of shape (n_sample, n_features)
        The same rows on every rank (order does not matter).
    max_bins : int
        At most this many bins per feature.
    exact : bool
        True when the sample holds every row: a feature with at most
        ``max_bins`` distinct values then records them as its bin values, so
        that thresholds can sit half way between the values present in a node.
    xp : module, default=numpy
        Where the columns are sorted (CuPy: every column in one call on the
        device, then one copy back); the rest is host work linear in the sample.
    missing : sequence of bool, default=None
        Features with missing values (NaN) on some rank: their values get at
        most ``max_bins - 1`` bins and NaN the last bin, after the edge
        :data:`MISSING_EDGE` (rows are binned with NaN as +inf, see
        :func:`apply_bins`), so a split after the last value bin sends the
        missing values alone to the right.

    Returns
    -------
    edges : list of float64 arrays
        Increasing thresholds; a value ``x`` falls in bin ``#(edges < x)``.
    values : list of float64 arrays or None
        The value of each bin where bins are single values, else None.
    """
    if (missing is None or not np.any(missing)) and xp is not np and np.shape(sample)[0] > 1:
        return _bin_edges_sorted(xp, sample, max_bins, exact)
    if xp is not np and np.size(sample):
        # a copy: the columns are sorted in place (one feature's (n, 1) sample transposes without a copy)
        cols = np.array(np.asarray(sample, dtype=np.float64).T, order="C", copy=True)
        cols = xp.sort(xp.asarray(cols), axis=1).get()
    else:
        from . import _cpu_kernels

        cols = _cpu_kernels.sorted_columns(sample)     # the copy and the sorts on the rank's threads
    edges, values = [], []
    for j, col in enumerate(cols):
        nan_bin = missing is not None and bool(missing[j])
        if nan_bin:
            col = col[~np.isnan(col)]                      # sorted: the NaN were last
        nb = max_bins - 1 if nan_bin else max_bins
        # the distinct values of a sorted column
        uniq = col[np.concatenate([[True], col[1:] != col[:-1]])] if len(col) else col
        if len(uniq) <= nb:
            e = (uniq[:-1] + uniq[1:]) / 2.0
            # midpoints of adjacent floats can round up to the upper value
            e = np.where(e >= uniq[1:], uniq[:-1], e)
            v = uniq if exact else None
        else:
            pos = np.linspace(0, len(col) - 1, nb + 1)[1:-1]
            lo, hi = col[np.floor(pos).astype(np.int64)], col[np.ceil(pos).astype(np.int64)]
            e = np.unique((lo + hi) / 2.0)
            v = None
        edges.append(np.append(e, MISSING_EDGE) if nan_bin else e)
        values.append(v)
    return edges, values


def _bin_edges_sorted(xp, sample, max_bins, exact):
    """:func:`bin_edges` without missing values, the columns sorted and read where they are (``xp``): only the
    order statistics at the quantile positions and the distinct values of the few-valued columns come to the
    host, not every sorted column.  The same edges and values, by the same host expressions."""
    n, F = np.shape(sample)
    cols = xp.sort(xp.asarray(sample).T.astype(xp.float64), axis=1)          # (F, n), each column sorted
    change = cols[:, 1:] != cols[:, :-1]
    n_uniq = np.asarray(_to_host(xp, change.sum(axis=1))) + 1
    pos = np.linspace(0, n - 1, max_bins + 1)[1:-1]
    lo = _to_host(xp, cols[:, np.floor(pos).astype(np.int64)])
    hi = _to_host(xp, cols[:, np.ceil(pos).astype(np.int64)])
    edges, values = [], []
    for j in range(F):
        if n_uniq[j] <= max_bins:
            keep = xp.concatenate([xp.ones(1, dtype=bool), change[j]])
            uniq = _to_host(xp, cols[j][keep])
            e = (uniq[:-1] + uniq[1:]) / 2.0
            e = np.where(e >= uniq[1:], uniq[:-1], e)         # midpoints of adjacent floats can round up
            v = uniq if exact else None
        else:
            e = np.unique((lo[j] + hi[j]) / 2.0)
            v = None
        edges.append(e)
        values.append(v)
    return edges, values


def _to_host(xp, a):
    return a.get() if xp is not np else np.asarray(a)


def apply_bins(X, edges, xp):
    """Bin index of every entry of ``X`` (uint8 for up to 256 bins, else uint16); NaN is binned as +inf."""
    n, d = X.shape
    if n and d and X.dtype.kind == "f" and bool(xp.isnan(X).any()):
        X = xp.where(xp.isnan(X), xp.inf, X)
    most = max((len(e) + 1 for e in edges), default=1)
    dtype = xp.uint8 if most <= 256 else xp.uint16
    if xp is np:
        from . import _cpu_kernels

        if _cpu_kernels.enabled():
            return _cpu_kernels.apply_bins(X, edges, dtype)
    out = xp.empty((n, d), dtype=dtype)
    for j in range(d):
        e = xp.asarray(edges[j])
        out[:, j] = xp.searchsorted(e, X[:, j].astype(xp.float64), side="left").astype(dtype)
    return out
