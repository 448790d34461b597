//! Act (before the ops): the governor's two interventions (tamiyo §6.5–6.7).
//! * Every env whose governor panicked is rolled back: its host and seed weights return to the
//!   snapshot, its host and seed optimizer state is cleared, its live seeds are pruned with the
//!   governor's reason, and its op this epoch is not executed (WAIT).
//! * Every other env's mutation passes the preflight (finite validation loss and accuracy, capacity,
//!   well-formed heads); a vetoed op is not executed either (WAIT, counted as vetoed).

use crate::governor_check::GovernorVerdict;
use crate::host_resources::{Hosts, Snapshots};
use crate::resources::ActionBatch;
use crate::slot_query::SlotQuery;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::{
    GovernorConfig, GovernorState, PanicReason, PreflightRequest, preflight_lifecycle_mutation,
    rollback_prune_slot,
};
use esper_components::{EnvIndex, FactoredAction, HostMetrics, LifecycleConfig, LifecycleTally, SeedStage};

#[allow(clippy::too_many_arguments)]
pub fn governor_rollback(
    mut envs: Query<(&EnvIndex, &HostMetrics, &GovernorVerdict, &mut GovernorState, &mut LifecycleTally)>,
    mut slots: Query<SlotQuery>,
    config: Res<GovernorConfig>,
    lifecycle: Res<LifecycleConfig>,
    mut hosts: ResMut<Hosts>,
    snapshots: Res<Snapshots>,
    mut actions: ResMut<ActionBatch>,
    mut reasons: Local<Vec<Option<PanicReason>>>,
    mut targets: Local<Vec<(SeedStage, u32)>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Act::governor_rollback");
    let n_envs = actions.n_envs();
    reasons.clear();
    reasons.resize(n_envs, None);
    // Each env's target-slot stage and live seed count, for the preflight.
    targets.clear();
    targets.resize(n_envs, (SeedStage::Dormant, 0));
    for slot in &slots {
        let e = slot.env.0 as usize;
        if slot.stage.current.has_seed() {
            targets[e].1 += 1;
        }
        if actions.get(e).slot == slot.index.0 {
            targets[e].0 = slot.stage.current;
        }
    }
    let hosts = &mut *hosts;
    for (env, metrics, verdict, mut governor, mut tally) in &mut envs {
        let e = env.0 as usize;
        if verdict.panic.is_none() {
            let action = actions.get(e);
            let (stage, live) = targets[e];
            let request = PreflightRequest::from_action(
                &action,
                stage,
                metrics.val_loss,
                metrics.val_accuracy,
                lifecycle.max_seeds,
                live,
            );
            if request.is_some_and(|r| preflight_lifecycle_mutation(&r).is_err()) {
                actions.set(e, FactoredAction::wait());
                tally.vetoed += 1;
            }
            continue;
        }
        let report = governor.execute_rollback(&config);
        reasons[e] = Some(report.reason);
        hosts.params.copy_env_from(&snapshots.params, e);
        hosts.bank.copy_env_params_from(&snapshots.bank, e);
        hosts.trainer.momentum.zero_env(e);
        for slot in hosts.bank.slots_mut() {
            slot.reset_momentum(e);
        }
        actions.set(e, FactoredAction::wait());
        tally.rollbacks += 1;
    }
    for mut slot in &mut slots {
        if let Some(reason) = reasons[slot.env.0 as usize] {
            slot.events.pruned |= rollback_prune_slot(&mut slot.view(), reason);
        }
    }
}
