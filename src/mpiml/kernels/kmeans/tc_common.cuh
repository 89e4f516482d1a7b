// Distances on the tensor cores (sm_80 and later), fused with the arg-min and the Lloyd sums.
//
// One program in five files, which the loader compiles as one source in this order (kmeans/_common.py
// TC_FILES): this header (the family, the fragment layouts, the shared device helpers: mma, cp.async, the
// tile pipeline, block totals, the row stager, the one-hot sums), tc.cu (mpiml_distances_tc, mpiml_tc_pack),
// sums.cu (the sums passes), small.cu (mpiml_distances_small and its constant bank) and small_tc.cu
// (mpiml_distances_small_tc).
//
// float32: mma.sync m16n8k8 TF32 with a 3xTF32 split (x = big + small, both TF32; the product
// big*big + big*small + small*big keeps float32 accuracy).  float64: mma.sync m8n8k4 (DMMA).
//
//   mpiml_distances_tc<T, WMT, BN, DK, VEC, MODE, MTK, MINB, STAGES = 2>
//       persistent grid of 256-thread blocks.  A block takes a tile of BM = 8 warps x WMT x MT rows
//       and walks the centres in chunks of BN, the features in slabs of DK.  Slabs of X go from
//       global to shared memory by cp.async (no registers), STAGES - 1 steps ahead of the one computed.
//       The centres come pre-split and pre-arranged in fragment order (`Cp`, built by
//       kmeans/_tc.py), so one 16-byte shared load gives a lane its fragment; when everything
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
//       float32, d <= DQ (8, 16, 32), k <= KP, KP x DQ <= 512 (kmeans/_small.py small_plan takes <= 256): the small
//       kernel's job on the tensor cores, 3xTF32 distances and one-hot Lloyd sums (see the kernel).
//
//   mpiml_tc_pack<T, BN, DK>
//       the centres in fragment order (`Cp`, the layout of kmeans/_tc.py pack_centres, float32 split
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
// kmeans/_tc.py's _tf32 (the centres are split there).
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
