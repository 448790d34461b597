//! Round end: the observation normaliser's one EMA step from the moments of all of the round's raw
//! observations (simic §4.6), then fresh moments about the new mean. It runs after a round's last
//! epoch (or the epoch a stop request ended the round at, as the reference's graceful stop still
//! updates) and before anything learns from the round (the learned policy's update follows it in the
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

/// The round-end schedule (ambiguity detection at error, like the step's): with the learned policy
/// learning, the bootstrap observation and values first (frozen statistics), then this update, then
/// the PPO update.
pub fn round_end_schedule() -> Schedule {
    use crate::learner::Rollout;
    use crate::ppo_update::{bootstrap_values, ppo_update};
    let mut schedule = crate::schedule::strict_schedule(RoundEnd);
    let learning = resource_exists::<Rollout>;
    schedule.add_systems(
        (bootstrap_values.run_if(learning), update_obs_normalizer, ppo_update.run_if(learning)).chain(),
    );
    schedule
}
