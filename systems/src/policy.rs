//! The policy interface every decision-maker implements: one call per step, `decide(batch of
//! observations, masks) -> batch of factored actions`. The heuristic and the random baseline implement
//! it today; the learned policy will too. The Decide stage calls whichever policy the run installed.

use crate::host_resources::StepClock;
use crate::resources::ActionBatch;
use bevy_ecs::resource::Resource;
use esper_components::heuristic::{HeuristicConfig, HeuristicState};
use esper_components::masks::sample_masked;
use esper_components::signals::{SeedReport, TrainingSignals};
use esper_components::{ActionMasks, FactoredAction};
use esper_kernels::rng::{Purpose, StreamKey};

/// What a policy sees of every env this step, row `e` = env `e`: the Obs V3 features normalised with
/// the round's frozen statistics and the blueprint indices (what a learned policy reads), and the
/// signals and slot reports they were built from (what the heuristic reads).
pub struct Observations<'a> {
    pub clock: StepClock,
    /// `[E, 23 + 31·S]` normalised features.
    pub features: &'a [f32],
    /// `[E, S]` blueprint index per slot (−1 for an empty slot), for the policy's embedding.
    pub blueprint_indices: &'a [i64],
    /// Each env's training signals (None before its first epoch).
    pub signals: &'a [Option<TrainingSignals>],
    /// `[E × S]` slot reports in canonical slot order.
    pub reports: &'a [SeedReport],
    pub n_slots: usize,
}

impl Observations<'_> {
    pub fn n_envs(&self) -> usize {
        self.signals.len()
    }

    pub fn slots(&self, env: usize) -> &[SeedReport] {
        &self.reports[env * self.n_slots..(env + 1) * self.n_slots]
    }

    /// Features per env (`23 + 31·S`).
    pub fn obs_dim(&self) -> usize {
        esper_kernels::observation::obs_dim(self.n_slots)
    }

    /// Env `env`'s normalised features.
    pub fn features(&self, env: usize) -> &[f32] {
        let d = self.obs_dim();
        &self.features[env * d..(env + 1) * d]
    }

    /// Env `env`'s blueprint indices.
    pub fn blueprint_indices(&self, env: usize) -> &[i64] {
        &self.blueprint_indices[env * self.n_slots..(env + 1) * self.n_slots]
    }
}

/// A decision-maker for every env at once.
pub trait Policy: Send + Sync {
    /// One factored action per env into `actions`, given the observations and each env's masks.
    fn decide(&mut self, obs: &Observations, masks: &[ActionMasks], actions: &mut ActionBatch);
    /// Forget per-episode state (a new round starts with fresh hosts).
    fn reset(&mut self);
    fn name(&self) -> &'static str;
}

/// The policy a run decides with.
#[derive(Resource)]
pub struct ActivePolicy(pub Box<dyn Policy>);

/// Heuristic Tamiyo (tamiyo §5) per env; its decisions go through the masks like any policy's.
pub struct HeuristicPolicy {
    pub config: HeuristicConfig,
    pub states: Vec<HeuristicState>,
}

impl HeuristicPolicy {
    pub fn new(config: HeuristicConfig, n_envs: usize) -> Self {
        Self { config, states: vec![HeuristicState::default(); n_envs] }
    }
}

impl Policy for HeuristicPolicy {
    fn decide(&mut self, obs: &Observations, _masks: &[ActionMasks], actions: &mut ActionBatch) {
        for (e, state) in self.states.iter_mut().enumerate() {
            let action = match &obs.signals[e] {
                Some(signals) => state.decide(&self.config, signals, obs.slots(e)).action,
                None => FactoredAction::wait(),
            };
            actions.set(e, action);
        }
    }

    fn reset(&mut self) {
        self.states.iter_mut().for_each(HeuristicState::reset);
    }

    fn name(&self) -> &'static str {
        "heuristic"
    }
}

/// Never germinates: every env WAITs at every decision — the static host, the baseline that every
/// morphogenetic result is judged against. (WAIT is always legal.)
#[derive(Default)]
pub struct StaticPolicy;

impl Policy for StaticPolicy {
    fn decide(&mut self, obs: &Observations, _masks: &[ActionMasks], actions: &mut ActionBatch) {
        for e in 0..obs.n_envs() {
            actions.set(e, FactoredAction::wait());
        }
    }

    fn reset(&mut self) {}

    fn name(&self) -> &'static str {
        "static"
    }
}

/// A uniformly random legal action per env — a baseline. Env `e` draws from its own stream
/// `(seed, round, e, Policy)` counted by epoch, so its choices never depend on the other envs.
#[derive(Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn decide(&mut self, obs: &Observations, masks: &[ActionMasks], actions: &mut ActionBatch) {
        let c = obs.clock;
        for (e, m) in masks.iter().enumerate() {
            let mut stream = StreamKey::new(c.seed, c.round, e as u64, Purpose::Policy).stream(c.epoch << 8);
            actions.set(e, sample_masked(m, |n| stream.below(n as u64) as usize));
        }
    }

    fn reset(&mut self) {}

    fn name(&self) -> &'static str {
        "random"
    }
}
