"""Seed 001: Dask over ``mpi://`` against ``tcp://`` -- comm latency and throughput (host and CuPy frames),
the CuPy ``(x + x.T).sum()`` application and the sum of an array, workers on separate GPUs.

    python benchmarks/seeds/seed001_dask.py --device gpu --workers 1,2,4 --mpiexec "mpirun --allow-run-as-root" \
        --json seed001_4xh100.json --plot seed001_4xh100.png
    python benchmarks/seeds/seed001_dask.py --device cpu --quick          # the harness, on this machine

A driver (a plain process, like ``seed000_estimators.py``) that launches the Dask benchmarks of
``benchmarks/dask/`` and puts their results beside the document's figures:

1. comm level: ``mpiexec -n 2 benchmarks/dask/bench_comm.py`` (ranks on GPUs 0 and 1 with
   ``--device gpu``: CuPy frames, which ``mpi://`` moves by CUDA IPC or pipelined staging; NumPy
   frames on the CPU): ping-pong latency and windowed throughput from 1 B to ``--max-bytes``, both
   protocols in the same job.  Compared: the latency at 1 B and the throughput from 2 MB on (the
   document's two headline points).
2. applications, for each worker count W of ``--workers`` and each protocol (alternating):
   ``mpiexec -n W+2 python -m mpiml.dask`` (``benchmarks/dask/gpu_rank.py`` with ``--device gpu``:
   worker i on GPU i) running this script as the client (``--client``), which times, with
   ``benchmarks/dask/bench_apps.py``'s functions (median of ``--repeat`` after a warm-up; the
   transfers between workers that Dask logged): ``sum_transpose`` (``(x + x.T).sum()`` on an n x n
   random array, blocks placed by the scheduler), ``sum_transpose_rows`` (row block i on worker
   i mod W, so transposed blocks cross workers) and ``sum`` (``x.sum()``: only partial sums move).

The document (MPI4Dask over MVAPICH2-GDR, V100 nodes over InfiniBand) compares against UCX: 6x lower
latency at 1 B, 4x the throughput from 2 MB, ``(x + x.T).sum()`` 3.47x faster on average over 1-6
workers (1.71x on Frontera's RTX 5000 nodes, 1-32 workers), the cuDF merge 3.11x.  UCX-Py is not
installed on our hosts: our peer is Dask's ``tcp://``, measured in the same run; cuDF is not there
either, so the merge is not run here (``benchmarks/dask/run_apps.py`` times a pandas merge on CPUs).
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # as the client, this file runs through runpy, which does not add its folder
import _seeds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DASK_BENCH = os.path.join(ROOT, "benchmarks", "dask")
DOC = {
    "source": "shared/seeds/001 (MPI4Dask; in-house V100 cluster, 1-6 workers; Frontera RTX 5000, 1-32 workers)",
    "figure": "vs UCX: latency 6x lower at 1 B, throughput 4x from 2 MB; (x + x.T).sum() 3.47x faster "
              "(average, 1-6 workers; 1.71x on Frontera), cuDF merge 3.11x",
    "latency_1B_speedup": 6.0,
    "throughput_2MB_speedup": 4.0,
    "sum_transpose_speedup": 3.47,
    "sum_transpose_speedup_frontera": 1.71,
    "merge_speedup": 3.11,
    "their_peer": "Dask over UCX-Py (ucx://)",
}
BIG = 2 << 20  # "2 MBytes and beyond"


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--quick", action="store_true", help="1 worker, a 400 x 400 array, messages up to 4 MiB")
    ap.add_argument("--workers", default=None, help="Dask worker counts, one GPU each (default 1,2,4; --quick 1)")
    ap.add_argument("--protocols", default="mpi,tcp")
    ap.add_argument("-n", type=int, default=None, help="array side (default 8000 on GPUs, 4000 on CPUs; --quick 400)")
    ap.add_argument("--chunk", type=int, default=None, help="block side (default n / 4)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per app (median; default 5, --quick 1)")
    ap.add_argument("--max-bytes", type=int, default=None, help="comm sweep (default 64 MiB; --quick 4 MiB)")
    ap.add_argument("--parts", default="comm,apps")
    ap.add_argument("--mpiexec", default=None, help="launcher and its options (default: mpiexec on PATH)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per launch")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    # client mode (run by python -m mpiml.dask on rank 1)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.workers = args.workers or ("1" if args.quick else "1,2,4")
    args.n = args.n or (400 if args.quick else 8000 if args.device == "gpu" else 4000)
    args.chunk = args.chunk or max(1, args.n // 4)
    args.repeat = args.repeat or (1 if args.quick else 5)
    args.max_bytes = args.max_bytes or ((4 << 20) if args.quick else (64 << 20))
    return args


# ---------------------------------------------------------------------- the client (rank 1 of the Dask job)
def worker_device(device):
    """Run on each worker: the GPU it computes on (its PCI bus id) and the CUDA_VISIBLE_DEVICES it was given."""
    import os

    out = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if device == "gpu":
        try:
            import cupy

            out["pci_bus_id"] = cupy.cuda.runtime.deviceGetPCIBusId(cupy.cuda.Device().id)
        except Exception as exc:  # recorded, not raised: the timings still say what they measured
            out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def client_main(args):
    sys.path.insert(0, DASK_BENCH)
    import bench_apps

    from mpiml.dask import get_client

    client = get_client()
    workers = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    placed = client.run(worker_device, args.device)  # one GPU per worker? (gpu_rank.py's binding)
    gpus = {v.get("pci_bus_id") for v in placed.values()}
    known = args.device == "gpu" and not any("error" in v for v in placed.values())
    result = {"protocol": client.scheduler.address.split("://")[0], "workers": len(workers),
              "device": args.device, "n": args.n, "chunk": args.chunk, "repeat": args.repeat,
              "worker_devices": placed,
              "separate_gpus": len(gpus) == len(placed) if known else None,  # None: not known (CPU, or no bus id)
              "apps": {}}

    def record(name, layout, fn):
        median, times, value, transfers = bench_apps.timed_with_transfers(client, fn, args.repeat)
        result["apps"][name] = {"layout": layout, "seconds": median, "all_seconds": times, "value": value,
                                "transfers": transfers}

    for layout in ("scheduler", "rows"):
        run, x = bench_apps.sum_transpose(args.n, args.chunk, args.device, layout, client)
        record("sum_transpose" if layout == "scheduler" else "sum_transpose_rows", layout, run)
        if layout == "scheduler":
            record("sum", layout, lambda x=x: float(x.sum().compute()))
        del x, run
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


# ---------------------------------------------------------------------- the driver
def _launcher(args):
    if args.mpiexec:
        return shlex.split(args.mpiexec)
    here = os.path.dirname(sys.executable)  # a virtual environment used without activating it
    exe = shutil.which("mpiexec") or shutil.which("mpirun") or shutil.which("mpiexec", path=here)
    if exe is None:
        raise SystemExit("seed001_dask.py: no mpiexec on PATH (give --mpiexec)")
    return [exe]


def _env():
    env = dict(os.environ)
    # the workers import bench_apps too (the functions the client runs on them are pickled by module name)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), DASK_BENCH, env.get("PYTHONPATH")) if p)
    env.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def _launch(cmd, args, out):
    """Run one job; its JSON, or ``{"error": ...}`` with the end of its output."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-1500:]
        return {"error": f"timed out after {args.timeout} s: {tail!r}", "command": shlex.join(cmd)}
    if proc.returncode != 0 or not os.path.exists(out):
        return {"error": f"exit {proc.returncode}: " + (proc.stdout + proc.stderr)[-2000:], "command": shlex.join(cmd)}
    with open(out) as f:
        report = json.load(f)
    report["launch_seconds"] = time.perf_counter() - t0
    report["command"] = shlex.join(cmd)
    return report


def comm_part(args, tmp):
    out = os.path.join(tmp, "comm.json")
    budget = str(max(args.max_bytes, 1 << 20))
    cmd = [*_launcher(args), "-n", "2", sys.executable, os.path.join(DASK_BENCH, "bench_comm.py"),
           "--device", args.device, "--protocols", args.protocols, "--max-bytes", str(args.max_bytes),
           "--iters", "20" if args.quick else "50", "--budget", budget, "--out", out]
    return _launch(cmd, args, out)


def apps_part(args, tmp, save):
    runs = []
    for w in [int(v) for v in args.workers.split(",")]:
        for protocol in args.protocols.split(","):
            out = os.path.join(tmp, f"apps_{protocol}_{w}.json")
            entry = (["-m", "mpiml.dask"] if args.device == "cpu"
                     else [os.path.join(DASK_BENCH, "gpu_rank.py")])  # worker i on GPU i
            cmd = [*_launcher(args), "-n", str(w + 2), sys.executable, *entry, "--protocol", protocol,
                   os.path.abspath(__file__), "--client", "--out", out, "--device", args.device, "-n", str(args.n),
                   "--chunk", str(args.chunk), "--repeat", str(args.repeat)]
            run = _launch(cmd, args, out)
            run.setdefault("protocol", protocol)
            run.setdefault("workers", w)
            runs.append(run)
            save(runs)
            apps = {k: round(v["seconds"], 4) for k, v in run.get("apps", {}).items()}
            where = "" if run.get("separate_gpus") is None else (
                "; one GPU per worker" if run["separate_gpus"] else
                f"; workers SHARE GPUs: {sorted(str(v) for v in run['worker_devices'].values())}")
            print(f"apps {protocol:>3}:// {w} worker(s): {apps or run.get('error', '')[-400:]}{where}", flush=True)
    return runs


def summarise(comm, runs):
    s = {"comm": None, "apps": []}
    if comm and "results" in comm and {"mpi", "tcp"} <= set(comm["results"]):
        m, t = comm["results"]["mpi"], comm["results"]["tcp"]
        one = [(a, b) for a, b in zip(m, t) if a["bytes"] == 1]
        big = [b["throughput_MBps"] and a["throughput_MBps"] / b["throughput_MBps"]
               for a, b in zip(m, t) if a["bytes"] >= BIG]
        big = [v for v in big if v]
        s["comm"] = {
            "latency_1B_us": {"mpi": one[0][0]["latency_us"], "tcp": one[0][1]["latency_us"]} if one else None,
            "latency_1B_speedup": _seeds.ratio(one[0][1]["latency_us"], one[0][0]["latency_us"]) if one else None,
            "throughput_2MB_up_speedup_median": statistics.median(big) if big else None,
            "throughput_2MB_up_speedup_range": [min(big), max(big)] if big else None,
        }
        s["comm"]["latency_vs_document"] = _seeds.ratio(s["comm"]["latency_1B_speedup"], DOC["latency_1B_speedup"])
        s["comm"]["throughput_vs_document"] = _seeds.ratio(s["comm"]["throughput_2MB_up_speedup_median"],
                                                           DOC["throughput_2MB_speedup"])
    by = {(r["protocol"], r["workers"]): r for r in runs if "apps" in r}
    for (protocol, w), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        tcp = by.get(("tcp", w))
        if protocol != "mpi" or tcp is None:
            continue
        for app, v in r["apps"].items():
            u = tcp["apps"].get(app)
            if not u:
                continue
            speed = _seeds.ratio(u["seconds"], v["seconds"])
            s["apps"].append({"app": app, "workers": w, "mpi_s": v["seconds"], "tcp_s": u["seconds"],
                              "tcp_over_mpi": speed,
                              "values_agree": abs(v["value"] - u["value"]) <= 1e-9 * max(1.0, abs(u["value"])),
                              "bytes_moved_per_run": v["transfers"]["per_run"]["bytes"],
                              "separate_gpus": r.get("separate_gpus"),
                              "vs_document": _seeds.ratio(speed, DOC["sum_transpose_speedup"])
                              if app.startswith("sum_transpose") else None})
    return s


def plot(result, path):
    comm, apps = result.get("comm") or {}, result["summary"]["apps"]

    def draw(plt):
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
        for proto, rows in (comm.get("results") or {}).items():
            style = "-o" if proto == "mpi" else "k--s"
            axes[0].loglog([r["bytes"] for r in rows], [r["latency_us"] for r in rows], style, ms=3,
                           label=f"{proto}://")
            axes[1].loglog([r["bytes"] for r in rows], [r["throughput_MBps"] for r in rows], style, ms=3,
                           label=f"{proto}://")
        axes[0].set(xlabel="message (bytes)", ylabel="one-way latency (us)",
                    title=f"Dask comm latency, 2 ranks ({result['device']} frames)")
        axes[1].set(xlabel="message (bytes)", ylabel="MB/s", title="windowed throughput (document: 4x from 2 MB)")
        names = list(dict.fromkeys(a["app"] for a in apps))
        for name in names:
            pts = [a for a in apps if a["app"] == name]
            axes[2].plot([a["workers"] for a in pts], [a["tcp_over_mpi"] for a in pts], "-o", label=name)
        axes[2].axhline(DOC["sum_transpose_speedup"], color="0.5", ls=":", label="document (x + x.T).sum(), vs UCX")
        axes[2].axhline(1.0, color="k", lw=0.5)
        axes[2].set(xlabel="Dask workers (one GPU each)" if result["device"] == "gpu" else "Dask workers",
                    ylabel="tcp:// time / mpi:// time", title="applications: speed-up of mpi://")
        for ax in axes:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        return fig
    _seeds.plot_file(path, draw)


def main(argv=None):
    args = parse(argv)
    if args.client:
        return client_main(args)
    launched = max(int(os.environ.get(v, "1") or 1) for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))
    if launched > 1:  # every rank would launch the same jobs
        print("seed001_dask.py launches its Dask jobs itself: run it as one process (python ...), "
              f"not under mpiexec -n {launched}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    parts = args.parts.split(",")
    result = {"seed": "001", "experiment": "Dask mpi:// vs tcp://: comm, (x + x.T).sum(), x.sum()",
              "machine": _seeds.machine(), **_seeds.stamp(), "device": args.device, "workers": args.workers,
              "peer": "tcp:// (Dask's own), same machine, same run", "document": DOC, "comm": None, "apps": []}

    def save(runs=None):  # the JSON after every launch: a run cut short keeps what it measured
        if runs is not None:
            result["apps"] = runs
        result["summary"] = summarise(result["comm"], result["apps"])
        result["seconds"] = time.perf_counter() - t0
        _seeds.write_json(result, args.json)

    with tempfile.TemporaryDirectory() as tmp:
        comm = result["comm"] = comm_part(args, tmp) if "comm" in parts else None
        save()
        if comm and "error" in comm:
            print(f"comm sweep failed: {comm['error'][-600:]}", flush=True)
        elif comm:
            for proto, rows in comm["results"].items():
                for r in rows:
                    print(f"comm {proto:>3}:// {r['bytes']:>10} B  latency {r['latency_us']:9.1f} us  "
                          f"throughput {r['throughput_MBps']:9.1f} MB/s", flush=True)
        runs = apps_part(args, tmp, save) if "apps" in parts else []
    summary = result["summary"]
    c = summary["comm"] or {}
    print(f"\nseed 001 ({args.device}): speed-ups of mpi:// over tcp:// (document: over UCX)")
    print(f"comm: latency at 1 B {_seeds.fmt(c.get('latency_1B_speedup'))}x (document 6x); throughput from 2 MB "
          f"{_seeds.fmt(c.get('throughput_2MB_up_speedup_median'))}x median (document 4x)")
    for a in summary["apps"]:
        print(f"{a['app']:<20} {a['workers']} worker(s): mpi {a['mpi_s']:.4f} s, tcp {a['tcp_s']:.4f} s, "
              f"tcp/mpi {_seeds.fmt(a['tcp_over_mpi'])}, {a['bytes_moved_per_run']:.3g} B moved per run, "
              f"same value {a['values_agree']}")
    for w in dict.fromkeys(a["workers"] for a in summary["apps"]):
        got = {a["app"]: a for a in summary["apps"] if a["workers"] == w}
        st, rows_, sm = got.get("sum_transpose"), got.get("sum_transpose_rows"), got.get("sum")
        _seeds.readme_row([
            "001", f"{w} {'GPUs' if args.device == 'gpu' else 'CPU workers'}",
            "vs UCX: 6x latency at 1 B, 4x throughput from 2 MB, (x + x.T).sum() 3.47x",
            f"comm (2 ranks): {_seeds.fmt(c.get('latency_1B_speedup'))}x at 1 B, "
            f"{_seeds.fmt(c.get('throughput_2MB_up_speedup_median'))}x from 2 MB; (x + x.T).sum() "
            f"{_seeds.fmt(st and st['tcp_over_mpi'])}x (scheduler's placement), "
            f"{_seeds.fmt(rows_ and rows_['tcp_over_mpi'])}x (by rows); "
            f"x.sum() {_seeds.fmt(sm and sm['tcp_over_mpi'])}x",
            "tcp://", _seeds.fmt(rows_ and rows_["vs_document"]), result["command"]])
    plot(result, args.plot)
    failed = (comm and "error" in comm) or any("error" in r for r in runs)
    wrong = any(not a["values_agree"] for a in summary["apps"])
    return 1 if failed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
