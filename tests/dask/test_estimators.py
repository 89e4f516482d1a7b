"""Dask-driven SPMD estimators (mpiml.dask.cluster.KMeans) and hyperparameter search.

Multi-rank tests run a client script under ``mpiexec -n N python -m mpiml.dask``
with a timeout; the script compares with the SPMD estimator on the same rows.
"""

import json
import os
import re

import numpy as np
import pytest

from conftest import ROOT, run_mpi

pytest.importorskip("distributed")

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(ROOT, "src", "mpiml", "dask", "__main__.py")
QUIET = {"DASK_LOGGING__DISTRIBUTED": "critical"}


def launch(n, *args, timeout=150, env=None, expect_ok=True):
    return run_mpi(LAUNCHER, n, *args, timeout=timeout, env={**QUIET, **(env or {})}, expect_ok=expect_ok)


def run_app(tmp_path, array_lib="numpy"):
    out = tmp_path / "result.json"
    launch(4, os.path.join(HERE, "_estimator_app.py"), out, array_lib)
    failures = json.loads(out.read_text())["failures"]
    assert not failures, "\n".join(failures)


@pytest.mark.mpi
def test_kmeans_from_a_dask_client_matches_spmd(tmp_path):
    """Centres, inertia, predict, transform, score, partial_fit, weights, dataframes, errors, Hyperband."""
    run_app(tmp_path)


@pytest.mark.mpi
@pytest.mark.gpu
def test_kmeans_on_cupy_chunks(tmp_path):
    run_app(tmp_path, "cupy")


@pytest.mark.mpi
def test_worker_leaving_during_fit_raises_on_the_client():
    proc = launch(4, "--timeout", "30", os.path.join(HERE, "_worker_loss_app.py"), "leave",
                  env={"MPIML_TIMEOUT": "5"})
    raised = re.search(r"one rank raised: (.*) \[([\d.]+) s\]", proc.stdout)
    assert raised and raised.group(1).startswith("DaskSPMDError: RaisingKMeans.fit failed on worker mpi://"), proc.stdout
    assert "RuntimeError: boom on one rank" in raised.group(1)
    first = re.search(r"first fit: (.*) \[([\d.]+) s\]", proc.stdout)
    assert first, proc.stdout + proc.stderr[-3000:]
    # the second rank of the job is whichever worker holds the later blocks
    lost = re.search(r"LosingKMeans.fit cannot finish: worker mpi://(\d):\d+ \(MPI rank (\d)\) left the Dask "
                     r"cluster", first.group(1))
    assert lost and lost.group(1) == lost.group(2) and lost.group(1) in "23", first.group(1)
    assert float(first.group(2)) < 10
    second = re.search(r"second fit: (.*) \[([\d.]+) s\]", proc.stdout)
    assert second and "restart the mpiml dask job" in second.group(1) and float(second.group(2)) < 2


@pytest.mark.mpi
def test_worker_killed_during_fit_ends_the_job():
    """Under MPICH/Open MPI a dead rank makes mpiexec end the whole job: no hang."""
    proc = launch(4, "--timeout", "30", os.path.join(HERE, "_worker_loss_app.py"), "kill",
                  timeout=60, expect_ok=False)
    assert proc.returncode != 0
    assert "first fit" not in proc.stdout


def test_plain_dask_cluster_says_mpi_is_unavailable():
    import dask.array as da
    from distributed import Client, LocalCluster

    from mpiml.dask import DaskSPMDError
    from mpiml.dask.cluster import KMeans

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        X = da.ones((100, 3), chunks=50)
        with pytest.raises(DaskSPMDError, match=r"MPI communicator is unavailable .* mpiexec -n N mpiml dask"):
            KMeans(n_clusters=2).fit(X)


def test_no_client_says_how_to_launch():
    import dask.array as da

    from mpiml.dask import DaskSPMDError
    from mpiml.dask.cluster import KMeans

    with pytest.raises(DaskSPMDError, match="mpiexec -n N mpiml dask"):
        KMeans(n_clusters=2).fit(da.ones((10, 2)))


def test_wrapper_is_a_declaration():
    from sklearn.base import clone

    from mpiml.cluster import KMeans as SPMDKMeans
    from mpiml.dask.cluster import KMeans

    spmd_params = set(SPMDKMeans().get_params()) - {"comm"}
    assert set(KMeans().get_params()) == spmd_params
    km = KMeans(4, tol=0.1)
    assert km.n_clusters == 4 and clone(km).tol == 0.1
    assert hasattr(km, "partial_fit") and hasattr(km, "predict") and hasattr(km, "transform")
    with pytest.raises(TypeError, match="unexpected"):
        KMeans(comm=None)


def test_hyperband_schedule():
    from mpiml.dask.model_selection import hyperband_brackets

    # Li et al. (2018), table for R = 81, eta = 3
    assert hyperband_brackets(81, 3) == [(4, 81, 1), (3, 34, 3), (2, 15, 9), (1, 8, 27), (0, 5, 81)]


def test_hyperband_sklearn_estimator_on_a_local_cluster():
    """The search driver itself, on an in-process cluster, with a scikit-learn estimator."""
    import dask.array as da
    from distributed import Client, LocalCluster
    from sklearn.linear_model import SGDClassifier

    from mpiml.dask.model_selection import HyperbandSearchCV, IncrementalSearchCV, SuccessiveHalvingSearchCV

    rng = np.random.default_rng(0)
    Xn = rng.normal(size=(3000, 6))
    yn = (Xn[:, 0] + 0.5 * Xn[:, 1] > 0).astype(int)
    X, y = da.from_array(Xn, chunks=500), da.from_array(yn, chunks=500)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        est = SGDClassifier(random_state=0)
        grid = {"alpha": [1e-5, 1e-4, 1e-3, 1e-2, 1.0], "loss": ["hinge", "log_loss"]}
        search = HyperbandSearchCV(est, grid, max_iter=9, random_state=0).fit(X, y, classes=[0, 1])
        assert search.best_score_ > 0.9
        assert search.best_score_ == max(search.cv_results_["test_score"])
        assert max(search.cv_results_["partial_fit_calls"]) == 9
        sh = SuccessiveHalvingSearchCV(est, grid, n_initial_parameters=9, max_iter=9, random_state=0)
        sh.fit(X, y, classes=[0, 1])
        assert sorted(sh.cv_results_["partial_fit_calls"].tolist()) == [1] * 6 + [3] * 2 + [9]
        inc = IncrementalSearchCV(est, grid, n_initial_parameters=4, max_iter=6, fits_per_score=2,
                                  random_state=0).fit(X, y, classes=[0, 1])
        assert inc.cv_results_["partial_fit_calls"].tolist() == [6] * 4 and len(inc.history_) == 12
        assert inc.best_score_ == max(h["score"] for h in inc.history_)
        stopped = IncrementalSearchCV(est, grid, n_initial_parameters=4, max_iter=40, patience=2, tol=1.0,
                                      random_state=0).fit(X, y, classes=[0, 1])
        assert stopped.cv_results_["partial_fit_calls"].tolist() == [3] * 4  # nothing improves by 1.0


GRID_SCRIPT = """
import numpy as np
from sklearn.model_selection import GridSearchCV, KFold, RandomizedSearchCV
from scipy.stats import loguniform
from mpiml.cluster import KMeans
from mpiml.comm import get_comm
from _spmd import check, assert_close, guarded

comm = get_comm()

def main():
    rng = np.random.default_rng(comm.rank)
    X = rng.normal(size=(300 + 50 * comm.rank, 4))
    X[: len(X) // 2] += 3
    grid = {"n_clusters": [2, 3], "init": ["k-means++", "random"]}
    search = GridSearchCV(KMeans(random_state=0, max_iter=10), grid, cv=KFold(3)).fit(X)
    # every candidate was fitted SPMD on all ranks: its split scores are those of a direct SPMD fit
    for i, params in enumerate(search.cv_results_["params"]):
        for k, (train, test) in enumerate(KFold(3).split(X)):
            est = KMeans(random_state=0, max_iter=10, **params).fit(X[train])
            assert_close(search.cv_results_[f"split{k}_test_score"][i], est.score(X[test]), f"{params} fold {k}")
    scores = comm.allgather_obj(search.cv_results_["mean_test_score"].tolist())
    check(all(s == scores[0] for s in scores), "mean test scores differ between ranks")
    check(len(set(map(str, comm.allgather_obj(search.best_params_)))) == 1, "best params differ")
    assert_close(search.best_estimator_.cluster_centers_,
                 comm.bcast_obj(search.best_estimator_.cluster_centers_), "refit centres")
    rand = RandomizedSearchCV(KMeans(max_iter=10, random_state=1), {"n_clusters": [2, 3, 4, 5],
                              "tol": loguniform(1e-6, 1e-2)}, n_iter=3, cv=2, random_state=0).fit(X)
    check(len(set(map(str, comm.allgather_obj(rand.cv_results_["params"])))) == 1, "random candidates differ")

guarded(main, comm)
"""


@pytest.mark.mpi
def test_sklearn_search_spmd():
    """scikit-learn's GridSearchCV / RandomizedSearchCV under mpiexec: each candidate fitted SPMD."""
    run_mpi(None, 2, timeout=120, code=GRID_SCRIPT)
