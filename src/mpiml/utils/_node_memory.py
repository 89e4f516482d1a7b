"""Arrays in node memory that every rank of one node reads and writes: MPI shared-memory windows.

Used by the CPU paths that let the threads of all the ranks of a node share one piece of work (the k-NN
search of :mod:`mpiml.neighbors._node`, the Lloyd step of :mod:`mpiml.cluster._kmeans_node`).  Each array is
one window of which every rank allocates its own part (its rows): a window's memory is first touched, and
on some MPIs cleared, by the rank that allocates it, so a rank's rows live in its NUMA node.
"""

import ctypes

import numpy as np

import os

__all__ = ["node_arrays", "free", "sync", "room_for"]


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
