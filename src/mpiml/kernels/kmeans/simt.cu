// Distances of a block of rows against a small matrix, fused with what consumes them.
//
// One family for every distance-based estimator.  The dot products of a tile of BM rows of X
// with a chunk of BN rows of C (centres, or an index block) are computed like a register-tiled
// matrix product: 256 threads, each a TM x TN block of dot products, the operands staged through
// shared memory DK features at a time, transposed so that a thread reads its TM rows (TN
// columns) with 16-byte loads.  Global loads of the next slab go to registers before the current
// slab is computed, so their latency hides behind the arithmetic.  d and k are tiled: any size.
//
//   mpiml_distances_argmin<T, A, TM, TN, CG, DK, VW, MINB, MODE>
//       persistent grid; per row the nearest row of C under ||x - c||^2 (ties: the lower index)
//       and the squared distance.  MODE 0: labels + distances (assign / predict).  MODE 1: the
//       whole local Lloyd step: also the per-cluster weighted sums and weights, the inertia and
//       the number of changed labels.  The sums are kept in `groups` block-private copies in
//       shared memory (type A), each (copy, cluster, column) cell owned by one thread, so no
//       atomics; a thread loads all its rows of a tile at once (one memory latency per tile, not
//       one per row).  The weights per cluster go to one shared array with shared-memory atomics.
//       Every block writes its totals once to its own row of `part`, and
//       mpiml_distances_reduce_partials adds the rows in a fixed order (deterministic).  With
//       groups == 0 (the copies do not fit) the kernel leaves the sums to
//       mpiml_distances_label_sums, a second pass over X by column slabs.
//   mpiml_distances_argmin_gemm<T>
//       the arg-min epilogue of a cuBLAS product G = X C^T (large k or d, where the matrix
//       library's GEMM beats the register tile): one warp per row of G.
//   mpiml_distances_pairwise<T, TM, TN, CG, DK, VW, MINB, METRIC>
//       the full n x m block of distances (transform, nearest-neighbour candidates).
//       METRIC 0 squared Euclidean, 1 negative inner product, 2 cosine distance, 3 Euclidean.
//   mpiml_lloyd_update<T>
//       the centres' update of a Lloyd iteration from its packed totals, on the device, with the
//       few scalars the host needs to decide on the next iteration.
//
// The squared norms of the rows of X are summed from the values each thread stages (no extra
// pass); those of C come from the caller.  `shift` (optional) is subtracted from every row of X
// (and, in pairwise, `y_shift` from every row of Y) while staging, so the expansion
// ||x||^2 - 2 x.c + ||c||^2 is evaluated around the data's centre.

#define MPIML_DIST_THREADS 256

template <typename T> struct mpiml_dist_traits;
template <> struct mpiml_dist_traits<float> {
    __device__ static float inf() { return __int_as_float(0x7f800000); }
};
template <> struct mpiml_dist_traits<double> {
    __device__ static double inf() { return __longlong_as_double(0x7ff0000000000000LL); }
};

// VW consecutive values of global memory; one 16-byte load where VW * sizeof(T) == 16.
template <typename T, int VW>
__device__ __forceinline__ void mpiml_dist_ldg(T (&v)[VW], const T* p) {
    if constexpr (VW * sizeof(T) == 16 && sizeof(T) == 4) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else if constexpr (VW * sizeof(T) == 16 && sizeof(T) == 8) {
        const double2 t = __ldg(reinterpret_cast<const double2*>(p));
        v[0] = t.x; v[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < VW; ++i) v[i] = __ldg(p + i);
    }
}

// N consecutive shared-memory values; 16-byte loads where the type allows.
template <typename T, int N>
__device__ __forceinline__ void mpiml_dist_lds(T* dst, const T* src) {
    if constexpr (sizeof(T) == 4 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + i);
            dst[i] = v.x; dst[i + 1] = v.y; dst[i + 2] = v.z; dst[i + 3] = v.w;
        }
    } else if constexpr (sizeof(T) == 8 && N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const double2 v = *reinterpret_cast<const double2*>(src + i);
            dst[i] = v.x; dst[i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = src[i];
    }
}

// An R x DK slab of a row-major matrix, held in registers between its load and its store.
// Vector e = tid + q * THREADS of the slab is row e % R, features [(e / R) * VW, + VW): the lanes
// of a warp take consecutive rows, so the transposed store S[f * R + r] has no bank conflict.
template <typename T, int R, int DK, int VW>
struct mpiml_dist_slab {
    static constexpr int NV = R * DK / VW;
    static constexpr int PER = (NV + MPIML_DIST_THREADS - 1) / MPIML_DIST_THREADS;
    T v[PER][VW];

    __device__ __forceinline__ void load(const T* __restrict__ A, long long nrows, int d, long long row0, int f0,
                                         const T* __restrict__ shift, int tid) {
#pragma unroll
        for (int q = 0; q < PER; ++q) {
            const int e = tid + q * MPIML_DIST_THREADS;
            const int r = e % R, f = f0 + (e / R) * VW;
            const long long row = row0 + r;
            if ((NV % MPIML_DIST_THREADS == 0 || e < NV) && row < nrows && f < d) {
                mpiml_dist_ldg<T, VW>(v[q], A + row * d + f);
                if (shift != nullptr) {
                    T s[VW];
                    mpiml_dist_ldg<T, VW>(s, shift + f);
#pragma unroll
                    for (int i = 0; i < VW; ++i) v[q][i] -= s[i];
                }
            } else {
#pragma unroll
                for (int i = 0; i < VW; ++i) v[q][i] = T(0);
            }
        }
    }

    __device__ __forceinline__ void store(T* __restrict__ S, int tid) const {
#pragma unroll
        for (int q = 0; q < PER; ++q) {
            const int e = tid + q * MPIML_DIST_THREADS;
            if (NV % MPIML_DIST_THREADS == 0 || e < NV) {
                const int r = e % R, fv = e / R;
#pragma unroll
                for (int i = 0; i < VW; ++i) S[(fv * VW + i) * R + r] = v[q][i];
            }
        }
    }

    // sum of squares of this thread's values; all of them belong to row tid % R (R divides THREADS)
    __device__ __forceinline__ T sumsq() const {
        T s = T(0);
#pragma unroll
        for (int q = 0; q < PER; ++q)
#pragma unroll
            for (int i = 0; i < VW; ++i) s = fma(v[q][i], v[q][i], s);
        return s;
    }
};

// acc[i][j] += sum over the DK staged features of Xs[f][rg*TM + i] * Cs[f][cg*TN + j]
template <typename T, int TM, int TN, int DK, int BM, int BN>
__device__ __forceinline__ void mpiml_dist_tile(T (&acc)[TM][TN], const T* __restrict__ Xs,
                                                const T* __restrict__ Cs, int rg, int cg) {
#pragma unroll
    for (int f = 0; f < DK; ++f) {
        T a[TM], b[TN];
        mpiml_dist_lds<T, TM>(a, Xs + f * BM + rg * TM);
        mpiml_dist_lds<T, TN>(b, Cs + f * BN + cg * TN);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
    }
}

template <typename T, typename A, int TM, int TN, int CG, int DK, int VW, int MINB, int MODE>
__global__ void __launch_bounds__(MPIML_DIST_THREADS, MINB)
mpiml_distances_argmin(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                       const T* __restrict__ C, const T* __restrict__ c_sq, int k,
                       const T* __restrict__ w, int* __restrict__ labels, T* __restrict__ mind,
                       double* __restrict__ out, double* __restrict__ part, int groups)
{
    constexpr int THREADS = MPIML_DIST_THREADS;
    constexpr int RG = THREADS / CG;
    constexpr int BM = RG * TM;
    constexpr int BN = CG * TN;
    constexpr int UB = (MINB > 1 ? 64 : 128) / sizeof(T);   // rows one thread loads at once when accumulating
    static_assert(THREADS % BM == 0, "a tile's rows must divide the block");
    static_assert(CG <= 32 && (CG & (CG - 1)) == 0, "a row's lanes must share a warp");

    extern __shared__ __align__(16) unsigned char mpiml_dist_smem[];
    T* stage = reinterpret_cast<T*>(mpiml_dist_smem);        // 2 buffers of [DK x BM | DK x BN]
    constexpr int STAGE = DK * (BM + BN);
    T* xsq_part = stage + 2 * STAGE;                          // THREADS
    T* w_s = xsq_part + THREADS;                              // BM
    int* lab_s = reinterpret_cast<int*>(w_s + BM);            // BM
    A* cnt_s = reinterpret_cast<A*>(lab_s + BM);              // k
    A* acc_s = cnt_s + k;                                     // groups x k x d
    __shared__ double red_inertia[THREADS / 32];
    __shared__ long long red_changed[THREADS / 32];

    const int tid = threadIdx.x;
    const int cg = tid % CG;
    const int rg = tid / CG;
    const long long cells = (long long)k * d;
    if constexpr (MODE == 1) {
        for (long long i = tid; i < groups * cells + k; i += THREADS) cnt_s[i] = A(0);
    }
    double my_inertia = 0.0;
    long long my_changed = 0;

    const int nF = (d + DK - 1) / DK;
    const int nJ = (k + BN - 1) / BN;
    const int steps = nF * nJ;
    const long long n_tiles = (n + BM - 1) / BM;

    // The (tile, step) sequence of this block; step s stages features (s % nF) * DK of centre chunk
    // s / nF.  Slabs are double-buffered in shared memory: the slab of the next step is stored
    // while this one is computed, and the one after is loaded into registers, so each step needs
    // one barrier and its global loads have a whole step to arrive.
    mpiml_dist_slab<T, BM, DK, VW> xs;
    mpiml_dist_slab<T, BN, DK, VW> cs;
    auto prefetch = [&](long long tile, int s) {
        const int f0 = (s % nF) * DK, j0 = (s / nF) * BN;
        xs.load(X, n, d, tile * BM, f0, shift, tid);
        cs.load(C, k, d, j0, f0, nullptr, tid);
    };
    auto advance = [&](long long& tile, int& s) {
        if (++s == steps) { s = 0; tile += gridDim.x; }
    };

    long long tile = blockIdx.x;
    int s = 0;
    T best[TM];
    int bidx[TM];
    T acc[TM][TN];
    T xsq = T(0), xsq_next = T(0);
#pragma unroll
    for (int i = 0; i < TM; ++i) { best[i] = mpiml_dist_traits<T>::inf(); bidx[i] = 0x7fffffff; }
    long long nt = tile;          // the position whose slab the registers hold
    int ns = 0;
    if (tile < n_tiles) {
        prefetch(tile, 0);
        xs.store(stage, tid);
        cs.store(stage + DK * BM, tid);
        xsq += xs.sumsq();       // step 0 is always of centre chunk 0
        advance(nt, ns);
        if (nt < n_tiles) prefetch(nt, ns);
    }
    __syncthreads();
    int cur = 0;
    while (tile < n_tiles) {
        const long long row0 = tile * BM;
        const int fc = s % nF, j0 = (s / nF) * BN;
        // stage the next slab into the other buffer, then start loading the one after it
        long long pt = nt;
        int ps = ns;
        if (nt < n_tiles) {
            T* nb = stage + (cur ^ 1) * STAGE;
            xs.store(nb, tid);
            cs.store(nb + DK * BM, tid);
            if (ns / nF == 0) {
                if (nt == tile) xsq += xs.sumsq();
                else xsq_next += xs.sumsq();
            }
            advance(pt, ps);
            if (pt < n_tiles) prefetch(pt, ps);
        }
        if (fc == 0) {
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
        }
        mpiml_dist_tile<T, TM, TN, DK, BM, BN>(acc, stage + cur * STAGE, stage + cur * STAGE + DK * BM, rg, cg);

        if (fc == nF - 1) {
            // ||c||^2 - 2 x.c of this chunk; (min, argmin) per row, then across the row's CG lanes
            T cq[TN];
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int jj = j0 + cg * TN + j;
                cq[j] = jj < k ? __ldg(c_sq + jj) : mpiml_dist_traits<T>::inf();
            }
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                T bv = mpiml_dist_traits<T>::inf();
                int bj = 0x7fffffff;
#pragma unroll
                for (int j = 0; j < TN; ++j) {
                    const T dist = fma(T(-2), acc[i][j], cq[j]);
                    if (dist < bv) { bv = dist; bj = j0 + cg * TN + j; }
                }
#pragma unroll
                for (int off = CG / 2; off > 0; off >>= 1) {
                    const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
                    const int oj = __shfl_xor_sync(0xffffffffu, bj, off);
                    if (ov < bv || (ov == bv && oj < bj)) { bv = ov; bj = oj; }
                }
                if (bv < best[i]) { best[i] = bv; bidx[i] = bj; }   // equal: the earlier chunk stays
            }
        }

        if (s == steps - 1) {
            // the tile is done: squared norms of its rows, then one lane per row writes it out
            xsq_part[tid] = xsq;
            __syncthreads();
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                if (i % CG == cg) {
                    const int r = rg * TM + i;
                    const long long row = row0 + r;
                    int lab = -1;
                    T wt = T(0);
                    if (row < n) {
                        T xr = T(0);
#pragma unroll
                        for (int p = 0; p < THREADS / BM; ++p) xr += xsq_part[p * BM + r];
                        lab = bidx[i] == 0x7fffffff ? 0 : bidx[i];
                        T dist = best[i] + xr;
                        dist = dist > T(0) ? dist : T(0);
                        mind[row] = dist;
                        if constexpr (MODE == 1) {
                            wt = w[row];
                            my_changed += labels[row] != lab;
                            my_inertia += (double)wt * (double)dist;
                            atomicAdd(&cnt_s[lab], (A)wt);
                        }
                        labels[row] = lab;
                    }
                    if constexpr (MODE == 1) { lab_s[r] = lab; w_s[r] = wt; }
                }
                best[i] = mpiml_dist_traits<T>::inf();
                bidx[i] = 0x7fffffff;
            }
            xsq = xsq_next;
            xsq_next = T(0);

            if constexpr (MODE == 1) {
                if (groups > 0) {
                    __syncthreads();
                    // thread -> (copy g, column c): the only writer of its cells.  Copy g takes rows
                    // g, g + groups, ...; a thread first loads UB of them (all in flight at once), then adds.
                    const int rows_here = (int)((n - row0) < BM ? (n - row0) : BM);
                    const int tpg = THREADS / groups;
                    const int g = tid / tpg, q = tid % tpg;
                    A* mine = acc_s + g * cells;
                    for (int c = q; c < d; c += tpg) {
                        const T sc = shift != nullptr ? shift[c] : T(0);
                        for (int r0 = g; r0 < rows_here; r0 += groups * UB) {
                            T v[UB];
#pragma unroll
                            for (int u = 0; u < UB; ++u) {
                                const int r = r0 + u * groups;
                                v[u] = r < rows_here ? X[(row0 + r) * d + c] : T(0);
                            }
#pragma unroll
                            for (int u = 0; u < UB; ++u) {
                                const int r = r0 + u * groups;
                                if (r < rows_here) mine[(long long)lab_s[r] * d + c] += (A)(v[u] - sc) * (A)w_s[r];
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();
        tile = nt;
        s = ns;
        nt = pt;
        ns = ps;
        cur ^= 1;
    }

    if constexpr (MODE == 1) {
        // this block's totals -> its own row of `part`: [sums (k x d, when groups > 0) | weights (k) |
        // inertia | changed], summed in a fixed order by mpiml_distances_reduce_partials
        const long long S = groups > 0 ? cells : 0;
        const long long P = S + k + 2;
        double* mine = part + (long long)blockIdx.x * P;
        __syncthreads();
        for (long long i = tid; i < S; i += THREADS) {
            double s = 0.0;
            for (int g = 0; g < groups; ++g) s += (double)acc_s[g * cells + i];
            mine[i] = s;
        }
        for (int j = tid; j < k; j += THREADS) mine[S + j] = (double)cnt_s[j];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            my_inertia += __shfl_xor_sync(0xffffffffu, my_inertia, off);
            my_changed += __shfl_xor_sync(0xffffffffu, my_changed, off);
        }
        if ((tid & 31) == 0) { red_inertia[tid >> 5] = my_inertia; red_changed[tid >> 5] = my_changed; }
        __syncthreads();
        if (tid == 0) {
            double s = 0.0;
            long long c = 0;
            for (int i = 0; i < THREADS / 32; ++i) { s += red_inertia[i]; c += red_changed[i]; }
            mine[P - 2] = s;
            mine[P - 1] = (double)c;
        }
    }
}

// out[j] += sum over rows b of part[b * P + j] in a fixed order (the same bits on every run): a block takes 32
// columns, warp w the rows w, w + 8, ... in order (coalesced, 8 chains in flight, not one chain of nblocks
// loads), then the 8 warps' sums are added in warp order.  256 threads.
extern "C" __global__ void __launch_bounds__(256)
mpiml_distances_reduce_partials(const double* __restrict__ part, int nblocks, long long P, double* __restrict__ out)
{
    __shared__ double red[8][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long j0 = blockIdx.x * 32LL; j0 < P; j0 += gridDim.x * 32LL) {
        const long long j = j0 + lane;
        double s = 0.0;
        if (j < P) {
            const double* p = part + j;
#pragma unroll 4
            for (int b = warp; b < nblocks; b += 8) s += p[(long long)b * P];
        }
        red[warp][lane] = s;
        __syncthreads();
        if (warp == 0 && j < P) {
            double t = red[0][lane];
#pragma unroll
            for (int q = 1; q < 8; ++q) t += red[q][lane];
            out[j] += t;
        }
        __syncthreads();
    }
}

// Per-cluster weighted sums of the rows of X given their labels: the second pass of a Lloyd step
// when k x d accumulators do not fit a block.  Block b takes columns [32 * (b % n_cc), + 32) of
// rows [rows_per_block * (b / n_cc), + rows_per_block); each warp adds its rows (lane = column)
// into copy (warp % copies) of a kc x 32 array in shared memory (shared atomics when warps share
// a copy), then the block adds its array to out[label * d + column] with float64 atomics.  Only
// labels in [k0, k0 + kc) are counted (the caller loops over label ranges when k is too large).
template <typename T, typename A>
__global__ void __launch_bounds__(MPIML_DIST_THREADS)
mpiml_distances_label_sums(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                           const int* __restrict__ labels, const T* __restrict__ w, int k0, int k, int copies,
                           long long rows_per_block, double* __restrict__ out)
{
    constexpr int U = 8;
    extern __shared__ __align__(16) unsigned char mpiml_dist_smem[];
    A* acc = reinterpret_cast<A*>(mpiml_dist_smem);         // copies x k x 32
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n_cc = (d + 31) / 32;
    const int c = (blockIdx.x % n_cc) * 32 + lane;
    const long long r_begin = (long long)(blockIdx.x / n_cc) * rows_per_block;
    const long long r_end = r_begin + rows_per_block < n ? r_begin + rows_per_block : n;
    const int copy = warp % copies;
    const bool shared_copy = copies < MPIML_DIST_THREADS / 32;
    for (long long i = tid; i < (long long)copies * k * 32; i += MPIML_DIST_THREADS) acc[i] = A(0);
    __syncthreads();
    const T sc = (c < d && shift != nullptr) ? shift[c] : T(0);
    A* mine = acc + (long long)copy * k * 32 + lane;
    for (long long r0 = r_begin + warp * U; r0 < r_end; r0 += (MPIML_DIST_THREADS / 32) * U) {
        T v[U], wt[U];
        int lab[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const long long r = r0 + u;
            const bool ok = r < r_end;
            lab[u] = ok ? labels[r] - k0 : -1;
            if (lab[u] >= k) lab[u] = -1;
            wt[u] = ok ? w[r] : T(0);
            v[u] = (ok && c < d) ? X[r * d + c] : T(0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (lab[u] < 0) continue;
            const A val = (A)(v[u] - sc) * (A)wt[u];
            if (shared_copy) atomicAdd(mine + lab[u] * 32, val);
            else mine[lab[u] * 32] += val;
        }
    }
    __syncthreads();
    for (long long i = tid; i < (long long)k * 32; i += MPIML_DIST_THREADS) {
        const int col = (blockIdx.x % n_cc) * 32 + (int)(i % 32);
        if (col >= d) continue;
        double s = 0.0;
        for (int cp = 0; cp < copies; ++cp) s += (double)acc[(long long)cp * k * 32 + i];
        if (s != 0.0) atomicAdd(&out[(k0 + i / 32) * d + col], s);
    }
}

// labels[i], mind[i] from a row-major n x k block of dot products: argmin_j c_sq[j] - 2 G[i, j]
// (ties: the lower j), mind = that + x_sq[i], clamped at 0.  One warp per row, grid-stride.
template <typename T>
__global__ void __launch_bounds__(MPIML_DIST_THREADS)
mpiml_distances_argmin_gemm(const T* __restrict__ G, long long n, int k, const T* __restrict__ c_sq,
                            const T* __restrict__ x_sq, int* __restrict__ labels, T* __restrict__ mind)
{
    const int lane = threadIdx.x & 31;
    const long long stride = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; row < n; row += stride) {
        const T* g = G + row * k;
        T bv = mpiml_dist_traits<T>::inf();
        int bj = 0x7fffffff;
        for (int j = lane; j < k; j += 32) {
            const T v = fma(T(-2), g[j], c_sq[j]);
            if (v < bv) { bv = v; bj = j; }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oj = __shfl_xor_sync(0xffffffffu, bj, off);
            if (ov < bv || (ov == bv && oj < bj)) { bv = ov; bj = oj; }
        }
        if (lane == 0) {
            T dist = bv + x_sq[row];
            mind[row] = dist > T(0) ? dist : T(0);
            labels[row] = bj == 0x7fffffff ? 0 : bj;
        }
    }
}

template <typename T, int TM, int TN, int CG, int DK, int VW, int MINB, int METRIC>
__global__ void __launch_bounds__(MPIML_DIST_THREADS, MINB)
mpiml_distances_pairwise(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                         const T* __restrict__ Y, long long m, const T* __restrict__ y_shift,
                         const T* __restrict__ y_aux, T* __restrict__ out)
{
    constexpr int THREADS = MPIML_DIST_THREADS;
    constexpr int RG = THREADS / CG;
    constexpr int BM = RG * TM;
    constexpr int BN = CG * TN;
    static_assert(THREADS % BM == 0, "a tile's rows must divide the block");

    extern __shared__ __align__(16) unsigned char mpiml_dist_smem[];
    T* Xs = reinterpret_cast<T*>(mpiml_dist_smem);
    T* Cs = Xs + DK * BM;
    T* xsq_part = Cs + DK * BN;

    const int tid = threadIdx.x;
    const int cg = tid % CG;
    const int rg = tid / CG;
    const int nF = (d + DK - 1) / DK;
    const long long n_rt = (n + BM - 1) / BM, n_ct = (m + BN - 1) / BN;
    const long long n_tiles = n_rt * n_ct;

    mpiml_dist_slab<T, BM, DK, VW> xs;
    mpiml_dist_slab<T, BN, DK, VW> cs;
    auto prefetch = [&](long long tile, int fc) {
        const long long rt = tile / n_ct, ct = tile % n_ct;
        xs.load(X, n, d, rt * BM, fc * DK, shift, tid);
        cs.load(Y, m, d, ct * BN, fc * DK, y_shift, tid);
    };
    if ((long long)blockIdx.x < n_tiles) prefetch(blockIdx.x, 0);

    for (long long tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const long long row0 = (tile / n_ct) * BM, col0 = (tile % n_ct) * BN;
        T acc[TM][TN];
        T xsq = T(0);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
        for (int fc = 0; fc < nF; ++fc) {
            __syncthreads();
            xs.store(Xs, tid);
            cs.store(Cs, tid);
            xsq += xs.sumsq();
            __syncthreads();
            if (fc + 1 < nF) prefetch(tile, fc + 1);
            else if (tile + gridDim.x < n_tiles) prefetch(tile + gridDim.x, 0);
            mpiml_dist_tile<T, TM, TN, DK, BM, BN>(acc, Xs, Cs, rg, cg);
        }
        xsq_part[tid] = xsq;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int r = rg * TM + i;
            const long long row = row0 + r;
            if (row >= n) continue;
            T xr = T(0);
#pragma unroll
            for (int p = 0; p < THREADS / BM; ++p) xr += xsq_part[p * BM + r];
            T rx = T(0);
            if constexpr (METRIC == 2) rx = xr > T(0) ? T(1) / sqrt(xr) : T(0);
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const long long col = col0 + cg * TN + j;
                if (col >= m) continue;
                T v;
                if constexpr (METRIC == 0 || METRIC == 3) {
                    v = fma(T(-2), acc[i][j], xr + y_aux[col]);
                    v = v > T(0) ? v : T(0);
                    if constexpr (METRIC == 3) v = sqrt(v);
                } else if constexpr (METRIC == 1) {
                    v = -acc[i][j];
                } else {
                    v = T(1) - acc[i][j] * rx * y_aux[col];
                }
                out[row * m + col] = v;
            }
        }
    }
}

// The centres' update of a Lloyd iteration from its packed totals [sums (k x d) | weights (k) | inertia |
// changed] (float64, summed over the ranks): c_new = sums / weights, a cluster of no weight keeping c_old (in
// float64, rounded to T once: the bits of KMeans's host update), and tail = [inertia, changed, squared shift of
// the centres (float64, before the rounding), clusters of no weight].  Each block writes its partial shift and
// empty count to part[2 b], part[2 b + 1]; the last block to finish (a ticket, reset for the next launch) adds
// them in block order (the same bits on every run) and writes tail.
template <typename T>
__global__ void __launch_bounds__(256)
mpiml_lloyd_update(const double* __restrict__ packed, const T* __restrict__ c_old, int k, int d,
                   T* __restrict__ c_new, double* __restrict__ part, unsigned* __restrict__ ticket,
                   double* __restrict__ tail)
{
    __shared__ double red[2][8];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long cells = (long long)k * d, stride = (long long)gridDim.x * blockDim.x;
    const double* counts = packed + cells;
    double shift = 0.0, empty = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + tid; i < cells; i += stride) {
        const double cnt = counts[i / d], old = (double)c_old[i];
        const double v = cnt > 0.0 ? packed[i] / cnt : old;
        c_new[i] = (T)v;
        const double diff = v - old;
        shift += diff * diff;
    }
    for (long long j = blockIdx.x * (long long)blockDim.x + tid; j < k; j += stride)
        empty += counts[j] > 0.0 ? 0.0 : 1.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        shift += __shfl_xor_sync(0xffffffffu, shift, off);
        empty += __shfl_xor_sync(0xffffffffu, empty, off);
    }
    if (lane == 0) { red[0][warp] = shift; red[1][warp] = empty; }
    __syncthreads();
    if (tid == 0) {
        double s = 0.0, e = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) { s += red[0][w]; e += red[1][w]; }
        part[2 * blockIdx.x] = s;
        part[2 * blockIdx.x + 1] = e;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && tid == 0) {
        __threadfence();
        double s = 0.0, e = 0.0;
        for (unsigned b = 0; b < gridDim.x; ++b) { s += __ldcg(part + 2 * b); e += __ldcg(part + 2 * b + 1); }
        tail[0] = counts[k];
        tail[1] = counts[k + 1];
        tail[2] = s;
        tail[3] = e;
        *ticket = 0u;
        __threadfence_system();          // tail may be pinned host memory
    }
}
