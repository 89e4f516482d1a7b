"""Where one fit's time goes, on one GPU or each of R: best-of-N wall time, then a cProfile of one more fit.

    python3 scripts/profile_fit.py linreg [--rows 4e7] [--features 64] [--repeats 3] [--top 30]
    mpirun -n 4 python3 scripts/profile_fit.py linreg       (the global rows spread over the ranks; rank 0 prints,
                                                             after a barrier before each fit)

Estimators at their defaults on the float32 CuPy data of mpiml.bench.ml_decomp (its generators and
estimators, so the profile is of the benchmark's fit). The profile
synchronises the device at the end of the fit, so time spent waiting on kernels shows under the
call that waited (``.get()``, ``synchronize``); ``--kernels`` adds the device time of the one-pass
kernels (CUDA events) for the estimators that have them.
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
        fit()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    say(f"{a.algo} {int(a.rows)} x {a.features} on {comm.size} rank(s): fits {['%.4f' % t for t in times]} s, best {min(times):.4f} s")
    if a.kernels and a.algo in ("linreg", "ridge", "logreg"):
        from mpiml.kernels.linear import augmented_gram, logistic_pass

        yk = y.astype(X.dtype, copy=False)    # the kernels read y in X's dtype (logreg: the 0/1 labels)
        if a.algo == "logreg":
            name, call = "logistic_pass", lambda: logistic_pass(X, yk, cupy.ones(X.shape[0], X.dtype),
                                                                np.zeros(X.shape[1]), 0.0)
        else:
            name, call = "augmented_gram", lambda: augmented_gram(X, yk.reshape(-1, 1))
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(3):
            e0.record()
            call()
            e1.record()
            e1.synchronize()
            say(f"  {name}: {cupy.cuda.get_elapsed_time(e0, e1):.3f} ms")
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


if __name__ == "__main__":
    main()
