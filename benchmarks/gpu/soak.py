"""Soak test of the device collectives: random calls for a while, every result checked, memory sampled.

Run under ``mpirun -n N`` (one rank per GPU), at the default settings (``MPIML_CHECK`` unset, so
repeated calls are deferred and agreed in batches)::

    python benchmarks/gpu/soak.py --seconds 300 --out soak.json [--plot soak.png]

``--cpu`` runs the same program on NumPy arrays over the host transport (no graphs, host memory
only): a check of the script itself on a machine without a GPU.

Every step draws, from one seeded generator that every rank shares, a collective (allreduce sum
or max, bcast, reduce, allgather, reduce_scatter), a size from 4 B to 64 MiB (a fixed set of 30,
so that plans and launchers are reused and the caches reach their steady state), a dtype
(float16, float32, float64, int32, int64), a root and a mode: *eager* (a few back-to-back calls,
with and without ``out=``) or *graph* (the call captured in a CUDA graph, replayed on new
inputs).  Inputs are ``(arange(n) + step) % 7 * (rank + 1)``, so every result is exact in every
dtype and is compared on the device with the expected array (one boolean comes back).  Every
``--sample`` seconds each rank records its resident host memory (``rss``), CuPy's pool (``pool_used``,
``pool_held``), mpiml's IPC workspaces (``ipc_workspace``: ``cudaMalloc``'ed outside the pool, one a
communicator), what the process holds on the device itself (``own_device`` = ``pool_held`` +
``ipc_workspace``), and as information the device's used memory (``device_used``: total - free, every
process on the GPU counted) and this process's memory as NVML reports it (``nvml_process``: the CUDA
context, NCCL's buffers and the rest included; None where NVML cannot tell, e.g. PIDs of a container);
rank 0 writes them with the verdict, and the GPUs' other processes seen at the start and the end
(``other_processes``, from ``nvidia-smi --query-compute-apps``, best effort).

The verdict (printed and in the JSON): no error and no wrong result on any rank, and this process's own
memory flat: the last fifth of the samples holds at most ``--growth-mib`` MiB more than the first fifth
after warm-up in host RSS and in CuPy's pool in use, and at most ``--device-growth-mib`` more in
``own_device`` (the pool's cached free blocks included), on every rank.  The device-wide ``device_used``
is not judged: a test run beside the soak on the same GPUs moved it (a clean run read FAILED); its
growth is written beside the others (``growth_mib``) with the other processes that were seen.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time

import numpy as np

from mpiml import init
from mpiml.comm import get_comm

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=300.0)
ap.add_argument("--out", required=True)
ap.add_argument("--plot", default=None)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--sample", type=float, default=2.0, help="seconds between memory samples")
ap.add_argument("--max-bytes", type=int, default=64 << 20)
ap.add_argument("--growth-mib", type=float, default=64.0, help="allowed growth of host RSS and of CuPy's pool in use")
ap.add_argument("--device-growth-mib", type=float, default=512.0,
                help="allowed growth of the device's used memory (CuPy's pool also caches freed blocks)")
ap.add_argument("--cpu", action="store_true", help="NumPy arrays over the host transport, eager only")
args = ap.parse_args()

if args.cpu:
    cp = np
else:
    import cupy as cp

os.environ.setdefault("MPIML_TIMEOUT", "60")
comm = get_comm()
init(device="cpu" if args.cpu else "gpu")
P, R = comm.size, comm.rank
if args.cpu:
    stream = None
else:
    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()

OPS = ["allreduce_sum", "allreduce_max", "bcast", "reduce", "allgather", "reduce_scatter"]
DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
SIZES = sorted({b for k in range(0, 14) for b in (4 * 4 ** k, 3 * 4 ** k + 4) if b <= args.max_bytes})[:30]
rng = np.random.default_rng(args.seed)  # the same draws on every rank
rank_sum = P * (P + 1) // 2


def pattern(n, dtype, step, rank):
    return ((cp.arange(n, dtype=cp.int64) + step) % 7 * (rank + 1)).astype(dtype)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ipc_workspace_bytes(communicator):
    """Device bytes of the IPC workspaces ``communicator`` holds: ``cudaMalloc``'ed outside CuPy's pool, one a
    transport (the two-level transport's node part too); the layout of mpiml.comm.backends.ipc's ``_setup``."""
    from mpiml.comm.backends import ipc

    total, seen = 0, set()
    todo = list(getattr(communicator, "_device_transports", {}).values())
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, ipc.IPCTransport) and getattr(t, "_base", None) is not None:
            total += t._ll_off + 2 * t.size * t._ll_slot + ipc.PIPE_BYTES
        helpers = getattr(t, "_helpers", None)
        if helpers is not None:
            todo.extend(helpers())
    return total


class _Nvml:
    """This process's device memory as NVML counts it (libnvidia-ml through ctypes; None when it cannot tell)."""

    class _Info(ctypes.Structure):  # nvmlProcessInfo_v2_t (the _v2 call's; the _v3 call's where it is the same)
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                    ("computeInstanceId", ctypes.c_uint)]

    def __init__(self):
        self.lib = self.handle = self.call = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            handle = ctypes.c_void_p()
            bus = cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice())
            if lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) != 0:
                return
            for name in ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"):
                if hasattr(lib, name):
                    self.call = getattr(lib, name)
                    break
            self.lib, self.handle = lib, handle
        except Exception:  # no NVML: the field stays None
            self.lib = None

    def process_bytes(self, pid):
        if self.lib is None or self.call is None:
            return None
        try:
            count = ctypes.c_uint(64)
            infos = (self._Info * 64)()
            if self.call(self.handle, ctypes.byref(count), infos) != 0:
                return None
            for i in range(min(count.value, 64)):
                if infos[i].pid == pid and infos[i].usedGpuMemory < (1 << 63):  # (~0: not available)
                    return int(infos[i].usedGpuMemory)
        except Exception:
            pass
        return None


_NVML = []


def memory():
    if args.cpu:
        return {"rss": rss_bytes(), "pool_used": 0, "pool_held": 0, "device_used": 0, "ipc_workspace": 0,
                "own_device": 0, "nvml_process": None}
    if not _NVML:
        _NVML.append(_Nvml())
    pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    held, ipc_bytes = pool.total_bytes(), ipc_workspace_bytes(comm)
    return {"rss": rss_bytes(), "pool_used": pool.used_bytes(), "pool_held": held, "device_used": total - free,
            "ipc_workspace": ipc_bytes, "own_device": held + ipc_bytes,
            "nvml_process": _NVML[0].process_bytes(os.getpid())}


def gpu_processes():
    """The GPUs' compute processes (``nvidia-smi --query-compute-apps``), best effort: a list of dicts, or the error."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except Exception as exc:  # no nvidia-smi, a hung one
        return f"{type(exc).__name__}: {exc}"
    if out.returncode != 0:
        return f"nvidia-smi exited {out.returncode}: {out.stderr.strip()[:300]}"
    procs = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            pid, name, used, bus = parts
            procs.append({"pid": int(pid) if pid.isdigit() else pid, "name": name,
                          "used_mib": int(used) if used.isdigit() else used, "gpu_bus_id": bus})
    return procs


def others(procs, ours):
    """``procs`` without this job's ranks (PIDs as this namespace sees them; a container's may all differ)."""
    return procs if isinstance(procs, str) else [p for p in procs if p["pid"] not in ours]


def expected(op, n, dtype, step, root):
    base = pattern(n, dtype, step, 0)  # (rank + 1) == 1
    if op in ("allreduce_sum", "reduce"):
        return (base.astype(cp.int64) * rank_sum).astype(dtype)
    if op == "allreduce_max":
        return (base.astype(cp.int64) * P).astype(dtype)
    if op == "bcast":
        return pattern(n, dtype, step, root)
    if op == "allgather":
        return cp.concatenate([pattern(n, dtype, step, r) for r in range(P)])
    total = (base.astype(cp.int64) * rank_sum).astype(dtype)  # reduce_scatter: this rank's block
    return cp.array_split(total, P)[R]


def call(op, x, out, root):
    if op == "allreduce_sum":
        return comm.allreduce(x, "sum", out=out)
    if op == "allreduce_max":
        return comm.allreduce(x, "max", out=out)
    if op == "bcast":
        return comm.bcast(x, root=root, out=out)
    if op == "reduce":
        return comm.reduce(x, "sum", root=root, out=out)
    if op == "allgather":
        return comm.allgather(x, out=out)
    return comm.reduce_scatter(x, "sum", out=out)


def out_for(op, n, dtype):
    if op == "allgather":
        return cp.empty(n * P, dtype=dtype)
    if op == "reduce_scatter":
        return cp.empty(n // P + (1 if R < n % P else 0), dtype=dtype)  # this rank's block (array_split)
    return cp.empty(n, dtype=dtype)


def verify(op, got, want, root):
    if op == "reduce" and R != root:
        return got is None
    return got is not None and got.shape == want.shape and bool(cp.array_equal(got, want))


def step_once(step):
    op = OPS[rng.integers(len(OPS))]
    nbytes = SIZES[rng.integers(len(SIZES))]
    dtype = DTYPES[rng.integers(len(DTYPES))]
    root = int(rng.integers(P))
    mode = "graph" if rng.random() < 0.3 and not args.cpu else "eager"
    given = bool(rng.integers(2))
    n = max(1, nbytes // np.dtype(dtype).itemsize)
    if op == "reduce_scatter":
        n = max(P, n)
    bad = 0
    if mode == "eager":
        out = out_for(op, n, dtype) if given else None
        for k in range(3):
            x = pattern(n, dtype, step + k, R)
            got = call(op, x, out, root)
            want = expected(op, n, dtype, step + k, root)
            bad += not verify(op, got, want, root)
    else:
        x = cp.empty(n, dtype=dtype)
        out = out_for(op, n, dtype)
        x[...] = pattern(n, dtype, step, R)
        call(op, x, out, root)  # warm: the shape's first call agrees on the host, outside the capture
        stream.synchronize()
        stream.begin_capture()
        try:
            got = call(op, x, out, root)
        finally:
            graph = stream.end_capture()
        for k in range(2):
            x[...] = pattern(n, dtype, step + 1 + k, R)
            graph.launch(stream)
            want = expected(op, n, dtype, step + 1 + k, root)
            bad += not verify(op, got, want, root)
        stream.synchronize()
        del graph
    return f"{op} {np.dtype(dtype).name} {nbytes} B {mode}{' out=' if given else ''}", bad


def main():
    PROCS_START.extend([gpu_processes()] if R == 0 and not args.cpu else [])
    t0 = time.perf_counter()
    samples, failures, steps, calls_by_op = [], [], 0, {}
    next_sample = 0.0
    stop = False
    while not stop:
        try:
            what, bad = step_once(steps)
        except Exception as exc:  # an error is a failure; the run stops (the communicator may be dead)
            failures.append(f"step {steps}: {type(exc).__name__}: {exc}"[:500])
            break
        if bad:
            failures.append(f"step {steps}: {what}: {bad} wrong result(s)")
        key = what.split()[0]
        calls_by_op[key] = calls_by_op.get(key, 0) + 1
        steps += 1
        if steps % 20 == 0:  # agreed: sample and stop together
            elapsed = time.perf_counter() - t0
            if elapsed >= next_sample:
                if stream is not None:
                    stream.synchronize()
                samples.append({"t": elapsed, "step": steps, **memory()})
                next_sample = elapsed + args.sample
            stop = comm.bcast_obj(elapsed >= args.seconds)
    try:
        if stream is not None:
            stream.synchronize()
        comm.synchronize()
    except Exception as exc:  # (a failed run: its communicator is dead)
        failures.append(f"synchronize: {type(exc).__name__}: {exc}"[:500])
    return t0, samples, failures, steps, calls_by_op


PROCS_START = []  # (rank 0: the GPUs' processes before the first step)
# the fields the verdict judges (this process's own memory) and their allowed growth; the others are information
JUDGED = {"rss": "growth_mib", "pool_used": "growth_mib", "own_device": "device_growth_mib"}
INFORMATION = ("pool_held", "ipc_workspace", "device_used", "nvml_process")


def flat(samples):
    """(ok, growth in MiB per field): last fifth vs first fifth after the first 10 % (warm-up); ok judges
    ``JUDGED`` alone."""
    if len(samples) < 10:
        return True, {}
    body = samples[len(samples) // 10:]
    k = max(1, len(body) // 5)
    growth = {}
    for f in (*JUDGED, *INFORMATION):
        if any(s.get(f) is None for s in body[:k] + body[-k:]):
            continue  # (NVML could not tell)
        first = np.median([s[f] for s in body[:k]])
        last = np.median([s[f] for s in body[-k:]])
        growth[f] = round(float(last - first) / 2**20, 2)
    return all(growth[f] <= getattr(args, lim) for f, lim in JUDGED.items()), growth


t_start, samples, failures, steps, calls_by_op = main()
ok_mem, growth = flat(samples)
from mpi4py import MPI  # noqa: E402  (the verdict travels outside mpiml: its communicator may be dead)

everyone = MPI.COMM_WORLD.allgather({"rank": R, "failures": failures, "growth_mib": growth, "flat": ok_mem,
                                     "samples": samples, "pid": os.getpid(), "host": socket.gethostname()})
total_fail = sum(len(e["failures"]) for e in everyone)
all_flat = all(e["flat"] for e in everyone)
verdict = "OK" if total_fail == 0 and all_flat else "FAILED"
if R == 0:
    gpus = "CPU" if args.cpu else \
        f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} x{cp.cuda.runtime.getDeviceCount()}"
    doc = {"machine": f"{socket.gethostname()} {platform.machine()} {gpus}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": f"mpirun -n {P} " + " ".join([os.path.basename(sys.executable)] + sys.argv),
           "ranks": P, "seconds": time.perf_counter() - t_start, "steps": steps, "calls_by_op": calls_by_op,
           "sizes": SIZES, "env": {k: v for k, v in os.environ.items() if k.startswith(("MPIML_", "NCCL_"))},
           "verdict": verdict, "ranks_detail": everyone,
           "memory_judged": {f: f"at most --{lim.replace('_', '-')} = {getattr(args, lim)} MiB more in the last fifth"
                             for f, lim in JUDGED.items()},
           "memory_information": list(INFORMATION)}
    if not args.cpu:
        ours = {e["pid"] for e in everyone}
        doc["other_processes"] = {"start": others(PROCS_START[0] if PROCS_START else [], ours),
                                  "end": others(gpu_processes(), ours), "ranks_pids": sorted(ours)}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    for e in everyone:
        for f in e["failures"][:5]:
            print(f"rank {e['rank']}: FAIL {f}", flush=True)
        print(f"rank {e['rank']}: memory growth (MiB) {e['growth_mib']} flat={e['flat']} (judged: {', '.join(JUDGED)})",
              flush=True)
    if not args.cpu:
        for when, procs in doc["other_processes"].items():
            if when != "ranks_pids":
                print(f"other GPU processes at the {when}: " + (procs if isinstance(procs, str) else ", ".join(
                    f"{p['pid']} {p['name']} {p['used_mib']} MiB" for p in procs) or "none"), flush=True)
    print(f"{verdict}: {steps} steps in {doc['seconds']:.0f} s on {P} ranks, {total_fail} failure(s), "
          f"calls {calls_by_op}; wrote {args.out}", flush=True)
    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fields = ("rss", "pool_used", "own_device", "device_used")
            fig, axes = plt.subplots(1, 4, figsize=(19, 3.6))
            for e in everyone:
                ts = [s["t"] for s in e["samples"]]
                for a, f in zip(axes, fields):
                    a.plot(ts, [s[f] / 2**20 for s in e["samples"]], label=f"rank {e['rank']}")
                    a.set_title(f"{f} (MiB){'' if f in JUDGED else ', every process: not judged'}", fontsize=9)
                    a.set_xlabel("seconds", fontsize=8)
            axes[0].legend(fontsize=7)
            fig.suptitle(f"soak: {verdict}, {steps} steps, {doc['machine']}", fontsize=10)
            fig.tight_layout()
            fig.savefig(args.plot, dpi=90)
            print(f"wrote {args.plot}", flush=True)
        except Exception as exc:
            print(f"plot failed: {type(exc).__name__}: {exc}", flush=True)
sys.stdout.flush()
sys.exit(0 if verdict == "OK" else 1)
