//! Observe: each env's SignalTracker update from this epoch's host metrics and its slots' reports
//! (tamiyo §5.3); the signals both policies read land in the env's [`EnvSignals`].

use crate::host_resources::StepClock;
use crate::resources::EnvCount;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::signals::{EpochObservation, SeedReport, SignalConfig, SignalTracker, TrainingSignals};
use esper_components::{
    AlphaController, Blueprint, EnvIndex, HostMetrics, SeedAlpha, SeedMetrics, SlotConfig, SlotIndex, Stage,
    StageCounters,
};

/// The signals of the env's latest epoch (None before the first).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq)]
pub struct EnvSignals(pub Option<TrainingSignals>);

/// Every env's slot reports, `[E × S]` in canonical slot order, rebuilt each epoch in Observe.
#[derive(Resource, Clone, Debug, Default)]
pub struct SlotReports(pub Vec<SeedReport>);

impl SlotReports {
    pub fn env(&self, env: usize, n_slots: usize) -> &[SeedReport] {
        &self.0[env * n_slots..(env + 1) * n_slots]
    }
}

type ReportView<'a> = (
    &'a EnvIndex,
    &'a SlotIndex,
    &'a Stage,
    &'a StageCounters,
    &'a SeedMetrics,
    &'a SeedAlpha,
    &'a AlphaController,
    &'a Blueprint,
);

#[allow(clippy::too_many_arguments)]
pub fn update_signals(
    slots: Query<ReportView>,
    mut envs: Query<(&EnvIndex, &HostMetrics, &mut SignalTracker, &mut EnvSignals)>,
    mut reports: ResMut<SlotReports>,
    config: Res<SignalConfig>,
    slot_config: Res<SlotConfig>,
    n_envs: Res<EnvCount>,
    clock: Res<StepClock>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::update_signals");
    let n_slots = slot_config.len();
    reports.0.clear();
    reports.0.resize(n_envs.0 * n_slots, SeedReport::default());
    for (env, index, stage, counters, metrics, alpha, controller, blueprint) in &slots {
        let report =
            SeedReport::from_components(index.0, stage, counters, metrics, alpha, controller, blueprint);
        reports.0[env.0 as usize * n_slots + index.0 as usize] = report;
    }
    for (env, host, mut tracker, mut signals) in &mut envs {
        let obs = EpochObservation {
            epoch: clock.epoch as u32,
            global_step: clock.epoch,
            train_loss: host.train_loss,
            train_accuracy: host.train_accuracy,
            val_loss: host.val_loss,
            val_accuracy: host.val_accuracy,
        };
        signals.0 = Some(tracker.update(&config, &obs, reports.env(env.0 as usize, n_slots)));
    }
}
