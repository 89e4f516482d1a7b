"""scikit-learn's constructor parameters on one process (the forests as drop-in replacements).

Every public parameter of scikit-learn's RandomForestClassifier / Regressor is
accepted with its default; each is either honoured with scikit-learn's meaning
(checked against scikit-learn on data where the trees are exact) or refused
with scikit-learn's error shape naming the value.
"""

import inspect
import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes
from sklearn.ensemble import RandomForestClassifier as SkClassifier
from sklearn.ensemble import RandomForestRegressor as SkRegressor
from sklearn.metrics import balanced_accuracy_score

import mpiml
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor
from mpiml.utils import InvalidParameterError

PAIRS = [(RandomForestClassifier, SkClassifier), (RandomForestRegressor, SkRegressor)]


def _exact_data(kind, seed=0):
    """Few distinct values per feature: histogram splits are scikit-learn's exact splits."""
    rs = np.random.RandomState(seed)
    X = rs.randint(0, 20, size=(400, 4)).astype(float) + rs.randint(0, 7, size=4) * 0.25
    noise = rs.rand(400)
    if kind == "classifier":
        return X, (X[:, 0] + 2 * X[:, 1] > 25).astype(int) ^ (noise < 0.1)
    return X, X[:, 0] + 2 * X[:, 1] + 3 * noise - 30.0


@pytest.mark.parametrize("ours,theirs", PAIRS)
def test_every_scikit_learn_parameter_is_accepted_with_its_default(ours, theirs):
    sk = inspect.signature(theirs).parameters
    mine = inspect.signature(ours).parameters
    missing = [p for p in sk if p not in mine]
    assert not missing, missing
    for name, p in sk.items():
        assert mine[name].default == p.default, (name, mine[name].default, p.default)
        assert mine[name].kind == p.kind, name
    # and each can be passed through get_params / set_params / clone
    est = ours(**{name: p.default for name, p in sk.items()})
    assert all(est.get_params()[name] == p.default for name, p in sk.items())


@pytest.mark.parametrize("kind", ["classifier", "regressor"])
@pytest.mark.parametrize("extra", [{"max_leaf_nodes": 7}, {"max_leaf_nodes": 5, "max_depth": 3},
                                   {"ccp_alpha": 0.004}, {"min_impurity_decrease": 0.01},
                                   {"ccp_alpha": 0.002, "max_leaf_nodes": 12}])
def test_pruning_parameters_grow_scikit_learns_tree(kind, extra):
    X, y = _exact_data(kind)
    ours, theirs = (RandomForestClassifier, SkClassifier) if kind == "classifier" else \
        (RandomForestRegressor, SkRegressor)
    if kind == "regressor":        # impurity scales: variance of y is ~40
        extra = {k: (v * 200 if k in ("ccp_alpha", "min_impurity_decrease") else v) for k, v in extra.items()}
    params = dict(n_estimators=1, bootstrap=False, max_features=None, random_state=0, **extra)
    a, b = ours(**params).fit(X, y), theirs(**params).fit(X, y)
    assert a.tree_feature_.shape[0] == b.estimators_[0].tree_.node_count
    if kind == "classifier":
        np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-12)
    else:
        np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-12)
    np.testing.assert_allclose(a.feature_importances_, b.feature_importances_, rtol=1e-9, atol=1e-12)
    if "max_leaf_nodes" in extra:
        assert (a.tree_feature_ == -2).sum() <= extra["max_leaf_nodes"]


@pytest.mark.parametrize("cls", [RandomForestClassifier, RandomForestRegressor])
def test_warm_start_adds_the_trees_of_a_larger_forest(cls):
    X, y = load_breast_cancer(return_X_y=True)
    est = cls(n_estimators=3, max_depth=5, random_state=0, warm_start=True).fit(X, y)
    first = est.tree_threshold_[:int(est.tree_offsets_[3])].copy()
    est.set_params(n_estimators=7).fit(X, y)
    fresh = cls(n_estimators=7, max_depth=5, random_state=0).fit(X, y)
    assert est.n_estimators_ == 7
    np.testing.assert_array_equal(est.tree_threshold_[:len(first)], first)
    for key in ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_value_"):
        np.testing.assert_array_equal(getattr(est, key), getattr(fresh, key), err_msg=key)
    np.testing.assert_allclose(est.feature_importances_, fresh.feature_importances_, rtol=1e-12)
    with pytest.warns(UserWarning, match="Warm-start fitting without increasing n_estimators"):
        est.fit(X, y)
    est.set_params(n_estimators=2)
    with pytest.raises(ValueError, match=r"n_estimators=2 must be larger or equal to len\(estimators_\)=7 when "
                                         r"warm_start==True"):
        est.fit(X, y)


def test_warm_start_from_a_model_file(tmp_path):
    X, y = load_breast_cancer(return_X_y=True)
    est = RandomForestClassifier(n_estimators=3, max_depth=4, random_state=0, warm_start=True).fit(X, y)
    mpiml.save(est, tmp_path / "rf.mpiml")
    back = mpiml.load(tmp_path / "rf.mpiml")
    back.set_params(n_estimators=5).fit(X, y)
    fresh = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(X, y)
    np.testing.assert_array_equal(back.tree_threshold_, fresh.tree_threshold_)
    np.testing.assert_allclose(back.feature_importances_, fresh.feature_importances_, rtol=1e-9)


def test_oob_score_classifier():
    X, y = load_breast_cancer(return_X_y=True)
    ours = RandomForestClassifier(n_estimators=60, max_depth=8, oob_score=True, random_state=0).fit(X, y)
    theirs = SkClassifier(n_estimators=60, max_depth=8, oob_score=True, random_state=0).fit(X, y)
    assert ours.oob_decision_function_.shape == (len(y), 2)
    np.testing.assert_allclose(ours.oob_decision_function_.sum(axis=1), 1.0)
    assert abs(ours.oob_score_ - theirs.oob_score_) < 0.03, (ours.oob_score_, theirs.oob_score_)
    # the same accuracy from the out-of-bag decision function
    assert ours.oob_score_ == pytest.approx(np.mean(ours.classes_[ours.oob_decision_function_.argmax(1)] == y))
    call = RandomForestClassifier(n_estimators=60, max_depth=8, oob_score=balanced_accuracy_score,
                                  random_state=0).fit(X, y)
    assert call.oob_score_ == pytest.approx(balanced_accuracy_score(y, ours.oob_decision_function_.argmax(1)))
    with pytest.raises(ValueError, match="Out of bag estimation only available if bootstrap=True"):
        RandomForestClassifier(n_estimators=2, bootstrap=False, oob_score=True).fit(X, y)
    with pytest.warns(UserWarning, match="Some inputs do not have OOB scores"):
        RandomForestClassifier(n_estimators=2, oob_score=True, random_state=0).fit(X, y)


def test_oob_score_regressor():
    X, y = load_diabetes(return_X_y=True)
    ours = RandomForestRegressor(n_estimators=60, max_depth=8, oob_score=True, random_state=0).fit(X, y)
    theirs = SkRegressor(n_estimators=60, max_depth=8, oob_score=True, random_state=0).fit(X, y)
    assert ours.oob_prediction_.shape == (len(y),)
    assert abs(ours.oob_score_ - theirs.oob_score_) < 0.05, (ours.oob_score_, theirs.oob_score_)


def test_balanced_subsample():
    X, y = load_breast_cancer(return_X_y=True)
    y = y.copy()
    y[np.nonzero(y == 1)[0][:250]] = 0                        # unbalanced: 462 against 107
    params = dict(n_estimators=40, max_depth=6, random_state=0, class_weight="balanced_subsample")
    ours = RandomForestClassifier(**params).fit(X[::2], y[::2])
    theirs = SkClassifier(**params).fit(X[::2], y[::2])
    assert balanced_accuracy_score(y[1::2], ours.predict(X[1::2])) >= \
        balanced_accuracy_score(y[1::2], theirs.predict(X[1::2])) - 0.03
    # without bootstrap it is "balanced"
    a = RandomForestClassifier(n_estimators=2, bootstrap=False, max_depth=5, random_state=0,
                               class_weight="balanced_subsample").fit(X, y)
    b = RandomForestClassifier(n_estimators=2, bootstrap=False, max_depth=5, random_state=0,
                               class_weight="balanced").fit(X, y)
    np.testing.assert_array_equal(a.tree_threshold_, b.tree_threshold_)


def test_friedman_mse_is_squared_error_with_scikit_learns_warning():
    X, y = load_diabetes(return_X_y=True)
    with pytest.warns(FutureWarning, match='"friedman_mse"'):
        a = RandomForestRegressor(n_estimators=3, max_depth=5, random_state=0, criterion="friedman_mse").fit(X, y)
    b = RandomForestRegressor(n_estimators=3, max_depth=5, random_state=0).fit(X, y)
    np.testing.assert_array_equal(a.tree_threshold_, b.tree_threshold_)


@pytest.mark.parametrize("cls,params,match", [
    (RandomForestRegressor, {"criterion": "gini"},
     r"The 'criterion' parameter of RandomForestRegressor must be a str among .* Got 'gini' instead"),
    (RandomForestRegressor, {"criterion": "absolute_error"}, r"Got 'absolute_error' instead"),
    (RandomForestClassifier, {"monotonic_cst": [1, 0]},
     r"The 'monotonic_cst' parameter of RandomForestClassifier must be None .* Got \[1, 0\] instead"),
    (RandomForestClassifier, {"max_leaf_nodes": 1}, r"The 'max_leaf_nodes' parameter .* Got 1 instead"),
    (RandomForestClassifier, {"ccp_alpha": -1.0}, r"The 'ccp_alpha' parameter .* Got -1.0 instead"),
    (RandomForestClassifier, {"min_impurity_decrease": -0.5}, r"The 'min_impurity_decrease' parameter"),
    (RandomForestClassifier, {"oob_score": "yes"}, r"The 'oob_score' parameter"),
    (RandomForestClassifier, {"warm_start": 3}, r"The 'warm_start' parameter"),
    (RandomForestClassifier, {"class_weight": "subsample"}, r"The 'class_weight' parameter"),
])
def test_values_refused_with_scikit_learns_error_shape(cls, params, match):
    X, y = load_breast_cancer(return_X_y=True)
    with pytest.raises(InvalidParameterError, match=match):
        cls(n_estimators=2, **params).fit(X, y)


def test_n_jobs_and_verbose_are_accepted(capsys):
    X, y = load_breast_cancer(return_X_y=True)
    a = RandomForestClassifier(n_estimators=3, max_depth=4, random_state=0, n_jobs=-1, verbose=1).fit(X, y)
    b = RandomForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(X, y)
    np.testing.assert_array_equal(a.tree_threshold_, b.tree_threshold_)
    assert "grew trees" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RandomForestClassifier(n_estimators=2, max_depth=3, n_jobs=4).fit(X, y)
