// Allreduce through the IPC workspace (see ipc_common.cuh for the protocol).
//
// Every kernel takes (ctx, in, out, n, extra) with n counted in elements, so
// the host launches all of them through one argument layout. T is the element
// type, OP the reduction (0 sum, 1 prod, 2 min, 3 max), A whether in and out
// are 16-byte aligned.

// One-shot: copy in, barrier, every rank reduces all packs from all peers.
// Reads n * nranks over the links: best for small messages.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const unsigned epoch = mpiml_begin(c);
    mpiml_stage_in<T, A>(c, epoch, in, n);
    if (mpiml_barrier(c, epoch, 0)) {
        MPIML_GRID_LOOP(i, mpiml_units<T>(n))
            mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, (int)c->nranks));
    }
    mpiml_end(c, epoch);
}

// Two-shot, pushed: the packs are cut into nranks parts of `part` packs; each
// rank's buffer holds the sources' copies of its own part at [s * part] and,
// after them (at nranks * part), every rank's reduced part at [r * part].
//   1. every rank writes part r of its input into rank r's buffer at [me * part];
//   2. barrier; rank r reduces its part from its own memory (local loads only),
//      writes it to out and into every peer's buffer at nranks * part + [r * part];
//   3. barrier; every rank copies the peers' reduced parts from its own memory to out.
// Every link carries stores only (no remote load waits for a reply). Pack
// idx = r * part + i is handled by the same (block, thread) in every phase and on
// every rank, so a block's barriers cover what it reads, and a thread writes
// out[idx] only after it read in[idx] (in == out is safe). The host keeps
// 2 * nranks * part packs within one staging buffer.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_twoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long units = mpiml_units<T>(n);
    const long long part = (units + nr - 1) / nr;
    mpiml_push_parts<T, A>(c, epoch, in, part, MpimlEvenParts<T>{n, part});
    if (mpiml_barrier(c, epoch, 0)) {
        const MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
        MPIML_GRID_LOOP(i, part) {
            const long long idx = me * part + i;
            if (idx < units) {
                const MpimlPack<T> v = mpiml_reduce_strided<T, OP>(mine, part, i, nr);
                for (int k = 1; k < nr; ++k)
                    mpiml_packs<T>(c, (me + k) % nr, epoch)[nr * part + idx] = v;
                mpiml_store_user<T, A>(out, idx, n, v);
            }
        }
        if (mpiml_barrier(c, epoch, 1)) {
            MPIML_GRID_LOOP(i, part) mpiml_parts_out<T, A>(nr, me, mine + nr * part, part, units, i, out, n);
        }
    }
    mpiml_end(c, epoch);
}

// LL one-shot (no barrier): every rank pushes its lines into every peer's slot
// [me], then reduces the slots in rank order 0..n-1 as their flags arrive, its
// own input's line in its own place (never stored into its own slot and loaded
// back). A counts 8-byte alignment here (lines are 8 bytes of payload). The same
// thread handles line i in both loops, so in == out is safe.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    const int me = (int)c->rank;
    mpiml_ll_push(c, ln, in, 1, (int)c->nranks - 1);
    bool ok = true;
    MPIML_GRID_LOOP(i, ln.lines) {
        const uint2 v = mpiml_ll_reduce_line<T, OP>(c, ln.epoch, ln.flag, i, ok, nullptr, 0, me, ln.get(in, i));
        if (!ok) break;
        mpiml_ll_put<A>(out, i, ln.nbytes, v);
    }
    mpiml_end<false>(c, ln.epoch);
}

// LL two-shot allreduce (no barrier): see mpiml_ll_twoshot_reduce (ipc_common.cuh); every
// rank's reduced part goes to every rank. Each rank sends 2 (nranks - 1) / nranks of n
// bytes (twice that in lines) instead of (nranks - 1) n (mpiml_allreduce_ll).
// ---------------------------------------------------------------- LL128 lines
// An LL128 line is 128 bytes: 15 words of 8 payload bytes and a flag word, written by the 8
// lanes of a warp that hold it (16 bytes each, lane 7: word 14 and the flag) with one vector
// store each, the warp converged, so that the line crosses NVLink as one 128-byte write and
// arrives whole (the property NCCL's LL128 protocol relies on over NVLink): a reader that
// sees the flag in lane 7's half has the whole line from the same warp-wide load. The flag
// word is (E + 1) in both halves: never a plain LL line's second half ({d1, flag} with a
// flag of another call) or a payload word of the previous call of the same parity. Payload
// word w of a message is word w % 15 of line w / 15.
#define MPIML_LL128_WORDS 15

__device__ __forceinline__ unsigned long long mpiml_word(uint2 v) {
    return ((unsigned long long)v.y << 32) | v.x;
}

__device__ __forceinline__ uint2 mpiml_unword(unsigned long long w) {
    return make_uint2((unsigned)w, (unsigned)(w >> 32));
}

// This lane's 16 bytes of line g of a user array of nbytes (sub = lane % 8); A: 8-byte aligned.
template <bool A>
__device__ __forceinline__ ulonglong2 mpiml_ll128_get(const void* a, long long g, int sub, long long nbytes,
                                                      unsigned long long flagword) {
    const long long w = MPIML_LL128_WORDS * g + 2 * sub;
    ulonglong2 v;
    v.x = mpiml_word(mpiml_ll_get<A>(a, w, nbytes));
    v.y = sub == 7 ? flagword : mpiml_word(mpiml_ll_get<A>(a, w + 1, nbytes));
    return v;
}

template <bool A>
__device__ __forceinline__ void mpiml_ll128_put(void* a, long long g, int sub, long long nbytes, ulonglong2 v) {
    const long long w = MPIML_LL128_WORDS * g + 2 * sub;
    mpiml_ll_put<A>(a, w, nbytes, mpiml_unword(v.x));
    if (sub != 7) mpiml_ll_put<A>(a, w + 1, nbytes, mpiml_unword(v.y));
}

__device__ __forceinline__ void mpiml_ll128_store(ulonglong2* p, ulonglong2 v) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" :: "l"(p), "l"(v.x), "l"(v.y) : "memory");
}

__device__ __forceinline__ ulonglong2 mpiml_ll128_ld(const ulonglong2* p) {
    ulonglong2 v;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
    return v;
}

// This lane's 16 bytes of the lines p[r * stride] (r < m; act: this lane's line exists), loaded
// together and again until every line's flag has come (warp-wide: every lane of the warp
// calls this, converged); false on every lane after a timeout or abort.
__device__ __forceinline__ bool mpiml_ll128_wait(const MpimlCtx* c, unsigned epoch, const ulonglong2* p,
                                                 long long stride, int m, bool act, unsigned long long flagword,
                                                 ulonglong2 (&v)[MPIML_MAX_RANKS]) {
    const bool checks = act && (threadIdx.x & 7) == 7;
    MpimlSpin s{0ull, 0u};
    for (;;) {
        bool bad = false;
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
            if (r < m && act) {
                v[r] = mpiml_ll128_ld(p + r * stride);
                bad |= checks && v[r].y != flagword;
            }
        }
        if (!__any_sync(0xffffffffu, bad)) return true;
        if (__any_sync(0xffffffffu, mpiml_spin_expired(c, s, (int)c->rank, epoch))) return false;
    }
}

// op over the 8-byte words v[0..m-1] (elements of T), in that order (float16 in float32).
template <typename T, int OP>
__device__ __forceinline__ unsigned long long mpiml_fold_words(const unsigned long long* v, int m) {
    typedef typename MpimlAcc<T>::type Acc;
    constexpr int L = 8 / sizeof(T);
    union Word { unsigned long long w; T e[L]; };
    Acc acc[L];
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r < m) {
            Word x;
            x.w = v[r];
#pragma unroll
            for (int k = 0; k < L; ++k) {
                const Acc a = MpimlAcc<T>::load(x.e[k]);
                acc[k] = r == 0 ? a : MpimlOp<OP>::f(acc[k], a);
            }
        }
    }
    Word out;
#pragma unroll
    for (int k = 0; k < L; ++k) out.e[k] = MpimlAcc<T>::store(acc[k]);
    return out.w;
}

// LL128 two-shot allreduce (no barrier; MPIML_IPC_LL128=1): mpiml_ll_twoshot_reduce's protocol
// in LL128 lines (15 payload words in 16, not 1 in 2: the lines carry 1.07 times the bytes, not
// twice). The lines are cut into nranks parts of `part` lines; every rank pushes line
// r * part + i of its input into rank r's LL region at [me * part + i] (its own part too, a
// local store), rank r reduces the nranks copies of its line i in rank order as they arrive and
// pushes the result into every other rank's region at [nranks * part + r * part + i], storing
// its own to out; then copies the other parts' reduced lines out as they arrive. A warp holds 4
// lines (8 lanes each) and every warp of every rank takes the same lines (the grid is agreed).
// The host keeps 2 * nranks * part lines within the region (nranks * ll_slot / 128 of them). A
// counts 8-byte alignment; a lane writes out only words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_twoshot_allreduce(const MpimlCtx* c, const T* in, T* out, long long n) {
    const long long nbytes = n * (long long)sizeof(T);
    const long long lines = ((nbytes + 7) / 8 + MPIML_LL128_WORDS - 1) / MPIML_LL128_WORDS;
    const unsigned epoch = mpiml_begin(c);
    const unsigned long long flagword = ((unsigned long long)(epoch + 1u) << 32) | (epoch + 1u);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long part = (lines + nr - 1) / nr;
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    auto region = [&](int r) { return reinterpret_cast<ulonglong2*>(mpiml_ll_region(c, r, epoch)); };
    const ulonglong2* mine = region(me);
    for (long long base = 4 * warp; base < part; base += 4 * warps) {  // warp-uniform
        const long long i = base + (lane >> 3);
        const bool act = i < part;
        for (int k = 1; k <= nr; ++k) {  // own part last: the stores that cross the links go out first
            const int r = (me + k) % nr;
            const long long g = r * part + i;
            const ulonglong2 v = mpiml_ll128_get<A>(in, g, sub, nbytes, flagword);
            __syncwarp();
            if (act && g < lines) mpiml_ll128_store(region(r) + 8 * (me * part + i) + sub, v);
        }
        const long long g = me * part + i;
        const bool mine_act = act && g < lines;
        ulonglong2 v[MPIML_MAX_RANKS];
        if (!mpiml_ll128_wait(c, epoch, mine + 8 * i + sub, 8 * part, nr, mine_act, flagword, v)) break;
        ulonglong2 red;
        {
            unsigned long long w[MPIML_MAX_RANKS];
#pragma unroll
            for (int r = 0; r < MPIML_MAX_RANKS; ++r) w[r] = r < nr ? v[r].x : 0ull;
            red.x = mpiml_fold_words<T, OP>(w, nr);
#pragma unroll
            for (int r = 0; r < MPIML_MAX_RANKS; ++r) w[r] = r < nr ? v[r].y : 0ull;
            red.y = sub == 7 ? flagword : mpiml_fold_words<T, OP>(w, nr);
        }
        for (int k = 1; k < nr; ++k) {
            __syncwarp();
            if (mine_act) mpiml_ll128_store(region((me + k) % nr) + 8 * (nr * part + g) + sub, red);
        }
        if (mine_act) mpiml_ll128_put<A>(out, g, sub, nbytes, red);
        bool ok = true;
        for (int k = 1; k < nr && ok; ++k) {  // warp-uniform: k and ok are the same on every lane
            const int r = (me + k) % nr;
            const long long h = r * part + i;
            const bool got_act = act && h < lines;
            ulonglong2 u[MPIML_MAX_RANKS];
            ok = mpiml_ll128_wait(c, epoch, mine + 8 * (nr * part + h) + sub, 0, 1, got_act, flagword, u);
            if (ok && got_act) mpiml_ll128_put<A>(out, h, sub, nbytes, u[0]);
        }
        if (!ok) break;
    }
    mpiml_end<false>(c, epoch);
}

// LL two-shot allreduce, extra & 32: in LL128 lines (mpiml_ll128_twoshot_allreduce).
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_lltwoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    if (extra & 32)
        mpiml_ll128_twoshot_allreduce<T, OP, A>(c, in, out, n);
    else
        mpiml_ll_twoshot_reduce<T, OP, A>(c, in, out, n, -1);
}

// Pipelined two-shot allreduce (no barrier): see mpiml_pipe (ipc_common.cuh); extra = S << 4.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 0>(c, in, out, n, extra);
}
