"""Run a Python script on a Dask cluster made of the ranks of an MPI job.

``mpiexec -n N python -m mpiml.dask [options] SCRIPT.py [ARGS...]``
(or ``mpiexec -n N mpiml dask ...``):

* rank 0 runs the scheduler and broadcasts its address;
* rank 1 connects a :class:`distributed.Client`, waits for the workers, and runs
  ``SCRIPT.py`` as ``__main__`` with ``sys.argv = [SCRIPT.py, ARGS...]``. The
  script gets the client with :func:`get_client` (or connects its own to
  ``os.environ["MPIML_DASK_SCHEDULER"]``);
* ranks 2 .. N-1 run one worker each (``--nthreads`` threads).

When the script returns (or calls ``sys.exit``), the client shuts the
scheduler and the workers down, every rank returns, and the job's exit status
is the script's. An exception in the script, or in the scheduler or a worker,
prints its traceback and aborts the whole MPI job instead of leaving it hung.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import runpy
import sys
import time
import traceback

__all__ = ["main", "get_client", "build_parser"]

SCHEDULER_ENV = "MPIML_DASK_SCHEDULER"
_client = None


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _UsageError(f"{self.prog}: error: {message}")


def build_parser():
    """The command-line parser of ``mpiml dask``."""
    parser = _Parser(
        prog="mpiml dask",
        description=(
            "Run SCRIPT on a Dask cluster made of the ranks of this MPI job: rank 0 is "
            "the scheduler, rank 1 runs SCRIPT with a connected client "
            "(mpiml.dask.get_client()), ranks >= 2 are workers. Needs at least 3 ranks."
        ),
    )
    parser.add_argument("script", help="Python script to run on rank 1")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for SCRIPT")
    parser.add_argument(
        "--protocol", choices=("mpi", "tcp"), default="mpi",
        help="comm backend between the Dask processes (default: mpi)",
    )
    parser.add_argument("--nthreads", type=int, default=1, help="threads per worker (default: 1)")
    parser.add_argument(
        "--memory-limit", default="auto", help="memory limit per worker (default: auto)"
    )
    parser.add_argument(
        "--local-directory", default=None, help="directory for the workers' spilled data"
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0,
        help="seconds to wait for the scheduler and all workers to start (default: 60)",
    )
    return parser


def get_client():
    """Return the :class:`distributed.Client` of a script run by ``mpiml dask``.

    Raises
    ------
    RuntimeError
        Outside a script started by ``mpiml dask`` / ``python -m mpiml.dask``.
    """
    if _client is None:
        raise RuntimeError(
            "mpiml.dask.get_client() works in a script started by `mpiexec -n N mpiml dask "
            "SCRIPT.py` (or python -m mpiml.dask); elsewhere use distributed.Client(address)"
        )
    return _client


def main(argv=None):
    """Entry point of ``mpiml dask`` and ``python -m mpiml.dask``; returns the exit status."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.nthreads < 1:
            raise _UsageError(f"mpiml dask: error: --nthreads must be >= 1; got {args.nthreads}")
        if size < 3:
            raise _UsageError(
                f"mpiml dask needs at least 3 MPI ranks (scheduler, client, one worker); "
                f"got {size}. Run it as: mpiexec -n 3 python -m mpiml.dask SCRIPT.py"
            )
    except _UsageError as exc:
        if rank == 0:
            print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0

    status = 0
    try:
        if args.protocol == "mpi":
            from . import _backend  # noqa: F401  registers mpi:// even where mpiml is not installed
            from ._manager import initialize

            initialize(world)
        from ._spmd import setup_launched_ranks

        setup_launched_ranks(world)  # the workers' communicator for Dask-driven estimators
        if rank == 0:
            asyncio.run(_run_scheduler(args, world))
        elif rank == 1:
            status = _run_client(args, world)
        else:
            asyncio.run(_run_worker(args, world))
        if args.protocol == "mpi":
            from ._manager import finalize

            finalize()
    except BaseException:
        _abort(world, f"rank {rank}")
    _barrier(world, args.timeout)
    return status


def _abort(world, who):
    sys.stdout.flush()
    print(f"mpiml dask: unhandled exception on {who}; aborting the MPI job", file=sys.stderr)
    traceback.print_exc()
    sys.stderr.flush()
    time.sleep(0.5)  # let mpiexec forward the traceback before it tears the job down
    world.Abort(1)


def _barrier(world, timeout):
    """Wait for every rank, polling, and abort the job if one does not come."""
    req = world.Ibarrier()
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            print(
                f"mpiml dask: rank {world.Get_rank()}: other ranks did not finish within "
                f"{timeout:g} s; aborting", file=sys.stderr,
            )
            world.Abort(1)
        time.sleep(0.01)


async def _run_scheduler(args, world):
    from distributed import Scheduler

    async with Scheduler(protocol=args.protocol, dashboard_address=":0") as scheduler:
        world.bcast(scheduler.address, root=0)
        await scheduler.finished()


async def _run_worker(args, world):
    from distributed import Worker

    address = world.bcast(None, root=0)
    async with Worker(
        address,
        nthreads=args.nthreads,
        memory_limit=args.memory_limit,
        local_directory=args.local_directory,
        name=f"rank-{world.Get_rank()}",
        protocol=args.protocol,
        death_timeout=args.timeout,
        dashboard=False,
    ) as worker:
        await worker.finished()


def _run_client(args, world):
    """Run the user's script; return its exit status (exceptions propagate)."""
    global _client
    from distributed import Client

    address = world.bcast(None, root=0)
    os.environ[SCHEDULER_ENV] = address
    client = Client(address, timeout=args.timeout)
    try:
        client.wait_for_workers(world.Get_size() - 2, timeout=args.timeout)
        _client = client
        status = _run_script(args.script, args.args)
    finally:
        _client = None
        try:
            client.shutdown()
        finally:
            client.close()
    return status


def _run_script(path, script_args):
    saved_argv, saved_path = sys.argv, sys.path[:]
    sys.argv = [path, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
