"""``mpiml bench ml --algo rf``: random-forest training at 1, 2, 4, ... ranks against scikit-learn.

The driver (a plain process) launches one MPI job of ``max(--ranks)`` ranks;
inside it, sub-communicators of 1, 2, 4, ... ranks (``split``; the world itself at every rank) draw the same
global data set (``mpiml.datasets.make_classification`` for the classifier,
``make_regression`` for the regressor: the rows do not depend on the rank
count) and fit :class:`mpiml.ensemble.RandomForestClassifier` and
:class:`~mpiml.ensemble.RandomForestRegressor` (``--estimators``; training
``"global"`` by default, ``--training global,local`` adds cuML-style local
training), inside :func:`mpiml.profile`, each after a small warm-up fit of the
same configuration (the first fit of a process compiles CuPy's and mpiml's
kernels; ``--no-warmup`` times it instead).  Per configuration it records the
fit time (slowest rank), the histogram, split-search, partition and bin times,
the allreduce time and bytes per tree and per level (from the profile: the
level count is the grower's), and the accuracy / R^2 on a held-out set.  On one
rank the same forest is also fitted on scikit-learn's subsample, so the
quality comparison uses the same rows.  The driver then fits scikit-learn's
forest with ``n_jobs=-1`` on every host core, on a subsample of the rows (its
time scaled linearly to the full size, which flatters scikit-learn, whose cost
grows like ``n log n``), and writes one JSON file and one PNG plot.

Defaults on a GPU host: 4e7 x 32 global float32 rows, 100 trees, depth 12, each
estimator's own ``max_features`` (``sqrt`` for the classifier, every feature for
the regressor), ranks 1, 2, 4 up to the GPUs present.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ._common import machine_info, stamp, write_result

__all__ = ["main"]


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml --algo rf", description="Random forest training: mpiml "
                                "global vs local training on 1..N ranks, against scikit-learn on the host cores.")
    p.add_argument("--algo", choices=("rf",), default="rf")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4 up to the GPUs, "
                   "1,2 on CPU)")
    p.add_argument("--estimators", default="classifier,regressor", help="comma-separated: classifier, regressor")
    p.add_argument("--rows", type=float, default=None, help="global training rows (default 4e7 on GPU, 2e4 on CPU)")
    p.add_argument("--test-rows", type=float, default=None, help="held-out rows (default rows / 10, at most 1e6)")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--trees", type=int, default=None, help="trees (default 100 on GPU, 10 on CPU)")
    p.add_argument("--depth", type=lambda t: None if t.lower() == "none" else int(t), default=12,
                   help="max_depth (none: unlimited, scikit-learn's default)")
    p.add_argument("--max-bins", type=int, default=256)
    p.add_argument("--max-features", default="default", help="default (each estimator's: sqrt for the classifier, "
                   "1.0 for the regressor, as scikit-learn), sqrt, log2, none, an int or a fraction")
    p.add_argument("--no-warmup", action="store_true", help="time the first fit too (it compiles the GPU kernels)")
    p.add_argument("--training", default="global", help="comma-separated: global, local")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--sklearn-rows", type=float, default=None, help="rows of scikit-learn's subsample (default "
                   "1e5 on GPU hosts, all rows on CPU)")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--out", default="benchmarks/results", help="directory of the JSON and PNG, or the JSON's path "
                   "(ending in .json; the PNG beside it)")
    p.add_argument("--tag", default=None, help="file name part (default gpu or cpu)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def _max_features(text, estimator):
    text = str(text).lower()
    if text == "default":
        return "sqrt" if estimator == "classifier" else 1.0
    if text in ("sqrt", "log2"):
        return text
    if text == "none":
        return None
    return float(text) if "." in text else int(text)


def _data(args, comm, device, estimator):
    """This rank's training and held-out rows: global rows ``[0, rows)`` train, the rest are held out."""
    from ..datasets import make_classification, make_regression, shard_bounds

    n = int(args.rows) + int(args.test_rows)
    if estimator == "classifier":
        X, y = make_classification(n, args.features, n_informative=max(2, args.features // 2),
                                   n_redundant=min(2, args.features // 4), n_classes=args.classes, random_state=0,
                                   comm=comm, device=device, dtype=np.dtype(args.dtype))
    else:
        X, y = make_regression(n, args.features, n_informative=max(2, args.features // 2), noise=10.0, random_state=0,
                               comm=comm, device=device, dtype=np.dtype(args.dtype))
    start, _ = shard_bounds(n, comm.size, comm.rank)
    cut = min(max(int(args.rows) - start, 0), X.shape[0])
    return X[:cut], y[:cut], X[cut:], y[cut:]


# ---------------------------------------------------------------------- the MPI worker
def _estimator(name):
    from ..ensemble import RandomForestClassifier, RandomForestRegressor

    return RandomForestClassifier if name == "classifier" else RandomForestRegressor


def _fit_one(args, est, training, X, y, Xt, yt, sub):
    """Warm-up, then the timed fit of one configuration; this rank's numbers."""
    import mpiml

    cls = _estimator(est)
    kw = dict(max_depth=args.depth, max_bins=args.max_bins, max_features=_max_features(args.max_features, est),
              training=training, random_state=0, comm=sub)
    warm_s = 0.0
    if not args.no_warmup:
        # a small fit first: CuPy and the histogram kernels compile on first use (NVRTC)
        n_warm = min(X.shape[0], 20000)
        sub.barrier()
        t0 = time.perf_counter()
        cls(2, **kw).fit(X[:n_warm], y[:n_warm])
        warm_s = time.perf_counter() - t0
    rf = cls(args.trees, **kw)
    sub.barrier()
    t0 = time.perf_counter()
    with mpiml.profile() as prof:
        rf.fit(X, y)
    fit_s = time.perf_counter() - t0
    return rf, fit_s, warm_s, prof.summary(), rf.score(Xt, yt)


def _worker(args, outfile):
    from ..comm import get_comm

    world = get_comm()
    use_gpu = args.device == "gpu"
    if use_gpu:
        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    device = "gpu" if use_gpu else "cpu"
    runs, sklearn = [], []
    for est in args.estimators.split(","):
        for R in [int(r) for r in args.ranks.split(",")]:
            # every rank: the world itself (what a user's fit gets); fewer: a sub-communicator
            sub = world if R == world.size else world.split(0 if world.rank < R else None, key=world.rank)
            if sub is not None:
                X, y, Xt, yt = _data(args, sub, device, est)
                for training in args.training.split(","):
                    rf, fit_s, warm_s, summary, score = _fit_one(args, est, training, X, y, Xt, yt, sub)
                    st = rf._fit_stats
                    mine = np.array([fit_s, st.get("hist_s", 0.0), st.get("allreduce_s", 0.0), st.get("split_s", 0.0),
                                     st.get("route_s", 0.0), st.get("bins_s", 0.0), st.get("reduce_scatter_s", 0.0),
                                     st.get("allgather_s", 0.0), st.get("wait_s", 0.0), st.get("elements_s", 0.0),
                                     st.get("orders_s", 0.0), st.get("record_s", 0.0), st.get("grow_s", 0.0)])
                    worst = sub.allreduce(mine, op="max") if sub.size > 1 else mine
                    least = sub.allreduce(mine, op="min") if sub.size > 1 else mine
                    level_ops = {op: summary["ops"][op] for op in ("allreduce", "reduce_scatter", "allgather")
                                 if op in summary["ops"]}
                    ar = summary["ops"].get("allreduce", {"calls": 0, "bytes": 0, "seconds": 0.0})
                    ag = summary["ops"].get("allgatherv", {"calls": 0, "bytes": 0, "seconds": 0.0})
                    same_rows = None
                    if R == 1 and training == "global" and args.sklearn_rows < args.rows:
                        # the quality of this forest on scikit-learn's subsample (the same rows, the same held-out set)
                        n_sub = int(args.sklearn_rows)
                        cls = _estimator(est)
                        small = cls(args.trees, max_depth=args.depth, max_bins=args.max_bins, random_state=0,
                                    max_features=_max_features(args.max_features, est), comm=sub).fit(X[:n_sub],
                                                                                                     y[:n_sub])
                        same_rows = small.score(Xt, yt)
                    if sub.rank == 0:
                        T, levels = args.trees, max(int(st.get("levels") or 0), 1)
                        row = {"estimator": est, "ranks": R, "training": training, "n_total": int(args.rows),
                               "fit_s": float(worst[0]), "hist_s": float(worst[1]), "allreduce_s": float(worst[2]),
                               "split_s": float(worst[3]), "route_s": float(worst[4]), "bins_s": float(worst[5]),
                               "score": score, "score_name": "accuracy" if est == "classifier" else "r2",
                               "score_on_sklearn_rows": same_rows,
                               "levels": st.get("levels"), "nodes": int(rf.tree_feature_.shape[0]),
                               "allreduce_calls": ar["calls"], "allreduce_bytes": ar["bytes"],
                               "allreduce_bytes_per_tree": ar["bytes"] / T,
                               "allreduce_ms_per_tree": 1e3 * ar["seconds"] / T,
                               "allreduce_bytes_per_level": ar["bytes"] / levels,
                               "allreduce_ms_per_level": 1e3 * ar["seconds"] / levels,
                               "hist_ms_per_tree": 1e3 * float(worst[1]) / T,
                               "allgatherv_bytes": ag["bytes"], "comm_seconds": summary["total_seconds"],
                               "warmup_fit_s": warm_s, "hist_elements": st.get("hist_elements"),
                               "hist_nodes_built": st.get("hist_nodes_built"),
                               "hist_nodes_derived": st.get("hist_nodes_derived"),
                               "route_ms_per_tree": 1e3 * float(worst[4]) / T,
                               "split_ms_per_tree": 1e3 * float(worst[3]) / T,
                               # the level's collectives (allreduce, or reduce-scatter + allreduce of the node
                               # totals + allgather of the split candidates), slowest and fastest rank
                               "reduce_scatter_s": float(worst[6]), "allgather_s": float(worst[7]),
                               "level_collectives_ms_per_level": 1e3 * float(worst[2] + worst[6] + worst[7]) / levels,
                               "level_collectives_ms_per_level_fastest_rank":
                                   1e3 * float(least[2] + least[6] + least[7]) / levels,
                               "reduce_scatter_bytes": st.get("reduce_scatter_bytes", 0),
                               "allgather_bytes": st.get("allgather_bytes", 0),
                               "level_bytes_per_level": (st.get("allreduce_bytes", 0) + st.get("reduce_scatter_bytes", 0)
                                                         + st.get("allgather_bytes", 0)) / levels,
                               # MPIML_RF_LEVEL_PROFILE=1: time spent waiting for the slowest rank before them
                               "skew_wait_s": float(worst[8]),
                               # per batch: the bootstrap draws and root elements; per level: the feature orders
                               # and the host records of the nodes
                               "elements_s": float(worst[9]), "orders_s": float(worst[10]),
                               "record_s": float(worst[11]),
                               # the grower's whole time (the rest of fit_s: checks, bins, the trees' arrays)
                               "grow_s": float(worst[12]),
                               "collective_paths": {op: o["paths"] for op, o in level_ops.items()},
                               "collective_seconds": {op: o["seconds"] for op, o in level_ops.items()},
                               "scatter": bool(st.get("reduce_scatter_calls", 0))}
                        runs.append(row)
                        print(f"{est} ranks={R} {training}: fit {row['fit_s']:.2f} s, {row['score_name']} {score:.4f}, "
                              f"per tree: hist {row['hist_ms_per_tree']:.1f} ms, split {row['split_ms_per_tree']:.1f} ms"
                              f", allreduce {row['allreduce_ms_per_tree']:.1f} ms "
                              f"({row['allreduce_bytes_per_tree'] / 2**20:.2f} MiB); per level: allreduce "
                              f"{row['allreduce_ms_per_level']:.2f} ms ({row['allreduce_bytes_per_level'] / 2**20:.2f} "
                              f"MiB), level collectives {row['level_collectives_ms_per_level']:.2f} ms (fastest rank "
                              f"{row['level_collectives_ms_per_level_fastest_rank']:.2f}; "
                              f"{row['level_bytes_per_level'] / 2**20:.2f} MiB), skew wait {row['skew_wait_s']:.3f} s, "
                              f"paths {row['collective_paths']}; phases (s): grow {row['grow_s']:.2f}, hist "
                              f"{row['hist_s']:.2f}, route {row['route_s']:.2f}, split {row['split_s']:.2f}, "
                              f"collectives {row['allreduce_s'] + row['reduce_scatter_s'] + row['allgather_s']:.2f}, "
                              f"elements {row['elements_s']:.2f}, orders {row['orders_s']:.2f}, records "
                              f"{row['record_s']:.2f}, bins {row['bins_s']:.2f}", flush=True)
                    del rf
                if R == 1 and sub.rank == 0 and not args.no_sklearn:
                    # the peer on this host's cores (the other ranks wait at the barrier below)
                    sk = _sklearn_baseline(args, est, X, y, Xt, yt)
                    sklearn.append(sk)
                    print(f"scikit-learn {est} ({sk['cores']} cores, {sk['rows']} rows): {sk['fit_s']:.2f} s, scaled "
                          f"{sk['scaled_fit_s']:.1f} s, {sk['score_name']} {sk['score']:.4f}", flush=True)
                del X, y, Xt, yt
                if use_gpu:
                    import cupy

                    cupy.get_default_memory_pool().free_all_blocks()
            world.barrier()
    if world.rank == 0:
        with open(outfile, "w") as f:
            json.dump({"runs": runs, "sklearn": sklearn}, f)
    return 0


# ---------------------------------------------------------------------- the driver
def _sklearn_baseline(args, est, X, y, Xt, yt):
    """scikit-learn's forest with ``n_jobs=-1`` on the first ``--sklearn-rows`` rows (host copies), scaled."""
    from sklearn.ensemble import RandomForestClassifier as SkClassifier
    from sklearn.ensemble import RandomForestRegressor as SkRegressor

    from .._array import to_numpy

    n_sub = int(min(args.sklearn_rows, args.rows))
    X, y, Xt, yt = (to_numpy(a) for a in (X[:n_sub], y[:n_sub], Xt, yt))
    cls = SkClassifier if est == "classifier" else SkRegressor
    rf = cls(args.trees, max_depth=args.depth, max_features=_max_features(args.max_features, est), n_jobs=-1,
             random_state=0)
    t0 = time.perf_counter()
    rf.fit(X, y)
    fit_s = time.perf_counter() - t0
    return {"estimator": est, "rows": n_sub, "fit_s": fit_s, "scaled_fit_s": fit_s * args.rows / n_sub,
            "cores": os.cpu_count(), "score": float(rf.score(Xt, yt)),
            "score_name": "accuracy" if est == "classifier" else "r2"}


def _sklearn_for(result, est):
    return next((sk for sk in result.get("sklearn", []) if sk["estimator"] == est), None)


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ests = sorted({r["estimator"] for r in result["runs"]}) or ["classifier"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    ranks = sorted({r["ranks"] for r in result["runs"]}) or [1]
    for est, color in zip(ests, ("C0", "C1")):
        for training, marker in (("global", "o-"), ("local", "s:")):
            runs = [r for r in result["runs"] if r["training"] == training and r["estimator"] == est]
            if runs:
                ax.plot([r["ranks"] for r in runs], [r["fit_s"] for r in runs], marker, color=color,
                        label=f"mpiml {est} ({training})")
        sk = _sklearn_for(result, est)
        if sk:
            ax.plot(ranks, [sk["scaled_fit_s"]] * len(ranks), "--", color=color,
                    label=f"scikit-learn {est}, {sk['cores']} cores (scaled)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(r) for r in ranks])
    ax.set_xlabel("ranks (" + ("GPUs" if result["device"] == "gpu" else "CPU processes") + ")")
    ax.set_ylabel("training time (s)")
    ax.set_title(f"n={result['rows']:.3g}, d={result['features']}, {result['trees']} trees, depth {result['depth']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    runs = [r for r in result["runs"] if r["training"] == "global"]
    if runs:
        x = np.arange(len(runs))
        ax.bar(x - 0.3, [r["hist_ms_per_tree"] for r in runs], 0.2, label="histograms")
        ax.bar(x - 0.1, [r["split_ms_per_tree"] for r in runs], 0.2, label="split search")
        ax.bar(x + 0.1, [r["route_ms_per_tree"] for r in runs], 0.2, label="partition")
        ax.bar(x + 0.3, [1e3 * (r["allreduce_s"] + r.get("reduce_scatter_s", 0.0) + r.get("allgather_s", 0.0)) /
                         result["trees"] for r in runs], 0.2, label="level collectives")
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['estimator'][:3]} {r['ranks']}" for r in runs], fontsize=8)
        ax.set_xlabel("estimator, ranks (global training)")
        ax.set_ylabel("ms per tree (slowest rank)")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_table(result):
    print(f"\n{'estimator':<11}{'training':<9}{'ranks':>6}{'fit s':>9}{'1->R':>7}{'score':>9}{'hist ms/t':>11}"
          f"{'split ms/t':>11}{'coll ms/lvl':>14}{'MiB/lvl':>9}{'vs sklearn':>12}")
    for r in result["runs"]:
        sk = _sklearn_for(result, r["estimator"])
        one = next((q["fit_s"] for q in result["runs"] if q["estimator"] == r["estimator"] and q["ranks"] == 1
                    and q["training"] == r["training"]), None)
        speed = f"{sk['scaled_fit_s'] / r['fit_s']:.1f}x" if sk else "-"
        scaling = f"{one / r['fit_s']:.2f}" if one else "-"
        print(f"{r['estimator']:<11}{r['training']:<9}{r['ranks']:>6}{r['fit_s']:>9.2f}{scaling:>7}{r['score']:>9.4f}"
              f"{r['hist_ms_per_tree']:>11.1f}{r['split_ms_per_tree']:>11.1f}"
              f"{r.get('level_collectives_ms_per_level', r['allreduce_ms_per_level']):>14.2f}"
              f"{r.get('level_bytes_per_level', r['allreduce_bytes_per_level']) / 2**20:>9.2f}{speed:>12}")
    for sk in result.get("sklearn", []):
        same = next((r["score_on_sklearn_rows"] for r in result["runs"] if r["estimator"] == sk["estimator"]
                     and r.get("score_on_sklearn_rows") is not None), None)
        extra = f" (mpiml on the same rows: {same:.4f})" if same is not None else ""
        print(f"scikit-learn {sk['estimator']} ({sk['cores']} cores, {sk['rows']} rows): {sk['fit_s']:.2f} s, scaled "
              f"to the full size {sk['scaled_fit_s']:.2f} s, {sk['score_name']} {sk['score']:.4f}{extra}")


def main(argv):
    """Entry point of ``mpiml bench ml --algo rf``; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args, args.worker)
    from ._common import bench_launch_check

    status, ngpu = bench_launch_check(args.device)
    if status is not None:
        return status
    from ..cli._options import mpiexec_command

    device = "gpu" if ngpu else "cpu"
    if args.ranks is None:
        args.ranks = ",".join(str(r) for r in (1, 2, 4, 8) if r <= ngpu) if ngpu else "1,2"
    ranks = [int(r) for r in args.ranks.split(",")]
    args.rows = args.rows or (4e7 if ngpu else 2e4)
    args.test_rows = args.test_rows or min(1e6, max(args.rows / 10, 1000))
    args.trees = args.trees or (100 if ngpu else 10)
    args.sklearn_rows = args.sklearn_rows or (1e5 if ngpu else args.rows)
    tag = args.tag or device
    out_dir = os.path.dirname(args.out) if args.out.endswith(".json") else args.out
    os.makedirs(out_dir or ".", exist_ok=True)
    common = ["--algo", "rf", "--device", device, "--ranks", args.ranks, "--rows", str(args.rows), "--test-rows",
              str(args.test_rows), "--features", str(args.features), "--classes", str(args.classes), "--trees",
              str(args.trees), "--depth", str(args.depth), "--max-bins", str(args.max_bins), "--training",
              args.training, "--dtype", args.dtype, "--max-features", str(args.max_features), "--estimators",
              args.estimators, "--sklearn-rows", str(args.sklearn_rows)]
    if args.no_sklearn:
        common.append("--no-sklearn")
    if args.no_warmup:
        common.append("--no-warmup")
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        wfile = os.path.join(tmp, "mpiml.json")
        cmd = mpiexec_command(max(ranks), [])
        cmd = cmd[:cmd.index("-m")] + ["-m", "mpiml", "bench", "ml", *common, "--worker", wfile]
        print("launching: " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd, env=env)
        if code != 0 or not os.path.exists(wfile):
            print(f"mpiml bench ml: the MPI job failed (exit {code})", file=sys.stderr)
            return 1
        with open(wfile) as f:
            result = json.load(f)
    result.update({"algo": "rf", "device": device, "dtype": args.dtype, "rows": args.rows, "features": args.features,
                   "classes": args.classes, "trees": args.trees, "depth": args.depth, "max_bins": args.max_bins,
                   "max_features": args.max_features,
                   "machine": machine_info(), **stamp(["bench", "ml", *argv])})
    base = args.out[:-len(".json")] if args.out.endswith(".json") else os.path.join(args.out, f"ml_rf_{tag}")
    write_result(base, result, _plot, _print_table)
    return 0
