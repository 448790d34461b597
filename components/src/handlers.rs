//! Applying one env's factored action to its target slot (spec kasmina §3.6, tamiyo §3 "execution-time
//! validity"): the mask first, then the handler's own precondition, then Kasmina's checks. Anything that
//! fails is a no-op reported as failed, never a panic.

use crate::actions::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, FactoredAction, GerminationStyle,
    LifecycleOp, TempoAction,
};
use crate::alpha::AlphaMode;
use crate::config::LifecycleConfig;
use crate::lifecycle::{
    Germination, MIN_PRUNE_AGE, advance_stage, germinate, schedule_prune, set_alpha, set_alpha_target,
};
use crate::masks::ActionMasks;
use crate::slot::{PruneInitiator, PruneReason, SlotMut};
use crate::stage::SeedStage;
use serde::{Deserialize, Serialize};

/// What became of one env's op this step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpOutcome {
    /// The op ran and did what it asked (WAIT always succeeds).
    #[default]
    Succeeded,
    /// A masked sampler could not have produced this action.
    FailedMask,
    /// The target slot fails the handler's precondition.
    FailedPrecondition,
    /// Kasmina refused it (a gate did not pass, or germinate/retarget/prune returned false).
    FailedLifecycle,
}

impl OpOutcome {
    pub fn failed(self) -> bool {
        self != Self::Succeeded
    }
}

/// The handler's precondition on the target slot (also decides `action_valid_for_reward`).
pub fn handler_precondition(op: LifecycleOp, slot: &SlotMut) -> bool {
    let stage = slot.stage.current;
    let live = stage.has_seed();
    let at_rest = slot.controller.mode == AlphaMode::Hold;
    match op {
        LifecycleOp::Wait => true,
        LifecycleOp::Germinate => !stage.has_state(),
        LifecycleOp::Fossilize => live && stage == SeedStage::Holding,
        LifecycleOp::Prune => {
            live && stage.is_prunable()
                && at_rest
                && stage.can_transition_to(SeedStage::Pruned)
                && slot.counters.epochs_total >= MIN_PRUNE_AGE
        }
        LifecycleOp::SetAlphaTarget => {
            live && at_rest && matches!(stage, SeedStage::Blending | SeedStage::Holding)
        }
        LifecycleOp::Advance => {
            live && matches!(stage, SeedStage::Germinated | SeedStage::Training | SeedStage::Blending)
        }
    }
}

/// Execute a decoded op on its target slot, assuming mask and precondition already passed. Head values
/// out of range make the op fail rather than panic.
fn execute(op: LifecycleOp, action: &FactoredAction, slot: &mut SlotMut, config: &LifecycleConfig) -> bool {
    match op {
        LifecycleOp::Wait => true,
        LifecycleOp::Germinate => {
            let (Some(blueprint), Some(style), Some(tempo), Some(target)) = (
                BlueprintAction::from_index(action.blueprint),
                GerminationStyle::from_index(action.style),
                TempoAction::from_index(action.tempo),
                AlphaTargetAction::from_index(action.alpha_target),
            ) else {
                return false;
            };
            let (blend, algorithm) = style.blend_and_algorithm();
            let g = Germination {
                blueprint,
                blend,
                algorithm,
                tempo_epochs: tempo.epochs(),
                alpha_target: Some(target.value()),
            };
            germinate(slot, g, config.topology).is_ok()
        }
        LifecycleOp::SetAlphaTarget => {
            let (Some(style), Some(target), Some(speed), Some(curve)) = (
                GerminationStyle::from_index(action.style),
                AlphaTargetAction::from_index(action.alpha_target),
                AlphaSpeedAction::from_index(action.alpha_speed),
                AlphaCurveAction::from_index(action.alpha_curve),
            ) else {
                return false;
            };
            let (curve, steepness) = curve.curve_and_steepness();
            let algorithm = style.blend_and_algorithm().1;
            set_alpha_target(slot, target.value(), speed.steps(), curve, steepness, Some(algorithm))
        }
        LifecycleOp::Prune => {
            let (Some(speed), Some(curve)) = (
                AlphaSpeedAction::from_index(action.alpha_speed),
                AlphaCurveAction::from_index(action.alpha_curve),
            ) else {
                return false;
            };
            let (curve, steepness) = curve.curve_and_steepness();
            schedule_prune(slot, speed.steps(), curve, steepness, PruneReason::Policy, PruneInitiator::Policy)
        }
        LifecycleOp::Fossilize => {
            let passed = advance_stage(slot, Some(SeedStage::Fossilized), config) == Ok(true);
            if passed {
                set_alpha(slot, 1.0);
            }
            passed
        }
        LifecycleOp::Advance => advance_stage(slot, None, config) == Ok(true),
    }
}

/// The outcome that needs no slot: a masked action fails, and WAIT succeeds (its slot head is irrelevant
/// and may name no slot at all). `None` = the op must run on its target slot through [`apply_action`].
pub fn outcome_without_slot(action: &FactoredAction, masks: &ActionMasks) -> Option<OpOutcome> {
    if !masks.allows(action) {
        Some(OpOutcome::FailedMask)
    } else if action.op == LifecycleOp::Wait as u8 {
        Some(OpOutcome::Succeeded)
    } else {
        None
    }
}

/// Apply `action` to its target slot (the slot with index `action.slot`), checking the env's `masks`
/// first and the handler precondition second.
pub fn apply_action(
    action: &FactoredAction,
    masks: &ActionMasks,
    slot: &mut SlotMut,
    config: &LifecycleConfig,
) -> OpOutcome {
    if !masks.allows(action) {
        return OpOutcome::FailedMask;
    }
    let op = LifecycleOp::from_index(action.op).expect("mask allowed a valid op");
    if !handler_precondition(op, slot) {
        return OpOutcome::FailedPrecondition;
    }
    if execute(op, action, slot, config) { OpOutcome::Succeeded } else { OpOutcome::FailedLifecycle }
}
