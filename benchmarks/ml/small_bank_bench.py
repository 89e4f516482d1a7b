"""The SIMT small kernel given host centres (its parameters form) and device centres (its constant-bank form:
a queued pack and device-to-device copy, then the same FMAs reading the bank), back to back on one GPU.

    OUT=DIR python benchmarks/ml/small_bank_bench.py [SHAPES]      (GPU host; writes DIR/small_bank.json)

SHAPES: ``NxDxKxDTYPExMODE,...`` (default: float64 Lloyd steps at 16 x 16, 32 x 8, 8 x 8, a float64
arg-min at 16 x 16 and float32 arg-mins at d 12, k 9 and d 16, k 32, all of 10^7 rows).  Per shape: CUDA-event
medians of 10 launches, three rounds alternating the two forms, the best round of each, each form's
registers, and whether the two give the same bits.  Launched back to back, neither waits on the host: the
difference is the kernel's (and the bank fill's), not the wait for the centres that the bank removes from
KMeans's device loop (an A/B of ``mpiml bench ml --shapes`` measures that: ``benchmarks/ml/README.md``).
"""
import json
import os
import sys
import time

import numpy as np

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_bench import timed  # noqa: E402

from mpiml.kernels import distances  # noqa: E402

SIMT = (None, None, None, False)
DEFAULT = ("1e7x16x16xfloat64xlloyd,1e7x32x8xfloat64xlloyd,1e7x8x8xfloat64xlloyd,1e7x16x16xfloat64xargmin,"
           "1e7x12x9xfloat32xargmin,1e7x16x32xfloat32xargmin")


def main(argv):
    spec = argv[1] if len(argv) > 1 else DEFAULT
    out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": "OUT=DIR python " + " ".join(["benchmarks/ml/small_bank_bench.py"] + argv[1:]), "rows": []}
    for item in spec.split(","):
        n, d, k, dt, mode = item.split("x")
        n, d, k, dt = int(float(n)), int(d), int(k), np.dtype(dt)
        X = cp.random.RandomState(0).standard_normal((n, d), dtype=cp.float64).astype(dt)
        Ch = np.random.RandomState(1).randn(k, d).astype(dt)
        Cd = cp.asarray(Ch)
        labels = cp.full(n, -1, cp.int32)
        if mode == "lloyd":
            def run(C, lab=labels):
                return distances.lloyd_step_packed(X, C, labels=lab, method="small", tile=SIMT)
        else:
            def run(C, lab=None):
                return distances.argmin_sqeuclidean(X, C, method="small", tile=SIMT)[1]
        # each form from the same previous labels (the step counts the labels that changed)
        same = bool((run(Ch, cp.full(n, -1, cp.int32)) == run(Cd, cp.full(n, -1, cp.int32))).all())
        rounds = [(timed(lambda: run(Ch)), timed(lambda: run(Cd))) for _ in range(3)]
        plan = distances.small_plan(dt, k, d, mode="lloyd" if mode == "lloyd" else "assign", tc=False)
        row = {"n": n, "d": d, "k": k, "dtype": dt.name, "mode": mode, "same_bits": same,
               "params_ms": min(r[0] for r in rounds), "bank_ms": min(r[1] for r in rounds),
               "rounds_ms": rounds, "regs": {f: int(distances._function(plan[e]).num_regs)
                                             for f, e in (("params", "expr"), ("bank", "expr_cb"))}}
        print(f"{n:.0e} x {d} k={k} {dt.name} {mode}: params {row['params_ms']:.4f} ms, bank {row['bank_ms']:.4f} "
              f"ms ({row['bank_ms'] / row['params_ms']:.3f}x), regs {row['regs']}, same bits {same}", flush=True)
        out["rows"].append(row)
        X = labels = None
        cp.get_default_memory_pool().free_all_blocks()
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "small_bank.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv)
