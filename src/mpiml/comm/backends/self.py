"""The ``self`` transport: a communicator of one process, no MPI needed.

It is what :func:`~mpiml.comm.get_comm` returns when the program was not started
by ``mpiexec``; every collective is a copy, point-to-point to rank 0 is matched
in a queue.
"""

from collections import deque

from .._request import CompletedRequest, Request
from ._base import Transport

__all__ = ["SelfTransport"]


def _copy(src, dst):
    if dst is not None and src is not None and dst is not src and src.size:
        dst[...] = src
    return CompletedRequest()


class SelfTransport(Transport):
    name = "self"
    accepts_device = True
    rank = 0
    size = 1

    def __init__(self):
        self._queues = {}

    def dup(self):
        return SelfTransport()

    def split(self, color, key):
        return None if color is None else SelfTransport()

    def _check_peer(self, peer):
        if peer != 0:
            raise ValueError(f"rank {peer} does not exist in a communicator of size 1")

    def isend(self, buf, dest, tag):
        self._check_peer(dest)
        self._queues.setdefault(tag, deque()).append(buf.copy())
        return CompletedRequest(op="send", peer=dest)

    def irecv(self, buf, source, tag):
        self._check_peer(source)

        def test():
            q = self._queues.get(tag)
            if not q:
                return False
            data = q.popleft()
            if data.size != buf.size:
                from ..._errors import CommError

                raise CommError(f"recv of {buf.size} elements got a message of {data.size}")
            if buf.size:
                buf[...] = data
            return True

        return Request(test, op="recv", peer=source)

    def native_barrier(self):
        return CompletedRequest()

    def native_bcast(self, buf, root):
        return CompletedRequest()

    def native_reduce(self, sendbuf, recvbuf, op, root):
        return _copy(sendbuf, recvbuf)

    def native_allreduce(self, sendbuf, recvbuf, op):
        return _copy(sendbuf, recvbuf)

    def native_allgather(self, sendbuf, recvbuf):
        return _copy(sendbuf, recvbuf)

    def native_allgatherv(self, sendbuf, recvbuf, counts):
        return _copy(sendbuf, recvbuf)

    def native_gather(self, sendbuf, recvbuf, root):
        return _copy(sendbuf, recvbuf)

    def native_gatherv(self, sendbuf, recvbuf, counts, root):
        return _copy(sendbuf, recvbuf)

    def native_scatter(self, sendbuf, recvbuf, root):
        return _copy(sendbuf, recvbuf)

    def native_reduce_scatter(self, sendbuf, recvbuf, counts, op):
        return _copy(sendbuf, recvbuf)

    def native_scan(self, sendbuf, recvbuf, op):
        return _copy(sendbuf, recvbuf)

    def native_exscan(self, sendbuf, recvbuf, op):
        return CompletedRequest()  # rank 0's result is the identity, set by the communicator

    def native_alltoall(self, sendbuf, recvbuf):
        return _copy(sendbuf, recvbuf)

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj
