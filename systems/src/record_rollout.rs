//! Record: the learner's step into the round's rollout buffer (simic §1.3 D.9, §4.5) — the observation
//! it read, the sampled action, V(s), the effective op, the normalised reward, the
//! masks, the forced flag and the contribution predictor's targets (simic §3.4: a row is fresh only if
//! some slot was ablated this step and every ablated slot's "epochs since counterfactual" is 0; then
//! `target[slot] = val_acc − baseline_acc`, the slot's contribution, for the ablated slots).
//!
//! Reference behaviour kept: the reference tests freshness at `buffer.add` (D.9), after D.7 has added 1
//! to every present slot's counter (action_execution.py: the increment at :1275 runs before
//! `build_fresh_contribution_targets` at :1389, in the same per-env loop). Validation had set an
//! ablated slot's counter to 0 and an ablated slot is always present, so it reads 1 here: no row is
//! ever fresh and the contribution head never gets a target (its loss is 0, as in the reference). The
//! counters are read as D.7 left them (Record runs after the tick, which only clears the tracking of a
//! slot it empties: no counter, not fresh, as the 1 would be), so the rule stays the reference's.
//! An env that rolled back leaves no column: its episode ends at its last column with
//! the death penalty (see `RolloutBuffer::end_with_rollback`) and its LSTM state is zeroed, also when
//! the policy only evaluates.

use crate::build_observations::ObsBatch;
use crate::compute_rewards::RewardBatch;
use crate::host_resources::StepClock;
use crate::learner::{Learner, Rollout};
use crate::policy::ActivePolicy;
use crate::resources::{ActionBatch, EffectiveOps, MaskBatch, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, SlotIndex, SlotTracking};
use esper_kernels::policy::rollout::StepRow;

/// Per-step scratch: which envs rolled back, every slot's "epochs since counterfactual" after D.7, and
/// one env's contribution targets.
#[derive(Default)]
pub struct RecordScratch {
    rolled_back: Vec<bool>,
    counters: Vec<Option<u32>>,
    targets: Vec<Option<f32>>,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource it touches
pub fn record_rollout(
    observations: Res<ObsBatch>,
    actions: Res<ActionBatch>,
    effective: Res<EffectiveOps>,
    outcomes: Res<OpOutcomes>,
    masks: Res<MaskBatch>,
    rewards: Res<RewardBatch>,
    clock: Res<StepClock>,
    learner: Option<ResMut<Learner>>,
    rollout: Option<ResMut<Rollout>>,
    policy: Option<Res<ActivePolicy>>,
    tracking: Query<(&EnvIndex, &SlotIndex, &SlotTracking)>,
    mut scratch: Local<RecordScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::record_rollout");
    // The learner decided this step unless a policy was installed over it (a test's script).
    let (Some(mut learner), None) = (learner, policy) else { return };
    let n = masks.0.len();
    let RecordScratch { rolled_back, counters, targets } = &mut *scratch;
    rolled_back.clear();
    rolled_back.extend((0..n).map(|e| outcomes.rolled_back(e)));
    learner.zero_hidden_where(rolled_back);
    let Some(mut rollout) = rollout else { return };
    let inputs = &observations.inputs;
    let s = inputs.n_slots;
    counters.clear();
    counters.resize(n * s, None);
    for (env, index, slot) in &tracking {
        counters[env.0 as usize * s + index.0 as usize] = slot.epochs_since_counterfactual;
    }
    let last_step = clock.is_last_epoch();
    for (e, &rolled) in rolled_back.iter().enumerate() {
        if rolled {
            rollout.0.end_with_rollback(e);
            continue;
        }
        let slots = e * s..(e + 1) * s;
        // Ablated this step: validation measured the slot and restarted its counter (at Observe, before
        // D.7), as the reward reads it.
        let ablated =
            |i: usize| inputs.contribution[i].is_some() && inputs.epochs_since_counterfactual[i] == Some(0);
        let fresh = slots.clone().any(ablated)
            && slots.clone().filter(|&i| ablated(i)).all(|i| counters[i] == Some(0));
        targets.clear();
        targets.extend(
            slots.map(|i| if fresh && ablated(i) { inputs.contribution[i].map(|c| c as f32) } else { None }),
        );
        rollout.0.push(
            e,
            StepRow {
                state: observations.normalized_row(e),
                blueprints: observations.blueprint_row(e),
                action: actions.get(e),
                effective_op: effective.0[e],
                value: learner.values[e],
                reward: rewards.normalized[e] as f32,
                truncated: last_step,
                masks: &masks.0[e],
                contribution_targets: targets,
            },
        );
    }
}
