"""Linear models on 1, 2, 3 and 4 ranks against scikit-learn on the gathered data (one launch per rank count,
shared with the folder's other multi-rank scripts: _launches.py).

The checks live in ``linear_spmd_script.py``; each launch also saves a
LogisticRegression fitted on N ranks, which is loaded here in one process and
must give the probabilities the N-rank model gave.
"""

import numpy as np
import pytest

import mpiml

from . import _launches


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_linear_models_spmd_against_sklearn(launches, n):
    tmp_path = launches.verdict(n, "linear")    # linear_spmd_script.py
    model = mpiml.load(str(tmp_path / "logreg.mpiml"))
    X = np.load(tmp_path / "X.npy")
    np.testing.assert_allclose(model.predict_proba(X), np.load(tmp_path / "proba0.npy"), rtol=0, atol=0)
    assert list(model.classes_) == [0, 1, 2]
