"""The parameters scikit-learn's own test files asked of the linear models, on 1, 2, 3 and 4 ranks.

The checks live in ``suite_params_spmd_script.py`` (callbacks, scikit-learn's refusals
for liblinear / sag / saga, ``copy_X=False``, Ridge's ``n_iter_`` / shapes / ``score``).
"""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_suite_parameters_spmd(mpi, n):
    mpi(os.path.join(HERE, "suite_params_spmd_script.py"), n, timeout=150)
