// One-pass reductions of the linear models (mpiml.linear_model): each kernel reads X once.
// Longer than 800 lines because the Gram kernel's variants (mpiml.kernels.linear times them per device and
// keeps the fastest) share their tile-group helpers and ship as one program per element type.
//
// mpiml_linear_gram<T, W>: partial augmented Gram matrices.  Row i of the virtual matrix Z is
// [x_i (d values), y_i (t values), 1], padded with zeros to kp = 4 * nt columns; the kernel sums
// (w_i) z_i z_iᵀ over the rows, so one k x k matrix (k = d + t + 1) holds XᵀWX, XᵀWY, YᵀWY, the
// weighted column sums of X and Y and the weight total.  Every product of two float32 values is
// exact in double and every sum is a double: the result is the float64 Gram of the data, whatever
// T is.  A block owns a contiguous range of rows, staged STAGE rows at a time in shared memory
// (converted to double once); thread j < ntiles owns the 4 x 4 tile (a, b), a <= b, of the upper
// triangle of tiles, in registers.  Block g writes its tiles to partial[g * kp * kp ...]; entries
// of tiles below the diagonal are not written (the caller reads the upper triangle).
//
// mpiml_linear_logistic<T, MODE, CPL>: one pass of the binary logistic objective.  A warp takes R
// rows at a time (R = 16, 8, 4 for CPL <= 2, 4, 8; lane l holds columns l, l + 32, ... : CPL of
// them), forms the margins m = x·coef + b by one transposing butterfly of shuffles, then, one lane
// group per row,
//   MODE 0:  loss += sw·(softplus(m) - y m),  g = sw·(expit(m) - y),  grad += g x,  gsum += g;
//   MODE 1:  u = x·vec + vb,  q = sw·p(1 - p)·u  (p = expit(m)),  grad += q x,  gsum += q
// (the Hessian-vector product at coef).  Block g writes [loss, gsum, grad (d)] to
// partial[g * (d + 2) ...].
//
// mpiml_linear_sum_blocks: out[j] = Σ_g partial[g * m + j], one warp per output in a fixed order (deterministic).

#define MPIML_LINEAR_STAGE 32
#define MPIML_LINEAR_LOGISTIC_THREADS 256

template <typename T, bool W>
__global__ void __launch_bounds__(512)
mpiml_linear_gram(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ Y, const int t,
                  const T* __restrict__ w, const long long rows_per_block, const int kp, const int ntiles,
                  double* __restrict__ partial) {
    extern __shared__ double zs[];                  // MPIML_LINEAR_STAGE x kp, then MPIML_LINEAR_STAGE weights
    double* ws = zs + MPIML_LINEAR_STAGE * kp;
    const int tid = threadIdx.x;
    const int nt = kp / 4;
    const int extra = kp - d;                       // y columns, the ones column, the padding
    const bool active = tid < ntiles;
    // e / d for e < STAGE * kp (< 2^12) by a float product: (e + 1/2) / d lies at least 1/(2d) >= 1/256 from
    // an integer, far beyond the float rounding of the product (about 2^12 * 2^-24), so truncation is exact
    // and the staging loops need no integer division
    const float inv_d = 1.0f / (float)d;
    const float inv_extra = 1.0f / (float)extra;
    int a = 0, b = 0;
    if (active) {                                   // tid -> (a, b): row a of the tile triangle holds nt - a tiles
        int rem = tid;
        while (rem >= nt - a) {
            rem -= nt - a;
            ++a;
        }
        b = a + rem;
    }
    double acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;

    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    for (long long s = r0; s < r1; s += MPIML_LINEAR_STAGE) {
        const int m = (int)min((long long)MPIML_LINEAR_STAGE, r1 - s);
        __syncthreads();                            // the previous stage is consumed
        const T* xs = X + s * d;                    // m * d contiguous values
        for (int e = tid; e < MPIML_LINEAR_STAGE * d; e += blockDim.x) {
            const int r = (int)(((float)e + 0.5f) * inv_d);   // e / d: exact, see the note at inv_d
            zs[r * kp + (e - r * d)] = (r < m) ? (double)xs[e] : 0.0;
        }
        for (int e = tid; e < MPIML_LINEAR_STAGE * extra; e += blockDim.x) {
            const int r = (int)(((float)e + 0.5f) * inv_extra);
            const int c = e - r * extra;            // column d + c of Z
            double v = 0.0;
            if (r < m) {
                if (c < t) v = (double)Y[(s + r) * t + c];
                else if (c == t) v = 1.0;
            }
            zs[r * kp + d + c] = v;
        }
        if (W) {
            for (int e = tid; e < MPIML_LINEAR_STAGE; e += blockDim.x) ws[e] = (e < m) ? (double)w[s + e] : 0.0;
        }
        __syncthreads();
        if (active) {
            for (int r = 0; r < m; ++r) {
                const double2* za2 = reinterpret_cast<const double2*>(zs + r * kp + 4 * a);
                const double2* zb2 = reinterpret_cast<const double2*>(zs + r * kp + 4 * b);
                const double2 p0 = za2[0], p1 = za2[1], q0 = zb2[0], q1 = zb2[1];
                double za[4] = {p0.x, p0.y, p1.x, p1.y};
                const double zb[4] = {q0.x, q0.y, q1.x, q1.y};
                if (W) {
                    const double wr = ws[r];
#pragma unroll
                    for (int i = 0; i < 4; ++i) za[i] *= wr;
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fma(za[i], zb[j], acc[i][j]);
            }
        }
    }
    if (active) {
        double* out = partial + (long long)blockIdx.x * kp * kp;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) out[(4 * a + i) * kp + 4 * b + j] = acc[i][j];
    }
}

// mpiml_linear_gram_mma<T, W, NT>: the same partial Gram matrices on the float64 tensor cores
// (DMMA, mma.m8n8k4 .f64, sm_80 and later), for the same exact products and float64 sums.  Columns
// are padded to kp = 8 * nt (multiple of 8); the upper triangle of 8 x 8 tiles (I <= J) is shared
// among (nt + 1) / 2 warps, warp w taking tile rows w and nt - 1 - w: nt + 1 tiles each (one row for
// the middle warp when nt is odd), so the warps are balanced.  Per k-step of 4 staged rows a warp
// loads one B fragment per tile (one double per lane; its rows' A fragments are among them) and
// issues one DMMA per tile, all indices constant (a code path per warp, mpiml_linear_gram_stage).  Staged rows have a stride of kp + 4 doubles, so the 4 rows x 8 columns a
// half-warp reads fall in 16 distinct 8-byte banks.  Fragments (g = lane / 4, t = lane % 4): A a0 =
// Zᵀ(8I + g, row t) = Z(row t, 8I + g), B b0 = Z(row t, 8J + g), C (8I + g, 8J + 2t + {0, 1}).  While
// the tensor cores work on one stage, the next one's rows are in flight into registers.  Block b
// writes the tiles it owns to partial[b * kp * kp ...] (the lower triangle is not written).
#define MPIML_LINEAR_MMA_STAGE 32

__device__ __forceinline__ void mpiml_linear_dmma(double (&c)[2], const double a, const double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
}

// One staged block of rows on the tensor cores for warp WID of mpiml_linear_gram_mma<.., NT>: its tile
// rows, their split and its tile count are constants, so the k-step is NTILES fragment loads and NTILES
// DMMAs with nothing in between (the A fragment of row I0 is the B fragment of column I0, that of row
// I1 the one of column I1 = j - 1 at j = SPLIT).
template <bool W, int NT, int WID>
__device__ __forceinline__ void mpiml_linear_gram_stage(double (&acc)[NT + 1][2], const double* zs, const double* ws,
                                                        const int ld, const int g, const int tq) {
    constexpr int I0 = WID, I1 = NT - 1 - WID, SPLIT = NT - WID;
    constexpr int NTILES = I0 < I1 ? NT + 1 : SPLIT;
#pragma unroll 2
    for (int k4 = 0; k4 < MPIML_LINEAR_MMA_STAGE; k4 += 4) {
        const double* zr = zs + (k4 + tq) * ld + g;
        double b[NTILES];
#pragma unroll
        for (int j = 0; j < NTILES; ++j) b[j] = zr[8 * (j < SPLIT ? I0 + j : j - 1)];
        double a0 = b[0];
        double a1 = b[NTILES > SPLIT ? SPLIT : 0];
        if (W) {
            const double wr = ws[k4 + tq];
            a0 *= wr;
            a1 *= wr;
        }
#pragma unroll
        for (int j = 0; j < NTILES; ++j) mpiml_linear_dmma(acc[j], j < SPLIT ? a0 : a1, b[j]);
    }
}

template <bool W, int NT, int WID>
__device__ __forceinline__ void mpiml_linear_gram_warp(const int warp, double (&acc)[NT + 1][2], const double* zs,
                                                       const double* ws, const int ld, const int g, const int tq) {
    if (warp == WID) mpiml_linear_gram_stage<W, NT, WID>(acc, zs, ws, ld, g, tq);
    else if constexpr (WID + 1 < (NT + 1) / 2) mpiml_linear_gram_warp<W, NT, WID + 1>(warp, acc, zs, ws, ld, g, tq);
}

template <typename T, bool W, int NT>          // nt = NT = kp / 8 (1 .. 16: k <= 128)
__global__ void __launch_bounds__(256, 2)
mpiml_linear_gram_mma(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ Y, const int t,
                      const T* __restrict__ w, const long long rows_per_block, const int kp,
                      double* __restrict__ partial) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) double zs[];    // MPIML_LINEAR_MMA_STAGE x (kp + 4), then the stage's weights
    const int ld = kp + 4;
    double* ws = zs + MPIML_LINEAR_MMA_STAGE * ld;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    constexpr int nt = NT;
    const int I0 = warp, I1 = nt - 1 - warp;        // the warp's two tile rows (I0 <= I1; equal: one row)
    const bool active = I0 <= I1;
    const int extra = kp - d;
    const float inv_d = 1.0f / (float)d;            // exact e / d by a float product, as in mpiml_linear_gram
    // the warp's tiles in one array: acc[j] for j < nt - I0 is tile (I0, I0 + j), then tile (I1, j - 1)
    // (row I1 = nt - 1 - I0 holds columns I1 .. nt - 1, which is j - 1 for j = nt - I0 .. nt)
    const int split = nt - I0;
    const int ntiles = I0 < I1 ? nt + 1 : split;
    double acc[NT + 1][2];
#pragma unroll
    for (int j = 0; j <= NT; ++j) acc[j][0] = acc[j][1] = 0.0;

    // X's rows of a stage are one contiguous run of STAGE * d values: when a row is a whole number of
    // 16-byte units, the next stage is loaded as such units into registers while the tensor cores work
    // on the current one (VPT units per thread cover a stage: threads >= 2 k >= 2 d, so STAGE * d * 4 / 16
    // / threads <= 4 for float and <= 8 for double; checked, else the plain staging)
    constexpr int VPT = sizeof(T) == 4 ? 4 : 8;
    constexpr int EPU = 16 / sizeof(T);             // values per unit
    const bool vec = (d % EPU) == 0 && MPIML_LINEAR_MMA_STAGE * d / EPU <= VPT * (int)blockDim.x;
    uint4 buf[VPT];
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    // the stage's y values (STAGE * t of them, contiguous) and weights ride along, one per thread
    const bool yreg = MPIML_LINEAR_MMA_STAGE * t <= (int)blockDim.x;
    T ybuf = (T)0, wbuf = (T)0;
    auto prefetch = [&](long long s) {
        const int m = (int)min((long long)MPIML_LINEAR_MMA_STAGE, r1 - s);
        if (vec) {
            const int units = m * d / EPU;
            const uint4* src = reinterpret_cast<const uint4*>(X + s * d);
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                const int i = tid + u * blockDim.x;
                if (i < units) buf[u] = src[i];
            }
        }
        if (yreg && tid < m * t) ybuf = Y[s * t + tid];
        if (W && tid < m) wbuf = w[s + tid];
    };
    {                                               // the ones column and the padding, the same for every stage
        const int ones = extra - t;
        for (int e = tid; e < MPIML_LINEAR_MMA_STAGE * ones; e += blockDim.x) {
            const int r = e / ones;
            const int c = e - r * ones;
            zs[r * ld + d + t + c] = c == 0 ? 1.0 : 0.0;
        }
    }
    if (r0 < r1) prefetch(r0);
    for (long long s = r0; s < r1; s += MPIML_LINEAR_MMA_STAGE) {
        const int m = (int)min((long long)MPIML_LINEAR_MMA_STAGE, r1 - s);
        __syncthreads();                            // the previous stage is consumed
        if (vec) {
            const int units = m * d / EPU;
            const int all = MPIML_LINEAR_MMA_STAGE * d / EPU;
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                const int i = tid + u * blockDim.x;
                if (i < all) {                      // a unit lies in one row (d % EPU == 0): 16-byte stores
                    const T* v = reinterpret_cast<const T*>(&buf[u]);
                    const int e = i * EPU;
                    const int r = (int)(((float)e + 0.5f) * inv_d);
                    double2* dst = reinterpret_cast<double2*>(zs + r * ld + (e - r * d));
                    const bool ok = i < units;
#pragma unroll
                    for (int q = 0; q < EPU; q += 2)
                        dst[q / 2] = ok ? make_double2((double)v[q], (double)v[q + 1]) : make_double2(0.0, 0.0);
                }
            }
        } else {
            const T* xs = X + s * d;
            for (int e = tid; e < MPIML_LINEAR_MMA_STAGE * d; e += blockDim.x) {
                const int r = (int)(((float)e + 0.5f) * inv_d);
                zs[r * ld + (e - r * d)] = (r < m) ? (double)xs[e] : 0.0;
            }
        }
        if (yreg) {
            if (tid < MPIML_LINEAR_MMA_STAGE * t) {
                const int r = tid / t;
                zs[r * ld + d + (tid - r * t)] = (r < m) ? (double)ybuf : 0.0;
            }
        } else {
            for (int e = tid; e < MPIML_LINEAR_MMA_STAGE * t; e += blockDim.x) {
                const int r = e / t;
                zs[r * ld + d + (e - r * t)] = (r < m) ? (double)Y[s * t + e] : 0.0;
            }
        }
        if (m < MPIML_LINEAR_MMA_STAGE) {           // the block's last stage, partial: its empty rows count no one
            for (int r = m + tid; r < MPIML_LINEAR_MMA_STAGE; r += blockDim.x) zs[r * ld + d + t] = 0.0;
        }
        if (W && tid < MPIML_LINEAR_MMA_STAGE) ws[tid] = (tid < m) ? (double)wbuf : 0.0;
        __syncthreads();
        if (s + MPIML_LINEAR_MMA_STAGE < r1) prefetch(s + MPIML_LINEAR_MMA_STAGE);   // in flight meanwhile
        if (active) mpiml_linear_gram_warp<W, NT, 0>(warp, acc, zs, ws, ld, g, tq);
    }
    if (active) {
        double* out = partial + (long long)blockIdx.x * kp * kp;
#pragma unroll
        for (int j = 0; j <= NT; ++j) {
            if (j < ntiles) {
                const int I = j < split ? I0 : I1;
                const int J = j < split ? I0 + j : j - 1;
                out[(8 * I + g) * kp + 8 * J + 2 * tq] = acc[j][0];
                out[(8 * I + g) * kp + 8 * J + 2 * tq + 1] = acc[j][1];
            }
        }
    }
#endif
}

// mpiml_linear_gram_mma3<T, W, S0, S1, S2>: the same partial Gram matrices on the float64 tensor cores with
// fewer shared-memory fragment loads per DMMA.  The nt = S0 + S1 + S2 tile rows are cut into three
// contiguous groups; the upper triangle of 8 x 8 tiles is then three rectangles (groups 0 x 1, 1 x 2,
// 0 x 2) and three small triangles (each group with itself).  Warp group G owns one rectangle and one
// triangle that share its fragments: G = 0: rect(0, 1) + tri(0); G = 1: rect(1, 2) + tri(1); G = 2:
// rect(0, 2) + tri(2).  Per k-step of 4 rows it loads the fragments of its two groups once (SA + SB
// loads, one double per lane each) and issues SA SB + SD (SD + 1) / 2 DMMAs on them (for nt = 9: 6
// loads for 15 DMMAs, where mpiml_linear_gram_mma loads 35 fragments for 45).  Six warps: groups 0, 1,
// 2 twice, the second three taking the odd k-steps of every stage; the two halves are added (in that
// order, in shared memory) at the end.  Staged rows are double-buffered: one barrier per stage, the
// next stage's rows stored by every warp right after its own DMMAs (the global loads in flight
// meanwhile).  Block b writes the tiles it owns to partial[b * kp * kp ...], as mpiml_linear_gram_mma.
// STAGE rows per stage (a multiple of 8): 32 by default, 64 to halve the barriers.
#define MPIML_LINEAR_MMA3_STAGE 32
#define MPIML_LINEAR_MMA3_THREADS 192

template <int S0, int S1, int S2, int G>
struct mpiml_linear_g3 {
    static constexpr int A0 = G == 1 ? S0 : 0;                  // the rectangle's rows: tiles A0 .. A0 + SA - 1
    static constexpr int SA = G == 1 ? S1 : S0;
    static constexpr int B0 = G == 0 ? S0 : S0 + S1;            // its columns: tiles B0 .. B0 + SB - 1
    static constexpr int SB = G == 0 ? S1 : S2;
    static constexpr bool DA = G != 2;                          // the triangle on the row group (else the columns)
    static constexpr int D0 = DA ? A0 : B0;
    static constexpr int SD = DA ? SA : SB;
    static constexpr int TILES = SA * SB + SD * (SD + 1) / 2;
};

template <int S0, int S1, int S2>
struct mpiml_linear_g3max {
    static constexpr int T0 = mpiml_linear_g3<S0, S1, S2, 0>::TILES;
    static constexpr int T1 = mpiml_linear_g3<S0, S1, S2, 1>::TILES;
    static constexpr int T2 = mpiml_linear_g3<S0, S1, S2, 2>::TILES;
    static constexpr int M01 = T0 > T1 ? T0 : T1;
    static constexpr int M = (M01 > T2 ? M01 : T2) > 0 ? (M01 > T2 ? M01 : T2) : 1;
};

// The k-steps H, H + 2, ... of one staged block of rows for warp group G (all indices constant).
template <bool W, int S0, int S1, int S2, int G, int TM, int STAGE>
__device__ __forceinline__ void mpiml_linear_gram3_stage(double (&acc)[TM][2], const double* zs, const double* ws,
                                                         const int ld, const int g, const int tq, const int h) {
    using P = mpiml_linear_g3<S0, S1, S2, G>;
    constexpr int NA = P::SA > 0 ? P::SA : 1, NB = P::SB > 0 ? P::SB : 1;
#pragma unroll 1
    for (int k4 = 4 * h; k4 < STAGE; k4 += 8) {
        const double* zr = zs + (k4 + tq) * ld + g;
        double fa[NA], fb[NB];
#pragma unroll
        for (int i = 0; i < P::SA; ++i) fa[i] = zr[8 * (P::A0 + i)];
#pragma unroll
        for (int j = 0; j < P::SB; ++j) fb[j] = zr[8 * (P::B0 + j)];
        double wa[NA], wb[NB];                      // the A operands: weighted fragments
        const double wr = W ? ws[k4 + tq] : 1.0;
#pragma unroll
        for (int i = 0; i < P::SA; ++i) wa[i] = W ? fa[i] * wr : fa[i];
#pragma unroll
        for (int j = 0; j < P::SB; ++j) wb[j] = (W && !P::DA) ? fb[j] * wr : fb[j];
        int idx = 0;
#pragma unroll
        for (int i = 0; i < P::SA; ++i)
#pragma unroll
            for (int j = 0; j < P::SB; ++j) mpiml_linear_dmma(acc[idx++], wa[i], fb[j]);
#pragma unroll
        for (int i = 0; i < P::SD; ++i)
#pragma unroll
            for (int j = i; j < P::SD; ++j) {
                if constexpr (P::DA) mpiml_linear_dmma(acc[idx++], wa[i], fa[j]);
                else mpiml_linear_dmma(acc[idx++], wb[i], fb[j]);
            }
    }
}

// Warp group G's tiles: the second half (h = 1) parks its sums in shared memory, the first adds them
// (first half + second half, always in that order) and writes the block's partial.
template <int S0, int S1, int S2, int G, int TM>
__device__ __forceinline__ void mpiml_linear_gram3_out(double (&acc)[TM][2], double* park, double* out, const int kp,
                                                       const int lane, const int g, const int tq, const int h,
                                                       const bool write) {
    using P = mpiml_linear_g3<S0, S1, S2, G>;
    double* mine = park + (long long)G * TM * 64;
    if (!write) {
        if (h == 1) {
#pragma unroll
            for (int j = 0; j < P::TILES; ++j) {
                mine[(2 * j) * 32 + lane] = acc[j][0];
                mine[(2 * j + 1) * 32 + lane] = acc[j][1];
            }
        }
        return;
    }
    if (h != 0) return;
    int idx = 0;
#pragma unroll
    for (int i = 0; i < P::SA; ++i)
#pragma unroll
        for (int j = 0; j < P::SB; ++j) {
            const int I = P::A0 + i, J = P::B0 + j;
            out[(8 * I + g) * kp + 8 * J + 2 * tq] = acc[idx][0] + mine[(2 * idx) * 32 + lane];
            out[(8 * I + g) * kp + 8 * J + 2 * tq + 1] = acc[idx][1] + mine[(2 * idx + 1) * 32 + lane];
            ++idx;
        }
#pragma unroll
    for (int i = 0; i < P::SD; ++i)
#pragma unroll
        for (int j = i; j < P::SD; ++j) {
            const int I = P::D0 + i, J = P::D0 + j;
            out[(8 * I + g) * kp + 8 * J + 2 * tq] = acc[idx][0] + mine[(2 * idx) * 32 + lane];
            out[(8 * I + g) * kp + 8 * J + 2 * tq + 1] = acc[idx][1] + mine[(2 * idx + 1) * 32 + lane];
            ++idx;
        }
}

template <typename T, bool W, int S0, int S1, int S2, int STAGE = MPIML_LINEAR_MMA3_STAGE>
__global__ void __launch_bounds__(MPIML_LINEAR_MMA3_THREADS, 2)
mpiml_linear_gram_mma3(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ Y, const int t,
                       const T* __restrict__ w, const long long rows_per_block, const int kp,
                       double* __restrict__ partial) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    // two buffers of MPIML_LINEAR_MMA3_STAGE x (kp + 4) doubles, each followed by the stage's weights
    extern __shared__ __align__(16) double zs[];
    constexpr int NT = S0 + S1 + S2;
    constexpr int TM = mpiml_linear_g3max<S0, S1, S2>::M;
    constexpr int THREADS = MPIML_LINEAR_MMA3_THREADS;
    const int ld = kp + 4;
    const int bufsize = STAGE * ld + STAGE;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int grp = warp % 3, h = warp / 3;
    const int g = lane >> 2, tq = lane & 3;
    const int extra = kp - d;
    const float inv_d = 1.0f / (float)d;            // exact e / d by a float product, as in mpiml_linear_gram
    double acc[TM][2];
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[j][0] = acc[j][1] = 0.0;

    // a stage is STAGE * d contiguous values of X: when a row is a whole number of 16-byte units, the next
    // stage travels as such units in registers (VPT per thread cover d <= 8 NT; checked, else plain loads)
    constexpr int EPU = 16 / sizeof(T);
    constexpr int VPT = (STAGE * 8 * NT / EPU + THREADS - 1) / THREADS;
    const bool vec = (d % EPU) == 0 && STAGE * d / EPU <= VPT * THREADS;
    const bool yreg = STAGE * t <= THREADS;
    uint4 buf[VPT];
    T ybuf = (T)0, wbuf = (T)0;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    auto prefetch = [&](long long s) {
        const int m = (int)min((long long)STAGE, r1 - s);
        if (vec) {
            const int units = m * d / EPU;
            const uint4* src = reinterpret_cast<const uint4*>(X + s * d);
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                const int i = tid + u * THREADS;
                if (i < units) buf[u] = src[i];
            }
        }
        if (yreg && tid < m * t) ybuf = Y[s * t + tid];
        if (W && tid < m) wbuf = w[s + tid];
    };
    auto store = [&](double* zb, long long s) {
        const int m = (int)min((long long)STAGE, r1 - s);
        if (vec) {
            const int units = m * d / EPU;
            const int all = STAGE * d / EPU;
#pragma unroll
            for (int u = 0; u < VPT; ++u) {
                const int i = tid + u * THREADS;
                if (i < all) {                      // a unit lies in one row (d % EPU == 0): 16-byte stores
                    const T* v = reinterpret_cast<const T*>(&buf[u]);
                    const int e = i * EPU;
                    const int r = (int)(((float)e + 0.5f) * inv_d);
                    double2* dst = reinterpret_cast<double2*>(zb + r * ld + (e - r * d));
                    const bool ok = i < units;
#pragma unroll
                    for (int q = 0; q < EPU; q += 2)
                        dst[q / 2] = ok ? make_double2((double)v[q], (double)v[q + 1]) : make_double2(0.0, 0.0);
                }
            }
        } else {
            const T* xs = X + s * d;
            for (int e = tid; e < STAGE * d; e += THREADS) {
                const int r = (int)(((float)e + 0.5f) * inv_d);
                zb[r * ld + (e - r * d)] = (r < m) ? (double)xs[e] : 0.0;
            }
        }
        if (yreg) {
            if (tid < STAGE * t) {
                const int r = tid / t;
                zb[r * ld + d + (tid - r * t)] = (r < m) ? (double)ybuf : 0.0;
            }
        } else {
            for (int e = tid; e < STAGE * t; e += THREADS) {
                const int r = e / t;
                zb[r * ld + d + (e - r * t)] = (r < m) ? (double)Y[s * t + e] : 0.0;
            }
        }
        if (m < STAGE) {                            // the block's last stage, partial: its empty rows count no one
            for (int r = m + tid; r < STAGE; r += THREADS) zb[r * ld + d + t] = 0.0;
        }
        if (W && tid < STAGE) zb[STAGE * ld + tid] = (tid < m) ? (double)wbuf : 0.0;
    };
    {                                               // the ones column and the padding of both buffers
        const int ones = extra - t;
        for (int e = tid; e < 2 * STAGE * ones; e += THREADS) {
            const int r = e / ones;                 // 0 .. 2 STAGE - 1: row r % STAGE of buffer r / STAGE
            const int c = e - r * ones;
            zs[(r / STAGE) * bufsize + (r % STAGE) * ld + d + t + c] = c == 0 ? 1.0 : 0.0;
        }
    }
    __syncthreads();
    if (r0 < r1) {
        prefetch(r0);
        store(zs, r0);
    }
    __syncthreads();
    int cur = 0;
    for (long long s = r0; s < r1; s += STAGE) {
        const bool more = s + STAGE < r1;
        if (more) prefetch(s + STAGE);              // in flight while the tensor cores work
        const double* zb = zs + cur * bufsize;
        const double* wb = zb + STAGE * ld;
        if (grp == 0) mpiml_linear_gram3_stage<W, S0, S1, S2, 0, TM, STAGE>(acc, zb, wb, ld, g, tq, h);
        else if (grp == 1) mpiml_linear_gram3_stage<W, S0, S1, S2, 1, TM, STAGE>(acc, zb, wb, ld, g, tq, h);
        else mpiml_linear_gram3_stage<W, S0, S1, S2, 2, TM, STAGE>(acc, zb, wb, ld, g, tq, h);
        if (more) store(zs + (cur ^ 1) * bufsize, s + STAGE);   // the other buffer: read by no one now
        __syncthreads();
        cur ^= 1;
    }
    // the two halves: park the second's sums (the staging buffers are free now), add, write
    double* out = partial + (long long)blockIdx.x * kp * kp;
    for (int pass = 0; pass < 2; ++pass) {
        if (grp == 0) mpiml_linear_gram3_out<S0, S1, S2, 0, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        else if (grp == 1) mpiml_linear_gram3_out<S0, S1, S2, 1, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        else mpiml_linear_gram3_out<S0, S1, S2, 2, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        __syncthreads();
    }
#endif
}

// mpiml_linear_gram_mma3g<T, W, S0, S1, S2, KA>: mpiml_linear_gram_mma3's tiles with the fragments read
// straight from global memory (no staging in shared memory, no barrier in the loop).  Lane (g, tq) of a
// k-step of 4 rows holds Z(row tq, 8 I + g) for each tile row I of its two groups: X's values (8 lanes read
// 32 contiguous bytes), then Y, the ones column and the zero padding.  Each warp keeps KA k-steps of raw
// values in flight (a ring in registers, refilled as it is consumed).  A group's warps take alternate
// k-steps of the block's rows; each of X's columns is read by two of the three groups (the second read
// mostly from L1).  The halves' sums are added as in mpiml_linear_gram_mma3.
template <typename T, bool W, int S0, int S1, int S2, int G, int KA, int TM>
__device__ __forceinline__ void mpiml_linear_gram3g_run(double (&acc)[TM][2], const T* __restrict__ X,
                                                        const long long r0, const long long r1, const int d,
                                                        const T* __restrict__ Y, const int t,
                                                        const T* __restrict__ w, const int g, const int tq,
                                                        const int h) {
    using P = mpiml_linear_g3<S0, S1, S2, G>;
    constexpr int NA = P::SA > 0 ? P::SA : 1, NB = P::SB > 0 ? P::SB : 1;
    T ra[KA][NA], rb[KA][NB], rw[KA];
    const long long nk = (r1 - r0 + 3) / 4;          // k-steps of the block; this warp takes h, h + 2, ...
    auto value = [&](const long long row, const int col) -> T {
        if (row >= r1) return (T)0;
        if (col < d) return X[row * d + col];
        if (col < d + t) return Y[row * t + (col - d)];
        return col == d + t ? (T)1 : (T)0;
    };
    auto load = [&](const int u, const long long j) {  // k-step j into slot u of the ring
        const long long row = r0 + 4 * j + tq;
#pragma unroll
        for (int i = 0; i < P::SA; ++i) ra[u][i] = value(row, 8 * (P::A0 + i) + g);
#pragma unroll
        for (int i = 0; i < P::SB; ++i) rb[u][i] = value(row, 8 * (P::B0 + i) + g);
        if (W) rw[u] = row < r1 ? w[row] : (T)0;
    };
#pragma unroll
    for (int u = 0; u < KA; ++u) load(u, h + 2LL * u);
    for (long long j0 = h; j0 < nk; j0 += 2LL * KA) {
#pragma unroll
        for (int u = 0; u < KA; ++u) {
            double fa[NA], fb[NB], wa[NA], wb[NB];
            const double wr = W ? (double)rw[u] : 1.0;
#pragma unroll
            for (int i = 0; i < P::SA; ++i) {
                fa[i] = (double)ra[u][i];
                wa[i] = W ? fa[i] * wr : fa[i];
            }
#pragma unroll
            for (int i = 0; i < P::SB; ++i) {
                fb[i] = (double)rb[u][i];
                wb[i] = (W && !P::DA) ? fb[i] * wr : fb[i];
            }
            load(u, j0 + 2LL * (u + KA));             // the ring slot is free: refill it KA k-steps ahead
            int idx = 0;
#pragma unroll
            for (int i = 0; i < P::SA; ++i)
#pragma unroll
                for (int j = 0; j < P::SB; ++j) mpiml_linear_dmma(acc[idx++], wa[i], fb[j]);
#pragma unroll
            for (int i = 0; i < P::SD; ++i)
#pragma unroll
                for (int j = i; j < P::SD; ++j) {
                    if constexpr (P::DA) mpiml_linear_dmma(acc[idx++], wa[i], fa[j]);
                    else mpiml_linear_dmma(acc[idx++], wb[i], fb[j]);
                }
        }
    }
}

template <typename T, bool W, int S0, int S1, int S2, int KA>
__global__ void __launch_bounds__(MPIML_LINEAR_MMA3_THREADS, 2)
mpiml_linear_gram_mma3g(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ Y, const int t,
                        const T* __restrict__ w, const long long rows_per_block, const int kp,
                        double* __restrict__ partial) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    extern __shared__ __align__(16) double zs[];    // parks the second half's sums at the end
    constexpr int TM = mpiml_linear_g3max<S0, S1, S2>::M;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int grp = warp % 3, h = warp / 3;
    const int g = lane >> 2, tq = lane & 3;
    double acc[TM][2];
#pragma unroll
    for (int j = 0; j < TM; ++j) acc[j][0] = acc[j][1] = 0.0;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    if (grp == 0) mpiml_linear_gram3g_run<T, W, S0, S1, S2, 0, KA, TM>(acc, X, r0, r1, d, Y, t, w, g, tq, h);
    else if (grp == 1) mpiml_linear_gram3g_run<T, W, S0, S1, S2, 1, KA, TM>(acc, X, r0, r1, d, Y, t, w, g, tq, h);
    else mpiml_linear_gram3g_run<T, W, S0, S1, S2, 2, KA, TM>(acc, X, r0, r1, d, Y, t, w, g, tq, h);
    double* out = partial + (long long)blockIdx.x * kp * kp;
    for (int pass = 0; pass < 2; ++pass) {
        if (grp == 0) mpiml_linear_gram3_out<S0, S1, S2, 0, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        else if (grp == 1) mpiml_linear_gram3_out<S0, S1, S2, 1, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        else mpiml_linear_gram3_out<S0, S1, S2, 2, TM>(acc, zs, out, kp, lane, g, tq, h, pass == 1);
        __syncthreads();
    }
#endif
}

__device__ __forceinline__ double mpiml_linear_warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// exp(-|m|): the one exponential that expit(m) and softplus(m) share (neither overflows)
__device__ __forceinline__ double mpiml_linear_exp_neg_abs(double m) { return exp(-fabs(m)); }

// log(1 + exp(m)), overflow-safe, from e = exp(-|m|)
__device__ __forceinline__ double mpiml_linear_softplus(double m, double e) {
    return m > 0.0 ? m + log1p(e) : log1p(e);
}

// 1 / (1 + exp(-m)) from e = exp(-|m|)
__device__ __forceinline__ double mpiml_linear_expit(double m, double e) {
    return m >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// One level of the transposing butterfly of mpiml_linear_logistic: CNT partial sums per lane become
// CNT / 2 (lanes with bit O set keep the upper half), down to one, then plain sums over the lanes left.
// Recursion on compile-time CNT and O keeps every index constant, so the arrays stay in registers.
template <int CNT, int O, bool TWO>
__device__ __forceinline__ void mpiml_linear_butterfly(double* v, double* u, const int lane) {
    if constexpr (CNT > 1) {
        constexpr int H = CNT / 2;
        const bool upper = (lane & O) != 0;
#pragma unroll
        for (int j = 0; j < H; ++j) {
            const double rv = __shfl_xor_sync(0xffffffffu, upper ? v[j] : v[j + H], O);
            v[j] = (upper ? v[j + H] : v[j]) + rv;
            if (TWO) {
                const double ru = __shfl_xor_sync(0xffffffffu, upper ? u[j] : u[j + H], O);
                u[j] = (upper ? u[j + H] : u[j]) + ru;
            }
        }
    } else {
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], O);
        if (TWO) u[0] += __shfl_xor_sync(0xffffffffu, u[0], O);
    }
    if constexpr (O > 1) mpiml_linear_butterfly<(CNT > 1 ? CNT / 2 : 1), O / 2, TWO>(v, u, lane);
}

// Rows per warp batch of mpiml_linear_logistic: a lane holds CPL columns of each of them in registers.
template <int CPL> struct mpiml_linear_rows { static constexpr int R = CPL <= 2 ? 16 : (CPL == 4 ? 8 : 4); };

template <typename T, int MODE, int CPL>
__global__ void __launch_bounds__(MPIML_LINEAR_LOGISTIC_THREADS)
mpiml_linear_logistic(const T* __restrict__ X, const long long n, const int d, const T* __restrict__ y01,
                      const T* __restrict__ sw, const double* __restrict__ coef, const double bias,
                      const double* __restrict__ vec, const double vbias, double* __restrict__ partial) {
    // A warp takes R rows at a time: lane l loads columns l, l + 32, ... of each (R * CPL independent
    // coalesced loads in flight), forms its R partial dot products, and one transposing butterfly
    // (R - 1 + 5 - log2 R shuffles instead of 5 R) leaves the margin of row (l >> (5 - log2 R)) on lane l.
    // The per-row scalar work (expit, softplus: float64 transcendentals) then runs once per row across
    // the lanes instead of once per row on the whole warp; the row's coefficient comes back to every
    // lane by one shuffle per row for the gradient sum.
    constexpr int R = mpiml_linear_rows<CPL>::R;
    constexpr int P = R == 16 ? 4 : (R == 8 ? 3 : 2);   // log2 R
    constexpr int SH = 5 - P;                           // lanes 2^SH share a row after the butterfly
    __shared__ double red[MPIML_LINEAR_LOGISTIC_THREADS / 32][2];
    extern __shared__ double gsh[];                 // (threads / 32) x d
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const int own = (lane >> SH) & (R - 1);         // the row of the batch whose margin this lane ends with
    const bool lead = (lane & ((1 << SH) - 1)) == 0;
    double cw[CPL], cv[CPL], g[CPL];
#pragma unroll
    for (int q = 0; q < CPL; ++q) {
        const int c = lane + 32 * q;
        cw[q] = c < d ? coef[c] : 0.0;
        cv[q] = (MODE == 1 && c < d) ? vec[c] : 0.0;
        g[q] = 0.0;
    }
    double loss = 0.0, gsum = 0.0;
    const long long nbatch = (n + R - 1) / R;
    const long long stride = (long long)gridDim.x * warps;
    for (long long bi = (long long)blockIdx.x * warps + warp; bi < nbatch; bi += stride) {
        const long long i0 = bi * R;
        T x[R][CPL];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const bool ok = i0 + r < n;
            const T* row = X + (i0 + r) * d;
#pragma unroll
            for (int q = 0; q < CPL; ++q) {
                const int c = lane + 32 * q;
                x[r][q] = (ok && c < d) ? row[c] : (T)0;
            }
        }
        double v[R], u[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            double dot = 0.0, dotv = 0.0;
#pragma unroll
            for (int q = 0; q < CPL; ++q) {
                dot = fma((double)x[r][q], cw[q], dot);
                if (MODE == 1) dotv = fma((double)x[r][q], cv[q], dotv);
            }
            v[r] = dot;
            u[r] = dotv;
        }
        mpiml_linear_butterfly<R, 16, MODE == 1>(v, u, lane);   // lane l: the margin of row `own`
        const long long i = i0 + own;
        double coeff = 0.0;
        if (i < n) {
            const double m = v[0] + bias;
            const double wi = (double)sw[i];
            if (MODE == 0) {
                const double yi = (double)y01[i];
                const double e = mpiml_linear_exp_neg_abs(m);
                coeff = wi * (mpiml_linear_expit(m, e) - yi);
                if (lead) loss += wi * (mpiml_linear_softplus(m, e) - yi * m);
            } else {
                const double p = mpiml_linear_expit(m, mpiml_linear_exp_neg_abs(m));
                coeff = wi * p * (1.0 - p) * (u[0] + vbias);
            }
        }
        if (lead) gsum += coeff;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const double cr = __shfl_sync(0xffffffffu, coeff, r << SH);
#pragma unroll
            for (int q = 0; q < CPL; ++q) g[q] = fma(cr, (double)x[r][q], g[q]);
        }
    }
    // the warp's loss and gsum sit on its lead lanes: sum them to lane 0
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        loss += __shfl_xor_sync(0xffffffffu, loss, o);
        gsum += __shfl_xor_sync(0xffffffffu, gsum, o);
    }
#pragma unroll
    for (int q = 0; q < CPL; ++q) {
        const int c = lane + 32 * q;
        if (c < d) gsh[warp * d + c] = g[q];
    }
    if (lane == 0) {
        red[warp][0] = loss;
        red[warp][1] = gsum;
    }
    __syncthreads();
    double* out = partial + (long long)blockIdx.x * (d + 2);
    for (int j = threadIdx.x; j < d + 2; j += blockDim.x) {
        double s = 0.0;
        for (int v = 0; v < warps; ++v) s += j < 2 ? red[v][j] : gsh[v * d + (j - 2)];
        out[j] = s;
    }
}

// mpiml_linear_warp_sum: Σ_g p[g * stride] over g < nblocks by one warp, in a fixed order whatever the
// launch: lane l adds g = l, l + 32, ... in turn (independent loads, a short dependent chain), then a
// shuffle tree leaves the sum on lane 0.  The same bits on every run and every rank; a few microseconds
// for the ~1000 partials of a pass, where one thread walking them all waited on ~1000 dependent reads.
__device__ __forceinline__ double mpiml_linear_warp_sum(const double* __restrict__ p, const int nblocks,
                                                        const long long stride, const int lane) {
    double s = 0.0;
#pragma unroll 4
    for (int g = lane; g < nblocks; g += 32) s += p[(long long)g * stride];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    return s;
}

// The sum kernels below give one output to one warp; warps beyond the outputs stride over them.
__device__ __forceinline__ long long mpiml_linear_warp_id() {
    return ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
}

__device__ __forceinline__ long long mpiml_linear_warp_count() {
    return ((long long)gridDim.x * blockDim.x) >> 5;
}

__global__ void mpiml_linear_sum_blocks(const double* __restrict__ partial, const int nblocks, const long long m,
                                        double* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    for (long long j = mpiml_linear_warp_id(); j < m; j += mpiml_linear_warp_count()) {
        const double s = mpiml_linear_warp_sum(partial + j, nblocks, m, lane);
        if (lane == 0) out[j] = s;
    }
}

// mpiml_linear_sum_sym: the symmetric k x k Gram matrix from the blocks' partials of a Gram kernel:
// out[i][j] = out[j][i] = Σ_g partial[g * kp * kp + i * kp + j] (i <= j) in a fixed order (deterministic).
// The kernels write the upper triangle of their tiles only, and this reads nothing else, so the partials
// need no zeroing; the symmetrisation is part of the same pass.
__global__ void mpiml_linear_sum_sym(const double* __restrict__ partial, const int nblocks, const int kp, const int k,
                                     double* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const long long m = (long long)kp * kp;
    for (long long e = mpiml_linear_warp_id(); e < (long long)k * k; e += mpiml_linear_warp_count()) {
        const int i = (int)(e / k), j = (int)(e - (e / k) * k);
        if (i > j) continue;                         // (the whole warp: e is the warp's)
        const double s = mpiml_linear_warp_sum(partial + (long long)i * kp + j, nblocks, m, lane);
        if (lane == 0) {
            out[(long long)i * k + j] = s;
            out[(long long)j * k + i] = s;
        }
    }
}

// mpiml_linear_sum_pack: the blocks' partials of mpiml_linear_logistic ([loss, Σ g, Σ g x], m = d + 2 per
// block) summed in the order of mpiml_linear_sum_blocks (its bits) and laid out as the host wants them for
// the allreduce: [loss (if LOSS), Σ g x (d), scale Σ g (if FI), fp, fp²], fp the fingerprint of the point.
__global__ void mpiml_linear_sum_pack(const double* __restrict__ partial, const int nblocks, const int d,
                                      const int loss, const int fi, const double scale, const double fp,
                                      double* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int m = d + 2;
    const int len = loss + d + fi;
    for (long long w = mpiml_linear_warp_id(); w < len + 2; w += mpiml_linear_warp_count()) {
        const int j = (int)w;
        if (j >= len) {
            if (lane == 0) out[j] = j == len ? fp : fp * fp;
            continue;
        }
        int src = 1;                                 // Σ g, for the intercept
        if (loss && j == 0) src = 0;
        else if (j - loss < d) src = 2 + (j - loss);
        const double s = mpiml_linear_warp_sum(partial + src, nblocks, m, lane);
        if (lane == 0) out[j] = src == 1 ? scale * s : s;
    }
}

// mpiml_linear_labels<T>: the distinct values of a classifier's label vector y, in one read, for its checks:
// the smallest value lo, the second smallest distinct value lo2 (if any) and the largest hi, with flags
// (MPIML_LABELS_ANY: a value was seen, MPIML_LABELS_TWO: lo2 exists, MPIML_LABELS_NAN: a NaN was seen, which
// adds to nothing else).  Two labels or fewer exactly when lo2 is absent or equals hi.  Block g writes its
// state to part[3 g ...] and pflags[g]; mpiml_linear_labels_merge<T> (one block) merges them into out:
// 32 bytes, lo, lo2, hi at offsets 0, 8, 16 (as T) and the flags at 24 (one copy to the host).  Minima and
// maxima are exact: the result does not depend on the order of the merges.
#define MPIML_LABELS_ANY 1
#define MPIML_LABELS_TWO 2
#define MPIML_LABELS_NAN 4
#define MPIML_LABELS_THREADS 256

template <typename T>
__device__ __forceinline__ void mpiml_labels_add(T& lo, T& lo2, T& hi, int& flags, const T v) {
    if (v != v) {                                    // NaN (never for integers)
        flags |= MPIML_LABELS_NAN;
        return;
    }
    if (!(flags & MPIML_LABELS_ANY)) {
        lo = v;
        hi = v;
        flags |= MPIML_LABELS_ANY;
        return;
    }
    if (v > hi) hi = v;
    if (v < lo) {                                    // the old lo is below any old lo2: the new second
        lo2 = lo;
        lo = v;
        flags |= MPIML_LABELS_TWO;
    } else if (v > lo && (!(flags & MPIML_LABELS_TWO) || v < lo2)) {
        lo2 = v;
        flags |= MPIML_LABELS_TWO;
    }
}

// merges the state (blo, blo2, bhi, bflags) into (lo, lo2, hi, flags): the union's two smallest distinct
// values are among the two states' own, its largest is one of the two largest
template <typename T>
__device__ __forceinline__ void mpiml_labels_merge_state(T& lo, T& lo2, T& hi, int& flags, const T blo,
                                                         const T blo2, const T bhi, const int bflags) {
    flags |= bflags & MPIML_LABELS_NAN;
    if (!(bflags & MPIML_LABELS_ANY)) return;
    mpiml_labels_add(lo, lo2, hi, flags, blo);
    if (bflags & MPIML_LABELS_TWO) mpiml_labels_add(lo, lo2, hi, flags, blo2);
    mpiml_labels_add(lo, lo2, hi, flags, bhi);
}

// the block's threads' states merged into thread 0's (every thread of the block calls it)
template <typename T>
__device__ __forceinline__ void mpiml_labels_block(T& lo, T& lo2, T& hi, int& flags) {
    __shared__ T s_lo[MPIML_LABELS_THREADS / 32], s_lo2[MPIML_LABELS_THREADS / 32], s_hi[MPIML_LABELS_THREADS / 32];
    __shared__ int s_flags[MPIML_LABELS_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const T blo = __shfl_down_sync(0xffffffffu, lo, off);
        const T blo2 = __shfl_down_sync(0xffffffffu, lo2, off);
        const T bhi = __shfl_down_sync(0xffffffffu, hi, off);
        const int bflags = __shfl_down_sync(0xffffffffu, flags, off);
        if (lane + off < 32) mpiml_labels_merge_state(lo, lo2, hi, flags, blo, blo2, bhi, bflags);
    }
    if (lane == 0) {
        s_lo[warp] = lo;
        s_lo2[warp] = lo2;
        s_hi[warp] = hi;
        s_flags[warp] = flags;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            mpiml_labels_merge_state(lo, lo2, hi, flags, s_lo[w], s_lo2[w], s_hi[w], s_flags[w]);
    }
}

template <typename T>
__global__ void __launch_bounds__(MPIML_LABELS_THREADS)
mpiml_linear_labels(const T* __restrict__ y, const long long n, T* __restrict__ part, int* __restrict__ pflags) {
    T lo = T(0), lo2 = T(0), hi = T(0);
    int flags = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        mpiml_labels_add(lo, lo2, hi, flags, y[i]);
    mpiml_labels_block(lo, lo2, hi, flags);
    if (threadIdx.x == 0) {
        part[3 * (long long)blockIdx.x] = lo;
        part[3 * (long long)blockIdx.x + 1] = lo2;
        part[3 * (long long)blockIdx.x + 2] = hi;
        pflags[blockIdx.x] = flags;
    }
}

template <typename T>
__global__ void __launch_bounds__(MPIML_LABELS_THREADS)
mpiml_linear_labels_merge(const T* __restrict__ part, const int* __restrict__ pflags, const int nblocks,
                          unsigned char* __restrict__ out) {
    T lo = T(0), lo2 = T(0), hi = T(0);
    int flags = 0;
    for (int g = threadIdx.x; g < nblocks; g += blockDim.x)
        mpiml_labels_merge_state(lo, lo2, hi, flags, part[3 * g], part[3 * g + 1], part[3 * g + 2], pflags[g]);
    mpiml_labels_block(lo, lo2, hi, flags);
    if (threadIdx.x == 0) {
        *reinterpret_cast<T*>(out) = lo;
        *reinterpret_cast<T*>(out + 8) = lo2;
        *reinterpret_cast<T*>(out + 16) = hi;
        *reinterpret_cast<int*>(out + 24) = flags;
    }
}
