"""Where a global random-forest fit spends its time on one GPU: cProfile of the grower, cold and warm.

Fits ``RandomForestClassifier(training="global")`` four times on the same GPU rows
(the first fit compiles CuPy's and mpiml's kernels through NVRTC unless they
sit in CuPy's disk cache; the second is the steady state; the third searches
splits with whole-array CuPy operations, ``MPIML_RF_SPLIT_KERNEL=0``, as before
the split kernel; the fourth repeats the second) and writes, per fit,
the grower's phase times (``_fit_stats``: histograms, split search, row
partition, bins; each phase synchronises the stream, so they include GPU time)
and the 30 functions with the largest cumulative and own time.

Usage: python3 rf_profile.py OUTFILE.json [ROWS TREES DEPTH [MAX_FEATURES]]
(run with PYTHONPATH pointing at the ``src`` to profile).
"""

import cProfile
import io
import json
import os
import pstats
import sys
import time

import cupy as cp
import numpy as np

from mpiml.datasets import make_classification
from mpiml.ensemble import RandomForestClassifier


def main():
    out = sys.argv[1]
    rows = int(float(sys.argv[2])) if len(sys.argv) > 2 else 10 ** 6
    trees = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    depth = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    mf = sys.argv[5] if len(sys.argv) > 5 else "sqrt"
    mf = None if mf == "none" else mf
    X, y = make_classification(rows, 32, n_informative=16, n_redundant=2, n_classes=2, random_state=0,
                               device="gpu", dtype=np.float32)
    cp.cuda.Device().synchronize()
    result = {"rows": rows, "trees": trees, "depth": depth, "max_features": mf, "fits": []}
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
        stats = {k: (float(v) if isinstance(v, (int, float, np.floating)) else v) for k, v in rf._fit_stats.items()}
        fitted[label] = (cp.asnumpy(rf.tree_feature_), cp.asnumpy(rf.tree_threshold_))
        result["fits"].append({"fit": label, "fit_s": fit_s, "nodes": int(rf.tree_feature_.shape[0]),
                               "stats": stats, "profile": text})
        print(f"{label}: fit {fit_s:.2f} s, nodes {int(rf.tree_feature_.shape[0])}, stats {stats}", flush=True)
        print(text["cumulative"][:6000], flush=True)
    a, b = fitted["warm"], fitted["warm, array split search"]
    result["same_trees_split_kernel_vs_array"] = bool(all(np.array_equal(x, y) for x, y in zip(a, b)))
    print(f"same trees with the split kernel and the array search: {result['same_trees_split_kernel_vs_array']}")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
