// Data movement without reduction: broadcast and allgather. T is an unsigned
// type of the element size, A whether the user's arrays are 16-byte aligned;
// n counts elements (see allreduce.cu for the argument layout).

// Broadcast by pulling: the root copies in, barrier, the others read the root's buffer.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_bcast_pull(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    const int me = (int)c->rank;
    if (me == root) mpiml_stage_in<T, A>(c, epoch, in, n);
    if (mpiml_barrier(c, epoch, 0) && me != root) {
        const MpimlPack<T>* theirs = mpiml_packs<T>(c, (int)root, epoch);
        MPIML_GRID_LOOP(i, mpiml_units<T>(n)) mpiml_store_user<T, A>(out, i, n, mpiml_ld(theirs + i));
    }
    mpiml_end(c, epoch);
}

// Allgather: copy in, barrier, read every rank's n elements into out[r * stride ...]
// (pack i of every rank by the thread that wrote pack i: the block's barrier covers it).
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allgather_pull(const MpimlCtx* c, const T* in, T* out, long long n, long long stride) {
    const unsigned epoch = mpiml_begin(c);
    mpiml_stage_in<T, A>(c, epoch, in, n);
    if (mpiml_barrier(c, epoch, 0)) {
        const int nr = (int)c->nranks;
        MPIML_GRID_LOOP(i, mpiml_units<T>(n)) {  // every rank's pack i loaded before the first is stored: one link latency
            mpiml_copy_ranks<T>(
                nr, -1, [&](int r) { return mpiml_packs<T>(c, r, epoch) + i; },
                [&](int r, const MpimlPack<T>& v) { mpiml_store_user<T, A>(out + r * stride, i, n, v); });
        }
    }
    mpiml_end(c, epoch);
}

// LL broadcast (no barrier): the root pushes its lines into every other rank's
// slot [root]; the others copy them out as their flags arrive. A counts 8-byte
// alignment. The root waits for nobody: the ack wait in mpiml_begin keeps it
// from reusing a slot parity that a slow peer still reads.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_bcast_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const bool sends = c->rank == root;
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), sends);
    if (sends) mpiml_ll_push(c, ln, in, 1, (int)c->nranks - 1);
    else mpiml_ll_copy_out(c, ln, (int)root, out);
    mpiml_end<false>(c, ln.epoch);
}

// LL allgather: every rank pushes its n elements into every rank's slot [me];
// each copies line i of every slot r to out[r * stride ...], the nranks lines
// loaded at once.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allgather_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long stride) {
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    mpiml_ll_push(c, ln, in, 1, (int)c->nranks);
    mpiml_ll_gather_out<T, A>(c, ln, out, stride);
    mpiml_end<false>(c, ln.epoch);
}

// Two-shot broadcast (scatter + allgather, both pushed): the packs are cut into
// nranks parts of `part` packs, part r living at [r * part] of every buffer.
//   1. the root writes part r of its input into rank r's buffer;
//   2. barrier; rank r writes its part (from its own memory) into every other
//      rank's buffer and, off the root, into out;
//   3. barrier; off the root, the other parts are copied from this rank's own
//      memory into out.
// Each link carries about n / nranks from every rank instead of n from the root.
// Pack idx = r * part + i is handled by the same (block, thread) in every phase
// and on every rank, so a block's barriers cover what it reads.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_bcast_twoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long units = mpiml_units<T>(n);
    const long long part = (units + nr - 1) / nr;
    if (me == root) {
        for (int k = 0; k < nr; ++k) {
            const int r = (me + 1 + k) % nr;  // own part last
            MpimlPack<T>* dst = mpiml_packs<T>(c, r, epoch);
            MPIML_GRID_LOOP(i, part) {
                const long long idx = r * part + i;
                if (idx < units) dst[idx] = mpiml_load_user<T, A>(in, idx, n);
            }
        }
    }
    if (mpiml_barrier(c, epoch, 0)) {
        const MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
        MPIML_GRID_LOOP(i, part) {
            const long long idx = me * part + i;
            if (idx < units) {
                const MpimlPack<T> v = mpiml_ld(mine + idx);
                for (int k = 1; k < nr; ++k) {
                    const int r = (me + k) % nr;
                    if (r != root) mpiml_packs<T>(c, r, epoch)[idx] = v;
                }
                if (me != root) mpiml_store_user<T, A>(out, idx, n, v);
            }
        }
        if (mpiml_barrier(c, epoch, 1) && me != root) {
            MPIML_GRID_LOOP(i, part) mpiml_parts_out<T, A>(nr, me, mine, part, units, i, out, n);
        }
    }
    mpiml_end(c, epoch);
}

// Allgather by pushing: every rank writes its n elements into every peer's buffer
// at [me * units] (and straight into its own out), barrier, then copies the
// peers' parts from its own memory into out[r * stride ...]. Stores only cross
// the links. Pack i of every part is handled by the same (block, thread) on every
// rank, so a block's barrier covers what it reads. The host keeps nranks * units
// packs within one staging buffer.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_allgather_push(const MpimlCtx* c, const T* in, T* out, long long n, long long stride) {
    const unsigned epoch = mpiml_begin(c);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const long long units = mpiml_units<T>(n);
    MPIML_GRID_LOOP(i, units) {
        const MpimlPack<T> v = mpiml_load_user<T, A>(in, i, n);
        for (int k = 1; k < nr; ++k) mpiml_packs<T>(c, (me + k) % nr, epoch)[me * units + i] = v;
        mpiml_store_user<T, A>(out + me * stride, i, n, v);
    }
    if (mpiml_barrier(c, epoch, 0)) {
        const MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
        MPIML_GRID_LOOP(i, units) {
            mpiml_copy_ranks<T>(
                nr, me, [&](int r) { return mine + r * units + i; },
                [&](int r, const MpimlPack<T>& v) { mpiml_store_user<T, A>(out + r * stride, i, n, v); });
        }
    }
    mpiml_end(c, epoch);
}
