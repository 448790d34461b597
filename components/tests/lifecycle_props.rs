//! Property test: uniformly random ops, legal and illegal, through 3 slots for 200 epochs, with the
//! invariants of spec kasmina §8.1 checked after every phase of every epoch.

use esper_components::masks::sample_masked;
use esper_components::reference::ReferenceLifecycle;
use esper_components::*;
use proptest::prelude::*;

/// One epoch's randomness: the val accuracy, whether the action is sampled from the masks (legal) or
/// uniformly from the raw head ranges (mostly illegal), and a seed for the draws.
#[derive(Clone, Debug)]
struct EpochDraw {
    accuracy: f64,
    from_masks: bool,
    seed: u64,
    contribution: Option<f64>,
    health: Option<f64>,
}

fn epoch_draw() -> impl Strategy<Value = EpochDraw> {
    (
        0.0..100.0f64,
        any::<bool>(),
        any::<u64>(),
        proptest::option::of(-5.0..5.0f64),
        proptest::option::of(0.5..1.0f64),
    )
        .prop_map(|(accuracy, from_masks, seed, contribution, health)| EpochDraw {
            accuracy,
            from_masks,
            seed,
            contribution,
            health,
        })
}

fn config() -> impl Strategy<Value = LifecycleConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 0u32..4).prop_map(|(p, g1, g2, g3, max)| {
        LifecycleConfig {
            permissive_gates: p,
            auto_forward_g1: g1,
            auto_forward_g2: g2,
            auto_forward_g3: g3,
            max_seeds: max,
            ..LifecycleConfig::default()
        }
    })
}

/// SplitMix64: the test's own seeded stream.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform over each head's raw range plus one out-of-range value, so illegal indices are exercised.
fn raw_action(state: &mut u64, n_slots: usize) -> FactoredAction {
    let mut below = |n: usize| (splitmix(state) % n as u64) as u8;
    FactoredAction {
        slot: below(n_slots + 1),
        blueprint: below(BlueprintAction::COUNT + 1),
        style: below(GerminationStyle::COUNT + 1),
        tempo: below(TempoAction::COUNT + 1),
        alpha_target: below(AlphaTargetAction::COUNT + 1),
        alpha_speed: below(AlphaSpeedAction::COUNT + 1),
        alpha_curve: below(AlphaCurveAction::COUNT + 1),
        op: below(LifecycleOp::COUNT + 1),
    }
}

/// A legal action whose op is drawn with weights that favour progress over pruning, so runs reach
/// BLENDING, HOLDING and FOSSILIZED often; the other heads come from [`sample_masked`].
fn legal_action(masks: &ActionMasks, state: &mut u64) -> FactoredAction {
    const WEIGHTS: [u64; LifecycleOp::COUNT] = [4, 6, 2, 1, 8, 12]; // WAIT GERM SET PRUNE FOSS ADV
    let total: u64 =
        LifecycleOp::ALL.iter().filter(|&&op| masks.op[op as usize]).map(|&op| WEIGHTS[op as usize]).sum();
    let mut k = splitmix(state) % total;
    let op = LifecycleOp::ALL
        .into_iter()
        .filter(|&op| masks.op[op as usize])
        .find(|&op| {
            let w = WEIGHTS[op as usize];
            if k < w {
                true
            } else {
                k -= w;
                false
            }
        })
        .expect("WAIT is always legal");
    let mut rest = sample_masked(masks, |n| (splitmix(state) % n as u64) as usize);
    let slots: Vec<u8> = (0..masks.n_slots).filter(|&i| masks.slots_for_op(op)[i as usize]).collect();
    rest.op = op as u8;
    rest.slot = slots[(splitmix(state) % slots.len() as u64) as usize];
    rest
}

fn check_stage_changes(before: &[SlotState], after: &[SlotState], phase: &str) -> Result<(), TestCaseError> {
    for (s, (b, a)) in before.iter().zip(after).enumerate() {
        let (from, to) = (b.stage.current, a.stage.current);
        prop_assert!(
            from == to || from.can_transition_to(to),
            "{phase}: slot {s}: {from} -> {to} not in the table"
        );
    }
    Ok(())
}

fn check_slot_invariants(slots: &[SlotState]) -> Result<(), TestCaseError> {
    for (s, slot) in slots.iter().enumerate() {
        prop_assert!((0.0..=1.0).contains(&slot.alpha.0), "slot {s}: alpha {}", slot.alpha.0);
        prop_assert!((0.0..=1.0).contains(&slot.controller.alpha), "slot {s}: controller alpha");
        prop_assert!(slot.metrics.best_val_accuracy >= slot.metrics.current_val_accuracy);
        if slot.is_empty() {
            prop_assert_eq!(slot, &SlotState::default(), "slot {}: empty slot has leftover state", s);
        }
        if slot.stage.current == SeedStage::Fossilized {
            prop_assert_eq!(slot.alpha.0, 1.0);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_keep_every_lifecycle_invariant(config in config(), draws in prop::collection::vec(epoch_draw(), 200)) {
        let n_slots = 3;
        let mut world = ReferenceLifecycle::new(1, n_slots, config);
        let mut fossils: Vec<Option<SlotState>> = vec![None; n_slots];
        let mut executed_ops = 0;
        for draw in &draws {
            // Validation results land on live seeds (what the Validate stage will write).
            for slot in &mut world.slots {
                if slot.stage.current.has_seed() && slot.alpha.0 > 0.0 && slot.stage.current != SeedStage::Fossilized {
                    slot.metrics.counterfactual_contribution = draw.contribution;
                }
                if matches!(slot.stage.current, SeedStage::Training | SeedStage::Blending) && draw.health.is_some() {
                    slot.telemetry.gradient_health = draw.health;
                    slot.telemetry.has_exploding = Some(false);
                    slot.metrics.seed_gradient_norm_ratio = draw.health.map(|h| h - 0.45);
                }
            }
            let before_record = world.slots.clone();
            world.record(&[draw.accuracy]);
            check_stage_changes(&before_record, &world.slots, "record")?;

            let masks = world.masks();
            let mut rng = draw.seed;
            let action = if draw.from_masks {
                legal_action(&masks[0], &mut rng)
            } else {
                raw_action(&mut rng, n_slots)
            };
            let before_op = world.slots.clone();
            let outcome = world.apply(&[action], &masks)[0];
            check_stage_changes(&before_op, &world.slots, "op")?;
            if !masks[0].allows(&action) {
                prop_assert_eq!(outcome, OpOutcome::RefusedByMask);
                prop_assert_eq!(&before_op, &world.slots, "a masked op changed the world");
            } else {
                prop_assert_ne!(outcome, OpOutcome::RefusedByMask);
            }
            if outcome.failed() {
                prop_assert_eq!(&before_op, &world.slots, "a failed op changed the world");
            } else if action.op != LifecycleOp::Wait as u8 {
                executed_ops += 1;
            }

            let before_tick = world.slots.clone();
            world.tick();
            check_stage_changes(&before_tick, &world.slots, "tick")?;
            check_slot_invariants(&world.slots)?;

            for (s, slot) in world.slots.iter().enumerate() {
                if let Some(fossil) = &fossils[s] {
                    prop_assert_eq!(slot.stage, fossil.stage, "FOSSILIZED changed stage");
                    prop_assert_eq!(slot.alpha, fossil.alpha);
                    prop_assert_eq!(slot.blend, fossil.blend);
                    prop_assert_eq!(slot.blueprint, fossil.blueprint);
                } else if slot.stage.current == SeedStage::Fossilized {
                    fossils[s] = Some(*slot);
                }
            }
        }
        prop_assert!(executed_ops > 0, "the run executed no op at all");

    }
}
