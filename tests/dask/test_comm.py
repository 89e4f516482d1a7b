"""The mpi:// comm backend, checked through distributed's Comm API under mpiexec.

The checks live in ``_comm_checks.py``; each rank count runs them all in one
``mpiexec`` launch (module-scoped fixture), and every check is reported as its
own test. Frames are split into 64 KiB chunks here so that chunking is
exercised by ordinary messages.
"""

import json
import os
import re

import pytest

from conftest import run_mpi

pytest.importorskip("distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "_comm_checks.py")

with open(SCRIPT) as _f:
    _NAMES = re.findall(r"^@check\nasync def (\w+)", _f.read(), flags=re.M)
SINGLE = [n for n in _NAMES if not n.startswith("cross_")]
CROSS = [n for n in _NAMES if n.startswith("cross_")]


def _run_checks(ranks, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"comm{ranks}") / "results.json"
    proc = run_mpi(
        SCRIPT, ranks, out, timeout=150, expect_ok=False,
        env={"MPIML_DASK_CHUNK_BYTES": "65536", "DASK_LOGGING__DISTRIBUTED": "error"},
    )
    if not out.exists():
        pytest.fail(f"the checks did not report (exit {proc.returncode})\n"
                    f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single_rank_results(tmp_path_factory):
    return _run_checks(1, tmp_path_factory)


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    return _run_checks(2, tmp_path_factory)


def _verdict(results, name):
    verdict = results.get(name, "not run")
    if verdict.startswith("skipped"):
        pytest.skip(verdict)
    assert verdict == "ok", verdict


@pytest.mark.mpi
@pytest.mark.parametrize("name", SINGLE)
def test_single_process(single_rank_results, name):
    """Both ends in one rank: the data still goes through MPI (self messages)."""
    _verdict(single_rank_results, name)


@pytest.mark.mpi
@pytest.mark.parametrize("name", CROSS)
def test_two_ranks(two_rank_results, name):
    """Listener and connector on different ranks."""
    _verdict(two_rank_results, name)
