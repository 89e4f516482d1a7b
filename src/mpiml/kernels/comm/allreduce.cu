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

// The LL128 two-shot allreduce (algorithm ll128): see mpiml_ll128_twoshot_reduce (ipc_common.cuh). extra =
// split << 8.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allreduce_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_ll128_twoshot_reduce<T, OP, A>(c, in, out, n, -1, (int)(extra >> 8));
}

// Pipelined two-shot allreduce (no barrier): see mpiml_pipe (ipc_common.cuh); extra = S << 4.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allreduce_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, OP, A, 0>(c, in, out, n, extra);
}
