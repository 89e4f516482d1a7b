"""Collectives of Python objects: ``allgather_obj``, ``bcast_obj``, ``allreduce_obj``.

A mixin of :class:`~mpiml.comm.Communicator`.  Each call is one signature
round (see :mod:`mpiml.comm._signature`) that carries every rank's message
size and, when it fits in the round's slot, the message itself; larger
messages follow on the control context (one ``allgatherv`` or ``bcast``).  The
signature (collective, call number, root or reduction) is compared whatever
``MPIML_CHECK`` says: the round is needed anyway, so the check is free.

A message is the object pickled (protocol 5) with its large contiguous
buffers (NumPy arrays' data, ``bytes``/``bytearray`` of :data:`OUT_OF_BAND_BYTES`
and more) kept *out of band*: not copied into the pickle but packed after it,
each at a 64-byte aligned offset.  A receiver unpickles them as views of the
received bytes, so a large object costs one copy into the message and the
transfer, where an in-band pickle cost a copy into the pickle (its slowest
part: 40-45 ms for 27 MB here), the transfer, a copy of each received pickle
and a copy out of it.  The arrays of a gathered result share one receive
buffer (every rank's message, rank order): keeping any of them keeps it.

Message layout (bytes): an in-band pickle (first byte ``0x80``) when nothing
went out of band, else :data:`_MAGIC`, ``k`` and the pickle's length
(``uint64``), the ``k`` buffer lengths (``uint64``), the pickle, then each
buffer at the next multiple of 64; a message that travels by ``allgatherv``
is padded to a multiple of 64 so that every rank's part starts aligned.
"""

import pickle

import numpy as np

from ._ops import check_op
from ._signature import signature_base

__all__ = ["ObjectCollectives", "OUT_OF_BAND_BYTES"]

#: Buffers from this many bytes on travel out of band (smaller ones stay in the pickle: one copy is cheaper
#: than a 64-byte aligned place of their own and a length in the frame).
OUT_OF_BAND_BYTES = 4096
_MAGIC = b"MPIMLOB5"
_ALIGN = 64


class ObjectCollectives:
    """``allgather_obj``, ``bcast_obj`` and ``allreduce_obj`` over the signature round."""

    def _obj_round(self, kind, payload, root=0, redop=None, error=None):
        """One blocking round for an object collective: the signature, every rank's message
        size (``aux``) and the message itself when it fits in the slot; returns the sizes.
        A rank whose object does not pickle (``error``) makes every rank raise."""
        rnd = self._round
        n = 0 if payload is None else len(payload)
        if 0 < n <= rnd.slot_bytes:
            rnd.slot[:n] = payload
        spec = (kind, None, 0, root, redop, (), "host", None)
        self._agree(kind, signature_base(*spec, error=bool(error)), spec, aux=n, error=error)
        return rnd.aux.tolist()

    def _gathered_objs(self, kind, obj, redop=None):
        message, error = _message(obj, pad=True)
        sizes = self._obj_round(kind, message, redop=redop, error=error)
        if max(sizes) <= self._round.slot_bytes:
            slots = self._round.slots
            return [_loads(bytearray(slots[r, :n])) for r, n in enumerate(sizes)]
        counts = np.asarray(sizes, dtype=np.int64)
        out = _aligned_empty(int(counts.sum()))
        self._ctl_wait("allgatherv", lambda: self._ctl.native_allgatherv(message, out, counts))
        bounds = np.concatenate([[0], np.cumsum(counts)])
        return [_loads(out[bounds[r]:bounds[r + 1]]) for r in range(self.size)]

    def allgather_obj(self, obj):
        """Python objects from every rank, as a list in rank order.

        Large NumPy arrays in the objects arrive as views of one buffer that holds every rank's
        message (see the module's notes); an object of this rank comes back as such a copy too.
        """
        self._begin("allgather_obj")
        if self.size == 1:
            return [obj]
        return self._gathered_objs("allgather_obj", obj)

    def bcast_obj(self, obj, root=0):
        """The root's Python object on every rank (the root gets ``obj`` itself)."""
        self._begin("bcast_obj")
        root = self._check_root(root)
        if self.size == 1:
            return obj
        message, error = _message(obj) if self.rank == root else (None, None)
        n = self._obj_round("bcast_obj", message, root=root, error=error)[root]
        if self.rank == root:
            if n > self._round.slot_bytes:
                buf = message if message.flags.writeable else message.copy()   # (an in-band pickle's bytes)
                self._ctl_wait("bcast", lambda: self._ctl.native_bcast(buf, root))
            return obj
        if n <= self._round.slot_bytes:
            return _loads(bytearray(self._round.slots[root, :n]))
        buf = _aligned_empty(n)
        self._ctl_wait("bcast", lambda: self._ctl.native_bcast(buf, root))
        return _loads(buf)

    def allreduce_obj(self, obj, op="sum"):
        """Reduce Python objects (numbers, NumPy scalars or arrays) with ``op``."""
        self._begin("allreduce_obj")
        check_op(op)  # before any communication, so a bad op is raised on every rank alike
        values = [obj] if self.size == 1 else self._gathered_objs("allreduce_obj", obj, redop=op)
        if op == "prod":
            result = values[0]
            for v in values[1:]:
                result = result * v
            return result
        return {"sum": sum, "min": min, "max": max}[op](values)


def _aligned_empty(n):
    """``n`` uint8, the first at an address that is a multiple of :data:`_ALIGN`."""
    raw = np.empty(n + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start:start + n]


def _up(n):
    return -(-n // _ALIGN) * _ALIGN


def _message(obj, pad=False):
    """``(uint8 message, None)`` (see the module's layout), or ``(None, error text)`` for an object that does not
    pickle.  ``pad``: the length a multiple of 64 (a part of an ``allgatherv``)."""
    buffers = []

    def out_of_band(buf):
        try:
            raw = buf.raw()
        except BufferError:                   # (not contiguous: in band, as pickle does it)
            return True
        if raw.nbytes < OUT_OF_BAND_BYTES:
            return True
        buffers.append(raw)
        return False

    try:
        head = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not buffers:
        data = np.frombuffer(head, dtype=np.uint8)
        if pad and len(head) % _ALIGN:
            data = np.concatenate([data, np.zeros(_up(len(head)) - len(head), dtype=np.uint8)])
        return data, None
    lengths = [b.nbytes for b in buffers]
    frame = np.array([len(buffers), len(head), *lengths], dtype="<u8").tobytes()
    offsets, at = [], _up(len(_MAGIC) + len(frame) + len(head))
    for n in lengths:
        offsets.append(at)
        at = _up(at + n)
    if not pad:
        at = offsets[-1] + lengths[-1]
    message = np.empty(at, dtype=np.uint8)
    start = len(_MAGIC) + len(frame)
    message[:len(_MAGIC)] = np.frombuffer(_MAGIC, dtype=np.uint8)
    message[len(_MAGIC):start] = np.frombuffer(frame, dtype=np.uint8)
    message[start:start + len(head)] = np.frombuffer(head, dtype=np.uint8)
    ends = [start + len(head)] + [o + n for o, n in zip(offsets, lengths)]
    for o, n, raw, end in zip(offsets, lengths, buffers, ends):
        message[end:o] = 0                    # (the padding: no stale memory on the wire)
        message[o:o + n] = np.frombuffer(raw, dtype=np.uint8)
    message[ends[-1]:] = 0
    return message, None


def _loads(message):
    """The object of one message (a writable uint8 array or bytearray); out-of-band buffers become views of it."""
    view = memoryview(message).cast("B")
    if bytes(view[:len(_MAGIC)]) != _MAGIC:
        return pickle.loads(view)
    k, n_head = (int(v) for v in np.frombuffer(view[8:24], dtype="<u8"))
    lengths = [int(v) for v in np.frombuffer(view[24:24 + 8 * k], dtype="<u8")]
    start = 24 + 8 * k
    head = view[start:start + n_head]
    buffers, at = [], _up(start + n_head)
    for n in lengths:
        buffers.append(view[at:at + n])
        at = _up(at + n)
    return pickle.loads(head, buffers=buffers)
