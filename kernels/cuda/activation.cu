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

// out = a + b (the residual add).
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) { out[i] = a[i] + b[i]; }
}

// out = a + relu(b): a seed's residual add of its ReLU'd branch (y = x + relu(GN(…))) in one pass,
// relu_forward_f32 then add_f32 without writing and reading the ReLU's output; the same bits (NaN
// passes the ReLU, as there).
extern "C" __global__ void add_relu_f32(const float* a, const float* b, float* out, u64 n) {
    FOR_EACH(i, n) {
        float v = b[i];
        out[i] = a[i] + (!(v <= 0.0f) ? v : 0.0f);
    }
}
