"""The GPU-aware communication layer: one communicator API over MPI, NCCL, CUDA IPC.

>>> from mpiml.comm import get_comm
>>> comm = get_comm()              # world communicator ("self" when not under mpiexec)
>>> total = comm.allreduce(x)      # NumPy in, NumPy out; CuPy in, CuPy out
"""

import os

from ._communicator import MAX_TAG, Communicator
from ._ops import OPS, SUPPORTED_DTYPES
from ._profile import Profile, profile
from ._request import Request, waitall
from .algorithms import ALGORITHM_NAMES, COLLECTIVES, algorithm_names
from .backends import backend_names, register_backend

__all__ = [
    "get_comm", "launched_by_mpi", "Communicator", "Request", "waitall", "profile", "Profile",
    "register_backend", "backend_names", "algorithm_names", "ALGORITHM_NAMES", "COLLECTIVES",
    "OPS", "SUPPORTED_DTYPES", "MAX_TAG",
]

# variables set by MPICH/Hydra, Open MPI/PRRTE, Intel MPI, MVAPICH and srun for every rank
_LAUNCH_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_ID")

_WORLD = {}


def launched_by_mpi():
    """True when this process was started by an MPI launcher (mpiexec, mpirun, srun)."""
    return any(v in os.environ for v in _LAUNCH_VARS)


def get_comm(backend="auto"):
    """The world communicator.

    Parameters
    ----------
    backend : {"auto", "mpi", "nccl", "ipc", "self"}, default="auto"
        ``"auto"``: over MPI when launched by an MPI launcher, the size-1 ``self``
        communicator otherwise; device collectives follow the tuning table.
        ``"mpi"`` forces MPI (also as a singleton).  ``"nccl"`` / ``"ipc"``: MPI for
        host buffers and set-up, that backend first for device buffers.

    Returns
    -------
    Communicator
        The same object for the same argument (communicators are cached).
    """
    from .backends import get_backend_factory

    key = backend.lower()
    if key not in ("auto",):
        get_backend_factory(key)  # unknown names raise ValueError listing the known ones
    comm = _WORLD.get(key)
    if comm is not None:
        return comm
    if key == "self" or (key == "auto" and not launched_by_mpi()):
        from .backends.self import SelfTransport

        comm = Communicator(SelfTransport())
    else:
        from .backends.mpi import MPITransport, mpi_module

        MPI = mpi_module()
        comm = Communicator(MPITransport(MPI.COMM_WORLD), prefer="auto" if key == "mpi" else key)
    _WORLD[key] = comm
    return comm
