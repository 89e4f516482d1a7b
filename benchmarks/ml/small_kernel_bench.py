"""The small kernel (``method="small"``: SIMT rows in registers, and its tensor-core form) against the
general tensor-core kernel and a plain CuPy Lloyd step at small d and k.

    OUT=DIR python benchmarks/ml/small_kernel_bench.py [SHAPES]      (GPU host; writes DIR/small_probe.json)

SHAPES: ``NxDxK,...`` (default 1e7x16x16, 1e7x8x8, 1e7x32x8, 1e7x12x9, 1e7x3x5, 1e7x16x32, 1e7x32x32).
Per shape and dtype, in one process: the Lloyd step (given unit weights and a distance buffer, and ``_unit``:
given neither, as KMeans steps without sample weights) and the arg-min of each form (CUDA-event medians of 7),
the small kernel's tensor-core form per rows a thread (tiles of 256 R rows), its registers and shared memory,
the plain CuPy Lloyd of the same data, the floor (reading X at HBM bandwidth), and checks: labels that differ
between the forms (near ties), sums, weights and inertia relative differences, and whether the default form
repeats its own bits.  This is the measurement behind ``distances._method``'s "small" rule and
``distances._SMALL_TC_CELLS``.
"""
import json
import os
import sys
import time

import numpy as np

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_bench import plain_cupy_lloyd, step_floors, step_inputs, timed  # noqa: E402

from mpiml.kernels import distances  # noqa: E402
from mpiml.kernels.kmeans import _small  # noqa: E402

SIMT, TC = (None, None, None, False), (None, None, None, True)


def rel(a, b):
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


def main(argv):
    spec = argv[1] if len(argv) > 1 else "1e7x16x16,1e7x8x8,1e7x32x8,1e7x12x9,1e7x3x5,1e7x16x32,1e7x32x32"
    shapes = [tuple(int(float(v)) for v in s.split("x")) for s in spec.split(",")]
    _small._SMALL_TC_CELLS = 512             # measure the tensor-core form where it spills too
    out = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "command": "OUT=DIR python " + " ".join(["benchmarks/ml/small_kernel_bench.py"] + argv[1:]), "rows": []}
    for dt in (np.float32, np.float64):
        for n, d, k in shapes:
            X, C0, shift, C, w, labels, mind = step_inputs(n, d, k, dt)
            Ch = C.get()
            fb, ff = step_floors(n, d, k, dt)
            row = {"n": n, "d": d, "k": k, "dtype": np.dtype(dt).name, "floor_ms": max(fb, ff)}
            tc_ok = distances._small_tc_fits(dt, k, d)
            forms = [("tc", None, None), ("small_simt", "small", SIMT)]
            if tc_ok:
                forms += [("small_tc", "small", TC), ("small_tc_r1", "small", (None, 1, None, True)),
                          ("small_tc_r4", "small", (None, 4, None, True))]
            res = {}
            for tag, m, tile in forms:
                try:
                    lab = cp.full(n, -1, cp.int32)
                    p = distances.lloyd_step_packed(X, Ch, w, shift=shift, labels=lab, mind=mind, method=m or "tc",
                                                    tile=tile)
                    res[tag] = (p.get(), lab.get())
                    row[f"lloyd_{tag}"] = timed(lambda: distances.lloyd_step_packed(
                        X, Ch, w, shift=shift, labels=labels, mind=mind, method=m or "tc", tile=tile), 7)
                    # as KMeans steps without sample weights: no weights vector, no distance buffer
                    row[f"lloyd_{tag}_unit"] = timed(lambda: distances.lloyd_step_packed(
                        X, Ch, None, shift=shift, labels=labels, method=m or "tc", tile=tile), 7)
                    lab2 = cp.full(n, -1, cp.int32)
                    p2 = distances.lloyd_step_packed(X, Ch, None, shift=shift, labels=lab2, method=m or "tc",
                                                     tile=tile)
                    row[f"{tag}_unit_same_bits"] = bool(np.array_equal(p2.get(), res[tag][0])
                                                        and np.array_equal(lab2.get(), res[tag][1]))
                    row[f"assign_{tag}"] = timed(lambda: distances.argmin_sqeuclidean(
                        X, Ch, shift=shift, method=m or "tc", tile=tile), 7)
                except Exception as e:  # noqa
                    row[f"err_{tag}"] = repr(e)[:200]
            kd = k * d
            pt, lt = res["tc"]
            for tag in [t for t, _, _ in forms if t != "tc" and t in res]:
                ps, ls = res[tag]
                row[f"{tag}_label_diff"] = int((lt != ls).sum())
                row[f"{tag}_sums_rel"] = rel(ps[:kd], pt[:kd])
                row[f"{tag}_weights_rel"] = rel(ps[kd:kd + k], pt[kd:kd + k])
                row[f"{tag}_inertia_rel"] = float(abs(pt[-2] - ps[-2]) / abs(pt[-2]))
            lab = cp.full(n, -1, cp.int32)
            p2 = distances.lloyd_step_packed(X, Ch, w, shift=shift, labels=lab, mind=mind, method="small")
            first = res["small_tc" if tc_ok else "small_simt"][0]
            row["default_repeat_bits"] = bool(np.array_equal(p2.get()[:-1], first[:-1]))
            row["plain_cupy_ms"] = timed(lambda: plain_cupy_lloyd(X, C0), 5, 1)
            for tag, tc in (("simt", False), ("tc", True)) if tc_ok else (("simt", False),):
                pl = distances.small_plan(dt, k, d, tc=tc)
                row[f"regs_{tag}"] = int(distances._function(pl["expr"]).num_regs)
                row[f"regs_assign_{tag}"] = int(distances._function(
                    distances.small_plan(dt, k, d, mode="assign", tc=tc)["expr"]).num_regs)
                row[f"smem_{tag}"] = pl["smem"]
            print(json.dumps({kk: (float(f"{v:.4g}") if isinstance(v, float) else v) for kk, v in row.items()}),
                  flush=True)
            out["rows"].append(row)
            X = C0 = C = w = labels = mind = None          # free the shape's arrays before the next
            cp.get_default_memory_pool().free_all_blocks()
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "small_probe.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv)
