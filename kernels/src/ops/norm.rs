//! Batch norm (the host's conv blocks) and group norm (the seeds), over `[E, B, C, H, W]` activations.
//!
//! Both normalise with the biased variance and `eps = 1e-5`, then apply a per-channel affine `γ·x̂ + β`
//! (`γ`, `β`: `[E, C]`). Batch norm's statistics are per (env, channel) over that env's `B·H·W` values;
//! group norm's per (env, image, group) over `C/G·H·W` values.
//!
//! Each op runs in two parallel passes: reductions per (env, channel) — or per (env, image) for group
//! norm — then an element-wise pass per (env, image). Every sum uses [`LaneSums`] over the planes in
//! image order, so its order depends only on the shape.

use rayon::prelude::*;

use super::activation::relu;
use super::real::{LANES, LaneSums, Real};

/// Added to the variance before the square root (PyTorch's default).
pub const NORM_EPS: f64 = 1e-5;
/// Weight of the new batch statistic in the running averages (PyTorch's default).
pub const BATCH_NORM_MOMENTUM: f64 = 0.1;

/// Shape of a normalised activation `[E, B, C, H, W]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormShape {
    pub envs: usize,
    pub batch: usize,
    pub channels: usize,
    pub h: usize,
    pub w: usize,
}

impl NormShape {
    pub fn plane(&self) -> usize {
        self.h * self.w
    }
    /// Elements of one image `[C, H, W]`.
    pub fn image(&self) -> usize {
        self.channels * self.plane()
    }
    /// Elements of the activation.
    pub fn len(&self) -> usize {
        self.envs * self.batch * self.image()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Elements of a per-(env, channel) parameter or statistic `[E, C]`.
    pub fn params_len(&self) -> usize {
        self.envs * self.channels
    }
    /// Plane `(e, b, c)` of an activation.
    pub(crate) fn plane_of<'a, T>(&self, data: &'a [T], e: usize, b: usize, c: usize) -> &'a [T] {
        let start = ((e * self.batch + b) * self.channels + c) * self.plane();
        &data[start..start + self.plane()]
    }
}

// ---------------------------------------------------------------------------------------------------
// Batch norm
// ---------------------------------------------------------------------------------------------------

/// Training-mode batch norm: normalises with the batch statistics of each (env, channel), saves
/// `mean` and `1/sqrt(var + eps)` (`[E, C]`) for the backward, and updates the running statistics in
/// place with momentum 0.1 — the running variance with the *unbiased* batch variance, like PyTorch.
/// Overwrites `y`, `save_mean`, `save_inv_std`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_train_forward<T: Real>(
    shape: NormShape,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    running_mean: &mut [T],
    running_var: &mut [T],
) {
    assert_eq!(x.len(), shape.len(), "batch norm input length");
    for p in [gamma, beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    let n = T::from_usize(shape.batch * shape.plane());
    let c = shape.channels;
    let batch_stats = |i: usize| {
        let (e, ch) = (i / c, i % c);
        let mut sum = LaneSums::new();
        for b in 0..shape.batch {
            sum.add_map(shape.plane_of(x, e, b, ch), |v| v);
        }
        let m = sum.total() / n;
        // Two passes: the variance from deviations, not E[x²] − m², which cancels badly in f32.
        let mut squares = LaneSums::new();
        for b in 0..shape.batch {
            squares.add_map(shape.plane_of(x, e, b, ch), |v| (v - m) * (v - m));
        }
        (m, squares.total() / n)
    };
    save_batch_stats(&shape, batch_stats, save_mean, save_inv_std, running_mean, running_var);
    let (mean, inv_std) = (&*save_mean, &*save_inv_std);
    normalize(&shape, x, y, train_affine(mean, inv_std, gamma, beta), |v| v);
}

/// Saves the batch statistics `stats(e·C + c) = (mean, biased variance)` of every (env, channel) as `mean`
/// and `1/sqrt(var + eps)`, and updates the running statistics with momentum 0.1 (the running variance
/// with the unbiased batch variance). Shared by every training batch norm, whatever the statistics' source.
pub(crate) fn save_batch_stats<T: Real>(
    shape: &NormShape,
    stats: impl Fn(usize) -> (T, T) + Sync,
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    running_mean: &mut [T],
    running_var: &mut [T],
) {
    for p in [&*save_mean, &*save_inv_std, &*running_mean, &*running_var] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    let count = shape.batch * shape.plane();
    assert!(count > 1, "batch norm in training needs more than one value per channel");
    let eps = T::from_f64(NORM_EPS);
    let momentum = T::from_f64(BATCH_NORM_MOMENTUM);
    let unbiased = T::from_usize(count) / T::from_usize(count - 1);
    save_mean
        .par_iter_mut()
        .zip(save_inv_std.par_iter_mut())
        .zip(running_mean.par_iter_mut().zip(running_var.par_iter_mut()))
        .enumerate()
        .for_each(|(i, ((mean, inv_std), (r_mean, r_var)))| {
            let (m, var) = stats(i);
            *mean = m;
            *inv_std = T::ONE / (var + eps).sqrt();
            *r_mean = (T::ONE - momentum) * *r_mean + momentum * m;
            *r_var = (T::ONE - momentum) * *r_var + momentum * var * unbiased;
        });
}

/// `(mean, Σ (v − mean)²)` of one plane, both with [`LaneSums`] (two passes: the plane is in cache).
#[inline]
pub fn plane_mean_and_m2<T: Real>(values: &[T]) -> (T, T) {
    let mut sum = LaneSums::new();
    sum.add_map(values, |v| v);
    let mean = sum.total() / T::from_usize(values.len().max(1));
    let mut squares = LaneSums::new();
    squares.add_map(values, |v| (v - mean) * (v - mean));
    (mean, squares.total())
}

/// The element-wise pass of a batch norm, one task per (env, image): `y = act((x − mean)·scale + shift)`
/// with `(mean, scale, shift) = per_channel(e·C + c)`. `act` is the identity, or ReLU for batch norm →
/// ReLU in one pass.
pub(crate) fn normalize<T: Real>(
    shape: &NormShape,
    x: &[T],
    y: &mut [T],
    per_channel: impl Fn(usize) -> (T, T, T) + Sync,
    act: impl Fn(T) -> T + Sync,
) {
    assert_eq!(x.len(), shape.len(), "batch norm input length");
    assert_eq!(y.len(), shape.len(), "batch norm output length");
    if shape.is_empty() {
        return;
    }
    let (c, plane) = (shape.channels, shape.plane());
    y.par_chunks_mut(shape.image()).enumerate().for_each(|(i, y_img)| {
        let e = i / shape.batch;
        let x_img = &x[i * shape.image()..(i + 1) * shape.image()];
        for ch in 0..c {
            let (mean, scale, shift) = per_channel(e * c + ch);
            let range = ch * plane..(ch + 1) * plane;
            for (out, &v) in y_img[range.clone()].iter_mut().zip(&x_img[range]) {
                *out = act(affine(v, mean, scale, shift));
            }
        }
    });
}

/// One element of a normalisation: `(v − mean)·scale + shift`. Every norm path (batch norm op by op or
/// fused, group norm) computes it here, so they agree bit for bit.
#[inline(always)]
pub(crate) fn affine<T: Real>(v: T, mean: T, scale: T, shift: T) -> T {
    (v - mean) * scale + shift
}

/// `(mean, scale, shift)` of (env, channel) `p` of a training batch norm, from its saved statistics.
pub(crate) fn train_affine<'a, T: Real>(
    mean: &'a [T],
    inv_std: &'a [T],
    gamma: &'a [T],
    beta: &'a [T],
) -> impl Fn(usize) -> (T, T, T) + Sync + 'a {
    move |p| (mean[p], inv_std[p] * gamma[p], beta[p])
}

/// `(mean, scale, shift)` of (env, channel) `p` of an eval batch norm, from the running statistics.
pub(crate) fn eval_affine<'a, T: Real>(
    gamma: &'a [T],
    beta: &'a [T],
    running_mean: &'a [T],
    running_var: &'a [T],
) -> impl Fn(usize) -> (T, T, T) + Sync + 'a {
    let eps = T::from_f64(NORM_EPS);
    move |p| (running_mean[p], gamma[p] / (running_var[p] + eps).sqrt(), beta[p])
}

/// Eval-mode batch norm: normalises with the running statistics. Overwrites `y`.
pub fn batch_norm_eval_forward<T: Real>(
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
    normalize(&shape, x, y, eval_affine(gamma, beta, running_mean, running_var), |v| v);
}

/// Backward of [`batch_norm_train_forward`] from its input and saved statistics. Overwrites
/// `grad_input`, `grad_gamma`, `grad_beta`:
/// `dβ = Σ dy`, `dγ = Σ dy·x̂`, `dx = γ·inv_std·(dy − dβ/N − x̂·dγ/N)` with `N = B·H·W`.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward<T: Real>(
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
    let sums = |e: usize, ch: usize, mean: T| {
        let mut sum_dy = LaneSums::new();
        let mut sum_dy_centered = LaneSums::new();
        for b in 0..shape.batch {
            let dy = shape.plane_of(grad_output, e, b, ch);
            sum_dy.add_map(dy, |g| g);
            sum_dy_centered.add_zip(dy, shape.plane_of(x, e, b, ch), |g, v| g * (v - mean));
        }
        (sum_dy, sum_dy_centered)
    };
    let dx = batch_norm_param_grads_then_input_grad(
        shape,
        x,
        gamma,
        None,
        save_mean,
        save_inv_std,
        grad_output,
        grad_gamma,
        grad_beta,
        sums,
    );
    dx.write_all(grad_input);
}

/// The first pass of a batch-norm backward whose two per-(env, channel) sums `(Σ dy, Σ dy·(x − mean))`
/// come from `sums(e, c, mean)` (callers differ only in the order of those sums): the parameter gradients,
/// overwritten into `grad_gamma` and `grad_beta`, and what the second pass needs to write the input
/// gradient ([`NormInputGrad::write_all`], or image by image for a caller that uses each image while it
/// is in cache). With `relu_beta = Some(β)` the norm is followed by a ReLU and `grad_output` is the
/// gradient at the ReLU's output: `dy` counts where the norm's output `(x − mean)·(inv_std·γ) + β`
/// (recomputed, the forward's arithmetic) is positive, as after `relu_backward_in_place` (and `sums` must
/// mask the same way).
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_norm_param_grads_then_input_grad<'a, T: Real>(
    shape: NormShape,
    x: &'a [T],
    gamma: &'a [T],
    relu_beta: Option<&'a [T]>,
    save_mean: &'a [T],
    save_inv_std: &'a [T],
    grad_output: &'a [T],
    grad_gamma: &'a mut [T],
    grad_beta: &'a mut [T],
    sums: impl Fn(usize, usize, T) -> (LaneSums<T>, LaneSums<T>) + Sync,
) -> NormInputGrad<'a, T> {
    for a in [x, grad_output] {
        assert_eq!(a.len(), shape.len(), "batch norm activation length");
    }
    assert_eq!(gamma.len(), shape.params_len(), "batch norm parameter length");
    if let Some(beta) = relu_beta {
        assert_eq!(beta.len(), shape.params_len(), "batch norm parameter length");
    }
    batch_norm_param_grads(&shape, save_mean, save_inv_std, grad_gamma, grad_beta, sums);
    let dx = NormDx {
        shape,
        x,
        gamma,
        relu_beta,
        save_mean,
        save_inv_std,
        d_gamma: grad_gamma,
        d_beta: grad_beta,
    };
    NormInputGrad { dx, grad_output }
}

/// A batch norm's input gradient once its parameter gradients are known, a plane at a time from the
/// gradient at its output (at the ReLU's output with `relu_beta`, see
/// [`batch_norm_param_grads_then_input_grad`]).
#[derive(Clone, Copy)]
pub(crate) struct NormDx<'a, T> {
    pub shape: NormShape,
    /// The norm's input `[E, B, C, H, W]`.
    pub x: &'a [T],
    pub gamma: &'a [T],
    /// `β` where a ReLU follows the norm (its mask is recomputed from `x`).
    pub relu_beta: Option<&'a [T]>,
    pub save_mean: &'a [T],
    pub save_inv_std: &'a [T],
    /// The parameter gradients, already computed, `[E, C]` each.
    pub d_gamma: &'a [T],
    pub d_beta: &'a [T],
}

impl<T: Real> NormDx<'_, T> {
    /// Writes plane (image `i = e·B + b`, channel `ch`) of the input gradient into `dx` from that plane of
    /// the output gradient, `dy`.
    #[inline]
    pub(crate) fn write_plane(&self, i: usize, ch: usize, dy: &[T], dx: &mut [T]) {
        let shape = &self.shape;
        let (c, plane) = (shape.channels, shape.plane());
        let n = T::from_usize(shape.batch * plane);
        let p = (i / shape.batch) * c + ch;
        let (gamma, mean, inv_std) = (self.gamma, self.save_mean, self.save_inv_std);
        let k = DxConsts::new(gamma, mean, inv_std, self.d_gamma, self.d_beta, n, p);
        let at = (i * c + ch) * plane;
        let x = &self.x[at..at + plane];
        let relu = self.relu_beta.map(|beta| train_affine(mean, inv_std, gamma, beta)(p));
        dispatch_input_grad(&k, x, dy, dx, relu);
    }
}

/// [`DxConsts::input_grad`] over one plane, with the ReLU's mask where `relu` gives the norm's
/// `(mean, scale, shift)`, in an AVX2 build where the CPU has it (the same operations in the same order,
/// so the same bits).
#[inline]
fn dispatch_input_grad<T: Real>(k: &DxConsts<T>, x: &[T], dy: &[T], dx: &mut [T], relu: Option<(T, T, T)>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { input_grad_avx2(k, x, dy, dx, relu) };
        return;
    }
    input_grad(k, x, dy, dx, relu);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn input_grad_avx2<T: Real>(k: &DxConsts<T>, x: &[T], dy: &[T], dx: &mut [T], relu: Option<(T, T, T)>) {
    input_grad(k, x, dy, dx, relu);
}

#[inline(always)]
fn input_grad<T: Real>(k: &DxConsts<T>, x: &[T], dy: &[T], dx: &mut [T], relu: Option<(T, T, T)>) {
    match relu {
        None => k.input_grad(x, dy, dx, |_| true),
        Some((mean, scale, shift)) => k.input_grad(x, dy, dx, |v| affine(v, mean, scale, shift) > T::ZERO),
    }
}

/// A batch norm's input gradient once its parameter gradients are known, image by image, from the whole
/// gradient at its output.
#[derive(Clone, Copy)]
pub(crate) struct NormInputGrad<'a, T> {
    dx: NormDx<'a, T>,
    grad_output: &'a [T],
}

impl<T: Real> NormInputGrad<'_, T> {
    /// Writes every image's input gradient into `grad_input` (`[E, B, C, H, W]`), one task per image.
    pub(crate) fn write_all(&self, grad_input: &mut [T]) {
        let shape = self.dx.shape;
        assert_eq!(grad_input.len(), shape.len(), "batch norm activation length");
        if shape.is_empty() {
            return;
        }
        grad_input
            .par_chunks_mut(shape.image())
            .enumerate()
            .for_each(|(i, dx_img)| self.write_image(i, dx_img));
    }

    /// Writes image `i`'s (`e·B + b`) input gradient, `[C, H, W]`, into `dx_img`.
    #[inline]
    pub(crate) fn write_image(&self, i: usize, dx_img: &mut [T]) {
        let shape = &self.dx.shape;
        assert_eq!(dx_img.len(), shape.image(), "one image of the input gradient");
        if shape.plane() == 0 {
            return;
        }
        let dy_img = &self.grad_output[i * shape.image()..(i + 1) * shape.image()];
        let planes = dx_img.chunks_exact_mut(shape.plane()).zip(dy_img.chunks_exact(shape.plane()));
        for (ch, (dx, dy)) in planes.enumerate() {
            self.dx.write_plane(i, ch, dy, dx);
        }
    }
}

/// The parameter half of a batch-norm backward: `dβ = Σ dy` and `dγ = Σ dy·(x − mean) · inv_std` for
/// every (env, channel) `i = e·C + c`, from `sums(e, c, mean) = (Σ dy, Σ dy·(x − mean))`. Overwrites
/// `grad_gamma` and `grad_beta`.
pub(crate) fn batch_norm_param_grads<T: Real>(
    shape: &NormShape,
    save_mean: &[T],
    save_inv_std: &[T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
    sums: impl Fn(usize, usize, T) -> (LaneSums<T>, LaneSums<T>) + Sync,
) {
    for p in [save_mean, save_inv_std, &*grad_gamma, &*grad_beta] {
        assert_eq!(p.len(), shape.params_len(), "batch norm parameter length");
    }
    let c = shape.channels;
    grad_gamma.par_iter_mut().zip(grad_beta.par_iter_mut()).enumerate().for_each(|(i, (d_gamma, d_beta))| {
        let (sum_dy, sum_dy_centered) = sums(i / c, i % c, save_mean[i]);
        *d_beta = sum_dy.total();
        *d_gamma = sum_dy_centered.total() * save_inv_std[i];
    });
}

/// What the input gradient of one (env, channel) needs.
#[derive(Clone, Copy)]
pub(crate) struct DxConsts<T> {
    mean: T,
    inv_std: T,
    scale: T,
    mean_dy: T,
    mean_dy_xhat: T,
}

impl<T: Real> DxConsts<T> {
    /// The constants of (env, channel) `p` over `n = B·H·W` values, from the parameter gradients.
    #[inline(always)]
    pub(crate) fn new(
        gamma: &[T],
        save_mean: &[T],
        save_inv_std: &[T],
        d_gamma: &[T],
        d_beta: &[T],
        n: T,
        p: usize,
    ) -> Self {
        Self {
            mean: save_mean[p],
            inv_std: save_inv_std[p],
            scale: gamma[p] * save_inv_std[p],
            mean_dy: d_beta[p] / n,
            mean_dy_xhat: d_gamma[p] / n,
        }
    }

    /// `dx = γ·inv_std·(dy − dβ/N − x̂·dγ/N)` over one plane, where `dy` counts only where `keep(x)`
    /// (a ReLU after the norm: zero where its output was not positive).
    #[inline(always)]
    pub(crate) fn input_grad(&self, x: &[T], dy: &[T], dx: &mut [T], keep: impl Fn(T) -> bool) {
        for ((dx, &v), &dy) in dx.iter_mut().zip(x).zip(dy) {
            let dy = if keep(v) { dy } else { T::ZERO };
            let x_hat = (v - self.mean) * self.inv_std;
            *dx = self.scale * (dy - self.mean_dy - x_hat * self.mean_dy_xhat);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Group norm
// ---------------------------------------------------------------------------------------------------

fn check_group_norm<T>(
    shape: &NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
) {
    assert!(
        groups >= 1 && shape.channels.is_multiple_of(groups),
        "group norm: {} channels in {groups} groups",
        shape.channels
    );
    assert_eq!(x.len(), shape.len(), "group norm activation length");
    assert_eq!(gamma.len(), shape.params_len(), "group norm parameter length");
    let stats = shape.envs * shape.batch * groups;
    assert_eq!(save_mean.len(), stats, "group norm saved mean length [E, B, G]");
    assert_eq!(save_inv_std.len(), stats, "group norm saved inv_std length [E, B, G]");
}

/// Group norm: per (env, image, group) statistics over `C/G·H·W` values; saves `mean` and
/// `1/sqrt(var + eps)` as `[E, B, G]`. Overwrites `y`, `save_mean`, `save_inv_std`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_forward<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
) {
    group_norm_forward_then(shape, groups, x, gamma, beta, y, save_mean, save_inv_std, |v| v);
}

/// [`group_norm_forward`] followed by ReLU in the same pass: `y = relu(GN(x))`, the same values as
/// [`group_norm_forward`] then [`relu_forward_in_place`](super::relu_forward_in_place).
#[allow(clippy::too_many_arguments)]
pub fn group_norm_relu_forward<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
) {
    group_norm_forward_then(shape, groups, x, gamma, beta, y, save_mean, save_inv_std, relu);
}

#[allow(clippy::too_many_arguments)]
fn group_norm_forward_then<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    beta: &[T],
    y: &mut [T],
    save_mean: &mut [T],
    save_inv_std: &mut [T],
    act: impl Fn(T) -> T + Sync,
) {
    check_group_norm(&shape, groups, x, gamma, save_mean, save_inv_std);
    assert_eq!(beta.len(), shape.params_len(), "group norm parameter length");
    assert_eq!(y.len(), shape.len(), "group norm output length");
    if shape.is_empty() {
        return;
    }
    let c = shape.channels;
    y.par_chunks_mut(shape.image())
        .zip(save_mean.par_chunks_mut(groups))
        .zip(save_inv_std.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(i, ((y_img, means), inv_stds))| {
            let e = i / shape.batch;
            let x_img = &x[i * shape.image()..(i + 1) * shape.image()];
            let (gamma, beta) = (&gamma[e * c..(e + 1) * c], &beta[e * c..(e + 1) * c]);
            group_norm_image_forward(shape.plane(), x_img, gamma, beta, y_img, means, inv_stds, &act);
        });
}

/// One image of [`group_norm_forward`] (then `act`): `x_img` and `y_img` are `[C, plane]`, `gamma` and
/// `beta` the image's env's `[C]`, and `means` / `inv_stds` its `[G]` statistics (G = their length).
/// Callers that already hold an image in cache (a conv's run) normalise it here with the same bits.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn group_norm_image_forward<T: Real>(
    plane: usize,
    x_img: &[T],
    gamma: &[T],
    beta: &[T],
    y_img: &mut [T],
    means: &mut [T],
    inv_stds: &mut [T],
    act: impl Fn(T) -> T,
) {
    let groups = means.len();
    let per_group = gamma.len() / groups;
    let group_len = per_group * plane;
    let n = T::from_usize(group_len);
    let eps = T::from_f64(NORM_EPS);
    for g in 0..groups {
        let (mean, m2) = plane_mean_and_m2(&x_img[g * group_len..(g + 1) * group_len]);
        let inv_std = T::ONE / (m2 / n + eps).sqrt();
        means[g] = mean;
        inv_stds[g] = inv_std;
        for ch in g * per_group..(g + 1) * per_group {
            let range = ch * plane..(ch + 1) * plane;
            let (scale, shift) = (inv_std * gamma[ch], beta[ch]);
            for (out, &v) in y_img[range.clone()].iter_mut().zip(&x_img[range]) {
                *out = act(affine(v, mean, scale, shift));
            }
        }
    }
}

/// Backward of [`group_norm_forward`]. Overwrites `grad_input`, `grad_gamma`, `grad_beta`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    group_norm_backward_impl(
        shape,
        groups,
        x,
        gamma,
        save_mean,
        save_inv_std,
        grad_output,
        grad_input,
        grad_gamma,
        grad_beta,
        false,
    );
}

/// As [`group_norm_backward`], but *adds* the input gradient into `grad_input` (for an input that also
/// feeds a residual path); `grad_gamma` and `grad_beta` are still overwritten.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward_accumulate<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    group_norm_backward_impl(
        shape,
        groups,
        x,
        gamma,
        save_mean,
        save_inv_std,
        grad_output,
        grad_input,
        grad_gamma,
        grad_beta,
        true,
    );
}

/// The ReLU's then [`group_norm_backward`]'s backward in one pass per env: `grad_out` is ∂L/∂y at the ReLU's
/// output `y` (the forward's `relu(GN(x))`); writes ∂L/∂x into `grad_input` and overwrites `grad_gamma`,
/// `grad_beta`. The same bits as [`relu_backward`](super::relu_backward) into a buffer, then
/// [`group_norm_backward`] on it: each image's ReLU-masked gradient lives only in scratch, and the
/// parameter sums run per channel over the env's images in order, as there. One task per env (each
/// reads its activations once instead of four times), so it pays where there are at least as many
/// envs as threads.
#[allow(clippy::too_many_arguments)]
pub fn relu_group_norm_backward<T: Real>(
    shape: NormShape,
    groups: usize,
    y: &[T],
    grad_out: &[T],
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
) {
    check_group_norm(&shape, groups, x, gamma, save_mean, save_inv_std);
    for (len, what) in
        [(y.len(), "ReLU output"), (grad_out.len(), "gradient"), (grad_input.len(), "gradient")]
    {
        assert_eq!(len, shape.len(), "group norm {what} length");
    }
    assert_eq!(grad_gamma.len(), shape.params_len(), "group norm parameter length");
    assert_eq!(grad_beta.len(), shape.params_len(), "group norm parameter length");
    let (c, plane, image) = (shape.channels, shape.plane(), shape.image());
    if shape.is_empty() {
        grad_gamma.fill(T::ZERO);
        grad_beta.fill(T::ZERO);
        return;
    }
    grad_input
        .par_chunks_mut(shape.batch * image)
        .zip(grad_gamma.par_chunks_mut(c))
        .zip(grad_beta.par_chunks_mut(c))
        .enumerate()
        .for_each(|(e, ((dx_env, d_gamma), d_beta))| {
            let gamma = &gamma[e * c..(e + 1) * c];
            T::with_scratch(image + 2 * c * LANES, |scratch| {
                let (dy_img, lanes) = scratch.split_at_mut(image);
                lanes.fill(T::ZERO);
                for (b, dx_img) in dx_env.chunks_exact_mut(image).enumerate() {
                    let i = e * shape.batch + b;
                    let range = i * image..(i + 1) * image;
                    let y_img = &y[range.clone()];
                    for ((d, &v), &g) in dy_img.iter_mut().zip(y_img).zip(&grad_out[range.clone()]) {
                        *d = if v > T::ZERO { g } else { T::ZERO };
                    }
                    let stats = (
                        &save_mean[i * groups..(i + 1) * groups],
                        &save_inv_std[i * groups..(i + 1) * groups],
                    );
                    group_norm_image_backward_carried(plane, gamma, stats, &x[range], dy_img, lanes, dx_img);
                }
                group_norm_param_grads(lanes, d_gamma, d_beta);
            });
        });
}

/// One image of the group norm's backward with its parameter sums carried: `dy_img` the gradient at the
/// norm's output of image `x_img` (the ReLU's mask applied), each channel's sums added to `lanes`
/// (`[c][2][LANES]`: Σ dy, then Σ dy·x̂, zeroed by the caller before the env's first image), and the
/// norm's input gradient written to `dx_img`. `gamma` is the env's, `(means, inv_stds)` the image's.
/// Called image after image in order, then [`group_norm_param_grads`], it gives the bits of
/// [`relu_group_norm_backward`] (which masks with the ReLU's output; the seed units recompute the mask,
/// [`group_norm_relu_mask_image`]).
pub(crate) fn group_norm_image_backward_carried<T: Real>(
    plane: usize,
    gamma: &[T],
    (means, inv_stds): (&[T], &[T]),
    x_img: &[T],
    dy_img: &[T],
    lanes: &mut [T],
    dx_img: &mut [T],
) {
    let c = gamma.len();
    let per_group = c / means.len();
    // The parameter sums, carried across the env's images per channel.
    for ch in 0..c {
        let g = ch / per_group;
        let (mean, inv_std) = (means[g], inv_stds[g]);
        let p = ch * plane..(ch + 1) * plane;
        let (dy, xs) = (&dy_img[p.clone()], &x_img[p]);
        let held = &mut lanes[2 * ch * LANES..2 * (ch + 1) * LANES];
        let (held_dy, held_dy_xhat) = held.split_at_mut(LANES);
        let mut sum_dy = LaneSums { lanes: (&*held_dy).try_into().expect("LANES") };
        let mut sum_dy_xhat = LaneSums { lanes: (&*held_dy_xhat).try_into().expect("LANES") };
        sum_dy.add_map(dy, |d| d);
        sum_dy_xhat.add_zip(dy, xs, |d, v| d * ((v - mean) * inv_std));
        held_dy.copy_from_slice(&sum_dy.lanes);
        held_dy_xhat.copy_from_slice(&sum_dy_xhat.lanes);
    }
    group_norm_image_input_grad(plane, gamma, (means, inv_stds), x_img, dy_img, dx_img, false);
}

/// Zeroes `grad_img` where the ReLU after a group norm of `x_img` (one image; the env's `γ`, `β` and the
/// image's saved statistics) did not pass its input: there the norm's affine, recomputed exactly as the
/// forward computed it, is not positive. So the ReLU's output need not be kept for its backward.
pub(crate) fn group_norm_relu_mask_image<T: Real>(
    plane: usize,
    gamma: &[T],
    beta: &[T],
    (means, inv_stds): (&[T], &[T]),
    x_img: &[T],
    grad_img: &mut [T],
) {
    let per_group = gamma.len() / means.len();
    for ch in 0..gamma.len() {
        let g = ch / per_group;
        let (mean, scale, shift) = (means[g], inv_stds[g] * gamma[ch], beta[ch]);
        let p = ch * plane..(ch + 1) * plane;
        for (d, &v) in grad_img[p.clone()].iter_mut().zip(&x_img[p]) {
            *d = if affine(v, mean, scale, shift) > T::ZERO { *d } else { T::ZERO };
        }
    }
}

/// The env's `dγ`, `dβ` from the parameter sums [`group_norm_image_backward_carried`] carried.
pub(crate) fn group_norm_param_grads<T: Real>(lanes: &[T], d_gamma: &mut [T], d_beta: &mut [T]) {
    for (ch, (d_gamma, d_beta)) in d_gamma.iter_mut().zip(d_beta.iter_mut()).enumerate() {
        let held = &lanes[2 * ch * LANES..2 * (ch + 1) * LANES];
        *d_beta = LaneSums { lanes: held[..LANES].try_into().expect("LANES") }.total();
        *d_gamma = LaneSums { lanes: held[LANES..].try_into().expect("LANES") }.total();
    }
}

#[allow(clippy::too_many_arguments)]
fn group_norm_backward_impl<T: Real>(
    shape: NormShape,
    groups: usize,
    x: &[T],
    gamma: &[T],
    save_mean: &[T],
    save_inv_std: &[T],
    grad_output: &[T],
    grad_input: &mut [T],
    grad_gamma: &mut [T],
    grad_beta: &mut [T],
    accumulate: bool,
) {
    check_group_norm(&shape, groups, x, gamma, save_mean, save_inv_std);
    assert_eq!(grad_output.len(), shape.len(), "group norm gradient length");
    assert_eq!(grad_input.len(), shape.len(), "group norm gradient length");
    assert_eq!(grad_gamma.len(), shape.params_len(), "group norm parameter length");
    assert_eq!(grad_beta.len(), shape.params_len(), "group norm parameter length");
    let per_group = shape.channels / groups;
    let c = shape.channels;

    // Parameter gradients: per (env, channel), over the env's images in order.
    grad_gamma.par_iter_mut().zip(grad_beta.par_iter_mut()).enumerate().for_each(|(i, (d_gamma, d_beta))| {
        let (e, ch) = (i / c, i % c);
        let g = ch / per_group;
        let mut sum_dy = LaneSums::new();
        let mut sum_dy_xhat = LaneSums::new();
        for b in 0..shape.batch {
            let s = (e * shape.batch + b) * groups + g;
            let (mean, inv_std) = (save_mean[s], save_inv_std[s]);
            let dy = shape.plane_of(grad_output, e, b, ch);
            sum_dy.add_map(dy, |d| d);
            sum_dy_xhat.add_zip(dy, shape.plane_of(x, e, b, ch), |d, v| d * ((v - mean) * inv_std));
        }
        *d_beta = sum_dy.total();
        *d_gamma = sum_dy_xhat.total();
    });
    if shape.is_empty() {
        return;
    }

    // Input gradient: per (env, image).
    grad_input.par_chunks_mut(shape.image()).enumerate().for_each(|(i, dx_img)| {
        let e = i / shape.batch;
        let range = i * shape.image()..(i + 1) * shape.image();
        let stats = (&save_mean[i * groups..(i + 1) * groups], &save_inv_std[i * groups..(i + 1) * groups]);
        let gamma = &gamma[e * c..(e + 1) * c];
        group_norm_image_input_grad(
            shape.plane(),
            gamma,
            stats,
            &x[range.clone()],
            &grad_output[range],
            dx_img,
            accumulate,
        );
    });
}

/// One image's input gradient of [`group_norm_backward`]: per group,
/// `dx = inv_std·(dy·γ − mean(dy·γ) − x̂·mean(dy·γ·x̂))`, written or (`accumulate`) added into `dx_img`.
/// `gamma` is the image's env's `[C]`, `(means, inv_stds)` its `[G]` statistics; images are `[C, plane]`.
#[inline(always)]
fn group_norm_image_input_grad<T: Real>(
    plane: usize,
    gamma: &[T],
    (means, inv_stds): (&[T], &[T]),
    x_img: &[T],
    dy_img: &[T],
    dx_img: &mut [T],
    accumulate: bool,
) {
    let groups = means.len();
    let per_group = gamma.len() / groups;
    let n = T::from_usize(per_group * plane);
    for g in 0..groups {
        let (mean, inv_std) = (means[g], inv_stds[g]);
        let channels = g * per_group..(g + 1) * per_group;
        let mut sum_dyg = LaneSums::new();
        let mut sum_dyg_xhat = LaneSums::new();
        for ch in channels.clone() {
            let gam = gamma[ch];
            let p = ch * plane..(ch + 1) * plane;
            sum_dyg.add_map(&dy_img[p.clone()], |d| d * gam);
            sum_dyg_xhat.add_zip(&dy_img[p.clone()], &x_img[p], |d, v| d * gam * ((v - mean) * inv_std));
        }
        let mean_dyg = sum_dyg.total() / n;
        let mean_dyg_xhat = sum_dyg_xhat.total() / n;
        for ch in channels {
            let gam = gamma[ch];
            let p = ch * plane..(ch + 1) * plane;
            for ((dx, &dy), &v) in dx_img[p.clone()].iter_mut().zip(&dy_img[p.clone()]).zip(&x_img[p]) {
                let x_hat = (v - mean) * inv_std;
                let value = inv_std * (dy * gam - mean_dyg - x_hat * mean_dyg_xhat);
                if accumulate {
                    *dx += value;
                } else {
                    *dx = value;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    const SHAPE: NormShape = NormShape { envs: 2, batch: 3, channels: 4, h: 2, w: 3 };

    /// Training forward with throwaway running statistics.
    fn bn_forward(s: NormShape, x: &[f64], gamma: &[f64], beta: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut y = vec![0.0; s.len()];
        let (mut mean, mut inv_std) = (vec![0.0; s.params_len()], vec![0.0; s.params_len()]);
        let (mut rm, mut rv) = (vec![0.0; s.params_len()], vec![1.0; s.params_len()]);
        batch_norm_train_forward(s, x, gamma, beta, &mut y, &mut mean, &mut inv_std, &mut rm, &mut rv);
        (y, mean, inv_std)
    }

    #[test]
    fn batch_norm_gradients_match_finite_differences() {
        let s = SHAPE;
        let x = uniform(1, s.len(), -1.0, 2.0);
        let gamma = uniform(2, s.params_len(), 0.5, 1.5);
        let beta = signed(3, s.params_len());
        let r = signed(4, s.len());
        let (_, mean, inv_std) = bn_forward(s, &x, &gamma, &beta);
        let mut dx = vec![f64::NAN; s.len()];
        let (mut dgamma, mut dbeta) = (vec![f64::NAN; s.params_len()], vec![f64::NAN; s.params_len()]);
        batch_norm_backward(s, &x, &gamma, &mean, &inv_std, &r, &mut dx, &mut dgamma, &mut dbeta);
        let num_dx = numeric_gradient(&x, |xp| project(&r, &bn_forward(s, xp, &gamma, &beta).0));
        let num_dgamma = numeric_gradient(&gamma, |gp| project(&r, &bn_forward(s, &x, gp, &beta).0));
        let num_dbeta = numeric_gradient(&beta, |bp| project(&r, &bn_forward(s, &x, &gamma, bp).0));
        assert_gradient("batch norm dx", &dx, &num_dx);
        assert_gradient("batch norm dgamma", &dgamma, &num_dgamma);
        assert_gradient("batch norm dbeta", &dbeta, &num_dbeta);
    }

    #[test]
    fn batch_norm_statistics_and_running_update_by_hand() {
        // Env 0: channel values {1, 2, 3, 4}; env 1: {2, 2, 2, 6}. B = 2 images of one channel, 1×2.
        let s = NormShape { envs: 2, batch: 2, channels: 1, h: 1, w: 2 };
        let x = [1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 6.0];
        let (gamma, beta) = ([2.0, 1.0], [0.5, 0.0]);
        let mut y = [0.0; 8];
        let (mut mean, mut inv_std) = ([0.0; 2], [0.0; 2]);
        let (mut rm, mut rv) = ([0.0, 1.0], [1.0, 2.0]);
        batch_norm_train_forward(s, &x, &gamma, &beta, &mut y, &mut mean, &mut inv_std, &mut rm, &mut rv);
        // Env 0: mean 2.5, biased var 1.25, unbiased 5/3. Env 1: mean 3, biased var 3, unbiased 4.
        assert_eq!(mean, [2.5, 3.0]);
        assert!((inv_std[0] - 1.0 / (1.25f64 + 1e-5).sqrt()).abs() < 1e-15);
        assert!((inv_std[1] - 1.0 / (3.0f64 + 1e-5).sqrt()).abs() < 1e-15);
        assert!((rm[0] - 0.25).abs() < 1e-15 && (rm[1] - (0.9 + 0.3)).abs() < 1e-15, "{rm:?}");
        assert!((rv[0] - (0.9 + 0.1 * 5.0 / 3.0)).abs() < 1e-15, "{rv:?}");
        assert!((rv[1] - (1.8 + 0.4)).abs() < 1e-15, "{rv:?}");
        assert!((y[0] - (2.0 * (1.0 - 2.5) * inv_std[0] + 0.5)).abs() < 1e-14);
        assert!((y[7] - (6.0 - 3.0) * inv_std[1]).abs() < 1e-14);

        // Eval mode uses the running statistics.
        let mut y_eval = [0.0; 8];
        batch_norm_eval_forward(s, &x, &gamma, &beta, &rm, &rv, &mut y_eval);
        for (i, &v) in x.iter().enumerate() {
            let e = i / 4;
            let expected = gamma[e] * (v - rm[e]) / (rv[e] + 1e-5).sqrt() + beta[e];
            assert!((y_eval[i] - expected).abs() < 1e-14);
        }
    }

    /// Forward (with running stats) and backward of a batch, f32.
    fn bn_f32(s: NormShape, x: &[f32], gamma: &[f32], beta: &[f32], r: &[f32]) -> Vec<Vec<f32>> {
        let mut y = vec![0.0; s.len()];
        let (mut mean, mut inv_std) = (vec![0.0; s.params_len()], vec![0.0; s.params_len()]);
        let (mut rm, mut rv) = (vec![0.1; s.params_len()], vec![0.9; s.params_len()]);
        batch_norm_train_forward(s, x, gamma, beta, &mut y, &mut mean, &mut inv_std, &mut rm, &mut rv);
        let mut dx = vec![0.0; s.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; s.params_len()], vec![0.0; s.params_len()]);
        batch_norm_backward(s, x, gamma, &mean, &inv_std, r, &mut dx, &mut dgamma, &mut dbeta);
        let mut y_eval = vec![0.0; s.len()];
        batch_norm_eval_forward(s, x, gamma, beta, &rm, &rv, &mut y_eval);
        vec![y, mean, inv_std, rm, rv, dx, dgamma, dbeta, y_eval]
    }

    #[test]
    fn batch_norm_env_in_a_batch_equals_env_alone_and_ignores_thread_count() {
        let s = NormShape { envs: 3, batch: 5, channels: 4, h: 6, w: 5 };
        let x = to_f32(&uniform(5, s.len(), -2.0, 3.0));
        let gamma = to_f32(&uniform(6, s.params_len(), 0.5, 1.5));
        let beta = to_f32(&signed(7, s.params_len()));
        let r = to_f32(&signed(8, s.len()));
        let all = bn_f32(s, &x, &gamma, &beta, &r);
        let one = NormShape { envs: 1, ..s };
        for e in 0..s.envs {
            let (a, p) = (one.len(), one.params_len());
            let alone =
                bn_f32(one, &x[e * a..][..a], &gamma[e * p..][..p], &beta[e * p..][..p], &r[e * a..][..a]);
            for (k, (batched, single)) in all.iter().zip(&alone).enumerate() {
                let n = single.len();
                assert_eq!(bits(&batched[e * n..][..n]), bits(single), "output {k}, env {e}");
            }
        }
        let threads1 = with_threads(1, || bn_f32(s, &x, &gamma, &beta, &r));
        let threads2 = with_threads(2, || bn_f32(s, &x, &gamma, &beta, &r));
        for (a, b) in threads1.iter().zip(&threads2) {
            assert_eq!(bits(a), bits(b));
        }
    }

    fn gn_forward(s: NormShape, groups: usize, x: &[f64], gamma: &[f64], beta: &[f64]) -> [Vec<f64>; 3] {
        let mut y = vec![0.0; s.len()];
        let stats = s.envs * s.batch * groups;
        let (mut mean, mut inv_std) = (vec![0.0; stats], vec![0.0; stats]);
        group_norm_forward(s, groups, x, gamma, beta, &mut y, &mut mean, &mut inv_std);
        [y, mean, inv_std]
    }

    #[test]
    fn group_norm_gradients_match_finite_differences() {
        let s = SHAPE;
        for groups in [1, 2, 4] {
            let x = uniform(10 + groups as u64, s.len(), -1.0, 2.0);
            let gamma = uniform(20, s.params_len(), 0.5, 1.5);
            let beta = signed(21, s.params_len());
            let r = signed(22, s.len());
            let [_, mean, inv_std] = gn_forward(s, groups, &x, &gamma, &beta);
            let mut dx = vec![f64::NAN; s.len()];
            let (mut dgamma, mut dbeta) = (vec![f64::NAN; s.params_len()], vec![f64::NAN; s.params_len()]);
            group_norm_backward(s, groups, &x, &gamma, &mean, &inv_std, &r, &mut dx, &mut dgamma, &mut dbeta);
            let num_dx = numeric_gradient(&x, |xp| project(&r, &gn_forward(s, groups, xp, &gamma, &beta)[0]));
            let num_dgamma =
                numeric_gradient(&gamma, |gp| project(&r, &gn_forward(s, groups, &x, gp, &beta)[0]));
            let num_dbeta =
                numeric_gradient(&beta, |bp| project(&r, &gn_forward(s, groups, &x, &gamma, bp)[0]));
            assert_gradient(&format!("group norm dx, G={groups}"), &dx, &num_dx);
            assert_gradient(&format!("group norm dgamma, G={groups}"), &dgamma, &num_dgamma);
            assert_gradient(&format!("group norm dbeta, G={groups}"), &dbeta, &num_dbeta);

            let prior = signed(23, s.len());
            let mut acc = prior.clone();
            let (mut dgamma2, mut dbeta2) = (vec![0.0; s.params_len()], vec![0.0; s.params_len()]);
            group_norm_backward_accumulate(
                s,
                groups,
                &x,
                &gamma,
                &mean,
                &inv_std,
                &r,
                &mut acc,
                &mut dgamma2,
                &mut dbeta2,
            );
            for i in 0..acc.len() {
                assert_eq!(acc[i], prior[i] + dx[i]);
            }
            assert_eq!(dgamma2, dgamma);
        }
    }

    #[test]
    fn group_norm_of_zeros_is_beta() {
        // The bottleneck seed is an identity at birth because GN of an all-zero input is β.
        let s = SHAPE;
        let gamma = vec![1.0; s.params_len()];
        let beta = signed(30, s.params_len());
        let [y, _, _] = gn_forward(s, 2, &vec![0.0; s.len()], &gamma, &beta);
        for (i, &v) in y.iter().enumerate() {
            let (e, c) = (i / (s.batch * s.image()), (i / s.plane()) % s.channels);
            assert_eq!(v, beta[e * s.channels + c]);
        }
    }

    fn gn_f32(
        s: NormShape,
        groups: usize,
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        r: &[f32],
    ) -> Vec<Vec<f32>> {
        let mut y = vec![0.0; s.len()];
        let stats = s.envs * s.batch * groups;
        let (mut mean, mut inv_std) = (vec![0.0; stats], vec![0.0; stats]);
        group_norm_forward(s, groups, x, gamma, beta, &mut y, &mut mean, &mut inv_std);
        let mut dx = vec![0.0; s.len()];
        let (mut dgamma, mut dbeta) = (vec![0.0; s.params_len()], vec![0.0; s.params_len()]);
        group_norm_backward(s, groups, x, gamma, &mean, &inv_std, r, &mut dx, &mut dgamma, &mut dbeta);
        vec![y, mean, inv_std, dx, dgamma, dbeta]
    }

    #[test]
    fn group_norm_env_in_a_batch_equals_env_alone_and_ignores_thread_count() {
        let s = NormShape { envs: 3, batch: 4, channels: 8, h: 5, w: 7 };
        let x = to_f32(&uniform(40, s.len(), -2.0, 3.0));
        let gamma = to_f32(&uniform(41, s.params_len(), 0.5, 1.5));
        let beta = to_f32(&signed(42, s.params_len()));
        let r = to_f32(&signed(43, s.len()));
        let all = gn_f32(s, 2, &x, &gamma, &beta, &r);
        let one = NormShape { envs: 1, ..s };
        for e in 0..s.envs {
            let (a, p) = (one.len(), one.params_len());
            let alone =
                gn_f32(one, 2, &x[e * a..][..a], &gamma[e * p..][..p], &beta[e * p..][..p], &r[e * a..][..a]);
            for (k, (batched, single)) in all.iter().zip(&alone).enumerate() {
                let n = single.len();
                assert_eq!(bits(&batched[e * n..][..n]), bits(single), "output {k}, env {e}");
            }
        }
        let t1 = with_threads(1, || gn_f32(s, 2, &x, &gamma, &beta, &r));
        let t2 = with_threads(2, || gn_f32(s, 2, &x, &gamma, &beta, &r));
        for (a, b) in t1.iter().zip(&t2) {
            assert_eq!(bits(a), bits(b));
        }
    }

    /// The fused form equals group norm followed by a separate ReLU pass, bit for bit, on values that the
    /// norm sends both ways (about half the outputs are negative and must become 0).
    #[test]
    fn group_norm_relu_forward_is_group_norm_then_relu() {
        let s = NormShape { envs: 2, batch: 3, channels: 8, h: 5, w: 7 };
        let x = to_f32(&uniform(50, s.len(), -2.0, 3.0));
        let gamma = to_f32(&uniform(51, s.params_len(), 0.5, 1.5));
        let beta = to_f32(&signed(52, s.params_len()));
        let stats = s.envs * s.batch * 2;
        let (mut plain, mut fused) = (vec![0.0f32; s.len()], vec![0.0f32; s.len()]);
        let (mut m1, mut v1, mut m2, mut v2) =
            (vec![0.0f32; stats], vec![0.0f32; stats], vec![0.0f32; stats], vec![0.0f32; stats]);
        group_norm_forward(s, 2, &x, &gamma, &beta, &mut plain, &mut m1, &mut v1);
        let negative = plain.iter().filter(|v| **v < 0.0).count();
        assert!(negative > s.len() / 4 && negative < 3 * s.len() / 4, "{negative} negative of {}", s.len());
        crate::ops::relu_forward_in_place(&mut plain);
        group_norm_relu_forward(s, 2, &x, &gamma, &beta, &mut fused, &mut m2, &mut v2);
        assert_eq!(bits(&plain), bits(&fused));
        assert_eq!((bits(&m1), bits(&v1)), (bits(&m2), bits(&v2)));
    }

    /// The one-pass backward equals ReLU backward then group-norm backward, bit for bit, on planes whose
    /// length is not a multiple of the lane count (5×7), with two channels per group, a ReLU output that
    /// is zero about half the time, and 1 or 2 threads.
    #[test]
    fn relu_group_norm_backward_is_relu_backward_then_group_norm_backward() {
        let s = NormShape { envs: 3, batch: 4, channels: 8, h: 5, w: 7 };
        let x = to_f32(&uniform(60, s.len(), -2.0, 3.0));
        let gamma = to_f32(&uniform(61, s.params_len(), 0.5, 1.5));
        let beta = to_f32(&signed(62, s.params_len()));
        let dy = to_f32(&signed(63, s.len()));
        let stats = s.envs * s.batch * 4;
        let (mut y, mut mean, mut inv_std) =
            (vec![0.0f32; s.len()], vec![0.0f32; stats], vec![0.0f32; stats]);
        group_norm_relu_forward(s, 4, &x, &gamma, &beta, &mut y, &mut mean, &mut inv_std);
        let zeros = y.iter().filter(|v| **v == 0.0).count();
        assert!(zeros > s.len() / 4 && zeros < 3 * s.len() / 4, "{zeros} zeros of {}", s.len());
        let mut masked = vec![0.0f32; s.len()];
        crate::ops::relu_backward(&y, &dy, &mut masked);
        let mut expected =
            [vec![0.0f32; s.len()], vec![0.0f32; s.params_len()], vec![0.0f32; s.params_len()]];
        let [dx, dgamma, dbeta] = &mut expected;
        group_norm_backward(s, 4, &x, &gamma, &mean, &inv_std, &masked, dx, dgamma, dbeta);
        assert!(dgamma.iter().chain(dbeta.iter()).all(|v| *v != 0.0), "every parameter gets a gradient");
        for threads in [1, 2] {
            let got = with_threads(threads, || {
                let mut got =
                    [vec![f32::NAN; s.len()], vec![f32::NAN; s.params_len()], vec![f32::NAN; s.params_len()]];
                let [dx, dgamma, dbeta] = &mut got;
                relu_group_norm_backward(s, 4, &y, &dy, &x, &gamma, &mean, &inv_std, dx, dgamma, dbeta);
                got
            });
            for (k, (a, b)) in expected.iter().zip(&got).enumerate() {
                assert_eq!(bits(a), bits(b), "output {k} with {threads} threads");
            }
        }
    }
}
