"""Pipelined ring and chain collectives for device buffers over an MPI that is not CUDA-aware.

The host MPI sees only pinned host memory and point-to-point messages; it never
runs one of its own collectives (Open MPI's nonblocking allreduce / bcast of
64 MiB took 30-75 ms on our GPU host: libnbc, progressed by polling).  Every
buffer is cut into chunks of ``MPIML_STAGE_CHUNK`` bytes (default 4 MiB) and
each chunk flows through its own chain of steps, so the steps of different
chunks overlap:

* copies to the host run on one stream ("down"), copies to the device and the
  reductions on another ("up"), both ordered after the caller's current stream;
  a chunk's message is sent once its copy to the host has landed, and the copy
  of a received chunk to the device is queued as soon as it has arrived;
* messages go to one neighbour and come from one neighbour, posted in the same
  order on both sides (MPI matches messages of one source and tag in order);
  receives are posted up to :data:`RECV_WINDOW` ahead.

Ring allreduce (reduce-scatter then allgather, rank ``r`` sends to ``r + 1``):
the vector is cut into ``p`` segments (``numpy.array_split`` sizes); at
reduce-scatter step ``s`` rank ``r`` receives segment ``r - s - 1``, copies it
up, reduces it with its own data on the GPU (``out = own op received``),
copies the result down and sends it on at step ``s + 1``; after ``p - 1``
steps it holds segment ``r + 1`` reduced over every rank, which the allgather
passes around the ring: each received chunk is copied up into the result and
forwarded from the same host memory.  Every segment is reduced along one chain
of ranks and then copied, so all ranks end with identical bits.

Cost (``n`` bytes, ``p`` ranks, chunks of ``c`` bytes; per rank) -- see
:func:`ring_allreduce_cost`:

    bytes down ``n``, bytes up ``2 (p-1)/p n``, bytes on the wire ``2 (p-1)/p n`` each way;
    ``T = max(n / B_down, 2 (p-1)/p n / B_up, 2 (p-1)/p n beta)            (the busiest engine)
        + (2 (p-1) + 2) (alpha + c beta') + c / B_down + c / B_up          (filling the pipeline)
        + chunks * o``                                                       (host time per chunk)

where ``beta'`` is the slowest per-byte stage.  The chain broadcast moves ``n``
down at the root, ``n`` up elsewhere and ``n`` over each link:
``T = max(n / B, n beta) + (p - 1)(alpha + c beta) + chunks * o``.

The staging memory is pinned, from the transport's pool (reused across calls):
``2 n`` for allreduce (``n`` for sends, ``n`` for receives: the allgather
reuses a chunk's receive memory only after the reduce-scatter's copy of it to
the device has finished), ``n`` for bcast and allgather; plus ``n`` of device
scratch for allreduce.

The copies, reductions and events go through an *engine* (:class:`CupyEngine`
here); the schedule itself only asks whether an event is done, so it is tested
on the CPU with an engine whose "device" is NumPy and whose streams run late.
"""

from functools import partial

from .._ops import _UFUNC
from ..algorithms._channel import offsets, split_counts
from ._stream import SpinRequest

__all__ = ["CupyEngine", "ring_allreduce", "chain_bcast", "ring_allgather", "ring_allreduce_cost",
           "chain_bcast_cost", "StagingModel", "RECV_WINDOW", "TAG"]

#: tag of the pipelined collectives' messages (on the communicator's collective context)
TAG = 0x5D47
#: receives posted ahead of the oldest one not yet arrived
RECV_WINDOW = 16

_WAIT = object()  # a send not ready, or a receive not yet allowed, until a step before it sets it


# ---------------------------------------------------------------------------------------- costs
class StagingModel:
    """Constants of the staged cost formulas (seconds, bytes per second).

    ``down`` / ``up``: device-to-host / host-to-device copy bandwidth seen by one
    rank; ``beta``: seconds per byte of the host MPI's point-to-point; ``alpha``:
    its latency; ``per_chunk``: host (Python) time per chunk and step.  The defaults
    are the order of magnitude of one H200 host (PCIe 5 copies ~53 GB/s).
    """

    def __init__(self, alpha=5e-6, beta=1 / 10e9, down=50e9, up=50e9, per_chunk=30e-6):
        self.alpha, self.beta, self.down, self.up, self.per_chunk = alpha, beta, down, up, per_chunk


def ring_allreduce_cost(nbytes, p, chunk, model=None):
    """Seconds of a pipelined staged ring allreduce of ``nbytes`` over ``p`` ranks (formula above)."""
    m = model or StagingModel()
    if p <= 1 or nbytes <= 0:
        return 0.0
    frac = 2 * (p - 1) / p
    c = min(chunk, max(1, nbytes // p))
    chunks = 2 * (p - 1) * max(1, -(-nbytes // (p * c)))
    slowest = max(1 / m.down, 1 / m.up, m.beta)
    busiest = max(nbytes / m.down, frac * nbytes / m.up, frac * nbytes * m.beta)
    fill = (2 * (p - 1) + 2) * (m.alpha + c * slowest) + c / m.down + c / m.up
    return busiest + fill + chunks * m.per_chunk


def chain_bcast_cost(nbytes, p, chunk, model=None):
    """Seconds of a pipelined staged chain broadcast of ``nbytes`` over ``p`` ranks."""
    m = model or StagingModel()
    if p <= 1 or nbytes <= 0:
        return 0.0
    c = min(chunk, nbytes)
    chunks = -(-nbytes // c)
    return max(nbytes / min(m.down, m.up), nbytes * m.beta) + (p - 1) * (m.alpha + c * m.beta) \
        + chunks * m.per_chunk


# ---------------------------------------------------------------------------------------- engine
class CupyEngine:
    """Copies and reductions on two CUDA streams ("down": to the host; "up": to the device and
    reductions), both ordered after the caller's current stream; pinned memory from ``pool``."""

    _streams = {}  # device -> (down, up): made once per process and device

    def __init__(self, pool):
        import cupy

        self.cupy = cupy
        dev = cupy.cuda.runtime.getDevice()
        pair = self._streams.get(dev)
        if pair is None:
            pair = self._streams[dev] = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))
        self.down, self.up = pair
        self.user = cupy.cuda.get_current_stream()
        start = self._record(self.user)
        self.down.wait_event(start)  # the copies see what the caller's stream wrote before the call
        self.up.wait_event(start)
        self._memcpy = cupy.cuda.runtime.memcpyAsync
        self._pool = pool
        self._taken = []

    def _record(self, stream):
        ev = self.cupy.cuda.Event(block=False, disable_timing=True)
        ev.record(stream)
        return ev

    def host(self, nbytes):
        """Pinned host memory: a NumPy uint8 array of ``nbytes``."""
        token, view = self._pool.take(nbytes)
        self._taken.append(token)
        return view

    def device(self, n, dtype):
        return self.cupy.empty(int(n), dtype=dtype)

    def d2h(self, host, dev, after=None):
        """Queue a copy of device array ``dev`` into host bytes ``host`` (after event ``after``)."""
        if after is not None:
            self.down.wait_event(after)
        if host.nbytes:
            self._memcpy(host.ctypes.data, dev.data.ptr, host.nbytes, 4, self.down.ptr)
        return self._record(self.down)

    def h2d(self, dev, host):
        """Queue a copy of host bytes ``host`` into device array ``dev``."""
        if host.nbytes:
            self._memcpy(dev.data.ptr, host.ctypes.data, host.nbytes, 4, self.up.ptr)
        return self._record(self.up)

    def copy(self, dst, src):
        """Queue a device-to-device copy (on the "up" stream)."""
        if src.nbytes:
            self._memcpy(dst.data.ptr, src.data.ptr, src.nbytes, 4, self.up.ptr)
        return self._record(self.up)

    def reduce(self, op, a, b, out):
        """Queue ``out = op(a, b)`` elementwise on the "up" stream (after its copies)."""
        if out.size:
            with self.up:
                getattr(self.cupy, _UFUNC[op])(a, b, out=out)
        return self._record(self.up)

    @staticmethod
    def done(event):
        return event.done

    def finish(self):
        """After every event was seen done: order the caller's stream, give the pinned memory back."""
        self.user.wait_event(self._record(self.up))
        for token in self._taken:
            self._pool.give(token)
        self._taken = []

    def keep(self):
        """After a failure: never hand the pinned memory out again (MPI may still write into it)."""
        self._taken = []


# ---------------------------------------------------------------------------------------- schedule
_ABANDONED = []  # schedules given up after a timeout, with their buffers, kept alive


class _Schedule:
    """Ordered sends to ``dest`` and ordered receives from ``source``, advanced by polling.

    ``sends[i] = [host_bytes, ready]``: ``ready`` is :data:`_WAIT` until a step
    sets it, then True or an engine event; sends are posted in list order.
    ``recvs[i] = [host_bytes, gate, on_arrival]``: posted in list order once
    ``gate`` (None, :data:`_WAIT` or an event) allows, at most
    :data:`RECV_WINDOW` outstanding; ``on_arrival()`` queues what follows and
    returns an event to wait for before completion (or None).
    """

    def __init__(self, transport, engine, dest, source, sends, recvs, keep=()):
        self.t, self.e = transport, engine
        self.dest, self.source = dest, source
        self.sends, self.recvs = sends, recvs
        self.next_send = 0
        self.next_recv = 0
        self.inflight = []      # receive requests posted, oldest first: (index, request)
        self.sent = []          # send requests posted
        self.tail = []          # events that must be done before the call is
        self.keep = keep        # device arrays the queued work uses
        self.finished = False

    def _allowed(self, gate):
        return gate is None or (gate is not _WAIT and (gate is True or self.e.done(gate)))

    def test(self):
        if self.finished:
            return True
        e, recvs, sends = self.e, self.recvs, self.sends
        while self.next_recv < len(recvs) and len(self.inflight) < RECV_WINDOW \
                and self._allowed(recvs[self.next_recv][1]):
            i = self.next_recv
            self.inflight.append((i, self.t.irecv(recvs[i][0], self.source, TAG)))
            self.next_recv += 1
        while self.inflight and self.inflight[0][1].test():
            i, _ = self.inflight.pop(0)
            ev = recvs[i][2]()
            if ev is not None:
                self.tail.append(ev)
        while self.next_send < len(sends):
            view, ready = sends[self.next_send]
            if ready is _WAIT or not (ready is True or e.done(ready)):
                break
            self.sent.append(self.t.isend(view, self.dest, TAG))
            self.next_send += 1
        if self.next_send < len(sends) or self.next_recv < len(recvs) or self.inflight:
            return False
        self.sent = [r for r in self.sent if not r.test()]
        if self.sent:
            return False
        while self.tail and e.done(self.tail[0]):
            self.tail.pop(0)
        if self.tail:
            return False
        self.finished = True
        e.finish()
        return True

    def cancel(self):
        for _, req in self.inflight:
            req.abandon()
        for req in self.sent:
            req.abandon()
        self.e.keep()
        _ABANDONED.append(self)

    def request(self, op, peer="all"):
        return SpinRequest(self.test, op=op, peer=peer, cancel=self.cancel)


def _pieces(lo, hi, step):
    return [(s, min(s + step, hi)) for s in range(lo, hi, step)]


def _engine(transport, engine):
    if engine is not None:
        return engine
    from ._staging import _pool

    return CupyEngine(_pool(transport))


def _chunk(chunk_bytes, itemsize):
    if chunk_bytes is None:
        from ._staging import _chunk_bytes

        chunk_bytes = _chunk_bytes()
    return max(1, int(chunk_bytes) // itemsize)


# ---------------------------------------------------------------------------------------- collectives
def ring_allreduce(transport, sendbuf, recvbuf, op, *, engine=None, chunk_bytes=None):
    """Start a pipelined staged ring allreduce of device ``sendbuf`` into ``recvbuf``; a request.

    ``sendbuf`` may be ``recvbuf`` (in place); otherwise they must not overlap.
    """
    p, r = transport.size, transport.rank
    n, isz, dtype = sendbuf.size, sendbuf.itemsize, sendbuf.dtype
    e = _engine(transport, engine)
    if p == 1 or n == 0:
        sched = _Schedule(transport, e, None, None, [], [])
        if recvbuf is not sendbuf:
            sched.tail.append(e.copy(recvbuf, sendbuf))
        return sched.request("allreduce")
    step = _chunk(chunk_bytes, isz)
    bounds = offsets(split_counts(n, p))
    pieces = [_pieces(bounds[j], bounds[j + 1], step) for j in range(p)]
    hsend, hrecv = e.host(n * isz), e.host(n * isz)
    scratch = e.device(n, dtype)

    def hb(h, lo, hi):
        return h[lo * isz:hi * isz]

    sends, send_at = [], {}
    for s in range(p - 1):                       # reduce-scatter: segment r - s (own data at s = 0)
        for lo, hi in pieces[(r - s) % p]:
            send_at["rs", s, lo] = len(sends)
            sends.append([hb(hsend, lo, hi), _WAIT])
    for t in range(p - 1):                       # allgather: segment r + 1 - t (own result at t = 0)
        for lo, hi in pieces[(r + 1 - t) % p]:
            send_at["ag", t, lo] = len(sends)
            sends.append([hb(hsend if t == 0 else hrecv, lo, hi), _WAIT])
    for lo, hi in pieces[r]:
        sends[send_at["rs", 0, lo]][1] = e.d2h(hb(hsend, lo, hi), sendbuf[lo:hi])

    recvs, ag_recv_at = [], {}

    def reduce_scatter_arrival(s, lo, hi):
        up = e.h2d(scratch[lo:hi], hb(hrecv, lo, hi))
        red = e.reduce(op, sendbuf[lo:hi], scratch[lo:hi], recvbuf[lo:hi])
        nxt = ("rs", s + 1, lo) if s < p - 2 else ("ag", 0, lo)
        sends[send_at[nxt]][1] = e.d2h(hb(hsend, lo, hi), recvbuf[lo:hi], after=red)
        if lo in ag_recv_at:  # the allgather reuses this receive memory once the copy up is done
            recvs[ag_recv_at[lo]][1] = up
        return red

    def allgather_arrival(t, lo, hi):
        if t < p - 2:
            sends[send_at["ag", t + 1, lo]][1] = True
        return e.h2d(recvbuf[lo:hi], hb(hrecv, lo, hi))

    for s in range(p - 1):                       # reduce-scatter: segment r - s - 1 arrives
        for lo, hi in pieces[(r - s - 1) % p]:
            recvs.append([hb(hrecv, lo, hi), None, partial(reduce_scatter_arrival, s, lo, hi)])
    for t in range(p - 1):                       # allgather: segment r - t arrives
        seg = (r - t) % p
        for lo, hi in pieces[seg]:
            ag_recv_at[lo] = len(recvs)
            # segment r never arrives in the reduce-scatter: its memory is free from the start
            recvs.append([hb(hrecv, lo, hi), None if seg == r else _WAIT, partial(allgather_arrival, t, lo, hi)])
    sched = _Schedule(transport, e, (r + 1) % p, (r - 1) % p, sends, recvs,
                      keep=(sendbuf, recvbuf, scratch, hsend, hrecv))
    return sched.request("allreduce")


def chain_bcast(transport, buf, root, *, engine=None, chunk_bytes=None):
    """Start a pipelined staged chain broadcast of device ``buf`` (in place) from ``root``; a request."""
    p, r = transport.size, transport.rank
    e = _engine(transport, engine)
    n, isz = buf.size, buf.itemsize
    if p == 1 or n == 0:
        return _Schedule(transport, e, None, None, [], []).request("bcast")
    vr = (r - root) % p
    step = _chunk(chunk_bytes, isz)
    pieces = _pieces(0, n, step)
    h = e.host(n * isz)
    views = [h[lo * isz:hi * isz] for lo, hi in pieces]
    last = vr == p - 1
    sends = [] if last else [[v, _WAIT] for v in views]
    recvs = []
    if vr == 0:
        for (lo, hi), s in zip(pieces, sends):
            s[1] = e.d2h(s[0], buf[lo:hi])
    else:
        def arrival(i, lo, hi):
            if not last:
                sends[i][1] = True  # forward from the same host memory
            return e.h2d(buf[lo:hi], views[i])

        recvs = [[v, None, partial(arrival, i, lo, hi)] for i, ((lo, hi), v) in enumerate(zip(pieces, views))]
    sched = _Schedule(transport, e, None if last else (r + 1) % p, None if vr == 0 else (r - 1) % p,
                      sends, recvs, keep=(buf, h))
    return sched.request("bcast", root)


def ring_allgather(transport, sendbuf, recvbuf, *, engine=None, chunk_bytes=None):
    """Start a pipelined staged ring allgather (equal blocks) of device ``sendbuf``; a request."""
    p, r = transport.size, transport.rank
    e = _engine(transport, engine)
    n, isz = sendbuf.size, sendbuf.itemsize
    tail = e.copy(recvbuf[r * n:(r + 1) * n], sendbuf)
    if p == 1 or n == 0:
        sched = _Schedule(transport, e, None, None, [], [])
        sched.tail.append(tail)
        return sched.request("allgather")
    step = _chunk(chunk_bytes, isz)
    h = e.host(p * n * isz)

    def hb(lo, hi):
        return h[lo * isz:hi * isz]

    def pieces(block):
        return _pieces(block * n, (block + 1) * n, step)

    sends, send_at = [], {}
    for t in range(p - 1):                       # block r - t goes right at step t
        for lo, hi in pieces((r - t) % p):
            send_at[t, lo] = len(sends)
            sends.append([hb(lo, hi), _WAIT])
    for k, (lo, hi) in enumerate(pieces(r)):
        sends[k][1] = e.d2h(hb(lo, hi), sendbuf[lo - r * n:hi - r * n])

    def arrival(t, lo, hi):
        if t < p - 2:
            sends[send_at[t + 1, lo]][1] = True
        return e.h2d(recvbuf[lo:hi], hb(lo, hi))

    recvs = [[hb(lo, hi), None, partial(arrival, t, lo, hi)]
             for t in range(p - 1) for lo, hi in pieces((r - t - 1) % p)]
    sched = _Schedule(transport, e, (r + 1) % p, (r - 1) % p, sends, recvs, keep=(sendbuf, recvbuf, h))
    sched.tail.append(tail)
    return sched.request("allgather")

