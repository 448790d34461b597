//! The per-env signal tracker (spec tamiyo §5.3): the training signals both policies read — loss and
//! accuracy histories, deltas, the plateau counter, the host-stabilization latch and the best values —
//! kept in fixed-size ring buffers so an update never allocates.
//!
//! It also defines [`SeedReport`], the small per-slot view that the tracker's summary seed and the
//! heuristic policy read, derived from the slot components of [`crate::slot`].

use crate::actions::BlueprintAction;
use crate::alpha::{AlphaController, AlphaMode};
use crate::slot::{Blueprint, SeedAlpha, SeedMetrics, SlotState, Stage, StageCounters};
use crate::stage::SeedStage;
use bevy_ecs::component::Component;
use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Length of the tracker's loss/accuracy deques (`history_window`).
pub const SIGNAL_HISTORY_WINDOW: usize = 10;
/// How many of the newest history values the signals expose (observation indices 3–7 and 8–12).
pub const SIGNAL_HISTORY_EXPOSED: usize = 5;

/// Accuracy gain (pp) below which an epoch counts towards the plateau.
pub const DEFAULT_PLATEAU_THRESHOLD_PCT: f64 = 0.5;
/// Relative loss improvement below which an epoch is "stable" (`DEFAULT_STABILIZATION_THRESHOLD`).
pub const DEFAULT_STABILIZATION_THRESHOLD: f64 = 0.03;
/// Consecutive stable epochs that latch `host_stabilized` (`DEFAULT_STABILIZATION_EPOCHS`).
pub const DEFAULT_STABILIZATION_EPOCHS: u32 = 3;
/// Relative loss regression beyond which an epoch is not stable.
pub const DEFAULT_REGRESSION_THRESHOLD: f64 = 0.05;
/// `prev_loss` must exceed this for the relative improvement to be computed.
const STABILIZATION_EPS: f64 = 1e-8;

/// A fixed-capacity FIFO of the newest `N` values (a `deque(maxlen=N)` without allocation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HistoryRing<const N: usize> {
    values: [f64; N],
    /// Index of the oldest value.
    head: usize,
    len: usize,
}

impl<const N: usize> Default for HistoryRing<N> {
    fn default() -> Self {
        Self { values: [0.0; N], head: 0, len: 0 }
    }
}

impl<const N: usize> HistoryRing<N> {
    pub const CAPACITY: usize = N;

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Append `v`, dropping the oldest value when full.
    pub fn push(&mut self, v: f64) {
        if self.len < N {
            self.values[(self.head + self.len) % N] = v;
            self.len += 1;
        } else {
            self.values[self.head] = v;
            self.head = (self.head + 1) % N;
        }
    }

    /// Append `v` to a deque whose `maxlen` is `limit` (≤ N): drops the oldest value when `limit` are held.
    pub fn push_bounded(&mut self, v: f64, limit: usize) {
        let limit = limit.clamp(1, N);
        while self.len >= limit {
            self.head = (self.head + 1) % N;
            self.len -= 1;
        }
        self.push(v);
    }

    /// Mean, summed oldest → newest (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.len == 0 { 0.0 } else { self.iter().sum::<f64>() / self.len as f64 }
    }

    /// The `i`-th value, oldest first.
    pub fn get(&self, i: usize) -> Option<f64> {
        (i < self.len).then(|| self.values[(self.head + i) % N])
    }

    /// Values oldest → newest.
    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        (0..self.len).map(move |i| self.values[(self.head + i) % N])
    }

    pub fn newest(&self) -> Option<f64> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    /// The newest `M` values, oldest first, in the first `count` entries (the rest are 0.0).
    pub fn last<const M: usize>(&self) -> ([f64; M], usize) {
        let count = self.len.min(M);
        let mut out = [0.0; M];
        for (k, slot) in out.iter_mut().take(count).enumerate() {
            *slot = self.get(self.len - count + k).expect("index within len");
        }
        (out, count)
    }

    /// Python's `min(deque)`: the first value, replaced by any later value strictly below it (so a
    /// leading NaN sticks and a later NaN is skipped). `None` when empty.
    pub fn python_min(&self) -> Option<f64> {
        let mut it = self.iter();
        let first = it.next()?;
        Some(it.fold(first, |m, x| if x < m { x } else { m }))
    }
}

/// Tracker settings (`SignalTracker` defaults). The history window is the fixed
/// [`SIGNAL_HISTORY_WINDOW`].
#[derive(Resource, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignalConfig {
    pub plateau_threshold_pct: f64,
    pub stabilization_threshold: f64,
    /// 0 = stabilized from the start (the gate is disabled).
    pub stabilization_epochs: u32,
    pub regression_threshold: f64,
}

impl Default for SignalConfig {
    fn default() -> Self {
        Self {
            plateau_threshold_pct: DEFAULT_PLATEAU_THRESHOLD_PCT,
            stabilization_threshold: DEFAULT_STABILIZATION_THRESHOLD,
            stabilization_epochs: DEFAULT_STABILIZATION_EPOCHS,
            regression_threshold: DEFAULT_REGRESSION_THRESHOLD,
        }
    }
}

/// What one epoch produced for one env (accuracies in pp, 0–100).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochObservation {
    /// Host epoch, 1-based.
    pub epoch: u32,
    pub global_step: u64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub val_loss: f64,
    pub val_accuracy: f64,
}

/// What the tracker and the heuristic read of one slot (the reference's `SeedStateReport` / `SeedState`
/// fields they use). An empty slot reports `stage == Dormant`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedReport {
    /// Canonical slot index (slot-head index).
    pub slot: u8,
    pub stage: SeedStage,
    pub epochs_in_stage: u32,
    pub epochs_total: u32,
    /// The canonical amplitude (`state.alpha`).
    pub alpha: f64,
    /// The alpha controller's target and mode.
    pub alpha_target: f64,
    pub alpha_mode: AlphaMode,
    pub counterfactual_contribution: Option<f64>,
    pub improvement_since_stage_start: f64,
    pub total_improvement: f64,
    pub blueprint: BlueprintAction,
}

impl SeedReport {
    /// Build from the slot's components (what a read-only ECS query yields).
    pub fn from_components(
        slot: u8,
        stage: &Stage,
        counters: &StageCounters,
        metrics: &SeedMetrics,
        alpha: &SeedAlpha,
        controller: &AlphaController,
        blueprint: &Blueprint,
    ) -> Self {
        Self {
            slot,
            stage: stage.current,
            epochs_in_stage: counters.epochs_in_stage,
            epochs_total: counters.epochs_total,
            alpha: alpha.0,
            alpha_target: controller.target,
            alpha_mode: controller.mode,
            counterfactual_contribution: metrics.counterfactual_contribution,
            improvement_since_stage_start: metrics.improvement_since_stage_start(),
            total_improvement: metrics.total_improvement(),
            blueprint: blueprint.0,
        }
    }

    pub fn from_state(slot: u8, s: &SlotState) -> Self {
        Self::from_components(slot, &s.stage, &s.counters, &s.metrics, &s.alpha, &s.controller, &s.blueprint)
    }

    /// Reports of one env's slots, slot index = position.
    pub fn from_states<const K: usize>(slots: &[SlotState; K]) -> [SeedReport; K] {
        std::array::from_fn(|i| Self::from_state(i as u8, &slots[i]))
    }

    /// The slot holds a seed module (GERMINATED..FOSSILIZED): an "active seed" of the reference loops.
    pub fn has_seed(&self) -> bool {
        self.stage.has_seed()
    }

    /// Empty (no state): available for germination.
    pub fn is_empty(&self) -> bool {
        !self.stage.has_state()
    }
}

/// `TrainingSignals` (+ its nested `TrainingMetrics`): everything a policy reads about the host's
/// progress this epoch. Plain `Copy` data.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingSignals {
    pub epoch: u32,
    pub global_step: u64,
    pub train_loss: f64,
    pub train_accuracy: f64,
    pub val_loss: f64,
    pub val_accuracy: f64,
    /// `prev_loss − val_loss` (positive = improvement; +inf on the first epoch).
    pub loss_delta: f64,
    /// `val_accuracy − prev_accuracy` (prev starts at 0).
    pub accuracy_delta: f64,
    pub plateau_epochs: u32,
    pub host_stabilized: bool,
    /// Running max of val accuracy (starts at 0).
    pub best_val_accuracy: f64,
    /// Minimum over the history window (NOT the global best); +inf when the window is empty.
    pub best_val_loss: f64,
    /// Newest ≤ 5 values, oldest first, in the first `history_len` entries.
    pub loss_history: [f64; SIGNAL_HISTORY_EXPOSED],
    pub accuracy_history: [f64; SIGNAL_HISTORY_EXPOSED],
    pub history_len: u8,
    /// Enabled slots with no state (cooldown stages are NOT available).
    pub available_slots: u32,
    /// Slots holding a seed module (the reference's `active_seeds`).
    pub active_seed_count: u32,
    /// Legacy summary of the "most advanced" seed (0 / 0 / 0.0 / 0.0 without seeds).
    pub seed_stage: u8,
    pub seed_epochs_in_stage: u32,
    pub seed_alpha: f64,
    pub seed_improvement: f64,
    /// The summary seed's slot, if any.
    pub summary_slot: Option<u8>,
}

impl TrainingSignals {
    pub fn loss_history(&self) -> &[f64] {
        &self.loss_history[..self.history_len as usize]
    }

    pub fn accuracy_history(&self) -> &[f64] {
        &self.accuracy_history[..self.history_len as usize]
    }
}

/// The summary seed: max by (stage value, alpha, −counterfactual with None → +inf, seed id). esper-ecs
/// has no seed ids; the final tie-break is the slot index (the higher index wins), which only matters
/// for seeds equal in stage, alpha and contribution.
pub fn summary_seed(slots: &[SeedReport]) -> Option<&SeedReport> {
    fn key_cmp(a: &SeedReport, b: &SeedReport) -> Ordering {
        let neg_cc = |s: &SeedReport| -s.counterfactual_contribution.unwrap_or(f64::INFINITY);
        a.stage
            .value()
            .cmp(&b.stage.value())
            .then(a.alpha.partial_cmp(&b.alpha).unwrap_or(Ordering::Equal))
            .then(neg_cc(a).partial_cmp(&neg_cc(b)).unwrap_or(Ordering::Equal))
            .then(a.slot.cmp(&b.slot))
    }
    slots.iter().filter(|s| s.has_seed()).max_by(|a, b| key_cmp(a, b))
}

/// One env's `SignalTracker` state: the two 10-long histories, the plateau counter, the stabilization
/// latch, best accuracy and the previous epoch's values.
#[derive(Component, Clone, Copy, Debug, PartialEq)]
pub struct SignalTracker {
    pub loss_history: HistoryRing<SIGNAL_HISTORY_WINDOW>,
    pub accuracy_history: HistoryRing<SIGNAL_HISTORY_WINDOW>,
    pub best_accuracy: f64,
    pub plateau_count: u32,
    /// Latch: once true it never resets within an episode.
    pub is_stabilized: bool,
    pub stable_count: u32,
    pub prev_accuracy: f64,
    pub prev_loss: f64,
}

impl SignalTracker {
    /// A fresh tracker (stabilized from the start iff `stabilization_epochs == 0`).
    pub fn new(config: &SignalConfig) -> Self {
        Self {
            loss_history: HistoryRing::default(),
            accuracy_history: HistoryRing::default(),
            best_accuracy: 0.0,
            plateau_count: 0,
            is_stabilized: config.stabilization_epochs == 0,
            stable_count: 0,
            prev_accuracy: 0.0,
            prev_loss: f64::INFINITY,
        }
    }

    /// `reset()` (new episode).
    pub fn reset(&mut self, config: &SignalConfig) {
        *self = Self::new(config);
    }

    /// One epoch's update (after validation): deltas, plateau counter, stabilization, best accuracy,
    /// histories; returns the signals, whose histories already contain this epoch's values.
    pub fn update(
        &mut self,
        config: &SignalConfig,
        obs: &EpochObservation,
        slots: &[SeedReport],
    ) -> TrainingSignals {
        let loss_delta = self.prev_loss - obs.val_loss;
        let accuracy_delta = obs.val_accuracy - self.prev_accuracy;

        if accuracy_delta < config.plateau_threshold_pct {
            self.plateau_count += 1;
        } else {
            self.plateau_count = 0;
        }

        if !self.is_stabilized && self.prev_loss.is_finite() && self.prev_loss > STABILIZATION_EPS {
            let relative = loss_delta / self.prev_loss;
            let stable = -config.regression_threshold < relative && relative < config.stabilization_threshold;
            if stable {
                self.stable_count += 1;
                if self.stable_count >= config.stabilization_epochs {
                    self.is_stabilized = true;
                }
            } else {
                self.stable_count = 0;
            }
        }

        if obs.val_accuracy > self.best_accuracy {
            self.best_accuracy = obs.val_accuracy;
        }
        self.loss_history.push(obs.val_loss);
        self.accuracy_history.push(obs.val_accuracy);

        let best_val_loss = self.loss_history.python_min().unwrap_or(f64::INFINITY);
        let signals = self.signals(obs, loss_delta, accuracy_delta, self.best_accuracy, best_val_loss, slots);
        self.prev_loss = obs.val_loss;
        self.prev_accuracy = obs.val_accuracy;
        signals
    }

    /// `peek()`: the signals for `obs` from the current state without changing it (bootstrap). Deltas
    /// are taken against the previous values, the counters and histories are the current ones (the
    /// histories do not gain `obs`), best accuracy/loss include `obs`.
    pub fn peek(&self, obs: &EpochObservation, slots: &[SeedReport]) -> TrainingSignals {
        let loss_delta = self.prev_loss - obs.val_loss;
        let accuracy_delta = obs.val_accuracy - self.prev_accuracy;
        // Python's max(a, b) / min(a, b): the second argument only wins when strictly better.
        let best_acc =
            if obs.val_accuracy > self.best_accuracy { obs.val_accuracy } else { self.best_accuracy };
        let window_min = self.loss_history.python_min().unwrap_or(f64::INFINITY);
        let best_loss = if obs.val_loss < window_min { obs.val_loss } else { window_min };
        self.signals(obs, loss_delta, accuracy_delta, best_acc, best_loss, slots)
    }

    fn signals(
        &self,
        obs: &EpochObservation,
        loss_delta: f64,
        accuracy_delta: f64,
        best_val_accuracy: f64,
        best_val_loss: f64,
        slots: &[SeedReport],
    ) -> TrainingSignals {
        let (loss_history, n) = self.loss_history.last::<SIGNAL_HISTORY_EXPOSED>();
        let (accuracy_history, _) = self.accuracy_history.last::<SIGNAL_HISTORY_EXPOSED>();
        let summary = summary_seed(slots);
        TrainingSignals {
            epoch: obs.epoch,
            global_step: obs.global_step,
            train_loss: obs.train_loss,
            train_accuracy: obs.train_accuracy,
            val_loss: obs.val_loss,
            val_accuracy: obs.val_accuracy,
            loss_delta,
            accuracy_delta,
            plateau_epochs: self.plateau_count,
            host_stabilized: self.is_stabilized,
            best_val_accuracy,
            best_val_loss,
            loss_history,
            accuracy_history,
            history_len: n as u8,
            available_slots: slots.iter().filter(|s| s.is_empty()).count() as u32,
            active_seed_count: slots.iter().filter(|s| s.has_seed()).count() as u32,
            seed_stage: summary.map_or(0, |s| s.stage.value()),
            seed_epochs_in_stage: summary.map_or(0, |s| s.epochs_in_stage),
            seed_alpha: summary.map_or(0.0, |s| s.alpha),
            seed_improvement: summary.map_or(0.0, |s| s.improvement_since_stage_start),
            summary_slot: summary.map(|s| s.slot),
        }
    }
}

impl Default for SignalTracker {
    fn default() -> Self {
        Self::new(&SignalConfig::default())
    }
}
