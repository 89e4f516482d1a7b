"""``mpiml bench ml --algo linreg|logreg|ridge|tsvd``: fit time on 1..N ranks against scikit-learn.

The driver (a plain process) launches one MPI job of ``max(--ranks)`` ranks;
inside it, sub-communicators of each rank count fit the same global dataset
(strong scaling; mpiml's generators are rank-count independent, so every
configuration sees the same rows).  Each fit is timed ``--repeats`` times
after a warm-up; the time of a fit is the slowest rank's.  On GPUs rank 0 also
times a plain-CuPy normal-equations least squares on the one-rank data.

The driver then regenerates the same dataset in one process and times
scikit-learn on every host core, on all rows when they fit under
``--sklearn-rows`` (for logreg the objective values are then compared), else
on the first ``--sklearn-rows`` rows with the time scaled by the row ratio
(marked ``"extrapolated"`` in the JSON).  Rank 0 measures the copy bandwidth and float64
GEMM rate of its device first; each configuration's floor (see :func:`_floor`) is reported
beside its time.  Results: a table on the terminal,
``ml_<algo>_<tag>.json`` and ``.png``.

``--sparse DENSITY`` draws a CSR matrix instead (SciPy on CPU ranks, ``cupyx`` on GPU
ranks; every row holds ``round(DENSITY * features)`` stored values at uniform random
columns, drawn per block of 65536 global rows so that the matrix does not depend on the
rank count), the use of sparse Ridge (``sparse_cg`` beyond 2048 features) and
TruncatedSVD; scikit-learn fits the same CSR rows.  On one GPU rank the obvious plain-CuPy
peer is timed too: ``cupyx.scipy.sparse.linalg.svds`` for tsvd, ``cupyx`` CG on
``XᵀX + alpha I`` (no intercept) for ridge.  Also runnable as
``python -m mpiml.bench.ml_linear ...``.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ._common import FirstRows as _FirstRows
from ._common import machine_info, stamp, write_result

__all__ = ["main"]

ALGOS = ("linreg", "logreg", "ridge", "tsvd")

#: Global rows per block of the sparse generator (the unit of its random streams).
_SPARSE_BLOCK_ROWS = 1 << 16


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml", description="Linear-model benchmark: fit time on 1..N "
                                "ranks (strong scaling) against scikit-learn on the host cores.")
    p.add_argument("--algo", choices=ALGOS, required=True)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 1,2,4 up to the GPUs "
                   "present; 1,2 on CPU)")
    p.add_argument("--rows", type=float, default=None, help="global rows (default: linreg 1e8 / logreg 1e7 on "
                   "GPUs, dense ridge/tsvd 1e7, sparse 1e6; 2e5 on CPU)")
    p.add_argument("--features", type=int, default=None, help="default: linreg 64, logreg 128, ridge/tsvd 256 "
                   "dense, 100000 sparse")
    p.add_argument("--sparse", type=float, default=0.0, metavar="DENSITY",
                   help="CSR data with this fraction of stored values per row (0: dense)")
    p.add_argument("--classes", type=int, default=2, help="logreg classes")
    p.add_argument("--components", type=int, default=16, help="tsvd components")
    p.add_argument("--n-iter", type=int, default=5, help="tsvd power iterations (both libraries)")
    p.add_argument("--alpha", type=float, default=1.0, help="ridge penalty")
    p.add_argument("--solver", default=None, help="linreg: normal|tsqr|lsqr (default normal); "
                   "logreg: lbfgs|newton-cholesky|newton-cg (default lbfgs); ridge: any of Ridge's (default "
                   "auto); tsvd: randomized|arpack (default randomized)")
    p.add_argument("--tol", type=float, default=None, help="logreg and ridge tolerance (both libraries; default "
                   "logreg 1e-6, ridge 1e-4)")
    p.add_argument("--max-iter", type=int, default=200, help="logreg iterations (both libraries)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sklearn-rows", type=float, default=None, help="scikit-learn fits at most this many rows "
                   "(default: all rows on CPU; 1e7 linreg / all logreg rows on GPU hosts)")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--no-peer", action="store_true", help="skip the plain-CuPy peer of the sparse fits (cupyx "
                   "svds takes ~20 s on 10^8 stored values)")
    p.add_argument("--out", default="benchmarks/results", help="directory of the JSON and PNG")
    p.add_argument("--tag", default=None, help="file name part (default gpu or cpu)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


# ---------------------------------------------------------------------- data and estimators
def _sparse_rows(start, stop, d, density, dtype):
    """Rows ``start:stop`` of the global sparse benchmark matrix (host CSR) and their targets.

    Each block of ``_SPARSE_BLOCK_ROWS`` global rows is drawn from its own
    stream (seeded by the block index), so any split of the rows over ranks
    sees the same matrix.  A row holds ``max(1, round(density * d))`` values
    in ``[0, 1)`` (TF-IDF-like) at uniform columns (duplicates summed); the
    target is ``X w + noise`` with a fixed ``w``.
    """
    import scipy.sparse as sp

    k = max(1, int(round(density * d)))
    w = np.random.default_rng(12345).standard_normal(d)
    blocks, targets = [], []
    B = _SPARSE_BLOCK_ROWS
    for b in range(start // B, (stop - 1) // B + 1 if stop > start else start // B):
        lo, hi = max(start, b * B), min(stop, (b + 1) * B)
        rng = np.random.default_rng([7, b])
        cols = np.sort(rng.integers(0, d, size=(B, k), dtype=np.int64), axis=1).astype(np.int32)
        vals = rng.random((B, k), dtype=np.float64)
        noise = rng.standard_normal(B)
        rows = slice(lo - b * B, hi - b * B)
        c, v = cols[rows], vals[rows]
        block = sp.csr_matrix((v.ravel().astype(dtype), c.ravel(), np.arange(0, c.size + 1, k)), shape=(c.shape[0], d))
        block.sum_duplicates()
        blocks.append(block)
        targets.append(block @ w + noise[rows])
    if not blocks:
        return sp.csr_matrix((0, d), dtype=dtype), np.zeros(0)
    return sp.vstack(blocks, format="csr"), np.concatenate(targets)


def _data(args, comm, device):
    from ..datasets import make_classification, make_regression, shard_bounds

    n, d, dtype = int(args.rows), args.features, np.dtype(args.dtype)
    if args.sparse:
        X, y = _sparse_rows(*shard_bounds(n, comm.size, comm.rank), d, args.sparse, dtype)
        if device == "gpu":
            import cupy
            import cupyx.scipy.sparse as csp

            X, y = csp.csr_matrix(X), cupy.asarray(y)
        return X, y.astype(dtype)
    if args.algo == "logreg":
        return make_classification(n, d, n_informative=max(2, d // 2), n_redundant=0, n_classes=args.classes,
                                   random_state=0, comm=comm, device=device, dtype=dtype)
    return make_regression(n, d, n_informative=d, noise=1.0, random_state=0, comm=comm, device=device, dtype=dtype)


def _estimator(args, comm=None):
    from ..decomposition import TruncatedSVD
    from ..linear_model import LinearRegression, LogisticRegression, Ridge

    if args.algo == "linreg":
        return LinearRegression(solver=args.solver or "normal", comm=comm)
    if args.algo == "ridge":
        return Ridge(alpha=args.alpha, solver=args.solver or "auto", tol=args.tol, comm=comm)
    if args.algo == "tsvd":
        return TruncatedSVD(args.components, algorithm=args.solver or "randomized", n_iter=args.n_iter,
                            random_state=0, comm=comm)
    return LogisticRegression(solver=args.solver or "lbfgs", tol=args.tol, max_iter=args.max_iter, comm=comm)


def _sync(xp):
    if xp is not np:
        xp.cuda.Device().synchronize()


def _plain_cupy_linreg(X, y, xp, repeats):
    """Seconds of the obvious single-GPU normal equations: ``(XᵀX - n m mᵀ) w = Xᵀy - n m ȳ``."""
    def fit():
        n = X.shape[0]
        m, ym = X.mean(axis=0), y.mean()
        G = X.T @ X - n * xp.outer(m, m)
        b = X.T @ y - n * m * ym
        return xp.linalg.solve(G, b)

    return _best_seconds(fit, xp, repeats)


def _plain_cupy_sparse(args, X, y, xp, repeats):
    """Seconds of the obvious single-GPU ``cupyx`` equivalent on the one-rank CSR data.

    tsvd: ``cupyx.scipy.sparse.linalg.svds(X, k)`` (thick-restart Lanczos);
    ridge: ``cupyx.scipy.sparse.linalg.cg`` on ``(XᵀX + alpha I) w = Xᵀy``
    (no intercept, the same ``tol``).
    """
    import cupyx.scipy.sparse.linalg as sla

    if args.algo == "tsvd":
        def fit():
            return sla.svds(X, k=args.components)
    else:
        d = X.shape[1]
        XT = X.T.tocsr()
        op = sla.LinearOperator((d, d), matvec=lambda v: XT @ (X @ v) + args.alpha * v, dtype=X.dtype)
        rhs = XT @ y

        def fit():
            return sla.cg(op, rhs, rtol=args.tol)
    return _best_seconds(fit, xp, repeats)


def _best_seconds(fit, xp, repeats):
    """Fastest of ``repeats`` timed calls of ``fit`` after one warm-up call, the device synchronised."""
    fit()
    _sync(xp)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit()
        _sync(xp)
        times.append(time.perf_counter() - t0)
    return min(times)


def _passes(args, est):
    """Passes over the shard the fit makes (products with ``X``), from the algorithm's structure.

    ridge: ``"sparse_cg"`` makes 2 per iteration plus the means and the
    right-hand side; ``"lsqr"`` 2 per iteration plus 2; direct solvers 2.
    tsvd (randomized): ``X Ω``, 2 per power iteration, ``Qᵀ X``, the
    projection and the two variance passes.
    """
    if args.algo == "tsvd":   # sparse: the two variance passes read only Xᵀ's values, about one pass together
        extra = 4 if args.sparse else 5
        return 2 * args.n_iter + extra if est.algorithm == "randomized" else 2 * int(getattr(est, "n_iter_", 1)) + 4
    iters = getattr(est, "_n_krylov_iter", None)
    return 2 + 2 * int(np.sum(iters)) if iters is not None else 2


def _floor(args, row, n_local, itemsize, rates, nnz=None):
    """Seconds the slowest rank cannot beat: its reads of the shard or its flops.

    linreg (normal equations, with intercept): two reads (means, then Gram)
    and ``2 n d²`` flops.  logreg: per function evaluation two reads
    (``X W`` and ``Gᵀ X``) and ``4 n d m`` flops, times the evaluations.
    ridge, tsvd: the passes of :func:`_passes`, each a read of the shard
    (dense: ``n d`` values; CSR: ``nnz`` values and column indices, ``n + 1``
    row pointers) and ``2 n d b`` (dense) or ``2 nnz b`` (CSR) flops for
    ``b`` right-hand sides (1 for ridge, ``components + 10`` for tsvd).  Sparse tsvd: each pass also
    moves the ``n x b`` dense block once, at the datasheet bandwidth of a known GPU.
    """
    d = args.features
    nbytes = n_local * d * itemsize if nnz is None else nnz * (itemsize + 4) + (n_local + 1) * 4
    bw, flops = rates["copy_bandwidth_Bps"], rates["gemm_flops"]
    if args.algo == "tsvd" and nnz is not None:
        # a sparse product also reads or writes the dense block of the rows (n x b values) once, and the
        # bandwidth is the datasheet's where the GPU is known (the measured copy rate is lower: a kinder floor)
        nbytes += n_local * (args.components + 10) * itemsize
        bw = rates.get("datasheet_Bps") or bw
    if args.algo == "linreg":
        return max(2 * nbytes / bw, 2.0 * n_local * d * d / flops)
    if args.algo in ("ridge", "tsvd"):
        b = 1 if args.algo == "ridge" else args.components + 10
        work = 2.0 * (n_local * d if nnz is None else nnz) * b
        return row["passes"] * max(nbytes / bw, work / flops)
    m = 1 if args.classes == 2 else args.classes
    return row["fun_evals"] * max(2 * nbytes / bw, 4.0 * n_local * d * m / flops)


def _generate(args, sub, R, use_gpu, results):
    """This configuration's data in ``results["_data"]``; False (on every rank of ``sub``) if any rank failed.

    A rank short of memory must not leave the others waiting in a collective:
    the failure is agreed and the configuration recorded as skipped.
    """
    from ..utils._validation import agree_on_error

    error = None
    try:
        results["_data"] = _data(args, sub, "gpu" if use_gpu else "cpu")
    except Exception as exc:  # typically out of memory at the largest size per rank
        error = exc
    try:
        agree_on_error(sub, error, error_class=RuntimeError, prefix=f"data for {R} rank(s)")
    except Exception as exc:
        results.pop("_data", None)
        if use_gpu:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
        if sub.rank == 0:
            results["runs"].append({"ranks": R, "skipped": f"{type(exc).__name__}: {exc}"[:400]})
            print(f"ranks={R}: skipped ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
        return False
    return True


def _worker(args, outfile):
    import mpiml

    from ..comm import get_comm

    world = get_comm()
    use_gpu = args.device == "gpu"
    if use_gpu:
        import cupy as xp

        from .. import init

        init(device="gpu")  # local rank mod visible GPUs
    else:
        xp = np
    results = {"runs": []}
    if world.rank == 0:
        from ._common import measure_rates as _measure_rates

        results["rates"] = _measure_rates(xp, np.float64)  # the solvers accumulate in float64
        if use_gpu:
            from .ml_decomp import _gpu_rates

            rates = _gpu_rates(xp)
            if rates[4] == "datasheet":
                results["rates"]["datasheet_Bps"] = rates[1]
    for R in [int(r) for r in args.ranks.split(",")]:
        sub = world.split(0 if world.rank < R else None, key=world.rank)
        if sub is not None and _generate(args, sub, R, use_gpu, results):
            X, y = results.pop("_data")
            est = _estimator(args, sub)
            est.fit(X, y)  # warm-up (kernel compilation, memory pools)
            times = []
            for _ in range(args.repeats):
                sub.barrier()
                t0 = time.perf_counter()
                est.fit(X, y)
                _sync(xp)
                local = time.perf_counter() - t0
                times.append(sub.allreduce_obj(local, op="max") if sub.size > 1 else local)
            with mpiml.profile() as prof:
                est.fit(X, y)
            ops = prof.summary()["ops"]
            n_max = sub.allreduce_obj(int(X.shape[0]), op="max") if sub.size > 1 else int(X.shape[0])
            nnz = int(X.nnz) if args.sparse else None
            nnz_max = (sub.allreduce_obj(nnz, op="max") if sub.size > 1 else nnz) if args.sparse else None
            if sub.rank == 0:
                row = {"ranks": R, "fit_s": min(times), "fit_s_median": float(np.median(times)),
                       "collectives": {op: {"calls": o["calls"], "bytes": o["bytes"]} for op, o in ops.items()}}
                if args.algo == "logreg":
                    row["n_iter"] = int(est.n_iter_[0])
                    row["fun_evals"] = int(est._n_fun_evals)
                    row["coef"] = np.asarray(est.coef_.get() if use_gpu else est.coef_).tolist()
                    row["intercept"] = np.asarray(est.intercept_.get() if use_gpu else est.intercept_).tolist()
                if args.algo in ("ridge", "tsvd"):
                    row["passes"] = _passes(args, est)
                    host = (lambda a: np.asarray(a.get() if use_gpu else a))
                    if args.algo == "ridge":
                        row["solver"] = est.solver_
                        row["coef_head"] = host(est.coef_)[:1000].tolist()
                        row["coef_norm"] = float(np.linalg.norm(host(est.coef_)))
                    else:
                        row["singular_values"] = host(est.singular_values_).tolist()
                if R == 1 and use_gpu and args.algo == "linreg":
                    row["plain_cupy_fit_s"] = _plain_cupy_linreg(X, y, xp, args.repeats)
                if R == 1 and use_gpu and args.sparse and args.algo in ("ridge", "tsvd") and not args.no_peer:
                    try:  # one timed run after a warm-up: the peer may be slow, the budget is small
                        row["plain_cupy_fit_s"] = _plain_cupy_sparse(args, X, y, xp, 1)
                    except Exception as exc:  # a peer that fails is reported, not fatal
                        row["plain_cupy_error"] = f"{type(exc).__name__}: {exc}"[:300]
                row["n_per_rank_max"] = n_max
                if args.sparse:
                    row["nnz_per_rank_max"] = nnz_max
                row["floor_s"] = _floor(args, row, n_max, np.dtype(args.dtype).itemsize, results["rates"], nnz_max)
                row["ratio_to_floor"] = row["fit_s"] / row["floor_s"]
                results["runs"].append(row)
                extra = f", plain CuPy {row['plain_cupy_fit_s']:.4f} s" if "plain_cupy_fit_s" in row else ""
                print(f"ranks={R}: fit {row['fit_s']:.4f} s (median {row['fit_s_median']:.4f}){extra}", flush=True)
            del X, y, est
            if use_gpu:
                xp.get_default_memory_pool().free_all_blocks()
        world.barrier()
    if world.rank == 0:
        with open(outfile, "w") as f:
            json.dump(results, f)
    return 0


# ---------------------------------------------------------------------- scikit-learn on the host
def _logistic_objective(X, y, coef, intercept, C, classes):
    """scikit-learn's objective: mean log loss + ||W||² / (2 C n)."""
    from sklearn.metrics import log_loss

    scores = X @ np.asarray(coef).T + np.asarray(intercept)
    if scores.shape[1] == 1:
        p1 = 1 / (1 + np.exp(-scores[:, 0]))
        proba = np.column_stack([1 - p1, p1])
    else:
        scores -= scores.max(axis=1, keepdims=True)
        proba = np.exp(scores)
        proba /= proba.sum(axis=1, keepdims=True)
    coef = np.asarray(coef)
    return float(log_loss(y, proba, labels=classes)) + float((coef * coef).sum()) / (2 * C * X.shape[0])


def _sklearn_baseline(args, result):
    from sklearn import linear_model as sk
    from sklearn.decomposition import TruncatedSVD

    n_total = int(args.rows)
    n_sub = min(n_total, int(args.sklearn_rows))
    if args.sparse:  # the first n_sub rows of the same global CSR matrix
        X, y = _sparse_rows(0, n_sub, args.features, args.sparse, np.dtype(args.dtype))
        y = y.astype(args.dtype)
    else:
        X, y = _data(args, _FirstRows(n_total, n_sub), "cpu")
        X, y = X[:n_sub], y[:n_sub]
    if args.algo == "linreg":
        est = sk.LinearRegression()
    elif args.algo == "ridge":
        solver = {"normal": "cholesky", "tsqr": "svd"}.get(args.solver or "auto", args.solver or "auto")
        est = sk.Ridge(alpha=args.alpha, solver=solver, tol=args.tol)
    elif args.algo == "tsvd":
        est = TruncatedSVD(args.components, algorithm=args.solver or "randomized", n_iter=args.n_iter,
                           random_state=0)
    else:
        est = sk.LogisticRegression(solver=args.solver or "lbfgs", tol=args.tol, max_iter=args.max_iter)
    t0 = time.perf_counter()
    est.fit(X, y)
    seconds = time.perf_counter() - t0
    out = {"rows": n_sub, "fit_s": seconds, "cores": os.cpu_count(), "extrapolated": n_sub < n_total,
           "fit_s_full": seconds * n_total / n_sub}
    if args.algo == "ridge":
        out["solver"] = est.solver_
        if n_sub == n_total:
            head = est.coef_[:1000]
            for run in (r for r in result["runs"] if "coef_head" in r):
                run["coef_rel_to_sklearn"] = float(np.max(np.abs(np.asarray(run["coef_head"]) - head))
                                                   / max(np.max(np.abs(head)), 1e-300))
    if args.algo == "tsvd" and n_sub == n_total:
        out["singular_values"] = est.singular_values_.tolist()
        for run in (r for r in result["runs"] if "singular_values" in r):
            run["singular_values_rel_to_sklearn"] = float(np.max(np.abs(np.asarray(run["singular_values"])
                                                                        - est.singular_values_) / est.singular_values_))
    if args.algo == "logreg":
        out["n_iter"] = int(est.n_iter_[0])
        if n_sub == n_total:
            classes = est.classes_
            ref = _logistic_objective(X, y, est.coef_, est.intercept_, 1.0, classes)
            out["objective"] = ref
            for run in (r for r in result["runs"] if "coef" in r):
                mine = _logistic_objective(X, y, run["coef"], run["intercept"], 1.0, classes)
                run["objective"] = mine
                run["objective_rel_to_sklearn"] = (mine - ref) / abs(ref)
    return out


def _plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in result["runs"] if "fit_s" in r]
    R = [r["ranks"] for r in runs]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.plot(R, [r["fit_s"] for r in runs], "o-", label=f"mpiml {result['estimator']}")
    ax.plot(R, [r["floor_s"] for r in runs], "k--", label="floor (reads of the shard, float64 GEMM)")
    sk = result.get("sklearn")
    if sk and "fit_s_full" in sk:
        note = " (extrapolated by rows)" if sk["extrapolated"] else ""
        ax.axhline(sk["fit_s_full"], color="C1", ls="--", label=f"scikit-learn, {sk['cores']} cores{note}")
    plain = [r["plain_cupy_fit_s"] for r in runs if "plain_cupy_fit_s" in r]
    if plain:
        what = {"linreg": "normal equations", "tsvd": "cupyx svds", "ridge": "cupyx CG"}[result["algo"]]
        ax.axhline(plain[0], color="C2", ls=":", label=f"plain CuPy {what}, 1 GPU")
    ax.set_xlabel("ranks")
    ax.set_ylabel("fit seconds")
    ax.set_yscale("log")
    ax.set_xticks(R)
    kind = f" CSR density {result['sparse']:g}" if result.get("sparse") else ""
    ax.set_title(f"{result['estimator']} {result['rows']:.3g} x {result['features']} {result['dtype']}{kind}, "
                 f"{result['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _print_table(result):
    sk = result.get("sklearn", {})
    ref = sk.get("fit_s_full")
    print(f"\n{'ranks':>6}{'fit s':>10}{'floor s':>10}{'x floor':>9}{'speed-up vs sklearn':>22}{'allreduces':>12}"
          f"{'rel to sklearn':>16}{'plain CuPy s':>14}")
    for r in result["runs"]:
        if "fit_s" not in r:
            print(f"{r['ranks']:>6}  skipped: {r['skipped'][:100]}")
            continue
        ar = r["collectives"].get("allreduce", {}).get("calls", 0)
        # logreg: objective; ridge: coefficients; tsvd: singular values (when scikit-learn fits every row)
        obj = next((r[k] for k in ("objective_rel_to_sklearn", "coef_rel_to_sklearn",
                                   "singular_values_rel_to_sklearn") if k in r), None)
        plain = r.get("plain_cupy_fit_s")
        print(f"{r['ranks']:>6}{r['fit_s']:>10.4f}{r['floor_s']:>10.4f}{r['ratio_to_floor']:>9.1f}"
              f"{(ref / r['fit_s'] if ref else float('nan')):>22.1f}{ar:>12}"
              f"{(f'{obj:.2e}' if obj is not None else '-'):>16}{(f'{plain:.4f}' if plain else '-'):>14}")
    if ref:
        note = f" (measured on {sk['rows']:.3g} rows, scaled)" if sk["extrapolated"] else ""
        print(f"scikit-learn on {sk['cores']} cores: {ref:.4f} s{note}")


def _launch(ranks, argv_extra, env):
    from ..cli._options import mpiexec_command

    cmd = mpiexec_command(ranks, [])
    cmd = cmd[:cmd.index("-m")] + ["-m", "mpiml.bench.ml_linear", *argv_extra]
    print("launching: " + " ".join(cmd), flush=True)
    return subprocess.call(cmd, env=env)


def main(argv):
    """Entry point of ``mpiml bench ml --algo linreg|logreg|ridge|tsvd|pca``; returns the exit status.

    Under ``mpirun`` (or with ``--json``, or for pca) the one-run SPMD benchmark
    of :mod:`.ml_decomp` runs instead of this driver.
    """
    from ..comm import launched_by_mpi

    worker = "--worker" in argv or any(a.startswith("--worker=") for a in argv)  # this driver's own MPI job
    if not worker and (launched_by_mpi() or "--json" in argv or any(a.startswith("--json=") for a in argv)
                       or "pca" in argv):
        from .ml_decomp import main as spmd_main

        return spmd_main(argv)
    args = _parser().parse_args(argv)
    if args.worker:
        return _worker(args, args.worker)
    from ._common import bench_launch_check

    status, ngpu = bench_launch_check(args.device)
    if status is not None:
        return status
    device = "gpu" if ngpu else "cpu"
    if args.ranks is None:
        args.ranks = ",".join(str(r) for r in (1, 2, 4) if r <= ngpu) if ngpu else "1,2"
    ranks = [int(r) for r in args.ranks.split(",")]
    low_rank = args.algo in ("ridge", "tsvd")
    if args.features is None:
        args.features = {"linreg": 64, "logreg": 128}.get(args.algo, 100000 if args.sparse else 256)
    if args.rows is None:
        args.rows = ((1e6 if args.sparse else 1e8 if args.algo == "linreg" else 1e7) if ngpu else 2e5)
    if args.tol is None:
        args.tol = 1e-4 if args.algo == "ridge" else 1e-6
    if args.sklearn_rows is None:
        big = ngpu and (args.algo == "linreg" or (low_rank and (args.sparse or args.rows > 1e6)))
        args.sklearn_rows = (2e5 if args.sparse else 1e6 if low_rank else 1e7) if big else args.rows
    common = ["--algo", args.algo, "--device", device, "--ranks", args.ranks, "--rows", str(args.rows),
              "--features", str(args.features), "--classes", str(args.classes), "--tol", str(args.tol),
              "--max-iter", str(args.max_iter), "--dtype", args.dtype, "--repeats", str(args.repeats),
              "--sparse", str(args.sparse), "--components", str(args.components), "--n-iter", str(args.n_iter),
              "--alpha", str(args.alpha)]
    if args.solver:
        common += ["--solver", args.solver]
    if args.no_peer:
        common.append("--no-peer")
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
    est = _estimator(args)
    default_solver = {"linreg": "normal", "logreg": "lbfgs", "ridge": "auto", "tsvd": "randomized"}[args.algo]
    result.update({"algo": args.algo, "estimator": type(est).__name__, "solver": args.solver or default_solver,
                   "sparse": args.sparse, "device": device, "dtype": args.dtype,
                   "rows": int(args.rows), "features": args.features, "machine": machine_info(),
                   **stamp(["bench", "ml", *argv])})
    if args.algo == "logreg":
        result.update({"classes": args.classes, "tol": args.tol, "max_iter": args.max_iter})
    if args.algo == "ridge":
        result.update({"alpha": args.alpha, "tol": args.tol})
    if args.algo == "tsvd":
        result.update({"components": args.components, "n_iter": args.n_iter})
    if not args.no_sklearn:
        result["sklearn"] = _sklearn_baseline(args, result)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"ml_{args.algo}{'_sparse' if args.sparse else ''}_{args.tag or device}")
    write_result(base, result, _plot, _print_table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
