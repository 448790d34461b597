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
use esper_kernels::policy::ppo::UpdateMetrics;

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

/// The update (after the observation normaliser's), then an empty buffer for the next round, with
/// the finiteness gate's bookkeeping ([`finiteness_failures_after`]).
pub fn ppo_update(
    clock: Res<StepClock>,
    mut learner: ResMut<Learner>,
    mut rollout: ResMut<Rollout>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "RoundEnd::ppo_update");
    learner.last_update = None;
    if clock.is_last_epoch() {
        let update = learner.agent.update(&rollout.0).expect("the PPO update");
        learner.finiteness_failures = finiteness_failures_after(learner.finiteness_failures, update.as_ref());
        learner.last_update = update;
    }
    rollout.0.clear();
}

/// The finiteness gate's count after an update (simic §1.4.3), as the reference keeps it: the run
/// stops when it reaches `FINITENESS_FAILURE_LIMIT`.
///
/// * an update whose every epoch was skipped for non-finite values adds one;
/// * an update that stepped leaves the count as it was. Reference quirk kept: the spec says "3
///   consecutive", but the reference calls `PPOCoordinator.check_finiteness_gate` only for a skipped
///   update (vectorized_trainer.py), so its "reset on a successful update" never runs and three
///   failures anywhere in the run stop it;
/// * a skipped update with no finiteness skip (nothing to learn from, or no epoch run for another
///   reason) sets it back to 0, where the reference's check returns 0.
///
/// The spec's "otherwise the batch is re-run with the same batch index" is a branch the reference never
/// takes (`check_finiteness_gate` returns `should_continue = True` or raises), so the next round simply
/// follows.
pub fn finiteness_failures_after(failures: u32, update: Option<&UpdateMetrics>) -> u32 {
    match update {
        Some(m) if m.epochs_run > 0 => failures,
        Some(m) if m.skipped_for_nonfinite() => failures + 1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_over_the_run_and_only_a_skipped_update_without_them_resets() {
        let failed = UpdateMetrics { epochs_run: 0, nonfinite_skips: 2, ..UpdateMetrics::default() };
        let stepped = UpdateMetrics { epochs_run: 1, nonfinite_skips: 1, ..UpdateMetrics::default() };
        // fail, step, fail, fail: three failures, so the run stops (not three in a row).
        let mut n = 0;
        for update in [&failed, &stepped, &failed, &failed] {
            n = finiteness_failures_after(n, Some(update));
        }
        assert_eq!(n, 3);
        assert_eq!(finiteness_failures_after(2, None), 0, "an empty buffer resets");
        let idle = UpdateMetrics { epochs_run: 0, nonfinite_skips: 0, ..UpdateMetrics::default() };
        assert_eq!(finiteness_failures_after(2, Some(&idle)), 0);
    }
}
