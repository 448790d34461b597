//! The critic's target scale (simic §4.6, the reference's `ValueNormalizer`, "PopArt-lite"): running
//! population moments of the GAE returns, updated once per PPO update. The mean is tracked but never
//! subtracted: `normalize(R) = R / scale`, `denormalize(V) = V · scale`, `scale = sqrt(var + 1e-4)` —
//! and both are the identity until 32 returns have been seen.
//!
//! Update from a batch with mean `μ_b` and population variance `σ²_b` (n values): while fewer than 32
//! values were seen before it, the parallel Welford merge
//! `μ ← μ + δ·n/(c+n)`, `σ² ← (σ²·c + σ²_b·n + δ²·c·n/(c+n)) / (c+n)`; after that an EMA with momentum
//! 0.99: `μ ← 0.99μ + 0.01μ_b`, `σ² ← 0.99σ² + 0.01σ²_b + 0.99·0.01·δ²`, with `δ = μ_b − μ_old`.
//! Kept in f64 here (the reference's float32 tensors reduce in an order we cannot match anyway).

/// Values seen before the running scale is used.
pub const MIN_SAMPLES: u64 = 32;
const MOMENTUM: f64 = 0.99;
const EPSILON: f64 = 1e-4;

/// The mean and the sum of squared deviations of a batch (two passes, in order), for the population
/// and the sample variance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moments {
    pub n: usize,
    pub mean: f64,
    pub squared_deviations: f64,
}

impl Moments {
    pub fn of(values: impl Iterator<Item = f64> + Clone) -> Self {
        let n = values.clone().count();
        let mean = if n == 0 { 0.0 } else { values.clone().sum::<f64>() / n as f64 };
        let squared_deviations = values.map(|v| (v - mean).powi(2)).sum();
        Self { n, mean, squared_deviations }
    }

    /// 0 for an empty batch.
    pub fn population_var(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.squared_deviations / self.n as f64 }
    }

    /// Bessel's; 0 for fewer than two values.
    pub fn sample_var(&self) -> f64 {
        if self.n < 2 { 0.0 } else { self.squared_deviations / (self.n - 1) as f64 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ValueNormalizer {
    pub mean: f64,
    pub var: f64,
    pub count: u64,
}

impl Default for ValueNormalizer {
    fn default() -> Self {
        Self { mean: 0.0, var: 1.0, count: 0 }
    }
}

impl ValueNormalizer {
    /// The running scale is in use (at least [`MIN_SAMPLES`] values seen).
    pub fn has_valid_stats(&self) -> bool {
        self.count >= MIN_SAMPLES
    }

    pub fn scale(&self) -> f64 {
        if self.has_valid_stats() { (self.var + EPSILON).sqrt() } else { 1.0 }
    }

    pub fn normalize(&self, r: f32) -> f32 {
        (r as f64 / self.scale()) as f32
    }

    pub fn denormalize(&self, v: f32) -> f32 {
        (v as f64 * self.scale()) as f32
    }

    /// One update from a batch of returns (no-op for an empty batch).
    pub fn update(&mut self, returns: &[f32]) {
        let n = returns.len();
        if n == 0 {
            return;
        }
        let m = Moments::of(returns.iter().map(|&r| r as f64));
        let (batch_mean, batch_var) = (m.mean, m.population_var());
        let delta = batch_mean - self.mean;
        if self.has_valid_stats() {
            self.mean = MOMENTUM * self.mean + (1.0 - MOMENTUM) * batch_mean;
            self.var = MOMENTUM * self.var
                + (1.0 - MOMENTUM) * batch_var
                + MOMENTUM * (1.0 - MOMENTUM) * delta * delta;
        } else {
            let (c, b) = (self.count as f64, n as f64);
            let total = c + b;
            self.mean += delta * b / total;
            self.var = (self.var * c + batch_var * b + delta * delta * c * b / total) / total;
        }
        self.count += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_merge_is_the_population_moments_of_everything_seen() {
        // Three batches, 30 values in all (< 32: still the merge): the result equals the moments of the
        // concatenation, computed directly.
        let batches: [&[f32]; 3] = [
            &[1.0, 2.0, 3.0, 4.0],
            &[10.0; 6],
            &[
                -5.0, 0.5, 7.0, 2.0, 2.0, 1.0, 0.0, 3.0, 4.0, -1.0, 6.0, 8.0, 9.0, -2.0, 0.0, 1.0, 1.0, 2.0,
                3.0, 4.0,
            ],
        ];
        let mut n = ValueNormalizer::default();
        for b in batches {
            n.update(b);
        }
        let all: Vec<f64> = batches.iter().flat_map(|b| b.iter().map(|&v| v as f64)).collect();
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let var = all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / all.len() as f64;
        assert_eq!(n.count, 30);
        assert!((n.mean - mean).abs() < 1e-12 && (n.var - var).abs() < 1e-12, "{n:?} vs {mean} {var}");
        assert!(!n.has_valid_stats());
        assert_eq!((n.normalize(3.0), n.denormalize(3.0)), (3.0, 3.0), "identity before 32 values");
    }

    #[test]
    fn after_32_values_the_update_is_an_ema_and_the_scale_is_used() {
        let mut n = ValueNormalizer::default();
        n.update(&[2.0; 32]); // mean 2, var: (1·0 + 0·32 + 4·0)/32 = 0
        assert_eq!((n.mean, n.var, n.count), (2.0, 0.0, 32));
        n.update(&[4.0, 6.0]); // μ_b 5, σ²_b 1, δ 3
        assert!((n.mean - (0.99 * 2.0 + 0.01 * 5.0)).abs() < 1e-12);
        assert!((n.var - (0.01 * 1.0 + 0.99 * 0.01 * 9.0)).abs() < 1e-12);
        let scale = (n.var + 1e-4).sqrt();
        assert!((n.normalize(1.0) as f64 - 1.0 / scale).abs() < 1e-6);
        assert!((n.denormalize(n.normalize(7.5)) - 7.5).abs() < 1e-5);
    }
}
