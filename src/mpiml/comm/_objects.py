"""Collectives of small Python objects: ``allgather_obj``, ``bcast_obj``, ``allreduce_obj``.

A mixin of :class:`~mpiml.comm.Communicator`.  Each call is one signature
round (see :mod:`mpiml.comm._signature`) that carries every rank's pickled
size and, when it fits in the round's slot, the pickle itself; larger objects
follow on the control context.  The signature (collective, call number, root
or reduction) is compared whatever ``MPIML_CHECK`` says: the round is needed
anyway, so the check is free.
"""

import pickle

import numpy as np

from ._ops import check_op
from ._signature import signature_base

__all__ = ["ObjectCollectives"]


class ObjectCollectives:
    """``allgather_obj``, ``bcast_obj`` and ``allreduce_obj`` over the signature round."""

    def _obj_round(self, kind, payload, root=0, redop=None, error=None):
        """One blocking round for an object collective: the signature, every rank's pickled
        size (``aux``) and the payload itself when it fits in the slot; returns the sizes.
        A rank whose object does not pickle (``error``) makes every rank raise."""
        rnd = self._round
        n = 0 if payload is None else len(payload)
        if 0 < n <= rnd.slot_bytes:
            rnd.slot[:n] = np.frombuffer(payload, dtype=np.uint8)
        spec = (kind, None, 0, root, redop, (), "host", None)
        self._agree(kind, signature_base(*spec, error=bool(error)), spec, aux=n, error=error)
        return rnd.aux.tolist()

    def _gathered_objs(self, kind, obj, redop=None):
        data, error = _pickled(obj)
        sizes = self._obj_round(kind, data, redop=redop, error=error)
        if max(sizes) <= self._round.slot_bytes:
            slots = self._round.slots
            return [pickle.loads(slots[r, :n].tobytes()) for r, n in enumerate(sizes)]
        return self._allgatherv_pickles(np.frombuffer(data, dtype=np.uint8), sizes)

    def allgather_obj(self, obj):
        """Small Python objects from every rank, as a list in rank order."""
        self._begin("allgather_obj")
        if self.size == 1:
            return [obj]
        return self._gathered_objs("allgather_obj", obj)

    def bcast_obj(self, obj, root=0):
        """The root's small Python object on every rank."""
        self._begin("bcast_obj")
        root = self._check_root(root)
        if self.size == 1:
            return obj
        payload, error = _pickled(obj) if self.rank == root else (None, None)
        n = self._obj_round("bcast_obj", payload, root=root, error=error)[root]
        if self.rank == root:
            if n > self._round.slot_bytes:
                buf = np.frombuffer(payload, dtype=np.uint8).copy()
                self._ctl_wait("bcast", lambda: self._ctl.native_bcast(buf, root))
            return obj
        if n <= self._round.slot_bytes:
            return pickle.loads(self._round.slots[root, :n].tobytes())
        buf = np.empty(n, dtype=np.uint8)
        self._ctl_wait("bcast", lambda: self._ctl.native_bcast(buf, root))
        return pickle.loads(buf.tobytes())

    def allreduce_obj(self, obj, op="sum"):
        """Reduce small Python objects (numbers, NumPy scalars) with ``op``."""
        self._begin("allreduce_obj")
        check_op(op)  # before any communication, so a bad op is raised on every rank alike
        values = [obj] if self.size == 1 else self._gathered_objs("allreduce_obj", obj, redop=op)
        if op == "prod":
            result = values[0]
            for v in values[1:]:
                result = result * v
            return result
        return {"sum": sum, "min": min, "max": max}[op](values)


def _pickled(obj):
    """``(bytes, None)``, or ``(None, error text)`` for an object that does not pickle."""
    try:
        return pickle.dumps(obj), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
