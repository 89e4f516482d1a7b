"""The opt-in device paths of this session on CuPy buffers (run under mpirun, 2-4 GPUs).

Usage: ``python gpu_variants.py [ALGO[,ALGO...]]`` (each in turn; ``ipc/lltwoshot`` by default, or ``ipc/pipe``, ``ipc/llrelay`` (reduce
only), ``ipc/ll128`` (reduce, allreduce and bcast), ``ipc/ll128direct``, ``ipc/ll128twoshot`` (reduce); the other ops of a case run on
``ipc/lltwoshot``); ``MPIML_TIMEOUT``
bounds every wait; ``MPIML_IPC_BYTES`` small makes the pipelined kernels take several chunks, and
``MPIML_IPC_PIPE_BLOCKS`` / ``MPIML_IPC_PIPE_ROUNDS`` several steps a block).  Checks, exactly against NumPy
on the gathered inputs (small integers: every result is exact in every dtype):

* ``ALGO`` bcast, reduce and allreduce: every dtype, sizes from one element to several chunks of the LL
  region (odd sizes, offset views: the element-wise edges), every root, every reduction; the hot
  launcher repeated back to back (a bcast root waits for nobody: slow peers made slow by a busy kernel),
  ``out=`` given and not; captured in a CUDA graph and replayed on fresh inputs, between eager calls of
  other kinds;
* NCCL calls through mpiml on a stream held by a busy kernel (the watchdog's events): a burst of calls
  takes a handful of events, not one each, and every result is right.
"""

import os
import sys
import time

import numpy as np

from _exact import DTYPES, OPS, data, device, reduce_np
from _spmd import assert_close, check, guarded

import cupy as cp  # noqa: E402

from mpiml.comm import get_comm  # noqa: E402
from mpiml import init  # noqa: E402

comm = get_comm()
init(device="gpu")
P, R = comm.size, comm.rank
ALGOS = (sys.argv[1] if len(sys.argv) > 1 else "ipc/lltwoshot").split(",")


def serves(name):
    """The ops algorithm ``name`` serves; the others of a case run on the LL two-shot (the same regions: they meet
    in every case)."""
    return {"ipc/llrelay": ("reduce",), "ipc/ll128": ("reduce", "allreduce", "bcast"), "ipc/ll128direct": ("reduce",),
            "ipc/ll128twoshot": ("reduce",)}.get(name, ("bcast", "reduce", "allreduce"))


ALGO, SERVES = ALGOS[0], serves(ALGOS[0])  # the algorithm under test (main takes each of ALGOS in turn)


def algo(op):
    return ALGO if op in SERVES else "ipc/lltwoshot"


T0 = time.perf_counter()


def progress(what):
    """Rank 0 names the case it starts (flushed: a hang, or a long first compile, names its case)."""
    if R == 0:
        print(f"[{time.perf_counter() - T0:6.1f} s] {ALGO}: {what}", flush=True)


_spin = cp.RawKernel(r'''extern "C" __global__ void mpiml_test_spin(long long ns) {
    long long t0 = clock64(); while (clock64() - t0 < ns) {} }''', "mpiml_test_spin")


def run_eager():
    t = comm._device_transports
    for dtype in DTYPES:
        isz = np.dtype(dtype).itemsize
        # one element .. several chunks (a launch takes up to 2 MiB bcast, 1 MiB (all)reduce at 4 ranks by default)
        for n in (1, 3, 17, 4099, 70001, (1 << 20) // isz, (3 << 20) // isz + 5):
            xs = [data(r, n, dtype) for r in range(P)]
            for offset in (False, True) if n in (17, 70001, (3 << 20) // isz + 5) else (False,):
                tag = f"{np.dtype(dtype).name} n={n} offset={offset}"
                progress(f"eager {tag}")
                x = device(xs[R], offset)
                for root in range(P) if n in (17, (1 << 20) // isz) else (P - 1,):
                    b = device(xs[R], offset)
                    got = comm.bcast(b, root=root, algorithm=algo("bcast"))
                    assert_close(got, xs[root], f"bcast {ALGO} root={root} {tag}", exact=True)
                    if R == root:
                        check(got is b, f"bcast {ALGO} {tag}: the root's array not returned")
                    for op in OPS if n in (17, 4099) else ("sum", "max"):
                        red = comm.reduce(x, op, root=root, algorithm=algo("reduce"))
                        if R == root:
                            assert_close(red, reduce_np(xs, op), f"reduce {op} {ALGO} root={root} {tag}", exact=True)
                        else:
                            check(red is None, f"reduce {ALGO} {tag}: non-root got {type(red)}")
                for op in OPS if n in (17, 4099) else ("sum", "min"):
                    assert_close(comm.allreduce(x, op, algorithm=algo("allreduce")), reduce_np(xs, op),
                                 f"allreduce {op} {ALGO} {tag}", exact=True)
                assert_close(x, xs[R], f"(all)reduce {ALGO} {tag}: input modified", exact=True)
                y = device(xs[R], offset)
                comm.allreduce(y, "max", out=y, algorithm=algo("allreduce"))
                assert_close(y, reduce_np(xs, "max"), f"allreduce in place {ALGO} {tag}", exact=True)
    check("ipc" in t, f"no ipc transport ({list(t)})")


def run_stream_ordered():
    """Back-to-back calls through the hot launcher, slow peers, out= alternating; checked at the end."""
    for n in (5, 70001, 1 << 18):
        progress(f"stream-ordered n={n}")
        outs, wants = [], []
        out_b, out_r = cp.empty(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
        for k in range(40):
            if R == k % P:
                _spin((1,), (1,), (np.int64(20000 * (1 + R)),))
            xs = [data(r, n, np.float32, 50 + k) for r in range(P)]
            x = cp.asarray(xs[R])
            given = k % 2 == 1
            b = comm.bcast(x, root=0, out=out_b if given else None, algorithm=algo("bcast"))
            outs.append(b.copy())
            wants.append(xs[0])
            red = comm.reduce(x, "sum", root=P - 1, out=out_r if given else None, algorithm=algo("reduce"))
            if R == P - 1:
                outs.append(red.copy())
                wants.append(reduce_np(xs, "sum"))
            outs.append(comm.allreduce(x, "max", algorithm=algo("allreduce")))
            wants.append(reduce_np(xs, "max"))
        comm.synchronize()
        for i, (got, want) in enumerate(zip(outs, wants)):
            assert_close(got, want, f"stream-ordered {ALGO} n={n} call {i}", exact=True)
    hot = {k[0] for k in comm._hot if k[5] == algo(k[0])}
    want = {"bcast", "reduce", "allreduce"}
    check(want <= hot, f"{ALGO}: no hot launcher for {sorted(want - hot)}")


def run_graph():
    """bcast, reduce and allreduce captured with an LL allreduce between them, replayed on fresh inputs."""
    os.environ["MPIML_CHECK"] = "0"
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        for n in (17, 70001, 1 << 18):
            progress(f"graph n={n}")
            with stream:
                x = cp.empty(n, dtype=cp.float32)
                b = cp.empty(n, dtype=cp.float32)
                out_b, out_r = cp.empty(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
                y = cp.empty(n, dtype=cp.float32)
                z = cp.empty(n, dtype=cp.float32)
                x[...] = cp.asarray(data(R, n, np.float32))
                b[...] = x
                comm.bcast(b, root=1 % P, out=out_b, algorithm=algo("bcast"))  # warm-up: kernels, hot launchers
                comm.reduce(x, "max", root=0, out=out_r, algorithm=algo("reduce"))
                comm.allreduce(x, out=y, algorithm="ipc/ll")
                comm.allreduce(x, "min", out=z, algorithm=algo("allreduce"))
                stream.synchronize()
                stream.begin_capture()
                comm.bcast(b, root=1 % P, out=out_b, algorithm=algo("bcast"))
                comm.allreduce(x, out=y, algorithm="ipc/ll")
                comm.reduce(x, "max", root=0, out=out_r, algorithm=algo("reduce"))
                comm.allreduce(x, "min", out=z, algorithm=algo("allreduce"))
                graph = stream.end_capture()
                for rep in range(4):
                    xs = [data(r, n, np.float32, 20 + rep) for r in range(P)]
                    x[...] = cp.asarray(xs[R])
                    b[...] = x * 2
                    graph.launch(stream)
                    e = comm.bcast(x, root=P - 1, algorithm=algo("bcast"))  # eager between replays
                    stream.synchronize()
                    want_b = xs[1 % P] * 2
                    if R != 1 % P:
                        assert_close(out_b, want_b, f"graph bcast {ALGO} n={n} rep={rep}", exact=True)
                    assert_close(y, reduce_np(xs, "sum"), f"graph allreduce ipc/ll n={n} rep={rep}", exact=True)
                    assert_close(z, reduce_np(xs, "min"), f"graph allreduce {ALGO} n={n} rep={rep}", exact=True)
                    if R == 0:
                        assert_close(out_r, reduce_np(xs, "max"), f"graph reduce {ALGO} n={n} rep={rep}",
                                     exact=True)
                    assert_close(e, xs[P - 1], f"eager bcast after graph {ALGO} n={n} rep={rep}", exact=True)
    finally:
        os.environ.pop("MPIML_CHECK", None)


def run_nccl_events():
    """A burst of NCCL calls on a held stream: right results, a handful of watchdog events."""
    n = 1 << 18
    xs = [data(r, n, np.float32, 77) for r in range(P)]
    x = cp.asarray(xs[R])
    comm.allreduce(x, algorithm="nccl/native")  # the transport, the hot launcher
    comm.synchronize()
    nc = comm._device_transports["nccl"]

    def owned():  # events are kept for reuse, never destroyed while the transport lives
        with nc._lock:
            return len(nc._free_events) + len(nc._inflight)

    before = owned()
    outs = []
    _spin((1,), (1,), (np.int64(50_000_000),))
    t0 = time.perf_counter()
    for _ in range(300):
        outs.append(comm.allreduce(x, algorithm="nccl/native"))
    host_us = (time.perf_counter() - t0) / 300 * 1e6
    with nc._lock:
        pending = len(nc._inflight)
    made = owned() - before
    comm.synchronize()
    want = reduce_np(xs, "sum")
    for i, got in enumerate(outs[::37]):
        assert_close(got, want, f"nccl allreduce on a held stream, call {37 * i}", exact=True)
    check(made <= 100, f"nccl: {made} events created for 300 calls on a held stream")
    check(pending <= 100, f"nccl: {pending} watchdog entries for 300 calls on a held stream")
    if R == 0:
        print(f"nccl allreduce 1 MiB on a held stream: {host_us:.1f} us a call on the host, "
              f"{made} events made, {pending} entries", flush=True)


def main():
    global ALGO, SERVES
    if P < 2:
        check(True, "")
        return
    for ALGO in ALGOS:
        t0 = time.perf_counter()
        SERVES = serves(ALGO)
        run_eager()
        run_stream_ordered()
        run_graph()
        if ALGO == "ipc/lltwoshot":
            progress("nccl events")
            run_nccl_events()
        if R == 0:
            print(f"gpu_variants {ALGO} ({', '.join(SERVES)}): {time.perf_counter() - t0:.1f} s", flush=True)


guarded(main, comm)
