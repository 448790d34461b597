//! Tick: the per-epoch mechanical lifecycle tick (`step_epoch`, simic §1.3 D.11) over every slot of every
//! env as one query: alpha ramps, scheduled-prune completion, auto-forward gates, the cooldown pipeline.
//! After a slot's tick its `auto_pruned` flag is read and cleared: each seed the governor pruned adds
//! [`AUTO_PRUNE_PENALTY`] to its env's pending reward terms (paid by the next reward). A slot without a
//! seed module drops its `acc_at_germination` and its escrow credit, and one without a state its
//! observation tracking.
//!
//! Reference behaviour kept: the rollback branch ends the env's action transaction (`continue`) before
//! the mechanical advance, so an env that rolled back this step is not ticked — its freshly pruned
//! seeds enter EMBARGOED one step later, and their `auto_pruned` flags are read at the next tick.

use crate::resources::{EnvCount, OpOutcomes};
use crate::slot_query::SlotLifecycle;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::lifecycle::step_epoch;
use esper_components::{
    AUTO_PRUNE_PENALTY, EnvIndex, LifecycleConfig, PendingRewardTerms, SlotEvents, SlotRewardState,
    SlotTracking,
};

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn tick(
    mut slots: Query<(&EnvIndex, &mut SlotEvents, &mut SlotTracking, &mut SlotRewardState, SlotLifecycle)>,
    mut envs: Query<(&EnvIndex, &mut PendingRewardTerms)>,
    outcomes: Res<OpOutcomes>,
    config: Res<LifecycleConfig>,
    n_envs: Res<EnvCount>,
    mut auto_pruned: Local<Vec<u32>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Tick::tick");
    auto_pruned.clear();
    auto_pruned.resize(n_envs.0, 0);
    for (env, mut events, mut tracking, mut reward, mut slot) in &mut slots {
        let e = env.0 as usize;
        if outcomes.rolled_back(e) {
            continue;
        }
        let had_gate = slot.blend.has_gate;
        let outcome = step_epoch(&mut slot.view(), &config);
        events.gate_created |= !had_gate && slot.blend.has_gate;
        events.pruned |= outcome.pruned;
        events.emptied |= outcome.emptied;
        if slot.metrics.auto_pruned.take().is_some() {
            auto_pruned[e] += 1;
        }
        // The loop drops a slot's germination record once it holds no seed module (a completed or
        // governor prune), and its observation tracking once it holds no state at all.
        if !slot.stage.current.has_seed() {
            tracking.acc_at_germination = None;
            reward.escrow_credit = 0.0;
        }
        if !slot.stage.current.has_state() {
            *tracking = SlotTracking::default();
        }
    }
    for (env, mut pending) in &mut envs {
        let n = auto_pruned[env.0 as usize];
        if n > 0 {
            pending.auto_prune_penalty += AUTO_PRUNE_PENALTY * n as f64;
        }
    }
}
