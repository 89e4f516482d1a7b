"""The user's point-to-point: ``send``/``recv``/``isend``/``irecv`` of self-describing arrays.

Every message starts with a 256-byte header (dtype, shape, memory kind, size);
payloads of up to 128 bytes travel inside it, larger ones follow as a second
message with the same tag, so the receiver needs no shape or dtype.  The
traffic runs on the communicator's own point-to-point context (``_p2p``).
"""

import time

import numpy as np

from .._array import is_device_array
from .._errors import CommError
from . import _profile
from ._ops import SUPPORTED_DTYPES, dtype_code
from ._request import CompletedRequest, Request

__all__ = ["PointToPoint", "MAX_TAG"]

MAX_TAG = 32767
_HEADER_BYTES = 256
_HEADER_INTS = 16
_INLINE_BYTES = _HEADER_BYTES - 8 * _HEADER_INTS
_MAGIC = 0x6D70696D6C  # "mpiml"
_MAX_NDIM = _HEADER_INTS - 6


def _flat(x):
    return x if x.ndim == 1 else x.reshape(-1)


def _cupy():
    import cupy

    return cupy


class PointToPoint:
    """Mixin of :class:`~mpiml.comm.Communicator`: needs ``rank``, ``size``, ``backend``,
    ``_p2p`` (a transport), ``_prep``, ``_liveness``, ``_poison`` and ``_aborted``."""

    def _check_peer(self, peer, what):
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise ValueError(f"{what} must be a rank in [0, {self.size}); got {peer!r}")

    def _check_alive(self, peer, op):
        """Raise CommAbortedError (and abort the communicator) if ``peer``'s process has ended.

        Called by a send or receive that is still waiting for ``peer`` (see
        :mod:`mpiml.comm._liveness`; the look is rate-limited, so this is cheap).
        """
        live = self._liveness
        if live is not None and live.look() is not None and live.dead[0] == peer:
            from .._errors import CommAbortedError

            self._poison(CommAbortedError(live.describe(live.dead)))
            raise self._aborted(op)

    def _check_tag(self, tag):
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag <= MAX_TAG:
            raise ValueError(f"tag must be an int in [0, {MAX_TAG}]; got {tag!r}")

    def isend(self, x, dest, tag=0):
        """Start sending ``x`` to ``dest``; returns a request (``.wait()`` or ``await``)."""
        if self._failure is not None:
            raise self._aborted("send")
        self._check_peer(dest, "dest")
        self._check_tag(tag)
        x, xp = self._prep(x)
        if x.ndim > _MAX_NDIM:
            raise ValueError(f"send supports at most {_MAX_NDIM} dimensions; got {x.ndim}")
        header = np.zeros(_HEADER_BYTES, dtype=np.uint8)
        ints = header[:8 * _HEADER_INTS].view(np.int64)
        inline = x.nbytes <= _INLINE_BYTES
        ints[:6] = [_MAGIC, dtype_code(x.dtype), x.ndim, 1 if xp is not np else 0, x.nbytes, 1 if inline else 0]
        ints[6:6 + x.ndim] = x.shape
        reqs = []
        if inline:
            if x.nbytes:
                raw = x.get() if xp is not np else x
                header[8 * _HEADER_INTS:8 * _HEADER_INTS + x.nbytes] = _flat(raw).view(np.uint8)
            reqs.append(self._p2p.isend(header, dest, tag))
        else:
            reqs.append(self._p2p.isend(header, dest, tag))
            reqs.append(self._p2p.isend(_flat(x), dest, tag))
        start = time.perf_counter()

        def test():
            done = all(r.test() for r in reqs)
            if done and _profile.active():
                _profile.record("send", x.nbytes, self.backend, "p2p", time.perf_counter() - start)
            if not done:
                self._check_alive(dest, "send")
            return done

        def abandon():
            for r in reqs:
                r.abandon()

        return Request(test, op="send", peer=dest, result=None, cancel=abandon, on_timeout=self._poison)

    def send(self, x, dest, tag=0):
        """Send ``x`` to ``dest`` (blocks until the buffer may be reused)."""
        self.isend(x, dest, tag).wait()

    def irecv(self, source, tag=0, out=None):
        """Start receiving from ``source``; the request's ``wait()`` returns the array."""
        if self._failure is not None:
            raise self._aborted("recv")
        self._check_peer(source, "source")
        self._check_tag(tag)
        header = np.empty(_HEADER_BYTES, dtype=np.uint8)
        hreq = self._p2p.irecv(header, source, tag)
        state = {"payload": None, "result": None, "start": time.perf_counter(), "error": None}

        def on_header():
            ints = header[:8 * _HEADER_INTS].view(np.int64)
            magic, dcode, ndim, dev, nbytes, inline = (int(v) for v in ints[:6])
            if magic != _MAGIC:
                raise CommError(f"recv from rank {source} tag {tag}: not an mpiml message")
            dtype = SUPPORTED_DTYPES[dcode - 1]
            shape = tuple(int(s) for s in ints[6:6 + ndim])
            size = int(np.prod(shape, dtype=np.int64))
            if out is not None:
                # a wrong out still receives the message (into scratch), so that its
                # payload cannot be taken for the next message's header
                if out.dtype != dtype or out.size != size:
                    state["error"] = ValueError(
                        f"recv from rank {source}: message is {shape} {dtype} but out is {tuple(out.shape)} {out.dtype}")
                    target = np.empty(shape, dtype=dtype)
                elif not out.flags.c_contiguous:
                    state["error"] = ValueError(f"recv from rank {source}: out must be C-contiguous")
                    target = np.empty(shape, dtype=dtype)
                else:
                    target = out
            else:
                xp = _cupy() if dev else np
                target = xp.empty(shape, dtype=dtype)
            if inline:
                if nbytes:
                    data = header[8 * _HEADER_INTS:8 * _HEADER_INTS + nbytes].view(dtype)
                    if is_device_array(target):
                        _flat(target).set(data)
                    else:
                        _flat(target)[...] = data
                state["result"] = target
                return None
            state["result"] = target
            return self._p2p.irecv(_flat(target), source, tag)

        def test():
            if state["payload"] is None:
                if not hreq.test():
                    self._check_alive(source, "recv")
                    return False
                state["payload"] = on_header() or CompletedRequest()
            if not state["payload"].test():
                self._check_alive(source, "recv")
                return False
            if state["error"] is not None:
                raise state["error"]
            if _profile.active():
                _profile.record("recv", state["result"].nbytes, self.backend, "p2p",
                                time.perf_counter() - state["start"])
            return True

        def abandon():  # cancel the pending header (or payload) receive after a timeout
            for r in (hreq, state["payload"]):
                if r is not None:
                    r.abandon()

        return Request(test, op="recv", peer=source, result=lambda: state["result"], cancel=abandon, on_timeout=self._poison)

    def recv(self, source, tag=0, out=None):
        """Receive an array from ``source`` (into ``out`` when given) and return it."""
        return self.irecv(source, tag, out).wait()

    def isendrecv(self, x, dest, source, tag=0):
        """Send ``x`` to ``dest`` and receive an array from ``source``; the request's ``wait()`` returns it.

        A device (CuPy) array travels device-direct over the communicator's NCCL
        transport: the header (dtype, shape) still goes over the host, then the
        payloads go as one NCCL group (this send and this receive) on a stream of
        the communicator's own, after the work queued on the current stream; ``wait()``
        returns once the header has arrived, with the current stream made to wait
        for the transfer (stream-ordered: the host does not wait for the data).

        NCCL pairs a rank's sends to a peer with that peer's receives in the order
        they were posted, not by tag: every device ``isendrecv`` between two ranks
        must be posted in the same order on both (as a ring's steps are). The first
        device ``isendrecv`` of a communicator without an NCCL transport creates it,
        which is collective: every rank makes that call. Host arrays, a peer that is
        this rank, or no NCCL take the host path (``isend`` + ``irecv``).
        """
        if self._failure is not None:
            raise self._aborted("sendrecv")
        self._check_peer(dest, "dest")
        self._check_peer(source, "source")
        self._check_tag(tag)
        x, xp = self._prep(x)
        if x.ndim > _MAX_NDIM:
            raise ValueError(f"sendrecv supports at most {_MAX_NDIM} dimensions; got {x.ndim}")
        nccl_t = None
        if xp is not np and dest != self.rank and source != self.rank:
            nccl_t = self._p2p_device()
        if nccl_t is None:
            sreq, rreq = self.isend(x, dest, tag), self.irecv(source, tag)

            def test():
                received = rreq.test()  # always driven: it posts the payload receive that our peer's send needs
                return sreq.test() and received

            return Request(test, op="sendrecv", peer=source, result=lambda: rreq._value())
        return self._device_sendrecv(nccl_t, x, dest, source, tag)

    def _p2p_device(self):
        """The NCCL transport for device point-to-point, or None (made on first use: collective)."""
        t = self._device_transports.get("nccl")
        if t is not None:
            return t
        if "nccl" in self._unavailable or self.size == 1:
            return None
        return self._device_transports.get("nccl") if self._device_backend_usable("nccl") else None

    def _device_sendrecv(self, t, x, dest, source, tag):
        cupy = _cupy()
        # the header: dtype code, ndim, shape (an inline host message)
        meta = np.zeros(2 + _MAX_NDIM, dtype=np.int64)
        meta[:2] = dtype_code(x.dtype), x.ndim
        meta[2:2 + x.ndim] = x.shape
        hsend = self.isend(meta, dest, tag)
        got = self.irecv(source, tag).wait()
        hsend.wait()
        dtype = SUPPORTED_DTYPES[int(got[0]) - 1]
        shape = tuple(int(v) for v in got[2:2 + int(got[1])])
        out = cupy.empty(shape, dtype=dtype)
        stream = self.__dict__.get("_p2p_stream")
        if stream is None:
            stream = self._p2p_stream = cupy.cuda.Stream(non_blocking=True)
        current = cupy.cuda.get_current_stream()
        stream.wait_event(current.record())  # x is ready, out allocated
        t._check("sendrecv")
        nccl = t._nccl
        nccl.groupStart()
        try:
            if x.size:
                t.comm.send(x.data.ptr, x.size, t._dt(x), dest, stream.ptr)
            if out.size:
                t.comm.recv(out.data.ptr, out.size, t._dt(out), source, stream.ptr)
        finally:
            nccl.groupEnd()
        done = stream.record()
        keep = [x]

        def result():
            cupy.cuda.get_current_stream().wait_event(done)  # later work (and x's reuse) after the transfer
            keep.clear()
            return out

        return CompletedRequest(result, op="sendrecv", peer=source)
