//! The query every lifecycle system uses to borrow one slot's components as a [`SlotMut`].

use bevy_ecs::query::QueryData;
use esper_components::{
    AlphaController, BlendStyle, Blueprint, EnvIndex, GradientTelemetry, PendingPrune, SeedAlpha,
    SeedMetrics, SlotEvents, SlotFlags, SlotIndex, SlotMut, Stage, StageCounters, Tempo,
};

#[derive(QueryData)]
#[query_data(mutable)]
pub struct SlotQuery {
    pub env: &'static EnvIndex,
    pub index: &'static SlotIndex,
    pub events: &'static mut SlotEvents,
    pub stage: &'static mut Stage,
    pub counters: &'static mut StageCounters,
    pub metrics: &'static mut SeedMetrics,
    pub telemetry: &'static mut GradientTelemetry,
    pub alpha: &'static mut SeedAlpha,
    pub controller: &'static mut AlphaController,
    pub blend: &'static mut BlendStyle,
    pub tempo: &'static mut Tempo,
    pub blueprint: &'static mut Blueprint,
    pub pending_prune: &'static mut PendingPrune,
    pub flags: &'static mut SlotFlags,
}

impl SlotQueryItem<'_, '_> {
    /// Borrow the lifecycle components for the pure functions of `esper_components::lifecycle`.
    pub fn view(&mut self) -> SlotMut<'_> {
        SlotMut {
            stage: &mut self.stage,
            counters: &mut self.counters,
            metrics: &mut self.metrics,
            telemetry: &mut self.telemetry,
            alpha: &mut self.alpha,
            controller: &mut self.controller,
            blend: &mut self.blend,
            tempo: &mut self.tempo,
            blueprint: &mut self.blueprint,
            pending_prune: &mut self.pending_prune,
            flags: &mut self.flags,
        }
    }

    /// The env row and slot index this slot occupies in `[E, S]` batches.
    pub fn row(&self, n_slots: usize) -> usize {
        self.env.0 as usize * n_slots + self.index.0 as usize
    }
}
