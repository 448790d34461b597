//! The learned policy as world state: the PPO agent (network, Adam, critic normaliser), the LSTM state
//! of every env (`[E, H]`, zeroed at round start and for an env on rollback), this step's draws, and
//! the round's rollout buffer. Decide calls [`Learner::decide`] when no scripted or baseline
//! [`ActivePolicy`](crate::policy::ActivePolicy) is installed; Record files the step into the buffer
//! (`record_rollout`); the round end bootstraps and updates (`ppo_update`).

use crate::host_resources::StepClock;
use crate::resources::ActionBatch;
use bevy_ecs::resource::Resource;
use candle_core::{DType, Tensor};
use esper_components::ActionMasks;
use esper_kernels::policy::network::Recurrent;
use esper_kernels::policy::ppo::{PpoAgent, UpdateMetrics};
use esper_kernels::policy::rollout::RolloutBuffer;
use esper_kernels::policy::sampler::{DrawScratch, draw};
use esper_kernels::rng::{Purpose, StreamKey};

#[derive(Resource)]
pub struct Learner {
    pub agent: PpoAgent,
    /// Take each head's most probable legal choice instead of sampling (`--deterministic`).
    pub deterministic: bool,
    /// `[E, H]` the LSTM state each env's next decision starts from.
    pub hidden: Recurrent,
    /// `[E]` V(s) of this step, on the critic's scale.
    pub values: Vec<f32>,
    /// What the last round's update reported (None before the first, or when it was skipped).
    pub last_update: Option<UpdateMetrics>,
    /// Updates whose every epoch the finiteness gate skipped, counted as the reference counts them
    /// (`ppo_update::finiteness_failures_after`: over the run, not only in a row); the run stops at
    /// [`FINITENESS_FAILURE_LIMIT`]. Not kept in a checkpoint: a resumed run starts at 0.
    pub finiteness_failures: u32,
    scratch: DrawScratch,
    /// `[E, Σ head sizes + 1]`: this step's logits of every head and V, as read back.
    read_back: Vec<f32>,
    /// Where each head's logits start in a row of `read_back`.
    offsets: [usize; 8],
}

/// Updates skipped whole for non-finite values at which the run stops (simic §1.4.3).
pub const FINITENESS_FAILURE_LIMIT: u32 = 3;

/// The round's transitions, present only while the policy learns (not under `--eval`).
#[derive(Resource)]
pub struct Rollout(pub RolloutBuffer);

impl Learner {
    pub fn new(agent: PpoAgent, n_envs: usize, deterministic: bool) -> candle_core::Result<Self> {
        let hidden = Recurrent::zeros(n_envs, agent.net.shape.hidden, DType::F32, &agent.device)?;
        let sizes = agent.net.shape.head_sizes();
        let mut offsets = [0usize; 8];
        for h in 1..8 {
            offsets[h] = offsets[h - 1] + sizes[h - 1];
        }
        Ok(Self {
            agent,
            deterministic,
            hidden,
            values: vec![0.0; n_envs],
            last_update: None,
            finiteness_failures: 0,
            scratch: DrawScratch::default(),
            read_back: Vec::new(),
            offsets,
        })
    }

    /// A fresh zero state for every env (round start).
    pub fn reset_hidden(&mut self) {
        let zero = vec![true; self.values.len()];
        self.zero_hidden_where(&zero);
    }

    /// Zero the state of the envs where `zero[e]` holds (a rollback).
    pub fn zero_hidden_where(&mut self, zero: &[bool]) {
        self.hidden = self.hidden.zero_rows(zero).expect("an [E, 1] mask over the [E, H] state");
    }

    /// One batched forward for every env (normalised observations `[E, D]`, blueprint indices
    /// `[E, S]`), then each env's action drawn with its masks from its own stream
    /// `(seed, round, env, Policy)` at counter `epoch << 8` (8 uniforms, one per head).
    pub fn decide(
        &mut self,
        features: &[f32],
        blueprints: &[i64],
        masks: &[ActionMasks],
        clock: StepClock,
        actions: &mut ActionBatch,
    ) {
        let n = masks.len();
        let d = features.len() / n.max(1);
        let net = &self.agent.net;
        let obs = Tensor::from_slice(features, (n, d), &self.agent.device).expect("[E, D] observations");
        let out = net.step(&obs, blueprints, &self.hidden).expect("the policy's forward");
        // One read-back per step: every head's logits and V, a row per env.
        let mut columns = out.logits.clone();
        columns.push(out.value.unsqueeze(1).expect("[E] → [E, 1]"));
        self.read_back = Tensor::cat(&columns, 1)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("the logits and values read back");
        let sizes = net.shape.head_sizes();
        let width = self.offsets[7] + sizes[7] + 1;
        for (e, m) in masks.iter().enumerate() {
            let row = &self.read_back[e * width..(e + 1) * width];
            let heads: [&[f32]; 8] =
                std::array::from_fn(|h| &row[self.offsets[h]..self.offsets[h] + sizes[h]]);
            self.values[e] = row[width - 1];
            let mut stream =
                StreamKey::new(clock.seed, clock.round, e as u64, Purpose::Policy).stream(clock.epoch << 8);
            let uniforms: [f64; 8] = std::array::from_fn(|_| stream.next_f64());
            let d = draw(heads, m, uniforms, self.deterministic, &mut self.scratch);
            actions.set(e, d.action);
        }
        self.hidden = out.state;
    }
}
