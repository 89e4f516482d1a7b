"""KMeans on 1, 2, 3 and 4 ranks against scikit-learn on the gathered data (one launch per rank count).

The checks themselves live in ``kmeans_spmd_script.py``; each launch also writes
a model file that is loaded here, in one process, and must predict the labels
the N-rank fit produced.
"""

import os

import numpy as np
import pytest

import mpiml

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "kmeans_spmd_script.py")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_kmeans_spmd_against_sklearn(mpi, tmp_path, n):
    mpi(SCRIPT, n, str(tmp_path), timeout=150)
    model = mpiml.load(str(tmp_path / "kmeans.mpiml"))
    X = np.load(tmp_path / "X.npy")
    labels = np.load(tmp_path / "labels.npy")
    assert model.cluster_centers_.shape == (6, 5)
    np.testing.assert_array_equal(model.predict(X), labels)
    assert not hasattr(model, "labels_")  # local to the ranks that fitted: not saved
