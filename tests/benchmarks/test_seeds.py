"""The seed experiments of ``benchmarks/seeds/`` (001 Dask, 002 broadcast, 003 k-NN ring) at ``--quick`` on CPU
ranks under a real mpiexec: each runs, checks its own results, writes its JSON (machine, date, command, the
peer, the document's figure and the ratio) and PNG, and prints its README row.  On the GPU host (marked
``gpu``) 002 and 003 run the same way at small sizes on the GPUs."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, _mpiexec, have_gpu, run_group

SEEDS = os.path.join(ROOT, "benchmarks", "seeds")


def _script(name):
    return os.path.join(SEEDS, name)


def _check_record(doc, seed, ranks=None):
    assert doc["seed"] == seed
    assert doc["machine"]["host"] and doc["date"] and doc["command"]
    assert doc["document"]["figure"] and doc["peer"]
    if ranks is not None:
        assert doc["ranks"] == ranks and f"-n {ranks} " in doc["command"]


def _row(stdout, seed):
    rows = [line for line in stdout.splitlines() if line.startswith(f"README row: | {seed} |")]
    assert rows, stdout[-2000:]
    return rows


# ---------------------------------------------------------------------- 002: broadcast
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3, 4])
def test_seed002_bcast_cpu_quick(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    proc = mpi(_script("seed002_bcast.py"), n, "--device", "cpu", "--quick", "--json", out, "--plot", png,
               timeout=120)
    doc = json.loads(out.read_text())
    _check_record(doc, "002", n)
    assert doc["peer"] == "mpi_raw" and png.stat().st_size > 0
    rows = doc["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    paths = {r["path"] for r in rows}
    assert {"mpi_raw", "auto", "native", "binomial", "knomial", "chain"} <= paths
    assert ("two_level" in paths) == (n == 4)  # two virtual nodes of 2 ranks need 4 ranks
    sizes = sorted({r["bytes"] for r in rows})
    assert sizes[0] == 4 and sizes[-1] == 64 << 10
    assert all(r["us"] > 0 and r["GBps"] > 0 for r in rows)
    a2a = doc["alltoall"]
    assert not [r for r in a2a if "error" in r] and sorted({r["bytes"] for r in a2a}) == [64, 4096]
    assert {r["path"] for r in a2a} == paths - {"two_level"} and all(r["us"] > 0 for r in a2a)
    models = {(r["model"], r["path"]): r for r in doc["streaming"]}
    assert {m for m, _ in models} == {"alexnet", "vgg16"}
    assert all(r["ms"] > 0 and "error" not in r for r in models.values())
    # the parameter counts of the two networks, scaled by --quick's 1e-3 tensor by tensor
    assert models[("alexnet", "auto")]["tensors"] == 16 and models[("vgg16", "auto")]["tensors"] == 32
    assert models[("vgg16", "fused:auto")]["parameters"] == models[("vgg16", "auto")]["parameters"]
    s = doc["summary"]
    assert s["doc_range_bytes"] == [4096, 2 << 20]
    assert all(p["peer_us"] > 0 and p["auto_over_peer"] > 0 for p in s["sizes"])
    assert s["auto_over_peer_median_doc_range"] > 0
    assert s["ours_vs_document"] == pytest.approx(min(a["auto_over_peer"] for a in s["alltoall_sizes"]) / 0.32)
    assert set(s["models"]) == {"alexnet", "vgg16"}
    _row(proc.stdout, "002")


def test_seed002_model_sizes():
    sys.path.insert(0, SEEDS)
    try:
        import seed002_bcast as s
    finally:
        sys.path.remove(SEEDS)
    assert sum(s.MODELS["alexnet"]()) == 61_100_840 and len(s.MODELS["alexnet"]()) == 16
    assert sum(s.MODELS["vgg16"]()) == 138_357_544 and len(s.MODELS["vgg16"]()) == 32


# ---------------------------------------------------------------------- 003: k-NN ring
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 3])
def test_seed003_knn_cpu_quick(mpi, tmp_path, n):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    proc = mpi(_script("seed003_knn.py"), n, "--device", "cpu", "--quick", "--json", out, "--plot", png,
               timeout=180)
    doc = json.loads(out.read_text())
    _check_record(doc, "003", n)
    assert png.stat().st_size > 0
    rows = {r["workload"]: r for r in doc["rows"]}
    assert set(rows) == {"kdd-xs", "dense"}
    sparse, dense = rows["kdd-xs"], rows["dense"]
    assert sparse["kind"] == "sparse" and sparse["nnz_per_row"] == 36 and dense["features"] == 36
    for r in rows.values():
        assert all(r["identical_predictions"].values())  # every exchange predicts the blocking ring's labels
        assert all(r[f"{ex}_s"] > 0 for ex in ("blocking", "overlap", "onesided"))
        assert r["overlap_saved_pct"] == pytest.approx(100 * (1 - r["overlap_s"] / r["blocking_s"]))
        if n > 1:
            assert r["comm_s"] > 0 and r["compute_s"] > 0 and 0 <= r["ideal_saved_pct"] <= 50
        else:
            assert "comm_s" not in r
    assert sparse["document_saved_pct"] == {"overlap": 5.9, "onesided": 27.6}
    assert sparse["ours_over_document"]["onesided"] == pytest.approx(sparse["onesided_saved_pct"] / 27.6)
    assert dense["document_saved_pct"] is None
    assert len(_row(proc.stdout, "003")) == 2


def test_seed003_rejects_a_malformed_workload():
    proc = subprocess.run([sys.executable, _script("seed003_knn.py"), "--device", "cpu", "--workloads", "x:dense:10"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")})
    assert proc.returncode == 2 and "expected name:sparse|dense" in proc.stderr


# ---------------------------------------------------------------------- 001: Dask
@pytest.mark.mpi
@pytest.mark.slow
def test_seed001_dask_cpu_quick(tmp_path):
    pytest.importorskip("distributed")
    exe = _mpiexec()
    if exe is None:
        pytest.skip("no mpiexec on PATH")
    launcher = shlex.join([exe, *os.environ.get("MPIML_TEST_MPIEXEC_ARGS", "").split()])
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src"), "OMP_NUM_THREADS": "1",
           "DASK_LOGGING__DISTRIBUTED": "error", "MPIML_TIMEOUT": "60"}
    proc = run_group([sys.executable, _script("seed001_dask.py"), "--device", "cpu", "--quick", "--mpiexec", launcher,
                      "--timeout", "100", "--json", str(out), "--plot", str(png)], timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    _check_record(doc, "001")
    assert png.stat().st_size > 0
    assert set(doc["comm"]["results"]) == {"mpi", "tcp"}
    assert max(r["bytes"] for r in doc["comm"]["results"]["mpi"]) == 4 << 20
    c = doc["summary"]["comm"]
    assert c["latency_1B_speedup"] > 0 and c["throughput_2MB_up_speedup_median"] > 0
    assert c["latency_vs_document"] == pytest.approx(c["latency_1B_speedup"] / 6.0)
    assert {(r["protocol"], r["workers"]) for r in doc["apps"]} == {("mpi", 1), ("tcp", 1)}
    apps = {a["app"]: a for a in doc["summary"]["apps"]}
    assert set(apps) == {"sum_transpose", "sum_transpose_rows", "sum"}
    assert all(a["values_agree"] and a["tcp_over_mpi"] > 0 for a in apps.values())
    assert apps["sum_transpose"]["vs_document"] == pytest.approx(apps["sum_transpose"]["tcp_over_mpi"] / 3.47)
    _row(proc.stdout, "001")


@pytest.mark.mpi
def test_seed001_refuses_to_run_on_every_rank(mpi):
    # a driver: under mpiexec -n 2 each rank would launch the same Dask jobs
    proc = mpi(_script("seed001_dask.py"), 2, "--device", "cpu", "--quick", timeout=60, expect_ok=False)
    assert proc.returncode != 0 and "run it as one process" in proc.stderr


# ---------------------------------------------------------------------- the GPU host
def _gpus():
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed002_bcast_gpu_small(mpi, tmp_path):
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    out = tmp_path / "s.json"
    mpi(_script("seed002_bcast.py"), n, "--device", "gpu", "--max-bytes", str(4 << 20), "--model-scale", "0.05",
        "--rounds", "1", "--steps", "2", "--json", out, timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "002", n)
    ok = {r["path"] for r in doc["rows"] if "error" not in r}
    assert {"nccl_raw", "auto", "nccl"} <= ok, [r for r in doc["rows"] if "error" in r][:5]
    if n > 1:
        assert {"ipc/pull", "mpi/chain"} <= ok
    assert all("error" not in r for r in doc["streaming"] if r["path"] in ("nccl_raw", "auto")), doc["streaming"]


@pytest.mark.gpu
@pytest.mark.mpi
def test_seed003_knn_gpu_small(mpi, tmp_path):
    n = 2 if have_gpu() and _gpus() >= 2 else 1
    out = tmp_path / "s.json"
    mpi(_script("seed003_knn.py"), n, "--device", "gpu", "--workloads",
        "kdd-xs:sparse:20000:20216830:36:500,dense:dense:50000:36:-:500", "--repeats", "1", "--json", out, timeout=240)
    doc = json.loads(out.read_text())
    _check_record(doc, "003", n)
    assert all(all(r["identical_predictions"].values()) for r in doc["rows"])
