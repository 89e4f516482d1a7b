"""Finding a dead peer by its process (mpiml.comm._liveness), without MPI."""

import subprocess
import sys
import time

from mpiml.comm import _liveness
from mpiml.comm._liveness import Liveness, _stat, local_identity, process_alive


def _identity_of(proc):
    host = local_identity()[0]
    return host, proc.pid, _stat(proc.pid)[1]


def test_a_killed_process_is_dead_a_stopped_one_is_not(monkeypatch):
    monkeypatch.setattr(_liveness, "INTERVAL", 0.0)
    me = local_identity()
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = Liveness(0, [me, _identity_of(peer), ("elsewhere/boot", 1, 1), (me[0], 2**22 + 7, 99)])
        assert [r for r, _, _ in live.watched] == [1]  # another host, an invisible pid: not watched
        peer.send_signal(19)  # SIGSTOP: alive, only slow
        assert live.look() is None and live.look() is None
        peer.send_signal(18)
        peer.kill()
        peer.wait()  # reaped: gone
        assert live.look() is None  # first seen gone: one more look
        assert live.look() == (1, peer.pid) and live.dead == (1, peer.pid)
        assert "rank 1 is dead" in live.describe(live.dead)
    finally:
        if peer.poll() is None:
            peer.kill()


def test_a_zombie_or_a_reused_pid_is_dead():
    peer = subprocess.Popen([sys.executable, "-c", "pass"])
    ident = _identity_of(peer)
    deadline = time.monotonic() + 30
    while _stat(peer.pid)[0] != "Z" and time.monotonic() < deadline:  # exited, not reaped yet
        time.sleep(0.01)
    assert not process_alive(ident[1], ident[2])
    peer.wait()
    assert not process_alive(ident[1], ident[2])
    me = local_identity()
    assert process_alive(me[1], me[2]) and not process_alive(me[1], me[2] + 1)  # another start: another process
