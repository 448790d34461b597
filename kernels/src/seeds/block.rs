//! Conv → GroupNorm → ReLU, the unit of conv_small, conv_light, conv_heavy and of depthwise's pointwise
//! stage. A forward and its backward over one gathered batch of envs.

use rayon::iter::Either;
use rayon::prelude::*;

use crate::ops::activation::relu;
use crate::ops::blend::blend_add;
use crate::ops::conv::{ConvBackwardRuns, RUN_IMAGES, conv2d_forward_run};
use crate::ops::norm::{
    group_norm_image_backward_carried, group_norm_image_forward, group_norm_param_grads,
    group_norm_relu_mask_image,
};
use crate::ops::pool::unpool_image;
use crate::ops::real::LANES;
use crate::ops::{
    Conv2dShape, NormShape, PoolShape, Real, conv2d_backward_input, conv2d_backward_input_accumulate,
    conv2d_backward_weight, group_norm_backward,
};

/// The shapes of one conv → norm → ReLU unit (conv without bias, stride 1, size-preserving padding).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvNormRelu {
    pub conv: Conv2dShape,
    /// GroupNorm groups over the conv's output channels.
    pub groups: usize,
}

/// The unit's parameters, each `[E, …]`.
#[derive(Clone, Copy)]
pub(crate) struct BlockParams<'a, T> {
    pub weight: &'a [T],
    pub gamma: &'a [T],
    pub beta: &'a [T],
}

/// The unit's parameter gradients, each `[E, …]` (overwritten).
pub(crate) struct BlockGrads<'a, T> {
    pub weight: &'a mut [T],
    pub gamma: &'a mut [T],
    pub beta: &'a mut [T],
}

/// What the forward keeps for the backward.
#[derive(Clone, Copy)]
pub(crate) struct BlockState<'a, T> {
    /// The unit's input.
    pub input: &'a [T],
    /// The conv output (the norm's input). The ReLU's mask is recomputed from it, so the unit's
    /// output is not part of the state.
    pub conv_out: &'a [T],
    pub mean: &'a [T],
    pub inv_std: &'a [T],
}

/// The gradient at a seed's output where the seed blends by ADD and a 2×2 max pool reads the blend:
/// `g·a` at each pool window's winner (`g` the pool's output gradient `[Eb, B, C, H/2, W/2]`, `argmax` its
/// winners, `a` the env's clamped amplitude, `[Eb]`), zero elsewhere — the `grad_s` of
/// [`blend_add_backward_from_pooled`](crate::ops::blend_add_backward_from_pooled), same products, rebuilt
/// an image at a time where it is used instead of written whole.
#[derive(Clone, Copy)]
pub struct PooledSeedGrad<'a, T> {
    pub grad: &'a [T],
    pub argmax: &'a [u8],
    pub amplitude: &'a [T],
}

impl<T: Real> PooledSeedGrad<'_, T> {
    /// Writes image `i`'s (`e·B + b`) gradient (`[C, H, W]` of `c`) into `dst`.
    #[inline]
    pub(crate) fn write_image(&self, c: &Conv2dShape, i: usize, dst: &mut [T]) {
        let pool = PoolShape { envs: 1, batch: 1, channels: c.c_out, h: c.h_out(), w: c.w_out() };
        let a = self.amplitude[i / c.batch];
        unpool_image(&pool, i, self.grad, self.argmax, |g| g * a, dst);
    }

    fn check(&self, c: &Conv2dShape) {
        let windows = c.envs * c.batch * c.c_out * (c.h_out() / 2) * (c.w_out() / 2);
        assert_eq!((self.grad.len(), self.argmax.len()), (windows, windows), "pooled seed gradient length");
        assert_eq!(self.amplitude.len(), c.envs, "one amplitude per env");
    }
}

/// The gradient at a unit's output, as [`ConvNormRelu::backward`] takes it.
#[derive(Clone, Copy)]
pub(crate) enum UnitOutputGrad<'a, T> {
    /// Already in the backward's `grad`.
    InGrad,
    /// `[E, B, C, H, W]`.
    Whole(&'a [T]),
    /// From the pool after the slot's ADD blend.
    Pooled(PooledSeedGrad<'a, T>),
}

/// The residual add that ends a seed: `y = skip + out`, or with `blend` (the per-env ADD amplitude,
/// clamped) the slot's ADD blend of that with `skip` as the host activation, `y = lerp(skip, skip + out,
/// a)`: the arithmetic of a residual add then `blend_add_forward`.
pub(crate) struct Residual<'a, T> {
    pub skip: &'a [T],
    pub y: &'a mut [T],
    pub blend: Option<&'a [T]>,
}

/// What the backward does with the gradient at the unit's input.
pub(crate) enum InputGrad<'a, T> {
    /// Not needed.
    Skip,
    /// Write it into the `grad` buffer (which held the output gradient on entry).
    IntoGrad,
    /// Add it into this buffer (the input also feeds a residual path).
    AccumulateInto(&'a mut [T]),
}

impl ConvNormRelu {
    pub fn norm_shape(&self) -> NormShape {
        let c = &self.conv;
        NormShape { envs: c.envs, batch: c.batch, channels: c.c_out, h: c.h_out(), w: c.w_out() }
    }

    /// Elements of each saved norm statistic `[E, B, G]`.
    pub fn stats_len(&self) -> usize {
        self.conv.envs * self.conv.batch * self.groups
    }

    /// `out = relu(GN(conv(input)))`, keeping the conv output and the norm statistics; with `residual`,
    /// also its `y` (see [`Residual`]; `skip` output sized), and then `out` may be `None`: the unit's
    /// output is only needed as the next unit's input (the backward recomputes the ReLU's mask from the
    /// conv output), so a seed's last unit does not write it. One task per
    /// run of [`RUN_IMAGES`] images of an env: the conv writes the run, and the norm, the ReLU and the
    /// residual add finish it while it is in cache. The same bits as `conv2d_forward`, then
    /// `group_norm_relu_forward`, then a residual add over the whole batch, with three passes over the
    /// activations fewer.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<T: Real>(
        &self,
        input: &[T],
        p: BlockParams<'_, T>,
        conv_out: &mut [T],
        out: Option<&mut [T]>,
        mean: &mut [T],
        inv_std: &mut [T],
        residual: Option<Residual<'_, T>>,
    ) {
        let c = self.conv;
        let (image_in, image_out) = (c.c_in * c.h * c.w, c.c_out * c.h_out() * c.w_out());
        let (groups, channels, plane) = (self.groups, c.c_out, c.h_out() * c.w_out());
        assert_eq!(input.len(), c.input_len(), "unit input length");
        assert_eq!(p.weight.len(), c.weight_len(), "unit conv weight length");
        assert_eq!(p.gamma.len(), c.envs * channels, "unit norm parameter length");
        assert_eq!(p.beta.len(), c.envs * channels, "unit norm parameter length");
        assert_eq!(conv_out.len(), c.output_len(), "unit activation length");
        if let Some(out) = &out {
            assert_eq!(out.len(), c.output_len(), "unit activation length");
        }
        assert!(out.is_some() || residual.is_some(), "a unit's output is kept unless a residual takes it");
        assert!(
            mean.len() == self.stats_len() && inv_std.len() == self.stats_len(),
            "unit statistics length"
        );
        if c.output_len() == 0 {
            return;
        }
        let blend = residual.as_ref().and_then(|r| r.blend);
        if let Some(alpha) = blend {
            assert_eq!(alpha.len(), c.envs, "blend amplitude per env");
        }
        let residuals = match residual {
            Some(Residual { skip, y, .. }) => {
                assert!(skip.len() == c.output_len() && y.len() == c.output_len(), "residual length");
                let env = c.batch * image_out;
                Either::Left(skip.par_chunks(env).zip(y.par_chunks_mut(env)).map(Some))
            }
            None => Either::Right((0..c.envs).into_par_iter().map(|_| None)),
        };
        let run = RUN_IMAGES.min(c.batch);
        let w_env = c.weight_len_per_env();
        let outs = match out {
            Some(out) => Either::Left(out.par_chunks_mut(c.batch * image_out).map(Some)),
            None => Either::Right((0..c.envs).into_par_iter().map(|_| None)),
        };
        input
            .par_chunks(c.batch * image_in)
            .zip(conv_out.par_chunks_mut(c.batch * image_out))
            .zip(outs)
            .zip(mean.par_chunks_mut(c.batch * groups).zip(inv_std.par_chunks_mut(c.batch * groups)))
            .zip(residuals)
            .enumerate()
            .for_each(|(e, ((((x, conv_out), out), (mean, inv_std)), residual))| {
                let weight = &p.weight[e * w_env..(e + 1) * w_env];
                let gamma = &p.gamma[e * channels..(e + 1) * channels];
                let beta = &p.beta[e * channels..(e + 1) * channels];
                let alpha = blend.map(|a| a[e]);
                let residuals = match residual {
                    Some((skip, y)) => Either::Left(
                        skip.par_chunks(run * image_out).zip(y.par_chunks_mut(run * image_out)).map(Some),
                    ),
                    None => Either::Right((0..c.batch.div_ceil(run)).into_par_iter().map(|_| None)),
                };
                let outs = match out {
                    Some(out) => Either::Left(out.par_chunks_mut(run * image_out).map(Some)),
                    None => Either::Right((0..c.batch.div_ceil(run)).into_par_iter().map(|_| None)),
                };
                x.par_chunks(run * image_in)
                    .zip(conv_out.par_chunks_mut(run * image_out))
                    .zip(outs)
                    .zip(mean.par_chunks_mut(run * groups).zip(inv_std.par_chunks_mut(run * groups)))
                    .zip(residuals)
                    .for_each(|((((x, conv_out), mut out), (mean, inv_std)), mut residual)| {
                        conv2d_forward_run(&c, x, weight, conv_out);
                        // An output not kept is one image of scratch, reused image after image.
                        let tmp_len = if out.is_some() { 0 } else { image_out };
                        T::with_scratch(tmp_len, |tmp| {
                            let images = conv_out
                                .chunks_exact(image_out)
                                .zip(mean.chunks_exact_mut(groups).zip(inv_std.chunks_exact_mut(groups)));
                            for (i, (conv_img, (m, s))) in images.enumerate() {
                                let image = i * image_out..(i + 1) * image_out;
                                let out_img = match out.as_deref_mut() {
                                    Some(out) => &mut out[image.clone()],
                                    None => &mut *tmp,
                                };
                                group_norm_image_forward(plane, conv_img, gamma, beta, out_img, m, s, relu);
                                let Some((skip, y)) = residual.as_mut() else { continue };
                                let values =
                                    y[image.clone()].iter_mut().zip(&skip[image]).zip(out_img.iter());
                                match alpha {
                                    None => values.for_each(|((y, &h), &r)| *y = h + r),
                                    Some(a) => values.for_each(|((y, &h), &r)| *y = blend_add(h, h + r, a)),
                                }
                            }
                        });
                    });
            });
    }

    /// ∂L/∂out is `grad_out`: given whole, rebuilt from the pool after the slot's ADD blend, or
    /// ([`UnitOutputGrad::InGrad`]) `grad`'s content on entry. Writes the parameter gradients and
    /// handles the input gradient as `input_grad` says (with [`InputGrad::IntoGrad`] the input and output
    /// must have the same size, true of every seed unit). The ReLU's mask is recomputed from the conv
    /// output. With at least as many envs as threads the backward runs per env a few images at a time
    /// ([`Self::backward_in_runs`]); with fewer it runs op by op over the whole batch, using `grad`
    /// (output sized) for the gradient at the ReLU's input and clobbering `scratch` (conv-output sized).
    /// Both give the same bits.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Real>(
        &self,
        state: BlockState<'_, T>,
        p: BlockParams<'_, T>,
        grad_out: UnitOutputGrad<'_, T>,
        grad: &mut [T],
        scratch: &mut [T],
        g: BlockGrads<'_, T>,
        input_grad: InputGrad<'_, T>,
    ) {
        if let UnitOutputGrad::Pooled(pooled) = &grad_out {
            pooled.check(&self.conv);
        }
        if self.conv.envs >= rayon::current_num_threads() {
            self.backward_in_runs(state, p, grad_out, grad, g, input_grad);
            return;
        }
        let grad_conv_out = scratch;
        match grad_out {
            UnitOutputGrad::InGrad => {}
            UnitOutputGrad::Whole(grad_out) => grad.copy_from_slice(grad_out),
            UnitOutputGrad::Pooled(pooled) => {
                let (c, image) = (self.conv, self.conv.c_out * self.conv.h_out() * self.conv.w_out());
                let images = grad.par_chunks_mut(image.max(1)).enumerate();
                images.for_each(|(i, dst)| pooled.write_image(&c, i, dst));
            }
        }
        self.relu_mask(state, p, grad);
        group_norm_backward(
            self.norm_shape(),
            self.groups,
            state.conv_out,
            p.gamma,
            state.mean,
            state.inv_std,
            grad,
            grad_conv_out,
            g.gamma,
            g.beta,
        );
        conv2d_backward_weight(self.conv, state.input, grad_conv_out, g.weight);
        match input_grad {
            InputGrad::Skip => {}
            InputGrad::IntoGrad => conv2d_backward_input(self.conv, grad_conv_out, p.weight, grad),
            InputGrad::AccumulateInto(dst) => {
                conv2d_backward_input_accumulate(self.conv, grad_conv_out, p.weight, dst)
            }
        }
    }

    /// The ReLU's backward in place on `grad` (∂L/∂out → ∂L/∂GN), the mask recomputed from the conv
    /// output: one task per (env, image).
    fn relu_mask<T: Real>(&self, state: BlockState<'_, T>, p: BlockParams<'_, T>, grad: &mut [T]) {
        let c = self.conv;
        let (image, plane, channels, groups) =
            (c.c_out * c.h_out() * c.w_out(), c.h_out() * c.w_out(), c.c_out, self.groups);
        if image == 0 {
            return;
        }
        grad.par_chunks_mut(image).enumerate().for_each(|(i, grad_img)| {
            let e = i / c.batch;
            let stats =
                (&state.mean[i * groups..(i + 1) * groups], &state.inv_std[i * groups..(i + 1) * groups]);
            let (gamma, beta) =
                (&p.gamma[e * channels..(e + 1) * channels], &p.beta[e * channels..(e + 1) * channels]);
            let x_img = &state.conv_out[i * image..(i + 1) * image];
            group_norm_relu_mask_image(plane, gamma, beta, stats, x_img, grad_img);
        });
    }

    /// [`Self::backward`] with at least as many envs as threads: one task per env, its images a run at a
    /// time. The ReLU + norm backward of a run goes into scratch, and the conv's weight gradient and input
    /// gradient are taken from it while it is in cache ([`ConvBackwardRuns`]), so the conv's output
    /// gradient never goes to memory. The same bits as the op-by-op path: each image's ReLU + norm
    /// backward is `relu_group_norm_backward`'s, the parameter sums carry across the env's images in order,
    /// and the weight gradient is `conv2d_backward_weight`'s whole-env job fed run after run.
    fn backward_in_runs<T: Real>(
        &self,
        state: BlockState<'_, T>,
        p: BlockParams<'_, T>,
        grad_out: UnitOutputGrad<'_, T>,
        grad: &mut [T],
        g: BlockGrads<'_, T>,
        input_grad: InputGrad<'_, T>,
    ) {
        let c = self.conv;
        let (image_in, image_out) = (c.c_in * c.h * c.w, c.c_out * c.h_out() * c.w_out());
        let (groups, channels, plane) = (self.groups, c.c_out, c.h_out() * c.w_out());
        assert_eq!(grad.len(), c.output_len(), "unit gradient length");
        let runs = ConvBackwardRuns::new(&c);
        let run = runs.run_images().min(c.batch.max(1));
        let w_env = c.weight_len_per_env();
        let scratch_len = (run + 1) * image_out + 2 * channels * LANES + runs.scratch_len();
        let into_grad = matches!(input_grad, InputGrad::IntoGrad);
        if into_grad {
            assert_eq!(image_in, image_out, "the input gradient goes into the output-sized buffer");
        }
        let accumulate_into = match input_grad {
            InputGrad::AccumulateInto(dst) => {
                assert_eq!(dst.len(), c.input_len(), "unit input gradient length");
                Either::Left(dst.par_chunks_mut(c.batch * image_in).map(Some))
            }
            _ => Either::Right((0..c.envs).into_par_iter().map(|_| None)),
        };
        grad.par_chunks_mut(c.batch * image_out)
            .zip(g.weight.par_chunks_mut(w_env))
            .zip(g.gamma.par_chunks_mut(channels).zip(g.beta.par_chunks_mut(channels)))
            .zip(accumulate_into)
            .enumerate()
            .for_each(|(e, (((grad_env, d_weight), (d_gamma, d_beta)), mut dst_env))| {
                let weight = &p.weight[e * w_env..(e + 1) * w_env];
                let gamma = &p.gamma[e * channels..(e + 1) * channels];
                let beta = &p.beta[e * channels..(e + 1) * channels];
                T::with_scratch(scratch_len, |scratch| {
                    let (dy_runs, rest) = scratch.split_at_mut(run * image_out);
                    let (dy_img, rest) = rest.split_at_mut(image_out);
                    let (norm_lanes, conv_scratch) = rest.split_at_mut(2 * channels * LANES);
                    norm_lanes.fill(T::ZERO);
                    runs.begin(conv_scratch);
                    for b0 in (0..c.batch).step_by(run) {
                        let n = run.min(c.batch - b0);
                        let dy_run = &mut dy_runs[..n * image_out];
                        for (r, dy_conv) in dy_run.chunks_exact_mut(image_out).enumerate() {
                            let (b, i) = (b0 + r, e * c.batch + b0 + r);
                            let image = i * image_out..(i + 1) * image_out;
                            match grad_out {
                                UnitOutputGrad::InGrad => {
                                    dy_img.copy_from_slice(&grad_env[b * image_out..(b + 1) * image_out])
                                }
                                UnitOutputGrad::Whole(grad_out) => {
                                    dy_img.copy_from_slice(&grad_out[image.clone()])
                                }
                                UnitOutputGrad::Pooled(pooled) => pooled.write_image(&c, i, dy_img),
                            }
                            let stats = (
                                &state.mean[i * groups..(i + 1) * groups],
                                &state.inv_std[i * groups..(i + 1) * groups],
                            );
                            let x_img = &state.conv_out[image];
                            group_norm_relu_mask_image(plane, gamma, beta, stats, x_img, dy_img);
                            group_norm_image_backward_carried(
                                plane, gamma, stats, x_img, dy_img, norm_lanes, dy_conv,
                            );
                        }
                        let x0 = (e * c.batch + b0) * image_in;
                        let x_run = &state.input[x0..x0 + n * image_in];
                        let dx = if into_grad {
                            Some((&mut grad_env[b0 * image_out..(b0 + n) * image_out], false))
                        } else {
                            dst_env.as_deref_mut().map(|d| (&mut d[b0 * image_in..(b0 + n) * image_in], true))
                        };
                        runs.add_run(x_run, dy_run, weight, dx, conv_scratch);
                    }
                    runs.finish(conv_scratch, d_weight);
                    group_norm_param_grads(norm_lanes, d_gamma, d_beta);
                });
            });
    }
}
