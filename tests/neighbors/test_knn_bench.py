"""``mpiml bench ml --algo knn`` on 1 and 2 CPU ranks, tiny: it runs, writes JSON and PNG, and the variants agree."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_knn_bench_runs_small(tmp_path):
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), OMP_NUM_THREADS="1", MPIML_TIMEOUT="60")
    cmd = [sys.executable, "-m", "mpiml", "bench", "ml", "--algo", "knn", "--device", "cpu", "--ranks", "1,2",
           "--rows", "3000", "--queries", "300", "--features", "8", "--repeats", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.load(open(tmp_path / "ml_knn_cpu.json"))
    assert [r["ranks"] for r in result["runs"]] == [1, 2]
    for r in result["runs"]:
        assert r["overlap_identical"] and r["onesided_identical"] and r["local_identical"]
        assert r["blocking_s"] > 0 and r["overlap_s"] > 0 and r["onesided_s"] > 0 and r["local_s"] > 0
        assert r["auto_choice"] in ("ring", "local") and r["speedup_vs_1"] > 0
    assert "peers" not in result  # the peers part needs a GPU
    assert result["sklearn"]["kneighbors_s"] > 0
    assert (tmp_path / "ml_knn_cpu.png").stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_knn_bench_peers_small(tmp_path):
    """The one-GPU part, tiny: mpiml, the PyTorch user and plain CuPy find the same neighbours."""
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    cmd = [sys.executable, "-m", "mpiml", "bench", "ml", "--algo", "knn", "--device", "gpu", "--part", "peers",
           "--cases", "16:float32:10,16:float64:100", "--peer-rows", "100000", "--peer-queries", "1000",
           "--repeats", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.load(open(tmp_path / "ml_knn_gpu.json"))
    cases = result["peers"]["cases"]
    assert [(c["d"], c["dtype"], c["k"]) for c in cases] == [(16, "float32", 10), (16, "float64", 100)]
    for c in cases:
        assert c["mpiml_s"] > 0 and c["floor_s"] > 0 and c["sklearn_s"] > 0
        assert c["cupy_agreement"] > 0.99
        if c.get("torch_s"):
            assert c["torch_agreement"] > 0.99
    assert (tmp_path / "ml_knn_gpu.png").stat().st_size > 0
