// Just enough of CUDA for g++ to compile the kernel files in kernels/cuda/ and run them on the CPU: each
// block's threads are real threads (a block at a time), __syncthreads a barrier, __shared__ a static
// (one block at a time, so every thread of the block sees the same one). It runs the kernels' own source,
// so a session without a GPU can check a kernel's index math, barriers and operation order against a
// slow reference; it says nothing about speed. Of the warp-level operations mma.sync (m16n8k8, TF32)
// is emulated — the warp's 32 threads meet at a barrier of their own and exchange their fragments —
// and __shfl_sync within segments of 8 lanes (lanes8_total's), the segment's threads meeting at a
// barrier of theirs; __shfl_down_sync is not.
#pragma once
#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx;
inline dim3 blockIdx, blockDim, gridDim;
inline pthread_barrier_t block_barrier;
// One barrier per warp of the block (blocks of a multiple of 32 threads), for mma_tf32.
inline pthread_barrier_t warp_barriers[32];
// One barrier per 8-lane segment of the block, and the values the segment exchanges, for __shfl_sync.
inline pthread_barrier_t segment_barriers[128];
inline float shuffled[1024];
inline double shuffled_double[1024];

// conv.cu and common.cuh take tf32_round, mma_tf32, the cp.async pair and lds from here instead of their
// inline PTX and plain loads.
#define ESPER_KERNEL_EMULATOR 1

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

inline void __syncthreads() { pthread_barrier_wait(&block_barrier); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline double __shfl_down_sync(unsigned, double, unsigned, int = 32) {
    std::fprintf(stderr, "kernel emulator: __shfl_down_sync is not emulated\n");
    std::abort();
}
// Lane `src` of the calling thread's segment of `width` = 8 lanes. Every lane of the segment must call it
// (as the mask says on the device): they meet at the segment's barrier, read, and meet again before
// any of them writes its next value.
template <typename T>
inline T segment_shuffle(T* slots, T v, int src, int width) {
    if (width != 8) {
        std::fprintf(stderr, "kernel emulator: __shfl_sync only within 8 lanes\n");
        std::abort();
    }
    unsigned t = threadIdx.x, segment = t / 8;
    slots[t] = v;
    pthread_barrier_wait(&segment_barriers[segment]);
    T got = slots[segment * 8 + (unsigned)src % 8];
    pthread_barrier_wait(&segment_barriers[segment]);
    return got;
}
inline float __shfl_sync(unsigned, float v, int src, int width) { return segment_shuffle(shuffled, v, src, width); }
inline double __shfl_sync(unsigned, double v, int src, int width) {
    return segment_shuffle(shuffled_double, v, src, width);
}

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct float3 {
    float x, y, z;
};
struct alignas(16) double2 {
    double x, y;
};
inline double2 make_double2(double x, double y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

using std::fmaf;
using std::fmax;
using std::isfinite;

template <typename T>
inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
    return a < b ? b : a;
}

// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero (half an ulp of TF32 added to
// the magnitude, then the low 13 bits cleared); NaN and infinity pass through.
inline float tf32_round(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    return __uint_as_float((u + 0x1000u) & ~0x1fffu);
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 for the calling thread's warp, fragments in the PTX
// ISA's layout (lane l = 4·g + t: a = A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4]; b = B[t][g],
// B[t + 4][g]; d = D[g][2t], D[g][2t + 1], D[g + 8][2t], D[g + 8][2t + 1]). The tensor cores ignore an
// input's low 13 bits (cleared here) and sum the exact products in at least f32; here in double, once
// rounded to f32 per mma.
struct WarpFragments {
    float a[32][4], b[32][2];
};
inline WarpFragments warp_fragments[32];
inline void mma_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    WarpFragments& f = warp_fragments[warp];
    for (int i = 0; i < 4; ++i) f.a[lane][i] = a[i];
    for (int i = 0; i < 2; ++i) f.b[lane][i] = b[i];
    pthread_barrier_wait(&warp_barriers[warp]);
    float A[16][8], B[8][8];
    for (unsigned l = 0; l < 32; ++l) {
        unsigned g = l / 4, t = l % 4;
        A[g][t] = f.a[l][0], A[g + 8][t] = f.a[l][1], A[g][t + 4] = f.a[l][2], A[g + 8][t + 4] = f.a[l][3];
        B[t][g] = f.b[l][0], B[t + 4][g] = f.b[l][1];
    }
    pthread_barrier_wait(&warp_barriers[warp]);  // every lane has read before any writes again
    auto bits = [](float v) { return __uint_as_float(__float_as_uint(v) & ~0x1fffu); };
    unsigned g = lane / 4, t = lane % 4;
    for (int q = 0; q < 4; ++q) {
        unsigned row = g + 8 * (q / 2), col = 2 * t + q % 2;
        double sum = d[q];
        for (int k = 0; k < 8; ++k) sum += (double)bits(A[row][k]) * (double)bits(B[k][col]);
        d[q] = (float)sum;
    }
}

// cp.async (16 bytes, global to shared) lands at some time between its issue and the issuing thread's
// cp_async_wait_all. Here it lands at the latest, in the wait (queued per thread): a kernel that reads
// what it copied before waiting reads the old bytes, and fails its check. Built with -DCP_ASYNC_AT_ISSUE
// (EMULATOR_DEFINES) it lands at once, the other end: a copy issued before other threads are done with
// what it overwrites then corrupts their reads. A thread that ends with copies not waited for aborts.
struct PendingCopy {
    float* to;
    const float* from;
};
inline thread_local std::vector<PendingCopy> pending_copies;
inline void cp_async16(float* smem, const float* gmem) {
#ifdef CP_ASYNC_AT_ISSUE
    std::memcpy(smem, gmem, 16);
#else
    pending_copies.push_back({smem, gmem});
#endif
}
inline void cp_async_wait_all() {
    for (const PendingCopy& c : pending_copies) std::memcpy(c.to, c.from, 16);
    pending_copies.clear();
}

// The passes over shared memory's 32 banks of the loads a kernel makes through `lds` (conv.cu's
// tensor-core K loops), counted while `lds_counting` is set: each thread records its loads' addresses,
// and after each block the i-th load of each warp's 32 lanes (their control flow is the same in those
// loops; a warp whose lanes made different numbers of loads is counted in `uneven`) takes as many
// passes as the most distinct 4-byte words one bank holds among its lanes' addresses (lanes reading
// the same word share it), as a GPU's shared memory serves a warp's 32-bit loads.
struct LdsCount {
    unsigned long long loads = 0, passes = 0, uneven = 0;
};
inline bool lds_counting = false;
inline LdsCount lds_count;
inline thread_local std::vector<const float*> lds_log;
inline float lds(const float* p) {
    if (lds_counting) lds_log.push_back(p);
    return *p;
}
inline void count_lds_passes(const std::vector<std::vector<const float*>>& logs) {
    for (size_t w0 = 0; w0 + 32 <= logs.size(); w0 += 32) {
        size_t n = logs[w0].size();
        bool even = true;
        for (size_t l = 1; l < 32; ++l) even = even && logs[w0 + l].size() == n;
        if (!even) {
            ++lds_count.uneven;
            continue;
        }
        for (size_t i = 0; i < n; ++i) {
            const float* words[32];
            for (size_t l = 0; l < 32; ++l) words[l] = logs[w0 + l][i];
            std::sort(words, words + 32);
            unsigned in_bank[32] = {}, most = 0;
            for (size_t l = 0; l < 32; ++l) {
                if (l > 0 && words[l] == words[l - 1]) continue;
                unsigned bank = (unsigned)((reinterpret_cast<uintptr_t>(words[l]) >> 2) & 31);
                most = std::max(most, ++in_bank[bank]);
            }
            ++lds_count.loads;
            lds_count.passes += most;
        }
    }
}

// Runs `body()` as every thread of every block of the grid, a block at a time.
template <typename Body>
void launch(dim3 grid, dim3 block, Body body) {
    gridDim = grid;
    blockDim = block;
    unsigned threads = block.x * block.y * block.z;
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = {x, y, z};
                pthread_barrier_init(&block_barrier, nullptr, threads);
                for (unsigned v = 0; v < threads / 32; ++v) pthread_barrier_init(&warp_barriers[v], nullptr, 32);
                for (unsigned v = 0; v < threads / 8; ++v) pthread_barrier_init(&segment_barriers[v], nullptr, 8);
                std::vector<std::thread> pool;
                pool.reserve(threads);
                std::vector<std::vector<const float*>> lds_logs(lds_counting ? threads : 0);
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        body();
                        if (lds_counting) lds_logs[t] = std::move(lds_log);
                        lds_log.clear();
                        if (!pending_copies.empty()) {
                            std::fprintf(stderr, "kernel emulator: a thread ended with %zu cp.async copies not waited for\n",
                                         pending_copies.size());
                            std::abort();
                        }
                    });
                for (auto& th : pool) th.join();
                if (lds_counting) count_lds_passes(lds_logs);
                pthread_barrier_destroy(&block_barrier);
                for (unsigned v = 0; v < threads / 32; ++v) pthread_barrier_destroy(&warp_barriers[v]);
                for (unsigned v = 0; v < threads / 8; ++v) pthread_barrier_destroy(&segment_barriers[v]);
            }
}
