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
                mpiml_ll_store(mpiml_ll_region(c, root, ln.epoch) + g, mpiml_fold_elems<T, OP, 8 / sizeof(T)>(got, nr),
                               ln.flag);
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

// The reducing rounds of an LL128 reduce's warp: line i < count of this rank's region, with the other ranks'
// copies of it at [k * stride + i] (rank (me + 1 + k) % nranks's, k < nranks - 1), reduced with this rank's own
// input's line g0 + i in rank order as the copies arrive (mpiml_ll128_fold_own); emit(g, red, act) takes the
// result of line g (act: the line exists; called on every lane of the warp). The relay's owners and the direct
// reduce's root.
template <typename T, int OP, bool A, typename Emit>
__device__ __forceinline__ void mpiml_ll128_reduce_own(const MpimlLL128& ll, const T* in, long long count, long long g0,
                                                       long long stride, Emit emit) {
    const int nr = (int)ll.c->nranks, me = (int)ll.c->rank;
    const ulonglong2* mine = ll.region(me);
    MPIML_LL128_ROUNDS(ll, base, count) {
        const long long i = ll.line(base);
        const long long g = g0 + i;
        const bool act = i < count && g < ll.lines;
        const ulonglong2 own = mpiml_ll128_get<A>(in, g, ll.sub, ll.nbytes, ll.flagword);
        ulonglong2 v[MPIML_MAX_RANKS];
        if (!mpiml_ll128_wait(ll.c, ll.epoch, mine + 8 * i + ll.sub, 8 * stride, nr - 1, act, ll.flagword, v)) break;
        emit(g, mpiml_ll128_fold_own<T, OP>(v, own, me, nr, ll.sub, ll.flagword), act);
    }
}

// LL128 relay reduce (algorithm ll128): mpiml_ll_relay_reduce's protocol in LL128 lines
// (ipc_common.cuh: 120 payload bytes in 128), so the root receives 1.07 n bytes, not 2 n. A
// warp holds 4 lines (8 lanes each) a round, every warp of every rank the same ones. split
// (MpimlLL128's roles): 0, a warp pushes the lines of all its rounds before it waits for any;
// else the first `split` warps of a block push and the others reduce (an owner) or copy out (the
// root), so that an owner forwards reduced lines while its links still bring the copies of
// later ones. The region is the staging buffer of the call's parity (mpiml_buf: see the LL128
// lines in ipc_common.cuh); the host keeps q * part lines within it (cap / 128 of them). A counts
// 8-byte alignment; only the root writes out, words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_relay_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                         int root, int split) {
    const MpimlLL128 ll(c, n * (long long)sizeof(T), split);
    const int nr = (int)c->nranks, me = (int)c->rank, q = nr - 1, sub = ll.sub;
    const int jm = me == root ? -1 : (me - root - 1 + nr) % nr;  // this rank's part (-1: the root's none)
    const long long part = (ll.lines + q - 1) / q;
    // part j of the input into its owner's region at [((me - owner - 1) mod nranks) * part]: the root every part,
    // an owner the other owners' parts (its own stays here)
    if (ll.pushes) {
        ll.push<A>(in, part, q, [&](int k, long long& g0, ulonglong2*& dst) {
            const int j = jm < 0 ? k - 1 : (jm + k) % q;
            if (j == jm) return false;
            const int o = (root + 1 + j) % nr;
            g0 = j * part;
            dst = ll.region(o) + 8 * (((me - o - 1 + nr) % nr) * part);
            return true;
        });
    }
    if (!ll.waits) {
    } else if (jm >= 0) {  // an owner: its part reduced as the copies arrive, pushed to the root
        ulonglong2* at_root = ll.region(root);
        mpiml_ll128_reduce_own<T, OP, A>(ll, in, part, jm * part, part, [&](long long g, ulonglong2 red, bool act) {
            __syncwarp();
            if (act) mpiml_ll128_store(at_root + 8 * g + sub, red);
        });
    } else {  // the root: the reduced lines out as they arrive, line i of every part waited for at once
        const ulonglong2* mine = ll.region(me);
        MPIML_LL128_ROUNDS(ll, base, part) {
            const long long i = ll.line(base);
            // the parts holding a line i: j * part + i < lines (small calls leave the last parts short or empty)
            const int m = i >= part ? 0 : (int)min((long long)q, (ll.lines - 1 - i) / part + 1);
            ulonglong2 u[MPIML_MAX_RANKS];
            if (!mpiml_ll128_wait(c, ll.epoch, mine + 8 * i + sub, 8 * part, m, m > 0, ll.flagword, u)) break;
#pragma unroll
            for (int j = 0; j < MPIML_MAX_RANKS; ++j)
                if (j < m) mpiml_ll128_put<A>(out, j * part + i, sub, ll.nbytes, u[j]);
        }
    }
    mpiml_end<false>(c, ll.epoch);
}

// LL128 direct reduce (algorithm ll128direct): mpiml_reduce_ll's protocol in LL128 lines. Every
// other rank pushes every line of its input into the root's region at [((me - root - 1) mod nranks) *
// lines + g]; the root reduces the nranks - 1 copies of its line g with its own input's, in rank order
// (the same bits as every other path), as they arrive, and writes it out. One hop where the relay takes
// two, for (nranks - 1) times the root's incoming bytes (1.07 n a rank, against 2 n in LL lines): the
// middle sizes, where a second hop costs more than the bytes. The region is the staging buffer of the
// call's parity; the host keeps (nranks - 1) * lines lines within it (cap / 128 of them) and launches 8
// lanes a line. A counts 8-byte alignment; the root writes out only words it read before (in == out is
// safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_direct_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                          int root) {
    const MpimlLL128 ll(c, n * (long long)sizeof(T));
    const int nr = (int)c->nranks, me = (int)c->rank, sub = ll.sub;
    if (me != root) {
        ll.push<A>(in, ll.lines, 1, [&](int, long long& g0, ulonglong2*& dst) {
            g0 = 0;
            dst = ll.region(root) + 8 * (((me - root - 1 + nr) % nr) * ll.lines);
            return true;
        });
    } else {
        mpiml_ll128_reduce_own<T, OP, A>(ll, in, ll.lines, 0, ll.lines, [&](long long g, ulonglong2 red, bool act) {
            if (act) mpiml_ll128_put<A>(out, g, sub, ll.nbytes, red);
        });
    }
    mpiml_end<false>(c, ll.epoch);
}

// LL128 reduce-scatter (algorithm ll128; no barrier): every rank pushes part r of its input, in LL128 lines,
// into rank r's region (the staging buffer of the call's parity) at [((me - r - 1) mod nranks) * lines_r], lines_r
// the lines of part r; rank r reduces the nranks - 1 copies of its line i with its own input's in rank order as
// they arrive (mpiml_ll128_reduce_own: the same bits as every other path) into out. The links carry 1.07 times
// the parts' bytes where the LL reduce-scatter's lines carry twice. Parts by displs (device, nranks + 1 element
// offsets). The host keeps (nranks - 1) * lines_r lines of every part within one staging buffer and launches 8
// lanes a line of the largest part. A: in, out and every part's start 8-byte aligned.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_scatter_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long displs_ptr) {
    const long long* displs = reinterpret_cast<const long long*>(displs_ptr);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const MpimlLL128 call(c, 0);
    // part r of the input as a message of its own (the call's number, flag and lanes)
    auto part = [&](int r) {
        MpimlLL128 p = call;
        p.nbytes = (displs[r + 1] - displs[r]) * (long long)sizeof(T);
        p.lines = ((p.nbytes + 7) / 8 + MPIML_LL128_WORDS - 1) / MPIML_LL128_WORDS;
        return p;
    };
    for (int k = 1; k < nr; ++k) {  // the peers' parts (a push never waits)
        const int r = (me + k) % nr;
        const MpimlLL128 p = part(r);
        ulonglong2* dst = p.region(r) + 8 * (((me - r - 1 + nr) % nr) * p.lines);
        p.push<A>(in + displs[r], p.lines, 1, [&](int, long long& g0, ulonglong2*& d) {
            g0 = 0;
            d = dst;
            return true;
        });
    }
    const MpimlLL128 mine = part(me);
    mpiml_ll128_reduce_own<T, OP, A>(mine, in + displs[me], mine.lines, 0, mine.lines,
                                     [&](long long g, ulonglong2 red, bool act) {
                                         if (act) mpiml_ll128_put<A>(out, g, mine.sub, mine.nbytes, red);
                                     });
    mpiml_end<false>(c, call.epoch);
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

// The LL128 relay reduce (algorithm ll128): see mpiml_ll128_relay_reduce above. extra = (split << 8) | root.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_relay_reduce<T, OP, A>(c, in, out, n, (int)(extra & 255), (int)(extra >> 8));
}

// The LL128 direct reduce (algorithm ll128direct): see mpiml_ll128_direct_reduce above. extra = root (the bits
// above 255, a split, are not used: one hop).
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_ll128direct(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_direct_reduce<T, OP, A>(c, in, out, n, (int)(extra & 255));
}

// The LL128 two-shot reduce (algorithm ll128twoshot): see mpiml_ll128_twoshot_reduce (ipc_common.cuh); every
// rank reduces a part, the root gathers them. extra = (split << 8) | root.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_ll128twoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_twoshot_reduce<T, OP, A>(c, in, out, n, (int)(extra & 255), (int)(extra >> 8));
}

// Pipelined reduce (no barrier): see mpiml_pipe (ipc_common.cuh); the non-roots reduce a part
// each and store it into the root's buffer, step by step. extra = (S << 4) | root.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_reduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 1>(c, in, out, n, extra);
}
