"""Seed 000, Figs. 10 and 11 and its synthetic suite: each estimator's fit with the communicator's
automatic choice against every collective forced onto one path (NCCL on GPUs), its message-size
histogram, and scikit-learn on the host cores.

    python benchmarks/seeds/seed000_estimators.py --np 4 --device gpu --json benchmarks/results/seed000_4xh200.json \
        --plot benchmarks/results/seed000_4xh200.png

For every estimator it runs ``mpiml run ALGO --json`` (the main job users run) twice: with the
tuning table (``auto``) and with ``MPIML_COMM_ALGO`` forcing every collective onto ``--forced``
(default ``nccl/native`` on GPUs, ``native`` on CPUs). The first run also fits scikit-learn on the
gathered data (``--compare-sklearn``) for the throughput comparison. Figure: fit time auto vs
forced per estimator, and each estimator's message-size histogram (calls per power-of-two size).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

OPS = ("bcast", "reduce", "allreduce", "allgather", "allgatherv", "gather", "gatherv", "scatter",
       "reduce_scatter", "scan", "exscan", "alltoall")

DATA = {  # algorithm -> --data (small defaults; --scale multiplies n)
    "knn": "classification:n={n},d=32",
    "linreg": "regression:n={n},d=64",
    "logreg": "classification:n={n},d=32",
    "pca": "lowrank:n={n},d=128,rank=16",
    "tsvd": "lowrank:n={n},d=128,rank=16",
    "rf": "classification:n={n},d=32",
}
EXTRA = {"rf": ["--trees", "20", "--max-depth", "8"], "knn": ["--neighbors", "10"]}


def run_one(algo, n, args, forced, compare):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "mpiml", "run", algo, "--np", str(args.np), "--device", args.device,
               "--data", DATA[algo].format(n=n), "--json", out, *EXTRA.get(algo, [])]
        if compare:
            cmd.append("--compare-sklearn")
        env = dict(os.environ)
        if forced:
            env["MPIML_COMM_ALGO"] = ";".join(f"{op}:{forced}" for op in OPS)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
        if proc.returncode != 0:
            return {"error": (proc.stdout + proc.stderr)[-1500:], "command": " ".join(cmd)}
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--algos", default=",".join(DATA))
    ap.add_argument("--rows", type=int, default=20000, help="global rows per estimator")
    ap.add_argument("--forced", default=None, help="the single path every collective is forced onto")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    forced = args.forced or ("nccl/native" if args.device == "gpu" else "native")
    results = {}
    for algo in args.algos.split(","):
        auto = run_one(algo, args.rows, args, None, compare=True)
        pinned = run_one(algo, args.rows, args, forced, compare=False)
        results[algo] = {"auto": auto, "forced": pinned}
        if "error" in auto or "error" in pinned:
            print(f"{algo:<8} failed: {(auto.get('error') or pinned.get('error'))[-300:]}", flush=True)
            continue
        sk = auto.get("scikit_learn") or {}
        print(f"{algo:<8} fit auto {auto['fit_seconds']:.3f} s, forced {forced} {pinned['fit_seconds']:.3f} s "
              f"(forced/auto {pinned['fit_seconds'] / auto['fit_seconds']:.2f}); scikit-learn "
              f"{sk.get('fit_seconds', float('nan')):.3f} s; {auto['communication']['calls']} collective calls",
              flush=True)
    report = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "date": time.strftime("%Y-%m-%d"),
              "command": "python " + " ".join(sys.argv), "ranks": args.np, "device": args.device,
              "forced": forced, "rows": args.rows, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    ok = {a: r for a, r in results.items() if "error" not in r["auto"] and "error" not in r["forced"]}
    if args.plot and ok:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
        names = list(ok)
        xs = range(len(names))
        ax1.bar([x - 0.2 for x in xs], [ok[a]["auto"]["fit_seconds"] for a in names], 0.4, label="auto")
        ax1.bar([x + 0.2 for x in xs], [ok[a]["forced"]["fit_seconds"] for a in names], 0.4, label=forced)
        ax1.set_xticks(list(xs), names)
        ax1.set_ylabel("fit time (s)")
        ax1.set_title(f"fit, {args.np} ranks ({args.device}): auto vs every collective on {forced}")
        ax1.legend()
        for a in names:
            hist = {int(k): v for k, v in ok[a]["auto"]["communication"]["histogram"].items()}
            if hist:
                ks = sorted(hist)
                ax2.plot(ks, [hist[k] for k in ks], "o-", label=a)
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_xlabel("message size (bytes, power-of-two bucket)")
        ax2.set_ylabel("calls during fit (rank 0)")
        ax2.set_title("message-size histogram of each fit")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
