//! One training step for all envs (forward, per-env mean cross-entropy, backward, per-env gradient
//! clipping, SGD) and validation over each env's own slice of the test set.

use super::network::HostWorkspace;
use super::params::{HostParams, Stacked};
use crate::ops::Real;
use crate::optim::{self, MAX_GRAD_NORM, SgdConfig};

/// Gradients, momentum and per-env scratch for training the host of every env.
#[derive(Clone, Debug)]
pub struct HostTrainer<T> {
    pub grads: Stacked<T>,
    pub momentum: Stacked<T>,
    /// Per env: the host gradient norm before clipping, from the last step.
    pub grad_norm: Vec<f64>,
    clip: Vec<f64>,
    active: Vec<bool>,
    pub sgd: SgdConfig,
}

impl<T: Real> HostTrainer<T> {
    pub fn new(params: &HostParams<T>, sgd: SgdConfig) -> Self {
        let n = params.n_envs();
        let lens = params.arch.tensor_lens();
        Self {
            grads: Stacked::zeros(n, &lens),
            momentum: Stacked::zeros(n, &lens),
            grad_norm: vec![0.0; n],
            clip: vec![1.0; n],
            active: vec![true; n],
            sgd,
        }
    }

    /// One step: forward and backward over `images` (`[E, B, C, H, W]`) and `labels` (`[E, B]`), clip each
    /// env's host gradient to norm 1, SGD. Returns per-env mean loss (in `ws.loss`).
    pub fn step<L: Copy + Into<usize> + Sync>(
        &mut self,
        params: &mut HostParams<T>,
        ws: &mut HostWorkspace<T>,
        images: &[T],
        labels: &[L],
    ) {
        ws.forward_train(params, images, labels);
        ws.backward(params, images, &mut self.grads);
        self.clip_and_update(params);
    }

    fn clip_and_update(&mut self, params: &mut HostParams<T>) {
        self.grad_norm.fill(0.0);
        for g in &self.grads.tensors {
            optim::accumulate_sq_norms(g, &mut self.grad_norm);
        }
        for (norm, clip) in self.grad_norm.iter_mut().zip(&mut self.clip) {
            *norm = norm.sqrt();
            *clip = optim::clip_coefficient(*norm, MAX_GRAD_NORM);
        }
        let tensors =
            params.weights.tensors.iter_mut().zip(&mut self.grads.tensors).zip(&mut self.momentum.tensors);
        for ((p, g), m) in tensors {
            optim::scale_per_env(g, &self.clip);
            optim::sgd_step(p, g, m, &self.active, self.sgd);
        }
    }
}

/// Per-env validation totals over a pass: `val_acc = 100·correct/total`, `val_loss` = mean over batches
/// of the batch-mean cross-entropy (spec kasmina §6.5).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValTotals {
    pub correct: Vec<u64>,
    pub total: Vec<u64>,
    pub loss_sum: Vec<f64>,
    pub batches: Vec<u64>,
}

impl ValTotals {
    pub fn new(n_envs: usize) -> Self {
        Self {
            correct: vec![0; n_envs],
            total: vec![0; n_envs],
            loss_sum: vec![0.0; n_envs],
            batches: vec![0; n_envs],
        }
    }

    pub fn accuracy(&self, env: usize) -> f64 {
        if self.total[env] == 0 { 0.0 } else { 100.0 * self.correct[env] as f64 / self.total[env] as f64 }
    }

    pub fn loss(&self, env: usize) -> f64 {
        if self.batches[env] == 0 { f64::NAN } else { self.loss_sum[env] / self.batches[env] as f64 }
    }
}

/// Evaluate one test batch: env `e` counts rows `0..counts[e]` of its block (the rest are padding).
pub fn validate_batch<T: Real>(
    params: &HostParams<T>,
    ws: &mut HostWorkspace<T>,
    images: &[T],
    labels: &[u8],
    counts: &[usize],
    totals: &mut ValTotals,
) {
    ws.forward_eval(params, images);
    let (batch, classes) = (ws.batch, ws.arch.num_classes);
    for (e, &count) in counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let mut loss = 0.0f64;
        let mut correct = 0u64;
        for row in 0..count {
            let i = e * batch + row;
            let z = &ws.logits[i * classes..(i + 1) * classes];
            let label = labels[i] as usize;
            let (mut best, mut max) = (0, z[0].to_f64());
            for (k, v) in z.iter().enumerate() {
                if v.to_f64() > max {
                    (best, max) = (k, v.to_f64());
                }
            }
            let sum: f64 = z.iter().map(|v| (v.to_f64() - max).exp()).sum();
            loss += max + sum.ln() - z[label].to_f64();
            correct += u64::from(best == label);
        }
        totals.correct[e] += correct;
        totals.total[e] += count as u64;
        totals.loss_sum[e] += loss / count as f64;
        totals.batches[e] += 1;
    }
}
