//! Record: one `metrics.jsonl` line per env per epoch, written into the run's [`MetricsSink`]. Each line
//! carries the env's validation and training figures, the action its policy sampled (`sampled_op`,
//! `sampled_slot`), the op that counts for the reward (`effective_op`), what became of the sampled op
//! (`outcome`), and every slot's stage and alpha. The buffers live in the system's `Local`s and are
//! sized once, so a step's lines allocate nothing.

use crate::host_resources::StepClock;
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, HostMetrics, LifecycleOp, SeedAlpha, SlotConfig, SlotIndex, Stage};
use std::io::Write;

/// Where the Record stage writes `metrics.jsonl`. An I/O error stops the writing and is kept for the
/// run driver to report after the step (a system has no caller to return it to).
#[derive(Resource)]
pub struct MetricsSink {
    out: Box<dyn Write + Send + Sync>,
    slot_names: Vec<String>,
    error: Option<String>,
}

impl MetricsSink {
    pub fn new(out: Box<dyn Write + Send + Sync>, slots: &SlotConfig) -> Self {
        Self { out, slot_names: slots.ids().iter().map(|s| s.to_string()).collect(), error: None }
    }

    /// The first write error, if any (the sink writes nothing after it).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

/// One line of `metrics.jsonl`.
#[derive(serde::Serialize)]
struct MetricsLine<'a> {
    env: u32,
    round: u64,
    epoch: u64,
    val_acc: f64,
    val_loss: f64,
    train_loss: f64,
    train_acc: f64,
    sampled_op: &'a str,
    sampled_slot: &'a str,
    effective_op: &'a str,
    outcome: &'a str,
    stages: &'a [&'static str],
    alphas: &'a [f64],
}

/// The system's reused `[E]` and `[E × S]` columns.
#[derive(Default)]
pub struct MetricsScratch {
    metrics: Vec<HostMetrics>,
    stages: Vec<&'static str>,
    alphas: Vec<f64>,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn write_metrics(
    envs: Query<(&EnvIndex, &HostMetrics)>,
    slots: Query<(&EnvIndex, &SlotIndex, &Stage, &SeedAlpha)>,
    actions: Res<ActionBatch>,
    effective: Res<EffectiveOps>,
    outcomes: Res<OpOutcomes>,
    clock: Res<StepClock>,
    n_envs: Res<EnvCount>,
    mut sink: ResMut<MetricsSink>,
    mut scratch: Local<MetricsScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::write_metrics");
    if sink.error.is_some() {
        return;
    }
    let n_slots = sink.slot_names.len();
    let MetricsScratch { metrics, stages, alphas } = &mut *scratch;
    metrics.resize(n_envs.0, HostMetrics::default());
    stages.resize(n_envs.0 * n_slots, "DORMANT");
    alphas.resize(n_envs.0 * n_slots, 0.0);
    for (env, m) in &envs {
        metrics[env.0 as usize] = *m;
    }
    for (env, index, stage, alpha) in &slots {
        let row = env.0 as usize * n_slots + index.0 as usize;
        stages[row] = stage.current.name();
        alphas[row] = alpha.0;
    }
    let sink = &mut *sink;
    let result = (|| -> Result<(), String> {
        for (e, m) in metrics.iter().enumerate() {
            let action = actions.get(e);
            let line = MetricsLine {
                env: e as u32,
                round: clock.round,
                epoch: clock.epoch,
                val_acc: m.val_accuracy,
                val_loss: m.val_loss,
                train_loss: m.train_loss,
                train_acc: m.train_accuracy,
                sampled_op: LifecycleOp::from_index(action.op).map_or("?", LifecycleOp::name),
                sampled_slot: sink.slot_names.get(action.slot as usize).map_or("", String::as_str),
                effective_op: effective.0[e].name(),
                outcome: outcomes.0[e].name(),
                stages: &stages[e * n_slots..(e + 1) * n_slots],
                alphas: &alphas[e * n_slots..(e + 1) * n_slots],
            };
            serde_json::to_writer(&mut sink.out, &line).map_err(|err| err.to_string())?;
            sink.out.write_all(b"\n").map_err(|err| err.to_string())?;
        }
        sink.out.flush().map_err(|err| err.to_string())
    })();
    if let Err(err) = result {
        sink.error = Some(format!("metrics.jsonl: {err}"));
    }
}
