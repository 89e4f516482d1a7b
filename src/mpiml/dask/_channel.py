"""One ``mpi://`` connection: a pair of tags between two ranks, and its receive loop.

The :class:`Channel` is the transport state behind an :class:`~mpiml.dask._backend.MPIComm`
(kept apart so that a comm nobody references any more can be garbage collected
and aborted, while its receive loop still drains the connection).

Closing is a handshake: each side sends one :data:`~._frames.CLOSE` header and
keeps receiving (and discarding) until the peer's ``CLOSE`` arrives. Because
MPI keeps one tag's messages in order, every send the peer posted before its
``CLOSE`` is matched, so no send is left waiting on a receive that never comes
and the tags can be handed out again. A side that receives ``CLOSE`` first
answers with its own. If the peer does not answer within
``distributed.comm.timeouts.tcp`` (the peer died, or its loop is stuck), the
receives are cancelled and this side's tag is retired, never reused.
"""

from __future__ import annotations

import asyncio
import collections
import logging

import numpy as np
from mpi4py import MPI

from ._frames import (
    ACK,
    ACK_COPIED,
    ACK_PROBE_FAILED,
    ACK_PROBE_OK,
    CLOSE,
    DATA,
    FLAG_CUDA,
    FLAG_IPC,
    FLAG_IPC_PROBE,
    HEADER_WORDS,
    SendFrames,
    chunk_bytes,
    chunks,
    ipc_bytes,
    pack_header,
    receive_buffers,
    unpack_extension,
    unpack_header,
)
from ._progress import get_engine, mpi_lock
from . import _staging

__all__ = ["Channel", "cuda_aware"]

logger = logging.getLogger("mpiml.dask")


def cuda_aware():
    """``MPIML_CUDA_AWARE_MPI=1`` hands device frames to MPI; anything else stages them."""
    from mpiml._config import cuda_aware_mpi

    return bool(cuda_aware_mpi())


def _drain_timeout():
    import dask
    from dask.utils import parse_timedelta

    return parse_timedelta(dask.config.get("distributed.comm.timeouts.tcp"), default="seconds")


def _ignore_error(future):
    if not future.cancelled():
        future.exception()


class Channel:
    """Both directions of one connection, owned by the running event loop.

    Parameters
    ----------
    manager : MPIManager
    peer : int
        The other side's rank.
    send_tag, recv_tag : int
        Tag of the messages to the peer / from the peer.
    local_id : int, optional
        Endpoint id to give back to the manager when the connection is gone.

    Attributes
    ----------
    inbox : collections.deque
        Frames of received messages not yet read.
    local_closed, peer_closed, close_sent : bool
    """

    def __init__(self, manager, peer, send_tag, recv_tag, local_id=None):
        self.loop = asyncio.get_running_loop()
        self.engine = get_engine(self.loop)
        self.manager = manager
        self.comm = manager.comm
        self.peer = peer
        self.send_tag = send_tag
        self.recv_tag = recv_tag
        self.local_id = local_id
        self.cuda_aware = cuda_aware()
        self.chunk = chunk_bytes()
        self.inbox = collections.deque()
        self.local_closed = False
        self.peer_closed = False
        self.close_sent = False
        self._closing = False
        self._gave_up = False
        self._reader = None
        self._pending = []
        self._close_future = None
        self._posting = None  # resolves once the last message's sends are all posted
        # device frames to a process of this host go by CUDA IPC (the peer copies them, then acks)
        local = peer == manager.rank or manager.nodes[peer] == manager.nodes[manager.rank]
        self.ipc_min = (ipc_bytes() or None) if local and not self.cuda_aware else None
        self.ipc_ok = None  # can the peer open our memory? None: not asked yet; "asking"; True; False
        self._probed = None  # the frame whose descriptor went as the question (alive until answered)
        self._acks = collections.deque()  # (future, frames) of sent messages with IPC frames, in order
        manager.channels.add(self)
        self._task = self.loop.create_task(self._receive_loop())

    # -- sending ----------------------------------------------------------------

    @property
    def can_send(self):
        return not (self.local_closed or self.peer_closed or self.close_sent)

    def prepare(self, frames):
        """The :class:`~._frames.SendFrames` of a message's frames, for this connection."""
        ask = self.ipc_min is not None and self.ipc_ok is None
        prepared = SendFrames(frames, self.cuda_aware, self.ipc_min if self.ipc_ok is True or ask else None,
                              same_process=self.peer == self.manager.rank, probe=ask)
        if prepared.probed is not None:
            self.ipc_ok, self._probed = "asking", prepared.probed
        return prepared

    def send(self, frames):
        """Post a message (a :class:`~._frames.SendFrames`); return ``(future, nbytes)``.

        The caller checked :attr:`can_send` without awaiting in between. Host
        frames are posted at once; a message with staged device frames is
        posted by a task, chunk by chunk, and the messages after it wait for
        it to be posted (one tag's messages must be posted in order).
        """
        chunk = min(self.chunk, _staging.staging_bytes()) if frames.staged else self.chunk
        header, extension = pack_header(DATA, frames.sizes, frames.flags, chunk)
        nbytes = frames.nbytes + header.nbytes + (0 if extension is None else extension.nbytes)
        if not frames.staged and (self._posting is None or self._posting.done()):
            future = self._post_now(header, extension, frames, chunk)
        else:
            previous, posted = self._posting, self.loop.create_future()
            self._posting = posted
            future = self.loop.create_task(self._post_in_order(previous, posted, header, extension, frames, chunk))
        if frames.ipc:
            # the peer reads these frames out of our memory: done (and free) once it has acked
            ack = self.loop.create_future()
            if self.peer_closed:  # its receive loop has ended: no ack will come
                from distributed.comm.core import CommClosedError

                ack.set_exception(CommClosedError(f"mpi://: rank {self.peer} has closed the connection"))
            else:
                self._acks.append((ack, frames))
            future = asyncio.gather(future, ack)
            nbytes += sum(int(dev.nbytes) for dev in frames.ipc)
        return future, nbytes

    def _post_header(self, header):
        """Post a header-only message after every message posted before it."""
        if self._posting is None or self._posting.done():
            with mpi_lock:
                req = self.comm.Isend(header, self.peer, self.send_tag)
            future = self.engine.wait([req], busy=True, buffers=header)
        else:
            previous, posted = self._posting, self.loop.create_future()
            self._posting = posted
            future = self.loop.create_task(self._post_in_order(previous, posted, header, None, SendFrames([], False),
                                                               0))
        future.add_done_callback(_ignore_error)

    def _acked(self, what):
        """The peer answered a probe, or copied the IPC frames of our oldest unacknowledged message."""
        if what in (ACK_PROBE_OK, ACK_PROBE_FAILED):
            self.ipc_ok, self._probed = what == ACK_PROBE_OK, None
            if not self.ipc_ok:
                logger.info("mpi://: rank %d cannot open this process's device memory; device frames to it "
                            "are staged through host memory", self.peer)
            return
        if what != ACK_COPIED or not self._acks:
            raise ValueError(f"mpi://: an ACK from rank {self.peer} with no IPC message pending")
        future, _ = self._acks.popleft()
        if not future.done():
            future.set_result(None)

    async def _import_ipc(self, targets, flags):
        """Copy the message's IPC frames out of the sender's memory; then ack (the sender may free them)."""
        where = [i for i, f in enumerate(flags) if f & FLAG_IPC]
        buffers, event, close = _staging.get_stager().ipc_import([targets[i] for i in where])
        try:
            await _staging.wait_event(event)
        finally:
            close()
        for i, buf in zip(where, buffers):
            targets[i] = buf
        if not self.close_sent:
            self._post_header(pack_header(ACK, chunk=ACK_COPIED)[0])
        return targets

    def _answer_probe(self, targets, flags):
        """Try to open the memory a probe frame names; answer; drop the probe from the message."""
        where = [i for i, f in enumerate(flags) if f & FLAG_IPC_PROBE]
        try:
            ok = all(_staging.get_stager().ipc_probe(targets[i]) for i in where)
        except Exception as exc:  # noqa: BLE001 - any failure means: stage instead
            logger.info("mpi://: cannot open device memory of rank %d (%s); staging instead", self.peer, exc)
            ok = False
        if not self.close_sent:
            self._post_header(pack_header(ACK, chunk=ACK_PROBE_OK if ok else ACK_PROBE_FAILED)[0])
        return [t for i, t in enumerate(targets) if i not in where]

    def _post_now(self, header, extension, frames, chunk):
        reqs = []
        with mpi_lock:
            reqs.append(self.comm.Isend(header, self.peer, self.send_tag))
            if extension is not None:
                reqs.append(self.comm.Isend(extension, self.peer, self.send_tag))
            for buf, nbytes in zip(frames.buffers, frames.sizes):
                for piece in chunks(buf, nbytes, chunk):
                    reqs.append(self.comm.Isend([piece, MPI.BYTE], self.peer, self.send_tag))
        return self.engine.wait(reqs, busy=True, buffers=(header, extension, frames))

    async def _post_in_order(self, previous, posted, header, extension, frames, chunk):
        waits = []
        try:
            if previous is not None:
                await previous
            reqs = []
            with mpi_lock:
                reqs.append(self.comm.Isend(header, self.peer, self.send_tag))
                if extension is not None:
                    reqs.append(self.comm.Isend(extension, self.peer, self.send_tag))
            waits.append(self.engine.wait(reqs, busy=True, buffers=(header, extension)))
            for buf, nbytes, flag in zip(frames.buffers, frames.sizes, frames.flags):
                if flag & FLAG_CUDA and not flag & FLAG_IPC and frames.staged:
                    waits.append(await self._send_staged(buf, nbytes, chunk))
                elif nbytes:
                    with mpi_lock:
                        reqs = [self.comm.Isend([piece, MPI.BYTE], self.peer, self.send_tag)
                                for piece in chunks(buf, nbytes, chunk)]
                    waits.append(self.engine.wait(reqs, busy=True, buffers=buf))
        finally:
            if not posted.done():
                posted.set_result(None)
        await asyncio.gather(*waits)

    async def _send_staged(self, dev, nbytes, chunk):
        """Post one device frame through pinned slots; return a future of its last sends."""
        if nbytes == 0:
            return self.engine.wait([])
        stager, cache = _staging.get_stager(), _staging.pinned_cache()
        n_chunks = -(-nbytes // chunk)
        k = min(_staging.staging_slots(), n_chunks)  # k >= 2 whenever there are 2 chunks
        slots = [cache.get(chunk) for _ in range(k)]
        sending = [None] * k
        copies = {}

        def copy_out(i):
            start, stop = i * chunk, min(nbytes, (i + 1) * chunk)
            copies[i] = stager.to_host(dev[start:stop], slots[i % k][:stop - start])

        copy_out(0)
        for i in range(n_chunks):
            if i + 1 < n_chunks:  # queue the next copy before this chunk goes to MPI
                nxt = (i + 1) % k
                if sending[nxt] is not None:
                    await sending[nxt]
                copy_out(i + 1)
            await _staging.wait_event(copies.pop(i))
            size = min(nbytes, (i + 1) * chunk) - i * chunk
            with mpi_lock:
                req = self.comm.Isend([slots[i % k][:size], MPI.BYTE], self.peer, self.send_tag)
            sending[i % k] = self.engine.wait([req], busy=True, buffers=slots[i % k])
        done = asyncio.gather(*[f for f in sending if f is not None])

        def give_back(future):
            if not future.cancelled() and future.exception() is None:
                for slot in slots:
                    cache.put(slot)

        done.add_done_callback(give_back)
        return done

    def _send_close(self):
        self.close_sent = True
        header, _ = pack_header(CLOSE)
        try:
            with mpi_lock:
                req = self.comm.Isend(header, self.peer, self.send_tag)
        except MPI.Exception as exc:  # the peer is gone
            logger.info("mpi://: cannot send CLOSE to rank %d (%s)", self.peer, exc)
            return
        self._close_future = self.engine.wait([req], busy=True, buffers=header)
        self._close_future.add_done_callback(_ignore_error)

    # -- receiving --------------------------------------------------------------

    async def next_frames(self, describe):
        """Return the frames of the next message; raise ``CommClosedError`` when closed."""
        from distributed.comm.core import CommClosedError

        while True:
            if self.local_closed:
                raise CommClosedError(f"in {describe()}: connection closed")
            if self.inbox:
                return self.inbox.popleft()
            if self.peer_closed:
                raise CommClosedError(f"in {describe()}: connection closed by the peer")
            self._reader = self.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None

    def _wake_reader(self):
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    async def _receive(self, buffers, chunk, busy):
        """Post receives for ``buffers`` (list of (buffer, nbytes)) and wait for them.

        Returns False when the channel gave up meanwhile (the data is garbage).
        """
        reqs = []
        with mpi_lock:
            for buf, nbytes in buffers:
                for piece in chunks(buf, nbytes, chunk):
                    reqs.append(self.comm.Irecv([piece, MPI.BYTE], self.peer, self.recv_tag))
        self._pending = reqs
        await self.engine.wait(reqs, busy=busy, buffers=buffers)
        self._pending = []
        return not self._gave_up

    async def _receive_staged(self, sizes, flags, chunk):
        """Receive a message with device frames staged through pinned slots (in frame order).

        Returns the frames, or None when the channel gave up meanwhile.
        """
        from distributed.protocol.utils import host_array

        frames, waits = [], []
        for nbytes, flag in zip(sizes, flags):
            if flag & FLAG_CUDA and not flag & FLAG_IPC:  # (an IPC descriptor is a host frame)
                dev = _staging.get_stager().empty(nbytes)
                if not await self._receive_device_frame(dev, nbytes, chunk):
                    return None
                frames.append(dev)
            else:
                buf = host_array(nbytes)
                with mpi_lock:
                    reqs = [self.comm.Irecv([piece, MPI.BYTE], self.peer, self.recv_tag)
                            for piece in chunks(buf, nbytes, chunk)]
                self._pending.extend(reqs)
                waits.append(self.engine.wait(reqs, busy=True, buffers=buf))
                frames.append(buf)
        await asyncio.gather(*waits)
        self._pending = []
        return None if self._gave_up else frames

    async def _receive_device_frame(self, dev, nbytes, chunk):
        """Receive one staged device frame into ``dev``: ``k`` receives ahead, copies behind."""
        if nbytes == 0:
            return True
        stager, cache = _staging.get_stager(), _staging.pinned_cache()
        n_chunks = -(-nbytes // chunk)
        k = min(_staging.staging_slots(), n_chunks)
        slots = [cache.get(chunk) for _ in range(k)]
        arrived = {}

        def post(i):
            start, stop = i * chunk, min(nbytes, (i + 1) * chunk)
            with mpi_lock:
                req = self.comm.Irecv([slots[i % k][:stop - start], MPI.BYTE], self.peer, self.recv_tag)
            self._pending.append(req)
            arrived[i] = self.engine.wait([req], busy=True, buffers=slots[i % k])

        for i in range(k):
            post(i)
        last = []
        for i in range(n_chunks):
            await arrived.pop(i)
            if self._gave_up:
                return False
            start, stop = i * chunk, min(nbytes, (i + 1) * chunk)
            event = stager.to_device(slots[i % k][:stop - start], dev[start:stop])
            if i + k < n_chunks:
                await _staging.wait_event(event)  # the slot is free again
                post(i + k)
            else:
                last.append(event)
        for event in last:
            await _staging.wait_event(event)
        for slot in slots:
            cache.put(slot)
        return True

    async def _receive_loop(self):
        try:
            while True:
                header = np.empty(HEADER_WORDS, dtype=np.uint64)
                if not await self._receive([(header, header.nbytes)], header.nbytes, busy=False):
                    return
                kind, chunk, sizes, flags, missing = unpack_header(header)
                if kind == CLOSE:
                    self.peer_closed = True
                    return
                if kind == ACK:
                    self._acked(chunk)
                    continue
                if missing:
                    ext = np.empty(2 * missing, dtype=np.uint64)
                    if not await self._receive([(ext, ext.nbytes)], ext.nbytes, busy=True):
                        return
                    more_sizes, more_flags = unpack_extension(ext)
                    sizes, flags = sizes + more_sizes, flags + more_flags
                discard = self.local_closed
                if not discard and not self.cuda_aware and any(f & FLAG_CUDA and not f & FLAG_IPC for f in flags):
                    targets = await self._receive_staged(sizes, flags, max(chunk, 1))
                    if targets is None:
                        return
                else:
                    kinds = [0] * len(flags) if discard else flags
                    targets = receive_buffers(sizes, kinds, self.cuda_aware)
                    if not await self._receive(list(zip(targets, sizes)), max(chunk, 1), busy=True):
                        return
                if not self.local_closed and any(f & FLAG_IPC for f in flags):
                    targets = await self._import_ipc(targets, flags)
                if not self.local_closed and any(f & FLAG_IPC_PROBE for f in flags):
                    targets = self._answer_probe(targets, flags)
                if not self.local_closed:
                    self.inbox.append(targets)
                    self._wake_reader()
        except asyncio.CancelledError:
            # The event loop is going away: take the receives back from MPI now and
            # retire the tag (the peer may still send on it).
            self.cancel_receive_now()
            raise
        except MPI.Exception as exc:
            logger.info("mpi://: receiving from rank %d failed (%s); closing", self.peer, exc)
        except Exception:
            logger.exception("mpi://: receive loop from rank %d failed; closing", self.peer)
        finally:
            self._finish()

    def _finish(self):
        self.peer_closed = True
        self._pending = []
        while self._acks:  # the peer is gone or closed: it will not copy our frames any more
            from distributed.comm.core import CommClosedError

            future, _ = self._acks.popleft()
            if not future.done():
                future.set_exception(CommClosedError(f"mpi://: rank {self.peer} closed before it read a message"))
        self._wake_reader()
        if not self.close_sent and not self._gave_up:
            self._send_close()
        if not self._gave_up:
            self.manager.release_tag(self.recv_tag)
        if self.local_id is not None:
            self.manager.release_id(self.local_id)
            self.local_id = None
        self.manager.channels.discard(self)

    # -- closing ----------------------------------------------------------------

    def abort(self):
        """Close without waiting; safe from any thread and from finalizers."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.local_closed = True
        if running is self.loop:
            self._start_close()
        elif not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self._start_close)
            except RuntimeError:  # loop closed meanwhile
                pass

    async def close(self):
        """Close, letting the ``CLOSE`` message leave before returning."""
        self.local_closed = True
        self._start_close()
        if self._close_future is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._close_future), 5)
            except (asyncio.TimeoutError, MPI.Exception):
                pass

    def _start_close(self):
        if self._closing:
            return
        self._closing = True
        self.local_closed = True
        self._wake_reader()
        self.inbox.clear()
        if not self.close_sent:
            self._send_close()
        if not self._task.done():
            self.loop.call_later(_drain_timeout(), self._give_up)

    def _give_up(self):
        if self._task.done():
            return
        logger.debug("mpi://: no CLOSE from rank %d; retiring tag %d", self.peer, self.recv_tag)
        self._gave_up = True
        self.engine.cancel(self._pending)

    def cancel_receive_now(self):
        """Cancel pending receives synchronously (process shutdown, no event loop needed)."""
        self._gave_up = True
        with mpi_lock:
            for req in self._pending:
                if req:
                    req.Cancel()
                    req.Wait()
