//! Validate: one fused eval pass per test batch over every env and every counterfactual configuration;
//! writes each env's validation accuracy and loss, and each seed's contribution, velocity, interaction
//! terms and topology sums (kasmina §2.3, simic §3). An ablated slot's "epochs since counterfactual"
//! restarts at 0, and every positive pair interaction joins the env's scaffold ledger (simic §3.2).

use crate::host_resources::{Hosts, StepClock, TrainData};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    EnvIndex, HostMetrics, RewardConfig, ScaffoldLedger, SeedAlpha, SeedMetrics, SeedStage, SlotIndex,
    SlotTracking, Stage,
};
use esper_kernels::host::ValidationPlan;

/// The system's buffers, kept between steps so that a step allocates nothing.
#[derive(Default)]
pub struct ValidateScratch {
    /// `[slot][env]`: the seed is FOSSILIZED (not ablatable).
    fossilized: Vec<Vec<bool>>,
    /// `[slot][env]`: the seed's alpha.
    alphas: Vec<Vec<f64>>,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn validate(
    mut hosts: ResMut<Hosts>,
    data: Res<TrainData>,
    clock: Res<StepClock>,
    mut slots: Query<(&EnvIndex, &SlotIndex, &Stage, &SeedAlpha, &mut SeedMetrics, &mut SlotTracking)>,
    mut envs: Query<(&EnvIndex, &mut HostMetrics, &mut ScaffoldLedger)>,
    reward: Option<Res<RewardConfig>>,
    mut scratch: Local<ValidateScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Validate::validate");
    let ValidateScratch { fossilized, alphas } = &mut *scratch;
    let (n_envs, n_slots) = (hosts.n_envs(), hosts.slot_ids().len());
    fossilized.resize(n_slots, Vec::new());
    alphas.resize(n_slots, Vec::new());
    for k in 0..n_slots {
        fossilized[k].clear();
        fossilized[k].resize(n_envs, false);
        alphas[k].clear();
        alphas[k].resize(n_envs, 0.0);
    }
    for (env, index, stage, alpha, ..) in &slots {
        let (e, k) = (env.0 as usize, index.0 as usize);
        fossilized[k][e] = stage.current == SeedStage::Fossilized;
        alphas[k][e] = alpha.0;
    }
    let plan = ValidationPlan { fossilized, ablate_fossils: reward.is_some_and(|r| r.ablate_fossils()) };
    let results = hosts.validate(&data.dataset, &data.batcher, plan);
    for (env, mut metrics, mut ledger) in &mut envs {
        let e = env.0 as usize;
        let r = &results[e];
        metrics.val_accuracy = r.val_acc;
        metrics.val_loss = r.val_loss;
        let ablated = &r.slots;
        metrics.counterfactual_improvement = r.empty_acc.map(|empty| r.val_acc - empty);
        metrics.committed_val_accuracy = r.committed_acc.unwrap_or(r.val_acc);
        for &(i, j, interaction) in &r.interactions {
            ledger.record(ablated[i] as u8, ablated[j] as u8, interaction, clock.epoch as u32);
        }
    }
    for (env, index, stage, _, mut m, mut tracking) in &mut slots {
        let (e, k) = (env.0 as usize, index.0 as usize);
        let r = &results[e];
        // Only where a seed module is in the slot (the reference's `has_active_seed_in_slot`): a slot in
        // cooldown (PRUNED, EMBARGOED, RESETTING) keeps the interaction terms of its last pass, and the
        // observation shows them until the slot empties.
        if !stage.current.has_seed() {
            continue;
        }
        m.interaction_sum = 0.0;
        m.boost_received = 0.0;
        m.upstream_alpha_sum = 0.0;
        m.downstream_alpha_sum = 0.0;
        let Some(i) = r.slots.iter().position(|&s| s == k) else { continue };
        tracking.epochs_since_counterfactual = Some(0);
        let c = r.contribution[i];
        if let Some(prev) = m.counterfactual_contribution {
            m.contribution_velocity = 0.7 * m.contribution_velocity + 0.3 * (c - prev);
        }
        m.prev_contribution = m.counterfactual_contribution;
        m.counterfactual_contribution = Some(c);
        for &(a, b, interaction) in &r.interactions {
            if a == i || b == i {
                m.interaction_sum += interaction;
                m.boost_received = m.boost_received.max(interaction);
            }
        }
        // Canonical slot order is sorted slot-id order.
        for &other in &r.slots {
            if other < k {
                m.upstream_alpha_sum += alphas[other][e];
            } else if other > k {
                m.downstream_alpha_sum += alphas[other][e];
            }
        }
    }
    // On a device, the pass's device time goes into the span (the profile's device column).
    if let Some(report) = hosts.peek_device_report() {
        _span.record("device_us", report.validate_ms * 1e3);
        if let Some(run) = report.validation_run {
            _span.record("graph", tracing::field::display(run.name()));
        }
    }
}
