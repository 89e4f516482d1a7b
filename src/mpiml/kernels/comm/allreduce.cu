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
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_lltwoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll_twoshot_reduce<T, OP, A>(c, in, out, n, -1);
}

// LL128 two-shot allreduce (no barrier; algorithm ll128): mpiml_ll_twoshot_reduce's protocol
// in LL128 lines (15 payload words in 16, not 1 in 2: the lines carry 1.07 times the bytes, not
// twice). The lines are cut into nranks parts of `part` lines; every rank pushes line
// r * part + i of its input into rank r's LL region at [me * part + i] (its own part too, a
// local store), rank r reduces the nranks copies of its line i in rank order as they arrive and
// pushes the result into every other rank's region at [nranks * part + r * part + i], storing
// its own to out; then copies the other parts' reduced lines out as they arrive. A warp holds 4
// lines (8 lanes each) a round and every warp of every rank takes the same lines (the grid is
// agreed); a warp pushes the lines of all its rounds before it waits for any (phases A, B, C).
// The region is the staging buffer of the call's parity (mpiml_buf: see the LL128 lines in
// ipc_common.cuh); the host keeps 2 * nranks * part lines within it (cap / 128 of them). A
// counts 8-byte alignment; a lane writes out only words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_twoshot_allreduce(const MpimlCtx* c, const T* in, T* out, long long n) {
    const long long nbytes = n * (long long)sizeof(T);
    const long long lines = ((nbytes + 7) / 8 + MPIML_LL128_WORDS - 1) / MPIML_LL128_WORDS;
    const unsigned epoch = mpiml_begin(c);
    const unsigned long long flagword = mpiml_ll128_flag(epoch);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long part = (lines + nr - 1) / nr;
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    auto region = [&](int r) { return reinterpret_cast<ulonglong2*>(mpiml_buf(c, r, epoch)); };
    const ulonglong2* mine = region(me);
    // A: every line of this warp pushed first, all its rounds (a push never waits: the peers' waits for line i
    // never depend on this warp's waits, whatever the number of rounds)
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
    }
    // B: this rank's part reduced as its copies arrive, pushed to every other rank and stored to out
    bool ok = true;
    for (long long base = 4 * warp; base < part; base += 4 * warps) {
        const long long i = base + (lane >> 3);
        const long long g = me * part + i;
        const bool mine_act = i < part && g < lines;
        ulonglong2 v[MPIML_MAX_RANKS];
        ok = mpiml_ll128_wait(c, epoch, mine + 8 * i + sub, 8 * part, nr, mine_act, flagword, v);
        if (!ok) break;  // (warp-uniform)
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
    }
    // C: the other parts' reduced lines out as they arrive
    for (long long base = 4 * warp; ok && base < part; base += 4 * warps) {
        const long long i = base + (lane >> 3);
        const bool act = i < part;
        for (int k = 1; k < nr && ok; ++k) {  // warp-uniform: k and ok are the same on every lane
            const int r = (me + k) % nr;
            const long long h = r * part + i;
            const bool got_act = act && h < lines;
            ulonglong2 u[MPIML_MAX_RANKS];
            ok = mpiml_ll128_wait(c, epoch, mine + 8 * (nr * part + h) + sub, 0, 1, got_act, flagword, u);
            if (ok && got_act) mpiml_ll128_put<A>(out, h, sub, nbytes, u[0]);
        }
    }
    mpiml_end<false>(c, epoch);
}

// The LL128 two-shot allreduce (algorithm ll128): see mpiml_ll128_twoshot_allreduce above.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_twoshot_allreduce<T, OP, A>(c, in, out, n);
}

// Pipelined two-shot allreduce (no barrier): see mpiml_pipe (ipc_common.cuh); extra = S << 4.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 0>(c, in, out, n, extra);
}
