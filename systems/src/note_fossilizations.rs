//! Record: a successful FOSSILIZE asks the env's governor for a snapshot at its next healthy check (the
//! fossil's weights must be in the last-known-good copy). Runs beside the other Record systems.

use crate::resources::EnvCount;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::GovernorState;
use esper_components::{EnvIndex, SlotEvents};

pub fn note_fossilizations(
    slots: Query<(&EnvIndex, &SlotEvents)>,
    mut envs: Query<(&EnvIndex, &mut GovernorState)>,
    n_envs: Res<EnvCount>,
    mut fossilized: Local<Vec<bool>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::note_fossilizations");
    fossilized.clear();
    fossilized.resize(n_envs.0, false);
    for (env, events) in &slots {
        fossilized[env.0 as usize] |= events.fossilized;
    }
    for (env, mut governor) in &mut envs {
        if fossilized[env.0 as usize] {
            governor.note_fossilization();
        }
    }
}
