//! depthwise (action 4): `y = x + relu(GN(PW(DW(x))))`, DW a 3×3 depthwise conv (groups = C, pad 1), PW
//! a 1×1 conv C → C, both without bias. Not an identity at birth (random PW); with MULTIPLY the pointwise
//! conv (the last conv) is zeroed, so GN sees zeros, gives β = 0, and the seed is an exact identity.
//!
//! Row layout (`P = C² + 11C`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `depthwise.weight` | `[C, 1, 3, 3]` | 0 | `U(±1/3)` (fan_in 9) |
//! | `pointwise.weight` | `[C, C, 1, 1]` | 9C | `U(±1/√C)` (MULTIPLY: 0) |
//! | `norm.weight` (γ) | `[C]` | 9C + C² | 1 |
//! | `norm.bias` (β) | `[C]` | 10C + C² | 0 |
//!
//! Buffers: `saved[0]` = `DW(x)`, `saved[1]` = `PW(DW(x))` (the ReLU's output is not kept: the backward
//! recomputes its mask from `saved[1]`), `stats[0..2]` = the norm's mean / inv_std; backward temporaries `temp[0]` (the running gradient), `temp[1]` (scratch).

use super::block::{BlockGrads, BlockParams, BlockState, ConvNormRelu, InputGrad, Residual, UnitOutputGrad};
use super::common::{Buffers, grown};
use super::layout::ParamLayout;
use super::{SeedShape, Tensors, TensorsMut, group_norm_groups};
use crate::ops::{
    Conv2dShape, Real, conv2d_backward_input_accumulate, conv2d_backward_weight, conv2d_forward,
};

pub(super) fn layout(channels: usize) -> ParamLayout {
    ParamLayout::builder()
        .uniform("depthwise.weight", channels * 9, 9)
        .uniform("pointwise.weight", channels * channels, channels)
        .last_layer()
        .group_norm("norm.weight", "norm.bias", channels)
        .build()
}

fn shapes(s: SeedShape) -> (Conv2dShape, ConvNormRelu) {
    let c = s.channels;
    let pointwise = ConvNormRelu { conv: s.conv(c, c, 1, 1), groups: group_norm_groups(c) };
    (s.conv(c, c, 3, c), pointwise)
}

pub(super) fn forward<T: Real>(
    s: SeedShape,
    p: Tensors<'_, T>,
    x: &[T],
    y: &mut [T],
    blend: Option<&[T]>,
    b: &mut Buffers<T>,
) {
    let [w_dw, w_pw, gamma, beta, ..] = p;
    let (depthwise, pointwise) = shapes(s);
    let Buffers { saved, stats, .. } = b;
    let [dw_out, pw_out, ..] = saved;
    let [mean, inv_std, ..] = stats;
    let dw_out = grown(dw_out, s.len());
    conv2d_forward(depthwise, x, w_dw, dw_out);
    pointwise.forward(
        dw_out,
        BlockParams { weight: w_pw, gamma, beta },
        grown(pw_out, s.len()),
        None,
        grown(mean, pointwise.stats_len()),
        grown(inv_std, pointwise.stats_len()),
        Some(Residual { skip: x, y, blend }),
    );
}

pub(super) fn backward<T: Real>(
    s: SeedShape,
    p: Tensors<'_, T>,
    x: &[T],
    grad_y: &[T],
    g: TensorsMut<'_, T>,
    grad_x: Option<&mut [T]>,
    b: &mut Buffers<T>,
) {
    let [w_dw, w_pw, gamma, beta, ..] = p;
    let [d_dw, d_pw, d_gamma, d_beta, ..] = g;
    let (depthwise, pointwise) = shapes(s);
    let Buffers { saved, stats, temp } = b;
    let n_stats = pointwise.stats_len();
    let dw_out = &saved[0][..s.len()];
    let state = BlockState {
        input: dw_out,
        conv_out: &saved[1][..s.len()],
        mean: &stats[0][..n_stats],
        inv_std: &stats[1][..n_stats],
    };
    let [grad, scratch, _] = temp;
    let grad = grown(grad, s.len());
    pointwise.backward(
        state,
        BlockParams { weight: w_pw, gamma, beta },
        UnitOutputGrad::Whole(grad_y),
        grad,
        grown(scratch, s.len()),
        BlockGrads { weight: d_pw, gamma: d_gamma, beta: d_beta },
        InputGrad::IntoGrad,
    );
    // `grad` now holds ∂L/∂DW(x).
    conv2d_backward_weight(depthwise, x, grad, d_dw);
    if let Some(gx) = grad_x {
        gx.copy_from_slice(grad_y);
        conv2d_backward_input_accumulate(depthwise, grad, w_dw, gx);
    }
}
