// mpiml_distances_small (whole rows in registers, centres as parameters or in a constant bank) and
// mpiml_small_bank_pack.
// Part of the k-means tensor-core program: the loader compiles tc_common.cuh, tc.cu, sums.cu, small.cu and
// small_tc.cu as one source, in that order (kmeans/_common.py TC_FILES); the family is described at the
// head of tc_common.cuh.

// The arg-min (MODE 0) or the whole local Lloyd step (MODE 1) for small d and k: see the head of tc_common.cuh.
// R rows a thread (rows tid + 256 r of a tile of 256 R): every broadcast load of a centre feeds R rows, since
// shared memory delivers 128 bytes a cycle to the lanes, a quarter of what the FMA units take.
// Shared memory, in this order (every part a multiple of 16 bytes; kmeans/_small.py small_plan mirrors it):
// MODE 1: tot [KP x DP + KP] float64 (A = float only), acc [COPIES][KP x DP] A, cnt [WARPS][KP] A;
// then xbuf [STAGES][256 R x SX] T, cs [KP x DP] T, csq [KP] T, sh [DP] T;
// MODE 1: w_s [STAGES][256 R] T, ol_s [STAGES][256 R] int (previous labels), lab_s [256 R] int.
template <typename T, int N>
struct mpiml_small_centres {
    T v[N];
};

// CB: the small kernel's [centres KP x DP | norms KP] in constant memory, written by a device-to-device copy
// queued on the stream before each launch (kmeans/_small.py _small_bank_fill), for centres that are on the device:
// the FMAs read them as constant-bank operands as they read parameters, and the host waits for nothing.  One
// bank per module, that is per instantiation and device; each fill waits for its last use (an event).
__constant__ __align__(16) float mpiml_small_bank_f[32 * 32 + 32];
__constant__ __align__(16) double mpiml_small_bank_d[32 * 32 + 32];

template <typename T> __device__ __forceinline__ T mpiml_small_bank(int i);
template <> __device__ __forceinline__ float mpiml_small_bank<float>(int i) { return mpiml_small_bank_f[i]; }
template <> __device__ __forceinline__ double mpiml_small_bank<double>(int i) { return mpiml_small_bank_d[i]; }

// The bank's contents from k x d centres C (contiguous): zero padded to KP x DP, the squared norms summed
// feature by feature in float64 without contraction (the host's np.add.accumulate of float64 squares: the
// parameters' bits) and rounded to T, +inf past k.  One block.
template <typename T>
__global__ void mpiml_small_bank_pack(const T* __restrict__ C, int k, int d, int KP, int DP, T* __restrict__ out)
{
    for (int i = threadIdx.x; i < KP * DP + KP; i += blockDim.x) {
        if (i < KP * DP) {
            const int c = i / DP, f = i % DP;
            out[i] = (c < k && f < d) ? C[(long long)c * d + f] : T(0);
        } else {
            const int c = i - KP * DP;
            double s = 0.0;
            for (int f = 0; f < d; ++f) {
                const double v = (double)C[(long long)c * d + f];
                s = __dadd_rn(s, __dmul_rn(v, v));
            }
            out[i] = c < k ? (T)s : mpiml_tc<T>::inf();
        }
    }
}

template <typename T, typename A, int DP, int KP, int VEC, int MODE, int STAGES, int R, bool PC, bool CB = false>
__global__ void __launch_bounds__(MPIML_TC_THREADS, R == 1 && (sizeof(T) == 4 || DP <= 16) ? 2 : 1)
mpiml_distances_small(const T* __restrict__ X, long long n, int d, const T* __restrict__ shift,
                      const T* __restrict__ C, int k, const T* __restrict__ w, int* __restrict__ labels,
                      T* __restrict__ mind, double* __restrict__ part,
                      const mpiml_small_centres<T, PC && !CB ? KP * DP + KP : 1> pc)
{
    constexpr int THREADS = MPIML_TC_THREADS, WARPS = MPIML_TC_WARPS, BR = MPIML_TC_THREADS * R;
    constexpr int EV = 16 / sizeof(T);                    // values of a 16-byte word
    constexpr int SX = (DP / EV) % 2 ? DP : DP + EV;      // row stride of a staged tile
    constexpr int EC = VEC / sizeof(T);                   // values of one cp.async
    constexpr int CPR = DP / EC;
    // two rows an instruction where a row takes half a warp (its own copy each: no lane of the other half adds
    // to its cells); float64 copies keep one row an instruction (two copies a warp would halve the blocks an SM)
    constexpr bool LLOYD = MODE == 1, NARROW = sizeof(A) == 4, PAIRS = DP <= 16 && NARROW;
    constexpr int HALVES = PAIRS ? 2 : 1, COPIES = WARPS * HALVES;
    constexpr int FLUSH = 4 / R > 0 ? 4 / R : 1;          // tiles between flushes: <= 128 adds a float32 cell
    constexpr int CELLS = KP * DP;
    static_assert(DP % EV == 0 && DP <= 32 && KP % 4 == 0 && KP >= 8 && KP <= 32, "small shapes only");
    static_assert(PC || !CB, "the constant bank replaces the parameters");

    extern __shared__ __align__(16) unsigned char mpiml_tc_smem[];
    unsigned char* p = mpiml_tc_smem;
    double* tot = reinterpret_cast<double*>(p);
    p += (LLOYD && NARROW) ? (CELLS + KP) * sizeof(double) : 0;
    A* acc = reinterpret_cast<A*>(p);
    p += LLOYD ? COPIES * CELLS * sizeof(A) : 0;
    A* cnt = reinterpret_cast<A*>(p);
    p += LLOYD ? WARPS * KP * sizeof(A) : 0;
    T* xbuf = reinterpret_cast<T*>(p);
    T* cs = xbuf + STAGES * BR * SX;
    T* csq = cs + CELLS;
    T* sh = csq + KP;
    T* w_s = sh + DP;
    int* ol_s = reinterpret_cast<int*>(w_s + (LLOYD ? STAGES * BR : 0));
    int* lab_s = ol_s + STAGES * BR;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const long long n_tiles = (n + BR - 1) / BR;
    const long long my_tiles = blockIdx.x < n_tiles ? (n_tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;

    // a tile of rows (and, MODE 1, their weights and previous labels) into buffer i % STAGES
    auto stage = [&](long long i) {
        const int b = (int)(i % STAGES);
        const long long r0 = (blockIdx.x + i * gridDim.x) * BR;
        T* xd = xbuf + b * BR * SX;
        for (int e = tid; e < BR * CPR; e += THREADS) {
            const int r = e / CPR, f = (e % CPR) * EC;
            const long long row = r0 + r;
            const bool ok = row < n && f < d;
            mpiml_cp_async<VEC>(xd + r * SX + f, ok ? X + row * d + f : X, ok);
        }
        if constexpr (LLOYD) {
            for (int r = tid; r < BR; r += THREADS) {
                const long long row = r0 + r;
                const bool ok = row < n;
                mpiml_cp_async<4>(ol_s + b * BR + r, ok ? labels + row : labels, ok);
                mpiml_cp_async<sizeof(T)>(w_s + b * BR + r, ok ? w + row : w, ok);
            }
        }
    };
    mpiml_tiles_start<STAGES>(my_tiles, stage);

    // the centres (zero past k and d; PC: C is null, the centres are parameters), the shift, the copies
    if constexpr (!PC) {
        for (int i = tid; i < CELLS; i += THREADS) {
            const int c = i / DP, f = i % DP;
            cs[i] = (c < k && f < d) ? C[(long long)c * d + f] : T(0);
        }
    }
    for (int f = tid; f < DP; f += THREADS) sh[f] = (shift != nullptr && f < d) ? shift[f] : T(0);
    if constexpr (LLOYD) {
        for (int i = tid; i < COPIES * CELLS; i += THREADS) acc[i] = A(0);
        for (int i = tid; i < WARPS * KP; i += THREADS) cnt[i] = A(0);
        if constexpr (NARROW) {
            for (int i = tid; i < CELLS + KP; i += THREADS) tot[i] = 0.0;
        }
    }
    __syncthreads();
    for (int c = tid; c < (PC ? 0 : KP); c += THREADS) {
        T v = mpiml_tc<T>::inf();                         // past k: never nearer than a real centre
        if (c < k) {
            v = T(0);
#pragma unroll
            for (int f = 0; f < DP; ++f) v = fma(cs[c * DP + f], cs[c * DP + f], v);
        }
        csq[c] = v;
    }
    const bool shifted = shift != nullptr;

    // the float32 copies into the float64 total, cell by cell in copy order (every thread, after a barrier)
    auto flush = [&]() {
        __syncthreads();
        for (int i = tid; i < CELLS + KP; i += THREADS) {
            double v = tot[i];
            A* src = i < CELLS ? acc + i : cnt + (i - CELLS);
            const int stride = i < CELLS ? CELLS : KP;
#pragma unroll
            for (int q = 0; q < (i < CELLS ? COPIES : WARPS); ++q) {
                v += (double)src[q * stride];
                src[q * stride] = A(0);
            }
            tot[i] = v;
        }
    };

    // NV (label, value) pairs of this lane into column f of its warp's copy (label < 0: nothing), four
    // independent read-modify-writes where the four labels differ, else one after the other
    auto add_column = [&](A* col, const int (&lab)[16], const A (&val)[16]) {
#pragma unroll
        for (int u = 0; u < 16; u += 4) {
            const int l0 = lab[u], l1 = lab[u + 1], l2 = lab[u + 2], l3 = lab[u + 3];
            if ((l0 | l1 | l2 | l3) >= 0 && l0 != l1 && l0 != l2 && l0 != l3 && l1 != l2 && l1 != l3 && l2 != l3) {
                const A x0 = col[l0 * DP], x1 = col[l1 * DP], x2 = col[l2 * DP], x3 = col[l3 * DP];
                col[l0 * DP] = x0 + val[u];
                col[l1 * DP] = x1 + val[u + 1];
                col[l2 * DP] = x2 + val[u + 2];
                col[l3 * DP] = x3 + val[u + 3];
            } else {
#pragma unroll
                for (int q = u; q < u + 4; ++q)
                    if (lab[q] >= 0) col[lab[q] * DP] += val[q];
            }
        }
    };

    double my_inertia = 0.0;
    long long my_changed = 0;
    int since = 0;
    for (long long i = 0; i < my_tiles; ++i) {
        mpiml_tiles_next<STAGES>(i, my_tiles, stage);
        const int b = (int)(i % STAGES);
        const T* xt = xbuf + b * BR * SX;
        const long long row0 = (blockIdx.x + i * gridDim.x) * BR + tid;

        // this thread's rows, shifted, and their squared norms
        T x[R][DP], xsq[R];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const T* xr = xt + (tid + rr * THREADS) * SX;
#pragma unroll
            for (int f = 0; f < DP; f += EV) {
                if constexpr (sizeof(T) == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(xr + f);
                    x[rr][f] = v.x; x[rr][f + 1] = v.y; x[rr][f + 2] = v.z; x[rr][f + 3] = v.w;
                } else {
                    const double2 v = *reinterpret_cast<const double2*>(xr + f);
                    x[rr][f] = v.x; x[rr][f + 1] = v.y;
                }
            }
            if (shifted) {
#pragma unroll
                for (int f = 0; f < DP; ++f) x[rr][f] -= sh[f];
            }
            xsq[rr] = T(0);
#pragma unroll
            for (int f = 0; f < DP; ++f) xsq[rr] = fma(x[rr][f], x[rr][f], xsq[rr]);
        }

        // ||c||^2 - 2 x.c for every centre, four at a time; ties keep the lower index
        T best[R];
        int bj[R];
#pragma unroll
        for (int rr = 0; rr < R; ++rr) { best[rr] = mpiml_tc<T>::inf(); bj[rr] = 0; }
#pragma unroll
        for (int j = 0; j < KP; j += 4) {
            T dot[4][R];
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int rr = 0; rr < R; ++rr) dot[q][rr] = T(0);
#pragma unroll
            for (int f = 0; f < DP; f += EV) {
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const T* c = cs + (j + q) * DP + f;
                    if constexpr (PC) {
                        // the centres are kernel parameters: constant-bank operands of the FMAs, no loads
#pragma unroll
                        for (int e = 0; e < EV; ++e) {
                            T cv;
                            if constexpr (CB) cv = mpiml_small_bank<T>((j + q) * DP + f + e);
                            else cv = pc.v[(j + q) * DP + f + e];
#pragma unroll
                            for (int rr = 0; rr < R; ++rr) dot[q][rr] = fma(x[rr][f + e], cv, dot[q][rr]);
                        }
                    } else if constexpr (sizeof(T) == 4) {
                        const float4 v = *reinterpret_cast<const float4*>(c);
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
                            dot[q][rr] = fma(x[rr][f], v.x, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 1], v.y, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 2], v.z, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 3], v.w, dot[q][rr]);
                        }
                    } else {
                        const double2 v = *reinterpret_cast<const double2*>(c);
#pragma unroll
                        for (int rr = 0; rr < R; ++rr) {
                            dot[q][rr] = fma(x[rr][f], v.x, dot[q][rr]);
                            dot[q][rr] = fma(x[rr][f + 1], v.y, dot[q][rr]);
                        }
                    }
                }
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                T cq;
                if constexpr (CB) cq = mpiml_small_bank<T>(KP * DP + j + q);
                else cq = PC ? pc.v[KP * DP + j + q] : csq[j + q];
#pragma unroll
                for (int rr = 0; rr < R; ++rr) {
                    const T dist = fma(T(-2), dot[q][rr], cq);
                    if (dist < best[rr]) { best[rr] = dist; bj[rr] = j + q; }
                }
            }
        }

#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const long long row = row0 + rr * THREADS;
            T dist = best[rr] + xsq[rr];
            dist = dist > T(0) ? dist : T(0);
            if constexpr (!LLOYD) {
                if (row < n) { labels[row] = bj[rr]; mind[row] = dist; }
            } else {
                const int r = tid + rr * THREADS;
                int lab = -1;
                if (row < n) {
                    const T wt = w_s[b * BR + r];
                    my_changed += ol_s[b * BR + r] != bj[rr];
                    my_inertia += (double)wt * (double)dist;
                    atomicAdd(&cnt[warp * KP + bj[rr]], (A)wt);
                    labels[row] = bj[rr];
                    mind[row] = dist;
                    lab = bj[rr];
                }
                lab_s[r] = lab;
            }
        }
        if constexpr (LLOYD) {
            __syncwarp();
            // the warp's rows into its copies, lane = feature: values and labels first (the adds may alias
            // them as far as the compiler knows), then the adds
            A* mine = acc + warp * HALVES * CELLS;
#pragma unroll
            for (int rr = 0; rr < R; ++rr) {
                const int rb = rr * THREADS + warp * 32;
                const int* lw = lab_s + rb;
                const T* xw = xt + rb * SX;
                const T* ww = w_s + b * BR + rb;
                if constexpr (PAIRS) {
                    // two rows an instruction: lanes 16 h + f take row 2 q + h into copy h
                    const int h = lane >> 4, f = lane & 15;
                    const bool on = f < DP;
                    const T shf = on ? sh[f] : T(0);
                    int lab[16];
                    A val[16];
#pragma unroll
                    for (int q = 0; q < 16; ++q) {
                        const int r = 2 * q + h;
                        lab[q] = on ? lw[r] : -1;
                        val[q] = on ? (A)(xw[r * SX + f] - shf) * (A)ww[r] : A(0);
                    }
                    add_column(mine + h * CELLS + (on ? f : 0), lab, val);
                } else {
                    const int f = lane;
                    const bool on = f < DP;
                    const T shf = on ? sh[f] : T(0);
#pragma unroll
                    for (int half = 0; half < 32; half += 16) {
                        int lab[16];
                        A val[16];
#pragma unroll
                        for (int q = 0; q < 16; ++q) {
                            const int r = half + q;
                            lab[q] = on ? lw[r] : -1;
                            val[q] = on ? (A)(xw[r * SX + f] - shf) * (A)ww[r] : A(0);
                        }
                        add_column(mine + (on ? f : 0), lab, val);
                    }
                }
            }
            if constexpr (NARROW) {
                if (++since == FLUSH) {
                    since = 0;
                    flush();                              // the next adds come after the next tile's barrier
                }
            }
        }
    }
    mpiml_cp_wait<0>();
    if constexpr (LLOYD) {
        if constexpr (NARROW) flush();
        __syncthreads();
        // [sums (k x d) | weights (k) | inertia | changed] of this block, summed in block order by the caller
        const long long P = (long long)k * d + k + 2;
        double* out = part + (long long)blockIdx.x * P;
        for (int i = tid; i < k * d + k; i += THREADS) {
            const int cell = i < k * d ? (i / d) * DP + i % d : CELLS + (i - k * d);
            double v;
            if constexpr (NARROW) {
                v = tot[cell];
            } else {
                v = 0.0;
                const A* src = cell < CELLS ? acc + cell : cnt + (cell - CELLS);
                const int stride = cell < CELLS ? CELLS : KP;
                for (int q = 0; q < (cell < CELLS ? COPIES : WARPS); ++q) v += (double)src[q * stride];
            }
            out[i] = v;
        }
        mpiml_block_totals(my_inertia, my_changed, out + P - 2);
    }
}
