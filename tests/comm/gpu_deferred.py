"""Repeated device calls that part across ranks: found at the next round, the same error on every rank.

Usage: ``python gpu_deferred.py BACKENDS`` under mpirun (2+ GPUs).  A shape's
first call is agreed; its repeats run at once and are agreed with the next
round.  Here the ranks' repeats differ in their reduction (the kernels of one
shape complete either way), or rank 0 makes one repeat more (its kernel waits
for peers that never come), at a size below and one above 1 MiB; the next
checked call (a barrier), or the round after ``MPIML_CHECK_EVERY`` repeats,
must raise ``CollectiveMismatchError`` with one text on every rank, and the
communicator must refuse every later call.
"""

import sys

import cupy as cp
import numpy as np

from _spmd import check, guarded

from mpiml import init
from mpiml.comm import Communicator, get_comm

comm = get_comm()
init(device="gpu")
R, P = comm.rank, comm.size
KEEP = []


def outcome(fn):
    try:
        fn()
        return "returned", ""
    except Exception as exc:  # noqa: BLE001 (compared across ranks)
        return type(exc).__name__, str(exc)


def case(backend, n, every):
    c = Communicator(comm._world)
    KEEP.append(c)
    c._check_every = every
    algo = f"{backend}/native"
    x = cp.ones(n, dtype=cp.float32)
    c.allreduce(x, "sum", algorithm=algo)
    c.allreduce(x, "max", algorithm=algo)
    c.allreduce(x, "sum", algorithm=algo)  # a repeat, the same everywhere
    check(len(c._deferred) == 1, f"{backend} n={n}: the repeat was not deferred ({len(c._deferred)})")
    got = outcome(lambda: c.allreduce(x, "sum" if R == 0 else "max", algorithm=algo))
    tag = f"{backend} n={n} every={every}"
    if every > 2:
        check(got[0] == "returned", f"{tag}: the parting call raised {got}")
        got = outcome(c.barrier)
    texts = comm.allgather_obj(got)
    check(got[0] == "CollectiveMismatchError" and "mismatched op" in got[1], f"{tag}: got {got}")
    check(len(set(texts)) == 1, f"{tag}: different errors on the ranks: {texts}")
    after = outcome(lambda: c.allreduce(x, algorithm=algo))
    check(after[0] == "CommAbortedError", f"{tag}: afterwards {after}")


def skipped(backend, n):
    """Rank 0 makes one repeated call more than the others: its kernel waits for peers that never
    come; the next round (a barrier) names the parting call on every rank, and the abort frees the
    waiting kernel."""
    c = Communicator(comm._world)
    KEEP.append(c)
    algo = f"{backend}/native"
    x = cp.ones(n, dtype=cp.float32)
    c.allreduce(x, algorithm=algo)
    c.allreduce(x, algorithm=algo)
    if R == 0:
        c.allreduce(x, algorithm=algo)
    got = outcome(c.barrier)
    texts = comm.allgather_obj(got)
    tag = f"{backend} n={n} skipped call"
    check(got[0] == "CollectiveMismatchError" and "mismatched collective" in got[1], f"{tag}: got {got}")
    check(len(set(texts)) == 1, f"{tag}: different errors on the ranks: {texts}")
    sync = outcome(c.synchronize)
    check(sync[0] == "CommAbortedError", f"{tag}: synchronize gave {sync}")
    cp.cuda.get_current_stream().synchronize()  # the kernel left waiting gave up at the abort (else: a hang)


def main():
    for backend in sys.argv[1].split(","):
        for n in (1000, 1 << 20):
            for every in (1024, 2):
                case(backend, n, every)
            skipped(backend, n)
        if R == 0:
            print(f"  {backend}: deferred mismatches raised everywhere", flush=True)
    _ = np


guarded(main, comm)
