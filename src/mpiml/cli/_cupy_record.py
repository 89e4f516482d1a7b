"""Record which CuPy kernels the estimators compile, and write the manifest that :mod:`._cupy_warm` ships.

    PYTHONPATH=src python3 -m mpiml.cli._cupy_record --out $OUT/cupy_kernels.json.gz [--jobs 4]

On a GPU host: each workload below runs in a process of its own (``--jobs`` at a time, the GPUs shared
round-robin), under :class:`._cupy_warm.Recorder`, with the warm-up off; the parts are merged in the
order of :data:`WORKLOADS` (an entry keeps every workload that needed it as a tag) and written as gzipped
JSON with the CuPy and NVRTC versions.  Commit the result as ``src/mpiml/kernels/cupy_kernels.json.gz``.
The workloads are those of ``benchmarks/gpu/first_fit.py`` (10^6 x 32 rows, float32 and float64) with
their predictions, ``mpiml run`` of every algorithm on one rank, and ``mpiml run kmeans`` on 2 ranks
(what a communicator of several ranks adds; skipped without 2 GPUs and ``mpiexec``).  Entries of mpiml's own kernels
(the loader's fallback to ``RawModule``) are left out: the package ships those.
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROWS = 1_000_000


def _data(dtype):
    """The rows of benchmarks/gpu/first_fit.py (same calls, so the same kernels)."""
    import cupy

    rs = cupy.random.RandomState(0)
    X = rs.standard_normal((ROWS, 32), dtype=dtype)
    yc = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(cupy.int32)
    yr = X @ cupy.arange(32, dtype=dtype) / 32
    return X, yc, yr


def _fits(name, X, yc, yr):
    from mpiml import cluster, decomposition, ensemble, linear_model, neighbors

    if name == "kmeans":
        m = cluster.KMeans(n_clusters=32, random_state=0).fit(X)
        m.predict(X)
        m.transform(X[:1000])
    elif name == "rf":
        m = ensemble.RandomForestClassifier(n_estimators=10, max_depth=8, random_state=0).fit(X, yc)
        m.predict(X)
        m.predict_proba(X[:1000])
    elif name == "rfr":
        ensemble.RandomForestRegressor(n_estimators=4, max_depth=8, random_state=0).fit(X, yr).predict(X)
    elif name == "logreg":
        m = linear_model.LogisticRegression().fit(X, yc)
        m.predict(X)
        m.predict_proba(X[:1000])
    elif name == "linreg":
        m = linear_model.LinearRegression().fit(X, yr)
        m.predict(X)
        m.score(X, yr)
    elif name == "pca":
        decomposition.PCA(n_components=8).fit(X).transform(X)
        decomposition.TruncatedSVD(n_components=8).fit(X).transform(X[:1000])
    elif name == "knn":
        neighbors.NearestNeighbors(n_neighbors=10).fit(X).kneighbors(X[:10000])
        neighbors.KNeighborsClassifier(n_neighbors=10).fit(X, yc).predict(X[:10000])
    else:
        raise ValueError(name)


def _run_cli(argv):
    from mpiml.cli import main

    code = main(argv)
    if code:
        raise RuntimeError(f"mpiml {' '.join(argv)} exited {code}")


#: workload -> what it runs; the estimators' tags are ``mpiml run``'s algorithm names
WORKLOADS = {
    "data": None, "kmeans": None, "logreg": None, "linreg": None, "pca": None, "knn": None, "rf": None, "rfr": None,
    "run-kmeans": ["run", "kmeans", "--np", "1", "--device", "gpu", "--data", "blobs:n=4000000,d=32,k=32",
                   "--max-iter", "20", "--quiet"],
    "run-linreg": ["run", "linreg", "--np", "1", "--device", "gpu", "--data", "regression:n=200000"],
    "run-logreg": ["run", "logreg", "--np", "1", "--device", "gpu", "--data", "classification:n=200000"],
    "run-rf": ["run", "rf", "--np", "1", "--device", "gpu", "--data", "classification:n=200000", "--trees", "4"],
    "run-rfr": ["run", "rfr", "--np", "1", "--device", "gpu", "--data", "regression:n=200000", "--trees", "4"],
    "run-pca": ["run", "pca", "--np", "1", "--device", "gpu", "--data", "lowrank:n=200000"],
    "run-tsvd": ["run", "tsvd", "--np", "1", "--device", "gpu", "--data", "lowrank:n=200000"],
    "run-knn": ["run", "knn", "--np", "1", "--device", "gpu", "--data", "classification:n=50000,d=32"],
}
#: workloads run under mpiexec on this many ranks (one GPU each), and the tag they record under
MPI_WORKLOADS = {"run-kmeans-np2": (2, "run-kmeans")}
WORKLOADS["run-kmeans-np2"] = WORKLOADS["run-kmeans"]


def own_kernel(entry):
    """An entry of mpiml's own kernels (compiled by the loader's fallback), which the package ships."""
    return any(n.startswith("mpiml_") for n in entry.get("name_expressions") or ())


def record_one(name, part):
    """Run workload ``name`` under the recorder; write its manifest to ``part``."""
    import cupy

    import mpiml
    from mpiml.kernels import _cupy_warm

    mpiml.init(device="gpu", warm=False)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")) or 0)
    if name in MPI_WORKLOADS:
        part = f"{part}.{rank}"
    tag = MPI_WORKLOADS.get(name, (1, name))[1]
    t = time.perf_counter()
    with _cupy_warm.Recorder() as rec:
        if name == "data" or WORKLOADS[name] is None:
            for dtype in (cupy.float32, cupy.float64):
                with rec.tagged("data"):
                    X, yc, yr = _data(dtype)
                if name != "data":
                    with rec.tagged(name):
                        _fits(name, X, yc, yr)
                del X, yc, yr
        else:
            with rec.tagged(tag):
                _run_cli(WORKLOADS[name])
        cupy.cuda.Device().synchronize()
    manifest = rec.manifest(workload=name, seconds=round(time.perf_counter() - t, 2))
    manifest["entries"] = [e for e in manifest["entries"] if not own_kernel(e)]
    with open(part, "w") as f:
        json.dump(manifest, f)


def _mpiexec(n):
    """The launch command of ``n`` ranks (Open MPI: no binding, root allowed), or None."""
    exe = os.environ.get("MPIML_MPIEXEC") or shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        return None
    cmd = [exe, "-n", str(n)]
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.lower()
    if "open mpi" in version or "openrte" in version:
        cmd += ["--bind-to", "none", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return cmd


def _read_parts(name, part):
    """The manifest(s) a workload wrote: one, or one per rank (merged)."""
    if name not in MPI_WORKLOADS:
        with open(part) as f:
            return json.load(f)
    from mpiml.kernels import _cupy_warm

    found = sorted(glob.glob(part + ".*"))
    if not found:
        raise FileNotFoundError(part + ".*")
    ms = []
    for path in found:
        with open(path) as f:
            ms.append(json.load(f))
    out = _cupy_warm.merge(ms)
    out["recorded"] = ms[0]["recorded"]
    return out


def _gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))
    except (OSError, subprocess.SubprocessError):
        return 1


def main(argv=None):
    from mpiml.kernels import _cupy_warm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), _cupy_warm.MANIFEST))
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads, comma-separated")
    ap.add_argument("--jobs", type=int, default=None, help="workloads at once (default: 8, at most half the cores)")
    ap.add_argument("--timeout", type=float, default=170, help="seconds per workload")
    ap.add_argument("--workload", default=None, help=argparse.SUPPRESS)   # a child: one workload
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.workload:
        record_one(args.workload, args.part)
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown workloads {unknown} (known: {list(WORKLOADS)})")
    ngpu = _gpus()
    jobs = args.jobs or max(1, min(8, (os.cpu_count() or 2) // 2))
    t0 = time.perf_counter()
    parts, failed = {}, {}
    with tempfile.TemporaryDirectory(prefix="mpiml-cupy-record-") as tmp:
        queue = list(enumerate(names))
        running = []
        while queue or running:
            while queue and len(running) < jobs:
                i, name = queue.pop(0)
                env = dict(os.environ, MPIML_CUPY_WARM="0", CUDA_VISIBLE_DEVICES=str(i % ngpu))
                for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):   # a plain process, never an MPI rank
                    env.pop(var, None)
                for var, value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                                   ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):   # no NVLink multicast (DEVICE.md)
                    env.setdefault(var, value)
                part = os.path.join(tmp, name + ".json")
                cmd = [sys.executable, "-m", "mpiml.cli._cupy_record", "--workload", name, "--part", part]
                if name in MPI_WORKLOADS:
                    n = MPI_WORKLOADS[name][0]
                    launch = _mpiexec(n)
                    if launch is None or ngpu < n:
                        print(f"{name:12s} skipped: needs mpiexec and {n} GPUs", flush=True)
                        continue
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(n))
                    cmd = launch + cmd
                log = open(os.path.join(tmp, name + ".log"), "w+")
                p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                running.append((name, part, p, log, time.perf_counter()))
            time.sleep(0.2)
            for item in list(running):
                name, part, p, log, started = item
                if p.poll() is None and time.perf_counter() - started < args.timeout:
                    continue
                if p.poll() is None:
                    p.kill()
                    p.wait()
                running.remove(item)
                log.seek(0)
                tail = log.read()[-1500:]
                log.close()
                got = None
                if p.returncode == 0:
                    with contextlib.suppress(OSError, ValueError):
                        got = _read_parts(name, part)
                if got is not None:
                    parts[name] = got
                    print(f"{name:12s} {len(parts[name]['entries']):4d} modules, "
                          f"{parts[name]['recorded']['seconds']:.1f} s", flush=True)
                else:
                    failed[name] = tail
                    print(f"{name:12s} FAILED (exit {p.returncode}):\n{tail}", flush=True)
    if not parts:
        print("nothing recorded")
        return 1
    manifest = _cupy_warm.merge([parts[n] for n in names if n in parts])
    manifest["recorded"] = {"workloads": [n for n in names if n in parts], "failed": sorted(failed),
                            "seconds": round(time.perf_counter() - t0, 1), "rows": ROWS}
    try:
        import cupy

        manifest["recorded"]["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        manifest["recorded"]["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception:  # noqa: BLE001 - descriptive only
        pass
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    _cupy_warm.write_manifest(args.out, manifest)
    tags = {}
    for e in manifest["entries"]:
        for t in e["tags"]:
            tags[t] = tags.get(t, 0) + 1
    print(f"wrote {args.out}: {len(manifest['entries'])} modules (CuPy {manifest['cupy']}, NVRTC "
          f"{manifest['nvrtc']}), {os.path.getsize(args.out) / 1024:.0f} KiB; per tag {tags}; "
          f"{manifest['recorded']['seconds']} s" + (f"; FAILED: {sorted(failed)}" if failed else ""))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
