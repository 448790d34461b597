//! The PPO agent and its once-per-round update (simic §4.6–4.10), written to be read top to bottom like
//! CleanRL's `ppo.py`:
//!
//! 1. GAE per env row on the raw value scale (`gae_row`), then one global advantage normalisation
//!    `(A − mean) / (max(std, 0.1) + 1e-8)` over the valid steps.
//! 2. Explained variance before the update; the value normaliser's update from the returns; the critic's
//!    targets `R̂ = R / scale`.
//! 3. For each of K epochs (`--ppo-epochs`, default 1), a full-sequence pass over every row from the zero
//!    LSTM state (TBPTT through the whole round, reset where a rollback ended an episode mid-row):
//!    per-head log-probs of the stored actions under the stored masks canonicalised by the sampled op,
//!    V, Q(s, op), the contribution prediction; a finiteness gate; per-head ratios against the anchored
//!    reference; the KL early stop (before backward); the loss (§4.9); backward; global grad-norm clip
//!    5.0; one Adam step.
//!
//! The anchored reference pass of §4.8.6 is the first epoch's forward, detached: it is the same
//! computation on the same weights (so it gives the same numbers bit for bit on the CPU), and it saves
//! one full pass. `train_steps` counts updates that stepped the optimizer; it drives every schedule.

use candle_core::{DType, Device, Result, Tensor, Var};
use esper_components::{Head, LifecycleOp, relevant_heads};
use serde::{Deserialize, Serialize};

use super::adam::Adam;
use super::distribution::HEAD_FLOORS;
use super::gae::{GaeRow, gae_row};
use super::log_prob::floored_log_prob;
use super::network::{PolicyNet, PolicyShape, Recurrent, init_key};
use super::rollout::RolloutBuffer;
use super::sampler::head_mask;
use super::value_normalizer::{Moments, ValueNormalizer};

/// `ADVANTAGE_STD_FLOOR`.
const ADVANTAGE_STD_FLOOR: f64 = 0.1;
/// Value-loss weight of a forced step (only WAIT was legal).
const FORCED_VALUE_WEIGHT: f32 = 0.2;

/// The update's hyper-parameters (simic §4.1, §5 — `TrainingConfig`'s defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    pub lr: f64,
    pub adam_eps: f64,
    pub gamma: f32,
    pub gae_lambda: f32,
    pub clip_ratio: f32,
    /// K: passes over the round's batch per update.
    pub epochs: usize,
    /// Early stop when the approximate KL exceeds 1.5× this (None: never).
    pub target_kl: Option<f64>,
    pub value_coef: f64,
    /// Where the value coefficient's warm-up starts (None: 0.1 × value_coef).
    pub value_coef_start: Option<f64>,
    /// Updates over which the value coefficient ramps up (0: none).
    pub value_warmup_updates: u64,
    pub entropy_coef: f64,
    /// Linear anneal of the entropy coefficient from `entropy_coef` to this over `entropy_anneal_updates`.
    pub entropy_coef_end: Option<f64>,
    pub entropy_anneal_updates: u64,
    pub entropy_coef_min: f64,
    /// Per-head entropy multipliers (`Head` order).
    pub entropy_head_multipliers: [f64; 8],
    /// Normalised entropy floors and the coefficients of their quadratic penalty (`Head` order).
    pub entropy_floors: [f64; 8],
    pub entropy_floor_coefs: [f64; 8],
    pub max_grad_norm: f64,
    pub aux_coef: f64,
    pub aux_warmup_updates: u64,
    /// The run's planned updates (rounds): the entropy floor schedule's progress is `train_steps / this`.
    pub total_updates: u64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            lr: 3e-4,
            adam_eps: 1e-5,
            gamma: 0.995,
            gae_lambda: 0.98,
            clip_ratio: 0.2,
            epochs: 1,
            target_kl: Some(0.015),
            value_coef: 0.5,
            value_coef_start: None,
            value_warmup_updates: 10,
            entropy_coef: 0.05,
            entropy_coef_end: None,
            entropy_anneal_updates: 0,
            entropy_coef_min: 0.01,
            // slot, blueprint, style, tempo, alpha_target, alpha_speed, alpha_curve, op
            entropy_head_multipliers: [1.0, 1.3, 1.2, 1.3, 1.2, 1.2, 1.2, 1.0],
            entropy_floors: [0.15, 0.20, 0.15, 0.20, 0.10, 0.10, 0.10, 0.30],
            entropy_floor_coefs: [0.1, 0.3, 0.1, 0.3, 0.1, 0.1, 0.1, 0.3],
            max_grad_norm: 5.0,
            aux_coef: 0.05,
            aux_warmup_updates: 1000,
            total_updates: 100,
        }
    }
}

impl PpoConfig {
    /// β_V after `steps` updates: linear from the start value to `value_coef` over the warm-up.
    pub fn value_coef_at(&self, steps: u64) -> f64 {
        if self.value_warmup_updates == 0 {
            return self.value_coef;
        }
        let start = self.value_coef_start.unwrap_or(0.1 * self.value_coef);
        let progress = (steps as f64 / self.value_warmup_updates as f64).min(1.0);
        start + (self.value_coef - start) * progress
    }

    /// β_H after `steps` updates (annealed when asked, never below `entropy_coef_min`).
    pub fn entropy_coef_at(&self, steps: u64) -> f64 {
        let coef = match (self.entropy_coef_end, self.entropy_anneal_updates) {
            (Some(end), n) if n > 0 => {
                let progress = (steps as f64 / n as f64).min(1.0);
                self.entropy_coef + (end - self.entropy_coef) * progress
            }
            _ => self.entropy_coef,
        };
        coef.max(self.entropy_coef_min)
    }

    /// The entropy floor penalty's schedule: 1.5 for the first quarter of the run, 1.0 to three
    /// quarters, then linear down to 0.5 at the end.
    pub fn floor_schedule(&self, steps: u64) -> f64 {
        let progress = steps as f64 / self.total_updates.max(1) as f64;
        if progress < 0.25 {
            1.5
        } else if progress <= 0.75 {
            1.0
        } else {
            1.0 - 0.5 * ((progress - 0.75) / 0.25).min(1.0)
        }
    }
}

/// What one update reports (one line per round in `metrics.jsonl`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateMetrics {
    /// Valid steps in the batch.
    pub steps: usize,
    pub policy_loss: f64,
    pub value_loss: f64,
    pub q_loss: f64,
    /// −Σ_h c_h · mean H_h (what the loss adds before β_H).
    pub entropy_loss: f64,
    pub entropy_floor_penalty: f64,
    pub aux_loss: f64,
    pub total_loss: f64,
    pub approx_kl: f64,
    /// Share of valid steps whose joint ratio left [1 − ε, 1 + ε] (0 with K = 1: the ratio is 1).
    pub clip_fraction: f64,
    pub explained_variance: f64,
    /// Per head (`Head` order), mean normalised entropy over the steps where it was available.
    pub head_entropy: [f64; 8],
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    pub value_coef: f64,
    pub entropy_coef: f64,
    /// Epochs that stepped the optimizer.
    pub epochs_run: usize,
    pub early_stopped: bool,
    pub nonfinite_skips: usize,
    pub advantage_mean: f64,
    pub advantage_std: f64,
    /// The critic's target scale after this update's normaliser step.
    pub value_scale: f64,
    pub penalised_rollbacks: u64,
    pub unattributed_rollbacks: u64,
}

impl UpdateMetrics {
    /// The finiteness gate skipped every epoch: no optimizer step (simic §1.4.3's failure).
    pub fn skipped_for_nonfinite(&self) -> bool {
        self.epochs_run == 0 && self.nonfinite_skips > 0
    }
}

/// The learner: the network, its optimizer, the critic's normaliser and the update count.
#[derive(Debug)]
pub struct PpoAgent {
    pub net: PolicyNet,
    pub adam: Adam,
    pub value_normalizer: ValueNormalizer,
    pub config: PpoConfig,
    pub train_steps: u64,
    pub device: Device,
}

impl PpoAgent {
    /// A fresh agent: weights from the run seed's policy-init stream, zero optimizer state.
    pub fn new(shape: PolicyShape, seed: u64, config: PpoConfig, device: &Device) -> Result<Self> {
        let net = PolicyNet::init(shape, init_key(seed), DType::F32, device)?;
        let adam = Adam::new(&net.vars(), config.lr, config.adam_eps)?;
        Ok(Self {
            net,
            adam,
            value_normalizer: ValueNormalizer::default(),
            config,
            train_steps: 0,
            device: device.clone(),
        })
    }

    /// One update from the round's buffer (None when it holds no step). The buffer is left as it was.
    pub fn update(&mut self, buffer: &RolloutBuffer) -> Result<Option<UpdateMetrics>> {
        let n_valid = buffer.total_steps();
        if n_valid == 0 {
            return Ok(None);
        }
        let cfg = self.config.clone();
        let (rows, cols, s) = (buffer.n_envs, buffer.capacity, buffer.n_slots);
        let n = rows * cols;
        let valid: Vec<bool> = (0..n).map(|i| buffer.valid(i / cols, i % cols)).collect();
        let mut metrics = UpdateMetrics {
            steps: n_valid,
            penalised_rollbacks: buffer.penalised_rollbacks,
            unattributed_rollbacks: buffer.unattributed_rollbacks,
            value_coef: cfg.value_coef_at(self.train_steps),
            entropy_coef: cfg.entropy_coef_at(self.train_steps),
            ..UpdateMetrics::default()
        };

        // 1. GAE on the raw scale, then the global advantage normalisation.
        let vn = self.value_normalizer;
        let values_raw: Vec<f32> = buffer.values.iter().map(|&v| vn.denormalize(v)).collect();
        let bootstrap_raw: Vec<f32> = buffer.bootstrap.iter().map(|&v| vn.denormalize(v)).collect();
        let (mut advantages, mut returns, mut td) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        for e in 0..rows {
            let r = e * cols..(e + 1) * cols;
            let row = GaeRow {
                rewards: &buffer.rewards[r.clone()],
                values: &values_raw[r.clone()],
                bootstrap: &bootstrap_raw[r.clone()],
                done: &buffer.done[r.clone()],
                truncated: &buffer.truncated[r.clone()],
            };
            let (a, ret, d) = (&mut advantages[r.clone()], &mut returns[r.clone()], &mut td[r]);
            gae_row(row, buffer.lens[e], cfg.gamma, cfg.gae_lambda, a, ret, d);
        }
        let valid_values = |x: &[f32]| -> Vec<f64> {
            x.iter().zip(&valid).filter(|&(_, &v)| v).map(|(&a, _)| a as f64).collect()
        };
        let adv = Moments::of(valid_values(&advantages).into_iter());
        let (adv_mean, adv_std) = (adv.mean, adv.population_var().sqrt());
        metrics.advantage_mean = adv_mean;
        metrics.advantage_std = adv_std;
        let adv_norm: Vec<f32> = advantages
            .iter()
            .zip(&valid)
            .map(|(&a, &v)| {
                if v {
                    ((a as f64 - adv_mean) / (adv_std.max(ADVANTAGE_STD_FLOOR) + 1e-8)) as f32
                } else {
                    0.0
                }
            })
            .collect();

        // 2. Explained variance (raw scale, Bessel), the normaliser's step, the critic's targets.
        let valid_returns = valid_values(&returns);
        let residual: Vec<f64> =
            valid_returns.iter().zip(valid_values(&values_raw)).map(|(r, v)| r - v).collect();
        metrics.explained_variance = 1.0
            - Moments::of(residual.into_iter()).sample_var()
                / Moments::of(valid_returns.iter().copied()).sample_var().max(1.0);
        let valid_returns_f32: Vec<f32> = valid_returns.iter().map(|&r| r as f32).collect();
        self.value_normalizer.update(&valid_returns_f32);
        metrics.value_scale = self.value_normalizer.scale();
        let targets: Vec<f32> = returns.iter().map(|&r| self.value_normalizer.normalize(r)).collect();

        // 3. The batch as the network reads it, and everything the epochs share: per head the masks of
        // the stored actions (canonicalised by the sampled op), the causal masks (from the effective
        // op) and the availability masks (from the op mask), both times "valid and not forced", and the
        // approximate KL's masks: causal but forced steps included, as the reference's
        // `compute_ratio_metrics` gets the masks of `compute_per_head_advantages` (ppo_agent.py), not the
        // losses' M_h. A forced step's KL is 0 (its one legal op has log-prob 0), so it only weighs.
        let dev = &self.device;
        let obs = Tensor::from_slice(&buffer.states, (rows, cols, buffer.obs_dim), dev)?;
        let mut resets = Vec::new();
        buffer.episode_starts(&mut resets);
        let sizes = self.net.shape.head_sizes();
        let mut head_masks: Vec<Vec<bool>> = sizes.iter().map(|&k| vec![false; n * k]).collect();
        let mut head_actions = vec![vec![0u8; n]; 8];
        let mut causal = vec![vec![0f32; n]; 8];
        let mut kl_masks = vec![vec![0f32; n]; 8];
        let mut available = vec![vec![0f32; n]; 8];
        let mut value_weights = vec![0f32; n];
        for i in 0..n {
            if !valid[i] {
                for (h, &k) in sizes.iter().enumerate() {
                    head_masks[h][i * k] = true; // padding: one legal entry, log-prob 0, outside every loss
                }
                continue;
            }
            let masks = &buffer.masks[i];
            let forced = masks.is_forced_wait();
            value_weights[i] = if forced { FORCED_VALUE_WEIGHT } else { 1.0 };
            let sampled = LifecycleOp::from_index(buffer.actions[i].op).unwrap_or(LifecycleOp::Wait);
            let relevant = relevant_heads(buffer.effective_ops[i]);
            let reachable = masks.available_heads();
            for head in Head::ALL {
                let (h, k) = (head as usize, sizes[head as usize]);
                head_mask(masks, head, sampled, &mut head_masks[h][i * k..(i + 1) * k]);
                head_actions[h][i] = buffer.actions[i].head(head);
                causal[h][i] = f32::from(u8::from(!forced && relevant[h]));
                kl_masks[h][i] = f32::from(u8::from(relevant[h]));
                available[h][i] = f32::from(u8::from(!forced && reachable[h]));
            }
        }
        let ops: Vec<u8> = buffer.actions.iter().map(|a| a.op).collect();
        let aux_mask: Vec<f32> =
            (0..n * s).map(|j| f32::from(u8::from(valid[j / s] && buffer.contribution_mask[j]))).collect();
        let valid_f: Vec<f32> = valid.iter().map(|&v| f32::from(u8::from(v))).collect();
        let t1 = |v: &[f32]| Tensor::from_slice(v, n, dev);
        let (adv_t, target_t, weight_t, valid_t) =
            (t1(&adv_norm)?, t1(&targets)?, t1(&value_weights)?, t1(&valid_f)?);
        let aux_target_t = Tensor::from_slice(&buffer.contribution_targets, (n, s), dev)?;
        let aux_mask_t = Tensor::from_slice(&aux_mask, (n, s), dev)?;
        let causal_t = causal.iter().map(|m| t1(m)).collect::<Result<Vec<_>>>()?;
        let kl_masks_t = kl_masks.iter().map(|m| t1(m)).collect::<Result<Vec<_>>>()?;
        let available_t = available.iter().map(|m| t1(m)).collect::<Result<Vec<_>>>()?;
        let total = |m: &[f32]| m.iter().sum::<f32>() as f64;
        let n_causal: Vec<f64> = causal.iter().map(|m| total(m)).collect();
        let n_available: Vec<f64> = available.iter().map(|m| total(m)).collect();
        let (n_weights, n_aux) = (total(&value_weights).max(1.0), total(&aux_mask).max(1.0));
        let kl_weight: f64 = kl_masks.iter().map(|m| total(m)).sum();
        let schedule = cfg.floor_schedule(self.train_steps);
        let aux_coef =
            cfg.aux_coef * (self.train_steps as f64 / cfg.aux_warmup_updates.max(1) as f64).min(1.0);

        let vars = self.net.vars();
        let zero_state = Recurrent::zeros(rows, self.net.shape.hidden, DType::F32, dev)?;
        let mut reference: Vec<Tensor> = Vec::new();
        let (eps, beta_v, beta_h) = (cfg.clip_ratio as f64, metrics.value_coef, metrics.entropy_coef);
        for epoch in 0..cfg.epochs.max(1) {
            let out = self.net.sequence(&obs, &buffer.blueprints, &zero_state, &resets)?;
            let mut log_probs = Vec::with_capacity(8);
            let mut entropies = Vec::with_capacity(8);
            for head in Head::ALL {
                let h = head as usize;
                let (lp, ent) =
                    floored_log_prob(&out.logits[h], &head_masks[h], HEAD_FLOORS[h], &head_actions[h])?;
                log_probs.push(lp);
                entropies.push(ent);
            }
            if epoch == 0 {
                reference = log_probs.iter().map(Tensor::detach).collect();
            }
            let q = self.net.q_value(&out.lstm_out, &ops)?;
            let predicted = self.net.contribution(&out.lstm_out)?;

            // Ratios, the joint ratio, the KL terms; then one read-back of the finiteness probe (x·0 is 0
            // for a finite x and NaN otherwise), the KL sum and the clip count, before any backward.
            let mut probe = ((&out.value * 0.0)?.sum_all()? + (&q * 0.0)?.sum_all()?)?;
            let mut ratios = Vec::with_capacity(8);
            let mut joint_log = Tensor::zeros(n, DType::F32, dev)?;
            let mut kl_sum = Tensor::new(0f32, dev)?;
            for h in 0..8 {
                probe = (probe + (&log_probs[h] * 0.0)?.sum_all()?)?;
                let log_ratio = (&log_probs[h] - &reference[h])?.clamp(-20f32, 20f32)?;
                let ratio = log_ratio.exp()?;
                joint_log = (joint_log + &log_ratio)?;
                // Σ_h w_h·KL_h / Σ_h w_h with w_h = n_h / T is Σ_h Σ_t kl / Σ_h n_h.
                kl_sum = (kl_sum + (((&ratio - 1.0)? - &log_ratio)? * &kl_masks_t[h])?.sum_all()?)?;
                ratios.push(ratio);
            }
            let joint = joint_log.clamp(-30f32, 30f32)?.exp()?;
            let outside = ((&joint - 1.0)?.abs()?.gt(eps)?.to_dtype(DType::F32)? * &valid_t)?.sum_all()?;
            let checks = Tensor::stack(&[probe, kl_sum, outside], 0)?.to_vec1::<f32>()?;
            if !checks[0].is_finite() {
                metrics.nonfinite_skips += 1;
                continue;
            }
            let approx_kl = if kl_weight > 0.0 { checks[1] as f64 / kl_weight } else { 0.0 };
            metrics.approx_kl = approx_kl;
            metrics.clip_fraction = checks[2] as f64 / n_valid as f64;
            if cfg.target_kl.is_some_and(|target| approx_kl > 1.5 * target) {
                metrics.early_stopped = true;
                break;
            }

            // The loss (simic §4.9).
            let mut policy_loss = Tensor::new(0f32, dev)?;
            let mut entropy_loss = Tensor::new(0f32, dev)?;
            let mut floor_penalty = Tensor::new(0f32, dev)?;
            let mut head_entropy = Vec::with_capacity(8);
            for h in 0..8 {
                let m = &causal_t[h];
                let n_m = n_causal[h].max(1.0);
                let surrogate = (&ratios[h] * &adv_t)?;
                let clipped = (ratios[h].clamp(1.0 - eps as f32, 1.0 + eps as f32)? * &adv_t)?;
                let objective = (surrogate.minimum(&clipped)? * m)?.sum_all()?;
                policy_loss = (policy_loss - (objective / n_m)?)?;
                let mean_entropy = ((&entropies[h] * m)?.sum_all()? / n_m)?;
                entropy_loss = (entropy_loss - (mean_entropy * cfg.entropy_head_multipliers[h])?)?;
                let h_bar = if n_available[h] > 0.0 {
                    let h_bar = ((&entropies[h] * &available_t[h])?.sum_all()? / n_available[h])?;
                    let shortfall = (h_bar.neg()? + cfg.entropy_floors[h])?.relu()?;
                    floor_penalty =
                        (floor_penalty + (shortfall.sqr()? * (cfg.entropy_floor_coefs[h] * schedule))?)?;
                    h_bar
                } else {
                    Tensor::new(0f32, dev)?
                };
                head_entropy.push(h_bar);
            }
            let value_loss =
                ((((&out.value - &target_t)?.sqr()? * &weight_t)?.sum_all()? / n_weights)? * 0.5)?;
            let q_loss = ((((&q - &target_t)?.sqr()? * &weight_t)?.sum_all()? / n_weights)? * 0.5)?;
            let aux_loss = ((((&predicted - &aux_target_t)?.sqr()? * &aux_mask_t)?.sum_all()?) / n_aux)?;
            let total = (((((&policy_loss + (&value_loss * beta_v)?)? + (&entropy_loss * beta_h)?)?
                + &floor_penalty)?
                + (&q_loss * (0.5 * beta_v))?)?
                + (&aux_loss * aux_coef)?)?;

            // Backward, the global clip (the norm reduced on the device, one read), one Adam step.
            let grads = total.backward()?;
            let grads: Vec<Tensor> = vars
                .iter()
                .map(|v| grads.get(v).cloned().map_or_else(|| v.as_tensor().zeros_like(), Ok))
                .collect::<Result<_>>()?;
            let squares =
                grads.iter().map(|g| g.sqr()?.sum_all()?.to_dtype(DType::F64)).collect::<Result<Vec<_>>>()?;
            let norm_sq = Tensor::stack(&squares, 0)?.sum_all()?;

            // Every number this epoch reports, in one read-back.
            let mut report =
                vec![policy_loss, value_loss, q_loss, entropy_loss, floor_penalty, aux_loss, total];
            report.extend(head_entropy);
            let mut report = report.iter().map(|t| t.to_dtype(DType::F64)).collect::<Result<Vec<_>>>()?;
            report.insert(7, norm_sq);
            let r = Tensor::stack(&report, 0)?.to_vec1::<f64>()?;
            (metrics.policy_loss, metrics.value_loss, metrics.q_loss, metrics.entropy_loss) =
                (r[0], r[1], r[2], r[3]);
            (metrics.entropy_floor_penalty, metrics.aux_loss, metrics.total_loss) = (r[4], r[5], r[6]);
            metrics.head_entropy.copy_from_slice(&r[8..16]);
            let norm = r[7].sqrt();
            metrics.grad_norm = norm;
            let clip = (cfg.max_grad_norm / (norm + 1e-6)).min(1.0);
            let grads =
                if clip < 1.0 { grads.iter().map(|g| g * clip).collect::<Result<Vec<_>>>()? } else { grads };
            self.adam.step(&vars, &grads)?;
            metrics.epochs_run += 1;
        }
        if metrics.epochs_run > 0 {
            self.train_steps += 1;
        }
        Ok(Some(metrics))
    }
}

/// The variables as `Var`s of one device (a checkpoint restores them with `Var::set`).
pub fn set_vars(vars: &[Var], values: &[Tensor]) -> Result<()> {
    if vars.len() != values.len() {
        candle_core::bail!("{} saved tensors for {} variables", values.len(), vars.len());
    }
    for (var, value) in vars.iter().zip(values) {
        if var.dims() != value.dims() {
            candle_core::bail!(
                "a saved tensor of shape {:?} for a variable of shape {:?}",
                value.dims(),
                var.dims()
            );
        }
        var.set(&value.to_dtype(var.dtype())?.to_device(var.device())?)?;
    }
    Ok(())
}
