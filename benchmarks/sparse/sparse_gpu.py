"""Sparse KMeans and NearestNeighbors on the GPU at LIBSVM scale, never densified.

    mpirun -n 1 python3 benchmarks/sparse/sparse_gpu.py --out $OUT/sparse_gpu.json          # 10^6 x 10^6
    mpirun -n 2 python3 benchmarks/sparse/sparse_gpu.py --scale 0.1 --out $OUT/sparse_gpu_2.json  # 2 ranks, 1 GPU
    mpiexec -n 2 python benchmarks/sparse/sparse_gpu.py --device cpu --scale 0.002 --out /tmp/s.json

The matrix is LIBSVM-like: ``--rows`` x ``--features`` (10^6 x 10^6 at ``--scale 1``) with about
``--nnz-per-row`` stored values per row, drawn block by block from seeded generators (the same
global matrix on any number of ranks, each rank drawing only its rows): 40 % of a row's features
from the block of one of ``--topics`` topics (clusters to find), 60 % from a power law over all
features (a few very frequent features, a long tail, as in text and click data).  It is built
directly as ``cupyx.scipy.sparse`` CSR on the GPU (SciPy CSR with ``--device cpu``), or, with
``--file PATH``, written as a LIBSVM file and read back with ``mpiml.datasets.load_svmlight``.

Measured: KMeans (``--k`` clusters, ``--iters`` Lloyd iterations from k-means++) and
NearestNeighbors (``--neighbors`` neighbours of ``--queries`` sparse queries), the time of each
(the slowest rank), and per rank the peak of live bytes in CuPy's memory pool (a memory hook that
adds every allocation and subtracts every release), the pool's reserved high-water mark and what
the dense matrix would have needed.  Checked: on a slice (the first ``--check-rows`` rows and the
``--check-features`` most frequent features among them), the sparse fits equal the dense ones
(same mpiml estimators on the dense slice, same initial centres) and scikit-learn's on the host.
The JSON goes to ``--out``; the exit status is 1 when a check fails.
"""

import argparse
import datetime
import json
import platform
import sys
import time

import numpy as np

BLOCK_ROWS = 1 << 16
TOPIC_SHARE = 0.4
POWER = 3.0  # feature index = features * u**POWER: P(index < f) = (f / features) ** (1 / POWER)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--scale", type=float, default=1.0, help="rows and features are 10^6 times this")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--features", type=int, default=None)
    p.add_argument("--nnz-per-row", type=int, default=100)
    p.add_argument("--topics", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--k", type=int, default=64, help="KMeans clusters")
    p.add_argument("--iters", type=int, default=5, help="KMeans Lloyd iterations (max_iter)")
    p.add_argument("--init", default="k-means++", choices=("k-means++", "random", "k-means||"))
    p.add_argument("--neighbors", type=int, default=10)
    p.add_argument("--queries", type=int, default=10_000, help="queries in all (split over ranks)")
    p.add_argument("--check-rows", type=int, default=2000)
    p.add_argument("--check-features", type=int, default=1000)
    p.add_argument("--file", default=None, help="write the matrix to this LIBSVM file and load it from there")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON results (rank 0 writes)")
    args = p.parse_args(argv)
    args.rows = args.rows or max(1, int(round(1e6 * args.scale)))
    args.features = args.features or max(args.topics, int(round(1e6 * args.scale)))
    return args


# ---------------------------------------------------------------------- the matrix
def _namespaces(device):
    if device == "gpu":
        import cupy
        import cupyx.scipy.sparse as csp

        return cupy, csp
    import scipy.sparse as sp

    return np, sp


def _block(b, n_rows, args, xp, sparse_mod, dtype, stream):
    """Rows ``[b * BLOCK_ROWS, ...)`` of the global matrix (``n_rows`` of them): CSR and topics."""
    rs = xp.random.RandomState(args.seed * 1_000_003 + stream * 7919 + b)
    d, t = args.features, args.topics
    topics = rs.randint(0, t, n_rows)
    n_topic = int(round(args.nnz_per_row * TOPIC_SHARE))
    width = d // t
    cols_topic = topics[:, None].astype(xp.int64) * width + rs.randint(0, width, (n_rows, n_topic))
    u = rs.random_sample((n_rows, args.nnz_per_row - n_topic))
    cols_tail = xp.minimum((u ** POWER * d).astype(xp.int64), d - 1)
    cols = xp.concatenate([cols_topic, cols_tail], axis=1)
    keys = xp.unique((xp.arange(n_rows, dtype=xp.int64)[:, None] * d + cols).ravel())  # sorted, no duplicates
    rows, cols = keys // d, keys % d
    indptr = xp.searchsorted(rows, xp.arange(n_rows + 1, dtype=xp.int64))
    vals = (0.1 + rs.random_sample(keys.shape[0])).astype(dtype)
    idx = xp.int32 if d < 2**31 else xp.int64
    X = sparse_mod.csr_matrix((vals, cols.astype(idx), indptr.astype(idx)), shape=(n_rows, d))
    return X, topics


def make_rows(start, stop, n_total, args, xp, sparse_mod, dtype, stream=0):
    """Global rows ``[start, stop)`` of a matrix of ``n_total`` rows, drawn block by block."""
    parts, topics = [], []
    for b in range(start // BLOCK_ROWS, (max(stop, start + 1) - 1) // BLOCK_ROWS + 1):
        b0, b1 = b * BLOCK_ROWS, min((b + 1) * BLOCK_ROWS, n_total)
        if b1 <= b0:
            break
        X, t = _block(b, b1 - b0, args, xp, sparse_mod, dtype, stream)
        lo, hi = max(start, b0) - b0, min(stop, b1) - b0
        if hi > lo:
            parts.append(X[lo:hi])
            topics.append(t[lo:hi])
    if not parts:
        return sparse_mod.csr_matrix((0, args.features), dtype=dtype), xp.zeros(0, dtype=xp.int64)
    return sparse_mod.vstack(parts).tocsr(), xp.concatenate(topics)


def write_and_load(path, X_local, topics, args, comm, device, dtype):
    """Every rank writes its rows to ``path.partR``; rank 0 joins them; every rank loads its byte range."""
    import os
    import shutil

    from sklearn.datasets import dump_svmlight_file

    from mpiml.datasets import load_svmlight

    host = X_local.get() if device == "gpu" else X_local
    y = topics.get() if device == "gpu" else topics
    part = f"{path}.part{comm.rank}"
    t0 = time.perf_counter()
    dump_svmlight_file(host, y, part, zero_based=False)
    comm.barrier()
    if comm.rank == 0:
        with open(path, "wb") as out:
            for r in range(comm.size):
                with open(f"{path}.part{r}", "rb") as f:
                    shutil.copyfileobj(f, out, 64 << 20)
    comm.barrier()
    os.remove(part)
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    X, _ = load_svmlight(path, n_features=args.features, comm=comm, dtype=dtype, device=device)
    return X, t_write, time.perf_counter() - t0


# ---------------------------------------------------------------------- measuring
class PeakMemory:
    """Peak of live bytes in CuPy's memory pool while active (every malloc added, every free subtracted)."""

    def __init__(self, device):
        self.device = device
        self.live = self.peak = 0
        self._hook = None

    def __enter__(self):
        if self.device == "gpu":
            import cupy

            outer = self

            class _Hook(cupy.cuda.MemoryHook):
                name = "mpiml_peak_memory"

                def malloc_postprocess(self, **kw):
                    if kw.get("mem_ptr"):
                        outer.live += kw["mem_size"]
                        outer.peak = max(outer.peak, outer.live)

                def free_postprocess(self, **kw):
                    outer.live -= kw["mem_size"]

            self.live = self.peak = cupy.get_default_memory_pool().used_bytes()
            self._hook = _Hook()
            self._hook.__enter__()
        return self

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.__exit__(*exc)

    def reset(self):
        self.peak = self.live


def _sync(device):
    if device == "gpu":
        import cupy

        cupy.cuda.Device().synchronize()


def _timed(fn, comm, device):
    comm.barrier()
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    comm.barrier()
    return out, comm.allreduce_obj(time.perf_counter() - t0, op="max")


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


# ---------------------------------------------------------------------- the slice check
def check_slice(args, comm, xp, sparse_mod, dtype):
    """The first ``check_rows`` rows on their ``check_features`` most frequent features: sparse fits equal
    the dense fits (mpiml) and scikit-learn's (rank 0, host)."""
    import scipy.sparse as sp
    from sklearn.cluster import KMeans as SkKMeans
    from sklearn.neighbors import NearestNeighbors as SkNN

    from mpiml.cluster import KMeans
    from mpiml.datasets import shard_bounds
    from mpiml.neighbors import NearestNeighbors

    n = min(args.check_rows, args.rows)
    S, _ = make_rows(0, n, args.rows, args, xp, sparse_mod, dtype)  # the same on every rank
    S = S.get() if hasattr(S, "get") else S
    counts = np.bincount(S.indices, minlength=S.shape[1])
    active = np.sort(np.argsort(-counts, kind="stable")[:args.check_features])
    S = S[:, active].tocsr()
    S.sort_indices()
    Q, _ = make_rows(0, max(1, n // 10), args.rows, args, np, sp, dtype, stream=2)
    Q = Q[:, active].tocsr()
    lo, hi = shard_bounds(n, comm.size, comm.rank)
    qlo, qhi = shard_bounds(Q.shape[0], comm.size, comm.rank)
    k = min(8, n)
    init = S[:k].toarray()
    to_sparse = (lambda A: sparse_mod.csr_matrix(A)) if xp is not np else (lambda A: A)
    to_dense = (lambda A: xp.asarray(A.toarray()))

    km_s = KMeans(k, init=init, n_init=1, max_iter=50, tol=0.0).fit(to_sparse(S[lo:hi]))
    km_d = KMeans(k, init=init, n_init=1, max_iter=50, tol=0.0).fit(to_dense(S[lo:hi]))
    nn_s = NearestNeighbors(n_neighbors=args.neighbors).fit(to_sparse(S[lo:hi]))
    d_s, i_s = nn_s.kneighbors(to_sparse(Q[qlo:qhi]))
    # the dense search asks one more neighbour, to see ties across the k-th place: sparse and dense
    # products round differently in float32, so rows tied there may pick either neighbour
    d_d1, i_d1 = NearestNeighbors(n_neighbors=args.neighbors + 1).fit(to_dense(S[lo:hi])).kneighbors(
        to_dense(Q[qlo:qhi]))
    d_d, i_d = d_d1[:, :-1], i_d1[:, :-1]
    tol = 1e-4 if dtype == np.float32 else 1e-9
    dd1 = _host(d_d1)
    no_tie = dd1[:, -2] < dd1[:, -1] - tol * (1 + dd1[:, -1])
    sets = [set(a) == set(b) for a, b, c in zip(_host(i_s).tolist(), _host(i_d).tolist(), no_tie) if c]
    out = {
        "slice": {"rows": n, "features": int(len(active)), "nnz": int(S.nnz), "density": S.nnz / (n * len(active)),
                  "queries": int(Q.shape[0])},
        "kmeans_centres_max_abs_diff": float(np.abs(_host(km_s.cluster_centers_) - _host(km_d.cluster_centers_)).max()),
        "kmeans_labels_equal": bool(comm.allreduce_obj(int(not np.array_equal(_host(km_s.labels_),
                                                                              _host(km_d.labels_)))) == 0),
        "kmeans_inertia_rel_diff": abs(km_s.inertia_ - km_d.inertia_) / max(km_d.inertia_, 1e-300),
        "knn_distances_max_abs_diff": comm.allreduce_obj(float(np.abs(_host(d_s) - _host(d_d)).max(initial=0)),
                                                         op="max"),
        "knn_sets_equal_where_no_tie": bool(comm.allreduce_obj(int(not all(sets))) == 0),
        "knn_rows_compared": int(comm.allreduce_obj(len(sets))),
        "knn_rows_identical_order": int(comm.allreduce_obj(int((_host(i_s) == _host(i_d)).all(axis=1).sum()))),
    }
    # scikit-learn on the host, whole slice (every rank computes it; rank 0's verdict is reported)
    S64 = S.astype(np.float64)
    sk_km = SkKMeans(k, init=init.astype(np.float64), n_init=1, max_iter=50, algorithm="lloyd", tol=0.0).fit(S64)
    out["sklearn_kmeans_centres_max_abs_diff"] = float(np.abs(_host(km_s.cluster_centers_) -
                                                              sk_km.cluster_centers_).max())
    out["sklearn_kmeans_inertia_rel_diff"] = abs(km_s.inertia_ - sk_km.inertia_) / max(sk_km.inertia_, 1e-300)
    sk_d, sk_i = SkNN(n_neighbors=args.neighbors + 1, algorithm="brute").fit(S64).kneighbors(
        Q[qlo:qhi].astype(np.float64))
    clear = sk_d[:, -2] < sk_d[:, -1] * (1 - 1e-6) - 1e-6  # rows without a tie across the k-th place
    mine = _host(i_s)
    same = [set(a) == set(b) for a, b, c in zip(mine.tolist(), sk_i[:, :-1].tolist(), clear) if c]
    out["sklearn_knn_sets_equal_where_no_tie"] = bool(comm.allreduce_obj(int(not all(same))) == 0)
    out["sklearn_knn_distances_max_abs_diff"] = comm.allreduce_obj(
        float(np.abs(_host(d_s) - sk_d[:, :-1]).max(initial=0)), op="max")
    out["ok"] = bool(out["kmeans_centres_max_abs_diff"] <= tol and out["kmeans_labels_equal"]
                     and out["kmeans_inertia_rel_diff"] <= tol and out["knn_distances_max_abs_diff"] <= tol
                     and out["knn_sets_equal_where_no_tie"] and out["knn_rows_compared"] >= 0.5 * Q.shape[0]
                     and out["sklearn_knn_sets_equal_where_no_tie"]
                     and out["sklearn_knn_distances_max_abs_diff"] <= max(tol, 1e-6)
                     and out["sklearn_kmeans_centres_max_abs_diff"] <= max(tol, 1e-6))
    return out


# ---------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    import mpiml
    from mpiml.cluster import KMeans
    from mpiml.comm import get_comm
    from mpiml.datasets import shard_bounds
    from mpiml.neighbors import NearestNeighbors

    if args.device == "gpu":
        mpiml.init("gpu")  # binds this rank's GPU by its local rank
    comm = get_comm()
    xp, sparse_mod = _namespaces(args.device)
    dtype = np.dtype(args.dtype)
    result = {"machine": platform.node(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": " ".join([f"mpirun -n {comm.size}", sys.executable] + sys.argv),
              "ranks": comm.size, "device": args.device, "args": vars(args)}
    if args.device == "gpu":
        import cupy

        result["gpu"] = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
        result["cupy"] = cupy.__version__

    with PeakMemory(args.device) as mem:
        lo, hi = shard_bounds(args.rows, comm.size, comm.rank)
        (X, topics), t_gen = _timed(lambda: make_rows(lo, hi, args.rows, args, xp, sparse_mod, dtype), comm,
                                    args.device)
        result["generate_seconds"] = t_gen
        if args.file:
            X, t_write, t_load = write_and_load(args.file, X, topics, args, comm, args.device, dtype)
            result.update(file=args.file, write_seconds=t_write, load_seconds=t_load)
        nnz = comm.allreduce_obj(int(X.nnz))
        result["matrix"] = {"rows": args.rows, "features": args.features, "nnz": nnz,
                            "nnz_per_row": nnz / args.rows,
                            "csr_bytes": comm.allreduce_obj(int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)),
                            "dense_bytes_would_be": args.rows * args.features * dtype.itemsize}
        if comm.rank == 0:
            print(f"matrix {args.rows} x {args.features}, {nnz} stored ({nnz / args.rows:.1f} per row), "
                  f"generated in {t_gen:.2f} s", flush=True)

        base = mem.live
        mem.reset()
        km = KMeans(args.k, init=args.init, n_init=1, max_iter=args.iters, tol=0.0, random_state=args.seed)
        _, t_fit = _timed(lambda: km.fit(X), comm, args.device)
        labels, t_pred = _timed(lambda: km.predict(X), comm, args.device)
        kmeans_peak = mem.peak - base
        result["kmeans"] = {"k": args.k, "init": args.init, "n_iter": int(km.n_iter_), "fit_seconds": t_fit,
                            "iter_seconds": [float(s) for s in getattr(km, "_iter_seconds", [])],
                            "predict_seconds": t_pred, "inertia": float(km.inertia_),
                            "labels_equal_predict": bool(comm.allreduce_obj(
                                int(not np.array_equal(_host(labels), _host(km.labels_)))) == 0),
                            "peak_extra_bytes_per_rank": comm.allgather_obj(int(kmeans_peak))}
        if comm.rank == 0:
            print(f"KMeans k={args.k}: fit {t_fit:.2f} s ({km.n_iter_} iterations), predict {t_pred:.2f} s, "
                  f"peak +{kmeans_peak / 2**30:.2f} GiB", flush=True)

        qlo, qhi = shard_bounds(args.queries, comm.size, comm.rank)
        Q, _ = make_rows(qlo, qhi, args.queries, args, xp, sparse_mod, dtype, stream=1)
        base = mem.live
        mem.reset()
        nn = NearestNeighbors(n_neighbors=args.neighbors)
        _, t_nfit = _timed(lambda: nn.fit(X), comm, args.device)
        (dist, ind), t_knn = _timed(lambda: nn.kneighbors(Q), comm, args.device)
        knn_peak = mem.peak - base
        result["neighbors"] = {"n_neighbors": args.neighbors, "queries": args.queries, "fit_seconds": t_nfit,
                               "kneighbors_seconds": t_knn,
                               "queries_per_second": args.queries / t_knn if t_knn > 0 else None,
                               "peak_extra_bytes_per_rank": comm.allgather_obj(int(knn_peak)),
                               "shape_ok": bool(comm.allreduce_obj(int(ind.shape != (qhi - qlo, args.neighbors)))
                                                == 0)}
        if comm.rank == 0:
            print(f"NearestNeighbors k={args.neighbors}: {args.queries} queries in {t_knn:.2f} s, "
                  f"peak +{knn_peak / 2**30:.2f} GiB", flush=True)
        result["peak_live_bytes_per_rank"] = comm.allgather_obj(int(mem.peak))
        if args.device == "gpu":
            import cupy

            result["pool_reserved_bytes_per_rank"] = comm.allgather_obj(
                int(cupy.get_default_memory_pool().total_bytes()))
        del X, Q, dist, ind, km, nn

    check, t_check = _timed(lambda: check_slice(args, comm, xp, sparse_mod, dtype), comm, args.device)
    check["seconds"] = t_check
    result["check"] = check
    ok = check["ok"] and result["kmeans"]["labels_equal_predict"] and result["neighbors"]["shape_ok"]
    result["ok"] = bool(ok)
    if comm.rank == 0:
        print(f"slice check ({check['slice']['rows']} x {check['slice']['features']}): "
              f"{'OK' if ok else 'FAILED'} {json.dumps({k: v for k, v in check.items() if k != 'slice'})}",
              flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
