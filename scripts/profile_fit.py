"""Where one fit's time goes, on one GPU or each of R: best-of-N wall time, then a cProfile of one more fit.

    python3 scripts/profile_fit.py linreg [--rows 4e7] [--features 64] [--repeats 3] [--top 30]
    mpirun -n 4 python3 scripts/profile_fit.py linreg       (the global rows spread over the ranks; rank 0 prints,
                                                             after a barrier before each fit)

Estimators at their defaults on the float32 CuPy data of mpiml.bench.ml_decomp (its generators and
estimators, so the profile is of the benchmark's fit). The profile
synchronises the device at the end of the fit, so time spent waiting on kernels shows under the
call that waited (``.get()``, ``synchronize``); ``--kernels`` adds the device time of the one-pass
kernels (CUDA events) for the estimators that have them (``--gram mma`` etc. picks the Gram kernel);
``--trace`` times one more fit with every function of the linear models, their validation and
kernels wrapped: the device is synchronised around each call, so the table's inclusive times
(and call counts) say where the fit's time goes, device work included, rank by rank.
"""
import argparse
import cProfile
import pstats
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("algo", choices=("linreg", "ridge", "logreg", "pca", "tsvd"))
    p.add_argument("--rows", type=float, default=4e7)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--kernels", action="store_true")
    p.add_argument("--trace", action="store_true")
    p.add_argument("--no-cprofile", action="store_true", help="skip the cProfile of one more fit")
    a = p.parse_args()
    import cupy

    import mpiml
    from mpiml.bench import ml_decomp
    from mpiml.comm import get_comm

    mpiml.init(device="gpu")   # one GPU per rank, as the benchmark binds them
    comm = get_comm()
    args = argparse.Namespace(algo=a.algo, rows=a.rows, features=a.features, components=32)
    X, y = ml_decomp._data(args, comm, "gpu", "float32")

    def fit():
        est = ml_decomp._mpiml_estimator(args, comm)
        return est.fit(X) if y is None else est.fit(X, y)

    def say(*args):
        if comm.rank == 0:
            print(*args, flush=True)

    times = []
    for _ in range(a.repeats):
        cupy.cuda.Device().synchronize()
        comm.barrier()
        t0 = time.perf_counter()
        est = fit()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    say(f"{a.algo} {int(a.rows)} x {a.features} on {comm.size} rank(s): fits {['%.4f' % t for t in times]} s, "
        f"best {min(times):.4f} s; solver {getattr(est, 'solver_', '')} evaluations "
        f"{getattr(est, '_n_fun_evals', '')} iterations {getattr(est, 'n_iter_', '')}")
    if a.kernels and a.algo in ("linreg", "ridge", "logreg"):
        from mpiml.kernels import linear as kernels
        from mpiml.kernels.linear import augmented_gram, logistic_pass

        for key, times in kernels._PICK_TIMES.items():
            say(f"  Gram kernel picked for {key}: {kernels._PICKS[key]} (calibration, ms on its first rows: "
                f"{ {k: round(v, 3) for k, v in times.items()} })")

        yk = y.astype(X.dtype, copy=False)    # the kernels read y in X's dtype (logreg: the 0/1 labels)
        if a.algo == "logreg":
            ones = cupy.ones(X.shape[0], X.dtype)

            def call():
                return logistic_pass(X, yk, ones, np.zeros(X.shape[1]), 0.0)
            calls = [("logistic_pass", call)]
        else:
            calls = [(f"augmented_gram[{kern}]", lambda kern=kern: augmented_gram(X, yk.reshape(-1, 1), kernel=kern))
                     for kern in ("mma3", "mma3s64", "mma3g", "mma")]
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        for name, call in calls:
            for _ in range(3):
                e0.record()
                call()
                e1.record()
                e1.synchronize()
                say(f"  {name}: {cupy.cuda.get_elapsed_time(e0, e1):.3f} ms")
    if a.trace:
        _trace(fit, comm, say, a.top)
    if a.no_cprofile:
        return
    comm.barrier()
    pr = cProfile.Profile()
    pr.enable()
    fit()
    cupy.cuda.Device().synchronize()
    pr.disable()
    if comm.rank:
        return
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)


_TRACED = ("mpiml.linear_model._least_squares", "mpiml.linear_model._lsq_direct", "mpiml.linear_model._lsq_solvers",
           "mpiml.linear_model._base", "mpiml.linear_model._logistic", "mpiml.linear_model._logistic_loss",
           "mpiml.utils._supervised", "mpiml.utils._validation", "mpiml.utils._linalg", "mpiml.kernels.linear")


def _trace(fit, comm, say, top=40):
    """One fit with the functions of :data:`_TRACED` timed (device synchronised around each call)."""
    import functools
    import importlib
    import inspect

    import cupy

    stats = {}
    sync = cupy.cuda.Device().synchronize
    depth = [0]

    def wrap(name, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            sync()
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                dt = time.perf_counter() - t0
                depth[0] -= 1
                rec = stats.setdefault(name, [0, 0.0, 99])
                rec[0] += 1
                rec[1] += dt
                rec[2] = min(rec[2], depth[0])
        return timed

    undo = []
    seen = set()
    for modname in _TRACED:
        mod = importlib.import_module(modname)
        for attr, obj in list(vars(mod).items()):
            if inspect.isfunction(obj) and obj.__module__ == modname and id(obj) not in seen:
                seen.add(id(obj))
                undo.append((mod, attr, obj))
                setattr(mod, attr, wrap(f"{modname.rsplit('.', 1)[1]}.{attr}", obj))
            elif inspect.isclass(obj) and obj.__module__ == modname:
                for mname, meth in list(vars(obj).items()):
                    if inspect.isfunction(meth) and not mname.startswith("__") or mname == "__init__" \
                            and inspect.isfunction(meth):
                        undo.append((obj, mname, meth))
                        setattr(obj, mname, wrap(f"{obj.__name__}.{mname}", meth))
    # names imported into other traced modules (from x import f) are separate bindings: wrap those too
    for modname in _TRACED:
        mod = importlib.import_module(modname)
        for attr, obj in list(vars(mod).items()):
            if inspect.isfunction(obj) and getattr(obj, "__wrapped__", None) is None and id(obj) in seen:
                undo.append((mod, attr, obj))
                setattr(mod, attr, wrap(f"{obj.__module__.rsplit('.', 1)[1]}.{obj.__name__}", obj))
    try:
        comm.barrier()
        sync()
        t0 = time.perf_counter()
        fit()
        sync()
        total = time.perf_counter() - t0
    finally:
        for owner, attr, obj in reversed(undo):
            setattr(owner, attr, obj)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][1])
    lines = [f"rank {comm.rank}: traced fit {total * 1e3:.2f} ms (device synchronised around every call below)",
             f"  {'inclusive ms':>12} {'calls':>6} {'depth':>5}  function"]
    lines += [f"  {rec[1] * 1e3:12.3f} {rec[0]:6d} {rec[2]:5d}  {name}" for name, rec in rows[:top]]
    texts = comm.allgather_obj("\n".join(lines))
    for text in (texts if comm.size <= 2 else (texts[0], texts[-1])):
        say(text)


if __name__ == "__main__":
    main()
