"""The k-means kernel family (``mpiml.kernels.kmeans``) against NumPy float64 references.

Shapes cover odd d and k, k = 1, d = 1, tiles of d and k, non-contiguous input, float32 and
float64, empty inputs and exact ties.  GPU host only (skipped elsewhere).
"""

import os

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 1), (7, 1, 3), (1000, 3, 5), (513, 1, 1), (5000, 17, 40), (4097, 64, 64), (3000, 33, 12),
          (3000, 100, 300), (2000, 8, 1024), (700, 1030, 7), (900, 16, 16), (300, 5, 4100)]


def _data(n, d, k, dtype, seed=0):
    rs = np.random.RandomState(seed)
    X = (rs.randn(n, d) + 3 * rs.randint(0, 5, size=(n, 1))).astype(dtype)
    C = (X[rs.choice(n, k, replace=k > n)] + 0.1 * rs.randn(k, d)).astype(dtype)
    return X, C


def _ref_sq(X, C):
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    return ((X64[:, None, :] - C64[None, :, :]) ** 2).sum(-1) if X.size * C.shape[0] < 3e7 else \
        np.maximum((X64 ** 2).sum(1)[:, None] + (C64 ** 2).sum(1)[None, :] - 2 * X64 @ C64.T, 0)


def _near_tie_ok(D, got, want, rtol):
    """Labels may differ only where the two distances are equal within rounding."""
    bad = got != want
    if not bad.any():
        return True
    rows = np.nonzero(bad)[0]
    a, b = D[rows, got[rows]], D[rows, want[rows]]
    return bool(np.all(np.abs(a - b) <= rtol * np.maximum(np.abs(b), 1e-30) + 1e-12))


def _method_tile(method, k, d, dtype):
    """(method, tile) of a test's method name; "small_simt" is the small kernel without its tensor-core form
    (the default for float32 where it fits), "small_tc" with it."""
    if method.startswith("small") and (k > 32 or d > 32):
        pytest.skip("the small kernel takes k, d <= 32")
    if method == "small_tc":
        from mpiml.kernels import kmeans

        if not kmeans._small._small_tc_fits(dtype, k, d):
            pytest.skip("the tensor-core small kernel takes float32, padded k x d <= _SMALL_TC_CELLS")
        return "small", (None, None, None, True)
    if method == "small_simt":
        return "small", (None, None, None, False)
    return method, None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["fused", "gemm", "tc", "small_simt", "small_tc"])
@pytest.mark.parametrize("n,d,k", SHAPES)
def test_argmin_matches_reference(n, d, k, dtype, method):
    import cupy as cp

    from mpiml.kernels import kmeans

    method, tile = _method_tile(method, k, d, dtype)
    X, C = _data(n, d, k, dtype)
    D = _ref_sq(X, C)
    want = np.argmin(D, axis=1)
    lab, dist = kmeans.argmin_sqeuclidean(cp.asarray(X), cp.asarray(C), method=method, tile=tile)
    lab, dist = lab.get(), dist.get()
    assert lab.dtype == np.int32 and dist.dtype == dtype
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert _near_tie_ok(D, lab, want, rtol)
    # the expansion |x|^2 - 2 x.c + |c|^2 loses digits relative to |x|^2 + |c|^2, not to the distance
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    scale = (X64 ** 2).sum(1) + (C64[lab] ** 2).sum(1) + 1e-30
    eps = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_array_less(np.abs(dist - D[np.arange(n), lab]) / scale, eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("accum,method", [("double", "fused"), ("float", "fused"), (None, "gemm"), (None, "tc"),
                                          (None, "small_simt"), (None, "small_tc"), ("unit", "small_tc")])
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (1000, 3, 5), (5000, 17, 40), (4097, 64, 64), (3000, 100, 300),
                                   (2000, 8, 1024), (700, 1030, 7), (20000, 16, 16), (70001, 16, 16),
                                   (9001, 32, 32), (6000, 30, 17), (4099, 12, 9), (3000, 32, 8), (2500, 7, 30)])
def test_lloyd_step_matches_reference(n, d, k, dtype, accum, method):
    import cupy as cp

    from mpiml.kernels import kmeans

    method, tile = _method_tile(method, k, d, dtype)
    X, C = _data(n, d, k, dtype, seed=1)
    rs = np.random.RandomState(2)
    # "unit": unit weights (the tensor-core small kernel skips the small parts of TF32-exact weights)
    w = np.ones(n, dtype) if accum == "unit" else rs.uniform(0.5, 2, n).astype(dtype)
    accum = None if accum == "unit" else accum
    shift = X.mean(0).astype(dtype)
    Cs = (C - shift).astype(dtype)
    if tile is not None:
        lab = cp.full(n, -1, cp.int32)
        out = kmeans.lloyd_step_packed(cp.asarray(X), cp.asarray(Cs), cp.asarray(w), shift=cp.asarray(shift),
                                          labels=lab, method=method, tile=tile)
        sums, counts, inertia = out[:k * d].reshape(k, d), out[k * d:k * d + k], float(out[-2])
        # the arg-min form of the same kernel computes the same distances
        alab = kmeans.argmin_sqeuclidean(cp.asarray(X), cp.asarray(Cs), shift=cp.asarray(shift), method=method,
                                            tile=tile)[0]
        assert bool((alab == lab).all())
    else:
        sums, counts, inertia, lab = kmeans.lloyd_step(cp.asarray(X), cp.asarray(Cs), cp.asarray(w),
                                                          shift=cp.asarray(shift), accum=accum, method=method)
    lab = lab.get()
    D = _ref_sq(X, C)
    want = np.argmin(D, axis=1)
    rtol = 1e-4 if dtype == np.float32 else 1e-10
    assert _near_tie_ok(D, lab, want, rtol)
    # sums and counts of the kernel's own labels, in float64
    Xs = X.astype(np.float64) - shift.astype(np.float64)
    ref_sums = np.zeros((k, d))
    np.add.at(ref_sums, lab, Xs * w[:, None].astype(np.float64))
    ref_counts = np.bincount(lab, weights=w.astype(np.float64), minlength=k)
    ref_inertia = float(w.astype(np.float64) @ D[np.arange(n), lab])
    tol = 1e-12 if dtype == np.float64 and accum != "float" else 2e-6
    np.testing.assert_allclose(counts.get(), ref_counts, rtol=tol, atol=tol * ref_counts.max())
    np.testing.assert_allclose(sums.get(), ref_sums, rtol=0, atol=max(tol, 1e-7) * np.abs(Xs).sum(0).max() / 10 + 1e-6)
    assert abs(inertia - ref_inertia) <= (1e-5 if dtype == np.float32 else 1e-11) * ref_inertia


@pytest.mark.parametrize("method", ["small_tc", "small_simt", "tc", "fused"])
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (511, 16, 16), (70001, 16, 16), (4099, 12, 9), (3000, 32, 8),
                                   (2500, 7, 30)])
def test_lloyd_step_without_weights_or_distances(n, d, k, method):
    """A Lloyd step given no weights (unit weights: the tensor-core small kernel then reads none, and rows past
    n of a partial tile add nothing) and no distance buffer (it writes none) returns the bits of the same
    step given a vector of ones and a buffer; labels in place alike.  Given a buffer but no weights, it fills
    the buffer with the distances the weighted form writes."""
    import cupy as cp

    from mpiml.kernels import kmeans

    dtype = np.float32
    method, tile = _method_tile(method, k, d, dtype)
    X, C = _data(n, d, k, dtype, seed=4)
    Xd, Cd = cp.asarray(X), cp.asarray(C)
    shift = cp.asarray(X.mean(0).astype(dtype))
    if tile is not None and tile[3]:
        unit = kmeans.small_plan(dtype, k, d, unit=True)
        assert unit["expr"].startswith("mpiml_distances_small_tc<") and ", 2, " in unit["expr"]  # MODE 2
        tile = (None, unit["R"], None, True)     # the weighted step in the same tiles (the same order of adds)
    old = cp.asarray(np.random.RandomState(5).randint(-1, k, n).astype(np.int32))
    runs = []
    for w, mind in ((cp.ones(n, dtype), cp.full(n, -7, dtype)), (None, None), (None, cp.full(n, -7, dtype))):
        labels = old.copy()
        p = kmeans.lloyd_step_packed(Xd, Cd - shift, w, shift=shift, labels=labels, mind=mind, method=method,
                                        tile=tile)
        runs.append((p.get(), labels.get(), None if mind is None else mind.get()))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    np.testing.assert_array_equal(runs[0][0], runs[2][0])
    np.testing.assert_array_equal(runs[0][1], runs[2][1])
    np.testing.assert_array_equal(runs[0][2], runs[2][2])
    # the counts are the labels' and the distances those the buffer got
    np.testing.assert_array_equal(runs[1][0][k * d:k * d + k], np.bincount(runs[1][1], minlength=k))
    assert runs[1][0][-1] == np.count_nonzero(runs[1][1] != old.get())
    assert (runs[0][2] >= 0).all()
    assert abs(runs[0][2].astype(np.float64).sum() - runs[1][0][-2]) <= 1e-5 * runs[1][0][-2] + 1e-30


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(5003, 16, 16), (3001, 3, 5), (2000, 9, 1), (2000, 32, 8)])
def test_small_kernel_centres_as_parameters_or_shared(n, d, k, dtype):
    """The small kernel reads its centres from its parameters (host or device centres) or from shared memory:
    the same labels, sums within rounding, and host and device centres give the same bits (the tensor-core form
    reads device centres from memory and sums their norms itself).  Its tensor-core
    form (float32, the default there) against it: labels up to near ties, sums and weights within rounding."""
    import cupy as cp

    from mpiml.kernels import kmeans

    X, C = _data(n, d, k, dtype, seed=9)
    Xd = cp.asarray(X)
    out = {}
    runs = [("host", C, (None, None, None, False)), ("device", cp.asarray(C), (None, None, None, False)),
            ("shared", C, (2, 1, False))]
    if dtype == np.float32:
        assert kmeans.small_plan(dtype, k, d).get("tc")
        runs += [("tc_host", C, None), ("tc_device", cp.asarray(C), None)]
    for name, Cx, tile in runs:
        labels = cp.full(n, -1, cp.int32)
        p = kmeans.lloyd_step_packed(Xd, Cx, labels=labels, method="small", tile=tile)
        lab, dist = kmeans.argmin_sqeuclidean(Xd, Cx, method="small", tile=tile)
        assert bool((lab == labels).all())
        out[name] = (p.get(), labels.get(), dist.get())
    assert kmeans.small_plan(dtype, k, d)["PC"]
    np.testing.assert_array_equal(out["host"][0], out["device"][0])
    np.testing.assert_array_equal(out["host"][1], out["shared"][1])
    np.testing.assert_allclose(out["host"][0], out["shared"][0], rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-6 * np.abs(out["host"][0]).max())
    D = _ref_sq(X, C)
    assert _near_tie_ok(D, out["host"][1], np.argmin(D, 1), 1e-4 if dtype == np.float32 else 1e-10)
    if dtype == np.float32:
        np.testing.assert_array_equal(out["tc_host"][0], out["tc_device"][0])
        assert _near_tie_ok(D, out["tc_host"][1], out["host"][1], 1e-4)
        if (out["tc_host"][1] == out["host"][1]).all():
            np.testing.assert_allclose(out["tc_host"][0][:-1], out["host"][0][:-1], rtol=1e-5,
                                       atol=1e-6 * np.abs(out["host"][0]).max())
        # distances within the rounding of |x|^2 - 2 x.c + |c|^2 (relative to |x|^2 + |c|^2, as above)
        lab = out["tc_host"][1]
        scale = (X.astype(np.float64) ** 2).sum(1) + (C.astype(np.float64)[lab] ** 2).sum(1) + 1e-30
        np.testing.assert_array_less(np.abs(out["tc_host"][2] - D[np.arange(n), lab]) / scale, 1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_kernel_constant_bank_across_streams_and_threads(dtype):
    """Device centres reach the SIMT small kernel through one constant bank per instantiation, filled by a
    queued copy: steps queued on two streams with different centres, none waited for in between, and steps
    from two threads on their own streams, each give the bits of the same step with host centres (the
    parameters)."""
    import threading

    import cupy as cp

    from mpiml.kernels import kmeans

    n, d, k = 60000, 16, 16
    X, _ = _data(n, d, k, dtype, seed=3)
    Xd = cp.asarray(X)
    Cs = [_data(n, d, k, dtype, seed=s)[1] for s in range(6)]
    tile = (None, None, None, False)
    assert kmeans.small_plan(dtype, k, d, tc=False)["PC"]

    def step(C):
        return kmeans.lloyd_step_packed(Xd, C, labels=cp.full(n, -1, cp.int32), method="small", tile=tile)

    want = [step(C).get() for C in Cs]                     # host centres: the parameters
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    Cd = [cp.asarray(C) for C in Cs]
    cp.cuda.Device().synchronize()
    got = []
    for i, C in enumerate(Cd):                             # alternating streams, no wait in between
        with streams[i % 2]:
            got.append(step(C))
    cp.cuda.Device().synchronize()
    for i in range(len(Cs)):
        np.testing.assert_array_equal(got[i].get(), want[i])

    errors = []

    def worker(first):
        try:
            with cp.cuda.Stream(non_blocking=True) as s:
                outs = [(i, step(Cd[i])) for i in range(first, len(Cs), 2) for _ in range(3)]
                s.synchronize()
            for i, o in outs:
                np.testing.assert_array_equal(o.get(), want[i])
        except Exception as e:                             # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (64, 64), (1024, 256), (3, 1030)])
def test_lloyd_update_is_the_host_update(k, d, dtype):
    """The centres' update on the device (``lloyd_update``): the host update's centres bit for bit (a cluster
    of no weight keeps its centre), its squared shift within rounding, the inertia and changed labels passed
    on, the empty clusters counted; a second launch gives the same bits (its last-block ticket was reset), its
    scalars written to pinned host memory."""
    import cupy as cp
    import cupyx

    from mpiml.cluster._kmeans import _centre_update
    from mpiml.kernels import kmeans

    rs = np.random.RandomState(k + d)
    C = rs.randn(k, d).astype(dtype)
    counts = rs.randint(0, 50, size=k).astype(np.float64)
    counts[::3] = 0
    packed = np.concatenate([(rs.randn(k, d) * counts[:, None] * 1.7).ravel(), counts, [123.25, 17.0]])
    new, shift = _centre_update(packed[:k * d].reshape(k, d), counts, C.astype(np.float64))
    runs = []
    for host in (False, True):                   # the scalars to device memory, then to pinned host memory
        tail = cupyx.empty_pinned(4, dtype=np.float64) if host else None
        got, tail = kmeans.lloyd_update(cp.asarray(packed), cp.asarray(C), tail=tail)
        cp.cuda.get_current_stream().synchronize()
        assert got.dtype == dtype and got.shape == (k, d) and isinstance(tail, np.ndarray) == host
        runs.append((got.get(), tail.copy() if host else tail.get()))
    np.testing.assert_array_equal(runs[0][0], new.astype(dtype))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    tail = runs[0][1]
    assert tail[0] == 123.25 and tail[1] == 17.0 and tail[3] == (counts == 0).sum()
    np.testing.assert_allclose(tail[2], float(shift), rtol=1e-12)
    with pytest.raises(ValueError, match="k\\*d \\+ k \\+ 2"):
        kmeans.lloyd_update(cp.zeros(k * d + k, dtype=cp.float64), cp.asarray(C))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, k", [(0, 3), (1, 1), (16383, 7), (16385, 64), (70001, 64), (200003, 33), (50000, 1)])
def test_step_totals_pass(n, k, dtype):
    """Weights per cluster, inertia and changed labels of a step from the arg-min kernel's output (the
    float32 tensor-core path): against float64, unit weights exact, the new labels in place, the same bits
    twice."""
    import cupy as cp

    from mpiml.kernels import kmeans

    rs = np.random.RandomState(n + k)
    lab = rs.randint(0, k, n).astype(np.int32)
    old = np.where(rs.rand(n) < 0.3, rs.randint(-1, k, n), lab).astype(np.int32)
    w = rs.uniform(0.5, 2, n).astype(dtype)
    md = rs.uniform(0, 10, n).astype(dtype)
    runs = []
    for _ in range(2):
        labels = cp.asarray(old)
        got = cp.zeros(k + 2)
        kmeans._tc._step_totals(cp.asarray(lab), labels, cp.asarray(w), cp.asarray(md), k, got, dtype)
        np.testing.assert_array_equal(labels.get(), lab)
        runs.append(got.get())
    got = runs[0]
    assert (runs[0] == runs[1]).all()
    want = np.bincount(lab, weights=w.astype(np.float64), minlength=k)
    np.testing.assert_allclose(got[:k], want, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-12)
    inertia = float(w.astype(np.float64) @ md.astype(np.float64))
    assert abs(got[k] - inertia) <= 1e-12 * max(inertia, 1.0)
    assert int(got[k + 1]) == int((old != lab).sum())
    ones = cp.full(k + 2, 0.5)              # unit weights (no array), added to what out holds
    kmeans._tc._step_totals(cp.asarray(lab), cp.asarray(old), None, cp.asarray(md), k, ones, dtype)
    np.testing.assert_array_equal(ones.get()[:k], np.bincount(lab, minlength=k) + 0.5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lloyd_packed_changed_and_labels_in_place(dtype):
    import cupy as cp

    from mpiml.kernels import kmeans

    X, C = _data(3001, 9, 11, dtype, seed=3)
    Xd, Cd = cp.asarray(X), cp.asarray(C)
    labels = cp.full(3001, -1, cp.int32)
    mind = cp.empty(3001, dtype)
    p1 = kmeans.lloyd_step_packed(Xd, Cd, labels=labels, mind=mind)
    assert int(p1[-1].get()) == 3001                       # every label changed from -1
    ref_lab, ref_d = kmeans.argmin_sqeuclidean(Xd, Cd)
    # the expansion |x|^2 - 2 x.c + |c|^2 rounds differently in each kernel family (float32: ~1e-5 of |x|^2)
    assert bool((labels == ref_lab).all()) and bool(cp.allclose(mind, ref_d, rtol=1e-4 if dtype == np.float32 else 1e-5,
                                                                 atol=1e-4 * float(ref_d.max())))
    p2 = kmeans.lloyd_step_packed(Xd, Cd, labels=labels, mind=mind)
    assert int(p2[-1].get()) == 0                          # same centres: nothing changed
    assert bool(cp.array_equal(p1[:-1], p2[:-1]))          # deterministic: the same bits twice
    labels[:] = -1
    p3 = kmeans.lloyd_step_packed(Xd, Cd, labels=labels, mind=mind, method="gemm")
    assert int(p3[-1].get()) == 3001 and bool((labels == ref_lab).all())
    assert bool(cp.allclose(p3[:-1], p1[:-1], rtol=1e-5 if dtype == np.float32 else 1e-12))
    for method in ("fused", "tc", "small"):
        labels[:] = -1
        p4 = kmeans.lloyd_step_packed(Xd, Cd, labels=labels, mind=mind, method=method)
        assert int(p4[-1].get()) == 3001 and bool((labels == ref_lab).all())
        assert bool(cp.allclose(p4[:-1], p1[:-1], rtol=1e-5 if dtype == np.float32 else 1e-12))
        p5 = kmeans.lloyd_step_packed(Xd, Cd, labels=labels, mind=mind, method=method)
        assert bool(cp.array_equal(p4[:-2], p5[:-2]))      # the same sums, weights and inertia bits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,d,bn,dk", [(1, 1, 16, 16), (70, 65, 64, 32), (64, 64, 64, 64), (5, 17, 16, 16)])
def test_tc_pack_kernel_matches_numpy(k, d, bn, dk, dtype):
    import cupy as cp

    from mpiml.kernels import kmeans

    C = np.random.RandomState(8).randn(k, d).astype(dtype) * 7
    plan = kmeans.tc_plan(dtype, k, d, tile=(2, bn, dk))
    Cd = cp.asarray(C)
    nJ, nF = plan["nJ"], plan["nF"]
    Cp = cp.empty(nJ * nF * dk * bn * (2 if dtype == np.float32 else 1), dtype=dtype)
    c_sq = cp.empty(nJ * bn, dtype=dtype)
    pack = kmeans._common._function(plan["pack"])
    pack((4,), (256,), (Cd, np.int32(k), np.int32(d), np.int32(nJ), np.int32(nF), Cp, c_sq))
    np.testing.assert_array_equal(Cp.get(), kmeans.pack_centres(C, bn, dk, np))
    want = np.full(nJ * bn, np.inf)
    want[:k] = (C.astype(np.float64) ** 2).sum(1)
    np.testing.assert_allclose(c_sq.get(), want, rtol=1e-5 if dtype == np.float32 else 1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k,tile", [(70001, 64, 64, None), (70001, 64, 64, (1, 64, 64)), (30011, 16, 16, None),
                                        (20000, 256, 200, None), (5000, 1024, 64, None), (9000, 64, 65, None),
                                        (9000, 65, 64, None), (4000, 2, 1, None), (4000, 1, 7, (1, 16, 16)),
                                        (30011, 16, 16, (4, 16, 16, 1)), (3001, 9, 3, (2, 16, 16, 1)),
                                        (70001, 64, 64, (1, 64, 64, 2)), (9000, 40, 100, None),
                                        (30011, 16, 16, (2, 16, 16, 4)), (30011, 16, 16, (2, 16, 16, 2, 3)),
                                        (9000, 40, 100, (2, 64, 32, 1, 3)), (4097, 64, 64, (1, 64, 64, 1, 4))])
@pytest.mark.parametrize("accum", ["smem", "mma", "pass", "pass-mma", "pass-label"])
def test_tc_lloyd_against_float64(n, d, k, tile, dtype, accum):
    """The tensor-core step (fused sums, sums pass, several chunks of d and k, other tiles) against float64,
    with data away from the origin (the shift matters) and float32 labels checked except at near ties."""
    import cupy as cp

    from mpiml.kernels import kmeans

    rs = np.random.RandomState(7)
    Ctrue = rs.randn(k, d) * 3 + 50.0
    X = (Ctrue[rs.randint(0, k, n)] + rs.randn(n, d)).astype(dtype)
    C = (X[rs.choice(n, k, replace=False)]).astype(dtype)
    w = rs.uniform(0.5, 2, n).astype(dtype)
    shift = X.mean(0).astype(dtype)
    Cs = (C - shift).astype(dtype)
    Xd = cp.asarray(X)
    labels = cp.full(n, -1, cp.int32)
    mind = cp.empty(n, dtype)
    out = cp.zeros(k * d + k + 2)
    # "pass": the SIMT sums pass, "pass-mma": the one-hot sums pass on the tensor cores, "pass-label": the
    # SIMT family's column pass
    plan = kmeans._tc._tc_launch(Xd, cp.asarray(Cs), cp.asarray(shift), cp.asarray(w), labels, mind, out,
                                lloyd=True, tile=tile, accum=accum.split("-")[0],
                                sums=accum.split("-")[1] if "-" in accum else "simt")
    lab = labels.get()
    X64 = X.astype(np.float64) - shift.astype(np.float64)
    C64 = Cs.astype(np.float64)
    D = np.maximum((X64 ** 2).sum(1)[:, None] + (C64 ** 2).sum(1)[None, :] - 2 * X64 @ C64.T, 0)
    want = np.argmin(D, 1)
    assert _near_tie_ok(D, lab, want, 1e-4 if dtype == np.float32 else 1e-10), plan
    if dtype == np.float32:
        assert float((lab == want).mean()) > 0.999
    ref_sums = np.zeros((k, d))
    np.add.at(ref_sums, lab, X64 * w[:, None].astype(np.float64))
    got = out.get()
    scale = np.abs(X64 * w[:, None]).sum(0).max()
    tol = 1e-6 if dtype == np.float32 else 1e-12
    assert np.abs(got[:k * d].reshape(k, d) - ref_sums).max() <= tol * scale, plan
    ref_counts = np.bincount(lab, weights=w.astype(np.float64), minlength=k)
    np.testing.assert_allclose(got[k * d:k * d + k], ref_counts, rtol=tol, atol=tol * ref_counts.max())
    ref_inertia = float(w.astype(np.float64) @ D[np.arange(n), lab])
    assert abs(got[-2] - ref_inertia) <= (1e-5 if dtype == np.float32 else 1e-10) * ref_inertia, plan
    assert int(got[-1]) == n
    md = mind.get().astype(np.float64)
    np.testing.assert_allclose(md, D[np.arange(n), lab], rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=(1e-4 if dtype == np.float32 else 1e-10) * float(D.max()))


def test_non_contiguous_and_mixed_dtypes():
    import cupy as cp

    from mpiml.kernels import kmeans

    X, C = _data(2000, 24, 13, np.float64, seed=4)
    Xd = cp.asarray(X)
    Xv = Xd[::2, ::3]                                      # strided rows and columns
    Cv = cp.asarray(C[:, ::3]).astype(cp.float32)          # cast to float64 by the wrapper
    lab, dist = kmeans.argmin_sqeuclidean(Xv, Cv)
    D = _ref_sq(X[::2, ::3], C[:, ::3].astype(np.float32).astype(np.float64))
    assert _near_tie_ok(D, lab.get(), np.argmin(D, 1), 1e-10)
    Xf = cp.asfortranarray(Xd)
    lab2, _ = kmeans.argmin_sqeuclidean(Xf, cp.asarray(C))
    lab3, _ = kmeans.argmin_sqeuclidean(Xd, cp.asarray(C))
    assert bool((lab2 == lab3).all())


def test_unaligned_rows_take_scalar_loads():
    import cupy as cp

    from mpiml.kernels import kmeans

    X, C = _data(1001, 8, 6, np.float32, seed=5)
    buf = cp.zeros(X.size + 1, dtype=cp.float32)
    buf[1:] = cp.asarray(X).ravel()
    Xu = buf[1:].reshape(X.shape)                          # contiguous, 4 bytes past a 16-byte boundary
    assert Xu.data.ptr % 16 != 0
    lab, _ = kmeans.argmin_sqeuclidean(Xu, cp.asarray(C))
    D = _ref_sq(X, C)
    assert _near_tie_ok(D, lab.get(), np.argmin(D, 1), 1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_inputs(dtype):
    import cupy as cp

    from mpiml.kernels import kmeans

    X = cp.empty((0, 5), dtype=dtype)
    C = cp.ones((3, 5), dtype=dtype)
    lab, dist = kmeans.argmin_sqeuclidean(X, C)
    assert lab.shape == (0,) and dist.shape == (0,)
    sums, counts, inertia, lab = kmeans.lloyd_step(X, C)
    assert sums.shape == (3, 5) and float(abs(sums).sum()) == 0 and float(counts.sum()) == 0 and inertia == 0
    assert kmeans.pairwise_distances(X, C).shape == (0, 3)


def test_ties_go_to_the_lower_index():
    import cupy as cp

    from mpiml.kernels import kmeans

    # every row is exactly as far from centres 2j and 2j+1 (mirror images): the lower wins
    rs = np.random.RandomState(6)
    k, d = 200, 6
    base = rs.randint(-4, 5, size=(k // 2, d)).astype(np.float64)
    off = np.zeros(d)
    off[0] = 1.0
    C = np.empty((k, d))
    C[0::2], C[1::2] = base - off, base + off
    X = np.repeat(base, 7, axis=0)                         # rows at the midpoints, integers: exact
    for dtype in (np.float32, np.float64):
        lab, dist = kmeans.argmin_sqeuclidean(cp.asarray(X.astype(dtype)), cp.asarray(C.astype(dtype)))
        want = np.argmin(_ref_sq(X, C), axis=1)            # numpy also takes the first minimum
        assert bool((lab.get() == want).all())
        assert bool((lab.get() % 2 == 0).all())


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,m,d", [(1, 1, 1), (300, 517, 3), (129, 1000, 70), (64, 4100, 16), (10, 20, 1030)])
def test_pairwise_matches_reference(metric, dtype, n, m, d):
    import cupy as cp

    from mpiml.kernels import kmeans

    rs = np.random.RandomState(7)
    X = rs.randn(n, d).astype(dtype)
    Y = rs.randn(m, d).astype(dtype)
    Y[0] = 0                                               # a zero row (cosine: distance 1)
    got = kmeans.pairwise_distances(cp.asarray(X), cp.asarray(Y), metric=metric).get()
    X64, Y64 = X.astype(np.float64), Y.astype(np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        ref = _ref_sq(X, Y)
        if metric == "euclidean":
            ref = np.sqrt(ref)
    elif metric == "inner_product":
        ref = -X64 @ Y64.T
    else:
        nx = np.linalg.norm(X64, axis=1)[:, None]
        ny = np.linalg.norm(Y64, axis=1)[None, :]
        ref = 1 - (X64 @ Y64.T) / np.where(nx * ny > 0, nx * ny, np.inf)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    scale = np.abs(ref).max() + 1
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale * (10 if metric == "euclidean" else 1))


@pytest.mark.parametrize("metric", ["sqeuclidean", "inner_product", "cosine"])
def test_topk_like_brute_force_with_ties(metric):
    import cupy as cp

    from mpiml.kernels import kmeans

    rs = np.random.RandomState(8)
    X = rs.randint(-3, 4, size=(3000, 5)).astype(np.float64)  # many exact ties
    Q = rs.randint(-3, 4, size=(77, 5)).astype(np.float64)
    dist, idx = kmeans.topk(cp.asarray(Q), cp.asarray(X), 25, metric=metric, block_bytes=1 << 20)
    if metric == "sqeuclidean":
        D = _ref_sq(Q, X)
    elif metric == "inner_product":
        D = -Q @ X.T
    else:
        D = 1 - (Q @ X.T) / np.maximum(np.linalg.norm(Q, axis=1)[:, None] * np.linalg.norm(X, axis=1)[None, :],
                                       1e-300)
    order = np.argsort(D, axis=1, kind="stable")[:, :25]
    want_d = np.take_along_axis(D, order, axis=1)
    np.testing.assert_allclose(dist.get(), want_d, atol=1e-9)
    if metric != "cosine":                                 # cosine of integers is not exact: ties blur
        np.testing.assert_array_equal(idx.get(), order)


def test_errors():
    import cupy as cp

    from mpiml.kernels import kmeans

    with pytest.raises(TypeError, match="float32 or float64"):
        kmeans.argmin_sqeuclidean(cp.ones((3, 2), cp.int32), cp.ones((1, 2), cp.int32))
    with pytest.raises(ValueError, match="features"):
        kmeans.argmin_sqeuclidean(cp.ones((3, 2)), cp.ones((1, 3)))
    with pytest.raises(ValueError, match="method"):
        kmeans.argmin_sqeuclidean(cp.ones((3, 2)), cp.ones((1, 2)), method="blas")
    os.environ["MPIML_DISTANCES_METHOD"] = "blas"
    try:
        with pytest.raises(ValueError, match="MPIML_DISTANCES_METHOD"):
            kmeans.argmin_sqeuclidean(cp.ones((3, 2)), cp.ones((1, 2)))
    finally:
        del os.environ["MPIML_DISTANCES_METHOD"]
    with pytest.raises(ValueError, match="small"):
        kmeans.argmin_sqeuclidean(cp.ones((3, 40)), cp.ones((1, 40)), method="small")
    with pytest.raises(ValueError, match="unknown metric"):
        kmeans.pairwise_distances(cp.ones((3, 2)), cp.ones((1, 2)), metric="manhattan")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_lloyd_step_spmd_with_empty_shard(mpi, n):
    mpi(os.path.join(HERE, "kmeans_kernels_spmd_script.py"), n, timeout=240)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["simt", "simt64", "mma"])
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 33, 5), (20011, 64, 64), (5000, 65, 100), (3000, 1030, 7),
                                   (777, 6, 300), (300007, 8, 3)])
def test_sums_pass_matches_float64_and_repeats_its_bits(n, d, k, dtype, kind):
    """The sums passes alone: partial tiles of rows, a partial last slab of features, several cluster ranges
    (k = 300 > the clusters of one SIMT block), empty clusters, float32 copies flushed many times (300007 rows
    in 3 clusters: thousands of values a cell); the same bits twice."""
    import cupy as cp

    from mpiml.kernels import kmeans

    rs = np.random.RandomState(11)
    X = (rs.randn(n, d) * 3 + 20).astype(dtype)
    lab = rs.randint(0, max(1, k - 2), n).astype(np.int32)       # the last clusters stay empty
    w = rs.uniform(0.5, 2, n).astype(dtype)
    shift = X.mean(0).astype(dtype)
    outs = []
    for _ in range(2):
        out = cp.zeros(k * d + k + 2)
        plan = kmeans._tc._sums_pass(cp.asarray(X), cp.asarray(shift), cp.asarray(w), cp.asarray(lab), k, out,
                                    kind=kind)
        outs.append(out)
    ref = np.zeros((k, d))
    np.add.at(ref, lab, (X.astype(np.float64) - shift.astype(np.float64)) * w[:, None].astype(np.float64))
    got = outs[0].get()
    scale = np.abs(ref).max() + 1e-30
    assert np.abs(got[:k * d].reshape(k, d) - ref).max() <= (1e-6 if dtype == np.float32 else 1e-13) * scale, plan
    assert not got[k * d:].any()                                 # only the sums are written
    assert bool(cp.array_equal(outs[0], outs[1]))
