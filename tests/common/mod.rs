//! Shared setup of the app's integration tests.

use esper_components::{
    AlphaAlgorithm, AlphaController, BlendId, BlendStyle, Blueprint, BlueprintAction, SeedAlpha, SeedStage,
    SlotFlags, SlotState, Stage, StageCounters,
};

/// A seed at `stage` with ADD blending held at `alpha` (controller at rest), 10 epochs old, as if it
/// had come there through the lifecycle. Written into a slot with a germination event, the kernels
/// give it a freshly born module at the next TrainHosts.
pub fn seed_at(stage: SeedStage, blueprint: BlueprintAction, alpha: f64) -> SlotState {
    SlotState {
        stage: Stage { current: stage, previous: SeedStage::Training, previous_epochs_in_stage: 3 },
        counters: StageCounters { epochs_total: 10, epochs_in_stage: 2 },
        blueprint: Blueprint(blueprint),
        blend: BlendStyle {
            blend: BlendId::Linear,
            algorithm: AlphaAlgorithm::Add,
            alpha_target: alpha,
            has_gate: false,
        },
        alpha: SeedAlpha(alpha),
        controller: AlphaController::holding_at(alpha),
        flags: SlotFlags { isolate_gradients: true, blend_out_frozen: false },
        ..SlotState::default()
    }
}
