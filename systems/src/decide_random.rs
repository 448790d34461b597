//! Decide (random policy): a uniformly random legal action per env from its masks — a baseline. Draws
//! come from the env's own stream `(seed, round, env, Policy)` counted by epoch.

use crate::host_resources::StepClock;
use crate::resources::{ActionBatch, MaskBatch};
use bevy_ecs::prelude::*;
use esper_components::masks::sample_masked;
use esper_kernels::rng::{Purpose, StreamKey};

pub fn decide_random(masks: Res<MaskBatch>, clock: Res<StepClock>, mut actions: ResMut<ActionBatch>) {
    for (e, m) in masks.0.iter().enumerate() {
        let mut stream =
            StreamKey::new(clock.seed, clock.round, e as u64, Purpose::Policy).stream(clock.epoch << 8);
        let action = sample_masked(m, |n| stream.below(n as u64) as usize);
        actions.set(e, action);
    }
}
