"""The GEMM route through the estimator at 1..N ranks, run by test_gpu_select_gemm.py (ranks may share one GPU).

Wide rows (d = 256: the GEMM route of ``mpiml.kernels.select.topk``) sharded over the ranks, searched
by the ring and by the local search: the same rows and distances, bit for bit, as one process with
the whole index.  Euclidean metrics select in the GEMM form and report distances recomputed from
differences, so their rows are small integers (exact GEMM form, many ties); cosine selects and
reports the same value, so its rows are random floats (rounding matters).
"""

import cupy as cp
import numpy as np

from mpiml.comm import get_comm
from mpiml.kernels import select
from mpiml.neighbors import NearestNeighbors, _ring

from _spmd import assert_close, check, gpu_shards, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
shard = gpu_shards(comm)


def main():
    rs = np.random.RandomState(3)
    alone = get_comm("self")
    m, d = 2 * select._GEMM_ROWS + 1111, 256
    check(select.gemm_plan(np.float32, 10, "cosine", d) is not None, "d = 256 takes the GEMM route")
    for metric in ("euclidean", "sqeuclidean", "cosine"):
        if metric == "cosine":
            X, Q = rs.randn(m, d).astype(np.float32), rs.randn(300, d).astype(np.float32)
        else:
            X = rs.randint(-2, 3, (m, d)).astype(np.float32)
            Q = rs.randint(-2, 3, (300, d)).astype(np.float32)
        X[m // 2:m // 2 + 100] = X[:100]
        Q[:20] = X[:20]
        for k in (1, 10, 100):
            kw = dict(n_neighbors=k, metric=metric)
            d1, i1 = NearestNeighbors(comm=alone, **kw).fit(cp.asarray(X)).kneighbors(cp.asarray(shard(Q)))
            for strategy in ("ring", "local"):
                _ring.STRATEGY = strategy
                nn = NearestNeighbors(**kw).fit(cp.asarray(shard(X)))
                dd, ii = nn.kneighbors(cp.asarray(shard(Q)))
                assert_close(ii, i1, f"{metric} k={k} {strategy} indices at {size} ranks", exact=True)
                assert_close(dd, d1, f"{metric} k={k} {strategy} distances at {size} ranks", exact=True)
    _ring.STRATEGY = "auto"


guarded(main, comm)
