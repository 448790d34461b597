//! Validate (after the pass): every env's training loss and accuracy of this epoch. They are read here
//! rather than in TrainHosts because a device backend returns them with the validation pass's sums, in
//! the step's one copy back; read without a validation pass first, they cost a copy of their own.

use crate::host_resources::Hosts;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, HostMetrics};

pub fn record_train_metrics(
    mut hosts: ResMut<Hosts>,
    mut envs: Query<(&EnvIndex, &mut HostMetrics)>,
    info: StepInfo,
) {
    // The epoch's device time is known only once its results are back, so it is recorded here, as
    // `train_device_us`: the profile puts it beside TrainHosts (`device_us` would put it on this row).
    let _span = tracing::info_span!(
        target: "esper",
        "Validate::record_train_metrics",
        envs = info.envs(),
        step = info.step(),
        train_device_us = tracing::field::Empty
    )
    .entered();
    let results = hosts.epoch_train();
    for (env, mut metrics) in &mut envs {
        let r = results[env.0 as usize];
        metrics.train_loss = r.loss;
        metrics.train_accuracy = r.accuracy;
    }
    if let Some(report) = hosts.peek_device_report() {
        _span.record("train_device_us", report.train_ms * 1e3);
    }
}
