//! Helpers shared by the lifecycle tests: actions built from typed heads and a one-env driver that
//! runs the RL loop's order (record accuracy → masks → op → tick) through the reference driver.
#![allow(dead_code)]

use esper_components::reference::ReferenceLifecycle;
use esper_components::*;

pub fn permissive() -> LifecycleConfig {
    LifecycleConfig::default()
}

pub fn strict() -> LifecycleConfig {
    LifecycleConfig { permissive_gates: false, ..LifecycleConfig::default() }
}

pub fn germinate(
    slot: u8,
    bp: BlueprintAction,
    style: GerminationStyle,
    tempo: TempoAction,
    target: AlphaTargetAction,
) -> FactoredAction {
    FactoredAction {
        slot,
        blueprint: bp as u8,
        style: style as u8,
        tempo: tempo as u8,
        alpha_target: target as u8,
        op: LifecycleOp::Germinate as u8,
        ..FactoredAction::wait()
    }
}

/// A standard germination: conv_light, SIGMOID_ADD, the given tempo, FULL target.
pub fn germinate_std(slot: u8, tempo: TempoAction) -> FactoredAction {
    germinate(slot, BlueprintAction::ConvLight, GerminationStyle::SigmoidAdd, tempo, AlphaTargetAction::Full)
}

pub fn op(op: LifecycleOp, slot: u8) -> FactoredAction {
    FactoredAction { slot, op: op as u8, ..FactoredAction::wait() }
}

pub fn prune(slot: u8, speed: AlphaSpeedAction, curve: AlphaCurveAction) -> FactoredAction {
    FactoredAction {
        slot,
        alpha_speed: speed as u8,
        alpha_curve: curve as u8,
        op: LifecycleOp::Prune as u8,
        ..FactoredAction::wait()
    }
}

pub fn retarget(
    slot: u8,
    style: GerminationStyle,
    target: AlphaTargetAction,
    speed: AlphaSpeedAction,
    curve: AlphaCurveAction,
) -> FactoredAction {
    FactoredAction {
        slot,
        style: style as u8,
        alpha_target: target as u8,
        alpha_speed: speed as u8,
        alpha_curve: curve as u8,
        op: LifecycleOp::SetAlphaTarget as u8,
        ..FactoredAction::wait()
    }
}

/// One env driven epoch by epoch in the RL loop's order.
pub struct OneEnv {
    pub world: ReferenceLifecycle,
    pub epoch: u32,
}

impl OneEnv {
    pub fn new(n_slots: usize, config: LifecycleConfig) -> Self {
        Self { world: ReferenceLifecycle::new(1, n_slots, config), epoch: 0 }
    }

    pub fn slot(&self, s: usize) -> &SlotState {
        &self.world.slots[s]
    }

    pub fn slot_mut(&mut self, s: usize) -> &mut SlotState {
        &mut self.world.slots[s]
    }

    pub fn stage(&self, s: usize) -> SeedStage {
        self.world.slots[s].stage.current
    }

    /// Masks as the policy would see them at this epoch's decision (after the record).
    pub fn masks_after_record(&self, acc: f64) -> ActionMasks {
        let mut w = self.world.clone();
        w.record(&[acc]);
        w.masks()[0]
    }

    /// One epoch: record `acc`, apply `action`, tick. Returns the op's outcome.
    pub fn epoch(&mut self, acc: f64, action: FactoredAction) -> OpOutcome {
        self.epoch += 1;
        self.world.epoch(&[acc], &[action]).1[0]
    }

    pub fn wait(&mut self, acc: f64) -> OpOutcome {
        self.epoch(acc, FactoredAction::wait())
    }

    /// Mark the slot's gradient health as measured and healthy (what gradient telemetry would write).
    pub fn healthy_gradients(&mut self, s: usize) {
        self.slot_mut(s).telemetry = GradientTelemetry {
            gradient_norm: Some(0.5),
            gradient_health: Some(1.0),
            has_vanishing: Some(false),
            has_exploding: Some(false),
        };
    }
}
