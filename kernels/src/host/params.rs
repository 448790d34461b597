//! Host parameters for every env, stacked: each trainable tensor is one flat `[E, n]` buffer.

use super::arch::HostArch;
use crate::ops::Real;
use crate::rng::{Purpose, StreamKey};

/// A list of `[E, n_i]` tensors (parameters, their gradients, or their momentum buffers).
#[derive(Clone, Debug, PartialEq)]
pub struct Stacked<T> {
    pub n_envs: usize,
    pub tensors: Vec<Vec<T>>,
}

impl<T: Real> Stacked<T> {
    /// Zeros shaped like `lens` (per-env lengths) for `n_envs` envs.
    pub fn zeros(n_envs: usize, lens: &[usize]) -> Self {
        Self { n_envs, tensors: lens.iter().map(|&n| vec![T::ZERO; n * n_envs]).collect() }
    }

    pub fn per_env_len(&self, tensor: usize) -> usize {
        self.tensors[tensor].len() / self.n_envs
    }

    /// Env `env`'s slice of tensor `tensor`.
    pub fn env(&self, tensor: usize, env: usize) -> &[T] {
        let n = self.per_env_len(tensor);
        &self.tensors[tensor][env * n..(env + 1) * n]
    }

    pub fn env_mut(&mut self, tensor: usize, env: usize) -> &mut [T] {
        let n = self.per_env_len(tensor);
        &mut self.tensors[tensor][env * n..(env + 1) * n]
    }

    /// A one-env copy of env `env`'s rows.
    pub fn extract_env(&self, env: usize) -> Self {
        Self { n_envs: 1, tensors: (0..self.tensors.len()).map(|t| self.env(t, env).to_vec()).collect() }
    }

    /// Zero env `env`'s rows of every tensor (momentum reset at rollback, say).
    pub fn zero_env(&mut self, env: usize) {
        for t in 0..self.tensors.len() {
            self.env_mut(t, env).fill(T::ZERO);
        }
    }

    /// Element-wise conversion (f32 ↔ f64 for gradient checks).
    pub fn convert<U: Real>(&self) -> Stacked<U> {
        Stacked {
            n_envs: self.n_envs,
            tensors: self
                .tensors
                .iter()
                .map(|t| t.iter().map(|v| U::from_f64(v.to_f64())).collect())
                .collect(),
        }
    }
}

/// Trainable host parameters (see [`HostArch::tensor_lens`] for the order) and the batch-norm running
/// statistics (not trainable) of every env.
#[derive(Clone, Debug, PartialEq)]
pub struct HostParams<T> {
    pub arch: HostArch,
    pub weights: Stacked<T>,
    /// Per block `[E, C]`.
    pub running_mean: Vec<Vec<T>>,
    /// Per block `[E, C]`.
    pub running_var: Vec<Vec<T>>,
}

impl HostParams<f32> {
    /// PyTorch's default initialisation for every env, each drawn from its own stream keyed by
    /// `(seed, round, env_id, HostInit)`: conv and linear weights `U(±1/√fan_in)` (kaiming-uniform with
    /// a = √5), head bias `U(±1/√fan_in)`, BN γ = 1, β = 0, running mean 0, running var 1.
    /// `env_ids[e]` names env `e`'s stream, so env e of a batch equals the same env initialised alone.
    pub fn init(arch: HostArch, seed: u64, round: u64, env_ids: &[u64]) -> Self {
        let n_envs = env_ids.len();
        let lens = arch.tensor_lens();
        let mut weights = Stacked::<f32>::zeros(n_envs, &lens);
        let k2 = arch.kernel_size * arch.kernel_size;
        for (e, &id) in env_ids.iter().enumerate() {
            let mut stream = StreamKey::new(seed, round, id, Purpose::HostInit).stream(0);
            let mut uniform = |dst: &mut [f32], fan_in: usize| {
                let bound = 1.0 / (fan_in as f64).sqrt();
                for v in dst {
                    *v = stream.uniform(-bound, bound) as f32;
                }
            };
            for b in 0..arch.n_blocks {
                uniform(weights.env_mut(3 * b, e), arch.block_in_channels(b) * k2);
                weights.env_mut(3 * b + 1, e).fill(1.0);
            }
            let head = 3 * arch.n_blocks;
            uniform(weights.env_mut(head, e), arch.head_in());
            uniform(weights.env_mut(head + 1, e), arch.head_in());
        }
        let stats = |v: f32| (0..arch.n_blocks).map(|b| vec![v; n_envs * arch.block_channels(b)]).collect();
        Self { arch, weights, running_mean: stats(0.0), running_var: stats(1.0) }
    }
}

impl<T: Real> HostParams<T> {
    /// All-zero parameters and statistics (a buffer to gather rows into).
    pub fn zeros(arch: HostArch, n_envs: usize) -> Self {
        let stats = || (0..arch.n_blocks).map(|b| vec![T::ZERO; n_envs * arch.block_channels(b)]).collect();
        Self {
            arch,
            weights: Stacked::zeros(n_envs, &arch.tensor_lens()),
            running_mean: stats(),
            running_var: stats(),
        }
    }

    pub fn n_envs(&self) -> usize {
        self.weights.n_envs
    }

    pub fn conv(&self, block: usize) -> &[T] {
        &self.weights.tensors[3 * block]
    }

    pub fn gamma(&self, block: usize) -> &[T] {
        &self.weights.tensors[3 * block + 1]
    }

    pub fn beta(&self, block: usize) -> &[T] {
        &self.weights.tensors[3 * block + 2]
    }

    pub fn head_weight(&self) -> &[T] {
        &self.weights.tensors[3 * self.arch.n_blocks]
    }

    pub fn head_bias(&self) -> &[T] {
        &self.weights.tensors[3 * self.arch.n_blocks + 1]
    }

    /// Env `env`'s rows, in a fixed order: every weight tensor, then the running means and the running
    /// variances block by block.
    pub fn env_rows(&self, env: usize) -> impl Iterator<Item = &[T]> {
        let n_blocks = self.arch.n_blocks;
        let weights = (0..self.weights.tensors.len()).map(move |t| self.weights.env(t, env));
        let stats = self.running_mean.iter().chain(&self.running_var).enumerate().map(move |(i, s)| {
            let c = self.arch.block_channels(i % n_blocks);
            &s[env * c..(env + 1) * c]
        });
        weights.chain(stats)
    }

    /// Overwrite env `env`'s weights and running statistics with `other`'s env `env` (same shapes): a
    /// governor snapshot or rollback of one env.
    pub fn copy_env_from(&mut self, other: &Self, env: usize) {
        self.copy_env_row_from(other, env, env);
    }

    /// Overwrite env `to`'s weights and running statistics with `src`'s env `from` (same architecture;
    /// the env counts may differ).
    pub fn copy_env_row_from(&mut self, src: &Self, from: usize, to: usize) {
        for t in 0..self.weights.tensors.len() {
            self.weights.env_mut(t, to).copy_from_slice(src.weights.env(t, from));
        }
        for b in 0..self.arch.n_blocks {
            let c = self.arch.block_channels(b);
            let (dst, src_rows) = (to * c..(to + 1) * c, from * c..(from + 1) * c);
            self.running_mean[b][dst.clone()].copy_from_slice(&src.running_mean[b][src_rows.clone()]);
            self.running_var[b][dst].copy_from_slice(&src.running_var[b][src_rows]);
        }
    }

    /// A one-env copy of env `env` (weights and running statistics).
    pub fn extract_env(&self, env: usize) -> Self {
        let rows = |stats: &Vec<Vec<T>>| {
            (0..self.arch.n_blocks)
                .map(|b| {
                    let c = self.arch.block_channels(b);
                    stats[b][env * c..(env + 1) * c].to_vec()
                })
                .collect()
        };
        Self {
            arch: self.arch,
            weights: self.weights.extract_env(env),
            running_mean: rows(&self.running_mean),
            running_var: rows(&self.running_var),
        }
    }

    pub fn convert<U: Real>(&self) -> HostParams<U> {
        let conv =
            |s: &Vec<Vec<T>>| s.iter().map(|t| t.iter().map(|v| U::from_f64(v.to_f64())).collect()).collect();
        HostParams {
            arch: self.arch,
            weights: self.weights.convert(),
            running_mean: conv(&self.running_mean),
            running_var: conv(&self.running_var),
        }
    }
}
