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

import mpiml  # (before NumPy, as in the benchmark: its BLAS settings apply when NumPy loads OpenBLAS)
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
    p.add_argument("--timeline", action="store_true", help="one more fit with host times and CUDA events around "
                   "its main steps, the device not synchronised (see _timeline)")
    a = p.parse_args()
    import cupy

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

    if a.algo in ("linreg", "ridge"):
        # the steady state, as the benchmark times it: the compiled 65 x 65 algebra loads in a background thread
        # after a process's first device fit (which does not wait for it), so the first fits profiled here
        # would take the NumPy algebra, the later ones the compiled one
        from mpiml.linear_model._lsq_direct import wait_compiled_algebra

        if not wait_compiled_algebra(120):
            say("the compiled algebra did not load (no Numba?): the fits take the NumPy algebra")

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
        from mpiml.kernels.linear import LogisticPass, augmented_gram

        for key, times in kernels._PICK_TIMES.items():
            say(f"  Gram kernel picked for {key}: {kernels._PICKS[key]} (calibration, ms on its first rows: "
                f"{ {k: round(v, 3) for k, v in times.items()} })")

        yk = y.astype(X.dtype, copy=False)    # the kernels read y in X's dtype (logreg: the 0/1 labels)
        if a.algo == "logreg":
            ones = cupy.ones(X.shape[0], X.dtype)
            prepared = LogisticPass(X, yk, ones, fit_intercept=True)   # as the objective keeps it

            def call():
                return prepared(np.zeros(X.shape[1]), 0.0)
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
            # five calls queued back to back: the device time of one without the host's part between calls
            call()
            e0.record()
            for _ in range(5):
                call()
            e1.record()
            e1.synchronize()
            per = cupy.cuda.get_elapsed_time(e0, e1) / 5
            per = comm.allgather_obj(round(per, 4))
            say(f"  {name}, 5 queued: {per} ms each (per rank)")
        if a.algo == "logreg":
            _host_costs(prepared, comm, say)
    if a.trace:
        _trace(fit, comm, say, a.top)
    if a.timeline:
        _timeline(fit, comm, say)
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


def _host_costs(prepared, comm, say, reps=21):
    """Host microseconds of an evaluation's pieces with the device idle (as between L-BFGS evaluations), median of
    ``reps``: the pass's launch (LogisticPass.__call__ until it returns), the reduction of its sums (the
    allreduce, its copy to pinned memory and the wait), and the device time each of those leaves after it."""
    import cupy

    from mpiml.linear_model._base import allreduce_identical_device

    import cupyx

    d = prepared.d
    pinned = None
    sync = cupy.cuda.Device().synchronize
    point = np.zeros(d)
    launch, reduce_ = [], []
    for _ in range(reps):
        sync()
        comm.barrier()
        t0 = time.perf_counter()
        out = prepared(point, 0.0, None, 0.0, 1.0)
        t1 = time.perf_counter()
        sync()
        comm.barrier()
        if pinned is None:
            pinned = cupyx.empty_pinned(out.size, dtype=np.float64)
        t2 = time.perf_counter()
        allreduce_identical_device(comm, out, host=pinned)
        t3 = time.perf_counter()
        launch.append(t1 - t0)
        reduce_.append(t3 - t2)
    med = [round(1e6 * float(np.median(v)), 1) for v in (launch, reduce_)]
    med = comm.allgather_obj(med)
    say(f"  host us per rank, device idle (median of {reps}): pass launch {[m[0] for m in med]}, "
        f"reduce+copy of its sums {[m[1] for m in med]}")
    # the launch's steps one by one (LogisticPass.__call__'s, replayed): where its host time goes
    from mpiml.kernels import linear as kernels

    steps = {k: [] for k in ("event sync", "point copy", "kernel launch", "sum launch")}
    fn, nblocks, smem = prepared._mode(0)
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        prepared._copied.synchronize()
        t1 = time.perf_counter()
        prepared._host[:d] = point
        stream = cupy.cuda.get_current_stream()
        cupy.cuda.runtime.memcpyAsync(prepared._dev.data.ptr, prepared._host.ctypes.data, d * 8,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        prepared._copied.record(stream)
        t2 = time.perf_counter()
        fn((nblocks,), (kernels._LOGISTIC_THREADS,),
           (prepared.X, *prepared._shape_args, prepared.y01, prepared.sw, prepared._cw, np.float64(0.0),
            prepared._cw, np.float64(0.0), prepared._partial), shared_mem=smem)
        t3 = time.perf_counter()
        out = cupy.empty(d + 4, dtype=cupy.float64)
        prepared._sum((kernels._sum_grid(out.size),), (kernels._SUM_THREADS,),
                      (prepared._partial, np.int32(nblocks), np.int32(d), np.int32(1), np.int32(prepared.fi),
                       np.float64(1.0), np.float64(1.0), out))
        t4 = time.perf_counter()
        for k, a, b in (("event sync", t0, t1), ("point copy", t1, t2), ("kernel launch", t2, t3),
                        ("sum launch", t3, t4)):
            steps[k].append(b - a)
    sync()
    med = comm.allgather_obj({k: round(1e6 * float(np.median(v)), 1) for k, v in steps.items()})
    say(f"  the launch's steps, host us per rank (median of {reps}): {med}")


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


#: (module, attribute path) of the steps :func:`_timeline` marks.
_MARKED = (("mpiml.utils._supervised", "validate_X_y"), ("mpiml.utils._validation", "validate_data"),
           ("mpiml.utils._validation", "validate_sample_weight"), ("mpiml.utils._supervised", "_device_labels"),
           ("mpiml.linear_model._logistic_loss", "Objective.__init__"),
           ("mpiml.linear_model._logistic_loss", "Objective.evaluate"),
           ("mpiml.linear_model._logistic_loss", "Objective._reduce"),
           ("mpiml.linear_model._logistic_loss", "lbfgs"),
           ("mpiml.linear_model._logistic", "LogisticRegression._fitted_attributes"),
           ("mpiml.kernels.linear", "LogisticPass.__call__"), ("mpiml.kernels.linear", "LogisticPass.launch"),
           ("mpiml.kernels.linear", "augmented_gram"),
           ("mpiml.linear_model._base", "allreduce_identical_device"),
           ("mpiml.linear_model._lsq_direct", "early_local_gram"), ("mpiml.linear_model._lsq_direct", "solve_direct"),
           ("mpiml.linear_model._lsq_direct", "NormalEquations.choose"),
           ("mpiml.linear_model._lsq_direct", "NormalEquations.__init__"),
           ("mpiml.linear_model._lsq_direct", "_small_algebra"),
           ("mpiml.linear_model._lsq_solvers", "ScaledCholesky.__init__"),
           ("mpiml.linear_model._lsq_solvers", "ridge_from_gram"),
           ("mpiml.linear_model._lsq_solvers", "lstsq_from_gram_cholesky"),
           ("mpiml.linear_model._least_squares", "_LinearRegressorBase._set_coef"))
# (each mark costs two CUDA events recorded, 20-50 us of host time a call on the GPU host: marks nested inside the
# steps above, tried in the passes of 22:58 and 23:44, lengthened the Ridge timeline's host part by ~0.1-0.2 ms)


def _timeline(fit, comm, say):
    """One fit with its main steps marked, the device *not* synchronised: host enter/exit times and a CUDA
    event recorded on the stream at each enter and exit (when the device reached that point).

    Times are ms from the fit's start (host clock; device events from an event recorded at that moment on an
    idle device).  For LogisticRegression each evaluation is split into: host before the kernel (evaluate's
    enter to the pass's return), the device until the kernel's sums are done (LogisticPass's exit event
    less its return), the reduction (until _reduce returns: the allreduce, the wait for the slowest rank, the
    copy to the host) and the host after it (scipy's step and the next call) until the next evaluate.
    """
    import functools
    import importlib
    import sys as _sys

    import cupy

    marks = []
    undo = []
    Event = cupy.cuda.Event

    def wrap(label, fn):
        @functools.wraps(fn)
        def marked(*args, **kwargs):
            e0 = Event()
            e0.record()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                e1 = Event()
                e1.record()
                marks.append((label, t0, t1, e0, e1))
        return marked

    originals = {}
    for modname, path in _MARKED:
        mod = importlib.import_module(modname)
        owner, attr = mod, path
        if "." in path:
            cls, attr = path.split(".")
            owner = getattr(mod, cls)
        fn = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        originals[id(fn)] = (path.rsplit(".", 1)[-1] if "." not in path else path, fn)
        undo.append((owner, attr, fn))
        setattr(owner, attr, wrap(path, fn))
    # the same functions imported by name into other modules of the package
    for name, mod in list(_sys.modules.items()):
        if not name.startswith("mpiml.") or mod is None:
            continue
        for attr, obj in list(vars(mod).items()):
            if callable(obj) and id(obj) in originals and not isinstance(obj, type):
                undo.append((mod, attr, obj))
                setattr(mod, attr, wrap(originals[id(obj)][0], obj))
    try:
        comm.barrier()
        cupy.cuda.Device().synchronize()
        start = Event()
        start.record()
        start.synchronize()
        t_start = time.perf_counter()
        fit()
        cupy.cuda.Device().synchronize()
        total = (time.perf_counter() - t_start) * 1e3
    finally:
        for owner, attr, obj in reversed(undo):
            setattr(owner, attr, obj)
    rows = []
    for label, t0, t1, e0, e1 in sorted(marks, key=lambda m: m[1]):
        rows.append((label, (t0 - t_start) * 1e3, (t1 - t_start) * 1e3, cupy.cuda.get_elapsed_time(start, e0),
                     cupy.cuda.get_elapsed_time(start, e1)))
    lines = [f"rank {comm.rank}: timeline fit {total:.2f} ms (host enter/exit, device enter/exit, ms from the start)"]
    summary = _pass_summary(rows)
    if summary:
        lines.append(summary)
    seen = {}
    for r in rows:
        seen[r[0]] = seen.get(r[0], 0) + 1
        if r[0] in ("Objective.evaluate", "Objective._reduce", "LogisticPass.__call__", "LogisticPass.launch",
                    "allreduce_identical_device") \
                and 3 <= seen[r[0]] < 19:
            continue   # (the first two and the last evaluations in full)
        lines.append(f"  {r[0]:<36} host {r[1]:8.3f} {r[2]:8.3f}  device {r[3]:8.3f} {r[4]:8.3f}")
    texts = comm.allgather_obj("\n".join(lines))
    for text in (texts if comm.size <= 2 else (texts[0], texts[-1])):
        say(text)


def _pass_summary(rows):
    """One line splitting the logistic evaluations of a timeline (see :func:`_timeline`), or None."""
    evals = [r for r in rows if r[0] == "Objective.evaluate"]
    # (a pass is launched by LogisticPass.launch, alone or inside __call__: the launches are the passes)
    passes = [r for r in rows if r[0] == "LogisticPass.launch"]
    reduces = [r for r in rows if r[0] == "Objective._reduce"]
    if passes and reduces:
        # each reduction with the last pass launched before it, each pass with the evaluation around it (none:
        # the first evaluation's pass launched during validation)
        pairs = [(max((p for p in passes if p[1] <= r[1]), key=lambda p: p[1], default=None), r) for r in reduces]
        pairs = [(p, r) for p, r in pairs if p is not None]
        inside = [(next((e for e in evals if e[1] <= p[1] <= e[2]), None), p) for p, _ in pairs]
        before = [p[2] - e[1] for e, p in inside if e is not None]
        device = [max(0.0, p[4] - p[2]) for p, _ in pairs]
        reduce_ = [r[2] - max(p[2], p[4]) for p, r in pairs]
        after = [min((e[1] for e in evals if e[1] >= r[2]), default=r[2]) - r[2] for _, r in pairs[:-1]]
        span = [p[4] - p[3] for p in passes]
        return (f"  {len(passes)} passes, {len(reduces)} reductions: host before the kernel {sum(before):.2f} ms "
                f"({1e3 * sum(before) / max(1, len(before)):.0f} us each), device after the launch "
                f"{sum(device):.2f}, reduce+wait+copy {sum(reduce_):.2f} "
                f"({1e3 * sum(reduce_) / len(reduce_):.0f} us each), host after {sum(after):.2f} "
                f"({1e3 * sum(after) / max(1, len(after)):.0f} us each); device span of the passes "
                f"{sum(span):.2f} ms; first pass launched at {passes[0][2]:.2f}, its sums done at "
                f"{passes[0][4]:.2f}, first reduction returned at {reduces[0][2]:.2f}, last at "
                f"{reduces[-1][2]:.2f}")
    return None


if __name__ == "__main__":
    main()
