//! The heuristic Tamiyo (spec tamiyo §5.1–5.2): a rule-based policy that germinates on a plateau, walks
//! a seed through its stages, fossilizes contributors and prunes failures, rotating blueprints and
//! penalising the ones that get pruned. Per-env state is a small `Copy` component; `decide` is a pure
//! function of that state, the config, the env's [`TrainingSignals`] and its [`SeedReport`]s.
//!
//! # Decisions as factored actions
//!
//! Every decision is a [`FactoredAction`], so it goes through the same masks and handlers as a sampled
//! one. The heuristic only chooses the op, the slot and (for GERMINATE) the blueprint; every other head
//! holds its canonical placeholder of tamiyo §2.2, which for GERMINATE also equals what the reference
//! runner executes (Kasmina's defaults):
//!
//! | decision | op | slot | blueprint | style | tempo | alpha_target | alpha_speed | alpha_curve |
//! |---|---|---|---|---|---|---|---|---|
//! | WAIT (any reason) | WAIT | 0 (placeholder; a BLENDING wait names its seed in `target_slot` only) | NOOP | SIGMOID_ADD | STANDARD | FULL | INSTANT | LINEAR |
//! | `GERMINATE_<bp>` | GERMINATE | first empty slot | bp | SIGMOID_ADD = blend "sigmoid" + ADD | STANDARD = 5 epochs (Kasmina's default tempo) | FULL = 1.0 (heuristic seeds always target full amplitude) | INSTANT | LINEAR |
//! | ADVANCE | ADVANCE | the seed's slot | NOOP | SIGMOID_ADD | STANDARD | FULL | INSTANT | LINEAR |
//! | FOSSILIZE | FOSSILIZE | the seed's slot | NOOP | SIGMOID_ADD | STANDARD | FULL | INSTANT | LINEAR |
//! | PRUNE | PRUNE | the seed's slot | NOOP | SIGMOID_ADD | STANDARD | FULL | INSTANT = 0 steps → immediate prune | LINEAR |
//!
//! SET_ALPHA_TARGET is never produced. The heads a decision consumes (tamiyo §2.1) are op+slot (ADVANCE,
//! FOSSILIZE), op+slot+blueprint+style+tempo+alpha_target (GERMINATE) and op+slot+alpha_speed+alpha_curve
//! (PRUNE, whose INSTANT speed makes `schedule_prune` prune on the spot, as the runner's `prune_seed`).
//!
//! # Where the reference's own heuristic runner differs
//!
//! The reference runs this policy in a separate single-env loop (`run_heuristic_episode`, tamiyo §5.4);
//! esper-ecs runs it as the policy of the ordinary batched step. The differences are listed, by name, in
//! [`RunnerDifference`].

use crate::actions::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, FactoredAction, GerminationStyle,
    LifecycleOp, TempoAction, Topology,
};
use crate::alpha::{ALPHA_EPSILON, AlphaMode};
use crate::signals::{SeedReport, TrainingSignals};
use crate::stage::SeedStage;
use bevy_ecs::component::Component;
use bevy_ecs::resource::Resource;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest blueprint rotation a config can hold (the rotation is a fixed array so the config is `Copy`).
pub const MAX_ROTATION: usize = 16;
/// A decayed penalty below this is dropped (the reference deletes the dict entry).
pub const PENALTY_DROP_BELOW: f64 = 0.1;
/// `last_prune_epoch` before any prune ("no embargo").
pub const NO_PRUNE_EPOCH: i64 = -100;

/// The reference default rotation (CNN only: the transformer topology rejects it).
pub const DEFAULT_ROTATION: [BlueprintAction; 5] = [
    BlueprintAction::ConvLight,
    BlueprintAction::ConvHeavy,
    BlueprintAction::Attention,
    BlueprintAction::Norm,
    BlueprintAction::Depthwise,
];

/// Why a heuristic config was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeuristicConfigError {
    EmptyRotation,
    RotationTooLong(usize),
    /// The blueprint is not a GERMINATE action of the topology (NOOP never is).
    BlueprintNotInTopology(BlueprintAction, Topology),
    UnknownBlueprintId(String),
}

impl fmt::Display for HeuristicConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EmptyRotation => f.write_str("blueprint_rotation is empty"),
            Self::RotationTooLong(n) => {
                write!(f, "blueprint_rotation has {n} entries; at most {MAX_ROTATION} are supported")
            }
            Self::BlueprintNotInTopology(bp, t) => write!(
                f,
                "blueprint_rotation contains '{}', which is not available for topology {t:?}",
                bp.id()
            ),
            Self::UnknownBlueprintId(s) => write!(f, "unknown blueprint id '{s}'"),
        }
    }
}

impl std::error::Error for HeuristicConfigError {}

/// Parse a registry id (`conv_light`, …) into its blueprint.
pub fn blueprint_from_id(id: &str) -> Option<BlueprintAction> {
    BlueprintAction::ALL.into_iter().find(|b| b.id() == id)
}

/// The blueprint rotation: a non-empty list of at most [`MAX_ROTATION`] blueprints (duplicates allowed,
/// as in the reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlueprintRotation {
    items: [BlueprintAction; MAX_ROTATION],
    len: u8,
}

impl BlueprintRotation {
    pub fn new(blueprints: &[BlueprintAction]) -> Result<Self, HeuristicConfigError> {
        if blueprints.is_empty() {
            return Err(HeuristicConfigError::EmptyRotation);
        }
        if blueprints.len() > MAX_ROTATION {
            return Err(HeuristicConfigError::RotationTooLong(blueprints.len()));
        }
        let mut items = [BlueprintAction::Noop; MAX_ROTATION];
        items[..blueprints.len()].copy_from_slice(blueprints);
        Ok(Self { items, len: blueprints.len() as u8 })
    }

    pub fn as_slice(&self) -> &[BlueprintAction] {
        &self.items[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Heuristic settings (tamiyo §5.1 defaults).
#[derive(Resource, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeuristicConfig {
    pub topology: Topology,
    pub plateau_epochs_to_germinate: u32,
    pub min_epochs_before_germinate: u32,
    /// Prune patience: epochs in stage before a drop can prune.
    pub prune_after_epochs_without_improvement: u32,
    /// pp of accuracy lost since stage start that prunes (strictly more than this).
    pub prune_if_accuracy_drops_by: f64,
    /// A HOLDING seed fossilizes when its counterfactual contribution is strictly above this.
    pub min_improvement_to_fossilize: f64,
    pub embargo_epochs_after_prune: u32,
    pub blueprint_rotation: BlueprintRotation,
    pub blueprint_penalty_on_prune: f64,
    pub blueprint_penalty_decay: f64,
    /// Rotation skips blueprints whose penalty is at or above this.
    pub blueprint_penalty_threshold: f64,
    pub ransomware_contribution_threshold: f64,
    pub ransomware_improvement_threshold: f64,
}

impl HeuristicConfig {
    /// The defaults for `topology`; fails for "transformer" because the default rotation holds CNN
    /// blueprints (as in the reference).
    pub fn new(topology: Topology) -> Result<Self, HeuristicConfigError> {
        Self::with_rotation(topology, &DEFAULT_ROTATION)
    }

    /// The defaults with a custom rotation, validated against the topology.
    pub fn with_rotation(
        topology: Topology,
        rotation: &[BlueprintAction],
    ) -> Result<Self, HeuristicConfigError> {
        let config = Self {
            topology,
            plateau_epochs_to_germinate: 3,
            min_epochs_before_germinate: 5,
            prune_after_epochs_without_improvement: 5,
            prune_if_accuracy_drops_by: 2.0,
            min_improvement_to_fossilize: 0.5,
            embargo_epochs_after_prune: 5,
            blueprint_rotation: BlueprintRotation::new(rotation)?,
            blueprint_penalty_on_prune: 2.0,
            blueprint_penalty_decay: 0.5,
            blueprint_penalty_threshold: 3.0,
            ransomware_contribution_threshold: 0.1,
            ransomware_improvement_threshold: 0.0,
        };
        config.validate()?;
        Ok(config)
    }

    /// A rotation given by registry ids (`["conv_light", "conv_heavy"]`).
    pub fn with_rotation_ids(topology: Topology, ids: &[&str]) -> Result<Self, HeuristicConfigError> {
        let mut bps = [BlueprintAction::Noop; MAX_ROTATION];
        if ids.len() > MAX_ROTATION {
            return Err(HeuristicConfigError::RotationTooLong(ids.len()));
        }
        for (slot, id) in bps.iter_mut().zip(ids) {
            *slot = blueprint_from_id(id)
                .ok_or_else(|| HeuristicConfigError::UnknownBlueprintId(id.to_string()))?;
        }
        Self::with_rotation(topology, &bps[..ids.len()])
    }

    /// Every rotation entry must be a GERMINATE action of the topology.
    pub fn validate(&self) -> Result<(), HeuristicConfigError> {
        if self.blueprint_rotation.is_empty() {
            return Err(HeuristicConfigError::EmptyRotation);
        }
        for &bp in self.blueprint_rotation.as_slice() {
            if bp == BlueprintAction::Noop || !bp.in_topology(self.topology) {
                return Err(HeuristicConfigError::BlueprintNotInTopology(bp, self.topology));
            }
        }
        Ok(())
    }
}

impl Default for HeuristicConfig {
    fn default() -> Self {
        Self::new(Topology::Cnn).expect("the default rotation is valid for CNN")
    }
}

/// Why the heuristic decided what it did (the reference's `reason` strings, as an enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HeuristicReason {
    /// Fewer than `embargo_epochs_after_prune` epochs since the last prune decision.
    Embargo,
    HostNotStabilized,
    TooEarly,
    NoAvailableSlot,
    /// Plateau long enough: germinate.
    Plateau,
    /// No live seed and no plateau.
    TrainingProgressing,
    AdvanceToTraining,
    FailingInTraining,
    AdvanceToBlending,
    FailingInBlending,
    AdvanceToHolding,
    /// BLENDING ramp not finished: wait on that seed.
    Blending,
    /// HOLDING with contribution > 0.1 but total improvement < 0: "holding the model hostage".
    Ransomware,
    /// HOLDING but no counterfactual measured yet.
    ContributionUnmeasured,
    Fossilizing,
    NoImprovementInHolding,
    /// Live seeds exist but none matched a branch (unreachable with valid stages).
    SeedsProgressing,
}

/// One heuristic decision.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeuristicDecision {
    /// The decision in the shape every policy produces.
    pub action: FactoredAction,
    /// The seed the decision is about (`target_seed_id`); GERMINATE names the slot it will fill.
    pub target_slot: Option<u8>,
    /// 1.0 unless germinating (`min(1, plateau/5)`) or fossilizing (`min(1, contribution/5)`).
    pub confidence: f64,
    pub reason: HeuristicReason,
}

impl HeuristicDecision {
    fn new(op: LifecycleOp, target_slot: Option<u8>, reason: HeuristicReason) -> Self {
        // WAIT keeps the slot placeholder (first enabled slot); its target lives in `target_slot` only.
        let slot = if op == LifecycleOp::Wait { 0 } else { target_slot.unwrap_or(0) };
        let action = FactoredAction { slot, op: op as u8, ..FactoredAction::wait() };
        Self { action, target_slot, confidence: 1.0, reason }
    }

    pub fn op(&self) -> LifecycleOp {
        LifecycleOp::from_index(self.action.op).expect("the heuristic only writes valid ops")
    }

    /// The germinated blueprint (None unless GERMINATE).
    pub fn blueprint(&self) -> Option<BlueprintAction> {
        (self.op() == LifecycleOp::Germinate).then(|| {
            BlueprintAction::from_index(self.action.blueprint).expect("the heuristic only writes valid heads")
        })
    }

    /// The flat action index of tamiyo §2.3 (`0 WAIT`, `GERMINATE_<bp>` for the topology's blueprints in
    /// value order, then FOSSILIZE, PRUNE, ADVANCE). None for a blueprint outside the topology.
    pub fn flat_action(&self, topology: Topology) -> Option<u8> {
        let germinable = || {
            BlueprintAction::ALL
                .into_iter()
                .filter(move |b| *b != BlueprintAction::Noop && b.in_topology(topology))
        };
        let n = germinable().count() as u8;
        Some(match self.op() {
            LifecycleOp::Wait => 0,
            LifecycleOp::Germinate => {
                let bp = self.blueprint()?;
                1 + germinable().position(|b| b == bp)? as u8
            }
            LifecycleOp::Fossilize => n + 1,
            LifecycleOp::Prune => n + 2,
            LifecycleOp::Advance => n + 3,
            LifecycleOp::SetAlphaTarget => return None,
        })
    }
}

/// One env's heuristic state (tamiyo §5.1). `reset()` restores the initial values. The reference's
/// decision log is not kept here (no per-epoch allocation); `decisions_made` counts it and the trace
/// records the decisions.
#[derive(Component, Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeuristicState {
    /// Position in the rotation (grows without bound, used modulo the rotation length).
    pub bp_index: u64,
    pub germination_count: u32,
    pub last_prune_epoch: i64,
    /// Penalty per blueprint, indexed by `BlueprintAction as usize`; 0.0 = no entry.
    pub penalties: [f64; BlueprintAction::COUNT],
    pub last_decay_epoch: i64,
    pub decisions_made: u32,
}

impl Default for HeuristicState {
    fn default() -> Self {
        Self {
            bp_index: 0,
            germination_count: 0,
            last_prune_epoch: NO_PRUNE_EPOCH,
            penalties: [0.0; BlueprintAction::COUNT],
            last_decay_epoch: -1,
            decisions_made: 0,
        }
    }
}

impl HeuristicState {
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    pub fn penalty(&self, bp: BlueprintAction) -> f64 {
        self.penalties[bp as usize]
    }

    /// Multiply every penalty by the decay and drop those below [`PENALTY_DROP_BELOW`].
    pub fn decay_penalties(&mut self, config: &HeuristicConfig) {
        for p in &mut self.penalties {
            *p *= config.blueprint_penalty_decay;
            if *p < PENALTY_DROP_BELOW {
                *p = 0.0;
            }
        }
    }

    pub fn apply_blueprint_penalty(&mut self, config: &HeuristicConfig, bp: BlueprintAction) {
        self.penalties[bp as usize] += config.blueprint_penalty_on_prune;
    }

    /// `NEXT_BLUEPRINT()`: the next rotation entry whose penalty is below the threshold; if every entry
    /// is penalised, the entry at `start % n` of the rotation sorted by (penalty, id), and the index
    /// moves to `start + 1` (so successive calls cycle through that sorted order).
    pub fn next_blueprint(&mut self, config: &HeuristicConfig) -> BlueprintAction {
        let rotation = config.blueprint_rotation.as_slice();
        let n = rotation.len() as u64;
        let start = self.bp_index;
        for _ in 0..n {
            let bp = rotation[(self.bp_index % n) as usize];
            self.bp_index += 1;
            if self.penalty(bp) < config.blueprint_penalty_threshold {
                return bp;
            }
        }
        let mut ordered = config.blueprint_rotation;
        let ordered = &mut ordered.items[..rotation.len()];
        ordered.sort_by(|a, b| self.penalty(*a).total_cmp(&self.penalty(*b)).then(a.id().cmp(b.id())));
        self.bp_index = start + 1;
        ordered[(start % n) as usize]
    }

    /// `decide(signals, seeds)`: decay penalties once per epoch (before deciding), then germinate if no
    /// live seed exists, else manage the first live seed. `slots` are the env's enabled slots in
    /// canonical order (empty ones report DORMANT).
    pub fn decide(
        &mut self,
        config: &HeuristicConfig,
        signals: &TrainingSignals,
        slots: &[SeedReport],
    ) -> HeuristicDecision {
        let epoch = i64::from(signals.epoch);
        if epoch > self.last_decay_epoch {
            self.decay_penalties(config);
            self.last_decay_epoch = epoch;
        }
        // Live = holds a seed module, not FOSSILIZED (cooldown stages have no module).
        let mut live = slots.iter().filter(|s| s.has_seed() && s.stage != SeedStage::Fossilized).peekable();
        let decision = if live.peek().is_none() {
            self.decide_germination(config, signals, slots)
        } else {
            self.manage(config, signals, live)
        };
        self.decisions_made += 1;
        decision
    }

    fn decide_germination(
        &mut self,
        config: &HeuristicConfig,
        signals: &TrainingSignals,
        slots: &[SeedReport],
    ) -> HeuristicDecision {
        use HeuristicReason::*;
        let wait = |reason| HeuristicDecision::new(LifecycleOp::Wait, None, reason);
        let epoch = i64::from(signals.epoch);
        if epoch - self.last_prune_epoch < i64::from(config.embargo_epochs_after_prune) {
            return wait(Embargo);
        }
        if !signals.host_stabilized {
            return wait(HostNotStabilized);
        }
        if signals.epoch < config.min_epochs_before_germinate {
            return wait(TooEarly);
        }
        if signals.available_slots == 0 {
            return wait(NoAvailableSlot);
        }
        if signals.plateau_epochs >= config.plateau_epochs_to_germinate {
            let bp = self.next_blueprint(config);
            self.germination_count += 1;
            // The runner germinates into the first enabled slot with no state.
            let target = slots.iter().find(|s| s.is_empty()).map(|s| s.slot);
            let mut d = HeuristicDecision::new(LifecycleOp::Germinate, target, Plateau);
            d.action.blueprint = bp as u8;
            d.action.style = GerminationStyle::SigmoidAdd as u8;
            d.action.tempo = TempoAction::Standard as u8;
            d.action.alpha_target = AlphaTargetAction::Full as u8;
            d.confidence = (f64::from(signals.plateau_epochs) / 5.0).min(1.0);
            return d;
        }
        wait(TrainingProgressing)
    }

    fn manage<'a>(
        &mut self,
        config: &HeuristicConfig,
        signals: &TrainingSignals,
        live: impl Iterator<Item = &'a SeedReport>,
    ) -> HeuristicDecision {
        use HeuristicReason::*;
        let at = |op, s: &SeedReport, reason| HeuristicDecision::new(op, Some(s.slot), reason);
        for s in live {
            let should_prune = s.epochs_in_stage >= config.prune_after_epochs_without_improvement
                && s.improvement_since_stage_start < -config.prune_if_accuracy_drops_by;
            match s.stage {
                SeedStage::Germinated => return at(LifecycleOp::Advance, s, AdvanceToTraining),
                SeedStage::Training => {
                    if should_prune {
                        return self.prune(config, signals, s, FailingInTraining);
                    }
                    // The G2 gate decides whether it actually moves.
                    return at(LifecycleOp::Advance, s, AdvanceToBlending);
                }
                SeedStage::Blending => {
                    if should_prune {
                        return self.prune(config, signals, s, FailingInBlending);
                    }
                    let full_and_reached = s.alpha_target >= 1.0 - ALPHA_EPSILON
                        && s.alpha_mode == AlphaMode::Hold
                        && (s.alpha - s.alpha_target).abs() <= ALPHA_EPSILON;
                    if full_and_reached {
                        return at(LifecycleOp::Advance, s, AdvanceToHolding);
                    }
                    return at(LifecycleOp::Wait, s, Blending);
                }
                SeedStage::Holding => {
                    let ti = s.total_improvement;
                    let Some(cc) = s.counterfactual_contribution else {
                        return at(LifecycleOp::Wait, s, ContributionUnmeasured);
                    };
                    if cc > config.ransomware_contribution_threshold
                        && ti < config.ransomware_improvement_threshold
                    {
                        return self.prune(config, signals, s, Ransomware);
                    }
                    if cc > config.min_improvement_to_fossilize {
                        let mut d = at(LifecycleOp::Fossilize, s, Fossilizing);
                        d.confidence = (cc / 5.0).min(1.0);
                        return d;
                    }
                    return self.prune(config, signals, s, NoImprovementInHolding);
                }
                _ => {}
            }
        }
        HeuristicDecision::new(LifecycleOp::Wait, None, SeedsProgressing)
    }

    /// `PRUNE(s)`: start the embargo, penalise the blueprint, prune instantly.
    fn prune(
        &mut self,
        config: &HeuristicConfig,
        signals: &TrainingSignals,
        s: &SeedReport,
        reason: HeuristicReason,
    ) -> HeuristicDecision {
        self.last_prune_epoch = i64::from(signals.epoch);
        self.apply_blueprint_penalty(config, s.blueprint);
        let mut d = HeuristicDecision::new(LifecycleOp::Prune, Some(s.slot), reason);
        d.action.alpha_speed = AlphaSpeedAction::Instant as u8;
        d.action.alpha_curve = AlphaCurveAction::Linear as u8;
        d
    }
}

/// How the reference's separate heuristic runner (`simic/training/helpers.py::run_heuristic_episode`,
/// tamiyo §5.4, kasmina §5.2/§6.3/§8.2) differs from running [`HeuristicState::decide`] inside the
/// esper-ecs step loop. esper-ecs does not reproduce the runner; these are the known gaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunnerDifference {
    /// The runner drives one env in its own Python loop; esper-ecs uses the heuristic as the policy of
    /// the batched step (every env, same systems, decisions stored like sampled ones).
    SingleEnvLoop,
    /// Runner order: train → validate → record accuracy → tracker update → `step_epoch` on every slot →
    /// decide → execute. The RL loop (and esper-ecs) decides and acts first and ticks after, so the
    /// runner's decision sees, and its op lands on, the post-tick state.
    StepEpochBeforeDecision,
    /// The runner executes decisions without action masks, execution-time validity checks or the
    /// governor's preflight; esper-ecs sends the [`FactoredAction`] through masks and handlers. Visible
    /// effects: a PRUNE mid-ramp (controller not in HOLD) or of a seed younger than MIN_PRUNE_AGE is
    /// refused here, and GERMINATE is refused while another slot is still PRUNED/EMBARGOED/RESETTING
    /// (the runner germinates into the first empty slot once its own 5-epoch embargo has passed, checking
    /// only `max_seeds` against the slots that have a state).
    NoMasksOrPreflight,
    /// Runner PRUNE is `prune_seed`: an immediate prune. Here it is PRUNE with alpha_speed INSTANT,
    /// i.e. `schedule_prune(steps = 0)`, which prunes immediately too, behind the mask.
    ImmediatePrune,
    /// The runner ignores its own flat→factored conversion (slot 0, tempo index 0 = FAST) and germinates
    /// with Kasmina's defaults (blend "sigmoid", ADD, tempo 5, target 1.0) into the first empty slot;
    /// esper-ecs encodes exactly those defaults (SIGMOID_ADD, STANDARD, FULL) and that slot.
    GerminationDefaults,
    /// The runner trains all seeds with ONE combined SGD (seed_lr 0.01, momentum 0.9) over the model's
    /// seed parameters, which excludes FOSSILIZED seeds (they stop training), rebuilt — momentum lost —
    /// at every germination and prune. The RL loop (and esper-ecs) keeps one SGD per slot, fossilized
    /// seeds keep training, and only that slot's optimizer is reset.
    CombinedSeedOptimizer,
    /// The runner clips no gradients; the RL loop clips the host and each seed to L2 norm 1.0 separately.
    NoGradientClipping,
    /// The runner validates without counterfactual ablations, so `counterfactual_contribution` stays
    /// None: HOLDING seeds get WAIT forever (the `cc is None` branch) and are never fossilized or
    /// pruned by the heuristic. esper-ecs measures contributions for every env, so HOLDING decides.
    NoCounterfactual,
    /// The runner records accuracy only on slots that still hold a seed module, so a pruned slot's
    /// cooldown ticks once per epoch (7 epochs) instead of twice (free 5 epochs after an instant prune
    /// in the RL loop, kasmina §8.2 a).
    CooldownSingleTick,
    /// Gradient telemetry comes from the slot-level capture path (ratio `(S/H)·sqrt(P_h/P_s)` clamped at
    /// 10), not the RL loop's collector (kasmina §5.4), which feeds the G2 gate differently.
    SlotLevelGradientCapture,
    /// No Tolaria governor in the runner: no vital-sign checks, snapshots, rollbacks or death penalty.
    NoGovernor,
    /// Data: the runner uses the task's default loaders — CIFAR batch 128, at most 50 batches per epoch
    /// for training and for validation, every batch from the full sets — and 75 epochs by default; the
    /// RL loop trains each env on 512-image batches over its 1/N share of a full epoch, 150 epochs.
    BatchSizesAndEpochBudget,
    /// The runner computes a contribution reward (with no seed contribution, `acc_delta` as proxy) for
    /// comparison only; nothing learns from it.
    RewardForComparisonOnly,
    /// Seeding: the runner reseeds torch/random with `seed + episode·1000`; the RL loop with
    /// `root_seed + (batch·N + env)·1009`. esper-ecs uses its counter-based streams for both.
    EpisodeSeeding,
}

impl RunnerDifference {
    pub const ALL: [RunnerDifference; 14] = [
        Self::SingleEnvLoop,
        Self::StepEpochBeforeDecision,
        Self::NoMasksOrPreflight,
        Self::ImmediatePrune,
        Self::GerminationDefaults,
        Self::CombinedSeedOptimizer,
        Self::NoGradientClipping,
        Self::NoCounterfactual,
        Self::CooldownSingleTick,
        Self::SlotLevelGradientCapture,
        Self::NoGovernor,
        Self::BatchSizesAndEpochBudget,
        Self::RewardForComparisonOnly,
        Self::EpisodeSeeding,
    ];
}
