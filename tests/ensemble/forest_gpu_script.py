"""Multi-rank random forests on CuPy shards (one GPU per rank), run by test_gpu_forest.py.

Global training on the GPUs must grow the trees of one process on the host
(fixed-point histograms: the sums are exact everywhere), local training must
give every rank the same forest, and outputs must stay on the device.
"""

import os

import cupy as cp
import numpy as np
from sklearn.datasets import make_classification, make_regression

import mpiml
from mpiml.comm import get_comm
from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

from _spmd import check, guarded

comm = get_comm()
SELF = get_comm("self")
rank, size = comm.rank, comm.size
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()


def shard(a):
    w = np.arange(1, size + 1, dtype=np.float64)
    b = np.concatenate([[0], np.round(np.cumsum(w) / w.sum() * a.shape[0]).astype(int)])
    return a[b[rank]:b[rank + 1]]


def main():
    Xc, yc = make_classification(n_samples=20000, n_features=16, n_informative=8, n_classes=3, random_state=0)
    Xr, yr = make_regression(n_samples=20000, n_features=16, n_informative=8, noise=5.0, random_state=0)
    for cls, X, y in ((RandomForestClassifier, Xc, yc), (RandomForestRegressor, Xr, yr)):
        params = dict(n_estimators=10, max_depth=10, random_state=0)
        ref = cls(comm=SELF, **params).fit(X, y)
        got = cls(**params).fit(cp.asarray(shard(X)), cp.asarray(shard(y)))
        check(isinstance(got.tree_threshold_, cp.ndarray), "fitted arrays follow X onto the device")
        pred = got.predict(cp.asarray(shard(X)))
        check(isinstance(pred, cp.ndarray), "predict returns CuPy for CuPy rows")
        want = ref.predict(shard(X))
        agree = float(np.mean(np.isclose(cp.asnumpy(pred).astype(float), want.astype(float), rtol=1e-9)))
        check(agree >= 0.999, f"{cls.__name__}: GPU global fit agrees with one host process on {agree:.5f}")
        score = got.score(cp.asarray(shard(X)), cp.asarray(shard(y)))
        check(abs(score - ref.score(X, y)) < 2e-3, f"{cls.__name__}: global score {score} vs {ref.score(X, y)}")
        loc = cls(training="local", **params).fit(cp.asarray(shard(X)), cp.asarray(shard(y)))
        digest = float(cp.asnumpy(loc.tree_threshold_).sum())
        check(len(set(comm.allgather_obj(digest) if size > 1 else [digest])) == 1, "local forests differ")
    # exact trees on the GPU: N ranks grow the forest of one GPU process bit for bit (subtraction included)
    for cls, X, y, kw in ((RandomForestClassifier, Xc, yc, dict(max_features=None, bootstrap=False)),
                          (RandomForestClassifier, Xc, yc, dict(max_features="sqrt", min_samples_leaf=3)),
                          (RandomForestRegressor, Xr, yr, dict(max_features=None)),
                          (RandomForestRegressor, Xr, yr, dict(max_features=1.0, min_weight_fraction_leaf=0.001)),
                          (RandomForestClassifier, Xc, yc, dict(max_features=3))):
        params = dict(n_estimators=4, max_depth=9, random_state=1, **kw)
        one = cls(comm=SELF, **params).fit(cp.asarray(X), cp.asarray(y))
        many = cls(**params).fit(cp.asarray(shard(X)), cp.asarray(shard(y)))
        if size > 1:        # MPIML_RF_SCATTER=1: the levels' histograms reduce-scattered (else one allreduce)
            scattered = many._fit_stats.get("reduce_scatter_calls", 0) > 0
            check(scattered == (os.environ.get("MPIML_RF_SCATTER") == "1"),
                  f"{cls.__name__} {kw}: reduce-scatter {scattered} under MPIML_RF_SCATTER")
        for key in ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_value_", "tree_n_node_samples_",
                    "feature_importances_"):
            a, b = cp.asnumpy(getattr(one, key)), cp.asnumpy(getattr(many, key))
            check(a.shape == b.shape and np.array_equal(a, b), f"{cls.__name__} {kw}: {key} differs at {size} ranks")
    # an empty shard on rank 0 (GPU rows elsewhere)
    if size > 1:
        Xs, ys = (cp.zeros((0, Xc.shape[1])), cp.zeros(0)) if rank == 0 else \
            (cp.asarray(shard(Xc)), cp.asarray(shard(yc)))
        got = RandomForestClassifier(n_estimators=3, max_depth=6, random_state=0).fit(Xs, ys)
        check(got.n_estimators_ == 3, "empty GPU shard")
    path = f"/tmp/mpiml_forest_gpu_{size}.mpiml"
    mpiml.save(got, path)
    back = mpiml.load(path, device="gpu")
    check(bool(cp.allclose(back.predict(cp.asarray(shard(Xr))), got.predict(cp.asarray(shard(Xr))))),
          "model file round trip on the GPU")


guarded(main, comm)
