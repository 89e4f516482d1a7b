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
``--sample`` seconds each rank records its resident host memory, CuPy's pool (used, held) and
the device's free memory; rank 0 writes them with the verdict.

The verdict (printed and in the JSON): no error and no wrong result on any rank, and memory flat:
the last fifth of the samples holds at most ``--growth-mib`` MiB more than the first fifth after
warm-up in host RSS and in CuPy's pool in use, and at most ``--device-growth-mib`` more in the
device's used memory (which includes the pool's cached free blocks), on every rank.
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


def memory():
    if args.cpu:
        return {"rss": rss_bytes(), "pool_used": 0, "pool_held": 0, "device_used": 0}
    pool = cp.get_default_memory_pool()
    free, total = cp.cuda.runtime.memGetInfo()
    return {"rss": rss_bytes(), "pool_used": pool.used_bytes(), "pool_held": pool.total_bytes(),
            "device_used": total - free}


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


def flat(samples):
    """(ok, growth in MiB per field): last fifth vs first fifth after the first 10 % (warm-up)."""
    if len(samples) < 10:
        return True, {}
    body = samples[len(samples) // 10:]
    k = max(1, len(body) // 5)
    growth = {}
    for f in ("rss", "pool_used", "device_used"):
        first = np.median([s[f] for s in body[:k]])
        last = np.median([s[f] for s in body[-k:]])
        growth[f] = round(float(last - first) / 2**20, 2)
    limit = {"rss": args.growth_mib, "pool_used": args.growth_mib, "device_used": args.device_growth_mib}
    return all(g <= limit[f] for f, g in growth.items()), growth


t_start, samples, failures, steps, calls_by_op = main()
ok_mem, growth = flat(samples)
from mpi4py import MPI  # noqa: E402  (the verdict travels outside mpiml: its communicator may be dead)

everyone = MPI.COMM_WORLD.allgather({"rank": R, "failures": failures, "growth_mib": growth, "flat": ok_mem,
                                     "samples": samples})
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
           "verdict": verdict, "ranks_detail": everyone}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    for e in everyone:
        for f in e["failures"][:5]:
            print(f"rank {e['rank']}: FAIL {f}", flush=True)
        print(f"rank {e['rank']}: memory growth (MiB) {e['growth_mib']} flat={e['flat']}", flush=True)
    print(f"{verdict}: {steps} steps in {doc['seconds']:.0f} s on {P} ranks, {total_fail} failure(s), "
          f"calls {calls_by_op}; wrote {args.out}", flush=True)
    if args.plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
            for e in everyone:
                ts = [s["t"] for s in e["samples"]]
                for a, f in zip(axes, ("rss", "pool_used", "device_used")):
                    a.plot(ts, [s[f] / 2**20 for s in e["samples"]], label=f"rank {e['rank']}")
                    a.set_title(f"{f} (MiB)", fontsize=9)
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
