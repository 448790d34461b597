//! Obs V3 (spec tamiyo §1.1–1.2) for every env at once: one `[E, 23 + 31·S]` f32 buffer and one
//! `[E, S]` blueprint-index buffer, filled as passes over SoA columns — the base block over the `[E]`
//! columns, the slot block over the `[E, S]` columns. The caller gathers the columns from the world
//! ([`ObsInputs`]); nothing here allocates once the buffers have their size.
//!
//! Arithmetic is f64 (the reference's Python floats); each feature is rounded to f32 when stored, as
//! the reference's float32 tensor does.

use esper_components::signals::SIGNAL_HISTORY_EXPOSED;
use esper_components::{AlphaAlgorithm, AlphaMode, BlueprintAction, GAMMA, LifecycleOp, SeedStage};

/// Base features per env (tamiyo §1.1).
pub const BASE_FEATURES: usize = 23;
/// Features per slot (tamiyo §1.2).
pub const SLOT_FEATURES: usize = 31;
/// `_SYMLOG_NORM`: symlog values are divided by 7.
pub const SYMLOG_NORM: f64 = 7.0;
/// `OBS_V3_UNKNOWN_SENTINEL`: a never-observed value (missing history, no previous gradient health,
/// never ablated) — outside every measured range, so "unknown" ≠ "zero".
pub const UNKNOWN_SENTINEL: f64 = -1.0;
/// `_IMPROVEMENT_CLAMP_PCT_PTS`: contribution, its velocity and the interaction sum are divided by
/// 10 pp and clamped to ±1.
pub const IMPROVEMENT_CLAMP_PP: f64 = 10.0;
/// Blend tempo is divided by 12 epochs (no clamp).
pub const BLEND_TEMPO_NORM: f64 = 12.0;
/// `E` when the run has no episode length (`DEFAULT_EPISODE_LENGTH`).
pub const DEFAULT_EPISODE_LENGTH: u32 = 150;
/// Blueprint index of an empty slot.
pub const EMPTY_SLOT_BLUEPRINT: i64 = -1;

/// Offsets inside the base block.
pub mod base {
    pub const EPOCH: usize = 0;
    pub const VAL_LOSS: usize = 1;
    pub const VAL_ACCURACY: usize = 2;
    pub const LOSS_HISTORY: usize = 3;
    pub const ACCURACY_HISTORY: usize = 8;
    pub const N_TRAINING: usize = 13;
    pub const N_BLENDING: usize = 14;
    pub const N_HOLDING: usize = 15;
    pub const LAST_ACTION_SUCCESS: usize = 16;
    pub const LAST_OP_ONE_HOT: usize = 17;
}

/// Offsets inside a slot's block.
pub mod slot {
    pub const IS_ACTIVE: usize = 0;
    pub const STAGE_ONE_HOT: usize = 1;
    pub const ALPHA: usize = 11;
    pub const CONTRIBUTION: usize = 12;
    pub const CONTRIBUTION_VELOCITY: usize = 13;
    pub const BLEND_TEMPO: usize = 14;
    pub const ALPHA_TARGET: usize = 15;
    pub const ALPHA_MODE: usize = 16;
    pub const ALPHA_STEPS_TOTAL: usize = 17;
    pub const ALPHA_STEPS_DONE: usize = 18;
    pub const TIME_TO_TARGET: usize = 19;
    pub const ALPHA_VELOCITY: usize = 20;
    pub const ALPHA_ALGORITHM: usize = 21;
    pub const INTERACTION_SUM: usize = 22;
    pub const GRADIENT_NORM: usize = 23;
    pub const GRADIENT_HEALTH: usize = 24;
    pub const HAS_VANISHING: usize = 25;
    pub const HAS_EXPLODING: usize = 26;
    pub const GRADIENT_HEALTH_PREV: usize = 27;
    pub const EPOCHS_IN_STAGE: usize = 28;
    pub const COUNTERFACTUAL_FRESHNESS: usize = 29;
    pub const SEED_AGE: usize = 30;
}

/// Features per env for `n_slots` slots: `23 + 31·S` (116 for 3 slots).
pub const fn obs_dim(n_slots: usize) -> usize {
    BASE_FEATURES + SLOT_FEATURES * n_slots
}

/// `sign(x)·ln(1 + |x|)` in the reference's form (`log1p(x)` for x ≥ 0, else `−log1p(−x)`: −0.0 stays
/// −0.0, NaN stays NaN).
pub fn symlog(x: f64) -> f64 {
    if x >= 0.0 { x.ln_1p() } else { -(-x).ln_1p() }
}

/// `min(x, E) / E`: a count of epochs or ticks on the episode's scale.
fn epoch_fraction(x: u32, max_epochs: f64) -> f64 {
    f64::from(x).min(max_epochs) / max_epochs
}

/// The reference's `max(-1.0, min(x, 1.0))` with Python's `min`/`max`, which a NaN loses to: NaN
/// reads −1.0 (Rust's `clamp` would keep it).
fn clamp_unit(x: f64) -> f64 {
    let upper = if 1.0 < x { 1.0 } else { x };
    if upper > -1.0 { upper } else { -1.0 }
}

/// What the observation reads, as columns: `[E]` per env, `[E × S]` per slot (row `e·S + k` = slot `k`
/// of env `e`, canonical slot order). A slot is empty (no report) when its stage has no state.
#[derive(Clone, Debug, Default)]
pub struct ObsInputs {
    pub n_envs: usize,
    pub n_slots: usize,
    /// `E`, the episode length the epoch-like features are scaled by (≥ 1).
    pub max_epochs: u32,

    // [E]: the training signals and the last action.
    pub epoch: Vec<u32>,
    pub val_loss: Vec<f64>,
    pub val_accuracy: Vec<f64>,
    /// The newest ≤ 5 values, oldest first, in the first `history_len` entries.
    pub loss_history: Vec<[f64; SIGNAL_HISTORY_EXPOSED]>,
    pub accuracy_history: Vec<[f64; SIGNAL_HISTORY_EXPOSED]>,
    pub history_len: Vec<u8>,
    pub last_action_success: Vec<bool>,
    pub last_action_op: Vec<LifecycleOp>,

    // [E × S]: the slot reports and the loop's per-slot tracking.
    pub stage: Vec<SeedStage>,
    pub blueprint: Vec<BlueprintAction>,
    /// `metrics.current_alpha` (the canonical amplitude).
    pub alpha: Vec<f64>,
    pub contribution: Vec<Option<f64>>,
    pub contribution_velocity: Vec<f64>,
    pub blend_tempo_epochs: Vec<u32>,
    /// The alpha controller's start, target, mode and steps.
    pub alpha_start: Vec<f64>,
    pub alpha_target: Vec<f64>,
    pub alpha_mode: Vec<AlphaMode>,
    pub alpha_steps_total: Vec<u32>,
    pub alpha_steps_done: Vec<u32>,
    pub alpha_algorithm: Vec<AlphaAlgorithm>,
    pub interaction_sum: Vec<f64>,
    pub gradient_norm: Vec<Option<f64>>,
    pub gradient_health: Vec<Option<f64>>,
    pub has_vanishing: Vec<Option<bool>>,
    pub has_exploding: Vec<Option<bool>>,
    pub gradient_health_prev: Vec<Option<f64>>,
    pub epochs_in_stage: Vec<u32>,
    pub epochs_since_counterfactual: Vec<Option<u32>>,
    /// Seed age (`metrics.epochs_total`).
    pub epochs_total: Vec<u32>,
}

impl ObsInputs {
    /// Size every column for `n_envs × n_slots` (allocates only when the shape grows). Values are left
    /// as they were: the caller overwrites every row.
    pub fn resize(&mut self, n_envs: usize, n_slots: usize) {
        self.n_envs = n_envs;
        self.n_slots = n_slots;
        let es = n_envs * n_slots;
        self.epoch.resize(n_envs, 0);
        self.val_loss.resize(n_envs, 0.0);
        self.val_accuracy.resize(n_envs, 0.0);
        self.loss_history.resize(n_envs, [0.0; SIGNAL_HISTORY_EXPOSED]);
        self.accuracy_history.resize(n_envs, [0.0; SIGNAL_HISTORY_EXPOSED]);
        self.history_len.resize(n_envs, 0);
        self.last_action_success.resize(n_envs, true);
        self.last_action_op.resize(n_envs, LifecycleOp::Wait);
        self.stage.resize(es, SeedStage::Dormant);
        self.blueprint.resize(es, BlueprintAction::Noop);
        self.alpha.resize(es, 0.0);
        self.contribution.resize(es, None);
        self.contribution_velocity.resize(es, 0.0);
        self.blend_tempo_epochs.resize(es, 0);
        self.alpha_start.resize(es, 0.0);
        self.alpha_target.resize(es, 0.0);
        self.alpha_mode.resize(es, AlphaMode::Hold);
        self.alpha_steps_total.resize(es, 0);
        self.alpha_steps_done.resize(es, 0);
        self.alpha_algorithm.resize(es, AlphaAlgorithm::Add);
        self.interaction_sum.resize(es, 0.0);
        self.gradient_norm.resize(es, None);
        self.gradient_health.resize(es, None);
        self.has_vanishing.resize(es, None);
        self.has_exploding.resize(es, None);
        self.gradient_health_prev.resize(es, None);
        self.epochs_in_stage.resize(es, 0);
        self.epochs_since_counterfactual.resize(es, None);
        self.epochs_total.resize(es, 0);
    }

    pub fn dim(&self) -> usize {
        obs_dim(self.n_slots)
    }
}

/// Fill `obs` (`[E, 23 + 31·S]`, row-major) and `blueprint_indices` (`[E, S]`) from `x`.
///
/// Two places where the reference raises and this encodes instead, so a diverged seed cannot stop a
/// run (the governor deals with divergence): a non-finite gradient health encodes as 0.0 ("not
/// healthy", like unmeasured telemetry). A non-finite previous gradient health cannot occur: the loop
/// stores only finite measurements. A non-finite validation loss passes through (`symlog(NaN) = NaN`)
/// as in the reference; the normaliser keeps such values out of its statistics.
pub fn build_observations(x: &ObsInputs, obs: &mut [f32], blueprint_indices: &mut [i64]) {
    let (n_envs, n_slots) = (x.n_envs, x.n_slots);
    let dim = obs_dim(n_slots);
    assert_eq!(obs.len(), n_envs * dim, "obs buffer is [E, 23 + 31·S]");
    assert_eq!(blueprint_indices.len(), n_envs * n_slots, "blueprint index buffer is [E, S]");
    let max_epochs = f64::from(x.max_epochs.max(1));
    obs.fill(0.0);
    blueprint_indices.fill(EMPTY_SLOT_BLUEPRINT);

    // Base block: the current metrics and the histories.
    for (e, row) in obs.chunks_exact_mut(dim).enumerate() {
        row[base::EPOCH] = epoch_fraction(x.epoch[e], max_epochs) as f32;
        row[base::VAL_LOSS] = (symlog(x.val_loss[e]) / SYMLOG_NORM) as f32;
        row[base::VAL_ACCURACY] = (x.val_accuracy[e] / 100.0) as f32;
        let len = usize::from(x.history_len[e]).min(SIGNAL_HISTORY_EXPOSED);
        // The newest `len` values sit in the last `len` positions; the missing oldest ones are unknown.
        let missing = SIGNAL_HISTORY_EXPOSED - len;
        for i in 0..SIGNAL_HISTORY_EXPOSED {
            let (loss, acc) = if i < missing {
                (UNKNOWN_SENTINEL, UNKNOWN_SENTINEL)
            } else {
                let v = i - missing;
                (symlog(x.loss_history[e][v]) / SYMLOG_NORM, x.accuracy_history[e][v] / 100.0)
            };
            row[base::LOSS_HISTORY + i] = loss as f32;
            row[base::ACCURACY_HISTORY + i] = acc as f32;
        }
    }

    // Base block: the last action.
    for (e, row) in obs.chunks_exact_mut(dim).enumerate() {
        row[base::LAST_ACTION_SUCCESS] = if x.last_action_success[e] { 1.0 } else { 0.0 };
        row[base::LAST_OP_ONE_HOT + x.last_action_op[e] as usize] = 1.0;
    }

    // Base block: stage counts over the configured slots (HOLDING counts FOSSILIZED too), counted as
    // whole numbers in place and then divided by S.
    for (i, &stage) in x.stage.iter().enumerate() {
        let column = match stage {
            SeedStage::Training => base::N_TRAINING,
            SeedStage::Blending => base::N_BLENDING,
            SeedStage::Holding | SeedStage::Fossilized => base::N_HOLDING,
            _ => continue,
        };
        obs[(i / n_slots) * dim + column] += 1.0;
    }
    let n = n_slots.max(1) as f64;
    for row in obs.chunks_exact_mut(dim) {
        for count in &mut row[base::N_TRAINING..=base::N_HOLDING] {
            *count = (f64::from(*count) / n) as f32;
        }
    }

    // Slot blocks: one pass over the [E × S] columns; an empty slot stays all zeros with index −1. An
    // UNKNOWN stage counts as empty: no slot with a seed state is ever UNKNOWN (the one-hot keeps its
    // column 0 for the spec's map).
    for (i, blueprint_index) in blueprint_indices.iter_mut().enumerate() {
        let stage = x.stage[i];
        if !stage.has_state() {
            continue;
        }
        let (e, k) = (i / n_slots, i % n_slots);
        *blueprint_index = x.blueprint[i] as i64;
        let at = e * dim + BASE_FEATURES + k * SLOT_FEATURES;
        let f = &mut obs[at..at + SLOT_FEATURES];
        let steps_total = x.alpha_steps_total[i];
        let steps_done = x.alpha_steps_done[i];
        let velocity = if x.alpha_mode[i] == AlphaMode::Hold || steps_total == 0 {
            0.0
        } else {
            (x.alpha_target[i] - x.alpha_start[i]) / f64::from(steps_total)
        };
        let gradient_norm = match x.gradient_norm[i] {
            Some(g) if g.is_finite() => symlog(g) / SYMLOG_NORM,
            _ => 0.0,
        };
        let gradient_health = match x.gradient_health[i] {
            Some(h) if h.is_finite() => clamp_unit(h),
            _ => 0.0,
        };
        let values: [(usize, f64); 21] = [
            (slot::IS_ACTIVE, 1.0),
            (slot::ALPHA, x.alpha[i]),
            (slot::CONTRIBUTION, clamp_unit(x.contribution[i].unwrap_or(0.0) / IMPROVEMENT_CLAMP_PP)),
            (slot::CONTRIBUTION_VELOCITY, clamp_unit(x.contribution_velocity[i] / IMPROVEMENT_CLAMP_PP)),
            (slot::BLEND_TEMPO, f64::from(x.blend_tempo_epochs[i]) / BLEND_TEMPO_NORM),
            (slot::ALPHA_TARGET, x.alpha_target[i]),
            (slot::ALPHA_MODE, f64::from(x.alpha_mode[i] as u8) / 2.0),
            (slot::ALPHA_STEPS_TOTAL, epoch_fraction(steps_total, max_epochs)),
            (slot::ALPHA_STEPS_DONE, epoch_fraction(steps_done, max_epochs)),
            (slot::TIME_TO_TARGET, epoch_fraction(steps_total.saturating_sub(steps_done), max_epochs)),
            (slot::ALPHA_VELOCITY, clamp_unit(velocity)),
            (slot::ALPHA_ALGORITHM, (f64::from(x.alpha_algorithm[i] as u8) - 1.0) / 2.0),
            (slot::INTERACTION_SUM, clamp_unit(x.interaction_sum[i] / IMPROVEMENT_CLAMP_PP)),
            (slot::GRADIENT_NORM, gradient_norm),
            (slot::GRADIENT_HEALTH, gradient_health),
            (slot::HAS_VANISHING, if x.has_vanishing[i] == Some(true) { 1.0 } else { 0.0 }),
            (slot::HAS_EXPLODING, if x.has_exploding[i] == Some(true) { 1.0 } else { 0.0 }),
            (slot::GRADIENT_HEALTH_PREV, x.gradient_health_prev[i].unwrap_or(UNKNOWN_SENTINEL)),
            (slot::EPOCHS_IN_STAGE, epoch_fraction(x.epochs_in_stage[i], max_epochs)),
            (
                slot::COUNTERFACTUAL_FRESHNESS,
                x.epochs_since_counterfactual[i].map_or(UNKNOWN_SENTINEL, |n| GAMMA.powf(f64::from(n))),
            ),
            (slot::SEED_AGE, epoch_fraction(x.epochs_total[i], max_epochs)),
        ];
        for (offset, value) in values {
            f[offset] = value as f32;
        }
        f[slot::STAGE_ONE_HOT + stage.feature_index()] = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Literal cases the property test's oracle shares helpers for: Python's `max(-1, min(NaN, 1))`
    /// reads −1.0 for a NaN contribution, velocity or interaction sum; −0.0 keeps its sign through
    /// symlog; an UNKNOWN stage is an empty slot.
    #[test]
    fn nan_clamps_to_minus_one_and_unknown_is_empty() {
        let mut x = ObsInputs { max_epochs: 10, ..ObsInputs::default() };
        x.resize(1, 2);
        x.val_loss[0] = -0.0;
        x.stage[0] = SeedStage::Training;
        x.contribution[0] = Some(f64::NAN);
        x.contribution_velocity[0] = f64::NAN;
        x.interaction_sum[0] = f64::NAN;
        x.stage[1] = SeedStage::Unknown;
        let mut obs = vec![7.0; obs_dim(2)];
        let mut indices = vec![99; 2];
        build_observations(&x, &mut obs, &mut indices);
        assert!(obs[base::VAL_LOSS] == 0.0 && obs[base::VAL_LOSS].is_sign_negative());
        let s0 = &obs[BASE_FEATURES..BASE_FEATURES + SLOT_FEATURES];
        assert_eq!(
            [s0[slot::CONTRIBUTION], s0[slot::CONTRIBUTION_VELOCITY], s0[slot::INTERACTION_SUM]],
            [-1.0, -1.0, -1.0]
        );
        assert!(obs[BASE_FEATURES + SLOT_FEATURES..].iter().all(|&v| v == 0.0));
        assert_eq!(indices, vec![0, -1]);
    }
}
