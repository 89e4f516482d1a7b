"""Wire format of one ``mpi://`` message: a header, then its frames in chunks.

A message is the list of frames produced by distributed's ``to_frames``. It
travels on the connection's tag (one tag per direction) as:

1. a header, an array of ``uint64`` words::

       [kind, nframes, chunk_bytes, nbytes_0, flags_0, nbytes_1, flags_1, ...]

   ``kind`` is :data:`DATA`, :data:`CLOSE` or :data:`ACK`; ``flags`` bit 0 says
   the frame lives in CUDA device memory, bit 1 (:data:`FLAG_IPC`, with bit 0)
   that it travels as a CUDA IPC descriptor (below). At most
   :data:`INLINE_FRAMES` frames are described inline; the (size, flags) pairs of
   the others follow as a second message (the header extension);
2. every frame of non-zero size, split into chunks of at most ``chunk_bytes``
   (the sender's chunk size travels in the header, so both sides agree).

Between two processes of one host, a device frame of at least
``MPIML_DASK_IPC_BYTES`` (default 1 MiB; ``0`` turns it off) travels as an
:data:`IPC_DESCRIPTOR_BYTES`-byte descriptor instead of its bytes: the CUDA IPC
handle of the allocation that holds it, the frame's offset in it and its size.
The receiver copies the frame device to device out of the sender's memory and
answers with an :data:`ACK` (:data:`ACK_COPIED`; one per message that had such
frames, in order); the sender keeps its frames alive, and its write pending,
until then. Whether the peer can open this process's memory at all (it may not
see the device, or may not be allowed to) is asked once per connection: the
first eligible frame travels staged, with its descriptor as an extra
:data:`FLAG_IPC_PROBE` frame that the receiver tries to open and drops, and
answers :data:`ACK_PROBE_OK` or :data:`ACK_PROBE_FAILED`.

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

from ._staging import IPC_DESCRIPTOR_BYTES

__all__ = [
    "DATA",
    "CLOSE",
    "ACK",
    "ACK_COPIED",
    "ACK_PROBE_OK",
    "ACK_PROBE_FAILED",
    "FLAG_IPC",
    "FLAG_IPC_PROBE",
    "IPC_DESCRIPTOR_BYTES",
    "ipc_bytes",
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
ACK = 3
FLAG_CUDA = 1
FLAG_IPC = 2
FLAG_IPC_PROBE = 4
#: the word after an ACK's kind: what it answers
ACK_COPIED, ACK_PROBE_OK, ACK_PROBE_FAILED = 1, 2, 3
_DEFAULT_IPC_BYTES = 2**20

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


def ipc_bytes():
    """Smallest device frame sent by CUDA IPC to a process of the same host
    (``MPIML_DASK_IPC_BYTES``, default 1 MiB; 0: never)."""
    from .._config import env_number

    return env_number("MPIML_DASK_IPC_BYTES", _DEFAULT_IPC_BYTES, minimum=0, maximum=2**62, unit="bytes")


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
    if kind not in (DATA, CLOSE, ACK):
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
    ipc_min : int, optional
        Device frames of at least this many bytes travel as CUDA IPC
        descriptors (the peer is a process of this host); None: never.
    same_process : bool, default=False
        The peer is this process: IPC only where the stager allows it (CUDA
        does not let a process open its own handles).
    probe : bool, default=False
        The peer's answer to "can you open my memory?" is not known yet: send
        the first eligible frame staged, and its descriptor as a probe frame.

    Attributes
    ----------
    buffers : list
        One 1-D byte buffer per frame (host memoryview, or a device byte view).
    sizes, flags : list of int
    nbytes : int
        Payload size (excluding the header).
    staged : bool
        Some device frames go through host memory (MPI not CUDA-aware).
    ipc : list
        The device frames sent as IPC descriptors: they must stay alive until
        the peer's :data:`ACK`.
    probed : object or None
        The device frame whose descriptor went as a probe (kept alive until the
        peer answers).
    """

    def __init__(self, frames, cuda_aware, ipc_min=None, same_process=False, probe=False):
        self.buffers, self.sizes, self.flags = [], [], []
        self.staged = False
        self.ipc = []
        self.probed = None
        probe_desc = None
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
                eligible = (ipc_min is not None and dev.nbytes >= max(ipc_min, 1)
                            and (not same_process or getattr(stager, "ipc_within_process", False)))
                if eligible and not probe:
                    self.buffers.append(memoryview(stager.ipc_export(dev)))
                    self.sizes.append(IPC_DESCRIPTOR_BYTES)
                    self.flags.append(FLAG_CUDA | FLAG_IPC)
                    self.ipc.append(dev)
                    continue
                if eligible and self.probed is None:
                    probe_desc, self.probed = stager.ipc_export(dev), dev
                self.buffers.append(dev)
                self.sizes.append(int(dev.nbytes))
                self.flags.append(FLAG_CUDA)
                self.staged = self.staged or not cuda_aware
            else:
                buf = _host_bytes(frame)
                self.buffers.append(buf)
                self.sizes.append(buf.nbytes)
                self.flags.append(0)
        if probe_desc is not None:  # last, so the message's own frames keep their places
            self.buffers.append(memoryview(probe_desc))
            self.sizes.append(IPC_DESCRIPTOR_BYTES)
            self.flags.append(FLAG_IPC_PROBE)
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
        if flag & FLAG_CUDA and cuda_aware and not flag & FLAG_IPC:
            import cupy

            targets.append(cupy.empty(nbytes, dtype=cupy.uint8))
        else:
            targets.append(host_array(nbytes))
    return targets
