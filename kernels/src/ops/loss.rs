//! Softmax cross-entropy per env, and the count of correct predictions.
//!
//! Logits `[E, B, K]`, labels `[E, B]`. Each env's loss is the mean over *its* B samples; the training
//! objective is the sum over envs, so each env's gradient is exactly its own: `dlogits = (softmax −
//! onehot)/B`. One task per env; the per-sample losses are added in sample order.

use rayon::prelude::*;

use super::real::Real;

/// Shape of a batched classifier output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassifierShape {
    pub envs: usize,
    pub batch: usize,
    pub classes: usize,
}

impl ClassifierShape {
    pub fn logits_len(&self) -> usize {
        self.envs * self.batch * self.classes
    }
    pub fn labels_len(&self) -> usize {
        self.envs * self.batch
    }
}

/// Max logit and `Σ exp(z − max)` of one sample (the stable log-sum-exp pieces).
#[inline]
fn max_and_sum_exp<T: Real>(z: &[T]) -> (T, T) {
    let mut max = z[0];
    for &v in &z[1..] {
        max = max.max(v);
    }
    let mut sum = T::ZERO;
    for &v in z {
        sum += (v - max).exp();
    }
    (max, sum)
}

/// Per-env mean cross-entropy into `loss` (`[E]`), and, when given, `grad_logits = (softmax − onehot)/B`
/// (the gradient of the *sum* of the per-env losses). Overwrites both.
pub fn softmax_cross_entropy<T: Real, L: Copy + Into<usize> + Sync>(
    shape: ClassifierShape,
    logits: &[T],
    labels: &[L],
    loss: &mut [T],
    grad_logits: Option<&mut [T]>,
) {
    assert_eq!(logits.len(), shape.logits_len(), "cross-entropy logits length");
    assert_eq!(labels.len(), shape.labels_len(), "cross-entropy labels length");
    assert_eq!(loss.len(), shape.envs, "cross-entropy loss length [E]");
    assert!(shape.classes > 0, "cross-entropy needs classes");
    let (b_count, k) = (shape.batch, shape.classes);
    let inv_batch = T::ONE / T::from_usize(b_count.max(1));
    let label_of = |i: usize| {
        let label: usize = labels[i].into();
        assert!(label < k, "label {label} out of range for {k} classes");
        label
    };
    loss.par_iter_mut().enumerate().for_each(|(e, loss_e)| {
        let mut total = T::ZERO;
        for b in 0..b_count {
            let i = e * b_count + b;
            let z = &logits[i * k..(i + 1) * k];
            let (max, sum) = max_and_sum_exp(z);
            total += max + sum.ln() - z[label_of(i)];
        }
        *loss_e = total * inv_batch;
    });
    if let Some(grad) = grad_logits {
        assert_eq!(grad.len(), shape.logits_len(), "cross-entropy gradient length");
        grad.par_chunks_mut(k).enumerate().for_each(|(i, g)| {
            let z = &logits[i * k..(i + 1) * k];
            let (max, sum) = max_and_sum_exp(z);
            let scale = inv_batch / sum;
            for (gk, &v) in g.iter_mut().zip(z) {
                *gk = (v - max).exp() * scale;
            }
            g[label_of(i)] -= inv_batch;
        });
    }
}

/// Number of samples per env whose arg-max logit (first on ties) equals the label. Overwrites `correct`.
pub fn count_correct<T: Real, L: Copy + Into<usize> + Sync>(
    shape: ClassifierShape,
    logits: &[T],
    labels: &[L],
    correct: &mut [u32],
) {
    assert_eq!(logits.len(), shape.logits_len(), "logits length");
    assert_eq!(labels.len(), shape.labels_len(), "labels length");
    assert_eq!(correct.len(), shape.envs, "correct counts length [E]");
    let (b_count, k) = (shape.batch, shape.classes);
    correct.par_iter_mut().enumerate().for_each(|(e, count)| {
        *count = 0;
        for b in 0..b_count {
            let i = e * b_count + b;
            let z = &logits[i * k..(i + 1) * k];
            let mut best = 0;
            for c in 1..k {
                if z[c] > z[best] {
                    best = c;
                }
            }
            if best == labels[i].into() {
                *count += 1;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    const SHAPE: ClassifierShape = ClassifierShape { envs: 3, batch: 4, classes: 5 };

    fn labels(seed: u64, s: ClassifierShape) -> Vec<u8> {
        let mut st = crate::rng::StreamKey::new(seed, 0, 0, crate::rng::Purpose::Test).stream(0);
        (0..s.labels_len()).map(|_| st.below(s.classes as u64) as u8).collect()
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let s = SHAPE;
        let z = uniform(1, s.logits_len(), -3.0, 3.0);
        let y = labels(2, s);
        let mut loss = vec![0.0; s.envs];
        let mut grad = vec![f64::NAN; s.logits_len()];
        softmax_cross_entropy(s, &z, &y, &mut loss, Some(&mut grad));
        let numeric = numeric_gradient(&z, |zp| {
            let mut l = vec![0.0; s.envs];
            softmax_cross_entropy(s, zp, &y, &mut l, None);
            l.iter().sum()
        });
        assert_gradient("cross-entropy", &grad, &numeric);
    }

    #[test]
    fn loss_matches_definition_and_is_stable_for_huge_logits() {
        let s = ClassifierShape { envs: 2, batch: 2, classes: 3 };
        let z = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 1000.0, 0.0, -1000.0, 5.0, 5.0, 5.0];
        let y: [u8; 4] = [2, 0, 0, 1];
        let mut loss = [0.0; 2];
        softmax_cross_entropy(s, &z, &y, &mut loss, None);
        let lse = |v: &[f64]| v.iter().map(|x| x.exp()).sum::<f64>().ln();
        let env0 = ((lse(&z[0..3]) - 3.0) + (lse(&z[3..6]) - 0.0)) / 2.0;
        let env1 = (0.0 + 3f64.ln()) / 2.0; // sample 0: log-softmax of the 1000 logit is 0 (to f64 precision)
        assert!((loss[0] - env0).abs() < 1e-14 && (loss[1] - env1).abs() < 1e-14, "{loss:?}");
        let mut correct = [0u32; 2];
        count_correct(s, &z, &y, &mut correct);
        // Env 0: argmax 2 = label 2, and the all-tie sample picks class 0 = label 0. Env 1: argmax 0 = label 0,
        // and the all-tie sample picks class 0 ≠ label 1.
        assert_eq!(correct, [2, 1]);
    }

    fn run_f32(s: ClassifierShape, z: &[f32], y: &[u8]) -> (Vec<f32>, Vec<f32>) {
        let mut loss = vec![0.0; s.envs];
        let mut grad = vec![0.0; s.logits_len()];
        softmax_cross_entropy(s, z, y, &mut loss, Some(&mut grad));
        (loss, grad)
    }

    #[test]
    fn env_in_a_batch_equals_env_alone_and_ignores_thread_count() {
        let s = ClassifierShape { envs: 3, batch: 50, classes: 10 };
        let z = to_f32(&uniform(3, s.logits_len(), -4.0, 4.0));
        let y = labels(4, s);
        let (loss, grad) = run_f32(s, &z, &y);
        let one = ClassifierShape { envs: 1, ..s };
        for e in 0..s.envs {
            let (n, m) = (one.logits_len(), one.labels_len());
            let (l1, g1) = run_f32(one, &z[e * n..][..n], &y[e * m..][..m]);
            assert_eq!(loss[e].to_bits(), l1[0].to_bits(), "loss, env {e}");
            assert_eq!(bits(&grad[e * n..][..n]), bits(&g1), "gradient, env {e}");
        }
        let t1 = with_threads(1, || run_f32(s, &z, &y));
        let t2 = with_threads(2, || run_f32(s, &z, &y));
        assert_eq!(bits(&t1.0), bits(&t2.0));
        assert_eq!(bits(&t1.1), bits(&t2.1));
    }
}
