//! The GatedBlend gate (kasmina §4.4): a per-sample scalar
//! `g(x) = σ(W2·relu(W1·GAP(x) + b1) + b2)` with `Linear(C → hidden)`, `Linear(hidden → 1)`,
//! `hidden = max(8, C/4)`, default init. The GATE blend uses it as `a_eff = clamp01(a)·clamp01(g)`.
//! It is not a Linear/Conv of the seed, so MULTIPLY never zeroes it (a GATE seed is never MULTIPLY).
//!
//! Row layout (`P = hidden·(C + 2) + 1`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `fc1.weight` (W1) | `[hidden, C]` | 0 | `U(±1/√C)` |
//! | `fc1.bias` (b1) | `[hidden]` | hidden·C | `U(±1/√C)` |
//! | `fc2.weight` (W2) | `[1, hidden]` | hidden·(C + 1) | `U(±1/√hidden)` |
//! | `fc2.bias` (b2) | `[1]` | hidden·(C + 2) | `U(±1/√hidden)` |

use rayon::prelude::*;

use super::SeedShape;
use super::common::grown;
use super::layout::ParamLayout;
use crate::ops::{
    Real, global_avg_pool_backward, global_avg_pool_forward, linear_backward_input, linear_backward_params,
    linear_forward, relu_backward_in_place, relu_forward_in_place, sigmoid,
};
use crate::rng::Stream;

/// Gate hidden width `max(8, C/4)`.
pub fn gate_hidden(channels: usize) -> usize {
    (channels / 4).max(8)
}

/// The gate's packed parameter layout at `channels`.
pub fn gate_layout(channels: usize) -> ParamLayout {
    assert!(channels > 0, "a gate needs channels");
    let hidden = gate_hidden(channels);
    ParamLayout::builder()
        .uniform("fc1.weight", hidden * channels, channels)
        .uniform("fc1.bias", hidden, channels)
        .uniform("fc2.weight", hidden, hidden)
        .uniform("fc2.bias", 1, hidden)
        .build()
}

/// Parameters of one env's gate: `hidden·(C + 2) + 1`.
pub fn gate_param_count(channels: usize) -> usize {
    gate_layout(channels).param_count()
}

/// Writes a freshly born gate into `row` (`gate_param_count(channels)` elements) from `stream`.
pub fn gate_init_row<T: Real>(channels: usize, stream: &mut Stream, row: &mut [T]) {
    gate_layout(channels).init_row(false, stream, row);
}

/// Reusable buffers of one gathered gate: staged parameters, their gradients, and the activations the
/// backward reads. Grows to the largest shape seen, never shrinks.
#[derive(Debug, Default)]
pub struct GateWorkspace<T> {
    params: Vec<T>,
    grads: Vec<T>,
    /// `GAP(x)` `[Eb, B, C]`.
    pooled: Vec<T>,
    /// `relu(W1·pooled + b1)` `[Eb, B, hidden]`.
    hidden: Vec<T>,
    /// `g` `[Eb, B]`.
    gate: Vec<T>,
    d_logit: Vec<T>,
    d_hidden: Vec<T>,
    d_pooled: Vec<T>,
    last_forward: Option<SeedShape>,
}

impl<T: Real> GateWorkspace<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Elements currently reserved.
    pub fn capacity(&self) -> usize {
        [&self.params, &self.grads, &self.pooled, &self.hidden, &self.gate]
            .into_iter()
            .chain([&self.d_logit, &self.d_hidden, &self.d_pooled])
            .map(Vec::capacity)
            .sum()
    }
}

/// `g = gate(x)` per sample for a gathered batch: `params` `[Eb, P]`, `x` `[Eb, B, C, H, W]`, `g`
/// `[Eb, B]` (overwritten). Keeps in `ws` what [`gate_backward`] needs.
pub fn gate_forward<T: Real>(
    shape: SeedShape,
    params: &[T],
    x: &[T],
    g: &mut [T],
    ws: &mut GateWorkspace<T>,
) {
    let layout = gate_layout(shape.channels);
    assert_eq!(params.len(), shape.envs * layout.param_count(), "gate params length [Eb, P]");
    assert_eq!(x.len(), shape.len(), "gate input length [Eb, B, C, H, W]");
    assert_eq!(g.len(), shape.samples(), "gate output length [Eb, B]");
    ws.last_forward = Some(shape);
    let staged = grown(&mut ws.params, params.len());
    layout.rows_to_tensors(shape.envs, params, staged);
    let [w1, b1, w2, b2, ..] = layout.split(shape.envs, staged);
    let (c, hidden) = (shape.channels, gate_hidden(shape.channels));
    let pooled = grown(&mut ws.pooled, shape.samples() * c);
    global_avg_pool_forward(shape.pool(), x, pooled);
    let hidden_out = grown(&mut ws.hidden, shape.samples() * hidden);
    linear_forward(shape.linear(c, hidden), pooled, w1, Some(b1), hidden_out);
    relu_forward_in_place(hidden_out);
    let gate = grown(&mut ws.gate, shape.samples());
    linear_forward(shape.linear(hidden, 1), hidden_out, w2, Some(b2), gate);
    gate.par_iter_mut().for_each(|v| *v = sigmoid(*v));
    g.copy_from_slice(gate);
}

/// The gradients of the last [`gate_forward`] (same `shape`) given `grad_g = ∂L/∂g` `[Eb, B]`.
/// Overwrites `grad_params` (`[Eb, P]`) and, when given, `grad_x` (`[Eb, B, C, H, W]`).
pub fn gate_backward<T: Real>(
    shape: SeedShape,
    grad_g: &[T],
    grad_params: &mut [T],
    grad_x: Option<&mut [T]>,
    ws: &mut GateWorkspace<T>,
) {
    assert_eq!(ws.last_forward, Some(shape), "gate backward must follow a gate forward of the same shape");
    let layout = gate_layout(shape.channels);
    let n = shape.envs * layout.param_count();
    assert_eq!(grad_g.len(), shape.samples(), "gate output gradient length [Eb, B]");
    assert_eq!(grad_params.len(), n, "gate parameter gradient length [Eb, P]");
    let (c, hidden) = (shape.channels, gate_hidden(shape.channels));
    let (fc1, fc2) = (shape.linear(c, hidden), shape.linear(hidden, 1));
    let [w1, _, w2, ..] = layout.split(shape.envs, &ws.params[..n]);
    let [d_w1, d_b1, d_w2, d_b2, ..] = layout.split_mut(shape.envs, grown(&mut ws.grads, n));
    let pooled = &ws.pooled[..shape.samples() * c];
    let hidden_out = &ws.hidden[..shape.samples() * hidden];
    let gate = &ws.gate[..shape.samples()];

    let d_logit = grown(&mut ws.d_logit, shape.samples());
    d_logit.par_iter_mut().zip(grad_g.par_iter().zip(gate.par_iter())).for_each(|(d, (&dg, &v))| {
        *d = dg * v * (T::ONE - v);
    });
    linear_backward_params(fc2, hidden_out, d_logit, d_w2, Some(d_b2));
    let d_hidden = grown(&mut ws.d_hidden, shape.samples() * hidden);
    linear_backward_input(fc2, d_logit, w2, d_hidden);
    relu_backward_in_place(hidden_out, d_hidden);
    linear_backward_params(fc1, pooled, d_hidden, d_w1, Some(d_b1));
    if let Some(gx) = grad_x {
        assert_eq!(gx.len(), shape.len(), "gate input gradient length [Eb, B, C, H, W]");
        let d_pooled = grown(&mut ws.d_pooled, shape.samples() * c);
        linear_backward_input(fc1, d_hidden, w1, d_pooled);
        global_avg_pool_backward(shape.pool(), d_pooled, gx);
    }
    layout.tensors_to_rows(shape.envs, &ws.grads[..n], grad_params);
}
