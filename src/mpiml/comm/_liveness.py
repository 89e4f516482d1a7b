"""Whether the peers of a communicator are still alive, without waiting for a timeout.

A rank killed by a signal (``kill -9``, the OOM killer) while the launcher lets
the job go on leaves its peers waiting for messages that will never come: until
now only ``MPIML_TIMEOUT`` (default 600 s) ended that.  When a communicator is
made, its ranks exchange ``(host, process id, process start time)``; a rank
then looks at its peers on the same host (``/proc/<pid>/stat``, a few
microseconds each, at most every ``INTERVAL`` seconds) from the waits that
outlast their spin and from the device watchdog.  A peer whose process has
ended (gone, a zombie, or its pid reused by another process) is dead: the
communicator is aborted with :class:`~mpiml.CommAbortedError` naming the rank.

Why the process, not a heartbeat: a rank that is stopped (``SIGSTOP``), busy in
a long computation or slow to be scheduled is alive, and declaring it dead
would abort a healthy job; a heartbeat cannot tell those apart from death, the
process table can.  Such a rank is still found by ``MPIML_TIMEOUT``.  Peers on
other hosts are not watched (their launcher's daemon, or ``MPIML_TIMEOUT``,
ends the job).
"""

import os
import socket
import time

__all__ = ["Liveness", "local_identity", "process_alive", "INTERVAL"]

#: seconds between two looks at the peers' processes
INTERVAL = 0.2


def _host_id():
    """This host's name and boot id (two containers may share a hostname, not a boot id)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _stat(pid):
    """``(state, start time)`` of process ``pid`` from ``/proc``, or None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2:].split()  # after "pid (comm) "
    return fields[0].decode(), int(fields[19])


def local_identity():
    """``(host id, pid, start time)`` of this process (``start`` is 0 where /proc is absent)."""
    pid = os.getpid()
    st = _stat(pid)
    return _host_id(), pid, (st[1] if st else 0)


def process_alive(pid, start):
    """Whether process ``pid`` (started at ``start``, 0: unknown) still runs; True where /proc cannot tell."""
    if not os.path.isdir("/proc/self"):
        return True
    st = _stat(pid)
    if st is None:
        return False
    state, started = st
    return state not in ("Z", "X", "x") and (not start or started == start)


class Liveness:
    """The peers of one communicator that this rank can watch, and when it last looked.

    Parameters
    ----------
    rank : int
        This rank.
    identities : list of tuple
        Every rank's :func:`local_identity`, in rank order (agreed by an allgather).
    """

    def __init__(self, rank, identities):
        mine = identities[rank][0]
        self.watched = [(r, pid, start) for r, (host, pid, start) in enumerate(identities)
                        if r != rank and host == mine]
        self._next = 0.0
        self.dead = None  # (rank, pid) of the first peer found dead

    def look(self):
        """``(rank, pid)`` of a peer whose process has ended, or None (looks at most every INTERVAL s)."""
        if self.dead is not None or not self.watched:
            return self.dead
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + INTERVAL
        for r, pid, start in self.watched:
            if not process_alive(pid, start):
                self.dead = (r, pid)
                return self.dead
        return None

    @staticmethod
    def describe(dead):
        rank, pid = dead
        return f"rank {rank} is dead: its process ({pid} on this host) ended"
