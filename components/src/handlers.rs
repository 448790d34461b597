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

/// What became of one env's sampled op this step (simic §1.3 D). The resolve stage (before Reward)
/// settles rollbacks, mask refusals and vetoes; the survivors stay [`Pending`](Self::Pending) until Act
/// runs their handler, so after Act no env is pending.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpOutcome {
    /// The handler ran and did what it asked (WAIT always executes).
    #[default]
    Executed,
    /// Survived the resolve stage; Act runs its handler this step.
    Pending,
    /// A masked sampler could not have produced this action: nothing ran.
    RefusedByMask,
    /// The governor's preflight refused the mutation (tamiyo §6.6): nothing ran.
    Vetoed,
    /// The env's governor panicked: the env rolled back and the sampled op was dropped (tamiyo §6.7).
    RolledBack,
    /// The target slot fails the handler's precondition (the op is invalid for the slot's state).
    FailedPrecondition,
    /// The handler ran and Kasmina refused (a gate did not pass, or germinate/retarget/prune failed).
    FailedInHandler,
}

impl OpOutcome {
    /// The op was tried and failed: refused by the mask, or its handler failed. A veto and a rollback
    /// are counted apart, and only an executed op is a `last_action_success` (tamiyo §1.3).
    pub fn failed(self) -> bool {
        matches!(self, Self::RefusedByMask | Self::FailedPrecondition | Self::FailedInHandler)
    }

    /// The name `metrics.jsonl` writes (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Pending => "pending",
            Self::RefusedByMask => "refused_by_mask",
            Self::Vetoed => "vetoed",
            Self::RolledBack => "rolled_back",
            Self::FailedPrecondition => "failed_precondition",
            Self::FailedInHandler => "failed_in_handler",
        }
    }
}

/// The facts of a target slot that decide whether an op is valid for it (simic §1.3 D.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotFacts {
    pub stage: SeedStage,
    pub alpha_mode: AlphaMode,
    /// Seed age (`epochs_total`).
    pub seed_age: u32,
}

/// Whether `op` is valid for a slot in `facts` (simic §1.3 D.1; also the handlers' precondition):
/// GERMINATE needs an empty slot (no state: cooldown stages block); FOSSILIZE needs HOLDING; PRUNE
/// needs a live seed in GERMINATED/TRAINING/BLENDING/HOLDING, the controller in HOLD, an allowed
/// PRUNED transition and age ≥ 5; SET_ALPHA_TARGET needs HOLD and BLENDING/HOLDING; ADVANCE needs
/// GERMINATED/TRAINING/BLENDING; WAIT is always valid.
pub fn op_valid_for_slot(op: LifecycleOp, facts: SlotFacts) -> bool {
    let stage = facts.stage;
    let live = stage.has_seed();
    let at_rest = facts.alpha_mode == AlphaMode::Hold;
    match op {
        LifecycleOp::Wait => true,
        LifecycleOp::Germinate => !stage.has_state(),
        LifecycleOp::Fossilize => live && stage == SeedStage::Holding,
        LifecycleOp::Prune => {
            live && stage.is_prunable()
                && at_rest
                && stage.can_transition_to(SeedStage::Pruned)
                && facts.seed_age >= MIN_PRUNE_AGE
        }
        LifecycleOp::SetAlphaTarget => {
            live && at_rest && matches!(stage, SeedStage::Blending | SeedStage::Holding)
        }
        LifecycleOp::Advance => {
            live && matches!(stage, SeedStage::Germinated | SeedStage::Training | SeedStage::Blending)
        }
    }
}

/// `action_for_reward` (simic §1.3 D.1): the sampled op if it is valid for the target slot's state,
/// else WAIT. `target` is None when the slot head names no enabled slot (always invalid, except WAIT).
pub fn action_for_reward(op: LifecycleOp, target: Option<SlotFacts>) -> LifecycleOp {
    let valid = match target {
        Some(facts) => op_valid_for_slot(op, facts),
        None => op == LifecycleOp::Wait,
    };
    if valid { op } else { LifecycleOp::Wait }
}

/// The handler's precondition on the target slot: [`op_valid_for_slot`] of its current facts.
pub fn handler_precondition(op: LifecycleOp, slot: &SlotMut) -> bool {
    op_valid_for_slot(op, slot_facts(slot))
}

/// The validity facts of a slot.
pub fn slot_facts(slot: &SlotMut) -> SlotFacts {
    SlotFacts {
        stage: slot.stage.current,
        alpha_mode: slot.controller.mode,
        seed_age: slot.counters.epochs_total,
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
        Some(OpOutcome::RefusedByMask)
    } else if action.op == LifecycleOp::Wait as u8 {
        Some(OpOutcome::Executed)
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
        return OpOutcome::RefusedByMask;
    }
    let op = LifecycleOp::from_index(action.op).expect("mask allowed a valid op");
    if !handler_precondition(op, slot) {
        return OpOutcome::FailedPrecondition;
    }
    if execute(op, action, slot, config) { OpOutcome::Executed } else { OpOutcome::FailedInHandler }
}
