"""No hang by default: an unhandled exception on one rank of a plain Python script ends the whole
job (the others were waiting in a collective, with no timeout), and waits have a finite default."""

import time

import pytest

from conftest import run_mpi

RAISE_ON_ONE_RANK = """
import numpy as np
from mpiml.comm import get_comm

comm = get_comm()
if comm.rank == comm.size - 1:
    raise RuntimeError("boom on the last rank")
comm.allreduce(np.ones(3))   # the other ranks wait here for a rank that will never come
print("unreachable", flush=True)
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_unhandled_exception_aborts_the_job(n):
    t0 = time.perf_counter()
    proc = run_mpi(None, n, code=RAISE_ON_ONE_RANK, env={"MPIML_TIMEOUT": "0"}, expect_ok=False, timeout=60)
    took = time.perf_counter() - t0
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "RuntimeError: boom on the last rank" in proc.stderr, proc.stderr[-3000:]
    assert f"unhandled exception on rank {n - 1}; aborting the job" in proc.stderr, proc.stderr[-3000:]
    assert "unreachable" not in proc.stdout
    assert took < 30, f"the job took {took:.1f} s to end"


@pytest.mark.mpi
def test_the_hook_can_be_turned_off():
    code = ("import sys, mpiml; print('hooked' if getattr(sys.excepthook, '_mpiml', False) else 'plain')")
    on = run_mpi(None, 2, code=code, timeout=60)
    off = run_mpi(None, 2, code=code, env={"MPIML_ABORT_ON_EXCEPTION": "0"}, timeout=60)
    # (two ranks' lines can interleave on the launcher's stdout: count, don't split)
    assert on.stdout.count("hooked") == 2 and "plain" not in on.stdout, on.stdout
    assert off.stdout.count("plain") == 2 and "hooked" not in off.stdout, off.stdout


def test_timeout_has_a_finite_default(monkeypatch):
    from mpiml import _config

    monkeypatch.delenv("MPIML_TIMEOUT", raising=False)
    assert _config.timeout() == 600.0
    monkeypatch.setenv("MPIML_TIMEOUT", "0")
    assert _config.timeout() is None  # 0: wait forever, on purpose
    monkeypatch.setenv("MPIML_TIMEOUT", "2.5")
    assert _config.timeout() == 2.5


def test_no_hook_outside_an_mpi_launch():
    import sys

    import mpiml  # noqa: F401

    assert not getattr(sys.excepthook, "_mpiml", False)
