//! Generalised advantage estimation per env row of the rollout buffer (simic §4.7), on the raw value scale.
//!
//! For the last valid step `t_L` of a row: `next_V = bootstrap[t_L]` if the row was truncated there, else
//! 0; `nnt = 1` if truncated, else `1 − done`. For earlier steps: `next_V = V[t+1]`,
//! `nnt = 1 − (done[t] ∧ ¬truncated[t])` — a rollback ends the env's episode at its row (done, not
//! truncated) and cuts the estimate there. Then, backwards:
//!
//! ```text
//! δ_t = r_t + γ·next_V·nnt − V_t
//! gae = δ_t + γλ·nnt·gae
//! A_t = gae,  R_t = A_t + V_t
//! ```

/// One row's inputs, `len` valid steps each.
#[derive(Clone, Copy, Debug)]
pub struct GaeRow<'a> {
    /// Rewards (the normalised reward; a death penalty as it was stored).
    pub rewards: &'a [f32],
    /// V(s_t), de-normalised to the raw scale.
    pub values: &'a [f32],
    /// V of the state after step t, de-normalised; read at a truncated last step only.
    pub bootstrap: &'a [f32],
    pub done: &'a [bool],
    pub truncated: &'a [bool],
}

/// Advantages, returns and TD errors of `row`'s first `len` steps into the first `len` entries of the
/// outputs (the rest are left alone).
pub fn gae_row(
    row: GaeRow,
    len: usize,
    gamma: f32,
    lambda: f32,
    advantages: &mut [f32],
    returns: &mut [f32],
    td: &mut [f32],
) {
    let mut gae = 0f32;
    for t in (0..len).rev() {
        let (next_value, nnt) = if t + 1 == len {
            if row.truncated[t] {
                (row.bootstrap[t], 1.0)
            } else {
                (0.0, if row.done[t] { 0.0 } else { 1.0 })
            }
        } else {
            (row.values[t + 1], if row.done[t] && !row.truncated[t] { 0.0 } else { 1.0 })
        };
        let delta = row.rewards[t] + gamma * next_value * nnt - row.values[t];
        gae = delta + gamma * lambda * nnt * gae;
        advantages[t] = gae;
        returns[t] = gae + row.values[t];
        td[t] = delta;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, StreamKey};

    /// Hand-computed: 5 steps, γ = 0.5, λ = 0.5 (γλ = 0.25); a rollback ends the episode at t = 1 (done,
    /// not truncated), and the row is truncated at t = 4 with a bootstrap of 8.
    ///
    /// ```text
    /// t  r   V   next_V·nnt      δ                  A
    /// 4  1   2   0.5·8 = 4    1 + 4 − 2 = 3        3
    /// 3  0   4   0.5·2 = 1    0 + 1 − 4 = −3       −3 + 0.25·3 = −2.25
    /// 2  2   0   0.5·4 = 2    2 + 2 − 0 = 4        4 + 0.25·(−2.25) = 3.4375
    /// 1  −10 1   0 (cut)      −10 − 1 = −11        −11 (nothing carried past the cut)
    /// 0  1   2   0.5·1 = 0.5  1 + 0.5 − 2 = −0.5   −0.5 + 0.25·(−11) = −3.25
    /// ```
    #[test]
    fn gae_matches_a_hand_computed_row_with_a_rollback_and_a_truncation() {
        let row = GaeRow {
            rewards: &[1.0, -10.0, 2.0, 0.0, 1.0],
            values: &[2.0, 1.0, 0.0, 4.0, 2.0],
            bootstrap: &[99.0, 99.0, 99.0, 99.0, 8.0],
            done: &[false, true, false, false, true],
            truncated: &[false, false, false, false, true],
        };
        let (mut a, mut r, mut td) = ([0f32; 6], [0f32; 6], [7f32; 6]);
        gae_row(row, 5, 0.5, 0.5, &mut a, &mut r, &mut td);
        assert_eq!(a[..5], [-3.25, -11.0, 3.4375, -2.25, 3.0]);
        assert_eq!(td[..5], [-0.5, -11.0, 4.0, -3.0, 3.0]);
        assert_eq!(r[..5], [-1.25, -10.0, 3.4375, 1.75, 5.0]);
        assert_eq!(td[5], 7.0, "past len nothing is written");
        // A row whose last valid step is a rollback (done, not truncated): nothing is bootstrapped.
        let (mut a, mut r, mut td) = ([0f32; 2], [0f32; 2], [0f32; 2]);
        gae_row(row, 2, 0.5, 0.5, &mut a, &mut r, &mut td);
        assert_eq!(a, [-3.25, -11.0]);
    }

    /// The direct sum `A_t = Σ_k (γλ)^k·δ_{t+k}`, stopped after a step whose `nnt` is 0 — a slow,
    /// independent reading of the same definition.
    fn slow_gae(row: GaeRow, len: usize, gamma: f64, lambda: f64) -> Vec<f64> {
        let nnt = |t: usize| -> f64 {
            if t + 1 == len {
                if row.truncated[t] || !row.done[t] { 1.0 } else { 0.0 }
            } else if row.done[t] && !row.truncated[t] {
                0.0
            } else {
                1.0
            }
        };
        let delta = |t: usize| -> f64 {
            let next = if t + 1 == len {
                if row.truncated[t] { row.bootstrap[t] as f64 } else { 0.0 }
            } else {
                row.values[t + 1] as f64
            };
            row.rewards[t] as f64 + gamma * next * nnt(t) - row.values[t] as f64
        };
        (0..len)
            .map(|t| {
                let mut sum = 0.0;
                let mut weight = 1.0;
                for k in t..len {
                    sum += weight * delta(k);
                    if nnt(k) == 0.0 {
                        break;
                    }
                    weight *= gamma * lambda;
                }
                sum
            })
            .collect()
    }

    #[test]
    fn gae_agrees_with_the_direct_sum_on_random_rows() {
        let mut s = StreamKey::new(4, 0, 0, Purpose::Test).stream(0);
        for case in 0..200 {
            let len = 1 + s.below(40) as usize;
            let f = |s: &mut crate::rng::Stream| s.uniform(-3.0, 3.0) as f32;
            let rewards: Vec<f32> = (0..len).map(|_| f(&mut s)).collect();
            let values: Vec<f32> = (0..len).map(|_| f(&mut s)).collect();
            let bootstrap: Vec<f32> = (0..len).map(|_| f(&mut s)).collect();
            let done: Vec<bool> = (0..len).map(|t| t + 1 == len || s.below(8) == 0).collect();
            let truncated: Vec<bool> = (0..len).map(|t| t + 1 == len && s.below(2) == 0).collect();
            let row = GaeRow {
                rewards: &rewards,
                values: &values,
                bootstrap: &bootstrap,
                done: &done,
                truncated: &truncated,
            };
            let (gamma, lambda) = (0.995, 0.98);
            let (mut a, mut r, mut td) = (vec![0f32; len], vec![0f32; len], vec![0f32; len]);
            gae_row(row, len, gamma, lambda, &mut a, &mut r, &mut td);
            let slow = slow_gae(row, len, gamma as f64, lambda as f64);
            for t in 0..len {
                assert!((a[t] as f64 - slow[t]).abs() < 1e-3, "case {case} t {t}: {} vs {}", a[t], slow[t]);
                assert!((r[t] - a[t] - values[t]).abs() < 1e-5);
            }
        }
    }
}
