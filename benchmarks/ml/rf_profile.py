"""Where a global random-forest fit spends its time on one device, path against path, in one process.

GPU (default): fits ``RandomForestClassifier(training="global")`` four times on
the same GPU rows: cold (the first fit compiles CuPy's and mpiml's kernels
through NVRTC unless they sit in CuPy's disk cache), warm, warm with the
whole-array split search (``MPIML_RF_SPLIT_KERNEL=0``, as before the split
kernel), warm again; and records, per fit, the grower's phase times
(``_fit_stats``: histograms, split search, row partition, bins; each phase
synchronises the stream, so they include GPU time) and the 30 functions with
the largest cumulative and own time (cProfile), and whether the two split
searches grew the same trees.

CPU (``--cpu``): on host rows, the NumPy path (``MPIML_RF_CPU_KERNEL=0``: bincount
histograms, array split search), the Numba kernels (a first fit, which compiles
them unless cached, then the best of two), scikit-learn's forest with
``n_jobs=-1`` and, when importable, scikit-learn-intelex's; the same data, the
same parameters, whether the NumPy and Numba forests are the same trees.

Usage: python3 rf_profile.py OUTFILE.json [ROWS TREES DEPTH [MAX_FEATURES]] [--cpu]
(DEPTH ``none``: unlimited; run with PYTHONPATH pointing at the ``src`` to profile).
"""

import cProfile
import datetime
import io
import json
import os
import platform
import pstats
import sys
import time

import numpy as np


def _args():
    argv = [a for a in sys.argv[1:] if a != "--cpu"]
    out = argv[0]
    rows = int(float(argv[1])) if len(argv) > 1 else 10 ** 6
    trees = int(argv[2]) if len(argv) > 2 else 20
    depth = None if len(argv) > 3 and argv[3] == "none" else (int(argv[3]) if len(argv) > 3 else 10)
    mf = argv[4] if len(argv) > 4 else "sqrt"
    return out, rows, trees, depth, (None if mf == "none" else mf), "--cpu" in sys.argv


def _header(rows, trees, depth, mf, device):
    return {"rows": rows, "features": 32, "trees": trees, "depth": depth, "max_features": mf, "device": device,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python3 " + " ".join(sys.argv), "host": platform.node(), "cpus": os.cpu_count(),
            "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None, "fits": []}


def _stats(rf):
    return {k: (float(v) if isinstance(v, (int, float, np.floating)) else v) for k, v in rf._fit_stats.items()}


def gpu(out, rows, trees, depth, mf):
    import cupy as cp

    from mpiml.datasets import make_classification
    from mpiml.ensemble import RandomForestClassifier

    X, y = make_classification(rows, 32, n_informative=16, n_redundant=2, n_classes=2, random_state=0,
                               device="gpu", dtype=np.float32)
    cp.cuda.Device().synchronize()
    result = _header(rows, trees, depth, mf, cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
    fitted = {}
    for label in ("cold", "warm", "warm, array split search", "warm again"):
        # the third fit searches splits with whole-array operations instead of mpiml_hist_split (same trees)
        os.environ["MPIML_RF_SPLIT_KERNEL"] = "0" if "array" in label else "1"
        rf = RandomForestClassifier(trees, max_depth=depth, max_features=mf, random_state=0)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        rf.fit(X, y)
        cp.cuda.Device().synchronize()
        prof.disable()
        fit_s = time.perf_counter() - t0
        text = {}
        for key in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
            text[key] = buf.getvalue()
        stats = _stats(rf)
        fitted[label] = (cp.asnumpy(rf.tree_feature_), cp.asnumpy(rf.tree_threshold_))
        result["fits"].append({"fit": label, "fit_s": fit_s, "nodes": int(rf.tree_feature_.shape[0]),
                               "stats": stats, "profile": text})
        print(f"{label}: fit {fit_s:.2f} s, nodes {int(rf.tree_feature_.shape[0])}, stats {stats}", flush=True)
        print(text["cumulative"][:4000], flush=True)
    a, b = fitted["warm"], fitted["warm, array split search"]
    result["same_trees_split_kernel_vs_array"] = bool(all(np.array_equal(x, y) for x, y in zip(a, b)))
    print(f"same trees with the split kernel and the array search: {result['same_trees_split_kernel_vs_array']}")
    return result


def cpu(out, rows, trees, depth, mf):
    from sklearn.ensemble import RandomForestClassifier as SkClassifier

    from mpiml.datasets import make_classification
    from mpiml.ensemble import RandomForestClassifier

    X, y = make_classification(rows, 32, n_informative=16, n_redundant=2, n_classes=2, random_state=0,
                               dtype=np.float32)
    result = _header(rows, trees, depth, mf, "cpu")
    fitted = {}

    def run(label, make, env=None, repeat=1):
        os.environ["MPIML_RF_CPU_KERNEL"] = env or "1"
        best, est = None, None
        for _ in range(repeat):
            est = make()
            t0, c0 = time.perf_counter(), time.process_time()
            est.fit(X, y)
            wall, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            if best is None or wall < best[0]:
                best = (wall, cpu_s)
        row = {"fit": label, "fit_s": best[0], "cpu_s": best[1], "repeats": repeat}
        if hasattr(est, "_fit_stats"):
            row["stats"] = _stats(est)
            row["nodes"] = int(est.tree_feature_.shape[0])
            fitted[label] = (est.tree_feature_, est.tree_threshold_)
        else:
            row["nodes"] = int(sum(t.tree_.node_count for t in est.estimators_))
        result["fits"].append(row)
        print(f"{label}: {best[0]:.2f} s (process CPU {best[1]:.2f} s), nodes {row['nodes']}", flush=True)

    def ours():
        return RandomForestClassifier(trees, max_depth=depth, max_features=mf, random_state=0)

    run("mpiml, NumPy path", ours, env="0")
    run("mpiml, Numba kernels (first fit of the process)", ours)
    run("mpiml, Numba kernels", ours, repeat=2)
    run("scikit-learn n_jobs=-1", lambda: SkClassifier(trees, max_depth=depth, max_features=mf, n_jobs=-1,
                                                        random_state=0))
    try:
        from sklearnex.ensemble import RandomForestClassifier as ExClassifier
    except ImportError:
        print("scikit-learn-intelex is not installed: not measured")
    else:
        run("scikit-learn-intelex n_jobs=-1", lambda: ExClassifier(trees, max_depth=depth, max_features=mf,
                                                                    n_jobs=-1, random_state=0), repeat=2)
    a, b = fitted["mpiml, NumPy path"], fitted["mpiml, Numba kernels"]
    result["same_trees_numba_vs_numpy"] = bool(all(np.array_equal(x, y) for x, y in zip(a, b)))
    print(f"same trees with the Numba kernels and the NumPy path: {result['same_trees_numba_vs_numpy']}")
    return result


def main():
    out, rows, trees, depth, mf, on_cpu = _args()
    result = (cpu if on_cpu else gpu)(out, rows, trees, depth, mf)
    result["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
