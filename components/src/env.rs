//! Per-env components: the env's row in every batch, its host metrics and lifecycle bookkeeping.

use crate::actions::LifecycleOp;
use crate::handlers::OpOutcome;
use bevy_ecs::component::Component;
use serde::{Deserialize, Serialize};

/// The env's row in every batch (`[E, …]` buffers). Slot entities carry it too, so systems can scatter
/// a slot's values into `[E, S]` arrays without a lookup.
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EnvIndex(pub u32);

/// The env's latest validation result (accuracy in pp, 0–100).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostMetrics {
    pub val_accuracy: f64,
    pub val_loss: f64,
    /// Mean of the epoch's batch-mean training losses.
    pub train_loss: f64,
    /// Training accuracy over the epoch's samples, in pp.
    pub train_accuracy: f64,
}

/// Lifecycle counts over the episode and the last op's result.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleTally {
    pub germinated: u32,
    pub fossilized: u32,
    pub pruned: u32,
    pub failed_ops: u32,
    /// Governor rollbacks.
    pub rollbacks: u32,
    /// Mutations the governor's preflight refused.
    pub vetoed: u32,
    pub last_op: LifecycleOp,
    pub last_outcome: OpOutcome,
}
