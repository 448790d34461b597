//! The reward kernel on hand-built situations (spec simic §2). Every expected number is derived by
//! hand from the spec's formula and written as a literal: the oracle is the spec, not the code.

use esper_components::reward_config::{RewardConfig, RewardFamily, RewardMode};
use esper_components::{LifecycleOp, SeedStage};
use esper_kernels::reward::{RewardInputs, RewardNormalizer, RewardOutputs, Term, compute_rewards};

const TOL: f64 = 1e-9;

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= TOL * (1.0 + want.abs()), "{what}: got {got}, want {want}");
}

/// One env with `slots` empty slots at epoch 20 of 25, host of 10 000 parameters, WAIT on slot 0.
fn one_env(slots: usize) -> RewardInputs {
    let mut x = RewardInputs::default();
    x.resize(1, slots);
    x.epoch = 20;
    x.max_epochs = 25;
    x.host_params = 10_000.0;
    x.val_acc[0] = 50.0;
    x.val_loss[0] = 1.5;
    x.stable_val_acc[0] = 50.0;
    x.committed_val_acc[0] = 50.0;
    x
}

/// Put a seed into slot `k`: stage, epochs in stage, age, alpha, params.
fn seed(x: &mut RewardInputs, k: usize, stage: SeedStage, epochs_in_stage: u32, age: u32, alpha: f64) {
    x.stage[k] = stage;
    x.previous_stage[k] = SeedStage::Training;
    x.epochs_in_stage[k] = epochs_in_stage;
    x.seed_age[k] = age;
    x.alpha[k] = alpha;
    x.prev_alpha[k] = alpha;
    x.params[k] = 2_000.0;
    x.prev_params[k] = 2_000.0;
    x.trainable_params[k] = 2_000.0;
}

fn run(config: &RewardConfig, x: &RewardInputs) -> RewardOutputs {
    let mut out = RewardOutputs::default();
    compute_rewards(config, x, &mut out);
    out
}

fn mode(mode: RewardMode) -> RewardConfig {
    RewardConfig { mode, ..RewardConfig::default() }
}

#[test]
fn anti_gaming_discount_scales_the_attribution() {
    // BLENDING seed, c = 2, no progress known: att = 0.5·c = 1; germinated 10 epochs ago: τ = 1.
    // disc(cf) = 1 / (1 + exp(3·|cf|)); disc < 0.5, so no ratio penalty.
    for (cf, disc) in [(-0.1, 0.425557483188341), (-0.5, 0.18242552380635635)] {
        let mut x = one_env(1);
        seed(&mut x, 0, SeedStage::Blending, 3, 10, 0.5);
        x.contribution[0] = Some(2.0);
        x.cf_imp[0] = Some(cf);
        let out = run(&RewardConfig::default(), &x);
        close(out.term(Term::Attribution, 0), disc, "attribution = disc");
        // cf < 0 while BLENDING: W_blend = −0.1 − min(0.05·3, 0.3) = −0.25.
        close(out.term(Term::BlendingWarning, 0), -0.25, "blending warning");
    }
}

#[test]
fn ratio_penalty_catches_contribution_far_above_the_total_improvement() {
    let mut x = one_env(1);
    seed(&mut x, 0, SeedStage::Blending, 3, 10, 0.5);
    // c = 6, cf = 0.5: ρ = 12 > 5 → −min(0.3, 0.1·(12 − 5)/5) = −0.14. progress 10 ≥ c: att = c = 6.
    x.contribution[0] = Some(6.0);
    x.cf_imp[0] = Some(0.5);
    x.acc_at_germination[0] = Some(40.0);
    let out = run(&RewardConfig::default(), &x);
    close(out.term(Term::Attribution, 0), 6.0 - 0.14, "A = att + ratio_pen");
    // c = 2, cf = 0.05 ≤ 0.1: −0.3·min(1, 2/10) = −0.06; progress p = 10 > c: att = c = 2.
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(0.05);
    let out = run(&RewardConfig::default(), &x);
    close(out.term(Term::Attribution, 0), 2.0 - 0.06, "A with low cf_imp");
    // c ≥ p: harmonic 2pc/(p + c) with p = 1 (val 50 − germination 49), c = 2 → 4/3.
    x.acc_at_germination[0] = Some(49.0);
    let out = run(&RewardConfig::default(), &x);
    close(out.term(Term::Attribution, 0), 4.0 / 3.0 - 0.06, "harmonic attribution");
    // With anti-gaming off, no ratio penalty and no alpha shock.
    let off = RewardConfig { disable_anti_gaming: true, ..RewardConfig::default() };
    close(run(&off, &x).term(Term::Attribution, 0), 4.0 / 3.0, "no ratio penalty");
}

#[test]
fn germinate_shaping_at_late_and_first_epochs() {
    let mut x = one_env(1);
    x.op[0] = LifecycleOp::Germinate;
    // t ≥ 10: 0.3·γ·Φ(GERMINATED)·τ(t) − 0.15 = 0.2985 − 0.15 = 0.1485.
    x.epoch = 10;
    close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), 0.1485, "t = 10");
    // t = 1: 0.2985·(0.4 + 0.6/10) − 0.15 = 0.2985·0.46 − 0.15 = −0.01269 (≈ −0.013).
    x.epoch = 1;
    close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), -0.01269, "t = 1");
    // Without PBRS only the cost is left.
    let no_pbrs = RewardConfig { disable_pbrs: true, ..RewardConfig::default() };
    close(run(&no_pbrs, &x).term(Term::ActionShaping, 0), -0.15, "no PBRS");
}

#[test]
fn fossilize_pays_its_bonus_at_once_scaled_by_legitimacy() {
    let mut x = one_env(1);
    x.op[0] = LifecycleOp::Fossilize;
    x.contribution[0] = Some(3.0);
    x.cf_imp[0] = Some(2.0);
    // HOLDING for 5 epochs: L = 1. Foss = (0.5 + 0.1·3)·1 = 0.8; cost −0.01; bonus 3·tanh(1/3) =
    // 0.964538212594903 (the spec's 0.9645·L).
    seed(&mut x, 0, SeedStage::Holding, 5, 12, 1.0);
    close(
        run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0),
        0.8 - 0.01 + 0.964538212594903,
        "L = 1",
    );
    // 3 epochs: L = 0.6 → 0.48 − 0.01 + 0.5787229275569418.
    x.epochs_in_stage[0] = 3;
    close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), 1.0487229275569416, "L = 0.6");
    // A seed that is not HOLDING: −1.0 − 0.01.
    x.stage[0] = SeedStage::Blending;
    close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), -1.01, "invalid fossilize");
    // HOLDING but the whole ensemble hurts (cf = −0.5, c = 3 > 0.1, cf < −0.2):
    // −0.5 − min(0.2·0.5, 1) − 0.3 − 0.01 = −0.91; and the attribution is zeroed.
    x.stage[0] = SeedStage::Holding;
    x.cf_imp[0] = Some(-0.5);
    let out = run(&RewardConfig::default(), &x);
    close(out.term(Term::ActionShaping, 0), -0.91, "ransomware fossilize");
    close(out.term(Term::Attribution, 0), 0.0, "zeroed attribution");
}

#[test]
fn prune_shaping_by_age_and_contribution() {
    let mut x = one_env(1);
    x.op[0] = LifecycleOp::Prune;
    // BLENDING, 3 epochs in stage, age 8: PBRS forfeit 0.3·(0 − (3.5 + 0.9)) = −1.32; cost −0.005.
    seed(&mut x, 0, SeedStage::Blending, 3, 8, 0.5);
    x.cf_imp[0] = Some(0.0);
    let cases = [
        (Some(-1.0), 0.15), // hurting (c < −0.5), age ≥ 3: +0.15
        (Some(-0.2), 0.1),  // mildly hurting: +0.1
        (Some(2.0), -0.4),  // good seed: max(−0.3 − 0.1, −0.9)
        (Some(20.0), -0.9), // very good seed: capped at −0.9
        (None, 0.0),        // no counterfactual
    ];
    for (c, prune) in cases {
        x.contribution[0] = c;
        close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), -1.32 + prune - 0.005, "prune");
    }
    // Young seed (age 2): −0.3·(5 − 2) = −0.9 whatever c.
    x.seed_age[0] = 2;
    x.contribution[0] = Some(-1.0);
    close(run(&RewardConfig::default(), &x).term(Term::ActionShaping, 0), -1.32 - 0.9 - 0.005, "young prune");
}

#[test]
fn terminal_accuracy_clawback_rent_shock_and_occupancy() {
    let mut x = one_env(3);
    x.epoch = 25;
    x.val_acc[0] = 70.0;
    // Slot 0: TRAINING seed of age 4 → clawback 0.2985/γ^4 = 0.3045453778323196.
    seed(&mut x, 0, SeedStage::Training, 4, 4, 0.0);
    // Slot 1: BLENDING at alpha 0.5 (was 0.3) → rent base 0.0039·10 000 + 0.5·2000 = 1039,
    // g = 0.1039, rent 0.5·ln(1.1039) = 0.04942468202108452; shock (0.2)²·2000/10 000 = 0.008
    // → −0.1958·0.008.
    seed(&mut x, 1, SeedStage::Blending, 2, 6, 0.5);
    x.prev_alpha[1] = 0.3;
    let out = run(&RewardConfig::default(), &x);
    close(out.term(Term::Terminal, 0), 3.5, "0.05·70");
    close(out.term(Term::Clawback, 0), -0.3045453778323196, "clawback");
    close(out.term(Term::Rent, 0), -0.04942468202108452, "rent");
    close(out.term(Term::AlphaShock, 0), -0.1958 * 0.008, "alpha shock");
    // Two live seeds, no fossil: 0.01·(2 − 1).
    close(out.term(Term::Occupancy, 0), -0.01, "occupancy");
    let off = RewardConfig { disable_terminal_reward: true, disable_pbrs: true, ..RewardConfig::default() };
    let out = run(&off, &x);
    close(out.term(Term::Terminal, 0), 0.0, "terminal off");
    close(out.term(Term::Clawback, 0), 0.0, "clawback needs PBRS");
}

#[test]
fn pending_terms_are_paid_in_every_mode_and_never_for_a_rolled_back_env() {
    for config in RewardMode::ALL
        .map(mode)
        .into_iter()
        .chain([RewardConfig { family: RewardFamily::Loss, ..RewardConfig::default() }])
    {
        let mut x = one_env(1);
        x.pending_auto_prune_penalty[0] = -0.4;
        // Hindsight credit arrives capped (0.2, `ScaffoldLedger::settle_fossilization`).
        x.pending_hindsight_credit[0] = 0.2;
        let out = run(&config, &x);
        close(out.term(Term::AutoPrunePenalty, 0), -0.4, "auto-prune");
        close(out.term(Term::HindsightCredit, 0), 0.2, "hindsight");
        x.skip[0] = true;
        let out = run(&config, &x);
        assert_eq!(out.raw[0], 0.0, "{:?}: a rolled-back env gets no reward", config.mode);
    }
}

#[test]
fn hindsight_credit_is_capped_at_0_2() {
    use esper_components::ScaffoldLedger;
    let mut ledger = ScaffoldLedger::with_capacity(4);
    // Three large boosts to slot 1 at this epoch: each 0.1·tanh(0.1·50·10) ≈ 0.1 → Σ 0.3, capped 0.2.
    for scaffold in [0, 2, 0] {
        ledger.record(scaffold, 1, 50.0, 7);
    }
    close(ledger.settle_fossilization(1, 10.0, 7), 0.2, "capped credit");
    // One small boost: 0.1·tanh(0.1·1·2)·γ^0 = 0.1·tanh(0.2) = 0.019_737_532_022_490_4.
    ledger.record(0, 1, 1.0, 7);
    close(ledger.settle_fossilization(1, 2.0, 7), 0.019_737_532_022_490_4, "small credit");
}

#[test]
fn escrow_credit_through_a_prune_and_its_terminal_forfeit() {
    let config = mode(RewardMode::Escrow);
    let mut x = one_env(2);
    seed(&mut x, 0, SeedStage::Blending, 3, 10, 0.5);
    // c = 4, progress p = stable 50 − 49 = 1 ≤ c: att = sqrt(1·4) = 2; cf 3 → ρ = 4/3, no penalty.
    x.contribution[0] = Some(4.0);
    x.cf_imp[0] = Some(3.0);
    x.acc_at_germination[0] = Some(49.0);
    let out = run(&config, &x);
    close(out.term(Term::Attribution, 0), 2.0, "credit 0 → 2 paid");
    close(out.escrow_credit[0], 2.0, "credit now 2");
    // Target 5 with credit 2: the change is clipped to 2.0 (credit 4); c = 25, p = 1 → sqrt(25) = 5.
    x.escrow_credit[0] = 2.0;
    x.contribution[0] = Some(25.0);
    x.cf_imp[0] = Some(20.0);
    let out = run(&config, &x);
    close(out.term(Term::Attribution, 0), 2.0, "clipped change");
    close(out.escrow_credit[0], 4.0, "credit 4");
    // PRUNE takes back the whole credit, unclipped and without the shaped sign flip.
    x.escrow_credit[0] = 4.0;
    x.op[0] = LifecycleOp::Prune;
    let out = run(&config, &x);
    close(out.term(Term::Attribution, 0), -4.0, "prune repays the credit");
    close(out.escrow_credit[0], 0.0, "credit gone");
    // Terminal step: the live seed's credit (1.5) is forfeited, the fossil's (0.7) is not.
    let mut x = one_env(2);
    x.epoch = 25;
    seed(&mut x, 0, SeedStage::Holding, 6, 15, 1.0);
    x.escrow_credit[0] = 1.5;
    seed(&mut x, 1, SeedStage::Fossilized, 4, 20, 1.0);
    x.escrow_credit[1] = 0.7;
    let out = run(&config, &x);
    close(out.term(Term::Attribution, 0), 0.0, "no counterfactual: credit kept");
    close(out.term(Term::EscrowForfeit, 0), -1.5, "forfeit of the live seed's credit");
}

#[test]
fn basic_plus_drips_the_fossilize_bonus_with_a_clip() {
    let config = mode(RewardMode::BasicPlus);
    let mut x = one_env(2);
    x.epoch = 10;
    x.op[0] = LifecycleOp::Fossilize;
    seed(&mut x, 0, SeedStage::Holding, 5, 12, 1.0);
    // I = cf 2, c = 2: harmonic = 2; full = (0.3 + 0.5·2)·1 = 1.3; paid now 0.3·1.3 = 0.39, drip pool
    // 0.91 over max(25 − 10, 5) = 15 epochs → 0.0606666….
    x.contribution[0] = Some(2.0);
    x.cf_imp[0] = Some(2.0);
    let out = run(&config, &x);
    close(out.term(Term::Fossilize, 0), 0.39, "immediate part");
    close(out.proposed_drip[0].unwrap(), 0.91 / 15.0, "drip scale");
    // BASIC pays the whole bonus at once.
    let out = run(&mode(RewardMode::Basic), &x);
    close(out.term(Term::Fossilize, 0), 1.3, "basic");
    assert_eq!(out.proposed_drip[0], None);
    // I = 8 > c = 2: the plain harmonic mean 2·8·2/10 = 3.2 (not capped at c) → (0.3 + 1.6)·1 = 1.9.
    x.cf_imp[0] = Some(8.0);
    close(run(&mode(RewardMode::Basic), &x).term(Term::Fossilize, 0), 1.9, "basic, I > c");
    x.cf_imp[0] = Some(2.0);
    // Later: the fossil (slot 1) drips scale·c, clipped to [−0.05, 0.1].
    let mut x = one_env(2);
    seed(&mut x, 1, SeedStage::Fossilized, 4, 20, 1.0);
    x.drip_scale[1] = Some(0.91 / 15.0);
    for (c, drip) in [(1.0, 0.91 / 15.0), (3.0, 0.1), (-2.0, -0.05)] {
        x.contribution[1] = Some(c);
        close(run(&config, &x).term(Term::Drip, 0), drip, "drip");
    }
}

#[test]
fn basic_terminal_uses_the_last_epoch_delta_even_with_terminal_reward_off() {
    // Reference quirk kept: BASIC's terminal term is 5.0·acc_delta/100 of the *last* epoch, and
    // `disable_terminal_reward` does not gate it.
    let mut x = one_env(1);
    x.epoch = 25;
    x.acc_delta[0] = 2.0;
    let config = RewardConfig { disable_terminal_reward: true, ..mode(RewardMode::Basic) };
    close(run(&config, &x).term(Term::Terminal, 0), 0.1, "5·2/100");
    // Rent: 0.1·effective/500 000 with a HOLDING seed at alpha 1: (39 + 2000)·0.1/500 000.
    seed(&mut x, 0, SeedStage::Holding, 3, 9, 1.0);
    close(run(&config, &x).term(Term::Rent, 0), -2039.0 * 0.1 / 500_000.0, "linear rent");
}

#[test]
fn sparse_minimal_and_simplified() {
    let mut x = one_env(2);
    x.epoch = 25;
    x.committed_val_acc[0] = 60.0;
    seed(&mut x, 1, SeedStage::Fossilized, 4, 20, 1.0);
    x.params[1] = 100_000.0;
    // SPARSE: 0.60 − 0.1·100 000/500 000 = 0.58; scale 2.5 → 1.45.
    close(run(&mode(RewardMode::Sparse), &x).raw[0], 0.58, "sparse");
    let scaled = RewardConfig { sparse_reward_scale: 2.5, ..mode(RewardMode::Sparse) };
    close(run(&scaled, &x).raw[0], 1.45, "sparse ×2.5");
    // Not the last epoch: nothing.
    x.epoch = 24;
    close(run(&mode(RewardMode::Sparse), &x).raw[0], 0.0, "sparse mid-episode");
    // MINIMAL: −0.1 for a PRUNE of a seed younger than 5.
    seed(&mut x, 0, SeedStage::Training, 2, 3, 0.0);
    x.op[0] = LifecycleOp::Prune;
    close(run(&mode(RewardMode::Minimal), &x).raw[0], -0.1, "minimal early prune");
    // SIMPLIFIED at T: 3·70/100 + 2·2 contributing fossils = 6.1, and −0.01 for a non-WAIT op.
    let mut x = one_env(1);
    x.epoch = 25;
    x.val_acc[0] = 70.0;
    x.n_contrib_fossil[0] = 2;
    x.n_fossil[0] = 3;
    x.op[0] = LifecycleOp::Germinate;
    let out = run(&mode(RewardMode::Simplified), &x);
    close(out.term(Term::Terminal, 0), 6.1, "simplified terminal");
    close(out.raw[0], 6.09, "simplified total");
}

#[test]
fn pbrs_pays_the_epoch_progress_inside_a_stage() {
    // BLENDING, 3 epochs in: 0.3·(γ·(3.5 + 0.9) − (3.5 + 0.6)) = 0.0834.
    let mut x = one_env(1);
    seed(&mut x, 0, SeedStage::Blending, 3, 9, 0.5);
    close(run(&RewardConfig::default(), &x).term(Term::Pbrs, 0), 0.0834, "pbrs");
    // Just transitioned (e = 0) from TRAINING after 4 epochs: 0.3·(γ·3.5 − (2.0 + 1.2)) = 0.08475.
    x.epochs_in_stage[0] = 0;
    x.previous_epochs_in_stage[0] = 4;
    close(run(&RewardConfig::default(), &x).term(Term::Pbrs, 0), 0.08475, "pbrs at a transition");
}

#[test]
fn loss_family_rewards_improvement_with_the_sign_fixed() {
    let config = RewardConfig { family: RewardFamily::Loss, ..RewardConfig::default() };
    let mut x = one_env(1);
    // The tracker's delta L_{t−1} − L_t = +0.05 (loss fell): z = −0.05/0.05 = −1 → −5·z = +5.
    x.loss_delta[0] = 0.05;
    close(run(&config, &x).term(Term::LossDelta, 0), 5.0, "improvement rewarded");
    // Loss rose by 0.05: z = 1, halved → −2.5.
    x.loss_delta[0] = -0.05;
    close(run(&config, &x).term(Term::LossDelta, 0), -2.5, "regression penalised");
    // First epoch (no previous loss, delta +∞): no change, not the reference's −12.5.
    x.loss_delta[0] = f64::INFINITY;
    close(run(&config, &x).term(Term::LossDelta, 0), 0.0, "first epoch");
    // Terminal: clip((2.3 − 1.5)/2.0, 0, 1) = 0.4; rent with a 6-epoch-old seed of 2000 params on a
    // 10 000 host: −min(0.05·ln(1.2), 5) = −0.009116077839697737.
    x.epoch = 25;
    seed(&mut x, 0, SeedStage::Blending, 2, 6, 0.5);
    let out = run(&config, &x);
    close(out.term(Term::Terminal, 0), 0.4, "loss terminal");
    close(out.term(Term::Rent, 0), -0.009116077839697737, "loss rent");
    // Stage term: 0.1·(γ·Φ(BLENDING) − Φ(TRAINING)) = 0.1·(3.4825 − 2) = 0.14825.
    close(out.term(Term::StagePotential, 0), 0.14825, "stage term");
    // kasmina §8.2e: while the blend-out freeze holds the seed, `active_seed_params` counts none of its
    // parameters, `total_params` is the host's and no rent is due. A second, trainable seed of 1000
    // params in slot 1 pays −min(0.05·ln(1.1), 5) alone.
    let mut x = one_env(2);
    x.epoch = 25;
    seed(&mut x, 0, SeedStage::Blending, 2, 6, 0.5);
    x.trainable_params[0] = 0.0;
    close(run(&config, &x).term(Term::Rent, 0), 0.0, "frozen seed: no rent");
    seed(&mut x, 1, SeedStage::Holding, 1, 8, 1.0);
    x.params[1] = 1_000.0;
    x.trainable_params[1] = 1_000.0;
    close(run(&config, &x).term(Term::Rent, 0), -0.05 * 1.1f64.ln(), "only the trainable seed's rent");
}

#[test]
fn the_normaliser_divides_by_the_running_std_and_clips() {
    let mut n = RewardNormalizer::new();
    // One sample: std 1.
    close(n.update_and_normalize(1.0), 1.0, "first");
    // Samples 1, 3: mean 2, sample variance 2 → 3/√2.
    close(n.update_and_normalize(3.0), 2.1213203435596424, "second");
    // Samples 1, 3, 0: mean 4/3, m2 = 2 + 2·(4/3) = 14/3, variance 7/3 → 0/… = 0.
    close(n.update_and_normalize(0.0), 0.0, "third");
    close(n.m2, 14.0 / 3.0, "m2");
    // No mean subtraction: samples 4, 6, 4, 6, 6 have mean 5.2 and sample variance 4.8/4 = 1.2, and the
    // last one normalises to 6/√1.2 (with the mean taken off it would be 0.73).
    let mut n = RewardNormalizer::new();
    for r in [4.0, 6.0, 4.0, 6.0] {
        n.update_and_normalize(r);
    }
    close(n.update_and_normalize(6.0), 5.477225575051661, "divided, not centred");
    // A clip at ±10: after 400 rewards of ±0.01 the std is ≈ 0.05 once 1.0 joins them (≈ 0.01
    // before), so ±1.0 lands far beyond 10.
    let mut n = RewardNormalizer::new();
    for i in 0..400 {
        n.update_and_normalize(if i % 2 == 0 { 0.01 } else { -0.01 });
    }
    assert_eq!(n.update_and_normalize(1.0), 10.0);
    assert_eq!(n.update_and_normalize(-1.0), -10.0);
}
