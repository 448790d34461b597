//! A second, independent oracle for the batched reward kernel: a per-env scalar reward written
//! straight from the spec (simic §2, §1.3 D, with the reference corrections listed below), and a
//! property test that `compute_rewards` equals it on random batches, for every mode and the loss
//! family.
//!
//! Nothing here is taken from the kernel's code: only its public API (`RewardInputs`,
//! `RewardOutputs`, `Term`, `Term::of`) is used. Every formula is restated from the spec text, with
//! these corrections from the reference source (they override the spec where they differ):
//! * pending terms (auto-prune penalty, hindsight credit) are added in every mode and family;
//! * ESCROW: the FOSSILIZE/`cf_imp < 0` zeroing also runs (the paid attribution is 0, the credit still
//!   moves), the forfeit sums `credit_next` over slots with a state that are not FOSSILIZED/PRUNED,
//!   the discount is 1, progress uses `stable_val_acc`;
//! * `alpha_delta_sq_sum` only sums slots with `host_params > 0` and `prev_params > 0`;
//! * SHAPED proxy path only for a non-fossilized seed at stage ≥ BLENDING with improvement > 0;
//! * BASIC_PLUS: 30 % of the fossilize bonus now, the rest proposed as a drip scale;
//! * LOSS family: the sign error is fixed (`d = −loss_delta`, 0 when not finite);
//! * SeedInfo exists ⇔ the target slot's stage carries a seed module (GERMINATED..FOSSILIZED);
//! * a skipped (rolled back) env has raw 0, every term 0 and its escrow credit unchanged.
//!
//! Two readings of the spec text, both as the reference code has them: BASIC's fossilize bonus uses
//! the plain harmonic mean `2Ic / max(I + c, 1e-8)` (the `c if c < p` cap is SHAPED's attribution
//! rule), and ESCROW's PRUNE path comes first, before the FOSSILIZED and no-contribution paths. The
//! kernel first read both differently (this oracle found it); the last two tests keep each case on
//! one env.

use esper_components::reward_config::{LossRewardConfig, RewardConfig, RewardFamily, RewardMode};
use esper_components::{LifecycleOp, SeedStage};
use esper_kernels::reward::{RewardInputs, RewardOutputs, Term, compute_rewards};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

// ---------------------------------------------------------------------------------------------
// Spec constants (simic §2.2, §2.10). Written out here, not imported, so the oracle stays ours.
// ---------------------------------------------------------------------------------------------

/// γ (§2.0: 0.995 everywhere).
const GAMMA: f64 = 0.995;
const PBRS_WEIGHT: f64 = 0.3;
const EPOCH_PROGRESS_BONUS: f64 = 0.3;
const MAX_PROGRESS_BONUS: f64 = 2.0;
const CONTRIBUTION_WEIGHT: f64 = 1.0;
const PROXY_WEIGHT: f64 = 0.3;
const SIGMOID_STEEPNESS: f64 = 3.0;
const HACKING_RATIO: f64 = 5.0;
const SAFE_IMPROVEMENT: f64 = 0.1;
const WARMUP_EPOCHS: f64 = 10.0;
const DISCOUNT_FLOOR: f64 = 0.4;
const RENT_WEIGHT: f64 = 0.5;
const MAX_RENT: f64 = 1.5;
const BASE_SLOT_RENT_RATIO: f64 = 0.0039;
const ALPHA_SHOCK_COEF: f64 = 0.1958;
const ALPHA_SHOCK_CAP: f64 = 1.0;
const OCCUPANCY_COST: f64 = 0.01;
const FREE_SLOTS: i64 = 1;
const FOSSIL_MAINTENANCE: f64 = 0.002;
const MIN_HOLDING_EPOCHS: f64 = 5.0;
const MIN_FOSSILIZE_CONTRIBUTION: f64 = 1.0;
const MIN_PRUNE_AGE: u32 = 5;
const ESCROW_DELTA_CLIP: f64 = 2.0;
const TERMINAL_ACC_WEIGHT: f64 = 0.05;
const DRIP_FRACTION: f64 = 0.7;
const MAX_DRIP: f64 = 0.1;
const NEGATIVE_DRIP_RATIO: f64 = 0.5;
const MIN_DRIP_EPOCHS: u32 = 5;

// ---------------------------------------------------------------------------------------------
// Small spec functions
// ---------------------------------------------------------------------------------------------

/// Φ(stage), §2.2.
fn stage_phi(stage: SeedStage) -> f64 {
    match stage {
        SeedStage::Germinated => 1.0,
        SeedStage::Training => 2.0,
        SeedStage::Blending => 3.5,
        SeedStage::Holding => 5.5,
        SeedStage::Fossilized => 6.0,
        SeedStage::Unknown
        | SeedStage::Dormant
        | SeedStage::Pruned
        | SeedStage::Embargoed
        | SeedStage::Resetting => 0.0,
    }
}

/// φ(stage, e) = Φ(stage) + min(0.3·e, 2.0).
fn phi(stage: SeedStage, e: u32) -> f64 {
    stage_phi(stage) + (EPOCH_PROGRESS_BONUS * f64::from(e)).min(MAX_PROGRESS_BONUS)
}

/// The per-step PBRS bonus of §2.2.
fn pbrs_bonus(stage: SeedStage, e: u32, previous_stage: SeedStage, previous_e: u32) -> f64 {
    let phi_prev = if e == 0 { phi(previous_stage, previous_e) } else { phi(stage, e - 1) };
    PBRS_WEIGHT * (GAMMA * phi(stage, e) - phi_prev)
}

/// The timing discount τ(g): 1 for g ≥ 10, else 0.4 + 0.6·g/10.
fn tau(g: f64) -> f64 {
    if g >= WARMUP_EPOCHS { 1.0 } else { DISCOUNT_FLOOR + (1.0 - DISCOUNT_FLOOR) * g / WARMUP_EPOCHS }
}

/// The anti-gaming discount: 1 if cf ≥ 0, else 1 / (1 + exp(min(3·|cf|, 700))).
fn disc(cf: f64) -> f64 {
    if cf >= 0.0 { 1.0 } else { 1.0 / (1.0 + (SIGMOID_STEEPNESS * cf.abs()).min(700.0).exp()) }
}

/// The harmonic mean 2pc / max(p + c, 1e-8).
fn harmonic_mean(p: f64, c: f64) -> f64 {
    2.0 * p * c / (p + c).max(1e-8)
}

/// Legitimacy L = min(1, e/5).
fn legitimacy(e: u32) -> f64 {
    (f64::from(e) / MIN_HOLDING_EPOCHS).min(1.0)
}

/// The slot holds a seed module (SeedInfo exists for it): GERMINATED..FOSSILIZED.
fn has_seed(stage: SeedStage) -> bool {
    matches!(
        stage,
        SeedStage::Germinated
            | SeedStage::Training
            | SeedStage::Blending
            | SeedStage::Holding
            | SeedStage::Fossilized
    )
}

/// The slot has a seed state at all (anything but DORMANT / UNKNOWN).
fn has_state(stage: SeedStage) -> bool {
    !matches!(stage, SeedStage::Dormant | SeedStage::Unknown)
}

/// Counts toward `n_active` and the escrow forfeit: a state that is not FOSSILIZED or PRUNED.
fn is_live(stage: SeedStage) -> bool {
    has_state(stage) && !matches!(stage, SeedStage::Fossilized | SeedStage::Pruned)
}

// ---------------------------------------------------------------------------------------------
// The scalar reward of one env
// ---------------------------------------------------------------------------------------------

/// Everything the scalar reward produces for one env.
#[derive(Clone, Debug)]
struct EnvReward {
    raw: f64,
    terms: [f64; Term::COUNT],
    /// `[S]` escrow credit after the step.
    credit: Vec<f64>,
    proposed_drip: Option<f64>,
    effective_seed_params: f64,
    alpha_delta_sq_sum: f64,
    n_active: u32,
    fossil_params: f64,
    contribution: Option<f64>,
    progress: Option<f64>,
}

impl EnvReward {
    fn set(&mut self, term: Term, value: f64) {
        self.terms[term as usize] = value;
    }

    fn get(&self, term: Term) -> f64 {
        self.terms[term as usize]
    }
}

/// The reward of env `e`, computed on its own from the spec.
fn scalar_reward(cfg: &RewardConfig, x: &RewardInputs, e: usize) -> EnvReward {
    let s = x.n_slots;
    let slot = |k: usize| e * s + k;
    let t = x.epoch;
    let big_t = x.max_epochs;
    let terminal = t == big_t;
    let host = x.host_params;
    let host_floor = host.max(cfg.rent_host_params_floor);

    // §2.0 shared inputs (all slots of the env).
    let mut effective_seed_params = 0.0;
    let mut alpha_delta_sq_sum = 0.0;
    let mut n_active = 0u32;
    let mut fossil_params = 0.0;
    for k in 0..s {
        let i = slot(k);
        if matches!(x.stage[i], SeedStage::Blending | SeedStage::Holding | SeedStage::Fossilized) {
            effective_seed_params += BASE_SLOT_RENT_RATIO * host + x.alpha[i] * x.params[i];
        }
        if host > 0.0 && x.prev_params[i] > 0.0 {
            let d = x.alpha[i] - x.prev_alpha[i];
            alpha_delta_sq_sum += d * d * x.prev_params[i] / host_floor;
        }
        if is_live(x.stage[i]) {
            n_active += 1;
        }
        if x.stage[i] == SeedStage::Fossilized {
            fossil_params += x.params[i];
        }
    }

    let escrow = cfg.family == RewardFamily::Contribution && cfg.mode == RewardMode::Escrow;
    let k = usize::from(x.target_slot[e]);
    let tgt = slot(k);
    let stage = x.stage[tgt];
    let seed = has_seed(stage);
    let c = if seed { x.contribution[tgt] } else { None };
    let progress_acc = if escrow { x.stable_val_acc[e] } else { x.val_acc[e] };
    let progress = x.acc_at_germination[tgt].map(|g| progress_acc - g);

    let mut r = EnvReward {
        raw: 0.0,
        terms: [0.0; Term::COUNT],
        credit: x.escrow_credit[slot(0)..slot(0) + s].to_vec(),
        proposed_drip: None,
        effective_seed_params,
        alpha_delta_sq_sum,
        n_active,
        fossil_params,
        contribution: c,
        progress,
    };
    if x.skip[e] {
        return r;
    }

    let op = x.op[e];
    let cf = x.cf_imp[e];
    let ep = x.epochs_in_stage[tgt];
    let age = x.seed_age[tgt];

    if cfg.family == RewardFamily::Loss {
        loss_family(cfg, x, e, &mut r);
    } else {
        match cfg.mode {
            RewardMode::Shaped | RewardMode::Escrow => shaped(cfg, x, e, escrow, &mut r),
            RewardMode::Basic | RewardMode::BasicPlus => {
                let plus = cfg.mode == RewardMode::BasicPlus;
                // PBRS_b; PRUNE forfeits: 0.3·(γ·0 − φ(stage, e)).
                if seed && !cfg.disable_pbrs {
                    let pbrs = if op == LifecycleOp::Prune {
                        PBRS_WEIGHT * (GAMMA * 0.0 - phi(stage, ep))
                    } else {
                        pbrs_bonus(stage, ep, x.previous_stage[tgt], x.previous_epochs_in_stage[tgt])
                    };
                    r.set(Term::Pbrs, pbrs);
                }
                // Rent_b = param_penalty_weight · effective_seed_params / param_budget.
                r.set(Term::Rent, -cfg.param_penalty_weight * effective_seed_params / cfg.param_budget);
                // Foss_b.
                if op == LifecycleOp::Fossilize && seed {
                    let foss = if stage != SeedStage::Holding {
                        -0.5
                    } else {
                        let imp = cf.unwrap_or(0.0);
                        match c {
                            Some(cv) if imp > 0.0 && cv >= MIN_FOSSILIZE_CONTRIBUTION => {
                                let full = (0.3 + 0.5 * harmonic_mean(imp, cv)) * legitimacy(ep);
                                if plus {
                                    let remaining = big_t.saturating_sub(t).max(MIN_DRIP_EPOCHS);
                                    r.proposed_drip = Some(DRIP_FRACTION * full / f64::from(remaining));
                                    (1.0 - DRIP_FRACTION) * full
                                } else {
                                    full
                                }
                            }
                            Some(cv) if imp <= 0.0 && cv > 0.1 => -0.5,
                            _ => -0.2,
                        }
                    };
                    r.set(Term::Fossilize, foss);
                }
                // Term_b: the last epoch's accuracy delta, not gated by disable_terminal_reward.
                if terminal {
                    r.set(Term::Terminal, cfg.basic_acc_delta_weight * x.acc_delta[e] / 100.0);
                }
                // Drip: every slot with a drip state and a measured contribution.
                if plus {
                    let mut drip = 0.0;
                    for kk in 0..s {
                        let i = slot(kk);
                        if let (Some(scale), Some(cv)) = (x.drip_scale[i], x.contribution[i]) {
                            drip += (scale * cv).clamp(-NEGATIVE_DRIP_RATIO * MAX_DRIP, MAX_DRIP);
                        }
                    }
                    r.set(Term::Drip, drip);
                }
            }
            RewardMode::Sparse | RewardMode::Minimal => {
                if terminal {
                    let base = x.committed_val_acc[e] / 100.0
                        - cfg.param_penalty_weight * fossil_params / cfg.param_budget;
                    r.set(Term::Terminal, cfg.sparse_reward_scale * base.clamp(-1.0, 1.0));
                }
                if cfg.mode == RewardMode::Minimal && op == LifecycleOp::Prune && seed && age < 5 {
                    r.set(Term::ActionShaping, -0.1);
                }
            }
            RewardMode::Simplified => {
                if seed && !cfg.disable_pbrs {
                    r.set(
                        Term::Pbrs,
                        pbrs_bonus(stage, ep, x.previous_stage[tgt], x.previous_epochs_in_stage[tgt]),
                    );
                }
                if op != LifecycleOp::Wait {
                    r.set(Term::ActionShaping, -0.01);
                }
                if terminal && !cfg.disable_terminal_reward {
                    r.set(
                        Term::Terminal,
                        3.0 * x.val_acc[e] / 100.0 + 2.0 * f64::from(x.n_contrib_fossil[e]),
                    );
                }
            }
        }
    }

    // §2.9 steps 3–4: pending terms, every mode and family.
    r.set(Term::AutoPrunePenalty, x.pending_auto_prune_penalty[e]);
    r.set(Term::HindsightCredit, x.pending_hindsight_credit[e]);

    r.raw = Term::ALL.iter().map(|&term| r.get(term)).sum();
    r
}

/// SHAPED (§2.3) and ESCROW (§2.4), with the post-mode forfeit and clawback (§2.9 steps 1–2).
fn shaped(cfg: &RewardConfig, x: &RewardInputs, e: usize, escrow: bool, r: &mut EnvReward) {
    let s = x.n_slots;
    let slot = |k: usize| e * s + k;
    let t = x.epoch;
    let big_t = x.max_epochs;
    let terminal = t == big_t;
    let k = usize::from(x.target_slot[e]);
    let tgt = slot(k);
    let stage = x.stage[tgt];
    let seed = has_seed(stage);
    let fossilized = seed && stage == SeedStage::Fossilized;
    let c = r.contribution;
    let progress = r.progress;
    let cf = x.cf_imp[e];
    let ep = x.epochs_in_stage[tgt];
    let age = x.seed_age[tgt];
    let op = x.op[e];
    let cf_negative = cf.is_some_and(|v| v < 0.0);

    // Anti-gaming gates (only with a contribution and a seed; cf must then exist).
    let mut discount = 1.0;
    let mut ratio_pen = 0.0;
    if let Some(cv) = c {
        let cfv = cf.expect("a contribution without a counterfactual breaks the kernel's contract");
        if !escrow {
            discount = disc(cfv);
        }
        if !cfg.disable_anti_gaming && cv > 1.0 && discount >= 0.5 {
            if cfv > SAFE_IMPROVEMENT {
                let rho = cv / cfv;
                if rho > HACKING_RATIO {
                    ratio_pen = -(0.1 * (rho - HACKING_RATIO) / HACKING_RATIO).min(0.3);
                }
            } else {
                ratio_pen = -0.3 * (cv / 10.0).min(1.0);
            }
        }
    }

    // Attribution.
    let mut a = 0.0;
    if escrow {
        let prev = x.escrow_credit[tgt];
        let delta;
        if op == LifecycleOp::Prune {
            delta = -prev;
            a = delta;
        } else if fossilized {
            delta = 0.0;
        } else if let Some(cv) = c {
            if cv < 0.0 {
                delta = -prev;
                a = CONTRIBUTION_WEIGHT * cv + delta;
            } else {
                let att = match progress {
                    None => 0.5 * cv,
                    Some(p) if p > 0.0 && cv >= p => (p * cv).sqrt(),
                    Some(p) if p > 0.0 => cv,
                    Some(_) => 0.0,
                };
                let target = (CONTRIBUTION_WEIGHT * att + ratio_pen).max(0.0);
                delta = (target - prev).clamp(-ESCROW_DELTA_CLIP, ESCROW_DELTA_CLIP);
                a = delta;
            }
        } else {
            delta = 0.0;
        }
        r.credit[k] = prev + delta;
        if op == LifecycleOp::Fossilize && seed && cf_negative {
            a = 0.0;
        }
    } else if seed && !fossilized {
        if let Some(cv) = c {
            if cv < 0.0 {
                a = CONTRIBUTION_WEIGHT * cv;
            } else {
                let att = match progress {
                    None => 0.5 * cv,
                    Some(p) if p <= 0.0 => 0.0,
                    Some(p) if cv >= p => harmonic_mean(p, cv),
                    Some(_) => cv,
                };
                let g = f64::from(t) - f64::from(age);
                a = CONTRIBUTION_WEIGHT * att * discount * tau(g);
            }
        } else {
            let improvement = x.improvement_since_stage_start[tgt];
            if stage.value() >= SeedStage::Blending.value() && improvement > 0.0 {
                a = PROXY_WEIGHT * improvement;
            }
        }
        if op == LifecycleOp::Fossilize && cf_negative {
            a = 0.0;
        }
        if op == LifecycleOp::Prune {
            a = -a;
        }
        a += ratio_pen;
    }
    r.set(Term::Attribution, a);

    // Warnings.
    if seed && stage == SeedStage::Blending && cf_negative {
        r.set(Term::BlendingWarning, -0.1 - (0.05 * f64::from(ep)).min(0.3));
    }
    if seed
        && stage == SeedStage::Holding
        && !matches!(op, LifecycleOp::Fossilize | LifecycleOp::Prune)
        && ep >= 2
        && a > 0.0
    {
        r.set(Term::HoldingWarning, -(0.1 + 0.05 * f64::from(ep.saturating_sub(2))).min(0.3));
    }

    // PBRS.
    if seed && !cfg.disable_pbrs {
        r.set(Term::Pbrs, pbrs_bonus(stage, ep, x.previous_stage[tgt], x.previous_epochs_in_stage[tgt]));
    }

    // Synergy.
    let interaction = x.interaction_sum[tgt];
    if seed && discount >= 0.5 && a > 0.0 && interaction > 0.0 {
        r.set(Term::Synergy, 0.1 * (0.5 * interaction).tanh());
    }

    // Rent (if effective_seed_params > 0).
    if r.effective_seed_params > 0.0 {
        let g = r.effective_seed_params / x.host_params.max(cfg.rent_host_params_floor);
        r.set(Term::Rent, -(RENT_WEIGHT * (1.0 + g).ln()).min(MAX_RENT));
    }

    // Alpha shock.
    if !cfg.disable_anti_gaming {
        r.set(Term::AlphaShock, -(ALPHA_SHOCK_COEF * r.alpha_delta_sq_sum).min(ALPHA_SHOCK_CAP));
    }

    // Capacity economics.
    let n_fossil = x.n_fossil[e];
    let excess = (i64::from(r.n_active) + i64::from(n_fossil) - FREE_SLOTS).max(0);
    r.set(Term::Occupancy, -OCCUPANCY_COST * excess as f64);
    r.set(Term::FossilRent, -FOSSIL_MAINTENANCE * f64::from(n_fossil));

    // Action shaping.
    let act = match op {
        LifecycleOp::Germinate => {
            let shaping = if seed {
                -0.3
            } else if !cfg.disable_pbrs && t < big_t {
                PBRS_WEIGHT * GAMMA * stage_phi(SeedStage::Germinated) * tau(f64::from(t))
            } else {
                0.0
            };
            shaping - 0.15
        }
        LifecycleOp::Fossilize => {
            let foss = match cf {
                _ if !seed || stage != SeedStage::Holding => -1.0,
                None => -1.0,
                Some(cfv) if cfv < 0.0 => {
                    let ransom = c.is_some_and(|cv| cv > 0.1) && cfv < -0.2;
                    -0.5 - (0.2 * cfv.abs()).min(1.0) - if ransom { 0.3 } else { 0.0 }
                }
                Some(_) => match c {
                    Some(cv) if cv >= MIN_FOSSILIZE_CONTRIBUTION => (0.5 + 0.1 * cv) * legitimacy(ep),
                    _ => -0.2,
                },
            };
            let valid = seed
                && stage == SeedStage::Holding
                && cf.is_some_and(|v| v >= 0.0)
                && c.is_some_and(|cv| cv >= MIN_FOSSILIZE_CONTRIBUTION)
                && !cfg.disable_terminal_reward;
            let bonus = if valid { 3.0 * (1.0f64 / 3.0).tanh() * legitimacy(ep) } else { 0.0 };
            foss - 0.01 + bonus
        }
        LifecycleOp::Prune => {
            let forfeit = if seed && !cfg.disable_pbrs { PBRS_WEIGHT * (0.0 - phi(stage, ep)) } else { 0.0 };
            let prune = if !seed {
                -0.2
            } else if fossilized {
                -1.0
            } else if age < MIN_PRUNE_AGE {
                -0.3 * f64::from(MIN_PRUNE_AGE - age)
            } else {
                match c {
                    Some(cv) if cv < -0.5 => {
                        if age < 3 {
                            -0.1
                        } else {
                            0.15
                        }
                    }
                    Some(cv) if cv < 0.0 => 0.1,
                    Some(cv) => (-0.3 - 0.05 * cv).max(-0.9),
                    None => 0.0,
                }
            };
            forfeit + prune - 0.005
        }
        LifecycleOp::Advance => {
            if seed && stage == SeedStage::Training {
                -0.1
            } else {
                0.0
            }
        }
        LifecycleOp::SetAlphaTarget => -0.005,
        LifecycleOp::Wait => 0.0,
    };
    r.set(Term::ActionShaping, act);

    // Terminal.
    if terminal && !cfg.disable_terminal_reward {
        r.set(Term::Terminal, TERMINAL_ACC_WEIGHT * x.val_acc[e]);
    }

    // §2.9 step 1: escrow forfeit over the credit after this step.
    if escrow && terminal {
        let forfeit: f64 = (0..s).filter(|&kk| is_live(x.stage[slot(kk)])).map(|kk| r.credit[kk]).sum();
        r.set(Term::EscrowForfeit, -forfeit);
    }

    // §2.9 step 2: germination clawback.
    if terminal && !cfg.disable_pbrs {
        let clawback: f64 = (0..s)
            .map(slot)
            .filter(|&i| matches!(x.stage[i], SeedStage::Germinated | SeedStage::Training))
            .map(|i| {
                PBRS_WEIGHT * GAMMA * stage_phi(SeedStage::Germinated) / GAMMA.powi(x.seed_age[i] as i32)
            })
            .sum();
        r.set(Term::Clawback, -clawback);
    }
}

/// The loss family (§2.8, sign error fixed).
fn loss_family(cfg: &RewardConfig, x: &RewardInputs, e: usize, r: &mut EnvReward) {
    let lc = &cfg.loss;
    let s = x.n_slots;
    let tgt = e * s + usize::from(x.target_slot[e]);
    let seed = has_seed(x.stage[tgt]);

    // Normalised loss delta: d = L_t − L_{t−1} = −loss_delta; regressions (z > 0) are scaled down.
    let d = if x.loss_delta[e].is_finite() { -x.loss_delta[e] } else { 0.0 };
    let mut z = (d / lc.typical_loss_delta_std).clamp(-lc.max_loss_delta, lc.max_loss_delta);
    if z > 0.0 {
        z *= lc.regression_penalty_scale;
    }
    r.set(Term::LossDelta, -lc.loss_delta_weight * z);

    // Compute rent on the seed modules' trainable parameters (`total_params − host_params`: a seed the
    // blend-out freeze holds counts none), with a grace period for a young target seed.
    let seed_params: f64 =
        (0..s).map(|k| e * s + k).filter(|&i| has_seed(x.stage[i])).map(|i| x.trainable_params[i]).sum();
    let in_grace = seed && x.seed_age[tgt] < lc.grace_epochs;
    if seed_params > 0.0 && x.host_params > 0.0 && !in_grace {
        let rent =
            (lc.compute_rent_weight * (1.0 + seed_params / x.host_params).ln()).min(lc.max_rent_penalty);
        r.set(Term::Rent, -rent);
    }

    // Stage potential, every step with a seed.
    if seed {
        r.set(
            Term::StagePotential,
            lc.stage_potential_weight * (GAMMA * stage_phi(x.stage[tgt]) - stage_phi(x.previous_stage[tgt])),
        );
    }

    // Terminal loss bonus.
    if x.epoch == x.max_epochs {
        let norm = ((lc.baseline_loss - x.val_loss[e]) / (lc.baseline_loss - lc.target_loss)).clamp(0.0, 1.0);
        r.set(Term::Terminal, norm * lc.terminal_weight);
    }
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * (1.0 + want.abs())
}

fn close_opt(got: Option<f64>, want: Option<f64>) -> bool {
    match (got, want) {
        (None, None) => true,
        (Some(g), Some(w)) => close(g, w),
        _ => false,
    }
}

/// One env's inputs, readable.
fn describe_env(x: &RewardInputs, e: usize) -> String {
    let s = x.n_slots;
    let mut out = format!(
        "epoch {}/{} host {} | env {e}: skip {} op {:?} target {} val_acc {} stable {} val_loss {} acc_delta {} \
         loss_delta {} cf_imp {:?} committed {} n_fossil {} n_contrib {} pending ({}, {})\n",
        x.epoch,
        x.max_epochs,
        x.host_params,
        x.skip[e],
        x.op[e],
        x.target_slot[e],
        x.val_acc[e],
        x.stable_val_acc[e],
        x.val_loss[e],
        x.acc_delta[e],
        x.loss_delta[e],
        x.cf_imp[e],
        x.committed_val_acc[e],
        x.n_fossil[e],
        x.n_contrib_fossil[e],
        x.pending_auto_prune_penalty[e],
        x.pending_hindsight_credit[e],
    );
    for k in 0..s {
        let i = e * s + k;
        out += &format!(
            "  slot {k}: {:?} (prev {:?}) e {} prev_e {} age {} alpha {}<-{} params {}<-{} c {:?} impr {} \
             inter {} acc_germ {:?} credit {} drip {:?}\n",
            x.stage[i],
            x.previous_stage[i],
            x.epochs_in_stage[i],
            x.previous_epochs_in_stage[i],
            x.seed_age[i],
            x.alpha[i],
            x.prev_alpha[i],
            x.params[i],
            x.prev_params[i],
            x.contribution[i],
            x.improvement_since_stage_start[i],
            x.interaction_sum[i],
            x.acc_at_germination[i],
            x.escrow_credit[i],
            x.drip_scale[i],
        );
    }
    out
}

/// Every difference between the kernel and the scalar oracle on a batch (empty when they agree).
fn differences(cfg: &RewardConfig, x: &RewardInputs) -> Vec<String> {
    let mut out = RewardOutputs::default();
    compute_rewards(cfg, x, &mut out);
    let (n, s) = (x.n_envs, x.n_slots);
    let allowed = Term::of(cfg);
    let mut diffs = Vec::new();
    for e in 0..n {
        let want = scalar_reward(cfg, x, e);
        let mut env_diffs = Vec::new();
        // Our own terms stay inside the configuration's term set (a check of the oracle).
        for term in Term::ALL {
            if want.get(term) != 0.0 && !allowed.contains(&term) {
                env_diffs.push(format!("oracle: {term:?} = {} outside Term::of", want.get(term)));
            }
        }
        if !close(out.raw[e], want.raw) {
            env_diffs.push(format!("raw: got {} want {}", out.raw[e], want.raw));
        }
        for term in Term::ALL {
            let got = out.term(term, e);
            if !close(got, want.get(term)) {
                env_diffs.push(format!("{term:?}: got {got} want {}", want.get(term)));
            }
        }
        for k in 0..s {
            let got = out.escrow_credit[e * s + k];
            if !close(got, want.credit[k]) {
                env_diffs.push(format!("escrow_credit[{k}]: got {got} want {}", want.credit[k]));
            }
        }
        if !close_opt(out.proposed_drip[e], want.proposed_drip) {
            env_diffs
                .push(format!("proposed_drip: got {:?} want {:?}", out.proposed_drip[e], want.proposed_drip));
        }
        if !x.skip[e] {
            // The shared inputs it reports (§2.0).
            if !close(out.effective_seed_params[e], want.effective_seed_params) {
                env_diffs.push(format!(
                    "effective_seed_params: got {} want {}",
                    out.effective_seed_params[e], want.effective_seed_params
                ));
            }
            if !close(out.alpha_delta_sq_sum[e], want.alpha_delta_sq_sum) {
                env_diffs.push(format!(
                    "alpha_delta_sq_sum: got {} want {}",
                    out.alpha_delta_sq_sum[e], want.alpha_delta_sq_sum
                ));
            }
            if out.n_active[e] != want.n_active {
                env_diffs.push(format!("n_active: got {} want {}", out.n_active[e], want.n_active));
            }
            if !close(out.fossil_params[e], want.fossil_params) {
                env_diffs
                    .push(format!("fossil_params: got {} want {}", out.fossil_params[e], want.fossil_params));
            }
            if !close_opt(out.contribution[e], want.contribution) {
                env_diffs.push(format!(
                    "contribution: got {:?} want {:?}",
                    out.contribution[e], want.contribution
                ));
            }
            if !close_opt(out.progress[e], want.progress) {
                env_diffs.push(format!("progress: got {:?} want {:?}", out.progress[e], want.progress));
            }
        }
        if !env_diffs.is_empty() {
            diffs.push(format!("{}  => {}", describe_env(x, e), env_diffs.join("; ")));
        }
    }
    diffs
}

// ---------------------------------------------------------------------------------------------
// Random batches
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct SlotCase {
    stage: SeedStage,
    previous_stage: SeedStage,
    epochs_in_stage: u32,
    previous_epochs_in_stage: u32,
    age_raw: u32,
    alpha: f64,
    prev_alpha: f64,
    params: f64,
    prev_params: f64,
    /// The blend-out freeze holds the seed (its parameters are not trainable: kasmina §8.2e).
    frozen: bool,
    contribution: Option<f64>,
    improvement: f64,
    total_improvement: f64,
    interaction_sum: f64,
    /// `val_acc − acc_at_germination` (before ESCROW's stable-accuracy drop).
    germination_gain: Option<f64>,
    escrow_credit: f64,
    drip_scale: Option<f64>,
}

#[derive(Clone, Debug)]
struct EnvCase {
    /// Make the target a HOLDING seed being fossilized (the rarest paths: fossilize bonuses, drip).
    focus_fossilize: bool,
    skip: bool,
    op: LifecycleOp,
    target_raw: usize,
    val_acc: f64,
    val_loss: f64,
    acc_delta: f64,
    loss_delta: f64,
    stable_drop: f64,
    cf_imp: Option<f64>,
    cf_fallback: f64,
    committed_val_acc: f64,
    n_fossil: u32,
    n_contrib_raw: u32,
    pending_auto: f64,
    pending_hindsight: f64,
    slots: Vec<SlotCase>,
}

#[derive(Clone, Debug)]
struct BatchCase {
    config: RewardConfig,
    epoch: u32,
    max_epochs: u32,
    host_params: f64,
    envs: Vec<EnvCase>,
}

/// Contributions and counterfactual improvements: thresholds of the spec and wide ranges.
fn pp_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(1.0),
        1 => Just(-0.5),
        1 => Just(0.1),
        4 => -3.0..3.0f64,
        3 => -0.6..0.25f64,
        3 => 0.5..15.0f64,
    ]
}

/// Every stage, the ones with a seed module three times as often.
fn stage() -> impl Strategy<Value = SeedStage> {
    prop_oneof![
        1 => prop::sample::select(SeedStage::ALL.to_vec()),
        2 => prop::sample::select(vec![
            SeedStage::Germinated,
            SeedStage::Training,
            SeedStage::Blending,
            SeedStage::Holding,
            SeedStage::Fossilized,
        ]),
    ]
}

fn slot_case() -> impl Strategy<Value = SlotCase> {
    (
        (stage(), stage(), 0u32..9, 0u32..9, 0u32..40),
        (
            prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64],
            prop_oneof![Just(0.0), Just(1.0), 0.0..1.0f64],
            prop_oneof![1 => Just(0.0), 4 => 1.0..60_000.0f64],
            prop_oneof![1 => Just(0.0), 4 => 1.0..60_000.0f64],
            prop::bool::weighted(0.2),
        ),
        (
            prop::option::weighted(0.7, pp_value()),
            prop_oneof![Just(0.0), -2.0..4.0f64],
            -2.0..4.0f64,
            prop_oneof![Just(0.0), -3.0..3.0f64],
        ),
        (
            prop::option::weighted(0.7, prop_oneof![Just(0.0), -3.0..3.0f64, 0.0..15.0f64]),
            prop_oneof![2 => Just(0.0), 3 => 0.0..3.0f64, 1 => -1.0..1.0f64],
            prop::option::weighted(0.3, prop_oneof![0.0..0.05f64, 0.0..1.0f64]),
        ),
    )
        .prop_map(
            |(
                (stage, previous_stage, e, pe, age_raw),
                (alpha, prev_alpha, params, prev_params, frozen),
                (c, impr, total, inter),
                (germ, credit, drip),
            )| {
                SlotCase {
                    stage,
                    previous_stage,
                    epochs_in_stage: e,
                    previous_epochs_in_stage: pe,
                    age_raw,
                    alpha,
                    prev_alpha,
                    params,
                    prev_params,
                    frozen,
                    contribution: c,
                    improvement: impr,
                    total_improvement: total,
                    interaction_sum: inter,
                    germination_gain: germ,
                    escrow_credit: credit,
                    drip_scale: drip,
                }
            },
        )
}

/// Every op, the ones with the most reward logic (PRUNE, FOSSILIZE) twice as often.
fn op() -> impl Strategy<Value = LifecycleOp> {
    prop_oneof![
        2 => Just(LifecycleOp::Wait),
        1 => Just(LifecycleOp::Germinate),
        1 => Just(LifecycleOp::SetAlphaTarget),
        2 => Just(LifecycleOp::Prune),
        2 => Just(LifecycleOp::Fossilize),
        1 => Just(LifecycleOp::Advance),
    ]
}

fn env_case(n_slots: usize) -> impl Strategy<Value = EnvCase> {
    (
        (prop::bool::weighted(0.1), op(), 0usize..4, prop::bool::weighted(0.15)),
        (
            10.0..90.0f64,
            0.0..3.0f64,
            -5.0..5.0f64,
            prop_oneof![
                2 => Just(f64::INFINITY),
                1 => Just(f64::NAN),
                1 => Just(0.0),
                6 => -0.5..0.5f64,
                1 => -5.0..5.0f64,
            ],
            prop_oneof![Just(0.0), 0.0..5.0f64],
        ),
        (prop::option::weighted(0.75, pp_value()), pp_value(), 10.0..90.0f64, 0u32..4, 0u32..4),
        (
            prop_oneof![Just(0.0), Just(-0.2), Just(-0.4)],
            prop_oneof![Just(0.0), 0.0..0.2f64],
            prop::collection::vec(slot_case(), n_slots),
        ),
    )
        .prop_map(
            |(
                (skip, op, target_raw, focus_fossilize),
                (val_acc, val_loss, acc_delta, loss_delta, stable_drop),
                (cf_imp, cf_fallback, committed_val_acc, n_fossil, n_contrib_raw),
                (pending_auto, pending_hindsight, slots),
            )| EnvCase {
                focus_fossilize,
                skip,
                op,
                target_raw,
                val_acc,
                val_loss,
                acc_delta,
                loss_delta,
                stable_drop,
                cf_imp,
                cf_fallback,
                committed_val_acc,
                n_fossil,
                n_contrib_raw,
                pending_auto,
                pending_hindsight,
                slots,
            },
        )
}

fn loss_config() -> impl Strategy<Value = LossRewardConfig> {
    (
        prop::sample::select(vec![0.05, 0.1, 0.15]),
        prop::sample::select(vec![0.05, 0.01]),
        prop::sample::select(vec![(2.3, 0.3), (10.8, 3.5)]),
        0u32..5,
        prop_oneof![Just(5.0), 1.0..8.0f64],
        prop_oneof![Just(0.1), 0.0..0.5f64],
    )
        .prop_map(|(std, rent, (baseline, target), grace, weight, stage_w)| LossRewardConfig {
            typical_loss_delta_std: std,
            compute_rent_weight: rent,
            baseline_loss: baseline,
            target_loss: target,
            grace_epochs: grace,
            loss_delta_weight: weight,
            stage_potential_weight: stage_w,
            ..LossRewardConfig::CIFAR
        })
}

fn config(mode: RewardMode, family: RewardFamily) -> impl Strategy<Value = RewardConfig> {
    (
        (any::<bool>(), any::<bool>(), any::<bool>()),
        (
            prop_oneof![Just(500_000.0), 1e4..1e6f64],
            prop_oneof![Just(0.1), 0.0..1.0f64],
            prop_oneof![Just(1.0), Just(2.5), 0.0..3.0f64],
            prop_oneof![Just(200.0), 1.0..5_000.0f64],
            prop_oneof![Just(5.0), 0.0..10.0f64],
        ),
        loss_config(),
    )
        .prop_map(move |((pbrs, term, anti), (budget, weight, scale, floor, acc_w), loss)| {
            RewardConfig {
                mode,
                family,
                disable_pbrs: pbrs,
                disable_terminal_reward: term,
                disable_anti_gaming: anti,
                param_budget: budget,
                param_penalty_weight: weight,
                sparse_reward_scale: scale,
                rent_host_params_floor: floor,
                basic_acc_delta_weight: acc_w,
                loss,
            }
        })
}

fn batch(mode: RewardMode, family: RewardFamily) -> impl Strategy<Value = BatchCase> {
    (config(mode, family), 1usize..=6, 1usize..=4, 1u32..=30)
        .prop_flat_map(|(config, n_envs, n_slots, max_epochs)| {
            (
                Just(config),
                prop_oneof![1 => Just(max_epochs), 2 => 1..=max_epochs],
                Just(max_epochs),
                prop_oneof![1 => Just(0.0), 2 => 50.0..1_000.0f64, 7 => 1e4..2e6f64],
                prop::collection::vec(env_case(n_slots), n_envs),
            )
        })
        .prop_map(|(config, epoch, max_epochs, host_params, envs)| BatchCase {
            config,
            epoch,
            max_epochs,
            host_params,
            envs,
        })
}

/// The kernel's inputs for a generated batch, with the invariants it relies on: the target slot
/// exists, a seed is never older than the epoch, and a target seed with a contribution comes with a
/// counterfactual improvement.
fn build(case: &BatchCase) -> RewardInputs {
    let n = case.envs.len();
    let s = case.envs[0].slots.len();
    let mut x = RewardInputs::default();
    x.resize(n, s);
    x.epoch = case.epoch;
    x.max_epochs = case.max_epochs;
    x.host_params = case.host_params;
    for (e, env) in case.envs.iter().enumerate() {
        let target = env.target_raw % s;
        x.skip[e] = env.skip;
        x.op[e] = env.op;
        x.target_slot[e] = target as u8;
        x.val_acc[e] = env.val_acc;
        x.val_loss[e] = env.val_loss;
        x.acc_delta[e] = env.acc_delta;
        x.loss_delta[e] = env.loss_delta;
        x.stable_val_acc[e] = env.val_acc - env.stable_drop;
        x.committed_val_acc[e] = env.committed_val_acc;
        x.n_fossil[e] = env.n_fossil;
        x.n_contrib_fossil[e] = env.n_contrib_raw.min(env.n_fossil);
        x.pending_auto_prune_penalty[e] = env.pending_auto;
        x.pending_hindsight_credit[e] = env.pending_hindsight;
        for (k, sc) in env.slots.iter().enumerate() {
            let i = e * s + k;
            x.stage[i] = sc.stage;
            x.previous_stage[i] = sc.previous_stage;
            x.epochs_in_stage[i] = sc.epochs_in_stage;
            x.previous_epochs_in_stage[i] = sc.previous_epochs_in_stage;
            x.seed_age[i] = sc.age_raw % (case.epoch + 1);
            x.alpha[i] = sc.alpha;
            x.prev_alpha[i] = sc.prev_alpha;
            x.params[i] = sc.params;
            x.prev_params[i] = sc.prev_params;
            x.trainable_params[i] = if sc.frozen { 0.0 } else { sc.params };
            x.contribution[i] = sc.contribution;
            x.improvement_since_stage_start[i] = sc.improvement;
            x.total_improvement[i] = sc.total_improvement;
            x.interaction_sum[i] = sc.interaction_sum;
            x.acc_at_germination[i] = sc.germination_gain.map(|g| env.val_acc - g);
            x.escrow_credit[i] = sc.escrow_credit;
            x.drip_scale[i] = sc.drip_scale;
        }
        let t = e * s + target;
        if env.focus_fossilize {
            x.op[e] = LifecycleOp::Fossilize;
            x.stage[t] = SeedStage::Holding;
        }
        x.cf_imp[e] = env.cf_imp;
        if has_seed(x.stage[t]) && x.contribution[t].is_some() && x.cf_imp[e].is_none() {
            x.cf_imp[e] = Some(env.cf_fallback);
        }
    }
    x
}

fn check(case: &BatchCase) -> Result<(), TestCaseError> {
    let x = build(case);
    let diffs = differences(&case.config, &x);
    prop_assert!(diffs.is_empty(), "config {:?}\n{}", case.config, diffs.join("\n"));
    Ok(())
}

proptest! {
    // 1024 batches per mode (well under a second each); no regression file is written: a failure
    // prints the shrunk batch and the differing terms.
    #![proptest_config(ProptestConfig {
        cases: 1024,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn kernel_matches_scalar_shaped(case in batch(RewardMode::Shaped, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_escrow(case in batch(RewardMode::Escrow, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_basic(case in batch(RewardMode::Basic, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_basic_plus(case in batch(RewardMode::BasicPlus, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_sparse(case in batch(RewardMode::Sparse, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_minimal(case in batch(RewardMode::Minimal, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_simplified(case in batch(RewardMode::Simplified, RewardFamily::Contribution)) {
        check(&case)?;
    }

    #[test]
    fn kernel_matches_scalar_loss_family(case in batch(RewardMode::Shaped, RewardFamily::Loss)) {
        check(&case)?;
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle against hand-computed numbers from the spec
// ---------------------------------------------------------------------------------------------

fn near(got: f64, want: f64, tol: f64, what: &str) {
    assert!((got - want).abs() <= tol, "{what}: got {got}, want {want}");
}

/// One env, `slots` empty slots, epoch 20 of 25, host of 10 000 parameters, WAIT on slot 0.
fn single(slots: usize) -> RewardInputs {
    let mut x = RewardInputs::default();
    x.resize(1, slots);
    x.epoch = 20;
    x.max_epochs = 25;
    x.host_params = 10_000.0;
    x.val_acc[0] = 50.0;
    x.stable_val_acc[0] = 50.0;
    x.committed_val_acc[0] = 50.0;
    x.val_loss[0] = 1.5;
    for k in 0..slots {
        x.stage[k] = SeedStage::Dormant;
        x.previous_stage[k] = SeedStage::Unknown;
    }
    x
}

fn with_mode(mode: RewardMode) -> RewardConfig {
    RewardConfig { mode, ..RewardConfig::default() }
}

#[test]
fn oracle_discount_matches_the_spec_figures() {
    // §2.3: cf −0.1 → 0.43, −0.5 → 0.18; cf ≥ 0 → 1.
    near(disc(-0.1), 0.43, 0.005, "disc(-0.1)");
    near(disc(-0.5), 0.18, 0.005, "disc(-0.5)");
    near(disc(0.0), 1.0, 0.0, "disc(0)");
    near(disc(-1000.0), 0.0, 1e-300, "disc(-1000) is finite");
    // γ is the kernel's γ.
    assert_eq!(GAMMA, esper_kernels::reward::GAMMA);
}

#[test]
fn oracle_germinate_shaping_matches_the_spec_figures() {
    // §2.3: GERMINATE into an empty slot nets +0.1485 at t ≥ 10 and −0.013 at t = 1.
    let cfg = RewardConfig::default();
    for (epoch, want, tol) in [(10, 0.1485, 1e-12), (20, 0.1485, 1e-12), (1, -0.013, 5e-4)] {
        let mut x = single(1);
        x.epoch = epoch;
        x.op[0] = LifecycleOp::Germinate;
        let r = scalar_reward(&cfg, &x, 0);
        near(r.get(Term::ActionShaping), want, tol, "germinate shaping");
    }
    // At t = 1 exactly: 0.2985·0.46 − 0.15.
    let mut x = single(1);
    x.epoch = 1;
    x.op[0] = LifecycleOp::Germinate;
    near(scalar_reward(&cfg, &x, 0).get(Term::ActionShaping), 0.2985 * 0.46 - 0.15, 1e-12, "t = 1");
    // At the terminal epoch there is no PBRS part: only the cost.
    x.epoch = 25;
    near(scalar_reward(&cfg, &x, 0).get(Term::ActionShaping), -0.15, 1e-12, "t = T");
}

#[test]
fn oracle_shaped_blending_seed_by_hand() {
    // BLENDING seed, 3 epochs in stage (from TRAINING), age 10 at epoch 20 (τ = 1), c = 2,
    // cf = 3, progress 50 − 45 = 5 > c: att = c = 2; no ratio penalty (ρ < 5).
    let mut x = single(1);
    x.stage[0] = SeedStage::Blending;
    x.previous_stage[0] = SeedStage::Training;
    x.epochs_in_stage[0] = 3;
    x.seed_age[0] = 10;
    x.alpha[0] = 0.5;
    x.prev_alpha[0] = 0.5;
    x.params[0] = 2_000.0;
    x.prev_params[0] = 2_000.0;
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(3.0);
    x.acc_at_germination[0] = Some(45.0);
    let r = scalar_reward(&RewardConfig::default(), &x, 0);
    near(r.get(Term::Attribution), 2.0, 1e-12, "A");
    // PBRS: 0.3·(0.995·(3.5 + 0.9) − (3.5 + 0.6)) = 0.3·(4.378 − 4.1) = 0.0834.
    near(r.get(Term::Pbrs), 0.0834, 1e-12, "pbrs");
    // Rent: esp = 0.0039·10 000 + 0.5·2 000 = 1 039; g = 0.1039; −0.5·ln(1.1039).
    near(r.get(Term::Rent), -0.5 * 1.1039f64.ln(), 1e-12, "rent");
    // One active seed, no fossils: no occupancy rent; no alpha change: no shock.
    near(r.get(Term::Occupancy), 0.0, 0.0, "occupancy");
    near(r.get(Term::AlphaShock), 0.0, 0.0, "shock");
    near(r.raw, 2.0 + 0.0834 - 0.5 * 1.1039f64.ln(), 1e-12, "raw");
}

#[test]
fn oracle_fossilize_and_terminal_by_hand() {
    // HOLDING seed, 5 epochs in stage (L = 1), c = 2, cf = 2: Foss = (0.5 + 0.1·2)·1 = 0.7,
    // cost −0.01, immediate bonus 3·tanh(1/3) = 0.9645; at t = T: terminal 0.05·70 = 3.5.
    let mut x = single(1);
    x.epoch = 25;
    x.val_acc[0] = 70.0;
    x.stage[0] = SeedStage::Holding;
    x.previous_stage[0] = SeedStage::Blending;
    x.epochs_in_stage[0] = 5;
    x.seed_age[0] = 15;
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(2.0);
    x.op[0] = LifecycleOp::Fossilize;
    let r = scalar_reward(&RewardConfig::default(), &x, 0);
    near(r.get(Term::ActionShaping), 0.7 - 0.01 + 0.9645, 5e-5, "fossilize shaping");
    near(r.get(Term::Terminal), 3.5, 1e-12, "terminal");
    // BASIC_PLUS: full = (0.3 + 0.5·harmonic(2, 2))·1 = 1.3; now 0.39; drip 0.91 / max(0, 5) = 0.182.
    x.epoch = 20;
    let r = scalar_reward(&with_mode(RewardMode::BasicPlus), &x, 0);
    near(r.get(Term::Fossilize), 0.39, 1e-12, "basic_plus now");
    near(r.proposed_drip.unwrap(), 0.182, 1e-12, "basic_plus drip");
    let r = scalar_reward(&with_mode(RewardMode::Basic), &x, 0);
    near(r.get(Term::Fossilize), 1.3, 1e-12, "basic full");
    assert_eq!(r.proposed_drip, None);
}

#[test]
fn oracle_escrow_and_clawback_by_hand() {
    // TRAINING seed aged 4 at t = T = 25 with c = 2, cf = 3, stable progress 50 − 49 = 1 < c:
    // att = sqrt(1·2); credit 0.5 → target √2; A = √2 − 0.5; forfeit −√2; clawback −0.2985/γ⁴.
    let mut x = single(1);
    x.epoch = 25;
    x.stage[0] = SeedStage::Training;
    x.previous_stage[0] = SeedStage::Germinated;
    x.epochs_in_stage[0] = 2;
    x.seed_age[0] = 4;
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(3.0);
    x.acc_at_germination[0] = Some(49.0);
    x.escrow_credit[0] = 0.5;
    let r = scalar_reward(&with_mode(RewardMode::Escrow), &x, 0);
    let sqrt2 = 2f64.sqrt();
    near(r.get(Term::Attribution), sqrt2 - 0.5, 1e-12, "escrow A");
    near(r.credit[0], sqrt2, 1e-12, "credit");
    near(r.get(Term::EscrowForfeit), -sqrt2, 1e-12, "forfeit");
    near(r.get(Term::Clawback), -0.2985 / GAMMA.powi(4), 1e-12, "clawback");
}

#[test]
fn oracle_loss_family_by_hand() {
    let cfg = RewardConfig { family: RewardFamily::Loss, ..RewardConfig::default() };
    let mut x = single(1);
    // First epoch: no previous loss (+∞) counts as no change.
    x.loss_delta[0] = f64::INFINITY;
    near(scalar_reward(&cfg, &x, 0).get(Term::LossDelta), 0.0, 0.0, "first epoch");
    // The loss fell by 0.05 (σ = 0.05): z = −1, reward +5.
    x.loss_delta[0] = 0.05;
    near(scalar_reward(&cfg, &x, 0).get(Term::LossDelta), 5.0, 1e-12, "improvement");
    // The loss rose by 0.05: z = +1, halved, reward −2.5.
    x.loss_delta[0] = -0.05;
    near(scalar_reward(&cfg, &x, 0).get(Term::LossDelta), -2.5, 1e-12, "regression");
    // Terminal: (2.3 − 1.3) / 2.0 = 0.5.
    x.epoch = 25;
    x.val_loss[0] = 1.3;
    near(scalar_reward(&cfg, &x, 0).get(Term::Terminal), 0.5, 1e-12, "terminal");
}

// ---------------------------------------------------------------------------------------------
// Minimal reproductions of the places where the kernel once disagreed with the spec (found by the
// property test above; each states the spec line it follows)
// ---------------------------------------------------------------------------------------------

fn kernel(cfg: &RewardConfig, x: &RewardInputs) -> RewardOutputs {
    let mut out = RewardOutputs::default();
    compute_rewards(cfg, x, &mut out);
    out
}

#[test]
fn basic_fossilize_bonus_uses_the_harmonic_mean_of_improvement_and_contribution() {
    // §2.5: `full = (0.3 + 0.5·harmonic(I, c))·L`, harmonic = 2Ic / max(I + c, 1e-8) (the reference's
    // `_compute_attributed_value`; the `c if c < p` cap belongs to SHAPED's attribution only).
    // HOLDING for 5 epochs (L = 1), I = cf_imp = 8, c = 2: harmonic 3.2, full = 1.9.
    let mut x = single(1);
    x.stage[0] = SeedStage::Holding;
    x.previous_stage[0] = SeedStage::Blending;
    x.epochs_in_stage[0] = 5;
    x.seed_age[0] = 12;
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(8.0);
    x.op[0] = LifecycleOp::Fossilize;
    let basic = with_mode(RewardMode::Basic);
    near(scalar_reward(&basic, &x, 0).get(Term::Fossilize), 1.9, 1e-12, "oracle BASIC");
    near(kernel(&basic, &x).term(Term::Fossilize, 0), 1.9, 1e-9, "kernel BASIC");
    // BASIC_PLUS: 0.3·1.9 = 0.57 now, drip 0.7·1.9 / max(25 − 20, 5) = 0.266.
    let plus = with_mode(RewardMode::BasicPlus);
    near(scalar_reward(&plus, &x, 0).get(Term::Fossilize), 0.57, 1e-12, "oracle BASIC_PLUS");
    let out = kernel(&plus, &x);
    near(out.term(Term::Fossilize, 0), 0.57, 1e-9, "kernel BASIC_PLUS now");
    near(out.proposed_drip[0].unwrap_or(f64::NAN), 0.266, 1e-9, "kernel BASIC_PLUS drip");
}

#[test]
fn escrow_prune_releases_the_credit_before_any_other_path() {
    // §2.4: "PRUNE: target = 0, A = −credit_prev" comes first, before "FOSSILIZED seed: A = 0" and
    // regardless of a contribution (the reference tests `action == PRUNE` first). Unreachable in a
    // run (action_for_reward turns such a PRUNE into WAIT), but the spec defines it.
    let cfg = with_mode(RewardMode::Escrow);
    for stage in [SeedStage::Fossilized, SeedStage::Embargoed, SeedStage::Dormant] {
        let mut x = single(1);
        x.stage[0] = stage;
        x.previous_stage[0] = SeedStage::Holding;
        x.epochs_in_stage[0] = 3;
        x.seed_age[0] = 12;
        x.escrow_credit[0] = 0.8;
        x.op[0] = LifecycleOp::Prune;
        let want = scalar_reward(&cfg, &x, 0);
        near(want.get(Term::Attribution), -0.8, 1e-12, "oracle A");
        near(want.credit[0], 0.0, 0.0, "oracle credit");
        let out = kernel(&cfg, &x);
        near(out.term(Term::Attribution, 0), -0.8, 1e-9, &format!("kernel A, PRUNE on {stage:?}"));
        near(out.escrow_credit[0], 0.0, 1e-9, &format!("kernel credit, PRUNE on {stage:?}"));
    }
}
