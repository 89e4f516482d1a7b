"""The compiled host kernels of the forests (Numba) against the NumPy path they replace.

The forests must be the same trees bit for bit (``MPIML_RF_CPU_KERNEL=0`` grows
them with the NumPy path: ``bincount`` histograms and the whole-array split
search); each kernel is also checked alone against its NumPy twin: histograms,
split candidates (from a histogram, and fused with the build), the partition,
the bins.
"""

import numpy as np
import pytest
from sklearn.datasets import make_classification, make_regression

from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor
from mpiml.ensemble import _cpu_kernels as ck
from mpiml.ensemble._hist import apply_bins, bin_edges

pytestmark = pytest.mark.skipif(not ck.enabled(), reason="needs numba")

TREE_KEYS = ("tree_offsets_", "tree_feature_", "tree_threshold_", "tree_children_left_", "tree_value_",
             "tree_n_node_samples_", "tree_weighted_n_node_samples_", "tree_impurity_", "feature_importances_")


def _data(kind, n=2500):
    if kind == "classification":
        return make_classification(n_samples=n, n_features=10, n_informative=6, n_classes=3, random_state=0)
    return make_regression(n_samples=n, n_features=10, n_informative=6, noise=3.0, random_state=0)


@pytest.mark.parametrize("cls,kind,params,weighted", [
    (RandomForestClassifier, "classification", {}, False),
    (RandomForestClassifier, "classification", dict(max_features=None, max_depth=7), False),   # subtraction path
    (RandomForestClassifier, "classification", dict(min_samples_leaf=3, max_depth=8), False),
    (RandomForestClassifier, "classification", dict(class_weight="balanced", min_weight_fraction_leaf=0.01), True),
    (RandomForestClassifier, "classification", dict(criterion="entropy", max_depth=6), False),  # NumPy search
    (RandomForestRegressor, "regression", dict(max_depth=9), False),
    (RandomForestRegressor, "regression", dict(max_features=0.8, min_samples_leaf=2, max_depth=8), True),
])
def test_numba_forest_is_the_numpy_forest(monkeypatch, cls, kind, params, weighted):
    X, y = _data(kind)
    if params.get("class_weight"):
        X = np.round(X, 1)                    # ties and repeated values: thresholds between values present
    sw = np.random.default_rng(0).uniform(0.5, 2.0, X.shape[0]) if weighted else None
    fits = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("MPIML_RF_CPU_KERNEL", flag)
        fits[flag] = cls(n_estimators=4, random_state=0, **params).fit(X, y, sample_weight=sw)
    for key in TREE_KEYS:
        np.testing.assert_array_equal(getattr(fits["1"], key), getattr(fits["0"], key), err_msg=key)


@pytest.mark.parametrize("cls,kind,params", [
    (RandomForestClassifier, "classification", dict(min_impurity_decrease=2e-3, min_weight_fraction_leaf=0.005)),
    (RandomForestRegressor, "regression", dict(min_impurity_decrease=1.0, min_samples_split=6, max_depth=10)),
])
def test_compiled_level_decisions_are_numpys(monkeypatch, cls, kind, params):
    """A level's numbers and decisions compiled (``_cpu_jit``) or by NumPy (``MPIML_RF_DECIDE_KERNEL=0``): the
    same trees, bit for bit (signed zeros included)."""
    X, y = _data(kind)
    fits = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("MPIML_RF_DECIDE_KERNEL", flag)
        fits[flag] = cls(n_estimators=4, random_state=0, **params).fit(X, y)
    for key in TREE_KEYS:
        a, b = np.asarray(getattr(fits["1"], key)), np.asarray(getattr(fits["0"], key))
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), key


def test_constant_features_draw_further_with_the_kernels(monkeypatch):
    """Nodes whose drawn features are all constant take the next features in their order (the second pass)."""
    rng = np.random.default_rng(3)
    X = np.zeros((600, 6))
    X[:, 5] = rng.integers(0, 4, 600)
    X[:, 2] = rng.normal(size=600).round(1)
    y = (X[:, 5] > 1).astype(int)
    fits = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("MPIML_RF_CPU_KERNEL", flag)
        fits[flag] = RandomForestClassifier(n_estimators=3, max_features=1, random_state=0).fit(X, y)
    for key in TREE_KEYS:
        np.testing.assert_array_equal(getattr(fits["1"], key), getattr(fits["0"], key), err_msg=key)


def _histograms(rng, S, FH, B, K, D, max_rows=60):
    """Random integer-valued histograms (S, FH, B, C), every feature holding the same rows."""
    C = D + (K if K else 2)
    H = np.zeros((S, FH, B, C))
    for s in range(S):
        n = int(rng.integers(0, max_rows))
        bins = rng.integers(0, B, size=(n, FH))
        cls = rng.integers(0, max(K, 1), n)
        w = rng.integers(1, 4, n).astype(float)
        wy = rng.integers(-50, 50, n).astype(float)
        for f in range(FH):
            np.add.at(H[s, f], (bins[:, f], np.full(n, D) + (cls if K else 0)), w)
            if D:
                np.add.at(H[s, f], (bins[:, f], 0), 1.0)
            if not K:
                np.add.at(H[s, f], (bins[:, f], D + 1), wy)
    return H


class _Grower:
    """What :func:`mpiml.ensemble._split.dense_candidates` reads of a grower."""

    def __init__(self, K, D, msl, sw, sy):
        from types import SimpleNamespace

        self.xp, self.K, self.D, self.Q = np, K, D, 1
        self.s = SimpleNamespace(scales=(sw, sy, 1.0), criterion="gini", min_samples_leaf=msl)


@pytest.mark.parametrize("K", [0, 2, 3])
@pytest.mark.parametrize("D", [0, 1])
@pytest.mark.parametrize("with_mwl", [False, True])
def test_split_candidates_choose_the_array_search_split(K, D, with_mwl):
    from mpiml.ensemble._split import choose, dense_candidates

    rng = np.random.default_rng(10 * K + D + with_mwl)
    S, FH, m, B = 200, 6, 4, 19
    H = _histograms(rng, S, FH, B, K, D)
    tot = H[:, 0].sum(axis=1)
    fpos = np.stack([rng.permutation(FH)[:m] for _ in range(S)])
    mwl = rng.uniform(0, 4, S) if with_mwl else None
    sw, sy = (0.5, 0.25)
    got = choose(np, ck.split_candidates(H, fpos, tot, mwl, sw, sy, K, bool(D), 2))
    Hm = np.take_along_axis(H, fpos[:, :, None, None], axis=1)
    want = dense_candidates(_Grower(K, D, 2, sw, sy), Hm, tot, mwl)
    for name, a, b in zip(("val", "j", "b", "wl", "below", "above", "varying"), got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("K,threads", [(0, 1), (2, 1), (0, 8), (2, 8), (3, 64)])
def test_fused_candidates_equal_histogram_then_search(monkeypatch, K, threads):
    """Per-node buffers (bitmaps of occupied bins) = the histogram array's search; with several threads the
    big nodes are cut into parts summed apart (fused_parts), with the same results."""
    monkeypatch.setattr(ck, "thread_count", lambda: threads)
    monkeypatch.setattr(ck, "_MIN_PART", 64)
    rng = np.random.default_rng(K)
    n_rows, F, B = 3000, 7, 64
    Xb = rng.integers(0, B, size=(n_rows, F), dtype=np.uint8)
    y = rng.integers(0, max(K, 1), n_rows).astype(np.int64)
    lens = np.array([0, 1, 3, 15, 16, 17, 400, 2000, 5])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    row = np.sort(rng.integers(0, n_rows, int(lens.sum()))).astype(np.int32)
    w = rng.integers(1, 5, row.shape[0]).astype(np.float64)
    wy = None if K else rng.integers(-9, 9, row.shape[0]).astype(np.float64)
    fsel = np.stack([rng.permutation(F)[:4] for _ in lens])
    cols = np.ascontiguousarray(Xb.T)
    H = ck.build_histograms(cols, row, w, wy, y if K else None, starts, lens, fsel, B, K, False)
    tot = H[:, 0].sum(axis=1)
    fpos = np.broadcast_to(np.arange(4), fsel.shape)
    want = ck.split_candidates(H, fpos, tot, None, 1.0, 1.0, K, False, 1)
    got = ck.node_candidates(cols, row, w, wy, y if K else None, starts, lens, fsel, B, tot, None, 1.0, 1.0, K,
                             False, 1)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    big, first, p_start, p_len = ck._big_node_parts(starts, lens, threads, 4 * B * (K or 2) * 8)
    assert (len(big) > 0) == (threads > 1)         # the 2000-element node is cut at 8 threads and more
    for i, s in enumerate(big):                    # a big node's parts cover its elements once, in order
        assert p_start[first[i]] == starts[s] and p_len[first[i]:first[i + 1]].sum() == lens[s]
        assert np.all(p_start[first[i] + 1:first[i + 1]] == (p_start + p_len)[first[i]:first[i + 1] - 1])


def test_histograms_and_partition_equal_numpy():
    rng = np.random.default_rng(5)
    n_rows, F, B = 2000, 5, 32
    Xb = rng.integers(0, B, size=(n_rows, F), dtype=np.uint8)
    y = rng.integers(0, 3, n_rows).astype(np.int64)
    lens = np.array([700, 0, 1, 1299])
    starts = np.concatenate([[0], np.cumsum(lens)])
    row = rng.integers(0, n_rows, int(lens.sum())).astype(np.int32)
    w = rng.integers(1, 7, row.shape[0]).astype(np.float64)
    fsel = np.stack([rng.permutation(F)[:3] for _ in lens])
    cols = np.ascontiguousarray(Xb.T)
    H = ck.build_histograms(cols, row, w, None, y, starts[:-1], lens, fsel, B, 3, True)
    for i in range(len(lens)):
        r = row[starts[i]:starts[i + 1]]
        for j in range(3):
            b = Xb[r, fsel[i, j]]
            want = np.zeros((B, 4))
            np.add.at(want, (b, 0), 1.0)
            np.add.at(want, (b, 1 + y[r]), w[starts[i]:starts[i + 1]])
            np.testing.assert_array_equal(H[i, j], want)
    # partition: slot 2 is a leaf; left when the bin is <= the threshold bin, each side in its previous order
    feature, tbin = np.array([1, 3, -1, 0]), np.array([10, 5, 0, 20])
    wy = rng.normal(size=row.shape[0])
    (r2, w2, wy2, _), counts = ck.partition(cols, row, w, wy, wy * 2, starts, feature, tbin)
    parts_r, parts_w, parts_wy = [], [], []
    for i in range(len(lens)):
        if feature[i] < 0:
            continue
        sl = slice(starts[i], starts[i + 1])
        go = Xb[row[sl], feature[i]] <= tbin[i]
        for side in (go, ~go):
            parts_r.append(row[sl][side])
            parts_w.append(w[sl][side])
            parts_wy.append(wy[sl][side])
    np.testing.assert_array_equal(r2, np.concatenate(parts_r))
    np.testing.assert_array_equal(w2, np.concatenate(parts_w))
    np.testing.assert_array_equal(wy2, np.concatenate(parts_wy))
    assert counts.shape == (3, 2) and counts.sum() == sum(len(p) for p in parts_r)


def test_bins_equal_the_sort_and_searchsorted_definition():
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.normal(size=3000), rng.integers(0, 7, 3000), np.full(3000, 2.5),
                         rng.normal(size=3000).astype(np.float32)]).astype(np.float64)
    for max_bins in (5, 255):
        edges, values = bin_edges(X, max_bins, exact=True)
        for j in range(X.shape[1]):
            uniq = np.unique(X[:, j])
            if len(uniq) <= max_bins:
                np.testing.assert_array_equal(values[j], uniq)
            else:
                assert values[j] is None and len(edges[j]) <= max_bins - 1
        Xb = apply_bins(X, edges, np)
        want = np.column_stack([np.searchsorted(edges[j], X[:, j], side="left") for j in range(X.shape[1])])
        np.testing.assert_array_equal(Xb, want)
        assert Xb.dtype == np.uint8


def test_thread_count_is_the_rank_limit():
    # one limit for every CPU kernel of a rank (mpiml.utils._threads), applied to Numba's pool when a
    # kernel runs; under mpiexec: tests/utils/test_threads.py
    import numba

    from mpiml.utils._threads import numba_threads

    ck.apply_bins(np.zeros((4, 2)), [np.array([0.5]), np.array([0.5])], np.uint8)
    want = numba_threads() or numba.get_num_threads()
    assert ck.thread_count() == want
    assert numba.get_num_threads() == want

def test_node_chunks_cover_every_node_once_by_work():
    # the fused search's chunks: contiguous, every node once, the big nodes spread over several chunks
    lens = np.array([5000, 1, 2, 3] * 50 + [4000] * 3, dtype=np.int64)
    bounds = ck._chunks_of_equal_work(lens, 256, len(lens))
    assert bounds[0] == 0 and bounds[-1] == len(lens) and np.all(np.diff(bounds) > 0)
    big = np.nonzero(lens >= 4000)[0]
    assert len(np.unique(np.searchsorted(bounds, big, side="right"))) == len(big)


def test_sort_rows_in_threads_is_numpy_sort(monkeypatch):
    # the bin edges' per-feature sort spread over the rank's threads: NumPy's result, NaN last, signed zeros kept
    monkeypatch.setattr(ck, "thread_count", lambda: 4)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(9, 20000))
    a[1, ::7] = np.nan
    a[2, ::3], a[2, 1::3] = -0.0, 0.0
    a[3, ::5], a[3, 1::5] = np.inf, -np.inf
    want = np.sort(a, axis=1)
    got = ck.sort_rows(a.copy())
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_sorted_columns_are_the_sorted_transpose(monkeypatch):
    monkeypatch.setattr(ck, "thread_count", lambda: 3)
    rng = np.random.default_rng(1)
    sample = rng.normal(size=(70001, 5))
    sample[::9, 2] = np.nan
    got = ck.sorted_columns(sample)
    np.testing.assert_array_equal(got, np.sort(sample.T, axis=1))
    assert got.flags.c_contiguous and not np.shares_memory(got, sample)


def test_forest_with_threads_is_the_one_thread_forest(monkeypatch):
    # a rank of several threads grows its trees in threads, each with the kernels on itself (and draws scikit-
    # learn's bootstrap in a pool): the same trees as one thread; constant features make nodes draw further
    # features (histograms built in the thread), min_samples_leaf > 1 the row-count channel, the regressor the
    # squared error, unlimited depth the leaf rules
    from sklearn.datasets import make_classification, make_regression

    from mpiml.ensemble import RandomForestClassifier, RandomForestRegressor

    X, y = make_classification(n_samples=1500, n_features=10, n_informative=5, random_state=3)
    X[:, 7:] = 1.0
    Xr, yr = make_regression(n_samples=1200, n_features=8, n_informative=5, random_state=4)
    fits = [(RandomForestClassifier, dict(n_estimators=7, max_depth=7, random_state=0), X, y),
            (RandomForestClassifier, dict(n_estimators=5, min_samples_leaf=3, random_state=1), X, y),
            (RandomForestRegressor, dict(n_estimators=5, max_depth=9, random_state=2), Xr, yr)]
    for cls, params, Xf, yf in fits:
        monkeypatch.setattr(ck, "thread_count", lambda: 1)
        one = cls(**params).fit(Xf, yf)
        monkeypatch.setattr(ck, "thread_count", lambda: 3)
        many = cls(**params).fit(Xf, yf)
        assert many._fit_stats.get("tree_threads") == 3
        for key in ("tree_feature_", "tree_threshold_", "tree_value_", "tree_offsets_"):
            np.testing.assert_array_equal(getattr(many, key), getattr(one, key), err_msg=f"{cls.__name__} {key}")
