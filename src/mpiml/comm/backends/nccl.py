"""The ``nccl`` transport: NCCL through ``cupy.cuda.nccl``, one NCCL communicator per communicator.

Rank 0 draws the unique id, the host transport broadcasts it, and every rank
joins once; the NCCL communicator is then reused for every call (never
re-created per fit).  Calls are stream-ordered on CuPy's current stream; see
:mod:`mpiml.comm.backends._stream` for when the host waits and how a timeout
becomes :class:`~mpiml.CommTimeoutError` (the NCCL communicator is aborted
then, and the transport refuses further calls).

Native: allreduce, bcast, reduce, allgather, reduce_scatter (uneven parts: one
reduce per part, to its rank, in one NCCL group).  Built from grouped send/recv: gather(v), scatter,
allgatherv, alltoall, scan/exscan (every rank receives the lower ranks' data
and reduces it in rank order, so results are deterministic).  Point-to-point
(used by our algorithms through :class:`~mpiml.comm.algorithms.Channel`) is
deferred: sends and receives posted since the last wait are issued together
in one NCCL group when any of their requests is tested, so a send/receive pair
of a ring cannot deadlock.

Host (NumPy) buffers never come here (``accepts_host = False``).
"""

import threading
import time

import numpy as np

from ..._errors import BackendUnavailableError, CommError
from ... import _config
from ._base import Transport
from ._device import require_exclusive_devices
from ._stream import DONE, SpinRequest as Request, agree_or_raise, device_sync
from .. import _exit

__all__ = ["NCCLTransport"]

#: calls on one stream within this many seconds of the newest tracked one share its event (NCCLTransport.track)
_COALESCE_S = 1e-3
#: events made when the transport starts (more are made only while the watchdog has returned none)
_EVENTS_AHEAD = 16


def _nccl_module():
    try:
        from cupy.cuda import nccl
    except Exception as exc:
        raise BackendUnavailableError(
            "the 'nccl' backend needs CuPy built with NCCL (pip install cupy-cuda12x nvidia-nccl-cu12)"
        ) from exc
    if not getattr(nccl, "available", True):
        raise BackendUnavailableError("CuPy was built without NCCL support")
    return nccl


def _completed_prefix(inflight, done):
    """How many entries at the front of ``inflight`` (``[t0, event, ...]``) have completed, with O(log n) queries.

    Calls on one stream complete in order, so completion is a prefix: one
    query of the newest entry settles a burst that has fully completed, and a
    binary search finds the boundary otherwise.  (Across several streams the
    order can differ; an entry found later still counts then.)
    """
    n = len(inflight)
    if n == 0:
        return 0
    if done(inflight[n - 1][1]):
        return n
    lo, hi = 0, n - 1  # entry hi is not done; find the first entry not done
    while lo < hi:
        mid = (lo + hi) // 2
        if done(inflight[mid][1]):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _event_done(cupy, ev):
    try:
        return cupy.cuda.runtime.eventQuery(ev) == 0
    except Exception:  # "not ready" raised as an error by some CuPy versions
        return False


class NCCLTransport(Transport):
    """NCCL collectives over the ranks of ``world``.

    Parameters
    ----------
    world : Transport
        The host transport of the communicator; the unique id travels over it.
    """

    name = "nccl"
    accepts_device = True
    accepts_host = False

    def __init__(self, world):
        self._world = world
        self.rank = world.rank
        self.size = world.size
        self.comm = None
        self._broken = None
        self._pending = []
        err = None
        try:
            import cupy

            nccl = _nccl_module()
            cupy.cuda.runtime.getDevice()
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        agree_or_raise(world, err, "the 'nccl' backend cannot start")
        # NCCL finds a shared GPU only inside its own set-up, on the sharing ranks alone, and the
        # others wait in its bootstrap for ever: agree on the devices first, refuse on every rank
        require_exclusive_devices(world, "nccl")
        self._cupy = cupy
        self._nccl = nccl
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = world.bcast_obj(uid, 0)
        self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._types = {
            np.dtype("float16"): nccl.NCCL_FLOAT16, np.dtype("float32"): nccl.NCCL_FLOAT32,
            np.dtype("float64"): nccl.NCCL_FLOAT64, np.dtype("int32"): nccl.NCCL_INT32,
            np.dtype("int64"): nccl.NCCL_INT64, np.dtype("bool"): nccl.NCCL_UINT8,
        }
        self._ops = {"sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD, "min": nccl.NCCL_MIN, "max": nccl.NCCL_MAX}
        self._sync = device_sync()
        self._timeout = _config.timeout()
        # stream-ordered calls in flight, for the watchdog (see track): [enqueued at, event, op, stream],
        # oldest first; the main thread appends or re-records the newest, the watchdog drops completed
        # ones from the front, both under _lock; events are reused, a few made ahead
        self._inflight = []
        self._lock = threading.Lock()
        self._coalesce = min(_COALESCE_S, self._timeout / 100) if self._timeout is not None else 0.0
        runtime = cupy.cuda.runtime
        self._runtime = runtime
        self._free_events = [runtime.eventCreateWithFlags(2) for _ in range(_EVENTS_AHEAD)] \
            if self._timeout is not None else []
        # destroyed at exit in the order of creation, bounded (see mpiml.comm._exit: NCCL's destroy is a
        # rendezvous of the ranks, which Python's teardown would run in an order of its own on each rank)
        _exit.register(self, self.rank)

    def close(self):
        """Destroy the NCCL communicator (bounded by ``MPIML_TIMEOUT``, see :meth:`release`)."""
        self.release(None if self._timeout is None else time.monotonic() + self._timeout)

    def release(self, deadline=None, say=None):
        """Destroy the NCCL communicator, waiting at most until ``deadline`` (``time.monotonic()`` seconds; None:
        without bound); True if it was destroyed by then.

        The calls still in flight are waited for first (their events, until ``deadline``); if some have not
        completed (a peer that never came: NCCL kernels wait for ever), the communicator is aborted instead, so
        that its kernels end.  Either runs in a thread of its own (:func:`mpiml.comm._exit.bounded_call`): NCCL's
        destroy and abort wait for every peer to destroy the same communicator, and for the CUDA graphs holding
        calls of it to be destroyed; one still waiting at ``deadline`` goes on in the background, and ``say``
        (default: a line on stderr) says so.  Later calls on this transport are refused.
        """
        from ._watchdog import _LOCK

        say = say or _exit._say
        with _LOCK:  # (the watchdog polls self.comm under this lock: never the object being destroyed)
            nc, self.comm = self.comm, None
        ok = True
        if nc is not None and self._broken is None:  # (a broken one was aborted: nothing left to destroy)
            self._broken = "closed"
            pending = self._wait_inflight(deadline)
            if pending:
                say(f"{pending} NCCL call(s) of a communicator of {self.size} ranks had not completed when it was "
                    "closed (a peer that never came?): aborting it instead of destroying it")
            what = f"NCCL communicator of {self.size} ranks ({'abort' if pending else 'destroy'})"
            ok = _exit.bounded_call(nc.abort if pending else nc.destroy, deadline, what)
            if not ok:
                say(f"the {what} did not return within its bound: a peer rank has not destroyed this communicator "
                    "yet (it has not reached the same point, or is stuck), or a CUDA graph holding NCCL calls of it "
                    "is still alive; it goes on in the background")
        lock = getattr(self, "_lock", None)  # (absent when the set-up failed before making it)
        if lock is None:
            return ok
        with lock:
            events = self._free_events + [e[1] for e in self._inflight]
            self._free_events, self._inflight = [], []
        for ev in events:
            try:
                self._runtime.eventDestroy(ev)
            except Exception:
                pass
        return ok

    def _wait_inflight(self, deadline):
        """Wait until the tracked calls in flight have completed or ``deadline`` (None: the device, without bound);
        the number still in flight then."""
        if self._timeout is None or not hasattr(self, "_lock"):  # (nothing tracked: the device, as before, bounded)
            cupy = getattr(self, "_cupy", None)
            if cupy is None:
                return 0
            return 0 if _exit.bounded_call(cupy.cuda.runtime.deviceSynchronize, deadline, "device synchronize") else 1
        sleep = 1e-5
        while True:
            with self._lock:
                inflight = self._inflight
                k = _completed_prefix(inflight, lambda ev: _event_done(self._cupy, ev))
                if k:
                    self._free_events.extend(e[1] for e in inflight[:k])
                    del inflight[:k]
                left = len(inflight)
            if not left or (deadline is not None and time.monotonic() >= deadline):
                return left
            time.sleep(sleep)
            sleep = min(2 * sleep, 1e-3)

    # ------------------------------------------------------------------ helpers
    def _dt(self, buf):
        return self._types[buf.dtype]

    def _op(self, op, dtype):
        if dtype == np.bool_:
            op = {"sum": "max", "prod": "min"}.get(op, op)
        return self._ops[op]

    def _stream(self):
        return self._cupy.cuda.get_current_stream()

    def _check(self, what):
        if self._broken is not None:
            raise CommError(f"{what} on the nccl backend: the communicator is unusable after an earlier "
                            f"failure ({self._broken})")

    def _abort(self, why):
        self._broken = why
        try:
            self.comm.abort()
        except Exception:
            pass

    # ------------------------------------------------------------------ watchdog hooks
    def track(self, op, s):
        """Mark the call just enqueued on stream ``s`` (a handle) for the watchdog's timeout.

        Calls on one stream complete in order, so one event recorded after the
        newest call marks every call before it on that stream: a call within
        ``_coalesce`` seconds of the newest tracked one on the same stream
        re-records that entry's event (which CUDA allows: the event then marks
        this call) instead of taking another.  The entry keeps its first call's
        enqueue time, so its timeout may fire up to ``_coalesce`` early (1 ms, at
        most 1 % of ``MPIML_TIMEOUT``).  Otherwise a free event is taken (a few
        are made ahead; the watchdog returns completed ones) or, rarely, made.
        Before, every call while the watchdog had not recycled an event yet (it
        looks every 10 ms) created one, and a stream held by a long kernel made
        every call create one: a 1 MiB bcast cost the host 30.8 us against raw
        NCCL's 13.1 on 4 x H100.
        """
        now = time.monotonic()
        runtime = self._runtime
        with self._lock:
            inflight = self._inflight
            if inflight:
                last = inflight[-1]
                if last[3] == s and now - last[0] < self._coalesce:
                    runtime.eventRecord(last[1], s)
                    last[2] = op
                    return
            ev = self._free_events.pop() if self._free_events else runtime.eventCreateWithFlags(2)  # no timing
            runtime.eventRecord(ev, s)
            inflight.append([now, ev, op, s])

    def poll_failure(self):
        """An exception for an NCCL async error or a call not completed in time (watchdog), else None."""
        if self.comm is None or self._broken is not None:
            return None
        try:
            self.comm.check_async_error()
        except Exception as exc:
            return CommError(f"the nccl backend reported an error on rank {self.rank}: {exc}")
        with self._lock:  # (the main thread re-records the newest entry's event: never while it is looked at)
            inflight = self._inflight
            k = _completed_prefix(inflight, lambda ev: _event_done(self._cupy, ev))
            if k:
                self._free_events.extend(e[1] for e in inflight[:k])
                del inflight[:k]
            oldest = inflight[0][:3] if inflight else None
        if oldest is not None and self._timeout is not None:
            t0, _, op = oldest
            age = time.monotonic() - t0
            if age > self._timeout:
                from ..._errors import CommTimeoutError

                return CommTimeoutError(op, "all", self._timeout,
                                        f"nccl call enqueued {age:.1f} s ago on rank {self.rank} has not completed")
        return None

    def abort(self, why):
        """Abort the NCCL communicator (its kernels stop waiting); refuse later calls."""
        if self._broken is None and self.comm is not None:
            self._abort(why)

    def _done(self, op, peer="all"):
        """Completion of the work just enqueued on the current stream."""
        if not self._sync:
            if self._timeout is not None:
                stream = self._stream()
                if not stream.is_capturing():
                    self.track(op, stream.ptr)
            return DONE
        stream = self._stream()
        if stream.is_capturing():
            return DONE
        event = stream.record()
        start = time.perf_counter()

        def test():
            if event.done:
                return True
            try:
                self.comm.check_async_error()
            except Exception as exc:
                self._abort(f"{type(exc).__name__}: {exc}")
                raise CommError(f"{op} on the nccl backend failed on rank {self.rank}: {exc}") from exc
            return False

        def cancel():
            self._abort(f"{op} timed out after {time.perf_counter() - start:.3g} s on rank {self.rank}")

        return Request(test, op=op, peer=peer, cancel=cancel)

    @staticmethod
    def _ptr(buf):
        return buf.data.ptr if buf is not None and buf.size else 0

    # ------------------------------------------------------------------ native collectives
    def native_allreduce(self, sendbuf, recvbuf, op):
        self._check("allreduce")
        if sendbuf.size:
            self.comm.allReduce(sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, self._dt(sendbuf),
                                self._op(op, sendbuf.dtype), self._stream().ptr)
        return self._done("allreduce")

    def native_bcast(self, buf, root):
        self._check("bcast")
        if buf.size:
            self.comm.bcast(buf.data.ptr, buf.size, self._dt(buf), root, self._stream().ptr)
        return self._done("bcast")

    def native_reduce(self, sendbuf, recvbuf, op, root):
        self._check("reduce")
        if sendbuf.size:
            rp = recvbuf.data.ptr if self.rank == root else sendbuf.data.ptr
            self.comm.reduce(sendbuf.data.ptr, rp, sendbuf.size, self._dt(sendbuf),
                             self._op(op, sendbuf.dtype), root, self._stream().ptr)
        return self._done("reduce")

    def native_allgather(self, sendbuf, recvbuf):
        self._check("allgather")
        if sendbuf.size:
            self.comm.allGather(sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, self._dt(sendbuf),
                                self._stream().ptr)
        return self._done("allgather")

    def native_reduce_scatter(self, sendbuf, recvbuf, counts, op):
        self._check("reduce_scatter")
        counts = [int(c) for c in counts]
        width = max(counts)
        if width == 0:
            return DONE
        stream = self._stream().ptr
        if all(c == width for c in counts):
            self.comm.reduceScatter(sendbuf.data.ptr, recvbuf.data.ptr, width, self._dt(sendbuf),
                                    self._op(op, sendbuf.dtype), stream)
            return self._done("reduce_scatter")
        # uneven parts: one reduce per part, to its rank, in one NCCL group; no temporaries (a padded copy
        # made while a CUDA graph is captured would be freed, and its memory reused, before the replays)
        nccl, isz = self._nccl, sendbuf.dtype.itemsize
        dt, red = self._dt(sendbuf), self._op(op, sendbuf.dtype)
        sp, start = sendbuf.data.ptr, 0
        nccl.groupStart()
        try:
            for r, c in enumerate(counts):
                if c:
                    into = recvbuf.data.ptr if r == self.rank else sp + start * isz  # (ignored off the root)
                    self.comm.reduce(sp + start * isz, into, c, dt, red, r, stream)
                start += c
        finally:
            nccl.groupEnd()
        return self._done("reduce_scatter")

    # -- from grouped send/recv ---------------------------------------------------------------
    def _group(self, sends, recvs):
        """Issue ``sends`` [(buf, peer)] and ``recvs`` [(buf, peer)] as one NCCL group."""
        nccl, stream = self._nccl, self._stream().ptr
        nccl.groupStart()
        try:
            for buf, peer in sends:
                if buf.size:
                    self.comm.send(buf.data.ptr, buf.size, self._dt(buf), peer, stream)
            for buf, peer in recvs:
                if buf.size:
                    self.comm.recv(buf.data.ptr, buf.size, self._dt(buf), peer, stream)
        finally:
            nccl.groupEnd()

    @staticmethod
    def _split(buf, counts):
        out, start = [], 0
        for c in counts:
            out.append(buf[start:start + c])
            start += c
        return out

    def native_allgatherv(self, sendbuf, recvbuf, counts):
        self._check("allgatherv")
        parts = self._split(recvbuf, [int(c) for c in counts])
        others = [r for r in range(self.size) if r != self.rank]
        self._group([(sendbuf, r) for r in others], [(parts[r], r) for r in others])
        if sendbuf.size:
            parts[self.rank][...] = sendbuf
        return self._done("allgatherv")

    def native_gatherv(self, sendbuf, recvbuf, counts, root):
        self._check("gatherv")
        if self.rank != root:
            self._group([(sendbuf, root)], [])
        else:
            parts = self._split(recvbuf, [int(c) for c in counts])
            self._group([], [(parts[r], r) for r in range(self.size) if r != root])
            if sendbuf.size:
                parts[root][...] = sendbuf
        return self._done("gatherv", root)

    def native_gather(self, sendbuf, recvbuf, root):
        return self.native_gatherv(sendbuf, recvbuf, [sendbuf.size] * self.size, root)

    def native_scatter(self, sendbuf, recvbuf, root):
        self._check("scatter")
        n = recvbuf.size
        if self.rank != root:
            self._group([], [(recvbuf, root)])
        else:
            self._group([(sendbuf[r * n:(r + 1) * n], r) for r in range(self.size) if r != root], [])
            if n:
                recvbuf[...] = sendbuf[root * n:(root + 1) * n]
        return self._done("scatter", root)

    def native_alltoall(self, sendbuf, recvbuf):
        self._check("alltoall")
        n = sendbuf.size // self.size
        others = [r for r in range(self.size) if r != self.rank]
        self._group([(sendbuf[r * n:(r + 1) * n], r) for r in others],
                    [(recvbuf[r * n:(r + 1) * n], r) for r in others])
        if n:
            recvbuf[self.rank * n:(self.rank + 1) * n] = sendbuf[self.rank * n:(self.rank + 1) * n]
        return self._done("alltoall")

    def _prefix(self, kind, sendbuf, recvbuf, op):
        """Scan / exscan: receive every lower rank's data, reduce in rank order."""
        self._check(kind)
        from .._ops import reduce_local

        upto = self.rank + (1 if kind == "scan" else 0)
        n = sendbuf.size
        lower = self._cupy.empty((self.rank, n), dtype=sendbuf.dtype) if self.rank and n else None
        self._group([(sendbuf, r) for r in range(self.rank + 1, self.size)],
                    [(lower[r], r) for r in range(self.rank)] if lower is not None else [])
        if n and upto:
            rows = [lower[r] for r in range(self.rank)] + ([sendbuf] if kind == "scan" else [])
            recvbuf[...] = rows[0]
            for row in rows[1:]:
                reduce_local(self._cupy, op, row, recvbuf)
        return self._done(kind)

    def native_scan(self, sendbuf, recvbuf, op):
        return self._prefix("scan", sendbuf, recvbuf, op)

    def native_exscan(self, sendbuf, recvbuf, op):
        return self._prefix("exscan", sendbuf, recvbuf, op)

    # ------------------------------------------------------------------ point to point
    def _flush(self):
        """Issue every deferred send/receive as one group."""
        pending, self._pending = self._pending, []
        if pending:
            self._group([(b, p) for kind, b, p in pending if kind == "send"],
                        [(b, p) for kind, b, p in pending if kind == "recv"])

    def _p2p(self, kind, buf, peer):
        self._check(kind)
        self._pending.append((kind, buf, peer))
        state = {"inner": None}

        def test():
            if state["inner"] is None:
                self._flush()
                state["inner"] = self._done(kind, peer)
            return state["inner"].test()

        def cancel():
            if state["inner"] is not None and state["inner"]._cancel is not None:
                state["inner"]._cancel()

        return Request(test, op=kind, peer=peer, cancel=cancel)

    def isend(self, buf, dest, tag):
        return self._p2p("send", buf, dest)

    def irecv(self, buf, source, tag):
        return self._p2p("recv", buf, source)

    def hot_launcher(self, comm, plan, op, name, x, arg):
        """A launcher (see :mod:`mpiml.comm._hotpath`) issuing this collective directly, or None.

        For allreduce, bcast, reduce, allgather and reduce_scatter of equal parts;
        ``arg`` is the reduction, the root, ``(reduction, root)`` or ``(counts, reduction)``.
        """
        if self._sync or name != "native" or not x.size or self.comm is None:
            return None
        from .._hotpath import binding, launcher, nccl_issue

        issue = nccl_issue(self, op, x, arg)
        if issue is None:
            return None
        root = arg if op == "bcast" else arg[1] if op == "reduce" else 0
        rows = int(arg[0][self.rank]) // (x.size // x.shape[0]) if op == "reduce_scatter" else None
        bind = binding(op, x, rank=self.rank, size=self.size, root=int(root), rows=rows)
        return launcher(comm, self, plan, op, bind, issue)

    def run_algorithm(self, op, name, *args):
        raise ValueError(f"algorithm {name!r} is not an NCCL algorithm; NCCL offers 'native', and every "
                         "mpiml algorithm runs over NCCL send/recv")
