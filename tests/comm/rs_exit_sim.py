"""A CPU model of the end of a 2-rank job that holds two NCCL communicators (test_rs_exit.py runs it).

    python rs_exit_sim.py RANK DIR MODE

Each process (one "rank") holds mpiml's NCCL transport (a real ``NCCLTransport`` whose CuPy communicator is a
:class:`Rendezvous`) and a communicator the program made itself (``raw``, as ``benchmarks/gpu/vs_nccl.py`` does).
A :class:`Rendezvous` destroy behaves as NCCL's (2.23+): it returns only once the peer has destroyed the same
communicator (a file per rank and communicator in DIR stands for the proxy's close message).  The interpreter's
teardown, which destroys both through CuPy's ``__dealloc__`` in an order of its own per rank, is modelled by an
atexit function registered before mpiml's hook (so it runs after it): rank 0 destroys ``raw`` first, rank 1
mpiml's first (what differing garbage-collector lists do).

MODE: ``plain``: mpiml's exit hook does not release (``MPIML_EXIT_RELEASE=0``, the state before the fix): the two
ranks wait for each other for ever; ``fixed``: the hook destroys mpiml's first on both ranks, then both destroy
``raw``: both exit; ``stuck``: rank 1 never reaches its end (it sleeps in an atexit function that runs first):
rank 0 gives up on mpiml's destroy (says so), then its exit bound ends it (faulthandler: ``Timeout``, status 1).
Each rank prints ``done`` when its last statement ran, then ``exited`` from the last atexit function.
"""

import atexit
import os
import sys
import threading
import time

rank, folder, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
peer = 1 - rank
if mode == "plain":
    os.environ["MPIML_EXIT_RELEASE"] = "0"

from mpiml.comm import _exit  # noqa: E402
from mpiml.comm.backends.nccl import NCCLTransport  # noqa: E402


class Rendezvous:
    """A stand-in for CuPy's ``NcclCommunicator``: ``destroy`` (and ``abort``) wait for the peer's."""

    def __init__(self, name):
        self.name = name
        self.done = False

    def _close(self):
        if self.done:
            return
        with open(os.path.join(folder, f"{self.name}.{rank}"), "w"):
            pass
        while not os.path.exists(os.path.join(folder, f"{self.name}.{peer}")):
            time.sleep(0.01)
        self.done = True
        print(f"rank {rank}: destroyed {self.name}", flush=True)

    destroy = abort = _close


def transport(nc):
    """An ``NCCLTransport`` around ``nc`` (what its set-up makes, without CuPy), registered for the exit."""
    t = NCCLTransport.__new__(NCCLTransport)
    t.rank, t.size, t.comm, t._broken = rank, 2, nc, None
    t._timeout = 30.0
    t._lock = threading.Lock()
    t._inflight, t._free_events = [], []
    return t


def teardown():
    """Python's teardown, as differing collection orders run it: each destroys what is still alive."""
    first, second = (raw, mine) if rank == 0 else (mine, raw)
    first.destroy()
    second.destroy()
    print(f"rank {rank}: exited", flush=True)


atexit.register(teardown)  # (before mpiml's hook is registered: it runs after it)
raw = Rendezvous("raw")
mine = Rendezvous("mpiml")
nccl = transport(mine)
_exit.register(nccl, rank)
if mode == "stuck" and rank == 1:
    atexit.register(time.sleep, 120)  # (registered last: runs first, and rank 1 never gets further)
print(f"rank {rank}: done", flush=True)
