// Allreduce through the IPC workspace (see ipc_common.cuh for the protocol).
//
// Every kernel takes (ctx, in, out, n, extra) with n counted in elements, so
// the host launches all of them through one argument layout. T is the element
// type, OP the reduction (0 sum, 1 prod, 2 min, 3 max), A whether in and out
// are 16-byte aligned.

// One-shot: copy in, barrier, every rank reduces all packs from all peers.
// Reads n * nranks over the links: best for small messages.
template <typename T, int OP, bool A>
__global__ void mpiml_allreduce_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const unsigned epoch = mpiml_begin(c);
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    MpimlPack<T>* mine = mpiml_packs<T>(c, (int)c->rank, epoch);
    MPIML_GRID_LOOP(i, units) mine[i] = mpiml_load_user<T, A>(in, i, n);
    if (mpiml_barrier(c, epoch, 0)) {
        MPIML_GRID_LOOP(i, units)
            mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, (int)c->nranks));
    }
    mpiml_end(c, epoch);
}

// Two-shot: reduce-scatter (rank r reduces part r into its own buffer), barrier,
// all-gather of the reduced parts. Every phase maps pack idx = r * part + i to
// the same (block, thread), so a block's barrier covers exactly what it reads.
template <typename T, int OP, bool A>
__global__ void mpiml_allreduce_twoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    const long long part = (units + nr - 1) / nr;
    MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
    for (int r = 0; r < nr; ++r) {
        MPIML_GRID_LOOP(i, part) {
            const long long idx = r * part + i;
            if (idx < units) mine[idx] = mpiml_load_user<T, A>(in, idx, n);
        }
    }
    if (mpiml_barrier(c, epoch, 0)) {
        MPIML_GRID_LOOP(i, part) {
            const long long idx = me * part + i;
            if (idx < units) mine[idx] = mpiml_reduce_packs<T, OP>(c, epoch, idx, 0, nr);
        }
        if (mpiml_barrier(c, epoch, 1)) {
            for (int r = 0; r < nr; ++r) {
                const MpimlPack<T>* theirs = mpiml_packs<T>(c, r, epoch);
                MPIML_GRID_LOOP(i, part) {
                    const long long idx = r * part + i;
                    if (idx < units) mpiml_store_user<T, A>(out, idx, n, mpiml_ld(theirs + idx));
                }
            }
        }
    }
    mpiml_end(c, epoch);
}

// LL one-shot (no barrier): every rank pushes its lines into every rank's slot
// [me], then reduces its own slots in rank order 0..n-1 as their flags arrive.
// A counts 8-byte alignment here (lines are 8 bytes of payload). The same
// thread handles line i in both loops, so in == out is safe.
template <typename T, int OP, bool A>
__global__ void mpiml_allreduce_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const long long nbytes = n * (long long)sizeof(T);
    const long long lines = (nbytes + 7) / 8;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const uint2 v0 = i0 < lines ? mpiml_ll_get<A>(in, i0, nbytes) : make_uint2(0u, 0u);  // overlaps begin
    const unsigned epoch = mpiml_begin(c);
    const unsigned flag = epoch + 1u;
    const int nr = (int)c->nranks, me = (int)c->rank;
    MPIML_GRID_LOOP(i, lines) {
        const uint2 v = i == i0 ? v0 : mpiml_ll_get<A>(in, i, nbytes);
        for (int k = 1; k <= nr; ++k) {
            const int r = (me + k) % nr;  // own slot last; peers' stores go out first
            mpiml_ll_store(mpiml_ll_slot(c, r, epoch, me) + i, v, flag);
        }
    }
    bool ok = true;
    MPIML_GRID_LOOP(i, lines) {
        const uint2 v = mpiml_ll_reduce_line<T, OP>(c, epoch, flag, i, ok);
        if (!ok) break;
        mpiml_ll_put<A>(out, i, nbytes, v);
    }
    mpiml_end(c, epoch);
}
