"""The end of a process that used device transports is bounded (mpiml.comm._exit).

On 2 x H200, ``benchmarks/gpu/vs_nccl.py --ops reduce_scatter`` with the 2-rank rules of the H200 table measured
every row and then never exited: its two NCCL communicators per rank (the benchmark's raw CuPy one and mpiml's)
were left to Python's teardown, whose order is each process's own, and NCCL's destroy is a rendezvous of the ranks.

CPU: a model of that end (``rs_exit_sim.py``: two processes, two communicators whose destroy waits for the peer's,
destroyed in opposite orders by the "teardown") hangs without mpiml's ordered release and exits with it; a peer that
never comes ends in the exit bound, said; the pieces (bounded calls, the order, the abort of a communicator whose
calls are still in flight).  GPU (``-m gpu``): ``gpu_rs_exit.py`` replays the benchmark's reduce_scatter sequence
with those rules at 2 ranks and must exit within a bound.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from mpiml.comm import _exit
from mpiml.comm.backends.nccl import NCCLTransport

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _sim(tmp_path, mode, timeout, env=None):
    """Run rs_exit_sim.py as ranks 0 and 1; ``[(returncode or None if still running at timeout, out, err), ...]``
    and the seconds each took."""
    full = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), **(env or {}))
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "rs_exit_sim.py"), str(r), str(tmp_path), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
             for r in range(2)]
    start = time.monotonic()
    results, took = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, timeout - (time.monotonic() - start)))
            results.append((p.returncode, out, err))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            results.append((None, out, err))
        took.append(time.monotonic() - start)
    return results, took


def test_model_hangs_without_the_ordered_release(tmp_path):
    """The model of the cause: destroys in opposite orders wait for each other (no bound: for ever)."""
    results, _ = _sim(tmp_path, "plain", 6, {"MPIML_EXIT_TIMEOUT": "0"})
    for rc, out, err in results:
        assert rc is None, (rc, out, err)  # still waiting when killed
        assert "done" in out and "exited" not in out


def test_model_hang_ends_at_the_exit_bound(tmp_path):
    """Without the ordered release, the bound still ends the process, and says so (faulthandler's Timeout)."""
    results, took = _sim(tmp_path, "plain", 30, {"MPIML_EXIT_TIMEOUT": "3"})
    for (rc, out, err), t in zip(results, took):
        assert rc == 1, (rc, out, err)
        assert "Timeout" in err
        assert t < 20


def test_ordered_release_exits(tmp_path):
    """mpiml's hook destroys its communicator first on every rank: both ranks' teardowns then meet."""
    results, took = _sim(tmp_path, "fixed", 30, {"MPIML_EXIT_TIMEOUT": "20"})
    for (rc, out, err), t in zip(results, took):
        assert rc == 0, (rc, out, err)
        assert out.index("destroyed mpiml") < out.index("destroyed raw") < out.index("exited")
        assert "Timeout" not in err
        assert t < 15


def test_peer_that_never_comes_is_bounded_and_said(tmp_path):
    results, took = _sim(tmp_path, "stuck", 12, {"MPIML_EXIT_TIMEOUT": "4"})
    rc, out, err = results[0]
    assert rc == 1, (rc, out, err)
    assert "did not return within its bound" in err and "Timeout" in err
    assert took[0] < 11
    assert results[1][0] is None  # (the stuck rank, killed by the test)


# ---------------------------------------------------------------- the pieces
class _Fake:
    """A stand-in for CuPy's NcclCommunicator recording what was called."""

    def __init__(self, log, name, block=None):
        self.log, self.name, self.block = log, name, block

    def destroy(self):
        if self.block is not None:
            self.block.wait()
        self.log.append(("destroy", self.name))

    def abort(self):
        self.log.append(("abort", self.name))


def _transport(nc, inflight=()):
    t = NCCLTransport.__new__(NCCLTransport)
    t.rank, t.size, t.comm, t._broken = 0, 2, nc, None
    t._timeout = 30.0
    t._lock = threading.Lock()
    t._inflight, t._free_events = list(inflight), []
    return t


def test_bounded_call_returns_or_gives_up():
    assert _exit.bounded_call(lambda: None, time.monotonic() + 5, "quick")
    gate = threading.Event()
    t0 = time.monotonic()
    assert not _exit.bounded_call(gate.wait, time.monotonic() + 0.2, "stuck")
    assert time.monotonic() - t0 < 2
    gate.set()


def test_release_all_newest_first_and_once(capsys):
    log = []
    a, b = _transport(_Fake(log, "a")), _transport(_Fake(log, "b"))
    saved = list(_exit._REGISTRY)
    try:
        _exit._REGISTRY[:] = []
        for t in (a, b):
            _exit._REGISTRY.append(__import__("weakref").ref(t))
        assert _exit.release_all(time.monotonic() + 5) == 2
        assert log == [("destroy", "b"), ("destroy", "a")]
        _exit.release_all(time.monotonic() + 5)  # (released: nothing more)
        assert len(log) == 2
        assert a.comm is None and a._broken == "closed"
    finally:
        _exit._REGISTRY[:] = saved


def test_release_says_when_a_destroy_does_not_return():
    log, said, gate = [], [], threading.Event()
    t = _transport(_Fake(log, "x", block=gate))
    assert not t.release(time.monotonic() + 0.2, said.append)
    assert said and "did not return within its bound" in said[0]
    gate.set()


class _Runtime:
    """eventQuery of events that never complete (a peer that never came)."""

    @staticmethod
    def eventQuery(ev):
        return 600  # cudaErrorNotReady

    @staticmethod
    def eventDestroy(ev):
        pass


class _Cupy:
    class cuda:
        runtime = _Runtime


def test_release_aborts_when_calls_are_still_in_flight():
    log, said = [], []
    t = _transport(_Fake(log, "x"), inflight=[[time.monotonic(), 1, "allreduce", 0]])
    t._cupy, t._runtime = _Cupy, _Runtime
    t0 = time.monotonic()
    assert t.release(time.monotonic() + 0.3, said.append)
    assert time.monotonic() - t0 < 3
    assert log == [("abort", "x")]
    assert "aborting it instead of destroying it" in said[0]


def test_exit_timeout_follows_mpiml_timeout(monkeypatch):
    monkeypatch.delenv("MPIML_EXIT_TIMEOUT", raising=False)
    monkeypatch.setenv("MPIML_TIMEOUT", "10")
    assert _exit.exit_timeout() == 10
    monkeypatch.setenv("MPIML_EXIT_TIMEOUT", "3.5")
    assert _exit.exit_timeout() == 3.5
    monkeypatch.setenv("MPIML_EXIT_TIMEOUT", "0")
    assert _exit.exit_timeout() is None


def test_the_exit_stops_and_joins_the_watchdog(monkeypatch):
    """A daemon thread frozen by the teardown in the middle of a look would keep a communicator (and its NCCL
    communicator) for ever: the hook stops the watchdog's thread and waits until it has ended."""
    from mpiml.comm.backends import _watchdog

    class _Comm:
        _failure = None
        _device_transports = {}
        _liveness = None

    monkeypatch.setattr(_watchdog, "_STATE", {"thread": None, "stop": False})
    monkeypatch.setattr(_watchdog, "_COMMS", __import__("weakref").WeakSet())
    keep = _Comm()
    _watchdog.watch(keep)
    thread = _watchdog._STATE["thread"]
    assert thread.is_alive()
    _exit._stop_watchdog()
    assert not thread.is_alive() and _watchdog._STATE["stop"]


# ---------------------------------------------------------------- the GPU repro
@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.slow
def test_reduce_scatter_sequence_exits(mpi):
    """vs_nccl.py's reduce_scatter sequence (raw NCCL, auto, auto0; eager and graphs; the H200 table's 2-rank
    rules from an explicit MPIML_TUNING_FILE) at 2 ranks: the processes end within 30 s of their last statement."""
    cupy = pytest.importorskip("cupy")
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        gpus = 0
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, found {gpus}")
    start = time.time()
    proc = mpi(os.path.join(HERE, "gpu_rs_exit.py"), 2, timeout=240, env={"MPIML_TIMEOUT": "10"})
    end = time.time()
    done = [float(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith("rs_exit done at")]
    assert done, proc.stdout[-3000:]
    assert end - max(done) < 30, (end - max(done), proc.stderr[-3000:])
    assert end - start < 240
