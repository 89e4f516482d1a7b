"""The pipelined staged collectives (ring allreduce, chain bcast, ring allgather) on the CPU.

The schedule in :mod:`mpiml.comm.backends._pipeline` only asks its engine to
queue copies and reductions and whether an event is done, so here the engine's
"device" is NumPy and its two streams run *late*: a queued step executes only
when a later poll lets it (at random), in stream order, after the events it
waits for.  A missing dependency in the schedule (a message sent before its
copy landed, memory reused while a copy still reads it, a reduction before its
data arrived) then gives a wrong result.  Real ``mpiexec`` at 1-4 ranks, real
MPI messages over the ``mpi`` transport, results compared exactly with NumPy.
The same code runs with CuPy on the GPU host (``tests/comm/test_gpu_comm.py``).
"""

import pytest

from mpiml.comm.backends._pipeline import StagingModel, chain_bcast_cost, ring_allreduce_cost

SCRIPT = r'''
import sys
from collections import deque

import numpy as np
from mpi4py import MPI

from _spmd import assert_close, check, guarded
from mpiml.comm.backends.mpi import MPITransport
from mpiml.comm.backends import _pipeline
from mpiml._errors import CommTimeoutError

UF = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


class Event:
    __slots__ = ("fired",)

    def __init__(self):
        self.fired = False


class LateEngine:
    """Two FIFO 'streams' of NumPy steps that run only when a poll lets them (at random)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.q = {"down": deque(), "up": deque()}
        self.finished = False

    def _push(self, stream, fn, after=None):
        ev = Event()
        self.q[stream].append((fn, after, ev))
        return ev

    def _advance(self):
        for name in ("down", "up"):
            q = self.q[name]
            for _ in range(int(self.rng.integers(0, 3))):
                if not q:
                    break
                fn, after, ev = q[0]
                if after is not None and not after.fired:
                    break
                q.popleft()
                fn()
                ev.fired = True

    def host(self, nbytes):
        return np.full(nbytes, 0xAB, dtype=np.uint8)   # garbage: a byte never written shows

    def device(self, n, dtype):
        out = np.empty(n, dtype=dtype)
        out.view(np.uint8)[:] = 0xCD
        return out

    def d2h(self, host, dev, after=None):
        return self._push("down", lambda: host.__setitem__(slice(None), dev.view(np.uint8)), after)

    def h2d(self, dev, host):
        return self._push("up", lambda: dev.view(np.uint8).__setitem__(slice(None), host))

    def copy(self, dst, src):
        return self._push("up", lambda: dst.__setitem__(slice(None), src))

    def reduce(self, op, a, b, out):
        return self._push("up", lambda: UF[op](a, b, out=out))

    def done(self, ev):
        self._advance()
        return ev.fired

    def finish(self):
        self.finished = True
        check(not self.q["down"] and not self.q["up"], "steps still queued when the call completed")

    def keep(self):
        pass


world = MPI.COMM_WORLD
t = MPITransport(world.Dup(), owned=True, cuda_aware=False)
P, R = t.size, t.rank


def data(rank, n, dtype, salt):
    rng = np.random.default_rng(1000 * rank + 31 * n + salt)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    return rng.integers(-2, 3, n).astype(dtype)


def reduce_np(xs, op):
    out = xs[0].copy()
    for x in xs[1:]:
        out = UF[op](out, x).astype(xs[0].dtype)
    return out


def main():
    salt = 0
    for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_):
        for n, chunk in ((1, 1), (2, 1), (3, 8), (5, 8), (17, 1), (17, 64), (100, 64), (1001, 256),
                         (1001, 1 << 20)):
            salt += 1
            xs = [data(r, n, dtype, salt) for r in range(P)]
            tag = f"{np.dtype(dtype).name} n={n} chunk={chunk}B"
            for op in ("sum", "prod", "min", "max") if n in (17, 1001) else ("sum",):
                for inplace in (False, True):
                    e = LateEngine(salt * 7 + R)
                    x = xs[R].copy()
                    out = x if inplace else np.full(n, 7, dtype=dtype)
                    _pipeline.ring_allreduce(t, x, out, op, engine=e, chunk_bytes=chunk).wait()
                    assert_close(out, reduce_np(xs, op), f"ring allreduce {op} {tag} inplace={inplace}",
                                 exact=True)
                    check(e.finished, f"ring allreduce {tag}: engine not finished")
                    if not inplace:
                        assert_close(x, xs[R], f"ring allreduce {tag}: input modified", exact=True)
            for root in sorted({0, P - 1, P // 2}):
                e = LateEngine(salt * 11 + R)
                b = xs[R].copy()
                _pipeline.chain_bcast(t, b, root, engine=e, chunk_bytes=chunk).wait()
                assert_close(b, xs[root], f"chain bcast root={root} {tag}", exact=True)
            e = LateEngine(salt * 13 + R)
            g = np.zeros(n * P, dtype=dtype)
            _pipeline.ring_allgather(t, xs[R].copy(), g, engine=e, chunk_bytes=chunk).wait()
            assert_close(g, np.concatenate(xs), f"ring allgather {tag}", exact=True)
    # the ring / chain algorithms take the transport's pipelined path for device buffers (here: arrays
    # of a class that claims to be CuPy's, served by the late engine)
    class Device(np.ndarray):
        pass

    Device.__module__ = "cupy._fake"
    used = []

    def engine(transport, given):
        used.append(1)
        return LateEngine(len(used) * 17 + R)

    real, _pipeline._engine = _pipeline._engine, engine
    try:
        from mpiml.comm.algorithms import Channel, get_algorithm
        xs = [data(r, 1001, np.float32, 99) for r in range(P)]
        x, out = xs[R].copy().view(Device), np.zeros(1001, np.float32).view(Device)
        get_algorithm("allreduce", "ring").run(Channel(t, np, "allreduce[ring]"), x, out, "sum")
        assert_close(np.asarray(out), reduce_np(xs, "sum"), "allreduce[ring] through the transport", exact=True)
        b = xs[R].copy().view(Device)
        get_algorithm("bcast", "chain").run(Channel(t, np, "bcast[chain]"), b, P - 1)
        assert_close(np.asarray(b), xs[P - 1], "bcast[chain] through the transport", exact=True)
        g = np.zeros(1001 * P, np.float32).view(Device)
        get_algorithm("allgather", "ring").run(Channel(t, np, "allgather[ring]"), x, g)
        assert_close(np.asarray(g), np.concatenate(xs), "allgather[ring] through the transport", exact=True)
        check(len(used) == (3 if P > 1 else 0), f"pipelined path taken {len(used)} times")
        used.clear()
        get_algorithm("allreduce", "ring").run(Channel(t, np, "allreduce[ring]"), xs[R].copy(),
                                               np.empty(1001, np.float32), "sum")
        check(not used, "host buffers took the staged path")
    finally:
        _pipeline._engine = real
    # a peer that never comes: the others time out (no hang), with the op named
    if P >= 2:
        import os
        os.environ["MPIML_TIMEOUT"] = "1"
        x = np.ones(8, dtype=np.float32)
        if R == 0:
            try:
                _pipeline.ring_allreduce(t, x, x.copy(), "sum", engine=LateEngine(1), chunk_bytes=1 << 20).wait()
                check(False, "ring allreduce without peers did not time out")
            except CommTimeoutError as exc:
                check("allreduce" in str(exc), f"timeout names the op: {exc}")
        elif R == 1:  # drain rank 0's first message (its own segment), sent before it gave up
            t.comm.Recv([np.empty(16, dtype=np.uint8), MPI.BYTE], 0, _pipeline.TAG)
        os.environ.pop("MPIML_TIMEOUT")
        world.Barrier()


from mpiml.comm import get_comm  # noqa: E402

guarded(main, get_comm())
'''


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_pipelined_staging_late_streams(mpi, n):
    proc = mpi(None, n, timeout=300, code=SCRIPT, env={"MPIML_TIMEOUT": "60"})
    assert "OK: 0 failure(s)" in proc.stdout, proc.stdout + proc.stderr


def test_cost_formulas():
    m = StagingModel(alpha=5e-6, beta=1 / 10e9, down=50e9, up=50e9, per_chunk=30e-6)
    assert ring_allreduce_cost(64 << 20, 1, 4 << 20, m) == 0.0
    # large messages: the busiest engine dominates (here the wire: 2 (p-1)/p n beta)
    n = 64 << 20
    t2 = ring_allreduce_cost(n, 2, 4 << 20, m)
    assert n / 10e9 <= t2 < 1.5 * n / 10e9
    # more ranks move more bytes per rank up and over the wire (towards 2 n), never less
    assert ring_allreduce_cost(n, 4, 4 << 20, m) > t2
    # the time grows with the size
    sizes = [1 << k for k in range(10, 29)]
    costs = [ring_allreduce_cost(s, 3, 4 << 20, m) for s in sizes]
    assert all(a < b for a, b in zip(costs, costs[1:]))
    # chain bcast: ~ n over the slowest of copy and wire, plus the fill
    assert n / 10e9 <= chain_bcast_cost(n, 4, 4 << 20, m) <= n / 10e9 + 3 * (5e-6 + (4 << 20) / 10e9) + 16 * 30e-6
    assert chain_bcast_cost(n, 1, 4 << 20, m) == 0.0


def test_auto_picks_the_pipelined_ring_when_mpi_is_the_path():
    from mpiml.comm._tuning import TuningTable, load_default_rules

    table = TuningTable(load_default_rules())
    only_mpi = ("mpi",)
    for p in (2, 3, 4, 8):
        assert table.choose("allreduce", 64 << 20, p, "device", only_mpi) == ("mpi", "ring")
        assert table.choose("bcast", 64 << 20, p, "device", only_mpi) == ("mpi", "chain")
        assert table.choose("allgather", 64 << 20, p, "device", only_mpi) == ("mpi", "ring")
        assert table.choose("allreduce", 4, p, "device", only_mpi) == ("mpi", "native")
        small = ("mpi", "chain") if p == 2 else ("mpi", "native")  # measured at 2 ranks only
        assert table.choose("bcast", 4096, p, "device", only_mpi) == small
        # where NCCL or IPC run, they keep the device messages
        assert table.choose("allreduce", 64 << 20, p, "device", ("mpi", "nccl", "ipc"))[0] != "mpi"
    # host buffers: MPI's own collectives; one rank: nothing to pipeline
    assert table.choose("allreduce", 64 << 20, 2, "host", only_mpi) == ("mpi", "native")
    assert table.choose("allreduce", 64 << 20, 1, "device", ("self",)) == ("self", "native")


def test_tuning_rules_per_mode():
    from mpiml.comm._tuning import Rule, TuningTable, load_default_rules, stream_mode

    avail = ("mpi", "nccl", "ipc")
    table = TuningTable([
        Rule(op="bcast", memory="device", mode="eager", max_bytes=1 << 20, backend="ipc", algorithm="pull"),
        Rule(op="bcast", memory="device", backend="nccl", algorithm="native"),
    ])
    assert table.choose("bcast", 1 << 20, 4, "device", avail, "eager") == ("ipc", "pull")
    assert table.choose("bcast", 1 << 20, 4, "device", avail, "graph") == ("nccl", "native")
    assert table.choose("bcast", 4 << 20, 4, "device", avail, "eager") == ("nccl", "native")
    assert table.choose("bcast", 1 << 20, 4, "device", avail) == ("ipc", "pull")  # eager by default
    # a table is data: it round-trips with its modes, and an unknown mode is refused
    assert TuningTable.from_data(table.to_data()).choose("bcast", 1, 4, "device", avail, "graph")[0] == "nccl"
    with pytest.raises(ValueError, match="mode"):
        Rule(op="bcast", mode="captured")
    # the checked-in defaults route every call alike in both modes (the LL two-shot took the 4-rank bcast
    # of 64 KiB-1 MiB in both; test_tuning_machine.py) but the 4-rank reduce above 256 KiB to 1 MiB (the LL
    # two-shot eagerly, NCCL in graphs); tests/comm/gpu_modes.py brings a table of its own
    defaults = TuningTable(load_default_rules())
    for op in ("allreduce", "bcast", "reduce", "allgather"):
        for nbytes in (4, 1 << 16, 1 << 20, 64 << 20):
            for p in (2, 3, 4, 8):
                if (op, nbytes, p) == ("reduce", 1 << 20, 4):
                    continue
                assert defaults.choose(op, nbytes, p, "device", avail, "eager") == \
                    defaults.choose(op, nbytes, p, "device", avail, "graph"), (op, nbytes, p)
    assert stream_mode("host") == "eager"
