// Fused distance + k-selection: the k nearest index rows of every query, without ever
// materialising the (queries x index) distance matrix.
//
// mpiml_knn_select<T, MODE, TM, TY>: a block of 256 threads owns QT = TM * TY queries and
// streams the index rows of one split (grid = query tiles x index splits) in tiles of NT = 128
// rows.  For each tile:
//   1. distances of the QT x NT pairs in registers: thread (ty, tx) of the TY x TX grid holds
//      TM queries x TN = NT / TX rows; the dimensions are streamed through shared memory in
//      chunks of DK (queries and rows stored transposed, so a thread reads its rows as 16-byte
//      vectors); MODE picks the accumulation (a dot product for the GEMM forms, |a - b|, max or
//      |a - b|^p for the direct forms) and the epilogue;
//   2. the tile's values go to shared memory, and each warp scans the rows of its queries: one
//      compare per candidate against the query's current k-th entry, a ballot of the lanes that
//      beat it, and a warp-cooperative insertion of each of those into the query's sorted list
//      (shared memory, k entries of (value, row)).
// Lists are ordered by (value, row): rows of a split arrive in increasing order, so equal values
// keep the lower row, and the comparison against the k-th entry is lexicographic so that empty
// slots (+inf, INT_MAX) fill first.  Each split writes its sorted list; mpiml_knn_merge ranks
// every entry of the splits' lists among the others (binary searches) and writes the k first.
//
// MODE: 0 squared euclidean  max(|q|^2 + |x|^2 - 2 q.x, 0)   (qaux, xaux: squared norms)
//       1 cosine             max(1 - q.x / (|q| |x|), 0)     (qaux, xaux: inverse norms, 0 for a zero row)
//       2 inner product      -q.x
//       3 manhattan          sum |q - x|
//       4 chebyshev          max |q - x|
//       5 minkowski          (sum |q - x|^p)^(1/p)

#define MPIML_KNN_THREADS 256
#define MPIML_KNN_NT 128
#define MPIML_KNN_DK 32
#define MPIML_KNN_FULL 0xffffffffu
#define MPIML_KNN_NONE 0x7fffffff

template <typename T> __device__ __forceinline__ T knn_inf();
template <> __device__ __forceinline__ float knn_inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double knn_inf<double>() { return __longlong_as_double(0x7ff0000000000000LL); }

__device__ __forceinline__ float knn_pow(float a, float p) { return powf(a, p); }
__device__ __forceinline__ double knn_pow(double a, double p) { return pow(a, p); }
__device__ __forceinline__ float knn_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double knn_fma(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float knn_sqrt(float a) { return sqrtf(a); }
__device__ __forceinline__ double knn_sqrt(double a) { return sqrt(a); }

// four consecutive elements of shared memory (16-byte aligned for float, 32 for double)
__device__ __forceinline__ void knn_load4(const float* p, float* r) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}
__device__ __forceinline__ void knn_load4(const double* p, double* r) {
    const double2 a = *reinterpret_cast<const double2*>(p);
    const double2 b = *reinterpret_cast<const double2*>(p + 2);
    r[0] = a.x; r[1] = a.y; r[2] = b.x; r[3] = b.y;
}
__device__ __forceinline__ void knn_store4(float* p, const float* r) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void knn_store4(double* p, const double* r) {
    *reinterpret_cast<double2*>(p) = make_double2(r[0], r[1]);
    *reinterpret_cast<double2*>(p + 2) = make_double2(r[2], r[3]);
}

// Rows r0 .. r0 + R - 1 (those below r_end), dimensions c0 .. c0 + DK - 1 (those below d) of A into
// S[col * RS + row] (transposed; zeros outside).  A warp's lanes take 16 consecutive rows (fewer when
// R < 16) x a few consecutive vectors of 16 bytes, so global reads are whole sectors and the
// transposed stores (RS = R + 4) fall in distinct banks.  VEC: rows of A are 16-byte aligned (else
// one element at a time, in the same pattern).
template <typename T, int R, int RS, bool VEC>
__device__ __forceinline__ void knn_load_tile(T* __restrict__ S, const T* __restrict__ A, int r0, int r_end,
                                              int c0, int d, int tid) {
    constexpr int V = VEC ? 16 / (int)sizeof(T) : 1;
    constexpr int CV = MPIML_KNN_DK / V;        // vectors per row of the chunk
    constexpr int RL = R < 16 ? R : 16;         // rows a warp instruction covers
    constexpr int LG = 32 / RL;                 // vectors of a row it covers
    constexpr int RG = R / RL;
    static_assert((R * CV) % 32 == 0, "whole warps of slots");
#pragma unroll
    for (int s = tid; s < R * CV; s += MPIML_KNN_THREADS) {
        const int w = s >> 5;
        const int ri = (s % RL) + RL * (w % RG);
        const int cv = (s & 31) / RL + LG * (w / RG);
        const int r = r0 + ri, col = c0 + cv * V;
        T v[V];
        if (r < r_end && col < d) {
            const T* src = A + (long long)r * d + col;
            if constexpr (V == 4) {
                knn_load4(src, v);
            } else if constexpr (V == 2) {
                const double2 t = *reinterpret_cast<const double2*>(src);
                v[0] = t.x;
                v[1] = t.y;
            } else {
                v[0] = src[0];
            }
        } else {
#pragma unroll
            for (int t = 0; t < V; ++t) v[t] = T(0);
        }
#pragma unroll
        for (int t = 0; t < V; ++t) S[(cv * V + t) * RS + ri] = v[t];
    }
}

// (a, ai) before (b, bi) in the (value, row) order
template <typename T>
__device__ __forceinline__ bool knn_before(T a, int ai, T b, int bi) {
    return a < b || (a == b && ai < bi);
}

template <int MODE, typename T>
__device__ __forceinline__ T knn_acc(T acc, T a, T b, T p) {
    if (MODE <= 2) return knn_fma(a, b, acc);
    const T diff = a > b ? a - b : b - a;
    if (MODE == 3) return acc + diff;
    if (MODE == 4) return acc > diff ? acc : diff;
    return acc + knn_pow(diff, p);
}

template <int MODE, typename T>
__device__ __forceinline__ T knn_value(T acc, T qa, T xa, T p) {
    if (MODE == 0) { const T v = qa + xa - T(2) * acc; return v > T(0) ? v : T(0); }
    if (MODE == 1) { const T v = T(1) - acc * qa * xa; return v > T(0) ? v : T(0); }
    if (MODE == 2) return -acc;
    if (MODE == 5) return knn_pow(acc, T(1) / p);
    return acc;
}

// Insert (cv, cj) into the sorted list (lv, li) of k entries if it beats the last one; called by
// the 32 lanes of one warp with the same candidate.
template <typename T>
__device__ __forceinline__ void knn_insert(T* lv, int* li, int k, T cv, int cj, int lane) {
    if (!knn_before(cv, cj, lv[k - 1], li[k - 1])) return;  // the threshold moved since the ballot
    int pos = 0;
    for (int base = 0; base < k; base += 32) {
        const int i = base + lane;
        const bool lt = i < k && knn_before(lv[i], li[i], cv, cj);
        const unsigned b = __ballot_sync(MPIML_KNN_FULL, lt);
        pos += __popc(b);
        if (b != MPIML_KNN_FULL) break;  // sorted: no later entry is before the candidate
    }
    // shift entries pos .. k-2 up by one, chunk by chunk from the top (each chunk reads the
    // entry below it before the chunk below is overwritten)
    for (int t = (k - 1) >> 5; t >= 0 && (t << 5) + 31 > pos; --t) {
        const int i = (t << 5) + lane;
        const bool mv = i > pos && i < k;
        T pv = T(0);
        int pi = 0;
        if (mv) { pv = lv[i - 1]; pi = li[i - 1]; }
        __syncwarp();
        if (mv) { lv[i] = pv; li[i] = pi; }
        __syncwarp();
    }
    if (lane == 0) { lv[pos] = cv; li[pos] = cj; }
    __syncwarp();
}

// The values of the QT x NT pairs of queries q0.. and index rows row0.. into Ds (after a barrier),
// shared by the selection and the radius kernels.  Qs is reloaded for every chunk when the
// dimensions take several chunks, else only for the first tile of a block.  With SCREEN, a
// query's flag is raised when one of its values is at most thr[query] (from the registers), so
// that the scan skips the queries with no candidate in the tile.
template <typename T, int MODE, int TM, int TY, bool VEC, bool SCREEN>
__device__ __forceinline__ void knn_tile_values(const T* __restrict__ Q, int nq, int d, const T* __restrict__ X,
                                                int q0, int row0, bool first, int r_end,
                                                const T* __restrict__ xaux, const T (&qa)[TM], T p,
                                                T* Qs, T* Xs, T* Ds, const T* thr, int* flags, int tid) {
    constexpr int NT = MPIML_KNN_NT, DK = MPIML_KNN_DK;
    constexpr int TX = MPIML_KNN_THREADS / TY;
    constexpr int QT = TM * TY;
    constexpr int TN = NT / TX;
    constexpr int G = TN / 4;  // groups of four consecutive rows a thread holds
    constexpr int QTP = QT + 4, NTP = NT + 4;
    static_assert(TN % 4 == 0, "a thread holds groups of four rows");
    const int tx = tid % TX, ty = tid / TX;
    const int n_chunks = (d + DK - 1) / DK;
    T acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int n = 0; n < TN; ++n) acc[i][n] = T(0);

    for (int c = 0; c < n_chunks; ++c) {
        const int c0 = c * DK;
        __syncthreads();  // the previous chunk (or tile) is no longer read
        if (n_chunks > 1 || first) knn_load_tile<T, QT, QTP, VEC>(Qs, Q, q0, nq, c0, d, tid);
        knn_load_tile<T, NT, NTP, VEC>(Xs, X, row0, r_end, c0, d, tid);
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < DK; ++kk) {
            T a[TM], b[TN];
            if constexpr (TM == 4) {
                knn_load4(Qs + kk * QTP + ty * 4, a);
            } else {
#pragma unroll
                for (int i = 0; i < TM; ++i) a[i] = Qs[kk * QTP + ty * TM + i];
            }
#pragma unroll
            for (int g = 0; g < G; ++g) knn_load4(Xs + kk * NTP + g * TX * 4 + tx * 4, b + 4 * g);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int n = 0; n < TN; ++n) acc[i][n] = knn_acc<MODE>(acc[i][n], a[i], b[n], p);
        }
    }
    // epilogue: values of the tile into Ds (rows past the split are masked in the scan)
#pragma unroll
    for (int g = 0; g < G; ++g) {
        T xa[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = row0 + g * TX * 4 + tx * 4 + e;
            xa[e] = (MODE <= 1 && r < r_end) ? xaux[r] : T(0);
        }
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            T v[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = knn_value<MODE>(acc[i][4 * g + e], qa[i], xa[e], p);
            knn_store4(Ds + (ty * TM + i) * NT + g * TX * 4 + tx * 4, v);
            if constexpr (SCREEN) {
                const T t = thr[ty * TM + i];
                if (v[0] <= t || v[1] <= t || v[2] <= t || v[3] <= t) flags[ty * TM + i] = 1;
            }
        }
    }
    __syncthreads();
}

template <typename T, int MODE, int TM, int TY, bool VEC>
__global__ void __launch_bounds__(MPIML_KNN_THREADS)
mpiml_knn_select(const T* __restrict__ Q, int nq, int d, const T* __restrict__ X, int m,
                 const T* __restrict__ qaux, const T* __restrict__ xaux, T p, int k, int split_rows,
                 T* __restrict__ out_v, int* __restrict__ out_i) {
    constexpr int NT = MPIML_KNN_NT, DK = MPIML_KNN_DK;
    constexpr int TX = MPIML_KNN_THREADS / TY;
    constexpr int QT = TM * TY;
    static_assert(QT % 8 == 0, "every warp owns the same number of queries");
    constexpr int QTP = QT + 4, NTP = NT + 4;  // padded strides (16-byte multiples)
    extern __shared__ __align__(16) unsigned char knn_smem[];
    T* Qs = reinterpret_cast<T*>(knn_smem);          // [DK][QTP]
    T* Xs = Qs + DK * QTP;                           // [DK][NTP]
    T* Ds = Xs + DK * NTP;                           // [QT][NT]
    T* Lv = Ds + QT * NT;                            // [QT][k]
    T* Tv = Lv + QT * k;                             // [QT] the k-th value of each query
    int* Li = reinterpret_cast<int*>(Tv + QT);       // [QT][k]
    int* Fl = Li + QT * k;                           // [QT] candidates in this tile

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ty = tid / TX;
    const int q0 = blockIdx.x * QT;
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int r_begin = split * split_rows;
    const int r_end = min(m, r_begin + split_rows);

    for (int i = tid; i < QT * k; i += MPIML_KNN_THREADS) {
        Lv[i] = knn_inf<T>();
        Li[i] = MPIML_KNN_NONE;
    }
    for (int i = tid; i < QT; i += MPIML_KNN_THREADS) {
        Tv[i] = knn_inf<T>();
        Fl[i] = 0;
    }
    T qa[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int q = q0 + ty * TM + i;
        qa[i] = (MODE <= 1 && q < nq) ? qaux[q] : T(0);
    }

    for (int row0 = r_begin; row0 < r_end; row0 += NT) {
        knn_tile_values<T, MODE, TM, TY, VEC, true>(Q, nq, d, X, q0, row0, row0 == r_begin, r_end, xaux, qa, p, Qs,
                                                    Xs, Ds, Tv, Fl, tid);
        // selection: warp w scans the queries w, w + 8, ...
        for (int qi = warp; qi < QT; qi += MPIML_KNN_THREADS / 32) {
            if (q0 + qi >= nq) break;
            if (!Fl[qi]) continue;  // no value of this tile reaches the query's k-th
            T* lv = Lv + qi * k;
            int* li = Li + qi * k;
            T tv = lv[k - 1];  // the k-th entry, re-read only after an insertion
            int ti = li[k - 1];
#pragma unroll
            for (int cc = 0; cc < NT / 32; ++cc) {
                const int col = cc * 32 + lane;
                const int j = row0 + col;
                const T v = Ds[qi * NT + col];
                const bool pass = j < r_end && knn_before(v, j, tv, ti);
                unsigned mask = __ballot_sync(MPIML_KNN_FULL, pass);
                if (mask) {
                    do {
                        const int src = __ffs(mask) - 1;
                        mask &= mask - 1;
                        const T cv = __shfl_sync(MPIML_KNN_FULL, v, src);
                        const int cj = __shfl_sync(MPIML_KNN_FULL, j, src);
                        knn_insert(lv, li, k, cv, cj, lane);
                    } while (mask);
                    tv = lv[k - 1];
                    ti = li[k - 1];
                }
            }
            __syncwarp();
            if (lane == 0) {
                Tv[qi] = tv;
                Fl[qi] = 0;
            }
        }
    }
    __syncthreads();
    for (int qi = warp; qi < QT; qi += MPIML_KNN_THREADS / 32) {
        const int q = q0 + qi;
        if (q >= nq) break;
        const long long base = ((long long)q * n_splits + split) * k;
        for (int i = lane; i < k; i += 32) {
            out_v[base + i] = Lv[qi * k + i];
            out_i[base + i] = Li[qi * k + i];
        }
    }
}

// Pairs within a bound: the same tiles as mpiml_knn_select, then each warp scans its queries'
// rows for values <= bound.  FILL false: counts[q] += the query's pairs (a count pass); FILL
// true: the pairs of query q go to cols / vals at indptr[q] + (a slot taken from cursor[q]), in no
// particular order (the caller sorts).  Grid: query tiles x index splits.
template <typename T, int MODE, int TM, int TY, bool VEC, bool FILL>
__global__ void __launch_bounds__(MPIML_KNN_THREADS)
mpiml_knn_radius(const T* __restrict__ Q, int nq, int d, const T* __restrict__ X, int m,
                 const T* __restrict__ qaux, const T* __restrict__ xaux, T p, T bound, int split_rows,
                 unsigned long long* __restrict__ counts, const long long* __restrict__ indptr,
                 unsigned long long* __restrict__ cursor, long long* __restrict__ cols, T* __restrict__ vals) {
    constexpr int NT = MPIML_KNN_NT, DK = MPIML_KNN_DK;
    constexpr int TX = MPIML_KNN_THREADS / TY;
    constexpr int QT = TM * TY;
    static_assert(QT % 8 == 0, "every warp owns the same number of queries");
    constexpr int QTP = QT + 4, NTP = NT + 4;
    extern __shared__ __align__(16) unsigned char knn_smem[];
    T* Qs = reinterpret_cast<T*>(knn_smem);
    T* Xs = Qs + DK * QTP;
    T* Ds = Xs + DK * NTP;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ty = tid / TX;
    const int q0 = blockIdx.x * QT;
    const int r_begin = blockIdx.y * split_rows;
    const int r_end = min(m, r_begin + split_rows);
    T qa[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int q = q0 + ty * TM + i;
        qa[i] = (MODE <= 1 && q < nq) ? qaux[q] : T(0);
    }
    unsigned long long found[QT / 8];  // the pairs of this warp's queries (count pass; lane 0)
#pragma unroll
    for (int t = 0; t < QT / 8; ++t) found[t] = 0;
    for (int row0 = r_begin; row0 < r_end; row0 += NT) {
        knn_tile_values<T, MODE, TM, TY, VEC, false>(Q, nq, d, X, q0, row0, row0 == r_begin, r_end, xaux, qa, p, Qs,
                                                     Xs, Ds, nullptr, nullptr, tid);
#pragma unroll
        for (int t = 0; t < QT / 8; ++t) {
            const int qi = warp + 8 * t;
            const int q = q0 + qi;
            if (q >= nq) break;
#pragma unroll
            for (int cc = 0; cc < NT / 32; ++cc) {
                const int j = row0 + cc * 32 + lane;
                const T v = Ds[qi * NT + cc * 32 + lane];
                const bool in = j < r_end && v <= bound;
                const unsigned mask = __ballot_sync(MPIML_KNN_FULL, in);
                if (!mask) continue;
                if constexpr (FILL) {
                    unsigned long long base = 0;
                    if (lane == 0) base = atomicAdd(cursor + q, (unsigned long long)__popc(mask));
                    base = __shfl_sync(MPIML_KNN_FULL, base, 0);
                    if (in) {
                        const long long at = indptr[q] + (long long)base + __popc(mask & ((1u << lane) - 1u));
                        cols[at] = j;
                        vals[at] = v;
                    }
                } else {
                    found[t] += __popc(mask);
                }
            }
        }
    }
    if constexpr (!FILL) {
#pragma unroll
        for (int t = 0; t < QT / 8; ++t) {
            const int q = q0 + warp + 8 * t;
            if (q < nq && lane == 0 && found[t]) atomicAdd(counts + q, found[t]);
        }
    }
}

// The k first of the splits' sorted lists of every query, by (value, row): entry i of list s is
// at rank i + (entries of the other lists before it); rows of different splits differ, so ranks
// are distinct for every real entry, and empty slots rank at k or later.
template <typename T>
__global__ void __launch_bounds__(MPIML_KNN_THREADS)
mpiml_knn_merge(const T* __restrict__ pv, const int* __restrict__ pi, int nq, int n_splits, int k,
                T* __restrict__ out_v, long long* __restrict__ out_i) {
    const long long per_q = (long long)n_splits * k;
    const long long total = (long long)nq * per_q;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const int j = pi[t];
        if (j == MPIML_KNN_NONE) continue;
        const T v = pv[t];
        const long long q = t / per_q;
        const int s = (int)((t % per_q) / k), i = (int)(t % k);
        long long rank = i;
        for (int s2 = 0; s2 < n_splits && rank < k; ++s2) {
            if (s2 == s) continue;
            const long long base = q * per_q + (long long)s2 * k;
            int lo = 0, hi = k;
            while (lo < hi) {
                const int mid = (lo + hi) >> 1;
                if (knn_before(pv[base + mid], pi[base + mid], v, j)) lo = mid + 1; else hi = mid;
            }
            rank += lo;
        }
        if (rank < k) {
            out_v[q * k + rank] = v;
            out_i[q * k + rank] = j;
        }
    }
}

// Per-row terms of the epilogue, one thread a row summing the dimensions in order, so that a
// row's value does not depend on how many rows are computed with it.  MODE 0: squared norm;
// MODE 1: inverse norm (0 for a zero row).
template <typename T, int MODE>
__global__ void __launch_bounds__(MPIML_KNN_THREADS)
mpiml_knn_norms(const T* __restrict__ A, int n, int d, T* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < n; r += stride) {
        const T* a = A + r * d;
        T s = T(0);
        for (int c = 0; c < d; ++c) s = knn_fma(a[c], a[c], s);
        if (MODE == 1) s = s > T(0) ? T(1) / knn_sqrt(s) : T(0);
        out[r] = s;
    }
}

// Squared distances of each query to its selected rows from the differences (no cancellation),
// one warp a (query, row) pair: lanes take dimensions lane, lane + 32, ... and a fixed shuffle
// tree adds them, so a pair's value does not depend on the batch it is computed in.
template <typename T>
__global__ void __launch_bounds__(MPIML_KNN_THREADS)
mpiml_knn_exact_sq(const T* __restrict__ Q, const T* __restrict__ X, int d, const long long* __restrict__ idx,
                   int nq, int k, T* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const long long pairs = (long long)nq * k;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long t = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5); t < pairs; t += warps) {
        const T* q = Q + (t / k) * d;
        const T* x = X + idx[t] * d;
        T s = T(0);
        for (int c = lane; c < d; c += 32) {
            const T diff = x[c] - q[c];
            s = knn_fma(diff, diff, s);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(MPIML_KNN_FULL, s, off);
        if (lane == 0) out[t] = s;
    }
}

// The selection over a materialised tile (the GEMM route of topk for the GEMM-form metrics at large d):
// S holds the dot products of a batch of queries (rows) with a chunk of index rows (columns, ld = lds),
// computed by cuBLAS with fixed shapes.  Block (b, s) holds MPIML_KNN_TS_WARPS warps, warp w the query
// q = b * WARPS + w and split s of the chunk's columns [s * split_cols, (s + 1) * split_cols) below cols;
// column c is index row row0 + c.  The query's running list of split s (pv / pi at (q * splits + s) * k,
// sorted by (value, row), (+inf, NONE) when empty) is read into shared memory, the split's columns are
// scanned as in mpiml_knn_select (the epilogue knn_value<MODE> of each dot product, one compare against
// the list's k-th entry, a ballot, warp-cooperative insertions) and the list is written back, so it runs
// across the chunks of the index; mpiml_knn_merge ranks the splits' lists at the end.  Warps never wait
// for each other (no block barrier): a warp past the batch's queries returns at once.
#define MPIML_KNN_TS_WARPS 4
template <typename T, int MODE>
__global__ void __launch_bounds__(MPIML_KNN_TS_WARPS * 32)
mpiml_knn_tile_select(const T* __restrict__ S, int lds, int nq, int cols, int row0, int split_cols,
                      const T* __restrict__ qaux, const T* __restrict__ xaux, int k,
                      T* __restrict__ pv, int* __restrict__ pi) {
    constexpr int U = 4;  // loads of 32 columns in flight per lane
    extern __shared__ __align__(16) unsigned char knn_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q = blockIdx.x * MPIML_KNN_TS_WARPS + warp;
    if (q >= nq) return;
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int c_begin = split * split_cols;
    const int c_end = min(cols, c_begin + split_cols);
    if (c_begin >= c_end) return;
    T* lv = reinterpret_cast<T*>(knn_smem) + warp * k;
    int* li = reinterpret_cast<int*>(reinterpret_cast<T*>(knn_smem) + MPIML_KNN_TS_WARPS * k) + warp * k;
    const long long base = ((long long)q * n_splits + split) * k;
    for (int i = lane; i < k; i += 32) {
        lv[i] = pv[base + i];
        li[i] = pi[base + i];
    }
    __syncwarp();
    T tv = lv[k - 1];
    int ti = li[k - 1];
    const T qa = MODE <= 1 ? qaux[q] : T(0);
    const T* __restrict__ srow = S + (long long)q * lds;
    for (int c0 = c_begin; c0 < c_end; c0 += 32 * U) {
        T v[U];
        bool pass[U];
        bool any = false;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u + lane;
            const bool in = c < c_end;
            const T s = in ? srow[c] : T(0);
            const T xa = (MODE <= 1 && in) ? xaux[row0 + c] : T(0);
            v[u] = knn_value<MODE>(s, qa, xa, T(1));
            pass[u] = in && knn_before(v[u], row0 + c, tv, ti);
            any |= pass[u];
        }
        if (!__any_sync(MPIML_KNN_FULL, any)) continue;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            unsigned mask = __ballot_sync(MPIML_KNN_FULL, pass[u]);
            while (mask) {
                const int src = __ffs(mask) - 1;
                mask &= mask - 1;
                const T cv = __shfl_sync(MPIML_KNN_FULL, v[u], src);
                const int cj = row0 + c0 + 32 * u + src;
                knn_insert(lv, li, k, cv, cj, lane);  // re-checks against the current k-th entry
            }
        }
        tv = lv[k - 1];
        ti = li[k - 1];
    }
    __syncwarp();
    for (int i = lane; i < k; i += 32) {
        pv[base + i] = lv[i];
        pi[base + i] = li[i];
    }
}
