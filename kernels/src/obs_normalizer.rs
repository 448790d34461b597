//! The running observation normaliser (spec tamiyo §1.4, simic §4.6): per-feature mean and variance
//! that stay frozen while a round's observations are normalised, then take one EMA step from the
//! moments of all of that round's raw observations.
//!
//! The reference concatenates the round's raw observations and takes their moments at the end; here
//! [`ObsMoments`] accumulates them row by row (sums shifted by the frozen mean, in f64), so the round's
//! observations are never stored and nothing allocates per step. Statistics are f64 (the reference's
//! are f32 tensors).

use serde::{Deserialize, Serialize};

/// EMA momentum of the round-end update.
pub const OBS_NORM_MOMENTUM: f64 = 0.99;
/// Added to the variance under the square root, and the initial count.
pub const OBS_NORM_EPSILON: f64 = 1e-4;
/// Normalised values are clipped to ±10.
pub const OBS_NORM_CLIP: f64 = 10.0;

/// `RunningMeanStd(shape=[D], epsilon=1e-4, momentum=0.99)`: plain data, saved with a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObsNormalizer {
    pub mean: Vec<f64>,
    pub var: Vec<f64>,
    /// Observations seen (diagnostic only: the EMA update does not read it). Starts at 1e-4.
    pub count: f64,
}

impl ObsNormalizer {
    /// Mean 0, variance 1, count 1e-4 for `dim` features.
    pub fn new(dim: usize) -> Self {
        Self { mean: vec![0.0; dim], var: vec![1.0; dim], count: OBS_NORM_EPSILON }
    }

    pub fn dim(&self) -> usize {
        self.mean.len()
    }

    /// `clamp((x − μ) / sqrt(σ² + 1e-4), ±10)` for every row of `raw` (`[N, D]`) into `out`.
    ///
    /// A NaN feature normalises to 0.0 (the running mean) rather than reaching the policy: the
    /// reference would pass it on and poison the network. ±∞ clip to ±10 as any large value does.
    pub fn normalize_into(&self, raw: &[f32], out: &mut [f32]) {
        let dim = self.dim();
        assert_eq!(raw.len(), out.len(), "normalise [N, D] into [N, D]");
        assert_eq!(raw.len() % dim.max(1), 0, "rows of D = {dim} features");
        // Feature by feature, so each frozen scale is taken once per call, not once per row.
        for j in 0..dim {
            let (mean, scale) = (self.mean[j], (self.var[j] + OBS_NORM_EPSILON).sqrt());
            for (&x, y) in raw.iter().skip(j).step_by(dim).zip(out.iter_mut().skip(j).step_by(dim)) {
                let z = (f64::from(x) - mean) / scale;
                *y = if z.is_nan() { 0.0 } else { z.clamp(-OBS_NORM_CLIP, OBS_NORM_CLIP) as f32 };
            }
        }
    }

    /// The EMA step from a batch's mean and biased variance (`_update_from_moments`):
    /// `δ = m_b − μ; μ ← 0.99·μ + 0.01·m_b; σ² ← 0.99·σ² + 0.01·v_b + 0.99·0.01·δ²`. Features the
    /// batch has no finite value for (count 0) keep their statistics.
    pub fn update_from_moments(&mut self, moments: &ObsMoments) {
        assert_eq!(moments.dim(), self.dim(), "moments of the normaliser's features");
        let m = OBS_NORM_MOMENTUM;
        for j in 0..self.dim() {
            let Some((batch_mean, batch_var)) = moments.mean_var(j) else { continue };
            let delta = batch_mean - self.mean[j];
            self.mean[j] = m * self.mean[j] + (1.0 - m) * batch_mean;
            self.var[j] = m * self.var[j] + (1.0 - m) * batch_var + m * (1.0 - m) * delta * delta;
        }
        self.count += moments.rows as f64;
    }
}

/// The first and second moments of a batch of raw observations, accumulated row by row: per feature
/// the number of finite values and the sums of `x − c` and `(x − c)²` about a fixed shift `c` (the
/// frozen mean, so the sums stay small and the variance does not cancel).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ObsMoments {
    shift: Vec<f64>,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
    count: Vec<u64>,
    /// Rows added (the batch size).
    pub rows: u64,
}

impl ObsMoments {
    /// Empty moments about `shift` (one value per feature).
    pub fn new(shift: &[f64]) -> Self {
        let mut m = Self::default();
        m.restart(shift);
        m
    }

    pub fn dim(&self) -> usize {
        self.shift.len()
    }

    /// Forget every row and accumulate about `shift` from now on (allocates only if D grows).
    pub fn restart(&mut self, shift: &[f64]) {
        let dim = shift.len();
        self.shift.clear();
        self.shift.extend_from_slice(shift);
        self.sum.clear();
        self.sum.resize(dim, 0.0);
        self.sum_sq.clear();
        self.sum_sq.resize(dim, 0.0);
        self.count.clear();
        self.count.resize(dim, 0);
        self.rows = 0;
    }

    /// Add every row of `raw` (`[N, D]`). Non-finite values are left out of their feature's moments.
    pub fn add_rows(&mut self, raw: &[f32]) {
        let dim = self.dim();
        assert_eq!(raw.len() % dim.max(1), 0, "rows of D = {dim} features");
        for row in raw.chunks_exact(dim) {
            for (j, &x) in row.iter().enumerate() {
                let x = f64::from(x);
                if x.is_finite() {
                    let d = x - self.shift[j];
                    self.sum[j] += d;
                    self.sum_sq[j] += d * d;
                    self.count[j] += 1;
                }
            }
            self.rows += 1;
        }
    }

    /// Feature `j`'s mean and biased (population) variance, None without a finite value.
    pub fn mean_var(&self, j: usize) -> Option<(f64, f64)> {
        let n = self.count[j];
        if n == 0 {
            return None;
        }
        let n = n as f64;
        let centred_mean = self.sum[j] / n;
        let var = (self.sum_sq[j] / n - centred_mean * centred_mean).max(0.0);
        Some((self.shift[j] + centred_mean, var))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    /// Two rounds of two features, by hand (simic §4.6's update):
    /// round 1 rows [1, 10], [3, 10]: m_b = [2, 10], v_b = [1, 0]; from μ = 0, σ² = 1:
    ///   μ = 0.01·m_b = [0.02, 0.1]; σ² = 0.99 + 0.01·v_b + 0.0099·m_b² = [1.0396, 1.98].
    /// round 2 rows [2, 0], [0, 0]: m_b = [1, 0], v_b = [1, 0]; δ = [0.98, −0.1]:
    ///   μ = 0.99·[0.02, 0.1] + 0.01·[1, 0] = [0.0298, 0.099];
    ///   σ² = 0.99·[1.0396, 1.98] + 0.01·[1, 0] + 0.0099·[0.9604, 0.01] = [1.04871196, 1.960299].
    #[test]
    fn two_round_ema_update_by_hand() {
        let mut norm = ObsNormalizer::new(2);
        let mut round = ObsMoments::new(&norm.mean);
        round.add_rows(&[1.0, 10.0, 3.0, 10.0]);
        norm.update_from_moments(&round);
        assert!(close(norm.mean[0], 0.02) && close(norm.mean[1], 0.1), "{:?}", norm.mean);
        assert!(close(norm.var[0], 1.0396) && close(norm.var[1], 1.98), "{:?}", norm.var);
        round.restart(&norm.mean);
        round.add_rows(&[2.0, 0.0]);
        round.add_rows(&[0.0, 0.0]);
        norm.update_from_moments(&round);
        assert!(close(norm.mean[0], 0.0298) && close(norm.mean[1], 0.099), "{:?}", norm.mean);
        assert!(close(norm.var[0], 1.04871196) && close(norm.var[1], 1.960299), "{:?}", norm.var);
        assert!(close(norm.count, 4.0001), "{}", norm.count);
    }

    /// After round 1 of the example above: (1 − 0.02)/sqrt(1.0397) = 0.961107…, (10 − 0.1)/sqrt(1.9801)
    /// = 7.035446…; 100 clips to +10, −100 to −10, NaN reads 0; the statistics do not move however often
    /// they normalise.
    #[test]
    fn normalisation_uses_frozen_statistics_and_clips() {
        let norm = ObsNormalizer { mean: vec![0.02, 0.1], var: vec![1.0396, 1.98], count: 2.0001 };
        let before = norm.clone();
        let raw = [1.0, 10.0, 100.0, -100.0, f32::NAN, f32::INFINITY];
        let mut first = [0.0f32; 6];
        let mut second = [0.0f32; 6];
        norm.normalize_into(&raw, &mut first);
        norm.normalize_into(&raw, &mut second);
        assert_eq!(first, second);
        assert_eq!(norm, before);
        assert!((f64::from(first[0]) - 0.961_107_693).abs() < 1e-6, "{}", first[0]);
        assert!((f64::from(first[1]) - 7.035_445_979).abs() < 1e-5, "{}", first[1]);
        assert_eq!(&first[2..], &[10.0, -10.0, 0.0, 10.0]);
    }

    /// The shifted running sums give the same moments as a direct two-pass computation, far from the
    /// shift too; non-finite values stay out of their feature's moments; an update skips a feature
    /// with no finite value.
    #[test]
    fn moments_match_two_pass_and_skip_non_finite() {
        let rows: Vec<[f32; 2]> = (0..50)
            .map(|i| [1000.0 + (i as f32 * 0.37).sin(), if i % 7 == 0 { f32::NAN } else { i as f32 }])
            .collect();
        let mut m = ObsMoments::new(&[0.0, 5.0]);
        for r in &rows {
            m.add_rows(r);
        }
        assert_eq!(m.rows, 50);
        for j in 0..2 {
            let xs: Vec<f64> = rows.iter().map(|r| f64::from(r[j])).filter(|x| x.is_finite()).collect();
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
            let (got_mean, got_var) = m.mean_var(j).unwrap();
            assert!((got_mean - mean).abs() < 1e-9 && (got_var - var).abs() < 1e-9, "feature {j}");
        }
        assert_eq!(rows.iter().filter(|r| r[1].is_finite()).count(), 42);
        let mut only_nan = ObsMoments::new(&[0.0]);
        only_nan.add_rows(&[f32::NAN]);
        let mut norm = ObsNormalizer::new(1);
        norm.update_from_moments(&only_nan);
        assert_eq!((norm.mean[0], norm.var[0]), (0.0, 1.0));
    }
}
