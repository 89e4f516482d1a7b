"""Levels grown with reduce-scattered histograms, run under ``mpiexec -n N`` by test_forest_mpi.py.

Each rank searches its share of the level's (node, feature) pairs (or, with histograms of every
feature, its share of the features, sibling subtraction included) and the candidates are
gathered: the trees must be those of one process at every rank count.  Classification with integer
weights sends int32 sums, regression its weights as int32 and ``w * y`` as float64, fractional weights
float64.  Run on host ranks with
``MPIML_RF_SCATTER=1`` (the GPUs' default) and ``MPIML_RF_TREE_PARALLEL_BYTES=0`` (level-wise growth);
small node chunks and batches exercise the padding of the blocks.  Verdicts are collective.
"""

import numpy as np
from sklearn.datasets import make_classification, make_regression

from mpiml.comm import get_comm
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

from _spmd import check, guarded, uneven_shard

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
TREE_KEYS = ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_children_left_", "tree_children_right_",
             "tree_value_", "tree_n_node_samples_", "tree_weighted_n_node_samples_", "tree_impurity_",
             "feature_importances_")


def main():
    Xc, yc = make_classification(n_samples=1500, n_features=7, n_informative=5, n_classes=3, random_state=2)
    Xb, yb = make_classification(n_samples=1500, n_features=9, n_informative=5, n_classes=2, random_state=3)
    Xr, yr = make_regression(n_samples=1500, n_features=7, n_informative=5, noise=5.0, random_state=2)
    Xk = Xc.copy()
    Xk[:, 1] = 1.0                                  # constant features: nodes draw further (one more allreduce)
    Xk[:, 4] = np.round(Xk[:, 4])
    cases = [
        ("sqrt classifier", RandomForestClassifier, Xc, yc, dict(max_features="sqrt")),
        ("binary, 3 features", RandomForestClassifier, Xb, yb, dict(max_features=3, min_samples_leaf=3)),
        ("every feature (subtraction)", RandomForestClassifier, Xc, yc, dict(max_features=None, bootstrap=False)),
        ("regressor (subtraction)", RandomForestRegressor, Xr, yr, dict(max_features=1.0)),
        ("regressor, 2 features", RandomForestRegressor, Xr, yr, dict(max_features=2, min_weight_fraction_leaf=0.01)),
        ("constant features", RandomForestClassifier, Xk, yc, dict(max_features=2)),
        ("0.6 of the features", RandomForestRegressor, Xr, yr, dict(max_features=0.6, min_samples_leaf=2)),
        ("fractional weights", RandomForestClassifier, Xc, yc, dict(class_weight="balanced", bootstrap=False,
                                                                    max_features=3)),
    ]
    for what, cls, X, y, kw in cases:
        params = dict(n_estimators=3, max_depth=7, random_state=4, **kw)
        ref = cls(comm=SELF, **params).fit(X, y) if rank == 0 else None
        got = cls(**params).fit(uneven_shard(X, rank, size), uneven_shard(y, rank, size))
        st = got._fit_stats
        if size > 1:
            check(st.get("reduce_scatter_calls", 0) > 0 and st.get("allgather_calls", 0) > 0,
                  f"{what}: no reduce-scatter / allgather ({st.get('reduce_scatter_calls')})")
        if size > 1 and cls is RandomForestClassifier and "fractional" not in what:   # integer weights: int32
            check(st.get("reduce_scatter_int32_calls", 0) == st.get("reduce_scatter_calls"),
                  f"{what}: float64 histograms where int32 hold them")
        if size > 1 and cls is RandomForestRegressor:        # the weight channel int32, w * y float64
            check(2 * st.get("reduce_scatter_int32_calls", 0) == st.get("reduce_scatter_calls"),
                  f"{what}: not one int32 and one float64 reduce-scatter a chunk")
        if size > 1 and "fractional" in what:
            check(st.get("reduce_scatter_int32_calls", 0) == 0, f"{what}: int32 histograms of fractional weights")
        if "subtraction" in what:
            check(st.get("hist_nodes_derived", 0) > 0, f"{what}: no node derived by subtraction")
        if ref is not None:
            for key in TREE_KEYS:
                a, b = getattr(ref, key), getattr(got, key)
                check(a.shape == b.shape and np.array_equal(a, b), f"{what}: {key} differs at {size} ranks")


if __name__ == "__main__":
    guarded(main, comm)
