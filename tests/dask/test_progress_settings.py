"""The progress engine's spin window follows the cores per process of the node."""

import pytest

pytest.importorskip("distributed")

from mpiml.dask import _progress


@pytest.fixture
def launcher_env(monkeypatch):
    for var in _progress._LOCAL_SIZE_VARS + ("MPIML_DASK_SPIN",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_progress.os, "sched_getaffinity", lambda pid: set(range(16)))
    return monkeypatch


@pytest.mark.parametrize("var, value, spin", [
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 0.05),     # 16 cores, 4 processes
    ("MPI_LOCALNRANKS", "8", 0.05),                # exactly 2 cores each
    ("MPI_LOCALNRANKS", "9", 0.002),               # fewer than 2 cores each
    ("SLURM_NTASKS_PER_NODE", "32(x2)", 0.002),    # oversubscribed, Slurm's repeat syntax
])
def test_spin_follows_cores_per_process(launcher_env, var, value, spin):
    launcher_env.setenv(var, value)
    assert _progress.default_spin() == spin
    assert _progress.poll_settings()[0] == spin


def test_spin_without_launcher_and_explicit(launcher_env):
    assert _progress.default_spin() == 0.002  # no launcher variable: the conservative default
    launcher_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
    launcher_env.setenv("MPIML_DASK_SPIN", "0.01")
    assert _progress.poll_settings()[0] == 0.01
