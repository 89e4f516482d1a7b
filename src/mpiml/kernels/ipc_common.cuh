// Shared pieces of the CUDA-IPC collectives (mpiml.comm.backends.ipc).
//
// Every rank owns one workspace (plain cudaMalloc, shared with CUDA IPC):
//
//   [0, 4)                  epoch: calls completed on this communicator (device-side,
//                           so a CUDA graph replays correctly)
//   [4, 8)                  done: blocks of the running call that have finished
//   [FLAG_OFF, +FLAG_BYTES) barrier flags [slot 0..1][block][peer rank], uint32
//   [DATA_OFF, +2*cap)      two staging buffers; call E uses buffer E % 2
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
// Buffer E % 2 is reused by call E + 2 only after every peer has entered call
// E + 1 (each kernel has a barrier among all ranks, and kernels on one stream
// run in order), so no closing barrier is needed.
//
// Reductions visit ranks in order 0, 1, ..., n-1 and accumulate float16 in
// float32, so every rank computes bit-identical results.

#define MPIML_MAX_RANKS 8
#define MPIML_MAX_BLOCKS 128
#define MPIML_FLAG_OFF 256
#define MPIML_DATA_OFF 16384

struct MpimlCtx {
    char* peers[MPIML_MAX_RANKS];  // workspace bases, this rank's own included
    long long rank;
    long long nranks;
    long long timeout_ns;          // 0: wait forever
    long long cap;                 // bytes of one staging buffer
    int* err;                      // host-mapped: [0] code, [1] peer, [2] block, [3] epoch
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

// The call number, read once per block (volatile: never a stale cached copy).
__device__ __forceinline__ unsigned mpiml_begin(const MpimlCtx* c) {
    __shared__ unsigned s_epoch;
    if (threadIdx.x == 0) {
        s_epoch = *reinterpret_cast<volatile unsigned*>(c->peers[c->rank]);
    }
    __syncthreads();
    return s_epoch;
}

// Every block counts itself done; the last one advances the epoch for the next call.
__device__ __forceinline__ void mpiml_end(const MpimlCtx* c, unsigned epoch) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* ctl = reinterpret_cast<unsigned*>(c->peers[c->rank]);
        __threadfence();
        if (atomicAdd(ctl + 1, 1u) == gridDim.x - 1) {
            ctl[1] = 0u;
            *reinterpret_cast<volatile unsigned*>(ctl) = epoch + 1u;
            __threadfence();
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
        unsigned long long t0 = 0;
        unsigned spins = 0;
        while ((int)(mpiml_ld_acquire(mine) - val) < 0) {
            if (c->timeout_ns > 0 && ((++spins) & 255u) == 0) {
                unsigned long long now = mpiml_globaltimer();
                if (t0 == 0) {
                    t0 = now;
                } else if (now - t0 > (unsigned long long)c->timeout_ns) {
                    volatile int* err = c->err;
                    err[1] = t;
                    err[2] = blockIdx.x;
                    err[3] = (int)epoch;
                    __threadfence_system();
                    err[0] = 1;
                    __threadfence_system();
                    fail = 1;
                    break;
                }
            }
        }
    }
    return __syncthreads_or(fail) == 0;
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

// op over ranks [r0, r1) of pack i of each rank's buffer, in rank order.
template <typename T, int OP>
__device__ __forceinline__ MpimlPack<T> mpiml_reduce_packs(const MpimlCtx* c, unsigned epoch, long long i,
                                                           int r0, int r1) {
    typedef typename MpimlAcc<T>::type Acc;
    constexpr int L = MpimlPack<T>::L;
    Acc acc[L];
    {
        MpimlPack<T> v = mpiml_ld(mpiml_packs<T>(c, r0, epoch) + i);
#pragma unroll
        for (int k = 0; k < L; ++k) acc[k] = MpimlAcc<T>::load(v.e[k]);
    }
    for (int r = r0 + 1; r < r1; ++r) {
        MpimlPack<T> v = mpiml_ld(mpiml_packs<T>(c, r, epoch) + i);
#pragma unroll
        for (int k = 0; k < L; ++k) acc[k] = MpimlOp<OP>::f(acc[k], MpimlAcc<T>::load(v.e[k]));
    }
    MpimlPack<T> out;
#pragma unroll
    for (int k = 0; k < L; ++k) out.e[k] = MpimlAcc<T>::store(acc[k]);
    return out;
}

// Scalar variant (reduce_scatter, whose parts need not fall on pack boundaries).
template <typename T, int OP>
__device__ __forceinline__ T mpiml_reduce_one(const MpimlCtx* c, unsigned epoch, long long idx, int r0, int r1) {
    typedef typename MpimlAcc<T>::type Acc;
    Acc acc = MpimlAcc<T>::load(__ldcg(reinterpret_cast<const T*>(mpiml_buf(c, r0, epoch)) + idx));
    for (int r = r0 + 1; r < r1; ++r)
        acc = MpimlOp<OP>::f(acc, MpimlAcc<T>::load(__ldcg(reinterpret_cast<const T*>(mpiml_buf(c, r, epoch)) + idx)));
    return MpimlAcc<T>::store(acc);
}

#define MPIML_GRID_LOOP(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)
