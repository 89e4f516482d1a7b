"""The sparse family's host-side choices: the bucket transpose's bucket width (mpiml.kernels.sparse.bucket_shift)
and the counter-based normal draw (mpiml_normal), whose stream a NumPy twin below spells out: checked for its
moments here, and equal to the kernel's on the GPU host."""

import numpy as np
import pytest

from mpiml.kernels import sparse

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def normal_twin(seed, n):
    """What ``mpiml_normal`` computes for ``n`` values from ``seed`` (float64)."""
    with np.errstate(over="ignore"):
        base = _mix64(np.uint64(seed % 2**64) + _GOLDEN)
        p = np.arange((n + 1) // 2, dtype=np.uint64)
        h = _mix64(base + (p + np.uint64(1)) * _GOLDEN)
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 1.0) / 2.0**32
    u2 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2.0**32
    r = np.sqrt(-2.0 * np.log(u1))
    out = np.empty(2 * p.size)
    out[0::2], out[1::2] = r * np.cos(2 * np.pi * u2), r * np.sin(2 * np.pi * u2)
    return out[:n]


def test_normal_stream_is_standard_normal():
    """The draw's moments and tails (2·10^6 values), two seeds independent, seed 0 and a large seed alike."""
    for seed in (0, 12345, 2**63 - 25):
        x = normal_twin(seed, 2_000_001)
        assert abs(x.mean()) < 3e-3 and abs(x.std() - 1.0) < 3e-3
        assert abs((x ** 3).mean()) < 1e-2 and abs((x ** 4).mean() - 3.0) < 2e-2
        assert abs((np.abs(x) > 3).mean() - 0.0026998) < 3e-4
        assert abs(np.corrcoef(x[:-1:2], x[1::2])[0, 1]) < 3e-3         # the two of a pair
    a, b = normal_twin(1, 100_000), normal_twin(2, 100_000)
    assert abs(np.corrcoef(a, b)[0, 1]) < 1.5e-2


def test_bucket_shift_balances_and_bounds():
    """Buckets and columns a bucket both at most BUCKET_MAX, about equal (pass 1's runs against pass 2's); None past
    BUCKET_MAX² columns; the environment forces a width (None when it breaks a bound)."""
    for n_cols in (1, 2, 3, 40, 1000, 60000, 100000, 300000, sparse.BUCKET_MAX ** 2):
        s = sparse.bucket_shift(n_cols)
        K = -(-n_cols >> s)
        assert 1 <= K <= sparse.BUCKET_MAX and (1 << s) <= sparse.BUCKET_MAX, n_cols
        assert (K - 1) << s < n_cols <= K << s
        assert K <= 4 * (1 << s) + 4 and (1 << s) <= 2 * K + 2, (n_cols, s, K)
    assert sparse.bucket_shift(100000) == 8
    assert sparse.bucket_shift(sparse.BUCKET_MAX ** 2 + 1) is None


def test_bucket_shift_from_the_environment(monkeypatch):
    monkeypatch.setenv("MPIML_SPARSE_BUCKET_SHIFT", "9")
    assert sparse.bucket_shift(100000) == 9
    monkeypatch.setenv("MPIML_SPARSE_BUCKET_SHIFT", "3")       # 12500 buckets: too many
    assert sparse.bucket_shift(100000) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_kernel_equals_its_twin(dtype):
    """The kernel's values are the twin's (float64 to rounding of log / sincospi; float32 rounded from them), odd
    and even sizes, a shape kept."""
    seed = 987654321987
    for shape in ((1,), (7,), (1000, 26), (3, 5, 11)):
        x = sparse.normal(seed, shape, dtype)
        assert x.shape == shape and x.dtype == dtype
        ref = normal_twin(seed, int(np.prod(shape))).reshape(shape)
        np.testing.assert_allclose(x.get(), ref, rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-7)
