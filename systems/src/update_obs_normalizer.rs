//! Round end: the observation normaliser's one EMA step from the moments of all of the round's raw
//! observations (simic §4.6), then fresh moments about the new mean. It runs after a round's last
//! epoch (or the epoch a stop request ended the round at, as the reference's graceful stop still
//! updates) and before anything learns from the round (the learned policy's update will follow it in the
//! same schedule); the observations stored during the round keep the normalisation they had.

use crate::normalize_observations::ObsNormalization;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use bevy_ecs::schedule::ScheduleLabel;

#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoundEnd;

pub fn update_obs_normalizer(mut normalization: ResMut<ObsNormalization>, info: StepInfo) {
    let _span = crate::system_span!(info, "RoundEnd::update_obs_normalizer");
    let ObsNormalization { normalizer, round } = &mut *normalization;
    if round.rows == 0 {
        return;
    }
    normalizer.update_from_moments(round);
    round.restart(&normalizer.mean);
}

/// The round-end schedule (ambiguity detection at error, like the step's).
pub fn round_end_schedule() -> Schedule {
    let mut schedule = crate::schedule::strict_schedule(RoundEnd);
    schedule.add_systems(update_obs_normalizer);
    schedule
}
