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

// LL allgather: every rank pushes its n elements into every peer's slot [me];
// each copies line i of every slot r to out[r * stride ...], the nranks lines
// loaded at once, its own input's line in its own place (never stored into its
// own slot and loaded back).
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allgather_ll(const MpimlCtx* c, const T* in, T* out, long long n, long long stride) {
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    mpiml_ll_push(c, ln, in, 1, (int)c->nranks - 1);
    mpiml_ll_gather_out<T, A>(c, ln, out, stride, in);
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

// LL two-shot broadcast (no barrier): the lines are cut into nranks - 1 parts of `part`
// lines, part j belonging to the non-root rank (root + 1 + j) % nranks. The root pushes
// line j * part + i into its owner's LL region (mpiml_ll_region: this parity's slots as
// one array, indexed by line number); the owner, as the line arrives, forwards it into
// every other non-root's region and copies it out, then copies out line i of every other
// part as it arrives from that part's owner. Line j * part + i is handled by grid index i
// on every rank, and a rank takes its own part's line before the others', so a wait
// depends only on the same grid index of the root (which never waits) and of the line's
// owner (which waits only for the root). Each link carries a line once from the root and
// once from its owner to each other non-root, instead of the root pushing every line to
// every rank (mpiml_bcast_ll): the root sends n bytes (twice that in lines), not
// (nranks - 1) n. The host keeps the lines within the region (line g at index g) and
// launches one grid index per line of a part. A counts 8-byte alignment.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_bcast_lltwoshot(const MpimlCtx* c, const T* in, T* out, long long n, long long root) {
    const int nr = (int)c->nranks, me = (int)c->rank, q = nr - 1;
    const bool sends = me == root;
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), sends);
    const long long part = (ln.lines + q - 1) / q;
    if (sends) {
        MPIML_GRID_LOOP(i, part) {
            for (int j = 0; j < q; ++j) {
                const long long g = j * part + i;
                if (g < ln.lines)
                    mpiml_ll_store(mpiml_ll_region(c, ((int)root + 1 + j) % nr, ln.epoch) + g, ln.get(in, g), ln.flag);
            }
        }
    } else {
        const int jm = (me - (int)root - 1 + nr) % nr;  // this rank's part
        const uint4* mine = mpiml_ll_region(c, me, ln.epoch);
        bool ok = true;
        MPIML_GRID_LOOP(i, part) {
            const long long g = jm * part + i;
            if (g < ln.lines) {
                uint2 v;
                if (!mpiml_ll_load(c, mine + g, ln.flag, v, (int)root, ln.epoch)) break;
                for (int k = 1; k < q; ++k)  // to the other non-roots first: their stores cross the links
                    mpiml_ll_store(mpiml_ll_region(c, ((int)root + 1 + (jm + k) % q) % nr, ln.epoch) + g, v, ln.flag);
                mpiml_ll_put<A>(out, g, ln.nbytes, v);
            }
            for (int k = 1; k < q && ok; ++k) {
                const int j = (jm + k) % q;
                const long long h = j * part + i;
                if (h < ln.lines) {
                    uint2 v;
                    ok = mpiml_ll_load(c, mine + h, ln.flag, v, ((int)root + 1 + j) % nr, ln.epoch);
                    if (ok) mpiml_ll_put<A>(out, h, ln.nbytes, v);
                }
            }
            if (!ok) break;
        }
    }
    mpiml_end<false>(c, ln.epoch);
}

// LL128 two-shot broadcast (algorithm ll128; no barrier): mpiml_bcast_lltwoshot's protocol in LL128 lines
// (15 payload words in 16, not 1 in 2), in the staging buffer of the call's parity (see the LL128 lines in
// ipc_common.cuh). The lines are cut into nranks - 1 parts of `part` lines, part j belonging to the non-root
// (root + 1 + j) % nranks; line g lives at [8 g] of every non-root's region. The root pushes part j into its
// owner's region (a push never waits); the owner, as a line arrives, forwards it into every other non-root's
// region and copies it out, then copies out the other parts' lines as they arrive from their owners. An owner
// waits only for the root, and a line of another part only for its owner, whose own wait is the root's: no
// cycle. Each link carries about n / (nranks - 1) from the root and as much from each owner, in lines 1.07 times
// the payload (LL lines: twice). The host keeps the lines within the region (cap / 128 of them) and launches 8
// lanes a line of a part. A counts 8-byte alignment; extra = root.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_bcast_ll128(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const int root = (int)(extra & 255);
    const MpimlLL128 ll(c, n * (long long)sizeof(T));
    const int nr = (int)c->nranks, me = (int)c->rank, q = nr - 1, sub = ll.sub;
    const long long part = (ll.lines + q - 1) / q;
    if (me == root) {
        ll.push<A>(in, part, q, [&](int k, long long& g0, ulonglong2*& dst) {
            g0 = (k - 1) * part;
            dst = ll.region((root + k) % nr) + 8 * g0;
            return true;
        });
    } else {
        const int jm = (me - root - 1 + nr) % nr;  // this rank's part
        const ulonglong2* mine = ll.region(me);
        bool ok = true;
        MPIML_LL128_ROUNDS(ll, base, part) {  // this rank's part: forwarded to the other non-roots, then out
            const long long i = ll.line(base), g = jm * part + i;
            const bool act = i < part && g < ll.lines;
            ulonglong2 v[MPIML_MAX_RANKS];
            ok = mpiml_ll128_wait(c, ll.epoch, mine + 8 * g + sub, 0, 1, act, ll.flagword, v);
            if (!ok) break;
            __syncwarp();
            for (int k = 1; k < q; ++k)
                if (act) mpiml_ll128_store(ll.region((root + 1 + (jm + k) % q) % nr) + 8 * g + sub, v[0]);
            if (act) mpiml_ll128_put<A>(out, g, sub, ll.nbytes, v[0]);
        }
        if (ok) MPIML_LL128_ROUNDS(ll, base, part) {  // the other parts, from their owners
            const long long i = ll.line(base);
            for (int k = 1; k < q && ok; ++k) {
                const long long h = ((jm + k) % q) * part + i;
                const bool act = i < part && h < ll.lines;
                ulonglong2 v[MPIML_MAX_RANKS];
                ok = mpiml_ll128_wait(c, ll.epoch, mine + 8 * h + sub, 0, 1, act, ll.flagword, v);
                if (ok && act) mpiml_ll128_put<A>(out, h, sub, ll.nbytes, v[0]);
            }
            if (!ok) break;
        }
    }
    mpiml_end<false>(c, ll.epoch);
}

// Pipelined broadcast (no barrier): see mpiml_pipe (ipc_common.cuh); the root scatters a part
// to every non-root, which forwards it to the other non-roots step by step. extra = (S << 4) | root.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_THREADS)
mpiml_bcast_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    mpiml_pipe<T, 0, A, 2>(c, in, out, n, extra);
}
