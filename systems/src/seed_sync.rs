//! What the kernels need to know about each slot's seed, derived from its lifecycle components at an
//! epoch boundary (kasmina §4.3, §5.1–5.2, §8.2). The TrainHosts and Validate stages read the kernels'
//! [`SeedEnvState`]s; this is the one place that decides them.

use esper_components::{
    AlphaAlgorithm, BlendStyle, Blueprint, SeedAlpha, SeedStage, SlotFlags, SlotState, Stage,
};
use esper_kernels::host::{SeedEnvState, SeedMode};
use esper_kernels::seeds::CnnBlueprint;

/// The kernels' view of one slot:
/// * forward mode: off unless the stage is active; TRAINING at alpha 0 is the straight-through
///   incubator; otherwise the blend algorithm (the GATE mode needs the gate module);
/// * seed parameters train in every active stage unless frozen by a blend-out — FOSSILIZED seeds keep
///   training in the RL loop (§8.2 d);
/// * gate gradients are computed while the gate blends and is not frozen, but the gate joins the seed
///   optimizer only when the optimizer is rebuilt at fossilization (§8.2 c);
/// * gradient-health statistics are collected for TRAINING and BLENDING seeds.
pub fn seed_env_state(slot: &SlotState) -> SeedEnvState {
    seed_env_state_of(&slot.stage, &slot.blueprint, &slot.alpha, &slot.blend, &slot.flags)
}

/// [`seed_env_state`] from the components a query reads.
pub fn seed_env_state_of(
    stage: &Stage,
    blueprint: &Blueprint,
    alpha: &SeedAlpha,
    blend: &BlendStyle,
    flags: &SlotFlags,
) -> SeedEnvState {
    let stage = stage.current;
    let blueprint = if stage.has_seed() { CnnBlueprint::from_action_index(blueprint.0 as u8) } else { None };
    let alpha = alpha.0;
    let frozen = flags.blend_out_frozen;
    let mode = match stage {
        _ if blueprint.is_none() || !stage.is_active() => SeedMode::Off,
        SeedStage::Training if alpha == 0.0 => SeedMode::Incubator,
        _ => match blend.algorithm {
            AlphaAlgorithm::Add => SeedMode::Add,
            AlphaAlgorithm::Multiply => SeedMode::Multiply,
            AlphaAlgorithm::Gate if blend.has_gate => SeedMode::Gate,
            // GATE without a gate module never happens in the lifecycle; blend as ADD rather than panic.
            AlphaAlgorithm::Gate => SeedMode::Add,
        },
    };
    let active = mode != SeedMode::Off;
    SeedEnvState {
        mode,
        blueprint: if active { blueprint } else { None },
        alpha: alpha as f32,
        train_seed: active && !frozen,
        gate_grad: mode == SeedMode::Gate && !frozen,
        gate_step: mode == SeedMode::Gate && stage == SeedStage::Fossilized,
        collect_stats: active && matches!(stage, SeedStage::Training | SeedStage::Blending),
    }
}
