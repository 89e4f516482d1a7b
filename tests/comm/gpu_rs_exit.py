"""The exit of ``benchmarks/gpu/vs_nccl.py --ops reduce_scatter`` at 2 ranks, replayed (test_rs_exit.py runs it).

    mpirun -n 2 python tests/comm/gpu_rs_exit.py [--sizes 4,1024,...] [--rounds 3]

On 2 x H200 that benchmark, with the 2-rank rules that ``mpiml tune`` wrote there (reduce_scatter eager: ll up to
128 B, ll128 to 192 KiB, ll to 512 KiB, ll128 to 1.5 MiB, oneshot to 16 MiB; in graphs: ll to 512 KiB, ll128 to
1.5 MiB, oneshot to 16 MiB; NCCL above), measured every row and never exited.  This makes the same calls in the
same order on any GPU model: those rules from an explicit ``MPIML_TUNING_FILE`` (written here unless the variable is
set), a raw CuPy ``NcclCommunicator`` beside mpiml's, every size through ``raw``, ``auto`` (default checking) and
``auto0`` (``MPIML_CHECK=0``), eager (back-to-back calls) then in CUDA graphs (20 calls captured, replayed), in
``--rounds`` rounds, an object allgather and a max-agreement after each; rank 0 then builds and writes a report as
the benchmark does.  Each rank prints ``rs_exit done at <time>`` after its last statement and
``rs_exit hooks done at <time>`` from its last Python exit hook; the launcher's return shows the exit ended.
``MPIML_TIMEOUT`` defaults to 10 here (as on the run that hung).
"""

import argparse
import atexit
import json
import os
import statistics
import sys
import tempfile
import time

RULES = [
    {"op": "reduce_scatter", "memory": "device", "min_ranks": 2, "max_ranks": 2, "max_bytes": b, "backend": "ipc",
     "algorithm": a, "mode": m}
    for m, rules in (("eager", ((128, "ll"), (196608, "ll128"), (524288, "ll"), (1572864, "ll128"),
                                (16777216, "oneshot"))),
                     ("graph", ((524288, "ll"), (1572864, "ll128"), (16777216, "oneshot"))))
    for b, a in rules
]
SIZES = "4,1024,16384,65536,262144,524288,786432,1048576,2097152,3145728,4194304,8388608,16777216,67108864,268435456"


def _hooks_done():
    print(f"rs_exit hooks done at {time.time():.3f}", flush=True)


atexit.register(_hooks_done)  # (registered first: runs after every later hook, mpiml's included)

ap = argparse.ArgumentParser()
ap.add_argument("--sizes", default=SIZES)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()

os.environ.setdefault("MPIML_TIMEOUT", "10")
if "MPIML_TUNING_FILE" not in os.environ:
    fd, path = tempfile.mkstemp(suffix=".json", prefix="mpiml_rs_exit_")
    with os.fdopen(fd, "w") as f:
        json.dump({"version": 1, "machine": "the 2-rank reduce_scatter rules of the 2 x H200 table", "date": "",
                   "command": "tests/comm/gpu_rs_exit.py", "rules": RULES}, f)
    os.environ["MPIML_TUNING_FILE"] = path
    atexit.register(os.unlink, path)

import cupy as cp  # noqa: E402
from cupy.cuda import nccl  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "gpu"))
import _timing  # noqa: E402  (the benchmark's own timing: the same calls in the same order)

from mpiml import init  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402

os.environ.pop("MPIML_CHECK", None)
comm = get_comm()
init(device="gpu")
P, R = comm.size, comm.rank
stream = cp.cuda.Stream(non_blocking=True)
stream.use()
uid = comm.bcast_obj(nccl.get_unique_id() if R == 0 else None)
raw = nccl.NcclCommunicator(P, uid, R)
PATHS = ("raw", "auto", "auto0")


def set_check(path):
    if path == "auto":
        os.environ.pop("MPIML_CHECK", None)
    else:
        os.environ["MPIML_CHECK"] = "0"


def buffers(nbytes):
    return _timing.buffers("reduce_scatter", nbytes, P)


def make_call(path, x, y):
    if path == "raw":
        return lambda: raw.reduceScatter(x.data.ptr, y.data.ptr, x.size // P, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                         stream.ptr)
    return lambda: comm.reduce_scatter(x, out=y)


def eager(fn, iters):
    return _timing.eager(fn, iters, comm, stream)[0]


def graph(fn, iters, calls=20):
    return _timing.graph(fn, iters, comm, stream, calls)


for p in PATHS:  # warm-up, as the benchmark's
    w, wy = buffers(4096)
    set_check(p)
    make_call(p, w, wy)()
stream.synchronize()

rows = []
t_start = time.perf_counter()
for nbytes in (int(s) for s in args.sizes.split(",")):
    x, y = buffers(nbytes)
    calls = {p: make_call(p, x, y) for p in PATHS}
    it = max(10, min(300, int(3e9 / max(nbytes, 1))))
    for mode in ("eager", "graph"):
        times = {p: [] for p in calls}
        for _ in range(args.rounds):
            for p, fn in calls.items():
                set_check(p)
                err = None
                try:
                    t = eager(fn, it) if mode == "eager" else graph(fn, max(3, it // 20))
                except Exception as exc:
                    err, t = f"{type(exc).__name__}: {exc}"[:200], float("nan")
                errs = [e for e in comm.allgather_obj(err) if e]
                if errs:
                    raise SystemExit(f"rank {R}: {p} {mode} {nbytes} B failed: {errs[0]}")
                times[p].append(comm.allreduce_obj(t, "max"))
        for p in calls:
            rows.append({"op": "reduce_scatter", "path": p, "mode": mode, "bytes": nbytes,
                         "us": statistics.median(times[p]) * 1e6})
        set_check("raw")
        if R == 0:
            print(f"reduce_scatter {mode:5s} {nbytes:>10d} B  "
                  + " ".join(f"{p}={statistics.median(times[p]) * 1e6:.1f}" for p in calls), flush=True)
    del x, y

if R == 0:  # the benchmark's report: its allocations are rank 0's alone
    doc = {"machine": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "nccl_version": nccl.get_version(),
           "env": {k: v for k, v in os.environ.items() if k.startswith(("MPIML_", "NCCL_"))},
           "seconds_total": time.perf_counter() - t_start, "micro": {}, "rows": rows}
    text = json.dumps(doc, indent=1)
    print(f"rs_exit: {len(rows)} rows ({len(text)} bytes of report), {time.perf_counter() - t_start:.0f} s",
          flush=True)
print(f"rs_exit done at {time.time():.3f}", flush=True)
sys.stdout.flush()
