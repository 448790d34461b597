//! Act (after the handlers): the loop's per-env bookkeeping of the action just taken (simic §1.3
//! D.6–D.7, tamiyo §1.3), for every env that did not roll back:
//! * `LastAction` = the raw sampled op and whether its handler succeeded (a veto or refusal: the raw
//!   op with `success = false`);
//! * a germination records `acc_at_germination` (this step's validation accuracy) and drops the slot's
//!   observation tracking;
//! * a germination zeroes the slot's escrow credit;
//! * a fossilization bumps the fossil counters (contributing from 1.0 pp of total improvement), turns
//!   the scaffold ledger's boosts of the fossil into pending hindsight credit, drops
//!   `acc_at_germination`, and keeps the BASIC_PLUS drip its FOSSILIZE reward earned (a drip is paid
//!   from the next step on, only for a fossilization that succeeded);
//! * every slot that held a state before the action (the pre-action reports) stores its measured
//!   gradient health as the previous one and ages its "epochs since counterfactual" (created at 0).
//!
//! A rolled-back env only gets `LastAction = (WAIT, false)`: the reference's rollback branch ends the
//! env's transaction before any of the rest (tamiyo §6.7).

use crate::host_resources::StepClock;
use crate::resources::{ActionBatch, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use crate::update_signals::SlotReports;
use bevy_ecs::prelude::*;
use esper_components::{
    EnvIndex, FossilCounters, GradientTelemetry, HostMetrics, LastAction, LifecycleOp,
    MIN_CONTRIBUTING_IMPROVEMENT, OpOutcome, PendingRewardTerms, ScaffoldLedger, SeedMetrics, SlotConfig,
    SlotEvents, SlotIndex, SlotRewardState, SlotTracking,
};

/// What the slot pass hands the env pass: `[E]` columns.
#[derive(Default)]
pub struct TrackScratch {
    val_accuracy: Vec<f64>,
    /// The slot that fossilized this step and its total improvement.
    fossilized: Vec<Option<(u8, f64)>>,
}

type EnvBooks<'a> = (
    &'a EnvIndex,
    &'a HostMetrics,
    &'a mut LastAction,
    &'a mut FossilCounters,
    &'a mut PendingRewardTerms,
    &'a mut ScaffoldLedger,
);

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn track_actions(
    mut envs: Query<EnvBooks>,
    mut slots: Query<(
        &EnvIndex,
        &SlotIndex,
        &SlotEvents,
        &SeedMetrics,
        &GradientTelemetry,
        &mut SlotTracking,
        &mut SlotRewardState,
    )>,
    actions: Res<ActionBatch>,
    outcomes: Res<OpOutcomes>,
    reports: Res<SlotReports>,
    slot_config: Res<SlotConfig>,
    clock: Res<StepClock>,
    n_envs: Res<EnvCount>,
    mut scratch: Local<TrackScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Act::track_actions");
    let n_slots = slot_config.len();
    let TrackScratch { val_accuracy, fossilized } = &mut *scratch;
    val_accuracy.resize(n_envs.0, 0.0);
    fossilized.clear();
    fossilized.resize(n_envs.0, None);
    for (env, metrics, ..) in &envs {
        val_accuracy[env.0 as usize] = metrics.val_accuracy;
    }
    for (env, index, events, metrics, telemetry, mut tracking, mut reward) in &mut slots {
        let e = env.0 as usize;
        if outcomes.rolled_back(e) {
            continue;
        }
        if events.germinated {
            *tracking = SlotTracking { acc_at_germination: Some(val_accuracy[e]), ..SlotTracking::default() };
            reward.escrow_credit = 0.0;
        }
        if events.fossilized {
            if let Some(drip) = reward.proposed_drip.take() {
                reward.drip_scale = Some(drip);
            }
            fossilized[e] = Some((index.0, metrics.total_improvement()));
            tracking.acc_at_germination = None;
        }
        let present_before = reports.0[e * n_slots + index.0 as usize].stage.has_state();
        if present_before {
            if let Some(health) = telemetry.gradient_health.filter(|h| h.is_finite()) {
                tracking.gradient_health_prev = Some(health);
            }
            tracking.epochs_since_counterfactual =
                Some(tracking.epochs_since_counterfactual.map_or(0, |n| n + 1));
        }
    }
    for (env, _, mut last, mut counters, mut pending, mut ledger) in &mut envs {
        let e = env.0 as usize;
        let outcome = outcomes.0[e];
        if outcome == OpOutcome::RolledBack {
            *last = LastAction { op: LifecycleOp::Wait, success: false };
            continue;
        }
        let sampled = LifecycleOp::from_index(actions.head(esper_components::Head::Op)[e]);
        *last =
            LastAction { op: sampled.unwrap_or(LifecycleOp::Wait), success: outcome == OpOutcome::Executed };
        if let Some((slot, improvement)) = fossilized[e] {
            counters.fossilized += 1;
            counters.contributing += u32::from(improvement >= MIN_CONTRIBUTING_IMPROVEMENT);
            let credit = ledger.settle_fossilization(slot, improvement, clock.epoch as u32);
            if credit > 0.0 {
                pending.hindsight_credit += credit;
            }
        }
    }
}
