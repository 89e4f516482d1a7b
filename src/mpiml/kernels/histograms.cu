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
