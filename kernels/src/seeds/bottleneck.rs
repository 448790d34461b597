//! bottleneck (action 5): `y = x + GN(UP(relu(CONV(relu(DOWN(x))))))` with `b = max(8, C/4)`: DOWN a 1×1
//! conv C → b, CONV a 3×3 conv b → b (pad 1), UP a 1×1 conv b → C, all without bias. UP is born zero, so
//! GN sees zeros and gives β = 0: an exact identity at birth (UP is also the last conv, so MULTIPLY changes
//! nothing).
//!
//! Row layout (`P = 2·C·b + 9b² + 2C`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `down.weight` | `[b, C, 1, 1]` | 0 | `U(±1/√C)` |
//! | `conv.weight` | `[b, b, 3, 3]` | bC | `U(±1/√(9b))` |
//! | `up.weight` | `[C, b, 1, 1]` | bC + 9b² | 0 |
//! | `norm.weight` (γ) | `[C]` | 2bC + 9b² | 1 |
//! | `norm.bias` (β) | `[C]` | 2bC + 9b² + C | 0 |
//!
//! Buffers: `saved[0]` = `relu(DOWN(x))`, `saved[1]` = `relu(CONV(…))` (both b channels), `saved[2]` =
//! `UP(…)` (C channels), `stats[0..2]` = the norm's mean / inv_std; backward temporaries `temp[0]`,
//! `temp[1]` (the gradient as it moves down the chain).

use super::common::{Buffers, grown};
use super::layout::ParamLayout;
use super::{SeedShape, Tensors, TensorsMut, group_norm_groups};
use crate::ops::{
    Conv2dShape, Real, add_in_place, conv2d_backward_input, conv2d_backward_input_accumulate,
    conv2d_backward_weight, conv2d_forward, group_norm_backward, group_norm_forward, relu_backward_in_place,
    relu_forward_in_place,
};

/// Bottleneck width `b = max(8, C/4)`.
pub(crate) fn width(channels: usize) -> usize {
    (channels / 4).max(8)
}

pub(super) fn layout(channels: usize) -> ParamLayout {
    let b = width(channels);
    ParamLayout::builder()
        .uniform("down.weight", b * channels, channels)
        .uniform("conv.weight", b * b * 9, b * 9)
        .constant("up.weight", channels * b, 0.0)
        .last_layer()
        .group_norm("norm.weight", "norm.bias", channels)
        .build()
}

struct Shapes {
    down: Conv2dShape,
    conv: Conv2dShape,
    up: Conv2dShape,
    groups: usize,
}

fn shapes(s: SeedShape) -> Shapes {
    let (c, b) = (s.channels, width(s.channels));
    Shapes {
        down: s.conv(c, b, 1, 1),
        conv: s.conv(b, b, 3, 1),
        up: s.conv(b, c, 1, 1),
        groups: group_norm_groups(c),
    }
}

pub(super) fn forward<T: Real>(s: SeedShape, p: Tensors<'_, T>, x: &[T], y: &mut [T], b: &mut Buffers<T>) {
    let [w_down, w_conv, w_up, gamma, beta, ..] = p;
    let sh = shapes(s);
    let Buffers { saved, stats, .. } = b;
    let [down_out, conv_out, up_out, _] = saved;
    let [mean, inv_std, ..] = stats;
    let narrow = s.activation_len(width(s.channels));
    let n_stats = s.samples() * sh.groups;

    let down_out = grown(down_out, narrow);
    conv2d_forward(sh.down, x, w_down, down_out);
    relu_forward_in_place(down_out);
    let conv_out = grown(conv_out, narrow);
    conv2d_forward(sh.conv, down_out, w_conv, conv_out);
    relu_forward_in_place(conv_out);
    let up_out = grown(up_out, s.len());
    conv2d_forward(sh.up, conv_out, w_up, up_out);
    let (mean, inv_std) = (grown(mean, n_stats), grown(inv_std, n_stats));
    group_norm_forward(s.norm(s.channels), sh.groups, up_out, gamma, beta, y, mean, inv_std);
    add_in_place(y, x);
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
    let [w_down, w_conv, w_up, gamma, ..] = p;
    let [d_down, d_conv, d_up, d_gamma, d_beta, ..] = g;
    let sh = shapes(s);
    let Buffers { saved, stats, temp } = b;
    let narrow = s.activation_len(width(s.channels));
    let n_stats = s.samples() * sh.groups;
    let down_out = &saved[0][..narrow];
    let conv_out = &saved[1][..narrow];
    let up_out = &saved[2][..s.len()];
    let (mean, inv_std) = (&stats[0][..n_stats], &stats[1][..n_stats]);
    let [first, second, _] = temp;

    let d_up_out = grown(first, s.len().max(narrow));
    group_norm_backward(
        s.norm(s.channels),
        sh.groups,
        up_out,
        gamma,
        mean,
        inv_std,
        grad_y,
        &mut d_up_out[..s.len()],
        d_gamma,
        d_beta,
    );
    conv2d_backward_weight(sh.up, conv_out, &d_up_out[..s.len()], d_up);
    let d_conv_out = grown(second, narrow);
    conv2d_backward_input(sh.up, &d_up_out[..s.len()], w_up, d_conv_out);
    relu_backward_in_place(conv_out, d_conv_out);
    conv2d_backward_weight(sh.conv, down_out, d_conv_out, d_conv);
    let d_down_out = &mut d_up_out[..narrow];
    conv2d_backward_input(sh.conv, d_conv_out, w_conv, d_down_out);
    relu_backward_in_place(down_out, d_down_out);
    conv2d_backward_weight(sh.down, x, d_down_out, d_down);
    if let Some(gx) = grad_x {
        gx.copy_from_slice(grad_y);
        conv2d_backward_input_accumulate(sh.down, d_down_out, w_down, gx);
    }
}
