"""Staged MPI for device buffers: the pipelined ring against the host MPI's own allreduce and the copy floor.

Run under ``mpirun -n P`` (P = 2 on one GPU: the ranks share it); rank 0 writes ``--out FILE.json``.
In the same run, on the same machine:

* ``ring``: ``comm.allreduce(x, out=y, algorithm="mpi/ring")`` on CuPy buffers -- the pipelined
  staged ring (``mpiml.comm.backends._pipeline``): MPI point-to-point on pinned host memory only;
* ``staged_native``: ``algorithm="mpi/native"`` -- copies to pinned memory in 4 MiB chunks and the
  host MPI's own ``Iallreduce`` on each chunk (what the staged path did before);
* ``auto``: no ``algorithm=`` (the tuning table; with ranks sharing a GPU nccl / ipc are refused);
* ``host_allreduce`` / ``host_iallreduce``: the host MPI's own ``Allreduce`` (blocking) and
  ``Iallreduce`` + polled ``Wait`` on pinned host buffers of the same size: no device copies at all;
* ``d2h`` / ``h2d`` / ``bidir``: ``cudaMemcpyAsync`` of the whole buffer between device and pinned
  memory, one rank alone (``*_alone``) and every rank at once (``*_all``: the ranks share the copy
  engines and the PCIe link); ``bidir`` is a copy down and one up at once on two streams;
* ``p2p``: the ring's host traffic alone: every rank sends ``n / P`` bytes to the next rank and
  receives as much from the previous one (``Sendrecv`` on pinned memory).

Times are seconds per call: the maximum over ranks of one call (barrier, call, stream sync), median
over the repetitions.  A chunk sweep of the ring at ``--sweep-bytes`` (64 MiB) follows, plus the
chain bcast and ring allgather against the host MPI's own path.
"""

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

import cupy as cp
from mpi4py import MPI

from mpiml import init
from mpiml.bench._common import machine_info
from mpiml.comm import get_comm

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--max-bytes", type=int, default=256 << 20)
ap.add_argument("--sweep-bytes", type=int, default=64 << 20)
ap.add_argument("--budget", type=float, default=150.0, help="seconds; later sections are skipped past it")
args = ap.parse_args()

os.environ.setdefault("MPIML_CHECK", "0")
comm = get_comm()
init(device="gpu")
world = MPI.COMM_WORLD
P, R = comm.size, comm.rank
T0 = time.perf_counter()
stream = cp.cuda.Stream(non_blocking=True)
stream.use()
sizes = [4 << (2 * i) for i in range(14) if (4 << (2 * i)) <= args.max_bytes]   # 4 B .. 256 MiB
results = {"allreduce": {}, "copy": {}, "p2p": {}, "sweep": {}, "bcast": {}, "allgather": {}}


def reps_for(nbytes, slow=False):
    return max(3, min(30 if slow else 50, int((2e8 if slow else 1e9) / max(nbytes, 1))))


def timed(fn, reps, warmup=1):
    """Median over reps of the max over ranks of one call's seconds."""
    for _ in range(warmup):
        fn()
    stream.synchronize()
    per = []
    for _ in range(reps):
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        per.append(time.perf_counter() - t0)
    worst = np.array(per)
    if P > 1:
        world.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    return float(np.median(worst))


def pinned(nbytes):
    mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
    return np.frombuffer(mem, dtype=np.uint8, count=nbytes)


def memcpy(dst, src, nbytes, s):
    cp.cuda.runtime.memcpyAsync(dst, src, nbytes, 4, s.ptr)


def say(msg):
    if R == 0:
        print(msg, flush=True)


# ---------------------------------------------------------------- allreduce sweep
for nbytes in sizes:
    if time.perf_counter() - T0 > args.budget:
        say(f"budget reached before {nbytes} B")
        break
    n = nbytes // 4
    x = cp.asarray(np.random.default_rng(R).integers(-3, 4, n).astype(np.float32))
    y = cp.empty_like(x)
    want = None
    row = {}
    for path, algo in (("ring", "mpi/ring"), ("staged_native", "mpi/native"), ("auto", None)):
        slow = path == "staged_native" and nbytes >= (1 << 20)
        row[path] = timed(lambda: comm.allreduce(x, out=y, algorithm=algo), reps_for(nbytes, slow))
        got = cp.asnumpy(y)
        if want is None:
            want = got
        elif not np.array_equal(got, want):
            say(f"MISMATCH {path} {nbytes} B")
            row[path + "_mismatch"] = True
    hs, hr = pinned(nbytes).view(np.float32), pinned(nbytes).view(np.float32)
    hs[:] = cp.asnumpy(x)
    row["host_allreduce"] = timed(lambda: world.Allreduce(hs, hr, op=MPI.SUM), reps_for(nbytes, True))

    def iallreduce():
        req = world.Iallreduce(hs, hr, op=MPI.SUM)
        while not req.Test():
            pass

    row["host_iallreduce"] = timed(iallreduce, reps_for(nbytes, True))
    if not np.array_equal(hr, want):
        row["host_mismatch"] = True
    results["allreduce"][nbytes] = row
    say(f"allreduce {nbytes:>10} B  " + "  ".join(f"{k}={v * 1e6:.1f}us" for k, v in row.items()
                                                   if isinstance(v, float)))
    del x, y, hs, hr

# ---------------------------------------------------------------- the floors: copies, host messages
down, up = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
for nbytes in [s for s in sizes if s >= (64 << 10)]:
    if time.perf_counter() - T0 > args.budget + 20:
        break
    d = cp.empty(nbytes // 4, dtype=cp.float32)
    d2 = cp.empty_like(d)
    h, h2 = pinned(nbytes), pinned(nbytes)
    reps = reps_for(nbytes)
    row = {}

    def d2h():
        memcpy(h.ctypes.data, d.data.ptr, nbytes, down)
        down.synchronize()

    def h2d():
        memcpy(d.data.ptr, h.ctypes.data, nbytes, up)
        up.synchronize()

    def bidir():
        memcpy(h.ctypes.data, d.data.ptr, nbytes, down)
        memcpy(d2.data.ptr, h2.ctypes.data, nbytes, up)
        down.synchronize()
        up.synchronize()

    for name, fn in (("d2h", d2h), ("h2d", h2d), ("bidir", bidir)):
        row[name + "_all"] = timed(fn, reps)
        row[name + "_alone"] = timed(lambda: fn() if R == 0 else None, reps)
    part = nbytes // P
    hs, hr = pinned(part), pinned(part)
    row["p2p"] = timed(lambda: world.Sendrecv([hs, MPI.BYTE], (R + 1) % P, 7, [hr, MPI.BYTE], (R - 1) % P, 7),
                       reps)
    results["copy"][nbytes] = row
    say(f"floors    {nbytes:>10} B  " + "  ".join(f"{k}={nbytes / v / 1e9:.1f}GB/s" for k, v in row.items()))
    del d, d2, h, h2, hs, hr

# ---------------------------------------------------------------- chunk sweep of the ring
nbytes = args.sweep_bytes
x = cp.ones(nbytes // 4, dtype=cp.float32)
y = cp.empty_like(x)
for chunk in (1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20):
    if time.perf_counter() - T0 > args.budget + 30:
        break
    os.environ["MPIML_STAGE_CHUNK"] = str(chunk)
    results["sweep"][chunk] = timed(lambda: comm.allreduce(x, out=y, algorithm="mpi/ring"), 5)
    say(f"ring {nbytes} B chunk {chunk >> 20} MiB: {results['sweep'][chunk] * 1e3:.2f} ms")
os.environ.pop("MPIML_STAGE_CHUNK", None)
del x, y

# ---------------------------------------------------------------- bcast (chain) and allgather (ring)
for nbytes in (4 << 10, 1 << 20, 16 << 20, 64 << 20):
    if time.perf_counter() - T0 > args.budget + 45:
        break
    b = cp.ones(nbytes // 4, dtype=cp.float32)
    row = {}
    for path, algo in (("chain", "mpi/chain"), ("staged_native", "mpi/native")):
        row[path] = timed(lambda: comm.bcast(b, root=0, algorithm=algo), reps_for(nbytes, True))
    hb = pinned(nbytes)
    row["host_bcast"] = timed(lambda: world.Bcast([hb, MPI.BYTE], root=0), reps_for(nbytes, True))
    results["bcast"][nbytes] = row
    g = cp.ones(nbytes // 4 // P, dtype=cp.float32)
    row = {}
    for path, algo in (("ring", "mpi/ring"), ("staged_native", "mpi/native")):
        row[path] = timed(lambda: comm.allgather(g, algorithm=algo), reps_for(nbytes, True))
    hs, hr = pinned(nbytes // P), pinned(nbytes // P * P)
    row["host_allgather"] = timed(lambda: world.Allgather([hs, MPI.BYTE], [hr, MPI.BYTE]), reps_for(nbytes, True))
    results["allgather"][nbytes] = row
    say(f"bcast {nbytes} B: " + "  ".join(f"{k}={v * 1e6:.0f}us" for k, v in results["bcast"][nbytes].items())
        + " | allgather: " + "  ".join(f"{k}={v * 1e6:.0f}us" for k, v in row.items()))

bus_ids = world.allgather(cp.cuda.runtime.deviceGetPCIBusId(cp.cuda.runtime.getDevice()))
if R == 0:
    info = machine_info(comm)
    info["gpus_used"] = len(set(bus_ids))
    info["ranks_per_gpu"] = P / len(set(bus_ids))
    info["cuda_aware_mpi"] = bool(comm._coll.cuda_aware)
    info["stage_chunk_bytes"] = int(os.environ.get("MPIML_STAGE_CHUNK", 4 << 20))
    doc = {"machine": info,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": f"mpirun -n {P} --bind-to none " + " ".join(["python3"] + sys.argv),
           "units": "seconds per call: max over ranks, median over repetitions; sizes in bytes (float32)",
           "results": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out} ({time.perf_counter() - T0:.0f} s)")
