//! TrainHosts: bring the hosts' seeds in line with the lifecycle (re-initialise germinated rows, new
//! gates, momentum resets at fossilization; every slot's forward mode), then one epoch of training for
//! every env at once through the backend: each batch is one forward/backward/SGD over all envs. The
//! epoch's per-env results are read after validation (`record_train_metrics`), so that a device backend
//! returns them with the validation pass's sums: one copy back per step.

use crate::host_resources::{Hosts, StepClock, TrainData};
use crate::seed_sync::seed_env_state_of;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    AlphaAlgorithm, BlendStyle, Blueprint, EnvIndex, SeedAlpha, SlotEvents, SlotFlags, SlotIndex, Stage,
};
use esper_kernels::host::SlotSync;
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;

type SlotView<'a> = (
    &'a EnvIndex,
    &'a SlotIndex,
    &'a SlotEvents,
    &'a Stage,
    &'a Blueprint,
    &'a SeedAlpha,
    &'a BlendStyle,
    &'a SlotFlags,
);

pub fn train_hosts(
    mut hosts: ResMut<Hosts>,
    mut data: ResMut<TrainData>,
    clock: Res<StepClock>,
    slots: Query<SlotView>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "TrainHosts::train_hosts");
    for (env, index, events, stage, blueprint, alpha, blend, flags) in &slots {
        let e = env.0 as usize;
        // Every draw of a seed's birth is keyed by (run seed, round, env, SeedInit), counted by slot and
        // epoch, so it never depends on the env count or on other envs' lifecycles.
        let sync = SlotSync {
            germinate: CnnBlueprint::from_action_index(blueprint.0 as u8)
                .filter(|_| events.germinated)
                .map(|bp| (bp, blend.algorithm == AlphaAlgorithm::Multiply)),
            create_gate: events.gate_created,
            reset_momentum: events.fossilized,
            state: seed_env_state_of(stage, blueprint, alpha, blend, flags),
            draws: StreamKey::new(clock.seed, clock.round, e as u64, Purpose::SeedInit),
            counter: (index.0 as u64) << 40 | clock.epoch << 1,
        };
        hosts.sync_slot(e, index.0 as usize, &sync);
    }
    let data = &mut *data;
    data.batcher.begin_epoch(clock.round, clock.epoch);
    // On a device this only launches: the epoch's device time is known once its results are back,
    // after validation, and `record_train_metrics` records it (the profile puts it on this row).
    hosts.train_epoch(&data.dataset, &data.batcher);
    if let Some(run) = hosts.peek_device_report().and_then(|r| r.train_run) {
        _span.record("graph", tracing::field::display(run.name()));
    }
}
