//! Tick: the per-epoch mechanical lifecycle tick (`step_epoch`) over every slot of every env as one
//! query: alpha ramps, scheduled-prune completion, auto-forward gates, the cooldown pipeline.

use crate::slot_query::SlotQuery;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::LifecycleConfig;
use esper_components::lifecycle::step_epoch;

pub fn tick(mut slots: Query<SlotQuery>, config: Res<LifecycleConfig>, info: StepInfo) {
    let _span = crate::system_span!(info, "Tick::tick");
    for mut slot in &mut slots {
        let had_gate = slot.blend.has_gate;
        let outcome = step_epoch(&mut slot.view(), &config);
        slot.events.gate_created |= !had_gate && slot.blend.has_gate;
        slot.events.pruned |= outcome.pruned;
        slot.events.emptied |= outcome.emptied;
    }
}
