//! Decide (after the policy): settle what each env's sampled action becomes before the Reward set sees
//! it, in the reference's order (simic §1.3 D.1–D.4):
//! 1. an env whose governor panicked rolls back: its sampled op is dropped (Act restores it);
//! 2. an action the env's masks forbid is refused (a masked sampler never produces one; the heuristic
//!    and hand-written actions can), and a WAIT is executed (it needs no handler);
//! 3. a non-WAIT op goes through the governor's preflight (tamiyo §6.6); a veto refuses it;
//! 4. the survivors are pending for Act, and `action_for_reward` is the sampled op if it is valid for the
//!    target slot's state, else WAIT. A pending op always names an enabled slot: the mask checked it.
//!
//! The sampled action stays untouched in [`ActionBatch`]; the effective op and the outcome go to their
//! own `[E]` columns.

use crate::governor_check::GovernorVerdict;
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, MaskBatch, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::{PreflightRequest, preflight_lifecycle_mutation};
use esper_components::{
    AlphaController, EnvIndex, HostMetrics, LifecycleConfig, LifecycleOp, OpOutcome, SlotFacts, SlotIndex,
    Stage, StageCounters, action_for_reward, outcome_without_slot,
};

/// One env's target slot as the resolve stage needs it.
#[derive(Clone, Copy, Debug, Default)]
pub struct TargetSlot {
    /// The facts of the slot the slot head names (None: no such slot).
    facts: Option<SlotFacts>,
    /// Live seeds in the env (the preflight's capacity check).
    live_seeds: u32,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn resolve_actions(
    envs: Query<(&EnvIndex, &HostMetrics, &GovernorVerdict)>,
    slots: Query<(&EnvIndex, &SlotIndex, &Stage, &StageCounters, &AlphaController)>,
    actions: Res<ActionBatch>,
    masks: Res<MaskBatch>,
    config: Res<LifecycleConfig>,
    n_envs: Res<EnvCount>,
    mut effective: ResMut<EffectiveOps>,
    mut outcomes: ResMut<OpOutcomes>,
    mut targets: Local<Vec<TargetSlot>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Decide::resolve_actions");
    targets.clear();
    targets.resize(n_envs.0, TargetSlot::default());
    let slot_head = actions.head(esper_components::Head::Slot);
    for (env, index, stage, counters, controller) in &slots {
        let e = env.0 as usize;
        targets[e].live_seeds += u32::from(stage.current.has_seed());
        if slot_head[e] == index.0 {
            targets[e].facts = Some(SlotFacts {
                stage: stage.current,
                alpha_mode: controller.mode,
                seed_age: counters.epochs_total,
            });
        }
    }
    for (env, metrics, verdict) in &envs {
        let e = env.0 as usize;
        let action = actions.get(e);
        let target = targets[e];
        let outcome = if verdict.panic.is_some() {
            OpOutcome::RolledBack
        } else if let Some(settled) = outcome_without_slot(&action, &masks.0[e]) {
            settled // refused by the mask, or a WAIT (executes; the preflight never sees WAIT)
        } else {
            let stage = target.facts.map_or(esper_components::SeedStage::Dormant, |f| f.stage);
            let request = PreflightRequest::from_action(
                &action,
                stage,
                metrics.val_loss,
                metrics.val_accuracy,
                config.max_seeds,
                target.live_seeds,
            );
            if request.is_some_and(|r| preflight_lifecycle_mutation(&r).is_err()) {
                OpOutcome::Vetoed
            } else {
                OpOutcome::Pending
            }
        };
        outcomes.0[e] = outcome;
        let sampled = LifecycleOp::from_index(action.op).unwrap_or(LifecycleOp::Wait);
        effective.0[e] = match outcome {
            OpOutcome::Pending => action_for_reward(sampled, target.facts),
            _ => LifecycleOp::Wait,
        };
    }
}
