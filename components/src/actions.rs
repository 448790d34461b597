//! The factored action space (spec tamiyo §2, kasmina §3.6): one enum per head with its contract integer
//! values, what each value means to the lifecycle, and the causal relevance of heads per op.

use crate::alpha::AlphaCurve;
use serde::{Deserialize, Serialize};

/// Host topology; decides the blueprint family and the isolation policy after BLENDING.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Topology {
    #[default]
    Cnn,
    Transformer,
}

/// Lifecycle op head (value order = network output order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
pub enum LifecycleOp {
    #[default]
    Wait = 0,
    Germinate = 1,
    SetAlphaTarget = 2,
    Prune = 3,
    Fossilize = 4,
    Advance = 5,
}

impl LifecycleOp {
    pub const COUNT: usize = 6;
    pub const ALL: [LifecycleOp; 6] =
        [Self::Wait, Self::Germinate, Self::SetAlphaTarget, Self::Prune, Self::Fossilize, Self::Advance];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Wait => "WAIT",
            Self::Germinate => "GERMINATE",
            Self::SetAlphaTarget => "SET_ALPHA_TARGET",
            Self::Prune => "PRUNE",
            Self::Fossilize => "FOSSILIZE",
            Self::Advance => "ADVANCE",
        }
    }
}

/// Blueprint head (13 values shared by both topologies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
pub enum BlueprintAction {
    #[default]
    Noop = 0,
    ConvLight = 1,
    Attention = 2,
    Norm = 3,
    Depthwise = 4,
    Bottleneck = 5,
    ConvSmall = 6,
    ConvHeavy = 7,
    Lora = 8,
    LoraLarge = 9,
    MlpSmall = 10,
    Mlp = 11,
    FlexAttention = 12,
}

impl BlueprintAction {
    pub const COUNT: usize = 13;
    pub const ALL: [BlueprintAction; 13] = [
        Self::Noop,
        Self::ConvLight,
        Self::Attention,
        Self::Norm,
        Self::Depthwise,
        Self::Bottleneck,
        Self::ConvSmall,
        Self::ConvHeavy,
        Self::Lora,
        Self::LoraLarge,
        Self::MlpSmall,
        Self::Mlp,
        Self::FlexAttention,
    ];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    /// Registry id (`BLUEPRINT_IDS[value]`).
    pub fn id(self) -> &'static str {
        match self {
            Self::Noop => "noop",
            Self::ConvLight => "conv_light",
            Self::Attention => "attention",
            Self::Norm => "norm",
            Self::Depthwise => "depthwise",
            Self::Bottleneck => "bottleneck",
            Self::ConvSmall => "conv_small",
            Self::ConvHeavy => "conv_heavy",
            Self::Lora => "lora",
            Self::LoraLarge => "lora_large",
            Self::MlpSmall => "mlp_small",
            Self::Mlp => "mlp",
            Self::FlexAttention => "flex_attention",
        }
    }

    /// The topology's blueprint set (NOOP is in both; the mask always removes it).
    pub fn in_topology(self, topology: Topology) -> bool {
        let v = self as u8;
        match topology {
            Topology::Cnn => v <= 7,
            Topology::Transformer => matches!(v, 0 | 2 | 3 | 8..=12),
        }
    }
}

/// Blend id stored at germination: chooses the BLENDING curve (kasmina §4.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlendId {
    Linear,
    #[default]
    Sigmoid,
    Gated,
}

impl BlendId {
    /// Curve of the germination ramp started at TRAINING→BLENDING: "gated" is a LINEAR amplitude ramp.
    pub fn ramp_curve(self) -> AlphaCurve {
        match self {
            Self::Linear | Self::Gated => AlphaCurve::Linear,
            Self::Sigmoid => AlphaCurve::Sigmoid,
        }
    }
}

/// How the seed output is composed with the host (kasmina §4.3). Values are the contract ints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaAlgorithm {
    #[default]
    Add = 1,
    Multiply = 2,
    Gate = 3,
}

/// Style head: (blend id, alpha algorithm).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum GerminationStyle {
    LinearAdd = 0,
    LinearMultiply = 1,
    #[default]
    SigmoidAdd = 2,
    GatedGate = 3,
}

impl GerminationStyle {
    pub const COUNT: usize = 4;
    pub const ALL: [GerminationStyle; 4] =
        [Self::LinearAdd, Self::LinearMultiply, Self::SigmoidAdd, Self::GatedGate];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn blend_and_algorithm(self) -> (BlendId, AlphaAlgorithm) {
        match self {
            Self::LinearAdd => (BlendId::Linear, AlphaAlgorithm::Add),
            Self::LinearMultiply => (BlendId::Linear, AlphaAlgorithm::Multiply),
            Self::SigmoidAdd => (BlendId::Sigmoid, AlphaAlgorithm::Add),
            Self::GatedGate => (BlendId::Gated, AlphaAlgorithm::Gate),
        }
    }
}

/// Tempo head: blend ramp length fixed at germination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum TempoAction {
    Fast = 0,
    #[default]
    Standard = 1,
    Slow = 2,
}

impl TempoAction {
    pub const COUNT: usize = 3;
    pub const ALL: [TempoAction; 3] = [Self::Fast, Self::Standard, Self::Slow];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn epochs(self) -> u32 {
        match self {
            Self::Fast => 3,
            Self::Standard => 5,
            Self::Slow => 8,
        }
    }
}

/// Alpha-target head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaTargetAction {
    Half = 0,
    Seventy = 1,
    #[default]
    Full = 2,
}

impl AlphaTargetAction {
    pub const COUNT: usize = 3;
    pub const ALL: [AlphaTargetAction; 3] = [Self::Half, Self::Seventy, Self::Full];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn value(self) -> f64 {
        match self {
            Self::Half => 0.5,
            Self::Seventy => 0.7,
            Self::Full => 1.0,
        }
    }
}

/// Alpha-speed head: controller steps of a retarget or a prune ramp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaSpeedAction {
    #[default]
    Instant = 0,
    Fast = 1,
    Medium = 2,
    Slow = 3,
}

impl AlphaSpeedAction {
    pub const COUNT: usize = 4;
    pub const ALL: [AlphaSpeedAction; 4] = [Self::Instant, Self::Fast, Self::Medium, Self::Slow];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn steps(self) -> u32 {
        match self {
            Self::Instant => 0,
            Self::Fast => 3,
            Self::Medium => 5,
            Self::Slow => 8,
        }
    }
}

/// Alpha-curve head: (curve, steepness). Steepness only matters for SIGMOID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum AlphaCurveAction {
    #[default]
    Linear = 0,
    Cosine = 1,
    SigmoidGentle = 2,
    Sigmoid = 3,
    SigmoidSharp = 4,
}

impl AlphaCurveAction {
    pub const COUNT: usize = 5;
    pub const ALL: [AlphaCurveAction; 5] =
        [Self::Linear, Self::Cosine, Self::SigmoidGentle, Self::Sigmoid, Self::SigmoidSharp];

    pub fn from_index(i: u8) -> Option<Self> {
        Self::ALL.get(i as usize).copied()
    }

    pub fn curve_and_steepness(self) -> (AlphaCurve, f64) {
        match self {
            Self::Linear => (AlphaCurve::Linear, 12.0),
            Self::Cosine => (AlphaCurve::Cosine, 12.0),
            Self::SigmoidGentle => (AlphaCurve::Sigmoid, 6.0),
            Self::Sigmoid => (AlphaCurve::Sigmoid, 12.0),
            Self::SigmoidSharp => (AlphaCurve::Sigmoid, 24.0),
        }
    }
}

/// The eight action heads, in `HEAD_NAMES` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum Head {
    Slot = 0,
    Blueprint = 1,
    Style = 2,
    Tempo = 3,
    AlphaTarget = 4,
    AlphaSpeed = 5,
    AlphaCurve = 6,
    Op = 7,
}

impl Head {
    pub const COUNT: usize = 8;
    pub const ALL: [Head; 8] = [
        Self::Slot,
        Self::Blueprint,
        Self::Style,
        Self::Tempo,
        Self::AlphaTarget,
        Self::AlphaSpeed,
        Self::AlphaCurve,
        Self::Op,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Slot => "slot",
            Self::Blueprint => "blueprint",
            Self::Style => "style",
            Self::Tempo => "tempo",
            Self::AlphaTarget => "alpha_target",
            Self::AlphaSpeed => "alpha_speed",
            Self::AlphaCurve => "alpha_curve",
            Self::Op => "op",
        }
    }

    /// Head size; the slot head's size is the number of enabled slots.
    pub fn size(self, n_slots: usize) -> usize {
        match self {
            Self::Slot => n_slots,
            Self::Blueprint => BlueprintAction::COUNT,
            Self::Style => GerminationStyle::COUNT,
            Self::Tempo => TempoAction::COUNT,
            Self::AlphaTarget => AlphaTargetAction::COUNT,
            Self::AlphaSpeed => AlphaSpeedAction::COUNT,
            Self::AlphaCurve => AlphaCurveAction::COUNT,
            Self::Op => LifecycleOp::COUNT,
        }
    }

    /// Canonical placeholder index for a head the chosen op does not consume (tamiyo §2.2). The slot
    /// head's placeholder depends on the masks (first legal slot), so it is not a constant: `None`.
    pub fn placeholder(self) -> Option<u8> {
        match self {
            Self::Slot | Self::Op => None,
            Self::Blueprint => Some(BlueprintAction::Noop as u8),
            Self::Style => Some(GerminationStyle::SigmoidAdd as u8),
            Self::Tempo => Some(TempoAction::Standard as u8),
            Self::AlphaTarget => Some(AlphaTargetAction::Full as u8),
            Self::AlphaSpeed => Some(AlphaSpeedAction::Instant as u8),
            Self::AlphaCurve => Some(AlphaCurveAction::Linear as u8),
        }
    }
}

/// Which heads `op` actually consumes (tamiyo §2.1), indexed by `Head as usize`. The op head is always
/// relevant.
pub fn relevant_heads(op: LifecycleOp) -> [bool; Head::COUNT] {
    use LifecycleOp::*;
    let germinate = op == Germinate;
    let retarget = op == SetAlphaTarget;
    let prune = op == Prune;
    [
        op != Wait,            // slot
        germinate,             // blueprint
        germinate || retarget, // style
        germinate,             // tempo
        germinate || retarget, // alpha_target
        retarget || prune,     // alpha_speed
        retarget || prune,     // alpha_curve
        true,                  // op
    ]
}

/// One env's decision: one index per head, exactly as a policy samples it (indices may be out of range
/// or illegal; applying it validates them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FactoredAction {
    pub slot: u8,
    pub blueprint: u8,
    pub style: u8,
    pub tempo: u8,
    pub alpha_target: u8,
    pub alpha_speed: u8,
    pub alpha_curve: u8,
    pub op: u8,
}

impl FactoredAction {
    pub fn head(&self, head: Head) -> u8 {
        match head {
            Head::Slot => self.slot,
            Head::Blueprint => self.blueprint,
            Head::Style => self.style,
            Head::Tempo => self.tempo,
            Head::AlphaTarget => self.alpha_target,
            Head::AlphaSpeed => self.alpha_speed,
            Head::AlphaCurve => self.alpha_curve,
            Head::Op => self.op,
        }
    }

    pub fn set_head(&mut self, head: Head, value: u8) {
        let field = match head {
            Head::Slot => &mut self.slot,
            Head::Blueprint => &mut self.blueprint,
            Head::Style => &mut self.style,
            Head::Tempo => &mut self.tempo,
            Head::AlphaTarget => &mut self.alpha_target,
            Head::AlphaSpeed => &mut self.alpha_speed,
            Head::AlphaCurve => &mut self.alpha_curve,
            Head::Op => &mut self.op,
        };
        *field = value;
    }

    /// WAIT with every other head at its placeholder (slot 0).
    pub fn wait() -> Self {
        Self {
            slot: 0,
            blueprint: BlueprintAction::Noop as u8,
            style: GerminationStyle::SigmoidAdd as u8,
            tempo: TempoAction::Standard as u8,
            alpha_target: AlphaTargetAction::Full as u8,
            alpha_speed: AlphaSpeedAction::Instant as u8,
            alpha_curve: AlphaCurveAction::Linear as u8,
            op: LifecycleOp::Wait as u8,
        }
    }
}
