"""Timing helpers shared by the device-collective benchmarks (``vs_nccl.py``, ``eager_host.py``).

Both run under ``mpirun`` with one rank per GPU on a stream of their own; the helpers take the
communicator and the stream, and time every path alike: ``eager`` (back-to-back calls, one sync at
the end), ``held_host_cost`` (the host's own cost per call while a busy kernel holds the stream, so no
feedback from the GPU), ``agree`` (the maximum over ranks).  CuPy is imported by the scripts that
import this module (GPU hosts only).
"""

import time

import numpy as np

import cupy as cp

_SPIN = []


def spin(ns):
    """Hold the current stream for ``ns`` nanoseconds of the GPU's clock (one thread spinning on ``%globaltimer``)."""
    if not _SPIN:
        _SPIN.append(cp.RawKernel(r'''extern "C" __global__ void mpiml_bench_spin(long long ns) {
    long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long t = t0; while (t - t0 < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } }''',
                                  "mpiml_bench_spin"))
    _SPIN[0]((1,), (1,), (np.int64(ns),))


def buffers(op, nbytes, ranks):
    """``(x, y)`` float32: ``x`` holds ``nbytes`` (allgather: ``nbytes / ranks``, its result ``nbytes``;
    reduce_scatter: a multiple of ``ranks`` elements), ``y`` the result's size."""
    n = max(1, nbytes // 4 // (ranks if op == "allgather" else 1))
    if op == "reduce_scatter":
        n = max(ranks, n // ranks * ranks)
    x = cp.ones(n, dtype=cp.float32)
    y = cp.empty(n * ranks if op == "allgather" else n // ranks if op == "reduce_scatter" else n, dtype=cp.float32)
    return x, y


def eager(fn, iters, comm, stream):
    """(seconds per call, host seconds per call) of ``iters`` back-to-back calls after three warm ones."""
    for _ in range(3):
        fn()
    stream.synchronize()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    stream.synchronize()
    return (time.perf_counter() - t0) / iters, (t1 - t0) / iters


def held_host_cost(fn, comm, stream, calls=200, hold_ns=50_000_000):
    """Host seconds per call of ``calls`` calls while the stream is held by a busy kernel (``hold_ns``, long
    enough that the calls never wait for the GPU): the host's own cost."""
    fn()
    stream.synchronize()
    comm.barrier()
    spin(hold_ns)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls
    stream.synchronize()
    return t


def agree(comm, t):
    """The maximum of ``t`` over the ranks (every rank gets it)."""
    return comm.allreduce_obj(t, "max")
