//! Observe: `record_accuracy(val_acc)` on every slot that holds a state, cooldown stages included
//! (simic §1.3 C.2). This is the first of the two counter advances per epoch (kasmina §8.2 a).

use crate::resources::EnvCount;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::lifecycle;
use esper_components::{EnvIndex, HostMetrics, SeedMetrics, Stage, StageCounters};

pub fn record_accuracy(
    envs: Query<(&EnvIndex, &HostMetrics)>,
    mut slots: Query<(&EnvIndex, &Stage, &mut StageCounters, &mut SeedMetrics)>,
    n_envs: Res<EnvCount>,
    mut val_accuracy: Local<Vec<f64>>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::record_accuracy");
    val_accuracy.clear();
    val_accuracy.resize(n_envs.0, 0.0);
    for (env, metrics) in &envs {
        val_accuracy[env.0 as usize] = metrics.val_accuracy;
    }
    for (env, stage, mut counters, mut metrics) in &mut slots {
        let acc = val_accuracy[env.0 as usize];
        lifecycle::record_accuracy_of(stage, &mut counters, &mut metrics, acc);
    }
}
