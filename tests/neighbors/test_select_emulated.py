"""The selection kernels (select.cu) compiled for the CPU by g++ over a CUDA emulation (cuda_emu.h).

Checks the kernels' logic (tiles, splits, the threshold, insertions, the merge, the radius
passes, ties) on a machine without a GPU.  One std::thread per GPU thread makes it slow (minutes
on two cores): runs only with ``MPIML_EMULATE_CUDA=1`` and g++ (C++20).
"""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from mpiml.kernels import select as S

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("MPIML_EMULATE_CUDA") != "1" or shutil.which("g++") is None,
                                 reason="set MPIML_EMULATE_CUDA=1 (needs g++) to emulate the kernels on the CPU")]

# (ctype, mode, tm, ty, vec) of the selection kernels the cases below launch
SELECT = [("float", 0, 4, 16, 0), ("double", 5, 2, 16, 1), ("float", 3, 4, 16, 0), ("float", 4, 1, 16, 1),
          ("double", 1, 1, 8, 1)]
RADIUS = [("float", 0, 4, 16, 1), ("double", 3, 2, 16, 1)]
# (ctype, mode) of the GEMM route's tile selection
TILE = [("float", 0), ("double", 1), ("float", 2), ("double", 0)]


def _harness():
    src = open(os.path.join(os.path.dirname(S.__file__), "select.cu")).read()
    src = src.replace("extern __shared__ __align__(16) unsigned char knn_smem[];", "unsigned char* knn_smem = emu_smem;")
    out = ['#include "cuda_emu.h"', src]
    for T, mode, tm, ty, vec in SELECT:
        v = "true" if vec else "false"
        out.append(f'''extern "C" void sel_{T}_{mode}_{tm}_{ty}_{vec}(const {T}* Q, int nq, int d, const {T}* X, int m,
  const {T}* qa, const {T}* xa, {T} p, int k, int split_rows, int splits, {T}* ov, int* oi, long smem) {{
  emu_launch(dim3{{(unsigned)((nq + {tm * ty} - 1) / {tm * ty}), (unsigned)splits, 1}}, 256, smem, [&] {{
    mpiml_knn_select<{T}, {mode}, {tm}, {ty}, {v}>(Q, nq, d, X, m, qa, xa, p, k, split_rows, ov, oi); }}); }}''')
    for T, mode, tm, ty, vec in RADIUS:
        v = "true" if vec else "false"
        for fill in ("false", "true"):
            out.append(f'''extern "C" void rad_{T}_{mode}_{fill}(const {T}* Q, int nq, int d, const {T}* X, int m,
  const {T}* qa, const {T}* xa, {T} p, {T} bound, int split_rows, int splits, unsigned long long* counts,
  const long long* indptr, unsigned long long* cursor, long long* cols, {T}* vals, long smem) {{
  emu_launch(dim3{{(unsigned)((nq + {tm * ty} - 1) / {tm * ty}), (unsigned)splits, 1}}, 256, smem, [&] {{
    mpiml_knn_radius<{T}, {mode}, {tm}, {ty}, {v}, {fill}>(Q, nq, d, X, m, qa, xa, p, bound, split_rows, counts,
      indptr, cursor, cols, vals); }}); }}''')
    for T, mode in TILE:
        out.append(f'''extern "C" void tile_{T}_{mode}(const {T}* S, int lds, int nq, int cols, int row0, int split_cols,
  const {T}* qa, const {T}* xa, int k, {T}* pv, int* pi, int splits, long smem) {{
  emu_launch(dim3{{(unsigned)((nq + MPIML_KNN_TS_WARPS - 1) / MPIML_KNN_TS_WARPS), (unsigned)splits, 1}},
    MPIML_KNN_TS_WARPS * 32, smem, [&] {{
    mpiml_knn_tile_select<{T}, {mode}>(S, lds, nq, cols, row0, split_cols, qa, xa, k, pv, pi); }}); }}''')
    for T in ("float", "double"):
        out.append(f'''extern "C" void merge_{T}(const {T}* pv, const int* pi, int nq, int splits, int k, {T}* ov, long long* oi) {{
  emu_launch(dim3{{4, 1, 1}}, 256, 0, [&] {{ mpiml_knn_merge<{T}>(pv, pi, nq, splits, k, ov, oi); }}); }}
extern "C" void norms_{T}(int mode, const {T}* A, int n, int d, {T}* out) {{
  if (mode == 0) emu_launch(dim3{{2, 1, 1}}, 256, 0, [&] {{ mpiml_knn_norms<{T}, 0>(A, n, d, out); }});
  else emu_launch(dim3{{2, 1, 1}}, 256, 0, [&] {{ mpiml_knn_norms<{T}, 1>(A, n, d, out); }}); }}
extern "C" void exact_{T}(const {T}* Q, const {T}* X, int d, const long long* idx, int nq, int k, {T}* out) {{
  emu_launch(dim3{{2, 1, 1}}, 256, 0, [&] {{ mpiml_knn_exact_sq<{T}>(Q, X, d, idx, nq, k, out); }}); }}''')
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("emu")
    (d / "harness.cpp").write_text(_harness())
    so = d / "libemu.so"
    subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-I", HERE, "-o", str(so), str(d / "harness.cpp"),
                    "-lpthread"], check=True, timeout=1200)
    return ctypes.CDLL(str(so))


def _p(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _ct(dt):
    return ("float", ctypes.c_float) if dt == np.float32 else ("double", ctypes.c_double)


def _aux(lib, A, mode):
    T, _ = _ct(A.dtype)
    if mode > 1:
        return np.zeros(1, A.dtype)
    out = np.empty(A.shape[0], A.dtype)
    getattr(lib, f"norms_{T}")(mode, _p(A), A.shape[0], A.shape[1], _p(out))
    return out


def emulated_topk(lib, Q, X, k, metric, p=None):
    """The launcher's steps (mpiml.kernels.select.topk) with the emulated kernels; one SM, so splits."""
    T, ct = _ct(X.dtype)
    nq, d = Q.shape
    m, mode = X.shape[0], S.METRICS[metric]
    tm, ty, smem = S._config(X.dtype, k)
    vec = int(d % (16 // X.dtype.itemsize) == 0)
    splits, split_rows = S._splits(nq, m, k, tm * ty, 1)
    qa, xa = _aux(lib, Q, mode), _aux(lib, X, mode)
    pv, pi = np.empty((nq, splits, k), X.dtype), np.empty((nq, splits, k), np.int32)
    fn = getattr(lib, f"sel_{T}_{mode}_{tm}_{ty}_{vec}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p, ct, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_long]
    fn(_p(Q), nq, d, _p(X), m, _p(qa), _p(xa), float(p or 1), k, split_rows, splits, _p(pv), _p(pi), smem)
    ov, oi = np.empty((nq, k), X.dtype), np.empty((nq, k), np.int64)
    getattr(lib, f"merge_{T}")(_p(pv), _p(pi), nq, splits, k, _p(ov), _p(oi))
    return (np.sqrt(ov) if metric == "euclidean" else ov), oi, splits


@pytest.mark.parametrize("dtype,metric,k,shape,ties", [
    (np.float32, "sqeuclidean", 7, (2300, 13), False),
    (np.float64, "minkowski", 7, (2300, 12), False),
    (np.float32, "manhattan", 20, (2200, 5), True),
    (np.float32, "chebyshev", 300, (1100, 40), False),
    (np.float64, "cosine", 1000, (1100, 40), False),
])
def test_select_emulated(lib, dtype, metric, k, shape, ties):
    from test_gpu_select import ref_topk, reference

    rs = np.random.RandomState(k)
    if ties:
        base = rs.randint(-2, 3, size=(6, shape[1])).astype(np.float64)
        X = base[rs.randint(0, 6, size=shape[0])]
        Q = np.concatenate([base[:3], rs.randint(-2, 3, size=(3, shape[1]))]).astype(np.float64)
    else:
        X, Q = rs.randn(*shape), rs.randn(5, shape[1])
    D = reference(Q, X, metric)
    rd, ri = ref_topk(D, k)
    d, i, _ = emulated_topk(lib, Q.astype(dtype), X.astype(dtype), k, metric, 3.0 if metric == "minkowski" else None)
    np.testing.assert_array_equal(i, ri)
    np.testing.assert_allclose(d, rd, rtol=1e-9 if dtype == np.float64 else 2e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,metric", [(np.float32, "sqeuclidean"), (np.float64, "manhattan")])
def test_radius_emulated(lib, dtype, metric):
    from test_gpu_select import reference

    T, ct = _ct(dtype)
    rs = np.random.RandomState(5)
    X, Q = rs.randn(2300, 8), rs.randn(12, 8)
    D = reference(Q, X, metric)
    bound = float(np.quantile(D, 0.02))
    Xd, Qd = X.astype(dtype), Q.astype(dtype)
    mode = S.METRICS[metric]
    tm, ty = (4, 16) if dtype == np.float32 else (2, 16)
    splits, split_rows = S._splits(12, 2300, 1, tm * ty, 1)
    qa, xa = _aux(lib, Qd, mode), _aux(lib, Xd, mode)
    counts, cursor = np.zeros(12, np.uint64), np.zeros(12, np.uint64)
    indptr = np.zeros(13, np.int64)
    args = [_p(Qd), 12, 8, _p(Xd), 2300, _p(qa), _p(xa), 1.0, bound, split_rows, splits]
    types = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
             ctypes.c_void_p, ct, ct, ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_long]
    smem = S._smem(np.dtype(dtype).itemsize, tm * ty, 0)
    count, fill = getattr(lib, f"rad_{T}_{mode}_false"), getattr(lib, f"rad_{T}_{mode}_true")
    count.argtypes = fill.argtypes = types
    none = np.zeros(1, np.int64)
    count(*args, _p(counts), _p(none), _p(cursor), _p(none), _p(np.zeros(1, dtype)), smem)
    indptr[1:] = np.cumsum(counts.astype(np.int64))
    cols, vals = np.empty(indptr[-1], np.int64), np.empty(indptr[-1], dtype)
    fill(*args, _p(counts), _p(indptr), _p(cursor), _p(cols), _p(vals), smem)
    assert splits > 1 and indptr[-1] > 0
    for q in range(12):
        c = cols[indptr[q]:indptr[q + 1]]
        np.testing.assert_array_equal(np.sort(c), np.flatnonzero(D[q] <= bound))
        np.testing.assert_allclose(vals[indptr[q]:indptr[q + 1]], D[q, c], rtol=1e-4, atol=1e-4)


def test_exact_sq_emulated(lib):
    rs = np.random.RandomState(1)
    X, Q = rs.randn(400, 37), rs.randn(50, 37)
    idx = rs.randint(0, 400, size=(50, 11)).astype(np.int64)
    out = np.empty((50, 11))
    lib.exact_double(_p(Q), _p(X), 37, _p(idx), 50, 11, _p(out))
    np.testing.assert_allclose(out, ((X[idx] - Q[:, None, :]) ** 2).sum(2), rtol=1e-12)


def emulated_gemm_topk(lib, Q, X, k, metric, qb, cb):
    """The GEMM route's steps (mpiml.kernels.select._gemm_topk) with NumPy's products as the tiles and the
    emulated tile selection and merge (tiles of qb x cb)."""
    T, _ = _ct(X.dtype)
    nq, d = Q.shape
    m, mode = X.shape[0], S.METRICS[metric]
    splits = int(max(1, min(S._TS_SPLITS, cb // max(128, 8 * k))))
    split_cols = -(-(-(-cb // splits)) // 128) * 128
    splits = -(-cb // split_cols)
    qa, xa = _aux(lib, Q, mode), _aux(lib, X, mode)
    smem = S._TS_WARPS * k * (X.dtype.itemsize + 4)
    fn = getattr(lib, f"tile_{T}_{mode}")
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p] * 2 + [ctypes.c_int] + \
        [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_long]
    ov, oi = np.empty((nq, k), X.dtype), np.empty((nq, k), np.int64)
    for s in range(0, nq, qb):
        n = min(qb, nq - s)
        pv = np.full((qb, splits, k), np.inf, X.dtype)
        pi = np.full((qb, splits, k), 0x7FFFFFFF, np.int32)
        qs = np.ascontiguousarray(qa[s:]) if mode <= 1 else qa
        for c0 in range(0, m, cb):
            r = min(cb, m - c0)
            tile = np.zeros((qb, cb), X.dtype)
            tile[:n, :r] = Q[s:s + n] @ X[c0:c0 + r].T
            fn(_p(tile), cb, n, r, c0, split_cols, _p(qs), _p(xa), k, _p(pv), _p(pi), splits, smem)
        getattr(lib, f"merge_{T}")(_p(pv), _p(pi), n, splits, k, _p(ov[s:]), _p(oi[s:]))
    return (np.sqrt(ov) if metric == "euclidean" else ov), oi, splits


@pytest.mark.parametrize("dtype,metric,k,qb,cb", [
    (np.float32, "sqeuclidean", 5, 8, 256),
    (np.float64, "cosine", 40, 4, 384),
    (np.float32, "inner_product", 1, 8, 512),
    (np.float64, "euclidean", 130, 8, 256),
])
def test_tile_select_emulated(lib, dtype, metric, k, qb, cb):
    """Duplicated integer rows (exact products, ties): the rows and order of NumPy's brute force, over
    several chunks (the last partial) and query batches (the last partial)."""
    from test_gpu_select import ref_topk, reference

    rs = np.random.RandomState(k)
    base = rs.randint(-2, 3, size=(9, 6)).astype(np.float64)
    base[2] = 0
    X = base[rs.randint(0, 9, size=2 * cb + 77)]
    Q = np.concatenate([base[:4], rs.randint(-2, 3, size=(qb + 3, 6))]).astype(np.float64)
    D = reference(Q, X, metric)
    rd, ri = ref_topk(D, k)
    d, i, splits = emulated_gemm_topk(lib, Q.astype(dtype), X.astype(dtype), k, metric, qb, cb)
    if metric != "cosine":
        np.testing.assert_array_equal(i, ri)
    np.testing.assert_allclose(np.take_along_axis(D, i, 1), rd, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(d, rd, rtol=1e-6, atol=1e-6)
    # every listed row once, ties in row order
    assert all(len(set(r)) == k for r in i)
    same = np.diff(d, axis=1) == 0
    assert (np.diff(i, axis=1)[same] > 0).all()
