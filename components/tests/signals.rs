//! The SignalTracker of spec tamiyo §5.3: deltas, plateau counter, the stabilization latch
//! (threshold 0.03, regression bound 0.05, 3 epochs), best values, the exposed histories, the summary
//! seed and `peek`.

use esper_components::lifecycle::{self, Germination};
use esper_components::signals::{HistoryRing, summary_seed};
use esper_components::*;

fn obs(epoch: u32, val_loss: f64, val_accuracy: f64) -> EpochObservation {
    EpochObservation {
        epoch,
        global_step: u64::from(epoch) * 100,
        train_loss: 0.0,
        train_accuracy: 0.0,
        val_loss,
        val_accuracy,
    }
}

fn report(slot: u8, stage: SeedStage) -> SeedReport {
    SeedReport { slot, stage, ..SeedReport::default() }
}

/// Feed `(loss, acc)` pairs from epoch 1 and return the last signals.
fn run(tracker: &mut SignalTracker, cfg: &SignalConfig, seq: &[(f64, f64)]) -> TrainingSignals {
    let mut last = None;
    for (i, &(l, a)) in seq.iter().enumerate() {
        last = Some(tracker.update(cfg, &obs(i as u32 + 1, l, a), &[]));
    }
    last.expect("non-empty sequence")
}

#[test]
fn ring_keeps_the_newest_values_in_order() {
    let mut r = HistoryRing::<10>::default();
    assert!(r.is_empty() && r.python_min().is_none() && r.newest().is_none());
    for i in 1..=12 {
        r.push(f64::from(i));
    }
    assert_eq!(r.len(), 10);
    assert_eq!(r.iter().collect::<Vec<_>>(), (3..=12).map(f64::from).collect::<Vec<_>>());
    assert_eq!(r.newest(), Some(12.0));
    assert_eq!(r.last::<5>(), ([8.0, 9.0, 10.0, 11.0, 12.0], 5));
    let mut short = HistoryRing::<10>::default();
    short.push(1.5);
    short.push(2.5);
    assert_eq!(short.last::<5>(), ([1.5, 2.5, 0.0, 0.0, 0.0], 2));
    // A deque with maxlen 4 inside a ring of 10.
    let mut bounded = HistoryRing::<10>::default();
    for i in 1..=6 {
        bounded.push_bounded(f64::from(i), 4);
    }
    assert_eq!(bounded.iter().collect::<Vec<_>>(), vec![3.0, 4.0, 5.0, 6.0]);
    assert_eq!(bounded.mean(), 4.5);
}

#[test]
fn python_min_keeps_a_leading_nan_and_skips_later_ones() {
    let mut r = HistoryRing::<4>::default();
    for v in [2.0, f64::NAN, 1.0] {
        r.push(v);
    }
    assert_eq!(r.python_min(), Some(1.0));
    let mut lead = HistoryRing::<4>::default();
    for v in [f64::NAN, 1.0] {
        lead.push(v);
    }
    assert!(lead.python_min().unwrap().is_nan());
}

#[test]
fn first_update_has_infinite_loss_delta_and_one_history_entry() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    let s = t.update(&cfg, &obs(1, 2.0, 30.0), &[]);
    assert_eq!(s.loss_delta, f64::INFINITY);
    assert_eq!(s.accuracy_delta, 30.0);
    assert_eq!(s.plateau_epochs, 0);
    assert!(!s.host_stabilized);
    assert_eq!(t.stable_count, 0, "prev_loss = inf: no stabilization test on the first epoch");
    assert_eq!((s.best_val_accuracy, s.best_val_loss), (30.0, 2.0));
    assert_eq!((s.loss_history(), s.accuracy_history()), (&[2.0][..], &[30.0][..]));
    assert_eq!((s.epoch, s.global_step), (1, 100));
    assert_eq!((t.prev_loss, t.prev_accuracy), (2.0, 30.0));
}

#[test]
fn plateau_counts_gains_below_half_a_point_and_resets_on_a_real_gain() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    let plateau: Vec<u32> = [30.0, 30.25, 30.5, 31.0, 30.5, 30.5]
        .iter()
        .enumerate()
        .map(|(i, &a)| t.update(&cfg, &obs(i as u32 + 1, 1.0, a), &[]).plateau_epochs)
        .collect();
    // +30 → 0; +0.25 → 1; +0.25 → 2; +0.5 (not < 0.5) → 0; −0.5 → 1; 0 → 2.
    assert_eq!(plateau, vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn stabilization_latches_after_three_consecutive_stable_epochs() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    // r = (prev − loss)/prev: 2→1.5 0.25 (explosive), 1.5→1.47 0.02, 1.47→1.46 ≈0.0068, 1.46→1.45 ≈0.0068.
    let mut stabilized = vec![];
    let mut counts = vec![];
    for (i, l) in [2.0, 1.5, 1.47, 1.46, 1.45].into_iter().enumerate() {
        stabilized.push(t.update(&cfg, &obs(i as u32 + 1, l, 50.0), &[]).host_stabilized);
        counts.push(t.stable_count);
    }
    assert_eq!(counts, vec![0, 0, 1, 2, 3]);
    assert_eq!(stabilized, vec![false, false, false, false, true]);
    // The latch never opens again, even on an explosive epoch, and the counter stops moving.
    let s = t.update(&cfg, &obs(6, 0.5, 60.0), &[]);
    assert!(s.host_stabilized);
    assert_eq!(t.stable_count, 3);
}

#[test]
fn stable_window_is_open_between_minus_five_and_plus_three_percent() {
    let cfg = SignalConfig::default();
    // One step from loss 1.0 to `next`, starting with stable_count 1 so a stable step shows as 2.
    let step = |next: f64| {
        let mut t = SignalTracker::new(&cfg);
        run(&mut t, &cfg, &[(1.0, 50.0), (1.0, 50.0)]);
        assert_eq!(t.stable_count, 1);
        t.update(&cfg, &obs(3, next, 50.0), &[]);
        t.stable_count
    };
    assert_eq!(step(0.971), 2, "r = 0.029 improves slowly: stable");
    assert_eq!(step(0.969), 0, "r = 0.031 is still explosive growth");
    assert_eq!(step(1.04), 2, "r = −0.04: a small regression is stable");
    assert_eq!(step(1.06), 0, "r = −0.06 regresses too much");
    assert_eq!(step(f64::NAN), 0, "a NaN ratio is not stable");
}

#[test]
fn stabilization_skips_epochs_after_a_tiny_or_non_finite_previous_loss() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    run(&mut t, &cfg, &[(1.0, 50.0), (1.0, 50.0)]);
    assert_eq!(t.stable_count, 1);
    t.update(&cfg, &obs(3, 0.0, 50.0), &[]); // r = 1: explosive → reset
    assert_eq!(t.stable_count, 0);
    t.update(&cfg, &obs(4, 0.0, 50.0), &[]); // prev_loss 0 ≤ 1e-8: skipped, count unchanged
    t.update(&cfg, &obs(5, 5.0, 50.0), &[]); // prev_loss 0 again: skipped
    assert_eq!(t.stable_count, 0);
    t.update(&cfg, &obs(6, f64::INFINITY, 50.0), &[]); // r = −inf: not stable
    t.update(&cfg, &obs(7, 1.0, 50.0), &[]); // prev_loss inf: skipped
    assert_eq!(t.stable_count, 0);
    t.update(&cfg, &obs(8, 1.0, 50.0), &[]);
    assert_eq!(t.stable_count, 1);
}

#[test]
fn zero_stabilization_epochs_means_stabilized_from_the_start() {
    let cfg = SignalConfig { stabilization_epochs: 0, ..SignalConfig::default() };
    let mut t = SignalTracker::new(&cfg);
    assert!(t.update(&cfg, &obs(1, 5.0, 10.0), &[]).host_stabilized);
    t.reset(&cfg);
    assert!(t.is_stabilized);
    assert!(!SignalTracker::new(&SignalConfig::default()).is_stabilized);
}

#[test]
fn histories_expose_the_last_five_and_best_loss_is_the_window_minimum() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    // Epoch 1 has the global best loss 0.5; ten later epochs push it out of the 10-long window.
    let mut seq = vec![(0.5, 10.0)];
    seq.extend((0..10).map(|i| (1.0 + 0.1 * f64::from(i), 20.0 + f64::from(i))));
    let s = run(&mut t, &cfg, &seq);
    assert_eq!(s.history_len, 5);
    let expected: Vec<f64> = (5..10).map(|i| 1.0 + 0.1 * f64::from(i)).collect();
    assert_eq!(s.loss_history(), &expected[..]);
    assert_eq!(s.accuracy_history(), &[25.0, 26.0, 27.0, 28.0, 29.0]);
    assert_eq!(s.loss_history[4], s.val_loss, "the current epoch is already in the history");
    assert_eq!(t.loss_history.len(), 10);
    assert_eq!(s.best_val_loss, 1.0, "window minimum, not the global best 0.5");
    assert_eq!(s.best_val_accuracy, 29.0);
}

#[test]
fn best_accuracy_is_a_running_max() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    let best: Vec<f64> = [40.0, 55.0, 50.0, f64::NAN, 56.0]
        .iter()
        .enumerate()
        .map(|(i, &a)| t.update(&cfg, &obs(i as u32 + 1, 1.0, a), &[]).best_val_accuracy)
        .collect();
    assert_eq!(best, vec![40.0, 55.0, 55.0, 55.0, 56.0]);
}

#[test]
fn available_slots_are_slots_without_state() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    let slots = [
        report(0, SeedStage::Dormant),
        report(1, SeedStage::Embargoed),
        report(2, SeedStage::Training),
        report(3, SeedStage::Fossilized),
        report(4, SeedStage::Dormant),
    ];
    let s = t.update(&cfg, &obs(1, 1.0, 50.0), &slots);
    assert_eq!(s.available_slots, 2, "cooldown slots keep their state and are not available");
    assert_eq!(s.active_seed_count, 2, "TRAINING and FOSSILIZED hold a seed module");
}

#[test]
fn summary_seed_prefers_stage_then_alpha_then_the_most_negative_contribution() {
    let mk = |slot, stage, alpha, cc: Option<f64>| SeedReport {
        slot,
        stage,
        alpha,
        counterfactual_contribution: cc,
        epochs_in_stage: u32::from(slot) + 10,
        improvement_since_stage_start: f64::from(slot),
        ..SeedReport::default()
    };
    // Stage wins over alpha; cooldown stages (no module) never count even with a higher stage value.
    let slots = [
        mk(0, SeedStage::Blending, 0.9, Some(1.0)),
        mk(1, SeedStage::Holding, 0.5, Some(1.0)),
        mk(2, SeedStage::Embargoed, 0.0, None),
    ];
    assert_eq!(summary_seed(&slots).map(|s| s.slot), Some(1));
    // Same stage: higher alpha.
    let slots = [mk(0, SeedStage::Blending, 0.4, None), mk(1, SeedStage::Blending, 0.6, None)];
    assert_eq!(summary_seed(&slots).map(|s| s.slot), Some(1));
    // Same stage and alpha: the most negative contribution; an unmeasured one counts as +inf (least).
    let slots = [
        mk(0, SeedStage::Holding, 1.0, Some(-2.0)),
        mk(1, SeedStage::Holding, 1.0, Some(3.0)),
        mk(2, SeedStage::Holding, 1.0, None),
    ];
    assert_eq!(summary_seed(&slots).map(|s| s.slot), Some(0));
    // Full tie: the higher slot index.
    let slots = [mk(0, SeedStage::Training, 0.0, None), mk(1, SeedStage::Training, 0.0, None)];
    assert_eq!(summary_seed(&slots).map(|s| s.slot), Some(1));
    assert_eq!(summary_seed(&[report(0, SeedStage::Dormant)]), None);

    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    let slots = [mk(0, SeedStage::Blending, 0.3, None), mk(3, SeedStage::Holding, 1.0, Some(2.0))];
    let s = t.update(&cfg, &obs(1, 1.0, 50.0), &slots);
    assert_eq!((s.seed_stage, s.seed_epochs_in_stage, s.seed_alpha, s.seed_improvement), (6, 13, 1.0, 3.0));
    assert_eq!(s.summary_slot, Some(3));
    let s = t.update(&cfg, &obs(2, 1.0, 50.0), &[]);
    assert_eq!((s.seed_stage, s.seed_epochs_in_stage, s.seed_alpha, s.seed_improvement), (0, 0, 0.0, 0.0));
}

#[test]
fn peek_builds_signals_without_touching_the_tracker() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    run(&mut t, &cfg, &[(2.0, 40.0), (1.5, 45.0), (1.4, 45.2)]);
    let before = t;
    let p = t.peek(&obs(4, 1.2, 47.0), &[]);
    assert_eq!(t, before);
    assert!((p.loss_delta - 0.2).abs() < 1e-12 && (p.accuracy_delta - 1.8).abs() < 1e-12);
    assert_eq!(p.plateau_epochs, t.plateau_count, "the counter is reported as it stands");
    assert_eq!(p.loss_history(), &[2.0, 1.5, 1.4], "the peeked epoch is not appended");
    assert_eq!((p.best_val_accuracy, p.best_val_loss), (47.0, 1.2), "best values include the peeked epoch");
    // Peeking the epoch just recorded (the bootstrap case) gives zero deltas.
    let q = t.peek(&obs(3, 1.4, 45.2), &[]);
    assert_eq!((q.loss_delta, q.accuracy_delta), (0.0, 0.0));
    assert_eq!((q.best_val_accuracy, q.best_val_loss), (45.2, 1.4));
    // update() with the same observation differs exactly in the mutated parts.
    let u = t.update(&cfg, &obs(4, 1.2, 47.0), &[]);
    assert_eq!(u.loss_history(), &[2.0, 1.5, 1.4, 1.2]);
    assert_eq!((u.loss_delta, u.accuracy_delta), (p.loss_delta, p.accuracy_delta));
}

#[test]
fn reset_restores_a_fresh_tracker() {
    let cfg = SignalConfig::default();
    let mut t = SignalTracker::new(&cfg);
    run(&mut t, &cfg, &[(1.0, 50.0), (1.0, 50.0), (1.0, 50.0), (1.0, 50.0)]);
    assert!(t.is_stabilized && t.plateau_count > 0);
    t.reset(&cfg);
    assert_eq!(t, SignalTracker::new(&cfg));
    assert_eq!((t.prev_loss, t.prev_accuracy, t.best_accuracy), (f64::INFINITY, 0.0, 0.0));
}

#[test]
fn seed_report_reads_the_slot_components() {
    let mut s = SlotState::default();
    assert!(SeedReport::from_state(0, &s).is_empty());
    let g = Germination {
        blueprint: BlueprintAction::ConvHeavy,
        blend: BlendId::Sigmoid,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs: 3,
        alpha_target: None,
    };
    lifecycle::germinate(&mut s.view(), g, Topology::Cnn).unwrap();
    lifecycle::record_accuracy(&mut s.view(), 40.0);
    lifecycle::record_accuracy(&mut s.view(), 43.0);
    s.metrics.counterfactual_contribution = Some(1.25);
    let r = SeedReport::from_state(2, &s);
    assert_eq!(r.slot, 2);
    assert_eq!(r.stage, SeedStage::Germinated);
    assert_eq!((r.epochs_in_stage, r.epochs_total), (2, 2));
    assert_eq!((r.improvement_since_stage_start, r.total_improvement), (3.0, 3.0));
    assert_eq!((r.alpha, r.alpha_target, r.alpha_mode), (0.0, 0.0, AlphaMode::Hold));
    assert_eq!(r.counterfactual_contribution, Some(1.25));
    assert_eq!(r.blueprint, BlueprintAction::ConvHeavy);
    assert!(r.has_seed() && !r.is_empty());
    let all = SeedReport::from_states(&[SlotState::default(), s]);
    assert_eq!((all[0].slot, all[1].slot, all[1].stage), (0, 1, SeedStage::Germinated));
}
