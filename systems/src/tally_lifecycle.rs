//! Record: per-env lifecycle counts from this step's slot events (germinated, fossilized, pruned — by
//! the policy, by a completed scheduled prune, or by a governor rollback) and op outcomes (failed ops,
//! rollbacks, vetoes).

use crate::resources::{ActionBatch, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, Head, LifecycleOp, LifecycleTally, OpOutcome, SlotEvents};

/// One env's slot events of this step, counted over its slots (a rollback prunes several at once).
#[derive(Clone, Copy, Debug, Default)]
pub struct EventCounts {
    germinated: u32,
    fossilized: u32,
    pruned: u32,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn tally_lifecycle(
    slots: Query<(&EnvIndex, &SlotEvents)>,
    mut envs: Query<(&EnvIndex, &mut LifecycleTally)>,
    outcomes: Res<OpOutcomes>,
    actions: Res<ActionBatch>,
    n_envs: Res<EnvCount>,
    mut counts: Local<Vec<EventCounts>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::tally_lifecycle");
    counts.clear();
    counts.resize(n_envs.0, EventCounts::default());
    for (env, events) in &slots {
        let c = &mut counts[env.0 as usize];
        c.germinated += u32::from(events.germinated);
        c.fossilized += u32::from(events.fossilized);
        c.pruned += u32::from(events.pruned);
    }
    let ops = actions.head(Head::Op);
    for (env, mut tally) in &mut envs {
        let e = env.0 as usize;
        let c = counts[e];
        tally.germinated += c.germinated;
        tally.fossilized += c.fossilized;
        tally.pruned += c.pruned;
        let outcome = outcomes.0[e];
        tally.last_op = LifecycleOp::from_index(ops[e]).unwrap_or(LifecycleOp::Wait);
        tally.last_outcome = outcome;
        tally.rollbacks += u32::from(outcome == OpOutcome::RolledBack);
        tally.vetoed += u32::from(outcome == OpOutcome::Vetoed);
        tally.failed_ops += u32::from(outcome.failed());
    }
}
