// Shared helpers for the host-op kernels. Every kernel file includes this text first (the loader
// prepends it; NVRTC gets one translation unit per file, no include paths).
//
// Conventions, the same as the CPU twins in kernels/src/ops and kernels/src/optim.rs:
// * tensors are flat, env-major: a `[E, n]` buffer holds env e's n values at e*n .. (e+1)*n;
// * f32 data; reductions that must not depend on the launch shape accumulate in double and combine
//   partial sums in a fixed order;
// * NaN propagates wherever PyTorch propagates it (ReLU, max-pool), so the governor sees a broken env.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// A grid-stride loop over n elements.
#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)gridDim.x * blockDim.x)

// Block reductions: blockDim.x == REDUCE_THREADS, each thread holding one double; a fixed shared-memory
// tree, so the total depends only on the launch shape. Every thread gets the block's total.
#define REDUCE_THREADS 256

__device__ double block_sum(double v, double* lanes) {
    lanes[threadIdx.x] = v;
    __syncthreads();
    for (u32 half = REDUCE_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) lanes[threadIdx.x] += lanes[threadIdx.x + half];
        __syncthreads();
    }
    double total = lanes[0];
    __syncthreads();
    return total;
}
