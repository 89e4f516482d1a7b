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
    CLOSE,
    DATA,
    HEADER_WORDS,
    chunk_bytes,
    chunks,
    finish_receive,
    pack_header,
    receive_buffers,
    unpack_extension,
    unpack_header,
)
from ._progress import get_engine, mpi_lock

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
        manager.channels.add(self)
        self._task = self.loop.create_task(self._receive_loop())

    # -- sending ----------------------------------------------------------------

    @property
    def can_send(self):
        return not (self.local_closed or self.peer_closed or self.close_sent)

    def send(self, frames):
        """Post a message (a :class:`~._frames.SendFrames`); return ``(future, nbytes)``.

        The caller checked :attr:`can_send` without awaiting in between.
        """
        header, extension = pack_header(DATA, frames.sizes, frames.flags, self.chunk)
        reqs = []
        with mpi_lock:
            reqs.append(self.comm.Isend(header, self.peer, self.send_tag))
            if extension is not None:
                reqs.append(self.comm.Isend(extension, self.peer, self.send_tag))
            for buf, nbytes in zip(frames.buffers, frames.sizes):
                for piece in chunks(buf, nbytes, self.chunk):
                    reqs.append(self.comm.Isend([piece, MPI.BYTE], self.peer, self.send_tag))
        nbytes = frames.nbytes + header.nbytes + (0 if extension is None else extension.nbytes)
        future = self.engine.wait(reqs, busy=True, buffers=(header, extension, frames))
        return future, nbytes

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
                if missing:
                    ext = np.empty(2 * missing, dtype=np.uint64)
                    if not await self._receive([(ext, ext.nbytes)], ext.nbytes, busy=True):
                        return
                    more_sizes, more_flags = unpack_extension(ext)
                    sizes, flags = sizes + more_sizes, flags + more_flags
                discard = self.local_closed
                kinds = [0] * len(flags) if discard else flags
                targets = receive_buffers(sizes, kinds, self.cuda_aware)
                if not await self._receive(list(zip(targets, sizes)), max(chunk, 1), busy=True):
                    return
                if not self.local_closed:
                    self.inbox.append(finish_receive(targets, flags, self.cuda_aware))
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
