//! Decide: the installed [`Policy`](crate::policy::Policy) reads every env's observations (the
//! normalised features and blueprint indices of [`ObsBatch`], with the signals and slot reports) and
//! masks and writes the batch of factored actions — one call per step for all envs. Without an
//! installed policy the learned one decides ([`Learner::decide`]: one batched network forward).

use crate::build_observations::ObsBatch;
use crate::host_resources::StepClock;
use crate::learner::Learner;
use crate::policy::{ActivePolicy, Observations};
use crate::resources::{ActionBatch, MaskBatch};
use crate::step_span::StepInfo;
use crate::update_signals::{EnvSignals, SlotReports};
use bevy_ecs::prelude::*;
use esper_components::signals::TrainingSignals;
use esper_components::{EnvIndex, SlotConfig};

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it reads
pub fn decide(
    envs: Query<(&EnvIndex, &EnvSignals)>,
    reports: Res<SlotReports>,
    masks: Res<MaskBatch>,
    observations: Res<ObsBatch>,
    slot_config: Res<SlotConfig>,
    clock: Res<StepClock>,
    policy: Option<ResMut<ActivePolicy>>,
    learner: Option<ResMut<Learner>>,
    mut actions: ResMut<ActionBatch>,
    mut signals: Local<Vec<Option<TrainingSignals>>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Decide::decide");
    let Some(mut policy) = policy else {
        let learner = learner.expect("a run installs a policy or the learner");
        learner.into_inner().decide(
            &observations.normalized,
            &observations.blueprint_indices,
            &masks.0,
            *clock,
            &mut actions,
        );
        return;
    };
    signals.clear();
    signals.resize(masks.0.len(), None);
    for (env, s) in &envs {
        signals[env.0 as usize] = s.0;
    }
    let obs = Observations {
        clock: *clock,
        features: &observations.normalized,
        blueprint_indices: &observations.blueprint_indices,
        signals: &signals,
        reports: &reports.0,
        n_slots: slot_config.len(),
    };
    policy.0.decide(&obs, &masks.0, &mut actions);
}
