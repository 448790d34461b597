//! The plain conv seeds, built from conv → GN → ReLU units:
//!
//! * conv_small (action 6): `y = x + relu(GN(CONV1×1(x)))`, the conv zero-initialised: identity at birth.
//! * conv_light (action 1): `y = x + relu(GN(CONV3×3(x)))`, pad 1: not an identity at birth.
//! * conv_heavy (action 7): `y = x + B2(B1(x))`, each `Bk = relu(GN(CONV3×3))`: not an identity at birth.
//!
//! With MULTIPLY the last conv (`conv`, resp. `conv2`) is zeroed, so the last norm sees zeros, gives
//! β = 0, and every one of them is an exact identity. No conv has a bias.
//!
//! Row layouts (`k = 1` for conv_small, `3` for conv_light; `P = k²C² + 2C`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `conv.weight` | `[C, C, k, k]` | 0 | small: 0; light: `U(±1/√(9C))` (MULTIPLY: 0) |
//! | `norm.weight` (γ) | `[C]` | k²C² | 1 |
//! | `norm.bias` (β) | `[C]` | k²C² + C | 0 |
//!
//! conv_heavy (`P = 18C² + 4C`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `conv1.weight` | `[C, C, 3, 3]` | 0 | `U(±1/√(9C))` |
//! | `norm1.weight` (γ) | `[C]` | 9C² | 1 |
//! | `norm1.bias` (β) | `[C]` | 9C² + C | 0 |
//! | `conv2.weight` | `[C, C, 3, 3]` | 9C² + 2C | `U(±1/√(9C))` (MULTIPLY: 0) |
//! | `norm2.weight` (γ) | `[C]` | 18C² + 2C | 1 |
//! | `norm2.bias` (β) | `[C]` | 18C² + 3C | 0 |
//!
//! Buffers: per unit `k` (0-based) `saved[2k]` = its conv output, `saved[2k + 1]` = its ReLU output
//! (kept for conv_heavy's first unit only, the second unit's input: the backward recomputes the ReLU's
//! mask from the conv output),
//! `stats[2k..2k + 2]` = its norm's mean / inv_std; backward temporaries `temp[0]` (the running
//! gradient), `temp[1]` (scratch).

use super::block::{BlockGrads, BlockParams, BlockState, ConvNormRelu, InputGrad, Residual, UnitOutputGrad};
use super::common::{Buffers, grown};
use super::layout::ParamLayout;
use super::{SeedOutputGrad, SeedShape, Tensors, TensorsMut, group_norm_groups};
use crate::ops::Real;

pub(super) fn small_layout(channels: usize) -> ParamLayout {
    ParamLayout::builder()
        .constant("conv.weight", channels * channels, 0.0)
        .last_layer()
        .group_norm("norm.weight", "norm.bias", channels)
        .build()
}

pub(super) fn light_layout(channels: usize) -> ParamLayout {
    ParamLayout::builder()
        .uniform("conv.weight", channels * channels * 9, channels * 9)
        .last_layer()
        .group_norm("norm.weight", "norm.bias", channels)
        .build()
}

pub(super) fn heavy_layout(channels: usize) -> ParamLayout {
    ParamLayout::builder()
        .uniform("conv1.weight", channels * channels * 9, channels * 9)
        .group_norm("norm1.weight", "norm1.bias", channels)
        .uniform("conv2.weight", channels * channels * 9, channels * 9)
        .last_layer()
        .group_norm("norm2.weight", "norm2.bias", channels)
        .build()
}

/// A size- and channel-preserving unit with a `k × k` conv.
fn unit(s: SeedShape, k: usize) -> ConvNormRelu {
    ConvNormRelu { conv: s.conv(s.channels, s.channels, k, 1), groups: group_norm_groups(s.channels) }
}

pub(super) fn single_forward<T: Real>(
    s: SeedShape,
    k: usize,
    p: Tensors<'_, T>,
    x: &[T],
    y: &mut [T],
    blend: Option<&[T]>,
    b: &mut Buffers<T>,
) {
    let [weight, gamma, beta, ..] = p;
    let unit = unit(s, k);
    let Buffers { saved, stats, .. } = b;
    let [conv_out, ..] = saved;
    let [mean, inv_std, ..] = stats;
    let n_stats = unit.stats_len();
    unit.forward(
        x,
        BlockParams { weight, gamma, beta },
        grown(conv_out, s.len()),
        None,
        grown(mean, n_stats),
        grown(inv_std, n_stats),
        Some(Residual { skip: x, y, blend }),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn single_backward<T: Real>(
    s: SeedShape,
    k: usize,
    p: Tensors<'_, T>,
    x: &[T],
    grad_y: SeedOutputGrad<'_, T>,
    g: TensorsMut<'_, T>,
    grad_x: Option<&mut [T]>,
    b: &mut Buffers<T>,
) {
    let [weight, gamma, beta, ..] = p;
    let [d_weight, d_gamma, d_beta, ..] = g;
    let unit = unit(s, k);
    let Buffers { saved, stats, temp } = b;
    let n_stats = unit.stats_len();
    let state = BlockState {
        input: x,
        conv_out: &saved[0][..s.len()],
        mean: &stats[0][..n_stats],
        inv_std: &stats[1][..n_stats],
    };
    let [grad, scratch, _] = temp;
    let grad = grown(grad, s.len());
    unit.backward(
        state,
        BlockParams { weight, gamma, beta },
        grad_y.unit(),
        grad,
        grown(scratch, s.len()),
        BlockGrads { weight: d_weight, gamma: d_gamma, beta: d_beta },
        residual_input_grad(grad_y, grad_x),
    );
}

pub(super) fn heavy_forward<T: Real>(
    s: SeedShape,
    p: Tensors<'_, T>,
    x: &[T],
    y: &mut [T],
    blend: Option<&[T]>,
    b: &mut Buffers<T>,
) {
    let [w1, gamma1, beta1, w2, gamma2, beta2] = p;
    let unit = unit(s, 3);
    let Buffers { saved, stats, .. } = b;
    let [conv1_out, out1, conv2_out, _] = saved;
    let [mean1, inv_std1, mean2, inv_std2] = stats;
    let n_stats = unit.stats_len();
    let out1 = grown(out1, s.len());
    unit.forward(
        x,
        BlockParams { weight: w1, gamma: gamma1, beta: beta1 },
        grown(conv1_out, s.len()),
        Some(&mut *out1),
        grown(mean1, n_stats),
        grown(inv_std1, n_stats),
        None,
    );
    // The residual is around both units: `y = x + B2(B1(x))`.
    unit.forward(
        out1,
        BlockParams { weight: w2, gamma: gamma2, beta: beta2 },
        grown(conv2_out, s.len()),
        None,
        grown(mean2, n_stats),
        grown(inv_std2, n_stats),
        Some(Residual { skip: x, y, blend }),
    );
}

pub(super) fn heavy_backward<T: Real>(
    s: SeedShape,
    p: Tensors<'_, T>,
    x: &[T],
    grad_y: SeedOutputGrad<'_, T>,
    g: TensorsMut<'_, T>,
    grad_x: Option<&mut [T]>,
    b: &mut Buffers<T>,
) {
    let [w1, gamma1, beta1, w2, gamma2, beta2] = p;
    let [d_w1, d_gamma1, d_beta1, d_w2, d_gamma2, d_beta2] = g;
    let unit = unit(s, 3);
    let Buffers { saved, stats, temp } = b;
    let (len, n_stats) = (s.len(), unit.stats_len());
    let out1 = &saved[1][..len];
    let state1 = BlockState {
        input: x,
        conv_out: &saved[0][..len],
        mean: &stats[0][..n_stats],
        inv_std: &stats[1][..n_stats],
    };
    let state2 = BlockState {
        input: out1,
        conv_out: &saved[2][..len],
        mean: &stats[2][..n_stats],
        inv_std: &stats[3][..n_stats],
    };
    let [grad, scratch, _] = temp;
    let (grad, scratch) = (grown(grad, len), grown(scratch, len));
    unit.backward(
        state2,
        BlockParams { weight: w2, gamma: gamma2, beta: beta2 },
        grad_y.unit(),
        grad,
        scratch,
        BlockGrads { weight: d_w2, gamma: d_gamma2, beta: d_beta2 },
        InputGrad::IntoGrad,
    );
    // `grad` now holds ∂L/∂B1(x).
    unit.backward(
        state1,
        BlockParams { weight: w1, gamma: gamma1, beta: beta1 },
        UnitOutputGrad::InGrad,
        grad,
        scratch,
        BlockGrads { weight: d_w1, gamma: d_gamma1, beta: d_beta1 },
        residual_input_grad(grad_y, grad_x),
    );
}

/// The input gradient of `x + f(x)`: starts as `∂L/∂y` (the identity path), `f`'s part is added to it.
fn residual_input_grad<'a, T: Real>(
    grad_y: SeedOutputGrad<'_, T>,
    grad_x: Option<&'a mut [T]>,
) -> InputGrad<'a, T> {
    match (grad_x, grad_y) {
        (Some(gx), SeedOutputGrad::Whole(grad_y)) => {
            gx.copy_from_slice(grad_y);
            InputGrad::AccumulateInto(gx)
        }
        (Some(_), SeedOutputGrad::Pooled(_)) => {
            unreachable!("backward_from: a pooled gradient has no grad_x")
        }
        (None, _) => InputGrad::Skip,
    }
}
