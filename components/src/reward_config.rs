//! The reward's settings (spec simic §2.1, §2.8, §2.10): the mode, the family and the fields a run may
//! change. Everything else of `ContributionRewardConfig` is a fixed constant of the reward kernel.

use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};
use std::fmt;

/// `reward_mode`: which contribution-family reward is computed (simic §2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// Attribution, PBRS, warnings, synergy, rent, alpha shock, capacity rent, action shaping, terminal.
    #[default]
    Shaped,
    /// SHAPED with the attribution paid as a change in per-slot escrow credit.
    Escrow,
    /// PBRS, a linear parameter rent, fossilize bonus and the last epoch's accuracy delta at the end.
    Basic,
    /// BASIC with 70 % of the fossilize bonus paid as a drip over the remaining epochs.
    BasicPlus,
    /// Only at the last epoch: committed accuracy minus a fossil parameter cost.
    Sparse,
    /// SPARSE plus an early-prune penalty.
    Minimal,
    /// PBRS, a per-action cost and a terminal accuracy + contributing-fossil bonus (diagnostic).
    Simplified,
}

impl RewardMode {
    pub const ALL: [RewardMode; 7] = [
        Self::Shaped,
        Self::Escrow,
        Self::Basic,
        Self::BasicPlus,
        Self::Sparse,
        Self::Minimal,
        Self::Simplified,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Shaped => "shaped",
            Self::Escrow => "escrow",
            Self::Basic => "basic",
            Self::BasicPlus => "basic_plus",
            Self::Sparse => "sparse",
            Self::Minimal => "minimal",
            Self::Simplified => "simplified",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for RewardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `reward_family`: contribution-based (the modes above) or validation-loss-based (simic §2.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardFamily {
    #[default]
    Contribution,
    Loss,
}

impl RewardFamily {
    pub fn name(self) -> &'static str {
        match self {
            Self::Contribution => "contribution",
            Self::Loss => "loss",
        }
    }
}

impl fmt::Display for RewardFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The loss family's `LossRewardConfig` (simic §2.8), CIFAR preset (every esper-ecs host is a CIFAR
/// host): `typical_loss_delta_std` 0.05, the other fields at their defaults.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossRewardConfig {
    pub loss_delta_weight: f64,
    pub max_loss_delta: f64,
    pub regression_penalty_scale: f64,
    pub typical_loss_delta_std: f64,
    pub compute_rent_weight: f64,
    pub max_rent_penalty: f64,
    pub grace_epochs: u32,
    pub stage_potential_weight: f64,
    pub baseline_loss: f64,
    pub target_loss: f64,
    pub terminal_weight: f64,
}

impl LossRewardConfig {
    /// `LossRewardConfig.for_cifar10()`.
    pub const CIFAR: LossRewardConfig = LossRewardConfig {
        loss_delta_weight: 5.0,
        max_loss_delta: 5.0,
        regression_penalty_scale: 0.5,
        typical_loss_delta_std: 0.05,
        compute_rent_weight: 0.05,
        max_rent_penalty: 5.0,
        grace_epochs: 3,
        stage_potential_weight: 0.1,
        baseline_loss: 2.3,
        target_loss: 0.3,
        terminal_weight: 1.0,
    };
}

impl Default for LossRewardConfig {
    fn default() -> Self {
        Self::CIFAR
    }
}

/// The reward settings of a run: the fields `TrainingConfig` reaches (simic §2.10) and the loss
/// family's config.
#[derive(Resource, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RewardConfig {
    pub mode: RewardMode,
    pub family: RewardFamily,
    pub disable_pbrs: bool,
    pub disable_terminal_reward: bool,
    pub disable_anti_gaming: bool,
    /// BASIC/BASIC_PLUS rent denominator and SPARSE fossil-parameter denominator.
    pub param_budget: f64,
    pub param_penalty_weight: f64,
    pub sparse_reward_scale: f64,
    /// Floor of the host parameter count in every growth ratio.
    pub rent_host_params_floor: f64,
    /// BASIC's terminal weight on the last epoch's accuracy delta.
    pub basic_acc_delta_weight: f64,
    pub loss: LossRewardConfig,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            mode: RewardMode::Shaped,
            family: RewardFamily::Contribution,
            disable_pbrs: false,
            disable_terminal_reward: false,
            disable_anti_gaming: false,
            param_budget: 500_000.0,
            param_penalty_weight: 0.1,
            sparse_reward_scale: 1.0,
            rent_host_params_floor: 200.0,
            basic_acc_delta_weight: 5.0,
            loss: LossRewardConfig::CIFAR,
        }
    }
}

/// A reward configuration the reference refuses.
#[derive(Clone, Debug, PartialEq)]
pub enum RewardConfigError {
    /// The loss family only exists with mode shaped.
    LossFamilyNeedsShaped(RewardMode),
    /// A budget or floor that divides must be positive and finite.
    NotPositive { name: &'static str, value: f64 },
    /// A weight or scale must be finite.
    NotFinite { name: &'static str, value: f64 },
}

impl fmt::Display for RewardConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LossFamilyNeedsShaped(mode) => write!(
                f,
                "--reward-family loss only works with --reward-mode shaped (got --reward-mode {mode}; \
                 config keys reward_family / reward_mode); use --reward-family contribution for the other \
                 modes"
            ),
            Self::NotPositive { name, value } => write!(f, "{name} must be a positive number (got {value})"),
            Self::NotFinite { name, value } => write!(f, "{name} must be a finite number (got {value})"),
        }
    }
}

impl std::error::Error for RewardConfigError {}

impl RewardConfig {
    /// The checks the reference makes, and the ones that keep every term finite.
    pub fn validate(&self) -> Result<(), RewardConfigError> {
        if self.family == RewardFamily::Loss && self.mode != RewardMode::Shaped {
            return Err(RewardConfigError::LossFamilyNeedsShaped(self.mode));
        }
        for (name, value) in [
            ("--param-budget (param_budget)", self.param_budget),
            ("--rent-host-params-floor (rent_host_params_floor)", self.rent_host_params_floor),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(RewardConfigError::NotPositive { name, value });
            }
        }
        for (name, value) in [
            ("--param-penalty-weight (param_penalty_weight)", self.param_penalty_weight),
            ("--sparse-reward-scale (sparse_reward_scale)", self.sparse_reward_scale),
            ("--basic-acc-delta-weight (basic_acc_delta_weight)", self.basic_acc_delta_weight),
        ] {
            if !value.is_finite() {
                return Err(RewardConfigError::NotFinite { name, value });
            }
        }
        Ok(())
    }

    /// BASIC_PLUS pays 70 % of a fossilize bonus as a drip; every other mode pays it at once
    /// (`drip_fraction` 0.0).
    pub fn drip_fraction(&self) -> f64 {
        if self.mode == RewardMode::BasicPlus && self.family == RewardFamily::Contribution {
            0.7
        } else {
            0.0
        }
    }

    /// Fossilized seeds stay in the ablation set while drip is on (simic §3.1), so their contribution
    /// keeps being measured.
    pub fn ablate_fossils(&self) -> bool {
        self.drip_fraction() > 0.0
    }
}
