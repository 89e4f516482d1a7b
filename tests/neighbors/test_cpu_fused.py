"""The fused float32 screen (mpiml.neighbors._fused) against the BLAS-tile screen and a full sort."""

import numpy as np
import pytest

from mpiml.neighbors import _cpu, _fused

SCREENED = ("euclidean", "sqeuclidean", "cosine")


def _reference(Q, X, k, metric):
    """Every distance from differences in float64 (cosine from the float64 unit rows), ordered by (distance, index)."""
    Q64, X64 = Q.astype(np.float64), X.astype(np.float64)
    if metric == "cosine":
        nq, nx = np.linalg.norm(Q64, axis=1), np.linalg.norm(X64, axis=1)
        D = 1.0 - (Q64 / np.where(nq > 0, nq, 1)[:, None]) @ (X64 / np.where(nx > 0, nx, 1)[:, None]).T
        D[nq == 0, :] = 1.0
        D[:, nx == 0] = 1.0
        D = np.maximum(D, 0)
    else:
        diff = Q64[:, None, :] - X64[None, :, :]
        D = (diff * diff).sum(axis=2)
        D = np.sqrt(D) if metric == "euclidean" else D
    order = np.lexsort((np.broadcast_to(np.arange(X.shape[0]), D.shape), D), axis=1)[:, :k]
    return np.take_along_axis(D, order, axis=1), order


def _both(Q, X, k, metric, monkeypatch):
    """``(fused, BLAS tiles)`` answers of :func:`mpiml.neighbors._cpu.topk`."""
    monkeypatch.setattr(_cpu, "FUSED", True)
    got = _cpu.topk(Q, X, k, metric)
    monkeypatch.setattr(_cpu, "FUSED", False)
    return got, _cpu.topk(Q, X, k, metric)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("metric", ["euclidean", "sqeuclidean"])
@pytest.mark.parametrize("k", [1, 10, 33, 250])
def test_ties_and_duplicates_go_to_the_lower_index(metric, dtype, k, monkeypatch):
    # small integers: exact distances, ties everywhere; duplicated rows; sizes that are no multiple of a tile
    rng = np.random.default_rng(11)
    X = rng.integers(0, 3, size=(1001, 5)).astype(dtype)
    X[500:520] = X[3]
    Q = np.vstack([X[[3, 0, 1000]], rng.integers(0, 3, size=(10, 5))]).astype(dtype)
    (d, i), (d0, i0) = _both(Q, X, k, metric, monkeypatch)
    want_d, want_i = _reference(Q, X, k, metric)
    np.testing.assert_array_equal(i, want_i)
    np.testing.assert_array_equal(d, want_d.astype(dtype))
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(d, d0)


@pytest.mark.parametrize("offset", [0.0, 1e3, 1e6, 1e12])
@pytest.mark.parametrize("metric", SCREENED)
def test_continuous_and_far_from_the_origin(metric, offset, monkeypatch):
    rng = np.random.default_rng(12)
    X = offset + rng.normal(size=(2100, 33))
    Q = np.vstack([X[[0, 31, 32, 2099]], offset + rng.normal(size=(45, 33))])
    if metric == "cosine" and offset == 0.0:
        X[7] = 0.0
        Q[5] = 0.0
    (d, i), (d0, i0) = _both(Q, X, 12, metric, monkeypatch)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(d, d0)
    if metric != "cosine" or offset == 0.0:  # (cosine of near-parallel rows: no unique answer at rounding level)
        want_d, want_i = _reference(Q, X, 12, metric)
        np.testing.assert_array_equal(i, want_i)
        np.testing.assert_allclose(d, want_d, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 16, 64])
def test_feature_counts(d, monkeypatch):
    rng = np.random.default_rng(d)
    X, Q = rng.normal(size=(777, d)), rng.normal(size=(17, d))
    (dist, i), (d0, i0) = _both(Q, X, 9, "euclidean", monkeypatch)
    np.testing.assert_array_equal(i, i0)
    np.testing.assert_array_equal(dist, d0)
    np.testing.assert_array_equal(i, _reference(Q, X, 9, "euclidean")[1])


def test_lists_of_earlier_blocks_are_merged(monkeypatch):
    # a ring's blocks: lists already holding rows of other global indices, equal distances among them
    rng = np.random.default_rng(13)
    X = rng.integers(0, 2, size=(900, 4)).astype(np.float64)
    Q = rng.integers(0, 2, size=(20, 4)).astype(np.float64)
    answers = []
    for fused in (True, False):
        monkeypatch.setattr(_cpu, "FUSED", fused)
        bd, bi = _cpu.new_lists(Q.shape[0], 40)
        for start in (600, 0, 300):  # blocks out of order
            _cpu.merge_block(Q, X[start:start + 300], start, bd, bi, "sqeuclidean")
        answers.append((bd, bi))
    want_d, want_i = _reference(Q, X, 40, "sqeuclidean")
    for bd, bi in answers:
        np.testing.assert_array_equal(bi, want_i)
        np.testing.assert_array_equal(bd, want_d)


def test_pack_rows_layout():
    rng = np.random.default_rng(14)
    A = rng.normal(size=(70, 5))
    shift = rng.normal(size=5)
    out = np.full(_fused.packed_shape(70 + 3, 5, _fused.W), np.nan, dtype=np.float32)
    norms, snorms = np.empty(70), np.empty(70)
    _fused.pack_rows(A, shift, 3, out, norms, snorms)   # rows 3 .. 72
    _fused.zero_padding(out, 73)
    rows = out.transpose(0, 2, 1).reshape(-1, 5)
    np.testing.assert_array_equal(rows[3:73], (A - shift).astype(np.float32))
    assert not rows[73:].any()
    np.testing.assert_allclose(norms, np.linalg.norm(A, axis=1), rtol=1e-14)
    np.testing.assert_allclose(snorms, np.linalg.norm(A - shift, axis=1), rtol=1e-14)


def test_float32_threshold_rounds_up():
    rng = np.random.default_rng(15)
    x = np.concatenate([rng.normal(size=2000) * 10.0 ** rng.integers(-40, 38, size=2000), [0.0, 1e-45, -1e-45,
                        np.inf, 3.4e38, -3.4e38, 1e39]])
    up = np.array([_fused._up32(v) for v in x])
    np.testing.assert_array_equal(up.astype(np.float32).astype(np.float64), up)  # float32 values
    assert (up >= x).all()
