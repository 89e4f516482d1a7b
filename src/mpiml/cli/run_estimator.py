"""``mpiml run linreg|logreg|rf|rfr|pca|tsvd|knn``: fit one estimator on every rank (SPMD) and report.

One options grammar for every estimator but k-means (``mpiml run kmeans``, in
:mod:`mpiml.cli.run`): ``--data`` names a generator (``regression:``,
``classification:``, ``lowrank:``, rank-count independent) or a ``.npy``/``.csv``
file (the target in the last column for supervised estimators); ``--json`` writes
a report with the timings, the score and the communication profile. Launches
itself under ``mpiexec`` (``srun`` inside a Slurm allocation) from a plain process.

As for k-means, the output paths, the device and the data's shape against the
options are checked before the fit; usage errors print once and exit 2 on every
rank, run-time errors are one line and exit 1 (``--debug`` for tracebacks).
"""

import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass

import numpy as np

from ._progress import prepare_cpu_kernels, blocked_knn_accuracy, fit_forest_in_batches, scale_hint
from ._options import aggregate_profile as _aggregate_profile
from ._options import gpu_count as _gpu_count
from ._options import launch_command
from ._options import strip_np as _strip_np
from ._report import ArgumentParser, UsageError, device_problems, output_problems, run_checked

__all__ = ["main", "JOBS", "parse_data_spec"]


def _threads_per_rank():
    """This rank's thread limit (imported here: the launching process must not pay for scikit-learn's
    import, which ``mpiml.utils`` brings, before it starts the ranks)."""
    from ..utils._threads import thread_info

    return thread_info().get("threads")


_SPECS = {
    "regression": {"n": 1000000, "d": 64, "t": 1, "noise": 1.0, "seed": 0},
    "classification": {"n": 1000000, "d": 64, "classes": 2, "seed": 0},
    "lowrank": {"n": 1000000, "d": 256, "rank": 32, "seed": 0},
}
_FLOATS = ("noise",)
#: Without a GPU: rows and features that a laptop-class CPU fits in seconds (the generators' other
#: parameters as above); the k-NN score searches every row's neighbours (n^2 pairs), hence its size.
_CPU_SIZES = {
    "linreg": {"n": 200000, "d": 64}, "logreg": {"n": 200000, "d": 64},
    "rf": {"n": 20000, "d": 32}, "rfr": {"n": 20000, "d": 32},
    "pca": {"n": 100000, "d": 128}, "tsvd": {"n": 100000, "d": 128},
    "knn": {"n": 20000, "d": 32},
}
#: Trees by default: on GPUs, and without one.
_TREES = {"gpu": 100, "cpu": 20}
#: How the fit's time grows with the rows, for the scale-up hint (the k-NN score: n^2).
_TIME_EXPONENT = {"knn": 2}


@dataclass(frozen=True)
class Job:
    """What ``mpiml run NAME`` fits: data kind, estimator, scikit-learn's twin and what to report."""

    data: str               # default generator kind: "regression", "classification" or "lowrank"
    supervised: bool
    make: object            # (args, comm) -> mpiml estimator
    reference: object       # args -> scikit-learn estimator
    score_name: str
    detail: object = None   # fitted estimator -> text


def _linreg(a, comm):
    from ..linear_model import LinearRegression

    return LinearRegression(solver=a.solver or "auto", comm=comm)


def _logreg(a, comm):
    from ..linear_model import LogisticRegression

    return LogisticRegression(C=a.C, solver=a.solver or "lbfgs", max_iter=a.max_iter, tol=a.tol, comm=comm)


def _forest(cls_name):
    def make(a, comm):
        from .. import ensemble

        return getattr(ensemble, cls_name)(n_estimators=a.trees, max_depth=a.max_depth, training=a.training,
                                           random_state=a.seed, comm=comm)
    return make


def _sk_forest(cls_name):
    def make(a):
        from sklearn import ensemble

        return getattr(ensemble, cls_name)(n_estimators=a.trees, max_depth=a.max_depth, random_state=a.seed,
                                           n_jobs=-1)
    return make


def _decomposition(cls_name):
    def make(a, comm):
        from .. import decomposition

        return getattr(decomposition, cls_name)(n_components=a.components, random_state=a.seed, comm=comm)
    return make


def _sk_decomposition(cls_name):
    def make(a):
        from sklearn import decomposition

        return getattr(decomposition, cls_name)(n_components=a.components, random_state=a.seed)
    return make


def _knn(a, comm):
    from ..neighbors import KNeighborsClassifier

    return KNeighborsClassifier(n_neighbors=a.neighbors, comm=comm)


def _sk_knn(a):
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier(n_neighbors=a.neighbors, algorithm="brute", n_jobs=-1)


def _sk_linear(name):
    def make(a):
        from sklearn import linear_model

        if name == "LinearRegression":
            return linear_model.LinearRegression()
        return linear_model.LogisticRegression(C=a.C, solver=a.solver or "lbfgs", max_iter=a.max_iter, tol=a.tol)
    return make


def _explained(est):
    return float(np.asarray(est.explained_variance_ratio_.get() if hasattr(est.explained_variance_ratio_, "get")
                            else est.explained_variance_ratio_).sum())


JOBS = {
    "linreg": Job("regression", True, _linreg, _sk_linear("LinearRegression"), "R²",
                  lambda e: f"rank {e.rank_}"),
    "logreg": Job("classification", True, _logreg, _sk_linear("LogisticRegression"), "accuracy",
                  lambda e: f"{int(e.n_iter_[0])} iterations, classes {e.classes_[:10].tolist()}"),
    "rf": Job("classification", True, _forest("RandomForestClassifier"), _sk_forest("RandomForestClassifier"),
              "accuracy", lambda e: f"{e.n_estimators} trees, {e.n_classes_} classes"),
    "rfr": Job("regression", True, _forest("RandomForestRegressor"), _sk_forest("RandomForestRegressor"), "R²",
               lambda e: f"{e.n_estimators} trees"),
    "pca": Job("lowrank", False, _decomposition("PCA"), _sk_decomposition("PCA"), "explained variance ratio",
               lambda e: f"{e.n_components_} components"),
    "tsvd": Job("lowrank", False, _decomposition("TruncatedSVD"), _sk_decomposition("TruncatedSVD"),
                "explained variance ratio", lambda e: f"{len(e.singular_values_)} components"),
    "knn": Job("classification", True, _knn, _sk_knn, "accuracy", lambda e: f"k = {e.n_neighbors}"),
}


def parse_data_spec(spec, algorithm, cpu=False):
    """``"regression:n=1000,d=8"`` -> ``("regression", {...})``; a path -> ``("file", {"path": ...})``.

    ``cpu``: the parameters not given take the CPU's sizes (``_CPU_SIZES``).
    """
    kind = spec.split(":", 1)[0]
    job = JOBS[algorithm]
    if kind in _SPECS:
        params = dict(_SPECS[kind])
        if cpu:
            params.update((key, v) for key, v in _CPU_SIZES[algorithm].items() if key in params)
        for item in filter(None, spec[len(kind):].lstrip(":").split(",")):
            if "=" not in item:
                raise ValueError(f"expected key=value in the data spec, got {item!r}")
            key, value = (s.strip() for s in item.split("=", 1))
            if key not in params:
                raise ValueError(f"unknown {kind} parameter {key!r} (known: {sorted(params)})")
            try:
                params[key] = float(value) if key in _FLOATS else int(float(value))
            except ValueError:
                raise ValueError(f"{kind} parameter {key} must be a number, got {value!r}") from None
            if key in ("n", "d", "t", "rank") and params[key] < 1 or key == "classes" and params[key] < 2:
                raise ValueError(f"{kind} parameter {key} is too small: {value!r}")
        if job.supervised and kind != job.data:  # unsupervised estimators take any generator's X
            raise ValueError(f"{algorithm} needs {job.data} data, got {kind!r}")
        return kind, params
    if not os.path.exists(spec):
        raise ValueError(f"--data: no such file {spec!r} (or use {'|'.join(_SPECS)}:...)")
    if not spec.endswith((".npy", ".csv", ".txt")):
        raise ValueError(f"--data: unknown file type {spec!r} (.npy or .csv"
                         f"{', target in the last column' if job.supervised else ''})")
    return "file", {"path": spec}


def _parser():
    p = ArgumentParser(prog="mpiml run " + "|".join(JOBS), description="Fit an estimator on every rank "
                                "(SPMD) and report time, score and communication.")
    p.add_argument("algorithm", choices=tuple(JOBS))
    p.add_argument("--np", type=int, default=None, help="ranks to launch when not already under MPI "
                   "(default: the Slurm allocation's tasks, else one per GPU, else 2)")
    p.add_argument("--data", default=None, help="regression:n=..,d=..,t=..,noise=..,seed=.. | "
                   "classification:n=..,d=..,classes=..,seed=.. | lowrank:n=..,d=..,rank=..,seed=.. | "
                   "a .npy/.csv file (supervised: target in the last column)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--backend", choices=("auto", "mpi", "nccl", "ipc"), default="auto")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--seed", type=int, default=0, help="random_state of the estimator")
    p.add_argument("--solver", default=None, help="linreg: normal|tsqr; logreg: lbfgs|newton-cholesky")
    p.add_argument("--C", type=float, default=1.0, help="logreg: inverse penalty strength")
    p.add_argument("--max-iter", type=int, default=100, help="logreg")
    p.add_argument("--tol", type=float, default=1e-4, help="logreg")
    p.add_argument("--trees", type=int, default=None, help=f"rf, rfr (default {_TREES['gpu']} on GPUs, "
                   f"{_TREES['cpu']} on CPUs)")
    p.add_argument("--max-depth", type=int, default=12, help="rf, rfr")
    p.add_argument("--training", choices=("global", "local"), default="global", help="rf, rfr")
    p.add_argument("--components", type=int, default=16, help="pca, tsvd")
    p.add_argument("--neighbors", type=int, default=10, help="knn")
    p.add_argument("--save", default=None, metavar="PATH", help="write the fitted model (mpiml.save)")
    p.add_argument("--json", default=None, metavar="PATH", help="write a report: timings, score, profile")
    p.add_argument("--compare-sklearn", action="store_true", help="rank 0 gathers the data and fits "
                   "scikit-learn's estimator with the same settings")
    p.add_argument("--debug", action="store_true", help="print the traceback of an error (on every rank "
                   "that has one) besides its one-line message")
    return p


def _load(kind, params, comm, xp, dtype, supervised):
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
    if kind == "lowrank":
        return datasets.make_low_rank_matrix(params["n"], params["d"], effective_rank=params["rank"],
                                             random_state=params["seed"], comm=comm, device=device,
                                             dtype=dtype), None
    path = params["path"]
    A = (datasets.load_npy(path, comm=comm, mmap=False, device=device) if path.endswith(".npy")
         else datasets.load_csv(path, comm=comm, dtype=dtype, device=device))
    A = A[0] if isinstance(A, tuple) else A
    A = xp.ascontiguousarray(A, dtype=dtype)
    if not supervised:
        return A, None
    return xp.ascontiguousarray(A[:, :-1]), A[:, -1].copy()


def _check_shape(args, n, d):
    """The options against the data's global shape (the same on every rank): a usage error if they cannot fit."""
    if n < 1:
        raise UsageError(f"--data {args.data}: no rows")
    if args.algorithm == "knn" and args.neighbors > n:
        raise UsageError(f"--neighbors {args.neighbors}: the data has {n} row(s), fewer than the neighbours "
                         "asked for")
    limit = min(n, d) if args.algorithm == "pca" else d
    if args.algorithm in ("pca", "tsvd") and args.components > limit:
        what = f"min(rows, features) = min({n}, {d})" if args.algorithm == "pca" else f"the {d} features"
        raise UsageError(f"--components {args.components}: more than {what}")


def _score(job, est, X, y, comm, say, cpu):
    if cpu and job.make is _knn:  # the search of every row: in query blocks, with progress
        return blocked_knn_accuracy(est, X, y, comm, say)
    return est.score(X, y) if job.supervised else _explained(est)


#: Estimators with compiled CPU kernels (Numba, compiled on first use and cached): a small fit first.
_CPU_KERNELS = ("rf", "rfr", "knn", "linreg", "logreg")


def _small_fit(job, args, X, y):
    """A fit of this rank's first rows on its own (the kernels the real fit runs, compiled or loaded)."""
    from ..comm import get_comm

    rows = min(int(X.shape[0]), 2000)
    est = job.make(args, get_comm("self"))
    if hasattr(est, "n_estimators"):
        est.set_params(n_estimators=2)
    est.fit(X[:rows], y[:rows]) if job.supervised else est.fit(X[:rows])
    if job.make is _knn:
        est.kneighbors(X[:min(rows, 64)])


def _fit(job, est, X, y, say, cpu):
    if cpu and hasattr(est, "n_estimators") and est.n_estimators > 1:  # forests: trees in batches, with progress
        return fit_forest_in_batches(est, X, y, say)
    return est.fit(X, y) if job.supervised else est.fit(X)


def _run(args, comm):
    import mpiml

    job = JOBS[args.algorithm]
    ngpu = _gpu_count() if args.device in ("auto", "gpu") else 0
    if ngpu:
        import cupy as xp

        # local rank mod visible GPUs; CuPy's kernels of this run compile ahead (mpiml.kernels._cupy_warm)
        mpiml.init(device="gpu", warm=[f"run-{args.algorithm}"])
    else:
        xp = np
        mpiml.init(device="cpu")  # this rank's threads: its share of the node's cores
    kind, params = parse_data_spec(args.data, args.algorithm, cpu=not ngpu)
    if args.trees is None:
        args.trees = _TREES["gpu" if ngpu else "cpu"]
    say = (lambda *a: print(*a, flush=True)) if comm.rank == 0 else (lambda *a: None)
    t0 = time.perf_counter()
    X, y = _load(kind, params, comm, xp, np.dtype(args.dtype), job.supervised)
    if job.data == "classification" and kind == "file":
        y = y.astype(xp.int64)
    load_s = time.perf_counter() - t0
    n_total = comm.allreduce_obj(int(X.shape[0])) if comm.size > 1 else int(X.shape[0])
    _check_shape(args, n_total, int(X.shape[1]))
    where = f"{min(ngpu, comm.size)} GPU(s)" if ngpu else "CPU"
    est = job.make(args, comm)
    threads = "" if ngpu else f", {_threads_per_rank()} thread(s) each"
    say(f"mpiml run {args.algorithm}: {type(est).__name__} on {n_total} x {X.shape[1]} {args.dtype}, "
        f"{comm.size} rank(s) on {where}{threads} (data ready in {load_s:.2f} s)")
    if not ngpu and args.algorithm in _CPU_KERNELS:
        prepare_cpu_kernels(lambda: _small_fit(job, args, X, y), comm, say)
    comm.barrier()
    t0 = time.perf_counter()
    with mpiml.profile() as prof:
        _fit(job, est, X, y, say, cpu=not ngpu)
        if xp is not np:
            xp.cuda.get_current_stream().synchronize()
    fit_s = time.perf_counter() - t0
    fit_s = comm.allreduce_obj(fit_s, op="max") if comm.size > 1 else fit_s
    say(f"fit: {fit_s:.3f} s, {job.detail(est)}")
    t0 = time.perf_counter()
    score = float(_score(job, est, X, y, comm, say, cpu=not ngpu))
    score_s = time.perf_counter() - t0
    say(f"{job.score_name} over all ranks: {score:.6f} ({score_s:.2f} s)")
    say("communication during fit (calls of rank 0, seconds = slowest rank):")
    profile = _aggregate_profile(comm, prof)
    say(prof.format(profile))
    if args.save:
        mpiml.save(est, args.save)
        say(f"model saved to {args.save}")
    if kind != "file":
        exponent = _TIME_EXPONENT.get(args.algorithm, 1)
        say(scale_hint(args.algorithm, kind, n_total, fit_s + (score_s if exponent > 1 else 0), exponent, comm.size))
    report = {"algorithm": args.algorithm, "estimator": type(est).__name__, "ranks": comm.size, "device": where,
              "rows": n_total, "features": int(X.shape[1]), "dtype": args.dtype, "data": args.data,
              "load_seconds": load_s, "fit_seconds": fit_s, "score_seconds": score_s,
              "score_name": job.score_name, "score": score, "threads_per_rank": _threads_per_rank(),
              "communication": profile}
    if args.compare_sklearn:
        report["scikit_learn"] = _compare_sklearn(args, job, comm, X, y, xp, fit_s, score, say)
    if args.json and comm.rank == 0:
        report.update(machine=platform.node(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                      command="mpiml run " + " ".join(args.argv))
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
        say(f"report written to {args.json}")
    return 0


def _compare_sklearn(args, job, comm, X, y, xp, fit_s, score, say):
    arrays = (X, y) if job.supervised else (X,)
    total = comm.allreduce_obj(int(sum(a.nbytes for a in arrays))) if comm.size > 1 else \
        int(sum(a.nbytes for a in arrays))
    if total > (4 << 30):
        say(f"--compare-sklearn: skipped, the data ({total / 2**30:.1f} GiB) is too large to gather")
        return None
    host = [a.get() if xp is not np else np.asarray(a) for a in arrays]
    full = [comm.gatherv(np.ascontiguousarray(a), root=0) if comm.size > 1 else a for a in host]
    out = None
    if comm.rank == 0:
        ref = job.reference(args)
        t0 = time.perf_counter()
        ref.fit(*full)
        sk_s = time.perf_counter() - t0
        sk_score = float(ref.score(*full) if job.supervised else np.sum(ref.explained_variance_ratio_))
        say(f"scikit-learn {type(ref).__name__} (one process): {sk_s:.3f} s, {job.score_name} {sk_score:.6f}; "
            f"mpiml {fit_s:.3f} s (speed-up {sk_s / fit_s:.1f}x), {job.score_name} {score:.6f}")
        out = {"fit_seconds": sk_s, "score": sk_score}
    if comm.size > 1:
        comm.barrier()
    return out


def main(argv):
    """Entry point of ``mpiml run ALGORITHM`` for every estimator but k-means; returns the exit status."""
    from ..comm import launched_by_mpi

    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.data is None:
        args.data = JOBS[args.algorithm].data
    try:
        parse_data_spec(args.data, args.algorithm)
    except ValueError as exc:
        parser.error(str(exc))
    for name in ("max_iter", "trees", "max_depth", "components", "neighbors", "np"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "max_iter" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'max_iter' else 1}, got {value}")
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
            cmd = launch_command(n, _strip_np(argv))
            print("launching: " + " ".join(cmd), flush=True)
            from ..utils._threads import child_env

            # each rank takes its share of the cores (mpiml.utils._threads)
            return subprocess.call(cmd, env=child_env())
    return run_checked("mpiml run", args, _run)
