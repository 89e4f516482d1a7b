"""scikit-learn's own forest tests, pointed at mpiml.ensemble's random forests.

The test functions of ``sklearn/ensemble/tests/test_forest.py`` (shipped with
scikit-learn) that name ``RandomForestClassifier``/``RandomForestRegressor`` or the
module's estimator tables run on one process with ours in their place: the module-level
classes and the tables ``FOREST_CLASSIFIERS``, ``FOREST_REGRESSORS``, ... are replaced
for the duration of each test (see ``tests/_sklearn_suite.py``). mpiml has no extra-trees
or random-trees-embedding classes: those parametrizations are skipped. Known deviations
are listed in ``DEVIATIONS`` with their reason; each must still fail (strict xfail).
"""

import os

import pytest

skt = pytest.importorskip("sklearn.ensemble.tests.test_forest")

from _sklearn_suite import adopt, global_dtype, global_random_seed  # noqa: E402,F401

from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor  # noqa: E402

OURS = {"RandomForestClassifier": RandomForestClassifier, "RandomForestRegressor": RandomForestRegressor}
OTHERS = ("ExtraTrees", "RandomTreesEmbedding")
TABLES = ("FOREST_CLASSIFIERS", "FOREST_REGRESSORS", "FOREST_TRANSFORMERS", "FOREST_ESTIMATORS",
          "FOREST_CLASSIFIERS_REGRESSORS")


def _table(name):
    table = dict(getattr(skt, name))
    table.update({k: v for k, v in OURS.items() if k in table})
    return table


def _thin(test_id):
    """mpiml has no ExtraTrees* or RandomTreesEmbedding class"""
    return any(o in test_id for o in OTHERS)


# test name -> why mpiml differs (each must still fail)
DEVIATIONS = {
    "test_backend_respected": "joblib backends are not used: the trees are grown by the SPMD histogram builder, not joblib workers",
    "test_regression_criterion[absolute_error-RandomForestRegressor]": "training R^2 of 5 trees with random_state=1 is 0.92997 against the test's 0.93: absolute error on more than 64 distinct targets splits on 64 target bins (approximate medians; over 40 seeds 0.934 vs scikit-learn's 0.939)",
    **{f"test_forest_regressor_oob[True-X0-y0-0.7-{t}-RandomForestRegressor]": "out-of-bag R^2 of random_state=0 is 0.699 against the test's 0.7 (over 20 seeds 0.708, scikit-learn's 0.708; a quarter of scikit-learn's own seeds miss 0.7 too)" for t in ("array", "sparse_csr", "sparse_csc")},
    "test_forest_multioutput_integral_regression_target": "rebuilds the out-of-bag rows with scikit-learn's private _generate_unsampled_indices from each tree's random_state (its own random stream: NumPy's RandomState(random_state).randint)",
}

if os.environ.get("MPIML_SUITE_ALL"):      # every test as a plain test: the real failures, with their tracebacks
    DEVIATIONS = {}

globals().update(adopt(
    skt, OURS, deviations=DEVIATIONS, thin=_thin,
    namespaces={**{t: _table(t) for t in TABLES},
                "_by_class": {getattr(skt, k): v for k, v in OURS.items()}},
    skip_classes={getattr(skt, c): "mpiml has no such class" for c in
                  ("ExtraTreesClassifier", "ExtraTreesRegressor", "RandomTreesEmbedding")},
    uses=tuple(OURS) + TABLES))


def test_the_suite_was_found():
    """Guard: a scikit-learn release that moves its tests must not leave this module empty."""
    adapted = [n for n in globals() if n.startswith("test_") and n != "test_the_suite_was_found"]
    assert len(adapted) >= 30, adapted
