"""Single-process PCA and TruncatedSVD: scikit-learn's estimator checks, parameters, dtypes, model files.

Checks of scikit-learn's ``parametrize_with_checks`` that are skipped, and why: none so far
(see the ``_EXPECTED_FAILED`` table; every entry names its reason).
"""

import warnings

import numpy as np
import pytest
from sklearn import decomposition as skd
from sklearn.exceptions import ConvergenceWarning
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


def _flat_spectrum_matrix():
    """Uniform values at random places (75,000 stored): a flat spectrum, its top singular values 1e-3 apart."""
    import scipy.sparse as sp

    rs = np.random.RandomState(1)
    nnz = 75_000
    return sp.csr_matrix((rs.random_sample(nnz), (rs.randint(0, 10_000, nnz), rs.randint(0, 1_500, nnz))),
                         shape=(10_000, 1_500))


def test_arpack_flat_spectrum_needs_no_more_products_than_arpack(monkeypatch):
    """Regression: the block Lanczos kept only the k wanted Ritz vectors at a restart and went on from their own
    residuals: 1,700 products of ``XᵀX`` with a vector here, where ARPACK (scipy's ``svds``, what scikit-learn
    calls) makes 247; the thick restart that keeps half the basis makes 188."""
    from scipy.sparse.linalg import LinearOperator, svds
    from sklearn.utils import check_random_state

    from mpiml.decomposition import _lanczos

    X, k = _flat_spectrum_matrix(), 10
    arpack = [0]

    def product(V):
        arpack[0] += 1 if V.ndim == 1 else V.shape[1]
        return X @ V

    op = LinearOperator(X.shape, matvec=product, matmat=product, rmatvec=lambda u: X.T @ u, dtype=X.dtype)
    s_arpack = np.sort(svds(op, k=k, tol=0.0, v0=check_random_state(0).uniform(-1, 1, X.shape[1]))[1])[::-1]
    ours = [0]
    plain = _lanczos._matvec

    def counted(A, V, padded=False):
        ours[0] += V.shape[1]
        return plain(A, V, padded)

    monkeypatch.setattr(_lanczos, "_matvec", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = TruncatedSVD(k, algorithm="arpack", random_state=0).fit(X)
    sk = skd.TruncatedSVD(k, algorithm="arpack", random_state=0).fit(X)
    assert ours[0] <= 1.5 * arpack[0], (ours[0], arpack[0])
    np.testing.assert_allclose(est.singular_values_, s_arpack, rtol=1e-12)
    np.testing.assert_allclose(est.singular_values_, sk.singular_values_, rtol=1e-12)
    np.testing.assert_allclose(est.components_, sk.components_, atol=1e-8)
    np.testing.assert_allclose(est.explained_variance_, sk.explained_variance_, rtol=1e-10)
