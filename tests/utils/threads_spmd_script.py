"""Run under mpiexec: the thread limit of every rank, against what the test expects.

argv: mode ("init" | "estimator"), expected threads per rank, expected "applied" (0/1),
expected pool size (-1: do not check the pools).
"""

import sys

import numpy as np
from threadpoolctl import threadpool_info

import mpiml
from _spmd import check, guarded
from mpiml.utils._threads import thread_info

mode, want, applied, pool = sys.argv[1], int(sys.argv[2]), bool(int(sys.argv[3])), int(sys.argv[4])
comm = mpiml.get_comm()


def main():
    check(thread_info() == {}, "a limit before init or any fit")
    if mode == "init":
        mpiml.init(device="cpu")
    else:
        from mpiml.cluster import KMeans

        X = np.random.default_rng(comm.rank).normal(size=(50, 3))
        KMeans(2, random_state=0, n_init=1).fit(X)
    info = thread_info()
    check(info.get("threads") == want, f"threads {info.get('threads')} != {want} ({info})")
    check(info.get("applied") == applied, f"applied {info.get('applied')} != {applied} ({info})")
    check(info.get("ranks_on_node") == comm.size, f"ranks on node {info.get('ranks_on_node')} != {comm.size}")
    if pool >= 0:
        sizes = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
        check(sizes == {pool}, f"BLAS pools {sizes} != {{{pool}}}")
    mpiml.init(device="cpu")  # a second call changes nothing
    check(thread_info()["threads"] == want, "the limit changed on a second call")


guarded(main, comm)
