//! Tolaria's governor (spec tamiyo §6.2–6.6, simic §1.6): the per-env watchdog that checks the
//! validation loss once per epoch for catastrophic failure (NaN/inf, "lobotomy", divergence), decides
//! when the last-known-good weights are snapshotted, what a rollback does to the env's seeds, and vetoes
//! lifecycle mutations on an unhealthy env.
//!
//! Only the decisions live here. Copying weights into and out of the snapshot, clearing optimizer state
//! and writing the death penalty into the rollout buffer are kernel/system work: a system turns the
//! per-env results ([`VitalSigns`]) into batched masks over envs.

use crate::actions::LifecycleOp;
use crate::actions::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, FactoredAction,
};
use crate::lifecycle::prune;
use crate::signals::HistoryRing;
use crate::slot::{PruneInitiator, PruneReason, SlotMut, SlotState};
use crate::stage::SeedStage;
use bevy_ecs::component::Component;
use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};
use std::fmt;

/// History samples needed before the lobotomy and divergence checks run (hard-coded in the reference;
/// also the smallest allowed window).
pub const GOVERNOR_MIN_SAMPLES: usize = 10;
/// Largest supported history window (the ring is a fixed array).
pub const GOVERNOR_MAX_HISTORY_WINDOW: usize = 32;
/// Periodic snapshot cadence in host epochs (`epoch % 5 == 0`).
pub const SNAPSHOT_EVERY_EPOCHS: u32 = 5;
/// Lobotomy: the history mean must be below this fraction of the random-guess loss…
pub const LOBOTOMY_MEAN_FRACTION: f64 = 0.6;
/// …and the loss within this fraction of it.
pub const LOBOTOMY_TOLERANCE_FRACTION: f64 = 0.065;

/// Why a governor config was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GovernorConfigError {
    HistoryWindowTooSmall(usize),
    HistoryWindowTooLarge(usize),
}

impl fmt::Display for GovernorConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HistoryWindowTooSmall(w) => {
                write!(f, "governor history_window {w} is below the minimum of {GOVERNOR_MIN_SAMPLES}")
            }
            Self::HistoryWindowTooLarge(w) => {
                write!(f, "governor history_window {w} exceeds the supported {GOVERNOR_MAX_HISTORY_WINDOW}")
            }
        }
    }
}

impl std::error::Error for GovernorConfigError {}

/// `TolariaGovernor` settings (tamiyo §6.2 defaults).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GovernorConfig {
    /// σ multiplier of the statistical threshold.
    pub sensitivity: f64,
    /// The loss must exceed this multiple of the history mean.
    pub multiplier: f64,
    /// The loss must exceed this absolute value.
    pub absolute_threshold: f64,
    pub death_penalty: f64,
    pub history_window: usize,
    pub min_panics_before_rollback: u32,
    /// Loss of a uniform prediction: ln(num_classes) (ln(vocab) for LM).
    pub random_guess_loss: f64,
}

impl Default for GovernorConfig {
    /// The reference defaults with `random_guess_loss = ln 10`.
    fn default() -> Self {
        Self {
            sensitivity: 6.0,
            multiplier: 3.0,
            absolute_threshold: 12.0,
            death_penalty: 10.0,
            history_window: 20,
            min_panics_before_rollback: 3,
            random_guess_loss: 10f64.ln(),
        }
    }
}

impl GovernorConfig {
    /// Defaults for a classification task with `num_classes` classes (or an LM with that vocabulary).
    pub fn for_classes(num_classes: u32) -> Self {
        Self { random_guess_loss: f64::from(num_classes).ln(), ..Self::default() }
    }

    pub fn validate(&self) -> Result<(), GovernorConfigError> {
        if self.history_window < GOVERNOR_MIN_SAMPLES {
            return Err(GovernorConfigError::HistoryWindowTooSmall(self.history_window));
        }
        if self.history_window > GOVERNOR_MAX_HISTORY_WINDOW {
            return Err(GovernorConfigError::HistoryWindowTooLarge(self.history_window));
        }
        Ok(())
    }

    /// `get_punishment_reward()`: the raw death penalty, −10 by default.
    pub fn punishment_reward(&self) -> f64 {
        -self.death_penalty
    }
}

/// Why the governor panicked (`panic_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PanicReason {
    /// Non-finite loss (immediate).
    Nan,
    /// A well-trained model suddenly at the random-guess loss (immediate).
    Lobotomy,
    /// A statistical loss explosion, `min_panics_before_rollback` checks in a row.
    Divergence,
    /// Rollback with no recorded reason (the default).
    Rollback,
}

impl PanicReason {
    /// The reason every live seed is pruned with on rollback.
    pub fn prune_reason(self) -> PruneReason {
        match self {
            Self::Nan => PruneReason::GovernorNan,
            Self::Lobotomy => PruneReason::GovernorLobotomy,
            Self::Divergence => PruneReason::GovernorDivergence,
            Self::Rollback => PruneReason::GovernorRollback,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nan => "governor_nan",
            Self::Lobotomy => "governor_lobotomy",
            Self::Divergence => "governor_divergence",
            Self::Rollback => "governor_rollback",
        }
    }
}

/// The result of one epoch's check for one env: whether to roll back, and whether to snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VitalSigns {
    /// Roll back this env at action time (tamiyo §6.7), pruning with this reason.
    pub panic: Option<PanicReason>,
    /// Copy the env's host weights (+ fossilized seeds) into its last-known-good snapshot now.
    pub snapshot: bool,
}

/// What a rollback reports (`GovernorReport`, reason "Structural Collapse", plus what its telemetry
/// carries). The reference report's own `consecutive_panics` field is always 0 (read after the reset).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RollbackReport {
    pub reason: PanicReason,
    /// NaN when no panic loss was recorded.
    pub loss_at_panic: f64,
    /// `mean + sensitivity·std` of the history at rollback time (0 for an empty history).
    pub loss_threshold: f64,
    /// The counter before the reset (telemetry).
    pub consecutive_panics: u32,
}

/// The snapshot cadence (tamiyo §6.4): every [`SNAPSHOT_EVERY_EPOCHS`] epochs, or when a fossilization
/// happened since the last check. Only consulted after a check that did not panic.
pub fn snapshot_due(epoch: u32, fossilized_since_last_check: bool) -> bool {
    epoch.is_multiple_of(SNAPSHOT_EVERY_EPOCHS) || fossilized_since_last_check
}

/// One env's governor state (tamiyo §6.2). The weights snapshot itself is a kernel resource; the
/// reference takes one at construction and on `reset()`, i.e. whenever an env gets a fresh host.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq)]
pub struct GovernorState {
    /// Healthy validation losses, at most `history_window`, oldest first.
    pub loss_history: HistoryRing<GOVERNOR_MAX_HISTORY_WINDOW>,
    pub consecutive_panics: u32,
    /// A divergence was seen but has not yet reached the rollback threshold.
    pub pending_panic: bool,
    pub panic_loss: Option<f64>,
    pub panic_reason: Option<PanicReason>,
    /// The trainer's `needs_governor_snapshot`: set by a successful FOSSILIZE, cleared by a snapshot.
    pub fossilized_since_snapshot: bool,
}

impl GovernorState {
    /// `reset()` (new episode): clear history and panic state. The caller also takes a fresh snapshot.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Population mean and standard deviation of the history (std 0 when the variance is not positive).
    pub fn history_stats(&self) -> (f64, f64) {
        let h = &self.loss_history;
        if h.is_empty() {
            return (0.0, 0.0);
        }
        let mean = h.mean();
        let var = h.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / h.len() as f64;
        (mean, if var > 0.0 { var.sqrt() } else { 0.0 })
    }

    /// `check_vital_signs(loss)` (tamiyo §6.3): `Some(reason)` means roll back.
    ///
    /// * NaN/±inf → `Nan` at once; history and the consecutive counter are left alone.
    /// * With ≥ 10 samples: history mean < 0.6·RGL and |loss − RGL| < 0.065·RGL → `Lobotomy` at once.
    /// * Fewer than 10 samples → the loss joins the history (warm-up), no panic.
    /// * Anomaly = loss > absolute ∧ loss > mean + sensitivity·std ∧ loss > multiplier·mean: the counter
    ///   grows and the loss is NOT added to the history; `Divergence` once the counter reaches
    ///   `min_panics_before_rollback` (and on every further consecutive anomaly).
    /// * Otherwise the loss joins the history and the panic state clears.
    pub fn check_vital_signs(&mut self, config: &GovernorConfig, loss: f64) -> Option<PanicReason> {
        if !loss.is_finite() {
            self.panic_reason = Some(PanicReason::Nan);
            self.panic_loss = Some(loss);
            self.pending_panic = false;
            return Some(PanicReason::Nan);
        }
        let rgl = config.random_guess_loss;
        if self.loss_history.len() >= GOVERNOR_MIN_SAMPLES {
            let mean = self.loss_history.mean();
            if mean < LOBOTOMY_MEAN_FRACTION * rgl && (loss - rgl).abs() < LOBOTOMY_TOLERANCE_FRACTION * rgl {
                // The spec only names the reason; like NaN, the loss is remembered for the report and
                // the history and counter are left alone.
                self.panic_reason = Some(PanicReason::Lobotomy);
                self.panic_loss = Some(loss);
                self.pending_panic = false;
                return Some(PanicReason::Lobotomy);
            }
        }
        if self.loss_history.len() < GOVERNOR_MIN_SAMPLES {
            self.loss_history.push_bounded(loss, config.history_window);
            self.panic_reason = None;
            return None;
        }
        let (mean, std) = self.history_stats();
        let anomaly = loss > config.absolute_threshold
            && loss > mean + config.sensitivity * std
            && loss > config.multiplier * mean;
        if anomaly {
            self.consecutive_panics += 1;
            self.pending_panic = true;
            self.panic_loss = Some(loss);
            self.panic_reason = Some(PanicReason::Divergence);
            (self.consecutive_panics >= config.min_panics_before_rollback).then_some(PanicReason::Divergence)
        } else {
            self.loss_history.push_bounded(loss, config.history_window);
            self.consecutive_panics = 0;
            self.pending_panic = false;
            self.panic_loss = None;
            self.panic_reason = None;
            None
        }
    }

    /// A successful FOSSILIZE: the next healthy check snapshots (the fossil's weights must be in it).
    pub fn note_fossilization(&mut self) {
        self.fossilized_since_snapshot = true;
    }

    /// The trainer's per-epoch governor step: check the loss first; only a check that does not panic
    /// may snapshot ([`snapshot_due`]), which clears the fossilization flag. Reference quirk kept: a
    /// divergence below the consecutive threshold does not panic, so it does not block a snapshot.
    pub fn check_and_snapshot(&mut self, config: &GovernorConfig, epoch: u32, loss: f64) -> VitalSigns {
        let panic = self.check_vital_signs(config, loss);
        let snapshot = panic.is_none() && snapshot_due(epoch, self.fossilized_since_snapshot);
        if snapshot {
            self.fossilized_since_snapshot = false;
        }
        VitalSigns { panic, snapshot }
    }

    /// The reason a rollback prunes with (`panic_reason`, defaulting to `Rollback`).
    pub fn rollback_reason(&self) -> PanicReason {
        self.panic_reason.unwrap_or(PanicReason::Rollback)
    }

    /// `execute_rollback` minus the weights (tamiyo §6.5): report, then reset the panic state (the
    /// history is kept). The caller restores the snapshot, clears host and seed optimizer state, and
    /// prunes the env's live seeds with [`rollback_prune_slots`] using `report.reason`, stores no
    /// transition for the step, sets `last_action_success = false` / `last_action_op = WAIT` and zeroes
    /// the env's LSTM hidden state (tamiyo §6.7).
    pub fn execute_rollback(&mut self, config: &GovernorConfig) -> RollbackReport {
        let (mean, std) = self.history_stats();
        let report = RollbackReport {
            reason: self.rollback_reason(),
            loss_at_panic: self.panic_loss.unwrap_or(f64::NAN),
            loss_threshold: mean + config.sensitivity * std,
            consecutive_panics: self.consecutive_panics,
        };
        self.consecutive_panics = 0;
        self.pending_panic = false;
        self.panic_loss = None;
        self.panic_reason = None;
        report
    }
}

/// Rollback prune of one slot: `prune(reason, initiator = Governor)`. Live seeds go to PRUNED (then the
/// Kasmina cooldown); FOSSILIZED, cooldown and empty slots are untouched. Returns whether it pruned.
pub fn rollback_prune_slot(slot: &mut SlotMut, reason: PanicReason) -> bool {
    prune(slot, reason.prune_reason(), PruneInitiator::Governor)
}

/// Rollback prune of every slot of one env; bit `i` of the result is set when slot `i` was pruned.
pub fn rollback_prune_slots(slots: &mut [SlotMut], reason: PanicReason) -> u32 {
    slots.iter_mut().enumerate().fold(
        0,
        |mask, (i, s)| {
            if rollback_prune_slot(s, reason) { mask | (1 << i) } else { mask }
        },
    )
}

/// [`rollback_prune_slots`] over owned slot states.
pub fn rollback_prune_states(slots: &mut [SlotState], reason: PanicReason) -> u32 {
    slots.iter_mut().enumerate().fold(0, |mask, (i, s)| {
        if rollback_prune_slot(&mut s.view(), reason) { mask | (1 << i) } else { mask }
    })
}

/// Why the preflight vetoed a mutation (`blocked_factor`), in check order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockedFactor {
    ValLossFinite,
    ValAccuracyFinite,
    CooldownNonnegative,
    ActiveSeedCapacity,
    BlueprintPresent,
    SlotEmptyForGermination,
    AlphaTargetPresent,
    AlphaScheduleComplete,
}

impl BlockedFactor {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ValLossFinite => "val_loss_finite",
            Self::ValAccuracyFinite => "val_accuracy_finite",
            Self::CooldownNonnegative => "cooldown_nonnegative",
            Self::ActiveSeedCapacity => "active_seed_capacity",
            Self::BlueprintPresent => "blueprint_present",
            Self::SlotEmptyForGermination => "slot_empty_for_germination",
            Self::AlphaTargetPresent => "alpha_target_present",
            Self::AlphaScheduleComplete => "alpha_schedule_complete",
        }
    }
}

/// The inputs of `preflight_lifecycle_mutation` that decide the verdict (the parameter counts only feed
/// the health snapshot of its telemetry and are left out).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreflightRequest {
    pub op: LifecycleOp,
    pub blueprint: Option<BlueprintAction>,
    pub alpha_target: Option<f64>,
    pub speed_steps: Option<u32>,
    pub curve: Option<AlphaCurveAction>,
    pub val_loss: f64,
    pub val_accuracy: f64,
    /// The target slot's stage if it holds a live seed module, else None (cooldown stages → None).
    pub seed_stage: Option<SeedStage>,
    /// 0 = unlimited.
    pub max_seeds: u32,
    pub active_seed_count: u32,
    /// Always 0 in the reference loop.
    pub cooldown_remaining: i64,
}

impl PreflightRequest {
    /// The request for a decoded factored action on a slot in `slot_stage`.
    pub fn from_action(
        action: &FactoredAction,
        slot_stage: SeedStage,
        val_loss: f64,
        val_accuracy: f64,
        max_seeds: u32,
        active_seed_count: u32,
    ) -> Option<Self> {
        Some(Self {
            op: LifecycleOp::from_index(action.op)?,
            blueprint: BlueprintAction::from_index(action.blueprint),
            alpha_target: AlphaTargetAction::from_index(action.alpha_target).map(AlphaTargetAction::value),
            speed_steps: AlphaSpeedAction::from_index(action.alpha_speed).map(AlphaSpeedAction::steps),
            curve: AlphaCurveAction::from_index(action.alpha_curve),
            val_loss,
            val_accuracy,
            seed_stage: slot_stage.has_seed().then_some(slot_stage),
            max_seeds,
            active_seed_count,
            cooldown_remaining: 0,
        })
    }
}

/// `preflight_lifecycle_mutation` (tamiyo §6.6): the first failing check vetoes. The loop calls it only
/// for non-WAIT ops on enabled slots; a WAIT is always allowed here. A veto means: no mutation, the op
/// is rewarded as WAIT and `last_action_success = false`.
pub fn preflight_lifecycle_mutation(req: &PreflightRequest) -> Result<(), BlockedFactor> {
    use BlockedFactor::*;
    if req.op == LifecycleOp::Wait {
        return Ok(());
    }
    if !req.val_loss.is_finite() {
        return Err(ValLossFinite);
    }
    if !req.val_accuracy.is_finite() {
        return Err(ValAccuracyFinite);
    }
    if req.cooldown_remaining < 0 {
        return Err(CooldownNonnegative);
    }
    if req.max_seeds > 0 && req.active_seed_count > req.max_seeds {
        return Err(ActiveSeedCapacity);
    }
    if req.op == LifecycleOp::Germinate {
        if req.blueprint.is_none() {
            return Err(BlueprintPresent);
        }
        if req.seed_stage.is_some() {
            return Err(SlotEmptyForGermination);
        }
    }
    if req.op == LifecycleOp::SetAlphaTarget && req.alpha_target.is_none() {
        return Err(AlphaTargetPresent);
    }
    if matches!(req.op, LifecycleOp::SetAlphaTarget | LifecycleOp::Prune)
        && (req.speed_steps.is_none() || req.curve.is_none())
    {
        return Err(AlphaScheduleComplete);
    }
    Ok(())
}
