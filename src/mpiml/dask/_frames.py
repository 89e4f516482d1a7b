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
then the receive for the next header.

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
    "finish_receive",
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
    """True for a frame in device memory (it has ``__cuda_array_interface__``)."""
    return hasattr(frame, "__cuda_array_interface__")


def _device_bytes(frame):
    """A contiguous 1-D ``uint8`` CuPy view (or copy) of a device frame."""
    import cupy

    arr = cupy.asarray(frame)
    if not arr.flags.c_contiguous:
        arr = cupy.ascontiguousarray(arr)
    return arr.reshape(-1).view(cupy.uint8)


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
        Hand device frames to MPI directly; otherwise copy them to pinned
        host memory first.

    Attributes
    ----------
    buffers : list
        One 1-D byte buffer per frame (host memoryview, or CuPy array when
        ``cuda_aware``).
    sizes, flags : list of int
    nbytes : int
        Payload size (excluding the header).
    """

    def __init__(self, frames, cuda_aware):
        self.buffers, self.sizes, self.flags = [], [], []
        synchronized = False
        for frame in frames:
            if is_cuda_frame(frame):
                dev = _device_bytes(frame)
                if not synchronized:
                    # Kernels that produced the frame may still run on any stream.
                    import cupy

                    cupy.cuda.Device().synchronize()
                    synchronized = True
                buf = dev if cuda_aware else _stage_to_host(dev)
                self.buffers.append(buf)
                self.sizes.append(int(dev.nbytes))
                self.flags.append(FLAG_CUDA)
            else:
                buf = _host_bytes(frame)
                self.buffers.append(buf)
                self.sizes.append(buf.nbytes)
                self.flags.append(0)
        self.nbytes = sum(self.sizes)


def _stage_to_host(dev):
    import cupyx

    host = cupyx.empty_pinned(dev.shape, dtype=dev.dtype)
    dev.get(out=host)
    return host


def receive_buffers(sizes, flags, cuda_aware):
    """Allocate one receive buffer per frame.

    Returns
    -------
    targets : list
        Where MPI writes each frame (host memoryview, CuPy array, or pinned
        staging array for a device frame when MPI is not CUDA-aware).
    """
    from distributed.protocol.utils import host_array

    targets = []
    for nbytes, flag in zip(sizes, flags):
        if flag & FLAG_CUDA:
            if cuda_aware:
                import cupy

                targets.append(cupy.empty(nbytes, dtype=cupy.uint8))
            else:
                import cupyx

                targets.append(cupyx.empty_pinned(nbytes, dtype=np.uint8))
        else:
            targets.append(host_array(nbytes))
    return targets


def finish_receive(targets, flags, cuda_aware):
    """Turn received buffers into frames (copy staged device frames to the GPU)."""
    if cuda_aware or not any(f & FLAG_CUDA for f in flags):
        return targets
    import cupy

    frames = []
    for buf, flag in zip(targets, flags):
        if flag & FLAG_CUDA:
            dev = cupy.empty(buf.shape, dtype=cupy.uint8)
            dev.set(buf)
            frames.append(dev)
        else:
            frames.append(buf)
    return frames
