// 2x2 max pooling (stride 2, floor mode) and global average pooling over [E, B, C, H, W]: the CUDA twins
// of kernels/src/ops/pool.rs. `images` = E*B*C planes.

// PoolIndex, pool_index and pool_window (a window's plane and place) are in common.cuh, shared with the
// slots' blend + pool (seeds.cu).

// y[p, oy, ox] = max of the 2x2 window; argmax = its row-major index 0..4. Strictly greater replaces, so
// ties keep the first maximum; a NaN wins and stays (PyTorch propagates NaN through max-pool).
extern "C" __global__ void max_pool2x2_forward_f32(
    const float* x, float* y, u8* argmax, u64 planes, u32 h, u32 w) {
    PoolIndex ix = pool_index(planes, h, w);
    FOR_EACH(o, planes * ix.windows.d) {
        u64 p;
        u32 oy, ox;
        pool_window(o, ix, p, oy, ox);
        u32 k;
        y[o] = max_pool_at(x, p, oy, ox, h, w, &k);
        argmax[o] = (u8)k;
    }
}

// Routes each output gradient to its window's winner; every other input element gets 0. Even planes: one
// thread per window writes its four elements (the winner's gradient and three zeros: routed_gradient's
// values); odd planes: one thread per input element (the dropped last row or column gets 0). No two
// threads write the same place.
extern "C" __global__ void max_pool2x2_backward_f32(
    const float* dy, const u8* argmax, float* dx, u64 planes, u32 h, u32 w) {
    PoolIndex ix = pool_index(planes, h, w);
    if (h % 2 == 0 && w % 2 == 0) {
        FOR_EACH(o, planes * ix.windows.d) {
            u64 p;
            u32 oy, ox;
            pool_window(o, ix, p, oy, ox);
            float g = dy[o];
            u32 k = argmax[o];
            float* top = dx + (p * h + 2 * oy) * w + 2 * ox;
            top[0] = k == 0 ? g : 0.0f;
            top[1] = k == 1 ? g : 0.0f;
            top[w] = k == 2 ? g : 0.0f;
            top[w + 1] = k == 3 ? g : 0.0f;
        }
        return;
    }
    FOR_EACH(i, planes * h * w) { dx[i] = routed_gradient(dy, argmax, i, h, w); }
}

// y[p] = mean of plane p (h*w values). One warp per plane; the lanes sum strided elements in double and
// combine in a fixed tree, so the result does not depend on the grid.
extern "C" __global__ void global_avg_pool_forward_f32(const float* x, float* y, u64 planes, u32 plane_len) {
    u32 lane = threadIdx.x % 32;
    u64 warps = ((u64)gridDim.x * blockDim.x) / 32;
    for (u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; p < planes; p += warps) {
        const float* src = x + p * plane_len;
        double s = 0.0;
        for (u32 j = lane; j < plane_len; j += 32) s += (double)src[j];
        for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0) y[p] = (float)(s / (double)plane_len);
    }
}

// dx[p, :] = dy[p] / (h*w) (a division, as the CPU twin does: the same bits); with accumulate != 0 it
// adds into dx (the input also feeds another path). Four of a thread's elements loaded at a time
// (for_each_loads_ahead).
extern "C" __global__ void PASS_BOUNDS global_avg_pool_backward_f32(
    const float* dy, float* dx, u64 planes, u32 plane_len, int accumulate) {
    bool fits = FITS_U32(planes * plane_len);
    FastDiv f[1];
    block_fast_divs<1>({plane_len}, f);
    auto value = [&](u64 i) {
        float g = dy[fits ? (u64)fdiv((u32)i, f[0]) : i / plane_len] / (float)plane_len;
        return accumulate ? dx[i] + g : g;
    };
    for_each_loads_ahead<float>(planes * plane_len, value, [&](u64 i, float v) { dx[i] = v; });
}
