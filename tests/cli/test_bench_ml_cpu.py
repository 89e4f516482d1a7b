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
           "--repeat", "1", "--ceiling", "--out", str(tmp_path), "--tag", "t"]
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
    # the ceiling, in the same run: 1 plain process alone, then 2 side by side, each with one rank's work at 2 ranks
    ceiling = result["ceiling"]
    assert ceiling["1"]["copies"] == 1 and ceiling["2"]["copies"] == 2 and ceiling["2"]["exit_codes"] == [0, 0]
    for name in ("kmeans", "knn", "linreg"):
        assert len(ceiling["2"]["walls"][name]) == 2 and ceiling["2"]["seconds"][name] > 0
        c = ceiling["summary"][name]
        assert c["machine_ceiling"] == pytest.approx(2 * c["copy_alone_s"] / c["copies_s"], rel=1e-2)
        assert c["fraction"] == pytest.approx(c["one_rank_over_copy"] / c["over_copies"], rel=2e-2)
    # where each rank ran: its placement on every rank, and the copies pinned by the same rule
    placement = result["mpiml"]["2"]["settings"]["placement"]
    assert len(placement) == 2 and all(p.startswith(("pinned", "not pinned")) for p in placement)
    assert len(ceiling["2"]["placement"]) == 2 and ceiling["2"]["placement"][0].split(":")[0] == \
        placement[0].split(":")[0]
    # the same data and starting centres everywhere: the same k-means inertia and k-NN distances
    for name in ("kmeans", "knn"):
        ref = result["sklearn"]["values"][name]
        for r in ("1", "2"):
            assert result["mpiml"][r]["values"][name] == pytest.approx(ref, rel=1e-4), (name, r)


def test_a_copy_draws_the_rows_of_its_rank():
    """The ceiling's plain processes fit exactly the rows (k-NN: the queries) the ranks fit."""
    import argparse

    import numpy as np

    from mpiml.bench import ml_cpu
    from mpiml.comm import get_comm

    args = argparse.Namespace(rows=1001, features=4, k=3, iters=2, components=2, rf_rows=500, trees=5, max_depth=3,
                              knn_rows=300, queries=50, neighbors=2)
    one = get_comm("self")
    for name in ("kmeans", "logreg", "linreg", "pca", "knn"):
        X, _, Q = ml_cpu._data(name, args, one)
        Xc, _, Qc, centres, _ = ml_cpu._copy_work(name, args, 2, 3)
        if name == "knn":     # every index row, the third of the queries
            np.testing.assert_array_equal(Xc, X)
            np.testing.assert_array_equal(Qc, Q[34:50])
        else:
            np.testing.assert_array_equal(Xc, X[668:1001])
        if name == "kmeans":
            np.testing.assert_array_equal(centres, X[:3])
    Xc, yc, _, _, make = ml_cpu._copy_work("rf", args, 1, 3)
    assert Xc.shape == (500, 4) and make().n_estimators == 2   # trees 1 and 4 of 5
