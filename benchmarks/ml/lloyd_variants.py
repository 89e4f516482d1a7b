"""The parts of a tensor-core Lloyd step, timed apart and in combination, at the kernel benchmark's shapes.

    python benchmarks/ml/lloyd_variants.py OUTDIR [--sums-only] [--shapes all|f32|NAME ...]

Per (n, d, k, dtype), in one process, medians of CUDA events (kernels only):

* ``auto``: ``lloyd_step_packed`` as users get it;
* ``assign[tile]``: the arg-min kernel alone (``argmin_sqeuclidean``, predict) per tensor-core tile;
* ``kernel[tile]``: the Lloyd kernel without its sums (``accum="pass"``, sums pass skipped): labels,
  weights, inertia, changed (float32 with k <= 64: the arg-min kernel and the totals pass, as a step runs them);
* ``sums[kind]``: the sums pass alone from the labels: ``simt`` (adds in warp copies: float32 flushed to
  float64 for float32 data), ``simt64`` (float64 copies), ``mma``
  (one-hot products on the tensor cores), ``label_sums`` (the SIMT family's column pass, atomics);
* ``sums[simt,STAGES,BLOCKS,RW]``: the ``simt`` pass by tiles in flight, blocks an SM and rows a warp of a
  tile (``SUMS_TILES``),
  each checked against float64 sums (``--sums-only``: these and ``auto`` alone);
* ``lloyd[tile+kind]``: a whole step of the unfused kernel + a sums pass, and the fused kernels
  (``smem``, ``mma``); each checked against float64 sums from its own labels and its weights per cluster.
  From k = 256 on also ``lloyd[tile+label]`` (the SIMT family's column pass, one pass for any k).

Writes OUTDIR/lloyd_variants.json (device, date, command) and prints a table with the floor
``max(bytes / 4.3 TB/s, 2 n k d / FP rate)`` and each time's ratio to it.
"""

import json
import os
import sys
import time

import numpy as np

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_bench import precompile, step_floors, step_inputs, timed  # noqa: E402

from mpiml.kernels import distances  # noqa: E402

SHAPES = {
    "1e7x64x64_f32": (10**7, 64, 64, np.float32),
    "1e7x16x16_f32": (10**7, 16, 16, np.float32),
    "1e6x256x1024_f32": (10**6, 256, 1024, np.float32),
    "2e6x1024x64_f32": (2 * 10**6, 1024, 64, np.float32),
    "1e7x64x64_f64": (10**7, 64, 64, np.float64),
    "1e7x16x16_f64": (10**7, 16, 16, np.float64),
    "2e6x1024x64_f64": (2 * 10**6, 1024, 64, np.float64),
}
# tensor-core tiles (WMT, BN, DK, MINB[, STAGES]) tried for the arg-min kernel and the Lloyd kernels
TILES = {
    (64, 64): [None, (1, 64, 64, 1), (1, 64, 64, 1, 3)],
    (16, 16): [None, (2, 16, 16, 2, 3), (2, 16, 16, 2, 4), (4, 16, 16, 2), (4, 16, 16, 2, 3)],
    (1024, 256): [None, (1, 64, 32, 2), (2, 64, 64, 1), (1, 64, 64, 1)],
    (64, 1024): [None, (1, 64, 32, 2), (1, 64, 64, 2)],
}


# the float32 sums pass (float32 copies) by (stages, blocks an SM, rows a warp of a tile): the default, more
# tiles in flight, longer tiles, one block an SM (its copies leave shared memory for more tiles)
SUMS_TILES = [(None, None, None), (3, 2, 8), (4, 2, 8), (3, 2, 12), (2, 2, 16), (8, 1, 8)]


def _sums_variants(k, d, dt):
    out = []
    for st, ps, rw in SUMS_TILES if np.dtype(dt) == np.float32 else [(None, None, None)]:
        try:
            out.append((st, ps, rw, distances.sums_plan(dt, k, d, kind="simt", stages=st, per_sm=ps,
                                                        rows_per_warp=rw)))
        except ValueError:
            pass
    return out


def _tiles(k, d):
    return TILES.get((k, d), [None])


def _exprs(n, d, k, dt):
    ct = distances._CTYPE[np.dtype(dt)]
    out = ["mpiml_distances_reduce_partials", f"mpiml_distances_label_sums<{ct}, double>",
           f"mpiml_distances_label_sums<{ct}, float>", f"mpiml_distances_argmin_gemm<{ct}>"]
    for tile in _tiles(k, d):
        for mode, accum in (("assign", None), ("lloyd", "pass"), ("lloyd", "smem"), ("lloyd", "mma")):
            try:
                p = distances.tc_plan(dt, k, d, mode=mode, tile=tile, accum=accum)
                out += [p["expr"], p["pack"]]
            except ValueError:
                pass
    for kind in ("simt", "simt64", "mma"):
        out.append(distances.sums_plan(dt, k, d, kind=kind)["expr"])
    out += [p["expr"] for *_, p in _sums_variants(k, d, dt)]
    return out


def _check(X, shift, w, labels, packed, k, d):
    """Largest error of the sums (relative to the largest |sum|) against float64 from the step's own labels,
    and whether the weights per cluster match."""
    lab = labels.astype(cp.int64)
    ref_sums = cp.zeros((k, d), cp.float64)
    step = max(1, (1 << 28) // (d * 8))
    for s in range(0, X.shape[0], step):
        Xs = X[s:s + step].astype(cp.float64) - shift.astype(cp.float64)
        ws = w[s:s + step].astype(cp.float64)
        cp.add.at(ref_sums, lab[s:s + step], Xs * ws[:, None])
        del Xs
    got = packed[:k * d].reshape(k, d)
    return {"sums_rel_err": float(cp.abs(got - ref_sums).max() / cp.abs(ref_sums).max()),
            "weights_ok": bool(cp.allclose(packed[k * d:k * d + k],
                                           cp.bincount(labels, weights=w.astype(cp.float64), minlength=k)))}


def run_shape(name, n, d, k, dt, reps=5, sums_only=False):
    X, C0, shift, C, w, labels, mind = step_inputs(n, d, k, dt)
    floor = max(step_floors(n, d, k, dt))
    row = {"name": name, "n": n, "d": d, "k": k, "dtype": np.dtype(dt).name, "floor_ms": floor, "times": {},
           "checks": {}, "plans": {}}
    T = row["times"]

    def rec(key, fn, check=False):
        try:
            T[key] = timed(fn, reps)
            if check:
                out = cp.zeros(k * d + k + 2)
                fn(out)
                row["checks"][key] = _check(X, shift, w, labels, out, k, d)
        except Exception as exc:       # keep the others
            T[key] = None
            row["checks"][key] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"  {name} {key}: {T[key] if T[key] is None else round(T[key], 3)} ms", flush=True)

    buf = cp.zeros(k * d + k + 2)

    def lloyd(tile=None, accum=None, sums=None):
        def fn(out=buf):
            out[:] = 0
            distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile, accum=accum, sums=sums)
        return fn

    C_host = C.get()                    # KMeans gives the kernels its centres from the host

    def auto(out=buf):
        out[:] = distances.lloyd_step_packed(X, C_host, w, shift=shift, labels=labels, mind=mind)

    rec("auto", auto, check=True)
    row["auto_method"] = distances._method("auto", k, d, dt, True)
    for st, ps, rw, plan in _sums_variants(k, d, dt):
        def sums(out=buf, st=st, ps=ps, rw=rw):
            out[:] = 0
            distances._sums_pass(X, shift, w, labels, k, out, kind="simt", stages=st, per_sm=ps, rows_per_warp=rw)
        key = f"sums[simt,{plan['stages']},{plan['per_sm']},{plan['rows'] // 8}]"
        rec(key, sums, check=True)
        if isinstance(row["checks"][key], dict):
            row["checks"][key].pop("weights_ok")          # a sums pass leaves the weights to the kernel
        row["plans"][key] = plan
    for tile in [] if sums_only else _tiles(k, d):
        tag = "default" if tile is None else ",".join(map(str, tile))
        rec(f"assign[{tag}]", lambda: distances._tc_launch(X, C, shift, None, labels, mind, buf, lloyd=False,
                                                           tile=tile))
        rec(f"kernel[{tag}]", lloyd(tile, "pass", "none"))
        row["plans"][tag] = {kk: v for kk, v in distances.tc_plan(dt, k, d, mode="lloyd", tile=tile,
                                                                  accum="pass").items() if kk != "ctype"}
        regs = distances._function(row["plans"][tag]["expr"]).num_regs
        row["plans"][tag]["regs"] = int(regs)
        for kind in ("simt", "mma") + (("label",) if k >= 256 else ()):
            rec(f"lloyd[{tag}+{kind}]", lloyd(tile, "pass", kind), check=True)
        if d <= 64:
            for accum in ("smem", "mma"):
                try:
                    distances.tc_plan(dt, k, d, mode="lloyd", tile=tile, accum=accum)
                except ValueError:
                    continue
                rec(f"lloyd[{tag}+fused-{accum}]", lloyd(tile, accum), check=True)
    # the sums passes alone, from the labels of the last step
    for kind in () if sums_only else ("simt", "simt64", "mma"):
        rec(f"sums[{kind}]", lambda kind=kind: distances._sums_pass(X, shift, w, labels, k, buf, kind=kind))
    if not sums_only:
        rec("sums[label_sums]", lambda: distances._label_sums(X, shift, w, labels, k, buf, "double"))
    for kind in () if sums_only else ("simt", "simt64", "mma"):
        row["plans"][f"sums_{kind}"] = distances.sums_plan(dt, k, d, kind=kind)
    del X, C, C0, w, labels, mind
    cp.get_default_memory_pool().free_all_blocks()
    return row


def main(argv):
    out = argv[0]
    sums_only = "--sums-only" in argv
    names = [a for a in argv if a != "--sums-only"]
    names = names[names.index("--shapes") + 1:] if "--shapes" in names else ["all"]
    if names == ["all"]:
        names = list(SHAPES)
    elif names == ["f32"]:
        names = [nm for nm in SHAPES if nm.endswith("f32")]
    os.makedirs(out, exist_ok=True)
    props = cp.cuda.runtime.getDeviceProperties(0)
    result = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "command": "python benchmarks/ml/lloyd_variants.py " + " ".join(argv), "rows": []}
    exprs = []
    for nm in names:
        exprs += _exprs(*SHAPES[nm])
    t0 = time.perf_counter()
    precompile(exprs)
    print(f"{result['device']}: compiled {len(set(exprs))} kernels in {time.perf_counter() - t0:.1f} s", flush=True)
    for nm in names:
        try:
            result["rows"].append(run_shape(nm, *SHAPES[nm], sums_only=sums_only))
        except Exception as exc:
            result["rows"].append({"name": nm, "error": f"{type(exc).__name__}: {exc}"})
        with open(os.path.join(out, "lloyd_variants.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['name']}: {r['error']}")
            continue
        print(f"\n{r['name']}  floor {r['floor_ms']:.3f} ms  (auto = {r['auto_method']})")
        for key, ms in r["times"].items():
            chk = r["checks"].get(key, "")
            if isinstance(chk, dict):
                chk = f"sums err {chk['sums_rel_err']:.1e}{'' if chk.get('weights_ok', True) else '  WEIGHTS WRONG'}"
            took = "failed" if ms is None else f"{ms:8.3f} ms {ms / r['floor_ms']:6.2f}x"
            print(f"  {key:<34}{took}  {chk}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
