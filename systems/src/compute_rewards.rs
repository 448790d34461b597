//! Reward: every env's reward for this step in one kernel call (simic §1.3 D.3–D.5, §2). The system
//! gathers the components into the kernel's `[E]` / `[E, S]` columns, calls
//! [`esper_kernels::reward::compute_rewards`], normalises the raw rewards with the run's one shared
//! normaliser in env order, and writes back what the modes carry: the escrow credit, the drip a
//! FOSSILIZE earned, the previous alpha and parameter count of every slot, and the pending terms it
//! paid (reset). An env that rolled back this step gets no reward and no normaliser update, and keeps
//! its pending terms for its next rewarded step (simic §1.3 D.2); its episode return takes the death
//! penalty as the rollout buffer does (simic §1.6, `EpisodeReturn::end_with_rollback`).
//!
//! The reward runs before the action is executed: it sees the seed state after this epoch's training
//! and record, and the action just sampled. The target slot is the sampled slot head, canonicalised to
//! the first enabled slot for WAIT (reference quirk kept: WAIT steps only ever attribute slot 0's seed).

use crate::host_resources::StepClock;
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, OpOutcomes, ParamCounts};
use crate::step_span::StepInfo;
use crate::update_signals::EnvSignals;
use bevy_ecs::prelude::*;
use esper_components::signals::SignalTracker;
use esper_components::{
    BlendStyle, EnvIndex, EpisodeReturn, FossilCounters, Head, HostMetrics, LifecycleOp, PendingRewardTerms,
    RewardConfig, SeedAlpha, SeedMetrics, SlotConfig, SlotFlags, SlotIndex, SlotRewardState, SlotTracking,
    Stage, StageCounters,
};
use esper_kernels::policy::rollout::DEATH_PENALTY;
use esper_kernels::reward::{
    RewardInputs, RewardNormalizer, RewardOutputs, compute_rewards as reward_kernel,
};

/// This step's reward batch: the kernel's inputs and outputs and the normalised rewards, for the
/// Record stage (`metrics.jsonl`) and the rollout buffer.
#[derive(Resource, Clone, Debug, Default)]
pub struct RewardBatch {
    pub inputs: RewardInputs,
    pub outputs: RewardOutputs,
    /// `[E]` the normalised reward (0 for a rolled-back env).
    pub normalized: Vec<f64>,
}

impl RewardBatch {
    /// Env `e` was rewarded this step (a reward was computed and the env did not roll back).
    pub fn rewarded(&self, env: usize) -> bool {
        self.inputs.skip.get(env).is_some_and(|&skip| !skip) && env < self.outputs.raw.len()
    }
}

/// The run's shared reward normaliser (simic §4.6): never reset between rounds.
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq)]
pub struct SharedRewardNormalizer(pub RewardNormalizer);

/// How many validation accuracies ESCROW's `stable_val_acc` takes the minimum over.
const ESCROW_STABLE_WINDOW: usize = 3;

type EnvView<'a> = (
    &'a EnvIndex,
    &'a HostMetrics,
    &'a EnvSignals,
    &'a SignalTracker,
    &'a FossilCounters,
    &'a mut PendingRewardTerms,
    &'a mut EpisodeReturn,
);

type SlotView<'a> = (
    &'a EnvIndex,
    &'a SlotIndex,
    &'a Stage,
    &'a StageCounters,
    &'a SeedMetrics,
    &'a SeedAlpha,
    &'a BlendStyle,
    &'a SlotTracking,
    &'a SlotFlags,
    &'a mut SlotRewardState,
);

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn compute_rewards(
    mut envs: Query<EnvView>,
    mut slots: Query<SlotView>,
    actions: Res<ActionBatch>,
    effective: Res<EffectiveOps>,
    outcomes: Res<OpOutcomes>,
    params: Res<ParamCounts>,
    config: Res<RewardConfig>,
    clock: Res<StepClock>,
    slot_config: Res<SlotConfig>,
    n_envs: Res<EnvCount>,
    mut batch: ResMut<RewardBatch>,
    mut normalizer: ResMut<SharedRewardNormalizer>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Reward::compute_rewards");
    let (n, s) = (n_envs.0, slot_config.len());
    let RewardBatch { inputs: x, outputs, normalized } = &mut *batch;
    x.resize(n, s);
    x.epoch = clock.epoch as u32;
    x.max_epochs = clock.episode_epochs as u32;
    x.host_params = params.host as f64;

    let sampled_ops = actions.head(Head::Op);
    let sampled_slots = actions.head(Head::Slot);
    for e in 0..n {
        x.skip[e] = outcomes.rolled_back(e);
        x.op[e] = effective.0[e];
        let wait = LifecycleOp::from_index(sampled_ops[e]).is_none_or(|op| op == LifecycleOp::Wait);
        x.target_slot[e] = if wait { 0 } else { sampled_slots[e].min(s.saturating_sub(1) as u8) };
    }
    for (env, host, signals, tracker, fossils, pending, _) in &envs {
        let e = env.0 as usize;
        x.val_acc[e] = host.val_accuracy;
        x.val_loss[e] = host.val_loss;
        let (acc_delta, loss_delta) =
            signals.0.map_or((0.0, f64::INFINITY), |s| (s.accuracy_delta, s.loss_delta));
        x.acc_delta[e] = acc_delta;
        x.loss_delta[e] = loss_delta;
        // The tracker's history already holds this epoch's accuracy.
        let (newest, k) = tracker.accuracy_history.last::<ESCROW_STABLE_WINDOW>();
        x.stable_val_acc[e] = if k == 0 {
            host.val_accuracy
        } else {
            newest[..k].iter().copied().fold(f64::INFINITY, f64::min)
        };
        x.cf_imp[e] = host.counterfactual_improvement;
        x.committed_val_acc[e] = host.committed_val_accuracy;
        x.n_fossil[e] = fossils.fossilized;
        x.n_contrib_fossil[e] = fossils.contributing;
        x.pending_auto_prune_penalty[e] = pending.auto_prune_penalty;
        x.pending_hindsight_credit[e] = pending.hindsight_credit;
    }
    for (env, index, stage, counters, metrics, alpha, blend, tracking, flags, state) in &slots {
        let i = env.0 as usize * s + index.0 as usize;
        let seed = stage.current.has_seed();
        x.stage[i] = stage.current;
        x.previous_stage[i] = stage.previous;
        x.epochs_in_stage[i] = counters.epochs_in_stage;
        x.previous_epochs_in_stage[i] = stage.previous_epochs_in_stage;
        x.seed_age[i] = counters.epochs_total;
        x.alpha[i] = if seed { alpha.0 } else { 0.0 };
        x.params[i] = if seed { metrics.params_with_gate(blend.has_gate) as f64 } else { 0.0 };
        x.prev_alpha[i] = state.prev_alpha;
        x.prev_params[i] = state.prev_params;
        x.trainable_params[i] = if flags.blend_out_frozen { 0.0 } else { x.params[i] };
        // Measured this step: validation restarted the slot's "epochs since counterfactual" at 0.
        let fresh = tracking.epochs_since_counterfactual == Some(0);
        x.contribution[i] = metrics.counterfactual_contribution.filter(|_| fresh && seed);
        x.improvement_since_stage_start[i] = metrics.improvement_since_stage_start();
        x.total_improvement[i] = metrics.total_improvement();
        x.interaction_sum[i] = metrics.interaction_sum;
        x.acc_at_germination[i] = tracking.acc_at_germination;
        x.escrow_credit[i] = state.escrow_credit;
        x.drip_scale[i] = state.drip_scale;
    }

    reward_kernel(&config, x, outputs);

    normalized.clear();
    normalized.resize(n, 0.0);
    for e in (0..n).filter(|&e| !x.skip[e]) {
        normalized[e] = normalizer.0.update_and_normalize(outputs.raw[e]);
    }
    for (env, .., mut pending, mut episode) in &mut envs {
        let e = env.0 as usize;
        if x.skip[e] {
            episode.end_with_rollback(f64::from(DEATH_PENALTY));
            continue;
        }
        *pending = PendingRewardTerms::default();
        episode.add(outputs.raw[e]);
    }
    for (env, index, .., mut state) in &mut slots {
        let (e, k) = (env.0 as usize, index.0 as usize);
        if x.skip[e] {
            continue;
        }
        let i = e * s + k;
        state.escrow_credit = outputs.escrow_credit[i];
        state.prev_alpha = x.alpha[i];
        state.prev_params = x.params[i];
        state.proposed_drip = if k == x.target_slot[e] as usize { outputs.proposed_drip[e] } else { None };
    }
}
