//! Every CNN seed blueprint on the device: the CUDA twin of [`crate::seeds::forward`] and of the
//! parameter half of [`crate::seeds::backward`] (the seed's input is detached in the RL loop, so no
//! input gradient) over all `E` envs of a batch, composed from the parity-checked kernels and the GEMM
//! convolutions. Parameters are kept tensor-major ([`TensorRows`]).
//!
//! The selftest checks each blueprint's output and parameter gradients against the CPU's on the same
//! rows and input.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gemm_conv::GemmConv;
use super::ops::{self, GroupNorm, GroupNormOut, GroupNormSaved};
use super::parity::{Device, ParityError, elementwise, push_dims};
use super::rows::TensorRows;
use crate::ops::Conv2dShape;
use crate::seeds::{self, CnnBlueprint, SeedShape, group_norm_groups};

type R = Result<(), ParityError>;

/// What the device adds to the CPU's [`SeedShape`] (a seed batch `[E, B, C, H, W]`): its group norms
/// with their group count, the attention and bottleneck widths, and the GEMM convolutions of each
/// blueprint.
pub trait DeviceSeedShape {
    fn group_norm(&self, channels: usize) -> GroupNorm;
    /// The attention seed's squeeze width (`seeds::attention::reduced`).
    fn reduced(&self) -> usize;
    /// The bottleneck's width (`seeds::bottleneck::width`).
    fn narrow(&self) -> usize;
    /// Every GEMM convolution `bp` runs at this shape (to size a [`GemmConv`]'s scratch).
    fn convs(&self, bp: CnnBlueprint) -> Vec<Conv2dShape>;
}

impl DeviceSeedShape for SeedShape {
    fn group_norm(&self, channels: usize) -> GroupNorm {
        GroupNorm { shape: self.norm(channels), groups: group_norm_groups(channels) }
    }

    fn reduced(&self) -> usize {
        seeds::attention::reduced(self.channels)
    }

    fn narrow(&self) -> usize {
        seeds::bottleneck::width(self.channels)
    }

    fn convs(&self, bp: CnnBlueprint) -> Vec<Conv2dShape> {
        let c = self.channels;
        match bp {
            CnnBlueprint::ConvSmall => vec![self.conv(c, c, 1, 1)],
            CnnBlueprint::ConvLight | CnnBlueprint::ConvHeavy => vec![self.conv(c, c, 3, 1)],
            CnnBlueprint::Depthwise => vec![self.conv(c, c, 1, 1)],
            CnnBlueprint::Bottleneck => {
                let b = self.narrow();
                vec![self.conv(c, b, 1, 1), self.conv(b, b, 3, 1), self.conv(b, c, 1, 1)]
            }
            CnnBlueprint::Attention | CnnBlueprint::Norm => Vec::new(),
        }
    }
}

/// One blueprint's parameters, gradients and saved activations for every env of a batch.
pub struct DeviceSeed {
    pub bp: CnnBlueprint,
    /// The activations the launches run over (the batch [`Self::set_rows`] set; the buffers hold the
    /// batch it was made with).
    dims: SeedShape,
    /// Parameters, gradients, momentum (tensor-major), snapshots and gradient statistics.
    pub rows: TensorRows,
    /// What the backward reads, written by the forward (per blueprint; see each forward).
    saved: Vec<CudaSlice<f32>>,
    /// Group-norm statistics `[E, B, G]`: mean, inv_std (and a second norm's).
    stats: Vec<CudaSlice<f32>>,
    /// Backward temporaries.
    temp: Vec<CudaSlice<f32>>,
    /// Each (image, channel)'s group-norm parameter sums (`ops::group_norm_backward`), one norm at a
    /// time.
    partials: CudaSlice<f64>,
}

impl DeviceSeed {
    /// Zero parameters and the buffers of `bp` at `dims`.
    pub fn new(device: &Device, bp: CnnBlueprint, dims: SeedShape) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let (a, samples, c) = (dims.len(), dims.samples(), dims.channels);
        let n_stats = samples * group_norm_groups(c);
        let (saved, stats, temp): (Vec<usize>, Vec<usize>, Vec<usize>) = match bp {
            CnnBlueprint::ConvSmall | CnnBlueprint::ConvLight => (vec![a], vec![n_stats; 2], vec![a]),
            CnnBlueprint::ConvHeavy => (vec![a; 3], vec![n_stats; 4], vec![a, a]),
            CnnBlueprint::Attention => {
                let r = samples * dims.reduced();
                (vec![samples * c, r, samples * c], Vec::new(), vec![samples * c, samples * c, r, r])
            }
            CnnBlueprint::Norm => (vec![a], vec![n_stats; 2], vec![a, samples]),
            CnnBlueprint::Depthwise => (vec![a; 2], vec![n_stats; 2], vec![a, a]),
            CnnBlueprint::Bottleneck => {
                let narrow = dims.activation_len(dims.narrow());
                (vec![narrow, narrow, a], vec![n_stats; 2], vec![a.max(narrow), narrow])
            }
        };
        let alloc = |lens: &[usize]| -> Result<Vec<CudaSlice<f32>>, ParityError> {
            lens.iter().map(|&n| Ok(stream.alloc_zeros::<f32>(n.max(1))?)).collect()
        };
        Ok(Self {
            bp,
            dims,
            rows: TensorRows::new(device, seeds::layout(bp, dims.channels), dims.envs)?,
            saved: alloc(&saved)?,
            stats: alloc(&stats)?,
            temp: alloc(&temp)?,
            // Only the blueprints whose group norm takes its whole backward (`ops::group_norm_backward`).
            partials: stream.alloc_zeros::<f64>(match bp {
                CnnBlueprint::Attention | CnnBlueprint::Norm => 1,
                _ => 2 * samples * c,
            })?,
        })
    }

    /// Runs the launches that follow over the first `rows` images per env: set by its slot
    /// ([`DeviceSlot::set_rows`](super::slot::DeviceSlot::set_rows), which checks `rows` against the
    /// batch the buffers hold).
    pub(super) fn set_rows(&mut self, rows: usize) {
        self.dims.batch = rows;
    }

    /// `y = bp(x)` for every env (`x`, `y`: `[E, B, C, H, W]`), keeping what [`Self::backward`] needs.
    pub fn forward(
        &mut self,
        device: &Device,
        conv: &mut GemmConv,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> R {
        let d = self.dims;
        let (a, c) = (d.len(), d.channels);
        let (p, s, st) = (&self.rows.params, &mut self.saved, &mut self.stats);
        match self.bp {
            // y = x + relu(GN(conv(x))), the norm's epilogue doing the ReLU and the add: saved conv out.
            CnnBlueprint::ConvSmall | CnnBlueprint::ConvLight => {
                let k = if self.bp == CnnBlueprint::ConvSmall { 1 } else { 3 };
                let [conv_out] = &mut s[..] else { unreachable!() };
                let [mean, inv_std] = &mut st[..] else { unreachable!() };
                conv.forward(device, &d.conv(c, c, k, 1), x, &p[0], conv_out)?;
                let out = GroupNormOut::AddRelu(x);
                ops::group_norm_forward(
                    device,
                    &d.group_norm(c),
                    conv_out,
                    &p[1],
                    &p[2],
                    out,
                    y,
                    mean,
                    inv_std,
                )
            }
            // y = x + U2(U1(x)), Uk = relu(GN(conv3×3)), the norms' epilogues doing the ReLUs and the add:
            // saved conv1, U1 out, conv2.
            CnnBlueprint::ConvHeavy => {
                let [c1, o1, c2] = &mut s[..] else { unreachable!() };
                let [m1, i1, m2, i2] = &mut st[..] else { unreachable!() };
                let (cd, gd) = (d.conv(c, c, 3, 1), d.group_norm(c));
                conv.forward(device, &cd, x, &p[0], c1)?;
                ops::group_norm_forward(device, &gd, c1, &p[1], &p[2], GroupNormOut::Relu, o1, m1, i1)?;
                conv.forward(device, &cd, o1, &p[3], c2)?;
                ops::group_norm_forward(device, &gd, c2, &p[4], &p[5], GroupNormOut::AddRelu(x), y, m2, i2)
            }
            // y = x·σ(W2·relu(W1·GAP(x)) + b2): saved GAP(x), the hidden ReLU output, the scale.
            CnnBlueprint::Attention => {
                let (samples, r) = (d.samples(), d.reduced());
                let [pooled, hidden, scale] = &mut s[..] else { unreachable!() };
                ops::global_avg_pool(device, x, pooled, samples * c, d.plane())?;
                ops::linear(device, &d.linear(c, r), pooled, &p[0], None, hidden)?;
                ops::relu_in_place(device, hidden, samples * r)?;
                ops::linear(device, &d.linear(r, c), hidden, &p[1], Some(&p[2]), scale)?;
                ops::sigmoid_in_place(device, scale, samples * c)?;
                ops::scale_planes(device, x, scale, y, samples * c, d.plane())
            }
            // y = x + tanh(λ)·(GN(x) − x): saved GN(x).
            CnnBlueprint::Norm => {
                let [mean, inv_std] = &mut st[..] else { unreachable!() };
                let out = GroupNormOut::Norm;
                ops::group_norm_forward(
                    device,
                    &d.group_norm(c),
                    x,
                    &p[0],
                    &p[1],
                    out,
                    &mut s[0],
                    mean,
                    inv_std,
                )?;
                let dims = [d.envs, d.batch, c * d.plane()].map(|v| v as u32);
                let mut launch = device.stream.launch_builder(device.function("norm_seed_forward_f32"));
                launch.arg(x).arg(&s[0]).arg(&p[2]).arg(y);
                push_dims(&mut launch, &dims);
                unsafe { launch.launch(elementwise(a)) }?;
                Ok(())
            }
            // y = x + relu(GN(PW(DW(x)))), the norm's epilogue doing the ReLU and the add: saved DW(x), PW(…).
            CnnBlueprint::Depthwise => {
                let [dw_out, pw_out] = &mut s[..] else { unreachable!() };
                let [mean, inv_std] = &mut st[..] else { unreachable!() };
                depthwise_forward(device, &d, x, &p[0], dw_out)?;
                conv.forward(device, &d.conv(c, c, 1, 1), dw_out, &p[1], pw_out)?;
                let out = GroupNormOut::AddRelu(x);
                ops::group_norm_forward(device, &d.group_norm(c), pw_out, &p[2], &p[3], out, y, mean, inv_std)
            }
            // y = GN(UP(relu(CONV(relu(DOWN(x)))))) + x, the norm's epilogue doing the add: saved the two
            // ReLU outputs and UP's.
            CnnBlueprint::Bottleneck => {
                let b = d.narrow();
                let narrow = d.activation_len(b);
                let [down_out, conv_out, up_out] = &mut s[..] else { unreachable!() };
                let [mean, inv_std] = &mut st[..] else { unreachable!() };
                conv.forward(device, &d.conv(c, b, 1, 1), x, &p[0], down_out)?;
                ops::relu_in_place(device, down_out, narrow)?;
                conv.forward(device, &d.conv(b, b, 3, 1), down_out, &p[1], conv_out)?;
                ops::relu_in_place(device, conv_out, narrow)?;
                conv.forward(device, &d.conv(b, c, 1, 1), conv_out, &p[2], up_out)?;
                let out = GroupNormOut::Add(x);
                ops::group_norm_forward(device, &d.group_norm(c), up_out, &p[3], &p[4], out, y, mean, inv_std)
            }
        }
    }

    /// The parameter gradients of the last [`Self::forward`] (same `x`) given `grad_y = ∂L/∂y`,
    /// overwriting [`Self::grads`].
    pub fn backward(
        &mut self,
        device: &Device,
        conv: &mut GemmConv,
        x: &CudaSlice<f32>,
        grad_y: &CudaSlice<f32>,
    ) -> R {
        let d = self.dims;
        let (a, c) = (d.len(), d.channels);
        let (p, g, s, st, t, partials) = (
            &self.rows.params,
            &mut self.rows.grads,
            &self.saved,
            &self.stats,
            &mut self.temp,
            &mut self.partials,
        );
        // The norm whose input is `x`, with parameters p[γ], p[γ + 1] and statistics st[k], st[k + 1].
        let saved = |x, gamma: usize, k: usize| GroupNormSaved {
            x,
            gamma: &p[gamma],
            beta: &p[gamma + 1],
            mean: &st[k],
            inv_std: &st[k + 1],
        };
        match self.bp {
            // Through the add's ReLU (its mask recomputed by the norm's backward), the norm, the conv.
            CnnBlueprint::ConvSmall | CnnBlueprint::ConvLight => {
                let k = if self.bp == CnnBlueprint::ConvSmall { 1 } else { 3 };
                let [t0] = &mut t[..] else { unreachable!() };
                let [dw, dgamma, dbeta] = &mut g[..] else { unreachable!() };
                let gd = d.group_norm(c);
                ops::group_norm_backward(
                    device,
                    &gd,
                    saved(&s[0], 1, 0),
                    grad_y,
                    true,
                    t0,
                    partials,
                    dgamma,
                    dbeta,
                )?;
                conv.backward_weight(device, &d.conv(c, c, k, 1), x, t0, dw)
            }
            CnnBlueprint::ConvHeavy => {
                let [t0, t1] = &mut t[..] else { unreachable!() };
                let [dw1, dg1, db1, dw2, dg2, db2] = &mut g[..] else { unreachable!() };
                let [c1, o1, c2] = &s[..] else { unreachable!() };
                let (cd, gd) = (d.conv(c, c, 3, 1), d.group_norm(c));
                ops::group_norm_backward(device, &gd, saved(c2, 4, 2), grad_y, true, t1, partials, dg2, db2)?;
                conv.backward_weight(device, &cd, o1, t1, dw2)?;
                // ∂L/∂U1(x), then through U1 (its ReLU's mask recomputed by the norm's backward).
                conv.backward_input(device, &cd, t1, &p[3], t0)?;
                ops::group_norm_backward(device, &gd, saved(c1, 1, 0), t0, true, t1, partials, dg1, db1)?;
                conv.backward_weight(device, &cd, x, t1, dw1)
            }
            CnnBlueprint::Attention => {
                let (samples, r) = (d.samples(), d.reduced());
                let [pooled, hidden, scale] = &s[..] else { unreachable!() };
                let [d_scale, d_logits, d_hidden, d_hidden_pre] = &mut t[..] else { unreachable!() };
                let [dw1, dw2, db2] = &mut g[..] else { unreachable!() };
                let (fc1, fc2) = (d.linear(c, r), d.linear(r, c));
                ops::scale_planes_backward_scale(device, x, grad_y, d_scale, samples * c, d.plane())?;
                ops::sigmoid_backward(device, scale, d_scale, d_logits, samples * c)?;
                ops::linear_backward_params(device, &fc2, hidden, d_logits, dw2, Some(db2))?;
                ops::linear_backward_input(device, &fc2, d_logits, &p[1], d_hidden)?;
                ops::relu_backward(device, hidden, d_hidden, d_hidden_pre, samples * r)?;
                ops::linear_backward_params(device, &fc1, pooled, d_hidden_pre, dw1, None)
            }
            CnnBlueprint::Norm => {
                let [scaled, partials] = &mut t[..] else { unreachable!() };
                let [dgamma, dbeta, dlambda] = &mut g[..] else { unreachable!() };
                let (image, samples) = (c * d.plane(), d.samples());
                let (images32, image32) = (samples as u32, image as u32);
                let mut launch =
                    device.stream.launch_builder(device.function("norm_seed_image_partials_f32"));
                launch.arg(grad_y).arg(&s[0]).arg(x).arg(&mut *partials).arg(&images32).arg(&image32);
                unsafe { launch.launch(elementwise(samples)) }?;
                let (envs32, batch32) = (d.envs as u32, d.batch as u32);
                let mut launch = device.stream.launch_builder(device.function("norm_seed_lambda_grad_f32"));
                launch.arg(&*partials).arg(&p[2]).arg(dlambda).arg(&envs32).arg(&batch32);
                unsafe { launch.launch(elementwise(d.envs)) }?;
                let mut launch = device.stream.launch_builder(device.function("norm_seed_scale_grad_f32"));
                launch.arg(grad_y).arg(&p[2]).arg(&mut *scaled).arg(&envs32).arg(&batch32).arg(&image32);
                unsafe { launch.launch(elementwise(a)) }?;
                // Only the parameter half of the norm's backward: the seed's input is detached.
                ops::group_norm_backward_params(
                    device,
                    &d.group_norm(c),
                    x,
                    &st[0],
                    &st[1],
                    scaled,
                    dgamma,
                    dbeta,
                )
            }
            CnnBlueprint::Depthwise => {
                let [t0, t1] = &mut t[..] else { unreachable!() };
                let [d_dw, d_pw, dgamma, dbeta] = &mut g[..] else { unreachable!() };
                let [dw_out, pw_out] = &s[..] else { unreachable!() };
                let (gd, pw) = (d.group_norm(c), d.conv(c, c, 1, 1));
                ops::group_norm_backward(
                    device,
                    &gd,
                    saved(pw_out, 2, 0),
                    grad_y,
                    true,
                    t1,
                    partials,
                    dgamma,
                    dbeta,
                )?;
                conv.backward_weight(device, &pw, dw_out, t1, d_pw)?;
                conv.backward_input(device, &pw, t1, &p[1], t0)?;
                depthwise_backward_weight(device, &d, x, t0, d_dw)
            }
            CnnBlueprint::Bottleneck => {
                let b = d.narrow();
                let narrow = d.activation_len(b);
                let [t0, t1] = &mut t[..] else { unreachable!() };
                let [d_down, d_conv, d_up, dgamma, dbeta] = &mut g[..] else { unreachable!() };
                let [down_out, conv_out, up_out] = &s[..] else { unreachable!() };
                let gd = d.group_norm(c);
                let (down, mid, up) = (d.conv(c, b, 1, 1), d.conv(b, b, 3, 1), d.conv(b, c, 1, 1));
                ops::group_norm_backward(
                    device,
                    &gd,
                    saved(up_out, 3, 0),
                    grad_y,
                    false,
                    t0,
                    partials,
                    dgamma,
                    dbeta,
                )?;
                conv.backward_weight(device, &up, conv_out, t0, d_up)?;
                conv.backward_input(device, &up, t0, &p[2], t1)?;
                ops::relu_backward(device, conv_out, t1, t0, narrow)?;
                conv.backward_weight(device, &mid, down_out, t0, d_conv)?;
                conv.backward_input(device, &mid, t0, &p[1], t1)?;
                ops::relu_backward(device, down_out, t1, t0, narrow)?;
                conv.backward_weight(device, &down, x, t0, d_down)
            }
        }
    }
}

/// The depthwise 3×3 conv (groups = C, pad 1) with the one-thread-per-output twin kernel: the GEMM form
/// does not take groups, and a depthwise conv has 9 taps per output.
fn depthwise_forward(
    device: &Device,
    d: &SeedShape,
    x: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
) -> R {
    let dims = depthwise_dims(d);
    let mut launch = device.stream.launch_builder(device.function("conv2d_forward_f32"));
    launch.arg(x).arg(w).arg(y);
    push_dims(&mut launch, &dims);
    unsafe { launch.launch(elementwise(d.len())) }?;
    Ok(())
}

/// The depthwise conv's weight gradient (`[E, C, 1, 3, 3]`): one block per (env, channel, tap).
fn depthwise_backward_weight(
    device: &Device,
    d: &SeedShape,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    dw: &mut CudaSlice<f32>,
) -> R {
    let dims = [d.envs, d.batch, d.channels, d.h, d.w, 3, 1].map(|v| v as u32);
    let mut launch = device.stream.launch_builder(device.function("depthwise_backward_weight_fast_f32"));
    launch.arg(x).arg(dy).arg(dw);
    push_dims(&mut launch, &dims);
    let blocks = (d.envs * d.channels * 9) as u32;
    unsafe {
        launch.launch(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
    }?;
    Ok(())
}

fn depthwise_dims(d: &SeedShape) -> [u32; 9] {
    let c = d.channels as u32;
    [d.envs as u32, d.batch as u32, c, c, d.h as u32, d.w as u32, 3, 1, c]
}
