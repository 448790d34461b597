//! Shared helpers for the ops tests: random inputs from the crate's counter-based RNG, central finite
//! differences, the norm-wise error measure, and running a closure on a pool of a given size.

use crate::rng::{Purpose, StreamKey};

/// `n` values uniform in `[lo, hi)`, drawn from the test stream `seed`.
pub fn uniform(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
    (0..n).map(|_| s.uniform(lo, hi)).collect()
}

/// `n` values uniform in `[-1, 1)`.
pub fn signed(seed: u64, n: usize) -> Vec<f64> {
    uniform(seed, n, -1.0, 1.0)
}

/// `n` values of magnitude in `[0.1, 1)` with random sign: never near zero (for ReLU's kink).
pub fn away_from_zero(seed: u64, n: usize) -> Vec<f64> {
    let mut s = StreamKey::new(seed, 1, 0, Purpose::Test).stream(0);
    (0..n)
        .map(|_| {
            let m = s.uniform(0.1, 1.0);
            if s.next_f64() < 0.5 { -m } else { m }
        })
        .collect()
}

pub fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Σ a·b in f64, the scalar "loss" whose gradient with respect to `b` is `a`.
pub fn project(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central finite differences of `loss` at `x`, step 1e-6.
pub fn numeric_gradient(x: &[f64], mut loss: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    const H: f64 = 1e-6;
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            probe[i] = x[i] + H;
            let up = loss(&probe);
            probe[i] = x[i] - H;
            let down = loss(&probe);
            probe[i] = x[i];
            (up - down) / (2.0 * H)
        })
        .collect()
}

/// ‖a − b‖ / ‖b‖ (or ‖a − b‖ when b is zero).
pub fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let norm: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    if norm > 0.0 { diff / norm } else { diff }
}

/// Asserts the analytic gradient matches finite differences norm-wise within 1e-4, and that the check is
/// not vacuous (the reference gradient is not all zero).
pub fn assert_gradient(name: &str, analytic: &[f64], numeric: &[f64]) {
    let norm: f64 = numeric.iter().map(|y| y * y).sum::<f64>().sqrt();
    assert!(norm > 1e-8, "{name}: finite-difference gradient is zero, the check would be vacuous");
    let err = relative_error(analytic, numeric);
    assert!(err <= 1e-4, "{name}: relative gradient error {err:.3e} > 1e-4");
}

/// Runs `f` inside a fresh rayon pool of `threads` threads.
pub fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool").install(f)
}

/// Bit patterns, for bit-for-bit comparisons with a readable failure.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
