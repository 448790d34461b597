//! SGD with momentum and weight decay, and per-env gradient clipping, over parameters stacked by env.
//!
//! Every tensor is a flat `[E, n]` buffer. SGD is element-wise, so one update over the stack equals E
//! independent PyTorch optimizers; clipping needs per-env norms, reduced over every axis but the env axis.
//! Semantics of the reference (spec kasmina §5.2, §8.2):
//! * a parameter group with no gradient this step (a GERMINATED seed, frozen seed parameters during a
//!   blend-out, gate parameters before fossilization) is skipped entirely — no momentum, no weight-decay
//!   move — which is what PyTorch does for parameters whose `.grad` is None;
//! * momentum buffers are reset (zeroed) at germinate, fossilize and rollback: PyTorch's first step
//!   after a reset sets `buf = g`, identical to `buf = 0.9·0 + g`;
//! * clipping is `clip_grad_norm_(params, 1.0)`: `g ← g · min(1, max_norm / (‖g‖ + 1e-6))`.

use crate::ops::Real;
use rayon::prelude::*;

/// One optimizer's hyperparameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    pub lr: f64,
    pub momentum: f64,
    pub weight_decay: f64,
}

impl SgdConfig {
    /// The host optimizer of the RL loop: lr 0.01, momentum 0.9, weight decay 5e-4.
    pub const HOST: SgdConfig = SgdConfig { lr: 0.01, momentum: 0.9, weight_decay: 5e-4 };
    /// Each slot's seed optimizer: lr 0.01, momentum 0.9, no weight decay.
    pub const SEED: SgdConfig = SgdConfig { lr: 0.01, momentum: 0.9, weight_decay: 0.0 };
}

/// Max global L2 norm per env and parameter set (`TrainingConfig.max_grad_norm`).
pub const MAX_GRAD_NORM: f64 = 1.0;

/// Add each env's sum of squared gradients over `grad` (`[E, n]`) into `sq_norms[e]`. Per env the sum
/// runs sequentially in f64, so it is exact to f64 rounding and independent of threads and env count.
pub fn accumulate_sq_norms<T: Real>(grad: &[T], sq_norms: &mut [f64]) {
    let n_envs = sq_norms.len();
    assert_eq!(grad.len() % n_envs.max(1), 0, "gradient length is not a multiple of the env count");
    if n_envs == 0 {
        return;
    }
    let per_env = grad.len() / n_envs;
    sq_norms.par_iter_mut().zip(grad.par_chunks(per_env.max(1))).for_each(|(acc, g)| {
        let mut s = 0.0f64;
        for &v in g {
            let v = v.to_f64();
            s += v * v;
        }
        *acc += s;
    });
}

/// The factor `clip_grad_norm_` multiplies gradients by for a total norm `norm`:
/// `clamp(max_norm / (norm + 1e-6), max = 1)`. As `torch.clamp`, a NaN passes through (a NaN norm makes
/// every gradient of the set NaN, and the governor sees the diverged env); `f64::min` would return 1.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> f64 {
    let c = max_norm / (norm + 1e-6);
    if c >= 1.0 { 1.0 } else { c }
}

/// Scale each env's slice of `grad` by `coef[e]` (skipping envs whose coefficient is exactly 1).
pub fn scale_per_env<T: Real>(grad: &mut [T], coef: &[f64]) {
    let n_envs = coef.len();
    if n_envs == 0 || grad.is_empty() {
        return;
    }
    let per_env = grad.len() / n_envs;
    grad.par_chunks_mut(per_env).zip(coef.par_iter()).for_each(|(g, &c)| {
        if c != 1.0 {
            let c = T::from_f64(c);
            for v in g {
                *v *= c;
            }
        }
    });
}

/// One SGD step on `[E, n]` parameters for the envs whose group has a gradient (`active[e]`):
/// `g ← grad + wd·p; buf ← μ·buf + g; p ← p − lr·buf` (PyTorch, dampening 0, no Nesterov).
pub fn sgd_step<T: Real>(param: &mut [T], grad: &[T], momentum: &mut [T], active: &[bool], cfg: SgdConfig) {
    let n_envs = active.len();
    assert!(param.len() == grad.len() && param.len() == momentum.len());
    if n_envs == 0 || param.is_empty() {
        return;
    }
    let per_env = param.len() / n_envs;
    let (lr, mu, wd) = (T::from_f64(cfg.lr), T::from_f64(cfg.momentum), T::from_f64(cfg.weight_decay));
    let decay = cfg.weight_decay != 0.0;
    param
        .par_chunks_mut(per_env)
        .zip(grad.par_chunks(per_env))
        .zip(momentum.par_chunks_mut(per_env))
        .zip(active.par_iter())
        .for_each(|(((p, g), m), &on)| {
            if !on {
                return;
            }
            for ((p, &g), m) in p.iter_mut().zip(g).zip(m.iter_mut()) {
                let g = if decay { g + wd * *p } else { g };
                *m = mu * *m + g;
                *p -= lr * *m;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `torch.nn.utils.clip_grad_norm_`'s factor: 1 at or under the norm, `max/(norm + 1e-6)` over it,
    /// 0 for an infinite norm, and NaN for a NaN one (torch.clamp passes NaN), which makes every gradient
    /// it scales NaN.
    #[test]
    fn clip_coefficient_follows_torch_including_nan() {
        assert_eq!(clip_coefficient(0.5, 1.0), 1.0);
        assert_eq!(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
        assert_eq!(clip_coefficient(f64::INFINITY, 1.0), 0.0);
        assert!(clip_coefficient(f64::NAN, 1.0).is_nan());
        let mut grad = vec![1.0f32, -2.0, 3.0, 4.0];
        scale_per_env(&mut grad, &[1.0, clip_coefficient(f64::NAN, 1.0)]);
        assert_eq!(&grad[..2], &[1.0, -2.0]);
        assert!(grad[2..].iter().all(|g| g.is_nan()));
    }

    /// PyTorch's SGD written out for one scalar parameter, step by step.
    fn torch_sgd(p0: f64, grads: &[f64], cfg: SgdConfig) -> f64 {
        let (mut p, mut buf): (f64, Option<f64>) = (p0, None);
        for &g in grads {
            let d = g + cfg.weight_decay * p;
            let b = match buf {
                None => d,
                Some(b) => cfg.momentum * b + d,
            };
            buf = Some(b);
            p -= cfg.lr * b;
        }
        p
    }

    #[test]
    fn sgd_matches_pytorch_and_skips_inactive_envs() {
        let grads = [0.5, -0.25, 1.0, 0.125];
        let mut p = vec![1.0f64, 2.0, 1.0, 2.0]; // 2 envs × 2 params
        let mut m = vec![0.0f64; 4];
        for (step, &g) in grads.iter().enumerate() {
            let grad = vec![g, 2.0 * g, g, 2.0 * g];
            // Env 1 has no gradient on odd steps: no momentum, no decay move at all.
            let active = [true, step % 2 == 0];
            sgd_step(&mut p, &grad, &mut m, &active, SgdConfig::HOST);
        }
        let expect0 = torch_sgd(1.0, &grads, SgdConfig::HOST);
        let expect1 = torch_sgd(2.0, &grads.map(|g| 2.0 * g), SgdConfig::HOST);
        assert!((p[0] - expect0).abs() < 1e-15 && (p[1] - expect1).abs() < 1e-15);
        let skipped = [grads[0], grads[2]];
        assert!((p[2] - torch_sgd(1.0, &skipped, SgdConfig::HOST)).abs() < 1e-15);
        assert!((p[3] - torch_sgd(2.0, &skipped.map(|g| 2.0 * g), SgdConfig::HOST)).abs() < 1e-15);
    }

    #[test]
    fn clipping_uses_per_env_norms() {
        // Env 0: grads (3, 4) → norm 5 → scaled by 1/(5 + 1e-6). Env 1: (0.3, 0.4) → norm 0.5, untouched.
        let mut a = vec![3.0f32, 0.3];
        let mut b = vec![4.0f32, 0.4];
        let mut sq = vec![0.0; 2];
        accumulate_sq_norms(&a, &mut sq);
        accumulate_sq_norms(&b, &mut sq);
        let coef: Vec<f64> = sq.iter().map(|s| clip_coefficient(s.sqrt(), MAX_GRAD_NORM)).collect();
        assert!((sq[0] - 25.0).abs() < 1e-12 && (sq[1] - 0.25).abs() < 1e-6);
        scale_per_env(&mut a, &coef);
        scale_per_env(&mut b, &coef);
        assert_eq!((a[1], b[1]), (0.3, 0.4));
        let k = (1.0 / (5.0 + 1e-6)) as f32;
        assert_eq!((a[0], b[0]), (3.0 * k, 4.0 * k));
    }
}
