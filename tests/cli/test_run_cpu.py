"""``mpiml run`` on CPU ranks: sizes for a CPU, progress with what remains, how to scale up, threads per rank."""

import os
import sys
import time

import pytest

from conftest import run_group
from mpiml.cli import _progress
from mpiml.cli.run_estimator import _CPU_SIZES, _SPECS, parse_data_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: No thread variables: each rank must pick its own share.
_BLANK = {v: "" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "SLURM_CPUS_PER_TASK")}


def _run(*argv, timeout=150):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), MPIML_TIMEOUT="60", **_BLANK)
    return run_group([sys.executable, "-m", "mpiml", "run", *argv], timeout, env=env)


def test_cpu_sizes_fill_what_the_spec_leaves_out():
    kind, params = parse_data_spec("classification", "knn", cpu=True)
    assert (params["n"], params["d"]) == (_CPU_SIZES["knn"]["n"], _CPU_SIZES["knn"]["d"])
    assert parse_data_spec("classification:n=77", "knn", cpu=True)[1]["n"] == 77
    assert parse_data_spec("classification", "knn")[1]["n"] == _SPECS["classification"]["n"]
    assert parse_data_spec("lowrank", "pca", cpu=True)[1]["rank"] == _SPECS["lowrank"]["rank"]


def test_progress_lines_say_what_remains():
    lines = []
    p = _progress.Progress(4, "things done", lines.append, every=0.0)
    for i in range(1, 5):
        time.sleep(0.01)
        p.step(i)
    assert lines[0].strip().startswith("1/4 things done") and "s left" in lines[0]
    assert lines[-1].strip().startswith("4/4 things done") and "left" not in lines[-1]


@pytest.mark.mpi
def test_knn_shows_query_blocks_and_threads():
    out = _run("knn", "--np", "2", "--device", "cpu", "--data", "classification:n=5000,d=8")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "query blocks searched" in out.stdout and "to scale up: --data classification:n=50000" in out.stdout
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert f"2 rank(s) on CPU, {max(1, cores // 2)} thread(s) each" in out.stdout


@pytest.mark.mpi
def test_forest_shows_trees_grown_and_equals_one_fit():
    out = _run("rf", "--np", "2", "--device", "cpu", "--data", "classification:n=3000,d=6", "--trees", "6",
               "--max-depth", "5")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "6/6 trees grown" in out.stdout and "to scale up" in out.stdout


def test_batched_forest_equals_one_fit():
    import numpy as np

    from mpiml.datasets import make_classification
    from mpiml.ensemble import RandomForestClassifier

    X, y = make_classification(600, 5, random_state=0)
    one = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=3).fit(X, y)
    batched = _progress.fit_forest_in_batches(RandomForestClassifier(n_estimators=5, max_depth=4, random_state=3),
                                              X, y, lambda *a: None, batches=3)
    assert batched.n_estimators == 5 and not batched.warm_start
    np.testing.assert_array_equal(batched.predict_proba(X), one.predict_proba(X))


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["rf", "knn", "kmeans", "linreg", "logreg", "pca", "tsvd"])
def test_defaults_finish_within_a_minute_on_two_cpu_ranks(algorithm):
    # k-means is the README's main job: no algorithm and no --np either (two ranks without a GPU)
    args = ["--device", "cpu"] if algorithm == "kmeans" else [algorithm, "--np", "2", "--device", "cpu"]
    t0 = time.perf_counter()
    out = _run(*args, timeout=120)
    seconds = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "to scale up" in out.stdout
    if algorithm == "kmeans":
        assert "200000 x 32 float32, k=16" in out.stdout and "2 rank(s)" in out.stdout, out.stdout[-3000:]
    assert seconds < 60, f"mpiml run {algorithm}: {seconds:.1f} s"
