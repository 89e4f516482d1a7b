"""KMeans on a sparse LIBSVM file that could never be densified: peak memory per rank, and the
sparse result against the dense one on a slice.

    mpiexec -n 4 python benchmarks/sparse/kmeans_libsvm.py --rows 200000 --features 1000000 \
        --nnz 16 --json benchmarks/results/sparse_kmeans_vm.json

Rank 0 writes the file (seeded, ``--nnz`` entries per row around one of ``--k`` sparse
centres), every rank reads its byte range with ``mpiml.datasets.load_svmlight`` (CSR),
fits KMeans, and reports its peak resident memory (``ru_maxrss``) next to what the
dense matrix would need. Then the first ``--check-rows`` rows are fitted sparse and
dense from the same initial centres, and the two results compared.
"""

import argparse
import json
import os
import platform
import resource
import sys
import time

import numpy as np


def write_libsvm(path, rows, features, nnz, k, seed):
    rng = np.random.RandomState(seed)
    support = [rng.choice(features, size=nnz * 2, replace=False) for _ in range(k)]
    with open(path, "w") as f:
        for start in range(0, rows, 10000):
            lines = []
            for i in range(start, min(rows, start + 10000)):
                c = i % k
                cols = np.sort(rng.choice(support[c], size=nnz, replace=False))
                vals = 1.0 + 0.1 * rng.randn(nnz) + c
                lines.append(f"{c} " + " ".join(f"{j + 1}:{v:.4f}" for j, v in zip(cols, vals)))
            f.write("\n".join(lines) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200000)
    p.add_argument("--features", type=int, default=1000000)
    p.add_argument("--nnz", type=int, default=16)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--check-rows", type=int, default=4000)
    p.add_argument("--file", default=None, help="LIBSVM file to use (default: a temporary one)")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import mpiml
    from mpiml.cluster import KMeans
    from mpiml.comm import get_comm
    from mpiml.datasets import load_svmlight

    comm = get_comm()
    path = args.file or os.path.join("/tmp", f"mpiml_sparse_{args.rows}x{args.features}.svm")
    if comm.rank == 0 and not os.path.exists(path):
        t0 = time.perf_counter()
        write_libsvm(path, args.rows, args.features, args.nnz, args.k, seed=0)
        print(f"wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s",
              flush=True)
    comm.barrier()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    X, y = load_svmlight(path, n_features=args.features, comm=comm)
    t_load = time.perf_counter() - t0
    comm.barrier()
    t0 = time.perf_counter()
    with mpiml.profile() as prof:
        km = KMeans(args.k, init="k-means++", n_init=1, max_iter=20, random_state=0).fit(X)
    t_fit = comm.allreduce_obj(time.perf_counter() - t0, op="max")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peaks = comm.allgather_obj(peak)
    rows = comm.allgather_obj(int(X.shape[0]))
    nnz = comm.allreduce_obj(int(X.nnz))

    # correctness on a slice: sparse and dense fits from the same initial centres
    Xc = X[:max(0, min(X.shape[0], args.check_rows // comm.size))]
    cols = np.unique(comm.allgatherv(np.unique(Xc.indices).astype(np.int64))) if comm.size > 1 \
        else np.unique(Xc.indices)
    Xc = Xc[:, cols]
    init = np.asarray(km.cluster_centers_[:, cols])
    a = KMeans(args.k, init=init, max_iter=50).fit(Xc)
    b = KMeans(args.k, init=init, max_iter=50).fit(Xc.toarray())
    same_labels = comm.allreduce_obj(int(np.array_equal(a.labels_, b.labels_)), op="min") == 1
    rel_inertia = abs(a.inertia_ - b.inertia_) / max(b.inertia_, 1e-300)
    max_centre = float(np.abs(a.cluster_centers_ - b.cluster_centers_).max())
    slice_rows = int(comm.allreduce_obj(int(Xc.shape[0])))
    allreduce_bytes = comm.allgather_obj(prof.summary()["ops"].get("allreduce", {}).get("bytes"))[0]

    if comm.rank == 0:
        dense_gib = args.rows * args.features * 8 / 2**30
        result = {
            "machine": f"{platform.node()} ({os.cpu_count()} cores)", "date": time.strftime("%Y-%m-%d"),
            "command": "mpiexec -n %d python %s" % (comm.size, " ".join(sys.argv)),
            "ranks": comm.size, "rows": args.rows, "features": args.features, "nnz": nnz,
            "rows_per_rank": rows, "load_seconds": t_load, "fit_seconds": t_fit, "iterations": km.n_iter_,
            "inertia": km.inertia_, "peak_rss_mib_per_rank": peaks, "rss_before_load_mib": rss0,
            "dense_matrix_gib_total": dense_gib,
            "allreduce_bytes": allreduce_bytes,
            "slice_check": {"rows": slice_rows, "columns": int(len(cols)),
                            "labels_equal": same_labels, "inertia_rel_diff": rel_inertia,
                            "max_centre_abs_diff": max_centre},
        }
        print(f"{args.rows} x {args.features} sparse ({nnz} stored values), {comm.size} ranks: load {t_load:.2f} s, "
              f"fit {t_fit:.2f} s ({km.n_iter_} iterations); peak RSS per rank {max(peaks):.0f} MiB "
              f"(the dense matrix would be {dense_gib:.0f} GiB); slice of {result['slice_check']['rows']} rows: "
              f"labels equal {same_labels}, inertia rel diff {rel_inertia:.1e}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
