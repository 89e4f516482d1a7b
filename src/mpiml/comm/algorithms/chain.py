"""Pipelined chain broadcast.

The ranks form a chain starting at the root (``root, root + 1, ...`` mod p); the
buffer is cut into segments of ``MPIML_CHAIN_SEGMENT`` bytes (default
:data:`CHAIN_SEGMENT_BYTES`) and each rank forwards segment ``i`` while it
receives segment ``i + 1``.  With ``S = ceil(n / s)`` segments of ``s`` bytes:
``(p - 2 + S)(alpha + s beta)``, about ``n beta`` for large messages, whatever ``p``.
"""

import math

from ._registry import register

__all__ = ["CHAIN_SEGMENT_BYTES", "chain_segment_bytes"]

#: default segment size in bytes (override with ``MPIML_CHAIN_SEGMENT``)
CHAIN_SEGMENT_BYTES = 1 << 17


def chain_segment_bytes():
    """Segment size in bytes: ``MPIML_CHAIN_SEGMENT`` if set, else :data:`CHAIN_SEGMENT_BYTES`."""
    from ..._config import env_number

    return env_number("MPIML_CHAIN_SEGMENT", CHAIN_SEGMENT_BYTES, minimum=1, unit="bytes")


def _chain_cost(n, p, m):
    if p <= 1:
        return 0.0
    s = min(chain_segment_bytes(), max(n, 1))
    segments = max(1, math.ceil(n / s))
    return (p - 2 + segments) * (m.alpha + s * m.beta)


@register("bcast", "chain", _chain_cost)
def bcast_chain(ch, buf, root):
    """Pipelined chain from the root: ``(p - 2 + S)(alpha + s beta)``.

    Device buffers over an MPI that is not CUDA-aware take the transport's
    pipelined staged chain (:mod:`mpiml.comm.backends._pipeline`)."""
    p = ch.size
    n = buf.size
    if p == 1 or n == 0:
        return
    staged = ch.pipelined("bcast_chain", buf)
    if staged is not None:
        return staged(buf, root)
    vr = (ch.rank - root) % p
    prev = (ch.rank - 1) % p if vr else None
    nxt = (ch.rank + 1) % p if vr < p - 1 else None
    seg = max(1, chain_segment_bytes() // buf.itemsize)
    pieces = [buf[i:i + seg] for i in range(0, n, seg)]
    if prev is None:
        ch.waitall([ch.isend(piece, nxt) for piece in pieces])
        return
    recvs = [ch.irecv(piece, prev) for piece in pieces]
    sends = []
    for req, piece in zip(recvs, pieces):
        ch.waitall([req])
        if nxt is not None:
            sends.append(ch.isend(piece, nxt))
    ch.waitall(sends)
