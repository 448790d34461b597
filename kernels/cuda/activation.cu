// Element-wise activations: the CUDA twins of kernels/src/ops/activation.rs.

// y = max(x, 0); NaN passes through (`!(v <= 0)` is true for NaN), as relu_forward does.
extern "C" __global__ void relu_forward_f32(const float* x, float* y, u64 n) {
    FOR_EACH(i, n) {
        float v = x[i];
        y[i] = !(v <= 0.0f) ? v : 0.0f;
    }
}

// dx = dy * [y > 0], from the forward output y (subgradient 0 at 0), as relu_backward does.
extern "C" __global__ void relu_backward_f32(const float* y, const float* dy, float* dx, u64 n) {
    FOR_EACH(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}
