"""Distributed QR (TSQR, CholeskyQR2) at 1, 2, 3 and 4 ranks: one launch per rank count.

The checks live in ``linalg_spmd_script.py``; single-process argument checks are here.
"""

import os

import numpy as np
import pytest

from mpiml.comm import get_comm
from mpiml.utils._linalg import cholesky_qr2, orthonormalize, tsqr

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_linalg_spmd(mpi, n):
    mpi(os.path.join(HERE, "linalg_spmd_script.py"), n, timeout=120)


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
