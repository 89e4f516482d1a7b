"""The parts of a dense TruncatedSVD fit on one GPU, each timed, then whole fits and a profile of one.

    python3 benchmarks/gpu/tsvd_dense_parts.py                     # 10^7 x 512 float32 -> 32 components
    python3 benchmarks/gpu/tsvd_dense_parts.py --rows 1e6 --json /tmp/parts.json

On the data of ``mpiml bench ml --algo tsvd`` (mpiml.bench.ml_decomp's generator), each the best of
``--repeats`` after a warm-up, the device synchronised: ``X V`` and ``Xᵀ U`` for ``b = components + 10``
(the plain GEMM and the strided-batched one of ``mpiml.decomposition._solvers``), the Gram matrix of
the ``n x b`` iterate (chunked float64 copies, as before, and the one-read kernel), the column sums and
squared deviations (CuPy's reductions and chunked copies, as before, and the column-moments kernel);
one read of ``X`` at the datasheet bandwidth for scale; then TruncatedSVD fits at the defaults with each
``Xᵀ U`` route and the top of a cProfile of one fit.  Prints a table; ``--json`` writes it.
"""

import argparse
import json
import os
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=float, default=1e7)
    ap.add_argument("--features", type=int, default=512)
    ap.add_argument("--components", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp

    import mpiml
    from mpiml.bench import ml_decomp
    from mpiml.bench._common import best_seconds
    from mpiml.comm import get_comm
    from mpiml.decomposition import TruncatedSVD, _solvers
    from mpiml.kernels import sparse
    from mpiml.utils._linalg import augmented_gram, column_sq_dev

    mpiml.init(device="gpu")
    comm = get_comm()
    ns = argparse.Namespace(algo="tsvd", rows=args.rows, features=args.features, components=args.components)
    X, _ = ml_decomp._data(ns, comm, "gpu", "float32")
    n, d = X.shape
    b = args.components + 10
    rs = cp.random.RandomState(1)
    V = rs.standard_normal((d, b), dtype=cp.float32)
    U = rs.standard_normal((n, b), dtype=cp.float32)
    m = X[:1000].mean(axis=0).astype(cp.float64)
    sync = cp.cuda.Device().synchronize
    name, bw = ml_decomp._gpu_rates(cp)[:2]
    t = {}
    t["X V (GEMM)"] = best_seconds(lambda: X @ V, args.repeats, sync)
    t["X^T U plain GEMM"] = best_seconds(lambda: X.T @ U, args.repeats, sync)
    t["X^T U strided-batched GEMM"] = best_seconds(
        lambda: _solvers._batched_tmatmul(X, U, cp, _solvers._TALL_BATCH_ROWS), args.repeats, sync)

    def old_gram():
        step = max(1, (64 << 20) // (8 * b))
        out = cp.zeros((b, b), dtype=cp.float64)
        for s in range(0, n, step):
            blk = U[s:s + step].astype(cp.float64)
            out += blk.T @ blk
        return out

    t["Gram of n x b, chunked float64 (before)"] = best_seconds(old_gram, args.repeats, sync)
    t["Gram of n x b, one-read kernel"] = best_seconds(lambda: augmented_gram(U), args.repeats, sync)
    t["column sums, CuPy sum(axis=0) (before)"] = best_seconds(lambda: X.sum(axis=0, dtype=cp.float64), args.repeats,
                                                               sync)
    t["squared deviations, chunked (before)"] = best_seconds(lambda: column_sq_dev(X, m), args.repeats, sync)
    t["column moments kernel (one read)"] = best_seconds(lambda: sparse.dense_column_moments(X, m), args.repeats, sync)
    t["one read of X at the datasheet rate"] = X.nbytes / bw
    fits = {}
    for route in ("batched", "gemm"):
        os.environ["MPIML_DENSE_TPRODUCT"] = route
        est = TruncatedSVD(args.components)
        fits[route] = best_seconds(lambda: est.fit(X), 2, sync)
    os.environ.pop("MPIML_DENSE_TPRODUCT", None)
    print(f"{name}: X {n} x {d} float32, b = {b}")
    for key, val in t.items():
        print(f"  {key:<44}{val * 1e3:>10.3f} ms")
    for key, val in fits.items():
        print(f"  TruncatedSVD({args.components}) fit, X^T U {key:<10}{val * 1e3:>10.2f} ms")
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        TruncatedSVD(args.components).fit(X)
        sync()
        prof.disable()
        st = pstats.Stats(prof).stats
        rows = sorted(((ct, tt, nc, f"{os.path.basename(fn)}:{ln}({fname})")
                       for (fn, ln, fname), (_, nc, tt, ct, _) in st.items()), reverse=True)
        print("  profile of one fit (cumulative ms, own ms, calls, function):")
        for ct, tt, nc, where in rows[:args.profile]:
            print(f"    {ct * 1e3:9.2f} {tt * 1e3:9.2f} {nc:6d}  {where}")
        print("  by own time:")
        for tt, ct, nc, where in sorted(((r[1], r[0], r[2], r[3]) for r in rows), reverse=True)[:args.profile // 2]:
            print(f"    {ct * 1e3:9.2f} {tt * 1e3:9.2f} {nc:6d}  {where}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": name, "rows": n, "features": d, "b": b, "times_s": t, "fits_s": fits}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
