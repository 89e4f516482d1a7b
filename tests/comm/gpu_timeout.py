"""A peer that stalls or dies mid-collective: every survivor raises, none hangs (run under mpirun).

Usage: ``MPIML_TIMEOUT=3 python gpu_timeout.py BACKEND MODE`` with MODE

* ``stall``: the last rank does not join one allreduce for ``MPIML_TIMEOUT`` + 8 s;
* ``kill``: the last rank enqueues the allreduce behind a long kernel and exits
  at once (run with Open MPI's ``orte_allowed_exit_without_sync`` so that the
  launcher lets the others go on);
* ``sync``: like ``stall``, with ``MPIML_DEVICE_SYNC=1`` (the call itself raises);
* ``dead``: like ``kill``, but the last rank kills itself (SIGKILL), ``MPIML_TIMEOUT``
  is unset and every rank runs under ``tests/faults/keep_survivors.py`` (the launcher
  lets the others go on): the survivors must find the peer's process gone and raise
  ``CommAbortedError`` naming it within 5 s.  Survivors write ``$MPIML_FAULT_OUT/rank<k>.json``
  when done.

Collectives are stream-ordered (the default): the survivors' allreduce returns
at once; ``comm.synchronize()`` (the first survivors) or the next calls (the
others) must raise ``CommAbortedError`` / ``CommTimeoutError`` within
``MPIML_TIMEOUT`` + 5 s, and every later call must raise ``CommAbortedError``.
The verdict travels over a plain mpi4py communicator of the survivors (the
mpiml communicator is aborted by then).
"""

import os
import signal
import sys
import time

import cupy as cp
from mpi4py import MPI

from mpiml import CommAbortedError, CommTimeoutError
from mpiml.comm import get_comm
from mpiml import init

BACKEND, MODE = sys.argv[1], sys.argv[2]
comm = get_comm()
init(device="gpu")  # local rank mod visible GPUs
world = MPI.COMM_WORLD
victim = comm.size - 1
survivors = world.Split(0 if comm.rank != victim else MPI.UNDEFINED, comm.rank)
limit = 0.0 if MODE == "dead" else float(os.environ["MPIML_TIMEOUT"])
algo = f"{BACKEND}/native"
failures = []


def main():
    x = cp.arange(1000, dtype=cp.float32)
    comm.allreduce(x, algorithm=algo)  # connects every rank, compiles
    comm.allreduce(x, algorithm=algo)
    comm.synchronize()
    comm.barrier()
    if comm.rank == victim:
        if MODE in ("kill", "dead"):
            spin = cp.RawKernel(r'''extern "C" __global__ void mpiml_test_spin(long long n) {
                long long t0 = clock64(); while (clock64() - t0 < n) {} }''', "mpiml_test_spin")
            spin((1,), (1,), (cp.int64(10**12),))
            comm.allreduce(x, algorithm=algo)
            sys.stdout.flush()
            if MODE == "dead":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(0)
        time.sleep(limit + 8)
        return
    t = time.perf_counter()
    first = None
    try:
        if MODE == "sync" or comm.rank % 2 == 0:
            comm.allreduce(x, algorithm=algo)
            comm.synchronize()
        else:  # keep calling (stream-ordered) until a call raises
            while time.perf_counter() - t < limit + 30:
                comm.allreduce(x, algorithm=algo)
                time.sleep(0.05)
        failures.append(f"rank {comm.rank}: {BACKEND} {MODE}: no error without the peer")
    except (CommAbortedError, CommTimeoutError) as exc:
        first = exc
    except Exception as exc:
        failures.append(f"rank {comm.rank}: expected CommAbortedError/CommTimeoutError, got "
                        f"{type(exc).__name__}: {exc}")
    took = time.perf_counter() - t
    if first is not None:
        if took > limit + 5:
            failures.append(f"rank {comm.rank}: raised after {took:.1f} s > MPIML_TIMEOUT + 5")
        if "allreduce" not in str(first) and "synchronize" not in str(first):
            failures.append(f"rank {comm.rank}: the error names no op: {first}")
        if MODE == "dead" and f"rank {victim} is dead" not in str(first):
            failures.append(f"rank {comm.rank}: the error does not name the dead rank: {first}")
        print(f"rank {comm.rank}: {BACKEND} {MODE}: {type(first).__name__} after {took:.1f} s: {first}", flush=True)
        for call in (lambda: comm.allreduce(x, algorithm=algo), comm.synchronize,
                     lambda: comm.bcast(x, algorithm=algo)):
            try:
                call()
                failures.append(f"rank {comm.rank}: a call after the failure did not raise")
            except CommAbortedError:
                pass
            except Exception as exc:
                failures.append(f"rank {comm.rank}: after the failure: {type(exc).__name__}: {exc}")


try:
    main()
except Exception as exc:  # pragma: no cover - reported
    failures.append(f"rank {comm.rank}: {type(exc).__name__}: {exc}")
if survivors != MPI.COMM_NULL:
    total = survivors.allreduce(len(failures))
    for f in failures:
        print("FAIL", f, flush=True)
    if survivors.rank == 0:
        print(("OK" if total == 0 else "FAILED") + f": {total} failure(s) over {survivors.size} survivors", flush=True)
    code = 0 if total == 0 else 1
else:
    code = 0
sys.stdout.flush()
sys.stderr.flush()
if MODE == "dead":
    with open(os.path.join(os.environ["MPIML_FAULT_OUT"], f"rank{comm.rank}.json"), "w") as f:
        f.write("{}")
if MODE in ("kill", "dead"):
    os._exit(code)  # a dead peer: MPI_Finalize would wait for it
world.Barrier()
sys.exit(code)
