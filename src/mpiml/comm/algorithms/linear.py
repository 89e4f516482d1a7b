"""Linear (flat) algorithms: the root talks to every other rank directly.

They are the reference the others are tested against, and the fastest choice
for tiny communicators.  Cost with p ranks and n bytes: (p - 1)(alpha + n beta)
at the root, plus (p - 1) n gamma for reductions.
"""

from ._registry import register


def _flat(n, p, m, reduce=False):
    return (p - 1) * (m.alpha + n * m.beta + (n * m.gamma + m.launch if reduce else 0.0))


@register("barrier", "linear", lambda n, p, m: 2 * (p - 1) * m.alpha)
def barrier_linear(ch):
    """Everyone reports to rank 0, which then releases everyone: ``2 (p - 1) alpha``."""
    token = ch.empty(0, "uint8")
    if ch.rank == 0:
        ch.waitall([ch.irecv(token, r) for r in range(1, ch.size)])
        ch.waitall([ch.isend(token, r, 1) for r in range(1, ch.size)])
    else:
        ch.send(token, 0)
        ch.recv(token, 0, 1)


@register("bcast", "linear", lambda n, p, m: _flat(n, p, m))
def bcast_linear(ch, buf, root):
    """The root sends the whole buffer to every rank: ``(p - 1)(alpha + n beta)``."""
    if ch.rank == root:
        ch.waitall([ch.isend(buf, r) for r in range(ch.size) if r != root])
    else:
        ch.recv(buf, root)


@register("reduce", "linear", lambda n, p, m: _flat(n, p, m, reduce=True))
def reduce_linear(ch, sendbuf, recvbuf, op, root):
    """The root receives every buffer and reduces them in rank order:
    ``(p - 1)(alpha + n beta + n gamma + launch)``."""
    if ch.rank != root:
        ch.send(sendbuf, root)
        return
    tmp = ch.empty(sendbuf.size, sendbuf.dtype)
    ch.copy(sendbuf, recvbuf)
    for r in range(ch.size):
        if r != root:
            ch.recv(tmp, r)
            ch.reduce(op, tmp, recvbuf)


@register("gatherv", "linear", lambda n, p, m: _flat(n / max(p, 1), p, m))
def gatherv_linear(ch, sendbuf, recvbuf, counts, root):
    """The root posts one receive per rank into its slot of the result:
    ``(p - 1)(alpha + n/p beta)`` (n = total bytes)."""
    if ch.rank != root:
        ch.send(sendbuf, root)
        return
    reqs, start = [], 0
    for r, c in enumerate(counts):
        if r == root:
            ch.copy(sendbuf, recvbuf[start:start + c])
        else:
            reqs.append(ch.irecv(recvbuf[start:start + c], r))
        start += c
    ch.waitall(reqs)


@register("gather", "linear", lambda n, p, m: _flat(n / max(p, 1), p, m))
def gather_linear(ch, sendbuf, recvbuf, root):
    """Gatherv with equal counts: ``(p - 1)(alpha + n/p beta)`` (n = total bytes)."""
    gatherv_linear(ch, sendbuf, recvbuf, [sendbuf.size] * ch.size, root)


@register("scatter", "linear", lambda n, p, m: _flat(n / max(p, 1), p, m))
def scatter_linear(ch, sendbuf, recvbuf, root):
    """The root sends each rank its block: ``(p - 1)(alpha + n/p beta)`` (n = total bytes)."""
    n = recvbuf.size
    if ch.rank != root:
        ch.recv(recvbuf, root)
        return
    reqs = [ch.isend(sendbuf[r * n:(r + 1) * n], r) for r in range(ch.size) if r != root]
    ch.copy(sendbuf[root * n:(root + 1) * n], recvbuf)
    ch.waitall(reqs)
