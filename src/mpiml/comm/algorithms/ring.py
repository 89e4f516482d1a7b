"""Ring algorithms: allreduce (reduce-scatter + allgather), allgather(v), reduce_scatter.

Rank ``r`` sends to ``r + 1`` and receives from ``r - 1`` (mod p) in every
step, so each link carries ``1/p`` of the data per step and the bandwidth term
is optimal; the latency term grows linearly in ``p``.  Blocks follow
``numpy.array_split`` counts, so any length works (blocks may be empty).

Costs, ``n`` bytes (the whole vector; for allgather the whole result):

* allreduce: ``2 (p - 1) alpha + 2 (p - 1)/p n beta + (p - 1)/p n gamma + (p - 1) launch``;
* allgather(v): ``(p - 1) alpha + (p - 1)/p n beta``;
* reduce_scatter: ``(p - 1)(alpha + launch) + (p - 1)/p n (beta + gamma)``.

In allreduce every block is reduced on one chain of ranks only and then
copied around the ring, so all ranks end with identical bits.
"""

from ._channel import offsets, split_counts
from ._registry import register

__all__ = ["ring_reduce_scatter", "ring_allgather"]

_RS, _AG = 1, 2


def ring_reduce_scatter(ch, acc, bounds, op, tmp):
    """Reduce ``acc`` in place around the ring; rank ``r`` ends owning block ``r``
    (``acc[bounds[r]:bounds[r + 1]]``) reduced over all ranks."""
    p, r = ch.size, ch.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_b = (r - s - 1) % p
        recv_b = (r - s - 2) % p
        lo, hi = bounds[recv_b], bounds[recv_b + 1]
        t = tmp[:hi - lo]
        ch.sendrecv(acc[bounds[send_b]:bounds[send_b + 1]], right, t, left, _RS)
        ch.reduce(op, t, acc[lo:hi])


def ring_allgather(ch, buf, bounds):
    """Rank ``r`` owns block ``r`` of ``buf``; afterwards every rank has every block."""
    p, r = ch.size, ch.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_b = (r - s) % p
        recv_b = (r - s - 1) % p
        ch.sendrecv(buf[bounds[send_b]:bounds[send_b + 1]], right,
                    buf[bounds[recv_b]:bounds[recv_b + 1]], left, _AG)


def _frac(p):
    return (p - 1) / p if p > 0 else 0.0


@register("allreduce", "ring",
          lambda n, p, m: 2 * (p - 1) * m.alpha + 2 * _frac(p) * n * m.beta
          + _frac(p) * n * m.gamma + (p - 1) * m.launch)
def allreduce_ring(ch, sendbuf, recvbuf, op):
    """Ring reduce-scatter then ring allgather:
    ``2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma + (p-1) launch``.

    Device buffers over an MPI that is not CUDA-aware take the transport's
    pipelined staged ring (:mod:`mpiml.comm.backends._pipeline`)."""
    staged = ch.pipelined("allreduce_ring", sendbuf) if ch.size > 1 and sendbuf.size else None
    if staged is not None:
        return staged(sendbuf, recvbuf, op)
    ch.copy(sendbuf, recvbuf)
    p = ch.size
    if p == 1 or sendbuf.size == 0:
        return
    counts = split_counts(sendbuf.size, p)
    bounds = offsets(counts)
    tmp = ch.empty(counts[0], sendbuf.dtype)
    ring_reduce_scatter(ch, recvbuf, bounds, op, tmp)
    ring_allgather(ch, recvbuf, bounds)


def allgatherv_ring(ch, sendbuf, recvbuf, counts):
    bounds = offsets(counts)
    r = ch.rank
    ch.copy(sendbuf, recvbuf[bounds[r]:bounds[r + 1]])
    if ch.size > 1:
        ring_allgather(ch, recvbuf, bounds)


@register("allgather", "ring", lambda n, p, m: (p - 1) * m.alpha + _frac(p) * n * m.beta)
def allgather_ring(ch, sendbuf, recvbuf):
    """Pass blocks around the ring: ``(p-1) alpha + (p-1)/p n beta`` (n = total bytes)."""
    staged = ch.pipelined("allgather_ring", sendbuf) if ch.size > 1 and sendbuf.size else None
    if staged is not None:
        return staged(sendbuf, recvbuf)
    allgatherv_ring(ch, sendbuf, recvbuf, [sendbuf.size] * ch.size)


@register("allgatherv", "ring", lambda n, p, m: (p - 1) * m.alpha + _frac(p) * n * m.beta)
def allgatherv_ring_alg(ch, sendbuf, recvbuf, counts):
    """Pass uneven blocks around the ring: ``(p-1) alpha + (p-1)/p n beta``."""
    allgatherv_ring(ch, sendbuf, recvbuf, counts)


@register("reduce_scatter", "ring",
          lambda n, p, m: (p - 1) * (m.alpha + m.launch) + _frac(p) * n * (m.beta + m.gamma))
def reduce_scatter_ring(ch, sendbuf, recvbuf, counts, op):
    """Ring reduce-scatter with the given counts:
    ``(p-1)(alpha + launch) + (p-1)/p n (beta + gamma)``."""
    p, r = ch.size, ch.rank
    bounds = offsets(counts)
    if p == 1:
        ch.copy(sendbuf, recvbuf)
        return
    acc = ch.copy(sendbuf, ch.empty(sendbuf.size, sendbuf.dtype))
    tmp = ch.empty(max(int(c) for c in counts), sendbuf.dtype)
    ring_reduce_scatter(ch, acc, bounds, op, tmp)
    ch.copy(acc[bounds[r]:bounds[r + 1]], recvbuf)
