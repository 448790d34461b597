// Just enough of CUDA for g++ to compile the kernel files in kernels/cuda/ and run them on the CPU: each
// block's threads are real threads (a block at a time), __syncthreads a barrier, __shared__ a static
// (one block at a time, so every thread of the block sees the same one). It runs the kernels' own source,
// so a session without a GPU can check a kernel's index math, barriers and operation order against a
// slow reference; it says nothing about speed, and warp-level intrinsics (__shfl_sync) are not emulated.
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

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))

inline void __syncthreads() { pthread_barrier_wait(&block_barrier); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __shfl_sync(unsigned, float, int, int) {
    std::fprintf(stderr, "kernel emulator: __shfl_sync is not emulated\n");
    std::abort();
}

struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) double2 {
    double x, y;
};
inline double2 make_double2(double x, double y) { return {x, y}; }

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
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        body();
                    });
                for (auto& th : pool) th.join();
                pthread_barrier_destroy(&block_barrier);
            }
}
