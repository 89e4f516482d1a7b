"""Run a Python script on a Dask cluster made of the ranks of an MPI job.

``mpiexec -n N python -m mpiml.dask [options] SCRIPT.py [ARGS...]``
(or ``mpiexec -n N mpiml dask ...``):

* rank 0 runs the scheduler and broadcasts its address;
* rank 1 connects a :class:`distributed.Client`, waits for the workers, and runs
  ``SCRIPT.py`` as ``__main__`` with ``sys.argv = [SCRIPT.py, ARGS...]``. The
  script gets the client with :func:`get_client` (or connects its own to
  ``os.environ["MPIML_DASK_SCHEDULER"]``);
* ranks 2 .. N-1 run one worker each (``--nthreads`` threads).

Nothing listens beyond this host unless asked: over ``tcp://`` the
scheduler and the workers bind 127.0.0.1 (``--host``/``--interface``, or
``MPIML_DASK_HOST``/``MPIML_DASK_INTERFACE``, choose another address), and no
HTTP server (dashboard, metrics) starts without ``--dashboard-address``.
``mpi://`` opens no socket at all.

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
HOST_ENV = "MPIML_DASK_HOST"
INTERFACE_ENV = "MPIML_DASK_INTERFACE"
#: Where the cluster listens unless told otherwise: this host only. A Dask scheduler runs code for
#: anyone who reaches it, so reaching it from elsewhere is something a user asks for.
DEFAULT_HOST = "127.0.0.1"
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
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--host", default=None,
        help=f"address the scheduler and workers listen on (tcp) and their HTTP servers (with "
             f"--dashboard-address); default: ${HOST_ENV}, else {DEFAULT_HOST} (this host only); "
             "0.0.0.0 listens on every interface",
    )
    where.add_argument(
        "--interface", default=None,
        help=f"network interface to listen on instead, on every rank's host (e.g. ib0, eth0; "
             f"default: ${INTERFACE_ENV}); tcp across several nodes needs it",
    )
    parser.add_argument(
        "--dashboard-address", default=None, metavar="[HOST]:PORT",
        help="start the scheduler's dashboard there (and the workers' HTTP servers, on a free "
             "port); without a HOST, on the --host/--interface address. Default: no HTTP server",
    )
    return parser


def _listen_host(args):
    """``(host, interface)`` to listen on, exactly one of them set: options first, then the environment."""
    if args.host is not None or args.interface is not None:
        return args.host, args.interface
    if os.environ.get(HOST_ENV) and os.environ.get(INTERFACE_ENV):
        raise _UsageError(f"mpiml dask: error: set {HOST_ENV} or {INTERFACE_ENV}, not both")
    if os.environ.get(INTERFACE_ENV):
        return None, os.environ[INTERFACE_ENV]
    return os.environ.get(HOST_ENV) or DEFAULT_HOST, None


def _check_listen_options(args):
    """Usage errors of --host/--interface/--dashboard-address, found before anything starts."""
    host, interface = _listen_host(args)
    if interface is not None:
        from distributed.utils import get_ip_interface

        try:
            get_ip_interface(interface)
        except ValueError as exc:
            raise _UsageError(f"mpiml dask: error: --interface {interface}: {exc}") from None
    if args.dashboard_address is not None:
        _http_address(args, args.dashboard_address)


def _http_address(args, spec):
    """``host:port`` for an HTTP server from ``[HOST]:PORT`` (no host: the cluster's listen address)."""
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "", spec
    if not port.isdigit():
        raise _UsageError(f"mpiml dask: error: --dashboard-address must be [HOST]:PORT; got {spec!r}")
    if not host:
        host, interface = _listen_host(args)
        if interface is not None:
            from distributed.utils import get_ip_interface

            host = get_ip_interface(interface)
    return f"{host}:{int(port)}"


def _no_idle_http(cls):
    """``cls`` (distributed's Scheduler or Worker) with an HTTP server only when given an address.

    Dask starts one in every scheduler and worker (metrics, health, info pages), on every
    interface or on the host's network address, even with the dashboard off.
    """

    class Server(cls):
        def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
            if dashboard_address is None:
                return
            super().start_http_server(routes, dashboard_address, default_port=default_port,
                                      ssl_options=ssl_options)

    Server.__name__ = Server.__qualname__ = cls.__name__
    Server.__module__ = __name__
    return Server


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


def worker_addresses(client=None):
    """The addresses of the workers the scheduler knows now, sorted (asked of the scheduler).

    Prefer this to ``client.scheduler_info()["workers"]``: that returns the client's cached
    copy, which the client's periodic refresh (asking for no per-worker details) can overwrite
    between the refresh it makes and the read, so that live workers look gone.

    Parameters
    ----------
    client : distributed.Client, optional
        A synchronous client; default: :func:`get_client`.

    Returns
    -------
    list of str
    """
    client = get_client() if client is None else client
    return sorted(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


def main(argv=None):
    """Entry point of ``mpiml dask`` and ``python -m mpiml.dask``; returns the exit status."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        if args.nthreads < 1:
            raise _UsageError(f"mpiml dask: error: --nthreads must be >= 1; got {args.nthreads}")
        _check_listen_options(args)
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


def _comm_listen_args(args):
    """Where a scheduler or worker listens for Dask comms: tcp binds the host or interface; port 0 picks one."""
    if args.protocol != "tcp":
        return {}  # mpi:// opens no socket
    host, interface = _listen_host(args)
    return {"host": host, "interface": interface, "port": 0}


async def _run_scheduler(args, world):
    from distributed import Scheduler

    dashboard = None if args.dashboard_address is None else _http_address(args, args.dashboard_address)
    async with _no_idle_http(Scheduler)(
        protocol=args.protocol, dashboard_address=dashboard, **_comm_listen_args(args),
    ) as scheduler:
        world.bcast(scheduler.address, root=0)
        await scheduler.finished()


async def _run_worker(args, world):
    from distributed import Worker

    address = world.bcast(None, root=0)
    async with _no_idle_http(Worker)(
        address,
        nthreads=args.nthreads,
        memory_limit=args.memory_limit,
        local_directory=args.local_directory,
        name=f"rank-{world.Get_rank()}",
        protocol=args.protocol,
        death_timeout=args.timeout,
        dashboard=False,
        dashboard_address=None if args.dashboard_address is None else _http_address(args, ":0"),
        **_comm_listen_args(args),
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
