//! Act: apply every env's chosen op to its target slot — the action mask first, then the handler's own
//! precondition, then Kasmina's checks. A failing op is a no-op recorded as failed, never a panic.

use crate::resources::{ActionBatch, MaskBatch, OpOutcomes};
use crate::slot_query::SlotQuery;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    LifecycleConfig, LifecycleOp, OpOutcome, SeedStage, SlotEvents, apply_action, outcome_without_slot,
};

pub fn apply_ops(
    mut slots: Query<SlotQuery>,
    actions: Res<ActionBatch>,
    masks: Res<MaskBatch>,
    config: Res<LifecycleConfig>,
    mut outcomes: ResMut<OpOutcomes>,
    mut pending: Local<Vec<bool>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Act::apply_ops");
    // Masked actions and WAIT are settled without a slot; the rest run on their target slot below.
    pending.clear();
    for (env, outcome) in outcomes.0.iter_mut().enumerate() {
        let settled = outcome_without_slot(&actions.get(env), &masks.0[env]);
        *outcome = settled.unwrap_or(OpOutcome::Succeeded);
        pending.push(settled.is_none());
    }
    let slot_head = actions.head(esper_components::Head::Slot);
    for mut slot in &mut slots {
        *slot.events = SlotEvents::default();
        let env = slot.env.0 as usize;
        if !pending[env] || slot_head[env] != slot.index.0 {
            continue;
        }
        let action = actions.get(env);
        let had_gate = slot.blend.has_gate;
        let outcome = apply_action(&action, &masks.0[env], &mut slot.view(), &config);
        slot.events.gate_created = !had_gate && slot.blend.has_gate;
        outcomes.0[env] = outcome;
        if outcome == OpOutcome::Succeeded {
            let op = LifecycleOp::from_index(action.op);
            slot.events.germinated = op == Some(LifecycleOp::Germinate);
            slot.events.fossilized = op == Some(LifecycleOp::Fossilize);
            slot.events.pruned = op == Some(LifecycleOp::Prune) && slot.stage.current == SeedStage::Pruned;
        }
    }
}
