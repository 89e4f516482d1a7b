"""Routes per mode and a capture begun on the previous collective's stream (run under mpirun, 2-4 GPUs).

Usage: ``python gpu_modes.py``.

1. A table of its own (``MPIML_TUNING_FILE``, ahead of the defaults) routes a bcast / reduce of
   256 KiB-1 MiB to the IPC two-shot eagerly and to NCCL in a CUDA graph (as the checked-in table did
   until the LL two-shot took both modes): each shape is called eagerly, then captured and replayed on
   new inputs, then eagerly again, results checked every time; at 4 ranks the script also checks which
   launcher each mode holds (``_ModeLaunchers``).
2. An eager IPC collective on stream A, a capture begun on A while it may still run, and an eager IPC
   collective on stream B during that capture: the transport cannot mark A's call with an event any
   more, so it synchronizes the device first (``StreamOrder.drain``). Either the B call is right, or
   it raises a ``CommError`` that says to synchronize the stream before the capture (a capture mode
   that refuses the device synchronization); never a wrong result or an overlap. Which one happened
   is printed.

Prints ``OK: 0 failure(s)`` through tests/_spmd.py.
"""

import json
import os
import tempfile

from _spmd import check, guarded

import cupy as cp  # noqa: E402

from mpiml import CommError, init  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402

# routes that differ per mode (rank 0's file is read and agreed when the communicator is made)
_fd, _table = tempfile.mkstemp(suffix=".json", prefix="mpiml_gpu_modes_")
with os.fdopen(_fd, "w") as fh:
    json.dump({"rules": [
        {"op": op, "memory": "device", "mode": mode, "min_ranks": 2, "max_bytes": 1 << 20, "backend": backend,
         "algorithm": algo}
        for op in ("bcast", "reduce")
        for mode, backend, algo in (("eager", "ipc", "twoshot"), ("graph", "nccl", "native"))]}, fh)
os.environ["MPIML_TUNING_FILE"] = _table
comm = get_comm()
os.unlink(_table)
init(device="gpu")
P, R = comm.size, comm.rank


def pattern(n, k, rank):
    return ((cp.arange(n, dtype=cp.int64) + k) % 7 * (rank + 1)).astype(cp.float32)


def sum_of(n, k):
    return pattern(n, k, 0) * (P * (P + 1) // 2)


def run_modes():
    from mpiml.comm._communicator import _ModeLaunchers

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for nbytes in ((256 << 10) + 1024, 1 << 20):
            n = nbytes // 4
            for op in ("bcast", "reduce"):
                root = P - 1
                x = cp.empty(n, dtype=cp.float32)
                out = cp.empty(n, dtype=cp.float32)

                def call():
                    if op == "bcast":
                        return comm.bcast(x, root=root, out=out)
                    return comm.reduce(x, "sum", root=root, out=out)

                def want(k):
                    return pattern(n, k, root) if op == "bcast" else sum_of(n, k)

                def verify(got, k, what):
                    if op == "reduce" and R != root:
                        check(got is None, f"{what}: non-root got {type(got)}")
                    else:
                        check(got is not None and bool(cp.array_equal(got, want(k))), f"{what}: wrong result")

                for k in range(3):  # eager: the first call agrees, the next ones are hot
                    x[...] = pattern(n, k, R)
                    verify(call(), k, f"{op} {nbytes} B eager {k}")
                stream.synchronize()
                stream.begin_capture()
                try:
                    got = call()
                finally:
                    graph = stream.end_capture()
                for k in range(10, 13):
                    x[...] = pattern(n, k, R)
                    graph.launch(stream)
                    verify(got, k, f"{op} {nbytes} B graph replay {k}")
                for k in range(20, 22):
                    x[...] = pattern(n, k, R)
                    verify(call(), k, f"{op} {nbytes} B eager after the graph {k}")
                stream.synchronize()
                if P == 4:
                    key = (op, type(x), x.dtype, x.shape, root if op == "bcast" else ("sum", root), None)
                    hot = comm._hot.get(key)
                    check(isinstance(hot, _ModeLaunchers) and hot.eager is not None,
                          f"{op} {nbytes} B: no per-mode launchers ({type(hot).__name__})")
                del graph


def run_capture_on_the_previous_stream():
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    n, m = 70001, 4099  # (the call on B fits one LL kernel: its hot launcher, which raises without aborting)
    x = pattern(n, 1, R)
    y = pattern(m, 2, R)
    cp.cuda.Device().synchronize()
    for _ in range(2):  # the shapes' first calls (agreed) first
        with a:
            comm.allreduce(x, algorithm="ipc/twoshot")
        with b:
            comm.allreduce(y, algorithm="ipc/ll")
        with a:
            _ = x * 2  # (compiled and pooled before the capture)
    cp.cuda.Device().synchronize()
    outcome, graph, ended = None, None, "ok"
    with a:
        first = comm.allreduce(x, algorithm="ipc/twoshot")  # eager on A; may still run below
        a.begin_capture()
        try:
            twice = x * 2  # (something captured on A)
            with b:
                try:
                    second = comm.allreduce(y, algorithm="ipc/ll")  # eager on B, during A's capture
                    outcome = "ordered"
                except CommError as exc:
                    outcome = f"refused: {exc}"
                    second = None
        finally:
            try:
                graph = a.end_capture()
            except Exception as exc:  # a capture invalidated by the refused synchronization
                ended = f"{type(exc).__name__}: {exc}"
    if graph is not None:
        graph.launch(a)
    cp.cuda.Device().synchronize()
    if graph is not None:
        check(bool(cp.array_equal(twice, x * 2)), "the graph captured on A: wrong result")
    check(bool(cp.array_equal(first, sum_of(n, 1))), "the eager call on A before the capture: wrong result")
    if outcome == "ordered":
        check(bool(cp.array_equal(second, sum_of(m, 2))), "the eager call on B during A's capture: wrong result")
    else:
        check(outcome.startswith("refused") and "synchronize" in outcome, f"unexpected outcome: {outcome}")
    if R == 0:
        print(f"capture begun on the previous collective's stream, eager call on another: {outcome[:300]} "
              f"(end_capture: {ended[:200]})", flush=True)
    del graph
    return outcome


def main():
    run_modes()
    outcome = run_capture_on_the_previous_stream()
    if outcome == "ordered":  # the communicator goes on after it
        z = pattern(4099, 3, R)
        check(bool(cp.array_equal(comm.allreduce(z), sum_of(4099, 3))), "a call after the drained one: wrong")
    comm.synchronize()


guarded(main, comm)
