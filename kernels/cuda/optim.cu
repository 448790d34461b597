// SGD with momentum and weight decay, per-env gradient clipping and masked row resets over parameters
// stacked by env ([E, n]): the CUDA twins of kernels/src/optim.rs. One launch covers every env.

// Per-env sums of squares, stage 1: block b of env e sums its stretch of env e's n values in double and
// writes partial[e * blocks_per_env + b]. Stage 2 (sq_norms_finish) adds those partials in block order,
// so the total depends only on blocks_per_env, never on scheduling. blockDim.x must be 256.
extern "C" __global__ void sq_norms_partial_f32(
    const float* grad, double* partial, u64 n, u32 blocks_per_env) {
    __shared__ double lanes[256];
    u32 e = blockIdx.y, b = blockIdx.x;
    const float* g = grad + (u64)e * n;
    u64 chunk = (n + blocks_per_env - 1) / blocks_per_env;
    u64 start = (u64)b * chunk, end = min(n, start + chunk);
    double s = 0.0;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) s += (double)g[i] * (double)g[i];
    lanes[threadIdx.x] = s;
    __syncthreads();
    for (u32 half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) lanes[threadIdx.x] += lanes[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[(u64)e * blocks_per_env + b] = lanes[0];
}

// Stage 2: sq_norms[e] += the sum of env e's partials in block order (`+=`: several parameter groups
// add into one env's norm, as accumulate_sq_norms does).
extern "C" __global__ void sq_norms_finish(const double* partial, double* sq_norms, u32 envs, u32 blocks_per_env) {
    FOR_EACH(e, envs) {
        double s = 0.0;
        for (u32 b = 0; b < blocks_per_env; ++b) s += partial[(u64)e * blocks_per_env + b];
        sq_norms[e] += s;
    }
}

// clip_grad_norm_'s factor per env: clamp(max_norm / (sqrt(sq_norm) + 1e-6), max = 1), as
// clip_coefficient: a NaN passes through, as torch.clamp lets it.
extern "C" __global__ void clip_coefficients(const double* sq_norms, double* coef, u32 envs, double max_norm) {
    FOR_EACH(e, envs) {
        double c = max_norm / (sqrt(sq_norms[e]) + 1e-6);
        coef[e] = c >= 1.0 ? 1.0 : c;
    }
}

// grad[e, :] *= coef[e] (rounded to f32 first, as scale_per_env does with T::from_f64); envs whose
// coefficient is exactly 1 are left untouched.
extern "C" __global__ void scale_per_env_f32(float* grad, const double* coef, u64 n, u32 envs) {
    FOR_EACH(i, n * envs) {
        double c = coef[i / n];
        if (c != 1.0) grad[i] *= (float)c;
    }
}

// One SGD step for the envs whose group has a gradient (active[e] != 0):
// g = grad + wd*p; buf = mu*buf + g; p -= lr*buf (PyTorch, dampening 0, no Nesterov). Inactive envs are
// skipped entirely (no momentum, no decay move), as PyTorch skips a parameter whose .grad is None. The
// operations are the CPU twin's, in its order and in f32, so the bits agree.
extern "C" __global__ void sgd_step_f32(
    float* param, const float* grad, float* momentum, const u8* active, u64 n, u32 envs,
    float lr, float mu, float wd, int decay) {
    FOR_EACH(i, n * envs) {
        if (!active[i / n]) continue;
        float g = grad[i];
        if (decay) g = g + wd * param[i];
        float m = mu * momentum[i] + g;
        momentum[i] = m;
        param[i] -= lr * m;
    }
}

// Clears the rows of the envs marked in `mask` ([E, n] buffer): momentum reset at germinate, fossilize
// and rollback, and a pruned slot's parameters, for every marked env in one launch.
extern "C" __global__ void zero_masked_rows_f32(float* data, const u8* mask, u64 n, u32 envs) {
    FOR_EACH(i, n * envs) {
        if (mask[i / n]) data[i] = 0.0f;
    }
}

// Copies the rows of the envs marked in `mask` from `src` to `dst` (both [E, n]): a germinated slot's
// freshly drawn initial parameters (drawn on the host from the env's own stream, uploaded once) or a
// snapshot restored on rollback, for every marked env in one launch.
extern "C" __global__ void copy_masked_rows_f32(float* dst, const float* src, const u8* mask, u64 n, u32 envs) {
    FOR_EACH(i, n * envs) {
        if (mask[i / n]) dst[i] = src[i];
    }
}
