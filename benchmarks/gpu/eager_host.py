"""The host's cost of eager device collectives: mpiml's hot path (graph replays on and off) against raw NCCL.

Run under ``mpirun -n N`` (one rank per GPU); rank 0 writes ``--out FILE.json`` (machine, date, command,
every row).  For each op and size, on the same CuPy buffers, interleaved over ``--rounds`` rounds
(medians kept; times are the maximum over ranks):

* ``raw``: ``cupy.cuda.nccl`` called directly (the peer);
* ``auto``: ``comm.<op>(x, out=y)`` at the default settings (``MPIML_CHECK`` unset: repeats deferred),
  repeated calls on the same arrays replaying one-node CUDA graphs (``MPIML_IPC_REPLAY`` unset);
* ``auto0``: the same with ``MPIML_CHECK=0``;
* ``noreplay``: ``auto`` on a communicator of its own whose IPC transport launches kernels
  (``MPIML_IPC_REPLAY=0`` when it was made): what the replays save.

``micro``: the parts of a 4 B allreduce's host cost with the stream held (the call, the hot launcher, its
pinned launch, the graph launch, the capture-status query, the current stream, raw NCCL).

Columns: ``us`` (per call over ``iters`` back-to-back calls, one stream sync at the end), ``host_us``
(the loop's time before that sync), ``held_us`` (host time per call while the stream is held by a
busy kernel: the host's own cost, with no feedback from the GPU).
"""

import argparse
import json
import os
import statistics
import time

import cupy as cp
from cupy.cuda import nccl

import _timing  # (benchmarks/gpu/_timing.py, beside this script)
from mpiml import init
from mpiml.comm import get_comm

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--ops", default="allreduce,bcast,reduce,allgather,reduce_scatter")
ap.add_argument("--sizes", default="4,1024,65536,262144,1048576")
ap.add_argument("--paths", default="raw,auto,auto0,noreplay")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--iters", type=int, default=300)
ap.add_argument("--no-micro", action="store_true", help="skip the host-cost breakdown of a 4 B allreduce")
args = ap.parse_args()

os.environ.pop("MPIML_CHECK", None)
os.environ.setdefault("MPIML_TIMEOUT", "30")
comm = get_comm()
init(device="gpu")
P, R = comm.size, comm.rank
stream = cp.cuda.Stream(non_blocking=True)
stream.use()
uid = comm.bcast_obj(nccl.get_unique_id() if R == 0 else None)
raw = nccl.NcclCommunicator(P, uid, R)
plain = comm.split(0)  # its IPC transport is made below with MPIML_IPC_REPLAY=0


def buffers(op, nbytes):
    return _timing.buffers(op, nbytes, P)


def make_call(op, path, x, y):
    n = x.size
    if path == "raw":
        f32, s = nccl.NCCL_FLOAT32, stream.ptr
        return {"allreduce": lambda: raw.allReduce(x.data.ptr, y.data.ptr, n, f32, nccl.NCCL_SUM, s),
                "bcast": lambda: raw.bcast(x.data.ptr, n, f32, 0, s),
                "reduce": lambda: raw.reduce(x.data.ptr, y.data.ptr, n, f32, nccl.NCCL_SUM, 0, s),
                "allgather": lambda: raw.allGather(x.data.ptr, y.data.ptr, n, f32, s),
                "reduce_scatter": lambda: raw.reduceScatter(x.data.ptr, y.data.ptr, n // P, f32, nccl.NCCL_SUM,
                                                            s)}[op]
    c = plain if path == "noreplay" else comm
    return {"allreduce": lambda: c.allreduce(x, out=y), "bcast": lambda: c.bcast(x, root=0, out=y),
            "reduce": lambda: c.reduce(x, root=0, out=y), "allgather": lambda: c.allgather(x, out=y),
            "reduce_scatter": lambda: c.reduce_scatter(x, out=y)}[op]


def set_check(path):
    if path == "auto0":
        os.environ["MPIML_CHECK"] = "0"
    else:
        os.environ.pop("MPIML_CHECK", None)


def eager(fn, iters):
    return _timing.eager(fn, iters, comm, stream)


def held(fn, calls=200):
    return _timing.held_host_cost(fn, comm, stream, calls, hold_ns=20_000_000)  # 20 ms


def agree(t):
    return _timing.agree(comm, t)


ops, sizes, paths = args.ops.split(","), [int(s) for s in args.sizes.split(",")], args.paths.split(",")
os.environ["MPIML_IPC_REPLAY"] = "0"
for op in ops:  # the transports of `plain` (made at its first device calls) launch kernels
    w, wy = buffers(op, 4096)
    make_call(op, "noreplay", w, wy)()
stream.synchronize()
os.environ.pop("MPIML_IPC_REPLAY")
t_start = time.perf_counter()
rows = []
for op in ops:
    for nbytes in sizes:
        x, y = buffers(op, nbytes)
        calls = {p: make_call(op, p, x, y) for p in paths}
        it = max(20, min(args.iters, int(3e9 / max(nbytes, 1))))
        got = {p: {"us": [], "host_us": [], "held_us": []} for p in calls}
        err = {}
        for _ in range(args.rounds):
            for p, fn in calls.items():
                if p in err:
                    continue
                set_check(p)
                e = None
                try:
                    t, h = eager(fn, it)
                    hd = held(fn)
                except Exception as exc:  # noqa: BLE001 (an error row, agreed)
                    e, t, h, hd = f"{type(exc).__name__}: {exc}"[:200], float("nan"), float("nan"), float("nan")
                errs = [m for m in comm.allgather_obj(e) if m]
                if errs:
                    err[p] = errs[0]
                    continue
                got[p]["us"].append(agree(t))
                got[p]["host_us"].append(agree(h))
                got[p]["held_us"].append(agree(hd))
        set_check("raw")
        line = []
        for p in calls:
            rec = {"op": op, "path": p, "bytes": nbytes}
            for k, v in got[p].items():
                rec[k] = statistics.median(v) * 1e6 if v else float("nan")
            if p in err:
                rec["error"] = err[p]
            rows.append(rec)
            line.append(f"{p}={rec['us']:.1f}/{rec['host_us']:.1f}/{rec['held_us']:.1f}")
        if R == 0:
            print(f"{op:14s} {nbytes:>8d} B  us/host/held: " + "  ".join(line) + (f"  ERR {err}" if err else ""),
                  flush=True)
        del x, y

# the parts of a 4 B allreduce's host cost, the stream held by a busy kernel (every rank runs every loop)
micro = {}
if not args.no_micro:
    set_check("auto")
    x, y = buffers("allreduce", 4)
    for _ in range(3):
        comm.allreduce(x, out=y)
    stream.synchronize()
    hot = comm._hot.get(("allreduce", type(x), x.dtype, x.shape, "sum", None))
    hot = getattr(hot, "eager", hot)
    memo = getattr(hot, "memo", None)
    go = next((e[5] for e in memo if e[5] is not None), None) if memo else None
    parts = {"comm.allreduce(x, out=y)": lambda: comm.allreduce(x, out=y),
             "raw NCCL allReduce": make_call("allreduce", "raw", x, y),
             "comm.allreduce, replays off": make_call("allreduce", "noreplay", x, y),
             "current stream": cp.cuda.get_current_stream,
             "capture-status query": lambda: cp.cuda.runtime.streamIsCapturing(stream.ptr)}
    if hot is not None:
        parts["the hot launcher alone"] = lambda: hot(x, y)
    if go is not None:
        parts["its pinned launch alone (go)"] = go
        parts["the graph launch alone"] = lambda: go.graph.launch(stream)
    for name, fn in parts.items():
        micro["held_us " + name] = agree(held(fn)) * 1e6
    micro["pinned"] = go is not None
    if R == 0:
        print("micro:", json.dumps(micro, indent=1), flush=True)

if R == 0:
    base = {(r["op"], r["bytes"]): r["us"] for r in rows if r["path"] == "raw"}
    for r in rows:
        if r["path"] != "raw":
            r["ratio_to_raw"] = r["us"] / base[(r["op"], r["bytes"])]
    _timing.write_result(args.out, P, t_start, micro, rows)
