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

// LOADS_AHEAD (1 unless -DLOADS_ONE_AT_A_TIME, which `ESPER_CUDA_LOADS_AHEAD=0` adds to NVRTC's options
// to measure it): loops that load several values per thread issue the loads first and use them after
// (batch norm's reductions, the square tensor-core kernels' staging and weights, the 2x2 windows of the
// fused normalisation + pool, its backward and the slots' blend + pool (WindowLoads), the batch gathers'
// runs of four, for_each_loads_ahead's passes, group norm's residual epilogue) instead of using each
// load right after issuing it or after a store, which left a thread one load in flight. The same values
// either way. It does not bring back relu_bn_backward_partial_f32's single loop (it runs a loop per
// case, the pooled one with routed_gradient_window's selects).
#ifdef LOADS_ONE_AT_A_TIME
#define LOADS_AHEAD 0
#else
#define LOADS_AHEAD 1
#endif

// The launch bounds of element-wise passes that elementwise() launches in blocks of 1 024 threads and
// whose loads LOADS_AHEAD issues together: with it two blocks an SM, so at most 32 registers a thread.
// The values loaded ahead took them to 34–41 registers, which leaves room for one block an SM: half the
// threads, and half the loads in flight. At 32 (sm_90, ptxas -v): batch_norm_relu_pool_f32 and
// global_avg_pool_backward_f32 spill nothing; batch_norm_backward_input_from_f32's window loop keeps
// four of its values in local memory (four stores and loads an L1 hit away per window, against its
// fourteen global loads and four stores).
#if LOADS_AHEAD
#define PASS_BOUNDS __launch_bounds__(1024, 2)
#else
#define PASS_BOUNDS __launch_bounds__(1024)
#endif

// CP_ASYNC (1 unless -DCP_ASYNC_OFF, which `ESPER_CUDA_CP_ASYNC=0` adds to NVRTC's options to measure
// it; 0 with LOADS_ONE_AT_A_TIME too): kernels that stage global memory in shared memory copy it with
// cp.async (16 bytes a copy, no register held, every copy of a thread in flight at once) — the square
// tensor-core kernels' next chunk or image group while they multiply the current one (conv.cu,
// square_stage_issue), the staged group norms' groups (seeds.cu) — instead of loading into registers and
// storing, a few loads a thread in flight at a time. The same values in the same places either way.
#if defined(CP_ASYNC_OFF) || !LOADS_AHEAD
#define CP_ASYNC 0
#else
#define CP_ASYNC 1
#endif
#ifndef ESPER_KERNEL_EMULATOR  // the kernel emulator brings its own
// cp.async.cg: 16 bytes from global to shared memory (both 16-byte aligned) without passing through a
// register, so a thread can issue a whole staging's loads and go on; they land by its next
// cp_async_wait_all (cp.async.wait_all: every copy the thread issued). sm_80 or later: below that (no
// build compiles for it) they trap.
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
#if __CUDA_ARCH__ < 800
    asm volatile("trap;");
#else
    u32 to;
    asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(to) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(gmem) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if __CUDA_ARCH__ < 800
    asm volatile("trap;");
#else
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// A tensor-core K loop's load of an A or B value from shared memory: a plain load here; the kernel
// emulator's version also records the address, to count the passes a warp's load takes over shared
// memory's 32 banks (its bank conflicts).
__device__ __forceinline__ float lds(const float* p) { return *p; }
#endif

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

// ---- Index math. A 64-bit division is a long software routine on the GPU and a 32-bit one still about
// twenty instructions: in the memory-bound kernels that split a flat index into (env, image, channel,
// position) the divisions cost more than the memory traffic (ncu on an H100: im2col_f32 moved data at a
// tenth of the bandwidth). FastDiv divides by a divisor fixed for the launch with a multiply-high, an
// add and two shifts (Granlund & Montgomery 1994, figure 4.1: exact for every 32-bit dividend and
// divisor ≥ 1); a thread sets its divisors up once and reuses them over its grid-stride loop. Kernels
// take that path when every index of the launch fits in 32 bits (FITS_U32) and keep the 64-bit one
// otherwise, with the same results either way.
struct FastDiv {
    u32 d, m, s1, s2;
};

__device__ __forceinline__ FastDiv fast_div(u32 d) {
    FastDiv f;
    f.d = d;
    u32 l = d <= 1 ? 0 : 32 - __clz(d - 1);  // ceil(log2 d)
    f.m = d == 0 ? 0 : (u32)((((1ull << 32) * ((1ull << l) - d)) / d) + 1);
    f.s1 = l > 0 ? 1 : 0;
    f.s2 = l > 0 ? l - 1 : 0;
    return f;
}

// n / f.d for any 32-bit n.
__device__ __forceinline__ u32 fdiv(u32 n, const FastDiv& f) {
    u32 t = __umulhi(f.m, n);
    return (t + ((n - t) >> f.s1)) >> f.s2;
}

#define FITS_U32(n) ((u64)(n) <= 0xffffffffull)

// FastDivs of divisors the same for the whole block, each computed by one thread (threads 0 .. N − 1)
// and read by all from shared memory: fast_div's 64-bit division is a called routine of some 70
// instructions, and every thread computing every divisor had made it a tenth of the staged kernels'
// instructions. A barrier, so call it where every thread of the block does (blockDim.x ≥ N), and once
// per N in a kernel (a second call would rewrite `shared` while slower threads still read the first's).
template <int N>
__device__ __forceinline__ void block_fast_divs(const u32 (&d)[N], FastDiv (&f)[N]) {
    __shared__ FastDiv shared[N];
#pragma unroll
    for (int i = 0; i < N; ++i)
        if (threadIdx.x == (u32)i) shared[i] = fast_div(d[i]);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = shared[i];
}

// The env of element t of env-major data with `per_env` values an env, through a FastDiv when every
// index of the launch fits in 32 bits.
struct EnvIndex {
    bool fits;
    FastDiv per_env;
    u64 per_env64;
};

__device__ __forceinline__ EnvIndex env_index(u32 envs, u64 per_env) {
    EnvIndex ix;
    ix.fits = FITS_U32((u64)envs * per_env);
    ix.per_env = fast_div(ix.fits ? (u32)per_env : 1u);
    ix.per_env64 = per_env;
    return ix;
}

__device__ __forceinline__ u32 env_of(u64 t, const EnvIndex& ix) {
    return ix.fits ? fdiv((u32)t, ix.per_env) : (u32)(t / ix.per_env64);
}

// The total of eight lanes held by eight consecutive threads (lane j in the thread whose index ≡ j mod 8,
// all eight active), combined in the CPU's LaneSums order ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
// l7)); every one of the eight gets it. blockDim.x must be a multiple of 32. T: float, or double
// (group norm's parameter partials).
template <typename T>
__device__ __forceinline__ T lanes8_total(T v) {
    u32 mask = 0xffu << (threadIdx.x & 24u);
    T l0 = __shfl_sync(mask, v, 0, 8), l1 = __shfl_sync(mask, v, 1, 8);
    T l2 = __shfl_sync(mask, v, 2, 8), l3 = __shfl_sync(mask, v, 3, 8);
    T l4 = __shfl_sync(mask, v, 4, 8), l5 = __shfl_sync(mask, v, 5, 8);
    T l6 = __shfl_sync(mask, v, 6, 8), l7 = __shfl_sync(mask, v, 7, 8);
    T a0 = l0 + l4, a1 = l1 + l5, a2 = l2 + l6, a3 = l3 + l7;
    return (a0 + a2) + (a1 + a3);
}

// FOR_EACH(i, n) store(i, load(i)), with LOADS_AHEAD four of a thread's elements (i, i + stride, …, so
// each load of a warp stays coalesced) loaded before any is stored. One at a time, the next element's
// loads waited behind this one's store (the compiler cannot tell the output from the inputs), so a
// thread had one load in flight. The same values: each element computed as before.
template <typename T, typename Load, typename Store>
__device__ __forceinline__ void for_each_loads_ahead(u64 n, Load load, Store store) {
    u64 stride = (u64)gridDim.x * blockDim.x, i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
#if LOADS_AHEAD
    for (; i + 3 * stride < n; i += 4 * stride) {
        T v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = load(i + j * stride);
#pragma unroll
        for (int j = 0; j < 4; ++j) store(i + j * stride, v[j]);
    }
#endif
    for (; i < n; i += stride) store(i, load(i));
}

// A 2x2 window's four values of `p` (at[0..4]), each read through operator[]: with LOADS_AHEAD all four
// are loaded when it is made, before the pass's first store — the compiler cannot tell that store from
// the input, so a load written after it waits for it, and a thread that loads, stores, loads had one
// load in flight (the SASS of batch_norm_relu_pool_f32, batch_norm_backward_input_from_f32 and
// slot_blend_select_pool_f32 did); with LOADS_ONE_AT_A_TIME each is loaded where it is read, as
// before. The same values either way.
struct WindowLoads {
    const float* p;
    const u64* at;
    float v[4];
    __device__ __forceinline__ WindowLoads(const float* p_, const u64 (&at_)[4]) : p(p_), at(at_) {
#if LOADS_AHEAD
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = p[at[j]];
#endif
    }
    __device__ __forceinline__ float operator[](int j) const { return LOADS_AHEAD ? v[j] : p[at[j]]; }
};

// The 2x2 max-pool's choice over a window in row-major order: its maximum, and in *k its index 0..4.
// Strictly greater replaces, so ties keep the first maximum; a NaN wins and stays (PyTorch propagates
// NaN through max-pool). Shared by max_pool2x2_forward_f32 and the fused batch_norm_relu_pool_f32.
__device__ __forceinline__ float max_pool_window(const float (&window)[4], u32* k) {
    float best = window[0];
    *k = 0;
    for (u32 j = 1; j < 4; ++j) {
        float v = window[j];
        bool take = !isnan(best) && (v > best || isnan(v));
        if (take) {
            best = v;
            *k = j;
        }
    }
    return best;
}

// A window's plane and place through the block's FastDivs (windows per plane, wo) where every index of
// the launch fits in 32 bits, else by 64-bit division: the pools' kernels did two 64-bit divisions (called
// routines) and two 32-bit ones per window or element, several times their loads and stores.
struct PoolIndex {
    bool fits;
    FastDiv windows, wo;
};

__device__ __forceinline__ PoolIndex pool_index(u64 planes, u32 h, u32 w) {
    PoolIndex ix;
    ix.fits = FITS_U32(planes * h * w);
    FastDiv f[2];
    block_fast_divs<2>({(h / 2) * (w / 2), w / 2}, f);
    ix.windows = f[0], ix.wo = f[1];
    return ix;
}

// Window o → (plane, oy, ox).
__device__ __forceinline__ void pool_window(u64 o, const PoolIndex& ix, u64& plane, u32& oy, u32& ox) {
    u32 r;
    if (ix.fits) {
        u32 p = fdiv((u32)o, ix.windows);
        plane = p, r = (u32)o - p * ix.windows.d;
    } else {
        plane = o / ix.windows.d, r = (u32)(o % ix.windows.d);
    }
    oy = fdiv(r, ix.wo), ox = r - oy * ix.wo.d;
}

// The 2x2 max-pool of window (oy, ox) of plane p of x (planes h × w): its maximum, in *k its winner.
__device__ __forceinline__ float max_pool_at(const float* x, u64 p, u32 oy, u32 ox, u32 h, u32 w, u32* k) {
    const float* top = x + (p * h + 2 * oy) * w + 2 * ox;
    float window[4] = {top[0], top[1], top[w], top[w + 1]};
    return max_pool_window(window, k);
}

// v clamped to [0, 1] (a seed's blend amplitude).
__device__ __forceinline__ float clamp01(float v) { return fminf(fmaxf(v, 0.0f), 1.0f); }

// The factor an r0 slot's split puts on the host's direct gradient of an env in `mode` at `alpha`
// (slot_backward_split_f32's dh = dy·(1 − a) in ADD, mode 2; dy itself in OFF and INCUBATOR, modes 0
// and 1, where *scaled is false and the factor is not applied), for batch norm's backwards reading the
// pool's gradient before the slot (slot_mode null: no slot, not scaled). MULTIPLY and GATE (3, 4)
// need the seed's output: their slots write the split's gradient instead.
__device__ __forceinline__ float slot_host_factor(const u8* slot_mode, const float* slot_alpha, u32 e, bool* scaled) {
    *scaled = slot_mode && slot_mode[e] == 2;
    return *scaled ? 1.0f - clamp01(slot_alpha[e]) : 1.0f;
}

// routed_gradient_at for planes with at least one window (ho = h / 2, wo = w / 2 ≥ 1), without a branch:
// a dropped row or column reads its plane's last window and gets 0 by a select, and dy is read whether
// or not the element won, so that a caller's loads of several elements issue together (a branch per
// element had put each load behind the one before). For batch norm's batched reduction
// (relu_bn_backward_partial_f32); the per-element users keep routed_gradient_at's branches, which cost
// them fewer registers (the wide n16 forwards' staging, whose batch norm on load reads it, spilled
// 128 bytes with the selects where it spills 48 with the branches).
__device__ __forceinline__ float routed_gradient_window(
    const float* dy, const u8* argmax, u64 plane_index, u32 iy, u32 ix, u32 ho, u32 wo) {
    u32 oy = iy / 2, ox = ix / 2;
    bool inside = oy < ho && ox < wo;
    u64 o = (plane_index * ho + min(oy, ho - 1)) * wo + min(ox, wo - 1);
    u32 k = (iy % 2) * 2 + (ix % 2);
    u32 won = argmax[o];
    float g = dy[o];
    return inside && won == k ? g : 0.0f;
}

// The output gradient element (iy, ix) of plane `plane_index` (an (env, image, channel); planes h × w)
// gets from the 2x2 max-pool: its window's, if it was the window's winner, else 0 (dropped odd rows and
// columns included).
__device__ __forceinline__ float routed_gradient_at(
    const float* dy, const u8* argmax, u64 plane_index, u32 iy, u32 ix, u32 h, u32 w) {
    u32 ho = h / 2, wo = w / 2;
    u32 oy = iy / 2, ox = ix / 2;
    if (oy >= ho || ox >= wo) return 0.0f;
    u64 o = (plane_index * ho + oy) * wo + ox;
    u32 k = (iy % 2) * 2 + (ix % 2);
    return argmax[o] == k ? dy[o] : 0.0f;
}

// routed_gradient_at for flat input element i (of planes h × w). Shared by the pool's backward kernels
// (pool.cu) and the fused batch-norm backwards (batchnorm.cu).
__device__ __forceinline__ float routed_gradient(const float* dy, const u8* argmax, u64 i, u32 h, u32 w) {
    u64 plane = (u64)h * w;
    u32 r = (u32)(i % plane);
    return routed_gradient_at(dy, argmax, i / plane, r / w, r % w, h, w);
}

// ---- Batch norm's backward where a ReLU (and maybe the 2x2 max-pool) follows it, as every host block's
// does: the gradient at the norm's output recomputed where it is needed instead of written and read back.
//
// The gradient at batch norm's output for element i of its input x (value xi; its (env, channel)'s
// mean, scale = inv_std·γ and shift = β): 0 where the ReLU cut, the training forward's operations
// recomputing it ((xi − mean)·scale + shift > 0, as batch_norm_apply_f32 and batch_norm_relu_pool_f32
// compute the ReLU's input: the same mask as relu_backward_f32's y > 0, NaN included); elsewhere, with
// `pooled`, the pool's output gradient dy routed to element (iy, ix) of plane `plane_index` (as
// max_pool2x2_backward_f32), else the gradient dy[i] at the ReLU's output. bn_relu_open: that mask.
__device__ __forceinline__ bool bn_relu_open(float xi, float mean, float scale, float shift) {
    return (xi - mean) * scale + shift > 0.0f;
}

__device__ __forceinline__ float bn_output_grad(
    float xi, float mean, float scale, float shift, const float* dy, const u8* argmax, int pooled, u64 i,
    u64 plane_index, u32 iy, u32 ix, u32 h, u32 w) {
    if (!bn_relu_open(xi, mean, scale, shift)) return 0.0f;
    return pooled ? routed_gradient_at(dy, argmax, plane_index, iy, ix, h, w) : dy[i];
}

// Per (env, channel), what the input gradient needs once the parameter gradients are summed
// (batch_norm_backward_params_finish_f32 writes them): BN_COEF floats {mean, scale = inv_std·γ, shift
// = β, inv_std, dβ/N, dγ/N, factor, scaled}, N = B·H·W; factor and scaled (1 or 0) slot_host_factor's
// for the pair's env (bn_slot_grad applies them).
#define BN_COEF 8

// Batch norm's input gradient at an element of value xi whose output gradient is g, from its (env,
// channel)'s coefficients c: γ·inv_std·(g − dβ/N − x̂·dγ/N), x̂ = (xi − mean)·inv_std — the operations
// and order of batch_norm_backward_input_f32 (and the CPU twin's DxConsts::input_grad): the same bits.
// Batch norm's output gradient g (bn_output_grad's, from the pool's gradient before an r0 slot) times
// the slot's factor where its split scales the host's gradient (c[7] != 0): g·(1 − a), as
// slot_backward_split_f32 computes dh from the routed gradient — the ReLU's mask then keeps it or
// gives 0, and 0·(1 − a) is 0, so the same bits either way round.
__device__ __forceinline__ float slot_scaled_grad(bool scaled, float factor, float g) { return scaled ? g * factor : g; }
__device__ __forceinline__ float bn_slot_grad(const float* c, float g) { return slot_scaled_grad(c[7] != 0.0f, c[6], g); }

__device__ __forceinline__ float bn_input_grad(const float* c, float xi, float g) {
    float x_hat = (xi - c[0]) * c[3];
    return c[1] * (g - c[4] - x_hat * c[5]);
}

// Batch norm's input gradient at element j (0 .. 4, row-major) of a 2×2 pool window whose winner is
// `won` and whose output gradient is `routed`, from its (env, channel)'s coefficients c: the pool's
// routing, the ReLU's mask and the slot's factor as bn_output_grad and bn_slot_grad apply them, so the
// same bits as load_or_bn's at that element. Shared by the fused batch-norm backward's window path and
// the tensor-core weight gradients that compute it on load.
__device__ __forceinline__ float bn_window_input_grad(const float* c, float xi, u32 won, u32 j, float routed) {
    float g = bn_relu_open(xi, c[0], c[1], c[2]) && won == j ? routed : 0.0f;
    return bn_input_grad(c, xi, bn_slot_grad(c, g));
}
