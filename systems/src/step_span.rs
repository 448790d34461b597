//! Profiling spans (DESIGN §8). Every system opens its own `tracing` span named `<Set>::<system>`
//! carrying the env count and the step index, with [`system_span!`]; bevy_ecs's own `trace` spans are
//! all named "system" and carry neither. With no subscriber installed a span costs one atomic load.

use crate::host_resources::StepClock;
use crate::resources::EnvCount;
use bevy_ecs::prelude::*;
use bevy_ecs::system::SystemParam;

/// What a system's span records: the env count and the step index. Read-only, so it never orders or
/// conflicts with another system.
#[derive(SystemParam)]
pub struct StepInfo<'w> {
    clock: Res<'w, StepClock>,
    envs: Res<'w, EnvCount>,
}

impl StepInfo<'_> {
    pub fn step(&self) -> u64 {
        self.clock.step
    }

    pub fn envs(&self) -> u64 {
        self.envs.0 as u64
    }
}

/// Enter the span `$name` (a `"<Set>::<system>"` literal) for the rest of the calling scope (its
/// fields: the env count, the step, and on a device `device_us` and `graph`, how the stage used CUDA
/// graphs):
/// `let _span = system_span!(info, "Observe::build_masks");`
#[macro_export]
macro_rules! system_span {
    ($info:expr, $name:literal) => {
        ::tracing::info_span!(
            target: "esper",
            $name,
            envs = $info.envs(),
            step = $info.step(),
            device_us = ::tracing::field::Empty,
            graph = ::tracing::field::Empty
        )
        .entered()
    };
}

/// Every span the step schedule of [`add_training_systems`](crate::add_training_systems) opens, in
/// schedule order; a test checks it against the schedule's systems.
pub const TRAINING_SYSTEM_SPANS: [&str; 22] = [
    "TrainHosts::train_hosts",
    "Validate::validate",
    "Validate::record_train_metrics",
    "Observe::governor_check",
    "Observe::record_accuracy",
    "Observe::sync_gradient_telemetry",
    "Observe::update_signals",
    "Observe::build_observations",
    "Observe::normalize_observations",
    "Observe::build_masks",
    "Decide::decide",
    "Decide::resolve_actions",
    "Reward::compute_rewards",
    "Act::governor_rollback",
    "Act::apply_ops",
    "Act::track_actions",
    "Tick::tick",
    "Record::tally_lifecycle",
    "Record::note_fossilizations",
    "Record::write_metrics",
    "Record::write_trace",
    "Record::record_rollout",
];
