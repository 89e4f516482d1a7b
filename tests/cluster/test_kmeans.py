"""Single-process KMeans: scikit-learn's estimator checks, parameters, dtypes, model files.

Checks of scikit-learn's ``parametrize_with_checks`` that are skipped, and why:

- ``check_sample_weight_equivalence_on_dense_data`` and ``..._on_sparse_data``:
  integer weights vs repeated rows give the same *objective* but not the same
  initial centres, since the ``k-means||`` draws are per row (scikit-learn marks
  the same checks expected to fail for its own KMeans for the same reason).
"""

import warnings

import numpy as np
import pytest
from sklearn.cluster import KMeans as SkKMeans
from sklearn.datasets import make_blobs
from sklearn.utils.estimator_checks import parametrize_with_checks

import mpiml
from mpiml.cluster import KMeans

_EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data":
        "per-row k-means|| draws: repeated rows and integer weights start from different centres",
    "check_sample_weight_equivalence_on_sparse_data":
        "per-row k-means|| draws: repeated rows and integer weights start from different centres",
}


@parametrize_with_checks([KMeans(n_clusters=3, random_state=0)], expected_failed_checks=lambda est: _EXPECTED_FAILED)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


@pytest.fixture(scope="module")
def blobs():
    X, y = make_blobs(n_samples=2000, n_features=4, centers=5, random_state=0)
    return X, y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved(blobs, dtype):
    X = blobs[0].astype(dtype)
    km = KMeans(5, random_state=0).fit(X)
    assert km.cluster_centers_.dtype == dtype
    assert km.transform(X).dtype == dtype
    assert km.labels_.dtype == np.int32
    assert isinstance(km.inertia_, float)


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "random"])
def test_init_quality(blobs, init):
    X = blobs[0]
    best = SkKMeans(5, n_init=10, random_state=0).fit(X).inertia_
    km = KMeans(5, init=init, random_state=0).fit(X)
    assert km.inertia_ <= 1.01 * best


@pytest.mark.parametrize("n, k", [(1, 1), (10, 10), (10, 3), (1000, 7), (10**15, 64)])
def test_random_init_draws_distinct_rows_without_a_permutation(n, k):
    """init="random" draws k distinct global rows, the same for the same seed, in O(k): 10^15 rows could not be
    permuted."""
    from mpiml.cluster._kmeans_init import distinct_draw

    a = distinct_draw(np.random.RandomState(5), n, k)
    b = distinct_draw(np.random.RandomState(5), n, k)
    assert a.dtype == np.int64 and len(a) == k and len(set(a.tolist())) == k
    assert a.min() >= 0 and a.max() < n and (a == b).all()
    with pytest.raises(ValueError, match="cannot draw 11 distinct rows of 10"):
        distinct_draw(np.random.RandomState(5), 10, 11)


def test_same_as_sklearn_with_array_init(blobs):
    X = blobs[0]
    init = X[:5]
    km = KMeans(5, init=init).fit(X)
    sk = SkKMeans(5, init=init, n_init=1).fit(X)
    np.testing.assert_array_equal(km.labels_, sk.labels_)
    assert km.inertia_ == pytest.approx(sk.inertia_, rel=1e-10)
    assert km.n_iter_ == sk.n_iter_
    assert km.score(X) == pytest.approx(sk.score(X), rel=1e-10)


def test_small_batches_give_the_same_result(blobs):
    X = blobs[0]
    a = KMeans(5, random_state=3).fit(X)
    b = KMeans(5, random_state=3, batch_size=97).fit(X)
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-10)
    np.testing.assert_array_equal(a.labels_, b.labels_)


def test_bad_parameters(blobs):
    X = blobs[0]
    with pytest.raises(ValueError, match="The 'n_clusters' parameter of KMeans must be an int in the range"):
        KMeans(0).fit(X)
    with pytest.raises(ValueError, match="'init' parameter"):
        KMeans(3, init="bogus").fit(X)
    with pytest.raises(ValueError, match="does not match the number of clusters"):
        KMeans(3, init=X[:2]).fit(X)
    with pytest.raises(ValueError, match="does not match the number of features"):
        KMeans(3, init=X[:3, :2]).fit(X)
    with pytest.raises(ValueError, match="n_samples=2 should be >= n_clusters=3"):
        KMeans(3).fit(X[:2])


def test_partial_fit_converges(blobs):
    X = blobs[0]
    km = KMeans(5, random_state=0)
    for _ in range(3):
        for b in range(0, len(X), 250):
            km.partial_fit(X[b:b + 250])
    best = SkKMeans(5, n_init=10, random_state=0).fit(X).inertia_
    assert -km.score(X) <= 1.02 * best
    assert km.n_steps_ == 24


def test_model_file_round_trip(blobs, tmp_path):
    X = blobs[0].astype(np.float32)
    km = KMeans(5, random_state=0).fit(X)
    path = str(tmp_path / "km.mpiml")
    mpiml.save(km, path)
    back = mpiml.load(path)
    assert isinstance(back, KMeans)
    assert back.get_params()["n_clusters"] == 5
    np.testing.assert_array_equal(back.cluster_centers_, km.cluster_centers_)
    np.testing.assert_array_equal(back.predict(X), km.predict(X))
    assert back.inertia_ == km.inertia_


def test_empty_cluster_is_relocated():
    X = np.array([[0.0, 0], [0.1, 0], [5, 5], [5.1, 5], [9, 9], [9.2, 9]])
    init = np.array([[0.0, 0], [5, 5], [100, 100]])
    km = KMeans(3, init=init).fit(X)
    sk = SkKMeans(3, init=init, n_init=1).fit(X)
    np.testing.assert_allclose(km.cluster_centers_, sk.cluster_centers_)
    assert km.inertia_ == pytest.approx(sk.inertia_)
