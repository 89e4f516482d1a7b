"""All-to-all exchange: pairwise and linear.

``sendbuf`` holds ``p`` equal blocks; block ``j`` goes to rank ``j``, and the
block received from rank ``j`` lands in block ``j`` of ``recvbuf``.  With ``n``
bytes per rank (all blocks):

* pairwise: ``p - 1`` steps, one partner each (``r XOR k`` when ``p`` is a power of
  two, else send to ``r + k`` and receive from ``r - k``):
  ``(p - 1)(alpha + n/p beta)``; never more than one message in flight per link;
* linear: every send and receive posted at once: ``(p - 1) alpha + (p - 1)/p n beta``
  when the network overlaps them, worse under contention.
"""

from ._registry import register

__all__ = []


@register("alltoall", "pairwise", lambda n, p, m: (p - 1) * (m.alpha + n / max(p, 1) * m.beta))
def alltoall_pairwise(ch, sendbuf, recvbuf):
    """Pairwise exchange: ``(p - 1)(alpha + n/p beta)``."""
    p, r = ch.size, ch.rank
    b = sendbuf.size // p
    ch.copy(sendbuf[r * b:(r + 1) * b], recvbuf[r * b:(r + 1) * b])
    pow2 = p & (p - 1) == 0
    for k in range(1, p):
        if pow2:
            dest = source = r ^ k
        else:
            dest, source = (r + k) % p, (r - k) % p
        ch.sendrecv(sendbuf[dest * b:(dest + 1) * b], dest,
                    recvbuf[source * b:(source + 1) * b], source, 1)


@register("alltoall", "linear",
          lambda n, p, m: (p - 1) * m.alpha + (p - 1) / max(p, 1) * n * m.beta)
def alltoall_linear(ch, sendbuf, recvbuf):
    """All receives and sends posted at once: ``(p - 1) alpha + (p - 1)/p n beta``."""
    p, r = ch.size, ch.rank
    b = sendbuf.size // p
    reqs = [ch.irecv(recvbuf[j * b:(j + 1) * b], j, 1) for j in range(p) if j != r]
    reqs += [ch.isend(sendbuf[j * b:(j + 1) * b], j, 1) for j in range(p) if j != r]
    ch.copy(sendbuf[r * b:(r + 1) * b], recvbuf[r * b:(r + 1) * b])
    ch.waitall(reqs)
