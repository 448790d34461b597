//! attention (action 2), squeeze-excite: `y = x · σ(W2·relu(W1·GAP(x)) + b2)` per (image, channel), with
//! `W1: C → r` (no bias), `W2: r → C` (with bias), `r = max(1, C/4)`. Born with `W2 = 0`, `b2 = 3`, so
//! `y = σ(3)·x ≈ 0.9526·x` (not an identity); with MULTIPLY `W2` and `b2` are zeroed, giving `0.5·x`.
//!
//! Row layout (`P = 2·C·r + C`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `fc1.weight` (W1) | `[r, C]` | 0 | `U(±1/√C)` |
//! | `fc2.weight` (W2) | `[C, r]` | r·C | 0 (MULTIPLY: 0) |
//! | `fc2.bias` (b2) | `[C]` | 2·r·C | 3 (MULTIPLY: 0) |
//!
//! Buffers: `saved[0]` = `GAP(x)` `[Eb, B, C]`, `saved[1]` = the ReLU output `[Eb, B, r]`, `saved[2]` =
//! the channel scale `σ(…)` `[Eb, B, C]`; backward temporaries `temp[0]` = ∂L/∂logits, `temp[1]` =
//! ∂L/∂hidden, `temp[2]` = ∂L/∂GAP(x).

use rayon::prelude::*;

use super::common::{Buffers, grown, scale_planes, scale_planes_backward_scale};
use super::layout::ParamLayout;
use super::{SeedShape, Tensors, TensorsMut};
use crate::ops::{
    Real, global_avg_pool_backward_accumulate, global_avg_pool_forward, linear_backward_input,
    linear_backward_params, linear_forward, relu_backward_in_place, relu_forward_in_place, sigmoid,
};

/// Squeeze width `r = max(1, C/4)`.
pub(crate) fn reduced(channels: usize) -> usize {
    (channels / 4).max(1)
}

pub(super) fn layout(channels: usize) -> ParamLayout {
    let r = reduced(channels);
    ParamLayout::builder()
        .uniform("fc1.weight", r * channels, channels)
        .constant("fc2.weight", channels * r, 0.0)
        .last_layer()
        .constant("fc2.bias", channels, 3.0)
        .last_layer()
        .build()
}

pub(super) fn forward<T: Real>(s: SeedShape, p: Tensors<'_, T>, x: &[T], y: &mut [T], b: &mut Buffers<T>) {
    let [w1, w2, b2, ..] = p;
    let (c, r) = (s.channels, reduced(s.channels));
    let [pooled, hidden, scale, _] = &mut b.saved;
    let pooled = grown(pooled, s.samples() * c);
    let hidden = grown(hidden, s.samples() * r);
    let scale = grown(scale, s.samples() * c);
    global_avg_pool_forward(s.pool(), x, pooled);
    linear_forward(s.linear(c, r), pooled, w1, None, hidden);
    relu_forward_in_place(hidden);
    linear_forward(s.linear(r, c), hidden, w2, Some(b2), scale);
    scale.par_iter_mut().for_each(|v| *v = sigmoid(*v));
    scale_planes(s.plane(), x, scale, y);
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
    let [w1, w2, ..] = p;
    let [d_w1, d_w2, d_b2, ..] = g;
    let (c, r) = (s.channels, reduced(s.channels));
    let Buffers { saved, temp, .. } = b;
    let pooled = &saved[0][..s.samples() * c];
    let hidden = &saved[1][..s.samples() * r];
    let scale = &saved[2][..s.samples() * c];
    let [d_logits, d_hidden, d_pooled] = temp;
    let (fc1, fc2) = (s.linear(c, r), s.linear(r, c));

    let d_logits = grown(d_logits, s.samples() * c);
    scale_planes_backward_scale(s.plane(), x, grad_y, d_logits);
    d_logits.par_iter_mut().zip(scale.par_iter()).for_each(|(d, &v)| *d = *d * v * (T::ONE - v));
    linear_backward_params(fc2, hidden, d_logits, d_w2, Some(d_b2));
    let d_hidden = grown(d_hidden, s.samples() * r);
    linear_backward_input(fc2, d_logits, w2, d_hidden);
    relu_backward_in_place(hidden, d_hidden);
    linear_backward_params(fc1, pooled, d_hidden, d_w1, None);
    if let Some(gx) = grad_x {
        let d_pooled = grown(d_pooled, s.samples() * c);
        linear_backward_input(fc1, d_hidden, w1, d_pooled);
        // x feeds the product directly and through the pooled squeeze.
        scale_planes(s.plane(), grad_y, scale, gx);
        global_avg_pool_backward_accumulate(s.pool(), d_pooled, gx);
    }
}
