"""``mpiml run ALGORITHM``: the main job -- fit an estimator SPMD and show where the time went.

Outside an MPI launch, ``--np N`` (default: the Slurm allocation's task count, else
one rank per GPU, else 2) re-launches the same command under ``srun -n N`` inside a
Slurm allocation (``SLURM_JOB_ID`` set) and under ``mpiexec -n N`` elsewhere.  Under MPI every rank parses the same
arguments, loads or generates its shard, fits inside :func:`mpiml.profile`, and rank 0
prints the fit time, iterations, inertia and the communication profile aggregated over ranks.

Checks come before the work: the output paths (``--save``, where rank 0 writes), the
device on every rank and the data's shape against the options (``--k`` rows at least)
are checked and agreed before the fit. A usage error is printed once (rank 0) and
exits 2 on every rank; a run-time error (a bad value in a file, a failed fit) is one
line and exit status 1; ``--debug`` adds the tracebacks (see :mod:`mpiml.cli._report`).
"""

import os
import re
import subprocess
import time

import numpy as np

from ._progress import prepare_cpu_kernels, scale_hint
from ._options import aggregate_profile as _aggregate_profile
from ._options import gpu_count as _gpu_count
from ._options import launch_command, mpiexec_command, srun_command  # noqa: F401 (also imported from here)
from ._options import strip_np as _strip_np
from ._report import ArgumentParser, UsageError, device_problems, output_problems, run_checked

__all__ = ["main", "launch_command", "mpiexec_command", "srun_command", "parse_data_spec"]


def _threads_per_rank():
    """This rank's thread limit (imported here: the launching process must not pay for scikit-learn's
    import, which ``mpiml.utils`` brings, before it starts the ranks)."""
    from ..utils._threads import thread_info

    return thread_info().get("threads")


ALGORITHMS = ("kmeans", "linreg", "logreg", "rf", "rfr", "pca", "tsvd", "knn")
DEFAULT_DATA = "blobs:n=200000,d=32,k=16"


# ---------------------------------------------------------------------- arguments
def parse_data_spec(spec):
    """``"blobs:n=1000,d=8,k=4,seed=0"`` -> ``("blobs", {...})``; a path -> ``("file", {"path": ...})``."""
    if spec.startswith("blobs"):
        params = {"n": 200000, "d": 32, "k": 16, "seed": 0, "std": 1.0}
        rest = spec[len("blobs"):].lstrip(":")
        for item in filter(None, rest.split(",")):
            if "=" not in item:
                raise ValueError(f"expected key=value in the data spec, got {item!r}")
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in params:
                raise ValueError(f"unknown blobs parameter {key!r} (known: {sorted(params)})")
            try:
                params[key] = float(value) if key == "std" else int(float(value))
            except ValueError:
                raise ValueError(f"blobs parameter {key} must be a number, got {value!r}") from None
            if key != "std" and key != "seed" and params[key] < 1:
                raise ValueError(f"blobs parameter {key} must be at least 1, got {value!r}")
        return "blobs", params
    if not os.path.exists(spec):
        raise ValueError(f"--data: no such file {spec!r} (or use blobs:n=...,d=...,k=...)")
    if not re.search(r"\.(npy|csv|txt|svm|libsvm|svmlight)$", spec):
        raise ValueError(f"--data: unknown file type {spec!r} (.npy, .csv, .svm)")
    return "file", {"path": spec}


def _parser():
    p = ArgumentParser(prog="mpiml run", description="Fit an estimator on every rank (SPMD) and report "
                                "time, result and communication profile.")
    p.add_argument("algorithm", nargs="?", default="kmeans", choices=ALGORITHMS)
    p.add_argument("--np", type=int, default=None, help="ranks to launch when not already under MPI "
                   "(default: one per GPU, else 2)")
    p.add_argument("--data", default=DEFAULT_DATA, help=f"blobs:n=..,d=..,k=..[,seed=..] or a .npy/.csv/.svm file "
                   f"(default {DEFAULT_DATA})")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--backend", choices=("auto", "mpi", "nccl", "ipc"), default="auto")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--k", type=int, default=None, help="clusters (default: the blobs' k, else 8)")
    p.add_argument("--max-iter", type=int, default=100)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--init", default="k-means||", choices=("k-means||", "k-means++", "random"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, metavar="PATH", help="write the fitted model (mpiml.save)")
    p.add_argument("--compare-sklearn", action="store_true", help="rank 0 gathers the data and fits "
                   "scikit-learn's KMeans with the same settings")
    p.add_argument("--quiet", action="store_true", help="no per-iteration lines")
    p.add_argument("--debug", action="store_true", help="print the traceback of an error (on every rank "
                   "that has one) besides its one-line message")
    return p


# ---------------------------------------------------------------------- the job
def _load(kind, params, comm, xp, dtype):
    from .. import datasets

    device = "gpu" if xp.__name__ == "cupy" else "cpu"
    if kind == "blobs":
        X, _ = datasets.make_blobs(params["n"], params["d"], centers=params["k"], cluster_std=params["std"],
                                   random_state=params["seed"], comm=comm, device=device, dtype=dtype)
        return X
    path = params["path"]
    if path.endswith(".npy"):
        X = datasets.load_npy(path, comm=comm, mmap=False, device=device)
    elif path.endswith((".csv", ".txt")):
        X = datasets.load_csv(path, comm=comm, dtype=dtype, device=device)
    else:
        X, _ = datasets.load_svmlight(path, comm=comm, dtype=dtype)
        X = xp.asarray(X.toarray())
    if isinstance(X, tuple):
        X = X[0]
    return xp.ascontiguousarray(X, dtype=dtype)


def _run(args, comm):
    import mpiml

    kind, params = parse_data_spec(args.data)
    ngpu = _gpu_count() if args.device in ("auto", "gpu") else 0
    if ngpu:
        import cupy as xp

        # local rank mod visible GPUs; honours CUDA_VISIBLE_DEVICES. CuPy's kernels of this run compile ahead,
        # in the background, split among the node's ranks (mpiml.kernels._cupy_warm)
        mpiml.init(device="gpu", warm=["run-kmeans"])
    else:
        xp = np
        mpiml.init(device="cpu")  # this rank's threads: its share of the node's cores
    from ..cluster import KMeans  # after init: scikit-learn's imports (1-2 s) overlap the warm-up's compiles

    rank0 = comm.rank == 0
    say = (lambda *a: print(*a, flush=True)) if rank0 else (lambda *a: None)

    t0 = time.perf_counter()
    X = _load(kind, params, comm, xp, np.dtype(args.dtype))
    n_total = comm.allreduce_obj(int(X.shape[0])) if comm.size > 1 else int(X.shape[0])
    k = args.k or (params["k"] if kind == "blobs" else 8)
    if k > n_total:
        raise UsageError(f"--k {k}: the data has {n_total} row(s), fewer than the {k} clusters asked for")
    where = f"{ngpu and min(ngpu, comm.size) or 0} GPU(s)" if ngpu else \
        f"CPU, {_threads_per_rank()} thread(s) each"
    say(f"mpiml run kmeans: {n_total} x {X.shape[1]} {args.dtype}, k={k}, init={args.init}, "
        f"{comm.size} rank(s) on {where}, backend={args.backend} (data ready in {time.perf_counter() - t0:.2f} s)")

    km = KMeans(k, init=args.init, max_iter=args.max_iter, tol=args.tol, random_state=args.seed,
                verbose=0 if args.quiet else 1, comm=comm)
    if not ngpu:  # the Lloyd kernel compiled (first run on this machine) or loaded on rank 0 first, with a line
        from ..comm import get_comm

        rows = min(int(X.shape[0]), 2000)
        prepare_cpu_kernels(lambda: KMeans(max(1, min(k, rows)), n_init=1, max_iter=2, random_state=0,
                                           comm=get_comm("self")).fit(X[:rows]), comm, say)
    comm.barrier()
    t0 = time.perf_counter()
    with mpiml.profile() as prof:
        km.fit(X)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
    fit_s = time.perf_counter() - t0
    fit_s = comm.allreduce_obj(fit_s, op="max") if comm.size > 1 else fit_s
    iters = list(getattr(km, "_iter_seconds", []))
    per_iter = float(np.median(iters)) if iters else float("nan")
    say(f"fit: {fit_s:.3f} s, {km.n_iter_} iterations ({1e3 * per_iter:.3f} ms per Lloyd iteration, median), "
        f"inertia {km.inertia_:.6g}")
    agg = _aggregate_profile(comm, prof)
    say("communication during fit (calls of rank 0, seconds = slowest rank):")
    say(prof.format(agg))

    if args.save:
        mpiml.save(km, args.save)
        say(f"model saved to {args.save}")
    if kind == "blobs":
        say(scale_hint("kmeans", "blobs", n_total, fit_s, 1, comm.size))
    if args.compare_sklearn:
        _compare_sklearn(args, comm, X, k, xp, fit_s, km, say)
    return 0


def _compare_sklearn(args, comm, X, k, xp, fit_s, km, say):
    from sklearn.cluster import KMeans as SkKMeans

    total_bytes = comm.allreduce_obj(int(X.nbytes)) if comm.size > 1 else int(X.nbytes)
    if total_bytes > (4 << 30):
        say(f"--compare-sklearn: skipped, the data ({total_bytes / 2**30:.1f} GiB) is too large to gather")
        return
    Xh = X.get() if xp is not np else np.asarray(X)
    full = comm.gatherv(np.ascontiguousarray(Xh), root=0) if comm.size > 1 else Xh
    if comm.rank == 0:
        init = "k-means++" if args.init == "k-means||" else args.init
        sk = SkKMeans(k, init=init, n_init=1, max_iter=args.max_iter, tol=args.tol, random_state=args.seed)
        t0 = time.perf_counter()
        sk.fit(full)
        sk_s = time.perf_counter() - t0
        say(f"scikit-learn KMeans (init={init}, one process): {sk_s:.3f} s, {sk.n_iter_} iterations, "
            f"inertia {sk.inertia_:.6g}")
        say(f"mpiml: {fit_s:.3f} s, {km.n_iter_} iterations, inertia {km.inertia_:.6g} "
            f"(inertia ratio mpiml / scikit-learn = {km.inertia_ / sk.inertia_:.4f}, speed-up {sk_s / fit_s:.1f}x)")
    if comm.size > 1:
        comm.barrier()


def main(argv):
    """Entry point of ``mpiml run``; returns the exit status."""
    from ..comm import launched_by_mpi

    from .run_estimator import JOBS

    if argv and argv[0] in JOBS:
        from .run_estimator import main as run_estimator

        return run_estimator(argv)
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        parse_data_spec(args.data)
    except ValueError as exc:
        parser.error(str(exc))
    if args.k is not None and args.k < 1:
        parser.error(f"--k must be at least 1, got {args.k}")
    if args.max_iter < 1:
        parser.error(f"--max-iter must be at least 1, got {args.max_iter}")
    if args.np is not None and args.np < 1:
        parser.error(f"--np must be at least 1, got {args.np}")
    if not launched_by_mpi():
        problems = output_problems(args) + device_problems(args)
        if problems:  # found here, before any rank starts
            parser.error("; ".join(problems))
        n = args.np
        if n is None and os.environ.get("SLURM_NTASKS", "").isdigit():
            n = int(os.environ["SLURM_NTASKS"])  # the allocation's task count
        if n is None:
            n = (_gpu_count() if args.device != "cpu" else 0) or 2
        if n > 1:
            rest = _strip_np(argv)
            cmd = launch_command(n, rest)
            print("launching: " + " ".join(cmd), flush=True)
            from ..utils._threads import child_env

            # each rank takes its share of the cores (mpiml.utils._threads)
            return subprocess.call(cmd, env=child_env())
    return run_checked("mpiml run", args, _run)
