//! The masked, floored log-probability and normalised entropy of one head for a batch of stored
//! actions, as candle ops so the PPO update can differentiate them (tamiyo §4.5: "the same
//! floor/log-prob/entropy math as §4.3 … identical FP32 path, so the rollout ratio is unbiased").
//! [`super::distribution`] is the same math on plain slices (the rollout's); a test holds the two
//! together.
//!
//! Which entries are raised to the floor (`p < φ`) is decided on the values and enters as a constant
//! mask, as in the reference: the gradient flows through `p` and the rescale, not through the choice.

use candle_core::{D, DType, Result, Tensor};

use super::distribution::MASKED_LOGIT;

/// Per row: `(log π(action), normalised entropy)` of the floored distribution of `logits` `[N, K]` under
/// `mask` (`N·K` booleans, row-major, ≥ 1 legal per row) with probability floor `floor` (≤ 0: none).
pub fn floored_log_prob(
    logits: &Tensor,
    mask: &[bool],
    floor: f32,
    actions: &[u8],
) -> Result<(Tensor, Tensor)> {
    let (n, k) = logits.dims2()?;
    let (device, dtype) = (logits.device(), logits.dtype());
    let constant = |v: Vec<f32>| Tensor::from_vec(v, (n, k), device)?.to_dtype(dtype);
    let legal: Vec<f32> = mask.iter().map(|&m| f32::from(u8::from(m))).collect();
    let counts: Vec<usize> = mask.chunks(k).map(|row| row.iter().filter(|&&m| m).count()).collect();
    if counts.contains(&0) {
        candle_core::bail!("a row with no legal action");
    }
    let legal_t = constant(legal.clone())?;
    let masked = constant(legal.iter().map(|&l| (1.0 - l) * MASKED_LOGIT).collect())?;
    // z' = z on legal entries, −1e4 elsewhere.
    let mut z = ((logits * &legal_t)? + &masked)?;
    if floor > 0.0 {
        let p = softmax(&z)?;
        let values = p.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let phi: Vec<f32> = counts.iter().map(|&c| floor.min(0.99 / c as f32)).collect();
        let under: Vec<f32> =
            (0..n * k).map(|i| f32::from(u8::from(mask[i] && values[i] < phi[i / k]))).collect();
        let over: Vec<f32> = (0..n * k).map(|i| legal[i] - under[i]).collect();
        let raised: Vec<f32> = (0..n * k).map(|i| under[i] * phi[i / k]).collect();
        let kept: Vec<f32> = (0..n)
            .map(|r| (1.0 - under[r * k..(r + 1) * k].iter().sum::<f32>() * phi[r]).max(1e-8))
            .collect();
        let (under_t, over_t) = (constant(raised)?, constant(over)?);
        let kept = Tensor::from_vec(kept, (n, 1), device)?.to_dtype(dtype)?;
        let over_mass = (&p * &over_t)?.sum_keepdim(1)?.clamp(1e-8, f64::INFINITY)?;
        let scale = (kept / over_mass)?;
        let q = (under_t + (&p * &over_t)?.broadcast_mul(&scale)?)?;
        z = ((q.clamp(1e-8, f64::INFINITY)?.log()? * &legal_t)? + &masked)?;
    }
    let log_p = log_softmax(&z)?;
    let onehot: Vec<f32> =
        (0..n * k).map(|i| f32::from(u8::from(actions[i / k] as usize == i % k))).collect();
    let chosen = (&log_p * constant(onehot)?)?.sum(1)?;
    // −Σ_legal p ln p / ln K, 0 for a row with one legal action.
    let norm: Vec<f32> = counts.iter().map(|&c| if c > 1 { 1.0 / (c as f32).ln() } else { 0.0 }).collect();
    let norm = Tensor::from_vec(norm, n, device)?.to_dtype(dtype)?;
    let entropy = (((log_p.exp()? * &log_p)? * &legal_t)?.sum(1)?.neg()? * norm)?;
    Ok((chosen, entropy))
}

fn softmax(z: &Tensor) -> Result<Tensor> {
    log_softmax(z)?.exp()
}

fn log_softmax(z: &Tensor) -> Result<Tensor> {
    let max = z.max_keepdim(D::Minus1)?.detach();
    let shifted = z.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&log_sum)
}

#[cfg(test)]
mod tests {
    use super::super::distribution::{floored_logits, log_softmax as slice_log_softmax, normalized_entropy};
    use super::*;
    use crate::rng::{Purpose, StreamKey};
    use candle_core::{Device, Var};

    /// A batch of random rows: logits, masks (≥ 1 legal) and a legal action per row.
    fn batch(seed: u64, n: usize, k: usize) -> (Vec<f32>, Vec<bool>, Vec<u8>) {
        let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
        let logits: Vec<f32> = (0..n * k).map(|_| s.uniform(-6.0, 6.0) as f32).collect();
        let mut mask: Vec<bool> = (0..n * k).map(|_| s.below(3) > 0).collect();
        let mut actions = Vec::new();
        for r in 0..n {
            mask[r * k + s.below(k as u64) as usize] = true;
            let legal: Vec<usize> = (0..k).filter(|&i| mask[r * k + i]).collect();
            actions.push(legal[s.below(legal.len() as u64) as usize] as u8);
        }
        (logits, mask, actions)
    }

    /// The candle path gives the rollout's numbers (slices, f32) for every row, floor or not.
    #[test]
    fn candle_log_prob_matches_the_rollout_math() {
        for (seed, k, floor) in [(1, 6, 0.15f32), (2, 13, 0.12), (3, 3, 0.08), (4, 5, 0.0)] {
            let n = 64;
            let (logits, mask, actions) = batch(seed, n, k);
            let t = Tensor::from_vec(logits.clone(), (n, k), &Device::Cpu).unwrap();
            let (lp, h) = floored_log_prob(&t, &mask, floor, &actions).unwrap();
            let (lp, h) = (lp.to_vec1::<f32>().unwrap(), h.to_vec1::<f32>().unwrap());
            for r in 0..n {
                let row = r * k..(r + 1) * k;
                let mut z = vec![0.0; k];
                floored_logits(&logits[row.clone()], &mask[row.clone()], floor, &mut z);
                let mut want = vec![0.0; k];
                slice_log_softmax(&z, &mut want);
                let want_h = normalized_entropy(&z, &mask[row]);
                assert!(
                    (lp[r] - want[actions[r] as usize]).abs() < 1e-4,
                    "seed {seed} row {r}: {} vs {}",
                    lp[r],
                    want[actions[r] as usize]
                );
                assert!((h[r] - want_h).abs() < 1e-4, "seed {seed} row {r}: entropy {} vs {want_h}", h[r]);
            }
        }
    }

    /// d log π / d logits through the floor, against central differences (f64).
    #[test]
    fn floored_log_prob_gradient_matches_finite_differences() {
        let (n, k) = (8, 6);
        let (logits, mask, actions) = batch(7, n, k);
        let logits: Vec<f64> = logits.iter().map(|&v| v as f64 * 0.3).collect();
        let loss = |z: &Tensor| -> Tensor {
            let (lp, h) = floored_log_prob(z, &mask, 0.15, &actions).unwrap();
            (lp.sum_all().unwrap() + h.sum_all().unwrap().affine(0.5, 0.0).unwrap()).unwrap()
        };
        let var = Var::from_vec(logits.clone(), (n, k), &Device::Cpu).unwrap();
        let grads = loss(var.as_tensor()).backward().unwrap();
        let analytic = grads.get(&var).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let eps = 1e-6;
        for i in 0..n * k {
            let at = |d: f64| {
                let mut v = logits.clone();
                v[i] += d;
                loss(&Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap()).to_vec0::<f64>().unwrap()
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            assert!(
                (numeric - analytic[i]).abs() < 1e-5 * (1.0 + numeric.abs()),
                "{i}: {numeric} vs {}",
                analytic[i]
            );
        }
    }
}
