"""Run bench_apps.py over mpi:// and tcp:// with 1..4 workers and merge the results.

    python benchmarks/dask/run_apps.py --out benchmarks/results/dask_apps_vm.json

Each (workers, protocol) pair is one ``mpiexec -n workers+2 python -m
mpiml.dask --protocol P bench_apps.py`` launch; the protocols alternate for
every worker count so both see the same machine load. Extra arguments after
``--`` go to bench_apps.py (e.g. ``-- -n 2000 --rows 200000``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def launch_command(mpiexec, workers, protocol, out, extra, launcher_args):
    return [
        *shlex.split(mpiexec), "-n", str(workers + 2), sys.executable, "-m", "mpiml.dask",
        "--protocol", protocol, *launcher_args, os.path.join(HERE, "bench_apps.py"),
        "--out", out, *extra,
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "dask_apps.json"))
    parser.add_argument("--workers", default="1,2,3,4")
    parser.add_argument("--protocols", default="mpi,tcp")
    parser.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    parser.add_argument("--launcher-args", default="", help="options for python -m mpiml.dask")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- arguments for bench_apps.py")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH")) if p)
    env.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")

    runs, commands = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for workers in [int(w) for w in args.workers.split(",")]:
            for protocol in args.protocols.split(","):
                out = os.path.join(tmp, f"{protocol}-{workers}.json")
                cmd = launch_command(args.mpiexec, workers, protocol, out, extra,
                                     shlex.split(args.launcher_args))
                commands.append(shlex.join(cmd))
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=args.timeout)
                if proc.returncode != 0 or not os.path.exists(out):
                    print(proc.stdout[-3000:], proc.stderr[-5000:], file=sys.stderr)
                    raise SystemExit(f"{protocol} with {workers} workers failed ({proc.returncode})")
                with open(out) as f:
                    run = json.load(f)
                run["launch_seconds"] = time.perf_counter() - t0
                runs.append(run)
                apps = {k: (round(v["seconds"], 4) if isinstance(v, dict) else v)
                        for k, v in run["apps"].items()}
                print(f"{protocol:>4} workers={workers}: {apps}", flush=True)

    ratios = []
    by_key = {(r["protocol"], r["workers"]): r for r in runs}
    for (protocol, workers), run in sorted(by_key.items()):
        tcp = by_key.get(("tcp", workers))
        if protocol != "mpi" or tcp is None:
            continue
        for app, m in run["apps"].items():
            t = tcp["apps"].get(app)
            if isinstance(m, dict) and isinstance(t, dict):
                ratios.append({"app": app, "workers": workers,
                               "tcp_seconds_over_mpi_seconds": t["seconds"] / m["seconds"]})
    report = {
        "benchmark": "dask applications over mpi:// and tcp:// (python -m mpiml.dask)",
        "machine": {"hostname": platform.node(), "cpu_count": os.cpu_count()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "launches": commands,
        "runs": runs,
        "ratios": ratios,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    for r in ratios:
        print(f"{r['app']:>14} workers={r['workers']}: tcp/mpi time = "
              f"{r['tcp_seconds_over_mpi_seconds']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
