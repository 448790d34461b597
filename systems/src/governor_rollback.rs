//! Act (first): every env the resolve stage marked rolled back returns to its governor's last known
//! good state, as the reference does it (tamiyo §6.5, §6.7): the host and the seeds that were
//! FOSSILIZED at snapshot time are restored, host and seed optimizer state is cleared, and every live
//! seed is pruned with the governor's reason (fossils, cooldown and empty slots are untouched). The
//! sampled op is not executed. A fossil the snapshot holds gets its snapshot-time state back with its
//! weights (the reference's non-strict load restores the fossil's `_extra_state`). Reference behaviour
//! kept: a seed fossilized *after* the snapshot is not in it, so it keeps its stage, state and current
//! weights.
//!
//! This system owns the slot events of rolled-back envs this step; [`crate::apply_ops`] owns the rest.

use crate::host_resources::Hosts;
use crate::resources::{EnvCount, OpOutcomes};
use crate::slot_query::SlotLifecycle;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::{GovernorConfig, GovernorState, PanicReason, rollback_prune_slot};
use esper_components::{EnvIndex, FossilSnapshot, SlotEvents};

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn governor_rollback(
    mut envs: Query<(&EnvIndex, &mut GovernorState)>,
    mut slots: Query<(&EnvIndex, &mut SlotEvents, &FossilSnapshot, SlotLifecycle)>,
    outcomes: Res<OpOutcomes>,
    config: Res<GovernorConfig>,
    n_envs: Res<EnvCount>,
    mut hosts: ResMut<Hosts>,
    mut reasons: Local<Vec<Option<PanicReason>>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Act::governor_rollback");
    reasons.clear();
    reasons.resize(n_envs.0, None);
    for (env, mut governor) in &mut envs {
        let e = env.0 as usize;
        if !outcomes.rolled_back(e) {
            continue;
        }
        let report = governor.execute_rollback(&config);
        reasons[e] = Some(report.reason);
        hosts.restore_snapshot(e);
    }
    for (env, mut events, held, mut slot) in &mut slots {
        if let Some(reason) = reasons[env.0 as usize] {
            if let Some(state) = &held.0 {
                slot.view().write(state);
            }
            let pruned = rollback_prune_slot(&mut slot.view(), reason);
            *events = SlotEvents { pruned, ..SlotEvents::default() };
        }
    }
}
