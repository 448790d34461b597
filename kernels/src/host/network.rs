//! The batched host network: a static layer sequence whose forward keeps what the backward needs in
//! preallocated buffers and whose backward walks the same sequence in reverse. Every op runs once per
//! layer over all envs (the env is a parallel dimension inside the op). Seed slots sit after a block's
//! ReLU (row 0) and after its pool (row 1); a slot with no active seed in any env is skipped.

use super::arch::HostArch;
use super::params::{HostParams, Stacked};
use super::seed_bank::{SeedBank, SlotParams};
use super::slot::SlotWorkspace;
use crate::ops::{self, ClassifierShape, Conv2dShape, LinearShape, NormShape, PoolShape, Real};

/// One block's activations.
#[derive(Debug)]
struct BlockActs<T> {
    /// Conv output `z` (the batch norm's input).
    conv_out: Vec<T>,
    /// `relu(bn(z))`: the host activation at slot r0c<b>.
    block_out: Vec<T>,
    bn_mean: Vec<T>,
    bn_inv_std: Vec<T>,
    /// Pooled output (the host activation at slot r1c<b>); empty without a pool.
    pooled: Vec<T>,
    argmax: Vec<u8>,
    r0: Option<SlotWorkspace<T>>,
    r1: Option<SlotWorkspace<T>>,
}

impl<T: Real> BlockActs<T> {
    /// The output of slot r0 (or the block output when the slot is absent or idle): the pool's input.
    fn r0_output(&self) -> &[T] {
        match &self.r0 {
            Some(s) if s.active => &s.out,
            _ => &self.block_out,
        }
    }

    /// The block's final output: after its pool and slot r1, if any.
    fn final_output(&self, pools: bool) -> &[T] {
        if !pools {
            return self.r0_output();
        }
        match &self.r1 {
            Some(s) if s.active => &s.out,
            _ => &self.pooled,
        }
    }
}

/// Activations and gradient scratch for one `(E, B)` run shape and slot set, allocated once and reused.
#[derive(Debug)]
pub struct HostWorkspace<T> {
    pub arch: HostArch,
    pub envs: usize,
    pub batch: usize,
    blocks: Vec<BlockActs<T>>,
    /// Global-average-pooled features `[E, B, C_last]`.
    features: Vec<T>,
    pub logits: Vec<T>,
    /// Per-env mean cross-entropy of the last training forward `[E]`.
    pub loss: Vec<T>,
    grad_logits: Vec<T>,
    grad_features: Vec<T>,
    grad_a: Vec<T>,
    grad_b: Vec<T>,
}

impl<T: Real> HostWorkspace<T> {
    /// A workspace for the plain host (no slots).
    pub fn new(arch: HostArch, envs: usize, batch: usize) -> Self {
        Self::with_slots(arch, envs, batch, &SeedBank::<T>::empty(&arch))
    }

    /// A workspace with a slot workspace for every enabled slot of `bank`.
    pub fn with_slots(arch: HostArch, envs: usize, batch: usize, bank: &SeedBank<T>) -> Self {
        let act = |b: usize| envs * batch * arch.block_channels(b) * arch.block_size(b).pow(2);
        let pooled = |b: usize| if arch.pools_after(b) { act(b) / 4 } else { 0 };
        let slot = |p: &Option<SlotParams<T>>| {
            p.as_ref().map(|p| SlotWorkspace::new(envs, batch, p.channels, p.size))
        };
        let blocks = (0..arch.n_blocks)
            .map(|b| BlockActs {
                conv_out: vec![T::ZERO; act(b)],
                block_out: vec![T::ZERO; act(b)],
                bn_mean: vec![T::ZERO; envs * arch.block_channels(b)],
                bn_inv_std: vec![T::ZERO; envs * arch.block_channels(b)],
                pooled: vec![T::ZERO; pooled(b)],
                argmax: vec![0u8; pooled(b)],
                r0: slot(&bank.r0[b]),
                r1: slot(&bank.r1[b]),
            })
            .collect();
        let max_act = (0..arch.n_blocks).map(act).chain([envs * batch * arch.image_len()]).max().unwrap_or(0);
        Self {
            arch,
            envs,
            batch,
            blocks,
            features: vec![T::ZERO; envs * batch * arch.head_in()],
            logits: vec![T::ZERO; envs * batch * arch.num_classes],
            loss: vec![T::ZERO; envs],
            grad_logits: vec![T::ZERO; envs * batch * arch.num_classes],
            grad_features: vec![T::ZERO; envs * batch * arch.head_in()],
            grad_a: vec![T::ZERO; max_act],
            grad_b: vec![T::ZERO; max_act],
        }
    }

    fn conv_shape(&self, block: usize) -> Conv2dShape {
        let a = &self.arch;
        let size = a.block_size(block);
        Conv2dShape {
            envs: self.envs,
            batch: self.batch,
            c_in: a.block_in_channels(block),
            c_out: a.block_channels(block),
            h: size,
            w: size,
            k: a.kernel_size,
            pad: a.kernel_size / 2,
            groups: 1,
        }
    }

    fn norm_shape(&self, block: usize) -> NormShape {
        let size = self.arch.block_size(block);
        NormShape {
            envs: self.envs,
            batch: self.batch,
            channels: self.arch.block_channels(block),
            h: size,
            w: size,
        }
    }

    fn pool_shape(&self, block: usize) -> PoolShape {
        let size = self.arch.block_size(block);
        PoolShape {
            envs: self.envs,
            batch: self.batch,
            channels: self.arch.block_channels(block),
            h: size,
            w: size,
        }
    }

    fn last_pool_shape(&self) -> PoolShape {
        let last = self.arch.n_blocks - 1;
        let size = self.arch.block_output_size(last);
        PoolShape { envs: self.envs, batch: self.batch, channels: self.arch.head_in(), h: size, w: size }
    }

    fn head_shape(&self) -> LinearShape {
        LinearShape {
            envs: self.envs,
            batch: self.batch,
            in_features: self.arch.head_in(),
            out_features: self.arch.num_classes,
        }
    }

    fn check(&self, params: &HostParams<T>, images: &[T]) {
        assert_eq!(params.arch, self.arch, "workspace and parameters disagree on the architecture");
        assert_eq!(params.n_envs(), self.envs, "workspace and parameters disagree on the env count");
        let expected = self.envs * self.batch * self.arch.image_len();
        assert_eq!(images.len(), expected, "images must be [E, B, C, H, W]");
    }

    /// Training forward (batch statistics; running statistics updated) through the loss: per-env mean
    /// cross-entropy in `self.loss`, `∂loss/∂logits` kept for [`Self::backward`].
    pub fn forward_train<L: Copy + Into<usize> + Sync>(
        &mut self,
        params: &mut HostParams<T>,
        bank: &SeedBank<T>,
        images: &[T],
        labels: &[L],
    ) {
        self.check(params, images);
        for b in 0..self.arch.n_blocks {
            let w = &params.weights.tensors;
            let (conv_w, gamma, beta) = (&w[3 * b], &w[3 * b + 1], &w[3 * b + 2]);
            let (mean, var) = (&mut params.running_mean[b], &mut params.running_var[b]);
            let normalize = |norm, z: &[T], y: &mut [T], m: &mut [T], s: &mut [T]| {
                ops::batch_norm_train_forward(norm, z, gamma, beta, y, m, s, mean, var)
            };
            self.block_forward(b, images, conv_w, normalize, bank, true);
        }
        self.head_forward(params);
        let shape = ClassifierShape { envs: self.envs, batch: self.batch, classes: self.arch.num_classes };
        ops::softmax_cross_entropy(
            shape,
            &self.logits,
            labels,
            &mut self.loss,
            Some(&mut self.grad_logits[..]),
        );
    }

    /// Evaluation forward (running statistics, blends as configured, nothing kept for a backward):
    /// logits in `self.logits`.
    pub fn forward_eval(&mut self, params: &HostParams<T>, bank: &SeedBank<T>, images: &[T]) {
        self.check(params, images);
        for b in 0..self.arch.n_blocks {
            let (gamma, beta) = (params.gamma(b), params.beta(b));
            let (mean, var) = (&params.running_mean[b], &params.running_var[b]);
            let normalize = |norm, z: &[T], y: &mut [T], _: &mut [T], _: &mut [T]| {
                ops::batch_norm_eval_forward(norm, z, gamma, beta, mean, var, y)
            };
            self.block_forward(b, images, params.conv(b), normalize, bank, false);
        }
        self.head_forward(params);
    }

    /// conv → batch norm (`normalize`, train or eval) → ReLU → slot r0 → pool → slot r1 for block `b`.
    fn block_forward(
        &mut self,
        b: usize,
        images: &[T],
        conv_weight: &[T],
        normalize: impl FnOnce(NormShape, &[T], &mut [T], &mut [T], &mut [T]),
        bank: &SeedBank<T>,
        train: bool,
    ) {
        let (conv, norm, pool) = (self.conv_shape(b), self.norm_shape(b), self.pool_shape(b));
        let arch = self.arch;
        let (done, rest) = self.blocks.split_at_mut(b);
        let input = match done.last() {
            Some(prev) => prev.final_output(arch.pools_after(b - 1)),
            None => images,
        };
        let cur = &mut rest[0];
        ops::conv2d_forward(conv, input, conv_weight, &mut cur.conv_out);
        normalize(norm, &cur.conv_out, &mut cur.block_out, &mut cur.bn_mean, &mut cur.bn_inv_std);
        ops::relu_forward_in_place(&mut cur.block_out);
        if let (Some(ws), Some(p)) = (&mut cur.r0, &bank.r0[b]) {
            ws.forward(p, &cur.block_out, train);
        }
        if arch.pools_after(b) {
            let pool_in = match &cur.r0 {
                Some(s) if s.active => &s.out,
                _ => &cur.block_out,
            };
            ops::max_pool2x2_forward(pool, pool_in, &mut cur.pooled, &mut cur.argmax);
            if let (Some(ws), Some(p)) = (&mut cur.r1, &bank.r1[b]) {
                ws.forward(p, &cur.pooled, train);
            }
        }
    }

    fn head_forward(&mut self, params: &HostParams<T>) {
        let (pool, head) = (self.last_pool_shape(), self.head_shape());
        let last = self.arch.n_blocks - 1;
        let out = self.blocks[last].final_output(self.arch.pools_after(last));
        ops::global_avg_pool_forward(pool, out, &mut self.features);
        ops::linear_forward(
            head,
            &self.features,
            params.head_weight(),
            Some(params.head_bias()),
            &mut self.logits,
        );
    }

    /// Backward of the last [`Self::forward_train`]: every host parameter gradient overwritten into
    /// `grads`, and the seed/gate gradients of every active slot into `bank`'s pools.
    pub fn backward(
        &mut self,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        images: &[T],
        grads: &mut Stacked<T>,
    ) {
        self.check(params, images);
        let n = self.arch.n_blocks;
        let head = 3 * n;
        let g = &mut grads.tensors;
        let (head_w, head_b) = g[head..].split_at_mut(1);
        let hs = self.head_shape();
        ops::linear_backward_params(
            hs,
            &self.features,
            &self.grad_logits,
            &mut head_w[0],
            Some(&mut head_b[0]),
        );
        ops::linear_backward_input(hs, &self.grad_logits, params.head_weight(), &mut self.grad_features);
        // `grad_a` holds ∂L/∂(current activation); `grad_b` is scratch for the next one down.
        let last_len = self.blocks[n - 1].final_output(self.arch.pools_after(n - 1)).len();
        ops::global_avg_pool_backward(
            self.last_pool_shape(),
            &self.grad_features,
            &mut self.grad_a[..last_len],
        );
        for b in (0..n).rev() {
            let (conv, norm, pool) = (self.conv_shape(b), self.norm_shape(b), self.pool_shape(b));
            let arch = self.arch;
            let (done, rest) = self.blocks.split_at_mut(b);
            let cur = &mut rest[0];
            let act_len = cur.block_out.len();
            if arch.pools_after(b) {
                let pooled_len = cur.pooled.len();
                if let (Some(ws), Some(p)) = (&mut cur.r1, &mut bank.r1[b])
                    && ws.active
                {
                    ws.backward(p, &self.grad_a[..pooled_len], &mut self.grad_b[..pooled_len]);
                    std::mem::swap(&mut self.grad_a, &mut self.grad_b);
                }
                let (dy, dx) = (&self.grad_a[..pooled_len], &mut self.grad_b[..act_len]);
                ops::max_pool2x2_backward(pool, dy, &cur.argmax, dx);
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            if let (Some(ws), Some(p)) = (&mut cur.r0, &mut bank.r0[b])
                && ws.active
            {
                ws.backward(p, &self.grad_a[..act_len], &mut self.grad_b[..act_len]);
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            ops::relu_backward_in_place(&cur.block_out, &mut self.grad_a[..act_len]);
            let (conv_w, bn) = g[3 * b..3 * b + 3].split_at_mut(1);
            let (gamma_grad, beta_grad) = bn.split_at_mut(1);
            ops::batch_norm_backward(
                norm,
                &cur.conv_out,
                params.gamma(b),
                &cur.bn_mean,
                &cur.bn_inv_std,
                &self.grad_a[..act_len],
                &mut self.grad_b[..act_len],
                &mut gamma_grad[0],
                &mut beta_grad[0],
            );
            let input = match done.last() {
                Some(prev) => prev.final_output(arch.pools_after(b - 1)),
                None => images,
            };
            ops::conv2d_backward_weight(conv, input, &self.grad_b[..act_len], &mut conv_w[0]);
            if b > 0 {
                let grad_in = &mut self.grad_a[..input.len()];
                ops::conv2d_backward_input(conv, &self.grad_b[..act_len], params.conv(b), grad_in);
            }
        }
    }
}
