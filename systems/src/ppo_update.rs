//! Round end, for the learned policy (simic §1.3 D.12/D.15, §1.4): V of every env's post-action
//! state for the truncation bootstrap, then the PPO update from the round's buffer, which is then
//! emptied. The bootstrap observation is built from the state after the last step's action and tick
//! (the reference's "peek") with the Observe stage's own code, and normalised with the round's frozen
//! statistics, so it runs before the observation normaliser's update; it is not added to the round's
//! moments. An interrupted round (its last epoch never ran) makes no update: its buffer has no
//! truncated ends to bootstrap, and a resumed run replays it from the last checkpoint.

use crate::build_observations::{ObsBatch, ObservationSources};
use crate::host_resources::StepClock;
use crate::learner::{Learner, Rollout};
use crate::normalize_observations::ObsNormalization;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use candle_core::Tensor;

/// V(s_{T+1}) of every env from its carried LSTM state, into the bootstrap of each row's last column
/// where that column was truncated (a row whose last step rolled back ended in a true terminal).
pub fn bootstrap_values(
    sources: ObservationSources,
    mut observations: ResMut<ObsBatch>,
    normalization: Res<ObsNormalization>,
    clock: Res<StepClock>,
    learner: Res<Learner>,
    mut rollout: ResMut<Rollout>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "RoundEnd::bootstrap_values");
    if !clock.is_last_epoch() {
        return;
    }
    sources.fill(&mut observations);
    let ObsBatch { raw, normalized, blueprint_indices, .. } = &mut *observations;
    normalization.normalizer.normalize_into(raw, normalized);
    let buffer = &mut rollout.0;
    let n = buffer.n_envs;
    let device = &learner.agent.device;
    let obs = Tensor::from_slice(normalized, (n, normalized.len() / n), device).expect("[E, D] observations");
    let out = learner.agent.net.step(&obs, blueprint_indices, &learner.hidden).expect("the forward");
    let values: Vec<f32> = out.value.to_vec1().expect("the values read back");
    for (e, &value) in values.iter().enumerate() {
        let len = buffer.lens[e];
        let last = e * buffer.capacity + len.saturating_sub(1);
        if len > 0 && buffer.truncated[last] {
            buffer.bootstrap[last] = value;
        }
    }
}

/// The update (after the observation normaliser's), then an empty buffer for the next round.
pub fn ppo_update(
    clock: Res<StepClock>,
    mut learner: ResMut<Learner>,
    mut rollout: ResMut<Rollout>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "RoundEnd::ppo_update");
    learner.last_update = None;
    if clock.is_last_epoch() {
        learner.last_update = learner.agent.update(&rollout.0).expect("the PPO update");
    }
    rollout.0.clear();
}
