// Fused k-means step: nearest centre of every row, and the per-cluster sums, in one pass.
//
// mpiml_kmeans_lloyd<T, TM, TN, BC> -- T float or double.
//
// A block of 256 threads takes tiles of BM = (256 / BC) * TM rows.  For each chunk
// of BN = BC * TN centres it computes the BM x BN dot products like a register-tiled
// matrix product (each thread a TM x TN block, features staged through shared memory
// DK at a time), turns them into ||c||^2 - 2 x.c, and keeps a running (min, argmin)
// per row.  The shift (the global mean) is subtracted while a tile is staged, so the
// expansion is evaluated around the data's centre.  No n x k matrix is ever written.
//
// Global loads of the next (tile, chunk) are issued into registers before the current
// chunk is computed, so their latency hides behind the arithmetic.
//
// With `accumulate`, the same pass then adds every row (weighted, shifted, in double)
// to its cluster's sum and counts, inertia and changed labels.  The sums live in
// `groups` private copies in shared memory, each (copy, cluster, column) cell owned by
// one thread, so no atomics are needed there; with groups == 0 (k * (d + 1) doubles do
// not fit) they go straight to global memory with atomics.  Each block flushes its
// partial sums once with atomics into `out`:
//     out = [sums (k*d) | weight per cluster (k) | inertia | changed labels]
// Without `accumulate` it only writes labels and squared distances (predict).

#ifndef MPIML_KMEANS_DK
#define MPIML_KMEANS_DK 16
#endif

template <typename T> struct mpiml_kmeans_limits;
template <> struct mpiml_kmeans_limits<float> { __device__ static float inf() { return __int_as_float(0x7f800000); } };
template <> struct mpiml_kmeans_limits<double> { __device__ static double inf() { return __longlong_as_double(0x7ff0000000000000LL); } };

template <typename T, int N>
__device__ __forceinline__ void mpiml_kmeans_lds(T* dst, const T* src) {
    // N consecutive shared-memory values; 16-byte loads where the type allows.
    if constexpr (sizeof(T) == 4 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            float4 v = *reinterpret_cast<const float4*>(src + i);
            dst[i] = v.x; dst[i + 1] = v.y; dst[i + 2] = v.z; dst[i + 3] = v.w;
        }
    } else if constexpr (sizeof(T) == 8 && N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            double2 v = *reinterpret_cast<const double2*>(src + i);
            dst[i] = v.x; dst[i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] = src[i];
    }
}

template <typename T, int TM, int TN, int BC>
__global__ void __launch_bounds__(256, 2)
mpiml_kmeans_lloyd(const T* __restrict__ X, long long n, int d,
                   const T* __restrict__ C, const T* __restrict__ c_sq, int k,
                   const T* __restrict__ shift, const T* __restrict__ w,
                   int* __restrict__ labels, T* __restrict__ mind,
                   double* __restrict__ out, int accumulate, int groups)
{
    constexpr int THREADS = 256;
    constexpr int BR = THREADS / BC;
    constexpr int BM = BR * TM;
    constexpr int BN = BC * TN;
    constexpr int DK = MPIML_KMEANS_DK;
    constexpr int PADX = 16 / sizeof(T);
    constexpr int LDX = BM + PADX;
    constexpr int LDC = BN + PADX;
    constexpr int XPT = DK * BM / THREADS;               // staged X values per thread
    constexpr int CPT = (DK * BN + THREADS - 1) / THREADS; // staged centre values per thread

    extern __shared__ __align__(16) unsigned char mpiml_kmeans_smem[];
    const int W = d + 1;                                  // accumulator row: d sums + the weight
    const long long acc_len = (long long)groups * k * W;
    double* acc_s = reinterpret_cast<double*>(mpiml_kmeans_smem);
    T* Xs = reinterpret_cast<T*>(acc_s + ((acc_len + 1) & ~1LL));   // DK x LDX, 16-byte aligned
    T* Cs = Xs + DK * LDX;                                           // DK x LDC
    T* w_s = Cs + DK * LDC;                                          // BM
    int* lab_s = reinterpret_cast<int*>(w_s + BM);                   // BM
    __shared__ double red_inertia[THREADS / 32];
    __shared__ int red_changed[THREADS / 32];

    const int tid = threadIdx.x;
    const int cg = tid % BC;          // centre group: the fastest index, so a row's BC lanes share a warp
    const int rg = tid / BC;          // row group
    for (long long i = tid; i < acc_len; i += THREADS) acc_s[i] = 0.0;
    double my_inertia = 0.0;
    int my_changed = 0;

    const int nF = (d + DK - 1) / DK;
    const int nJ = (k + BN - 1) / BN;
    const int steps = nF * nJ;
    const long long n_tiles = (n + BM - 1) / BM;

    T px[XPT], pc[CPT];
    auto load = [&](long long tile, int s) {
        const long long row0 = tile * BM;
        const int f0 = (s % nF) * DK, j0 = (s / nF) * BN;
#pragma unroll
        for (int q = 0; q < XPT; ++q) {
            const int idx = tid + q * THREADS;
            const int f = idx % DK, r = idx / DK;
            const long long row = row0 + r;
            const int ff = f0 + f;
            px[q] = (row < n && ff < d) ? X[row * d + ff] - shift[ff] : T(0);
        }
#pragma unroll
        for (int q = 0; q < CPT; ++q) {
            const int idx = tid + q * THREADS;
            const int f = idx % DK, c = idx / DK;
            const int jj = j0 + c, ff = f0 + f;
            pc[q] = (idx < DK * BN && jj < k && ff < d) ? C[(long long)jj * d + ff] : T(0);
        }
    };
    if ((long long)blockIdx.x < n_tiles) load(blockIdx.x, 0);

    for (long long tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const long long row0 = tile * BM;
        T best[TM];
        int bidx[TM];
        T xsq[TM];
        T acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) { best[i] = mpiml_kmeans_limits<T>::inf(); bidx[i] = 0; xsq[i] = T(0); }

        for (int s = 0; s < steps; ++s) {
            const int fc = s % nF, j0 = (s / nF) * BN;
            __syncthreads();
#pragma unroll
            for (int q = 0; q < XPT; ++q) {
                const int idx = tid + q * THREADS;
                Xs[(idx % DK) * LDX + idx / DK] = px[q];
            }
#pragma unroll
            for (int q = 0; q < CPT; ++q) {
                const int idx = tid + q * THREADS;
                if (idx < DK * BN) Cs[(idx % DK) * LDC + idx / DK] = pc[q];
            }
            __syncthreads();
            // issue the next chunk's loads now; they land while this chunk is computed
            if (s + 1 < steps) load(tile, s + 1);
            else if (tile + gridDim.x < n_tiles) load(tile + gridDim.x, 0);

            if (fc == 0) {
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);
            }
#pragma unroll
            for (int f = 0; f < DK; ++f) {
                T a[TM], b[TN];
                mpiml_kmeans_lds<T, TM>(a, Xs + f * LDX + rg * TM);
                mpiml_kmeans_lds<T, TN>(b, Cs + f * LDC + cg * TN);
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
                if (j0 == 0) {
#pragma unroll
                    for (int i = 0; i < TM; ++i) xsq[i] = fma(a[i], a[i], xsq[i]);
                }
            }
            if (fc == nF - 1) {
                // (min, argmin) of this centre chunk per row, then across the BC lanes of the row
#pragma unroll
                for (int i = 0; i < TM; ++i) {
                    T bv = mpiml_kmeans_limits<T>::inf();
                    int bj = 0x7fffffff;
#pragma unroll
                    for (int j = 0; j < TN; ++j) {
                        const int jj = j0 + cg * TN + j;
                        if (jj < k) {
                            const T dist = c_sq[jj] - T(2) * acc[i][j];
                            if (dist < bv) { bv = dist; bj = jj; }
                        }
                    }
#pragma unroll
                    for (int off = BC / 2; off > 0; off >>= 1) {
                        const T ov = __shfl_xor_sync(0xffffffffu, bv, off);
                        const int oj = __shfl_xor_sync(0xffffffffu, bj, off);
                        if (ov < bv || (ov == bv && oj < bj)) { bv = ov; bj = oj; }
                    }
                    if (bv < best[i]) { best[i] = bv; bidx[i] = bj; }  // ties keep the lower chunk
                }
            }
        }

        // write labels and distances; count changes and inertia
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int r = rg * TM + i;
            const long long row = row0 + r;
            if (cg == 0) {
                int lab = 0;
                T wt = T(0);
                if (row < n) {
                    lab = bidx[i];
                    T dist = best[i] + xsq[i];
                    dist = dist > T(0) ? dist : T(0);
                    mind[row] = dist;
                    if (accumulate) {
                        wt = w[row];
                        my_changed += labels[row] != lab;
                        my_inertia += (double)wt * (double)dist;
                    }
                    labels[row] = lab;
                }
                lab_s[r] = lab;
                w_s[r] = wt;
            }
        }
        if (accumulate) {
            __syncthreads();
            const int rows_here = (int)((n - row0) < BM ? (n - row0) : BM);
            if (groups > 0) {
                // thread -> (group g, column c): the only writer of its cells, no atomics
                const int per_group = THREADS / groups;
                const int g = tid / per_group, c0 = tid % per_group;
                if (g < groups) {
                    double* mine = acc_s + (long long)g * k * W;
                    constexpr int U = 4;   // rows in flight per thread: their loads overlap
                    for (int r0 = g; r0 < rows_here; r0 += U * groups) {
                        for (int c = c0; c < W; c += per_group) {
                            double v[U];
                            int lab[U];
#pragma unroll
                            for (int u = 0; u < U; ++u) {
                                const int r = r0 + u * groups;
                                lab[u] = -1;
                                v[u] = 0.0;
                                if (r < rows_here) {
                                    lab[u] = lab_s[r];
                                    const double wt = (double)w_s[r];
                                    v[u] = c < d ? (double)(X[(row0 + r) * d + c] - shift[c]) * wt : wt;
                                }
                            }
#pragma unroll
                            for (int u = 0; u < U; ++u)
                                if (lab[u] >= 0) mine[(long long)lab[u] * W + c] += v[u];
                        }
                    }
                }
            } else {
                for (long long idx = tid; idx < (long long)rows_here * d; idx += THREADS) {
                    const int r = (int)(idx / d), f = (int)(idx % d);
                    const double v = (double)(X[(row0 + r) * d + f] - shift[f]) * (double)w_s[r];
                    atomicAdd(&out[(long long)lab_s[r] * d + f], v);
                }
                for (int r = tid; r < rows_here; r += THREADS) atomicAdd(&out[(long long)k * d + lab_s[r]], (double)w_s[r]);
            }
        }
    }

    if (!accumulate) return;
    // block totals of inertia and changed labels
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
        atomicAdd(&out[(long long)k * (d + 1)], s);
        atomicAdd(&out[(long long)k * (d + 1) + 1], (double)c);
    }
    if (groups > 0) {
        const long long cells = (long long)k * W;
        for (long long i = tid; i < cells; i += THREADS) {
            double v = 0.0;
            for (int g = 0; g < groups; ++g) v += acc_s[(long long)g * cells + i];
            if (v != 0.0) {
                const long long lab = i / W, c = i % W;
                atomicAdd(&out[c < d ? lab * d + c : (long long)k * d + lab], v);
            }
        }
    }
}
