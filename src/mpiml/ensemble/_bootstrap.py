"""The bootstrap of the forests: per tree, exactly ``n_draws`` draws with replacement over the rows of
every rank, with probabilities proportional to the rows' weights (scikit-learn's bootstrap), counted on
the rank that holds each drawn row.  No rows move, and the counts do not depend on the rank count.

* The global rows ``[0, N)`` are cut into fixed blocks of ``S`` rows (``S`` from ``N`` alone, at most
  :data:`MAX_BLOCKS` blocks).  A block's weight ``Q_b`` is the sum of its rows' weights as fixed-point
  integers (exact in any order: one allreduce of the blocks' partial sums per fit); unweighted rows weigh 1.
* Per tree, the number of draws that fall in each block is one multinomial draw over the blocks
  (probabilities ``Q_b / Q``) from NumPy's Philox generator keyed by the tree's key: every rank computes
  the same vector, ``O(blocks)`` per tree.
* The draws of a tree are numbered block after block; draw ``k``, in block ``b``, lands on the global
  weight ``base_b + floor(u_k Q_b)`` (``base_b`` the weight of the blocks before ``b``, ``u_k`` a
  counter-based uniform keyed by ``(tree key, k)``), i.e. on the row whose interval of the cumulated
  weights holds it.  A rank computes only the draws of the blocks that meet its rows (its share of the
  draws plus at most two blocks' worth) and keeps those that land on its rows.

Given the block counts, the draws inside a block are independent picks with probability proportional to
the weights, so the whole is the multinomial bootstrap of ``n_draws`` rows.  Integer arithmetic on
float64 (values below 2**53) makes NumPy and CuPy agree to the bit.

**Small data sets** (at most :data:`SKLEARN_ROWS` rows over the ranks) take scikit-learn's own draw
instead: ``RandomState(tree key).randint(0, N, n_draws)``, or ``.choice(N, n_draws, p=weights / sum)``
with weights, computed on every rank over every row's weight (one ``allgatherv`` of them per fit), at a
cost of ``O(n_draws)`` per tree and rank that is small at that size.  The trees' keys being scikit-learn's
``random_state`` of its trees, the rows drawn are those scikit-learn's forest draws for the same
``random_state``: ``estimators_samples_`` and the out-of-bag rows are scikit-learn's.
"""

import math
import os

import numpy as np

from . import _cpu_kernels
from ._hist import FIXED_POINT_BITS, STREAM_BOOTSTRAP, hash_head, hash_uniform, stream_lead

__all__ = ["Bootstrap", "MAX_BLOCKS", "MIN_BLOCK", "SKLEARN_ROWS"]

#: Fewest rows per block, and most blocks: the blocks' multinomial costs O(blocks) per tree on every rank.
MIN_BLOCK = 1024
MAX_BLOCKS = 4096
#: Draws handled by one pass of array operations (bounds the temporaries).
CHUNK_DRAWS = 1 << 23
#: Up to this many rows (over the ranks), scikit-learn's own draw (``MPIML_RF_SKLEARN_BOOTSTRAP_ROWS`` overrides;
#: the ranks must agree on it, as on every setting that changes the trees).
SKLEARN_ROWS = 1 << 16


def _sklearn_rows():
    return int(os.environ.get("MPIML_RF_SKLEARN_BOOTSTRAP_ROWS", SKLEARN_ROWS))


def _power_of_two_below(x):
    return 2.0 ** math.floor(math.log2(x))


class Bootstrap:
    """The bootstrap draws of the trees of one fit, for this rank's rows ``[offset, offset + n_local)``.

    Parameters
    ----------
    xp : module
        ``numpy`` or ``cupy`` (where the counts live).
    n_draws : int
        Draws per tree (may be set later, as :attr:`m`, e.g. from :meth:`weight_sum`).
    n_total : int
        Rows of every rank (``N``).
    offset, n_local : int
        This rank's global rows ``[offset, offset + n_local)``.
    weights : ndarray of shape (n_local,) or None
        The rows' non-negative weights (on ``xp``); None: every row weighs the same.
    comm : communicator or None
        The ranks that share the rows (None: this rank holds all ``N`` rows).
    state : dict or None
        :attr:`state` of an earlier object over the same rows (no communication then); ``before`` may be
        overridden for another cut of the same rows.
    """

    def __init__(self, xp, n_draws, n_total, offset, n_local, weights=None, comm=None, state=None):
        self.xp, self.m, self.N, self.lo, self.n = xp, int(n_draws), int(n_total), int(offset), int(n_local)
        self.S = max(MIN_BLOCK, -(-self.N // MAX_BLOCKS))
        self.nb = max(1, -(-self.N // self.S))
        if state is None:
            state = self._agree(weights, comm)
        self.state = state
        self.exact = bool(state.get("exact", False))
        self.scale = state["scale"]
        self.Q = np.asarray(state["totals"], dtype=np.float64)
        self.base = np.concatenate([[0.0], np.cumsum(self.Q)[:-1]])
        self.p = self.Q / self.Q.sum() if self.Q.sum() > 0 else np.full(self.nb, 1.0 / self.nb)
        self.cum = None
        if self.scale is not None and self.n:
            # the global weight at the end of each local row: exact integers in float64
            q = xp.rint(xp.asarray(weights, dtype=xp.float64) * self.scale)
            self.cum = float(state["before"]) + xp.cumsum(q)
        self._memo = {}
        self._guide = None
        self._dev = None

    def _agree(self, weights, comm):
        """Fixed-point scale, the blocks' weights and the weight before this rank's rows (one allreduce); small
        data sets: every row's weight (one allgatherv)."""
        xp, size = self.xp, 1 if comm is None else comm.size
        if self.N <= _sklearn_rows():
            every = None
            if weights is not None:
                every = np.ascontiguousarray(np.asarray(weights.get() if xp is not np else weights, dtype=np.float64))
                every = comm.allgatherv(every) if size > 1 else every
            sizes = np.minimum(self.S, self.N - self.S * np.arange(self.nb)).astype(np.float64)
            return {"exact": True, "weights": every, "scale": None, "unit": 1.0, "totals": sizes,
                    "before": float(self.lo)}
        local = [np.inf, -np.inf]
        if weights is not None and self.n:
            local = [float(xp.min(weights)), float(xp.max(weights))]
        lo_hi = np.array([-local[0], local[1]])
        if size > 1:
            lo_hi = comm.allreduce(lo_hi, op="max")
        wmin, wmax = -lo_hi[0], lo_hi[1]
        if weights is None or (wmin == wmax and wmax > 0) or not np.isfinite(wmax):   # every row weighs the same
            sizes = np.minimum(self.S, self.N - self.S * np.arange(self.nb)).astype(np.float64)
            unit = 1.0 if weights is None or not np.isfinite(wmax) else float(wmax)
            return {"scale": None, "unit": unit, "totals": sizes, "before": float(self.lo)}
        scale = _power_of_two_below(2.0 ** FIXED_POINT_BITS / (max(self.N, 1) * wmax)) if wmax > 0 else 1.0
        part = np.zeros(self.nb + size)
        if self.n:
            q = xp.rint(xp.asarray(weights, dtype=xp.float64) * scale)
            blocks = (xp.arange(self.lo, self.lo + self.n, dtype=xp.int64) // self.S)
            sums = xp.bincount(blocks, weights=q, minlength=self.nb)
            part[:self.nb] = sums.get() if xp is not np else sums
            part[self.nb + (0 if comm is None else comm.rank)] = float(part[:self.nb].sum())
        if size > 1:
            part = comm.allreduce(part)
        rank = 0 if comm is None else comm.rank
        return {"scale": scale, "unit": None, "totals": part[:self.nb],
                "before": float(part[self.nb:self.nb + rank].sum())}

    def weight_sum(self):
        """The rows' total weight, the same on every rank and at every rank count (from the exact fixed-point
        totals; rows of equal weights: that weight times ``N``)."""
        if self.exact:                        # scikit-learn's: the sum of the weights, or the row count
            every = self.state["weights"]
            return float(self.N) if every is None else float(np.sum(every))
        if self.scale is None:
            return float(self.state["unit"]) * self.N
        return float(self.Q.sum()) / self.scale

    def block_draws(self, key):
        """Draws per block of the tree of ``key`` (host int64, the same on every rank)."""
        c = self._memo.get(key)
        if c is None:
            if self.m == 0 or self.Q.sum() <= 0:
                c = np.zeros(self.nb, dtype=np.int64)
            else:
                rng = np.random.Generator(np.random.Philox(key=np.array([int(key), STREAM_BOOTSTRAP], np.uint64)))
                c = rng.multinomial(self.m, self.p).astype(np.int64)
            if len(self._memo) < 64:              # a few trees' vectors (at most 4096 ints each)
                self._memo[key] = c
        return c

    def counts(self, keys, start=0, n=None):
        """Times each local row ``start .. start + n - 1`` is drawn by the trees of ``keys``.

        Returns
        -------
        ndarray of shape (len(keys), n), float64, on ``xp``
        """
        xp = self.xp
        n = self.n - start if n is None else int(n)
        if len(keys) == 1 and n > 0 and self.m:             # (one tree: no copy into a stacked array)
            return self._tree_counts(int(keys[0]), start, n)[None, :]
        out = xp.zeros((len(keys), max(n, 0)), dtype=xp.float64)
        if n <= 0 or self.m == 0:
            return out
        for i, key in enumerate(keys):
            out[i] = self._tree_counts(int(key), start, n)
        return out

    def _sklearn_counts(self, key, start, n):
        """scikit-learn's draw of the tree of ``key`` (its ``_generate_sample_indices``), counted on the rows."""
        rs = np.random.RandomState(key)
        every = self.state["weights"]
        if every is None:
            drawn = rs.randint(0, self.N, self.m)
        else:
            drawn = rs.choice(self.N, self.m, replace=True, p=every / np.sum(every))
        counts = np.bincount(drawn, minlength=self.N)[self.lo + start:self.lo + start + n]
        return self.xp.asarray(counts.astype(np.float64))

    def _tree_counts(self, key, start, n):
        xp = self.xp
        if self.exact:
            return self._sklearn_counts(key, start, n)
        g0, g1 = self.lo + start, self.lo + start + n              # global rows of the range
        b0, b1 = g0 // self.S, (g1 - 1) // self.S + 1              # the blocks that meet them
        c = self.block_draws(key)
        first = np.concatenate([[0], np.cumsum(c)])                # the first draw number of each block
        k0, k1 = int(first[b0]), int(first[b1])
        out = xp.zeros(n, dtype=xp.float64)
        if k1 == k0:
            return out
        if self.scale is not None:
            c_lo = float(self.state["before"]) if start == 0 else float(self.cum[start - 1])
            c_hi = float(self.cum[start + n - 1])
            cum = self.cum[start:start + n]
        if xp is np and _cpu_kernels.enabled():
            weighted = self.scale is not None
            if weighted and self._guide is None:        # once per fit: where each bucket's draws start looking
                self._guide = _cpu_kernels.bootstrap_guide(self.cum, self.lo, self.S, self.N, self.Q, self.base)
            _cpu_kernels.bootstrap_counts(stream_lead(0, STREAM_BOOTSTRAP), key, k0, k1, first[b0:b1 + 1], self.Q,
                                          self.base, b0, g0, self.S, self.N, cum if weighted else None,
                                          self._guide, start, c_lo if weighted else 0.0,
                                          c_hi if weighted else 0.0, out)
            return out
        if xp is not np and os.environ.get("MPIML_RF_GPU_BOOTSTRAP_KERNEL", "1") != "0":
            if self._dev is None:                              # the blocks' weights, once per fit
                self._dev = (xp.asarray(self.Q), xp.asarray(self.base))
            from ..kernels.forest import bootstrap as kernel

            weighted = self.scale is not None
            if kernel.tree_counts(hash_head(0, STREAM_BOOTSTRAP, key), xp.asarray(first[b0:b1 + 1]),
                                  self._dev[0][b0:b1], self._dev[1][b0:b1], b0, self.S, g0, n,
                                  cum if weighted else None, c_lo if weighted else 0.0, c_hi if weighted else 0.0,
                                  out):
                return out
        d_first = xp.asarray(first[b0 + 1:b1])
        d_Q, d_base = xp.asarray(self.Q[b0:b1]), xp.asarray(self.base[b0:b1])
        for a in range(k0, k1, CHUNK_DRAWS):
            k = xp.arange(a, min(a + CHUNK_DRAWS, k1), dtype=xp.int64)       # draw numbers of the tree
            j = (xp.searchsorted(d_first, k, side="right") if d_first.shape[0]      # their blocks, from b0
                 else xp.zeros(k.shape, dtype=xp.int64))
            u = hash_uniform(xp, 0, STREAM_BOOTSTRAP, key, k)
            Qs = d_Q[j]
            v = d_base[j] + xp.minimum(xp.floor(u * Qs), Qs - 1.0)       # the global weight it lands on
            if self.scale is None:
                r = v.astype(xp.int64) - g0                        # unweighted: the global row itself
                r = r[(r >= 0) & (r < n)]
            else:
                r = xp.searchsorted(cum, v[(v >= c_lo) & (v < c_hi)], side="right")
            if r.shape[0]:                                         # (CuPy's bincount takes no empty input)
                out += xp.bincount(r, minlength=n).astype(xp.float64)
        return out
