"""``benchmarks/sparse/sparse_gpu.py`` on CPU ranks at a tiny scale: it runs (generated and through a
LIBSVM file), writes its JSON, and its slice check (sparse = dense = scikit-learn) passes; on the GPU
host (marked ``gpu``) the same at a small scale on one GPU."""

import json
import os

import pytest

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "sparse", "sparse_gpu.py")


def _check(result, ranks, rows, queries):
    assert result["ok"] and result["check"]["ok"], result["check"]
    assert result["ranks"] == ranks and result["matrix"]["rows"] == rows
    assert result["matrix"]["csr_bytes"] < result["matrix"]["dense_bytes_would_be"]
    assert result["kmeans"]["n_iter"] >= 1 and result["kmeans"]["labels_equal_predict"]
    assert result["neighbors"]["queries"] == queries and result["neighbors"]["shape_ok"]


@pytest.mark.mpi
@pytest.mark.parametrize("n, file", [(1, False), (2, True)])
def test_sparse_bench_cpu_tiny(mpi, tmp_path, n, file):
    out = tmp_path / "r.json"
    args = ["--device", "cpu", "--scale", "0.002", "--k", "4", "--queries", "60", "--check-rows", "600",
            "--check-features", "300", "--out", str(out)]
    if file:
        args += ["--file", str(tmp_path / "m.svm")]
    mpi(SCRIPT, n, *args, timeout=240)
    result = json.load(open(out))
    _check(result, n, 2000, 60)
    if file:
        assert result["load_seconds"] > 0 and os.path.getsize(tmp_path / "m.svm") > 0


@pytest.mark.gpu
@pytest.mark.mpi
def test_sparse_bench_gpu_small(mpi, tmp_path):
    out = tmp_path / "r.json"
    mpi(SCRIPT, 1, "--scale", "0.02", "--k", "16", "--queries", "500", "--out", str(out), timeout=240)
    _check(json.load(open(out)), 1, 20000, 500)
