// Distances on the tensor cores (sm_80 and later), fused with the arg-min and the Lloyd sums.
//
// float32: mma.sync m16n8k8 TF32 with a 3xTF32 split (x = big + small, both TF32; the product
// big*big + big*small + small*big keeps float32 accuracy).  float64: mma.sync m8n8k4 (DMMA).
//
//   mpiml_distances_tc<T, WMT, BN, DK, VEC, MODE, MTK, MINB, STAGES = 2>
//       persistent grid of 256-thread blocks.  A block takes a tile of BM = 8 warps x WMT x MT rows
//       and walks the centres in chunks of BN, the features in slabs of DK.  Slabs of X go from
//       global to shared memory by cp.async (no registers), STAGES - 1 steps ahead of the one computed.
//       The centres come pre-split and pre-arranged in fragment order (`Cp`, built by
//       distances.py), so one 16-byte shared load gives a lane its fragment; when everything
//       fits one step (k <= BN, d <= DK) the centres are loaded once per block.
//       Each warp computes WMT m-tiles of rows against all BN centres of the chunk; the
//       (min, argmin) of a row is reduced over the 4 lanes holding it (shuffles) and over the
//       chunks in registers.  ||x||^2 is summed from the A fragments of the first chunk.
//       MODE 0: labels and squared distances.  MODE 1: also weights per cluster, inertia,
//       changed labels, and (MTK > 0, d <= DK) the per-cluster sums of the tile, computed on the
//       tensor cores as onehot(labels)^T x X from the tile still in shared memory: float32 sums
//       are split big/small (2 products), kept in float32 for one tile and added to float64
//       registers after every tile; float64 sums accumulate in DMMA's float64 registers.
//       MTK < 0: the sums of the tile go to `groups` block-private copies in shared memory instead,
//       thread (copy, column) owning its cells (no atomics; the rows of a copy added in order),
//       float32 copies added to a float64 array every 8 tiles.
//       Every block writes [sums | weights | inertia | changed] to its own row of `part`
//       (summed in block order by mpiml_distances_reduce_partials: deterministic).
//   mpiml_distances_sums_tc<T, MTK, VEC>
//       the sums of a Lloyd step from the labels when they were not fused (d > DK or k large):
//       block = (feature slab of 64, cluster chunk of MTK x MT, row range), the same one-hot
//       product over tiles of 128 rows, float64 totals to part[row range][cluster * d + feature].
//
//   mpiml_distances_sums_simt<T, A, VEC, STAGES, MINB, RW, TC>
//       (and mpiml_distances_step_totals<T>: weights per cluster, inertia and changed labels from the
//       arg-min kernel's output, where the tensor-core path runs it instead of the Lloyd kernel)
//       the same sums by plain adds (warp-private copies of type A in shared memory, X by cp.async):
//       no k-fold waste where k is large for the one-hot products.
//
//   mpiml_distances_small<T, A, DP, KP, VEC, MODE, STAGES, R, PC, CB>
//       few features and centres (d <= DP <= 32, k <= KP <= 32), where a step reads X at bandwidth and
//       its arithmetic is small: whole rows in a thread's registers, no tensor cores.  Tiles of 256 R rows
//       go to shared memory by cp.async, STAGES - 1 tiles ahead; a thread loads its R rows with 16-byte
//       shared loads (row stride an odd number of 16-byte words: no bank conflict) and takes their dot
//       products with the centres from broadcast loads (PC: from the kernel's parameters, which the FMAs
//       read as constant-bank operands: shared memory delivers only 128 bytes a cycle to the lanes; CB:
//       from a constant bank that a queued copy fills from centres on the device), so
//       the arg-min needs no shuffle.  MODE 1: each
//       warp adds its rows into its own copy [KP][DP] of the sums (lane = feature; float32 with DP <= 16:
//       two rows an instruction, a copy each), weights per cluster by shared atomics; float32 copies go
//       to a float64 total every FLUSH tiles.  Block totals [sums | weights | inertia | changed] to part, as above.
//
//   mpiml_distances_small_tc<DQ, KP, MODE, STAGES, MW, VEC, MINB, CM>
//       float32, d <= DQ (8, 16, 32), k <= KP, KP x DQ <= 512 (distances.small_plan takes <= 256): the small
//       kernel's job on the tensor cores, 3xTF32 distances and one-hot Lloyd sums (see the kernel).
//
//   mpiml_tc_pack<T, BN, DK>
//       the centres in fragment order (`Cp`, the layout of distances.pack_centres, float32 split
//       into TF32 big and small parts) and their squared norms padded with +inf to nJ x BN.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32 and mma.m8n8k4 .f64), g = lane / 4, t = lane % 4:
//   m16n8k8: A a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); B b0 (t, g) b1 (t+4, g);
//            C c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1).
//   m8n8k4:  A a0 (g, t); B b0 (t, g); C c0 (g, 2t) c1 (g, 2t+1).
// The k index of a product is a summation index, so it may be mapped to features (or rows) in
// any order shared by A and B: float32 distances map k-slot t to feature 2t and t+4 to 2t+1 (a
// lane's two A values are adjacent: one 8-byte load), float64 maps slot t of the two k-steps of
// an 8-feature group to features t and 4+t.

#define MPIML_TC_THREADS 256
#define MPIML_TC_WARPS 8

template <typename T> struct mpiml_tc;
template <> struct mpiml_tc<float> {
    static constexpr int MT = 16;    // rows of an m-tile
    static constexpr int KT = 8;     // k of one mma
    static constexpr int PAD = 8;    // shared row stride = DK + PAD (bank-conflict free fragment loads)
    __device__ static float inf() { return __int_as_float(0x7f800000); }
};
template <> struct mpiml_tc<double> {
    static constexpr int MT = 8;
    static constexpr int KT = 4;
    static constexpr int PAD = 4;
    __device__ static double inf() { return __longlong_as_double(0x7ff0000000000000LL); }
};

// TF32 part of x, rounded to nearest (ties away), low 13 bits zero: the same bits as
// distances.py's _tf32 (the centres are split there).
__device__ __forceinline__ unsigned mpiml_tf32(float x) {
    return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

__device__ __forceinline__ void mpiml_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = a b (a zero accumulator: the result needs no registers of its own beforehand)
__device__ __forceinline__ void mpiml_mma0(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

__device__ __forceinline__ void mpiml_mma(double (&c)[2], double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
}

// global -> shared copy of BYTES (16, 8 or 4); zero-filled when !ok (src is not read then)
template <int BYTES>
__device__ __forceinline__ void mpiml_cp_async_s(unsigned s, const void* src, bool ok) {   // s: a shared address
    const int n = ok ? BYTES : 0;
    if constexpr (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(BYTES), "r"(n)
                     : "memory");
}
__device__ __forceinline__ void mpiml_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int BYTES>
__device__ __forceinline__ void mpiml_cp_async(void* dst, const void* src, bool ok) {
    mpiml_cp_async_s<BYTES>((unsigned)__cvta_generic_to_shared(dst), src, ok);
}
template <int N>
__device__ __forceinline__ void mpiml_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// A block's pipeline of tiles 0 .. tiles - 1 (stage(i): the cp.async copies of its i-th tile into buffer
// i % STAGES), STAGES - 1 tiles ahead: the copies of the first STAGES - 1 tiles, then before tile i is used
// (every thread): wait for it, a barrier (tile i has landed for all; tile i - 1 is done with, so its buffer
// takes tile i + STAGES - 1), the copies of that tile.
template <int STAGES, typename I, typename F>
__device__ __forceinline__ void mpiml_tiles_start(I tiles, F&& stage) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) stage(s);
        mpiml_cp_commit();
    }
}
template <int STAGES, typename I, typename F>
__device__ __forceinline__ void mpiml_tiles_next(I i, I tiles, F&& stage) {
    mpiml_cp_wait<STAGES - 2>();
    __syncthreads();
    if (i + STAGES - 1 < tiles) stage(i + STAGES - 1);
    mpiml_cp_commit();
}

// The block's inertia and number of changed labels (each thread's share) into out[0] and out[1]: warp shuffles,
// then the warps' totals added in warp order by thread 0 (called by every thread of the block: one barrier).
__device__ __forceinline__ void mpiml_block_totals(double inertia, long long changed, double* out) {
    __shared__ double red_inertia[MPIML_TC_WARPS];
    __shared__ long long red_changed[MPIML_TC_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        inertia += __shfl_xor_sync(0xffffffffu, inertia, off);
        changed += __shfl_xor_sync(0xffffffffu, changed, off);
    }
    if (lane == 0) { red_inertia[warp] = inertia; red_changed[warp] = changed; }
    __syncthreads();
    if (threadIdx.x == 0) {
        double v = 0.0;
        long long c = 0;
        for (int q = 0; q < MPIML_TC_WARPS; ++q) { v += red_inertia[q]; c += red_changed[q]; }
        out[0] = v;
        out[1] = (double)c;
    }
}

// cp.async of tiles of BR rows of the feature slab [f0, f0 + DS) of X into shared memory (row stride S), with
// the rows' labels and weights, by the block's threads (sums passes).  A thread copies the same 16-byte chunks
// of every tile (rows r + j * RS, chunk ci), so their offsets are set once and a tile costs a bound and a copy
// per chunk (offsets recomputed per tile were 84 instructions a warp per tile, the most of the SIMT pass, seen by
// Nsight on an H200).  Rows from r_end on and features from d on are zero-filled (label 0, weight 0: they add zeros).
template <typename T, int BR, int DS, int S, int VEC>
struct mpiml_row_stager {
    static constexpr int EV = VEC / sizeof(T), CPR = DS / EV, RS = MPIML_TC_THREADS / CPR, PER = BR / RS;
    static_assert(MPIML_TC_THREADS % CPR == 0 && BR % RS == 0, "whole rows of chunks per pass of the threads");
    long long src;     // r * d + f: the thread's first chunk from its tile's first row
    int dst, r, tid, d;
    bool fok;
    __device__ __forceinline__ mpiml_row_stager(int tid_, int d_, int f0) : tid(tid_), d(d_) {
        r = tid / CPR;
        const int ci = tid % CPR, f = f0 + ci * EV;
        fok = f < d;
        src = (long long)r * d + f;
        dst = r * S + ci * EV;
    }
    // rows [t0, min(t0 + BR, r_end)) into xd (BR x S), their labels into ld and weights into wd
    __device__ __forceinline__ void operator()(T* xd, int* ld, T* wd, const T* __restrict__ X,
                                               const int* __restrict__ labels, const T* __restrict__ w,
                                               long long t0, long long r_end) const {
        const int left = r_end - t0 < BR ? (int)(r_end - t0) : BR;
        const T* g = X + t0 * d + src;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const bool ok = fok && r + j * RS < left;
            mpiml_cp_async<VEC>(xd + dst + j * RS * S, ok ? g + (long long)j * RS * d : X, ok);
        }
        for (int rr = tid; rr < BR; rr += MPIML_TC_THREADS) {
            const bool ok = rr < left;
            mpiml_cp_async<4>(ld + rr, ok ? labels + t0 + rr : labels, ok);
            mpiml_cp_async<sizeof(T)>(wd + rr, ok ? w + t0 + rr : w, ok);
        }
    }
};

// N consecutive values from shared memory (16-byte aligned) by 16-byte loads
template <typename T, int N>
__device__ __forceinline__ void mpiml_load_vec(T (&v)[N], const T* p) {
    static_assert(N * sizeof(T) % 16 == 0, "whole 16-byte words");
#pragma unroll
    for (int q = 0; q < N * (int)sizeof(T) / 16; ++q) {
        if constexpr (sizeof(T) == 4) {
            const float4 f = reinterpret_cast<const float4*>(p)[q];
            v[4 * q] = f.x; v[4 * q + 1] = f.y; v[4 * q + 2] = f.z; v[4 * q + 3] = f.w;
        } else {
            const double2 f = reinterpret_cast<const double2*>(p)[q];
            v[2 * q] = f.x; v[2 * q + 1] = f.y;
        }
    }
}

// The per-cluster sums of one tile of rows on the tensor cores: oacc[m] += onehot^T x X for the
// clusters k0 + m * MT + [0, MT) and the 8 features fcol - g + [0, 8) of this warp, over the
// k-steps q0, q0 + qs, ... < q1 of the tile (KT rows each).  Xt: the tile, row stride S; lab, wv:
// labels (-1: no row) and weights of the tile's rows; sh: the shift of feature fcol.
template <typename T, int MTK, int AN, int S>
__device__ __forceinline__ void mpiml_tc_onehot(T (&oacc)[MTK][AN], const T* __restrict__ Xt,
                                                const int* __restrict__ lab, const T* __restrict__ wv,
                                                int fcol, T sh, int q0, int q1, int qs, int k0, int g, int t) {
    if constexpr (sizeof(T) == 4) {
        constexpr unsigned ONE = 0x3f800000u;
        for (int q = q0; q < q1; q += qs) {
            const int ra = q * 8 + t, rb = ra + 4;
            const int la = lab[ra] - k0, lb = lab[rb] - k0;
            const float xa = (Xt[ra * S + fcol] - sh) * wv[ra];
            const float xb = (Xt[rb * S + fcol] - sh) * wv[rb];
            const unsigned b0 = mpiml_tf32(xa), b1 = mpiml_tf32(xb);
            const unsigned s0 = mpiml_tf32(xa - __uint_as_float(b0)), s1 = mpiml_tf32(xb - __uint_as_float(b1));
#pragma unroll
            for (int m = 0; m < MTK; ++m) {
                const int c0 = m * 16 + g;
                const unsigned a[4] = {la == c0 ? ONE : 0u, la == c0 + 8 ? ONE : 0u,
                                       lb == c0 ? ONE : 0u, lb == c0 + 8 ? ONE : 0u};
                float p[4] = {0.f, 0.f, 0.f, 0.f};      // see the distance loop: no truncating accumulation
                mpiml_mma(p, a, s0, s1);
                mpiml_mma(p, a, b0, b1);
#pragma unroll
                for (int i = 0; i < 4; ++i) oacc[m][i] += p[i];
            }
        }
    } else {
        for (int q = q0; q < q1; q += qs) {
            const int r = q * 4 + t;
            const int l = lab[r] - k0;
            const double wr = wv[r];
            const double b = Xt[r * S + fcol] - sh;
#pragma unroll
            for (int m = 0; m < MTK; ++m) mpiml_mma(oacc[m], l == m * 8 + g ? wr : 0.0, b);
        }
    }
}

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

// Sums of a Lloyd step from the labels (when the distance kernel could not fuse them).  Block b:
// feature slab b % n_slabs (64 features), cluster chunk (b / n_slabs) % n_kc (MTK x MT clusters),
// rows [rows_per_block x split, + rows_per_block) with split = b / (n_slabs x n_kc); tiles of 128
// rows (and their labels and weights) double-buffered by cp.async; warp w adds features 8w..8w+7.
// Writes part[split x k x d + cluster x d + feature] (float64), summed over splits in a fixed order.
template <typename T, int MTK, int VEC>
__global__ void __launch_bounds__(MPIML_TC_THREADS, 1)
mpiml_distances_sums_tc(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                        const int* __restrict__ labels, const T* __restrict__ w, int k,
                        long long rows_per_block, double* __restrict__ part)
{
    using P = mpiml_tc<T>;
    constexpr bool F32 = sizeof(T) == 4;
    constexpr int MT = P::MT;
    constexpr int AN = F32 ? 4 : 2;
    constexpr int DS = 64, BR = 128;
    constexpr int S = DS + P::PAD;
    constexpr int KC = MTK * MT;

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    T* xbuf = reinterpret_cast<T*>(mpiml_tc_smem);          // 2 x [BR x S]
    T* w_s = xbuf + 2 * BR * S;                              // 2 x BR
    int* lab_s = reinterpret_cast<int*>(w_s + 2 * BR);      // 2 x BR

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n_slabs = (d + DS - 1) / DS, n_kc = (k + KC - 1) / KC;
    const int slab = blockIdx.x % n_slabs, kc = (blockIdx.x / n_slabs) % n_kc;
    const long long split = blockIdx.x / (n_slabs * n_kc);
    const int f0 = slab * DS, k0 = kc * KC;
    const long long r_begin = split * rows_per_block;
    const long long r_end = r_begin + rows_per_block < n ? r_begin + rows_per_block : n;
    const int fcol = warp * 8 + g;
    const T sh = (shift != nullptr && f0 + fcol < d) ? shift[f0 + fcol] : T(0);

    const mpiml_row_stager<T, BR, DS, S, VEC> stager(tid, d, f0);
    auto stage = [&](long long r0, int b) {
        stager(xbuf + b * BR * S, lab_s + b * BR, w_s + b * BR, X, labels, w, r0, r_end);
    };

    T oacc[MTK][AN];
    double dacc[F32 ? MTK : 1][AN];
#pragma unroll
    for (int m = 0; m < MTK; ++m)
#pragma unroll
        for (int i = 0; i < AN; ++i) { oacc[m][i] = T(0); dacc[F32 ? m : 0][i] = 0.0; }

    int b = 0;
    if (r_begin < r_end) stage(r_begin, 0);
    mpiml_cp_commit();
    for (long long r0 = r_begin; r0 < r_end; r0 += BR) {
        __syncthreads();
        if (r0 + BR < r_end) stage(r0 + BR, b ^ 1);
        mpiml_cp_commit();
        mpiml_cp_wait<1>();
        __syncthreads();
        mpiml_tc_onehot<T, MTK, AN, S>(oacc, xbuf + b * BR * S, lab_s + b * BR, w_s + b * BR, fcol, sh, 0,
                                       BR / P::KT, 1, k0, g, t);
        if constexpr (F32) {
#pragma unroll
            for (int m = 0; m < MTK; ++m)
#pragma unroll
                for (int i = 0; i < AN; ++i) { dacc[m][i] += (double)oacc[m][i]; oacc[m][i] = 0.f; }
        }
        b ^= 1;
    }
    mpiml_cp_wait<0>();

    double* mine = part + split * (long long)k * d;
#pragma unroll
    for (int m = 0; m < MTK; ++m)
#pragma unroll
        for (int i = 0; i < AN; ++i) {
            const int cl = k0 + m * MT + g + (F32 ? 8 * (i >> 1) : 0);
            const int f = f0 + warp * 8 + 2 * t + (i & 1);
            double v;
            if constexpr (F32) v = dacc[m][i]; else v = oacc[m][i];
            if (cl < k && f < d) mine[(long long)cl * d + f] = v;
        }
}

// The totals of a Lloyd step other than its sums, from the arg-min kernel's output, where the tensor-core path
// runs the arg-min kernel instead of the Lloyd kernel (float32, k <= 64, a sums pass after it): the Lloyd
// kernel's own count of the weights per cluster (a lane a cluster, every lane looking at every row of its warp)
// took 0.16 of its 2.14 ms at 10^7 x 64, k = 64, and its inertia and changed labels 0.14 more over the
// arg-min kernel (H200); here they cost a read of the rows' labels, weights and distances.  Block b takes the
// rows [b R, (b + 1) R): thread t adds the weights of rows t, t + 256, ... into its own column of cnt[k][256]
// (type T: at most R / 256 weights meet in a cell; columns: no bank conflict), their w * mind into its
// float64 inertia, counts the rows whose label changed and writes the new labels over the old ones; then up
// to 256 / k threads a cluster add its row of cnt in float64, their partials added in order, and the block
// writes [weights (k) | inertia | changed] to part[b] (k <= 256; shared memory: max(k 256 sizeof(T), 2 KB)).
// w == nullptr: unit weights.  Deterministic.
template <typename T>
__global__ void __launch_bounds__(MPIML_TC_THREADS)
mpiml_distances_step_totals(const int* __restrict__ fresh, int* __restrict__ labels, const T* __restrict__ w,
                            const T* __restrict__ mind, long long n, int k, int rows, double* __restrict__ part)
{
    constexpr int THREADS = MPIML_TC_THREADS;
    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    T* cnt = reinterpret_cast<T*>(mpiml_tc_smem);                 // k x THREADS
    const int tid = threadIdx.x;
    for (int c = 0; c < k; ++c) cnt[c * THREADS + tid] = T(0);
    const long long r0 = (long long)blockIdx.x * rows;
    const long long r1 = r0 + rows < n ? r0 + rows : n;
    double inertia = 0.0;
    long long changed = 0;
    long long r = r0 + tid;
    for (; r + 3 * THREADS < r1; r += 4 * THREADS) {              // four rows loaded before their adds
        int l[4], o[4];
        T v[4], m[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long ru = r + u * THREADS;
            l[u] = fresh[ru];
            o[u] = labels[ru];
            v[u] = w == nullptr ? T(1) : w[ru];
            m[u] = mind[ru];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            labels[r + u * THREADS] = l[u];
            changed += o[u] != l[u];
            inertia += (double)v[u] * (double)m[u];
            if ((unsigned)l[u] < (unsigned)k) cnt[l[u] * THREADS + tid] += v[u];
        }
    }
    for (; r < r1; r += THREADS) {
        const int l = fresh[r];
        const T v = w == nullptr ? T(1) : w[r];
        changed += labels[r] != l;
        labels[r] = l;
        inertia += (double)v * (double)mind[r];
        if ((unsigned)l < (unsigned)k) cnt[l * THREADS + tid] += v;
    }
    double* out = part + (long long)blockIdx.x * (k + 2);
    mpiml_block_totals(inertia, changed, out + k);                // its barrier: cnt is complete
    // G threads a cluster (a power of two, G k <= THREADS), each adding THREADS / G columns (rotated by c: no
    // bank conflict), then thread c adds the G partials in order
    int G = 1;
    while (2 * G * k <= THREADS) G *= 2;
    const int len = THREADS / G;
    double v = 0.0;
    const int c = tid % k, grp = tid / k;
    if (grp < G) {
        for (int i = 0; i < len; ++i) v += (double)cnt[c * THREADS + grp * len + (i + c) % len];
    }
    __syncthreads();
    double* red = reinterpret_cast<double*>(mpiml_tc_smem);        // G x k (cnt is read)
    if (grp < G) red[grp * k + c] = v;
    __syncthreads();
    if (tid < k) {
        double t = 0.0;
        for (int q = 0; q < G; ++q) t += red[q * k + tid];
        out[tid] = t;
    }
}

// Sums of a Lloyd step from the labels on the SIMT cores: the sums pass where the one-hot products
// would multiply k-fold more than they add (measured 7.8 ms at 2 10^6 x 1024, k = 64 float32 against
// 1.9 ms of reading X).  Block b: feature slab b % n_slabs (32 features, lane = feature), cluster range
// [k0, k0 + kc) with k0 = ((b / n_slabs) % n_kc) * kc, rows [rows_per_block * split, + rows_per_block)
// with split = b / (n_slabs * n_kc).  Tiles of BR = 8 RW rows with their labels and weights go to shared
// memory by cp.async, STAGES deep (bytes in flight, not warps, keep the reads at bandwidth), MINB blocks
// an SM (distances.sums_plan picks the three).  Warp w loads its RW consecutive rows of a tile into
// registers, then adds them to its own copy [kc][32] of type A, four rows at a time where their labels
// differ (four independent read-modify-writes), else two pairs one after the other, a pair of equal labels
// adding its two values first.  A = float (float32 data): the copies are half the size and the adds need
// no conversion; every FLUSH tiles the block adds them to a float64 total [kc][32] held in registers (TC
// cells a thread; at most FLUSH * RW = 128 values meet in a float32 cell).  The block adds its copies in order and writes
// part[split][cluster][feature]; the caller sums the splits in order.  Rows past the range are
// zero-filled (label 0, weight 0: they add zeros).  Deterministic.
template <typename T, typename A, int VEC, int STAGES, int MINB, int RW, int TC>
__global__ void __launch_bounds__(MPIML_TC_THREADS, MINB)
mpiml_distances_sums_simt(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                          const int* __restrict__ labels, const T* __restrict__ w, int k, int kc,
                          long long rows_per_block, double* __restrict__ part)
{
    constexpr bool NARROW = sizeof(A) == 4;
    constexpr int THREADS = MPIML_TC_THREADS, WARPS = MPIML_TC_WARPS;
    constexpr int DS = 32, FLUSH = 128 / RW;          // at most 128 adds a float32 cell between flushes
    static_assert(STAGES >= 2, "one tile ahead at least");
    constexpr int BR = RW * WARPS;                                  // rows of a tile
    static_assert(RW % 4 == 0, "groups of four rows");
    static_assert(NARROW == (TC > 0), "float64 totals (float32 copies only)");

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    T* xbuf = reinterpret_cast<T*>(mpiml_tc_smem);                 // STAGES x BR x DS
    T* w_s = xbuf + STAGES * BR * DS;                               // STAGES x BR
    int* lab_s = reinterpret_cast<int*>(w_s + STAGES * BR);         // STAGES x BR
    A* acc = reinterpret_cast<A*>(lab_s + STAGES * BR);             // WARPS x kc x DS

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_slabs = (d + DS - 1) / DS, n_kc = (k + kc - 1) / kc;
    const int f0 = (blockIdx.x % n_slabs) * DS, k0 = ((blockIdx.x / n_slabs) % n_kc) * kc;
    const long long split = blockIdx.x / (n_slabs * n_kc);
    const long long r_begin = split * rows_per_block;
    const long long r_end = r_begin + rows_per_block < n ? r_begin + rows_per_block : n;
    const int n_tiles = r_end > r_begin ? (int)((r_end - r_begin + BR - 1) / BR) : 0;
    const T sh = (shift != nullptr && f0 + lane < d) ? shift[f0 + lane] : T(0);
    for (int i = tid; i < WARPS * kc * DS; i += THREADS) acc[i] = A(0);
    double tot[TC > 0 ? TC : 1];                                    // cells tid + j THREADS of the total (NARROW)
#pragma unroll
    for (int j = 0; j < (TC > 0 ? TC : 1); ++j) tot[j] = 0.0;
    A* mine = acc + (long long)warp * kc * DS + lane;

    const mpiml_row_stager<T, BR, DS, DS, VEC> stager(tid, d, f0);
    auto stage = [&](int tl) {
        const int b = tl % STAGES;
        stager(xbuf + b * BR * DS, lab_s + b * BR, w_s + b * BR, X, labels, w, r_begin + (long long)tl * BR, r_end);
    };
    // the float32 copies into the float64 total, cell by cell in copy order (every thread, after a barrier)
    auto flush = [&]() {
        __syncthreads();
#pragma unroll
        for (int j = 0; j < TC; ++j) {
            const int i = tid + j * THREADS;
            if (i >= kc * DS) break;
            double v = tot[j];
#pragma unroll
            for (int q = 0; q < WARPS; ++q) {
                v += (double)acc[q * kc * DS + i];
                acc[q * kc * DS + i] = A(0);
            }
            tot[j] = v;
        }
    };

    mpiml_tiles_start<STAGES>(n_tiles, stage);
    int since = 0, b = 0;
    for (int tl = 0; tl < n_tiles; ++tl) {
        mpiml_tiles_next<STAGES>(tl, n_tiles, stage);
        // this warp's rows of the tile (RW consecutive rows: labels and weights by 16-byte loads) into
        // registers first: the adds below may alias the tile as far as the compiler knows (one shared
        // array), so loads after them would wait for every store
        const T* xt = xbuf + (b * BR + warp * RW) * DS + lane;
        const int4* lt = reinterpret_cast<const int4*>(lab_s + b * BR + warp * RW);
        const T* wt = w_s + b * BR + warp * RW;
        int lab[RW];
        A val[RW];
#pragma unroll
        for (int u = 0; u < RW; u += 4) {
            const int4 l4 = lt[u / 4];
            lab[u] = l4.x - k0; lab[u + 1] = l4.y - k0; lab[u + 2] = l4.z - k0; lab[u + 3] = l4.w - k0;
        }
        T wv[RW];
        mpiml_load_vec<T, RW>(wv, wt);
#pragma unroll
        for (int u = 0; u < RW; ++u) val[u] = (A)(xt[u * DS] - sh) * (A)wv[u];
        if (++b == STAGES) b = 0;
#pragma unroll
        for (int u = 0; u < RW; u += 4) {
            const int l0 = lab[u], l1 = lab[u + 1], l2 = lab[u + 2], l3 = lab[u + 3];
            const bool o0 = (unsigned)l0 < (unsigned)kc, o1 = (unsigned)l1 < (unsigned)kc;
            const bool o2 = (unsigned)l2 < (unsigned)kc, o3 = (unsigned)l3 < (unsigned)kc;
            if (o0 && o1 && o2 && o3 && l0 != l1 && l0 != l2 && l0 != l3 && l1 != l2 && l1 != l3 && l2 != l3) {
                // four distinct cells (most groups when k is not tiny): four independent read-modify-writes
                const A x0 = mine[l0 * DS], x1 = mine[l1 * DS], x2 = mine[l2 * DS], x3 = mine[l3 * DS];
                mine[l0 * DS] = x0 + val[u];
                mine[l1 * DS] = x1 + val[u + 1];
                mine[l2 * DS] = x2 + val[u + 2];
                mine[l3 * DS] = x3 + val[u + 3];
                continue;
            }
#pragma unroll
            for (int p = u; p < u + 4; p += 2) {      // otherwise two pairs, one after the other
                const int la = lab[p], lb = lab[p + 1];
                const bool oa = (unsigned)la < (unsigned)kc, ob = (unsigned)lb < (unsigned)kc;
                if (la == lb) {
                    if (oa) mine[la * DS] += val[p] + val[p + 1];
                } else {
                    const A x0 = oa ? mine[la * DS] : A(0);
                    const A x1 = ob ? mine[lb * DS] : A(0);
                    if (oa) mine[la * DS] = x0 + val[p];
                    if (ob) mine[lb * DS] = x1 + val[p + 1];
                }
            }
        }
        if constexpr (NARROW) {
            if (++since == FLUSH) {
                since = 0;
                flush();                         // the next adds come after the next tile's barrier
            }
        }
    }
    mpiml_cp_wait<0>();
    if constexpr (NARROW) flush();
    __syncthreads();
    double* out = part + split * (long long)k * d;
#pragma unroll
    for (int j = 0; j < (NARROW ? TC : 1); ++j) {
        for (int i = tid + j * THREADS; i < kc * DS; i += NARROW ? kc * DS : THREADS) {
            const int cl = k0 + i / DS, f = f0 + i % DS;
            if (cl >= k || f >= d) continue;
            double v = tot[j];
            if constexpr (!NARROW) {
                for (int q = 0; q < WARPS; ++q) v += (double)acc[(long long)q * kc * DS + i];
            }
            out[(long long)cl * d + f] = v;
        }
    }
}

// The arg-min (MODE 0) or the whole local Lloyd step (MODE 1) for small d and k: see the file's head.
// R rows a thread (rows tid + 256 r of a tile of 256 R): every broadcast load of a centre feeds R rows, since
// shared memory delivers 128 bytes a cycle to the lanes, a quarter of what the FMA units take.
// Shared memory, in this order (every part a multiple of 16 bytes; distances.small_plan mirrors it):
// MODE 1: tot [KP x DP + KP] float64 (A = float only), acc [COPIES][KP x DP] A, cnt [WARPS][KP] A;
// then xbuf [STAGES][256 R x SX] T, cs [KP x DP] T, csq [KP] T, sh [DP] T;
// MODE 1: w_s [STAGES][256 R] T, ol_s [STAGES][256 R] int (previous labels), lab_s [256 R] int.
template <typename T, int N>
struct mpiml_small_centres {
    T v[N];
};

// CB: the small kernel's [centres KP x DP | norms KP] in constant memory, written by a device-to-device copy
// queued on the stream before each launch (distances._small_bank_fill), for centres that are on the device:
// the FMAs read them as constant-bank operands as they read parameters, and the host waits for nothing.  One
// bank per module, that is per instantiation and device; each fill waits for its last use (an event).
__constant__ __align__(16) float mpiml_small_bank_f[32 * 32 + 32];
__constant__ __align__(16) double mpiml_small_bank_d[32 * 32 + 32];

template <typename T> __device__ __forceinline__ T mpiml_small_bank(int i);
template <> __device__ __forceinline__ float mpiml_small_bank<float>(int i) { return mpiml_small_bank_f[i]; }
template <> __device__ __forceinline__ double mpiml_small_bank<double>(int i) { return mpiml_small_bank_d[i]; }

// The bank's contents from k x d centres C (contiguous): zero padded to KP x DP, the squared norms summed
// feature by feature in float64 without contraction (the host's np.add.accumulate of float64 squares: the
// parameters' bits) and rounded to T, +inf past k.  One block.
template <typename T>
__global__ void mpiml_small_bank_pack(const T* __restrict__ C, int k, int d, int KP, int DP, T* __restrict__ out)
{
    for (int i = threadIdx.x; i < KP * DP + KP; i += blockDim.x) {
        if (i < KP * DP) {
            const int c = i / DP, f = i % DP;
            out[i] = (c < k && f < d) ? C[(long long)c * d + f] : T(0);
        } else {
            const int c = i - KP * DP;
            double s = 0.0;
            for (int f = 0; f < d; ++f) {
                const double v = (double)C[(long long)c * d + f];
                s = __dadd_rn(s, __dmul_rn(v, v));
            }
            out[i] = c < k ? (T)s : mpiml_tc<T>::inf();
        }
    }
}

template <typename T, typename A, int DP, int KP, int VEC, int MODE, int STAGES, int R, bool PC, bool CB = false>
__global__ void __launch_bounds__(MPIML_TC_THREADS, R == 1 && (sizeof(T) == 4 || DP <= 16) ? 2 : 1)
mpiml_distances_small(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                      const T* __restrict__ C, int k, const T* __restrict__ w, int* __restrict__ labels,
                      T* __restrict__ mind, double* __restrict__ part,
                      const mpiml_small_centres<T, PC && !CB ? KP * DP + KP : 1> pc)
{
    constexpr int THREADS = MPIML_TC_THREADS, WARPS = MPIML_TC_WARPS, BR = MPIML_TC_THREADS * R;
    constexpr int EV = 16 / sizeof(T);                    // values of a 16-byte word
    constexpr int SX = (DP / EV) % 2 ? DP : DP + EV;      // row stride of a staged tile
    constexpr int EC = VEC / sizeof(T);                   // values of one cp.async
    constexpr int CPR = DP / EC;
    // two rows an instruction where a row takes half a warp (its own copy each: no lane of the other half adds
    // to its cells); float64 copies keep one row an instruction (two copies a warp would halve the blocks an SM)
    constexpr bool LLOYD = MODE == 1, NARROW = sizeof(A) == 4, PAIRS = DP <= 16 && NARROW;
    constexpr int HALVES = PAIRS ? 2 : 1, COPIES = WARPS * HALVES;
    constexpr int FLUSH = 4 / R > 0 ? 4 / R : 1;          // tiles between flushes: <= 128 adds a float32 cell
    constexpr int CELLS = KP * DP;
    static_assert(DP % EV == 0 && DP <= 32 && KP % 4 == 0 && KP >= 8 && KP <= 32, "small shapes only");
    static_assert(PC || !CB, "the constant bank replaces the parameters");

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    unsigned char* p = mpiml_tc_smem;
    double* tot = reinterpret_cast<double*>(p);
    p += (LLOYD && NARROW) ? (CELLS + KP) * sizeof(double) : 0;
    A* acc = reinterpret_cast<A*>(p);
    p += LLOYD ? COPIES * CELLS * sizeof(A) : 0;
    A* cnt = reinterpret_cast<A*>(p);
    p += LLOYD ? WARPS * KP * sizeof(A) : 0;
    T* xbuf = reinterpret_cast<T*>(p);
    T* cs = xbuf + STAGES * BR * SX;
    T* csq = cs + CELLS;
    T* sh = csq + KP;
    T* w_s = sh + DP;
    int* ol_s = reinterpret_cast<int*>(w_s + (LLOYD ? STAGES * BR : 0));
    int* lab_s = ol_s + STAGES * BR;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long n_tiles = (n + BR - 1) / BR;
    const long long my_tiles = blockIdx.x < n_tiles ? (n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;

    // a tile of rows (and, MODE 1, their weights and previous labels) into buffer i % STAGES
    auto stage = [&](long long i) {
        const int b = (int)(i % STAGES);
        const long long r0 = (blockIdx.x + i * gridDim.x) * BR;
        T* xd = xbuf + b * BR * SX;
        for (int e = tid; e < BR * CPR; e += THREADS) {
            const int r = e / CPR, f = (e % CPR) * EC;
            const long long row = r0 + r;
            const bool ok = row < n && f < d;
            mpiml_cp_async<VEC>(xd + r * SX + f, ok ? X + row * d + f : X, ok);
        }
        if constexpr (LLOYD) {
            for (int r = tid; r < BR; r += THREADS) {
                const long long row = r0 + r;
                const bool ok = row < n;
                mpiml_cp_async<4>(ol_s + b * BR + r, ok ? labels + row : labels, ok);
                mpiml_cp_async<sizeof(T)>(w_s + b * BR + r, ok ? w + row : w, ok);
            }
        }
    };
    mpiml_tiles_start<STAGES>(my_tiles, stage);

    // the centres (zero past k and d; PC: C is null, the centres are parameters), the shift, the copies
    if constexpr (!PC) {
        for (int i = tid; i < CELLS; i += THREADS) {
            const int c = i / DP, f = i % DP;
            cs[i] = (c < k && f < d) ? C[(long long)c * d + f] : T(0);
        }
    }
    for (int f = tid; f < DP; f += THREADS) sh[f] = (shift != nullptr && f < d) ? shift[f] : T(0);
    if constexpr (LLOYD) {
        for (int i = tid; i < COPIES * CELLS; i += THREADS) acc[i] = A(0);
        for (int i = tid; i < WARPS * KP; i += THREADS) cnt[i] = A(0);
        if constexpr (NARROW) {
            for (int i = tid; i < CELLS + KP; i += THREADS) tot[i] = 0.0;
        }
    }
    __syncthreads();
    for (int c = tid; c < (PC ? 0 : KP); c += THREADS) {
        T v = mpiml_tc<T>::inf();                         // past k: never nearer than a real centre
        if (c < k) {
            v = T(0);
#pragma unroll
            for (int f = 0; f < DP; ++f) v = fma(cs[c * DP + f], cs[c * DP + f], v);
        }
        csq[c] = v;
    }
    const bool shifted = shift != nullptr;

    // the float32 copies into the float64 total, cell by cell in copy order (every thread, after a barrier)
    auto flush = [&]() {
        __syncthreads();
        for (int i = tid; i < CELLS + KP; i += THREADS) {
            double v = tot[i];
            A* src = i < CELLS ? acc + i : cnt + (i - CELLS);
            const int stride = i < CELLS ? CELLS : KP;
#pragma unroll
            for (int q = 0; q < (i < CELLS ? COPIES : WARPS); ++q) {
                v += (double)src[q * stride];
                src[q * stride] = A(0);
            }
            tot[i] = v;
        }
    };

    // NV (label, value) pairs of this lane into column f of its warp's copy (label < 0: nothing), four
    // independent read-modify-writes where the four labels differ, else one after the other
    auto add_column = [&](A* col, const int (&lab)[16], const A (&val)[16]) {
#pragma unroll
        for (int u = 0; u < 16; u += 4) {
            const int l0 = lab[u], l1 = lab[u + 1], l2 = lab[u + 2], l3 = lab[u + 3];
            if ((l0 | l1 | l2 | l3) >= 0 && l0 != l1 && l0 != l2 && l0 != l3 && l1 != l2 && l1 != l3 && l2 != l3) {
                const A x0 = col[l0 * DP], x1 = col[l1 * DP], x2 = col[l2 * DP], x3 = col[l3 * DP];
                col[l0 * DP] = x0 + val[u];
                col[l1 * DP] = x1 + val[u + 1];
                col[l2 * DP] = x2 + val[u + 2];
                col[l3 * DP] = x3 + val[u + 3];
            } else {
#pragma unroll
                for (int q = u; q < u + 4; ++q)
                    if (lab[q] >= 0) col[lab[q] * DP] += val[q];
            }
        }
    };

    double my_inertia = 0.0;
    long long my_changed = 0;
    int since = 0;
    for (long long i = 0; i < my_tiles; ++i) {
        mpiml_tiles_next<STAGES>(i, my_tiles, stage);
        const int b = (int)(i % STAGES);
        const T* xt = xbuf + b * BR * SX;
        const long long row0 = (blockIdx.x + i * gridDim.x) * BR + tid;

        // this thread's rows, shifted, and their squared norms
        T x[R][DP], xsq[R];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const T* xr = xt + (tid + rr * THREADS) * SX;
#pragma unroll
            for (int f = 0; f < DP; f += EV) {
                if constexpr (sizeof(T) == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(xr + f);
                    x[rr][f] = v.x; x[rr][f + 1] = v.y; x[rr][f + 2] = v.z; x[rr][f + 3] = v.w;
                } else {
                    const double2 v = *reinterpret_cast<const double2*>(xr + f);
                    x[rr][f] = v.x; x[rr][f + 1] = v.y;
                }
            }
            if (shifted) {
#pragma unroll
                for (int f = 0; f < DP; ++f) x[rr][f] -= sh[f];
            }
            xsq[rr] = T(0);
#pragma unroll
            for (int f = 0; f < DP; ++f) xsq[rr] = fma(x[rr][f], x[rr][f], xsq[rr]);
        }

        // ||c||^2 - 2 x.c for every centre, four at a time; ties keep the lower index
        T best[R];
        int bj[R];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) { best[rr] = mpiml_tc<T>::inf(); bj[rr] = 0; }
#pragma unroll
        for (int j = 0; j < KP; j += 4) {
            T dot[4][R];
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int rr = 0; rr < R; ++rr) dot[q][rr] = T(0);
#pragma unroll
            for (int f = 0; f < DP; f += EV) {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const T* c = cs + (j + q) * DP + f;
                    if constexpr (PC) {
                        // the centres are kernel parameters: constant-bank operands of the FMAs, no loads
#pragma unroll
                        for (int e = 0; e < EV; ++e) {
                            T cv;
                            if constexpr (CB) cv = mpiml_small_bank<T>((j + q) * DP + f + e);
                            else cv = pc.v[(j + q) * DP + f + e];
#pragma unroll
                            for (int rr = 0; rr < R; ++rr) dot[q][rr] = fma(x[rr][f + e], cv, dot[q][rr]);
                        }
                    } else if constexpr (sizeof(T) == 4) {
                        const float4 v = *reinterpret_cast<const float4*>(c);
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
                            dot[q][rr] = fma(x[rr][f], v.x, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 1], v.y, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 2], v.z, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 3], v.w, dot[q][rr]);
                        }
                    } else {
                        const double2 v = *reinterpret_cast<const double2*>(c);
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
                            dot[q][rr] = fma(x[rr][f], v.x, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 1], v.y, dot[q][rr]);
                        }
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                T cq;
                if constexpr (CB) cq = mpiml_small_bank<T>(KP * DP + j + q);
                else cq = PC ? pc.v[KP * DP + j + q] : csq[j + q];
#pragma unroll
                for (int rr = 0; rr < R; ++rr) {
                    const T dist = fma(T(-2), dot[q][rr], cq);
                    if (dist < best[rr]) { best[rr] = dist; bj[rr] = j + q; }
                }
            }
        }

#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const long long row = row0 + rr * THREADS;
            T dist = best[rr] + xsq[rr];
            dist = dist > T(0) ? dist : T(0);
            if constexpr (!LLOYD) {
                if (row < n) { labels[row] = bj[rr]; mind[row] = dist; }
            } else {
                const int r = tid + rr * THREADS;
                int lab = -1;
                if (row < n) {
                    const T wt = w_s[b * BR + r];
                    my_changed += ol_s[b * BR + r] != bj[rr];
                    my_inertia += (double)wt * (double)dist;
                    atomicAdd(&cnt[warp * KP + bj[rr]], (A)wt);
                    labels[row] = bj[rr];
                    mind[row] = dist;
                    lab = bj[rr];
                }
                lab_s[r] = lab;
            }
        }
        if constexpr (LLOYD) {
            __syncwarp();
            // the warp's rows into its copies, lane = feature: values and labels first (the adds may alias
            // them as far as the compiler knows), then the adds
            A* mine = acc + warp * HALVES * CELLS;
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
                const int rb = rr * THREADS + warp * 32;
                const int* lw = lab_s + rb;
                const T* xw = xt + rb * SX;
                const T* ww = w_s + b * BR + rb;
                if constexpr (PAIRS) {
                    // two rows an instruction: lanes 16 h + f take row 2 q + h into copy h
                    const int h = lane >> 4, f = lane & 15;
                    const bool on = f < DP;
                    const T shf = on ? sh[f] : T(0);
                    int lab[16];
                    A val[16];
#pragma unroll
                    for (int q = 0; q < 16; ++q) {
                        const int r = 2 * q + h;
                        lab[q] = on ? lw[r] : -1;
                        val[q] = on ? (A)(xw[r * SX + f] - shf) * (A)ww[r] : A(0);
                    }
                    add_column(mine + h * CELLS + (on ? f : 0), lab, val);
                } else {
                    const int f = lane;
                    const bool on = f < DP;
                    const T shf = on ? sh[f] : T(0);
#pragma unroll
                    for (int half = 0; half < 32; half += 16) {
                        int lab[16];
                        A val[16];
#pragma unroll
                        for (int q = 0; q < 16; ++q) {
                            const int r = half + q;
                            lab[q] = on ? lw[r] : -1;
                            val[q] = on ? (A)(xw[r * SX + f] - shf) * (A)ww[r] : A(0);
                        }
                        add_column(mine + (on ? f : 0), lab, val);
                    }
                }
            }
            if constexpr (NARROW) {
                if (++since == FLUSH) {
                    since = 0;
                    flush();                              // the next adds come after the next tile's barrier
                }
            }
        }
    }
    mpiml_cp_wait<0>();
    if constexpr (LLOYD) {
        if constexpr (NARROW) flush();
        __syncthreads();
        // [sums (k x d) | weights (k) | inertia | changed] of this block, summed in block order by the caller
        const long long P = (long long)k * d + k + 2;
        double* out = part + (long long)blockIdx.x * P;
        for (int i = tid; i < k * d + k; i += THREADS) {
            const int cell = i < k * d ? (i / d) * DP + i % d : CELLS + (i - k * d);
            double v;
            if constexpr (NARROW) {
                v = tot[cell];
            } else {
                v = 0.0;
                const A* src = cell < CELLS ? acc + cell : cnt + (cell - CELLS);
                const int stride = cell < CELLS ? CELLS : KP;
                for (int q = 0; q < (cell < CELLS ? COPIES : WARPS); ++q) v += (double)src[q * stride];
            }
            out[i] = v;
        }
        mpiml_block_totals(my_inertia, my_changed, out + P - 2);
    }
}

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

// The centres in the fragment order of mpiml_distances_tc (see distances.pack_centres) and c_sq.
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
