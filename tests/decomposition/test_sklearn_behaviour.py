"""scikit-learn's documented behaviours of PCA and TruncatedSVD, run against mpiml's.

A scikit-learn user's view on one process: the same parameters and defaults, the same errors
(types and messages) for bad parameters and bad data, the same fitted attributes (names, shapes,
dtypes, values), the same sparse-input rules (PCA: "auto" becomes "arpack", "full" and
"randomized" raise scikit-learn's TypeError; TruncatedSVD: both algorithms) and sparse results
equal to the dense ones.  mpiml adds ``power_iteration_normalizer="CholeskyQR2"`` (a
distributed orthonormalisation) and the ``comm`` parameter.  The core also runs on 3 ranks
(``decomp_behaviour_script.py``).
"""

import inspect
import os
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import decomposition as skd
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from mpiml import decomposition as md

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["PCA", "TruncatedSVD"]


def _data(n=60, d=8, seed=0, sparse=False, dtype=np.float64):
    rs = np.random.RandomState(seed)
    X = (rs.randn(n, d) * 0.8 ** np.arange(d)) @ np.linalg.qr(rs.randn(d, d))[0] + rs.randn(d)
    if sparse:
        X[rs.rand(n, d) < 0.5] = 0.0
    X = X.astype(dtype)
    return sp.csr_matrix(X) if sparse else X


def _raised(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as exc:  # noqa: BLE001 - the exception is the result
        return exc
    return None


@pytest.mark.parametrize("name", NAMES)
def test_every_scikit_learn_parameter_with_its_default_and_kind(name):
    theirs = inspect.signature(getattr(skd, name)).parameters
    ours = inspect.signature(getattr(md, name)).parameters
    assert set(theirs) <= set(ours) and set(ours) - set(theirs) == {"comm"}
    for p, spec in theirs.items():
        assert ours[p].kind == spec.kind and ours[p].default == spec.default, p
    est = getattr(md, name)()
    assert {k: v for k, v in est.get_params().items() if k != "comm"} == getattr(skd, name)().get_params()
    assert clone(est.set_params(n_components=3)).get_params()["n_components"] == 3


BAD_PARAMS = [
    ("PCA", "n_components", -1), ("PCA", "n_components", 1.5), ("PCA", "n_components", "max"),
    ("PCA", "copy", "yes"), ("PCA", "whiten", 1), ("PCA", "svd_solver", "lapack"), ("PCA", "tol", -1.0),
    ("PCA", "iterated_power", -1), ("PCA", "n_oversamples", 0), ("PCA", "power_iteration_normalizer", "X"),
    ("PCA", "random_state", "seed"),
    ("TruncatedSVD", "n_components", 0), ("TruncatedSVD", "algorithm", "lanczos"), ("TruncatedSVD", "n_iter", -1),
    ("TruncatedSVD", "n_oversamples", 0), ("TruncatedSVD", "power_iteration_normalizer", "qr"),
    ("TruncatedSVD", "random_state", 1.5), ("TruncatedSVD", "tol", -0.1),
]


@pytest.mark.parametrize("name,param,value", BAD_PARAMS)
def test_invalid_parameter_raises_scikit_learns_error(name, param, value):
    X = _data()
    theirs = _raised(lambda: getattr(skd, name)(**{param: value}).fit(X))
    ours = _raised(lambda: getattr(md, name)(**{param: value}).fit(X))
    assert isinstance(ours, ValueError) and isinstance(ours, TypeError)
    head = f"The {param!r} parameter of {name} must be"
    assert str(theirs).startswith(head) and str(ours).startswith(head)
    assert str(ours).endswith(f"Got {value!r} instead.")
    if "among {" not in str(theirs):  # option sets print in set order in scikit-learn, sorted in mpiml
        assert str(ours) == str(theirs)


FIT_ERRORS = [
    ("PCA", dict(n_components=9, svd_solver="full"), {}), ("PCA", dict(n_components=8, svd_solver="arpack"), {}),
    ("PCA", dict(n_components=0.5, svd_solver="arpack"), {}),
    ("PCA", dict(n_components="mle", svd_solver="randomized"), {}),
    ("PCA", dict(n_components=9, svd_solver="randomized"), {}), ("PCA", dict(n_components=0, svd_solver="arpack"), {}),
    ("PCA", dict(n_components="mle"), dict(n=5)), ("PCA", dict(n_components=3, svd_solver="full"), dict(sparse=True)),
    ("PCA", dict(n_components=3, svd_solver="randomized"), dict(sparse=True)),
    ("PCA", dict(n_components="mle"), dict(sparse=True)),
    ("TruncatedSVD", dict(n_components=8, algorithm="arpack"), {}), ("TruncatedSVD", dict(n_components=9), {}),
    ("TruncatedSVD", dict(n_components=1), dict(d=1)),
]


@pytest.mark.parametrize("name,kwargs,data", FIT_ERRORS)
def test_fit_errors_are_scikit_learns(name, kwargs, data):
    X = _data(**data)
    theirs = _raised(lambda: getattr(skd, name)(**kwargs).fit(X))
    ours = _raised(lambda: getattr(md, name)(**kwargs).fit(X))
    assert theirs is not None and type(ours) is type(theirs), (theirs, ours)
    # scikit-learn's text, then (TruncatedSVD's arpack only) the shape it refers to
    assert str(ours) == str(theirs) or (name == "TruncatedSVD" and str(ours).startswith(str(theirs) + " (n_"))


BAD_DATA = [
    ("1-d X", lambda X: X[:, 0]), ("NaN", lambda X: np.where(np.arange(X.size).reshape(X.shape) == 5, np.nan, X)),
    ("inf", lambda X: np.where(np.arange(X.size).reshape(X.shape) == 5, np.inf, X)), ("complex", lambda X: X + 1j),
    ("no rows", lambda X: X[:0]), ("NaN sparse", lambda X: sp.csr_matrix(np.where(X > 1, np.nan, X))),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case,make", BAD_DATA, ids=[c for c, _ in BAD_DATA])
def test_bad_data_raises_scikit_learns_error(name, case, make):
    Xb = make(_data())
    theirs = _raised(lambda: getattr(skd, name)(2).fit(Xb))
    ours = _raised(lambda: getattr(md, name)(2).fit(Xb))
    assert theirs is not None and type(ours) is type(theirs) and str(ours) == str(theirs), (theirs, ours)


@pytest.mark.parametrize("name", NAMES)
def test_unfitted_wrong_features_and_sparse_score(name):
    X = _data()
    with pytest.raises(NotFittedError):
        getattr(md, name)(2).transform(X)
    theirs = _raised(lambda: getattr(skd, name)(2).fit(X).transform(X[:, :-1]))
    ours = _raised(lambda: getattr(md, name)(2).fit(X).transform(X[:, :-1]))
    assert type(ours) is type(theirs) and str(ours) == str(theirs)
    if name == "PCA":
        theirs = _raised(lambda: skd.PCA(2).fit(X).score(sp.csr_matrix(X)))
        ours = _raised(lambda: md.PCA(2).fit(X).score(sp.csr_matrix(X)))
        assert type(ours) is TypeError and str(ours) == str(theirs)


FITS = [
    ("PCA", dict(n_components=3)), ("PCA", dict(n_components=3, svd_solver="arpack")),
    ("PCA", dict(n_components=3, svd_solver="covariance_eigh", whiten=True)),
    ("PCA", dict(n_components=3, svd_solver="randomized", iterated_power=6, n_oversamples=5)),
    ("PCA", dict(n_components=0.9, svd_solver="full")), ("PCA", dict(n_components="mle")), ("PCA", dict()),
    ("TruncatedSVD", dict(n_components=3)), ("TruncatedSVD", dict(n_components=3, algorithm="arpack")),
    ("TruncatedSVD", dict(n_components=3, n_iter=7, power_iteration_normalizer="QR")),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
@pytest.mark.parametrize("name,kwargs", FITS)
def test_fitted_attributes_match_scikit_learn(name, kwargs, sparse, dtype):
    X = _data(sparse=sparse, dtype=dtype)
    solver = kwargs.get("svd_solver", "auto")
    if sparse and name == "PCA" and (solver in ("full", "randomized") or kwargs.get("n_components") in ("mle", 0.9)):
        pytest.skip("scikit-learn's PCA refuses these on sparse X (see test_fit_errors_are_scikit_learns)")
    theirs = getattr(skd, name)(**kwargs, random_state=0).fit(X)
    ours = getattr(md, name)(**kwargs, random_state=0).fit(X)
    A = {k: v for k, v in vars(theirs).items() if k.endswith("_") and not k.startswith("_")}
    for key, want in A.items():
        got = getattr(ours, key)
        assert np.shape(got) == np.shape(want), key
        if isinstance(want, (np.ndarray, np.generic)):
            assert np.asarray(got).dtype == np.asarray(want).dtype, key
        rtol = 1e-6 if dtype == np.float64 else 2e-3
        np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float), rtol=rtol,
                                   atol=rtol * max(1e-3, float(np.max(np.abs(np.asarray(want, dtype=float))))),
                                   err_msg=key)
    assert ours._fit_svd_solver == theirs._fit_svd_solver if name == "PCA" else True
    for method in ("transform", "fit_transform"):
        p, q = getattr(theirs, method)(X), getattr(ours, method)(X)
        assert q.dtype == p.dtype and q.shape == p.shape
        np.testing.assert_allclose(q, p, rtol=1e-5 if dtype == np.float64 else 5e-3,
                                   atol=(1e-8 if dtype == np.float64 else 2e-3) * np.abs(p).max())
    Z = theirs.transform(X)
    np.testing.assert_allclose(ours.inverse_transform(Z), theirs.inverse_transform(Z), rtol=1e-4,
                               atol=(1e-8 if dtype == np.float64 else 2e-3) * np.abs(Z).max())
    assert list(ours.get_feature_names_out()) == list(theirs.get_feature_names_out())


@pytest.mark.parametrize("name,kwargs", [f for f in FITS if f[1].get("svd_solver") not in ("full", "randomized")
                                         and f[1].get("n_components") not in ("mle", 0.9)])
def test_sparse_equals_dense(name, kwargs):
    X = _data(sparse=True)
    if name == "PCA" and kwargs.get("svd_solver", "auto") == "auto":
        dense = md.PCA(**{**kwargs, "svd_solver": "arpack"}, random_state=0).fit(X.toarray())
    else:
        dense = getattr(md, name)(**kwargs, random_state=0).fit(X.toarray())
    for fmt in ("csr", "csc"):
        ours = getattr(md, name)(**kwargs, random_state=0).fit(X.asformat(fmt))
        np.testing.assert_allclose(ours.components_, dense.components_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(ours.explained_variance_ratio_, dense.explained_variance_ratio_, rtol=1e-10)
        np.testing.assert_allclose(ours.transform(X.asformat(fmt)), dense.transform(X.toarray()), rtol=1e-8,
                                   atol=1e-10)
        np.testing.assert_allclose(ours.transform(X.toarray()), dense.transform(X.toarray()), rtol=1e-8,
                                   atol=1e-10)


def test_pca_sparse_never_densifies_nor_modifies_x():
    X = _data(sparse=True)
    before = X.copy()
    for solver in ("auto", "arpack", "covariance_eigh"):
        md.PCA(3, svd_solver=solver, copy=False).fit_transform(X)
        assert (X != before).nnz == 0
    assert md.PCA(3).fit(X).n_components_ == 3 and md.PCA().fit(X).n_components_ == min(X.shape) - 1


def test_copy_false_centres_dense_x_in_place_like_scikit_learn():
    X = _data()
    ours, theirs = X.copy(), X.copy()
    md.PCA(3, svd_solver="full", copy=False).fit(ours)
    skd.PCA(3, svd_solver="full", copy=False).fit(theirs)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ours, X)


def test_probabilistic_pca_scores_and_covariance():
    X = _data(n=200)
    theirs, ours = skd.PCA(3).fit(X), md.PCA(3).fit(X)
    np.testing.assert_allclose(ours.score_samples(X), theirs.score_samples(X), rtol=1e-8)
    assert abs(ours.score(X) - theirs.score(X)) < 1e-9 * abs(theirs.score(X))
    np.testing.assert_allclose(ours.get_covariance(), theirs.get_covariance(), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(ours.get_precision(), theirs.get_precision(), rtol=1e-7, atol=1e-10)


@pytest.mark.mpi
def test_sklearn_behaviour_on_three_ranks(mpi):
    mpi(os.path.join(HERE, "decomp_behaviour_script.py"), 3, timeout=240)
