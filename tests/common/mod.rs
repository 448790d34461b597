//! Shared setup of the app's integration tests (each test file uses a part of it).
#![allow(dead_code)]

use bevy_ecs::prelude::*;
use esper_components::{
    ActionMasks, AlphaAlgorithm, AlphaController, BlendId, BlendStyle, Blueprint, BlueprintAction, EnvIndex,
    FactoredAction, HostMetrics, LifecycleOp, SeedAlpha, SeedStage, SlotEvents, SlotFlags, SlotIndex,
    SlotState, Stage, StageCounters,
};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_kernels::host::{CpuHostBackend, HostBackend};
use esper_systems::ActionBatch;
use esper_systems::host_resources::{Hosts, StepClock};
use esper_systems::policy::{Observations, Policy};
use esper_systems::slot_query::SlotLifecycle;

/// A seed at `stage` with ADD blending held at `alpha` (controller at rest), 10 epochs old, as if it
/// had come there through the lifecycle. Written into a slot with a germination event, the kernels
/// give it a freshly born module at the next TrainHosts.
pub fn seed_at(stage: SeedStage, blueprint: BlueprintAction, alpha: f64) -> SlotState {
    SlotState {
        stage: Stage { current: stage, previous: SeedStage::Training, previous_epochs_in_stage: 3 },
        counters: StageCounters { epochs_total: 10, epochs_in_stage: 2 },
        blueprint: Blueprint(blueprint),
        blend: BlendStyle {
            blend: BlendId::Linear,
            algorithm: AlphaAlgorithm::Add,
            alpha_target: alpha,
            has_gate: false,
        },
        alpha: SeedAlpha(alpha),
        controller: AlphaController::holding_at(alpha),
        flags: SlotFlags { isolate_gradients: true, blend_out_frozen: false },
        ..SlotState::default()
    }
}

/// Plays a fixed script: `(epoch, env) → action`; WAIT otherwise.
pub struct Script(pub Vec<(u64, usize, FactoredAction)>);

impl Policy for Script {
    fn decide(&mut self, obs: &Observations, _masks: &[ActionMasks], actions: &mut ActionBatch) {
        for e in 0..obs.n_envs() {
            let scripted = self.0.iter().find(|(t, env, _)| *t == obs.clock.epoch && *env == e);
            actions.set(e, scripted.map_or(FactoredAction::wait(), |(_, _, a)| *a));
        }
    }
    fn reset(&mut self) {}
    fn name(&self) -> &'static str {
        "script"
    }
}

pub fn germinate(slot: u8, blueprint: BlueprintAction) -> FactoredAction {
    FactoredAction {
        slot,
        blueprint: blueprint as u8,
        op: LifecycleOp::Germinate as u8,
        ..FactoredAction::wait()
    }
}

pub fn op(op: LifecycleOp, slot: u8) -> FactoredAction {
    FactoredAction { slot, op: op as u8, ..FactoredAction::wait() }
}

pub fn env_row<T: Copy, C: Component + Copy>(world: &mut World, env: usize, f: impl Fn(&C) -> T) -> T {
    let mut q = world.query::<(&EnvIndex, &C)>();
    q.iter(world).find(|(e, _)| e.0 as usize == env).map(|(_, c)| f(c)).unwrap()
}

pub fn slot_state(world: &mut World, env: usize, slot: u8) -> SlotState {
    let mut q = world.query::<(&EnvIndex, &SlotIndex, SlotLifecycle)>();
    let (_, _, mut s) = q.iter_mut(world).find(|(e, i, _)| e.0 as usize == env && i.0 == slot).unwrap();
    s.view().snapshot()
}

pub fn slot_component<C: Component + Copy>(world: &mut World, env: usize, slot: u8) -> C {
    let mut q = world.query::<(&EnvIndex, &SlotIndex, &C)>();
    *q.iter(world).find(|(e, i, _)| e.0 as usize == env && i.0 == slot).unwrap().2
}

/// Put a seed into env `env`'s slot `slot` at `stage` (alpha and controller to match) and let the
/// kernels give it a freshly born module at the next TrainHosts.
pub fn force_seed(
    world: &mut World,
    env: usize,
    slot: u8,
    stage: SeedStage,
    blueprint: BlueprintAction,
    alpha: f64,
) {
    let s = seed_at(stage, blueprint, alpha);
    let mut q = world.query::<(&EnvIndex, &SlotIndex, &mut SlotEvents, SlotLifecycle)>();
    let (_, _, mut events, mut view) =
        q.iter_mut(world).find(|(e, i, ..)| e.0 as usize == env && i.0 == slot).unwrap();
    view.view().write(&s);
    *events = SlotEvents { germinated: true, ..SlotEvents::default() };
}

/// A fault: at `epoch`, env `env`'s validation reports these values (written after Validate).
#[derive(Resource, Clone, Copy)]
pub struct ValidationFault {
    pub epoch: u64,
    pub env: usize,
    pub val_loss: Option<f64>,
    pub val_accuracy: Option<f64>,
}

pub fn inject_validation_fault(
    fault: Option<Res<ValidationFault>>,
    clock: Res<StepClock>,
    mut envs: Query<(&EnvIndex, &mut HostMetrics)>,
) {
    let Some(f) = fault else { return };
    if clock.epoch != f.epoch {
        return;
    }
    for (env, mut m) in &mut envs {
        if env.0 as usize == f.env {
            m.val_loss = f.val_loss.unwrap_or(m.val_loss);
            m.val_accuracy = f.val_accuracy.unwrap_or(m.val_accuracy);
        }
    }
}

/// Replaces `world`'s hosts with `wrap` of a fresh CPU backend made as the run makes its own (the
/// same arch, slots, env count, batch and seed, round 0): a test double that wraps the CPU backend runs
/// the schedule with the same numbers.
pub fn install_cpu_double<B: HostBackend>(
    world: &mut World,
    plan: &RunPlan,
    wrap: impl FnOnce(CpuHostBackend) -> B,
) {
    let (arch, slot_ids) = {
        let hosts = world.resource::<Hosts>();
        (hosts.arch(), hosts.slot_ids().to_vec())
    };
    let config = &plan.config;
    let cpu = CpuHostBackend::new(arch, &slot_ids, config.envs, config.batch_per_env, config.seed, 0);
    world.insert_resource(Hosts::from(wrap(cpu)));
}

/// A tiny run in `dir` for the tests that drive the schedule by hand: 2 envs, 3 epochs, batches of 16
/// from 32 synthetic training and 16 test images per env, the static policy; `edit` changes the rest.
pub fn tiny_plan(dir: &std::path::Path, edit: impl FnOnce(&mut RunConfig)) -> RunPlan {
    let mut config = RunConfig {
        envs: 2,
        epochs: 3,
        policy: PolicyKind::Static,
        batch_per_env: 16,
        synthetic_train_per_env: 32,
        synthetic_test_per_env: 16,
        ..RunConfig::default()
    };
    edit(&mut config);
    config.plan_in(dir.to_path_buf(), true).expect("a valid tiny config")
}
