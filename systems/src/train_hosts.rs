//! TrainHosts: bring the kernels' seeds in line with the lifecycle (re-initialise germinated rows, new
//! gates, momentum resets at fossilization; every slot's forward mode), then one epoch of training for
//! every env at once: each batch is one forward/backward/SGD over all envs.

use crate::host_resources::{Hosts, StepClock, TrainData};
use crate::seed_sync::seed_env_state_of;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    AlphaAlgorithm, BlendStyle, Blueprint, EnvIndex, HostMetrics, SeedAlpha, SlotEvents, SlotFlags,
    SlotIndex, Stage,
};
use esper_kernels::ops::{ClassifierShape, count_correct};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;

/// Gradient-health statistics are collected on every 10th batch (`gradient_telemetry_stride`).
pub const TELEMETRY_STRIDE: usize = 10;

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

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn train_hosts(
    mut hosts: ResMut<Hosts>,
    mut data: ResMut<TrainData>,
    clock: Res<StepClock>,
    slots: Query<SlotView>,
    mut envs: Query<(&EnvIndex, &mut HostMetrics)>,
    mut correct: Local<Vec<u32>>,
    mut epoch_totals: Local<Vec<(f64, u64)>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "TrainHosts::train_hosts");
    let hosts = &mut *hosts;
    for (env, index, events, stage, blueprint, alpha, blend, flags) in &slots {
        let e = env.0 as usize;
        let slot = hosts.bank.slot_mut(index.0 as usize).expect("every slot entity has its bank slot");
        // Every draw of a seed's birth is keyed by (run seed, round, env, SeedInit), counted by slot and
        // epoch, so it never depends on the env count or on other envs' lifecycles.
        let key = StreamKey::new(clock.seed, clock.round, e as u64, Purpose::SeedInit);
        let counter = (index.0 as u64) << 40 | clock.epoch << 1;
        if events.germinated
            && let Some(bp) = CnnBlueprint::from_action_index(blueprint.0 as u8)
        {
            slot.germinate(e, bp, blend.algorithm == AlphaAlgorithm::Multiply, key, counter);
        }
        if events.gate_created {
            slot.create_gate(e, key, counter | 1);
        }
        if events.fossilized {
            slot.reset_momentum(e);
        }
        slot.state[e] = seed_env_state_of(stage, blueprint, alpha, blend, flags);
    }

    let data = &mut *data;
    let n_envs = hosts.params.n_envs();
    let batch = hosts.workspace.batch;
    data.batcher.begin_epoch(clock.round, clock.epoch);
    hosts.trainer.clear_stats();
    epoch_totals.clear();
    epoch_totals.resize(n_envs, (0.0, 0));
    correct.resize(n_envs, 0);
    let n_batches = data.batcher.sharding().num_train_batches();
    let shape = ClassifierShape { envs: n_envs, batch, classes: hosts.arch.num_classes };
    for b in 0..n_batches {
        data.batcher.fill_train(&data.dataset, b, &mut data.images, &mut data.labels);
        let Hosts { params, bank, trainer, workspace, .. } = &mut *hosts;
        trainer.step(params, bank, workspace, &data.images, &data.labels, b % TELEMETRY_STRIDE == 0);
        count_correct(shape, &workspace.logits, &data.labels, &mut correct);
        for ((loss_sum, right), (&loss, &c)) in
            epoch_totals.iter_mut().zip(workspace.loss.iter().zip(correct.iter()))
        {
            *loss_sum += loss as f64;
            *right += c as u64;
        }
    }
    for (env, mut metrics) in &mut envs {
        let (loss_sum, right) = epoch_totals[env.0 as usize];
        metrics.train_loss = loss_sum / n_batches as f64;
        metrics.train_accuracy = 100.0 * right as f64 / (n_batches * batch) as f64;
    }
}
