"""Device buffers over an MPI that is not CUDA-aware: stage through pinned host memory.

Never hand a device pointer to an MPI that is not CUDA-aware: it crashes (seen
with Open MPI 4.1 on our GPU host).  Whether MPI is CUDA-aware is decided by
``MPIML_CUDA_AWARE_MPI`` (1/0) or, when unset, by a probe of the MPI library
that never touches device memory.

Staging is pipelined in chunks of ``MPIML_STAGE_CHUNK`` bytes (default 4 MiB)
for point-to-point and for the collectives whose chunks are independent
(allreduce, reduce, bcast, scan, exscan): all device-to-host copies are queued
at once on a copy stream, each with an event; MPI starts on chunk i as soon as
its copy has landed (so the copy-out of chunk i + 1 overlaps MPI on chunk i),
and the host-to-device copy of chunk i is queued as soon as MPI has finished
with it (overlapping MPI on chunk i + 1).  Every rank cuts the same chunks, so
the sequence of MPI calls matches across ranks.  The other collectives stage
their buffers whole.

Pinned host buffers come from a per-transport pool (power-of-two sizes) and go
back to it when the call completes, so steady-state calls allocate nothing.

This is the ``native`` path: the host MPI's own collective runs on the staged
chunks.  Large device messages take the ``ring`` / ``chain`` algorithms instead,
which over this transport run :mod:`mpiml.comm.backends._pipeline` (MPI
point-to-point only, copies overlapping the messages).
"""

import numpy as np

from ._stream import SpinRequest as Request

__all__ = ["mpi_is_cuda_aware", "staged_isend", "staged_irecv", "staged_native", "PinnedPool",
           "CHUNKED_COLLECTIVES"]

#: collectives whose elementwise chunks are independent, so they may be pipelined
CHUNKED_COLLECTIVES = ("allreduce", "reduce", "bcast", "scan", "exscan")

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault


def mpi_is_cuda_aware(MPI):
    """True only when the MPI library says it is CUDA-aware (never by trying it)."""
    from ... import _config

    forced = _config.cuda_aware_mpi()
    if forced is not None:
        return forced
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query())
        except Exception:
            return False
    return False


def _chunk_bytes():
    from ..._config import env_number

    return env_number("MPIML_STAGE_CHUNK", 4 << 20, minimum=4096, unit="bytes")


class PinnedPool:
    """Pinned host buffers by power-of-two size, reused across calls."""

    MAX_CACHED_BYTES = 1 << 30

    def __init__(self):
        self._free = {}
        self._cached = 0

    def take(self, nbytes):
        """``(token, numpy uint8 view of nbytes)``; hand ``token`` back with :meth:`give`."""
        import cupy

        size = 1 << max(12, max(int(nbytes) - 1, 0).bit_length())
        bucket = self._free.get(size)
        if bucket:
            mem = bucket.pop()
            self._cached -= size
        else:
            mem = cupy.cuda.alloc_pinned_memory(size)
        return (size, mem), np.frombuffer(mem, dtype=np.uint8, count=int(nbytes))

    def give(self, token):
        size, mem = token
        if self._cached + size <= self.MAX_CACHED_BYTES:
            self._free.setdefault(size, []).append(mem)
            self._cached += size


def _pool(transport):
    pool = getattr(transport, "_pinned_pool", None)
    if pool is None:
        pool = transport._pinned_pool = PinnedPool()
    return pool


class _Copier:
    """Asynchronous copies on a copy stream ordered after the user's current stream."""

    _streams = {}

    def __init__(self):
        import cupy

        self.cupy = cupy
        dev = cupy.cuda.runtime.getDevice()
        stream = self._streams.get(dev)
        if stream is None:
            stream = self._streams[dev] = cupy.cuda.Stream(non_blocking=True)
        self.stream = stream
        self.user = cupy.cuda.get_current_stream()
        # copies must see what the user's stream wrote before this call
        stream.wait_event(self.user.record())

    def copy(self, dst, src, nbytes):
        """Queue a copy of ``nbytes``; returns the event that marks its completion."""
        if nbytes:
            self.cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, self.stream.ptr)
        return self.stream.record()

    def finish(self):
        """Make the user's stream wait for every copy queued so far."""
        self.user.wait_event(self.stream.record())


def _chunks(nbytes, itemsize, chunked):
    if not chunked or nbytes <= _chunk_bytes():
        return [(0, nbytes)]
    step = max(itemsize, _chunk_bytes() // itemsize * itemsize)
    return [(s, min(step, nbytes - s)) for s in range(0, nbytes, step)]


def _typed(view, dtype):
    return view.view(dtype)


def _is_device(buf):
    return buf is not None and type(buf).__module__.startswith("cupy")


def staged_isend(transport, buf, dest, tag):
    """Send a device buffer: each chunk goes to MPI as soon as its copy to the host has landed.

    Every chunk's ``MPI_Isend`` is posted before this returns (the copy-out of chunk i + 1
    overlaps MPI on chunk i): a send whose chunks were posted only when its request is tested
    would deadlock a caller that waits on its receives first, as a ring exchange does.
    """
    pool = _pool(transport)
    nbytes = buf.nbytes
    mem, host = pool.take(nbytes)
    cp = _Copier()
    chunks = _chunks(nbytes, buf.itemsize, True)
    events = [cp.copy(host.ctypes.data + s, buf.data.ptr + s, n) for s, n in chunks]
    reqs = []
    for (s, n), event in zip(chunks, events):
        event.synchronize()
        reqs.append(transport.isend(host[s:s + n], dest, tag))
    state = {"released": False}

    def test():
        if not all(r.test() for r in reqs):
            return False
        if not state["released"]:
            state["released"] = True
            pool.give(mem)
        return True

    def cancel():
        for r in reqs:
            r.abandon()

    return Request(test, op="send", peer=dest, cancel=cancel)


def staged_irecv(transport, buf, source, tag):
    """Receive into a device buffer: each chunk is copied up as soon as it has arrived."""
    pool = _pool(transport)
    nbytes = buf.nbytes
    mem, host = pool.take(nbytes)
    chunks = _chunks(nbytes, buf.itemsize, True)
    reqs = [transport.irecv(host[s:s + n], source, tag) for s, n in chunks]
    state = {"cp": None, "up": 0, "last": None, "released": False}

    def test():
        while state["up"] < len(chunks) and reqs[state["up"]].test():
            if state["cp"] is None:
                state["cp"] = _Copier()
            s, n = chunks[state["up"]]
            state["last"] = state["cp"].copy(buf.data.ptr + s, host.ctypes.data + s, n)
            state["up"] += 1
        if state["up"] < len(chunks) or (state["last"] is not None and not state["last"].done):
            return False
        if not state["released"]:
            state["released"] = True
            if state["cp"] is not None:
                state["cp"].finish()
            pool.give(mem)
        return True

    def cancel():
        for r in reqs:
            r.abandon()

    return Request(test, op="recv", peer=source, cancel=cancel)


def staged_native(transport, name, call, sendbuf, recvbuf):
    """Run a native MPI collective on host copies; copy the result back to the device.

    ``call(host_send, host_recv)`` starts the nonblocking MPI collective on host
    buffers (views of one chunk, or whole buffers); either buffer may be None.
    """
    pool = _pool(transport)
    same = sendbuf is recvbuf
    dev_send = _is_device(sendbuf)
    # exscan leaves rank 0's result undefined in MPI: keep the identity already there
    dev_recv = _is_device(recvbuf) and not (name == "exscan" and transport.rank == 0)
    taken = []

    def host_of(buf, dev):
        if buf is None:
            return None
        if not dev:
            return buf
        mem, view = pool.take(buf.nbytes)
        taken.append(mem)
        return _typed(view, buf.dtype)

    hsend = host_of(sendbuf, dev_send)
    hrecv = hsend if same else host_of(recvbuf, dev_recv)
    ref = sendbuf if sendbuf is not None else recvbuf
    itemsize = ref.itemsize
    elementwise = (name in CHUNKED_COLLECTIVES and (recvbuf is None or recvbuf.size in (0, ref.size)))
    chunks = _chunks(ref.nbytes, itemsize, elementwise)
    cp = _Copier()
    if dev_send and sendbuf.nbytes:
        events = [cp.copy(hsend.ctypes.data + s, sendbuf.data.ptr + s, n) for s, n in chunks] \
            if elementwise else [cp.copy(hsend.ctypes.data, sendbuf.data.ptr, sendbuf.nbytes)] * len(chunks)
    else:
        events = [None] * len(chunks)

    def piece(h, s, n):
        if h is None or h.size == 0 or not elementwise:
            return h
        return h[s // itemsize:(s + n) // itemsize]

    reqs = []
    state = {"up": 0, "last": None, "released": False}

    def test():
        while len(reqs) < len(chunks) and (events[len(reqs)] is None or events[len(reqs)].done):
            s, n = chunks[len(reqs)]
            reqs.append(transport._wrap(call(piece(hsend, s, n), piece(hrecv, s, n)), name, "all"))
        if len(reqs) < len(chunks):
            return False
        while state["up"] < len(chunks) and reqs[state["up"]].test():
            s, n = chunks[state["up"]]
            if dev_recv and recvbuf.size:
                if elementwise:
                    state["last"] = cp.copy(recvbuf.data.ptr + s, hrecv.ctypes.data + s, n)
                elif state["up"] == len(chunks) - 1:
                    state["last"] = cp.copy(recvbuf.data.ptr, hrecv.ctypes.data, recvbuf.nbytes)
            state["up"] += 1
        if state["up"] < len(chunks) or (state["last"] is not None and not state["last"].done):
            return False
        if not state["released"]:
            state["released"] = True
            cp.finish()
            for mem in taken:
                pool.give(mem)
        return True

    def cancel():
        for r in reqs:
            r.abandon()

    return Request(test, op=name, peer="all", cancel=cancel)
