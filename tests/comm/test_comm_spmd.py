"""The communication core under real ``mpiexec`` with 1, 2, 3 and 4 ranks.

One launch per rank count runs the whole matrix (``spmd_collectives.py``, which
also runs ``spmd_p2p_errors.py``); its verdict is agreed across ranks.
"""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_comm_core_spmd(mpi, n):
    proc = mpi(os.path.join(HERE, "spmd_collectives.py"), n, timeout=240, env={"MPIML_TIMEOUT": "30"})
    assert "OK: 0 failure(s)" in proc.stdout, proc.stdout + proc.stderr
