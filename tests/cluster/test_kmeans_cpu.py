"""The compiled one-pass Lloyd step (mpiml.cluster._kmeans_cpu) against the NumPy path."""

import numpy as np
import pytest

from mpiml.cluster import _kmeans_cpu, _kmeans_ops as ops


def _step(X, w, shift, C, env, monkeypatch, labels=None):
    monkeypatch.setenv("MPIML_CPU_KERNELS", env)
    lab = np.full(X.shape[0], -1, np.int32) if labels is None else labels.copy()
    mind = np.empty(X.shape[0], X.dtype)
    packed = ops.lloyd_step(X, w, shift, C, lab, mind)
    return packed, lab, mind


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_lloyd_step_matches_numpy(dtype, weighted, monkeypatch):
    rng = np.random.default_rng(0)
    n, d, k = 150000, 7, 5  # several chunks and parts, the last ones uneven
    X = (rng.normal(size=(n, d)) + 3 * rng.integers(0, k, size=(n, 1))).astype(dtype)
    C = X[rng.choice(n, k, replace=False)].astype(dtype)
    shift = X.mean(axis=0)
    w = rng.uniform(0.5, 2, size=n).astype(dtype) if weighted else None
    prev = rng.integers(0, k, size=n).astype(np.int32)
    fast, lab, mind = _step(X, w, shift, C - shift, "1", monkeypatch, prev)
    slow, lab0, mind0 = _step(X, w, shift, C - shift, "0", monkeypatch, prev)
    np.testing.assert_array_equal(lab, lab0)
    rtol = 1e-10 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(mind, mind0, rtol=rtol, atol=1e-3 if dtype == np.float32 else 1e-9)
    np.testing.assert_allclose(fast[:-1], slow[:-1], rtol=rtol, atol=1e-6)
    assert fast[-1] == slow[-1] == np.count_nonzero(lab != prev)
    labels, dist, inertia = ops.assign(X, shift, C - shift, sample_weight=np.ones(n, dtype) if w is None else w)
    np.testing.assert_array_equal(labels, lab)
    np.testing.assert_allclose(inertia, fast[-2], rtol=1e-6)


def test_bits_do_not_depend_on_threads():
    import numba

    rng = np.random.default_rng(2)
    X, C = rng.normal(size=(20000, 6)), rng.normal(size=(8, 6))
    shift = X.mean(axis=0)
    assert _kmeans_cpu.n_parts(20000, 8, 6) > 1
    out = []
    before = numba.get_num_threads()
    try:
        for t in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(t)
            packed = np.zeros(8 * 6 + 8 + 2)
            _kmeans_cpu.lloyd_step(X, None, shift, C, np.full(20000, -1, np.int32), None, packed)
            out.append(packed)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(out[0], out[1])


def test_first_centre_wins_ties():
    X = np.array([[0.0, 0.0], [2.0, 0.0]])
    C = np.array([[1.0, 0.0], [1.0, 0.0], [5.0, 5.0]])
    labels, mind, inertia = _kmeans_cpu.assign(X, None, C)
    assert inertia is None
    np.testing.assert_array_equal(labels, [0, 0])
    np.testing.assert_array_equal(mind, [1.0, 1.0])


def test_static_schedule_gives_the_same_bits(monkeypatch):
    # the threads take parts from a counter; MPIML_CPU_SCHEDULE=static (one prange iteration a part) must give
    # the same sums, labels and distances: a part's work does not depend on the thread that takes it
    rng = np.random.default_rng(4)
    X, C = rng.normal(size=(30000, 6)), rng.normal(size=(7, 6))
    shift = X.mean(axis=0)
    out = []
    for schedule in ("", "static"):
        monkeypatch.setenv("MPIML_CPU_SCHEDULE", schedule)
        labels, mind = np.full(30000, -1, np.int32), np.empty(30000)
        packed = _kmeans_cpu.lloyd_step(X, None, shift, C, labels, mind, np.zeros(7 * 6 + 7 + 2))
        out.append((packed, labels, mind))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
