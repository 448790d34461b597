// Runs kernels of kernels/cuda/ on the CPU through shim.hpp and checks them against slow references
// written here from their definitions: the direct 3×3 convolution and the implicit GEMM (forward and
// input gradient, bit for bit: one fmaf chain per output over j = s·9 + ky·3 + kx from +0), the direct
// and implicit weight gradients (to 1e-5 of the largest, against a double sum), the tensor-core (TF32)
// 3×3 convolutions (on inputs rounded to TF32, to 1e-5), and batch norm's split reductions
// (to 1e-6 of a double two-pass sum), the fused normalisation + ReLU + pool and batch norm's fused
// backwards against the kernels one by one, and the staged backwards reading batch norm's gradient on
// load against the same kernels on it written (bit for bit), group norm forward and input gradient
// against the CPU's lane sums (bit for bit) and its parameter gradients against double sums, and the
// head's per-env cross-entropy (bit for bit, samples in order) and correct counts.
// `bash scripts/kernel-emulator/run.sh`.
#include "shim.hpp"

typedef unsigned char u8;
#include "../../kernels/cuda/common.cuh"
#include "../../kernels/cuda/conv.cu"
#include "../../kernels/cuda/batchnorm.cu"
#include "../../kernels/cuda/pool.cu"
#include "../../kernels/cuda/activation.cu"
#undef NORM_EPS  // batchnorm.cu's (a double) and seeds.cu's (a float), each its own file on the device
#include "../../kernels/cuda/seeds.cu"
#include "../../kernels/cuda/head.cu"
#include "../../kernels/cuda/data.cu"

// The staged kernels' batch-norm arguments where they read their tensor.
#define NO_BN nullptr, nullptr, nullptr, nullptr, BN_LOAD_NONE

// The width of the square-plane tensor-core kernels the launcher takes for h × w planes (gemm_conv.rs's
// Staged::square): 8, 16 or 32 where h = w is one of them, else 0 (the general kernels).
static unsigned tc_square(unsigned h, unsigned w) { return h == w && (w == 8 || w == 16 || w == 32) ? w : 0; }

// The tensor-core kernels by n-tiles (one, two) and plane (general, square of 8, 16, 32), with their names.
template <typename F>
struct Named {
    F kernel;
    const char* name;
};
#define NAMED(K) {K, #K}
static const Named<decltype(&conv3x3_tc_n8_tf32)> TC_FORWARDS[2][4] = {
    {NAMED(conv3x3_tc_n8_tf32), NAMED(conv3x3_tc_n8_w8_tf32), NAMED(conv3x3_tc_n8_w16_tf32), NAMED(conv3x3_tc_n8_w32_tf32)},
    {NAMED(conv3x3_tc_n16_tf32), NAMED(conv3x3_tc_n16_w8_tf32), NAMED(conv3x3_tc_n16_w16_tf32),
     NAMED(conv3x3_tc_n16_w32_tf32)}};
static const Named<decltype(&conv3x3_wgrad_tc_n8_tf32)> TC_WGRADS[2][4] = {
    {NAMED(conv3x3_wgrad_tc_n8_tf32), NAMED(conv3x3_wgrad_tc_n8_w8_tf32), NAMED(conv3x3_wgrad_tc_n8_w16_tf32),
     NAMED(conv3x3_wgrad_tc_n8_w32_tf32)},
    {NAMED(conv3x3_wgrad_tc_n16_tf32), NAMED(conv3x3_wgrad_tc_n16_w8_tf32), NAMED(conv3x3_wgrad_tc_n16_w16_tf32),
     NAMED(conv3x3_wgrad_tc_n16_w32_tf32)}};
// The square weight gradients computing batch norm's input gradient from the pool's on load, by n-tiles
// and width (8, 16, 32).
static const Named<decltype(&conv3x3_wgrad_tc_n8_tf32)> TC_WGRADS_BN_POOLED[2][3] = {
    {NAMED(conv3x3_wgrad_tc_n8_w8_bnpool_tf32), NAMED(conv3x3_wgrad_tc_n8_w16_bnpool_tf32),
     NAMED(conv3x3_wgrad_tc_n8_w32_bnpool_tf32)},
    {NAMED(conv3x3_wgrad_tc_n16_w8_bnpool_tf32), NAMED(conv3x3_wgrad_tc_n16_w16_bnpool_tf32),
     NAMED(conv3x3_wgrad_tc_n16_w32_bnpool_tf32)}};
#undef NAMED

// The tables' column for width `sq` (0: the general kernel).
static unsigned square_column(unsigned sq) { return sq == 0 ? 0 : sq == 8 ? 1 : sq == 16 ? 2 : 3; }

// The threads a block of that forward runs: the square n16 forwards' TC_N16_WARPS warps (16, or 8 built
// with -DTC_N16_NARROW), 256 for the others (conv.cu; the launcher's Staged::conv_threads).
static unsigned tc_threads(unsigned nt, unsigned sq) { return nt == 2 && sq != 0 ? 32 * TC_N16_WARPS : 256; }

// conv3x3_tc_n{8,16}[_w{8,16,32}]_tf32 by n-tiles and width (0: the general kernel), its name in `name`
// (written by one emulated thread: they run at once).
static void tc_forward(unsigned nt, unsigned sq, const char** name, const float* x, const float* weight, float* y,
                       u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, int flip, const float* bn_x, const float* bn_dy,
                       const u8* bn_argmax, const float* bn_coef, int bn_mode, double* stats) {
    const auto& k = TC_FORWARDS[nt - 1][square_column(sq)];
    if (threadIdx.x == 0) *name = k.name;
    k.kernel(x, weight, y, batch, c_in, c_out, h, w, flip, bn_x, bn_dy, bn_argmax, bn_coef, bn_mode, stats);
}

// conv3x3_wgrad_tc_n{8,16}[_w{8,16,32}]_tf32 likewise.
static void tc_wgrad(unsigned nt, unsigned sq, const char** name, const float* x, const float* dy, float* partial,
                     u32 batch, u32 c_in, u32 c_out, u32 h, u32 w, u32 runs, u32 per_run, const float* bn_x,
                     const float* bn_dy, const u8* bn_argmax, const float* bn_coef, int bn_mode) {
    const auto& k = TC_WGRADS[nt - 1][square_column(sq)];
    if (threadIdx.x == 0) *name = k.name;
    k.kernel(x, dy, partial, batch, c_in, c_out, h, w, runs, per_run, bn_x, bn_dy, bn_argmax, bn_coef, bn_mode);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(float lo, float hi) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng_state >> 40) * (1.0 / (1ull << 24)));
}
static std::vector<float> values(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
}
static bool same_bits(float a, float b) { return __float_as_uint(a) == __float_as_uint(b); }

static int failures = 0, checks = 0;
static void report(const char* what, bool ok, const char* detail) {
    ++checks;
    if (!ok) ++failures;
    std::printf("%-58s %s %s\n", what, ok ? "ok  " : "FAIL", detail);
}

// A 3×3, padding 1 convolution of x [E, B, c_in, h, w] into [E, B, c_out, h, w]; with flip the input
// gradient's form (weights [E, c_in, c_out, 3, 3] read at the flipped tap).
static std::vector<float> conv_reference(const std::vector<float>& x, const std::vector<float>& w, unsigned envs,
                                         unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned wd,
                                         bool flip) {
    std::vector<float> y((size_t)envs * batch * c_out * h * wd);
    for (unsigned e = 0; e < envs; ++e)
        for (unsigned b = 0; b < batch; ++b)
            for (unsigned o = 0; o < c_out; ++o)
                for (unsigned yy = 0; yy < h; ++yy)
                    for (unsigned xx = 0; xx < wd; ++xx) {
                        float acc = 0.0f;
                        for (unsigned s = 0; s < c_in; ++s)
                            for (unsigned tap = 0; tap < 9; ++tap) {
                                int iy = (int)yy + (int)(tap / 3) - 1, ix = (int)xx + (int)(tap % 3) - 1;
                                float v = 0.0f;
                                if (iy >= 0 && iy < (int)h && ix >= 0 && ix < (int)wd)
                                    v = x[((((size_t)e * batch + b) * c_in + s) * h + iy) * wd + ix];
                                float k = flip ? w[(((size_t)e * c_in + s) * c_out + o) * 9 + (8 - tap)]
                                               : w[(((size_t)e * c_out + o) * c_in + s) * 9 + tap];
                                acc = fmaf(k, v, acc);
                            }
                        y[((((size_t)e * batch + b) * c_out + o) * h + yy) * wd + xx] = acc;
                    }
    return y;
}

static void check_conv(unsigned envs, unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w) {
    for (int flip = 0; flip < 2; ++flip) {
        // The kernel's view: with flip, its input is the output gradient (c_out channels of the
        // forward's) and its output the input gradient.
        unsigned k_in = flip ? c_out : c_in, k_out = flip ? c_in : c_out;
        auto x = values((size_t)envs * batch * k_in * h * w, -1.0f, 1.0f);
        auto weight = values((size_t)envs * c_out * c_in * 9, -0.5f, 0.5f);
        auto want = conv_reference(x, weight, envs, batch, k_in, k_out, h, w, flip);
        char what[160], detail[160];
        // The direct kernel, over junk.
        std::vector<float> y(want.size(), NAN);
        unsigned per_block = 1024 / (h * w);
        launch({(batch + per_block - 1) / per_block, (k_out + 7) / 8, envs}, {256, 1, 1}, [&] {
            conv3x3_direct_f32(x.data(), weight.data(), y.data(), batch, k_in, k_out, h, w, flip, NO_BN);
        });
        size_t wrong = 0;
        for (size_t i = 0; i < y.size(); ++i) wrong += !same_bits(y[i], want[i]);
        std::snprintf(what, sizeof what, "conv3x3_direct_f32 %s E%u B%u %u→%u %u×%u", flip ? "dx" : "y ", envs,
                      batch, k_in, k_out, h, w);
        std::snprintf(detail, sizeof detail, "%zu of %zu outputs differ in bits", wrong, y.size());
        report(what, wrong == 0, detail);
        // The implicit GEMM on the same inputs: checked bit for bit on an H100, so it checks the emulator.
        std::vector<float> z(want.size(), NAN);
        unsigned columns = batch * h * w;
        dim3 grid{(columns + 127) / 128, (k_out + 7) / 8, envs};
        launch(grid, {256, 1, 1}, [&] {
            conv2d_implicit_m8_f32(x.data(), weight.data(), z.data(), batch, k_in, k_out, h, w, 3, 1, flip);
        });
        wrong = 0;
        for (size_t i = 0; i < z.size(); ++i) wrong += !same_bits(z[i], want[i]);
        std::snprintf(what, sizeof what, "conv2d_implicit_m8_f32 %s E%u B%u %u→%u %u×%u", flip ? "dx" : "y ", envs,
                      batch, k_in, k_out, h, w);
        std::snprintf(detail, sizeof detail, "%zu of %zu outputs differ in bits", wrong, z.size());
        report(what, wrong == 0, detail);
    }
}

// The 3×3 (padding 1) weight gradient [E, c_out, c_in, 3, 3] of x and dy, summed in double.
static std::vector<double> wgrad_reference(const std::vector<float>& x, const std::vector<float>& dy, unsigned envs,
                                           unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w) {
    size_t per_env = (size_t)c_out * c_in * 9;
    std::vector<double> want(envs * per_env, 0.0);
    for (unsigned e = 0; e < envs; ++e)
        for (unsigned b = 0; b < batch; ++b)
            for (unsigned o = 0; o < c_out; ++o)
                for (unsigned s = 0; s < c_in; ++s)
                    for (unsigned tap = 0; tap < 9; ++tap)
                        for (unsigned yy = 0; yy < h; ++yy)
                            for (unsigned xx = 0; xx < w; ++xx) {
                                int iy = (int)yy + (int)(tap / 3) - 1, ix = (int)xx + (int)(tap % 3) - 1;
                                if (iy < 0 || iy >= (int)h || ix < 0 || ix >= (int)w) continue;
                                double g = dy[((((size_t)e * batch + b) * c_out + o) * h + yy) * w + xx];
                                double v = x[((((size_t)e * batch + b) * c_in + s) * h + iy) * w + ix];
                                want[e * per_env + (o * c_in + s) * 9 + tap] += g * v;
                            }
    return want;
}

// TF32 as cvt.rna makes it, written from its definition: to the nearest multiple of 2^(exponent − 10),
// halves away from zero (std::round). Finite values only.
static float tf32_reference(float x) {
    if (x == 0.0f) return x;
    double ulp = std::ldexp(1.0, std::ilogb(x) - 10);
    return (float)(std::round(x / ulp) * ulp);
}
static std::vector<float> tf32_all(std::vector<float> v) {
    for (auto& x : v) x = tf32_reference(x);
    return v;
}

// The largest difference of `got` from `want`, relative to want's largest magnitude (NaN: infinite).
template <typename T>
static double diff_of_largest(const std::vector<float>& got, const std::vector<T>& want) {
    double largest = 0.0, worst = 0.0;
    for (T v : want) largest = std::max(largest, std::fabs((double)v));
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - (double)want[i]) / largest);
    return worst;
}

// The direct weight gradient over `per_run` image groups a run, against a double sum.
static void check_wgrad(unsigned envs, unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w,
                        unsigned per_run) {
    auto x = values((size_t)envs * batch * c_in * h * w, -1.0f, 1.0f);
    auto dy = values((size_t)envs * batch * c_out * h * w, -1.0f, 1.0f);
    size_t depth = (size_t)c_in * 9, per_env = c_out * depth;
    auto want = wgrad_reference(x, dy, envs, batch, c_in, c_out, h, w);
    auto worst_of = [&](const std::vector<float>& dw) { return diff_of_largest(dw, want); };
    char what[160], detail[160];
    {
        unsigned per_block = 1024 / (h * w), groups = (batch + per_block - 1) / per_block;
        unsigned runs = (groups + per_run - 1) / per_run;
        std::vector<float> partial((size_t)envs * runs * per_env, NAN), dw(envs * per_env, NAN);
        unsigned tiles = ((c_in + 3) / 4) * ((c_out + 7) / 8);
        launch({runs, tiles, envs}, {256, 1, 1}, [&] {
            conv3x3_wgrad_direct_f32(x.data(), dy.data(), partial.data(), batch, c_in, c_out, h, w, runs, per_run, NO_BN);
        });
        launch({1, 1, 1}, {256, 1, 1}, [&] {
            conv2d_wgrad_reduce_f32(partial.data(), dw.data(), envs, runs, (unsigned)per_env);
        });
        double worst = worst_of(dw);
        std::snprintf(what, sizeof what, "conv3x3_wgrad_direct_f32 E%u B%u %u→%u %u×%u, %u runs", envs, batch,
                      c_in, c_out, h, w, runs);
        std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (tolerance 1e-5)", worst);
        report(what, worst <= 1e-5, detail);
    }
    {
        // The implicit GEMM's weight gradient (checked on an H100 before): two runs of columns of 16.
        unsigned columns = batch * h * w, chunk_len = ((columns + 1) / 2 + 15) / 16 * 16;
        unsigned chunks = (columns + chunk_len - 1) / chunk_len;
        std::vector<float> partial((size_t)envs * chunks * per_env, NAN), dw(envs * per_env, NAN);
        launch({(unsigned)((depth + 63) / 64), (c_out + 7) / 8, envs * chunks}, {256, 1, 1}, [&] {
            conv2d_wgrad_m8_f32(x.data(), dy.data(), partial.data(), batch, c_in, c_out, h, w, 3, 1, chunks,
                                chunk_len);
        });
        launch({1, 1, 1}, {256, 1, 1}, [&] {
            conv2d_wgrad_reduce_f32(partial.data(), dw.data(), envs, chunks, (unsigned)per_env);
        });
        double worst = worst_of(dw);
        std::snprintf(what, sizeof what, "conv2d_wgrad_m8_f32 E%u B%u %u→%u %u×%u, %u runs", envs, batch, c_in,
                      c_out, h, w, chunks);
        std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (tolerance 1e-5)", worst);
        report(what, worst <= 1e-5, detail);
    }
}

// The tensor-core (TF32) 3×3 convolutions: forward and input gradient against the fmaf reference on the
// same inputs rounded to TF32 (tf32_reference), the weight gradient against the double sum of the
// rounded inputs, `per_run` image groups a run; to 1e-5 of the largest value. Each also against the
// unrounded inputs, where it must differ by more than 1e-5 (the rounding happened). Where the planes are
// square of 8, 16 or 32 the square kernels run too and must give the general kernels' bits.
static void check_tc(unsigned envs, unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w,
                     unsigned per_run) {
    char what[160], detail[160];
    const char* name = "";
    unsigned per_block = 1024 / (h * w), groups = (batch + per_block - 1) / per_block, sq = tc_square(h, w);
    std::vector<unsigned> widths = {0};  // the general kernel first, then the square one
    if (sq) widths.push_back(sq);
    for (int flip = 0; flip < 2; ++flip) {
        unsigned k_in = flip ? c_out : c_in, k_out = flip ? c_in : c_out, nt = k_out <= 8 ? 1 : 2;
        auto x = values((size_t)envs * batch * k_in * h * w, -1.0f, 1.0f);
        auto weight = values((size_t)envs * c_out * c_in * 9, -0.5f, 0.5f);
        auto want = conv_reference(tf32_all(x), tf32_all(weight), envs, batch, k_in, k_out, h, w, flip);
        auto plain = conv_reference(x, weight, envs, batch, k_in, k_out, h, w, flip);
        std::vector<float> general(want.size(), NAN);
        for (unsigned width : widths) {
            std::vector<float> y(want.size(), NAN);
            launch({groups, (k_out + 8 * nt - 1) / (8 * nt), envs}, {tc_threads(nt, width), 1, 1}, [&] {
                tc_forward(nt, width, &name, x.data(), weight.data(), y.data(), batch, k_in, k_out, h, w, flip, NO_BN,
                           nullptr);
            });
            double worst = diff_of_largest(y, want), unrounded = diff_of_largest(y, plain);
            size_t differ = 0;
            if (width == 0) general = y;
            else
                for (size_t i = 0; i < y.size(); ++i) differ += !same_bits(y[i], general[i]);
            std::snprintf(what, sizeof what, "%s %s E%u B%u %u→%u %u×%u", name, flip ? "dx" : "y ", envs, batch, k_in,
                          k_out, h, w);
            std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (1e-5; unrounded %.1e)%s", worst,
                          unrounded, width ? (differ ? "; NOT the general kernel's bits" : "; the general kernel's bits") : "");
            report(what, worst <= 1e-5 && unrounded > 1e-5 && differ == 0, detail);
        }
    }
    unsigned nt = c_out <= 8 ? 1 : 2;
    auto x = values((size_t)envs * batch * c_in * h * w, -1.0f, 1.0f);
    auto dy = values((size_t)envs * batch * c_out * h * w, -1.0f, 1.0f);
    auto want = wgrad_reference(tf32_all(x), tf32_all(dy), envs, batch, c_in, c_out, h, w);
    auto plain = wgrad_reference(x, dy, envs, batch, c_in, c_out, h, w);
    size_t per_env = (size_t)c_out * c_in * 9;
    unsigned runs = (groups + per_run - 1) / per_run;
    unsigned tiles = ((c_in + 3) / 4) * ((c_out + 8 * nt - 1) / (8 * nt));
    std::vector<float> general;
    for (unsigned width : widths) {
        std::vector<float> partial((size_t)envs * runs * per_env, NAN), dw(envs * per_env, NAN);
        launch({runs, tiles, envs}, {256, 1, 1}, [&] {
            tc_wgrad(nt, width, &name, x.data(), dy.data(), partial.data(), batch, c_in, c_out, h, w, runs, per_run, NO_BN);
        });
        launch({1, 1, 1}, {256, 1, 1}, [&] {
            conv2d_wgrad_reduce_f32(partial.data(), dw.data(), envs, runs, (unsigned)per_env);
        });
        double worst = diff_of_largest(dw, want), unrounded = diff_of_largest(dw, plain);
        size_t differ = 0;
        if (width == 0) general = dw;
        else
            for (size_t i = 0; i < dw.size(); ++i) differ += !same_bits(dw[i], general[i]);
        std::snprintf(what, sizeof what, "%s E%u B%u %u→%u %u×%u, %u runs", name, envs, batch, c_in, c_out, h, w, runs);
        std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (1e-5; unrounded %.1e)%s", worst, unrounded,
                      width ? (differ ? "; NOT the general kernel's bits" : "; the general kernel's bits") : "");
        report(what, worst <= 1e-5 && unrounded > 1e-5 && differ == 0, detail);
    }
}

// The passes over shared memory's banks of the tensor-core kernels' K-loop loads (shim.hpp's lds
// count) on the host's and seeds' shapes: forward, input gradient and weight gradient, the general
// kernel beside the square one. The square kernels' tiles are spaced (conv.cu, square_strides) so that
// each load takes one pass: required to within 1.10 passes a load (a last chunk's padding rows may add
// a few); the general kernels' (packed) are printed, not checked. Built with -DTC_PACKED_TILES (the
// square tiles packed again) the checks at W = 16 and 32 and W = 8's weight gradients fail.
static void check_tc_banks(unsigned c_in, unsigned c_out, unsigned side) {
    char what[160], detail[160];
    const char* name = "";
    unsigned per_block = 1024 / (side * side), batch = per_block, envs = 1;
    auto x = values((size_t)batch * std::max(c_in, c_out) * side * side, -1.0f, 1.0f);
    auto dy = values((size_t)batch * c_out * side * side, -1.0f, 1.0f);
    auto weight = values((size_t)c_out * c_in * 9, -0.5f, 0.5f);
    std::vector<float> y((size_t)batch * std::max(c_in, c_out) * side * side), partial((size_t)c_out * c_in * 9);
    for (unsigned width : {0u, side}) {
        for (int pass = 0; pass < 3; ++pass) {  // forward, input gradient, weight gradient
            unsigned k_in = pass == 1 ? c_out : c_in, k_out = pass == 1 ? c_in : c_out;
            unsigned nt = (pass == 2 ? c_out : k_out) <= 8 ? 1 : 2;
            lds_count = LdsCount{};
            lds_counting = true;
            if (pass < 2)
                launch({1, (k_out + 8 * nt - 1) / (8 * nt), envs}, {tc_threads(nt, width), 1, 1}, [&] {
                    tc_forward(nt, width, &name, x.data(), weight.data(), y.data(), batch, k_in, k_out, side, side,
                               pass, NO_BN, nullptr);
                });
            else
                launch({1, ((c_in + 3) / 4) * ((c_out + 8 * nt - 1) / (8 * nt)), envs}, {256, 1, 1}, [&] {
                    tc_wgrad(nt, width, &name, x.data(), dy.data(), partial.data(), batch, c_in, c_out, side, side, 1, 1,
                             NO_BN);
                });
            lds_counting = false;
            double per_load = lds_count.loads ? (double)lds_count.passes / lds_count.loads : 0.0;
            std::snprintf(what, sizeof what, "%s %s %u→%u %u×%u: bank passes", name,
                          pass == 0 ? "y " : pass == 1 ? "dx" : "dW", k_in, k_out, side, side);
            std::snprintf(detail, sizeof detail, "%.3f a load (%llu loads; uneven warps %llu)", per_load,
                          lds_count.loads, lds_count.uneven);
            bool checked = width != 0;
            bool ok = lds_count.loads > 0 && lds_count.uneven == 0 && (!checked || per_load <= 1.10);
            if (checked || !ok)
                report(what, ok, detail);
            else
                std::printf("%-58s info %s\n", what, detail);
        }
    }
}

// Batch norm's training statistics from the tensor-core forward's epilogue: its output the same bits as
// without them, and batch_norm_stats_finish_runs_f32's mean, 1/sqrt(var + eps) and running statistics
// against a double two-pass computation over that output (1e-6 relative). `offset` moves the inputs so
// the outputs' mean lies far from zero (the shifts' reason); NaN-free.
static void check_tc_stats(unsigned envs, unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w,
                           float offset) {
    unsigned nt = c_out <= 8 ? 1 : 2, per_block = 1024 / (h * w), runs = (batch + per_block - 1) / per_block;
    auto x = values((size_t)envs * batch * c_in * h * w, offset - 1.0f, offset + 1.0f);
    auto weight = values((size_t)envs * c_out * c_in * 9, 0.0f, 0.5f);
    size_t n = (size_t)envs * batch * c_out * h * w, pairs = (size_t)envs * c_out;
    std::vector<float> y(n, NAN), y_stats(n, NAN);
    std::vector<double> stats(pairs * runs * 3, NAN);
    const char* name = "";  // the kernel the launcher takes (tc_square)
    for (int with = 0; with < 2; ++with) {
        float* out = with ? y_stats.data() : y.data();
        double* st = with ? stats.data() : nullptr;
        launch({runs, (c_out + 8 * nt - 1) / (8 * nt), envs}, {tc_threads(nt, tc_square(h, w)), 1, 1}, [&] {
            tc_forward(nt, tc_square(h, w), &name, x.data(), weight.data(), out, batch, c_in, c_out, h, w, 0, NO_BN, st);
        });
    }
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += !same_bits(y[i], y_stats[i]);
    std::vector<float> mean(pairs, NAN), inv(pairs, NAN), rm(pairs, 0.25f), rv(pairs, 2.0f);
    launch({(unsigned)pairs, 1, 1}, {FINISH_LANES, 1, 1}, [&] {
        batch_norm_stats_finish_runs_f32(stats.data(), mean.data(), inv.data(), rm.data(), rv.data(), (u32)pairs, runs,
                                         batch, per_block, h * w);
    });
    double worst = 0.0;
    size_t count = (size_t)batch * h * w;
    for (size_t p = 0; p < pairs; ++p) {
        size_t e = p / c_out, c = p % c_out;
        auto at = [&](size_t j) { return ((e * batch + j / (h * w)) * c_out + c) * (h * w) + j % (h * w); };
        double sum = 0.0, q = 0.0;
        for (size_t j = 0; j < count; ++j) sum += y[at(j)];
        double m = sum / count;
        for (size_t j = 0; j < count; ++j) q += (y[at(j)] - m) * (y[at(j)] - m);
        double var = q / count, want_inv = 1.0 / std::sqrt((double)(float)var + 1e-5);
        double want_rm = 0.9 * 0.25 + 0.1 * m, want_rv = 0.9 * 2.0 + 0.1 * var * count / (count - 1.0);
        worst = std::max({worst, std::fabs(mean[p] - m) / std::max(std::fabs(m), 1.0), std::fabs(inv[p] - want_inv) / want_inv,
                          std::fabs(rm[p] - want_rm) / std::max(std::fabs(want_rm), 1.0), std::fabs(rv[p] - want_rv) / want_rv});
    }
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "%s + BN statistics E%u B%u %u→%u %u×%u (%u runs)", name, envs, batch, c_in, c_out,
                  h, w, runs);
    std::snprintf(detail, sizeof detail, "%zu outputs differ in bits; statistics max diff %.2e (1e-6)", wrong, worst);
    report(what, wrong == 0 && worst <= 1e-6, detail);
}

// The staged kernels' backwards reading batch norm's input gradient on load (BnLoad), against the same
// kernels on that gradient written by batch_norm_backward_input_from_f32 (bit for bit): the input
// gradient (direct and tensor-core) and the weight gradient (direct and tensor-core, `per_run` image
// groups a run), from the pool's output gradient through its argmax or the ReLU's. Random coefficients
// (the two sides read the same ones), shifts of either sign so the ReLU cuts.
static void check_staged_bn(unsigned envs, unsigned batch, unsigned c_in, unsigned c_out, unsigned h, unsigned w,
                            unsigned per_run, int mode) {
    size_t n_out = (size_t)envs * batch * c_out * h * w, pairs = (size_t)envs * c_out;
    size_t windows = (size_t)envs * batch * c_out * (h / 2) * (w / 2);
    bool pooled = mode == BN_LOAD_POOLED;
    auto xbn = values(n_out, -2.0f, 2.0f), dy = values(pooled ? windows : n_out, -1.0f, 1.0f);
    std::vector<u8> arg(windows);
    for (auto& a : arg) a = (u8)(uniform(0.0f, 3.999f));
    std::vector<float> coef(pairs * BN_COEF, 0.0f);
    for (size_t p = 0; p < pairs; ++p) {
        float* c = coef.data() + p * BN_COEF;
        c[0] = uniform(-0.5f, 0.5f), c[1] = uniform(0.5f, 2.0f), c[2] = uniform(-0.5f, 0.5f);
        c[3] = uniform(0.5f, 2.0f), c[4] = uniform(-0.1f, 0.1f), c[5] = uniform(-0.1f, 0.1f);
        // Every other pair behind an r0 slot's ADD split (its host gradient's factor, bn_slot_grad).
        c[6] = uniform(0.0f, 1.0f), c[7] = p % 2 ? 1.0f : 0.0f;
    }
    std::vector<float> dconv(n_out, NAN);
    launch({64, 1, 1}, {256, 1, 1}, [&] {
        batch_norm_backward_input_from_f32(dy.data(), arg.data(), xbn.data(), coef.data(), dconv.data(), envs, batch, c_out,
                                           h, w, pooled);
    });
    auto x = values((size_t)envs * batch * c_in * h * w, -1.0f, 1.0f);
    auto weight = values((size_t)envs * c_out * c_in * 9, -0.5f, 0.5f);
    unsigned per_block = 1024 / (h * w), groups = (batch + per_block - 1) / per_block;
    size_t wrong = 0, outputs = 0;
    const char* name = "";
    // The input gradient: the kernel's view takes the c_out channels of the output gradient to c_in.
    for (int tc = 0; tc < 2; ++tc) {
        unsigned nt = c_in <= 8 ? 1 : 2, tiles = tc ? (c_in + 8 * nt - 1) / (8 * nt) : (c_in + 7) / 8;
        std::vector<float> on_load((size_t)envs * batch * c_in * h * w, NAN), written(on_load.size(), NAN);
        for (int from_bn = 0; from_bn < 2; ++from_bn) {
            float* out = from_bn ? on_load.data() : written.data();
            const float* src = from_bn ? nullptr : dconv.data();
            int m = from_bn ? mode : BN_LOAD_NONE;
            launch({groups, tiles, envs}, {tc ? tc_threads(nt, tc_square(h, w)) : 256, 1, 1}, [&] {
                if (!tc)
                    conv3x3_direct_f32(src, weight.data(), out, batch, c_out, c_in, h, w, 1, xbn.data(), dy.data(), arg.data(), coef.data(), m);
                else  // the kernel the launcher takes: the square one where it applies (BN read by the staging)
                    tc_forward(nt, tc_square(h, w), &name, src, weight.data(), out, batch, c_out, c_in, h, w, 1, xbn.data(),
                               dy.data(), arg.data(), coef.data(), m, nullptr);
            });
        }
        for (size_t i = 0; i < on_load.size(); ++i) wrong += !same_bits(on_load[i], written[i]);
        outputs += on_load.size();
    }
    // The weight gradient: direct, tensor-core general, and (pooled, square planes) the square
    // tensor-core kernel on the written gradient against its _bnpool form on load, as the launcher pairs
    // them.
    unsigned runs = (groups + per_run - 1) / per_run, sq = tc_square(h, w);
    size_t per_env = (size_t)c_out * c_in * 9;
    for (int tc = 0; tc < 3; ++tc) {
        if (tc == 2 && !(pooled && sq)) continue;
        unsigned nt = c_out <= 8 ? 1 : 2, tiles = ((c_in + 3) / 4) * (tc ? (c_out + 8 * nt - 1) / (8 * nt) : (c_out + 7) / 8);
        std::vector<float> on_load(envs * per_env, NAN), written(envs * per_env, NAN);
        for (int from_bn = 0; from_bn < 2; ++from_bn) {
            std::vector<float> partial((size_t)envs * runs * per_env, NAN);
            const float* src = from_bn ? nullptr : dconv.data();
            int m = from_bn ? mode : BN_LOAD_NONE;
            launch({runs, tiles, envs}, {256, 1, 1}, [&] {
                if (!tc)
                    conv3x3_wgrad_direct_f32(x.data(), src, partial.data(), batch, c_in, c_out, h, w, runs, per_run, xbn.data(), dy.data(), arg.data(), coef.data(), m);
                else if (tc == 2 && from_bn) {
                    const auto& k = TC_WGRADS_BN_POOLED[nt - 1][square_column(sq) - 1];
                    if (threadIdx.x == 0) name = k.name;
                    k.kernel(x.data(), nullptr, partial.data(), batch, c_in, c_out, h, w, runs, per_run, xbn.data(), dy.data(), arg.data(), coef.data(), m);
                } else if (tc == 2)
                    tc_wgrad(nt, sq, &name, x.data(), src, partial.data(), batch, c_in, c_out, h, w, runs, per_run, xbn.data(), dy.data(), arg.data(), coef.data(), BN_LOAD_NONE);
                else if (nt == 1)
                    conv3x3_wgrad_tc_n8_tf32(x.data(), src, partial.data(), batch, c_in, c_out, h, w, runs, per_run, xbn.data(), dy.data(), arg.data(), coef.data(), m);
                else
                    conv3x3_wgrad_tc_n16_tf32(x.data(), src, partial.data(), batch, c_in, c_out, h, w, runs, per_run, xbn.data(), dy.data(), arg.data(), coef.data(), m);
            });
            launch({1, 1, 1}, {256, 1, 1}, [&] {
                conv2d_wgrad_reduce_f32(partial.data(), from_bn ? on_load.data() : written.data(), envs, runs, (unsigned)per_env);
            });
        }
        for (size_t i = 0; i < on_load.size(); ++i) wrong += !same_bits(on_load[i], written[i]);
        outputs += on_load.size();
    }
    size_t nans = 0;
    for (float v : dconv) nans += std::isnan(v);
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "staged dx, dW reading BN's gradient (%s) E%u B%u %u→%u %u×%u%s", pooled ? "pooled" : "relu  ",
                  envs, batch, c_in, c_out, h, w, pooled && sq ? " (+ _bnpool)" : "");
    std::snprintf(detail, sizeof detail, "%zu of %zu outputs differ in bits from the written gradient's", wrong, outputs);
    report(what, wrong == 0 && nans == 0, detail);
}

// The fused passes against the kernels they replace, run one by one (bit for bit): batch_norm_relu_pool_f32
// against batch_norm_apply_f32 (ReLU) + max_pool2x2_forward_f32, in training and evaluation, and
// relu_bn_backward_partial_f32 + batch_norm_backward_input_from_f32 against max_pool2x2_backward_f32 (or
// not) + relu_backward_f32 + batch_norm_backward_params_{partial,finish}_f32 + batch_norm_backward_input_f32.
static void check_fused_pool(unsigned envs, unsigned batch, unsigned channels, unsigned h, unsigned w) {
    size_t n = (size_t)envs * batch * channels * h * w, windows = n / 4, pairs = (size_t)envs * channels;
    auto x = values(n, -2.0f, 2.0f);
    auto mean = values(pairs, -0.5f, 0.5f), scale = values(pairs, 0.5f, 2.0f);
    auto gamma = values(pairs, 0.5f, 1.5f), beta = values(pairs, -0.5f, 0.5f);
    u64 planes = (u64)envs * batch * channels;
    for (int eval = 0; eval < 2; ++eval) {
        std::vector<float> act(n, NAN), pooled(windows, NAN), act1(n, NAN), pooled1(windows, NAN);
        std::vector<u8> arg(windows, 9), arg1(windows, 9);
        launch({64, 1, 1}, {256, 1, 1}, [&] {
            batch_norm_relu_pool_f32(x.data(), act.data(), pooled.data(), arg.data(), mean.data(), scale.data(),
                                     gamma.data(), beta.data(), envs, batch, channels, h, w, eval, 1);
        });
        // As a training step runs it: the activation left unwritten, the same pooled values.
        std::vector<float> act2(n, NAN), pooled2(windows, NAN);
        std::vector<u8> arg2(windows, 9);
        launch({64, 1, 1}, {256, 1, 1}, [&] {
            batch_norm_relu_pool_f32(x.data(), act2.data(), pooled2.data(), arg2.data(), mean.data(), scale.data(),
                                     gamma.data(), beta.data(), envs, batch, channels, h, w, eval, 0);
        });
        launch({64, 1, 1}, {256, 1, 1}, [&] {
            batch_norm_apply_f32(x.data(), act1.data(), mean.data(), scale.data(), gamma.data(), beta.data(), envs,
                                 batch, channels, h * w, eval, 1);
        });
        launch({64, 1, 1}, {256, 1, 1}, [&] { max_pool2x2_forward_f32(act1.data(), pooled1.data(), arg1.data(), planes, h, w); });
        size_t wrong = 0;
        for (size_t i = 0; i < n; ++i) wrong += !same_bits(act[i], act1[i]);
        for (size_t i = 0; i < windows; ++i) wrong += !same_bits(pooled[i], pooled1[i]) + (arg[i] != arg1[i]);
        for (size_t i = 0; i < windows; ++i) wrong += !same_bits(pooled2[i], pooled1[i]) + (arg2[i] != arg1[i]);
        for (size_t i = 0; i < n; ++i) wrong += !std::isnan(act2[i]);
        char what[160], detail[160];
        std::snprintf(what, sizeof what, "batch_norm_relu_pool_f32 %s E%u B%u C%u %u×%u", eval ? "eval " : "train", envs,
                      batch, channels, h, w);
        std::snprintf(detail, sizeof detail, "%zu of %zu values differ in bits (or the unwritten act was written)",
                      wrong, 2 * n + 4 * windows);
        report(what, wrong == 0, detail);
        if (eval) continue;
        // The ReLU's backward (and the pool's before it, or not) with batch norm's parameter sums in one
        // pass, and batch norm's input gradient recomputing its output gradient, the ReLU's mask from x:
        // against max_pool2x2_backward_f32, relu_backward_f32, batch_norm_backward_params_partial_f32,
        // the finish kernel and batch_norm_backward_input_f32 one by one — runs of a third of each
        // pair's values, the last short.
        // Source 2: the pool's gradient through an r0 slot's split (env e in mode slot_mode[e]: ADD, then
        // INCUBATOR, OFF, ADD …): against the pool's backward, slot_backward_split_f32 writing the host's
        // gradient, then the kernels one by one — and slot_backward_split_pool_f32 without the host's
        // gradient must write the seed's the same.
        std::vector<u8> slot_mode(envs);
        std::vector<float> slot_alpha(envs), zeros(n, 0.0f);
        for (unsigned e = 0; e < envs; ++e) slot_mode[e] = e % 3 == 0 ? 2 : e % 3 == 1 ? 1 : 0, slot_alpha[e] = 0.3f + 0.5f * e;
        for (int source = 2; source >= 0; --source) {
            int pooled_grad = source >= 1;
            const u8* sm = source == 2 ? slot_mode.data() : nullptr;
            const float* sa = source == 2 ? slot_alpha.data() : nullptr;
            auto dy = values(pooled_grad ? windows : n, -1.0f, 1.0f);
            std::vector<float> g(n, NAN), routed(n, NAN), dh(n, NAN), ds(n, NAN);
            if (pooled_grad)
                launch({64, 1, 1}, {256, 1, 1}, [&] { max_pool2x2_backward_f32(dy.data(), arg.data(), routed.data(), planes, h, w); });
            else
                routed = dy;
            size_t wrong_ds = 0;
            if (source == 2) {
                launch({64, 1, 1}, {256, 1, 1}, [&] {
                    slot_backward_split_f32(routed.data(), zeros.data(), zeros.data(), slot_alpha.data(), zeros.data(),
                                            slot_mode.data(), dh.data(), ds.data(), envs, batch, channels * h * w);
                });
                routed = dh;
                if (h % 2 == 0 && w == h) {
                    std::vector<float> ds_fused(n, NAN);
                    launch({3, 1, 1}, {64, 1, 1}, [&] {
                        slot_backward_split_pool_f32(dy.data(), arg.data(), zeros.data(), zeros.data(), slot_alpha.data(),
                                                     zeros.data(), slot_mode.data(), nullptr, ds_fused.data(), envs,
                                                     batch, channels, h);
                    });
                    for (size_t i = 0; i < n; ++i) wrong_ds += !same_bits(ds_fused[i], ds[i]);
                }
            }
            launch({64, 1, 1}, {256, 1, 1}, [&] { relu_backward_f32(act.data(), routed.data(), g.data(), (u64)n); });
            size_t cut = 0;
            for (size_t i = 0; i < n; ++i) cut += act[i] == 0.0f;
            unsigned count = batch * h * w, run = (count + 2) / 3, splits = (count + run - 1) / run;
            std::vector<double> sums(pairs * splits * 2, NAN), sums1(pairs * splits * 2, NAN);
            launch({(unsigned)pairs, splits, 1}, {REDUCE_THREADS, 1, 1}, [&] {
                relu_bn_backward_partial_f32(dy.data(), arg.data(), x.data(), mean.data(), scale.data(), gamma.data(),
                                             beta.data(), sums.data(), batch, channels, h, w, splits, run, pooled_grad,
                                             sm, sa);
            });
            launch({(unsigned)pairs, splits, 1}, {REDUCE_THREADS, 1, 1}, [&] {
                batch_norm_backward_params_partial_f32(x.data(), g.data(), mean.data(), sums1.data(), batch, channels,
                                                       h * w, splits, run);
            });
            size_t wrong = 0;
            for (size_t i = 0; i < sums.size(); ++i) wrong += std::memcmp(&sums[i], &sums1[i], sizeof(double)) != 0;
            // The finish with the input gradient's coefficients, and without (the same dγ, dβ).
            std::vector<float> dgamma(pairs, NAN), dbeta(pairs, NAN), dgamma1(pairs, NAN), dbeta1(pairs, NAN);
            std::vector<float> coef(pairs * BN_COEF, NAN);
            launch({1, 1, 1}, {256, 1, 1}, [&] {
                batch_norm_backward_params_finish_f32(sums.data(), mean.data(), scale.data(), gamma.data(), beta.data(),
                                                      dgamma.data(), dbeta.data(), coef.data(), (u32)pairs, splits,
                                                      (u64)count, sm, sa, channels);
            });
            launch({1, 1, 1}, {256, 1, 1}, [&] {
                batch_norm_backward_params_finish_f32(sums1.data(), mean.data(), scale.data(), gamma.data(),
                                                      beta.data(), dgamma1.data(), dbeta1.data(), nullptr, (u32)pairs,
                                                      splits, (u64)count, nullptr, nullptr, channels);
            });
            for (size_t i = 0; i < pairs; ++i) wrong += !same_bits(dgamma[i], dgamma1[i]) + !same_bits(dbeta[i], dbeta1[i]);
            std::vector<float> dx(n, NAN), dx1(n, NAN);
            launch({64, 1, 1}, {256, 1, 1}, [&] {
                batch_norm_backward_input_from_f32(dy.data(), arg.data(), x.data(), coef.data(), dx.data(), envs, batch,
                                                   channels, h, w, pooled_grad);
            });
            launch({64, 1, 1}, {256, 1, 1}, [&] {
                batch_norm_backward_input_f32(x.data(), g.data(), gamma.data(), mean.data(), scale.data(), dgamma1.data(),
                                              dbeta1.data(), dx1.data(), envs, batch, channels, h * w);
            });
            for (size_t i = 0; i < n; ++i) wrong += !same_bits(dx[i], dx1[i]);
            wrong += wrong_ds;
            std::snprintf(what, sizeof what, "relu_bn_backward_{partial,input_from} %s E%u B%u C%u %u×%u (%u runs)",
                          source == 2 ? "slot  " : pooled_grad ? "pooled" : "relu  ", envs, batch, channels, h, w, splits);
            std::snprintf(detail, sizeof detail, "%zu of %zu sums, parameter and input gradients%s differ in bits (%zu cut by the ReLU)",
                          wrong, sums.size() + 2 * pairs + n + (source == 2 && w == h ? n : 0),
                          source == 2 && w == h ? " and the seed's" : "", cut);
            report(what, wrong == 0 && splits > 1 && cut > 0, detail);
        }
    }
}

static void check_batch_norm(unsigned envs, unsigned batch, unsigned channels, unsigned plane, unsigned splits,
                             float lo, float hi) {
    size_t count = (size_t)batch * plane, pairs = (size_t)envs * channels;
    unsigned run = (unsigned)((count + splits - 1) / splits);
    splits = (unsigned)((count + run - 1) / run);
    auto x = values(pairs * count, lo, hi);
    auto dy = values(pairs * count, -1.0f, 1.0f);
    std::vector<double> partial(pairs * splits * 2, NAN);
    std::vector<float> mean(pairs), inv(pairs), rm(pairs, 0.0f), rv(pairs, 1.0f);
    launch({(unsigned)pairs, splits, 1}, {REDUCE_THREADS, 1, 1}, [&] {
        batch_norm_stats_partial_f32(x.data(), partial.data(), batch, channels, plane, splits, run);
    });
    launch({1, 1, 1}, {256, 1, 1}, [&] {
        batch_norm_stats_finish_f32(x.data(), partial.data(), mean.data(), inv.data(), rm.data(), rv.data(),
                                    (unsigned)pairs, batch, channels, plane, splits);
    });
    std::fill(partial.begin(), partial.end(), NAN);
    std::vector<float> dgamma(pairs, NAN), dbeta(pairs, NAN);
    launch({(unsigned)pairs, splits, 1}, {REDUCE_THREADS, 1, 1}, [&] {
        batch_norm_backward_params_partial_f32(x.data(), dy.data(), mean.data(), partial.data(), batch, channels,
                                               plane, splits, run);
    });
    launch({1, 1, 1}, {256, 1, 1}, [&] {
        batch_norm_backward_params_finish_f32(partial.data(), mean.data(), inv.data(), rm.data(), rv.data(),
                                              dgamma.data(), dbeta.data(), nullptr, (unsigned)pairs, splits,
                                              (u64)count, nullptr, nullptr, channels);
    });
    double worst = 0.0, worst_grad = 0.0, largest_grad = 0.0;
    std::vector<double> want_gamma(pairs), want_beta(pairs);
    for (size_t p = 0; p < pairs; ++p) {
        size_t e = p / channels, c = p % channels;
        auto at = [&](size_t j) { return ((e * batch + j / plane) * channels + c) * plane + j % plane; };
        double s = 0.0, q = 0.0, g = 0.0, gc = 0.0;
        for (size_t j = 0; j < count; ++j) s += x[at(j)];
        double m = s / count;
        for (size_t j = 0; j < count; ++j) q += (x[at(j)] - m) * (x[at(j)] - m);
        double var = q / count, want_inv = 1.0 / std::sqrt(var + 1e-5);
        for (size_t j = 0; j < count; ++j) {
            g += dy[at(j)];
            gc += (double)dy[at(j)] * (double)(x[at(j)] - mean[p]);
        }
        worst = std::max({worst, std::fabs(mean[p] - m) / std::max(std::fabs(m), 1.0),
                          std::fabs(inv[p] - want_inv) / want_inv,
                          std::fabs(rm[p] - 0.1 * m) / std::max(std::fabs(0.1 * m), 1.0)});
        want_beta[p] = g;
        want_gamma[p] = gc * inv[p];
        largest_grad = std::max({largest_grad, std::fabs(g), std::fabs(want_gamma[p])});
    }
    for (size_t p = 0; p < pairs; ++p)
        worst_grad = std::max({worst_grad, std::fabs(dbeta[p] - want_beta[p]), std::fabs(dgamma[p] - want_gamma[p])});
    worst_grad /= std::max(largest_grad, 1e-30);
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "batch_norm_stats_{partial,finish}_f32 E%u B%u C%u P%u, %u runs", envs, batch,
                  channels, plane, splits);
    std::snprintf(detail, sizeof detail, "max relative diff %.2e (tolerance 1e-6)", worst);
    report(what, worst <= 1e-6, detail);
    std::snprintf(what, sizeof what, "batch_norm_backward_params_{partial,finish}_f32, %u runs", splits);
    std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (tolerance 1e-6)", worst_grad);
    report(what, worst_grad <= 1e-6, detail);
}

// ops::norm's LaneSums total: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
static float lane_total(const float (&l)[8]) {
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    return (a0 + a2) + (a1 + a3);
}

// Group norm over [E, B, C, h·w] with `groups` groups: the forward (statistics saved) with each of its
// epilogues (the norm, its ReLU, a residual plus its ReLU, a residual plus the norm) and the input
// gradient (overwriting and accumulating; dy at the norm's output, or at its ReLU's with the mask
// recomputed) against references written from ops/norm.rs's order — a group's values (forward) or each
// plane's positions (backward, restarting per plane) to lane i % 8 — and from relu_forward_f32's
// ReLU, the residual add and relu_backward_f32's mask over the norm's output, bit for bit, on the unstaged kernels and, where
// the shape fits, the staged ones; the parameter gradients (group_norm_backward_params_fast_f32's f64
// block sums, and the input gradient's partials through group_norm_backward_params_finish_f32) against
// double sums to 1e-6 of the largest.
static void check_group_norm(unsigned envs, unsigned batch, unsigned channels, unsigned h, unsigned w,
                             unsigned groups) {
    unsigned plane = h * w, per_group = channels / groups, len = per_group * plane;
    size_t n = (size_t)envs * batch * channels * plane, stats_len = (size_t)envs * batch * groups;
    size_t params_len = (size_t)envs * channels;
    auto x = values(n, -2.0f, 3.0f), dy = values(n, -1.0f, 1.0f), old = values(n, -1.0f, 1.0f);
    auto residual = values(n, -1.0f, 1.0f);
    auto gamma = values(params_len, 0.5f, 1.5f), beta = values(params_len, -0.5f, 0.5f);
    bool staged_fits = len <= GN_STAGED_LEN && len % 4 == 0;
    std::vector<float> y_ref(n), mean_ref(stats_len), inv_ref(stats_len);
    for (size_t t = 0; t < stats_len; ++t) {
        size_t image = t / groups, g = t % groups, e = image / batch;
        const float* xg = &x[(image * channels + g * per_group) * plane];
        float l[8] = {}, q[8] = {};
        for (unsigned i = 0; i < len; ++i) l[i % 8] += xg[i];
        float mean = lane_total(l) / (float)len;
        for (unsigned i = 0; i < len; ++i) {
            float d = xg[i] - mean;
            q[i % 8] += d * d;
        }
        float inv = 1.0f / sqrtf(lane_total(q) / (float)len + NORM_EPS);
        mean_ref[t] = mean, inv_ref[t] = inv;
        for (unsigned cl = 0; cl < per_group; ++cl) {
            size_t c = g * per_group + cl, at = (image * channels + c) * plane;
            float scale = inv * gamma[e * channels + c], shift = beta[e * channels + c];
            for (unsigned i = 0; i < plane; ++i) y_ref[at + i] = (x[at + i] - mean) * scale + shift;
        }
    }
    // The input gradient from dyv (ops/norm.rs's order) into dx_ref, and added to `old` into dx_acc_ref;
    // the parameter gradients' double sums.
    auto backward_ref = [&](const std::vector<float>& dyv, std::vector<float>& dx_ref, std::vector<float>& dx_acc_ref,
                            std::vector<double>& dgamma_want, std::vector<double>& dbeta_want) {
        dx_ref.assign(n, 0.0f), dx_acc_ref.assign(n, 0.0f);
        dgamma_want.assign(params_len, 0.0), dbeta_want.assign(params_len, 0.0);
        for (size_t t = 0; t < stats_len; ++t) {
            size_t image = t / groups, g = t % groups, e = image / batch;
            float mean = mean_ref[t], inv = inv_ref[t];
            float s1[8] = {}, s2[8] = {};
            for (unsigned cl = 0; cl < per_group; ++cl) {
                size_t c = g * per_group + cl, at = (image * channels + c) * plane;
                float gam = gamma[e * channels + c];
                for (unsigned i = 0; i < plane; ++i) s1[i % 8] += dyv[at + i] * gam;
                for (unsigned i = 0; i < plane; ++i) s2[i % 8] += dyv[at + i] * gam * ((x[at + i] - mean) * inv);
                for (unsigned i = 0; i < plane; ++i) {
                    float d = dyv[at + i];
                    dbeta_want[e * channels + c] += d;
                    dgamma_want[e * channels + c] += (double)(d * ((x[at + i] - mean) * inv));
                }
            }
            float m1 = lane_total(s1) / (float)len, m2 = lane_total(s2) / (float)len;
            for (unsigned cl = 0; cl < per_group; ++cl) {
                size_t c = g * per_group + cl, at = (image * channels + c) * plane;
                float gam = gamma[e * channels + c];
                for (unsigned i = 0; i < plane; ++i) {
                    float x_hat = (x[at + i] - mean) * inv;
                    float value = inv * (dyv[at + i] * gam - m1 - x_hat * m2);
                    dx_ref[at + i] = value;
                    dx_acc_ref[at + i] = old[at + i] + value;
                }
            }
        }
    };
    char what[200], detail[160];
    auto bits_report = [&](const char* name, const std::vector<float>& got, const std::vector<float>& want,
                           size_t extra_wrong, size_t extra_count) {
        size_t wrong = extra_wrong;
        for (size_t i = 0; i < n; ++i) wrong += !same_bits(got[i], want[i]);
        std::snprintf(what, sizeof what, "%s E%u B%u C%u G%u %u×%u", name, envs, batch, channels, groups, h, w);
        std::snprintf(detail, sizeof detail, "%zu of %zu values differ in bits", wrong, n + extra_count);
        report(what, wrong == 0, detail);
    };

    // The forward, each epilogue against the norm's output with relu_forward_f32's ReLU and the
    // residual add over it.
    const char* epilogue_names[4] = {"", " (relu)", " (residual + relu)", " (residual +)"};
    for (int epilogue = GN_PLAIN; epilogue <= GN_ADD; ++epilogue) {
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) {
            float v = y_ref[i], relu = !(v <= 0.0f) ? v : 0.0f;
            want[i] = epilogue == GN_PLAIN  ? v
                      : epilogue == GN_RELU ? relu
                      : epilogue == GN_ADD_RELU ? residual[i] + relu
                                                : residual[i] + v;
        }
        for (int staged = 0; staged < 2; ++staged) {
            if (staged && !staged_fits) continue;
            std::vector<float> y(n, NAN), mean(stats_len, NAN), inv(stats_len, NAN);
            if (staged) {
                unsigned blocks = (unsigned)((stats_len + GN_STAGED_PAIRS - 1) / GN_STAGED_PAIRS);
                launch({blocks, 1, 1}, {GN_STAGED_PAIRS * 8, 1, 1}, [&] {
                    group_norm_forward_staged_f32(x.data(), gamma.data(), beta.data(), residual.data(), epilogue,
                                                  y.data(), mean.data(), inv.data(), envs, batch, channels, plane,
                                                  groups);
                });
            } else {
                unsigned blocks = (unsigned)((stats_len * 8 + 255) / 256);
                launch({blocks, 1, 1}, {256, 1, 1}, [&] {
                    group_norm_forward_f32(x.data(), gamma.data(), beta.data(), residual.data(), epilogue, y.data(),
                                           mean.data(), inv.data(), envs, batch, channels, plane, groups);
                });
            }
            size_t wrong_stats = 0;
            for (size_t t = 0; t < stats_len; ++t)
                wrong_stats += !same_bits(mean[t], mean_ref[t]) + !same_bits(inv[t], inv_ref[t]);
            char name[120];
            std::snprintf(name, sizeof name, "%s%s",
                          staged ? "group_norm_forward_staged_f32" : "group_norm_forward_f32", epilogue_names[epilogue]);
            bits_report(name, y, want, wrong_stats, 2 * stats_len);
        }
    }

    // The input gradient, dy at the norm's output and (relu_mask) at its ReLU's: the reference runs on
    // relu_backward_f32's dy (dy where the norm's output is > 0, else 0).
    std::vector<float> dy_masked(n);
    size_t masked = 0;
    for (size_t i = 0; i < n; ++i) {
        dy_masked[i] = y_ref[i] > 0.0f ? dy[i] : 0.0f;
        masked += !(y_ref[i] > 0.0f);
    }
    if (masked == 0 || masked == n) {
        std::snprintf(what, sizeof what, "group_norm ReLU mask E%u B%u C%u G%u %u×%u", envs, batch, channels, groups, h, w);
        report(what, false, "the inputs gave a mask of one value");
    }
    size_t partials_len = 2 * (size_t)envs * batch * channels;
    for (int relu_mask = 0; relu_mask < 2; ++relu_mask) {
        std::vector<float> dx_ref, dx_acc_ref;
        std::vector<double> dgamma_want, dbeta_want;
        backward_ref(relu_mask ? dy_masked : dy, dx_ref, dx_acc_ref, dgamma_want, dbeta_want);
        for (int staged = 0; staged < 2; ++staged) {
            if (staged && !staged_fits) continue;
            for (int accumulate = 0; accumulate < 2; ++accumulate) {
                std::vector<float> out = accumulate ? old : std::vector<float>(n, NAN);
                std::vector<double> partials(partials_len, NAN);
                // The partials only where the seeds ask for them (overwriting dx); else none.
                double* partials_arg = accumulate ? nullptr : partials.data();
                if (staged) {
                    unsigned blocks = (unsigned)((stats_len + GN_STAGED_BACK_PAIRS - 1) / GN_STAGED_BACK_PAIRS);
                    launch({blocks, 1, 1}, {GN_STAGED_BACK_PAIRS * 8, 1, 1}, [&] {
                        group_norm_backward_input_staged_f32(x.data(), gamma.data(), beta.data(), mean_ref.data(),
                                                             inv_ref.data(), dy.data(), out.data(), partials_arg, envs,
                                                             batch, channels, plane, groups, accumulate, relu_mask);
                    });
                } else {
                    unsigned blocks = (unsigned)((stats_len * 8 + 255) / 256);
                    launch({blocks, 1, 1}, {256, 1, 1}, [&] {
                        group_norm_backward_input_f32(x.data(), gamma.data(), beta.data(), mean_ref.data(),
                                                      inv_ref.data(), dy.data(), out.data(), partials_arg, envs, batch,
                                                      channels, plane, groups, accumulate, relu_mask);
                    });
                }
                char name[120];
                std::snprintf(name, sizeof name, "%s%s%s",
                              staged ? "group_norm_backward_input_staged_f32" : "group_norm_backward_input_f32",
                              relu_mask ? " (relu mask)" : "", accumulate ? " (+=)" : "");
                bits_report(name, out, accumulate ? dx_acc_ref : dx_ref, 0, 0);
                if (accumulate) continue;
                std::vector<float> dgamma(params_len, NAN), dbeta(params_len, NAN);
                launch({(unsigned)params_len, 1, 1}, {REDUCE_THREADS, 1, 1}, [&] {
                    group_norm_backward_params_finish_f32(partials.data(), dgamma.data(), dbeta.data(), envs, batch,
                                                          channels);
                });
                double worst = std::max(diff_of_largest(dgamma, dgamma_want), diff_of_largest(dbeta, dbeta_want));
                std::snprintf(what, sizeof what, "%s partials + group_norm_backward_params_finish_f32 E%u B%u C%u G%u %u×%u",
                              name, envs, batch, channels, groups, h, w);
                std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (tolerance 1e-6)", worst);
                report(what, worst <= 1e-6, detail);
            }
        }
        if (relu_mask) continue;
        std::vector<float> dgamma(params_len, NAN), dbeta(params_len, NAN);
        launch({(unsigned)params_len, 1, 1}, {REDUCE_THREADS, 1, 1}, [&] {
            group_norm_backward_params_fast_f32(x.data(), mean_ref.data(), inv_ref.data(), dy.data(), dgamma.data(),
                                                dbeta.data(), envs, batch, channels, plane, groups);
        });
        double worst = std::max(diff_of_largest(dgamma, dgamma_want), diff_of_largest(dbeta, dbeta_want));
        std::snprintf(what, sizeof what, "group_norm_backward_params_fast_f32 E%u B%u C%u G%u %u×%u", envs, batch,
                      channels, groups, h, w);
        std::snprintf(detail, sizeof detail, "max diff %.2e of the largest (tolerance 1e-6)", worst);
        report(what, worst <= 1e-6, detail);
    }
}

// The attention seed's channel scaling (y = x·scale[plane]) and its scale gradient (Σ dy·x per plane
// in seeds::common::scale_planes_backward_scale's lanes: position i to lane i % 8) against loops written
// here, bit for bit; planes of 256 (r0c1's 16×16) and of an odd length.
static void check_scale_planes(unsigned planes, unsigned plane) {
    size_t n = (size_t)planes * plane;
    auto x = values(n, -2.0f, 2.0f), dy = values(n, -1.0f, 1.0f), scale = values(planes, 0.0f, 1.0f);
    std::vector<float> y_ref(n), grad_ref(planes);
    for (size_t p = 0; p < planes; ++p) {
        float l[8] = {};
        for (unsigned i = 0; i < plane; ++i) {
            y_ref[p * plane + i] = x[p * plane + i] * scale[p];
            l[i % 8] += dy[p * plane + i] * x[p * plane + i];
        }
        grad_ref[p] = lane_total(l);
    }
    std::vector<float> y(n, NAN), grad(planes, NAN);
    // Fewer blocks than the work, so the grid-stride loops go round.
    launch({2, 1, 1}, {64, 1, 1}, [&] { scale_planes_f32(x.data(), scale.data(), y.data(), planes, plane); });
    launch({2, 1, 1}, {64, 1, 1}, [&] { scale_planes_backward_scale_f32(x.data(), dy.data(), grad.data(), planes, plane); });
    size_t wrong_y = 0, wrong_grad = 0;
    for (size_t i = 0; i < n; ++i) wrong_y += !same_bits(y[i], y_ref[i]);
    for (size_t p = 0; p < planes; ++p) wrong_grad += !same_bits(grad[p], grad_ref[p]);
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "scale_planes_f32 %u planes of %u", planes, plane);
    std::snprintf(detail, sizeof detail, "%zu of %zu values differ in bits", wrong_y, n);
    report(what, wrong_y == 0, detail);
    std::snprintf(what, sizeof what, "scale_planes_backward_scale_f32 %u planes of %u", planes, plane);
    std::snprintf(detail, sizeof detail, "%zu of %u values differ in bits", wrong_grad, planes);
    report(what, wrong_grad == 0, detail);
}

// The head's per-env mean cross-entropy and its gradient, and the correct counts, against references in
// ops::loss's order (each env's samples in order; the first largest logit), with ties and a padding
// label (one no class has) among the samples. The same libm on both sides, so bit for bit.
// The 2x2 max-pool forward (values and argmax: the first maximum, NaN winning; a tie and a NaN planted)
// and backward (the winner gets the window's gradient, every other element 0, the dropped odd row and
// column included) against loops written here; even planes take the backward's per-window path, odd ones
// its per-element path, and the average pool's backward (dy / (h·w), added with accumulate).
static void check_pools(unsigned planes, unsigned h, unsigned w) {
    unsigned ho = h / 2, wo = w / 2;
    size_t n = (size_t)planes * h * w, windows = (size_t)planes * ho * wo;
    auto x = values(n, -1.0f, 1.0f);
    x[1] = x[0];  // a tie in the first window: the first maximum keeps it
    if (windows > 1) x[(size_t)2 * w + 3] = NAN;  // a NaN wins its window
    std::vector<float> y(windows, NAN), y_ref(windows), dy = values(windows, -1.0f, 1.0f), dx(n, NAN), dx_ref(n, 0.0f);
    std::vector<u8> arg(windows, 255), arg_ref(windows);
    for (size_t p = 0; p < planes; ++p)
        for (unsigned oy = 0; oy < ho; ++oy)
            for (unsigned ox = 0; ox < wo; ++ox) {
                size_t o = (p * ho + oy) * wo + ox, top = (p * h + 2 * oy) * w + 2 * ox;
                size_t at[4] = {top, top + 1, top + w, top + w + 1};
                float best = x[at[0]];
                unsigned k = 0;
                for (unsigned j = 1; j < 4; ++j)
                    if (!std::isnan(best) && (x[at[j]] > best || std::isnan(x[at[j]]))) best = x[at[j]], k = j;
                y_ref[o] = best, arg_ref[o] = (u8)k, dx_ref[at[k]] = dy[o];
            }
    launch({3, 1, 1}, {64, 1, 1}, [&] { max_pool2x2_forward_f32(x.data(), y.data(), arg.data(), planes, h, w); });
    launch({5, 1, 1}, {64, 1, 1}, [&] { max_pool2x2_backward_f32(dy.data(), arg_ref.data(), dx.data(), planes, h, w); });
    size_t wrong = 0;
    for (size_t o = 0; o < windows; ++o) wrong += !same_bits(y[o], y_ref[o]) + (arg[o] != arg_ref[o]);
    for (size_t i = 0; i < n; ++i) wrong += !same_bits(dx[i], dx_ref[i]);
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "max_pool2x2_{forward,backward}_f32 %u planes %u×%u", planes, h, w);
    std::snprintf(detail, sizeof detail, "%zu of %zu values, choices and gradients wrong", wrong, 2 * windows + n);
    report(what, wrong == 0, detail);
    auto g = values(planes, -1.0f, 1.0f), start = values(n, -1.0f, 1.0f);
    for (int accumulate = 0; accumulate < 2; ++accumulate) {
        std::vector<float> out = accumulate ? start : std::vector<float>(n, NAN);
        launch({3, 1, 1}, {64, 1, 1}, [&] { global_avg_pool_backward_f32(g.data(), out.data(), planes, h * w, accumulate); });
        wrong = 0;
        for (size_t i = 0; i < n; ++i) {
            float v = g[i / (h * w)] / (float)(h * w);
            wrong += !same_bits(out[i], accumulate ? start[i] + v : v);
        }
        std::snprintf(what, sizeof what, "global_avg_pool_backward_f32%s %u planes %u×%u", accumulate ? " (+=)" : "", planes, h, w);
        std::snprintf(detail, sizeof detail, "%zu of %zu gradients wrong", wrong, n);
        report(what, wrong == 0, detail);
    }
}

// The batch gathers against loops written here from their definitions: a training batch of 5 slots
// from 7 images (3 channels of 6×8, padding 2, fill per channel) with crops and flips, and a test batch
// of 10 images over 3 envs of 4 rows (4, 3, 3 real; the rest zero and labelled PAD_LABEL).
// Width 8 takes the kernels' runs of four elements; width 5 (rows and images not a multiple of four)
// one at a time.
static void check_gathers(unsigned width) {
    const unsigned channels = 3, height = 6, pad = 2, images = 7, slots = 5;
    const unsigned image_len = channels * height * width;
    auto data = values((size_t)images * image_len, -1.0f, 1.0f), fill = values(channels, -0.5f, 0.5f);
    std::vector<u8> labels(images);
    for (unsigned i = 0; i < images; ++i) labels[i] = (u8)(i * 3 % 10);
    std::vector<u32> index = {4, 0, 6, 4, 2}, draw(slots);
    for (unsigned t = 0; t < slots; ++t) draw[t] = (t % 5) | ((t * 3 % 5) << 8) | ((t % 2) << 16);
    std::vector<float> out((size_t)slots * image_len, NAN);
    std::vector<u8> out_labels(slots, 0);
    launch({2, 1, 1}, {64, 1, 1}, [&] {
        gather_train_f32(data.data(), labels.data(), index.data(), draw.data(), fill.data(), out.data(),
                         out_labels.data(), slots, channels, height, width, pad);
    });
    size_t wrong = 0;
    for (unsigned t = 0; t < slots; ++t) {
        int top = (int)(draw[t] & 0xff), left = (int)((draw[t] >> 8) & 0xff);
        bool flip = (draw[t] >> 16) & 1;
        wrong += out_labels[t] != labels[index[t]];
        for (unsigned c = 0; c < channels; ++c)
            for (unsigned y = 0; y < height; ++y)
                for (unsigned x = 0; x < width; ++x) {
                    int sy = (int)y + top - (int)pad, sx = (flip ? (int)width - 1 - (int)x : (int)x) + left - (int)pad;
                    bool inside = sy >= 0 && sy < (int)height && sx >= 0 && sx < (int)width;
                    float want = inside ? data[(size_t)index[t] * image_len + (c * height + sy) * width + sx] : fill[c];
                    wrong += !same_bits(out[((size_t)t * channels + c) * height * width + y * width + x], want);
                }
    }
    char detail[160];
    std::snprintf(detail, sizeof detail, "%zu of %u values and labels wrong", wrong, slots * (image_len + 1));
    char what[96];
    std::snprintf(what, sizeof what, "gather_train_f32 5 slots 3×6×%u, pad 2, crops and flips", width);
    report(what, wrong == 0, detail);
    const unsigned envs = 3, rows = 4, len = 10;
    const u64 first = 1;
    auto test = values((size_t)12 * image_len, -1.0f, 1.0f);
    std::vector<u8> test_labels(12);
    for (unsigned i = 0; i < 12; ++i) test_labels[i] = (u8)(i % 10);
    std::vector<float> tout((size_t)envs * rows * image_len, NAN);
    std::vector<u8> tl(envs * rows, 0);
    std::vector<u32> counts(envs, 99);
    launch({3, 1, 1}, {64, 1, 1}, [&] {
        gather_test_f32(test.data(), test_labels.data(), tout.data(), tl.data(), counts.data(), first, len, envs, rows,
                        image_len);
    });
    wrong = 0;
    unsigned start = (unsigned)first;
    for (unsigned e = 0; e < envs; ++e) {
        unsigned n = len / envs + (e < len % envs ? 1 : 0);
        wrong += counts[e] != n;
        for (unsigned row = 0; row < rows; ++row) {
            bool real = row < n;
            wrong += tl[e * rows + row] != (real ? test_labels[start + row] : (u8)PAD_LABEL);
            for (unsigned k = 0; k < image_len; ++k)
                wrong += !same_bits(tout[((size_t)e * rows + row) * image_len + k],
                                    real ? test[(size_t)(start + row) * image_len + k] : 0.0f);
        }
        start += n;
    }
    std::snprintf(detail, sizeof detail, "%zu of %u values, labels and counts wrong", wrong,
                  envs * rows * (image_len + 1) + envs);
    std::snprintf(what, sizeof what, "gather_test_f32 10 images of 3×6×%u over 3 envs of 4 rows", width);
    report(what, wrong == 0, detail);
}

// A slot's output rows: slot_passthrough_f32 (grid: blocks of an env's rows × envs) copies h into the
// rows of the envs that do not blend (mode below ADD, or held by no blueprint) and leaves the others,
// and slot_blend_select_f32 writes the blending envs' rows (ADD: lerp; MULTIPLY: h·(1 + a·tanh(s − h));
// GATE: lerp at a·g) and keeps s in s_mine only for MULTIPLY's and GATE's rows (their backwards read it).
// Envs: 0 ADD, 1 MULTIPLY, 2 GATE, 3 INCUBATOR, 4 ADD held by no blueprint, 5 OFF.
static void check_slot_rows() {
    const unsigned envs = 6, batch = 3, features = 40;
    size_t n = (size_t)envs * batch * features;
    auto h = values(n, -1.0f, 1.0f), sv = values(n, -1.0f, 1.0f), gate = values(envs * batch, -0.2f, 1.2f);
    std::vector<u8> mode = {2, 3, 4, 1, 2, 0}, holds(7 * envs, 0);
    for (unsigned e : {0u, 1u, 2u, 3u, 5u}) holds[2 * envs + e] = 1;  // blueprint 2's selection
    std::vector<float> alpha = {0.3f, 0.7f, 1.5f, 0.5f, 0.2f, 0.9f}, y(n, NAN), s_mine(n, NAN);
    launch({2, envs, 1}, {64, 1, 1}, [&] {
        slot_passthrough_f32(h.data(), mode.data(), holds.data(), y.data(), envs, batch, features);
    });
    launch({4, 1, 1}, {64, 1, 1}, [&] {
        slot_blend_select_f32(h.data(), sv.data(), alpha.data(), gate.data(), mode.data(), holds.data() + 2 * envs,
                              s_mine.data(), y.data(), envs, batch, features);
    });
    size_t wrong = 0;
    for (size_t t = 0; t < n; ++t) {
        unsigned e = (unsigned)(t / ((size_t)batch * features));
        float a = std::min(std::max(alpha[e], 0.0f), 1.0f), want;
        if (e == 0) want = blend_lerp(h[t], sv[t], a);
        else if (e == 1) want = h[t] * (1.0f + a * tanhf(sv[t] - h[t]));
        else if (e == 2) want = blend_lerp(h[t], sv[t], std::min(std::max(a * std::min(std::max(gate[t / features], 0.0f), 1.0f), 0.0f), 1.0f));
        else want = h[t];
        bool keeps = e == 1 || e == 2;
        wrong += !same_bits(y[t], want) + (keeps ? !same_bits(s_mine[t], sv[t]) : !std::isnan(s_mine[t]));
    }
    char detail[160];
    std::snprintf(detail, sizeof detail, "%zu of %zu outputs and kept seed values wrong", wrong, 2 * n);
    report("slot_passthrough_f32 + slot_blend_select_f32 (6 modes)", wrong == 0, detail);
}

// The slot with its block's pool fused in (slot_passthrough_pool_f32, slot_blend_select_pool_f32) against
// slot_passthrough_f32 and slot_blend_select_f32 writing the slot's output, then max_pool2x2_forward_f32
// over it (each checked above): pooled values, winners and s_mine bit for bit, over the six modes of
// check_slot_rows on 6×6 planes of 2 channels, with a NaN and a tie planted in a passthrough env's rows.
static void check_slot_pool() {
    const unsigned envs = 6, batch = 3, channels = 2, size = 6, features = channels * size * size;
    size_t n = (size_t)envs * batch * features, windows = n / 4;
    auto h = values(n, -1.0f, 1.0f), sv = values(n, -1.0f, 1.0f), gate = values(envs * batch, -0.2f, 1.2f);
    size_t off = (size_t)5 * batch * features;  // env 5 (OFF): a NaN in one window, a tie in the next
    h[off] = NAN;
    h[off + 3] = h[off + 2];
    std::vector<u8> mode = {2, 3, 4, 1, 2, 0}, holds(7 * envs, 0);
    for (unsigned e : {0u, 1u, 2u, 3u, 5u}) holds[2 * envs + e] = 1;
    std::vector<float> alpha = {0.3f, 0.7f, 1.5f, 0.5f, 0.2f, 0.9f};
    std::vector<float> y(n, NAN), s_mine_ref(n, NAN), pooled_ref(windows, NAN);
    std::vector<u8> argmax_ref(windows, 9);
    launch({2, envs, 1}, {64, 1, 1}, [&] {
        slot_passthrough_f32(h.data(), mode.data(), holds.data(), y.data(), envs, batch, features);
    });
    launch({4, 1, 1}, {64, 1, 1}, [&] {
        slot_blend_select_f32(h.data(), sv.data(), alpha.data(), gate.data(), mode.data(), holds.data() + 2 * envs,
                              s_mine_ref.data(), y.data(), envs, batch, features);
    });
    launch({2, 1, 1}, {64, 1, 1}, [&] {
        max_pool2x2_forward_f32(y.data(), pooled_ref.data(), argmax_ref.data(), (u64)envs * batch * channels, size,
                                size);
    });
    std::vector<float> s_mine(n, NAN), pooled(windows, NAN);
    std::vector<u8> argmax(windows, 9);
    launch({1, envs, 1}, {32, 1, 1}, [&] {
        slot_passthrough_pool_f32(h.data(), mode.data(), holds.data(), pooled.data(), argmax.data(), envs, batch,
                                  channels, size);
    });
    launch({2, 1, 1}, {32, 1, 1}, [&] {
        slot_blend_select_pool_f32(h.data(), sv.data(), alpha.data(), gate.data(), mode.data(),
                                   holds.data() + 2 * envs, s_mine.data(), pooled.data(), argmax.data(), envs, batch,
                                   channels, size);
    });
    size_t wrong = 0;
    for (size_t o = 0; o < windows; ++o) wrong += !same_bits(pooled[o], pooled_ref[o]) + (argmax[o] != argmax_ref[o]);
    for (size_t t = 0; t < n; ++t) wrong += !same_bits(s_mine[t], s_mine_ref[t]);
    bool planted = std::isnan(pooled_ref[windows / envs * 5]);
    char detail[160];
    std::snprintf(detail, sizeof detail, "%zu of %zu pooled values, winners and kept seed values wrong%s", wrong,
                  2 * windows + n, planted ? "" : "; the planted NaN did not reach the reference");
    report("slot_passthrough_pool_f32 + slot_blend_select_pool_f32 (6 modes, 6×6)", wrong == 0 && planted, detail);
}

// The slot's backward split with its block's pool backward fused in (slot_backward_split_pool_f32)
// against max_pool2x2_backward_f32 routing the pooled gradient, then slot_backward_split_f32 (checked
// against the CPU by the selftest): dh and ds bit for bit — the non-winners' zeros included, which
// MULTIPLY's ds turns into −0 where h < 0 — over the six modes of check_slot_rows on 6×6 planes.
static void check_slot_pool_backward() {
    const unsigned envs = 6, batch = 3, channels = 2, size = 6, features = channels * size * size;
    size_t n = (size_t)envs * batch * features, windows = n / 4;
    auto h = values(n, -1.0f, 1.0f), s_mine = values(n, -1.0f, 1.0f), gate = values(envs * batch, -0.2f, 1.2f);
    auto dy = values(windows, -1.0f, 1.0f);
    std::vector<u8> mode = {2, 3, 4, 1, 2, 0}, argmax(windows);
    for (size_t o = 0; o < windows; ++o) argmax[o] = (u8)((o * 7 + 3) % 4);
    std::vector<float> alpha = {0.3f, 0.7f, 1.5f, 0.5f, 0.2f, 0.9f};
    std::vector<float> routed(n, NAN), dh_ref(n, NAN), ds_ref(n, NAN), dh(n, NAN), ds(n, NAN);
    launch({2, 1, 1}, {64, 1, 1}, [&] {
        max_pool2x2_backward_f32(dy.data(), argmax.data(), routed.data(), (u64)envs * batch * channels, size, size);
    });
    launch({3, 1, 1}, {64, 1, 1}, [&] {
        slot_backward_split_f32(routed.data(), h.data(), s_mine.data(), alpha.data(), gate.data(), mode.data(),
                                dh_ref.data(), ds_ref.data(), envs, batch, features);
    });
    launch({2, 1, 1}, {32, 1, 1}, [&] {
        slot_backward_split_pool_f32(dy.data(), argmax.data(), h.data(), s_mine.data(), alpha.data(), gate.data(),
                                     mode.data(), dh.data(), ds.data(), envs, batch, channels, size);
    });
    size_t wrong = 0, negative_zeros = 0;
    for (size_t t = 0; t < n; ++t) {
        wrong += !same_bits(dh[t], dh_ref[t]) + !same_bits(ds[t], ds_ref[t]);
        negative_zeros += ds_ref[t] == 0.0f && std::signbit(ds_ref[t]);
    }
    char detail[160];
    std::snprintf(detail, sizeof detail, "%zu of %zu gradients wrong (%zu of the reference's are -0)", wrong, 2 * n,
                  negative_zeros);
    report("slot_backward_split_pool_f32 (6 modes, 6×6)", wrong == 0 && negative_zeros > 0, detail);
}

static void check_head(unsigned envs, unsigned batch, unsigned classes) {
    size_t samples = (size_t)envs * batch;
    auto logits = values(samples * classes, -3.0f, 3.0f);
    std::vector<u8> labels(samples);
    for (size_t i = 0; i < samples; ++i) {
        labels[i] = (u8)(i * 7 % classes);
        if (i % 5 == 0) logits[i * classes + 2] = logits[i * classes + 1];  // a tie for the largest, sometimes
    }
    std::vector<u8> count_labels = labels;
    count_labels[1] = (u8)classes;  // padding: never correct
    float inv_batch = 1.0f / (float)batch;
    std::vector<float> loss_ref(envs), grad_ref(samples * classes);
    std::vector<unsigned> correct_ref(envs, 0);
    for (size_t e = 0; e < envs; ++e) {
        float total = 0.0f;
        for (size_t b = 0; b < batch; ++b) {
            size_t i = e * batch + b;
            const float* z = &logits[i * classes];
            float m = z[0];
            for (unsigned k = 1; k < classes; ++k) m = fmaxf(m, z[k]);
            float sum = 0.0f;
            for (unsigned k = 0; k < classes; ++k) sum += expf(z[k] - m);
            total += m + logf(sum) - z[labels[i]];
            float scale = inv_batch / sum;
            for (unsigned k = 0; k < classes; ++k) grad_ref[i * classes + k] = expf(z[k] - m) * scale;
            grad_ref[i * classes + labels[i]] -= inv_batch;
            unsigned best = 0;
            for (unsigned k = 1; k < classes; ++k)
                if (z[k] > z[best]) best = k;
            correct_ref[e] += best == count_labels[i];
        }
        loss_ref[e] = total * inv_batch;
    }
    std::vector<float> loss(envs, NAN), grad(samples * classes, NAN);
    launch({envs, 1, 1}, {REDUCE_THREADS, 1, 1}, [&] {
        softmax_cross_entropy_f32(logits.data(), labels.data(), loss.data(), grad.data(), envs, batch, classes, 1);
    });
    size_t wrong = 0;
    for (size_t e = 0; e < envs; ++e) wrong += !same_bits(loss[e], loss_ref[e]);
    for (size_t i = 0; i < grad.size(); ++i) wrong += !same_bits(grad[i], grad_ref[i]);
    char what[160], detail[160];
    std::snprintf(what, sizeof what, "softmax_cross_entropy_f32 E%u B%u classes %u", envs, batch, classes);
    std::snprintf(detail, sizeof detail, "%zu of %zu losses and gradients differ in bits", wrong, envs + grad.size());
    report(what, wrong == 0, detail);
    std::vector<unsigned> correct(envs, 12345);
    launch({envs, 1, 1}, {REDUCE_THREADS, 1, 1}, [&] {
        count_correct_f32(logits.data(), count_labels.data(), correct.data(), envs, batch, classes);
    });
    wrong = 0;
    for (size_t e = 0; e < envs; ++e) wrong += correct[e] != correct_ref[e];
    std::snprintf(what, sizeof what, "count_correct_f32 E%u B%u classes %u", envs, batch, classes);
    std::snprintf(detail, sizeof detail, "%zu of %u counts differ (env 0: %u correct)", wrong, envs, correct_ref[0]);
    report(what, wrong == 0, detail);
}

int main() {
    // The host's blocks and seeds (32×32 from 3 and 8 channels, 16×16, 8×8 from 32), and the edges: a
    // 6×8 plane (12 threads an image, 21 images a block: 22 make a full block and a short one), input
    // channels past a 4-channel chunk, output channels past a block of 8, 4×4 planes (64 images a block).
    check_conv(2, 3, 3, 8, 32, 32);
    check_conv(1, 2, 8, 8, 32, 32);
    check_conv(2, 5, 8, 16, 16, 16);
    check_conv(1, 17, 32, 32, 8, 8);
    check_conv(2, 22, 5, 12, 6, 8);
    check_conv(1, 70, 6, 8, 4, 4);
    // The direct weight gradient: the same shapes, one run and several (the last short).
    check_wgrad(2, 3, 3, 8, 32, 32, 1);
    check_wgrad(1, 3, 8, 8, 32, 32, 2);
    check_wgrad(2, 5, 8, 16, 16, 16, 1);
    check_wgrad(1, 37, 32, 32, 8, 8, 1);
    check_wgrad(2, 22, 5, 12, 6, 8, 1);
    check_wgrad(1, 140, 6, 8, 4, 4, 1);
    check_wgrad(1, 140, 6, 8, 4, 4, 2);
    // The tensor-core convolutions: the host's blocks and seeds, one n-tile and two (and a second block
    // of two: 40 channels), a short last chunk (5 and 6 channels), partial m-tiles (6×8: 21 images of 48
    // pixels a block), several runs.
    check_tc(2, 3, 3, 8, 32, 32, 1);
    check_tc(1, 3, 8, 16, 16, 16, 2);
    check_tc(1, 17, 32, 32, 8, 8, 1);
    check_tc(2, 22, 5, 12, 6, 8, 1);
    check_tc(1, 70, 6, 40, 4, 4, 1);
    check_tc(1, 140, 6, 8, 4, 4, 2);
    // The square kernels past the host's shapes: 12 output channels in two n-tiles (lanes past c_out), 20
    // in two blocks of 16 with 5 input channels (a short chunk), 37 images of 8×8 in three groups (the
    // last of 5) and two runs.
    check_tc(1, 5, 12, 12, 16, 16, 2);
    check_tc(1, 2, 5, 20, 32, 32, 1);
    check_tc(2, 37, 16, 8, 8, 8, 2);
    // Their shared loads' bank passes: the host's blocks and the seeds' convolutions.
    check_tc_banks(3, 8, 32);
    check_tc_banks(8, 8, 32);
    check_tc_banks(8, 16, 16);
    check_tc_banks(16, 16, 16);
    check_tc_banks(16, 32, 8);
    check_tc_banks(32, 32, 8);
    // The forward's epilogue statistics: the host's three blocks (one image a block at 32×32: 3 runs; 16
    // at 8×8: a short last run), a short last run at 6×8 with 12 channels, and a mean far from zero.
    check_tc_stats(2, 3, 3, 8, 32, 32, 0.0f);
    check_tc_stats(1, 9, 8, 16, 16, 16, 0.0f);
    check_tc_stats(2, 40, 16, 32, 8, 8, 0.0f);
    check_tc_stats(1, 43, 5, 12, 6, 8, 0.0f);
    check_tc_stats(1, 5, 8, 16, 16, 16, 50.0f);
    // 5×4 planes: 7 images are 140 pixels, the last m-tile partial (its rows past the images not counted).
    check_tc_stats(1, 7, 3, 8, 5, 4, 0.0f);
    // The staged backwards reading batch norm's gradient on load: the host's three blocks (3 → 8 at
    // 32×32, 8 → 16 at 16×16, 16 → 32 at 8×8, the last in three runs), an oblong plane with short chunks.
    for (int mode : {BN_LOAD_POOLED, BN_LOAD_RELU}) {
        check_staged_bn(2, 2, 3, 8, 32, 32, 1, mode);
        check_staged_bn(1, 5, 8, 16, 16, 16, 1, mode);
        check_staged_bn(1, 33, 16, 32, 8, 8, 1, mode);
        check_staged_bn(2, 21, 5, 12, 6, 8, 1, mode);
        // The other square _bnpool kernels: 8×8 with a short last image group and runs of 3 groups,
        // 16×16 with output channels (5) past c_out in the n-tile and two input chunks, 32×32 with a
        // second, partial output group.
        check_staged_bn(1, 40, 4, 8, 8, 8, 3, mode);
        check_staged_bn(1, 9, 6, 5, 16, 16, 2, mode);
        check_staged_bn(1, 2, 3, 20, 32, 32, 1, mode);
    }
    // The fused normalisation + ReLU + pool and its backward: square and oblong even planes.
    check_fused_pool(2, 3, 4, 8, 8);
    check_fused_pool(5, 2, 3, 6, 6);  // an r0 slot's five envs: ADD, INCUBATOR, OFF, ADD, INCUBATOR
    check_fused_pool(1, 5, 3, 8, 6);
    // Runs of 3 414 values: each thread's loads four at a time (bn_run_loop's batches) and the rest one
    // by one, where the runs above are all rest.
    check_fused_pool(1, 40, 2, 16, 16);
    // Batch norm: one run, several (the last short), and a mean far from zero.
    check_batch_norm(3, 4, 5, 49, 1, -2.0f, 3.0f);
    check_batch_norm(2, 41, 3, 225, 4, 40.0f, 44.0f);
    check_batch_norm(2, 9, 2, 64, 7, -1.0f, 1.0f);
    // Group norm: the seeds' planes (one group of many channels, and several of one each, a plane not
    // a multiple of 8); the head at a batch past one block's 256 samples and below it.
    check_group_norm(2, 3, 8, 8, 8, 4);
    check_group_norm(1, 4, 32, 8, 8, 2);
    check_group_norm(2, 2, 6, 5, 3, 3);
    // The staged forward's largest groups (conv_light's 8 channels in 8 groups at 32×32: 1 024 values)
    // and a last block of 4 pairs (20 pairs of 16 values).
    check_group_norm(2, 3, 8, 32, 32, 8);
    check_group_norm(1, 5, 4, 4, 4, 4);
    check_group_norm(1, 300, 4, 2, 2, 2);  // more images than the finish's threads
    check_gathers(8);
    check_gathers(5);
    check_pools(7, 8, 8);
    check_pools(5, 5, 7);
    check_pools(13, 16, 16);  // enough elements for four a thread in the average pool's backward
    check_scale_planes(96, 256);
    check_scale_planes(37, 67);
    check_slot_rows();
    check_slot_pool();
    check_slot_pool_backward();
    check_head(3, 300, 10);
    check_head(2, 37, 10);
    std::printf("%d of %d checks passed\n", checks - failures, checks);
    return failures == 0 ? 0 : 1;
}
