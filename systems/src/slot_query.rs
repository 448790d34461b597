//! The query of a slot's whole lifecycle state, for the systems that run the lifecycle's pure functions
//! (germinate, prune, the tick), which may rewrite any of it — a RESETTING slot's completion writes
//! the empty default back into every component. Systems that touch less ask for less: the env row,
//! slot index, events and tracking are always named separately.

use bevy_ecs::query::QueryData;
use esper_components::{
    AlphaController, BlendStyle, Blueprint, GradientTelemetry, PendingPrune, SeedAlpha, SeedMetrics,
    SlotFlags, SlotMut, SlotState, Stage, StageCounters, Tempo,
};

#[derive(QueryData)]
#[query_data(mutable)]
pub struct SlotLifecycle {
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

impl SlotLifecycleItem<'_, '_> {
    /// Borrow the components for the pure functions of `esper_components::lifecycle`.
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
}

impl SlotLifecycleReadOnlyItem<'_, '_> {
    /// A copy of the slot's current values.
    pub fn state(&self) -> SlotState {
        SlotState {
            stage: *self.stage,
            counters: *self.counters,
            metrics: *self.metrics,
            telemetry: *self.telemetry,
            alpha: *self.alpha,
            controller: *self.controller,
            blend: *self.blend,
            tempo: *self.tempo,
            blueprint: *self.blueprint,
            pending_prune: *self.pending_prune,
            flags: *self.flags,
        }
    }
}
