// Push-only LL reduce and allgather for small messages (algorithm `llpush`; the loader prepends
// ipc_common.cuh). A family of its own, so that adding it leaves the shipped cubins of the other
// families (their source hash) as they are.
//
// Why the LL reduce and allgather cost more than the LL bcast in a CUDA graph (4 x H100, 4 B-64 KiB:
// bcast 2.6-2.9 us a call, reduce 3.0-3.4, allgather 4.0-4.6, a no-op kernel 0.87; none of them has a
// barrier, a remote read, a memset or a second node a call; every one is one block up to 4 KiB).
// Two explanations, each measured by a knob of this family:
// 1. Every LL kernel ends (mpiml_end) by storing its ack into every peer's workspace, and a kernel ends
//    only once its stores have been acknowledged across NVLink (a round trip, RTT ~1.3 us, the wait a
//    __threadfence pays: ipc_common.cuh measured it for a grid's fence). A kernel whose remote stores all
//    leave at its start (the bcast root's lines) overlaps that round trip with its work; one that waits
//    first and stores afterwards pays the wait, then the round trip, in series:
//      bcast root   begin -> push lines + acks ....................................... -> end  G + b + RTT
//      reduce root  begin -> wait for 3 sources' lines -> acks .......................... -> end  G + b + W + RTT
//      allgather    begin -> push -> wait for 3 sources' lines (one way, L) -> acks ..... -> end  G + b + L + RTT
//    (G: the graph's kernel-to-kernel floor, b: the epoch and ack loads of mpiml_begin, W: the root's
//    wait for the slowest of three sources.) Measured by MPIML_IPC_LLPUSH_ENDACK=1 against 0.
// 2. A writer may overwrite a reader's slots of call E - 2 only once the reader has finished it: a
//    reduce's non-roots run at most one call ahead of the root, and the root waits for the slowest of
//    three sources whenever a non-root is late. Measured by the ring (MPIML_IPC_LLPUSH_DEPTH) below.
// The acks say "this rank has finished call E"; a writer needs them only to know that a reader is done
// with the slots it is about to overwrite.
//
// The push kernels move the ack to the start of the next call: at the start of call E, block 0 stores
// ack[me] = E into every peer ("finished call E - 1", true since the kernel of call E - 1 has ended),
// beside the call's own lines, and the kernel ends with local stores only (the epoch word and its own
// ack). Then every remote store of a kernel leaves at its start and one round trip ends it:
//   reduce      non-root: begin -> push lines + acks -> end;  root: begin -> acks; wait; reduce -> end
//   allgather   begin -> push lines + acks -> wait (L, inside the RTT) -> copy out -> end
// The ack keeps its meaning (ack[r] = F: rank r has finished call F - 1), so the other kernels' waits
// (mpiml_begin: every ack >= E - 1) hold as before; a push kernel waits only for the acks of the ranks
// whose slots it writes (reduce: a non-root for the root, the root for nobody; allgather: every peer).
// An ack one call late (this rank's last call, a push kernel, acknowledged by its next call's start) only
// holds back a rank that runs two calls ahead of it (a bcast root), never forever: the next call is one
// this rank makes too. tests/comm/test_ipc_protocol_model.py models it among the other kernels.
//
// `extra`: the reduce's root in bits 0-7 and its flags above bit 8; the allgather's row stride (elements)
// in bits 0-47 and its flags above bit 48. Flags: MPIML_PUSH_ENDACK also stores the acks at the end (the
// LL kernels' way: for A/B measurements only); MPIML_PUSH_SPLIT (allgather) runs nranks - 1 groups of
// blocks, group k pushing to rank me + k and copying out rank me - k's lines (the host multiplies the
// grid by nranks - 1): three times the SMs storing across the links, for the larger calls.
//
// A ring of their own (MPIML_IPC_LLPUSH_DEPTH = D, 4 or 8; 0: the LL slots of the call's parity): slot
// [E % D][src] of a region after the pipelined kernels' flags (the host allocates D * nranks LL slots there,
// zeroed), which no other kernel touches. Its previous user is the last push call that took slot E % D,
// whose number + 1 this rank keeps in mark[E % D] (its own workspace, MPIML_PUSH_MARK_OFF: every rank makes
// the same calls, so every rank's marks are the same); a writer waits until each reader's ack has reached
// the mark (the reader has finished that call): a reduce's non-roots may run D - 1 calls ahead of the root,
// not one, before they wait for it.
//
// Programmatic dependent launch (MPIML_IPC_LLPUSH_PDL=1: the host launches a push kernel with programmatic
// stream serialization, so that it may start while the kernel before it in its stream or graph ends): a push
// kernel waits first of all (griddepcontrol.wait: until every kernel it depends on has ended and its memory is
// visible; a no-op when launched without the attribute), before it reads anything (its input, the epoch word),
// then lets a push kernel launched after it start launching its blocks (griddepcontrol.launch_dependents), which
// wait in turn. What it can save is the kernel-to-kernel gap of a graph (G above), not the round trip.

#define MPIML_PUSH_ENDACK 1
#define MPIML_PUSH_SPLIT 2
#define MPIML_PUSH_DEPTH_SHIFT 2  // the ring's depth D in the flags' bits 2-5
#define MPIML_PUSH_MARK_OFF 160   // mark[s], s < 8: free bytes of the workspace's control block (zeroed)

__device__ __forceinline__ void mpiml_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void mpiml_pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned* mpiml_push_mark(const MpimlCtx* c, int s) {
    return reinterpret_cast<unsigned*>(c->peers[c->rank] + MPIML_PUSH_MARK_OFF) + s;
}

// Rank owner's slot for source src of call epoch: the ring's (depth > 0) or the LL slot of the call's parity.
__device__ __forceinline__ uint4* mpiml_push_slot(const MpimlCtx* c, int owner, unsigned epoch, int src, int depth) {
    if (depth == 0) return mpiml_ll_slot(c, owner, epoch, src);
    char* ring = c->peers[owner] + c->ll_off + 2 * c->nranks * c->ll_slot + 4ll * MPIML_PIPE_WORDS;
    return reinterpret_cast<uint4*>(ring + ((long long)(epoch % (unsigned)depth) * c->nranks + src) * c->ll_slot);
}

// The call number E (as mpiml_begin), ack[me] = E stored into every peer by block 0, then the wait until
// every rank t with writes(t) has finished the last call that used the slots this call writes: ack >= E - 1
// (call E - 2, the previous user of the parity's slots), or, in the ring, ack >= mark[E % depth]. The acks
// and marks this rank reads are in its own workspace (no remote read), loaded with the epoch word.
template <typename Writes>
__device__ __forceinline__ unsigned mpiml_push_begin(const MpimlCtx* c, int depth, Writes writes) {
    __shared__ unsigned s_epoch, s_mark[8];
    const int t = threadIdx.x, me = (int)c->rank, nr = (int)c->nranks;
    char* mine = c->peers[me];
    unsigned ack = 0u;
    if (t == 0) s_epoch = *reinterpret_cast<volatile unsigned*>(mine);
    if (t < nr) ack = *reinterpret_cast<volatile unsigned*>(mpiml_ack(mine, t));
    if (t >= 8 && t < 8 + depth) s_mark[t - 8] = *reinterpret_cast<volatile unsigned*>(mpiml_push_mark(c, t - 8));
    __syncthreads();
    const unsigned epoch = s_epoch;
    if (blockIdx.x == 0 && t < nr && t != me)
        *reinterpret_cast<volatile unsigned*>(mpiml_ack(c->peers[t], me)) = epoch;
    const unsigned need = depth > 0 ? s_mark[epoch % (unsigned)depth] : (epoch >= 2u ? epoch - 1u : 0u);
    int lag = 0;
    if (t < nr && t != me && writes(t) && (int)(ack - need) < 0) {
        lag = 1;
        const volatile unsigned* a = mpiml_ack(mine, t);
        MpimlSpin s{0ull, 0u};
        while ((int)(*a - need) < 0) {
            if (mpiml_spin_expired(c, s, t, epoch)) break;
        }
    }
    if (__syncthreads_or(lag)) __threadfence();  // a late ack: order our stores after it
    return epoch;
}

// The last block to finish advances the epoch word and this rank's own ack, and marks the ring's slot as this
// call's (local stores); ENDACK: and stores the ack into every peer, as mpiml_end does.
__device__ __forceinline__ void mpiml_push_end(const MpimlCtx* c, unsigned epoch, bool endack, int depth) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* ctl = reinterpret_cast<unsigned*>(c->peers[c->rank]);
        bool last = gridDim.x == 1;
        if (!last) {
            last = atomicAdd(ctl + 1, 1u) == gridDim.x - 1;
            if (last) ctl[1] = 0u;
        }
        if (last) {
            *reinterpret_cast<volatile unsigned*>(ctl) = epoch + 1u;
            *reinterpret_cast<volatile unsigned*>(mpiml_ack(c->peers[c->rank], (int)c->rank)) = epoch + 1u;
            if (depth > 0)
                *reinterpret_cast<volatile unsigned*>(mpiml_push_mark(c, epoch % (unsigned)depth)) = epoch + 1u;
            if (endack) {
                for (int r = 0; r < c->nranks; ++r)
                    if (r != c->rank)
                        *reinterpret_cast<volatile unsigned*>(mpiml_ack(c->peers[r], (int)c->rank)) = epoch + 1u;
            }
        }
    }
}

// Line i of every rank's ring slot (this rank's own: `own`) reduced in rank order (mpiml_fold_elems: the same bits
// as every other path), every line loaded before any flag is looked at; ok false on a timeout or abort.
template <typename T, int OP>
__device__ __forceinline__ uint2 mpiml_push_reduce_line(const MpimlCtx* c, unsigned epoch, unsigned flag, long long i,
                                                        int depth, uint2 own, bool& ok) {
    const int nr = (int)c->nranks, me = (int)c->rank;
    uint4 w[MPIML_MAX_RANKS];
    uint2 v[MPIML_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r < nr && r != me) {
            asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[r].x), "=r"(w[r].y), "=r"(w[r].z), "=r"(w[r].w)
                         : "l"(mpiml_push_slot(c, me, epoch, r, depth) + i) : "memory");
        }
    }
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r == me) {
            v[r] = own;
        } else if (r < nr && ok) {
            if (w[r].y == flag && w[r].w == flag) v[r] = make_uint2(w[r].x, w[r].z);
            else ok = mpiml_ll_load(c, mpiml_push_slot(c, me, epoch, r, depth) + i, flag, v[r], r, epoch);
        }
    }
    return mpiml_fold_elems<T, OP, 8 / sizeof(T)>(v, nr);
}

// Push reduce: every non-root pushes its lines into the root's slot [me] (after the root's ack of call
// E - 2, or the ring's mark); the root reduces them in rank order with its own input's line
// (mpiml_push_reduce_line) as they arrive. The same thread reads in[i] and writes out[i] (in == out is
// safe). A counts 8-byte alignment.
template <typename T, int OP, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_reduce_llpush(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const int me = (int)c->rank, root = (int)(extra & 255);
    const int flags = (int)(extra >> 8), depth = (flags >> MPIML_PUSH_DEPTH_SHIFT) & 15;
    const long long nbytes = n * (long long)sizeof(T), lines = (nbytes + 7) / 8;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    mpiml_pdl_wait();
    const uint2 v0 = i0 < lines ? mpiml_ll_get<A>(in, i0, nbytes) : make_uint2(0u, 0u);  // (overlaps the begin)
    const unsigned epoch = mpiml_push_begin(c, depth, [&](int t) { return me != root && t == root; });
    mpiml_pdl_launch_next();
    const unsigned flag = epoch + 1u;
    if (me != root) {
        uint4* dst = mpiml_push_slot(c, root, epoch, me, depth);
        MPIML_GRID_LOOP(i, lines) mpiml_ll_store(dst + i, i == i0 ? v0 : mpiml_ll_get<A>(in, i, nbytes), flag);
    } else {
        bool ok = true;
        MPIML_GRID_LOOP(i, lines) {
            const uint2 own = i == i0 ? v0 : mpiml_ll_get<A>(in, i, nbytes);
            const uint2 v = mpiml_push_reduce_line<T, OP>(c, epoch, flag, i, depth, own, ok);
            if (!ok) break;
            mpiml_ll_put<A>(out, i, nbytes, v);
        }
    }
    mpiml_push_end(c, epoch, flags & MPIML_PUSH_ENDACK, depth);
}

// Push allgather: every rank pushes its lines into every peer's slot [me] (after the peers' acks of call
// E - 2), then copies line i of every peer's slot r to out[r * stride ...] as it arrives, and its own
// input's line to out[me * stride ...] (never through its own slot). SPLIT: block group k (of nranks - 1,
// gridDim.x / (nranks - 1) blocks each) pushes to rank me + k and copies out rank me - k's lines, group 0
// also this rank's own. A counts 8-byte alignment of in, out and the stride in bytes.
template <typename T, bool A>
__global__ void __launch_bounds__(MPIML_LL_THREADS)
mpiml_allgather_llpush(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const int me = (int)c->rank, nr = (int)c->nranks;
    const int flags = (int)(extra >> 48), depth = (flags >> MPIML_PUSH_DEPTH_SHIFT) & 15;
    const long long stride = extra & ((1ll << 48) - 1);
    const long long nbytes = n * (long long)sizeof(T), lines = (nbytes + 7) / 8;
    const bool split = (flags & MPIML_PUSH_SPLIT) && nr > 2;
    const int groups = split ? nr - 1 : 1;
    const int gx = (int)gridDim.x / groups, grp = (int)blockIdx.x / gx;
    const int k0 = split ? grp + 1 : 1, k1 = split ? grp + 1 : nr - 1;  // the peers (me + k) of this block
    const long long first = (long long)(blockIdx.x % gx) * blockDim.x + threadIdx.x;
    const long long step = (long long)gx * blockDim.x;
    mpiml_pdl_wait();
    const uint2 v0 = first < lines ? mpiml_ll_get<A>(in, first, nbytes) : make_uint2(0u, 0u);
    const unsigned epoch = mpiml_push_begin(c, depth, [&](int t) {
        const int k = (t - me + nr) % nr;
        return k >= k0 && k <= k1;
    });
    mpiml_pdl_launch_next();
    const unsigned flag = epoch + 1u;
    if (grp < groups) {  // (a grid not a multiple of the groups leaves its last blocks idle)
        for (long long i = first; i < lines; i += step) {
            const uint2 v = i == first ? v0 : mpiml_ll_get<A>(in, i, nbytes);
            for (int k = k0; k <= k1; ++k)
                mpiml_ll_store(mpiml_push_slot(c, (me + k) % nr, epoch, me, depth) + i, v, flag);
        }
        bool ok = true;
        for (long long i = first; i < lines && ok; i += step) {
            // the lines of this block's sources loaded at once, then waited for (one latency, not one a source)
            uint4 w[MPIML_MAX_RANKS];
#pragma unroll
            for (int k = 1; k < MPIML_MAX_RANKS; ++k) {
                if (k >= k0 && k <= k1) {
                    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(w[k].x), "=r"(w[k].y), "=r"(w[k].z), "=r"(w[k].w)
                                 : "l"(mpiml_push_slot(c, me, epoch, (me - k + nr) % nr, depth) + i) : "memory");
                }
            }
            if (grp == 0)
                mpiml_ll_put<A>(out + me * stride, i, nbytes, i == first ? v0 : mpiml_ll_get<A>(in, i, nbytes));
#pragma unroll
            for (int k = 1; k < MPIML_MAX_RANKS; ++k) {
                if (k >= k0 && k <= k1 && ok) {
                    const int src = (me - k + nr) % nr;
                    uint2 v;
                    if (w[k].y == flag && w[k].w == flag) v = make_uint2(w[k].x, w[k].z);
                    else ok = mpiml_ll_load(c, mpiml_push_slot(c, me, epoch, src, depth) + i, flag, v, src, epoch);
                    if (ok) mpiml_ll_put<A>(out + src * stride, i, nbytes, v);
                }
            }
        }
    }
    mpiml_push_end(c, epoch, flags & MPIML_PUSH_ENDACK, depth);
}
