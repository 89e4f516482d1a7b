"""Recursive doubling and halving: allreduce, allgather(v), Rabenseifner, dissemination barrier.

All of them run among ``p2`` (the largest power of two <= p) "active" ranks.
The non-power-of-two fix-up: with ``rem = p - p2``, each even rank ``2i < 2 rem``
first hands its data to rank ``2i + 1`` and sits out; the active ranks are the
odd ones below ``2 rem`` and every rank from ``2 rem`` on, renumbered
``0 .. p2 - 1`` in rank order, so that new rank ``i`` holds a contiguous range of
original ranks.  At the end each odd rank sends the result back to its partner.

Costs, ``L = log2 p2``, ``n`` bytes, ``f = 1`` if p is not a power of two else 0:

* recursive doubling allreduce: ``(L + 2 f)(alpha + n beta) + (L + f)(n gamma + launch)``;
* recursive doubling allgather(v) (n = total bytes): ``(L + 2 f) alpha + (1 + f) n beta``;
* Rabenseifner allreduce: ``2 L alpha + 2 n beta + n gamma + L launch`` (asymptotically
  ``2 (p - 1)/p n beta``), plus ``2 f (alpha + n beta)`` for the fix-up;
* Rabenseifner reduce: reduce-scatter by halving + binomial gather of the blocks;
* Rabenseifner reduce_scatter: halving only: ``L alpha + n (beta + gamma)``;
* dissemination barrier: ``ceil(log2 p) alpha``.
"""

from ._channel import ceil_log, offsets, split_counts
from ._registry import register

__all__ = ["Fold"]

# phase tags: keep the messages of different phases apart
_FOLD, _STEP, _GATHER, _UNFOLD, _TO_ROOT = 1, 2, 3, 4, 5


class Fold:
    """The non-power-of-two renumbering of one communicator.

    Attributes
    ----------
    p2 : int
        Number of active ranks (a power of two).
    rem : int
        ``p - p2``: number of ranks that sit out.
    newrank : int
        This rank's number among the active ranks, ``-1`` if it sits out.
    """

    def __init__(self, rank, p):
        self.p = p
        self.p2 = 1 << (p.bit_length() - 1)
        self.rem = p - self.p2
        self.rank = rank
        if rank < 2 * self.rem:
            self.newrank = rank // 2 if rank % 2 else -1
        else:
            self.newrank = rank - self.rem

    @property
    def partner(self):
        """Folding partner (``None`` for ranks that are not folded)."""
        if self.rank >= 2 * self.rem:
            return None
        return self.rank + 1 if self.rank % 2 == 0 else self.rank - 1

    def real(self, newrank):
        """Original rank of active rank ``newrank``."""
        return 2 * newrank + 1 if newrank < self.rem else newrank + self.rem

    def first(self, newrank):
        """First original rank whose data active rank ``newrank`` holds (``p`` for ``p2``)."""
        return 2 * newrank if newrank < self.rem else newrank + self.rem


def _f(p):
    return 0 if p & (p - 1) == 0 else 1


def _L(p):
    return max(p.bit_length() - 1, 0)


def doubling_allgather(ch, buf, nbounds, fold, tag=_GATHER):
    """Among active ranks, new rank ``i`` owns ``buf[nbounds[i]:nbounds[i + 1]]``; afterwards all do."""
    nr, mask = fold.newrank, 1
    while mask < fold.p2:
        pn = nr ^ mask
        mine, theirs = nr & ~(mask - 1), pn & ~(mask - 1)
        ch.sendrecv(buf[nbounds[mine]:nbounds[mine + mask]], fold.real(pn),
                    buf[nbounds[theirs]:nbounds[theirs + mask]], fold.real(pn), tag)
        mask <<= 1


def halving_reduce_scatter(ch, acc, tmp, nbounds, op, fold, tag=_STEP):
    """Recursive halving among active ranks: new rank ``i`` ends with the reduced
    ``acc[nbounds[i]:nbounds[i + 1]]`` (other parts of ``acc`` are scratch)."""
    nr = fold.newrank
    lo, hi = 0, fold.p2
    mask = fold.p2 >> 1
    while mask:
        pn = nr ^ mask
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if nr & mask else ((lo, mid), (mid, hi))
        ks, ke = nbounds[keep[0]], nbounds[keep[1]]
        t = tmp[:ke - ks]
        ch.sendrecv(acc[nbounds[give[0]]:nbounds[give[1]]], fold.real(pn), t, fold.real(pn), tag)
        ch.reduce(op, t, acc[ks:ke])
        lo, hi = keep
        mask >>= 1


def _fold_in(ch, fold, acc, tmp, op):
    """Folded-away ranks hand ``acc`` to their partner, which reduces it (lower rank left)."""
    if fold.partner is None:
        return
    if fold.newrank < 0:
        ch.send(acc, fold.partner, _FOLD)
    else:
        ch.recv(tmp, fold.partner, _FOLD)
        ch.reduce(op, tmp, acc)


def _fold_out(ch, fold, buf):
    """The partner sends the finished ``buf`` back to the folded-away rank."""
    if fold.partner is None:
        return
    if fold.newrank < 0:
        ch.recv(buf, fold.partner, _UNFOLD)
    else:
        ch.send(buf, fold.partner, _UNFOLD)


# ------------------------------------------------------------------ allreduce
def _rd_allreduce_cost(n, p, m):
    L, f = _L(p), _f(p)
    return (L + 2 * f) * (m.alpha + n * m.beta) + (L + f) * (n * m.gamma + m.launch)


@register("allreduce", "recursive_doubling", _rd_allreduce_cost)
def allreduce_recursive_doubling(ch, sendbuf, recvbuf, op):
    """Exchange whole vectors with partner ``newrank ^ 2**s``; both reduce
    op(lower rank's data, higher rank's data), so every rank gets identical bits:
    ``(L + 2 f)(alpha + n beta) + (L + f)(n gamma + launch)``."""
    acc = ch.copy(sendbuf, recvbuf)
    if ch.size == 1:
        return
    fold = Fold(ch.rank, ch.size)
    tmp = ch.empty(sendbuf.size, sendbuf.dtype)
    _fold_in(ch, fold, acc, tmp, op)
    if fold.newrank >= 0:
        mask = 1
        while mask < fold.p2:
            pn = fold.newrank ^ mask
            ch.sendrecv(acc, fold.real(pn), tmp, fold.real(pn), _STEP)
            if fold.newrank > pn:
                ch.reduce(op, tmp, acc)          # acc = op(partner's, mine)
            else:
                ch.reduce(op, acc, tmp)          # tmp = op(mine, partner's)
                acc, tmp = tmp, acc
            mask <<= 1
        if acc is not recvbuf:
            ch.copy(acc, recvbuf)
    _fold_out(ch, fold, recvbuf)


def _rabenseifner_cost(n, p, m):
    L, f = _L(p), _f(p)
    frac = (p - 1) / p if p > 1 else 0.0
    return (2 * L * m.alpha + 2 * frac * n * m.beta + frac * n * m.gamma + L * m.launch
            + 2 * f * (m.alpha + n * m.beta) + f * (n * m.gamma + m.launch))


@register("allreduce", "rabenseifner", _rabenseifner_cost)
def allreduce_rabenseifner(ch, sendbuf, recvbuf, op):
    """Recursive-halving reduce-scatter, then recursive-doubling allgather:
    ``2 L alpha + 2 (p-1)/p n beta + (p-1)/p n gamma + L launch`` (+ fix-up
    ``2 f (alpha + n beta)``).  Each block is reduced on one rank only."""
    acc = ch.copy(sendbuf, recvbuf)
    if ch.size == 1:
        return
    fold = Fold(ch.rank, ch.size)
    tmp = ch.empty(sendbuf.size, sendbuf.dtype)
    _fold_in(ch, fold, acc, tmp, op)
    if fold.newrank >= 0:
        nbounds = offsets(split_counts(sendbuf.size, fold.p2))
        halving_reduce_scatter(ch, acc, tmp, nbounds, op, fold)
        doubling_allgather(ch, acc, nbounds, fold)
    _fold_out(ch, fold, recvbuf)


@register("reduce", "rabenseifner",
          lambda n, p, m: _rabenseifner_cost(n, p, m) + m.alpha + n * m.beta)
def reduce_rabenseifner(ch, sendbuf, recvbuf, op, root):
    """Recursive-halving reduce-scatter, binomial gather of the blocks to active
    rank 0, which forwards to the root if it is another rank:
    ``2 L alpha + 2 (p-1)/p n beta + (p-1)/p n gamma`` (+ fix-up, + ``alpha + n beta``
    when the root is not active rank 0)."""
    if ch.size == 1:
        ch.copy(sendbuf, recvbuf)
        return
    fold = Fold(ch.rank, ch.size)
    gather_rank = fold.real(0)
    n = sendbuf.size
    acc = recvbuf if ch.rank == root and ch.rank == gather_rank else ch.empty(n, sendbuf.dtype)
    ch.copy(sendbuf, acc)
    tmp = ch.empty(n, sendbuf.dtype)
    _fold_in(ch, fold, acc, tmp, op)
    if fold.newrank >= 0:
        nbounds = offsets(split_counts(n, fold.p2))
        halving_reduce_scatter(ch, acc, tmp, nbounds, op, fold)
        nr, mask = fold.newrank, 1
        while mask < fold.p2:  # binomial gather: rank nr holds blocks [nr, nr + mask)
            if nr & mask:
                ch.send(acc[nbounds[nr]:nbounds[nr + mask]], fold.real(nr - mask), _GATHER)
                break
            ch.recv(acc[nbounds[nr + mask]:nbounds[nr + 2 * mask]], fold.real(nr + mask), _GATHER)
            mask <<= 1
    if root != gather_rank:
        if ch.rank == gather_rank:
            ch.send(acc, root, _TO_ROOT)
        elif ch.rank == root:
            ch.recv(recvbuf, gather_rank, _TO_ROOT)


@register("reduce_scatter", "rabenseifner",
          lambda n, p, m: _L(p) * (m.alpha + m.launch) + n * (m.beta + m.gamma)
          + _f(p) * 2 * (m.alpha + n * m.beta))
def reduce_scatter_rabenseifner(ch, sendbuf, recvbuf, counts, op):
    """Recursive halving over the blocks of the active ranks (each the union of
    its original ranks' blocks): ``L alpha + n (beta + gamma) + L launch`` (+ fix-up)."""
    p = ch.size
    bounds = offsets(counts)
    r = ch.rank
    if p == 1:
        ch.copy(sendbuf, recvbuf)
        return
    fold = Fold(r, p)
    acc = ch.copy(sendbuf, ch.empty(sendbuf.size, sendbuf.dtype))
    tmp = ch.empty(sendbuf.size, sendbuf.dtype)
    _fold_in(ch, fold, acc, tmp, op)
    if fold.newrank >= 0:
        nbounds = [bounds[fold.first(i)] for i in range(fold.p2 + 1)]
        halving_reduce_scatter(ch, acc, tmp, nbounds, op, fold)
        if fold.partner is not None:  # hand the partner its block
            q = fold.partner
            ch.send(acc[bounds[q]:bounds[q + 1]], q, _UNFOLD)
        ch.copy(acc[bounds[r]:bounds[r + 1]], recvbuf)
    else:
        ch.recv(recvbuf, fold.partner, _UNFOLD)


# ------------------------------------------------------------------ allgather
def _rd_allgather_cost(n, p, m):
    L, f = _L(p), _f(p)
    return (L + 2 * f) * m.alpha + (1 + f) * n * m.beta


def allgatherv_doubling(ch, sendbuf, recvbuf, counts):
    """Recursive-doubling allgather of ``counts[r]`` elements per rank, any ``p``."""
    p, r = ch.size, ch.rank
    bounds = offsets(counts)
    ch.copy(sendbuf, recvbuf[bounds[r]:bounds[r + 1]])
    if p == 1:
        return
    fold = Fold(r, p)
    if fold.partner is not None:
        if fold.newrank < 0:
            ch.send(sendbuf, fold.partner, _FOLD)
        else:
            q = fold.partner
            ch.recv(recvbuf[bounds[q]:bounds[q + 1]], q, _FOLD)
    if fold.newrank >= 0:
        nbounds = [bounds[fold.first(i)] for i in range(fold.p2 + 1)]
        doubling_allgather(ch, recvbuf, nbounds, fold, _STEP)
    _fold_out(ch, fold, recvbuf)


@register("allgather", "recursive_doubling", _rd_allgather_cost)
def allgather_recursive_doubling(ch, sendbuf, recvbuf):
    """Exchange doubling ranges with partner ``newrank ^ 2**s``:
    ``(L + 2 f) alpha + (1 + f) n beta`` (n = total bytes)."""
    allgatherv_doubling(ch, sendbuf, recvbuf, [sendbuf.size] * ch.size)


@register("allgatherv", "recursive_doubling", _rd_allgather_cost)
def allgatherv_recursive_doubling(ch, sendbuf, recvbuf, counts):
    """Recursive doubling over uneven blocks: ``(L + 2 f) alpha + (1 + f) n beta``."""
    allgatherv_doubling(ch, sendbuf, recvbuf, counts)


# ------------------------------------------------------------------ barrier
@register("barrier", "recursive_doubling", lambda n, p, m: ceil_log(p) * m.alpha)
def barrier_dissemination(ch):
    """Dissemination: in round s, signal rank + 2**s and wait for rank - 2**s:
    ``ceil(log2 p) alpha``, any ``p``."""
    p, r = ch.size, ch.rank
    token, inbox = ch.empty(0, "uint8"), ch.empty(0, "uint8")
    dist = 1
    while dist < p:
        ch.sendrecv(token, (r + dist) % p, inbox, (r - dist) % p, _STEP)
        dist <<= 1
