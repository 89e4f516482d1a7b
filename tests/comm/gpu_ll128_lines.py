"""The LL128 kernels' lines in a race (run under mpirun, 2-4 GPUs): many back-to-back calls whose message ends in a
partial line, the peers late by a random fraction of a microsecond to a few, every result checked on the device.

Usage: ``python gpu_ll128_lines.py [--calls N] [--legacy] [--sizes B,...] [--ops allreduce,reduce,direct,twoshot,rs,bcast]
[--spin-ns NS]``.

Only lane 7 of an LL128 line looks at the flag (``ipc_common.cuh``, ``mpiml_ll128_wait``), and a
line that arrives while it is being loaded may be seen in part: its flag with other lanes' 16 bytes
still stale. The soak of 2026-11-28 01:15 (4 x H100) found two wrong results in ~12000 allreduces of
1 MiB on ``ipc/ll128``. The kernels now take a line's data from a second load issued after every
flag of the round was seen (as NCCL's LL128 receive does), the warp converged before its loads.

Here, for sizes of int64 whose last line is partial (1 MiB: 2 words; 256 KiB: 8; 4 MiB: 8; 1 MiB + 40
bytes: 7), ``--calls`` calls of each LL128 path (allreduce ``ipc/ll128``, reduce ``ipc/ll128`` (the
relay), ``ipc/ll128direct`` and ``ipc/ll128twoshot``, roots moving; reduce_scatter ``ipc/ll128``, uneven parts; bcast ``ipc/ll128``) run eagerly
with ``out=`` (the hot launcher), inputs changed every call (a stale lane shows), every rank but the last made late by a random spin, and
every result compared on the device with its closed form. ``--legacy`` also runs the LL128
allreduce kernel without the fix (this source without ``mpiml_ll128_wait``'s ``__syncwarp`` and its
second load), compiled here and launched on the same transport the same number of times, and prints
how many of its results were wrong: the reproducer (it is not an error of this test when it finds
none: a race may not show in a short run).

Prints ``OK: 0 failure(s)`` through tests/_spmd.py when every result of the current kernels is right.
"""

import argparse
import time

import numpy as np

from _spmd import check, guarded

import cupy as cp  # noqa: E402

from mpiml import init  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402
from mpiml.comm.backends import ipc  # noqa: E402

comm = get_comm()
init(device="gpu")
P, R = comm.size, comm.rank

ap = argparse.ArgumentParser()
ap.add_argument("--calls", type=int, default=2000)
ap.add_argument("--legacy", action="store_true")
ap.add_argument("--seed", type=int, default=3)
# bytes of int64: the last line holds 2, 8, 7, 8 words
ap.add_argument("--sizes", default=f"{1 << 20},{256 << 10},{(1 << 20) + 40},{4 << 20}")
ap.add_argument("--ops", default="allreduce,reduce,direct,twoshot,rs,bcast",
                help="allreduce (ipc/ll128), reduce (the relay), direct, twoshot (reduce ipc/ll128twoshot), rs "
                     "(reduce_scatter ipc/ll128), bcast (ipc/ll128: the two-shot)")
ap.add_argument("--spin-ns", type=int, default=4000, help="the peers' random delay before a call, at most")
ARGS = ap.parse_args()

SIZES = [int(b) for b in ARGS.sizes.split(",")]
PATHS = [p for p in (("ipc/ll128", "allreduce", "allreduce"), ("ipc/ll128", "reduce", "reduce"),
                     ("ipc/ll128direct", "reduce", "direct"), ("ipc/ll128twoshot", "reduce", "twoshot"),
                     ("ipc/ll128", "reduce_scatter", "rs"), ("ipc/ll128", "bcast", "bcast"))
         if p[2] in ARGS.ops.split(",")]
_SRC = r'''
extern "C" __global__ void ll128_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < (unsigned long long)ns);
}
// x[i] = (i % 11) * (rank + 1) + k
extern "C" __global__ void ll128_fill(long long* x, long long n, long long rank, long long k) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = (i % 11) * (rank + 1) + k;
}
// got[i] == ((i0 + i) % 11) * a + b, mismatches added to bad[0]
extern "C" __global__ void ll128_check(const long long* got, long long n, long long a, long long b, int* bad,
                                       long long i0) {
    int miss = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        miss += got[i] != ((i0 + i) % 11) * a + b;
    if (miss) atomicAdd(bad, miss);
}
'''
_MOD = cp.RawModule(code=_SRC)
_SPIN, _FILL, _CHECK = (_MOD.get_function(n) for n in ("ll128_spin", "ll128_fill", "ll128_check"))


def _grid(n):
    return (max(1, min(1024, -(-n // 256))),), (256,)


def fill(x, k):
    _FILL(*_grid(x.size), (x, np.int64(x.size), np.int64(R), np.int64(k)))


def expect(got, a, b, bad, i0=0):
    _CHECK(*_grid(got.size), (got, np.int64(got.size), np.int64(a), np.int64(b), bad, np.int64(i0)))


def legacy_kernel():
    """The LL128 allreduce (int64, max, aligned) without the fix (mpiml_ll128_wait without its __syncwarp and its
    second load of the data): ``(module, kernel, CUfunction)``."""
    from mpiml.kernels import source

    text = source("allreduce")
    sync = "        __syncwarp();  // (mpiml_ll128_wait: one load instruction a line)\n"
    reload = ("        if (!__any_sync(0xffffffffu, bad)) {\n"
              "            // (mpiml_ll128_wait: the data from a load after the flags)\n"
              "#pragma unroll\n"
              "            for (int r = 0; r < MPIML_MAX_RANKS; ++r)\n"
              "                if (r < m && r != skip && act) v[r] = mpiml_ll128_ld(p + r * stride);\n"
              "            return true;\n"
              "        }\n")
    check(text.count(sync) == 1 and text.count(reload) == 1,
          "the fix's lines are not in ipc_common.cuh as written here: --legacy cannot take them out")
    text = text.replace(sync, "").replace(reload, "        if (!__any_sync(0xffffffffu, bad)) return true;\n")
    expr = "mpiml_allreduce_ll128<long long, 3, true>"
    mod = cp.RawModule(code=text, options=("--std=c++17",), name_expressions=[expr])
    k = mod.get_function(expr)
    return mod, k, int(k.kernel.ptr)


def run(path, op, nbytes, calls, rng, legacy=None):
    """``calls`` calls of ``op`` on ``path`` (or the legacy kernel), checked; the wrong results on this rank."""
    n = nbytes // 8
    x = cp.empty(n, dtype=cp.int64)
    out = cp.empty(n, dtype=cp.int64)
    i0 = R * (n // P) + min(R, n % P)  # this rank's part of a reduce_scatter (np.array_split's)
    part = out[:n // P + (R < n % P)]
    bad = cp.zeros(1, dtype=cp.int32)
    wrong_calls = cp.zeros(1, dtype=cp.int32)
    t = comm._device_transports.get("ipc")
    for k in range(calls):
        fill(x, k)
        if R != P - 1:
            _SPIN((1,), (1,), (np.int64(rng.integers(0, ARGS.spin_ns + 1)),))
        root = k % P
        before = bad.copy()
        if legacy is not None:
            grid = ipc._ll128_plan(nbytes, P, t.cap)[1]
            t._launch(legacy, grid, x.data.ptr, out.data.ptr, n, 0, ipc.LL_THREADS)
            expect(out, P, k, bad)  # max over ranks of (i % 11) (r + 1) + k
        elif op == "allreduce":
            comm.allreduce(x, "max", out=out, algorithm=path)
            expect(out, P, k, bad)
        elif op == "bcast":
            got = comm.bcast(x, root=root, out=out, algorithm=path)
            expect(got, root + 1, k, bad)  # the root's (i % 11) (root + 1) + k
        elif op == "reduce_scatter":
            comm.reduce_scatter(x, "sum", out=part, algorithm=path)
            expect(part, P * (P + 1) // 2, P * k, bad, i0)
        else:
            got = comm.reduce(x, "sum", root=root, out=out, algorithm=path)
            if R == root:
                expect(got, P * (P + 1) // 2, P * k, bad)
        wrong_calls += (bad != before).astype(cp.int32)
    comm.synchronize()
    return int(bad.get()[0]), int(wrong_calls.get()[0])


def main():
    t0 = time.perf_counter()
    if P < 2:
        check(True, "")
        return
    rng = np.random.default_rng(ARGS.seed + 17 * R)
    comm.allreduce(cp.ones(4, dtype=cp.int64), algorithm="ipc/ll128")  # the transport and the kernels
    comm.synchronize()
    legacy = legacy_kernel() if ARGS.legacy else None
    lines = []
    for nbytes in SIZES:
        for path, op, _ in PATHS:
            words, calls = run(path, op, nbytes, ARGS.calls, rng)
            everywhere = comm.allgather_obj((words, calls))
            lines.append(f"{op} {path} {nbytes} B: wrong words {[w for w, _ in everywhere]}, "
                         f"wrong calls {[c for _, c in everywhere]} of {ARGS.calls}")
            check(words == 0, f"{op} {path} {nbytes} B: {words} wrong word(s) in {calls} of {ARGS.calls} calls")
        if legacy is not None:
            words, calls = run("legacy", "allreduce", nbytes, ARGS.calls, rng, legacy[2])
            everywhere = comm.allgather_obj((words, calls))
            lines.append(f"LEGACY allreduce ll128 (the data from the flag's load) {nbytes} B: wrong words "
                         f"{[w for w, _ in everywhere]}, wrong calls {[c for _, c in everywhere]} of {ARGS.calls}")
    if R == 0:
        print("\n".join(lines), flush=True)
        print(f"gpu_ll128_lines: {time.perf_counter() - t0:.1f} s", flush=True)


guarded(main, comm)
