"""``mpiml bench ml --algo kmeans``: time per Lloyd iteration against its floor, and against peers.

The driver (a plain process) launches one MPI job of ``max(--ranks)`` ranks;
inside it, sub-communicators of 1, 2, 4, ... ranks (``split``) run strong
scaling (a fixed global dataset) and weak scaling (fixed rows per rank) one
after the other, and rank 0 measures the machine's memory bandwidth and GEMM
rate to compute each configuration's floor::

    floor per rank = max(local shard bytes / bandwidth, 2 n_local k d / GEMM rate)

Then the driver times scikit-learn's KMeans on every CPU core (a subsample of
rows, scaled to the full size per iteration) and, when ``heat`` is importable,
Heat's KMeans on the same ranks and data; everything lands in one JSON file and
one PNG plot.
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
from ._common import measure_rates as _measure_rates

__all__ = ["main"]


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml", description="ML benchmark: KMeans time per Lloyd iteration "
                                "vs its floor, strong and weak scaling, scikit-learn and Heat.")
    p.add_argument("--algo", choices=("kmeans", "linreg", "logreg", "ridge", "tsvd", "rf", "knn"), default="kmeans",
                   help="linreg / logreg / ridge / tsvd: see mpiml.bench.ml_linear; rf: see mpiml.bench.ml_rf; "
                   "knn: see mpiml.bench.ml_knn")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4 on GPUs "
                   "(up to the GPUs present), 1,2 on CPU)")
    p.add_argument("--rows-per-rank", type=float, default=None, help="weak scaling rows per rank "
                   "(default 2e7 on GPU, 2e5 on CPU)")
    p.add_argument("--rows", type=float, default=None, help="strong scaling global rows (default: rows-per-rank x 2)")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--k", type=int, default=64)
    p.add_argument("--iters", type=int, default=10, help="Lloyd iterations timed per configuration")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--sklearn-rows", type=float, default=None, help="rows of scikit-learn's subsample "
                   "(default 2e6 on GPU hosts, 1e5 on CPU)")
    p.add_argument("--shapes", default=None, help="comma-separated NxDxK global shapes (e.g. 1e7x64x64,1e6x256x1024): "
                   "per shape and rank count, the time per Lloyd iteration and of a whole fit (init='random', "
                   "--fit-iters iterations), the plain-CuPy Lloyd step on the same shards, and the floor; "
                   "replaces the strong/weak sweep")
    p.add_argument("--fit-iters", type=int, default=20, help="Lloyd iterations of each whole fit (tol=0)")
    p.add_argument("--fit-init", default="random", help="init of the per-shape fits (k-means||, k-means++, random)")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--no-heat", action="store_true")
    p.add_argument("--out", default="benchmarks/results", help="directory of the JSON and PNG")
    p.add_argument("--tag", default=None, help="file name part (default gpu or cpu)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--heat-worker", default=None, help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------- measuring the machine
def _floor(n_local, d, k, itemsize, rates, key="gemm_flops"):
    """Seconds: one read of the shard at the copy bandwidth (read + write traffic), or the distance flops."""
    return max(n_local * d * itemsize / rates["copy_bandwidth_Bps"], 2.0 * n_local * k * d / rates[key])


# ---------------------------------------------------------------------- the MPI worker
def _worker(args, outfile):
    import mpiml
    from ..cluster import KMeans
    from ..comm import get_comm
    from ..datasets import make_blobs

    world = get_comm()
    ranks_list = [int(r) for r in args.ranks.split(",")]
    use_gpu = args.device == "gpu"
    if use_gpu:
        import cupy as xp

        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    else:
        xp = np
    dtype = np.dtype(args.dtype)
    d, k = args.features, args.k
    results = {"runs": []}
    if world.rank == 0:
        results["rates"] = _measure_rates(xp, dtype)
        print(f"machine: copy {results['rates']['copy_bandwidth_Bps'] / 1e9:.0f} GB/s, "
              f"{dtype} GEMM {results['rates']['gemm_flops'] / 1e12:.2f} TFLOP/s", flush=True)
    world.barrier()
    rates = world.bcast_obj(results.get("rates"))
    if args.shapes:
        results["shape_runs"] = _shape_runs(args, world, xp, dtype, ranks_list, use_gpu)
        if world.rank == 0:
            with open(outfile, "w") as f:
                json.dump(results, f)
        return 0
    per_rank = int(args.rows_per_rank)
    strong_n = int(args.rows)
    for mode in ("strong", "weak"):
        for R in ranks_list:
            color = 0 if world.rank < R else None
            sub = world.split(color, key=world.rank)
            if sub is not None:
                n_total = strong_n if mode == "strong" else per_rank * R
                X, _ = make_blobs(n_total, d, centers=k, cluster_std=4.0, random_state=0, comm=sub,
                                  device="gpu" if use_gpu else "cpu", dtype=dtype)
                km = KMeans(k, init="random", n_init=1, max_iter=args.iters, tol=0.0, random_state=0, comm=sub)
                sub.barrier()
                t0 = time.perf_counter()
                with mpiml.profile() as prof:
                    km.fit(X)
                fit_s = time.perf_counter() - t0
                iters = np.asarray(km._iter_seconds[1:] or km._iter_seconds)
                it_local = float(np.median(iters))
                it_max = sub.allreduce_obj(it_local, op="max") if sub.size > 1 else it_local
                n_max = sub.allreduce_obj(int(X.shape[0]), op="max") if sub.size > 1 else int(X.shape[0])
                summ = prof.summary()
                ar = summ["ops"].get("allreduce", {"calls": 0, "seconds": 0.0})
                if sub.rank == 0:
                    floor = _floor(n_max, d, k, dtype.itemsize, rates)
                    row = {"mode": mode, "ranks": R, "n_total": n_total, "n_per_rank_max": n_max,
                           "iter_ms": 1e3 * it_max, "floor_ms": 1e3 * floor, "ratio_to_floor": it_max / floor,
                           "fit_s": fit_s, "n_iter": km.n_iter_, "inertia": km.inertia_,
                           "allreduce_us_per_call": 1e6 * ar["seconds"] / max(ar["calls"], 1),
                           "allreduce_calls": ar["calls"]}
                    if "matrix_unit_flops" in rates:
                        fm = _floor(n_max, d, k, dtype.itemsize, rates, "matrix_unit_flops")
                        row["floor_matrix_unit_ms"] = 1e3 * fm
                        row["ratio_to_matrix_unit_floor"] = it_max / fm
                    results["runs"].append(row)
                    print(f"{mode:>6} ranks={R} n={n_total:.3g}: {row['iter_ms']:.3f} ms/iter, floor "
                          f"{row['floor_ms']:.3f} ms ({row['ratio_to_floor']:.2f}x), allreduce "
                          f"{row['allreduce_us_per_call']:.0f} us/call", flush=True)
                del X, km
                if use_gpu:
                    xp.get_default_memory_pool().free_all_blocks()
            world.barrier()
    if world.rank == 0:
        with open(outfile, "w") as f:
            json.dump(results, f)
    return 0


def _parse_shapes(text):
    """``"1e7x64x64,1e6x256x1024"`` -> [(10000000, 64, 64), (1000000, 256, 1024)]."""
    shapes = []
    for part in text.split(","):
        n, d, k = part.lower().split("x")
        shapes.append((int(float(n)), int(d), int(k)))
    return shapes


def _plain_cupy_lloyd(X, C, comm, xp):
    """The peer: ten lines of CuPy (``X @ C.T``, argmin, ``add.at``, bincount) and one host allreduce."""
    k, d = C.shape
    G = X @ C.T
    lab = ((C * C).sum(1)[None, :] - 2 * G).argmin(axis=1)
    sums = xp.zeros((k, d), dtype=xp.float64)
    xp.add.at(sums, lab, X.astype(xp.float64))
    counts = xp.bincount(lab, minlength=k).astype(xp.float64)
    packed = xp.concatenate([sums.ravel(), counts])
    host = packed.get() if xp is not np else packed
    return comm.allreduce(host) if comm.size > 1 else host


def _shape_runs(args, world, xp, dtype, ranks_list, use_gpu):
    """Per (shape, rank count): mpiml's time per iteration and whole fit, the plain-CuPy step, the floor."""
    from ..cluster import KMeans
    from ..datasets import make_blobs

    fp_rate = 60e12 if dtype == np.float32 else 34e12     # FP32 / FP64 vector rates of an H200 (datasheet-level)
    hbm = 4.3e12
    rows = []
    for n_total, d, k in _parse_shapes(args.shapes):
        for R in ranks_list:
            color = 0 if world.rank < R else None
            sub = world.split(color, key=world.rank)
            if sub is not None:
                X, _ = make_blobs(n_total, d, centers=k, cluster_std=4.0, random_state=0, comm=sub,
                                  device="gpu" if use_gpu else "cpu", dtype=dtype)
                warm = KMeans(k, init=args.fit_init, n_init=1, max_iter=2, tol=0.0, random_state=0, comm=sub)
                warm.fit(X[:max(k, min(X.shape[0], 200000))])         # compiles the kernels outside the timing
                km = KMeans(k, init=args.fit_init, n_init=1, max_iter=args.fit_iters, tol=0.0, random_state=0,
                            comm=sub)
                sub.barrier()
                if use_gpu:
                    xp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                km.fit(X)
                if use_gpu:
                    xp.cuda.Device().synchronize()
                fit_s = time.perf_counter() - t0
                it = np.asarray(km._iter_seconds)
                iter_s = float(np.median(it[1:] if it.size > 1 else it))
                outside = fit_s - float(it.sum())                    # init, global statistics, final labelling
                C = X[:k].copy() if X.shape[0] >= k else xp.asarray(np.random.RandomState(0).randn(k, d), dtype)
                plain = []
                for _ in range(3):
                    sub.barrier()
                    t1 = time.perf_counter()
                    _plain_cupy_lloyd(X, C, sub, xp)
                    if use_gpu:
                        xp.cuda.Device().synchronize()
                    plain.append(time.perf_counter() - t1)
                vals = [iter_s, fit_s, outside, float(np.median(plain[1:])), int(X.shape[0])]
                vals = [sub.allreduce_obj(v, op="max") for v in vals] if sub.size > 1 else vals
                if sub.rank == 0:
                    n_max = vals[4]
                    floor = max(n_max * d * dtype.itemsize / hbm, 2.0 * n_max * k * d / fp_rate)
                    row = {"n": n_total, "d": d, "k": k, "ranks": R, "iter_ms": 1e3 * vals[0], "fit_s": vals[1],
                           "fit_outside_iterations_s": vals[2], "plain_cupy_iter_ms": 1e3 * vals[3],
                           "floor_ms": 1e3 * floor, "ratio_to_floor": vals[0] / floor, "n_iter": km.n_iter_,
                           "init": args.fit_init, "inertia": km.inertia_}
                    rows.append(row)
                    print(f"{n_total:.3g}x{d} k={k} ranks={R}: {row['iter_ms']:.3f} ms/iter (floor {row['floor_ms']:.3f}, "
                          f"{row['ratio_to_floor']:.2f}x), fit {row['fit_s']:.2f} s, plain CuPy "
                          f"{row['plain_cupy_iter_ms']:.2f} ms/iter", flush=True)
                del X, km, C
                if use_gpu:
                    xp.get_default_memory_pool().free_all_blocks()
            world.barrier()
    return rows


def _sklearn_shapes(args):
    """scikit-learn's whole fit per shape on a subsample (all host cores), scaled linearly to the full rows."""
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.datasets import make_blobs

    out = []
    for n, d, k in _parse_shapes(args.shapes):
        n_sub = int(min(n, max(20000, 2e6 * 64 / max(d, 64) * 64 / max(k, 64))))
        X, _ = make_blobs(n_sub, d, centers=k, cluster_std=4.0, random_state=0)
        X = X.astype(args.dtype)
        km = SkKMeans(k, init="random" if args.fit_init == "random" else "k-means++", n_init=1,
                      max_iter=args.fit_iters, tol=0.0, random_state=0, algorithm="lloyd")
        t0 = time.perf_counter()
        km.fit(X)
        fit_s = time.perf_counter() - t0
        out.append({"n": n, "d": d, "k": k, "rows": n_sub, "fit_s": fit_s, "n_iter": int(km.n_iter_),
                    "scaled_fit_s": fit_s * n / n_sub, "scaled_iter_ms": 1e3 * fit_s / km.n_iter_ * n / n_sub,
                    "cores": os.cpu_count()})
        print(f"scikit-learn {n:.3g}x{d} k={k} on {n_sub} rows: fit {fit_s:.2f} s "
              f"(scaled to the full rows: {out[-1]['scaled_fit_s']:.1f} s)", flush=True)
    return out


def _heat_worker(args, outfile):
    """Heat's KMeans on the same data sizes (strong scaling at the largest rank count only)."""
    import heat as ht
    from ..comm import get_comm
    from ..datasets import make_blobs

    comm = get_comm()
    n_total = int(args.rows)
    X, _ = make_blobs(n_total, args.features, centers=args.k, cluster_std=4.0, random_state=0, comm=comm,
                      device="cpu", dtype=np.dtype(args.dtype))
    import torch

    dev = "gpu" if args.device == "gpu" else "cpu"
    if dev == "gpu":
        torch.cuda.set_device(comm.rank % torch.cuda.device_count())
    Xh = ht.array(torch.from_numpy(np.ascontiguousarray(X)), is_split=0, device=dev)
    km = ht.cluster.KMeans(n_clusters=args.k, init="random", max_iter=args.iters, tol=-1.0, random_state=0)
    t0 = time.perf_counter()
    km.fit(Xh)
    fit_s = time.perf_counter() - t0
    n_iter = int(getattr(km, "n_iter_", args.iters) or args.iters)
    if comm.rank == 0:
        with open(outfile, "w") as f:
            json.dump({"ranks": comm.size, "n_total": n_total, "fit_s": fit_s, "n_iter": n_iter,
                       "iter_ms": 1e3 * fit_s / max(n_iter, 1), "version": getattr(ht, "__version__", "?")}, f)
    return 0


# ---------------------------------------------------------------------- the driver
def _sklearn_baseline(args, n_sub):
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_sub, args.features, centers=args.k, cluster_std=4.0, random_state=0)
    X = X.astype(args.dtype)
    km = SkKMeans(args.k, init="random", n_init=1, max_iter=args.iters, tol=0.0, random_state=0,
                  algorithm="lloyd")
    t0 = time.perf_counter()
    km.fit(X)
    fit_s = time.perf_counter() - t0
    return {"rows": n_sub, "fit_s": fit_s, "n_iter": int(km.n_iter_), "iter_ms": 1e3 * fit_s / km.n_iter_,
            "cores": os.cpu_count()}


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, mode in zip(axes, ("strong", "weak")):
        runs = [r for r in result["runs"] if r["mode"] == mode]
        if not runs:
            continue
        R = [r["ranks"] for r in runs]
        ax.plot(R, [r["iter_ms"] for r in runs], "o-", label="mpiml KMeans")
        ax.plot(R, [r["floor_ms"] for r in runs], "k--", label="floor (bandwidth, measured GEMM)")
        if "floor_matrix_unit_ms" in runs[0]:
            ax.plot(R, [r["floor_matrix_unit_ms"] for r in runs], "k:", label="floor (bandwidth, matrix units)")
        sk = result.get("sklearn")
        if sk and "scaled_iter_ms" in sk:
            ax.plot(R, [sk["scaled_iter_ms"][mode][str(r)] for r in R], "s-", label="scikit-learn (all cores)")
        heat = result.get("heat")
        if heat and "iter_ms" in heat and mode == "strong":
            ax.plot([heat["ranks"]], [heat["iter_ms"]], "^", ms=9, label="Heat")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(R)
        ax.set_xticklabels([str(r) for r in R])
        ax.set_xlabel("ranks (" + ("GPUs" if result["device"] == "gpu" else "CPU processes") + ")")
        ax.set_ylabel("time per Lloyd iteration (ms)")
        n_desc = f"n={runs[0]['n_total']:.3g}" if mode == "strong" else f"{runs[0]['n_total']:.3g} rows per rank"
        ax.set_title(f"{mode} scaling, {n_desc}, d={result['features']}, k={result['k']}, {result['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="center right", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _launch(ranks, argv_extra, env=None):
    from ..cli._options import mpiexec_command

    cmd = mpiexec_command(ranks, [])
    cmd = cmd[:cmd.index("-m")] + ["-m", "mpiml", "bench", "ml", *argv_extra]
    print("launching: " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def main(argv):
    """Entry point of ``mpiml bench ml``; returns the exit status."""
    suite = argparse.ArgumentParser(add_help=False)
    suite.add_argument("--algo")
    suite.add_argument("--device")
    chosen = suite.parse_known_args(argv)[0]
    if chosen.device == "cpu" and chosen.algo is None:
        from .ml_cpu import main as cpu_main  # every estimator on CPU ranks vs scikit-learn(-intelex)

        return cpu_main(argv)
    linear = ("linreg", "logreg", "ridge", "tsvd", "pca")
    if set(linear) & set(argv) or {f"--algo={a}" for a in linear} & set(argv):
        from .ml_linear import main as linear_main

        return linear_main([a.split("=", 1)[1] if a.startswith("--algo=") else a for a in argv])
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--algo")
    if which.parse_known_args(argv)[0].algo == "knn":
        from .ml_knn import main as knn_main

        return knn_main(argv)
    if which.parse_known_args(argv)[0].algo == "rf":
        from .ml_rf import main as rf_main

        return rf_main(argv)
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args, args.worker)
    if args.heat_worker:
        return _heat_worker(args, args.heat_worker)
    from ._common import bench_launch_check

    status, ngpu = bench_launch_check(args.device)
    if status is not None:
        return status
    device = "gpu" if ngpu else "cpu"
    if args.ranks is None:
        args.ranks = ",".join(str(r) for r in (1, 2, 4) if r <= max(ngpu, 1)) if ngpu else "1,2"
    ranks = [int(r) for r in args.ranks.split(",")]
    if args.rows_per_rank is None:
        args.rows_per_rank = 2e7 if ngpu else 2e5
    if args.rows is None:
        args.rows = args.rows_per_rank * 2
    if args.sklearn_rows is None:
        args.sklearn_rows = 2e6 if ngpu else 1e5
    tag = args.tag or device
    os.makedirs(args.out, exist_ok=True)
    common = ["--algo", "kmeans", "--device", device, "--ranks", args.ranks, "--rows-per-rank", str(args.rows_per_rank),
              "--rows", str(args.rows), "--features", str(args.features), "--k", str(args.k), "--iters",
              str(args.iters), "--dtype", args.dtype, "--fit-iters", str(args.fit_iters), "--fit-init", args.fit_init]
    if args.shapes:
        common += ["--shapes", args.shapes]
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(ranks)))
    with tempfile.TemporaryDirectory() as tmp:
        wfile = os.path.join(tmp, "mpiml.json")
        code = _launch(max(ranks), common + ["--worker", wfile], env)
        if code != 0 or not os.path.exists(wfile):
            print(f"mpiml bench ml: the MPI job failed (exit {code})", file=sys.stderr)
            return 1
        with open(wfile) as f:
            result = json.load(f)
        result.update({"algo": "kmeans", "device": device, "dtype": args.dtype, "features": args.features,
                       "k": args.k, "iters": args.iters, "machine": machine_info(), **stamp(["bench", "ml", *argv])})
        if args.shapes:
            if not args.no_sklearn:
                result["sklearn_shapes"] = _sklearn_shapes(args)
            base = os.path.join(args.out, f"ml_kmeans_{tag}")
            write_result(base, result, _plot_shapes, _print_shapes)
            return 0
        if not args.no_sklearn:
            n_sub = int(args.sklearn_rows)
            sk = _sklearn_baseline(args, n_sub)
            scale = {}
            for mode in ("strong", "weak"):
                scale[mode] = {str(r["ranks"]): sk["iter_ms"] * r["n_total"] / n_sub
                               for r in result["runs"] if r["mode"] == mode}
            sk["scaled_iter_ms"] = scale
            result["sklearn"] = sk
            print(f"scikit-learn KMeans ({sk['cores']} cores, {n_sub} rows): {sk['iter_ms']:.2f} ms/iter "
                  f"(scaled to the full sizes in the JSON)", flush=True)
        result["heat"] = _run_heat(args, common, max(ranks), tmp, env)
    base = os.path.join(args.out, f"ml_kmeans_{tag}")
    write_result(base, result, _plot, _print_table)
    return 0


def _print_shapes(result):
    sk = {(r["n"], r["d"], r["k"]): r for r in result.get("sklearn_shapes", [])}
    print(f"\n{'shape':<20}{'ranks':>6}{'ms/iter':>10}{'floor':>9}{'x floor':>8}{'CuPy ms':>9}{'fit s':>8}"
          f"{'sklearn fit s':>15}{'speed-up':>10}")
    for r in result["shape_runs"]:
        s = sk.get((r["n"], r["d"], r["k"]))
        sks = s["scaled_fit_s"] if s else float("nan")
        print(f"{r['n']:.0e}x{r['d']}x{r['k']:<8}{r['ranks']:>6}{r['iter_ms']:>10.3f}{r['floor_ms']:>9.3f}"
              f"{r['ratio_to_floor']:>8.2f}{r['plain_cupy_iter_ms']:>9.2f}{r['fit_s']:>8.2f}{sks:>15.1f}"
              f"{sks / r['fit_s']:>10.0f}")


def _plot_shapes(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["shape_runs"]
    shapes = sorted({(r["n"], r["d"], r["k"]) for r in runs}, key=lambda t: (t[1], t[2]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4 * len(shapes), 3.8), squeeze=False)
    for ax, shp in zip(axes[0], shapes):
        rs = [r for r in runs if (r["n"], r["d"], r["k"]) == shp]
        R = [r["ranks"] for r in rs]
        ax.plot(R, [r["iter_ms"] for r in rs], "o-", label="mpiml")
        ax.plot(R, [r["plain_cupy_iter_ms"] for r in rs], "s-", label="plain CuPy")
        ax.plot(R, [r["floor_ms"] for r in rs], "k--", label="floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(R)
        ax.set_xticklabels([str(r) for r in R])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("ms per Lloyd iteration")
        ax.set_title(f"{shp[0]:.0e} x {shp[1]}, k={shp[2]}, {result['dtype']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_heat(args, common, ranks, tmp, env):
    if args.no_heat:
        return {"skipped": "--no-heat"}
    try:
        import heat  # noqa: F401
    except Exception as exc:
        return {"skipped": f"heat is not importable here ({type(exc).__name__}: {exc})"}
    hfile = os.path.join(tmp, "heat.json")
    code = _launch(ranks, common + ["--heat-worker", hfile], env)
    if code != 0 or not os.path.exists(hfile):
        return {"skipped": f"the Heat job failed (exit {code})"}
    with open(hfile) as f:
        return json.load(f)


def _print_table(result):
    print(f"\n{'mode':<7}{'ranks':>6}{'rows':>12}{'ms/iter':>10}{'floor ms':>10}{'x floor':>9}{'sklearn ms':>12}"
          f"{'speed-up':>10}")
    sk = result.get("sklearn", {}).get("scaled_iter_ms", {})
    for r in result["runs"]:
        s = sk.get(r["mode"], {}).get(str(r["ranks"]))
        print(f"{r['mode']:<7}{r['ranks']:>6}{r['n_total']:>12.3g}{r['iter_ms']:>10.3f}{r['floor_ms']:>10.3f}"
              f"{r['ratio_to_floor']:>9.2f}{(s if s else float('nan')):>12.2f}"
              f"{(s / r['iter_ms'] if s else float('nan')):>10.1f}")
    heat = result.get("heat", {})
    if "iter_ms" in heat:
        print(f"Heat {heat.get('version')}: {heat['iter_ms']:.2f} ms/iter on {heat['ranks']} ranks, n={heat['n_total']:.3g}")
    else:
        print(f"Heat: {heat.get('skipped')}")
