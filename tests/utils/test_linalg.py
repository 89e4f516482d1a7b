"""Distributed QR (TSQR, CholeskyQR2) at 1, 2, 3 and 4 ranks: one launch per rank count.

The checks live in ``linalg_spmd_script.py``, launched with the validation checks (``_utils_launches.py``);
single-process argument checks are here.
"""

import numpy as np
import pytest

from mpiml.comm import get_comm
from mpiml.utils._linalg import cholesky_qr2, orthonormalize, tsqr

import _utils_launches


@pytest.fixture
def utils_launches(tmp_path_factory):
    return _utils_launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_linalg_spmd(utils_launches, n):
    utils_launches.verdict(n, "linalg")


def test_bad_arguments():
    comm = get_comm("self")
    A = np.ones((4, 2))
    with pytest.raises(ValueError, match="method must be"):
        tsqr(A, comm, method="ring")
    with pytest.raises(ValueError, match="on_failure must be"):
        cholesky_qr2(A, comm, on_failure="ignore")
    with pytest.raises(ValueError, match="method must be"):
        orthonormalize(A, comm, method="lu")
    with pytest.raises(ValueError, match="2-D"):
        tsqr(np.ones(3), comm)
