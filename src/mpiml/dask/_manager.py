"""The per-process MPI comm manager behind ``mpi://``.

MPI cannot cheaply connect two processes that are already running, but every
Dask process of an ``mpi://`` cluster is a rank of the same MPI job. So a
"connection" is an agreement between two ranks on a pair of tags:

* each process owns a duplicate of the world communicator (made collectively
  by :func:`initialize`), a table of every rank's host, a set of listeners
  (keyed by a port-like listener id) and a pool of tags;
* a connector allocates the tag on which it will receive, and sends
  ``[REQUEST, listener id, its tag, its local id, its rank]`` on
  :data:`CONTROL_TAG` to the listener's rank;
* the manager of that rank (a receive on :data:`CONTROL_TAG`, polled by the
  progress engine of the event loop that started a listener) allocates the tag
  on which the listener side will receive, and answers
  ``[ACCEPT, its tag]`` (or ``[REFUSED, 0]`` when no such listener exists)
  on the connector's tag. From then on each side sends on the other's tag.

Tags of a process are unique over all its peers, handed out round-robin from
:data:`FIRST_TAG` to the MPI tag upper bound, so a tag is reused only after the
whole range went round, and never while a connection still uses it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
import weakref

import numpy as np
from mpi4py import MPI

from ._progress import get_engine, mpi_lock

__all__ = [
    "CONTROL_TAG",
    "FIRST_TAG",
    "REQUEST",
    "ACCEPT",
    "REFUSED",
    "FIRST_AUTO_ID",
    "MPIManager",
    "initialize",
    "finalize",
    "get_manager",
    "is_initialized",
]

logger = logging.getLogger("mpiml.dask")

CONTROL_TAG = 1
FIRST_TAG = 16
REQUEST, ACCEPT, REFUSED = 1, 2, 3
#: Listener ids picked automatically start here (like ephemeral TCP ports).
FIRST_AUTO_ID = 32768
_CONTROL_WORDS = 5

_manager = None
_manager_lock = threading.Lock()


def _host_ip():
    try:
        from distributed.utils import get_ip

        return get_ip()
    except Exception:  # no network: everything is on this host
        return socket.gethostbyname("localhost")


class MPIManager:
    """Process-wide state of the ``mpi://`` backend.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm
        A communicator private to the backend (a duplicate of the world).

    Attributes
    ----------
    comm : mpi4py.MPI.Intracomm
    rank, size : int
    hosts : list of str
        IP address of every rank's host, replicated on every rank.
    nodes : list of str
        Host name of every rank (ranks of one node may share device memory).
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.hosts = comm.allgather(_host_ip())
        self.nodes = comm.allgather(socket.gethostname())
        tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
        self._tag_range = range(FIRST_TAG, tag_ub + 1)
        self._tag_cursor = itertools.cycle(self._tag_range)
        self._tags_in_use = set()
        self._ids_in_use = set()
        self._id_cursor = FIRST_AUTO_ID
        self._lock = threading.Lock()
        self.listeners = {}
        self.channels = weakref.WeakSet()
        self._control_req = None
        self._control_buf = None
        self._control_loop = None

    # -- tags and ids ---------------------------------------------------------

    def allocate_tag(self):
        """Reserve a tag on which this process will receive (unique over all peers)."""
        with self._lock:
            for _ in range(len(self._tag_range)):
                tag = next(self._tag_cursor)
                if tag not in self._tags_in_use:
                    self._tags_in_use.add(tag)
                    return tag
        raise OSError("mpi://: every MPI tag of this process is in use")

    def release_tag(self, tag):
        with self._lock:
            self._tags_in_use.discard(tag)

    def allocate_id(self, wanted=0):
        """Reserve a listener / endpoint id; ``wanted=0`` picks a free one."""
        with self._lock:
            if wanted:
                if wanted in self._ids_in_use:
                    raise OSError(f"mpi://{self.rank}:{wanted} is already in use")
                self._ids_in_use.add(wanted)
                return wanted
            while self._id_cursor in self._ids_in_use:
                self._id_cursor += 1
            ident = self._id_cursor
            self._id_cursor += 1
            self._ids_in_use.add(ident)
            return ident

    def release_id(self, ident):
        with self._lock:
            self._ids_in_use.discard(ident)

    # -- listeners and connection requests ------------------------------------

    def add_listener(self, ident, listener):
        with self._lock:
            self.listeners[ident] = listener

    def remove_listener(self, ident):
        with self._lock:
            self.listeners.pop(ident, None)

    def ensure_control(self):
        """Make the running event loop answer connection requests if no live loop does."""
        loop = asyncio.get_running_loop()
        with self._lock:
            current = self._control_loop
            if current is not None and not current.is_closed():
                return
            self._control_loop = loop
            old, self._control_req = self._control_req, None
        if old is not None:
            # The loop that polled it is gone: take the request over.
            with mpi_lock:
                old.Cancel()
                status = MPI.Status()
                old.Wait(status)
            if not status.Is_cancelled():
                self._dispatch(self._control_buf)
        self._post_control()

    def _post_control(self):
        buf = np.zeros(_CONTROL_WORDS, dtype=np.int64)
        with mpi_lock:
            req = self.comm.Irecv(buf, MPI.ANY_SOURCE, CONTROL_TAG)
        self._control_buf, self._control_req = buf, req
        get_engine(self._control_loop).watch([req], buffers=buf, callback=self._on_control)

    def _on_control(self):
        buf = self._control_buf
        self._control_req = None
        if self._control_loop is None:  # finalized
            return
        self._post_control()
        self._dispatch(buf)

    def _dispatch(self, buf):
        op, ident, peer_tag, peer_id, peer = (int(v) for v in buf)
        if op != REQUEST:
            logger.warning("mpi://: ignoring unknown control message %s from rank %d", op, peer)
            return
        listener = self.listeners.get(ident)
        if listener is None or not listener.alive:
            self.reply(peer, peer_tag, REFUSED, 0)
            return
        tag = self.allocate_tag()
        self.reply(peer, peer_tag, ACCEPT, tag)
        listener.accept_threadsafe(peer, peer_tag, tag, peer_id)

    def reply(self, peer, peer_tag, status, tag):
        buf = np.array([status, tag], dtype=np.int64)
        with mpi_lock:
            req = self.comm.Isend(buf, peer, peer_tag)
        get_engine().watch([req], buffers=buf)

    def request(self, peer, ident, my_tag, my_id):
        """Send a connection request to ``peer`` for listener ``ident``; return the request."""
        buf = np.array([REQUEST, ident, my_tag, my_id, self.rank], dtype=np.int64)
        with mpi_lock:
            req = self.comm.Isend(buf, peer, CONTROL_TAG)
        get_engine().watch([req], buffers=buf)

    def shutdown(self):
        """Cancel the pending receives of this process (before ``MPI_Finalize``)."""
        with self._lock:
            req, self._control_req = self._control_req, None
            self._control_loop = None
        with mpi_lock:
            if req is not None:
                req.Cancel()
                req.Wait()
        for channel in list(self.channels):
            channel.cancel_receive_now()


def initialize(comm=None):
    """Set up the ``mpi://`` backend on this rank. Collective over ``comm``.

    Every rank that takes part in an ``mpi://`` Dask cluster must call it
    (``mpiml dask`` / ``python -m mpiml.dask`` do), before any ``mpi://``
    address is used. Calling it again does nothing.

    Parameters
    ----------
    comm : mpi4py.MPI.Intracomm, optional
        The processes of the cluster (default: ``MPI.COMM_WORLD``). Ranks in
        ``mpi://`` addresses are ranks of this communicator.

    Returns
    -------
    MPIManager
    """
    global _manager
    with _manager_lock:
        if _manager is None:
            base = MPI.COMM_WORLD if comm is None else comm
            _manager = MPIManager(base.Dup())
        return _manager


def is_initialized():
    """True once :func:`initialize` ran in this process."""
    return _manager is not None


def get_manager():
    """Return this process's :class:`MPIManager`.

    A single-process MPI job initialises itself on first use; with several
    ranks, :func:`initialize` must have been called on all of them first
    (it is collective, so it cannot happen lazily on one rank).
    """
    if _manager is not None:
        return _manager
    if MPI.COMM_WORLD.Get_size() == 1:
        return initialize()
    raise RuntimeError(
        "mpi:// is not initialised on this rank: call mpiml.dask.initialize() on every "
        "rank of the MPI job before using mpi:// addresses (mpiml dask / python -m "
        "mpiml.dask do it for you)"
    )


def finalize():
    """Cancel this process's pending ``mpi://`` receives; call before MPI is finalised."""
    if _manager is not None:
        _manager.shutdown()
