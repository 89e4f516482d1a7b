"""What a collective algorithm sees: point-to-point with timeouts, and a local reduce.

Algorithms are written once against :class:`Channel` and so run over any
transport (MPI, NCCL send/recv, ...) and on host or device buffers.
"""

from .._ops import reduce_local
from .._request import waitall

__all__ = ["Channel", "split_counts", "offsets", "ceil_log"]


def split_counts(n, parts):
    """``numpy.array_split``-style block sizes: the first ``n % parts`` blocks get one more."""
    n, parts = int(n), int(parts)
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def offsets(counts):
    """Block boundaries ``[0, c0, c0 + c1, ...]`` (length ``len(counts) + 1``)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def ceil_log(p, base=2):
    """Number of rounds of a radix-``base`` tree over ``p`` ranks (0 for one rank)."""
    rounds, span = 0, 1
    while span < p:
        span *= base
        rounds += 1
    return rounds


class Channel:
    """Point-to-point for one collective call.

    Parameters
    ----------
    transport : Transport
        Moves the buffers.
    xp : module
        ``numpy`` or ``cupy``: the namespace of the buffers.
    op_name : str
        The collective being run, for error messages (``"allreduce[ring]"``).
    base_tag : int
        Tag of this call's messages; algorithms add a small phase offset (< 16).
    """

    def __init__(self, transport, xp, op_name, base_tag=0):
        self.transport = transport
        self.xp = xp
        self.rank = transport.rank
        self.size = transport.size
        self.op_name = op_name
        self.base_tag = base_tag
        self.reductions = 0  # number of local reductions, for cost accounting

    # -- buffers ---------------------------------------------------------------------
    def empty(self, n, dtype):
        return self.xp.empty(int(n), dtype=dtype)

    # -- point to point -------------------------------------------------------------
    def isend(self, buf, dest, tag=0):
        req = self.transport.isend(buf, dest, self.base_tag + tag)
        req.op = self.op_name
        return req

    def irecv(self, buf, source, tag=0):
        req = self.transport.irecv(buf, source, self.base_tag + tag)
        req.op = self.op_name
        return req

    def send(self, buf, dest, tag=0):
        self.isend(buf, dest, tag).wait()

    def recv(self, buf, source, tag=0):
        self.irecv(buf, source, tag).wait()
        return buf

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        """Send to ``dest`` and receive from ``source`` at once (no deadlock in rings).

        Either side may be skipped by passing ``None`` as its peer.
        """
        reqs = []
        if source is not None:
            reqs.append(self.irecv(recvbuf, source, tag))
        if dest is not None:
            reqs.append(self.isend(sendbuf, dest, tag))
        self.waitall(reqs)
        return recvbuf

    def waitall(self, requests):
        waitall(requests, op=self.op_name)

    def pipelined(self, name, buf):
        """The transport's own pipelined form of algorithm ``name`` for ``buf``, or None.

        A blocking callable taking the algorithm's buffer arguments.  An MPI that is
        not CUDA-aware has one for device buffers (``"allreduce_ring"``,
        ``"bcast_chain"``, ``"allgather_ring"``): it overlaps the copies through
        host memory with the messages.
        """
        hook = getattr(self.transport, "pipelined", None)
        start = hook(name, buf) if hook is not None else None
        if start is None:
            return None

        def run(*args):
            req = start(*args)
            req.op = self.op_name
            req.wait()

        return run

    # -- computation ------------------------------------------------------------------
    def reduce(self, op, inbuf, inoutbuf):
        """``inoutbuf = op(inbuf, inoutbuf)`` in place."""
        self.reductions += 1
        return reduce_local(self.xp, op, inbuf, inoutbuf)

    def copy(self, src, dst):
        """Copy ``src`` into ``dst`` (same length)."""
        if src.size:
            dst[...] = src
        return dst
