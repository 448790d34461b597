//! esper-systems: the bevy_ecs systems of one step. Each reads components, calls a kernel or a pure
//! lifecycle function over SoA batches, and writes components back. One file per system.

pub mod apply_ops;
pub mod build_masks;
pub mod build_observations;
pub mod compute_rewards;
pub mod decide;
pub mod episode_end;
pub mod governor_check;
pub mod governor_rollback;
pub mod gradient_telemetry;
pub mod host_resources;
pub mod learner;
pub mod normalize_observations;
pub mod note_fossilizations;
pub mod policy;
pub mod ppo_update;
pub mod record_accuracy;
pub mod record_rollout;
pub mod record_train_metrics;
pub mod resolve_actions;
pub mod resources;
pub mod schedule;
pub mod seed_sync;
pub mod slot_query;
pub mod step_span;
pub mod tally_lifecycle;
pub mod tick;
pub mod track_actions;
pub mod train_hosts;
pub mod update_obs_normalizer;
pub mod update_signals;
pub mod validate;
pub mod world;
pub mod write_metrics;
pub mod write_trace;

pub use resources::{ActionBatch, EffectiveOps, EnvCount, MaskBatch, OpOutcomes, ParamCounts};
pub use schedule::{
    PolicySet, Step, StepSet, add_act_record_systems, add_decide_systems, add_host_systems,
    add_lifecycle_systems, add_observe_decide_systems, add_observe_systems, add_reward_systems,
    add_training_systems, empty_step_schedule,
};
pub use world::{build_world, insert_run_resources, spawn_env, spawn_slot};
