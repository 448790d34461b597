//! 2-D convolution over envs, stride 1, with zero padding and channel groups (depthwise = `groups == c_in`).
//!
//! Layouts: input `[E, B, c_in, h, w]`, weight `[E, c_out, c_in/groups, k, k]`, output
//! `[E, B, c_out, h_out, w_out]` with `h_out = h + 2·pad − k + 1` (so `k = 3, pad = 1` and `k = 1, pad = 0`
//! keep the size). No bias: every conv in the host and the seeds is followed by a norm.
//!
//! How it is computed. One image is copied into a zero-padded scratch plane per channel, of row width
//! `wp = w + 2·pad`. In that layout tap `(ky, kx)` of output position `q = y·wp + x` reads input position
//! `q + ky·wp + kx`: every tap is a constant shift of one contiguous run. So the output of an image is a
//! sum of shifted, scaled copies of contiguous runs, computed in tiles of `TILE` positions × `BLOCK` output
//! channels held in registers (the `wp − w_out` junk positions per row are computed and thrown away). The
//! input gradient is the same correlation applied to the output gradient with the weight transposed per
//! group and flipped in space, and padding `k − 1 − pad`. The weight gradient is, per (output channel,
//! input channel, tap), a dot product of the output gradient (in the same padded-width layout, zero on the
//! junk positions) with a shifted run of the padded input, summed over the env's images in order.
//!
//! Parallelism and determinism: forward and input gradient run one task per (env, image). The weight
//! gradient runs one task per env on one thread or with at least two envs per thread (the input is then
//! padded and read once per image for all output channels: this is where a batch of envs beats one env),
//! else one task per (env, block of output channels) so that the threads share an env. Either way each
//! element sums over the env's images in a fixed order with [`LANES`] interleaved partial sums. No value's
//! summation order depends on the env count or on how rayon splits the work.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::conv_avx512;
use super::norm::plane_mean_and_m2;
use super::real::{LANES, Real, tree_sum};

/// Output positions computed together (two AVX2 vectors of f32).
const TILE: usize = 16;
/// Output channels computed together.
const BLOCK: usize = 4;
/// Output channels computed together by the AVX-512 correlation (`conv_avx512::correlate_rows8`).
const WIDE_BLOCK: usize = 8;
/// Largest kernel size (bounds the stack arrays of tap offsets).
const MAX_K: usize = 7;

/// Shape of a batched convolution. Stride is always 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dShape {
    pub envs: usize,
    pub batch: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub pad: usize,
    pub groups: usize,
}

/// The plane widths the GPU backend's square tensor-core 3×3 kernels are specialised to
/// ([`Conv2dShape::tc_square_width`]).
pub const TC_SQUARE_WIDTHS: [usize; 3] = [8, 16, 32];

impl Conv2dShape {
    /// Whether the GPU backend's staged 3×3 kernels (`conv3x3_direct_f32` and the tensor-core ones in
    /// kernels/cuda/conv.cu) take this shape, forward and input gradient alike: 3×3, padding 1 (so the
    /// gradient's padding is 1 too), one group, planes at least 4×4, of at most 1 024 positions, rows a
    /// multiple of 4 wide (every host block and seed at the host's 32×32 down to 4×4).
    pub fn fits_staged_3x3(&self) -> bool {
        self.groups == 1
            && self.k == 3
            && self.pad == 1
            && self.h >= 4
            && self.w >= 4
            && self.w.is_multiple_of(4)
            && self.h * self.w <= 1024
    }

    /// Whether the GPU backend's square tensor-core weight gradient (kernels/cuda/conv.cu,
    /// `conv3x3_wgrad_tc_n*_w*_tf32`) takes all of this shape's channels in one block: square planes of
    /// 8, 16 or 32, at most 4 input channels (one staged chunk) and 16 output channels (one output
    /// group), as the host's first block (3 → 8 at 32×32). Each value of its output gradient is then
    /// loaded exactly once, so batch norm's input gradient is computed there rather than written
    /// (`GemmConv::reads_norm_grad_once`).
    pub fn tc_weight_grad_single_block(&self) -> bool {
        self.fits_staged_3x3() && self.tc_square_width().is_some() && self.c_in <= 4 && self.c_out <= 16
    }

    /// The width of this shape's planes where the GPU backend's tensor-core 3×3 kernels specialised to
    /// square planes take them (conv.cu's `tc_place<W>`): square, of one of [`TC_SQUARE_WIDTHS`].
    pub fn tc_square_width(&self) -> Option<usize> {
        (self.h == self.w && TC_SQUARE_WIDTHS.contains(&self.w)).then_some(self.w)
    }

    pub fn h_out(&self) -> usize {
        self.h + 2 * self.pad + 1 - self.k
    }
    pub fn w_out(&self) -> usize {
        self.w + 2 * self.pad + 1 - self.k
    }
    pub fn c_in_per_group(&self) -> usize {
        self.c_in / self.groups
    }
    pub fn c_out_per_group(&self) -> usize {
        self.c_out / self.groups
    }
    /// Elements of `[E, B, c_in, h, w]`.
    pub fn input_len(&self) -> usize {
        self.envs * self.batch * self.c_in * self.h * self.w
    }
    /// Elements of `[E, B, c_out, h_out, w_out]`.
    pub fn output_len(&self) -> usize {
        self.envs * self.batch * self.c_out * self.h_out() * self.w_out()
    }
    /// Elements of one env's weight `[c_out, c_in/groups, k, k]`.
    pub fn weight_len_per_env(&self) -> usize {
        self.c_out * self.c_in_per_group() * self.k * self.k
    }
    /// Elements of `[E, c_out, c_in/groups, k, k]`.
    pub fn weight_len(&self) -> usize {
        self.envs * self.weight_len_per_env()
    }

    fn validate(&self) {
        assert!(self.k >= 1 && self.k <= MAX_K, "conv kernel size {} not in 1..={MAX_K}", self.k);
        assert!(self.pad < self.k, "conv padding {} must be below the kernel size {}", self.pad, self.k);
        assert!(self.groups >= 1, "conv needs at least one group");
        assert!(
            self.c_in.is_multiple_of(self.groups) && self.c_out.is_multiple_of(self.groups),
            "conv channels {}→{} not divisible by {} groups",
            self.c_in,
            self.c_out,
            self.groups
        );
        assert!(self.c_in > 0 && self.c_out > 0, "conv needs channels");
        assert!(
            self.h + 2 * self.pad >= self.k && self.w + 2 * self.pad >= self.k,
            "conv input smaller than kernel"
        );
        assert!(self.h > 0 && self.w > 0, "conv needs a non-empty image");
    }
}

/// The padded-width layout of one correlation of a `src_h × src_w` plane with a `k × k` kernel.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    src_h: usize,
    src_w: usize,
    pad: usize,
    k: usize,
    /// Padded row width; also the row width of the output in this layout.
    wp: usize,
    dst_h: usize,
    dst_w: usize,
    /// Output positions computed, `dst_h · wp` rounded up to a whole tile.
    q_round: usize,
    /// Length of one padded plane in scratch: every tile's every tap stays inside its own plane.
    plane: usize,
}

impl Geometry {
    fn new(src_h: usize, src_w: usize, k: usize, pad: usize) -> Self {
        let hp = src_h + 2 * pad;
        let wp = src_w + 2 * pad;
        let dst_h = hp + 1 - k;
        let dst_w = wp + 1 - k;
        let q_round = (dst_h * wp).div_ceil(TILE) * TILE;
        let plane = q_round + (k - 1) * (wp + 1);
        Self { src_h, src_w, pad, k, wp, dst_h, dst_w, q_round, plane }
    }

    /// Offset of tap `t = ky·k + kx` in the padded layout.
    fn tap_offsets(&self) -> [usize; MAX_K * MAX_K] {
        let mut offsets = [0; MAX_K * MAX_K];
        for ky in 0..self.k {
            for kx in 0..self.k {
                offsets[ky * self.k + kx] = ky * self.wp + kx;
            }
        }
        offsets
    }

    /// Writes `src` (`src_h × src_w`) into `dst` (one scratch plane) with zeros all around.
    #[inline(always)]
    fn pad_plane<T: Real>(&self, src: &[T], dst: &mut [T]) {
        let (src_h, src_w, pad, wp) = (self.src_h, self.src_w, self.pad, self.wp);
        // Zero only what the copy does not overwrite: the top band, the side margins, the bottom and slack.
        dst[..pad * wp + pad].fill(T::ZERO);
        for y in 0..src_h {
            let row = (y + pad) * wp + pad;
            copy_short(&mut dst[row..row + src_w], &src[y * src_w..(y + 1) * src_w]);
            if y + 1 < src_h {
                // Right margin of this row and left margin of the next: 2·pad elements, no memset call.
                for v in &mut dst[row + src_w..row + wp] {
                    *v = T::ZERO;
                }
            } else {
                dst[row + src_w..].fill(T::ZERO);
            }
        }
    }
}

/// Where the weight of (destination channel, source channel, tap) lives in one env's weight tensor.
#[derive(Clone, Copy, Debug)]
struct WeightLayout {
    group_stride: usize,
    dst_stride: usize,
    src_stride: usize,
    /// Taps reversed (the input gradient correlates with the spatially flipped kernel).
    flip: bool,
}

impl WeightLayout {
    fn forward(s: &Conv2dShape) -> Self {
        let kk = s.k * s.k;
        Self {
            group_stride: s.c_out_per_group() * s.c_in_per_group() * kk,
            dst_stride: s.c_in_per_group() * kk,
            src_stride: kk,
            flip: false,
        }
    }

    /// Transposed per group and flipped: destination = input channel, source = output channel.
    fn input_gradient(s: &Conv2dShape) -> Self {
        let kk = s.k * s.k;
        Self {
            group_stride: s.c_out_per_group() * s.c_in_per_group() * kk,
            dst_stride: kk,
            src_stride: s.c_in_per_group() * kk,
            flip: true,
        }
    }
}

/// One correlation of a source image into a destination image: what stays fixed over a call.
#[derive(Clone, Copy, Debug)]
struct Correlation {
    src_channels: usize,
    dst_channels: usize,
    groups: usize,
    geo: Geometry,
    layout: WeightLayout,
    /// Add into the destination instead of overwriting it.
    accumulate: bool,
}

/// Which build of the hot loops runs: the portable code (compiled for AVX2 where the CPU has it) or the
/// AVX-512 kernels of `conv_avx512` where they apply. Both give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// Whether `T` is `f32` (the AVX-512 kernels are written for it).
#[cfg(target_arch = "x86_64")]
fn is_f32<T: Real>() -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

/// `values` as `f32`, when `T` is `f32`.
#[cfg(target_arch = "x86_64")]
fn as_f32<T: Real>(values: &[T]) -> Option<&[f32]> {
    is_f32::<T>()
        // SAFETY: T is f32, so the slice's layout is that of a [f32].
        .then(|| unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<f32>(), values.len()) })
}

/// [`as_f32`] for a mutable slice.
#[cfg(target_arch = "x86_64")]
fn as_f32_mut<T: Real>(values: &mut [T]) -> Option<&mut [f32]> {
    is_f32::<T>()
        // SAFETY: T is f32, so the slice's layout is that of a [f32].
        .then(|| unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<f32>(), values.len()) })
}

impl Correlation {
    fn src_per_group(&self) -> usize {
        self.src_channels / self.groups
    }
    fn dst_per_group(&self) -> usize {
        self.dst_channels / self.groups
    }
    /// Elements of one env's packed weights ([`pack_weights`]).
    fn packed_len(&self) -> usize {
        self.dst_channels * self.src_per_group() * self.geo.k * self.geo.k
    }
    /// Scratch elements [`correlate_image`] needs: padded source planes and one block of output rows
    /// (blocks as wide as the AVX-512 kernel's).
    fn scratch_len(&self) -> usize {
        self.src_channels * self.geo.plane + WIDE_BLOCK * self.geo.q_round
    }
}

/// The blocks of destination channels of one group, in order: `(first channel, width)`. The widths are
/// the widest the kernels have that still fit, so the split depends only on the group size and on
/// whether the AVX-512 kernels run (which changes the blocking, never a value).
fn dst_blocks(dst_per_group: usize, kernels: Kernels) -> impl Iterator<Item = (usize, usize)> {
    let mut o = 0;
    std::iter::from_fn(move || {
        if o >= dst_per_group {
            return None;
        }
        let n = if kernels != Kernels::Portable && o + WIDE_BLOCK <= dst_per_group {
            WIDE_BLOCK
        } else if o + BLOCK <= dst_per_group {
            BLOCK
        } else if o + 2 <= dst_per_group {
            2
        } else {
            1
        };
        o += n;
        Some((o - n, n))
    })
}

/// One env's weights packed for [`correlate_image`]: per group, per block of [`dst_blocks`], as
/// `[src][tap][n]` so the inner loop reads them in order. Done once per run of images, not per image.
fn pack_weights<T: Real>(c: &Correlation, weight: &[T], kernels: Kernels, packed: &mut [T]) {
    let (src_per_group, dst_per_group) = (c.src_per_group(), c.dst_per_group());
    let kk = c.geo.k * c.geo.k;
    let mut at = 0;
    for g in 0..c.groups {
        for (o, n) in dst_blocks(dst_per_group, kernels) {
            for s in 0..src_per_group {
                for t in 0..kk {
                    let w_tap = if c.layout.flip { kk - 1 - t } else { t };
                    for j in 0..n {
                        let index = g * c.layout.group_stride
                            + (o + j) * c.layout.dst_stride
                            + s * c.layout.src_stride
                            + w_tap;
                        packed[at] = weight[index];
                        at += 1;
                    }
                }
            }
        }
    }
    debug_assert_eq!(at, packed.len());
}

/// `dst[o] (= or +=) Σ_{s in o's group} Σ_taps weight(o, s, tap) · shift_tap(src_padded[s])` for one image,
/// from the weights [`pack_weights`] packed with the same `kernels`.
#[inline(always)]
fn correlate_image<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    packed_weights: &[T],
    scratch: &mut [T],
    kernels: Kernels,
    rows: bool,
) {
    let geo = c.geo;
    let plane_src = geo.src_h * geo.src_w;
    let plane_dst = geo.dst_h * geo.dst_w;
    let (src_per_group, dst_per_group) = (c.src_per_group(), c.dst_per_group());
    let kk = geo.k * geo.k;
    let taps = geo.tap_offsets();
    let (padded, tile_out) = scratch.split_at_mut(c.src_channels * geo.plane);
    for (ch, plane) in padded.chunks_exact_mut(geo.plane).enumerate() {
        geo.pad_plane(&src[ch * plane_src..(ch + 1) * plane_src], plane);
    }
    let mut packed_at = 0;
    for g in 0..c.groups {
        let group_src = &padded[g * src_per_group * geo.plane..(g + 1) * src_per_group * geo.plane];
        for (o, n) in dst_blocks(dst_per_group, kernels) {
            let packed = &packed_weights[packed_at..packed_at + n * src_per_group * kk];
            packed_at += packed.len();
            match n {
                #[cfg(target_arch = "x86_64")]
                WIDE_BLOCK if rows => {
                    let (src, packed) = (as_f32(group_src).unwrap(), as_f32(packed).unwrap());
                    let out = &mut dst[(g * dst_per_group + o) * plane_dst..][..WIDE_BLOCK * plane_dst];
                    let (out, size) = (as_f32_mut(out).unwrap(), (geo.dst_h, geo.dst_w));
                    let (taps, plane, wp, acc) = (&taps[..kk], geo.plane, geo.wp, c.accumulate);
                    // SAFETY: as below (`rows` is only set under Kernels::Avx512, see correlate_run).
                    unsafe {
                        if geo.dst_w == 8 {
                            conv_avx512::correlate_rows8::<true>(src, plane, wp, size, taps, packed, out, acc)
                        } else {
                            conv_avx512::correlate_rows8::<false>(
                                src, plane, wp, size, taps, packed, out, acc,
                            )
                        }
                    };
                    continue;
                }
                #[cfg(target_arch = "x86_64")]
                WIDE_BLOCK => {
                    let (src, packed) = (as_f32(group_src).unwrap(), as_f32(packed).unwrap());
                    let out = as_f32_mut(tile_out).unwrap();
                    // The padded-width layout as one row of `q_round` positions, junk included, into the tile.
                    let (q, taps) = (geo.q_round, &taps[..kk]);
                    // SAFETY: a wide block is only chosen under Kernels::Avx512, which dispatch_correlate
                    // picks only where conv_avx512::available() holds and T is f32.
                    unsafe {
                        conv_avx512::correlate_rows8::<false>(
                            src,
                            geo.plane,
                            q,
                            (1, q),
                            taps,
                            packed,
                            out,
                            false,
                        )
                    };
                }
                BLOCK => correlate_block::<T, BLOCK>(group_src, &geo, &taps[..kk], packed, tile_out),
                2 => correlate_block::<T, 2>(group_src, &geo, &taps[..kk], packed, tile_out),
                _ => correlate_block::<T, 1>(group_src, &geo, &taps[..kk], packed, tile_out),
            }
            for j in 0..n {
                let computed = &tile_out[j * geo.q_round..(j + 1) * geo.q_round];
                let out = &mut dst[(g * dst_per_group + o + j) * plane_dst..][..plane_dst];
                for y in 0..geo.dst_h {
                    let from = &computed[y * geo.wp..y * geo.wp + geo.dst_w];
                    let to = &mut out[y * geo.dst_w..(y + 1) * geo.dst_w];
                    if c.accumulate {
                        for (a, &b) in to.iter_mut().zip(from) {
                            *a += b;
                        }
                    } else {
                        copy_short(to, from);
                    }
                }
            }
        }
    }
}

/// Computes `N` output channels over all positions of the padded-width layout into `out` (`N` rows of
/// `q_round`), from the group's padded source planes and weights packed as `[src][tap][N]`. Each output
/// is a fused multiply-add chain over (source channel, tap) in that order.
#[inline(always)]
fn correlate_block<T: Real, const N: usize>(
    src: &[T],
    geo: &Geometry,
    taps: &[usize],
    packed: &[T],
    out: &mut [T],
) {
    let (q_round, plane) = (geo.q_round, geo.plane);
    let kk = taps.len();
    for q0 in (0..q_round).step_by(TILE) {
        let mut acc = [[T::ZERO; TILE]; N];
        for (src_plane, weights) in src.chunks_exact(plane).zip(packed.chunks_exact(kk * N)) {
            for (&offset, w) in taps.iter().zip(weights.chunks_exact(N)) {
                let run: &[T; TILE] = src_plane[q0 + offset..q0 + offset + TILE].try_into().unwrap();
                for j in 0..N {
                    let wv = w[j];
                    for l in 0..TILE {
                        acc[j][l] = wv.mul_add(run[l], acc[j][l]);
                    }
                }
            }
        }
        for j in 0..N {
            out[j * q_round + q0..j * q_round + q0 + TILE].copy_from_slice(&acc[j]);
        }
    }
}

/// `dst.copy_from_slice(src)` for short rows without a call into `memcpy`.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let b: &[T; 8] = b.try_into().unwrap();
        let a: &mut [T; 8] = a.try_into().unwrap();
        *a = *b;
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a = *b;
    }
}

fn check_lengths<T>(shape: &Conv2dShape, input: &[T], weight: &[T], output: &[T]) {
    shape.validate();
    assert_eq!(input.len(), shape.input_len(), "conv input length");
    assert_eq!(weight.len(), shape.weight_len(), "conv weight length");
    assert_eq!(output.len(), shape.output_len(), "conv output length");
}

/// `output = conv(input, weight)` per env (overwrites `output`).
pub fn conv2d_forward<T: Real>(shape: Conv2dShape, input: &[T], weight: &[T], output: &mut [T]) {
    forward(shape, input, weight, output, None);
}

/// [`conv2d_forward`] that also writes the statistics of every output plane while it is still in cache:
/// `plane_stats[e, b, c] = (mean, Σ (v − mean)²)` over the `h_out·w_out` values of plane `(e, b, c)`, as
/// [`plane_mean_and_m2`] computes them (`plane_stats` is `[E, B, c_out, 2]`). A batch norm that follows
/// combines them into its batch statistics without reading the output again.
pub fn conv2d_forward_with_plane_stats<T: Real>(
    shape: Conv2dShape,
    input: &[T],
    weight: &[T],
    output: &mut [T],
    plane_stats: &mut [T],
) {
    assert_eq!(plane_stats.len(), 2 * shape.envs * shape.batch * shape.c_out, "conv plane statistics length");
    forward(shape, input, weight, output, Some(plane_stats));
}

fn forward<T: Real>(
    shape: Conv2dShape,
    input: &[T],
    weight: &[T],
    output: &mut [T],
    plane_stats: Option<&mut [T]>,
) {
    check_lengths(&shape, input, weight, output);
    if output.is_empty() {
        return;
    }
    let in_image = shape.c_in * shape.h * shape.w;
    let out_image = shape.c_out * shape.h_out() * shape.w_out();
    let w_env = shape.weight_len_per_env();
    let (from, to) = ((input, in_image), (output, out_image));
    correlate_runs(&forward_correlation(&shape), shape.batch, from, to, (weight, w_env), plane_stats);
}

fn forward_correlation(shape: &Conv2dShape) -> Correlation {
    Correlation {
        src_channels: shape.c_in,
        dst_channels: shape.c_out,
        groups: shape.groups,
        geo: Geometry::new(shape.h, shape.w, shape.k, shape.pad),
        layout: WeightLayout::forward(shape),
        accumulate: false,
    }
}

/// [`conv2d_forward`] of a run of images of one env on the calling thread: `input` and `output` hold
/// whole images of that env (any number), `weight` is the env's `[c_out, c_in/groups, k, k]`; `shape`'s
/// `envs` and `batch` are not read. Every image gets the bits [`conv2d_forward`] gives it. For callers
/// that run their own parallel loop over runs of [`RUN_IMAGES`] images and finish each run's output while
/// it is in cache.
pub(crate) fn conv2d_forward_run<T: Real>(shape: &Conv2dShape, input: &[T], weight: &[T], output: &mut [T]) {
    let out_image = shape.c_out * shape.h_out() * shape.w_out();
    assert_eq!(weight.len(), shape.weight_len_per_env(), "conv weight length per env");
    assert_eq!(input.len() / (shape.c_in * shape.h * shape.w), output.len() / out_image, "conv run images");
    if !output.is_empty() {
        dispatch_correlate(&forward_correlation(shape), input, output, weight, None);
    }
}

/// Images per task of the forward and input-gradient correlations: a task packs its env's weights once.
pub(crate) const RUN_IMAGES: usize = 8;

/// Correlates every image of `src` (images of `src_image` elements, `batch` per env) into `dst`, one task
/// per run of up to [`RUN_IMAGES`] images of one env; with `stats`, also each output image's plane
/// statistics (`2 · dst_channels` per image). `weight` holds `w_env` elements per env. Each image is
/// computed exactly as alone.
fn correlate_runs<T: Real>(
    c: &Correlation,
    batch: usize,
    (src, src_image): (&[T], usize),
    (dst, dst_image): (&mut [T], usize),
    (weight, w_env): (&[T], usize),
    stats: Option<&mut [T]>,
) {
    let run = RUN_IMAGES.min(batch);
    let env_tasks = dst.par_chunks_mut(batch * dst_image).zip(src.par_chunks(batch * src_image)).enumerate();
    match stats {
        None => env_tasks.for_each(|(e, (dst, src))| {
            let weight = &weight[e * w_env..(e + 1) * w_env];
            dst.par_chunks_mut(run * dst_image)
                .zip(src.par_chunks(run * src_image))
                .for_each(|(dst, src)| dispatch_correlate(c, src, dst, weight, None));
        }),
        Some(stats) => env_tasks.zip(stats.par_chunks_mut(batch * 2 * c.dst_channels)).for_each(
            |((e, (dst, src)), stats)| {
                let weight = &weight[e * w_env..(e + 1) * w_env];
                dst.par_chunks_mut(run * dst_image)
                    .zip(src.par_chunks(run * src_image))
                    .zip(stats.par_chunks_mut(run * 2 * c.dst_channels))
                    .for_each(|((dst, src), stats)| dispatch_correlate(c, src, dst, weight, Some(stats)));
            },
        ),
    }
}

/// Per-plane `(mean, M2)` of one output image into `stats` (`[c_out, 2]`).
#[inline(always)]
fn image_plane_stats<T: Real>(c: &Correlation, out: &[T], stats: &mut [T]) {
    let plane = c.geo.dst_h * c.geo.dst_w;
    for (values, s) in out.chunks_exact(plane).zip(stats.chunks_exact_mut(2)) {
        (s[0], s[1]) = plane_mean_and_m2(values);
    }
}

/// `grad_input = ∂L/∂input` given `grad_output = ∂L/∂output` (overwrites `grad_input`).
pub fn conv2d_backward_input<T: Real>(
    shape: Conv2dShape,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) {
    backward_input(shape, grad_output, weight, grad_input, false);
}

/// `grad_input += ∂L/∂input`: for an input that also feeds a residual path.
pub fn conv2d_backward_input_accumulate<T: Real>(
    shape: Conv2dShape,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) {
    backward_input(shape, grad_output, weight, grad_input, true);
}

fn backward_input<T: Real>(
    shape: Conv2dShape,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
    accumulate: bool,
) {
    check_lengths(&shape, grad_input, weight, grad_output);
    if grad_input.is_empty() {
        return;
    }
    let geo = Geometry::new(shape.h_out(), shape.w_out(), shape.k, shape.k - 1 - shape.pad);
    debug_assert_eq!((geo.dst_h, geo.dst_w), (shape.h, shape.w));
    let in_image = shape.c_in * shape.h * shape.w;
    let out_image = shape.c_out * shape.h_out() * shape.w_out();
    let w_env = shape.weight_len_per_env();
    let correlation = Correlation {
        src_channels: shape.c_out,
        dst_channels: shape.c_in,
        groups: shape.groups,
        geo,
        layout: WeightLayout::input_gradient(&shape),
        accumulate,
    };
    let (from, to) = ((grad_output, out_image), (grad_input, in_image));
    correlate_runs(&correlation, shape.batch, from, to, (weight, w_env), None);
}

/// `grad_weight = ∂L/∂weight` (overwrites), summed over each env's images in order.
pub fn conv2d_backward_weight<T: Real>(
    shape: Conv2dShape,
    input: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
) {
    check_lengths(&shape, input, grad_weight, grad_output);
    if grad_weight.is_empty() {
        return;
    }
    if shape.batch == 0 {
        grad_weight.fill(T::ZERO);
        return;
    }
    // Blocks of output channels never straddle a group, so each task's rows are one contiguous chunk.
    let block = weight_grad_block_width(shape.c_out_per_group());
    let blocks_per_env = shape.c_out / block;
    // With enough envs to keep every thread busy (or one thread), a task takes a whole env: its input
    // planes are padded and read once per image for all output channels instead of once per block. With
    // fewer envs than that, a task takes one block of an env so that the threads share an env's work.
    // Each weight-gradient element is summed in the same order either way: the split changes only speed.
    let threads = rayon::current_num_threads();
    let whole_envs = threads == 1 || shape.envs >= 2 * threads;
    let blocks_per_task = if whole_envs { blocks_per_env } else { 1 };
    let chunk = blocks_per_task * block * shape.c_in_per_group() * shape.k * shape.k;
    let in_env = shape.batch * shape.c_in * shape.h * shape.w;
    let out_env = shape.batch * shape.c_out * shape.h_out() * shape.w_out();
    let tasks_per_env = blocks_per_env / blocks_per_task;
    grad_weight.par_chunks_mut(chunk).enumerate().for_each(|(task, dw)| {
        let e = task / tasks_per_env;
        let job = WeightGradJob {
            shape: &shape,
            geo: Geometry::new(shape.h, shape.w, shape.k, shape.pad),
            input: &input[e * in_env..(e + 1) * in_env],
            grad_output: &grad_output[e * out_env..(e + 1) * out_env],
            first_out: (task % tasks_per_env) * blocks_per_task * block,
            blocks: blocks_per_task,
        };
        match block {
            BLOCK => dispatch_weight_grad::<T, BLOCK>(&job, dw),
            2 => dispatch_weight_grad::<T, 2>(&job, dw),
            _ => dispatch_weight_grad::<T, 1>(&job, dw),
        }
    });
}

/// One env's images and `blocks` consecutive blocks of output channels.
struct WeightGradJob<'a, T> {
    shape: &'a Conv2dShape,
    geo: Geometry,
    /// `[B, c_in, h, w]` of this env.
    input: &'a [T],
    /// `[B, c_out, h_out, w_out]` of this env.
    grad_output: &'a [T],
    first_out: usize,
    blocks: usize,
}

impl<T> WeightGradJob<'_, T> {
    /// The groups the job's output channels belong to, as a range.
    fn groups<const N: usize>(&self) -> std::ops::Range<usize> {
        let cout_g = self.shape.c_out_per_group();
        let last_out = self.first_out + self.blocks * N - 1;
        self.first_out / cout_g..last_out / cout_g + 1
    }
}

/// `dw[j, s, tap] = Σ_images Σ_q dy_padded[j][q] · x_padded[s][q + offset(tap)]`, for the job's output
/// channels (`blocks` blocks of `N`): per image, the input planes of the job's groups are padded once and
/// serve every block.
#[inline(always)]
fn weight_grad_block<T: Real, const N: usize>(
    job: &WeightGradJob<'_, T>,
    dw: &mut [T],
    scratch: &mut [T],
    add_run: impl Fn(&WeightGradJob<'_, T>, &[T], &[T], &mut [T], &mut [T]),
) {
    let s = job.shape;
    let run = weight_grad_run_images::<T, N>(job);
    let (lanes, work) = scratch.split_at_mut(job.blocks * N * s.c_in_per_group() * s.k * s.k * LANES);
    lanes.fill(T::ZERO);
    let (in_image, out_image) = (s.c_in * s.h * s.w, s.c_out * s.h_out() * s.w_out());
    for b0 in (0..s.batch).step_by(run) {
        let n = run.min(s.batch - b0);
        let x_run = &job.input[b0 * in_image..(b0 + n) * in_image];
        let dy_run = &job.grad_output[b0 * out_image..(b0 + n) * out_image];
        add_run(job, x_run, dy_run, lanes, work);
    }
    sum_lanes_into(lanes, dw);
}

/// The blocks' output channels per weight-gradient task block: 4 where the group allows, else 2, else 1.
fn weight_grad_block_width(cout_per_group: usize) -> usize {
    if cout_per_group.is_multiple_of(BLOCK) {
        BLOCK
    } else if cout_per_group.is_multiple_of(2) {
        2
    } else {
        1
    }
}

/// Each weight-gradient value from its `LANES` partial sums.
fn sum_lanes_into<T: Real>(lanes: &[T], dw: &mut [T]) {
    for (value, partial) in dw.iter_mut().zip(lanes.chunks_exact(LANES)) {
        *value = tree_sum(partial.try_into().unwrap());
    }
}

/// Adds a run of images to the lane sums of a weight-gradient job, image after image: `x_run` holds the
/// run's whole input images (`[n, c_in, h, w]`, `n` at most [`weight_grad_run_images`]), `dy_run` their
/// output gradient (`[n, c_out, h_out, w_out]`), `lanes` the job's `[blocks][N][cin_g][k²][LANES]`
/// partial sums, `work` the rest of [`weight_grad_scratch_len`]'s scratch. Runs added in image order give
/// every lane the same sum, in the same order, whatever their sizes.
#[inline(always)]
fn weight_grad_add_run<T: Real, const N: usize>(
    job: &WeightGradJob<'_, T>,
    x_run: &[T],
    dy_run: &[T],
    lanes: &mut [T],
    work: &mut [T],
    kernels: Kernels,
) {
    let s = job.shape;
    let geo = job.geo;
    let (cin_g, cout_g) = (s.c_in_per_group(), s.c_out_per_group());
    let kk = s.k * s.k;
    let groups = job.groups::<N>();
    let taps = geo.tap_offsets();
    let (hw, hw_out) = (s.h * s.w, s.h_out() * s.w_out());
    let block_lanes = N * cin_g * kk * LANES;
    let block_dy = N * geo.q_round;
    let image_planes = groups.len() * cin_g * geo.plane;
    let image_dy = job.blocks * block_dy;
    let run = weight_grad_run_images::<T, N>(job);
    let (in_image, out_image) = (s.c_in * s.h * s.w, s.c_out * s.h_out() * s.w_out());
    let n = x_run.len() / in_image;
    assert!(n >= 1 && n <= run && x_run.len() == n * in_image, "a run of whole input images");
    assert_eq!(dy_run.len(), n * out_image, "a run of whole output-gradient images");
    assert_eq!(lanes.len(), job.blocks * block_lanes, "the job's lane sums");
    let (padded, rest) = work.split_at_mut(run * image_planes);
    let (dy_rows, rest) = rest.split_at_mut(block_dy);
    let dy_padded = &mut rest[..run * image_dy];
    // The run's input planes padded and its output gradient interleaved once, then each (block, input
    // channel) adds the run's images in order, so every lane sums exactly as image by image.
    {
        for (r, planes) in padded.chunks_exact_mut(image_planes).take(n).enumerate() {
            let first_channel = r * s.c_in + groups.start * cin_g;
            for (c, plane) in planes.chunks_exact_mut(geo.plane).enumerate() {
                let channel = first_channel + c;
                geo.pad_plane(&x_run[channel * hw..(channel + 1) * hw], plane);
            }
        }
        for (i, interleaved) in dy_padded.chunks_exact_mut(block_dy).take(n * job.blocks).enumerate() {
            let (b, first_out) = (i / job.blocks, job.first_out + (i % job.blocks) * N);
            // The output gradient in the padded-width layout, zero on the junk positions so they add nothing,
            // interleaved by lane groups: position q of channel j at ((q / LANES)·N + j)·LANES + q % LANES,
            // so that one lane group of the whole block is contiguous.
            for (j, row) in dy_rows.chunks_exact_mut(geo.q_round).enumerate() {
                let channel = b * s.c_out + first_out + j;
                let dy = &dy_run[channel * hw_out..(channel + 1) * hw_out];
                for y in 0..geo.dst_h {
                    let (data, junk) = row[y * geo.wp..(y + 1) * geo.wp].split_at_mut(geo.dst_w);
                    copy_short(data, &dy[y * geo.dst_w..(y + 1) * geo.dst_w]);
                    for v in junk {
                        *v = T::ZERO;
                    }
                }
                row[geo.dst_h * geo.wp..].fill(T::ZERO);
            }
            for (group, interleaved) in interleaved.chunks_exact_mut(N * LANES).enumerate() {
                for (j, lanes) in interleaved.chunks_exact_mut(LANES).enumerate() {
                    let from = j * geo.q_round + group * LANES;
                    let lanes: &mut [T; LANES] = lanes.try_into().unwrap();
                    *lanes = dy_rows[from..from + LANES].try_into().unwrap();
                }
            }
        }
        for (block, lanes) in lanes.chunks_exact_mut(block_lanes).enumerate() {
            let first_out = job.first_out + block * N;
            let group_planes = (first_out / cout_g - groups.start) * cin_g;
            for c in 0..cin_g {
                let first_plane = (group_planes + c) * geo.plane;
                let first_dy = block * block_dy;
                #[cfg(target_arch = "x86_64")]
                if kernels == Kernels::Avx512 && N == 4 && s.k == 3 {
                    let taps: &[usize; 9] = taps[..9].try_into().unwrap();
                    let planes =
                        as_f32(&padded[first_plane..(n - 1) * image_planes + first_plane + geo.plane]);
                    let dy = as_f32(&dy_padded[first_dy..(n - 1) * image_dy + first_dy + block_dy]);
                    // SAFETY: Kernels::Avx512 is only passed where conv_avx512::available() holds and T is f32.
                    unsafe {
                        conv_avx512::weight_grad_taps3x3(
                            conv_avx512::TapImages {
                                planes: planes.unwrap(),
                                plane_stride: image_planes,
                                dy: dy.unwrap(),
                                dy_stride: image_dy,
                                images: n,
                                q_round: geo.q_round,
                            },
                            taps,
                            as_f32_mut(lanes).unwrap(),
                            c,
                            cin_g,
                        )
                    };
                    continue;
                }
                for r in 0..n {
                    let plane = &padded[r * image_planes + first_plane..][..geo.plane];
                    let dy_padded = &dy_padded[r * image_dy + first_dy..][..block_dy];
                    for ky in 0..s.k {
                        let row = TapRow {
                            plane,
                            dy_padded,
                            q_round: geo.q_round,
                            first_tap: ky * s.k,
                            offset: taps[ky * s.k],
                        };
                        // The taps of one kernel row are done together: their runs are shifts by one of each other.
                        match s.k {
                            3 => tap_row_partials::<T, N, 3>(&row, lanes, c, cin_g, kk),
                            1 => tap_row_partials::<T, N, 1>(&row, lanes, c, cin_g, kk),
                            _ => {
                                for kx in 0..s.k {
                                    let single = TapRow {
                                        first_tap: row.first_tap + kx,
                                        offset: row.offset + kx,
                                        ..row
                                    };
                                    tap_row_partials::<T, N, 1>(&single, lanes, c, cin_g, kk);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `KX` consecutive taps of one kernel row, for one input channel of one image.
#[derive(Clone, Copy)]
struct TapRow<'a, T> {
    /// The padded input plane.
    plane: &'a [T],
    /// The block's output gradient in the padded-width layout, interleaved by lane groups.
    dy_padded: &'a [T],
    q_round: usize,
    first_tap: usize,
    /// Offset of the first tap in the padded layout.
    offset: usize,
}

/// Adds one image's contribution to the lane partial sums of `dw[j, c, first_tap + kx]` for every block
/// row `j < N` and `kx < KX`: position `q` goes to lane `q % LANES`, in increasing `q`.
#[inline(always)]
fn tap_row_partials<T: Real, const N: usize, const KX: usize>(
    row: &TapRow<'_, T>,
    lanes: &mut [T],
    c: usize,
    cin_g: usize,
    kk: usize,
) {
    let lane_at = |j: usize, kx: usize| ((j * cin_g + c) * kk + row.first_tap + kx) * LANES;
    let mut acc = [[[T::ZERO; LANES]; KX]; N];
    for (j, a) in acc.iter_mut().enumerate() {
        for (kx, ak) in a.iter_mut().enumerate() {
            ak.copy_from_slice(&lanes[lane_at(j, kx)..lane_at(j, kx) + LANES]);
        }
    }
    let shifted = &row.plane[row.offset..row.offset + row.q_round + KX - 1];
    for q0 in (0..row.q_round).step_by(LANES) {
        for kx in 0..KX {
            let x: &[T; LANES] = shifted[q0 + kx..q0 + kx + LANES].try_into().unwrap();
            for (j, a) in acc.iter_mut().enumerate() {
                let start = ((q0 / LANES) * N + j) * LANES;
                let dy: &[T; LANES] = row.dy_padded[start..start + LANES].try_into().unwrap();
                for l in 0..LANES {
                    a[kx][l] = dy[l].mul_add(x[l], a[kx][l]);
                }
            }
        }
    }
    for (j, a) in acc.iter().enumerate() {
        for (kx, ak) in a.iter().enumerate() {
            lanes[lane_at(j, kx)..lane_at(j, kx) + LANES].copy_from_slice(ak);
        }
    }
}

/// Scratch elements a run of images of [`weight_grad_block`] may fill: small images come in runs of
/// several, so that the accumulators are loaded and stored once per run instead of once per image.
const WEIGHT_GRAD_RUN_ELEMENTS: usize = 1 << 16;

/// Images per run of [`weight_grad_block`]: as many as fit [`WEIGHT_GRAD_RUN_ELEMENTS`], at least one.
fn weight_grad_run_images<T, const N: usize>(job: &WeightGradJob<'_, T>) -> usize {
    let cin_g = job.shape.c_in_per_group();
    let per_image = job.groups::<N>().len() * cin_g * job.geo.plane + job.blocks * N * job.geo.q_round;
    (WEIGHT_GRAD_RUN_ELEMENTS / per_image).clamp(1, job.shape.batch.max(1))
}

/// Scratch elements [`weight_grad_block`] needs.
fn weight_grad_scratch_len<T, const N: usize>(job: &WeightGradJob<'_, T>) -> usize {
    let s = job.shape;
    let cin_g = s.c_in_per_group();
    let run = weight_grad_run_images::<T, N>(job);
    job.blocks * N * cin_g * s.k * s.k * LANES
        + run * job.groups::<N>().len() * cin_g * job.geo.plane
        + N * job.geo.q_round
        + run * job.blocks * N * job.geo.q_round
}

// Runtime dispatch to AVX2+FMA builds of the two hot loops, and for f32 to the AVX-512 kernels of
// `conv_avx512` where the CPU has AVX-512F/DQ. The arithmetic is the same sequence of exactly rounded IEEE
// operations every way (Rust never reorders float ops, `mul_add` is fused on every platform, and the
// AVX-512 kernels keep each output's chain), so results are bit-identical with and without AVX2 or
// AVX-512; only the speed changes.

/// Whether the AVX-512 kernels serve `T` on this CPU.
#[cfg(target_arch = "x86_64")]
fn wide_kernels<T: Real>() -> bool {
    is_f32::<T>() && conv_avx512::available()
}

/// [`correlate_run`] on the fastest build of the hot loops this CPU has.
#[inline]
fn dispatch_correlate<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    weight: &[T],
    stats: Option<&mut [T]>,
) {
    T::with_scratch(c.packed_len() + c.scratch_len(), |scratch| {
        dispatch_correlate_in(c, src, dst, weight, stats, scratch)
    });
}

/// [`dispatch_correlate`] in the caller's scratch (at least `packed_len() + scratch_len()` elements).
#[inline]
fn dispatch_correlate_in<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    weight: &[T],
    stats: Option<&mut [T]>,
    scratch: &mut [T],
) {
    #[cfg(target_arch = "x86_64")]
    if wide_kernels::<T>() {
        // SAFETY: the CPU supports AVX-512F/DQ (checked just above), which implies AVX2 and FMA.
        unsafe { correlate_run_avx512(c, src, dst, weight, scratch, stats) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { correlate_run_avx2(c, src, dst, weight, scratch, stats) };
        return;
    }
    correlate_run(c, src, dst, weight, scratch, stats, Kernels::Portable);
}

/// A run of images of one env (`src` and `dst` whole images): the weights packed once, then each image
/// correlated and (with `stats`) its output's per-plane statistics taken while it is in cache.
#[inline(always)]
fn correlate_run<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    weight: &[T],
    scratch: &mut [T],
    stats: Option<&mut [T]>,
    kernels: Kernels,
) {
    let (packed, scratch) = scratch.split_at_mut(c.packed_len());
    pack_weights(c, weight, kernels, packed);
    let geo = c.geo;
    let src_image = c.src_channels * geo.src_h * geo.src_w;
    let dst_image = c.dst_channels * geo.dst_h * geo.dst_w;
    // The AVX-512 kernel writes rows of whole registers, or pairs of 8-wide rows, straight into the
    // destination (the same bits).
    let rows = kernels != Kernels::Portable
        && (geo.dst_w.is_multiple_of(16) || (geo.dst_w == 8 && geo.dst_h.is_multiple_of(2)));
    let images = src.chunks_exact(src_image).zip(dst.chunks_exact_mut(dst_image));
    match stats {
        None => {
            for (src, dst) in images {
                correlate_image(c, src, dst, packed, scratch, kernels, rows);
            }
        }
        Some(stats) => {
            for ((src, dst), stats) in images.zip(stats.chunks_exact_mut(2 * c.dst_channels)) {
                correlate_image(c, src, dst, packed, scratch, kernels, rows);
                image_plane_stats(c, dst, stats);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn correlate_run_avx2<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    weight: &[T],
    scratch: &mut [T],
    stats: Option<&mut [T]>,
) {
    correlate_run(c, src, dst, weight, scratch, stats, Kernels::Portable);
}

/// Only called where [`wide_kernels`] holds for `T`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
fn correlate_run_avx512<T: Real>(
    c: &Correlation,
    src: &[T],
    dst: &mut [T],
    weight: &[T],
    scratch: &mut [T],
    stats: Option<&mut [T]>,
) {
    correlate_run(c, src, dst, weight, scratch, stats, Kernels::Avx512);
}

/// [`weight_grad_block`] with each run of images added on the fastest build of the hot loops this CPU has.
#[inline]
fn dispatch_weight_grad<T: Real, const N: usize>(job: &WeightGradJob<'_, T>, dw: &mut [T]) {
    T::with_scratch(weight_grad_scratch_len::<T, N>(job), |scratch| {
        weight_grad_block::<T, N>(job, dw, scratch, dispatch_weight_grad_add_run::<T, N>)
    });
}

/// [`weight_grad_add_run`] on the fastest build of the hot loops this CPU has.
fn dispatch_weight_grad_add_run<T: Real, const N: usize>(
    job: &WeightGradJob<'_, T>,
    x_run: &[T],
    dy_run: &[T],
    lanes: &mut [T],
    work: &mut [T],
) {
    #[cfg(target_arch = "x86_64")]
    if wide_kernels::<T>() {
        // SAFETY: the CPU supports AVX-512F/DQ (checked just above), which implies AVX2 and FMA.
        unsafe { weight_grad_add_run_avx512::<T, N>(job, x_run, dy_run, lanes, work) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        unsafe { weight_grad_add_run_avx2::<T, N>(job, x_run, dy_run, lanes, work) };
        return;
    }
    weight_grad_add_run::<T, N>(job, x_run, dy_run, lanes, work, Kernels::Portable);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn weight_grad_add_run_avx2<T: Real, const N: usize>(
    job: &WeightGradJob<'_, T>,
    x_run: &[T],
    dy_run: &[T],
    lanes: &mut [T],
    work: &mut [T],
) {
    weight_grad_add_run::<T, N>(job, x_run, dy_run, lanes, work, Kernels::Portable);
}

/// Only called where [`wide_kernels`] holds for `T`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
fn weight_grad_add_run_avx512<T: Real, const N: usize>(
    job: &WeightGradJob<'_, T>,
    x_run: &[T],
    dy_run: &[T],
    lanes: &mut [T],
    work: &mut [T],
) {
    weight_grad_add_run::<T, N>(job, x_run, dy_run, lanes, work, Kernels::Avx512);
}

/// One env's conv backward taken a run of images at a time, for a caller that produces the output
/// gradient run by run and wants it used while it is in cache (a seed unit's norm backward): the weight
/// gradient is [`conv2d_backward_weight`]'s whole-env job fed run after run (each lane sums the same
/// values in the same order, so the same bits), the input gradient of a run is computed image by image
/// as [`conv2d_backward_input`] computes it. Single-threaded (the caller runs one task per env); the
/// caller owns the scratch ([`Self::scratch_len`]) because the ops' own scratch is not re-entrant.
pub(crate) struct ConvBackwardRuns {
    /// The conv's shape for one env (`envs` = 1; `batch` is the env's image count).
    shape: Conv2dShape,
    /// Output channels per weight-gradient block (as [`conv2d_backward_weight`] picks them).
    block: usize,
    lanes_len: usize,
    work_len: usize,
    input_gradient: Correlation,
}

impl ConvBackwardRuns {
    pub fn new(shape: &Conv2dShape) -> Self {
        let shape = Conv2dShape { envs: 1, ..*shape };
        shape.validate();
        let block = weight_grad_block_width(shape.c_out_per_group());
        let job = Self::job_of(&shape, block);
        let lanes_len = shape.c_out * shape.c_in_per_group() * shape.k * shape.k * LANES;
        let work_len = match block {
            BLOCK => weight_grad_scratch_len::<f32, BLOCK>(&job),
            2 => weight_grad_scratch_len::<f32, 2>(&job),
            _ => weight_grad_scratch_len::<f32, 1>(&job),
        } - lanes_len;
        let input_gradient = Correlation {
            src_channels: shape.c_out,
            dst_channels: shape.c_in,
            groups: shape.groups,
            geo: Geometry::new(shape.h_out(), shape.w_out(), shape.k, shape.k - 1 - shape.pad),
            layout: WeightLayout::input_gradient(&shape),
            accumulate: false,
        };
        Self { shape, block, lanes_len, work_len, input_gradient }
    }

    /// The whole-env weight-gradient job (its input and output gradient are given run by run).
    fn job_of<T>(shape: &Conv2dShape, block: usize) -> WeightGradJob<'_, T> {
        WeightGradJob {
            shape,
            geo: Geometry::new(shape.h, shape.w, shape.k, shape.pad),
            input: &[],
            grad_output: &[],
            first_out: 0,
            blocks: shape.c_out / block,
        }
    }

    /// The most images one [`Self::add_run`] takes.
    pub fn run_images(&self) -> usize {
        let job = Self::job_of::<f32>(&self.shape, self.block);
        match self.block {
            BLOCK => weight_grad_run_images::<f32, BLOCK>(&job),
            2 => weight_grad_run_images::<f32, 2>(&job),
            _ => weight_grad_run_images::<f32, 1>(&job),
        }
    }

    /// Scratch elements the env's backward needs, kept by the caller from [`Self::begin`] to
    /// [`Self::finish`].
    pub fn scratch_len(&self) -> usize {
        self.lanes_len + self.work_len + self.input_gradient.packed_len() + self.input_gradient.scratch_len()
    }

    /// Starts an env: zero weight-gradient sums.
    pub fn begin<T: Real>(&self, scratch: &mut [T]) {
        scratch[..self.lanes_len].fill(T::ZERO);
    }

    /// Adds the run's images (`x_run`, their conv input, and `dy_run`, their output gradient; the runs
    /// of an env in image order) to the weight gradient, and with `grad_input` writes (or with `true`,
    /// adds) the run's input gradient there. `weight` is the env's.
    pub fn add_run<T: Real>(
        &self,
        x_run: &[T],
        dy_run: &[T],
        weight: &[T],
        grad_input: Option<(&mut [T], bool)>,
        scratch: &mut [T],
    ) {
        assert!(scratch.len() >= self.scratch_len(), "conv backward scratch");
        let (lanes, rest) = scratch.split_at_mut(self.lanes_len);
        let (work, correlate) = rest.split_at_mut(self.work_len);
        let job = Self::job_of(&self.shape, self.block);
        match self.block {
            BLOCK => dispatch_weight_grad_add_run::<T, BLOCK>(&job, x_run, dy_run, lanes, work),
            2 => dispatch_weight_grad_add_run::<T, 2>(&job, x_run, dy_run, lanes, work),
            _ => dispatch_weight_grad_add_run::<T, 1>(&job, x_run, dy_run, lanes, work),
        }
        if let Some((dx_run, accumulate)) = grad_input {
            assert_eq!(dx_run.len() / self.shape.c_in, x_run.len() / self.shape.c_in, "input gradient run");
            let c = Correlation { accumulate, ..self.input_gradient };
            dispatch_correlate_in(&c, dy_run, dx_run, weight, None, correlate);
        }
    }

    /// Ends an env: writes its weight gradient (`[c_out, c_in/groups, k, k]`, overwritten).
    pub fn finish<T: Real>(&self, scratch: &[T], grad_weight: &mut [T]) {
        assert_eq!(grad_weight.len(), self.shape.weight_len_per_env(), "conv weight gradient length");
        sum_lanes_into(&scratch[..self.lanes_len], grad_weight);
    }
}

/// [`conv2d_backward_weight`] and, with `grad_input`, [`conv2d_backward_input`] (both overwrite) of a
/// conv whose output gradient `dy_image(i, scratch, dy)` writes an image at a time (`i = e·B + b`;
/// `scratch` holds `dy_scratch` elements): one task per env takes its images a run at a time
/// ([`ConvBackwardRuns`]) and uses each run while it is in cache, so the output gradient never goes to
/// memory. The same bits as writing the whole output gradient and calling the two ops: each weight
/// gradient lane sums the same values in the same order, each input gradient image is the same
/// correlation. For at least as many envs as threads (the envs are the only parallel dimension).
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d_backward_from_images<T: Real>(
    shape: Conv2dShape,
    input: &[T],
    weight: &[T],
    grad_weight: &mut [T],
    grad_input: Option<&mut [T]>,
    dy_scratch: usize,
    dy_image: impl Fn(usize, &mut [T], &mut [T]) + Sync,
) {
    shape.validate();
    assert_eq!(input.len(), shape.input_len(), "conv input length");
    assert_eq!(weight.len(), shape.weight_len(), "conv weight length");
    assert_eq!(grad_weight.len(), shape.weight_len(), "conv weight gradient length");
    if let Some(grad_input) = &grad_input {
        assert_eq!(grad_input.len(), shape.input_len(), "conv input gradient length");
    }
    if grad_weight.is_empty() {
        return;
    }
    let (image_in, image_out) = (shape.c_in * shape.h * shape.w, shape.c_out * shape.h_out() * shape.w_out());
    if shape.batch == 0 || image_in == 0 || image_out == 0 {
        grad_weight.fill(T::ZERO);
        if let Some(grad_input) = grad_input {
            grad_input.fill(T::ZERO);
        }
        return;
    }
    let runs = ConvBackwardRuns::new(&shape);
    let run = runs.run_images().min(shape.batch);
    let w_env = shape.weight_len_per_env();
    let scratch_len = run * image_out + dy_scratch + runs.scratch_len();
    let grad_inputs = match grad_input {
        Some(g) => rayon::iter::Either::Left(g.par_chunks_mut(shape.batch * image_in).map(Some)),
        None => rayon::iter::Either::Right((0..shape.envs).into_par_iter().map(|_| None)),
    };
    grad_weight.par_chunks_mut(w_env).zip(grad_inputs).enumerate().for_each(|(e, (d_weight, mut dx_env))| {
        let weight = &weight[e * w_env..(e + 1) * w_env];
        T::with_scratch(scratch_len, |scratch| {
            let (dy_runs, rest) = scratch.split_at_mut(run * image_out);
            let (dy_work, conv_scratch) = rest.split_at_mut(dy_scratch);
            runs.begin(conv_scratch);
            for b0 in (0..shape.batch).step_by(run) {
                let n = run.min(shape.batch - b0);
                let dy_run = &mut dy_runs[..n * image_out];
                for (r, dy) in dy_run.chunks_exact_mut(image_out).enumerate() {
                    dy_image(e * shape.batch + b0 + r, dy_work, dy);
                }
                let x0 = (e * shape.batch + b0) * image_in;
                let x_run = &input[x0..x0 + n * image_in];
                let dx = dx_env.as_deref_mut().map(|d| (&mut d[b0 * image_in..(b0 + n) * image_in], false));
                runs.add_run(x_run, dy_run, weight, dx, conv_scratch);
            }
            runs.finish(conv_scratch, d_weight);
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    /// Direct 7-loop convolution, the reference for the forward pass.
    fn naive_conv(s: &Conv2dShape, x: &[f64], w: &[f64]) -> Vec<f64> {
        let (cin_g, cout_g, k) = (s.c_in_per_group(), s.c_out_per_group(), s.k);
        let (ho, wo) = (s.h_out(), s.w_out());
        let mut out = vec![0.0; s.output_len()];
        for e in 0..s.envs {
            for b in 0..s.batch {
                for co in 0..s.c_out {
                    let g = co / cout_g;
                    for y in 0..ho {
                        for xo in 0..wo {
                            let mut acc = 0.0;
                            for cl in 0..cin_g {
                                let ci = g * cin_g + cl;
                                for ky in 0..k {
                                    for kx in 0..k {
                                        let iy = (y + ky) as isize - s.pad as isize;
                                        let ix = (xo + kx) as isize - s.pad as isize;
                                        if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize {
                                            continue;
                                        }
                                        let xi = (((e * s.batch + b) * s.c_in + ci) * s.h + iy as usize)
                                            * s.w
                                            + ix as usize;
                                        let wi = (((e * s.c_out + co) * cin_g + cl) * k + ky) * k + kx;
                                        acc += w[wi] * x[xi];
                                    }
                                }
                            }
                            out[(((e * s.batch + b) * s.c_out + co) * ho + y) * wo + xo] = acc;
                        }
                    }
                }
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn shape(
        envs: usize,
        batch: usize,
        c_in: usize,
        c_out: usize,
        h: usize,
        w: usize,
        k: usize,
        pad: usize,
        groups: usize,
    ) -> Conv2dShape {
        Conv2dShape { envs, batch, c_in, c_out, h, w, k, pad, groups }
    }

    fn test_shapes() -> Vec<Conv2dShape> {
        vec![
            shape(2, 2, 3, 5, 5, 6, 3, 1, 1), // 3×3 same, c_out = a block of 4 plus 1
            shape(2, 2, 8, 8, 4, 4, 3, 1, 1), // full blocks of 4
            shape(2, 3, 4, 4, 4, 3, 1, 0, 2), // 1×1, two groups of 2 (weight-gradient blocks of 2)
            shape(3, 2, 4, 4, 5, 5, 3, 1, 4), // depthwise
            shape(2, 2, 3, 6, 4, 5, 3, 1, 3), // depthwise with channel multiplier 2
            shape(2, 2, 2, 3, 5, 4, 3, 0, 1), // 3×3 without padding (output shrinks)
            shape(2, 1, 2, 2, 9, 9, 1, 0, 1), // 1×1 on an odd plane
        ]
    }

    #[test]
    fn forward_matches_direct_convolution() {
        for (i, s) in test_shapes().into_iter().enumerate() {
            let x = signed(10 + i as u64, s.input_len());
            let w = signed(20 + i as u64, s.weight_len());
            let mut y = vec![f64::NAN; s.output_len()];
            conv2d_forward(s, &x, &w, &mut y);
            let reference = naive_conv(&s, &x, &w);
            assert!(relative_error(&y, &reference) < 1e-14, "{s:?}");
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        for (i, s) in test_shapes().into_iter().enumerate() {
            let x = signed(30 + i as u64, s.input_len());
            let w = signed(40 + i as u64, s.weight_len());
            let r = signed(50 + i as u64, s.output_len());
            let mut dx = vec![f64::NAN; s.input_len()];
            let mut dw = vec![f64::NAN; s.weight_len()];
            conv2d_backward_input(s, &r, &w, &mut dx);
            conv2d_backward_weight(s, &x, &r, &mut dw);
            let mut y = vec![0.0; s.output_len()];
            let num_dx = numeric_gradient(&x, |xp| {
                conv2d_forward(s, xp, &w, &mut y);
                project(&r, &y)
            });
            let num_dw = numeric_gradient(&w, |wp| {
                conv2d_forward(s, &x, wp, &mut y);
                project(&r, &y)
            });
            assert_gradient(&format!("conv dx {s:?}"), &dx, &num_dx);
            assert_gradient(&format!("conv dw {s:?}"), &dw, &num_dw);
        }
    }

    #[test]
    fn accumulate_adds_to_what_is_there() {
        let s = shape(2, 2, 4, 4, 5, 5, 3, 1, 4);
        let w = signed(1, s.weight_len());
        let r = signed(2, s.output_len());
        let prior = signed(3, s.input_len());
        let mut dx = vec![0.0; s.input_len()];
        conv2d_backward_input(s, &r, &w, &mut dx);
        let mut acc = prior.clone();
        conv2d_backward_input_accumulate(s, &r, &w, &mut acc);
        for i in 0..dx.len() {
            assert_eq!(acc[i], prior[i] + dx[i]);
        }
    }

    /// Forward, input gradient and weight gradient of a batch of envs, in f32.
    fn run_f32(s: Conv2dShape, x: &[f32], w: &[f32], r: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut y = vec![0.0; s.output_len()];
        let mut dx = vec![0.0; s.input_len()];
        let mut dw = vec![0.0; s.weight_len()];
        conv2d_forward(s, x, w, &mut y);
        conv2d_backward_input(s, r, w, &mut dx);
        conv2d_backward_weight(s, x, r, &mut dw);
        (y, dx, dw)
    }

    #[test]
    fn env_in_a_batch_equals_env_alone_bit_for_bit() {
        // On two threads: four envs take the whole-env weight-gradient path, one env alone the per-block one.
        with_threads(2, env_in_a_batch_equals_env_alone);
    }

    fn env_in_a_batch_equals_env_alone() {
        let s = shape(4, 4, 8, 16, 8, 8, 3, 1, 1);
        let x = to_f32(&signed(60, s.input_len()));
        let w = to_f32(&signed(61, s.weight_len()));
        let r = to_f32(&signed(62, s.output_len()));
        let (y, dx, dw) = run_f32(s, &x, &w, &r);
        let one = Conv2dShape { envs: 1, ..s };
        let (xi, wi, yi) = (one.input_len(), one.weight_len(), one.output_len());
        for e in 0..s.envs {
            let (y1, dx1, dw1) = run_f32(one, &x[e * xi..][..xi], &w[e * wi..][..wi], &r[e * yi..][..yi]);
            assert_eq!(bits(&y[e * yi..][..yi]), bits(&y1), "forward, env {e}");
            assert_eq!(bits(&dx[e * xi..][..xi]), bits(&dx1), "input gradient, env {e}");
            assert_eq!(bits(&dw[e * wi..][..wi]), bits(&dw1), "weight gradient, env {e}");
        }
    }

    #[test]
    fn results_do_not_depend_on_thread_count() {
        let s = shape(2, 6, 16, 32, 8, 8, 3, 1, 1);
        let x = to_f32(&signed(70, s.input_len()));
        let w = to_f32(&signed(71, s.weight_len()));
        let r = to_f32(&signed(72, s.output_len()));
        let one = with_threads(1, || run_f32(s, &x, &w, &r));
        let two = with_threads(2, || run_f32(s, &x, &w, &r));
        assert_eq!(bits(&one.0), bits(&two.0));
        assert_eq!(bits(&one.1), bits(&two.1));
        assert_eq!(bits(&one.2), bits(&two.2));
    }

    #[test]
    fn weight_gradient_per_env_tasks_equal_per_block_tasks_bit_for_bit() {
        // Two envs: on one thread each task takes a whole env, on four threads one block of an env.
        let shapes = [
            shape(2, 3, 8, 16, 6, 6, 3, 1, 1),
            shape(2, 3, 8, 12, 6, 6, 3, 1, 2),
            shape(2, 3, 8, 8, 6, 6, 3, 1, 8),
            shape(2, 3, 6, 10, 5, 5, 1, 0, 1),
            shape(2, 3, 3, 5, 5, 5, 3, 1, 1),
            shape(2, 3, 4, 6, 6, 6, 3, 1, 2), // groups of 3 output channels: blocks of 1
            shape(2, 2, 3, 4, 7, 7, 5, 2, 1), // k = 5 (the generic tap loop)
        ];
        for (i, s) in shapes.into_iter().enumerate() {
            let x = to_f32(&signed(80 + i as u64, s.input_len()));
            let dy = to_f32(&signed(90 + i as u64, s.output_len()));
            let weight_grad = |threads| {
                with_threads(threads, || {
                    let mut dw = vec![0.0f32; s.weight_len()];
                    conv2d_backward_weight(s, &x, &dy, &mut dw);
                    dw
                })
            };
            let (per_env, per_block) = (weight_grad(1), weight_grad(4));
            assert_eq!(bits(&per_env), bits(&per_block), "{s:?}");
            // And the per-env path against finite differences on its own (in f64).
            let (x, w, r) = (
                signed(100 + i as u64, s.input_len()),
                signed(110, s.weight_len()),
                signed(120, s.output_len()),
            );
            let mut dw = vec![f64::NAN; s.weight_len()];
            with_threads(1, || conv2d_backward_weight(s, &x, &r, &mut dw));
            let mut y = vec![0.0; s.output_len()];
            let numeric = numeric_gradient(&w, |wp| {
                conv2d_forward(s, &x, wp, &mut y);
                project(&r, &y)
            });
            assert_gradient(&format!("per-env conv dw {s:?}"), &dw, &numeric);
        }
    }

    /// The portable code (the scalar build of the hot loops) against whatever `dispatch_*` picks on this
    /// CPU (AVX2, or the AVX-512 kernels), bit for bit, on one image's correlation and one env's weight
    /// gradient. The shapes cover grouped channels with blocks of two, and 3×3 convolutions of 8, 16 and 32
    /// channels whose blocks of eight (forward) and four (weight gradient) the AVX-512 kernels take, at
    /// plane sizes whose positions fill an odd and an even number of 16-wide registers.
    /// The weight gradient in runs of several images (32×32, 8 → 8 channels: runs of 3, so a batch of 7
    /// is runs of 3, 3 and 1) against a direct sum over images and positions, per env, on f64; and on f32
    /// an env's result in a batch of envs is its result alone (per-env and per-block tasks alike).
    #[test]
    fn weight_gradient_in_runs_of_images_matches_the_direct_sum() {
        let s = shape(2, 7, 8, 8, 32, 32, 3, 1, 1);
        let job = WeightGradJob {
            shape: &s,
            geo: Geometry::new(s.h, s.w, s.k, s.pad),
            input: &[0.0f64][..0],
            grad_output: &[],
            first_out: 0,
            blocks: 2,
        };
        assert_eq!(weight_grad_run_images::<f64, BLOCK>(&job), 3, "runs of three images");
        let x = signed(90, s.input_len());
        let r = signed(91, s.output_len());
        let mut dw = vec![f64::NAN; s.weight_len()];
        conv2d_backward_weight(s, &x, &r, &mut dw);
        let (k, cin_g, cout_g) = (s.k, s.c_in_per_group(), s.c_out_per_group());
        let mut direct = vec![0.0; s.weight_len()];
        for e in 0..s.envs {
            for b in 0..s.batch {
                for co in 0..s.c_out {
                    for cl in 0..cin_g {
                        let ci = (co / cout_g) * cin_g + cl;
                        for (ky, kx) in (0..k).flat_map(|ky| (0..k).map(move |kx| (ky, kx))) {
                            let wi = (((e * s.c_out + co) * cin_g + cl) * k + ky) * k + kx;
                            for (y, xo) in (0..s.h_out()).flat_map(|y| (0..s.w_out()).map(move |xo| (y, xo)))
                            {
                                let (iy, ix) =
                                    ((y + ky) as isize - s.pad as isize, (xo + kx) as isize - s.pad as isize);
                                if iy < 0 || ix < 0 || iy >= s.h as isize || ix >= s.w as isize {
                                    continue;
                                }
                                let xi = (((e * s.batch + b) * s.c_in + ci) * s.h + iy as usize) * s.w
                                    + ix as usize;
                                let oi =
                                    (((e * s.batch + b) * s.c_out + co) * s.h_out() + y) * s.w_out() + xo;
                                direct[wi] += r[oi] * x[xi];
                            }
                        }
                    }
                }
            }
        }
        let worst = dw.iter().zip(&direct).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-9, "largest difference {worst}");
        assert!(direct.iter().all(|v| v.abs() > 1e-6), "every weight gets a gradient");

        let (x, r) = (to_f32(&x), to_f32(&r));
        let mut batched = vec![0.0f32; s.weight_len()];
        with_threads(1, || conv2d_backward_weight(s, &x, &r, &mut batched));
        let one = Conv2dShape { envs: 1, ..s };
        for e in 0..s.envs {
            let mut alone = vec![0.0f32; one.weight_len()];
            let (xe, re) = (
                &x[e * one.input_len()..][..one.input_len()],
                &r[e * one.output_len()..][..one.output_len()],
            );
            with_threads(2, || conv2d_backward_weight(one, xe, re, &mut alone));
            assert_eq!(bits(&batched[e * one.weight_len()..][..one.weight_len()]), bits(&alone), "env {e}");
        }
    }

    #[test]
    fn simd_dispatch_and_portable_code_agree_bit_for_bit() {
        let cases = [
            // (shape, first output channel and blocks of the weight-gradient job, its block width)
            (shape(1, 2, 8, 12, 6, 7, 3, 1, 2), 6, 3, 2), // the second group's six channels, blocks of two
            (shape(1, 3, 8, 8, 32, 32, 3, 1, 1), 0, 2, 4),
            (shape(1, 3, 16, 16, 16, 16, 3, 1, 1), 4, 3, 4),
            (shape(1, 2, 32, 32, 8, 8, 3, 1, 1), 0, 8, 4),
            (shape(1, 2, 16, 8, 5, 5, 3, 1, 1), 0, 2, 4), // 5×5: 35 positions, a single trailing register
        ];
        for (case, &(s, first_out, blocks, block)) in cases.iter().enumerate() {
            let x = to_f32(&signed(80 + case as u64, s.input_len()));
            let w = to_f32(&signed(81 + case as u64, s.weight_len()));
            let r = to_f32(&signed(82 + case as u64, s.output_len()));
            let correlation = Correlation {
                src_channels: s.c_in,
                dst_channels: s.c_out,
                groups: s.groups,
                geo: Geometry::new(s.h, s.w, s.k, s.pad),
                layout: WeightLayout::forward(&s),
                accumulate: false,
            };
            let image = s.c_in * s.h * s.w;
            let out_image = s.c_out * s.h_out() * s.w_out();
            let mut portable = vec![0.0f32; out_image];
            let mut scratch = vec![0.0f32; correlation.packed_len() + correlation.scratch_len()];
            correlate_run(
                &correlation,
                &x[..image],
                &mut portable,
                &w,
                &mut scratch,
                None,
                Kernels::Portable,
            );
            let mut dispatched = vec![0.0f32; out_image];
            dispatch_correlate(&correlation, &x[..image], &mut dispatched, &w, None);
            assert_eq!(bits(&portable), bits(&dispatched), "case {case}: correlation");
            assert!(portable.iter().filter(|v| **v != 0.0).count() > out_image / 2, "case {case}: outputs");

            let job = WeightGradJob {
                shape: &s,
                geo: Geometry::new(s.h, s.w, s.k, s.pad),
                input: &x,
                grad_output: &r,
                first_out,
                blocks,
            };
            let len = blocks * block * s.c_in_per_group() * 9;
            let (mut portable, mut dispatched) = (vec![0.0f32; len], vec![0.0f32; len]);
            match block {
                2 => {
                    let mut scratch = vec![0.0f32; weight_grad_scratch_len::<f32, 2>(&job)];
                    let portable_run =
                        |j: &WeightGradJob<'_, f32>, x: &[f32], dy: &[f32], l: &mut [f32], w: &mut [f32]| {
                            weight_grad_add_run::<f32, 2>(j, x, dy, l, w, Kernels::Portable)
                        };
                    weight_grad_block::<f32, 2>(&job, &mut portable, &mut scratch, portable_run);
                    dispatch_weight_grad::<f32, 2>(&job, &mut dispatched);
                }
                _ => {
                    let mut scratch = vec![0.0f32; weight_grad_scratch_len::<f32, 4>(&job)];
                    let portable_run =
                        |j: &WeightGradJob<'_, f32>, x: &[f32], dy: &[f32], l: &mut [f32], w: &mut [f32]| {
                            weight_grad_add_run::<f32, 4>(j, x, dy, l, w, Kernels::Portable)
                        };
                    weight_grad_block::<f32, 4>(&job, &mut portable, &mut scratch, portable_run);
                    dispatch_weight_grad::<f32, 4>(&job, &mut dispatched);
                }
            }
            assert_eq!(bits(&portable), bits(&dispatched), "case {case}: weight gradient");
            assert!(portable.iter().all(|v| *v != 0.0), "case {case}: weight gradients");
        }
    }

    /// Where rows are whole registers, or pairs of 8-wide rows, the AVX-512 path writes them straight
    /// into the destination (`correlate_rows8`) instead of through the padded-width tile: the same bits as
    /// the portable code, for the forward and the input-gradient correlation, overwriting and
    /// accumulating, with an odd number of registers per plane, with groups, and on 8-wide planes of an
    /// odd height (which take the padded path).
    #[test]
    fn rows_written_straight_to_the_destination_give_the_padded_layout_bits() {
        // (c_in, c_out, h, w, groups)
        let cases = [
            (8, 8, 32, 32, 1),
            (4, 16, 3, 16, 1),
            (16, 32, 5, 48, 2),
            (3, 8, 16, 16, 1),
            (32, 32, 8, 8, 1),
            (8, 16, 6, 8, 2),
            (16, 8, 5, 8, 1),
        ];
        let mut rows_cases = 0;
        for (case, &(c_in, c_out, h, w, groups)) in cases.iter().enumerate() {
            let s = shape(1, 2, c_in, c_out, h, w, 3, 1, groups);
            let forward = forward_correlation(&s);
            let input_gradient = Correlation {
                src_channels: s.c_out,
                dst_channels: s.c_in,
                groups: s.groups,
                geo: Geometry::new(s.h_out(), s.w_out(), s.k, s.k - 1 - s.pad),
                layout: WeightLayout::input_gradient(&s),
                accumulate: false,
            };
            let w = to_f32(&signed(90 + case as u64, s.weight_len()));
            for (which, base) in [forward, input_gradient].into_iter().enumerate() {
                for accumulate in [false, true] {
                    let c = Correlation { accumulate, ..base };
                    let src_len = 2 * c.src_channels * c.geo.src_h * c.geo.src_w;
                    let dst_len = 2 * c.dst_channels * c.geo.dst_h * c.geo.dst_w;
                    let src = to_f32(&signed(91 + case as u64, src_len));
                    let before = to_f32(&signed(92 + case as u64, dst_len));
                    let mut portable = before.clone();
                    let mut scratch = vec![0.0f32; c.packed_len() + c.scratch_len()];
                    correlate_run(&c, &src, &mut portable, &w, &mut scratch, None, Kernels::Portable);
                    let mut dispatched = before.clone();
                    dispatch_correlate(&c, &src, &mut dispatched, &w, None);
                    let what = format!("case {case}, correlation {which}, accumulate {accumulate}");
                    assert_eq!(bits(&portable), bits(&dispatched), "{what}");
                    let changed = portable.iter().zip(&before).filter(|(a, b)| a != b).count();
                    assert!(changed > dst_len * 9 / 10, "{what}: {changed} of {dst_len} outputs written");
                    rows_cases += usize::from(c.dst_per_group().is_multiple_of(WIDE_BLOCK));
                }
            }
        }
        assert_eq!(rows_cases, 22, "correlations with whole blocks of eight destination channels");
    }

    /// The AVX-512 kernels themselves against the portable code, on this CPU when it has them (the test
    /// above goes through them only through the dispatch, which this one pins).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernels_are_the_ones_dispatched_where_the_cpu_has_them() {
        let expected =
            std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq");
        assert_eq!(wide_kernels::<f32>(), expected);
        assert!(!wide_kernels::<f64>(), "the AVX-512 kernels are f32 only");
    }
}
