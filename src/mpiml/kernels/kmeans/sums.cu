// The sums passes of the tensor-core path: mpiml_distances_sums_tc, mpiml_distances_step_totals,
// mpiml_distances_sums_simt.
// Part of the k-means tensor-core program: the loader compiles tc_common.cuh, tc.cu, sums.cu, small.cu and
// small_tc.cu as one source, in that order (kmeans/_common.py TC_FILES); the family is described at the
// head of tc_common.cuh.

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
// an SM (kmeans/_tc.py sums_plan picks the three).  Warp w loads its RW consecutive rows of a tile into
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
