"""Target for Nsight Compute: three Lloyd steps of one distance kernel family at one shape.

    ncu ... python benchmarks/ml/ncu_lloyd.py N D K [float32|float64] [double|float] [auto|tc|fused|gemm]
"""

import sys

import cupy as cp

from mpiml.kernels import distances

n, d, k = (int(float(a)) for a in sys.argv[1:4])
dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
accum = sys.argv[5] if len(sys.argv) > 5 else "double"
method = sys.argv[6] if len(sys.argv) > 6 else "auto"
rs = cp.random.RandomState(0)
X = rs.standard_normal((n, d), dtype=cp.float32).astype(dtype)
C = X[:k].copy()
shift = cp.zeros(d, dtype=dtype)
labels = cp.full(n, -1, cp.int32)
mind = cp.empty(n, dtype=dtype)
for _ in range(3):
    distances.lloyd_step_packed(X, C, shift=shift, labels=labels, mind=mind, accum=accum, method=method)
cp.cuda.Device().synchronize()
