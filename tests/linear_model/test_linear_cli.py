"""``mpiml run linreg|logreg``: the main jobs launch themselves, fit, agree with scikit-learn and save."""

import os
import subprocess
import sys

import pytest

import mpiml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*argv, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), OMP_NUM_THREADS="1", MPIML_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "mpiml", "run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.mpi
def test_run_linreg_and_logreg(tmp_path):
    out = _run("linreg", "--np", "2", "--data", "regression:n=20000,d=8,t=2", "--solver", "tsqr",
               "--compare-sklearn")
    assert out.returncode == 0, out.stderr
    assert "R² over all ranks" in out.stdout and "allgather" in out.stdout
    diff = float(out.stdout.split("largest coefficient difference ")[1].split()[0])
    assert diff < 1e-9
    path = str(tmp_path / "lr.mpiml")
    out = _run("logreg", "--np", "2", "--data", "classification:n=20000,d=8,classes=3", "--save", path)
    assert out.returncode == 0, out.stderr
    assert "allreduce" in out.stdout and "accuracy over all ranks" in out.stdout
    assert list(mpiml.load(path).classes_) == [0, 1, 2]


def test_run_refuses_mismatched_data(capsys):
    from mpiml.cli.run_linear import main

    with pytest.raises(SystemExit) as exc:
        main(["logreg", "--data", "regression"])
    assert exc.value.code == 2 and "needs classification data" in capsys.readouterr().err
