//! Action masks for the eight heads (spec tamiyo §3): what a policy may sample for one env, given the
//! state of its enabled slots. The op mask is "optimistic" (legal if ANY slot supports the op) and the
//! op-conditioned `slot_by_op` row restricts which slot may be chosen for it.

use crate::actions::{
    AlphaCurveAction, AlphaSpeedAction, AlphaTargetAction, BlueprintAction, FactoredAction, GerminationStyle,
    Head, LifecycleOp, TempoAction, Topology, relevant_heads,
};
use crate::alpha::AlphaMode;
use crate::lifecycle::MIN_PRUNE_AGE;
use crate::slot_id::MAX_SLOTS;
use crate::stage::SeedStage;

/// What the mask needs to know about one occupied slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskSeedInfo {
    pub stage: SeedStage,
    /// `metrics.epochs_total`.
    pub seed_age_epochs: u32,
    pub alpha_mode: AlphaMode,
}

/// Env-wide inputs of the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskParams {
    pub topology: Topology,
    /// 0 = unlimited.
    pub max_seeds: u32,
    pub allow_governor_override: bool,
    /// True only when G1, G2 and G3 all auto-forward.
    pub disable_advance: bool,
}

/// Boolean masks of every head for one env. Slot rows hold `n_slots` meaningful entries. (`Default`,
/// everything illegal, is only a placeholder for storage that is overwritten before it is read.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActionMasks {
    pub n_slots: u8,
    pub slot: [bool; MAX_SLOTS],
    pub slot_by_op: [[bool; MAX_SLOTS]; LifecycleOp::COUNT],
    pub blueprint: [bool; BlueprintAction::COUNT],
    pub style: [bool; GerminationStyle::COUNT],
    pub tempo: [bool; TempoAction::COUNT],
    pub alpha_target: [bool; AlphaTargetAction::COUNT],
    pub alpha_speed: [bool; AlphaSpeedAction::COUNT],
    pub alpha_curve: [bool; AlphaCurveAction::COUNT],
    pub op: [bool; LifecycleOp::COUNT],
}

/// Seeds that count against `max_seeds`: live seeds GERMINATED..HOLDING plus FOSSILIZED ones.
pub fn count_seeds(stages: impl IntoIterator<Item = SeedStage>) -> u32 {
    stages.into_iter().filter(|s| s.has_seed()).count() as u32
}

/// `compute_action_masks` for one env. `slots[i]` is None for an empty enabled slot, in canonical order.
pub fn compute_action_masks(
    slots: &[Option<MaskSeedInfo>],
    total_seeds: u32,
    params: &MaskParams,
) -> ActionMasks {
    assert!(
        !slots.is_empty() && slots.len() <= MAX_SLOTS,
        "mask needs 1..={MAX_SLOTS} enabled slots, got {}",
        slots.len()
    );
    let n = slots.len();
    let mut m = ActionMasks {
        n_slots: n as u8,
        slot: [false; MAX_SLOTS],
        slot_by_op: [[false; MAX_SLOTS]; LifecycleOp::COUNT],
        blueprint: [false; BlueprintAction::COUNT],
        style: [false; GerminationStyle::COUNT],
        tempo: [true; TempoAction::COUNT],
        alpha_target: [false; AlphaTargetAction::COUNT],
        alpha_speed: [true; AlphaSpeedAction::COUNT],
        alpha_curve: [true; AlphaCurveAction::COUNT],
        op: [false; LifecycleOp::COUNT],
    };
    const WAIT: usize = LifecycleOp::Wait as usize;
    const GERMINATE: usize = LifecycleOp::Germinate as usize;
    const RETARGET: usize = LifecycleOp::SetAlphaTarget as usize;
    const PRUNE: usize = LifecycleOp::Prune as usize;
    const FOSSILIZE: usize = LifecycleOp::Fossilize as usize;
    const ADVANCE: usize = LifecycleOp::Advance as usize;

    m.slot[..n].fill(true);
    m.slot_by_op[WAIT] = m.slot;
    m.op[WAIT] = true;

    let any_empty = slots.iter().any(Option::is_none);
    let any_developing = slots.iter().flatten().any(|s| s.stage.is_developing());
    let at_capacity = params.max_seeds > 0 && total_seeds >= params.max_seeds;
    let germinate_legal = any_empty && !at_capacity && !any_developing;
    if germinate_legal {
        m.op[GERMINATE] = true;
        for (i, s) in slots.iter().enumerate() {
            m.slot_by_op[GERMINATE][i] = s.is_none();
        }
    }

    let mut retargetable = false;
    for (i, info) in slots.iter().enumerate() {
        let Some(info) = info else { continue };
        let at_rest = info.alpha_mode == AlphaMode::Hold;
        let advance = matches!(info.stage, SeedStage::Germinated | SeedStage::Training | SeedStage::Blending)
            && !params.disable_advance;
        let fossilize = info.stage == SeedStage::Holding;
        let prune = info.stage.is_prunable()
            && info.seed_age_epochs >= MIN_PRUNE_AGE
            && (at_rest || params.allow_governor_override);
        let retarget = matches!(info.stage, SeedStage::Blending | SeedStage::Holding) && at_rest;
        for (op, legal) in [(ADVANCE, advance), (FOSSILIZE, fossilize), (PRUNE, prune), (RETARGET, retarget)]
        {
            if legal {
                m.op[op] = true;
                m.slot_by_op[op][i] = true;
            }
        }
        retargetable |= retarget;
    }

    for bp in BlueprintAction::ALL {
        m.blueprint[bp as usize] = bp != BlueprintAction::Noop && bp.in_topology(params.topology);
    }
    if germinate_legal || retargetable {
        m.style = [true; GerminationStyle::COUNT];
        m.alpha_target = [true; AlphaTargetAction::COUNT];
    } else {
        m.style[GerminationStyle::SigmoidAdd as usize] = true;
        m.alpha_target[AlphaTargetAction::Full as usize] = true;
    }
    m
}

impl ActionMasks {
    /// The mask of one head (the slot head is cut to the enabled slots).
    pub fn head(&self, head: Head) -> &[bool] {
        match head {
            Head::Slot => &self.slot[..self.n_slots as usize],
            Head::Blueprint => &self.blueprint,
            Head::Style => &self.style,
            Head::Tempo => &self.tempo,
            Head::AlphaTarget => &self.alpha_target,
            Head::AlphaSpeed => &self.alpha_speed,
            Head::AlphaCurve => &self.alpha_curve,
            Head::Op => &self.op,
        }
    }

    /// The slot row conditioned on `op`.
    pub fn slots_for_op(&self, op: LifecycleOp) -> &[bool] {
        &self.slot_by_op[op as usize][..self.n_slots as usize]
    }

    /// Could a masked sampler have produced `action`? The op must be legal, its slot legal for that op,
    /// and every head the op consumes legal (irrelevant heads are ignored). Out-of-range indices are
    /// simply not allowed.
    pub fn allows(&self, action: &FactoredAction) -> bool {
        let Some(op) = LifecycleOp::from_index(action.op) else {
            return false;
        };
        if !self.op[op as usize] {
            return false;
        }
        let relevant = relevant_heads(op);
        Head::ALL.iter().all(|&head| {
            if !relevant[head as usize] {
                return true;
            }
            let row = if head == Head::Slot { self.slots_for_op(op) } else { self.head(head) };
            row.get(action.head(head) as usize).copied().unwrap_or(false)
        })
    }

    /// Only one legal op and it is WAIT (a "forced step").
    pub fn is_forced_wait(&self) -> bool {
        self.op.iter().filter(|&&b| b).count() == 1 && self.op[LifecycleOp::Wait as usize]
    }

    /// Per head (`Head` order): some legal op makes it relevant (simic §4.3's availability, what the
    /// PPO update's entropy floor averages over).
    pub fn available_heads(&self) -> [bool; Head::COUNT] {
        let mut available = [false; Head::COUNT];
        for op in LifecycleOp::ALL.into_iter().filter(|&op| self.op[op as usize]) {
            let relevant = relevant_heads(op);
            available.iter_mut().zip(relevant).for_each(|(a, r)| *a |= r);
        }
        available
    }
}

/// Draw a legal action uniformly per head: the op among legal ops, the slot among the slots legal for
/// that op, every other head among its legal values (irrelevant heads too, as a masked sampler would).
/// `below(n)` must return a uniform index in `0..n`; the caller owns the random stream.
pub fn sample_masked(masks: &ActionMasks, mut below: impl FnMut(usize) -> usize) -> FactoredAction {
    let mut pick = |row: &[bool]| -> u8 {
        let legal = row.iter().filter(|&&b| b).count();
        let mut k = below(legal.max(1));
        for (i, &ok) in row.iter().enumerate() {
            if ok {
                if k == 0 {
                    return i as u8;
                }
                k -= 1;
            }
        }
        0
    };
    let op = pick(&masks.op);
    let slot_row = masks.slots_for_op(LifecycleOp::from_index(op).unwrap_or(LifecycleOp::Wait));
    FactoredAction {
        slot: pick(slot_row),
        blueprint: pick(&masks.blueprint),
        style: pick(&masks.style),
        tempo: pick(&masks.tempo),
        alpha_target: pick(&masks.alpha_target),
        alpha_speed: pick(&masks.alpha_speed),
        alpha_curve: pick(&masks.alpha_curve),
        op,
    }
}
