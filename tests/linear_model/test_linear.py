"""Linear models on one process: scikit-learn's common checks and the single-process contract.

One check of ``parametrize_with_checks`` is expected to fail, for Ridge only, as it fails for
scikit-learn's own Ridge (listed in scikit-learn's per-estimator expected failures):
``check_non_transformer_estimators_n_iter`` wants ``n_iter_ >= 1`` from every estimator with a
``max_iter`` parameter, while Ridge's solvers other than lsqr report ``n_iter_ = None``, as scikit-learn's.
The 6 skips are scikit-learn's own array-API checks, which skip themselves unless
SCIPY_ARRAY_API=1 is set (mpiml takes NumPy or CuPy, not arbitrary array-API namespaces).
"""

import warnings

import numpy as np
import pytest
from sklearn import linear_model as sk
from sklearn.utils.estimator_checks import parametrize_with_checks

from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

def _expected_failed(est):
    if isinstance(est, Ridge) and est.solver not in ("lsqr",):
        return {"check_non_transformer_estimators_n_iter":
                "n_iter_ is None for Ridge's solvers other than lsqr, as in scikit-learn "
                "(whose Ridge fails this check too)"}
    return {}


@parametrize_with_checks([LinearRegression(), LinearRegression(solver="tsqr"), LinearRegression(solver="lsqr"),
                          Ridge(), Ridge(solver="svd"), Ridge(solver="lsqr"), Ridge(solver="sparse_cg"),
                          LogisticRegression(), LogisticRegression(solver="newton-cholesky"),
                          LogisticRegression(solver="newton-cg")],
                         expected_failed_checks=_expected_failed)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


def test_save_and_load_round_trip(tmp_path):
    import mpiml

    rs = np.random.RandomState(0)
    X = rs.randn(200, 4)
    y = X @ [1.0, -2.0, 0.5, 3.0] + 0.1 * rs.randn(200)
    labels = np.where(y > 0, "pos", "neg")
    for est, target in ((LinearRegression(solver="tsqr"), y), (Ridge(alpha=[0.5]), y[:, None]),
                        (LogisticRegression(), labels)):
        est.fit(X, target)
        path = str(tmp_path / f"{type(est).__name__}.mpiml")
        mpiml.save(est, path)
        back = mpiml.load(path)
        np.testing.assert_array_equal(back.predict(X), est.predict(X))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_kept(dtype):
    rs = np.random.RandomState(0)
    X = rs.randn(100, 3).astype(dtype)
    y = (X[:, 0] > 0).astype(int)
    for est, target in ((LinearRegression(), X[:, 1] * 2.0), (Ridge(), X[:, 1]), (LogisticRegression(), y)):
        est.fit(X, target)
        assert est.coef_.dtype == dtype
        assert est.predict(X).dtype == (dtype if not isinstance(est, LogisticRegression) else y.dtype)


def test_newton_and_lbfgs_reach_scikit_learns_loss():
    rs = np.random.RandomState(3)
    X = rs.randn(500, 5)
    y = (X @ rs.randn(5) + rs.randn(500) > 0).astype(int)
    ref = sk.LogisticRegression(tol=1e-10, max_iter=1000).fit(X, y)
    for solver in ("lbfgs", "newton-cholesky"):
        est = LogisticRegression(solver=solver, tol=1e-10, max_iter=1000).fit(X, y)
        np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-7)
        np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-7, atol=1e-10)


def test_ridge_without_penalty_on_rank_deficient_x_is_minimum_norm():
    rs = np.random.RandomState(0)
    X = rs.randn(200, 4)
    X = np.c_[X, X[:, 0] - X[:, 1]]
    y = X @ rs.randn(5) + rs.randn(200)
    ref = sk.LinearRegression().fit(X, y)
    for solver in ("cholesky", "svd"):
        np.testing.assert_allclose(Ridge(alpha=0.0, solver=solver).fit(X, y).coef_, ref.coef_, rtol=1e-9, atol=1e-12)


def test_singular_values_of_a_full_rank_fit_are_computed_when_read():
    """A full-rank normal-equations fit leaves singular_ to its first read; it then equals the SVD's values
    and survives pickling, a refit and saving as any attribute does."""
    import pickle

    rs = np.random.RandomState(3)
    X = rs.randn(500, 6) * np.array([1.0, 10.0, 0.1, 3.0, 1.0, 2.0]) + 5.0
    y = X @ rs.randn(6) + 0.1 * rs.randn(500)
    est = LinearRegression().fit(X, y)
    assert "_singular_pending" in vars(est) and est.rank_ == 6
    copy = pickle.loads(pickle.dumps(est))
    want = np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
    np.testing.assert_allclose(est.singular_, want, rtol=1e-10)
    np.testing.assert_array_equal(copy.singular_, est.singular_)
    assert "_singular_pending" not in vars(est)
    est.fit(X[:, :3], y)   # a refit replaces what the first fit left, read or not
    np.testing.assert_allclose(est.singular_, np.linalg.svd(X[:, :3] - X[:, :3].mean(axis=0), compute_uv=False),
                               rtol=1e-10)
    rank_deficient = LinearRegression().fit(np.c_[X, X[:, 0]], y)   # decided by the eigenvalues, set at once
    assert rank_deficient.rank_ == 6 and "_singular_pending" not in vars(rank_deficient)
    del est.singular_
    assert not hasattr(est, "singular_")
