"""Fused distance kernels on one GPU, side by side with a plain CuPy Lloyd step, against their floors.

    python benchmarks/ml/kernels_bench.py OUTDIR [--quick] [--sweep] [--no-fit]

For each (n, d, k, dtype): the mpiml Lloyd step as KMeans calls it without sample weights (no weights vector,
no distance buffer; tensor-core kernel ``tc``, the SIMT register tile ``fused``, the small kernel ``small``
and cuBLAS GEMM + arg-min epilogue ``gemm``), the default method's step with a vector of unit weights and a
distance buffer (``lloyd_weighted_ms``: what a step given weights costs), the
arg-min alone (predict), the plain CuPy Lloyd (``X @ C.T``, ``argmin``, ``cupy.add.at``,
``bincount``) and the floor ``max(bytes of X / 4.3 TB/s, 2 n k d / FP rate)`` (FP32 60 TFLOP/s,
FP64 34 TFLOP/s; the copy bandwidth and the cuBLAS rate are measured too).  Labels are checked
against a float64 reference on a sample of rows.  Then the whole fit (k-means|| init + 20 iterations,
n_init=1) at 10^7 x 64, k = 64 on this GPU with the tensor-core kernels and with the SIMT ones
(``MPIML_DISTANCES_METHOD=fused``: the kernels before this version), and scikit-learn's fit on the host's
cores on a subsample, scaled to the same rows.  Writes OUTDIR/kernels_bench.json and .png.
"""

import json
import os
import sys
import time

import numpy as np

import cupy as cp

from mpiml.kernels import distances

HBM = 4.3e12
FP = {"float32": 60e12, "float64": 34e12}
SHAPES = [(10**7, 64, 64), (10**7, 16, 16), (10**6, 256, 1024), (2 * 10**6, 1024, 64)]
# tile shapes (TM, TN, CG, DK, MINB) tried per shape with --sweep; the table's choice is measured too
SWEEP = {
    (10**7, 64, 64, "float32"): [(8, 4, 16, 32, 1), (8, 8, 8, 16, 1), (8, 8, 8, 32, 1), (4, 4, 16, 16, 2),
                                 (8, 4, 16, 8, 2)],
    (10**7, 16, 16, "float32"): [(2, 4, 4, 16, 2), (4, 2, 8, 16, 2), (4, 4, 4, 16, 1)],
    (10**6, 256, 1024, "float32"): [(8, 8, 16, 32, 1), (8, 8, 8, 16, 1)],
    (2 * 10**6, 1024, 64, "float32"): [(8, 4, 16, 32, 1), (8, 8, 8, 16, 1), (8, 8, 8, 32, 1)],
    (10**7, 64, 64, "float64"): [(4, 4, 16, 16, 2), (4, 8, 8, 8, 1), (4, 4, 8, 8, 2)],
    (10**7, 16, 16, "float64"): [(4, 4, 4, 8, 1)],
}
# tensor-core tiles (WMT, BN, DK) tried with --sweep (the default plan is measured too)
TC_SWEEP = {
    (10**7, 64, 64, "float32"): [(1, 64, 64), (2, 32, 64)],
    (10**7, 16, 16, "float32"): [(4, 16, 16, 1), (2, 16, 16, 1), (1, 16, 16, 2)],
    (10**6, 256, 1024, "float32"): [(1, 64, 32), (2, 64, 16)],
    (2 * 10**6, 1024, 64, "float32"): [(1, 64, 32), (2, 64, 16)],
    (10**7, 64, 64, "float64"): [(1, 64, 64), (2, 64, 32)],
    (10**7, 16, 16, "float64"): [(4, 16, 16, 1), (1, 16, 16, 2)],
}
# tc: the tensor-core kernel as planned; tc_mma: one-hot products; small: whole rows in registers (k, d <= 32)
METHODS = ("tc", "tc_mma", "small", "fused", "gemm")


def _compile_one(expr):
    from mpiml.kernels import distances as dist

    try:
        dist._function(expr)
    except Exception as exc:  # reported when the kernel is used
        return f"{expr}: {type(exc).__name__}"
    return expr


def precompile(exprs, workers=14):
    """Compile kernels in parallel processes (they land in CuPy's disk cache), so loading them is quick."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(min(workers, max(1, len(exprs)))) as pool:
        pool.map(_compile_one, sorted(set(exprs)))


def timed(fn, reps=10, warm=2):
    for _ in range(warm):
        fn()
    cp.cuda.Device().synchronize()
    evs = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    evs[-1][1].synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(a, b) for a, b in evs]))


def machine_rates():
    a = cp.ones(1 << 29, dtype=cp.float32)
    b = cp.empty_like(a)
    ms = timed(lambda: cp.copyto(b, a), 10)
    bw = 2 * a.nbytes / (ms * 1e-3)
    del a, b
    A = cp.random.standard_normal((8192, 8192), dtype=cp.float32)
    ms = timed(lambda: A @ A, 5)
    return {"copy_bandwidth_Bps": bw, "cublas_sgemm_flops": 2 * 8192 ** 3 / (ms * 1e-3)}


def make(n, d, k, dtype, seed=0):
    rs = cp.random.RandomState(seed)
    centres = rs.standard_normal((k, d), dtype=cp.float32) * 4
    lab = rs.randint(0, k, size=n)
    X = centres[lab] + rs.standard_normal((n, d), dtype=cp.float32)
    X = X.astype(dtype)
    del lab
    C = X[rs.randint(0, n, size=k)].copy()
    return X, C


def plain_cupy_lloyd(X, C):
    k, d = C.shape
    G = X @ C.T
    D = (C * C).sum(1)[None, :] - 2 * G
    lab = D.argmin(axis=1)
    sums = cp.zeros((k, d), dtype=X.dtype)
    cp.add.at(sums, lab, X)
    counts = cp.bincount(lab, minlength=k)
    return sums, counts, lab


def check_labels(X, C, shift, lab, sample=20000):
    n = X.shape[0]
    idx = cp.asarray(np.random.RandomState(1).choice(n, min(n, sample), replace=False))
    Xs = X[idx].astype(cp.float64) - shift.astype(cp.float64)
    Cs = C.astype(cp.float64)
    D = ((Xs[:, None, :] - Cs[None, :, :]) ** 2).sum(-1) if C.shape[0] * C.shape[1] <= 65536 else \
        cp.maximum((Xs * Xs).sum(1)[:, None] + (Cs * Cs).sum(1)[None, :] - 2 * Xs @ Cs.T, 0)
    want = D.argmin(1)
    got = lab[idx].astype(cp.int64)
    bad = got != want
    # a disagreement is a near tie when the two distances agree to float rounding of the data's dtype
    eps = 1e-5 if X.dtype == cp.float32 else 1e-12
    dg, dw = cp.take_along_axis(D, got[:, None], 1)[:, 0], cp.take_along_axis(D, want[:, None], 1)[:, 0]
    near = cp.abs(dg - dw) <= eps * cp.maximum(dw, 1e-30) * 10
    return {"sample": int(idx.size), "disagree": int(bad.sum()), "disagree_not_near_tie": int((bad & ~near).sum())}


def step_inputs(n, d, k, dtype):
    """The inputs of one benchmarked Lloyd step: data, centres (raw and in shifted coordinates), the shift
    (mean of the first 10^6 rows), unit weights, labels (-1) and a distance buffer."""
    X, C0 = make(n, d, k, dtype)
    shift = X[: min(n, 10**6)].mean(0)
    return X, C0, shift, C0 - shift, cp.ones(n, dtype=dtype), cp.full(n, -1, cp.int32), cp.empty(n, dtype=dtype)


def step_floors(n, d, k, dtype):
    """The floors of one Lloyd step in ms: (reading X at HBM, 2 n k d FLOPs at the FP rate of the dtype)."""
    return (n * d * np.dtype(dtype).itemsize / HBM * 1e3, 2.0 * n * k * d / FP[np.dtype(dtype).name] * 1e3)


def bench_shape(n, d, k, dtype, rates, quick=False, sweep=False, tc_sweep=False):
    X, C0, shift, C, w, labels, mind = step_inputs(n, d, k, dtype)
    floor_bytes, floor_flops = step_floors(n, d, k, dtype)
    row = {"n": n, "d": d, "k": k, "dtype": np.dtype(dtype).name, "floor_bytes_ms": floor_bytes,
           "floor_flops_ms": floor_flops, "floor_ms": max(floor_bytes, floor_flops)}
    reps = 5 if quick else 10
    for method in METHODS:
        if method == "gemm" and quick and k < 256:
            continue                       # measured at 17-38 ms for k = 64 before: not a contender there
        if method == "small" and (k > 32 or d > 32):
            continue
        try:
            if method == "tc_mma":
                if not distances.tc_plan(dtype, k, d, accum="mma")["fused"]:
                    continue                   # the same kernels as "tc" there
                out = cp.zeros(k * d + k + 2)

                def step():
                    out[:] = 0
                    distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, accum="mma")
                row["lloyd_tc_mma_ms"] = timed(step, reps)
                continue
            # the small kernel takes its centres from the host, as KMeans gives them (its parameters)
            Cm = C.get() if method == "small" else C
            ms = timed(lambda: distances.lloyd_step_packed(X, Cm, None, shift=shift, labels=labels,
                                                           method=method), reps)
            row[f"lloyd_{method}_ms"] = ms
            row[f"assign_{method}_ms"] = timed(lambda: distances.argmin_sqeuclidean(X, Cm, shift=shift,
                                                                                    method=method), reps)
        except Exception as exc:
            row[f"error_{method}"] = f"{type(exc).__name__}: {exc}"
    plan = distances.kernel_plan(dtype, k, d, mode="lloyd")
    fn = distances._function(plan["expr"])
    row["fused_plan"] = {kk: v for kk, v in plan.items() if kk != "ctype"}
    row["fused_regs"] = int(fn.num_regs)
    row["fused_local_bytes"] = int(fn.local_size_bytes)
    tplan = distances.tc_plan(dtype, k, d, mode="lloyd")
    tfn = distances._function(tplan["expr"])
    row["tc_plan"] = {kk: v for kk, v in tplan.items() if kk != "ctype"}
    row["tc_regs"] = int(tfn.num_regs)
    row["tc_local_bytes"] = int(tfn.local_size_bytes)
    if not tplan["fused"]:
        # the SIMT sums pass alone (labels of the step above)
        out = cp.zeros(k * d + k + 2)
        row["tc_sums_pass_ms"] = timed(lambda: distances._sums_pass(X, shift, w, labels, k, out), reps)
    row["auto_method"] = distances._method("auto", k, d, dtype, True)
    row["auto_method_assign"] = distances._method("auto", k, d, dtype, False)
    row["auto_lloyd_ms"] = row.get(f"lloyd_{row['auto_method']}_ms")
    Ca = C.get() if row["auto_method"] == "small" else C
    row["lloyd_weighted_ms"] = timed(lambda: distances.lloyd_step_packed(X, Ca, w, shift=shift, labels=labels,
                                                                         mind=mind), reps)
    row["auto_assign_ms"] = row.get(f"assign_{row['auto_method_assign']}_ms")
    row["assign_ms"] = min(v for kk, v in row.items() if kk.startswith("assign_") and kk.endswith("_ms"))
    packed = distances.lloyd_step_packed(X, C, w, shift=shift, labels=labels, mind=mind)
    row["labels_check"] = check_labels(X, C, shift, labels)
    # inertia against a float64 recomputation from the kernel's labels
    Xs = X.astype(cp.float64) - shift.astype(cp.float64) if n * d * 8 < 6e9 else None
    if Xs is not None:
        ref = float(((Xs - C.astype(cp.float64)[labels]) ** 2).sum())
        row["inertia_rel_err"] = abs(float(packed[-2]) - ref) / ref
        ref_sums = cp.zeros((k, d), cp.float64)
        cp.add.at(ref_sums, labels, Xs)
        got = packed[:k * d].reshape(k, d)
        row["sums_rel_err"] = float(cp.abs(got - ref_sums).max() / cp.abs(ref_sums).max())
        del Xs, ref_sums
    if sweep or tc_sweep:
        row["tc_sweep"] = []
        for tile in TC_SWEEP.get((n, d, k, np.dtype(dtype).name), []):
            try:
                out = cp.zeros(k * d + k + 2)

                def step():
                    out[:] = 0
                    distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile)
                ms = timed(step, reps)
                tp = distances.tc_plan(dtype, k, d, mode="lloyd", tile=tile)
                row["tc_sweep"].append({"tile": tp["expr"], "lloyd_ms": ms,
                                        "regs": int(distances._function(tp["expr"]).num_regs), "smem": tp["smem"]})
            except Exception as exc:
                row["tc_sweep"].append({"tile": str(tile), "error": f"{type(exc).__name__}: {exc}"})
    if sweep:
        row["sweep"] = []
        for tile in [None] + SWEEP.get((n, d, k, np.dtype(dtype).name), []):
            try:
                ms = timed(lambda: distances.lloyd_step_packed(X, C, w, shift=shift, labels=labels, mind=mind,
                                                               tile=tile, method="fused"), reps)
                ms_a = timed(lambda: distances.argmin_sqeuclidean(X, C, shift=shift, tile=tile, method="fused"), reps)
                plan = distances.kernel_plan(dtype, k, d, mode="lloyd", tile=tile)
                fn = distances._function(plan["expr"])
                row["sweep"].append({"tile": plan["expr"], "lloyd_ms": ms, "assign_ms": ms_a,
                                     "regs": int(fn.num_regs), "local_bytes": int(fn.local_size_bytes),
                                     "groups": plan["groups"], "smem": plan["smem"]})
            except Exception as exc:
                row["sweep"].append({"tile": str(tile), "error": f"{type(exc).__name__}: {exc}"})
    try:
        row["plain_cupy_ms"] = timed(lambda: plain_cupy_lloyd(X, C0), 3 if quick else 5, 1)
    except cp.cuda.memory.OutOfMemoryError:
        row["plain_cupy_ms"] = None
    best = min(v for kk, v in row.items() if kk.startswith("lloyd_") and kk.endswith("_ms")
               and kk != "lloyd_weighted_ms")
    row["best_lloyd_ms"] = best
    row["best_method"] = [m for m in METHODS if row.get(f"lloyd_{m}_ms") == best][0]
    row["ratio_to_floor"] = best / row["floor_ms"]
    row["speedup_vs_plain_cupy"] = (row["plain_cupy_ms"] / best) if row["plain_cupy_ms"] else None
    row["achieved_tflops"] = 2.0 * n * k * d / (best * 1e-3) / 1e12
    del X, C, C0, w, labels, mind
    cp.get_default_memory_pool().free_all_blocks()
    return row


def bench_fit(n, d, k, dtype, iters=20, method="auto"):
    """Whole KMeans fit on one GPU (k-means|| init, n_init=1, 20 iterations), init timed apart.

    ``method``: the distance kernels (``MPIML_DISTANCES_METHOD``); ``"fused"`` is the SIMT path that
    was the default before the tensor-core kernels."""
    from mpiml.cluster import KMeans
    from mpiml.cluster import _kmeans_init

    os.environ["MPIML_DISTANCES_METHOD"] = method
    X, _ = make(n, d, k, dtype, seed=3)
    t_init = []
    orig = _kmeans_init.init_centers

    def timed_init(*a, **kw):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = orig(*a, **kw)
        cp.cuda.Device().synchronize()
        t_init.append(time.perf_counter() - t0)
        return out

    import mpiml.cluster._kmeans as km_mod
    km_mod.init_centers = timed_init
    try:
        KMeans(k, n_init=1, max_iter=2, tol=0.0, random_state=0).fit(X[:200000])   # warm-up (compile)
        t_init.clear()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        km = KMeans(k, n_init=1, max_iter=iters, tol=0.0, random_state=0).fit(X)
        cp.cuda.Device().synchronize()
        fit_s = time.perf_counter() - t0
    finally:
        km_mod.init_centers = orig
        os.environ.pop("MPIML_DISTANCES_METHOD", None)
    it = np.asarray(km._iter_seconds[1:])
    res = {"n": n, "d": d, "k": k, "dtype": np.dtype(dtype).name, "method": method, "fit_s": fit_s,
           "init_s": t_init[0], "n_iter": int(km.n_iter_), "iter_ms_median": float(np.median(it) * 1e3),
           "inertia": km.inertia_}
    del X
    cp.get_default_memory_pool().free_all_blocks()
    return res


def sklearn_fit(n_sub, n, d, k, iters=20):
    """scikit-learn on all host cores, on ``n_sub`` rows of the same kind of data: its k-means++
    initialisation (``kmeans_plusplus``) and Lloyd iterations (``KMeans(init=array, n_init=1,
    max_iter=iters, tol=0)``) timed apart, the time per iteration from the iterations it ran; the
    whole fit of ``iters`` iterations scaled linearly to ``n`` rows."""
    import sklearn
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.cluster import kmeans_plusplus

    rs = np.random.RandomState(3)
    centres = rs.standard_normal((k, d)).astype(np.float32) * 4
    X = centres[rs.randint(0, k, n_sub)] + rs.standard_normal((n_sub, d)).astype(np.float32)
    t0 = time.perf_counter()
    init, _ = kmeans_plusplus(X, k, random_state=0)
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sk = SkKMeans(k, init=init, n_init=1, max_iter=iters, tol=0.0, algorithm="lloyd").fit(X)
    lloyd_s = time.perf_counter() - t0
    per_iter = lloyd_s / max(1, int(sk.n_iter_))
    fit_sub = init_s + iters * per_iter
    return {"n_sub": n_sub, "n_scaled_to": n, "init_s_sub": init_s, "lloyd_s_sub": lloyd_s, "n_iter": int(sk.n_iter_),
            "iter_ms_sub": per_iter * 1e3, "fit_s_sub_20_iters": fit_sub, "fit_s_scaled": fit_sub * n / n_sub,
            "iter_ms_scaled": per_iter * 1e3 * n / n_sub, "cores": os.cpu_count(), "sklearn": sklearn.__version__}


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['n']:.0e}x{r['d']}\nk={r['k']} {r['dtype'][-2:]}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(1.6 * len(rows) + 3, 4.2))
    ax.bar(x - 0.3, [r["floor_ms"] for r in rows], 0.2, label="floor", color="k")
    ax.bar(x - 0.1, [r["best_lloyd_ms"] for r in rows], 0.2, label="mpiml Lloyd step (best kernel)")
    ax.bar(x + 0.1, [r["assign_ms"] for r in rows], 0.2, label="mpiml arg-min only")
    ax.bar(x + 0.3, [r["plain_cupy_ms"] or 0 for r in rows], 0.2, label="plain CuPy Lloyd")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per Lloyd step (one GPU)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    out = argv[0]
    quick = "--quick" in argv
    sweep = "--sweep" in argv
    no_fit = "--no-fit" in argv
    tc_sweep = "--tc-sweep" in argv
    os.makedirs(out, exist_ok=True)
    props = cp.cuda.runtime.getDeviceProperties(0)
    result = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "command": "python benchmarks/ml/kernels_bench.py " + " ".join(argv),
              "cupy": cp.__version__, "rates": machine_rates(), "rows": [], "fits": []}
    print(f"device {result['device']}: copy {result['rates']['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, "
          f"cuBLAS SGEMM {result['rates']['cublas_sgemm_flops'] / 1e12:.1f} TFLOP/s", flush=True)
    todo = [(n, d, k, np.float32) for n, d, k in SHAPES] + [(10**7, 64, 64, np.float64), (10**7, 16, 16, np.float64)]
    if not quick or "--all-shapes" in argv:
        todo += [(10**6, 256, 1024, np.float64), (2 * 10**6, 1024, 64, np.float64)]
    exprs = ["mpiml_distances_reduce_partials"]
    for n, d, k, dt in todo:
        tiles = [None] + (SWEEP.get((n, d, k, np.dtype(dt).name), []) if sweep else [])
        for tile in tiles:
            for mode, accum in (("lloyd", None), ("assign", None)):
                try:
                    exprs.append(distances.kernel_plan(dt, k, d, mode=mode, accum=accum, tile=tile)["expr"])
                except ValueError:
                    pass
        exprs.append(f"mpiml_distances_label_sums<{distances._CTYPE[np.dtype(dt)]}, double>")
        exprs.append(f"mpiml_distances_label_sums<{distances._CTYPE[np.dtype(dt)]}, float>")
        exprs.append(f"mpiml_distances_argmin_gemm<{distances._CTYPE[np.dtype(dt)]}>")
        for tile in [None] + (TC_SWEEP.get((n, d, k, np.dtype(dt).name), []) if sweep or tc_sweep else []):
            for mode, accum in (("lloyd", None), ("lloyd", "smem"), ("lloyd", "mma"), ("assign", None)):
                try:
                    tp = distances.tc_plan(dt, k, d, mode=mode, tile=tile, accum=accum)
                    exprs += [tp["expr"], tp["pack"]]
                except ValueError:
                    pass
        exprs.append(distances.sums_plan(dt, k, d)["expr"])
        if k <= 32 and d <= 32:
            for m in ("assign", "lloyd"):
                for u in (False, True):
                    sp = distances.small_plan(dt, k, d, mode=m, unit=u)
                    exprs += [sp["expr"]] + ([sp["expr_cm"]] if "expr_cm" in sp else [])
        exprs.append(f"mpiml_lloyd_update<{distances._CTYPE[np.dtype(dt)]}>")
        exprs.append(distances.sums_plan(dt, k, d, kind="mma")["expr"])
    for kk in (16, 32, 64):               # the k-means|| candidate sets of the fit
        exprs.append(distances.tc_plan(np.float32, kk, 64, mode="assign")["expr"])
        exprs.append(distances.kernel_plan(np.float32, kk, 64, mode="assign")["expr"])
    t0 = time.perf_counter()
    precompile(exprs)
    print(f"compiled {len(set(exprs))} kernels in {time.perf_counter() - t0:.1f} s", flush=True)
    for n, d, k, dt in todo:
        try:
            r = bench_shape(n, d, k, dt, result["rates"], quick, sweep, tc_sweep)
        except Exception as exc:  # keep the others
            r = {"n": n, "d": d, "k": k, "dtype": np.dtype(dt).name, "error": f"{type(exc).__name__}: {exc}"}
        result["rows"].append(r)
        print(json.dumps(r), flush=True)
        with open(os.path.join(out, "kernels_bench.json"), "w") as f:
            json.dump(result, f, indent=1)
    for method in ([] if no_fit else ["auto", "fused"]):
        try:
            result["fits"].append(bench_fit(10**7, 64, 64, np.float32, method=method))
        except Exception as exc:
            result["fits"].append({"method": method, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(result["fits"][-1]), flush=True)
        with open(os.path.join(out, "kernels_bench.json"), "w") as f:
            json.dump(result, f, indent=1)
    if not no_fit:
        try:
            result["sklearn_fit"] = sklearn_fit(10**6, 10**7, 64, 64)
        except Exception as exc:
            result["sklearn_fit"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result["sklearn_fit"]), flush=True)
    with open(os.path.join(out, "kernels_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    ok = [r for r in result["rows"] if "error" not in r]
    plot(ok, os.path.join(out, "kernels_bench.png"))
    print(f"\n{'shape':<22}{'dtype':>8}{'floor':>8}{'tc':>8}{'small':>8}{'fused':>8}{'gemm':>8}{'argmin':>8}{'cupy':>8}"
          f"{'x floor':>8}{'TF/s':>7}{'bad lab':>8}")
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['n']:.0e}x{r['d']} k={r['k']} {r['dtype']}: {r['error']}")
            continue
        nan = float("nan")
        print(f"{r['n']:.0e}x{r['d']} k={r['k']:<6}{r['dtype']:>8}{r['floor_ms']:>8.3f}{r.get('lloyd_tc_ms', nan):>8.3f}"
              f"{r.get('lloyd_small_ms', nan):>8.3f}{r.get('lloyd_fused_ms', nan):>8.3f}"
              f"{r.get('lloyd_gemm_ms', nan):>8.3f}{r['assign_ms']:>8.3f}"
              f"{(r['plain_cupy_ms'] or float('nan')):>8.2f}"
              f"{r['ratio_to_floor']:>8.2f}{r['achieved_tflops']:>7.1f}{r['labels_check']['disagree_not_near_tie']:>8}")
        for v in r.get("tc_sweep", []):
            print("    " + (f"{v['tile']}: lloyd {v['lloyd_ms']:.3f} ms, regs {v['regs']}, smem {v['smem']}"
                           if "error" not in v else f"{v['tile']}: {v['error']}"))
        for v in r.get("sweep", []):
            print("    " + (f"{v['tile']}: lloyd {v['lloyd_ms']:.3f} ms, assign {v['assign_ms']:.3f} ms, regs {v['regs']}, "
                           f"local {v['local_bytes']}, groups {v['groups']}" if "error" not in v else f"{v['tile']}: {v['error']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
