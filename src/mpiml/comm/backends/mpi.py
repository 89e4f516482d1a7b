"""The ``mpi`` transport: mpi4py point-to-point and MPI's own (nonblocking) collectives.

Every blocking step is a nonblocking MPI call polled by
:class:`~mpiml.comm._request.Request`, so ``MPIML_TIMEOUT`` applies to native
collectives too.  Device (CuPy) buffers are handed to MPI only when it is
CUDA-aware; otherwise they are staged through host memory by
:mod:`mpiml.comm.backends._staging`.
"""

from functools import partial

import numpy as np

from ..._errors import CommError
from .._request import Request
from ._base import Transport

__all__ = ["MPITransport", "mpi_module"]


def mpi_module():
    """Import mpi4py's MPI lazily, with an error that names the package to install."""
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - mpi4py is a core dependency
        from ..._errors import BackendUnavailableError

        raise BackendUnavailableError(
            "the 'mpi' backend needs mpi4py and an MPI library: pip install mpi4py mpich"
        ) from exc
    return MPI


#: requests given up after a timeout, kept alive until MPI completes (or cancels) them
_ABANDONED = []


def _quiet_test(mpi_req):
    try:
        return mpi_req.Test()
    except Exception:
        return True


def _byte_view(buf):
    return buf.reshape(-1).view(np.uint8)


class _Float16Ops:
    """User-defined MPI ops for float16 (MPI has no half type); built once."""

    _ops = None

    @classmethod
    def get(cls, MPI, op):
        if cls._ops is None:
            def make(ufunc):
                def fn(inbuf, inoutbuf, datatype):
                    a = np.frombuffer(inbuf, dtype=np.float16)
                    b = np.frombuffer(inoutbuf, dtype=np.float16)
                    ufunc(a, b, out=b)
                return MPI.Op.Create(fn, commute=True)

            cls._ops = {"sum": make(np.add), "prod": make(np.multiply),
                        "min": make(np.minimum), "max": make(np.maximum)}
        return cls._ops[op]


class MPITransport(Transport):
    """Transport over an mpi4py communicator (which it owns once created by :meth:`dup`)."""

    name = "mpi"
    accepts_device = True  # through staging unless MPI is CUDA-aware

    def __init__(self, mpi_comm, *, owned=False, cuda_aware=None):
        self.MPI = mpi_module()
        self.comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self._owned = owned
        self._cuda_aware = cuda_aware

    # -- setup ------------------------------------------------------------------------
    def dup(self):
        return type(self)(self.comm.Dup(), owned=True, cuda_aware=self._cuda_aware)

    def split(self, color, key):
        MPI = self.MPI
        new = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        if new == MPI.COMM_NULL:
            return None
        return type(self)(new, owned=True, cuda_aware=self._cuda_aware)

    def close(self):
        if self._owned and self.comm is not None:
            try:
                self.comm.Free()
            except Exception:
                pass
            self.comm = None
            self._owned = False

    @property
    def cuda_aware(self):
        if self._cuda_aware is None:
            from ._staging import mpi_is_cuda_aware

            self._cuda_aware = mpi_is_cuda_aware(self.MPI)
        return self._cuda_aware

    # -- datatypes and ops ----------------------------------------------------------------
    def _typed(self, buf):
        """``[buffer, MPI datatype]`` for a host buffer."""
        MPI = self.MPI
        dt = buf.dtype
        if dt == np.float16:
            return [buf.view(np.uint16), MPI.UINT16_T]
        if dt == np.bool_:
            return [buf.view(np.uint8), MPI.UINT8_T]
        return [buf, MPI._typedict[dt.char]]

    def _mpi_op(self, op, dtype):
        MPI = self.MPI
        if dtype == np.float16:
            return _Float16Ops.get(MPI, op)
        if dtype == np.bool_:  # 0/1 bytes: or == max, and == min
            return {"sum": MPI.MAX, "prod": MPI.MIN, "min": MPI.MIN, "max": MPI.MAX}[op]
        return {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}[op]

    def _wrap(self, mpi_req, op, peer, finish=None, cancellable=False):
        def test():
            try:
                return mpi_req.Test()
            except self.MPI.Exception as exc:
                raise CommError(f"{op} with rank {peer} failed in MPI: {exc}") from exc

        def abandon():
            # After a timeout: a pending receive is cancelled so that it cannot swallow a
            # later message; any request MPI may still complete is kept (with its buffers,
            # which mpi4py's request references) so MPI never writes into freed memory.
            if cancellable:
                try:
                    mpi_req.Cancel()
                except self.MPI.Exception:
                    pass
            _ABANDONED[:] = [r for r in _ABANDONED if not _quiet_test(r)]
            _ABANDONED.append(mpi_req)

        return Request(test, op=op, peer=peer, result=finish, cancel=abandon)

    # -- device buffers -----------------------------------------------------------------------
    def _is_device(self, buf):
        return type(buf).__module__.startswith("cupy")

    def pipelined(self, name, buf):
        """The pipelined staged form of algorithm ``name`` for ``buf``, or None.

        ``name`` is ``"allreduce_ring"``, ``"bcast_chain"`` or ``"allgather_ring"``.
        Only device buffers over an MPI that is not CUDA-aware have one (see
        :mod:`mpiml.comm.backends._pipeline`): the chunks' copies overlap the
        messages, instead of every message being staged on its own.  It returns
        a request.
        """
        if not self._is_device(buf) or self.cuda_aware:
            return None
        from . import _pipeline

        return partial(getattr(_pipeline, {"allreduce_ring": "ring_allreduce", "bcast_chain": "chain_bcast",
                                           "allgather_ring": "ring_allgather"}[name]), self)

    # -- point to point -----------------------------------------------------------------------
    def isend(self, buf, dest, tag):
        if self._is_device(buf) and not self.cuda_aware:
            from ._staging import staged_isend

            return staged_isend(self, buf, dest, tag)
        if self._is_device(buf):
            buf.__cuda_array_interface__  # noqa: B018 - CUDA-aware MPI takes it directly
            req = self.comm.Isend([buf, self.MPI.BYTE], dest, tag)
        else:
            req = self.comm.Isend([_byte_view(buf), self.MPI.BYTE], dest, tag)
        return self._wrap(req, "send", dest)

    def irecv(self, buf, source, tag):
        if self._is_device(buf) and not self.cuda_aware:
            from ._staging import staged_irecv

            return staged_irecv(self, buf, source, tag)
        if self._is_device(buf):
            req = self.comm.Irecv([buf, self.MPI.BYTE], source, tag)
        else:
            req = self.comm.Irecv([_byte_view(buf), self.MPI.BYTE], source, tag)
        return self._wrap(req, "recv", source, cancellable=True)

    # -- native collectives ----------------------------------------------------------------------
    # Device buffers go through _native, which stages them when MPI is not CUDA-aware.
    def _native(self, name, call, sendbuf, recvbuf, peer="all"):
        if (self._is_device(sendbuf) or self._is_device(recvbuf)) and not self.cuda_aware:
            from ._staging import staged_native

            return staged_native(self, name, call, sendbuf, recvbuf)
        return self._wrap(call(sendbuf, recvbuf), name, peer)

    def native_barrier(self):
        return self._wrap(self.comm.Ibarrier(), "barrier", "all")

    def native_bcast(self, buf, root):
        return self._native("bcast", lambda s, r: self.comm.Ibcast(self._typed(r), root), buf, buf, root)

    def native_reduce(self, sendbuf, recvbuf, op, root):
        mop = self._mpi_op(op, sendbuf.dtype)
        if recvbuf is None:
            recvbuf = sendbuf[:0] if self.rank != root else None
        return self._native(
            "reduce",
            lambda s, r: self.comm.Ireduce(self._typed(s), self._typed(r) if self.rank == root else None, mop, root),
            sendbuf, recvbuf, root)

    def native_allreduce(self, sendbuf, recvbuf, op):
        mop = self._mpi_op(op, sendbuf.dtype)
        return self._native("allreduce",
                            lambda s, r: self.comm.Iallreduce(self._typed(s), self._typed(r), mop),
                            sendbuf, recvbuf)

    def native_allgather(self, sendbuf, recvbuf):
        return self._native("allgather",
                            lambda s, r: self.comm.Iallgather(self._typed(s), self._typed(r)),
                            sendbuf, recvbuf)

    def _vspec(self, buf, counts):
        counts = [int(c) for c in counts]
        displs = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()
        b, t = self._typed(buf)
        return [b, counts, displs, t]

    def native_allgatherv(self, sendbuf, recvbuf, counts):
        return self._native("allgatherv",
                            lambda s, r: self.comm.Iallgatherv(self._typed(s), self._vspec(r, counts)),
                            sendbuf, recvbuf)

    def native_gather(self, sendbuf, recvbuf, root):
        if recvbuf is None:
            recvbuf = sendbuf[:0]
        return self._native(
            "gather",
            lambda s, r: self.comm.Igather(self._typed(s), self._typed(r) if self.rank == root else None, root),
            sendbuf, recvbuf, root)

    def native_gatherv(self, sendbuf, recvbuf, counts, root):
        if recvbuf is None:
            recvbuf = sendbuf[:0]
        return self._native(
            "gatherv",
            lambda s, r: self.comm.Igatherv(self._typed(s), self._vspec(r, counts) if self.rank == root else None, root),
            sendbuf, recvbuf, root)

    def native_scatter(self, sendbuf, recvbuf, root):
        if sendbuf is None:
            sendbuf = recvbuf[:0]
        return self._native(
            "scatter",
            lambda s, r: self.comm.Iscatter(self._typed(s) if self.rank == root else None, self._typed(r), root),
            sendbuf, recvbuf, root)

    def native_reduce_scatter(self, sendbuf, recvbuf, counts, op):
        mop = self._mpi_op(op, sendbuf.dtype)
        counts = [int(c) for c in counts]
        return self._native(
            "reduce_scatter",
            lambda s, r: self.comm.Ireduce_scatter(self._typed(s), self._typed(r), counts, mop),
            sendbuf, recvbuf)

    def native_scan(self, sendbuf, recvbuf, op):
        mop = self._mpi_op(op, sendbuf.dtype)
        return self._native("scan", lambda s, r: self.comm.Iscan(self._typed(s), self._typed(r), mop),
                            sendbuf, recvbuf)

    def native_exscan(self, sendbuf, recvbuf, op):
        mop = self._mpi_op(op, sendbuf.dtype)
        return self._native("exscan", lambda s, r: self.comm.Iexscan(self._typed(s), self._typed(r), mop),
                            sendbuf, recvbuf)

    def native_alltoall(self, sendbuf, recvbuf):
        return self._native("alltoall",
                            lambda s, r: self.comm.Ialltoall(self._typed(s), self._typed(r)),
                            sendbuf, recvbuf)

    # -- control plane ---------------------------------------------------------------------------
    def allgather_obj(self, obj):
        return self.comm.allgather(obj)

    def bcast_obj(self, obj, root=0):
        return self.comm.bcast(obj, root=root)
