//! Act: run the handler of every env whose op survived the resolve stage (outcome `Pending`: a non-WAIT
//! op the mask allowed, so its slot head names an enabled slot) on its target slot — the handler's precondition, then Kasmina's checks. A failing op is a no-op recorded as
//! failed, never a panic. A germination records the seed's and the host's parameter counts (kasmina
//! §3.4 step 8).
//!
//! This system owns the slot events of every env that did not roll back this step
//! ([`crate::governor_rollback`] owns those).

use crate::resources::{ActionBatch, MaskBatch, OpOutcomes, ParamCounts};
use crate::slot_query::SlotLifecycle;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    EnvIndex, Head, LifecycleConfig, LifecycleOp, OpOutcome, SeedStage, SlotEvents, SlotIndex, apply_action,
};

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn apply_ops(
    mut slots: Query<(&EnvIndex, &SlotIndex, &mut SlotEvents, SlotLifecycle)>,
    actions: Res<ActionBatch>,
    masks: Res<MaskBatch>,
    config: Res<LifecycleConfig>,
    param_counts: Res<ParamCounts>,
    mut outcomes: ResMut<OpOutcomes>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Act::apply_ops");
    let slot_head = actions.head(Head::Slot);
    for (env, index, mut events, mut slot) in &mut slots {
        let e = env.0 as usize;
        if outcomes.rolled_back(e) {
            continue;
        }
        *events = SlotEvents::default();
        if outcomes.0[e] != OpOutcome::Pending || slot_head[e] != index.0 {
            continue;
        }
        let action = actions.get(e);
        let had_gate = slot.blend.has_gate;
        let outcome = apply_action(&action, &masks.0[e], &mut slot.view(), &config);
        events.gate_created = !had_gate && slot.blend.has_gate;
        outcomes.0[e] = outcome;
        if outcome == OpOutcome::Executed {
            let op = LifecycleOp::from_index(action.op);
            events.germinated = op == Some(LifecycleOp::Germinate);
            events.fossilized = op == Some(LifecycleOp::Fossilize);
            events.pruned = op == Some(LifecycleOp::Prune) && slot.stage.current == SeedStage::Pruned;
            if events.germinated {
                let (host, seed, gate) = param_counts.for_seed(index.0 as usize, slot.blueprint.0);
                slot.metrics.host_param_count = host;
                slot.metrics.seed_param_count = seed;
                slot.metrics.gate_param_count = gate;
            }
        }
    }
}
