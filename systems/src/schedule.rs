//! The step schedule: one run = one host epoch for every env (DESIGN §2). The stages are system sets
//! chained in order; systems inside a set run in parallel where their access allows, and ambiguity
//! detection is an error so that parallel order can never change a result.

use crate::build_observations::build_observations;
use crate::compute_rewards::compute_rewards;
use crate::decide::decide;
use crate::normalize_observations::normalize_observations;
use crate::note_fossilizations::note_fossilizations;
use crate::record_rollout::record_rollout;
use crate::record_train_metrics::record_train_metrics;
use crate::write_trace::write_trace;
use crate::{apply_ops::apply_ops, build_masks::build_masks, record_accuracy::record_accuracy};
use crate::{governor_check::governor_check, governor_rollback::governor_rollback};
use crate::{gradient_telemetry::sync_gradient_telemetry, update_signals::update_signals};
use crate::{resolve_actions::resolve_actions, track_actions::track_actions, write_metrics::write_metrics};
use crate::{tally_lifecycle::tally_lifecycle, tick::tick, train_hosts::train_hosts, validate::validate};
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::{LogLevel, ScheduleBuildSettings, ScheduleLabel};

/// The stages of one step, in order.
#[derive(SystemSet, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepSet {
    TrainHosts,
    Validate,
    Observe,
    Decide,
    Reward,
    Act,
    Tick,
    Record,
}

impl StepSet {
    pub const ALL: [StepSet; 8] = [
        Self::TrainHosts,
        Self::Validate,
        Self::Observe,
        Self::Decide,
        Self::Reward,
        Self::Act,
        Self::Tick,
        Self::Record,
    ];
}

/// The policy's system inside Decide: the resolve stage runs after it.
#[derive(SystemSet, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicySet;

#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Step;

/// An empty schedule for `label` with ambiguity detection at error level: every schedule of a run
/// (the step, the round end, the episode end) is built this way, so parallel order never changes a
/// result.
pub fn strict_schedule(label: impl ScheduleLabel) -> Schedule {
    let mut schedule = Schedule::new(label);
    schedule.set_build_settings(ScheduleBuildSettings {
        ambiguity_detection: LogLevel::Error,
        ..Default::default()
    });
    schedule
}

/// An empty step schedule with the sets chained and ambiguity detection at error level.
pub fn empty_step_schedule() -> Schedule {
    let mut schedule = strict_schedule(Step);
    schedule.configure_sets(
        (
            StepSet::TrainHosts,
            StepSet::Validate,
            StepSet::Observe,
            StepSet::Decide,
            StepSet::Reward,
            StepSet::Act,
            StepSet::Tick,
            StepSet::Record,
        )
            .chain(),
    );
    schedule
}

/// The lifecycle systems of the step: record accuracy and build masks (Observe), settle the sampled
/// actions (Decide, after the policy), apply the ops (Act), tick every slot (Tick), count what happened
/// (Record). A policy adds its system to Decide, in [`PolicySet`].
pub fn add_lifecycle_systems(schedule: &mut Schedule) {
    schedule.add_systems((
        (record_accuracy, build_masks).chain().in_set(StepSet::Observe),
        resolve_actions.after(PolicySet).in_set(StepSet::Decide),
        apply_ops.in_set(StepSet::Act),
        tick.in_set(StepSet::Tick),
        tally_lifecycle.in_set(StepSet::Record),
    ));
}

/// The host part of a step: train every host (TrainHosts), then the fused validation and the epoch's
/// training metrics, which a device returns with the validation's sums (Validate).
pub fn add_host_systems(schedule: &mut Schedule) {
    schedule.add_systems((
        train_hosts.in_set(StepSet::TrainHosts),
        (validate, record_train_metrics).chain().in_set(StepSet::Validate),
    ));
}

/// Observe: the governor check, record accuracy, gradient telemetry, signals, the observation (built,
/// then normalised) and the masks — what policy inference needs after validation.
pub fn add_observe_systems(schedule: &mut Schedule) {
    schedule.add_systems(
        (
            governor_check,
            record_accuracy,
            sync_gradient_telemetry,
            update_signals,
            build_observations,
            normalize_observations,
            build_masks,
        )
            .chain()
            .in_set(StepSet::Observe),
    );
}

/// Decide: the installed `ActivePolicy`, then the resolve stage that settles rollbacks, refusals and
/// vetoes before the Reward set.
pub fn add_decide_systems(schedule: &mut Schedule) {
    schedule.add_systems((decide.in_set(PolicySet), resolve_actions).chain().in_set(StepSet::Decide));
}

/// [`add_observe_systems`] and [`add_decide_systems`].
pub fn add_observe_decide_systems(schedule: &mut Schedule) {
    add_observe_systems(schedule);
    add_decide_systems(schedule);
}

/// Reward: every env's reward in one kernel call, after the decision and before the action runs.
pub fn add_reward_systems(schedule: &mut Schedule) {
    schedule.add_systems(compute_rewards.in_set(StepSet::Reward));
}

/// Act (governor rollbacks, the ops, then the action bookkeeping), Tick, Record (counts, fossilization
/// snapshots, `metrics.jsonl`, `trace.bin` and the learner's rollout, in parallel; the trace only where
/// a `TraceSink` is installed, the rollout only where the learner decided).
pub fn add_act_record_systems(schedule: &mut Schedule) {
    schedule.add_systems((
        (governor_rollback, apply_ops, track_actions).chain().in_set(StepSet::Act),
        tick.in_set(StepSet::Tick),
        (tally_lifecycle, note_fossilizations, write_metrics, write_trace, record_rollout)
            .in_set(StepSet::Record),
    ));
}

/// The whole training step: [`add_host_systems`], [`add_observe_decide_systems`],
/// [`add_reward_systems`] and [`add_act_record_systems`]. Everything after Validate is the epoch boundary; the bench times the
/// parts as separate schedules over the same world (the sets are chained, so that is the same order).
/// The app adds its Record-stage sinks.
pub fn add_training_systems(schedule: &mut Schedule) {
    add_host_systems(schedule);
    add_observe_decide_systems(schedule);
    add_reward_systems(schedule);
    add_act_record_systems(schedule);
}
