"""The aborted-communicator state and the device watchdog's logic, without a GPU."""

import numpy as np
import pytest

from mpiml import CommAbortedError, CommError, CommTimeoutError
from mpiml.comm import Communicator
from mpiml.comm.backends import _watchdog
from mpiml.comm.backends.self import SelfTransport


class FakeDeviceTransport:
    """Stands for an ipc/nccl transport: reports a failure once told to, records aborts."""

    def __init__(self):
        self.failure = None
        self.aborted = None

    def poll_failure(self):
        return self.failure

    def abort(self, why):
        self.aborted = why

    def close(self):
        pass


def _comm():
    return Communicator(SelfTransport())


def test_poison_makes_every_call_raise_and_names_the_first_failure():
    comm = _comm()
    x = np.arange(4.0)
    np.testing.assert_array_equal(comm.allreduce(x), x)  # also primes the fast path
    first = CommTimeoutError("allreduce", 3, 2.0)
    comm._poison(first)
    comm._poison(CommError("a later failure"))  # the first one is kept
    for call in (lambda: comm.allreduce(x), lambda: comm.bcast(x), lambda: comm.reduce(x),
                 lambda: comm.allgather(x), comm.barrier, comm.synchronize):
        with pytest.raises(CommAbortedError, match="allreduce timed out") as info:
            call()
        assert info.value.__cause__ is first


def test_poison_reaches_split_communicators_and_aborts_device_transports():
    comm = _comm()
    child = comm.split(0)
    dev = FakeDeviceTransport()
    comm._device_transports["fake"] = dev
    comm._poison(CommError("boom"))
    assert dev.aborted is not None and "boom" in dev.aborted
    with pytest.raises(CommAbortedError):
        child.allreduce(np.ones(2))
    with pytest.raises(CommAbortedError, match="boom"):  # a dead communicator makes no new ones:
        comm.split(0)  # the split is collective, and the other ranks may never join it
    comm._device_transports.clear()


def test_watchdog_poisons_a_communicator_whose_transport_failed():
    comm = _comm()
    dev = FakeDeviceTransport()
    comm._device_transports["fake"] = dev
    _watchdog.watch(comm)
    _watchdog.check_now()
    assert comm._failure is None
    dev.failure = CommTimeoutError("bcast", 1, 3.0)
    _watchdog.check_now()
    assert comm._failure is dev.failure
    with pytest.raises(CommAbortedError, match="bcast"):
        comm.bcast(np.ones(2))
    comm._device_transports.clear()


def test_watchdog_thread_finds_failures_by_itself(monkeypatch):
    import time

    comm = _comm()
    dev = FakeDeviceTransport()
    comm._device_transports["fake"] = dev
    _watchdog.watch(comm)
    dev.failure = CommError("peer gone")
    deadline = time.monotonic() + 5
    while comm._failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert comm._failure is dev.failure
    comm._device_transports.clear()


def test_device_sync_defaults_to_stream_ordered(monkeypatch):
    from mpiml.comm.backends._stream import device_sync

    monkeypatch.delenv("MPIML_DEVICE_SYNC", raising=False)
    assert device_sync() is False
    monkeypatch.setenv("MPIML_DEVICE_SYNC", "1")
    assert device_sync() is True
    monkeypatch.setenv("MPIML_DEVICE_SYNC", "maybe")
    with pytest.raises(ValueError, match="MPIML_DEVICE_SYNC"):
        device_sync()


def test_hot_path_reads_mpiml_check_as_it_changes(monkeypatch):
    from mpiml import _config
    from mpiml.comm import _hotpath

    for raw, want in (("", None), ("0", 0), ("1", 1), ("off", 0), ("", None)):
        if raw:
            monkeypatch.setenv("MPIML_CHECK", raw)
        else:
            monkeypatch.delenv("MPIML_CHECK", raising=False)
        assert _hotpath.check_level() == want == _config.check_level()
    monkeypatch.setenv("MPIML_CHECK", "sometimes")
    with pytest.raises(ValueError, match="MPIML_CHECK"):
        _hotpath.check_level()


def test_arg_block_packs_five_words():
    import ctypes

    from mpiml.comm._hotpath import ArgBlock

    b = ArgBlock(0x1000, 77, 3)
    b.words[1], b.words[2] = 11, 22
    ptrs = [b.argv[i] for i in range(5)]
    assert [ctypes.c_uint64.from_address(p).value for p in ptrs] == [0x1000, 11, 22, 77, 3]


def test_watchdog_finds_the_completed_prefix_with_few_queries():
    from mpiml.comm.backends.nccl import _completed_prefix

    for n in (0, 1, 2, 7, 1000):
        for k in range(0, n + 1, max(1, n // 7)):
            entries = [(0.0, i, "allreduce") for i in range(n)]
            queries = []

            def done(ev):
                queries.append(ev)
                return ev < k

            assert _completed_prefix(entries, done) == k
            assert len(queries) <= 2 + max(1, n).bit_length()


def test_an_error_on_a_remembered_device_path_poisons_the_communicator():
    """MPIML_DEVICE_SYNC=1: a repeated call that times out is the first error; later calls are aborted."""
    comm = _comm()
    x = np.ones(3)
    first = CommTimeoutError("allreduce", 2, 3.0)

    def replay(*args):
        raise first

    from mpiml.comm._communicator import _Plan

    key = ("allreduce", np.ndarray, x.dtype, x.shape, "sum", None)
    class DeviceNamespace:  # stands for cupy: a plan whose arrays live on a device
        empty_like = staticmethod(np.empty_like)

    comm._plans[key] = _Plan(replay, DeviceNamespace, 0, ("allreduce", x.dtype, 3, 0, "sum", (3,), "device", None),
                             None, True)
    with pytest.raises(CommTimeoutError):
        comm.allreduce(x)
    assert comm._failure is first
    with pytest.raises(CommAbortedError):
        comm.allreduce(x)


def test_ipc_transport_reports_and_aborts_its_helper_transports():
    """Ops that the ipc backend hands to NCCL (gather, alltoall, ...) are watched through it."""
    from mpiml.comm.backends.ipc import IPCTransport

    t = object.__new__(IPCTransport)  # no GPU here: only the watchdog hooks are exercised
    t._err_host, t._broken, t._two_level_parts = None, None, None
    t._fallback = helper = FakeDeviceTransport()
    assert t.poll_failure() is None
    helper.failure = CommTimeoutError("gather", "all", 3.0)
    assert t.poll_failure() is helper.failure
    t.abort("peer gone")
    assert helper.aborted == "peer gone" and t._broken == "peer gone"


def test_nccl_calls_of_a_burst_share_one_event_and_a_stuck_call_still_times_out():
    """NCCLTransport.track: one event per stream per millisecond of calls, none created while free ones
    remain, recycled by the watchdog's look; the entry of a call that never completes still ages out."""
    import threading

    from mpiml.comm.backends.nccl import NCCLTransport

    class Runtime:  # stands for cupy.cuda.runtime: events are ints, "recorded" maps an event to its stream
        def __init__(self):
            self.made, self.recorded, self.completed = 0, {}, set()

        def eventCreateWithFlags(self, flags):
            self.made += 1
            return 100 + self.made

        def eventRecord(self, ev, s):
            self.recorded[ev] = s
            self.completed.discard(ev)

    class Cupy:
        class cuda:
            runtime = None

    rt = Runtime()
    Cupy.cuda.runtime = rt
    t = object.__new__(NCCLTransport)  # no GPU here: only the tracking and the watchdog's look
    t.rank, t.comm, t._broken, t._timeout = 0, None, None, 5.0
    t._cupy, t._runtime, t._lock = Cupy, rt, threading.Lock()
    t._inflight, t._free_events, t._coalesce = [], [rt.eventCreateWithFlags(2) for _ in range(2)], 1e-3

    class Comm:
        def check_async_error(self):
            pass

    t.comm = Comm()
    import mpiml.comm.backends.nccl as nccl_mod

    real_done = nccl_mod._event_done
    nccl_mod._event_done = lambda cupy, ev: ev in rt.completed
    try:
        for _ in range(500):  # one burst on one stream: one entry, one event
            t.track("bcast", 7)
        assert len(t._inflight) == 1 and rt.made == 2
        t.track("allreduce", 8)  # another stream: its own entry, from the free ones
        assert len(t._inflight) == 2 and rt.made == 2
        t._inflight[0][0] -= 1.0  # the first burst is old: a call on its stream starts a new entry
        t.track("reduce", 7)
        assert len(t._inflight) == 3 and rt.made == 3  # no free event left: one made
        assert t.poll_failure() is None  # nothing completed, nothing late
        rt.completed.update(e[1] for e in t._inflight[:2])
        assert t.poll_failure() is None and len(t._inflight) == 1 and len(t._free_events) == 2
        t._inflight[0][0] -= 10.0  # the remaining call never completes: older than MPIML_TIMEOUT
        exc = t.poll_failure()
        assert isinstance(exc, CommTimeoutError) and "reduce" in str(exc)
    finally:
        nccl_mod._event_done = real_done
