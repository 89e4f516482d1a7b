"""The sparse products of TruncatedSVD and sparse Ridge on one GPU: each way of computing them, timed, with its floor.

    python3 benchmarks/sparse/spmm_gpu.py --out $OUT/spmm_gpu.json            # CSR 10^6 x 10^5, 10^8 values
    python3 benchmarks/sparse/spmm_gpu.py --rows 1e5 --features 1e4 --out /tmp/s.json

The matrix (float32, int32 indices) has ``--nnz-per-row`` values per row at uniform random columns,
drawn on the GPU (the shape of ``mpiml bench ml --algo tsvd|ridge --sparse 0.001``).  Timed, each the
best of ``--repeats`` after a warm-up, the device synchronised: ``X V`` and ``Xᵀ U`` for a dense block
of ``b = components + 10`` columns by cuSPARSE (``X @ V``, ``X.T @ U``, and on the stored transpose
``Xᵀ`` as CSR), by :mod:`mpiml.kernels.sparse` (gather on ``X`` and on ``Xᵀ``, scatter with atomics);
forming ``Xᵀ`` (``X.T.tocsr()``, the kernel transpose, the bucket transpose by phases and bucket widths,
each checked equal to cuSPARSE's; ``--transposes`` keeps these with ``--fits-only``); the same for one
vector (``b = 1``, sparse Ridge's products); the column sums (``mpiml.utils._linalg.column_sums`` and the
kernel's row moments of ``Xᵀ``); then whole TruncatedSVD fits (defaults but ``n_components``) under each
``MPIML_SPARSE_PRODUCTS`` mode, and in the "kernels" mode with each transpose (``MPIML_SPARSE_TRANSPOSE``),
the host's CholeskyQR2 algebra (``MPIML_RANDOMIZED_ALGEBRA=host``) and cuRAND's random matrix
(``MPIML_DEVICE_NORMAL=curand``: with cuSPARSE's transpose, the code measured at 20:20) and the device
algebra's checks read after the fit's end is queued (``MPIML_RANDOMIZED_CHECKS=deferred``).
``--timeline``: one more fit of each of those, its steps timed by CUDA events with no synchronisation added
(device ms between steps, host ms, and where the host stood against the device); ``--trace``: one fit with
every function of the decomposition, its validation and kernels timed with the device synchronised around
each call (``scripts/profile_fit.py``'s tracer; serialises the transpose's overlap).
Floors: the bytes a product must move (the CSR arrays once, the dense block read and the result
written) at the datasheet HBM bandwidth; the gathers of ``V``'s rows (``nnz * b`` values) come from L2
when ``V`` fits there and are reported separately.  Prints a table and writes JSON.
"""

import argparse
import datetime
import json
import os
import sys

import numpy as np

def _print_profile(prof, top):
    """One line a function: the ``top`` by cumulative time among mpiml's and CuPy's, then by own time."""
    import pstats

    st = pstats.Stats(prof).stats
    rows = [(ct, tt, nc, f"{os.path.basename(fn)}:{ln}({name})") for (fn, ln, name), (_, nc, tt, ct, _) in st.items()]
    print("  profile of one fit (cumulative ms, own ms, calls, function):")
    for ct, tt, nc, where in sorted((r for r in rows if "mpiml" in r[3] or "_solvers" in r[3] or "_linalg" in r[3]
                                     or "sparse" in r[3] or "_truncated" in r[3]), reverse=True)[:top]:
        print(f"    {ct * 1e3:9.2f} {tt * 1e3:9.2f} {nc:6d}  {where}")
    print("  by own time:")
    for tt, ct, nc, where in sorted(((r[1], r[0], r[2], r[3]) for r in rows), reverse=True)[:top // 2]:
        print(f"    {ct * 1e3:9.2f} {tt * 1e3:9.2f} {nc:6d}  {where}")


_L2_READ = r"""
extern "C" __global__ void l2_read(const float4* __restrict__ x, const long long n4, const int reps,
                                   float* __restrict__ out) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; ++r)
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
            const float4 v = __ldcg(x + i);
            acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
        }
    if (acc.x + acc.y + acc.z + acc.w == 1.2345e-30f) out[0] = acc.x;
}
"""


def _timeline_rows(marks):
    """``[label, device ms since the previous step, host ms since it, device ms since the start, host ms since
    the start]`` of :func:`mpiml.decomposition._solvers.timeline`'s marks (the device synchronised first)."""
    import cupy

    marks[-1][1].synchronize()
    rows = []
    for (_, e0, t0), (label, e1, t1) in zip(marks, marks[1:]):
        rows.append([label, cupy.cuda.get_elapsed_time(e0, e1), (t1 - t0) * 1e3,
                     cupy.cuda.get_elapsed_time(marks[0][1], e1), (t1 - marks[0][2]) * 1e3])
    return rows


#: Timeline steps by kind (the first prefix that matches), for the per-kind totals.
_KINDS = (("products", ("X V", "Xt U", "Qt X", "X components_")), ("transpose wait", ("wait for the transpose",)),
          ("normalisations", ("normalise", "orthonormalise", "SVD of")), ("variances", ("variances",)),
          ("validation", ("validate",)), ("set-up", ("operand", "random matrix", "signs")))


def _timeline_kinds(rows):
    """Device ms by kind of step (:data:`_KINDS`; "other" for the rest)."""
    out = {}
    for label, dev, *_ in rows:
        kind = next((k for k, prefixes in _KINDS if label.startswith(prefixes)), "other")
        out[kind] = out.get(kind, 0.0) + dev
    return out


def _print_timeline(name, rows):
    print(f"  timeline of one fit, {name} (device ms a step, host ms a step, device ms / host ms since the start):")
    for label, dev, host, dev_at, host_at in rows:
        print(f"    {label:<28}{dev:9.3f} {host:9.3f} {dev_at:10.3f} {host_at:10.3f}")
    print("    by kind (device ms): " + ", ".join(f"{k} {v:.2f}" for k, v in _timeline_kinds(rows).items()))


#: The TruncatedSVD fits of the "kernels" mode: name -> the environment they run under.
_VARIANTS = {"kernels": {},      # the defaults: the bucket transpose, the device algebra, its checks deferred
             "kernels, checks read at once": {"MPIML_RANDOMIZED_CHECKS": "now"},
             "kernels, explicit final Q": {"MPIML_RANDOMIZED_FINAL": "explicit"},
             "kernels, cuSPARSE transpose": {"MPIML_SPARSE_TRANSPOSE": "cusparse"},
             "kernels, kernel transpose": {"MPIML_SPARSE_TRANSPOSE": "kernel"},
             "kernels, host algebra": {"MPIML_RANDOMIZED_ALGEBRA": "host"},
             "kernels, the code of 20:20 (cuSPARSE transpose, checks at once, cuRAND normal)": {
                 "MPIML_SPARSE_TRANSPOSE": "cusparse", "MPIML_RANDOMIZED_CHECKS": "now",
                 "MPIML_DEVICE_NORMAL": "curand", "MPIML_RANDOMIZED_FINAL": "explicit"}}
_VARIANT_KEYS = ("MPIML_SPARSE_TRANSPOSE", "MPIML_RANDOMIZED_ALGEBRA", "MPIML_DEVICE_NORMAL", "MPIML_RANDOMIZED_CHECKS",
                 "MPIML_RANDOMIZED_FINAL")


def _set_variant(env):
    for key in _VARIANT_KEYS:
        os.environ.pop(key, None)
    os.environ.update(env)


def _traced_fit(fit, top):
    """One fit under ``scripts/profile_fit.py``'s tracer, pointed at the decomposition's modules."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
    import profile_fit

    from mpiml.comm import get_comm

    profile_fit._TRACED = ("mpiml.decomposition._truncated_svd", "mpiml.decomposition._solvers",
                           "mpiml.decomposition._pca", "mpiml.utils._linalg", "mpiml.utils._validation",
                           "mpiml.kernels.sparse")
    profile_fit._trace(fit, get_comm(), print, top)


def _guarded(res, what, fn):
    """``fn()``, or None with the error kept under ``res["errors"][what]`` and printed (one new path failing on
    the GPU host does not cost the rest of the run)."""
    try:
        return fn()
    except Exception as exc:   # noqa: BLE001 - reported, the run goes on
        import traceback

        res.setdefault("errors", {})[what] = traceback.format_exc()
        print(f"  ERROR in {what}: {exc!r}", flush=True)
        return None


def _l2_read_rate(cp, mib=24, reps=64):
    """Bytes a second that every SM together reads from L2: ``mib`` MiB (fits in L2) read ``reps`` times with
    ``ld.global.cg`` (cached in L2 only), best of 5.  The rate a gather of dense rows that stay in L2 cannot beat."""
    from mpiml.bench._common import best_seconds

    kern = cp.RawKernel(_L2_READ, "l2_read")
    x = cp.ones(mib * (1 << 20) // 4, dtype=cp.float32)
    out = cp.zeros(1, dtype=cp.float32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    n4 = x.size // 4
    run = lambda: kern((sms * 8,), (256,), (x, np.int64(n4), np.int32(reps), out))   # noqa: E731
    run()
    sec = best_seconds(run, 5, cp.cuda.Device().synchronize)
    return x.nbytes * reps / sec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=float, default=1e6)
    ap.add_argument("--features", type=float, default=1e5)
    ap.add_argument("--nnz-per-row", type=int, default=100)
    ap.add_argument("--components", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fits", default="kernels,scatter,cusparse", help="MPIML_SPARSE_PRODUCTS modes to fit under")
    ap.add_argument("--profile", type=int, default=16, help="print the top N of a cProfile of one fit in the first "
                    "mode (0: none)")
    ap.add_argument("--chunk-bytes", type=int, default=0, help="also time XᵀU with U's rows by chunks of this many "
                    "bytes (MPIML_SPARSE_GATHER_CHUNK_BYTES; 0: not)")
    ap.add_argument("--timeline", action="store_true", help="one more fit of each kernels variant, its steps timed "
                    "by CUDA events (no synchronisation added)")
    ap.add_argument("--trace", type=int, default=0, help="one more fit traced function by function (device "
                    "synchronised around each call), the top N printed (0: none)")
    ap.add_argument("--fits-only", action="store_true", help="only the TruncatedSVD fits (and --timeline / --trace): "
                    "no product, transpose, column-sum or Ridge timing")
    ap.add_argument("--transposes", action="store_true", help="with --fits-only: the transposes still timed "
                    "(cuSPARSE's, the kernel's, the bucket kernels' phases and bucket widths) and checked")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import cupy as cp
    import cupyx.scipy.sparse as csp

    from mpiml.bench._common import best_seconds
    from mpiml.bench.ml_decomp import _gpu_rates
    from mpiml.decomposition import TruncatedSVD
    from mpiml.kernels import sparse
    from mpiml.kernels.sparse import _launch as sparse_launch
    from mpiml.utils._linalg import column_sums

    n, d, k = int(args.rows), int(args.features), args.nnz_per_row
    b = args.components + 10
    rs = cp.random.RandomState(0)
    cols = cp.sort(rs.randint(0, d, size=(n, k), dtype=cp.int64), axis=1).astype(cp.int32).ravel()
    vals = rs.random_sample(n * k, dtype=cp.float32)
    X = csp.csr_matrix((vals, cols, cp.arange(0, n * k + 1, k, dtype=cp.int32)), shape=(n, d))
    # the columns are drawn with replacement: ~5 % of the rows hold a column twice.  Summed here, once, so that
    # every run fits the same canonical matrix: cuSPARSE's X @ V sums them in place (cupyx calls sum_duplicates),
    # so before --fits-only (20:31) the fits ran on the summed X, and after it on X with duplicates, whose
    # variances take the exact path from X (a copy of X with its duplicates summed, 212 ms a fit: the step of
    # 21:10 and 22:25).
    drawn = X.nnz
    X_dup = X.copy()              # kept: one fit on it shows that step (key "kernels, X with duplicates")
    X.sum_duplicates()
    nnz = X.nnz
    V = rs.standard_normal((d, b), dtype=cp.float32)
    U = rs.standard_normal((n, b), dtype=cp.float32)
    v, u = V[:, 0].copy(), U[:, 0].copy()
    sync = cp.cuda.Device().synchronize
    name, bw = _gpu_rates(cp)[:2]       # the HBM rate of mpiml bench ml's floors (datasheet, else measured)
    csr_bytes = nnz * 8 + (n + 1) * 4
    res = {"device": name, "hbm_Bps": bw, "rows": n, "features": d, "nnz": nnz, "duplicates_summed": drawn - nnz,
           "b": b,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python3 benchmarks/sparse/spmm_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "times_s": {}, "floors_s": {}}
    t = res["times_s"]
    XT = X.T.tocsr()
    err = {}
    res["transpose kernel equals cusparse"] = None

    def same(XTk):
        return bool((XTk.indptr == XT.indptr).all() and (XTk.indices == XT.indices).all()
                    and (XTk.data == XT.data).all())

    if args.transposes or not args.fits_only:     # the bucket transpose: whole, by phases, by bucket widths
        t["transpose X.T.tocsr()"] = best_seconds(lambda: X.T.tocsr(), args.repeats, sync)

        def buckets():
            sparse.csr_transpose_buckets(X)
            t["transpose buckets"] = best_seconds(lambda: sparse.csr_transpose_buckets(X), args.repeats, sync)
            events = []
            sparse.csr_transpose_buckets(X, events=events)
            sync()
            t.update({f"transpose buckets: {name}": cp.cuda.get_elapsed_time(e0, e1) / 1e3
                      for (_, e0), (name, e1) in zip(events, events[1:])})
            res["transpose buckets equals cusparse"] = same(sparse.csr_transpose_buckets(X))
            res["transpose buckets shift"] = sparse.bucket_shift(d)
            for shift, threads in ((6, 1024), (7, 1024), (8, 1024), (9, 1024), (10, 1024), (7, 512), (8, 512),
                                   (8, 256)):
                os.environ["MPIML_SPARSE_BUCKET_SHIFT"] = str(shift)
                os.environ["MPIML_SPARSE_BUCKET_THREADS"] = str(threads)
                name = f"transpose buckets, 2^{shift} columns a bucket, {threads} threads"
                try:
                    if sparse.buckets_supported(X):
                        sparse.csr_transpose_buckets(X)
                        t[name] = best_seconds(lambda: sparse.csr_transpose_buckets(X), args.repeats, sync)
                        res[name + ", equals cusparse"] = same(sparse.csr_transpose_buckets(X))
                finally:
                    os.environ.pop("MPIML_SPARSE_BUCKET_SHIFT", None)
                    os.environ.pop("MPIML_SPARSE_BUCKET_THREADS", None)
            print("  transposes (ms):", {k: round(v * 1e3, 3) for k, v in t.items() if k.startswith("transpose")},
                  flush=True)

        _guarded(res, "transpose buckets", buckets)
    if args.transposes and args.fits_only:        # the kernel transpose whole, for the comparison
        def kernel_alone():
            sparse.csr_transpose(X)
            t["transpose kernel"] = best_seconds(lambda: sparse.csr_transpose(X), args.repeats, sync)
            res["transpose kernel equals cusparse"] = same(sparse.csr_transpose(X))

        _guarded(res, "transpose kernel", kernel_alone)
    if not args.fits_only:        # the products, transposes and column sums one by one
        def kernel_transpose():
            t["transpose kernel"] = best_seconds(lambda: sparse.csr_transpose(X), args.repeats, sync)
            XTk = sparse.csr_transpose(X)
            return None if XTk is None else bool(
                (XTk.indptr == XT.indptr).all() and (XTk.indices == XT.indices).all() and (XTk.data == XT.data).all())

        res["transpose kernel equals cusparse"] = _guarded(res, "transpose kernel", kernel_transpose)

        def transpose_phases(how):                  # where the kernel transpose's time goes (events), by each count
            os.environ["MPIML_SPARSE_TRANSPOSE_COUNTS"] = how
            try:
                sparse.csr_transpose(X)
                t[f"transpose kernel, {how} counts"] = best_seconds(lambda: sparse.csr_transpose(X), args.repeats, sync)
                events = []
                sparse.csr_transpose(X, events=events)
                sync()
                t.update({f"transpose kernel, {how} counts: {name}": cp.cuda.get_elapsed_time(e0, e1) / 1e3
                          for (_, e0), (name, e1) in zip(events, events[1:])})
                XTk = sparse.csr_transpose(X)
                res[f"transpose kernel, {how} counts, equals cusparse"] = bool(
                    (XTk.indptr == XT.indptr).all() and (XTk.indices == XT.indices).all()
                    and (XTk.data == XT.data).all())
            finally:
                os.environ.pop("MPIML_SPARSE_TRANSPOSE_COUNTS", None)

        for how in ("global", "smem", "blocks"):
            _guarded(res, f"transpose phases, {how} counts", lambda how=how: transpose_phases(how))
        t["XV cusparse"] = best_seconds(lambda: X @ V, args.repeats, sync)
        for gather in sparse.GATHERS:       # the float4 gather (default) and the value-a-lane one
            os.environ["MPIML_SPARSE_GATHER"] = gather
            t[f"XV kernel gather {gather}"] = best_seconds(lambda: sparse.csr_matmul(X, V), args.repeats, sync)
            t[f"XtU kernel gather {gather} on XT"] = best_seconds(
                lambda: sparse.csr_matmul(XT, U, out_dtype=np.float64), args.repeats, sync)
        os.environ.pop("MPIML_SPARSE_GATHER", None)
        sweep = res["blocks_per_sm_sweep_s"] = {}          # the grid of the gathers (grid-stride, 256 threads a block)
        for per_sm in (4, 8, 16, 32, 64, 128):
            sparse_launch.MAX_BLOCKS_PER_SM = per_sm
            sweep[f"XV {per_sm}"] = best_seconds(lambda: sparse.csr_matmul(X, V), args.repeats, sync)
            sweep[f"XtU {per_sm}"] = best_seconds(lambda: sparse.csr_matmul(XT, U, out_dtype=np.float64), args.repeats,
                                                  sync)
        sparse_launch.MAX_BLOCKS_PER_SM = 64
        print("  gathers by blocks per SM (ms):", {k: round(v * 1e3, 3) for k, v in sweep.items()}, flush=True)
        chunks = None
        if args.chunk_bytes:                        # U's rows a chunk at a time, each chunk staying in L2 (opt-in)
            os.environ["MPIML_SPARSE_GATHER_CHUNK_BYTES"] = str(args.chunk_bytes)
            chunks = sparse.gather_chunks(XT, b)
            os.environ.pop("MPIML_SPARSE_GATHER_CHUNK_BYTES", None)
        res["gather_chunks"] = None if chunks is None else chunks.K
        if chunks is not None:
            t[f"XtU kernel gather vec4 on XT, {chunks.K} chunks"] = best_seconds(
                lambda: sparse.csr_matmul(XT, U, out_dtype=np.float64, chunks=chunks), args.repeats, sync)
            one = sparse.csr_matmul(XT, U, out_dtype=np.float64)
            res["XtU chunked vs one launch (max rel diff)"] = float(
                cp.abs(sparse.csr_matmul(XT, U, out_dtype=np.float64, chunks=chunks) - one).max() / cp.abs(one).max())
            del one
        t["XtU cusparse X.T@U"] = best_seconds(lambda: X.T @ U, args.repeats, sync)
        t["XtU cusparse stored XT"] = best_seconds(lambda: XT @ U, args.repeats, sync)
        for dt in (np.float64, np.float32):
            t[f"XtU kernel scatter {'f64' if dt == np.float64 else 'f32'}"] = best_seconds(
                lambda: sparse.csr_rmatmul_scatter(X, U, dt), args.repeats, sync)
        _guarded(res, "scatter4", lambda: t.__setitem__("XtU kernel scatter f32 float4 atomics", best_seconds(
            lambda: sparse.csr_rmatmul_scatter4(X, U), args.repeats, sync)))
        t["Xv cusparse"] = best_seconds(lambda: X @ v, args.repeats, sync)
        t["Xv kernel rowdot"] = best_seconds(lambda: sparse.csr_matmul(X, v, out_dtype=np.float64), args.repeats, sync)
        t["Xtu cusparse stored XT"] = best_seconds(lambda: XT @ u, args.repeats, sync)
        t["Xtu cusparse X.T@u"] = best_seconds(lambda: X.T @ u, args.repeats, sync)
        t["Xtu kernel rowdot on XT"] = best_seconds(lambda: sparse.csr_matmul(XT, u, out_dtype=np.float64),
                                                    args.repeats,
                                                    sync)
        t["Xtu kernel scatter"] = best_seconds(lambda: sparse.csr_rmatmul_scatter(X, u), args.repeats, sync)
        m = cp.asarray(rs.standard_normal(d, dtype=cp.float64))
        t["XtXp kernel normal (one read)"] = best_seconds(lambda: sparse.csr_normal_vec(X, v, m @ v.astype(cp.float64)),
                                                          args.repeats, sync)
        t["column pieces: build"] = best_seconds(lambda: sparse.column_pieces(X), args.repeats, sync)
        P = sparse.column_pieces(X)
        res["column_pieces"] = None if P is None else P.K
        if P is not None:
            t["Xv pieces (shared memory)"] = best_seconds(lambda: P.dot(v), args.repeats, sync)
            t["Xtu pieces (shared memory)"] = best_seconds(lambda: P.tdot(u), args.repeats, sync)
        t["column sums (bincount)"] = best_seconds(lambda: column_sums(X), args.repeats, sync)
        t["column moments (kernel on XT)"] = best_seconds(lambda: sparse.csr_row_moments(XT), args.repeats, sync)
        # correctness of what was timed
        ref = (XT @ U).astype(cp.float64)
        os.environ["MPIML_SPARSE_GATHER"] = "scalar"
        scalar = sparse.csr_matmul(X, V)
        os.environ.pop("MPIML_SPARSE_GATHER", None)
        err = {"XV kernel vs cusparse": float(cp.abs(sparse.csr_matmul(X, V) - X @ V).max() / cp.abs(X @ V).max()),
               "XV vec4 vs scalar gather": float(cp.abs(sparse.csr_matmul(X, V) - scalar).max() / cp.abs(scalar).max()),
               "XtU gather vs cusparse": float(cp.abs(sparse.csr_matmul(XT, U, out_dtype=np.float64) - ref).max()
                                               / cp.abs(ref).max()),
               "XtU scatter vs cusparse": float(cp.abs(sparse.csr_rmatmul_scatter(X, U) - ref).max()
                                                / cp.abs(ref).max())}
        err["XtU scatter float4 atomics vs cusparse"] = _guarded(res, "scatter4 check", lambda: float(
            cp.abs(sparse.csr_rmatmul_scatter4(X, U) - ref).max() / cp.abs(ref).max()))
        res["max_rel_diff"] = err
    f = res["floors_s"]
    f["XV (CSR once, V once, Y written)"] = (csr_bytes + d * b * 4 + n * b * 4) / bw
    f["XtU (CSR once, U once, Y written)"] = (csr_bytes + n * b * 4 + d * b * 8) / bw
    f["Xv"] = (csr_bytes + d * 4 + n * 8) / bw
    f["gathers of V rows (bytes, from L2)"] = nnz * b * 4
    l2 = res["l2_read_Bps"] = _l2_read_rate(cp)
    sectors = nnz * (-(-b * 4 // 32)) * 32
    f["XV L2 gathers (nnz*b*4 at the L2 read rate)"] = nnz * b * 4 / l2
    f["XV L2 sectors (32 B each at the L2 read rate)"] = sectors / l2
    f["transpose (read CSR, write CSR)"] = 2 * csr_bytes / bw
    fits = res["fits_s"] = {}
    for mode in [m for m in args.fits.split(",") if m]:
        os.environ["MPIML_SPARSE_PRODUCTS"] = mode
        est = TruncatedSVD(args.components)
        fits[mode] = best_seconds(lambda: est.fit(X), 3, sync)
        fits[mode + " singular_values"] = est.singular_values_.get().tolist()
        if mode == "kernels":             # the same fit with the value-a-lane gather, for comparison
            for vname, env in _VARIANTS.items():
                if env:
                    _set_variant(env)

                    def variant(vname=vname):
                        fits[vname] = best_seconds(lambda: est.fit(X), 3, sync)
                        fits[vname + " singular_values"] = est.singular_values_.get().tolist()
                        ref_s = np.asarray(fits["kernels singular_values"])
                        res.setdefault("singular_values_max_rel_diff_vs_kernels", {})[vname] = float(
                            np.abs(np.asarray(fits[vname + " singular_values"]) - ref_s).max() / ref_s.max())
                    _guarded(res, vname, variant)
            _set_variant({})

            def with_duplicates():    # the matrix of the 21:10 and 22:25 passes: the variances' exact path from X
                fits["kernels, X with duplicates"] = best_seconds(lambda: est.fit(X_dup), 3, sync)
                if args.timeline:
                    from mpiml.decomposition._solvers import timeline

                    with timeline() as marks:
                        est.fit(X_dup)
                    rows = res.setdefault("timelines", {})["kernels, X with duplicates"] = _timeline_rows(marks)
                    _print_timeline("kernels, X with duplicates", rows)
            _guarded(res, "X with duplicates", with_duplicates)
            os.environ["MPIML_SPARSE_GATHER"] = "scalar"
            fits["kernels, scalar gather"] = best_seconds(lambda: est.fit(X), 3, sync)
            os.environ.pop("MPIML_SPARSE_GATHER", None)
            if args.chunk_bytes:                                      # XᵀU by L2-sized chunks of U's rows
                os.environ["MPIML_SPARSE_GATHER_CHUNK_BYTES"] = str(args.chunk_bytes)
                fits["kernels, XtU chunked"] = best_seconds(lambda: est.fit(X), 3, sync)
                os.environ.pop("MPIML_SPARSE_GATHER_CHUNK_BYTES", None)
    ridge = res["ridge_fits_s"] = {}
    if not args.fits_only:
        # sparse Ridge (sparse_cg, tol 1e-4 as the benchmark) per mode against ten lines of cupyx CG on XᵀX + alpha I
        import cupyx.scipy.sparse.linalg as sla

        from mpiml.linear_model import Ridge

        w_true = rs.standard_normal(d, dtype=cp.float32)
        y = X @ w_true + rs.standard_normal(n, dtype=cp.float32)
        ridge = res["ridge_fits_s"] = {}
        for mode in [m for m in args.fits.split(",") if m]:
            os.environ["MPIML_SPARSE_PRODUCTS"] = mode
            est = Ridge(alpha=1.0, solver="sparse_cg", tol=1e-4, fit_intercept=False)
            ridge[mode + " (no intercept)"] = best_seconds(lambda: est.fit(X, y), 3, sync)
            est_i = Ridge(alpha=1.0, tol=1e-4)
            ridge[mode + " (defaults)"] = best_seconds(lambda: est_i.fit(X, y), 3, sync)
            ridge[mode + " iterations"] = int(np.sum(est_i._n_krylov_iter))
    os.environ.pop("MPIML_SPARSE_PRODUCTS", None)
    if args.timeline and "kernels" in args.fits.split(","):
        from mpiml.decomposition._solvers import timeline

        res.setdefault("timelines", {})
        for vname, env in _VARIANTS.items():
            _set_variant(env)

            def one(vname=vname):
                est = TruncatedSVD(args.components)
                est.fit(X)
                sync()
                with timeline() as marks:
                    est.fit(X)
                rows = res["timelines"][vname] = _timeline_rows(marks)
                res.setdefault("timeline_kinds_ms", {})[vname] = _timeline_kinds(rows)
                _print_timeline(vname, rows)
            _guarded(res, "timeline " + vname, one)
        _set_variant({})
    if args.trace:
        _guarded(res, "trace", lambda: _traced_fit(lambda: TruncatedSVD(args.components).fit(X), args.trace))
    if not args.fits_only:
        op = sla.LinearOperator((d, d), matvec=lambda q: XT @ (X @ q) + 1.0 * q, dtype=X.dtype)
        rhs = XT @ y
        ridge["cupyx cg peer (XT formed outside)"] = best_seconds(lambda: sla.cg(op, rhs, rtol=1e-4), 3, sync)
        ridge["cupyx cg peer with XT formed"] = best_seconds(
            lambda: sla.cg(sla.LinearOperator((d, d), matvec=lambda q, T=X.T.tocsr(): T @ (X @ q) + q, dtype=X.dtype),
                           rhs, rtol=1e-4), 3, sync)
        for key, val in ridge.items():
            print(f"  Ridge {key:<40}{val * 1e3 if 'iterations' not in key else val:>10.2f}")
    if args.profile and fits:     # TruncatedSVD's (after the fits, warm), and Ridge's unless --fits-only
        import cProfile

        os.environ["MPIML_SPARSE_PRODUCTS"] = args.fits.split(",")[0]
        profiled = [("TruncatedSVD", lambda: TruncatedSVD(args.components).fit(X), args.profile)]
        if not args.fits_only:
            profiled.append(("Ridge", lambda: Ridge(alpha=1.0, tol=1e-4).fit(X, y), args.profile // 2))
        for what, fit, top in profiled:
            prof = cProfile.Profile()
            prof.enable()
            fit()
            sync()
            prof.disable()
            print(f"  {what}:")
            _print_profile(prof, top)
    os.environ.pop("MPIML_SPARSE_PRODUCTS", None)
    # X Ω, 2 per power iteration, Qᵀ X, the projection, the variances (they read Xᵀ's values twice: one pass),
    # each the CSR arrays once and the n x b dense block once
    passes = 2 * 5 + 4
    res["tsvd_floor_s"] = passes * (csr_bytes + n * b * 4) / bw
    # beside it (not instead): the 13 products' gathers of dense rows at the measured L2 read rate
    res["tsvd_l2_gather_floor_s"] = 13 * nnz * b * 4 / l2
    print(f"{name}: CSR {n} x {d}, {nnz} values, b = {b}")
    for key, val in t.items():
        print(f"  {key:<36}{val * 1e3:>10.3f} ms")
    for key, val in f.items():
        print(f"  floor {key:<30}{val * 1e3 if 'bytes' not in key else val / 1e9:>10.3f} " +
              ("GB" if "bytes" in key else "ms"))
    for key, val in fits.items():
        if not key.endswith("values"):
            print(f"  TruncatedSVD({args.components}) fit, {key:<12}{val * 1e3:>10.2f} ms "
                  f"({val / res['tsvd_floor_s']:.1f} x the floor {res['tsvd_floor_s'] * 1e3:.2f} ms)")
    print(f"  L2 read rate (measured) {l2 / 1e12:.2f} TB/s; the fit's 13 products gather {13 * nnz * b * 4 / 1e9:.1f} GB "
          f"of dense rows: {res['tsvd_l2_gather_floor_s'] * 1e3:.2f} ms at that rate")
    print("  max relative differences:", err)
    print("  singular values against the default fit (max rel diff):",
          res.get("singular_values_max_rel_diff_vs_kernels"))
    print("  transpose kernel equals cuSPARSE's:", res["transpose kernel equals cusparse"],
          "; bucket transpose:", res.get("transpose buckets equals cusparse"))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
