"""k-NN over an index larger than one GPU's share: 10^8 x 32 float32 rows spread over the ranks'
GPUs (12.8 GB in all), 10^5 queries spread over the ranks, k = 10, at the defaults.

    mpirun -n 4 python3 benchmarks/ml/knn_big_index.py [--rows 1e8] [--queries 1e5] [--json PATH]

Each rank draws its own rows on its GPU, fits, and times ``kneighbors`` of its queries (the slowest
rank's time is reported), with the peak of CuPy's memory pool per rank.
"""

import argparse
import json
import time

import cupy as cp
import numpy as np

import mpiml
from mpiml.comm import get_comm
from mpiml.neighbors import NearestNeighbors
from mpiml.bench._common import stamp

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=float, default=1e8)
ap.add_argument("--queries", type=float, default=1e5)
ap.add_argument("--features", type=int, default=32)
ap.add_argument("--k", type=int, default=10)
ap.add_argument("--json", default=None)
args = ap.parse_args()
mpiml.init()
comm = get_comm()
n = int(args.rows) // comm.size
q = int(args.queries) // comm.size
rs = cp.random.RandomState(1234 + comm.rank)
X = rs.standard_normal((n, args.features), dtype=cp.float32)
Q = rs.standard_normal((q, args.features), dtype=cp.float32)
nn = NearestNeighbors(n_neighbors=args.k).fit(X)
nn.kneighbors(Q[:64])                     # compiles / loads the kernels outside the timing
comm.barrier()
t = time.perf_counter()
d, i = nn.kneighbors(Q)
cp.cuda.Device().synchronize()
mine = time.perf_counter() - t
times = comm.allgather_obj(mine)
peak = comm.allgather_obj(cp.get_default_memory_pool().total_bytes())
ok = bool((i >= 0).all() and (i < n * comm.size).all() and (cp.diff(d, axis=1) >= 0).all())
oks = comm.allgather_obj(ok)
if comm.rank == 0:
    out = {"benchmark": "knn_big_index", "rows": n * comm.size, "queries": q * comm.size, "k": args.k,
           "features": args.features, "ranks": comm.size, "seconds_slowest_rank": max(times),
           "seconds_per_rank": times, "pool_bytes_per_rank": peak, "valid": all(oks),
           "strategy": getattr(nn, "strategy_", None), **stamp(["benchmarks/ml/knn_big_index.py"])}
    print(json.dumps(out, indent=1))
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)
