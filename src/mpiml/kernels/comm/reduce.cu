// Reductions to one rank or to parts: reduce, scan, reduce_scatter (argument
// layout as in allreduce.cu; n counts elements).

// Reduce: copy in, barrier, the root reduces every rank's packs in rank order.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_reduce_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    mpiml_stage_in<T, A>(c, epoch, in, n);
    if (mpiml_barrier(c, epoch, 0) && c->rank == root) {
        MPIML_GRID_LOOP(i, mpiml_units<T>(n))
            mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, (int)c->nranks));
    }
    mpiml_end(c, epoch);
}

// Scan (extra = 0) or exclusive scan (extra = 1): rank r reduces ranks 0..r (0..r-1).
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_scan_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long exclusive) {
    const unsigned epoch = mpiml_begin(c);
    mpiml_stage_in<T, A>(c, epoch, in, n);
    const int upto = (int)c->rank + (exclusive ? 0 : 1);
    if (mpiml_barrier(c, epoch, 0) && upto > 0) {
        MPIML_GRID_LOOP(i, mpiml_units<T>(n)) mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, upto));
    }
    mpiml_end(c, epoch);
}

// The largest part, in packs of 16 bytes: the distance between two sources'
// copies of a part in a receiver's buffer (reduce-scatter below).
template <typename T>
__device__ __forceinline__ long long mpiml_part_stride(const long long* displs, int nr) {
    constexpr int L = MpimlPack<T>::L;
    long long m = 0;
    for (int r = 0; r < nr; ++r) m = max(m, (displs[r + 1] - displs[r] + L - 1) / L);
    return m;
}

// Reduce-scatter with parts given by displs (device array of nranks + 1 element
// offsets), pushed: every rank writes part r of its input into rank r's buffer
// at [me * stride], barrier, then rank r reduces the sources' copies of its part
// from its own memory (local loads only) into out. Pack i of every part is
// handled by the same (block, thread) on every rank (the grid is agreed), so a
// block's barrier covers what it reads. A: in and out 16-byte aligned and every
// part starts on a 16-byte boundary. The host keeps nranks * stride packs
// within one staging buffer.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_reduce_scatter_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long displs_ptr) {
    constexpr int L = MpimlPack<T>::L;
    const long long* displs = reinterpret_cast<const long long*>(displs_ptr);
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long stride = mpiml_part_stride<T>(displs, nr);
    mpiml_push_parts<T, A>(c, epoch, in, stride, [=](int r, long long& d, long long& len) {
        d = displs[r];
        len = displs[r + 1] - d;
    });
    if (mpiml_barrier(c, epoch, 0)) {
        const long long len = displs[me + 1] - displs[me];
        const MpimlPack<T>* src = mpiml_packs<T>(c, me, epoch);
        MPIML_GRID_LOOP(i, (len + L - 1) / L)
            mpiml_store_user<T, A>(out, i, len, mpiml_reduce_strided<T, OP>(src, stride, i, nr));
    }
    mpiml_end(c, epoch);
}

// LL reduce-scatter (no barrier): every rank pushes the lines of part r into
// rank r's LL slot [me]; each reduces the lines of its own part, in rank order,
// as their flags arrive. A: in and out 8-byte aligned and every part starts on an
// 8-byte boundary. The host keeps every part within one LL slot's payload.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_scatter_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long displs_ptr) {
    const long long* displs = reinterpret_cast<const long long*>(displs_ptr);
    const unsigned epoch = mpiml_begin(c);
    const unsigned flag = epoch + 1u;
    const int nr = (int)c->nranks, me = (int)c->rank;
    for (int k = 1; k <= nr; ++k) {
        const int r = (me + k) % nr;
        const long long d = displs[r];
        const long long nbytes = (displs[r + 1] - d) * (long long)sizeof(T);
        uint4* dst = mpiml_ll_slot(c, r, epoch, me);
        MPIML_GRID_LOOP(i, (nbytes + 7) / 8) mpiml_ll_store(dst + i, mpiml_ll_get<A>(in + d, i, nbytes), flag);
    }
    mpiml_ll_reduce_out<T, OP, A>(c, epoch, flag, out, (displs[me + 1] - displs[me]) * (long long)sizeof(T));
    mpiml_end<false>(c, epoch);
}

// LL reduce (see allreduce.cu's mpiml_allreduce_ll): every other rank pushes its lines
// into the root's slot [me]; the root reduces them in rank order with its own input's
// line, which it never stores into its own slot: its loads of the peers' slots go out
// at once, not after a store (one memory latency less a call). The same thread reads
// in[i] and writes out[i]: in == out is safe.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    const int me = (int)c->rank;
    if (me != root) {
        MPIML_GRID_LOOP(i, ln.lines) mpiml_ll_store(mpiml_ll_slot(c, (int)root, ln.epoch, me) + i, ln.get(in, i), ln.flag);
    } else {
        bool ok = true;
        MPIML_GRID_LOOP(i, ln.lines) {
            const uint2 v = mpiml_ll_reduce_line<T, OP>(c, ln.epoch, ln.flag, i, ok, nullptr, 0, me, ln.get(in, i));
            if (!ok) break;
            mpiml_ll_put<A>(out, i, ln.nbytes, v);
        }
    }
    mpiml_end<false>(c, ln.epoch);
}

// Two-shot reduce (reduce-scatter + gather, both pushed): as the two-shot
// allreduce (allreduce.cu), but the reduced parts go to the root alone, at
// nranks * part + [r * part] of its buffer, and only the root writes out. The
// host keeps 2 * nranks * part packs within one staging buffer.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_reduce_twoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long units = mpiml_units<T>(n);
    const long long part = (units + nr - 1) / nr;
    mpiml_push_parts<T, A>(c, epoch, in, part, MpimlEvenParts<T>{n, part});
    if (mpiml_barrier(c, epoch, 0)) {
        const MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
        MpimlPack<T>* at_root = mpiml_packs<T>(c, (int)root, epoch) + nr * part;
        MPIML_GRID_LOOP(i, part) {
            const long long idx = me * part + i;
            if (idx < units) {
                const MpimlPack<T> v = mpiml_reduce_strided<T, OP>(mine, part, i, nr);
                if (me == root) mpiml_store_user<T, A>(out, idx, n, v);
                else at_root[idx] = v;
            }
        }
        if (mpiml_barrier(c, epoch, 1) && me == root) {
            MPIML_GRID_LOOP(i, part) mpiml_parts_out<T, A>(nr, me, mine + nr * part, part, units, i, out, n);
        }
    }
    mpiml_end(c, epoch);
}

// LL relay reduce (no barrier): the lines are cut into q = nranks - 1 parts of `part`
// lines, part j owned by the non-root o = (root + 1 + j) % nranks (the parts of a
// bcast's LL two-shot, mirrored). Every other rank s pushes line j * part + i of its
// input into the owner's region (mpiml_ll_region) at [((s - o - 1) mod nranks) * part + i];
// the owner reduces the nranks lines of its line i in rank order (its own from its input)
// as they arrive (bit-identical to the other kernels) and pushes the result into the
// root's region at [j * part + i]; the root copies the reduced lines out as they arrive.
// The root's links carry n bytes of payload each way (the two-shot's reduce-scatter and
// gather: 1.5 n into the root at 4 ranks), every owner's n in and n out. Line i of every
// part is handled by grid index i on every rank, and every wait depends only on the same
// grid index of ranks that pushed before they waited. The host keeps q * part lines
// within the region (an owner's copies; the root's reduced parts) and launches one grid
// index per line of a part, at 2 ranks or more. A counts 8-byte alignment; only the root
// writes out, line g after it read in[g] (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll_relay_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                      int root) {
    typedef typename MpimlAcc<T>::type Acc;
    constexpr int L = 8 / sizeof(T);
    union Line { uint2 v; T e[L]; };
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    const int nr = (int)c->nranks, me = (int)c->rank, q = nr - 1;
    const int jm = me == root ? -1 : (me - root - 1 + nr) % nr;  // this rank's part (-1: the root's none)
    const long long part = (ln.lines + q - 1) / q;
    const uint4* mine = mpiml_ll_region(c, me, ln.epoch);
    bool ok = true;
    MPIML_GRID_LOOP(i, part) {  // every line of this thread pushed first, all its rounds (a push never waits)
        for (int jj = 1; jj <= q; ++jj) {  // the other owners' parts; an owner's own part stays here
            const int j = jm < 0 ? jj - 1 : (jm + jj) % q;
            if (j == jm) continue;
            const int o = (root + 1 + j) % nr;
            const long long g = j * part + i;
            if (g < ln.lines)
                mpiml_ll_store(mpiml_ll_region(c, o, ln.epoch) + ((me - o - 1 + nr) % nr) * part + i, ln.get(in, g),
                               ln.flag);
        }
    }
    MPIML_GRID_LOOP(i, part) {
        if (jm >= 0) {
            const long long g = jm * part + i;
            if (g < ln.lines) {
                // the other ranks' lines (rank (me + 1 + k) % nr at [k * part + i]) loaded at once, then waited for
                uint4 w[MPIML_MAX_RANKS];
#pragma unroll
                for (int k = 0; k < MPIML_MAX_RANKS - 1; ++k) {
                    if (k < q) {
                        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                                     : "=r"(w[k].x), "=r"(w[k].y), "=r"(w[k].z), "=r"(w[k].w)
                                     : "l"(mine + k * part + i) : "memory");
                    }
                }
                uint2 got[MPIML_MAX_RANKS];
                got[me] = ln.get(in, g);
#pragma unroll
                for (int k = 0; k < MPIML_MAX_RANKS - 1; ++k) {
                    if (k < q && ok) {
                        const int r = (me + 1 + k) % nr;
                        if (w[k].y == ln.flag && w[k].w == ln.flag)
                            got[r] = make_uint2(w[k].x, w[k].z);
                        else
                            ok = mpiml_ll_load(c, mine + k * part + i, ln.flag, got[r], r, ln.epoch);
                    }
                }
                if (!ok) break;
                Acc acc[L];
                Line res;
#pragma unroll
                for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
                    if (r < nr) {
                        Line x;
                        x.v = got[r];
#pragma unroll
                        for (int k = 0; k < L; ++k) {
                            const Acc v = MpimlAcc<T>::load(x.e[k]);
                            acc[k] = r == 0 ? v : MpimlOp<OP>::f(acc[k], v);
                        }
                    }
                }
#pragma unroll
                for (int k = 0; k < L; ++k) res.e[k] = MpimlAcc<T>::store(acc[k]);
                mpiml_ll_store(mpiml_ll_region(c, root, ln.epoch) + g, res.v, ln.flag);
            }
        } else {
            for (int j = 0; j < q && ok; ++j) {
                const long long g = j * part + i;
                if (g < ln.lines) {
                    uint2 v;
                    ok = mpiml_ll_load(c, mine + g, ln.flag, v, (root + 1 + j) % nr, ln.epoch);
                    if (ok) mpiml_ll_put<A>(out, g, ln.nbytes, v);
                }
            }
            if (!ok) break;
        }
    }
    mpiml_end<false>(c, ln.epoch);
}

// LL128 relay reduce (algorithm ll128): mpiml_ll_relay_reduce's protocol in LL128 lines
// (ipc_common.cuh: 120 payload bytes in 128), so the root receives 1.07 n bytes, not 2 n. A
// warp holds 4 lines (8 lanes each) a round, every warp of every rank the same ones, and pushes
// the lines of all its rounds before it waits for any. The region is the
// staging buffer of the call's parity (mpiml_buf: see the LL128 lines in ipc_common.cuh); the
// host keeps q * part lines within it (cap / 128 of them). A counts 8-byte alignment; only the
// root writes out, words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_relay_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                         int root) {
    const long long nbytes = n * (long long)sizeof(T);
    const long long lines = ((nbytes + 7) / 8 + MPIML_LL128_WORDS - 1) / MPIML_LL128_WORDS;
    const unsigned epoch = mpiml_begin(c);
    const unsigned long long flagword = mpiml_ll128_flag(epoch);
    const int nr = (int)c->nranks, me = (int)c->rank, q = nr - 1;
    const int jm = me == root ? -1 : (me - root - 1 + nr) % nr;  // this rank's part (-1: the root's none)
    const long long part = (lines + q - 1) / q;
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    auto region = [&](int r) { return reinterpret_cast<ulonglong2*>(mpiml_buf(c, r, epoch)); };
    const ulonglong2* mine = region(me);
    // every line of this warp pushed first, all its rounds (a push never waits)
    for (long long base = 4 * warp; base < part; base += 4 * warps) {  // warp-uniform
        const long long i = base + (lane >> 3);
        const bool act = i < part;
        for (int jj = 1; jj <= q; ++jj) {  // the other owners' parts; an owner's own part stays here
            const int j = jm < 0 ? jj - 1 : (jm + jj) % q;
            if (j == jm) continue;
            const int o = (root + 1 + j) % nr;
            const long long g = j * part + i;
            const ulonglong2 v = mpiml_ll128_get<A>(in, g, sub, nbytes, flagword);
            __syncwarp();
            if (act && g < lines) mpiml_ll128_store(region(o) + 8 * (((me - o - 1 + nr) % nr) * part + i) + sub, v);
        }
    }
    if (jm >= 0) {  // an owner: its part reduced as the copies arrive, pushed to the root
        for (long long base = 4 * warp; base < part; base += 4 * warps) {
            const long long i = base + (lane >> 3);
            const long long g = jm * part + i;
            const bool mact = i < part && g < lines;
            ulonglong2 v[MPIML_MAX_RANKS];  // rank (me + 1 + k) % nr's copy at [k * part + i]
            if (!mpiml_ll128_wait(c, epoch, mine + 8 * i + sub, 8 * part, q, mact, flagword, v)) break;
            const ulonglong2 own = mpiml_ll128_get<A>(in, g, sub, nbytes, flagword);
            unsigned long long wx[MPIML_MAX_RANKS], wy[MPIML_MAX_RANKS];
#pragma unroll
            for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
                if (r < nr) {
                    const ulonglong2 u = r == me ? own : v[(r - me - 1 + nr) % nr];
                    wx[r] = u.x;
                    wy[r] = u.y;
                }
            }
            ulonglong2 red;
            red.x = mpiml_fold_words<T, OP>(wx, nr);
            red.y = sub == 7 ? flagword : mpiml_fold_words<T, OP>(wy, nr);
            __syncwarp();
            if (mact) mpiml_ll128_store(region(root) + 8 * g + sub, red);
        }
    } else {  // the root: the reduced lines out as they arrive
        bool ok = true;
        for (long long base = 4 * warp; ok && base < part; base += 4 * warps) {
            const long long i = base + (lane >> 3);
            const bool act = i < part;
            for (int j = 0; j < q && ok; ++j) {  // warp-uniform: j and ok are the same on every lane
                const long long g = j * part + i;
                const bool gact = act && g < lines;
                ulonglong2 u[MPIML_MAX_RANKS];
                ok = mpiml_ll128_wait(c, epoch, mine + 8 * g + sub, 0, 1, gact, flagword, u);
                if (ok && gact) mpiml_ll128_put<A>(out, g, sub, nbytes, u[0]);
            }
        }
    }
    mpiml_end<false>(c, epoch);
}

// LL two-shot reduce (no barrier): see mpiml_ll_twoshot_reduce (ipc_common.cuh); the
// reduced parts go to the root alone.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_lltwoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    mpiml_ll_twoshot_reduce<T, OP, A>(c, in, out, n, (int)root);
}

// The LL relay reduce (algorithm llrelay): see mpiml_ll_relay_reduce above. A kernel of its
// own, so that its registers do not weigh on the LL two-shot's.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_llrelay(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    mpiml_ll_relay_reduce<T, OP, A>(c, in, out, n, (int)root);
}

// The LL128 relay reduce (algorithm ll128): see mpiml_ll128_relay_reduce above.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    mpiml_ll128_relay_reduce<T, OP, A>(c, in, out, n, (int)root);
}

// Pipelined reduce (no barrier): see mpiml_pipe (ipc_common.cuh); the non-roots reduce a part
// each and store it into the root's buffer, step by step. extra = (S << 4) | root.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_reduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 1>(c, in, out, n, extra);
}
