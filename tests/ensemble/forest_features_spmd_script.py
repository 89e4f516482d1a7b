"""The forests' scikit-learn features at several ranks, run under ``mpiexec -n N`` by test_forest_mpi.py.

Sparse shards, multi-output targets, missing values (NaN), ``criterion="poisson"``, out-of-bag
scores with several outputs and the per-tree ``estimators_``: every case grows, on uneven shards
(rank r holds a share proportional to r + 1), the same trees as one process on all rows — so the
same at every rank count.  Verdicts are collective (tests/_spmd.py).
"""

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import make_classification, make_regression

from mpiml.comm import get_comm
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

from _spmd import check, guarded, uneven_shard

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
TREE_KEYS = ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_children_left_", "tree_children_right_",
             "tree_value_", "tree_n_node_samples_", "tree_impurity_", "tree_missing_left_", "feature_importances_")


def shard(a):
    return uneven_shard(a, rank, size)


def gathered(a):
    return comm.allgatherv(np.ascontiguousarray(a)) if size > 1 else a


def on_root(fit):
    """A reference fitted by rank 0 alone (the others skip the work; verdicts are agreed at the end)."""
    return fit() if rank == 0 else None


def same_trees(a, b, what):
    if b is None:
        return True
    for key in TREE_KEYS:
        x, y = getattr(a, key), getattr(b, key)
        if x.shape != y.shape or not np.array_equal(x, y):
            return check(False, f"{what}: {key} differs from one process ({x.shape} vs {y.shape})")
    return True


def agreed(value):
    return comm.bcast_obj(value) if size > 1 else value


def main():
    Xc, yc = make_classification(n_samples=400, n_features=6, n_informative=4, n_classes=3, random_state=1)
    Xr, yr = make_regression(n_samples=400, n_features=6, n_informative=4, n_targets=2, noise=5.0, random_state=1)

    # sparse shards (CSR, CSC) grow the trees of the dense rows; estimators_ agree with the forest
    Xsp = np.where(np.abs(Xc) < 0.8, 0.0, Xc)
    params = dict(n_estimators=4, max_depth=6, random_state=5)
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xsp, yc))
    for fmt in (sp.csr_matrix, sp.csc_matrix):
        got = RandomForestClassifier(**params).fit(fmt(shard(Xsp)), shard(yc))
        same_trees(got, ref, f"sparse X ({fmt.__name__})")
    mine = shard(Xc)
    mean = np.mean([t.predict_proba(mine) for t in got.estimators_], axis=0) if len(mine) else None
    check(len(got) == 4 and (mean is None or np.allclose(mean, got.predict_proba(sp.csr_matrix(mine)))),
          "the estimators_' mean probabilities differ from predict_proba")
    check(all(np.array_equal(t.apply(mine), got.apply(mine)[:, i]) for i, t in enumerate(got.estimators_)),
          "estimators_[i].apply differs from apply[:, i]")

    # multi-output regression (one channel per output) and classification (joint labels), with OOB
    params = dict(n_estimators=5, max_depth=5, max_features=0.5, random_state=2, oob_score=True)
    ref = on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(Xr, yr))
    got = RandomForestRegressor(**params).fit(shard(Xr), shard(yr))
    same_trees(got, ref, "multi-output regression")
    want = agreed(None if ref is None else (ref.oob_score_, ref.oob_prediction_))
    check(abs(got.oob_score_ - want[0]) < 1e-10, f"multi-output oob_score_ {got.oob_score_} vs {want[0]}")
    check(np.allclose(gathered(got.oob_prediction_), want[1]), "multi-output oob_prediction_ rows differ")
    check(got.predict(shard(Xr)).shape == (shard(Xr).shape[0], 2), "multi-output predict shape")
    Y = np.stack([yc == 2, Xc[:, 0] > 0], axis=1).astype(int)          # two binary outputs
    params = dict(n_estimators=5, max_depth=5, random_state=3, oob_score=True, class_weight="balanced")
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xc, Y))
    got = RandomForestClassifier(**params).fit(shard(Xc), shard(Y))
    same_trees(got, ref, "multi-output classification")
    want = agreed(None if ref is None else ref.oob_score_)
    check(abs(got.oob_score_ - want) < 1e-12, f"multi-output classification oob_score_ {got.oob_score_} vs {want}")
    proba = got.predict_proba(shard(Xc))
    check(len(proba) == 2 and all(p.shape == (shard(Xc).shape[0], 2) for p in proba), "multi-output proba")

    # missing values: NaN on some ranks only; poisson regression
    Xn = Xc.copy()
    Xn[np.random.RandomState(0).rand(*Xn.shape) < 0.1] = np.nan
    Xn[: len(Xn) // 2, 5] = Xc[: len(Xn) // 2, 5]          # feature 5: NaN only in the rows of the last ranks
    params = dict(n_estimators=4, max_depth=6, random_state=4)
    ref = on_root(lambda: RandomForestClassifier(comm=SELF, **params).fit(Xn, yc))
    got = RandomForestClassifier(**params).fit(shard(Xn), shard(yc))
    same_trees(got, ref, "NaN in X")
    check(np.array_equal(gathered(got.predict(shard(Xn))), agreed(None if ref is None else ref.predict(Xn))),
          "predictions with NaN differ from one process")
    yp = np.exp(Xc[:, 0] / 2)
    params = dict(n_estimators=4, max_depth=5, criterion="poisson", random_state=6)
    ref = on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(Xc, yp))
    got = RandomForestRegressor(**params).fit(shard(Xc), shard(yp))
    same_trees(got, ref, "poisson")
    params = dict(n_estimators=3, max_depth=5, criterion="absolute_error", random_state=7)
    for target in (np.round(yp * 4), yp):              # few distinct targets (exact medians), many (target bins)
        ref = on_root(lambda: RandomForestRegressor(comm=SELF, **params).fit(Xc, target))
        got = RandomForestRegressor(**params).fit(shard(Xc), shard(target))
        same_trees(got, ref, f"absolute_error ({len(np.unique(target))} distinct targets)")
    bad = shard(yp).copy()
    if rank == size - 1 and len(bad):
        bad[0] = -1.0
    msg = None
    try:
        RandomForestRegressor(n_estimators=2, criterion="poisson").fit(shard(Xc), bad)
    except ValueError as exc:
        msg = str(exc)
    msgs = comm.allgather_obj(msg) if size > 1 else [msg]
    check(msgs[0] is not None and len(set(msgs)) == 1, f"negative poisson target: {msgs}")


if __name__ == "__main__":
    guarded(main, comm)
