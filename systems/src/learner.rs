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
use esper_kernels::policy::sampler::{Draw, DrawScratch, draw};
use esper_kernels::rng::{Purpose, StreamKey};

#[derive(Resource)]
pub struct Learner {
    pub agent: PpoAgent,
    /// Take each head's most probable legal choice instead of sampling (`--deterministic`).
    pub deterministic: bool,
    /// `[E, H]` the LSTM state each env's next decision starts from.
    pub hidden: Recurrent,
    /// `[E]` this step's draws (action, per-head log-prob and entropy) and V(s) on the critic's scale.
    pub draws: Vec<Draw>,
    pub values: Vec<f32>,
    /// The learner made this step's decision (a test may install a scripted policy over it).
    pub decided: bool,
    /// What the last round's update reported (None before the first, or when it was skipped).
    pub last_update: Option<UpdateMetrics>,
    scratch: DrawScratch,
}

/// The round's transitions, present only while the policy learns (not under `--eval`).
#[derive(Resource)]
pub struct Rollout(pub RolloutBuffer);

impl Learner {
    pub fn new(agent: PpoAgent, n_envs: usize, deterministic: bool) -> candle_core::Result<Self> {
        let hidden = Recurrent::zeros(n_envs, agent.net.shape.hidden, DType::F32, &agent.device)?;
        Ok(Self {
            agent,
            deterministic,
            hidden,
            draws: vec![Draw::default(); n_envs],
            values: vec![0.0; n_envs],
            decided: false,
            last_update: None,
            scratch: DrawScratch::default(),
        })
    }

    /// A fresh zero state for every env (round start).
    pub fn reset_hidden(&mut self) {
        let n = self.draws.len();
        self.hidden = Recurrent::zeros(n, self.agent.net.shape.hidden, DType::F32, &self.agent.device)
            .expect("zeros of the state's own shape");
    }

    /// Zero the state of the envs where `zero[e]` holds (a rollback).
    pub fn zero_hidden_where(&mut self, zero: &[bool]) {
        if !zero.iter().any(|&z| z) {
            return;
        }
        let keep: Vec<f32> = zero.iter().map(|&z| if z { 0.0 } else { 1.0 }).collect();
        let keep = Tensor::from_vec(keep, (zero.len(), 1), &self.agent.device).expect("an [E, 1] mask");
        let h = self.hidden.h.broadcast_mul(&keep).expect("[E, H] × [E, 1]");
        let c = self.hidden.c.broadcast_mul(&keep).expect("[E, H] × [E, 1]");
        self.hidden = Recurrent { h, c };
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
        // One read-back of every head's logits and one of the values.
        let logits: Vec<f32> = Tensor::cat(&out.logits, 1)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("the logits read back");
        self.values = out.value.to_vec1().expect("the values read back");
        let sizes = net.shape.head_sizes();
        let width: usize = sizes.iter().sum();
        let mut offsets = [0usize; 8];
        for h in 1..8 {
            offsets[h] = offsets[h - 1] + sizes[h - 1];
        }
        for (e, m) in masks.iter().enumerate() {
            let row = &logits[e * width..(e + 1) * width];
            let heads: [&[f32]; 8] = std::array::from_fn(|h| &row[offsets[h]..offsets[h] + sizes[h]]);
            let mut stream =
                StreamKey::new(clock.seed, clock.round, e as u64, Purpose::Policy).stream(clock.epoch << 8);
            let uniforms: [f64; 8] = std::array::from_fn(|_| stream.next_f64());
            let d = draw(heads, m, uniforms, self.deterministic, &mut self.scratch);
            actions.set(e, d.action);
            self.draws[e] = d;
        }
        self.hidden = out.state;
        self.decided = true;
    }
}
