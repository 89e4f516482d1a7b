"""Where one fit's time goes, on one GPU: best-of-N wall time, then a cProfile of one more fit.

    python3 scripts/profile_fit.py linreg [--rows 4e7] [--features 64] [--repeats 3] [--top 30]

Estimators at their defaults on float32 CuPy data (the shapes of mpiml.bench.ml_decomp). The profile
synchronises the device at the end of the fit, so time spent waiting on kernels shows under the
call that waited (``.get()``, ``synchronize``); ``--kernels`` adds the device time of the one-pass
kernels (CUDA events) for the estimators that have them.
"""
import argparse
import cProfile
import pstats
import time

import numpy as np


def make(algo, n, d):
    import cupy
    rng = cupy.random.default_rng(0)
    X = rng.standard_normal((n, d), dtype=cupy.float32)
    w = rng.standard_normal(d, dtype=cupy.float32)
    y = X @ w + 0.1 * rng.standard_normal(n, dtype=cupy.float32)
    if algo == "logreg":
        y = (y > 0).astype(cupy.float32)
    return X, y


def estimator(algo):
    import mpiml.decomposition
    import mpiml.linear_model
    return {"linreg": lambda: mpiml.linear_model.LinearRegression(),
            "ridge": lambda: mpiml.linear_model.Ridge(),
            "logreg": lambda: mpiml.linear_model.LogisticRegression(),
            "pca": lambda: mpiml.decomposition.PCA(32)}[algo]()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("algo")
    p.add_argument("--rows", type=float, default=4e7)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--kernels", action="store_true")
    a = p.parse_args()
    import cupy
    X, y = make(a.algo, int(a.rows), a.features)
    fit = (lambda: estimator(a.algo).fit(X)) if a.algo == "pca" else (lambda: estimator(a.algo).fit(X, y))
    times = []
    for _ in range(a.repeats):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fit()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    print(f"{a.algo} {int(a.rows)} x {a.features}: fits {['%.4f' % t for t in times]} s, best {min(times):.4f} s")
    if a.kernels and a.algo in ("linreg", "ridge"):
        from mpiml.kernels.linear import augmented_gram
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        for _ in range(3):
            e0.record()
            augmented_gram(X, y.reshape(-1, 1))
            e1.record()
            e1.synchronize()
            print(f"  augmented_gram: {cupy.cuda.get_elapsed_time(e0, e1):.3f} ms")
    if a.kernels and a.algo == "logreg":
        from mpiml.kernels.linear import logistic_pass
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        sw = cupy.ones(X.shape[0], dtype=X.dtype)
        coef = np.zeros(X.shape[1])
        for _ in range(3):
            e0.record()
            logistic_pass(X, y, sw, coef, 0.0)
            e1.record()
            e1.synchronize()
            print(f"  logistic_pass: {cupy.cuda.get_elapsed_time(e0, e1):.3f} ms")
    pr = cProfile.Profile()
    pr.enable()
    fit()
    cupy.cuda.Device().synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(a.top)
    st.sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
