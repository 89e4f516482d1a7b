"""Multi-rank probe of the device collectives and KMeans at one shape: the paths that device allreduces of
33 KB, 525 KB and 2 MB take (with their first-call times), then a 20-iteration KMeans fit of 2e6 x 1024
float32 rows, k = 64, split over the ranks, with the communication profile.  A wait that outlasts PROBE_T
seconds (default 70) dumps every thread's Python stack and exits (faulthandler).  GPU host:

    MPIML_TIMEOUT=45 mpirun -n 4 python benchmarks/ml/multi_rank_probe.py
"""
import faulthandler
import os
import time

faulthandler.dump_traceback_later(int(os.environ.get("PROBE_T", "70")), exit=True)
import cupy as cp
import numpy as np

import mpiml
from mpiml.comm import get_comm

mpiml.init()
comm = get_comm()
for n in (4162, 65602, 262146):
    x = cp.ones(n, dtype=cp.float64) * (comm.rank + 1)
    t = time.perf_counter()
    with mpiml.profile() as p:
        y = comm.allreduce(x)
        comm.synchronize()
    ok = bool((y == comm.size * (comm.size + 1) / 2).all())
    if comm.rank == 0:
        print("allreduce", n, ok, round(time.perf_counter() - t, 4), p.summary(as_text=True).replace("\n", " | "),
              flush=True)
from mpiml.cluster import KMeans
from mpiml.datasets import make_blobs

X, _ = make_blobs(2 * 10**6, 1024, centers=64, cluster_std=4.0, random_state=0, device="gpu", dtype=np.float32)
if comm.rank == 0:
    print("data", X.shape, flush=True)
t = time.perf_counter()
with mpiml.profile() as p:
    km = KMeans(64, init="random", n_init=1, max_iter=20, tol=0.0, random_state=0, verbose=0).fit(X)
    cp.cuda.Device().synchronize()
if comm.rank == 0:
    print("fit", round(time.perf_counter() - t, 3), km.n_iter_, p.summary(as_text=True).replace("\n", " | "),
          flush=True)
