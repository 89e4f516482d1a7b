"""Multi-rank nearest neighbours on CuPy shards (one GPU per rank), run by test_gpu_neighbors.py.

The CuPy path is the NumPy path's code on another namespace (the local block goes
through ``mpiml.kernels.distances.topk``): every exchange must give the NumPy results.
"""

import cupy as cp
import numpy as np

from mpiml.comm import get_comm
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()


def shard(a):
    w = np.arange(1, size + 1, dtype=np.float64)
    b = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * a.shape[0]).astype(int)])
    return a[b[rank]:b[rank + 1]]


def main():
    rs = np.random.RandomState(0)
    X, Q = rs.randn(4000, 32), rs.randn(500, 32)
    y = rs.randint(0, 5, 4000)
    for metric in ("euclidean", "cosine", "manhattan"):
        dh, ih = NearestNeighbors(n_neighbors=10, metric=metric).fit(shard(X)).kneighbors(shard(Q))
        for ex in ("blocking", "overlap", "onesided"):
            nn = NearestNeighbors(n_neighbors=10, metric=metric, exchange=ex).fit(cp.asarray(shard(X)))
            d, i = nn.kneighbors(cp.asarray(shard(Q)))
            check(isinstance(d, cp.ndarray), "distances follow X onto the GPU")
            assert_close(d, dh, f"{metric} {ex} distances", rtol=1e-9, atol=1e-9)
            assert_close(i, ih, f"{metric} {ex} indices", exact=True)
    for ex in ("overlap", "onesided"):
        clf = KNeighborsClassifier(n_neighbors=7, weights="distance", exchange=ex).fit(cp.asarray(shard(X)),
                                                                                      cp.asarray(shard(y)))
        host = KNeighborsClassifier(n_neighbors=7, weights="distance").fit(shard(X), shard(y))
        assert_close(clf.predict_proba(cp.asarray(shard(Q))), host.predict_proba(shard(Q)), f"proba {ex}")
        reg = KNeighborsRegressor(n_neighbors=7, exchange=ex).fit(cp.asarray(shard(X)), cp.asarray(shard(X[:, 0])))
        hreg = KNeighborsRegressor(n_neighbors=7).fit(shard(X), shard(X[:, 0]))
        assert_close(reg.predict(cp.asarray(shard(Q))), hreg.predict(shard(Q)), f"regress {ex}")


guarded(main, comm)
