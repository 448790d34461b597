// The seeds' own element-wise and normalisation ops: group norm forward and backward and the ADD blend
// forward and backward, the CUDA twins of kernels/src/ops/norm.rs (group_norm_forward,
// group_norm_backward[_accumulate]) and kernels/src/ops/blend.rs (blend_add_forward, blend_add_backward).
// Layouts as there: activations [E, B, C, H, W] (blend: [E, B, F]), group-norm affine parameters
// [E, C], saved statistics [E, B, G].
//
// Sums follow the CPU's LaneSums: element i of each summed run goes to lane i % 8, the lane index
// restarting at every run (a group's values for the forward statistics; one plane for the gradients),
// and the lanes combine as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). With --fmad=false and
// IEEE sqrt and division, every kernel here does the CPU's f32 operations in its order: bit for bit.
// Eight threads per (image, group) (lanes8_total), one per (env, channel) or per sample: parity twins first.

#define NORM_EPS ((float)1e-5)

struct Lanes {
    float l[8];
};

__device__ __forceinline__ void lanes_zero(Lanes& s) {
    for (int i = 0; i < 8; ++i) s.l[i] = 0.0f;
}

__device__ __forceinline__ float lanes_total(const Lanes& s) {
    float a0 = s.l[0] + s.l[4], a1 = s.l[1] + s.l[5], a2 = s.l[2] + s.l[6], a3 = s.l[3] + s.l[7];
    return (a0 + a2) + (a1 + a3);
}


// One lane's run of the CPU's LaneSums in its order: use(i, load(i)) for i = lane, lane + 8, … below n,
// the loads of eight steps issued before their uses. Written as a plain loop, ptxas issued each load
// only after the previous step's add (one load in flight per thread: ncu found group norm latency-bound
// at half the DRAM rate). The uses run in the same order, so every sum adds as the CPU's does.
template <typename V, typename Load, typename Use>
__device__ __forceinline__ void lane_run(u64 n, u32 lane, Load load, Use use) {
    u64 i = lane;
    for (; i + 56 < n; i += 64) {
        V v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = load(i + 8 * k);
#pragma unroll
        for (int k = 0; k < 8; ++k) use(i + 8 * k, v[k]);
    }
    for (; i < n; i += 8) use(i, load(i));
}

// What the forward writes at y, from the norm's value n at element i: n itself (GN_PLAIN), relu(n)
// (GN_RELU: conv_heavy's inner relu(GN(conv))), residual[i] + relu(n) (GN_ADD_RELU: a seed's
// y = x + relu(GN(…)), conv_small, conv_light, conv_heavy, depthwise) or residual[i] + n (GN_ADD: the
// bottleneck's y = GN(…) + x). The ReLU is relu_forward_f32's (NaN passes) and the add one f32 add, so
// each is the same bits as the norm written, then the ReLU and the residual add over it — without
// writing the norm's output and reading it back. The backward recomputes the ReLU's mask from
// the norm's input (group_norm_backward_input_lanes's relu_mask).
#define GN_PLAIN 0
#define GN_RELU 1
#define GN_ADD_RELU 2
#define GN_ADD 3
// Whether the epilogue adds the residual (and so reads it).
__device__ __forceinline__ bool group_norm_epilogue_adds(int epilogue) {
    return epilogue == GN_ADD_RELU || epilogue == GN_ADD;
}

// `residual`: the residual's value at the element (used only where the epilogue adds it).
__device__ __forceinline__ float group_norm_epilogue(float n, float residual, int epilogue) {
    float relu = !(n <= 0.0f) ? n : 0.0f;
    switch (epilogue) {
        case GN_RELU: return relu;
        case GN_ADD_RELU: return residual + relu;
        case GN_ADD: return residual + n;
        default: return n;
    }
}

// Per (env, image, group): mean and 1/sqrt(var + eps) over the group's C/G·H·W values (saved), then
// n = (x − mean)·(inv_std·γ[e, c]) + β[e, c] over the group's planes (plane_mean_and_m2, affine),
// written at y through group_norm_epilogue.
// Eight threads per (image, group), thread j summing lane j's run (values j, j + 8, …: the CPU's lane
// i % 8) and lanes8_total combining them: the CPU's sums, bit for bit, at eight times the parallelism
// of one thread per group and with neighbouring threads reading neighbouring values.
// Lane `lane` of pair t = image·G + g's forward, its group's values read through xg (value i of the
// group: channel g·C/G + i / plane, position i % plane; the group's planes lie one after the other):
// the statistics (saved by lane 0) and y over the group's planes. group_norm_forward_f32 reads the group
// from global memory, group_norm_forward_staged_f32 from its shared-memory copy.
template <typename Load>
__device__ __forceinline__ void group_norm_forward_lanes(
    Load xg, u64 t, u32 lane, const float* gamma, const float* beta, const float* residual, int epilogue, float* y,
    float* save_mean, float* save_inv_std, u32 batch, u32 channels, u32 plane, u32 groups) {
    u32 per_group = channels / groups;
    u64 group_len = (u64)per_group * plane, image = t / groups;
    u32 g = (u32)(t % groups), e = (u32)(image / batch);
    float sum = 0.0f;
    lane_run<float>(group_len, lane, xg, [&](u64, float v) { sum += v; });
    float n = (float)(group_len > 0 ? group_len : 1);
    float mean = lanes8_total(sum) / n;
    float squares = 0.0f;
    lane_run<float>(group_len, lane, xg, [&](u64, float v) {
        float d = v - mean;
        squares += d * d;
    });
    float inv_std = 1.0f / sqrtf(lanes8_total(squares) / (float)group_len + NORM_EPS);
    if (lane == 0) {
        save_mean[t] = mean;
        save_inv_std[t] = inv_std;
    }
    for (u32 cl = 0; cl < per_group; ++cl) {
        u32 c = g * per_group + cl;
        float scale = inv_std * gamma[(u64)e * channels + c], shift = beta[(u64)e * channels + c];
        u64 at = (image * channels + c) * plane;
        float* yp = y + at;
        const float* rp = residual + at;  // read only by GN_ADD_RELU and GN_ADD
        bool adds = group_norm_epilogue_adds(epilogue);
        auto residual_at = [&](u64 i) { return adds ? rp[i] : 0.0f; };
        // With LOADS_AHEAD the residual is loaded with x, eight steps ahead of their stores: loaded where
        // it is added, each residual load waited for the previous step's store (the compiler cannot tell
        // y from the residual), a global load's latency per value with a dozen warps an SM (SASS).
        lane_run<float2>(
            plane, lane, [&](u64 i) { return float2{xg((u64)cl * plane + i), LOADS_AHEAD ? residual_at(i) : 0.0f}; },
            [&](u64 i, float2 v) {
                float r = LOADS_AHEAD ? v.y : residual_at(i);
                yp[i] = group_norm_epilogue((v.x - mean) * scale + shift, r, epilogue);
            });
    }
}

extern "C" __global__ void __launch_bounds__(1024) group_norm_forward_f32(
    const float* x, const float* gamma, const float* beta, const float* residual, int epilogue, float* y,
    float* save_mean, float* save_inv_std, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups) {
    u64 group_len = (u64)(channels / groups) * plane;
    FOR_EACH(u, (u64)envs * batch * groups * 8) {
        u64 t = u / 8;
        // Pair t's group starts at t·group_len: (image·G + g)·group_len = image·C·plane + g·group_len.
        const float* xg = x + t * group_len;
        group_norm_forward_lanes([&](u64 i) { return xg[i]; }, t, (u32)(u % 8), gamma, beta, residual, epilogue, y,
                                 save_mean, save_inv_std, batch, channels, plane, groups);
    }
}

// group_norm_forward_f32 with each group read from global memory once: a block of GN_STAGED_PAIRS
// (image, group) pairs (8 threads each, as there) copies its pairs' groups — consecutive in memory, one
// run of GN_STAGED_PAIRS·group_len floats — into shared memory with 16-byte loads in any order, then
// sums, squares and normalises from there in the lanes' order: the same operations on the same values
// in the same order as group_norm_forward_f32, bit for bit. That kernel reads a group three times (sum,
// squares, normalisation); this one once. For group_len ≤ GN_STAGED_LEN and a multiple of 4 (the
// launcher checks): every seed's group norm on cifar_baseline's 32×32 and 8×8 planes (1 024 values).
// Groups sit GN_STAGED_LEN + 8 floats apart, so the four groups of a warp's lanes fall in different
// banks.
#define GN_STAGED_PAIRS 8
#define GN_STAGED_LEN 1024
// The staged kernels' copy of a block's groups: quad l of `from` (the block's pairs' groups, one run of
// quads per pair, 16-byte aligned) to quad q of pair p's group in `to` (groups `stride` floats apart),
// with cp.async, not waited for. The thread's quads are l = threadIdx.x, + blockDim.x, …
__device__ __forceinline__ void gn_stage_async(float* to, const float* from, u32 total, u32 quads, u32 stride) {
    for (u32 l = threadIdx.x; l < total; l += blockDim.x) {
        u32 p = l / quads, q = l - p * quads;
        cp_async16(to + p * stride + 4 * q, from + 4 * (u64)l);
    }
}
extern "C" __global__ void __launch_bounds__(GN_STAGED_PAIRS * 8) group_norm_forward_staged_f32(
    const float* x, const float* gamma, const float* beta, const float* residual, int epilogue, float* y,
    float* save_mean, float* save_inv_std, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups) {
    constexpr u32 STRIDE = GN_STAGED_LEN + 8;
    __shared__ __align__(16) float staged[GN_STAGED_PAIRS * STRIDE];
    u32 per_group = channels / groups, group_len = per_group * plane;
    u64 pairs = (u64)envs * batch * groups, t0 = (u64)blockIdx.x * GN_STAGED_PAIRS;
    u32 block_pairs = (u32)min((u64)GN_STAGED_PAIRS, pairs - t0);
    // Pair t's group starts at t·group_len: (image·groups + g)·group_len = image·channels·plane + g·group_len.
    const float* xb = x + t0 * group_len;
    u32 quads = group_len / 4, total = block_pairs * quads;
    bool vec = (reinterpret_cast<unsigned long long>(xb) & 15) == 0;
    // CP_ASYNC: every quad of the thread's (32 at 8 pairs of 1 024 values) copied with cp.async, all in
    // flight at once. Else eight loads in flight a thread (the block's 64 threads alone would leave the
    // SM's memory pipe idle), four such waits for the block's 2 048 quads.
    if (CP_ASYNC && vec) {
        gn_stage_async(staged, xb, total, quads, STRIDE);
        cp_async_wait_all();
    } else {
#pragma unroll 8
        for (u32 l = threadIdx.x; l < total; l += blockDim.x) {
            u32 p = l / quads, q = l - p * quads;
            float* dst = staged + p * STRIDE + 4 * q;
            if (vec) {
                *reinterpret_cast<float4*>(dst) = reinterpret_cast<const float4*>(xb)[l];
            } else {
#pragma unroll
                for (int k = 0; k < 4; ++k) dst[k] = xb[4 * (u64)l + k];
            }
        }
    }
    __syncthreads();
    u32 p = threadIdx.x / 8, lane = threadIdx.x % 8;
    if (p >= block_pairs) return;  // whole octets: lanes8_total's shuffles stay within live threads
    const float* xs = staged + p * STRIDE;
    group_norm_forward_lanes([&](u64 i) { return xs[i]; }, t0 + p, lane, gamma, beta, residual, epilogue, y,
                             save_mean, save_inv_std, batch, channels, plane, groups);
}

// dβ[e, c] = Σ_b Σ_plane dy and dγ[e, c] = Σ_b Σ_plane dy·((x − mean)·inv_std), one lane run per plane,
// images in order.
extern "C" __global__ void group_norm_backward_params_f32(
    const float* x, const float* save_mean, const float* save_inv_std, const float* dy, float* grad_gamma,
    float* grad_beta, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups) {
    u32 per_group = channels / groups;
    FOR_EACH(t, (u64)envs * channels) {
        u32 e = (u32)(t / channels), c = (u32)(t % channels), g = c / per_group;
        Lanes sum_dy, sum_dy_xhat;
        lanes_zero(sum_dy);
        lanes_zero(sum_dy_xhat);
        for (u32 b = 0; b < batch; ++b) {
            u64 image = (u64)e * batch + b, s = image * groups + g;
            float mean = save_mean[s], inv_std = save_inv_std[s];
            const float* dyp = dy + (image * channels + c) * plane;
            const float* xp = x + (image * channels + c) * plane;
            for (u32 i = 0; i < plane; ++i) {
                sum_dy.l[i % 8] += dyp[i];
                sum_dy_xhat.l[i % 8] += dyp[i] * ((xp[i] - mean) * inv_std);
            }
        }
        grad_beta[t] = lanes_total(sum_dy);
        grad_gamma[t] = lanes_total(sum_dy_xhat);
    }
}

// The same parameter gradients at speed: one block of REDUCE_THREADS per (env, channel), each thread
// summing a strided share of the channel's B·H·W values in double, then block_sum. A different order
// from the twin above (which sums in the CPU's lanes, one thread per channel): checked with a tolerance.
extern "C" __global__ void group_norm_backward_params_fast_f32(
    const float* x, const float* save_mean, const float* save_inv_std, const float* dy, float* grad_gamma,
    float* grad_beta, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 t = blockIdx.x, e = t / channels, c = t % channels, g = c / (channels / groups);
    u64 count = (u64)batch * plane;
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    // Element j is (image b, position i), stepped along without a 64-bit division per element.
    u32 b = threadIdx.x / plane, i = threadIdx.x % plane;
    for (u64 j = threadIdx.x; j < count; j += REDUCE_THREADS) {
        u64 image = (u64)e * batch + b, s = image * groups + g;
        u64 at = (image * channels + c) * plane + i;
        float d = dy[at];
        sum_dy += (double)d;
        sum_dy_xhat += (double)(d * ((x[at] - save_mean[s]) * save_inv_std[s]));
        for (i += REDUCE_THREADS; i >= plane; i -= plane) ++b;
    }
    double total_dy = block_sum(sum_dy, lanes);
    double total_dy_xhat = block_sum(sum_dy_xhat, lanes);
    if (threadIdx.x == 0) {
        grad_beta[t] = (float)total_dy;
        grad_gamma[t] = (float)total_dy_xhat;
    }
}

// Per (env, image, group): dx = inv_std·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂)) over the group's planes
// (accumulate != 0: added to dx). Eight threads per (image, group) as in the forward, thread j summing
// lane j (positions j, j + 8, … of every plane, channels in order: the CPU's lanes, restarting per plane).
// Lane `lane` of pair t = image·G + g's input gradient, its group's dy and x read through dyg and xg
// (value i of the group, as group_norm_forward_lanes's). group_norm_backward_input_f32 reads them from
// global memory, group_norm_backward_input_staged_f32 from its shared-memory copies.
//
// relu_mask != 0: dy is the gradient at relu(n) rather than at the norm's output n, as the forward's
// GN_RELU and GN_ADD_RELU wrote it; each value of dy passes where n > 0 and is 0 elsewhere
// (relu_backward_f32's mask), n recomputed from x with the forward's operations — (x − mean)·(inv_std·γ)
// + β — so the same bits as relu_backward_f32 over the norm's written output, then this kernel.
// partials != nullptr: also the parameter gradients' sums of each (image, channel), in double —
// partials[2·(image·C + c)] = Σ dy and [… + 1] = Σ dy·x̂ over the plane (dy masked as above) — which
// group_norm_backward_params_finish_f32 adds over the images: group_norm_backward_params_fast_f32's
// values and products, without that kernel's second pass over dy and x.
template <typename LoadDy, typename LoadX>
__device__ __forceinline__ void group_norm_backward_input_lanes(
    LoadDy dyg, LoadX xg, u64 t, u32 lane, const float* gamma, const float* beta, const float* save_mean,
    const float* save_inv_std, float* dx, double* partials, u32 batch, u32 channels, u32 plane, u32 groups,
    int accumulate, int relu_mask) {
    u32 per_group = channels / groups;
    float n = (float)((u64)per_group * plane);
    u64 image = t / groups;
    u32 g = (u32)(t % groups), e = (u32)(image / batch);
    float mean = save_mean[t], inv_std = save_inv_std[t];
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
    // dy at value i of the group, masked by the ReLU where relu_mask says so: the forward's scale and
    // shift of the value's channel (inv_std·γ and β) give the norm's output n.
    auto dy_of = [&](u64 i, float scale, float shift) {
        float d = dyg(i);
        return !relu_mask || (xg(i) - mean) * scale + shift > 0.0f ? d : 0.0f;
    };
    for (u32 cl = 0; cl < per_group; ++cl) {
        u32 c = g * per_group + cl;
        float gam = gamma[(u64)e * channels + c], scale = inv_std * gam;
        float shift = relu_mask ? beta[(u64)e * channels + c] : 0.0f;
        u64 at = (u64)cl * plane;
        lane_run<float>(plane, lane, [&](u64 i) { return dy_of(at + i, scale, shift); },
                        [&](u64, float d) { sum_dyg += d * gam; });
        double channel_dy = 0.0, channel_dy_xhat = 0.0;
        lane_run<float2>(plane, lane, [&](u64 i) { return float2{dy_of(at + i, scale, shift), xg(at + i)}; },
                         [&](u64, float2 v) {
                             float x_hat = (v.y - mean) * inv_std;
                             sum_dyg_xhat += v.x * gam * x_hat;
                             if (partials) {
                                 channel_dy += (double)v.x;
                                 channel_dy_xhat += (double)(v.x * x_hat);
                             }
                         });
        if (partials) {
            double total_dy = lanes8_total(channel_dy), total_dy_xhat = lanes8_total(channel_dy_xhat);
            if (lane == 0) {
                partials[2 * (image * channels + c)] = total_dy;
                partials[2 * (image * channels + c) + 1] = total_dy_xhat;
            }
        }
    }
    float mean_dyg = lanes8_total(sum_dyg) / n, mean_dyg_xhat = lanes8_total(sum_dyg_xhat) / n;
    for (u32 cl = 0; cl < per_group; ++cl) {
        u32 c = g * per_group + cl;
        float gam = gamma[(u64)e * channels + c], scale = inv_std * gam;
        float shift = relu_mask ? beta[(u64)e * channels + c] : 0.0f;
        u64 at = (u64)cl * plane;
        float* dxp = dx + (image * channels + c) * plane;
        lane_run<float3>(plane, lane,
                         [&](u64 i) {
                             return float3{dy_of(at + i, scale, shift), xg(at + i), accumulate ? dxp[i] : 0.0f};
                         },
                         [&](u64 i, float3 v) {
                             float x_hat = (v.y - mean) * inv_std;
                             float value = inv_std * (v.x * gam - mean_dyg - x_hat * mean_dyg_xhat);
                             dxp[i] = accumulate ? v.z + value : value;
                         });
    }
}

extern "C" __global__ void __launch_bounds__(1024) group_norm_backward_input_f32(
    const float* x, const float* gamma, const float* beta, const float* save_mean, const float* save_inv_std,
    const float* dy, float* dx, double* partials, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups,
    int accumulate, int relu_mask) {
    u64 group_len = (u64)(channels / groups) * plane;
    FOR_EACH(u, (u64)envs * batch * groups * 8) {
        u64 t = u / 8;
        const float *dyg = dy + t * group_len, *xg = x + t * group_len;  // pair t's group (the forward's)
        group_norm_backward_input_lanes([&](u64 i) { return dyg[i]; }, [&](u64 i) { return xg[i]; }, t,
                                        (u32)(u % 8), gamma, beta, save_mean, save_inv_std, dx, partials, batch,
                                        channels, plane, groups, accumulate, relu_mask);
    }
}

// group_norm_backward_input_f32 with each group's dy and x read from global memory once: a block of
// GN_STAGED_BACK_PAIRS (image, group) pairs copies their dy and x (consecutive runs, as the staged
// forward's) into shared memory, then runs that kernel's three lane passes from there in the same order:
// the same bits. That kernel reads dy three times and x twice. group_len ≤ GN_STAGED_LEN and a
// multiple of 4 (the launcher checks).
#define GN_STAGED_BACK_PAIRS 4
extern "C" __global__ void __launch_bounds__(GN_STAGED_BACK_PAIRS * 8) group_norm_backward_input_staged_f32(
    const float* x, const float* gamma, const float* beta, const float* save_mean, const float* save_inv_std,
    const float* dy, float* dx, double* partials, u32 envs, u32 batch, u32 channels, u32 plane, u32 groups,
    int accumulate, int relu_mask) {
    constexpr u32 STRIDE = GN_STAGED_LEN + 8;
    __shared__ __align__(16) float staged_dy[GN_STAGED_BACK_PAIRS * STRIDE];
    __shared__ __align__(16) float staged_x[GN_STAGED_BACK_PAIRS * STRIDE];
    u32 per_group = channels / groups, group_len = per_group * plane;
    u64 pairs = (u64)envs * batch * groups, t0 = (u64)blockIdx.x * GN_STAGED_BACK_PAIRS;
    u32 block_pairs = (u32)min((u64)GN_STAGED_BACK_PAIRS, pairs - t0);
    const float* dyb = dy + t0 * group_len;
    const float* xb = x + t0 * group_len;
    u32 quads = group_len / 4, total = block_pairs * quads;
    bool vec = ((reinterpret_cast<unsigned long long>(dyb) | reinterpret_cast<unsigned long long>(xb)) & 15) == 0;
    // CP_ASYNC: the thread's quads of both (2 × 32 at 4 pairs of 1 024 values, 32 threads) all in flight
    // at once, as the forward's; else eight of each a thread at a time.
    if (CP_ASYNC && vec) {
        gn_stage_async(staged_dy, dyb, total, quads, STRIDE);
        gn_stage_async(staged_x, xb, total, quads, STRIDE);
        cp_async_wait_all();
    } else {
#pragma unroll 8
        for (u32 l = threadIdx.x; l < total; l += blockDim.x) {
            u32 p = l / quads, q = l - p * quads;
            float* to_dy = staged_dy + p * STRIDE + 4 * q;
            float* to_x = staged_x + p * STRIDE + 4 * q;
            if (vec) {
                *reinterpret_cast<float4*>(to_dy) = reinterpret_cast<const float4*>(dyb)[l];
                *reinterpret_cast<float4*>(to_x) = reinterpret_cast<const float4*>(xb)[l];
            } else {
#pragma unroll
                for (int k = 0; k < 4; ++k) to_dy[k] = dyb[4 * (u64)l + k], to_x[k] = xb[4 * (u64)l + k];
            }
        }
    }
    __syncthreads();
    u32 p = threadIdx.x / 8, lane = threadIdx.x % 8;
    if (p >= block_pairs) return;  // whole octets: lanes8_total's shuffles stay within live threads
    const float *dys = staged_dy + p * STRIDE, *xs = staged_x + p * STRIDE;
    group_norm_backward_input_lanes([&](u64 i) { return dys[i]; }, [&](u64 i) { return xs[i]; }, t0 + p, lane,
                                    gamma, beta, save_mean, save_inv_std, dx, partials, batch, channels, plane, groups,
                                    accumulate, relu_mask);
}

// Group norm's parameter gradients from group_norm_backward_input_*'s partials: dβ[e, c] = Σ_b
// partials[2·((e·B + b)·C + c)] and dγ[e, c] = Σ_b of the next, one block of REDUCE_THREADS per
// (env, channel), each thread a strided share of the images, then block_sum (a fixed order): f64 sums,
// as group_norm_backward_params_fast_f32's, in another order; checked with its tolerance.
extern "C" __global__ void group_norm_backward_params_finish_f32(
    const double* partials, float* grad_gamma, float* grad_beta, u32 envs, u32 batch, u32 channels) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 t = blockIdx.x, e = t / channels, c = t % channels;
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (u32 b = threadIdx.x; b < batch; b += REDUCE_THREADS) {
        const double* at = partials + 2 * (((u64)e * batch + b) * channels + c);
        sum_dy += at[0];
        sum_dy_xhat += at[1];
    }
    double total_dy = block_sum(sum_dy, lanes);
    double total_dy_xhat = block_sum(sum_dy_xhat, lanes);
    if (threadIdx.x == 0) {
        grad_beta[t] = (float)total_dy;
        grad_gamma[t] = (float)total_dy_xhat;
    }
}

// The amplitude of sample i = e·B + b, clamped: alpha[e] (per_sample == 0) or alpha[i].
__device__ __forceinline__ float blend_amplitude(const float* alpha, u64 sample, u32 batch, int per_sample) {
    return clamp01(per_sample ? alpha[sample] : alpha[sample / batch]);
}

// lerp(h, s, a) for a in [0, 1] as torch.lerp evaluates it (blend_add in kernels/src/ops/blend.rs):
// h + a·(s − h) below 0.5, else s − (s − h)·(1 − a), so a = 1 gives s exactly.
__device__ __forceinline__ float blend_lerp(float h, float s, float a) {
    return a < 0.5f ? h + a * (s - h) : s - (s - h) * (1.0f - a);
}

// ADD forward: y = lerp(h, s, a).
extern "C" __global__ void blend_add_forward_f32(
    const float* h, const float* s, const float* alpha, float* y, u32 envs, u32 batch, u32 features,
    int per_sample) {
    FOR_EACH(t, (u64)envs * batch * features) {
        float a = blend_amplitude(alpha, t / features, batch, per_sample);
        y[t] = blend_lerp(h[t], s[t], a);
    }
}

// ADD backward: dh = dy·(1 − a), ds = dy·a.
extern "C" __global__ void blend_add_backward_f32(
    const float* alpha, const float* dy, float* grad_h, float* grad_s, u32 envs, u32 batch, u32 features,
    int per_sample) {
    FOR_EACH(t, (u64)envs * batch * features) {
        float a = blend_amplitude(alpha, t / features, batch, per_sample);
        grad_h[t] = dy[t] * (1.0f - a);
        grad_s[t] = dy[t] * a;
    }
}

// σ(v) as ops::activation::sigmoid: 1/(1 + e^−v) for v ≥ 0, e^v/(1 + e^v) below (no overflow either way).
// expf is not Rust's exp: a few ulps apart, so this one is checked with a tolerance.
extern "C" __global__ void sigmoid_forward_f32(const float* x, float* y, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        if (v >= 0.0f) {
            y[i] = 1.0f / (1.0f + expf(-v));
        } else {
            float z = expf(v);
            y[i] = z / (1.0f + z);
        }
    }
}

// dx = dy·y·(1 − y) from the forward output y (sigmoid_backward).
extern "C" __global__ void sigmoid_backward_f32(const float* y, const float* dy, float* dx, u64 n) {
    FOR_EACH(i, n) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

// The attention seed's channel scaling, y[p, :] = x[p, :]·scale[p] per plane p (seeds::common::scale_planes).
// The plane of element i by a FastDiv set up once per block where the launch's indices fit in 32 bits
// (a 64-bit division routine per element before); four of a thread's elements loaded at a time
// (for_each_loads_ahead).
extern "C" __global__ void scale_planes_f32(const float* x, const float* scale, float* y, u64 planes, u32 plane) {
    u64 n = planes * plane;
    auto store = [&](u64 i, float v) { y[i] = v; };
    if (FITS_U32(n)) {
        FastDiv f[1];
        block_fast_divs({plane}, f);
        for_each_loads_ahead<float>(n, [&](u64 i) { return x[i] * scale[fdiv((u32)i, f[0])]; }, store);
    } else {
        for_each_loads_ahead<float>(n, [&](u64 i) { return x[i] * scale[i / plane]; }, store);
    }
}

// grad_scale[p] = Σ dy[p, :]·x[p, :] in the CPU's lanes (seeds::common::scale_planes_backward_scale):
// eight threads per plane, thread j summing lane j's run (positions j, j + 8, … in order) and
// lanes8_total combining them — the CPU's sums, bit for bit. One thread walked a whole plane before,
// its neighbours a plane apart (every load of a warp a different cache line) and its lanes in local
// memory (indexed by i % 8).
extern "C" __global__ void scale_planes_backward_scale_f32(
    const float* x, const float* dy, float* grad_scale, u64 planes, u32 plane) {
    FOR_EACH(u, planes * 8) {  // whole octets: the grid's stride is a multiple of 8
        u64 p = u / 8;
        u32 lane = (u32)(u % 8);
        const float *xp = x + p * plane, *dyp = dy + p * plane;
        float sum = 0.0f;
        lane_run<float2>(plane, lane, [&](u64 i) { return float2{dyp[i], xp[i]}; },
                         [&](u64, float2 v) { sum += v.x * v.y; });
        float total = lanes8_total(sum);
        if (lane == 0) grad_scale[p] = total;
    }
}

// The norm seed (seeds/norm.rs): y = x + tanh(λ[e])·(GN(x) − x) per element of env e's images (`image`
// values each). tanhf against Rust's tanh: a few ulps, so checked with a tolerance.
extern "C" __global__ void norm_seed_forward_f32(
    const float* x, const float* normed, const float* lambda, float* y, u32 envs, u32 batch, u32 image) {
    FOR_EACH(i, (u64)envs * batch * image) {
        float t = tanhf(lambda[i / ((u64)batch * image)]);
        y[i] = x[i] + t * (normed[i] - x[i]);
    }
}

// ∂L/∂GN(x) = tanh(λ[e])·∂L/∂y.
extern "C" __global__ void norm_seed_scale_grad_f32(
    const float* dy, const float* lambda, float* out, u32 envs, u32 batch, u32 image) {
    FOR_EACH(i, (u64)envs * batch * image) out[i] = tanhf(lambda[i / ((u64)batch * image)]) * dy[i];
}

// Per image (e·B + b): Σ ∂L/∂y·(GN(x) − x) over its values in the CPU's lanes.
extern "C" __global__ void norm_seed_image_partials_f32(
    const float* dy, const float* normed, const float* x, float* partials, u32 images, u32 image) {
    FOR_EACH(p, (u64)images) {
        Lanes sum;
        lanes_zero(sum);
        const u64 base = p * image;
        for (u32 i = 0; i < image; ++i) sum.l[i % 8] += dy[base + i] * (normed[base + i] - x[base + i]);
        partials[p] = lanes_total(sum);
    }
}

// ∂L/∂λ[e] = (1 − tanh²λ)·Σ of env e's image partials, images in order.
extern "C" __global__ void norm_seed_lambda_grad_f32(
    const float* partials, const float* lambda, float* grad_lambda, u32 envs, u32 batch) {
    FOR_EACH(e, envs) {
        float t = tanhf(lambda[e]), total = 0.0f;
        for (u32 b = 0; b < batch; ++b) total += partials[e * batch + b];
        grad_lambda[e] = (1.0f - t * t) * total;
    }
}

// ---- A slot over every env at once (host/slot.rs with the seeds' modes OFF, INCUBATOR, ADD, MULTIPLY and
// GATE):
// one blueprint's seed output s for every env; holds[e] marks the envs whose seed is that blueprint
// and takes part in this forward. Their seed output is kept in s_mine where the backward reads it
// (MULTIPLY's and GATE's rows: slot_backward_split_f32, slot_gate_grad_f32; ADD's and INCUBATOR's
// backwards do not, so their rows are not written: a pass of writes fewer at every ADD slot), and the
// blending ones (mode 2 ADD, 3 MULTIPLY, 4 GATE) write their rows of the slot's output y, the
// arithmetic of blend_add_forward (y = lerp(h, s, a)), blend_multiply_forward with the detached input
// as x_s (y = h·(1 + a·tanh(s − h))) and blend_gate_forward (y = lerp(h, s, a_eff), a_eff =
// clamp(a·clamp(g)) with the sample's gate g), a = clamp(alpha[e]). Every other row of y is left as it
// is (slot_passthrough_f32 writes h there). `gate` ([E·B]) is read only in GATE rows. tanhf is not
// Rust's tanh: MULTIPLY is checked with a tolerance.
// The rows of the slot's output that no seed blends into in this forward: y = h for env e unless its
// mode blends (2 ADD, 3 MULTIPLY, 4 GATE) and some blueprint's selection holds it (`holds` [7, E]: the
// training forward's, or validation pass k's). slot_blend_select_f32 writes the others, so every row is
// written once — instead of copying all of h first (the twin: the CPU slot's output starts as h).
// Grid (blocks of an env's rows, envs): each block decides for its env once and leaves at once where
// the env blends (with every env blending, as in the bench, the kernel reads nothing); before, every
// element looked up its env's mode and seven selections.
extern "C" __global__ void __launch_bounds__(1024) slot_passthrough_f32(
    const float* h, const u8* mode, const u8* holds, float* y, u32 envs, u32 batch, u32 features) {
    u32 e = blockIdx.y;
    bool held = false;
    for (u32 bp = 0; bp < 7; ++bp) held = held || holds[(u64)bp * envs + e] != 0;
    if (mode[e] >= 2 && held) return;
    u64 row = (u64)batch * features;
    const float* he = h + e * row;
    float* ye = y + e * row;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < row; i += (u64)gridDim.x * blockDim.x) ye[i] = he[i];
}

// GATE's amplitude a_eff = clamp(a·clamp(g)) from the env's clamped a and the sample's gate g.
__device__ __forceinline__ float gate_amplitude(float a, float g) { return clamp01(a * clamp01(g)); }

// A blending env's output at an element (mode m: 2 ADD, 3 MULTIPLY, 4 GATE; a = clamp(alpha[e]); gate_v
// the sample's gate, read in GATE only) from h and its seed's s. Shared by slot_blend_select_f32 and
// slot_blend_select_pool_f32.
__device__ __forceinline__ float slot_blend(u8 m, float a, float gate_v, float hv, float sv) {
    if (m == 3) return hv * (1.0f + a * tanhf(sv - hv));
    return blend_lerp(hv, sv, m == 4 ? gate_amplitude(a, gate_v) : a);
}

extern "C" __global__ void __launch_bounds__(1024) slot_blend_select_f32(
    const float* h, const float* s, const float* alpha, const float* gate, const u8* mode, const u8* holds,
    float* s_mine, float* y, u32 envs, u32 batch, u32 features) {
    EnvIndex ix = env_index(envs, (u64)batch * features);
    FOR_EACH(t, (u64)envs * batch * features) {
        u32 e = env_of(t, ix);
        u8 m = mode[e];
        if (!holds[e] || m < 2 || m > 4) continue;
        float sv = s[t], hv = h[t];
        if (m != 2) s_mine[t] = sv;
        y[t] = slot_blend(m, clamp01(alpha[e]), m == 4 ? gate[t / features] : 0.0f, hv, sv);
    }
}

// ---- A slot before its block's 2x2 max-pool, the pool fused in: the slot's output is not written, its
// pooled windows and winners are (pooled, argmax: [E, B, C, size/2, size/2]), as max_pool2x2_forward_f32
// over slot_passthrough_f32's and slot_blend_select_f32's output would write them — the same values
// through max_pool_window, so the same bits — a write and a read of the slot's output fewer. Even
// planes only (size × size, size even: every element lies in a window, so s_mine is whole).

// The windows of the slot-pool kernels over all envs: window o's plane p, env e (p / (batch·channels))
// and the flat index of its top-left element, through FastDivs set up by one block_fast_divs call (its
// shared slots are the function's, so a second call could overwrite them while a thread still reads
// the first's).
struct SlotPoolIndex {
    PoolIndex pool;
    FastDiv env_planes;
    u64 windows;
};

__device__ __forceinline__ SlotPoolIndex slot_pool_index(u32 envs, u32 batch, u32 channels, u32 size) {
    u64 planes = (u64)envs * batch * channels;
    u32 half = size / 2;
    FastDiv f[3];
    block_fast_divs<3>({half * half, half, batch * channels}, f);
    SlotPoolIndex ix;
    ix.pool.fits = FITS_U32(planes * size * size);
    ix.pool.windows = f[0], ix.pool.wo = f[1], ix.env_planes = f[2];
    ix.windows = planes * f[0].d;
    return ix;
}

__device__ __forceinline__ void slot_pool_window(
    u64 o, const SlotPoolIndex& ix, u32 size, u64& p, u32& e, u64& top) {
    u32 oy, ox;
    pool_window(o, ix.pool, p, oy, ox);
    e = ix.pool.fits ? fdiv((u32)p, ix.env_planes) : (u32)(p / ix.env_planes.d);
    top = (p * size + 2 * oy) * size + 2 * ox;
}

// slot_passthrough_f32's rows pooled: env e's windows from h where slot_passthrough_f32 would copy h.
// Grid (blocks of an env's windows, envs).
extern "C" __global__ void __launch_bounds__(1024) slot_passthrough_pool_f32(
    const float* h, const u8* mode, const u8* holds, float* pooled, u8* argmax, u32 envs, u32 batch, u32 channels,
    u32 size) {
    u32 e = blockIdx.y;
    u64 planes = (u64)batch * channels;  // an env's
    PoolIndex ix = pool_index(planes, size, size);
    bool held = false;
    for (u32 bp = 0; bp < 7; ++bp) held = held || holds[(u64)bp * envs + e] != 0;
    if (mode[e] >= 2 && held) return;
    const float* he = h + (u64)e * planes * size * size;
    u64 windows = planes * ix.windows.d, first = (u64)e * windows;
    for (u64 o = (u64)blockIdx.x * blockDim.x + threadIdx.x; o < windows; o += (u64)gridDim.x * blockDim.x) {
        u64 p;
        u32 oy, ox;
        pool_window(o, ix, p, oy, ox);
        u32 k;
        pooled[first + o] = max_pool_at(he, p, oy, ox, size, size, &k);
        argmax[first + o] = (u8)k;
    }
}

// slot_blend_select_f32's rows pooled: the windows of the envs `holds` marks whose mode blends (2 ADD,
// 3 MULTIPLY, 4 GATE), each of the window's four values blended as there (s kept in s_mine for
// MULTIPLY and GATE), then pooled.
extern "C" __global__ void __launch_bounds__(1024) slot_blend_select_pool_f32(
    const float* h, const float* s, const float* alpha, const float* gate, const u8* mode, const u8* holds,
    float* s_mine, float* pooled, u8* argmax, u32 envs, u32 batch, u32 channels, u32 size) {
    SlotPoolIndex ix = slot_pool_index(envs, batch, channels, size);
    FOR_EACH(o, ix.windows) {
        u64 p, top;
        u32 e;
        slot_pool_window(o, ix, size, p, e, top);
        u8 m = mode[e];
        if (!holds[e] || m < 2 || m > 4) continue;
        // GATE: the sample's gate, at its image p / channels.
        float a = clamp01(alpha[e]), gate_v = m == 4 ? gate[p / channels] : 0.0f;
        u64 at[4] = {top, top + 1, top + size, top + size + 1};
        WindowLoads sw(s, at), hw(h, at);
        float window[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float sv = sw[j], hv = hw[j];
            if (m != 2) s_mine[at[j]] = sv;
            window[j] = slot_blend(m, a, gate_v, hv, sv);
        }
        u32 k;
        pooled[o] = max_pool_window(window, &k);
        argmax[o] = (u8)k;
    }
}

// Element t's split of its gradient g in mode m at amplitude a (gate_v: the sample's gate, read in
// GATE only), shared by slot_backward_split_f32 and slot_backward_split_pool_f32.
// dh null: ds alone (an ADD-only slot whose host gradient batch norm's backward recomputes:
// slot_host_factor).
__device__ __forceinline__ void slot_split(
    u64 t, u8 m, float a, float g, const float* h, const float* s_mine, float gate_v, float* dh, float* ds) {
    if (!dh) {
        ds[t] = m == 2 ? g * a : m == 1 ? g : 0.0f;
        return;
    }
    switch (m) {
        case 2:
            dh[t] = g * (1.0f - a);
            ds[t] = g * a;
            break;
        case 3: {
            float tv = tanhf(s_mine[t] - h[t]);
            dh[t] = g * (1.0f + a * tv);
            ds[t] = g * h[t] * a * (1.0f - tv * tv);
            break;
        }
        case 4: {
            float a_eff = gate_amplitude(a, gate_v);
            dh[t] = g * (1.0f - a_eff);
            ds[t] = g * a_eff;
            break;
        }
        default:
            dh[t] = g;
            ds[t] = m == 1 ? g : 0.0f;
    }
}

// The slot's backward split of the output gradient dy by each env's mode (0 off, 1 incubator, 2 ADD,
// 3 MULTIPLY, 4 GATE): the host's direct path dh and the seed's ds — off: (dy, 0); incubator: (dy, dy
// straight through); ADD: (dy·(1 − a), dy·a) as blend_add_backward; MULTIPLY with t = tanh(s − h):
// (dy·(1 + a·t), dy·h·a·(1 − t²)) as blend_multiply_backward (the seed's input is detached, so no
// x_s term reaches dh); GATE: (dy·(1 − a_eff), dy·a_eff) as blend_gate_backward.
extern "C" __global__ void __launch_bounds__(1024) slot_backward_split_f32(
    const float* dy, const float* h, const float* s_mine, const float* alpha, const float* gate,
    const u8* mode, float* dh, float* ds, u32 envs, u32 batch, u32 features) {
    EnvIndex ix = env_index(envs, (u64)batch * features);
    FOR_EACH(t, (u64)envs * batch * features) {
        u32 e = env_of(t, ix);
        u8 m = mode[e];
        slot_split(t, m, clamp01(alpha[e]), dy[t], h, s_mine, m == 4 ? gate[t / features] : 0.0f, dh, ds);
    }
}

// slot_backward_split_f32 over the gradient its block's 2x2 max-pool routes back (even square planes),
// the pool's backward fused in: one thread per window reads the pooled gradient and its winner, and
// splits each of the window's four elements' gradients — the winner's the window's, the others 0.0f,
// max_pool2x2_backward_f32's values — so the same bits, without writing the routed gradient and
// reading it back. (A slot with a GATE seed reads the routed gradient again for the gate's gradient,
// so it takes the kernels one by one.) dh null: the host's gradient is not written (a slot whose envs
// are all OFF, INCUBATOR or ADD: batch norm's backward recomputes it, slot_host_factor), ds alone.
extern "C" __global__ void __launch_bounds__(1024) slot_backward_split_pool_f32(
    const float* dy_pooled, const u8* argmax, const float* h, const float* s_mine, const float* alpha,
    const float* gate, const u8* mode, float* dh, float* ds, u32 envs, u32 batch, u32 channels, u32 size) {
    SlotPoolIndex ix = slot_pool_index(envs, batch, channels, size);
    FOR_EACH(o, ix.windows) {
        u64 p, top;
        u32 e;
        slot_pool_window(o, ix, size, p, e, top);
        u8 m = mode[e];
        float a = clamp01(alpha[e]), gate_v = m == 4 ? gate[p / channels] : 0.0f;
        float g = dy_pooled[o];
        u32 k = argmax[o];
        slot_split(top, m, a, k == 0 ? g : 0.0f, h, s_mine, gate_v, dh, ds);
        slot_split(top + 1, m, a, k == 1 ? g : 0.0f, h, s_mine, gate_v, dh, ds);
        slot_split(top + size, m, a, k == 2 ? g : 0.0f, h, s_mine, gate_v, dh, ds);
        slot_split(top + size + 1, m, a, k == 3 ? g : 0.0f, h, s_mine, gate_v, dh, ds);
    }
}

// clamp01's subgradient, PyTorch's convention: 1 on [0, 1], 0 outside (ops::real::clamp01_grad).
__device__ __forceinline__ float clamp01_grad(float v) { return (v >= 0.0f && v <= 1.0f) ? 1.0f : 0.0f; }

// The gate's gradient per sample i (env e = i / B) in GATE mode, as blend_gate_backward forms it:
// dg = Σ_features dy·(s − h) (the CPU's lanes) · a · clamp01'(a·clamp(g)) · clamp01'(g), a = clamp(alpha[e]);
// 0 for the samples of envs in any other mode.
extern "C" __global__ void slot_gate_grad_f32(
    const float* dy, const float* h, const float* s_mine, const float* alpha, const float* gate,
    const u8* mode, float* dg, u32 envs, u32 batch, u32 features) {
    FOR_EACH(i, (u64)envs * batch) {
        u32 e = (u32)(i / batch);
        if (mode[e] != 4) {
            dg[i] = 0.0f;
            continue;
        }
        Lanes sum;
        lanes_zero(sum);
        const u64 base = i * features;
        for (u32 f = 0; f < features; ++f) sum.l[f % 8] += dy[base + f] * (s_mine[base + f] - h[base + f]);
        float a = clamp01(alpha[e]), g = clamp01(gate[i]);
        dg[i] = lanes_total(sum) * a * clamp01_grad(a * g) * clamp01_grad(gate[i]);
    }
}
