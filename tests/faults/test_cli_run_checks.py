"""``mpiml run`` checks before it computes and reports each problem once, with the right exit status.

Usage errors (bad options, an output path in a missing directory, ``--device gpu`` without a GPU,
too few rows for the options) are printed once by rank 0 and exit 2 on every rank, before the
fit; run-time errors are one line and exit 1; tracebacks only with ``--debug``; a rank that fails
while another is stuck in a collective ends the job instead of hanging it.
"""

import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT, have_gpu, mpiexec_cmd, run_group, run_mpi


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), os.path.join(ROOT, "tests"),
                                         env.get("PYTHONPATH", "")])
    env.update(MPIML_TIMEOUT="60", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(extra)
    return env


def _mpiml_run(n, *args, timeout=180, **env):
    cmd = mpiexec_cmd(n) + [sys.executable, "-m", "mpiml", "run", *map(str, args)]
    try:
        return run_group(cmd, timeout, env=_env(**env))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} hung past {timeout} s")


def _errors(proc):
    return [line for line in proc.stderr.splitlines() if "error" in line]


@pytest.mark.mpi
def test_usage_error_is_printed_once():
    proc = _mpiml_run(2, "kmeans", "--data", "blobs:n=0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("blobs parameter n must be at least 1") == 1, proc.stderr
    assert proc.stderr.count("usage: mpiml run") == 1
    proc = _mpiml_run(2, "--help")
    assert proc.returncode == 0 and proc.stdout.count("usage: mpiml run") == 1, proc.stdout


@pytest.mark.mpi
def test_save_into_a_missing_directory_is_refused_before_the_fit(tmp_path):
    target = tmp_path / "missing" / "km.mpiml"
    proc = _mpiml_run(2, "kmeans", "--data", "blobs:n=2000,d=4,k=3", "--device", "cpu", "--quiet",
                      "--save", target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _errors(proc) == [f"mpiml run: error: --save {target}: the directory {target.parent} does not exist"]
    assert "fit:" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_json_onto_a_directory_is_refused_before_the_fit(tmp_path):
    proc = _mpiml_run(2, "linreg", "--data", "regression:n=2000,d=4", "--device", "cpu", "--json", tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _errors(proc) == [f"mpiml run: error: --json {tmp_path}: is a directory"], proc.stderr
    assert "fit:" not in proc.stdout


@pytest.mark.mpi
@pytest.mark.skipif(have_gpu(), reason="needs a host without a GPU")
def test_gpu_without_a_gpu_is_a_usage_error():
    proc = _mpiml_run(2, "linreg", "--data", "regression:n=1000,d=4", "--device", "gpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _errors(proc) == ["mpiml run: error: --device gpu: CuPy sees no GPU here (use --device cpu or auto)"]


@pytest.mark.mpi
@pytest.mark.parametrize("n, args, message", [
    (3, ["kmeans", "--data", "blobs:n=5,d=2,k=2", "--k", "8"],
     "--k 8: the data has 5 row(s), fewer than the 8 clusters asked for"),
    (2, ["knn", "--data", "classification:n=6,d=4", "--neighbors", "10"],
     "--neighbors 10: the data has 6 row(s), fewer than the neighbours asked for"),
    (2, ["pca", "--data", "lowrank:n=50,d=6,rank=2", "--components", "7"],
     "--components 7: more than min(rows, features) = min(50, 6)"),
], ids=["kmeans-3-ranks", "knn", "pca"])
def test_too_few_rows_or_features_for_the_options(n, args, message):
    proc = _mpiml_run(n, *args, "--device", "cpu")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _errors(proc) == [f"mpiml run: error: {message}"], proc.stderr
    assert "fit:" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.mpi
def test_bad_csv_cell_is_one_line_and_exit_1(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("".join(f"{i},{2 * i}\n" for i in range(20)).replace("14,28", "14,abc"))
    proc = _mpiml_run(2, "kmeans", "--data", path, "--k", "2", "--device", "cpu", "--quiet")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = _errors(proc)
    assert line.startswith("mpiml run: error: ") and "abc" in line and "--debug" in line, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _mpiml_run(2, "kmeans", "--data", path, "--k", "2", "--device", "cpu", "--quiet", "--debug")
    assert proc.returncode == 1
    assert proc.stderr.count("Traceback (most recent call last)") == 2, proc.stderr  # one per failing rank
    assert len([line for line in proc.stderr.splitlines() if line.startswith("mpiml run: error: ")]) == 1


ONE_RANK_FAILS = """
import sys, time
import numpy as np
from types import SimpleNamespace
from mpiml.cli._report import run_checked

stuck = sys.argv[1] == "stuck"


def body(args, comm):
    if comm.rank == comm.size - 1:
        raise KeyError("only on the last rank")
    if stuck:
        comm.allreduce(np.ones(2))  # waits for the last rank, which never comes
    return 0


args = SimpleNamespace(backend="auto", debug=False, device="cpu", save=None, json=None)
sys.exit(run_checked("mpiml run", args, body))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_error_on_one_rank_while_the_others_finish(n):
    proc = run_mpi(None, n, "finish", code=ONE_RANK_FAILS, expect_ok=False, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _errors(proc) == [f"mpiml run: error: KeyError: 'only on the last rank' (on rank {n - 1}) "
                             "(--debug shows the traceback)"], proc.stderr


@pytest.mark.mpi
def test_error_on_one_rank_while_another_is_stuck_ends_the_job():
    from mpiml.cli._report import FAILURE_WAIT

    t0 = time.perf_counter()
    proc = run_mpi(None, 2, "stuck", code=ONE_RANK_FAILS, expect_ok=False, timeout=120,
                   env={"MPIML_TIMEOUT": "0"})  # no timeout: only the abort can end rank 0's wait
    took = time.perf_counter() - t0
    assert proc.returncode != 0
    assert "mpiml run: error on rank 1: KeyError: 'only on the last rank'; the other ranks did not report " \
           f"within {FAILURE_WAIT:g} s: aborting the job" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < FAILURE_WAIT + 60
