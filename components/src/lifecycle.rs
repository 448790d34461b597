//! The seed lifecycle as pure functions over one slot (spec kasmina §1.5, §2.3, §3.3–3.8, §4.1).
//! Each function reads and writes only the slot it is given, so the ECS can run them over every slot
//! of every env in one query.

use crate::actions::{AlphaAlgorithm, BlendId, BlueprintAction, Topology};
use crate::alpha::{ALPHA_EPSILON, AlphaController, AlphaCurve, AlphaMode, DEFAULT_STEEPNESS};
use crate::config::LifecycleConfig;
use crate::gates::{MIN_DWELL_EPOCHS, gate_passes};
use crate::slot::{
    BlendStyle, Blueprint, PruneInitiator, PruneReason, SeedMetrics, SlotMut, SlotState, Stage,
    StageCounters, Tempo,
};
use crate::stage::{GateLevel, SeedStage};
use std::fmt;

/// PRUNE needs `epochs_total ≥ MIN_PRUNE_AGE` (mask and execution, BUG-020).
pub const MIN_PRUNE_AGE: u32 = 5;
/// EMBARGOED dwell after a prune (`DEFAULT_EMBARGO_EPOCHS_AFTER_PRUNE`).
pub const EMBARGO_EPOCHS: u32 = 5;
/// RESETTING dwell (hard-coded in the reference).
pub const RESETTING_EPOCHS: u32 = 1;

/// Why a lifecycle call was refused with an error (the reference raises).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LifecycleError {
    AlphaTargetOutOfRange(f64),
    /// "gated" blend id without GATE, or GATE without "gated".
    StyleMismatch(BlendId, AlphaAlgorithm),
    SlotOccupied(SeedStage),
    BlueprintNotInTopology(BlueprintAction, Topology),
    /// `advance_stage` to a failure stage (prunes go through `prune` / `schedule_prune`).
    AdvanceToFailureStage(SeedStage),
}

impl fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlphaTargetOutOfRange(t) => write!(f, "alpha target {t} is not in (0, 1]"),
            Self::StyleMismatch(b, a) => {
                write!(f, "blend id {b:?} and alpha algorithm {a:?} do not match (gated ⇔ GATE)")
            }
            Self::SlotOccupied(s) => write!(f, "slot is not empty (stage {s})"),
            Self::BlueprintNotInTopology(b, t) => {
                write!(f, "blueprint {} does not exist for topology {t:?}", b.id())
            }
            Self::AdvanceToFailureStage(s) => write!(f, "cannot advance to failure stage {s}"),
        }
    }
}

impl std::error::Error for LifecycleError {}

/// `SeedState.transition(new)`: false (no change) unless `new` is an allowed next stage. On success the
/// previous stage and its dwell are remembered, the stage-start accuracy is re-based and eics resets.
pub fn transition(slot: &mut SlotMut, new: SeedStage) -> bool {
    let stage = slot.stage.current;
    if !stage.can_transition_to(new) {
        return false;
    }
    slot.stage.previous = stage;
    slot.stage.previous_epochs_in_stage = slot.counters.epochs_in_stage;
    slot.stage.current = new;
    slot.metrics.accuracy_at_stage_start = slot.metrics.current_val_accuracy;
    slot.counters.epochs_in_stage = 0;
    true
}

/// `SeedMetrics.record_accuracy(acc)`: called by the loop once per epoch on every slot that has a
/// state, cooldown stages included. It advances `epochs_total` and eics — which is why cooldown
/// counters move twice per epoch in the RL loop (kasmina §8.2 a; see [`step_epoch`]).
pub fn record_accuracy(slot: &mut SlotMut, accuracy: f64) {
    record_accuracy_of(slot.stage, slot.counters, slot.metrics, accuracy);
}

/// [`record_accuracy`] on the three components it touches: it reads the stage and writes only the
/// counters and the accuracy metrics.
pub fn record_accuracy_of(stage: &Stage, counters: &mut StageCounters, m: &mut SeedMetrics, accuracy: f64) {
    if !stage.current.has_state() {
        return;
    }
    if counters.epochs_total == 0 {
        m.initial_val_accuracy = accuracy;
        m.accuracy_at_stage_start = accuracy;
    }
    m.current_val_accuracy = accuracy;
    m.best_val_accuracy = m.best_val_accuracy.max(accuracy);
    counters.epochs_total += 1;
    counters.epochs_in_stage += 1;
}

/// `set_alpha(v)`: the canonical amplitude, the controller's copy and `current_alpha` all become
/// `clamp01(v)`.
pub fn set_alpha(slot: &mut SlotMut, value: f64) {
    let v = value.clamp(0.0, 1.0);
    slot.alpha.0 = v;
    slot.controller.alpha = v;
}

/// Blend-out freeze: seed and gate parameters are frozen exactly while the controller ramps DOWN.
pub fn update_blend_out_freeze(slot: &mut SlotMut) {
    slot.flags.blend_out_frozen = slot.controller.mode == AlphaMode::Down;
}

/// A germination request, already decoded from the action heads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Germination {
    pub blueprint: BlueprintAction,
    pub blend: BlendId,
    pub algorithm: AlphaAlgorithm,
    pub tempo_epochs: u32,
    /// None = 1.0.
    pub alpha_target: Option<f64>,
}

/// `germinate` (kasmina §3.4): checks in the reference's order, then a fresh state in GERMINATED with
/// alpha 0 and the controller holding at 0. Module construction and the MULTIPLY zero-init belong to
/// the kernels, which see the slot's `germinated` event. The reference's shape probe (a forward on a
/// dummy input that refuses a blueprint changing the shape, kasmina §3.4 step 7) has no twin: every
/// blueprint keeps its input's shape by construction, so it could never fail.
pub fn germinate(slot: &mut SlotMut, g: Germination, topology: Topology) -> Result<(), LifecycleError> {
    let target = g.alpha_target.unwrap_or(1.0);
    if !(target > 0.0 && target <= 1.0) {
        return Err(LifecycleError::AlphaTargetOutOfRange(target));
    }
    if (g.blend == BlendId::Gated) != (g.algorithm == AlphaAlgorithm::Gate) {
        return Err(LifecycleError::StyleMismatch(g.blend, g.algorithm));
    }
    if slot.stage.current.has_state() {
        return Err(LifecycleError::SlotOccupied(slot.stage.current));
    }
    if !g.blueprint.in_topology(topology) {
        return Err(LifecycleError::BlueprintNotInTopology(g.blueprint, topology));
    }
    // A brand-new SeedState, created DORMANT and immediately moved to GERMINATED through G0.
    slot.write(&SlotState::default());
    *slot.blueprint = Blueprint(g.blueprint);
    *slot.blend =
        BlendStyle { blend: g.blend, algorithm: g.algorithm, alpha_target: target, has_gate: false };
    *slot.tempo = Tempo { epochs: g.tempo_epochs };
    let passed = gate_passes(GateLevel::G0, slot, true) && transition(slot, SeedStage::Germinated);
    debug_assert!(passed, "G0 and DORMANT→GERMINATED cannot fail for a typed blueprint");
    Ok(())
}

/// Stage-entry side effects (kasmina §3.3), shared by ADVANCE and auto-forward.
fn on_enter_stage(slot: &mut SlotMut, from: SeedStage, to: SeedStage, topology: Topology) {
    match (from, to) {
        (SeedStage::Germinated, SeedStage::Training) => slot.flags.isolate_gradients = true,
        (SeedStage::Training, SeedStage::Blending) => {
            slot.flags.isolate_gradients = topology == Topology::Cnn;
            slot.metrics.accuracy_at_blending_start = slot.metrics.current_val_accuracy;
            slot.metrics.blending_started = true;
            start_blending(slot);
        }
        (_, SeedStage::Holding) => {
            if slot.blend.algorithm != AlphaAlgorithm::Gate {
                slot.blend.has_gate = false;
            }
            set_alpha(slot, 1.0);
            let steps = slot.controller.steps_total;
            *slot.controller = AlphaController {
                alpha: 1.0,
                start: 1.0,
                target: 1.0,
                mode: AlphaMode::Hold,
                steps_total: steps,
                steps_done: steps,
                ..*slot.controller
            };
        }
        _ => {}
    }
}

/// The germination ramp: a fresh controller at the current alpha, retargeted to the stored blend target
/// over the stored tempo, LINEAR for "linear"/"gated" and SIGMOID(12) for "sigmoid". Only "gated" builds
/// a gate module.
fn start_blending(slot: &mut SlotMut) {
    let steps = slot.tempo.epochs;
    let mut controller = AlphaController::holding_at(slot.alpha.0);
    controller
        .retarget(
            slot.blend.alpha_target,
            steps,
            Some(slot.blend.blend.ramp_curve()),
            Some(DEFAULT_STEEPNESS),
        )
        .expect("a fresh controller holds");
    *slot.controller = controller;
    let gated = slot.blend.blend == BlendId::Gated;
    if gated {
        slot.blend.algorithm = AlphaAlgorithm::Gate;
    }
    slot.blend.has_gate = gated;
}

/// `advance_stage(target)`: `None` picks the first non-failure next stage. Succeeds iff the target's
/// gate passes and the transition is allowed; a failure-stage target is an error.
pub fn advance_stage(
    slot: &mut SlotMut,
    target: Option<SeedStage>,
    config: &LifecycleConfig,
) -> Result<bool, LifecycleError> {
    let from = slot.stage.current;
    if !from.has_state() {
        return Ok(false);
    }
    let target = match target {
        Some(t) if t.is_failure() => return Err(LifecycleError::AdvanceToFailureStage(t)),
        Some(t) => t,
        None => match from.next_success_stage() {
            Some(t) => t,
            None => return Ok(false),
        },
    };
    let Some(gate) = GateLevel::for_target(target) else {
        return Ok(false);
    };
    if !gate_passes(gate, slot, config.permissive_gates) || !transition(slot, target) {
        return Ok(false);
    }
    on_enter_stage(slot, from, target, config.topology);
    Ok(true)
}

/// `set_alpha_target` (kasmina §3.7): retarget a BLENDING/HOLDING seed at rest. A partial target from
/// HOLDING drops back to BLENDING; the style head's algorithm may switch the blend operator mid-life
/// (no zero-init on such a switch).
pub fn set_alpha_target(
    slot: &mut SlotMut,
    target: f64,
    steps: u32,
    curve: AlphaCurve,
    steepness: f64,
    algorithm: Option<AlphaAlgorithm>,
) -> bool {
    let stage = slot.stage.current;
    if !stage.has_state()
        || stage == SeedStage::Fossilized
        || target <= 0.0
        || slot.controller.mode != AlphaMode::Hold
        || !matches!(stage, SeedStage::Blending | SeedStage::Holding)
    {
        return false;
    }
    if stage == SeedStage::Holding && target < 1.0 - ALPHA_EPSILON {
        transition(slot, SeedStage::Blending);
    }
    if let Some(algorithm) = algorithm
        && algorithm != slot.blend.algorithm
    {
        slot.blend.has_gate = algorithm == AlphaAlgorithm::Gate;
        slot.blend.algorithm = algorithm;
    }
    slot.controller.retarget(target, steps, Some(curve), Some(steepness)).expect("mode checked to be HOLD");
    update_blend_out_freeze(slot);
    true
}

/// `schedule_prune` (kasmina §3.8): an instant prune when `steps == 0` or alpha is already 0, otherwise a
/// DOWN ramp to 0 that the tick completes. HOLDING drops to BLENDING first.
pub fn schedule_prune(
    slot: &mut SlotMut,
    steps: u32,
    curve: AlphaCurve,
    steepness: f64,
    reason: PruneReason,
    initiator: PruneInitiator,
) -> bool {
    let stage = slot.stage.current;
    if !stage.has_state() || stage == SeedStage::Fossilized {
        return false;
    }
    if steps == 0 || slot.alpha.0 <= 0.0 {
        return prune(slot, reason, initiator);
    }
    if slot.controller.mode != AlphaMode::Hold {
        return false;
    }
    match stage {
        SeedStage::Holding => {
            transition(slot, SeedStage::Blending);
        }
        SeedStage::Blending => {}
        _ => return prune(slot, reason, initiator),
    }
    slot.pending_prune.reason = Some(reason);
    slot.pending_prune.initiator = Some(initiator);
    slot.controller.retarget(0.0, steps, Some(curve), Some(steepness)).expect("mode checked to be HOLD");
    update_blend_out_freeze(slot);
    true
}

/// `prune` (immediate): the seed module is freed (stage PRUNED has no seed), the state stays for the
/// cooldown. FOSSILIZED and cooldown stages refuse.
///
/// Reference behaviour kept: `auto_pruned` is written (governor reason → set, any other → cleared)
/// *before* the PRUNED transition is tried, so a governor rollback also flags slots already in PRUNED
/// or EMBARGOED (their prune fails) and their env pays the auto-prune penalty for them too.
pub fn prune(slot: &mut SlotMut, reason: PruneReason, _initiator: PruneInitiator) -> bool {
    let stage = slot.stage.current;
    if !stage.has_state() || stage == SeedStage::Fossilized {
        return false;
    }
    slot.metrics.auto_pruned = reason.is_governor().then_some(reason);
    if !transition(slot, SeedStage::Pruned) {
        return false;
    }
    set_alpha(slot, 0.0);
    let c = &mut *slot.controller;
    c.start = 0.0;
    c.target = 0.0;
    c.mode = AlphaMode::Hold;
    c.steps_total = 0;
    c.steps_done = 0;
    slot.blend.has_gate = false;
    slot.flags.isolate_gradients = false;
    slot.flags.blend_out_frozen = false;
    *slot.pending_prune = Default::default();
    true
}

/// What one tick did to a slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickOutcome {
    /// A stage the tick advanced into through an auto-forward gate.
    pub advanced_to: Option<SeedStage>,
    /// A scheduled prune completed.
    pub pruned: bool,
    /// RESETTING completed: the slot is empty again.
    pub emptied: bool,
}

/// `step_epoch()` (kasmina §3.5): the per-epoch mechanical tick. Never advances a stage unless the
/// matching auto-forward gate is enabled; HOLDING never auto-fossilizes or auto-prunes.
///
/// Driven alone, the cooldown is 7 ticks: prune → 1 tick to EMBARGOED → 5 ticks to RESETTING → 1 tick to
/// empty. The RL loop also calls [`record_accuracy`] on cooldown slots, so the counters move twice per
/// epoch there and the slot is free 5 epochs after an instant prune (kasmina §8.2 a, kept on purpose).
pub fn step_epoch(slot: &mut SlotMut, config: &LifecycleConfig) -> TickOutcome {
    let mut out = TickOutcome::default();
    let stage = slot.stage.current;
    if !stage.has_state() {
        return out;
    }
    update_blend_out_freeze(slot);
    let auto_advance = |slot: &mut SlotMut, target: SeedStage, out: &mut TickOutcome| {
        if advance_stage(slot, Some(target), config) == Ok(true) {
            out.advanced_to = Some(target);
        }
    };
    match stage {
        SeedStage::Germinated => {
            if config.auto_forward_g1 {
                auto_advance(slot, SeedStage::Training, &mut out);
            }
        }
        SeedStage::Training => {
            if config.auto_forward_g2 && slot.counters.epochs_in_stage >= MIN_DWELL_EPOCHS {
                auto_advance(slot, SeedStage::Blending, &mut out);
            }
        }
        SeedStage::Blending => {
            let stepped_to_target = slot.controller.step();
            let alpha = slot.controller.alpha;
            set_alpha(slot, alpha);
            slot.metrics.alpha_ramp_step = slot.controller.steps_done;
            let c = *slot.controller;
            let reached = stepped_to_target
                || (c.mode == AlphaMode::Hold && (slot.alpha.0 - c.target).abs() <= ALPHA_EPSILON);
            if reached {
                if c.target <= ALPHA_EPSILON {
                    let reason = slot.pending_prune.reason.unwrap_or(PruneReason::ScheduledPrune);
                    let initiator = slot.pending_prune.initiator.unwrap_or(PruneInitiator::Policy);
                    out.pruned = prune(slot, reason, initiator);
                } else if config.auto_forward_g3
                    && (config.permissive_gates || slot.counters.epochs_in_stage >= MIN_DWELL_EPOCHS)
                {
                    auto_advance(slot, SeedStage::Holding, &mut out);
                }
            }
        }
        SeedStage::Pruned => {
            transition(slot, SeedStage::Embargoed);
        }
        SeedStage::Embargoed => {
            slot.counters.epochs_total += 1;
            slot.counters.epochs_in_stage += 1;
            if slot.counters.epochs_in_stage >= EMBARGO_EPOCHS {
                transition(slot, SeedStage::Resetting);
            }
        }
        SeedStage::Resetting => {
            slot.counters.epochs_total += 1;
            slot.counters.epochs_in_stage += 1;
            if slot.counters.epochs_in_stage >= RESETTING_EPOCHS {
                // BUG-ROLLBACK-ORPHAN: completion drops everything, any leftover module included.
                slot.write(&SlotState::default());
                out.emptied = true;
            }
        }
        SeedStage::Holding | SeedStage::Fossilized | SeedStage::Dormant | SeedStage::Unknown => {}
    }
    out
}
