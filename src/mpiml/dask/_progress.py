"""Drive MPI nonblocking requests from an asyncio event loop.

One :class:`ProgressEngine` per event loop polls every pending request of that
loop with a single ``MPI_Testsome``. It never blocks the loop and does not
busy-spin the CPU while nothing moves:

* while a *busy* request is pending (a frame being sent or received), and for
  ``MPIML_DASK_SPIN`` seconds after the last activity (a completion, or a new
  request such as a send; default 50 ms where the node has two or more cores
  per process, else 2 ms), it polls on every turn of the loop
  (``asyncio.sleep(0)``), so large transfers keep MPI's progress engine
  turning and a reply that comes quickly is seen at once. Before each such
  poll it calls ``sched_yield``: on an oversubscribed node the peer it waits
  for, and the workers' compute, go first (on a node with a core per process
  this costs a microsecond);
* otherwise (only *idle* requests such as the next message header or
  connection requests are pending) it sleeps, doubling the pause up to
  ``MPIML_DASK_POLL_MAX`` seconds. Registering a new request wakes it.

Idle waits therefore cost one ``Testsome`` per pause (a few microseconds every
couple of milliseconds), and a message that arrives after a quiet period
waits at most ``MPIML_DASK_POLL_MAX`` before it is noticed.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref

from mpi4py import MPI

__all__ = ["ProgressEngine", "get_engine", "mpi_lock", "poll_settings"]

#: Serialises MPI calls of the engines of several event loops in one process
#: (harmless when MPI provides ``MPI_THREAD_MULTIPLE``, required otherwise).
mpi_lock = threading.RLock()

_engines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _env_seconds(name, default):
    from .._config import env_number

    return env_number(name, default, kind=float, minimum=0, unit="seconds")


#: launcher variables that give the number of processes on this node
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "SLURM_NTASKS_PER_NODE", "PMI_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


def _cores_per_local_process():
    """Cores of this node per process of the job on it (None when the launcher does not say)."""
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "").split("(")[0]  # Slurm may write "4(x2)"
        if value.isdigit() and int(value) > 0:
            try:
                cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cores = os.cpu_count() or 1
            return cores / int(value)
    return None


def default_spin():
    """The spin window when ``MPIML_DASK_SPIN`` is unset: 50 ms on a node with at least two cores
    per process (a poll then costs nobody a core, and a reply that comes a few milliseconds
    after the last message is still seen at once: on one H200 host, 2 workers sharing the GPU,
    CuPy ``(x + x.T).sum()`` took 84-95 ms with 2 ms and 62-70 ms with 50 ms), 2 ms otherwise
    (an oversubscribed node, where spinning takes the core a peer or a worker needs)."""
    per_process = _cores_per_local_process()
    return 0.05 if per_process is not None and per_process >= 2 else 0.002


def poll_settings():
    """Return ``(spin, first_pause, max_pause)`` in seconds, read from the environment.

    Returns
    -------
    spin : float
        ``MPIML_DASK_SPIN`` (default: :func:`default_spin`, 0.05 with two or more
        cores per process of the node, else 0.002): how long the engine keeps polling
        without sleeping after the last completed request.
    first_pause : float
        First sleep once the spin window has passed (0.0005; the event loop
        rounds sleeps up to its clock, about 1 ms on Linux).
    max_pause : float
        ``MPIML_DASK_POLL_MAX`` (default 0.002): the longest sleep between polls.
    """
    spin = _env_seconds("MPIML_DASK_SPIN", default_spin())
    max_pause = max(_env_seconds("MPIML_DASK_POLL_MAX", 0.002), 1e-4)
    return spin, min(0.0005, max_pause), max_pause


class _Group:
    """Requests that complete together, with the buffers they need kept alive."""

    __slots__ = ("remaining", "future", "busy", "buffers", "callback", "error")

    def __init__(self, count, future, busy, buffers, callback):
        self.remaining = count
        self.future = future
        self.busy = busy
        self.buffers = buffers
        self.callback = callback
        self.error = None


class ProgressEngine:
    """Poll the MPI requests of one event loop.

    Parameters
    ----------
    loop : asyncio.AbstractEventLoop
        The loop whose coroutines wait on requests; every method must be called
        from that loop's thread.

    Notes
    -----
    A request stays registered until MPI reports it complete, even when the
    coroutine that waited on it was cancelled: its buffer must stay alive until
    then. To give up on a receive, call :meth:`cancel`.
    """

    def __init__(self, loop):
        self._loop = loop
        self._requests = []
        self._groups = []
        self._busy = 0
        self._task = None
        self._pause = None
        self._last_progress = time.perf_counter()
        self._spin, self._first_pause, self._max_pause = poll_settings()

    # -- registration ---------------------------------------------------------

    def wait(self, requests, *, busy=True, buffers=None):
        """Return a future that completes when every request in ``requests`` has.

        Parameters
        ----------
        requests : list of mpi4py.MPI.Request
        busy : bool, default=True
            Data in flight: poll without sleeping until done. ``False`` for
            requests that may stay pending for long (headers, control).
        buffers : object, optional
            Kept referenced until the requests complete.

        Returns
        -------
        asyncio.Future
            Resolves to ``None``, or raises the :class:`mpi4py.MPI.Exception`
            of a request that failed (for instance, its peer died).
        """
        future = self._loop.create_future()
        requests = [r for r in requests if r]
        # Activity (a send, most often) means a reply may come soon: restart the spin window.
        self._last_progress = time.perf_counter()
        if requests:
            try:
                with mpi_lock:
                    finished = MPI.Request.Testall(requests)
            except MPI.Exception:
                finished = False  # the poller finds out which one failed
            if not finished:
                self._add(requests, _Group(len(requests), future, busy, buffers, None))
                return future
        future.set_result(None)
        return future

    def watch(self, requests, buffers=None, callback=None):
        """Keep ``requests`` (and ``buffers``) until they complete; call ``callback()`` then."""
        requests = [r for r in requests if r]
        if requests:
            self._add(requests, _Group(len(requests), None, False, buffers, callback))
        elif callback is not None:
            callback()

    def cancel(self, requests):
        """Ask MPI to cancel pending receives; they still complete (as cancelled) later."""
        with mpi_lock:
            for req in requests:
                if req:
                    req.Cancel()
        self._kick()

    def _add(self, requests, group):
        self._requests.extend(requests)
        self._groups.extend([group] * len(requests))
        if group.busy:
            self._busy += len(requests)
        self._kick()
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())

    def _kick(self):
        self._last_progress = time.perf_counter()
        pause = self._pause
        if pause is not None and not pause.done():
            pause.set_result(None)

    # -- polling --------------------------------------------------------------

    def _poll(self):
        """``Testsome`` over every request; a failing request fails its group only."""
        try:
            with mpi_lock:
                return MPI.Request.Testsome(self._requests)
        except MPI.Exception:
            pass
        done = []
        for i, (req, group) in enumerate(zip(self._requests, self._groups)):
            try:
                with mpi_lock:
                    finished = req.Test()
            except MPI.Exception as exc:
                group.error = exc
                finished = True
            if finished:
                done.append(i)
        return done

    def _complete(self, indices):
        done = set(indices)
        finished = []
        keep_requests, keep_groups = [], []
        for i, (req, group) in enumerate(zip(self._requests, self._groups)):
            if i in done:
                if group.busy:
                    self._busy -= 1
                group.remaining -= 1
                if group.remaining == 0:
                    finished.append(group)
            else:
                keep_requests.append(req)
                keep_groups.append(group)
        self._requests, self._groups = keep_requests, keep_groups
        for group in finished:
            group.buffers = None
            if group.future is not None and not group.future.done():
                if group.error is None:
                    group.future.set_result(None)
                else:
                    group.future.set_exception(group.error)
            if group.callback is not None:
                group.callback()

    async def _run(self):
        pause = self._first_pause
        while self._requests:
            indices = self._poll()
            now = time.perf_counter()
            if indices:
                self._complete(indices)
                self._last_progress = now
                pause = self._first_pause
                await asyncio.sleep(0)
            elif self._busy or now - self._last_progress < self._spin:
                # Spin, but let other runnable processes (an oversubscribed node, the
                # peer we wait for, the workers' compute) go first.
                os.sched_yield()
                await asyncio.sleep(0)
            else:
                await self._sleep(pause)
                pause = min(2 * pause, self._max_pause)

    async def _sleep(self, seconds):
        self._pause = self._loop.create_future()
        handle = self._loop.call_later(seconds, _resolve, self._pause)
        try:
            await self._pause
        finally:
            handle.cancel()
            self._pause = None

    @property
    def pending(self):
        """Number of requests not yet complete."""
        return len(self._requests)


def _resolve(future):
    if not future.done():
        future.set_result(None)


def get_engine(loop=None):
    """Return the :class:`ProgressEngine` of ``loop`` (default: the running loop)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    engine = _engines.get(loop)
    if engine is None:
        engine = _engines[loop] = ProgressEngine(loop)
    return engine
