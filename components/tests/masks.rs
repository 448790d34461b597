//! Action masks (spec tamiyo §3): the pinned cases of the reference's tests, a table of hand-built
//! situations, causal relevance and placeholders (tamiyo §2.1–2.2).

use esper_components::masks::{MaskParams, MaskSeedInfo, compute_action_masks, count_seeds};
use esper_components::*;

const CNN: MaskParams = MaskParams {
    topology: Topology::Cnn,
    max_seeds: 0,
    allow_governor_override: false,
    disable_advance: false,
};

fn seed(stage: SeedStage, age: u32) -> Option<MaskSeedInfo> {
    Some(MaskSeedInfo { stage, seed_age_epochs: age, alpha_mode: AlphaMode::Hold })
}

fn masks(slots: &[Option<MaskSeedInfo>], params: &MaskParams) -> ActionMasks {
    let total = count_seeds(slots.iter().flatten().map(|s| s.stage));
    compute_action_masks(slots, total, params)
}

/// The legal ops, by name, in op order.
fn ops(m: &ActionMasks) -> Vec<&'static str> {
    LifecycleOp::ALL.into_iter().filter(|&op| m.op[op as usize]).map(LifecycleOp::name).collect()
}

fn row(m: &ActionMasks, op: LifecycleOp) -> Vec<bool> {
    m.slots_for_op(op).to_vec()
}

#[test]
fn pinned_prune_age_and_alpha_mode() {
    let young = masks(&[seed(SeedStage::Training, 4)], &CNN);
    assert!(!young.op[LifecycleOp::Prune as usize], "age 4 → PRUNE illegal");
    let old = masks(&[seed(SeedStage::Training, 5)], &CNN);
    assert!(old.op[LifecycleOp::Prune as usize], "age 5 → legal");
    let ramping =
        Some(MaskSeedInfo { stage: SeedStage::Blending, seed_age_epochs: 9, alpha_mode: AlphaMode::Down });
    assert!(!masks(&[ramping], &CNN).op[LifecycleOp::Prune as usize], "DOWN → PRUNE illegal");
    let over = MaskParams { allow_governor_override: true, ..CNN };
    assert!(masks(&[ramping], &over).op[LifecycleOp::Prune as usize], "… unless governor override");
}

#[test]
fn pinned_all_empty_all_embargoed_and_pruned_plus_empty() {
    assert_eq!(ops(&masks(&[None, None, None], &CNN)), vec!["WAIT", "GERMINATE"]);
    let embargoed =
        [seed(SeedStage::Embargoed, 9), seed(SeedStage::Embargoed, 9), seed(SeedStage::Embargoed, 9)];
    let m = masks(&embargoed, &CNN);
    assert_eq!(ops(&m), vec!["WAIT"]);
    assert!(m.is_forced_wait());
    let m = masks(&[seed(SeedStage::Pruned, 7), None], &CNN);
    assert!(!m.op[LifecycleOp::Germinate as usize], "one PRUNED + one empty → GERMINATE illegal");
}

/// A table of hand-built situations (3 slots, r0c0 r0c1 r0c2) with every head that changes.
#[test]
fn hand_built_situations() {
    use SeedStage::*;
    struct Case {
        name: &'static str,
        slots: [Option<MaskSeedInfo>; 3],
        max_seeds: u32,
        ops: &'static [&'static str],
        germinate_slots: [bool; 3],
        advance_slots: [bool; 3],
        prune_slots: [bool; 3],
        open_style: bool,
    }
    let cases = [
        Case {
            name: "empty env",
            slots: [None, None, None],
            max_seeds: 0,
            ops: &["WAIT", "GERMINATE"],
            germinate_slots: [true, true, true],
            advance_slots: [false; 3],
            prune_slots: [false; 3],
            open_style: true,
        },
        Case {
            name: "one slot developing (TRAINING, old enough to prune)",
            slots: [None, seed(Training, 6), None],
            max_seeds: 0,
            ops: &["WAIT", "PRUNE", "ADVANCE"],
            germinate_slots: [false; 3],
            advance_slots: [false, true, false],
            prune_slots: [false, true, false],
            open_style: false,
        },
        Case {
            name: "all slots fossilized",
            slots: [seed(Fossilized, 30), seed(Fossilized, 20), seed(Fossilized, 10)],
            max_seeds: 0,
            ops: &["WAIT"],
            germinate_slots: [false; 3],
            advance_slots: [false; 3],
            prune_slots: [false; 3],
            open_style: false,
        },
        Case {
            name: "cooldown blocks germinate everywhere",
            slots: [seed(Embargoed, 8), None, seed(Fossilized, 12)],
            max_seeds: 0,
            ops: &["WAIT"],
            germinate_slots: [false; 3],
            advance_slots: [false; 3],
            prune_slots: [false; 3],
            open_style: false,
        },
        Case {
            name: "seed too young to prune",
            slots: [seed(Germinated, 1), None, None],
            max_seeds: 0,
            ops: &["WAIT", "ADVANCE"],
            germinate_slots: [false; 3],
            advance_slots: [true, false, false],
            prune_slots: [false; 3],
            open_style: false,
        },
        Case {
            name: "max_seeds reached (a fossil and a holding seed count)",
            slots: [seed(Fossilized, 20), seed(Holding, 9), None],
            max_seeds: 2,
            ops: &["WAIT", "SET_ALPHA_TARGET", "PRUNE", "FOSSILIZE"],
            germinate_slots: [false; 3],
            advance_slots: [false; 3],
            prune_slots: [false, true, false],
            open_style: true,
        },
        Case {
            name: "scaffolding: BLENDING does not block germinate",
            slots: [seed(Blending, 9), None, None],
            max_seeds: 3,
            ops: &["WAIT", "GERMINATE", "SET_ALPHA_TARGET", "PRUNE", "ADVANCE"],
            germinate_slots: [false, true, true],
            advance_slots: [true, false, false],
            prune_slots: [true, false, false],
            open_style: true,
        },
    ];
    for c in cases {
        let params = MaskParams { max_seeds: c.max_seeds, ..CNN };
        let m = masks(&c.slots, &params);
        assert_eq!(ops(&m), c.ops, "{}: ops", c.name);
        assert_eq!(row(&m, LifecycleOp::Germinate), c.germinate_slots, "{}: germinate slots", c.name);
        assert_eq!(row(&m, LifecycleOp::Advance), c.advance_slots, "{}: advance slots", c.name);
        assert_eq!(row(&m, LifecycleOp::Prune), c.prune_slots, "{}: prune slots", c.name);
        assert_eq!(row(&m, LifecycleOp::Wait), vec![true; 3], "{}: WAIT row = enabled slots", c.name);
        if c.open_style {
            assert_eq!((m.style, m.alpha_target), ([true; 4], [true; 3]), "{}", c.name);
        } else {
            assert_eq!(
                (m.style, m.alpha_target),
                ([false, false, true, false], [false, false, true]),
                "{}",
                c.name
            );
        }
        assert_eq!((m.tempo, m.alpha_speed, m.alpha_curve), ([true; 3], [true; 4], [true; 5]), "{}", c.name);
    }
}

#[test]
fn blueprint_mask_per_topology_never_allows_noop() {
    let cnn = masks(&[None], &CNN);
    assert_eq!(cnn.blueprint.iter().filter(|&&b| b).count(), 7);
    assert!(cnn.blueprint[1..=7].iter().all(|&b| b) && !cnn.blueprint[0]);
    let tf = masks(&[None], &MaskParams { topology: Topology::Transformer, ..CNN });
    let legal: Vec<usize> = (0..13).filter(|&i| tf.blueprint[i]).collect();
    assert_eq!(legal, vec![2, 3, 8, 9, 10, 11, 12]);
}

#[test]
fn advance_disabled_only_when_all_auto_forward_gates_are_on() {
    let off = MaskParams { disable_advance: true, ..CNN };
    assert!(!masks(&[seed(SeedStage::Training, 3)], &off).op[LifecycleOp::Advance as usize]);
    let config = LifecycleConfig { auto_forward_g1: true, auto_forward_g2: true, ..Default::default() };
    assert!(!config.disable_advance());
}

#[test]
fn dormant_report_counts_as_occupied() {
    // A DORMANT report is not "empty": it enables nothing and blocks GERMINATE into that slot.
    let m = masks(&[seed(SeedStage::Dormant, 0), None], &CNN);
    assert_eq!(row(&m, LifecycleOp::Germinate), vec![false, true]);
    assert_eq!(ops(&m), vec!["WAIT", "GERMINATE"]);
}

#[test]
fn allows_checks_op_slot_and_only_relevant_heads() {
    let m = masks(&[seed(SeedStage::Holding, 9), None, seed(SeedStage::Training, 2)], &CNN);
    let fossilize = FactoredAction { op: LifecycleOp::Fossilize as u8, slot: 0, ..FactoredAction::wait() };
    assert!(m.allows(&fossilize));
    // Irrelevant heads may hold anything, even out-of-range values.
    assert!(m.allows(&FactoredAction { blueprint: 0, style: 99, tempo: 200, ..fossilize }));
    assert!(!m.allows(&FactoredAction { slot: 2, ..fossilize }), "slot 2 cannot fossilize");
    assert!(!m.allows(&FactoredAction { slot: 3, ..fossilize }), "slot out of range");
    assert!(!m.allows(&FactoredAction { op: 6, ..fossilize }), "op out of range");
    // GERMINATE is illegal while slot 2 trains; a retarget uses style and alpha_target, which are open.
    let retarget = FactoredAction {
        op: LifecycleOp::SetAlphaTarget as u8,
        slot: 0,
        style: 3,
        alpha_target: 0,
        ..FactoredAction::wait()
    };
    assert!(m.allows(&retarget));
    assert!(
        !m.allows(&FactoredAction { alpha_speed: 4, ..retarget }),
        "alpha_speed is relevant and out of range"
    );
    let germ =
        FactoredAction { op: LifecycleOp::Germinate as u8, slot: 1, blueprint: 1, ..FactoredAction::wait() };
    assert!(!m.allows(&germ));
    let m = masks(&[None], &CNN);
    assert!(m.allows(&germ.clone_with_slot(0)));
    assert!(!m.allows(&FactoredAction { blueprint: 0, ..germ.clone_with_slot(0) }), "NOOP blueprint");
    assert!(
        !m.allows(&FactoredAction { blueprint: 8, ..germ.clone_with_slot(0) }),
        "LoRA is not a CNN blueprint"
    );
    assert!(m.allows(&FactoredAction::wait()));
}

trait WithSlot {
    fn clone_with_slot(&self, slot: u8) -> Self;
}
impl WithSlot for FactoredAction {
    fn clone_with_slot(&self, slot: u8) -> Self {
        FactoredAction { slot, ..*self }
    }
}

#[test]
fn causal_relevance_table_and_placeholders() {
    use Head::*;
    let relevant = |op| {
        let r = relevant_heads(op);
        Head::ALL.into_iter().filter(|h| r[*h as usize]).collect::<Vec<_>>()
    };
    assert_eq!(relevant(LifecycleOp::Wait), vec![Op]);
    assert_eq!(relevant(LifecycleOp::Germinate), vec![Slot, Blueprint, Style, Tempo, AlphaTarget, Op]);
    assert_eq!(
        relevant(LifecycleOp::SetAlphaTarget),
        vec![Slot, Style, AlphaTarget, AlphaSpeed, AlphaCurve, Op]
    );
    assert_eq!(relevant(LifecycleOp::Prune), vec![Slot, AlphaSpeed, AlphaCurve, Op]);
    assert_eq!(relevant(LifecycleOp::Fossilize), vec![Slot, Op]);
    assert_eq!(relevant(LifecycleOp::Advance), vec![Slot, Op]);
    let placeholders: Vec<Option<u8>> = Head::ALL.iter().map(|h| h.placeholder()).collect();
    assert_eq!(placeholders, vec![None, Some(0), Some(2), Some(1), Some(2), Some(0), Some(0), None]);
    assert_eq!(Head::ALL.map(|h| h.size(3)), [3, 13, 4, 3, 3, 4, 5, 6]);
    assert_eq!(
        Head::ALL.map(Head::name),
        ["slot", "blueprint", "style", "tempo", "alpha_target", "alpha_speed", "alpha_curve", "op"]
    );
}

#[test]
fn head_values_map_to_the_reference_meanings() {
    assert_eq!(TempoAction::ALL.map(TempoAction::epochs), [3, 5, 8]);
    assert_eq!(AlphaTargetAction::ALL.map(AlphaTargetAction::value), [0.5, 0.7, 1.0]);
    assert_eq!(AlphaSpeedAction::ALL.map(AlphaSpeedAction::steps), [0, 3, 5, 8]);
    assert_eq!(
        AlphaCurveAction::ALL.map(AlphaCurveAction::curve_and_steepness),
        [
            (AlphaCurve::Linear, 12.0),
            (AlphaCurve::Cosine, 12.0),
            (AlphaCurve::Sigmoid, 6.0),
            (AlphaCurve::Sigmoid, 12.0),
            (AlphaCurve::Sigmoid, 24.0)
        ]
    );
    assert_eq!(
        GerminationStyle::ALL.map(GerminationStyle::blend_and_algorithm),
        [
            (BlendId::Linear, AlphaAlgorithm::Add),
            (BlendId::Linear, AlphaAlgorithm::Multiply),
            (BlendId::Sigmoid, AlphaAlgorithm::Add),
            (BlendId::Gated, AlphaAlgorithm::Gate)
        ]
    );
}
