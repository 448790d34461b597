//! The rollout buffer (simic §4.5): one row per env, `T` columns (the episode length), every column
//! allocated once per run and refilled in place each round. A row holds the env's steps in order; a
//! governor rollback leaves no column for the aborted step and ends the env's episode at its last
//! column (simic §1.6, with the reference's [CAVEAT] fixed as the issue asks):
//!
//! * the last column before the rollback gets the death penalty, raw −10 (not normalised), `done`,
//!   not `truncated`; the earlier columns of that episode get 0 (`ROLLBACK_FORFEIT_REWARD`);
//! * GAE and the update's TBPTT cut there (the next column starts from a zero LSTM state);
//! * a rollback with no column of its episode yet (the first step after a round start or a rollback)
//!   has nowhere to put the penalty: it is dropped and counted.
//!
//! The round's last step is `done` and `truncated` (the episode ends by time limit and bootstraps
//! from V of the post-action state, written at round end). The behaviour log-probs of simic §4.5 are
//! not kept: the update's ratios are against its anchored recomputation, so nothing would read them.

use esper_components::{ActionMasks, FactoredAction, LifecycleOp};

/// The death penalty's raw reward (already within the ±10 reward clip).
pub const DEATH_PENALTY: f32 = -10.0;
/// What the earlier steps of a rolled-back episode are worth.
pub const ROLLBACK_FORFEIT_REWARD: f32 = 0.0;

/// One env's step, as the Record stage hands it over.
#[derive(Clone, Copy, Debug)]
pub struct StepRow<'a> {
    /// The observation the policy read (normalised with the round's frozen statistics), `D` long.
    pub state: &'a [f32],
    /// Blueprint index per slot (−1 for an empty slot), `S` long.
    pub blueprints: &'a [i64],
    /// The sampled factored action.
    pub action: FactoredAction,
    /// `action_for_reward`: the op the causal masks of the update credit.
    pub effective_op: LifecycleOp,
    /// V(s) on the critic's normalised scale.
    pub value: f32,
    /// The normalised reward.
    pub reward: f32,
    /// The episode's last step by time limit.
    pub truncated: bool,
    pub masks: &'a ActionMasks,
    /// Per slot, the contribution target of the predictor (simic §3.4) where `Some`.
    pub contribution_targets: &'a [Option<f32>],
}

/// `[E, T, …]` columns, row-major (`e·T + t`).
#[derive(Clone, Debug)]
pub struct RolloutBuffer {
    pub n_envs: usize,
    /// Columns per row (`T`).
    pub capacity: usize,
    pub obs_dim: usize,
    pub n_slots: usize,
    /// `[E, T, D]`.
    pub states: Vec<f32>,
    /// `[E, T, S]`.
    pub blueprints: Vec<i64>,
    pub actions: Vec<FactoredAction>,
    pub effective_ops: Vec<LifecycleOp>,
    /// V(s) on the normalised scale.
    pub values: Vec<f32>,
    /// V of the state after the column's step, normalised scale; set on truncated columns only.
    pub bootstrap: Vec<f32>,
    pub rewards: Vec<f32>,
    pub done: Vec<bool>,
    pub truncated: Vec<bool>,
    /// The step's masks (only WAIT legal — `is_forced_wait` — is a forced step: the value loss weighs
    /// it 0.2, the policy loss skips it).
    pub masks: Vec<ActionMasks>,
    /// `[E, T, S]` the contribution predictor's targets and where they hold.
    pub contribution_targets: Vec<f32>,
    pub contribution_mask: Vec<bool>,
    /// `[E]` columns filled.
    pub lens: Vec<usize>,
    /// `[E]` the first column of the env's current episode.
    pub episode_start: Vec<usize>,
    /// Rollbacks that ended an episode with the death penalty, and those that had no column to put it on.
    pub penalised_rollbacks: u64,
    pub unattributed_rollbacks: u64,
}

impl RolloutBuffer {
    pub fn new(n_envs: usize, capacity: usize, obs_dim: usize, n_slots: usize) -> Self {
        let cells = n_envs * capacity;
        Self {
            n_envs,
            capacity,
            obs_dim,
            n_slots,
            states: vec![0.0; cells * obs_dim],
            blueprints: vec![-1; cells * n_slots],
            actions: vec![FactoredAction::wait(); cells],
            effective_ops: vec![LifecycleOp::Wait; cells],
            values: vec![0.0; cells],
            bootstrap: vec![0.0; cells],
            rewards: vec![0.0; cells],
            done: vec![false; cells],
            truncated: vec![false; cells],
            masks: vec![ActionMasks::default(); cells],
            contribution_targets: vec![0.0; cells * n_slots],
            contribution_mask: vec![false; cells * n_slots],
            lens: vec![0; n_envs],
            episode_start: vec![0; n_envs],
            penalised_rollbacks: 0,
            unattributed_rollbacks: 0,
        }
    }

    /// Empty every row (the columns keep their storage and are overwritten before they are read).
    pub fn clear(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
        self.episode_start.iter_mut().for_each(|s| *s = 0);
        self.penalised_rollbacks = 0;
        self.unattributed_rollbacks = 0;
    }

    /// Columns filled over all rows.
    pub fn total_steps(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Append env `env`'s step. Panics when the row is full (more steps than the episode length).
    pub fn push(&mut self, env: usize, row: StepRow) {
        let t = self.lens[env];
        assert!(t < self.capacity, "env {env}: more than {} steps in a round", self.capacity);
        let i = env * self.capacity + t;
        let (d, s) = (self.obs_dim, self.n_slots);
        self.states[i * d..(i + 1) * d].copy_from_slice(row.state);
        self.blueprints[i * s..(i + 1) * s].copy_from_slice(row.blueprints);
        self.actions[i] = row.action;
        self.effective_ops[i] = row.effective_op;
        self.values[i] = row.value;
        self.bootstrap[i] = 0.0;
        self.rewards[i] = row.reward;
        self.done[i] = row.truncated;
        self.truncated[i] = row.truncated;
        self.masks[i] = *row.masks;
        for (k, target) in row.contribution_targets.iter().enumerate() {
            self.contribution_targets[i * s + k] = target.unwrap_or(0.0).clamp(-10.0, 10.0);
            self.contribution_mask[i * s + k] = target.is_some();
        }
        self.lens[env] = t + 1;
    }

    /// Env `env` rolled back this step: end its episode at its last column with the death penalty
    /// (returns true), or count the penalty as dropped when the episode has no column yet.
    pub fn end_with_rollback(&mut self, env: usize) -> bool {
        let (start, len) = (self.episode_start[env], self.lens[env]);
        self.episode_start[env] = len;
        if len == start {
            self.unattributed_rollbacks += 1;
            return false;
        }
        let row = env * self.capacity;
        self.rewards[row + start..row + len - 1].fill(ROLLBACK_FORFEIT_REWARD);
        self.rewards[row + len - 1] = DEATH_PENALTY;
        self.done[row + len - 1] = true;
        self.truncated[row + len - 1] = false;
        self.penalised_rollbacks += 1;
        true
    }

    /// `[E, T]`: column `t` of env `e` starts a new episode after an earlier one in the row ended
    /// (the update's TBPTT resets the LSTM state before it).
    pub fn episode_starts(&self, out: &mut Vec<bool>) {
        out.clear();
        out.resize(self.n_envs * self.capacity, false);
        for e in 0..self.n_envs {
            for t in 1..self.lens[e] {
                let i = e * self.capacity + t;
                out[i] = self.done[i - 1] && !self.truncated[i - 1];
            }
        }
    }

    /// Whether `(env, t)` holds a step.
    pub fn valid(&self, env: usize, t: usize) -> bool {
        t < self.lens[env]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(buffer: &mut RolloutBuffer, env: usize, reward: f32, truncated: bool) {
        let masks = ActionMasks::default();
        buffer.push(
            env,
            StepRow {
                state: &[reward; 2],
                blueprints: &[-1],
                action: FactoredAction::wait(),
                effective_op: LifecycleOp::Wait,
                value: 0.0,
                reward,
                truncated,
                masks: &masks,
                contribution_targets: &[Some(12.5)],
            },
        );
    }

    /// A rollback mid-row penalises the last column of that episode and zeroes the earlier ones; the
    /// next episode in the row is untouched and truncates at the end; a rollback right after another
    /// has no column and is counted as dropped.
    #[test]
    fn a_rollback_ends_the_episode_at_its_last_column() {
        let mut b = RolloutBuffer::new(2, 6, 2, 1);
        for r in [0.5, 0.7, 0.9] {
            push(&mut b, 0, r, false);
        }
        assert!(b.end_with_rollback(0));
        assert!(!b.end_with_rollback(0), "no column since the last rollback");
        push(&mut b, 0, 0.3, false);
        push(&mut b, 0, 0.4, true);
        assert_eq!(b.lens[0], 5);
        assert_eq!(&b.rewards[0..5], &[0.0, 0.0, -10.0, 0.3, 0.4]);
        assert_eq!(&b.done[0..5], &[false, false, true, false, true]);
        assert_eq!(&b.truncated[0..5], &[false, false, false, false, true]);
        assert_eq!((b.penalised_rollbacks, b.unattributed_rollbacks), (1, 1));
        let mut starts = Vec::new();
        b.episode_starts(&mut starts);
        assert_eq!(&starts[0..6], &[false, false, false, true, false, false]);
        // The contribution target is clipped to ±10 and marked.
        assert_eq!((b.contribution_targets[0], b.contribution_mask[0]), (10.0, true));
        // Env 1 has no column: a rollback there is dropped.
        assert!(!b.end_with_rollback(1));
        assert_eq!(b.unattributed_rollbacks, 2);
        b.clear();
        assert_eq!((b.total_steps(), b.penalised_rollbacks), (0, 0));
    }
}
