"""The soak script (benchmarks/gpu/soak.py) on NumPy arrays over the host transport, a few seconds at 2
and 3 ranks: the script the GPU host runs for 5 minutes stays runnable, its checks pass on right
results, and it writes its verdict and memory samples."""

import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_soak_runs_on_the_cpu_and_checks_every_result(mpi, n, tmp_path):
    out = tmp_path / "soak.json"
    proc = mpi(os.path.join(ROOT, "benchmarks", "gpu", "soak.py"), n, "--cpu", "--seconds", "3", "--sample", "0.2",
               "--max-bytes", "65536", "--out", str(out), timeout=180)
    assert "OK:" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "OK" and doc["ranks"] == n and doc["steps"] >= 20
    assert sum(doc["calls_by_op"].values()) == doc["steps"]
    for rank in doc["ranks_detail"]:
        assert rank["failures"] == [] and rank["samples"], rank["rank"]
        assert all(s["rss"] > 0 for s in rank["samples"])
        # the verdict judges this process's own memory; the device-wide figure is information
        assert {"own_device", "ipc_workspace", "device_used", "nvml_process"} <= set(rank["samples"][0])
    assert set(doc["memory_judged"]) == {"rss", "pool_used", "own_device"}
    assert "device_used" in doc["memory_information"]
