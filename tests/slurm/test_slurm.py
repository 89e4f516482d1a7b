"""mpiml under a real Slurm: ``srun -n N python job.py`` and ``mpiml run`` inside an allocation."""

import os
import subprocess
import sys

import pytest

from _slurm_cluster import slurm  # noqa: F401  (the fixture)
from conftest import run_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

JOB = r'''
import numpy as np
import mpiml
from mpiml.comm import get_comm
from mpiml.datasets import make_blobs
from mpiml.cluster import KMeans

bound = mpiml.init(device="auto")
comm = get_comm()
total = comm.allreduce(np.array([comm.rank + 1.0]))
X, _ = make_blobs(n_samples=3000, n_features=4, centers=3, random_state=0, comm=comm)
km = KMeans(n_clusters=3, random_state=0, comm=comm).fit(X)
sizes = comm.allgather_obj(int(X.shape[0]))
print(f"rank {comm.rank}/{comm.size} bound={bound} sum={total[0]:g} rows={sum(sizes)} "
      f"inertia={km.inertia_:.6g}", flush=True)
'''


def _env(slurm):
    env = dict(slurm)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIML_TIMEOUT="60")
    return env


def _run(cmd, env, timeout=120):
    try:
        proc = run_group(cmd, timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung past {timeout} s\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_srun_runs_an_spmd_job(slurm, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = _run(["srun", "-n", "3", "--overcommit", "--mpi=pmi2", sys.executable, str(job)], _env(slurm))
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 3, proc.stdout + proc.stderr
    for r, line in enumerate(lines):
        assert line.startswith(f"rank {r}/3 bound=cpu sum=6 rows=3000 "), line
    # the fitted model is replicated: the same inertia on every rank
    assert len({line.split("inertia=")[1] for line in lines}) == 1, lines


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_mpiml_run_inside_an_allocation_uses_srun(slurm):
    cmd = ["salloc", "-n", "3", "--overcommit", sys.executable, "-m", "mpiml", "run", "kmeans",
           "--data", "blobs:n=3000,d=4,k=3", "--device", "cpu", "--quiet"]
    proc = _run(cmd, _env(slurm))
    out = proc.stdout
    assert "launching: " in out and " -n 3 --mpi=pmi2 " in out, out
    assert os.path.basename(out.split("launching: ")[1].split()[0]) == "srun", out
    assert "3 rank(s)" in out and "fit: " in out, out
