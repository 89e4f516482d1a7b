"""Collectives whose ranks must first learn metadata from each other: allgatherv, gatherv, scatter.

A mixin of :class:`~mpiml.comm.Communicator`: every rank's row count (v-variants)
or the root's shape and dtype (scatter) travel in the call's signature round,
and so does the data itself when every rank's part fits the round's slot.
"""

import time

import numpy as np

from .._array import get_namespace
from . import _profile
from ._ops import SUPPORTED_DTYPES
from ._p2p import _cupy, _flat
from ._signature import signature_base

__all__ = ["MetadataCollectives"]

_MAX_NDIM = 10  # dimensions carried in scatter's metadata
_SCATTER_META = 4 + _MAX_NDIM  # int64 words of scatter's metadata in the root's slot


class MetadataCollectives:
    """allgatherv, gatherv and scatter (needs the communicator's ``_run``, ``_agree``, ``_round``, ...)."""

    def _v_call(self, op, x, root, algorithm):
        """allgatherv / gatherv: one blocking round agrees on the signature and carries every
        rank's row count (and, when every rank's rows fit, the rows themselves)."""
        self._begin(op)
        start = time.perf_counter()
        if root is not None:
            root = self._check_root(root)
        x, xp = self._prep(x)
        x = self._lead(x)
        memory = "device" if xp is not np else "host"
        row = int(np.prod(x.shape[1:], dtype=np.int64))
        inline = (memory == "host" and algorithm is None and op not in self._tuning.override
                  and self.size > 1)
        if self.size == 1:
            rows = [x.shape[0]]
        else:
            spec = (op, x.dtype, 0, 0 if root is None else root, None, x.shape[1:], memory, algorithm)
            rnd = self._round
            if inline and x.nbytes <= rnd.slot_bytes:
                rnd.slot[:x.nbytes] = x.reshape(-1).view(np.uint8)
            rnd = self._agree(op, signature_base(*spec), spec, aux=x.shape[0])
            rows = rnd.aux.tolist()
        total = sum(rows)
        out = xp.empty((total,) + x.shape[1:], dtype=x.dtype) if root in (None, self.rank) else None
        if inline and max(rows) * row * x.itemsize <= rnd.slot_bytes:
            if out is not None:  # every rank's rows came with the round
                flat, at = out.reshape(-1).view(np.uint8), 0
                for r, k in enumerate(rows):
                    nb = k * row * x.itemsize
                    flat[at:at + nb] = rnd.slots[r, :nb]
                    at += nb
            if _profile.active():
                _profile.record(op, total * row * x.itemsize, self._world.name, "inline",
                                time.perf_counter() - start)
            return out
        counts = [int(r) * row for r in rows]
        send, recv = _flat(x), (_flat(out) if out is not None else None)
        if root is None:
            native, algo_args = (lambda t: t.native_allgatherv(send, recv, counts)), (send, recv, counts)
        else:
            native, algo_args = (lambda t: t.native_gatherv(send, recv, counts, root)), (send, recv, counts, root)
        self._run(op, total * row * x.itemsize, xp, algorithm=algorithm, native=native, algo_args=algo_args,
                  spec=(x.dtype, 0, 0 if root is None else root, None, x.shape[1:]), level=0)
        return out

    def allgatherv(self, x, *, algorithm=None):
        """Every rank's ``x`` concatenated along axis 0; first dimensions may differ."""
        return self._v_call("allgatherv", x, None, algorithm)

    def gatherv(self, x, root=0, *, algorithm=None):
        """Like :meth:`gather`, but first dimensions may differ across ranks."""
        return self._v_call("gatherv", x, root, algorithm)

    def scatter(self, x, root=0, *, algorithm=None):
        """The root's ``x`` split along axis 0 into ``size`` equal blocks; this rank's block.

        Only the root's ``x`` is read (others may pass None).  The root's shape
        and dtype travel in the signature round, and a first dimension that does
        not divide by ``size`` is the same ``ValueError`` on every rank.
        """
        self._begin("scatter")
        root = self._check_root(root)
        meta = np.zeros(_SCATTER_META, dtype=np.int64)
        error = None
        if self.rank == root:
            try:  # a bad x on a rank that thinks it is the root travels in the round
                x, xp = self._prep(x)
            except (TypeError, ValueError) as exc:
                if self.size == 1:
                    raise
                error = f"{type(exc).__name__}: {exc}"
            else:
                x = self._lead(x)
                ok = x.ndim <= _MAX_NDIM and x.shape[0] % self.size == 0
                meta[:4] = [1 if ok else 0, x.ndim, SUPPORTED_DTYPES.index(x.dtype) + 1, 1 if xp is not np else 0]
                meta[4:4 + min(x.ndim, _MAX_NDIM)] = x.shape[:_MAX_NDIM]
        if self.size > 1:  # every rank learns the root's metadata from the round
            spec = ("scatter", None, 0, root, None, (), "host", algorithm)
            rnd = self._round
            rnd.slot_view(np.int64, _SCATTER_META)[...] = meta
            rnd = self._agree("scatter", signature_base(*spec, error=bool(error)), spec, error=error)
            meta = rnd.rows(np.int64, _SCATTER_META)[root].copy()
        ok, ndim, dcode, dev = (int(v) for v in meta[:4])
        shape = tuple(int(s) for s in meta[4:4 + ndim])
        if not ok:
            raise ValueError(f"scatter: the root's array has shape {shape}; its first dimension must "
                             f"divide by the communicator size {self.size}")
        dtype = SUPPORTED_DTYPES[dcode - 1]
        xp = get_namespace(x) if self.rank == root else (np if not dev else _cupy())
        block = (shape[0] // self.size,) + shape[1:]
        out = xp.empty(block, dtype=dtype)
        send = _flat(x) if self.rank == root else None
        recv = _flat(out)
        self._run("scatter", out.nbytes * self.size, xp, algorithm=algorithm,
                  native=lambda t: t.native_scatter(send, recv, root), algo_args=(send, recv, root),
                  spec=(dtype, out.size, root, None, block), level=0)
        return out

