"""GPU collectives on CuPy buffers: raw CuPy-NCCL vs mpiml's nccl, ipc, staged MPI, algorithms, auto.

Run under ``mpirun -n N``; rank 0 writes ``--out FILE.json``.  Times are per
call, the maximum over ranks, with the host timing N back-to-back calls that
are synchronised at the end ("eager"; the way the raw NCCL figure of the GPU
host was taken), each call waited for ("sync"), or N calls captured in one CUDA
graph and replayed ("graph").  algbw = bytes / time; busbw follows nccl-tests
(allreduce x 2(p-1)/p, allgather x (p-1)/p of the total, bcast/reduce x 1).
"""

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time

import numpy as np

import cupy as cp
from cupy.cuda import nccl

from mpiml.bench._graphs import time_eager, time_graph
from mpiml.comm import get_comm
from mpiml import init

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--max-bytes", type=int, default=256 << 20)
ap.add_argument("--ops", default="allreduce,bcast,allgather,reduce")
ap.add_argument("--modes", default="eager,sync,graph")
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()

os.environ.setdefault("MPIML_CHECK", "0")
comm = get_comm()
init(device="gpu")  # local rank mod visible GPUs
P, R = comm.size, comm.rank
stream = cp.cuda.Stream(non_blocking=True)
stream.use()

uid = comm.bcast_obj(nccl.get_unique_id() if R == 0 else None)
raw = nccl.NcclCommunicator(P, uid, R)
NCCL_T = {np.dtype(np.float32): nccl.NCCL_FLOAT32}

sizes = [4 << (2 * i) for i in range(14) if (4 << (2 * i)) <= args.max_bytes]  # 4 B, 16 B, 64 B, ... 256 MiB
if args.quick:
    sizes = [s for s in sizes if s in (4, 1024, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20)]
BUS = {"allreduce": 2 * (P - 1) / P, "allgather": (P - 1) / P, "bcast": 1.0, "reduce": 1.0}


def iters_for(nbytes, path):
    if path == "mpi":
        return max(3, min(50, int(2e8 / max(nbytes, 1))))
    return max(5, min(300, int(4e9 / max(nbytes, 1))))


def make_call(op, path, nbytes):
    """A zero-argument callable running one ``op`` of ``nbytes`` on ``path``, or None."""
    n = max(1, nbytes // 4)
    if op == "allgather":
        n = max(1, nbytes // 4 // P)
    x = cp.ones(n, dtype=cp.float32)
    y = cp.empty(n * (P if op == "allgather" else 1), dtype=cp.float32)
    s = stream.ptr
    if path == "raw":
        if op == "allreduce":
            return lambda: raw.allReduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        if op == "bcast":
            return lambda: raw.bcast(x.data.ptr, n, nccl.NCCL_FLOAT32, 0, stream.ptr)
        if op == "reduce":
            return lambda: raw.reduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0, stream.ptr)
        if op == "allgather":
            return lambda: raw.allGather(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, stream.ptr)
    del s
    algo = {"nccl": "nccl/native", "ipc": "ipc/native", "mpi": "mpi/native", "auto": None,
            "ring": "nccl/ring", "two_level": "ipc/two_level"}[path]
    if path == "ring" and op != "allreduce":
        return None
    if path == "two_level" and op != "allreduce":
        return None
    if op == "allreduce":
        return lambda: comm.allreduce(x, out=y, algorithm=algo)
    if op == "bcast":
        return lambda: comm.bcast(x, root=0, algorithm=algo)
    if op == "reduce":
        return lambda: comm.reduce(x, root=0, algorithm=algo)
    if op == "allgather":
        return lambda: comm.allgather(x, algorithm=algo)


def set_sync(flag):
    for t in list(comm._device_transports.values()):
        if hasattr(t, "_sync"):
            t._sync = flag
        for sub in (getattr(t, "_fallback", None), *(getattr(t, "_two_level_parts", None) or ())):
            if sub is not None and hasattr(sub, "_sync"):
                sub._sync = flag


def agree(t):
    return comm.allreduce_obj(t, "max")


# create every transport before timing (so set_sync reaches them) and compile the kernels
_w = cp.ones(1024, dtype=cp.float32)
for _a in ("nccl/native", "ipc/native", "ipc/twoshot", None):
    try:
        comm.allreduce(_w, algorithm=_a)
        comm.bcast(_w, algorithm=_a)
        comm.reduce(_w, algorithm=_a)
        comm.allgather(_w, algorithm=_a)
    except Exception as exc:
        if R == 0:
            print(f"warm-up {_a}: {type(exc).__name__}: {exc}", flush=True)
stream.synchronize()

results = []
paths = ["raw", "nccl", "ipc", "auto", "ring", "mpi"]
if os.environ.get("MPIML_NODE_SIZE"):
    paths.append("two_level")
t_start = time.perf_counter()
for op in args.ops.split(","):
    for nbytes in sizes:
        for path in paths:
            if path == "mpi" and nbytes > (64 << 20):
                continue
            if path == "ring" and nbytes > (64 << 20):
                continue
            try:
                fn = make_call(op, path, nbytes)
            except Exception as exc:  # e.g. out of memory
                fn = None
                if R == 0:
                    print(f"skip {op} {path} {nbytes}: {exc}", flush=True)
            if fn is None:
                continue
            it = iters_for(nbytes, path)
            for mode in args.modes.split(","):
                if mode == "graph" and path in ("mpi", "ring"):
                    continue  # staged MPI waits on the host; ring waits per step
                if mode == "sync" and path == "raw":
                    def run(fn=fn):
                        fn()
                        stream.synchronize()
                else:
                    run = fn
                err = None
                try:
                    set_sync(mode == "sync")
                    if mode == "graph":
                        t = time_graph(run, max(2, it // 20), calls=20, barrier=comm.barrier)
                    else:
                        t = time_eager(run, it, barrier=comm.barrier)
                except Exception as exc:
                    err = f"{type(exc).__name__}: {exc}"[:300]
                    t = float("nan")
                    try:
                        stream.synchronize()
                    except Exception:
                        pass
                errs = comm.allgather_obj(err)
                t = float("nan") if any(errs) else agree(t)
                rec = {"op": op, "path": path, "mode": mode, "bytes": nbytes, "seconds": t,
                       "us": t * 1e6, "algbw_GBps": nbytes / t / 1e9 if t == t else None,
                       "busbw_GBps": nbytes / t / 1e9 * BUS[op] if t == t else None}
                if any(errs):
                    rec["error"] = next(e for e in errs if e)
                results.append(rec)
                if R == 0:
                    print(f"{op:10s} {path:9s} {mode:5s} {nbytes:>10d} B {t * 1e6:10.1f} us"
                          + (f"  ERROR {rec['error']}" if "error" in rec else ""), flush=True)
set_sync(True)

# where the microseconds go (small allreduce, 4 B)
micro = {}
x = cp.ones(1, dtype=cp.float32)
y = cp.empty(1, dtype=cp.float32)
k = cp.RawKernel(r'extern "C" __global__ void mpiml_noop(float* a) {}', "mpiml_noop")
k((1,), (32,), (x,))
micro["cupy_rawkernel_launch_us"] = time_eager(lambda: k((1,), (32,), (x,)), 2000) * 1e6
big = cp.ones(64 << 18, dtype=cp.float32)  # 64 MiB
pinned = cp.cuda.alloc_pinned_memory(big.nbytes)
hbuf = np.frombuffer(pinned, dtype=np.float32, count=big.size)
t = time_eager(lambda: big.get(out=hbuf, stream=stream), 5)
micro["d2h_64MiB_GBps"] = big.nbytes / t / 1e9
t = time_eager(lambda: big.set(hbuf, stream=stream), 5)
micro["h2d_64MiB_GBps"] = big.nbytes / t / 1e9
micro["cupy_empty_us"] = time_eager(lambda: cp.empty(1, dtype=cp.float32), 2000) * 1e6
try:
    ipc = comm._device_transports.get("ipc")
    if ipc is not None and not getattr(ipc, "multi_node", False):
        ipc._sync = False
        micro["ipc_transport_allreduce_us"] = agree(time_eager(lambda: ipc.native_allreduce(x, y, "sum"), 2000,
                                                               barrier=comm.barrier)) * 1e6
        fn = ipc._kernel("allreduce", "mpiml_allreduce_oneshot", np.dtype(np.float32), "sum", True)
        micro["ipc_raw_launch_us"] = agree(time_eager(lambda: ipc._launch(fn, 1, x.data.ptr, y.data.ptr, 1, 0), 2000,
                                                      barrier=comm.barrier)) * 1e6
        micro["comm_allreduce_ipc_async_us"] = agree(time_eager(
            lambda: comm.allreduce(x, out=y, algorithm="ipc/native"), 2000, barrier=comm.barrier)) * 1e6
        ipc._sync = True
except Exception as exc:
    micro["error"] = f"{type(exc).__name__}: {exc}"
# where the Python time of a small eager call goes (rank 0's profile, printed)
import cProfile
import io
import pstats

set_sync(False)
prof = cProfile.Profile()
comm.barrier()
prof.enable()
for _ in range(2000):
    comm.allreduce(x, out=y)
prof.disable()
stream.synchronize()
set_sync(True)
if R == 0:
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    print("profile of 2000 comm.allreduce(4 B, out=y), auto, async:\n" + buf.getvalue()[-3500:], flush=True)
if R == 0:
    print("micro:", micro, flush=True)
    doc = {"machine": f"{socket.gethostname()} {platform.machine()} "
                      f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} x{cp.cuda.runtime.getDeviceCount()}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": f"mpirun -n {P} " + " ".join([sys.executable] + sys.argv),
           "ranks": P, "nccl_version": nccl.get_version(), "cupy": cp.__version__,
           "node_size": os.environ.get("MPIML_NODE_SIZE"),
           "seconds_total": time.perf_counter() - t_start, "micro": micro, "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out} ({len(results)} rows, {time.perf_counter() - t_start:.0f} s)", flush=True)
