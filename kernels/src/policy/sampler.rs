//! Turning one env's head logits into a factored action (tamiyo §4.4, simic §4.3): the op first, from
//! its masked, floored distribution; then every other head with a mask conditioned on that op
//! (canonicalisation, tamiyo §2.2): a head the op does not consume is collapsed to its one placeholder
//! (so its log-prob is exactly 0 and its entropy 0), the slot head uses the op's slot row (collapsed to
//! its first legal slot for WAIT). Heads are drawn in the reference's order — op, style, slot,
//! blueprint, tempo, alpha_target, alpha_speed, alpha_curve — each from its own uniform.
//!
//! The update recomputes log-probs of stored actions with the same masks ([`head_mask`]).

use esper_components::{ActionMasks, FactoredAction, Head, LifecycleOp, relevant_heads};

use super::distribution::{HEAD_FLOORS, argmax, floored_logits, log_softmax, normalized_entropy, sample};

/// The order heads are drawn in (the op first).
pub const DRAW_ORDER: [Head; 8] = [
    Head::Op,
    Head::Style,
    Head::Slot,
    Head::Blueprint,
    Head::Tempo,
    Head::AlphaTarget,
    Head::AlphaSpeed,
    Head::AlphaCurve,
];

/// The mask head `head` is drawn with once the op is `op`, into `out` (`head.size(n_slots)` long).
pub fn head_mask(masks: &ActionMasks, head: Head, op: LifecycleOp, out: &mut [bool]) {
    let relevant = relevant_heads(op)[head as usize];
    match head {
        Head::Op => out.copy_from_slice(&masks.op),
        Head::Slot => {
            let row = masks.slots_for_op(op);
            out.copy_from_slice(row);
            if !relevant {
                // WAIT: the first slot the row allows (the first enabled slot).
                let first = row.iter().position(|&b| b).unwrap_or(0);
                out.iter_mut().enumerate().for_each(|(i, b)| *b = i == first);
            }
        }
        _ if relevant => out.copy_from_slice(masks.head(head)),
        _ => {
            let placeholder = head.placeholder().expect("every head but slot and op has one") as usize;
            out.iter_mut().enumerate().for_each(|(i, b)| *b = i == placeholder);
        }
    }
}

/// One env's draw: the action and, per head in `Head` order, its log-prob and normalised entropy
/// under the floored, canonicalised distribution it was drawn from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Draw {
    pub action: FactoredAction,
    pub log_probs: [f32; 8],
    pub entropies: [f32; 8],
}

/// Scratch for [`draw`]: one row of floored logits, log-probs and mask per head.
#[derive(Clone, Debug, Default)]
pub struct DrawScratch {
    floored: Vec<f32>,
    log_probs: Vec<f32>,
    mask: Vec<bool>,
}

/// Draws env's action from `logits` (per head in `Head` order, each `head.size(n_slots)` long).
/// `uniforms[h]` (∈ [0, 1), `Head` order) drives head `h`; `deterministic` takes the argmax instead
/// (the bootstrap at truncation).
pub fn draw(
    logits: [&[f32]; 8],
    masks: &ActionMasks,
    uniforms: [f64; 8],
    deterministic: bool,
    scratch: &mut DrawScratch,
) -> Draw {
    let mut out = Draw::default();
    let mut op = LifecycleOp::Wait;
    for head in DRAW_ORDER {
        let h = head as usize;
        let z = logits[h];
        let DrawScratch { floored, log_probs, mask } = scratch;
        floored.resize(z.len(), 0.0);
        log_probs.resize(z.len(), 0.0);
        mask.resize(z.len(), false);
        head_mask(masks, head, op, mask);
        floored_logits(z, mask, HEAD_FLOORS[h], floored);
        let index = if deterministic { argmax(floored) } else { sample(floored, uniforms[h]) };
        log_softmax(floored, log_probs);
        out.log_probs[h] = log_probs[index];
        out.entropies[h] = normalized_entropy(floored, mask);
        out.action.set_head(head, index as u8);
        if head == Head::Op {
            op = LifecycleOp::from_index(index as u8).expect("the op head has one logit per op");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, StreamKey};
    use esper_components::masks::{MaskParams, MaskSeedInfo, compute_action_masks};
    use esper_components::{AlphaMode, SeedStage, Topology};
    use proptest::prelude::*;

    fn sizes(n_slots: usize) -> [usize; 8] {
        Head::ALL.map(|h| h.size(n_slots))
    }

    fn logits_from(seed: u64, n_slots: usize) -> Vec<Vec<f32>> {
        let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
        sizes(n_slots).iter().map(|&n| (0..n).map(|_| s.uniform(-4.0, 4.0) as f32).collect()).collect()
    }

    /// Slot states from random bits: empty, or a seed at any stage, age and alpha mode.
    fn masks_from(bits: u64, n_slots: usize) -> ActionMasks {
        let slots: Vec<Option<MaskSeedInfo>> = (0..n_slots)
            .map(|k| {
                let b = (bits >> (8 * k)) & 0xFF;
                let stage = SeedStage::ALL[(b % 10) as usize];
                (!b.is_multiple_of(3) && stage.has_seed()).then(|| MaskSeedInfo {
                    stage,
                    seed_age_epochs: (b / 10) as u32 % 12,
                    alpha_mode: [AlphaMode::Hold, AlphaMode::Up, AlphaMode::Down][(b % 3) as usize],
                })
            })
            .collect();
        let params = MaskParams {
            topology: Topology::Cnn,
            max_seeds: (bits >> 40) as u32 % 4,
            allow_governor_override: false,
            disable_advance: false,
        };
        let seeds = slots.iter().filter(|s| s.is_some()).count() as u32;
        compute_action_masks(&slots, seeds, &params)
    }

    proptest! {
        /// For random logits, slot states and uniforms: the action is always one the masks allow, every
        /// head the op does not consume sits at its placeholder with log-prob exactly 0 and entropy 0,
        /// and the deterministic draw is legal too.
        #[test]
        fn a_draw_is_always_legal_and_irrelevant_heads_cost_nothing(
            seed in any::<u64>(), bits in any::<u64>(), n_slots in 1usize..4, u in any::<[u16; 8]>(),
            deterministic in any::<bool>(),
        ) {
            let logits = logits_from(seed, n_slots);
            let masks = masks_from(bits, n_slots);
            let uniforms = u.map(|v| v as f64 / 65_536.0);
            let rows: [&[f32]; 8] = std::array::from_fn(|h| logits[h].as_slice());
            let d = draw(rows, &masks, uniforms, deterministic, &mut DrawScratch::default());
            prop_assert!(masks.allows(&d.action), "{:?} not allowed by {:?}", d.action, masks);
            let op = LifecycleOp::from_index(d.action.op).unwrap();
            let relevant = relevant_heads(op);
            for head in Head::ALL {
                let h = head as usize;
                prop_assert!(d.log_probs[h] <= 0.0 && (0.0..=1.0 + 1e-5).contains(&d.entropies[h]));
                if !relevant[h] {
                    prop_assert_eq!(d.log_probs[h], 0.0, "{:?} log-prob", head);
                    prop_assert_eq!(d.entropies[h], 0.0);
                    if let Some(p) = head.placeholder() {
                        prop_assert_eq!(d.action.head(head), p);
                    }
                }
            }
        }
    }

    /// The op's log-prob is the floored distribution's: recomputed by hand from the op logits.
    #[test]
    fn the_op_log_prob_is_that_of_the_floored_op_distribution() {
        let logits = logits_from(3, 3);
        let masks = masks_from(0, 3); // every slot empty: WAIT and GERMINATE legal
        let rows: [&[f32]; 8] = std::array::from_fn(|h| logits[h].as_slice());
        let d = draw(rows, &masks, [0.3; 8], false, &mut DrawScratch::default());
        let mut floored = vec![0.0; 6];
        floored_logits(&logits[Head::Op as usize], &masks.op, 0.15, &mut floored);
        let mut lp = vec![0.0; 6];
        log_softmax(&floored, &mut lp);
        assert_eq!(d.log_probs[Head::Op as usize], lp[d.action.op as usize]);
        let legal = masks.op.iter().filter(|&&b| b).count();
        assert!(legal >= 2, "{masks:?}");
    }
}
