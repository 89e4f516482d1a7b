"""Distributed generators and partitioned loaders on 1-4 ranks."""

import os

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file, load_svmlight_file

from mpiml.comm import get_comm
from mpiml.datasets import make_blobs, make_classification, make_low_rank_matrix, make_regression, shard_bounds

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Reference datasets from one process, and files to load (good and broken)."""
    import sys

    sys.path.insert(0, HERE)
    import _datasets_cases as cases

    from threadpoolctl import threadpool_limits

    d = tmp_path_factory.mktemp("datasets")
    one = get_comm("self")
    with threadpool_limits(1):  # as under mpiexec (OMP_NUM_THREADS=1): the same BLAS bits
        for name, (fn, kwargs) in cases.GENERATORS.items():
            out = fn(**kwargs, comm=one)
            for i, part in enumerate(out if isinstance(out, tuple) else (out,)):
                np.save(d / f"ref_{name}_{i}.npy", part)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((1003, 3))
    np.save(d / "data.npy", data)
    np.save(d / "fortran.npy", np.asfortranarray(rng.standard_normal((37, 4))))
    table = np.round(rng.standard_normal((501, 5)), 6)
    np.save(d / "table.npy", table)
    with open(d / "table.csv", "w") as f:
        f.write("a,b,c,d,target\n")
        for row in table:
            f.write(",".join(f"{v:.6f}" for v in row) + "\n")
    (d / "tiny.csv").write_text("1,2,3\n4,5,6\n")
    (d / "bad.csv").write_text("1,2,3\n" * 300 + "1,oops,3\n" + "4,5,6\n" * 300)
    (d / "truncated.csv").write_text("1,2,3\n" * 400 + "4,5")
    raw = (d / "data.npy").read_bytes()
    (d / "truncated.npy").write_bytes(raw[: len(raw) - 100])
    (d / "garbage.npy").write_bytes(b"this is not an npy file at all" * 10)
    dense = rng.standard_normal((400, 12)) * (rng.random((400, 12)) < 0.3)
    dense[:, -1] = 0.0
    dense[7, -1] = 1.5  # the last column is used once
    ys = rng.integers(0, 3, 400).astype(np.float64)
    dump_svmlight_file(sp.csr_matrix(dense), ys, str(d / "data.svm"), zero_based=False)
    X_ref, y_ref = load_svmlight_file(str(d / "data.svm"))
    np.save(d / "svm_dense.npy", X_ref.toarray())
    np.save(d / "svm_y.npy", y_ref)
    (d / "bad.svm").write_text("1 1:0.5 3:2\n" * 200 + "0 2:x:y\n" + "1 1:1\n" * 200)
    # errors name line numbers of the file (header, comment and blank lines counted), not rank-local rows
    (d / "bad_late.csv").write_text("x,y,z\n" + "# note\n\n" + "1,2,3\n" * 500 + "7,8,oops\n" + "4,5,6\n" * 20)
    (d / "narrow_late.csv").write_text("1,2,3\n" * 450 + "# c\n" + "4,5\n" + "1,2,3\n" * 9)
    (d / "bad_late.svm").write_text("# header comment\n" + "1 1:0.5 3:2\n" * 500 + "0 2:1 1:1\n" + "1 1:1\n" * 3)
    (d / "empty.svm").write_text("")
    (d / "comments.svm").write_text("# nothing here\n\n")
    (d / "huge_index.svm").write_text("1 2147483647:1.5\n" + "0 3:2\n" * 50 + "1 1:1 5:2\n" * 50)
    (d / "zero.svm").write_text("1 1:2\n" * 300 + "0 0:1\n")
    X_big, y_big = load_svmlight_file(str(d / "huge_index.svm"))
    np.save(d / "huge_index_nf.npy", np.array([X_big.shape[1]]))
    return d


def test_shard_bounds_match_array_split():
    for n in (0, 1, 7, 100):
        for size in (1, 2, 3, 4, 5):
            sizes = [len(p) for p in np.array_split(np.arange(n), size)]
            got = [shard_bounds(n, size, r) for r in range(size)]
            assert [b - a for a, b in got] == sizes
            assert got[0][0] == 0 and got[-1][1] == n


def test_generators_single_process_shapes_and_content():
    one = get_comm("self")
    X, y, c = make_blobs(1000, 4, centers=3, random_state=0, return_centers=True, comm=one)
    assert X.shape == (1000, 4) and c.shape == (3, 4) and np.bincount(y).tolist() == [334, 333, 333]
    assert np.linalg.norm(X - c[y], axis=1).mean() < 3.5
    X2, _ = make_blobs(1000, 4, centers=3, random_state=1, comm=one)
    assert not np.array_equal(X, X2)
    X, y = make_classification(2000, 10, random_state=0, comm=one)
    assert X.shape == (2000, 10) and set(np.unique(y)) == {0, 1}
    X, y, coef = make_regression(300, 6, n_informative=2, coef=True, random_state=0, comm=one)
    np.testing.assert_allclose(X @ coef, y, atol=1e-9)
    assert (coef != 0).sum() == 2
    X = make_low_rank_matrix(3000, 40, effective_rank=3, tail_strength=0.0, random_state=0, comm=one)
    s = np.linalg.svd(X, compute_uv=False)
    profile = np.exp(-((np.arange(6) / 3) ** 2))
    np.testing.assert_allclose(s[:6], profile, rtol=0.1)
    assert s[12] < 1e-6
    with pytest.raises(ValueError, match="n_samples"):
        make_blobs(-1, comm=one)
    with pytest.raises(ValueError, match="device"):
        make_blobs(10, device="tpu", comm=one)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_datasets_on_ranks(mpi, prepared, n):
    mpi(os.path.join(HERE, "_datasets_spmd_script.py"), n, str(prepared), timeout=120,
        env={"PYTHONPATH": os.pathsep.join([HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), os.pardir, "src")])})
