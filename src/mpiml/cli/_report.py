"""How a command run on every rank reports what went wrong: once, with the right exit status.

* Usage errors (exit status 2 on every rank) are printed by rank 0 only: every rank parses the
  same arguments and finds the same error, so one copy is enough. :class:`ArgumentParser` prints
  help, usage and errors on rank 0 alone (the rank comes from the launcher's variables: no MPI
  is needed to print a usage error).
* Problems found before the work starts that may differ across ranks (an output directory seen
  from one node, a GPU on one host) are agreed by :func:`agree_usage` and reported as usage
  errors too.
* Run-time errors (exit status 1): :class:`Outcome` agrees on how each rank ended, over a
  duplicate of the world communicator and with a deadline, so that a rank stuck in a collective
  cannot hang the others. When every rank arrives, rank 0 prints one line; when some rank does
  not arrive in time, each failed rank prints its line and aborts the job. Tracebacks only with
  ``--debug``.
"""

import os
import sys
import time
import traceback

from .._errors import MpimlError
from ._options import ArgumentParser, launch_rank, say_once

__all__ = ["ArgumentParser", "launch_rank", "say_once", "UsageError", "Outcome", "one_line", "output_problems",
           "preflight", "run_checked"]

#: Seconds a failed rank waits for the others to report before it aborts the job.
FAILURE_WAIT = 10.0

class UsageError(Exception):
    """A usage error found after parsing: printed once, exit status 2 on every rank."""


def one_line(exc):
    """An exception as one line: its message's first line, led by its class unless it is mpiml's own."""
    text = str(exc).strip().splitlines()
    text = text[0] if text else ""
    if isinstance(exc, MpimlError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Outcome:
    """How the ranks of a command ended, agreed without trusting every rank to arrive.

    Build one on every rank before the work starts (it duplicates the world communicator, a
    collective); call :meth:`finish` on every rank with this rank's status (0, 1 or 2) and
    message. Returns the exit status of the job.
    """

    def __init__(self, prog, debug=False):
        self.prog = prog
        self.debug = debug
        self.world = None
        from ..comm import launched_by_mpi

        if launched_by_mpi():
            from mpi4py import MPI

            if MPI.COMM_WORLD.Get_size() > 1:
                self.world = MPI.COMM_WORLD.Dup()

    @property
    def rank(self):
        return 0 if self.world is None else self.world.Get_rank()

    def failed(self, exc):
        """``(status, message)`` for an exception; with ``--debug`` its traceback is printed here."""
        if isinstance(exc, UsageError):
            return 2, str(exc)
        if self.debug:
            lead = f"rank {self.rank}: " if self.world is not None else ""
            sys.stderr.write(lead + "".join(traceback.format_exception(exc)))
            sys.stderr.flush()
        return 1, one_line(exc)

    def finish(self, status, message=None):
        if self.world is None:
            if status:
                self._print(status, message)
            return status
        import numpy as np

        from .._config import timeout

        wait = FAILURE_WAIT if status else (timeout() or None)
        mine = np.array([status], dtype=np.int32)
        every = np.zeros(self.world.Get_size(), dtype=np.int32)
        req = self.world.Iallgather(mine, every)
        deadline = None if wait is None else time.monotonic() + wait
        while not req.Test():
            if deadline is not None and time.monotonic() > deadline:
                self._give_up(status, message, wait)
            time.sleep(0.002)
        bad = [r for r, s in enumerate(every.tolist()) if s]
        if not bad:
            self._free()
            return 0
        messages = self.world.allgather(message)  # every rank is here: a blocking call is safe
        first = bad[0]
        text = messages[first]
        if len(bad) < self.world.Get_size() or len({messages[r] for r in bad}) > 1:
            text = f"{text} (on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))})"
        if self.rank == 0:
            self._print(int(every[first]), text)
        self._free()
        return int(every[first])

    def _free(self):
        self.world.Free()
        self.world = None

    def _print(self, status, text):
        hint = "" if self.debug or status == 2 else " (--debug shows the traceback)"
        print(f"{self.prog}: error: {text}{hint}", file=sys.stderr, flush=True)

    def _give_up(self, status, message, wait):
        from mpi4py import MPI

        if status:
            print(f"{self.prog}: error on rank {self.rank}: {message}; the other ranks did not report within "
                  f"{wait:g} s: aborting the job", file=sys.stderr, flush=True)
        else:
            print(f"{self.prog}: rank {self.rank} finished but some rank did not report within {wait:g} s: "
                  "aborting the job", file=sys.stderr, flush=True)
        time.sleep(0.5)  # let the launcher forward the line before the job is torn down
        MPI.COMM_WORLD.Abort(status or 1)


def output_problems(args):
    """What is wrong with ``--save`` / ``--json`` as seen from this process (a list of messages)."""
    problems = []
    for option in ("save", "json"):
        path = getattr(args, option, None)
        if not path:
            continue
        directory = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            problems.append(f"--{option} {path}: is a directory")
        elif not os.path.isdir(directory):
            problems.append(f"--{option} {path}: the directory {directory} does not exist")
        elif not os.access(directory, os.W_OK | os.X_OK):
            problems.append(f"--{option} {path}: the directory {directory} is not writable")
    return problems


def device_problems(args):
    """``--device gpu`` where CuPy sees no GPU."""
    if getattr(args, "device", None) != "gpu":
        return []
    from ._options import gpu_count as _gpu_count

    return [] if _gpu_count() else ["--device gpu: CuPy sees no GPU here (use --device cpu or auto)"]


def preflight(args, comm):
    """Check output paths (where rank 0 writes them) and the device on every rank; one agreement.

    Raises the same :class:`UsageError` on every rank if any rank found a problem.
    """
    mine = (output_problems(args) if comm.rank == 0 else []) + device_problems(args)
    every = comm.allgather_obj(mine) if comm.size > 1 else [mine]
    found = {}
    for rank, problems in enumerate(every):
        for text in problems:
            found.setdefault(text, []).append(rank)
    if not found:
        return
    parts = []
    for text, ranks in found.items():
        if comm.size > 1 and len(ranks) < comm.size and not text.startswith(("--save", "--json")):
            text += f" (on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        parts.append(text)
    raise UsageError("; ".join(parts))


def run_checked(prog, args, body):
    """Run ``body(args, comm)`` on every rank after :func:`preflight`; returns the job's exit status.

    Every exception becomes one line (rank 0 prints it when every rank reports, see :class:`Outcome`).
    """
    outcome = Outcome(prog, debug=getattr(args, "debug", False))
    status, message = 0, None
    try:
        from ..comm import get_comm

        comm = get_comm(args.backend)
        preflight(args, comm)
        status = body(args, comm) or 0
    except Exception as exc:  # noqa: BLE001 - reported once, with the right status
        status, message = outcome.failed(exc)
    return outcome.finish(status, message)
