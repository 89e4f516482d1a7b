"""``mpiml bench ml --algo knn``: exact k-NN search on one GPU against its peers, and across ranks.

Two parts (``--part``):

``peers`` (GPU): on one GPU, for each case ``d:dtype:k`` of ``--cases`` (default 10^4 queries
against 4·10^6 rows), the same data is searched by mpiml
(``NearestNeighbors(n_neighbors=k).fit(X).kneighbors(Q)``), by the PyTorch user
(``|q|² - 2 q Xᵀ + |x|²`` then ``torch.topk(largest=False)``, 500 queries at a time), by plain
CuPy (the same GEMM, ``cupy.argpartition`` and a sort of the k picked), and by scikit-learn's
brute force on every host core (a subsample, scaled by the pair count); each peer's neighbour
sets are compared with mpiml's.  The floor is the distance arithmetic, ``2 d`` FLOP a pair, at the
GPU's FP32 (float64: FP64) SIMT peak (SMs x lanes x 2 x clock; mpiml computes on the SIMT
units, no tensor cores), or reading the index once at the memory bandwidth, whichever is larger.
A peer that would run past ``--peer-budget`` seconds is timed on its first query chunks and
scaled (the JSON says how many queries were timed).

``scaling``: the driver (a plain process) launches one MPI job per rank count (idle ranks of a
larger job would busy-poll a barrier beside the timed ones); each draws the same
global index and query sets (``mpiml.datasets.make_blobs``: rows do not depend on the rank count),
fit :class:`mpiml.neighbors.NearestNeighbors` and time ``kneighbors`` of every rank's
queries with the ring (``exchange="blocking"``, ``"overlap"`` and ``"onesided"``) and with the
local search (every rank's queries against each shard, candidate lists merged by their
owners; the one the cost model picks for few queries) (the slowest rank, best of ``--repeats``;
the variants take turns, so drifts hit them alike).  Defaults on GPUs: the fixed problem
1.6·10^7 x 32 rows, 4·10^4 queries spread over 1, 2, 4 ranks (strong scaling).  The table
gives the percentage of the blocking time saved by the other variants, the measure of seed 003
(MaTEx: 2.7-5.9 % for nonblocking overlap, 9-27.6 % for one-sided puts into a three-slot
buffer).  The driver also
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

from ._common import machine_info, stamp, write_result

__all__ = ["main"]

EXCHANGES = ("blocking", "overlap", "onesided")
#: the timed variants: the ring's exchanges, and the local search
VARIANTS = EXCHANGES + ("local",)
DEFAULT_CASES = "32:float32:10,32:float32:100,32:float32:1000,128:float32:10,32:float64:10"


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml --algo knn", description="Exact k-NN: ring exchanges "
                                "blocking / overlap / onesided on 1..N ranks, against scikit-learn's brute force.")
    p.add_argument("--algo", choices=("knn",), default="knn")
    p.add_argument("--part", choices=("all", "peers", "scaling"), default="all",
                   help="peers: one GPU against PyTorch / CuPy / scikit-learn; scaling: 1..N ranks")
    p.add_argument("--cases", default=DEFAULT_CASES, help="peers: comma-separated d:dtype:k")
    p.add_argument("--peer-rows", type=float, default=4e6)
    p.add_argument("--peer-queries", type=float, default=1e4)
    p.add_argument("--peer-budget", type=float, default=8.0, help="seconds a peer may run before it is scaled")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4 up to the GPUs, "
                   "1,2 on CPU)")
    p.add_argument("--rows", type=float, default=None, help="global index rows (default 1.6e7 on GPU, 2e4 on CPU)")
    p.add_argument("--queries", type=float, default=None, help="global query rows (default 4e4 on GPU, 2e3 on CPU)")
    p.add_argument("--features", type=int, default=32)
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
    from ..neighbors import NearestNeighbors, _ring

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
            models = {v: NearestNeighbors(n_neighbors=args.k, metric=args.metric, comm=sub,
                                          exchange="overlap" if v == "local" else v).fit(X) for v in VARIANTS}
            best = {v: np.inf for v in VARIANTS}
            found = {}
            # the variants take turns (warm-up round first), so drifts of the machine hit them alike
            for rep in range(args.repeats + 1):
                for v in VARIANTS:
                    _ring.STRATEGY = "local" if v == "local" else "ring"
                    sub.barrier()
                    t0 = time.perf_counter()
                    _, found[v] = models[v].kneighbors(Q)
                    if use_gpu:
                        import cupy

                        cupy.cuda.Device().synchronize()
                    t = np.array([time.perf_counter() - t0])
                    t = sub.allreduce(t, op="max") if sub.size > 1 else t
                    if rep:
                        best[v] = min(best[v], float(t[0]))
            _ring.STRATEGY = "auto"
            counts = models["blocking"]._shard_counts
            qcounts = sub.allgather(np.array([Q.shape[0]], dtype=np.int64)) if sub.size > 1 else [Q.shape[0]]
            row["auto_choice"] = _ring.choose_strategy(np.asarray(qcounts), counts, X.shape[1], args.k,
                                                       X.dtype.itemsize)
            for v in VARIANTS:
                row[f"{v}_s"] = best[v]
                if v != "blocking":  # the variants must agree (they are tested to; else the timing is void)
                    same = np.array([float(bool((found[v] == found["blocking"]).all()))])
                    same = sub.allreduce(same, op="min") if sub.size > 1 else same
                    row[f"{v}_identical"] = bool(same[0])
            if sub.rank == 0:
                for v in VARIANTS[1:]:
                    row[f"{v}_saved_pct"] = 100.0 * (row["blocking_s"] - row[f"{v}_s"]) / row["blocking_s"]
                runs.append(row)
                print(f"ranks={R}: blocking {row['blocking_s']:.3f} s, overlap {row['overlap_s']:.3f} s "
                      f"({row['overlap_saved_pct']:+.1f} %), onesided {row['onesided_s']:.3f} s "
                      f"({row['onesided_saved_pct']:+.1f} %), local {row['local_s']:.3f} s "
                      f"(auto picks {row['auto_choice']})", flush=True)
            del X, Q
        world.barrier()
    if world.rank == 0:
        with open(outfile, "w") as f:
            json.dump({"runs": runs}, f)
    return 0


# ---------------------------------------------------------------------- one GPU against its peers
#: FP32 and FP64 lanes an SM, by compute capability (the SIMT units; no tensor cores)
_LANES = {80: (64, 32), 86: (128, 2), 87: (128, 2), 89: (128, 2), 90: (128, 64), 100: (128, 64), 103: (128, 64)}
#: memory bandwidth (bytes/s) by device name, where the attributes do not give it
_BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def _gpu_peak():
    """(FP32 FLOP/s, FP64 FLOP/s, memory bytes/s, description) of the current GPU's SIMT units."""
    import cupy

    dev = cupy.cuda.Device()
    attrs = dev.attributes
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    sms, cc = attrs["MultiProcessorCount"], int(dev.compute_capability)
    clock = attrs.get("ClockRate", 0) * 1e3 or (1.98e9 if cc >= 90 else 1.41e9)
    f32, f64 = _LANES.get(cc, (128, 2))
    bw = attrs.get("MemoryClockRate", 0) * 1e3 * attrs.get("GlobalMemoryBusWidth", 0) * 2 / 8
    if not bw:
        bw = next((v for key, v in _BANDWIDTH.items() if key in name), 2e12)
    desc = (f"{name}: {sms} SMs x {f32} FP32 ({f64} FP64) lanes x 2 FLOP x {clock / 1e9:.2f} GHz; "
            f"memory {bw / 1e12:.2f} TB/s")
    return sms * f32 * 2 * clock, sms * f64 * 2 * clock, bw, desc


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


def _timed(fn):
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _chunked(fn, nq, chunk, budget):
    """Run ``fn(start, stop)`` over query chunks (one warm-up chunk first); stop once ``budget``
    seconds are spent.  Returns (seconds scaled to ``nq`` queries, queries timed, outputs)."""
    fn(0, min(chunk, nq))
    _sync()
    t0 = time.perf_counter()
    outs, done = [], 0
    for s in range(0, nq, chunk):
        outs.append(fn(s, min(nq, s + chunk)))
        done = min(nq, s + chunk)
        _sync()
        if time.perf_counter() - t0 > budget:
            break
    return (time.perf_counter() - t0) * nq / done, done, outs


def _agreement(ref, idx):
    """Fraction of queries whose neighbour sets equal the reference's."""
    import cupy

    n = idx.shape[0]
    a, b = cupy.sort(ref[:n], axis=1), cupy.sort(idx.astype(ref.dtype), axis=1)
    return float((a == b).all(axis=1).mean())


def _peer_case(d, dtype, k, args, peaks):
    import cupy

    from ..comm import get_comm
    from ..datasets import make_blobs
    from ..neighbors import NearestNeighbors

    m, nq = int(args.peer_rows), int(args.peer_queries)
    kw = dict(n_features=d, centers=16, comm=get_comm("self"), device="gpu", dtype=np.dtype(dtype))
    X, _ = make_blobs(m, random_state=0, **kw)
    Q, _ = make_blobs(nq, random_state=1, **kw)
    row = {"d": d, "dtype": dtype, "k": k, "rows": m, "queries": nq}
    nn = NearestNeighbors(n_neighbors=k).fit(X)
    row["mpiml_first_s"], _ = _timed(lambda: nn.kneighbors(Q))  # compiles the kernels (or loads them)
    best, ref = np.inf, None
    for _ in range(max(1, args.repeats)):
        t, (_, ref) = _timed(lambda: nn.kneighbors(Q))
        best = min(best, t)
    row["mpiml_s"] = best
    print(f"d={d} {dtype} k={k}: mpiml {best:.4f} s (first call {row['mpiml_first_s']:.2f} s)", flush=True)
    pool = cupy.get_default_memory_pool()

    def peer(name, run):
        """Run one peer; an error (out of memory...) is recorded in the JSON instead of ending the run."""
        try:
            run()
        except Exception as exc:  # noqa: BLE001
            row[f"{name}_s"] = None
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  {name}: {row[f'{name}_error']}", flush=True)
        pool.free_all_blocks()

    def torch_peer():
        import torch

        Xt, Qt = torch.from_dlpack(X), torch.from_dlpack(Q)
        xn = (Xt * Xt).sum(1)

        def torch_user(s, e):
            q = Qt[s:e]
            D = (q * q).sum(1, keepdim=True) - 2 * q @ Xt.T + xn
            return torch.topk(D, k, dim=1, largest=False).indices

        try:
            t, done, outs = _chunked(torch_user, nq, 500, args.peer_budget)
            idx = cupy.from_dlpack(torch.cat(outs))
            row.update(torch_s=t, torch_queries_timed=done, torch_agreement=_agreement(ref, idx),
                       torch_chunk=500, torch_tf32=bool(torch.backends.cuda.matmul.allow_tf32),
                       torch_version=torch.__version__)
            print(f"  PyTorch user {t:.4f} s", flush=True)
        finally:
            del Xt, Qt, xn
            torch.cuda.empty_cache()

    def cupy_peer():
        xn = (X * X).sum(1)
        # argpartition keeps int64 temporaries of the whole block: a smaller chunk than the PyTorch user's
        chunk = max(1, min(500, int((4 << 30) // (m * 8 * 4))))

        def plain_cupy(s, e):
            q = Q[s:e]
            D = (q * q).sum(1)[:, None] - 2 * (q @ X.T) + xn[None, :]
            P = cupy.argpartition(D, k - 1, axis=1)[:, :k]
            order = cupy.argsort(cupy.take_along_axis(D, P, axis=1), axis=1)
            return cupy.take_along_axis(P, order, axis=1)

        t, done, outs = _chunked(plain_cupy, nq, chunk, args.peer_budget)
        row.update(cupy_s=t, cupy_queries_timed=done, cupy_chunk=chunk,
                   cupy_agreement=_agreement(ref, cupy.concatenate(outs)))
        print(f"  plain CuPy {t:.4f} s", flush=True)

    peer("torch", torch_peer)
    peer("cupy", cupy_peer)
    def sklearn_peer():
        from sklearn.neighbors import NearestNeighbors as SkNearestNeighbors

        ms, qs = min(m, 200_000), min(nq, 500)
        Xh, Qh = X[:ms].get(), Q[:qs].get()
        sk = SkNearestNeighbors(n_neighbors=k, algorithm="brute", n_jobs=-1).fit(Xh)
        sk.kneighbors(Qh[:10])
        t0 = time.perf_counter()
        sk.kneighbors(Qh)
        t = (time.perf_counter() - t0) * (m * nq) / (ms * qs)
        row.update(sklearn_s=t, sklearn_subsample=[ms, qs], sklearn_cores=os.cpu_count())
        print(f"  scikit-learn brute {t:.4f} s (scaled from {ms} rows x {qs} queries)", flush=True)

    if not args.no_sklearn:
        peer("sklearn", sklearn_peer)
    flops = peaks[0] if dtype == "float32" else peaks[1]
    row["floor_flop_s"] = 2.0 * d * m * nq / flops
    row["floor_read_s"] = m * d * np.dtype(dtype).itemsize / peaks[2]
    row["floor_s"] = max(row["floor_flop_s"], row["floor_read_s"])
    if row.get("torch_s"):
        row["speedup_vs_torch"] = row["torch_s"] / row["mpiml_s"]
    row["x_floor"] = row["mpiml_s"] / row["floor_s"]
    del X, Q, nn, ref
    cupy.get_default_memory_pool().free_all_blocks()
    print(f"  floor {row['floor_s']:.4f} s: mpiml at {row['x_floor']:.1f}x the floor", flush=True)
    return row


def _peers(args):
    peaks = _gpu_peak()
    cases = []
    for spec in args.cases.split(","):
        d, dtype, k = spec.split(":")
        cases.append(_peer_case(int(d), dtype, int(k), args, peaks))
    return {"floor": peaks[3] + "; floor = max(2 d FLOP a pair at the SIMT peak of the dtype, reading the index "
                                 "once)", "cases": cases}


# ---------------------------------------------------------------------- the driver
def _sklearn_baseline(args, most_pairs=1e11):
    """scikit-learn's brute force on every host core; above ``most_pairs`` (query, row) pairs, on
    fewer rows and queries drawn the same way, scaled by the pair count (the JSON says so)."""
    from sklearn.neighbors import NearestNeighbors as SkNearestNeighbors

    from ..comm import get_comm

    rows, queries = int(args.rows), int(args.queries)
    if rows * queries > most_pairs:
        rows, queries = min(rows, 200_000), min(queries, 1000)
    sub = argparse.Namespace(**{**vars(args), "rows": rows, "queries": queries})
    X, Q = _data(sub, get_comm("self"), "cpu")
    nn = SkNearestNeighbors(n_neighbors=args.k, metric=args.metric, algorithm="brute", n_jobs=-1).fit(X)
    nn.kneighbors(Q[:10])
    t0 = time.perf_counter()
    nn.kneighbors(Q)
    t = time.perf_counter() - t0
    scale = int(args.rows) * int(args.queries) / (rows * queries)
    return {"kneighbors_s": t * scale, "cores": os.cpu_count(), "subsample": [rows, queries], "scaled_by": scale}


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (["peers"] if result.get("peers") else []) + (["runs", "saved"] if result.get("runs") else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    axes = list(axes[0])
    if "peers" in panels:
        ax = axes.pop(0)
        cases = result["peers"]["cases"]
        names = [("mpiml_s", "mpiml"), ("torch_s", "PyTorch user"), ("cupy_s", "CuPy GEMM + argpartition"),
                 ("sklearn_s", "scikit-learn brute (scaled)"), ("floor_s", "floor")]
        x = np.arange(len(cases))
        w = 0.8 / len(names)
        for j, (key, label) in enumerate(names):
            ax.bar(x + (j - len(names) / 2 + 0.5) * w, [c.get(key) or np.nan for c in cases], w, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels([f"d={c['d']} {c['dtype'][-2:]}\nk={c['k']}" for c in cases], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("seconds")
        c0 = cases[0]
        ax.set_title(f"one GPU: {c0['queries']:.3g} queries vs {c0['rows']:.3g} rows", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    if "runs" in panels:
        ranks = [r["ranks"] for r in result["runs"]]
        ax = axes.pop(0)
        for v, marker in zip(VARIANTS, ("o-", "s-", "^-", "d-")):
            ax.plot(ranks, [r[f"{v}_s"] for r in result["runs"]], marker,
                    label=f"mpiml {'ring ' if v != 'local' else ''}{v}")
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
                     f"k={result['k']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes.pop(0)
        x = np.arange(len(ranks))
        for j, v in enumerate(VARIANTS[1:]):
            ax.bar(x + (j - 1) * 0.27, [r[f"{v}_saved_pct"] for r in result["runs"]], 0.27, label=v)
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
    if result.get("peers"):
        print(f"\n{result['peers']['floor']}")
        print(f"{'case':>18}{'mpiml s':>10}{'torch s':>10}{'cupy s':>10}{'sklearn s':>11}{'floor s':>10}"
              f"{'vs torch':>10}{'x floor':>9}")
        for c in result["peers"]["cases"]:
            def f(key, c=c):
                v = c.get(key)
                return f"{v:.4f}" if v else "-"
            vs = f"{c['speedup_vs_torch']:.1f}x" if c.get("speedup_vs_torch") else "-"
            print(f"{'d=%d %s k=%d' % (c['d'], c['dtype'], c['k']):>18}{f('mpiml_s'):>10}{f('torch_s'):>10}"
                  f"{f('cupy_s'):>10}{f('sklearn_s'):>11}{f('floor_s'):>10}{vs:>10}{c['x_floor']:>9.1f}")
    if not result.get("runs"):
        return
    sk = result.get("sklearn", {})
    print(f"\n{'ranks':>5}{'blocking s':>12}{'overlap s':>11}{'saved %':>9}{'onesided s':>12}{'saved %':>9}"
          f"{'local s':>10}{'auto':>7}{'speedup':>9}{'vs sklearn':>12}")
    for r in result["runs"]:
        speed = f"{sk['kneighbors_s'] / r['overlap_s']:.1f}x" if sk else "-"
        print(f"{r['ranks']:>5}{r['blocking_s']:>12.4f}{r['overlap_s']:>11.4f}{r['overlap_saved_pct']:>9.1f}"
              f"{r['onesided_s']:>12.4f}{r['onesided_saved_pct']:>9.1f}{r['local_s']:>10.4f}{r['auto_choice']:>7}"
              f"{r.get('speedup_vs_1', float('nan')):>8.2f}x{speed:>12}")
    if sk:
        how = "all rows" if sk.get("scaled_by", 1) == 1 else (f"{sk['subsample'][0]} rows x {sk['subsample'][1]} "
                                                              f"queries, scaled by {sk['scaled_by']:.3g}")
        print(f"scikit-learn brute force ({sk['cores']} cores, {how}): {sk['kneighbors_s']:.4f} s")


def main(argv):
    """Entry point of ``mpiml bench ml --algo knn``; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args, args.worker)
    from ._common import bench_launch_check

    status, ngpu = bench_launch_check(args.device, "mpiml bench ml --algo knn")
    if status is not None:
        return status
    device = "gpu" if ngpu else "cpu"
    if args.ranks is None:
        args.ranks = ",".join(str(r) for r in (1, 2, 4) if r <= ngpu) if ngpu else "1,2"
    ranks = [int(r) for r in args.ranks.split(",")]
    args.rows = args.rows or (1.6e7 if ngpu else 2e4)
    args.queries = args.queries or (4e4 if ngpu else 2e3)
    tag = args.tag or device
    os.makedirs(args.out, exist_ok=True)
    result = {"algo": "knn", "device": device, "dtype": args.dtype, "rows": args.rows, "queries": args.queries,
              "features": args.features, "k": args.k, "metric": args.metric, "machine": machine_info(),
              **stamp(["bench", "ml", *argv]), "runs": []}
    if args.part in ("all", "peers") and device == "gpu":
        result["peers"] = _peers(args)
    if args.part in ("all", "scaling"):
        code = _scaling(args, device, ranks, result)
        if code:
            return code
        if not args.no_sklearn:
            result["sklearn"] = _sklearn_baseline(args)
    base = os.path.join(args.out, f"ml_knn_{tag}")
    write_result(base, result, _plot, _print_table)
    return 0


def _scaling(args, device, ranks, result):
    """One MPI job per rank count (no idle ranks busy-polling a barrier beside the timed ones)."""
    from ..cli._options import mpiexec_command

    env = dict(os.environ)
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    for R in ranks:
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
    one = next((r for r in result["runs"] if r["ranks"] == 1), None)
    for r in result["runs"]:
        fastest = min(r[f"{v}_s"] for v in VARIANTS)
        r["fastest_s"] = fastest
        if one is not None:
            r["speedup_vs_1"] = min(one[f"{v}_s"] for v in VARIANTS) / fastest
    return 0
