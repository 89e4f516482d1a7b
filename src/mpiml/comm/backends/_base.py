"""The interface every transport implements.

A transport moves contiguous 1-D buffers (NumPy, or CuPy where the transport
says it can) between ranks.  Point-to-point is required; native collectives
are optional and default to ``NotImplementedError``, in which case the
communicator runs one of :mod:`mpiml.comm.algorithms` over point-to-point.

Buffers passed to a transport are always 1-D, C-contiguous and of a supported
dtype; counts for the v-variants are in elements.  Every method that can block
returns a :class:`~mpiml.comm._request.Request` so that the communicator can
wait with a timeout.
"""

__all__ = ["Transport"]


class Transport:
    """Base class of the ``mpi``, ``self``, ``nccl`` and ``ipc`` transports."""

    #: lowercase registry name
    name = "base"
    #: whether device (CuPy) buffers may be handed to this transport
    accepts_device = False
    #: whether host (NumPy) buffers may be handed to this transport
    accepts_host = True

    rank = 0
    size = 1

    # -- point to point (required) -------------------------------------------------
    def isend(self, buf, dest, tag):
        raise NotImplementedError

    def irecv(self, buf, source, tag):
        raise NotImplementedError

    # -- native collectives (optional) ---------------------------------------------
    def native_barrier(self):
        raise NotImplementedError

    def native_bcast(self, buf, root):
        raise NotImplementedError

    def native_reduce(self, sendbuf, recvbuf, op, root):
        raise NotImplementedError

    def native_allreduce(self, sendbuf, recvbuf, op):
        raise NotImplementedError

    def native_allgather(self, sendbuf, recvbuf):
        raise NotImplementedError

    def native_allgatherv(self, sendbuf, recvbuf, counts):
        raise NotImplementedError

    def native_gather(self, sendbuf, recvbuf, root):
        raise NotImplementedError

    def native_gatherv(self, sendbuf, recvbuf, counts, root):
        raise NotImplementedError

    def native_scatter(self, sendbuf, recvbuf, root):
        raise NotImplementedError

    def native_reduce_scatter(self, sendbuf, recvbuf, counts, op):
        raise NotImplementedError

    def native_scan(self, sendbuf, recvbuf, op):
        raise NotImplementedError

    def native_exscan(self, sendbuf, recvbuf, op):
        raise NotImplementedError

    def native_alltoall(self, sendbuf, recvbuf):
        raise NotImplementedError

    def has_native(self, op):
        """True if ``native_<op>`` is implemented by this transport."""
        return getattr(type(self), "native_" + op) is not getattr(Transport, "native_" + op)

    # -- control plane: small Python objects, always on the host -----------------------
    def allgather_obj(self, obj):
        raise NotImplementedError

    def bcast_obj(self, obj, root=0):
        raise NotImplementedError

    def split(self, color, key):
        raise NotImplementedError

    def close(self):
        """Release resources; idempotent."""
