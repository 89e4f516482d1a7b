// Data movement without reduction: broadcast and allgather. T is an unsigned
// type of the element size, A whether the user's arrays are 16-byte aligned;
// n counts elements (see allreduce.cu for the argument layout).

// Broadcast by pulling: the root copies in, barrier, the others read the root's buffer.
template <typename T, bool A>
__global__ void mpiml_bcast_pull(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    const int me = (int)c->rank;
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    if (me == root) {
        MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
        MPIML_GRID_LOOP(i, units) mine[i] = mpiml_load_user<T, A>(in, i, n);
    }
    if (mpiml_barrier(c, epoch, 0) && me != root) {
        const MpimlPack<T>* theirs = mpiml_packs<T>(c, (int)root, epoch);
        MPIML_GRID_LOOP(i, units) mpiml_store_user<T, A>(out, i, n, mpiml_ld(theirs + i));
    }
    mpiml_end(c, epoch);
}

// Allgather: copy in, barrier, read every rank's n elements into out[r * stride ...].
template <typename T, bool A>
__global__ void mpiml_allgather_pull(const MpimlCtx* c, const T* in, T* out, long long n, long long stride) {
    const unsigned epoch = mpiml_begin(c);
    const long long units = (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
    MpimlPack<T>* mine = mpiml_packs<T>(c, (int)c->rank, epoch);
    MPIML_GRID_LOOP(i, units) mine[i] = mpiml_load_user<T, A>(in, i, n);
    if (mpiml_barrier(c, epoch, 0)) {
        for (int r = 0; r < (int)c->nranks; ++r) {
            const MpimlPack<T>* theirs = mpiml_packs<T>(c, r, epoch);
            MPIML_GRID_LOOP(i, units) mpiml_store_user<T, A>(out + r * stride, i, n, mpiml_ld(theirs + i));
        }
    }
    mpiml_end(c, epoch);
}
