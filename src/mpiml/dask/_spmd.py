"""The worker side of Dask-driven SPMD estimators: one communicator per job.

Under ``mpiml dask`` every Dask worker is an MPI rank. :func:`setup_launched_ranks`
(called by the launcher on every rank, at start-up, while all ranks are
certainly there) splits the world into the **workers communicator** (ranks
>= 2). A Dask-driven job (``fit``, ``partial_fit``, ``score`` of a wrapped
estimator) then runs as one task on **every** worker, in three steps:

1. a nonblocking agreement over the workers communicator, polled with a
   timeout, on the job's id: every worker has entered the same job (or the
   job fails with :class:`~mpiml.CommTimeoutError` instead of hanging in the
   blocking split that follows);
2. ``MPI_Comm_split`` of the workers communicator: the workers that hold
   partitions (the *members*, ordered as the client listed them) get a new
   communicator; the others take part with ``MPI_UNDEFINED`` and return at
   once. Every worker takes part because a split is collective over its
   parent, and only the launcher can build a parent of exactly the workers
   without the scheduler and client;
3. the members run the estimator's method on their concatenated blocks with
   that communicator, then free it.

The client runs one such job at a time (a lock in :mod:`._estimator`), so the
workers see the jobs in one order, which step 1 checks.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import socket
import threading

import numpy as np

from .._errors import MpimlError

__all__ = ["DaskSPMDError", "Job", "setup_launched_ranks", "worker_info", "run_job", "run_block_method",
           "FIRST_WORKER_RANK"]


class DaskSPMDError(MpimlError, RuntimeError):
    """A Dask-driven SPMD job could not run or finish (no MPI workers, a lost worker, ...)."""


#: Ranks of ``mpiml dask``: 0 scheduler, 1 client, from here on workers.
FIRST_WORKER_RANK = 2

_state = {"workers": None, "world_rank": None, "world_size": None}
_lock = threading.Lock()


def _env_timeout():
    from .._config import env_number, timeout

    return env_number("MPIML_DASK_SPMD_TIMEOUT", timeout() or 300.0, kind=float, minimum=0, unit="seconds")


def setup_launched_ranks(world, first_worker=FIRST_WORKER_RANK):
    """Prepare this rank of an ``mpiml dask`` job for Dask-driven SPMD jobs. Collective over ``world``.

    * Splits ``world`` into the workers communicator (ranks >= ``first_worker``);
    * on the client and worker ranks, makes mpiml's default communicator
      (``comm=None``, :func:`mpiml.comm.get_comm`) the size-1 ``self`` one: a
      Dask task or the client script is one process, and the world (with the
      scheduler in it) must never be used for an estimator's collectives.
    """
    from mpi4py import MPI

    rank = world.Get_rank()
    workers = world.Split(1 if rank >= first_worker else MPI.UNDEFINED, rank)
    with _lock:
        _state["workers"] = None if workers == MPI.COMM_NULL else workers
        _state["world_rank"] = rank
        _state["world_size"] = world.Get_size()
    if rank >= 1:
        from .. import comm as comm_pkg

        # get_comm() caches the world by key; the self communicator takes the world's place here.
        comm_pkg._WORLD["auto"] = comm_pkg.get_comm("self")


def worker_info():
    """What a worker tells the client (``client.run``): whether it can run SPMD jobs."""
    workers = _state["workers"]
    return {
        "spmd": workers is not None,
        "world_rank": _state["world_rank"],
        "workers_rank": None if workers is None else workers.Get_rank(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


@dataclasses.dataclass
class Job:
    """One Dask-driven SPMD call, as sent to every worker.

    Attributes
    ----------
    job_id : int
        Increases by one per job of this client; agreed before the split.
    method : str
        ``"fit"``, ``"partial_fit"``, ``"score"``, ...
    estimator : SPMDEstimator
        The estimator to call (``comm=None``; a fitted one for ``partial_fit``/``score``).
    members : tuple of int
        Ranks, in the workers communicator, of the workers that hold blocks,
        in the order of the new communicator.
    n_x, n_y, n_w : int
        Blocks of X, y and sample_weight that follow the job in the task's arguments.
    kwargs : dict
        Other keyword arguments of the method.
    drop : tuple of str
        Fitted attributes local to a rank, removed before the estimator is returned.
    timeout : float
        Seconds that step 1 may wait for the other workers.
    keep : bool
        ``fit`` of a model whose fitted state is sharded (a neighbours index):
        every member returns its estimator, which stays on its worker.
    sharded : bool
        A query of such a model: the first argument after the job is this
        member's fitted estimator; every member returns its output split
        back into its blocks (a list, one entry per block; tuples stay tuples).
    """

    job_id: int
    method: str
    estimator: object
    members: tuple
    n_x: int = 0
    n_y: int = 0
    n_w: int = 0
    kwargs: dict = dataclasses.field(default_factory=dict)
    drop: tuple = ()
    timeout: float = 300.0
    keep: bool = False
    sharded: bool = False


def _agree_on_job(workers, job_id, timeout):
    """Check, with a polled nonblocking allreduce, that every worker runs job ``job_id``."""
    from mpi4py import MPI

    from ..comm._request import poll_until

    send = np.array([job_id, -job_id], dtype=np.int64)
    recv = np.empty_like(send)
    req = workers.Iallreduce(send, recv, op=MPI.MAX)
    poll_until(req.Test, op="Dask SPMD job start", peer="all workers", timeout=timeout,
               detail=f"job {job_id}: a worker is busy, dead or out of step; the workers communicator "
                      "is unusable from now on")
    newest, oldest = int(recv[0]), -int(recv[1])
    if newest != oldest:
        raise RuntimeError(f"Dask workers are out of step: this worker runs SPMD job {job_id}, others "
                           f"run jobs {oldest}..{newest} (jobs must come from one client, one at a time)")


def _job_comm(job):
    """Steps 1 and 2: ``(communicator, its MPI transport)`` on members, ``(None, None)`` elsewhere."""
    workers = _state["workers"]
    if workers is None:
        raise RuntimeError(
            "this Dask worker is not a worker rank of an `mpiml dask` job, so mpiml's MPI communicator "
            "is unavailable here; start the cluster with: mpiexec -n N mpiml dask script.py")
    _agree_on_job(workers, job.job_id, job.timeout)
    me = workers.Get_rank()
    key = job.members.index(me) if me in job.members else 0
    from mpi4py import MPI

    sub = workers.Split(0 if me in job.members else MPI.UNDEFINED, key)
    if sub == MPI.COMM_NULL:
        return None, None
    from ..comm import Communicator
    from ..comm.backends.mpi import MPITransport

    transport = MPITransport(sub, owned=True)
    return Communicator(transport), transport


def _concat(blocks):
    if not blocks:
        return None
    if len(blocks) == 1:
        return blocks[0]
    first = blocks[0]
    if hasattr(first, "__cuda_array_interface__"):
        import cupy

        return cupy.concatenate(blocks)
    return np.concatenate(blocks)


def run_job(job, *blocks):
    """The Dask task of one worker for ``job``; ``blocks`` are its X, y, sample_weight blocks.

    Returns, on the first member, the estimator after the call (for ``fit``
    and ``partial_fit``, with ``job.drop`` removed) or the method's value;
    ``None`` on the other workers. An exception that the client could not
    unpickle comes back as a DaskSPMDError with its text.
    """
    try:
        return _run_job_here(job, blocks)
    except Exception as exc:
        raise _picklable(exc) from None


def _run_job_here(job, blocks):
    comm, transport = _job_comm(job)
    if comm is None:
        return None
    est = job.estimator
    if job.sharded:
        est, blocks = blocks[0], blocks[1:]
    X = _concat(list(blocks[:job.n_x]))
    y = _concat(list(blocks[job.n_x:job.n_x + job.n_y]))
    w = _concat(list(blocks[job.n_x + job.n_y:]))
    kwargs = dict(job.kwargs)
    if job.n_w:
        kwargs["sample_weight"] = w
    args = (X,) if job.sharded and not job.n_y else (X, y)
    est.comm = comm
    ok = False
    try:
        out = getattr(est, job.method)(*args, **kwargs)
        ok = True
    finally:
        est.comm = None
        if ok:  # after a failure the communicator may hold unmatched calls: leave it
            comm.close()
            transport.close()  # MPI has a few thousand communicator ids: free them per job
    if job.keep:
        return est
    if job.sharded:
        if isinstance(out, tuple) or hasattr(out, "shape") and getattr(out, "ndim", 0) > 0:
            return _split_rows(out, [len(b) for b in blocks[:job.n_x]])
        return out if comm.rank == 0 else None  # a global value (score)
    if comm.rank != 0:
        return None
    if job.method in ("fit", "partial_fit"):
        for name in job.drop:
            est.__dict__.pop(name, None)
        return est
    return out


def _split_rows(out, rows):
    """``out`` (an array or a tuple of arrays over the concatenated rows) split into blocks."""
    bounds = np.cumsum([0] + rows)
    if isinstance(out, tuple):
        return [tuple(o[a:b] for o in out) for a, b in zip(bounds[:-1], bounds[1:])]
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def strip(estimator, names):
    """A copy of ``estimator`` without the attributes ``names`` (what the client gets of a shard)."""
    import copy

    est = copy.copy(estimator)
    est.__dict__ = {k: v for k, v in estimator.__dict__.items() if k not in names}
    return est


def block_of(result, index):
    """Block ``index`` of a sharded query's result on one worker."""
    return result[index]


def describe(result):
    """Rows, trailing shape and dtype of each output of each block (small; for the client)."""
    def one(a):
        return (a.shape[0], a.shape[1:], a.dtype, type(a).__module__.split(".")[0])

    return [tuple(one(a) for a in r) if isinstance(r, tuple) else one(r) for r in result]


def _picklable(exc):
    """``exc``, or a DaskSPMDError with its text when the client could not unpickle it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return DaskSPMDError(f"{type(exc).__name__}: {exc}")


def run_block_method(block, model, method):
    """``model.method(block)``: one block of a lazy ``predict`` / ``transform``."""
    return getattr(model, method)(block)
