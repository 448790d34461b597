//! A slow, obviously-correct driver of the lifecycle: the pure functions applied env by env and slot by
//! slot, in the RL loop's order (record accuracy → masks → apply op → tick). The ECS systems must give
//! exactly the same per-slot state; tests and replays compare against it.

use crate::actions::FactoredAction;
use crate::config::LifecycleConfig;
use crate::handlers::{OpOutcome, apply_action, outcome_without_slot};
use crate::lifecycle::{TickOutcome, record_accuracy, step_epoch};
use crate::masks::{ActionMasks, MaskSeedInfo, compute_action_masks, count_seeds};
use crate::slot::SlotState;

/// What the mask sees of one slot (None = empty).
pub fn mask_info(slot: &SlotState) -> Option<MaskSeedInfo> {
    slot.stage.current.has_state().then_some(MaskSeedInfo {
        stage: slot.stage.current,
        seed_age_epochs: slot.counters.epochs_total,
        alpha_mode: slot.controller.mode,
    })
}

/// Masks of one env from its slots in canonical order.
pub fn env_masks(slots: &[SlotState], config: &LifecycleConfig) -> ActionMasks {
    let infos: Vec<Option<MaskSeedInfo>> = slots.iter().map(mask_info).collect();
    compute_action_masks(&infos, count_seeds(slots.iter().map(|s| s.stage.current)), &config.mask_params())
}

/// Every env's slots, `slots[e * n_slots + s]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceLifecycle {
    pub n_envs: usize,
    pub n_slots: usize,
    pub slots: Vec<SlotState>,
    pub config: LifecycleConfig,
}

impl ReferenceLifecycle {
    pub fn new(n_envs: usize, n_slots: usize, config: LifecycleConfig) -> Self {
        Self { n_envs, n_slots, slots: vec![SlotState::default(); n_envs * n_slots], config }
    }

    pub fn env(&self, e: usize) -> &[SlotState] {
        &self.slots[e * self.n_slots..(e + 1) * self.n_slots]
    }

    pub fn env_mut(&mut self, e: usize) -> &mut [SlotState] {
        &mut self.slots[e * self.n_slots..(e + 1) * self.n_slots]
    }

    /// `record_accuracy(val_accuracy[e])` on every slot of every env.
    pub fn record(&mut self, val_accuracy: &[f64]) {
        let n_slots = self.n_slots;
        for (env_slots, &acc) in self.slots.chunks_exact_mut(n_slots).zip(val_accuracy) {
            for slot in env_slots {
                record_accuracy(&mut slot.view(), acc);
            }
        }
    }

    pub fn masks(&self) -> Vec<ActionMasks> {
        (0..self.n_envs).map(|e| env_masks(self.env(e), &self.config)).collect()
    }

    /// Apply one action per env against `masks` (computed before any op of this step).
    pub fn apply(&mut self, actions: &[FactoredAction], masks: &[ActionMasks]) -> Vec<OpOutcome> {
        let config = self.config;
        (0..self.n_envs)
            .map(|e| {
                let a = actions[e];
                if let Some(outcome) = outcome_without_slot(&a, &masks[e]) {
                    return outcome;
                }
                let slot = &mut self.env_mut(e)[a.slot as usize]; // the mask bounds the slot index
                apply_action(&a, &masks[e], &mut slot.view(), &config)
            })
            .collect()
    }

    /// `step_epoch` on every slot.
    pub fn tick(&mut self) -> Vec<TickOutcome> {
        let config = self.config;
        self.slots.iter_mut().map(|s| step_epoch(&mut s.view(), &config)).collect()
    }

    /// One whole epoch in the RL loop's order; returns the masks the actions were checked against.
    pub fn epoch(
        &mut self,
        val_accuracy: &[f64],
        actions: &[FactoredAction],
    ) -> (Vec<ActionMasks>, Vec<OpOutcome>) {
        self.record(val_accuracy);
        let masks = self.masks();
        let outcomes = self.apply(actions, &masks);
        self.tick();
        (masks, outcomes)
    }
}
