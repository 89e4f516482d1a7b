"""The ``mpi://`` communication backend for Dask distributed.

Addresses
---------
``mpi://<rank>:<id>``: ``rank`` is the process's rank in the communicator given
to :func:`~mpiml.dask.initialize` (the world by default) and ``id`` a port-like
number naming one listener (or, for the connecting side of a connection, one
endpoint) in that process. ``mpi://0:8786`` is a listener of rank 0.

A listener may be asked for with ``mpi://`` (any free id, from 32768 up),
``mpi://:8786`` or ``mpi://<rank>:8786`` (that id; ``<rank>`` must be this
process's rank) or ``mpi://<host>:8786`` (the host is ignored: it is where
the rank runs anyway). :meth:`MPIBackend.get_address_host` answers the IP
address of the rank's host, gathered by :func:`~mpiml.dask.initialize`, so
Dask groups workers by host as it does over TCP.

Messages are framed by distributed's ``to_frames`` / ``from_frames`` and moved
by :class:`~mpiml.dask._channel.Channel` (wire format in :mod:`._frames`);
connections are set up by :mod:`._manager`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import weakref

import numpy as np
from mpi4py import MPI
from distributed.comm.core import BaseListener, Comm, CommClosedError, Connector
from distributed.comm.registry import Backend, backends
from distributed.comm.utils import from_frames, to_frames

from ._channel import Channel
from ._manager import ACCEPT, get_manager
from ._progress import get_engine, mpi_lock

__all__ = [
    "MPIBackend",
    "MPIComm",
    "MPIConnector",
    "MPIListener",
    "parse_location",
    "format_location",
]

logger = logging.getLogger("mpiml.dask")

PREFIX = "mpi://"
#: Serializers when the caller gives none and CuPy is loaded: keep CuPy frames on the device.
CUDA_SERIALIZERS = ("cuda", "dask", "pickle", "error")


def _bad_address(loc, why):
    return ValueError(
        f"invalid mpi:// address {loc!r}: {why}; expected '<rank>:<id>' such as 'mpi://0:8786'"
    )


def parse_location(loc, *, need_id=True):
    """Split a scheme-less ``mpi://`` location ``"<rank>:<id>"`` into two ints.

    With ``need_id=False`` a bare ``"<rank>"`` is accepted too (id 0).
    """
    rank_text, sep, id_text = loc.partition(":")
    if not sep and need_id:
        raise _bad_address(loc, "missing listener id")
    try:
        rank = int(rank_text)
        ident = int(id_text) if sep else 0
    except ValueError:
        raise _bad_address(loc, "rank and id must be integers") from None
    if rank < 0 or ident < 0 or (need_id and ident == 0):
        raise _bad_address(loc, "rank must be >= 0 and id > 0")
    return rank, ident


def format_location(rank, ident):
    """Inverse of :func:`parse_location`."""
    return f"{rank}:{ident}"


def _listen_request(loc, rank):
    """The listener id asked for by ``loc`` on this ``rank`` (0: pick one)."""
    host, sep, port = loc.rpartition(":")
    if not sep:
        host, port = loc, ""
    if host.isdigit() and int(host) != rank:
        raise ValueError(f"cannot listen on mpi://{loc} from rank {rank}")
    try:
        return int(port) if port else 0
    except ValueError:
        raise _bad_address(loc, "the listener id must be an integer") from None


class MPIComm(Comm):
    """An established ``mpi://`` connection.

    Parameters
    ----------
    channel : Channel
        The transport state (tags, peer, receive loop).
    local_addr, peer_addr : str
        Full addresses, ``mpi://<rank>:<id>``.
    deserialize : bool, default=True
    """

    def __init__(self, channel, local_addr, peer_addr, deserialize=True):
        super().__init__(deserialize=deserialize)
        self._channel = channel
        self._local_addr = local_addr
        self._peer_addr = peer_addr
        self._finalizer = weakref.finalize(self, _abort_dangling, channel, repr(self))
        self._finalizer.atexit = False

    @property
    def local_address(self) -> str:
        return self._local_addr

    @property
    def peer_address(self) -> str:
        return self._peer_addr

    @property
    def extra_info(self):
        ch = self._channel
        return {"peer_rank": ch.peer, "send_tag": ch.send_tag, "recv_tag": ch.recv_tag}

    async def read(self, deserializers=None):
        frames = await self._channel.next_frames(self.__repr__)
        try:
            return await from_frames(
                frames,
                deserialize=self.deserialize,
                deserializers=deserializers,
                allow_offload=self.allow_offload,
            )
        except EOFError:
            self.abort()
            raise CommClosedError("aborted stream on truncated data") from None

    async def write(self, msg, serializers=None, on_error="message"):
        channel = self._channel
        if not channel.can_send:
            raise CommClosedError(f"in {self!r}: connection closed")
        if serializers is None and "cupy" in sys.modules:
            serializers = CUDA_SERIALIZERS
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={
                "sender": self.local_info,
                "recipient": self.remote_info,
                **self.handshake_options,
            },
        )
        prepared = channel.prepare(frames)
        if not channel.can_send:  # closed while serialising
            raise CommClosedError(f"in {self!r}: connection closed")
        try:
            future, nbytes = channel.send(prepared)
            await future
        except MPI.Exception as exc:
            self.abort()
            raise CommClosedError(f"in {self!r}: {exc}") from exc
        except BaseException:
            # Cancelled mid-message: the peer may hold half of it; the comm is unusable.
            self.abort()
            raise
        return nbytes

    async def close(self):
        self._finalizer.detach()
        await self._channel.close()

    def abort(self):
        self._finalizer.detach()
        self._channel.abort()

    def closed(self):
        ch = self._channel
        return ch.local_closed or (ch.peer_closed and not ch.inbox)


def _abort_dangling(channel, description):
    if channel.local_closed or channel.peer_closed or sys.is_finalizing():
        return
    logger.warning("Closing dangling comm in %s", description)
    channel.abort()


class MPIListener(BaseListener):
    """Accepts ``mpi://`` connections for one listener id of this rank.

    Parameters
    ----------
    loc : str
        Scheme-less address asked for (see the module docstring).
    comm_handler : callable
        Called (and awaited if it returns an awaitable) with each new comm,
        after distributed's handshake.
    deserialize : bool, default=True
    allow_offload : bool, default=True
    **connection_args
        Ignored (TLS options and the like do not apply).
    """

    prefix = PREFIX

    def __init__(self, loc, comm_handler, deserialize=True, allow_offload=True, **connection_args):
        super().__init__()
        self._loc = loc
        self.comm_handler = comm_handler
        self.deserialize = deserialize
        self.allow_offload = allow_offload
        self.accepting = False
        self.ident = None
        self._manager = None
        self._loop = None
        self._tasks = set()

    async def start(self):
        manager = self._manager = get_manager()
        wanted = _listen_request(self._loc, manager.rank)
        self.ident = manager.allocate_id(wanted)
        self._loop = asyncio.get_running_loop()
        self.accepting = True
        manager.add_listener(self.ident, self)
        manager.ensure_control()

    def stop(self):
        if self._manager is None or not self.accepting:
            return
        self.accepting = False
        self._manager.remove_listener(self.ident)
        self._manager.release_id(self.ident)
        self.abort_handshaking_comms()

    @property
    def alive(self):
        return self.accepting and not self._loop.is_closed()

    def accept_threadsafe(self, peer, peer_tag, tag, peer_id):
        """Called by the manager (any thread) for an accepted connection request."""
        try:
            self._loop.call_soon_threadsafe(self._accept, peer, peer_tag, tag, peer_id)
        except RuntimeError:  # loop closed
            pass

    def _accept(self, peer, peer_tag, tag, peer_id):
        channel = Channel(self._manager, peer, send_tag=peer_tag, recv_tag=tag)
        if not self.accepting:
            channel.abort()
            return
        comm = MPIComm(
            channel,
            local_addr=self.contact_address,
            peer_addr=PREFIX + format_location(peer, peer_id),
            deserialize=self.deserialize,
        )
        comm.allow_offload = self.allow_offload
        task = self._loop.create_task(self._handle(comm))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, comm):
        try:
            await self.on_connection(comm)
        except CommClosedError:
            logger.debug("Connection from %s closed before handshake completed", comm.peer_address)
            return
        result = self.comm_handler(comm)
        if inspect.isawaitable(result):
            await result

    def _address(self):
        if self.ident is None:
            raise ValueError("invalid operation on non-started MPIListener")
        return PREFIX + format_location(self._manager.rank, self.ident)

    @property
    def listen_address(self):
        return self._address()

    @property
    def contact_address(self):
        return self._address()


class MPIConnector(Connector):
    """Opens ``mpi://`` connections (see :mod:`._manager` for the handshake)."""

    async def connect(self, address, deserialize=True, **connection_args):
        manager = get_manager()
        rank, ident = parse_location(address)
        if rank >= manager.size:
            raise _bad_address(address, f"rank {rank} does not exist (size {manager.size})")
        manager.ensure_control()
        engine = get_engine()
        my_tag = manager.allocate_tag()
        my_id = manager.allocate_id()
        reply = np.zeros(2, dtype=np.int64)
        with mpi_lock:
            reply_req = manager.comm.Irecv(reply, rank, my_tag)
        future = engine.wait([reply_req], busy=False, buffers=reply)
        manager.request(rank, ident, my_tag, my_id)
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            # Timed out: the listener may still answer; close what it opens then.
            future.add_done_callback(
                lambda _: _late_reply(manager, rank, reply, my_tag, my_id)
            )
            raise
        status, peer_tag = (int(v) for v in reply)
        if status != ACCEPT:
            manager.release_tag(my_tag)
            manager.release_id(my_id)
            raise ConnectionRefusedError(f"no mpi:// listener at {PREFIX}{address}")
        channel = Channel(manager, rank, send_tag=peer_tag, recv_tag=my_tag, local_id=my_id)
        return MPIComm(
            channel,
            local_addr=PREFIX + format_location(manager.rank, my_id),
            peer_addr=PREFIX + format_location(rank, ident),
            deserialize=deserialize,
        )


def _late_reply(manager, rank, reply, my_tag, my_id):
    status, peer_tag = (int(v) for v in reply)
    if status == ACCEPT:
        Channel(manager, rank, send_tag=peer_tag, recv_tag=my_tag, local_id=my_id).abort()
    else:
        manager.release_tag(my_tag)
        manager.release_id(my_id)


class MPIBackend(Backend):
    """Dask's entry point for the ``mpi`` scheme (``distributed.comm.backends``)."""

    def get_connector(self):
        return MPIConnector()

    def get_listener(self, loc, handle_comm, deserialize, **connection_args):
        return MPIListener(loc, handle_comm, deserialize, **connection_args)

    def get_address_host(self, loc):
        rank, _ = parse_location(loc, need_id=False)
        hosts = get_manager().hosts
        if rank >= len(hosts):
            raise _bad_address(loc, f"rank {rank} does not exist (size {len(hosts)})")
        return hosts[rank]

    def resolve_address(self, loc):
        rank, ident = parse_location(loc, need_id=False)
        return format_location(rank, ident) if ident else str(rank)

    def get_local_address_for(self, loc):
        return str(get_manager().rank)


backends["mpi"] = MPIBackend()
