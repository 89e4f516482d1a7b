"""Arrays in node memory that every rank of one node reads and writes: MPI shared-memory windows.

Used by the CPU paths that let the threads of all the ranks of a node share one piece of work (the k-NN
search of :mod:`mpiml.neighbors._node`, the Lloyd step of :mod:`mpiml.cluster._kmeans_node`).  Each array is
one window of which every rank allocates its own part (its rows): a window's memory is first touched, and
on some MPIs cleared, by the rank that allocates it, so a rank's rows live in its NUMA node.
"""

import ctypes

import numpy as np

import os

__all__ = ["node_arrays", "free", "sync", "room_for", "NodeBarrier"]


def room_for(nbytes):
    """Whether ``nbytes`` of shared memory fit in what ``/dev/shm`` has free, with a quarter to spare (True where
    it cannot be read).  A shared window lives in a memory file system (``/dev/shm``, or the MPI's session
    directory); one too small for it fails at the first touch of a page beyond its room (SIGBUS, no exception),
    and containers often give ``/dev/shm`` 64 MiB.  Local: callers agree on the answer across the ranks."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return True
    return st.f_bavail * st.f_frsize >= 1.25 * nbytes


def _spanning(win, sizes):
    """The bytes of every rank's part of ``win`` as one array (this process's mapping), or None where the parts
    do not follow each other in rank order (MPI's default for shared windows; an implementation may pad)."""
    total = int(sum(sizes))
    addrs = [win.Shared_query(j)[0].address for j in range(len(sizes))]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    first = next((a - int(s) for a, s, n in zip(addrs, starts, sizes) if n), None)
    if first is None:
        return np.zeros(0, dtype=np.uint8)
    if any(n and a != first + int(s) for a, s, n in zip(addrs, starts, sizes)):
        return None
    return np.frombuffer((ctypes.c_char * total).from_address(first), dtype=np.uint8)


def node_arrays(MPI, raw, parts, rank):
    """``(windows, memory)``: per name of ``parts`` (name -> bytes of every rank's part, in rank order) a window
    over ``raw``'s ranks and its bytes as one uint8 array (None where MPI did not lay the parts out in order).
    Collective over ``raw``."""
    wins, mem = {}, {}
    for name, sizes in parts.items():
        wins[name] = MPI.Win.Allocate_shared(int(sizes[rank]), 1, comm=raw)
    for name, sizes in parts.items():
        mem[name] = _spanning(wins[name], sizes)
    return wins, mem


def sync(wins):
    """Every window's memory synchronised with the other processes' view (before and after a barrier)."""
    for w in wins.values():
        w.Sync()


def free(wins, mem):
    """Free the windows (collective); the arrays over their memory are dropped first."""
    mem.clear()
    for w in wins.values():
        w.Free()


class NodeBarrier:
    """A barrier of the ranks of one node on a counter in node memory (an int64 ``slot`` of one element that every
    rank maps, zero before any rank arrives): each rank adds one atomically and waits until the counter reaches its
    ranks times the barriers passed; the last to arrive wakes the others.

    An MPI barrier completes only through the progress of every rank: where ranks outnumber the cores, each
    round of its messages waits for a rank that is asleep in its wait or off its core (a barrier of 4 ranks on
    2 cores cost 0.3-0.5 ms, the k-means step of the 2-core VM 3 ms).  Here the last rank to arrive completes
    it.  A waiting rank spins as this rank's waits do (:func:`mpiml.comm._request.set_default_spin`: not at all
    where ranks outnumber cores) and then sleeps in the kernel on the counter (a Linux futex, woken by the last
    arrival), not in naps: a rank that wakes every 20-70 us to poll takes the core of a rank that computes at
    every wake-up (the k-means steps of 2 ranks' threads ran 50 % slower beside 2 ranks polling so on the 2-core
    VM).  Elsewhere it polls as :func:`~mpiml.comm._request.poll_until` does.  ``MPIML_TIMEOUT`` is honoured.
    ``wins``: the windows whose memory the barrier orders (synchronised before the arrival and after the
    wait)."""

    def __init__(self, slot, size, wins):
        self.slot, self.size, self.wins, self.passed = slot, int(size), wins, 0

    def wait(self, idle=False):
        """Arrive and wait for every rank.  ``idle``: this rank has no share of the work the barrier waits for (a
        rank beyond the node's cores): it sleeps at once, without a spin."""
        from ._threads_jit import add_one

        sync(self.wins)
        before = int(add_one(self.slot))
        self.passed += 1
        target = self.size * self.passed
        if before + 1 >= target:              # the last to arrive: wake the others
            if _FUTEX and self.size > 1:
                _FUTEX[1](self.slot.ctypes.data)
        else:
            _wait_for(self.slot, target, idle)
        sync(self.wins)


def _wait_for(slot, target, idle):
    import time

    from .. import _config
    from .._errors import CommTimeoutError
    from ..comm import _request

    if not _FUTEX:
        _request.poll_until(lambda: int(slot[0]) >= target, op="node barrier", peer="all")
        return
    start = time.perf_counter()
    if not idle:
        spin_end, yield_core = start + _request._spin_seconds(), os.sched_yield
        while time.perf_counter() < spin_end:
            if int(slot[0]) >= target:
                return
            yield_core()
    limit = _config.timeout()
    wait, addr = _FUTEX[0], slot.ctypes.data
    while True:
        seen = int(slot[0])
        if seen >= target:
            return
        if limit is not None and time.perf_counter() - start > limit:
            raise CommTimeoutError("node barrier", "all", limit, f"{seen % max(1, target)} arrived")
        wait(addr, seen, _FUTEX_SLICE)     # returns at once if the counter moved since it was read


#: Longest sleep in the kernel before the counter and the timeout are read again
_FUTEX_SLICE = 0.05


def _futex_calls():
    """``(wait(address, seen, seconds), wake(address))`` on a 32-bit word of a mapping shared between processes
    (the low half of a little-endian int64 counter), or ``()`` where there is no futex (not Linux x86-64 /
    AArch64, or ``MPIML_NODE_FUTEX=0``)."""
    import platform
    import sys

    number = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
    if number is None or not sys.platform.startswith("linux") or sys.byteorder != "little" or \
            os.environ.get("MPIML_NODE_FUTEX", "1") == "0":
        return ()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return ()
    syscall.restype = ctypes.c_long

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    def wait(addr, seen, seconds):
        ts = Timespec(int(seconds), int((seconds % 1) * 1e9))
        word = ctypes.c_int(ctypes.c_uint32(seen & 0xFFFFFFFF).value if seen >= 0 else 0)
        syscall(ctypes.c_long(number), ctypes.c_void_p(addr), ctypes.c_int(0), word, ctypes.byref(ts),
                ctypes.c_void_p(0), ctypes.c_int(0))      # FUTEX_WAIT (shared between processes)

    def wake(addr):
        syscall(ctypes.c_long(number), ctypes.c_void_p(addr), ctypes.c_int(1), ctypes.c_int(0x7FFFFFFF),
                ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int(0))   # FUTEX_WAKE, every waiter

    return wait, wake


_FUTEX = _futex_calls()
