//! Observe: the policy's input — every env's raw observation normalised with the running statistics,
//! which stay frozen for the whole round (tamiyo §1.4, simic §4.6). The raw rows are also added to the
//! round's moments, from which `update_obs_normalizer` takes one EMA step when the round ends.

use crate::build_observations::ObsBatch;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_kernels::obs_normalizer::{ObsMoments, ObsNormalizer};

/// The run's observation normaliser and the moments of the current round's raw observations (every
/// env, every step — a rolled-back env's observation included, as in the reference). The normaliser
/// is what a checkpoint saves; the moments restart at every round end.
#[derive(Resource, Clone, Debug, PartialEq)]
pub struct ObsNormalization {
    pub normalizer: ObsNormalizer,
    pub round: ObsMoments,
}

impl ObsNormalization {
    /// A fresh normaliser (mean 0, variance 1) for `dim` features.
    pub fn new(dim: usize) -> Self {
        Self::from_normalizer(ObsNormalizer::new(dim))
    }

    /// Continue from saved statistics, with no observations in the round yet.
    pub fn from_normalizer(normalizer: ObsNormalizer) -> Self {
        let round = ObsMoments::new(&normalizer.mean);
        Self { normalizer, round }
    }
}

pub fn normalize_observations(
    mut batch: ResMut<ObsBatch>,
    mut normalization: ResMut<ObsNormalization>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::normalize_observations");
    let ObsBatch { raw, normalized, .. } = &mut *batch;
    normalization.normalizer.normalize_into(raw, normalized);
    normalization.round.add_rows(raw);
}
