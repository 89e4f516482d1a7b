"""What the command line and the benchmark suites share: printing once, parsing arguments, launching.

* :class:`ArgumentParser` and :func:`say_once` print help, usage and messages on rank 0 alone
  (the rank comes from the launcher's variables: no MPI is needed to print a usage error);
  :func:`parser` makes one for a subcommand.
* :func:`launch_command` re-launches ``python -m mpiml run`` under ``srun`` or ``mpiexec``;
  :func:`gpu_count` counts the GPUs CuPy sees; :func:`strip_np` drops ``--np`` from the
  arguments passed on.
* :func:`aggregate_profile` gathers every rank's communication profile for a report.

Both ``mpiml.cli`` and ``mpiml.bench`` import this module; it imports neither.
"""

import argparse
import os
import shutil
import subprocess
import sys

__all__ = ["ArgumentParser", "parser", "launch_rank", "say_once", "mpiexec_command", "srun_command",
           "launch_command", "gpu_count", "strip_np", "aggregate_profile"]

# launchers' variables for this process's rank in the job
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launch_rank():
    """This process's rank according to the launcher's variables (0 outside a launcher)."""
    from .._abort import launch_size

    if launch_size() < 2:
        return 0
    for name in _RANK_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def say_once(text, file=None):
    """Print ``text`` on rank 0 only."""
    if launch_rank() == 0:
        print(text, file=sys.stderr if file is None else file, flush=True)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose help, usage and errors are printed by rank 0 only (exit status 2 everywhere)."""

    def _print_message(self, message, file=None):
        if message and launch_rank() == 0:
            super()._print_message(message, file)


def parser(prog, description):
    """An ``ArgumentParser`` for a subcommand (usage errors printed by rank 0, exit 2 on every rank)."""
    return ArgumentParser(prog=prog, description=description)


def mpiexec_command(n, argv):
    """``[mpiexec, -n, N, (Open MPI flags), python, -m, mpiml, run, *argv]``.

    ``MPIML_MPIEXEC`` overrides the launcher found on PATH (or, when PATH has none, beside this
    Python: a virtual environment's ``pip install mpich`` used without activating it).  Open MPI (detected
    from ``mpiexec --version``) gets ``--bind-to none --oversubscribe`` and, as
    root, ``--allow-run-as-root``.
    """
    here = os.path.dirname(sys.executable)
    exe = (os.environ.get("MPIML_MPIEXEC") or shutil.which("mpiexec") or shutil.which("mpirun")
           or shutil.which("mpiexec", path=here) or shutil.which("mpirun", path=here))
    if exe is None:
        raise FileNotFoundError("no mpiexec on PATH (pip install mpich, or set MPIML_MPIEXEC)")
    cmd = [exe, "-n", str(n)]
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
    except Exception:
        version = ""
    if "open mpi" in version.lower() or "openrte" in version.lower():
        cmd += ["--bind-to", "none", "--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd + [sys.executable, "-m", "mpiml", "run", *argv]


def srun_command(n, argv):
    """``[srun, -n, N, --mpi=pmi2, python, -m, mpiml, run, *argv]``, inside a Slurm allocation.

    ``MPIML_SRUN`` overrides the ``srun`` found on PATH; ``MPIML_SRUN_MPI`` the PMI plugin
    (default ``pmi2``, which MPICH and Open MPI both speak).
    """
    exe = os.environ.get("MPIML_SRUN") or shutil.which("srun")
    if exe is None:
        raise FileNotFoundError("SLURM_JOB_ID is set but there is no srun on PATH (set MPIML_SRUN)")
    mpi = os.environ.get("MPIML_SRUN_MPI", "pmi2")
    return [exe, "-n", str(n), f"--mpi={mpi}", sys.executable, "-m", "mpiml", "run", *argv]


def launch_command(n, argv):
    """``srun`` inside a Slurm allocation (``SLURM_JOB_ID`` set), else ``mpiexec``."""
    if os.environ.get("SLURM_JOB_ID"):
        return srun_command(n, argv)
    return mpiexec_command(n, argv)


def gpu_count():
    """The number of GPUs CuPy sees here (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def strip_np(argv):
    """``argv`` without its ``--np N`` (the re-launched ranks are already under MPI)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--np":
            skip = True
            continue
        if a.startswith("--np="):
            continue
        out.append(a)
    return out


def aggregate_profile(comm, prof):
    """Every rank's profile summary; per op, the calls of rank 0 and the largest time over ranks."""
    mine = prof.summary()
    allp = comm.allgather_obj(mine) if comm.size > 1 else [mine]
    agg = {"ops": {}, "histogram": allp[0]["histogram"], "calls": allp[0]["calls"],
           "total_seconds": max(p["total_seconds"] for p in allp), "wall_seconds": allp[0]["wall_seconds"]}
    for op, o in allp[0]["ops"].items():
        agg["ops"][op] = dict(o, seconds=max(p["ops"].get(op, {}).get("seconds", 0.0) for p in allp))
    return agg
