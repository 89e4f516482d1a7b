"""Random forests on CuPy shards (GPU host only): the device path against the NumPy path.

The histogram sums are fixed-point integers, so a CuPy fit should grow the
trees of a NumPy fit; split scores are computed in float64 on each device,
where a near-tie could in principle resolve differently, so predictions are
compared (and the tree arrays reported) rather than demanded bit-equal.
"""

import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cls_name", ["RandomForestClassifier", "RandomForestRegressor"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cupy_matches_numpy(cls_name, dtype):
    import cupy as cp
    from sklearn.datasets import make_classification, make_regression

    from mpiml import ensemble

    cls = getattr(ensemble, cls_name)
    make = make_classification if cls_name.endswith("Classifier") else make_regression
    X, y = make(n_samples=5000, n_features=12, n_informative=6, random_state=0)
    X = X.astype(dtype)
    params = dict(n_estimators=8, max_depth=8, random_state=0)
    host = cls(**params).fit(X, y)
    dev = cls(**params).fit(cp.asarray(X), cp.asarray(y))
    assert isinstance(dev.tree_feature_, cp.ndarray) and isinstance(dev.feature_importances_, cp.ndarray)
    p_host, p_dev = host.predict(X), dev.predict(cp.asarray(X))
    assert isinstance(p_dev, cp.ndarray)
    agree = float(np.mean(cp.asnumpy(p_dev) == p_host)) if cls_name.endswith("Classifier") else \
        float(np.mean(np.isclose(cp.asnumpy(p_dev), p_host, rtol=1e-9, atol=1e-9)))
    assert agree >= 0.999, agree
    same = host.tree_feature_.shape == dev.tree_feature_.shape and \
        np.array_equal(host.tree_feature_, cp.asnumpy(dev.tree_feature_))
    print(f"{cls_name} {np.dtype(dtype).name}: trees identical to the NumPy fit: {same}")
    leaves = dev.apply(cp.asarray(X))
    assert leaves.shape == (X.shape[0], 8)
    # the model trained on the GPU predicts NumPy rows too
    np.testing.assert_array_equal(cp.asnumpy(dev.predict(cp.asarray(X[:50]))), np.asarray(dev.predict(X[:50])))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_forest_gpu_spmd(mpi, n):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    mpi(os.path.join(HERE, "forest_gpu_script.py"), n, timeout=300)
