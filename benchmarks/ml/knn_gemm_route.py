"""The two routes of ``mpiml.kernels.select.topk`` by dimension: where the GEMM route overtakes the fused kernel.

    PYTHONPATH=src python3 benchmarks/ml/knn_gemm_route.py --out $OUT [--warm-only]

For each dtype and ``d`` of ``--dims``, ``topk`` of ``--queries`` queries against ``--rows`` rows (blobs,
k = ``--k``) by the fused SIMT kernel and by the GEMM route (cuBLAS tile + selection), best of
``--repeats`` after a warm-up; at ``--shape-d`` also the GEMM route at other tile shapes (queries x rows).
Each case checks that both routes chose the same neighbour sets (``agreement``).  Writes
``knn_gemm_route.json`` under ``--out`` (machine, date, command).  ``--warm-only``: compile the
select programs the GEMM-form metrics use (in threads) and exit, so that tests do not compile one by one.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import time

import numpy as np


def warm(jobs=16):
    """Compile (or load) every select program of the GEMM-form metrics, ``jobs`` at a time."""
    from mpiml.kernels import build, select

    progs = [tuple(e) for _, e in build._select_programs() if not any("radius" in x for x in e)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        list(pool.map(select._module, progs))
    print(f"warm: {len(progs)} select programs in {time.perf_counter() - t0:.1f} s", flush=True)
    return len(progs)


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


def _best(fn, repeats):
    fn()
    _sync()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        _sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _write(args, cases):
    from mpiml.bench._common import machine_info, stamp
    from mpiml.kernels import select

    result = {"benchmark": "knn_gemm_route", **stamp(["benchmarks/ml/knn_gemm_route.py"] + list(args.argv)),
              "machine": machine_info(), "plan": {"min_d": select._GEMM_MIN_D, "queries": select._GEMM_QUERIES,
                                                  "rows": select._GEMM_ROWS}, "cases": cases}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "knn_gemm_route.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dims", default="64,128,192,256,384,512,960")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--shape-d", type=int, default=960)
    ap.add_argument("--shapes", default="1024x16384,1024x8192,512x16384,2048x8192,2048x16384")
    ap.add_argument("--warm-only", action="store_true")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.warm_only:
        warm()
        return 0
    import cupy

    from mpiml.kernels import select

    rs = cupy.random.RandomState(0)
    cases = []
    for dtype in args.dtypes.split(","):
        for d in (int(x) for x in args.dims.split(",")):
            centers = rs.standard_normal((16, d), dtype=np.float64) * 4
            X = (centers[rs.randint(0, 16, args.rows)] + rs.standard_normal((args.rows, d))).astype(dtype)
            Q = (centers[rs.randint(0, 16, args.queries)] + rs.standard_normal((args.queries, d))).astype(dtype)
            row = {"d": d, "dtype": dtype, "k": args.k, "queries": args.queries, "rows": args.rows,
                   "auto": "gemm" if select.gemm_plan(dtype, args.k, "sqeuclidean", d) else "fused"}
            tf, (_, i_f) = _best(lambda: select.topk(Q, X, args.k, route="fused"), args.repeats)
            tg, (_, i_g) = _best(lambda: select.topk(Q, X, args.k, route="gemm"), args.repeats)
            row.update(fused_s=tf, gemm_s=tg, gemm_speedup=tf / tg, agreement=float(
                (cupy.sort(i_f, axis=1) == cupy.sort(i_g, axis=1)).all(axis=1).mean()))
            if d == args.shape_d:
                row["shapes"] = {}
                saved = select._GEMM_QUERIES, select._GEMM_ROWS
                try:
                    for spec in args.shapes.split(","):
                        qb, cb = (int(x) for x in spec.split("x"))
                        select._GEMM_QUERIES, select._GEMM_ROWS = qb, cb
                        row["shapes"][spec] = _best(lambda: select.topk(Q, X, args.k, route="gemm"),
                                                    args.repeats)[0]
                finally:
                    select._GEMM_QUERIES, select._GEMM_ROWS = saved
            print(json.dumps(row), flush=True)
            cases.append(row)
            _write(args, cases)  # after every case: a run cut off keeps what it measured
            del X, Q, i_f, i_g
            cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
