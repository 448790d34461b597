//! Per-env components: the env's row in every batch, its host metrics and lifecycle bookkeeping.

use crate::actions::LifecycleOp;
use crate::handlers::OpOutcome;
use bevy_ecs::component::Component;
use serde::{Deserialize, Serialize};

/// The env's row in every batch (`[E, …]` buffers). Slot entities carry it too, so systems can scatter
/// a slot's values into `[E, S]` arrays without a lookup.
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EnvIndex(pub u32);

/// The env's latest validation result (accuracy in pp, 0–100).
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostMetrics {
    pub val_accuracy: f64,
    pub val_loss: f64,
    /// Mean of the epoch's batch-mean training losses.
    pub train_loss: f64,
    /// Training accuracy over the epoch's samples, in pp.
    pub train_accuracy: f64,
    /// `cf_imp` (simic §2.0): `val_accuracy − all_off_acc` (fallback: the lowest leave-one-out
    /// accuracy); None when nothing was ablated this epoch.
    pub counterfactual_improvement: Option<f64>,
    /// Accuracy with every non-fossilized seed at alpha 0 (= `val_accuracy` when there is none).
    pub committed_val_accuracy: f64,
}

/// Lifecycle counts over the episode and the last op's result.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleTally {
    pub germinated: u32,
    pub fossilized: u32,
    pub pruned: u32,
    pub failed_ops: u32,
    /// Governor rollbacks.
    pub rollbacks: u32,
    /// Mutations the governor's preflight refused.
    pub vetoed: u32,
    pub last_op: LifecycleOp,
    pub last_outcome: OpOutcome,
}

/// The env's last action as the next observation sees it (tamiyo §1.3): the raw sampled op and whether
/// its handler succeeded. A veto or refusal keeps the raw op with `success = false`; a governor rollback
/// writes WAIT with `success = false`. A new episode starts at (WAIT, true).
#[derive(Component, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastAction {
    pub op: LifecycleOp,
    pub success: bool,
}

impl Default for LastAction {
    fn default() -> Self {
        Self { op: LifecycleOp::Wait, success: true }
    }
}

/// Fossilizations this episode (simic §2.0): `fossilized` = n_fossil, `contributing` = n_contrib_fossil,
/// the fossils whose `total_improvement` was at least [`MIN_CONTRIBUTING_IMPROVEMENT`] pp when they
/// fossilized.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FossilCounters {
    pub fossilized: u32,
    pub contributing: u32,
}

/// `DEFAULT_MIN_FOSSILIZE_CONTRIBUTION`: a fossil "contributes" from 1.0 pp of total improvement (the
/// same constant as strict G5's threshold).
pub const MIN_CONTRIBUTING_IMPROVEMENT: f64 = crate::gates::MIN_FOSSILIZE_CONTRIBUTION;

/// Reward terms earned in one step and paid in the env's next reward (simic §2.9 steps 3–4), then reset.
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingRewardTerms {
    /// [`AUTO_PRUNE_PENALTY`] per seed the governor pruned, counted after the mechanical tick.
    pub auto_prune_penalty: f64,
    /// Scaffold hindsight credit from a successful FOSSILIZE.
    pub hindsight_credit: f64,
}

/// `auto_prune_penalty` (simic §2.10): per seed auto-pruned by the governor.
pub const AUTO_PRUNE_PENALTY: f64 = -0.2;

/// The env's episode so far as the reward saw it: Σ raw reward and the number of rewarded steps (a
/// rolled-back step has none), with a rollback's death penalty written in as the rollout buffer writes
/// it (simic §1.6: "telemetry episode reward is rewritten the same way").
#[derive(Component, Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeReturn {
    pub raw: f64,
    pub steps: u32,
    /// `raw` when the current stretch began (the episode's start, or the last rollback).
    pub stretch_start_raw: f64,
    /// Rewarded steps since then.
    pub stretch_steps: u32,
}

impl EpisodeReturn {
    /// One rewarded step.
    pub fn add(&mut self, raw: f64) {
        self.raw += raw;
        self.steps += 1;
        self.stretch_steps += 1;
    }

    /// The env rolled back: the stretch since the episode's start or the last rollback ends as the
    /// buffer ends it, its last reward `penalty` (raw −10) and the earlier ones 0; a stretch with no
    /// rewarded step drops the penalty (simic §1.6, as `RolloutBuffer::end_with_rollback`).
    pub fn end_with_rollback(&mut self, penalty: f64) {
        if self.stretch_steps > 0 {
            self.raw = self.stretch_start_raw + penalty;
        }
        self.stretch_start_raw = self.raw;
        self.stretch_steps = 0;
    }
}

/// One positive pair interaction as the scaffold ledger keeps it: `scaffold` boosted `beneficiary` by
/// `boost` pp at `epoch` (simic §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaffoldBoost {
    pub scaffold: u8,
    pub beneficiary: u8,
    pub boost: f64,
    pub epoch: u32,
}

/// `MAX_HINDSIGHT_CREDIT`: the cap of one fossilization's scaffold credit.
pub const MAX_HINDSIGHT_CREDIT: f64 = 0.2;
/// `HINDSIGHT_CREDIT_WEIGHT`.
pub const HINDSIGHT_CREDIT_WEIGHT: f64 = 0.1;
/// γ of PPO and PBRS (the reference raises if they differ).
pub const GAMMA: f64 = 0.995;

/// The env's scaffold ledger (simic §2.9 step 4, §3.2): every positive pair interaction of the episode,
/// appended by validation in both directions. A successful FOSSILIZE turns the entries that name the
/// fossil as beneficiary into hindsight credit and drops them. Reference behaviour kept: nothing else
/// removes entries before the episode ends — not a prune, not an emptied slot, not a germination — so
/// a new seed in a reused slot inherits the old entries.
///
/// The run reserves room for a whole episode ([`ScaffoldLedger::with_capacity`]) so that appending never
/// allocates mid-run.
#[derive(Component, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScaffoldLedger {
    pub entries: Vec<ScaffoldBoost>,
}

impl ScaffoldLedger {
    pub fn with_capacity(entries: usize) -> Self {
        Self { entries: Vec::with_capacity(entries) }
    }

    /// Entries one episode can append at most: every ordered pair of distinct slots per epoch (pairs
    /// are measured with 3 or 4 ablated seeds).
    pub fn episode_capacity(n_slots: usize, epochs: usize) -> usize {
        n_slots.min(4) * n_slots.min(4).saturating_sub(1) * epochs
    }

    /// Record a positive interaction between slots `a` and `b` at `epoch` (both directions); a
    /// non-positive one is not recorded.
    pub fn record(&mut self, a: u8, b: u8, interaction: f64, epoch: u32) {
        if interaction > 0.0 {
            self.entries.push(ScaffoldBoost { scaffold: a, beneficiary: b, boost: interaction, epoch });
            self.entries.push(ScaffoldBoost { scaffold: b, beneficiary: a, boost: interaction, epoch });
        }
    }

    /// The hindsight credit of `beneficiary` fossilizing at `epoch` with `total_improvement` (pp):
    /// `min(Σ 0.1·tanh(0.1·boost·improvement)·γ^(epoch − epoch_boost), 0.2)` over its entries, 0 unless
    /// the improvement is positive. The entries naming it as beneficiary are then dropped (its
    /// scaffolds have been paid).
    pub fn settle_fossilization(&mut self, beneficiary: u8, total_improvement: f64, epoch: u32) -> f64 {
        let mut credit = 0.0;
        if total_improvement > 0.0 {
            for b in self.entries.iter().filter(|b| b.beneficiary == beneficiary && b.boost > 0.0) {
                let delay = epoch.saturating_sub(b.epoch) as i32;
                credit +=
                    HINDSIGHT_CREDIT_WEIGHT * (b.boost * total_improvement * 0.1).tanh() * GAMMA.powi(delay);
            }
        }
        self.entries.retain(|b| b.beneficiary != beneficiary);
        credit.min(MAX_HINDSIGHT_CREDIT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hindsight credit by hand: one boost of 2 pp at epoch 10 for slot 1, fossilizing at epoch 12 with
    /// 3 pp of total improvement: 0.1·tanh(0.1·2·3)·0.995² = 0.1·0.5370496·0.990025 = 0.0531692…
    #[test]
    fn hindsight_credit_hand_example_and_cap() {
        let mut ledger = ScaffoldLedger::with_capacity(8);
        ledger.record(0, 1, 2.0, 10);
        ledger.record(0, 2, -1.0, 10); // not positive: not recorded
        assert_eq!(ledger.entries.len(), 2);
        let credit = ledger.settle_fossilization(1, 3.0, 12);
        assert!((credit - 0.053_169_2).abs() < 1e-6, "{credit}");
        // Only the entry naming slot 1 as beneficiary is gone; slot 0's boost by slot 1 stays.
        assert_eq!(
            ledger.entries,
            vec![ScaffoldBoost { scaffold: 1, beneficiary: 0, boost: 2.0, epoch: 10 }]
        );
        // No improvement, no credit (the entries are still settled).
        assert_eq!(ledger.settle_fossilization(0, 0.0, 12), 0.0);
        assert!(ledger.entries.is_empty());
        // Many large boosts: capped at 0.2.
        for t in 0..10 {
            ledger.record(0, 1, 10.0, t);
        }
        assert_eq!(ledger.settle_fossilization(1, 10.0, 10), MAX_HINDSIGHT_CREDIT);
    }

    /// simic §1.6 for the telemetry return: a rollback rewrites the stretch since the last one to a
    /// single −10 (its earlier rewards to 0); a rollback with no rewarded step since drops the penalty.
    #[test]
    fn a_rollback_rewrites_the_return_of_its_stretch() {
        let mut r = EpisodeReturn::default();
        r.end_with_rollback(-10.0); // first step: nothing to put it on
        assert_eq!((r.raw, r.steps), (0.0, 0));
        r.add(0.5);
        r.add(0.25);
        r.end_with_rollback(-10.0);
        assert_eq!((r.raw, r.steps), (-10.0, 2));
        r.end_with_rollback(-10.0); // two in a row: the second has no step of its own
        assert_eq!(r.raw, -10.0);
        r.add(1.0);
        r.add(2.0);
        assert_eq!((r.raw, r.steps), (-7.0, 4));
        r.end_with_rollback(-10.0);
        assert_eq!(r.raw, -20.0);
    }
}
