//! Typed launchers for the kernels the composed modules use: each names its kernel and takes the
//! kernel's arguments in the kernel's order, so a composition reads as the CPU code it mirrors and an
//! argument list is written once.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchArgs, LaunchConfig, PushKernelArg};

use crate::ops::{LinearShape, NormShape};
use crate::optim::{MAX_GRAD_NORM, SgdConfig};

use super::parity::{Device, NULL, ParityError, blocks_of_256, elementwise, push_dims, push_optional};

type R = Result<(), ParityError>;

/// A group norm: the CPU's `(NormShape, groups)` pair, statistics over `groups` channel groups per
/// image.
#[derive(Clone, Copy, Debug)]
pub struct GroupNorm {
    pub shape: NormShape,
    pub groups: usize,
}

impl GroupNorm {
    /// The group-norm kernels' shape arguments: envs, batch, channels, plane, groups.
    fn args(&self) -> [u32; 5] {
        let s = &self.shape;
        [s.envs, s.batch, s.channels, s.h * s.w, self.groups].map(|d| d as u32)
    }
}

/// `LinearShape`'s fields as the linear kernels take them: envs, batch, n_in, n_out.
fn linear_args(d: &LinearShape) -> [u32; 4] {
    [d.envs, d.batch, d.in_features, d.out_features].map(|v| v as u32)
}

/// An element-wise kernel `(x, y, n)` over the first `n` values of `x` in place (the kernels read and
/// write each element in one thread, so the same pointer twice is safe).
fn in_place(device: &Device, kernel: &str, x: &mut CudaSlice<f32>, n: usize) -> R {
    let n64 = n as u64;
    let view = x.slice(..n);
    let mut launch = device.stream.launch_builder(device.function(kernel));
    launch.arg(&view).arg(&view).arg(&n64);
    unsafe { launch.launch(elementwise(n)) }?;
    Ok(())
}

/// An element-wise kernel `(a, b, out, n)` of two inputs: an activation's backward from its output
/// and the output gradient, or a sum.
fn binary(
    device: &Device,
    kernel: &str,
    a: &CudaSlice<f32>,
    b: &CudaSlice<f32>,
    out: &mut CudaSlice<f32>,
    n: usize,
) -> R {
    let n64 = n as u64;
    let mut launch = device.stream.launch_builder(device.function(kernel));
    launch.arg(a).arg(b).arg(out).arg(&n64);
    unsafe { launch.launch(elementwise(n)) }?;
    Ok(())
}

/// `x = max(x, 0)` over the first `n` values.
pub fn relu_in_place(device: &Device, x: &mut CudaSlice<f32>, n: usize) -> R {
    in_place(device, "relu_forward_f32", x, n)
}

/// `dx = dy·[y > 0]` with `y` the ReLU's output (or its input: the same mask but for NaN).
pub fn relu_backward(
    device: &Device,
    y: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
    n: usize,
) -> R {
    binary(device, "relu_backward_f32", y, dy, dx, n)
}

/// Blocks batch norm's reductions aim for: about two waves of an H100 (132 SMs, eight 256-thread blocks
/// each), whatever the number of (env, channel) pairs.
const BN_TARGET_BLOCKS: usize = 2048;
/// The fewest values a run of a batch-norm reduction sums, and the most runs a pair is cut into.
const BN_MIN_RUN: usize = 2048;
const BN_MAX_SPLITS: usize = 64;

/// How batch norm's reductions over `d` cut each (env, channel)'s `B·H·W` values: (runs, values per
/// run), every run non-empty. Enough runs for about [`BN_TARGET_BLOCKS`] blocks, each at least
/// [`BN_MIN_RUN`] values, at most [`BN_MAX_SPLITS`].
pub fn batch_norm_splits(d: &NormShape) -> (usize, usize) {
    let count = (d.batch * d.plane()).max(1);
    let most = (count / BN_MIN_RUN).clamp(1, BN_MAX_SPLITS);
    let splits = BN_TARGET_BLOCKS.div_ceil(d.params_len().max(1)).clamp(1, most);
    let run = count.div_ceil(splits);
    (count.div_ceil(run), run)
}

/// The partial sums batch norm's reductions over `d` write: two per run of each (env, channel).
pub fn batch_norm_partial_len(d: &NormShape) -> usize {
    d.params_len() * batch_norm_splits(d).0 * 2
}

/// `d`'s shape arguments and grid for a split reduction: `[batch, channels, plane, splits, run]`.
fn batch_norm_reduction(d: &NormShape, partial: &CudaSlice<f64>) -> ([u32; 5], LaunchConfig) {
    let (splits, run) = batch_norm_splits(d);
    assert!(partial.len() >= batch_norm_partial_len(d), "batch norm: partial sums exceed the scratch");
    let count = d.batch * d.plane();
    assert!(count > 1, "batch norm needs more than one value per channel");
    assert!(count <= u32::MAX as usize, "batch norm: a channel's values exceed u32");
    let config = blocks_of_256((d.params_len() as u32, splits as u32, 1));
    ([d.batch, d.channels, d.plane(), splits, run].map(|v| v as u32), config)
}

/// Batch norm's training statistics of `x` (`[E, B, C, H, W]`): `save_mean`, `save_inv_std` and the
/// running statistics updated in place, per (env, channel) — the twin of
/// `ops::norm::batch_norm_train_forward`'s statistics. Runs of each pair's values summed by
/// `batch_norm_stats_partial_f32` into `partial` ([`batch_norm_partial_len`]), then added in order.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_train_stats(
    device: &Device,
    d: &NormShape,
    x: &CudaSlice<f32>,
    partial: &mut CudaSlice<f64>,
    save_mean: &mut CudaSlice<f32>,
    save_inv_std: &mut CudaSlice<f32>,
    running_mean: &mut CudaSlice<f32>,
    running_var: &mut CudaSlice<f32>,
) -> R {
    let (dims, config) = batch_norm_reduction(d, partial);
    let [batch, channels, plane, splits, _] = dims;
    let mut launch = device.stream.launch_builder(device.function("batch_norm_stats_partial_f32"));
    launch.arg(x).arg(&mut *partial);
    push_dims(&mut launch, &dims);
    unsafe { launch.launch(config) }?;
    let pairs = d.params_len() as u32;
    let mut launch = device.stream.launch_builder(device.function("batch_norm_stats_finish_f32"));
    launch.arg(x).arg(&*partial).arg(save_mean).arg(save_inv_std).arg(running_mean).arg(running_var);
    launch.arg(&pairs).arg(&batch).arg(&channels).arg(&plane).arg(&splits);
    unsafe { launch.launch(elementwise(d.params_len())) }?;
    Ok(())
}

/// The block size of `batch_norm_stats_finish_runs_f32` (`FINISH_LANES` in batchnorm.cu).
const FINISH_LANES: u32 = 32;

/// Batch norm's training statistics (as [`batch_norm_train_stats`]) from the sums a tensor-core
/// convolution's epilogue wrote (`GemmConv::forward_with_stats`): `runs` runs of `(shift, Σ d, Σ d²)` per
/// (env, channel), run r over images `r·per_run ..`, combined in a fixed order in double
/// (`batch_norm_stats_finish_runs_f32`: a block of 32 threads per (env, channel)).
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_stats_finish_runs(
    device: &Device,
    d: &NormShape,
    stats: &CudaSlice<f64>,
    runs: usize,
    per_run: usize,
    save_mean: &mut CudaSlice<f32>,
    save_inv_std: &mut CudaSlice<f32>,
    running_mean: &mut CudaSlice<f32>,
    running_var: &mut CudaSlice<f32>,
) -> R {
    assert!(stats.len() >= d.params_len() * runs * 3, "batch norm: run statistics exceed their buffer");
    assert!(
        runs >= 1 && (runs - 1) * per_run < d.batch && runs * per_run >= d.batch,
        "batch norm: runs do not cover the batch"
    );
    assert!(d.batch * d.plane() > 1, "batch norm needs more than one value per channel");
    let dims = [d.params_len(), runs, d.batch, per_run, d.plane()].map(|v| v as u32);
    let mut launch = device.stream.launch_builder(device.function("batch_norm_stats_finish_runs_f32"));
    launch.arg(stats).arg(save_mean).arg(save_inv_std).arg(running_mean).arg(running_var);
    push_dims(&mut launch, &dims);
    let pairs = u32::try_from(d.params_len()).expect("batch norm pairs exceed a grid");
    let config =
        LaunchConfig { grid_dim: (pairs, 1, 1), block_dim: (FINISH_LANES, 1, 1), shared_mem_bytes: 0 };
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// Batch norm's parameter gradients (overwritten): `dβ = Σ dy`, `dγ = Σ dy·(x − mean)·inv_std` per (env,
/// channel), the twin of `ops::norm::batch_norm_backward`'s (dγ, dβ); split as
/// [`batch_norm_train_stats`].
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward_params(
    device: &Device,
    d: &NormShape,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    save_mean: &CudaSlice<f32>,
    save_inv_std: &CudaSlice<f32>,
    partial: &mut CudaSlice<f64>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
) -> R {
    let (dims, config) = batch_norm_reduction(d, partial);
    let splits = dims[3];
    let mut launch = device.stream.launch_builder(device.function("batch_norm_backward_params_partial_f32"));
    launch.arg(x).arg(dy).arg(save_mean).arg(&mut *partial);
    push_dims(&mut launch, &dims);
    unsafe { launch.launch(config) }?;
    batch_norm_params_finish(
        device,
        d,
        partial,
        save_mean,
        save_inv_std,
        None,
        grad_gamma,
        grad_beta,
        splits,
        None,
    )
}

/// An r0 slot's per-env modes and amplitudes (`DeviceSlot`'s), where batch norm's backward reads the
/// pool's gradient before the slot and recomputes the host's gradient the slot's split leaves
/// unwritten: `dy·(1 − a)` for an ADD env, `dy` for an OFF or INCUBATOR one (`slot_host_factor` in
/// common.cuh; a slot with MULTIPLY or GATE seeds writes it instead).
#[derive(Clone, Copy)]
pub struct SlotFactor<'a> {
    pub mode: &'a CudaSlice<u8>,
    pub alpha: &'a CudaSlice<f32>,
}

/// Appends a batch-norm kernel's `slot_mode, slot_alpha` arguments: `slot`'s, or two nulls.
fn push_slot<'a>(launch: &mut LaunchArgs<'a>, slot: Option<SlotFactor<'a>>) {
    match slot {
        Some(SlotFactor { mode, alpha }) => launch.arg(mode).arg(alpha),
        None => launch.arg(&NULL).arg(&NULL),
    };
}

/// dγ, dβ (overwritten) from the runs' sums in `partial`, added in order; with `coef`, also each
/// (env, channel)'s coefficients of the input gradient (`[pairs, BN_COEF]`, see
/// [`batch_norm_backward_input_from`]) from `save_mean`, `save_inv_std`, `gamma`, `beta` and `slot`.
#[allow(clippy::too_many_arguments)]
fn batch_norm_params_finish(
    device: &Device,
    d: &NormShape,
    partial: &CudaSlice<f64>,
    save_mean: &CudaSlice<f32>,
    save_inv_std: &CudaSlice<f32>,
    norm_params: Option<(&CudaSlice<f32>, &CudaSlice<f32>, &mut CudaSlice<f32>)>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
    splits: u32,
    slot: Option<SlotFactor<'_>>,
) -> R {
    let pairs = d.params_len() as u32;
    let (count, channels) = ((d.batch * d.plane()) as u64, d.channels as u32);
    let mut launch = device.stream.launch_builder(device.function("batch_norm_backward_params_finish_f32"));
    launch.arg(partial).arg(save_mean).arg(save_inv_std);
    match norm_params {
        Some((gamma, beta, coef)) => {
            assert!(coef.len() >= d.params_len() * BN_COEF, "batch norm: coefficients exceed their buffer");
            launch.arg(gamma).arg(beta).arg(grad_gamma).arg(grad_beta).arg(coef);
        }
        None => {
            launch.arg(&NULL).arg(&NULL).arg(grad_gamma).arg(grad_beta).arg(&NULL);
        }
    }
    launch.arg(&pairs).arg(&splits).arg(&count);
    push_slot(&mut launch, slot);
    launch.arg(&channels);
    unsafe { launch.launch(elementwise(d.params_len())) }?;
    Ok(())
}

/// Floats per (env, channel) of batch norm's input-gradient coefficients (common.cuh's `BN_COEF`).
pub const BN_COEF: usize = 8;

/// The ReLU's backward — with `argmax` the 2×2 max-pool's before it — and batch norm's parameter
/// gradients (overwritten) in one pass, where a ReLU follows the norm at once (every host block; the
/// pool too when no seed sits at the block's r0 slot): batch norm's output gradient is recomputed
/// from `dy` (the pool's output gradient with `argmax`, else the ReLU's) and the norm's input `x`, the
/// ReLU's mask as the training forward computed it, and summed into `dγ`, `dβ` in the same runs as
/// [`batch_norm_backward_params`] (`relu_bn_backward_partial_f32`) — the same bits as the backwards one
/// by one, without the ReLU's output or that gradient ever written. `coef` (`[E·C, BN_COEF]`) gets what
/// [`batch_norm_backward_input_from`] needs. `d` is the block's norm shape (the pool's input). With
/// `slot` (and `argmax`), the pool's gradient reached the block through an r0 slot's split that left
/// the host's gradient unwritten: each env's factor on it ([`SlotFactor`]) is applied here and, through
/// `coef`, by the input gradient.
#[allow(clippy::too_many_arguments)]
pub fn relu_batch_norm_backward_params(
    device: &Device,
    d: &NormShape,
    dy: &CudaSlice<f32>,
    argmax: Option<&CudaSlice<u8>>,
    slot: Option<SlotFactor<'_>>,
    x: &CudaSlice<f32>,
    save_mean: &CudaSlice<f32>,
    save_inv_std: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    beta: &CudaSlice<f32>,
    partial: &mut CudaSlice<f64>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
    coef: &mut CudaSlice<f32>,
) -> R {
    let (dims, config) = batch_norm_reduction(d, partial);
    let [batch, channels, _, splits, run] = dims;
    let (h, w, pooled) = (d.h as u32, d.w as u32, i32::from(argmax.is_some()));
    check_grad_source(d, dy, argmax);
    let mut launch = device.stream.launch_builder(device.function("relu_bn_backward_partial_f32"));
    launch.arg(dy);
    push_optional(&mut launch, argmax);
    launch.arg(x).arg(save_mean).arg(save_inv_std).arg(gamma).arg(beta).arg(&mut *partial);
    launch.arg(&batch).arg(&channels).arg(&h).arg(&w).arg(&splits).arg(&run).arg(&pooled);
    assert!(slot.is_none() || argmax.is_some(), "a slot's host gradient is recomputed from the pool's");
    push_slot(&mut launch, slot);
    unsafe { launch.launch(config) }?;
    let norm_params = Some((gamma, beta, coef));
    batch_norm_params_finish(
        device,
        d,
        partial,
        save_mean,
        save_inv_std,
        norm_params,
        grad_gamma,
        grad_beta,
        splits,
        slot,
    )
}

/// Batch norm's input gradient `dx` (overwritten; `[E, B, C, H, W]`) after
/// [`relu_batch_norm_backward_params`] on the same `dy`, `argmax` and `x`: the norm's output gradient
/// recomputed as there, then `γ·inv_std·(g − dβ/N − x̂·dγ/N)` from `coef`
/// (`batch_norm_backward_input_from_f32`) — the same bits as `batch_norm_backward_input_f32` on the
/// gradient the pool's and the ReLU's backwards would have written.
pub fn batch_norm_backward_input_from(
    device: &Device,
    d: &NormShape,
    dy: &CudaSlice<f32>,
    argmax: Option<&CudaSlice<u8>>,
    x: &CudaSlice<f32>,
    coef: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
) -> R {
    check_grad_source(d, dy, argmax);
    assert!(x.len() >= d.len() && dx.len() >= d.len(), "batch norm: the input exceeds its buffers");
    assert!(coef.len() >= d.params_len() * BN_COEF, "batch norm: coefficients exceed their buffer");
    let dims = [d.envs, d.batch, d.channels, d.h, d.w].map(|v| v as u32);
    let pooled = i32::from(argmax.is_some());
    let mut launch = device.stream.launch_builder(device.function("batch_norm_backward_input_from_f32"));
    launch.arg(dy);
    push_optional(&mut launch, argmax);
    launch.arg(x).arg(coef).arg(dx);
    push_dims(&mut launch, &dims);
    launch.arg(&pooled);
    unsafe { launch.launch(elementwise(d.len())) }?;
    Ok(())
}

/// The gradient a fused batch-norm backward reads covers `d`: the pool's output with `argmax`, else the
/// norm's own shape.
pub(super) fn check_grad_source(d: &NormShape, dy: &CudaSlice<f32>, argmax: Option<&CudaSlice<u8>>) {
    match argmax {
        Some(argmax) => {
            let windows = d.envs * d.batch * d.channels * (d.h / 2) * (d.w / 2);
            assert!(
                dy.len() >= windows && argmax.len() >= windows,
                "the pool's gradient exceeds its buffers"
            );
        }
        None => assert!(dy.len() >= d.len(), "the ReLU's gradient exceeds its buffer"),
    }
}

/// What [`group_norm_forward`] writes at `y`, from the norm's output `n` (`GN_*` in seeds.cu): `n`
/// itself, `relu(n)` (conv_heavy's inner `relu(GN(conv))`), `residual + relu(n)` (a seed's
/// `x + relu(GN(…))`) or `residual + n` (the bottleneck's `GN(…) + x`). Each is the same bits as the
/// norm written and then the ReLU (`relu_forward_f32`'s) and the add over it, one write and one read of the
/// activation fewer; the backward recomputes the ReLU's mask from the norm's input
/// ([`group_norm_backward_input`]'s `relu_mask`).
#[derive(Clone, Copy)]
pub enum GroupNormOut<'a> {
    Norm,
    Relu,
    AddRelu(&'a CudaSlice<f32>),
    Add(&'a CudaSlice<f32>),
}

impl GroupNormOut<'_> {
    /// The kernels' `epilogue` argument (`GN_PLAIN`, `GN_RELU`, `GN_ADD_RELU`, `GN_ADD`).
    fn code(self) -> i32 {
        match self {
            Self::Norm => 0,
            Self::Relu => 1,
            Self::AddRelu(_) => 2,
            Self::Add(_) => 3,
        }
    }
}

/// Group norm forward with the statistics saved (`[E, B, G]` each), `out` written at `y`.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_forward(
    device: &Device,
    d: &GroupNorm,
    x: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    beta: &CudaSlice<f32>,
    out: GroupNormOut<'_>,
    y: &mut CudaSlice<f32>,
    mean: &mut CudaSlice<f32>,
    inv_std: &mut CudaSlice<f32>,
) -> R {
    let args = d.args();
    let pairs = d.shape.envs * d.shape.batch * d.groups;
    let staged = group_norm_runs_staged(d);
    let name = if staged { "group_norm_forward_staged_f32" } else { "group_norm_forward_f32" };
    // Without a residual the kernel reads none: any pointer stands in.
    let residual = match out {
        GroupNormOut::AddRelu(r) | GroupNormOut::Add(r) => {
            assert!(r.len() >= d.shape.len(), "the residual is shorter than the norm's output");
            r
        }
        GroupNormOut::Norm | GroupNormOut::Relu => x,
    };
    let epilogue = out.code();
    let mut launch = device.stream.launch_builder(device.function(name));
    launch.arg(x).arg(gamma).arg(beta).arg(residual).arg(&epilogue).arg(y).arg(mean).arg(inv_std);
    for a in &args {
        launch.arg(a);
    }
    // Eight threads per (image, group): one per lane of the CPU's sums; staged, GN_STAGED_PAIRS pairs a block.
    let config = if staged { staged_pairs(pairs, GN_STAGED_PAIRS) } else { elementwise(pairs * 8) };
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// The (image, group) pairs a block of `group_norm_forward_staged_f32` and of
/// `group_norm_backward_input_staged_f32` take, and the longest group they copy into shared memory
/// (`GN_STAGED_PAIRS`, `GN_STAGED_BACK_PAIRS`, `GN_STAGED_LEN` in seeds.cu).
const GN_STAGED_PAIRS: usize = 8;
const GN_STAGED_BACK_PAIRS: usize = 4;
const GN_STAGED_LEN: usize = 1024;

/// Whether the staged group-norm kernels take `d`: groups of at most [`GN_STAGED_LEN`] values, a
/// multiple of 4 (its 16-byte copies).
fn group_norm_staged(d: &GroupNorm) -> bool {
    // The kernels find pair t's group at t·group_len: whole groups of channels.
    debug_assert!(
        d.shape.channels.is_multiple_of(d.groups),
        "{} channels in {} groups",
        d.shape.channels,
        d.groups
    );
    let len = d.shape.channels / d.groups * d.shape.h * d.shape.w;
    len <= GN_STAGED_LEN && len.is_multiple_of(4)
}

/// Whether [`group_norm_forward`] and [`group_norm_backward_input`] run `d` on their staged kernels
/// (`group_norm_*_staged_f32`): where they take the shape, unless `ESPER_CUDA_GN_STAGED=0`.
pub(super) fn group_norm_runs_staged(d: &GroupNorm) -> bool {
    group_norm_staged(d) && *GROUP_NORM_STAGED
}

/// Group norm's forward and input gradient through their staged kernels where they take the shape (the
/// same bits as `group_norm_forward_f32` and `group_norm_backward_input_f32`, a group's x read once
/// instead of three times, its dy and x once instead of three and two times); `ESPER_CUDA_GN_STAGED=0`
/// runs the unstaged kernels everywhere, to measure the two on one machine.
static GROUP_NORM_STAGED: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("ESPER_CUDA_GN_STAGED").map_or(true, |v| v != "0"));

/// Group norm's parameter gradients (overwritten) from the gradient `dy` at its output: f64 block sums
/// (`group_norm_backward_params_fast_f32`, to 1e-5 of the CPU's lane sums).
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward_params(
    device: &Device,
    d: &GroupNorm,
    x: &CudaSlice<f32>,
    mean: &CudaSlice<f32>,
    inv_std: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
) -> R {
    let args = d.args();
    // One block per (env, channel) (the one-thread-per-channel twin is far too slow at B·H·W values).
    let mut launch = device.stream.launch_builder(device.function("group_norm_backward_params_fast_f32"));
    launch.arg(x).arg(mean).arg(inv_std).arg(dy).arg(grad_gamma).arg(grad_beta);
    for a in &args {
        launch.arg(a);
    }
    let per_channel = LaunchConfig {
        grid_dim: ((d.shape.envs * d.shape.channels) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(per_channel) }?;
    Ok(())
}

/// A group norm's forward as its backward reads it: the input `x`, the affine parameters and the
/// saved statistics.
#[derive(Clone, Copy)]
pub struct GroupNormSaved<'a> {
    pub x: &'a CudaSlice<f32>,
    pub gamma: &'a CudaSlice<f32>,
    pub beta: &'a CudaSlice<f32>,
    pub mean: &'a CudaSlice<f32>,
    pub inv_std: &'a CudaSlice<f32>,
}

/// The length of [`group_norm_backward_input`]'s parameter partials for `d`: two f64 per (image,
/// channel).
pub fn group_norm_partials_len(d: &GroupNorm) -> usize {
    2 * d.shape.envs * d.shape.batch * d.shape.channels
}

/// Group norm's input gradient (overwritten, or added with `accumulate`) from `dy`: the gradient at
/// the norm's output, or with `relu_mask` at its ReLU's (the forward's [`GroupNormOut::Relu`] and
/// [`GroupNormOut::AddRelu`]; the mask recomputed from `x`: the same bits as `relu_backward` over the
/// norm's output first). With `partials` ([`group_norm_partials_len`] f64), also each (image,
/// channel)'s sums for the parameter gradients, which [`group_norm_backward_params_finish`] adds up.
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward_input(
    device: &Device,
    d: &GroupNorm,
    saved: GroupNormSaved<'_>,
    dy: &CudaSlice<f32>,
    relu_mask: bool,
    dx: &mut CudaSlice<f32>,
    accumulate: bool,
    partials: Option<&mut CudaSlice<f64>>,
) -> R {
    let args = d.args();
    let (accumulate, relu_mask) = (i32::from(accumulate), i32::from(relu_mask));
    let pairs = d.shape.envs * d.shape.batch * d.groups;
    let staged = group_norm_runs_staged(d);
    let name = if staged { "group_norm_backward_input_staged_f32" } else { "group_norm_backward_input_f32" };
    let GroupNormSaved { x, gamma, beta, mean, inv_std } = saved;
    let mut launch = device.stream.launch_builder(device.function(name));
    launch.arg(x).arg(gamma).arg(beta).arg(mean).arg(inv_std).arg(dy).arg(dx);
    match partials {
        Some(partials) => {
            assert!(
                partials.len() >= group_norm_partials_len(d),
                "group norm's partials buffer is too short"
            );
            launch.arg(partials)
        }
        None => launch.arg(&NULL),
    };
    for a in &args {
        launch.arg(a);
    }
    launch.arg(&accumulate).arg(&relu_mask);
    // Eight threads per (image, group): one per lane of the CPU's sums; staged, GN_STAGED_BACK_PAIRS a block.
    let config = if staged { staged_pairs(pairs, GN_STAGED_BACK_PAIRS) } else { elementwise(pairs * 8) };
    unsafe { launch.launch(config) }?;
    Ok(())
}

/// Group norm's parameter gradients (overwritten) from [`group_norm_backward_input`]'s `partials`:
/// f64 sums over the images, a block per (env, channel) (`group_norm_backward_params_finish_f32`; to
/// 1e-5 of the CPU's lane sums, as [`group_norm_backward_params`]).
pub fn group_norm_backward_params_finish(
    device: &Device,
    d: &GroupNorm,
    partials: &CudaSlice<f64>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
) -> R {
    assert!(partials.len() >= group_norm_partials_len(d), "group norm's partials buffer is too short");
    let s = &d.shape;
    let [envs, batch, channels] = [s.envs, s.batch, s.channels].map(|v| v as u32);
    let mut launch = device.stream.launch_builder(device.function("group_norm_backward_params_finish_f32"));
    launch.arg(partials).arg(grad_gamma).arg(grad_beta).arg(&envs).arg(&batch).arg(&channels);
    let per_channel = LaunchConfig {
        grid_dim: ((s.envs * s.channels) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(per_channel) }?;
    Ok(())
}

/// Group norm's whole backward in two launches: the input gradient into `dx` (overwritten) with each
/// (image, channel)'s parameter sums into `partials`, then the parameter gradients from them — instead
/// of [`group_norm_backward_params`]'s own pass over `dy` and `x` (one block per (env, channel): 128
/// blocks over conv_light's half-million values each at W16). `relu_mask` as in
/// [`group_norm_backward_input`].
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward(
    device: &Device,
    d: &GroupNorm,
    saved: GroupNormSaved<'_>,
    dy: &CudaSlice<f32>,
    relu_mask: bool,
    dx: &mut CudaSlice<f32>,
    partials: &mut CudaSlice<f64>,
    grad_gamma: &mut CudaSlice<f32>,
    grad_beta: &mut CudaSlice<f32>,
) -> R {
    group_norm_backward_input(device, d, saved, dy, relu_mask, dx, false, Some(partials))?;
    group_norm_backward_params_finish(device, d, partials, grad_gamma, grad_beta)
}

/// The launch of a staged group-norm kernel over `pairs` (image, group) pairs, `per_block` a block of
/// eight threads each.
fn staged_pairs(pairs: usize, per_block: usize) -> LaunchConfig {
    let block = (per_block * 8) as u32;
    LaunchConfig {
        grid_dim: (pairs.div_ceil(per_block) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The mean of each of `planes` planes of `plane` values (one warp per plane).
pub fn global_avg_pool(
    device: &Device,
    x: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    planes: usize,
    plane: usize,
) -> R {
    let (planes64, plane32) = (planes as u64, plane as u32);
    let mut launch = device.stream.launch_builder(device.function("global_avg_pool_forward_f32"));
    launch.arg(x).arg(y).arg(&planes64).arg(&plane32);
    unsafe { launch.launch(LaunchConfig::for_num_elems((planes * 32).min(1 << 24) as u32)) }?;
    Ok(())
}

/// `y = x·Wᵀ (+ bias)` per env.
pub fn linear(
    device: &Device,
    d: &LinearShape,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    bias: Option<&CudaSlice<f32>>,
    y: &mut CudaSlice<f32>,
) -> R {
    let args = linear_args(d);
    let has_bias = i32::from(bias.is_some());
    let mut launch = device.stream.launch_builder(device.function("linear_forward_f32"));
    // Without a bias the kernel never reads its bias pointer: the weight stands in.
    launch.arg(x).arg(weight).arg(bias.unwrap_or(weight)).arg(y);
    for a in &args {
        launch.arg(a);
    }
    launch.arg(&has_bias);
    unsafe { launch.launch(elementwise(d.envs * d.batch * d.out_features)) }?;
    Ok(())
}

/// The linear layer's weight (and bias) gradients, overwritten.
pub fn linear_backward_params(
    device: &Device,
    d: &LinearShape,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    grad_weight: &mut CudaSlice<f32>,
    grad_bias: Option<&mut CudaSlice<f32>>,
) -> R {
    let args = linear_args(d);
    let has_bias = i32::from(grad_bias.is_some());
    let view;
    let mut launch = device.stream.launch_builder(device.function("linear_backward_params_f32"));
    launch.arg(x).arg(dy);
    match grad_bias {
        Some(gb) => {
            launch.arg(grad_weight).arg(gb);
        }
        None => {
            // Not written without a bias (the kernel's has_bias is 0); one pointer serves both slots.
            view = grad_weight.slice(..);
            launch.arg(&view).arg(&view);
        }
    }
    for a in &args {
        launch.arg(a);
    }
    launch.arg(&has_bias);
    unsafe { launch.launch(elementwise(d.envs * d.out_features * d.in_features)) }?;
    Ok(())
}

/// The linear layer's input gradient, overwritten.
pub fn linear_backward_input(
    device: &Device,
    d: &LinearShape,
    dy: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
) -> R {
    let args = linear_args(d);
    let mut launch = device.stream.launch_builder(device.function("linear_backward_input_f32"));
    launch.arg(dy).arg(weight).arg(dx);
    for a in &args {
        launch.arg(a);
    }
    unsafe { launch.launch(elementwise(d.envs * d.batch * d.in_features)) }?;
    Ok(())
}

/// `x = σ(x)` over the first `n` values.
pub fn sigmoid_in_place(device: &Device, x: &mut CudaSlice<f32>, n: usize) -> R {
    in_place(device, "sigmoid_forward_f32", x, n)
}

/// `dx = dy·y·(1 − y)` from the sigmoid's output `y`.
pub fn sigmoid_backward(
    device: &Device,
    y: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
    n: usize,
) -> R {
    binary(device, "sigmoid_backward_f32", y, dy, dx, n)
}

/// `y[p, :] = x[p, :]·scale[p]` over `planes` planes of `plane` values.
pub fn scale_planes(
    device: &Device,
    x: &CudaSlice<f32>,
    scale: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    planes: usize,
    plane: usize,
) -> R {
    let (planes64, plane32) = (planes as u64, plane as u32);
    let mut launch = device.stream.launch_builder(device.function("scale_planes_f32"));
    launch.arg(x).arg(scale).arg(y).arg(&planes64).arg(&plane32);
    unsafe { launch.launch(elementwise(planes * plane)) }?;
    Ok(())
}

/// `grad_scale[p] = Σ dy[p, :]·x[p, :]`.
pub fn scale_planes_backward_scale(
    device: &Device,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    grad_scale: &mut CudaSlice<f32>,
    planes: usize,
    plane: usize,
) -> R {
    let (planes64, plane32) = (planes as u64, plane as u32);
    let mut launch = device.stream.launch_builder(device.function("scale_planes_backward_scale_f32"));
    launch.arg(x).arg(dy).arg(grad_scale).arg(&planes64).arg(&plane32);
    // Eight threads per plane: one per lane of the CPU's sums.
    unsafe { launch.launch(elementwise(planes * 8)) }?;
    Ok(())
}

/// Adds each env's sum of squares of `grad` (`[E, n]`) into `sq` (`[E]`), the twin of
/// `optim::accumulate_sq_norms`: `sq_norms_partial_f32` into `partial` (`[E, blocks]`, its length
/// picks the blocks per env), then `sq_norms_finish` adding the partials in block order.
pub fn add_sq_norms(
    device: &Device,
    grad: &CudaSlice<f32>,
    partial: &mut CudaSlice<f64>,
    sq: &mut CudaViewMut<'_, f64>,
) -> R {
    let envs = sq.len();
    let (envs32, blocks) = (envs as u32, (partial.len() / envs) as u32);
    let per_env = (grad.len() / envs) as u64;
    let config = LaunchConfig { grid_dim: (blocks, envs32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = device.stream.launch_builder(device.function("sq_norms_partial_f32"));
    launch.arg(grad).arg(&mut *partial).arg(&per_env).arg(&blocks);
    unsafe { launch.launch(config) }?;
    let mut launch = device.stream.launch_builder(device.function("sq_norms_finish"));
    launch.arg(&*partial).arg(sq).arg(&envs32).arg(&blocks);
    unsafe { launch.launch(elementwise(envs)) }?;
    Ok(())
}

/// Each env's clip factor from its squared norm (`clip_grad_norm_` at [`MAX_GRAD_NORM`]).
pub fn clip_factors(device: &Device, sq: &CudaSlice<f64>, clip: &mut CudaSlice<f64>) -> R {
    let (envs32, max_norm) = (sq.len() as u32, MAX_GRAD_NORM);
    let mut launch = device.stream.launch_builder(device.function("clip_coefficients"));
    launch.arg(sq).arg(clip).arg(&envs32).arg(&max_norm);
    unsafe { launch.launch(elementwise(sq.len())) }?;
    Ok(())
}

/// Every tensor: the gradient scaled by each env's clip factor, then one SGD step for the envs marked in
/// `active` (`[E]`): `optim::scale_per_env` then `optim::sgd_step`, hyperparameters rounded to f32 as
/// the CPU twin's `T::from_f64`, weight decay when it is not 0.
pub fn scale_and_step(
    device: &Device,
    params: &mut [CudaSlice<f32>],
    grads: &mut [CudaSlice<f32>],
    momentum: &mut [CudaSlice<f32>],
    clip: &CudaSlice<f64>,
    active: &CudaView<'_, u8>,
    sgd: SgdConfig,
) -> R {
    let envs = active.len();
    assert_eq!(clip.len(), envs, "one clip factor per env");
    let envs32 = envs as u32;
    let (lr, mu, wd) = (sgd.lr as f32, sgd.momentum as f32, sgd.weight_decay as f32);
    let decay = i32::from(sgd.weight_decay != 0.0);
    for ((p, g), m) in params.iter_mut().zip(grads.iter_mut()).zip(momentum.iter_mut()) {
        let (n, per_env) = (g.len(), (g.len() / envs) as u64);
        let mut launch = device.stream.launch_builder(device.function("scale_per_env_f32"));
        launch.arg(&mut *g).arg(clip).arg(&per_env).arg(&envs32);
        unsafe { launch.launch(elementwise(n)) }?;
        let mut launch = device.stream.launch_builder(device.function("sgd_step_f32"));
        launch.arg(p).arg(&*g).arg(m).arg(active).arg(&per_env).arg(&envs32);
        launch.arg(&lr).arg(&mu).arg(&wd).arg(&decay);
        unsafe { launch.launch(elementwise(n)) }?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batch norm's runs cover each (env, channel)'s values once, none empty, at most 64, each at least
    /// 2 048 values when there are several, and the grid stays near its target: the host's blocks and
    /// seeds' planes at 1, 16 and 256 envs and batches 1 to 512.
    #[test]
    fn batch_norm_runs_cover_each_channel_once() {
        let mut checked = 0;
        for envs in [1, 16, 256] {
            for channels in [3, 8, 16, 32, 64] {
                for size in [1, 4, 7, 8, 16, 32] {
                    for batch in [1, 3, 37, 64, 512] {
                        let d = NormShape { envs, batch, channels, h: size, w: size };
                        let count = batch * size * size;
                        let (splits, run) = batch_norm_splits(&d);
                        assert!((1..=64).contains(&splits), "{d:?}");
                        assert!(splits * run >= count && (splits - 1) * run < count, "{d:?}: cover");
                        assert!(splits == 1 || run >= 2048, "{d:?}: short runs");
                        assert!(splits == 1 || d.params_len() * (splits - 1) < 2048, "{d:?}: too many");
                        assert_eq!(batch_norm_partial_len(&d), d.params_len() * splits * 2);
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 5 * 6 * 5);
        // W16's first block: 128 pairs of 512 · 1024 values, 16 runs of 32 768.
        let w16 = NormShape { envs: 16, batch: 512, channels: 8, h: 32, w: 32 };
        assert_eq!(batch_norm_splits(&w16), (16, 32_768));
    }

    /// The staged group norm's launch and eligibility use seeds.cu's block and group size, and it takes
    /// the seeds' groups on cifar_baseline's 32×32 and 8×8 planes (1 024 values) but not the 16×16 one's.
    #[test]
    fn the_staged_group_norm_uses_the_kernels_sizes_and_takes_groups_up_to_1024() {
        let file = crate::cuda::KERNEL_FILES.iter().find(|f| f.name == "seeds.cu").expect("seeds.cu");
        let sizes = [
            ("GN_STAGED_PAIRS", GN_STAGED_PAIRS),
            ("GN_STAGED_BACK_PAIRS", GN_STAGED_BACK_PAIRS),
            ("GN_STAGED_LEN", GN_STAGED_LEN),
        ];
        for (name, value) in sizes {
            let line = file.source.lines().find(|l| l.starts_with(&format!("#define {name} "))).expect(name);
            assert_eq!(line.split_whitespace().nth(2), Some(value.to_string().as_str()), "{name}");
        }
        let norm = |channels, size, groups| GroupNorm {
            shape: NormShape { envs: 2, batch: 3, channels, h: size, w: size },
            groups,
        };
        let taken = [(8, 32, 8), (32, 8, 2), (16, 16, 1), (6, 5, 3), (64, 4, 4)]
            .map(|(c, s, g)| group_norm_staged(&norm(c, s, g)));
        assert_eq!(taken, [true, true, false, false, true]);
    }

    /// The finish kernel's launch gives it the block it is written for: FINISH_LANES threads, read from
    /// batchnorm.cu.
    #[test]
    fn the_statistics_finish_launches_the_kernels_block_size() {
        let file = crate::cuda::KERNEL_FILES.iter().find(|f| f.name == "batchnorm.cu").expect("batchnorm.cu");
        let line =
            file.source.lines().find(|l| l.starts_with("#define FINISH_LANES ")).expect("FINISH_LANES");
        assert_eq!(line.split_whitespace().nth(2), Some(FINISH_LANES.to_string().as_str()));
    }
}
