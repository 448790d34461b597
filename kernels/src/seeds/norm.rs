//! norm (action 3): `y = x + tanh(λ)·(GN(x) − x)`, a learned blend towards the group-normalised input.
//! `λ` is a scalar initialised to 0, so the seed is an identity at birth (with every blend algorithm).
//!
//! Row layout (`P = 2C + 1`):
//!
//! | tensor | shape | offset | init |
//! |---|---|---|---|
//! | `norm.weight` (γ) | `[C]` | 0 | 1 |
//! | `norm.bias` (β) | `[C]` | C | 0 |
//! | `scale` (λ) | `[1]` | 2C | 0 |
//!
//! Buffers: `saved[0]` = `GN(x)`, `stats[0..2]` = its mean / inv_std; backward temporaries `temp[0]` =
//! `tanh(λ)·∂L/∂y`, `temp[1]` = the norm's input gradient when the caller wants none, `temp[2]` = the
//! per-image partial sums of `∂L/∂λ`.

use rayon::prelude::*;

use super::common::{Buffers, grown};
use super::layout::ParamLayout;
use super::{SeedShape, Tensors, TensorsMut, group_norm_groups};
use crate::ops::real::LaneSums;
use crate::ops::{Real, group_norm_backward, group_norm_forward};

pub(super) fn layout(channels: usize) -> ParamLayout {
    ParamLayout::builder().group_norm("norm.weight", "norm.bias", channels).constant("scale", 1, 0.0).build()
}

pub(super) fn forward<T: Real>(s: SeedShape, p: Tensors<'_, T>, x: &[T], y: &mut [T], b: &mut Buffers<T>) {
    let [gamma, beta, lambda, ..] = p;
    let groups = group_norm_groups(s.channels);
    let Buffers { saved, stats, .. } = b;
    let [mean, inv_std, ..] = stats;
    let normed = grown(&mut saved[0], s.len());
    let n_stats = s.samples() * groups;
    group_norm_forward(
        s.norm(s.channels),
        groups,
        x,
        gamma,
        beta,
        normed,
        grown(mean, n_stats),
        grown(inv_std, n_stats),
    );
    let image = s.channels * s.plane();
    y.par_chunks_mut(image).zip(x.par_chunks(image).zip(normed.par_chunks(image))).enumerate().for_each(
        |(i, (y, (x, n)))| {
            let t = lambda[i / s.batch].tanh();
            for ((out, &v), &nv) in y.iter_mut().zip(x).zip(n) {
                *out = v + t * (nv - v);
            }
        },
    );
}

/// `∂L/∂λ = (1 − tanh²λ)·Σ ∂L/∂y·(GN(x) − x)`, `∂L/∂GN(x) = tanh(λ)·∂L/∂y`, and
/// `∂L/∂x = (1 − tanh λ)·∂L/∂y + GN'ᵀ·(tanh(λ)·∂L/∂y)`.
pub(super) fn backward<T: Real>(
    s: SeedShape,
    p: Tensors<'_, T>,
    x: &[T],
    grad_y: &[T],
    g: TensorsMut<'_, T>,
    grad_x: Option<&mut [T]>,
    b: &mut Buffers<T>,
) {
    let [gamma, _, lambda, ..] = p;
    let [d_gamma, d_beta, d_lambda, ..] = g;
    let groups = group_norm_groups(s.channels);
    let Buffers { saved, stats, temp } = b;
    let [scaled_grad, norm_dx, partials] = temp;
    let n_stats = s.samples() * groups;
    let normed = &saved[0][..s.len()];
    let (mean, inv_std) = (&stats[0][..n_stats], &stats[1][..n_stats]);
    let image = s.channels * s.plane();

    // λ: one fixed-order sum per image, then the env's images in order.
    let partials = grown(partials, s.samples());
    partials.par_iter_mut().enumerate().for_each(|(i, out)| {
        let r = i * image..(i + 1) * image;
        let mut sum = LaneSums::new();
        sum.add_zip3(&grad_y[r.clone()], &normed[r.clone()], &x[r], |d, n, v| d * (n - v));
        *out = sum.total();
    });
    for (e, d) in d_lambda.iter_mut().enumerate() {
        let t = lambda[e].tanh();
        let total = partials[e * s.batch..(e + 1) * s.batch].iter().fold(T::ZERO, |acc, &v| acc + v);
        *d = (T::ONE - t * t) * total;
    }

    let scaled_grad = grown(scaled_grad, s.len());
    scaled_grad.par_chunks_mut(image).zip(grad_y.par_chunks(image)).enumerate().for_each(|(i, (out, dy))| {
        let t = lambda[i / s.batch].tanh();
        for (o, &d) in out.iter_mut().zip(dy) {
            *o = t * d;
        }
    });
    let norm_shape = s.norm(s.channels);
    match grad_x {
        Some(gx) => {
            group_norm_backward(
                norm_shape,
                groups,
                x,
                gamma,
                mean,
                inv_std,
                scaled_grad,
                gx,
                d_gamma,
                d_beta,
            );
            gx.par_chunks_mut(image).zip(grad_y.par_chunks(image)).enumerate().for_each(|(i, (gx, dy))| {
                let keep = T::ONE - lambda[i / s.batch].tanh();
                for (o, &d) in gx.iter_mut().zip(dy) {
                    *o += keep * d;
                }
            });
        }
        None => {
            let norm_dx = grown(norm_dx, s.len());
            group_norm_backward(
                norm_shape,
                groups,
                x,
                gamma,
                mean,
                inv_std,
                scaled_grad,
                norm_dx,
                d_gamma,
                d_beta,
            );
        }
    }
}
