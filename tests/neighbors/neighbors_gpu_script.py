"""Multi-rank nearest neighbours on CuPy shards (one GPU per rank), run by test_gpu_neighbors.py.

The local block goes through the fused selection kernel (``mpiml.kernels.select``): every
exchange of the ring and the local search must give the NumPy results (float64), and a
float32 search must give the same answer at any rank count as on one GPU alone.
"""

import cupy as cp
import numpy as np

from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors, _ring

from _spmd import assert_close, check, gpu_shards, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
shard = gpu_shards(comm)  # shard(a, True): the last rank holds no rows (3 or more ranks)


VARIANTS = ("blocking", "overlap", "onesided", "local")


def pin(variant):
    """The ``exchange`` parameter of ``variant``; pins the search strategy it names."""
    _ring.STRATEGY = "local" if variant == "local" else "ring"
    return "overlap" if variant == "local" else variant


def check_rank_count_identity():
    """float32, every metric, small and large k, duplicated rows: the answer of one GPU alone.

    Euclidean metrics select in the GEMM form and report exact distances, so their rows are
    small integers here (the GEMM form is exact, many ties); the others select and report
    the same value.
    """
    rs = np.random.RandomState(5)
    alone = get_comm("self")
    for metric in ("euclidean", "sqeuclidean", "cosine", "manhattan", "chebyshev", "minkowski"):
        if metric in ("euclidean", "sqeuclidean"):
            X, Q = rs.randint(-3, 4, (6000, 20)).astype(np.float32), rs.randint(-3, 4, (300, 20)).astype(np.float32)
        else:
            X, Q = rs.randn(6000, 20).astype(np.float32), rs.randn(300, 20).astype(np.float32)
        X[3000:3100] = X[:100]
        Q[:20] = X[:20]
        for k in (1, 10, 257):
            kw = dict(n_neighbors=k, metric=metric, p=3 if metric == "minkowski" else 2)
            d1, i1 = NearestNeighbors(comm=alone, **kw).fit(cp.asarray(X)).kneighbors(cp.asarray(shard(Q)))
            for ex in ("overlap", "local"):
                nn = NearestNeighbors(exchange=pin(ex), **kw).fit(cp.asarray(shard(X)))
                d, i = nn.kneighbors(cp.asarray(shard(Q)))
                assert_close(i, i1, f"{metric} k={k} {ex} indices at {size} ranks", exact=True)
                assert_close(d, d1, f"{metric} k={k} {ex} distances at {size} ranks", exact=True)
    # an empty index shard on the last rank (3 or more ranks), both searches
    X, Q = rs.randn(3000, 9).astype(np.float32), rs.randn(200, 9).astype(np.float32)
    d1, i1 = NearestNeighbors(n_neighbors=12, metric="manhattan", comm=alone).fit(cp.asarray(X)).kneighbors(
        cp.asarray(shard(Q)))
    for ex in ("overlap", "local"):
        nn = NearestNeighbors(n_neighbors=12, metric="manhattan", exchange=pin(ex)).fit(cp.asarray(shard(X, True)))
        d, i = nn.kneighbors(cp.asarray(shard(Q)))
        assert_close(i, i1, f"empty shard {ex} indices", exact=True)
        assert_close(d, d1, f"empty shard {ex} distances", exact=True)
    _ring.STRATEGY = "auto"


def main():
    check_rank_count_identity()
    rs = np.random.RandomState(0)
    X, Q = rs.randn(4000, 32), rs.randn(500, 32)
    X[2000:2010] = X[:10]      # exact ties: the lower global index first
    Q[:5] = X[:5]
    y = rs.randint(0, 5, 4000)
    for metric in ("euclidean", "sqeuclidean", "cosine", "manhattan", "chebyshev"):
        dh, ih = NearestNeighbors(n_neighbors=10, metric=metric).fit(shard(X)).kneighbors(shard(Q))
        for ex in VARIANTS:
            nn = NearestNeighbors(n_neighbors=10, metric=metric, exchange=pin(ex)).fit(cp.asarray(shard(X)))
            d, i = nn.kneighbors(cp.asarray(shard(Q)))
            check(isinstance(d, cp.ndarray), "distances follow X onto the GPU")
            assert_close(d, dh, f"{metric} {ex} distances", rtol=1e-9, atol=1e-9)
            assert_close(i, ih, f"{metric} {ex} indices", exact=True)
    for metric in ("euclidean", "cosine", "manhattan"):  # radius: count + fill passes on the device
        r = {"euclidean": 6.5, "cosine": 0.5, "manhattan": 30.0}[metric]
        hd, hi = NearestNeighbors(radius=r, metric=metric).fit(shard(X)).radius_neighbors(shard(Q))
        for ex in ("blocking", "overlap"):
            gd, gi = NearestNeighbors(radius=r, metric=metric, exchange=pin(ex)).fit(
                cp.asarray(shard(X))).radius_neighbors(cp.asarray(shard(Q)))
            check(sum(len(a) for a in hi) > 0, f"radius {metric}: some neighbours")
            check([len(a) for a in gi] == [len(a) for a in hi], f"radius {metric} {ex} counts")
            if [len(a) for a in gi] == [len(a) for a in hi]:
                assert_close(np.concatenate(gi), np.concatenate(hi), f"radius {metric} {ex} indices", exact=True)
                assert_close(np.concatenate(gd), np.concatenate(hd), f"radius {metric} {ex} distances", rtol=1e-9,
                             atol=1e-9)
    for ex in ("overlap", "onesided", "local"):
        clf = KNeighborsClassifier(n_neighbors=7, weights="distance", exchange=pin(ex)).fit(cp.asarray(shard(X)),
                                                                                      cp.asarray(shard(y)))
        host = KNeighborsClassifier(n_neighbors=7, weights="distance").fit(shard(X), shard(y))
        assert_close(clf.predict_proba(cp.asarray(shard(Q))), host.predict_proba(shard(Q)), f"proba {ex}")
        reg = KNeighborsRegressor(n_neighbors=7, exchange=pin(ex)).fit(cp.asarray(shard(X)), cp.asarray(shard(X[:, 0])))
        hreg = KNeighborsRegressor(n_neighbors=7).fit(shard(X), shard(X[:, 0]))
        assert_close(reg.predict(cp.asarray(shard(Q))), hreg.predict(shard(Q)), f"regress {ex}")


guarded(main, comm)
