"""``mpiml bench ml --algo knn``: exact k-NN search with the three ring exchanges, against scikit-learn.

The driver (a plain process) launches one MPI job per rank count (idle ranks of a
larger job would busy-poll a barrier beside the timed ones); each draws the same
global index and query sets (``mpiml.datasets.make_blobs``: rows do not depend on the rank count),
fit :class:`mpiml.neighbors.NearestNeighbors` and time ``kneighbors`` of every rank's
queries with ``exchange="blocking"``, ``"overlap"`` and ``"onesided"`` (the slowest
rank, best of ``--repeats``; the variants take turns, so drifts hit them alike).  The table gives the percentage of the blocking time
saved by the other two, the measure of seed 003 (MaTEx: 2.7-5.9 % for nonblocking
overlap, 9-27.6 % for one-sided puts into a three-slot buffer).  The driver also
times scikit-learn's brute force (``n_jobs=-1``, every host core) on the gathered
data, and writes one JSON file and one PNG plot.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ._common import machine_info, stamp

__all__ = ["main"]

EXCHANGES = ("blocking", "overlap", "onesided")


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml --algo knn", description="Exact k-NN: ring exchanges "
                                "blocking / overlap / onesided on 1..N ranks, against scikit-learn's brute force.")
    p.add_argument("--algo", choices=("knn",), default="knn")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4 up to the GPUs, "
                   "1,2 on CPU)")
    p.add_argument("--rows", type=float, default=None, help="global index rows (default 4e6 on GPU, 2e4 on CPU)")
    p.add_argument("--queries", type=float, default=None, help="global query rows (default 1e5 on GPU, 2e3 on CPU)")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--metric", default="euclidean")
    p.add_argument("--repeats", type=int, default=3, help="timed kneighbors calls per variant (the best is kept)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--out", default="benchmarks/results", help="directory of the JSON and PNG")
    p.add_argument("--tag", default=None, help="file name part (default gpu or cpu)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def _data(args, comm, device):
    from ..datasets import make_blobs

    kw = dict(n_features=args.features, centers=16, comm=comm, device=device, dtype=np.dtype(args.dtype))
    X, _ = make_blobs(int(args.rows), random_state=0, **kw)
    Q, _ = make_blobs(int(args.queries), random_state=1, **kw)
    return X, Q


# ---------------------------------------------------------------------- the MPI worker
def _worker(args, outfile):
    from ..comm import get_comm
    from ..neighbors import NearestNeighbors

    world = get_comm()
    use_gpu = args.device == "gpu"
    if use_gpu:
        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    device = "gpu" if use_gpu else "cpu"
    runs = []
    for R in [int(r) for r in args.ranks.split(",")]:
        sub = world.split(0 if world.rank < R else None, key=world.rank)
        if sub is not None:
            X, Q = _data(args, sub, device)
            row = {"ranks": R}
            models = {ex: NearestNeighbors(n_neighbors=args.k, metric=args.metric, exchange=ex, comm=sub).fit(X)
                      for ex in EXCHANGES}
            best = {ex: np.inf for ex in EXCHANGES}
            found = {}
            # the variants take turns (warm-up round first), so drifts of the machine hit them alike
            for rep in range(args.repeats + 1):
                for ex in EXCHANGES:
                    sub.barrier()
                    t0 = time.perf_counter()
                    _, found[ex] = models[ex].kneighbors(Q)
                    if use_gpu:
                        import cupy

                        cupy.cuda.Device().synchronize()
                    t = np.array([time.perf_counter() - t0])
                    t = sub.allreduce(t, op="max") if sub.size > 1 else t
                    if rep:
                        best[ex] = min(best[ex], float(t[0]))
            for ex in EXCHANGES:
                row[f"{ex}_s"] = best[ex]
                if ex != "blocking":  # the variants must agree (they are tested to; else the timing is void)
                    same = np.array([float(bool((found[ex] == found["blocking"]).all()))])
                    same = sub.allreduce(same, op="min") if sub.size > 1 else same
                    row[f"{ex}_identical"] = bool(same[0])
            if sub.rank == 0:
                for ex in EXCHANGES[1:]:
                    row[f"{ex}_saved_pct"] = 100.0 * (row["blocking_s"] - row[f"{ex}_s"]) / row["blocking_s"]
                runs.append(row)
                print(f"ranks={R}: blocking {row['blocking_s']:.3f} s, overlap {row['overlap_s']:.3f} s "
                      f"({row['overlap_saved_pct']:+.1f} %), onesided {row['onesided_s']:.3f} s "
                      f"({row['onesided_saved_pct']:+.1f} %)", flush=True)
            del X, Q
        world.barrier()
    if world.rank == 0:
        with open(outfile, "w") as f:
            json.dump({"runs": runs}, f)
    return 0


# ---------------------------------------------------------------------- the driver
def _sklearn_baseline(args):
    from sklearn.neighbors import NearestNeighbors as SkNearestNeighbors

    from ..comm import get_comm

    X, Q = _data(args, get_comm("self"), "cpu")
    nn = SkNearestNeighbors(n_neighbors=args.k, metric=args.metric, algorithm="brute", n_jobs=-1).fit(X)
    nn.kneighbors(Q[:10])
    t0 = time.perf_counter()
    nn.kneighbors(Q)
    return {"kneighbors_s": time.perf_counter() - t0, "cores": os.cpu_count()}


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ranks = [r["ranks"] for r in result["runs"]]
    ax = axes[0]
    for ex, marker in zip(EXCHANGES, ("o-", "s-", "^-")):
        ax.plot(ranks, [r[f"{ex}_s"] for r in result["runs"]], marker, label=f"mpiml {ex}")
    sk = result.get("sklearn")
    if sk:
        ax.plot(ranks, [sk["kneighbors_s"]] * len(ranks), "k--", label=f"scikit-learn brute, {sk['cores']} cores")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(r) for r in ranks])
    ax.set_xlabel("ranks (" + ("GPUs" if result["device"] == "gpu" else "CPU processes") + ")")
    ax.set_ylabel("kneighbors time (s)")
    ax.set_title(f"index {result['rows']:.3g} x {result['features']}, {result['queries']:.3g} queries, "
                 f"k={result['k']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    x = np.arange(len(ranks))
    for j, ex in enumerate(EXCHANGES[1:]):
        ax.bar(x + (j - 0.5) * 0.4, [r[f"{ex}_saved_pct"] for r in result["runs"]], 0.4, label=ex)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([str(r) for r in ranks])
    ax.set_xlabel("ranks")
    ax.set_ylabel("% of blocking time saved")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print_table(result):
    sk = result.get("sklearn", {})
    print(f"\n{'ranks':>5}{'blocking s':>12}{'overlap s':>11}{'saved %':>9}{'onesided s':>12}{'saved %':>9}"
          f"{'vs sklearn':>12}")
    for r in result["runs"]:
        speed = f"{sk['kneighbors_s'] / r['overlap_s']:.1f}x" if sk else "-"
        print(f"{r['ranks']:>5}{r['blocking_s']:>12.4f}{r['overlap_s']:>11.4f}{r['overlap_saved_pct']:>9.1f}"
              f"{r['onesided_s']:>12.4f}{r['onesided_saved_pct']:>9.1f}{speed:>12}")
    if sk:
        print(f"scikit-learn brute force ({sk['cores']} cores, all rows): {sk['kneighbors_s']:.4f} s")


def main(argv):
    """Entry point of ``mpiml bench ml --algo knn``; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args, args.worker)
    from ._common import bench_launch_check

    status, ngpu = bench_launch_check(args.device, "mpiml bench ml --algo knn")
    if status is not None:
        return status
    from ..cli._options import mpiexec_command

    device = "gpu" if ngpu else "cpu"
    if args.ranks is None:
        args.ranks = ",".join(str(r) for r in (1, 2, 4, 8) if r <= ngpu) if ngpu else "1,2"
    ranks = [int(r) for r in args.ranks.split(",")]
    args.rows = args.rows or (4e6 if ngpu else 2e4)
    args.queries = args.queries or (1e5 if ngpu else 2e3)
    tag = args.tag or device
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    result = {"runs": []}
    for R in ranks:  # one job per rank count: no idle ranks busy-polling a barrier beside the timed ones
        common = ["--algo", "knn", "--device", device, "--ranks", str(R), "--rows", str(args.rows), "--queries",
                  str(args.queries), "--features", str(args.features), "--k", str(args.k), "--metric", args.metric,
                  "--repeats", str(args.repeats), "--dtype", args.dtype]
        with tempfile.TemporaryDirectory() as tmp:
            wfile = os.path.join(tmp, "mpiml.json")
            cmd = mpiexec_command(R, [])
            cmd = cmd[:cmd.index("-m")] + ["-m", "mpiml", "bench", "ml", *common, "--worker", wfile]
            print("launching: " + " ".join(cmd), flush=True)
            code = subprocess.call(cmd, env=env)
            if code != 0 or not os.path.exists(wfile):
                print(f"mpiml bench ml: the MPI job failed (exit {code})", file=sys.stderr)
                return 1
            with open(wfile) as f:
                result["runs"] += json.load(f)["runs"]
    result.update({"algo": "knn", "device": device, "dtype": args.dtype, "rows": args.rows, "queries": args.queries,
                   "features": args.features, "k": args.k, "metric": args.metric, "machine": machine_info(),
                   **stamp(["bench", "ml", *argv])})
    if not args.no_sklearn:
        result["sklearn"] = _sklearn_baseline(args)
    base = os.path.join(args.out, f"ml_knn_{tag}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    _plot(result, base + ".png")
    _print_table(result)
    print(f"wrote {base}.json and {base}.png")
    return 0
