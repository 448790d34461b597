//! The learned policy on CPU, with the reference's network (LSTM 512, heads 256, 3 slots):
//! - `policy_step/E` (E = 16, 256): one Decide — the batched forward for all envs, one read-back of
//!   the logits and values, and every env's masked, floored draw ([`Learner::decide`], the system's
//!   own code);
//! - `ppo_update/E` (E = 16, 256): one PPO update (K = 1) on a full round of 25 steps per env,
//!   collected by the same learner from random observations and masks: GAE, the full-sequence pass
//!   with autograd through the LSTM, backward, clip, Adam.
//!
//! `cargo bench --bench policy_step`. Compare `policy_step/16` with `host_step`'s `train_seeded/16`
//! (one host training step of 16 envs) for the policy's share of a step.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use esper_components::masks::{MaskParams, compute_action_masks};
use esper_components::{ActionMasks, Topology};
use esper_kernels::policy::network::PolicyShape;
use esper_kernels::policy::ppo::{PpoAgent, PpoConfig};
use esper_kernels::policy::rollout::{RolloutBuffer, StepRow};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_systems::ActionBatch;
use esper_systems::host_resources::StepClock;
use esper_systems::learner::Learner;
use std::time::Duration;

const SLOTS: usize = 3;
const STEPS: usize = 25;

fn inputs(envs: usize, seed: u64) -> (Vec<f32>, Vec<i64>, Vec<ActionMasks>) {
    let shape = PolicyShape::reference(SLOTS);
    let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
    let obs = (0..envs * shape.obs_dim).map(|_| s.normal() as f32).collect();
    let blueprints = (0..envs * SLOTS).map(|_| s.below(14) as i64 - 1).collect();
    let params = MaskParams {
        topology: Topology::Cnn,
        max_seeds: 3,
        allow_governor_override: false,
        disable_advance: false,
    };
    let masks = (0..envs).map(|_| compute_action_masks(&[None, None, None], 0, &params)).collect();
    (obs, blueprints, masks)
}

fn learner(envs: usize) -> Learner {
    let agent =
        PpoAgent::new(PolicyShape::reference(SLOTS), 0, PpoConfig::default(), &candle_core::Device::Cpu)
            .expect("a fresh agent");
    Learner::new(agent, envs, false).expect("a learner")
}

fn clock(epoch: u64) -> StepClock {
    StepClock { seed: 0, round: 0, epoch, step: epoch, episode_epochs: STEPS as u64 }
}

fn policy_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("policy_step");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    for envs in [16, 256] {
        let mut learner = learner(envs);
        let (obs, blueprints, masks) = inputs(envs, 1);
        let mut actions = ActionBatch::new(envs);
        group.bench_function(BenchmarkId::from_parameter(envs), |b| {
            b.iter(|| {
                learner.reset_hidden();
                learner.decide(&obs, &blueprints, &masks, clock(1), &mut actions);
            })
        });
    }
    group.finish();
}

fn ppo_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("ppo_update");
    group.sample_size(10).measurement_time(Duration::from_secs(20));
    for envs in [16, 256] {
        let mut learner = learner(envs);
        let mut buffer = RolloutBuffer::new(envs, STEPS, PolicyShape::reference(SLOTS).obs_dim, SLOTS);
        let mut actions = ActionBatch::new(envs);
        for t in 0..STEPS {
            let (obs, blueprints, masks) = inputs(envs, t as u64);
            learner.decide(&obs, &blueprints, &masks, clock(t as u64 + 1), &mut actions);
            let d = PolicyShape::reference(SLOTS).obs_dim;
            for e in 0..envs {
                let action = actions.get(e);
                buffer.push(
                    e,
                    StepRow {
                        state: &obs[e * d..(e + 1) * d],
                        blueprints: &blueprints[e * SLOTS..(e + 1) * SLOTS],
                        action,
                        effective_op: esper_components::LifecycleOp::from_index(action.op).expect("an op"),
                        value: learner.values[e],
                        reward: ((e + t) % 3) as f32 - 1.0,
                        truncated: t + 1 == STEPS,
                        masks: &masks[e],
                        contribution_targets: &[None; SLOTS],
                    },
                );
            }
        }
        group.bench_function(BenchmarkId::from_parameter(envs), |b| {
            b.iter(|| learner.agent.update(&buffer).expect("an update"))
        });
    }
    group.finish();
}

criterion_group!(benches, policy_step, ppo_update);
criterion_main!(benches);
