"""The parameters scikit-learn's own test files asked of the linear models, on CuPy rows (GPU host only).

Each result is compared with the NumPy path of the same estimator (tests/linear_model/test_suite_params_mpi.py
covers the rank counts on the host).
"""

import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


class _Recorder:
    def __init__(self):
        self.ends = []

    def setup(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context, *, fitted_estimator):
        pass

    def on_fit_task_end(self, estimator, context, *, fitted_estimator):
        if "iter" in context.task_name and fitted_estimator is not None:
            coef = fitted_estimator.coef_
            self.ends.append(coef.get() if hasattr(coef, "get") else coef)

    def teardown(self, estimator, context):
        pass


def test_logistic_callbacks_on_cupy():
    import cupy as cp
    from sklearn.datasets import make_classification

    pytest.importorskip("sklearn.callback")
    from mpiml.linear_model import LogisticRegression

    X, y = make_classification(n_samples=2000, n_features=8, n_informative=5, n_classes=3, random_state=0)
    g, h = _Recorder(), _Recorder()
    mg = LogisticRegression(max_iter=30).set_callbacks(g).fit(cp.asarray(X), cp.asarray(y))
    LogisticRegression(max_iter=30).set_callbacks(h).fit(X, y)
    assert len(g.ends) == int(mg.n_iter_[0]) >= 3
    np.testing.assert_allclose(np.array(g.ends[:3]), np.array(h.ends[:3]), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(g.ends[-1], mg.coef_.get(), rtol=0, atol=0)


def test_logistic_refusals_and_ovr_proba_on_cupy():
    import cupy as cp
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp
    from sklearn.datasets import make_classification

    from mpiml.linear_model import LogisticRegression

    X, y = make_classification(n_samples=500, n_features=6, random_state=1)
    big = X.copy()
    big[3, 2] = 1e100
    for data in (cp.asarray(big), csp.csr_matrix(sp.csr_matrix(big))):
        with pytest.raises(ValueError, match="maximum value > 1e30"):
            LogisticRegression(solver="liblinear").fit(data, cp.asarray(y))
    m = LogisticRegression().fit(cp.asarray(X), cp.asarray(y))
    h = LogisticRegression().fit(X, y)
    p = m._predict_proba_lr(cp.asarray(X))
    assert isinstance(p, cp.ndarray)
    np.testing.assert_allclose(p.get(), h._predict_proba_lr(X), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("weighted", [False, True])
def test_copy_x_false_on_cupy(weighted):
    import cupy as cp
    from sklearn.datasets import make_regression

    from mpiml.linear_model import LinearRegression

    X, y = make_regression(n_samples=1000, n_features=5, random_state=2)
    X += 4.0
    w = np.random.default_rng(0).random(X.shape[0]) + 0.5
    Xg, Xh = cp.asarray(X), X.copy()
    kw_g, kw_h = ({"sample_weight": cp.asarray(w)}, {"sample_weight": w}) if weighted else ({}, {})
    LinearRegression(copy_X=False).fit(Xg, cp.asarray(y), **kw_g)
    LinearRegression(copy_X=False).fit(Xh, y, **kw_h)
    assert np.linalg.norm(Xh - X) > 1.0
    np.testing.assert_allclose(Xg.get(), Xh, rtol=1e-10, atol=1e-10)


def test_ridge_sag_iterations_shapes_and_score_on_cupy():
    import cupy as cp
    from sklearn.datasets import make_regression
    from sklearn.exceptions import UndefinedMetricWarning

    from mpiml.linear_model import Ridge

    X, y = make_regression(n_samples=800, n_features=9, random_state=3)
    for solver in ("sag", "saga"):
        g = Ridge(solver=solver, max_iter=3, tol=1e-12).fit(cp.asarray(X), cp.asarray(np.c_[y, y]))
        assert list(g.n_iter_) == [3, 3]
    g = Ridge().fit(cp.asarray(X), cp.asarray(y[:, None]))
    assert g.coef_.shape == (9,) and np.shape(g.intercept_) == (1,)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert np.isnan(g.score(cp.asarray(X[:1]), cp.asarray(y[:1])))
    assert any(issubclass(r.category, UndefinedMetricWarning) for r in rec)
