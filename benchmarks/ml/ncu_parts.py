"""Target for Nsight Compute: one part of a tensor-core Lloyd step, launched three times at one shape.

    ncu ... python benchmarks/ml/ncu_parts.py N D K DTYPE PART [WMT,BN,DK,MINB]

PART: ``assign`` (arg-min kernel), ``kernel`` (Lloyd kernel without its sums; float32 with k <= 64: the arg-min
kernel and ``mpiml_distances_step_totals``, as a step runs them), ``sums-simt`` /
``sums-mma`` (the sums passes alone), ``fused-smem`` / ``fused-mma`` (the fused Lloyd kernels),
``step-auto`` / ``step-tc`` / ``step-fused`` / ``step-gemm`` (a whole step of that kernel family, as
``lloyd_step_packed(method=...)`` runs it; for ``step-fused`` the fourth argument may be the SIMT
accumulator, ``double`` or ``float``, instead of a tile).
``MPIML_KERNEL_LINEINFO=1`` compiles with source lines (Nsight's source view).
"""

import sys

import cupy as cp

from mpiml.kernels import distances

n, d, k = (int(float(a)) for a in sys.argv[1:4])
dtype, part = sys.argv[4], sys.argv[5]
extra = sys.argv[6] if len(sys.argv) > 6 else None
tile = tuple(int(v) for v in extra.split(",")) if extra and not part.startswith("step-") else None
rs = cp.random.RandomState(0)
X = rs.standard_normal((n, d), dtype=cp.float32).astype(dtype)
C = X[:k].copy()
shift = cp.zeros(d, dtype=dtype)
w = cp.ones(n, dtype=dtype)
labels = cp.full(n, -1, cp.int32)
mind = cp.empty(n, dtype=dtype)
out = cp.zeros(k * d + k + 2)
if not part.startswith("step-"):            # labels for the sums passes (a step needs none; it may be SIMT-only)
    distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, accum="pass", sums="none")
for _ in range(3):
    if part == "assign":
        distances._tc_launch(X, C, shift, None, labels, mind, out, lloyd=False, tile=tile)
    elif part == "kernel":
        distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile, accum="pass", sums="none")
    elif part.startswith("sums-"):
        distances._sums_pass(X, shift, w, labels, k, out, kind=part[5:])
    elif part.startswith("step-"):
        distances.lloyd_step_packed(X, C, shift=shift, labels=labels, mind=mind, accum=extra, method=part[5:])
    elif part.startswith("fused-"):
        distances._tc_launch(X, C, shift, w, labels, mind, out, lloyd=True, tile=tile, accum=part[6:])
    else:
        sys.exit(f"unknown part {part!r}")
cp.cuda.Device().synchronize()
