//! Observe: every env's Obs V3 observation (tamiyo §1) in one kernel call. The system gathers the
//! signals, the last action, the slot reports and the loop's per-slot tracking into the kernel's SoA
//! columns — one pass over the env entities, one over the slot entities — and
//! [`build_observations`](esper_kernels::observation::build_observations) fills the `[E, 23 + 31·S]`
//! raw observation and the `[E, S]` blueprint indices of [`ObsBatch`]. The columns and buffers are
//! sized once, so a step allocates nothing.

use crate::host_resources::StepClock;
use crate::resources::EnvCount;
use crate::step_span::StepInfo;
use crate::update_signals::EnvSignals;
use bevy_ecs::prelude::*;
use bevy_ecs::query::QueryData;
use bevy_ecs::system::SystemParam;
use esper_components::signals::SIGNAL_HISTORY_EXPOSED;
use esper_components::{
    AlphaController, BlendStyle, Blueprint, EnvIndex, GradientTelemetry, LastAction, SeedAlpha, SeedMetrics,
    SlotConfig, SlotIndex, SlotTracking, Stage, StageCounters, Tempo,
};
use esper_kernels::observation::{DEFAULT_EPISODE_LENGTH, ObsInputs, build_observations as build, obs_dim};

/// This step's observation of every env: the raw features (what the normaliser's statistics and
/// `--log-observations` see), the normalised features the policy reads, and the blueprint indices
/// for the policy's embedding (not normalised; −1 for an empty slot). Rows are envs.
#[derive(Resource, Clone, Debug, Default)]
pub struct ObsBatch {
    /// `[E, 23 + 31·S]`.
    pub raw: Vec<f32>,
    /// `[E, 23 + 31·S]`, written by `normalize_observations`.
    pub normalized: Vec<f32>,
    /// `[E, S]`.
    pub blueprint_indices: Vec<i64>,
    /// The columns the kernel read this step (their `n_envs` and `n_slots` are the batch's shape).
    pub inputs: ObsInputs,
}

impl ObsBatch {
    /// Buffers for `n_envs` envs of `n_slots` slots (all zero until the first Observe).
    pub fn new(n_envs: usize, n_slots: usize) -> Self {
        let mut batch = Self::default();
        batch.resize(n_envs, n_slots);
        batch
    }

    fn resize(&mut self, n_envs: usize, n_slots: usize) {
        let dim = obs_dim(n_slots);
        self.raw.resize(n_envs * dim, 0.0);
        self.normalized.resize(n_envs * dim, 0.0);
        self.blueprint_indices.resize(n_envs * n_slots, -1);
        self.inputs.resize(n_envs, n_slots);
    }

    /// Features per env.
    pub fn dim(&self) -> usize {
        self.inputs.dim()
    }

    /// Env `e`'s raw features.
    pub fn raw_row(&self, e: usize) -> &[f32] {
        let d = self.dim();
        &self.raw[e * d..(e + 1) * d]
    }

    /// Env `e`'s normalised features.
    pub fn normalized_row(&self, e: usize) -> &[f32] {
        let d = self.dim();
        &self.normalized[e * d..(e + 1) * d]
    }

    /// Env `e`'s blueprint indices.
    pub fn blueprint_row(&self, e: usize) -> &[i64] {
        let s = self.inputs.n_slots;
        &self.blueprint_indices[e * s..(e + 1) * s]
    }
}

/// What the observation reads of one slot: its report and the loop's tracking.
#[derive(QueryData)]
pub struct ObservedSlot {
    pub env: &'static EnvIndex,
    pub index: &'static SlotIndex,
    pub stage: &'static Stage,
    pub counters: &'static StageCounters,
    pub metrics: &'static SeedMetrics,
    pub telemetry: &'static GradientTelemetry,
    pub alpha: &'static SeedAlpha,
    pub controller: &'static AlphaController,
    pub blend: &'static BlendStyle,
    pub tempo: &'static Tempo,
    pub blueprint: &'static Blueprint,
    pub tracking: &'static SlotTracking,
}

/// What an observation is built from: the env and slot components and the run's shape. The Observe
/// system fills the step's observation with it; the learner's round end fills the bootstrap
/// observation of the post-action state with the same code.
#[derive(SystemParam)]
pub struct ObservationSources<'w, 's> {
    envs: Query<'w, 's, (&'static EnvIndex, &'static EnvSignals, &'static LastAction)>,
    slots: Query<'w, 's, ObservedSlot>,
    clock: Res<'w, StepClock>,
    n_envs: Res<'w, EnvCount>,
    slot_config: Res<'w, SlotConfig>,
}

impl ObservationSources<'_, '_> {
    /// Every env's raw observation and blueprint indices into `batch`, in one kernel call.
    pub fn fill(&self, batch: &mut ObsBatch) {
        let n_slots = self.slot_config.len();
        batch.resize(self.n_envs.0, n_slots);
        let ObsBatch { raw, blueprint_indices, inputs: x, .. } = batch;
        x.max_epochs = match self.clock.episode_epochs {
            0 => DEFAULT_EPISODE_LENGTH,
            t => u32::try_from(t).unwrap_or(u32::MAX),
        };

        for (env, signals, last) in &self.envs {
            let e = env.0 as usize;
            match &signals.0 {
                Some(s) => {
                    x.epoch[e] = s.epoch;
                    x.val_loss[e] = s.val_loss;
                    x.val_accuracy[e] = s.val_accuracy;
                    x.loss_history[e] = s.loss_history;
                    x.accuracy_history[e] = s.accuracy_history;
                    x.history_len[e] = s.history_len;
                }
                // No epoch validated yet (never the case after update_signals): nothing measured.
                None => {
                    x.epoch[e] = u32::try_from(self.clock.epoch).unwrap_or(u32::MAX);
                    x.val_loss[e] = 0.0;
                    x.val_accuracy[e] = 0.0;
                    x.loss_history[e] = [0.0; SIGNAL_HISTORY_EXPOSED];
                    x.accuracy_history[e] = [0.0; SIGNAL_HISTORY_EXPOSED];
                    x.history_len[e] = 0;
                }
            }
            x.last_action_success[e] = last.success;
            x.last_action_op[e] = last.op;
        }

        for s in &self.slots {
            let i = s.env.0 as usize * n_slots + s.index.0 as usize;
            x.stage[i] = s.stage.current;
            x.blueprint[i] = s.blueprint.0;
            x.alpha[i] = s.alpha.0;
            x.contribution[i] = s.metrics.counterfactual_contribution;
            x.contribution_velocity[i] = s.metrics.contribution_velocity;
            x.blend_tempo_epochs[i] = s.tempo.epochs;
            x.alpha_start[i] = s.controller.start;
            x.alpha_target[i] = s.controller.target;
            x.alpha_mode[i] = s.controller.mode;
            x.alpha_steps_total[i] = s.controller.steps_total;
            x.alpha_steps_done[i] = s.controller.steps_done;
            x.alpha_algorithm[i] = s.blend.algorithm;
            x.interaction_sum[i] = s.metrics.interaction_sum;
            x.gradient_norm[i] = s.telemetry.gradient_norm;
            x.gradient_health[i] = s.telemetry.gradient_health;
            x.has_vanishing[i] = s.telemetry.has_vanishing;
            x.has_exploding[i] = s.telemetry.has_exploding;
            x.gradient_health_prev[i] = s.tracking.gradient_health_prev;
            x.epochs_in_stage[i] = s.counters.epochs_in_stage;
            x.epochs_since_counterfactual[i] = s.tracking.epochs_since_counterfactual;
            x.epochs_total[i] = s.counters.epochs_total;
        }

        build(x, raw, blueprint_indices);
    }
}

pub fn build_observations(sources: ObservationSources, mut batch: ResMut<ObsBatch>, info: StepInfo) {
    let _span = crate::system_span!(info, "Observe::build_observations");
    sources.fill(&mut batch);
}
