//! The heuristic Tamiyo of spec tamiyo §5: the golden vectors of §7.3 (penalty decay, prune penalty,
//! rotation, all-penalised cycling) and its decisions on hand-built signal sequences, both as bare
//! `decide` calls and driven through the lifecycle's masks and handlers.

use esper_components::heuristic::{DEFAULT_ROTATION, HeuristicConfigError, blueprint_from_id};
use esper_components::lifecycle::{self, Germination};
use esper_components::reference::{ReferenceLifecycle, env_masks};
use esper_components::*;

use BlueprintAction::{Attention, ConvHeavy, ConvLight, Norm};

/// Signals that let a germination through: stabilized, plateau 3, all 3 slots available.
fn sig(epoch: u32) -> TrainingSignals {
    TrainingSignals {
        epoch,
        global_step: 0,
        train_loss: 1.0,
        train_accuracy: 50.0,
        val_loss: 1.0,
        val_accuracy: 50.0,
        loss_delta: 0.0,
        accuracy_delta: 0.0,
        plateau_epochs: 3,
        host_stabilized: true,
        best_val_accuracy: 50.0,
        best_val_loss: 1.0,
        loss_history: [1.0; 5],
        accuracy_history: [50.0; 5],
        history_len: 5,
        available_slots: 3,
        active_seed_count: 0,
        seed_stage: 0,
        seed_epochs_in_stage: 0,
        seed_alpha: 0.0,
        seed_improvement: 0.0,
        summary_slot: None,
    }
}

fn empty_slots() -> [SeedReport; 3] {
    std::array::from_fn(|i| SeedReport { slot: i as u8, ..SeedReport::default() })
}

fn seed(slot: u8, stage: SeedStage) -> SeedReport {
    SeedReport { slot, stage, blueprint: ConvLight, ..SeedReport::default() }
}

/// Slots with one seed at `slot`, the others empty.
fn with_seed(s: SeedReport) -> [SeedReport; 3] {
    let mut slots = empty_slots();
    slots[s.slot as usize] = s;
    slots
}

fn cfg() -> HeuristicConfig {
    HeuristicConfig::default()
}

fn assert_placeholders_except(action: &FactoredAction, chosen: &[Head]) {
    for head in
        [Head::Blueprint, Head::Style, Head::Tempo, Head::AlphaTarget, Head::AlphaSpeed, Head::AlphaCurve]
    {
        if !chosen.contains(&head) {
            assert_eq!(
                Some(action.head(head)),
                head.placeholder(),
                "head {} must hold its placeholder",
                head.name()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Golden vectors (tamiyo §7.3)

#[test]
fn golden_penalty_decays_once_per_epoch_10_5_5_2p5() {
    let c = cfg();
    let mut h = HeuristicState { last_decay_epoch: 10, ..HeuristicState::default() };
    h.penalties[ConvLight as usize] = 10.0;
    let not_stable = |e| TrainingSignals { host_stabilized: false, ..sig(e) };
    let mut seen = vec![];
    for e in [11, 11, 12] {
        h.decide(&c, &not_stable(e), &empty_slots());
        seen.push(h.penalty(ConvLight));
    }
    assert_eq!(seen, vec![5.0, 5.0, 2.5]);
    assert_eq!(h.last_decay_epoch, 12);
}

#[test]
fn golden_prune_adds_two_then_one_at_the_next_epochs_first_decide() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let failing = SeedReport {
        epochs_in_stage: 5,
        improvement_since_stage_start: -2.5,
        blueprint: ConvHeavy,
        ..seed(1, SeedStage::Training)
    };
    let d = h.decide(&c, &sig(20), &with_seed(failing));
    assert_eq!(d.op(), LifecycleOp::Prune);
    assert_eq!(h.penalty(ConvHeavy), 2.0, "2.0 right after the prune");
    assert_eq!(h.last_prune_epoch, 20);
    h.decide(&c, &sig(21), &empty_slots());
    assert_eq!(h.penalty(ConvHeavy), 1.0, "halved by the next epoch's first decide");
    h.decide(&c, &sig(21), &empty_slots());
    assert_eq!(h.penalty(ConvHeavy), 1.0);
}

#[test]
fn golden_rotation_light_heavy_alternates() {
    let c = HeuristicConfig::with_rotation_ids(Topology::Cnn, &["conv_light", "conv_heavy"]).unwrap();
    let mut h = HeuristicState::default();
    let picked: Vec<_> =
        (10..14).map(|e| h.decide(&c, &sig(e), &empty_slots()).blueprint().unwrap()).collect();
    assert_eq!(picked, vec![ConvLight, ConvHeavy, ConvLight, ConvHeavy]);
    assert_eq!((h.germination_count, h.bp_index), (4, 4));
}

#[test]
fn golden_all_penalised_rotation_cycles_in_penalty_order() {
    let c = HeuristicConfig {
        blueprint_penalty_threshold: 1.0,
        ..HeuristicConfig::with_rotation(Topology::Cnn, &[ConvLight, ConvHeavy, Attention]).unwrap()
    };
    let mut h = HeuristicState::default();
    h.penalties[ConvLight as usize] = 10.0;
    h.penalties[ConvHeavy as usize] = 3.0;
    h.penalties[Attention as usize] = 5.0;
    let mut picked = vec![];
    for _ in 0..6 {
        picked.push(h.next_blueprint(&c));
    }
    assert_eq!(picked, vec![ConvHeavy, Attention, ConvLight, ConvHeavy, Attention, ConvLight]);
    assert_eq!(h.bp_index, 6, "each all-penalised pick moves the index by one");

    // The same through decide(), several germinations within one epoch (no decay in between).
    let mut h = HeuristicState { last_decay_epoch: 7, ..HeuristicState::default() };
    h.penalties[ConvLight as usize] = 10.0;
    h.penalties[ConvHeavy as usize] = 3.0;
    h.penalties[Attention as usize] = 5.0;
    let picked: Vec<_> = (0..6).map(|_| h.decide(&c, &sig(7), &empty_slots()).blueprint().unwrap()).collect();
    assert_eq!(picked, vec![ConvHeavy, Attention, ConvLight, ConvHeavy, Attention, ConvLight]);
}

// ---------------------------------------------------------------------------------------------
// Blueprint rotation details

#[test]
fn rotation_skips_blueprints_at_or_above_the_threshold() {
    let c = cfg();
    let mut h = HeuristicState::default();
    h.penalties[ConvLight as usize] = 3.0;
    assert_eq!(h.next_blueprint(&c), ConvHeavy, "penalty 3.0 is not below the threshold 3.0");
    assert_eq!(h.bp_index, 2);
    let mut h = HeuristicState::default();
    h.penalties[ConvLight as usize] = 2.999;
    assert_eq!(h.next_blueprint(&c), ConvLight);
    assert_eq!(h.bp_index, 1);
}

#[test]
fn all_penalised_ties_break_by_blueprint_id() {
    let c = HeuristicConfig {
        blueprint_penalty_threshold: 1.0,
        ..HeuristicConfig::with_rotation(Topology::Cnn, &[ConvLight, Norm, Attention]).unwrap()
    };
    let mut h = HeuristicState::default();
    for bp in [ConvLight, Norm, Attention] {
        h.penalties[bp as usize] = 5.0;
    }
    let picked: Vec<_> = (0..3).map(|_| h.next_blueprint(&c)).collect();
    assert_eq!(picked, vec![Attention, ConvLight, Norm], "sorted by (penalty, id)");
}

#[test]
fn decay_drops_penalties_below_a_tenth() {
    let c = cfg();
    let mut h = HeuristicState::default();
    h.penalties[ConvLight as usize] = 0.25;
    h.penalties[ConvHeavy as usize] = 0.19;
    h.decay_penalties(&c);
    assert_eq!((h.penalty(ConvLight), h.penalty(ConvHeavy)), (0.125, 0.0));
    h.decay_penalties(&c);
    assert_eq!(h.penalty(ConvLight), 0.0, "0.0625 < 0.1 is dropped");
}

// ---------------------------------------------------------------------------------------------
// GERMINATION branch

#[test]
fn germinates_on_a_plateau_after_the_minimum_epoch() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let mut slots = empty_slots();
    slots[0] = seed(0, SeedStage::Fossilized);
    let s = TrainingSignals { plateau_epochs: 4, available_slots: 2, ..sig(5) };
    let d = h.decide(&c, &s, &slots);
    assert_eq!(d.op(), LifecycleOp::Germinate);
    assert_eq!(d.reason, HeuristicReason::Plateau);
    assert_eq!(d.target_slot, Some(1), "first slot without state; a fossil does not count as live");
    assert_eq!(d.blueprint(), Some(ConvLight));
    assert!((d.confidence - 0.8).abs() < 1e-12, "min(1, plateau/5)");
    assert_eq!(
        d.action,
        FactoredAction {
            slot: 1,
            blueprint: ConvLight as u8,
            style: GerminationStyle::SigmoidAdd as u8,
            tempo: TempoAction::Standard as u8,
            alpha_target: AlphaTargetAction::Full as u8,
            alpha_speed: AlphaSpeedAction::Instant as u8,
            alpha_curve: AlphaCurveAction::Linear as u8,
            op: LifecycleOp::Germinate as u8,
        }
    );
    assert_eq!(TempoAction::Standard.epochs(), 5, "Kasmina's default tempo");
    assert_eq!(GerminationStyle::SigmoidAdd.blend_and_algorithm(), (BlendId::Sigmoid, AlphaAlgorithm::Add));
    assert_eq!((h.germination_count, h.bp_index, h.decisions_made), (1, 1, 1));
    let long = TrainingSignals { plateau_epochs: 9, ..sig(6) };
    assert_eq!(h.decide(&c, &long, &empty_slots()).confidence, 1.0);
}

#[test]
fn waits_before_epoch_five_without_touching_the_rotation() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let d = h.decide(&c, &sig(4), &empty_slots());
    assert_eq!((d.op(), d.reason), (LifecycleOp::Wait, HeuristicReason::TooEarly));
    assert_eq!(d.action, FactoredAction::wait());
    assert_eq!((h.bp_index, h.germination_count), (0, 0));
    assert_eq!(h.decide(&c, &sig(5), &empty_slots()).op(), LifecycleOp::Germinate);
}

#[test]
fn waits_until_the_host_is_stabilized() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let s = TrainingSignals { host_stabilized: false, plateau_epochs: 10, ..sig(30) };
    let d = h.decide(&c, &s, &empty_slots());
    assert_eq!((d.op(), d.reason), (LifecycleOp::Wait, HeuristicReason::HostNotStabilized));
}

#[test]
fn waits_without_a_plateau_of_three() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let d = h.decide(&c, &TrainingSignals { plateau_epochs: 2, ..sig(30) }, &empty_slots());
    assert_eq!((d.op(), d.reason), (LifecycleOp::Wait, HeuristicReason::TrainingProgressing));
    let d = h.decide(&c, &TrainingSignals { plateau_epochs: 3, ..sig(31) }, &empty_slots());
    assert_eq!(d.op(), LifecycleOp::Germinate);
}

#[test]
fn waits_without_an_available_slot() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let slots =
        [seed(0, SeedStage::Fossilized), seed(1, SeedStage::Embargoed), seed(2, SeedStage::Fossilized)];
    let d = h.decide(&c, &TrainingSignals { available_slots: 0, ..sig(30) }, &slots);
    assert_eq!((d.op(), d.reason), (LifecycleOp::Wait, HeuristicReason::NoAvailableSlot));
}

#[test]
fn embargo_holds_for_five_epochs_after_a_prune_and_comes_first() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let failing = SeedReport {
        epochs_in_stage: 6,
        improvement_since_stage_start: -5.0,
        ..seed(0, SeedStage::Training)
    };
    assert_eq!(h.decide(&c, &sig(20), &with_seed(failing)).op(), LifecycleOp::Prune);
    let mut slots = empty_slots();
    slots[0] = seed(0, SeedStage::Embargoed);
    for e in 21..25 {
        // Embargo is checked before stabilization.
        let s = TrainingSignals { host_stabilized: false, ..sig(e) };
        let d = h.decide(&c, &s, &slots);
        assert_eq!((d.op(), d.reason), (LifecycleOp::Wait, HeuristicReason::Embargo), "epoch {e}");
    }
    let d = h.decide(&c, &sig(25), &slots);
    assert_eq!(d.op(), LifecycleOp::Germinate, "25 − 20 = 5 is no longer < 5");
    assert_eq!(d.target_slot, Some(1), "the cooldown slot still has state");
    assert_eq!(d.blueprint(), Some(ConvLight), "the penalty on conv_light decayed: 2 → 1 → … → 0.0625 → 0");
}

// ---------------------------------------------------------------------------------------------
// MANAGE branch

#[test]
fn germinated_seed_is_advanced() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let d = h.decide(&c, &sig(8), &with_seed(seed(2, SeedStage::Germinated)));
    assert_eq!(
        (d.op(), d.reason, d.target_slot),
        (LifecycleOp::Advance, HeuristicReason::AdvanceToTraining, Some(2))
    );
    assert_eq!(d.action.slot, 2);
    assert_placeholders_except(&d.action, &[]);
}

#[test]
fn training_seed_is_advanced_until_patience_and_a_drop_beyond_two_points() {
    let c = cfg();
    let decide = |eics, imp| {
        let mut h = HeuristicState::default();
        let s = SeedReport {
            epochs_in_stage: eics,
            improvement_since_stage_start: imp,
            ..seed(0, SeedStage::Training)
        };
        let d = h.decide(&c, &sig(30), &with_seed(s));
        (d.op(), d.reason, h.last_prune_epoch)
    };
    use HeuristicReason::*;
    assert_eq!(decide(4, -10.0), (LifecycleOp::Advance, AdvanceToBlending, -100), "patience not reached");
    assert_eq!(
        decide(5, -2.0),
        (LifecycleOp::Advance, AdvanceToBlending, -100),
        "a drop of exactly 2.0 is kept"
    );
    assert_eq!(decide(5, -2.01), (LifecycleOp::Prune, FailingInTraining, 30));
    assert_eq!(decide(50, 3.0), (LifecycleOp::Advance, AdvanceToBlending, -100));
}

#[test]
fn prune_decisions_use_an_instant_linear_schedule() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let s = SeedReport {
        epochs_in_stage: 5,
        improvement_since_stage_start: -3.0,
        ..seed(1, SeedStage::Training)
    };
    let d = h.decide(&c, &sig(30), &with_seed(s));
    assert_eq!((d.action.op, d.action.slot), (LifecycleOp::Prune as u8, 1));
    assert_eq!(AlphaSpeedAction::from_index(d.action.alpha_speed).unwrap().steps(), 0, "INSTANT → prune now");
    assert_eq!(d.action.alpha_curve, AlphaCurveAction::Linear as u8);
    assert_placeholders_except(&d.action, &[]);
    assert_eq!(d.confidence, 1.0);
}

#[test]
fn blending_seed_waits_for_a_full_reached_target_then_advances() {
    let c = cfg();
    let blending = |alpha, target, mode| SeedReport {
        alpha,
        alpha_target: target,
        alpha_mode: mode,
        epochs_in_stage: 2,
        ..seed(0, SeedStage::Blending)
    };
    let mut h = HeuristicState::default();
    let d = h.decide(&c, &sig(30), &with_seed(blending(0.6, 1.0, AlphaMode::Up)));
    assert_eq!((d.op(), d.reason, d.target_slot), (LifecycleOp::Wait, HeuristicReason::Blending, Some(0)));
    assert_eq!(d.action, FactoredAction::wait());
    let d = h.decide(&c, &sig(31), &with_seed(blending(1.0, 1.0, AlphaMode::Hold)));
    assert_eq!((d.op(), d.reason), (LifecycleOp::Advance, HeuristicReason::AdvanceToHolding));
    let d = h.decide(&c, &sig(32), &with_seed(blending(1.0 - 5e-7, 1.0 - 5e-7, AlphaMode::Hold)));
    assert_eq!(d.op(), LifecycleOp::Advance, "within 1e-6 of full");
    let d = h.decide(&c, &sig(33), &with_seed(blending(0.7, 0.7, AlphaMode::Hold)));
    assert_eq!(d.op(), LifecycleOp::Wait, "a partial target never advances");
    let d = h.decide(&c, &sig(34), &with_seed(blending(0.999, 1.0, AlphaMode::Hold)));
    assert_eq!(d.op(), LifecycleOp::Wait, "target not reached");
}

#[test]
fn failing_blending_seed_is_pruned() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let s = SeedReport {
        alpha: 1.0,
        alpha_target: 1.0,
        epochs_in_stage: 7,
        improvement_since_stage_start: -4.0,
        blueprint: Attention,
        ..seed(0, SeedStage::Blending)
    };
    let d = h.decide(&c, &sig(30), &with_seed(s));
    assert_eq!((d.op(), d.reason), (LifecycleOp::Prune, HeuristicReason::FailingInBlending));
    assert_eq!(h.penalty(Attention), 2.0);
}

#[test]
fn holding_seed_fossilizes_only_above_half_a_point_of_contribution() {
    let c = cfg();
    let holding = |cc, ti| SeedReport {
        counterfactual_contribution: cc,
        total_improvement: ti,
        alpha: 1.0,
        alpha_target: 1.0,
        ..seed(1, SeedStage::Holding)
    };
    let decide = |s| {
        let mut h = HeuristicState::default();
        let d = h.decide(&c, &sig(40), &with_seed(s));
        (d.op(), d.reason, d.confidence)
    };
    use HeuristicReason::*;
    assert_eq!(decide(holding(Some(0.5), 1.0)), (LifecycleOp::Prune, NoImprovementInHolding, 1.0));
    let (op, reason, conf) = decide(holding(Some(0.51), 1.0));
    assert_eq!((op, reason), (LifecycleOp::Fossilize, Fossilizing));
    assert!((conf - 0.102).abs() < 1e-12, "min(1, cc/5)");
    assert_eq!(decide(holding(Some(6.0), 1.0)), (LifecycleOp::Fossilize, Fossilizing, 1.0));
    assert_eq!(decide(holding(Some(-1.0), 1.0)), (LifecycleOp::Prune, NoImprovementInHolding, 1.0));
    let mut h = HeuristicState::default();
    let d = h.decide(&c, &sig(40), &with_seed(holding(Some(2.0), 1.0)));
    assert_eq!((d.action.slot, d.target_slot), (1, Some(1)));
    assert_placeholders_except(&d.action, &[]);
}

#[test]
fn holding_seed_without_a_measured_contribution_waits() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let s = SeedReport { total_improvement: 5.0, ..seed(0, SeedStage::Holding) };
    let d = h.decide(&c, &sig(40), &with_seed(s));
    assert_eq!(
        (d.op(), d.reason, d.target_slot),
        (LifecycleOp::Wait, HeuristicReason::ContributionUnmeasured, Some(0))
    );
}

#[test]
fn ransomware_seed_is_pruned() {
    let c = cfg();
    let decide = |cc, ti| {
        let mut h = HeuristicState::default();
        let s = SeedReport {
            counterfactual_contribution: Some(cc),
            total_improvement: ti,
            ..seed(0, SeedStage::Holding)
        };
        let d = h.decide(&c, &sig(40), &with_seed(s));
        (d.op(), d.reason)
    };
    use HeuristicReason::*;
    assert_eq!(decide(2.0, -0.1), (LifecycleOp::Prune, Ransomware));
    assert_eq!(decide(2.0, 0.0), (LifecycleOp::Fossilize, Fossilizing), "ti must be strictly negative");
    assert_eq!(decide(0.1, -3.0), (LifecycleOp::Prune, NoImprovementInHolding), "cc must exceed 0.1");
}

#[test]
fn only_the_first_live_seed_matters() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let slots = [seed(0, SeedStage::Fossilized), seed(1, SeedStage::Holding), seed(2, SeedStage::Germinated)];
    let d = h.decide(&c, &sig(40), &slots);
    assert_eq!(
        (d.op(), d.target_slot),
        (LifecycleOp::Wait, Some(1)),
        "HOLDING without cc waits; slot 2 is never looked at"
    );
}

#[test]
fn cooldown_and_fossilized_slots_are_not_live() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let slots = [seed(0, SeedStage::Pruned), seed(1, SeedStage::Fossilized), seed(2, SeedStage::Resetting)];
    let d = h.decide(&c, &TrainingSignals { available_slots: 0, ..sig(40) }, &slots);
    assert_eq!(d.reason, HeuristicReason::NoAvailableSlot, "went to the germination branch");
}

// ---------------------------------------------------------------------------------------------
// Config, flat actions, reset, runner differences

#[test]
fn config_is_validated_against_the_topology() {
    assert_eq!(HeuristicConfig::new(Topology::Cnn).unwrap().blueprint_rotation.as_slice(), &DEFAULT_ROTATION);
    assert_eq!(
        HeuristicConfig::new(Topology::Transformer),
        Err(HeuristicConfigError::BlueprintNotInTopology(ConvLight, Topology::Transformer))
    );
    assert_eq!(HeuristicConfig::with_rotation(Topology::Cnn, &[]), Err(HeuristicConfigError::EmptyRotation));
    assert_eq!(
        HeuristicConfig::with_rotation(Topology::Cnn, &[BlueprintAction::Noop]),
        Err(HeuristicConfigError::BlueprintNotInTopology(BlueprintAction::Noop, Topology::Cnn))
    );
    assert_eq!(
        HeuristicConfig::with_rotation_ids(Topology::Cnn, &["conv_light", "convlight"]),
        Err(HeuristicConfigError::UnknownBlueprintId("convlight".into()))
    );
    let t = HeuristicConfig::with_rotation_ids(Topology::Transformer, &["lora", "attention"]).unwrap();
    assert_eq!(t.blueprint_rotation.as_slice(), &[BlueprintAction::Lora, Attention]);
    assert_eq!(blueprint_from_id("flex_attention"), Some(BlueprintAction::FlexAttention));
    let c = cfg();
    assert_eq!(
        (
            c.plateau_epochs_to_germinate,
            c.min_epochs_before_germinate,
            c.prune_after_epochs_without_improvement
        ),
        (3, 5, 5)
    );
    assert_eq!(
        (c.prune_if_accuracy_drops_by, c.min_improvement_to_fossilize, c.embargo_epochs_after_prune),
        (2.0, 0.5, 5)
    );
    assert_eq!(
        (c.blueprint_penalty_on_prune, c.blueprint_penalty_decay, c.blueprint_penalty_threshold),
        (2.0, 0.5, 3.0)
    );
}

#[test]
fn flat_action_indices_follow_the_topology_enum() {
    let c = cfg();
    let mut h = HeuristicState { bp_index: 1, ..HeuristicState::default() };
    let g = h.decide(&c, &sig(10), &empty_slots());
    assert_eq!(g.blueprint(), Some(ConvHeavy));
    assert_eq!(g.flat_action(Topology::Cnn), Some(7));
    assert_eq!(g.flat_action(Topology::Transformer), None, "conv_heavy is not a transformer blueprint");
    let wait = h.decide(&c, &sig(2), &empty_slots());
    assert_eq!(wait.flat_action(Topology::Cnn), Some(0));
    let adv = h.decide(&c, &sig(11), &with_seed(seed(0, SeedStage::Germinated)));
    assert_eq!(adv.flat_action(Topology::Cnn), Some(10));
    let holding = |cc| SeedReport {
        counterfactual_contribution: Some(cc),
        total_improvement: 1.0,
        ..seed(0, SeedStage::Holding)
    };
    assert_eq!(h.decide(&c, &sig(12), &with_seed(holding(3.0))).flat_action(Topology::Cnn), Some(8));
    assert_eq!(h.decide(&c, &sig(13), &with_seed(holding(0.0))).flat_action(Topology::Cnn), Some(9));
    let ct = HeuristicConfig::with_rotation(Topology::Transformer, &[Attention]).unwrap();
    let ta = HeuristicState::default().decide(&ct, &sig(10), &empty_slots());
    assert_eq!(ta.flat_action(Topology::Transformer), Some(1));
}

#[test]
fn reset_restores_the_initial_state() {
    let c = cfg();
    let mut h = HeuristicState::default();
    let failing = SeedReport {
        epochs_in_stage: 6,
        improvement_since_stage_start: -5.0,
        ..seed(0, SeedStage::Training)
    };
    h.decide(&c, &sig(9), &empty_slots());
    h.decide(&c, &sig(20), &with_seed(failing));
    assert_ne!(h, HeuristicState::default());
    h.reset();
    assert_eq!(h, HeuristicState::default());
    assert_eq!((h.bp_index, h.germination_count, h.last_prune_epoch, h.last_decay_epoch), (0, 0, -100, -1));
}

#[test]
fn runner_differences_are_named_once_each() {
    let all = RunnerDifference::ALL;
    for (i, a) in all.iter().enumerate() {
        assert!(!all[i + 1..].contains(a), "{a:?} listed twice");
    }
    for named in [
        RunnerDifference::CombinedSeedOptimizer,
        RunnerDifference::BatchSizesAndEpochBudget,
        RunnerDifference::StepEpochBeforeDecision,
        RunnerDifference::NoCounterfactual,
        RunnerDifference::NoMasksOrPreflight,
    ] {
        assert!(all.contains(&named));
    }
}

// ---------------------------------------------------------------------------------------------
// Through the lifecycle: the decisions go through the same masks and handlers as any policy.

/// One env with 3 slots run in the RL loop's order: record → (validation side effects) → tracker →
/// decide → masks → apply → tick.
struct Driver {
    world: ReferenceLifecycle,
    signal_cfg: SignalConfig,
    tracker: SignalTracker,
    heuristic_cfg: HeuristicConfig,
    heuristic: HeuristicState,
    epoch: u32,
}

impl Driver {
    fn new() -> Self {
        let signal_cfg = SignalConfig::default();
        Self {
            world: ReferenceLifecycle::new(1, 3, LifecycleConfig::default()),
            signal_cfg,
            tracker: SignalTracker::new(&signal_cfg),
            heuristic_cfg: HeuristicConfig::default(),
            heuristic: HeuristicState::default(),
            epoch: 0,
        }
    }

    /// What this epoch's training/validation writes: healthy gradients on TRAINING seeds (if asked),
    /// and a counterfactual of `cc` for every seed with alpha > 0 that is not fossilized.
    fn step(&mut self, val_acc: f64, healthy_gradients: bool, cc: f64) -> (HeuristicDecision, OpOutcome) {
        self.epoch += 1;
        self.world.record(&[val_acc]);
        for s in self.world.env_mut(0) {
            if healthy_gradients && s.stage.current == SeedStage::Training {
                s.telemetry = GradientTelemetry {
                    gradient_norm: Some(0.5),
                    gradient_health: Some(1.0),
                    has_vanishing: Some(false),
                    has_exploding: Some(false),
                };
            }
            if s.stage.current.has_seed() && s.stage.current != SeedStage::Fossilized && s.alpha.0 > 0.0 {
                s.metrics.counterfactual_contribution = Some(cc);
            }
        }
        let env = self.world.env(0);
        let reports: [SeedReport; 3] = std::array::from_fn(|i| SeedReport::from_state(i as u8, &env[i]));
        let obs = EpochObservation {
            epoch: self.epoch,
            val_loss: 1.0,
            val_accuracy: val_acc,
            ..Default::default()
        };
        let signals = self.tracker.update(&self.signal_cfg, &obs, &reports);
        let decision = self.heuristic.decide(&self.heuristic_cfg, &signals, &reports);
        let masks = self.world.masks();
        let outcome = self.world.apply(&[decision.action], &masks)[0];
        self.world.tick();
        (decision, outcome)
    }

    fn stage(&self, s: usize) -> SeedStage {
        self.world.env(0)[s].stage.current
    }
}

#[test]
fn heuristic_walks_a_seed_from_germination_to_fossil_through_masks_and_handlers() {
    use HeuristicReason::*;
    use LifecycleOp::*;
    let mut d = Driver::new();
    let mut log = vec![];
    for _ in 0..23 {
        let (decision, outcome) = d.step(50.0, true, 1.0);
        log.push((d.epoch, decision.op(), decision.reason, outcome));
    }
    let at = |e: u32| log[e as usize - 1];
    // Constant loss: the tracker is stable from epoch 2 and latches at epoch 4; plateau 3 at epoch 4.
    for e in 1..=3 {
        assert_eq!(at(e).2, HostNotStabilized, "epoch {e}");
    }
    assert_eq!(at(4).2, TooEarly);
    assert_eq!(at(5), (5, Germinate, Plateau, OpOutcome::Executed));
    assert_eq!(at(6), (6, Advance, AdvanceToTraining, OpOutcome::Executed));
    // G2 needs 10 epochs in TRAINING (eics 1 at epoch 7 … 10 at epoch 16): the gate refuses until then.
    for e in 7..=15 {
        assert_eq!(at(e), (e, Advance, AdvanceToBlending, OpOutcome::FailedInHandler), "epoch {e}");
    }
    assert_eq!(at(16), (16, Advance, AdvanceToBlending, OpOutcome::Executed));
    // STANDARD tempo: 5 ramp ticks at the ends of epochs 16–20.
    for e in 17..=20 {
        assert_eq!(at(e), (e, Wait, Blending, OpOutcome::Executed), "epoch {e}");
    }
    assert_eq!(at(21), (21, Advance, AdvanceToHolding, OpOutcome::Executed));
    assert_eq!(at(22), (22, Fossilize, Fossilizing, OpOutcome::Executed));
    assert_eq!(d.stage(0), SeedStage::Fossilized);
    // The fossil is not live: the next plateau germinates the next blueprint into the next empty slot.
    assert_eq!(at(23), (23, Germinate, Plateau, OpOutcome::Executed));
    assert_eq!((d.stage(1), d.world.env(0)[1].blueprint.0), (SeedStage::Germinated, ConvHeavy));
    let s0 = d.world.env(0)[0];
    assert_eq!(
        (s0.blueprint.0, s0.tempo.epochs, s0.blend.blend, s0.blend.algorithm),
        (ConvLight, 5, BlendId::Sigmoid, AlphaAlgorithm::Add)
    );
    assert_eq!(s0.alpha.0, 1.0);
    assert_eq!(d.heuristic.germination_count, 2);
}

#[test]
fn heuristic_prunes_a_failing_seed_and_respects_its_embargo_through_the_cooldown() {
    use HeuristicReason::*;
    use LifecycleOp::*;
    let mut d = Driver::new();
    let mut log = vec![];
    for e in 1..=16 {
        // No gradient telemetry: G2 never passes and the seed stays in TRAINING. Accuracy drops 3 points
        // from epoch 8 on.
        let acc = if e < 8 { 50.0 } else { 47.0 };
        let (decision, outcome) = d.step(acc, false, 0.0);
        log.push((decision.op(), decision.reason, outcome, decision.target_slot));
    }
    let at = |e: usize| log[e - 1];
    assert_eq!(at(5).0, Germinate);
    assert_eq!(at(6).0, Advance);
    for e in 7..=10 {
        assert_eq!(at(e), (Advance, AdvanceToBlending, OpOutcome::FailedInHandler, Some(0)), "epoch {e}");
    }
    // Epoch 11: 5 epochs in TRAINING, 47 − 50 = −3 < −2: PRUNE (instant), allowed by the mask (age 6).
    assert_eq!(at(11), (Prune, FailingInTraining, OpOutcome::Executed, Some(0)));
    assert_eq!(d.heuristic.last_prune_epoch, 11);
    // Epochs 12–15: the heuristic's embargo and the slot's cooldown (double tick: empty at end of 15).
    for e in 12..=15 {
        assert_eq!(at(e).1, Embargo, "epoch {e}");
    }
    // Epoch 16 = 11 + 5: embargo over, slot free, masks allow it; conv_light's penalty has decayed away.
    assert_eq!(at(16), (Germinate, Plateau, OpOutcome::Executed, Some(0)));
    assert_eq!(d.world.env(0)[0].blueprint.0, ConvHeavy, "the rotation moved on");
    assert_eq!(d.heuristic.penalty(ConvLight), 0.0);
}

#[test]
fn a_heuristic_prune_mid_ramp_is_refused_by_the_mask() {
    // The reference runner prunes immediately at any controller mode; here the PRUNE mask needs HOLD.
    let config = LifecycleConfig::default();
    let mut slots = [SlotState::default(), SlotState::default(), SlotState::default()];
    let g = Germination {
        blueprint: ConvLight,
        blend: BlendId::Sigmoid,
        algorithm: AlphaAlgorithm::Add,
        tempo_epochs: 8,
        alpha_target: None,
    };
    let s = &mut slots[0];
    lifecycle::germinate(&mut s.view(), g, Topology::Cnn).unwrap();
    lifecycle::record_accuracy(&mut s.view(), 50.0);
    assert_eq!(lifecycle::advance_stage(&mut s.view(), None, &config), Ok(true));
    s.telemetry.gradient_health = Some(1.0);
    for _ in 0..10 {
        lifecycle::record_accuracy(&mut s.view(), 50.0);
    }
    assert_eq!(lifecycle::advance_stage(&mut s.view(), None, &config), Ok(true));
    for _ in 0..5 {
        lifecycle::record_accuracy(&mut s.view(), 47.0);
        lifecycle::step_epoch(&mut s.view(), &config);
    }
    assert_eq!(
        (s.stage.current, s.controller.mode, s.counters.epochs_in_stage),
        (SeedStage::Blending, AlphaMode::Up, 5)
    );
    let reports = SeedReport::from_states(&slots);
    let d = HeuristicState::default().decide(&HeuristicConfig::default(), &sig(30), &reports);
    assert_eq!((d.op(), d.reason), (LifecycleOp::Prune, HeuristicReason::FailingInBlending));
    let masks = env_masks(&slots, &config);
    assert!(!masks.allows(&d.action));
    assert_eq!(apply_action(&d.action, &masks, &mut slots[0].view(), &config), OpOutcome::RefusedByMask);
}
