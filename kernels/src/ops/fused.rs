//! The host block's batch norm → ReLU → 2×2 max-pool, fused: one forward pass and, backward, one small
//! reduction plus one pass, for a block with nothing between its ReLU and its pool.
//!
//! Why: the unfused ops sweep the full-resolution activation `[E, B, C, H, W]` six times forward
//! (statistics twice, normalise, ReLU read and write, pool) and about as often backward (zero fill and
//! scatter, ReLU mask, two reductions, input gradient). Once a layer outgrows the cache (block 0 of
//! cifar_baseline is 16 MB per env) every sweep goes to memory, and the per-env cost grows with E. Here:
//! * Forward: the batch statistics come from per-plane `(mean, M2)` the conv wrote while its output was in
//!   cache ([`conv2d_forward_with_plane_stats`](super::conv2d_forward_with_plane_stats)), combined per
//!   (env, channel) with Chan's formula. Then one pass per (env, image) reads the conv output once and
//!   writes only pooled-size data: the pooled output, a per-window code (the winner's index, or
//!   [`NO_GRADIENT`] when the pooled ReLU output is not positive, so no gradient flows), and the winner's
//!   pre-norm value.
//! * Backward: `dy` (the gradient at the batch-norm output) is non-zero only at coded winners, so the two
//!   per-(env, channel) reductions `Σ dy` and `Σ dy·(x − mean)` read pooled-size data only; then one pass
//!   per (env, image) writes `dx` at full resolution, rebuilding each plane's `dy` in a cached scratch.
//!   The full-resolution `dy` never goes through memory.
//!
//! Bits. Every value is computed with the unfused ops' own formulas in the same order (ReLU and the window
//! rule are shared with them: first maximum wins, NaN propagates). A block with a seed between its ReLU
//! and its pool runs op by op with [`batch_norm_relu_train_forward`] (the same statistics) and
//! [`batch_norm_backward_window_order`] (the same order of the backward sums), so an env gets the same
//! bits whichever path its batch takes. Against the generic
//! [`batch_norm_train_forward`](super::batch_norm_train_forward) and
//! [`batch_norm_backward`](super::batch_norm_backward) only the rounding differs: the statistics are
//! combined per plane and the backward sums run in window order. Every sum has a fixed order that depends
//! only on the shape, never on E or the thread count.

use rayon::prelude::*;

use super::activation::relu;
use super::norm::{
    DxConsts, NormDx, NormInputGrad, NormShape, affine, batch_norm_param_grads,
    batch_norm_param_grads_then_input_grad, eval_affine, normalize, save_batch_stats, train_affine,
};
use super::pool::{PoolShape, V, gather_windows, unpool_image, winners};
use super::real::{LANES, LaneSums, Real};

/// Window code: no gradient flows through this window (its pooled ReLU output is 0 or NaN).
pub const NO_GRADIENT: u8 = 4;

impl NormShape {
    /// Elements of one pooled plane `(H/2)·(W/2)`.
    fn pooled_plane(&self) -> usize {
        (self.h / 2) * (self.w / 2)
    }
    /// Elements of the 2×2 max-pool output `[E, B, C, H/2, W/2]`.
    pub fn pooled_len(&self) -> usize {
        self.envs * self.batch * self.channels * self.pooled_plane()
    }
}

/// Per-plane statistics of one (env, channel), combined: `(mean, biased variance)` over the env's images.
/// `Σ M2_b + P·Σ (mean_b − mean)²` is the exact total of squared deviations for equal plane sizes `P`.
fn combine_plane_stats<T: Real>(shape: &NormShape, plane_stats: &[T], e: usize, ch: usize) -> (T, T) {
    let at = |b: usize| ((e * shape.batch + b) * shape.channels + ch) * 2;
    let mut sum = LaneSums::<T>::new();
    for b in 0..shape.batch {
        sum.lanes[b % LANES] += plane_stats[at(b)];
    }
    let mean = sum.total() / T::from_usize(shape.batch);
    let p = T::from_usize(shape.plane());
    let mut m2 = LaneSums::<T>::new();
    for b in 0..shape.batch {
        let d = plane_stats[at(b)] - mean;
        m2.lanes[b % LANES] += plane_stats[at(b) + 1] + p * (d * d);
    }
    (mean, m2.total() / T::from_usize(shape.batch * shape.plane()))
}

/// The batch statistics of every (env, channel) from the conv's per-plane statistics, saved and tracked
/// like [`batch_norm_train_forward`](super::batch_norm_train_forward)'s.
fn batch_stats_from_planes<T: Real>(
    shape: NormShape,
    plane_stats: &[T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    running_mean: &mut [T],
    running_var: &mut [T],
) {
    assert_eq!(plane_stats.len(), 2 * shape.envs * shape.batch * shape.channels, "plane statistics length");
    let c = shape.channels;
    let stats = |i: usize| combine_plane_stats(&shape, plane_stats, i / c, i % c);
    save_batch_stats(&shape, stats, save_mean, save_inv_std, running_mean, running_var);
}

/// Training batch norm → ReLU without a pool (for a block whose pool input is a seed's output): the batch
/// statistics as in [`batch_norm_relu_max_pool_train_forward`], `y = relu(bn(x))` with the same
/// arithmetic, so both give every env the same bits. Overwrites `y`, `save_mean`, `save_inv_std`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu_train_forward<T: Real>(
    shape: NormShape,
    x: &[T],
    plane_stats: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    running_mean: &mut [T],
    running_var: &mut [T],
) {
    for p in [gamma, beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    batch_stats_from_planes(shape, plane_stats, save_mean, save_inv_std, running_mean, running_var);
    let (mean, inv_std) = (&*save_mean, &*save_inv_std);
    normalize(&shape, x, y, train_affine(mean, inv_std, gamma, beta), relu);
}

/// Training forward of batch norm → ReLU → 2×2 max-pool from the conv output `x` and its per-plane
/// statistics `plane_stats` (`[E, B, C, 2]`). Saves `mean` and `1/sqrt(var + eps)` (`[E, C]`), updates the
/// running statistics like [`batch_norm_train_forward`](super::batch_norm_train_forward), and overwrites
/// `pooled`, `code` and `winner` (`[E, B, C, H/2, W/2]`): what [`batch_norm_relu_max_pool_backward`] needs.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu_max_pool_train_forward<T: Real>(
    shape: NormShape,
    x: &[T],
    plane_stats: &[T],
    gamma: &[T],
    beta: &[T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    running_mean: &mut [T],
    running_var: &mut [T],
    pooled: &mut [T],
    code: &mut [u8],
    winner: &mut [T],
) {
    assert_eq!(x.len(), shape.len(), "fused batch norm input length");
    for p in [gamma, beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    for len in [pooled.len(), code.len(), winner.len()] {
        assert_eq!(len, shape.pooled_len(), "fused max pool output length");
    }
    batch_stats_from_planes(shape, plane_stats, save_mean, save_inv_std, running_mean, running_var);
    let (mean, inv_std) = (&*save_mean, &*save_inv_std);
    forward_images(shape, x, train_affine(mean, inv_std, gamma, beta), pooled, Some((code, winner)));
}

/// Eval forward of batch norm (running statistics) → ReLU → 2×2 max-pool: overwrites `pooled` only.
/// Bit-identical to [`batch_norm_eval_forward`](super::batch_norm_eval_forward), ReLU and
/// [`max_pool2x2_forward`](super::max_pool2x2_forward) in sequence.
pub fn batch_norm_relu_max_pool_eval_forward<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    running_mean: &[T],
    running_var: &[T],
    pooled: &mut [T],
) {
    assert_eq!(x.len(), shape.len(), "fused batch norm input length");
    for p in [gamma, beta, running_mean, running_var] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    assert_eq!(pooled.len(), shape.pooled_len(), "fused max pool output length");
    forward_images(shape, x, eval_affine(gamma, beta, running_mean, running_var), pooled, None);
}

/// Eval batch norm (running statistics) → ReLU without a pool, in one pass (for a block whose pool input
/// is a seed's output): bit-identical to [`batch_norm_eval_forward`](super::batch_norm_eval_forward) then
/// [`relu_forward_in_place`](super::relu_forward_in_place). Overwrites `y`.
pub fn batch_norm_relu_eval_forward<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    running_mean: &[T],
    running_var: &[T],
    y: &mut [T],
) {
    for p in [gamma, beta, running_mean, running_var] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    normalize(&shape, x, y, eval_affine(gamma, beta, running_mean, running_var), relu);
}

/// One task per (env, image): every channel plane normalised with `per_channel(e·C + c) = (mean, scale,
/// shift)`, ReLU'd into a cached scratch plane, and pooled.
fn forward_images<T: Real>(
    shape: NormShape,
    x: &[T],
    per_channel: impl Fn(usize) -> (T, T, T) + Sync,
    pooled: &mut [T],
    saved: Option<(&mut [u8], &mut [T])>,
) {
    let out_image = shape.channels * shape.pooled_plane();
    if out_image == 0 || shape.is_empty() {
        return;
    }
    let image = |i: usize, pooled: &mut [T], mut saved: Option<(&mut [u8], &mut [T])>| {
        let e = i / shape.batch;
        let x_img = &x[i * shape.image()..(i + 1) * shape.image()];
        let (plane, po) = (shape.plane(), shape.pooled_plane());
        T::with_scratch(plane, |act| {
            for ch in 0..shape.channels {
                let (mean, scale, shift) = per_channel(e * shape.channels + ch);
                let out = &mut pooled[ch * po..(ch + 1) * po];
                let saved = saved
                    .as_mut()
                    .map(|(k, z)| (&mut k[ch * po..(ch + 1) * po], &mut z[ch * po..(ch + 1) * po]));
                dispatch_forward_plane(
                    &shape,
                    &x_img[ch * plane..(ch + 1) * plane],
                    (mean, scale, shift),
                    act,
                    out,
                    saved,
                );
            }
        });
    };
    match saved {
        None => pooled.par_chunks_mut(out_image).enumerate().for_each(|(i, p)| image(i, p, None)),
        Some((code, winner)) => pooled
            .par_chunks_mut(out_image)
            .zip(code.par_chunks_mut(out_image).zip(winner.par_chunks_mut(out_image)))
            .enumerate()
            .for_each(|(i, (p, (k, z)))| image(i, p, Some((k, z)))),
    }
}

/// One plane: `act = relu((x − mean)·scale + shift)`, then each 2×2 window's winner (the unfused ops'
/// arithmetic and window rule).
#[inline(always)]
fn forward_plane<T: Real>(
    shape: &NormShape,
    x: &[T],
    (mean, scale, shift): (T, T, T),
    act: &mut [T],
    pooled: &mut [T],
    mut saved: Option<(&mut [u8], &mut [T])>,
) {
    let (w, ho, wo) = (shape.w, shape.h / 2, shape.w / 2);
    for (a, &v) in act.iter_mut().zip(x) {
        *a = relu(affine(v, mean, scale, shift));
    }
    for oy in 0..ho {
        let rows = 2 * oy * w..(2 * oy + 2) * w;
        let (top, bottom) = act[rows.clone()].split_at(w);
        let (z_top, z_bottom) = x[rows].split_at(w);
        let out = oy * wo..(oy + 1) * wo;
        match &mut saved {
            None => pool_rows(top, bottom, &mut pooled[out]),
            Some((code, winner)) => pool_rows_saved(
                [top, bottom, z_top, z_bottom],
                &mut pooled[out.clone()],
                &mut code[out.clone()],
                &mut winner[out],
            ),
        }
    }
}

/// Pools one pair of rows into `out`: `V` windows at a time, then `V/2`, then one.
#[inline(always)]
fn pool_rows<T: Real>(top: &[T], bottom: &[T], out: &mut [T]) {
    let mut ox0 = 0;
    while ox0 < out.len() {
        ox0 += match out.len() - ox0 {
            n if n >= V => pool_windows::<T, V>(top, bottom, out, ox0),
            n if n >= V / 2 => pool_windows::<T, { V / 2 }>(top, bottom, out, ox0),
            _ => pool_windows::<T, 1>(top, bottom, out, ox0),
        };
    }
}

#[inline(always)]
fn pool_windows<T: Real, const N: usize>(top: &[T], bottom: &[T], out: &mut [T], ox0: usize) -> usize {
    let windows = gather_windows::<T, N>(top, bottom, ox0);
    let (best, _, _) = winners(&windows, &windows);
    out[ox0..ox0 + N].copy_from_slice(&best);
    N
}

/// Pools one pair of rows (`rows = [top, bottom, z_top, z_bottom]`: the ReLU outputs and the conv
/// outputs) into `out`, with each window's code and winning conv output.
#[inline(always)]
fn pool_rows_saved<T: Real>(rows: [&[T]; 4], out: &mut [T], code: &mut [u8], winner: &mut [T]) {
    let mut ox0 = 0;
    while ox0 < out.len() {
        ox0 += match out.len() - ox0 {
            n if n >= V => pool_windows_saved::<T, V>(rows, out, code, winner, ox0),
            n if n >= V / 2 => pool_windows_saved::<T, { V / 2 }>(rows, out, code, winner, ox0),
            _ => pool_windows_saved::<T, 1>(rows, out, code, winner, ox0),
        };
    }
}

#[inline(always)]
fn pool_windows_saved<T: Real, const N: usize>(
    rows: [&[T]; 4],
    out: &mut [T],
    code: &mut [u8],
    winner: &mut [T],
    ox0: usize,
) -> usize {
    let [top, bottom, z_top, z_bottom] = rows;
    let windows = gather_windows::<T, N>(top, bottom, ox0);
    let z = gather_windows::<T, N>(z_top, z_bottom, ox0);
    let (best, index, z_best) = winners(&windows, &z);
    out[ox0..ox0 + N].copy_from_slice(&best);
    winner[ox0..ox0 + N].copy_from_slice(&z_best);
    for l in 0..N {
        // ReLU's backward passes the gradient where its output is > 0 (never for NaN).
        code[ox0 + l] = if best[l] > T::ZERO { index[l] as u8 } else { NO_GRADIENT };
    }
    N
}

/// Backward of [`batch_norm_relu_max_pool_train_forward`] from the gradient at the pooled output.
/// Overwrites `grad_input` (`[E, B, C, H, W]`), `grad_gamma` and `grad_beta` with what the unfused
/// max-pool, ReLU and batch-norm backwards give: with `dy` the gradient at the batch-norm output,
/// `dβ = Σ dy`, `dγ = Σ dy·x̂`, `dx = γ·inv_std·(dy − dβ/N − x̂·dγ/N)`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_relu_max_pool_backward<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_pooled: &[T],
    code: &[u8],
    winner: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    assert_eq!(grad_input.len(), shape.len(), "fused batch norm activation length");
    let grad = batch_norm_relu_max_pool_param_grads(
        shape,
        x,
        gamma,
        save_mean,
        save_inv_std,
        grad_pooled,
        code,
        winner,
        grad_gamma,
        grad_beta,
    );
    if shape.is_empty() {
        return;
    }
    let plane = shape.plane();
    grad_input.par_chunks_mut(shape.image()).enumerate().for_each(|(i, dx_img)| {
        T::with_scratch(plane + 1, |scratch| grad.write_image(i, scratch, dx_img));
    });
}

/// The first pass of [`batch_norm_relu_max_pool_backward`] (the parameter gradients, overwritten into
/// `grad_gamma` and `grad_beta`), and what its second pass needs to write the input gradient image by
/// image ([`BatchNormPoolGrad::write_image`]): for a caller that uses each image of it while it is in
/// cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_relu_max_pool_param_grads<'a, T: Real>(
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    grad_pooled: &'a [T],
    code: &'a [u8],
    winner: &'a [T],
    grad_gamma: &'a mut [T],
    grad_beta: &'a mut [T],
) -> BatchNormPoolGrad<'a, T> {
    assert_eq!(x.len(), shape.len(), "fused batch norm activation length");
    for len in [grad_pooled.len(), code.len(), winner.len()] {
        assert_eq!(len, shape.pooled_len(), "fused max pool output length");
    }
    assert_eq!(gamma.len(), shape.params_len(), "batch norm parameter length");
    // `dβ`, `dγ` from pooled-size data only: `dy` is non-zero only at coded winners. One task per env
    // where there are envs for every thread (the same sums, read front to back).
    let (c, po) = (shape.channels, shape.pooled_plane());
    if shape.envs >= rayon::current_num_threads() {
        for p in [save_mean, save_inv_std, &*grad_gamma, &*grad_beta] {
            assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
        }
        let plane_sums = |e: usize, b: usize, ch: usize, sums: [&mut [T; LANES]; 2]| {
            let plane = ((e * shape.batch + b) * c + ch) * po..((e * shape.batch + b) * c + ch + 1) * po;
            let pooled = PooledPlane {
                grad: &grad_pooled[plane.clone()],
                code: &code[plane.clone()],
                winner: &winner[plane],
            };
            dispatch_pooled_plane_sums(&pooled, save_mean[e * c + ch], sums);
        };
        param_grads_per_env(&shape, save_inv_std, grad_gamma, grad_beta, plane_sums);
    } else {
        let sums = |e: usize, ch: usize, mean: T| {
            let planes =
                PooledPlanes { grad: grad_pooled, code, winner, first: e * shape.batch * c + ch, stride: c };
            dispatch_channel_sums(&shape, &planes, mean)
        };
        batch_norm_param_grads(&shape, save_mean, save_inv_std, grad_gamma, grad_beta, sums);
    }
    BatchNormPoolGrad { shape, x, gamma, save_mean, save_inv_std, grad_gamma, grad_beta, grad_pooled, code }
}

/// The gradient at the batch norm's input of a fused block, a plane at a time, from what the fused forward
/// kept and the parameter gradients.
#[derive(Clone, Copy)]
pub(crate) struct BatchNormPoolGrad<'a, T> {
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    grad_gamma: &'a [T],
    grad_beta: &'a [T],
    grad_pooled: &'a [T],
    code: &'a [u8],
}

impl<T: Real> BatchNormPoolGrad<'_, T> {
    /// Scratch elements [`Self::write_image`] needs: one plane and a spare element.
    pub(crate) fn scratch_len(&self) -> usize {
        self.shape.plane() + 1
    }

    /// Writes image `i`'s (`e·B + b`) input gradient, `[C, H, W]`, into `dx_img`; `scratch` holds
    /// [`Self::scratch_len`].
    #[inline]
    pub(crate) fn write_image(&self, i: usize, scratch: &mut [T], dx_img: &mut [T]) {
        assert_eq!(dx_img.len(), self.shape.image(), "one image of the input gradient");
        for (ch, dx) in dx_img.chunks_exact_mut(self.shape.plane()).enumerate() {
            dispatch_dx_plane(self, i, ch, scratch, dx);
        }
    }

    /// Writes plane `(image, channel)` of the input gradient into `dx`; `scratch` holds `H·W + 1`.
    #[inline(always)]
    fn write_plane(&self, image: usize, channel: usize, scratch: &mut [T], dx: &mut [T]) {
        let s = &self.shape;
        let p = (image / s.batch) * s.channels + channel;
        let n = T::from_usize(s.batch * s.plane());
        let consts = DxConsts::new(
            self.gamma,
            self.save_mean,
            self.save_inv_std,
            self.grad_gamma,
            self.grad_beta,
            n,
            p,
        );
        let (plane, po) = (image * s.channels + channel, s.pooled_plane());
        let x = &self.x[plane * s.plane()..(plane + 1) * s.plane()];
        let pooled = plane * po..(plane + 1) * po;
        dx_plane(s, &consts, x, &self.grad_pooled[pooled.clone()], &self.code[pooled], scratch, dx);
    }
}

/// Calls `f(window, position)` for every window of a plane with the position its gradient goes to: the
/// coded winner, or the spare element `H·W` when no gradient flows.
#[inline(always)]
fn for_each_winner(shape: &NormShape, code: &[u8], mut f: impl FnMut(usize, usize)) {
    let (w, ho, wo, plane) = (shape.w, shape.h / 2, shape.w / 2, shape.plane());
    // Offset of each code's element from its window's top-left corner; the last sends it to the spare.
    let offsets = [0, 1, w, w + 1];
    for oy in 0..ho {
        for ox in 0..wo {
            let o = oy * wo + ox;
            let c = code[o] as usize;
            let corner = 2 * oy * w + 2 * ox;
            f(o, if c < 4 { corner + offsets[c] } else { plane });
        }
    }
}

/// `dx` of one plane. `dy` is rebuilt in `dy` (a cached scratch plane plus one spare element): zero, then
/// each window's `g` stored at its coded winner (at the spare element when no gradient flows, so the
/// scatter has no branch); the rows and columns the pool dropped keep `dy = 0`.
#[inline(always)]
fn dx_plane<T: Real>(
    shape: &NormShape,
    k: &DxConsts<T>,
    x: &[T],
    g: &[T],
    code: &[u8],
    dy: &mut [T],
    dx: &mut [T],
) {
    dy.fill(T::ZERO);
    for_each_winner(shape, code, |o, pos| dy[pos] = g[o]);
    k.input_grad(x, &dy[..x.len()], dx, |_| true);
}

/// [`batch_norm_backward`](super::batch_norm_backward) with its two sums in window order, for a batch
/// norm whose output (after ReLU) feeds a 2×2 max-pool through a seed: bit-identical to
/// [`batch_norm_relu_max_pool_backward`] when the seed passes the gradient through unchanged, so an env
/// gets the same bits whichever path its batch takes. Per plane, window `o`'s four elements (row-major)
/// go to lane `o % LANES`, then the elements no window covers (odd last row or column, row-major) to the
/// lanes after. `grad_output` is the gradient at the batch norm's output. Overwrites `grad_input`,
/// `grad_gamma`, `grad_beta`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward_window_order<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    window_order_backward(
        shape,
        x,
        gamma,
        None,
        save_mean,
        save_inv_std,
        grad_output,
        grad_input,
        grad_gamma,
        grad_beta,
    );
}

/// [`relu_backward_in_place`](super::relu_backward_in_place) on the ReLU's output, then
/// [`batch_norm_backward_window_order`], in the latter's two passes: `grad_output` is the gradient at the
/// ReLU's output, and where the ReLU output zero is known from the norm's own output, recomputed from `x`
/// with the forward's arithmetic (positive exactly where the ReLU passed its input). The same bits, with
/// the ReLU pass's read of the saved output and the gradient's read and write saved.
#[allow(clippy::too_many_arguments)]
pub fn relu_batch_norm_backward_window_order<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    assert_eq!(beta.len(), shape.params_len(), "batch norm parameter length");
    window_order_backward(
        shape,
        x,
        gamma,
        Some(beta),
        save_mean,
        save_inv_std,
        grad_output,
        grad_input,
        grad_gamma,
        grad_beta,
    );
}

#[allow(clippy::too_many_arguments)]
fn window_order_backward<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    relu_beta: Option<&[T]>,
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    let dx = window_order_param_grads(
        shape,
        x,
        gamma,
        relu_beta,
        save_mean,
        save_inv_std,
        grad_output,
        grad_gamma,
        grad_beta,
    );
    dx.write_all(grad_input);
}

/// The first pass of [`batch_norm_backward_window_order`] (or, with `relu_beta`, of
/// [`relu_batch_norm_backward_window_order`]): the parameter gradients, overwritten into `grad_gamma`
/// and `grad_beta`, and what the second pass needs to write the input gradient image by image
/// ([`NormInputGrad::write_image`]), for a caller that uses each image of it while it is in cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn window_order_param_grads<'a, T: Real>(
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    relu_beta: Option<&'a [T]>,
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    grad_output: &'a [T],
    grad_gamma: &'a mut [T],
    grad_beta: &'a mut [T],
) -> NormInputGrad<'a, T> {
    let sums = window_order_channel_sums(shape, x, gamma, relu_beta, save_mean, save_inv_std, grad_output);
    batch_norm_param_grads_then_input_grad(
        shape,
        x,
        gamma,
        relu_beta,
        save_mean,
        save_inv_std,
        grad_output,
        grad_gamma,
        grad_beta,
        sums,
    )
}

/// `sums(e, c, mean) = (Σ dy, Σ dy·(x − mean))` of (env, channel) over its images in window order, `dy`
/// masked by the ReLU (recomputed from `x`) where `relu_beta` is given.
fn window_order_channel_sums<'a, T: Real>(
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    relu_beta: Option<&'a [T]>,
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    grad_output: &'a [T],
) -> impl Fn(usize, usize, T) -> (LaneSums<T>, LaneSums<T>) + Sync + 'a {
    move |e: usize, ch: usize, mean: T| {
        let mut sum_dy = LaneSums::new();
        let mut sum_dy_centered = LaneSums::new();
        let p = e * shape.channels + ch;
        for b in 0..shape.batch {
            let (dy, x) = (shape.plane_of(grad_output, e, b, ch), shape.plane_of(x, e, b, ch));
            let sums = (&mut sum_dy, &mut sum_dy_centered);
            match relu_beta {
                None => window_order_sums(&shape, dy, x, mean, sums, |_| true),
                Some(beta) => {
                    let (mean, scale, shift) = train_affine(save_mean, save_inv_std, gamma, beta)(p);
                    window_order_sums(&shape, dy, x, mean, sums, |v| affine(v, mean, scale, shift) > T::ZERO)
                }
            }
        }
        (sum_dy, sum_dy_centered)
    }
}

/// Adds one plane's `dy` (where `keep(x)`, else zero) and `dy·(x − mean)` to the lane sums in window
/// order (see [`batch_norm_backward_window_order`]).
#[inline(always)]
fn window_order_sums<T: Real>(
    shape: &NormShape,
    dy: &[T],
    x: &[T],
    mean: T,
    (sum_dy, sum_dy_centered): (&mut LaneSums<T>, &mut LaneSums<T>),
    keep: impl Fn(T) -> bool + Copy,
) {
    let (h, w, ho, wo) = (shape.h, shape.w, shape.h / 2, shape.w / 2);
    for oy in 0..ho {
        let rows = 2 * oy * w..(2 * oy + 2) * w;
        let (dy_top, dy_bottom) = dy[rows.clone()].split_at(w);
        let (x_top, x_bottom) = x[rows].split_at(w);
        let rows = [dy_top, dy_bottom, x_top, x_bottom];
        let mut ox = 0;
        while ox < wo {
            let (lane, n) = window_run(oy, wo, ox);
            let sums = [&mut sum_dy.lanes, &mut sum_dy_centered.lanes];
            ox += match n {
                V => add_windows::<T, V>(rows, ox, lane, mean, sums, keep),
                HALF_V => add_windows::<T, HALF_V>(rows, ox, lane, mean, sums, keep),
                _ => add_windows::<T, 1>(rows, ox, lane, mean, sums, keep),
            };
        }
    }
    let mut add = |l: usize, pos: usize| {
        let d = if keep(x[pos]) { dy[pos] } else { T::ZERO };
        sum_dy.lanes[l] += d;
        sum_dy_centered.lanes[l] += d * (x[pos] - mean);
    };
    let mut i = ho * wo;
    for y in 0..h {
        for col in 0..w {
            if y >= 2 * ho || col >= 2 * wo {
                add(i % LANES, y * w + col);
                i += 1;
            }
        }
    }
}

/// Half a window run.
const HALF_V: usize = V / 2;

/// The window run that starts at window `ox` of row `oy` (of `wo` windows) in window order: its first
/// lane, `(oy·wo + ox) % LANES`, and its length — `V` windows from lane 0, `V/2` from a multiple of
/// `V/2`, else one — so runs that fill whole lane groups go through fixed-size arrays (they vectorise).
#[inline(always)]
fn window_run(oy: usize, wo: usize, ox: usize) -> (usize, usize) {
    let lane = (oy * wo + ox) % LANES;
    let n = match wo - ox {
        n if lane == 0 && n >= V => V,
        n if lane.is_multiple_of(HALF_V) && n >= HALF_V => HALF_V,
        _ => 1,
    };
    (lane, n)
}

/// Adds `N` windows from window `ox` of a row pair (`rows = [dy_top, dy_bottom, x_top, x_bottom]`) to
/// lanes `lane..lane + N` of `sums = [Σ dy, Σ dy·(x − mean)]`, each window's elements in row-major order.
#[inline(always)]
fn add_windows<T: Real, const N: usize>(
    rows: [&[T]; 4],
    ox: usize,
    lane: usize,
    mean: T,
    sums: [&mut [T; LANES]; 2],
    keep: impl Fn(T) -> bool,
) -> usize {
    let [dy_top, dy_bottom, x_top, x_bottom] = rows;
    let dy = gather_windows::<T, N>(dy_top, dy_bottom, ox);
    let x = gather_windows::<T, N>(x_top, x_bottom, ox);
    let [sum_dy, sum_dy_centered] = sums;
    // The mask, then the masked gradient, then the sums, each over whole arrays: written as one loop with
    // the select inside, this ran about 40 % slower than the unmasked sums (it did not vectorise).
    let mut kept = [[false; N]; 4];
    for k in 0..4 {
        for l in 0..N {
            kept[k][l] = keep(x[k][l]);
        }
    }
    let mut d = [[T::ZERO; N]; 4];
    for k in 0..4 {
        for l in 0..N {
            d[k][l] = if kept[k][l] { dy[k][l] } else { T::ZERO };
        }
    }
    for k in 0..4 {
        for l in 0..N {
            sum_dy[lane + l] += d[k][l];
            sum_dy_centered[lane + l] += d[k][l] * (x[k][l] - mean);
        }
    }
    N
}

/// The gradient at a pooled block's ReLU output when an all-ADD slot sits between the ReLU and the pool,
/// kept in the pool's terms: `g` (the pool's output gradient, `[E, B, C, H/2, W/2]`) times the env's
/// `share` (`[E]`, the ADD blend's `1 − clamp01(α)`) at each window's winner (`argmax`, `0..4`), zero
/// elsewhere — what [`blend_add_backward_from_pooled`](super::blend_add_backward_from_pooled) writes as
/// `grad_h`, never written out here.
#[derive(Clone, Copy)]
pub(crate) struct SlotPooledGrad<'a, T> {
    pub grad: &'a [T],
    pub argmax: &'a [u8],
    pub share: &'a [T],
}

/// [`window_order_param_grads`] with the ReLU (`beta`) for a ReLU output gradient given as a
/// [`SlotPooledGrad`]: the same bits as `window_order_param_grads` over the full-size gradient the blend
/// would write (a window's three zeros leave its lane unchanged: a lane starts at `+0`, never becomes
/// `−0`, and `0·(x − mean)` is `±0` while `x − mean` is finite; where it overflows the variance is
/// infinite anyway, and NaN payloads are not promised), reading pooled-size data and `x` only. The input
/// gradient then comes image by image ([`SlotPooledNormGrad::write_image`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn relu_batch_norm_param_grads_from_pooled<'a, T: Real>(
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    beta: &'a [T],
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    dy: SlotPooledGrad<'a, T>,
    grad_gamma: &'a mut [T],
    grad_beta: &'a mut [T],
) -> SlotPooledNormGrad<'a, T> {
    assert_eq!(x.len(), shape.len(), "batch norm activation length");
    for p in [gamma, beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    assert_eq!(dy.grad.len(), shape.pooled_len(), "max pool output gradient length");
    assert_eq!(dy.argmax.len(), shape.pooled_len(), "max pool argmax length");
    assert_eq!(dy.share.len(), shape.envs, "one host share per env");
    for p in [save_mean, save_inv_std, &*grad_gamma, &*grad_beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    let (c, po) = (shape.channels, shape.pooled_plane());
    let per_channel = train_affine(save_mean, save_inv_std, gamma, beta);
    let plane_sums = |e: usize, b: usize, ch: usize, sums: [&mut [T; LANES]; 2]| {
        let plane = (e * shape.batch + b) * c + ch;
        let windows = plane * po..(plane + 1) * po;
        let plane = WinnerPlane {
            x: shape.plane_of(x, e, b, ch),
            grad: &dy.grad[windows.clone()],
            argmax: &dy.argmax[windows],
            share: dy.share[e],
        };
        dispatch_winner_sums(&shape, &plane, per_channel(e * c + ch), sums);
    };
    param_grads_per_env(&shape, save_inv_std, grad_gamma, grad_beta, plane_sums);
    let relu_beta = Some(beta);
    let (d_gamma, d_beta) = (&*grad_gamma, &*grad_beta);
    let norm = NormDx { shape, x, gamma, relu_beta, save_mean, save_inv_std, d_gamma, d_beta };
    SlotPooledNormGrad { norm, dy }
}

/// The parameter half of a batch norm's backward (`dβ = Σ dy`, `dγ = Σ dy·(x − mean) · inv_std`), one
/// task per env: `plane_sums(e, b, ch, [Σ dy, Σ dy·(x − mean)])` adds plane (image `b`, channel `ch`)'s
/// terms to env `e`'s lanes for that channel, called image by image, each image's channels in order. The
/// same order of additions per (env, channel) lane as [`batch_norm_param_grads`]' one task per (env,
/// channel), but reading the planes front to back: one task per channel reads one plane per image a whole
/// image apart (at 32×32 a plane is exactly one page), and the prefetcher stops at every one.
fn param_grads_per_env<T: Real>(
    shape: &NormShape,
    save_inv_std: &[T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
    plane_sums: impl Fn(usize, usize, usize, [&mut [T; LANES]; 2]) + Sync,
) {
    let c = shape.channels;
    if c == 0 {
        return;
    }
    let params = grad_gamma.par_chunks_mut(c).zip(grad_beta.par_chunks_mut(c));
    params.enumerate().for_each(|(e, (d_gamma, d_beta))| {
        T::with_scratch(2 * c * LANES, |lanes| {
            lanes.fill(T::ZERO);
            for b in 0..shape.batch {
                for (ch, sums) in lanes.chunks_exact_mut(2 * LANES).enumerate() {
                    let (sum_dy, sum_dy_centered) = sums.split_at_mut(LANES);
                    let sums =
                        [sum_dy, sum_dy_centered].map(|s| <&mut [T; LANES]>::try_from(s).expect("lanes"));
                    plane_sums(e, b, ch, sums);
                }
            }
            for (ch, sums) in lanes.chunks_exact(2 * LANES).enumerate() {
                let total = |l: &[T]| LaneSums { lanes: l.try_into().expect("lanes") }.total();
                d_beta[ch] = total(&sums[..LANES]);
                d_gamma[ch] = total(&sums[LANES..]) * save_inv_std[e * c + ch];
            }
        });
    });
}

/// One plane of a [`SlotPooledGrad`] and the norm's input `x` under it.
struct WinnerPlane<'a, T> {
    x: &'a [T],
    grad: &'a [T],
    argmax: &'a [u8],
    share: T,
}

/// Adds one plane's window winners to the lane sums in window order, as [`window_order_sums`] adds the
/// full-size gradient (whose only non-zero element per window is the winner's): window `o` to lane
/// `o % LANES`, `d = g·share` where the ReLU passed the winner (its norm output, recomputed with
/// `(mean, scale, shift)`, positive), else `0`.
#[inline(always)]
fn winner_sums<T: Real>(
    shape: &NormShape,
    plane: &WinnerPlane<'_, T>,
    (mean, scale, shift): (T, T, T),
    [sum_dy_out, sum_dy_centered_out]: [&mut [T; LANES]; 2],
) {
    // The sums in locals for the plane (in registers; through the references the loop did not vectorise).
    let (mut sum_dy, mut sum_dy_centered) = (*sum_dy_out, *sum_dy_centered_out);
    let (w, ho, wo) = (shape.w, shape.h / 2, shape.w / 2);
    let keep = |v: T| affine(v, mean, scale, shift) > T::ZERO;
    for oy in 0..ho {
        let (x_top, x_bottom) = plane.x[2 * oy * w..(2 * oy + 2) * w].split_at(w);
        let row = oy * wo..(oy + 1) * wo;
        let (g, code) = (&plane.grad[row.clone()], &plane.argmax[row]);
        let rows = WinnerRow { x_top, x_bottom, g, code, share: plane.share, mean };
        let mut ox = 0;
        while ox < wo {
            let (lane, n) = window_run(oy, wo, ox);
            let sums = [&mut sum_dy, &mut sum_dy_centered];
            ox += match n {
                V => add_winners::<T, V>(&rows, ox, lane, sums, keep),
                HALF_V => add_winners::<T, HALF_V>(&rows, ox, lane, sums, keep),
                _ => add_winners::<T, 1>(&rows, ox, lane, sums, keep),
            };
        }
    }
    (*sum_dy_out, *sum_dy_centered_out) = (sum_dy, sum_dy_centered);
}

/// One row of windows of a [`WinnerPlane`].
struct WinnerRow<'a, T> {
    x_top: &'a [T],
    x_bottom: &'a [T],
    g: &'a [T],
    code: &'a [u8],
    share: T,
    mean: T,
}

/// Adds the winners of `N` windows from window `ox` to lanes `lane..lane + N` of `sums = [Σ dy,
/// Σ dy·(x − mean)]`: the winner's `x` picked from the window without branches (so the loop vectorises).
#[inline(always)]
fn add_winners<T: Real, const N: usize>(
    row: &WinnerRow<'_, T>,
    ox: usize,
    lane: usize,
    sums: [&mut [T; LANES]; 2],
    keep: impl Fn(T) -> bool,
) -> usize {
    let x = gather_windows::<T, N>(row.x_top, row.x_bottom, ox);
    let (g, code) = (&row.g[ox..ox + N], &row.code[ox..ox + N]);
    // Each step over whole arrays (the masks, the selects, the products, the ReLU's mask): with the
    // selects and the product in one loop it ran lane by lane.
    let (mut right, mut bottom) = ([false; N], [false; N]);
    for l in 0..N {
        right[l] = code[l] & 1 != 0;
        bottom[l] = code[l] & 2 != 0;
    }
    let mut winner = [T::ZERO; N];
    for l in 0..N {
        let top = if right[l] { x[1][l] } else { x[0][l] };
        let low = if right[l] { x[3][l] } else { x[2][l] };
        winner[l] = if bottom[l] { low } else { top };
    }
    let mut kept = [false; N];
    for l in 0..N {
        kept[l] = keep(winner[l]);
    }
    let mut d = [T::ZERO; N];
    for l in 0..N {
        d[l] = g[l] * row.share;
    }
    for l in 0..N {
        d[l] = if kept[l] { d[l] } else { T::ZERO };
    }
    let [sum_dy, sum_dy_centered] = sums;
    for l in 0..N {
        sum_dy[lane + l] += d[l];
        sum_dy_centered[lane + l] += d[l] * (winner[l] - row.mean);
    }
    N
}

/// A pooled block's batch-norm input gradient, image by image, once its parameter gradients are known:
/// fused, from an all-ADD slot's pooled gradient, or from the whole gradient at the ReLU's output. What
/// [`conv2d_backward_from_images`](super::conv::conv2d_backward_from_images) reads in a block's backward.
pub(crate) enum BlockNormGrad<'a, T> {
    Fused(BatchNormPoolGrad<'a, T>),
    SlotPooled(SlotPooledNormGrad<'a, T>),
    Whole(NormInputGrad<'a, T>),
}

impl<T: Real> BlockNormGrad<'_, T> {
    /// Scratch elements [`Self::write_image`] needs.
    pub(crate) fn scratch_len(&self) -> usize {
        match self {
            BlockNormGrad::Fused(g) => g.scratch_len(),
            BlockNormGrad::SlotPooled(g) => g.scratch_len(),
            BlockNormGrad::Whole(_) => 0,
        }
    }

    /// Writes image `i`'s input gradient into `dx_img`; `scratch` holds [`Self::scratch_len`].
    #[inline]
    pub(crate) fn write_image(&self, i: usize, scratch: &mut [T], dx_img: &mut [T]) {
        match self {
            BlockNormGrad::Fused(g) => g.write_image(i, scratch, dx_img),
            BlockNormGrad::SlotPooled(g) => g.write_image(i, scratch, dx_img),
            BlockNormGrad::Whole(g) => g.write_image(i, dx_img),
        }
    }
}

/// The gradient at the batch norm's input of a pooled block with an all-ADD slot, a plane at a time,
/// from the pool's output gradient and the parameter gradients.
#[derive(Clone, Copy)]
pub(crate) struct SlotPooledNormGrad<'a, T> {
    norm: NormDx<'a, T>,
    dy: SlotPooledGrad<'a, T>,
}

impl<T: Real> SlotPooledNormGrad<'_, T> {
    /// Scratch elements [`Self::write_image`] needs: one plane.
    pub(crate) fn scratch_len(&self) -> usize {
        self.norm.shape.plane()
    }

    /// Writes image `i`'s (`e·B + b`) input gradient, `[C, H, W]`, into `dx_img`; `scratch` holds
    /// [`Self::scratch_len`]. Per plane the ReLU output gradient is rebuilt in `scratch` (zero, then
    /// `g·share` at each winner: the blend's `grad_h`) and goes through [`NormDx::write_plane`], as the
    /// whole gradient would.
    #[inline]
    pub(crate) fn write_image(&self, i: usize, scratch: &mut [T], dx_img: &mut [T]) {
        let s = self.norm.shape;
        assert_eq!(dx_img.len(), s.image(), "one image of the input gradient");
        if s.plane() == 0 {
            return;
        }
        let share = self.dy.share[i / s.batch];
        let pool = PoolShape { envs: 1, batch: 1, channels: 1, h: s.h, w: s.w };
        let dy = &mut scratch[..s.plane()];
        for (ch, dx) in dx_img.chunks_exact_mut(s.plane()).enumerate() {
            unpool_image(&pool, i * s.channels + ch, self.dy.grad, self.dy.argmax, |g| g * share, dy);
            self.norm.write_plane(i, ch, dy, dx);
        }
    }
}

// Runtime dispatch to AVX2 builds of the two per-plane loops, as in `conv`: the same exactly rounded
// operations in the same order either way, so the bits do not depend on the CPU.

/// One (env, channel)'s pooled planes: plane `first + b·stride` for image `b`.
struct PooledPlanes<'a, T> {
    grad: &'a [T],
    code: &'a [u8],
    winner: &'a [T],
    first: usize,
    stride: usize,
}

/// `(Σ dy, Σ dy·(z − mean))` of one (env, channel) as lane sums over its images in order, in window order:
/// window `o` of a plane goes to lane `o % LANES` (the order of
/// [`batch_norm_backward_window_order`](super::batch_norm_backward_window_order), which adds the three
/// zeros of each window too: adding a zero leaves a lane unchanged, as a lane starts at +0 and never
/// becomes −0).
#[inline(always)]
fn channel_sums<T: Real>(
    shape: &NormShape,
    planes: &PooledPlanes<'_, T>,
    mean: T,
) -> (LaneSums<T>, LaneSums<T>) {
    let po = shape.pooled_plane();
    let mut sum_dy = LaneSums::new();
    let mut sum_dy_centered = LaneSums::new();
    for b in 0..shape.batch {
        let start = (planes.first + b * planes.stride) * po;
        let range = start..start + po;
        let (grad, code, winner) =
            (&planes.grad[range.clone()], &planes.code[range.clone()], &planes.winner[range]);
        let plane = PooledPlane { grad, code, winner };
        pooled_plane_sums(&plane, mean, [&mut sum_dy.lanes, &mut sum_dy_centered.lanes]);
    }
    (sum_dy, sum_dy_centered)
}

/// One pooled plane of a fused block: its gradient, window codes and winners' pre-norm values.
struct PooledPlane<'a, T> {
    grad: &'a [T],
    code: &'a [u8],
    winner: &'a [T],
}

/// Adds one pooled plane's coded winners to the lane sums (see [`channel_sums`]).
#[inline(always)]
fn pooled_plane_sums<T: Real>(
    plane: &PooledPlane<'_, T>,
    mean: T,
    [sum_dy_out, sum_dy_centered_out]: [&mut [T; LANES]; 2],
) {
    // The sums in locals for the plane (in registers; through the references the loop does not vectorise).
    let (mut sum_dy, mut sum_dy_centered) = (*sum_dy_out, *sum_dy_centered_out);
    let (mut cg, mut ck, mut cz) =
        (plane.grad.chunks_exact(LANES), plane.code.chunks_exact(LANES), plane.winner.chunks_exact(LANES));
    for ((g, k), z) in (&mut cg).zip(&mut ck).zip(&mut cz) {
        for l in 0..LANES {
            let keep = k[l] != NO_GRADIENT;
            sum_dy[l] += if keep { g[l] } else { T::ZERO };
            sum_dy_centered[l] += if keep { g[l] * (z[l] - mean) } else { T::ZERO };
        }
    }
    let rest = cg.remainder().iter().zip(ck.remainder()).zip(cz.remainder());
    for (l, ((&g, &k), &z)) in rest.enumerate() {
        if k != NO_GRADIENT {
            sum_dy[l] += g;
            sum_dy_centered[l] += g * (z - mean);
        }
    }
    (*sum_dy_out, *sum_dy_centered_out) = (sum_dy, sum_dy_centered);
}

#[inline]
fn dispatch_pooled_plane_sums<T: Real>(plane: &PooledPlane<'_, T>, mean: T, sums: [&mut [T; LANES]; 2]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { pooled_plane_sums_avx2(plane, mean, sums) };
        return;
    }
    pooled_plane_sums(plane, mean, sums);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pooled_plane_sums_avx2<T: Real>(plane: &PooledPlane<'_, T>, mean: T, sums: [&mut [T; LANES]; 2]) {
    pooled_plane_sums(plane, mean, sums);
}

#[inline]
fn dispatch_channel_sums<T: Real>(
    shape: &NormShape,
    planes: &PooledPlanes<'_, T>,
    mean: T,
) -> (LaneSums<T>, LaneSums<T>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { channel_sums_avx2(shape, planes, mean) };
    }
    channel_sums(shape, planes, mean)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn channel_sums_avx2<T: Real>(
    shape: &NormShape,
    planes: &PooledPlanes<'_, T>,
    mean: T,
) -> (LaneSums<T>, LaneSums<T>) {
    channel_sums(shape, planes, mean)
}

#[inline]
fn dispatch_forward_plane<T: Real>(
    shape: &NormShape,
    x: &[T],
    affine: (T, T, T),
    act: &mut [T],
    pooled: &mut [T],
    saved: Option<(&mut [u8], &mut [T])>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { forward_plane_avx2(shape, x, affine, act, pooled, saved) };
        return;
    }
    forward_plane(shape, x, affine, act, pooled, saved);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn forward_plane_avx2<T: Real>(
    shape: &NormShape,
    x: &[T],
    affine: (T, T, T),
    act: &mut [T],
    pooled: &mut [T],
    saved: Option<(&mut [u8], &mut [T])>,
) {
    forward_plane(shape, x, affine, act, pooled, saved);
}

#[inline]
fn dispatch_dx_plane<T: Real>(
    grad: &BatchNormPoolGrad<'_, T>,
    image: usize,
    ch: usize,
    scratch: &mut [T],
    dx: &mut [T],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { dx_plane_avx2(grad, image, ch, scratch, dx) };
        return;
    }
    grad.write_plane(image, ch, scratch, dx);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dx_plane_avx2<T: Real>(
    grad: &BatchNormPoolGrad<'_, T>,
    image: usize,
    ch: usize,
    scratch: &mut [T],
    dx: &mut [T],
) {
    grad.write_plane(image, ch, scratch, dx);
}

#[inline]
fn dispatch_winner_sums<T: Real>(
    shape: &NormShape,
    plane: &WinnerPlane<'_, T>,
    affine: (T, T, T),
    sums: [&mut [T; LANES]; 2],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { winner_sums_avx2(shape, plane, affine, sums) };
        return;
    }
    winner_sums(shape, plane, affine, sums);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn winner_sums_avx2<T: Real>(
    shape: &NormShape,
    plane: &WinnerPlane<'_, T>,
    affine: (T, T, T),
    sums: [&mut [T; LANES]; 2],
) {
    winner_sums(shape, plane, affine, sums);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;
    use crate::ops::{
        Conv2dShape, PoolShape, batch_norm_backward, batch_norm_eval_forward, batch_norm_train_forward,
        conv2d_forward, conv2d_forward_with_plane_stats, max_pool2x2_backward, max_pool2x2_forward,
        plane_mean_and_m2, relu_backward_in_place, relu_forward_in_place,
    };

    /// Even and odd planes (odd: the pool drops the last row or column); rows of 8 or more windows, and
    /// rows whose windows start mid lane group.
    const SHAPES: [(usize, usize); 6] = [(4, 8), (6, 6), (5, 6), (4, 7), (4, 16), (5, 21)];

    fn norm_shape(envs: usize, h: usize, w: usize) -> NormShape {
        NormShape { envs, batch: 3, channels: 3, h, w }
    }

    fn pool_shape(s: &NormShape) -> PoolShape {
        PoolShape { envs: s.envs, batch: s.batch, channels: s.channels, h: s.h, w: s.w }
    }

    fn plane_stats<T: Real>(s: &NormShape, x: &[T]) -> Vec<T> {
        x.chunks_exact(s.plane())
            .flat_map(|plane| {
                let (m, m2) = plane_mean_and_m2(plane);
                [m, m2]
            })
            .collect()
    }

    /// The running statistics the f64 tests start from.
    fn running_stats(p: usize) -> [Vec<f64>; 2] {
        [uniform(7, p, -0.5, 0.5), uniform(8, p, 0.5, 2.0)]
    }

    /// Values on a grid of 0.25: many exact ties inside windows, and exact zeros after the norm's shift.
    fn tied(seed: u64, n: usize) -> Vec<f64> {
        uniform(seed, n, -2.0, 2.0).iter().map(|v| (v * 4.0).round() / 4.0).collect()
    }

    /// What the fused training forward saves, and the running statistics it updated.
    struct Fused<T> {
        pooled: Vec<T>,
        code: Vec<u8>,
        winner: Vec<T>,
        mean: Vec<T>,
        inv_std: Vec<T>,
        running: [Vec<T>; 2],
    }

    fn fused_forward(s: &NormShape, x: &[f64], gamma: &[f64], beta: &[f64]) -> Fused<f64> {
        fused_forward_from(s, x, gamma, beta, running_stats(s.params_len()))
    }

    /// The fused training forward from the running statistics `running` (mean, var), the plane statistics
    /// taken from `x`.
    fn fused_forward_from<T: Real>(
        s: &NormShape,
        x: &[T],
        gamma: &[T],
        beta: &[T],
        mut running: [Vec<T>; 2],
    ) -> Fused<T> {
        let p = s.params_len();
        let (mut mean, mut inv_std) = (vec![T::ZERO; p], vec![T::ZERO; p]);
        let (mut pooled, mut code, mut winner) =
            (vec![T::ZERO; s.pooled_len()], vec![0; s.pooled_len()], vec![T::ZERO; s.pooled_len()]);
        let [r_mean, r_var] = &mut running;
        batch_norm_relu_max_pool_train_forward(
            *s,
            x,
            &plane_stats(s, x),
            gamma,
            beta,
            &mut mean,
            &mut inv_std,
            r_mean,
            r_var,
            &mut pooled,
            &mut code,
            &mut winner,
        );
        Fused { pooled, code, winner, mean, inv_std, running }
    }

    #[test]
    fn conv_plane_statistics_are_those_of_its_output() {
        let s = Conv2dShape { envs: 2, batch: 3, c_in: 2, c_out: 5, h: 5, w: 6, k: 3, pad: 1, groups: 1 };
        let x = signed(1, s.input_len());
        let w = signed(2, s.weight_len());
        let mut plain = vec![0.0; s.output_len()];
        conv2d_forward(s, &x, &w, &mut plain);
        let mut out = vec![0.0; s.output_len()];
        let mut stats = vec![0.0; 2 * s.envs * s.batch * s.c_out];
        conv2d_forward_with_plane_stats(s, &x, &w, &mut out, &mut stats);
        assert_eq!(out, plain);
        let n = NormShape { envs: s.envs, batch: s.batch, channels: s.c_out, h: 5, w: 6 };
        assert_eq!(stats, plane_stats(&n, &plain));
    }

    #[test]
    fn fused_forward_matches_the_unfused_ops() {
        for (h, w) in SHAPES {
            let s = norm_shape(2, h, w);
            let x = uniform(h as u64, s.len(), -1.0, 3.0);
            let (gamma, beta) = (uniform(3, s.params_len(), 0.5, 1.5), signed(4, s.params_len()));
            let f = fused_forward(&s, &x, &gamma, &beta);

            // Reference: the unfused ops (two-pass batch statistics over the whole channel).
            let p = s.params_len();
            let (mut mean, mut inv_std) = (vec![0.0; p], vec![0.0; p]);
            let [mut r_mean, mut r_var] = running_stats(p);
            let mut y = vec![0.0; s.len()];
            batch_norm_train_forward(
                s,
                &x,
                &gamma,
                &beta,
                &mut y,
                &mut mean,
                &mut inv_std,
                &mut r_mean,
                &mut r_var,
            );
            relu_forward_in_place(&mut y);
            let (mut pooled, mut argmax) = (vec![0.0; s.pooled_len()], vec![0; s.pooled_len()]);
            max_pool2x2_forward(pool_shape(&s), &y, &mut pooled, &mut argmax);
            for (name, a, b) in [
                ("mean", &f.mean, &mean),
                ("inv_std", &f.inv_std, &inv_std),
                ("running mean", &f.running[0], &r_mean),
                ("running var", &f.running[1], &r_var),
                ("pooled", &f.pooled, &pooled),
            ] {
                let err = relative_error(a, b);
                assert!(err <= 1e-10, "{h}x{w} {name}: relative error {err:.3e}");
            }
            // Tie-free data: the same winners; the code marks those whose ReLU output is positive.
            for i in 0..pooled.len() {
                let expected = if pooled[i] > 0.0 { argmax[i] } else { NO_GRADIENT };
                assert_eq!(f.code[i], expected, "{h}x{w} window {i}");
                if expected != NO_GRADIENT {
                    let (plane, o) = (i / s.pooled_plane(), i % s.pooled_plane());
                    let (oy, ox, k) = (o / (w / 2), o % (w / 2), argmax[i] as usize);
                    assert_eq!(f.winner[i], x[plane * s.plane() + (2 * oy + k / 2) * w + 2 * ox + k % 2]);
                }
            }
        }
    }

    #[test]
    fn fused_forward_is_bitwise_the_op_by_op_path_with_ties() {
        for (h, w) in SHAPES {
            let s = norm_shape(2, h, w);
            let x = tied(h as u64 + 10, s.len());
            let (gamma, beta) = (vec![1.0; s.params_len()], tied(5, s.params_len()));
            let f = fused_forward(&s, &x, &gamma, &beta);
            // The op-by-op path of the host (block with a seed between ReLU and pool).
            let p = s.params_len();
            let (mut mean, mut inv_std) = (vec![0.0; p], vec![0.0; p]);
            let [mut r_mean, mut r_var] = running_stats(p);
            let mut y = vec![0.0; s.len()];
            let stats = plane_stats(&s, &x);
            batch_norm_relu_train_forward(
                s,
                &x,
                &stats,
                &gamma,
                &beta,
                &mut y,
                &mut mean,
                &mut inv_std,
                &mut r_mean,
                &mut r_var,
            );
            let (mut pooled, mut argmax) = (vec![0.0; s.pooled_len()], vec![0; s.pooled_len()]);
            max_pool2x2_forward(pool_shape(&s), &y, &mut pooled, &mut argmax);
            assert_eq!((&f.mean, &f.inv_std), (&mean, &inv_std));
            assert_eq!(f.running, [r_mean, r_var]);
            assert_eq!(f.pooled, pooled);
            let ties = (0..pooled.len()).filter(|&i| pooled[i] > 0.0 && f.code[i] != argmax[i]).count();
            assert_eq!(ties, 0, "{h}x{w}: the fused path picked another winner");

            // Eval: bitwise the unfused ops.
            let (rm, rv) = (tied(20, p), uniform(21, p, 0.5, 2.0));
            let mut fused = vec![0.0; s.pooled_len()];
            batch_norm_relu_max_pool_eval_forward(s, &x, &gamma, &beta, &rm, &rv, &mut fused);
            batch_norm_eval_forward(s, &x, &gamma, &beta, &rm, &rv, &mut y);
            relu_forward_in_place(&mut y);
            // Without the pool (a seed between ReLU and pool): one pass, the same bits.
            let mut one_pass = vec![f64::NAN; s.len()];
            batch_norm_relu_eval_forward(s, &x, &gamma, &beta, &rm, &rv, &mut one_pass);
            let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits64(&one_pass), bits64(&y), "{h}x{w}: eval batch norm → ReLU");
            max_pool2x2_forward(pool_shape(&s), &y, &mut pooled, &mut argmax);
            assert_eq!(fused, pooled, "{h}x{w}: eval");
        }
    }

    /// The unfused backward of the fused forward: pool, ReLU, batch norm, from the same statistics.
    fn unfused_backward<T: Real>(
        s: &NormShape,
        x: &[T],
        gamma: &[T],
        f: &Fused<T>,
        g: &[T],
        window_order: bool,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let mut y = vec![T::ZERO; s.len()];
        let stats = plane_stats(s, x);
        let p = s.params_len();
        let [mut r_mean, mut r_var, mut mean, mut inv_std] =
            [vec![T::ZERO; p], vec![T::ONE; p], vec![T::ZERO; p], vec![T::ZERO; p]];
        let beta = vec![T::ZERO; p];
        batch_norm_relu_train_forward(
            *s,
            x,
            &stats,
            gamma,
            &beta,
            &mut y,
            &mut mean,
            &mut inv_std,
            &mut r_mean,
            &mut r_var,
        );
        let (mut pooled, mut argmax) = (vec![T::ZERO; s.pooled_len()], vec![0; s.pooled_len()]);
        max_pool2x2_forward(pool_shape(s), &y, &mut pooled, &mut argmax);
        let mut dy = vec![T::from_f64(f64::NAN); s.len()];
        max_pool2x2_backward(pool_shape(s), g, &argmax, &mut dy);
        relu_backward_in_place(&y, &mut dy);
        let (mut dx, mut dg, mut db) = (vec![T::ZERO; s.len()], vec![T::ZERO; p], vec![T::ZERO; p]);
        let backward = if window_order { batch_norm_backward_window_order } else { batch_norm_backward };
        backward(*s, x, gamma, &f.mean, &f.inv_std, &dy, &mut dx, &mut dg, &mut db);
        (dx, dg, db)
    }

    fn fused_backward<T: Real>(
        s: &NormShape,
        x: &[T],
        gamma: &[T],
        f: &Fused<T>,
        g: &[T],
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let p = s.params_len();
        let (mut dx, mut dg, mut db) =
            (vec![T::from_f64(f64::NAN); s.len()], vec![T::ZERO; p], vec![T::ZERO; p]);
        batch_norm_relu_max_pool_backward(
            *s, x, gamma, &f.mean, &f.inv_std, g, &f.code, &f.winner, &mut dx, &mut dg, &mut db,
        );
        (dx, dg, db)
    }

    #[test]
    fn fused_backward_matches_the_unfused_ops() {
        for (h, w) in SHAPES {
            let s = norm_shape(2, h, w);
            let x = uniform(h as u64 + 30, s.len(), -1.0, 3.0);
            let gamma = uniform(3, s.params_len(), 0.5, 1.5);
            let f = fused_forward(&s, &x, &gamma, &vec![0.0; s.params_len()]);
            let g = signed(9, s.pooled_len());
            let fused = fused_backward(&s, &x, &gamma, &f, &g);
            let plain = unfused_backward(&s, &x, &gamma, &f, &g, false);
            for (name, a, b) in
                [("dx", &fused.0, &plain.0), ("dgamma", &fused.1, &plain.1), ("dbeta", &fused.2, &plain.2)]
            {
                let err = relative_error(a, b);
                assert!(err <= 1e-10, "{h}x{w} {name}: relative error {err:.3e}");
            }
        }
    }

    #[test]
    fn fused_backward_is_bitwise_the_window_order_backward() {
        for (h, w) in SHAPES {
            let s = norm_shape(2, h, w);
            let x = tied(h as u64 + 40, s.len());
            let gamma = vec![1.0; s.params_len()];
            let f = fused_forward(&s, &x, &gamma, &vec![0.0; s.params_len()]);
            let g = signed(10, s.pooled_len());
            assert_eq!(
                fused_backward(&s, &x, &gamma, &f, &g),
                unfused_backward(&s, &x, &gamma, &f, &g, true)
            );
            // The same in f32, where rounding would show any difference in order.
            let x32 = to_f32(&uniform(h as u64 + 50, s.len(), -1.0, 3.0));
            let pl = s.params_len();
            let (gamma32, beta32) = (vec![1.25f32; pl], vec![0.0f32; pl]);
            let f = fused_forward_from(&s, &x32, &gamma32, &beta32, [vec![0f32; pl], vec![1f32; pl]]);
            let g32 = to_f32(&g);
            let (dx, dg, db) = fused_backward(&s, &x32, &gamma32, &f, &g32);
            let (dx2, dg2, db2) = unfused_backward(&s, &x32, &gamma32, &f, &g32, true);
            assert_eq!(
                (bits(&dx), bits(&dg), bits(&db)),
                (bits(&dx2), bits(&dg2), bits(&db2)),
                "{h}x{w}: f32"
            );
        }
    }

    /// The norm's backward from an all-ADD slot's pooled gradient (sums over the winners, each image's
    /// input gradient rebuilt in scratch) is bit for bit the blend writing its full-size `grad_h` and
    /// [`relu_batch_norm_backward_window_order`] reading it: f32, odd planes and windows starting mid
    /// lane group, per-env amplitudes (one clamped), a ReLU that masks some winners.
    #[test]
    fn norm_backward_from_a_pooled_slot_gradient_is_the_blend_then_the_window_order_backward() {
        use crate::ops::{Amplitude, BlendShape, blend_add_backward_from_pooled, blend_add_forward};
        for (h, w) in SHAPES {
            let s = norm_shape(2, h, w);
            let pl = s.params_len();
            let x = to_f32(&uniform(h as u64 + 70, s.len(), -1.0, 3.0));
            let gamma = to_f32(&uniform(71, pl, 0.5, 1.5));
            let beta = to_f32(&signed(72, pl));
            let (mut host, mut mean, mut inv_std) = (vec![0f32; s.len()], vec![0f32; pl], vec![0f32; pl]);
            let (mut r_mean, mut r_var) = (vec![0f32; pl], vec![1f32; pl]);
            batch_norm_relu_train_forward(
                s,
                &x,
                &plane_stats(&s, &x),
                &gamma,
                &beta,
                &mut host,
                &mut mean,
                &mut inv_std,
                &mut r_mean,
                &mut r_var,
            );
            let seed = to_f32(&signed(h as u64 + 73, s.len()));
            let alpha = [0.37f32, 1.4];
            let blend = BlendShape { envs: s.envs, batch: s.batch, features: s.image() };
            let mut y = vec![0f32; s.len()];
            blend_add_forward(blend, &host, &seed, Amplitude::PerEnv(&alpha), &mut y);
            let (mut pooled, mut argmax) = (vec![0f32; s.pooled_len()], vec![0u8; s.pooled_len()]);
            max_pool2x2_forward(pool_shape(&s), &y, &mut pooled, &mut argmax);
            let g = to_f32(&signed(h as u64 + 74, s.pooled_len()));

            let (mut dh, mut ds) = (vec![f32::NAN; s.len()], vec![f32::NAN; s.len()]);
            let a = Amplitude::PerEnv(&alpha[..]);
            blend_add_backward_from_pooled(blend, pool_shape(&s), a, &g, &argmax, Some(&mut dh), &mut ds);
            let (mut dx, mut dg, mut db) = (vec![f32::NAN; s.len()], vec![0f32; pl], vec![0f32; pl]);
            relu_batch_norm_backward_window_order(
                s, &x, &gamma, &beta, &mean, &inv_std, &dh, &mut dx, &mut dg, &mut db,
            );

            let share: Vec<f32> = alpha.iter().map(|&a| 1.0 - a.clamp(0.0, 1.0)).collect();
            let dy = SlotPooledGrad { grad: &g, argmax: &argmax, share: &share };
            let (mut dg2, mut db2) = (vec![f32::NAN; pl], vec![f32::NAN; pl]);
            let grad = relu_batch_norm_param_grads_from_pooled(
                s, &x, &gamma, &beta, &mean, &inv_std, dy, &mut dg2, &mut db2,
            );
            let mut dx2 = vec![f32::NAN; s.len()];
            let mut scratch = vec![f32::NAN; grad.scratch_len()];
            for (i, dx_img) in dx2.chunks_exact_mut(s.image()).enumerate() {
                grad.write_image(i, &mut scratch, dx_img);
            }
            assert_eq!((bits(&dg2), bits(&db2)), (bits(&dg), bits(&db)), "{h}x{w}: parameter gradients");
            assert_eq!(bits(&dx2), bits(&dx), "{h}x{w}: input gradient");
            // Env 1's amplitude clamps to 1: its host gets nothing; env 0's winners are partly masked.
            let env = s.len() / 2;
            assert!(dh[env..].iter().all(|&v| v == 0.0), "{h}x{w}: a clamped amplitude of 1");
            let (passed, masked) = host[..env]
                .iter()
                .zip(&dh[..env])
                .filter(|(_, d)| **d != 0.0)
                .fold((0, 0), |(p, m), (&h, _)| if h > 0.0 { (p + 1, m) } else { (p, m + 1) });
            assert!(passed > 0 && masked > 0, "{h}x{w}: winners passed {passed}, masked {masked}");
        }
    }

    #[test]
    fn fused_ops_do_not_depend_on_env_count_or_threads() {
        let (h, w) = (6, 8);
        let s = norm_shape(3, h, w);
        let x = to_f32(&uniform(60, s.len(), -1.0, 3.0));
        let gamma = to_f32(&uniform(61, s.params_len(), 0.5, 1.5));
        let beta = to_f32(&signed(62, s.params_len()));
        let g = to_f32(&signed(63, s.pooled_len()));
        let run = |s: NormShape, x: &[f32], gamma: &[f32], beta: &[f32], g: &[f32]| {
            let pl = s.params_len();
            let f = fused_forward_from(&s, x, gamma, beta, [vec![0f32; pl], vec![1f32; pl]]);
            let (dx, dg, db) = fused_backward(&s, x, gamma, &f, g);
            let [rm, rv] = f.running;
            [f.pooled, f.winner, rm, rv, dx, dg, db].map(|v| bits(&v))
        };
        let all = run(s, &x, &gamma, &beta, &g);
        assert_eq!(all, with_threads(1, || run(s, &x, &gamma, &beta, &g)), "thread count changed the bits");
        let one = NormShape { envs: 1, ..s };
        let e = 2;
        let slice = |v: &[f32], per: usize| v[e * per..(e + 1) * per].to_vec();
        let alone = run(
            one,
            &slice(&x, one.len()),
            &slice(&gamma, one.params_len()),
            &slice(&beta, one.params_len()),
            &slice(&g, one.pooled_len()),
        );
        let per = [
            one.pooled_len(),
            one.pooled_len(),
            one.params_len(),
            one.params_len(),
            one.len(),
            one.params_len(),
            one.params_len(),
        ];
        for (k, (a, b)) in alone.iter().zip(&all).enumerate() {
            assert_eq!(
                a[..],
                b[e * per[k]..(e + 1) * per[k]],
                "output {k}: env {e} alone differs from the batch"
            );
        }
    }

    #[test]
    fn fused_forward_propagates_nan() {
        let s = NormShape { envs: 1, batch: 1, channels: 2, h: 2, w: 4 };
        let mut x = vec![1.0f32, 5.0, 2.0, 2.0, 3.0, 0.5, 9.0, 1.0];
        x.extend([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        x[1] = f32::NAN;
        // Eval: only the window holding the NaN is NaN.
        let (gamma, beta, rm, rv) = (vec![1.0f32; 2], vec![0.0f32; 2], vec![0.0f32; 2], vec![1.0f32; 2]);
        let mut pooled = vec![0.0f32; 4];
        batch_norm_relu_max_pool_eval_forward(s, &x, &gamma, &beta, &rm, &rv, &mut pooled);
        assert!(pooled[0].is_nan() && pooled[1..].iter().all(|v| v.is_finite()), "{pooled:?}");
        // Training: the NaN poisons its channel's statistics, so every window of that channel is NaN and
        // passes no gradient.
        let Fused { pooled, code, .. } = fused_forward_from(&s, &x, &gamma, &beta, [rm, rv]);
        assert!(pooled[0].is_nan() && pooled[1].is_nan() && pooled[2..].iter().all(|v| v.is_finite()));
        assert_eq!(code[..2], [NO_GRADIENT, NO_GRADIENT]);
    }
}
