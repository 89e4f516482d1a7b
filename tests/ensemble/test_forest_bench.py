"""``mpiml bench ml --algo rf`` on host ranks: both forests in one JSON file, the level collectives per level
and their routes, and the same forest (score) at every rank count."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.mpi
def test_bench_rf_both_forests_scattered_levels(tmp_path):
    out = tmp_path / "rf.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), OMP_NUM_THREADS="1", MPIML_RF_SCATTER="1",
               MPIML_RF_TREE_PARALLEL_BYTES="0", MPIML_RF_LEVEL_PROFILE="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")   # a venv's mpiexec too
    if shutil.which("mpiexec", path=env["PATH"]) is None:
        pytest.skip("no mpiexec")
    cmd = [sys.executable, "-m", "mpiml", "bench", "ml", "--algo", "rf", "--device", "cpu", "--ranks", "1,2",
           "--rows", "3000", "--trees", "3", "--depth", "5", "--estimators", "classifier,regressor", "--no-sklearn",
           "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert sorted((r["estimator"], r["ranks"]) for r in runs) == [("classifier", 1), ("classifier", 2),
                                                                  ("regressor", 1), ("regressor", 2)]
    for est in ("classifier", "regressor"):
        one, two = (next(r for r in runs if r["estimator"] == est and r["ranks"] == k) for k in (1, 2))
        assert one["score"] == two["score"], est                        # the same trees at 1 and 2 ranks
        assert two["scatter"] and two["reduce_scatter_bytes"] > 0 and two["allgather_bytes"] > 0
        assert "reduce_scatter" in two["collective_paths"] and two["level_collectives_ms_per_level"] > 0
        assert two["skew_wait_s"] >= 0 and one["level_bytes_per_level"] == 0
        assert two["grow_s"] > 0 and two["hist_s"] > 0
