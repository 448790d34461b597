//! Batch resources shared by the systems of one step, shaped `[E, …]` and allocated once per run.

use bevy_ecs::resource::Resource;
use esper_components::{ActionMasks, FactoredAction, Head, LifecycleOp, OpOutcome};

/// Number of envs in the world (every `[E, …]` batch has this many rows).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvCount(pub usize);

/// The action each env's policy sampled this step, as SoA: `heads[h * E + e]` is head `h` (in [`Head`] order) of env `e` — the
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

/// `[E]`: each env's `action_for_reward` this step (simic §1.3 D.1): the sampled op when it is valid for
/// the target slot's state and survived the mask and the governor, else WAIT (also for a rolled-back
/// env, which gets no reward at all). Written before the Reward set; never overwrites the sampled
/// action in [`ActionBatch`].
#[derive(Resource, Clone, Debug, PartialEq, Eq)]
pub struct EffectiveOps(pub Vec<LifecycleOp>);

/// `[E]`: what became of each env's sampled op this step. The resolve stage settles rollbacks, mask
/// refusals and vetoes and leaves the rest [`OpOutcome::Pending`]; Act runs the pending handlers.
#[derive(Resource, Clone, Debug, PartialEq, Eq)]
pub struct OpOutcomes(pub Vec<OpOutcome>);

impl OpOutcomes {
    /// The env rolled back this step: no reward, no buffer row (simic §1.3 D.2).
    pub fn rolled_back(&self, env: usize) -> bool {
        self.0[env] == OpOutcome::RolledBack
    }
}

/// Trainable parameter counts of the run's host and of every blueprint at every slot, recorded onto a
/// seed when it germinates (kasmina §3.4 step 8). A world without hosts (lifecycle-only tests) has the
/// empty table, and its seeds record 0.
#[derive(Resource, Clone, Debug, Default, PartialEq, Eq)]
pub struct ParamCounts {
    pub host: u64,
    /// `[slot][blueprint action index]`: the seed module's parameters (0 where no such blueprint).
    pub seed: Vec<[u64; esper_components::BlueprintAction::COUNT]>,
    /// `[slot]`: the slot's gate network's parameters.
    pub gate: Vec<u64>,
}

impl ParamCounts {
    /// `(host, seed, gate)` for a `blueprint` seed at slot `slot` (zeros when unknown).
    pub fn for_seed(&self, slot: usize, blueprint: esper_components::BlueprintAction) -> (u64, u64, u64) {
        let seed = self.seed.get(slot).map_or(0, |row| row[blueprint as usize]);
        (self.host, seed, self.gate.get(slot).copied().unwrap_or(0))
    }
}
