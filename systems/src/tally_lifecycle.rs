//! Record: per-env lifecycle counts (germinated, fossilized, pruned, failed ops) from this step's slot
//! events and op outcomes.

use crate::resources::{ActionBatch, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, Head, LifecycleOp, LifecycleTally, SlotEvents};

pub fn tally_lifecycle(
    slots: Query<(&EnvIndex, &SlotEvents)>,
    mut envs: Query<(&EnvIndex, &mut LifecycleTally)>,
    outcomes: Res<OpOutcomes>,
    actions: Res<ActionBatch>,
    n_envs: Res<EnvCount>,
    mut events_per_env: Local<Vec<SlotEvents>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::tally_lifecycle");
    events_per_env.clear();
    events_per_env.resize(n_envs.0, SlotEvents::default());
    for (env, events) in &slots {
        let e = &mut events_per_env[env.0 as usize];
        e.germinated |= events.germinated;
        e.fossilized |= events.fossilized;
        e.pruned |= events.pruned;
    }
    let ops = actions.head(Head::Op);
    for (env, mut tally) in &mut envs {
        let e = env.0 as usize;
        let events = events_per_env[e];
        tally.germinated += events.germinated as u32;
        tally.fossilized += events.fossilized as u32;
        tally.pruned += events.pruned as u32;
        tally.last_op = LifecycleOp::from_index(ops[e]).unwrap_or(LifecycleOp::Wait);
        tally.last_outcome = outcomes.0[e];
        tally.failed_ops += outcomes.0[e].failed() as u32;
    }
}
