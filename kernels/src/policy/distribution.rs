//! The masked, floored categorical distribution of one action head (tamiyo §4.3, simic §4.3–4.4), in f32
//! as the reference computes it, for every head of the factored action:
//!
//! 1. masked logits: `z' = z` where the mask allows, `−1e4` elsewhere;
//! 2. probability floor `f` (per head): `p = softmax(z')`, `K` legal actions, `φ = min(f, 0.99/K)`; legal
//!    actions with `p < φ` get `φ`, the others share what is left in proportion to `p`
//!    (`scale = max(1 − U·φ, 1e-8) / max(Σ_over p, 1e-8)`), in one pass (rescaled entries are not checked
//!    again); back to logits `ln(max(q, 1e-8))` on the legal actions, `−1e4` elsewhere;
//! 3. log-probabilities `log_softmax(z')`, samples by inverse CDF from a uniform of our own streams (the
//!    draw of `torch.multinomial`, up to which uniform it consumes), argmax with the first index on ties;
//! 4. normalised entropy `−Σ_legal p·ln p / ln K`, exactly 0 when `K = 1`.
//!
//! The rollout samples from these; the PPO update recomputes the same numbers with autograd, and its
//! tests compare with these functions.

/// The logit of an action the mask forbids.
pub const MASKED_LOGIT: f32 = -1e4;

/// Per-head probability floors in `Head` order (slot, blueprint, style, tempo, alpha_target, alpha_speed,
/// alpha_curve, op): tamiyo §4.3's defaults.
pub const HEAD_FLOORS: [f32; 8] = [0.05, 0.12, 0.08, 0.12, 0.08, 0.06, 0.06, 0.15];

/// Step 1 and 2: the floored masked logits of `logits` under `mask` into `out` (same length). `floor`
/// ≤ 0 skips the floor. Panics when no action is legal (the reference raises).
///
/// Differs from the reference: a row of NaN logits (a diverged network) is not refused. Every `q` is
/// NaN and `max(q, 1e-8)` keeps 1e-8, so the legal actions come out equal (a uniform draw) and the
/// masked ones stay masked; the reference's `MaskedCategorical` raises on NaN/inf logits where its
/// validation is on (tamiyo §4.3). Here the PPO update's finiteness gate skips such an update and the
/// third in a row stops the run (simic §1.4.3, `ppo_update`).
pub fn floored_logits(logits: &[f32], mask: &[bool], floor: f32, out: &mut [f32]) {
    assert!(logits.len() == mask.len() && out.len() == mask.len(), "one logit and one mask entry per action");
    let legal = mask.iter().filter(|&&m| m).count();
    assert!(legal > 0, "a head with no legal action");
    for ((o, &z), &m) in out.iter_mut().zip(logits).zip(mask) {
        *o = if m { z } else { MASKED_LOGIT };
    }
    if floor <= 0.0 {
        return;
    }
    // p = softmax(z') over every entry (masked ones carry e^(−1e4 − max) = 0 in f32).
    let max = out.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = out.iter().map(|&z| (z - max).exp()).sum();
    let phi = floor.min(0.99 / legal as f32);
    let (mut under, mut over_mass) = (0usize, 0f32);
    for (&z, &m) in out.iter().zip(mask) {
        let p = (z - max).exp() / sum;
        if m && p < phi {
            under += 1;
        } else if m {
            over_mass += p;
        }
    }
    let scale = (1.0 - under as f32 * phi).max(1e-8) / over_mass.max(1e-8);
    for (o, &m) in out.iter_mut().zip(mask) {
        if !m {
            continue;
        }
        let p = (*o - max).exp() / sum;
        let q = if p < phi { phi } else { p * scale };
        *o = q.max(1e-8).ln();
    }
}

/// `max(z) + ln Σ e^(z − max)`: the shift that turns `z` into log-probabilities.
fn log_normalizer(z: &[f32]) -> f32 {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + z.iter().map(|&v| (v - max).exp()).sum::<f32>().ln()
}

/// `log_softmax(z)` into `out`.
pub fn log_softmax(z: &[f32], out: &mut [f32]) {
    let shift = log_normalizer(z);
    for (o, &v) in out.iter_mut().zip(z) {
        *o = v - shift;
    }
}

/// Normalised entropy of the distribution `softmax(z)` over the legal actions of `mask`:
/// `−Σ_legal p·ln p / ln K`, exactly 0 when one action is legal.
pub fn normalized_entropy(z: &[f32], mask: &[bool]) -> f32 {
    let legal = mask.iter().filter(|&&m| m).count();
    if legal <= 1 {
        return 0.0;
    }
    let shift = log_normalizer(z);
    let entropy: f32 = z
        .iter()
        .zip(mask)
        .filter(|(_, m)| **m)
        .map(|(&v, _)| {
            let log_p = v - shift;
            -log_p.exp() * log_p
        })
        .sum();
    entropy / (legal as f32).ln()
}

/// The action at which the cumulative probability of `softmax(z)` first exceeds `u` ∈ [0, 1). Actions
/// with probability 0 (masked: `e^(−1e4)` underflows) are never returned; rounding at the top end falls
/// back to the last action with positive probability.
pub fn sample(z: &[f32], u: f64) -> usize {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights = z.iter().map(|&v| ((v - max) as f64).exp());
    let total: f64 = weights.clone().sum();
    let target = u * total;
    let mut cumulative = 0.0;
    let mut last_positive = 0;
    for (i, w) in weights.enumerate() {
        if w <= 0.0 {
            continue;
        }
        cumulative += w;
        last_positive = i;
        if target < cumulative {
            return i;
        }
    }
    last_positive
}

/// The first index of the largest logit.
pub fn argmax(z: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in z.iter().enumerate() {
        if v > z[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, StreamKey};
    use proptest::prelude::*;

    fn probs(z: &[f32]) -> Vec<f32> {
        let mut lp = vec![0.0; z.len()];
        log_softmax(z, &mut lp);
        lp.iter().map(|l| l.exp()).collect()
    }

    /// Hand case: logits [0, ln 8, ln 1, masked] → p = [1/10, 8/10, 1/10, 0]; floor 0.15 with K = 3:
    /// φ = min(0.15, 0.33) = 0.15; under = {0, 2} (0.1 < 0.15), over = {1} with Σ 0.8;
    /// scale = (1 − 2·0.15)/0.8 = 0.875; q = [0.15, 0.7, 0.15, 0].
    #[test]
    fn floor_matches_the_spec_formula_on_a_hand_case() {
        let z = [0.0, 8f32.ln(), 0.0, 3.0];
        let mask = [true, true, true, false];
        let mut out = [0.0; 4];
        floored_logits(&z, &mask, 0.15, &mut out);
        let p = probs(&out);
        for (got, want) in p.iter().zip([0.15, 0.7, 0.15, 0.0]) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        assert_eq!(out[3], MASKED_LOGIT);
        // With K = 7 the floor is min(0.12, 0.99/7 = 0.1414) = 0.12; with K = 10 and floor 0.15 it is
        // 0.099: every legal action of a uniform head is above it and nothing changes.
        let z = [0.0f32; 10];
        let mut out = [0.0; 10];
        floored_logits(&z, &[true; 10], 0.15, &mut out);
        assert!(probs(&out).iter().all(|p| (p - 0.1).abs() < 1e-6));
    }

    /// The deviation named on `floored_logits`: with a floor, NaN logits give every legal action the
    /// same logit (ln 1e-8, a uniform draw) and leave the masked ones masked; without one (floor 0) the
    /// NaN passes through to the log-probabilities, where the update's finiteness gate sees it.
    #[test]
    fn nan_logits_floor_to_a_uniform_draw_over_the_legal_actions() {
        let z = [f32::NAN; 4];
        let mask = [true, false, true, true];
        let mut out = [0.0; 4];
        floored_logits(&z, &mask, 0.15, &mut out);
        assert_eq!(out, [1e-8f32.ln(), MASKED_LOGIT, 1e-8f32.ln(), 1e-8f32.ln()]);
        let p = probs(&out);
        assert!(
            p.iter().zip(&mask).all(|(&p, &m)| if m { (p - 1.0 / 3.0).abs() < 1e-6 } else { p == 0.0 }),
            "{p:?}"
        );
        floored_logits(&z, &mask, 0.0, &mut out);
        assert!(out[0].is_nan() && out[1] == MASKED_LOGIT);
    }

    /// Two entries under φ: p = [0.05, 0.25, 0.70], floor 0.3 (K = 3, φ = 0.3): under = {0, 1},
    /// over = {2}: scale = (1 − 0.6)/0.7, q = [0.3, 0.3, 0.4].
    #[test]
    fn floor_raises_every_entry_under_phi_and_rescales_the_rest() {
        let p = [0.05f32, 0.25, 0.70];
        let z: Vec<f32> = p.iter().map(|p| p.ln()).collect();
        let mut out = [0.0; 3];
        floored_logits(&z, &[true; 3], 0.3, &mut out);
        let q = probs(&out);
        for (got, want) in q.iter().zip([0.3, 0.3, 0.4]) {
            assert!((got - want).abs() < 1e-6, "{q:?}");
        }
    }

    #[test]
    fn entropy_is_normalised_and_zero_for_one_legal_action() {
        let mut out = [0.0; 4];
        floored_logits(&[1.0, 2.0, 3.0, 4.0], &[false, true, false, false], 0.1, &mut out);
        assert_eq!(normalized_entropy(&out, &[false, true, false, false]), 0.0);
        let mut lp = [0.0; 4];
        log_softmax(&out, &mut lp);
        assert_eq!(lp[1], 0.0, "the one legal action has log-prob exactly 0");
        // Uniform over 3 legal actions: entropy ln 3 / ln 3 = 1.
        let h = normalized_entropy(&[0.5, 0.5, 0.5, MASKED_LOGIT], &[true, true, true, false]);
        assert!((h - 1.0).abs() < 1e-6, "{h}");
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[MASKED_LOGIT, MASKED_LOGIT, 0.0]), 2);
    }

    /// Sampling follows the floored probabilities: 20,000 draws of a 4-way head within 1.5 % of each.
    #[test]
    fn samples_follow_the_floored_probabilities() {
        let mut out = [0.0; 5];
        floored_logits(&[2.0, 0.0, -1.0, 1.0, 5.0], &[true, true, true, true, false], 0.12, &mut out);
        let p = probs(&out);
        let mut s = StreamKey::new(1, 0, 0, Purpose::Test).stream(0);
        let mut counts = [0usize; 5];
        let n = 20_000;
        for _ in 0..n {
            counts[sample(&out, s.next_f64())] += 1;
        }
        assert_eq!(counts[4], 0);
        for (c, p) in counts.iter().zip(&p) {
            assert!((*c as f32 / n as f32 - p).abs() < 0.015, "{counts:?} vs {p:?}");
        }
    }

    proptest! {
        /// For random masks and logits: a sample (and the argmax) is always legal, the floored
        /// probabilities sum to 1, masked actions get 0, the entropy is in [0, 1], and a head with one
        /// legal action has entropy 0 and log-prob exactly 0.
        #[test]
        fn sampling_never_returns_a_masked_action(
            logits in prop::collection::vec(-30f32..30.0, 1..14),
            mask_bits in any::<u16>(),
            pick in 0usize..14,
            floor in prop::sample::select(vec![0.0f32, 0.05, 0.08, 0.12, 0.15]),
            u in 0f64..1.0,
        ) {
            let n = logits.len();
            let mut mask: Vec<bool> = (0..n).map(|i| mask_bits >> i & 1 == 1).collect();
            mask[pick % n] = true; // the reference raises on an empty mask
            let mut out = vec![0.0; n];
            floored_logits(&logits, &mask, floor, &mut out);
            let a = sample(&out, u);
            prop_assert!(mask[a], "sampled masked action {} of {:?}", a, mask);
            prop_assert!(mask[argmax(&out)]);
            let p = probs(&out);
            prop_assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-4);
            let legal = mask.iter().filter(|&&m| m).count();
            for (i, &pi) in p.iter().enumerate() {
                // A floored head gives every legal action a positive probability (raised to φ, or
                // rescaled from ≥ φ), a masked one exactly 0.
                prop_assert!(if mask[i] { floor == 0.0 || pi > 0.0 } else { pi == 0.0 }, "{:?}", p);
            }
            let h = normalized_entropy(&out, &mask);
            prop_assert!((-1e-5..=1.0 + 1e-5).contains(&h), "entropy {}", h);
            if legal == 1 {
                prop_assert!(h == 0.0);
                let mut lp = vec![0.0; n];
                log_softmax(&out, &mut lp);
                prop_assert!(lp[a] == 0.0, "one legal action: log-prob exactly 0, got {}", lp[a]);
            }
        }
    }
}
