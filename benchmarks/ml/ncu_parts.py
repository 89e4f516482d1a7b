"""Target for Nsight Compute: one part of a tensor-core Lloyd step, launched three times at one shape.

    ncu ... python benchmarks/ml/ncu_parts.py N D K DTYPE PART [WMT,BN,DK,MINB]

PART: ``assign`` (arg-min kernel), ``kernel`` (Lloyd kernel without its sums), ``sums-simt`` /
``sums-mma`` (the sums passes alone), ``fused-smem`` / ``fused-mma`` (the fused Lloyd kernels).
``MPIML_KERNEL_LINEINFO=1`` compiles with source lines (Nsight's source view).
"""

import sys

import cupy as cp

from mpiml.kernels import distances

n, d, k = (int(float(a)) for a in sys.argv[1:4])
dtype, part = sys.argv[4], sys.argv[5]
tile = tuple(int(v) for v in sys.argv[6].split(",")) if len(sys.argv) > 6 else None
rs = cp.random.RandomState(0)
X = rs.standard_normal((n, d), dtype=cp.float32).astype(dtype)
C = X[:k].copy()
shift = cp.zeros(d, dtype=dtype)
w = cp.ones(n, dtype=dtype)
labels = cp.full(n, -1, cp.int32)
mind = cp.empty(n, dtype=dtype)
out = cp.zeros(k * d + k + 2)
distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, accum="pass", sums="none")
for _ in range(3):
    if part == "assign":
        distances._tc_launch(X, C, shift, None, labels, mind, out, lloyd=False, tile=tile)
    elif part == "kernel":
        distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile, accum="pass", sums="none")
    elif part.startswith("sums-"):
        distances._sums_pass(X, shift, w, labels, k, out, kind=part[5:])
    elif part.startswith("fused-"):
        distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile, accum=part[6:])
    else:
        sys.exit(f"unknown part {part!r}")
cp.cuda.Device().synchronize()
