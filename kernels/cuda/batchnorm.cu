// Batch norm over [E, B, C, H, W] with statistics per (env, channel): the CUDA twins of
// batch_norm_train_forward, batch_norm_eval_forward and batch_norm_backward (kernels/src/ops/norm.rs).
// Biased variance, eps 1e-5; running statistics with momentum 0.1 and the unbiased variance (PyTorch).
//
// The reductions run one block per (env, channel) (blockIdx.x = e*C + c, blockDim.x = 256): each thread
// sums a strided share in double, then a fixed shared-memory tree combines them, so a result depends
// only on the shape. The CPU sums in f32 lanes: the two agree to a few ulps, not bit for bit.

#define NORM_EPS 1e-5
#define BN_MOMENTUM 0.1f
// Element j (0 .. B*P) of (env e, channel c): image j / P, position j % P.
__device__ __forceinline__ u64 bn_index(u32 e, u32 c, u64 j, u32 batch, u32 channels, u32 plane) {
    u64 b = j / plane, k = j % plane;
    return (((u64)e * batch + b) * channels + c) * plane + k;
}

// bn_index with the split in 32 bits (FastDiv `fplane` of plane), for counts B·P that fit.
__device__ __forceinline__ u64 bn_index32(u32 e, u32 c, u32 j, u32 batch, u32 channels, const FastDiv& fplane) {
    u32 b = fdiv(j, fplane), k = j - b * fplane.d;
    return (((u64)e * batch + b) * channels + c) * fplane.d + k;
}

// Element j of the reduction kernels' (e, c), with their `fits`, `fplane`, batch, channels, plane.
#define BN_AT(j) (fits ? bn_index32(e, c, (u32)(j), batch, channels, fplane) : bn_index(e, c, j, batch, channels, plane))

// Element i of [E, B, C, P] → e·C + c, its (env, channel)'s parameter index: with FastDivs (`fits`,
// every index of the launch in 32 bits) or 64-bit division.
struct BnParamIndex {
    bool fits;
    FastDiv plane, channels, batch;
};

__device__ __forceinline__ BnParamIndex bn_param_index(u32 envs, u32 batch, u32 channels, u32 plane) {
    BnParamIndex ix;
    ix.fits = FITS_U32((u64)envs * batch * channels * plane);
    ix.plane = fast_div(plane), ix.channels = fast_div(channels), ix.batch = fast_div(batch);
    return ix;
}

__device__ __forceinline__ u32 bn_param(u64 i, const BnParamIndex& ix) {
    u32 channels = ix.channels.d;
    if (ix.fits) {
        u32 image_pos = fdiv((u32)i, ix.plane), image = fdiv(image_pos, ix.channels);
        return fdiv(image, ix.batch) * channels + (image_pos - image * channels);
    }
    u64 image_pos = i / ix.plane.d;
    u32 c = (u32)(image_pos % channels);
    u32 e = (u32)(image_pos / ((u64)channels * ix.batch.d));
    return e * channels + c;
}

// Training statistics: save_mean, save_inv_std = 1/sqrt(var + eps), and the running statistics updated
// in place, for every (env, channel). Two passes over the values (the variance from deviations).
extern "C" __global__ void batch_norm_train_stats_f32(
    const float* x, float* save_mean, float* save_inv_std, float* running_mean, float* running_var,
    u32 batch, u32 channels, u32 plane) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 p = blockIdx.x, e = p / channels, c = p % channels;
    u64 count = (u64)batch * plane;
    double s = 0.0;
    bool fits = FITS_U32(count);
    FastDiv fplane = fast_div(plane);
    for (u64 j = threadIdx.x; j < count; j += REDUCE_THREADS) s += (double)x[BN_AT(j)];
    double mean = block_sum(s, lanes) / (double)count;
    double q = 0.0;
    for (u64 j = threadIdx.x; j < count; j += REDUCE_THREADS) {
        double d = (double)x[BN_AT(j)] - mean;
        q += d * d;
    }
    double var = block_sum(q, lanes) / (double)count;
    if (threadIdx.x == 0) {
        float m = (float)mean, v = (float)var;
        save_mean[p] = m;
        save_inv_std[p] = 1.0f / sqrtf(v + (float)NORM_EPS);
        float unbiased = (float)count / (float)(count - 1);
        running_mean[p] = (1.0f - BN_MOMENTUM) * running_mean[p] + BN_MOMENTUM * m;
        running_var[p] = (1.0f - BN_MOMENTUM) * running_var[p] + BN_MOMENTUM * v * unbiased;
    }
}

// y = act((x − mean)·scale + shift) per element, with (mean, scale, shift) of its (env, channel):
// training (eval == 0): (save_mean, save_inv_std·γ, β); eval: (running_mean, γ/sqrt(running_var + eps),
// β). relu != 0 fuses the ReLU that follows every host batch norm (NaN passes, as relu_forward).
extern "C" __global__ void __launch_bounds__(1024) batch_norm_apply_f32(
    const float* x, float* y, const float* mean, const float* inv_std_or_var, const float* gamma,
    const float* beta, u32 envs, u32 batch, u32 channels, u32 plane, int eval, int relu) {
    BnParamIndex ix = bn_param_index(envs, batch, channels, plane);
    FOR_EACH(i, (u64)envs * batch * channels * plane) {
        u32 p = bn_param(i, ix);
        float scale = eval ? gamma[p] / sqrtf(inv_std_or_var[p] + (float)NORM_EPS) : inv_std_or_var[p] * gamma[p];
        float v = (x[i] - mean[p]) * scale + beta[p];
        if (relu) v = !(v <= 0.0f) ? v : 0.0f;
        y[i] = v;
    }
}

// The parameter half of the backward, one block per (env, channel): dβ = Σ dy, dγ = Σ dy·(x − mean) ·
// inv_std. Overwrites grad_gamma and grad_beta.
extern "C" __global__ void batch_norm_backward_params_f32(
    const float* x, const float* dy, const float* save_mean, const float* save_inv_std,
    float* grad_gamma, float* grad_beta, u32 batch, u32 channels, u32 plane) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 p = blockIdx.x, e = p / channels, c = p % channels;
    u64 count = (u64)batch * plane;
    float mean = save_mean[p];
    double s = 0.0, sc = 0.0;
    bool fits = FITS_U32(count);
    FastDiv fplane = fast_div(plane);
    for (u64 j = threadIdx.x; j < count; j += REDUCE_THREADS) {
        u64 i = BN_AT(j);
        double g = (double)dy[i];
        s += g;
        sc += g * (double)(x[i] - mean);
    }
    double sum_dy = block_sum(s, lanes);
    double sum_dy_centered = block_sum(sc, lanes);
    if (threadIdx.x == 0) {
        grad_beta[p] = (float)sum_dy;
        grad_gamma[p] = (float)sum_dy_centered * save_inv_std[p];
    }
}

// The input half: dx = γ·inv_std·(dy − dβ/N − x̂·dγ/N), x̂ = (x − mean)·inv_std, N = B·H·W, in the CPU
// twin's f32 operations and order (DxConsts::input_grad).
extern "C" __global__ void __launch_bounds__(1024) batch_norm_backward_input_f32(
    const float* x, const float* dy, const float* gamma, const float* save_mean, const float* save_inv_std,
    const float* grad_gamma, const float* grad_beta, float* dx, u32 envs, u32 batch, u32 channels,
    u32 plane) {
    float n = (float)((u64)batch * plane);
    BnParamIndex ix = bn_param_index(envs, batch, channels, plane);
    FOR_EACH(i, (u64)envs * batch * channels * plane) {
        u32 p = bn_param(i, ix);
        float inv_std = save_inv_std[p];
        float x_hat = (x[i] - save_mean[p]) * inv_std;
        dx[i] = (gamma[p] * inv_std) * (dy[i] - grad_beta[p] / n - x_hat * (grad_gamma[p] / n));
    }
}
