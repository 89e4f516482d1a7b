"""The watchdog of stream-ordered device collectives (one daemon thread per process).

Device collectives return once enqueued, so a peer that never comes, a kernel
that gave up, or an NCCL error would otherwise surface nowhere.  Like PyTorch's
c10d watchdog, a background thread looks every ``MPIML_WATCHDOG_MS``
milliseconds (default 10) at every communicator that has a device transport:

* ``ipc``: the host-mapped error record that a kernel writes when a wait ran
  past ``MPIML_TIMEOUT`` (the kernels time themselves with ``%globaltimer``);
* ``nccl``: ``ncclCommGetAsyncError``, and an event recorded after each call,
  which must have completed within ``MPIML_TIMEOUT`` of the call's enqueueing;
* every peer on this host whose process has ended (:mod:`mpiml.comm._liveness`).

On a failure it calls :meth:`Communicator._poison` (through a weak reference):
the transports are aborted (waiting IPC kernels give up, the NCCL communicator
is aborted, so nothing spins for ever) and every later call on the
communicator, or :meth:`Communicator.synchronize`, raises
:class:`~mpiml.CommAbortedError` naming the first failure.  Every rank that
waited for the missing peer finds its own failure this way, so all survivors
raise.  The thread never touches a stream, so CUDA-graph capture is unaffected.
"""

import atexit
import threading
import time
import weakref

from ... import _config
from ..._errors import CommTimeoutError

__all__ = ["watch", "check", "check_now", "wait_stream", "poll_interval"]

_LOCK = threading.RLock()  # re-entrant: a poison may close transports
_COMMS = weakref.WeakSet()
_STATE = {"thread": None, "stop": False}


def poll_interval():
    """Seconds between two looks of the watchdog (``MPIML_WATCHDOG_MS``, default 10)."""
    return _config.env_number("MPIML_WATCHDOG_MS", 10.0, kind=float, minimum=0.1, unit="milliseconds") * 1e-3


def watch(comm):
    """Start watching ``comm``'s device transports (starts the thread on first use)."""
    with _LOCK:
        _COMMS.add(comm)
        if _STATE["thread"] is None:
            interval = poll_interval()
            t = threading.Thread(target=_loop, args=(interval,), name="mpiml-watchdog", daemon=True)
            _STATE["thread"] = t
            t.start()


def check(comm):
    """Poison ``comm`` if one of its device transports reports a failure; True if it did."""
    if comm._failure is not None:
        return False
    try:
        transports = list(comm._device_transports.values())
    except RuntimeError:  # changed while copied: look again next time
        return False
    for t in transports:
        poll = getattr(t, "poll_failure", None)
        exc = poll() if poll is not None else None
        if exc is not None:
            comm._poison(exc)
            return True
    live = getattr(comm, "_liveness", None)
    if live is not None and live.look() is not None:  # a peer's process ended: its kernels never come
        from ..._errors import CommAbortedError

        comm._poison(CommAbortedError(live.describe(live.dead)))
        return True
    return False


def check_now():
    """One look at every watched communicator (what the thread does; also usable from tests).

    Holds the lock throughout, so that a transport closing meanwhile (which
    frees its host-mapped error record under the same lock) is never read
    after its memory is gone.
    """
    with _LOCK:
        for comm in list(_COMMS):
            check(comm)


def _loop(interval):
    while not _STATE["stop"]:
        time.sleep(interval)
        try:
            check_now()
        except Exception:  # never let the watchdog die; the next look tries again
            pass


@atexit.register
def _stop():
    _STATE["stop"] = True


def wait_stream(failed, timeout=None):
    """Wait for CuPy's current stream, polling ``failed()``; CommTimeoutError after ``timeout``.

    Returns early (without error) when ``failed()`` becomes true: the caller
    raises the failure.  Inside graph capture there is nothing to wait for.
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing():
        return
    event = stream.record()
    limit = _config.timeout() if timeout is None else timeout
    start = time.perf_counter()
    sleep = 2e-6
    while not event.done:
        if failed():
            return
        if limit is not None and time.perf_counter() - start > limit:
            raise CommTimeoutError("synchronize", "all", limit,
                                   "device collectives enqueued on this rank did not complete")
        time.sleep(sleep)
        sleep = min(2 * sleep, 1e-3)
