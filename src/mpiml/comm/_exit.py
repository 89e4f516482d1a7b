"""The end of a process that used device transports: NCCL communicators destroyed in one agreed order, every wait
bounded.

Why.  ``ncclCommDestroy`` is a rendezvous of the ranks (NCCL 2.23 and later; 2.28 on the GPU hosts): it joins the
communicator's proxy service thread, which runs until every peer rank that connected to it has sent its close,
i.e. until every peer has destroyed the same communicator (``commFree`` and ``ncclProxyService`` in NCCL's
``init.cc`` / ``proxy.cc``), and it waits for every CUDA graph that holds calls of it to be destroyed.  Left to
Python, a process's NCCL communicators (mpiml's ``nccl`` transport, the ``ipc`` transport's NCCL helper, and any the
program made itself, such as a raw CuPy ``NcclCommunicator`` beside mpiml's) are destroyed by CuPy's
``__dealloc__`` when the interpreter's teardown reaches them: in an order of each process's own (the collector's,
set by what the process allocated and kept), which nothing makes the same on every rank.  Two ranks that destroy two
communicators in opposite orders each wait in their first destroy for the other's, for ever; a rank that never
destroys one (still referenced at the end) leaves its peer in that destroy and itself in ``MPI_Finalize``.  No mpiml
wait is involved (the watchdog stopped at exit, and no daemon thread runs once the teardown began), so
``MPIML_TIMEOUT`` never applied.  The processes of ``benchmarks/gpu/vs_nccl.py --ops reduce_scatter`` with the
2-rank rules of the 2 x H200 table, which measured every row, wrote their JSON and never ended, held two each (the
benchmark's raw one and mpiml's) and nothing else that waits: the IPC kernels of that call sequence leave no ack or
flag unanswered (``tests/comm/test_ipc_protocol_model.py``, ``test_the_reduce_scatter_sweep_ends_with_nothing_pending``).

What happens at exit (an ``atexit`` hook, run before the interpreter's teardown and ``MPI_Finalize``), when this
process made a multi-rank device transport:

1. the exit bound is armed (:func:`exit_timeout`, ``MPIML_EXIT_TIMEOUT``, default ``MPIML_TIMEOUT``; 0: none):
   ``faulthandler.dump_traceback_later(bound, exit=True)``, a C thread that needs no GIL, so that a teardown
   still running after ``bound`` seconds (a destroy of a communicator the program made itself, whose peer never
   comes) prints ``Timeout`` and the Python stacks of every thread, and ends the process with status 1; the
   launcher then ends the job;
2. the device watchdog's thread is stopped and joined (a daemon thread frozen by the teardown in the middle of a look
   would hold a communicator for ever);
3. the NCCL transports still open are released newest first (their order of creation, the same on every rank:
   each was made by a collective call), each destroy in a thread of its own (CuPy releases the GIL there) joined
   until :data:`JOIN_LIMIT` seconds (at most half the bound) after the hook began; one that has not returned
   by then is left to finish in the background (harmless: the rendezvous completes when its peer destroys it
   too, or ends), and this says so on stderr, naming the transport and the likely reasons.

``MPIML_EXIT_RELEASE=0`` skips step 3 (diagnosis: Python's teardown destroys them, as before; the bound holds);
``MPIML_EXIT_VERBOSE=1`` says what step 3 took.

A rank that waits at exit is bounded like every other wait for a peer: a slow peer is met, a peer that never
comes (stuck, or still running longer than the bound) ends the job after ``MPIML_EXIT_TIMEOUT`` seconds.
"""

import atexit
import sys
import threading
import time
import weakref

from .. import _config

__all__ = ["register", "exit_timeout", "release_all", "JOIN_LIMIT", "bounded_call"]

#: the most seconds the exit hook waits for mpiml's own NCCL destroys (then they go on in the background)
JOIN_LIMIT = 30.0

_LOCK = threading.Lock()
_REGISTRY = []  # weak references to transports, in order of creation (see register)
_STATE = {"hooked": False, "ran": False, "rank": None}
_KEEP = []  # destroys still running when the hook gave up on them: (thread, what) kept to the process's end


def exit_timeout():
    """Seconds the end of the process may take after its last statement (``MPIML_EXIT_TIMEOUT``, default
    ``MPIML_TIMEOUT``); None (0) means no bound."""
    import os

    if os.environ.get("MPIML_EXIT_TIMEOUT", "").strip():
        value = _config.env_number("MPIML_EXIT_TIMEOUT", 0.0, kind=float, minimum=0, unit="seconds")
        return value if value > 0 else None
    return _config.timeout()


def register(transport, rank=None):
    """Remember ``transport`` (a device transport of a multi-rank communicator, just made by a collective call) for
    the exit: its ``release(deadline, say)``, if it has one, runs in the exit hook, newest first."""
    with _LOCK:
        _REGISTRY[:] = [r for r in _REGISTRY if r() is not None]
        _REGISTRY.append(weakref.ref(transport))
        if rank is not None and _STATE["rank"] is None:
            _STATE["rank"] = rank
        if not _STATE["hooked"]:
            _STATE["hooked"] = True
            atexit.register(_at_exit)


def _world_rank():
    """This process's rank in the job (the launcher's variables), else the rank given at registration."""
    import os

    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return _STATE["rank"]


def _say(text):
    rank = _world_rank()
    try:
        sys.stderr.write(f"mpiml: rank {rank if rank is not None else '?'}: {text}\n")
        sys.stderr.flush()
    except Exception:
        pass


def bounded_call(fn, deadline, what):
    """Run ``fn()`` in a daemon thread; True once it returned (re-raising nothing: a failure is said), False if
    it is still running at ``deadline`` (``time.monotonic()`` seconds; None: wait for it), kept to the process's
    end then.  For calls that release the GIL while they block (NCCL's destroy and abort through CuPy)."""
    done = threading.Event()
    failure = []

    def run():
        try:
            fn()
        except BaseException as exc:  # (a thread: said here, never raised into the exit)
            failure.append(exc)
        finally:
            done.set()

    t = threading.Thread(target=run, name=f"mpiml-exit {what}", daemon=True)
    t.start()
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    if not done.wait(left):
        _KEEP.append((t, what))
        return False
    if failure:
        _say(f"{what} failed at exit: {type(failure[0]).__name__}: {failure[0]}")
    return True


def release_all(deadline, say=_say):
    """Release every registered transport still alive that has ``release``, newest first (the reverse of the order
    of creation, the same on every rank); returns the number released."""
    with _LOCK:
        alive = [t for t in (r() for r in _REGISTRY) if t is not None]
    n = 0
    for t in reversed(alive):
        release = getattr(t, "release", None)
        if release is None:
            continue
        try:
            release(deadline, say)
        except Exception as exc:  # never let one transport keep the others open
            say(f"releasing {type(t).__name__} at exit failed: {type(exc).__name__}: {exc}")
        n += 1
    return n


def _stop_watchdog(limit=2.0):
    """Stop the device watchdog's thread and wait (at most ``limit`` s) until it has: a daemon thread frozen by the
    interpreter's teardown in the middle of a look would keep the communicator it was looking at (its frame's
    references are never released), and with it that communicator's NCCL communicator, never destroyed."""
    wd = sys.modules.get("mpiml.comm.backends._watchdog")
    if wd is None:
        return
    wd._STATE["stop"] = True
    t = wd._STATE.get("thread")
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join(limit)


def _at_exit():
    if _STATE["ran"]:
        return
    _STATE["ran"] = True
    with _LOCK:
        if not any(r() is not None for r in _REGISTRY):
            return
    bound = exit_timeout()
    if bound is not None:
        try:
            import faulthandler

            faulthandler.dump_traceback_later(bound, exit=True)
        except Exception:  # (no faulthandler, or no stderr to write to: the ordered release still runs)
            pass
    _stop_watchdog()
    if _config.env_number("MPIML_EXIT_RELEASE", 1, minimum=0, maximum=1) == 0:
        return  # (diagnosis: the NCCL communicators left to Python's teardown, as before; the bound still holds)
    start = time.monotonic()
    deadline = None if bound is None else start + min(JOIN_LIMIT, bound / 2)
    n = release_all(deadline)
    if _config.env_number("MPIML_EXIT_VERBOSE", 0, minimum=0, maximum=1):
        _say(f"at exit: {n} NCCL transport(s) released in {time.monotonic() - start:.3f} s"
             + (f" ({len(_KEEP)} still in the background)" if _KEEP else "")
             + (f"; exit bound {bound:g} s armed" if bound is not None else ""))
