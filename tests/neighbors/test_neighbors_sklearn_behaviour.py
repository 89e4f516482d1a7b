"""scikit-learn's documented behaviours of NearestNeighbors, KNeighborsClassifier and KNeighborsRegressor,
checked against ours on one process (here) and on 3 ranks (``neighbors_behaviour_spmd_script.py``).

Parameters (every public constructor parameter, with scikit-learn's defaults and meaning), fitted
attributes, shapes, dtypes, sparse vs dense equality, and errors: the exception types and, where a
user would match on it, the message wording.

Deliberate differences, asserted as such below:

* distances keep the dtype of the input (float32 in, float32 out: "everything follows X"); scikit-learn
  returns float64 distances for float32 input;
* ``metric="sqeuclidean"`` works on sparse input (scikit-learn refuses it there);
* metrics mpiml does not compute (callables, scikit-learn's rarer names) raise scikit-learn's
  parameter error shape naming the value, listing the metrics mpiml computes.
"""

import inspect
import math
import os
import re
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import neighbors as sk
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from mpiml import neighbors as mn

import _neighbors_launches

HERE = os.path.dirname(os.path.abspath(__file__))
CLASSES = ("NearestNeighbors", "KNeighborsClassifier", "KNeighborsRegressor")


def _data(seed=0, n=60, d=5, sparse=False):
    rs = np.random.RandomState(seed)
    X = rs.rand(n, d)
    if sparse:
        X = X * (rs.rand(n, d) < 0.5)
    y = rs.randint(0, 3, n)
    return X, y, rs.rand(12, d) * (rs.rand(12, d) < (0.5 if sparse else 2))


def _unordered_sets(message):
    """``{'b', 'a'}`` listings in a message in sorted order (scikit-learn prints Python sets, whose order
    changes with the hash seed)."""
    def sort_set(m):
        return "{" + ", ".join(sorted(m.group(1).split(", "))) + "}"
    return re.sub(r"\{([^{}]*)\}", sort_set, message)


def _same_neighbours(da, ia, db, ib, d_next, atol=1e-7):
    """Distances equal; the neighbour sets equal on every row whose k-th distance is clear of the next
    one (exact ties may be listed in another order: ours by global index)."""
    np.testing.assert_allclose(db, da, rtol=1e-10, atol=atol)
    clear = da[:, -1] < d_next * (1 - 1e-9) - 2 * atol
    assert clear.mean() >= 0.5
    for r in np.nonzero(clear)[0]:
        assert set(ib[r]) == set(ia[r]), (r, ia[r], ib[r])
    order = np.lexsort((ib, np.round(db, 9)), axis=1)
    np.testing.assert_array_equal(np.take_along_axis(ib, order, axis=1), ib)  # ties by index


def _pair(name, **params):
    return getattr(sk, name)(**params), getattr(mn, name)(**params)


def _outcome(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
            error = None
        except Exception as exc:  # noqa: BLE001 - the outcome itself is compared
            value, error = None, exc
    return value, error, [(w.category, str(w.message)) for w in caught]


# ---------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name", CLASSES)
def test_constructor_has_every_sklearn_parameter_with_its_default(name):
    ours = inspect.signature(getattr(mn, name).__init__).parameters
    theirs = inspect.signature(getattr(sk, name).__init__).parameters
    for pname, param in theirs.items():
        assert pname in ours, f"{name} lacks scikit-learn's parameter {pname!r}"
        assert ours[pname].default == param.default, (name, pname, ours[pname].default, param.default)
        assert ours[pname].kind == param.kind, (name, pname)
    assert set(ours) - set(theirs) == {"exchange", "comm"}
    est = getattr(mn, name)()
    assert clone(est).get_params() == est.get_params()


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("params", [
    dict(n_neighbors=0), dict(n_neighbors=2.0), dict(leaf_size=0), dict(p=0), dict(p=-1), dict(n_jobs="x"),
    dict(weights="foo"), dict(radius=-1), dict(metric_params=3), dict(algorithm="foo"), dict(metric=3),
])
def test_invalid_parameters_raise_sklearns_error(name, params):
    if ("weights" in params and name == "NearestNeighbors") or ("radius" in params and name != "NearestNeighbors"):
        pytest.skip("not a parameter of this class")
    X, y, _ = _data()
    a, b = _pair(name, **params)
    _, ea, _ = _outcome(lambda: a.fit(X, y))
    _, eb, _ = _outcome(lambda: b.fit(X, y))
    assert ea is not None and eb is not None
    assert isinstance(eb, ValueError) and isinstance(eb, TypeError)  # InvalidParameterError's two bases
    if "metric" in params:  # mpiml lists the metrics it computes
        head = str(ea).split(" must be ")[0]
        assert str(eb).startswith(head) and str(eb).endswith(str(ea).rsplit(". ", 1)[1])
    else:
        assert _unordered_sets(str(eb)) == _unordered_sets(str(ea))


@pytest.mark.parametrize("metric, p, metric_params", [
    ("minkowski", 2, None), ("minkowski", 1, None), ("minkowski", math.inf, None), ("minkowski", 3, None),
    ("minkowski", 1.5, None), ("euclidean", 3, None), ("l2", 2, None), ("l1", 2, None), ("cityblock", 2, None),
    ("manhattan", 2, None), ("cosine", 2, None), ("chebyshev", 2, None), ("sqeuclidean", 2, None),
    ("minkowski", 2, {"p": 1}), ("infinity", 2, None),
])
def test_metric_resolution_and_results_equal_sklearn(metric, p, metric_params):
    X, y, Q = _data(1)
    a, b = _pair("NearestNeighbors", n_neighbors=4, metric=metric, p=p, metric_params=metric_params)
    va, ea, wa = _outcome(lambda: a.fit(X))
    vb, eb, wb = _outcome(lambda: b.fit(X))
    assert ea is None and eb is None, (ea, eb)
    assert [c for c, _ in wb] == [c for c, _ in wa] and [m for _, m in wb] == [m for _, m in wa]
    assert b.effective_metric_ == a.effective_metric_
    assert b.effective_metric_params_ == a.effective_metric_params_
    da, ia = a.kneighbors(Q)
    db, ib = b.kneighbors(Q)
    np.testing.assert_array_equal(ib, ia)
    np.testing.assert_allclose(db, da, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("algorithm", ["kd_tree", "ball_tree", "brute", "auto"])
def test_tree_algorithms_give_the_exact_neighbours_and_sklearns_refusals(algorithm):
    X, y, Q = _data(2)
    a, b = _pair("KNeighborsClassifier", n_neighbors=5, algorithm=algorithm)
    np.testing.assert_array_equal(b.fit(X, y).predict(Q), a.fit(X, y).predict(Q))
    np.testing.assert_array_equal(b.kneighbors(Q)[1], a.kneighbors(Q)[1])
    a, b = _pair("NearestNeighbors", algorithm=algorithm, metric="cosine")
    _, ea, _ = _outcome(lambda: a.fit(X))
    _, eb, _ = _outcome(lambda: b.fit(X))
    assert type(eb) is type(ea) and str(eb) == str(ea)
    # sparse input: scikit-learn warns and uses brute force with a tree
    a, b = _pair("NearestNeighbors", algorithm=algorithm)
    _, ea, wa = _outcome(lambda: a.fit(sp.csr_matrix(X)))
    _, eb, wb = _outcome(lambda: b.fit(sp.csr_matrix(X)))
    assert ea is None and eb is None
    assert [m for _, m in wb] == [m for _, m in wa]


# ---------------------------------------------------------------------- results, shapes, dtypes
@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "cosine", "minkowski"])
@pytest.mark.parametrize("fmt", ["dense", "csr", "csc", "coo"])
def test_sparse_input_equals_dense_and_sklearn(metric, fmt):
    X, y, Q = _data(3, sparse=True)
    conv = (lambda A: A) if fmt == "dense" else (lambda A: sp.csr_matrix(A).asformat(fmt))
    for name in CLASSES:
        a, b = _pair(name, n_neighbors=4, metric=metric, weights="distance") if name != "NearestNeighbors" \
            else _pair(name, n_neighbors=4, metric=metric)
        a.fit(conv(X), y)
        b.fit(conv(X), y)
        if fmt != "dense":
            assert sp.issparse(b._shard_X) and b._shard_X.format == "csr"
        da, ia = a.kneighbors(conv(Q), n_neighbors=5)
        db, ib = b.kneighbors(conv(Q))
        _same_neighbours(da[:, :4], ia[:, :4], db, ib, da[:, 4])  # atol: scikit-learn's |a|²-2ab+|b|² rounding
        if name == "KNeighborsClassifier":
            np.testing.assert_allclose(b.predict_proba(conv(Q)), a.predict_proba(conv(Q)), rtol=1e-6)
            np.testing.assert_array_equal(b.predict(conv(Q)), a.predict(conv(Q)))
            assert b.score(conv(X), y) == pytest.approx(a.score(conv(X), y))
        if name == "KNeighborsRegressor":
            np.testing.assert_allclose(b.predict(conv(Q)), a.predict(conv(Q)), rtol=1e-6)
        Ga, Gb = a.kneighbors_graph(conv(Q), mode="distance"), b.kneighbors_graph(conv(Q), mode="distance")
        assert Gb.shape == Ga.shape and Gb.format == "csr"
        clear = da[:, 3] < da[:, 4] * (1 - 1e-9) - 2e-7  # rows without a tie across the k-th place
        np.testing.assert_allclose(Gb.toarray()[clear], Ga.toarray()[clear], atol=1e-7)


def test_sqeuclidean_on_sparse_input_is_computed_where_sklearn_refuses_it():
    X, _, Q = _data(4, sparse=True)
    _, ea, _ = _outcome(lambda: sk.NearestNeighbors(metric="sqeuclidean").fit(sp.csr_matrix(X)))
    assert isinstance(ea, ValueError) and "not valid for sparse input" in str(ea)
    d, i = mn.NearestNeighbors(metric="sqeuclidean").fit(sp.csr_matrix(X)).kneighbors(sp.csr_matrix(Q))
    dr, ir = sk.NearestNeighbors(metric="sqeuclidean").fit(X).kneighbors(Q)
    np.testing.assert_array_equal(i, ir)
    np.testing.assert_allclose(d, dr, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sparse", [False, True])
def test_shapes_and_dtypes(dtype, sparse):
    X, y, Q = _data(5, sparse=sparse)
    X, Q = X.astype(dtype), Q.astype(dtype)
    if sparse:
        X, Q = sp.csr_matrix(X), sp.csr_matrix(Q)
    labels = np.array(["a", "b", "c"])[y]
    for name, target in (("NearestNeighbors", None), ("KNeighborsClassifier", labels), ("KNeighborsRegressor", y)):
        a, b = _pair(name, n_neighbors=3)
        a.fit(X, target)
        b.fit(X, target)
        assert b.n_features_in_ == a.n_features_in_ and b.n_samples_fit_ == a.n_samples_fit_
        da, ia = a.kneighbors(Q)
        db, ib = b.kneighbors(Q)
        assert db.shape == da.shape and ib.shape == ia.shape and ib.dtype == ia.dtype
        assert db.dtype == dtype  # deliberate: scikit-learn gives float64 here
        assert b.kneighbors(Q, return_distance=False).shape == ia.shape
        assert b.kneighbors(Q, n_neighbors=2)[0].shape == (Q.shape[0], 2)
        assert b.kneighbors(None)[1].shape == a.kneighbors(None)[1].shape
        if name == "KNeighborsClassifier":
            pa, pb = a.predict(Q), b.predict(Q)
            assert pb.dtype == pa.dtype and pb.shape == pa.shape
            assert list(b.classes_) == list(a.classes_)
            assert b.predict_proba(Q).dtype == a.predict_proba(Q).dtype
        if name == "KNeighborsRegressor":
            assert b.predict(Q).dtype == a.predict(Q).dtype and b.predict(Q).shape == a.predict(Q).shape


def test_multi_output_targets():
    X, y, Q = _data(6)
    Y = np.c_[y, (y + 1) % 2]
    a, b = _pair("KNeighborsClassifier", n_neighbors=4)
    a.fit(X, Y)
    b.fit(X, Y)
    assert b.outputs_2d_ == a.outputs_2d_ is True
    np.testing.assert_array_equal(b.predict(Q), a.predict(Q))
    for pa, pb in zip(a.predict_proba(Q), b.predict_proba(Q)):
        np.testing.assert_allclose(pb, pa)
    assert all(np.array_equal(c1, c2) for c1, c2 in zip(a.classes_, b.classes_))
    _, ea, _ = _outcome(lambda: a.score(X, Y))
    _, eb, _ = _outcome(lambda: b.score(X, Y))
    assert type(eb) is type(ea) and str(eb) == str(ea)
    # a column vector: scikit-learn's DataConversionWarning, one output
    _, _, wa = _outcome(lambda: a.fit(X, y[:, None]))
    _, _, wb = _outcome(lambda: b.fit(X, y[:, None]))
    assert [c for c, _ in wb] == [c for c, _ in wa] and b.outputs_2d_ == a.outputs_2d_ is False
    a, b = _pair("KNeighborsRegressor", n_neighbors=4)
    np.testing.assert_allclose(b.fit(X, Y).predict(Q), a.fit(X, Y).predict(Q))
    np.testing.assert_allclose(b.fit(X, Y[:, :1]).predict(Q), a.fit(X, Y[:, :1]).predict(Q))


@pytest.mark.parametrize("weights", [None, "uniform", "distance", lambda d: np.exp(-d)])
def test_weights_including_a_callable(weights):
    X, y, Q = _data(7)
    for name in ("KNeighborsClassifier", "KNeighborsRegressor"):
        a, b = _pair(name, n_neighbors=6, weights=weights)
        a.fit(X, y)
        b.fit(X, y)
        np.testing.assert_allclose(b.predict(Q), a.predict(Q))
        assert b.score(X, y) == pytest.approx(a.score(X, y))


def test_radius_queries_and_graphs():
    X, _, Q = _data(8, sparse=True)
    for conv in (np.asarray, sp.csr_matrix):
        a, b = _pair("NearestNeighbors", radius=0.9)
        a.fit(conv(X))
        b.fit(conv(X))
        da, ia = a.radius_neighbors(conv(Q), sort_results=True)
        db, ib = b.radius_neighbors(conv(Q), sort_results=True)
        assert ib.dtype == ia.dtype == object and len(ib) == len(ia)
        for r in range(len(ia)):
            np.testing.assert_array_equal(ib[r], ia[r])
            np.testing.assert_allclose(db[r], da[r], atol=1e-7)
        for mode in ("connectivity", "distance"):
            Ga, Gb = a.radius_neighbors_graph(conv(Q), mode=mode), b.radius_neighbors_graph(conv(Q), mode=mode)
            assert Gb.shape == Ga.shape
            np.testing.assert_allclose(Gb.toarray(), Ga.toarray(), atol=1e-7)


# ---------------------------------------------------------------------- errors
def _same_error(fa, fb, exact=True):
    _, ea, _ = _outcome(fa)
    _, eb, _ = _outcome(fb)
    assert ea is not None and eb is not None, (ea, eb)
    assert isinstance(eb, type(ea)), (type(ea), type(eb), eb)
    if exact:
        assert _unordered_sets(str(eb)) == _unordered_sets(str(ea))
    return ea, eb


@pytest.mark.parametrize("name", CLASSES)
def test_errors_match_sklearn(name):
    X, y, Q = _data(9)
    a, b = _pair(name, n_neighbors=3)
    _same_error(lambda: a.kneighbors(Q), lambda: b.kneighbors(Q))  # not fitted
    assert isinstance(_outcome(lambda: b.kneighbors(Q))[1], NotFittedError)
    a.fit(X, y)
    b.fit(X, y)
    _same_error(lambda: a.kneighbors(Q, n_neighbors=0), lambda: b.kneighbors(Q, n_neighbors=0))
    _same_error(lambda: a.kneighbors(Q, n_neighbors=2.0), lambda: b.kneighbors(Q, n_neighbors=2.0))
    _same_error(lambda: a.kneighbors(Q, n_neighbors=61), lambda: b.kneighbors(Q, n_neighbors=61))
    _same_error(lambda: a.kneighbors(None, n_neighbors=60), lambda: b.kneighbors(None, n_neighbors=60))
    _same_error(lambda: a.kneighbors(Q[:, :2]), lambda: b.kneighbors(Q[:, :2]))
    _same_error(lambda: a.kneighbors(Q[:0]), lambda: b.kneighbors(Q[:0]))
    _same_error(lambda: a.kneighbors_graph(Q, mode="foo"), lambda: b.kneighbors_graph(Q, mode="foo"))
    Qnan = Q.copy()
    Qnan[0, 0] = np.nan
    _same_error(lambda: a.kneighbors(Qnan), lambda: b.kneighbors(Qnan))
    Xnan = X.copy()
    Xnan[3, 1] = np.inf
    c, d = _pair(name)
    _same_error(lambda: c.fit(Xnan, y), lambda: d.fit(Xnan, y))
    _same_error(lambda: c.fit(X[:0], y[:0]), lambda: d.fit(X[:0], y[:0]))
    _same_error(lambda: c.fit(X[:, :0], y), lambda: d.fit(X[:, :0], y))
    if name != "NearestNeighbors":
        _same_error(lambda: c.fit(X, y[:-1]), lambda: d.fit(X, y[:-1]))
        _same_error(lambda: c.fit(X, None), lambda: d.fit(X, None), exact=False)
        _same_error(lambda: a.predict(Q[:, :2]), lambda: b.predict(Q[:, :2]))
    if name == "KNeighborsClassifier":
        _same_error(lambda: c.fit(X, X[:, 0]), lambda: d.fit(X, X[:, 0]))  # continuous labels
    if name == "NearestNeighbors":
        _same_error(lambda: a.radius_neighbors(Q, sort_results=True, return_distance=False),
                    lambda: b.radius_neighbors(Q, sort_results=True, return_distance=False))


def test_sparse_input_errors_match_sklearn():
    X, y, Q = _data(10, sparse=True)
    for metric, p in (("chebyshev", 2), ("minkowski", 3), ("minkowski", math.inf)):
        a, b = _pair("NearestNeighbors", metric=metric, p=p)
        ea, eb = _same_error(lambda: a.fit(sp.csr_matrix(X)), lambda: b.fit(sp.csr_matrix(X)), exact=False)
        assert str(eb).startswith(str(ea).split(" Use ")[0])  # "Metric 'chebyshev' not valid for sparse input."
        # dense index, sparse queries: refused at query time (scikit-learn's message names its tree there)
        a.fit(X)
        b.fit(X)
        _same_error(lambda: a.kneighbors(sp.csr_matrix(Q)), lambda: b.kneighbors(sp.csr_matrix(Q)), exact=False)
    # a metric name neither library knows: scikit-learn's parameter error shape naming it
    _, eb, _ = _outcome(lambda: mn.NearestNeighbors(metric="hypot").fit(X))
    assert isinstance(eb, ValueError) and "The 'metric' parameter of NearestNeighbors must be" in str(eb)
    assert "Got 'hypot' instead." in str(eb)


# ---------------------------------------------------------------------- the same on 3 ranks
@pytest.mark.mpi
def test_behaviours_on_three_ranks(tmp_path_factory):
    # neighbors_behaviour_spmd_script.py, in the folder's shared launches
    _neighbors_launches.launches(tmp_path_factory).verdict(3, "behaviour")
