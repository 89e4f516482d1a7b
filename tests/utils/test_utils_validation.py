"""validate_data and friends: scikit-learn's behaviour on one rank, agreed errors on several."""

import numpy as np
import pytest
from sklearn.base import BaseEstimator
from sklearn.utils.validation import validate_data as sk_validate_data

from mpiml.comm import get_comm
from mpiml.utils import (check_random_state, global_row_offset, row_counts, to_device_like, validate_data,
                         validate_sample_weight, xp_of)
from mpiml.utils._testing import MinimalSPMDTransformer

import _utils_launches


@pytest.fixture
def utils_launches(tmp_path_factory):
    return _utils_launches.launches(tmp_path_factory)


class MinimalSPMDTransformerLike(BaseEstimator):
    """A plain scikit-learn estimator, to get scikit-learn's own messages."""


MinimalSPMDTransformerLike.__name__ = "MinimalSPMDTransformer"


def _messages(X, reset=True, fitted_on=None):
    ours, theirs = MinimalSPMDTransformer(), MinimalSPMDTransformerLike()
    if fitted_on is not None:
        ours.n_features_in_ = theirs.n_features_in_ = fitted_on
    out = []
    for fn in (lambda: validate_data(ours, X, comm=get_comm("self"), reset=reset),
               lambda: sk_validate_data(theirs, X, reset=reset, dtype=["float64", "float32"])):
        try:
            fn()
            out.append(None)
        except Exception as exc:
            out.append((type(exc), str(exc)))
    return out


@pytest.mark.parametrize("X", [
    np.ones(3), np.float64(3.0), np.ones((2, 2, 2)), np.ones((0, 3)), np.ones((3, 0)),
    np.array([[1.0, np.nan]]), np.array([[1.0, np.inf]]), np.array([[1 + 2j, 1.0]]),
    np.array([["a", "b"]], dtype=object), [[1, 2], [3, 4]],
], ids=["1d", "scalar", "3d", "no-rows", "no-features", "nan", "inf", "complex", "strings", "list"])
def test_single_rank_matches_sklearn(X):
    ours, theirs = _messages(X)
    assert ours == theirs


def test_single_rank_n_features_message():
    ours, theirs = _messages(np.ones((2, 3)), reset=False, fitted_on=4)
    assert ours == theirs
    assert ours[1] == "X has 3 features, but MinimalSPMDTransformer is expecting 4 features as input."


def test_conversions_and_helpers():
    one = get_comm("self")
    est = MinimalSPMDTransformer()
    X, xp = validate_data(est, np.ones((2, 3), dtype=np.int32), comm=one)
    assert X.dtype == np.float64 and xp is np and est.n_features_in_ == 3
    X, _ = validate_data(est, np.ones((2, 3), dtype=np.float32), comm=one)
    assert X.dtype == np.float32

    class DLPackOnly:  # a foreign DLPack producer (like a CPU torch tensor)
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    X, xp = validate_data(est, DLPackOnly(np.arange(6.0).reshape(3, 2)), comm=one)
    assert isinstance(X, np.ndarray) and X.shape == (3, 2) and xp is np

    pd = pytest.importorskip("pandas")
    validate_data(est, pd.DataFrame({"a": [1.0, 2.0], "b": [3.0, 4.0]}), comm=one)
    assert est.feature_names_in_.tolist() == ["a", "b"]
    validate_data(est, np.ones((2, 2)), comm=one)
    assert not hasattr(est, "feature_names_in_")

    assert xp_of(np.ones(2)) is np and to_device_like(np.ones(2), np.ones(3)) is not None
    assert global_row_offset(5, one) == 0 and row_counts(5, one).tolist() == [5]
    assert isinstance(check_random_state(0), np.random.RandomState)
    with pytest.raises(ValueError, match="Sample weights must be 1D array or scalar"):
        validate_sample_weight(np.ones((2, 1)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="Input sample_weight contains NaN"):
        validate_sample_weight(np.array([1.0, np.nan]), np.ones((2, 2)))
    with pytest.raises(ValueError, match="Negative values in data passed to `sample_weight`"):
        validate_sample_weight(np.array([1.0, -1.0]), np.ones((2, 2)), only_non_negative=True)
    assert validate_sample_weight(None, np.ones((2, 2), dtype=np.float32)).dtype == np.float32


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_validation_on_ranks(utils_launches, n):
    utils_launches.verdict(n, "validation")       # _validation_spmd_script.py (see _utils_launches.py)


@pytest.mark.gpu
def test_device_input_stays_on_device():
    import cupy

    one = get_comm("self")
    est = MinimalSPMDTransformer()
    X, xp = validate_data(est, cupy.ones((4, 3), dtype=cupy.int32), comm=one)
    assert xp is cupy and isinstance(X, cupy.ndarray) and X.dtype == cupy.float64 and est.n_features_in_ == 3
    X32 = cupy.ones((4, 3), dtype=cupy.float32)
    assert validate_data(est, X32, comm=one)[0] is X32  # no copy
    bad = cupy.ones((4, 3))
    bad[1, 1] = cupy.nan
    with pytest.raises(ValueError, match="Input X contains NaN."):
        validate_data(est, bad, comm=one)
    with pytest.raises(ValueError, match="Expected 2D array, got 1D array instead"):
        validate_data(est, cupy.ones(3), comm=one)
    with pytest.raises(ValueError, match="Found array with 0 sample"):
        validate_data(est, cupy.ones((0, 3)), comm=one)
    with pytest.raises(ValueError, match="X has 2 features, but MinimalSPMDTransformer is expecting 3"):
        validate_data(est, cupy.ones((4, 2)), comm=one, reset=False)
    fitted = MinimalSPMDTransformer().fit(cupy.arange(12.0).reshape(4, 3))
    assert isinstance(fitted.mean_, cupy.ndarray)
    assert isinstance(fitted.transform(cupy.ones((2, 3))), cupy.ndarray)
    w = validate_sample_weight(np.ones(4), cupy.ones((4, 3)))
    assert isinstance(w, cupy.ndarray)


@pytest.mark.gpu
def test_cuda_tensor_becomes_cupy_without_copy():
    torch = pytest.importorskip("torch")
    import cupy

    t = torch.arange(12, dtype=torch.float64, device="cuda").reshape(4, 3)
    X, xp = validate_data(MinimalSPMDTransformer(), t, comm=get_comm("self"))
    assert xp is cupy and X.data.ptr == t.data_ptr()
    X, xp = validate_data(MinimalSPMDTransformer(), t.cpu(), comm=get_comm("self"))
    assert xp is np and X.shape == (4, 3)


@pytest.mark.parametrize("y,expected", [
    ([1.0, 0.0, 1.0, 0.0], [0.0, 1.0]),          # binary: min and max, no sort
    ([3, 3, 3], [3]),                              # one label
    ([2, 0, 1, 2, 0], [0, 1, 2]),                  # three: the unique fallback
    ([-1.5, 7.0, -1.5], [-1.5, 7.0]),
])
def test_device_labels_finds_the_distinct_labels(y, expected):
    # the binary shortcut of the CuPy path, run on NumPy (the function only uses the array namespace)
    from mpiml.utils._supervised import _device_labels

    got = _device_labels(np.asarray(y))
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.asarray(y).dtype))


def test_device_labels_with_nan_falls_back_to_unique():
    from mpiml.utils._supervised import _device_labels

    got = _device_labels(np.array([0.0, np.nan, 1.0]))
    assert got.shape == (3,) and np.isnan(got[-1])


@pytest.mark.parametrize("labels", [
    np.array([0, 1]), np.array([True, False]), np.array([-3.0, 7.0, 9.0]), np.array([0.5, 1.0]),
    np.array([2.0 ** 60, 1.0]), np.array([1e300, 1.0]), np.array(["a", "b"]),
])
def test_label_values_check_as_scikit_learn(labels):
    """The distinct labels of a device y: integers and integral floats pass without scikit-learn's type
    inspection; anything else gets its verdict (and message): the same verdict either way."""
    import warnings

    from sklearn.utils.multiclass import check_classification_targets

    from mpiml.utils._supervised import _check_label_values

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # (a cast of 1e300 to integers warns there)
        try:
            check_classification_targets(labels)
            expected = None
        except ValueError as exc:
            expected = str(exc)
        if expected is None:
            _check_label_values(labels)
        else:
            with pytest.raises(ValueError) as err:
                _check_label_values(labels)
            assert str(err.value) == expected
