"""The whole-rows-in-registers kernel (``method="small"``) against the tensor-core kernel at small d and k.

    OUT=DIR python benchmarks/ml/small_kernel_bench.py      (GPU host; writes DIR/small_probe.json)

Per shape (10^7 rows) and dtype, in one process: the Lloyd step and the arg-min of both kernels (CUDA-event
medians of 7), the small kernel per (stages, rows a thread), its registers and shared memory, and checks: labels
that differ between the two kernels (near ties), sums and inertia relative differences, and whether the
small kernel repeats its own bits.  This is the measurement behind ``distances._method``'s "small" rule.
"""
import json
import os
import sys
import time

import numpy as np

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_bench import step_floors, step_inputs, timed  # noqa: E402

from mpiml.kernels import distances  # noqa: E402

out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
       "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "command": "OUT=DIR python benchmarks/ml/small_kernel_bench.py", "rows": []}
shapes = [(10**7, 16, 16), (10**7, 32, 32), (10**7, 8, 8), (10**7, 32, 16), (10**7, 3, 5)]
for dt in (np.float32, np.float64):
    for n, d, k in shapes:
        X, C0, shift, C, w, labels, mind = step_inputs(n, d, k, dt)
        fb, ff = step_floors(n, d, k, dt)
        floor = max(fb, ff)
        row = {"n": n, "d": d, "k": k, "dtype": np.dtype(dt).name, "floor_ms": floor}
        res = {}
        for m in ("tc", "small"):
            lab = cp.full(n, -1, cp.int32)
            p = distances.lloyd_step_packed(X, C, w, shift=shift, labels=lab, mind=mind, method=m)
            res[m] = (p.get(), lab.get())
        (pt, lt), (ps, ls) = res["tc"], res["small"]
        row["label_diff"] = int((lt != ls).sum())
        kd = k * d
        row["sums_rel"] = float(np.abs(pt[:kd] - ps[:kd]).max() / (np.abs(pt[:kd]).max() + 1e-30))
        row["counts_equal"] = bool(np.array_equal(pt[kd:kd + k], ps[kd:kd + k])) if row["label_diff"] == 0 else None
        row["inertia_rel"] = float(abs(pt[-2] - ps[-2]) / abs(pt[-2]))
        lab = cp.full(n, -1, cp.int32)
        p2 = distances.lloyd_step_packed(X, C, w, shift=shift, labels=lab, mind=mind, method="small")
        lab3 = cp.full(n, -1, cp.int32)
        p3 = distances.lloyd_step_packed(X, C, w, shift=shift, labels=lab3, mind=mind, method="small",
                                         tile=(2, 1, False))
        row["shared_vs_param_label_diff"] = int((lab3 != lab).sum())
        row["shared_vs_param_sums_rel"] = float(cp.abs(p3[:k * d] - p2[:k * d]).max() / cp.abs(p2[:k * d]).max())
        row["repeat_bits"] = bool(np.array_equal(p2.get()[:-1], ps[:-1]))
        # (stages, rows a thread, centres as kernel parameters); the centres are passed from the host, as
        # KMeans does (from the device, the small kernel's parameters wait for a copy back)
        variants = [("tc", None), ("small", None)] + [("small", v) for v in (
            ((2, 2, False), (2, 1, True), (2, 2, True), (3, 2, True), (2, 4, True)) if dt == np.float32 else
            ((2, 1, False), (2, 1, True), (3, 1, True), (2, 2, True)))]
        Ch = C.get()
        for m, st in variants:
            tag = m if st is None else f"{m}{st[0]}x{st[1]}{'p' if st[2] else ''}"
            try:
                row[f"lloyd_{tag}"] = timed(lambda: distances.lloyd_step_packed(X, Ch, w, shift=shift, labels=labels,
                                                                              mind=mind, method=m, tile=st), 7)
                row[f"assign_{tag}"] = timed(lambda: distances.argmin_sqeuclidean(X, Ch, shift=shift, method=m,
                                                                                tile=st), 7)
            except Exception as e:  # noqa
                row[f"err_{tag}"] = repr(e)[:200]
        pl = distances.small_plan(dt, k, d)
        row["regs"] = int(distances._function(pl["expr"]).num_regs)
        row["regs_assign"] = int(distances._function(distances.small_plan(dt, k, d, mode="assign")["expr"]).num_regs)
        row["smem"] = pl["smem"]
        print(json.dumps({kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
        out["rows"].append(row)
        del X, C0, C, w, labels, mind
        cp.get_default_memory_pool().free_all_blocks()
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "small_probe.json"), "w"), indent=1)
