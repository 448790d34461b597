// Batch norm over [E, B, C, H, W] with statistics per (env, channel): the CUDA twins of
// batch_norm_train_forward, batch_norm_eval_forward and batch_norm_backward (kernels/src/ops/norm.rs).
// Biased variance, eps 1e-5; running statistics with momentum 0.1 and the unbiased variance (PyTorch).
//
// The reductions sum in double, in runs of a fixed shared-memory tree each, the runs added in order, so a
// result depends only on the shape. The CPU sums in f32 lanes: the two agree to a few ulps, not bit for
// bit.

#define NORM_EPS 1e-5
#define BN_MOMENTUM 0.1f
// Element j (0 .. B*P) of (env e, channel c): image j / P, position j % P.
__device__ __forceinline__ u64 bn_index(u32 e, u32 c, u64 j, u32 batch, u32 channels, u32 plane) {
    u64 b = j / plane, k = j % plane;
    return (((u64)e * batch + b) * channels + c) * plane + k;
}

// Index i over [E, B, C] planes of P values (elements, or 2x2 windows with P their count a plane) → its
// plane (e·B + b)·C + c, its place r there and e·C + c, its (env, channel)'s parameter index: with
// FastDivs (`fits`, every index of the launch in 32 bits) or 64-bit division; `row` divides a place by
// a row's length where the kernel needs it (1 elsewhere). The FastDivs are the block's (block_fast_divs:
// a barrier every thread of the block reaches).
struct BnParamIndex {
    bool fits;
    FastDiv plane, channels, batch, row;
};

__device__ __forceinline__ BnParamIndex bn_param_index(u32 envs, u32 batch, u32 channels, u32 plane, u32 row = 1) {
    BnParamIndex ix;
    ix.fits = FITS_U32((u64)envs * batch * channels * plane);
    FastDiv f[4];
    block_fast_divs<4>({plane, channels, batch, row}, f);
    ix.plane = f[0], ix.channels = f[1], ix.batch = f[2], ix.row = f[3];
    return ix;
}

__device__ __forceinline__ void bn_locate(u64 i, const BnParamIndex& ix, u64& plane_index, u32& r, u32& pair) {
    u32 channels = ix.channels.d;
    if (ix.fits) {
        u32 pi = fdiv((u32)i, ix.plane), image = fdiv(pi, ix.channels);
        plane_index = pi, r = (u32)i - pi * ix.plane.d;
        pair = fdiv(image, ix.batch) * channels + (pi - image * channels);
    } else {
        plane_index = i / ix.plane.d, r = (u32)(i % ix.plane.d);
        pair = (u32)(plane_index / ((u64)channels * ix.batch.d)) * channels + (u32)(plane_index % channels);
    }
}

__device__ __forceinline__ u32 bn_param(u64 i, const BnParamIndex& ix) {
    u64 plane_index;
    u32 r, pair;
    bn_locate(i, ix, plane_index, r, pair);
    return pair;
}

// ---- The per-(env, channel) reductions, split. One block per (env, channel) left most of an H100 idle
// (at W16 the first block's 128 pairs, each half a million values, ran as 128 blocks on 132 SMs: ncu put
// batch norm at 22 % of a bare step). The B·P values of pair p (in j order: image j / P, position
// j % P) are cut into `splits` runs of `run` values; block (p, s) sums run s with its fixed tree into
// partial[(p·splits + s)·2 + {0, 1}], and a finish kernel, one thread per pair, adds the runs in order:
// a result depends only on the shape (the env count included: it sets the runs).

#define BN_RUN_BATCH (LOADS_AHEAD ? 4 : 1)

// Thread threadIdx.x's share of run [first, last) of pair (e, c): BN_RUN_BATCH of its elements at a time,
// their terms (the loads) first, then added in the thread's order — the same sums as one at a time, bit
// for bit. One at a time, each load was used two instructions after it was issued (SASS: LDG, then
// F2F.F64 on it), so a thread had one load in flight and an SM far fewer bytes than its share of the
// memory's bandwidth × latency. FITS: j's split into image and position in 32 bits (a FastDiv); a
// template argument, as the callers' own uniform choices are, so that no branch separates the loads.
template <bool FITS, typename Terms>
__device__ __forceinline__ void bn_run_loop(
    Terms terms, u32 e, u32 c, u32 batch, u32 channels, u32 plane, FastDiv fplane, u64 first, u64 last,
    double& s0, double& s1) {
    auto term = [&](u64 j) {
        u64 b, k;
        if (FITS) {
            u32 image = fdiv((u32)j, fplane);
            b = image, k = (u32)j - image * plane;
        } else {
            b = j / plane, k = j % plane;
        }
        u64 plane_index = ((u64)e * batch + b) * channels + c;
        return terms(plane_index * plane + k, plane_index, (u32)k);
    };
    u64 j = first + threadIdx.x;
    for (; j + (BN_RUN_BATCH - 1) * REDUCE_THREADS < last; j += BN_RUN_BATCH * REDUCE_THREADS) {
        double2 t[BN_RUN_BATCH];
#pragma unroll
        for (int q = 0; q < BN_RUN_BATCH; ++q) t[q] = term(j + (u64)q * REDUCE_THREADS);
#pragma unroll
        for (int q = 0; q < BN_RUN_BATCH; ++q) {
            s0 += t[q].x;
            s1 += t[q].y;
        }
    }
    for (; j < last; j += REDUCE_THREADS) {
        double2 t = term(j);
        s0 += t.x;
        s1 += t.y;
    }
}

// Block (p, s)'s sums over run s of pair p of the two terms `terms(i, plane_index, r)` gives for element
// i (a flat [E, B, C, P] index: element r of plane `plane_index` = (e·B + image)·C + c), into partial.
// The split of j into image and position in 32 bits (a FastDiv) when B·P fits.
template <typename Terms>
__device__ __forceinline__ void bn_run_sums(
    Terms terms, double* partial, u32 batch, u32 channels, u32 plane, u32 splits, u32 run) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 p = blockIdx.x, s = blockIdx.y, e = p / channels, c = p % channels;
    u64 count = (u64)batch * plane;
    FastDiv fplane = fast_div(plane);
    u64 first = (u64)s * run, last = min(first + run, count);
    double s0 = 0.0, s1 = 0.0;
    if (FITS_U32(count))
        bn_run_loop<true>(terms, e, c, batch, channels, plane, fplane, first, last, s0, s1);
    else
        bn_run_loop<false>(terms, e, c, batch, channels, plane, fplane, first, last, s0, s1);
    s0 = block_sum(s0, lanes);
    s1 = block_sum(s1, lanes);
    if (threadIdx.x == 0) {
        partial[((u64)p * splits + s) * 2] = s0;
        partial[((u64)p * splits + s) * 2 + 1] = s1;
    }
}

// Training statistics, one pass: the shifted sums of d = x − x₀ and d² (x₀ the pair's first value, j = 0;
// 0 when that is not finite, so that an infinity elsewhere gives the CPU's ±inf mean), so that var =
// Σd²/N − (Σd/N)² in double stays within an f32 ulp or two unless the mean lies a thousand standard
// deviations from x₀ (x₀ is a sample: a few). Grid (E·C, splits), REDUCE_THREADS threads.
__device__ __forceinline__ double bn_shift(const float* x, u32 p, u32 batch, u32 channels, u32 plane) {
    double x0 = (double)x[bn_index(p / channels, p % channels, 0, batch, channels, plane)];
    return isfinite(x0) ? x0 : 0.0;
}

extern "C" __global__ void batch_norm_stats_partial_f32(
    const float* x, double* partial, u32 batch, u32 channels, u32 plane, u32 splits, u32 run) {
    double shift = bn_shift(x, blockIdx.x, batch, channels, plane);
    auto terms = [&](u64 i, u64, u32) {
        double d = (double)x[i] - shift;
        return make_double2(d, d * d);
    };
    bn_run_sums(terms, partial, batch, channels, plane, splits, run);
}

// Pair p's save_mean, save_inv_std = 1/sqrt(var + eps) (biased variance) and running statistics updated
// in place from its mean and variance over `count` values, in double. Rounding can take a variance of
// (nearly) equal values below zero; a NaN stays NaN, as the CPU's.
__device__ __forceinline__ void bn_write_stats(
    u64 p, double mean, double var, u64 count, float* save_mean, float* save_inv_std, float* running_mean,
    float* running_var) {
    if (var < 0.0) var = 0.0;
    float m = (float)mean, v = (float)var;
    save_mean[p] = m;
    save_inv_std[p] = 1.0f / sqrtf(v + (float)NORM_EPS);
    float unbiased = (float)count / (float)(count - 1);
    running_mean[p] = (1.0f - BN_MOMENTUM) * running_mean[p] + BN_MOMENTUM * m;
    running_var[p] = (1.0f - BN_MOMENTUM) * running_var[p] + BN_MOMENTUM * v * unbiased;
}

// save_mean, save_inv_std and the running statistics (bn_write_stats) for every (env, channel) p < pairs,
// from the runs' sums.
extern "C" __global__ void batch_norm_stats_finish_f32(
    const float* x, const double* partial, float* save_mean, float* save_inv_std, float* running_mean,
    float* running_var, u32 pairs, u32 batch, u32 channels, u32 plane, u32 splits) {
    FOR_EACH(p, pairs) {
        double shift = bn_shift(x, (u32)p, batch, channels, plane);
        double sum = 0.0, sum_sq = 0.0;
        for (u32 s = 0; s < splits; ++s) {
            sum += partial[(p * splits + s) * 2];
            sum_sq += partial[(p * splits + s) * 2 + 1];
        }
        u64 count = (u64)batch * plane;
        double n = (double)count, mean_d = sum / n;
        bn_write_stats(p, shift + mean_d, sum_sq / n - mean_d * mean_d, count, save_mean, save_inv_std,
                       running_mean, running_var);
    }
}

// The same from the statistics a training convolution's epilogue summed (conv3x3_tc_n*_tf32 with
// `stats`): per pair p, `runs` runs of (shift, Σ d, Σ d²), run r over images r·per_run .. of `plane`
// values each. Each run's mean and sum of squared deviations, then the runs combined (Chan, Golub &
// LeVeque's pairwise update) in a fixed order, in double.
#define FINISH_LANES 32

// (n, mean, m2) of a set of values followed by (nb, mean_b, m2_b) of another: Chan, Golub & LeVeque's
// pairwise update (an empty side leaves the other as it is).
__device__ __forceinline__ void chan_combine(double& n, double& mean, double& m2, double nb, double mean_b,
                                             double m2_b) {
    if (nb == 0.0) return;
    if (n == 0.0) {
        n = nb, mean = mean_b, m2 = m2_b;
        return;
    }
    double total = n + nb, delta = mean_b - mean;
    mean += delta * nb / total;
    m2 += m2_b + delta * delta * n * nb / total;
    n = total;
}

// One block of FINISH_LANES threads per pair: lane l combines the runs l, l + 32, … in order, then the
// lanes' results combine in a fixed tree through shared memory (lane i with lane i + half, halves 16
// … 1). One thread walking all the runs (512 at W16's first block, each with double divisions) had
// taken 0.1–0.2 ms a launch; the order is fixed, so a result depends only on the shape.
extern "C" __global__ void __launch_bounds__(FINISH_LANES) batch_norm_stats_finish_runs_f32(
    const double* stats, float* save_mean, float* save_inv_std, float* running_mean, float* running_var, u32 pairs,
    u32 runs, u32 batch, u32 per_run, u32 plane) {
    __shared__ double part[3][FINISH_LANES];
    u32 p = blockIdx.x, lane = threadIdx.x;
    if (p >= pairs) return;  // the whole block: no barrier is left waiting
    double n = 0.0, mean = 0.0, m2 = 0.0;
    for (u32 r = lane; r < runs; r += FINISH_LANES) {
        const double* run = stats + ((u64)p * runs + r) * 3;
        double nb = (double)min(per_run, batch - r * per_run) * plane;
        chan_combine(n, mean, m2, nb, run[0] + run[1] / nb, run[2] - run[1] * run[1] / nb);
    }
    part[0][lane] = n, part[1][lane] = mean, part[2][lane] = m2;
    __syncthreads();
    for (u32 half = FINISH_LANES / 2; half > 0; half /= 2) {
        if (lane < half) {
            double na = part[0][lane], ma = part[1][lane], qa = part[2][lane];
            chan_combine(na, ma, qa, part[0][lane + half], part[1][lane + half], part[2][lane + half]);
            part[0][lane] = na, part[1][lane] = ma, part[2][lane] = qa;
        }
        __syncthreads();
    }
    if (lane == 0)
        bn_write_stats(p, part[1][0], part[2][0] / part[0][0], (u64)batch * plane, save_mean, save_inv_std,
                       running_mean, running_var);
}

// The normalisation's scale of (env, channel) p: inv_std · γ in training (the batch's statistics),
// γ / sqrt(running_var + eps) in evaluation.
__device__ __forceinline__ float bn_scale(const float* inv_std_or_var, const float* gamma, u32 p, int eval) {
    return eval ? gamma[p] / sqrtf(inv_std_or_var[p] + (float)NORM_EPS) : inv_std_or_var[p] * gamma[p];
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
        float scale = bn_scale(inv_std_or_var, gamma, p, eval);
        float v = (x[i] - mean[p]) * scale + beta[p];
        if (relu) v = !(v <= 0.0f) ? v : 0.0f;
        y[i] = v;
    }
}

// batch_norm_apply_f32 with the ReLU, then max_pool2x2_forward_f32, in one pass where nothing runs
// between them (no seed at the block's r0 slot): one thread per 2x2 window normalises its four values,
// writes them to `act` when `write_act` (the ReLU's output later validation passes starting at the r0
// slot read; a training step's backward recomputes the ReLU's mask from x instead, so training passes
// 0) and pools them into `pooled` / `argmax`; the same values as the two kernels, without reading
// `act` back. Even planes only (every window whole: no dropped row or column left for another thread).
extern "C" __global__ void PASS_BOUNDS batch_norm_relu_pool_f32(
    const float* x, float* act, float* pooled, u8* argmax, const float* mean, const float* inv_std_or_var,
    const float* gamma, const float* beta, u32 envs, u32 batch, u32 channels, u32 h, u32 w, int eval,
    int write_act) {
    // A window's plane, place and (env, channel) through the block's FastDivs where every index fits in
    // 32 bits (bn_locate): the 64-bit divisions this kernel did per window were called routines, several
    // times its loads and stores in instructions.
    u32 wo = w / 2, windows = (h / 2) * wo;
    BnParamIndex ix = bn_param_index(envs, batch, channels, windows, wo);
    FOR_EACH(o, (u64)envs * batch * channels * windows) {
        u64 plane_index;
        u32 r, p;
        bn_locate(o, ix, plane_index, r, p);
        u32 oy = fdiv(r, ix.row), ox = r - oy * wo;
        float scale = bn_scale(inv_std_or_var, gamma, p, eval), m = mean[p], shift = beta[p];
        u64 top = (plane_index * h + 2 * oy) * w + 2 * ox;
        u64 at[4] = {top, top + 1, top + w, top + w + 1};
        WindowLoads xw(x, at);
        float window[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            float v = (xw[j] - m) * scale + shift;
            v = !(v <= 0.0f) ? v : 0.0f;
            if (write_act) act[at[j]] = v;
            window[j] = v;
        }
        u32 k;
        pooled[o] = max_pool_window(window, &k);
        argmax[o] = (u8)k;
    }
}

// The parameter half of the backward: per run, Σ dy and Σ dy·(x − mean) (the difference in f32, as
// the CPU twin). Grid (E·C, splits), REDUCE_THREADS threads.
extern "C" __global__ void batch_norm_backward_params_partial_f32(
    const float* x, const float* dy, const float* save_mean, double* partial, u32 batch, u32 channels,
    u32 plane, u32 splits, u32 run) {
    float mean = save_mean[blockIdx.x];
    auto terms = [&](u64 i, u64, u32) {
        double g = (double)dy[i];
        return make_double2(g, g * (double)(x[i] - mean));
    };
    bn_run_sums(terms, partial, batch, channels, plane, splits, run);
}

// The ReLU's backward (with `pooled`, the 2x2 max-pool's before it) and then
// batch_norm_backward_params_partial_f32 in one pass, where nothing runs between the batch norm and
// the ReLU (the ReLU follows every host batch norm; the pool, when no seed sits at the block's r0
// slot, follows it at once): block (p, s) sums Σ g and Σ g·(x − mean) over run s of pair p as the
// params kernel does, g batch norm's output gradient as bn_output_grad recomputes it from x and `dy`
// (with `pooled` the pool's output gradient, else the ReLU's). Nothing else is written: the input
// gradient (batch_norm_backward_input_from_f32) recomputes g as well, so neither the ReLU's output nor
// g itself is ever read or written — the same sums, bit for bit, as the unfused kernels on the g they
// would write. Grid (E·C, splits), REDUCE_THREADS threads.
//
// slot_mode, slot_alpha (null where no r0 slot runs): the pool's gradient reached the block through
// an r0 slot's split, whose host gradient this recomputes — slot_host_factor's factor on the routed
// gradient (ADD: dy·(1 − a)) — instead of reading it written (bn_slot_grad's order: the same bits).
extern "C" __global__ void relu_bn_backward_partial_f32(
    const float* dy, const u8* argmax, const float* x, const float* save_mean, const float* save_inv_std,
    const float* gamma, const float* beta, double* partial, u32 batch, u32 channels, u32 h, u32 w,
    u32 splits, u32 run, int pooled, const u8* slot_mode, const float* slot_alpha) {
    u32 p = blockIdx.x;
    float mean = save_mean[p], scale = bn_scale(save_inv_std, gamma, p, 0), shift = beta[p];
    bool scaled;
    float factor = slot_host_factor(slot_mode, slot_alpha, p / channels, &scaled);
    FastDiv f_w = fast_div(w);  // a row by multiply and shifts, not a division per element
    // The terms from batch norm's output gradient g (bn_output_grad's value: the ReLU's mask on the
    // gradient that reached the block), each case its own loop (bn_run_loop: no branch between loads).
    auto terms_of = [&](float xi, float g) {
        double gd = (double)slot_scaled_grad(scaled, factor, bn_relu_open(xi, mean, scale, shift) ? g : 0.0f);
        return make_double2(gd, gd * (double)(xi - mean));
    };
    u32 ho = h / 2, wo = w / 2;
    if (pooled && ho > 0 && wo > 0) {
        auto terms = [&](u64 i, u64 plane_index, u32 r) {
            float xi = x[i];
            u32 iy = fdiv(r, f_w);
            return terms_of(xi, routed_gradient_window(dy, argmax, plane_index, iy, r - iy * w, ho, wo));
        };
        bn_run_sums(terms, partial, batch, channels, h * w, splits, run);
    } else if (!pooled) {
        auto terms = [&](u64 i, u64, u32) { return terms_of(x[i], dy[i]); };
        bn_run_sums(terms, partial, batch, channels, h * w, splits, run);
    } else {
        // A pool over planes under 2×2: no window, every gradient 0.
        auto terms = [&](u64 i, u64, u32) { return terms_of(x[i], 0.0f); };
        bn_run_sums(terms, partial, batch, channels, h * w, splits, run);
    }
}

// dβ = Σ dy, dγ = Σ dy·(x − mean) · inv_std from the runs' sums, for every (env, channel) p < pairs.
// Overwrites grad_gamma and grad_beta; where `coef` is not null, also the pair's BN_COEF coefficients of
// the input gradient (bn_input_grad: mean, inv_std·γ, β, inv_std, dβ/N, dγ/N with N = count, the
// values batch_norm_backward_input_f32 computes from the same tensors).
extern "C" __global__ void batch_norm_backward_params_finish_f32(
    const double* partial, const float* save_mean, const float* save_inv_std, const float* gamma,
    const float* beta, float* grad_gamma, float* grad_beta, float* coef, u32 pairs, u32 splits, u64 count,
    const u8* slot_mode, const float* slot_alpha, u32 channels) {
    FOR_EACH(p, pairs) {
        double sum_dy = 0.0, sum_dy_centered = 0.0;
        for (u32 s = 0; s < splits; ++s) {
            sum_dy += partial[(p * splits + s) * 2];
            sum_dy_centered += partial[(p * splits + s) * 2 + 1];
        }
        float inv_std = save_inv_std[p];
        float d_beta = (float)sum_dy, d_gamma = (float)sum_dy_centered * inv_std;
        grad_beta[p] = d_beta;
        grad_gamma[p] = d_gamma;
        if (coef) {
            float n = (float)count, *c = coef + p * BN_COEF;
            c[0] = save_mean[p];
            c[1] = bn_scale(save_inv_std, gamma, (u32)p, 0);
            c[2] = beta[p];
            c[3] = inv_std;
            c[4] = d_beta / n;
            c[5] = d_gamma / n;
            bool scaled;
            c[6] = slot_host_factor(slot_mode, slot_alpha, (u32)(p / channels), &scaled);
            c[7] = scaled ? 1.0f : 0.0f;
        }
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

// batch_norm_backward_input_f32 where a ReLU (and with `pooled` the 2x2 max-pool) follows the norm,
// from what relu_bn_backward_partial_f32 read: the output gradient recomputed from x and dy
// (bn_output_grad), the input gradient from the pair's coefficients (bn_input_grad) — the same bits
// as the pool's, the ReLU's and batch norm's input backwards one by one, reading x and dy (the pool's
// output gradient with `pooled`: a quarter of the values) instead of x and a written g. dx must not
// alias dy.
//
// With `pooled` and even planes (every element in a whole window), one thread per 2x2 window: its four
// elements share the window's argmax and gradient (element j of the window gets it where the argmax
// is j and the ReLU passed: routed_gradient_at's k = (iy % 2)·2 + ix % 2 is j there), so those loads
// and the index math are done once a window instead of once an element. The same operations per
// element: the same bits.
extern "C" __global__ void PASS_BOUNDS batch_norm_backward_input_from_f32(
    const float* dy, const u8* argmax, const float* x, const float* coef, float* dx, u32 envs, u32 batch,
    u32 channels, u32 h, u32 w, int pooled) {
    u32 plane = h * w;
    u64 n = (u64)envs * batch * channels * plane;
    bool windows = pooled && h % 2 == 0 && w % 2 == 0;
    u32 wo = w / 2;
    // A window's or an element's plane, place, (env, channel) and row: bn_locate, ix.row.
    BnParamIndex ix = bn_param_index(envs, batch, channels, windows ? plane / 4 : plane, windows ? wo : w);
    if (windows) {
        FOR_EACH(o, n / 4) {
            u64 plane_index;
            u32 r, pair;
            bn_locate(o, ix, plane_index, r, pair);
            u32 oy = fdiv(r, ix.row), ox = r - oy * wo;
#if LOADS_AHEAD
            // The pair's coefficients in registers: read through `coef` they were loaded again after each
            // of the window's four stores (dx could be them, for all the compiler knows).
            float c[BN_COEF];
#pragma unroll
            for (int q = 0; q < BN_COEF; ++q) c[q] = coef[(u64)pair * BN_COEF + q];
#else
            const float* c = coef + (u64)pair * BN_COEF;
#endif
            float routed = dy[o];
            u32 k = argmax[o];
            u64 top = (plane_index * h + 2 * oy) * w + 2 * ox;
            u64 at[4] = {top, top + 1, top + w, top + w + 1};
            WindowLoads xw(x, at);
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {
                dx[at[j]] = bn_window_input_grad(c, xw[j], k, j, routed);
            }
        }
        return;
    }
    FOR_EACH(i, n) {
        u64 plane_index;
        u32 r, pair;
        bn_locate(i, ix, plane_index, r, pair);
        const float* c = coef + (u64)pair * BN_COEF;
        float xi = x[i];
        u32 iy = fdiv(r, ix.row);
        float g = bn_output_grad(xi, c[0], c[1], c[2], dy, argmax, pooled, i, plane_index, iy, r - iy * w, h, w);
        dx[i] = bn_input_grad(c, xi, bn_slot_grad(c, g));
    }
}
