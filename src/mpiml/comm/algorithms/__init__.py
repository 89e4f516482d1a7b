"""Collective algorithms written once over point-to-point (see :class:`Channel`).

Signatures, all buffers 1-D and contiguous (host or device), counts in elements:

===============  =====================================================
op               call
===============  =====================================================
barrier          ``fn(ch)``
bcast            ``fn(ch, buf, root)`` (in place)
reduce           ``fn(ch, sendbuf, recvbuf, op, root)`` (recvbuf None off root)
allreduce        ``fn(ch, sendbuf, recvbuf, op)``
allgather        ``fn(ch, sendbuf, recvbuf)``
allgatherv       ``fn(ch, sendbuf, recvbuf, counts)``
gather           ``fn(ch, sendbuf, recvbuf, root)`` (recvbuf None off root)
gatherv          ``fn(ch, sendbuf, recvbuf, counts, root)``
scatter          ``fn(ch, sendbuf, recvbuf, root)`` (sendbuf None off root)
reduce_scatter   ``fn(ch, sendbuf, recvbuf, counts, op)``
scan, exscan     ``fn(ch, sendbuf, recvbuf, op)`` (exscan leaves rank 0's recvbuf alone)
alltoall         ``fn(ch, sendbuf, recvbuf)``
===============  =====================================================
"""

from . import alltoall, chain, linear, recursive_doubling, ring, scan, tree  # noqa: F401  (register)
from ._channel import Channel
from ._registry import (
    ALGORITHM_NAMES,
    ALGORITHMS,
    COLLECTIVES,
    Algorithm,
    CostModel,
    algorithm_names,
    get_algorithm,
    register,
)

__all__ = [
    "Channel", "Algorithm", "CostModel", "ALGORITHMS", "ALGORITHM_NAMES", "COLLECTIVES",
    "algorithm_names", "get_algorithm", "register",
]
