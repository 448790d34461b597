//! `action_for_reward` (simic §1.3 D.1) against the spec's table, for every op × stage × alpha mode ×
//! seed age: the sampled op if it is valid for the target slot's state, else WAIT.
//!
//! The table, from the spec text: GERMINATE needs an empty slot; FOSSILIZE needs HOLDING; PRUNE needs
//! stage ∈ {GERMINATED, TRAINING, BLENDING, HOLDING}, the alpha controller in HOLD, an allowed
//! transition and seed age ≥ 5; SET_ALPHA_TARGET needs HOLD and stage ∈ {BLENDING, HOLDING}; ADVANCE
//! needs stage ∈ {GERMINATED, TRAINING, BLENDING}; a disabled slot makes every op but WAIT invalid.

use esper_components::{AlphaMode, LifecycleOp, SeedStage, SlotFacts, action_for_reward};

use AlphaMode::{Down, Hold, Up};
use LifecycleOp::*;
use SeedStage::*;

const STAGES: [SeedStage; 10] =
    [Unknown, Dormant, Germinated, Training, Blending, Holding, Fossilized, Pruned, Embargoed, Resetting];

/// One row of the table: the stages where `op` is valid, whether the controller must be at rest, and
/// the least seed age.
struct Rule {
    op: LifecycleOp,
    stages: &'static [SeedStage],
    needs_hold: bool,
    min_age: u32,
}

const TABLE: [Rule; 6] = [
    Rule { op: Wait, stages: &STAGES, needs_hold: false, min_age: 0 },
    // "empty slot": no seed state at all (the sentinel UNKNOWN included); cooldown stages block.
    Rule { op: Germinate, stages: &[Unknown, Dormant], needs_hold: false, min_age: 0 },
    Rule { op: Fossilize, stages: &[Holding], needs_hold: false, min_age: 0 },
    Rule { op: Prune, stages: &[Germinated, Training, Blending, Holding], needs_hold: true, min_age: 5 },
    Rule { op: SetAlphaTarget, stages: &[Blending, Holding], needs_hold: true, min_age: 0 },
    Rule { op: Advance, stages: &[Germinated, Training, Blending], needs_hold: false, min_age: 0 },
];

#[test]
fn action_for_reward_follows_the_spec_table() {
    let mut valid_cases = 0;
    let mut cases = 0;
    for rule in &TABLE {
        for stage in STAGES {
            for mode in [Hold, Up, Down] {
                for age in [0, 4, 5, 12] {
                    let valid = rule.stages.contains(&stage)
                        && (!rule.needs_hold || mode == Hold)
                        && age >= rule.min_age;
                    let expected = if valid { rule.op } else { Wait };
                    let facts = SlotFacts { stage, alpha_mode: mode, seed_age: age };
                    assert_eq!(
                        action_for_reward(rule.op, Some(facts)),
                        expected,
                        "{:?} on {stage:?}, mode {mode:?}, age {age}",
                        rule.op
                    );
                    cases += 1;
                    valid_cases += usize::from(valid);
                }
            }
        }
        // A slot head naming no enabled slot: every op is rewarded as WAIT (WAIT itself included).
        assert_eq!(action_for_reward(rule.op, None), Wait, "{:?} on a disabled slot", rule.op);
    }
    assert_eq!(cases, 6 * 10 * 3 * 4);
    // WAIT 120; GERMINATE 2 stages × 12; FOSSILIZE 12; PRUNE 4 stages × HOLD × ages 5, 12;
    // SET_ALPHA_TARGET 2 × HOLD × 4 ages; ADVANCE 3 × 12.
    assert_eq!(valid_cases, 120 + 24 + 12 + 8 + 8 + 36);
}

#[test]
fn invalid_op_is_rewarded_as_wait_examples() {
    let holding = SlotFacts { stage: Holding, alpha_mode: Hold, seed_age: 20 };
    assert_eq!(action_for_reward(Germinate, Some(holding)), Wait, "germinate onto a seed");
    assert_eq!(action_for_reward(Fossilize, Some(holding)), Fossilize);
    let ramping = SlotFacts { stage: Blending, alpha_mode: Up, seed_age: 20 };
    assert_eq!(action_for_reward(Prune, Some(ramping)), Wait, "prune mid-ramp");
    assert_eq!(action_for_reward(Advance, Some(ramping)), Advance);
    let young = SlotFacts { stage: Training, alpha_mode: Hold, seed_age: 4 };
    assert_eq!(action_for_reward(Prune, Some(young)), Wait, "prune below MIN_PRUNE_AGE");
    let cooling = SlotFacts { stage: Embargoed, alpha_mode: Hold, seed_age: 9 };
    assert_eq!(action_for_reward(Germinate, Some(cooling)), Wait, "cooldown blocks germination");
}
