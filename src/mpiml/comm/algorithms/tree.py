"""Tree algorithms: binomial and k-nomial bcast / reduce, binomial gather / scatter,
tree barriers, and gather-first reduce / allreduce.

Ranks are renumbered relative to the root (``vr = (rank - root) mod p``), so any
root and any number of ranks work.  In a radix-``k`` tree, the parent of ``vr``
clears its lowest non-zero base-``k`` digit; its children add ``j * k**l``
(``j = 1 .. k-1``) for every level ``l`` below that digit.  The binomial tree is
the ``k = 2`` case.

Costs, with ``L = ceil(log2 p)`` and ``Lk = ceil(log_k p)``, ``n`` bytes:

* binomial bcast: ``L (alpha + n beta)``;
* k-nomial bcast: ``Lk (alpha + (k - 1) n beta)`` (the k - 1 sends of a level share a link);
* binomial reduce: ``L (alpha + n beta + n gamma + launch)``;
* k-nomial reduce: ``Lk (alpha + (k - 1)(n beta + n gamma + launch))``;
* binomial gather / scatter (``n`` = total bytes): ``L alpha + (p - 1)/p n beta``;
* gather-first reduce: binomial gather + ``(p - 1)(n gamma + launch)`` at the root;
* tree barriers: ``2 L alpha`` (``2 Lk alpha`` for k-nomial).
"""

from ._channel import ceil_log, offsets
from ._registry import register

__all__ = ["KNOMIAL_RADIX", "tree_bcast", "tree_reduce", "gatherv_binomial", "scatter_binomial"]

#: radix of the "knomial" algorithms
KNOMIAL_RADIX = 4


def _levels(vr, p, k):
    """``(parent_level, children)`` of relative rank ``vr`` in the radix-``k`` tree.

    ``parent_level`` is ``k**l`` of the digit cleared to reach the parent (>= p at
    the root); ``children`` are relative ranks, nearest (smallest subtree) first.
    """
    mask = 1
    while mask < p and vr % (k * mask) == 0:
        mask *= k
    children = []
    m = 1
    while m < mask:
        for j in range(1, k):
            c = vr + j * m
            if c < p:
                children.append(c)
        m *= k
    return mask, children


def _parent(vr, mask, k):
    return vr - vr % (k * mask)


def _abs(vr, root, p):
    return (vr + root) % p


def tree_bcast(ch, buf, root, k=2):
    """Radix-``k`` tree broadcast of ``buf`` (in place) from ``root``."""
    p = ch.size
    if p == 1:
        return
    vr = (ch.rank - root) % p
    mask, children = _levels(vr, p, k)
    if vr:
        ch.recv(buf, _abs(_parent(vr, mask, k), root, p))
    # farthest child (largest subtree) first
    ch.waitall([ch.isend(buf, _abs(c, root, p)) for c in reversed(children)])


def tree_reduce(ch, sendbuf, recvbuf, op, root, k=2):
    """Radix-``k`` tree reduction to ``root``; every child's buffer is received at once."""
    p = ch.size
    vr = (ch.rank - root) % p
    mask, children = _levels(vr, p, k)
    n = sendbuf.size
    if ch.rank == root:
        acc = ch.copy(sendbuf, recvbuf)
    elif children:
        acc = ch.copy(sendbuf, ch.empty(n, sendbuf.dtype))
    else:
        acc = sendbuf  # a leaf only forwards its input
    if children:
        tmps = [ch.empty(n, sendbuf.dtype) for _ in children]
        reqs = [ch.irecv(t, _abs(c, root, p)) for t, c in zip(tmps, children)]
        for req, t in zip(reqs, tmps):
            ch.waitall([req])
            ch.reduce(op, t, acc)
    if vr:
        ch.send(acc, _abs(_parent(vr, mask, k), root, p))


def _tree_barrier(ch, k):
    token = ch.empty(0, "uint8")
    tree_reduce(ch, token, token if ch.rank == 0 else None, "max", 0, k)
    tree_bcast(ch, token, 0, k)


def _log(p, k=2):
    return ceil_log(p, k)


@register("bcast", "binomial", lambda n, p, m: _log(p) * (m.alpha + n * m.beta))
def bcast_binomial(ch, buf, root):
    """Binomial tree: ``ceil(log2 p) (alpha + n beta)``."""
    tree_bcast(ch, buf, root, 2)


@register("bcast", "knomial",
          lambda n, p, m: _log(p, KNOMIAL_RADIX) * (m.alpha + (KNOMIAL_RADIX - 1) * n * m.beta))
def bcast_knomial(ch, buf, root):
    """Radix-4 tree: ``ceil(log4 p) (alpha + 3 n beta)``; fewer rounds for small messages."""
    tree_bcast(ch, buf, root, KNOMIAL_RADIX)


@register("reduce", "binomial",
          lambda n, p, m: _log(p) * (m.alpha + n * m.beta + n * m.gamma + m.launch))
def reduce_binomial(ch, sendbuf, recvbuf, op, root):
    """Binomial tree: ``ceil(log2 p) (alpha + n beta + n gamma + launch)``."""
    tree_reduce(ch, sendbuf, recvbuf, op, root, 2)


@register("reduce", "knomial",
          lambda n, p, m: _log(p, KNOMIAL_RADIX) * (
              m.alpha + (KNOMIAL_RADIX - 1) * (n * m.beta + n * m.gamma + m.launch)))
def reduce_knomial(ch, sendbuf, recvbuf, op, root):
    """Radix-4 tree: ``ceil(log4 p) (alpha + 3 (n beta + n gamma + launch))``."""
    tree_reduce(ch, sendbuf, recvbuf, op, root, KNOMIAL_RADIX)


@register("allreduce", "binomial",
          lambda n, p, m: _log(p) * (2 * m.alpha + 2 * n * m.beta + n * m.gamma + m.launch))
def allreduce_binomial(ch, sendbuf, recvbuf, op):
    """Binomial reduce to rank 0, then binomial bcast:
    ``ceil(log2 p) (2 alpha + 2 n beta + n gamma + launch)``."""
    tree_reduce(ch, sendbuf, recvbuf if ch.rank == 0 else None, op, 0, 2)
    tree_bcast(ch, recvbuf, 0, 2)


@register("allreduce", "knomial",
          lambda n, p, m: _log(p, KNOMIAL_RADIX) * (
              2 * m.alpha + (KNOMIAL_RADIX - 1) * (2 * n * m.beta + n * m.gamma + m.launch)))
def allreduce_knomial(ch, sendbuf, recvbuf, op):
    """Radix-4 reduce to rank 0, then radix-4 bcast:
    ``ceil(log4 p) (2 alpha + 3 (2 n beta + n gamma + launch))``."""
    tree_reduce(ch, sendbuf, recvbuf if ch.rank == 0 else None, op, 0, KNOMIAL_RADIX)
    tree_bcast(ch, recvbuf, 0, KNOMIAL_RADIX)


@register("barrier", "binomial", lambda n, p, m: 2 * _log(p) * m.alpha)
def barrier_binomial(ch):
    """Empty binomial reduce to rank 0, then empty binomial bcast: ``2 ceil(log2 p) alpha``."""
    _tree_barrier(ch, 2)


@register("barrier", "knomial", lambda n, p, m: 2 * _log(p, KNOMIAL_RADIX) * m.alpha)
def barrier_knomial(ch):
    """Radix-4 version of the tree barrier: ``2 ceil(log4 p) alpha``."""
    _tree_barrier(ch, KNOMIAL_RADIX)


# ------------------------------------------------------------------ gather / scatter
def _subtree(vr, p):
    """Lowest set bit of ``vr`` (the binomial subtree span; a power of two >= p for 0)."""
    mask = 1
    while mask < p and not vr & mask:
        mask <<= 1
    return mask


def gatherv_binomial(ch, sendbuf, recvbuf, counts, root):
    """Binomial gather of ``counts[r]`` elements from each rank ``r`` to ``root``.

    Each rank collects its subtree's blocks (relative ranks ``vr .. vr + span - 1``,
    contiguous in relative order) and sends them up in one message; the root
    rotates the relative order back into rank order.
    """
    p = ch.size
    vr = (ch.rank - root) % p
    rel = [int(counts[(i + root) % p]) for i in range(p)]
    off = offsets(rel)
    span = _subtree(vr, p)
    last = min(vr + span, p)
    children = []
    m = span >> 1
    while m:
        if vr + m < p:
            children.append(vr + m)
        m >>= 1
    if not children:
        if vr:
            ch.send(sendbuf, _abs(_parent(vr, span, 2), root, p))
        else:
            ch.copy(sendbuf, recvbuf)
        return
    base = off[vr]
    if vr == 0 and root == 0:
        tmp = recvbuf
    else:
        tmp = ch.empty(off[last] - base, sendbuf.dtype)
    ch.copy(sendbuf, tmp[:rel[vr]])
    reqs = []
    for c in children:
        cend = min(c + _subtree(c, p), p)
        reqs.append(ch.irecv(tmp[off[c] - base:off[cend] - base], _abs(c, root, p)))
    ch.waitall(reqs)
    if vr:
        ch.send(tmp, _abs(_parent(vr, span, 2), root, p))
    elif root != 0:
        # relative blocks [0, p - root) are ranks root..p-1; the rest are ranks 0..root-1
        head = off[p] - off[p - root]
        ch.copy(tmp[:off[p - root]], recvbuf[head:])
        ch.copy(tmp[off[p - root]:], recvbuf[:head])


@register("gatherv", "binomial",
          lambda n, p, m: _log(p) * m.alpha + (p - 1) / max(p, 1) * n * m.beta)
def gatherv_binomial_alg(ch, sendbuf, recvbuf, counts, root):
    """Binomial gather of uneven blocks: ``ceil(log2 p) alpha + (p - 1)/p n beta``."""
    gatherv_binomial(ch, sendbuf, recvbuf, counts, root)


@register("gather", "binomial",
          lambda n, p, m: _log(p) * m.alpha + (p - 1) / max(p, 1) * n * m.beta)
def gather_binomial(ch, sendbuf, recvbuf, root):
    """Binomial gather: ``ceil(log2 p) alpha + (p - 1)/p n beta`` (n = total bytes)."""
    gatherv_binomial(ch, sendbuf, recvbuf, [sendbuf.size] * ch.size, root)


def scatter_binomial(ch, sendbuf, recvbuf, root):
    """Binomial scatter of equal blocks: each rank receives its subtree's blocks once."""
    p = ch.size
    n = recvbuf.size
    vr = (ch.rank - root) % p
    span = _subtree(vr, p)
    if vr == 0:
        if root == 0:
            tmp = sendbuf
        else:  # rotate into relative order: blocks of ranks root..p-1, then 0..root-1
            tmp = ch.empty(p * n, recvbuf.dtype)
            ch.copy(sendbuf[root * n:], tmp[:(p - root) * n])
            ch.copy(sendbuf[:root * n], tmp[(p - root) * n:])
    else:
        width = min(span, p - vr)
        tmp = recvbuf if width == 1 else ch.empty(width * n, recvbuf.dtype)
        ch.recv(tmp, _abs(_parent(vr, span, 2), root, p))
    reqs = []
    m = span >> 1
    while m:
        c = vr + m
        if c < p:
            reqs.append(ch.isend(tmp[m * n:(m + min(m, p - c)) * n], _abs(c, root, p)))
        m >>= 1
    if tmp is not recvbuf:
        ch.copy(tmp[:n], recvbuf)
    ch.waitall(reqs)


@register("scatter", "binomial",
          lambda n, p, m: _log(p) * m.alpha + (p - 1) / max(p, 1) * n * m.beta)
def scatter_binomial_alg(ch, sendbuf, recvbuf, root):
    """Binomial scatter: ``ceil(log2 p) alpha + (p - 1)/p n beta`` (n = total bytes)."""
    scatter_binomial(ch, sendbuf, recvbuf, root)


# ------------------------------------------------------------------ gather first
def _gather_first(ch, sendbuf, recvbuf, op, root):
    p, n = ch.size, sendbuf.size
    if p == 1:
        ch.copy(sendbuf, recvbuf)
        return
    blocks = ch.empty(p * n, sendbuf.dtype) if ch.rank == root else None
    gatherv_binomial(ch, sendbuf, blocks, [n] * p, root)
    if ch.rank != root:
        return
    ch.copy(blocks[:n], recvbuf)
    for r in range(1, p):  # rank order, so the result does not depend on the root
        ch.reduce(op, blocks[r * n:(r + 1) * n], recvbuf)


def _gather_first_cost(n, p, m):
    return _log(p) * m.alpha + (p - 1) * (n * m.beta + n * m.gamma + m.launch)


@register("reduce", "gather_first", _gather_first_cost)
def reduce_gather_first(ch, sendbuf, recvbuf, op, root):
    """Binomial gather to the root, which reduces in rank order:
    ``ceil(log2 p) alpha + (p - 1)(n beta + n gamma + launch)``."""
    _gather_first(ch, sendbuf, recvbuf, op, root)


@register("allreduce", "gather_first",
          lambda n, p, m: _gather_first_cost(n, p, m) + _log(p) * (m.alpha + n * m.beta))
def allreduce_gather_first(ch, sendbuf, recvbuf, op):
    """Gather-first reduce to rank 0, then binomial bcast:
    ``2 ceil(log2 p) alpha + (p - 1)(n beta + n gamma + launch) + ceil(log2 p) n beta``."""
    _gather_first(ch, sendbuf, recvbuf, op, 0)
    tree_bcast(ch, recvbuf, 0, 2)
