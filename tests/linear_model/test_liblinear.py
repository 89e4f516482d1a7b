"""``LogisticRegression(solver="liblinear")`` with the L2 penalty: LIBLINEAR's algorithms, hence its answers.

The primal trust-region Newton method stops where LIBLINEAR stops (same iterates, same
``n_iter_``, same ConvergenceWarning); the dual coordinate descent depends on
``random_state`` as LIBLINEAR's does and reaches the same minimiser at a tight ``tol``;
1-4 ranks (``liblinear_spmd_script.py``) and CuPy shards on the GPU host.
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning

import mpiml.linear_model._liblinear as liblinear
from mpiml.linear_model import LogisticRegression

from . import _launches


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _launches.launches(tmp_path_factory)


def _both(X, y, sample_weight=None, **kw):
    with warnings.catch_warnings(record=True) as theirs_w:
        warnings.simplefilter("always")
        theirs = sk.LogisticRegression(solver="liblinear", **kw).fit(X, y, sample_weight=sample_weight)
    with warnings.catch_warnings(record=True) as ours_w:
        warnings.simplefilter("always")
        ours = LogisticRegression(solver="liblinear", **kw).fit(X, y, sample_weight=sample_weight)
    conv = [sum(issubclass(w.category, ConvergenceWarning) for w in ws) for ws in (theirs_w, ours_w)]
    return theirs, ours, conv


@pytest.mark.parametrize("kind", ["dense", "csr", "float32"])
@pytest.mark.parametrize("kw", [dict(), dict(C=0.01), dict(C=100.0, tol=1e-8), dict(fit_intercept=False),
                                dict(intercept_scaling=5.0, class_weight="balanced"),
                                dict(class_weight={0: 3.0, 1: 0.5}, tol=1e-2)])
def test_primal_stops_where_liblinear_stops(kind, kw):
    X, y = make_classification(n_samples=300, n_features=15, n_informative=6, weights=[0.7], random_state=3)
    X = sp.csr_matrix(np.where(np.abs(X) < 0.7, 0.0, X)) if kind == "csr" else X
    X = X.astype(np.float32) if kind == "float32" else X
    theirs, ours, _ = _both(X, y, **kw)
    # the same iterates up to the rounding of the sums (amplified by the conditioning at C=100), far
    # closer than either is to the minimiser at tol=1e-4 (~1e-5)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=0, atol=1e-7)
    assert ours.n_iter_.tolist() == theirs.n_iter_.tolist()
    assert ours.coef_.dtype == np.float64


def test_sample_weights_and_the_rows_liblinear_leaves_out():
    X, y = make_classification(n_samples=200, n_features=8, random_state=1)
    w = np.random.RandomState(0).uniform(-0.5, 2.0, X.shape[0])  # some zero or negative: left out
    theirs, ours, _ = _both(X, y, sample_weight=w)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-10)
    assert ours.n_iter_.tolist() == theirs.n_iter_.tolist()


@pytest.mark.parametrize("max_iter", [0, 1, 2, 3])
def test_iteration_budget_and_warning_as_liblinear(max_iter):
    X, y = make_classification(n_samples=200, n_features=10, random_state=0)
    theirs, ours, conv = _both(X, y, max_iter=max_iter, tol=1e-10)
    assert ours.n_iter_.tolist() == theirs.n_iter_.tolist()
    assert conv[0] == conv[1] == 1
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=0, atol=1e-10)


def test_warm_start_does_not_apply_as_in_scikit_learn():
    X, y = make_classification(n_samples=200, n_features=10, random_state=0)
    est = LogisticRegression(solver="liblinear", warm_start=True).fit(X, y)
    first = est.coef_.copy()
    est.fit(X, y)  # starts from zero again: the same iterates
    np.testing.assert_array_equal(est.coef_, first)
    est.fit(X[:, :-1], y)  # (no shape error either: scikit-learn's liblinear ignores warm_start)


def test_dual_random_state_matters_and_the_minimiser_is_liblinear_s():
    X, y = make_classification(n_samples=40, n_features=60, random_state=4)
    fits = []
    for seed in (7, 7, 8):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fits.append(LogisticRegression(solver="liblinear", dual=True, tol=1e-3, random_state=seed).fit(X, y))
    np.testing.assert_array_equal(fits[0].coef_, fits[1].coef_)
    assert np.abs(fits[0].coef_ - fits[2].coef_).max() > 1e-5
    tight = LogisticRegression(solver="liblinear", dual=True, tol=1e-12, max_iter=10000, random_state=0).fit(X, y)
    ref = sk.LogisticRegression(solver="liblinear", tol=1e-12, max_iter=10000).fit(X, y)
    np.testing.assert_allclose(tight.coef_, ref.coef_, rtol=0, atol=1e-7)
    np.testing.assert_allclose(tight.intercept_, ref.intercept_, rtol=0, atol=1e-7)
    # at scikit-learn's tol the two dual solvers stop about as far from the minimiser
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = sk.LogisticRegression(solver="liblinear", dual=True, random_state=0).fit(X, y)
        ours = LogisticRegression(solver="liblinear", dual=True, random_state=0).fit(X, y)
    far_theirs, far_ours = np.abs(theirs.coef_ - ref.coef_).max(), np.abs(ours.coef_ - ref.coef_).max()
    assert far_ours < 10 * far_theirs + 1e-6, (far_ours, far_theirs)


def test_dual_with_weights_and_sparse_rows():
    X, y = make_classification(n_samples=60, n_features=30, random_state=2)
    X = sp.csr_matrix(np.where(np.abs(X) < 0.5, 0.0, X))
    w = np.random.RandomState(1).uniform(-0.2, 2.0, X.shape[0])
    kw = dict(tol=1e-12, max_iter=20000, intercept_scaling=2.0, class_weight={0: 2.0, 1: 1.0})
    ours = LogisticRegression(solver="liblinear", dual=True, random_state=0, **kw).fit(X, y, sample_weight=w)
    ref = sk.LogisticRegression(solver="liblinear", **kw).fit(X, y, sample_weight=w)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=0, atol=1e-7)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=0, atol=1e-7)


def test_dual_past_the_gather_bound_solves_the_primal(monkeypatch):
    X, y = make_classification(n_samples=50, n_features=10, random_state=0)
    monkeypatch.setattr(liblinear, "DUAL_GATHER_BYTES", 100)
    with pytest.warns(UserWarning, match="solved in the primal"):
        est = LogisticRegression(solver="liblinear", dual=True).fit(X, y)
    primal = LogisticRegression(solver="liblinear").fit(X, y)
    np.testing.assert_array_equal(est.coef_, primal.coef_)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_liblinear_spmd(launches, n):
    launches.verdict(n, "liblinear")    # liblinear_spmd_script.py, in the folder's shared launches (_launches.py)


@pytest.mark.gpu
@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_liblinear_spmd_gpu(tmp_path_factory, n):
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    _launches.gpu_launches(tmp_path_factory).verdict(n, "liblinear")   # with --gpu, in the shared GPU launches
