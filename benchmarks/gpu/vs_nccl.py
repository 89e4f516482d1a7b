"""mpiml's device collectives against raw CuPy-NCCL, on the same buffers in the same process.

Run under ``mpirun -n N`` (one rank per GPU); rank 0 writes ``--out FILE.json``
(machine, date, command, every row) and, with ``--plot``, a PNG.

For each op and size, every path runs on the *same* CuPy buffers, interleaved in
``--rounds`` rounds (the median is kept, so drift hits every path alike):

* ``raw``: ``cupy.cuda.nccl.NcclCommunicator`` called directly (the peer);
* ``auto``: ``comm.allreduce(x, out=y)``, ``comm.bcast(x, out=y)``,
  ``comm.reduce(x, out=y)``, ``comm.allgather(x, out=y)``,
  ``comm.reduce_scatter(x, out=y)`` as a user calls them, at the **default settings**
  (``MPIML_CHECK`` unset: repeated calls deferred, see docs/comm.md);
* ``auto0``: the same with ``MPIML_CHECK=0`` (no checking at all);
* ``nccl``, ``ipc/ll``, ``ipc/oneshot``, ``ipc/twoshot``, ``ipc/lltwoshot``, ``ipc/llrelay``, ``ipc/ll128``,
  ``ipc/ll128direct``, ``ipc/ll128twoshot``, ``ipc/pipe``, ``ipc/pull``, ``ipc/push``: one path forced with ``algorithm=``
  (``MPIML_CHECK=0``);
* ``ipc/pipe@BxR`` (``--pipe-variants BxR,...``): ``ipc/pipe`` on a communicator of its own (``comm.split``)
  whose IPC workspace was made with ``MPIML_IPC_PIPE_BLOCKS=B`` and ``MPIML_IPC_PIPE_ROUNDS=R`` (the grid of
  the pipelined kernels and the steps a block takes), to choose those defaults by measurement;
* ``PATH@VAR=VALUE[+VAR=VALUE...]`` (``--variants``, comma-separated): path ``PATH`` on a communicator of its
  own whose transports were made with those environment variables (``ipc/ll128@MPIML_IPC_LL128_BLOCKS=64``:
  the LL128 kernels' grid at most 64 blocks).

``--first-calls``: what a call of a new shape costs on a fresh communicator (its device
transports made inside the first call) and on a warm one, against its repeats and raw NCCL, for
a reduce_scatter and an allreduce of int32 rows as the forest's levels make them (``--first-bytes``,
78 MiB by default); in the JSON under ``first_calls``.

Modes: ``eager`` (``iters`` back-to-back calls, one stream sync at the end,
host-timed; per call; ``host_us`` is the time of the loop before the final
sync, i.e. the host's own cost per call, since the queue never fills) and
``graph`` (20 calls captured in one CUDA graph, replayed; per call: the
device time plus 1/20 of a graph launch).  Times are the maximum over ranks.
``micro`` breaks the host cost of a small call down (launch alone, the hot
launcher alone, key lookup, ...).

Floors (in the JSON): a kernel cannot start sooner than the previous one
ends, and data cannot cross NVLink faster than ``--link-GBps`` (450 GB/s per
direction per GPU on the H200 host): allreduce moves 2(p-1)/p of the bytes
through each GPU's links, bcast (p-1)/p... at least 1 x bytes on the root.
"""

import argparse
import json
import os
import statistics
import time

import cupy as cp
from cupy.cuda import nccl

import _timing  # (benchmarks/gpu/_timing.py, beside this script)
from mpiml.comm import get_comm
from mpiml import init

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--plot", default=None)
ap.add_argument("--ops", default="allreduce,bcast,reduce,allgather,reduce_scatter")
ap.add_argument("--modes", default="eager,graph")
ap.add_argument("--min-bytes", type=int, default=4)
ap.add_argument("--max-bytes", type=int, default=256 << 20)
ap.add_argument("--sizes", default=None, help="comma list of sizes in bytes (overrides min/max)")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--link-GBps", type=float, default=450.0)
ap.add_argument("--paths", default="raw,auto,auto0,nccl,ipc/ll,ipc/oneshot,ipc/twoshot,ipc/lltwoshot,ipc/pipe,ipc/pull,"
                                   "ipc/push")
ap.add_argument("--pipe-variants", default="", help="comma list of BLOCKSxROUNDS: ipc/pipe@BxR paths (see above)")
ap.add_argument("--variants", default="", help="comma list of PATH@VAR=VALUE[+VAR=VALUE]: a path on a communicator of "
                                               "its own made with those settings (see above)")
ap.add_argument("--first-calls", action="store_true", help="time first calls of new shapes (see above)")
ap.add_argument("--first-bytes", type=int, default=78 << 20)
ap.add_argument("--no-micro", action="store_true", help="skip the host-cost breakdown")
args = ap.parse_args()

os.environ.pop("MPIML_CHECK", None)  # set per path below (set_check)
os.environ.setdefault("MPIML_TIMEOUT", "30")  # a stuck path is an error row, not a hung sweep
comm = get_comm()
init(device="gpu")  # local rank mod visible GPUs
P, R = comm.size, comm.rank
stream = cp.cuda.Stream(non_blocking=True)
stream.use()
uid = comm.bcast_obj(nccl.get_unique_id() if R == 0 else None)
raw = nccl.NcclCommunicator(P, uid, R)
HOST_CALLS = 200

# ipc/pipe@BxR: a communicator of its own per variant, its IPC transport made (at its first call, in the
# warm-up below) with the variant's MPIML_IPC_PIPE_BLOCKS / MPIML_IPC_PIPE_ROUNDS
variant_comms = {}
for v in filter(None, args.pipe_variants.split(",")):
    b, r = (int(t) for t in v.lower().split("x"))
    variant_comms[f"ipc/pipe@{v}"] = (comm.split(0), {"MPIML_IPC_PIPE_BLOCKS": str(b), "MPIML_IPC_PIPE_ROUNDS": str(r)},
                                      "ipc/pipe")
for v in filter(None, args.variants.split(",")):
    base, _, settings = v.partition("@")
    env = dict(kv.split("=", 1) for kv in settings.split("+") if kv)
    variant_comms[v] = (comm.split(0), env, base)
paths = args.paths.split(",") + list(variant_comms)

if args.sizes:
    sizes = [int(s) for s in args.sizes.split(",")]
else:
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4


def set_check(path):
    """``auto`` runs at the default settings; every other path with ``MPIML_CHECK=0`` (the peer checks nothing)."""
    if path == "auto":
        os.environ.pop("MPIML_CHECK", None)
    else:
        os.environ["MPIML_CHECK"] = "0"


def ipc_limits():
    t = comm._device_transports.get("ipc")
    return (t.ll_max, t.cap) if t is not None else (0, 0)


def make_call(op, path, nbytes, x, y):
    """One call of ``op`` on ``path``; x holds nbytes (allgather: x is this rank's nbytes / P)."""
    n = x.size
    forced = path
    if path in variant_comms:
        path = variant_comms[path][2]
    if path == "raw":
        if op == "allreduce":
            return lambda: raw.allReduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        if op == "bcast":
            return lambda: raw.bcast(x.data.ptr, n, nccl.NCCL_FLOAT32, 0, stream.ptr)
        if op == "reduce":
            return lambda: raw.reduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0, stream.ptr)
        if op == "reduce_scatter":
            return lambda: raw.reduceScatter(x.data.ptr, y.data.ptr, n // P, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                             stream.ptr)
        return lambda: raw.allGather(x.data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, stream.ptr)
    ll_max, cap = ipc_limits()
    if path == "ipc/ll" and (x.nbytes // P if op == "reduce_scatter" else x.nbytes) > ll_max:
        return None
    if path == "ipc/oneshot" and (op not in ("allreduce", "reduce", "reduce_scatter")
                                  or nbytes > (cap if op == "reduce_scatter" else 4 << 20)):
        return None
    if path == "ipc/twoshot" and (op not in ("allreduce", "bcast", "reduce") or nbytes < (64 << 10)):
        return None
    if path == "ipc/lltwoshot" and op not in ("allreduce", "bcast", "reduce"):
        return None
    if path.startswith("ipc/pipe") and (op not in ("allreduce", "bcast", "reduce") or nbytes < (64 << 10)):
        return None
    if path == "ipc/llrelay" and op != "reduce":
        return None
    if path == "ipc/ll128" and op not in ("allreduce", "reduce", "reduce_scatter", "bcast"):
        return None
    if path in ("ipc/ll128direct", "ipc/ll128twoshot") and op != "reduce":
        return None
    if path == "ipc/pull" and op not in ("bcast", "allgather"):
        return None
    if path == "ipc/push" and (op != "allgather" or nbytes < (64 << 10) or x.nbytes > cap // P):
        return None
    algo = {"auto": None, "auto0": None, "nccl": "nccl/native"}.get(path, path)
    c = comm
    if forced in variant_comms:
        c, algo = variant_comms[forced][0], variant_comms[forced][2]
    if op == "allreduce":
        return lambda: c.allreduce(x, out=y, algorithm=algo)
    if op == "bcast":
        return lambda: c.bcast(x, root=0, out=y, algorithm=algo)
    if op == "reduce":
        return lambda: c.reduce(x, root=0, out=y, algorithm=algo)
    if op == "reduce_scatter":
        return lambda: c.reduce_scatter(x, out=y, algorithm=algo)
    return lambda: c.allgather(x, out=y, algorithm=algo)


def buffers(op, nbytes):
    """x holds nbytes (allgather: nbytes / P, its result nbytes; reduce_scatter: a multiple of P elements)."""
    return _timing.buffers(op, nbytes, P)


def eager(fn, iters):
    """(seconds per call, host seconds per call) of ``iters`` back-to-back calls."""
    return _timing.eager(fn, iters, comm, stream)


def graph(fn, iters, calls=20):
    """Seconds per call of ``calls`` calls captured in one CUDA graph, replayed."""
    return _timing.graph(fn, iters, comm, stream, calls)


def host_cost(fn, calls=HOST_CALLS):
    """Host seconds per call, measured while the stream is held by a busy kernel (50 ms: no GPU feedback)."""
    return _timing.held_host_cost(fn, comm, stream, calls, hold_ns=50_000_000)


def agree(t):
    return _timing.agree(comm, t)


def floor_us(op, nbytes):
    link = args.link_GBps * 1e9
    if op == "allreduce":
        return 2 * (P - 1) / P * nbytes / link * 1e6
    return (P - 1) / P * nbytes / link * 1e6 if P > 1 else 0.0


def iters_for(nbytes):
    return max(10, min(300, int(3e9 / max(nbytes, 1))))


# warm-up: create the transports, compile every kernel used below
for p in paths:
    saved = {k: os.environ.get(k) for k in variant_comms.get(p, (None, {}))[1]}
    os.environ.update(variant_comms.get(p, (None, {}))[1])
    for op in args.ops.split(","):
        try:
            wb = 4096 if not p.startswith("ipc/pipe") else 65536
            w, wy = buffers(op, wb)
            fn = make_call(op, p, wb, w, wy)
            if fn is not None:
                set_check(p)
                fn()
        except Exception as exc:
            if R == 0:
                print(f"warm-up {op} {p}: {type(exc).__name__}: {exc}", flush=True)
    stream.synchronize()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
stream.synchronize()

rows = []
t_start = time.perf_counter()
for op in args.ops.split(","):
    for nbytes in sizes:
        x, y = buffers(op, nbytes)
        calls = {}
        for p in paths:
            fn = make_call(op, p, nbytes, x, y)
            if fn is not None:
                calls[p] = fn
        it = iters_for(nbytes)
        for mode in args.modes.split(","):
            times = {p: [] for p in calls}
            hosts = {p: [] for p in calls}
            errors = {}
            for _ in range(args.rounds):
                for p, fn in calls.items():
                    if p in errors:
                        continue
                    err = None
                    h = float("nan")
                    set_check(p)
                    try:
                        if mode == "eager":
                            t, h = eager(fn, it)
                        else:
                            t = graph(fn, max(3, it // 20))
                    except Exception as exc:
                        err = f"{type(exc).__name__}: {exc}"[:200]
                        t = float("nan")
                    errs = [e for e in comm.allgather_obj(err) if e]
                    if errs:
                        errors[p] = errs[0]
                        continue
                    times[p].append(agree(t))
                    hosts[p].append(agree(h))
            for p in calls:
                us = statistics.median(times[p]) * 1e6 if times[p] else float("nan")
                rec = {"op": op, "path": p, "mode": mode, "bytes": nbytes, "us": us,
                       "floor_us": floor_us(op, nbytes)}
                if mode == "eager" and hosts[p]:
                    rec["host_us"] = statistics.median(hosts[p]) * 1e6
                if p in errors:
                    rec["error"] = errors[p]
                rows.append(rec)
            set_check("raw")
            if R == 0:
                base = statistics.median(times["raw"]) * 1e6 if times.get("raw") else float("nan")
                line = " ".join(f"{p}={statistics.median(times[p]) * 1e6:.1f}" for p in calls if times[p])
                print(f"{op:9s} {mode:5s} {nbytes:>10d} B  raw={base:.1f}us | {line}"
                      + (f"  ERR {errors}" if errors else ""), flush=True)
        del x, y

# what a call of a new shape costs (the forest's levels: every level a new shape), the first one on a
# communicator whose device transports do not exist yet, then on a warm one, against repeats and raw NCCL
first_calls = {}


def first_call_times(c, op, rows, width):
    """{what: seconds} of ``op`` on ``c`` for int32 arrays of ``rows`` x ``width`` (rows a multiple of P)."""
    x = cp.ones((rows, width), dtype=cp.int32)
    out = {}

    def timed(fn):
        stream.synchronize()
        c.barrier()
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        return agree(time.perf_counter() - t0)

    call = (lambda: c.reduce_scatter(x)) if op == "reduce_scatter" else (lambda: c.allreduce(x))
    out["first"] = timed(call)
    out["second"] = timed(call)
    out["repeat"] = statistics.median(timed(call) for _ in range(5))
    n = x.size
    y = cp.empty(n // P if op == "reduce_scatter" else n, dtype=cp.int32)
    if op == "reduce_scatter":
        rawf = lambda: raw.reduceScatter(x.data.ptr, y.data.ptr, n // P, nccl.NCCL_INT32, nccl.NCCL_SUM, stream.ptr)
    else:
        rawf = lambda: raw.allReduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_INT32, nccl.NCCL_SUM, stream.ptr)
    rawf()
    out["raw_nccl"] = statistics.median(timed(rawf) for _ in range(5))
    return out


if args.first_calls and P > 1:
    set_check("auto")
    width = 4864  # (not `rows`: that name holds the sweep's results)
    height = max(P, args.first_bytes // (4 * width) // P * P)
    for op in ("reduce_scatter", "allreduce"):
        fresh = comm.split(0)  # a new communicator: its nccl / ipc transports are made at first use
        got = first_call_times(fresh, op, height, width)
        got["warm_new_shape"] = first_call_times(fresh, op, height - P, width)["first"]
        got["transports"] = sorted(fresh._device_transports)
        got["bytes"] = height * width * 4
        first_calls[op] = got
        fresh.close()
        if R == 0:
            print(f"first calls {op} {height}x{width} int32: " + json.dumps(
                {k: (round(v * 1e3, 3) if isinstance(v, float) else v) for k, v in got.items()}) + " (ms)",
                flush=True)

# host time per call, small messages: the enqueue loop of eager mode, and its parts
micro = {}
N = 500


def host_loop(fn, calls=N):
    """Host seconds per call of ``calls`` calls (every rank runs it: collectives need the peers): the host part of
    :func:`_timing.eager`, the maximum over the ranks."""
    return agree(_timing.eager(fn, calls, comm, stream)[1])


def host_costs():
    """The ``micro`` entries (rank 0 prints them)."""
    for nbytes in (4, 65536):
        x = cp.ones(max(1, nbytes // 4), dtype=cp.float32)
        y = cp.empty_like(x)
        for op in ("allreduce", "bcast", "reduce"):
            for p in ("raw", "auto", "auto0"):
                set_check(p)
                micro[f"host_us {op} {p} {nbytes}B"] = host_loop(make_call(op, p, nbytes, x, y), 300) * 1e6
    # the default's checking against none, over long runs (the agreement round of MPIML_CHECK_EVERY = 1024
    # deferred calls included): per call, the median of 5 interleaved runs of 2048 calls each
    for op in ("allreduce", "reduce_scatter"):
        for nbytes in (4 * P, 65536, 1 << 20):
            x, y = buffers(op, nbytes)
            per = {"auto": [], "auto0": []}
            for _ in range(5):
                for p in per:
                    set_check(p)
                    fn = make_call(op, p, nbytes, x, y)
                    t, _h = eager(fn, 2048)
                    per[p].append(agree(t))
            a, b = statistics.median(per["auto"]), statistics.median(per["auto0"])
            micro[f"check cost {op} {nbytes}B: default / MPIML_CHECK=0 over 2048-call runs"] = a / b
            micro[f"us per call {op} {nbytes}B default, MPIML_CHECK=0"] = [a * 1e6, b * 1e6]
    set_check("auto")
    x = cp.ones(1, dtype=cp.float32)
    y = cp.empty_like(x)
    comm.allreduce(x, out=y)
    key = ("allreduce", type(x), x.dtype, x.shape, "sum", None)
    hot = comm._hot.get(key)
    micro["hot path in use for 4 B allreduce"] = hot is not None
    if hot is not None:
        micro["host_us hot launcher alone (4 B allreduce)"] = host_loop(lambda: hot(x, y)) * 1e6
    micro["host_us comm.allreduce(x, out=y) (4 B)"] = host_loop(lambda: comm.allreduce(x, out=y)) * 1e6
    micro["host_us raw NCCL allReduce (4 B)"] = host_loop(
        lambda: raw.allReduce(x.data.ptr, y.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)) * 1e6
    noop = cp.RawKernel(r'extern "C" __global__ void mpiml_noop(float* a) {}', "mpiml_noop")
    micro["host_us cupy RawKernel launch"] = host_loop(lambda: noop((1,), (32,), (x,))) * 1e6
    from cupy_backends.cuda.api import driver  # noqa: E402
    from mpiml.comm._hotpath import ArgBlock, check_level  # noqa: E402

    fptr = int(noop.kernel.ptr)
    blk = ArgBlock(x.data.ptr, 0, 0)
    micro["host_us cupy driver.launchKernel (pre-packed)"] = host_loop(
        lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, blk.argv_ptr, 0)) * 1e6
    try:
        import ctypes

        cuda = ctypes.CDLL("libcuda.so.1")
        f = cuda.cuLaunchKernel
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        f.restype = ctypes.c_int
        sp = stream.ptr
        micro["host_us ctypes cuLaunchKernel (pre-packed)"] = host_loop(
            lambda: f(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, None)) * 1e6
    except Exception as exc:
        micro["ctypes_error"] = f"{type(exc).__name__}: {exc}"
    micro["host_us launch into a held stream (cupy driver.launchKernel)"] = host_cost(
        lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, stream.ptr, blk.argv_ptr, 0)) * 1e6
    # the candidates for a cheaper eager launch (issue 34): ctypes with the GIL held (PyDLL: no release and
    # re-acquire around the driver call), and the replay of a one-node CUDA graph (no arguments to pack at all)
    sp = stream.ptr
    try:
        import ctypes

        fp = ctypes.PyDLL("libcuda.so.1").cuLaunchKernel
        fp.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        fp.restype = ctypes.c_int
        micro["host_us ctypes PyDLL cuLaunchKernel (pre-packed, GIL held)"] = host_loop(
            lambda: fp(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, None)) * 1e6
        micro["host_us ctypes PyDLL cuLaunchKernel, held stream"] = host_cost(
            lambda: fp(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, None)) * 1e6
        micro["host_us ctypes CDLL cuLaunchKernel, held stream"] = host_cost(
            lambda: f(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, None)) * 1e6
    except Exception as exc:
        micro["ctypes_pydll_error"] = f"{type(exc).__name__}: {exc}"
    micro["host_us cupy driver.launchKernel, stream handle held, held stream"] = host_cost(
        lambda: driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, sp, blk.argv_ptr, 0)) * 1e6
    try:
        gs = cp.cuda.Stream(non_blocking=True)
        gs.begin_capture()
        driver.launchKernel(fptr, 1, 1, 1, 32, 1, 1, 0, gs.ptr, blk.argv_ptr, 0)
        g1 = gs.end_capture()
        g1.launch(stream)
        stream.synchronize()
        micro["host_us one-node graph launch (cupy Graph.launch)"] = host_loop(lambda: g1.launch(stream)) * 1e6
        micro["host_us one-node graph launch, held stream"] = host_cost(lambda: g1.launch(stream)) * 1e6
        gexec = getattr(g1, "graphExec", None)
        if gexec:
            launch_graph = cp.cuda.runtime.graphLaunch
            micro["host_us one-node graph launch (runtime.graphLaunch), held stream"] = host_cost(
                lambda: launch_graph(gexec, sp)) * 1e6
    except Exception as exc:
        micro["graph_launch_error"] = f"{type(exc).__name__}: {exc}"
    micro["host_us stream.ptr of the current stream"] = host_loop(lambda: cp.cuda.get_current_stream().ptr) * 1e6
    micro["host_us hot-path check_level()"] = host_loop(check_level) * 1e6
    micro["host_us key tuple + dict lookup"] = host_loop(
        lambda: comm._hot.get(("allreduce", type(x), x.dtype, x.shape, "sum", None))) * 1e6
    micro["host_us capture-status query (streamIsCapturing)"] = host_loop(
        lambda: cp.cuda.runtime.streamIsCapturing(stream.ptr)) * 1e6
    # what NCCL costs the host as mpiml calls it, against raw NCCL (1 MiB: where an eager NCCL call through mpiml
    # was host-bound, 18.6 us against raw NCCL's 14.1 for bcast on 4 x H100), the stream held by a busy kernel
    for op in ("bcast", "reduce", "allreduce"):
        x1, y1 = buffers(op, 1 << 20)
        for p in ("raw", "nccl"):
            set_check(p)
            micro[f"host_us {op} {p} 1 MiB (stream held)"] = host_cost(make_call(op, p, 1 << 20, x1, y1)) * 1e6
        key1 = (op, type(x1), x1.dtype, x1.shape, 0 if op == "bcast" else ("sum", 0) if op == "reduce" else "sum",
                "nccl/native")
        hot1 = comm._hot.get(key1)
        micro[f"hot path in use for 1 MiB {op} nccl/native"] = hot1 is not None
        if hot1 is not None:
            micro[f"host_us hot launcher alone ({op} 1 MiB nccl/native, stream held)"] = host_cost(
                lambda: hot1(x1, y1)) * 1e6
    set_check("auto")
    micro["gpu_us noop kernel in a graph (the floor of any kernel path)"] = agree(
        graph(lambda: noop((1,), (32,), (x,)), 50)) * 1e6
    ev = cp.cuda.Event(disable_timing=True)
    micro["host_us event record (what the watchdog needs per NCCL call)"] = host_loop(lambda: ev.record(stream)) * 1e6


if not args.no_micro:
    host_costs()

if R == 0:
    print("micro:", json.dumps(micro, indent=1), flush=True)
    doc = _timing.write_result(args.out, P, t_start, micro, rows, **({"first_calls": first_calls} if first_calls else {}))
    if args.plot:
        try:
            from plot_vs_nccl import plot

            plot(doc, args.plot)
            print(f"wrote {args.plot}", flush=True)
        except Exception as exc:
            print(f"plot failed: {type(exc).__name__}: {exc}", flush=True)
