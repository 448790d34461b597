//! The batched host network: a static layer sequence whose forward keeps what the backward needs in
//! preallocated buffers and whose backward walks the same sequence in reverse. Every op runs once per
//! layer over all envs (the env is a parallel dimension inside the op).

use super::arch::HostArch;
use super::params::{HostParams, Stacked};
use crate::ops::{self, ClassifierShape, Conv2dShape, LinearShape, NormShape, PoolShape, Real};

/// Activations and gradient scratch for one `(E, B)` run shape, allocated once and reused every step.
#[derive(Clone, Debug)]
pub struct HostWorkspace<T> {
    pub arch: HostArch,
    pub envs: usize,
    pub batch: usize,
    /// Per block: conv output `z` (the batch norm's input).
    conv_out: Vec<Vec<T>>,
    /// Per block: `relu(bn(z))`, the block output before its pool (slot r0c<b>).
    block_out: Vec<Vec<T>>,
    bn_mean: Vec<Vec<T>>,
    bn_inv_std: Vec<Vec<T>>,
    /// Per block: the pooled output (slot r1c<b>); empty for blocks without a pool.
    pooled: Vec<Vec<T>>,
    argmax: Vec<Vec<u8>>,
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
    pub fn new(arch: HostArch, envs: usize, batch: usize) -> Self {
        let act = |b: usize| envs * batch * arch.block_channels(b) * arch.block_size(b).pow(2);
        let blocks = 0..arch.n_blocks;
        let params = |b: usize| vec![T::ZERO; envs * arch.block_channels(b)];
        let pooled = |b: usize| if arch.pools_after(b) { act(b) / 4 } else { 0 };
        let max_act = blocks.clone().map(act).chain([envs * batch * arch.image_len()]).max().unwrap_or(0);
        Self {
            arch,
            envs,
            batch,
            conv_out: blocks.clone().map(|b| vec![T::ZERO; act(b)]).collect(),
            block_out: blocks.clone().map(|b| vec![T::ZERO; act(b)]).collect(),
            bn_mean: blocks.clone().map(params).collect(),
            bn_inv_std: blocks.clone().map(params).collect(),
            pooled: blocks.clone().map(|b| vec![T::ZERO; pooled(b)]).collect(),
            argmax: blocks.map(|b| vec![0u8; pooled(b)]).collect(),
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

    fn classifier_shape(&self) -> ClassifierShape {
        ClassifierShape { envs: self.envs, batch: self.batch, classes: self.arch.num_classes }
    }

    /// Block `block`'s final output (after its pool, if any).
    fn output_of(&self, block: usize) -> &[T] {
        final_output(&self.arch, &self.block_out, &self.pooled, block)
    }

    fn check(&self, params: &HostParams<T>, images: &[T]) {
        assert_eq!(params.arch, self.arch, "workspace and parameters disagree on the architecture");
        assert_eq!(params.n_envs(), self.envs, "workspace and parameters disagree on the env count");
        assert_eq!(
            images.len(),
            self.envs * self.batch * self.arch.image_len(),
            "images must be [E, B, C, H, W]"
        );
    }

    /// Training forward (batch statistics; running statistics updated) through the loss: per-env mean
    /// cross-entropy in `self.loss`, `∂loss/∂logits` kept for [`Self::backward`].
    pub fn forward_train<L: Copy + Into<usize> + Sync>(
        &mut self,
        params: &mut HostParams<T>,
        images: &[T],
        labels: &[L],
    ) {
        self.check(params, images);
        for b in 0..self.arch.n_blocks {
            let w = &params.weights.tensors;
            let (conv_w, gamma, beta) = (&w[3 * b], &w[3 * b + 1], &w[3 * b + 2]);
            let (mean, var) = (&mut params.running_mean[b], &mut params.running_var[b]);
            self.block_forward(
                b,
                images,
                |norm, z, y, ws_mean, ws_inv_std| {
                    ops::batch_norm_train_forward(norm, z, gamma, beta, y, ws_mean, ws_inv_std, mean, var);
                },
                conv_w,
            );
        }
        self.head_forward(params);
        self.loss_forward(labels);
    }

    /// Evaluation forward (running statistics, nothing kept for a backward): logits in `self.logits`.
    pub fn forward_eval(&mut self, params: &HostParams<T>, images: &[T]) {
        self.check(params, images);
        for b in 0..self.arch.n_blocks {
            let (gamma, beta) = (params.gamma(b), params.beta(b));
            let (mean, var) = (&params.running_mean[b], &params.running_var[b]);
            self.block_forward(
                b,
                images,
                |norm, z, y, _, _| {
                    ops::batch_norm_eval_forward(norm, z, gamma, beta, mean, var, y);
                },
                params.conv(b),
            );
        }
        self.head_forward(params);
    }

    /// conv → batch norm (`normalize`, train or eval) → ReLU → pool for block `b`.
    fn block_forward(
        &mut self,
        b: usize,
        images: &[T],
        normalize: impl FnOnce(NormShape, &[T], &mut [T], &mut [T], &mut [T]),
        conv_weight: &[T],
    ) {
        let (conv, norm, pool) = (self.conv_shape(b), self.norm_shape(b), self.pool_shape(b));
        let (done_out, cur_out) = self.block_out.split_at_mut(b);
        let (done_pool, cur_pool) = self.pooled.split_at_mut(b);
        let input = block_input(&self.arch, images, done_out, done_pool, b);
        ops::conv2d_forward(conv, input, conv_weight, &mut self.conv_out[b]);
        let y = &mut cur_out[0];
        normalize(norm, &self.conv_out[b], y, &mut self.bn_mean[b], &mut self.bn_inv_std[b]);
        ops::relu_forward_in_place(y);
        if self.arch.pools_after(b) {
            ops::max_pool2x2_forward(pool, y, &mut cur_pool[0], &mut self.argmax[b]);
        }
    }

    fn head_forward(&mut self, params: &HostParams<T>) {
        let (pool, head) = (self.last_pool_shape(), self.head_shape());
        let last = final_output(&self.arch, &self.block_out, &self.pooled, self.arch.n_blocks - 1);
        ops::global_avg_pool_forward(pool, last, &mut self.features);
        ops::linear_forward(
            head,
            &self.features,
            params.head_weight(),
            Some(params.head_bias()),
            &mut self.logits,
        );
    }

    fn loss_forward<L: Copy + Into<usize> + Sync>(&mut self, labels: &[L]) {
        let shape = self.classifier_shape();
        ops::softmax_cross_entropy(
            shape,
            &self.logits,
            labels,
            &mut self.loss,
            Some(&mut self.grad_logits[..]),
        );
    }

    /// Backward of the last [`Self::forward_train`]: every parameter gradient, overwritten into `grads`.
    pub fn backward(&mut self, params: &HostParams<T>, images: &[T], grads: &mut Stacked<T>) {
        self.check(params, images);
        let n = self.arch.n_blocks;
        let head = 3 * n;
        let g = &mut grads.tensors;
        let (head_w, rest) = g[head..].split_at_mut(1);
        ops::linear_backward_params(
            self.head_shape(),
            &self.features,
            &self.grad_logits,
            &mut head_w[0],
            Some(&mut rest[0]),
        );
        ops::linear_backward_input(
            self.head_shape(),
            &self.grad_logits,
            params.head_weight(),
            &mut self.grad_features,
        );
        // `grad_a` holds ∂L/∂(current activation); `grad_b` is scratch for the next one down.
        let last_len = self.output_of(n - 1).len();
        ops::global_avg_pool_backward(
            self.last_pool_shape(),
            &self.grad_features,
            &mut self.grad_a[..last_len],
        );
        for b in (0..n).rev() {
            let act_len = self.block_out[b].len();
            if self.arch.pools_after(b) {
                let pooled_len = self.pooled[b].len();
                ops::max_pool2x2_backward(
                    self.pool_shape(b),
                    &self.grad_a[..pooled_len],
                    &self.argmax[b],
                    &mut self.grad_b[..act_len],
                );
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            ops::relu_backward_in_place(&self.block_out[b], &mut self.grad_a[..act_len]);
            let (conv_w, bn) = g[3 * b..3 * b + 3].split_at_mut(1);
            let (gamma_grad, beta_grad) = bn.split_at_mut(1);
            ops::batch_norm_backward(
                self.norm_shape(b),
                &self.conv_out[b],
                params.gamma(b),
                &self.bn_mean[b],
                &self.bn_inv_std[b],
                &self.grad_a[..act_len],
                &mut self.grad_b[..act_len],
                &mut gamma_grad[0],
                &mut beta_grad[0],
            );
            let conv = self.conv_shape(b);
            let input = block_input(&self.arch, images, &self.block_out, &self.pooled, b);
            ops::conv2d_backward_weight(conv, input, &self.grad_b[..act_len], &mut conv_w[0]);
            if b > 0 {
                ops::conv2d_backward_input(
                    conv,
                    &self.grad_b[..act_len],
                    params.conv(b),
                    &mut self.grad_a[..input.len()],
                );
            }
        }
    }
}

/// Block `block`'s final output (after its pool, if any), borrowed from the workspace's fields.
fn final_output<'a, T>(
    arch: &HostArch,
    block_out: &'a [Vec<T>],
    pooled: &'a [Vec<T>],
    block: usize,
) -> &'a [T] {
    if arch.pools_after(block) { &pooled[block] } else { &block_out[block] }
}

/// Block `block`'s input: the images for block 0, else the previous block's final output.
fn block_input<'a, T>(
    arch: &HostArch,
    images: &'a [T],
    block_out: &'a [Vec<T>],
    pooled: &'a [Vec<T>],
    block: usize,
) -> &'a [T] {
    if block == 0 { images } else { final_output(arch, block_out, pooled, block - 1) }
}
