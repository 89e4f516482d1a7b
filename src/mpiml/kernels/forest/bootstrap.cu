// The bootstrap counts of one tree on this rank's rows (mpiml.ensemble._bootstrap), in one kernel.
//
// The global rows are cut into blocks of S rows; a tree's draws are numbered block after block
// (first[j] .. first[j + 1] - 1 for the j-th block from b0).  Draw k of block b lands on the global weight
// v = base_b + min(floor(u_k Q_b), Q_b - 1), u_k = the counter-based uniform of (tree, k) (the
// splitmix64 finaliser twice over k * C_B + head, the top 53 bits); unweighted, v is the global row
// itself; weighted, the row whose interval of cumulated weights holds v (cum[i]: the global weight at
// the end of local row i; a binary search among the block's local rows).  One CUDA block per
// bootstrap block counts its draws that land on local rows in shared memory (32-bit counters, one per
// row of the block) and writes the block's local rows' counts (as doubles: exact integers), so every
// local row is written once, without a global atomic.  Every value is an integer below 2^53 held in a
// double, with explicitly rounded operations: the counts equal those of the array path (NumPy or CuPy)
// bit for bit.

#define MPIML_BOOT_THREADS 256

__device__ __forceinline__ unsigned long long mpiml_boot_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

template <bool WEIGHTED>
__global__ void __launch_bounds__(MPIML_BOOT_THREADS)
mpiml_boot_counts(const unsigned long long head, const long long* __restrict__ first,
                  const double* __restrict__ Q, const double* __restrict__ base,
                  const long long b0, const long long S, const long long g0, const long long n,
                  const double* __restrict__ cum, const double c_lo, const double c_hi,
                  double* __restrict__ out) {
    extern __shared__ unsigned int mpiml_boot_cnt[];
    const long long j = blockIdx.x;
    const long long b = b0 + j;
    const long long lo = (b * S > g0 ? b * S : g0) - g0;                       // the block's local rows [lo, hi)
    const long long hi = ((b + 1) * S < g0 + n ? (b + 1) * S : g0 + n) - g0;
    const int L = (int)(hi - lo);
    for (int i = threadIdx.x; i < L; i += blockDim.x) mpiml_boot_cnt[i] = 0u;
    __syncthreads();
    const long long k0 = first[j], k1 = first[j + 1];
    const double Qb = Q[j], Bb = base[j];
    const double top = __dsub_rn(Qb, 1.0);
    for (long long k = k0 + threadIdx.x; k < k1; k += blockDim.x) {
        unsigned long long z = (unsigned long long)k * 0x94D049BB133111EBULL + head;
        z = mpiml_boot_mix(mpiml_boot_mix(z));
        const double u = __dmul_rn((double)(z >> 11), 1.0 / 9007199254740992.0);
        const double t = floor(__dmul_rn(u, Qb));
        const double v = __dadd_rn(Bb, t < top ? t : top);
        long long r;
        if (WEIGHTED) {
            if (!(v >= c_lo && v < c_hi)) continue;
            long long a = lo, e = hi;                   // the first local row whose cumulated weight passes v
            while (a < e) {
                const long long mid = (a + e) >> 1;
                if (cum[mid] > v) e = mid;
                else a = mid + 1;
            }
            r = a;
        } else {
            r = (long long)v - g0;
        }
        if (r >= lo && r < hi) atomicAdd(mpiml_boot_cnt + (r - lo), 1u);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L; i += blockDim.x) out[lo + i] = (double)mpiml_boot_cnt[i];
}
