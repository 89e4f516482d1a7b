"""scikit-learn's documented behaviours of LinearRegression, Ridge and LogisticRegression, run against mpiml's.

A scikit-learn user's view: code written for the installed scikit-learn runs unchanged on mpiml's
classes on one process and gets the same parameters, fitted attributes (names, shapes, dtypes,
values), exceptions (types and messages), warnings and sparse-input handling.  Where mpiml
deliberately differs, the test says so and checks the documented behaviour instead:

* ``Ridge(solver="auto")`` on sparse ``X`` solves exactly (``solver_ == "cholesky"``) where
  scikit-learn iterates (``"sparse_cg"``); ``"sag"``/``"saga"`` run as ``"sparse_cg"``;
  ``"cholesky"``/``"svd"`` accept sparse ``X`` with an intercept (scikit-learn refuses).
* ``Ridge(positive=True)`` reports ``solver_ == "nnls"`` (an exact non-negative solve).
* ``LogisticRegression``'s ``"sag"`` and ``"saga"`` run a proximal Newton method on their objective;
  ``"liblinear"`` runs LIBLINEAR's own algorithms (``test_liblinear.py``).

The core of these checks also runs on 3 ranks (``linear_behaviour_script.py``).
"""

import inspect
import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import linear_model as sk
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError

from mpiml import linear_model as ml

from . import _launches

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["LinearRegression", "Ridge", "LogisticRegression"]
#: Parameters mpiml adds to scikit-learn's (``solver`` of LinearRegression picks the distributed algorithm).
EXTRA = {"LinearRegression": {"comm", "solver"}, "Ridge": {"comm"}, "LogisticRegression": {"comm"}}


def _data(kind="reg", n=80, d=5, seed=0, sparse=False, dtype=np.float64):
    rs = np.random.RandomState(seed)
    X = rs.randn(n, d)
    if sparse:
        X[rs.rand(n, d) < 0.6] = 0.0
    y = X @ rs.randn(d) + 0.3 * rs.randn(n) + 2.0
    if kind == "bin":
        y = (y > np.median(y)).astype(int)
    elif kind == "multi":
        y = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))
    X = X.astype(dtype)
    return (sp.csr_matrix(X) if sparse else X), y


def _raised(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the exception is the result
        return exc
    return None


def _fitted_attributes(est):
    found = {k: v for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}
    # properties computed when first read (LinearRegression's singular_ after a full-rank normal-equations fit)
    for k in dir(type(est)):
        if k.endswith("_") and not k.startswith("_") and isinstance(getattr(type(est), k), property) \
                and hasattr(est, k):
            found[k] = getattr(est, k)
    return found


# ---------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name", NAMES)
def test_every_scikit_learn_parameter_with_its_default_and_kind(name):
    theirs = inspect.signature(getattr(sk, name)).parameters
    ours = inspect.signature(getattr(ml, name)).parameters
    assert set(theirs) <= set(ours), f"missing: {set(theirs) - set(ours)}"
    assert set(ours) - set(theirs) <= EXTRA[name]
    for p, spec in theirs.items():
        assert ours[p].kind == spec.kind, f"{p}: positional/keyword kind differs"
        assert ours[p].default == spec.default or (ours[p].default is spec.default), f"{p}: default differs"
    est = getattr(ml, name)()
    assert {k: v for k, v in est.get_params().items() if k in theirs} == getattr(sk, name)().get_params()


BAD_PARAMS = [
    ("LinearRegression", "fit_intercept", "yes"), ("LinearRegression", "copy_X", 1),
    ("LinearRegression", "tol", -1.0), ("LinearRegression", "n_jobs", 1.5), ("LinearRegression", "positive", None),
    ("Ridge", "alpha", -1.0), ("Ridge", "max_iter", 0), ("Ridge", "tol", -1e-3), ("Ridge", "solver", "newton"),
    ("Ridge", "positive", "no"), ("Ridge", "random_state", "seed"), ("Ridge", "fit_intercept", 0),
    ("LogisticRegression", "penalty", "l3"), ("LogisticRegression", "C", 0.0), ("LogisticRegression", "C", -1),
    ("LogisticRegression", "l1_ratio", 1.5), ("LogisticRegression", "dual", "no"), ("LogisticRegression", "tol", -1),
    ("LogisticRegression", "intercept_scaling", 0), ("LogisticRegression", "class_weight", "auto"),
    ("LogisticRegression", "random_state", -1), ("LogisticRegression", "solver", "newton"),
    ("LogisticRegression", "max_iter", -1), ("LogisticRegression", "verbose", -1),
    ("LogisticRegression", "warm_start", None), ("LogisticRegression", "n_jobs", "all"),
]


@pytest.mark.parametrize("name,param,value", BAD_PARAMS)
def test_invalid_parameter_raises_scikit_learns_error(name, param, value):
    kind = "reg" if name != "LogisticRegression" else "bin"
    X, y = _data(kind)
    theirs = _raised(lambda: getattr(sk, name)(**{param: value}).fit(X, y))
    ours = _raised(lambda: getattr(ml, name)(**{param: value}).fit(X, y))
    assert theirs is not None and ours is not None
    # scikit-learn's InvalidParameterError is both a ValueError and a TypeError; so is mpiml's
    assert isinstance(ours, ValueError) and isinstance(ours, TypeError)
    head = f"The {param!r} parameter of {name} must be"
    tail = f"Got {value!r} instead."
    assert str(theirs).startswith(head) and str(ours).startswith(head), (str(theirs), str(ours))
    assert str(ours).endswith(tail)
    if "among {" not in str(theirs):  # option sets print in set order in scikit-learn, sorted in mpiml
        assert str(ours) == str(theirs)


def test_removed_parameter_is_a_type_error_like_scikit_learn():
    for cls in (sk.LogisticRegression, ml.LogisticRegression):
        with pytest.raises(TypeError, match="multi_class"):
            cls(multi_class="multinomial")


@pytest.mark.parametrize("name", NAMES)
def test_get_params_set_params_clone(name):
    est = getattr(ml, name)()
    params = est.get_params()
    twin = clone(est.set_params(fit_intercept=False))
    assert twin.get_params() == {**params, "fit_intercept": False}
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(not_a_parameter=1)


def test_parameters_feed_scikit_learn_and_its_searches():
    # comm left unset is not reported: the parameters are scikit-learn's own
    from sklearn.model_selection import GridSearchCV

    from mpiml.comm import get_comm

    for name in ("Ridge", "LogisticRegression"):
        ours = getattr(ml, name)(tol=1e-3)
        assert getattr(sk, name)(**ours.get_params()).get_params() == ours.get_params()
    X, y = _data("bin", n=90)
    one = get_comm("self")
    search = GridSearchCV(ml.LogisticRegression(), {"C": [0.1, 1.0], "comm": [None, one]}, cv=3).fit(X, y)
    assert {p["comm"] for p in search.cv_results_["params"]} == {None, one}
    assert search.best_estimator_.comm is search.best_params_["comm"]


# ---------------------------------------------------------------------- errors and warnings
SOLVER_RULES = [
    ("LogisticRegression", dict(l1_ratio=1.0), "bin"),
    ("LogisticRegression", dict(dual=True), "bin"),
    ("LogisticRegression", dict(solver="newton-cg", l1_ratio=0.5), "bin"),
    ("LogisticRegression", dict(solver="liblinear", C=np.inf), "bin"),
    ("LogisticRegression", dict(solver="liblinear"), "multi"),
    ("LogisticRegression", dict(l1_ratio=None, penalty="elasticnet", solver="saga"), "bin"),
    ("Ridge", dict(solver="lbfgs"), "reg"),
    ("Ridge", dict(solver="svd", positive=True), "reg"),
    ("Ridge", dict(alpha=[1.0, 2.0]), "reg"),
]


@pytest.mark.parametrize("name,kwargs,kind", SOLVER_RULES)
def test_parameter_combinations_raise_scikit_learns_value_error(name, kwargs, kind):
    X, y = _data(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _raised(lambda: getattr(sk, name)(**kwargs).fit(X, y))
        ours = _raised(lambda: getattr(ml, name)(**kwargs).fit(X, y))
    assert type(theirs) is ValueError and type(ours) is ValueError
    assert str(ours) == str(theirs)


def test_l1_and_elasticnet_fit_as_scikit_learn():
    X, y = _data("bin")
    for kwargs in (dict(solver="saga", l1_ratio=1.0), dict(solver="saga", l1_ratio=0.5),
                   dict(solver="liblinear", l1_ratio=1.0)):
        ref = sk.LogisticRegression(**kwargs, tol=1e-10, max_iter=10000).fit(X, y)
        ours = ml.LogisticRegression(**kwargs, tol=1e-8).fit(X, y)
        np.testing.assert_allclose(ours.coef_, ref.coef_, atol=1e-5)
        np.testing.assert_array_equal(ours.coef_ == 0, ref.coef_ == 0)


DATA_ERRORS = [
    ("1-d X", lambda X, y: (X[:, 0], y)),
    ("3-d X", lambda X, y: (X[:, :, None], y)),
    ("y too short", lambda X, y: (X, y[:-1])),
    ("NaN in X", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y)),
    ("inf in X", lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.inf, X), y)),
    ("complex X", lambda X, y: (X + 1j, y)),
    ("no rows", lambda X, y: (X[:0], y[:0])),
    ("NaN in y", lambda X, y: (X, np.where(np.arange(y.size) == 2, np.nan, y))),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case,make", DATA_ERRORS, ids=[c for c, _ in DATA_ERRORS])
def test_bad_data_raises_scikit_learns_error(name, case, make):
    X, y = _data("reg" if name != "LogisticRegression" else "bin")
    if name == "LogisticRegression" and case == "NaN in y":
        y = y.astype(float)
    Xb, yb = make(X, y)
    theirs = _raised(lambda: getattr(sk, name)().fit(Xb, yb))
    ours = _raised(lambda: getattr(ml, name)().fit(Xb, yb))
    assert theirs is not None and type(ours) is type(theirs), (theirs, ours)
    assert str(ours) == str(theirs)


@pytest.mark.parametrize("name", NAMES)
def test_sample_weight_errors(name):
    X, y = _data("reg" if name != "LogisticRegression" else "bin")
    for sw in (-np.ones(len(y)), np.ones(len(y) + 1), np.zeros(len(y))):
        theirs = _raised(lambda: getattr(sk, name)().fit(X, y, sample_weight=sw))
        ours = _raised(lambda: getattr(ml, name)().fit(X, y, sample_weight=sw))
        assert (theirs is None) == (ours is None), (theirs, ours)
        if theirs is not None:
            assert type(ours) is type(theirs)


@pytest.mark.parametrize("name", NAMES)
def test_unfitted_and_wrong_feature_count(name):
    X, y = _data("reg" if name != "LogisticRegression" else "bin")
    with pytest.raises(NotFittedError):
        getattr(ml, name)().predict(X)
    theirs = _raised(lambda: getattr(sk, name)().fit(X, y).predict(X[:, :-1]))
    ours = _raised(lambda: getattr(ml, name)().fit(X, y).predict(X[:, :-1]))
    assert type(ours) is type(theirs) and str(ours) == str(theirs)


def test_one_class_only_is_scikit_learns_error():
    X, _ = _data("bin")
    y = np.full(len(X), 3)
    theirs = _raised(lambda: sk.LogisticRegression().fit(X, y))
    ours = _raised(lambda: ml.LogisticRegression().fit(X, y))
    assert type(ours) is ValueError and str(ours) == str(theirs)


def _warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return sorted({(w.category.__name__, str(w.message) if w.category is not ConvergenceWarning else "")
                   for w in caught if w.category is not DeprecationWarning})


WARNING_CASES = [
    dict(penalty="l2"), dict(penalty=None, C=2.0), dict(l1_ratio=None), dict(n_jobs=2),
    dict(penalty="l2", l1_ratio=0.5),
    dict(max_iter=2), dict(solver="newton-cholesky", max_iter=1), dict(solver="newton-cg", max_iter=1),
]


@pytest.mark.parametrize("kwargs", WARNING_CASES, ids=[str(k) for k in WARNING_CASES])
def test_logistic_warnings_are_scikit_learns(kwargs):
    X, y = _data("multi", n=200)
    X = X * 30.0  # badly scaled: few iterations do not converge
    theirs = _warnings(lambda: sk.LogisticRegression(**kwargs).fit(X, y))
    ours = _warnings(lambda: ml.LogisticRegression(**kwargs).fit(X, y))
    assert ours == theirs


def test_separable_classes_without_penalty_warn_and_separate():
    rs = np.random.RandomState(0)
    X = np.r_[rs.randn(40, 2) - 4, rs.randn(40, 2) + 4]
    y = np.r_[np.zeros(40), np.ones(40)]
    theirs = _warnings(lambda: sk.LogisticRegression(C=np.inf, max_iter=20).fit(X, y))
    ours = _warnings(lambda: ml.LogisticRegression(C=np.inf, max_iter=20).fit(X, y))
    assert ours == theirs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert ml.LogisticRegression(C=np.inf, max_iter=20).fit(X, y).score(X, y) == 1.0


# ---------------------------------------------------------------------- fitted attributes, dense and sparse
FITS = [
    ("LinearRegression", {}, "reg"), ("LinearRegression", {"fit_intercept": False}, "reg"),
    ("LinearRegression", {"positive": True}, "reg"),
    ("Ridge", {"alpha": 0.5}, "reg"), ("Ridge", {"solver": "lsqr", "tol": 1e-12}, "reg"),
    ("Ridge", {"solver": "sparse_cg", "tol": 1e-12}, "reg"), ("Ridge", {"solver": "svd"}, "reg"),
    ("LogisticRegression", {"tol": 1e-10}, "bin"), ("LogisticRegression", {"tol": 1e-10}, "multi"),
    ("LogisticRegression", {"solver": "newton-cholesky", "tol": 1e-10}, "multi"),
    ("LogisticRegression", {"solver": "newton-cg", "tol": 1e-10}, "bin"),
    ("LogisticRegression", {"class_weight": "balanced", "fit_intercept": False, "tol": 1e-10}, "multi"),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("name,kwargs,kind", FITS)
def test_fitted_attributes_match_scikit_learn(name, kwargs, kind, sparse, dtype):
    if sparse and kwargs.get("positive"):
        pytest.skip("positive=True refuses sparse X in both libraries (tested below)")
    X, y = _data(kind, sparse=sparse, dtype=dtype)
    targets = [y] if kind != "reg" else [y, np.c_[y, -2 * y]]
    for t in targets:
        if name == "Ridge" and kwargs.get("solver") == "svd" and sparse:
            theirs = getattr(sk, name)(**kwargs).fit(X.toarray(), t)  # scikit-learn's svd refuses sparse X
        else:
            theirs = getattr(sk, name)(**kwargs).fit(X, t)
        ours = getattr(ml, name)(**kwargs).fit(X, t)
        A, B = _fitted_attributes(theirs), _fitted_attributes(ours)
        assert set(A) <= set(B), f"missing fitted attributes {set(A) - set(B)}"
        quirk = sparse and dtype == np.float32 and name == "LinearRegression" and not ours.fit_intercept
        for key, want in A.items():
            got = B[key]
            if key == "solver_":
                continue  # compared in test_documented_solver_choices
            if key == "n_iter_":
                assert (got is None) == (want is None) and np.shape(got) == np.shape(want)
                continue
            assert np.shape(got) == np.shape(want), key
            if isinstance(want, (np.ndarray, np.generic)):
                # scikit-learn's LSQR returns float64 for float32 sparse X without an intercept (and float32
                # with one); mpiml keeps X's dtype in both cases
                assert np.asarray(got).dtype == (dtype if quirk else np.asarray(want).dtype), key
            rtol = 1e-6 if dtype == np.float64 else (1e-3 if name == "LogisticRegression" else 1e-4)
            np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=rtol,
                                       atol=rtol * max(1.0, float(np.max(np.abs(np.asarray(want, dtype=float))))),
                                       err_msg=key)
        for method in ("predict", "decision_function", "predict_proba"):
            if hasattr(theirs, method):
                p, q = getattr(theirs, method)(X), getattr(ours, method)(X)
                assert q.dtype == (dtype if quirk else p.dtype) and q.shape == p.shape, method
        assert abs(ours.score(X, t) - theirs.score(X, t)) < (1e-4 if dtype == np.float32 else 1e-8)


@pytest.mark.parametrize("name,kwargs,kind", FITS)
def test_sparse_equals_dense(name, kwargs, kind):
    if kwargs.get("positive"):
        X, y = _data(kind)
        for est in (sk.LinearRegression(positive=True), ml.LinearRegression(positive=True)):
            with pytest.raises(TypeError, match="dense data is required"):
                est.fit(sp.csr_matrix(X), y)
        return
    X, y = _data(kind, sparse=True)
    iterative = kwargs.get("solver") in ("lsqr", "sparse_cg") or name == "LogisticRegression"
    dense = getattr(ml, name)(**kwargs).fit(X.toarray(), y)
    for fmt in ("csr", "csc", "coo"):
        ours = getattr(ml, name)(**kwargs).fit(X.asformat(fmt), y)
        np.testing.assert_allclose(ours.coef_, dense.coef_, rtol=1e-7 if iterative else 1e-10, atol=1e-10)
        np.testing.assert_allclose(ours.predict(X.asformat(fmt)), dense.predict(X.toarray()), rtol=1e-7, atol=1e-9)
    ours = getattr(ml, name)(**kwargs).fit(sp.csr_array(X), y)
    np.testing.assert_allclose(ours.coef_, dense.coef_, rtol=1e-7 if iterative else 1e-10, atol=1e-10)


def test_documented_solver_choices():
    X, y = _data("reg", sparse=True)
    assert ml.Ridge().fit(X, y).solver_ == "cholesky" and sk.Ridge().fit(X, y).solver_ == "sparse_cg"
    assert ml.Ridge().fit(X.toarray(), y).solver_ == sk.Ridge().fit(X.toarray(), y).solver_ == "cholesky"
    for solver in ("sag", "saga"):  # run as sparse_cg, reported under the name asked (as scikit-learn)
        assert ml.Ridge(solver=solver, max_iter=1000).fit(X, y).solver_ == solver
    assert ml.Ridge(positive=True).fit(X, y).solver_ == "nnls"
    assert ml.LinearRegression().fit(X, y).solver_ == "normal"
    assert ml.LinearRegression(solver="lsqr").fit(X, y).n_iter_.dtype == np.int32
    # scikit-learn refuses cholesky/svd on sparse X with an intercept; mpiml solves it exactly
    with pytest.raises(ValueError, match="does not support fitting the intercept on sparse data"):
        sk.Ridge(solver="cholesky").fit(X, y)
    np.testing.assert_allclose(ml.Ridge(solver="cholesky").fit(X, y).coef_, sk.Ridge().fit(X.toarray(), y).coef_,
                               rtol=1e-10)


def test_positive_fits_are_scikit_learns_non_negative_solutions():
    X, y = _data("reg", n=120, d=8)
    y = y - 3 * X[:, 0] + 2 * X[:, 1]
    theirs = sk.LinearRegression(positive=True).fit(X, y)
    for solver in ("auto", "tsqr", "normal"):
        ours = ml.LinearRegression(positive=True, solver=solver).fit(X, y)
        np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-12)
        assert ours.coef_.min() >= 0
    exact = sk.Ridge(alpha=5.0, positive=True, tol=1e-12).fit(X, y)
    for Xi in (X, sp.csr_matrix(X)):
        ours = ml.Ridge(alpha=5.0, positive=True).fit(Xi, y)  # "auto": exact NNLS
        np.testing.assert_allclose(ours.coef_, exact.coef_, rtol=1e-6, atol=1e-7)
        # "lbfgs": scikit-learn's L-BFGS-B iterations on the factor, its tol included (the same point)
        for tol in (1e-4, 1e-12):
            theirs = sk.Ridge(alpha=5.0, positive=True, solver="lbfgs", tol=tol).fit(X, y)
            ours = ml.Ridge(alpha=5.0, positive=True, solver="lbfgs", tol=tol).fit(Xi, y)
            np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-9, atol=1e-12)
            assert ours.solver_ == "lbfgs"


@pytest.mark.parametrize("solver", ["sag", "saga", "liblinear"])
def test_logistic_solvers_reach_scikit_learns_minimiser(solver):
    X, y = _data("bin", n=150)
    kw = dict(tol=1e-12, max_iter=10000)
    theirs = sk.LogisticRegression(solver=solver, intercept_scaling=3.0, **kw).fit(X, y)
    ours = ml.LogisticRegression(solver=solver, intercept_scaling=3.0, **kw).fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.intercept_, theirs.intercept_, rtol=1e-4, atol=1e-6)


def test_warm_start_reuses_the_previous_coefficients():
    X, y = _data("multi", n=200)
    est = ml.LogisticRegression(warm_start=True, tol=1e-8, max_iter=500).fit(X, y)
    first = est.n_iter_[0]
    est.fit(X, y)
    assert est.n_iter_[0] < first
    cold = ml.LogisticRegression(tol=1e-8, max_iter=500).fit(X, y)
    np.testing.assert_allclose(est.coef_, cold.coef_, rtol=1e-5, atol=1e-7)
    theirs = _raised(lambda: sk.LogisticRegression(warm_start=True).fit(X, y).fit(X[:, :-1], y))
    ours = _raised(lambda: ml.LogisticRegression(warm_start=True).fit(X, y).fit(X[:, :-1], y))
    assert type(ours) is ValueError and str(ours) == str(theirs)


def test_verbose_prints_progress(capsys):
    X, y = _data("bin")
    ml.LogisticRegression(verbose=1).fit(X, y)
    assert "loss" in capsys.readouterr().out
    ml.LogisticRegression().fit(X, y)
    assert capsys.readouterr().out == ""


# ---------------------------------------------------------------------- the core on 3 ranks
@pytest.mark.mpi
def test_sklearn_behaviour_on_three_ranks(tmp_path_factory):
    _launches.launches(tmp_path_factory).verdict(3, "behaviour")   # linear_behaviour_script.py (_launches.py)
