// Per-node histograms of binned rows for tree growing (mpiml.ensemble): exact integer sums.
//
// The rows of a level are held as "elements" grouped by node (slot): element e is row elem_row[e]
// with the fixed-point weight elem_w[e] (an integer held in a double) and, for regression,
// elem_wy[e] (weight * y, fixed point).  A work item is (slot, first feature of a tile, element
// range); one block per item sums its elements into a histogram tile
// (tile features x bins x channels) privatised in shared memory with atomics, then adds the
// non-zero entries to the global histogram (slot, FH, B, C) with 64-bit atomics.
//
// Channels: D (0 or 1) leading row count, then K class weights (classification, CLS) or
// [weight, weight * y] (regression).
//
// Sums are integers, so they are exact and independent of the order of the atomics: the same
// histogram as the NumPy path on every run and every rank count.  WIDE accumulators are two 32-bit
// words per entry (low word with carry into the high word): exact for any int64 sum.  Narrow ones
// are one 32-bit word, used by the caller only when every value is a non-negative integer and
// no entry of one block can reach 2^32.

#define MPIML_HIST_THREADS 256

template <bool WIDE>
__device__ __forceinline__ void mpiml_hist_add(unsigned int* acc, int i, long long v) {
    if (WIDE) {
        const unsigned long long u = (unsigned long long)v;
        const unsigned int lo = (unsigned int)u;
        const unsigned int hi = (unsigned int)(u >> 32);
        const unsigned int old = atomicAdd(acc + 2 * i, lo);
        const unsigned int carry = (old + lo < old) ? 1u : 0u;   // this add wrapped the low word
        if (hi + carry) atomicAdd(acc + 2 * i + 1, hi + carry);
    } else {
        atomicAdd(acc + i, (unsigned int)v);
    }
}

template <bool CLS, int D, bool WIDE>
__global__ void __launch_bounds__(MPIML_HIST_THREADS)
mpiml_hist_build(const unsigned char* __restrict__ Xb, const long long n_features,
                 const int* __restrict__ elem_row, const double* __restrict__ elem_w,
                 const double* __restrict__ elem_wy, const int* __restrict__ y,
                 const int* __restrict__ fsel, const int FH,
                 const int* __restrict__ items, const int tile_features, const int B, const int K,
                 unsigned long long* __restrict__ hist) {
    const int C = D + (CLS ? K : 2);
    extern __shared__ unsigned int acc[];
    const int* it = items + 4 * (long long)blockIdx.x;
    const int slot = it[0], f0 = it[1], e0 = it[2], e1 = it[3];
    const int nf = min(tile_features, FH - f0);
    const int entries = nf * B * C;
    const int words = WIDE ? 2 * entries : entries;
    for (int i = threadIdx.x; i < words; i += blockDim.x) acc[i] = 0u;
    __syncthreads();

    const int* fs = fsel + (long long)slot * FH + f0;
    const long long pairs = (long long)(e1 - e0) * nf;
    for (long long p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int e = e0 + (int)(p / nf);
        const int j = (int)(p % nf);
        const long long r = elem_row[e];
        const int b = Xb[r * n_features + fs[j]];
        const int base = (j * B + b) * C;
        if (D) mpiml_hist_add<WIDE>(acc, base, 1);
        const long long w = __double2ll_rn(elem_w[e]);
        if (CLS) {
            mpiml_hist_add<WIDE>(acc, base + D + y[r], w);
        } else {
            mpiml_hist_add<WIDE>(acc, base + D, w);
            mpiml_hist_add<WIDE>(acc, base + D + 1, __double2ll_rn(elem_wy[e]));
        }
    }
    __syncthreads();

    unsigned long long* out = hist + ((long long)slot * FH + f0) * B * C;
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
        unsigned long long v;
        if (WIDE) v = ((unsigned long long)acc[2 * i + 1] << 32) | acc[2 * i];
        else v = acc[i];
        if (v) atomicAdd(out + i, v);
    }
}

// Regression with integer weights whose sums fit 32 bits (the bootstrap's draw counts): the weight
// channel narrow, weight * y wide.  Shared memory per bin: [rows (D)], w, wy low word, wy high word
// (D + 3 words instead of 2 D + 4): a tile holds a third more features, so an element's row is read by
// fewer blocks.  Output as mpiml_hist_build<false, D, *>: (slot, FH, B, D + 2) int64.
template <int D>
__global__ void __launch_bounds__(MPIML_HIST_THREADS)
mpiml_hist_build_reg(const unsigned char* __restrict__ Xb, const long long n_features,
                     const int* __restrict__ elem_row, const double* __restrict__ elem_w,
                     const double* __restrict__ elem_wy, const int* __restrict__ y,
                     const int* __restrict__ fsel, const int FH,
                     const int* __restrict__ items, const int tile_features, const int B, const int K,
                     unsigned long long* __restrict__ hist) {
    const int C = D + 2;
    const int WB = D + 3;                         // words per bin
    extern __shared__ unsigned int acc[];
    const int* it = items + 4 * (long long)blockIdx.x;
    const int slot = it[0], f0 = it[1], e0 = it[2], e1 = it[3];
    const int nf = min(tile_features, FH - f0);
    const int entries = nf * B;                   // bins of the tile
    for (int i = threadIdx.x; i < entries * WB; i += blockDim.x) acc[i] = 0u;
    __syncthreads();

    const int* fs = fsel + (long long)slot * FH + f0;
    const long long pairs = (long long)(e1 - e0) * nf;
    for (long long p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int e = e0 + (int)(p / nf);
        const int j = (int)(p % nf);
        const long long r = elem_row[e];
        const int b = Xb[r * n_features + fs[j]];
        unsigned int* a = acc + (j * B + b) * WB;
        if (D) atomicAdd(a, 1u);
        atomicAdd(a + D, (unsigned int)__double2ll_rn(elem_w[e]));
        mpiml_hist_add<true>(a + D + 1, 0, __double2ll_rn(elem_wy[e]));
    }
    __syncthreads();

    unsigned long long* out = hist + ((long long)slot * FH + f0) * B * C;
    for (int i = threadIdx.x; i < entries; i += blockDim.x) {
        const unsigned int* a = acc + i * WB;
        if (D && a[0]) atomicAdd(out + (long long)i * C, (unsigned long long)a[0]);
        if (a[D]) atomicAdd(out + (long long)i * C + D, (unsigned long long)a[D]);
        const unsigned long long v = ((unsigned long long)a[D + 2] << 32) | a[D + 1];
        if (v) atomicAdd(out + (long long)i * C + D + 1, v);
    }
}

// Row partition of a level (stable, all trees at once), in two passes around one prefix sum.
//
// code[slot] is -1 for a leaf, else feature * 256 + bin: an element goes left when its row's bin of
// that feature is <= bin.  Pass 1 writes flags[e] = 0 (dropped: its node is a leaf), 1 (left) or
// 2^32 (right); an inclusive prefix sum of the flags counts lefts in the low and rights in the high
// 32 bits.  Pass 2 moves every kept element to its child's segment: children 2 r (left) and 2 r + 1
// (right) of the r-th split node, each segment in the elements' previous order.
__global__ void mpiml_hist_route(const int* __restrict__ seg, const int* __restrict__ row,
                                 const int* __restrict__ code, const unsigned char* __restrict__ Xb,
                                 const long long n_features, const long long n,
                                 long long* __restrict__ flags) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const int c = code[seg[e]];
    long long f = 0;
    if (c >= 0) {
        const int b = Xb[(long long)row[e] * n_features + (c >> 8)];
        f = (b <= (c & 255)) ? 1LL : (1LL << 32);
    }
    flags[e] = f;
}

template <bool REG>
__global__ void mpiml_hist_move(const long long n, const int* __restrict__ seg,
                                const long long* __restrict__ flags, const long long* __restrict__ csum,
                                const long long* __restrict__ base_l, const long long* __restrict__ base_r,
                                const int* __restrict__ rank,
                                const int* __restrict__ row, const double* __restrict__ w,
                                const double* __restrict__ wy, const double* __restrict__ wy2,
                                int* __restrict__ out_row, int* __restrict__ out_seg, double* __restrict__ out_w,
                                double* __restrict__ out_wy, double* __restrict__ out_wy2) {
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    const long long f = flags[e];
    if (f == 0) return;
    const long long before = csum[e] - f;                 // exclusive: lefts low, rights high
    const int s = seg[e];
    long long pos;
    int side;
    if (f == 1) { pos = base_l[s] + (before & 0xffffffffLL); side = 0; }
    else        { pos = base_r[s] + (before >> 32); side = 1; }
    out_row[pos] = row[e];
    out_seg[pos] = 2 * rank[s] + side;
    out_w[pos] = w[e];
    if (REG) { out_wy[pos] = wy[e]; out_wy2[pos] = wy2[e]; }
}

// Split search of a level (forests): the best bin of every (node, candidate feature) pair.
//
// One warp per pair (node s, candidate j) reads the reduced histogram of feature fpos[s, j]
// (H is (S, FH, B, C) doubles holding exact integers), 32 bins at a time (coalesced loads), and
// forms the channel prefix sums by a warp scan plus the carry of the bins before: integer sums below
// 2^53, so they are exact in any order and equal the sequential ones.  Only non-empty bins are
// candidates.  The score of a bin depends on its prefix sums alone and is evaluated with the same IEEE
// operations, in the same order, as the array search of mpiml.ensemble._split (explicitly rounded
// intrinsics: no contraction into fused multiply-adds), so every path chooses the same splits:
//   CLS (gini): sum_c (l_c / sw)^2 / W_L + sum_c (r_c / sw)^2 / W_R, sums over classes left to right;
//   regression: (S_L / sy)^2 / W_L + (S_R / sy)^2 / W_R.
// A split is valid with weight on both sides, at least msl rows on each (with the row channel, D = 1)
// and at least mwl[s] weight on each (has_mwl).  The best is the largest score, ties to the lowest bin
// (a warp reduction over (score, bin)), as a sequential scan keeping strictly larger scores.  Outputs
// per pair: the best score (-inf and bin 0 without a valid split), its bin, its left weight, the
// nearest non-empty bins at or below / above it (-1 / B when none) and the number of non-empty bins.
#define MPIML_HIST_SPLIT_MAX_C 8
#define MPIML_FULL_WARP 0xffffffffu

template <bool CLS>
__global__ void __launch_bounds__(MPIML_HIST_THREADS)
mpiml_hist_split(const double* __restrict__ H, const long long FH, const int B, const int C,
                 const long long* __restrict__ fpos, const int m, const long long S,
                 const double* __restrict__ tot, const double* __restrict__ mwl, const int has_mwl,
                 const double sw, const double sy, const int D, const double msl,
                 double* __restrict__ o_val, long long* __restrict__ o_b, double* __restrict__ o_wl,
                 long long* __restrict__ o_below, long long* __restrict__ o_above, long long* __restrict__ o_occ) {
    const long long p = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;   // the same in a warp
    const int lane = threadIdx.x & 31;
    if (p >= S * m) return;
    const long long s = p / m;
    const double* h = H + (s * FH + fpos[p]) * (long long)B * C;
    const double* t = tot + s * C;
    const double lim = has_mwl ? mwl[s] : 0.0;
    const double neg_inf = -__longlong_as_double(0x7ff0000000000000LL);
    double carry[MPIML_HIST_SPLIT_MAX_C];
    for (int c = 0; c < C; ++c) carry[c] = 0.0;
    double best = neg_inf, best_wl = 0.0, wl0 = 0.0;
    int best_b = 0x7fffffff, occupied = 0, first_after0 = B;
    bool bin0 = false;
    for (int base = 0; base < B; base += 32) {
        const int b = base + lane;
        const bool in = b < B;
        double cum[MPIML_HIST_SPLIT_MAX_C];
        for (int c = 0; c < C; ++c) cum[c] = in ? h[(long long)b * C + c] : 0.0;
        bool occ = false;
        if (D || !CLS) {
            occ = cum[0] > 0.0;
        } else {
            for (int c = 0; c < C; ++c) occ = occ || (cum[c] > 0.0);
        }
        for (int c = 0; c < C; ++c) {             // inclusive scan over the lanes, then the carry
            double x = cum[c];
            for (int o = 1; o < 32; o <<= 1) {
                const double y = __shfl_up_sync(MPIML_FULL_WARP, x, o);
                if (lane >= o) x = __dadd_rn(x, y);
            }
            cum[c] = __dadd_rn(carry[c], x);
            carry[c] = __shfl_sync(MPIML_FULL_WARP, cum[c], 31);
        }
        const unsigned ballot = __ballot_sync(MPIML_FULL_WARP, occ);
        occupied += __popc(ballot);
        if (base == 0) {
            bin0 = (ballot & 1u) != 0u;
            if (ballot & ~1u) first_after0 = __ffs(ballot & ~1u) - 1;
        } else if (first_after0 == B && ballot) {
            first_after0 = base + __ffs(ballot) - 1;
        }
        if (!occ) continue;
        double WL, WR, proxy;
        if (CLS) {
            double sl = 0.0, sr = 0.0;
            WL = 0.0;
            WR = 0.0;
            for (int c = D; c < C; ++c) {
                const double lw = __ddiv_rn(cum[c], sw);
                const double rw = __ddiv_rn(__dsub_rn(t[c], cum[c]), sw);
                WL = __dadd_rn(WL, lw);
                WR = __dadd_rn(WR, rw);
                sl = __dadd_rn(sl, __dmul_rn(lw, lw));
                sr = __dadd_rn(sr, __dmul_rn(rw, rw));
            }
            proxy = __dadd_rn(__ddiv_rn(sl, WL > 0.0 ? WL : 1.0), __ddiv_rn(sr, WR > 0.0 ? WR : 1.0));
        } else {
            WL = __ddiv_rn(cum[D], sw);
            WR = __ddiv_rn(__dsub_rn(t[D], cum[D]), sw);
            const double SL = __ddiv_rn(cum[D + 1], sy);
            const double SR = __ddiv_rn(__dsub_rn(t[D + 1], cum[D + 1]), sy);
            proxy = __dadd_rn(__ddiv_rn(__dmul_rn(SL, SL), WL > 0.0 ? WL : 1.0),
                              __ddiv_rn(__dmul_rn(SR, SR), WR > 0.0 ? WR : 1.0));
        }
        if (b == 0) wl0 = WL;
        bool valid = WL > 0.0 && WR > 0.0;
        if (D) valid = valid && cum[0] >= msl && __dsub_rn(t[0], cum[0]) >= msl;
        if (has_mwl) valid = valid && WL >= lim && WR >= lim;
        if (valid && proxy > best) {              // a lane's bins rise: the first of equal scores stays
            best = proxy;
            best_b = b;
            best_wl = WL;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {           // the largest score, ties to the lowest bin
        const double ob = __shfl_xor_sync(MPIML_FULL_WARP, best, o);
        const int obb = __shfl_xor_sync(MPIML_FULL_WARP, best_b, o);
        const double owl = __shfl_xor_sync(MPIML_FULL_WARP, best_wl, o);
        if (ob > best || (ob == best && obb < best_b)) {
            best = ob;
            best_b = obb;
            best_wl = owl;
        }
    }
    wl0 = __shfl_sync(MPIML_FULL_WARP, wl0, 0);
    int below, above = B;
    if (best > neg_inf) {
        below = best_b;
        for (int base = ((best_b + 1) >> 5) << 5; base < B; base += 32) {   // the first non-empty bin after it
            const int b = base + lane;
            bool occ = false;
            if (b < B && b > best_b) {
                const double* hb = h + (long long)b * C;
                if (D || !CLS) {
                    occ = hb[0] > 0.0;
                } else {
                    for (int c = 0; c < C; ++c) occ = occ || (hb[c] > 0.0);
                }
            }
            const unsigned bal = __ballot_sync(MPIML_FULL_WARP, occ);
            if (bal) {
                above = base + __ffs(bal) - 1;
                break;
            }
        }
    } else {                                      // no valid split: bin 0, as an argmax over -inf
        best_b = 0;
        best_wl = wl0;
        below = bin0 ? 0 : -1;
        above = first_after0;
    }
    if (lane == 0) {
        o_val[p] = best;
        o_b[p] = best_b;
        o_wl[p] = best_wl;
        o_below[p] = below;
        o_above[p] = above;
        o_occ[p] = occupied;
    }
}
