//! Act (before the ops): every env whose governor panicked is rolled back (tamiyo §6.5–6.7): its host
//! and seed weights return to the snapshot, its host and seed optimizer state is cleared, its live seeds
//! are pruned with the governor's reason, and its op this epoch is not executed (WAIT).

use crate::governor_check::GovernorVerdict;
use crate::host_resources::{Hosts, Snapshots};
use crate::resources::ActionBatch;
use crate::slot_query::SlotQuery;
use bevy_ecs::prelude::*;
use esper_components::governor::{GovernorConfig, GovernorState, rollback_prune_slot};
use esper_components::{EnvIndex, FactoredAction, LifecycleTally};

pub fn governor_rollback(
    mut envs: Query<(&EnvIndex, &GovernorVerdict, &mut GovernorState, &mut LifecycleTally)>,
    mut slots: Query<SlotQuery>,
    config: Res<GovernorConfig>,
    mut hosts: ResMut<Hosts>,
    snapshots: Res<Snapshots>,
    mut actions: ResMut<ActionBatch>,
    mut reasons: Local<Vec<Option<esper_components::governor::PanicReason>>>,
) {
    reasons.clear();
    reasons.resize(actions.n_envs(), None);
    let hosts = &mut *hosts;
    for (env, verdict, mut governor, mut tally) in &mut envs {
        if verdict.panic.is_none() {
            continue;
        }
        let e = env.0 as usize;
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
