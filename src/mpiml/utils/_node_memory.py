"""Arrays in node memory that every rank of one node reads and writes: MPI shared-memory windows.

Used by the CPU paths that let the threads of all the ranks of a node share one piece of work (the k-NN
search of :mod:`mpiml.neighbors._node`, the Lloyd step of :mod:`mpiml.cluster._kmeans_node`).  Each array is
one window of which every rank allocates its own part (its rows): a window's memory is first touched, and
on some MPIs cleared, by the rank that allocates it, so a rank's rows live in its NUMA node.
"""

import ctypes

import numpy as np

import os

__all__ = ["node_arrays", "free", "sync", "room_for", "NodeBarrier", "node_barrier", "node_sum", "node_pids"]


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
    wait).  ``pids``: the node's ranks' process ids in rank order (:func:`node_pids`), or None: a wait that
    lasts looks four times a second whether they all still run, so that a rank that died is found within a second
    (an MPI launcher that cleans up kills the others; one that does not left them asleep here until
    ``MPIML_TIMEOUT``)."""

    def __init__(self, slot, size, wins, pids=None):
        self.slot, self.size, self.wins, self.passed = slot, int(size), wins, 0
        self.pids = pids

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
            _wait_for(self.slot, target, idle, self.pids)
        sync(self.wins)


def node_pids(raw):
    """``(process id, start time)`` of ``raw``'s ranks in rank order (collective), for the liveness check of the
    waits (the start time, as :mod:`mpiml.comm._liveness` takes it, tells a reused pid from the rank's)."""
    from ..comm._liveness import local_identity

    return [tuple(int(v) for v in p) for p in raw.allgather(local_identity()[1:])]


#: How often a wait in node memory that lasts looks whether the node's ranks still run (seconds; a look at 4 ranks
#: costs about 0.1 ms)
_LIVENESS_EVERY = 0.25


def _exited(pids):
    """``(rank, pid)`` of the first of ``pids`` (pids, or ``(pid, start time)`` pairs: :func:`node_pids`) whose
    process has exited (gone, a zombie, or its pid taken by another process), else None: the communicator's own
    check (:func:`mpiml.comm._liveness.process_alive`)."""
    from ..comm._liveness import process_alive

    for rank, p in enumerate(pids):
        pid, start = p if isinstance(p, tuple) else (p, 0)
        if not process_alive(pid, start):
            return rank, pid
    return None


def _wait_for(slot, target, idle, pids=None, op="node barrier"):
    import time

    from .. import _config
    from .._errors import CommError, CommTimeoutError
    from ..comm import _request

    if not _FUTEX:
        _request.poll_until(lambda: int(slot[0]) >= target, op=op, peer="all")
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
    look = start + _LIVENESS_EVERY
    while True:
        seen = int(slot[0])
        if seen >= target:
            return
        now = time.perf_counter()
        if limit is not None and now - start > limit:
            raise CommTimeoutError(op, "all", limit, f"{seen % max(1, target)} arrived")
        if pids and now >= look:
            look = now + _LIVENESS_EVERY
            gone = _exited(pids)
            if gone is not None:
                raise CommError(f"{op}: rank {gone[0]} of this node (pid {gone[1]}) has exited while this rank "
                                f"waited for it")
        wait(addr, seen, _FUTEX_SLICE)     # returns at once if the counter moved since it was read


#: id of an mpi4py communicator -> (the communicator, its window, its barrier): see node_barrier
_KEPT_BARRIERS = {}


def node_barrier(raw):
    """A :class:`NodeBarrier` of ``raw``'s ranks (all on one node) on a window of 64 bytes kept with the
    communicator, for a wait in which some ranks have nothing to do: they sleep in the kernel until the last rank
    arrives, where in an MPI collective they would wake every 20-200 us to poll (taking a core from a rank that
    computes at each wake-up).  Made the first time per communicator (collective).  ``wait(idle)`` as
    :meth:`NodeBarrier.wait`; every rank calls it in the same order, as a collective."""
    known = _KEPT_BARRIERS.get(id(raw))
    if known is None or known[0] is not raw:
        from ..comm.backends.mpi import mpi_module

        MPI = mpi_module()
        win = MPI.Win.Allocate_shared(64 if raw.Get_rank() == 0 else 0, 1, comm=raw)
        slot = np.frombuffer((ctypes.c_char * 64).from_address(win.Shared_query(0)[0].address),
                             dtype=np.int64)[:1]
        win.Lock_all(MPI.MODE_NOCHECK)
        if raw.Get_rank() == 0:
            slot[0] = 0
        win.Sync()
        win.Unlock_all()
        pids = node_pids(raw)          # (a collective: also every rank's zero seen before any use)
        known = _KEPT_BARRIERS[id(raw)] = (raw, win, _EpochBarrier(slot, raw.Get_size(), {"w": win}, MPI, pids))
    return known[2]


class _EpochBarrier(NodeBarrier):
    """A :class:`NodeBarrier` whose window is in a passive epoch only while a rank waits (kept between uses)."""

    def __init__(self, slot, size, wins, MPI, pids=None):
        super().__init__(slot, size, wins, pids)
        self.nocheck = MPI.MODE_NOCHECK

    def wait(self, idle=False):
        for w in self.wins.values():
            w.Lock_all(self.nocheck)
        try:
            super().wait(idle)
        finally:
            for w in self.wins.values():
                w.Unlock_all()


#: id of an mpi4py communicator -> [the communicator, windows, memory, capacity, barrier, calls] (see node_sum), or
#: [the communicator, None]: no shared windows there
_SUMS = {}


def sum_over_ranks(comm, x, **allreduce_args):
    """``comm.allreduce(x, **allreduce_args)``, but a host float64 array through node memory where ranks outnumber
    the node's cores (:func:`node_sum`; its result in ``x``'s shape).  Collective."""
    if isinstance(x, np.ndarray) and x.dtype == np.float64:
        out = node_sum(comm, x)
        if out is not None:
            return out.reshape(x.shape)
    return comm.allreduce(x, **allreduce_args)


def node_sum(comm, x):
    """The sum over ``comm``'s ranks of the host float64 vector ``x`` through node memory, the same bits on every rank
    (the ranks' vectors added in rank order), or None where it does not apply: ranks on several nodes, one rank, or
    no more ranks than the node has cores (:func:`mpiml.utils._threads.node_workers`: there an MPI collective, whose
    waits spin, costs 20 us).  Collective; every rank takes the same path.

    Where ranks outnumber the cores, a collective of point-to-point rounds (a binomial reduce and broadcast, four
    rounds at 4 ranks) waits at each round for a rank to be scheduled and to poll, and the waiting ranks nap
    between polls: 0.5-1 ms a call at 4 ranks on 2 cores, a LogisticRegression fit making twenty of them.  Here
    every rank writes its vector into its slot of a window kept with the communicator (two sets, used in turn by
    consecutive calls, so one barrier a call), waits on a :class:`NodeBarrier` (the last to arrive wakes the
    others) and adds the slots."""
    from ._threads import node_workers, one_node_comm

    raw = one_node_comm(comm)
    if raw is None or node_workers(comm, raw) >= comm.size:
        return None
    x = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    n, size, rank = x.size, comm.size, comm.rank
    state = _SUMS.get(id(raw))
    if state is not None and state[0] is not raw:
        state = None
    if state is not None and state[1] is None:
        return None
    if state is None or state[3] < n:
        from ..comm.backends.mpi import mpi_module

        MPI = mpi_module()
        if state is not None:
            free(state[1], state[2])
        capacity = max(64, 1 << int(n - 1).bit_length())
        try:
            wins, mem = node_arrays(MPI, raw, {"vec": [2 * capacity * 8] * size, "slot": [64] + [0] * (size - 1)},
                                    rank)
            failed = any(m is None for m in mem.values())
        except Exception:   # no shared windows with this MPI (agreed below)
            wins, mem, failed = {}, {}, True
        if comm.allreduce_obj(bool(failed), op="max"):
            if wins:
                free(wins, mem)
            _SUMS[id(raw)] = [raw, None]
            return None
        slot = mem["slot"].view(np.int64)[:1]
        for w in wins.values():
            w.Lock_all(MPI.MODE_NOCHECK)
        if rank == 0:
            slot[0] = 0
        sync(wins)
        for w in wins.values():
            w.Unlock_all()
        pids = node_pids(raw)          # (a collective: also rank 0's zero seen before any use)
        state = _SUMS[id(raw)] = [raw, wins, mem, capacity, NodeBarrier(slot, size, wins, pids), 0]
    import time

    from ..comm import _profile

    start = time.perf_counter()
    raw, wins, mem, capacity, barrier, calls = state
    state[5] += 1
    vec = mem["vec"].view(np.float64).reshape(size, 2, capacity)[:, calls % 2, :n]
    nocheck = _nocheck()
    for w in wins.values():
        w.Lock_all(nocheck)
    try:
        vec[rank] = x
        barrier.wait()       # (the other set's last readers have all arrived here: it is free for the next call)
        out = vec[0].copy()
        for j in range(1, size):
            out += vec[j]
    finally:
        for w in wins.values():
            w.Unlock_all()
    if _profile.active():     # an allreduce of the communicator's in its profile (its route: node memory)
        _profile.record("allreduce", x.nbytes, "node", "node_sum", time.perf_counter() - start)
    return out


def _nocheck():
    from ..comm.backends.mpi import mpi_module

    return mpi_module().MODE_NOCHECK


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
