//! Act: apply every env's chosen op to its target slot — the action mask first, then the handler's own
//! precondition, then Kasmina's checks. A failing op is a no-op recorded as failed, never a panic.

use crate::resources::{ActionBatch, MaskBatch, OpOutcomes};
use crate::slot_query::SlotQuery;
use bevy_ecs::prelude::*;
use esper_components::{LifecycleConfig, LifecycleOp, OpOutcome, SeedStage, SlotEvents, apply_action};

pub fn apply_ops(
    mut slots: Query<SlotQuery>,
    actions: Res<ActionBatch>,
    masks: Res<MaskBatch>,
    config: Res<LifecycleConfig>,
    mut outcomes: ResMut<OpOutcomes>,
) {
    // An env whose slot index names no slot never finds its target below: the mask rejects it.
    outcomes.0.fill(OpOutcome::FailedMask);
    let slot_head = actions.head(esper_components::Head::Slot);
    for mut slot in &mut slots {
        *slot.events = SlotEvents::default();
        let env = slot.env.0 as usize;
        if slot_head[env] != slot.index.0 {
            continue;
        }
        let action = actions.get(env);
        let outcome = apply_action(&action, &masks.0[env], &mut slot.view(), &config);
        outcomes.0[env] = outcome;
        if outcome == OpOutcome::Succeeded {
            let op = LifecycleOp::from_index(action.op);
            slot.events.germinated = op == Some(LifecycleOp::Germinate);
            slot.events.fossilized = op == Some(LifecycleOp::Fossilize);
            slot.events.pruned = op == Some(LifecycleOp::Prune) && slot.stage.current == SeedStage::Pruned;
        }
    }
}
