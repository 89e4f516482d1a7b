"""Run under mpiexec -n N (tests/utils/test_oversubscribed.py): ranks beyond the node's cores.

* :func:`mpiml.utils._threads.node_workers`: one rank a core of the node at most, every rank with
  ``MPIML_OVERSUBSCRIBED=compute``;
* :class:`mpiml.utils._node_memory.NodeBarrier` over a shared window: 300 barriers, ranks arriving late in
  turn and the idle ones sleeping at once; no rank leaves a barrier before every rank has arrived;
* the k-NN search in node memory: the same lists at N ranks (the ranks beyond the cores search nothing) as one
  process, and as every rank searching.
"""

import os
import time

import numpy as np

import mpiml
from _spmd import check, guarded, uneven_bounds
from mpiml.comm.backends.mpi import mpi_module
from mpiml.utils._node_memory import NodeBarrier, free, node_arrays
from mpiml.utils._threads import node_workers, quota_cpus

comm = mpiml.get_comm()
rank, size = comm.rank, comm.size
raw = getattr(getattr(comm, "_world", None), "comm", None)


def check_workers():
    cores = len(os.sched_getaffinity(0))       # (mpiexec leaves the ranks unbound: every rank the same set)
    quota = quota_cpus()
    want = max(1, min(size, cores if quota is None else min(cores, quota)))
    got = node_workers(comm, raw)
    check(got == want, f"node_workers {got}, expected {want} ({cores} cores, quota {quota})")
    os.environ["MPIML_OVERSUBSCRIBED"] = "compute"
    try:
        check(node_workers(comm, raw) == size, "MPIML_OVERSUBSCRIBED=compute: every rank computes")
    finally:
        del os.environ["MPIML_OVERSUBSCRIBED"]


def check_barrier(rounds=300):
    MPI = mpi_module()
    first = [64] + [0] * (size - 1)
    wins, mem = node_arrays(MPI, raw, {"slot": first, "marks": [8] * size}, rank)
    for w in wins.values():
        w.Lock_all(MPI.MODE_NOCHECK)
    slot, marks = mem["slot"].view(np.int64), mem["marks"].view(np.int64)
    if rank == 0:
        slot[:] = 0
    marks[rank] = -1
    for w in wins.values():
        w.Sync()
    comm.barrier()
    barrier = NodeBarrier(slot[:1], size, wins)
    workers = node_workers(comm, raw)
    early = 0
    for i in range(rounds):
        if i % size == rank and i % 7 == 0:
            time.sleep(0.002)                    # a late arrival, a different rank each time
        marks[rank] = i
        barrier.wait(idle=rank >= workers)
        early += int(np.any(marks < i))
        barrier.wait(idle=rank >= workers)       # nobody writes round i + 1 before every rank has read round i
    check(early == 0, f"{early} of {rounds} barriers left before every rank had arrived")
    check(int(slot[0]) == 2 * rounds * size, f"counter {int(slot[0])}, expected {2 * rounds * size}")
    for w in wins.values():
        w.Unlock_all()
    comm.barrier()
    free(wins, mem)


def check_knn():
    from sklearn.datasets import make_blobs

    from mpiml.neighbors import NearestNeighbors

    X, _ = make_blobs(n_samples=3000, n_features=8, centers=6, random_state=0)
    Q, _ = make_blobs(n_samples=400, n_features=8, centers=6, random_state=1)
    b, q = uneven_bounds(X.shape[0], size), uneven_bounds(Q.shape[0], size)
    ref = NearestNeighbors(n_neighbors=7, comm=mpiml.get_comm("self")).fit(X).kneighbors(Q[q[rank]:q[rank + 1]])
    for mode in ("", "compute"):
        os.environ["MPIML_OVERSUBSCRIBED"] = mode
        try:
            nn = NearestNeighbors(n_neighbors=7).fit(X[b[rank]:b[rank + 1]])
            d, i = nn.kneighbors(Q[q[rank]:q[rank + 1]])
        finally:
            del os.environ["MPIML_OVERSUBSCRIBED"]
        check(np.array_equal(i, ref[1]), f"k-NN indices differ from one process (MPIML_OVERSUBSCRIBED={mode!r})")
        check(np.allclose(d, ref[0], rtol=1e-12, atol=1e-12), f"k-NN distances differ ({mode!r})")
    from mpiml.neighbors import _node

    check(size == 1 or _node.LAST.get("search_s") is not None, f"the search ran in node memory: {_node.LAST}")


def main():
    if size > 1:
        check_workers()
        check_barrier()
    check_knn()


if __name__ == "__main__":
    guarded(main, comm)
