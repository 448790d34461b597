//! Decide (heuristic policy): each env's heuristic Tamiyo reads its signals and slot reports and writes
//! its factored action into the batch; the action then goes through the masks like any policy's.

use crate::resources::ActionBatch;
use crate::update_signals::{EnvSignals, SlotReports};
use bevy_ecs::prelude::*;
use esper_components::heuristic::{HeuristicConfig, HeuristicState};
use esper_components::{EnvIndex, FactoredAction, SlotConfig};

pub fn decide_heuristic(
    mut envs: Query<(&EnvIndex, &EnvSignals, &mut HeuristicState)>,
    reports: Res<SlotReports>,
    config: Res<HeuristicConfig>,
    slot_config: Res<SlotConfig>,
    mut actions: ResMut<ActionBatch>,
) {
    let n_slots = slot_config.len();
    for (env, signals, mut state) in &mut envs {
        let e = env.0 as usize;
        let action = match &signals.0 {
            Some(signals) => state.decide(&config, signals, reports.env(e, n_slots)).action,
            None => FactoredAction::wait(),
        };
        actions.set(e, action);
    }
}
