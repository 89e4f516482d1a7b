"""Binding ranks to GPUs: rank r of a host uses device (local rank) mod (devices)."""

import os

__all__ = ["local_rank", "bind_device"]

_LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
               "SLURM_LOCALID", "PMI_LOCAL_RANK")


def local_rank(comm=None):
    """This process's rank among the ranks of its host (launcher variables, else world rank)."""
    for v in _LOCAL_VARS:
        if v in os.environ:
            return int(os.environ[v])
    return comm.rank if comm is not None else 0


def bind_device(comm=None):
    """Make device ``local_rank % device_count`` current for this process; returns its id."""
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    dev = local_rank(comm) % max(n, 1)
    cupy.cuda.Device(dev).use()
    return dev
