//! Lifecycle configuration shared by every env of a run.

use crate::actions::Topology;
use crate::masks::MaskParams;
use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};

/// How gates are evaluated and which transitions the tick may take on its own (spec kasmina §2.1, §3.2).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleConfig {
    pub topology: Topology,
    /// Permissive gates: the default for every task model in the reference RL loop.
    pub permissive_gates: bool,
    /// Let the tick advance GERMINATED→TRAINING on its own (G1). Off by default.
    pub auto_forward_g1: bool,
    /// Let the tick advance TRAINING→BLENDING on its own once eics ≥ 10 (G2). Off by default.
    pub auto_forward_g2: bool,
    /// Let the tick advance BLENDING→HOLDING on its own when the ramp ends (G3). Off by default.
    pub auto_forward_g3: bool,
    /// 0 = unlimited.
    pub max_seeds: u32,
    /// PRUNE mask ignores the controller mode (governor use only; off by default).
    pub allow_governor_override: bool,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            topology: Topology::Cnn,
            permissive_gates: true,
            auto_forward_g1: false,
            auto_forward_g2: false,
            auto_forward_g3: false,
            max_seeds: 0,
            allow_governor_override: false,
        }
    }
}

impl LifecycleConfig {
    /// ADVANCE is masked out entirely only when all three auto-forward gates are on.
    pub fn disable_advance(&self) -> bool {
        self.auto_forward_g1 && self.auto_forward_g2 && self.auto_forward_g3
    }

    /// The env-wide inputs of the action masks this configuration implies.
    pub fn mask_params(&self) -> MaskParams {
        MaskParams {
            topology: self.topology,
            max_seeds: self.max_seeds,
            allow_governor_override: self.allow_governor_override,
            disable_advance: self.disable_advance(),
        }
    }
}
