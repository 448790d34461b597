//! Adam (PyTorch's `torch.optim.Adam`, weight decay 0) over the policy's candle variables, with its
//! moments held as plain tensors so a checkpoint can save and restore them exactly (simic §4.1: lr 3e-4,
//! eps 1e-5, betas 0.9 / 0.999). PyTorch's update, step `t` counted from 1:
//!
//! ```text
//! m ← β₁m + (1 − β₁)g,   v ← β₂v + (1 − β₂)g²
//! θ ← θ − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + eps)
//! ```

use candle_core::{Result, Tensor, Var};

pub const BETA1: f64 = 0.9;
pub const BETA2: f64 = 0.999;

#[derive(Debug)]
pub struct Adam {
    pub lr: f64,
    pub eps: f64,
    /// Optimizer steps taken.
    pub step: u64,
    /// First and second moments, one per variable in the network's `vars()` order.
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl Adam {
    /// Zero moments shaped like `vars`.
    pub fn new(vars: &[Var], lr: f64, eps: f64) -> Result<Self> {
        let zeros = || vars.iter().map(|v| v.as_tensor().zeros_like()).collect::<Result<Vec<_>>>();
        Ok(Self { lr, eps, step: 0, m: zeros()?, v: zeros()? })
    }

    /// One step of every variable with its gradient (`grads[i]` for `vars[i]`).
    pub fn step(&mut self, vars: &[Var], grads: &[Tensor]) -> Result<()> {
        if vars.len() != self.m.len() || grads.len() != vars.len() {
            candle_core::bail!(
                "{} variables, {} gradients, {} moments",
                vars.len(),
                grads.len(),
                self.m.len()
            );
        }
        self.step += 1;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        let step_size = self.lr / bc1;
        for (i, (var, g)) in vars.iter().zip(grads).enumerate() {
            let m = ((&self.m[i] * BETA1)? + (g * (1.0 - BETA1))?)?;
            let v = ((&self.v[i] * BETA2)? + (g.sqr()? * (1.0 - BETA2))?)?;
            let denom = ((v.sqrt()? / bc2.sqrt())? + self.eps)?;
            let update = ((&m / denom)? * step_size)?;
            var.set(&(var.as_tensor() - update)?)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Three steps on f(θ) = Σ cᵢθᵢ² against the formula written out per scalar in f64.
    #[test]
    fn steps_match_pytorchs_formula_per_scalar() {
        let c = [1.0f64, -0.5, 3.0];
        let theta0 = [0.7f64, -1.2, 0.05];
        let var = Var::from_tensor(&Tensor::new(&theta0, &Device::Cpu).unwrap()).unwrap();
        let coef = Tensor::new(&c, &Device::Cpu).unwrap();
        let mut adam = Adam::new(std::slice::from_ref(&var), 0.1, 1e-5).unwrap();
        let (mut theta, mut m, mut v) = (theta0, [0.0f64; 3], [0.0f64; 3]);
        for t in 1..=3 {
            let loss = (var.as_tensor().sqr().unwrap() * &coef).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let g = grads.get(&var).unwrap().clone();
            adam.step(std::slice::from_ref(&var), &[g]).unwrap();
            for i in 0..3 {
                let g = 2.0 * c[i] * theta[i];
                m[i] = 0.9 * m[i] + 0.1 * g;
                v[i] = 0.999 * v[i] + 0.001 * g * g;
                let (bc1, bc2) = (1.0 - 0.9f64.powi(t), 1.0 - 0.999f64.powi(t));
                theta[i] -= 0.1 / bc1 * m[i] / (v[i].sqrt() / bc2.sqrt() + 1e-5);
            }
            let got = var.as_tensor().to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
            for i in 0..3 {
                assert!((got[i] - theta[i]).abs() < 1e-12, "step {t} θ{i}: {} vs {}", got[i], theta[i]);
            }
        }
        assert_eq!(adam.step, 3);
        // Every coordinate moved against its gradient's sign: θ₀ > 0 with c > 0 and θ₁ < 0 with c < 0
        // both have positive gradients.
        assert!(theta[0] < theta0[0] && theta[1] < theta0[1]);
    }
}
