"""LogisticRegression with an L1 share in the penalty (``penalty="l1"`` / ``"elasticnet"``,
``l1_ratio > 0``): scikit-learn's solution, warnings and errors; 1-4 ranks; CuPy shards."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

import mpiml.linear_model._logistic_prox as prox
from mpiml.linear_model import LogisticRegression

from . import _launches


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _launches.launches(tmp_path_factory)


def _reference(X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sk.LogisticRegression(tol=1e-12, max_iter=20000, **kw).fit(X, y)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("C", [0.05, 1.0])
def test_saga_l1_and_elasticnet_match_scikit_learn(n_classes, l1_ratio, C):
    X, y = make_classification(200, 15, n_informative=5, n_classes=n_classes, random_state=0)
    ref = _reference(X, y, solver="saga", l1_ratio=l1_ratio, C=C)
    ours = LogisticRegression(solver="saga", l1_ratio=l1_ratio, C=C, tol=1e-8).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)
    np.testing.assert_array_equal(ours.coef_ == 0, ref.coef_ == 0)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_liblinear_l1_penalises_the_intercept_as_scikit_learn(fit_intercept):
    X, y = make_classification(200, 15, n_informative=4, random_state=1)
    kw = dict(solver="liblinear", l1_ratio=1.0, C=0.1, fit_intercept=fit_intercept, intercept_scaling=2.0)
    ref = _reference(X, y, **kw)
    ours = LogisticRegression(tol=1e-8, **kw).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, atol=1e-6)
    assert ours.coef_.dtype == np.float64


def test_sparse_and_weighted_match_dense():
    X, y = make_classification(300, 20, n_informative=5, random_state=2)
    X[np.abs(X) < 1.0] = 0.0
    w = np.random.RandomState(0).uniform(0.2, 3.0, X.shape[0])
    kw = dict(solver="saga", l1_ratio=0.6, C=0.4, tol=1e-9)
    dense = LogisticRegression(**kw).fit(X, y, sample_weight=w)
    sparse = LogisticRegression(**kw).fit(sp.csr_matrix(X), y, sample_weight=w)
    np.testing.assert_allclose(sparse.coef_, dense.coef_, atol=1e-9)
    ref = _reference(X, y, solver="saga", l1_ratio=0.6, C=0.4)
    ref.fit(X, y, sample_weight=w)
    np.testing.assert_allclose(dense.coef_, ref.coef_, atol=1e-6)


def test_fista_beyond_the_newton_size_matches(monkeypatch):
    """Past the dense-Hessian size limit the accelerated proximal gradient solves the same problem."""
    X, y = make_classification(200, 20, n_informative=5, random_state=0)
    ref = _reference(X, y, solver="saga", l1_ratio=0.5, C=0.5)
    monkeypatch.setattr(prox, "NEWTON_MAX_PARAMS", 0)
    ours = LogisticRegression(solver="saga", l1_ratio=0.5, C=0.5, tol=1e-7, max_iter=5000).fit(X, y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, atol=5e-5)


def test_penalty_names_and_l1_ratio_agree():
    X, y = make_classification(100, 8, random_state=3)
    with pytest.warns(FutureWarning, match="'penalty' was deprecated"):
        a = LogisticRegression(penalty="elasticnet", l1_ratio=0.3, solver="saga", tol=1e-9).fit(X, y)
    b = LogisticRegression(l1_ratio=0.3, solver="saga", tol=1e-9).fit(X, y)
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-12)
    with pytest.warns(FutureWarning, match="'penalty' was deprecated"):
        c = LogisticRegression(penalty="l1", solver="liblinear", tol=1e-9).fit(X, y)
    d = LogisticRegression(l1_ratio=1.0, solver="liblinear", tol=1e-9).fit(X, y)
    np.testing.assert_allclose(c.coef_, d.coef_, rtol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(l1_ratio=1.0, solver="lbfgs"), "Solver lbfgs supports only 'l2' or None penalties, got l1 penalty"),
    (dict(l1_ratio=0.5, solver="newton-cg"), "supports only 'l2' or None penalties, got elasticnet penalty"),
    (dict(l1_ratio=0.5, solver="liblinear"), "Only 'saga' solver supports elasticnet penalty, got solver=liblinear"),
])
def test_scikit_learn_errors(kwargs, match):
    X, y = make_classification(50, 4, random_state=0)
    with pytest.raises(ValueError, match=match):
        sk.LogisticRegression(**kwargs).fit(X, y)
    with pytest.raises(ValueError, match=match):
        LogisticRegression(**kwargs).fit(X, y)


@pytest.mark.parametrize("solver, text", [("saga", "The max_iter was reached"),
                                          ("liblinear", "Liblinear failed to converge")])
def test_convergence_warning_text_is_scikit_learn_s(solver, text):
    X, y = make_classification(200, 10, random_state=0)
    with pytest.warns(ConvergenceWarning, match=text):
        LogisticRegression(solver=solver, l1_ratio=1.0, max_iter=1, tol=1e-12).fit(X, y)
    with pytest.warns(ConvergenceWarning, match=text):
        m = LogisticRegression(solver=solver, max_iter=0).fit(X, y)
    assert not m.coef_.any()


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_l1_elasticnet_spmd(launches, n):
    launches.verdict(n, "logistic_prox")    # logistic_prox_spmd_script.py, in the folder's shared launches (_launches.py)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_l1_elasticnet_spmd_gpu(tmp_path_factory, n):
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    _launches.gpu_launches(tmp_path_factory).verdict(n, "logistic_prox")   # with --gpu, in the shared GPU launches


def test_sparsify_after_l1_keeps_the_predictions():
    X, y = make_classification(200, 30, n_informative=4, random_state=5)
    m = LogisticRegression(solver="saga", l1_ratio=1.0, C=0.05).fit(X, y)
    dense = m.decision_function(X)
    assert sp.issparse(m.sparsify().coef_) and m.coef_.nnz == np.count_nonzero(m.densify().coef_)
    m.sparsify()
    np.testing.assert_allclose(m.decision_function(sp.csr_matrix(X)), dense, rtol=1e-12)
    m.set_params(warm_start=True).fit(X, y)  # a sparse coef_ is a valid starting point
    assert isinstance(m.coef_, np.ndarray)
