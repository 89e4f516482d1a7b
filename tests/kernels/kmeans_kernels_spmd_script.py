"""The Lloyd step (tensor-core and SIMT kernels) on 1-4 ranks (one GPU each, or ranks sharing GPUs), rank 0 holding no rows.

Run by test_kmeans_kernels.py: the allreduced packed vector equals one process's over all rows.
"""

import cupy as cp
import numpy as np

from mpiml.comm import get_comm
from mpiml.kernels import kmeans

from _spmd import assert_close, check, guarded

comm = get_comm()
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()


def main():
    rs = np.random.RandomState(0)
    n, d, k = 20011, 37, 23
    X = (rs.randn(n, d) + 4 * rs.randint(0, 6, size=(n, 1))).astype(np.float64)
    C = X[rs.choice(n, k, replace=False)].copy()
    w = rs.uniform(0.5, 2.0, n)
    shift = X.mean(0)
    if size == 1:
        lo, hi = 0, n
    else:                                   # rank 0 empty, the others split the rows
        edges = np.linspace(0, n, size).astype(int)
        lo, hi = (0, 0) if rank == 0 else (int(edges[rank - 1]), int(edges[rank]))
    for dtype, method in ((np.float64, "auto"), (np.float32, "auto"), (np.float64, "fused"), (np.float32, "fused")):
        Xl = cp.asarray(X[lo:hi].astype(dtype))
        packed = kmeans.lloyd_step_packed(Xl, cp.asarray((C - shift).astype(dtype)), cp.asarray(w[lo:hi]),
                                             shift=cp.asarray(shift.astype(dtype)), method=method)
        total = comm.allreduce(packed.get()) if size > 1 else packed.get()
        ref = kmeans.lloyd_step_packed(cp.asarray(X.astype(dtype)), cp.asarray((C - shift).astype(dtype)),
                                          cp.asarray(w), shift=cp.asarray(shift.astype(dtype)), method=method).get()
        check(int(total[-1]) == n, f"{np.dtype(dtype).name}: changed labels {int(total[-1])} != {n}")
        rtol = 1e-11 if dtype == np.float64 else 1e-5
        assert_close(total[:-1], ref[:-1], f"{np.dtype(dtype).name} packed sums", rtol=rtol,
                     atol=rtol * np.abs(ref).max())
        if hi == lo:
            check(float(np.abs(packed.get()).sum()) == 0, "the empty shard contributes zeros")


if __name__ == "__main__":
    guarded(main, comm)
