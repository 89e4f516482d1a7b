"""PCA and TruncatedSVD on 1, 2, 3 and 4 ranks against scikit-learn on the gathered data.

One launch per rank count runs every check of ``decomp_spmd_script.py``; each
launch also writes a PCA model file that is loaded here, in one process, and
must transform like scikit-learn's PCA fitted on the whole data.
"""

import os

import numpy as np
import pytest
from sklearn.decomposition import PCA as SkPCA

import mpiml

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_decomposition_spmd_against_sklearn(mpi, tmp_path, n):
    mpi(os.path.join(HERE, "decomp_spmd_script.py"), n, str(tmp_path), timeout=240)
    model = mpiml.load(str(tmp_path / "pca.mpiml"))
    X = np.load(tmp_path / "X.npy")
    sk = SkPCA(4, whiten=True).fit(X)
    np.testing.assert_allclose(model.transform(X), sk.transform(X), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(model.inverse_transform(sk.transform(X)), sk.inverse_transform(sk.transform(X)),
                               rtol=1e-6, atol=1e-9)
