"""Requests for nonblocking operations: wait with a timeout, or ``await`` them.

A :class:`Request` wraps a ``test()`` function that makes progress and reports
completion.  Waiting polls it: a spin of up to ``MPIML_SPIN_US`` microseconds
first (each turn yields the core, so ranks that share cores still progress),
then sleeps that back off to 200 us so a long wait does not burn a core (where
ranks outnumber the node's cores: no spin, 20 us naps for 2 ms first; see
:func:`set_default_spin`).  MPI's
nonblocking collectives only progress while they are polled: a rank asleep holds
up every round of a collective that needs it (a binomial allreduce of 8 ranks
has six rounds in a row), so the spin should outlast the usual skew between the
ranks' arrivals.  Without ``MPIML_SPIN_US`` the spin is :func:`set_default_spin`'s,
1 ms until :mod:`mpiml.utils._threads` sets 50 ms for a rank that has a core of
its own (its other threads are idle while it waits, so spinning costs nobody).
Every wait honours ``MPIML_TIMEOUT`` and raises :class:`~mpiml.CommTimeoutError`
naming the operation and the peer.

A *guard* (see :func:`set_guard`) is called between the tests of every wait of
this thread while it is installed: the communicator installs one that watches
the signature agreement of the collective in flight, so that a mismatched
collective (which under MPI may hang, truncate or return partial data) ends as
soon as the agreement shows the mismatch, not after the timeout.
"""

import os
import threading
import time

from .. import _config
from .._errors import CollectiveMismatchError, CommAbortedError, CommTimeoutError

__all__ = ["Request", "CompletedRequest", "waitall", "poll_until", "set_guard", "set_default_spin"]

_MAX_SLEEP = 2e-4
_SPIN = {}  # raw MPIML_SPIN_US -> seconds (read per wait: a dict hit, not a parse)
_DEFAULT_SPIN = [1e-3]  # seconds, when MPIML_SPIN_US is unset (see set_default_spin)
_NAP = [_MAX_SLEEP, 0.0]  # the longest nap of a wait after its spin, and how long naps stay at 20 us first
_local = threading.local()


def set_default_spin(seconds, nap=_MAX_SLEEP, short=0.0):
    """Spin ``seconds`` before sleeping in every wait while ``MPIML_SPIN_US`` is unset, then nap 20 us between
    polls for ``short`` seconds more, then naps doubling up to ``nap`` seconds.

    :func:`mpiml.utils._threads.limit_threads` sets 50 ms for a rank with at least one core of the
    node to itself (cores // ranks on the node >= 1); where ranks outnumber cores, no spin and 20 us naps for
    the first 2 ms (a spinning rank holds a core that a rank with work needs, a long nap holds up every round
    of a collective that passes through the napping rank, and 20 us naps for long cost 15 % of a core).
    """
    _DEFAULT_SPIN[0] = float(seconds)
    _NAP[:] = float(nap), float(short)


def _spin_seconds():
    raw = os.environ.get("MPIML_SPIN_US")
    if not raw:
        return _DEFAULT_SPIN[0]
    try:
        return _SPIN[raw]
    except KeyError:
        value = _SPIN[raw] = _config.env_number("MPIML_SPIN_US", 1000.0, kind=float, minimum=0,
                                                unit="microseconds") * 1e-6
        return value


def set_guard(guard, watch=None):
    """Install ``guard`` and ``watch`` (or None) for the waits of this thread; returns the pair replaced.

    ``guard()`` is called between the tests of every wait, ``watch()`` between
    those of a wait that outlasted its spin (a wait long enough to be worth a
    slower check); either raises to end the wait (a
    :class:`~mpiml.CollectiveMismatchError` or :class:`~mpiml.CommAbortedError`),
    and requests whose wait it ends are abandoned as after a timeout.  Restore
    the previous pair when done (``set_guard(*previous)``).
    """
    outer = getattr(_local, "guard", None), getattr(_local, "watch", None)
    _local.guard = guard
    _local.watch = watch
    return outer


def poll_until(test, *, op, peer, timeout=None, detail="", watch=None):
    """Call ``test()`` until it returns True; raise CommTimeoutError after ``timeout``.

    ``watch()`` (or the thread's, see :func:`set_guard`) is called between tests once the spin is over.
    """
    if test():
        return
    guard = getattr(_local, "guard", None)
    if watch is None:
        watch = getattr(_local, "watch", None)
    limit = _config.timeout() if timeout is None else timeout
    start = time.perf_counter()
    spin_end = start + _spin_seconds()
    yield_core = os.sched_yield
    while time.perf_counter() < spin_end:
        if test():
            return
        if guard is not None:
            guard()
        yield_core()
    deadline = None if limit is None else start + limit
    nap, short = _NAP
    sleep = min(20e-6, nap)
    short_end = time.perf_counter() + short
    while True:
        if test():
            return
        if guard is not None:
            guard()
        if watch is not None:
            watch()
        now = time.perf_counter()
        if deadline is not None and now >= deadline:
            raise CommTimeoutError(op, peer, limit, detail)
        time.sleep(sleep)
        if now >= short_end:
            sleep = min(sleep * 2, nap)


class Request:
    """A pending operation.

    Parameters
    ----------
    test : callable
        Makes progress; returns True once the operation is complete.
    op : str
        Operation name used in errors (``"recv"``, ``"allreduce"``, ...).
    peer : int or str
        The peer waited for, or ``"all"``.
    result : callable or object, default=None
        What :meth:`wait` returns; called with no argument if callable.
    cancel : callable, default=None
        Cancels the underlying operation when it timed out.
    on_timeout : callable, default=None
        Called with the :class:`~mpiml.CommTimeoutError` before it is raised (the
        communicator marks itself dead: the message may still arrive later).
    """

    def __init__(self, test, *, op, peer, result=None, cancel=None, on_timeout=None):
        self._test = test
        self._done = False
        self.op = op
        self.peer = peer
        self._result = result
        self._cancel = cancel
        self._on_timeout = on_timeout

    def test(self):
        """Make progress; True when complete."""
        if not self._done:
            self._done = bool(self._test())
        return self._done

    def _value(self):
        return self._result() if callable(self._result) else self._result

    def abandon(self, exc=None):
        """Give the operation up after a timeout (cancel a receive; keep buffers alive)."""
        if self._cancel is not None and not self._done:
            try:
                self._cancel()
            except Exception:  # the timeout is the error worth reporting
                pass
        if exc is not None and self._on_timeout is not None:
            self._on_timeout(exc)

    def wait(self, timeout=None):
        """Block until complete and return the result (the received array for irecv)."""
        try:
            poll_until(self.test, op=self.op, peer=self.peer, timeout=timeout)
        except CommTimeoutError as exc:
            self.abandon(exc)
            raise
        except (CollectiveMismatchError, CommAbortedError):  # a guard ended the wait: the peers may never match it
            self.abandon()
            raise
        return self._value()

    async def _await(self):
        import asyncio  # only for await (its import costs more than the rest of mpiml.comm)

        limit = _config.timeout()
        start = time.perf_counter()
        sleep = 0.0
        while not self.test():
            if limit is not None and time.perf_counter() - start > limit:
                exc = CommTimeoutError(self.op, self.peer, limit)
                self.abandon(exc)
                raise exc
            await asyncio.sleep(sleep)
            sleep = min(max(sleep * 2, 20e-6), _MAX_SLEEP)
        return self._value()

    def __await__(self):
        return self._await().__await__()


class CompletedRequest(Request):
    """A request that is already complete (size-1 communicators, zero-length messages)."""

    def __init__(self, result=None, *, op="", peer=""):
        super().__init__(lambda: True, op=op, peer=peer, result=result)
        self._done = True


def waitall(requests, *, op=None, timeout=None):
    """Wait for every request; the error names the first peer still outstanding."""
    pending = [r for r in requests if r is not None]

    def test():
        nonlocal pending
        pending = [r for r in pending if not r.test()]
        return not pending

    if test():
        return
    try:
        poll_until(test, op=op or pending[0].op, peer="all", timeout=timeout,
                   detail="outstanding: " + ", ".join(f"{r.op} with rank {r.peer}" for r in pending[:4]))
    except CommTimeoutError as exc:
        if pending:
            exc.peer = pending[0].peer
        for r in pending:
            r.abandon(exc)
        raise
    except (CollectiveMismatchError, CommAbortedError):
        for r in pending:
            r.abandon()
        raise
