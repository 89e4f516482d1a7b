"""Prefix reductions: recursive doubling (Hillis-Steele) and a linear chain.

Recursive doubling: in round ``s`` rank ``r`` sends its running window
``op(x[r - 2**s + 1 .. r])`` to ``r + 2**s`` and combines the window received
from ``r - 2**s`` on the left, so lower ranks' data is always the left operand:
``ceil(log2 p)(alpha + n beta + 2 (n gamma + launch))``.

Linear: rank ``r`` waits for the prefix of ``r - 1``, combines and forwards it:
``(p - 1)(alpha + n beta + n gamma + launch)``; best for tiny communicators.
"""

from ._channel import ceil_log
from ._registry import register

__all__ = []


def _doubling(ch, sendbuf, recvbuf, op, exclusive):
    p, r = ch.size, ch.rank
    n = sendbuf.size
    # window: op over x[max(0, r - 2**s + 1) .. r]; for scan it is the result itself
    window = ch.copy(sendbuf, ch.empty(n, sendbuf.dtype) if exclusive else recvbuf)
    if p == 1:
        return
    tmp = ch.empty(n, sendbuf.dtype)
    have_prefix = False  # exscan: recvbuf holds op over x[.. r - 1] once something arrived
    dist = 1
    while dist < p:
        dest = r + dist if r + dist < p else None
        source = r - dist if r >= dist else None
        ch.sendrecv(window, dest, tmp, source, 1)
        if source is not None:
            if exclusive:
                if have_prefix:
                    ch.reduce(op, tmp, recvbuf)
                else:
                    ch.copy(tmp, recvbuf)
                    have_prefix = True
            if dest is not None or not exclusive:
                ch.reduce(op, tmp, window)
        dist <<= 1


def _linear(ch, sendbuf, recvbuf, op, exclusive):
    p, r = ch.size, ch.rank
    if not exclusive:
        ch.copy(sendbuf, recvbuf)
    if r > 0:
        prefix = ch.recv(ch.empty(sendbuf.size, sendbuf.dtype), r - 1, 1)
        if exclusive:
            ch.copy(prefix, recvbuf)
        else:
            ch.reduce(op, prefix, recvbuf)
    if r < p - 1:
        if not exclusive:
            ch.send(recvbuf, r + 1, 1)
        elif r == 0:
            ch.send(sendbuf, r + 1, 1)
        else:
            ch.send(ch.reduce(op, prefix, ch.copy(sendbuf, ch.empty(sendbuf.size, sendbuf.dtype))), r + 1, 1)


def _doubling_cost(n, p, m):
    return ceil_log(p) * (m.alpha + n * m.beta + 2 * (n * m.gamma + m.launch))


def _linear_cost(n, p, m):
    return (p - 1) * (m.alpha + n * m.beta + n * m.gamma + m.launch)


@register("scan", "recursive_doubling", _doubling_cost)
def scan_recursive_doubling(ch, sendbuf, recvbuf, op):
    """Hillis-Steele inclusive scan: ``ceil(log2 p)(alpha + n beta + 2 (n gamma + launch))``."""
    _doubling(ch, sendbuf, recvbuf, op, False)


@register("exscan", "recursive_doubling", _doubling_cost)
def exscan_recursive_doubling(ch, sendbuf, recvbuf, op):
    """Hillis-Steele exclusive scan: ``ceil(log2 p)(alpha + n beta + 2 (n gamma + launch))``."""
    _doubling(ch, sendbuf, recvbuf, op, True)


@register("scan", "linear", _linear_cost)
def scan_linear(ch, sendbuf, recvbuf, op):
    """Chain: ``(p - 1)(alpha + n beta + n gamma + launch)``."""
    _linear(ch, sendbuf, recvbuf, op, False)


@register("exscan", "linear", _linear_cost)
def exscan_linear(ch, sendbuf, recvbuf, op):
    """Chain: ``(p - 1)(alpha + n beta + n gamma + launch)``."""
    _linear(ch, sendbuf, recvbuf, op, True)
