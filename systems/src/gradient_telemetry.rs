//! Observe: seed gradient telemetry of this epoch's collection batches into the slots (kasmina §5.3,
//! §5.4): gradient norm and health, vanishing/exploding flags, and the seed/host gradient ratio EMA
//! (first value = ratio, then 0.9·ema + 0.1·ratio). Slots without statistics this epoch keep what they
//! had: unmeasured stays unmeasured, never "healthy".

use crate::host_resources::Hosts;
use crate::resources::ParamCounts;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{EnvIndex, GradientTelemetry, SeedMetrics, SlotIndex};
use esper_kernels::host::SeedTelemetry;

pub fn sync_gradient_telemetry(
    mut hosts: ResMut<Hosts>,
    param_counts: Res<ParamCounts>,
    mut slots: Query<(&EnvIndex, &SlotIndex, &mut GradientTelemetry, &mut SeedMetrics)>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::sync_gradient_telemetry");
    // From the run's table: `HostArch::param_count` builds a list per call.
    let host_elements = param_counts.host as usize;
    for (env, index, mut telemetry, mut metrics) in &mut slots {
        let e = env.0 as usize;
        let Some(SeedTelemetry { stats, host_norm }) = hosts.seed_telemetry(index.0 as usize, e) else {
            continue;
        };
        *telemetry = GradientTelemetry {
            gradient_norm: Some(stats.norm),
            gradient_health: Some(stats.health),
            has_vanishing: Some(stats.has_vanishing),
            has_exploding: Some(stats.has_exploding),
        };
        let ratio = stats.ratio_to_host(host_norm, host_elements);
        metrics.seed_gradient_norm_ratio = Some(match metrics.seed_gradient_norm_ratio {
            None => ratio,
            Some(ema) => 0.9 * ema + 0.1 * ratio,
        });
    }
}
