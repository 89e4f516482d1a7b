"""The ``mpiml`` command: ``info``, ``run``, ``bench comm|ml``, ``tune``, ``warmup``, ``dask``.

Rank 0 prints; a usage error is printed once (by rank 0) and exits 2 on every rank
(every rank parses the same arguments); an unhandled exception prints its traceback
and aborts the whole MPI job instead of leaving the other ranks hanging (as
``python -m mpi4py`` does). ``mpiml run`` reports its errors in one line, once
(:mod:`mpiml.cli._report`).
"""

import sys
import traceback

from ._options import parser  # noqa: F401 (the subcommands' parser, also imported from here)
from ._options import say_once

__all__ = ["main", "abort_on_exception"]

_USAGE = """usage: mpiml COMMAND [options]

commands:
  info                 MPI library, CUDA-awareness, GPUs, NCCL, backends available (and why not)
  run ALGORITHM        run an estimator SPMD (the main job: `mpiml run kmeans`)
  bench comm|ml        communication sweep (OSU-style) or ML benchmark
  tune                 measure this machine and write its tuning table
  warmup               compile once, into this machine's kernel cache, what the package does not ship
  dask SCRIPT          run a Dask cluster over mpi:// under mpiexec

`mpiml COMMAND --help` for the options of a command.
"""


def _world_size():
    from ..comm import launched_by_mpi

    if not launched_by_mpi():
        return 1
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


def abort_on_exception(fn, argv):
    """Run ``fn(argv)``; on an unhandled exception print it and abort every rank."""
    try:
        return fn(argv)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException:
        if _world_size() > 1:
            from .._abort import abort_job

            abort_job(*sys.exc_info())
        traceback.print_exc()
        return 1


def _dispatch(argv):
    if not argv or argv[0] in ("-h", "--help", "help"):
        if argv:
            say_once(_USAGE.rstrip("\n"), file=sys.stdout)
        else:
            say_once(_USAGE.rstrip("\n"))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from .. import __version__

        print(f"mpiml {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "info":
        from ._info import main as info_main

        return info_main(rest)
    if cmd == "run":
        from .run import main as run_main

        return run_main(rest)
    if cmd == "bench":
        if not rest or rest[0] not in ("comm", "ml"):
            say_once("usage: mpiml bench comm|ml [options]")
            return 2
        if rest[0] == "comm":
            from ..bench.comm import main as bench_main
        else:
            from ..bench.ml import main as bench_main
        return bench_main(rest[1:])
    if cmd == "tune":
        from ..bench.tune import main as tune_main

        return tune_main(rest)
    if cmd == "warmup":
        from ._warmup import main as warmup_main

        return warmup_main(rest)
    if cmd == "dask":
        from ..dask._launcher import main as dask_main

        return dask_main(rest)
    say_once(f"mpiml: unknown command {cmd!r}\n\n{_USAGE.rstrip()}")
    return 2


def main(argv=None):
    """Entry point of the ``mpiml`` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    code = abort_on_exception(_dispatch, argv)
    return int(code or 0)
