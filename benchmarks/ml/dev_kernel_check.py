"""Quick check of the fused kernel on one GPU: correctness vs NumPy path and time per Lloyd step."""
import sys, time
import numpy as np
import cupy as cp
from mpiml.cluster import _kmeans_ops as ops, _gpu

def check(n, d, k, dtype):
    rs = np.random.RandomState(0)
    Xh = (rs.randn(n, d) + rs.randint(0, 5, size=(n, 1))).astype(dtype)
    Ch = Xh[rs.choice(n, k, replace=False)]
    shift = Xh.mean(0).astype(dtype)
    w = np.ones(n, dtype)
    lab_h = np.full(n, -1, np.int32); md_h = np.empty(n, dtype)
    ph = ops.lloyd_step(Xh, w, shift, Ch - shift, lab_h, md_h)
    X = cp.asarray(Xh); C = cp.asarray(Ch - shift); sh = cp.asarray(shift); wd = cp.asarray(w)
    lab = cp.full(n, -1, cp.int32); md = cp.empty(n, dtype)
    pd = _gpu.lloyd_step(X, wd, sh, C, lab, md)
    agree = float((lab.get() == lab_h).mean())
    rel = float(np.abs(pd.get() - ph).max() / np.abs(ph).max())
    print(f"n={n} d={d} k={k} {np.dtype(dtype).name}: labels agree {agree:.6f}, packed max rel diff {rel:.2e}, "
          f"config {_gpu.kernel_config(dtype, k, d)}", flush=True)

def timeit(n, d, k, dtype, reps=20):
    X = cp.random.standard_normal((n, d), dtype=cp.float32).astype(dtype)
    C = X[:k].copy(); sh = X[:1000].mean(0); w = cp.ones(n, dtype)
    lab = cp.full(n, -1, cp.int32); md = cp.empty(n, dtype)
    for _ in range(3): _gpu.lloyd_step(X, w, sh, C, lab, md)
    cp.cuda.Device().synchronize()
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    ev0.record()
    for _ in range(reps): _gpu.lloyd_step(X, w, sh, C, lab, md)
    ev1.record(); ev1.synchronize()
    ms = cp.cuda.get_elapsed_time(ev0, ev1) / reps
    floor_mem = n * d * np.dtype(dtype).itemsize / 4.3e12 * 1e3
    ev0.record()
    for _ in range(reps): _gpu.assign(X, sh, C)
    ev1.record(); ev1.synchronize()
    ms_a = cp.cuda.get_elapsed_time(ev0, ev1) / reps
    ev0.record()
    for _ in range(reps): G = X @ C.T
    ev1.record(); ev1.synchronize()
    ms_mm = cp.cuda.get_elapsed_time(ev0, ev1) / reps
    name = _gpu.kernel_config(dtype, k, d)[0]
    kern = _gpu._module().get_function(name)
    print(f"  {name}: regs {kern.num_regs}, local bytes {kern.local_size_bytes}, config {_gpu.kernel_config(dtype, k, d)}")
    print(f"TIME n={n} d={d} k={k} {np.dtype(dtype).name}: lloyd step {ms:.3f} ms, assign only {ms_a:.3f} ms, "
          f"cupy matmul {ms_mm:.3f} ms, read floor {floor_mem:.3f} ms", flush=True)

for args in [(1000, 3, 5, np.float64), (5000, 17, 40, np.float32), (4097, 64, 64, np.float32),
             (3000, 100, 300, np.float64), (3000, 33, 12, np.float32), (20000, 64, 1024, np.float32)]:
    check(*args)
for args in [(10**7, 64, 64, np.float32), (10**7, 64, 64, np.float64), (10**7, 64, 16, np.float32),
             (10**7, 64, 256, np.float32), (10**7, 16, 64, np.float32)]:
    timeit(*args)
