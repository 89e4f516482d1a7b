"""The centre packing of the tensor-core kernels (``kmeans.pack_centres``), on the CPU.

The kernel reads a lane's B fragment from the packed array and builds its A fragment from the
rows of X (``kmeans/tc.cu``).  Here the PTX fragment layouts of ``mma.m16n8k8`` (TF32) and
``mma.m8n8k4`` (float64) are replayed in NumPy with the kernel's k-slot to feature mapping: the
products must give ``X @ C.T`` (float32 to the 3xTF32 rounding, float64 exactly).
"""

import numpy as np
import pytest

from mpiml.kernels import kmeans


def _mma_products(X, Cp, k, d, bn, dk, f32):
    """X @ C.T as the kernel's fragments compute it (rows in m-tiles of 16 / 8, float64 sums)."""
    n = X.shape[0]
    nJ, nF = -(-k // bn), -(-d // dk)
    kg, ntn = dk // 8, bn // 8
    fv = 4 if f32 else 2
    P = Cp.reshape(nJ, nF, kg, ntn, 32, fv).astype(np.float64)
    Xp = np.zeros((n, nF * dk))
    Xp[:, :d] = X
    out = np.zeros((n, nJ * bn))
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    for jc in range(nJ):
        for fc in range(nF):
            for q in range(kg):
                f0 = fc * dk + q * 8
                for nt in range(ntn):
                    frag = P[jc, fc, q, nt]                  # (32 lanes, fv)
                    cols = jc * bn + nt * 8 + np.arange(8)
                    if f32:
                        B = np.zeros((8, 8))                 # k-slot x column
                        B[t, g] = frag[:, 0] + frag[:, 2]    # b0 (t, g): big + small
                        B[t + 4, g] = frag[:, 1] + frag[:, 3]
                        A = np.empty((n, 8))                 # row x k-slot: slot t <-> 2t, t + 4 <-> 2t + 1
                        A[:, :4] = Xp[:, f0 + 2 * np.arange(4)]
                        A[:, 4:] = Xp[:, f0 + 2 * np.arange(4) + 1]
                        out[:, cols] += A @ B
                    else:
                        for h in range(2):                   # two k-steps of 4: slot t <-> f0 + 4h + t
                            B = np.zeros((4, 8))
                            B[t, g] = frag[:, h]
                            A = Xp[:, f0 + 4 * h + np.arange(4)]
                            out[:, cols] += A @ B
    return out[:, :k]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k,bn,dk", [(5, 1, 1, 16, 16), (9, 17, 5, 16, 16), (7, 64, 64, 64, 64),
                                         (6, 65, 70, 64, 32), (4, 3, 33, 32, 16)])
def test_packed_fragments_give_the_product(n, d, k, bn, dk, dtype):
    rs = np.random.RandomState(0)
    X = rs.randn(n, d).astype(dtype)
    C = (rs.randn(k, d) * 10).astype(dtype)
    Cp = kmeans.pack_centres(C, bn, dk, np)
    assert Cp.dtype == dtype and Cp.size == -(-k // bn) * bn * -(-d // dk) * dk * (2 if dtype == np.float32 else 1)
    got = _mma_products(X.astype(np.float64), Cp, k, d, bn, dk, dtype == np.float32)
    want = X.astype(np.float64) @ C.astype(np.float64).T
    scale = np.abs(X).astype(np.float64) @ np.abs(C).astype(np.float64).T + 1e-30
    rtol = 2e-6 if dtype == np.float32 else 1e-14
    assert np.all(np.abs(got - want) <= rtol * scale)


def test_tf32_split():
    rs = np.random.RandomState(1)
    x = np.concatenate([rs.randn(1000) * 10.0 ** rs.randint(-20, 20, 1000), [0.0, -0.0, 1.0, -3.5]]).astype(np.float32)
    big = kmeans._tc._tf32(x, np)
    small = kmeans._tc._tf32(x - big, np)
    assert np.all(big.view(np.uint32) & 0x1FFF == 0) and np.all(small.view(np.uint32) & 0x1FFF == 0)
    assert np.all(np.abs(x - big) <= np.abs(x) * 2.0 ** -11)                     # big: 11 significant bits
    assert np.all(np.abs(x.astype(np.float64) - big - small) <= np.abs(x) * 2.0 ** -21)   # big + small: 22
    # ties round away from zero: 1 + 2^-11 (exactly between two TF32 values) -> 1 + 2^-10
    half = np.array([1 + 2.0 ** -11, -(1 + 2.0 ** -11)], dtype=np.float32)
    np.testing.assert_array_equal(kmeans._tc._tf32(half, np), np.array([1 + 2.0 ** -10, -(1 + 2.0 ** -10)], np.float32))


def test_tc_plans():
    # fused sums only where a tile holds whole rows (d <= DK); shared memory within a block's
    p = kmeans.tc_plan(np.float32, 64, 64, accum="mma")
    assert p["fused"] and p["MTK"] == 4 and p["nF"] == 1 and p["nJ"] == 1 and p["BM"] == 256
    assert p["expr"] == "mpiml_distances_tc<float, 2, 64, 64, 16, 1, 4, 1>"
    p = kmeans.tc_plan(np.float32, 64, 64, accum="smem")
    assert p["fused"] and p["MTK"] == -1 and p["groups"] >= 2 and p["accum"] == "smem"
    p = kmeans.tc_plan(np.float32, 64, 64)         # the default from k = 17: lean kernel + SIMT sums pass
    assert not p["fused"] and p["accum"] == "pass" and (p["WMT"], p["MINB"], p["BM"]) == (1, 2, 128)
    p = kmeans.tc_plan(np.float32, 16, 16, accum="mma")
    assert p["fused"] and p["BN"] == 16 and p["DK"] == 16 and p["MTK"] == 1
    p = kmeans.tc_plan(np.float32, 16, 16)
    assert p["fused"] and p["MTK"] == 1 and p["accum"] == "mma"
    p = kmeans.tc_plan(np.float32, 16, 16, accum="smem")
    assert p["fused"] and p["groups"] == 16 and p["WMT"] == 4
    p = kmeans.tc_plan(np.float64, 64, 64, accum="mma")
    assert p["fused"] and p["MTK"] == 8 and p["BM"] == 128
    p = kmeans.tc_plan(np.float64, 64, 64, accum="smem")
    assert p["fused"] and p["MTK"] == -1 and p["groups"] >= 2
    # float64 from k = 17 on, and every arg-min of 64 centres: the lean kernel (one m-tile a warp, two blocks
    # an SM), float64 sums by the SIMT pass
    p = kmeans.tc_plan(np.float64, 64, 64)
    assert not p["fused"] and p["accum"] == "pass" and (p["WMT"], p["MINB"], p["BM"]) == (1, 2, 64)
    assert 2 * (p["smem"] + 1024) <= 228 * 1024
    p = kmeans.tc_plan(np.float32, 64, 64, mode="assign")
    assert (p["WMT"], p["MINB"], p["BM"]) == (1, 2, 128)
    p = kmeans.tc_plan(np.float32, 64, 1024)
    assert not p["fused"] and (p["WMT"], p["MINB"]) == (2, 1)     # float32 Lloyd: the two-m-tile kernel
    p = kmeans.tc_plan(np.float64, 16, 16)
    assert p["fused"] and p["accum"] == "mma" and p["WMT"] == 4
    p = kmeans.tc_plan(np.float32, 65, 64, accum="smem")
    assert p["fused"] and p["nJ"] == 2               # copies in shared memory take any k that fits
    assert not kmeans.tc_plan(np.float32, 1024, 256)["fused"]
    assert not kmeans.tc_plan(np.float32, 64, 1024)["fused"]
    assert not kmeans.tc_plan(np.float32, 65, 64, accum="mma")["fused"]
    assert not kmeans.tc_plan(np.float32, 64, 64, accum="pass")["fused"]
    for k, d in [(4100, 5), (1024, 64), (7, 3), (1, 1)]:
        for dt in (np.float32, np.float64):
            assert kmeans.tc_plan(dt, k, d)["smem"] <= 227 * 1024
    assert kmeans.tc_plan(np.float32, 7, 3, mode="assign")["expr"].endswith(", 0, 0, 2>")
    assert kmeans.tc_plan(np.float32, 7, 3, mode="assign", tile=(1, 16, 16, 1))["expr"].endswith(", 0, 0, 1>")
    # a fifth tile entry: buffers of the copies (3: two steps ahead); one more X tile and its weights and labels
    p2 = kmeans.tc_plan(np.float32, 16, 16, tile=(2, 16, 16, 2))
    p3 = kmeans.tc_plan(np.float32, 16, 16, tile=(2, 16, 16, 2, 3))
    assert p2["STAGES"] == 2 and p2["expr"].endswith(", 1, 2>") and p3["expr"].endswith(", 1, 2, 3>")
    assert p3["smem"] - p2["smem"] == 256 * (16 + 8) * 4 + 256 * (4 + 4)
    p2 = kmeans.tc_plan(np.float32, 100, 40, tile=(2, 64, 32, 1))
    p3 = kmeans.tc_plan(np.float32, 100, 40, tile=(2, 64, 32, 1, 3))    # centres in chunks: a third buffer
    assert p3["smem"] - p2["smem"] == 256 * (32 + 8) * 4 + 32 * 64 * 2 * 4 + 256 * (4 + 4)
    s = kmeans.sums_plan(np.float32, 1024, 256, kind="mma")
    assert s["KC"] == 128 and s["expr"] == "mpiml_distances_sums_tc<float, 8, 16>"
    assert kmeans.sums_plan(np.float64, 5, 3, kind="mma")["expr"] == "mpiml_distances_sums_tc<double, 1, 8>"
    # the SIMT pass: 8 warp copies of kc x 32 float64 cells and 4 stages of 16 KB of X in one block's memory
    # float32: 8 float32 copies (float64 totals in registers: 8 cells a thread at k = 64) and 2 stages of 160
    # rows, two blocks an SM up to k = 69
    s = kmeans.sums_plan(np.float32, 64, 64, kind="simt")
    assert s["KC"] == 64 and s["DS"] == 32 and s["expr"] == "mpiml_distances_sums_simt<float, float, 16, 2, 2, 20, 8>"
    assert s["smem"] == 2 * 160 * (32 * 4 + 8) + 8 * 64 * 32 * 4 and s["per_sm"] == 2 and s["rows"] == 160
    assert kmeans.sums_plan(np.float32, 69, 64, kind="simt")["rows"] == 160
    # shorter tiles keep two blocks an SM up to k = 86
    assert kmeans.sums_plan(np.float32, 70, 64, kind="simt")["expr"].endswith(", 2, 2, 16, 9>")
    assert kmeans.sums_plan(np.float32, 86, 64, kind="simt")["expr"].endswith(", 3, 2, 8, 11>")
    assert kmeans.sums_plan(np.float32, 87, 64, kind="simt")["per_sm"] == 1
    assert 2 * (s["smem"] + 1024) <= 228 * 1024
    s = kmeans.sums_plan(np.float32, 100, 64, kind="simt")
    assert s["KC"] == 100 and s["per_sm"] == 1 and s["smem"] <= 227 * 1024 and s["expr"].endswith(", 13>")
    s = kmeans.sums_plan(np.float32, 64, 64, kind="simt64")
    assert s["expr"] == "mpiml_distances_sums_simt<float, double, 16, 4, 1, 16, 0>"
    assert s["smem"] == 4 * 128 * (32 * 4 + 8) + 8 * 64 * 32 * 8 <= 227 * 1024 and s["per_sm"] == 1
    s = kmeans.sums_plan(np.float64, 4100, 3, kind="simt")
    assert 1 <= s["KC"] < 4100 and s["smem"] <= 227 * 1024
    assert s["expr"] == "mpiml_distances_sums_simt<double, double, 8, 4, 1, 8, 0>"
    with pytest.raises(ValueError, match="kind"):
        kmeans.sums_plan(np.float32, 4, 4, kind="atomic")
    # tiles in flight and blocks an SM chosen by the caller: one block an SM leaves room for 16 stages at k = 64
    s = kmeans.sums_plan(np.float32, 64, 1024, kind="simt", stages=16, per_sm=1)
    assert s["expr"] == "mpiml_distances_sums_simt<float, float, 16, 16, 1, 8, 8>" and s["KC"] == 64
    assert s["smem"] == 16 * 64 * (32 * 4 + 8) + 8 * 64 * 32 * 4 <= 227 * 1024
    s = kmeans.sums_plan(np.float32, 64, 1024, kind="simt", stages=3, rows_per_warp=8)
    assert s["expr"] == "mpiml_distances_sums_simt<float, float, 16, 3, 2, 8, 8>" and s["rows"] == 64
    # one block an SM: 199 clusters a pass (25 float64 totals a thread)
    s = kmeans.sums_plan(np.float32, 255, 64, kind="simt")
    assert s["KC"] == 199 and s["per_sm"] == 1 and s["expr"].endswith(", 3, 1, 8, 25>")
    with pytest.raises(ValueError, match="stages"):
        kmeans.sums_plan(np.float32, 64, 64, kind="simt", stages=40, per_sm=1)
    with pytest.raises(ValueError, match="per_sm"):
        kmeans.sums_plan(np.float32, 64, 64, kind="simt", per_sm=3)
    with pytest.raises(ValueError, match="rows_per_warp"):
        kmeans.sums_plan(np.float32, 64, 64, kind="simt", rows_per_warp=6)


def test_wave_splits():
    """Row ranges of a sums pass: no partial last wave where a few more (or fewer) ranges avoid one."""
    ws = kmeans._common._wave_splits
    assert ws(32, 264, 10**6) == 33           # 1,056 blocks: four whole waves (9 ranges: 288, a wave and 24)
    assert ws(2, 264, 10**6) == 130           # 260 of 264 slots in one wave
    assert ws(32, 132, 10**6) == 4            # 128 of 132
    assert ws(4, 132, 10**6) == 33            # 132 exactly
    assert ws(32, 264, 3) == 3 and ws(32, 264, 1) == 1      # no more ranges than the rows allow
    assert ws(300, 264, 10**6) == 4           # more items than slots: at most 4 ranges


def test_small_plans():
    # rows padded to 16 bytes, centres to 8 / 16 / 32, a shared row stride of an odd number of 16-byte words
    p = kmeans.small_plan(np.float32, 16, 16, tc=False)
    assert (p["DP"], p["KP"], p["SX"], p["VEC"], p["STAGES"], p["R"]) == (16, 16, 20, 16, 2, 2)
    assert p["expr"] == "mpiml_distances_small<float, float, 16, 16, 16, 1, 2, 2, true>" and p["PC"]
    # float64 total (+ weights), 16 float32 half-warp copies (+ weights a warp), 2 tiles of 512 rows (two a
    # thread), centres, norms, shift, weights and previous labels of 2 tiles, labels of one
    assert p["smem"] == ((16 * 16 + 16) * 8 + (16 * 16 * 16 + 8 * 16) * 4 + 2 * 512 * 20 * 4 + (256 + 16 + 16) * 4
                         + 2 * 512 * 8 + 512 * 4)
    assert kmeans.small_plan(np.float32, 16, 16, stages=3, rows=1, tc=False)["smem"] == (
        (16 * 16 + 16) * 8 + (16 * 16 * 16 + 8 * 16) * 4 + 3 * 256 * 20 * 4 + (256 + 16 + 16) * 4
        + 3 * 256 * 8 + 256 * 4)
    p = kmeans.small_plan(np.float64, 16, 16)
    assert (p["DP"], p["KP"], p["SX"], p["STAGES"], p["accum"]) == (16, 16, 18, 2, "double")
    assert p["smem"] == 8 * (16 * 16 + 16) * 8 + 2 * 256 * 18 * 8 + (256 + 32) * 8 + 2 * 256 * 12 + 256 * 4
    a = kmeans.small_plan(np.float32, 5, 3, mode="assign")
    assert (a["DP"], a["KP"], a["SX"], a["VEC"]) == (4, 8, 4, 4) and a["expr"].endswith(", 4, 0, 2, 2, true>")
    assert a["smem"] == 2 * 512 * 4 * 4 + (32 + 8 + 4) * 4
    assert kmeans.small_plan(np.float64, 3, 3, vw=1)["VEC"] == 8
    assert kmeans.small_plan(np.float32, 17, 30)["KP"] == 32
    for k, d in [(32, 32), (1, 1), (32, 1), (1, 32)]:
        for dt in (np.float32, np.float64):
            assert kmeans.small_plan(dt, k, d)["smem"] <= 227 * 1024 - 2048
    with pytest.raises(ValueError, match="small kernel"):
        kmeans.small_plan(np.float32, 33, 4)
    with pytest.raises(ValueError, match="small kernel"):
        kmeans.small_plan(np.float32, 4, 33)
    with pytest.raises(ValueError, match="rows"):
        kmeans.small_plan(np.float32, 4, 4, rows=3)
    # centres and norms as kernel parameters up to ~4 KB: float32 16 x 32 (2112 B) yes, 32 x 32 (4224 B) no
    assert kmeans.small_plan(np.float32, 16, 32)["PC"] and not kmeans.small_plan(np.float32, 32, 32)["PC"]
    assert kmeans.small_plan(np.float64, 16, 16)["PC"] and not kmeans.small_plan(np.float64, 17, 16)["PC"]
    assert kmeans.small_plan(np.float32, 16, 16, param_centres=False)["expr"].endswith(", false>")
    # centres on the device: the same instantiation reading its constant bank (where they would be parameters)
    cb = kmeans.small_plan(np.float64, 16, 16)
    assert cb["expr_cb"] == cb["expr"][:-len("true>")] + "true, true>"
    assert "expr_cb" not in kmeans.small_plan(np.float32, 16, 16, param_centres=False)
    # rows a thread: float32 two, except wide rows with the centres as parameters; float64 one
    assert [kmeans.small_plan(np.float32, k, d, tc=False)["R"] for k, d in [(16, 32), (32, 32), (8, 8)]] == [1, 2, 2]
    assert kmeans.small_plan(np.float64, 16, 16)["R"] == 1
    with pytest.raises(ValueError, match="parameters"):
        kmeans.small_plan(np.float32, 32, 32, param_centres=True)


def test_small_tc_plans():
    # float32 Lloyd steps with padded KP x DQ <= 256 go to the tensor-core form: rows padded to 8 / 16 / 32
    # features (no row padding: the chunks are swizzled), tiles of 512 rows (256 for 32 features: two blocks
    # an SM), [tiles | weights, previous labels of the tiles | a thread's float64 sums (m x (DQ/8 + 1) x 4) |
    # the one-hot table ((KP + 1) x m x 8 float2)]
    p = kmeans.small_plan(np.float32, 16, 16)
    assert p["tc"] and p["PC"] and p["expr"] == "mpiml_distances_small_tc<16, 16, 1, 2, 4, 16>"
    assert p["smem"] == 2 * 512 * 16 * 4 + 2 * 2 * 512 * 4 + 1 * 3 * 4 * 256 * 8 + 17 * 8 * 8
    # unit weights (no sample weights): MODE 2, no weights staged
    p = kmeans.small_plan(np.float32, 16, 16, unit=True)
    assert p["unit"] and p["expr"] == "mpiml_distances_small_tc<16, 16, 2, 2, 4, 16>"
    assert p["smem"] == 2 * 512 * 16 * 4 + 2 * 512 * 4 + 1 * 3 * 4 * 256 * 8 + 17 * 8 * 8
    assert not kmeans.small_plan(np.float32, 16, 16, mode="assign", unit=True)["unit"]
    assert not kmeans.small_plan(np.float32, 16, 16, tc=False, unit=True).get("unit")
    p = kmeans.small_plan(np.float32, 8, 32)
    assert p["expr"] == "mpiml_distances_small_tc<32, 8, 1, 2, 2, 16>" and p["BM"] == 256
    assert p["smem"] == 2 * 256 * 32 * 4 + 2 * 2 * 256 * 4 + 1 * 5 * 4 * 256 * 8 + 9 * 8 * 8 <= 227 * 1024 // 2
    assert kmeans.small_plan(np.float32, 5, 3)["expr"] == "mpiml_distances_small_tc<8, 8, 1, 2, 8, 4>"
    # 8 features: tiles of 1024 rows where two blocks an SM fit (k = 32 weighted: 512)
    assert kmeans.small_plan(np.float32, 32, 8, unit=True)["R"] == 4
    assert kmeans.small_plan(np.float32, 32, 8)["R"] == 2
    # the arg-min alone where at least half of KP x DQ is real: 16 x 16 yes, d 12 k 9 and d 3 k 5 no
    assert kmeans.small_plan(np.float32, 16, 16, mode="assign")["expr"] == \
        "mpiml_distances_small_tc<16, 16, 0, 2, 4, 16>"
    assert not kmeans.small_plan(np.float32, 9, 12, mode="assign").get("tc")
    assert not kmeans.small_plan(np.float32, 5, 3, mode="assign").get("tc")
    # not float64, not past KP x DQ = 256 (the 512-cell forms spill), not with centres in shared memory
    assert not kmeans.small_plan(np.float64, 16, 16).get("tc")
    assert not kmeans.small_plan(np.float32, 32, 16).get("tc")
    assert not kmeans.small_plan(np.float32, 16, 16, param_centres=False).get("tc")
    with pytest.raises(ValueError, match="tensor-core"):
        kmeans.small_plan(np.float32, 32, 16, tc=True)
    with pytest.raises(ValueError, match="tensor-core"):
        kmeans.small_plan(np.float64, 8, 8, tc=True)
    with pytest.raises(ValueError, match="parameters"):
        kmeans.small_plan(np.float32, 8, 8, tc=True, param_centres=False)
    assert kmeans.small_plan(np.float32, 8, 8, rows=4)["BM"] == 1024


def test_plans_memoized_as_copies():
    """Plans are computed once per (arguments, device) and handed out as copies: a caller's keys stay its own."""
    a = kmeans.tc_plan(np.float32, 64, 64, mode="lloyd")
    a["grid"] = 7
    b = kmeans.tc_plan(np.float32, 64, 64, mode="lloyd")
    assert "grid" not in b and b == kmeans.tc_plan(np.float32, 64, 64, mode="lloyd")
    assert kmeans.tc_plan(np.float32, 64, 64, mode="assign")["expr"] != b["expr"]
    assert kmeans.sums_plan(np.float32, 64, 64, stages=3, rows_per_warp=8)["rows"] == 64
    assert kmeans.sums_plan(np.float32, 64, 64)["rows"] == 160
    with pytest.raises(ValueError, match="per_sm"):           # errors are raised every time, never cached
        kmeans.sums_plan(np.float32, 64, 64, per_sm=3)
    with pytest.raises(ValueError, match="per_sm"):
        kmeans.sums_plan(np.float32, 64, 64, per_sm=3)
    # a tile given as a list (unhashable) is planned without the memo
    assert kmeans.tc_plan(np.float32, 7, 3, mode="assign", tile=[1, 16, 16, 1])["WMT"] == 1



def test_emulated_device_plans_for_that_device_and_is_undone():
    """The build plans for a typical device of each architecture without a GPU: inside ``emulated_device`` the
    plans see its shared memory (sm_86: 99 KB a block, a tile that fits an H100 does not) and after it the
    device as before."""
    from mpiml.kernels import build

    before = kmeans.tc_plan(np.float32, 64, 64, mode="lloyd", accum="smem")
    with kmeans.emulated_device(build.DEVICE_MODELS["sm_86"]):
        assert kmeans.tc_supported()
        small = kmeans.tc_plan(np.float32, 64, 64, mode="lloyd", accum="smem")
        assert small["smem"] <= 99 * 1024 - 2048
        with kmeans.emulated_device(build.DEVICE_MODELS["sm_90"]):
            assert kmeans.tc_plan(np.float32, 64, 64, mode="lloyd", accum="smem")["smem"] > small["smem"]
        assert kmeans.tc_plan(np.float32, 64, 64, mode="lloyd", accum="smem") == small
    assert kmeans.tc_plan(np.float32, 64, 64, mode="lloyd", accum="smem") == before


def test_the_former_module_forwards_to_the_family():
    """``mpiml.kernels.distances`` (the family's module before it had a folder) still serves older scripts: the
    public functions and the private launchers the benchmarks time are the family's own."""
    from mpiml.kernels import distances
    from mpiml.kernels.kmeans import _common, _lloyd, _small, _tc

    assert distances.lloyd_step_packed is kmeans.lloyd_step_packed and distances.topk is kmeans.topk
    assert distances._tc_launch is _tc._tc_launch and distances._method is _lloyd._method
    assert distances._function is _common._function and distances._small_tc_fits is _small._small_tc_fits
    assert set(distances.__all__) <= set(kmeans.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        distances.no_such_name
