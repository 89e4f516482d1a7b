"""The parameters scikit-learn's own test files asked of the linear models, on 1, 2, 3 and 4 ranks.

The checks live in ``suite_params_spmd_script.py`` (callbacks, scikit-learn's refusals
for liblinear / sag / saga, ``copy_X=False``, Ridge's ``n_iter_`` / shapes / ``score``).
"""

import pytest

from . import _launches


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return _launches.launches(tmp_path_factory)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_suite_parameters_spmd(launches, n):
    launches.verdict(n, "suite_params")    # suite_params_spmd_script.py, in the folder's shared launches
