// The classifier head per env: linear layer forward and backward, softmax cross-entropy with its
// gradient, and the count of correct predictions: the CUDA twins of kernels/src/ops/linear.rs and
// kernels/src/ops/loss.rs. Layouts: x [E, B, in], weight [E, out, in], bias [E, out], y [E, B, out],
// logits [E, B, K], labels [E, B] (u8). The head is small (32 -> 10 on cifar_baseline): one thread per
// output element, each summing in the CPU twin's order where the twin sums in order (so those agree
// bit for bit; the forward's dot product uses lanes on the CPU and agrees to a few ulps).

// y[e, b, o] = Σ_j x[e, b, j]·W[e, o, j] + bias[e, o] (has_bias == 0: no bias).
extern "C" __global__ void linear_forward_f32(
    const float* x, const float* weight, const float* bias, float* y, u32 envs, u32 batch, u32 n_in,
    u32 n_out, int has_bias) {
    FOR_EACH(t, (u64)envs * batch * n_out) {
        u64 i = t / n_out;
        u32 o = (u32)(t % n_out), e = (u32)(i / batch);
        const float* xr = x + i * n_in;
        const float* wr = weight + ((u64)e * n_out + o) * n_in;
        float s = 0.0f;
        for (u32 j = 0; j < n_in; ++j) s += xr[j] * wr[j];
        y[t] = s + (has_bias ? bias[(u64)e * n_out + o] : 0.0f);
    }
}

// dx[e, b, j] = Σ_o dy[e, b, o]·W[e, o, j], over o in order (linear_backward_input).
extern "C" __global__ void linear_backward_input_f32(
    const float* dy, const float* weight, float* dx, u32 envs, u32 batch, u32 n_in, u32 n_out) {
    FOR_EACH(t, (u64)envs * batch * n_in) {
        u64 i = t / n_in;
        u32 j = (u32)(t % n_in), e = (u32)(i / batch);
        float s = 0.0f;
        for (u32 o = 0; o < n_out; ++o) s += dy[i * n_out + o] * weight[((u64)e * n_out + o) * n_in + j];
        dx[t] = s;
    }
}

// dW[e, o, j] = Σ_b dy[e, b, o]·x[e, b, j] over b in order; dbias[e, o] = Σ_b dy[e, b, o]
// (linear_backward_params). One thread per weight element; the threads with j == 0 also write the bias
// gradient (has_bias != 0).
extern "C" __global__ void linear_backward_params_f32(
    const float* x, const float* dy, float* grad_weight, float* grad_bias, u32 envs, u32 batch, u32 n_in,
    u32 n_out, int has_bias) {
    FOR_EACH(t, (u64)envs * n_out * n_in) {
        u64 row = t / n_in;
        u32 j = (u32)(t % n_in), e = (u32)(row / n_out), o = (u32)(row % n_out);
        float s = 0.0f, sb = 0.0f;
        for (u32 b = 0; b < batch; ++b) {
            u64 i = (u64)e * batch + b;
            float g = dy[i * n_out + o];
            s += g * x[i * n_in + j];
            sb += g;
        }
        grad_weight[t] = s;
        if (has_bias && j == 0) grad_bias[row] = sb;
    }
}

// Per-env mean cross-entropy and, when grad != 0, dlogits = (softmax − onehot)/B. One block of
// REDUCE_THREADS per env (per_env_block): each thread one sample at a time — its term m + log Σ exp(z −
// m) − z[label] into shared memory and its gradient row — and thread 0 adds the terms in sample order,
// as softmax_cross_entropy sums them (the same bits as one thread per env walking the samples, which
// was: a chain of 512 dependent loads, exp and log per env, 0.6 ms a W16 training batch in ncu).
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS) softmax_cross_entropy_f32(
    const float* logits, const u8* labels, float* loss, float* grad_logits, u32 envs, u32 batch,
    u32 classes, int grad) {
    __shared__ float terms[REDUCE_THREADS];
    float inv_batch = 1.0f / (float)(batch > 0 ? batch : 1);
    u32 e = blockIdx.x;
    float total = 0.0f;
    for (u32 b0 = 0; b0 < batch; b0 += REDUCE_THREADS) {
        u32 b = b0 + threadIdx.x;
        if (b < batch) {
            u64 i = (u64)e * batch + b;
            const float* z = logits + i * classes;
            float m = z[0];
            for (u32 k = 1; k < classes; ++k) m = fmaxf(m, z[k]);
            float sum = 0.0f;
            for (u32 k = 0; k < classes; ++k) sum += expf(z[k] - m);
            terms[threadIdx.x] = m + logf(sum) - z[labels[i]];
            if (grad) {
                float scale = inv_batch / sum;
                float* g = grad_logits + i * classes;
                for (u32 k = 0; k < classes; ++k) g[k] = expf(z[k] - m) * scale;
                g[labels[i]] -= inv_batch;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (u32 j = 0; j < REDUCE_THREADS && b0 + j < batch; ++j) total += terms[j];
        __syncthreads();  // the terms are read before the next samples overwrite them
    }
    if (threadIdx.x == 0) loss[e] = total * inv_batch;
}

// Per-env count of samples whose first largest logit is the label (ops::loss::count_correct). One
// block of REDUCE_THREADS per env (per_env_block), each thread counting every REDUCE_THREADS-th
// sample, the counts added by block_sum (integers, exact in double).
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS) count_correct_f32(
    const float* logits, const u8* labels, u32* correct, u32 envs, u32 batch, u32 classes) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 e = blockIdx.x, count = 0;
    for (u32 b = threadIdx.x; b < batch; b += REDUCE_THREADS) {
        u64 i = (u64)e * batch + b;
        const float* z = logits + i * classes;
        u32 best = 0;
        for (u32 k = 1; k < classes; ++k)
            if (z[k] > z[best]) best = k;
        if (best == labels[i]) ++count;
    }
    double total = block_sum((double)count, lanes);
    if (threadIdx.x == 0) correct[e] = (u32)total;
}
