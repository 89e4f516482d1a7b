"""Seed 000, Figs. 10 and 11: each estimator's fit with the communicator's automatic choice against the
same fit with every collective forced onto one path (NCCL on GPUs), and its message-size histogram.

    mpirun -n 4 python benchmarks/seeds/seed000_estimators.py --device gpu --json seed000_n4.json \
        --plot seed000_n4.png
    mpiexec -n 2 python benchmarks/seeds/seed000_estimators.py --device cpu --quick    # the harness, on CPU ranks

The document (MPI communications for cuML, up to 32 V100s) reports its estimators' fits 1.6x (k-means),
1.25x (k-NN, LinearRegression) and 1.36x (TruncatedSVD) faster with its MPI communicator than with
every collective on NCCL.  Ours, in one SPMD job: two world communicators, ``auto`` (the tuning table:
what users get) and ``forced`` (built with ``MPIML_COMM_ALGO`` sending every collective to
``--forced``, default ``nccl/native`` on GPUs, ``native`` on CPUs).  Each estimator is fitted once on
each as a warm-up (kernels compiled, buffers allocated), then ``--repeats`` times on each, the two
taking turns; a fit is timed from a barrier to the slowest rank's end (device synchronised), the best
kept.  On one rank there is no collective, so the forced fits would repeat the auto ones: only auto's
are timed (Fig. 10's one-GPU point, what the 2- and 4-GPU fits are compared with).  The fits are
those of the document's Fig. 10 on its synthetic data, the same global data at any rank count:
KMeans (blobs, 20 Lloyd iterations, no tolerance: the same work on both), NearestNeighbors (fit and
the k-neighbours of 10^4 queries), LinearRegression, TruncatedSVD (16 components) and a random forest
(20 trees, depth 8); ``--algos`` picks.  Fig. 11: the histogram of message sizes of one ``auto`` fit
(``mpiml.profile``, rank 0's calls).  The ratio is the forced fit's time over auto's (above 1: auto
faster), against the document's.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seeds  # noqa: E402

OPS = ("bcast", "reduce", "allreduce", "allgather", "allgatherv", "gather", "gatherv", "scatter",
       "reduce_scatter", "scan", "exscan", "alltoall")
DOC = {
    "source": "shared/seeds/000 (MPI communications for cuML / RAFT; up to 32 V100 GPUs, MVAPICH2-GDR vs NCCL)",
    "figure": "fits with the MPI communicator vs every collective on NCCL: k-means 1.6x, k-NN 1.25x, "
              "LinearRegression 1.25x, TruncatedSVD 1.36x faster (Fig. 10, up to 32 GPUs)",
    "speedup": {"kmeans": 1.6, "knn": 1.25, "linreg": 1.25, "tsvd": 1.36},
    "their_peer": "the same cuML fit with every collective on NCCL",
}
#: estimator -> (rows on GPUs, rows on CPU ranks, rows with --quick): the global data, split over the ranks
ROWS = {"kmeans": (4_000_000, 200_000, 4000), "knn": (1_000_000, 50_000, 2000), "linreg": (4_000_000, 200_000, 4000),
        "tsvd": (2_000_000, 100_000, 4000), "rf": (1_000_000, 50_000, 2000)}
QUERIES = 10_000


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--quick", action="store_true", help="tiny data, 1 timed fit each (the harness)")
    ap.add_argument("--algos", default=",".join(ROWS))
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every estimator's rows")
    ap.add_argument("--repeats", type=int, default=None, help="timed fits per communicator (best kept; default 3)")
    ap.add_argument("--forced", default=None, help="the path every collective is forced onto "
                                                   "(default nccl/native on GPUs, native on CPUs)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    args.algos = [a for a in args.algos.split(",") if a]
    bad = [a for a in args.algos if a not in ROWS]
    if bad:
        ap.error(f"--algos: unknown {bad} (known: {list(ROWS)})")
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.forced = args.forced or ("nccl/native" if args.device == "gpu" else "native")
    return args


def rows_of(algo, args):
    gpu, cpu, quick = ROWS[algo]
    return max(64, int((quick if args.quick else gpu if args.device == "gpu" else cpu) * args.scale))


def data(algo, n, comm, device):
    """This rank's shard of the estimator's data (the same global data at any rank count)."""
    from mpiml import datasets

    kw = dict(comm=comm, device=device, dtype=np.float32, random_state=0)
    if algo == "kmeans":
        return datasets.make_blobs(n, n_features=32, centers=16, **kw)[0], None
    if algo == "knn":
        X, y = datasets.make_classification(n, n_features=32, **kw)
        return X, X[:max(1, QUERIES // comm.size)]
    if algo == "linreg":
        return datasets.make_regression(n, n_features=64, noise=1.0, **kw)
    if algo == "tsvd":
        return datasets.make_low_rank_matrix(n, n_features=128, effective_rank=16, **kw), None
    return datasets.make_classification(n, n_features=32, **kw)


def make(algo, comm):
    """A fit of ``algo`` on ``comm``: ``fit(X, extra)`` (the document's Fig. 10 estimators)."""
    from mpiml.cluster import KMeans
    from mpiml.decomposition import TruncatedSVD
    from mpiml.ensemble import RandomForestClassifier
    from mpiml.linear_model import LinearRegression
    from mpiml.neighbors import NearestNeighbors

    if algo == "kmeans":
        return lambda X, _: KMeans(16, init="random", n_init=1, max_iter=20, tol=0.0, random_state=0,
                                   comm=comm).fit(X)
    if algo == "knn":
        return lambda X, Q: NearestNeighbors(n_neighbors=10, comm=comm).fit(X).kneighbors(Q)
    if algo == "linreg":
        return lambda X, y: LinearRegression(comm=comm).fit(X, y)
    if algo == "tsvd":
        return lambda X, _: TruncatedSVD(n_components=16, random_state=0, comm=comm).fit(X)
    return lambda X, y: RandomForestClassifier(n_estimators=20, max_depth=8, random_state=0, comm=comm).fit(X, y)


def summarise(results):
    """Per estimator: forced / auto (above 1: auto faster) and that over the document's speed-up."""
    out = {}
    for algo, r in results.items():
        if "error" in r:
            continue
        speed = _seeds.ratio(r["forced_s"], r["auto_s"])  # None on one rank (no forced fit)
        doc = DOC["speedup"].get(algo)
        out[algo] = {"auto_s": r["auto_s"], "forced_s": r["forced_s"], "forced_over_auto": speed,
                     "document": doc, "vs_document": _seeds.ratio(speed, doc)}
    ratios = [v["vs_document"] for v in out.values() if v["vs_document"]]
    return {"estimators": out,
            "vs_document_geomean": float(np.exp(np.mean(np.log(ratios)))) if ratios else None}


def plot(result, path):
    ok = result["summary"]["estimators"]
    hist = {a: r["histogram"] for a, r in result["results"].items() if "histogram" in r}

    def draw(plt):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
        names = list(ok)
        xs = range(len(names))
        ax1.bar([x - 0.2 for x in xs], [ok[a]["auto_s"] for a in names], 0.4, label="auto")
        ax1.bar([x + 0.2 for x in xs], [ok[a]["forced_s"] or 0 for a in names], 0.4, label=result["forced"])
        for x, a in zip(xs, names):
            doc = ok[a]["document"]
            ax1.text(x, max(ok[a]["auto_s"], ok[a]["forced_s"] or 0) * 1.02,
                     (f"{ok[a]['auto_s']:.3g} s" if ok[a]["forced_s"] is None else
                      f"{_seeds.fmt(ok[a]['forced_over_auto'])}x" + (f"\n(doc {doc:g}x)" if doc else "")),
                     ha="center", va="bottom", fontsize=7)
        ax1.set_xticks(list(xs), names)
        ax1.set_ylabel("fit time (s, slowest rank, best)")
        ax1.set_ylim(top=ax1.get_ylim()[1] * 1.2)
        ax1.set_title(f"fit, {result['ranks']} ranks ({result['device']}): auto vs every collective on "
                      f"{result['forced']}", fontsize=9)
        ax1.legend(fontsize=8)
        drawn = False
        for a, h in hist.items():
            ks = sorted(int(k) for k in h if int(k) > 0)  # bucket 0: calls that move no data (a log axis)
            if ks:
                ax2.plot(ks, [h[str(k)] if str(k) in h else h[k] for k in ks], "o-", label=a)
                drawn = True
        if drawn:
            ax2.set_xscale("log", base=2)
            ax2.set_yscale("log")
            ax2.legend(fontsize=8)
        else:
            ax2.text(0.5, 0.5, "no collective moved data", ha="center", va="center", transform=ax2.transAxes)
        ax2.set_xlabel("message size (bytes, power-of-two bucket)")
        ax2.set_ylabel("calls during one fit (rank 0)")
        ax2.set_title("message-size histogram of each fit (Fig. 11)", fontsize=9)
        return fig
    _seeds.plot_file(path, draw)


def main(argv=None):
    args = parse(argv)
    os.environ.setdefault("MPIML_TIMEOUT", "120")
    import mpiml
    from mpiml.comm import get_comm

    auto = get_comm("auto" if args.device == "gpu" else "mpi")
    if args.device == "gpu":
        mpiml.init(device="gpu")
        import cupy as xp

        def sync():
            xp.cuda.Device().synchronize()
    else:
        def sync():
            pass
    forced = None  # one rank: no collective to force, the forced fit would be the auto one again
    if auto.size > 1:
        # the second world communicator reads its table (every collective on --forced) when it is made
        os.environ["MPIML_COMM_ALGO"] = ";".join(f"{op}:{args.forced}" for op in OPS)
        forced = get_comm("nccl" if args.device == "gpu" else "auto")
        del os.environ["MPIML_COMM_ALGO"]
        if forced is auto:
            raise SystemExit("seed000: the forced communicator is the auto one")
    from mpiml.cli._options import aggregate_profile

    def timed(fit, X, extra, comm):
        comm.barrier()
        sync()
        t0 = time.perf_counter()
        fit(X, extra)
        sync()
        return comm.allreduce_obj(time.perf_counter() - t0, op="max")

    t_start = time.perf_counter()
    result = {"seed": "000", "experiment": "Fig. 10/11: fit time, auto vs every collective forced; message sizes",
              "machine": _seeds.machine(auto), **_seeds.stamp(auto.size), "ranks": auto.size,
              "device": args.device, "forced": args.forced, "repeats": args.repeats,
              "peer": (f"the same fit with every collective on {args.forced} (MPIML_COMM_ALGO), same run"
                       if forced is not None else "none: one rank has no collective (auto's fit times only)"),
              "document": DOC, "results": {}}
    for algo in args.algos:
        n = rows_of(algo, args)
        try:
            X, extra = data(algo, n, auto, args.device)
            fits = {"auto": make(algo, auto), **({"forced": make(algo, forced)} if forced is not None else {})}
            for name, fit in fits.items():  # warm-up: kernels compiled, pools grown, on both
                timed(fit, X, extra, auto)
            with mpiml.profile() as prof:
                timed(fits["auto"], X, extra, auto)
            profile = aggregate_profile(auto, prof)
            best = {name: [] for name in fits}
            for _ in range(args.repeats):
                for name, fit in fits.items():
                    best[name].append(timed(fit, X, extra, auto))
            forced_all = best.get("forced", [])
            row = {"rows": n, "auto_s": min(best["auto"]), "forced_s": min(forced_all) if forced_all else None,
                   "auto_all_s": best["auto"], "forced_all_s": forced_all, "calls": profile["calls"],
                   "histogram": {str(k): v for k, v in profile["histogram"].items()}}
        except Exception as exc:  # one estimator failing leaves the others' rows
            row = {"rows": n, "error": f"{type(exc).__name__}: {exc}"[:1500]}
        result["results"][algo] = row
        result["summary"] = summarise(result["results"])
        result["seconds"] = time.perf_counter() - t_start
        if auto.rank == 0:
            if "error" in row:
                print(f"{algo:<7} failed: {row['error'][-400:]}", flush=True)
            elif row["forced_s"] is None:
                print(f"{algo:<7} {n} rows, 1 rank: auto {row['auto_s']:.4f} s (no collective: nothing to force)",
                      flush=True)
            else:
                print(f"{algo:<7} {n} rows, {auto.size} ranks: auto {row['auto_s']:.4f} s, forced {args.forced} "
                      f"{row['forced_s']:.4f} s (forced/auto {row['forced_s'] / row['auto_s']:.2f}); "
                      f"{row['calls']} collective calls a fit", flush=True)
            _seeds.write_json(result, args.json)
    if auto.rank != 0:
        return 0
    s = result["summary"]
    est = s["estimators"]
    _seeds.readme_row([
        "000", f"{auto.size} {'GPUs' if args.device == 'gpu' else 'CPU ranks'}",
        "forced / MPI: k-means 1.6x, k-NN 1.25x, LinReg 1.25x, tSVD 1.36x",
        ("fit s (one rank, nothing forced): " + ", ".join(f"{a} {v['auto_s']:.4f}" for a, v in est.items())
         if forced is None else
         "forced / auto: " + ", ".join(f"{a} {_seeds.fmt(v['forced_over_auto'])}x" for a, v in est.items())),
        args.forced, _seeds.fmt(s["vs_document_geomean"]), result["command"]])
    plot(result, args.plot)
    return 1 if any("error" in r for r in result["results"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
