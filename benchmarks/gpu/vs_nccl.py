"""mpiml's device collectives against raw CuPy-NCCL, on the same buffers in the same process.

Run under ``mpirun -n N`` (one rank per GPU); rank 0 writes ``--out FILE.json``
(machine, date, command, every row) and, with ``--plot``, a PNG.

For each op and size, every path runs on the *same* CuPy buffers, interleaved in
``--rounds`` rounds (the median is kept, so drift hits every path alike):

* ``raw``: ``cupy.cuda.nccl.NcclCommunicator`` called directly (the peer);
* ``auto``: ``comm.allreduce(x, out=y)`` / ``comm.bcast(x)`` as a user calls it
  (the tuning table, the hot path, stream-ordered);
* ``nccl``, ``ipc/ll``, ``ipc/oneshot``, ``ipc/twoshot``, ``ipc/pull``: one
  path forced with ``algorithm=``.

Modes: ``eager`` (``iters`` back-to-back calls, one stream sync at the end,
host-timed; per call) and ``graph`` (20 calls captured in one CUDA graph,
replayed; per call: the device time plus 1/20 of a graph launch).  Times are
the maximum over ranks.  ``host`` rows give the host time per call alone: the
stream is held by a busy kernel while ``HOST_CALLS`` calls are enqueued.

Floors (in the JSON): a kernel cannot start sooner than the previous one
ends, and data cannot cross NVLink faster than ``--link-GBps`` (450 GB/s per
direction per GPU on the H200 host): allreduce moves 2(p-1)/p of the bytes
through each GPU's links, bcast (p-1)/p... at least 1 x bytes on the root.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time

import numpy as np

import cupy as cp
from cupy.cuda import nccl

from mpiml.bench._graphs import capture
from mpiml.comm import get_comm
from mpiml.comm.backends._device import bind_device

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--plot", default=None)
ap.add_argument("--ops", default="allreduce,bcast")
ap.add_argument("--modes", default="eager,graph")
ap.add_argument("--min-bytes", type=int, default=4)
ap.add_argument("--max-bytes", type=int, default=256 << 20)
ap.add_argument("--sizes", default=None, help="comma list of sizes in bytes (overrides min/max)")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--link-GBps", type=float, default=450.0)
ap.add_argument("--paths", default="raw,auto,nccl,ipc/ll,ipc/oneshot,ipc/twoshot,ipc/pull")
args = ap.parse_args()

os.environ.setdefault("MPIML_CHECK", "0")  # the peer checks nothing either
comm = get_comm()
bind_device(comm)
P, R = comm.size, comm.rank
stream = cp.cuda.Stream(non_blocking=True)
stream.use()
uid = comm.bcast_obj(nccl.get_unique_id() if R == 0 else None)
raw = nccl.NcclCommunicator(P, uid, R)
HOST_CALLS = 200

if args.sizes:
    sizes = [int(s) for s in args.sizes.split(",")]
else:
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
ipc = None


def ipc_limits():
    t = comm._device_transports.get("ipc")
    return (t.ll_max, t.cap) if t is not None else (0, 0)


def make_call(op, path, nbytes, x, y):
    n = x.size
    if path == "raw":
        if op == "allreduce":
            return lambda: raw.allReduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        return lambda: raw.bcast(x.data.ptr, n, nccl.NCCL_FLOAT32, 0, stream.ptr)
    ll_max, cap = ipc_limits()
    if path == "ipc/ll" and nbytes > ll_max:
        return None
    if path in ("ipc/oneshot",) and (op != "allreduce" or nbytes > (4 << 20)):
        return None
    if path == "ipc/twoshot" and (op != "allreduce" or nbytes < (64 << 10)):
        return None
    if path == "ipc/pull" and op != "bcast":
        return None
    algo = {"auto": None, "nccl": "nccl/native"}.get(path, path)
    if op == "allreduce":
        return lambda: comm.allreduce(x, out=y, algorithm=algo)
    return lambda: comm.bcast(x, root=0, algorithm=algo)


def eager(fn, iters):
    for _ in range(3):
        fn()
    stream.synchronize()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    stream.synchronize()
    return (time.perf_counter() - t0) / iters


def graph(fn, iters, calls=20):
    fn()
    stream.synchronize()
    g = capture(fn, calls)
    g.launch(stream)
    stream.synchronize()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        g.launch(stream)
    stream.synchronize()
    return (time.perf_counter() - t0) / (iters * calls)


_spin = cp.RawKernel(r'''extern "C" __global__ void mpiml_bench_spin(long long ns) {
    long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0; while (t - t0 < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } }''',
                     "mpiml_bench_spin")


def host_cost(fn, calls=HOST_CALLS):
    """Host seconds per call, measured while the stream is held by a busy kernel (no GPU feedback)."""
    fn()
    stream.synchronize()
    comm.barrier()
    _spin((1,), (1,), (np.int64(50_000_000),))  # 50 ms
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls
    stream.synchronize()
    return t


def agree(t):
    return comm.allreduce_obj(t, "max")


def floor_us(op, nbytes):
    link = args.link_GBps * 1e9
    if op == "allreduce":
        return 2 * (P - 1) / P * nbytes / link * 1e6
    return (P - 1) / P * nbytes / link * 1e6 if P > 1 else 0.0


def iters_for(nbytes):
    return max(10, min(300, int(3e9 / max(nbytes, 1))))


# warm-up: create the transports, compile every kernel used below
w = cp.ones(1024, dtype=cp.float32)
wy = cp.empty_like(w)
for p in args.paths.split(","):
    for op in args.ops.split(","):
        try:
            fn = make_call(op, p, w.nbytes, w, wy)
            if fn is not None:
                fn()
        except Exception as exc:
            if R == 0:
                print(f"warm-up {op} {p}: {type(exc).__name__}: {exc}", flush=True)
stream.synchronize()

rows = []
t_start = time.perf_counter()
for op in args.ops.split(","):
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        x = cp.ones(n, dtype=cp.float32)
        y = cp.empty_like(x)
        calls = {}
        for p in args.paths.split(","):
            fn = make_call(op, p, nbytes, x, y)
            if fn is not None:
                calls[p] = fn
        it = iters_for(nbytes)
        for mode in args.modes.split(","):
            times = {p: [] for p in calls}
            errors = {}
            for _ in range(args.rounds):
                for p, fn in calls.items():
                    if p in errors:
                        continue
                    err = None
                    try:
                        t = eager(fn, it) if mode == "eager" else graph(fn, max(3, it // 20))
                    except Exception as exc:
                        err = f"{type(exc).__name__}: {exc}"[:200]
                        t = float("nan")
                    errs = [e for e in comm.allgather_obj(err) if e]
                    if errs:
                        errors[p] = errs[0]
                        continue
                    times[p].append(agree(t))
            for p in calls:
                us = statistics.median(times[p]) * 1e6 if times[p] else float("nan")
                rec = {"op": op, "path": p, "mode": mode, "bytes": nbytes, "us": us,
                       "floor_us": floor_us(op, nbytes)}
                if p in errors:
                    rec["error"] = errors[p]
                rows.append(rec)
            if R == 0:
                base = statistics.median(times["raw"]) * 1e6 if times.get("raw") else float("nan")
                line = " ".join(f"{p}={statistics.median(times[p]) * 1e6:.1f}" for p in calls if times[p])
                print(f"{op:9s} {mode:5s} {nbytes:>10d} B  raw={base:.1f}us | {line}"
                      + (f"  ERR {errors}" if errors else ""), flush=True)
        del x, y

# host time per call (enqueue only), small messages
micro = {}
for nbytes in (4, 65536):
    x = cp.ones(max(1, nbytes // 4), dtype=cp.float32)
    y = cp.empty_like(x)
    for op in args.ops.split(","):
        for p in ("raw", "auto"):
            fn = make_call(op, p, nbytes, x, y)
            micro[f"host_us {op} {p} {nbytes}B"] = agree(host_cost(fn)) * 1e6
noop = cp.RawKernel(r'extern "C" __global__ void mpiml_noop(float* a) {}', "mpiml_noop")
xx = cp.ones(1, dtype=cp.float32)
micro["host_us cupy RawKernel launch"] = host_cost(lambda: noop((1,), (32,), (xx,))) * 1e6
from cupy_backends.cuda.api import driver  # noqa: E402
from mpiml.comm._hotpath import ArgBlock  # noqa: E402

fptr = int(noop.kernel.ptr)
blk = ArgBlock(xx.data.ptr, 0, 0)
micro["host_us cupy driver.launchKernel (pre-packed)"] = host_cost(
    lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, blk.argv_ptr, 0)) * 1e6
try:
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    f = cuda.cuLaunchKernel
    f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                             ctypes.c_void_p]
    f.restype = ctypes.c_int
    sp = stream.ptr
    micro["host_us ctypes cuLaunchKernel (pre-packed)"] = host_cost(
        lambda: f(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, None)) * 1e6
except Exception as exc:
    micro["ctypes_error"] = f"{type(exc).__name__}: {exc}"
micro["gpu_us noop kernel in a graph (the floor of any kernel path)"] = agree(
    graph(lambda: noop((1,), (32,), (xx,)), 50)) * 1e6
ev = cp.cuda.Event()
micro["host_us stream.record (an event per call)"] = host_cost(lambda: ev.record(stream)) * 1e6

if R == 0:
    print("micro:", json.dumps(micro, indent=1), flush=True)
    doc = {"machine": f"{socket.gethostname()} {platform.machine()} "
                      f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} x{cp.cuda.runtime.getDeviceCount()}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": f"mpirun -n {P} " + " ".join([os.path.basename(sys.executable)] + sys.argv),
           "ranks": P, "nccl_version": nccl.get_version(), "cupy": cp.__version__,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("MPIML_", "NCCL_"))},
           "seconds_total": time.perf_counter() - t_start, "micro": micro, "rows": rows}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out} ({len(rows)} rows, {time.perf_counter() - t_start:.0f} s)", flush=True)
    if args.plot:
        try:
            from plot_vs_nccl import plot

            plot(doc, args.plot)
            print(f"wrote {args.plot}", flush=True)
        except Exception as exc:
            print(f"plot failed: {type(exc).__name__}: {exc}", flush=True)
