"""Single-process random forests: scikit-learn's estimator checks (of the forests and of the trees in
their ``estimators_``), accuracy on shipped data sets, model files, parameters and the flat tree arrays.

Checks of scikit-learn's ``parametrize_with_checks`` that are expected to fail (for the forests; the
trees pass every check), and why:

- ``check_sample_weight_equivalence_on_dense_data``: with ``max_samples=None``
  the bootstrap draws ``n_samples`` rows, so integer sample weights and the
  same rows repeated draw different numbers of rows (scikit-learn marks the
  same check for its own forests); ``..._on_sparse_data`` likewise.
"""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits
from sklearn.ensemble import RandomForestClassifier as SkClassifier
from sklearn.ensemble import RandomForestRegressor as SkRegressor
from sklearn.model_selection import RepeatedKFold
from sklearn.utils.estimator_checks import parametrize_with_checks

import mpiml
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor
from mpiml.ensemble._tree import ForestTreeClassifier, ForestTreeRegressor
from mpiml.utils import InvalidParameterError

_EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data":
        "bootstrap of n_samples draws: integer weights and repeated rows draw different numbers of rows",
    "check_sample_weight_equivalence_on_sparse_data":
        "bootstrap of n_samples draws: integer weights and repeated rows draw different numbers of rows",
}


@parametrize_with_checks([RandomForestClassifier(n_estimators=5, max_depth=6, random_state=0),
                          RandomForestRegressor(n_estimators=5, max_depth=6, random_state=0),
                          ForestTreeClassifier(max_depth=6, random_state=0),
                          ForestTreeRegressor(max_depth=6, random_state=0)],
                         expected_failed_checks=lambda est: {} if est.__class__.__name__.startswith("ForestTree")
                         else _EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


@pytest.mark.parametrize("load,cls,sk_cls", [(load_digits, RandomForestClassifier, SkClassifier),
                                              (load_breast_cancer, RandomForestClassifier, SkClassifier),
                                              (load_diabetes, RandomForestRegressor, SkRegressor)])
def test_shipped_data_sets_within_one_percent(load, cls, sk_cls):
    """Accuracy / R^2 over 4 x 5 folds within 0.01 of scikit-learn's forest with the same parameters (one
    5-fold pass of a few hundred rows moves by more than 0.01 with the random streams alone)."""
    X, y = load(return_X_y=True)
    ours, theirs = [], []
    for i, (tr, te) in enumerate(RepeatedKFold(n_splits=5, n_repeats=4, random_state=0).split(X)):
        params = dict(n_estimators=30, max_depth=8, random_state=i)
        ours.append(cls(**params).fit(X[tr], y[tr]).score(X[te], y[te]))
        theirs.append(sk_cls(**params).fit(X[tr], y[tr]).score(X[te], y[te]))
    assert np.mean(ours) >= np.mean(theirs) - 0.01, (np.mean(ours), np.mean(theirs))


@pytest.mark.parametrize("cls", [RandomForestClassifier, RandomForestRegressor])
def test_model_file_round_trip(tmp_path, cls):
    X, y = load_breast_cancer(return_X_y=True)
    model = cls(n_estimators=4, max_depth=5, random_state=1).fit(X, y)
    mpiml.save(model, tmp_path / "rf.mpiml")
    back = mpiml.load(tmp_path / "rf.mpiml")
    assert type(back) is cls and back.get_params() == model.get_params()
    np.testing.assert_array_equal(back.predict(X), model.predict(X))
    np.testing.assert_array_equal(back.apply(X), model.apply(X))
    np.testing.assert_array_equal(back.feature_importances_, model.feature_importances_)
    if cls is RandomForestClassifier:
        np.testing.assert_array_equal(back.classes_, model.classes_)
        np.testing.assert_array_equal(back.predict_proba(X), model.predict_proba(X))


def test_string_labels_and_flat_trees():
    X, y = load_breast_cancer(return_X_y=True)
    labels = np.array(["benign", "malignant"])[y]
    rf = RandomForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(X, labels)
    assert list(rf.classes_) == ["benign", "malignant"] and rf.n_classes_ == 2
    assert set(rf.predict(X)) <= {"benign", "malignant"}
    leaves = rf.apply(X)
    assert leaves.shape == (X.shape[0], 3)
    proba = np.zeros((X.shape[0], 2))
    for t in range(3):
        tree = rf.get_tree(t)
        assert (tree["feature"][leaves[:, t]] == -2).all()
        node = np.zeros(X.shape[0], dtype=np.int64)          # walk the tree by hand
        for _ in range(5):
            f = tree["feature"][node]
            inner = f >= 0
            go_left = X[np.arange(len(X)), np.where(inner, f, 0)] <= tree["threshold"][node]
            node = np.where(inner, np.where(go_left, tree["children_left"][node], tree["children_right"][node]), node)
        np.testing.assert_array_equal(node, leaves[:, t])
        proba += tree["value"][node]
    np.testing.assert_allclose(proba / 3, rf.predict_proba(X))
    imp = rf.feature_importances_
    assert imp.shape == (X.shape[1],) and abs(imp.sum() - 1) < 1e-12 and (imp >= 0).all()


def test_trees_of_estimators_check_their_input_as_scikit_learns_trees():
    """The trees of ``estimators_`` (not just fresh ones, which the checks above cover) check the feature
    count against the forest's; ``check_input=False`` skips the checks, not the result; a rank of a forest
    fitted over several ranks may hold no rows (``_fit_ranks``), a lone process's tree may not."""
    X, y = load_breast_cancer(return_X_y=True)
    rf = RandomForestClassifier(n_estimators=2, max_depth=3, random_state=0).fit(X, y)
    tree = rf.estimators_[1]
    with pytest.raises(ValueError, match="X has 5 features, but ForestTreeClassifier is expecting 30 features"):
        tree.predict(X[:, :5])
    np.testing.assert_array_equal(tree.predict_proba(X, check_input=False), tree.predict_proba(X))
    assert tree.apply(X).shape == (len(X),) and tree.decision_path(X).shape[0] == len(X)
    with pytest.raises(ValueError, match="0 sample"):
        tree.predict(X[:0])
    tree._fit_ranks = 2
    assert tree.predict(X[:0]).shape == (0,) and tree.predict_proba(X[:0]).shape == (0, 2)
    with pytest.raises(mpiml.NotFittedError):
        ForestTreeRegressor().get_depth()


@pytest.mark.parametrize("kind,extra", [("gini", {}), ("entropy", {"class_weight": {0: 1.0, 1: 2.5}}),
                                        ("squared_error", {}), ("gini", {"min_samples_leaf": 7}),
                                        ("squared_error", {"min_samples_leaf": 5, "min_samples_split": 30})])
def test_exact_splits_match_scikit_learn(kind, extra):
    """Few distinct values, no bootstrap, all features: the tree is scikit-learn's (values, thresholds)."""
    rs = np.random.RandomState(0)
    X = rs.randint(0, 20, size=(300, 4)).astype(float) + rs.randint(0, 7, size=4) * 0.25
    noise = rs.rand(300)
    params = dict(n_estimators=1, bootstrap=False, max_features=None, max_depth=3, random_state=0, criterion=kind,
                  **extra)
    if kind == "squared_error":
        y = X[:, 0] + 2 * X[:, 1] + 3 * noise - 30.0             # targets of both signs
        ours, theirs = RandomForestRegressor(**params).fit(X, y), SkRegressor(**params).fit(X, y)
        np.testing.assert_allclose(ours.predict(X), theirs.predict(X), rtol=1e-12)
    else:
        y = (X[:, 0] + 2 * X[:, 1] > 25).astype(int) ^ (noise < 0.1)
        ours, theirs = RandomForestClassifier(**params).fit(X, y), SkClassifier(**params).fit(X, y)
        np.testing.assert_allclose(ours.predict_proba(X), theirs.predict_proba(X), rtol=1e-12)
    tree = theirs.estimators_[0].tree_
    inner = tree.feature >= 0
    assert sorted(ours.tree_threshold_[ours.tree_feature_ >= 0]) == pytest.approx(sorted(tree.threshold[inner]))
    np.testing.assert_allclose(ours.feature_importances_, theirs.feature_importances_, rtol=1e-9, atol=1e-12)


def test_constant_features_are_skipped_like_scikit_learn():
    """When every drawn feature is constant in a node, further features are drawn (scikit-learn's rule)."""
    from sklearn.datasets import make_classification

    X, y = make_classification(1200, 4, n_informative=3, n_redundant=0, random_state=0)
    X = np.hstack([np.zeros((1200, 8)), X, np.ones((1200, 8))])
    params = dict(n_estimators=20, max_features=1, max_depth=8, random_state=0)
    ours = RandomForestClassifier(**params).fit(X[:800], y[:800])
    theirs = SkClassifier(**params).fit(X[:800], y[:800])
    assert ours.score(X[800:], y[800:]) >= theirs.score(X[800:], y[800:]) - 0.02
    assert ours.tree_feature_.shape[0] > 0.8 * sum(e.tree_.node_count for e in theirs.estimators_)
    assert set(np.unique(ours.tree_feature_)) <= {-2, 8, 9, 10, 11}


def test_small_regression_with_targets_of_both_signs():
    """Few rows: one bin per value; bins are found non-empty from the weights, whatever the sign of y."""
    from sklearn.datasets import make_regression

    X, y = make_regression(n_samples=400, n_features=8, n_informative=5, noise=10.0, random_state=0)
    params = dict(n_estimators=10, max_depth=6, random_state=0)
    ours = RandomForestRegressor(**params).fit(X[:60], y[:60]).score(X[200:], y[200:])
    theirs = SkRegressor(**params).fit(X[:60], y[:60]).score(X[200:], y[200:])
    assert ours >= theirs - 0.1, (ours, theirs)


def test_float32_and_sample_weight():
    X, y = load_diabetes(return_X_y=True)
    X32 = X.astype(np.float32)
    rf = RandomForestRegressor(n_estimators=3, max_depth=4, random_state=0).fit(X32, y)
    assert rf.predict(X32).dtype == np.float64
    w = np.ones(len(y))
    # unit weights weigh as no weights (with bootstrap, scikit-learn draws them otherwise: choice, not randint)
    a = RandomForestRegressor(n_estimators=3, max_depth=4, random_state=0, bootstrap=False).fit(X, y, sample_weight=w)
    b = RandomForestRegressor(n_estimators=3, max_depth=4, random_state=0, bootstrap=False).fit(X, y)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))
    w[y > np.median(y)] = 0.0                                # zero weight: those rows are left out
    X = np.round(X * 100)                                    # few distinct values: one bin each, either way
    params = dict(n_estimators=2, max_depth=4, bootstrap=False, random_state=0)
    c = RandomForestRegressor(**params).fit(X, y, sample_weight=w)
    d = RandomForestRegressor(**params).fit(X[w > 0], y[w > 0])
    assert c.predict(X).max() <= np.median(y)
    assert c.tree_n_node_samples_[0] == (w > 0).sum()
    np.testing.assert_array_equal(c.predict(X), d.predict(X))


@pytest.mark.parametrize("params,match", [
    ({"n_estimators": 0}, "The 'n_estimators' parameter of RandomForestClassifier must be an int in the range"),
    ({"max_bins": 300}, "The 'max_bins' parameter"),
    ({"training": "ring"}, "The 'training' parameter"),
    ({"max_features": "auto"}, "The 'max_features' parameter"),
    ({"criterion": "squared_error"}, "The 'criterion' parameter"),
])
def test_invalid_parameters(params, match):
    with pytest.raises(InvalidParameterError, match=match):
        RandomForestClassifier(**params).fit([[0.0], [1.0]], [0, 1])


def test_bootstrap_options():
    X, y = load_breast_cancer(return_X_y=True)
    many = RandomForestClassifier(n_estimators=2, max_samples=50 * len(X), max_depth=2, random_state=0).fit(X, y)
    assert [len(s) for s in many.estimators_samples_] == [50 * len(X)] * 2
    assert many.tree_weighted_n_node_samples_[0] == 50 * len(X)      # a tree weighs its rows by their draws
    more = RandomForestClassifier(n_estimators=2, max_samples=2 * len(X), max_depth=2, random_state=0).fit(X, y)
    assert more._n_samples_bootstrap == 2 * len(X) and more.score(X, y) > 0.8
    with pytest.raises(ValueError, match="bootstrap=False"):
        RandomForestClassifier(n_estimators=2, bootstrap=False, max_samples=0.5).fit(X, y)
    small = RandomForestClassifier(n_estimators=2, max_samples=0.2, max_depth=1, random_state=0).fit(X, y)
    # exactly int(0.2 n) draws: the root holds the distinct rows drawn (about 18 % of the data)
    assert small._n_samples_bootstrap == int(0.2 * len(y))
    assert small.tree_weighted_n_node_samples_[0] == int(0.2 * len(y))
    assert 0.12 * len(y) < small.tree_n_node_samples_[0] < 0.2 * len(y)


def test_bootstrap_draws_exactly_max_samples_in_proportion_to_the_weights():
    """scikit-learn's bootstrap: ``max_samples`` draws with replacement, probabilities proportional to the
    sample weights (times the class weights); the trees weigh their rows by the draw counts."""
    rng = np.random.RandomState(0)
    X = rng.rand(3000, 3)
    y = (X[:, 0] > 0.5).astype(int)
    w = rng.rand(3000) * 3
    w[:300] = 0                                                  # never drawn
    rf = RandomForestClassifier(n_estimators=40, max_samples=0.5, max_depth=2, random_state=0).fit(X, y, w)
    assert rf._n_samples_bootstrap == int(0.5 * w.sum())        # a fraction of the weight sum (scikit-learn)
    counts = np.zeros(len(X))
    for s in rf.estimators_samples_:
        assert len(s) == rf._n_samples_bootstrap and s.dtype == np.int32
        counts += np.bincount(s, minlength=len(X))
    assert counts[:300].sum() == 0
    expected = 40 * rf._n_samples_bootstrap * w / w.sum()
    assert abs(np.corrcoef(counts[300:], expected[300:])[0, 1]) > 0.8
    # the drawn rows are what the trees were grown on: the root's weight is the number of draws
    roots = rf.tree_weighted_n_node_samples_[np.asarray(rf.tree_offsets_)[:-1]]
    assert np.all(roots == rf._n_samples_bootstrap)
    np.testing.assert_allclose(rf._sample_weight, w)
    # out of bag: the rows a tree did not draw
    oob = RandomForestClassifier(n_estimators=5, max_samples=0.5, random_state=0, oob_score=True).fit(X, y)
    assert 0.9 < oob.oob_score_ <= 1.0


@pytest.mark.parametrize("weighted", [False, True])
def test_block_bootstrap_is_exact_and_cut_independent(weighted, monkeypatch):
    """The bootstrap of large data sets: exactly n_draws draws a tree, never a zero-weight row, the same counts
    whatever cut of the rows a rank holds (the state of the cut before it), the host kernel equal to the
    array path (what CuPy runs), and the draws in proportion to the weights."""
    from mpiml.ensemble import _bootstrap
    from mpiml.ensemble._bootstrap import Bootstrap

    N, m = 70_000, 50_000
    assert N > _bootstrap.SKLEARN_ROWS
    rng = np.random.RandomState(0)
    w = rng.rand(N) * 2 if weighted else None
    if weighted:
        w[::13] = 0.0
    whole = Bootstrap(np, m, N, 0, N, weights=w)
    assert not whole.exact
    keys = [3, 2 ** 31 - 5, 77]
    c = whole.counts(keys)
    assert np.all(c.sum(axis=1) == m)
    if weighted:
        assert c[:, ::13].sum() == 0
    # cuts: each part alone, given the state of the whole and the weight before it (as after the allreduce)
    cuts = [0, 1, 4095, 4096, 33_333, 69_999, N]
    st = whole.state
    q = np.cumsum(np.rint(w * st["scale"])) if weighted else None
    for kernel in ("1", "0"):                   # the host kernel, then the array path (what CuPy runs)
        monkeypatch.setenv("MPIML_RF_CPU_KERNEL", kernel)
        parts = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            before = (float(q[lo - 1]) if lo else 0.0) if weighted else float(lo)
            part = Bootstrap(np, m, N, lo, hi - lo, weights=None if w is None else w[lo:hi],
                             state={**st, "before": before})
            parts.append(part.counts(keys))
        np.testing.assert_array_equal(np.concatenate(parts, axis=1), c)
        np.testing.assert_array_equal(whole.counts(keys, 1234, 5000), c[:, 1234:6234])
        np.testing.assert_array_equal(Bootstrap(np, m, N, 0, N, weights=w).counts(keys), c)
    monkeypatch.delenv("MPIML_RF_CPU_KERNEL")
    many = sum(whole.counts([k])[0] for k in range(40))
    expected = 40 * m * (np.ones(N) / N if w is None else w / w.sum())
    assert np.abs(many - expected).sum() / (40 * m) < 0.5       # far below the L1 distance of unrelated draws
    assert abs(many[:N // 2].sum() / (40 * m) - expected[:N // 2].sum() / (40 * m)) < 0.01


def test_small_data_draws_are_scikit_learns():
    """Up to SKLEARN_ROWS rows the bootstrap is scikit-learn's own draw from each tree's random_state."""
    from sklearn.ensemble._forest import _generate_sample_indices

    X, y = load_breast_cancer(return_X_y=True)
    w = np.random.RandomState(2).rand(len(y))
    for sw in (None, w):
        rf = RandomForestClassifier(n_estimators=3, max_samples=0.6, max_depth=3, random_state=5).fit(X, y, sw)
        for rows, tree in zip(rf.estimators_samples_, rf.estimators_):
            theirs = _generate_sample_indices(tree.random_state, len(y), rf._n_samples_bootstrap, sw)
            np.testing.assert_array_equal(np.sort(rows), np.sort(theirs))


def test_refitting_a_tree_on_its_sample_gives_the_tree_again():
    """A tree of ``estimators_`` refitted on ``estimators_samples_`` (scikit-learn's contract): its feature
    orders come from its ``random_state``, its rows from the bootstrap.  Fewer distinct values per feature
    than ``max_bins``: the bins are the values, whatever rows they are computed from; regression targets of a
    few values, so that the sample's largest |y| (it sets the fixed-point scale and the purity tolerance) is
    the forest's."""
    from sklearn.base import clone

    rng = np.random.RandomState(1)
    X = rng.randn(250, 8)
    y = np.clip(np.round(X[:, 0] + X[:, 1] ** 2), -2, 2)
    for cls, target in ((RandomForestRegressor, y), (RandomForestClassifier, (y > 0.5).astype(int))):
        rf = cls(n_estimators=4, max_samples=0.6, max_features=0.5, random_state=3).fit(X, target)
        for t in (0, 3):
            rows = rf.estimators_samples_[t]
            tree = clone(rf.estimators_[t]).fit(X[rows], target[rows])
            np.testing.assert_allclose(tree.tree_.value, rf.estimators_[t].tree_.value)
            np.testing.assert_array_equal(tree.tree_.feature, rf.estimators_[t].tree_.feature)
        # the trees' random_state are scikit-learn's for the same random_state
        from sklearn.ensemble import RandomForestRegressor as SkForest

        sk = SkForest(n_estimators=4, random_state=3).fit(X[:20], y[:20])
        assert [e.random_state for e in rf.estimators_] == [e.random_state for e in sk.estimators_]


def test_missing_values_go_to_the_learned_side(tmp_path):
    rng = np.random.RandomState(0)
    x = rng.rand(400)
    y = (x > 0.5).astype(int)
    X = np.stack([x, rng.rand(400)], axis=1)
    miss = rng.rand(400) < 0.2
    y[miss] = 0                                   # the missing values behave like the low ones: left
    X[miss, 0] = np.nan
    rf = RandomForestClassifier(n_estimators=1, bootstrap=False, max_features=None, max_depth=1,
                                random_state=0).fit(X, y)
    assert rf.tree_feature_[0] == 0 and rf.tree_missing_left_[0] == 1
    assert rf.estimators_[0].tree_.missing_go_to_left[0] == 1
    np.testing.assert_array_equal(rf.predict(X), y)
    np.testing.assert_array_equal(rf.estimators_[0].predict(X), y)
    path = str(tmp_path / "rf.mpiml")
    mpiml.save(rf, path)
    np.testing.assert_array_equal(mpiml.load(path).predict(X), y)
    # mirrored: the missing values behave like the high ones and go right
    X2 = X.copy()
    X2[:, 0] = 1 - X2[:, 0]
    rf = RandomForestClassifier(n_estimators=1, bootstrap=False, max_features=None, max_depth=1,
                                random_state=0).fit(X2, y)
    assert rf.tree_missing_left_[0] == 0
    np.testing.assert_array_equal(rf.predict(X2), y)


@pytest.mark.parametrize("cls", [RandomForestClassifier, RandomForestRegressor])
def test_fit_leaves_the_callers_arrays_alone(cls):
    """The bin edges sort columns: a one-feature X (and the targets' bins) must be copies, not the caller's."""
    rng = np.random.RandomState(0)
    X = rng.rand(50, 1)
    y = (X[:, 0] > 0.5).astype(float) if cls is RandomForestClassifier else rng.rand(50)
    X0, y0 = X.copy(), y.copy()
    kw = {} if cls is RandomForestClassifier else {"criterion": "absolute_error"}
    cls(n_estimators=2, random_state=0, **kw).fit(X, y)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(y, y0)
