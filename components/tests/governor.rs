//! Tolaria's governor (spec tamiyo §6, simic §1.6): the vital-sign golden vectors of §7.3, the
//! lobotomy bounds, divergence bookkeeping, the snapshot cadence (with its reference quirk), the
//! rollback report and prune, and the preflight veto.

use esper_components::governor::{
    GOVERNOR_MIN_SAMPLES, GovernorConfigError, rollback_prune_slot, snapshot_due,
};
use esper_components::lifecycle::{self, Germination};
use esper_components::*;

const LN10: f64 = std::f64::consts::LN_10;

/// A governor whose history holds `values` (each a healthy, non-panicking check).
fn with_history(config: &GovernorConfig, values: &[f64]) -> GovernorState {
    let mut g = GovernorState::default();
    for &v in values {
        assert_eq!(g.check_vital_signs(config, v), None, "history value {v} must be healthy");
    }
    g
}

/// Ten samples around 1.0 (population std ≈ 0.0082).
fn around_one() -> Vec<f64> {
    (0..10).map(|i| 1.0 + 0.01 * f64::from(i % 3)).collect()
}

// ---------------------------------------------------------------------------------------------
// Golden vectors (tamiyo §7.3)

#[test]
fn golden_nan_after_a_stable_history_panics_immediately() {
    let c = GovernorConfig::default();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut g = with_history(&c, &around_one());
        assert_eq!(g.check_vital_signs(&c, bad), Some(PanicReason::Nan));
        assert_eq!(g.loss_history.len(), 10, "history untouched");
        assert_eq!(g.consecutive_panics, 0, "counter untouched");
        assert!(!g.pending_panic);
        assert_eq!(g.panic_reason, Some(PanicReason::Nan));
        assert!(g.panic_loss.unwrap().is_nan() || g.panic_loss.unwrap().is_infinite());
    }
    // Even during warm-up.
    let mut g = GovernorState::default();
    assert_eq!(g.check_vital_signs(&c, f64::NAN), Some(PanicReason::Nan));
    assert!(g.loss_history.is_empty());
}

#[test]
fn golden_spike_panics_with_one_required_panic() {
    let c = GovernorConfig {
        min_panics_before_rollback: 1,
        sensitivity: 3.0,
        multiplier: 2.0,
        absolute_threshold: 5.0,
        ..GovernorConfig::default()
    };
    let mut g = with_history(&c, &around_one());
    assert_eq!(g.check_vital_signs(&c, 50.0), Some(PanicReason::Divergence));
    assert_eq!((g.consecutive_panics, g.pending_panic, g.panic_loss), (1, true, Some(50.0)));
}

#[test]
fn golden_absolute_threshold_gates_a_spike() {
    let c = GovernorConfig {
        absolute_threshold: 20.0,
        min_panics_before_rollback: 1,
        ..GovernorConfig::default()
    };
    let twos = with_history(&c, &[2.0; 10]);
    let mut g = twos;
    assert_eq!(g.check_vital_signs(&c, 15.0), None, "15 ≤ 20: not anomalous");
    assert_eq!(g.loss_history.len(), 11, "a non-anomalous loss joins the history");
    let mut g = twos;
    assert_eq!(g.check_vital_signs(&c, 25.0), Some(PanicReason::Divergence));
    assert_eq!(g.loss_history.len(), 10);
}

#[test]
fn golden_lobotomy_bounds() {
    let c = GovernorConfig::default();
    assert!((0.6 * LN10 - 1.3816).abs() < 1e-4 && (0.065 * LN10 - 0.1497).abs() < 1e-4);
    assert_eq!(c.random_guess_loss, LN10);
    let low = with_history(&c, &[1.3; 10]); // mean 1.3 < 1.3816
    for (loss, expect) in [
        (LN10, Some(PanicReason::Lobotomy)),
        (LN10 + 0.149, Some(PanicReason::Lobotomy)),
        (LN10 - 0.149, Some(PanicReason::Lobotomy)),
        (LN10 + 0.150, None),
        (LN10 - 0.150, None),
    ] {
        let mut g = low;
        assert_eq!(g.check_vital_signs(&c, loss), expect, "loss {loss}");
    }
    let mut g = low;
    g.check_vital_signs(&c, LN10);
    assert_eq!(
        (g.panic_reason, g.panic_loss, g.loss_history.len()),
        (Some(PanicReason::Lobotomy), Some(LN10), 10)
    );
    // A history mean just above 0.6·ln 10 is not "doing well": no lobotomy.
    let mut high = with_history(&c, &[1.3817; 10]);
    assert_eq!(high.check_vital_signs(&c, LN10), None);
    // And it needs ten samples: with nine the loss just joins the warm-up history.
    let mut nine = with_history(&c, &[1.0; 9]);
    assert_eq!(nine.check_vital_signs(&c, LN10), None);
    assert_eq!(nine.loss_history.len(), 10);
}

#[test]
fn lobotomy_uses_ln_of_the_class_count() {
    let c100 = GovernorConfig::for_classes(100);
    assert!((c100.random_guess_loss - 100f64.ln()).abs() < 1e-15);
    let mut g = with_history(&c100, &[2.0; 10]); // 2.0 < 0.6·ln 100 = 2.763
    assert_eq!(g.check_vital_signs(&c100, 4.6), Some(PanicReason::Lobotomy));
    let c10 = GovernorConfig::for_classes(10);
    let mut g = with_history(&c10, &[2.0; 10]); // 2.0 ≥ 1.3816 for CIFAR-10
    assert_eq!(g.check_vital_signs(&c10, LN10), None);
}

// ---------------------------------------------------------------------------------------------
// Divergence and history bookkeeping

#[test]
fn divergence_needs_three_consecutive_anomalies_which_never_enter_the_history() {
    let c = GovernorConfig::default();
    let mut g = with_history(&c, &[1.0; 10]);
    let (mean, std) = g.history_stats();
    assert_eq!((mean, std), (1.0, 0.0));
    let results: Vec<_> = (0..4).map(|_| g.check_vital_signs(&c, 50.0)).collect();
    assert_eq!(results, vec![None, None, Some(PanicReason::Divergence), Some(PanicReason::Divergence)]);
    assert_eq!(g.consecutive_panics, 4);
    assert_eq!(g.loss_history.len(), 10);
    assert_eq!(g.history_stats(), (mean, std), "anomalies are not added to the history");
    // A healthy loss clears the streak.
    assert_eq!(g.check_vital_signs(&c, 1.0), None);
    assert_eq!((g.consecutive_panics, g.pending_panic, g.panic_loss, g.panic_reason), (0, false, None, None));
}

#[test]
fn a_pending_divergence_is_remembered_but_not_a_panic() {
    let c = GovernorConfig::default();
    let mut g = with_history(&c, &[1.0; 10]);
    assert_eq!(g.check_vital_signs(&c, 40.0), None);
    assert_eq!(
        (g.pending_panic, g.panic_loss, g.panic_reason),
        (true, Some(40.0), Some(PanicReason::Divergence))
    );
    // Interrupted streaks start over.
    assert_eq!(g.check_vital_signs(&c, 40.0), None);
    assert_eq!(g.check_vital_signs(&c, 1.0), None);
    assert_eq!(g.check_vital_signs(&c, 40.0), None);
    assert_eq!(g.check_vital_signs(&c, 40.0), None);
    assert_eq!(g.consecutive_panics, 2);
}

#[test]
fn every_condition_of_the_anomaly_is_required() {
    // History mean 4, std 2 → mean + 6σ = 16, 3·mean = 12, absolute 12.
    let c = GovernorConfig { min_panics_before_rollback: 1, ..GovernorConfig::default() };
    let hist = [2.0, 6.0, 2.0, 6.0, 2.0, 6.0, 2.0, 6.0, 2.0, 6.0];
    let g0 = with_history(&c, &hist);
    assert_eq!(g0.history_stats(), (4.0, 2.0));
    let check = |loss: f64, c: &GovernorConfig| {
        let mut g = g0;
        g.check_vital_signs(c, loss)
    };
    assert_eq!(check(15.9, &c), None, "below mean + 6σ");
    assert_eq!(check(16.1, &c), Some(PanicReason::Divergence));
    assert_eq!(check(16.1, &GovernorConfig { absolute_threshold: 17.0, ..c }), None, "below absolute");
    assert_eq!(check(16.1, &GovernorConfig { multiplier: 4.1, ..c }), None, "below multiplier·mean");
    assert_eq!(
        check(16.1, &GovernorConfig { sensitivity: 3.0, multiplier: 1.0, absolute_threshold: 0.0, ..c }),
        Some(PanicReason::Divergence)
    );
}

#[test]
fn warm_up_never_panics_on_a_finite_loss() {
    let c = GovernorConfig::default();
    let mut g = GovernorState::default();
    for v in [1.0, 1000.0, 1e9, 2.3] {
        assert_eq!(g.check_vital_signs(&c, v), None);
    }
    assert_eq!(g.loss_history.len(), 4);
    assert_eq!(GOVERNOR_MIN_SAMPLES, 10);
}

#[test]
fn history_is_a_window_of_twenty() {
    let c = GovernorConfig::default();
    let values: Vec<f64> = (0..25).map(|i| 1.0 + 0.001 * f64::from(i)).collect();
    let g = with_history(&c, &values);
    assert_eq!(g.loss_history.len(), 20);
    assert_eq!(g.loss_history.iter().collect::<Vec<_>>(), values[5..].to_vec());
}

#[test]
fn config_validation_and_punishment() {
    let c = GovernorConfig::default();
    assert_eq!(
        (
            c.sensitivity,
            c.multiplier,
            c.absolute_threshold,
            c.death_penalty,
            c.history_window,
            c.min_panics_before_rollback
        ),
        (6.0, 3.0, 12.0, 10.0, 20, 3)
    );
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(
        GovernorConfig { history_window: 9, ..c }.validate(),
        Err(GovernorConfigError::HistoryWindowTooSmall(9))
    );
    assert_eq!(GovernorConfig { history_window: 10, ..c }.validate(), Ok(()));
    assert_eq!(
        GovernorConfig { history_window: 33, ..c }.validate(),
        Err(GovernorConfigError::HistoryWindowTooLarge(33))
    );
    assert_eq!(c.punishment_reward(), -10.0);
}

// ---------------------------------------------------------------------------------------------
// Snapshot cadence (tamiyo §6.4)

#[test]
fn snapshot_every_five_epochs_and_after_a_fossilization() {
    let c = GovernorConfig::default();
    let mut g = GovernorState::default();
    let mut taken = vec![];
    for epoch in 1..=12 {
        if g.check_and_snapshot(&c, epoch, 1.0).snapshot {
            taken.push(epoch);
        }
        if epoch == 6 {
            g.note_fossilization(); // FOSSILIZE succeeded in epoch 6's action, after its check
        }
    }
    // Epoch 6's check ran before its action: the flag is seen by epoch 7's check and cleared there.
    assert_eq!(taken, vec![5, 7, 10]);
    assert!(!g.fossilized_since_snapshot);
    assert!(snapshot_due(15, false) && snapshot_due(3, true) && !snapshot_due(3, false));
}

#[test]
fn a_panic_blocks_the_snapshot_and_keeps_the_flag() {
    let c = GovernorConfig::default();
    let mut g = with_history(&c, &[1.0; 10]);
    g.note_fossilization();
    let v = g.check_and_snapshot(&c, 10, f64::NAN);
    assert_eq!(v, VitalSigns { panic: Some(PanicReason::Nan), snapshot: false });
    assert!(g.fossilized_since_snapshot);
    let v = g.check_and_snapshot(&c, 11, 1.0);
    assert_eq!(v, VitalSigns { panic: None, snapshot: true });
    assert!(!g.fossilized_since_snapshot);
}

#[test]
fn quirk_a_divergence_below_the_panic_count_does_not_block_a_snapshot() {
    // Reference quirk kept: check_vital_signs returns false for the 1st and 2nd anomaly, so the
    // anomalous epoch's weights become the last-known-good snapshot.
    let c = GovernorConfig::default();
    let mut g = with_history(&c, &[1.0; 10]);
    let v = g.check_and_snapshot(&c, 15, 50.0);
    assert_eq!(v, VitalSigns { panic: None, snapshot: true });
    assert!(g.pending_panic);
}

// ---------------------------------------------------------------------------------------------
// Rollback

#[test]
fn rollback_reports_and_resets_the_panic_state() {
    let c = GovernorConfig::default();
    let hist = [2.0, 6.0, 2.0, 6.0, 2.0, 6.0, 2.0, 6.0, 2.0, 6.0];
    let mut g = with_history(&c, &hist);
    for _ in 0..3 {
        g.check_vital_signs(&c, 100.0);
    }
    assert_eq!(g.rollback_reason(), PanicReason::Divergence);
    let r = g.execute_rollback(&c);
    assert_eq!(
        r,
        RollbackReport {
            reason: PanicReason::Divergence,
            loss_at_panic: 100.0,
            loss_threshold: 4.0 + 6.0 * 2.0,
            consecutive_panics: 3
        }
    );
    assert_eq!((g.consecutive_panics, g.pending_panic, g.panic_loss, g.panic_reason), (0, false, None, None));
    assert_eq!(g.loss_history.len(), 10, "the history survives a rollback");
    // No recorded reason: the default reason, NaN loss, threshold 0 for an empty history.
    let mut fresh = GovernorState::default();
    let r = fresh.execute_rollback(&c);
    assert_eq!((r.reason, r.loss_threshold, r.consecutive_panics), (PanicReason::Rollback, 0.0, 0));
    assert!(r.loss_at_panic.is_nan());
    // reset() clears everything.
    g.note_fossilization();
    g.reset();
    assert_eq!(g, GovernorState::default());
}

#[test]
fn panic_reasons_map_onto_governor_prune_reasons() {
    let pairs = [
        (PanicReason::Nan, PruneReason::GovernorNan, "governor_nan"),
        (PanicReason::Lobotomy, PruneReason::GovernorLobotomy, "governor_lobotomy"),
        (PanicReason::Divergence, PruneReason::GovernorDivergence, "governor_divergence"),
        (PanicReason::Rollback, PruneReason::GovernorRollback, "governor_rollback"),
    ];
    for (panic, prune, name) in pairs {
        assert_eq!(panic.prune_reason(), prune);
        assert!(prune.is_governor());
        assert_eq!(panic.as_str(), name);
    }
}

fn germinated(tempo_epochs: u32) -> SlotState {
    let mut s = SlotState::default();
    let g = Germination {
        blueprint: BlueprintAction::ConvLight,
        blend: BlendId::Sigmoid,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs,
        alpha_target: None,
    };
    lifecycle::germinate(&mut s.view(), g, Topology::Cnn).unwrap();
    s
}

/// A seed advanced to BLENDING (G1, then G2 with healthy gradients after 10 epochs).
fn blending(tempo_epochs: u32) -> SlotState {
    let config = LifecycleConfig::default();
    let mut s = germinated(tempo_epochs);
    lifecycle::record_accuracy(&mut s.view(), 50.0);
    assert_eq!(lifecycle::advance_stage(&mut s.view(), None, &config), Ok(true));
    s.telemetry.gradient_health = Some(1.0);
    for _ in 0..10 {
        lifecycle::record_accuracy(&mut s.view(), 50.0);
    }
    assert_eq!(lifecycle::advance_stage(&mut s.view(), None, &config), Ok(true));
    s
}

/// Five slots: empty, TRAINING, BLENDING mid-ramp, FOSSILIZED, EMBARGOED.
fn mixed_env() -> [SlotState; 5] {
    let config = LifecycleConfig::default();
    let mut training = germinated(5);
    assert_eq!(lifecycle::advance_stage(&mut training.view(), None, &config), Ok(true));
    let mut ramping = blending(8);
    lifecycle::step_epoch(&mut ramping.view(), &config);
    let mut fossil = blending(3);
    for _ in 0..3 {
        lifecycle::step_epoch(&mut fossil.view(), &config);
    }
    assert_eq!(lifecycle::advance_stage(&mut fossil.view(), None, &config), Ok(true));
    fossil.metrics.counterfactual_contribution = Some(2.0);
    assert_eq!(lifecycle::advance_stage(&mut fossil.view(), Some(SeedStage::Fossilized), &config), Ok(true));
    let mut cooling = germinated(5);
    assert!(lifecycle::prune(&mut cooling.view(), PruneReason::Policy, PruneInitiator::Policy));
    lifecycle::step_epoch(&mut cooling.view(), &config);
    let env = [SlotState::default(), training, ramping, fossil, cooling];
    let stages = env.map(|s| s.stage.current);
    use SeedStage::*;
    assert_eq!(stages, [Dormant, Training, Blending, Fossilized, Embargoed]);
    assert_eq!(env[2].controller.mode, AlphaMode::Up);
    env
}

#[test]
fn rollback_prunes_every_live_seed_and_nothing_else() {
    let before = mixed_env();
    let mut env = before;
    let pruned = rollback_prune_states(&mut env, PanicReason::Divergence);
    assert_eq!(pruned, 0b00110);
    use SeedStage::*;
    assert_eq!(env.map(|s| s.stage.current), [Dormant, Pruned, Pruned, Fossilized, Embargoed]);
    for i in [1, 2] {
        assert_eq!(env[i].metrics.auto_pruned, Some(PruneReason::GovernorDivergence));
        assert_eq!((env[i].alpha.0, env[i].controller.mode), (0.0, AlphaMode::Hold), "even mid-ramp");
    }
    for i in [0, 3] {
        assert_eq!(env[i], before[i], "slot {i} untouched");
    }
    // Reference quirk kept: `prune` writes `auto_pruned` before it tries the PRUNED transition, so the
    // slot in cooldown keeps its stage but is flagged as auto-pruned (its env pays the penalty for it).
    let mut flagged = before[4];
    flagged.metrics.auto_pruned = Some(PruneReason::GovernorDivergence);
    assert_eq!(env[4], flagged, "cooldown slot: only the flag changes");
    // The same over borrowed components, as a system would call it.
    let mut env = before;
    let [a, b, c, d, e] = &mut env;
    let mut views = [a.view(), b.view(), c.view(), d.view(), e.view()];
    assert_eq!(rollback_prune_slots(&mut views, PanicReason::Nan), 0b00110);
    assert_eq!(env[1].metrics.auto_pruned, Some(PruneReason::GovernorNan));
    // And one slot at a time.
    let mut s = before[2];
    assert!(rollback_prune_slot(&mut s.view(), PanicReason::Lobotomy));
    assert!(!rollback_prune_slot(&mut s.view(), PanicReason::Lobotomy), "already in cooldown");
}

// ---------------------------------------------------------------------------------------------
// Preflight veto (tamiyo §6.6)

fn request(action: FactoredAction, stage: SeedStage) -> PreflightRequest {
    PreflightRequest::from_action(&action, stage, 1.0, 50.0, 0, 1).expect("valid op")
}

fn germinate_action() -> FactoredAction {
    FactoredAction {
        blueprint: BlueprintAction::ConvLight as u8,
        op: LifecycleOp::Germinate as u8,
        ..FactoredAction::wait()
    }
}

#[test]
fn preflight_checks_run_in_order() {
    use BlockedFactor::*;
    let g = germinate_action();
    // Everything wrong at once: the loss check wins, then the accuracy check, …
    let mut r = request(g, SeedStage::Training);
    r.val_loss = f64::NAN;
    r.val_accuracy = f64::INFINITY;
    r.cooldown_remaining = -1;
    r.max_seeds = 1;
    r.active_seed_count = 2;
    r.blueprint = None;
    assert_eq!(preflight_lifecycle_mutation(&r), Err(ValLossFinite));
    r.val_loss = 1.0;
    assert_eq!(preflight_lifecycle_mutation(&r), Err(ValAccuracyFinite));
    r.val_accuracy = 50.0;
    assert_eq!(preflight_lifecycle_mutation(&r), Err(CooldownNonnegative));
    r.cooldown_remaining = 0;
    assert_eq!(preflight_lifecycle_mutation(&r), Err(ActiveSeedCapacity));
    r.active_seed_count = 1;
    assert_eq!(preflight_lifecycle_mutation(&r), Err(BlueprintPresent));
    r.blueprint = Some(BlueprintAction::ConvLight);
    assert_eq!(preflight_lifecycle_mutation(&r), Err(SlotEmptyForGermination));
    r.seed_stage = None;
    assert_eq!(preflight_lifecycle_mutation(&r), Ok(()));
    assert_eq!(ActiveSeedCapacity.as_str(), "active_seed_capacity");
    assert_eq!(SlotEmptyForGermination.as_str(), "slot_empty_for_germination");
}

#[test]
fn preflight_decodes_factored_actions() {
    use BlockedFactor::*;
    let g = germinate_action();
    // Only a live seed blocks germination here; cooldown and empty slots pass (masks refuse those).
    assert_eq!(preflight_lifecycle_mutation(&request(g, SeedStage::Embargoed)), Ok(()));
    assert_eq!(preflight_lifecycle_mutation(&request(g, SeedStage::Dormant)), Ok(()));
    assert_eq!(
        preflight_lifecycle_mutation(&request(g, SeedStage::Fossilized)),
        Err(SlotEmptyForGermination)
    );
    let bad_bp = FactoredAction { blueprint: 13, ..g };
    assert_eq!(preflight_lifecycle_mutation(&request(bad_bp, SeedStage::Dormant)), Err(BlueprintPresent));
    let retarget = FactoredAction { op: LifecycleOp::SetAlphaTarget as u8, ..FactoredAction::wait() };
    assert_eq!(preflight_lifecycle_mutation(&request(retarget, SeedStage::Holding)), Ok(()));
    let no_target = FactoredAction { alpha_target: 3, ..retarget };
    assert_eq!(
        preflight_lifecycle_mutation(&request(no_target, SeedStage::Holding)),
        Err(AlphaTargetPresent)
    );
    let no_speed = FactoredAction { alpha_speed: 4, ..retarget };
    assert_eq!(
        preflight_lifecycle_mutation(&request(no_speed, SeedStage::Holding)),
        Err(AlphaScheduleComplete)
    );
    let prune = FactoredAction { op: LifecycleOp::Prune as u8, ..FactoredAction::wait() };
    assert_eq!(preflight_lifecycle_mutation(&request(prune, SeedStage::Training)), Ok(()));
    let prune_no_curve = FactoredAction { alpha_curve: 5, ..prune };
    assert_eq!(
        preflight_lifecycle_mutation(&request(prune_no_curve, SeedStage::Training)),
        Err(AlphaScheduleComplete)
    );
    // ADVANCE / FOSSILIZE only face the env-wide checks.
    let advance = FactoredAction { op: LifecycleOp::Advance as u8, alpha_curve: 9, ..FactoredAction::wait() };
    assert_eq!(preflight_lifecycle_mutation(&request(advance, SeedStage::Training)), Ok(()));
    let nan = PreflightRequest::from_action(&advance, SeedStage::Training, f64::NAN, 50.0, 0, 1).unwrap();
    assert_eq!(preflight_lifecycle_mutation(&nan), Err(ValLossFinite));
    // WAIT is never vetoed; an invalid op cannot be decoded.
    let wait =
        PreflightRequest::from_action(&FactoredAction::wait(), SeedStage::Dormant, f64::NAN, f64::NAN, 0, 0)
            .unwrap();
    assert_eq!(preflight_lifecycle_mutation(&wait), Ok(()));
    assert!(
        PreflightRequest::from_action(&FactoredAction { op: 6, ..g }, SeedStage::Dormant, 1.0, 50.0, 0, 0)
            .is_none()
    );
    // Capacity is "more than max", not "at max".
    let full = PreflightRequest::from_action(&advance, SeedStage::Training, 1.0, 50.0, 2, 2).unwrap();
    assert_eq!(preflight_lifecycle_mutation(&full), Ok(()));
}
