"""No hang after an unhandled exception: abort the whole MPI job instead.

An SPMD job in which one rank dies of an exception while the others wait in a
collective hangs forever (the others never learn of it; ``MPI_Finalize`` at exit
waits too). Importing mpiml under an MPI launch of more than one rank installs
:func:`sys.excepthook` wrappers that print the traceback and then abort every rank
(as ``python -m mpi4py`` does). ``MPIML_ABORT_ON_EXCEPTION=0`` turns this off.
"""

import os
import sys
import threading
import time
import traceback

__all__ = ["abort_job", "install_abort_hook", "launch_size"]

# launchers' variables for the number of ranks of the job
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE",
              "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")


def launch_size():
    """Ranks of this job according to the launcher's variables (1 outside a launcher)."""
    sizes = [int(os.environ[v]) for v in _SIZE_VARS if os.environ.get(v, "").isdigit()]
    if not sizes or not any(v in os.environ for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                                                       "SLURM_PROCID", "PMI_FD", "MV2_COMM_WORLD_RANK")):
        return 1
    return max(sizes)


def abort_job(exc_type, exc, tb, *, where="mpiml"):
    """Print the traceback, then abort every rank of the MPI job (exit status 1)."""
    traceback.print_exception(exc_type, exc, tb)
    sys.stderr.flush()
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    print(f"{where}: unhandled exception on rank {rank}; aborting the job "
          "(MPIML_ABORT_ON_EXCEPTION=0 to let the other ranks go on)", file=sys.stderr, flush=True)
    # give the launcher a moment to forward the traceback: an abort can drop output in flight
    time.sleep(0.5)
    MPI.COMM_WORLD.Abort(1)


def install_abort_hook():
    """Install the hooks when this process is one of several MPI ranks (idempotent)."""
    if os.environ.get("MPIML_ABORT_ON_EXCEPTION", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if launch_size() < 2 or getattr(sys.excepthook, "_mpiml", False):
        return False
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt):
            return previous(exc_type, exc, tb)
        abort_job(exc_type, exc, tb)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        abort_job(args.exc_type, args.exc_value, args.exc_traceback, where=f"mpiml (thread {args.thread.name})")

    hook._mpiml = True
    sys.excepthook = hook
    threading.excepthook = thread_hook
    return True
