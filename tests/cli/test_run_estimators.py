"""``mpiml run ALGORITHM`` for the estimators but k-means: one options grammar, launched on 2 ranks,
a JSON report whose score equals scikit-learn's on the gathered data, model files, usage errors."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import mpiml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*argv, timeout=150):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), OMP_NUM_THREADS="1", MPIML_TIMEOUT="60")
    return subprocess.run([sys.executable, "-m", "mpiml", "run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _report(tmp_path, *argv):
    path = tmp_path / f"{argv[0]}.json"
    out = _run(*argv, "--np", "2", "--compare-sklearn", "--json", str(path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "launching: " in out.stdout and "communication during fit" in out.stdout
    report = json.loads(path.read_text())
    assert report["ranks"] == 2 and report["fit_seconds"] > 0 and report["communication"]["calls"] > 0
    assert "mpiml run " + argv[0] in report["command"]
    return report


# (arguments, how close the score must be to scikit-learn's on the gathered data)
CASES = {
    "linreg": (["--data", "regression:n=20000,d=8,t=2", "--solver", "tsqr"], 1e-9),
    "logreg": (["--data", "classification:n=20000,d=8,classes=3", "--tol", "1e-8", "--max-iter", "500"], 2e-3),
    "rf": (["--data", "classification:n=4000,d=8", "--trees", "10", "--max-depth", "6"], 0.03),
    "pca": (["--data", "lowrank:n=5000,d=20,rank=5", "--components", "4"], 1e-9),
    "tsvd": (["--data", "lowrank:n=5000,d=20,rank=5", "--components", "4"], 1e-6),
    "knn": (["--data", "classification:n=3000,d=8", "--neighbors", "5"], 1e-12),
}
NEEDS = {"rf": "mpiml.ensemble", "pca": "mpiml.decomposition", "tsvd": "mpiml.decomposition",
         "knn": "mpiml.neighbors"}


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", list(CASES))
def test_run_reports_like_sklearn(tmp_path, algorithm):
    if algorithm in NEEDS and importlib.util.find_spec(NEEDS[algorithm]) is None:
        pytest.skip(f"{NEEDS[algorithm]} is not part of this tree")
    args, tol = CASES[algorithm]
    report = _report(tmp_path, algorithm, *args)
    assert abs(report["score"] - report["scikit_learn"]["score"]) <= tol, report


@pytest.mark.mpi
def test_run_saves_a_model(tmp_path):
    path = str(tmp_path / "lr.mpiml")
    out = _run("logreg", "--np", "2", "--data", "classification:n=20000,d=8,classes=3", "--save", path)
    assert out.returncode == 0, out.stderr
    assert "allreduce" in out.stdout and "accuracy over all ranks" in out.stdout
    assert list(mpiml.load(path).classes_) == [0, 1, 2]


def test_run_refuses_mismatched_data_and_bad_options(capsys, tmp_path):
    from mpiml.cli.run_estimator import main

    with pytest.raises(SystemExit) as exc:
        main(["logreg", "--data", "regression"])
    assert exc.value.code == 2 and "needs classification data" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["rf", "--trees", "0"])
    assert exc.value.code == 2 and "--trees must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["pca", "--json", str(tmp_path / "missing" / "r.json")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
