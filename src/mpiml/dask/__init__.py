"""Dask over MPI: an ``mpi://`` comm backend for Dask distributed, and a launcher.

``import mpiml.dask`` is cheap: Dask distributed is imported only when one of
the names below is first used.

Run a script on a Dask cluster whose processes are the ranks of an MPI job
(rank 0: scheduler, rank 1: your script, ranks >= 2: workers)::

    mpiexec -n 4 python -m mpiml.dask script.py      # or: mpiexec -n 4 mpiml dask script.py

and, inside ``script.py``::

    from mpiml.dask import get_client
    client = get_client()

Dask-driven estimators (``fit`` on a dask array, ``predict`` returning one) live
in ``mpiml.dask.cluster`` (and the other families' modules); Hyperband and
successive halving over ``partial_fit`` in ``mpiml.dask.model_selection``.

See ``docs/dask.md`` for the address format, the wire protocol and the options.
"""

import importlib

__all__ = ["MPIBackend", "initialize", "finalize", "get_client", "worker_addresses", "main", "DaskSPMDEstimator",
           "DaskSPMDError"]

_LAZY = {
    "MPIBackend": "mpiml.dask._backend",
    "initialize": "mpiml.dask._manager",
    "finalize": "mpiml.dask._manager",
    "get_client": "mpiml.dask._launcher",
    "worker_addresses": "mpiml.dask._launcher",
    "main": "mpiml.dask._launcher",
    "DaskSPMDEstimator": "mpiml.dask._estimator",
    "DaskSPMDError": "mpiml.dask._spmd",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mpiml.dask' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
