//! The reward (spec simic §2) for every env of a step in one call: a pure function over `[E]` and
//! `[E, S]` columns, no ECS types.
//!
//! [`compute_rewards`] works in column passes: it gathers the target slot's columns, derives the shared
//! inputs of §2.0 for every env (effective seed parameters, alpha shock, occupancy, clawback, forfeit,
//! drip), then fills one column per reward term ([`Term`]) over all envs and sums them in a fixed
//! order. Every term is stored signed, so that `raw[e]` is the sum of env `e`'s terms.
//!
//! Reference quirks kept (each named in a test): WAIT attributes the first enabled slot (the caller
//! passes that slot as the target); BASIC's terminal term uses the last epoch's accuracy delta and is
//! not gated by `disable_terminal_reward`. Fixed: the loss family's sign error (§2.8) — improvement is
//! rewarded, and the first epoch (no previous loss) counts as no change rather than −12.5.

// Column passes index several `[E]` columns with one env index; iterator zips of five columns would
// hide that.
#![allow(clippy::needless_range_loop)]

use esper_components::reward_config::{RewardConfig, RewardFamily, RewardMode};
// The lifecycle's own thresholds: the fossilize contribution (1.0 pp, G5's and the reward's) and the
// prune age.
use esper_components::gates::MIN_FOSSILIZE_CONTRIBUTION;
use esper_components::lifecycle::MIN_PRUNE_AGE;
use esper_components::{LifecycleOp, SeedStage};

/// γ of the PBRS potential, the same constant as PPO's and the hindsight credit's (the reference
/// raises if they differ).
pub use esper_components::GAMMA;
/// `pbrs_weight`.
const PBRS_WEIGHT: f64 = 0.3;
/// `epoch_progress_bonus` / `max_progress_bonus`.
const EPOCH_PROGRESS_BONUS: f64 = 0.3;
const MAX_PROGRESS_BONUS: f64 = 2.0;
/// `contribution_weight`, `proxy_confidence_factor`.
const CONTRIBUTION_WEIGHT: f64 = 1.0;
const PROXY_CONFIDENCE: f64 = 0.3;
/// Anti-gaming: `attribution_sigmoid_steepness`, `hacking_ratio_threshold`, `improvement_safe_threshold`.
const SIGMOID_STEEPNESS: f64 = 3.0;
const HACKING_RATIO: f64 = 5.0;
const IMPROVEMENT_SAFE: f64 = 0.1;
/// `germination_warmup_epochs` / `germination_discount_floor` (the timing discount).
const WARMUP_EPOCHS: f64 = 10.0;
const DISCOUNT_FLOOR: f64 = 0.4;
/// `rent_weight` / `max_rent`, `base_slot_rent_ratio`.
const RENT_WEIGHT: f64 = 0.5;
const MAX_RENT: f64 = 1.5;
const BASE_SLOT_RENT_RATIO: f64 = 0.0039;
/// `alpha_shock_coef` / cap.
const ALPHA_SHOCK_COEF: f64 = 0.1958;
const ALPHA_SHOCK_CAP: f64 = 1.0;
/// `seed_occupancy_cost`, `free_slots`, `fossilized_maintenance_cost`.
const OCCUPANCY_COST: f64 = 0.01;
const FREE_SLOTS: f64 = 1.0;
const FOSSIL_MAINTENANCE: f64 = 0.002;
/// Action costs and penalties.
const GERMINATE_COST: f64 = -0.15;
const GERMINATE_WITH_SEED_PENALTY: f64 = -0.3;
const FOSSILIZE_COST: f64 = -0.01;
const PRUNE_COST: f64 = -0.005;
const SET_ALPHA_COST: f64 = -0.005;
const ADVANCE_FROM_TRAINING_PENALTY: f64 = -0.1;
const INVALID_FOSSILIZE_PENALTY: f64 = -1.0;
const FOSSILIZE_BASE_BONUS: f64 = 0.5;
const FOSSILIZE_CONTRIBUTION_SCALE: f64 = 0.1;
const FOSSILIZE_NONCONTRIBUTING_PENALTY: f64 = -0.2;
const FOSSILIZE_TERMINAL_SCALE: f64 = 3.0;
const FOSSILIZE_QUALITY_CEILING: f64 = 3.0;
/// `MIN_HOLDING_EPOCHS`: legitimacy `L = min(1, e / 5)`.
const MIN_HOLDING_EPOCHS: f64 = 5.0;
const PRUNE_NO_SEED_PENALTY: f64 = -0.2;
const PRUNE_FOSSILIZED_PENALTY: f64 = -1.0;
const PRUNE_HURTING_THRESHOLD: f64 = -0.5;
const PRUNE_HURTING_BONUS: f64 = 0.15;
const PRUNE_ACCEPTABLE_BONUS: f64 = 0.1;
const PRUNE_GOOD_SEED_PENALTY: f64 = -0.3;
const MIN_PRUNE_BONUS_AGE: u32 = 3;
const TERMINAL_ACC_WEIGHT: f64 = 0.05;
/// Escrow: `escrow_delta_clip`.
const ESCROW_DELTA_CLIP: f64 = 2.0;
/// BASIC / BASIC_PLUS fossilize terms.
const BASIC_FOSSILIZE_BASE_BONUS: f64 = 0.3;
const BASIC_FOSSILIZE_CONTRIBUTION_SCALE: f64 = 0.5;
const BASIC_FOSSILIZE_INVALID: f64 = -0.5;
const BASIC_FOSSILIZE_NONCONTRIBUTING: f64 = -0.2;
/// Drip: `max_drip_per_epoch`, `min_drip_epochs`, `negative_drip_ratio`.
const MAX_DRIP_PER_EPOCH: f64 = 0.1;
const MIN_DRIP_EPOCHS: f64 = 5.0;
const NEGATIVE_DRIP_RATIO: f64 = 0.5;
/// MINIMAL: `early_prune_threshold` / `early_prune_penalty`.
const EARLY_PRUNE_THRESHOLD: u32 = 5;
const EARLY_PRUNE_PENALTY: f64 = -0.1;
/// SIMPLIFIED: per-action cost, terminal weights.
const SIMPLIFIED_ACTION_COST: f64 = -0.01;
const SIMPLIFIED_ACC_WEIGHT: f64 = 3.0;
const SIMPLIFIED_FOSSIL_WEIGHT: f64 = 2.0;

/// Stage potential Φ (§2.2).
pub fn stage_potential(stage: SeedStage) -> f64 {
    match stage {
        SeedStage::Germinated => 1.0,
        SeedStage::Training => 2.0,
        SeedStage::Blending => 3.5,
        SeedStage::Holding => 5.5,
        SeedStage::Fossilized => 6.0,
        _ => 0.0,
    }
}

/// `φ(stage, e) = Φ(stage) + min(0.3·e, 2.0)`.
pub fn potential(stage: SeedStage, epochs_in_stage: u32) -> f64 {
    stage_potential(stage) + (EPOCH_PROGRESS_BONUS * epochs_in_stage as f64).min(MAX_PROGRESS_BONUS)
}

/// The timing discount `τ(g)`: 1 from 10 epochs on, else `0.4 + 0.6·g/10`.
pub fn timing_discount(g: f64) -> f64 {
    if g >= WARMUP_EPOCHS { 1.0 } else { DISCOUNT_FLOOR + (1.0 - DISCOUNT_FLOOR) * g / WARMUP_EPOCHS }
}

/// The anti-gaming discount: 1 for `cf_imp ≥ 0`, else `1 / (1 + exp(min(3·|cf_imp|, 700)))`.
pub fn attribution_discount(cf_imp: f64) -> f64 {
    if cf_imp >= 0.0 { 1.0 } else { 1.0 / (1.0 + (SIGMOID_STEEPNESS * cf_imp.abs()).min(700.0).exp()) }
}

/// `harmonic(p, c) = 2pc / max(p + c, 1e-8)` when `c ≥ p`, else `c`.
pub fn harmonic(p: f64, c: f64) -> f64 {
    if c >= p { 2.0 * p * c / (p + c).max(1e-8) } else { c }
}

/// One named, signed term of a reward. `raw = Σ terms` in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Term {
    /// Attribution (SHAPED: discounted contribution; ESCROW: the change in escrow credit), with the
    /// ratio penalty.
    Attribution,
    BlendingWarning,
    HoldingWarning,
    Pbrs,
    Synergy,
    /// Parameter rent (SHAPED/ESCROW: logarithmic; BASIC: linear; LOSS: compute rent).
    Rent,
    AlphaShock,
    Occupancy,
    FossilRent,
    ActionShaping,
    /// BASIC/BASIC_PLUS: the fossilize bonus or penalty paid now.
    Fossilize,
    /// BASIC_PLUS: the fossils' drip this epoch.
    Drip,
    /// LOSS: the normalised loss-delta term.
    LossDelta,
    /// LOSS: `0.1·(γ·Φ(stage) − Φ(previous stage))` every step with a seed.
    StagePotential,
    Terminal,
    EscrowForfeit,
    Clawback,
    AutoPrunePenalty,
    HindsightCredit,
}

impl Term {
    pub const COUNT: usize = 19;
    pub const ALL: [Term; Term::COUNT] = [
        Self::Attribution,
        Self::BlendingWarning,
        Self::HoldingWarning,
        Self::Pbrs,
        Self::Synergy,
        Self::Rent,
        Self::AlphaShock,
        Self::Occupancy,
        Self::FossilRent,
        Self::ActionShaping,
        Self::Fossilize,
        Self::Drip,
        Self::LossDelta,
        Self::StagePotential,
        Self::Terminal,
        Self::EscrowForfeit,
        Self::Clawback,
        Self::AutoPrunePenalty,
        Self::HindsightCredit,
    ];

    /// The name in `metrics.jsonl` (the reference's component names where it has one).
    pub fn name(self) -> &'static str {
        match self {
            Self::Attribution => "bounded_attribution",
            Self::BlendingWarning => "blending_warning",
            Self::HoldingWarning => "holding_warning",
            Self::Pbrs => "pbrs_bonus",
            Self::Synergy => "synergy_bonus",
            Self::Rent => "compute_rent",
            Self::AlphaShock => "alpha_shock",
            Self::Occupancy => "occupancy_rent",
            Self::FossilRent => "fossilized_rent",
            Self::ActionShaping => "action_shaping",
            Self::Fossilize => "fossilize_bonus",
            Self::Drip => "drip_this_epoch",
            Self::LossDelta => "loss_delta",
            Self::StagePotential => "stage_potential",
            Self::Terminal => "terminal_bonus",
            Self::EscrowForfeit => "escrow_forfeit",
            Self::Clawback => "germination_clawback",
            Self::AutoPrunePenalty => "auto_prune_penalty",
            Self::HindsightCredit => "hindsight_credit",
        }
    }

    /// The terms a configuration can make non-zero, in [`Term::ALL`] order.
    pub fn of(config: &RewardConfig) -> &'static [Term] {
        use Term::*;
        if config.family == RewardFamily::Loss {
            return &[Rent, LossDelta, StagePotential, Terminal, AutoPrunePenalty, HindsightCredit];
        }
        match config.mode {
            RewardMode::Shaped => &[
                Attribution,
                BlendingWarning,
                HoldingWarning,
                Pbrs,
                Synergy,
                Rent,
                AlphaShock,
                Occupancy,
                FossilRent,
                ActionShaping,
                Terminal,
                Clawback,
                AutoPrunePenalty,
                HindsightCredit,
            ],
            RewardMode::Escrow => &[
                Attribution,
                BlendingWarning,
                HoldingWarning,
                Pbrs,
                Synergy,
                Rent,
                AlphaShock,
                Occupancy,
                FossilRent,
                ActionShaping,
                Terminal,
                EscrowForfeit,
                Clawback,
                AutoPrunePenalty,
                HindsightCredit,
            ],
            RewardMode::Basic => &[Pbrs, Rent, Fossilize, Terminal, AutoPrunePenalty, HindsightCredit],
            RewardMode::BasicPlus => {
                &[Pbrs, Rent, Fossilize, Drip, Terminal, AutoPrunePenalty, HindsightCredit]
            }
            RewardMode::Sparse => &[Terminal, AutoPrunePenalty, HindsightCredit],
            RewardMode::Minimal => &[ActionShaping, Terminal, AutoPrunePenalty, HindsightCredit],
            RewardMode::Simplified => &[Pbrs, ActionShaping, Terminal, AutoPrunePenalty, HindsightCredit],
        }
    }
}

/// Everything the reward reads, as columns. `[E]` columns are indexed by env, `[E, S]` columns by
/// `env * n_slots + slot` (canonical slot order). The caller fills them in place every step (`resize`
/// keeps their memory).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewardInputs {
    pub n_envs: usize,
    pub n_slots: usize,
    /// This step's 1-based host epoch `t` and the episode length `T`.
    pub epoch: u32,
    pub max_epochs: u32,
    /// The host's trainable parameters.
    pub host_params: f64,

    /// `[E]` the env rolled back this step: no reward (its row is left untouched, terms 0).
    pub skip: Vec<bool>,
    /// `[E]` `action_for_reward`.
    pub op: Vec<LifecycleOp>,
    /// `[E]` the slot the reward looks at (for WAIT: the first enabled slot).
    pub target_slot: Vec<u8>,
    /// `[E]` main-config validation accuracy (pp) and loss.
    pub val_acc: Vec<f64>,
    pub val_loss: Vec<f64>,
    /// `[E]` tracker deltas: `acc_t − acc_{t−1}` (previous 0 at the first epoch) and
    /// `loss_{t−1} − loss_t` (+∞ at the first epoch).
    pub acc_delta: Vec<f64>,
    pub loss_delta: Vec<f64>,
    /// `[E]` min of the last ≤ 3 validation accuracies (ESCROW's progress).
    pub stable_val_acc: Vec<f64>,
    /// `[E]` `val_acc − all_off_acc` (fallback: lowest leave-one-out accuracy); None if nothing ablated.
    pub cf_imp: Vec<Option<f64>>,
    /// `[E]` accuracy with every non-fossilized seed at alpha 0 (= val_acc if none).
    pub committed_val_acc: Vec<f64>,
    /// `[E]` fossilizations this episode, and those that contributed ≥ 1 pp.
    pub n_fossil: Vec<u32>,
    pub n_contrib_fossil: Vec<u32>,
    /// `[E]` pending terms earned last step (simic §2.9 steps 3–4).
    pub pending_auto_prune_penalty: Vec<f64>,
    pub pending_hindsight_credit: Vec<f64>,

    /// `[E, S]` the slot's stage (Dormant when empty) and the stage before its last transition.
    pub stage: Vec<SeedStage>,
    pub previous_stage: Vec<SeedStage>,
    pub epochs_in_stage: Vec<u32>,
    pub previous_epochs_in_stage: Vec<u32>,
    /// `[E, S]` `epochs_total`: epochs since germination.
    pub seed_age: Vec<u32>,
    /// `[E, S]` alpha now and at the previous reward (0 for an empty slot).
    pub alpha: Vec<f64>,
    pub prev_alpha: Vec<f64>,
    /// `[E, S]` the seed's parameters (+ its gate's while it has one) now and at the previous reward.
    pub params: Vec<f64>,
    pub prev_params: Vec<f64>,
    /// `[E, S]` the seed's parameters (+ gate) that train now: `params`, or 0 while the blend-out
    /// freeze holds them (kasmina §8.2e: the reference's `active_seed_params` counts only
    /// `requires_grad` parameters). The loss family's rent reads this; the contribution family's reads
    /// `params`, the cached count, as the reference does.
    pub trainable_params: Vec<f64>,
    /// `[E, S]` leave-one-out contribution, when the slot was ablated this step.
    pub contribution: Vec<Option<f64>>,
    pub improvement_since_stage_start: Vec<f64>,
    pub total_improvement: Vec<f64>,
    pub interaction_sum: Vec<f64>,
    /// `[E, S]` validation accuracy when the seed germinated (progress = acc − this).
    pub acc_at_germination: Vec<Option<f64>>,
    /// `[E, S]` ESCROW credit paid so far for the slot's seed.
    pub escrow_credit: Vec<f64>,
    /// `[E, S]` BASIC_PLUS drip per epoch of a fossilized seed.
    pub drip_scale: Vec<Option<f64>>,
}

impl RewardInputs {
    /// Sizes every column for `n_envs × n_slots`, keeping memory (values are left as they were).
    pub fn resize(&mut self, n_envs: usize, n_slots: usize) {
        self.n_envs = n_envs;
        self.n_slots = n_slots;
        let es = n_envs * n_slots;
        self.skip.resize(n_envs, false);
        self.op.resize(n_envs, LifecycleOp::Wait);
        self.target_slot.resize(n_envs, 0);
        for col in [
            &mut self.val_acc,
            &mut self.val_loss,
            &mut self.acc_delta,
            &mut self.loss_delta,
            &mut self.stable_val_acc,
            &mut self.committed_val_acc,
            &mut self.pending_auto_prune_penalty,
            &mut self.pending_hindsight_credit,
        ] {
            col.resize(n_envs, 0.0);
        }
        self.cf_imp.resize(n_envs, None);
        self.n_fossil.resize(n_envs, 0);
        self.n_contrib_fossil.resize(n_envs, 0);
        self.stage.resize(es, SeedStage::Dormant);
        self.previous_stage.resize(es, SeedStage::Unknown);
        for col in [&mut self.epochs_in_stage, &mut self.previous_epochs_in_stage, &mut self.seed_age] {
            col.resize(es, 0);
        }
        for col in [
            &mut self.alpha,
            &mut self.prev_alpha,
            &mut self.params,
            &mut self.prev_params,
            &mut self.trainable_params,
            &mut self.improvement_since_stage_start,
            &mut self.total_improvement,
            &mut self.interaction_sum,
            &mut self.escrow_credit,
        ] {
            col.resize(es, 0.0);
        }
        self.contribution.resize(es, None);
        self.acc_at_germination.resize(es, None);
        self.drip_scale.resize(es, None);
    }

    fn at(&self, e: usize, k: usize) -> usize {
        e * self.n_slots + k
    }
}

/// What the reward produced, as columns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewardOutputs {
    /// `[E]` raw reward (0 for a skipped env).
    pub raw: Vec<f64>,
    /// `[Term::COUNT, E]`: `terms[t * E + e]` is term `Term::ALL[t]` of env `e`.
    pub terms: Vec<f64>,
    /// `[E, S]` ESCROW credit after this step (the input credit where nothing changed).
    pub escrow_credit: Vec<f64>,
    /// `[E]` BASIC_PLUS: the drip per epoch a FOSSILIZE earned for the target slot's seed, to keep if
    /// the fossilization succeeds.
    pub proposed_drip: Vec<Option<f64>>,
    /// `[E]` the shared inputs the reward derived (for `--log-reward-inputs`).
    pub effective_seed_params: Vec<f64>,
    pub alpha_delta_sq_sum: Vec<f64>,
    pub n_active: Vec<u32>,
    pub fossil_params: Vec<f64>,
    pub contribution: Vec<Option<f64>>,
    pub progress: Vec<Option<f64>>,
    scratch: Scratch,
}

/// Per-env columns the passes share: where the target slot's row is in the `[E, S]` inputs, and the
/// anti-gaming gates.
#[derive(Clone, Debug, Default, PartialEq)]
struct Scratch {
    /// `env * n_slots + target_slot`.
    target: Vec<usize>,
    discount: Vec<f64>,
    ratio_penalty: Vec<f64>,
}

impl Scratch {
    /// The target slot holds a seed module ("SeedInfo present").
    fn has_seed(&self, x: &RewardInputs, e: usize) -> bool {
        x.stage[self.target[e]].has_seed()
    }
}

/// Empty `col`, then fill it with `len` copies of `value` (keeps its memory).
fn refill<T: Clone>(col: &mut Vec<T>, len: usize, value: T) {
    col.clear();
    col.resize(len, value);
}

impl RewardOutputs {
    pub fn term(&self, term: Term, env: usize) -> f64 {
        self.terms[term as usize * self.raw.len() + env]
    }

    /// The `[E]` column of one term.
    pub fn term_column(&self, term: Term) -> &[f64] {
        let n = self.raw.len();
        &self.terms[term as usize * n..(term as usize + 1) * n]
    }

    fn resize(&mut self, n_envs: usize, n_slots: usize) {
        refill(&mut self.raw, n_envs, 0.0);
        refill(&mut self.terms, Term::COUNT * n_envs, 0.0);
        refill(&mut self.escrow_credit, n_envs * n_slots, 0.0);
        refill(&mut self.proposed_drip, n_envs, None);
        for col in [&mut self.effective_seed_params, &mut self.alpha_delta_sq_sum, &mut self.fossil_params] {
            refill(col, n_envs, 0.0);
        }
        refill(&mut self.n_active, n_envs, 0);
        refill(&mut self.contribution, n_envs, None);
        refill(&mut self.progress, n_envs, None);
        refill(&mut self.scratch.target, n_envs, 0);
        refill(&mut self.scratch.discount, n_envs, 1.0);
        refill(&mut self.scratch.ratio_penalty, n_envs, 0.0);
    }

    fn column_mut(terms: &mut [f64], n_envs: usize, term: Term) -> &mut [f64] {
        &mut terms[term as usize * n_envs..(term as usize + 1) * n_envs]
    }
}

/// The reward of every env this step into `out` (allocation-free once `out` has held a batch of this
/// shape). `config` must be valid ([`RewardConfig::validate`]).
pub fn compute_rewards(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let (n, s) = (x.n_envs, x.n_slots);
    out.resize(n, s);
    out.escrow_credit.copy_from_slice(&x.escrow_credit[..n * s]);
    gather_shared_inputs(config, x, out);
    if config.family == RewardFamily::Loss {
        loss_family_terms(config, x, out);
    } else {
        match config.mode {
            RewardMode::Shaped | RewardMode::Escrow => shaped_terms(config, x, out),
            RewardMode::Basic | RewardMode::BasicPlus => basic_terms(config, x, out),
            RewardMode::Sparse | RewardMode::Minimal => sparse_terms(config, x, out),
            RewardMode::Simplified => simplified_terms(config, x, out),
        }
    }
    // Pending terms (simic §2.9 steps 3–4): every mode and family pays them.
    for e in (0..n).filter(|&e| !x.skip[e]) {
        out.terms[Term::AutoPrunePenalty as usize * n + e] = x.pending_auto_prune_penalty[e];
        out.terms[Term::HindsightCredit as usize * n + e] = x.pending_hindsight_credit[e];
    }
    // −0.0 + 0.0 = +0.0: a term that is zero reads as 0, not −0, in the metrics.
    for v in &mut out.terms {
        *v += 0.0;
    }
    // raw = Σ terms, in Term order; a skipped env keeps 0 everywhere.
    for t in 0..Term::COUNT {
        let column = &out.terms[t * n..(t + 1) * n];
        for (r, &v) in out.raw.iter_mut().zip(column) {
            *r += v;
        }
    }
}

/// The target slot's columns and the env-wide sums of §2.0.
fn gather_shared_inputs(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let (n, s) = (x.n_envs, x.n_slots);
    let host_floor = x.host_params.max(config.rent_host_params_floor);
    let sc = &mut out.scratch;
    for e in 0..n {
        let k = x.target_slot[e] as usize;
        let i = x.at(e, k);
        sc.target[e] = i;
        out.contribution[e] = if x.stage[i].has_seed() { x.contribution[i] } else { None };
        let acc = if config.mode == RewardMode::Escrow { x.stable_val_acc[e] } else { x.val_acc[e] };
        out.progress[e] = x.acc_at_germination[i].map(|g| acc - g);
    }
    for e in 0..n {
        let (mut esp, mut shock, mut active, mut fossil_params) = (0.0, 0.0, 0, 0.0);
        for k in 0..s {
            let i = x.at(e, k);
            let stage = x.stage[i];
            if matches!(stage, SeedStage::Blending | SeedStage::Holding | SeedStage::Fossilized) {
                esp += BASE_SLOT_RENT_RATIO * x.host_params + x.alpha[i] * x.params[i];
            }
            if x.host_params > 0.0 && x.prev_params[i] > 0.0 {
                let d = x.alpha[i] - x.prev_alpha[i];
                shock += d * d * x.prev_params[i] / host_floor;
            }
            if stage.has_state() && !matches!(stage, SeedStage::Fossilized | SeedStage::Pruned) {
                active += 1;
            }
            if stage == SeedStage::Fossilized {
                fossil_params += x.params[i];
            }
        }
        out.effective_seed_params[e] = esp;
        out.alpha_delta_sq_sum[e] = shock;
        out.n_active[e] = active;
        out.fossil_params[e] = fossil_params;
    }
}

/// Is `t` the episode's last epoch? (`max_epochs` 0: the episode has no last epoch.)
fn is_terminal(x: &RewardInputs) -> bool {
    x.max_epochs > 0 && x.epoch == x.max_epochs
}

/// SHAPED and ESCROW (§2.3, §2.4, §2.9 steps 1–2).
fn shaped_terms(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let (n, s) = (x.n_envs, x.n_slots);
    let escrow = config.mode == RewardMode::Escrow;
    let pbrs_on = !config.disable_pbrs;
    let terminal = is_terminal(x);
    let RewardOutputs { terms, scratch: sc, contribution, progress, escrow_credit, .. } = out;
    let skip = |e: usize| x.skip[e];

    // Anti-gaming gates: only where the target seed has a contribution.
    for e in 0..n {
        sc.discount[e] = 1.0;
        sc.ratio_penalty[e] = 0.0;
        let (Some(c), true) = (contribution[e], sc.has_seed(x, e)) else { continue };
        let cf = x.cf_imp[e].expect("a measured contribution implies an ablation, so cf_imp exists");
        let disc = if escrow { 1.0 } else { attribution_discount(cf) };
        sc.discount[e] = disc;
        if !config.disable_anti_gaming && c > 1.0 && disc >= 0.5 {
            sc.ratio_penalty[e] = if cf > IMPROVEMENT_SAFE {
                let rho = c / cf;
                if rho > HACKING_RATIO {
                    -(0.3f64).min(0.1 * (rho - HACKING_RATIO) / HACKING_RATIO)
                } else {
                    0.0
                }
            } else {
                -0.3 * (c / 10.0).min(1.0)
            };
        }
    }

    // Attribution. ESCROW settles the target slot's credit first, seed or not (a PRUNE repays it).
    let attribution = RewardOutputs::column_mut(terms, n, Term::Attribution);
    for e in (0..n).filter(|&e| !skip(e) && (escrow || sc.has_seed(x, e))) {
        let (i, op) = (sc.target[e], x.op[e]);
        let (stage, c) = (x.stage[i], contribution[e]);
        if escrow {
            let prev = x.escrow_credit[i];
            let (a, delta) = match c {
                _ if op == LifecycleOp::Prune => (-prev, -prev),
                _ if stage == SeedStage::Fossilized => (0.0, 0.0),
                None => (0.0, 0.0),
                Some(c) if c < 0.0 => (CONTRIBUTION_WEIGHT * c - prev, -prev),
                Some(c) => {
                    let att = match progress[e] {
                        None => 0.5 * c,
                        Some(p) if p > 0.0 && c >= p => (p * c).sqrt(),
                        Some(p) if p > 0.0 => c,
                        Some(_) => 0.0,
                    };
                    let target = (CONTRIBUTION_WEIGHT * att + sc.ratio_penalty[e]).max(0.0);
                    let d = (target - prev).clamp(-ESCROW_DELTA_CLIP, ESCROW_DELTA_CLIP);
                    (d, d)
                }
            };
            // The FOSSILIZE zeroing runs in escrow too, after the credit change was decided: the
            // credit still moves by `delta`, the step just does not pay it.
            let zeroed = op == LifecycleOp::Fossilize && x.cf_imp[e].is_some_and(|cf| cf < 0.0);
            attribution[e] = if zeroed { 0.0 } else { a };
            escrow_credit[i] = prev + delta;
            continue;
        }
        if stage == SeedStage::Fossilized {
            continue;
        }
        let mut a = match c {
            Some(c) if c < 0.0 => CONTRIBUTION_WEIGHT * c,
            Some(c) => {
                let att = match progress[e] {
                    None => 0.5 * c,
                    Some(p) if p <= 0.0 => 0.0,
                    Some(p) => harmonic(p, c),
                };
                let g = x.epoch as f64 - x.seed_age[i] as f64;
                CONTRIBUTION_WEIGHT * att * sc.discount[e] * timing_discount(g)
            }
            None => {
                let improvement = x.improvement_since_stage_start[i];
                if stage.value() >= SeedStage::Blending.value() && improvement > 0.0 {
                    PROXY_CONFIDENCE * improvement
                } else {
                    0.0
                }
            }
        };
        if op == LifecycleOp::Fossilize && x.cf_imp[e].is_some_and(|cf| cf < 0.0) {
            a = 0.0;
        }
        if op == LifecycleOp::Prune {
            a = -a;
        }
        attribution[e] = a + sc.ratio_penalty[e];
    }

    // Warnings.
    for e in (0..n).filter(|&e| !skip(e) && sc.has_seed(x, e)) {
        let t = sc.target[e];
        let (stage, eis) = (x.stage[t], x.epochs_in_stage[t]);
        if stage == SeedStage::Blending && x.cf_imp[e].is_some_and(|cf| cf < 0.0) {
            terms[Term::BlendingWarning as usize * n + e] = -0.1 - (0.05 * eis as f64).min(0.3);
        }
        let a = terms[Term::Attribution as usize * n + e];
        if stage == SeedStage::Holding
            && !matches!(x.op[e], LifecycleOp::Fossilize | LifecycleOp::Prune)
            && eis >= 2
            && a > 0.0
        {
            terms[Term::HoldingWarning as usize * n + e] = -(0.1 + 0.05 * (eis as f64 - 2.0)).min(0.3);
        }
    }

    // PBRS.
    if pbrs_on {
        pbrs_column(x, sc, RewardOutputs::column_mut(terms, n, Term::Pbrs));
    }

    // Synergy.
    for e in (0..n).filter(|&e| !skip(e) && sc.has_seed(x, e)) {
        let i = sc.target[e];
        let a = terms[Term::Attribution as usize * n + e];
        let isum = x.interaction_sum[i];
        if sc.discount[e] >= 0.5 && a > 0.0 && isum > 0.0 {
            terms[Term::Synergy as usize * n + e] = 0.1 * (0.5 * isum).tanh();
        }
    }

    // Rent, alpha shock, occupancy and fossil rent.
    let host_floor = x.host_params.max(config.rent_host_params_floor);
    for e in (0..n).filter(|&e| !skip(e)) {
        let esp = out.effective_seed_params[e];
        if esp > 0.0 {
            let g = esp / host_floor;
            terms[Term::Rent as usize * n + e] = -(RENT_WEIGHT * g.ln_1p()).min(MAX_RENT);
        }
        if !config.disable_anti_gaming {
            terms[Term::AlphaShock as usize * n + e] =
                -(ALPHA_SHOCK_COEF * out.alpha_delta_sq_sum[e]).min(ALPHA_SHOCK_CAP);
        }
        let held = (out.n_active[e] + x.n_fossil[e]) as f64;
        terms[Term::Occupancy as usize * n + e] = -OCCUPANCY_COST * (held - FREE_SLOTS).max(0.0);
        terms[Term::FossilRent as usize * n + e] = -FOSSIL_MAINTENANCE * x.n_fossil[e] as f64;
    }

    // Action shaping.
    for e in (0..n).filter(|&e| !skip(e)) {
        let t = sc.target[e];
        let (stage, eis, age) = (x.stage[t], x.epochs_in_stage[t], x.seed_age[t]);
        let seed = sc.has_seed(x, e);
        let (c, cf) = (contribution[e], x.cf_imp[e]);
        let legitimacy = (eis as f64 / MIN_HOLDING_EPOCHS).min(1.0);
        let shaping = match x.op[e] {
            LifecycleOp::Wait => 0.0,
            LifecycleOp::Germinate => {
                let bonus = if seed {
                    GERMINATE_WITH_SEED_PENALTY
                } else if pbrs_on && !is_terminal(x) {
                    PBRS_WEIGHT
                        * GAMMA
                        * stage_potential(SeedStage::Germinated)
                        * timing_discount(x.epoch as f64)
                } else {
                    0.0
                };
                bonus + GERMINATE_COST
            }
            LifecycleOp::Fossilize => {
                let foss = match (seed && stage == SeedStage::Holding, cf) {
                    (false, _) | (true, None) => INVALID_FOSSILIZE_PENALTY,
                    (true, Some(cf)) if cf < 0.0 => {
                        let ransom = if c.is_some_and(|c| c > 0.1) && cf < -0.2 { 0.3 } else { 0.0 };
                        -0.5 - (0.2 * cf.abs()).min(1.0) - ransom
                    }
                    (true, Some(_)) => match c {
                        Some(c) if c >= MIN_FOSSILIZE_CONTRIBUTION => {
                            (FOSSILIZE_BASE_BONUS + FOSSILIZE_CONTRIBUTION_SCALE * c) * legitimacy
                        }
                        _ => FOSSILIZE_NONCONTRIBUTING_PENALTY,
                    },
                };
                let valid = seed
                    && stage == SeedStage::Holding
                    && cf.is_some_and(|cf| cf >= 0.0)
                    && c.is_some_and(|c| c >= MIN_FOSSILIZE_CONTRIBUTION)
                    && !config.disable_terminal_reward;
                let bonus = if valid {
                    FOSSILIZE_TERMINAL_SCALE * (1.0 / FOSSILIZE_QUALITY_CEILING).tanh() * legitimacy
                } else {
                    0.0
                };
                foss + FOSSILIZE_COST + bonus
            }
            LifecycleOp::Prune => {
                let forfeit = if pbrs_on && seed { PBRS_WEIGHT * (0.0 - potential(stage, eis)) } else { 0.0 };
                let prune = if !seed {
                    PRUNE_NO_SEED_PENALTY
                } else if stage == SeedStage::Fossilized {
                    PRUNE_FOSSILIZED_PENALTY
                } else if age < MIN_PRUNE_AGE {
                    -0.3 * (MIN_PRUNE_AGE - age) as f64
                } else {
                    match c {
                        None => 0.0,
                        Some(c) if c < PRUNE_HURTING_THRESHOLD => {
                            if age < MIN_PRUNE_BONUS_AGE {
                                -0.1
                            } else {
                                PRUNE_HURTING_BONUS
                            }
                        }
                        Some(c) if c < 0.0 => PRUNE_ACCEPTABLE_BONUS,
                        Some(c) => (PRUNE_GOOD_SEED_PENALTY - 0.05 * c).max(-0.9),
                    }
                };
                forfeit + prune + PRUNE_COST
            }
            LifecycleOp::Advance => {
                if seed && stage == SeedStage::Training {
                    ADVANCE_FROM_TRAINING_PENALTY
                } else {
                    0.0
                }
            }
            LifecycleOp::SetAlphaTarget => SET_ALPHA_COST,
        };
        terms[Term::ActionShaping as usize * n + e] = shaping;
    }

    // Terminal accuracy, escrow forfeit, germination clawback.
    if terminal {
        for e in (0..n).filter(|&e| !skip(e)) {
            if !config.disable_terminal_reward {
                terms[Term::Terminal as usize * n + e] = TERMINAL_ACC_WEIGHT * x.val_acc[e];
            }
            if escrow {
                let mut forfeit = 0.0;
                for k in 0..s {
                    let i = x.at(e, k);
                    if x.stage[i].has_state()
                        && !matches!(x.stage[i], SeedStage::Fossilized | SeedStage::Pruned)
                    {
                        forfeit += escrow_credit[i];
                    }
                }
                terms[Term::EscrowForfeit as usize * n + e] = -forfeit;
            }
            if pbrs_on {
                let mut clawback = 0.0;
                for k in 0..s {
                    let i = x.at(e, k);
                    if matches!(x.stage[i], SeedStage::Germinated | SeedStage::Training) {
                        let bonus = PBRS_WEIGHT * GAMMA * stage_potential(SeedStage::Germinated);
                        clawback += bonus / GAMMA.powi(x.seed_age[i] as i32);
                    }
                }
                terms[Term::Clawback as usize * n + e] = -clawback;
            }
        }
    }
}

/// The PBRS bonus of the target slot's seed (§2.2) into `column`.
fn pbrs_column(x: &RewardInputs, sc: &Scratch, column: &mut [f64]) {
    for e in (0..x.n_envs).filter(|&e| !x.skip[e] && sc.has_seed(x, e)) {
        let i = sc.target[e];
        let (stage, eis) = (x.stage[i], x.epochs_in_stage[i]);
        let prev = if eis == 0 {
            potential(x.previous_stage[i], x.previous_epochs_in_stage[i])
        } else {
            potential(stage, eis - 1)
        };
        column[e] = PBRS_WEIGHT * (GAMMA * potential(stage, eis) - prev);
    }
}

/// BASIC and BASIC_PLUS (§2.5).
fn basic_terms(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let (n, s) = (x.n_envs, x.n_slots);
    let drip_fraction = config.drip_fraction();
    let RewardOutputs { terms, scratch: sc, contribution, proposed_drip, .. } = out;
    if !config.disable_pbrs {
        pbrs_column(x, sc, RewardOutputs::column_mut(terms, n, Term::Pbrs));
        for e in (0..n).filter(|&e| !x.skip[e] && sc.has_seed(x, e) && x.op[e] == LifecycleOp::Prune) {
            let t = sc.target[e];
            terms[Term::Pbrs as usize * n + e] =
                PBRS_WEIGHT * (0.0 - potential(x.stage[t], x.epochs_in_stage[t]));
        }
    }
    for e in (0..n).filter(|&e| !x.skip[e]) {
        terms[Term::Rent as usize * n + e] =
            -config.param_penalty_weight * out.effective_seed_params[e] / config.param_budget;
    }
    for e in (0..n).filter(|&e| !x.skip[e] && sc.has_seed(x, e) && x.op[e] == LifecycleOp::Fossilize) {
        let (t, c) = (sc.target[e], contribution[e]);
        let foss = if x.stage[t] != SeedStage::Holding {
            BASIC_FOSSILIZE_INVALID
        } else {
            let improvement = x.cf_imp[e].unwrap_or(0.0);
            match c {
                Some(c) if improvement > 0.0 && c >= MIN_FOSSILIZE_CONTRIBUTION => {
                    let legitimacy = (x.epochs_in_stage[t] as f64 / MIN_HOLDING_EPOCHS).min(1.0);
                    // The plain harmonic mean here (the reference's `_compute_attributed_value`), not
                    // SHAPED's capped attribution.
                    let mean = 2.0 * improvement * c / (improvement + c).max(1e-8);
                    let full =
                        (BASIC_FOSSILIZE_BASE_BONUS + BASIC_FOSSILIZE_CONTRIBUTION_SCALE * mean) * legitimacy;
                    if drip_fraction > 0.0 {
                        let remaining = (x.max_epochs as f64 - x.epoch as f64).max(MIN_DRIP_EPOCHS);
                        proposed_drip[e] = Some(drip_fraction * full / remaining);
                        (1.0 - drip_fraction) * full
                    } else {
                        full
                    }
                }
                Some(c) if improvement <= 0.0 && c > 0.1 => BASIC_FOSSILIZE_INVALID,
                _ => BASIC_FOSSILIZE_NONCONTRIBUTING,
            }
        };
        terms[Term::Fossilize as usize * n + e] = foss;
    }
    if is_terminal(x) {
        for e in (0..n).filter(|&e| !x.skip[e]) {
            terms[Term::Terminal as usize * n + e] = config.basic_acc_delta_weight * x.acc_delta[e] / 100.0;
        }
    }
    if drip_fraction > 0.0 {
        for e in (0..n).filter(|&e| !x.skip[e]) {
            let mut drip = 0.0;
            for k in 0..s {
                let i = x.at(e, k);
                let Some(scale) = x.drip_scale[i] else { continue };
                // Fossils stay in the ablation set under drip, so `c` is measured; the reference
                // raises where it is missing, esper-ecs pays no drip.
                let Some(c) = x.contribution[i] else { continue };
                drip += (scale * c).clamp(-MAX_DRIP_PER_EPOCH * NEGATIVE_DRIP_RATIO, MAX_DRIP_PER_EPOCH);
            }
            terms[Term::Drip as usize * n + e] = drip;
        }
    }
}

/// SPARSE and MINIMAL (§2.6).
fn sparse_terms(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let n = x.n_envs;
    let RewardOutputs { terms, scratch: sc, fossil_params, .. } = out;
    if is_terminal(x) {
        for e in (0..n).filter(|&e| !x.skip[e]) {
            let value = x.committed_val_acc[e] / 100.0
                - config.param_penalty_weight * fossil_params[e] / config.param_budget;
            terms[Term::Terminal as usize * n + e] = config.sparse_reward_scale * value.clamp(-1.0, 1.0);
        }
    }
    if config.mode == RewardMode::Minimal {
        for e in (0..n).filter(|&e| !x.skip[e]) {
            if x.op[e] == LifecycleOp::Prune
                && sc.has_seed(x, e)
                && x.seed_age[sc.target[e]] < EARLY_PRUNE_THRESHOLD
            {
                terms[Term::ActionShaping as usize * n + e] = EARLY_PRUNE_PENALTY;
            }
        }
    }
}

/// SIMPLIFIED (§2.7).
fn simplified_terms(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let n = x.n_envs;
    let RewardOutputs { terms, scratch: sc, .. } = out;
    if !config.disable_pbrs {
        pbrs_column(x, sc, RewardOutputs::column_mut(terms, n, Term::Pbrs));
    }
    for e in (0..n).filter(|&e| !x.skip[e]) {
        if x.op[e] != LifecycleOp::Wait {
            terms[Term::ActionShaping as usize * n + e] = SIMPLIFIED_ACTION_COST;
        }
        if is_terminal(x) && !config.disable_terminal_reward {
            terms[Term::Terminal as usize * n + e] = SIMPLIFIED_ACC_WEIGHT * x.val_acc[e] / 100.0
                + SIMPLIFIED_FOSSIL_WEIGHT * x.n_contrib_fossil[e] as f64;
        }
    }
}

/// The loss family (§2.8), with the reference's sign error fixed: `loss_delta` arrives as the tracker's
/// `L_{t−1} − L_t` (positive = better) and the formula wants `L_t − L_{t−1}`, so it is negated; the
/// first epoch has no previous loss and counts as no change.
fn loss_family_terms(config: &RewardConfig, x: &RewardInputs, out: &mut RewardOutputs) {
    let (n, s) = (x.n_envs, x.n_slots);
    let l = &config.loss;
    let RewardOutputs { terms, scratch: sc, .. } = out;
    for e in (0..n).filter(|&e| !x.skip[e]) {
        let delta = if x.loss_delta[e].is_finite() { -x.loss_delta[e] } else { 0.0 };
        let mut z = (delta / l.typical_loss_delta_std).clamp(-l.max_loss_delta, l.max_loss_delta);
        if z > 0.0 {
            z *= l.regression_penalty_scale;
        }
        terms[Term::LossDelta as usize * n + e] = -l.loss_delta_weight * z;

        // `total_params − host_params`: Σ over the slots of the reference's `active_seed_params`.
        let mut seed_params = 0.0;
        for k in 0..s {
            let i = x.at(e, k);
            if x.stage[i].has_seed() {
                seed_params += x.trainable_params[i];
            }
        }
        let host = x.host_params;
        // The grace period only shields a seed in the target slot; without one, rent is due at once.
        let in_grace = sc.has_seed(x, e) && x.seed_age[sc.target[e]] < l.grace_epochs;
        if seed_params > 0.0 && host > 0.0 && !in_grace {
            let growth = seed_params / host;
            terms[Term::Rent as usize * n + e] =
                -(l.compute_rent_weight * growth.ln_1p()).min(l.max_rent_penalty);
        }
        if sc.has_seed(x, e) {
            let i = sc.target[e];
            terms[Term::StagePotential as usize * n + e] = l.stage_potential_weight
                * (GAMMA * stage_potential(x.stage[i]) - stage_potential(x.previous_stage[i]));
        }
        if is_terminal(x) {
            let span = l.baseline_loss - l.target_loss;
            terms[Term::Terminal as usize * n + e] =
                ((l.baseline_loss - x.val_loss[e]) / span).clamp(0.0, 1.0) * l.terminal_weight;
        }
    }
}

/// The shared reward normaliser (simic §4.6): one instance for all envs, updated once per env-step in
/// env order with Welford's algorithm; it divides by the running standard deviation (no mean
/// subtraction; std floored at `1e-8`) and clips to ±10.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RewardNormalizer {
    pub count: u64,
    pub mean: f64,
    pub m2: f64,
}

/// `reward clip`.
pub const REWARD_CLIP: f64 = 10.0;
const REWARD_STD_FLOOR: f64 = 1e-8;

impl Default for RewardNormalizer {
    fn default() -> Self {
        Self::new()
    }
}

impl RewardNormalizer {
    pub const fn new() -> Self {
        Self { count: 0, mean: 0.0, m2: 0.0 }
    }

    /// Add `reward` to the statistics, then return it divided by the updated standard deviation and
    /// clipped (the std is 1 until two samples are in).
    pub fn update_and_normalize(&mut self, reward: f64) -> f64 {
        self.count += 1;
        let delta = reward - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (reward - self.mean);
        (reward / self.std()).clamp(-REWARD_CLIP, REWARD_CLIP)
    }

    /// The sample standard deviation, floored (1 before two samples).
    pub fn std(&self) -> f64 {
        if self.count < 2 { 1.0 } else { (self.m2 / (self.count - 1) as f64).sqrt().max(REWARD_STD_FLOOR) }
    }
}
