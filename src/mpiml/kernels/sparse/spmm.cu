// Products of a CSR matrix with skinny dense blocks (mpiml.kernels.sparse), bandwidth-bound, and the
// column moments the decompositions need (sparse and dense).
//
// Longer than 800 lines because the products, the transpose and its sort, the small factorisations and the
// column moments share the gather and reduction helpers and compile as one NVRTC program.
//
// A is CSR (n_rows x n_cols): int32 indptr (n_rows + 1), int32 indices and T values (nnz).  Dense
// blocks are row-major with a leading dimension (elements between consecutive rows), so a column
// slice of a wider C-order block is passed as a pointer and the wider block's ld.
//
// mpiml_csr_gather<T, Acc, Out, G, CPL>:  Y = A V,  V (n_cols x b), Y (n_rows x b).
//   A group of G lanes (8, 16 or 32; G divides 32) owns a row; lane g holds columns g, g + G, ...
//   (CPL of them, b <= G * CPL) in Acc registers.  The group loads G (index, value) pairs of the row
//   at once (coalesced), then for each pair broadcasts it by a shuffle and every lane reads its
//   columns of that row of V: one coalesced read of b values per stored value (V is typically
//   small enough to stay in L2; the reads of A stream from memory once).  Deterministic: the sum of
//   a row is in storage order.
//
// mpiml_csr_gather4<Out, L>:  Y = A V for float32 A and V with b <= 4 L columns (L = 2, 4 or 8), V's rows
//   16-byte aligned (ldv a multiple of 4 values; the caller pads V, whose padding columns are read but
//   never written out).  A warp owns a row: it loads 32 (index, value) pairs at once, then L steps each
//   take 32 / L of them, a group of L lanes a stored value, lane l reading columns 4l..4l+3 of that row
//   of V as one float4.  Every lane's L loads are issued before any is used: a warp keeps 32 rows of V
//   in flight (the scalar kernel above keeps 4) and one load instruction moves 4 rows' worth for 8
//   lanes a row.  Each lane sums in float64 the stored values it took (storage order), then the 32 / L
//   groups are added by a fixed butterfly: deterministic.  A row is [lo[row], hi[row]) (lo = indptr,
//   hi = indptr + 1 for the whole matrix, or a column piece of mpiml_csr_split), added to Y when
//   accumulate (the pieces of a product in a fixed order: still deterministic).
//
// mpiml_csr_scatter<T, Out, G, CPL>:  Y += Aᵀ U,  U (n_rows x b), Y (n_cols x b) zeroed by the caller.
//   A group of G lanes owns a row of A, holds that row of U in registers (read once, coalesced) and
//   adds value * u to the row of Y of every stored value with atomics (Out float or double).  No
//   transpose of A is needed; the order of the atomics is not fixed (float sums round differently
//   from run to run).
//
// mpiml_csr_rowdot<T, Acc, Out, G>:  y = A x (b = 1), G lanes share a row: lane g takes the stored
//   values g, g + G, ... of the row, multiplies by the gathered x and the group reduces with
//   shuffles.  Deterministic.
//
// mpiml_csr_scatter_vec<T, G>:  y += Aᵀ u (one vector, y double, zeroed by the caller): G lanes share a
//   row, lane g adds data[j] * u[row] for the stored values g, g + G, ... with atomics.  No transpose.
//
// mpiml_csr_normal_vec<T, G, W>:  the normal operator of the centred, weighted rows in one read of A:
//   t_i = w_i (a_i·p - c) (w_i = 1 unless W; c read from device memory), y += Σ_i t_i a_i (atomics),
//   ysum += Σ_i t_i (one atomic a block); then (A - 1mᵀ)ᵀ W (A - 1mᵀ) p = y - m ysum for c = m·p.
//   A row's values are read twice, the second time from cache.
//
// Column pieces (sparse Ridge's one-vector products, from shared memory instead of L2):
// mpiml_csr_split<T>:  for a CSR matrix whose rows have sorted indices, the row pointers of K column pieces
//   [cuts[k], cuts[k + 1]): ptr[k * n_rows + i] = start of row i + the count of its indices below cuts[k]
//   (k = 0..K, so piece k of row i is [ptr[k][i], ptr[k + 1][i])), a warp a row counting by ballots; the
//   count of rows whose indices decrease goes to *unsorted (then the pieces are meaningless).
// mpiml_csr_piece_dot<T, G>:  y[i] (+)= Σ_j data[j] x[indices[j]] over piece k of every row, x[lo, lo + width)
//   staged in shared memory first: the gathers hit shared memory, the matrix streams once.
// mpiml_csr_piece_scatter<T, G>:  y[lo + c] += Σ_i Σ_j data[j] u[i] over piece k (y double), accumulated per
//   block in shared memory (T) by shared atomics, then added to y with one global atomic a column a block.
//
// mpiml_csr_row_moments<T>:  per row of A, s1 = Σ values, s2 = Σ (value - shift[row])², in double, a
//   warp per row (for the column moments of X, run on the stored Xᵀ), and the count of rows whose
//   indices are not strictly increasing (unsorted or duplicated: then s2 is not the moment of the
//   matrix, whose duplicates add up before squaring).  Deterministic.
//
// mpiml_dense_col_moments<T>:  per column of a dense row-major X (n x d, leading dimension ld), the sum
//   and the sum of squares about shift[c], in double, one read of X.  A block owns rows_per_block
//   consecutive rows; its 256 threads form tc columns x (256 / tc) row lanes (tc a power of two, at
//   least 32: a warp reads a contiguous piece of a row), then sum the row lanes in shared memory and
//   write partial[block][0:d] (sums) and partial[block][d:2d] (squares).  Deterministic.
//
// The transpose of a CSR matrix (Aᵀ stored as CSR, what XᵀU gathers from), in three launches and a scan:
// mpiml_csr_col_counts:  counts[indices[j]] += 1 over every stored value (atomics; exact counts).  The caller
//   scans them into Aᵀ's row pointers and copies those into a cursor per column.
// mpiml_csr_transpose_fill<T>:  a warp a row of A; each stored value takes the next place of its column by an
//   atomic on the cursor and writes (row, value) there: Aᵀ's rows hold the right entries in an order that
//   depends on scheduling.
// mpiml_csr_sort_runs<T, W>:  a block a row of Aᵀ sorts it by index in shared memory: words (index << pbits) |
//   place (W: 32 bits when they fit, else 64; place < 2^pbits = p_max) by a bitonic sort of the row padded to a
//   power of two P <= p_max (pads all ones), then each index is written with the value from its place: Aᵀ's
//   rows hold their indices in increasing order, as cuSPARSE's conversion leaves them, whatever the fill's
//   order (deterministic when A has no duplicate entries; duplicates are ordered by where the fill put them).
//   Meanwhile, per row, s1 = Σ values and s2 = Σ (value - s1 / m)² over its m stored values (double, a fixed
//   order), and the count of rows with a repeated index (duplicates) to *unsorted: the column moments of A.
//   A row longer than p_max is left in the fill's order (its moments summed in that order) and counted too.
//
// mpiml_small_cholinv:  the l x l algebra of a CholeskyQR round on the device (l <= 64, one block of 128 threads,
//   no read back): for a symmetric G (double, row-major), R = Lᵀ with G = L Lᵀ and Rinv = R⁻¹ (row-major,
//   upper triangular).  *flag |= 1 when G is not positive definite (a pivot not above zero, or not finite:
//   that pivot is set to 1 and the factorisation goes on), |= 2 when ‖R‖_F ‖R⁻¹‖_F > max_cond (an upper bound
//   of cond(R), above it by at most a factor l; max_cond <= 0: no check).  The caller reads flag once, later,
//   and redoes the work another way when it is set.
//
// mpiml_csr_scatter4<L>:  Y += Aᵀ U for float32 A, U with rows of 4 L floats (16-byte aligned, ldu4 float4s
//   apart), Y float32 (n_cols x 4 L, zeroed by the caller): a warp a row of A, lane l of each group of L holds
//   float4 l of the row of U; a group takes one stored value at a time and adds value * u to that row of Y by
//   float4 atomics (sm_90; four float atomics before).  float32 sums in an order that depends on scheduling.
//
// mpiml_small_svd:  the SVD R = U diag(s) Vt of a square l x l double R (row-major, l <= 64) by one-sided Jacobi
//   on its columns, one block of 1024 threads (a warp a pair of columns; the pairs of a round by the circle
//   method, disjoint), sweeps until no pair's cosine exceeds 1e-15 (*flag |= 4 if 60 sweeps do not get there);
//   s descending, U (row-major, its columns in that order) and Vt (its rows).  Dynamic shared memory: 2 l² doubles.
//
// mpiml_csr_col_counts_smem:  the same counts by windows of w columns counted in shared memory (w ints of
//   dynamic shared memory): a block takes a contiguous range of the stored values and, window by window,
//   counts its indices there by shared atomics, then adds its nonzero counts to counts[] (global atomics: a
//   window's columns a block instead of one a stored value).  The indices are read once a window.
//
// The transpose's counts and fill with no global atomics (MPIML_SPARSE_TRANSPOSE_COUNTS=blocks): block b owns the
// rows [b R, (b + 1) R) and goes through the columns by windows of w (w ints of dynamic shared memory):
// mpiml_csr_block_counts:  counts its rows' indices of the window by shared atomics and writes every count of the
//   window to bc[b][c] (zeros too).
// mpiml_csr_block_scan:  a thread a column: bc[b][c] becomes the count of column c in the blocks before b (an
//   exclusive scan down the blocks) and total[c] the column's count.
// mpiml_csr_block_fill<T>:  the window's cursors start at ptr[c] + bc[b][c]; a warp a row of the block's rows puts
//   each stored value of the window at the place its column's cursor gives (a shared atomic).  The places of a
//   block's values within a column depend on scheduling: the sort orders them.

#ifndef MPIML_SPARSE_THREADS
#define MPIML_SPARSE_THREADS 256
#endif

template <int G>
__device__ __forceinline__ unsigned mpiml_group_mask() {
    if (G == 32) return 0xffffffffu;
    const int lane = threadIdx.x & 31;
    return ((1u << G) - 1u) << (lane & ~(G - 1));
}

// The rows of A by groups of G lanes (gather and scatter): this lane's place g in its group, the group's first row
// and the grid's stride over the rows.
template <int G>
struct MpimlRowGroups {
    static_assert(32 % G == 0 && G % 4 == 0, "G must divide 32 and be a multiple of 4");
    const unsigned mask = mpiml_group_mask<G>();
    const int g = threadIdx.x & (G - 1);
    const long long first = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / G;
    const long long stride = (long long)gridDim.x * (MPIML_SPARSE_THREADS / G);
};

// Stored value j of a row that ends at end, as (index, value); (0, 0) past the end: a group's coalesced load.
template <typename T>
__device__ __forceinline__ void mpiml_stored_pair(const int* __restrict__ indices, const T* __restrict__ data,
                                                  const int j, const int end, int& col, T& val) {
    col = 0;
    val = T(0);
    if (j < end) {
        col = __ldg(indices + j);
        val = __ldg(data + j);
    }
}

template <typename T, typename Acc, typename Out, int G, int CPL>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_gather(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                 const long long n_rows, const T* __restrict__ V, const long long ldv, const int b,
                 Out* __restrict__ Y, const long long ldy) {
    const MpimlRowGroups<G> rg;
    const unsigned mask = rg.mask;
    const int g = rg.g;
    for (long long row = rg.first; row < n_rows; row += rg.stride) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        Acc acc[CPL];
#pragma unroll
        for (int q = 0; q < CPL; ++q) acc[q] = Acc(0);
        for (int base = start; base < end; base += G) {
            int col;
            T val;
            mpiml_stored_pair(indices, data, base + g, end, col, val);
            const int cnt = min(G, end - base);
            for (int k = 0; k < cnt; k += 4) {
                T x[4][CPL];
                T w[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int c = __shfl_sync(mask, col, k + u, G);
                    w[u] = __shfl_sync(mask, val, k + u, G);
                    const T* vr = V + (long long)c * ldv;
#pragma unroll
                    for (int q = 0; q < CPL; ++q) {
                        const int cc = g + q * G;
                        x[u][q] = (k + u < cnt && cc < b) ? __ldg(vr + cc) : T(0);
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    if (k + u < cnt) {
#pragma unroll
                        for (int q = 0; q < CPL; ++q) acc[q] += Acc(w[u]) * Acc(x[u][q]);
                    }
                }
            }
        }
        Out* yr = Y + row * ldy;
#pragma unroll
        for (int q = 0; q < CPL; ++q) {
            const int cc = g + q * G;
            if (cc < b) yr[cc] = Out(acc[q]);
        }
    }
}

template <typename Out, int L>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_gather4(const int* __restrict__ lo, const int* __restrict__ hi, const int* __restrict__ indices,
                  const float* __restrict__ data, const long long n_rows, const float4* __restrict__ V,
                  const long long ldv4, const int b, Out* __restrict__ Y, const long long ldy, const int accumulate) {
    static_assert(L == 2 || L == 4 || L == 8, "L must be 2, 4 or 8");
    constexpr int S = 32 / L;                   // stored values a step (one per group of L lanes)
    const int lane = threadIdx.x & 31;
    const int l = lane & (L - 1);               // this lane's float4 of a row of V: columns 4l..4l+3
    const int s = lane / L;                     // this lane's group
    const bool active = 4 * l < b;
    const long long warps = (long long)gridDim.x * (MPIML_SPARSE_THREADS / 32);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / 32; row < n_rows;
         row += warps) {
        const int start = __ldg(lo + row);
        const int end = __ldg(hi + row);
        double acc0 = 0.0, acc1 = 0.0, acc2 = 0.0, acc3 = 0.0;
        for (int base = start; base < end; base += 32) {
            const int j = base + lane;
            int col = 0;
            float val = 0.0f;
            if (j < end) {                             // streamed once: evict first, keep V's rows in L2
                col = __ldcs(indices + j);
                val = __ldcs(data + j);
            }
            const int cnt = min(32, end - base);
            float4 x[L];
            float w[L];
#pragma unroll
            for (int t = 0; t < L; ++t) {
                const int src = t * S + s;
                const int c = __shfl_sync(0xffffffffu, col, src);
                w[t] = __shfl_sync(0xffffffffu, val, src);
                x[t] = (src < cnt && active) ? __ldg(V + (long long)c * ldv4 + l) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int t = 0; t < L; ++t) {              // w[t] is 0 past the row's end: nothing is added
                const double wt = double(w[t]);
                acc0 += wt * double(x[t].x);
                acc1 += wt * double(x[t].y);
                acc2 += wt * double(x[t].z);
                acc3 += wt * double(x[t].w);
            }
        }
#pragma unroll
        for (int off = L; off < 32; off <<= 1) {       // the groups' sums, the same on every lane
            acc0 += __shfl_xor_sync(0xffffffffu, acc0, off);
            acc1 += __shfl_xor_sync(0xffffffffu, acc1, off);
            acc2 += __shfl_xor_sync(0xffffffffu, acc2, off);
            acc3 += __shfl_xor_sync(0xffffffffu, acc3, off);
        }
        if (s == 0 && active) {
            Out* yr = Y + row * ldy + 4 * l;
            const int c0 = 4 * l;
            if (accumulate) {
                yr[0] += Out(acc0);
                if (c0 + 1 < b) yr[1] += Out(acc1);
                if (c0 + 2 < b) yr[2] += Out(acc2);
                if (c0 + 3 < b) yr[3] += Out(acc3);
            } else {
                yr[0] = Out(acc0);
                if (c0 + 1 < b) yr[1] = Out(acc1);
                if (c0 + 2 < b) yr[2] = Out(acc2);
                if (c0 + 3 < b) yr[3] = Out(acc3);
            }
        }
    }
}

template <typename T, typename Out, int G, int CPL>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_scatter(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                  const long long n_rows, const T* __restrict__ U, const long long ldu, const int b,
                  Out* __restrict__ Y, const long long ldy) {
    const MpimlRowGroups<G> rg;
    const unsigned mask = rg.mask;
    const int g = rg.g;
    for (long long row = rg.first; row < n_rows; row += rg.stride) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        Out u[CPL];
        const T* ur = U + row * ldu;
#pragma unroll
        for (int q = 0; q < CPL; ++q) {
            const int cc = g + q * G;
            u[q] = cc < b ? Out(__ldg(ur + cc)) : Out(0);
        }
        for (int base = start; base < end; base += G) {
            int col;
            T val;
            mpiml_stored_pair(indices, data, base + g, end, col, val);
            const int cnt = min(G, end - base);
            for (int k = 0; k < cnt; ++k) {
                const int c = __shfl_sync(mask, col, k, G);
                const Out w = Out(__shfl_sync(mask, val, k, G));
                Out* yr = Y + (long long)c * ldy;
#pragma unroll
                for (int q = 0; q < CPL; ++q) {
                    const int cc = g + q * G;
                    if (cc < b) atomicAdd(yr + cc, w * u[q]);
                }
            }
        }
    }
}

template <typename T, int G>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_scatter_vec(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                      const long long n_rows, const T* __restrict__ u, double* __restrict__ y) {
    static_assert(32 % G == 0, "G must divide 32");
    const int g = threadIdx.x & (G - 1);
    const long long groups = (long long)gridDim.x * (MPIML_SPARSE_THREADS / G);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / G; row < n_rows;
         row += groups) {
        const double ur = double(__ldg(u + row));
        if (ur == 0.0) continue;
        const int end = __ldg(indptr + row + 1);
        for (int j = __ldg(indptr + row) + g; j < end; j += G)
            atomicAdd(y + __ldg(indices + j), double(__ldg(data + j)) * ur);
    }
}

template <typename T, int G, bool W>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_normal_vec(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                     const long long n_rows, const T* __restrict__ p, const double* __restrict__ w,
                     const double* __restrict__ cp,
                     double* __restrict__ y, double* __restrict__ ysum) {
    static_assert(32 % G == 0, "G must divide 32");
    __shared__ double part[MPIML_SPARSE_THREADS / 32];
    const unsigned mask = mpiml_group_mask<G>();
    const int g = threadIdx.x & (G - 1);
    const long long groups = (long long)gridDim.x * (MPIML_SPARSE_THREADS / G);
    const double c = *cp;
    double mine = 0.0;
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / G; row < n_rows;
         row += groups) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        double dot = 0.0;
        for (int j = start + g; j < end; j += G) dot += double(__ldg(data + j)) * double(__ldg(p + __ldg(indices + j)));
#pragma unroll
        for (int off = G / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(mask, dot, off, G);
        double t = dot - c;
        if (W) t *= w[row];
        if (g == 0) mine += t;
        if (t != 0.0) {
            for (int j = start + g; j < end; j += G) atomicAdd(y + __ldg(indices + j), double(__ldg(data + j)) * t);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < MPIML_SPARSE_THREADS / 32; ++i) s += part[i];
        atomicAdd(ysum, s);
    }
}

template <typename T, typename Acc, typename Out, int G>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_rowdot(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                 const long long n_rows, const T* __restrict__ x, Out* __restrict__ y) {
    static_assert(32 % G == 0, "G must divide 32");
    const unsigned mask = mpiml_group_mask<G>();
    const int g = threadIdx.x & (G - 1);
    const long long groups = (long long)gridDim.x * (MPIML_SPARSE_THREADS / G);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / G; row < n_rows;
         row += groups) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        Acc acc = Acc(0);
        int j = start + g;
        for (; j + G < end; j += 2 * G) {           // two stored values per lane in flight
            const int c0 = __ldg(indices + j), c1 = __ldg(indices + j + G);
            const T v0 = __ldg(data + j), v1 = __ldg(data + j + G);
            acc += Acc(v0) * Acc(__ldg(x + c0));
            acc += Acc(v1) * Acc(__ldg(x + c1));
        }
        if (j < end) acc += Acc(__ldg(data + j)) * Acc(__ldg(x + __ldg(indices + j)));
#pragma unroll
        for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(mask, acc, off, G);
        if (g == 0) y[row] = Out(acc);
    }
}

template <typename T>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_row_moments(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                      const long long n_rows, const double* shift, double* s1, double* __restrict__ s2,
                      int* __restrict__ unsorted) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (MPIML_SPARSE_THREADS / 32);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / 32; row < n_rows;
         row += warps) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        const double m = shift[row];
        double a = 0.0, q = 0.0;
        int bad = 0;
        for (int j = start + lane; j < end; j += 32) {
            const double v = double(__ldg(data + j));
            a += v;
            q += (v - m) * (v - m);
            if (j > start && __ldg(indices + j) <= __ldg(indices + j - 1)) bad = 1;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, off);
            q += __shfl_xor_sync(0xffffffffu, q, off);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (lane == 0) {                            // shift may alias s1 (zeros): every lane has read it
            s1[row] = a;
            s2[row] = q;
            if (bad) atomicAdd(unsorted, 1);
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_dense_col_moments(const T* __restrict__ X, const long long n, const int d, const long long ld,
                        const long long rows_per_block, const int tc, const double* __restrict__ shift,
                        double* __restrict__ partial) {
    __shared__ double sa[MPIML_SPARSE_THREADS];
    __shared__ double sq[MPIML_SPARSE_THREADS];
    const int lanes = MPIML_SPARSE_THREADS / tc;
    const int tx = threadIdx.x % tc;
    const int ty = threadIdx.x / tc;
    const long long r0 = (long long)blockIdx.x * rows_per_block;
    const long long r1 = min(n, r0 + rows_per_block);
    double* out = partial + (long long)blockIdx.x * 2 * d;
    for (int c0 = 0; c0 < d; c0 += tc) {
        const int c = c0 + tx;
        double a = 0.0, q = 0.0;
        if (c < d) {
            const double m = shift[c];
            const T* col = X + c;
            long long r = r0 + ty;
            for (; r + 3 * lanes < r1; r += 4 * lanes) {
                const double v0 = double(__ldg(col + r * ld)), v1 = double(__ldg(col + (r + lanes) * ld));
                const double v2 = double(__ldg(col + (r + 2 * lanes) * ld));
                const double v3 = double(__ldg(col + (r + 3 * lanes) * ld));
                a += (v0 + v1) + (v2 + v3);
                q += ((v0 - m) * (v0 - m) + (v1 - m) * (v1 - m)) + ((v2 - m) * (v2 - m) + (v3 - m) * (v3 - m));
            }
            for (; r < r1; r += lanes) {
                const double v = double(__ldg(col + r * ld));
                a += v;
                q += (v - m) * (v - m);
            }
        }
        sa[threadIdx.x] = a;
        sq[threadIdx.x] = q;
        __syncthreads();
        if (ty == 0 && c < d) {
            for (int t = 1; t < lanes; ++t) {
                a += sa[t * tc + tx];
                q += sq[t * tc + tx];
            }
            out[c] = a;
            out[d + c] = q;
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_split(const int* __restrict__ indptr, const int* __restrict__ indices, const long long n_rows,
                const int* __restrict__ cuts, const int K, int* __restrict__ ptr, int* __restrict__ unsorted) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (MPIML_SPARSE_THREADS / 32);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / 32; row < n_rows;
         row += warps) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        int bad = 0;
        for (int k = 0; k <= K; ++k) {
            int count = 0;
            if (k == K) {
                count = end - start;
            } else if (k > 0) {
                const int cut = __ldg(cuts + k);
                for (int base = start; base < end; base += 32) {
                    const int j = base + lane;
                    const bool below = j < end && __ldg(indices + j) < cut;
                    count += __popc(__ballot_sync(0xffffffffu, below));
                }
            }
            if (lane == 0) ptr[(long long)k * n_rows + row] = start + count;
        }
        for (int j = start + 1 + lane; j < end; j += 32) {
            if (__ldg(indices + j) < __ldg(indices + j - 1)) bad = 1;
        }
        if (__any_sync(0xffffffffu, bad) && lane == 0) atomicAdd(unsorted, 1);
    }
}

template <typename T, int G>
__global__ void __launch_bounds__(1024)
mpiml_csr_piece_dot(const int* __restrict__ p0, const int* __restrict__ p1, const int* __restrict__ indices,
                    const T* __restrict__ data, const long long n_rows, const T* __restrict__ x, const int lo,
                    const int width, double* __restrict__ y, const int accumulate) {
    extern __shared__ unsigned char mpiml_piece_smem[];
    T* xs = reinterpret_cast<T*>(mpiml_piece_smem);
    for (int c = threadIdx.x; c < width; c += blockDim.x) xs[c] = __ldg(x + lo + c);
    __syncthreads();
    const unsigned mask = mpiml_group_mask<G>();
    const int g = threadIdx.x & (G - 1);
    const long long groups = (long long)gridDim.x * (blockDim.x / G);
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G;
    int next_start = 0, next_end = 0;               // the next row's bounds load while this row's values do
    if (row < n_rows) {
        next_start = __ldg(p0 + row);
        next_end = __ldg(p1 + row);
    }
    for (; row < n_rows; row += groups) {
        const int start = next_start;
        const int end = next_end;
        if (row + groups < n_rows) {
            next_start = __ldg(p0 + row + groups);
            next_end = __ldg(p1 + row + groups);
        }
        double acc = 0.0;
        int j = start + g;
        for (; j + G < end; j += 2 * G) {
            const int c0 = __ldg(indices + j) - lo, c1 = __ldg(indices + j + G) - lo;
            const T v0 = __ldg(data + j), v1 = __ldg(data + j + G);
            acc += double(v0) * double(xs[c0]);
            acc += double(v1) * double(xs[c1]);
        }
        if (j < end) acc += double(__ldg(data + j)) * double(xs[__ldg(indices + j) - lo]);
#pragma unroll
        for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(mask, acc, off, G);
        if (g == 0) y[row] = accumulate ? y[row] + acc : acc;
    }
}

template <typename T, int G>
__global__ void __launch_bounds__(1024)
mpiml_csr_piece_scatter(const int* __restrict__ p0, const int* __restrict__ p1, const int* __restrict__ indices,
                        const T* __restrict__ data, const long long n_rows, const T* __restrict__ u, const int lo,
                        const int width, double* __restrict__ y) {
    extern __shared__ unsigned char mpiml_piece_smem[];
    T* acc = reinterpret_cast<T*>(mpiml_piece_smem);
    for (int c = threadIdx.x; c < width; c += blockDim.x) acc[c] = T(0);
    __syncthreads();
    const int g = threadIdx.x & (G - 1);
    const long long groups = (long long)gridDim.x * (blockDim.x / G);
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G;
    T next_u = T(0);                                // the next row's u and bounds load while this row's values do
    int next_start = 0, next_end = 0;
    if (row < n_rows) {
        next_u = __ldg(u + row);
        next_start = __ldg(p0 + row);
        next_end = __ldg(p1 + row);
    }
    for (; row < n_rows; row += groups) {
        const T ur = next_u;
        const int start = next_start;
        const int end = next_end;
        if (row + groups < n_rows) {
            next_u = __ldg(u + row + groups);
            next_start = __ldg(p0 + row + groups);
            next_end = __ldg(p1 + row + groups);
        }
        if (ur == T(0)) continue;
        for (int j = start + g; j < end; j += G)
            atomicAdd(acc + (__ldg(indices + j) - lo), __ldg(data + j) * ur);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        const T a = acc[c];
        if (a != T(0)) atomicAdd(y + lo + c, double(a));
    }
}

__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_col_counts(const int* __restrict__ indices, const long long nnz, int* __restrict__ counts) {
    const long long stride = (long long)gridDim.x * MPIML_SPARSE_THREADS;
    for (long long j = (long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x; j < nnz; j += stride)
        atomicAdd(counts + __ldcs(indices + j), 1);
}

template <typename T>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_transpose_fill(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                         const long long n_rows, int* __restrict__ cursor, int* __restrict__ rows_t,
                         T* __restrict__ data_t) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (MPIML_SPARSE_THREADS / 32);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / 32; row < n_rows;
         row += warps) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        for (int base = start + lane; base < end; base += 128) {   // 4 atomics in flight a lane
            int c[4], pos[4];
            T v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = base + 32 * u;
                c[u] = j < end ? __ldcs(indices + j) : 0;
                v[u] = j < end ? __ldcs(data + j) : T(0);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) pos[u] = base + 32 * u < end ? atomicAdd(cursor + c[u], 1) : 0;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (base + 32 * u < end) {
                    rows_t[pos[u]] = (int)row;
                    data_t[pos[u]] = v[u];
                }
            }
        }
    }
}

__device__ __forceinline__ double mpiml_block_sum(double v, double* red) {
    // the block's total on every thread, in a fixed order (deterministic); red: MPIML_SPARSE_THREADS / 32 doubles
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();                                  // red is free (a previous sum has been read)
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < MPIML_SPARSE_THREADS / 32; ++i) s += red[i];
    return s;
}

template <typename T, typename W>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_sort_runs(const int* __restrict__ indptr, const long long n_rows, const int p_max, const int pbits,
                    int* __restrict__ keys, T* __restrict__ vals, double* __restrict__ s1, double* __restrict__ s2,
                    int* __restrict__ unsorted) {
    extern __shared__ __align__(16) unsigned char mpiml_sort_smem[];
    __shared__ double red[MPIML_SPARSE_THREADS / 32];
    W* sw = reinterpret_cast<W*>(mpiml_sort_smem);                                 // (key << pbits) | place
    T* sv = reinterpret_cast<T*>(mpiml_sort_smem + (size_t)p_max * sizeof(W));      // p_max even: aligned
    const W place = (W(1) << pbits) - W(1);
    const int t = threadIdx.x;
    for (long long row = blockIdx.x; row < n_rows; row += gridDim.x) {
        const int start = __ldg(indptr + row);
        const int m = __ldg(indptr + row + 1) - start;   // the same on every thread of the block
        if (m <= 1) {
            if (t == 0) {
                s1[row] = m ? double(vals[start]) : 0.0;
                s2[row] = 0.0;
            }
            continue;
        }
        if (m > p_max) {                              // too long for the shared arrays: left in the fill's order
            double a = 0.0;
            for (int i = t; i < m; i += MPIML_SPARSE_THREADS) a += double(vals[start + i]);
            a = mpiml_block_sum(a, red);
            const double mean = a / m;
            double q = 0.0;
            for (int i = t; i < m; i += MPIML_SPARSE_THREADS) {
                const double d = double(vals[start + i]) - mean;
                q += d * d;
            }
            q = mpiml_block_sum(q, red);
            if (t == 0) {
                s1[row] = a;
                s2[row] = q;
                atomicAdd(unsorted, 1);
            }
            continue;
        }
        int P = 2;
        while (P < m) P <<= 1;
        for (int i = t; i < P; i += MPIML_SPARSE_THREADS) {
            if (i < m) {
                sw[i] = (W((unsigned)keys[start + i]) << pbits) | W(i);
                sv[i] = vals[start + i];
            } else {
                sw[i] = ~W(0);                            // after every real word (an equal one decodes alike)
            }
        }
        __syncthreads();
        for (int k = 2; k <= P; k <<= 1) {
            for (int h = k >> 1; h > 0; h >>= 1) {
                for (int q = t; q < (P >> 1); q += MPIML_SPARSE_THREADS) {   // the P / 2 pairs (i, i + h)
                    const int i = ((q & ~(h - 1)) << 1) | (q & (h - 1));
                    const int o = i + h;
                    const W a = sw[i], b = sw[o];
                    if ((a > b) == ((i & k) == 0)) {
                        sw[i] = b;
                        sw[o] = a;
                    }
                }
                __syncthreads();
            }
        }
        double a = 0.0;
        int dup = 0;
        for (int i = t; i < m; i += MPIML_SPARSE_THREADS) {
            const W w = sw[i];
            const T v = sv[(int)(w & place)];
            keys[start + i] = (int)(w >> pbits);
            vals[start + i] = v;
            a += double(v);
            if (i > 0 && (sw[i - 1] >> pbits) == (w >> pbits)) dup = 1;     // sorted: equal neighbours only
        }
        // the row's moments while its values are here: the sum, and squares about the mean of the stored values
        a = mpiml_block_sum(a, red);
        const double mean = a / m;
        double q = 0.0;
        for (int i = t; i < m; i += MPIML_SPARSE_THREADS) {
            const double d = double(sv[(int)(sw[i] & place)]) - mean;
            q += d * d;
        }
        q = mpiml_block_sum(q, red);
        dup = __syncthreads_or(dup);                  // also: every thread is done with the shared arrays
        if (t == 0) {
            s1[row] = a;
            s2[row] = q;
            if (dup) atomicAdd(unsorted, 1);
        }
    }
}

#define MPIML_SMALL_MAX 64

__global__ void __launch_bounds__(128)
mpiml_small_cholinv(const double* __restrict__ G, const int l, const double max_cond, double* __restrict__ R,
                    double* __restrict__ Rinv, int* __restrict__ flag) {
    constexpr int LD = MPIML_SMALL_MAX + 1;      // padded rows of the shared copy
    __shared__ double S[MPIML_SMALL_MAX * LD];
    __shared__ double red[2][128];
    __shared__ int bad;
    const int t = threadIdx.x;
    for (int i = t; i < l * l; i += blockDim.x) S[(i / l) * LD + i % l] = G[i];
    if (t == 0) bad = 0;
    __syncthreads();
    for (int j = 0; j < l; ++j) {                 // right-looking Cholesky of the lower triangle, in place
        if (t == 0) {
            const double p = S[j * LD + j];
            if (p > 0.0 && isfinite(p)) {
                S[j * LD + j] = sqrt(p);
            } else {
                bad = 1;
                S[j * LD + j] = 1.0;
            }
        }
        __syncthreads();
        const double piv = S[j * LD + j];
        for (int i = j + 1 + t; i < l; i += blockDim.x) S[i * LD + j] /= piv;
        __syncthreads();
        const int m = l - j - 1;
        for (int q = t; q < m * m; q += blockDim.x) {
            const int i = j + 1 + q / m, k = j + 1 + q % m;
            if (k <= i) S[i * LD + k] -= S[i * LD + j] * S[k * LD + j];
        }
        __syncthreads();
    }
    double sq = 0.0, sq_inv = 0.0;
    for (int c = t; c < l; c += blockDim.x) {     // column c of L⁻¹ (forward substitution) is row c of R⁻¹
        double x[MPIML_SMALL_MAX];
        for (int i = 0; i < l; ++i) {
            double v = 0.0;
            if (i >= c) {
                v = i == c ? 1.0 : 0.0;
                for (int k = c; k < i; ++k) v -= S[i * LD + k] * x[k];
                v /= S[i * LD + i];
            }
            x[i] = v;
            Rinv[c * l + i] = v;
            sq_inv += v * v;
            const double r = i >= c ? S[i * LD + c] : 0.0;   // R = Lᵀ: R[c][i] = L[i][c]
            R[c * l + i] = r;
            sq += r * r;
        }
    }
    red[0][t] = sq;
    red[1][t] = sq_inv;
    __syncthreads();
    if (t == 0) {
        double a = 0.0, b = 0.0;
        for (int i = 0; i < blockDim.x; ++i) {
            a += red[0][i];
            b += red[1][i];
        }
        int f = bad;
        if (!isfinite(a) || !isfinite(b)) f |= 1;
        if (max_cond > 0.0 && !(sqrt(a) * sqrt(b) <= max_cond)) f |= 2;
        if (f) atomicOr(flag, f);
    }
}

template <int L>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_scatter4(const int* __restrict__ indptr, const int* __restrict__ indices, const float* __restrict__ data,
                   const long long n_rows, const float4* __restrict__ U, const long long ldu4, const int b4,
                   float4* __restrict__ Y) {
    static_assert(L == 2 || L == 4 || L == 8, "L must be 2, 4 or 8");
    constexpr int S = 32 / L;
    const int lane = threadIdx.x & 31;
    const int l = lane & (L - 1);
    const int s = lane / L;
    const bool active = l < b4;
    const long long warps = (long long)gridDim.x * (MPIML_SPARSE_THREADS / 32);
    for (long long row = ((long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x) / 32; row < n_rows;
         row += warps) {
        const int start = __ldg(indptr + row);
        const int end = __ldg(indptr + row + 1);
        const float4 u = active ? __ldg(U + row * ldu4 + l) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (!active) continue;
        for (int j = start + s; j < end; j += S) {
            const int c = __ldcs(indices + j);
            const float v = __ldcs(data + j);
            float4* y = Y + (long long)c * L + l;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            atomicAdd(y, make_float4(v * u.x, v * u.y, v * u.z, v * u.w));
#else
            float* yf = reinterpret_cast<float*>(y);
            atomicAdd(yf, v * u.x);
            atomicAdd(yf + 1, v * u.y);
            atomicAdd(yf + 2, v * u.z);
            atomicAdd(yf + 3, v * u.w);
#endif
        }
    }
}

__global__ void __launch_bounds__(1024)
mpiml_small_svd(const double* __restrict__ R, const int l, double* __restrict__ U, double* __restrict__ sv,
                double* __restrict__ Vt, int* __restrict__ flag) {
    extern __shared__ __align__(16) unsigned char mpiml_svd_smem[];
    double* A = reinterpret_cast<double*>(mpiml_svd_smem);        // column c at A + c * l
    double* V = A + l * l;
    __shared__ double norms[MPIML_SMALL_MAX];
    __shared__ int order[MPIML_SMALL_MAX];
    const int t = threadIdx.x;
    const int lane = t & 31;
    const int w = t >> 5;
    for (int i = t; i < l * l; i += blockDim.x) {
        const int r = i / l, c = i % l;
        A[c * l + r] = R[i];
        V[c * l + r] = r == c ? 1.0 : 0.0;
    }
    __syncthreads();
    const int n = l + (l & 1);
    int sweep = 0;
    for (; sweep < 60 && l > 1; ++sweep) {
        int rotated = 0;
        for (int round = 0; round < n - 1; ++round) {
            if (w < n / 2) {
                const int p = n - 1 - w;
                const int i = w == 0 ? 0 : 1 + ((w - 1 + round) % (n - 1));
                const int j = 1 + ((p - 1 + round) % (n - 1));
                if (i < l && j < l) {
                    double a = 0.0, b = 0.0, g = 0.0;
                    for (int r = lane; r < l; r += 32) {
                        const double x = A[i * l + r], y = A[j * l + r];
                        a += x * x;
                        b += y * y;
                        g += x * y;
                    }
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        a += __shfl_xor_sync(0xffffffffu, a, off);
                        b += __shfl_xor_sync(0xffffffffu, b, off);
                        g += __shfl_xor_sync(0xffffffffu, g, off);
                    }
                    if (g != 0.0 && fabs(g) > 1e-15 * sqrt(a * b)) {
                        rotated = 1;
                        const double z = (b - a) / (2.0 * g);
                        const double tt = z != 0.0 ? copysign(1.0, z) / (fabs(z) + sqrt(1.0 + z * z)) : 1.0;
                        const double c = 1.0 / sqrt(1.0 + tt * tt), s = c * tt;
                        for (int r = lane; r < l; r += 32) {
                            const double x = A[i * l + r], y = A[j * l + r];
                            A[i * l + r] = c * x - s * y;
                            A[j * l + r] = s * x + c * y;
                            const double u = V[i * l + r], v = V[j * l + r];
                            V[i * l + r] = c * u - s * v;
                            V[j * l + r] = s * u + c * v;
                        }
                    }
                }
            }
            __syncthreads();
        }
        if (!__syncthreads_or(rotated)) break;
    }
    if (sweep == 60 && t == 0) atomicOr(flag, 4);
    for (int c = w; c < l; c += blockDim.x / 32) {                  // column norms: the singular values
        double a = 0.0;
        for (int r = lane; r < l; r += 32) a += A[c * l + r] * A[c * l + r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
        if (lane == 0) norms[c] = sqrt(a);
    }
    __syncthreads();
    if (t == 0) {                                                   // descending, ties by index (stable)
        for (int k = 0; k < l; ++k) order[k] = k;
        for (int k = 1; k < l; ++k) {
            const int key = order[k];
            int q = k - 1;
            while (q >= 0 && norms[order[q]] < norms[key]) {
                order[q + 1] = order[q];
                --q;
            }
            order[q + 1] = key;
        }
    }
    __syncthreads();
    for (int i = t; i < l * l; i += blockDim.x) {
        const int r = i / l, k = i % l;                             // U[r][k] and Vt[k][r]
        const int c = order[k];
        const double nrm = norms[c];
        U[r * l + k] = nrm > 0.0 ? A[c * l + r] / nrm : 0.0;
        Vt[k * l + r] = V[c * l + r];
    }
    for (int k = t; k < l; k += blockDim.x) sv[k] = norms[order[k]];
}

__global__ void __launch_bounds__(1024)
mpiml_csr_col_counts_smem(const int* __restrict__ indices, const long long nnz, const int n_cols, const int w,
                          int* __restrict__ counts) {
    extern __shared__ int mpiml_count_smem[];
    const long long per = (nnz + gridDim.x - 1) / gridDim.x;
    const long long lo = (long long)blockIdx.x * per;
    const long long hi = min(nnz, lo + per);
    for (int c0 = 0; c0 < n_cols; c0 += w) {
        const int width = min(w, n_cols - c0);
        for (int c = threadIdx.x; c < width; c += blockDim.x) mpiml_count_smem[c] = 0;
        __syncthreads();
        for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const unsigned c = (unsigned)(__ldg(indices + j) - c0);
            if (c < (unsigned)width) atomicAdd(mpiml_count_smem + c, 1);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < width; c += blockDim.x) {
            const int v = mpiml_count_smem[c];
            if (v) atomicAdd(counts + c0 + c, v);
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(1024)
mpiml_csr_block_counts(const int* __restrict__ indptr, const int* __restrict__ indices, const long long n_rows,
                       const long long rows_per_block, const int n_cols, const int w, int* __restrict__ bc) {
    extern __shared__ int mpiml_bc_smem[];
    const long long r0 = min(n_rows, (long long)blockIdx.x * rows_per_block);
    const long long r1 = min(n_rows, r0 + rows_per_block);
    const int lo = __ldg(indptr + r0), hi = __ldg(indptr + r1);
    int* out = bc + (long long)blockIdx.x * n_cols;
    for (int c0 = 0; c0 < n_cols; c0 += w) {
        const int width = min(w, n_cols - c0);
        for (int c = threadIdx.x; c < width; c += blockDim.x) mpiml_bc_smem[c] = 0;
        __syncthreads();
        for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
            const unsigned c = (unsigned)(__ldcs(indices + j) - c0);
            if (c < (unsigned)width) atomicAdd(mpiml_bc_smem + c, 1);
        }
        __syncthreads();
        for (int c = threadIdx.x; c < width; c += blockDim.x) out[c0 + c] = mpiml_bc_smem[c];
        __syncthreads();
    }
}

__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_csr_block_scan(int* __restrict__ bc, const int n_blocks, const int n_cols, int* __restrict__ total) {
    const int c = blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x;
    if (c >= n_cols) return;
    int run = 0;
    for (int b = 0; b < n_blocks; ++b) {
        int* p = bc + (long long)b * n_cols + c;
        const int v = *p;
        *p = run;
        run += v;
    }
    total[c] = run;
}

template <typename T>
__global__ void __launch_bounds__(1024)
mpiml_csr_block_fill(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                     const long long n_rows, const long long rows_per_block, const int n_cols, const int w,
                     const int* __restrict__ bc, const int* __restrict__ ptr, int* __restrict__ rows_t,
                     T* __restrict__ data_t) {
    extern __shared__ int mpiml_fill_smem[];
    const long long r0 = min(n_rows, (long long)blockIdx.x * rows_per_block);
    const long long r1 = min(n_rows, r0 + rows_per_block);
    const int lane = threadIdx.x & 31;
    const int warps = blockDim.x >> 5;
    const int* base = bc + (long long)blockIdx.x * n_cols;
    for (int c0 = 0; c0 < n_cols; c0 += w) {
        const int width = min(w, n_cols - c0);
        for (int c = threadIdx.x; c < width; c += blockDim.x) mpiml_fill_smem[c] = __ldg(ptr + c0 + c) + base[c0 + c];
        __syncthreads();
        for (long long row = r0 + (threadIdx.x >> 5); row < r1; row += warps) {
            const int start = __ldg(indptr + row), end = __ldg(indptr + row + 1);
            for (int j = start + lane; j < end; j += 32) {
                const unsigned c = (unsigned)(__ldg(indices + j) - c0);
                if (c < (unsigned)width) {
                    const int pos = atomicAdd(mpiml_fill_smem + c, 1);
                    rows_t[pos] = (int)row;
                    data_t[pos] = __ldg(data + j);
                }
            }
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------- the bucket transpose
// Aᵀ as CSR with no global atomic, every write coalesced, and no sort: a stable counting sort of A's stored values by
// column, in two levels.  Column c falls in bucket c >> shift (W = 2^shift columns a bucket, K buckets); A's stored
// values are cut into chunks of E = blockDim.x * PER consecutive places.  A block holds E entries, PER a lane, warp w
// the places [w * 32 PER, (w + 1) * 32 PER) (step j at lane l: place w * 32 PER + 32 j + l), so that ranks by warp
// then step then lane are the order of the places (mpiml_bt_rank: stable).
// mpiml_bt_counts:  per chunk the count of its stored values in each bucket (shared atomics), to counts[1 + k * nchunks
//   + c] (bucket-major; counts[0] = 0), so their inclusive scan (the caller's) is each (bucket, chunk)'s first place
//   in the bucket-major staging, offsets[k * nchunks + c], and offsets[K * nchunks] the count of all.
// mpiml_bt_scatter<T, PER>:  a block a chunk: each entry's row (the last row starting at or before its place: the
//   chunk's first row from the caller, the later starts marked in shared memory and max-scanned), its stable place
//   among the chunk's entries sorted by bucket (mpiml_bt_rank), the chunk sorted so in shared memory, then written
//   out in that order: each bucket's run of the chunk goes to its place in the staging (column within the bucket as
//   16 bits, row, value), which then holds each bucket's entries in A's storage order.
// mpiml_bt_place<T, PER>:  a block a bucket: its columns' counts (shared atomics over its staged columns), their scan
//   (Aᵀ's row pointers: the bucket's first place plus the column's start in it), then tile by tile in order the same
//   stable sort by column in shared memory and each column's run written after the one before it.  A bucket's
//   places in Aᵀ are its places in the staging.  Each column's entries keep A's storage order: rows increasing (the
//   arrays of cuSPARSE's conversion, whatever A's order within its rows; duplicates in storage order).
// Indices must lie in [0, n_cols) (a stored value of a bucket past K, or of a column past the bucket's, is dropped).

#define MPIML_BT_NONE 0xffffffffu

// Exclusive scan in place of n counts (C: int or unsigned short; every partial sum below 2^31, and below 2^16 for
// unsigned short), a contiguous run a thread; returns the total.  red: 33 ints.  Ends synchronised.
template <typename C>
__device__ int mpiml_bt_scan(C* a, const int n, int* red) {
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, nw = blockDim.x >> 5;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = min(n, t * per), hi = min(n, lo + per);
    int s = 0;
    for (int i = lo; i < hi; ++i) s += int(a[i]);
    int incl = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
    }
    if (lane == 31) red[w] = incl;
    __syncthreads();
    if (w == 0) {
        const int v = lane < nw ? red[lane] : 0;
        int inc = v;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, inc, off);
            if (lane >= off) inc += y;
        }
        if (lane < nw) red[lane] = inc - v;
        if (lane == 31) red[32] = inc;
    }
    __syncthreads();
    int run = red[w] + incl - s;
    for (int i = lo; i < hi; ++i) {
        const int v = int(a[i]);
        a[i] = C(run);
        run += v;
    }
    const int total = red[32];
    __syncthreads();
    return total;
}

// The same exclusive scan of nkeys * nw unsigned short counts stored warp-major (a[w * nkeys + k]) taken in (key,
// warp) order: place i of that order is a[(i % nw) * nkeys + i / nw].  Ends synchronised.
__device__ int mpiml_bt_scan_kw(unsigned short* a, const int nkeys, const int nw, int* red) {
    const int n = nkeys * nw;
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, nwb = blockDim.x >> 5;
    const int per = (n + blockDim.x - 1) / blockDim.x;
    const int lo = min(n, t * per), hi = min(n, lo + per);
    int s = 0;
    for (int i = lo; i < hi; ++i) s += int(a[(i % nw) * nkeys + i / nw]);
    int incl = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
    }
    if (lane == 31) red[w] = incl;
    __syncthreads();
    if (w == 0) {
        const int v = lane < nwb ? red[lane] : 0;
        int inc = v;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, inc, off);
            if (lane >= off) inc += y;
        }
        if (lane < nwb) red[lane] = inc - v;
        if (lane == 31) red[32] = inc;
    }
    __syncthreads();
    int run = red[w] + incl - s;
    for (int i = lo; i < hi; ++i) {
        unsigned short* p = a + (i % nw) * nkeys + i / nw;
        const int v = int(*p);
        *p = (unsigned short)run;
        run += v;
    }
    const int total = red[32];
    __syncthreads();
    return total;
}

// The stable ranks of a block's E entries by key (key[j] < nkeys, or MPIML_BT_NONE: no entry), held as above: q[j] is
// the entry's place in the entries sorted by key, in the order of their places.  The counts are warp-major, cnt[w *
// nkeys + k] (a warp's lanes then hit different banks), and end as the exclusive scan over (key, warp), so cnt[k] is
// key k's first place.  Returns the count of entries.
template <int PER>
__device__ int mpiml_bt_rank(const unsigned (&key)[PER], int (&q)[PER], unsigned short* cnt, const int nkeys,
                             int* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int i = threadIdx.x; i < nkeys * nw; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    const unsigned below = (1u << lane) - 1u;
    unsigned short* mine = cnt + w * nkeys;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const unsigned k = key[j];
        const unsigned peers = __match_any_sync(0xffffffffu, k);
        const int r = __popc(peers & below);
        const int base = k != MPIML_BT_NONE ? int(mine[k]) : 0;
        __syncwarp();
        if (k != MPIML_BT_NONE && r == 0) mine[k] = (unsigned short)(base + __popc(peers));
        __syncwarp();
        q[j] = base + r;
    }
    __syncthreads();
    const int total = mpiml_bt_scan_kw(cnt, nkeys, nw, red);
#pragma unroll
    for (int j = 0; j < PER; ++j)
        if (key[j] != MPIML_BT_NONE) q[j] += int(mine[key[j]]);
    return total;
}

template <int PER>
__global__ void __launch_bounds__(1024)
mpiml_bt_counts(const int* __restrict__ indices, const long long nnz, const int shift, const int K,
                const int nchunks, int* __restrict__ counts) {
    extern __shared__ int mpiml_bt_hist[];
    const int c = blockIdx.x, t = threadIdx.x;
    for (int k = t; k < K; k += blockDim.x) mpiml_bt_hist[k] = 0;
    __syncthreads();
    const long long lo = (long long)c * blockDim.x * PER;
    unsigned key[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const long long i = lo + (long long)j * blockDim.x + t;
        key[j] = i < nnz ? (unsigned)__ldcs(indices + i) >> shift : MPIML_BT_NONE;
    }
#pragma unroll
    for (int j = 0; j < PER; ++j)
        if (key[j] < (unsigned)K) atomicAdd(mpiml_bt_hist + key[j], 1);
    __syncthreads();
    for (int k = t; k < K; k += blockDim.x) counts[1 + (long long)k * nchunks + c] = mpiml_bt_hist[k];
}

template <typename T, int PER>
__global__ void __launch_bounds__(1024)
mpiml_bt_scatter(const int* __restrict__ indptr, const int* __restrict__ indices, const T* __restrict__ data,
                 const long long n_rows, const long long nnz, const int* __restrict__ chunk_row, const int shift,
                 const int K, const int nchunks, const int* __restrict__ offsets,
                 unsigned short* __restrict__ st_col, int* __restrict__ st_row, T* __restrict__ st_val) {
    extern __shared__ __align__(16) unsigned char mpiml_bt_smem[];
    const int nt = blockDim.x, E = nt * PER;
    T* sval = reinterpret_cast<T*>(mpiml_bt_smem);                        // E values
    int* srow = reinterpret_cast<int*>(sval + E);                          // E rows (first the row marks)
    int* scol = srow + E;                                                  // E columns
    unsigned short* cnt = reinterpret_cast<unsigned short*>(scol + E);    // K * nw counts
    __shared__ int red[33];
    __shared__ int wmax[32];
    const int c = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const long long lo = (long long)c * E;
    const int n = (int)min((long long)E, nnz - lo);
    int col[PER];
    T val[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {                                        // in flight while the rows are marked
        const int i = w * 32 * PER + j * 32 + lane;
        col[j] = i < n ? __ldcs(indices + lo + i) : -1;
        val[j] = i < n ? __ldcs(data + lo + i) : T(0);
    }
    const int r0 = __ldg(chunk_row + c);                                   // the row holding place lo
    for (int i = t; i < E; i += nt) srow[i] = -1;
    __syncthreads();
    for (long long r = (long long)r0 + 1 + t; r < n_rows; r += nt) {      // the later rows starting in the chunk
        const int p = __ldg(indptr + r);
        if (p >= lo + n) break;
        if (__ldg(indptr + r + 1) > p) srow[p - lo] = (int)r;              // non-empty rows start at distinct places
    }
    __syncthreads();
    int row[PER];
    int carry = -1;
#pragma unroll
    for (int j = 0; j < PER; ++j) {                                        // the running max of the marks
        int m = srow[w * 32 * PER + j * 32 + lane];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, m, off);
            if (lane >= off) m = max(m, y);
        }
        m = max(m, carry);
        carry = __shfl_sync(0xffffffffu, m, 31);
        row[j] = m;
    }
    if (lane == 0) wmax[w] = carry;
    __syncthreads();
    int before = r0;
    for (int v = 0; v < w; ++v) before = max(before, wmax[v]);
    unsigned key[PER];
    int q[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        row[j] = max(row[j], before);
        const unsigned k = (unsigned)col[j] >> shift;
        key[j] = col[j] >= 0 && k < (unsigned)K ? k : MPIML_BT_NONE;
    }
    const int total = mpiml_bt_rank<PER>(key, q, cnt, K, red);             // synchronised: srow is free
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        if (key[j] != MPIML_BT_NONE) {
            scol[q[j]] = col[j];
            srow[q[j]] = row[j];
            sval[q[j]] = val[j];
        }
    }
    __syncthreads();
    const int nw = nt >> 5;
    const unsigned low = (1u << shift) - 1u;
    for (int i = t; i < total; i += nt) {
        const int cc = scol[i];
        const int k = (int)((unsigned)cc >> shift);
        const long long g = (long long)__ldg(offsets + (long long)k * nchunks + c) + (i - int(cnt[k]));
        st_col[g] = (unsigned short)((unsigned)cc & low);
        st_row[g] = srow[i];
        st_val[g] = sval[i];
    }
}

template <typename T, int PER>
__global__ void __launch_bounds__(1024)
mpiml_bt_place(const unsigned short* __restrict__ st_col, const int* __restrict__ st_row,
               const T* __restrict__ st_val, const int* __restrict__ offsets, const int nchunks, const int K,
               const int shift, const int n_cols, int* __restrict__ ptr, int* __restrict__ rows_t,
               T* __restrict__ data_t) {
    extern __shared__ __align__(16) unsigned char mpiml_bt_smem[];
    const int nt = blockDim.x, E = nt * PER, W = 1 << shift;
    T* sval = reinterpret_cast<T*>(mpiml_bt_smem);                        // E values
    int* srow = reinterpret_cast<int*>(sval + E);                          // E rows
    int* cur = srow + E;                                                   // W: each column's next place
    unsigned short* scol = reinterpret_cast<unsigned short*>(cur + W);    // E columns
    unsigned short* cnt = scol + E;                                        // W * nw counts
    __shared__ int red[33];
    const int t = threadIdx.x, lane = t & 31, w = t >> 5, nw = nt >> 5;
    if (blockIdx.x == 0 && t == 0) ptr[n_cols] = __ldg(offsets + (long long)K * nchunks);
    for (int k = blockIdx.x; k < K; k += gridDim.x) {
        const int bs = __ldg(offsets + (long long)k * nchunks);
        const int be = __ldg(offsets + (long long)(k + 1) * nchunks);
        const int c0 = k << shift, wk = min(W, n_cols - c0);
        for (int c = t; c < wk; c += nt) cur[c] = 0;
        __syncthreads();
        for (int i = bs + t; i < be; i += 4 * nt) {                        // the bucket's column counts
            unsigned v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = i + u * nt < be ? (unsigned)__ldg(st_col + i + u * nt) : MPIML_BT_NONE;
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (v[u] < (unsigned)wk) atomicAdd(cur + v[u], 1);
        }
        __syncthreads();
        mpiml_bt_scan(cur, wk, red);                                       // each column's start in the bucket
        for (int c = t; c < wk; c += nt) ptr[c0 + c] = bs + cur[c];
        for (int t0 = bs; t0 < be; t0 += E) {                              // the tiles, in order
            const int n = min(E, be - t0);
            unsigned key[PER];
            int row[PER], q[PER];
            T val[PER];
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                const int i = w * 32 * PER + j * 32 + lane;
                const bool ok = i < n;
                const unsigned k = ok ? (unsigned)__ldcs(st_col + t0 + i) : MPIML_BT_NONE;
                key[j] = k < (unsigned)wk ? k : MPIML_BT_NONE;
                row[j] = ok ? __ldcs(st_row + t0 + i) : 0;
                val[j] = ok ? __ldcs(st_val + t0 + i) : T(0);
            }
            const int total = mpiml_bt_rank<PER>(key, q, cnt, wk, red);
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                if (key[j] != MPIML_BT_NONE) {
                    scol[q[j]] = (unsigned short)key[j];
                    srow[q[j]] = row[j];
                    sval[q[j]] = val[j];
                }
            }
            __syncthreads();
            for (int i = t; i < total; i += nt) {                          // each column's run after its last
                const int cc = scol[i];
                const int g = bs + cur[cc] + (i - int(cnt[cc]));
                rows_t[g] = srow[i];
                data_t[g] = sval[i];
            }
            __syncthreads();
            for (int c = t; c < wk; c += nt) cur[c] += (c + 1 < wk ? int(cnt[c + 1]) : total) - int(cnt[c]);
            __syncthreads();
        }
    }
}

// mpiml_normal<T>:  n standard normal values from a seed (the randomized SVD's random matrix when no random_state is
//   given), a pair at a time: pair p takes the 64 bits of splitmix64 at counter p of the mixed seed, two 32-bit
//   uniforms of them, and Box-Muller in double.  Counter-based: the same values on every device for a seed, nothing
//   to set up (a cuRAND generator allocates, and frees with a synchronisation, its state every fit).
__device__ __forceinline__ unsigned long long mpiml_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void __launch_bounds__(MPIML_SPARSE_THREADS)
mpiml_normal(const unsigned long long seed, const long long n, T* __restrict__ out) {
    const unsigned long long base = mpiml_mix64(seed + 0x9e3779b97f4a7c15ull);
    const long long pairs = (n + 1) / 2;
    const long long stride = (long long)gridDim.x * MPIML_SPARSE_THREADS;
    for (long long p = (long long)blockIdx.x * MPIML_SPARSE_THREADS + threadIdx.x; p < pairs; p += stride) {
        const unsigned long long h = mpiml_mix64(base + (unsigned long long)(p + 1) * 0x9e3779b97f4a7c15ull);
        const double u1 = (double(h >> 32) + 1.0) * (1.0 / 4294967296.0);           // (0, 1]
        const double u2 = double(h & 0xffffffffull) * (1.0 / 4294967296.0);       // [0, 1)
        const double r = sqrt(-2.0 * log(u1));
        double s, c;
        sincospi(2.0 * u2, &s, &c);
        out[2 * p] = T(r * c);
        if (2 * p + 1 < n) out[2 * p + 1] = T(r * s);
    }
}
