"""Single-process PCA and TruncatedSVD: scikit-learn's estimator checks, parameters, dtypes, model files.

Checks of scikit-learn's ``parametrize_with_checks`` that are skipped, and why: none so far
(see the ``_EXPECTED_FAILED`` table; every entry names its reason).
"""

import warnings

import numpy as np
import pytest
from sklearn import decomposition as skd
from sklearn.utils.estimator_checks import parametrize_with_checks

import mpiml
from mpiml.decomposition import PCA, TruncatedSVD

_EXPECTED_FAILED = {}


@parametrize_with_checks(
    [PCA(n_components=2, random_state=0), PCA(n_components=2, svd_solver="randomized", random_state=0),
     TruncatedSVD(n_components=1, random_state=0), TruncatedSVD(n_components=1, algorithm="arpack", random_state=0)],
    expected_failed_checks=lambda est: _EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)
