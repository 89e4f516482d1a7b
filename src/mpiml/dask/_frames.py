"""Wire format of one ``mpi://`` message: a header, then its frames in chunks.

A message is the list of frames produced by distributed's ``to_frames``. It
travels on the connection's tag (one tag per direction) as:

1. a header, an array of ``uint64`` words::

       [kind, nframes, chunk_bytes, nbytes_0, flags_0, nbytes_1, flags_1, ...]

   ``kind`` is :data:`DATA` or :data:`CLOSE`; ``flags`` bit 0 says the frame
   lives in CUDA device memory. At most :data:`INLINE_FRAMES` frames are
   described inline; the (size, flags) pairs of the others follow as a second
   message (the header extension);
2. every frame of non-zero size, split into chunks of at most ``chunk_bytes``
   (the sender's chunk size travels in the header, so both sides agree).

MPI keeps messages of one (source, tag, communicator) in order, so the
receiver posts the frames' receives right after reading the header, and only
then the receive for the next header. When device frames are staged through
host memory (MPI not CUDA-aware), ``chunk_bytes`` is the staging chunk and the
device frames' chunks are sent and received through pinned slots, in order
(see :mod:`._staging`).

CuPy is imported only when a frame with ``__cuda_array_interface__`` shows up.
"""

from __future__ import annotations


import numpy as np

__all__ = [
    "DATA",
    "CLOSE",
    "HEADER_WORDS",
    "INLINE_FRAMES",
    "FLAG_CUDA",
    "chunk_bytes",
    "pack_header",
    "unpack_header",
    "unpack_extension",
    "chunks",
    "is_cuda_frame",
    "SendFrames",
    "receive_buffers",
]

DATA = 1
CLOSE = 2
FLAG_CUDA = 1

#: Size of the receive buffer posted for every header (8 KiB).
HEADER_WORDS = 1024
_FIXED_WORDS = 3
#: Frames whose (size, flags) fit in the header itself.
INLINE_FRAMES = (HEADER_WORDS - _FIXED_WORDS) // 2

_DEFAULT_CHUNK = 256 * 2**20


def chunk_bytes():
    """Largest MPI message a frame is split into (``MPIML_DASK_CHUNK_BYTES``, default 256 MiB)."""
    from .._config import env_number

    return env_number("MPIML_DASK_CHUNK_BYTES", _DEFAULT_CHUNK, minimum=1, maximum=2**31 - 1, unit="bytes")


def pack_header(kind, sizes=(), flags=(), chunk=0):
    """Return ``(header, extension)``: ``uint64`` arrays; ``extension`` may be ``None``."""
    n = len(sizes)
    pairs = np.empty(2 * n, dtype=np.uint64)
    pairs[0::2] = sizes
    pairs[1::2] = flags
    inline = min(n, INLINE_FRAMES)
    header = np.empty(_FIXED_WORDS + 2 * inline, dtype=np.uint64)
    header[:_FIXED_WORDS] = (kind, n, chunk)
    header[_FIXED_WORDS:] = pairs[: 2 * inline]
    extension = pairs[2 * inline :] if n > inline else None
    return header, extension


def unpack_header(buf):
    """Parse a received header.

    Returns
    -------
    kind : int
    chunk : int
    sizes, flags : list of int
        For the inline frames only.
    missing : int
        Number of frames described in the extension that follows.
    """
    kind, n, chunk = (int(v) for v in buf[:_FIXED_WORDS])
    if kind not in (DATA, CLOSE):
        raise ValueError(f"corrupt mpi:// header (kind {kind})")
    inline = min(n, INLINE_FRAMES)
    pairs = buf[_FIXED_WORDS : _FIXED_WORDS + 2 * inline]
    return kind, chunk, pairs[0::2].tolist(), pairs[1::2].tolist(), n - inline


def unpack_extension(buf):
    """Return ``(sizes, flags)`` of the frames described in a header extension."""
    return buf[0::2].tolist(), buf[1::2].tolist()


def chunks(buf, nbytes, chunk):
    """Yield consecutive slices of at most ``chunk`` bytes of a 1-D byte buffer."""
    for start in range(0, nbytes, chunk):
        yield buf[start : start + chunk]


def is_cuda_frame(frame):
    """True for a frame in device memory (CuPy: it has ``__cuda_array_interface__``)."""
    from ._staging import current_is_device

    return current_is_device(frame)


def _host_bytes(frame):
    """A 1-D unsigned-byte memoryview of a host frame (copied only if not contiguous)."""
    mv = memoryview(frame)
    if mv.nbytes == 0:
        return memoryview(b"")
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class SendFrames:
    """Frames of one outgoing message, ready for MPI.

    Parameters
    ----------
    frames : list
        Output of ``to_frames``: bytes-like objects or device arrays.
    cuda_aware : bool
        Hand device frames to MPI directly; otherwise they are staged through
        pinned host memory in chunks when sent (:attr:`staged`).

    Attributes
    ----------
    buffers : list
        One 1-D byte buffer per frame (host memoryview, or a device byte view).
    sizes, flags : list of int
    nbytes : int
        Payload size (excluding the header).
    staged : bool
        Some device frames go through host memory (MPI not CUDA-aware).
    """

    def __init__(self, frames, cuda_aware):
        self.buffers, self.sizes, self.flags = [], [], []
        self.staged = False
        synchronized = False
        for frame in frames:
            if is_cuda_frame(frame):
                from ._staging import get_stager

                stager = get_stager()
                dev = stager.as_bytes(frame)
                if not synchronized:
                    # Kernels that produced the frame may still run on any stream.
                    stager.synchronize()
                    synchronized = True
                self.buffers.append(dev)
                self.sizes.append(int(dev.nbytes))
                self.flags.append(FLAG_CUDA)
                self.staged = self.staged or not cuda_aware
            else:
                buf = _host_bytes(frame)
                self.buffers.append(buf)
                self.sizes.append(buf.nbytes)
                self.flags.append(0)
        self.nbytes = sum(self.sizes)


def receive_buffers(sizes, flags, cuda_aware):
    """Allocate one receive buffer per frame that MPI writes directly.

    Host frames get host buffers; device frames get device buffers when MPI is
    CUDA-aware, host buffers otherwise (only when the message is discarded:
    staged device frames are received by the channel through pinned slots).
    """
    from distributed.protocol.utils import host_array

    targets = []
    for nbytes, flag in zip(sizes, flags):
        if flag & FLAG_CUDA and cuda_aware:
            import cupy

            targets.append(cupy.empty(nbytes, dtype=cupy.uint8))
        else:
            targets.append(host_array(nbytes))
    return targets
