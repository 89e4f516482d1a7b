"""Timing helpers shared by the device-collective benchmarks (``vs_nccl.py``, ``eager_host.py``).

Both run under ``mpirun`` with one rank per GPU on a stream of their own; the helpers take the
communicator and the stream, and time every path alike: ``eager`` (back-to-back calls, one sync at
the end), ``graph`` (calls captured in one CUDA graph, replayed), ``held_host_cost`` (the host's own cost per call while a busy kernel holds the stream, so no
feedback from the GPU), ``agree`` (the maximum over ranks).  CuPy is imported by the scripts that
import this module (GPU hosts only).
"""

import datetime
import json
import os
import platform
import socket
import sys
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


def graph(fn, iters, comm, stream, calls=20):
    """Seconds per call of ``calls`` calls captured in one CUDA graph and replayed ``iters`` times (device time plus
    ``1 / calls`` of a graph launch)."""
    from mpiml.bench._graphs import capture

    fn()
    stream.synchronize()
    g = capture(fn, calls)
    g.launch(stream)
    stream.synchronize()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        g.launch(stream)
    stream.synchronize()
    return (time.perf_counter() - t0) / (iters * calls)


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


def write_result(path, ranks, t_start, micro, rows, **extra):
    """Write the run's JSON (machine, date, command, NCCL and CuPy versions, the MPIML_/NCCL_ settings, the
    micro timings and the rows, then ``extra``) to ``path`` and say so (rank 0 only); the document returned."""
    from cupy.cuda import nccl

    doc = {"machine": f"{socket.gethostname()} {platform.machine()} "
                      f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()} x{cp.cuda.runtime.getDeviceCount()}",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": f"mpirun -n {ranks} " + " ".join([os.path.basename(sys.executable)] + sys.argv),
           "ranks": ranks, "nccl_version": nccl.get_version(), "cupy": cp.__version__,
           "env": {k: v for k, v in os.environ.items() if k.startswith(("MPIML_", "NCCL_"))},
           "seconds_total": time.perf_counter() - t_start, "micro": micro, "rows": rows, **extra}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path} ({len(rows)} rows, {time.perf_counter() - t_start:.0f} s)", flush=True)
    return doc
