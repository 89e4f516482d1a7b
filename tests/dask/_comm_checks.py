"""Comm-level checks of the ``mpi://`` backend, run under ``mpiexec`` by test_comm.py.

``python _comm_checks.py OUT.json [NAME ...]`` runs the named checks (all by
default) and writes ``{name: "ok" | traceback}`` from rank 0. With one rank
both ends of every connection live in this process (the data still goes
through MPI); with two ranks the ``cross_*`` checks put the listener on rank
0 and the connector on rank 1.

The single-process checks cover the ground of distributed's own scheme-agnostic
comm tests: client/server round trips, closing explicitly and implicitly,
connect timeouts, many listeners, (de)serialisation round trips including
errors, repr and address handling.
"""

import asyncio
import json
import os
import sys
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

import mpiml.dask
from mpiml.dask import _backend  # noqa: F401  (registers "mpi")

from distributed.comm import (  # noqa: E402
    CommClosedError,
    connect,
    get_address_host,
    get_local_address_for,
    listen,
    parse_address,
    resolve_address,
)
from distributed.comm.registry import backends, get_backend  # noqa: E402
from distributed.protocol import Serialized, deserialize, serialize, to_serialize  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()
CHECK_TIMEOUT = 60
CHECKS = {}


def check(func):
    CHECKS[func.__name__] = func
    return func


def expect_raises(exc_type, what):
    class _Ctx:
        def __enter__(self):
            return self

        def __exit__(self, et, ev, tb):
            if et is None:
                raise AssertionError(f"{what}: expected {exc_type.__name__}, nothing raised")
            if not issubclass(et, exc_type):
                return False
            self.value = ev
            return True

    return _Ctx()


async def comm_pair(addr="mpi://", **kwargs):
    q = asyncio.Queue()

    async def handle(comm):
        await q.put(comm)

    async with listen(addr, handle, **kwargs) as listener:
        comm = await connect(listener.contact_address, **kwargs)
        # stopping the listener aborts the comms still in their handshake: take ours first
        # (under Open MPI the listener's side of the handshake often ends after connect returns)
        server = await q.get()
    return comm, server


# -- single-process checks (both ends here) ------------------------------------------


async def _client_server(addr, check_loc):
    async def handle(comm):
        try:
            assert parse_address(comm.peer_address)[0] == "mpi"
            msg = await comm.read()
            assert msg["op"] == "ping"
            msg["op"] = "pong"
            await comm.write(msg)
            msg = await comm.read()
            assert msg["op"] == "foobar"
        finally:
            await comm.close()

    listener = await listen(addr, handle, xxx="ignored")
    scheme, loc = parse_address(listener.listen_address)
    assert scheme == "mpi" and scheme in backends
    assert listener.contact_address == listener.listen_address
    check_loc(loc)
    seen = []

    async def client(key, delay=0):
        comm = await connect(listener.contact_address, xxx="ignored")
        try:
            assert comm.peer_address == listener.contact_address
            await comm.write({"op": "ping", "data": key})
            await comm.write({"op": "foobar"})
            if delay:
                await asyncio.sleep(delay)
            assert await comm.read() == {"op": "pong", "data": key}
            seen.append(key)
        finally:
            await comm.close()

    await client(1234)
    await asyncio.gather(*(client(i, delay=0.05) for i in range(20)))
    assert set(seen) == {1234} | set(range(20)), seen
    listener.stop()


def loc_is(rank, ident=None):
    def checker(loc):
        r, i = loc.split(":")
        assert int(r) == rank, loc
        if ident is None:
            assert int(i) >= 32768, loc
        else:
            assert int(i) == ident, loc

    return checker


@check
async def client_server():
    await _client_server("mpi://", loc_is(RANK))
    await _client_server("mpi://:3201", loc_is(RANK, 3201))
    await _client_server(f"mpi://{RANK}:3202", loc_is(RANK, 3202))
    await _client_server(f"mpi://{RANK}", loc_is(RANK))
    await _client_server("mpi://localhost:3203", loc_is(RANK, 3203))


@check
async def comm_closed_implicit():
    async def handle(comm):
        await comm.close()

    async with listen("mpi://", handle) as listener:
        comm = await connect(listener.contact_address)
        with expect_raises(CommClosedError, "write+read on a comm closed by the peer"):
            await comm.write({})
            await comm.read()
        comm = await connect(listener.contact_address)
        with expect_raises(CommClosedError, "read on a comm closed by the peer"):
            await comm.read()


@check
async def comm_closed_explicit():
    a, b = await comm_pair()
    a_read, b_read = a.read(), b.read()
    await a.close()
    for what, coro in [("in-flight read, closed side", a_read), ("in-flight read, peer", b_read),
                       ("new read, closed side", a.read()), ("new read, peer", b.read()),
                       ("write, closed side", a.write({})), ("write, peer", b.write({}))]:
        with expect_raises(CommClosedError, what):
            await coro
    await b.close()
    assert a.closed() and b.closed()


@check
async def comm_closed_while_reading():
    # A read already waiting is woken by the peer's close (not left hanging).
    a, b = await comm_pair()
    reading = asyncio.ensure_future(b.read())
    await asyncio.sleep(0.05)
    assert not reading.done()
    await a.close()
    with expect_raises(CommClosedError, "pending read when the peer closes"):
        await asyncio.wait_for(reading, 10)
    await b.close()


@check
async def connect_timeout():
    t0 = time.monotonic()
    with expect_raises(OSError, "connect to an id nobody listens on"):
        await connect(f"mpi://{RANK}:5555", timeout=0.15)
    dt = time.monotonic() - t0
    assert 0.1 <= dt <= 1, dt


@check
async def stopped_listener_refuses():
    async def handle(comm):
        await comm.close()

    listener = await listen("mpi://", handle)
    address = listener.contact_address
    comm = await connect(address)
    await comm.close()
    listener.stop()
    with expect_raises(OSError, "connect to a stopped listener"):
        await connect(address, timeout=0.2)
    # Its id can be taken again.
    again = await listen(address, handle)
    assert again.contact_address == address
    again.stop()


@check
async def listen_address_in_use():
    async def handle(comm):
        pass

    listener = await listen("mpi://:4444", handle)
    with expect_raises(OSError, "second listener on the same id"):
        await listen("mpi://:4444", handle)
    listener.stop()


@check
async def many_listeners():
    async def handle(comm):
        pass

    listeners = [await listen("mpi://", handle) for _ in range(100)]
    assert len({l.listen_address for l in listeners}) == 100
    assert len({l.contact_address for l in listeners}) == 100
    for l in listeners:
        l.stop()


async def _listener_deserialize(deserialize_flag, in_value, check_out):
    q = asyncio.Queue()

    async def handle(comm):
        try:
            q.put_nowait(await comm.read())
        except Exception as exc:
            q.put_nowait(exc)
        finally:
            await comm.close()

    async with listen("mpi://", handle, deserialize=deserialize_flag) as listener:
        comm = await connect(listener.contact_address)
        await comm.write(in_value)
        out = await q.get()  # (before the listener stops: that aborts comms still in their handshake)
    if isinstance(out, Exception):
        raise out
    check_out(out)
    await comm.close()


async def _connector_deserialize(deserialize_flag, in_value, check_out):
    done = asyncio.Event()

    async def handle(comm):
        try:
            await comm.write(in_value)
            await done.wait()
        finally:
            await comm.close()

    async with listen("mpi://", handle) as listener:
        comm = await connect(listener.contact_address, deserialize=deserialize_flag)
        try:
            out = await comm.read()  # (before the listener stops: it would abort the handshaking comm)
            done.set()
        finally:
            await comm.close()
    check_out(out)


@check
async def deserialize_flag():
    def run_both(msg, check_false, check_true):
        return [
            _listener_deserialize(False, msg, check_false),
            _connector_deserialize(False, msg, check_false),
            _listener_deserialize(True, msg, check_true),
            _connector_deserialize(True, msg, check_true),
        ]

    msg = {"op": "update", "x": b"abc", "to_ser": [to_serialize(123)],
           "ser": Serialized(*serialize(456))}

    def small_false(out):
        out = dict(out)
        to_ser, ser = out.pop("to_ser"), out.pop("ser")
        assert out == {"op": "update", "x": b"abc"}, out
        assert isinstance(ser, Serialized) and deserialize(ser.header, ser.frames) == 456
        (to_ser,) = to_ser
        if isinstance(to_ser, Serialized):
            assert deserialize(to_ser.header, to_ser.frames) == 123
        else:
            assert to_ser == to_serialize(123)

    def small_true(out):
        out = dict(out)
        assert list(out.pop("to_ser")) == [123]
        assert out == {"op": "update", "x": b"abc", "ser": 456}, out

    for coro in run_both(msg, small_false, small_true):
        await coro

    big = os.urandom(1024**2) * 8
    msg = {"op": "update", "x": big, "to_ser": (to_serialize(big),),
           "ser": Serialized(*serialize(big))}

    def big_check(flag, out):
        out = dict(out)
        to_ser, ser = out.pop("to_ser"), out.pop("ser")
        assert out == {"op": "update", "x": big}
        if flag:
            assert bytes(ser) == big and bytes(to_ser[0]) == big
        else:
            assert isinstance(ser, Serialized) and deserialize(ser.header, ser.frames) == big

    for coro in run_both(msg, lambda o: big_check(False, o), lambda o: big_check(True, o)):
        await coro


@check
async def deserialize_roundtrip():
    big = os.urandom(1024**2) * 4
    msg = {"op": "update", "x": big, "to_ser": [to_serialize(big)],
           "ser": Serialized(*serialize(big))}
    for flag in (True, False):
        a, b = await comm_pair(deserialize=flag)
        await a.write(msg)
        got = await b.read()
        await b.write(got)
        got = await a.read()
        assert sorted(got) == sorted(msg)
        assert got["op"] == msg["op"] and got["x"] == msg["x"]
        if flag:
            assert isinstance(got["to_ser"][0], (bytes, bytearray, memoryview))
            assert isinstance(got["ser"], (bytes, bytearray, memoryview))
        else:
            assert isinstance(got["to_ser"][0], (to_serialize, Serialized))
            assert isinstance(got["ser"], Serialized)
        a.abort()
        b.abort()


def _raise_eoferror():
    raise EOFError


class _EOFRaising:
    def __reduce__(self):
        return _raise_eoferror, ()


@check
async def deserialize_eoferror():
    server_saw = asyncio.Queue()

    async def handle(comm):
        await comm.write({"data": to_serialize(_EOFRaising())})
        try:
            await comm.read()
        except CommClosedError:
            server_saw.put_nowait("closed")
        else:
            server_saw.put_nowait("message")

    async with listen("mpi://", handle) as listener:
        comm = await connect(listener.contact_address)
        with expect_raises(CommClosedError, "EOFError while deserialising"):
            await comm.read()
        assert comm.closed()
    assert await asyncio.wait_for(server_saw.get(), 10) == "closed"


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot pickle this")


@check
async def serialise_error_keeps_comm():
    # A message that cannot be serialised fails the write, not the connection.
    a, b = await comm_pair()
    with expect_raises(Exception, "write of an unpicklable object"):
        await a.write({"x": to_serialize(_Unpicklable())}, on_error="raise")
    await a.write({"op": "still-works"})
    assert await b.read() == {"op": "still-works"}
    # Remote exceptions travel as data and deserialise to the exception.
    await b.write({"exc": to_serialize(ValueError("boom"))})
    got = await a.read()
    assert isinstance(got["exc"], ValueError) and str(got["exc"]) == "boom"
    await a.close()
    await b.close()


@check
async def repr_and_addresses():
    a, b = await comm_pair()
    assert a.local_address in repr(b) and b.local_address in repr(a)
    assert a.peer_address == b.local_address and a.local_address == b.peer_address
    assert "closed" not in repr(a) and "closed" not in repr(b)
    await a.close()
    assert "closed" in repr(a) and a.local_address in repr(a) and b.peer_address in repr(a)
    await b.close()
    assert "closed" in repr(b) and a.local_address in repr(b) and b.peer_address in repr(b)
    a, b = await comm_pair()
    a.abort()
    b.abort()
    assert a.closed() and b.closed()


@check
async def address_functions():
    manager = mpiml.dask.initialize()
    loc = f"{RANK}:8786"
    assert get_address_host(f"mpi://{loc}") == manager.hosts[RANK]
    assert resolve_address(f"mpi://{loc}") == f"mpi://{loc}"
    assert resolve_address(f"mpi://{RANK}") == f"mpi://{RANK}"
    local = get_local_address_for(f"mpi://{loc}")
    assert local == f"mpi://{RANK}", local
    assert isinstance(get_backend("mpi"), mpiml.dask.MPIBackend)
    for bad in ("mpi://x:1", "mpi://0", "mpi://0:0", f"mpi://{WORLD.Get_size()}:1"):
        with expect_raises(ValueError, f"connect to {bad}"):
            await connect(bad, timeout=1)
    with expect_raises(ValueError, "listen on another rank"):
        await listen(f"mpi://{RANK + 1}:1", lambda c: None)


@check
async def large_and_many_frames():
    # Frames far bigger than the chunk size (MPIML_DASK_CHUNK_BYTES is small in
    # the tests) and more frames than fit in one header.
    a, b = await comm_pair()
    rng = np.random.default_rng(0)
    big = rng.random(3 * 2**20 // 8)          # 3 MiB
    many = [np.full(3, i, dtype=np.int64) for i in range(700)]
    payload = {"big": to_serialize(big), "many": [to_serialize(m) for m in many],
               "empty": to_serialize(np.empty(0)), "empty2d": to_serialize(np.empty((0, 3)))}
    nbytes = await a.write(payload)
    assert nbytes >= big.nbytes
    got = await b.read()
    assert np.array_equal(got["big"], big)
    assert all(np.array_equal(g, m) for g, m in zip(got["many"], many)) and len(got["many"]) == 700
    assert got["empty"].size == 0 and got["empty2d"].shape == (0, 3)
    # Both directions at once, several messages queued.
    await asyncio.gather(*(a.write({"i": i, "x": to_serialize(big[: 1000 * (i + 1)])})
                           for i in range(1)))
    for i in range(5):
        await b.write({"i": i})
    assert [(await a.read())["i"] for _ in range(5)] == list(range(5))
    got = await b.read()
    assert np.array_equal(got["x"], big[:1000])
    await a.close()
    await b.close()


class _FakeDevice:
    """A host byte buffer that _HostStager treats as device memory."""

    def __init__(self, arr):
        self.arr = arr

    def __getitem__(self, index):
        return _FakeDevice(self.arr[index])

    @property
    def nbytes(self):
        return self.arr.nbytes


class _LaterEvent:
    """A copy that completes on the third poll (exercises the waiting)."""

    def __init__(self):
        self.polls = 0

    @property
    def done(self):
        self.polls += 1
        return self.polls >= 3


class _HostStager:
    """The staging pipeline with host copies standing in for the device's."""

    is_device = staticmethod(lambda frame: isinstance(frame, _FakeDevice))
    allocate_pinned = staticmethod(lambda nbytes: np.empty(nbytes, dtype=np.uint8))

    def as_bytes(self, frame):
        return frame

    def empty(self, nbytes):
        return _FakeDevice(np.full(nbytes, 0xEE, dtype=np.uint8))

    def synchronize(self):
        pass

    def to_host(self, src, dst):
        dst[:] = src.arr
        return _LaterEvent()

    def to_device(self, src, dst):
        dst.arr[:] = src
        return _LaterEvent()


class _HostIPCStager(_HostStager):
    """_HostStager with IPC between the two ends of a connection in this process: a descriptor
    names a registered buffer; ``opened`` counts the mappings not yet closed."""

    ipc_within_process = True

    def __init__(self, can_open=True):
        self.exported, self.opened, self.imports, self.probes = {}, 0, 0, 0
        self.can_open = can_open

    def ipc_probe(self, descriptor):
        self.probes += 1
        if not self.can_open:
            raise RuntimeError("cannot open (as a peer that does not see the device)")
        return True

    def ipc_export(self, dev):
        from mpiml.dask._frames import IPC_DESCRIPTOR_BYTES

        key = len(self.exported) + 1
        self.exported[key] = dev
        desc = np.zeros(IPC_DESCRIPTOR_BYTES, dtype=np.uint8)
        desc[:8].view(np.uint64)[0] = key
        desc[64:].view(np.uint64)[:] = (0, dev.nbytes)
        return desc

    def ipc_import(self, descriptors):
        keys = [int(np.frombuffer(d, dtype=np.uint8)[:8].view(np.uint64)[0]) for d in descriptors]
        self.opened += len(set(keys))
        self.imports += len(keys)
        buffers = [_FakeDevice(self.exported[k].arr.copy()) for k in keys]

        def close():
            self.opened -= len(set(keys))

        return buffers, _LaterEvent(), close


@check
async def ipc_device_frames():
    # Large device frames to a process of this host go as IPC descriptors; the peer copies them
    # and acks. A write completes only once acked; messages keep their order with staged and
    # host-only ones around them; closing with unacked messages fails them instead of hanging.
    from mpiml.dask import _staging
    from mpiml.dask._frames import FLAG_CUDA, FLAG_IPC, FLAG_IPC_PROBE

    stager = _HostIPCStager()
    _staging.set_stager(stager)
    os.environ["MPIML_DASK_IPC_BYTES"] = "100000"
    try:
        a, b = await comm_pair()
        assert a._channel.ipc_min == 100000 and a._channel.ipc_ok is None
        rng = np.random.default_rng(5)
        # The first eligible frame asks whether the peer can open our memory: it travels staged,
        # with a probe frame that the peer drops; the answer comes back as an ACK.
        first = rng.integers(0, 255, 150000, dtype=np.uint8)
        frames = a._channel.prepare([_FakeDevice(first.copy()), memoryview(b"x")])
        assert frames.flags == [FLAG_CUDA, 0, FLAG_IPC_PROBE] and a._channel.ipc_ok == "asking"
        await asyncio.wait_for(a._channel.send(frames)[0], 20)
        got = await b._channel.next_frames(repr)
        assert len(got) == 2 and np.array_equal(got[0].arr, first) and bytes(got[1]) == b"x"
        for _ in range(200):
            if a._channel.ipc_ok is True:
                break
            await asyncio.sleep(0.01)
        assert a._channel.ipc_ok is True and stager.probes == 1 and stager.imports == 0
        sent, futures = [], []
        for n in (99999, 100000, 3 * 65536 + 7):
            big = rng.integers(0, 255, n, dtype=np.uint8)
            small = rng.integers(0, 255, 777, dtype=np.uint8)
            frames = a._channel.prepare([_FakeDevice(big.copy()), memoryview(small), _FakeDevice(small.copy()),
                                         _FakeDevice(big[::-1].copy())])
            ipc = FLAG_CUDA | FLAG_IPC
            want = [FLAG_CUDA, 0, FLAG_CUDA, FLAG_CUDA] if n < 100000 else [ipc, 0, FLAG_CUDA, ipc]
            assert frames.flags == want, (n, frames.flags)
            futures.append(a._channel.send(frames)[0])
            plain = np.arange(n % 991, dtype=np.int64)
            futures.append(a._channel.send(a._channel.prepare([memoryview(plain)]))[0])
            sent.append((big, small, plain))
        await asyncio.wait_for(asyncio.gather(*futures), 20)  # every IPC message was acked
        assert not a._channel._acks and stager.imports == 4 and stager.opened == 0
        for big, small, plain in sent:
            got = await b._channel.next_frames(repr)
            assert isinstance(got[0], _FakeDevice) and np.array_equal(got[0].arr, big)
            assert bytes(got[1]) == small.tobytes() and np.array_equal(got[2].arr, small)
            assert np.array_equal(got[3].arr, big[::-1])
            assert bytes((await b._channel.next_frames(repr))[0]) == plain.tobytes()
        # Both directions at once, each waiting for the other's ack.
        x, y = (rng.integers(0, 255, 200000, dtype=np.uint8) for _ in range(2))
        await asyncio.wait_for(asyncio.gather(a._channel.send(a._channel.prepare([_FakeDevice(x.copy())]))[0],
                                              b._channel.send(b._channel.prepare([_FakeDevice(y.copy())]))[0]), 20)
        assert np.array_equal((await b._channel.next_frames(repr))[0].arr, x)
        assert np.array_equal((await a._channel.next_frames(repr))[0].arr, y)
        # The peer has closed: it copies nothing more, so the message fails instead of waiting for ever.
        b.abort()
        with expect_raises(CommClosedError, "IPC message to a closed peer"):
            await asyncio.wait_for(a._channel.send(a._channel.prepare([_FakeDevice(x.copy())]))[0], 20)
        await asyncio.sleep(0.1)
        with expect_raises(CommClosedError, "IPC message after the peer's CLOSE arrived"):
            await asyncio.wait_for(a._channel.send(a._channel.prepare([_FakeDevice(x.copy())]))[0], 20)
        await a.close()
        # A peer that cannot open our memory answers no: every device frame is staged from then on.
        stager = _HostIPCStager(can_open=False)
        _staging.set_stager(stager)
        a, b = await comm_pair()
        for i in range(3):
            frames = a._channel.prepare([_FakeDevice(first.copy())])
            assert frames.flags == ([FLAG_CUDA, FLAG_IPC_PROBE] if i == 0 else [FLAG_CUDA]), frames.flags
            await asyncio.wait_for(a._channel.send(frames)[0], 20)
            got = await b._channel.next_frames(repr)
            assert len(got) == 1 and np.array_equal(got[0].arr, first)
            for _ in range(200):
                if a._channel.ipc_ok is False:
                    break
                await asyncio.sleep(0.01)
        assert a._channel.ipc_ok is False and stager.probes == 1 and stager.imports == 0
        await a.close()
        await b.close()
    finally:
        os.environ.pop("MPIML_DASK_IPC_BYTES", None)
        _staging.set_stager(None)


@check
async def staged_device_frames():
    # Device frames through pinned slots in chunks (the chunk is 64 KiB in the tests), posted
    # by a task while host-only messages queued behind them keep their order; slots reused.
    from mpiml.dask import _staging
    from mpiml.dask._frames import FLAG_CUDA, SendFrames

    _staging.set_stager(_HostStager())
    try:
        a, b = await comm_pair()
        rng = np.random.default_rng(3)
        sizes = [1, 65536, 65537, 5 * 65536 + 11, 2**20]

        async def one_round():
            sent, futures = [], []
            for n in sizes:
                dev = rng.integers(0, 255, n, dtype=np.uint8)
                host = rng.integers(0, 255, 1000, dtype=np.uint8)
                msg = [memoryview(host), _FakeDevice(dev.copy()), memoryview(b""), _FakeDevice(dev[::-1].copy())]
                frames = SendFrames(msg, cuda_aware=False)
                assert frames.staged and frames.flags == [0, FLAG_CUDA, 0, FLAG_CUDA]
                futures.append(a._channel.send(frames)[0])
                plain = np.arange(n % 997, dtype=np.int64)
                futures.append(a._channel.send(SendFrames([memoryview(plain)], cuda_aware=False))[0])
                sent.append((host, dev, plain))
            await asyncio.gather(*futures)
            for host, dev, plain in sent:
                got = await b._channel.next_frames(repr)
                assert bytes(got[0]) == host.tobytes() and len(got[2]) == 0
                assert isinstance(got[1], _FakeDevice) and np.array_equal(got[1].arr, dev)
                assert np.array_equal(got[3].arr, dev[::-1])
                assert bytes((await b._channel.next_frames(repr))[0]) == plain.tobytes()

        await one_round()
        first = _staging.pinned_cache().allocations
        await one_round()
        again = _staging.pinned_cache().allocations - first
        assert 0 < first <= 40 and again <= 4, (first, again)
        await a.close()
        await b.close()
    finally:
        _staging.set_stager(None)


@check
async def cupy_frames_staged():
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return "skipped: needs CuPy and a GPU"
    a, b = await comm_pair()
    x = cupy.arange(3 * 2**20 + 5, dtype=cupy.float32)
    small = cupy.ones((3, 4))
    await a.write({"x": to_serialize(x), "small": to_serialize(small)})
    got = await b.read()
    assert isinstance(got["x"], cupy.ndarray) and bool((got["x"] == x).all())
    assert isinstance(got["small"], cupy.ndarray) and bool((got["small"] == 1).all())
    await a.close()
    await b.close()


@check
async def abort_never_blocks():
    a, b = await comm_pair()
    # Peer writes a large message that nobody reads, then we abort: abort returns
    # at once, and the writer finishes (the aborted side drains) instead of hanging.
    big = np.ones(2**21)
    writing = asyncio.ensure_future(b.write({"x": to_serialize(big)}))
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    a.abort()
    assert time.perf_counter() - t0 < 0.05
    try:
        await asyncio.wait_for(writing, 10)
    except CommClosedError:
        pass
    with expect_raises(CommClosedError, "read after the peer aborted"):
        await asyncio.wait_for(b.read(), 10)
    # abort() from another thread (e.g. a finalizer) does not block either.
    c, d = await comm_pair()
    t = threading.Thread(target=c.abort)
    t.start()
    t.join(5)
    assert not t.is_alive()
    with expect_raises(CommClosedError, "read after a cross-thread abort"):
        await asyncio.wait_for(d.read(), 10)


@check
async def idle_does_not_spin():
    # A comm waiting for a message must not burn a CPU core.
    a, b = await comm_pair()
    reading = asyncio.ensure_future(b.read())
    await asyncio.sleep(0.2)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(1.0)
    busy = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    await a.write({"op": "wake"})
    assert await asyncio.wait_for(reading, 10) == {"op": "wake"}
    await a.close()
    await b.close()
    assert busy < 0.2, f"idle comm used {busy:.0%} of a core"


@check
async def separate_event_loops():
    # A listener in this loop, a client in another thread's loop (like a Client).
    async def handle(comm):
        msg = await comm.read()
        await comm.write(msg)
        await comm.close()

    async with listen("mpi://", handle) as listener:
        address = listener.contact_address

        async def client():
            comm = await connect(address)
            await comm.write({"x": 1})
            msg = await comm.read()
            await comm.close()
            return msg

        got = await asyncio.to_thread(asyncio.run, client())
    assert got == {"x": 1}


@check
async def entry_point():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="distributed.comm.backends") if ep.name == "mpi"]
    if not eps:
        return "skipped: mpiml is not installed, so its entry point is not registered"
    assert isinstance(eps[0].load()(), mpiml.dask.MPIBackend)


# -- cross-rank checks (listener on rank 0, connector on rank 1) -------------------------


def share(value):
    return WORLD.bcast(value, root=0)


async def barrier():
    """A barrier that keeps this rank's event loop turning while it waits."""
    req = WORLD.Ibarrier()
    while not req.Test():
        await asyncio.sleep(0.005)


@check
async def cross_cupy_ipc():
    # CuPy frames between two processes: large ones by CUDA IPC (views into CuPy's pool, two
    # frames of one allocation in one message, an offset view), small ones staged; echoed back.
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return "skipped: needs CuPy and a GPU"

    async def echo(comm):
        try:
            while True:
                await comm.write(await comm.read())
        except CommClosedError:
            pass

    if RANK == 0:
        async with listen("mpi://", echo) as listener:
            share(listener.contact_address)
            await barrier()
    else:
        comm = await connect(share(None))
        assert comm._channel.ipc_min is not None, "two ranks of one host: IPC expected"
        base = cupy.arange(6 * 2**20, dtype=cupy.float32)
        msgs = [{"whole": base}, {"view": base[12345:3 * 2**20 + 7], "again": base[: 2**19], "small": base[:10]},
                {"f64": cupy.random.default_rng(0).random((1500, 700)), "empty": cupy.empty(0)}]
        for _ in range(3):
            for msg in msgs:
                await comm.write({k: to_serialize(v) for k, v in msg.items()})
                got = await comm.read()
                for k, v in msg.items():
                    assert isinstance(got[k], cupy.ndarray) and got[k].shape == v.shape, k
                    assert bool((got[k] == v).all()), k
        assert not comm._channel._acks
        await comm.close()
        await barrier()


@check
async def cross_echo_many_clients():
    async def echo(comm):
        try:
            while True:
                msg = await comm.read()
                await comm.write(msg)
        except CommClosedError:
            pass

    if RANK == 0:
        async with listen("mpi://", echo) as listener:
            share(listener.contact_address)
            await barrier()  # rank 1 done
    else:
        address = share(None)
        rng = np.random.default_rng(1)

        async def client(key):
            comm = await connect(address)
            assert comm.peer_address == address
            assert get_address_host(comm.peer_address) == get_address_host(address)
            for i in range(3):
                x = rng.random(1000 * (key + 1) * (i + 1))
                await comm.write({"key": key, "x": to_serialize(x)})
                got = await comm.read()
                assert got["key"] == key and np.array_equal(got["x"], x)
            await comm.close()

        await asyncio.gather(*(client(k) for k in range(20)))
        await barrier()


@check
async def cross_close_both_ways():
    got = asyncio.Queue()

    async def handle(comm):
        msg = await comm.read()
        if msg == "close-me":
            await comm.close()
        else:
            try:
                await comm.read()
            except CommClosedError:
                got.put_nowait("closed")

    if RANK == 0:
        async with listen("mpi://", handle) as listener:
            share(listener.contact_address)
            assert await asyncio.wait_for(got.get(), 20) == "closed"
            await barrier()
    else:
        address = share(None)
        comm = await connect(address)
        await comm.write("close-me")
        with expect_raises(CommClosedError, "server closed"):
            await asyncio.wait_for(comm.read(), 20)
        comm = await connect(address)
        await comm.write("keep")
        await comm.close()
        await barrier()


@check
async def cross_refused_and_reverse():
    async def echo(comm):
        await comm.write(await comm.read())
        await comm.close()

    # Rank 1 listens, rank 0 connects (the other direction), and connecting to
    # an id nobody listens on is refused until the timeout.
    if RANK == 1:
        async with listen("mpi://", echo) as listener:
            WORLD.send(listener.contact_address, dest=0)
            await barrier()
    else:
        address = WORLD.recv(source=1)
        t0 = time.monotonic()
        with expect_raises(OSError, "nobody listens"):
            await connect("mpi://1:7", timeout=0.3)
        assert time.monotonic() - t0 < 2
        comm = await connect(address)
        await comm.write([1, 2, 3])
        assert list(await comm.read()) == [1, 2, 3]
        await comm.close()
        await barrier()


SINGLE = [n for n in CHECKS if not n.startswith("cross_")]
CROSS = [n for n in CHECKS if n.startswith("cross_")]


async def run_one(name):
    # A cross-rank check that fails on one rank leaves the other waiting in a
    # barrier: keep that wait short.
    timeout = CHECK_TIMEOUT / 3 if name.startswith("cross_") else CHECK_TIMEOUT
    try:
        note = await asyncio.wait_for(CHECKS[name](), timeout)
        return note if isinstance(note, str) else "ok"
    except BaseException:
        return traceback.format_exc()


def main():
    out_path = sys.argv[1]
    names = sys.argv[2:] or (SINGLE if WORLD.Get_size() == 1 else CROSS)
    mpiml.dask.initialize()
    results = {}
    for name in names:
        results[name] = asyncio.run(run_one(name))
    gathered = WORLD.gather(results, root=0)
    if RANK == 0:
        merged = {}
        for name in names:
            failures = [f"rank {rank}: {res[name]}" for rank, res in enumerate(gathered)
                        if res[name] != "ok" and not res[name].startswith("skipped")]
            merged[name] = "\n".join(failures) if failures else gathered[0][name]
        with open(out_path, "w") as f:
            json.dump(merged, f, indent=1)
    mpiml.dask.finalize()


if __name__ == "__main__":
    main()
