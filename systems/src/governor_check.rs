//! Observe: each env's governor reads its validation loss (NaN/inf, lobotomy, divergence; tamiyo §6.3)
//! and, when healthy and due, refreshes the env's last-known-good snapshot as the reference takes it
//! (tamiyo §6.4): the host plus the seeds FOSSILIZED at this moment — their weights and their state.
//! Live seeds are left out. A panic is settled before the reward ([`crate::resolve_actions`]) and
//! carried out in Act ([`crate::governor_rollback`]).

use crate::host_resources::{Hosts, StepClock};
use crate::resources::EnvCount;
use crate::slot_query::SlotLifecycle;
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::governor::{GovernorConfig, GovernorState, PanicReason};
use esper_components::{EnvIndex, FossilSnapshot, HostMetrics, SeedStage, SlotConfig, SlotIndex};
use esper_kernels::host::FossilRow;
use esper_kernels::seeds::CnnBlueprint;

/// This epoch's verdict: roll the env back at action time.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GovernorVerdict {
    pub panic: Option<PanicReason>,
}

/// The system's reused columns.
#[derive(Default)]
pub struct SnapshotScratch {
    /// `[E]`: the env snapshots this step.
    due: Vec<bool>,
    /// `[E × S]`: the fossil rows the snapshots take.
    fossils: Vec<Option<FossilRow>>,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn governor_check(
    mut envs: Query<(&EnvIndex, &HostMetrics, &mut GovernorState, &mut GovernorVerdict)>,
    mut slots: Query<(
        &EnvIndex,
        &SlotIndex,
        &mut FossilSnapshot,
        <SlotLifecycle as bevy_ecs::query::QueryData>::ReadOnly,
    )>,
    config: Res<GovernorConfig>,
    clock: Res<StepClock>,
    mut hosts: ResMut<Hosts>,
    slot_config: Res<SlotConfig>,
    n_envs: Res<EnvCount>,
    mut scratch: Local<SnapshotScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Observe::governor_check");
    let n_slots = slot_config.len();
    let SnapshotScratch { due, fossils } = &mut *scratch;
    due.clear();
    due.resize(n_envs.0, false);
    fossils.clear();
    fossils.resize(n_envs.0 * n_slots, None);
    for (env, metrics, mut governor, mut verdict) in &mut envs {
        let signs = governor.check_and_snapshot(&config, clock.epoch as u32, metrics.val_loss);
        verdict.panic = signs.panic;
        due[env.0 as usize] = signs.snapshot;
    }
    if !due.contains(&true) {
        return;
    }
    for (env, index, mut held, slot) in &mut slots {
        let e = env.0 as usize;
        if !due[e] {
            continue;
        }
        let fossil = slot.stage.current == SeedStage::Fossilized;
        let blueprint = CnnBlueprint::from_action_index(slot.blueprint.0 as u8).filter(|_| fossil);
        fossils[e * n_slots + index.0 as usize] =
            blueprint.map(|bp| FossilRow { blueprint: bp, gate: slot.blend.has_gate });
        held.0 = blueprint.map(|_| slot.state());
    }
    for (e, _) in due.iter().enumerate().filter(|(_, due)| **due) {
        hosts.take_snapshot(e, &fossils[e * n_slots..(e + 1) * n_slots]);
    }
}
