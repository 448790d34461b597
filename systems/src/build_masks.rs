//! Observe: every env's action masks from its slots' post-record state, as one pass over the slot
//! column followed by a per-env pass over small host-side scalars.

use crate::resources::{EnvCount, MaskBatch};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::masks::{MaskSeedInfo, compute_action_masks, count_seeds};
use esper_components::{
    AlphaController, EnvIndex, LifecycleConfig, SlotConfig, SlotIndex, Stage, StageCounters,
};

#[allow(clippy::too_many_arguments)]
pub fn build_masks(
    slots: Query<(&EnvIndex, &SlotIndex, &Stage, &StageCounters, &AlphaController)>,
    config: Res<LifecycleConfig>,
    slot_config: Res<SlotConfig>,
    n_envs: Res<EnvCount>,
    mut masks: ResMut<MaskBatch>,
    mut infos: Local<Vec<Option<MaskSeedInfo>>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::build_masks");
    let n_slots = slot_config.len();
    infos.clear();
    infos.resize(n_envs.0 * n_slots, None);
    for (env, index, stage, counters, controller) in &slots {
        if stage.current.has_state() {
            infos[env.0 as usize * n_slots + index.0 as usize] = Some(MaskSeedInfo {
                stage: stage.current,
                seed_age_epochs: counters.epochs_total,
                alpha_mode: controller.mode,
            });
        }
    }
    let params = config.mask_params();
    for (env_masks, env_slots) in masks.0.iter_mut().zip(infos.chunks_exact(n_slots)) {
        let total_seeds = count_seeds(env_slots.iter().flatten().map(|s| s.stage));
        *env_masks = compute_action_masks(env_slots, total_seeds, &params);
    }
}
