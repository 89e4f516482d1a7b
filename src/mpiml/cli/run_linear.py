"""``mpiml run linreg|logreg``: fit a linear model on every rank (SPMD) and report time, fit and communication.

Launches itself under ``mpiexec`` (``srun`` inside a Slurm allocation) when
started from a plain process, like ``mpiml run kmeans``.  The data are
generated on every rank (``regression:...`` / ``classification:...``,
rank-count independent) or read from a file whose last column is the target.
"""

import argparse
import os
import subprocess
import time

import numpy as np

from .run import _aggregate_profile, _gpu_count, _strip_np, launch_command

__all__ = ["main"]

_SPECS = {
    "regression": {"n": 1000000, "d": 64, "t": 1, "noise": 1.0, "seed": 0},
    "classification": {"n": 1000000, "d": 64, "classes": 2, "seed": 0},
}


def parse_data_spec(spec, algorithm):
    """``"regression:n=1000,d=8"`` -> ``("regression", {...})``; a path -> ``("file", {"path": ...})``."""
    kind = spec.split(":", 1)[0]
    if kind in _SPECS:
        params = dict(_SPECS[kind])
        for item in filter(None, spec[len(kind):].lstrip(":").split(",")):
            if "=" not in item:
                raise ValueError(f"expected key=value in the data spec, got {item!r}")
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in params:
                raise ValueError(f"unknown {kind} parameter {key!r} (known: {sorted(params)})")
            try:
                params[key] = float(value) if key == "noise" else int(float(value))
            except ValueError:
                raise ValueError(f"{kind} parameter {key} must be a number, got {value!r}") from None
            if key in ("n", "d", "t") and params[key] < 1 or key == "classes" and params[key] < 2:
                raise ValueError(f"{kind} parameter {key} is too small: {value!r}")
        if (kind == "regression") != (algorithm == "linreg"):
            raise ValueError(f"{algorithm} needs {'regression' if algorithm == 'linreg' else 'classification'} data")
        return kind, params
    if not os.path.exists(spec):
        raise ValueError(f"--data: no such file {spec!r} (or use regression:... / classification:...)")
    if not spec.endswith((".npy", ".csv", ".txt")):
        raise ValueError(f"--data: unknown file type {spec!r} (.npy or .csv, target in the last column)")
    return "file", {"path": spec}


def _parser():
    p = argparse.ArgumentParser(prog="mpiml run linreg|logreg", description="Fit LinearRegression (linreg) or "
                                "LogisticRegression (logreg) on every rank (SPMD) and report time, score and "
                                "communication.")
    p.add_argument("algorithm", choices=("linreg", "logreg"))
    p.add_argument("--np", type=int, default=None, help="ranks to launch when not already under MPI "
                   "(default: one per GPU, else 2)")
    p.add_argument("--data", default=None, help="regression:n=..,d=..,t=..,noise=..,seed=.. | "
                   "classification:n=..,d=..,classes=..,seed=.. | a .npy/.csv file (target: last column)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--backend", choices=("auto", "mpi", "nccl", "ipc"), default="auto")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--solver", default=None, help="linreg: normal|tsqr; logreg: lbfgs|newton-cholesky")
    p.add_argument("--C", type=float, default=1.0, help="logreg: inverse penalty strength")
    p.add_argument("--max-iter", type=int, default=100)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--save", default=None, metavar="PATH", help="write the fitted model (mpiml.save)")
    p.add_argument("--compare-sklearn", action="store_true", help="rank 0 gathers the data and fits "
                   "scikit-learn's estimator with the same settings")
    return p


def _load(kind, params, comm, xp, dtype):
    from .. import datasets

    device = "gpu" if xp is not np else "cpu"
    if kind == "regression":
        return datasets.make_regression(params["n"], params["d"], n_informative=params["d"], n_targets=params["t"],
                                        noise=params["noise"], random_state=params["seed"], comm=comm,
                                        device=device, dtype=dtype)
    if kind == "classification":
        d = params["d"]
        return datasets.make_classification(params["n"], d, n_informative=max(2, d // 2), n_redundant=0,
                                            n_classes=params["classes"], random_state=params["seed"], comm=comm,
                                            device=device, dtype=dtype)
    path = params["path"]
    A = (datasets.load_npy(path, comm=comm, mmap=False, device=device) if path.endswith(".npy")
         else datasets.load_csv(path, comm=comm, dtype=dtype, device=device))
    A = A[0] if isinstance(A, tuple) else A
    A = xp.ascontiguousarray(A, dtype=dtype)
    return xp.ascontiguousarray(A[:, :-1]), A[:, -1].copy()


def _estimator(args, comm):
    from ..linear_model import LinearRegression, LogisticRegression

    if args.algorithm == "linreg":
        return LinearRegression(solver=args.solver or "auto", comm=comm)
    return LogisticRegression(C=args.C, solver=args.solver or "lbfgs", max_iter=args.max_iter, tol=args.tol,
                              comm=comm)


def _run(args, comm):
    import mpiml

    kind, params = parse_data_spec(args.data, args.algorithm)
    ngpu = _gpu_count() if args.device in ("auto", "gpu") else 0
    if args.device == "gpu" and ngpu == 0:
        raise RuntimeError("--device gpu: CuPy sees no GPU here")
    if ngpu:
        import cupy as xp

        mpiml.init(device="gpu")  # local rank mod visible GPUs; honours CUDA_VISIBLE_DEVICES
    else:
        xp = np
    say = (lambda *a: print(*a, flush=True)) if comm.rank == 0 else (lambda *a: None)
    t0 = time.perf_counter()
    X, y = _load(kind, params, comm, xp, np.dtype(args.dtype))
    if args.algorithm == "logreg" and kind == "file":
        y = y.astype(xp.int64)
    n_total = comm.allreduce_obj(int(X.shape[0])) if comm.size > 1 else int(X.shape[0])
    where = f"{min(ngpu, comm.size)} GPU(s)" if ngpu else "CPU"
    est = _estimator(args, comm)
    say(f"mpiml run {args.algorithm}: {type(est).__name__} on {n_total} x {X.shape[1]} {args.dtype}, "
        f"{comm.size} rank(s) on {where} (data ready in {time.perf_counter() - t0:.2f} s)")
    comm.barrier()
    t0 = time.perf_counter()
    with mpiml.profile() as prof:
        est.fit(X, y)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
    fit_s = time.perf_counter() - t0
    fit_s = comm.allreduce_obj(fit_s, op="max") if comm.size > 1 else fit_s
    score = est.score(X, y)
    detail = (f"rank {est.rank_}" if args.algorithm == "linreg"
              else f"{int(est.n_iter_[0])} iterations, {est._n_fun_evals} function evaluations, "
                   f"classes {est.classes_[:10].tolist()}")
    say(f"fit: {fit_s:.3f} s, {detail}; {'R²' if args.algorithm == 'linreg' else 'accuracy'} over all ranks: "
        f"{score:.6f}")
    say("communication during fit (calls of rank 0, seconds = slowest rank):")
    say(prof.format(_aggregate_profile(comm, prof)))
    if args.save:
        mpiml.save(est, args.save)
        say(f"model saved to {args.save}")
    if args.compare_sklearn:
        _compare_sklearn(args, comm, X, y, xp, est, fit_s, say)
    return 0


def _compare_sklearn(args, comm, X, y, xp, est, fit_s, say):
    from sklearn import linear_model as sk

    total = comm.allreduce_obj(int(X.nbytes)) if comm.size > 1 else int(X.nbytes)
    if total > (4 << 30):
        say(f"--compare-sklearn: skipped, the data ({total / 2**30:.1f} GiB) is too large to gather")
        return
    host = [a.get() if xp is not np else np.asarray(a) for a in (X, y)]
    full = [comm.gatherv(np.ascontiguousarray(a), root=0) if comm.size > 1 else a for a in host]
    if comm.rank == 0:
        ref = (sk.LinearRegression() if args.algorithm == "linreg"
               else sk.LogisticRegression(C=args.C, solver=args.solver or "lbfgs", max_iter=args.max_iter,
                                          tol=args.tol))
        t0 = time.perf_counter()
        ref.fit(*full)
        sk_s = time.perf_counter() - t0
        mine = est.coef_.get() if xp is not np else est.coef_
        diff = float(np.max(np.abs(mine - ref.coef_)) / max(np.max(np.abs(ref.coef_)), 1e-300))
        say(f"scikit-learn {type(ref).__name__} (one process): {sk_s:.3f} s; mpiml {fit_s:.3f} s "
            f"(speed-up {sk_s / fit_s:.1f}x); largest coefficient difference {diff:.2e} of the largest coefficient")
    if comm.size > 1:
        comm.barrier()


def main(argv):
    """Entry point of ``mpiml run linreg|logreg``; returns the exit status."""
    from ..comm import get_comm, launched_by_mpi

    parser = _parser()
    args = parser.parse_args(argv)
    if args.data is None:
        args.data = "regression" if args.algorithm == "linreg" else "classification"
    try:
        parse_data_spec(args.data, args.algorithm)
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_iter < 0:
        parser.error(f"--max-iter must be at least 0, got {args.max_iter}")
    if args.np is not None and args.np < 1:
        parser.error(f"--np must be at least 1, got {args.np}")
    if not launched_by_mpi():
        n = args.np
        if n is None and os.environ.get("SLURM_NTASKS", "").isdigit():
            n = int(os.environ["SLURM_NTASKS"])  # the allocation's task count
        if n is None:
            n = (_gpu_count() if args.device != "cpu" else 0) or 2
        if n > 1:
            cmd = launch_command(n, _strip_np(argv))
            print("launching: " + " ".join(cmd), flush=True)
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
            return subprocess.call(cmd, env=env)
    return _run(args, get_comm(args.backend))
