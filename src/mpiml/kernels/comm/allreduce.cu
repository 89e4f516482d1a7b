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
// r * part + i of its input into rank r's LL region at [me * part + i] (its own part stays in its
// input), rank r reduces the nranks copies of its line i in rank order as they arrive and
// pushes the result into every other rank's region at [nranks * part + r * part + i], storing
// its own to out; then copies the other parts' reduced lines out as they arrive (line i of every
// part waited for at once). A warp holds 4
// lines (8 lanes each) a round and every warp of every rank takes the same lines (the grid is
// agreed); a warp pushes the lines of all its rounds before it waits for any (phases A, B, C), or,
// with split > 0 (MpimlLL128's roles), the first `split` warps of a block push (A) and the others
// take B and C.
// The region is the staging buffer of the call's parity (mpiml_buf: see the LL128 lines in
// ipc_common.cuh); the host keeps 2 * nranks * part lines within it (cap / 128 of them). A
// counts 8-byte alignment; a lane writes out only words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_twoshot_allreduce(const MpimlCtx* c, const T* in, T* out, long long n, int split) {
    const MpimlLL128 ll(c, n * (long long)sizeof(T), split);
    const int nr = (int)c->nranks, me = (int)c->rank, sub = ll.sub;
    const long long part = (ll.lines + nr - 1) / nr;
    const ulonglong2* mine = ll.region(me);
    // A: part r of the input into rank r's region at [me * part] (this rank's own part stays in the input)
    if (ll.pushes) {
        ll.push<A>(in, part, nr - 1, [&](int k, long long& g0, ulonglong2*& dst) {
            const int r = (me + k) % nr;
            g0 = r * part;
            dst = ll.region(r) + 8 * (me * part);
            return true;
        });
    }
    // B: this rank's part reduced as its copies arrive (its own from the input), pushed to every other rank and
    // stored to out
    bool ok = ll.waits;
    if (ok) MPIML_LL128_ROUNDS(ll, base, part) {
        const long long i = ll.line(base);
        const long long g = me * part + i;
        const bool mine_act = i < part && g < ll.lines;
        ulonglong2 v[MPIML_MAX_RANKS] = {};  // (v[me] stays unread: this rank's copy is `own`)
        const ulonglong2 own = mpiml_ll128_get<A>(in, g, sub, ll.nbytes, ll.flagword);
        ok = mpiml_ll128_wait(c, ll.epoch, mine + 8 * i + sub, 8 * part, nr, mine_act, ll.flagword, v, me);
        if (!ok) break;  // (warp-uniform)
        ulonglong2 u[MPIML_MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r) u[r] = r == me ? own : v[r];
        const ulonglong2 red = mpiml_ll128_fold<T, OP>(u, nr, sub, ll.flagword);
        for (int k = 1; k < nr; ++k) {
            __syncwarp();
            if (mine_act) mpiml_ll128_store(ll.region((me + k) % nr) + 8 * (nr * part + g) + sub, red);
        }
        if (mine_act) mpiml_ll128_put<A>(out, g, sub, ll.nbytes, red);
    }
    // C: the other parts' reduced lines out as they arrive, line i of every part waited for at once
    if (ok) {
        MPIML_LL128_ROUNDS(ll, base, part) {
            const long long i = ll.line(base);
            // the parts holding a line i: r * part + i < lines (small calls leave the last parts short or empty)
            const int m = i >= part ? 0 : (int)min((long long)nr, (ll.lines - 1 - i) / part + 1);
            ulonglong2 u[MPIML_MAX_RANKS];
            if (!mpiml_ll128_wait(c, ll.epoch, mine + 8 * (nr * part + i) + sub, 8 * part, m, m > 0, ll.flagword, u,
                                  me))
                break;
#pragma unroll
            for (int r = 0; r < MPIML_MAX_RANKS; ++r)
                if (r < m && r != me) mpiml_ll128_put<A>(out, r * part + i, sub, ll.nbytes, u[r]);
        }
    }
    mpiml_end<false>(c, ll.epoch);
}

// The LL128 two-shot allreduce (algorithm ll128): see mpiml_ll128_twoshot_allreduce above. extra = split << 8.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_twoshot_allreduce<T, OP, A>(c, in, out, n, (int)(extra >> 8));
}

// Pipelined two-shot allreduce (no barrier): see mpiml_pipe (ipc_common.cuh); extra = S << 4.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 0>(c, in, out, n, extra);
}
