"""Nearest neighbours on CuPy shards against the NumPy path (GPU host only; not yet run on a GPU)."""

import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu


def test_one_gpu_matches_host():
    import cupy as cp

    from mpiml.neighbors import KNeighborsClassifier, NearestNeighbors

    rs = np.random.RandomState(0)
    X, Q = rs.randn(3000, 16), rs.randn(200, 16)
    y = rs.randint(0, 3, 3000)
    for metric in ("euclidean", "sqeuclidean", "cosine", "manhattan"):
        dh, ih = NearestNeighbors(n_neighbors=8, metric=metric).fit(X).kneighbors(Q)
        dg, ig = NearestNeighbors(n_neighbors=8, metric=metric).fit(cp.asarray(X)).kneighbors(cp.asarray(Q))
        assert isinstance(dg, cp.ndarray)
        np.testing.assert_allclose(dg.get(), dh, rtol=1e-9, atol=1e-9)
        np.testing.assert_array_equal(ig.get(), ih)
    clf = KNeighborsClassifier(n_neighbors=5).fit(cp.asarray(X), cp.asarray(y))
    np.testing.assert_array_equal(clf.predict(cp.asarray(Q)).get(), KNeighborsClassifier(5).fit(X, y).predict(Q))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_neighbors_gpu_spmd(mpi, n):
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < n:
        pytest.skip(f"needs {n} GPUs")
    mpi(os.path.join(HERE, "neighbors_gpu_script.py"), n, timeout=240)
