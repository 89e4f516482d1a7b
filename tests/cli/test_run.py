"""``mpiml run kmeans``: the main job, launched the way users launch it."""

import os
import subprocess
import sys

import numpy as np
import pytest

import mpiml
from mpiml.cli.run import mpiexec_command, parse_data_spec

from conftest import ROOT, run_mpi


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env.setdefault("MPIML_TIMEOUT", "60")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _mpiml(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "mpiml", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def test_data_spec():
    assert parse_data_spec("blobs:n=10,d=3,k=2,seed=4") == ("blobs", {"n": 10, "d": 3, "k": 2, "seed": 4, "std": 1.0})
    assert parse_data_spec("blobs")[1]["n"] == 200000
    for bad in ("blobs:n=0", "blobs:q=3", "blobs:n=x", "nope.npy"):
        with pytest.raises(ValueError):
            parse_data_spec(bad)


def test_mpiexec_command_relaunches_this_python(monkeypatch):
    monkeypatch.setenv("MPIML_MPIEXEC", sys.executable)  # any executable: only the shape is checked
    cmd = mpiexec_command(3, ["kmeans", "--k", "4"])
    assert cmd[:3] == [sys.executable, "-n", "3"]
    assert cmd[-6:] == ["-m", "mpiml", "run", "kmeans", "--k", "4"]


@pytest.mark.mpi
def test_main_job_relaunches_and_saves(tmp_path):
    """`--np 3` from a plain process: re-launch under mpiexec, fit, profile, save, compare with scikit-learn."""
    model = tmp_path / "km.mpiml"
    proc = _mpiml("run", "kmeans", "--np", "3", "--data", "blobs:n=3000,d=4,k=3,seed=1", "--device", "cpu",
                  "--save", str(model), "--compare-sklearn", "--dtype", "float64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "3 rank(s) on CPU" in out
    assert "Iteration 0" in out and "fit:" in out and "allreduce" in out and "message sizes" in out
    assert "scikit-learn KMeans" in out and "inertia ratio" in out
    assert out.count("fit:") == 1  # rank 0 prints
    km = mpiml.load(str(model))
    assert km.cluster_centers_.shape == (3, 4)
    ratio = float(out.split("inertia ratio mpiml / scikit-learn = ")[1].split(",")[0])
    assert ratio < 1.01


# the README's main job with every default (`mpiml run --device cpu`) is timed with the other algorithms'
# defaults in test_run_cpu.py::test_defaults_finish_within_a_minute_on_two_cpu_ranks[kmeans]


@pytest.mark.mpi
def test_usage_error_exits_2_on_every_rank():
    code = "import sys; from mpiml.cli import main; sys.exit(main(['run', 'kmeans', '--data', 'blobs:n=0']))"
    proc = run_mpi(None, 2, code=code, expect_ok=False, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("blobs parameter n must be at least 1") == 1  # rank 0 prints it


@pytest.mark.mpi
def test_npy_file_on_two_ranks(tmp_path):
    X = np.random.RandomState(0).randn(500, 3)
    X[:250] += 8
    path = tmp_path / "x.npy"
    np.save(path, X)
    code = (f"import sys; from mpiml.cli import main; "
            f"sys.exit(main(['run', 'kmeans', '--data', r'{path}', '--k', '2', '--quiet', '--device', 'cpu']))")
    proc = run_mpi(None, 2, code=code, timeout=60)
    assert "500 x 3 float32, k=2" in proc.stdout
    assert "Iteration" not in proc.stdout
