//! Record: a successful FOSSILIZE asks the env's governor for a snapshot at its next healthy check (the
//! fossil's weights must be in the last-known-good copy). Runs beside the other Record systems.

use bevy_ecs::prelude::*;
use esper_components::governor::GovernorState;
use esper_components::{EnvIndex, SlotEvents};

pub fn note_fossilizations(
    slots: Query<(&EnvIndex, &SlotEvents)>,
    mut envs: Query<(&EnvIndex, &mut GovernorState)>,
) {
    for (env, events) in &slots {
        if events.fossilized
            && let Some((_, mut governor)) = envs.iter_mut().find(|(e, _)| e.0 == env.0)
        {
            governor.note_fossilization();
        }
    }
}
