// Reductions to one rank or to parts: reduce, scan, reduce_scatter (argument
// layout as in allreduce.cu; n counts elements).

// Reduce: copy in, barrier, the root reduces every rank's packs in rank order.
template <typename T, int OP, bool A>
__global__ void mpiml_reduce_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    MpimlPack<T>* mine = mpiml_packs<T>(c, (int)c->rank, epoch);
    MPIML_GRID_LOOP(i, units) mine[i] = mpiml_load_user<T, A>(in, i, n);
    if (mpiml_barrier(c, epoch, 0) && c->rank == root) {
        MPIML_GRID_LOOP(i, units)
            mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, (int)c->nranks));
    }
    mpiml_end(c, epoch);
}

// Scan (extra = 0) or exclusive scan (extra = 1): rank r reduces ranks 0..r (0..r-1).
template <typename T, int OP, bool A>
__global__ void mpiml_scan_oneshot(const MpimlCtx* c, const T* in, T* out, long long n, long long exclusive) {
    const unsigned epoch = mpiml_begin(c);
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    MpimlPack<T>* mine = mpiml_packs<T>(c, (int)c->rank, epoch);
    MPIML_GRID_LOOP(i, units) mine[i] = mpiml_load_user<T, A>(in, i, n);
    const int upto = (int)c->rank + (exclusive ? 0 : 1);
    if (mpiml_barrier(c, epoch, 0) && upto > 0) {
        MPIML_GRID_LOOP(i, units) mpiml_store_user<T, A>(out, i, n, mpiml_reduce_packs<T, OP>(c, epoch, i, 0, upto));
    }
    mpiml_end(c, epoch);
}

// Reduce-scatter with parts given by displs (device array of nranks + 1 element
// offsets): copy in part by part, barrier, rank r reduces part r into out.
// Element by element, since parts need not fall on pack boundaries.
template <typename T, int OP, bool A>
__global__ void mpiml_reduce_scatter_oneshot(const MpimlCtx* c, const T* in, T* out, long long n,
                                             long long displs_ptr) {
    const long long* displs = reinterpret_cast<const long long*>(displs_ptr);
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    T* mine = reinterpret_cast<T*>(mpiml_buf(c, me, epoch));
    for (int r = 0; r < nr; ++r) {
        const long long d = displs[r], len = displs[r + 1] - d;
        MPIML_GRID_LOOP(i, len) mine[d + i] = in[d + i];
    }
    if (mpiml_barrier(c, epoch, 0)) {
        const long long d = displs[me], len = displs[me + 1] - d;
        MPIML_GRID_LOOP(i, len) out[i] = mpiml_reduce_one<T, OP>(c, epoch, d + i, 0, nr);
    }
    mpiml_end(c, epoch);
}

// LL reduce (see allreduce.cu's mpiml_allreduce_ll): every rank pushes its lines
// into the root's slot [me]; the root reduces them in rank order.
template <typename T, int OP, bool A>
__global__ void mpiml_reduce_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const long long nbytes = n * (long long)sizeof(T);
    const long long lines = (nbytes + 7) / 8;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const uint2 v0 = i0 < lines ? mpiml_ll_get<A>(in, i0, nbytes) : make_uint2(0u, 0u);
    const unsigned epoch = mpiml_begin(c);
    const unsigned flag = epoch + 1u;
    const int me = (int)c->rank;
    MPIML_GRID_LOOP(i, lines)
        mpiml_ll_store(mpiml_ll_slot(c, (int)root, epoch, me) + i, i == i0 ? v0 : mpiml_ll_get<A>(in, i, nbytes), flag);
    if (me == root) {
        bool ok = true;
        MPIML_GRID_LOOP(i, lines) {
            const uint2 v = mpiml_ll_reduce_line<T, OP>(c, epoch, flag, i, ok);
            if (!ok) break;
            mpiml_ll_put<A>(out, i, nbytes, v);
        }
    }
    mpiml_end(c, epoch);
}
