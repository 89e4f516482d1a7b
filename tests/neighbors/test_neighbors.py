"""Nearest neighbours on one process: scikit-learn's common checks and the single-process contract.

No check of ``parametrize_with_checks`` is expected to fail.  The 5 skips are scikit-learn's own
array-API checks, which skip themselves unless SCIPY_ARRAY_API=1 is set (mpiml takes NumPy or
CuPy, not arbitrary array-API namespaces).
"""

import warnings

import numpy as np
import pytest
from sklearn import neighbors as sk
from sklearn.utils.estimator_checks import parametrize_with_checks

import mpiml
from mpiml.neighbors import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors

_EXPECTED_FAILED = {}


@parametrize_with_checks([NearestNeighbors(), KNeighborsClassifier(), KNeighborsClassifier(weights="distance"),
                          KNeighborsRegressor(), KNeighborsRegressor(metric="manhattan")],
                         expected_failed_checks=lambda est: _EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


def test_save_and_load_round_trip(tmp_path):
    rs = np.random.RandomState(0)
    X, Q = rs.randn(120, 4), rs.randn(20, 4)
    labels = np.where(X[:, 0] > 0, "pos", "neg")
    for est, target in ((NearestNeighbors(n_neighbors=3), None), (KNeighborsClassifier(3), labels),
                        (KNeighborsRegressor(3, weights="distance"), X[:, :2])):
        est.fit(X, target)
        path = str(tmp_path / f"{type(est).__name__}.mpiml")
        mpiml.save(est, path)
        back = mpiml.load(path)
        np.testing.assert_array_equal(back.kneighbors(Q)[1], est.kneighbors(Q)[1])
        if target is not None:
            np.testing.assert_array_equal(back.predict(Q), est.predict(Q))


def test_unknown_metric_and_exchange_are_clear_errors():
    X = np.random.RandomState(0).randn(10, 2)
    with pytest.raises(ValueError, match="The 'metric' parameter of NearestNeighbors must be a str among .*"
                                         "Got 'bray-curtis' instead"):
        NearestNeighbors(metric="bray-curtis").fit(X)
    with pytest.raises(ValueError, match="'exchange' parameter of NearestNeighbors"):
        NearestNeighbors(exchange="carrier-pigeon").fit(X)
    with pytest.raises(ValueError, match="n_neighbors <= n_samples_fit"):
        NearestNeighbors(n_neighbors=11).fit(X).kneighbors(X)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_and_exact_ties(dtype):
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [-1.0, 0.0], [0.0, 1.0]], dtype=dtype)
    d, i = NearestNeighbors(n_neighbors=5).fit(X).kneighbors(np.zeros((1, 2), dtype=dtype))
    assert d.dtype == dtype
    # two rows at 0, three at 1: each group in index order
    np.testing.assert_array_equal(i, [[0, 2, 1, 3, 4]])
    np.testing.assert_allclose(d, [[0, 0, 1, 1, 1]])


def test_n_jobs_and_algorithm_are_accepted():
    rs = np.random.RandomState(1)
    X, y = rs.randn(50, 3), rs.randint(0, 2, 50)
    a = KNeighborsClassifier(algorithm="brute", n_jobs=4).fit(X, y).predict_proba(X)
    b = sk.KNeighborsClassifier(algorithm="brute").fit(X, y).predict_proba(X)
    np.testing.assert_allclose(a, b)


def test_tie_across_the_kth_place_goes_to_the_lower_index():
    # four rows at distance 1 compete for the 2nd and 3rd places: the partial selection may pick any two
    X = np.array([[0.0, -1.0], [2.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    for ex in ("blocking", "overlap", "onesided"):
        i = NearestNeighbors(n_neighbors=3, exchange=ex).fit(X).kneighbors(np.zeros((1, 2)), return_distance=False)
        np.testing.assert_array_equal(i, [[5, 0, 2]])
