//! Quality gates G0, G1, G2, G3, G5 in strict and permissive mode (spec kasmina §3.2). Only `passed`
//! affects behaviour in the reference, so a gate here is a predicate.

use crate::actions::BlueprintAction;
use crate::alpha::{ALPHA_EPSILON, AlphaMode};
use crate::slot::SlotMut;
use crate::stage::{GateLevel, SeedStage};

/// G2 and strict G3 dwell (`DEFAULT_MIN_BLENDING_EPOCHS`).
pub const MIN_DWELL_EPOCHS: u32 = 10;
/// Strict G2: pp of improvement since entering TRAINING.
pub const MIN_TRAINING_IMPROVEMENT: f64 = 0.5;
/// Strict G2: seed/host gradient-norm ratio.
pub const GRADIENT_RATIO_THRESHOLD: f64 = 0.10;
/// Permissive G2: gradient health.
pub const MIN_GRADIENT_HEALTH_FOR_BLENDING: f64 = 0.7;
/// Strict G5: counterfactual contribution in pp.
pub const MIN_FOSSILIZE_CONTRIBUTION: f64 = 1.0;

/// G0: the seed has an id and a blueprint id. Seed ids are generated, never empty, so this is the
/// blueprint id check.
pub fn gate_g0(blueprint: BlueprintAction) -> bool {
    !blueprint.id().is_empty()
}

/// G1: the seed is GERMINATED.
pub fn gate_g1(slot: &SlotMut) -> bool {
    slot.stage.current == SeedStage::Germinated
}

/// G2 (→ BLENDING).
pub fn gate_g2(slot: &SlotMut, permissive: bool) -> bool {
    let eics = slot.counters.epochs_in_stage;
    if permissive {
        // KTS-001: unmeasured gradient health is never treated as healthy.
        let t = *slot.telemetry;
        match t.gradient_health {
            None => false,
            Some(health) => {
                eics >= MIN_DWELL_EPOCHS
                    && !t.has_exploding.unwrap_or(false)
                    && health >= MIN_GRADIENT_HEALTH_FOR_BLENDING
            }
        }
    } else {
        slot.metrics.improvement_since_stage_start() >= MIN_TRAINING_IMPROVEMENT
            && eics >= MIN_DWELL_EPOCHS
            && slot.metrics.seed_gradient_norm_ratio.is_some_and(|r| r >= GRADIENT_RATIO_THRESHOLD)
    }
}

/// G3 (→ HOLDING): a full target, reached, with the controller at rest. Partial targets never pass.
pub fn gate_g3(slot: &SlotMut, permissive: bool) -> bool {
    let c = *slot.controller;
    let at_full_target = c.target >= 1.0 - ALPHA_EPSILON
        && c.mode == AlphaMode::Hold
        && (slot.alpha.0 - c.target).abs() <= ALPHA_EPSILON;
    at_full_target && (permissive || slot.counters.epochs_in_stage >= MIN_DWELL_EPOCHS)
}

/// G5 (→ FOSSILIZED): a measured counterfactual contribution (and a healthy seed; nothing in Kasmina
/// ever marks a seed unhealthy). Permissive mode has no contribution threshold at all.
pub fn gate_g5(slot: &SlotMut, permissive: bool) -> bool {
    match slot.metrics.counterfactual_contribution {
        None => false,
        Some(c) => permissive || c >= MIN_FOSSILIZE_CONTRIBUTION,
    }
}

/// Evaluate the gate guarding `level`.
pub fn gate_passes(level: GateLevel, slot: &SlotMut, permissive: bool) -> bool {
    match level {
        GateLevel::G0 => gate_g0(slot.blueprint.0),
        GateLevel::G1 => gate_g1(slot),
        GateLevel::G2 => gate_g2(slot, permissive),
        GateLevel::G3 => gate_g3(slot, permissive),
        GateLevel::G5 => gate_g5(slot, permissive),
    }
}
