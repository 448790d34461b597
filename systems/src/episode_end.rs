//! The episode-end schedule: runs once between rounds. Every env gets a fresh host (drawn from its
//! stream for the new round) and its snapshot, empty slots, and fresh trackers, governors and policy
//! state (the learned policy's LSTM state included) — the reference builds new environments for every
//! batch of episodes (simic §1.1).

use crate::governor_check::GovernorVerdict;
use crate::host_resources::{Hosts, StepClock};
use crate::learner::Learner;
use crate::policy::ActivePolicy;
use crate::slot_query::SlotLifecycle;
use crate::step_span::StepInfo;
use crate::update_signals::EnvSignals;
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::ScheduleLabel;
use esper_components::governor::GovernorState;
use esper_components::signals::{SignalConfig, SignalTracker};
use esper_components::{
    EpisodeReturn, FossilCounters, FossilSnapshot, HostMetrics, LastAction, PendingRewardTerms,
    ScaffoldLedger, SlotRewardState, SlotState, SlotTracking,
};

#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
pub struct EpisodeEnd;

type EnvState<'a> = (
    &'a mut HostMetrics,
    &'a mut SignalTracker,
    &'a mut EnvSignals,
    &'a mut GovernorState,
    &'a mut GovernorVerdict,
    EpisodeBooks<'a>,
);

/// The per-env bookkeeping of an episode (tracking state, counters, pending reward terms).
type EpisodeBooks<'a> = (
    &'a mut LastAction,
    &'a mut FossilCounters,
    &'a mut PendingRewardTerms,
    &'a mut ScaffoldLedger,
    &'a mut EpisodeReturn,
);

/// Fresh state for the round in [`StepClock`] (set it before running the schedule).
#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn reset_episode(
    clock: Res<StepClock>,
    signal_config: Res<SignalConfig>,
    mut hosts: ResMut<Hosts>,
    policy: Option<ResMut<ActivePolicy>>,
    learner: Option<ResMut<Learner>>,
    mut envs: Query<EnvState>,
    mut slots: Query<(SlotLifecycle, &mut SlotTracking, &mut FossilSnapshot, &mut SlotRewardState)>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "EpisodeEnd::reset_episode");
    hosts.reset_round(clock.seed, clock.round);
    if let Some(mut policy) = policy {
        policy.0.reset();
    }
    if let Some(mut learner) = learner {
        learner.reset_hidden();
    }
    for (mut metrics, mut tracker, mut signals, mut governor, mut verdict, books) in &mut envs {
        let (mut last, mut fossils, mut pending, mut ledger, mut episode) = books;
        *episode = EpisodeReturn::default();
        *last = LastAction::default();
        *fossils = FossilCounters::default();
        *pending = PendingRewardTerms::default();
        ledger.entries.clear(); // keeps its capacity
        *metrics = HostMetrics::default();
        tracker.reset(&signal_config);
        *signals = EnvSignals::default();
        governor.reset();
        *verdict = GovernorVerdict::default();
    }
    for (mut slot, mut tracking, mut held, mut reward) in &mut slots {
        *reward = SlotRewardState::default();
        slot.view().write(&SlotState::default());
        *tracking = SlotTracking::default();
        *held = FossilSnapshot::default();
    }
}

/// The episode-end schedule (ambiguity detection at error, like the step's).
pub fn episode_end_schedule() -> Schedule {
    let mut schedule = crate::schedule::strict_schedule(EpisodeEnd);
    schedule.add_systems(reset_episode);
    schedule
}
