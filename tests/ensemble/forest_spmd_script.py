"""Multi-rank random-forest checks, run under ``mpiexec -n N`` by test_forest_mpi.py.

Every rank builds the same global data, keeps an uneven shard of it (rank r
holds a share proportional to r + 1), and compares the SPMD forest with the
same forest grown by one process on all rows, and with scikit-learn.
Verdicts are collective (tests/_spmd.py).

Usage: forest_spmd_script.py [OUTDIR] (test_forest_mpi.py runs ``main`` through tests/_spmd_cases.py)
"""

import sys

import numpy as np
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import RandomForestClassifier as SkClassifier
from sklearn.ensemble import RandomForestRegressor as SkRegressor

import mpiml
from mpiml import DistributedInputError
from mpiml.comm import get_comm
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

from _spmd import check, guarded

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
TREE_KEYS = ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_children_left_", "tree_children_right_",
             "tree_value_", "tree_n_node_samples_", "tree_impurity_")


def shard(a, weights=None):
    n = a.shape[0]
    w = np.arange(1, size + 1, dtype=np.float64) if weights is None else np.asarray(weights, dtype=np.float64)
    bounds = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * n).astype(int)])
    return a[bounds[rank]:bounds[rank + 1]]


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def on_root(fit):
    """A reference fitted by rank 0 alone (the others skip the work; verdicts are agreed at the end)."""
    return fit() if rank == 0 else None


def same_trees(a, b, what):
    if b is None:
        return True
    for key in TREE_KEYS + ("feature_importances_",):
        x, y = getattr(a, key), getattr(b, key)
        if x.shape != y.shape or not np.array_equal(x, y):
            return check(False, f"{what}: {key} differs from one process ({x.shape} vs {y.shape})")
    return True


def split(X, y, n_train):
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def main(out=None):
    """The checks; ``out``: where the model file, the predictions and the exact trees go (or nowhere)."""
    Xc, yc = make_classification(n_samples=900, n_features=8, n_informative=5, n_classes=3, random_state=0)
    Xr, yr = make_regression(n_samples=900, n_features=8, n_informative=5, noise=10.0, random_state=0)
    Xc_tr, yc_tr, Xc_te, yc_te = split(Xc, yc, 600)
    Xr_tr, yr_tr, Xr_te, yr_te = split(Xr, yr, 600)

    # 1. exact trees: bootstrap=False, all features -> the same trees as one process (and at every rank count)
    for cls, X, y, kw in ((RandomForestClassifier, Xc_tr, yc_tr, {"criterion": "gini"}),
                          (RandomForestClassifier, Xc_tr, yc_tr, {"criterion": "entropy", "class_weight": "balanced"}),
                          (RandomForestRegressor, Xr_tr, yr_tr, {})):
        params = dict(n_estimators=3, bootstrap=False, max_features=None, max_depth=6, random_state=0, **kw)
        ref = on_root(lambda: cls(comm=SELF, **params).fit(X, y))
        got = cls(**params).fit(shard(X), shard(y))
        same_trees(got, ref, f"{cls.__name__} {kw} bootstrap=False")
        if out and rank == 0 and cls is RandomForestClassifier and not kw.get("class_weight"):
            np.savez(f"{out}/exact_{size}.npz", **{k: getattr(got, k) for k in TREE_KEYS})

    # 2. bootstrap (Poisson weights by global row) and max_features: still rank-count independent
    params = dict(n_estimators=8, max_depth=6, max_samples=0.7, random_state=3)
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xc_tr, yc_tr))
    got = RandomForestClassifier(**params).fit(shard(Xc_tr), shard(yc_tr))
    same_trees(got, ref, "classifier with bootstrap and max_features='sqrt'")
    ref = on_root(lambda: RandomForestRegressor(comm=SELF, max_features=0.5, **params).fit(Xr_tr, yr_tr))
    got_r = RandomForestRegressor(max_features=0.5, **params).fit(shard(Xr_tr), shard(yr_tr))
    same_trees(got_r, ref, "regressor with bootstrap and max_features=0.5")
    # pruned forests: the splits' impurity decreases travel with the trees (ranks growing whole trees) for them only
    for kw in ({"max_leaf_nodes": 12}, {"ccp_alpha": 0.002}):
        ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params, **kw).fit(Xc_tr, yc_tr))
        got = RandomForestClassifier(**params, **kw).fit(shard(Xc_tr), shard(yc_tr))
        same_trees(got, ref, f"classifier with {kw}")

    # constant features drawn at a node: further features are drawn (one more allreduce), alike everywhere
    Xk = np.hstack([np.zeros((600, 6)), Xc_tr, np.ones((600, 6))])
    params = dict(n_estimators=4, max_features=1, max_depth=5, random_state=2)
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xk, yc_tr))
    got = RandomForestClassifier(**params).fit(shard(Xk), shard(yc_tr))
    same_trees(got, ref, "constant features")
    check(got.tree_feature_.shape[0] > 4 * 15, f"constant features: only {got.tree_feature_.shape[0]} nodes")

    # 3. accuracy / R^2 within 1 % of scikit-learn (same parameters, mean of two seeds; test rows sharded,
    #    global score)
    from sklearn.metrics import r2_score

    accs, sk_accs, r2s, sk_r2s = [], [], [], []
    for seed in (0, 1):
        params = dict(n_estimators=20, max_depth=8, random_state=seed)
        clf = RandomForestClassifier(**params).fit(shard(Xc_tr), shard(yc_tr))
        accs.append(clf.score(shard(Xc_te), shard(yc_te)))
        sk_accs.append(on_root(lambda: SkClassifier(**params).fit(Xc_tr, yc_tr).score(Xc_te, yc_te)))
        reg = RandomForestRegressor(**params).fit(shard(Xr_tr), shard(yr_tr))
        r2s.append(reg.score(shard(Xr_te), shard(yr_te)))
        sk_r2s.append(on_root(lambda: SkRegressor(**params).fit(Xr_tr, yr_tr).score(Xr_te, yr_te)))
    sk_accs, sk_r2s = comm.bcast_obj((sk_accs, sk_r2s)) if size > 1 else (sk_accs, sk_r2s)
    check(np.mean(accs) >= np.mean(sk_accs) - 0.01, f"accuracy {accs} vs scikit-learn {sk_accs}")
    check(np.mean(r2s) >= np.mean(sk_r2s) - 0.01, f"R2 {r2s} vs scikit-learn {sk_r2s}")
    pred = gathered(clf.predict(shard(Xc_te)))
    check(abs(float((pred == yc_te).mean()) - accs[-1]) < 1e-12, "global score != accuracy of the gathered predictions")
    proba = clf.predict_proba(shard(Xc_te))
    check(np.allclose(proba.sum(axis=1), 1.0), "predict_proba rows do not sum to 1")
    check(abs(r2s[-1] - r2_score(yr_te, gathered(reg.predict(shard(Xr_te))))) < 1e-10, "global R2 != r2_score")
    sk_acc = np.mean(sk_accs)

    # 4. local training (cuML's scheme): every rank holds the same forest of n_estimators trees
    loc = RandomForestClassifier(n_estimators=9, max_depth=8, random_state=0, training="local").fit(
        shard(Xc_tr), shard(yc_tr))
    check(loc.n_estimators_ == 9, f"local forest has {loc.n_estimators_} trees")
    digest = float(np.sum(loc.tree_threshold_ * np.arange(loc.tree_threshold_.shape[0]) % 7919))
    digests = comm.allgather_obj(digest) if size > 1 else [digest]
    check(len(set(digests)) == 1, "local forests differ between ranks")
    loc_acc = loc.score(shard(Xc_te), shard(yc_te))
    check(loc_acc >= sk_acc - 0.15, f"local accuracy {loc_acc:.4f} far below scikit-learn {sk_acc:.4f}")
    if size == 1:
        same_trees(loc, RandomForestClassifier(n_estimators=9, max_depth=8, random_state=0, comm=SELF).fit(
            Xc_tr, yc_tr), "local training on one rank is global training")
    # each local tree is grown from its owner's rows only: the root of tree t holds the rows of rank t % size
    counts = comm.allgather_obj(shard(Xc_tr).shape[0]) if size > 1 else [Xc_tr.shape[0]]
    nob = RandomForestClassifier(n_estimators=2 * size, bootstrap=False, max_depth=2, random_state=0,
                                 training="local").fit(shard(Xc_tr), shard(yc_tr))
    roots = [int(nob.tree_n_node_samples_[int(nob.tree_offsets_[t])]) for t in range(2 * size)]
    check(roots == [counts[t % size] for t in range(2 * size)], f"local roots {roots} vs shard sizes {counts}")
    locr = RandomForestRegressor(n_estimators=5, max_depth=6, random_state=0, training="local").fit(
        shard(Xr_tr), shard(yr_tr))
    check(locr.score(shard(Xr_te), shard(yr_te)) > 0.5, "local regressor R2 <= 0.5")

    # 5. a class present on one rank only; empty and one-row shards: the same trees as one process
    y_one = yc_tr.copy()
    y_one[-5:] = 7                                           # the last rank alone holds class 7
    params = dict(n_estimators=3, bootstrap=False, max_features=None, max_depth=5, random_state=0)
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xc_tr, y_one))
    got = RandomForestClassifier(**params).fit(shard(Xc_tr), shard(y_one))
    check(list(got.classes_) == [0, 1, 2, 7], f"classes_ {got.classes_}")
    same_trees(got, ref, "class on one rank only")
    if size > 1:
        w = [1.0] * size
        w[0] = 0.0                                           # rank 0 holds no rows
        got = RandomForestClassifier(**params).fit(shard(Xc_tr, w), shard(yc_tr, w))
        same_trees(got, on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xc_tr, yc_tr)),
                   "empty shard on rank 0")
        got = RandomForestRegressor(**params, training="local").fit(shard(Xr_tr, w), shard(yr_tr, w))
        check(got.n_estimators_ == 3, "local training with an empty shard")
        check(shard(Xr_te, w).shape[0] == 0 or rank != 0, "rank 0 should hold no rows")
        check(got.predict(shard(Xr_te, w)).shape == (shard(Xr_te, w).shape[0],), "predict on an empty shard")
        want = r2_score(yr_te, got.predict(Xr_te)) if rank == 0 else None
        want = comm.bcast_obj(want)
        check(abs(got.score(shard(Xr_te, w), shard(yr_te, w)) - want) < 1e-10, "score with an empty shard")
        one = Xc_tr[:size]
        y1 = yc_tr[:size]
        got = RandomForestClassifier(**params).fit(one[rank:rank + 1], y1[rank:rank + 1])
        same_trees(got, on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(one, y1)), "one-row shards")

    # 5b. regression: empty shard on rank 0 and one-row shards grow the trees of one process
    if size > 1:
        w = [1.0] * size
        w[0] = 0.0
        params = dict(n_estimators=3, max_features=None, max_depth=5, random_state=0)
        got = RandomForestRegressor(**params).fit(shard(Xr_tr, w), shard(yr_tr, w))
        same_trees(got, on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(Xr_tr, yr_tr)),
                   "regressor, empty shard on rank 0")
        one, y1 = Xr_tr[:size], yr_tr[:size]
        got = RandomForestRegressor(**params).fit(one[rank:rank + 1], y1[rank:rank + 1])
        same_trees(got, on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(one, y1)),
                   "regressor, one-row shards")

    # 5c. out-of-bag scores, warm starts and balanced_subsample do not depend on the rank count (global)
    params = dict(n_estimators=30, max_depth=6, random_state=4, oob_score=True, class_weight="balanced_subsample")
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xc_tr, yc_tr))
    got = RandomForestClassifier(**params).fit(shard(Xc_tr), shard(yc_tr))
    same_trees(got, ref, "balanced_subsample with oob_score")
    ref_oob = comm.bcast_obj(None if ref is None else (ref.oob_score_, ref.oob_decision_function_)) if size > 1 \
        else (ref.oob_score_, ref.oob_decision_function_)
    check(abs(got.oob_score_ - ref_oob[0]) < 1e-12, f"oob_score_ {got.oob_score_} vs one process {ref_oob[0]}")
    check(np.array_equal(gathered(got.oob_decision_function_), ref_oob[1]), "oob_decision_function_ rows differ")
    # 5d. sample weights drive the bootstrap draws (exactly max_samples per tree over every rank, in
    # proportion to the weights): the same trees, out-of-bag results and estimators_samples_ at every rank count
    w_tr = np.random.RandomState(5).rand(len(yr_tr)) * 2
    w_tr[::9] = 0.0
    params = dict(n_estimators=6, max_depth=5, max_samples=0.6, max_features=0.5, random_state=6, oob_score=True)
    ref = on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(Xr_tr, yr_tr, sample_weight=w_tr))
    got = RandomForestRegressor(**params).fit(shard(Xr_tr), shard(yr_tr), sample_weight=shard(w_tr))
    same_trees(got, ref, "regressor with sample weights and bootstrap")
    ref_s = comm.bcast_obj(None if ref is None else (ref.oob_score_, ref.oob_prediction_,
                                                     [s.tolist() for s in ref.estimators_samples_])) \
        if size > 1 else (ref.oob_score_, ref.oob_prediction_, [s.tolist() for s in ref.estimators_samples_])
    check(abs(got.oob_score_ - ref_s[0]) < 1e-12, f"weighted oob_score_ {got.oob_score_} vs {ref_s[0]}")
    check(np.array_equal(gathered(got.oob_prediction_), ref_s[1]), "weighted oob_prediction_ rows differ")
    start = sum((comm.allgather_obj(len(shard(yr_tr))) if size > 1 else [0])[:rank])
    for t, s in enumerate(got.estimators_samples_):
        every = gathered(s.astype(np.int64) + start)
        check(sorted(every.tolist()) == sorted(ref_s[2][t]), f"estimators_samples_[{t}] differs from one process")
        check(len(every) == got._n_samples_bootstrap, f"tree {t} drew {len(every)} rows")
    check(got._n_samples_bootstrap == int(0.6 * w_tr.sum()), f"draws {got._n_samples_bootstrap}")

    warm = RandomForestRegressor(n_estimators=3, max_depth=5, random_state=2, warm_start=True).fit(
        shard(Xr_tr), shard(yr_tr))
    warm.set_params(n_estimators=6).fit(shard(Xr_tr), shard(yr_tr))
    same_trees(warm, on_root(lambda: RandomForestRegressor(n_estimators=6, max_depth=5, random_state=2,
                                                           comm=SELF).fit(Xr_tr, yr_tr)), "warm start")

    # 6. bad input: the same error on every rank, no hang
    cases = []
    bad = shard(yr_tr).copy()
    if rank == size - 1 and len(bad):
        bad[0] = np.nan
    cases.append(("NaN in y on the last rank", RandomForestRegressor(n_estimators=2), shard(Xr_tr), bad))
    ybad = shard(yc_tr).astype(float)
    if rank == 0 and len(ybad):
        ybad[-1] = np.nan
    cases.append(("NaN label on rank 0", RandomForestClassifier(n_estimators=2), shard(Xc_tr), ybad))
    ys = shard(yc_tr).astype(object)
    if rank == size - 1:
        ys = np.array([f"c{v}" for v in ys], dtype=object)
    if size > 1:
        cases.append(("string labels on one rank", RandomForestClassifier(n_estimators=2), shard(Xc_tr), ys))
        cases.append(("strings as regression targets on one rank", RandomForestRegressor(n_estimators=2),
                      shard(Xr_tr), ys))
    Xs = shard(Xc_tr).astype(object)
    if rank == size - 1 and len(Xs):
        Xs[0, 1] = "seven"                                   # a string where a number is needed, one rank
    cases.append(("a string in X on the last rank", RandomForestClassifier(n_estimators=2), Xs, shard(yc_tr)))
    yo = shard(yr_tr).astype(object)
    if rank == size - 1 and len(yo):
        yo[0] = "high"
    cases.append(("a string among numeric targets on the last rank", RandomForestRegressor(n_estimators=2),
                  shard(Xr_tr), yo))
    Xn = shard(Xc_tr).copy()
    if rank == 0:
        Xn[0, 0] = np.inf                                    # NaN is a missing value; infinity is refused
    cases.append(("infinity in X on rank 0", RandomForestClassifier(n_estimators=2), Xn, shard(yc_tr)))
    cases.append(("continuous labels", RandomForestClassifier(n_estimators=2), shard(Xr_tr), shard(yr_tr)))
    for what, est, X, y in cases:
        msg = None
        try:
            est.fit(X, y)
        except ValueError as exc:
            msg = f"{type(exc).__name__}: {exc}"
        msgs = comm.allgather_obj(msg) if size > 1 else [msg]
        check(msgs[0] is not None, f"{what}: no error")
        check(len(set(msgs)) == 1, f"{what}: different errors on different ranks: {msgs}")
        if size > 1 and msgs[0] is not None and what != "continuous labels":
            check(msgs[0].startswith("DistributedInputError"), f"{what}: {msgs[0]}")

    # 7. model file written by N ranks; read back here and by the test process
    if out:
        mpiml.save(clf, f"{out}/forest.mpiml")
        back = mpiml.load(f"{out}/forest.mpiml")
        check(np.array_equal(back.predict_proba(shard(Xc_te)), proba), "loaded forest predicts differently")
        if rank == 0:
            np.save(f"{out}/X.npy", Xc_te)
        np_proba = gathered(proba)
        if rank == 0:
            np.save(f"{out}/proba.npy", np_proba)
        comm.barrier()


if __name__ == "__main__":
    guarded(lambda: main(sys.argv[1] if len(sys.argv) > 1 else None), comm)
