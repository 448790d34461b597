//! Building the world: one entity per env and one per (env, slot), plus the run's batch resources.

use crate::build_observations::ObsBatch;
use crate::compute_rewards::{RewardBatch, SharedRewardNormalizer};
use crate::governor_check::GovernorVerdict;
use crate::host_resources::StepClock;
use crate::normalize_observations::ObsNormalization;
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, MaskBatch, OpOutcomes, ParamCounts};
use crate::write_metrics::MetricsSink;
use bevy_ecs::prelude::*;
use esper_components::governor::GovernorState;
use esper_components::masks::compute_action_masks;
use esper_components::{
    EnvIndex, EpisodeReturn, FossilCounters, FossilSnapshot, HostMetrics, LastAction, LifecycleConfig,
    LifecycleOp, LifecycleTally, OpOutcome, PendingRewardTerms, RewardConfig, ScaffoldLedger, SlotConfig,
    SlotEvents, SlotIndex, SlotOf, SlotRewardState, SlotState, SlotTracking,
};
use esper_kernels::observation::obs_dim;

/// Insert the run's configuration, a [`StepClock`] at step 0, the `[E]`-shaped batch resources, the
/// default reward settings with a fresh shared normaliser, the observation buffers with a fresh
/// observation normaliser, and a metrics sink that discards its lines
/// (the app points it at `metrics.jsonl` and inserts the run's reward settings).
pub fn insert_run_resources(world: &mut World, n_envs: usize, slots: SlotConfig, config: LifecycleConfig) {
    let empty_masks = compute_action_masks(&vec![None; slots.len()], 0, &config.mask_params());
    world.insert_resource(EnvCount(n_envs));
    world.insert_resource(StepClock::default());
    world.insert_resource(ActionBatch::new(n_envs));
    world.insert_resource(MaskBatch(vec![empty_masks; n_envs]));
    world.insert_resource(EffectiveOps(vec![LifecycleOp::Wait; n_envs]));
    world.insert_resource(OpOutcomes(vec![OpOutcome::Executed; n_envs]));
    world.insert_resource(ParamCounts::default());
    world.insert_resource(RewardConfig::default());
    world.insert_resource(RewardBatch::default());
    world.insert_resource(SharedRewardNormalizer::default());
    world.insert_resource(ObsBatch::new(n_envs, slots.len()));
    world.insert_resource(ObsNormalization::new(obs_dim(slots.len())));
    world.insert_resource(MetricsSink::new(Box::new(std::io::sink()), &slots));
    world.insert_resource(slots);
    world.insert_resource(config);
}

/// Spawn env `env`'s entity (no slots) with its metrics, governor and episode bookkeeping. Its scaffold
/// ledger starts empty with room for `ledger_capacity` entries (see
/// [`ScaffoldLedger::episode_capacity`]), so that a run never grows it.
pub fn spawn_env(world: &mut World, env: u32, ledger_capacity: usize) -> Entity {
    world
        .spawn((
            (EnvIndex(env), HostMetrics::default(), LifecycleTally::default()),
            (GovernorState::default(), GovernorVerdict::default()),
            (LastAction::default(), FossilCounters::default(), PendingRewardTerms::default()),
            EpisodeReturn::default(),
            ScaffoldLedger::with_capacity(ledger_capacity),
        ))
        .id()
}

/// Spawn the empty slot `slot` (canonical index) of env `env`.
pub fn spawn_slot(world: &mut World, env_entity: Entity, env: u32, slot: u8) -> Entity {
    let s = SlotState::default();
    world
        .spawn((
            (SlotOf(env_entity), EnvIndex(env), SlotIndex(slot), SlotEvents::default()),
            (SlotTracking::default(), FossilSnapshot::default(), SlotRewardState::default()),
            (s.stage, s.counters, s.metrics, s.telemetry, s.alpha, s.controller),
            (s.blend, s.tempo, s.blueprint, s.pending_prune, s.flags),
        ))
        .id()
}

/// A world of `n_envs` envs with every slot of `slots`, spawned in env order.
pub fn build_world(n_envs: usize, slots: SlotConfig, config: LifecycleConfig) -> World {
    let mut world = World::new();
    let n_slots = slots.len();
    insert_run_resources(&mut world, n_envs, slots, config);
    for e in 0..n_envs as u32 {
        let env = spawn_env(&mut world, e, 0);
        for s in 0..n_slots as u8 {
            spawn_slot(&mut world, env, e, s);
        }
    }
    world
}
