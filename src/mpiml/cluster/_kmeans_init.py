"""Initial centres for distributed k-means: ``k-means||``, ``k-means++``, ``random``.

All three return the same centres on every rank.  Randomness comes from one
seed shared by all ranks: choices made once for the whole dataset use a
replicated ``RandomState``; per-row coin flips (``k-means||``) use a counter-based
hash of (seed, round, *global* row index), so which rows are picked does not
depend on how the rows are split over ranks.
"""

import math
from dataclasses import dataclass

import numpy as np

from . import _kmeans_ops as ops

__all__ = ["Shard", "init_centers", "kmeans_plusplus_weighted", "uniform_by_index"]


@dataclass
class Shard:
    """This rank's validated rows and what every rank agreed about the whole dataset."""

    X: object             # (n_local, d) NumPy or CuPy
    weight: object        # (n_local,) same namespace and dtype
    shift: object         # (d,) the global mean, same namespace and dtype
    comm: object
    xp: object
    offset: int           # global index of the first local row
    n_total: int
    batch_size: object = None
    unit_weight: bool = False  # no sample_weight given: ``weight`` is ones (GPU steps then read none)

    @property
    def n_local(self):
        return int(self.X.shape[0])


# ---------------------------------------------------------------------- randomness
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def uniform_by_index(seed, stream, gids, xp=np):
    """Uniform numbers in [0, 1), one per global row index, from (seed, stream) alone.

    A splitmix64 finaliser of ``seed * 2^32 + stream`` mixed with the index;
    identical on NumPy and CuPy.
    """
    with np.errstate(over="ignore"):
        key = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + int(stream) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF)
        z = gids.astype(xp.uint64) * xp.uint64(0x9E3779B97F4A7C15) + xp.uint64(key)
        z = (z ^ (z >> xp.uint64(30))) * xp.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> xp.uint64(27))) * xp.uint64(0x94D049BB133111EB)
        z = z ^ (z >> xp.uint64(31))
    return (z >> xp.uint64(11)).astype(xp.float64) * (1.0 / (1 << 53))


def distinct_draw(rng, n, k):
    """``k`` distinct integers of ``[0, n)`` from ``rng`` (a RandomState replicated on every rank: the same
    draw everywhere), in O(k) expected work: uniform draws, repeats drawn again.  ``RandomState.choice(n, k,
    replace=False)`` permutes all n (0.8 s on one core at 10^7 rows, 3 s at 4 * 10^7: more than a whole GPU fit);
    where k is over a quarter of n a permutation is as cheap, and taken."""
    if k > n:
        raise ValueError(f"cannot draw {k} distinct rows of {n}")
    if 4 * k >= n:
        return rng.permutation(n)[:k].astype(np.int64)
    out, seen = [], set()
    while len(out) < k:
        for v in rng.randint(0, n, size=k - len(out), dtype=np.int64).tolist():
            if v not in seen:
                seen.add(v)
                out.append(v)
    return np.asarray(out, dtype=np.int64)


def _to_host(a):
    return a.get() if ops._is_device(a) else np.asarray(a)


# ---------------------------------------------------------------------- fetching rows
def fetch_rows(shard, gids):
    """Shifted rows with the given global indices, in the given order, on every rank.

    Each owner contributes its rows (one ``allgatherv``); rows come back in the
    namespace of ``X``.
    """
    gids = np.asarray(gids, dtype=np.int64)
    uniq, inverse = np.unique(gids, return_inverse=True)
    lo, hi = shard.offset, shard.offset + shard.n_local
    mine = uniq[(uniq >= lo) & (uniq < hi)] - lo
    xp = shard.xp
    local = ops.dense_rows(shard.X, xp.asarray(mine), shard.shift)
    if shard.comm.size > 1:
        rows = shard.comm.allgatherv(xp.ascontiguousarray(local))
    else:
        rows = local
    return rows[xp.asarray(inverse.reshape(-1))]


def _global_pick(shard, values, draws):
    """Global row indices drawn with probability proportional to ``values``.

    ``values`` are this rank's non-negative scores; ``draws`` uniform numbers in
    [0, 1) shared by every rank.  Per-rank totals are allgathered, the rank of a
    draw found on the replicated cumulative totals, and the row on its owner.
    """
    xp = shard.xp
    comm = shard.comm
    v64 = values.astype(xp.float64)
    total_local = float(v64.sum())
    totals = np.array([total_local]) if comm.size == 1 else \
        np.asarray(comm.allgather(np.array([total_local], dtype=np.float64)))
    cum = np.cumsum(totals)
    grand = cum[-1]
    targets = np.asarray(draws, dtype=np.float64) * grand
    owners = np.minimum(np.searchsorted(cum, targets, side="right"), comm.size - 1)
    # skip ranks whose total is zero (a draw can only land on a rank with mass)
    for i, r in enumerate(owners):
        while totals[r] <= 0 and r > 0:
            r -= 1
        while totals[r] <= 0 and r < comm.size - 1:
            r += 1
        owners[i] = r
    local_pick = np.full(len(draws), -1, dtype=np.int64)
    mine = np.nonzero(owners == comm.rank)[0]
    if mine.size:
        before = cum[comm.rank] - totals[comm.rank]
        # searched where the values are: only the picks cross to the host (not n cumulative sums)
        idx = _to_host(xp.searchsorted(xp.cumsum(v64), xp.asarray(targets[mine] - before), side="right"))
        local_pick[mine] = np.minimum(idx, shard.n_local - 1) + shard.offset
    if comm.size == 1:
        return local_pick
    return comm.allreduce(local_pick, op="max")


# ---------------------------------------------------------------------- local weighted k-means++
def kmeans_plusplus_weighted(C, weights, k, rng, n_local_trials=None):
    """Greedy weighted k-means++ over a small replicated candidate set (host, float64).

    Returns the indices of the ``k`` chosen rows of ``C``.
    """
    n = C.shape[0]
    w = np.asarray(weights, dtype=np.float64)
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(k))
    c_sq = np.einsum("ij,ij->i", C, C)
    p = w / w.sum() if w.sum() > 0 else None
    first = int(rng.choice(n, p=p))
    chosen = [first]
    closest = np.maximum(c_sq - 2 * C @ C[first] + c_sq[first], 0)
    pot = float(w @ closest)
    for _ in range(1, k):
        if pot <= 0:
            rest = np.setdiff1d(np.arange(n), chosen)
            chosen.append(int(rest[0]) if rest.size else first)
            continue
        r = rng.uniform(size=n_local_trials) * pot
        cand = np.searchsorted(np.cumsum(w * closest), r)
        np.clip(cand, None, n - 1, out=cand)
        d = np.maximum(c_sq[None, :] - 2 * C[cand] @ C.T + c_sq[cand][:, None], 0)
        np.minimum(closest, d, out=d)
        pots = d @ w
        best = int(np.argmin(pots))
        chosen.append(int(cand[best]))
        closest = d[best]
        pot = float(pots[best])
    return np.asarray(chosen, dtype=np.int64)


def _weighted_lloyd_small(C, w, centers, n_iter=10):
    """A few weighted Lloyd steps on the small candidate set (host, float64)."""
    for _ in range(n_iter):
        d = ops.sq_distances(C, centers)
        lab = np.argmin(d, axis=1)
        sums = np.zeros_like(centers)
        np.add.at(sums, lab, C * w[:, None])
        cnt = np.bincount(lab, weights=w, minlength=centers.shape[0])
        ok = cnt > 0
        new = centers.copy()
        new[ok] = sums[ok] / cnt[ok, None]
        if np.allclose(new, centers, rtol=0, atol=1e-12):
            break
        centers = new
    return centers


# ---------------------------------------------------------------------- the three methods
def _init_random(shard, k, rng):
    gids = distinct_draw(rng, shard.n_total, k)
    return fetch_rows(shard, gids)


def _init_kmeanspp(shard, k, rng, n_local_trials=None):
    """Distributed greedy k-means++: each step is one global D^2 draw of a few trials.

    Per step: an allgather of per-rank totals, a max-allreduce of the picked
    indices, an allgatherv of the trial rows, an allreduce of their potentials.
    """
    xp = shard.xp
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(k))
    w = shard.weight
    first = _global_pick(shard, w, rng.uniform(size=1))
    centers = [fetch_rows(shard, first)]
    _, closest, _ = ops.assign(shard.X, shard.shift, centers[0], batch_size=shard.batch_size)
    closest = closest.astype(xp.float64)
    w64 = w.astype(xp.float64)
    for _ in range(1, k):
        picks = _global_pick(shard, w64 * closest, rng.uniform(size=n_local_trials))
        cand = fetch_rows(shard, picks)
        n = shard.n_local
        step = ops.chunk_rows(cand.shape[1], n_local_trials, 8, shard.batch_size, sparse=ops.is_sparse(shard.X),
                              device=xp is not np)
        pots = xp.zeros(n_local_trials, dtype=xp.float64)
        best_d = []
        for s in range(0, n, step):
            e = min(n, s + step)
            d = ops.sq_distances(ops.shifted(shard.X[s:e], shard.shift), cand).astype(xp.float64)
            d = xp.minimum(d, closest[s:e, None])
            pots += w64[s:e] @ d
            best_d.append(d)
        pots = shard.comm.allreduce(pots) if shard.comm.size > 1 else pots
        best = int(np.argmin(_to_host(pots)))
        centers.append(cand[best:best + 1])
        if n:
            closest = xp.concatenate([b[:, best] for b in best_d])
    return xp.concatenate(centers, axis=0)


def _init_kmeans_parallel(shard, k, rng, seed, oversampling_factor, n_rounds):
    """Scalable k-means++ (k-means||): a few rounds of oversampling, then a local reduction.

    Per round: the candidates drawn on each rank are allgathered (allgatherv)
    and the cost is one scalar allreduce; at the end, one allreduce of the
    candidates' weights.  The reduction to ``k`` (weighted k-means++ and a few
    weighted Lloyd steps) runs on every rank on the same replicated data.
    """
    xp = shard.xp
    comm = shard.comm
    w64 = shard.weight.astype(xp.float64)
    first = _global_pick(shard, shard.weight, rng.uniform(size=1))
    cands = [fetch_rows(shard, first)]
    _, d2, _ = ops.assign(shard.X, shard.shift, cands[0], batch_size=shard.batch_size)
    d2 = d2.astype(xp.float64)

    def cost():
        c = float(w64 @ d2) if shard.n_local else 0.0
        return comm.allreduce_obj(c) if comm.size > 1 else c

    psi = cost()
    if n_rounds is None:
        n_rounds = int(min(8, max(2, math.ceil(math.log(max(psi, 2.0))) if psi > 0 else 2)))
        n_rounds = min(n_rounds, 5)
    ell = oversampling_factor * k
    gids = xp.arange(shard.offset, shard.offset + shard.n_local, dtype=xp.int64)
    for r in range(n_rounds):
        if psi <= 0:
            break
        u = uniform_by_index(seed, r + 1, gids, xp)
        picked = xp.nonzero(u < ell * w64 * d2 / psi)[0]
        new = ops.dense_rows(shard.X, picked, shard.shift)
        if comm.size > 1:
            new = comm.allgatherv(xp.ascontiguousarray(new))
        if new.shape[0] == 0:
            continue
        cands.append(new)
        _, dn, _ = ops.assign(shard.X, shard.shift, new, batch_size=shard.batch_size)
        d2 = xp.minimum(d2, dn.astype(xp.float64))
        psi = cost()
    C = xp.concatenate(cands, axis=0)
    n_c = C.shape[0]
    if n_c < k:  # too few distinct draws (tiny data): top up with random rows
        extra = distinct_draw(rng, shard.n_total, min(k, shard.n_total))
        C = xp.concatenate([C, fetch_rows(shard, extra)], axis=0)
        n_c = C.shape[0]
    labels, _, _ = ops.assign(shard.X, shard.shift, C, batch_size=shard.batch_size)
    counts = xp.bincount(labels, weights=w64, minlength=n_c).astype(xp.float64)
    if comm.size > 1:
        counts = comm.allreduce(counts)
    C_host = _to_host(C).astype(np.float64)
    counts = _to_host(counts)
    chosen = kmeans_plusplus_weighted(C_host, counts, k, rng)
    centers = _weighted_lloyd_small(C_host, counts, C_host[chosen])
    return xp.asarray(centers.astype(shard.X.dtype))


def init_centers(shard, k, init, rng, seed, *, oversampling_factor=2.0, init_max_iter=None):
    """Shifted initial centres ``(k, d)`` in the namespace and dtype of ``X``, same on every rank."""
    xp = shard.xp
    if isinstance(init, str):
        if init == "random":
            C = _init_random(shard, k, rng)
        elif init == "k-means++":
            C = _init_kmeanspp(shard, k, rng)
        elif init == "k-means||":
            C = _init_kmeans_parallel(shard, k, rng, seed, oversampling_factor, init_max_iter)
        else:  # guarded by parameter validation
            raise ValueError(f"unknown init {init!r}")
    else:
        C = xp.asarray(init, dtype=shard.X.dtype) - shard.shift[None, :]
    return xp.ascontiguousarray(C.astype(shard.X.dtype, copy=False))
