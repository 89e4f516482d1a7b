// Shared pieces of the CUDA-IPC collectives (mpiml.comm.backends.ipc).
//
// Longer than 800 lines because the workspace layout, the barrier, the LL lines and every kernel body a
// collective family instantiates share one header, so each protocol rule lives in one place.
//
// Every rank owns one workspace (plain cudaMalloc, shared with CUDA IPC):
//
//   [0, 4)                  epoch: calls completed on this communicator (device-side,
//                           so a CUDA graph replays correctly)
//   [4, 8)                  done: blocks of the running call that have finished
//   [ACK_OFF, +4*MAX_RANKS) ack[r]: calls that rank r has completed (written by r)
//   [FLAG_OFF, +FLAG_BYTES) barrier flags [slot 0..1][block][peer rank], uint32
//   [DATA_OFF, +2*cap)      two staging buffers; call E uses buffer E % 2
//   [ll_off, +2*nranks*ll_slot) LL receive slots [E % 2][source rank] (see below)
//
// Barrier: for call E, barrier slot s (0 or 1) carries the value 2E + s + 1.
// Thread t < nranks stores it (release, system scope) into rank t's slot
// [s][block][me] and spins (acquire, system scope) on its own [s][block][t]
// until the value has been reached. Values only grow, so a fast peer that is
// already a call ahead never un-releases a slow one, and the two slots keep
// the two barriers of a two-phase kernel apart. A spin that outlasts
// timeout_ns (read from %globaltimer) writes an error record into host-mapped
// memory and the kernel ends early: the host turns that into CommTimeoutError.
//
// Reuse of buffers without a closing barrier: every kernel ends by writing
// E + 1 into ack[me] of every peer (plain stores: its reads of peers' data were
// performed before the block barrier that precedes them), and begins call E by waiting until every
// peer's ack has reached E - 1, i.e. every peer has finished call E - 2, the
// last user of the buffers of parity E % 2. Kernels in which every rank waits
// for every other (allreduce) satisfy that wait at once; kernels in which a
// rank waits for nobody (the root of a bcast) are held back by it.
//
// LL ("low latency") kernels need no barrier at all: data travels in 16-byte
// lines {d0, flag, d1, flag} written with one vector store into the receiver's
// slot, each 8-byte half (4 data bytes + flag) arriving whole; the flag is
// E + 1, so the receiver spins on its own memory until both flags of a line
// carry the current call, and one one-way trip over NVLink is the whole
// synchronisation. Slots alternate between two parities like the buffers.
//
// Waiting: every spin (barrier, ack, LL line) gives up after timeout_ns and
// after any error or abort recorded in the host-mapped error record (looked at
// only once a wait has lasted 20 us, and then every 8192 spins, so fast calls
// never touch the host and slow ones seldom).
//
// One call at a time: a kernel takes its call number E from the epoch word at
// its start, so two collectives of one workspace must never run at once on a
// rank (both would read E; the peers give E + 1 to the second one, whose flags
// and barrier values it then never sees). The host orders them: a launch on
// another stream than the previous one's waits on an event recorded on that one
// (mpiml.comm.backends.ipc.StreamOrder); graphs are ordered by the stream they
// are launched on. A wait that has lasted 20 us re-reads the epoch word with the
// error record (every 8192 spins): if it has moved (another kernel finished call
// E on this rank meanwhile), the record says MPIML_ERR_OVERLAP and the kernel
// ends then, not after timeout_ns; calls that do not wait that long never look.
//
// Reductions visit ranks in order 0, 1, ..., n-1 and accumulate float16 in
// float32, so every rank computes bit-identical results.

#define MPIML_MAX_RANKS 8
// Threads per block of the barrier kernels (the host launches them with
// mpiml.comm.backends.ipc.THREADS); they declare it as their launch bounds, so the
// compiler keeps within the 128 registers a thread of such a block may have. The
// LL kernels likewise run MPIML_LL_THREADS (ipc.LL_THREADS) a block: 512, so that up
// to 4 KiB a call is one block (a grid of several blocks ends through an atomic
// count of finished blocks, about 1.3 us more in a CUDA graph on 4 x H100).
#define MPIML_THREADS 512
#define MPIML_LL_THREADS 512
#define MPIML_MAX_BLOCKS 128
#define MPIML_FLAG_OFF 256
#define MPIML_DATA_OFF 16384
#define MPIML_ACK_OFF 128
#define MPIML_ERR_TIMEOUT 1
#define MPIML_ERR_ABORT 3
#define MPIML_ERR_OVERLAP 4

struct MpimlCtx {
    char* peers[MPIML_MAX_RANKS];  // workspace bases, this rank's own included
    long long rank;
    long long nranks;
    long long timeout_ns;          // 0: wait forever
    long long cap;                 // bytes of one staging buffer
    int* err;                      // host-mapped: [0] code, [1] peer, [2] block, [3] epoch,
                                   // [4] the epoch word when the wait gave up
    long long ll_off;              // offset of the LL slots in each workspace
    long long ll_slot;             // bytes of one LL slot (twice the payload)
};

__device__ __forceinline__ void mpiml_st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned mpiml_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long mpiml_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned* mpiml_flag(char* base, int slot, int block, int peer) {
    return reinterpret_cast<unsigned*>(base + MPIML_FLAG_OFF) +
           ((slot * MPIML_MAX_BLOCKS + block) * MPIML_MAX_RANKS + peer);
}

__device__ __forceinline__ char* mpiml_buf(const MpimlCtx* c, int r, unsigned epoch) {
    return c->peers[r] + MPIML_DATA_OFF + (long long)(epoch & 1u) * c->cap;
}

// Bounded waiting: call once per spin; true when the wait must end (timeout,
// or an error / abort recorded by anyone in the host-mapped record).
struct MpimlSpin {
    unsigned long long t0;
    unsigned spins;
};

__device__ __forceinline__ void mpiml_record_error(const MpimlCtx* c, int code, int peer, unsigned epoch,
                                                   unsigned seen) {
    volatile int* err = c->err;
    err[1] = peer;
    err[2] = blockIdx.x;
    err[3] = (int)epoch;
    err[4] = (int)seen;
    __threadfence_system();
    err[0] = code;
    __threadfence_system();
}

__device__ __forceinline__ bool mpiml_spin_expired(const MpimlCtx* c, MpimlSpin& s, int peer, unsigned epoch) {
    if (((++s.spins) & 511u) != 0) return false;
    const unsigned long long now = mpiml_globaltimer();
    if (s.t0 == 0) {
        s.t0 = now;
        return false;
    }
    if (now - s.t0 < 20000ull) return false;
    const bool expired = c->timeout_ns > 0 && now - s.t0 > (unsigned long long)c->timeout_ns;
    if ((s.spins & 8191u) != 0 && !expired) return false;
    // seldom from here: a host read, and the epoch word, which only this kernel's last block moves
    // (after this wait): another value means that another collective ran on this rank at the same
    // time (see "One call at a time")
    if (reinterpret_cast<volatile int*>(c->err)[0] != 0) return true;
    const unsigned seen = *reinterpret_cast<volatile const unsigned*>(c->peers[c->rank]);
    if (seen != epoch || expired) {
        mpiml_record_error(c, seen == epoch ? MPIML_ERR_TIMEOUT : MPIML_ERR_OVERLAP, peer, epoch, seen);
        return true;
    }
    return false;
}

__device__ __forceinline__ unsigned* mpiml_ack(char* base, int r) {
    return reinterpret_cast<unsigned*>(base + MPIML_ACK_OFF) + r;
}

// The call number, read once per block (volatile: never a stale cached copy),
// after every peer has finished call E - 2 (see "Reuse" above). The epoch and
// the acks are read at once (one memory latency); the wait spins only when a
// peer lags, which happens only after a kernel in which this rank waited for
// nobody (the root of a bcast).
__device__ __forceinline__ unsigned mpiml_begin(const MpimlCtx* c) {
    __shared__ unsigned s_epoch;
    const int t = threadIdx.x;
    char* mine = c->peers[c->rank];
    unsigned ack = 0u;
    if (t == 0) s_epoch = *reinterpret_cast<volatile unsigned*>(mine);
    if (t < c->nranks) ack = *reinterpret_cast<volatile unsigned*>(mpiml_ack(mine, t));
    __syncthreads();
    const unsigned epoch = s_epoch;
    int lag = 0;
    if (t < c->nranks && epoch >= 2u && (int)(ack - (epoch - 1u)) < 0) {
        lag = 1;
        const volatile unsigned* a = mpiml_ack(mine, t);
        MpimlSpin s{0ull, 0u};
        while ((int)(*a - (epoch - 1u)) < 0) {
            if (mpiml_spin_expired(c, s, t, epoch)) break;
        }
    }
    if (__syncthreads_or(lag)) __threadfence();  // a late ack: order our stores after it
    return epoch;
}

// The last block to finish advances the epoch for the next call and tells every
// peer that this rank has finished call `epoch` (its reads of the peers' data
// were performed before the block barrier, so the peers may reuse the buffers).
// FENCE: a device-wide fence before a block counts itself finished. The LL kernels
// pass false: their reads end in values this block has already used (stored to
// out) before the block barrier, as a one-block grid's do before its acks, which
// need no fence either; the epoch word and the count are read by the next kernel
// only. There the fence only waited for the block's stores into the peers' slots
// to cross NVLink (~1.3 us a call in a CUDA graph on 4 x H100 once a grid has two
// blocks); the barrier kernels' last barrier has already released theirs.
template <bool FENCE = true>
__device__ __forceinline__ void mpiml_end(const MpimlCtx* c, unsigned epoch) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* ctl = reinterpret_cast<unsigned*>(c->peers[c->rank]);
        bool last = gridDim.x == 1;
        if (!last) {
            if (FENCE) __threadfence();
            last = atomicAdd(ctl + 1, 1u) == gridDim.x - 1;
            if (last) ctl[1] = 0u;
        }
        if (last) {
            *reinterpret_cast<volatile unsigned*>(ctl) = epoch + 1u;
            for (int r = 0; r < c->nranks; ++r)
                *reinterpret_cast<volatile unsigned*>(mpiml_ack(c->peers[r], (int)c->rank)) = epoch + 1u;
        }
    }
}

// Barrier among all ranks for this block; false (on every thread) after a timeout.
__device__ __forceinline__ bool mpiml_barrier(const MpimlCtx* c, unsigned epoch, int slot) {
    const unsigned val = 2u * epoch + (unsigned)slot + 1u;
    const int me = (int)c->rank;
    int fail = 0;
    __syncthreads();  // this block's writes happen before its release below
    if (threadIdx.x < c->nranks) {
        const int t = threadIdx.x;
        mpiml_st_release(mpiml_flag(c->peers[t], slot, blockIdx.x, me), val);
        const unsigned* mine = mpiml_flag(c->peers[me], slot, blockIdx.x, t);
        MpimlSpin s{0ull, 0u};
        while ((int)(mpiml_ld_acquire(mine) - val) < 0) {
            if (mpiml_spin_expired(c, s, t, epoch)) {
                fail = 1;
                break;
            }
        }
    }
    return __syncthreads_or(fail) == 0;
}

// ---------------------------------------------------------------- LL lines
__device__ __forceinline__ uint4* mpiml_ll_slot(const MpimlCtx* c, int owner, unsigned epoch, int src) {
    return reinterpret_cast<uint4*>(c->peers[owner] + c->ll_off +
                                    ((long long)(epoch & 1u) * c->nranks + src) * c->ll_slot);
}

__device__ __forceinline__ void mpiml_ll_store(uint4* p, uint2 v, unsigned flag) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(flag), "r"(v.y), "r"(flag) : "memory");
}

// The LL slots of parity epoch % 2 of rank `owner` as one array of lines (nranks * ll_slot / 16
// of them): the two-shot LL kernels index it by line number, not by source.
__device__ __forceinline__ uint4* mpiml_ll_region(const MpimlCtx* c, int owner, unsigned epoch) {
    return reinterpret_cast<uint4*>(c->peers[owner] + c->ll_off + (long long)(epoch & 1u) * c->nranks * c->ll_slot);
}

// Spin until line p carries `flag` in both halves; false on timeout / abort.
__device__ __forceinline__ bool mpiml_ll_load(const MpimlCtx* c, const uint4* p, unsigned flag, uint2& v,
                                              int peer, unsigned epoch) {
    MpimlSpin s{0ull, 0u};
    for (;;) {
        uint4 w;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "l"(p) : "memory");
        if (w.y == flag && w.w == flag) {
            v = make_uint2(w.x, w.z);
            return true;
        }
        if (mpiml_spin_expired(c, s, peer, epoch)) return false;
    }
}

// Line i (bytes [8i, 8i + 8)) of a user array of nbytes; A: 8-byte aligned.
template <bool A>
__device__ __forceinline__ uint2 mpiml_ll_get(const void* a, long long i, long long nbytes) {
    if (A && 8 * i + 8 <= nbytes) return reinterpret_cast<const uint2*>(a)[i];
    union { uint2 v; unsigned char b[8]; } u;
    u.v = make_uint2(0u, 0u);
    const unsigned char* p = reinterpret_cast<const unsigned char*>(a);
#pragma unroll
    for (int k = 0; k < 8; ++k)
        if (8 * i + k < nbytes) u.b[k] = p[8 * i + k];
    return u.v;
}

template <bool A>
__device__ __forceinline__ void mpiml_ll_put(void* a, long long i, long long nbytes, uint2 v) {
    if (A && 8 * i + 8 <= nbytes) {
        reinterpret_cast<uint2*>(a)[i] = v;
        return;
    }
    union { uint2 v; unsigned char b[8]; } u;
    u.v = v;
    unsigned char* p = reinterpret_cast<unsigned char*>(a);
#pragma unroll
    for (int k = 0; k < 8; ++k)
        if (8 * i + k < nbytes) p[8 * i + k] = u.b[k];
}

// ---------------------------------------------------------------- element types
// float16 travels as its 16 bits and is reduced in float32.
typedef unsigned short mpiml_half;

template <typename T> struct MpimlAcc {
    typedef T type;
    __device__ __forceinline__ static T load(T v) { return v; }
    __device__ __forceinline__ static T store(T v) { return v; }
};

template <> struct MpimlAcc<mpiml_half> {
    typedef float type;
    __device__ __forceinline__ static float load(mpiml_half h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    __device__ __forceinline__ static mpiml_half store(float f) {
        mpiml_half h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

// Ops: 0 sum, 1 prod, 2 min, 3 max (min/max propagate NaN like NumPy).
template <int OP> struct MpimlOp;
template <> struct MpimlOp<0> { template <typename A> __device__ __forceinline__ static A f(A a, A b) { return a + b; } };
template <> struct MpimlOp<1> { template <typename A> __device__ __forceinline__ static A f(A a, A b) { return a * b; } };
template <> struct MpimlOp<2> {
    template <typename A> __device__ __forceinline__ static A f(A a, A b) { return (a != a) ? a : ((b < a) ? b : a); }
};
template <> struct MpimlOp<3> {
    template <typename A> __device__ __forceinline__ static A f(A a, A b) { return (a != a) ? a : ((b > a) ? b : a); }
};

// Work is mapped in packs of 16 bytes (L = 16 / sizeof(T) elements) of the
// workspace, whatever the alignment of the user's arrays: the mapping of
// elements to (block, thread) then depends only on the element count, which
// every rank agrees on, so each block's barrier covers what it reads. User
// arrays are read and written in whole packs when 16-byte aligned (A = true)
// and element by element otherwise, and at the tail.
template <typename T> struct __align__(16) MpimlPack {
    static constexpr int L = 16 / sizeof(T);
    T e[16 / sizeof(T)];
};

// Packs of n elements (the last one may be partial).
template <typename T>
__device__ __forceinline__ long long mpiml_units(long long n) {
    return (n + MpimlPack<T>::L - 1) / MpimlPack<T>::L;
}

template <typename T, bool A>
__device__ __forceinline__ MpimlPack<T> mpiml_load_user(const T* a, long long i, long long n) {
    constexpr int L = MpimlPack<T>::L;
    MpimlPack<T> p;
    if (A && (i + 1) * L <= n) {
        p = *reinterpret_cast<const MpimlPack<T>*>(a + i * L);
    } else {
#pragma unroll
        for (int k = 0; k < L; ++k) p.e[k] = (i * L + k < n) ? a[i * L + k] : T();
    }
    return p;
}

template <typename T, bool A>
__device__ __forceinline__ void mpiml_store_user(T* a, long long i, long long n, const MpimlPack<T>& p) {
    constexpr int L = MpimlPack<T>::L;
    if (A && (i + 1) * L <= n) {
        *reinterpret_cast<MpimlPack<T>*>(a + i * L) = p;
    } else {
#pragma unroll
        for (int k = 0; k < L; ++k)
            if (i * L + k < n) a[i * L + k] = p.e[k];
    }
}

// Loads of peers' workspaces skip L1: they change between calls behind L1's back.
template <typename T>
__device__ __forceinline__ MpimlPack<T> mpiml_ld(const MpimlPack<T>* p) {
    uint4 v = __ldcg(reinterpret_cast<const uint4*>(p));
    return *reinterpret_cast<MpimlPack<T>*>(&v);
}

template <typename T>
__device__ __forceinline__ MpimlPack<T>* mpiml_packs(const MpimlCtx* c, int r, unsigned epoch) {
    return reinterpret_cast<MpimlPack<T>*>(mpiml_buf(c, r, epoch));
}

// op over the words v[0], ..., v[m - 1] (m <= MPIML_MAX_RANKS), in that order: a word V holds L elements of
// T (a 16-byte pack, an LL line's 8 bytes, an LL128 lane's word) and is reduced element by element
// (float16 in float32). Every reduction of the collectives goes through this one loop, so every path
// visits the ranks in the same order with the same arithmetic: the same bits on every rank and path.
template <typename T, int OP, int L, typename V>
__device__ __forceinline__ V mpiml_fold_elems(const V* v, int m) {
    static_assert(sizeof(V) == L * sizeof(T), "a word holds L elements of T");
    typedef typename MpimlAcc<T>::type Acc;
    union Word { V w; T e[L]; };
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

// op over packs v[0], ..., v[m - 1], in that order.
template <typename T, int OP>
__device__ __forceinline__ MpimlPack<T> mpiml_fold(const MpimlPack<T>* v, int m) {
    return mpiml_fold_elems<T, OP, MpimlPack<T>::L>(v, m);
}

// Every load issued before the first is used (below) keeps up to MPIML_MAX_RANKS
// packs in registers; a one-byte type holds its 16 elements a pack in 16 of them,
// more than a 512-thread block has, so one-byte types load and use one rank at a
// time instead.
template <typename T>
struct MpimlLoadsFirst {
    static constexpr bool value = sizeof(T) > 1;
};

// op over ranks [r0, r1) of pack i of each rank's buffer, in rank order. Every
// load is issued before the first is used: one link latency, not r1 - r0 of them.
template <typename T, int OP>
__device__ __forceinline__ MpimlPack<T> mpiml_reduce_packs(const MpimlCtx* c, unsigned epoch, long long i,
                                                           int r0, int r1) {
    if constexpr (MpimlLoadsFirst<T>::value) {
        MpimlPack<T> v[MPIML_MAX_RANKS];
#pragma unroll
        for (int j = 0; j < MPIML_MAX_RANKS; ++j)
            if (r0 + j < r1) v[j] = mpiml_ld(mpiml_packs<T>(c, r0 + j, epoch) + i);
        return mpiml_fold<T, OP>(v, r1 - r0);
    } else {
        MpimlPack<T> acc = mpiml_ld(mpiml_packs<T>(c, r0, epoch) + i);
        for (int r = r0 + 1; r < r1; ++r) {
            MpimlPack<T> v[2] = {acc, mpiml_ld(mpiml_packs<T>(c, r, epoch) + i)};
            acc = mpiml_fold<T, OP>(v, 2);
        }
        return acc;
    }
}

// op over src[r * stride + i] for r = 0..m-1 (the sources' copies of one pack,
// pushed into this rank's own buffer), in rank order; loads first, as above.
template <typename T, int OP>
__device__ __forceinline__ MpimlPack<T> mpiml_reduce_strided(const MpimlPack<T>* src, long long stride, long long i,
                                                             int m) {
    if constexpr (MpimlLoadsFirst<T>::value) {
        MpimlPack<T> v[MPIML_MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r)
            if (r < m) v[r] = mpiml_ld(src + r * stride + i);
        return mpiml_fold<T, OP>(v, m);
    } else {
        MpimlPack<T> acc = mpiml_ld(src + i);
        for (int r = 1; r < m; ++r) {
            MpimlPack<T> v[2] = {acc, mpiml_ld(src + r * stride + i)};
            acc = mpiml_fold<T, OP>(v, 2);
        }
        return acc;
    }
}

// dst(r, pack) for every rank r < nr but `skip` whose src(r) is not null: the
// copies of a pack from several ranks' parts; loads first, as above.
template <typename T, typename Src, typename Dst>
__device__ __forceinline__ void mpiml_copy_ranks(int nr, int skip, Src src, Dst dst) {
    if constexpr (MpimlLoadsFirst<T>::value) {
        MpimlPack<T> v[MPIML_MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
            const MpimlPack<T>* p = (r < nr && r != skip) ? src(r) : nullptr;
            if (p != nullptr) v[r] = mpiml_ld(p);
        }
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
            if (r < nr && r != skip && src(r) != nullptr) dst(r, v[r]);
        }
    } else {
        for (int r = 0; r < nr; ++r) {
            const MpimlPack<T>* p = r != skip ? src(r) : nullptr;
            if (p != nullptr) dst(r, mpiml_ld(p));
        }
    }
}

#define MPIML_GRID_LOOP(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

// The first phase of the pushed kernels (two-shot allreduce and reduce, one-shot
// reduce-scatter): part r of the input, elements [d, d + len) as part(r, d, len)
// gives them (len <= 0: none), goes into rank r's buffer at [me * stride] packs,
// the peers' parts first and this rank's own last (the stores that cross the links
// go out first). Pack i of a part is written by grid index i, on every rank: the
// kernels' later phases read it with the same (block, thread), so a block's
// barrier covers it. A: in and every part's start are 16-byte aligned.
template <typename T, bool A, typename Part>
__device__ __forceinline__ void mpiml_push_parts(const MpimlCtx* c, unsigned epoch, const T* in, long long stride,
                                                 Part part) {
    constexpr int L = MpimlPack<T>::L;
    const int nr = (int)c->nranks, me = (int)c->rank;
    for (int k = 1; k <= nr; ++k) {
        const int r = (me + k) % nr;
        long long d = 0, len = 0;
        part(r, d, len);
        MpimlPack<T>* dst = mpiml_packs<T>(c, r, epoch) + me * stride;
        MPIML_GRID_LOOP(i, (len + L - 1) / L) dst[i] = mpiml_load_user<T, A>(in + d, i, len);
    }
}

// Part r of an array of n elements cut into parts of `part` packs (the two-shot kernels).
template <typename T>
struct MpimlEvenParts {
    long long n, part;
    __device__ __forceinline__ void operator()(int r, long long& d, long long& len) const {
        d = r * part * MpimlPack<T>::L;
        len = min(part * MpimlPack<T>::L, n - d);
    }
};

// Line i of this rank's slots [r] for every rank r < nranks, in v[r]; false on a
// timeout or abort. Every slot's line is loaded before any flag is looked at: the
// lines of most calls have all arrived by then, and one memory latency is paid
// instead of nranks (a spin, per slot, only for a line still on its way). OWN >= 0:
// rank OWN's line is `ownv` (this rank's own input, never stored into its own slot).
__device__ __forceinline__ bool mpiml_ll_load_ranks(const MpimlCtx* c, unsigned epoch, unsigned flag, long long i,
                                                    uint2 (&v)[MPIML_MAX_RANKS], int own = -1,
                                                    uint2 ownv = make_uint2(0u, 0u)) {
    const int nr = (int)c->nranks, me = (int)c->rank;
    uint4 w[MPIML_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r == own) {
            w[r] = make_uint4(ownv.x, flag, ownv.y, flag);
        } else if (r < nr) {
            asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[r].x), "=r"(w[r].y), "=r"(w[r].z), "=r"(w[r].w)
                         : "l"(mpiml_ll_slot(c, me, epoch, r) + i) : "memory");
        }
    }
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r < nr) {
            if (w[r].y == flag && w[r].w == flag) {
                v[r] = make_uint2(w[r].x, w[r].z);
            } else if (!mpiml_ll_load(c, mpiml_ll_slot(c, me, epoch, r) + i, flag, v[r], r, epoch)) {
                return false;
            }
        }
    }
    return true;
}

// Lines p[r * stride] for every rank r < nranks (rank r's copy of one line in this rank's
// own region), in v[r], loaded at once as in mpiml_ll_load_ranks; false on a timeout or abort.
__device__ __forceinline__ bool mpiml_ll_load_strided(const MpimlCtx* c, unsigned epoch, unsigned flag,
                                                      const uint4* p, long long stride, uint2 (&v)[MPIML_MAX_RANKS]) {
    const int nr = (int)c->nranks;
    uint4 w[MPIML_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r < nr) {
            asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w[r].x), "=r"(w[r].y), "=r"(w[r].z), "=r"(w[r].w) : "l"(p + r * stride) : "memory");
        }
    }
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        if (r < nr) {
            if (w[r].y == flag && w[r].w == flag) {
                v[r] = make_uint2(w[r].x, w[r].z);
            } else if (!mpiml_ll_load(c, p + r * stride, flag, v[r], r, epoch)) {
                return false;
            }
        }
    }
    return true;
}

// One LL line reduced over every rank's slot, in rank order 0..n-1 (bit-identical
// everywhere); ok becomes false on a timeout or abort. STRIDED: rank r's line is
// p[r * stride] of this rank's region (the two-shot LL reduce) instead of line i of
// slot [r].
template <typename T, int OP, bool STRIDED = false>
__device__ __forceinline__ uint2 mpiml_ll_reduce_line(const MpimlCtx* c, unsigned epoch, unsigned flag, long long i,
                                                      bool& ok, const uint4* p = nullptr, long long stride = 0,
                                                      int own = -1, uint2 ownv = make_uint2(0u, 0u)) {
    uint2 got[MPIML_MAX_RANKS];
    if (!(STRIDED ? mpiml_ll_load_strided(c, epoch, flag, p, stride, got)
                  : mpiml_ll_load_ranks(c, epoch, flag, i, got, own, ownv))) {
        ok = false;
        return make_uint2(0u, 0u);
    }
    return mpiml_fold_elems<T, OP, 8 / sizeof(T)>(got, (int)c->nranks);
}

// ---------------------------------------------------------------- blocks the kernels share
// The first phase of the one-shot kernels: this rank's n elements into its own
// buffer of call `epoch` (pack i by grid index i, which reads it back after the barrier).
template <typename T, bool A>
__device__ __forceinline__ void mpiml_stage_in(const MpimlCtx* c, unsigned epoch, const T* in, long long n) {
    MpimlPack<T>* mine = mpiml_packs<T>(c, (int)c->rank, epoch);
    MPIML_GRID_LOOP(i, mpiml_units<T>(n)) mine[i] = mpiml_load_user<T, A>(in, i, n);
}

// The last phase of the two-shot kernels (after their second barrier): pack i of
// every part r but this rank's own, from `parts` (r * part + i, in this rank's own
// memory), to out, for the packs below `units`. Loads first (mpiml_copy_ranks).
template <typename T, bool A>
__device__ __forceinline__ void mpiml_parts_out(int nr, int me, const MpimlPack<T>* parts, long long part,
                                                long long units, long long i, T* out, long long n) {
    mpiml_copy_ranks<T>(
        nr, me, [&](int r) { return r * part + i < units ? parts + r * part + i : nullptr; },
        [&](int r, const MpimlPack<T>& v) { mpiml_store_user<T, A>(out, r * part + i, n, v); });
}

// An LL kernel's lines: nbytes of payload in 8-byte lines; the call number and
// the lines' flag. This thread's first line of the input (if it sends: `sends`)
// is read before the call number, so the read overlaps mpiml_begin's wait.
// A: the input and output are 8-byte aligned.
template <bool A>
struct MpimlLines {
    long long nbytes, lines, i0;
    uint2 v0;
    unsigned epoch, flag;

    __device__ __forceinline__ MpimlLines(const MpimlCtx* c, const void* in, long long bytes, bool sends) {
        nbytes = bytes;
        lines = (bytes + 7) / 8;
        i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        v0 = (sends && i0 < lines) ? mpiml_ll_get<A>(in, i0, bytes) : make_uint2(0u, 0u);
        epoch = mpiml_begin(c);
        flag = epoch + 1u;
    }

    // line i of the input (the first one as read above)
    __device__ __forceinline__ uint2 get(const void* in, long long i) const {
        return i == i0 ? v0 : mpiml_ll_get<A>(in, i, nbytes);
    }
};

// Every line of `in` into the LL slot [me] of ranks (me + k) % nranks for k in
// [k0, k1] (the peers before this rank's own: their stores cross the links).
template <bool A>
__device__ __forceinline__ void mpiml_ll_push(const MpimlCtx* c, const MpimlLines<A>& ln, const void* in, int k0,
                                              int k1) {
    const int nr = (int)c->nranks, me = (int)c->rank;
    MPIML_GRID_LOOP(i, ln.lines) {
        const uint2 v = ln.get(in, i);
        for (int k = k0; k <= k1; ++k) mpiml_ll_store(mpiml_ll_slot(c, (me + k) % nr, ln.epoch, me) + i, v, ln.flag);
    }
}

// Every rank's lines (slot [r] of this rank) to out + r * stride elements of T, the
// nranks lines of one index loaded at once (mpiml_ll_load_ranks); this rank's own
// from `in` (its slot is not written).
template <typename T, bool A>
__device__ __forceinline__ void mpiml_ll_gather_out(const MpimlCtx* c, const MpimlLines<A>& ln, T* out,
                                                    long long stride, const T* in) {
    const int nr = (int)c->nranks;
    MPIML_GRID_LOOP(i, ln.lines) {
        uint2 v[MPIML_MAX_RANKS];
        if (!mpiml_ll_load_ranks(c, ln.epoch, ln.flag, i, v, (int)c->rank, ln.get(in, i))) break;
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r)
            if (r < nr) mpiml_ll_put<A>(out + r * stride, i, ln.nbytes, v[r]);
    }
}

// The lines of this rank's slot [src] to out as their flags arrive; false on a timeout or abort.
template <bool A>
__device__ __forceinline__ bool mpiml_ll_copy_out(const MpimlCtx* c, const MpimlLines<A>& ln, int src, void* out) {
    MPIML_GRID_LOOP(i, ln.lines) {
        uint2 v;
        if (!mpiml_ll_load(c, mpiml_ll_slot(c, (int)c->rank, ln.epoch, src) + i, ln.flag, v, src, ln.epoch))
            return false;
        mpiml_ll_put<A>(out, i, ln.nbytes, v);
    }
    return true;
}

// The lines of every rank's slot reduced in rank order (mpiml_ll_reduce_line) to out,
// `lines` lines of nbytes (this rank's part of a reduce-scatter, or the whole call).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll_reduce_out(const MpimlCtx* c, unsigned epoch, unsigned flag, void* out,
                                                    long long nbytes) {
    bool ok = true;
    MPIML_GRID_LOOP(i, (nbytes + 7) / 8) {
        const uint2 v = mpiml_ll_reduce_line<T, OP>(c, epoch, flag, i, ok);
        if (!ok) break;
        mpiml_ll_put<A>(out, i, nbytes, v);
    }
}

// LL two-shot reduction (no barrier; the reduce and allreduce `lltwoshot` kernels): the
// lines are cut into nranks parts of `part` lines. Every rank pushes line r * part + i of
// its input into rank r's LL region (mpiml_ll_region) at [me * part + i]; rank r reduces
// the nranks copies of its part's line i in rank order as they arrive (bit-identical to the
// other kernels) and pushes the result into the region of every rank that receives
// (root < 0: every rank; else the root) at [nranks * part + r * part + i], storing its own
// to out if it receives; a receiving rank then copies the other parts' reduced lines out as
// they arrive. Line i of every part is handled by grid index i on every rank, and every
// wait depends only on the same grid index of ranks that pushed before they waited. The
// host keeps 2 * nranks * part lines within the region and launches one grid index per
// line of a part. A counts 8-byte alignment; a thread writes out[g] only after it read
// in[g], and the lines of one index are all read before any is written (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll_twoshot_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                        int root) {
    const MpimlLines<A> ln(c, in, n * (long long)sizeof(T), true);
    const int nr = (int)c->nranks, me = (int)c->rank;
    const bool receives = root < 0 || me == root;
    const long long part = (ln.lines + nr - 1) / nr;
    const uint4* mine = mpiml_ll_region(c, me, ln.epoch);
    bool ok = true;
    MPIML_GRID_LOOP(i, part) {
        for (int k = 1; k <= nr; ++k) {  // own part last: the stores that cross the links go out first
            const int r = (me + k) % nr;
            const long long g = r * part + i;
            if (g < ln.lines)
                mpiml_ll_store(mpiml_ll_region(c, r, ln.epoch) + me * part + i, ln.get(in, g), ln.flag);
        }
        const long long g = me * part + i;
        if (g < ln.lines) {
            const uint2 v = mpiml_ll_reduce_line<T, OP, true>(c, ln.epoch, ln.flag, i, ok, mine + i, part);
            if (!ok) break;
            if (root < 0) {
                for (int k = 1; k < nr; ++k)
                    mpiml_ll_store(mpiml_ll_region(c, (me + k) % nr, ln.epoch) + nr * part + g, v, ln.flag);
            } else if (me != root) {
                mpiml_ll_store(mpiml_ll_region(c, root, ln.epoch) + nr * part + g, v, ln.flag);
            }
            if (receives) mpiml_ll_put<A>(out, g, ln.nbytes, v);
        }
        if (receives) {
            for (int k = 1; k < nr && ok; ++k) {
                const int r = (me + k) % nr;
                const long long h = r * part + i;
                if (h < ln.lines) {
                    uint2 v;
                    ok = mpiml_ll_load(c, mine + nr * part + h, ln.flag, v, r, ln.epoch);
                    if (ok) mpiml_ll_put<A>(out, h, ln.nbytes, v);
                }
            }
            if (!ok) break;
        }
    }
    mpiml_end<false>(c, ln.epoch);
}

// ---------------------------------------------------------------- LL128 lines
// An LL128 line is 128 bytes: 15 words of 8 payload bytes and a flag word, written by the 8
// lanes of a warp that hold it (16 bytes each, lane 7: word 14 and the flag) with one vector
// store each, the warp converged, so that the line crosses NVLink as one 128-byte write and
// arrives whole (the property NCCL's LL128 protocol relies on over NVLink): a reader that
// sees the flag in lane 7's half has the whole line from the same warp-wide load. Payload
// word w of a message is word w % 15 of line w / 15.
//
// The LL128 kernels keep their lines in the staging buffers (mpiml_buf), not in the LL slots:
// their payload fills every 16 bytes of a line, so a plain LL line's two flag words could be
// any payload there, and an LL kernel of a later call of that parity could take a stale
// LL128 line's payload for its own flags. The staging buffers hold the barrier kernels' plain
// data, which nobody reads without a barrier; an LL128 reader looks there for a 64-bit flag
// word (mpiml_ll128_flag) that a multiplicative hash of the call number makes: distinct for
// every call, and a stale payload word of the barrier kernels or of an earlier call's lines
// (lines are always 128-byte aligned from the buffer's start, so a flag word only ever meets
// flag words) meets it by chance alone (one in 2^64).
#define MPIML_LL128_WORDS 15

__device__ __forceinline__ unsigned long long mpiml_ll128_flag(unsigned epoch) {
    return (unsigned long long)(epoch + 1u) * 0x9E3779B97F4A7C15ull;  // (odd: one word per call number)
}

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

// This lane's 16 bytes of the lines p[r * stride] (r < m but `skip`; act: this lane's lines exist),
// loaded together and again until every line's flag has come, then loaded once more (warp-wide:
// every lane of the warp calls this); false on every lane after a timeout or abort.
//
// Only lane 7 of a line looks at the flag, and a line that arrives while it is being loaded may be
// seen in part: its flag (new) with other lanes' 16 bytes still stale. The early pass of
// 2026-11-28 01:15 found that in the soak (two wrong results in ~12000 allreduces of 1 MiB on
// ipc/ll128, 4 x H100): the data of a line are taken from a second load, issued after every flag
// of the round has been seen (as NCCL's LL128 receive does), never from the load that found the
// flag; and the warp is converged before each round of loads (__syncwarp), so that the 8 lanes of
// a line load it in one instruction. tests/comm/gpu_ll128_lines.py races every LL128 path (and,
// with --legacy, the kernel without these two lines).
__device__ __forceinline__ bool mpiml_ll128_wait(const MpimlCtx* c, unsigned epoch, const ulonglong2* p,
                                                 long long stride, int m, bool act, unsigned long long flagword,
                                                 ulonglong2 (&v)[MPIML_MAX_RANKS], int skip = -1) {
    const bool checks = act && (threadIdx.x & 7) == 7;
    MpimlSpin s{0ull, 0u};
    for (;;) {
        __syncwarp();  // (mpiml_ll128_wait: one load instruction a line)
        bool bad = false;
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
            if (r < m && r != skip && act) {
                v[r] = mpiml_ll128_ld(p + r * stride);
                bad |= checks && v[r].y != flagword;
            }
        }
        if (!__any_sync(0xffffffffu, bad)) {
            // (mpiml_ll128_wait: the data from a load after the flags)
#pragma unroll
            for (int r = 0; r < MPIML_MAX_RANKS; ++r)
                if (r < m && r != skip && act) v[r] = mpiml_ll128_ld(p + r * stride);
            return true;
        }
        if (__any_sync(0xffffffffu, mpiml_spin_expired(c, s, (int)c->rank, epoch))) return false;
    }
}

// This lane's 16 bytes of a line whose copies u[r] are rank r's (r < m), reduced in rank order
// (mpiml_fold_elems on each 8-byte word); lane 7's second word is the flag word.
template <typename T, int OP>
__device__ __forceinline__ ulonglong2 mpiml_ll128_fold(const ulonglong2 (&u)[MPIML_MAX_RANKS], int m, int sub,
                                                      unsigned long long flagword) {
    unsigned long long w[MPIML_MAX_RANKS];
    ulonglong2 red;
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) w[r] = r < m ? u[r].x : 0ull;
    red.x = mpiml_fold_elems<T, OP, 8 / sizeof(T)>(w, m);
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) w[r] = r < m ? u[r].y : 0ull;
    red.y = sub == 7 ? flagword : mpiml_fold_elems<T, OP, 8 / sizeof(T)>(w, m);
    return red;
}

// The same with this rank's copy `own` and the others' v[k] (rank (me + 1 + k) % nranks's, k < nranks - 1:
// the order in which the relay's owners and the direct reduce's root find them in their region).
template <typename T, int OP>
__device__ __forceinline__ ulonglong2 mpiml_ll128_fold_own(const ulonglong2 (&v)[MPIML_MAX_RANKS], ulonglong2 own,
                                                          int me, int nr, int sub, unsigned long long flagword) {
    ulonglong2 u[MPIML_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < MPIML_MAX_RANKS; ++r) {
        // (selected, not indexed: an index known only at run time would put v in local memory)
        const int k = (r - me - 1 + nr) % nr;
        u[r] = own;
#pragma unroll
        for (int j = 0; j < MPIML_MAX_RANKS - 1; ++j)
            if (r != me && j == k) u[r] = v[j];
    }
    return mpiml_ll128_fold<T, OP>(u, nr, sub, flagword);
}

// An LL128 kernel's call (every LL128 kernel starts with one): nbytes of payload in `lines` lines, the call
// number and its flag word, and this lane's place. A warp holds 4 lines a round (8 lanes a line: lane l holds
// 16 bytes, sub = l % 8, of line base + l / 8), every warp of every rank the same ones (the grid is agreed):
// rounds at base = 4 * warp, 4 * (warp + warps), ... (MPIML_LL128_ROUNDS). region(r): rank r's staging buffer
// of this call's parity, as 16-byte lanes (line g at 8 g).
//
// Roles: with split = 0 every warp pushes its lines (pushes) and then waits for and handles the lines that
// arrive (waits). With 0 < split < warps a block, the block's first `split` warps only push and the others
// only wait, each role numbering its own warps across the grid (warp, warps): a warp that waits never holds
// back a push of its rank (a warp that does both issues its second hop only once the stores of all its
// pushes have left, which at a few MiB is once the links have carried most of the first hop), so the
// second hop runs while the first is still on the links. Deadlock-free as before: a push never waits, and
// every block is resident (the host's grid).
struct MpimlLL128 {
    const MpimlCtx* c;
    long long nbytes, lines, warp, warps;
    unsigned epoch;
    unsigned long long flagword;
    int lane, sub;
    bool pushes, waits;

    __device__ __forceinline__ MpimlLL128(const MpimlCtx* ctx, long long bytes, int split = 0) : c(ctx) {
        nbytes = bytes;
        lines = ((bytes + 7) / 8 + MPIML_LL128_WORDS - 1) / MPIML_LL128_WORDS;
        epoch = mpiml_begin(ctx);
        flagword = mpiml_ll128_flag(epoch);
        lane = threadIdx.x & 31;
        sub = lane & 7;
        const int w = (int)(threadIdx.x >> 5), per = (int)(blockDim.x >> 5);
        if (split > 0 && split < per) {  // (warp-uniform)
            pushes = w < split;
            waits = !pushes;
            const int k = pushes ? split : per - split;
            warp = (long long)blockIdx.x * k + (pushes ? w : w - split);
            warps = (long long)gridDim.x * k;
        } else {
            pushes = waits = true;
            warp = (long long)blockIdx.x * per + w;
            warps = (long long)gridDim.x * per;
        }
    }

    __device__ __forceinline__ ulonglong2* region(int r) const {
        return reinterpret_cast<ulonglong2*>(mpiml_buf(c, r, epoch));
    }

    // this lane's line of the round at `base`
    __device__ __forceinline__ long long line(long long base) const { return base + (lane >> 3); }

    // Every round of this warp over lines i < part, for k = 1..K: dest(k, g0, dst) names the input's
    // lines g0 + i and where they go (line i at dst + 8 i), or returns false (nothing for this k; the
    // same on every lane). Line g0 + i of `in` is stored there where it exists (g0 + i < lines). A push
    // never waits: a warp pushes the lines of all its rounds before it waits for any (the peers' waits
    // for line i never depend on this warp's waits, whatever the number of rounds).
    template <bool A, typename Dest>
    __device__ __forceinline__ void push(const void* in, long long part, int K, Dest dest) const {
        for (long long base = 4 * warp; base < part; base += 4 * warps) {  // warp-uniform
            const long long i = line(base);
            for (int k = 1; k <= K; ++k) {
                long long g0 = 0;
                ulonglong2* dst = nullptr;
                if (!dest(k, g0, dst)) continue;
                const long long g = g0 + i;
                const ulonglong2 v = mpiml_ll128_get<A>(in, g, sub, nbytes, flagword);
                __syncwarp();
                if (i < part && g < lines) mpiml_ll128_store(dst + 8 * i + sub, v);
            }
        }
    }
};

// The rounds of an LL128 kernel's warp (ll: an MpimlLL128) over lines below `count`: base is warp-uniform.
#define MPIML_LL128_ROUNDS(ll, base, count) \
    for (long long base = 4 * (ll).warp; base < (count); base += 4 * (ll).warps)

// ---------------------------------------------------------------- pipelined two-shot (`pipe`)
// Flags of the pipelined kernels, after the LL slots: [MPIML_PIPE_WORDS] words per rank
// (the host allocates and zeroes them with the workspace). In a rank's region, word
// [w * MPIML_PIPE_MAX_STEPS + k] is written by rank w when its copy of step k of the part
// that rank reduces (or forwards) has arrived there, and word
// [(MPIML_MAX_RANKS + w) * MPIML_PIPE_MAX_STEPS + k] by rank w when step k of the part w
// owns, reduced, has. A word has one writer whatever the call (the row is the writer's
// rank, never a part, whose owner moves with the root), a flag carries the call's
// epoch + 1 and only grows, so the flags need no parity: a writer a call ahead writes a
// larger value after the data of the call a reader waits for (the data itself alternates
// between the two buffers, and the ack in mpiml_begin keeps a writer from the buffer a
// reader still reads).
#define MPIML_PIPE_MAX_STEPS 2048
#define MPIML_PIPE_WORDS (2 * MPIML_MAX_RANKS * MPIML_PIPE_MAX_STEPS)

__device__ __forceinline__ unsigned* mpiml_pipe_flag(const MpimlCtx* c, int owner, int row, long long k) {
    return reinterpret_cast<unsigned*>(c->peers[owner] + c->ll_off + 2 * c->nranks * c->ll_slot) +
           ((long long)row * MPIML_PIPE_MAX_STEPS + k);
}

// Spin (acquire, system scope) until *p has reached flag; false on a timeout or abort.
__device__ __forceinline__ bool mpiml_pipe_wait(const MpimlCtx* c, const unsigned* p, unsigned flag, int peer,
                                                unsigned epoch) {
    MpimlSpin s{0ull, 0u};
    while ((int)(mpiml_ld_acquire(p) - flag) < 0) {
        if (mpiml_spin_expired(c, s, peer, epoch)) return false;
    }
    return true;
}

// op over the packs src(0), ..., src(m - 1), in that order (src(r) loads rank r's pack);
// loads first where the registers allow (MpimlLoadsFirst).
template <typename T, int OP, typename Src>
__device__ __forceinline__ MpimlPack<T> mpiml_reduce_from(int m, Src src) {
    if constexpr (MpimlLoadsFirst<T>::value) {
        MpimlPack<T> v[MPIML_MAX_RANKS];
#pragma unroll
        for (int r = 0; r < MPIML_MAX_RANKS; ++r)
            if (r < m) v[r] = src(r);
        return mpiml_fold<T, OP>(v, m);
    } else {
        MpimlPack<T> acc = src(0);
        for (int r = 1; r < m; ++r) {
            MpimlPack<T> v[2] = {acc, src(r)};
            acc = mpiml_fold<T, OP>(v, 2);
        }
        return acc;
    }
}

// Pipelined two-shot: KIND 0 allreduce, 1 reduce to `root`, 2 bcast from `root`.
// The packs are cut into q parts of `part` packs, each owned by one rank (allreduce:
// part j by rank j, q = nranks; reduce and bcast: by the non-root (root + 1 + j) % nranks,
// q = nranks - 1, so that the root's links carry n bytes each way, not 1.5 n), and
// every part into steps of S packs (S = extra >> 4; root = extra & 15). Step k of every
// part is handled by block k % gridDim.x on every rank, in three phases:
//   A. every source (every rank; bcast: the root) stores step k of part j of its input
//      into the owner's buffer at [src * part] (its own part: read in B from the input),
//      then sets its flag [src][k] there;
//   B. the owner waits for the sources' flags of step k, reduces their copies in rank
//      order (bcast: takes the root's), stores the result into every other receiver's
//      buffer at [nranks * part + j * part] (receivers: every rank; the root; the
//      non-roots) and to out if it receives, then sets its flag [MAX_RANKS + owner][k] there;
//   C. a receiver waits for the flag of step k of every other part and copies it out.
// A block first sends every step of its own (A never waits), then takes its steps in
// order through B, and through C one step behind (the copy of the previous step while
// this one's peers are still on their way). No barrier: B waits only for A of the same
// step on the peers, and C only for B, so the phases flow through the links as a
// pipeline (a reduce's owners receive the sources' steps while they send the root the
// steps already reduced). A pack is read from `in` (A or B) and written to out (B or C)
// by the same thread (pack i of a step is thread i % blockDim.x's in every phase), and
// every read of `in` by a block comes before its first write to out: in == out is safe
// as long as no block writes what another reads. Writes: B stores packs of this rank's
// own part, which no other block reads; C stores the other parts' packs of its own
// steps, which only A of the same block read (all of them before). The host keeps
// (nranks + q) * part packs within one staging buffer and at most MPIML_PIPE_MAX_STEPS
// steps a part.
template <typename T, int OP, bool A, int KIND>
__device__ __forceinline__ void mpiml_pipe(const MpimlCtx* c, const T* in, T* out, long long n, long long extra) {
    const unsigned epoch = mpiml_begin(c);
    const unsigned flag = epoch + 1u;
    const int nr = (int)c->nranks, me = (int)c->rank, root = (int)(extra & 15);
    const long long S = extra >> 4;
    const int q = KIND == 0 ? nr : nr - 1;
    const long long units = mpiml_units<T>(n);
    const long long part = (units + q - 1) / q;
    const long long steps = (part + S - 1) / S;
    // part j's owner, and this rank's part (-1: none)
    auto owner = [=](int j) { return KIND == 0 ? j : (root + 1 + j) % nr; };
    const int jm = KIND == 0 ? me : (me == root ? -1 : (me - root - 1 + nr) % nr);
    const bool sends = KIND != 2 || me == root;
    auto receives = [=](int r) { return KIND == 0 || (KIND == 1 ? r == root : r != root); };
    MpimlPack<T>* mine = mpiml_packs<T>(c, me, epoch);
    const MpimlPack<T>* gathered = mine + nr * part;
    const int t = threadIdx.x;
    if (sends) {  // A, every step of this block: pack i of every peer's part loaded, then stored (one latency)
        for (long long k = blockIdx.x; k < steps; k += gridDim.x) {
            const long long i0 = k * S, i1 = min(i0 + S, part);
            for (long long i = i0 + t; i < i1; i += blockDim.x) {
                // part j = jm + 1 + jj (mod q) for jj < q - 1 when this rank owns one (its own is skipped),
                // else jj; the destination of pack i of part j, null where nothing is stored
                auto dst = [&](int jj) -> MpimlPack<T>* {
                    const int j = jm < 0 ? jj : (jm + 1 + jj) % q;
                    if (jj >= q - (jm < 0 ? 0 : 1) || j * part + i >= units) return nullptr;
                    return mpiml_packs<T>(c, owner(j), epoch) + me * part + i;
                };
                auto src = [&](int jj) { return (jm < 0 ? jj : (jm + 1 + jj) % q) * part + i; };
                if constexpr (MpimlLoadsFirst<T>::value) {
                    MpimlPack<T> v[MPIML_MAX_RANKS];
#pragma unroll
                    for (int jj = 0; jj < MPIML_MAX_RANKS; ++jj)
                        if (dst(jj) != nullptr) v[jj] = mpiml_load_user<T, A>(in, src(jj), n);
#pragma unroll
                    for (int jj = 0; jj < MPIML_MAX_RANKS; ++jj)
                        if (MpimlPack<T>* d = dst(jj)) *d = v[jj];
                } else {
                    for (int jj = 0; jj < q; ++jj)
                        if (MpimlPack<T>* d = dst(jj)) *d = mpiml_load_user<T, A>(in, src(jj), n);
                }
            }
            __syncthreads();  // the block's stores happen before the releases below
            if (t < q && owner(t) != me) mpiml_st_release(mpiml_pipe_flag(c, owner(t), me, k), flag);
        }
    }
    // C of step k: wait for the other parts' owners, copy their packs out; false on a timeout / abort
    auto gather = [&](long long k) {
        int bad = 0;
        if (t < q && t != jm)
            bad = !mpiml_pipe_wait(c, mpiml_pipe_flag(c, me, MPIML_MAX_RANKS + owner(t), k), flag, owner(t), epoch);
        if (__syncthreads_or(bad)) return false;
        const long long i0 = k * S, i1 = min(i0 + S, part);
        for (long long i = i0 + t; i < i1; i += blockDim.x) {
            mpiml_copy_ranks<T>(
                q, jm, [&](int j) { return j * part + i < units ? gathered + j * part + i : nullptr; },
                [&](int j, const MpimlPack<T>& v) { mpiml_store_user<T, A>(out, j * part + i, n, v); });
        }
        return true;
    };
    long long behind = -1;  // the step whose C is still to do
    for (long long k = blockIdx.x; k < steps; k += gridDim.x) {
        if (jm >= 0) {  // B
            int bad = 0;
            if (t < nr && t != me && (KIND != 2 || t == root))
                bad = !mpiml_pipe_wait(c, mpiml_pipe_flag(c, me, t, k), flag, t, epoch);
            if (__syncthreads_or(bad)) {
                behind = -1;
                break;
            }
            const long long i0 = k * S, i1 = min(i0 + S, part);
            for (long long i = i0 + t; i < i1; i += blockDim.x) {
                const long long g = jm * part + i;
                if (g >= units) break;
                MpimlPack<T> v;
                if constexpr (KIND == 2) {
                    v = mpiml_ld(mine + root * part + i);
                } else {
                    v = mpiml_reduce_from<T, OP>(nr, [&](int r) {
                        return r == me ? mpiml_load_user<T, A>(in, g, n) : mpiml_ld(mine + r * part + i);
                    });
                }
                for (int kk = 1; kk < nr; ++kk) {
                    const int r = (me + kk) % nr;
                    if (receives(r)) mpiml_packs<T>(c, r, epoch)[nr * part + g] = v;
                }
                if (receives(me)) mpiml_store_user<T, A>(out, g, n, v);
            }
            __syncthreads();
            if (t < nr && t != me && receives(t)) mpiml_st_release(mpiml_pipe_flag(c, t, MPIML_MAX_RANKS + me, k), flag);
        }
        if (receives(me)) {
            if (behind >= 0 && !gather(behind)) {
                behind = -1;
                break;
            }
            behind = k;
        }
    }
    if (behind >= 0) gather(behind);
    mpiml_end(c, epoch);
}

// ---------------------------------------------------------------- LL128 two-shot
// LL128 two-shot reduction (no barrier; the allreduce's and the reduce's `ll128` / `ll128twoshot`):
// mpiml_ll_twoshot_reduce's protocol in LL128 lines (15 payload words in 16, not 1 in 2: the lines carry 1.07
// times the bytes, not twice). The lines are cut into nranks parts of `part` lines; every rank pushes line
// r * part + i of its input into rank r's region at [me * part + i] (its own part stays in its input) (A); rank
// r reduces the nranks copies of its line i in rank order as they arrive and pushes the result into the region
// of every other rank that receives (root < 0: every rank; else the root) at [nranks * part + r * part + i],
// storing it to out if it receives (B); a receiving rank copies the other parts' reduced lines out as they arrive,
// line i of every part waited for at once (C). With root >= 0 the root takes (nranks - 1) / nranks of the
// copies of its part and the reduced parts of the others: 1.5 n at 4 ranks over its three links at once, a
// reduce-scatter then a gather, where the relay (reduce.cu) brings it n in two hops. A warp holds 4 lines (8 lanes
// each) a round and every warp of every rank takes the same lines (the grid is agreed); a warp pushes the lines
// of all its rounds before it waits for any, or, with split > 0 (MpimlLL128's roles), the first `split` warps of a
// block push (A) and the others take B and C. The region is the staging buffer of the call's parity (mpiml_buf:
// see the LL128 lines above); the host keeps 2 * nranks * part lines within it (cap / 128 of them). A counts
// 8-byte alignment; a lane writes out only words it read before (in == out is safe).
template <typename T, int OP, bool A>
__device__ __forceinline__ void mpiml_ll128_twoshot_reduce(const MpimlCtx* c, const T* in, T* out, long long n,
                                                           int root, int split) {
    const MpimlLL128 ll(c, n * (long long)sizeof(T), split);
    const int nr = (int)c->nranks, me = (int)c->rank, sub = ll.sub;
    const bool receives = root < 0 || me == root;
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
    // B: this rank's part reduced as its copies arrive (its own from the input), pushed to the receivers and stored
    // to out if this rank receives
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
            const int r = (me + k) % nr;
            if (root >= 0 && r != root) continue;  // (warp-uniform)
            __syncwarp();
            if (mine_act) mpiml_ll128_store(ll.region(r) + 8 * (nr * part + g) + sub, red);
        }
        if (mine_act && receives) mpiml_ll128_put<A>(out, g, sub, ll.nbytes, red);
    }
    // C: the other parts' reduced lines out as they arrive, line i of every part waited for at once
    if (ok && receives) {
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
