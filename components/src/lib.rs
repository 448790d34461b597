//! esper-components: the world's data. ECS components and resources, the enums of the contract, and
//! the seed lifecycle rules as pure functions (transitions, gates, alpha controller, masks). No tensors,
//! no I/O.

pub mod actions;
pub mod alpha;
pub mod config;
pub mod env;
pub mod gates;
pub mod governor;
pub mod handlers;
pub mod heuristic;
pub mod host_preset;
pub mod lifecycle;
pub mod masks;
pub mod reference;
pub mod reward_config;
pub mod signals;
pub mod slot;
pub mod slot_id;
pub mod stage;

pub use actions::*;
pub use alpha::{AlphaController, AlphaCurve, AlphaMode};
pub use config::LifecycleConfig;
pub use env::{
    AUTO_PRUNE_PENALTY, EnvIndex, EpisodeReturn, FossilCounters, GAMMA, HINDSIGHT_CREDIT_WEIGHT, HostMetrics,
    LastAction, LifecycleTally, MAX_HINDSIGHT_CREDIT, MIN_CONTRIBUTING_IMPROVEMENT, PendingRewardTerms,
    ScaffoldBoost, ScaffoldLedger,
};
pub use governor::{
    BlockedFactor, GovernorConfig, GovernorState, PanicReason, PreflightRequest, RollbackReport, VitalSigns,
    preflight_lifecycle_mutation, rollback_prune_slots, rollback_prune_states,
};
pub use handlers::{
    OpOutcome, SlotFacts, action_for_reward, apply_action, handler_precondition, op_valid_for_slot,
    outcome_without_slot, slot_facts,
};
pub use heuristic::{HeuristicConfig, HeuristicDecision, HeuristicReason, HeuristicState, RunnerDifference};
pub use host_preset::{CnnHostSpec, InjectionPoint, TaskPreset};
pub use masks::{ActionMasks, MaskParams, MaskSeedInfo, compute_action_masks};
pub use reward_config::{LossRewardConfig, RewardConfig, RewardConfigError, RewardFamily, RewardMode};
pub use signals::{EpochObservation, SeedReport, SignalConfig, SignalTracker, TrainingSignals};
pub use slot::*;
pub use slot_id::{MAX_SLOTS, SlotConfig, SlotId, SlotIdError};
pub use stage::{GateLevel, SeedStage};
