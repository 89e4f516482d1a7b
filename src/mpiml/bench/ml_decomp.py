"""One SPMD run of a linear-algebra estimator against its peers: ``--algo linreg|ridge|logreg|pca|tsvd``.

Launched by ``mpirun -n N`` (one rank per GPU)::

    mpirun -n 4 python3 -m mpiml.bench.ml_decomp --algo linreg --json ml_linreg_n4.json

or as ``mpiml bench ml --algo ALGO --json PATH`` under ``mpirun``.  In one
run, on the same data (a global problem whose rows do not depend on the rank
count: mpiml's generators draw each rank's rows only; float32 CuPy shards by
default), it measures, each the best of ``--repeats`` after a warm-up, the time
of a fit being the slowest rank's:

* **mpiml**, the estimator at its default parameters over the ``N`` ranks;
* **plain CuPy**, the obvious code on every rank's shard with a host MPI
  allreduce of the small matrices (mpi4py): the normal equations and
  ``cupy.linalg.solve`` (linreg, ridge), Newton's method with the full Hessian
  (logreg, same objective as scikit-learn's), the covariance (or ``XᵀX``) and
  ``cupy.linalg.eigh`` (pca, tsvd); all in the data's dtype;
* **scikit-learn** on the host cores (rank 0, while the others wait without
  spinning) on the first ``--sklearn-rows`` rows of the same problem, the time
  scaled by the row ratio (every solver here is linear in the rows);
* the **floor**: the larger of one read of the slowest rank's shard at the
  GPU's memory bandwidth and its flops at the GPU's FP32 (non-tensor) rate,
  from datasheet figures for known GPUs (else measured): ``n d (d + 1)`` flops
  for the symmetric Gram of linreg, ridge, pca and tsvd; ``4 n d`` flops and one
  read per function evaluation for logreg (times mpiml's evaluations).

Rank 0 prints a table and writes the JSON (and a PNG beside it).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from ._common import machine_info, stamp

__all__ = ["main", "ALGOS"]

ALGOS = ("linreg", "ridge", "logreg", "pca", "tsvd")

#: Datasheet rates (SXM parts unless named): HBM bytes/s, FP32 and FP64 flop/s without tensor cores.
_GPU_RATES = (
    ("H200", 4.8e12, 67e12, 34e12),
    ("H100 PCIe", 2.0e12, 51e12, 26e12),
    ("H100", 3.35e12, 67e12, 34e12),
    ("A100", 2.0e12, 19.5e12, 9.7e12),
)


def _parser():
    p = argparse.ArgumentParser(prog="mpiml bench ml (SPMD)", description=__doc__.split("\n")[0])
    p.add_argument("--algo", choices=ALGOS, required=True)
    p.add_argument("--json", required=True, help="path of the result (a PNG is written beside it)")
    p.add_argument("--rows", type=float, default=None, help="global rows (default 4e7 for the linear models, "
                   "1e7 for pca and tsvd; 2e5 and 5e4 on CPU ranks)")
    p.add_argument("--features", type=int, default=None, help="default 64 (linear models), 512 (pca, tsvd)")
    p.add_argument("--components", type=int, default=32, help="pca and tsvd")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sklearn-rows", type=float, default=None, help="default 1e6 (linreg, ridge), 2.5e5 (logreg), "
                   "2e5 (pca, tsvd); all rows when fewer")
    p.add_argument("--no-sklearn", action="store_true")
    p.add_argument("--no-peer", action="store_true")
    return p


# ---------------------------------------------------------------------- data, estimators, peers
def _data(args, comm, device, dtype):
    from ..datasets import make_classification, make_low_rank_matrix, make_regression

    n, d = int(args.rows), args.features
    if args.algo == "logreg":
        X, y = make_classification(n, d, n_informative=max(2, d // 2), n_redundant=0, random_state=0, comm=comm,
                                   device=device, dtype=dtype)
        return X, y
    if args.algo in ("pca", "tsvd"):
        X = make_low_rank_matrix(n, d, effective_rank=max(2 * args.components, 16), tail_strength=0.5,
                                 random_state=0, comm=comm, device=device, dtype=dtype)
        return X, None
    return make_regression(n, d, n_informative=d, noise=1.0, bias=3.0, random_state=0, comm=comm, device=device,
                           dtype=dtype)


def _mpiml_estimator(args, comm):
    from ..decomposition import PCA, TruncatedSVD
    from ..linear_model import LinearRegression, LogisticRegression, Ridge

    return {"linreg": lambda: LinearRegression(comm=comm), "ridge": lambda: Ridge(comm=comm),
            "logreg": lambda: LogisticRegression(comm=comm),
            "pca": lambda: PCA(args.components, comm=comm),
            "tsvd": lambda: TruncatedSVD(args.components, comm=comm)}[args.algo]()


def _sklearn_estimator(args):
    from sklearn import decomposition, linear_model

    return {"linreg": linear_model.LinearRegression, "ridge": linear_model.Ridge,
            "logreg": linear_model.LogisticRegression,
            "pca": lambda: decomposition.PCA(args.components),
            "tsvd": lambda: decomposition.TruncatedSVD(args.components)}[args.algo]()


def _host_allreduce(a):
    """The obvious reduction: a host NumPy buffer through mpi4py's Allreduce."""
    from mpi4py import MPI

    a = np.ascontiguousarray(a)
    if MPI.COMM_WORLD.Get_size() == 1:
        return a
    out = np.empty_like(a)
    MPI.COMM_WORLD.Allreduce(a, out)
    return out


def _peer(args, X, y, xp):
    """The plain code written the obvious way on this rank's shard; returns ``fit() -> result dict``."""
    host = (lambda a: a.get()) if xp is not np else np.asarray
    d = X.shape[1]

    def normal_equations(alpha):
        def fit():
            pack = xp.concatenate([(X.T @ X).ravel(), X.T @ y, X.sum(axis=0), y.sum(keepdims=True)])
            pack = _host_allreduce(host(pack).astype(np.float64))
            n = float(_host_allreduce(np.array([float(X.shape[0])]))[0])
            G = xp.asarray(pack[:d * d].reshape(d, d), dtype=X.dtype)
            b = xp.asarray(pack[d * d:d * d + d], dtype=X.dtype)
            m = xp.asarray(pack[d * d + d:d * d + 2 * d] / n, dtype=X.dtype)
            ym = X.dtype.type(pack[-1] / n)
            A = G - n * xp.outer(m, m) + alpha * xp.eye(d, dtype=X.dtype)
            coef = xp.linalg.solve(A, b - n * m * ym)
            return {"coef": host(coef), "intercept": float(ym - m @ coef)}
        return fit

    def newton_logistic(tol=1e-4, max_iter=30):
        n = float(_host_allreduce(np.array([float(X.shape[0])]))[0])
        yf = y.astype(X.dtype)
        l2 = 1.0 / n  # scikit-learn's objective with C = 1: mean loss + ||w||² / (2 C n)

        def fit():
            w = np.zeros(d + 1)
            for _ in range(max_iter):
                z = X @ xp.asarray(w[:d], dtype=X.dtype) + X.dtype.type(w[d])
                p = 1 / (1 + xp.exp(-z))
                r, h = p - yf, p * (1 - p)
                Xh = X * h[:, None]
                local = xp.concatenate([(X.T @ r), r.sum(keepdims=True), (Xh.T @ X).ravel(), Xh.sum(axis=0),
                                        h.sum(keepdims=True), (xp.logaddexp(0, z) - yf * z).sum(keepdims=True)])
                tot = _host_allreduce(host(local).astype(np.float64))
                g = tot[:d + 1] / n
                g[:d] += l2 * w[:d]
                H = np.empty((d + 1, d + 1))
                H[:d, :d] = tot[d + 1:d + 1 + d * d].reshape(d, d) / n + l2 * np.eye(d)
                H[:d, d] = H[d, :d] = tot[d + 1 + d * d:d + 1 + d * d + d] / n
                H[d, d] = tot[-2] / n
                if np.abs(g).max() <= tol:
                    break
                w = w - np.linalg.solve(H, g)
            loss = tot[-1] / n + 0.5 * l2 * float(w[:d] @ w[:d])
            return {"coef": w[:d], "intercept": float(w[d]), "objective_at_last_iterate": loss}
        return fit

    def eigen(centre):
        k = args.components

        def fit():
            pack = xp.concatenate([(X.T @ X).ravel(), X.sum(axis=0)])
            pack = _host_allreduce(host(pack).astype(np.float64))
            n = float(_host_allreduce(np.array([float(X.shape[0])]))[0])
            G = xp.asarray(pack[:d * d].reshape(d, d), dtype=X.dtype)
            if centre:
                m = xp.asarray(pack[d * d:] / n, dtype=X.dtype)
                G = (G - n * xp.outer(m, m)) / (n - 1)
            lam, V = xp.linalg.eigh(G)
            lam = host(lam[::-1][:k]).astype(np.float64)
            values = lam if centre else np.sqrt(np.maximum(lam, 0))
            return {"spectrum": values, "components": host(V[:, ::-1][:, :k].T)}
        return fit

    return {"linreg": lambda: normal_equations(0.0), "ridge": lambda: normal_equations(1.0),
            "logreg": newton_logistic, "pca": lambda: eigen(True), "tsvd": lambda: eigen(False)}[args.algo]()


def _result_of(args, est):
    host = (lambda a: a.get() if hasattr(a, "get") else np.asarray(a))
    if args.algo in ("linreg", "ridge", "logreg"):
        out = {"coef": host(est.coef_).astype(np.float64).ravel(),
               "intercept": float(np.ravel(host(est.intercept_))[0])}
        return out
    values = est.explained_variance_ if args.algo == "pca" else est.singular_values_
    return {"spectrum": host(values).astype(np.float64), "components": host(est.components_)}


def _compare(args, mine, other):
    """Relative differences that should be at rounding level (or the solver's tolerance)."""
    if other is None:
        return None
    if "coef" in mine:
        scale = max(float(np.abs(other["coef"]).max()), 1e-300)
        return {"coef_max_rel": float(np.abs(mine["coef"] - other["coef"]).max() / scale)}
    s = other["spectrum"]
    # components up to sign: |cos| of the angle between matching components
    cos = np.abs(np.sum(mine["components"].astype(np.float64) * other["components"].astype(np.float64), axis=1))
    return {"spectrum_max_rel": float(np.max(np.abs(mine["spectrum"] - s) / np.maximum(np.abs(s), 1e-300))),
            "components_min_abs_cos": float(cos.min())}


# ---------------------------------------------------------------------- timing
def _timed(fn, comm, xp, repeats):
    """Best and all of ``repeats`` timed calls after a warm-up; a call's time is the slowest rank's."""
    def sync():
        if xp is not np:
            xp.cuda.Device().synchronize()

    result = fn()
    sync()
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        result = fn()
        sync()
        local = time.perf_counter() - t0
        times.append(comm.allreduce_obj(local, op="max") if comm.size > 1 else local)
    return min(times), times, result


def _wait_quietly(comm):
    """Other ranks wait for rank 0 without spinning (scikit-learn gets the host's cores)."""
    if comm.size == 1:
        return
    from mpi4py import MPI

    req = MPI.COMM_WORLD.Ibarrier()
    while not req.Test():
        time.sleep(0.02)


def _gpu_rates(xp):
    """(name, HBM bytes/s, FP32 flop/s, FP64 flop/s, source) of this rank's device."""
    if xp is np:
        from ._common import measure_rates as _measure_rates

        r = _measure_rates(np, np.float32)
        return "host", r["copy_bandwidth_Bps"] / 2, r["gemm_flops"], r["gemm_flops"] / 2, "measured"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.runtime.getDevice())
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    for frag, bw, f32, f64 in _GPU_RATES:
        if frag in name:
            return name, bw, f32, f64, "datasheet"
    from ._common import measure_rates as _measure_rates

    r = _measure_rates(xp, np.float32)
    return name, r["copy_bandwidth_Bps"] / 2, r["gemm_flops"], r["gemm_flops"] / 2, "measured"


def _floor(args, n_local, itemsize, rates, evals):
    _, bw, f32, _, _ = rates
    d = args.features
    read = n_local * d * itemsize / bw
    if args.algo == "logreg":
        per = max(read, 4.0 * n_local * d / f32)
        return {"floor_s": per * evals, "read_s": read * evals, "flops_s": 4.0 * n_local * d / f32 * evals,
                "evaluations": evals}
    flops = n_local * d * (d + 1) / f32
    return {"floor_s": max(read, flops), "read_s": read, "flops_s": flops}


# ---------------------------------------------------------------------- output
def _print_table(res):
    rows = [("mpiml", res["mpiml"]["fit_s"], f"{res['ranks']} rank(s), solver {res['mpiml'].get('solver', '-')}")]
    if "peer" in res:
        rows.append(("plain " + res["peer"]["library"], res["peer"]["fit_s"], res["peer"]["what"]))
    if "sklearn" in res:
        sk = res["sklearn"]
        rows.append(("scikit-learn", sk["fit_s_scaled"], f"{sk['cores']} cores, {sk['rows']:.3g} rows, scaled"))
    rows.append(("floor", res["floor"]["floor_s"], "max(one read at HBM rate, flops at FP32 rate)"))
    print(f"\n{res['algo']} {res['rows']:.3g} x {res['features']} {res['dtype']} on {res['ranks']} x "
          f"{res['device']}")
    print(f"{'':<14}{'seconds':>12}{'x floor':>10}  note")
    for name, s, note in rows:
        print(f"{name:<14}{s:>12.4f}{s / res['floor']['floor_s']:>10.1f}  {note}")
    if res.get("vs_peer"):
        print("mpiml vs the plain peer: " + ", ".join(f"{k} {v:.2e}" for k, v in res["vs_peer"].items()))


def _plot(res, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = ["mpiml"] + (["plain " + res["peer"]["library"]] if "peer" in res else []) \
        + (["scikit-learn (scaled)"] if "sklearn" in res else []) + ["floor"]
    values = [res["mpiml"]["fit_s"]] + ([res["peer"]["fit_s"]] if "peer" in res else []) \
        + ([res["sklearn"]["fit_s_scaled"]] if "sklearn" in res else []) + [res["floor"]["floor_s"]]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    ax.barh(names[::-1], values[::-1], color=["0.6"] + ["C1", "C2", "C0"][:len(values) - 1][::-1])
    ax.set_xscale("log")
    ax.set_xlabel("fit seconds (log)")
    ax.set_title(f"{res['estimator']}: {res['rows']:.3g} x {res['features']} {res['dtype']}, {res['ranks']} x "
                 f"{res['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------- entry point
def main(argv):
    """Run under ``mpirun``; returns the exit status."""
    args = _parser().parse_args(argv)
    from ..comm import get_comm

    comm = get_comm()
    device = args.device
    if device == "auto":
        try:
            import cupy

            device = "gpu" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
        except Exception:
            device = "cpu"
    if device == "gpu":
        import cupy as xp

        from .. import init

        init(device="gpu")
    else:
        xp = np
    linear = args.algo in ("linreg", "ridge", "logreg")
    if args.rows is None:
        args.rows = (4e7 if linear else 1e7) if device == "gpu" else (2e5 if linear else 5e4)
    if args.features is None:
        args.features = 64 if linear else 512
    if args.sklearn_rows is None:
        args.sklearn_rows = {"linreg": 1e6, "ridge": 1e6, "logreg": 2.5e5}.get(args.algo, 2e5)
    dtype = np.dtype(args.dtype)
    X, y = _data(args, comm, device, dtype)
    est = _mpiml_estimator(args, comm)
    if device == "gpu" and args.algo in ("linreg", "ridge"):
        # the steady state: the compiled 65 x 65 algebra loads in a background thread after a process's first
        # device fit (which does not wait for it), so the warm-up alone would not have it
        from mpiml.linear_model._lsq_direct import wait_compiled_algebra

        wait_compiled_algebra(120)
    fit_s, times, _ = _timed(lambda: est.fit(X, y), comm, xp, args.repeats)
    mine = _result_of(args, est)
    res = {"algo": args.algo, "estimator": repr(est).replace(f"comm={comm!r}", "").replace("(, ", "("),
           "rows": int(args.rows), "features": args.features, "dtype": args.dtype, "ranks": comm.size,
           "mpiml": {"fit_s": fit_s, "times_s": times}}
    for attr in ("solver_", "_fit_svd_solver", "algorithm", "solver"):
        if hasattr(est, attr):
            res["mpiml"]["solver"] = str(getattr(est, attr))
            break
    if hasattr(est, "_solver_info"):
        res["mpiml"]["solver_info"] = {k: (float(v) if isinstance(v, (float, np.floating)) else v)
                                       for k, v in est._solver_info.items()}
    evals = int(getattr(est, "_n_fun_evals", 1))
    if args.algo == "logreg":
        res["mpiml"]["n_iter"], res["mpiml"]["evaluations"] = int(est.n_iter_[0]), evals
    if not args.no_peer:
        peer_s, peer_times, theirs = _timed(_peer(args, X, y, xp), comm, xp, args.repeats)
        what = {"linreg": "XᵀX, Xᵀy, sums; host MPI allreduce; solve", "ridge": "as linreg + alpha I",
                "logreg": "Newton, full Hessian (X * h)ᵀX per iteration", "pca": "XᵀX, sums; allreduce; eigh",
                "tsvd": "XᵀX; allreduce; eigh"}[args.algo]
        res["peer"] = {"library": "CuPy" if xp is not np else "NumPy", "fit_s": peer_s, "times_s": peer_times,
                       "what": what + f", in {args.dtype}"}
        res["vs_peer"] = _compare(args, mine, theirs)
        if "objective_at_last_iterate" in theirs:
            res["peer"]["objective"] = theirs["objective_at_last_iterate"]
    n_max = comm.allreduce_obj(int(X.shape[0]), op="max") if comm.size > 1 else int(X.shape[0])
    rates = _gpu_rates(xp)
    res["device"] = rates[0]
    res["floor"] = {**_floor(args, n_max, dtype.itemsize, rates, evals), "n_local_max": n_max,
                    "hbm_Bps": rates[1], "fp32_flops": rates[2], "fp64_flops": rates[3], "rates_from": rates[4]}
    if not args.no_sklearn:
        if comm.rank == 0:
            res["sklearn"] = _sklearn(args, dtype, mine)
            _wait_quietly(comm)
        else:
            _wait_quietly(comm)
    if comm.rank == 0:
        res["machine"] = machine_info(comm)
        res.update(stamp(["bench", "ml", *argv]))
        res["ratio_to_floor"] = fit_s / res["floor"]["floor_s"]
        if "peer" in res:
            res["speedup_vs_peer"] = res["peer"]["fit_s"] / fit_s
        if "sklearn" in res:
            res["speedup_vs_sklearn"] = res["sklearn"]["fit_s_scaled"] / fit_s
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(_jsonable(res), f, indent=1)
        _plot(res, os.path.splitext(args.json)[0] + ".png")
        _print_table(res)
        print(f"wrote {args.json}", flush=True)
    return 0


def _sklearn(args, dtype, mine):
    """scikit-learn at its defaults on the first rows of the same global problem (rank 0, host)."""
    from ._common import FirstRows as _FirstRows

    n_total = int(args.rows)
    n_sub = min(n_total, int(args.sklearn_rows))
    X, y = _data(args, _FirstRows(n_total, n_sub), "cpu", dtype)
    X = X[:n_sub]
    y = None if y is None else y[:n_sub]
    est = _sklearn_estimator(args)
    t0 = time.perf_counter()
    est.fit(X, y)
    seconds = time.perf_counter() - t0
    return {"rows": n_sub, "fit_s": seconds, "fit_s_scaled": seconds * n_total / n_sub,
            "cores": os.cpu_count(), "estimator": repr(est), "scaled": n_sub < n_total}


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
