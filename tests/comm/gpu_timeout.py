"""A peer that never joins: the others get CommTimeoutError, not a hang (run under mpirun).

Usage: ``MPIML_TIMEOUT=3 python gpu_timeout.py BACKEND``.  The last rank skips
one allreduce; every other rank must raise CommTimeoutError within a few times
the timeout.  Then the ranks agree on the verdict over host MPI.
"""

import sys
import time

import numpy as np

from _spmd import check, guarded

import cupy as cp  # noqa: E402

from mpiml import CommTimeoutError  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402
from mpiml.comm.backends._device import bind_device  # noqa: E402

comm = get_comm()
bind_device(comm)
BACKEND = sys.argv[1]


def main():
    x = cp.arange(1000, dtype=cp.float32)
    algo = f"{BACKEND}/native"
    comm.allreduce(x, algorithm=algo)  # connects every rank
    cp.cuda.get_current_stream().synchronize()
    comm.barrier()
    if comm.rank == comm.size - 1:
        time.sleep(1.0)
        return  # never joins
    t = time.perf_counter()
    try:
        comm.allreduce(x, algorithm=algo)
        cp.cuda.get_current_stream().synchronize()
        check(False, f"{BACKEND}: allreduce without a peer returned")
    except CommTimeoutError as exc:
        took = time.perf_counter() - t
        check(took < 30, f"{BACKEND}: timeout took {took:.1f} s")
        print(f"rank {comm.rank}: {BACKEND} CommTimeoutError after {took:.1f} s: {exc}", flush=True)
    except Exception as exc:  # pragma: no cover - reported as failure
        check(False, f"{BACKEND}: expected CommTimeoutError, got {type(exc).__name__}: {exc}")
    np.zeros(1)


guarded(main, comm)
