"""Thousands of IPC collectives over several CUDA streams and graph replays, every result checked (run under mpirun).

Usage: ``python gpu_stress_epochs.py [--calls N] [--seed S] [--unordered]``.

Each IPC kernel takes its call number from its workspace's epoch word, so two
collectives must never run at once on one rank.  This script makes them try:
eager calls of every IPC algorithm (``ll``, ``oneshot``, ``twoshot``, ``lltwoshot``, ``llrelay``, ``ll128``,
``ll128direct``, ``ll128twoshot``, ``pipe``, ``pull``, ``push`` and ``native`` on sizes on both sides of the 256 KiB LL limit) hop
between the null stream and two non-blocking streams with no host wait in
between, and now and then onto a stream made for one call and destroyed right
after it (its kernel maybe still waiting); one rank at a time is made late by a
busy kernel before its call (so the others' kernels wait in their barriers and
LL lines while the next call is already launched on another stream); and CUDA
graphs of several collectives (captured once, their inputs read from a device
word) are replayed between them on the current stream.  The eager calls are
ordered only by the transport; the graph launches by this script, as the docs
ask of a caller (a graph launch is not a call the communicator sees).

Inputs are small integers written on the device, and every result is compared
on the device with its closed form (a mismatch counter read at the sync points),
so the run costs a few kernel launches per call and no host copies.  With
``MPIML_TIMEOUT`` set (30 s), a hang fails fast.  ``--unordered`` turns the
transport's stream ordering off, to show that this script catches its absence
(it should then fail: wrong data, or a CommError that names the overlap).

Prints ``OK: 0 failure(s)`` through tests/_spmd.py, and one line of counts.
"""

import argparse
import time

import numpy as np

from _spmd import check, guarded

import cupy as cp  # noqa: E402

from _device_check import DeviceCheck  # noqa: E402
from mpiml import init  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402

comm = get_comm()
init(device="gpu")
P, R = comm.size, comm.rank

ap = argparse.ArgumentParser()
ap.add_argument("--calls", type=int, default=3000)
ap.add_argument("--seed", type=int, default=7)
ap.add_argument("--unordered", action="store_true")
ARGS = ap.parse_args()

LL_MAX = 256 << 10
# float32 elements: 1 B .. 1.2 MB, with the LL limit (65536 elements) on both sides
SIZES = [1, 3, 17, 1000, 4099, 65535, 65536, 65537, 70001, 300001]
BIG = 65537
ALGOS = {
    "allreduce": ["ll", "oneshot", "twoshot", "lltwoshot", "ll128", "pipe", "native"],
    "reduce": ["ll", "oneshot", "twoshot", "lltwoshot", "llrelay", "ll128", "ll128direct", "ll128twoshot", "pipe",
               "native"],
    "bcast": ["ll", "pull", "twoshot", "lltwoshot", "pipe", "native"],
    "allgather": ["ll", "pull", "push", "native"],
    "reduce_scatter": ["ll", "oneshot", "ll128", "native"],
    "scan": ["native"],
}

_CHECKS = DeviceCheck()
fill, expect = _CHECKS.fill, _CHECKS.expect


def rows(n):
    """This rank's reduce_scatter block of n elements (array_split) and its first element."""
    counts = [n // P + (1 if r < n % P else 0) for r in range(P)]
    return counts[R], sum(counts[:R])


def collective(op, algo, n, root, kdev):
    """One collective on arrays made for it; its result checked on the device.

    Rank r's input is (i % 13) + 3 r + k, k read from ``kdev``: every result has a closed form.
    """
    name = f"ipc/{algo}"
    x = cp.empty(n, dtype=cp.float32)
    fill(x, 3 * R, kdev)
    s3 = 3 * P * (P - 1) // 2  # sum over r of 3 r
    if op == "allreduce":
        red = "sum" if n % 2 else "max"
        out = cp.empty_like(x)
        comm.allreduce(x, red, out=out, algorithm=name)
        if red == "sum":
            expect(out, P, s3, P, kdev)
        else:
            expect(out, 1, 3 * (P - 1), 1, kdev)
        return (x, out)
    if op == "reduce":
        out = cp.empty_like(x) if R == root else None
        got = comm.reduce(x, "sum", root=root, out=out, algorithm=name)
        if R == root:
            expect(got, P, s3, P, kdev)
        else:
            check(got is None, f"reduce {name}: non-root got {type(got)}")
        return (x, out)
    if op == "bcast":
        out = None if R == root else cp.empty_like(x)
        got = comm.bcast(x, root=root, out=out, algorithm=name)
        expect(got, 1, 3 * root, 1, kdev)
        return (x, got)
    if op == "allgather":
        out = cp.empty(P * n, dtype=cp.float32)
        comm.allgather(x, out=out, algorithm=name)
        for r in range(P):
            expect(out[r * n:(r + 1) * n], 1, 3 * r, 1, kdev)
        return (x, out)
    if op == "reduce_scatter":
        m, first = rows(n)
        out = cp.empty(m, dtype=cp.float32)
        comm.reduce_scatter(x, "sum", out=out, algorithm=name)
        expect(out, P, s3, P, kdev, off=first)
        return (x, out)
    if op == "scan":
        got = comm.scan(x, "sum", algorithm=name)
        expect(got, R + 1, 3 * R * (R + 1) // 2, R + 1, kdev)
        return (x, got)
    raise ValueError(op)


def plans(rng, count):
    """``count`` (op, algorithm, n, root) drawn alike on every rank."""
    ops = sorted(ALGOS)
    out = []
    for _ in range(count):
        op = ops[rng.integers(len(ops))]
        algo = ALGOS[op][rng.integers(len(ALGOS[op]))]
        n = SIZES[rng.integers(len(SIZES))]
        if algo == "ll" and n > BIG and rng.random() < 0.7:  # (LL past 256 KiB runs in chunks: some, not many)
            n = SIZES[rng.integers(6)]
        out.append((op, algo, n, int(rng.integers(P))))
    return out


class Graph:
    """Collectives captured once on their own stream; inputs from a device word, results checked inside."""

    def __init__(self, items, stream):
        self.items = items
        with stream:
            self.kdev = cp.zeros(1, dtype=cp.float32)
            self.keep = [collective(*it, self.kdev) for it in items]  # warm-up: plans, hot launchers, pool
            stream.synchronize()
            stream.begin_capture()
            self.keep += [collective(*it, self.kdev) for it in items]
            self.graph = stream.end_capture()
        self.calls = len(items)

    def launch(self, k, stream):
        with stream:
            self.kdev.fill(k)
            self.graph.launch(stream)


def main():
    if ARGS.unordered:
        from mpiml.comm.backends.ipc import StreamOrder

        StreamOrder.before = lambda self, s: None
    shared = np.random.default_rng(ARGS.seed)          # the same draws on every rank
    local = np.random.default_rng(1000 + ARGS.seed + R)  # this rank's streams
    streams = [cp.cuda.Stream.null, cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    capture = cp.cuda.Stream(non_blocking=True)
    zero = cp.zeros(1, dtype=cp.float32)
    kvals = [cp.full(1, k, dtype=cp.float32) for k in range(8)]
    cp.cuda.Device().synchronize()  # (made on the null stream, read on the others)
    t0 = time.perf_counter()
    graphs = [Graph(plans(shared, 4), capture) for _ in range(3)]
    graphs.append(Graph([("allreduce", "ll", 17, 0), ("bcast", "twoshot", 70001, P - 1),
                         ("reduce_scatter", "oneshot", 65537, 0), ("allreduce", "twoshot", 70001, 0)], capture))
    graphs.append(Graph([("bcast", "lltwoshot", 70001, 0), ("allreduce", "lltwoshot", 4099, 0),
                         ("reduce", "lltwoshot", 300001, P - 1), ("allreduce", "ll", 17, 0)], capture))
    graphs.append(Graph([("bcast", "pipe", 300001, 1 % P), ("reduce", "pipe", 70001, 0),
                         ("allreduce", "pipe", 4099, 0), ("reduce", "ll", 17, P - 1)], capture))
    capture.synchronize()
    schedule = plans(shared, ARGS.calls)
    eager = replays = graph_calls = switches = spins = temps = 0
    # the previous step's stream, an event recorded after it, and whether it was a graph launch: the script
    # orders only what a caller must (a graph launch and its neighbours). The stream is told apart by the
    # object, held for one step, not by its handle: a stream destroyed with a graph in flight may hand its
    # handle to the next new stream at once (pass B on 4 x H100: a graph on one such stream and the next
    # call on another, same handle, left unordered, the detector named the overlap)
    prev_stream, prev_event, prev_graph = None, None, False
    keep = []
    for j, (op, algo, n, root) in enumerate(schedule):
        graph_step = shared.random() < 0.08  # a graph replay instead of this call
        if local.random() < 0.04:  # a stream made for this step alone, destroyed with its work in flight
            s = cp.cuda.Stream(non_blocking=True)
            temps += 1
        else:
            s = streams[local.integers(len(streams))]
        if prev_stream is not None and s is not prev_stream:
            switches += 1
            if prev_graph or graph_step:  # a graph launch is the caller's to order (the transport never sees it)
                s.wait_event(prev_event)
        with s:
            if graph_step:
                g = graphs[shared.integers(len(graphs))]
                g.launch(int(shared.integers(1, 1000)), s)
                replays += 1
                graph_calls += g.calls
            else:
                if shared.random() < 0.3 and R == int(shared.integers(P)):
                    _CHECKS.spin(int(local.integers(5000, 200000)))  # this rank late
                    spins += 1
                kdev = kvals[j % len(kvals)] if j % 3 else zero
                keep.append(collective(op, algo, n, root, kdev))
                eager += 1
        prev_stream, prev_event, prev_graph = s, s.record(), graph_step
        del s  # (a temporary stream is destroyed one step later, its kernels maybe still waiting for a late peer)
        if (j + 1) % 200 == 0 or j + 1 == len(schedule):
            cp.cuda.Device().synchronize()  # (the destroyed streams' work too)
            keep.clear()
            bad = _CHECKS.mismatches()
            check(bad == 0, f"after call {j + 1}: {bad} wrong elements on rank {R}")
            if comm.allreduce_obj(bad):  # (every rank stops at the same call)
                break
    for st in (*streams, capture):
        st.synchronize()
    comm.synchronize()
    bad = _CHECKS.mismatches()
    check(bad == 0, f"{bad} wrong elements at the end")
    if R == 0:
        print(f"{P} ranks: {eager} eager calls, {replays} graph replays ({graph_calls} collectives), "
              f"{switches} stream switches, {temps} streams destroyed in flight (rank 0), {spins} late starts, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


guarded(main, comm)
