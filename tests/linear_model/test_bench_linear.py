"""The sparse Ridge / TruncatedSVD benchmark on CPU ranks with tiny sizes: it runs, writes its JSON and
plot, and its fits agree with scikit-learn's on the same CSR rows (which it fits whole at these sizes)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, _mpiexec


@pytest.mark.mpi
@pytest.mark.parametrize("algo,extra", [("tsvd", ["--components", "4"]),
                                        ("ridge", ["--features", "2500", "--tol", "1e-12"])])
def test_sparse_benchmark_on_cpu(tmp_path, algo, extra):
    if _mpiexec() is None:
        pytest.skip("no mpiexec on PATH")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env.setdefault("MPIML_TIMEOUT", "60")
    args = ["--algo", algo, "--sparse", "0.02", "--rows", "2000", "--features", "300", "--ranks", "1,2",
            "--device", "cpu", "--repeats", "1", "--out", str(tmp_path), *extra]
    proc = subprocess.run([sys.executable, "-m", "mpiml.bench.ml_linear", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = tmp_path / f"ml_{algo}_sparse_cpu.json"
    assert path.exists() and (tmp_path / f"ml_{algo}_sparse_cpu.png").exists()
    result = json.loads(path.read_text())
    assert result["sparse"] == 0.02 and result["machine"] and result["command"]
    runs = [r for r in result["runs"] if "fit_s" in r]
    assert [r["ranks"] for r in runs] == [1, 2]
    key = "singular_values_rel_to_sklearn" if algo == "tsvd" else "coef_rel_to_sklearn"
    for run in runs:
        assert run["fit_s"] > 0 and run["floor_s"] > 0 and run["nnz_per_rank_max"] > 0 and run["passes"] > 2
        assert run[key] < 1e-8, run[key]
    assert runs[1]["collectives"]["allreduce"]["calls"] > 0
    assert not result["sklearn"]["extrapolated"] and result["sklearn"]["fit_s"] > 0
    if algo == "ridge":
        assert runs[0]["solver"] == result["sklearn"]["solver"] == "sparse_cg"


ALGOS = ["linreg", "ridge", "logreg", "pca", "tsvd"]


def _small(algo):
    return ["--rows", "6000", "--features", "24", "--components", "4"] if algo in ("pca", "tsvd") else \
        ["--rows", "6000", "--features", "16"]


@pytest.fixture(scope="module")
def bench_runs(tmp_path_factory):
    """The five runs of ``mpiml.bench.ml_decomp`` on 2 ranks as the cases of one launch (``bench_decomp_case.py``):
    a rank's start costs about what one tiny run does."""
    from _spmd_cases import CaseLaunches

    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_decomp_case.py")
    cases = [{"name": algo, "script": script,
              "args": ["{out}", "--algo", algo, "--device", "cpu", "--sklearn-rows", "3000", *_small(algo)]}
             for algo in ALGOS]
    return CaseLaunches({2: cases}, tmp_path_factory, timeout=540)


@pytest.mark.mpi
@pytest.mark.parametrize("algo", ALGOS)
def test_spmd_benchmark_on_cpu(bench_runs, algo):
    """The one-run SPMD benchmark under mpiexec: mpiml, the plain peer, scikit-learn and the floor in one JSON."""
    out = bench_runs.verdict(2, algo) / f"ml_{algo}.json"
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").exists()
    assert result["ranks"] == 2 and result["rows"] == 6000 and result["command"] and result["machine"]
    assert result["mpiml"]["fit_s"] > 0 and result["peer"]["fit_s"] > 0 and result["floor"]["floor_s"] > 0
    assert result["sklearn"]["scaled"] and result["sklearn"]["fit_s_scaled"] > result["sklearn"]["fit_s"]
    if algo in ("linreg", "ridge", "pca"):  # exact solvers on both sides: rounding-level agreement
        key = "coef_max_rel" if algo != "pca" else "spectrum_max_rel"
        assert result["vs_peer"][key] < 1e-4, result["vs_peer"]
    if algo == "logreg":  # both stop at a tolerance of 1e-4 on the gradient
        assert result["vs_peer"]["coef_max_rel"] < 1e-2
