"""Run under ``mpiexec -disable-auto-cleanup -n N`` (tests/utils/test_oversubscribed.py): the last rank is killed
(SIGKILL) while the others wait for it on a barrier in node memory (:func:`mpiml.utils._node_memory.node_barrier`,
and the barrier of :func:`~mpiml.utils._node_memory.node_sum`); each survivor must raise a ``CommError`` that names
the dead rank within a few seconds (``MPIML_TIMEOUT`` is 60 s), and writes ``rank kind seconds message`` into the
folder given as the first argument.  The launcher does not clean up, and its notice of the dead rank (SIGUSR1) is
ignored, as under launchers that send none; the survivors leave with ``os._exit``
(2 s later: a survivor that left first would be named by the others)."""

import os
import signal
import sys
import time

import numpy as np

import mpiml
from mpiml import CommError
from mpiml.utils._node_memory import node_barrier, node_sum
from mpiml.utils._threads import one_node_comm

out, which = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # (MPICH's Hydra signals a dead peer so: its default ends the process)
comm = mpiml.get_comm()
rank, size = comm.rank, comm.size
raw = one_node_comm(comm)
if which == "barrier":
    barrier = node_barrier(raw)
    barrier.wait()                       # every rank once, alive
else:
    os.environ["MPIML_OVERSUBSCRIBED"] = ""
    node_sum(comm, np.ones(4))           # the sums' windows and barrier made (the ranks outnumber the cores)
comm.barrier()
if rank == size - 1:                     # killed once every other rank is past MPI (about to wait in node memory)
    while len([f for f in os.listdir(out) if f.startswith("ready")]) < size - 1:
        time.sleep(0.01)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
open(os.path.join(out, f"ready{rank}"), "w").close()
t0 = time.perf_counter()
try:
    if which == "barrier":
        barrier.wait(idle=True)
    else:
        node_sum(comm, np.ones(4))
    kind, message = "none", ""
except CommError as exc:
    kind, message = type(exc).__name__, str(exc)
with open(os.path.join(out, f"rank{rank}"), "w") as f:
    f.write(f"{rank} {kind} {time.perf_counter() - t0:.3f} {message}\n")
time.sleep(2.0)                          # (the other survivors look while only the killed rank is gone)
os._exit(0)
