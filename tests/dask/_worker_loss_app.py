"""A worker lost in the middle of a Dask-driven fit (test_estimators.py).

``_worker_loss_app.py leave|kill``: the second rank of the SPMD job either
leaves the Dask cluster (its Dask worker closes, the process lives on) or is
killed (SIGKILL) inside ``fit``. ``leave``: the client must get a
DaskSPMDError naming the worker, at once, and refuse the next fit; the script
prints what it got and exits 0. ``kill``: the MPI launcher ends the job.
"""

import os
import signal
import sys
import time

import numpy as np

import dask.array as da
from mpiml.cluster import KMeans
from mpiml.dask import DaskSPMDError, DaskSPMDEstimator, get_client

MODE = sys.argv[1]


class LosingKMeans(KMeans):
    def fit(self, X, y=None, sample_weight=None):
        if self.comm.rank == 1:
            if MODE == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            from distributed import get_worker

            worker = get_worker()
            worker.loop.add_callback(worker.close)
            time.sleep(2)
        return super().fit(X, y, sample_weight)


class DaskLosingKMeans(DaskSPMDEstimator, spmd=LosingKMeans):
    pass


class RaisingKMeans(KMeans):
    def fit(self, X, y=None, sample_weight=None):
        if self.comm.rank == 1:
            raise RuntimeError("boom on one rank")
        return super().fit(X, y, sample_weight)


class DaskRaisingKMeans(DaskSPMDEstimator, spmd=RaisingKMeans):
    pass


client = get_client()
X = da.from_array(np.random.default_rng(0).normal(size=(2000, 4)), chunks=250)
if MODE == "leave":
    # one rank raises while the other waits in a collective (until MPIML_TIMEOUT): the client
    # reports the root cause, and the workers can run the next job
    start = time.perf_counter()
    try:
        DaskRaisingKMeans(n_clusters=3, random_state=0).fit(X)
    except Exception as exc:
        print(f"one rank raised: {type(exc).__name__}: {exc} [{time.perf_counter() - start:.1f} s]".replace("\n", " "),
              flush=True)
start = time.perf_counter()
try:
    DaskLosingKMeans(n_clusters=3, random_state=0).fit(X)
    print("first fit: no error")
except DaskSPMDError as exc:
    print(f"first fit: {exc} [{time.perf_counter() - start:.1f} s]", flush=True)
start = time.perf_counter()
try:
    DaskLosingKMeans(n_clusters=3, random_state=0).fit(X)
    print("second fit: no error")
except DaskSPMDError as exc:
    print(f"second fit: {exc} [{time.perf_counter() - start:.1f} s]", flush=True)
