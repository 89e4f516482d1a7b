// mpiml_distances_tc (the tensor-core arg-min and Lloyd step) and mpiml_tc_pack (its centres in fragment
// order).
// Part of the k-means tensor-core program: the loader compiles tc_common.cuh, tc.cu, sums.cu, small.cu and
// small_tc.cu as one source, in that order (kmeans/_common.py TC_FILES); the family is described at the
// head of tc_common.cuh.

template <typename T, int WMT, int BN, int DK, int VEC, int MODE, int MTK, int MINB, int STAGES = 2>
__global__ void __launch_bounds__(MPIML_TC_THREADS, MINB)
mpiml_distances_tc(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                   const T* __restrict__ Cp, const T* __restrict__ c_sq, int k, int nJ,
                   const T* __restrict__ w, int* __restrict__ labels, T* __restrict__ mind,
                   double* __restrict__ part, int groups)
{
    using P = mpiml_tc<T>;
    constexpr bool F32 = sizeof(T) == 4;
    constexpr int THREADS = MPIML_TC_THREADS;
    constexpr int MT = P::MT;
    constexpr int FLUSH = 8;                     // tiles between the float64 flushes of float32 copies
    constexpr int H = F32 ? 2 : 1;               // row halves of an m-tile's accumulator (g, g + 8)
    constexpr int AN = F32 ? 4 : 2;              // accumulator values per lane per (m, n) tile
    constexpr int WM = WMT * MT;                 // rows per warp
    constexpr int BM = MPIML_TC_WARPS * WM;      // rows per tile
    constexpr int NTN = BN / 8;                  // n-tiles of a centre chunk
    constexpr int KG = DK / 8;                   // 8-feature groups of a slab
    constexpr int S = DK + P::PAD;               // shared row stride of an X slab
    constexpr int XS = BM * S;
    constexpr int FV = 16 / sizeof(T);           // values of one lane fragment of the packed centres
    constexpr int CS = KG * NTN * 32 * FV;       // one centre slab
    constexpr int EV = VEC / sizeof(T);          // values per copy of X
    constexpr int CPR = DK / EV;                 // copies per slab row
    constexpr int NTD = KG;                      // feature n-tiles of the fused sums (d <= DK)
    constexpr int RGW = MPIML_TC_WARPS / NTD;    // warps sharing a feature n-tile (row groups)
    static_assert(BN % 8 == 0 && DK % 8 == 0 && MPIML_TC_WARPS % KG == 0, "tile shape");
    static_assert(DK % EV == 0, "copy width");

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    const int nF = (d + DK - 1) / DK;
    const int steps = nJ * nF;
    const bool c_resident = steps == 1;
    T* xbuf = reinterpret_cast<T*>(mpiml_tc_smem);     // STAGES x [BM x S]
    T* cbuf = xbuf + STAGES * XS;                       // 1 or STAGES x CS
    T* shift_s = cbuf + (c_resident ? 1 : STAGES) * CS; // nF x DK
    T* w_s = shift_s + nF * DK;                         // BM
    int* lab_s = reinterpret_cast<int*>(w_s + BM);      // BM
    T* w_pre = reinterpret_cast<T*>(lab_s + BM);            // STAGES x BM: weights of a tile, by cp.async (MODE 1)
    int* lab_pre = reinterpret_cast<int*>(w_pre + (MODE == 1 ? STAGES * BM : 0));   // STAGES x BM: previous labels
    double* cnt_s = reinterpret_cast<double*>(lab_pre + (MODE == 1 ? STAGES * BM : 0));   // CH x k (MODE 1)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long n_tiles = (n + BM - 1) / BM;
    const int CH = k <= THREADS ? THREADS / k : 1;      // row strides of the weights-per-cluster count
    const long long cells = (long long)k * DK;
    T* accf = reinterpret_cast<T*>(cnt_s + CH * k);      // groups x k x DK (MTK < 0)
    double* accd = reinterpret_cast<double*>(accf + (MTK < 0 ? groups : 0) * cells);   // k x DK (float32)
    int flushes = 0;

    for (int i = tid; i < nF * DK; i += THREADS) shift_s[i] = (shift != nullptr && i < d) ? shift[i] : T(0);
    if constexpr (MODE == 1) {
        for (int i = tid; i < CH * k; i += THREADS) cnt_s[i] = 0.0;
    }
    if constexpr (MODE == 1 && MTK < 0) {
        for (long long i = tid; i < groups * cells; i += THREADS) accf[i] = T(0);
        if constexpr (F32) {
            for (long long i = tid; i < cells; i += THREADS) accd[i] = 0.0;
        }
    }

    // cp.async of step s of `tile` (feature slab s % nF of centre chunk s / nF)
    auto stage = [&](long long tile, int s, T* xdst, T* cdst, int pb) {
        const int fc = s % nF, jc = s / nF;
        if (MODE == 1 && s == 0) {
            // the tile's weights and previous labels travel with its first slab: the epilogue reads
            // them from shared memory instead of waiting on global loads one row after another
            for (int r = tid; r < BM; r += THREADS) {
                const long long row = tile * BM + r;
                const bool ok = row < n;
                mpiml_cp_async<sizeof(T)>(w_pre + pb * BM + r, ok ? w + row : w, ok);
                mpiml_cp_async<4>(lab_pre + pb * BM + r, ok ? labels + row : labels, ok);
            }
        }
        if (nF > 1 || jc == 0) {
            for (int e = tid; e < BM * CPR; e += THREADS) {
                const int r = e / CPR, ci = e % CPR;
                const int f = fc * DK + ci * EV;
                const long long row = tile * BM + r;
                const bool ok = row < n && f < d;
                mpiml_cp_async<VEC>(xdst + r * S + ci * EV, ok ? X + row * d + f : X, ok);
            }
        }
        if (cdst != nullptr) {
            const T* src = Cp + (long long)(jc * nF + fc) * CS;
            for (int e = tid; e < CS / FV; e += THREADS) mpiml_cp_async<16>(cdst + e * FV, src + e * FV, true);
        }
    };

    T acc[WMT][NTN][AN];
    T best[WMT][H], xsq[WMT][H];
    int bidx[WMT][H];
#pragma unroll
    for (int m = 0; m < WMT; ++m)
#pragma unroll
        for (int h = 0; h < H; ++h) { best[m][h] = P::inf(); bidx[m][h] = 0x7fffffff; xsq[m][h] = T(0); }
    constexpr int KWR = (BN + 31) / 32;          // clusters of a lane in the weights count (k <= BN)
    // the weights in registers where k fits one chunk, except in the one-hot kernel (k <= 16), whose barrier
    // stays anyway and where the block-wide count was faster (10^7 x 16 float32: 0.69 vs 0.75 ms)
    const bool REGW = MODE == 1 && MTK <= 0 && nJ == 1;
    double wcnt[MODE == 1 ? KWR : 1];
#pragma unroll
    for (int q = 0; q < (MODE == 1 ? KWR : 1); ++q) wcnt[q] = 0.0;
    T oacc[MTK > 0 ? MTK : 1][AN];
    double dacc[F32 && MTK > 0 ? MTK : 1][AN];
#pragma unroll
    for (int m = 0; m < (MTK > 0 ? MTK : 1); ++m)
#pragma unroll
        for (int i = 0; i < AN; ++i) oacc[m][i] = T(0);
    if constexpr (F32 && MTK > 0) {
#pragma unroll
        for (int m = 0; m < MTK; ++m)
#pragma unroll
            for (int i = 0; i < AN; ++i) dacc[m][i] = 0.0;
    }
    double my_inertia = 0.0;
    long long my_changed = 0;

    // Steps (tile, s) in order, the g-th of this block being step g % steps of tile-iteration g / steps; the
    // copies run STAGES - 1 steps ahead of the step computed, into buffers by step (or by tile: X when
    // d <= DK, the weights and previous labels) modulo STAGES.  One barrier a step: after it, step gs is
    // visible and every thread is done with step gs - 1, whose buffers the copy of step gs + STAGES - 1 takes.
    constexpr int AHEAD = STAGES - 1;
    long long tile = blockIdx.x;
    int s = 0, it = 0;
    long long gs = 0;        // steps this block has done
    auto xb_of = [&](long long gstep, int iter) { return xbuf + (int)((nF == 1 ? iter : gstep) % STAGES) * XS; };
    auto cb_of = [&](long long gstep) { return cbuf + (c_resident ? 0 : (int)(gstep % STAGES)) * CS; };
    auto copy_step = [&](long long g) {      // the copies of this block's g-th step
        const int iter = (int)(g / steps), st = (int)(g % steps);
        const long long tl = blockIdx.x + (long long)iter * gridDim.x;
        if (tl < n_tiles) stage(tl, st, xb_of(g, iter), (c_resident && g > 0) ? nullptr : cb_of(g), iter % STAGES);
        mpiml_cp_commit();
    };
#pragma unroll
    for (int a = 0; a < AHEAD; ++a) copy_step(a);

    while (tile < n_tiles) {
        mpiml_cp_wait<AHEAD - 1>();
        __syncthreads();                     // step gs is in shared memory; every thread is done with gs - 1
        copy_step(gs + AHEAD);

        const int fc = s % nF, jc = s / nF;
        const T* Xt = xb_of(gs, it);
        const T* Xw = Xt + warp * WM * S;
        const T* Cs = cb_of(gs);
        const T* shf = shift_s + fc * DK;
        if (fc == 0) {
#pragma unroll
            for (int m = 0; m < WMT; ++m)
#pragma unroll
                for (int j = 0; j < NTN; ++j)
#pragma unroll
                    for (int i = 0; i < AN; ++i) acc[m][j][i] = T(0);
        }
#pragma unroll 2
        for (int q = 0; q < KG; ++q) {
            if constexpr (F32) {
                unsigned ab[WMT][4], as[WMT][4];
                const float2 sh = *reinterpret_cast<const float2*>(shf + q * 8 + 2 * t);
#pragma unroll
                for (int m = 0; m < WMT; ++m) {
                    const float* xr = Xw + (m * 16 + g) * S + q * 8 + 2 * t;
                    const float2 lo = *reinterpret_cast<const float2*>(xr);
                    const float2 hi = *reinterpret_cast<const float2*>(xr + 8 * S);
                    const float v[4] = {lo.x - sh.x, hi.x - sh.x, lo.y - sh.y, hi.y - sh.y};
                    if (jc == 0) {
                        xsq[m][0] = fmaf(v[0], v[0], fmaf(v[2], v[2], xsq[m][0]));
                        xsq[m][1] = fmaf(v[1], v[1], fmaf(v[3], v[3], xsq[m][1]));
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        ab[m][i] = mpiml_tf32(v[i]);
                        as[m][i] = mpiml_tf32(v[i] - __uint_as_float(ab[m][i]));
                    }
                }
#pragma unroll
                for (int j = 0; j < NTN; ++j) {
                    const uint4 b = *reinterpret_cast<const uint4*>(Cs + ((q * NTN + j) * 32 + lane) * 4);
#pragma unroll
                    for (int m = 0; m < WMT; ++m) {
                        // the three products of a group meet in a fresh accumulator, added to acc with
                        // round-to-nearest: the tensor cores' own float32 accumulation truncates, and over
                        // d / 8 groups its bias showed in the inertia (2e-5 at d = 64, more at d = 1024)
                        float p[4] = {0.f, 0.f, 0.f, 0.f};
                        mpiml_mma(p, as[m], b.x, b.y);     // small x big
                        mpiml_mma(p, ab[m], b.z, b.w);     // big x small
                        mpiml_mma(p, ab[m], b.x, b.y);     // big x big
#pragma unroll
                        for (int i = 0; i < 4; ++i) acc[m][j][i] += p[i];
                    }
                }
            } else {
                double a0[WMT], a1[WMT];
                const double s0 = shf[q * 8 + t], s1 = shf[q * 8 + 4 + t];
#pragma unroll
                for (int m = 0; m < WMT; ++m) {
                    const double* xr = Xw + (m * 8 + g) * S + q * 8 + t;
                    a0[m] = xr[0] - s0;
                    a1[m] = xr[4] - s1;
                    if (jc == 0) xsq[m][0] = fma(a0[m], a0[m], fma(a1[m], a1[m], xsq[m][0]));
                }
#pragma unroll
                for (int j = 0; j < NTN; ++j) {
                    const double2 b = *reinterpret_cast<const double2*>(Cs + ((q * NTN + j) * 32 + lane) * 2);
#pragma unroll
                    for (int m = 0; m < WMT; ++m) {
                        mpiml_mma(acc[m][j], a0[m], b.x);
                        mpiml_mma(acc[m][j], a1[m], b.y);
                    }
                }
            }
        }

        if (fc == nF - 1) {
            // ||c||^2 - 2 x.c over this chunk; (min, argmin) over the lane's columns, then the row's 4 lanes
            const int jbase = jc * BN + 2 * t;
            T cq[NTN][2];
#pragma unroll
            for (int j = 0; j < NTN; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) cq[j][e] = __ldg(c_sq + jbase + j * 8 + e);
#pragma unroll
            for (int m = 0; m < WMT; ++m)
#pragma unroll
                for (int h = 0; h < H; ++h) {
                    T bv = P::inf();
                    int bj = 0x7fffffff;
#pragma unroll
                    for (int j = 0; j < NTN; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int col = jbase + j * 8 + e;
                            const T dist = fma(T(-2), acc[m][j][2 * h + e], cq[j][e]);
                            if (dist < bv) { bv = dist; bj = col; }
                        }
#pragma unroll
                    for (int off = 1; off < 4; off <<= 1) {
                        const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
                        const int oj = __shfl_xor_sync(0xffffffffu, bj, off);
                        if (ov < bv || (ov == bv && oj < bj)) { bv = ov; bj = oj; }
                    }
                    if (bv < best[m][h]) { best[m][h] = bv; bidx[m][h] = bj; }   // equal: the earlier chunk stays
                }
        }

        if (s == steps - 1) {
            // the tile is done: one lane of four writes each row
#pragma unroll
            for (int m = 0; m < WMT; ++m)
#pragma unroll
                for (int h = 0; h < H; ++h) {
                    T xs = xsq[m][h];
                    xs += __shfl_xor_sync(0xffffffffu, xs, 1);
                    xs += __shfl_xor_sync(0xffffffffu, xs, 2);
                    const int r = warp * WM + m * MT + g + 8 * h;
                    const long long row = tile * BM + r;
                    if (t == 0) {
                        int lab = -1;
                        T wt = T(0);
                        if (row < n) {
                            lab = bidx[m][h] == 0x7fffffff ? 0 : bidx[m][h];
                            T dist = best[m][h] + xs;
                            dist = dist > T(0) ? dist : T(0);
                            mind[row] = dist;
                            if constexpr (MODE == 1) {
                                wt = w_pre[(it % STAGES) * BM + r];
                                my_changed += lab_pre[(it % STAGES) * BM + r] != lab;
                                my_inertia += (double)wt * (double)dist;
                            }
                            labels[row] = lab;
                        }
                        if constexpr (MODE == 1) { lab_s[r] = lab; w_s[r] = wt; }
                    }
                    best[m][h] = P::inf();
                    bidx[m][h] = 0x7fffffff;
                    xsq[m][h] = T(0);
                }
            if constexpr (MODE == 1) {
                if (REGW) {
                    // weights per cluster from this warp's rows (k <= BN): lane owns clusters lane + 32 q in
                    // float64 registers, the rows added in order; no block barrier where nothing else needs one
                    __syncwarp();
                    for (int r = warp * WM; r < warp * WM + WM; ++r) {
                        const int l = lab_s[r];
                        const double wv = (double)w_s[r];
#pragma unroll
                        for (int q = 0; q < KWR; ++q)
                            if (l == lane + 32 * q) wcnt[q] += wv;
                    }
                }
                if (MTK != 0 || !REGW) __syncthreads();
                // otherwise: thread (row stride c, cluster j) owns cnt_s[c * k + j]
                if (!REGW && k <= THREADS) {
                    if (tid < CH * k) {
                        const int j = tid % k, c = tid / k;
                        T sw[4] = {T(0), T(0), T(0), T(0)};
                        int r = c;
                        for (; r + 3 * CH < BM; r += 4 * CH) {     // four independent sums: loads in flight
#pragma unroll
                            for (int u = 0; u < 4; ++u) sw[u] += lab_s[r + u * CH] == j ? w_s[r + u * CH] : T(0);
                        }
                        for (; r < BM; r += CH) sw[0] += lab_s[r] == j ? w_s[r] : T(0);
                        cnt_s[c * k + j] += (double)((sw[0] + sw[1]) + (sw[2] + sw[3]));
                    }
                } else if (!REGW) {
                    for (int j = tid; j < k; j += THREADS) {
                        T sw = T(0);
                        for (int r = 0; r < BM; ++r) sw += lab_s[r] == j ? w_s[r] : T(0);
                        cnt_s[j] += (double)sw;
                    }
                }
                if constexpr (MTK < 0) {
                    // thread (copy gq, column c) owns accf[gq][*][c]; copy gq takes rows gq, gq + groups, ...
                    const int tpc = THREADS / groups;
                    const int gq = tid / tpc, q = tid % tpc;
                    T* mine = accf + gq * cells;
                    for (int c = q; c < d; c += tpc) {
                        const T sh = shift_s[c];
                        int r = gq;
                        for (; r + 3 * groups < BM; r += 4 * groups) {      // four rows loaded ahead of their adds
                            int l[4];
                            T v[4];
#pragma unroll
                            for (int u = 0; u < 4; ++u) {
                                const int rr = r + u * groups;
                                l[u] = lab_s[rr];
                                v[u] = (Xt[rr * S + c] - sh) * w_s[rr];
                            }
#pragma unroll
                            for (int u = 0; u < 4; ++u)
                                if (l[u] >= 0) mine[l[u] * DK + c] += v[u];
                        }
                        for (; r < BM; r += groups) {
                            const int l0 = lab_s[r];
                            if (l0 >= 0) mine[l0 * DK + c] += (Xt[r * S + c] - sh) * w_s[r];
                        }
                    }
                    if constexpr (F32) {
                        if (++flushes == FLUSH) {
                            flushes = 0;
                            __syncthreads();
                            for (long long i = tid; i < cells; i += THREADS) {
                                double v = accd[i];
                                for (int g2 = 0; g2 < groups; ++g2) { v += (double)accf[g2 * cells + i]; accf[g2 * cells + i] = 0.f; }
                                accd[i] = v;
                            }
                        }
                    }
                }
                if constexpr (MTK > 0) {
                    const int nd = warp % NTD, rg = warp / NTD;
                    const int fcol = nd * 8 + g;
                    mpiml_tc_onehot<T, MTK, AN, S>(oacc, Xt, lab_s, w_s, fcol, shift_s[fcol], rg, BM / P::KT, RGW,
                                                   0, g, t);
                    if constexpr (F32) {
#pragma unroll
                        for (int m = 0; m < MTK; ++m)
#pragma unroll
                            for (int i = 0; i < AN; ++i) { dacc[m][i] += (double)oacc[m][i]; oacc[m][i] = 0.f; }
                    }
                }
            }
        }
        if (++s == steps) { s = 0; tile += gridDim.x; ++it; }
        ++gs;
    }
    mpiml_cp_wait<0>();

    if constexpr (MODE == 1) {
        // this block's totals -> its own row of `part`: [sums (k x d when fused) | weights (k) | inertia | changed]
        const long long SUMS = MTK != 0 ? (long long)k * d : 0;
        const long long PP = SUMS + k + 2;
        double* mine = part + (long long)blockIdx.x * PP;
        __syncthreads();
        if (REGW) {
            // the warps' weight counts meet in shared memory (the X buffers are free now), added in warp order
            double* ws = reinterpret_cast<double*>(xbuf);
#pragma unroll
            for (int q = 0; q < KWR; ++q)
                if (lane + 32 * q < k) ws[warp * k + lane + 32 * q] = wcnt[q];
            __syncthreads();
            for (int j = tid; j < k; j += THREADS) {
                double v = 0.0;
                for (int q = 0; q < MPIML_TC_WARPS; ++q) v += ws[q * k + j];
                mine[SUMS + j] = v;
            }
            __syncthreads();                         // before the sums below take the X buffers
        }
        if constexpr (MTK > 0) {
            // the row groups' sums meet in shared memory (the X buffers are free now), added in a fixed order
            constexpr int KP = MTK * MT;
            double* scratch = reinterpret_cast<double*>(xbuf);
            const int nd = warp % NTD, rg = warp / NTD;
#pragma unroll
            for (int m = 0; m < MTK; ++m)
#pragma unroll
                for (int i = 0; i < AN; ++i) {
                    const int cl = m * MT + g + (F32 ? 8 * (i >> 1) : 0);
                    const int f = nd * 8 + 2 * t + (i & 1);
                    double v;
                    if constexpr (F32) v = dacc[m][i]; else v = oacc[m][i];
                    scratch[((long long)rg * KP + cl) * DK + f] = v;
                }
            __syncthreads();
            for (long long i = tid; i < SUMS; i += THREADS) {
                const int cl = (int)(i / d), f = (int)(i % d);
                double v = 0.0;
                for (int r = 0; r < RGW; ++r) v += scratch[((long long)r * KP + cl) * DK + f];
                mine[i] = v;
            }
        }
        if constexpr (MTK < 0) {
            for (long long i = tid; i < SUMS; i += THREADS) {
                const long long cell = (i / d) * DK + i % d;
                double v = F32 ? accd[cell] : 0.0;
                for (int g2 = 0; g2 < groups; ++g2) v += (double)accf[g2 * cells + cell];
                mine[i] = v;
            }
        }
        for (int j = tid; j < k && !REGW; j += THREADS) {
            double v = 0.0;
            for (int c = 0; c < CH; ++c) v += cnt_s[c * k + j];
            mine[SUMS + j] = v;
        }
        mpiml_block_totals(my_inertia, my_changed, mine + PP - 2);
    }
}

// The centres in the fragment order of mpiml_distances_tc (see kmeans/_tc.py pack_centres) and c_sq.
template <typename T, int BN, int DK>
__global__ void __launch_bounds__(MPIML_TC_THREADS)
mpiml_tc_pack(const T* __restrict__ C, int k, int d, int nJ, int nF, T* __restrict__ Cp, T* __restrict__ c_sq)
{
    constexpr int KG = DK / 8, NTN = BN / 8, FV = 16 / sizeof(T);
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long total = (long long)nJ * nF * KG * NTN * 32;
    auto at = [&](int j, int f) -> T { return (j < k && f < d) ? C[(long long)j * d + f] : T(0); };
    for (long long e = first; e < total; e += stride) {
        const int lane = (int)(e % 32);
        long long r = e / 32;
        const int nt = (int)(r % NTN); r /= NTN;
        const int q = (int)(r % KG); r /= KG;
        const int fc = (int)(r % nF);
        const int jc = (int)(r / nF);
        const int g = lane >> 2, t = lane & 3;
        const int j = jc * BN + nt * 8 + g, f = fc * DK + q * 8;
        T* o = Cp + e * FV;
        if constexpr (sizeof(T) == 4) {
            const float v0 = at(j, f + 2 * t), v1 = at(j, f + 2 * t + 1);
            const unsigned b0 = mpiml_tf32(v0), b1 = mpiml_tf32(v1);
            o[0] = __uint_as_float(b0);
            o[1] = __uint_as_float(b1);
            o[2] = __uint_as_float(mpiml_tf32(v0 - __uint_as_float(b0)));
            o[3] = __uint_as_float(mpiml_tf32(v1 - __uint_as_float(b1)));
        } else {
            o[0] = at(j, f + t);
            o[1] = at(j, f + 4 + t);
        }
    }
    for (long long j = first; j < (long long)nJ * BN; j += stride) {
        T v = mpiml_tc<T>::inf();
        if (j < k) {
            v = T(0);
            for (int f = 0; f < d; ++f) { const T c = C[j * d + f]; v = fma(c, c, v); }
        }
        c_sq[j] = v;
    }
}
