"""``mpiml bench ml --device cpu``: one run, every contender on the same data, JSON + PNG."""

import json
import os
import sys

import pytest

from conftest import run_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.mpi
def test_small_run_writes_every_figure(tmp_path):
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), MPIML_TIMEOUT="60", OMP_NUM_THREADS="")
    cmd = [sys.executable, "-m", "mpiml", "bench", "ml", "--device", "cpu", "--estimators", "kmeans,knn,linreg",
           "--ranks", "1,2", "--rows", "3000", "--knn-rows", "2000", "--queries", "100", "--features", "8",
           "--repeat", "1", "--out", str(tmp_path), "--tag", "t"]
    out = run_group(cmd, 300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "ml_cpu_t.json").read_text())
    assert (tmp_path / "ml_cpu_t.png").stat().st_size > 0
    assert result["machine"]["host"] and result["date"] and "bench ml --device cpu" in result["command"]
    for r in ("1", "2"):
        run = result["mpiml"][r]
        assert run["ranks"] == int(r) and set(run["seconds"]) == {"kmeans", "knn", "linreg"}
    assert set(result["sklearn"]["seconds"]) == {"kmeans", "knn", "linreg"}
    assert "seconds" in result["sklearnex"] or "skipped" in result["sklearnex"]
    # each rank's own work and its waits add up to its wall time; the Lloyd iterations' memory rate
    times = result["mpiml"]["2"]["rank_seconds"]["knn"]
    assert len(times["wall"]) == 2 and all(w >= 0 and c >= 0 for w, c in zip(times["wait"], times["compute"]))
    assert times["wall"] == pytest.approx([w + c for w, c in zip(times["wait"], times["compute"])], abs=1e-4)
    assert times["calls"] >= 2  # at least the fit's and the search's agreements
    assert result["mpiml"]["1"]["iterations"]["kmeans"]["GBps_rows"] > 0
    # the same data and starting centres everywhere: the same k-means inertia and k-NN distances
    for name in ("kmeans", "knn"):
        ref = result["sklearn"]["values"][name]
        for r in ("1", "2"):
            assert result["mpiml"][r]["values"][name] == pytest.approx(ref, rel=1e-4), (name, r)
