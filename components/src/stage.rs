//! Seed stages, the ordered transition table and gate levels (spec kasmina §1, §3.2).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The lifecycle stage of a seed. The integer values are part of the contract (observations, traces);
/// 5 (the retired SHADOWING) is reserved and rejected by every conversion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
pub enum SeedStage {
    /// Sentinel: "no previous stage".
    Unknown = 0,
    /// Empty slot. The reference never stores DORMANT as a live state after germination (kasmina §1.4),
    /// so in esper-ecs a slot whose stage is `Dormant` is exactly an empty slot (`state == None`).
    #[default]
    Dormant = 1,
    Germinated = 2,
    Training = 3,
    Blending = 4,
    Holding = 6,
    Fossilized = 7,
    Pruned = 8,
    Embargoed = 9,
    Resetting = 10,
}

/// A stage value that is not in the contract (5, or out of range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidStage(pub u8);

impl fmt::Display for InvalidStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 5 {
            write!(f, "seed stage 5 (SHADOWING) is retired and must be rejected")
        } else {
            write!(f, "seed stage {} is not a valid stage", self.0)
        }
    }
}

impl std::error::Error for InvalidStage {}

impl TryFrom<u8> for SeedStage {
    type Error = InvalidStage;
    fn try_from(v: u8) -> Result<Self, InvalidStage> {
        use SeedStage::*;
        Ok(match v {
            0 => Unknown,
            1 => Dormant,
            2 => Germinated,
            3 => Training,
            4 => Blending,
            6 => Holding,
            7 => Fossilized,
            8 => Pruned,
            9 => Embargoed,
            10 => Resetting,
            other => return Err(InvalidStage(other)),
        })
    }
}

impl SeedStage {
    /// Every valid stage, in contract-value order.
    pub const ALL: [SeedStage; 10] = [
        SeedStage::Unknown,
        SeedStage::Dormant,
        SeedStage::Germinated,
        SeedStage::Training,
        SeedStage::Blending,
        SeedStage::Holding,
        SeedStage::Fossilized,
        SeedStage::Pruned,
        SeedStage::Embargoed,
        SeedStage::Resetting,
    ];

    pub fn value(self) -> u8 {
        self as u8
    }

    /// Contiguous one-hot index (schema version 1): values 0–4 keep their index, 6–10 shift down by one.
    pub fn feature_index(self) -> usize {
        let v = self as usize;
        if v < 5 { v } else { v - 1 }
    }

    /// Allowed next stages, in the order of the reference table (order matters: `advance_stage` picks
    /// the first non-failure entry).
    pub fn allowed_next(self) -> &'static [SeedStage] {
        use SeedStage::*;
        match self {
            Unknown => &[Dormant],
            Dormant => &[Germinated],
            Germinated => &[Training, Pruned],
            Training => &[Blending, Pruned],
            Blending => &[Holding, Pruned],
            Holding => &[Fossilized, Blending, Pruned],
            Fossilized => &[],
            Pruned => &[Embargoed],
            Embargoed => &[Resetting],
            Resetting => &[Dormant],
        }
    }

    pub fn can_transition_to(self, next: SeedStage) -> bool {
        self.allowed_next().contains(&next)
    }

    /// The target of `advance_stage()` without an explicit target: the first non-failure entry.
    pub fn next_success_stage(self) -> Option<SeedStage> {
        self.allowed_next().iter().copied().find(|s| !s.is_failure())
    }

    /// Seed participates in the forward pass.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Training | Self::Blending | Self::Holding | Self::Fossilized)
    }

    pub fn is_terminal(self) -> bool {
        self == Self::Fossilized
    }

    pub fn is_failure(self) -> bool {
        matches!(self, Self::Pruned | Self::Embargoed | Self::Resetting)
    }

    /// Blocks GERMINATE anywhere in the env (sequential development; kasmina §1.3).
    pub fn is_developing(self) -> bool {
        matches!(self, Self::Germinated | Self::Training | Self::Pruned | Self::Embargoed | Self::Resetting)
    }

    /// The slot holds a seed module (GERMINATED..FOSSILIZED). Cooldown stages keep only the state.
    pub fn has_seed(self) -> bool {
        matches!(self, Self::Germinated | Self::Training | Self::Blending | Self::Holding | Self::Fossilized)
    }

    /// The slot holds a `SeedState` (anything but empty).
    pub fn has_state(self) -> bool {
        !matches!(self, Self::Dormant | Self::Unknown)
    }

    /// Stages a PRUNE can start from.
    pub fn is_prunable(self) -> bool {
        matches!(self, Self::Germinated | Self::Training | Self::Blending | Self::Holding)
    }

    pub fn name(self) -> &'static str {
        use SeedStage::*;
        match self {
            Unknown => "UNKNOWN",
            Dormant => "DORMANT",
            Germinated => "GERMINATED",
            Training => "TRAINING",
            Blending => "BLENDING",
            Holding => "HOLDING",
            Fossilized => "FOSSILIZED",
            Pruned => "PRUNED",
            Embargoed => "EMBARGOED",
            Resetting => "RESETTING",
        }
    }
}

impl fmt::Display for SeedStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Quality gate levels (values 0, 1, 2, 3, 5; 4 is retired and rejected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum GateLevel {
    G0 = 0,
    G1 = 1,
    G2 = 2,
    G3 = 3,
    G5 = 5,
}

impl TryFrom<u8> for GateLevel {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        match v {
            0 => Ok(Self::G0),
            1 => Ok(Self::G1),
            2 => Ok(Self::G2),
            3 => Ok(Self::G3),
            5 => Ok(Self::G5),
            4 => Err("gate level 4 (G4) is retired and must be rejected".into()),
            other => Err(format!("gate level {other} is not a valid gate")),
        }
    }
}

impl GateLevel {
    /// The gate guarding entry into `target` (kasmina §3.2). Any other target has no gate.
    pub fn for_target(target: SeedStage) -> Option<GateLevel> {
        match target {
            SeedStage::Germinated => Some(Self::G0),
            SeedStage::Training => Some(Self::G1),
            SeedStage::Blending => Some(Self::G2),
            SeedStage::Holding => Some(Self::G3),
            SeedStage::Fossilized => Some(Self::G5),
            _ => None,
        }
    }
}
