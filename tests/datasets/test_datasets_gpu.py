"""Generators and loaders on the GPU (skipped without CuPy and a GPU)."""

import numpy as np
import pytest

from mpiml.datasets import load_npy, make_blobs, make_classification, make_low_rank_matrix, make_regression

pytestmark = pytest.mark.gpu


class RankOf:
    """Stands for rank ``rank`` of a ``size``-rank communicator (generators only read these)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("fn, kwargs", [
    (make_blobs, dict(n_samples=140_003, n_features=3, centers=5)),
    (make_classification, dict(n_samples=70_011, n_features=30, n_informative=5, n_classes=3, flip_y=0.05)),
    (make_regression, dict(n_samples=70_001, n_features=20, noise=0.5)),
    (make_low_rank_matrix, dict(n_samples=70_001, n_features=64)),
])
def test_gpu_dataset_is_rank_count_independent(fn, kwargs):
    import cupy

    whole = fn(**kwargs, random_state=11, device="gpu", comm=RankOf(0, 1))
    whole = whole if isinstance(whole, tuple) else (whole,)
    assert all(isinstance(a, cupy.ndarray) for a in whole)
    for size in (2, 3, 4):
        shards = [fn(**kwargs, random_state=11, device="gpu", comm=RankOf(r, size)) for r in range(size)]
        shards = [s if isinstance(s, tuple) else (s,) for s in shards]
        for i, ref in enumerate(whole):
            assert cupy.array_equal(cupy.concatenate([s[i] for s in shards]), ref), (fn.__name__, size, i)
    cpu = fn(**kwargs, random_state=11, comm=RankOf(0, 1))
    cpu = cpu if isinstance(cpu, tuple) else (cpu,)
    assert cpu[0].shape == whole[0].shape


def test_gpu_blobs_content_and_dtype():
    import cupy

    X, y, centers = make_blobs(10_000, 4, centers=3, random_state=0, device="gpu", dtype=np.float32,
                               return_centers=True, comm=RankOf(0, 1))
    assert X.dtype == cupy.float32 and y.dtype == cupy.int64
    assert cupy.bincount(y).get().tolist() == [3334, 3333, 3333]
    dist = cupy.linalg.norm(X - cupy.asarray(centers, dtype=cupy.float32)[y], axis=1).mean()
    assert float(dist) < 3.0


def test_gpu_load_npy(tmp_path):
    import cupy

    data = np.arange(30.0).reshape(10, 3)
    np.save(tmp_path / "a.npy", data)
    from mpiml.comm import get_comm

    # the loader agrees on errors with a real collective, so this runs on the size-1 communicator;
    # the row split over several ranks is covered under mpiexec in test_datasets_loaders
    got = load_npy(tmp_path / "a.npy", device="gpu", comm=get_comm("self"))
    assert isinstance(got, cupy.ndarray)
    assert np.array_equal(got.get(), data)


def test_gpu_load_svmlight_is_cupyx_csr(tmp_path):
    import cupy
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp
    from sklearn.datasets import dump_svmlight_file, load_svmlight_file

    from mpiml.comm import get_comm
    from mpiml.datasets import load_svmlight

    rs = np.random.RandomState(0)
    dense = rs.rand(50, 30) * (rs.rand(50, 30) < 0.2)
    dump_svmlight_file(sp.csr_matrix(dense), rs.randint(0, 2, 50), str(tmp_path / "a.svm"))
    X, y = load_svmlight(tmp_path / "a.svm", device="gpu", comm=get_comm("self"))
    Xr, yr = load_svmlight_file(str(tmp_path / "a.svm"))
    assert isinstance(X, csp.csr_matrix) and isinstance(y, cupy.ndarray)
    assert X.shape == Xr.shape
    np.testing.assert_array_equal(X.toarray().get(), Xr.toarray())
    Xd, _ = load_svmlight(tmp_path / "a.svm", device="gpu", dense=True, comm=get_comm("self"))
    assert isinstance(Xd, cupy.ndarray) and np.array_equal(Xd.get(), Xr.toarray())
