// Minimal CPU emulation of the CUDA features select.cu uses, for test_select_emulated.py: one std::thread
// per GPU thread, std::barrier for __syncthreads / __syncwarp, ballots and shuffles through a per-warp slot array.
#include <barrier>
#include <thread>
#include <cmath>
#include <cstring>
#include <vector>
#include <functional>
#include <algorithm>
#include <cstdint>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct float4 { float x, y, z, w; };
struct double2 { double x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline double2 make_double2(double a, double b) { return {a, b}; }
thread_local dim3 threadIdx, blockIdx;
thread_local unsigned char* emu_smem;
thread_local std::barrier<>* emu_block_bar;
thread_local std::barrier<>* emu_warp_bar;
thread_local unsigned long long* emu_warp_slots;
dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__
#define __align__(x)
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline void __syncwarp() { emu_warp_bar->arrive_and_wait(); }
inline int lane_id() { return threadIdx.x & 31; }
template <typename V> V emu_exchange(V v, int src) {
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(V));
    emu_warp_slots[lane_id()] = bits;
    emu_warp_bar->arrive_and_wait();
    unsigned long long got = emu_warp_slots[src & 31];
    emu_warp_bar->arrive_and_wait();
    V out;
    std::memcpy(&out, &got, sizeof(V));
    return out;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    emu_warp_slots[lane_id()] = p ? 1 : 0;
    emu_warp_bar->arrive_and_wait();
    unsigned m = 0;
    for (int i = 0; i < 32; ++i) if (emu_warp_slots[i]) m |= 1u << i;
    emu_warp_bar->arrive_and_wait();
    return m;
}
inline bool __any_sync(unsigned m, bool p) { return __ballot_sync(m, p) != 0; }
template <typename V> V __shfl_sync(unsigned, V v, int src) { return emu_exchange(v, src); }
template <typename V> V __shfl_xor_sync(unsigned, V v, int off) { return emu_exchange(v, lane_id() ^ off); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
using std::min; using std::max; using std::sqrt; using std::pow; using std::fma;
inline float fmaf(float a, float b, float c) { return std::fma(a, b, c); }

// run kernel(args) on grid x block(256) with smem bytes
template <typename F>
void emu_launch(dim3 grid, unsigned threads, size_t smem, F kernel) {
    gridDim = grid; blockDim = dim3{threads, 1, 1};
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::vector<unsigned char> shared(smem + 16);
            std::barrier<> bar(threads);
            std::vector<std::barrier<>*> wb;
            std::vector<std::vector<unsigned long long>> slots(threads / 32, std::vector<unsigned long long>(32));
            for (unsigned w = 0; w < threads / 32; ++w) wb.push_back(new std::barrier<>(32));
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < threads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = dim3{t, 0, 0}; blockIdx = dim3{bx, by, 0};
                    emu_smem = shared.data(); emu_block_bar = &bar; emu_warp_bar = wb[t / 32];
                    emu_warp_slots = slots[t / 32].data();
                    kernel();
                });
            for (auto& t : ts) t.join();
            for (auto* b : wb) delete b;
        }
}
