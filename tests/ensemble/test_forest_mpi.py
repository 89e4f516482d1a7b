"""Random forests on 1, 2, 3 and 4 ranks: one mpiexec launch per rank count runs that count's cases.

The checks live in ``forest_spmd_script.py`` (exact trees equal to one process, so equal at every
rank count; accuracy against scikit-learn, local training, uneven / empty / one-row shards, errors
raised alike on every rank, and a model file written by N ranks that is read back here),
``forest_features_spmd_script.py`` and ``forest_scatter_spmd_script.py``.  A rank count's cases run
one after the other in one launch (``tests/_spmd_cases.py``), each with its own variables, and each
rank reports each case's failures apart: every case below is still its own test, which fails with
that case's messages.
"""

import os

import numpy as np
import pytest

import mpiml

from _spmd_cases import CaseLaunches

HERE = os.path.dirname(os.path.abspath(__file__))

# small batches of trees and small allreduces, so that batching and node chunks are exercised on uneven
# shards (and must not change the trees: the reference in test_forest_spmd is grown with the defaults);
# "level": no rank gathers every row (MPIML_RF_TREE_PARALLEL_BYTES=0), every level's nodes are grown by all
# ranks; "blocks": the bootstrap of large data sets (block multinomial, hashed draws) on these small ones
SPMD = [(1, "tree", "sklearn"), (2, "tree", "sklearn"), (3, "tree", "sklearn"), (4, "tree", "sklearn"),
        (2, "level", "sklearn"), (3, "level", "sklearn"), (1, "tree", "blocks"), (2, "level", "blocks"),
        (3, "tree", "blocks"), (4, "level", "blocks")]
FEATURES = [(1, "sklearn"), (2, "sklearn"), (3, "sklearn"), (4, "sklearn"), (3, "blocks")]
SCATTER = [2, 3, 4]
BLOCKS = {"MPIML_RF_SKLEARN_BOOTSTRAP_ROWS": "0"}


def _cases():
    """``{n: [case, ...]}``, a case as ``tests/_spmd_cases.py`` takes it."""
    cases = {}
    for n, growth, draws in SPMD:
        env = {"MPIML_RF_BATCH_ELEMENTS": "1500", "MPIML_RF_HIST_BYTES": str(1 << 20)}
        if growth == "level":
            env["MPIML_RF_TREE_PARALLEL_BYTES"] = "0"
        else:                            # the bin edges' sorts shared among the ranks (a column each)
            env["MPIML_RF_SHARED_EDGES"] = "0"
        if draws == "blocks":
            env.update(BLOCKS)
        cases.setdefault(n, []).append({"name": f"spmd-{growth}-{draws}", "env": env,
                                        "script": os.path.join(HERE, "forest_spmd_script.py"), "args": ["{out}"]})
    for n, draws in FEATURES:
        env = {"MPIML_RF_BATCH_ELEMENTS": "1500", "MPIML_RF_SHARED_EDGES": "0", **(BLOCKS if draws == "blocks" else {})}
        cases.setdefault(n, []).append({"name": f"features-{draws}", "env": env,
                                        "script": os.path.join(HERE, "forest_features_spmd_script.py")})
    # levels with reduce-scattered histograms (the GPUs' opt-in), forced here on host ranks growing level by level
    for n in SCATTER:
        env = {"MPIML_RF_SCATTER": "1", "MPIML_RF_TREE_PARALLEL_BYTES": "0", "MPIML_RF_BATCH_ELEMENTS": "1500",
               "MPIML_RF_HIST_BYTES": "300000"}
        cases.setdefault(n, []).append({"name": "scatter", "env": env,
                                        "script": os.path.join(HERE, "forest_scatter_spmd_script.py")})
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One launch per rank count (the first test that needs it starts it); ``.verdict(n, name)``."""
    return CaseLaunches(CASES, tmp_path_factory, timeout=540)


@pytest.mark.mpi
@pytest.mark.parametrize("n, growth, draws", SPMD)
def test_forest_spmd(launched, n, growth, draws):
    out = launched.verdict(n, f"spmd-{growth}-{draws}")
    model = mpiml.load(str(out / "forest.mpiml"))
    X = np.load(out / "X.npy")
    np.testing.assert_array_equal(model.predict_proba(X), np.load(out / "proba.npy"))
    # the exact trees of this rank count equal those of this one process (so of every rank count)
    from sklearn.datasets import make_classification

    from mpiml.ensemble import RandomForestClassifier

    Xc, yc = make_classification(n_samples=900, n_features=8, n_informative=5, n_classes=3, random_state=0)
    ref = RandomForestClassifier(n_estimators=3, bootstrap=False, max_features=None, max_depth=6,
                                 random_state=0).fit(Xc[:600], yc[:600])
    exact = np.load(out / f"exact_{n}.npz")
    assert exact["tree_feature_"].shape[0] > 3 * 7
    for key in exact.files:
        np.testing.assert_array_equal(exact[key], getattr(ref, key), err_msg=key)


@pytest.mark.mpi
@pytest.mark.parametrize("n, draws", FEATURES)
def test_forest_features_spmd(launched, n, draws):
    """Sparse X, multi-output y, NaN, poisson, estimators_: the trees of one process at every rank count."""
    launched.verdict(n, f"features-{draws}")


@pytest.mark.mpi
@pytest.mark.parametrize("n", SCATTER)
def test_forest_scatter_spmd(launched, n):
    """Levels with reduce-scattered histograms (each rank searches a share of the pairs or features, the
    candidates gathered; opt-in with MPIML_RF_SCATTER=1, forced here on host ranks growing level by level): the trees
    of one process at every rank count, subtraction and padded blocks included."""
    launched.verdict(n, "scatter")
