//! Typed launchers for the kernels the composed modules use: each names its kernel and takes the
//! kernel's arguments in the kernel's order, so a composition reads as the CPU code it mirrors and an
//! argument list is written once.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::ops::{LinearShape, NormShape};
use crate::optim::{MAX_GRAD_NORM, SgdConfig};

use super::parity::{Device, ParityError, elementwise};

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

/// `y = max(x, 0)` over `n` values (`x` may be `y`'s own buffer only through [`relu_in_place`]).
pub fn relu(device: &Device, x: &CudaSlice<f32>, y: &mut CudaSlice<f32>, n: usize) -> R {
    let n64 = n as u64;
    let mut launch = device.stream.launch_builder(device.function("relu_forward_f32"));
    launch.arg(x).arg(y).arg(&n64);
    unsafe { launch.launch(elementwise(n)) }?;
    Ok(())
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

/// `out = a + b` over `n` values.
pub fn add(device: &Device, a: &CudaSlice<f32>, b: &CudaSlice<f32>, out: &mut CudaSlice<f32>, n: usize) -> R {
    binary(device, "add_f32", a, b, out, n)
}

/// Group norm forward with the statistics saved (`[E, B, G]` each).
#[allow(clippy::too_many_arguments)]
pub fn group_norm_forward(
    device: &Device,
    d: &GroupNorm,
    x: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    beta: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    mean: &mut CudaSlice<f32>,
    inv_std: &mut CudaSlice<f32>,
) -> R {
    let args = d.args();
    let mut launch = device.stream.launch_builder(device.function("group_norm_forward_f32"));
    launch.arg(x).arg(gamma).arg(beta).arg(y).arg(mean).arg(inv_std);
    for a in &args {
        launch.arg(a);
    }
    // Eight threads per (image, group): one per lane of the CPU's sums.
    unsafe { launch.launch(elementwise(d.shape.envs * d.shape.batch * d.groups * 8)) }?;
    Ok(())
}

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

/// Group norm's input gradient (overwritten, or added with `accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn group_norm_backward_input(
    device: &Device,
    d: &GroupNorm,
    x: &CudaSlice<f32>,
    gamma: &CudaSlice<f32>,
    mean: &CudaSlice<f32>,
    inv_std: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    dx: &mut CudaSlice<f32>,
    accumulate: bool,
) -> R {
    let args = d.args();
    let accumulate = i32::from(accumulate);
    let mut launch = device.stream.launch_builder(device.function("group_norm_backward_input_f32"));
    launch.arg(x).arg(gamma).arg(mean).arg(inv_std).arg(dy).arg(dx);
    for a in &args {
        launch.arg(a);
    }
    launch.arg(&accumulate);
    // Eight threads per (image, group): one per lane of the CPU's sums.
    unsafe { launch.launch(elementwise(d.shape.envs * d.shape.batch * d.groups * 8)) }?;
    Ok(())
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
    unsafe { launch.launch(elementwise(planes)) }?;
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
