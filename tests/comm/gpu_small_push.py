"""The push kernels (``ipc/llpush``: reduce and allgather, ``kernels/comm/small_push.cu``) on CuPy buffers.

Run under mpirun (1-4 GPUs): ``python gpu_small_push.py [--quick]``; ``MPIML_TIMEOUT`` bounds every wait.
Checks, exactly against NumPy on the gathered inputs (small integers: exact in every dtype), on the
communicator's own settings and on communicators made with each knob (``MPIML_IPC_LLPUSH_SPLIT_BYTES`` with
small blocks: the allgather split by peer over many blocks; ``MPIML_IPC_LLPUSH_ENDACK=1``;
``MPIML_IPC_LLPUSH_PDL=1``, the hot launches with programmatic dependent launch; ``MPIML_IPC_LLPUSH_DEPTH`` 4 and 8,
the ring of slots of their own, the latter with every other knob):

* every dtype, sizes from one element to several LL launches (odd sizes, offset views), every root, every
  reduction (``--quick``: fewer), ``out=`` given and not, in place;
* back-to-back calls through the hot launcher with no host wait, the kinds mixed with the LL and barrier
  kernels (a bcast root runs up to two calls ahead: the acks the push kernels send one call late), roots
  moving, one rank made late by a busy kernel at each call; every result checked at the end;
* captured in a CUDA graph among other kinds and replayed on fresh inputs, eager calls between replays.
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

world = get_comm()
init(device="gpu")
P, R = world.size, world.rank
QUICK = "--quick" in sys.argv
ALGO = "ipc/llpush"
T0 = time.perf_counter()
VARIANTS = [("default", {}),
            ("split", {"MPIML_IPC_LLPUSH_SPLIT_BYTES": "8", "MPIML_IPC_LLPUSH_BLOCK_BYTES": "256"}),
            ("endack", {"MPIML_IPC_LLPUSH_ENDACK": "1"}),
            ("ring4", {"MPIML_IPC_LLPUSH_DEPTH": "4"}),
            ("pdl", {"MPIML_IPC_LLPUSH_PDL": "1"}),
            ("plain", {"MPIML_IPC_LLPUSH_PDL": "0"}),
            ("ring8", {"MPIML_IPC_LLPUSH_DEPTH": "8", "MPIML_IPC_LLPUSH_SPLIT_BYTES": "8",
                       "MPIML_IPC_LLPUSH_BLOCK_BYTES": "256", "MPIML_IPC_LLPUSH_PDL": "1"})]

_spin = cp.RawKernel(r'''extern "C" __global__ void mpiml_test_spin(long long ns) {
    long long t0 = clock64(); while (clock64() - t0 < ns) {} }''', "mpiml_test_spin")


def progress(what):
    """Rank 0 names the case it starts (flushed: a hang, or a first compile, names its case)."""
    if R == 0:
        print(f"[{time.perf_counter() - T0:6.1f} s] {what}", flush=True)


def variant_comm(env):
    """A communicator whose IPC transport is made (now, by a first call) with the settings ``env`` (none: the world's
    own)."""
    c = world.split(0) if env else world
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        c.allgather(cp.zeros(1, dtype=cp.float32), algorithm=ALGO)
        c.synchronize()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return c


def run_eager(comm, name):
    ll_max = comm._device_transports["ipc"].ll_max
    sizes = (1, 3, 17, 4099, 70001) if QUICK else (1, 2, 3, 17, 513, 4099, 70001)
    for dtype in (DTYPES if not QUICK else [np.float32, np.float16, np.int64, np.bool_]):
        isz = np.dtype(dtype).itemsize
        # up to several launches of MPIML_IPC_LL_BYTES (256 KiB) a call
        for n in sizes + ((ll_max // isz) * 2 + 5,):
            xs = [data(r, n, dtype) for r in range(P)]
            for offset in (False, True) if n in (17, 70001) else (False,):
                tag = f"{name} {np.dtype(dtype).name} n={n} offset={offset}"
                progress(f"eager {tag}")
                x = device(xs[R], offset)
                for root in range(P) if n in (17, 4099) else ((P - 1,) if n != 1 else (0,)):
                    for op in OPS if n in (3, 17, 4099) else ("sum", "max"):
                        red = comm.reduce(x, op, root=root, algorithm=ALGO)
                        if R == root:
                            assert_close(red, reduce_np(xs, op), f"reduce {op} root={root} {tag}", exact=True)
                        else:
                            check(red is None, f"reduce {tag}: non-root got {type(red)}")
                    if R == root:  # out= given, and the input itself (in place)
                        out = device(np.zeros(n, dtype), offset)
                        got = comm.reduce(x, "min", root=root, out=out, algorithm=ALGO)
                        check(got is out, f"reduce out= {tag}: another array returned")
                        assert_close(out, reduce_np(xs, "min"), f"reduce out= root={root} {tag}", exact=True)
                        y = device(xs[R], offset)
                        comm.reduce(y, "sum", root=root, out=y, algorithm=ALGO)
                        assert_close(y, reduce_np(xs, "sum"), f"reduce in place root={root} {tag}", exact=True)
                    else:
                        comm.reduce(x, "min", root=root, algorithm=ALGO)
                        comm.reduce(device(xs[R], offset), "sum", root=root, algorithm=ALGO)
                assert_close(comm.allgather(x, algorithm=ALGO), np.concatenate(xs), f"allgather {tag}", exact=True)
                out = device(np.zeros(P * n, dtype), offset)
                got = comm.allgather(x, out=out, algorithm=ALGO)
                check(got is out, f"allgather out= {tag}: another array returned")
                assert_close(out, np.concatenate(xs), f"allgather out= {tag}", exact=True)
                assert_close(x, xs[R], f"{tag}: input modified", exact=True)


def run_stream_ordered(comm, name):
    """Back-to-back calls, no host wait, the push kernels among the LL and barrier kernels, roots moving, one
    rank late at each call; checked at the end."""
    for n in (1, 5, 1027, 70001):
        progress(f"stream-ordered {name} n={n}")
        outs, wants = [], []
        out_r, out_g = cp.empty(n, dtype=cp.float32), cp.empty(P * n, dtype=cp.float32)
        for k in range(40 if not QUICK else 20):
            if R == k % P:
                _spin((1,), (1,), (np.int64(20000 * (1 + R)),))
            xs = [data(r, n, np.float32, 50 + k) for r in range(P)]
            x = cp.asarray(xs[R])
            given = k % 2 == 1
            root = (k // 2) % P
            red = comm.reduce(x, "sum", root=root, out=out_r if given and R == root else None, algorithm=ALGO)
            if R == root:
                outs.append(red.copy())
                wants.append(reduce_np(xs, "sum"))
            g = comm.allgather(x, out=out_g if given else None, algorithm=ALGO)
            outs.append(g.copy())
            wants.append(np.concatenate(xs))
            # other kinds between them: an LL bcast (its root waits for nobody), a pulled bcast (a barrier), an LL
            # allreduce (every rank waits for every other)
            b = comm.bcast(x, root=(k + 1) % P, algorithm="ipc/ll" if k % 3 else "ipc/pull")
            outs.append(b.copy())
            wants.append(xs[(k + 1) % P])
            if k % 4 == 0:
                outs.append(comm.allreduce(x, "max", algorithm="ipc/ll"))
                wants.append(reduce_np(xs, "max"))
            for _ in range(k % 3):  # runs of the same push kernel: the acks one call late
                red = comm.reduce(x, "max", root=root, algorithm=ALGO)
                if R == root:
                    outs.append(red.copy())
                    wants.append(reduce_np(xs, "max"))
        comm.synchronize()
        for i, (got, want) in enumerate(zip(outs, wants)):
            assert_close(got, want, f"stream-ordered {name} n={n} call {i}", exact=True)
    if P > 1:  # (the repeated calls went through the hot launcher)
        hot = {k[0] for k in comm._hot if k[5] == ALGO}
        check({"reduce", "allgather"} <= hot, f"{name}: no hot launcher for {sorted({'reduce', 'allgather'} - hot)}")


def run_graph(comm, name):
    """The push reduce and allgather captured among other kinds, replayed on fresh inputs, eager calls between."""
    os.environ["MPIML_CHECK"] = "0"
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        for n in (1, 17, 70001):
            progress(f"graph {name} n={n}")
            with stream:
                x = cp.empty(n, dtype=cp.float32)
                out_r = cp.empty(n, dtype=cp.float32)
                out_r2 = cp.empty(n, dtype=cp.float32)
                out_g = cp.empty(P * n, dtype=cp.float32)
                b = cp.empty(n, dtype=cp.float32)
                y = cp.empty(n, dtype=cp.float32)
                x[...] = cp.asarray(data(R, n, np.float32))
                root2 = (P - 1) if P > 1 else 0

                def calls():
                    comm.reduce(x, "sum", root=0, out=out_r, algorithm=ALGO)
                    comm.allgather(x, out=out_g, algorithm=ALGO)
                    comm.bcast(x, root=1 % P, out=b, algorithm="ipc/ll")
                    comm.reduce(x, "max", root=root2, out=out_r2, algorithm=ALGO)
                    comm.allgather(x, out=out_g, algorithm=ALGO)
                    comm.allreduce(x, out=y, algorithm="ipc/ll")

                calls()  # warm-up: kernels, hot launchers
                stream.synchronize()
                stream.begin_capture()
                for _ in range(3):
                    calls()
                graph = stream.end_capture()
                for rep in range(4):
                    xs = [data(r, n, np.float32, 20 + rep) for r in range(P)]
                    x[...] = cp.asarray(xs[R])
                    graph.launch(stream)
                    e = comm.allgather(x, algorithm=ALGO)  # eager between replays
                    stream.synchronize()
                    tag = f"graph {name} n={n} rep={rep}"
                    assert_close(out_g, np.concatenate(xs), f"{tag} allgather", exact=True)
                    assert_close(e, np.concatenate(xs), f"{tag} eager allgather", exact=True)
                    assert_close(y, reduce_np(xs, "sum"), f"{tag} allreduce ipc/ll", exact=True)
                    if R != 1 % P:
                        assert_close(b, xs[1 % P], f"{tag} bcast ipc/ll", exact=True)
                    if R == 0:
                        assert_close(out_r, reduce_np(xs, "sum"), f"{tag} reduce root 0", exact=True)
                    if R == root2:
                        assert_close(out_r2, reduce_np(xs, "max"), f"{tag} reduce root {root2}", exact=True)
    finally:
        os.environ.pop("MPIML_CHECK", None)


def main():
    for name, env in VARIANTS if P > 1 else VARIANTS[:1]:
        t0 = time.perf_counter()
        comm = variant_comm(env)
        run_eager(comm, name)
        run_stream_ordered(comm, name)
        run_graph(comm, name)
        if R == 0:
            print(f"gpu_small_push {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        if comm is not world:
            comm.close()


guarded(main, world)
