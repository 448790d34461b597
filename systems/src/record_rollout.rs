//! Record: the learner's step into the round's rollout buffer (simic §1.3 D.9, §4.5) — the observation
//! it read, the sampled action, V(s), the effective op, the normalised reward, the
//! masks, the forced flag and the contribution predictor's targets (simic §3.4: where every measured
//! slot's counterfactual is fresh this step, `target[slot] = val_acc − baseline_acc`, the slot's
//! contribution). An env that rolled back leaves no column: its episode ends at its last column with
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
use esper_kernels::policy::rollout::StepRow;

/// Per-step scratch: which envs rolled back, and one env's contribution targets.
#[derive(Default)]
pub struct RecordScratch {
    rolled_back: Vec<bool>,
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
    mut scratch: Local<RecordScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::record_rollout");
    // The learner decided this step unless a policy was installed over it (a test's script).
    let (Some(mut learner), None) = (learner, policy) else { return };
    let n = masks.0.len();
    let RecordScratch { rolled_back, targets } = &mut *scratch;
    rolled_back.clear();
    rolled_back.extend((0..n).map(|e| outcomes.rolled_back(e)));
    learner.zero_hidden_where(rolled_back);
    let Some(mut rollout) = rollout else { return };
    let inputs = &observations.inputs;
    let s = inputs.n_slots;
    let last_step = clock.is_last_epoch();
    for (e, &rolled) in rolled_back.iter().enumerate() {
        if rolled {
            rollout.0.end_with_rollback(e);
            continue;
        }
        let slots = e * s..(e + 1) * s;
        let fresh = slots
            .clone()
            .all(|i| inputs.contribution[i].is_none() || inputs.epochs_since_counterfactual[i] == Some(0));
        targets.clear();
        targets.extend(slots.map(|i| if fresh { inputs.contribution[i].map(|c| c as f32) } else { None }));
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
