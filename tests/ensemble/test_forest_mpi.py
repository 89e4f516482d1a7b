"""Random forests on 1, 2, 3 and 4 ranks (one mpiexec launch per rank count).

The checks live in ``forest_spmd_script.py``: exact trees equal to one process
(so equal at every rank count), accuracy against scikit-learn, local training,
uneven / empty / one-row shards, errors raised alike on every rank, and a model
file written by N ranks that is read back here.
"""

import os

import numpy as np
import pytest

import mpiml

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "forest_spmd_script.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n, growth, draws", [(1, "tree", "sklearn"), (2, "tree", "sklearn"), (3, "tree", "sklearn"),
                                              (4, "tree", "sklearn"), (2, "level", "sklearn"),
                                              (3, "level", "sklearn"), (1, "tree", "blocks"), (2, "level", "blocks"),
                                              (3, "tree", "blocks"), (4, "level", "blocks")])
def test_forest_spmd(mpi, tmp_path, n, growth, draws):
    # small batches of trees and small allreduces, so that batching and node chunks are exercised on uneven
    # shards (and must not change the trees: the reference below is grown with the defaults); "level": no
    # rank gathers every row (MPIML_RF_TREE_PARALLEL_BYTES=0), every level's nodes are grown by all ranks;
    # "blocks": the bootstrap of large data sets (block multinomial, hashed draws) on these small ones
    env = {"MPIML_RF_BATCH_ELEMENTS": "1500", "MPIML_RF_HIST_BYTES": str(1 << 20)}
    if growth == "level":
        env["MPIML_RF_TREE_PARALLEL_BYTES"] = "0"
    if draws == "blocks":
        env["MPIML_RF_SKLEARN_BOOTSTRAP_ROWS"] = "0"
    mpi(SCRIPT, n, str(tmp_path), timeout=240, env=env)
    model = mpiml.load(str(tmp_path / "forest.mpiml"))
    X = np.load(tmp_path / "X.npy")
    np.testing.assert_array_equal(model.predict_proba(X), np.load(tmp_path / "proba.npy"))
    # the exact trees of this rank count equal those of this one process (so of every rank count)
    from sklearn.datasets import make_classification

    from mpiml.ensemble import RandomForestClassifier

    Xc, yc = make_classification(n_samples=900, n_features=8, n_informative=5, n_classes=3, random_state=0)
    ref = RandomForestClassifier(n_estimators=3, bootstrap=False, max_features=None, max_depth=6,
                                 random_state=0).fit(Xc[:600], yc[:600])
    exact = np.load(tmp_path / f"exact_{n}.npz")
    assert exact["tree_feature_"].shape[0] > 3 * 7
    for key in exact.files:
        np.testing.assert_array_equal(exact[key], getattr(ref, key), err_msg=key)


FEATURES = os.path.join(HERE, "forest_features_spmd_script.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n, draws", [(1, "sklearn"), (2, "sklearn"), (3, "sklearn"), (4, "sklearn"), (3, "blocks")])
def test_forest_features_spmd(mpi, n, draws):
    """Sparse X, multi-output y, NaN, poisson, estimators_: the trees of one process at every rank count."""
    env = {"MPIML_RF_BATCH_ELEMENTS": "1500"}
    if draws == "blocks":                        # the bootstrap of large data sets, on these small ones
        env["MPIML_RF_SKLEARN_BOOTSTRAP_ROWS"] = "0"
    mpi(FEATURES, n, timeout=240, env=env)


SCATTER = os.path.join(HERE, "forest_scatter_spmd_script.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_forest_scatter_spmd(mpi, n):
    """Levels with reduce-scattered histograms (each rank searches a share of the pairs or features, the
    candidates gathered; the GPUs' default, forced here on host ranks growing level by level): the trees
    of one process at every rank count, subtraction and padded blocks included."""
    env = {"MPIML_RF_SCATTER": "1", "MPIML_RF_TREE_PARALLEL_BYTES": "0", "MPIML_RF_BATCH_ELEMENTS": "1500",
           "MPIML_RF_HIST_BYTES": "300000"}
    mpi(SCATTER, n, timeout=300, env=env)
