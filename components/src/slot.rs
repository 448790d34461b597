//! Per-slot state as small plain components (spec kasmina §2). One entity per (env, slot) carries all of
//! them; bevy stores each as a column, so a query over slots walks contiguous memory.
//!
//! The reference keeps a `SeedState` that is either present or `None`. Here every slot always has every
//! component, and an empty slot is the all-default value of each (`Stage::current == Dormant`):
//! germination starts from that default, and RESETTING completion writes it back, so an empty slot can
//! never carry leftover state.

use crate::actions::{AlphaAlgorithm, BlendId, BlueprintAction};
use crate::alpha::AlphaController;
use crate::stage::SeedStage;
use bevy_ecs::component::Component;
use bevy_ecs::entity::Entity;
use serde::{Deserialize, Serialize};

/// The env entity a slot belongs to.
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotOf(pub Entity);

/// The slot's canonical index in [`crate::SlotConfig`] (its slot-head index).
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotIndex(pub u8);

/// Current and previous stage (PBRS reward shaping reads the previous one).
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    pub current: SeedStage,
    /// UNKNOWN until the first transition.
    pub previous: SeedStage,
    pub previous_epochs_in_stage: u32,
}

impl Default for Stage {
    /// An empty slot: DORMANT with no previous stage.
    fn default() -> Self {
        Self { current: SeedStage::Dormant, previous: SeedStage::Unknown, previous_epochs_in_stage: 0 }
    }
}

/// Epoch counters: `epochs_total` (seed age, PRUNE needs ≥ 5) and `epochs_in_stage` (eics, reset on every
/// transition). They are also the cooldown counters of EMBARGOED / RESETTING.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCounters {
    pub epochs_total: u32,
    pub epochs_in_stage: u32,
}

/// Why a seed was pruned. Governor reasons mark the prune as automatic (reward penalty).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PruneReason {
    /// A PRUNE op (instant, or the schedule that a ramped prune completes).
    Policy,
    /// Default reason of a scheduled prune that carried none.
    ScheduledPrune,
    GovernorNan,
    GovernorLobotomy,
    GovernorDivergence,
    GovernorRollback,
}

impl PruneReason {
    pub fn is_governor(self) -> bool {
        matches!(
            self,
            Self::GovernorNan | Self::GovernorLobotomy | Self::GovernorDivergence | Self::GovernorRollback
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PruneInitiator {
    Policy,
    Governor,
}

/// Accuracy bookkeeping and counterfactual measurements (spec kasmina §2.3). Accuracies in pp (0–100).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedMetrics {
    pub initial_val_accuracy: f64,
    pub current_val_accuracy: f64,
    pub best_val_accuracy: f64,
    pub accuracy_at_stage_start: f64,
    pub accuracy_at_blending_start: f64,
    pub blending_started: bool,
    /// `val_acc − acc(with this slot's alpha forced to 0)`; None until first measured at alpha > 0.
    pub counterfactual_contribution: Option<f64>,
    pub prev_contribution: Option<f64>,
    pub contribution_velocity: f64,
    /// EMA of the seed/host gradient-norm ratio; None = never measured.
    pub seed_gradient_norm_ratio: Option<f64>,
    /// Trainable host parameters, recorded at germination (kasmina §3.4 step 8).
    pub host_param_count: u64,
    /// Trainable parameters of the seed module, recorded at germination.
    pub seed_param_count: u64,
    /// Parameters of the slot's GatedBlend gate network, recorded at germination; they count toward
    /// the seed's parameters only while the gate exists (`BlendStyle::has_gate`).
    pub gate_param_count: u64,
    /// Controller steps done, mirrored after each BLENDING tick.
    pub alpha_ramp_step: u32,
    pub interaction_sum: f64,
    pub boost_received: f64,
    pub upstream_alpha_sum: f64,
    pub downstream_alpha_sum: f64,
    /// Set by a governor prune; read and cleared by the loop after the tick.
    pub auto_pruned: Option<PruneReason>,
}

impl SeedMetrics {
    pub fn total_improvement(&self) -> f64 {
        self.current_val_accuracy - self.initial_val_accuracy
    }

    pub fn improvement_since_stage_start(&self) -> f64 {
        self.current_val_accuracy - self.accuracy_at_stage_start
    }

    /// The seed's parameters with its gate when it has one (`P_slot` of simic §2.0).
    pub fn params_with_gate(&self, has_gate: bool) -> u64 {
        self.seed_param_count + if has_gate { self.gate_param_count } else { 0 }
    }

    /// 0 if blending never started (telemetry only).
    pub fn blending_delta(&self) -> f64 {
        if self.blending_started { self.current_val_accuracy - self.accuracy_at_blending_start } else { 0.0 }
    }
}

/// Gradient health telemetry (spec kasmina §2.4). All None = unmeasured; only a real gradient collection
/// fills them, and nothing ever resets them to "healthy".
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GradientTelemetry {
    pub gradient_norm: Option<f64>,
    pub gradient_health: Option<f64>,
    pub has_vanishing: Option<bool>,
    pub has_exploding: Option<bool>,
}

impl GradientTelemetry {
    pub fn measured(&self) -> bool {
        self.gradient_health.is_some()
    }
}

/// The amplitude the forward pass uses and the policy observes (`state.alpha` = `metrics.current_alpha`).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedAlpha(pub f64);

/// How the seed is blended in: blend id (chooses the germination ramp curve), algorithm, the BLENDING
/// ramp's target and whether a GatedBlend gate module exists.
#[derive(Component, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlendStyle {
    pub blend: BlendId,
    pub algorithm: AlphaAlgorithm,
    pub alpha_target: f64,
    pub has_gate: bool,
}

impl Default for BlendStyle {
    fn default() -> Self {
        Self { blend: BlendId::Sigmoid, algorithm: AlphaAlgorithm::Add, alpha_target: 1.0, has_gate: false }
    }
}

/// BLENDING ramp length in controller ticks, fixed at germination (3 / 5 / 8).
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tempo {
    pub epochs: u32,
}

/// Ramp length used when no tempo was stored (`DEFAULT_BLENDING_TOTAL_STEPS`).
pub const DEFAULT_BLENDING_TOTAL_STEPS: u32 = 5;

impl Default for Tempo {
    fn default() -> Self {
        Self { epochs: DEFAULT_BLENDING_TOTAL_STEPS }
    }
}

/// The seed's blueprint (NOOP for an empty slot).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blueprint(pub BlueprintAction);

/// Reason and initiator carried until a scheduled (ramped) prune completes.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPrune {
    pub reason: Option<PruneReason>,
    pub initiator: Option<PruneInitiator>,
}

/// Gradient routing flags. `isolate_gradients`: the seed (and gate) see a detached host activation.
/// `blend_out_frozen`: seed and gate parameters take no optimizer step while the controller ramps DOWN.
///
/// The reference's env factory sets `isolate_gradients` on every slot at creation and prune clears it;
/// its value only matters in active stages, which always set it on entry (TRAINING: true; BLENDING: CNN
/// true, transformer false). Here it is false for an empty slot so that "empty" is exactly the default.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotFlags {
    pub isolate_gradients: bool,
    pub blend_out_frozen: bool,
}

/// Everything one slot's lifecycle reads and writes, owned. Used by tests and slow references; the ECS
/// holds the same fields as separate components and borrows them as a [`SlotMut`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotState {
    pub stage: Stage,
    pub counters: StageCounters,
    pub metrics: SeedMetrics,
    pub telemetry: GradientTelemetry,
    pub alpha: SeedAlpha,
    pub controller: AlphaController,
    pub blend: BlendStyle,
    pub tempo: Tempo,
    pub blueprint: Blueprint,
    pub pending_prune: PendingPrune,
    pub flags: SlotFlags,
}

impl SlotState {
    pub fn view(&mut self) -> SlotMut<'_> {
        SlotMut {
            stage: &mut self.stage,
            counters: &mut self.counters,
            metrics: &mut self.metrics,
            telemetry: &mut self.telemetry,
            alpha: &mut self.alpha,
            controller: &mut self.controller,
            blend: &mut self.blend,
            tempo: &mut self.tempo,
            blueprint: &mut self.blueprint,
            pending_prune: &mut self.pending_prune,
            flags: &mut self.flags,
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.stage.current.has_state()
    }
}

/// Mutable borrows of one slot's components: what the lifecycle's pure functions operate on.
pub struct SlotMut<'a> {
    pub stage: &'a mut Stage,
    pub counters: &'a mut StageCounters,
    pub metrics: &'a mut SeedMetrics,
    pub telemetry: &'a mut GradientTelemetry,
    pub alpha: &'a mut SeedAlpha,
    pub controller: &'a mut AlphaController,
    pub blend: &'a mut BlendStyle,
    pub tempo: &'a mut Tempo,
    pub blueprint: &'a mut Blueprint,
    pub pending_prune: &'a mut PendingPrune,
    pub flags: &'a mut SlotFlags,
}

impl SlotMut<'_> {
    /// A copy of the slot's current values.
    pub fn snapshot(&self) -> SlotState {
        SlotState {
            stage: *self.stage,
            counters: *self.counters,
            metrics: *self.metrics,
            telemetry: *self.telemetry,
            alpha: *self.alpha,
            controller: *self.controller,
            blend: *self.blend,
            tempo: *self.tempo,
            blueprint: *self.blueprint,
            pending_prune: *self.pending_prune,
            flags: *self.flags,
        }
    }

    /// Overwrite every component with `state`.
    pub fn write(&mut self, state: &SlotState) {
        *self.stage = state.stage;
        *self.counters = state.counters;
        *self.metrics = state.metrics;
        *self.telemetry = state.telemetry;
        *self.alpha = state.alpha;
        *self.controller = state.controller;
        *self.blend = state.blend;
        *self.tempo = state.tempo;
        *self.blueprint = state.blueprint;
        *self.pending_prune = state.pending_prune;
        *self.flags = state.flags;
    }

    pub fn current_stage(&self) -> SeedStage {
        self.stage.current
    }
}

/// The loop's per-slot tracking (tamiyo §1.3, simic §1.3 D.6–7), kept beside the seed state because the
/// reference keeps it outside the seed (per-env dicts keyed by slot): an empty slot has none of it.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotTracking {
    /// The last measured gradient health of the seed, stored after each action (the observation's
    /// "previous gradient health").
    pub gradient_health_prev: Option<f64>,
    /// Epochs since the slot was last ablated: 0 after a counterfactual, +1 after each action; None
    /// until the first action after the slot's seed appeared.
    pub epochs_since_counterfactual: Option<u32>,
    /// Validation accuracy when the seed was germinated (the reward's `progress` base).
    pub acc_at_germination: Option<f64>,
}

/// What the reward carries per slot between steps (simic §2.0, §2.4, §2.5).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotRewardState {
    /// ESCROW: the attribution credit paid so far for the slot's seed. Zeroed at germination and once
    /// the slot holds no seed module.
    pub escrow_credit: f64,
    /// BASIC_PLUS: the drip per epoch of the slot's fossil, paid every later step of the episode.
    pub drip_scale: Option<f64>,
    /// BASIC_PLUS: the drip this step's FOSSILIZE reward earned; kept as `drip_scale` only if the
    /// fossilization succeeds.
    pub proposed_drip: Option<f64>,
    /// Alpha and parameter count (seed + gate) at the previous reward, 0 without a seed module: the
    /// alpha-shock inputs. Not reset when the slot empties (the reference charges the drop to 0).
    pub prev_alpha: f64,
    pub prev_params: f64,
}

/// The slot's state as the env's governor snapshot holds it: Some only for a seed that was FOSSILIZED
/// when the snapshot was taken (the reference's snapshot keeps a fossil's `_extra_state`, so a rollback
/// reverts the fossil's state — counters and metrics — to that moment along with its weights).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq)]
pub struct FossilSnapshot(pub Option<SlotState>);

/// What happened to a slot during this step, for the kernels that own its parameters and optimizer
/// state (re-initialise on germinate, zero momentum on fossilize, clear on prune). Cleared each step.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotEvents {
    pub germinated: bool,
    pub fossilized: bool,
    pub pruned: bool,
    pub emptied: bool,
    /// A GatedBlend gate module came into existence (gated BLENDING entry, or a switch to GATE).
    pub gate_created: bool,
}
