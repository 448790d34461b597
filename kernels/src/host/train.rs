//! One training step for all envs (forward, per-env mean cross-entropy, backward, host and seed
//! gradients clipped separately per env to norm 1, SGD), gradient-health statistics for TRAINING /
//! BLENDING seeds on collection batches (kasmina §5.3, §5.4), and validation over each env's own slice
//! of the test set.

use super::network::HostWorkspace;
use super::params::{HostParams, Stacked};
use super::seed_bank::{SeedBank, SlotParams};
use crate::ops::Real;
use crate::optim::{self, MAX_GRAD_NORM, SgdConfig};
use crate::seeds::{self, CnnBlueprint};

/// A per-tensor gradient norm below this is "vanishing".
pub const VANISHING_NORM: f64 = 1e-7;
/// A per-tensor gradient norm above this (10 × the clip norm) is "exploding".
pub const EXPLODING_NORM: f64 = 10.0;

/// Gradient health of one seed on a collection batch (before clipping), kasmina §5.3–5.4.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SeedGradStats {
    /// `sqrt(Σ n_i²)` over the seed's (and gate's) tensors with a gradient.
    pub norm: f64,
    pub health: f64,
    pub has_vanishing: bool,
    pub has_exploding: bool,
    /// Gradient elements counted (`P_s`).
    pub elements: usize,
}

impl SeedGradStats {
    /// From per-tensor norms `n_i` (and element counts). No tensors at all → norm 0, health 1.
    pub fn from_tensor_norms(norms: &[(f64, usize)]) -> Self {
        if norms.is_empty() {
            return Self { health: 1.0, ..Self::default() };
        }
        let total: f64 = norms.iter().map(|(n, _)| n * n).sum::<f64>().sqrt();
        let vanishing = norms.iter().filter(|(n, _)| *n < VANISHING_NORM).count();
        let exploding = norms.iter().filter(|(n, _)| !n.is_finite() || *n > EXPLODING_NORM).count();
        let k = norms.len() as f64;
        let health = if total.is_finite() {
            (1.0 - 0.5 * vanishing as f64 / k - 0.8 * exploding as f64 / k).clamp(0.0, 1.0)
        } else {
            0.0
        };
        Self {
            norm: total,
            health,
            has_vanishing: vanishing > 0,
            has_exploding: exploding > 0,
            elements: norms.iter().map(|(_, c)| c).sum(),
        }
    }

    /// `(S/√P_s) / (H/√P_h + 1e-8)`, or 0 when either norm is below 1e-8 or a count is 0.
    pub fn ratio_to_host(&self, host_norm: f64, host_elements: usize) -> f64 {
        if host_norm < 1e-8 || self.norm < 1e-8 || host_elements == 0 || self.elements == 0 {
            return 0.0;
        }
        (self.norm / (self.elements as f64).sqrt()) / (host_norm / (host_elements as f64).sqrt() + 1e-8)
    }
}

/// Gradients, momentum and per-env scratch for training the host and seeds of every env.
#[derive(Clone, Debug)]
pub struct Trainer<T> {
    pub grads: Stacked<T>,
    pub momentum: Stacked<T>,
    /// Per env: the host gradient norm before clipping, from the last step.
    pub host_grad_norm: Vec<f64>,
    /// `[slot in canonical order][env]`: statistics of the last collection batch (None: not collected).
    pub seed_stats: Vec<Vec<Option<SeedGradStats>>>,
    /// Per env: the host gradient norm of the last collection batch (for the seed/host ratio).
    pub host_norm_at_collection: Vec<f64>,
    pub host: SgdConfig,
    pub seed: SgdConfig,
    clip: Vec<f64>,
    sq: Vec<f64>,
    active: Vec<bool>,
    all_envs: Vec<bool>,
}

impl<T: Real> Trainer<T> {
    pub fn new(params: &HostParams<T>, bank: &SeedBank<T>) -> Self {
        let n = params.n_envs();
        let lens = params.arch.tensor_lens();
        Self {
            grads: Stacked::zeros(n, &lens),
            momentum: Stacked::zeros(n, &lens),
            host_grad_norm: vec![0.0; n],
            seed_stats: bank.slots().map(|_| vec![None; n]).collect(),
            host_norm_at_collection: vec![0.0; n],
            host: SgdConfig::HOST,
            seed: SgdConfig::SEED,
            clip: vec![1.0; n],
            sq: vec![0.0; n],
            active: vec![false; n],
            all_envs: vec![true; n],
        }
    }

    /// One step over `images` (`[E, B, C, H, W]`) and `labels` (`[E, B]`): forward, backward, optional
    /// gradient statistics (`collect_stats`, every 10th batch in the loop), clipping, SGD. Per-env mean
    /// losses are left in `ws.loss`.
    pub fn step<L: Copy + Into<usize> + Sync>(
        &mut self,
        params: &mut HostParams<T>,
        bank: &mut SeedBank<T>,
        ws: &mut HostWorkspace<T>,
        images: &[T],
        labels: &[L],
        collect_stats: bool,
    ) {
        ws.forward_train(params, bank, images, labels);
        ws.backward(params, bank, images, &mut self.grads);
        self.host_grad_norm.fill(0.0);
        for g in &self.grads.tensors {
            optim::accumulate_sq_norms(g, &mut self.host_grad_norm);
        }
        for (norm, clip) in self.host_grad_norm.iter_mut().zip(&mut self.clip) {
            *norm = norm.sqrt();
            *clip = optim::clip_coefficient(*norm, MAX_GRAD_NORM);
        }
        if collect_stats {
            self.host_norm_at_collection.copy_from_slice(&self.host_grad_norm);
        }
        let host =
            params.weights.tensors.iter_mut().zip(&mut self.grads.tensors).zip(&mut self.momentum.tensors);
        for ((p, g), m) in host {
            optim::scale_per_env(g, &self.clip);
            optim::sgd_step(p, g, m, &self.all_envs, self.host);
        }
        for (s, slot) in bank.slots_mut().enumerate() {
            if !slot.any_active_in(true) {
                continue;
            }
            if collect_stats {
                collect_seed_stats(slot, &mut self.seed_stats[s]);
            }
            self.step_seeds(slot);
        }
    }

    /// Forget last epoch's gradient statistics (call at the start of an epoch: stats are kept only for
    /// slots that had a collection batch this epoch).
    pub fn clear_stats(&mut self) {
        for slot in &mut self.seed_stats {
            slot.fill(None);
        }
    }

    /// Clip each env's seed + gate gradient at this slot to norm 1, then SGD the envs that train them.
    fn step_seeds(&mut self, slot: &mut SlotParams<T>) {
        self.sq.fill(0.0);
        for pool in slot.pools.iter().chain([&slot.gate]) {
            optim::accumulate_sq_norms(&pool.grads, &mut self.sq);
        }
        for (sq, clip) in self.sq.iter().zip(&mut self.clip) {
            *clip = optim::clip_coefficient(sq.sqrt(), MAX_GRAD_NORM);
        }
        for (bp, pool) in CnnBlueprint::ALL.into_iter().zip(&mut slot.pools) {
            for (a, st) in self.active.iter_mut().zip(&slot.state) {
                *a = st.train_seed && st.blueprint == Some(bp);
            }
            if self.active.iter().any(|&a| a) {
                optim::scale_per_env(&mut pool.grads, &self.clip);
                optim::sgd_step(&mut pool.params, &pool.grads, &mut pool.momentum, &self.active, self.seed);
            }
        }
        for (a, st) in self.active.iter_mut().zip(&slot.state) {
            *a = st.gate_step && st.gate_grad;
        }
        if self.active.iter().any(|&a| a) {
            let gate = &mut slot.gate;
            optim::scale_per_env(&mut gate.grads, &self.clip);
            optim::sgd_step(&mut gate.params, &gate.grads, &mut gate.momentum, &self.active, self.seed);
        }
    }
}

/// Per-tensor gradient norms of every collecting seed at `slot` (seed tensors, then gate tensors when
/// the gate has gradients), folded into [`SeedGradStats`].
fn collect_seed_stats<T: Real>(slot: &SlotParams<T>, out: &mut [Option<SeedGradStats>]) {
    let gate_layout = seeds::gate_layout(slot.channels);
    for (e, st) in slot.state.iter().enumerate() {
        let Some(bp) = st.blueprint.filter(|_| st.collect_stats) else {
            out[e] = None;
            continue;
        };
        let mut norms = [(0.0f64, 0usize); 2 * seeds::MAX_TENSORS];
        let mut k = 0;
        if st.train_seed {
            let row = slot.pool(bp).grad_row(e);
            for t in seeds::layout(bp, slot.channels).tensors() {
                let sq: f64 = row[t.range()].iter().map(|v| v.to_f64() * v.to_f64()).sum();
                norms[k] = (sq.sqrt(), t.len);
                k += 1;
            }
        }
        if st.gate_grad {
            let row = slot.gate.grad_row(e);
            for t in gate_layout.tensors() {
                let sq: f64 = row[t.range()].iter().map(|v| v.to_f64() * v.to_f64()).sum();
                norms[k] = (sq.sqrt(), t.len);
                k += 1;
            }
        }
        out[e] = Some(SeedGradStats::from_tensor_norms(&norms[..k]));
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

    /// `n_envs` rows, all zero, reusing the memory.
    pub fn resize(&mut self, n_envs: usize) {
        self.correct.resize(n_envs, 0);
        self.total.resize(n_envs, 0);
        self.loss_sum.resize(n_envs, 0.0);
        self.batches.resize(n_envs, 0);
        self.reset();
    }

    pub fn reset(&mut self) {
        self.correct.fill(0);
        self.total.fill(0);
        self.loss_sum.fill(0.0);
        self.batches.fill(0);
    }

    /// Add `other`'s row `from` to row `to`.
    pub fn add_row(&mut self, to: usize, other: &ValTotals, from: usize) {
        self.correct[to] += other.correct[from];
        self.total[to] += other.total[from];
        self.loss_sum[to] += other.loss_sum[from];
        self.batches[to] += other.batches[from];
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
    bank: &SeedBank<T>,
    ws: &mut HostWorkspace<T>,
    images: &[T],
    labels: &[u8],
    counts: &[usize],
    totals: &mut ValTotals,
) {
    ws.forward_eval(params, bank, images);
    accumulate_validation(&ws.logits, ws.batch, ws.arch.num_classes, labels, counts, totals);
}

/// Add one batch's per-env correct count, sample count and batch-mean cross-entropy from `logits`
/// (`[E, B, classes]`), counting rows `0..counts[e]` of env `e`.
pub fn accumulate_validation<T: Real>(
    logits: &[T],
    batch: usize,
    classes: usize,
    labels: &[u8],
    counts: &[usize],
    totals: &mut ValTotals,
) {
    for (e, &count) in counts.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let mut loss = 0.0f64;
        let mut correct = 0u64;
        for row in 0..count {
            let i = e * batch + row;
            let z = &logits[i * classes..(i + 1) * classes];
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
