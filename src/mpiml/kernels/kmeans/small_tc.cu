// mpiml_distances_small_tc: the small kernel's job on the tensor cores (float32).
// Part of the k-means tensor-core program: the loader compiles tc_common.cuh, tc.cu, sums.cu, small.cu and
// small_tc.cu as one source, in that order (kmeans/_common.py TC_FILES); the family is described at the
// head of tc_common.cuh.

// Two floats from a shared-memory address (a 32-bit one: one add, not a generic pointer's arithmetic).
__device__ __forceinline__ float2 mpiml_lds_f2(unsigned addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

// NV = 1, 2, 4 or 8 consecutive floats of a staged row from shared address a (8: two 16-byte chunks, at a and b)
template <int NV>
__device__ __forceinline__ void mpiml_lds_v(float* v, unsigned a, unsigned b = 0) {
    if constexpr (NV == 1) {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v[0]) : "r"(a));
    } else if constexpr (NV == 2) {
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v[0]), "=f"(v[1]) : "r"(a));
    } else {
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(a));
        if constexpr (NV == 8)
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(v[4]), "=f"(v[5]), "=f"(v[6]), "=f"(v[7]) : "r"(b));
    }
}

// The 16-byte chunk of a staged row of DQ float32 features that chunk c of row r is stored at (c ^ swizzle):
// the loads of mpiml_distances_small_tc (of the distances: a lane's 2 DQ / 8 features of rows g, 8-byte loads
// by half warps, 16-byte by quarter warps; of the sums: DQ / 8 features of rows t, 4 to 16 bytes) then meet no
// bank twice without padding.  Rows 4 apart share a swizzle.
template <int DQ>
__device__ __forceinline__ int mpiml_small_chunk(int r, int c) {
    return c ^ (DQ == 16 ? ((r >> 1) & 1) << 1 : DQ == 32 ? ((r & 3) << 1) | (r & 1) : 0);
}

// Float32 arg-min (MODE 0) or local Lloyd step (MODE 1; MODE 2: of unit weights, writing no distances) for
// d <= DQ (8, 16, 32), k <= KP (8, 16, 32), KP x DQ <= 512, on the tensor cores: the small kernel's job (same
// staging, same outputs; the centres and norms as parameters, or with CM the k x d centres C from memory and
// their norms summed as the host sums them) with its two instruction sinks, the FMAs of the distances and
// the adds of the sums, moved to mma.  Each warp takes MW m-tiles of 16 rows of a tile, software-pipelined: the
// distances of m-tile mt, then the sums of m-tile mt - 1 (its labels' shuffles long done).
//   distances: 3xTF32 products, rows split into TF32 big + small parts (k-step s, slot t <-> feature
//     2 KS t + 2 s, slot t + 4 <-> 2 KS t + 2 s + 1, KS = DQ / 8: a lane's features of a row are adjacent, one
//     load), centres split once per block and held in registers; each step's three products meet in a fresh
//     accumulator added with round-to-nearest.  The arg-min of a row: a tree over a lane's candidates, then
//     folded over its four lanes in two shuffle rounds, the first trading halves (a lane then reduces one row,
//     not two).
//   sums (MODE 1, 2): D[cluster x feature] += A[cluster x row] B[row x feature], A = the one-hot labels (one
//     8-byte load from a table in shared memory, at the row of the label its lane shuffles) times the weights
//     (split; the small part skipped where a warp's weights are all TF32; MODE 2: unit weights, w not read,
//     rows past n take the table's empty row KP so that they add nothing), B = the shifted rows, reloaded
//     from the staged tile in the transposed lane order (row t; n-tile s, column g <-> feature KS g + s: one
//     load) and split again.  A weights column (B = 1 at column 0) gives the weights per cluster.  Fresh
//     accumulators per m-tile, added with round-to-nearest into float32 registers, those into float64 (shared
//     memory, one slot a thread and value) every FLUSH tiles.
// Block totals [sums | weights | inertia | changed] to part as in mpiml_distances_small.  mind may be null in
// MODE 1 (the distances then go only into the inertia); MODE 2 never writes it.
template <int DQ, int KP, int MODE, int STAGES, int MW, int VEC, int MINB = 2, bool CM = false>
__global__ void __launch_bounds__(MPIML_TC_THREADS, MINB)
mpiml_distances_small_tc(const float* __restrict__ X, long long n, int d, const float* __restrict__ shift,
                         const float* __restrict__ C, int k, const float* __restrict__ w, int* __restrict__ labels,
                         float* __restrict__ mind, double* __restrict__ part,
                         const mpiml_small_centres<float, KP * DQ + KP> pc)
{
    constexpr int THREADS = MPIML_TC_THREADS, WARPS = MPIML_TC_WARPS;
    constexpr bool LLOYD = MODE >= 1, UNIT = MODE == 2, WEIGHTED = MODE == 1;
    constexpr int WR = 16 * MW, BR = WARPS * WR;    // rows of a warp, of a tile
    constexpr int KS = DQ / 8, NT = KP / 8;         // k-steps (8 features) and n-tiles (8 centres) of the distances
    // m-tiles (16 clusters) and n-tiles (8 features, then the weights column) of the sums
    constexpr int MC = (KP + 15) / 16, NF = KS + 1;
    constexpr int CELLS = MC * NF * 4;              // a lane's values of the sums
    constexpr int EC = VEC / 4, CPR = DQ / EC, RS = THREADS / CPR, PER = BR / RS;
    constexpr int FLUSH = 4;                        // tiles between float64 flushes (<= 4 MW float32 adds a value)
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(MODE >= 0 && MODE <= 2, "MODE: 0 arg-min, 1 Lloyd step, 2 Lloyd step of unit weights");
    static_assert(DQ % 8 == 0 && DQ <= 32 && (KP == 8 || KP == 16 || KP == 32) && KP * DQ <= 512, "small shapes");
    static_assert(THREADS % CPR == 0 && BR % RS == 0 && RS % 4 == 0, "whole rows of copies, one swizzle a thread");

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    float* xbuf = reinterpret_cast<float*>(mpiml_tc_smem);                       // STAGES x BR x DQ
    float* w_s = xbuf + STAGES * BR * DQ;                                        // STAGES x BR (MODE 1)
    int* ol_s = reinterpret_cast<int*>(w_s + (WEIGHTED ? STAGES * BR : 0));      // STAGES x BR previous labels
    double* dacc = reinterpret_cast<double*>(ol_s + (LLOYD ? STAGES * BR : 0));  // CELLS x THREADS (MODE 1, 2)
    // the one-hot A fragments of a label L (KP: none) for cluster m-tile m and lane row g: {L == 16 m + g,
    // L == 16 m + g + 8}, (KP + 1) x MC x 8 (MODE 1, 2): a load where compares and selects were
    float2* onehot = reinterpret_cast<float2*>(dacc + (LLOYD ? CELLS * THREADS : 0));

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long n_tiles = (n + BR - 1) / BR;
    const long long my_tiles = blockIdx.x < n_tiles ? (n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const unsigned xbuf_s = (unsigned)__cvta_generic_to_shared(xbuf);
    constexpr unsigned XB = BR * DQ * 4;             // bytes of a staged tile

    // this thread's copies: chunk ci of rows r_c + j RS of a tile (one swizzle), its labels (and weights) at
    // tid + q THREADS; the sources advance by a tile stride a staged tile (stage(i) comes for i = 0, 1, ...)
    const int ci = tid % CPR, r_c = tid / CPR, f_c = ci * EC;
    const bool fok = f_c < d;
    const long long x_step = (long long)RS * d, stride = (long long)gridDim.x * BR;
    const unsigned dst_c = xbuf_s + 4 * (r_c * DQ + (mpiml_small_chunk<DQ>(r_c, f_c >> 2) << 2) + (f_c & 3));
    const unsigned lab_c = (unsigned)__cvta_generic_to_shared(ol_s + tid);
    const unsigned w_c = (unsigned)__cvta_generic_to_shared(w_s + tid);
    long long s_r0 = (long long)blockIdx.x * BR;     // the next staged tile's first row
    const float* s_x = X + (s_r0 + r_c) * d + f_c;
    const int* s_lab = labels + s_r0 + tid;
    const float* s_w = WEIGHTED ? w + s_r0 + tid : nullptr;
    // (a copy of 0 bytes reads nothing: rows past n and features past d take zeros from addresses never read)
    auto stage = [&](long long i) {
        const unsigned b = (unsigned)(i % STAGES);
        const int rows = (int)min(n - s_r0, (long long)BR);   // rows of this tile (32-bit compares below)
        const int left = fok ? rows - r_c : 0;                // of them from row r_c on, none past d
        const unsigned xd = dst_c + b * XB;
        if (rows == BR && d == DQ) {                          // a whole tile of unpadded rows: constant strides
#pragma unroll
            for (int j = 0; j < PER; ++j) mpiml_cp_async_s<VEC>(xd + j * RS * DQ * 4, s_x + j * RS * DQ, true);
        } else {
#pragma unroll
            for (int j = 0; j < PER; ++j)
                mpiml_cp_async_s<VEC>(xd + j * RS * DQ * 4, s_x + j * x_step, j * RS < left);
        }
        if constexpr (LLOYD) {
            const int lr = rows - tid;
#pragma unroll
            for (int q = 0; q < BR / THREADS; ++q) {
                mpiml_cp_async_s<4>(lab_c + 4 * (b * BR + q * THREADS), s_lab + q * THREADS, q * THREADS < lr);
                if constexpr (WEIGHTED)
                    mpiml_cp_async_s<4>(w_c + 4 * (b * BR + q * THREADS), s_w + q * THREADS, q * THREADS < lr);
            }
            s_lab += stride;
            if constexpr (WEIGHTED) s_w += stride;
        }
        s_r0 += stride;
        s_x += stride * d;
    };
    mpiml_tiles_start<STAGES>(my_tiles, stage);

    // the centres as B fragments (n-tile j: centres 8 j + g; k-step s: features 2 KS t + 2 s, + 1), TF32 big
    // and small parts, the norms of the lane's result columns (centres 8 j + 2 t + e; +inf past k), the shift.
    // CM: each lane reads its values of the k x d centres C (zero past k and d) and sums its norms as the host
    // sums them (float64, feature by feature, each square rounded: the parameters' bits).  (Staging them
    // through a static shared array made the whole step 6 % slower at 10^7 x 16: ptxas scheduled the loop
    // worse; this form costs ~1 %.)
    unsigned cbig[NT][KS][2], csml[NT][KS][2];
    float cq[NT][2], shd[KS][2];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int s = 0; s < KS; ++s)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int i = (8 * j + g) * DQ + 2 * KS * t + 2 * s + e;
                const int cj = 8 * j + g, cf = 2 * KS * t + 2 * s + e;
                const float v = CM ? ((cj < k && cf < d) ? __ldg(C + (long long)cj * d + cf) : 0.f) : pc.v[i];
                cbig[j][s][e] = mpiml_tf32(v);
                csml[j][s][e] = __float_as_uint(v - __uint_as_float(cbig[j][s][e]));   // the mma reads its TF32 bits
            }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int i = KP * DQ + 8 * j + 2 * t + e;
            if constexpr (CM) {
                const int cj = 8 * j + 2 * t + e;
                double sq = 0.0;
                for (int f = 0; f < (cj < k ? d : 0); ++f) {
                    const double c = (double)__ldg(C + (long long)cj * d + f);
                    sq = __dadd_rn(sq, __dmul_rn(c, c));
                }
                cq[j][e] = cj < k ? (float)sq : mpiml_tc<float>::inf();
            } else {
                cq[j][e] = pc.v[i];
            }
        }
    }
#pragma unroll
    for (int s = 0; s < KS; ++s)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int f = 2 * KS * t + 2 * s + e;
            shd[s][e] = (shift != nullptr && f < d) ? shift[f] : 0.f;
        }
    // shared addresses in buffer 0 of the loads of row g of the warp's first m-tile: its features from 2 KS t
    // (DQ 32: two chunks); row g + 8: + 8 DQ floats, the same swizzle
    unsigned xa0, xa1;
    {
        const int r = warp * WR + g, c = (2 * KS * t) >> 2;
        xa0 = xbuf_s + 4 * (r * DQ + (mpiml_small_chunk<DQ>(r, c) << 2) + ((2 * KS * t) & 3));
        xa1 = xbuf_s + 4 * (r * DQ + (mpiml_small_chunk<DQ>(r, c + 1) << 2));
    }
    // the sums' loads: row t of an m-tile (slot t; row t + 8, slot t + 4: + 8 DQ floats, the same swizzle), its
    // features KS g + s (column g of n-tile s)
    unsigned sa;
    float shs[KS];
    {
        const int r = warp * WR + t, f = KS * g;
        sa = xbuf_s + 4 * (r * DQ + (mpiml_small_chunk<DQ>(r, f >> 2) << 2) + (f & 3));
    }
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        const int f = KS * g + s;
        shs[s] = (shift != nullptr && f < d) ? shift[f] : 0.f;
    }
    const unsigned wcol = g == 0 ? 0x3f800000u : 0u;   // B of the weights column
    // the one-hot table's entries of row g (+ 8) of the cluster m-tiles, at label 0
    const unsigned onehot_g = (unsigned)__cvta_generic_to_shared(onehot) + 8 * g;
    const int src_a = 4 * t, src_b = 4 * t + 1;       // lanes holding the labels of rows t, t + 8 (+ 4 h: + 16)
    const int lrow = warp * WR + g + 8 * (t & 1);     // the row of its first m-tile a lane writes (t < 2)

    float sacc[MC][NF][4];
#pragma unroll
    for (int m = 0; m < MC; ++m)
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
            for (int i = 0; i < 4; ++i) sacc[m][nf][i] = 0.f;
    if constexpr (LLOYD) {
#pragma unroll
        for (int c = 0; c < CELLS; ++c) dacc[c * THREADS + tid] = 0.0;
        for (int q = tid; q < (KP + 1) * MC * 8; q += THREADS) {   // read after the first tile's barrier
            const int L = q / (MC * 8), c = 16 * ((q / 8) % MC) + q % 8;
            onehot[q] = make_float2(L == c ? 1.f : 0.f, L == c + 8 ? 1.f : 0.f);
        }
    }
    auto flush = [&]() {             // float32 sums into this thread's float64 slots
#pragma unroll
        for (int m = 0; m < MC; ++m)
#pragma unroll
            for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    dacc[((m * NF + nf) * 4 + i) * THREADS + tid] += (double)sacc[m][nf][i];
                    sacc[m][nf][i] = 0.f;
                }
    };

    double my_inertia = 0.0;
    long long my_changed = 0;
    for (long long i = 0; i < my_tiles; ++i) {
        mpiml_tiles_next<STAGES>(i, my_tiles, stage);
        const int b = (int)(i % STAGES);
        const unsigned bo = (unsigned)b * XB;             // this tile's buffer
        const long long tile0 = (blockIdx.x + i * gridDim.x) * BR;
        // the row this lane writes of the warp's m-tile mt: lrow + 16 mt of the tile; in it while 16 mt < left
        const int left = (int)min(n - tile0, (long long)BR) - lrow;
        int* const lab_l = labels + (tile0 + lrow);
        float* const mind_l = mind + (tile0 + lrow);      // (MODE 1: null if mind is; MODE 2: not written)
        const int* const ol_l = ol_s + b * BR + lrow;
        const float* const w_l = w_s + b * BR + lrow;
        // whether the weights of this warp's rows are all TF32 values (unit weights): then the one-hot rows
        // carry them whole, with no small part
        bool exact = true;
        float t_inertia = 0.f;                            // this tile's, added to the float64 total after it
        int t_changed = 0;
        if constexpr (WEIGHTED) {
            bool ok = true;
#pragma unroll
            for (int q = 0; q < WR / 32; ++q) {
                const float wq = w_s[b * BR + warp * WR + q * 32 + lane];
                ok = ok && mpiml_tf32(wq) == __float_as_uint(wq);
            }
            exact = __all_sync(FULL, ok);
        }

        // software-pipelined: the distances and arg-min of m-tile mt, then the sums of m-tile mt - 1 (whose
        // labels came from the four lanes of each row a step earlier: 10^7 x 16, unit weights, 0.292 -> 0.283 ms)
        int kprev = 0;
#pragma unroll
        for (int mt = 0; mt <= MW; ++mt) {
            int kcur = 0;
            if (mt < MW) {
                unsigned ab[KS][4], as[KS][4];
                float xq0 = 0.f, xq1 = 0.f;                   // squared norms of rows g, g + 8 (this lane's features)
                float lo[2 * KS], hi[2 * KS];
                {
                    const unsigned o = bo + 16 * mt * DQ * 4;
                    mpiml_lds_v<2 * KS>(lo, xa0 + o, xa1 + o);
                    mpiml_lds_v<2 * KS>(hi, xa0 + o + 8 * DQ * 4, xa1 + o + 8 * DQ * 4);
                }
#pragma unroll
                for (int s = 0; s < KS; ++s) {
                    const float v[4] = {lo[2 * s] - shd[s][0], hi[2 * s] - shd[s][0], lo[2 * s + 1] - shd[s][1],
                                        hi[2 * s + 1] - shd[s][1]};
                    xq0 = fmaf(v[0], v[0], fmaf(v[2], v[2], xq0));
                    xq1 = fmaf(v[1], v[1], fmaf(v[3], v[3], xq1));
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        ab[s][e] = mpiml_tf32(v[e]);
                        as[s][e] = __float_as_uint(v[e] - __uint_as_float(ab[s][e]));   // the mma reads its TF32 bits
                    }
                }
                // ||c||^2 - 2 x.c (the tensor cores' float32 accumulation truncates: see mpiml_distances_tc) of
                // candidate 2 j + e of rows g (r = 0) and g + 8 (r = 1): centre 8 j + 2 t + e
                float cv[2][2 * NT];
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float acc[4];
#pragma unroll
                    for (int s = 0; s < KS; ++s) {
                        float p[4];
                        mpiml_mma0(p, as[s], cbig[j][s][0], cbig[j][s][1]);
                        mpiml_mma(p, ab[s], csml[j][s][0], csml[j][s][1]);
                        mpiml_mma(p, ab[s], cbig[j][s][0], cbig[j][s][1]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[e] = s == 0 ? p[e] : acc[e] + p[e];
                    }
#pragma unroll
                    for (int e = 0; e < 2; ++e) {           // c0, c1: row g; c2, c3: row g + 8; columns 2 t + e
                        cv[0][2 * j + e] = fmaf(-2.f, acc[e], cq[j][e]);
                        cv[1][2 * j + e] = fmaf(-2.f, acc[2 + e], cq[j][e]);
                    }
                }
                // the lane's arg-min of each row as a tree in candidate order (a pair's left has the lower index, and
                // a tie keeps it): half the dependent compares of a running minimum
                float bv[2];
                int bi[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    int ci[2 * NT];
#pragma unroll
                    for (int q = 0; q < 2 * NT; ++q) ci[q] = 8 * (q >> 1) + 2 * t + (q & 1);
#pragma unroll
                    for (int st = 1; st < 2 * NT; st *= 2)
#pragma unroll
                        for (int q = 0; q + st < 2 * NT; q += 2 * st)
                            if (cv[r][q + st] < cv[r][q]) { cv[r][q] = cv[r][q + st]; ci[q] = ci[q + st]; }
                    bv[r] = cv[r][0];
                    bi[r] = ci[0];
                }
                // the row's four lanes: odd t keeps row g + 8 and hands row g to its even neighbour (and back), then
                // lanes t and t ^ 2 (the same row) meet; ties keep the lower index
                const bool odd = t & 1;
                float kv = odd ? bv[1] : bv[0], xk = odd ? xq1 : xq0;
                int ki = odd ? bi[1] : bi[0];
                {
                    const float ov = __shfl_xor_sync(FULL, odd ? bv[0] : bv[1], 1);
                    const int oi = __shfl_xor_sync(FULL, odd ? bi[0] : bi[1], 1);
                    xk += __shfl_xor_sync(FULL, odd ? xq0 : xq1, 1);
                    if (ov < kv || (ov == kv && oi < ki)) { kv = ov; ki = oi; }
                }
                {
                    const float ov = __shfl_xor_sync(FULL, kv, 2);
                    const int oi = __shfl_xor_sync(FULL, ki, 2);
                    xk += __shfl_xor_sync(FULL, xk, 2);
                    if (ov < kv || (ov == kv && oi < ki)) { kv = ov; ki = oi; }
                }
                const bool in = 16 * mt < left;
                if (t < 2 && in) {
                    const float dist = fmaxf(kv + xk, 0.f);
                    lab_l[16 * mt] = ki;
                    if (MODE == 0 || (WEIGHTED && mind != nullptr)) mind_l[16 * mt] = dist;
                    if constexpr (LLOYD) {
                        t_changed += ol_l[16 * mt] != ki;
                        t_inertia = UNIT ? t_inertia + dist : fmaf(w_l[16 * mt], dist, t_inertia);
                    }
                }
                if constexpr (UNIT) ki = in ? ki : KP;        // no cluster: a row past n adds nothing to the sums
                kcur = ki;
            }
            if (LLOYD && mt > 0) {
                const int ms = mt - 1, ki = kprev;           // the sums' m-tile and this lane's label of it
                const int mrow = warp * WR + 16 * ms;        // its first row in the tile
                // k-step h of the sums: rows 4 h + t (slot t) and 4 h + t + 8 (slot t + 4) of the m-tile, their
                // labels from lanes 16 h + 4 t and 16 h + 4 t + 1, their split values at features KS g + s
                float pacc[MC][NF][4];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const unsigned oha = onehot_g + __shfl_sync(FULL, ki, src_a + 16 * h) * (MC * 8 * 8);
                    const unsigned ohb = onehot_g + __shfl_sync(FULL, ki, src_b + 16 * h) * (MC * 8 * 8);
                    const int wr = b * BR + mrow + 4 * h + t;
                    // rows past n: weight 0 (zero-filled), so they add nothing
                    const float wa = UNIT ? 1.f : w_s[wr], wb = UNIT ? 1.f : w_s[wr + 8];
                    unsigned vb[KS][2], vs[KS][2];
                    float ra[KS], rc[KS];
                    {
                        const unsigned o = sa + bo + (16 * ms + 4 * h) * DQ * 4;
                        mpiml_lds_v<KS>(ra, o);
                        mpiml_lds_v<KS>(rc, o + 8 * DQ * 4);
                    }
#pragma unroll
                    for (int s = 0; s < KS; ++s) {
                        const float va = ra[s] - shs[s], vc = rc[s] - shs[s];
                        vb[s][0] = mpiml_tf32(va);
                        vb[s][1] = mpiml_tf32(vc);
                        vs[s][0] = __float_as_uint(va - __uint_as_float(vb[s][0]));
                        vs[s][1] = __float_as_uint(vc - __uint_as_float(vb[s][1]));
                    }
                    const unsigned wab = exact ? __float_as_uint(wa) : mpiml_tf32(wa);
                    const unsigned wbb = exact ? __float_as_uint(wb) : mpiml_tf32(wb);
#pragma unroll
                    for (int m = 0; m < MC; ++m) {
                        const float2 oa = mpiml_lds_f2(oha + 64 * m), ob = mpiml_lds_f2(ohb + 64 * m);
                        const float wabf = __uint_as_float(wab), wbbf = __uint_as_float(wbb);
                        const unsigned abg[4] = {
                            __float_as_uint(UNIT ? oa.x : oa.x * wabf), __float_as_uint(UNIT ? oa.y : oa.y * wabf),
                            __float_as_uint(UNIT ? ob.x : ob.x * wbbf), __float_as_uint(UNIT ? ob.y : ob.y * wbbf)};
                        if (h == 0) {
#pragma unroll
                            for (int s = 0; s < KS; ++s) mpiml_mma0(pacc[m][s], abg, vs[s][0], vs[s][1]);
                            mpiml_mma0(pacc[m][KS], abg, wcol, wcol);
                        } else {
#pragma unroll
                            for (int s = 0; s < KS; ++s) mpiml_mma(pacc[m][s], abg, vs[s][0], vs[s][1]);
                            mpiml_mma(pacc[m][KS], abg, wcol, wcol);
                        }
#pragma unroll
                        for (int s = 0; s < KS; ++s) mpiml_mma(pacc[m][s], abg, vb[s][0], vb[s][1]);
                        if (!exact) {
                            const unsigned was = __float_as_uint(wa - __uint_as_float(wab));
                            const unsigned wbs = __float_as_uint(wb - __uint_as_float(wbb));
                            const float wasf = __uint_as_float(was), wbsf = __uint_as_float(wbs);
                            const unsigned asm_[4] = {__float_as_uint(oa.x * wasf), __float_as_uint(oa.y * wasf),
                                                      __float_as_uint(ob.x * wbsf), __float_as_uint(ob.y * wbsf)};
#pragma unroll
                            for (int s = 0; s < KS; ++s) mpiml_mma(pacc[m][s], asm_, vb[s][0], vb[s][1]);
                            mpiml_mma(pacc[m][KS], asm_, wcol, wcol);
                        }
                    }
                }
#pragma unroll
                for (int m = 0; m < MC; ++m)
#pragma unroll
                    for (int nf = 0; nf < NF; ++nf)
#pragma unroll
                        for (int e = 0; e < 4; ++e) sacc[m][nf][e] += pacc[m][nf][e];
            }
            kprev = kcur;
        }
        if constexpr (LLOYD) {
            my_inertia += (double)t_inertia;
            my_changed += t_changed;
            if ((i + 1) % FLUSH == 0) flush();
        }
    }
    mpiml_cp_wait<0>();
    if constexpr (LLOYD) {
        flush();
        __syncthreads();
        // cluster c = 16 m + g + 8 hi, feature KS (2 t + e) + nf (column 2 t + e of n-tile nf) of a lane's
        // fragment: value (m nf 4 + 2 hi + e) of lane 4 g + t, summed over the warps in order
        const long long P = (long long)k * d + k + 2;
        double* out = part + (long long)blockIdx.x * P;
        for (int q = tid; q < k * d + k; q += THREADS) {
            const int c = q < k * d ? q / d : q - k * d;
            const int f = q < k * d ? q % d : 0;
            const int nf = q < k * d ? f % KS : KS, col = f / KS;   // the weights: column 0 of n-tile KS
            const int m = c >> 4, gg = c & 7, hi = (c >> 3) & 1, tt = col >> 1, e = col & 1;
            const double* src = dacc + ((m * NF + nf) * 4 + 2 * hi + e) * THREADS + 4 * gg + tt;
            double v = 0.0;
#pragma unroll
            for (int q2 = 0; q2 < WARPS; ++q2) v += src[q2 * 32];
            out[q] = v;
        }
        mpiml_block_totals(my_inertia, my_changed, out + P - 2);
    }
}
