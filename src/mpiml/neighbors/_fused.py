"""The float32 screen of the exact CPU search as one compiled pass: products in registers, no GEMM tile.

:func:`mpiml.neighbors._cpu.search_screened` screens candidates by the products of the screen's rows
(shifted, rounded to float32) and measures the survivors exactly.  Through BLAS every product was written
to a tile and read back by the selection; one thread's OpenBLAS ``sgemm`` of ``K = 32`` ran at about 80
GFLOP/s on the development VM's cores (AVX-512, 2.3 GHz: about 147 peak), the selection's pass over the
tile took as long again.  Here :func:`_tile` computes ``R x W`` products (8 queries x 32 index rows, 16
``zmm`` accumulators: LLVM vector IR written directly, so the width does not depend on the auto-vectoriser's
choices) over the features, then compares ``s_j - 2 g`` with each query's float32 threshold in the same
registers and returns which of the ``R`` queries have a column that may pass: about 125 GFLOP/s on one
core of the VM, and the products leave the registers only for the (rare) queries flagged.

The rows are packed at the search's start (:func:`pack_rows`): the index in panels of :data:`W` rows stored
feature-major (``(panels, d, W)``, so a feature of a panel is one vector load), the queries in groups of
:data:`R` likewise (``(groups, d, R)``, a feature's ``R`` values broadcast in turn).  Padding rows are zero;
padding queries' thresholds are ``-inf`` (never flagged), padding columns are never measured.

Exactness: the float32 threshold of a query is its float64 one (:func:`mpiml.neighbors._lists._bar`) plus
``4 u (max_j s_j + |q|^2)`` (``u = 2^-24``), rounded up (:func:`_up32`): ``fl(fl(s_j) - 2 g)`` in float32 is
within ``u s_j + u |fl(s_j) - 2 g| <= 4 u (s_j + |q|^2)`` of ``s_j - 2 g`` (``|g| <= (|q|^2 + |x|^2) / 2``,
``s_j <= |x|^2``), so every column that passes the float64 test of :func:`_recheck` (the same test as the
BLAS path's) is flagged; the flagged query's columns are then tested in float64 and measured exactly by
``_pair``.  The lists are the same ``k`` smallest by (value, index) whatever the order the pairs are met in.
"""

import numpy as np

from ..utils._jit import FASTMATH, numba
from ..utils._threads_jit import fetch_add
from . import _lists

__all__ = ["R", "W", "pack_rows", "packed_shape", "search_fused"]

nb = numba()
from llvmlite import ir  # noqa: E402  (after numba(): the cache directory and threading layer set first)
from numba import types  # noqa: E402
from numba.core import cgutils  # noqa: E402
from numba.core.extending import intrinsic  # noqa: E402

#: Queries of a register tile (each a broadcast per feature)
R = 8
#: Index rows of a register tile: two 16-lane float32 vectors (R x W / 16 = 16 accumulators of 32 registers)
W = 32
#: Panels of the index walked for every query group of a block while they stay in L1 (8 x 32 rows x 32
#: features of float32: 32 KiB of the VM's 48 KiB)
_PANELS = 8
#: Query groups of a block: 40 groups, 320 queries, as the BLAS path's tiles (each block reads the whole index)
_BLOCK_GROUPS = 40
#: float32 unit roundoff
_U32 = 2.0 ** -24


@intrinsic
def _tile(typingctx, QP, qoff, XP, xoff, S, soff, bar, boff, d, out):
    """Products of ``R`` packed queries (``QP[qoff:]``, feature-major) and ``W`` packed index rows (``XP[xoff:]``)
    over ``d`` features into ``out[:R * W]`` (query-major), and a bit per query ``i`` set where some column ``l`` has
    ``fl(S[soff + l] - 2 out[i, l]) <= bar[boff + i]`` (all float32)."""
    sig = types.int64(QP, qoff, XP, xoff, S, soff, bar, boff, d, out)
    nvec = W // 16

    def codegen(context, builder, signature, args):
        qpa, qo, xpa, xo, sa, so, ba, bo, dd, outa = args
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        v16 = ir.VectorType(f32, 16)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16, v16, v16]),
                                             "llvm.fma.v16f32")

        def data(i, value):
            return context.make_array(signature.args[i])(context, builder, value).data

        def const(v):
            return ir.Constant(i64, v)

        qp = builder.gep(data(0, qpa), [qo])
        xp = builder.gep(data(2, xpa), [xo])
        sp = builder.gep(data(4, sa), [so])
        bp = builder.gep(data(6, ba), [bo])
        op = data(9, outa)
        undef = ir.Constant(v16, ir.Undefined)
        lanes0 = ir.Constant(ir.VectorType(i32, 16), [0] * 16)

        def broadcast(s):
            return builder.shuffle_vector(builder.insert_element(undef, s, ir.Constant(i32, 0)), undef, lanes0)

        def vector(p, off):
            return builder.bitcast(builder.gep(p, [off]), v16.as_pointer())

        entry = builder.basic_block
        loop = builder.append_basic_block("tile.features")
        done = builder.append_basic_block("tile.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        f = builder.phi(i64)
        f.add_incoming(const(0), entry)
        acc = [[builder.phi(v16) for _ in range(nvec)] for _ in range(R)]
        for row in acc:
            for a in row:
                a.add_incoming(ir.Constant(v16, [0.0] * 16), entry)
        xrow, qrow = builder.mul(f, const(W)), builder.mul(f, const(R))
        xv = [builder.load(vector(xp, builder.add(xrow, const(16 * n))), align=4) for n in range(nvec)]
        new = []
        for i in range(R):
            q = broadcast(builder.load(builder.gep(qp, [builder.add(qrow, const(i))]), align=4))
            new.append([builder.call(fma, [q, xv[n], acc[i][n]]) for n in range(nvec)])
        f1 = builder.add(f, const(1))
        f.add_incoming(f1, loop)
        for i in range(R):
            for n in range(nvec):
                acc[i][n].add_incoming(new[i][n], loop)
        builder.cbranch(builder.icmp_signed("<", f1, dd), loop, done)

        builder.position_at_end(done)
        minus2 = broadcast(ir.Constant(f32, -2.0))
        sv = [builder.load(vector(sp, const(16 * n)), align=4) for n in range(nvec)]
        rows = const(0)
        for i in range(R):
            b = broadcast(builder.load(builder.gep(bp, [const(i)]), align=4))
            hit = None
            for n in range(nvec):
                builder.store(new[i][n], vector(op, const(i * W + 16 * n)), align=4)
                c = builder.fcmp_ordered("<=", builder.call(fma, [new[i][n], minus2, sv[n]]), b)
                hit = c if hit is None else builder.or_(hit, c)
            flag = builder.zext(builder.icmp_unsigned("!=", builder.bitcast(hit, ir.IntType(16)), ir.Constant(
                ir.IntType(16), 0)), i64)
            rows = builder.or_(rows, builder.shl(flag, const(i)))
        return rows

    return sig, codegen


def packed_shape(n, d, width):
    """Shape of ``n`` rows packed in groups of ``width`` (:func:`pack_rows`)."""
    return (-(-n // width), d, width)


@nb.njit(cache=True, parallel=True, nogil=True)
def pack_rows(A, shift, first, out, norms, snorms):
    """Rows ``A - shift`` (subtracted in float64, rounded once to ``out``'s dtype) as rows ``first, first + 1, ...``
    of the packed ``out`` (``(groups, d, width)``: row ``j`` is ``out[j // width, :, j % width]``); ``norms``: the
    float64 norms of ``A``'s rows, ``snorms``: those of ``A - shift``, in parallel over the rows."""
    width = out.shape[2]
    for i in nb.prange(A.shape[0]):
        j = first + i
        norms[i], snorms[i] = _lists.shifted_row(A[i], shift, out[j // width, :, j % width])


def zero_padding(packed, n):
    """Zero the rows of the last group of ``packed`` beyond ``n`` rows."""
    rest = n % packed.shape[2]
    if rest:
        packed[-1, :, rest:] = 0


@nb.njit(cache=True, inline="always")
def _up32(x):
    """A float32 not below ``x`` (round to nearest of a value a little above ``x``: ``|x| 2^-22`` exceeds the
    rounding of ``2^-24 |x|``; subnormal and infinite values alike)."""
    return np.float32(x + abs(x) * 2.4e-7 + 1e-44)


@nb.njit(cache=True, inline="always")
def _bar32(metric, bar, margin):
    """The float32 threshold of a query whose float64 one is ``bar`` (see the module notes; cosine: ``s = 0`` and
    ``-2 g <= 2 bar`` exactly as ``-g <= bar``)."""
    if metric == 2:
        return _up32(2.0 * bar)
    return _up32(bar + margin)


@nb.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _recheck(Q, X, acc, i, r, j0, offset, metric, qn, xn, qs, screen, rel, slack, bd, bi):
    """Row ``i`` of a flagged tile (query ``r``, index rows ``j0 ...``): the float64 screen of
    :func:`mpiml.neighbors._cpu._select_tile` on its products, the passing rows measured exactly."""
    m = X.shape[0]
    k = bd.shape[1]
    q = Q[r]
    a = qn[r]
    s = qs[r]
    worst = bd[r, k - 1]
    bar = _lists._bar(metric, s, worst, rel, slack)
    for c in range(min(W, m - j0)):
        j = j0 + c
        g = np.float64(acc[i * W + c])
        if metric == 2:
            hit = -g * screen[j] <= bar
        else:
            hit = screen[j] - 2.0 * g <= bar
        if hit:
            dist = _lists._pair(q, X[j], metric, 2.0, a, xn[j])
            if dist <= worst and _lists._beats(dist, offset + j, bd, bi, r, k):
                _lists._insert(bd, bi, r, k, dist, offset + j)
                worst = bd[r, k - 1]
                bar = _lists._bar(metric, s, worst, rel, slack)
    return bar


@nb.njit(cache=True, parallel=True, nogil=True, fastmath=FASTMATH)
def _fused_blocks(Q, X, QP, XP, S32, offset, metric, qn, xn, qs, screen, rel, slack, top2, bounds, workers, bd,
                  bi, counter):
    """The query blocks ``bounds[b]:bounds[b + 1]`` (in groups of ``R`` queries), taken by the threads from the shared
    ``counter`` as :func:`mpiml.neighbors._cpu._screened_blocks` takes them; per block, the index in runs of
    :data:`_PANELS` panels, each run met by every group of the block while it is in L1."""
    nq, d = Q.shape
    npan = XP.shape[0]
    k = bd.shape[1]
    nblocks = bounds.shape[0] - 1
    qflat = QP.ravel()
    xflat = XP.ravel()
    for _ in nb.prange(workers):
        acc = np.empty(R * W, np.float32)
        while True:
            b = fetch_add(counter)
            if b >= nblocks:
                break
            g0 = bounds[b]
            g1 = bounds[b + 1]
            bar32 = np.empty((g1 - g0) * R, np.float32)
            for t in range(bar32.shape[0]):
                r = g0 * R + t
                if r < nq:
                    margin = 4.0 * _U32 * (top2 + qs[r] * qs[r])
                    bar32[t] = _bar32(metric, _lists._bar(metric, qs[r], bd[r, k - 1], rel, slack), margin)
                else:
                    bar32[t] = -np.inf
            for p0 in range(0, npan, _PANELS):
                p1 = min(npan, p0 + _PANELS)
                for g in range(g0, g1):
                    for p in range(p0, p1):
                        rows = _tile(qflat, g * d * R, xflat, p * d * W, S32, p * W, bar32, (g - g0) * R, d, acc)
                        if rows == 0:
                            continue
                        for i in range(R):
                            if (rows >> i) & 1:
                                r = g * R + i
                                bar = _recheck(Q, X, acc, i, r, p * W, offset, metric, qn, xn, qs, screen, rel, slack,
                                               bd, bi)
                                margin = 4.0 * _U32 * (top2 + qs[r] * qs[r])
                                bar32[(g - g0) * R + i] = _bar32(metric, bar, margin)


def search_fused(Q, X, QP, XP, qn, xn, qs, screen, rel, slack, offset, metric, bd, bi, counter, threads):
    """The search of :func:`mpiml.neighbors._cpu.search_screened` on packed float32 screen rows ``QP``, ``XP``
    (``screen``: the float64 column terms of its test)."""
    nq = Q.shape[0]
    m = X.shape[0]
    code = _lists.METRICS[metric]
    S32 = np.full(XP.shape[0] * W, np.inf, dtype=np.float32)
    if code == 2:
        S32[:m] = 0.0
        top2 = 0.0
    else:
        S32[:m] = screen
        top2 = float(screen.max()) / (1.0 - 2.0 * rel) if m else 0.0   # the largest |x|^2
    groups = QP.shape[0]
    bounds = _lists._query_bounds(groups, threads or nb.get_num_threads(), _BLOCK_GROUPS)
    from ..utils._threads_jit import workers

    _fused_blocks(Q, X, QP, XP, S32, offset, code, qn, xn, qs, screen, rel, slack, top2, bounds,
                  workers(len(bounds) - 1, nb.get_num_threads()), bd, bi, counter)
    return nq
