//! Batch resources shared by the systems of one step, shaped `[E, …]` and allocated once per run.

use bevy_ecs::resource::Resource;
use esper_components::{ActionMasks, FactoredAction, Head, OpOutcome};

/// Number of envs in the world (every `[E, …]` batch has this many rows).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvCount(pub usize);

/// One decision per env as SoA: `heads[h * E + e]` is head `h` (in [`Head`] order) of env `e` — the
/// layout of the policy's one `[8, E]` device→host copy.
#[derive(Resource, Clone, Debug, PartialEq, Eq)]
pub struct ActionBatch {
    n_envs: usize,
    heads: Vec<u8>,
}

impl ActionBatch {
    /// Every env WAITs.
    pub fn new(n_envs: usize) -> Self {
        let mut batch = Self { n_envs, heads: vec![0; Head::COUNT * n_envs] };
        for e in 0..n_envs {
            batch.set(e, FactoredAction::wait());
        }
        batch
    }

    pub fn n_envs(&self) -> usize {
        self.n_envs
    }

    /// The `[E]` column of one head.
    pub fn head(&self, head: Head) -> &[u8] {
        let h = head as usize;
        &self.heads[h * self.n_envs..(h + 1) * self.n_envs]
    }

    pub fn head_mut(&mut self, head: Head) -> &mut [u8] {
        let h = head as usize;
        &mut self.heads[h * self.n_envs..(h + 1) * self.n_envs]
    }

    pub fn get(&self, env: usize) -> FactoredAction {
        let at = |h: Head| self.heads[h as usize * self.n_envs + env];
        FactoredAction {
            slot: at(Head::Slot),
            blueprint: at(Head::Blueprint),
            style: at(Head::Style),
            tempo: at(Head::Tempo),
            alpha_target: at(Head::AlphaTarget),
            alpha_speed: at(Head::AlphaSpeed),
            alpha_curve: at(Head::AlphaCurve),
            op: at(Head::Op),
        }
    }

    pub fn set(&mut self, env: usize, action: FactoredAction) {
        for head in Head::ALL {
            self.heads[head as usize * self.n_envs + env] = action.head(head);
        }
    }
}

/// Each env's action masks for this step, built in Observe from the post-record state.
#[derive(Resource, Clone, Debug, PartialEq, Eq)]
pub struct MaskBatch(pub Vec<ActionMasks>);

/// What became of each env's op this step.
#[derive(Resource, Clone, Debug, PartialEq, Eq)]
pub struct OpOutcomes(pub Vec<OpOutcome>);
