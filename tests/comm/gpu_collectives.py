"""Every collective x dtype x size x device backend on CuPy buffers (run under mpirun).

Usage: ``python gpu_collectives.py BACKENDS [--graph] [--shared]`` with BACKENDS
a comma list of ``mpi`` (staged through the host), ``nccl``, ``ipc`` and
``auto`` (no ``algorithm=``: the tuning table's choice).  Each rank uses GPU
``local_rank % device_count``.  Values are small integers, so every result is
exact in every dtype and is compared exactly with NumPy on the gathered
inputs.  ``--graph`` also captures allreduce / bcast / allgather / reduce /
reduce_scatter into a CUDA graph and replays it on fresh inputs.  With ``mpi``
the pipelined staged ring / chain (``mpi/ring``, ``mpi/chain``) are checked
with many small chunks.  ``--shared``: the ranks share GPUs (run with one
visible GPU); ``nccl`` and ``ipc`` must then be refused on every rank, by name
and under ``auto``.
"""

import os
import sys
import time

import numpy as np

from _exact import DTYPES, OPS, data, device, reduce_np
from _spmd import assert_close, check, guarded

import cupy as cp  # noqa: E402

from mpiml.comm import algorithm_names, get_comm  # noqa: E402
from mpiml import init  # noqa: E402

comm = get_comm()
init(device="gpu")  # local rank mod visible GPUs
P, R = comm.size, comm.rank
BACKENDS = sys.argv[1].split(",")
GRAPH = "--graph" in sys.argv
SHARED = "--shared" in sys.argv
SIZES = [1, 3, 17, 1000, 4099, 70001]          # elements; most are not multiples of 16 bytes
BIG = 300_001                                   # > 256 KiB in float32: the two-shot path


def route(backend):
    """The ``algorithm=`` of a backend's own path (None: auto)."""
    return None if backend == "auto" else f"{backend}/native"


def run_case(backend, dtype, n, offset):
    algo = route(backend)
    tag = f"{backend} {np.dtype(dtype).name} n={n} offset={offset}"
    xs = [data(r, n, dtype) for r in range(P)]
    x = device(xs[R], offset)
    for op in OPS:
        want = reduce_np(xs, op)
        assert_close(comm.allreduce(x, op, algorithm=algo), want, f"allreduce {op} {tag}", exact=True)
        got = comm.reduce(x, op, root=0, algorithm=algo)
        if R == 0:
            assert_close(got, want, f"reduce {op} {tag}", exact=True)
        else:
            check(got is None, f"reduce {op} {tag}: non-root got {type(got)}")
        if op in ("sum", "max"):
            assert_close(comm.scan(x, op, algorithm=algo), reduce_np(xs[:R + 1], op), f"scan {op} {tag}", exact=True)
            ex = comm.exscan(x, op, algorithm=algo)
            if R > 0:
                assert_close(ex, reduce_np(xs[:R], op), f"exscan {op} {tag}", exact=True)
    b = device(xs[R], offset)
    root = P - 1
    assert_close(comm.bcast(b, root=root, algorithm=algo), xs[root], f"bcast {tag}", exact=True)
    assert_close(comm.allgather(x, algorithm=algo), np.concatenate(xs), f"allgather {tag}", exact=True)
    g = comm.gather(x, root=0, algorithm=algo)
    if R == 0:
        assert_close(g, np.concatenate(xs), f"gather {tag}", exact=True)
    # v-variants: rank r contributes n + r elements
    vs = [data(r, n + r, dtype, 1) for r in range(P)]
    assert_close(comm.allgatherv(device(vs[R], offset), algorithm=algo), np.concatenate(vs),
                 f"allgatherv {tag}", exact=True)
    gv = comm.gatherv(device(vs[R], offset), root=root, algorithm=algo)
    if R == root:
        assert_close(gv, np.concatenate(vs), f"gatherv {tag}", exact=True)
    # reduce_scatter over n rows (array_split blocks, uneven unless P divides n)
    rs = comm.reduce_scatter(x, "sum", algorithm=algo)
    assert_close(rs, np.array_split(reduce_np(xs, "sum"), P)[R], f"reduce_scatter {tag}", exact=True)
    # scatter / alltoall over P * n elements
    full = [data(r, P * n, dtype, 2) for r in range(P)]
    sc = comm.scatter(device(full[0], offset) if R == 0 else None, root=0, algorithm=algo)
    assert_close(sc, full[0][R * n:(R + 1) * n], f"scatter {tag}", exact=True)
    a2a = comm.alltoall(device(full[R], offset), algorithm=algo)
    assert_close(a2a, np.concatenate([full[r][R * n:(R + 1) * n] for r in range(P)]), f"alltoall {tag}",
                 exact=True)


def run_algorithms(backend):
    """Our algorithms over the backend's point-to-point (float32, one size), and IPC's own."""
    n = 4099
    xs = [data(r, n, np.float32) for r in range(P)]
    x = cp.asarray(xs[R])
    want = reduce_np(xs, "sum")
    names = [a for a in algorithm_names("allreduce") if a != "native"]
    if backend == "ipc":
        names = ["ll", "oneshot", "twoshot", "pipe", "two_level"]
    for name in names:
        assert_close(comm.allreduce(x, algorithm=f"{backend}/{name}"), want, f"allreduce {backend}/{name}", exact=True)
    for name in [a for a in algorithm_names("bcast") if a != "native"] if backend != "ipc" else ["ll", "pull",
                                                                                                "twoshot", "pipe"]:
        b = cp.asarray(xs[R])
        assert_close(comm.bcast(b, root=0, algorithm=f"{backend}/{name}"), xs[0], f"bcast {backend}/{name}",
                     exact=True)
    if backend == "ipc":
        for name in ("ll", "oneshot", "twoshot", "pipe"):
            got = comm.reduce(x, "sum", root=P - 1, algorithm=f"ipc/{name}")
            if R == P - 1:
                assert_close(got, want, f"reduce ipc/{name}", exact=True)
        for name in ("ll", "pull", "push"):
            assert_close(comm.allgather(x, algorithm=f"ipc/{name}"), np.concatenate(xs), f"allgather ipc/{name}",
                         exact=True)
        # reduce_scatter: equal 16-byte parts (the aligned kernels), uneven parts, an offset view, rows of 3,
        # a given out, every op and a half type
        for shape, offset, dtype in (((4096,), False, np.float32), ((4099,), False, np.float32),
                                     ((4096,), True, np.float32), ((1366, 3), False, np.float64),
                                     ((4103,), True, np.float16), ((64 * P,), False, np.int64),
                                     ((4098,), False, np.int32), ((4101,), True, np.bool_), ((5,), False, np.bool_)):
            size = int(np.prod(shape))
            ys = [data(r, size, dtype, 4) for r in range(P)]
            y = device(ys[R], offset).reshape(shape)
            for name in ("ll", "oneshot", "ll128"):
                for op in OPS:
                    want = np.array_split(reduce_np(ys, op).reshape(shape), P)[R]
                    tag = f"reduce_scatter ipc/{name} {op} {shape} {np.dtype(dtype).name} offset={offset}"
                    assert_close(comm.reduce_scatter(y, op, algorithm=f"ipc/{name}"), want, tag, exact=True)
                    out = cp.full(want.shape, 9, dtype=dtype)
                    got = comm.reduce_scatter(y, op, out=out, algorithm=f"ipc/{name}")
                    check(got is out, f"{tag}: out= not returned")
                    assert_close(out, want, tag + " out=", exact=True)
                assert_close(y, ys[R].reshape(shape), f"reduce_scatter ipc/{name}: input modified", exact=True)
        # the LL128 reduce-scatter at parts of several rounds a warp (grids of 128 blocks take 8192 lines a round)
        for size, offset, dtype in (((1 << 20) + 3, False, np.float32), ((1 << 21) + 7, True, np.float16),
                                    (3 << 17, False, np.int64)):
            ys = [data(r, size, dtype, 4) for r in range(P)]
            y = device(ys[R], offset)
            for op in ("sum", "max"):
                tag = f"reduce_scatter ipc/ll128 {op} {size} {np.dtype(dtype).name} offset={offset}"
                assert_close(comm.reduce_scatter(y, op, algorithm="ipc/ll128"), np.array_split(reduce_np(ys, op), P)[R],
                             tag, exact=True)


def run_stream_ordered(backend):
    """Many calls back to back with no host wait between them (the default), checked at the end.

    A bcast root waits for nobody on the LL path, so 40 broadcasts in a row from
    one root test that it never overwrites a slot a slow peer still reads (the
    ack words); slow peers are made slow by a busy kernel before their calls.
    Allreduces of changing data through the hot path (out=, in place, an
    offset view) check that pre-packed arguments follow the buffers.
    """
    algo = f"{backend}/native"
    spin = cp.RawKernel(r'''extern "C" __global__ void mpiml_test_spin(long long ns) {
        long long t0 = clock64(); while (clock64() - t0 < ns) {} }''', "mpiml_test_spin")
    for n in (1, 5, 1000, 4099, 70001):
        outs, wants = [], []
        for k in range(40):
            if R == (k % P):
                spin((1,), (1,), (np.int64(20000 * (1 + R)),))
            src = cp.full(n, k + 1, dtype=cp.float32) if R == 0 else cp.zeros(n, dtype=cp.float32)
            outs.append(comm.bcast(src, root=0, algorithm=algo))
            wants.append(np.full(n, k + 1, dtype=np.float32))
        base = cp.zeros(n + 1, dtype=cp.float32)
        views = {"fresh": None, "out": cp.empty(n, dtype=cp.float32), "inplace": None, "offset": base[1:]}
        for k in range(30):
            xs = [data(r, n, np.float32, 100 + k) for r in range(P)]
            want = reduce_np(xs, "sum")
            for kind, out in views.items():
                x = cp.asarray(xs[R])
                if kind == "inplace":
                    got = comm.allreduce(x, out=x, algorithm=algo)
                elif kind == "offset":
                    out[...] = 0
                    got = comm.allreduce(x, out=out, algorithm=algo)
                else:
                    got = comm.allreduce(x, out=out, algorithm=algo)
                outs.append(got.copy())
                wants.append(want)
        # every collective with a hot launcher, repeated: fresh results and out= alternating
        out_b, out_r = cp.empty(n, dtype=cp.float32), cp.empty(n, dtype=cp.float32)
        out_g = cp.empty(P * n, dtype=cp.float32)
        for k in range(12):
            xs = [data(r, n, np.float32, 200 + k) for r in range(P)]
            x = cp.asarray(xs[R])
            given = k % 2 == 1
            b = comm.bcast(x, root=P - 1, out=out_b if given else None, algorithm=algo)
            outs.append(b.copy())
            wants.append(xs[P - 1])
            red = comm.reduce(x, "sum", root=0, out=out_r if given else None, algorithm=algo)
            if R == 0:
                outs.append(red.copy())
                wants.append(reduce_np(xs, "sum"))
            else:
                check(red is None, f"hot reduce {backend} n={n}: non-root got {type(red)}")
            g = comm.allgather(x, out=out_g if given else None, algorithm=algo)
            outs.append(g.copy())
            wants.append(np.concatenate(xs))
            want_rs = np.array_split(reduce_np(xs, "sum"), P)[R]
            out_s = cp.empty(want_rs.shape, dtype=cp.float32) if given else None
            outs.append(comm.reduce_scatter(x, "sum", out=out_s, algorithm=algo).copy())
            wants.append(want_rs)
        comm.synchronize()
        for i, (got, want) in enumerate(zip(outs, wants)):
            assert_close(got, want, f"stream-ordered {backend} n={n} call {i}", exact=True)
    if P > 1:
        hot = {k[0] for k in comm._hot if k[5] == algo}
        if backend == "nccl":
            expected = {"allreduce", "bcast", "reduce", "allgather"}
        elif os.environ.get("MPIML_NODE_SIZE"):  # two nodes: the ops that go to NCCL take its launcher
            expected = {"bcast", "reduce", "allgather"}
        else:
            expected = {"allreduce", "bcast", "reduce", "allgather", "reduce_scatter"}
        check(expected <= hot, f"{backend}: no hot launcher for {sorted(expected - hot)} (have {sorted(hot)})")


def run_big(backend):
    algo = route(backend)
    for dtype in (np.float32, np.float16):
        xs = [data(r, BIG, dtype) for r in range(P)]
        for offset in (False, True):
            x = device(xs[R], offset)
            for op in ("sum", "max"):
                got = comm.allreduce(x, op, algorithm=algo)
                assert_close(got, reduce_np(xs, op), f"allreduce {op} {backend} big {np.dtype(dtype).name} "
                             f"offset={offset}", exact=True)
            # bit-identical on every rank
            h = comm.allgather(cp.asarray([int(cp.asnumpy(got).view(np.uint8).sum())]))
            check(len(set(cp.asnumpy(h).tolist())) == 1, f"allreduce {backend} big: ranks differ {h}")
            # in place (the two-shot kernel reads in[i] before it writes out[i])
            y = device(xs[R], offset)
            comm.allreduce(y, "sum", out=y, algorithm=algo)
            assert_close(y, reduce_np(xs, "sum"), f"allreduce in place {backend} big {np.dtype(dtype).name} "
                         f"offset={offset}", exact=True)
            assert_close(comm.reduce_scatter(x, "max", algorithm=algo), np.array_split(reduce_np(xs, "max"), P)[R],
                         f"reduce_scatter {backend} big {np.dtype(dtype).name} offset={offset}", exact=True)
            got = comm.reduce(x, "sum", root=P - 1, algorithm=algo)  # (auto at 4 ranks: the LL128 two-shot)
            if R == P - 1:
                assert_close(got, reduce_np(xs, "sum"), f"reduce {backend} big {np.dtype(dtype).name} offset={offset}",
                             exact=True)
            if backend == "ipc" and P > 1:  # the pushed allgather; the two-shot bcast and reduce from every root
                for name in ("pull", "push"):
                    assert_close(comm.allgather(x, algorithm=f"ipc/{name}"), np.concatenate(xs),
                                 f"allgather ipc/{name} big {np.dtype(dtype).name} offset={offset}", exact=True)
                for root in range(P):
                    b = device(xs[R], offset)
                    assert_close(comm.bcast(b, root=root, algorithm="ipc/twoshot"), xs[root],
                                 f"bcast ipc/twoshot root={root} big {np.dtype(dtype).name} offset={offset}",
                                 exact=True)
                    got = comm.reduce(x, "min", root=root, algorithm="ipc/twoshot")
                    if R == root:
                        assert_close(got, reduce_np(xs, "min"), f"reduce ipc/twoshot root={root} big "
                                     f"{np.dtype(dtype).name} offset={offset}", exact=True)


def run_graph(backend):
    """Capture collectives into one CUDA graph, replay on fresh inputs, interleave eager calls."""
    os.environ["MPIML_CHECK"] = "0"
    algo = f"{backend}/native"
    stream = cp.cuda.Stream(non_blocking=True)
    for n in (17, 4099, 70001):
        with stream:
            x = cp.empty(n, dtype=cp.float32)
            y = cp.empty(n, dtype=cp.float32)
            b = cp.empty(n, dtype=cp.float32)
            m = cp.empty(n, dtype=cp.float32)
            x[...] = cp.asarray(data(R, n, np.float32))
            comm.allreduce(x, out=y, algorithm=algo)          # warm-up: compile, connect, pool
            comm.bcast(b, root=0, algorithm=algo)
            comm.reduce(x, "max", root=0, algorithm=algo)
            rs_out = cp.empty(n // P, dtype=cp.float32)
            comm.reduce_scatter(x[:n // P * P], "sum", out=rs_out, algorithm=algo)
            if backend == "ipc":
                comm.reduce_scatter(x, "max", algorithm="ipc/ll128")
            stream.synchronize()
            stream.begin_capture()
            comm.allreduce(x, out=y, algorithm=algo)
            bb = comm.bcast(b, root=0, algorithm=algo)   # non-roots: an array allocated in the capture
            comm.allreduce(y, "max", out=m, algorithm=algo)
            rs = comm.reduce_scatter(x[:n // P * P], "sum", out=rs_out, algorithm=algo)  # equal parts
            rs128 = comm.reduce_scatter(x, "max", algorithm="ipc/ll128") if backend == "ipc" else None
            graph = stream.end_capture()
            for rep in range(3):
                xs = [data(r, n, np.float32, 10 + rep) for r in range(P)]
                x[...] = cp.asarray(xs[R])
                b[...] = cp.asarray(xs[R] * 2)
                graph.launch(stream)
                stream.synchronize()
                total = reduce_np(xs, "sum")
                assert_close(y, total, f"graph allreduce {backend} n={n} rep={rep}", exact=True)
                assert_close(bb, xs[0] * 2, f"graph bcast {backend} n={n} rep={rep}", exact=True)
                assert_close(m, total, f"graph allreduce(max of equal) {backend} n={n} rep={rep}", exact=True)
                assert_close(rs, np.array_split(total[:n // P * P], P)[R],
                             f"graph reduce_scatter {backend} n={n} rep={rep}", exact=True)
                if rs128 is not None:
                    assert_close(rs128, np.array_split(reduce_np(xs, "max"), P)[R],
                                 f"graph reduce_scatter ipc/ll128 n={n} rep={rep}", exact=True)
                e = comm.allreduce(x, algorithm=algo)         # eager between replays
                stream.synchronize()
                assert_close(e, total, f"eager after graph {backend} n={n} rep={rep}", exact=True)
    os.environ.pop("MPIML_CHECK", None)


def run_pipelined():
    """The staged ring allreduce / allgather and chain bcast with many small chunks."""
    old = os.environ.get("MPIML_STAGE_CHUNK")
    os.environ["MPIML_STAGE_CHUNK"] = "4096"
    try:
        for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_):
            for n in (1, 2, 5, 4099, 70001):
                xs = [data(r, n, dtype, 3) for r in range(P)]
                tag = f"{np.dtype(dtype).name} n={n}"
                for offset in (False, True):
                    for op in OPS if n == 4099 else ("sum",):
                        x = device(xs[R], offset)
                        assert_close(comm.allreduce(x, op, algorithm="mpi/ring"), reduce_np(xs, op),
                                     f"mpi/ring allreduce {op} {tag} offset={offset}", exact=True)
                        assert_close(x, xs[R], f"mpi/ring allreduce {op} {tag}: input modified", exact=True)
                    y = device(xs[R], offset)
                    comm.allreduce(y, "max", out=y, algorithm="mpi/ring")
                    assert_close(y, reduce_np(xs, "max"), f"mpi/ring allreduce in place {tag} offset={offset}",
                                 exact=True)
                    for root in sorted({0, P - 1}):
                        b = device(xs[R], offset)
                        assert_close(comm.bcast(b, root=root, algorithm="mpi/chain"), xs[root],
                                     f"mpi/chain bcast root={root} {tag} offset={offset}", exact=True)
                    assert_close(comm.allgather(device(xs[R], offset), algorithm="mpi/ring"), np.concatenate(xs),
                                 f"mpi/ring allgather {tag} offset={offset}", exact=True)
    finally:
        if old is None:
            os.environ.pop("MPIML_STAGE_CHUNK", None)
        else:
            os.environ["MPIML_STAGE_CHUNK"] = old
    # default chunks, several of them per segment (16 MiB float32)
    n = 4 << 20
    xs = [data(r, n, np.float32, 5) for r in range(P)]
    assert_close(comm.allreduce(cp.asarray(xs[R]), algorithm="mpi/ring"), reduce_np(xs, "sum"),
                 "mpi/ring allreduce 16 MiB", exact=True)


def run_shared():
    """Ranks sharing a GPU: nccl and ipc refused on every rank (by name), auto stages through MPI."""
    from mpiml import CommError
    from mpiml.comm.backends._device import agree_device_ids, shared_device_groups

    groups = shared_device_groups(agree_device_ids(comm._ctl))
    check(bool(groups), f"--shared, but no ranks share a GPU here ({agree_device_ids(comm._ctl)})")
    x = cp.asarray(data(R, 1000, np.float32))
    for name in ("nccl", "ipc"):
        try:
            comm.allreduce(x, algorithm=f"{name}/native")
            check(False, f"forced {name} on a shared GPU did not raise")
        except CommError as exc:
            check("share GPU" in str(exc) and name in str(exc), f"forced {name}: unclear error {exc}")
        check(name not in comm._device_transports, f"{name} transport was created on a shared GPU")
    by_name = get_comm(backend="nccl")
    try:
        by_name.allreduce(x)
        check(False, "get_comm(backend='nccl') on a shared GPU did not raise")
    except CommError as exc:
        check("share GPU" in str(exc), f"get_comm(backend='nccl'): unclear error {exc}")
    # auto: every size goes through the staged MPI path, correctly
    for nbytes in (4, 4096, 1 << 20, 16 << 20):
        n = nbytes // 4
        xs = [data(r, n, np.float32, 9) for r in range(P)]
        assert_close(comm.allreduce(cp.asarray(xs[R])), reduce_np(xs, "sum"), f"auto allreduce {nbytes} B shared",
                     exact=True)
        assert_close(comm.bcast(cp.asarray(xs[R]), root=P - 1), xs[P - 1], f"auto bcast {nbytes} B shared",
                     exact=True)
    check(not set(comm._device_transports) & {"nccl", "ipc"},
          f"auto created a device transport on a shared GPU: {list(comm._device_transports)}")
    # a ring of device point-to-point messages that waits on its receives before its sends (as the
    # neighbours' ring does): a staged send must be under way without being tested
    for nbytes in (0, 8, 1 << 20, 9 << 20):
        xs = [data(r, nbytes // 4, np.float32, 11) for r in range(P)]
        sends = [comm.isend(cp.asarray(xs[R]), (R + 1) % P, tag=t) for t in (5, 6)]
        recvs = [comm.irecv((R - 1) % P, tag=t) for t in (5, 6)]
        got = [r.wait() for r in recvs]
        for s in sends:
            s.wait()
        for g in got:
            assert_close(g, xs[(R - 1) % P], f"device ring isend/irecv {nbytes} B shared", exact=True)


def main():
    t0 = time.perf_counter()
    if SHARED:
        run_shared()
    for backend in BACKENDS:
        tb = time.perf_counter()
        for dtype in DTYPES:
            for n in SIZES:
                run_case(backend, dtype, n, offset=(n % 2 == 1 and n > 1))
        run_case(backend, np.float32, 1000, offset=False)
        if P > 1 and backend != "auto":
            run_algorithms(backend)
        if backend == "mpi":
            run_pipelined()
        run_big(backend)
        if GRAPH and backend in ("nccl", "ipc"):
            run_graph(backend)
        if backend in ("nccl", "ipc") and P > 1:
            run_stream_ordered(backend)
        if R == 0:
            print(f"  {backend}: {time.perf_counter() - tb:.1f} s", flush=True)
    if R == 0:
        print(f"{P} ranks, backends {BACKENDS}: {time.perf_counter() - t0:.1f} s", flush=True)


guarded(main, comm)
