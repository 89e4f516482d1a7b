"""Linear models on one process: scikit-learn's common checks and the single-process contract.

No check of ``parametrize_with_checks`` is expected to fail.  The 6 skips are scikit-learn's own
array-API checks, which skip themselves unless SCIPY_ARRAY_API=1 is set (mpiml takes NumPy or
CuPy, not arbitrary array-API namespaces).
"""

import warnings

import numpy as np
import pytest
from sklearn import linear_model as sk
from sklearn.utils.estimator_checks import parametrize_with_checks

from mpiml.linear_model import LinearRegression, LogisticRegression, Ridge

_EXPECTED_FAILED = {}


@parametrize_with_checks([LinearRegression(), LinearRegression(solver="tsqr"), Ridge(), Ridge(solver="svd"),
                          LogisticRegression(), LogisticRegression(solver="newton-cholesky")],
                         expected_failed_checks=lambda est: _EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)
