//! Observe: each env's governor reads its validation loss (NaN/inf, lobotomy, divergence; tamiyo §6.3)
//! and, when healthy and due, refreshes the env's last-known-good snapshot. A panic is acted on in the
//! Act stage ([`crate::governor_rollback`]).

use crate::host_resources::{Hosts, Snapshots, StepClock};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::{GovernorConfig, GovernorState, PanicReason};
use esper_components::{EnvIndex, HostMetrics};

/// This epoch's verdict: roll the env back at action time.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GovernorVerdict {
    pub panic: Option<PanicReason>,
}

pub fn governor_check(
    mut envs: Query<(&EnvIndex, &HostMetrics, &mut GovernorState, &mut GovernorVerdict)>,
    config: Res<GovernorConfig>,
    clock: Res<StepClock>,
    hosts: Res<Hosts>,
    mut snapshots: ResMut<Snapshots>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::governor_check");
    let snapshots = &mut *snapshots;
    for (env, metrics, mut governor, mut verdict) in &mut envs {
        let signs = governor.check_and_snapshot(&config, clock.epoch as u32, metrics.val_loss);
        verdict.panic = signs.panic;
        if signs.snapshot {
            let e = env.0 as usize;
            snapshots.params.copy_env_from(&hosts.params, e);
            snapshots.bank.copy_env_params_from(&hosts.bank, e);
        }
    }
}
