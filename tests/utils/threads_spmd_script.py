"""Run under mpiexec: the thread limit of every rank, against what the test expects.

argv (or ``main``'s arguments, as a case of ``tests/_spmd_cases.py``): mode ("init" | "estimator" |
"kernels"), expected threads per rank, expected "applied" (0/1), expected pool size (-1: do not check
the pools).  "kernels" fits a forest first (the first module to import Numba), then neighbours and
KMeans, and checks Numba's pool and threading layer too: OpenMP's spinning threads, picked when the
forest imported Numba first, made the later BLAS products of a rank 3-5 times slower; so a launch's
"kernels" case must come first (test_threads.py's order), the limit of each earlier case being undone
before the next (:func:`forget_earlier_limit`).
"""

import os
import sys

import numpy as np
from threadpoolctl import threadpool_info

import mpiml
from _spmd import check, guarded
from mpiml.utils import _threads
from mpiml.utils._threads import thread_info

comm = mpiml.get_comm()
_AFFINITY = os.sched_getaffinity(0)   # the launcher's, before any case placed this rank


def forget_earlier_limit():
    """This process as before any limit, where an earlier case of the launch set one: the pools given back
    their sizes, the variables the limit put in the environment taken out (Numba's kept once Numba is
    imported: its pool is launched, and a compile that reads another size fails), the state cleared."""
    while _threads._LIMITER:
        _threads._LIMITER.pop().restore_original_limits()
    for name, value in list(_threads._OURS.items()):
        if "numba" in sys.modules and name.startswith("NUMBA_"):
            continue
        if os.environ.get(name) == value:
            del os.environ[name]
        del _threads._OURS[name]
    _threads._STATE.clear()
    os.sched_setaffinity(0, _AFFINITY)   # an earlier case's placement undone too


def main(mode, want, applied, pool):
    want, applied, pool = int(want), bool(int(applied)), int(pool)
    forget_earlier_limit()
    cores = len(_AFFINITY)
    if _threads._user_setting() == (None, None) and not os.environ.get("MPIML_BIND", "").strip() and \
            _threads._leftover({"ranks": comm.size, "local_rank": comm.rank}, cores):
        want = cores // (comm.size % cores)      # a rank beyond the last multiple of the cores: threads over them
        pool = want if pool >= 0 else pool
    check(thread_info() == {}, "a limit before init or any fit")
    if mode == "init":
        mpiml.init(device="cpu")
    elif mode == "estimator":
        from mpiml.cluster import KMeans

        X = np.random.default_rng(comm.rank).normal(size=(50, 3))
        KMeans(2, random_state=0, n_init=1).fit(X)
    else:
        from mpiml.cluster import KMeans
        from mpiml.ensemble import RandomForestClassifier
        from mpiml.neighbors import NearestNeighbors

        X = np.random.default_rng(comm.rank).normal(size=(60, 3))
        RandomForestClassifier(2, max_depth=3, random_state=0).fit(X, (X[:, 0] > 0).astype(int))
        NearestNeighbors(n_neighbors=2).fit(X).kneighbors(X[:5])
        KMeans(2, random_state=0, n_init=1).fit(X)
        import numba

        check(numba.get_num_threads() == want, f"Numba threads {numba.get_num_threads()} != {want}")
        check(numba.threading_layer() == "workqueue", f"Numba's threading layer is {numba.threading_layer()}")
        # the pool itself is the rank's share (its layer wakes every thread of the pool at each kernel launch)
        check(numba.config.NUMBA_NUM_THREADS == want, f"Numba's pool {numba.config.NUMBA_NUM_THREADS} != {want}")
    info = thread_info()
    check(info.get("threads") == want, f"threads {info.get('threads')} != {want} ({info})")
    check(info.get("applied") == applied, f"applied {info.get('applied')} != {applied} ({info})")
    check(info.get("ranks_on_node") == comm.size, f"ranks on node {info.get('ranks_on_node')} != {comm.size}")
    if pool >= 0:
        sizes = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
        check(sizes == {pool}, f"BLAS pools {sizes} != {{{pool}}}")
    check_placement(info)
    mpiml.init(device="cpu")  # a second call changes nothing
    check(thread_info()["threads"] == want, "the limit changed on a second call")


def check_placement(info):
    """Unbound ranks (MPICH binds none) each pinned to their own CPUs while every rank has a physical core (with
    MPIML_BIND=auto), pinned round robin where ranks outnumber the cores (MPIML_BIND unset); the same rule on
    every rank."""
    import os

    from mpiml.utils._placement import DEFAULT, node_cores

    cores = node_cores(sorted(_AFFINITY))
    bound = comm.allgather_obj(info.get("bound_to"))
    on = os.environ.get("MPIML_BIND", DEFAULT).strip().lower() not in ("none", "0", "off", "no", "false")
    C = len(cores)
    if not os.environ.get("MPIML_BIND", "").strip() and comm.size > C and _threads.quota_cpus() is None:
        # ranks beyond the cores, unbound: round robin, but for those beyond the last multiple (_round_robin)
        want = [None if _threads._leftover({"ranks": comm.size, "local_rank": r}, C) else cores[r % C]
                for r in range(comm.size)]
        check(bound == want, f"round robin over {C} cores: {bound}, expected {want}")
    elif on and 1 < comm.size <= len(cores) and info.get("threads", 0) <= len(cores) // comm.size:
        check(all(bound), f"every rank pinned: {info.get('placement')}")
        flat = [c for b in bound if b for c in b]
        check(len(flat) == len(set(flat)), f"the ranks' CPU sets overlap: {bound}")
        check(sorted(os.sched_getaffinity(0)) == info["bound_to"], "this thread's CPUs are not the block")
    else:
        check(not any(bound), f"no rank pinned ({comm.size} ranks, {len(cores)} cores): {bound}")


if __name__ == "__main__":
    guarded(lambda: main(*sys.argv[1:5]), comm)
