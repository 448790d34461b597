// 2-D convolution over envs, stride 1, zero padding, channel groups: the CUDA twins of
// kernels/src/ops/conv.rs (conv2d_forward, conv2d_backward_input[_accumulate], conv2d_backward_weight).
// Layouts as there: input [E, B, c_in, h, w], weight [E, c_out, c_in/groups, k, k], output
// [E, B, c_out, h_out, w_out] with h_out = h + 2·pad − k + 1.
//
// Each kernel does the CPU's f32 operations in the CPU's order, so the results agree bit for bit:
// * an output of a correlation is one fused multiply-add chain from 0 over (source channel of its group,
//   tap ky·k + kx) in that order, taps that fall in the zero padding included (fmaf(w, 0, acc), as the
//   CPU reads its zero-padded planes);
// * the input gradient is the same correlation of the output gradient with the weight transposed per
//   group and flipped in space, padding k − 1 − pad; the accumulating form adds the finished sum to dx;
// * a weight-gradient element is eight lane partial sums, position q of the padded-width layout
//   (row width w + 2·pad, output rows h_out, rounded up to a multiple of 16 positions, zero output
//   gradient on the junk positions) going to lane q % 8, images in order, then the CPU's tree sum
//   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
// One thread per output element (correlations) or per weight element (weight gradient): these are the
// parity twins; the fast forms (tiles in shared memory, tensor cores) are checked against them.

struct ConvShape {
    u32 envs, batch, c_in, c_out, h, w, k, pad, groups;
};

__device__ __forceinline__ u32 conv_h_out(const ConvShape& s) { return s.h + 2 * s.pad + 1 - s.k; }
__device__ __forceinline__ u32 conv_w_out(const ConvShape& s) { return s.w + 2 * s.pad + 1 - s.k; }

// The value at (y, x) of a src_h × src_w plane read with `pad` zeros around it (y, x in padded
// coordinates, which may also run past the bottom/right padding into the CPU's zero slack).
__device__ __forceinline__ float padded_at(const float* plane, u32 src_h, u32 src_w, u32 pad, u32 y, u32 x) {
    if (y < pad || x < pad) return 0.0f;
    u32 iy = y - pad, ix = x - pad;
    return (iy < src_h && ix < src_w) ? plane[(u64)iy * src_w + ix] : 0.0f;
}

// y[e, b, o, yo, xo] = Σ_{s in o's group} Σ_{ky, kx} W[e, o, s, ky, kx] · x_padded[e, b, s, yo + ky, xo + kx].
extern "C" __global__ void conv2d_forward_f32(
    const float* x, const float* weight, float* y, u32 envs, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w,
    u32 k, u32 pad, u32 groups) {
    ConvShape s = {envs, batch, c_in, c_out, h, w, k, pad, groups};
    u32 ho = conv_h_out(s), wo = conv_w_out(s);
    u32 cin_g = c_in / groups, cout_g = c_out / groups, kk = k * k;
    FOR_EACH(t, (u64)envs * batch * c_out * ho * wo) {
        u32 xo = (u32)(t % wo), yo = (u32)(t / wo % ho), o = (u32)(t / ((u64)wo * ho) % c_out);
        u64 image = t / ((u64)wo * ho * c_out);
        u32 e = (u32)(image / batch), g = o / cout_g;
        const float* w_o = weight + ((u64)e * c_out + o) * cin_g * kk;
        float acc = 0.0f;
        for (u32 sl = 0; sl < cin_g; ++sl) {
            const float* plane = x + (image * c_in + g * cin_g + sl) * h * w;
            for (u32 ky = 0; ky < k; ++ky)
                for (u32 kx = 0; kx < k; ++kx)
                    acc = fmaf(w_o[sl * kk + ky * k + kx], padded_at(plane, h, w, pad, yo + ky, xo + kx), acc);
        }
        y[t] = acc;
    }
}

// dx[e, b, c, yi, xi] (= or +=) Σ_{o in c's group} Σ_{ky, kx} W[e, o, c, k−1−ky, k−1−kx] ·
// dy_padded[e, b, o, yi + ky, xi + kx], dy padded by k − 1 − pad (accumulate != 0: added to dx).
extern "C" __global__ void conv2d_backward_input_f32(
    const float* dy, const float* weight, float* dx, u32 envs, u32 batch, u32 c_in, u32 c_out, u32 h,
    u32 w, u32 k, u32 pad, u32 groups, int accumulate) {
    ConvShape s = {envs, batch, c_in, c_out, h, w, k, pad, groups};
    u32 ho = conv_h_out(s), wo = conv_w_out(s), pad_t = k - 1 - pad;
    u32 cin_g = c_in / groups, cout_g = c_out / groups, kk = k * k;
    FOR_EACH(t, (u64)envs * batch * c_in * h * w) {
        u32 xi = (u32)(t % w), yi = (u32)(t / w % h), c = (u32)(t / ((u64)w * h) % c_in);
        u64 image = t / ((u64)w * h * c_in);
        u32 e = (u32)(image / batch), g = c / cin_g, cl = c % cin_g;
        float acc = 0.0f;
        for (u32 ol = 0; ol < cout_g; ++ol) {
            u32 o = g * cout_g + ol;
            const float* plane = dy + (image * c_out + o) * ho * wo;
            const float* w_oc = weight + (((u64)e * c_out + o) * cin_g + cl) * kk;
            for (u32 ky = 0; ky < k; ++ky)
                for (u32 kx = 0; kx < k; ++kx)
                    acc = fmaf(w_oc[kk - 1 - (ky * k + kx)], padded_at(plane, ho, wo, pad_t, yi + ky, xi + kx), acc);
        }
        dx[t] = accumulate ? dx[t] + acc : acc;
    }
}

// dW[e, o, s, ky, kx] = Σ_b Σ_q dy_padded[e, b, o][q] · x_padded[e, b, g·cin_g + s][q + ky·wp + kx], in
// the lanes and order described at the top of this file.
extern "C" __global__ void conv2d_backward_weight_f32(
    const float* x, const float* dy, float* grad_weight, u32 envs, u32 batch, u32 c_in, u32 c_out, u32 h,
    u32 w, u32 k, u32 pad, u32 groups) {
    ConvShape s = {envs, batch, c_in, c_out, h, w, k, pad, groups};
    u32 ho = conv_h_out(s), wo = conv_w_out(s), wp = w + 2 * pad;
    u32 cin_g = c_in / groups, cout_g = c_out / groups, kk = k * k;
    // Positions computed per plane, as the CPU's Geometry: ho·wp rounded up to whole 16-wide tiles.
    u32 q_round = (ho * wp + 15) / 16 * 16;
    FOR_EACH(t, (u64)envs * c_out * cin_g * kk) {
        u32 tap = (u32)(t % kk), sl = (u32)(t / kk % cin_g), o = (u32)(t / ((u64)kk * cin_g) % c_out);
        u32 e = (u32)(t / ((u64)kk * cin_g * c_out)), g = o / cout_g;
        u32 ky = tap / k, kx = tap % k;
        float lanes[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (u32 b = 0; b < batch; ++b) {
            u64 image = (u64)e * batch + b;
            const float* dy_plane = dy + (image * c_out + o) * ho * wo;
            const float* x_plane = x + (image * c_in + g * cin_g + sl) * h * w;
            for (u32 q = 0; q < q_round; ++q) {
                u32 qy = q / wp, qx = q % wp;
                float g_q = (qy < ho && qx < wo) ? dy_plane[(u64)qy * wo + qx] : 0.0f;
                float x_q = padded_at(x_plane, h, w, pad, qy + ky, qx + kx);
                // The padded-width layout wraps: position q + kx may be the next padded row's start.
                if (qx + kx >= wp) x_q = padded_at(x_plane, h, w, pad, qy + ky + 1, qx + kx - wp);
                lanes[q % 8] = fmaf(g_q, x_q, lanes[q % 8]);
            }
        }
        float a0 = lanes[0] + lanes[4], a1 = lanes[1] + lanes[5], a2 = lanes[2] + lanes[6], a3 = lanes[3] + lanes[7];
        grad_weight[t] = (a0 + a2) + (a1 + a3);
    }
}

// ---- The GEMM form (the host's convolutions at speed): im2col, one cuBLAS GEMM per stage over all
// envs (strided batched), and the layout changes around it. Checked as a whole against the CPU's
// ops::conv (its twin), to a tolerance: cuBLAS sums in its own order.
//
// col[e][j][b·P + q], j = (s·k + ky)·k + kx over the input channels s and taps, q = yo·w_out + xo over
// the output positions: x_padded[e, b, s, yo + ky, xo + kx] (0 in the padding). Row-major per env, a
// (c_in·k·k) × (B·P) matrix.
__device__ __forceinline__ float im2col_value(
    const float* x, u64 i, u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad, u32 wo, u64 positions, u64 n,
    u64 rows) {
    u64 e = i / (rows * n), r = i / n % rows, c = i % n;
    u64 b = c / positions, q = c % positions;
    u32 yo = (u32)(q / wo), xo = (u32)(q % wo);
    u32 kx = (u32)(r % k), ky = (u32)(r / k % k), s = (u32)(r / ((u64)k * k));
    const float* plane = x + ((e * batch + b) * c_in + s) * (u64)h * w;
    return padded_at(plane, h, w, pad, yo + ky, xo + kx);
}

// im2col_value's index math in 32 bits (FastDiv), for launches whose indices fit.
struct Im2colIndex {
    FastDiv n, rows, positions, wo, kk, k;
    u32 batch, c_in, h, w, pad;
};

__device__ __forceinline__ Im2colIndex im2col_index(u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad) {
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k;
    Im2colIndex ix;
    ix.n = fast_div(batch * ho * wo);
    ix.rows = fast_div(c_in * k * k);
    ix.positions = fast_div(ho * wo);
    ix.wo = fast_div(wo);
    ix.kk = fast_div(k * k);
    ix.k = fast_div(k);
    ix.batch = batch, ix.c_in = c_in, ix.h = h, ix.w = w, ix.pad = pad;
    return ix;
}

__device__ __forceinline__ float im2col_value32(const float* x, u32 i, const Im2colIndex& ix) {
    u32 row = fdiv(i, ix.n), c = i - row * ix.n.d;
    u32 e = fdiv(row, ix.rows), r = row - e * ix.rows.d;
    u32 b = fdiv(c, ix.positions), q = c - b * ix.positions.d;
    u32 yo = fdiv(q, ix.wo), xo = q - yo * ix.wo.d;
    u32 s = fdiv(r, ix.kk), tap = r - s * ix.kk.d;
    u32 ky = fdiv(tap, ix.k), kx = tap - ky * ix.k.d;
    const float* plane = x + (((u64)e * ix.batch + b) * ix.c_in + s) * (u64)ix.h * ix.w;
    return padded_at(plane, ix.h, ix.w, ix.pad, yo + ky, xo + kx);
}

// ---- bf16 (`--precision bf16`): the GEMM's inputs stored as bfloat16 bit patterns (u16), rounded to
// nearest, ties to even; cuBLAS sums their products in f32. CPU twin: ops::precision::bf16_bits.
typedef unsigned short u16;

__device__ __forceinline__ u16 bf16_bits(float x) {
    u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x0040u);  // NaN stays NaN (quiet)
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// The column matrix stored as f32, or as bf16 bits for bf16 multiplies.
__device__ __forceinline__ void store_value(float* dst, u64 i, float v) { dst[i] = v; }
__device__ __forceinline__ void store_value(u16* dst, u64 i, float v) { dst[i] = bf16_bits(v); }

template <typename T>
__device__ __forceinline__ void im2col(
    const float* x, T* col, u32 envs, u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad) {
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k;
    u64 positions = (u64)ho * wo, n = (u64)batch * positions, rows = (u64)c_in * k * k;
    if (FITS_U32(envs * rows * n)) {
        Im2colIndex ix = im2col_index(batch, c_in, h, w, k, pad);
        FOR_EACH(i, (u64)envs * rows * n) store_value(col, i, im2col_value32(x, (u32)i, ix));
        return;
    }
    FOR_EACH(i, (u64)envs * rows * n) {
        store_value(col, i, im2col_value(x, i, batch, c_in, h, w, k, pad, wo, positions, n, rows));
    }
}

extern "C" __global__ void __launch_bounds__(1024) im2col_f32(
    const float* x, float* col, u32 envs, u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad) {
    im2col(x, col, envs, batch, c_in, h, w, k, pad);
}

// im2col_f32 with the column matrix in bf16.
extern "C" __global__ void __launch_bounds__(1024) im2col_bf16(
    const float* x, u16* col, u32 envs, u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad) {
    im2col(x, col, envs, batch, c_in, h, w, k, pad);
}

// dst[i] = bf16(src[i]): the weights, each time a GEMM reads them (the optimizer keeps them in f32).
extern "C" __global__ void round_to_bf16(const float* src, u16* dst, u64 n) {
    FOR_EACH(i, n) { dst[i] = bf16_bits(src[i]); }
}

// Where dst[i] of swap_middle_axes (dst [E, B, A, P] from src [E, A, B, P]) reads src, in 32 bits.
struct SwapIndex {
    FastDiv plane, a, b;
};

__device__ __forceinline__ SwapIndex swap_index(u32 a, u32 b, u32 plane) {
    SwapIndex ix;
    ix.plane = fast_div(plane), ix.a = fast_div(a), ix.b = fast_div(b);
    return ix;
}

__device__ __forceinline__ u32 swap_source32(u32 i, const SwapIndex& ix) {
    u32 rest = fdiv(i, ix.plane), p = i - rest * ix.plane.d;
    u32 outer = fdiv(rest, ix.a), ia = rest - outer * ix.a.d;
    u32 e = fdiv(outer, ix.b), ib = outer - e * ix.b.d;
    return ((e * ix.a.d + ia) * ix.b.d + ib) * ix.plane.d + p;
}

// dst[e][b][a][p] = src[e][a][b][p], stored as f32 or bf16 bits.
template <typename T>
__device__ __forceinline__ void swap_middle_axes(const float* src, T* dst, u32 envs, u32 a, u32 b, u32 plane) {
    if (FITS_U32((u64)envs * a * b * plane)) {
        SwapIndex ix = swap_index(a, b, plane);
        FOR_EACH(i, (u64)envs * a * b * plane) store_value(dst, i, src[swap_source32((u32)i, ix)]);
        return;
    }
    FOR_EACH(i, (u64)envs * a * b * plane) {
        u64 p = i % plane, ia = i / plane % a, ib = i / ((u64)plane * a) % b, e = i / ((u64)plane * a * b);
        store_value(dst, i, src[((e * a + ia) * b + ib) * plane + p]);
    }
}

// swap_middle_axes_f32 into bf16: the output gradient into the GEMM's channel-major rows.
extern "C" __global__ void __launch_bounds__(1024) swap_middle_axes_to_bf16(
    const float* src, u16* dst, u32 envs, u32 a, u32 b, u32 plane) {
    swap_middle_axes(src, dst, envs, a, b, plane);
}

// The input gradient from the column gradient dcol (same layout as col): dx[e, b, s, y, x] (= or +=)
// Σ_{ky, kx} dcol[e][(s·k + ky)·k + kx][b·P + (y + pad − ky)·w_out + (x + pad − kx)] over the taps whose
// output position exists, in tap order. A gather: no two threads write one place.
extern "C" __global__ void __launch_bounds__(1024) col2im_f32(
    const float* dcol, float* dx, u32 envs, u32 batch, u32 c_in, u32 h, u32 w, u32 k, u32 pad,
    int accumulate) {
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k;
    u64 positions = (u64)ho * wo, n = (u64)batch * positions, rows = (u64)c_in * k * k;
    bool fits = FITS_U32((u64)envs * batch * c_in * h * w);
    FastDiv fw = fast_div(w), fh = fast_div(h), fc = fast_div(c_in), fb = fast_div(batch);
    FOR_EACH(i, (u64)envs * batch * c_in * h * w) {
        u32 x, y, s;
        u64 e, b;
        if (fits) {  // the same split in 32 bits
            u32 i32 = (u32)i, row = fdiv(i32, fw), plane = fdiv(row, fh), image = fdiv(plane, fc);
            x = i32 - row * w, y = row - plane * h, s = plane - image * c_in;
            e = fdiv(image, fb), b = image - (u32)e * batch;
        } else {
            x = (u32)(i % w), y = (u32)(i / w % h), s = (u32)(i / ((u64)w * h) % c_in);
            u64 image = i / ((u64)w * h * c_in);
            e = image / batch, b = image % batch;
        }
        const float* base = dcol + e * rows * n + b * positions;
        float acc = 0.0f;
        for (u32 ky = 0; ky < k; ++ky) {
            int yo = (int)y + (int)pad - (int)ky;
            if (yo < 0 || yo >= (int)ho) continue;
            for (u32 kx = 0; kx < k; ++kx) {
                int xo = (int)x + (int)pad - (int)kx;
                if (xo < 0 || xo >= (int)wo) continue;
                acc += base[((u64)s * k * k + ky * k + kx) * n + (u64)yo * wo + xo];
            }
        }
        dx[i] = accumulate ? dx[i] + acc : acc;
    }
}

// dst[e][b][a][p] = src[e][a][b][p] for src [E, A, B, P]: between the GEMM's channel-major rows
// [E, C, B·P] and the network's image-major [E, B, C, P] (call with A and B swapped to go back).
extern "C" __global__ void __launch_bounds__(1024) swap_middle_axes_f32(
    const float* src, float* dst, u32 envs, u32 a, u32 b, u32 plane) {
    swap_middle_axes(src, dst, envs, a, b, plane);
}

// The depthwise (groups = channels) weight gradient at speed: one block of REDUCE_THREADS per (env,
// channel, tap), each thread summing a strided share of the B·h_out·w_out products dy·x_padded in
// double, then block_sum. The twin (conv2d_backward_weight_f32) walks every position in one thread per
// weight; this one is checked against ops::conv to a tolerance.
extern "C" __global__ void depthwise_backward_weight_fast_f32(
    const float* x, const float* dy, float* grad_weight, u32 envs, u32 batch, u32 channels, u32 h, u32 w,
    u32 k, u32 pad) {
    __shared__ double lanes[REDUCE_THREADS];
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k, kk = k * k;
    u32 t = blockIdx.x, tap = t % kk, c = t / kk % channels, e = t / (kk * channels);
    u32 ky = tap / k, kx = tap % k;
    u64 positions = (u64)ho * wo, count = (u64)batch * positions;
    double sum = 0.0;
    for (u64 j = threadIdx.x; j < count; j += REDUCE_THREADS) {
        u64 b = j / positions, q = j % positions;
        u32 yo = (u32)(q / wo), xo = (u32)(q % wo);
        u64 image = (u64)e * batch + b;
        const float* plane = x + (image * channels + c) * (u64)h * w;
        float g = dy[(image * channels + c) * positions + q];
        sum += (double)(g * padded_at(plane, h, w, pad, yo + ky, xo + kx));
    }
    double total = block_sum(sum, lanes);
    if (threadIdx.x == 0) grad_weight[t] = (float)total;
}

// The parity row for FastDiv: q[i] = n[i] / d[i] through fast_div, checked on the device against the
// CPU's integer division.
extern "C" __global__ void fast_div_u32(const u32* n, const u32* d, u32* q, u64 count) {
    FOR_EACH(i, count) q[i] = fdiv(n[i], fast_div(d[i]));
}

// ---- Implicit GEMM (f32 multiplies, the default precision): the convolution as per env
// Y (c_out × B·P) = W (c_out × K) · col (K × B·P), K = c_in·k·k, with the column matrix never written:
// each block loads its 8 × 128 slice of col straight from x (zero in the padding) into shared memory.
// im2col wrote and the GEMM read K·B·P values, nine per input value for a 3×3 kernel: at the bandwidth
// and still 40 % of a seeded step (ncu, H100). The output lands in [E, B, c_out, P] directly (no swap).
//
// Every output is one fmaf chain from 0 over j = s·k·k + ky·k + kx in order, the padding taps included
// (fmaf(w, 0, acc)), and j ≥ K adding fmaf(0, 0, acc) (acc is never −0: it starts at +0): the same f32
// operations as conv2d_forward_f32 and the CPU's ops::conv, bit for bit.
//
// flip != 0 computes the input gradient instead: x is the output gradient dy ([E, B, c_in, h, w] with
// c_in the forward's c_out), `weight` the forward's [E, c_out, c_in, k, k] read transposed and flipped
// (W[e, s, o, k·k − 1 − tap]), pad the forward's k − 1 − pad: conv2d_backward_input_f32's operations in
// its order (overwriting).
//
// Block: 256 threads, BM output channels × 128 columns, thread (ty, tx) = (t / 32, t % 32) holding
// channels ty·TM .. ty·TM + TM − 1 (TM = BM / 8) of columns 4·tx .. 4·tx + 3, read from shared memory
// as one vector each (the loop is bound by shared-memory loads, not by the multiply-adds).
#define IG_BN 128
#define IG_BK 8
// Depth rows j whose (s·h·w + (ky − pad)·w + (kx − pad), ky − pad, kx − pad) a block tabulates in shared
// memory once, so that loading a column value is two adds, the bounds and the load (no divisions).
// Deeper convolutions (c_in·k·k > 2048) divide per value instead.
#define IG_TABLE 2048

// TM consecutive floats of shared memory (aligned to TM floats) as one load.
template <int TM>
__device__ __forceinline__ void load_row(const float* src, float* dst) {
    if (TM == 4) {
        float4 v = *reinterpret_cast<const float4*>(src);
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    } else if (TM == 2) {
        float2 v = *reinterpret_cast<const float2*>(src);
        dst[0] = v.x, dst[1] = v.y;
    } else {
        for (int i = 0; i < TM; ++i) dst[i] = src[i];
    }
}

template <int BM>
__device__ __forceinline__ void conv2d_implicit(
    const float* x, const float* weight, float* y, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 k, u32 pad,
    int flip) {
    constexpr int TM = BM / 8;
    __shared__ __align__(16) float a_tile[IG_BK][BM];
    __shared__ __align__(16) float b_tile[IG_BK][IG_BN];
    u32 t = threadIdx.x, tx = t % 32, ty = t / 32;
    u32 e = blockIdx.z, m0 = blockIdx.y * BM;
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k, positions = ho * wo, columns = batch * positions;
    u32 kk = k * k, depth = c_in * kk;
    u64 plane = (u64)h * w;
    FastDiv f_positions = fast_div(positions), f_wo = fast_div(wo), f_kk = fast_div(kk), f_k = fast_div(k);

    // The column this thread loads into b_tile (the same for every K step): its image and position.
    u32 n_load = blockIdx.x * IG_BN + t % IG_BN;
    bool load_ok = n_load < columns;
    u32 b_load = load_ok ? fdiv(n_load, f_positions) : 0, q_load = n_load - b_load * positions;
    u32 yo_load = fdiv(q_load, f_wo), xo_load = q_load - yo_load * wo;
    const float* x_image = x + ((u64)e * batch + b_load) * c_in * plane;

    // Row j's offset from the column's own position and its (ky − pad, kx − pad) packed as (dy << 16) |
    // (dx & 0xffff); rows past K get a dy that fails every bound.
    __shared__ int tap_offset[IG_TABLE];
    __shared__ int tap_shift[IG_TABLE];
    u32 padded_depth = (depth + IG_BK - 1) / IG_BK * IG_BK;
    bool tabled = padded_depth <= IG_TABLE;
    if (tabled) {
        for (u32 j = t; j < padded_depth; j += 256) {
            int dy = 1 << 14, dx = 0, offset = 0;
            if (j < depth) {
                u32 s = j / kk, tap = j % kk;
                dy = (int)(tap / k) - (int)pad, dx = (int)(tap % k) - (int)pad;
                offset = (int)(s * plane) + dy * (int)w + dx;
            }
            tap_offset[j] = offset;
            tap_shift[j] = (int)(((u32)dy << 16) | ((u32)dx & 0xffffu));
        }
        __syncthreads();
    }
    int base_load = (int)(yo_load * w + xo_load);

    float acc[TM][4];
    for (int i = 0; i < TM; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (u32 k0 = 0; k0 < depth; k0 += IG_BK) {
        if (t < BM * IG_BK) {
            u32 m = t / IG_BK, jj = t % IG_BK, o = m0 + m, j = k0 + jj;
            float v = 0.0f;
            if (o < c_out && j < depth) {
                if (flip) {
                    u32 s = fdiv(j, f_kk), tap = j - s * kk;
                    v = weight[(((u64)e * c_in + s) * c_out + o) * kk + (kk - 1 - tap)];
                } else {
                    v = weight[((u64)e * c_out + o) * depth + j];
                }
            }
            a_tile[jj][m] = v;
        }
        for (u32 r = t / IG_BN; r < IG_BK; r += 256 / IG_BN) {
            u32 j = k0 + r;
            float v = 0.0f;
            if (tabled) {
                int shift = tap_shift[j], iy = (int)yo_load + (shift >> 16), ix = (int)xo_load + (short)(shift & 0xffff);
                if (load_ok && iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w) v = x_image[base_load + tap_offset[j]];
            } else if (load_ok && j < depth) {
                u32 s = fdiv(j, f_kk), tap = j - s * kk, ky = fdiv(tap, f_k), kx = tap - ky * k;
                int iy = (int)(yo_load + ky) - (int)pad, ix = (int)(xo_load + kx) - (int)pad;
                if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w) v = x_image[s * plane + (u32)iy * w + (u32)ix];
            }
            b_tile[r][t % IG_BN] = v;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < IG_BK; ++r) {
            float a[TM], b[4];
            load_row<TM>(&a_tile[r][ty * TM], a);
            load_row<4>(&b_tile[r][tx * 4], b);
            for (int i = 0; i < TM; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    for (int j = 0; j < 4; ++j) {
        u32 n = blockIdx.x * IG_BN + tx * 4 + j;
        if (n >= columns) continue;
        u32 b = fdiv(n, f_positions), q = n - b * positions;
        float* y_image = y + ((u64)e * batch + b) * c_out * positions + q;
        for (int i = 0; i < TM; ++i) {
            u32 o = m0 + ty * TM + i;
            if (o < c_out) y_image[(u64)o * positions] = acc[i][j];
        }
    }
}

// The three block heights (the host's and seeds' channel counts are 8, 16, 32 and more): grid
// (⌈B·P / 128⌉, ⌈c_out / BM⌉, envs), 256 threads.
#define IG_KERNEL(BM)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) conv2d_implicit_m##BM##_f32(                              \
        const float* x, const float* weight, float* y, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 k,      \
        u32 pad, int flip) {                                                                                    \
        conv2d_implicit<BM>(x, weight, y, batch, c_in, c_out, h, w, k, pad, flip);                             \
    }
IG_KERNEL(8)
IG_KERNEL(16)
IG_KERNEL(32)

// ---- The 3×3 convolutions (padding 1) direct: the forward, and with flip != 0 the input gradient (the
// same operation over the transposed, flipped weights, as conv2d_implicit's flip). The host's and seeds'
// layers have 3 to 32 input and 8 to 32 output channels on planes of 32×32 down to 4×4: as a GEMM that
// is a short, thin product whose column matrix costs more to gather (nine taps, each with its bounds)
// than to multiply. Here a block stages DC_CHUNK input channels of its images, zero-padded, in shared
// memory once, and every tap reads them there.
//
// Block: 256 threads over `per_block` = 256 / (h·w/4) images of one env (h·w ≤ 1024, w a multiple of 4),
// thread t holding output channels o0 .. o0 + 7 at four adjacent positions (row q / (w/4), columns
// 4·(q % (w/4)) ..+3) of image t / (h·w/4); threads past per_block·h·w/4 only load. Grid (⌈B /
// per_block⌉, ⌈c_out / 8⌉, envs).
//
// Each output is one fmaf chain from 0 over j = s·9 + ky·3 + kx in order, the padding taps included
// (fmaf(w, 0, acc)): conv2d_forward_f32's (and conv2d_backward_input_f32's) operations, bit for bit.
#define DC_CHUNK 4
#define DC_OUT 8
// The most staged values: DC_CHUNK channels of per_block padded planes, largest at 4×4 planes (64 images
// of 6×6) and ≤ 9216 floats for every plane the launcher accepts (h, w ≥ 4).
#define DC_TILE 9216

// Where a staging's padded planes lie in the tile: a padded row `row` floats long (≥ w + 2), a padded
// plane `plane` floats (≥ (h + 2)·row), an image's planes `image` apart; cell (image i, channel c,
// padded row yy, padded column xx) at i·image + c·plane + yy·row + xx. The general kernels pack them
// (tile_strides: row w + 2, plane (h + 2)(w + 2), image `stride` planes); the square tensor-core
// kernels space them (square_strides) so that their K loops' shared loads are free of bank conflicts.
struct TileStrides {
    u32 row, plane, image;
};

__device__ __forceinline__ TileStrides tile_strides(u32 h, u32 w, u32 stride) {
    return TileStrides{w + 2, (h + 2) * (w + 2), stride * (h + 2) * (w + 2)};
}

// The square tensor-core kernels' strides for W × W planes, forward (and input gradient) or weight
// gradient. A K loop's shared load takes a warp's 32 lanes to 4 × 8 cells: forward, 8 pixels side by
// side (lane g) at 4 (channel, tap) rows (lane t); weight gradient, 8 rows at 4 pixel pairs. Packed,
// two lanes' cells a multiple of 32 floats apart fall in one bank and the load takes two passes or more
// (rows of 34 floats at W = 32: a tap row below lies 2 banks on, onto the next pixels' cells). The
// kernel emulator counts them (the passes of the kernels' own loads, `lds`): packed, 1.7 – 1.8 a load
// in the W = 32 forwards and input gradients and 2.2 – 2.7 in their weight gradients, 1.2 – 1.3 and 2.0
// at W = 16, 1.0 and 1.7 at W = 8. These rows, planes and images, found by counting every load of both
// kernels over chunks of 1 to 4 channels, take one pass a load (up to 1.03 in a forward's last chunk of
// three channels, whose padding rows read the zeroed stretch), at the cost of more tile: 1 132 floats at
// W = 32, 960 at W = 16, and 1 728 in W = 8's weight gradient (48 976 bytes of shared memory a block,
// within the 49 152 a static allocation may have); W = 8's forward is conflict-free packed, and has no
// room for more (48 112 bytes at n16). TC_PACKED_TILES (`ESPER_CUDA_TC_SPACED=0`) packs them all again,
// to measure it: the same values in the same order, so the same sums, bit for bit.
template <int W, bool WGRAD>
__device__ constexpr TileStrides square_strides() {
#ifdef TC_PACKED_TILES
    constexpr bool SPACED = false;
#else
    constexpr bool SPACED = true;
#endif
    constexpr u32 PACKED_ROW = W + 2, PACKED_PLANE = (W + 2) * (W + 2);
    return SPACED && W == 32            ? TileStrides{42, 1439, DC_CHUNK * 1439}
           : SPACED && W == 16          ? TileStrides{21, 383, 1536}
           : SPACED && W == 8 && WGRAD  ? TileStrides{10, 127, 508}
                                        : TileStrides{PACKED_ROW, PACKED_PLANE, DC_CHUNK * PACKED_PLANE};
}

// A tensor-core kernel's staging strides: square_strides for W × W planes (each row, plane and image
// holding its padded cells), else packed (DC_CHUNK planes an image).
template <int W, bool WGRAD>
__device__ __forceinline__ TileStrides tc_strides(u32 h, u32 w) {
    constexpr TileStrides TS = square_strides<W, WGRAD>();
    static_assert(W == 0 || (TS.row >= W + 2 && TS.plane >= (W + 2) * TS.row && TS.image >= DC_CHUNK * TS.plane),
                  "a square tile's rows, planes and images hold their padded cells");
    return W > 0 ? TS : tile_strides(h, w, DC_CHUNK);
}

// ---- TF32 on the tensor cores (`--precision tf32`; the kernel emulator brings its own versions of these
// two). tf32_round: x rounded to TF32 (10 mantissa bits; to nearest, ties away from zero: `cvt.rna`),
// kept in an f32 whose low 13 bits are zero. CPU twin: ops::precision::round_to_tf32.
// Both need sm_80 or later; below that (no build compiles for it today) they trap rather than make the
// module fail to load, which would take the file's f32 kernels down with them.
#ifndef ESPER_KERNEL_EMULATOR
__device__ __forceinline__ float tf32_round(float x) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
#else
    asm volatile("trap;");
    return x;
#endif
}

// d += A · B for one warp: A 16 × 8 (row-major), B 8 × 8 (column-major), d 16 × 8, f32 sums of TF32
// products (mma.sync.aligned.m16n8k8). Lane l = 4·g + t holds a = (A[g][t], A[g + 8][t], A[g][t + 4],
// A[g + 8][t + 4]), b = (B[t][g], B[t + 4][g]) and d = (D[g][2t], D[g][2t + 1], D[g + 8][2t],
// D[g + 8][2t + 1]) (the PTX ISA's fragment layout for .m16n8k8 with .tf32).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
#if __CUDA_ARCH__ < 800
    asm volatile("trap;");
#else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#endif
}
#endif

// ---- Batch norm's input gradient computed where a staged kernel loads its output gradient. In a host
// block's backward the convolution's output gradient is batch norm's input gradient, an element-wise
// function of batch norm's input x, the gradient that reached the block (the pool's output gradient
// routed through its argmax, or the ReLU's) and per (env, channel) coefficients
// (batch_norm_backward_params_finish_f32 writes them): the staged kernels' input gradient and weight
// gradient compute it as they load it (load_or_bn), with the operations of
// batch_norm_backward_input_from_f32 — the same bits as that kernel's output read back — so it is
// never written. mode BN_LOAD_NONE reads the tensor itself.
#define BN_LOAD_NONE 0
#define BN_LOAD_RELU 1
#define BN_LOAD_POOLED 2
struct BnLoad {
    const float* x;       // batch norm's input [E, B, C, H, W]
    const float* dy;      // the gradient that reached the block: the pool's output's, or the ReLU's
    const u8* argmax;     // the pool's choices (BN_LOAD_POOLED)
    const float* coef;    // [E·C, BN_COEF]
    int mode;
};

__device__ __forceinline__ BnLoad bn_load(const float* x, const float* dy, const u8* argmax, const float* coef, int mode) {
    BnLoad bn;
    bn.x = x, bn.dy = dy, bn.argmax = argmax, bn.coef = coef, bn.mode = mode;
    return bn;
}

// Element (iy, ix) of plane `plane_index` ((env·B + image)·channels + c) of the tensor t (planes h × w),
// or where bn.mode says so batch norm's input gradient there (t unread).
__device__ __forceinline__ float load_or_bn(
    const float* t, BnLoad bn, u32 e, u32 channels, u32 c, u64 plane_index, u32 iy, u32 ix, u32 h, u32 w) {
    u64 at = plane_index * h * w + iy * w + ix;
    if (bn.mode == BN_LOAD_NONE) return t[at];
    const float* cf = bn.coef + ((u64)e * channels + c) * BN_COEF;
    float xi = bn.x[at];
    float g = bn_output_grad(xi, cf[0], cf[1], cf[2], bn.dy, bn.argmax, bn.mode == BN_LOAD_POOLED, at, plane_index,
                             iy, ix, h, w);
    return bn_input_grad(cf, xi, bn_slot_grad(cf, g));
}

// fast_div(chunk) for a chunk of 1 .. DC_CHUNK channels: each branch's divisor is a constant, so the
// compiler folds its division away (see block_fast_divs).
__device__ __forceinline__ FastDiv chunk_div(u32 chunk) {
    static_assert(DC_CHUNK == 4, "chunk_div covers chunks of 1 to 4 channels");
    return chunk >= 4 ? fast_div(4) : chunk == 3 ? fast_div(3) : chunk == 2 ? fast_div(2) : fast_div(1);
}

// The FastDivs a staged kernel's block needs for an h × w plane: dc_stage's (quads: the plane's h·w/4
// quads, wq: a row's w/4, border: a padded plane's 2(w + 2) + 2h border cells) and the kernels' own
// (plane: h·w, w), computed once per block (block_fast_divs: a barrier).
struct StageDivs {
    FastDiv quads, wq, border, plane, w;
};

__device__ __forceinline__ StageDivs stage_divs(u32 h, u32 w) {
    FastDiv d[5];
    block_fast_divs<5>({h * w / 4, w / 4, 2 * (w + 2) + 2 * h, h * w, w}, d);
    return StageDivs{d[0], d[1], d[2], d[3], d[4]};
}

// n / constant where the planes are W × W (a shift or a multiply-high), else by the FastDiv.
template <int W>
__device__ __forceinline__ u32 stage_div(u32 n, u32 constant, const FastDiv& f) {
    return W > 0 ? n / constant : fdiv(n, f);
}

// The border cells (rows 0 and h + 1, columns 0 and w + 1) of `images` images' `chunk` padded planes
// in the tile, set to zero (ts: the staging's strides; divs, f_chunk as dc_stage's, below). Border cell
// r of a plane: row 0's w + 2 cells, row h + 1's, then columns 0 and w + 1 of rows 1 .. h in turn.
template <int W = 0, int THREADS = 256>
__device__ __forceinline__ void dc_zero_border(
    float* tile, u32 chunk, const TileStrides& ts, u32 images, u32 h, u32 w, const StageDivs& divs,
    const FastDiv& f_chunk) {
    if (W > 0) h = W, w = W;
    u32 wp = w + 2;
    u32 border = W > 0 ? 4 * W + 4 : divs.border.d, cells = images * chunk * border;
    for (u32 l = threadIdx.x; l < cells; l += THREADS) {
        u32 pc = stage_div<W>(l, border, divs.border), r = l - pc * border, i = fdiv(pc, f_chunk), c = pc - i * chunk;
        u32 yy = r < wp ? 0 : r < 2 * wp ? h + 1 : 1 + (r - 2 * wp) / 2;
        u32 xx = r < wp ? r : r < 2 * wp ? r - wp : ((r - 2 * wp) % 2 ? wp - 1 : 0);
        tile[i * ts.image + c * ts.plane + yy * ts.row + xx] = 0.0f;
    }
}

// Quad l of a staging: image i of the block's, channel c of the chunk, quad q of the plane at row yy,
// columns xx .. xx + 3 (quads: a plane's h·w/4, wq: a row's w/4).
struct StageQuad {
    u32 i, c, q, yy, xx;
};

template <int W>
__device__ __forceinline__ StageQuad stage_quad(
    u32 l, u32 chunk, u32 quads, u32 wq, const StageDivs& divs, const FastDiv& f_chunk) {
    u32 pc = stage_div<W>(l, quads, divs.quads), q = l - pc * quads, i = fdiv(pc, f_chunk), c = pc - i * chunk;
    u32 yy = stage_div<W>(q, wq, divs.wq);
    return StageQuad{i, c, q, yy, (q - yy * wq) * 4};
}

// Where quad a lies in x (xb: the staging's first image and channel; c_in, plane: x's) and where it goes
// in the tile (ts: the staging's strides), and its four values stored there (rounded to TF32 with
// `tf32`). Shared by dc_stage and the cp.async halves below.
__device__ __forceinline__ const float* stage_src(const float* xb, const StageQuad& a, u32 c_in, u32 plane) {
    return xb + (a.i * c_in + a.c) * plane + 4 * a.q;
}

__device__ __forceinline__ float* stage_dst(float* tile, const StageQuad& a, const TileStrides& ts) {
    return tile + a.i * ts.image + a.c * ts.plane + (a.yy + 1) * ts.row + a.xx + 1;
}

__device__ __forceinline__ void stage_store(float* dst, float4 v, bool tf32) {
    dst[0] = tf32 ? tf32_round(v.x) : v.x;
    dst[1] = tf32 ? tf32_round(v.y) : v.y;
    dst[2] = tf32 ? tf32_round(v.z) : v.z;
    dst[3] = tf32 ? tf32_round(v.w) : v.w;
}

// Whether a staging may read x a quad at a time: as it is (no batch norm on load) and 16-byte aligned
// (then every quad is: a plane's w is a multiple of 4, so are the offsets of its images and channels).
__device__ __forceinline__ bool stage_reads_quads(const float* x, const BnLoad& bn) {
    return bn.mode == BN_LOAD_NONE && (reinterpret_cast<unsigned long long>(x) & 15) == 0;
}

// Stage input channels s0 .. s0 + chunk − 1 of images b0 .. b0 + images − 1 (of env e) zero-padded into
// the block's tile: tile[i·image + c·plane + yy·row + xx] = x[b0 + i][s0 + c][yy − 1][xx − 1], zero
// outside the plane (ts: the tile's strides, tile_strides or the square kernels' square_strides). The
// direct kernels pack an image's `chunk` planes, the tensor-core ones give it DC_CHUNK so that a
// pixel's place does not move when the last chunk is short; `divs` from stage_divs(h, w), f_chunk
// chunk_div(chunk). With `tf32` the values are stored rounded to TF32 (tf32_round), as the tensor cores
// multiply them. `bn`: x's values computed on load (load_or_bn).
//
// The interior is loaded four values at a time (w is a multiple of 4: a quad of a row, one 16-byte load
// where x is aligned and read as it is) and each quad's place found with three FastDivs; the border cells (rows 0 and h + 1, columns 0
// and w + 1) are written only with `zero_border`: the caller asks for it on its first staging and again
// wherever the planes' places in the tile moved (a packed short last chunk), since no staging writes a
// border cell otherwise. Per value this is a few instructions where finding each padded cell's place
// and bounds took dozens (the staging was most of the staged kernels' instructions in ncu).
//
// W > 0: the planes are W × W (the square tensor-core kernels), so every divisor but the chunk's is a
// constant the compiler folds (W·W/4 and W/4 to shifts, the border's 4W + 4 to a multiply-high).
template <int W = 0, int THREADS = 256>
__device__ __forceinline__ void dc_stage(
    float* tile, const float* x, u32 e, u32 batch, u32 c_in, u32 s0, u32 chunk, const TileStrides& ts, u32 b0,
    u32 images, u32 h, u32 w, const StageDivs& divs, const FastDiv& f_chunk, bool zero_border, bool tf32, BnLoad bn) {
    if (W > 0) h = W, w = W;
    u32 plane = h * w;
    u32 quads = W > 0 ? W * W / 4 : divs.quads.d, wq = W > 0 ? W / 4 : divs.wq.d;
    if (zero_border) dc_zero_border<W, THREADS>(tile, chunk, ts, images, h, w, divs, f_chunk);
    const float* xb = x + (((u64)e * batch + b0) * c_in + s0) * plane;
    bool vec = stage_reads_quads(x, bn);
    u32 staged = images * chunk * quads;
    auto quad_at = [&](u32 l) { return stage_quad<W>(l, chunk, quads, wq, divs, f_chunk); };
    auto src_of = [&](const StageQuad& a) { return reinterpret_cast<const float4*>(stage_src(xb, a, c_in, plane)); };
    auto dst_of = [&](const StageQuad& a) { return stage_dst(tile, a, ts); };
    // W > 0 with x read as it is: every quad of the thread loaded first, then each stored. In the loop
    // below a quad's 16-byte load was used by its rounding a few instructions later, so a thread waited
    // a global load's whole latency per quad, one after another (four a chunk at 256 threads). The
    // square kernels stage at most 1 024 pixels of DC_CHUNK planes (TC_PIXELS; static_assert there):
    // SQUARE_PER quads a thread. Branch-free between the loads and the stores (a load of a quad past
    // `staged` is predicated off, its place that of the last quad), so ptxas keeps the loads together.
    constexpr u32 SQUARE_PER = (1024 * DC_CHUNK / 4 + THREADS - 1) / THREADS;
    if (LOADS_AHEAD && W > 0 && vec) {
        float4 quad[SQUARE_PER];
        float* dst[SQUARE_PER];
#pragma unroll
        for (u32 k = 0; k < SQUARE_PER; ++k) {
            u32 l = threadIdx.x + k * THREADS;
            StageQuad a = quad_at(min(l, staged - 1));
            dst[k] = dst_of(a);
            quad[k] = l < staged ? *src_of(a) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (u32 k = 0; k < SQUARE_PER; ++k) {
            if (threadIdx.x + k * THREADS >= staged) break;
            stage_store(dst[k], quad[k], tf32);
        }
        return;
    }
#pragma unroll 2
    for (u32 l = threadIdx.x; l < staged; l += THREADS) {
        StageQuad a = quad_at(l);
        float4 v;
        if (vec) {
            v = *src_of(a);
        } else {
            float u[4];
#pragma unroll
            for (int k = 0; k < 4; ++k)
                u[k] = load_or_bn(x, bn, e, c_in, s0 + a.c, ((u64)e * batch + b0 + a.i) * c_in + s0 + a.c, a.yy,
                                  a.xx + k, h, w);
            v = make_float4(u[0], u[1], u[2], u[3]);
        }
        stage_store(dst_of(a), v, tf32);
    }
}

// ---- The square staging in two halves (CP_ASYNC, the square tensor-core kernels): square_stage_issue
// copies x's values of a staging (dc_stage's channels and images, x read as it is) into `raw` with
// cp.async, quad l of the staging at raw[4·l], and returns at once; square_stage_land waits for the
// thread's copies and stores each of its quads from raw into its padded cell of the tile (rounded to
// TF32 with `tf32`; the border zeroed first with `zero_border`), as dc_stage would have. A thread lands
// exactly the quads it issued (the same l = threadIdx.x + k·THREADS) from the part of raw only it
// writes, so raw needs no barrier at all; the tile does, as with dc_stage: a land must wait for every
// warp to be done with the tile's previous values. Raw takes TC_RAW floats (1 024 pixels of DC_CHUNK planes) and is 16-byte aligned, as x's
// quads are where stage_reads_quads says so.
#define TC_RAW (1024 * DC_CHUNK)

template <int W, int THREADS>
__device__ __forceinline__ void square_stage_issue(
    float* raw, const float* x, u32 e, u32 batch, u32 c_in, u32 s0, u32 chunk, u32 b0, u32 images,
    const StageDivs& divs, const FastDiv& f_chunk) {
    static_assert(W > 0, "the square staging takes W × W planes");
    constexpr u32 PLANE = W * W, QUADS = PLANE / 4;
    const float* xb = x + (((u64)e * batch + b0) * c_in + s0) * PLANE;
    u32 staged = images * chunk * QUADS;
    for (u32 l = threadIdx.x; l < staged; l += THREADS) {
        StageQuad a = stage_quad<W>(l, chunk, QUADS, W / 4, divs, f_chunk);
        cp_async16(raw + 4 * l, stage_src(xb, a, c_in, PLANE));
    }
}

template <int W, int THREADS>
__device__ __forceinline__ void square_stage_land(
    float* tile, const float* raw, u32 chunk, const TileStrides& ts, u32 images, const StageDivs& divs,
    const FastDiv& f_chunk, bool zero_border, bool tf32) {
    static_assert(W > 0, "the square staging takes W × W planes");
    constexpr u32 QUADS = W * W / 4;
    u32 staged = images * chunk * QUADS;
    if (zero_border) dc_zero_border<W, THREADS>(tile, chunk, ts, images, W, W, divs, f_chunk);
    cp_async_wait_all();
    for (u32 l = threadIdx.x; l < staged; l += THREADS) {
        StageQuad a = stage_quad<W>(l, chunk, QUADS, W / 4, divs, f_chunk);
        stage_store(stage_dst(tile, a, ts), *reinterpret_cast<const float4*>(raw + 4 * l), tf32);
    }
}

// BN_ARGS: the last five arguments of every staged kernel, a BnLoad's fields (mode BN_LOAD_NONE and
// null pointers where the kernel reads its tensor).
#define BN_ARGS const float *bn_x, const float *bn_dy, const u8 *bn_argmax, const float *bn_coef, int bn_mode
#define BN_LOAD bn_load(bn_x, bn_dy, bn_argmax, bn_coef, bn_mode)

extern "C" __global__ void __launch_bounds__(256) conv3x3_direct_f32(
    const float* x, const float* weight, float* y, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, int flip, BN_ARGS) {
    BnLoad bn = BN_LOAD;
    __shared__ float tile[DC_TILE];
    __shared__ __align__(16) float wt[DC_CHUNK * 9 * DC_OUT];  // [channel][tap][output]
    u32 t = threadIdx.x, e = blockIdx.z, o0 = blockIdx.y * DC_OUT;
    u32 plane = h * w, quads = plane / 4, per_block = 256 / quads;
    u32 b0 = blockIdx.x * per_block, images = min(per_block, batch - b0);
    u32 hp = h + 2, wp = w + 2, padded = hp * wp;
    StageDivs divs = stage_divs(h, w);
    // This thread's outputs: image `mine`, row `row`, columns col .. col + 3.
    u32 mine = t / quads, q = t - mine * quads, row = q / (w / 4), col = (q - row * (w / 4)) * 4;
    bool computes = mine < images;

    float acc[DC_OUT][4];
    for (int o = 0; o < DC_OUT; ++o)
        for (int i = 0; i < 4; ++i) acc[o][i] = 0.0f;

    for (u32 s0 = 0; s0 < c_in; s0 += DC_CHUNK) {
        u32 chunk = min((u32)DC_CHUNK, c_in - s0);
        FastDiv f_chunk = chunk_div(chunk);
        __syncthreads();  // the previous chunk's reads are done
        dc_stage(tile, x, e, batch, c_in, s0, chunk, tile_strides(h, w, chunk), b0, images, h, w, divs, f_chunk,
                 s0 == 0 || chunk != DC_CHUNK, false, bn);
        for (u32 l = t; l < DC_CHUNK * 9 * DC_OUT; l += 256) {
            u32 sc = l / (9 * DC_OUT), tap = (l / DC_OUT) % 9, o = o0 + l % DC_OUT, s = s0 + sc;
            float v = 0.0f;
            if (sc < chunk && o < c_out)
                v = flip ? weight[(((u64)e * c_in + s) * c_out + o) * 9 + (8 - tap)]
                         : weight[(((u64)e * c_out + o) * c_in + s) * 9 + tap];
            wt[l] = v;
        }
        __syncthreads();
        if (computes) {
            for (u32 sc = 0; sc < chunk; ++sc) {
                const float* window = tile + (mine * chunk + sc) * padded + row * wp + col;
#pragma unroll
                for (int ky = 0; ky < 3; ++ky) {
                    float v[6];
                    for (int i = 0; i < 6; ++i) v[i] = window[ky * wp + i];
#pragma unroll
                    for (int kx = 0; kx < 3; ++kx) {
                        const float4* wq = reinterpret_cast<const float4*>(wt + (sc * 9 + ky * 3 + kx) * DC_OUT);
                        float4 lo = wq[0], hi = wq[1];
                        float wo[DC_OUT] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                        for (int o = 0; o < DC_OUT; ++o)
#pragma unroll
                            for (int i = 0; i < 4; ++i) acc[o][i] = fmaf(wo[o], v[i + kx], acc[o][i]);
                    }
                }
            }
        }
    }

    if (!computes) return;
    float* out = y + (((u64)e * batch + b0 + mine) * c_out + o0) * plane + row * w + col;
    for (int o = 0; o < DC_OUT; ++o) {
        if (o0 + o >= c_out) break;
        for (int i = 0; i < 4; ++i) out[(u64)o * plane + i] = acc[o][i];
    }
}

// ---- The 3×3 weight gradient (padding 1) direct: per env dW[o][s][tap] = Σ over images b and positions p
// of dy[b][o][p] · x[b][s][p + tap − 4 taps' offset], the sums the implicit weight gradient's GEMM
// makes, without its column matrix. Block (run, (s-chunk, o-group), env): DC_CHUNK input channels s0 ..
// and DC_OUT output channels o0 .. (grid.y = s-chunk · o_groups + o-group); its run of image groups
// (`per_block` = 1024 / (h·w) images each) staged group by group, zero-padded, in shared memory as the
// forward stages them. Warp v takes input channel s0 + v / 2 and output channels o0 + 4·(v % 2) ..+3;
// lane l the columns l, l + 32, … of the group's images side by side (image col / w, column col % w),
// walking each down its rows with a 3×3 window of x in registers, 36 sums (4 channels × 9 taps) per
// thread, dy read straight from global memory (consecutive lanes, consecutive columns). Then the 32
// lanes' sums are added in lane order through shared memory and the block writes its 288 into
// partial[e][run][o][s·9 + tap]; conv2d_wgrad_reduce_f32 adds the runs in order. f32 sums in another
// order than the CPU's lanes: to a tolerance, as the implicit GEMM's.
extern "C" __global__ void __launch_bounds__(256) conv3x3_wgrad_direct_f32(
    const float* x, const float* dy, float* partial, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 runs,
    u32 groups_per_run, BN_ARGS) {
    BnLoad bn = BN_LOAD, none = bn_load(nullptr, nullptr, nullptr, nullptr, BN_LOAD_NONE);
    __shared__ float tile[DC_TILE];
    u32 t = threadIdx.x, lane = t % 32, warp = t / 32, e = blockIdx.z, run = blockIdx.x;
    u32 o_groups = (c_out + DC_OUT - 1) / DC_OUT;
    u32 s0 = (blockIdx.y / o_groups) * DC_CHUNK, o0 = (blockIdx.y % o_groups) * DC_OUT;
    u32 chunk = min((u32)DC_CHUNK, c_in - s0);
    u32 sc = warp / 2, oq = o0 + 4 * (warp % 2);  // this warp's input channel (in the chunk), first output
    u32 plane = h * w, per_block = 1024 / plane;
    u32 hp = h + 2, wp = w + 2, padded = hp * wp;
    StageDivs divs = stage_divs(h, w);
    FastDiv f_w = divs.w, f_chunk = chunk_div(chunk);
    u32 groups = (batch + per_block - 1) / per_block;
    u32 first = run * groups_per_run, last = min(first + groups_per_run, groups);

    float acc[4][9];
    for (int o = 0; o < 4; ++o)
        for (int j = 0; j < 9; ++j) acc[o][j] = 0.0f;

    for (u32 g = first; g < last; ++g) {
        u32 b0 = g * per_block, images = min(per_block, batch - b0);
        __syncthreads();  // the previous group's reads are done
        dc_stage(tile, x, e, batch, c_in, s0, chunk, tile_strides(h, w, chunk), b0, images, h, w, divs, f_chunk,
                 g == first, false, none);
        __syncthreads();
        if (sc >= chunk) continue;
        for (u32 col = lane; col < images * w; col += 32) {
            u32 i = fdiv(col, f_w), xx = col - i * w;
            const float* column = tile + (i * chunk + sc) * padded + xx;
            u64 dy_plane = ((u64)e * batch + b0 + i) * c_out + oq;
            float win[3][3];
            for (int ky = 0; ky < 2; ++ky)
                for (int kx = 0; kx < 3; ++kx) win[ky][kx] = column[ky * wp + kx];
            for (u32 yy = 0; yy < h; ++yy) {
                for (int kx = 0; kx < 3; ++kx) win[2][kx] = column[(yy + 2) * wp + kx];
                float d[4];
                for (int o = 0; o < 4; ++o)
                    d[o] = oq + o < c_out ? load_or_bn(dy, bn, e, c_out, oq + o, dy_plane + o, yy, xx, h, w) : 0.0f;
#pragma unroll
                for (int o = 0; o < 4; ++o)
#pragma unroll
                    for (int tap = 0; tap < 9; ++tap) acc[o][tap] = fmaf(d[o], win[tap / 3][tap % 3], acc[o][tap]);
                for (int kx = 0; kx < 3; ++kx) {
                    win[0][kx] = win[1][kx];
                    win[1][kx] = win[2][kx];
                }
            }
        }
    }

    // The lanes' sums in lane order: warp v's 36 values of lane l at tile[(v·36 + k)·32 + l].
    __syncthreads();
    for (int o = 0; o < 4; ++o)
        for (int tap = 0; tap < 9; ++tap) tile[(warp * 36 + o * 9 + tap) * 32 + lane] = acc[o][tap];
    __syncthreads();
    for (u32 k = t; k < 8 * 36; k += 256) {
        u32 v = k / 36, r = k % 36, o = 4 * (v % 2) + r / 9, c = v / 2, tap = r % 9;
        if (c >= chunk || o0 + o >= c_out) continue;
        float sum = 0.0f;
        for (u32 l = 0; l < 32; ++l) sum += tile[k * 32 + l];
        partial[(((u64)e * runs + run) * c_out + o0 + o) * c_in * 9 + (s0 + c) * 9 + tap] = sum;
    }
}

// ---- The weight gradient as an implicit GEMM: per env dW (c_out × K) = Σ over the B·P columns of
// dy (c_out × columns) · colᵀ, the column matrix again read straight from x. The columns are cut into
// `chunks` runs (enough blocks to fill the GPU: the output is small, the sum long); each block sums its
// run into `partial` [E, chunks, c_out, K] and conv2d_wgrad_reduce_f32 adds the runs in order, so a
// result depends only on the shape. f32 sums in another order than the CPU's lanes: checked to a
// tolerance, as the SGEMM it replaces.
//
// Block: 256 threads, BO output channels × 64 depth rows j, 16 columns a step; thread (to, tj) holds
// channels to·TO .. + TO − 1 of rows tj·TJ .. + TJ − 1 (TO × TJ = BO / 4: 2 × 4, 1 × 4, 1 × 2).
#define WG_BJ 64
#define WG_BN 16

template <int BO>
__device__ __forceinline__ void conv2d_wgrad(
    const float* x, const float* dy, float* partial, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 k,
    u32 pad, u32 chunks, u32 chunk_len) {
    constexpr int TO = BO == 32 ? 2 : 1, TJ = BO == 8 ? 2 : 4, J_THREADS = WG_BJ / TJ;
    __shared__ __align__(16) float dy_tile[WG_BN][BO];
    __shared__ __align__(16) float col_tile[WG_BN][WG_BJ];
    u32 t = threadIdx.x, tj = t % J_THREADS, to = t / J_THREADS;
    u32 j0 = blockIdx.x * WG_BJ, o0 = blockIdx.y * BO;
    u32 e = blockIdx.z / chunks, chunk = blockIdx.z % chunks;
    u32 ho = h + 2 * pad + 1 - k, wo = w + 2 * pad + 1 - k, positions = ho * wo, columns = batch * positions;
    u32 kk = k * k, depth = c_in * kk;
    u64 plane = (u64)h * w;
    FastDiv f_positions = fast_div(positions), f_wo = fast_div(wo);
    u32 first = chunk * chunk_len, last = min(first + chunk_len, columns);

    // The four rows j this thread loads into col_tile (fixed for the block): (s·h·w, ky − pad, kx − pad),
    // or no row past K.
    u32 r_load = t % WG_BN;
    u64 row_plane[4];
    int row_dy[4], row_dx[4];
    bool row_ok[4];
    for (int i = 0; i < 4; ++i) {
        u32 j = j0 + t / WG_BN + 16 * i;
        row_ok[i] = j < depth;
        u32 s = row_ok[i] ? j / kk : 0, tap = row_ok[i] ? j % kk : 0;
        row_plane[i] = s * plane;
        row_dy[i] = (int)(tap / k) - (int)pad;
        row_dx[i] = (int)(tap % k) - (int)pad;
    }

    float acc[TO][TJ];
    for (int i = 0; i < TO; ++i)
        for (int j = 0; j < TJ; ++j) acc[i][j] = 0.0f;

    for (u32 n0 = first; n0 < last; n0 += WG_BN) {
        for (u32 l = t; l < BO * WG_BN; l += 256) {  // BO·16 values: two per thread at BO = 32
            u32 r = l % WG_BN, o = o0 + l / WG_BN, n = n0 + r;
            float v = 0.0f;
            if (o < c_out && n < last) {
                u32 b = fdiv(n, f_positions), q = n - b * positions;
                v = dy[(((u64)e * batch + b) * c_out + o) * positions + q];
            }
            dy_tile[r][l / WG_BN] = v;
        }
        {
            u32 n = n0 + r_load;
            bool n_ok = n < last;
            u32 b = n_ok ? fdiv(n, f_positions) : 0, q = n - b * positions;
            u32 yo = fdiv(q, f_wo), xo = q - yo * wo;
            const float* x_image = x + ((u64)e * batch + b) * c_in * plane;
            for (int i = 0; i < 4; ++i) {
                float v = 0.0f;
                int iy = (int)yo + row_dy[i], ix = (int)xo + row_dx[i];
                if (n_ok && row_ok[i] && iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)w)
                    v = x_image[row_plane[i] + (u32)iy * w + (u32)ix];
                col_tile[r_load][t / WG_BN + 16 * i] = v;
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < WG_BN; ++r) {
            float a[TO], b[TJ];
            load_row<TO>(&dy_tile[r][to * TO], a);
            load_row<TJ>(&col_tile[r][tj * TJ], b);
            for (int i = 0; i < TO; ++i)
                for (int j = 0; j < TJ; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    for (int i = 0; i < TO; ++i) {
        u32 o = o0 + to * TO + i;
        if (o >= c_out) continue;
        float* out = partial + (((u64)e * chunks + chunk) * c_out + o) * depth;
        for (int j = 0; j < TJ; ++j) {
            u32 jj = j0 + tj * TJ + j;
            if (jj < depth) out[jj] = acc[i][j];
        }
    }
}

// Grid (⌈K / 64⌉, ⌈c_out / BO⌉, envs · chunks), 256 threads.
#define WG_KERNEL(BO)                                                                                           \
    extern "C" __global__ void __launch_bounds__(256) conv2d_wgrad_m##BO##_f32(                                 \
        const float* x, const float* dy, float* partial, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 k,    \
        u32 pad, u32 chunks, u32 chunk_len) {                                                                   \
        conv2d_wgrad<BO>(x, dy, partial, batch, c_in, c_out, h, w, k, pad, chunks, chunk_len);                 \
    }
WG_KERNEL(8)
WG_KERNEL(16)
WG_KERNEL(32)

// grad_weight[e][i] = Σ_c partial[e][c][i] over the chunks in order (i < c_out·K).
extern "C" __global__ void __launch_bounds__(1024) conv2d_wgrad_reduce_f32(
    const float* partial, float* grad_weight, u32 envs, u32 chunks, u32 per_env) {
    FOR_EACH(i, (u64)envs * per_env) {
        u64 e = i / per_env, r = i % per_env;
        const float* p = partial + e * chunks * per_env + r;
        float sum = 0.0f;
        for (u32 c = 0; c < chunks; ++c) sum += p[(u64)c * per_env];
        grad_weight[i] = sum;
    }
}

// ---- The 3×3 convolutions (padding 1) on the tensor cores, at `--precision tf32`: the direct kernels'
// staging (DC_CHUNK input channels of a block's images, zero-padded, in shared memory; here rounded to
// TF32 as they are staged) with the multiply-adds as mma.sync.m16n8k8 (TF32 inputs, f32 sums). The
// forward per env is Y (pixels × c_out) = A (pixels × K) · W (K × c_out), K = (channel, tap): a row of
// A is one output pixel's 3×3 windows, read from the staged tile at the pixel's place plus the
// (channel, tap)'s offset, so the column matrix is never formed. Not bit for bit: the inputs are
// rounded to TF32 and the tensor cores sum in their own order (checked against ops::conv on inputs
// rounded by ops::precision::round_to_tf32, to a tolerance).
//
// K runs chunk by chunk: DC_CHUNK·9 = 36 (channel, tap) rows a chunk, padded to TC_K = 40 (five k-steps
// of 8; the padding rows read as 0).
#define TC_K ((DC_CHUNK * 9 + 7) / 8 * 8)
#define TC_PIXELS 1024
static_assert(TC_PIXELS == 1024, "dc_stage's square staging holds a thread's quads of 1 024 pixels in registers");
// A forward block's warps (8 or 16) and each warp's m-tiles of 16 pixels: TC_PIXELS / 16 in all.
#define TC_TILES_PER_WARP(WARPS) (TC_PIXELS / 16 / (WARPS))
// Zeroed floats after the staged tile (at tc_tile_floats<W>()) that the W > 0 forwards' padding rows
// read: a warp's 8 m-tiles span tc_place<W>(127) + 1 ≤ 478 cells (W = 8).
#define TC_ZERO 512
// The floats a block's padded planes take in the tile: TC_PIXELS / W² images of square_strides' image
// for the square kernels (forward 6 400, 6 144 and 5 756 at W = 8, 16, 32; weight gradient 8 128 at
// W = 8), DC_TILE for the general ones.
template <int W, bool WGRAD>
__device__ constexpr u32 tc_tile_floats() {
    return W > 0 ? TC_PIXELS / (W * W) * square_strides<W, WGRAD>().image : DC_TILE;
}
// A tensor-core block's shared staging: the tile, the forward's TC_ZERO zeros after it, and for the
// square kernels TC_RAW floats where cp.async lands the next staging (there whether CP_ASYNC uses
// them or not, so that switching it off changes nothing else; the forward's epilogue statistics use
// the whole). The most: W = 8's weight gradient, 12 224 floats (48 896 bytes); its forward 11 008.
template <int W, bool WGRAD>
__device__ constexpr u32 tc_stage_floats() {
    return tc_tile_floats<W, WGRAD>() + (WGRAD ? 0 : TC_ZERO) + (W > 0 ? TC_RAW : 0);
}

// The place in the staged tile of pixel p of a block's W × W images (image p / W², row, column, at
// square_strides<W, WGRAD>()): a constant expression where p is. For W = 8, 16, 32 and a
// warp's first pixel p0 (a multiple of 16·TILES, 128 or 64, plus a lane's g < 8), tc_place<W>(p0 + d) =
// tc_place<W>(p0) + tc_place<W>(d) for the m-tiles' d = 16·mt + 8·half < 16·TILES: a row of 32 holds
// two m-tiles, one of 16 one, one of 8 two half-tiles, and 128 or 64 pixels are whole rows (W = 32), a
// half or a quarter of an image (16), or two images or one (8).
template <int W, bool WGRAD = false>
__device__ __forceinline__ constexpr int tc_place(u32 p) {
    constexpr u32 V = W > 0 ? W : 1;  // W = 0 (the general kernels) never calls it: no division by 0
    constexpr TileStrides TS = square_strides<W, WGRAD>();
    return (int)((p / (V * V)) * TS.image + (p % (V * V)) / V * TS.row + p % V);
}

// Where (channel, tap) row k of a chunk reads relative to a pixel's place in the tile (ts: its strides),
// or −1 for the padding rows past the chunk's `valid` = chunk·9.
__device__ __forceinline__ int tc_row_offset(u32 k, u32 valid, const TileStrides& ts) {
    return k < valid ? (int)((k / 9) * ts.plane + (k % 9) / 3 * ts.row + k % 3) : -1;
}

// Batch norm's training statistics in the forward's epilogue (a training step's host convolution,
// `stats` not null): the block's sums of each of its output channels' values, shifted by the block's
// first value (its pixel 0's; 0 where not finite, as batch_norm_stats_partial_f32's shift), in double:
// stats[((e·c_out + o)·runs + run)·3 + {0, 1, 2}] = (shift, Σ d, Σ d²), d = y − shift, run = the block's
// image group (blockIdx.x, runs = gridDim.x). Each thread sums its values, then the block's threads' sums
// are added through shared memory, each warp's row groups in order and then the warps in order, so a
// result depends only on the shape;
// batch_norm_stats_finish_runs_f32 combines the runs in a fixed order. `acc`, `tiles`, `first`, `pixels`,
// `o0` as conv3x3_tc's; `tile` its shared staging (the whole array), free once every warp is past the K
// loop: the last chunk issues no cp.async, so none is pending then.
template <int NT, int WARPS, u32 STAGE>
__device__ __forceinline__ void tc_block_stats(
    const float (&acc)[TC_TILES_PER_WARP(WARPS)][NT][4], float* tile, u32 tiles, u32 first, u32 pixels, u32 o0,
    u32 c_out, double* stats) {
    constexpr int TILES = TC_TILES_PER_WARP(WARPS);
    constexpr u32 THREADS = WARPS * 32;
    u32 t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tg = lane % 4;
    // THREADS × NT·2 channels × 2 sums, then WARPS × NT·8 channels × 2 sums, then NT·8 shifts (36 928
    // bytes at NT = 2 and 16 warps: most of a W = 32 block's 41 456 bytes of staging, raw included).
    static_assert(THREADS * NT * 4 * 8 + WARPS * NT * 16 * 8 + NT * 8 * 4 <= STAGE * 4,
                  "the statistics' sums fit the staging");
    double* sums = reinterpret_cast<double*>(tile);
    double* warp_sums = sums + THREADS * NT * 2 * 2;
    float* shift = reinterpret_cast<float*>(warp_sums + WARPS * NT * 8 * 2);
    __syncthreads();  // every warp is past the K loop: the tile is free
    // Pixel 0 is row g = 0 of warp 0's first m-tile: lanes 0..3 hold its channels 2·tg + j of each n-tile.
    if (warp == 0 && g == 0)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                float v = acc[0][nt][j];
                shift[nt * 8 + 2 * tg + j] = isfinite(v) ? v : 0.0f;
            }
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            double s = (double)shift[nt * 8 + 2 * tg + j], s1 = 0.0, s2 = 0.0;
#pragma unroll
            for (int mt = 0; mt < TILES; ++mt) {
                if ((u32)mt >= tiles) break;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    if (first + mt * 16 + g + 8 * half >= pixels) continue;
                    double d = (double)acc[mt][nt][2 * half + j] - s;
                    s1 += d;
                    s2 += d * d;
                }
            }
            u32 k = nt * 2 + j;
            sums[(t * NT * 2 + k) * 2] = s1;
            sums[(t * NT * 2 + k) * 2 + 1] = s2;
        }
    __syncthreads();
    // Each warp's eight lanes of a channel, then the warps, both in order: chains of 8 and WARPS adds
    // (NT·8·WARPS threads) rather than one thread's chain of 8·WARPS, which had kept the block alive for
    // hundreds of cycles after its other warps were done.
    if (t < NT * 8 * WARPS) {
        // Channel c of the block, warp v: n-tile c / 8, held by the lanes with tg = (c % 8) / 2 as their
        // j = c % 2.
        u32 c = t % (NT * 8), v = t / (NT * 8), tgc = (c % 8) / 2, k = (c / 8) * 2 + c % 2;
        double s1 = 0.0, s2 = 0.0;
#pragma unroll
        for (u32 gg = 0; gg < 8; ++gg) {
            u32 th = v * 32 + gg * 4 + tgc;
            s1 += sums[(th * NT * 2 + k) * 2];
            s2 += sums[(th * NT * 2 + k) * 2 + 1];
        }
        warp_sums[(v * NT * 8 + c) * 2] = s1;
        warp_sums[(v * NT * 8 + c) * 2 + 1] = s2;
    }
    __syncthreads();
    if (t < NT * 8 && o0 + t < c_out) {
        double s1 = 0.0, s2 = 0.0;
#pragma unroll
        for (u32 v = 0; v < WARPS; ++v) {
            s1 += warp_sums[(v * NT * 8 + t) * 2];
            s2 += warp_sums[(v * NT * 8 + t) * 2 + 1];
        }
        double* out = stats + (((u64)blockIdx.z * c_out + o0 + t) * gridDim.x + blockIdx.x) * 3;
        out[0] = (double)shift[t];
        out[1] = s1;
        out[2] = s2;
    }
}

// The forward, and with flip != 0 the input gradient (the forward over the transposed, flipped weights,
// as conv3x3_direct_f32's flip). Block: WARPS warps (8 or 16) over TC_PIXELS output pixels = 1024 /
// (h·w) whole images of one env, and NT·8 output channels (NT n-tiles of 8); warp v takes the TILES =
// 64 / WARPS m-tiles (16 pixels each) TILES·v .. TILES·v + TILES − 1, each with all NT n-tiles (an
// output's products in the same order whatever the warps: the same bits); pixels past the block's images read pixel
// 0's place in the tile (W = 0; W > 0: their own, below) — their rows are multiplied and not written.
// Grid (⌈B / images per block⌉,
// ⌈c_out / (8·NT)⌉, envs).
//
// W > 0: the kernel for square W × W planes (h = w = W; the launcher checks it), whose m-tiles' places
// in the tile are compile-time offsets from the lane's first pixel's (tc_place: an m-tile of 16 pixels
// moves each of its lanes' pixels by the same amount for W = 8, 16, 32), so that each A value is one
// shared load at an immediate offset, where the general kernel (W = 0) adds a per-lane index and scales
// it per load (two instructions a load, two thirds of the K loop's). A padding row (past `valid`) reads
// a zeroed stretch of the tile (TC_ZERO floats at tc_tile_floats<W>()) rather than being selected away
// per value: the same zeros, so the same sums bit for bit.
template <int NT, int W, int WARPS>
__device__ __forceinline__ void conv3x3_tc(
    const float* x, const float* weight, float* y, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, int flip,
    BnLoad bn, double* stats) {
    constexpr u32 TILE = tc_tile_floats<W, false>(), STAGE = tc_stage_floats<W, false>();
    __shared__ __align__(16) float tile[STAGE];
    float* raw = tile + TILE + TC_ZERO;  // W > 0: where cp.async lands the next chunk (CP_ASYNC)
    static_assert(TC_RAW == TC_PIXELS * DC_CHUNK && (TILE + TC_ZERO) % 4 == 0, "raw: 16-byte aligned, a staging");
    // [chunk row k][output channel], TF32; rows of 24 floats for two n-tiles, so that a k-step's four
    // rows (lanes' tg) × eight channels (g) fall in 32 different banks.
    constexpr int WT_STRIDE = NT == 1 ? 8 : 24;
    __shared__ float wt[TC_K][WT_STRIDE];
    __shared__ int row_offset[TC_K];
    constexpr int TILES = TC_TILES_PER_WARP(WARPS);
    constexpr u32 THREADS = WARPS * 32;
    u32 t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tg = lane % 4;
    u32 e = blockIdx.z, o0 = blockIdx.y * (NT * 8);
    u32 plane = h * w, per_block = TC_PIXELS / plane;
    u32 b0 = blockIdx.x * per_block, images = min(per_block, batch - b0), pixels = images * plane;
    TileStrides ts = tc_strides<W, false>(h, w);
    StageDivs divs = stage_divs(h, w);
    FastDiv f_plane = divs.plane, f_w = divs.w;
    u32 first = warp * TILES * 16;
    u32 tiles = first >= pixels ? 0 : min((u32)TILES, (pixels - first + 15) / 16);

    // The places in the tile of this lane's pixels: rows g and g + 8 of each m-tile (W = 0).
    // (Pointers into the tile rather than indices: a load is then one add of the row's offset.)
    const float* place[W > 0 ? 1 : TILES][2];
    if constexpr (W == 0) {
#pragma unroll
        for (int mt = 0; mt < TILES; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                u32 p = first + mt * 16 + g + 8 * half;
                p = p < pixels ? p : 0;
                u32 i = fdiv(p, f_plane), q = p - i * plane, yy = fdiv(q, f_w), xx = q - yy * w;
                place[mt][half] = tile + i * ts.image + yy * ts.row + xx;
            }
    }
    // W > 0: the place of the lane's first pixel (first + g); its m-tiles' at tc_place<W>(16·mt + 8·half)
    // from it. Pixels past the block's images read tile cells within the block's per_block images
    // (stale or unwritten: their rows are multiplied and never written, nor summed by tc_block_stats).
    static_assert(W == 0 || W == 8 || W == 16 || W == 32, "tc_place's m-tile offsets hold for W = 8, 16, 32");
    static_assert(W == 0 || tc_place<W>(TILES * 16 - 1) < TC_ZERO, "the zeroed stretch covers a warp");
    int base = W > 0 ? tc_place<W>(first + g) : 0, zero_row = W > 0 ? (int)TILE - base : 0;

    float acc[TILES][NT][4];
#pragma unroll
    for (int mt = 0; mt < TILES; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;

    // The chunk's weights: loaded before the tile is staged and stored after it, so that their loads
    // wait together with the tile's (the loop below stores each value right after loading it: a wait of
    // its own). Square kernels of 256 threads only: the 512-thread ones' 64 registers then spill in the
    // staging (ptxas -v: 104 bytes where the loop leaves 48), and the general n16 one spills 36 bytes
    // where it spilled 12. With CP_ASYNC those of 256 threads load them a chunk ahead (below); the
    // 512-thread ones as before (ptxas -v: loaded ahead, their two weights a thread spilled right after
    // their loads, 116 bytes where they leave 48, so each load was waited for at once).
    constexpr u32 WT_VALUES = TC_K * NT * 8, WT_PER = (WT_VALUES + THREADS - 1) / THREADS;
    constexpr bool WT_AHEAD = LOADS_AHEAD && W > 0 && THREADS == 256;
    // Value l of the weights of the chunk at s0 (valid: its chunk·9 rows): 0 past them and past c_out.
    auto weight_at = [&](u32 s0, u32 valid, u32 l) {
        u32 k = l / (NT * 8), n = l % (NT * 8), o = o0 + n, s = s0 + k / 9, tap = k % 9;
        float v = 0.0f;
        if (l < WT_VALUES && k < valid && o < c_out)
            v = flip ? weight[(((u64)e * c_in + s) * c_out + o) * 9 + (8 - tap)]
                     : weight[(((u64)e * c_out + o) * c_in + s) * 9 + tap];
        return v;
    };
    float wv[WT_PER];
    // CP_ASYNC (square kernels, x read as it is): the next chunk's x is copied into raw by cp.async,
    // and (WT_AHEAD) its weights loaded into wv, before this chunk's K loop, and landed in the tile after
    // it, so that their loads wait behind the block's own multiplies. Staged as it is loaded (dc_stage),
    // each chunk's loads waited between two barriers with every warp of the block idle, and only the
    // SM's other blocks (two or three) to fill the wait. The same values in the same cells: the same
    // sums, bit for bit.
    bool prefetch = CP_ASYNC && W > 0 && stage_reads_quads(x, bn);
    auto fetch = [&](u32 s0) {
        if constexpr (W > 0) {
            u32 chunk = min((u32)DC_CHUNK, c_in - s0);
            square_stage_issue<W, THREADS>(raw, x, e, batch, c_in, s0, chunk, b0, images, divs, chunk_div(chunk));
            if constexpr (WT_AHEAD)
#pragma unroll
                for (u32 j = 0; j < WT_PER; ++j) wv[j] = weight_at(s0, chunk * 9, t + j * THREADS);
        }
    };
    if (prefetch) fetch(0);

    for (u32 s0 = 0; s0 < c_in; s0 += DC_CHUNK) {
        u32 chunk = min((u32)DC_CHUNK, c_in - s0), valid = chunk * 9;
        FastDiv f_chunk = chunk_div(chunk);
        __syncthreads();  // the previous chunk's reads are done
        if (prefetch) {
            if constexpr (W > 0)
                square_stage_land<W, THREADS>(tile, raw, chunk, ts, images, divs, f_chunk, s0 == 0, true);
        } else {
            if constexpr (WT_AHEAD)
#pragma unroll
                for (u32 j = 0; j < WT_PER; ++j) wv[j] = weight_at(s0, valid, t + j * THREADS);
            dc_stage<W, THREADS>(tile, x, e, batch, c_in, s0, chunk, ts, b0, images, h, w, divs, f_chunk, s0 == 0,
                                 true, bn);
        }
        if (W > 0 && s0 == 0)
            for (u32 l = t; l < TC_ZERO; l += THREADS) tile[TILE + l] = 0.0f;
#pragma unroll
        for (u32 j = 0; j < WT_PER; ++j) {
            u32 l = t + j * THREADS;
            if (l < WT_VALUES) wt[l / (NT * 8)][l % (NT * 8)] = tf32_round(WT_AHEAD ? wv[j] : weight_at(s0, valid, l));
        }
        if (t < TC_K) row_offset[t] = tc_row_offset(t, valid, ts);
        // This thread's part of the chunk is landed and its weights stored (wv free): fetch the next one,
        // its loads then waiting behind the barrier and the K loop.
        if (prefetch && s0 + DC_CHUNK < c_in) fetch(s0 + DC_CHUNK);
        __syncthreads();
        // Every warp runs all its m-tiles (a warp whose tiles lie past the block's pixels multiplies what
        // the tile holds there and writes none of it), and a padding row's A values are (W = 0) read at
        // the pixel's own place and then replaced by 0 (a select, not a branch, so the loads of all
        // m-tiles can be issued ahead of their multiplies: a branch per m-tile and per row had made the
        // loop several times the instructions of its loads and multiplies) or (W > 0) read from the
        // zeroed stretch.
        for (u32 k0 = 0; k0 < valid; k0 += 8) {
            int lo = row_offset[k0 + tg], hi = row_offset[k0 + tg + 4];
            float b[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                b[nt][0] = lds(&wt[k0 + tg][nt * 8 + g]);
                b[nt][1] = lds(&wt[k0 + tg + 4][nt * 8 + g]);
            }
            if constexpr (W > 0) {
                const float* at_lo = tile + base + (lo >= 0 ? lo : zero_row);
                const float* at_hi = tile + base + (hi >= 0 ? hi : zero_row);
#pragma unroll
                for (int mt = 0; mt < TILES; ++mt) {
                    float a[4] = {lds(at_lo + tc_place<W>(16 * mt)), lds(at_lo + tc_place<W>(16 * mt + 8)),
                                  lds(at_hi + tc_place<W>(16 * mt)), lds(at_hi + tc_place<W>(16 * mt + 8))};
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], a, b[nt]);
                }
            } else {
                bool lo_ok = lo >= 0, hi_ok = hi >= 0;
                lo = max(lo, 0), hi = max(hi, 0);
#pragma unroll
                for (int mt = 0; mt < TILES; ++mt) {
                    float a0 = lds(place[mt][0] + lo), a1 = lds(place[mt][1] + lo);
                    float a2 = lds(place[mt][0] + hi), a3 = lds(place[mt][1] + hi);
                    float a[4] = {lo_ok ? a0 : 0.0f, lo_ok ? a1 : 0.0f, hi_ok ? a2 : 0.0f, hi_ok ? a3 : 0.0f};
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], a, b[nt]);
                }
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < TILES; ++mt) {
        if ((u32)mt >= tiles) break;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            u32 p = first + mt * 16 + g + 8 * half;
            if (p >= pixels) continue;
            // W > 0: the plane a constant (its division a shift; SQUARE is 1 for W = 0, never used).
            constexpr u32 SQUARE = W > 0 ? W * W : 1;
            u32 pl = W > 0 ? SQUARE : plane;
            u32 i = W > 0 ? p / SQUARE : fdiv(p, f_plane), q = p - i * pl;
            float* out = y + ((u64)e * batch + b0 + i) * c_out * pl + q;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    u32 o = o0 + nt * 8 + 2 * tg + j;
                    if (o < c_out) out[(u64)o * pl] = acc[mt][nt][2 * half + j];
                }
        }
    }
    if (stats) tc_block_stats<NT, WARPS, STAGE>(acc, tile, tiles, first, pixels, o0, c_out, stats);
}

// The weight gradient on the tensor cores: per env dWᵀ (K × c_out) = Σ over pixels of A (K × pixels) ·
// dY (pixels × c_out), A's column for a pixel its 3×3 windows (the forward's rows, transposed) read
// from the staged tile. Block (run, (s-chunk, o-group), env) as conv3x3_wgrad_direct_f32's, with
// output groups of NT·8 channels: its run of image groups (1024 / (h·w) images each) staged group by
// group; m-tiles are the chunk's (channel, tap) rows (36 → three of 16), n-tiles the output channels,
// and each k-step 8 pixels, warp v taking the k-steps v, v + 8, …; dy read from global memory, rounded
// to TF32. Pixels past the group's images read 0 on both sides (W = 0; W > 0 stops at the last image's
// k-step). Then the 8 warps' sums are added in
// warp order through shared memory and the block writes partial[e][run][o][s·9 + tap];
// conv2d_wgrad_reduce_f32 adds the runs in order.
//
// W > 0: the kernel for square W × W planes (W = 8, 16, 32), dy read as it is or (BN_POOLED, below)
// computed from the pool's gradient (batch norm on load from the ReLU's takes W = 0): a lane's pixels at k-step j lie tc_place<W>(64·j) from its
// first k-step's in the tile and a constant number of images and pixels from them in dy, so the
// k-steps are unrolled with every load at a fixed offset from a per-lane pointer and no division or
// select per step (the W = 0 loop finds each step's pixel with two divisions and selects past the
// group's pixels); a group's k-steps past its images (the last group of a batch) end the loop for the
// whole block. The same k-steps in the same order: the same sums, bit for bit.
//
// BN_POOLED (W > 0 only): dy is batch norm's input gradient computed as it is loaded (BN_LOAD_POOLED:
// from batch norm's input bn.x, the pool's output gradient bn.dy routed through bn.argmax, and the
// pair's coefficients), with load_or_bn's operations — the same values, so the same sums, as the
// plain kernel on the gradient batch_norm_backward_input_from_f32 writes. A lane's two pixels lie side
// by side at an even column, so they share their 2×2 window: one argmax and one pooled gradient for
// both, at a window a constant number of windows from the lane's first (the k-steps' rows are even:
// 64·j / W is). The launcher takes it where each value is loaded once (one input-channel chunk and one
// output group: the host's first block), so the gradient is never written nor read back.
#define TC_WG_TILES ((DC_CHUNK * 9 + 15) / 16)
// What the square weight gradients load from global memory for one k-step and one n-tile: dy at the
// lane's two pixels (v), or with BN_POOLED batch norm's input there (v), the pair's window's pooled
// gradient and its winner. TC_WG_BATCH: the k-steps whose loads are issued together (1, 2, 4, 8 or 16;
// `ESPER_CUDA_WG_BATCH=N` adds -DTC_WG_BATCH=N to NVRTC's options, to measure them).
struct WgradLoad {
    float2 v;
    float pooled;
    u32 won;
};
#ifndef TC_WG_BATCH
#define TC_WG_BATCH 4
#endif
static_assert(TC_WG_BATCH == 1 || TC_WG_BATCH == 2 || TC_WG_BATCH == 4 || TC_WG_BATCH == 8 || TC_WG_BATCH == 16,
              "a batch of k-steps divides an image group's 16");
template <int NT, int W, bool BN_POOLED = false>
__device__ __forceinline__ void conv3x3_wgrad_tc(
    const float* x, const float* dy, float* partial, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 runs,
    u32 groups_per_run, BnLoad bn) {
    BnLoad none = bn_load(nullptr, nullptr, nullptr, nullptr, BN_LOAD_NONE);
    constexpr u32 TILE = tc_tile_floats<W, true>();
    __shared__ __align__(16) float tile[tc_stage_floats<W, true>()];
    float* raw = tile + TILE;  // W > 0: where cp.async lands the next image group (CP_ASYNC)
    static_assert(TILE % 4 == 0, "raw: 16-byte aligned");
    u32 t = threadIdx.x, lane = t % 32, warp = t / 32, g = lane / 4, tg = lane % 4;
    u32 e = blockIdx.z, run = blockIdx.x;
    u32 o_groups = (c_out + NT * 8 - 1) / (NT * 8);
    u32 s0 = (blockIdx.y / o_groups) * DC_CHUNK, o0 = (blockIdx.y % o_groups) * (NT * 8);
    u32 chunk = min((u32)DC_CHUNK, c_in - s0), valid = chunk * 9;
    u32 plane = h * w, per_block = TC_PIXELS / plane;
    TileStrides ts = tc_strides<W, true>(h, w);
    StageDivs divs = stage_divs(h, w);
    FastDiv f_plane = divs.plane, f_w = divs.w;
    FastDiv f_chunk = chunk_div(chunk);
    u32 groups = (batch + per_block - 1) / per_block;
    u32 first = run * groups_per_run, last = min(first + groups_per_run, groups);
    u32 m_tiles = (valid + 15) / 16;

    // This lane's rows of A: (channel, tap) rows g and g + 8 of each m-tile (past `valid`: read at the
    // pixel's own place, finite-or-not, and never written).
    int row[TC_WG_TILES][2];
#pragma unroll
    for (int mt = 0; mt < TC_WG_TILES; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) row[mt][half] = max(tc_row_offset(mt * 16 + g + 8 * half, valid, ts), 0);

    float acc[TC_WG_TILES][NT][4];
#pragma unroll
    for (int mt = 0; mt < TC_WG_TILES; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;

    // W > 0: the lane's A rows at its first k-step's pixel p0 = 8·warp + 2·tg (< 64, in the group's
    // first image for W ≥ 8), and its dy channels' planes at p0. A lane whose channel lies past c_out
    // reads channel c_out − 1 instead: its products land in columns of dW that are never written, as the
    // rows past `valid` do (all TC_WG_TILES m-tiles run: no branch per step).
    constexpr u32 PLANE = W * W;
    u32 p0 = warp * 8 + 2 * tg;
    const float* a_row[W > 0 ? TC_WG_TILES : 1][2];
    const float* dy_lane[W > 0 ? NT : 1];
    if constexpr (W > 0) {
        static_assert(W == 8 || W == 16 || W == 32, "tc_place's k-step offsets hold for W = 8, 16, 32");
#pragma unroll
        for (int mt = 0; mt < TC_WG_TILES; ++mt)
#pragma unroll
            for (int half = 0; half < 2; ++half) a_row[mt][half] = tile + tc_place<W, true>(p0) + row[mt][half];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            u32 o = o0 + nt * 8 + g;
            dy_lane[nt] = dy + ((u64)e * batch * c_out + min(o, c_out - 1)) * PLANE + p0;
        }
    }
    // BN_POOLED: the lane's batch-norm input at p0 (dy_lane's places in bn.x), its pixels' window in the
    // pooled planes and their places k_win, k_win + 1 in it, and its channels' coefficients.
    static_assert(!BN_POOLED || W > 0, "batch norm on load in the square kernels only");
    constexpr u32 WINDOWS = PLANE / 4;
    const float* x_lane[BN_POOLED ? NT : 1];
    const float* pooled_lane[BN_POOLED ? NT : 1];
    const u8* argmax_lane[BN_POOLED ? NT : 1];
    float coef[BN_POOLED ? NT : 1][BN_COEF];
    u32 k_win = 0;
    if constexpr (BN_POOLED) {
        u32 lane_row = p0 / W, lane_col = p0 % W, window = (lane_row / 2) * (W / 2) + lane_col / 2;
        k_win = (lane_row % 2) * 2;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            u32 o = min(o0 + nt * 8 + g, c_out - 1);
            u64 plane0 = (u64)e * batch * c_out + o;  // image 0's plane of channel o
            x_lane[nt] = bn.x + plane0 * PLANE + p0;
            pooled_lane[nt] = bn.dy + plane0 * WINDOWS + window;
            argmax_lane[nt] = bn.argmax + plane0 * WINDOWS + window;
#pragma unroll
            for (int c = 0; c < BN_COEF; ++c) coef[nt][c] = bn.coef[((u64)e * c_out + o) * BN_COEF + c];
        }
    }

    // CP_ASYNC (W > 0, x read as it is): image group gi + 1's x is copied into raw by cp.async before
    // group gi's k-steps and landed in the tile after them, as the forward's chunks are (conv3x3_tc), so
    // that its loads wait behind the block's own multiplies rather than between two barriers. The same
    // cells: the same sums, bit for bit.
    bool prefetch = CP_ASYNC && W > 0 && stage_reads_quads(x, none);
    auto images_of = [&](u32 gi) { return min(per_block, batch - gi * per_block); };
    auto fetch = [&](u32 gi) {
        if constexpr (W > 0)
            square_stage_issue<W, 256>(raw, x, e, batch, c_in, s0, chunk, gi * per_block, images_of(gi), divs, f_chunk);
    };
    if (prefetch && first < last) fetch(first);
    for (u32 gi = first; gi < last; ++gi) {
        u32 b0 = gi * per_block, images = images_of(gi), pixels = images * plane;
        __syncthreads();  // the previous group's reads are done
        if (prefetch) {
            if constexpr (W > 0)
                square_stage_land<W, 256>(tile, raw, chunk, ts, images, divs, f_chunk, gi == first, true);
        } else {
            dc_stage<W>(tile, x, e, batch, c_in, s0, chunk, ts, b0, images, h, w, divs, f_chunk, gi == first, true,
                        none);
        }
        if (prefetch && gi + 1 < last) fetch(gi + 1);  // this thread's part of raw is landed: reuse it
        __syncthreads();
        if constexpr (W > 0) {
            u64 group_at = (u64)b0 * c_out * PLANE, image_stride = (u64)c_out * PLANE;
            // What k-step j (pixels 64·j + p0 and the next, in image 64·j / W² of the group) loads from
            // global memory for n-tile nt: the lane's two pixels side by side at an even index of dy (p0,
            // q, the planes and the images' strides are even), which a whole allocation starts 256-byte
            // aligned: one 8-byte load; with BN_POOLED batch norm's input there, the pair's window's
            // pooled gradient and its winner (dy_at / 4: the window, its row 64·j / W even).
            auto load = [&](u32 j, int nt) {
                u64 dy_at = group_at + (u64)(64 * j / PLANE) * image_stride + 64 * j % PLANE;  // in dy's planes
                WgradLoad l{};  // the fields a kernel does not load stay 0
                if constexpr (BN_POOLED) {
                    l.v = *reinterpret_cast<const float2*>(x_lane[nt] + dy_at);
                    l.pooled = pooled_lane[nt][dy_at / 4];
                    l.won = argmax_lane[nt][dy_at / 4];
                } else {
                    l.v = *reinterpret_cast<const float2*>(dy_lane[nt] + dy_at);
                }
                return l;
            };
            // k-step j's multiplies from its loads (at: the pixels' place in the tile).
            auto multiply = [&](u32 j, const WgradLoad (&l)[NT]) {
                u32 at = tc_place<W, true>(64 * j);
                float b[NT][2];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if constexpr (BN_POOLED) {
                        // Batch norm's input gradient at both pixels (load_or_bn's operations).
                        b[nt][0] = tf32_round(bn_window_input_grad(coef[nt], l[nt].v.x, l[nt].won, k_win, l[nt].pooled));
                        b[nt][1] = tf32_round(bn_window_input_grad(coef[nt], l[nt].v.y, l[nt].won, k_win + 1, l[nt].pooled));
                    } else {
                        b[nt][0] = tf32_round(l[nt].v.x);
                        b[nt][1] = tf32_round(l[nt].v.y);
                    }
                }
#pragma unroll
                for (int mt = 0; mt < TC_WG_TILES; ++mt) {
                    float a[4] = {lds(a_row[mt][0] + at), lds(a_row[mt][1] + at), lds(a_row[mt][0] + at + 1),
                                  lds(a_row[mt][1] + at + 1)};
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], a, b[nt]);
                }
            };
            // The group's k-steps (64 pixels each) that lie in its images: all 16 but in the last group of
            // a batch that does not fill it. The same for the whole block.
            u32 steps = min((u32)TC_PIXELS / 64, images * (PLANE / 64));
            // TC_WG_BATCH k-steps at a time: first every global load of the batch, then its multiplies,
            // with no branch between them (ptxas sinks a load past a branch to its first use). One k-step
            // at a time (TC_WG_BATCH 1, as before), each step's load was used a dozen instructions after
            // it was issued, and the next step's load came after the early exit between them: a warp
            // waited a global load's whole latency per k-step, 16 an image group (the SASS: LDG, then
            // FSETP on its result). A batch waits once. A batch past `steps` in part (a last group of
            // fewer images than the batch's k-steps span: W = 8, or W = 16 at batches of 8 and 16) runs
            // step by step: the same k-steps in the same order either way, so the same sums, bit for bit.
#pragma unroll
            for (u32 j0 = 0; j0 < TC_PIXELS / 64; j0 += TC_WG_BATCH) {
                if (j0 >= steps) break;  // the same for the whole block
                if (j0 + TC_WG_BATCH <= steps) {
                    WgradLoad ld[TC_WG_BATCH][NT];
#pragma unroll
                    for (u32 jj = 0; jj < TC_WG_BATCH; ++jj)
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) ld[jj][nt] = load(j0 + jj, nt);
#pragma unroll
                    for (u32 jj = 0; jj < TC_WG_BATCH; ++jj) multiply(j0 + jj, ld[jj]);
                } else {
                    for (u32 j = j0; j < steps; ++j) {
                        WgradLoad ld[NT];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt) ld[nt] = load(j, nt);
                        multiply(j, ld);
                    }
                }
            }
        } else {
            for (u32 k0 = warp * 8; k0 < pixels; k0 += 64) {
                // This lane's two pixels, the step's k rows tg and tg + 4: pixel k0 + 2·tg and the next one, side
                // by side in a row (w and the group's pixels are even), so that the four lanes of an output
                // channel read 8 adjacent values of dy; their place in the tile and in dy. Past the group's
                // pixels both read pixel 0's place and count 0 (a select, not a branch).
                u32 p = k0 + 2 * tg;
                bool ok = p < pixels;
                p = ok ? p : 0;
                u32 i = fdiv(p, f_plane), q = p - i * plane, yy = fdiv(q, f_w), xx = q - yy * w;
                int place = (int)(i * ts.image + yy * ts.row + xx);
                u64 dy_plane = ((u64)e * batch + b0 + i) * c_out;
                float b[NT][2];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    u32 o = o0 + nt * 8 + g;
#pragma unroll
                    for (int half = 0; half < 2; ++half)
                        b[nt][half] = ok && o < c_out ? tf32_round(load_or_bn(dy, bn, e, c_out, o, dy_plane + o, yy,
                                                                              xx + half, h, w))
                                                      : 0.0f;
                }
#pragma unroll
                for (int mt = 0; mt < TC_WG_TILES; ++mt) {
                    if ((u32)mt >= m_tiles) break;  // the same for the whole block
                    float a0 = lds(tile + place + row[mt][0]), a1 = lds(tile + place + row[mt][1]);
                    float a2 = lds(tile + place + 1 + row[mt][0]), a3 = lds(tile + place + 1 + row[mt][1]);
                    float a[4] = {ok ? a0 : 0.0f, ok ? a1 : 0.0f, ok ? a2 : 0.0f, ok ? a3 : 0.0f};
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_tf32(acc[mt][nt], a, b[nt]);
                }
            }
        }
    }

    // The warps' sums in warp order: warp v's value for (row j, channel n) at
    // tile[(v·16·TC_WG_TILES + j)·NT·8 + n].
    constexpr u32 ROWS = 16 * TC_WG_TILES, COLS = NT * 8;
    static_assert(8 * ROWS * COLS <= tc_stage_floats<W, true>(), "the warps' sums fit the staging");
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < TC_WG_TILES; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                u32 j = mt * 16 + g + 8 * (q / 2), n = nt * 8 + 2 * tg + q % 2;
                tile[(warp * ROWS + j) * COLS + n] = acc[mt][nt][q];
            }
    __syncthreads();
    for (u32 l = t; l < ROWS * COLS; l += 256) {
        u32 j = l / COLS, n = l % COLS, o = o0 + n;
        if (j >= valid || o >= c_out) continue;
        float sum = 0.0f;
        for (u32 v = 0; v < 8; ++v) sum += tile[(v * ROWS + j) * COLS + n];
        partial[(((u64)e * runs + run) * c_out + o) * c_in * 9 + s0 * 9 + j] = sum;
    }
}

// n8: output channels in one n-tile (c_out ≤ 8), n16: two (more blocks past 16). BLOCKS: the blocks an SM
// each kernel's launch bounds ask for, so that ptxas keeps a thread's registers within 65 536 /
// (threads · BLOCKS), rounded down to 8 (at 256 threads: 128, 80, 64). The kernels wait on their
// loads with little else to issue (ncu: 25 % occupancy at two blocks of 8 warps, issue slots 26–57 %
// busy), so each asks for as many as it takes without spilling in its loops (ptxas -v, sm_90: the n8
// forwards fit 80 registers, the n8 and w8 weight gradients 64 — n8 w32 with three registers spilled,
// reloaded once an image group, outside its k-steps — and the n16 w16 one 80); the general n16
// weight gradient and the w32 one keep two (spills in the staging). With the weight gradients' loads
// batched (TC_WG_BATCH 4) the counts hold: ptxas issues the n16 w8's eight loads of a batch ahead of its
// multiplies at 64 registers for the first batch and four ahead for the others, and the n8 w8 spills 20
// bytes in its set-up and its step-by-step tail, not in a full batch. Shared memory does not limit
// them on sm_90: with CP_ASYNC's 16 KB and the spaced tiles (square_strides) a square forward block
// takes 42–47 KB and a square weight gradient's 39–48 KB (W = 8's, the most: 48 976 bytes), so an SM's
// 228 KB holds four of any (five of the W = 16 and 32 weight gradients), as many as their launch
// bounds ask for. (On sm_80's 164 KB the W = 16 and 8 weight gradients fit three, not four.)
// TC_MIN_BLOCKS (`ESPER_CUDA_TC_MIN_BLOCKS=N` adds it to NVRTC's options) gives every kernel N (the
// 512-thread forwards at most 4: TC_FIT), to measure the two; N = 2 is what they all had.
//
// The square n16 forwards hold 64 accumulators a thread at 8 warps of 8 m-tiles (126 registers; at
// three blocks an SM they spill 192 bytes in the K loop), so they run 16 warps of 4 m-tiles instead
// (TC_N16_WARPS): 64 registers, two blocks of 512 threads an SM, 50 % occupancy, with the K loop
// spill-free (ptxas spills a few registers in the staging). The same pixels a block, so the same grid
// and the same bits; the launcher gives them 512 threads. TC_N16_NARROW (`ESPER_CUDA_TC_WIDE=0`)
// builds them with 8 warps again, and the launcher then gives 256.
#ifdef TC_MIN_BLOCKS
#define TC_BLOCKS(n) TC_MIN_BLOCKS
#else
#define TC_BLOCKS(n) n
#endif
#ifdef TC_N16_NARROW
#define TC_N16_WARPS 8
#else
#define TC_N16_WARPS 16
#endif
// At most 2 048 threads an SM: TC_MIN_BLOCKS past that for the 512-thread forwards is capped at 4.
#define TC_FIT(WARPS, n) ((n) * (WARPS) > 64 ? 64 / (WARPS) : (n))
#define TC_CONV_KERNEL(NAME, NT, W, WARPS, BLOCKS)                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, TC_FIT(WARPS, TC_BLOCKS(BLOCKS))) NAME(            \
        const float* x, const float* weight, float* y, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, int flip,   \
        BN_ARGS, double* stats) {                                                                               \
        conv3x3_tc<NT, W, WARPS>(x, weight, y, batch, c_in, c_out, h, w, flip, BN_LOAD, stats);                 \
    }
#define TC_WGRAD_KERNEL_BN(NAME, NT, W, BN_POOLED, BLOCKS)                                                      \
    extern "C" __global__ void __launch_bounds__(256, TC_BLOCKS(BLOCKS)) NAME(                                  \
        const float* x, const float* dy, float* partial, u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 runs, \
        u32 groups_per_run, BN_ARGS) {                                                                          \
        conv3x3_wgrad_tc<NT, W, BN_POOLED>(x, dy, partial, batch, c_in, c_out, h, w, runs, groups_per_run,      \
                                           BN_LOAD);                                                            \
    }
#define TC_WGRAD_KERNEL(NAME, NT, W, BLOCKS) TC_WGRAD_KERNEL_BN(NAME, NT, W, false, BLOCKS)
TC_CONV_KERNEL(conv3x3_tc_n8_tf32, 1, 0, 8, 2)
TC_CONV_KERNEL(conv3x3_tc_n8_w8_tf32, 1, 8, 8, 3)
TC_CONV_KERNEL(conv3x3_tc_n8_w16_tf32, 1, 16, 8, 3)
TC_CONV_KERNEL(conv3x3_tc_n8_w32_tf32, 1, 32, 8, 3)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n8_tf32, 1, 0, 3)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n8_w8_tf32, 1, 8, 4)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n8_w16_tf32, 1, 16, 4)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n8_w32_tf32, 1, 32, 4)
TC_CONV_KERNEL(conv3x3_tc_n16_tf32, 2, 0, 8, 2)
TC_CONV_KERNEL(conv3x3_tc_n16_w8_tf32, 2, 8, TC_N16_WARPS, 2)
TC_CONV_KERNEL(conv3x3_tc_n16_w16_tf32, 2, 16, TC_N16_WARPS, 2)
TC_CONV_KERNEL(conv3x3_tc_n16_w32_tf32, 2, 32, TC_N16_WARPS, 2)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n16_tf32, 2, 0, 2)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n16_w8_tf32, 2, 8, 4)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n16_w16_tf32, 2, 16, 3)
TC_WGRAD_KERNEL(conv3x3_wgrad_tc_n16_w32_tf32, 2, 32, 2)
// Batch norm's input gradient on load (BN_POOLED), blocks by the same rule (ptxas -v, sm_90): the n8
// ones 4 (n8 w32, the host's first block, with two registers spilled and reloaded once an image group,
// outside its k-steps), n16 w8 3 (79 registers; at 4 it spills 36 bytes), n16 w16 and w32 2.
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n8_w8_bnpool_tf32, 1, 8, true, 4)
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n8_w16_bnpool_tf32, 1, 16, true, 4)
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n8_w32_bnpool_tf32, 1, 32, true, 4)
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n16_w8_bnpool_tf32, 2, 8, true, 3)
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n16_w16_bnpool_tf32, 2, 16, true, 2)
TC_WGRAD_KERNEL_BN(conv3x3_wgrad_tc_n16_w32_bnpool_tf32, 2, 32, true, 2)
