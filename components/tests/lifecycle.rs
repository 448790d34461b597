//! The seed lifecycle of spec kasmina §1–3 and the invariants of §8.1: transitions, gates, germinate,
//! retarget, prune, the per-epoch tick and the exact epoch counts of the RL loop.

use crate::common;
use common::*;
use esper_components::alpha::ALPHA_EPSILON;
use esper_components::lifecycle::{self, Germination};
use esper_components::*;

const STANDARD: TempoAction = TempoAction::Standard;

#[test]
fn stage_values_match_the_contract() {
    let values: Vec<u8> = SeedStage::ALL.iter().map(|s| s.value()).collect();
    assert_eq!(values, vec![0, 1, 2, 3, 4, 6, 7, 8, 9, 10]);
    let features: Vec<usize> = SeedStage::ALL.iter().map(|s| s.feature_index()).collect();
    assert_eq!(features, (0..10).collect::<Vec<_>>());
    for s in SeedStage::ALL {
        assert_eq!(SeedStage::try_from(s.value()), Ok(s));
    }
    assert!(SeedStage::try_from(5).unwrap_err().to_string().contains("SHADOWING"));
    assert!(SeedStage::try_from(11).is_err());
    for (v, g) in
        [(0, GateLevel::G0), (1, GateLevel::G1), (2, GateLevel::G2), (3, GateLevel::G3), (5, GateLevel::G5)]
    {
        assert_eq!(GateLevel::try_from(v), Ok(g));
        assert_eq!(g as u8, v);
    }
    assert!(GateLevel::try_from(4).unwrap_err().contains("retired"));
    assert_eq!(LifecycleOp::ALL.map(|o| o as u8), [0, 1, 2, 3, 4, 5]);
    assert_eq!(BlueprintAction::ALL.map(|b| b as u8), core::array::from_fn(|i| i as u8));
    assert_eq!(BlueprintAction::ConvHeavy.id(), "conv_heavy");
    assert_eq!(AlphaAlgorithm::Gate as u8, 3);
    assert_eq!(AlphaMode::Down as u8, 2);
    assert_eq!(AlphaCurve::Sigmoid as u8, 3);
}

#[test]
fn stage_predicates() {
    use SeedStage::*;
    let active: Vec<_> = SeedStage::ALL.into_iter().filter(|s| s.is_active()).collect();
    assert_eq!(active, vec![Training, Blending, Holding, Fossilized]);
    let developing: Vec<_> = SeedStage::ALL.into_iter().filter(|s| s.is_developing()).collect();
    assert_eq!(developing, vec![Germinated, Training, Pruned, Embargoed, Resetting]);
    let failure: Vec<_> = SeedStage::ALL.into_iter().filter(|s| s.is_failure()).collect();
    assert_eq!(failure, vec![Pruned, Embargoed, Resetting]);
    assert!(Fossilized.is_terminal() && !Holding.is_terminal());
}

#[test]
fn transition_table_is_exact() {
    use SeedStage::*;
    let table: &[(SeedStage, &[SeedStage])] = &[
        (Unknown, &[Dormant]),
        (Dormant, &[Germinated]),
        (Germinated, &[Training, Pruned]),
        (Training, &[Blending, Pruned]),
        (Blending, &[Holding, Pruned]),
        (Holding, &[Fossilized, Blending, Pruned]),
        (Fossilized, &[]),
        (Pruned, &[Embargoed]),
        (Embargoed, &[Resetting]),
        (Resetting, &[Dormant]),
    ];
    for &(from, to) in table {
        assert_eq!(from.allowed_next(), to, "from {from}");
        for next in SeedStage::ALL {
            let mut slot = SlotState::default();
            slot.stage.current = from;
            slot.counters.epochs_in_stage = 4;
            slot.metrics.current_val_accuracy = 42.0;
            let ok = lifecycle::transition(&mut slot.view(), next);
            assert_eq!(ok, to.contains(&next), "{from} -> {next}");
            if ok {
                assert_eq!(
                    (slot.stage.current, slot.stage.previous, slot.stage.previous_epochs_in_stage),
                    (next, from, 4)
                );
                assert_eq!((slot.counters.epochs_in_stage, slot.metrics.accuracy_at_stage_start), (0, 42.0));
            } else {
                assert_eq!(slot.stage.current, from, "a refused transition changes nothing");
            }
        }
    }
    assert_eq!(Germinated.next_success_stage(), Some(Training));
    assert_eq!(Holding.next_success_stage(), Some(Fossilized));
    assert_eq!(Fossilized.next_success_stage(), None);
    assert_eq!(Pruned.next_success_stage(), Some(Embargoed).filter(|s| !s.is_failure()));
}

#[test]
fn advance_to_a_failure_stage_is_an_error() {
    let mut env = OneEnv::new(1, permissive());
    env.epoch(10.0, germinate_std(0, STANDARD));
    let config = permissive();
    let r = lifecycle::advance_stage(&mut env.slot_mut(0).view(), Some(SeedStage::Pruned), &config);
    assert_eq!(r, Err(lifecycle::LifecycleError::AdvanceToFailureStage(SeedStage::Pruned)));
    assert_eq!(env.stage(0), SeedStage::Germinated);
}

#[test]
fn record_accuracy_counts_and_tracks_best() {
    let mut env = OneEnv::new(1, permissive());
    env.epoch(10.0, germinate_std(0, STANDARD));
    for (i, acc) in [30.0, 50.0, 40.0, 45.0].into_iter().enumerate() {
        env.wait(acc);
        let m = env.slot(0).metrics;
        assert_eq!(env.slot(0).counters.epochs_total, i as u32 + 1, "epochs_total counts record calls");
        assert!(m.best_val_accuracy >= m.current_val_accuracy);
        assert_eq!(m.initial_val_accuracy, 30.0, "initial = first record");
    }
    assert_eq!(env.slot(0).metrics.best_val_accuracy, 50.0);
    assert_eq!(env.slot(0).metrics.total_improvement(), 15.0);
    // Records on an empty slot do nothing.
    let mut empty = SlotState::default();
    lifecycle::record_accuracy(&mut empty.view(), 99.0);
    assert_eq!(empty, SlotState::default());
}

/// GERMINATED → TRAINING → BLENDING → HOLDING → FOSSILIZED with the epoch numbers of kasmina §3.9.
#[test]
fn happy_path_with_exact_epoch_counts() {
    let mut env = OneEnv::new(1, permissive());
    // Epoch 1: germinate (tempo FAST = 3 ticks, sigmoid ramp).
    assert_eq!(env.epoch(10.0, germinate_std(0, TempoAction::Fast)), OpOutcome::Executed);
    assert_eq!(env.stage(0), SeedStage::Germinated);
    assert_eq!(env.slot(0).stage.previous, SeedStage::Dormant);
    // Epoch 2: ADVANCE (G1) → TRAINING.
    assert_eq!(env.epoch(11.0, op(LifecycleOp::Advance, 0)), OpOutcome::Executed);
    assert_eq!(env.stage(0), SeedStage::Training);
    assert!(env.slot(0).flags.isolate_gradients);
    env.healthy_gradients(0);
    // eics reaches 10 after the record of epoch 12: ADVANCE fails at 11, passes at 12.
    for e in 3..=10 {
        env.wait(10.0 + e as f64);
    }
    assert_eq!(env.epoch(21.0, op(LifecycleOp::Advance, 0)), OpOutcome::FailedInHandler, "epoch 11: eics 9");
    assert_eq!(env.stage(0), SeedStage::Training);
    assert_eq!(env.epoch(22.0, op(LifecycleOp::Advance, 0)), OpOutcome::Executed, "epoch 12: eics 10");
    assert_eq!(env.epoch, 12);
    let s = env.slot(0);
    assert_eq!(s.stage.current, SeedStage::Blending);
    assert!(s.metrics.blending_started);
    assert_eq!(s.metrics.accuracy_at_blending_start, 22.0);
    // The ramp's first tick ran in the step of epoch 12.
    assert!((s.alpha.0 - 0.1173).abs() < 5e-5, "{}", s.alpha.0);
    // Epoch 13 tick → 0.8827; epoch 14 tick (= e+N−1) reaches 1.0.
    assert_eq!(env.epoch(23.0, op(LifecycleOp::Advance, 0)), OpOutcome::FailedInHandler, "G3 mid-ramp");
    assert!((env.slot(0).alpha.0 - 0.8827).abs() < 5e-5);
    env.wait(24.0);
    assert_eq!(env.slot(0).alpha.0, 1.0);
    assert_eq!(env.slot(0).controller.mode, AlphaMode::Hold);
    assert_eq!(env.stage(0), SeedStage::Blending, "no auto-forward by default");
    // Epoch 15 (= e+N): ADVANCE passes permissive G3 → HOLDING.
    assert_eq!(env.epoch(25.0, op(LifecycleOp::Advance, 0)), OpOutcome::Executed);
    assert_eq!(env.stage(0), SeedStage::Holding);
    // FOSSILIZE needs a measured contribution (G5).
    assert_eq!(env.epoch(26.0, op(LifecycleOp::Fossilize, 0)), OpOutcome::FailedInHandler);
    env.slot_mut(0).metrics.counterfactual_contribution = Some(2.0);
    assert_eq!(env.epoch(27.0, op(LifecycleOp::Fossilize, 0)), OpOutcome::Executed);
    let s = env.slot(0);
    assert_eq!(
        (s.stage.current, s.stage.previous, s.alpha.0),
        (SeedStage::Fossilized, SeedStage::Holding, 1.0)
    );
    // FOSSILIZED never changes again.
    let frozen = *env.slot(0);
    for _ in 0..10 {
        env.epoch(30.0, prune(0, AlphaSpeedAction::Instant, AlphaCurveAction::Linear));
    }
    assert_eq!(env.slot(0).stage, frozen.stage);
    assert_eq!(env.slot(0).alpha, frozen.alpha);
}

/// kasmina §8.2 a, kept on purpose: the loop records accuracy on cooldown slots AND ticks them, so the
/// EMBARGOED/RESETTING counters move twice per epoch and an instantly pruned slot can germinate again at
/// decision k+5.
#[test]
fn quirk_cooldown_double_tick_frees_the_slot_five_epochs_after_an_instant_prune() {
    let mut env = OneEnv::new(1, permissive());
    env.epoch(50.0, germinate_std(0, STANDARD)); // epoch 1 = g
    for _ in 2..=5 {
        assert!(!env.masks_after_record(50.0).op[LifecycleOp::Prune as usize], "too young to prune");
        env.wait(50.0);
    }
    // First prunable decision: g + 5.
    let k = 6;
    assert!(env.masks_after_record(50.0).op[LifecycleOp::Prune as usize]);
    assert_eq!(
        env.epoch(50.0, prune(0, AlphaSpeedAction::Instant, AlphaCurveAction::Linear)),
        OpOutcome::Executed
    );
    assert_eq!(env.epoch, k);
    // Tick of k: PRUNED → EMBARGOED.
    assert_eq!(env.stage(0), SeedStage::Embargoed);
    let mut eics_after_tick = vec![];
    while env.stage(0) == SeedStage::Embargoed {
        env.wait(50.0);
        eics_after_tick.push(env.slot(0).counters.epochs_in_stage);
    }
    assert_eq!(eics_after_tick, vec![2, 4, 0], "2, 4, 6 → RESETTING (eics reset) at the end of k+3");
    assert_eq!((env.epoch, env.stage(0)), (k + 3, SeedStage::Resetting));
    env.wait(50.0);
    assert_eq!((env.epoch, env.stage(0)), (k + 4, SeedStage::Dormant));
    assert_eq!(*env.slot(0), SlotState::default(), "empty slot has no leftover state");
    // GERMINATE is masked throughout the pipeline and legal again at decision k+5.
    assert!(env.masks_after_record(50.0).op[LifecycleOp::Germinate as usize]);
    assert_eq!(env.epoch(50.0, germinate_std(0, STANDARD)), OpOutcome::Executed);
}

/// The tick alone (unit-test semantics, no record calls): 1 tick to EMBARGOED, 5 to RESETTING, 1 to empty.
#[test]
fn quirk_tick_alone_gives_the_seven_tick_cooldown() {
    let config = permissive();
    let mut slot = SlotState::default();
    let g = Germination {
        blueprint: BlueprintAction::Norm,
        blend: BlendId::Sigmoid,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs: 5,
        alpha_target: None,
    };
    lifecycle::germinate(&mut slot.view(), g, Topology::Cnn).unwrap();
    assert!(lifecycle::prune(&mut slot.view(), PruneReason::Policy, PruneInitiator::Policy));
    let mut stages = vec![];
    for _ in 0..7 {
        lifecycle::step_epoch(&mut slot.view(), &config);
        stages.push(slot.stage.current);
    }
    use SeedStage::*;
    assert_eq!(stages, vec![Embargoed, Embargoed, Embargoed, Embargoed, Embargoed, Resetting, Dormant]);
    assert_eq!(slot, SlotState::default());
}

#[test]
fn scheduled_prune_completes_in_the_tick_that_reaches_zero() {
    let config = permissive();
    let mut env = OneEnv::new(1, config);
    blend_to_holding(&mut env, TempoAction::Fast);
    // Back in BLENDING at full alpha; a 3-step (FAST) prune.
    let k_start = env.epoch + 1;
    assert_eq!(
        env.epoch(40.0, prune(0, AlphaSpeedAction::Fast, AlphaCurveAction::Linear)),
        OpOutcome::Executed
    );
    // The tick of the decision epoch already took the first step.
    assert_eq!(env.stage(0), SeedStage::Blending, "HOLDING → BLENDING for the ramp");
    assert!((env.slot(0).alpha.0 - 2.0 / 3.0).abs() < 1e-12);
    assert!(env.slot(0).flags.blend_out_frozen);
    assert_eq!(env.slot(0).pending_prune.reason, Some(PruneReason::Policy));
    env.wait(40.0);
    assert!((env.slot(0).alpha.0 - 1.0 / 3.0).abs() < 1e-12);
    env.wait(40.0); // tick reaches 0 → prune fires inside it
    let k = env.epoch;
    assert_eq!(k, k_start + 2);
    assert_eq!(env.stage(0), SeedStage::Pruned);
    assert_eq!(env.slot(0).pending_prune, PendingPrune::default());
    assert!(!env.slot(0).flags.blend_out_frozen);
    // EMBARGOED at k+1, empty at the end of k+5.
    env.wait(40.0);
    assert_eq!(env.stage(0), SeedStage::Embargoed);
    for _ in 0..3 {
        env.wait(40.0);
    }
    assert_eq!((env.epoch, env.stage(0)), (k + 4, SeedStage::Resetting));
    env.wait(40.0);
    assert_eq!((env.epoch, env.stage(0)), (k + 5, SeedStage::Dormant));

    // Unit semantics (kasmina §8.1): a 2-step scheduled prune is still BLENDING with its seed after one
    // tick and PRUNED without it after two.
    let mut slot = SlotState::default();
    let g = Germination {
        blueprint: BlueprintAction::ConvSmall,
        blend: BlendId::Linear,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs: 3,
        alpha_target: None,
    };
    lifecycle::germinate(&mut slot.view(), g, Topology::Cnn).unwrap();
    slot.stage.current = SeedStage::Blending;
    lifecycle::set_alpha(&mut slot.view(), 0.6);
    let curve = AlphaCurve::Linear;
    assert!(lifecycle::schedule_prune(
        &mut slot.view(),
        2,
        curve,
        12.0,
        PruneReason::Policy,
        PruneInitiator::Policy
    ));
    lifecycle::step_epoch(&mut slot.view(), &config);
    assert_eq!(slot.stage.current, SeedStage::Blending);
    assert!(slot.stage.current.has_seed());
    lifecycle::step_epoch(&mut slot.view(), &config);
    assert_eq!(slot.stage.current, SeedStage::Pruned);
    assert!(!slot.stage.current.has_seed());
}

/// Drive slot 0 of `env` from empty to HOLDING at alpha 1.
fn blend_to_holding(env: &mut OneEnv, tempo: TempoAction) {
    env.epoch(20.0, germinate_std(0, tempo));
    env.epoch(20.0, op(LifecycleOp::Advance, 0));
    env.healthy_gradients(0);
    while env.stage(0) == SeedStage::Training {
        env.epoch(25.0, op(LifecycleOp::Advance, 0));
    }
    while env.stage(0) == SeedStage::Blending {
        env.epoch(30.0, op(LifecycleOp::Advance, 0));
    }
    assert_eq!(env.stage(0), SeedStage::Holding);
    assert_eq!(env.slot(0).alpha.0, 1.0);
}

#[test]
fn germinate_checks_in_reference_order() {
    use lifecycle::LifecycleError::*;
    let g = Germination {
        blueprint: BlueprintAction::ConvLight,
        blend: BlendId::Sigmoid,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs: 5,
        alpha_target: None,
    };
    let mut slot = SlotState::default();
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let r = lifecycle::germinate(
            &mut slot.view(),
            Germination { alpha_target: Some(bad), ..g },
            Topology::Cnn,
        );
        assert!(matches!(r, Err(AlphaTargetOutOfRange(_))), "{bad}");
    }
    for (blend, algorithm) in [(BlendId::Gated, AlphaAlgorithm::Add), (BlendId::Linear, AlphaAlgorithm::Gate)]
    {
        let r = lifecycle::germinate(&mut slot.view(), Germination { blend, algorithm, ..g }, Topology::Cnn);
        assert_eq!(r, Err(StyleMismatch(blend, algorithm)));
    }
    let lora = Germination { blueprint: BlueprintAction::Lora, ..g };
    assert_eq!(
        lifecycle::germinate(&mut slot.view(), lora, Topology::Cnn),
        Err(BlueprintNotInTopology(BlueprintAction::Lora, Topology::Cnn))
    );
    assert!(lifecycle::germinate(&mut slot.view(), lora, Topology::Transformer).is_ok());
    assert_eq!(slot.stage.current, SeedStage::Germinated);
    assert_eq!(
        lifecycle::germinate(&mut slot.view(), g, Topology::Cnn),
        Err(SlotOccupied(SeedStage::Germinated))
    );
    // A cooldown slot blocks germination too.
    assert!(lifecycle::prune(&mut slot.view(), PruneReason::Policy, PruneInitiator::Policy));
    assert_eq!(
        lifecycle::germinate(&mut slot.view(), g, Topology::Cnn),
        Err(SlotOccupied(SeedStage::Pruned))
    );
    // A fresh germination: alpha 0, controller holding at 0, stage GERMINATED, stored style and tempo.
    let mut fresh = SlotState::default();
    let g2 = Germination { tempo_epochs: 8, alpha_target: Some(0.7), ..g };
    lifecycle::germinate(&mut fresh.view(), g2, Topology::Cnn).unwrap();
    assert_eq!(fresh.alpha.0, 0.0);
    assert_eq!(fresh.controller, AlphaController::holding_at(0.0));
    assert_eq!((fresh.tempo.epochs, fresh.blend.alpha_target, fresh.blend.has_gate), (8, 0.7, false));
    assert_eq!(fresh.blueprint.0, BlueprintAction::ConvLight);
}

#[test]
fn fossilized_cannot_be_pruned() {
    let mut env = OneEnv::new(1, permissive());
    blend_to_holding(&mut env, TempoAction::Fast);
    env.slot_mut(0).metrics.counterfactual_contribution = Some(-3.0);
    assert_eq!(
        env.epoch(30.0, op(LifecycleOp::Fossilize, 0)),
        OpOutcome::Executed,
        "permissive G5 has no threshold"
    );
    let mut slot = *env.slot(0);
    assert!(!lifecycle::prune(&mut slot.view(), PruneReason::GovernorRollback, PruneInitiator::Governor));
    let c = AlphaCurve::Linear;
    assert!(!lifecycle::schedule_prune(
        &mut slot.view(),
        3,
        c,
        12.0,
        PruneReason::Policy,
        PruneInitiator::Policy
    ));
    assert!(!lifecycle::set_alpha_target(&mut slot.view(), 0.5, 3, c, 12.0, None));
    assert_eq!(slot, *env.slot(0));
}

#[test]
fn tick_never_advances_without_auto_forward() {
    let config = permissive();
    let mut env = OneEnv::new(1, config);
    env.epoch(20.0, germinate_std(0, TempoAction::Fast));
    for _ in 0..20 {
        env.wait(20.0);
    }
    assert_eq!(env.stage(0), SeedStage::Germinated, "no G1 auto-forward");
    env.epoch(20.0, op(LifecycleOp::Advance, 0));
    env.healthy_gradients(0);
    for _ in 0..30 {
        env.wait(30.0);
    }
    assert_eq!(env.stage(0), SeedStage::Training, "no G2 auto-forward");
    env.epoch(30.0, op(LifecycleOp::Advance, 0));
    for _ in 0..30 {
        env.wait(30.0);
    }
    assert_eq!(env.stage(0), SeedStage::Blending, "no G3 auto-forward");
    env.epoch(30.0, op(LifecycleOp::Advance, 0));
    // HOLDING never auto-fossilizes or auto-prunes, whatever the contribution and the time in stage.
    for contribution in [None, Some(-20.0), Some(0.0), Some(20.0)] {
        env.slot_mut(0).metrics.counterfactual_contribution = contribution;
        for _ in 0..40 {
            env.wait(30.0);
        }
        assert_eq!(env.stage(0), SeedStage::Holding);
    }
}

#[test]
fn auto_forward_gates_advance_inside_the_tick() {
    let config = LifecycleConfig {
        auto_forward_g1: true,
        auto_forward_g2: true,
        auto_forward_g3: true,
        ..permissive()
    };
    assert!(config.disable_advance());
    let mut env = OneEnv::new(1, config);
    // G1: TRAINING in the same step as the germination.
    env.epoch(20.0, germinate_std(0, TempoAction::Standard));
    assert_eq!(env.stage(0), SeedStage::Training);
    env.healthy_gradients(0);
    let trained_at = env.epoch;
    // G2: eics ≥ 10 after the record of epoch t+10, so the tick of that epoch advances.
    while env.stage(0) == SeedStage::Training {
        env.wait(25.0);
    }
    assert_eq!(env.epoch, trained_at + 10);
    let e = env.epoch; // BLENDING entered in this tick (first ramp tick runs at the next step)
    // G3 auto: enters HOLDING inside the tick that reaches the target.
    while env.stage(0) == SeedStage::Blending {
        env.wait(30.0);
    }
    assert_eq!(env.epoch, e + 5);
    assert_eq!(env.slot(0).alpha.0, 1.0);

    // A partial target never reaches HOLDING, even with G3 auto-forward.
    let mut env = OneEnv::new(1, config);
    let half = germinate(
        0,
        BlueprintAction::Norm,
        GerminationStyle::LinearAdd,
        TempoAction::Fast,
        AlphaTargetAction::Half,
    );
    env.epoch(20.0, half);
    env.healthy_gradients(0);
    for _ in 0..40 {
        env.wait(20.0);
    }
    assert_eq!(env.stage(0), SeedStage::Blending);
    assert_eq!(env.slot(0).alpha.0, 0.5);
}

#[test]
fn permissive_and_strict_gates() {
    let mut slot = SlotState::default();
    slot.stage.current = SeedStage::Training;
    let check = |slot: &mut SlotState, level: GateLevel, permissive: bool| {
        gates::gate_passes(level, &slot.view(), permissive)
    };
    use esper_components::gates;
    // Permissive G2: dwell, measured, not exploding, health ≥ 0.7.
    slot.counters.epochs_in_stage = 10;
    assert!(!check(&mut slot, GateLevel::G2, true), "unmeasured gradient health never passes (KTS-001)");
    slot.telemetry.gradient_health = Some(0.7);
    slot.telemetry.has_exploding = Some(false);
    assert!(check(&mut slot, GateLevel::G2, true));
    slot.counters.epochs_in_stage = 9;
    assert!(!check(&mut slot, GateLevel::G2, true));
    slot.counters.epochs_in_stage = 10;
    slot.telemetry.gradient_health = Some(0.69);
    assert!(!check(&mut slot, GateLevel::G2, true));
    slot.telemetry.gradient_health = Some(0.9);
    slot.telemetry.has_exploding = Some(true);
    assert!(!check(&mut slot, GateLevel::G2, true));
    // Strict G2: improvement ≥ 0.5 pp, dwell, ratio measured ≥ 0.10 (health ignored).
    slot.metrics.accuracy_at_stage_start = 40.0;
    slot.metrics.current_val_accuracy = 40.5;
    slot.metrics.seed_gradient_norm_ratio = Some(0.10);
    assert!(check(&mut slot, GateLevel::G2, false));
    slot.metrics.current_val_accuracy = 40.49;
    assert!(!check(&mut slot, GateLevel::G2, false));
    slot.metrics.current_val_accuracy = 41.0;
    slot.metrics.seed_gradient_norm_ratio = None;
    assert!(!check(&mut slot, GateLevel::G2, false));
    slot.metrics.seed_gradient_norm_ratio = Some(0.099);
    assert!(!check(&mut slot, GateLevel::G2, false));
    // G3: full target reached at rest; strict also needs 10 epochs in BLENDING.
    slot.stage.current = SeedStage::Blending;
    slot.controller = AlphaController::holding_at(1.0);
    slot.alpha.0 = 1.0;
    slot.counters.epochs_in_stage = 3;
    assert!(check(&mut slot, GateLevel::G3, true));
    assert!(!check(&mut slot, GateLevel::G3, false));
    slot.counters.epochs_in_stage = 10;
    assert!(check(&mut slot, GateLevel::G3, false));
    slot.alpha.0 = 1.0 - 2.0 * ALPHA_EPSILON;
    assert!(!check(&mut slot, GateLevel::G3, true), "scalar alpha not yet at the target");
    slot.controller = AlphaController::holding_at(0.7);
    slot.alpha.0 = 0.7;
    assert!(!check(&mut slot, GateLevel::G3, true), "partial target");
    // G5: measured contribution; strict needs ≥ 1.0 pp.
    slot.metrics.counterfactual_contribution = None;
    assert!(!check(&mut slot, GateLevel::G5, true));
    slot.metrics.counterfactual_contribution = Some(-5.0);
    assert!(check(&mut slot, GateLevel::G5, true));
    assert!(!check(&mut slot, GateLevel::G5, false));
    slot.metrics.counterfactual_contribution = Some(1.0);
    assert!(check(&mut slot, GateLevel::G5, false));
    // G1 is "stage is GERMINATED".
    assert!(!check(&mut slot, GateLevel::G1, true));
    slot.stage.current = SeedStage::Germinated;
    assert!(check(&mut slot, GateLevel::G1, false));
}

#[test]
fn stage_entry_side_effects() {
    // TRAINING → BLENDING: snapshot, fresh ramp over the tempo with the blend's curve; gated builds a gate.
    for (style, curve, gate) in [
        (GerminationStyle::LinearAdd, AlphaCurve::Linear, false),
        (GerminationStyle::SigmoidAdd, AlphaCurve::Sigmoid, false),
        (GerminationStyle::GatedGate, AlphaCurve::Linear, true),
    ] {
        let mut env = OneEnv::new(1, permissive());
        env.epoch(
            20.0,
            germinate(0, BlueprintAction::Attention, style, TempoAction::Slow, AlphaTargetAction::Seventy),
        );
        env.epoch(20.0, op(LifecycleOp::Advance, 0));
        env.healthy_gradients(0);
        let mut slot = *env.slot(0);
        slot.counters.epochs_in_stage = 10;
        slot.metrics.current_val_accuracy = 33.0;
        assert_eq!(lifecycle::advance_stage(&mut slot.view(), None, &permissive()), Ok(true));
        let c = slot.controller;
        assert_eq!(
            (c.mode, c.curve, c.steepness, c.steps_total, c.target),
            (AlphaMode::Up, curve, 12.0, 8, 0.7)
        );
        assert_eq!(slot.blend.has_gate, gate);
        assert!(slot.flags.isolate_gradients, "CNN keeps isolation after BLENDING");
        assert_eq!((slot.metrics.accuracy_at_blending_start, slot.metrics.blending_started), (33.0, true));
    }
    // Transformer topology drops isolation at BLENDING.
    let config = LifecycleConfig { topology: Topology::Transformer, ..permissive() };
    let mut env = OneEnv::new(1, config);
    env.epoch(
        20.0,
        germinate(
            0,
            BlueprintAction::Lora,
            GerminationStyle::LinearAdd,
            TempoAction::Fast,
            AlphaTargetAction::Full,
        ),
    );
    env.epoch(20.0, op(LifecycleOp::Advance, 0));
    env.healthy_gradients(0);
    while env.stage(0) == SeedStage::Training {
        env.epoch(20.0, op(LifecycleOp::Advance, 0));
    }
    assert!(!env.slot(0).flags.isolate_gradients);
    // BLENDING → HOLDING: alpha 1, controller HOLD at 1 with steps done = total.
    let mut env = OneEnv::new(1, permissive());
    blend_to_holding(&mut env, TempoAction::Standard);
    let c = env.slot(0).controller;
    assert_eq!(
        (c.alpha, c.start, c.target, c.mode, c.steps_done, c.steps_total),
        (1.0, 1.0, 1.0, AlphaMode::Hold, 5, 5)
    );
}

#[test]
fn set_alpha_target_from_holding_and_style_switch() {
    let mut env = OneEnv::new(1, permissive());
    blend_to_holding(&mut env, TempoAction::Fast);
    // A retarget to FULL from HOLDING at 1.0 is a no-op HOLD.
    let full = retarget(
        0,
        GerminationStyle::SigmoidAdd,
        AlphaTargetAction::Full,
        AlphaSpeedAction::Fast,
        AlphaCurveAction::Linear,
    );
    assert_eq!(env.epoch(30.0, full), OpOutcome::Executed);
    assert_eq!((env.stage(0), env.slot(0).controller.mode), (SeedStage::Holding, AlphaMode::Hold));
    // A partial target drops back to BLENDING, ramps DOWN (frozen), and can switch the algorithm.
    let half = retarget(
        0,
        GerminationStyle::LinearMultiply,
        AlphaTargetAction::Half,
        AlphaSpeedAction::Fast,
        AlphaCurveAction::Linear,
    );
    let mut probe = env.world.clone();
    probe.record(&[30.0]);
    let masks = probe.masks();
    probe.apply(&[half], &masks);
    let s = probe.slots[0];
    assert_eq!(
        (s.stage.current, s.controller.mode, s.blend.algorithm),
        (SeedStage::Blending, AlphaMode::Down, AlphaAlgorithm::Multiply)
    );
    assert!(s.flags.blend_out_frozen, "freeze on at the end of set_alpha_target");
    assert_eq!(env.epoch(30.0, half), OpOutcome::Executed);
    env.wait(30.0);
    env.wait(30.0);
    // The tick of the third step reaches 0.5; the freeze lags: still frozen until the next tick starts.
    assert_eq!((env.slot(0).alpha.0, env.slot(0).controller.mode), (0.5, AlphaMode::Hold));
    assert!(env.slot(0).flags.blend_out_frozen, "blend-out freeze lags one epoch (kasmina §8.2 e)");
    env.wait(30.0);
    assert!(!env.slot(0).flags.blend_out_frozen);
    assert_eq!(env.stage(0), SeedStage::Blending, "partial plateau stays in BLENDING");
    // Switching to GATE creates a gate; back to ADD drops it.
    let to_gate = retarget(
        0,
        GerminationStyle::GatedGate,
        AlphaTargetAction::Seventy,
        AlphaSpeedAction::Instant,
        AlphaCurveAction::Linear,
    );
    let mut probe = env.world.clone();
    probe.record(&[30.0]);
    let masks = probe.masks();
    probe.apply(&[to_gate], &masks);
    let s = probe.slots[0];
    assert!(s.blend.has_gate && s.blend.algorithm == AlphaAlgorithm::Gate);
    // INSTANT: the controller jumps now; the scalar alpha catches up at the BLENDING tick.
    assert_eq!((s.controller.alpha, s.alpha.0), (0.7, 0.5));
    env.epoch(30.0, to_gate);
    assert_eq!(env.slot(0).alpha.0, 0.7);
    let to_add = retarget(
        0,
        GerminationStyle::LinearAdd,
        AlphaTargetAction::Full,
        AlphaSpeedAction::Fast,
        AlphaCurveAction::Cosine,
    );
    env.epoch(30.0, to_add);
    assert!(!env.slot(0).blend.has_gate);
    // Retargeting mid-ramp is refused by the mask.
    assert_eq!(env.epoch(30.0, to_add), OpOutcome::RefusedByMask);
}

#[test]
fn prune_clears_the_seed_and_keeps_the_state() {
    let mut env = OneEnv::new(1, permissive());
    blend_to_holding(&mut env, TempoAction::Fast);
    let mut slot = *env.slot(0);
    assert!(lifecycle::prune(&mut slot.view(), PruneReason::GovernorNan, PruneInitiator::Governor));
    assert_eq!(slot.stage.current, SeedStage::Pruned);
    assert!(!slot.stage.current.has_seed() && slot.stage.current.has_state());
    assert_eq!(slot.metrics.auto_pruned, Some(PruneReason::GovernorNan));
    assert_eq!(
        (slot.alpha.0, slot.controller.alpha, slot.controller.target, slot.controller.mode),
        (0.0, 0.0, 0.0, AlphaMode::Hold)
    );
    assert!(!slot.flags.isolate_gradients && !slot.blend.has_gate);
    assert!(
        !lifecycle::prune(&mut slot.view(), PruneReason::Policy, PruneInitiator::Policy),
        "already in cooldown"
    );
    // A policy prune is not an auto-prune.
    let mut slot = *env.slot(0);
    lifecycle::prune(&mut slot.view(), PruneReason::Policy, PruneInitiator::Policy);
    assert_eq!(slot.metrics.auto_pruned, None);
}

#[test]
fn handler_preconditions_match_execution_validity() {
    // MIN_PRUNE_AGE is enforced at execution too (BUG-020), not only in the mask.
    let mut env = OneEnv::new(1, permissive());
    env.epoch(20.0, germinate_std(0, STANDARD));
    let masks = env.masks_after_record(20.0);
    let mut slot = *env.slot(0);
    slot.counters.epochs_total = 4;
    let mut permissive_masks = masks;
    permissive_masks.op[LifecycleOp::Prune as usize] = true;
    permissive_masks.slot_by_op[LifecycleOp::Prune as usize][0] = true;
    let action = prune(0, AlphaSpeedAction::Instant, AlphaCurveAction::Linear);
    assert_eq!(
        apply_action(&action, &permissive_masks, &mut slot.view(), &permissive()),
        OpOutcome::FailedPrecondition
    );
    slot.counters.epochs_total = 5;
    assert_eq!(
        apply_action(&action, &permissive_masks, &mut slot.view(), &permissive()),
        OpOutcome::Executed
    );
    // Each op's precondition on hand-built slots.
    let at = |stage: SeedStage, mode: AlphaMode, age: u32| {
        let mut s = SlotState::default();
        s.stage.current = stage;
        s.controller.mode = mode;
        s.counters.epochs_total = age;
        s
    };
    use LifecycleOp::*;
    use SeedStage::*;
    let hold = AlphaMode::Hold;
    let cases = [
        (Germinate, at(Dormant, hold, 0), true),
        (Germinate, at(Embargoed, hold, 9), false),
        (Fossilize, at(Holding, hold, 9), true),
        (Fossilize, at(Blending, hold, 9), false),
        (Prune, at(Blending, AlphaMode::Down, 9), false),
        (Prune, at(Training, hold, 5), true),
        (Prune, at(Pruned, hold, 9), false),
        (SetAlphaTarget, at(Holding, hold, 9), true),
        (SetAlphaTarget, at(Training, hold, 9), false),
        (SetAlphaTarget, at(Blending, AlphaMode::Up, 9), false),
        (Advance, at(Germinated, hold, 0), true),
        (Advance, at(Holding, hold, 9), false),
        (Wait, at(Resetting, hold, 0), true),
    ];
    for (op, mut slot, expected) in cases {
        assert_eq!(handler_precondition(op, &slot.view()), expected, "{op:?} on {}", slot.stage.current);
    }
}

/// kasmina §8.1: the happy path's stage changes are G→T, T→B, B→H, H→F, and the cooldown's P→E, E→R,
/// R→DORMANT, each exactly once and in order.
#[test]
fn stage_change_sequence_of_the_happy_path_and_the_cooldown() {
    let mut env = OneEnv::new(1, permissive());
    let mut changes = vec![];
    let mut last = env.stage(0);
    let mut watch = |env: &OneEnv, changes: &mut Vec<(SeedStage, SeedStage)>| {
        let now = env.stage(0);
        if now != last {
            changes.push((last, now));
            last = now;
        }
    };
    env.epoch(20.0, germinate_std(0, TempoAction::Fast));
    watch(&env, &mut changes);
    env.epoch(20.0, op(LifecycleOp::Advance, 0));
    watch(&env, &mut changes);
    env.healthy_gradients(0);
    while env.stage(0) != SeedStage::Holding {
        env.epoch(25.0, op(LifecycleOp::Advance, 0));
        watch(&env, &mut changes);
    }
    env.slot_mut(0).metrics.counterfactual_contribution = Some(1.5);
    env.epoch(25.0, op(LifecycleOp::Fossilize, 0));
    watch(&env, &mut changes);
    use SeedStage::*;
    let happy = [
        (Dormant, Germinated),
        (Germinated, Training),
        (Training, Blending),
        (Blending, Holding),
        (Holding, Fossilized),
    ];
    assert_eq!(changes, happy);

    // The cooldown, watched after every phase (op and tick) of every epoch.
    let mut env = OneEnv::new(1, permissive());
    env.epoch(20.0, germinate_std(0, TempoAction::Fast));
    for _ in 0..4 {
        env.wait(20.0);
    }
    let mut changes = vec![];
    let mut last = env.stage(0);
    let mut action = prune(0, AlphaSpeedAction::Instant, AlphaCurveAction::Linear);
    for _ in 0..8 {
        let w = &mut env.world;
        w.record(&[20.0]);
        let masks = w.masks();
        w.apply(&[action], &masks);
        for phase in 0..2 {
            if phase == 1 {
                w.tick();
            }
            let now = w.slots[0].stage.current;
            if now != last {
                changes.push((last, now));
                last = now;
            }
        }
        action = FactoredAction::wait();
    }
    assert_eq!(
        changes,
        [(Germinated, Pruned), (Pruned, Embargoed), (Embargoed, Resetting), (Resetting, Dormant)]
    );
}
