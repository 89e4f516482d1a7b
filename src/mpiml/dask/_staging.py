"""Device frames through pinned host memory, in pipelined chunks, for an MPI that is not CUDA-aware.

A device frame of ``n`` bytes travels as ``ceil(n / chunk)`` MPI messages of
at most ``chunk`` bytes (``MPIML_DASK_STAGING_BYTES``, default 4 MiB), through
``k`` pinned host slots (``MPIML_DASK_STAGING_SLOTS``, default 4) used in turn:

* sender: the device-to-host copy of chunk ``i + 1`` is queued on a copy stream
  before chunk ``i`` (copied) is handed to ``MPI_Isend``, so copies overlap the
  transfers; a slot is copied into again only once its previous send completed;
* receiver: ``k`` receives are posted ahead; as chunk ``i`` arrives, its
  host-to-device copy is queued, and once it is done the slot receives chunk
  ``i + k``.

The slots come from a process-wide cache of pinned buffers (:class:`PinnedCache`):
pinned allocation (``cudaHostAlloc``) costs far more than a copy, so buffers are
allocated once and reused by every message and connection. Each message takes
its own slots (no message waits for another's), so two ranks sending to each
other at once cannot deadlock on a shared pool.

The device operations go through a *stager* (:class:`CupyStager` by default),
so that the pipeline can be exercised without a GPU (tests install a host one
with :func:`set_stager`).
"""

from __future__ import annotations

import asyncio
import os
import threading

__all__ = ["CupyStager", "PinnedCache", "get_stager", "set_stager", "pinned_cache", "staging_bytes",
           "staging_slots", "wait_event", "IPC_DESCRIPTOR_BYTES"]

_DEFAULT_BYTES = 4 * 2**20
#: a CUDA IPC frame on the wire (:meth:`CupyStager.ipc_export`): the 64-byte cudaIpcMemHandle, then
#: offset and size (uint64)
IPC_DESCRIPTOR_BYTES = 80
#: cudaMemcpyKind values (CUDA runtime ABI)
_HOST_TO_DEVICE, _DEVICE_TO_HOST, _DEFAULT = 1, 2, 4


def staging_bytes():
    """Chunk of a staged device frame (``MPIML_DASK_STAGING_BYTES``, default 4 MiB)."""
    from .._config import env_number

    return env_number("MPIML_DASK_STAGING_BYTES", _DEFAULT_BYTES, minimum=1, maximum=2**31 - 1, unit="bytes")


def staging_slots():
    """Pinned slots per staged frame (``MPIML_DASK_STAGING_SLOTS``, default 4, at least 2)."""
    from .._config import env_number

    return env_number("MPIML_DASK_STAGING_SLOTS", 4, minimum=2, maximum=64, unit="slots")


class PinnedCache:
    """Free pinned host buffers by size, shared by every connection of the process.

    Parameters
    ----------
    allocate : callable
        ``allocate(nbytes)`` returns a new 1-D ``uint8`` host buffer.
    keep : int, default=64
        Most buffers kept per size; more are dropped when returned.
    """

    def __init__(self, allocate, keep=64):
        self._allocate = allocate
        self._keep = keep
        self._free = {}
        self._lock = threading.Lock()
        self.allocations = 0

    def get(self, nbytes):
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                return free.pop()
            self.allocations += 1
        return self._allocate(nbytes)

    def put(self, buf):
        with self._lock:
            free = self._free.setdefault(buf.nbytes, [])
            if len(free) < self._keep:
                free.append(buf)


def _allocation_base(ptr):
    """Start of the device allocation holding ``ptr`` (CUDA IPC handles name whole allocations,
    and CuPy's pool hands out pieces of larger ones)."""
    global _address_range
    if _address_range is None:
        import ctypes

        fn = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        fn.restype = ctypes.c_int
        _address_range = (fn, ctypes)
    fn, ctypes = _address_range
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = fn(ctypes.byref(base), ctypes.byref(size), ptr)
    if rc != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed for a device frame (CUresult {rc})")
    return int(base.value)


_address_range = None


class CupyStager:
    """Device side of staging with CuPy: byte views, buffers, and copies on one stream per device.

    Also the CUDA IPC of device frames between processes of one host (a process
    cannot open its own IPC handles, so ``ipc_within_process`` is False).
    """

    ipc_within_process = False

    def __init__(self):
        import cupy

        self._cupy = cupy
        self._streams = {}

    @staticmethod
    def is_device(frame):
        return hasattr(frame, "__cuda_array_interface__")

    def as_bytes(self, frame):
        """A contiguous 1-D ``uint8`` CuPy view (or copy) of a device frame."""
        cupy = self._cupy
        arr = cupy.asarray(frame)
        if not arr.flags.c_contiguous:
            arr = cupy.ascontiguousarray(arr)
        return arr.reshape(-1).view(cupy.uint8)

    def empty(self, nbytes):
        return self._cupy.empty(nbytes, dtype=self._cupy.uint8)

    @staticmethod
    def allocate_pinned(nbytes):
        import cupyx
        import numpy as np

        return cupyx.empty_pinned(nbytes, dtype=np.uint8)

    def synchronize(self):
        """Wait for the kernels that produced the frames, on any stream."""
        self._cupy.cuda.Device().synchronize()

    def _stream(self):
        dev = self._cupy.cuda.Device().id
        stream = self._streams.get(dev)
        if stream is None:
            stream = self._streams[dev] = self._cupy.cuda.Stream(non_blocking=True)
        return stream

    def _copy(self, dst_ptr, src_ptr, nbytes, kind):
        cupy = self._cupy
        stream = self._stream()
        cupy.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.ptr)
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def to_host(self, src, dst):
        """Queue ``dst[:] = src`` (device -> pinned host); return an event with ``.done``."""
        return self._copy(dst.ctypes.data, src.data.ptr, src.nbytes, _DEVICE_TO_HOST)

    def to_device(self, src, dst):
        """Queue ``dst[:] = src`` (pinned host -> device); return an event with ``.done``."""
        return self._copy(dst.data.ptr, src.ctypes.data, src.nbytes, _HOST_TO_DEVICE)

    def ipc_export(self, dev):
        """The IPC descriptor of device bytes ``dev`` (``uint8``: handle, offset, size)."""
        import numpy as np

        ptr = dev.data.ptr
        base = _allocation_base(ptr)
        desc = np.zeros(IPC_DESCRIPTOR_BYTES, dtype=np.uint8)
        desc[:64] = np.frombuffer(self._cupy.cuda.runtime.ipcGetMemHandle(base), dtype=np.uint8)
        desc[64:].view(np.uint64)[:] = (ptr - base, dev.nbytes)
        return desc

    def ipc_probe(self, descriptor):
        """Whether this process can open the memory ``descriptor`` names (opens and closes it)."""
        import numpy as np

        runtime = self._cupy.cuda.runtime
        ptr = runtime.ipcOpenMemHandle(np.frombuffer(descriptor, dtype=np.uint8)[:64].tobytes(), 1)
        runtime.ipcCloseMemHandle(ptr)
        return True

    def ipc_import(self, descriptors):
        """Queue copies of the frames that ``descriptors`` name into new device buffers.

        Returns ``(buffers, event, close)``: ``close()`` unmaps the senders' memory and
        must be called once ``event`` is done. Each allocation is opened once (two frames
        of one message may share it).
        """
        import numpy as np

        runtime = self._cupy.cuda.runtime
        opened, buffers = {}, []
        stream = self._stream()
        try:
            for desc in descriptors:
                desc = np.frombuffer(desc, dtype=np.uint8)
                handle = desc[:64].tobytes()
                offset, nbytes = (int(v) for v in desc[64:].view(np.uint64))
                if handle not in opened:
                    opened[handle] = runtime.ipcOpenMemHandle(handle, 1)  # cudaIpcMemLazyEnablePeerAccess
                buf = self.empty(nbytes)
                if nbytes:
                    runtime.memcpyAsync(buf.data.ptr, opened[handle] + offset, nbytes, _DEFAULT, stream.ptr)
                buffers.append(buf)
        except Exception:
            stream.synchronize()
            for ptr in opened.values():
                runtime.ipcCloseMemHandle(ptr)
            raise
        event = self._cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)

        def close():
            for ptr in opened.values():
                runtime.ipcCloseMemHandle(ptr)

        return buffers, event, close


_stager = None
_cache = None
_lock = threading.Lock()


def get_stager():
    """The process's stager (a :class:`CupyStager` unless :func:`set_stager` installed another)."""
    global _stager
    with _lock:
        if _stager is None:
            _stager = CupyStager()
        return _stager


def set_stager(stager):
    """Install ``stager`` (an object with the methods of :class:`CupyStager`); None: back to CuPy."""
    global _stager, _cache
    with _lock:
        _stager, _cache = stager, None


def current_is_device(frame):
    """Whether ``frame`` lives on the device, for the installed stager (CuPy: CUDA array interface)."""
    stager = _stager
    if stager is None:
        return hasattr(frame, "__cuda_array_interface__")
    return stager.is_device(frame)


def pinned_cache():
    """The process's :class:`PinnedCache` for the current stager."""
    global _cache
    stager = get_stager()
    with _lock:
        if _cache is None:
            _cache = PinnedCache(stager.allocate_pinned)
        return _cache


async def wait_event(event):
    """Await a copy event (polled: the copies of one chunk take micro- to milliseconds)."""
    while not event.done:
        os.sched_yield()
        await asyncio.sleep(0)
