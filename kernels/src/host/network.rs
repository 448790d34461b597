//! The batched host network: a static layer sequence whose forward keeps what the backward needs in
//! preallocated buffers and whose backward walks the same sequence in reverse. Every op runs once per
//! layer over all envs (the env is a parallel dimension inside the op). Seed slots sit after a block's
//! ReLU (row 0) and after its pool (row 1); a slot with no active seed in any env is skipped. A block with
//! a pool and no active seed at its row-0 slot runs batch norm → ReLU → pool fused ([`ops::fused`]); the
//! op-by-op path it takes otherwise gives every env the same bits.

use super::arch::HostArch;
use super::params::{HostParams, Stacked};
use super::seed_bank::{SeedBank, SlotParams};
use super::slot::{SlotOutputGrad, SlotWorkspace};
use crate::ops::fused::BlockNormGrad;
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
    /// The max-pool's winner per window; after a fused forward, the fused code (see [`ops::fused`]).
    argmax: Vec<u8>,
    /// Per-plane `(mean, M2)` of `conv_out` (`[E, B, C, 2]`): the batch statistics' source.
    plane_stats: Vec<T>,
    /// Fused path: each window's winning `conv_out` value (pooled-size); empty without a pool.
    winner: Vec<T>,
    /// The last forward took the fused batch norm → ReLU → pool path in every env (`block_out` was not
    /// written).
    fused: bool,
    /// `[E]`: the env took the fused path in the last forward. Envs whose seed at slot r0 is active take
    /// the op-by-op path, the others stay fused: `mixed` when both kinds ran.
    fused_envs: Vec<bool>,
    mixed: bool,
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
    /// Per env, the host's share of an all-ADD slot r0's output gradient (`[E]`, scratch for the backward).
    host_shares: Vec<T>,
    /// Run batch norm → ReLU → pool fused where a block allows it (the default).
    fuse: bool,
}

impl<T: Real> HostWorkspace<T> {
    /// A workspace for the plain host (no slots).
    pub fn new(arch: HostArch, envs: usize, batch: usize) -> Self {
        Self::with_slots(arch, envs, batch, &SeedBank::<T>::empty(&arch))
    }

    /// A workspace with a slot workspace for every enabled slot of `bank`.
    pub fn with_slots(arch: HostArch, envs: usize, batch: usize, bank: &SeedBank<T>) -> Self {
        let act = |b: usize| envs * batch * arch.block_channels(b) * arch.block_size(b).pow(2);
        let pooled = |b: usize| {
            let out = arch.block_output_size(b);
            if arch.pools_after(b) { envs * batch * arch.block_channels(b) * out * out } else { 0 }
        };
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
                plane_stats: vec![T::ZERO; 2 * envs * batch * arch.block_channels(b)],
                winner: vec![T::ZERO; pooled(b)],
                fused: false,
                fused_envs: vec![false; envs],
                mixed: false,
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
            host_shares: vec![T::ZERO; envs],
            fuse: true,
        }
    }

    /// Whether blocks may run batch norm → ReLU → pool fused (default true). Off, every block runs op by
    /// op, as the reference the tests compare the fused path with.
    pub fn set_fusion(&mut self, fuse: bool) {
        self.fuse = fuse;
    }

    fn conv_shape(&self, block: usize) -> Conv2dShape {
        self.arch.block_conv(block, self.envs, self.batch)
    }

    fn norm_shape(&self, block: usize) -> NormShape {
        self.arch.block_norm(block, self.envs, self.batch)
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
            let input = (b == 0).then_some(images);
            self.block_forward(b, input, conv_w, Norm::Train { gamma, beta, mean, var }, bank);
        }
        self.head_forward(params, None);
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
        self.eval_blocks_from(0, Some(images), params, bank);
    }

    /// Evaluation forward from a slot on, given the host activation `h` there (`[E, B, C, H, W]`; None: this
    /// workspace's own activation there, from its last forward, which must have kept it for every env —
    /// see [`Self::slot_input`]) and with that slot's seed off in every env: block `block`'s slot at `row`
    /// passes `h` through, the rest of the network runs as [`Self::forward_eval`] would. What an env gets
    /// is bit for bit what a full evaluation forward with that slot off gives it, when `h` is that
    /// forward's activation there — the same up to the slot whenever every slot before it is configured
    /// alike.
    pub fn forward_eval_from_slot(
        &mut self,
        block: usize,
        row: u8,
        h: Option<&[T]>,
        params: &HostParams<T>,
        bank: &SeedBank<T>,
    ) {
        assert_eq!(params.arch, self.arch, "workspace and parameters disagree on the architecture");
        assert_eq!(params.n_envs(), self.envs, "workspace and parameters disagree on the env count");
        let pools = self.arch.pools_after(block);
        assert!(row == 0 || pools, "slot r1 of block {block}: the block has no pool");
        let off = |p: &Option<SlotParams<T>>| p.as_ref().is_none_or(|p| !p.any_active_in(false));
        let slot = if row == 0 { &bank.r0[block] } else { &bank.r1[block] };
        assert!(off(slot), "the slot a forward starts from must be off in every env");
        let cur = &mut self.blocks[block];
        if h.is_none() && row == 0 {
            assert!(
                !cur.fused && !cur.mixed,
                "block {block} ran fused in some env: its ReLU output was not kept"
            );
        }
        // The slot is off: what the block hands on is the activation at the slot.
        for slot in [&mut cur.r0, &mut cur.r1].into_iter().skip(usize::from(row)).flatten() {
            slot.active = false;
        }
        if row == 0 && pools {
            let shape = self.pool_shape(block);
            let cur = &mut self.blocks[block];
            let h = h.unwrap_or(&cur.block_out);
            assert_eq!(h.len(), cur.block_out.len(), "slot input must be [E, B, C, H, W]");
            ops::max_pool2x2_forward(shape, h, &mut cur.pooled, &mut cur.argmax);
            // The block's own activations were not computed: nothing of it ran fused.
            cur.fused = false;
            cur.mixed = false;
            cur.fused_envs.fill(false);
            if let (Some(ws), Some(p)) = (&mut cur.r1, &bank.r1[block]) {
                ws.forward(p, &cur.pooled, false);
            }
            self.eval_blocks_from(block + 1, None, params, bank);
        } else {
            // The slot passes `h`: it is the block's output, the next block's input.
            let cur = &self.blocks[block];
            let len = if row == 0 { cur.block_out.len() } else { cur.pooled.len() };
            if let Some(h) = h {
                assert_eq!(h.len(), len, "slot input must be [E, B, C, H, W]");
            }
            // None: the block's final output is the activation at the slot (its seeds after it are idle).
            self.eval_blocks_from(block + 1, h, params, bank);
        }
    }

    /// The host activation at block `block`'s slot `row` of the last evaluation forward: the ReLU output
    /// (row 0; the block must not have run fused) or the pooled output (row 1). In a block that ran
    /// mixed, row 0 is valid only for the envs whose seed at the slot ran (the others took the fused
    /// path and their rows are stale): a caller reads only those envs' rows.
    pub fn slot_input(&self, block: usize, row: u8) -> &[T] {
        let cur = &self.blocks[block];
        if row == 0 {
            assert!(!cur.fused, "block {block} ran fused: its ReLU output was not kept");
            &cur.block_out
        } else {
            &cur.pooled
        }
    }

    /// Eval blocks `first..` — block `first` reading `input`, or the previous block's output when None
    /// (`first == n_blocks`: `input` is the last block's output) — then the head.
    fn eval_blocks_from(
        &mut self,
        first: usize,
        input: Option<&[T]>,
        params: &HostParams<T>,
        bank: &SeedBank<T>,
    ) {
        for b in first..self.arch.n_blocks {
            let (gamma, beta) = (params.gamma(b), params.beta(b));
            let (mean, var) = (&params.running_mean[b], &params.running_var[b]);
            let block_input = if b == first { input } else { None };
            self.block_forward(b, block_input, params.conv(b), Norm::Eval { gamma, beta, mean, var }, bank);
        }
        self.head_forward(params, if first == self.arch.n_blocks { input } else { None });
    }

    /// conv → batch norm (train or eval) → ReLU → slot r0 → pool → slot r1 for block `b`, reading `input`
    /// (the images, or an activation a forward starts from) or, when None, the previous block's output.
    /// With a pool, the envs without an active seed at slot r0 run batch norm, ReLU and pool fused (see
    /// [`ops::fused`]).
    fn block_forward(
        &mut self,
        b: usize,
        input: Option<&[T]>,
        conv_weight: &[T],
        norm: Norm<'_, T>,
        bank: &SeedBank<T>,
    ) {
        let (conv, shape, pool) = (self.conv_shape(b), self.norm_shape(b), self.pool_shape(b));
        let arch = self.arch;
        let train = matches!(norm, Norm::Train { .. });
        let fuse = self.fuse;
        let (done, rest) = self.blocks.split_at_mut(b);
        let input = input.unwrap_or_else(|| {
            let prev = done.last().expect("block 0 reads the images");
            prev.final_output(arch.pools_after(b - 1))
        });
        let cur = &mut rest[0];
        // An env runs fused unless its own seed at slot r0 takes part in this forward.
        let pools = arch.pools_after(b);
        match (&cur.r0, &bank.r0[b]) {
            (Some(_), Some(p)) => {
                for (f, st) in cur.fused_envs.iter_mut().zip(&p.state) {
                    *f = fuse && pools && !st.mode.runs_in(train);
                }
            }
            _ => cur.fused_envs.fill(fuse && pools),
        }
        cur.fused = cur.fused_envs.iter().all(|&f| f);
        cur.mixed = !cur.fused && cur.fused_envs.iter().any(|&f| f);
        // Training also takes each output plane's statistics while the conv has it in cache.
        if train {
            ops::conv2d_forward_with_plane_stats(
                conv,
                input,
                conv_weight,
                &mut cur.conv_out,
                &mut cur.plane_stats,
            );
        } else {
            ops::conv2d_forward(conv, input, conv_weight, &mut cur.conv_out);
        }
        // Fused into `pooled`, or op by op into `block_out` with the same arithmetic: an env gets the same
        // bits either way. One call per run of envs on the same path (one run unless the block is mixed).
        norm_forward(shape, cur, norm);
        if let (Some(ws), Some(p)) = (&mut cur.r0, &bank.r0[b]) {
            // Fused, no env is active: this only records that the slot was skipped (`block_out` is not read).
            // Mixed: the fused envs' rows of the slot's output are never read, so they are not written.
            ws.forward_with(p, &cur.block_out, train, !cur.mixed);
        }
        if arch.pools_after(b) {
            // The fused envs are pooled already; the others pool the slot's output when it ran, else
            // the block's.
            let pool_in = match &cur.r0 {
                Some(s) if s.active => &s.out,
                _ => &cur.block_out,
            };
            let (act, pl) = (cur.block_out.len() / pool.envs, cur.pooled.len() / pool.envs);
            for (r, fused) in env_runs(&cur.fused_envs) {
                if !fused {
                    ops::max_pool2x2_forward(
                        PoolShape { envs: r.len(), ..pool },
                        &pool_in[r.start * act..r.end * act],
                        &mut cur.pooled[r.start * pl..r.end * pl],
                        &mut cur.argmax[r.start * pl..r.end * pl],
                    );
                }
            }
            if let (Some(ws), Some(p)) = (&mut cur.r1, &bank.r1[b]) {
                ws.forward(p, &cur.pooled, train);
            }
        }
    }

    /// Global average pool and the linear head over `input`, or the last block's output when None.
    fn head_forward(&mut self, params: &HostParams<T>, input: Option<&[T]>) {
        let (pool, head) = (self.last_pool_shape(), self.head_shape());
        let last = self.arch.n_blocks - 1;
        let out = input.unwrap_or_else(|| self.blocks[last].final_output(self.arch.pools_after(last)));
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
            let (conv, norm) = (self.conv_shape(b), self.norm_shape(b));
            let arch = self.arch;
            let cur = &mut self.blocks[b];
            let act_len = cur.block_out.len();
            let (conv_w, bn) = g[3 * b..3 * b + 3].split_at_mut(1);
            let (gamma_grad, beta_grad) = bn.split_at_mut(1);
            let pooled_len = cur.pooled.len();
            if arch.pools_after(b)
                && let (Some(ws), Some(p)) = (&mut cur.r1, &mut bank.r1[b])
                && ws.active
            {
                ws.backward(p, &cur.pooled, &self.grad_a[..pooled_len], &mut self.grad_b[..pooled_len]);
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            // A pooled block with at least as many envs as threads: the norm's input gradient goes to the
            // conv's backward an image at a time, per env (same bits, no pass through memory).
            if !cur.mixed && arch.pools_after(b) && self.envs >= rayon::current_num_threads() {
                let (gamma_grad, beta_grad) = (&mut gamma_grad[0], &mut beta_grad[0]);
                self.block_backward_in_runs(b, params, bank, images, &mut conv_w[0], gamma_grad, beta_grad);
                continue;
            }
            // Into `grad_b`: the gradient at the batch norm's input.
            if cur.mixed {
                self.mixed_block_backward(b, params, bank, &mut gamma_grad[0], &mut beta_grad[0]);
            } else if cur.fused {
                ops::batch_norm_relu_max_pool_backward(
                    norm,
                    &cur.conv_out,
                    params.gamma(b),
                    &cur.bn_mean,
                    &cur.bn_inv_std,
                    &self.grad_a[..pooled_len],
                    &cur.argmax,
                    &cur.winner,
                    &mut self.grad_b[..act_len],
                    &mut gamma_grad[0],
                    &mut beta_grad[0],
                );
            } else {
                self.unfused_block_backward(b, params, bank, &mut gamma_grad[0], &mut beta_grad[0]);
            }
            let input = match b {
                0 => images,
                _ => self.blocks[b - 1].final_output(arch.pools_after(b - 1)),
            };
            ops::conv2d_backward_weight(conv, input, &self.grad_b[..act_len], &mut conv_w[0]);
            if b > 0 {
                let grad_in = &mut self.grad_a[..input.len()];
                ops::conv2d_backward_input(conv, &self.grad_b[..act_len], params.conv(b), grad_in);
            }
        }
    }

    /// [`Self::unfused_block_backward`] for a block whose envs ran partly fused: the fused envs' rows
    /// through the fused backward, the others op by op (pool, slot r0, ReLU, batch norm), each run of
    /// consecutive envs as one call. Every env gets the bits it gets when its whole batch takes its path.
    fn mixed_block_backward(
        &mut self,
        b: usize,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        gamma_grad: &mut [T],
        beta_grad: &mut [T],
    ) {
        let (norm, pool) = (self.norm_shape(b), self.pool_shape(b));
        let cur = &mut self.blocks[b];
        let e = norm.envs;
        let (act, pl, c) = (cur.block_out.len() / e, cur.pooled.len() / e, norm.channels);
        let (act_len, pooled_len) = (cur.block_out.len(), cur.pooled.len());
        let (gamma, beta, mean, inv_std) = (params.gamma(b), params.beta(b), &cur.bn_mean, &cur.bn_inv_std);
        {
            let (dy, dx) = (&self.grad_a[..pooled_len], &mut self.grad_b[..act_len]);
            for (r, fused) in env_runs(&cur.fused_envs) {
                let (a, p, k) =
                    (r.start * act..r.end * act, r.start * pl..r.end * pl, r.start * c..r.end * c);
                if fused {
                    ops::batch_norm_relu_max_pool_backward(
                        NormShape { envs: r.len(), ..norm },
                        &cur.conv_out[a.clone()],
                        &gamma[k.clone()],
                        &mean[k.clone()],
                        &inv_std[k.clone()],
                        &dy[p.clone()],
                        &cur.argmax[p.clone()],
                        &cur.winner[p],
                        &mut dx[a],
                        &mut gamma_grad[k.clone()],
                        &mut beta_grad[k],
                    );
                } else {
                    let shape = PoolShape { envs: r.len(), ..pool };
                    ops::max_pool2x2_backward(shape, &dy[p.clone()], &cur.argmax[p], &mut dx[a]);
                }
            }
        }
        // The slot's backward writes the op-by-op envs' rows of `grad_a` (the fused envs' rows of
        // `grad_b` are final).
        let (Some(ws), Some(p)) = (&mut cur.r0, &mut bank.r0[b]) else {
            unreachable!("a mixed block has an active slot r0")
        };
        ws.backward(p, &cur.block_out, &self.grad_b[..act_len], &mut self.grad_a[..act_len]);
        for (r, fused) in env_runs(&cur.fused_envs) {
            if fused {
                continue;
            }
            let (a, k) = (r.start * act..r.end * act, r.start * c..r.end * c);
            // The ReLU's backward is taken inside the norm's (the same bits, one pass fewer).
            ops::relu_batch_norm_backward_window_order(
                NormShape { envs: r.len(), ..norm },
                &cur.conv_out[a.clone()],
                &gamma[k.clone()],
                &beta[k.clone()],
                &mean[k.clone()],
                &inv_std[k.clone()],
                &self.grad_a[a.clone()],
                &mut self.grad_b[a],
                &mut gamma_grad[k.clone()],
                &mut beta_grad[k],
            );
        }
    }

    /// Block `b`'s backward from the gradient below its slot r1 (in `grad_a`) to the gradient at its conv's
    /// input (in `grad_a`, for `b > 0`), for a pooled block that is not mixed: the batch norm's parameter
    /// gradients first (fused; from the pool's output gradient where an all-ADD slot r0 sits before the
    /// pool, after the slot's seed backward; or after the op-by-op pool and slot r0), then per env, a run
    /// of images at a time, the norm's input gradient into scratch and the conv's weight and input
    /// gradients from it while it is in cache ([`ops::conv::conv2d_backward_from_images`]). The same bits
    /// as the norm's backward writing `grad_b` whole and the conv's two ops reading it.
    #[allow(clippy::too_many_arguments)]
    fn block_backward_in_runs(
        &mut self,
        b: usize,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        images: &[T],
        conv_w: &mut [T],
        gamma_grad: &mut [T],
        beta_grad: &mut [T],
    ) {
        let (conv, norm, pool, arch) =
            (self.conv_shape(b), self.norm_shape(b), self.pool_shape(b), self.arch);
        let slot_pooled = !self.blocks[b].fused && self.slot_backward_from_pooled(b, pool, bank);
        if !self.blocks[b].fused && !slot_pooled {
            self.pool_and_slot_backward(b, bank);
        }
        let Self { blocks, grad_a, grad_b, host_shares, .. } = self;
        let cur = &blocks[b];
        let input = match b {
            0 => images,
            _ => blocks[b - 1].final_output(arch.pools_after(b - 1)),
        };
        let grad_input = (b > 0).then(|| &mut grad_b[..input.len()]);
        let (gamma, weight) = (params.gamma(b), params.conv(b));
        let dx = if cur.fused {
            BlockNormGrad::Fused(ops::fused::batch_norm_relu_max_pool_param_grads(
                norm,
                &cur.conv_out,
                gamma,
                &cur.bn_mean,
                &cur.bn_inv_std,
                &grad_a[..cur.pooled.len()],
                &cur.argmax,
                &cur.winner,
                gamma_grad,
                beta_grad,
            ))
        } else if slot_pooled {
            let dy = ops::fused::SlotPooledGrad {
                grad: &grad_a[..cur.pooled.len()],
                argmax: &cur.argmax,
                share: host_shares,
            };
            BlockNormGrad::SlotPooled(ops::fused::relu_batch_norm_param_grads_from_pooled(
                norm,
                &cur.conv_out,
                gamma,
                params.beta(b),
                &cur.bn_mean,
                &cur.bn_inv_std,
                dy,
                gamma_grad,
                beta_grad,
            ))
        } else {
            // The ReLU's backward is taken inside the norm's (the same bits, one pass fewer).
            BlockNormGrad::Whole(ops::fused::window_order_param_grads(
                norm,
                &cur.conv_out,
                gamma,
                Some(params.beta(b)),
                &cur.bn_mean,
                &cur.bn_inv_std,
                &grad_a[..cur.block_out.len()],
                gamma_grad,
                beta_grad,
            ))
        };
        let dy_image = |i: usize, scratch: &mut [T], dy: &mut [T]| dx.write_image(i, scratch, dy);
        let scratch = dx.scratch_len();
        ops::conv::conv2d_backward_from_images(conv, input, weight, conv_w, grad_input, scratch, dy_image);
        if b > 0 {
            std::mem::swap(&mut self.grad_a, &mut self.grad_b);
        }
    }

    /// Where block `b`'s slot r0 has every env blending by ADD in place: its seeds' backward from the pool's
    /// output gradient (`grad_a`), the host's share of it into `host_shares`, and true; the host's gradient
    /// then stays in the pool's terms (no full-size gradient is written for it). False, with nothing run,
    /// for any other slot.
    fn slot_backward_from_pooled(&mut self, b: usize, pool: PoolShape, bank: &mut SeedBank<T>) -> bool {
        let cur = &mut self.blocks[b];
        let (Some(ws), Some(p)) = (&mut cur.r0, &mut bank.r0[b]) else { return false };
        if !ws.takes_pooled_gradient() {
            return false;
        }
        let grad = &self.grad_a[..cur.pooled.len()];
        ws.backward_from(p, &cur.block_out, SlotOutputGrad::Pooled { pool, grad, argmax: &cur.argmax }, None);
        ws.host_shares(&mut self.host_shares);
        true
    }

    /// Block `b`'s op-by-op backward through its pool (if any) and its slot r0 (if active): from the
    /// gradient below its slot r1 (in `grad_a`) to the gradient at its ReLU's output (in `grad_a`).
    fn pool_and_slot_backward(&mut self, b: usize, bank: &mut SeedBank<T>) {
        let (pool, arch) = (self.pool_shape(b), self.arch);
        let cur = &mut self.blocks[b];
        let act_len = cur.block_out.len();
        // A slot whose envs all blend by ADD takes the pool's output gradient itself (the same bits, no
        // full-size gradient between the pool and the blend).
        if arch.pools_after(b)
            && let (Some(ws), Some(p)) = (&mut cur.r0, &mut bank.r0[b])
            && ws.active
            && ws.takes_pooled_gradient()
        {
            let grad =
                SlotOutputGrad::Pooled { pool, grad: &self.grad_a[..cur.pooled.len()], argmax: &cur.argmax };
            ws.backward_from(p, &cur.block_out, grad, Some(&mut self.grad_b[..act_len]));
            std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            return;
        }
        if arch.pools_after(b) {
            let (dy, dx) = (&self.grad_a[..cur.pooled.len()], &mut self.grad_b[..act_len]);
            ops::max_pool2x2_backward(pool, dy, &cur.argmax, dx);
            std::mem::swap(&mut self.grad_a, &mut self.grad_b);
        }
        if let (Some(ws), Some(p)) = (&mut cur.r0, &mut bank.r0[b])
            && ws.active
        {
            ws.backward(p, &cur.block_out, &self.grad_a[..act_len], &mut self.grad_b[..act_len]);
            std::mem::swap(&mut self.grad_a, &mut self.grad_b);
        }
    }

    /// Block `b`'s backward from the gradient below its slot r1 (in `grad_a`) to the gradient at its batch
    /// norm's input (in `grad_b`), op by op: pool, slot r0, ReLU, batch norm.
    fn unfused_block_backward(
        &mut self,
        b: usize,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        gamma_grad: &mut [T],
        beta_grad: &mut [T],
    ) {
        self.pool_and_slot_backward(b, bank);
        let (norm, arch) = (self.norm_shape(b), self.arch);
        let cur = &self.blocks[b];
        let act_len = cur.block_out.len();
        // With a pool, the sums in the fused backward's order (the same bits on either path), the ReLU's
        // backward taken inside the norm's.
        if arch.pools_after(b) {
            ops::relu_batch_norm_backward_window_order(
                norm,
                &cur.conv_out,
                params.gamma(b),
                params.beta(b),
                &cur.bn_mean,
                &cur.bn_inv_std,
                &self.grad_a[..act_len],
                &mut self.grad_b[..act_len],
                gamma_grad,
                beta_grad,
            );
        } else {
            ops::relu_backward_in_place(&cur.block_out, &mut self.grad_a[..act_len]);
            ops::batch_norm_backward(
                norm,
                &cur.conv_out,
                params.gamma(b),
                &cur.bn_mean,
                &cur.bn_inv_std,
                &self.grad_a[..act_len],
                &mut self.grad_b[..act_len],
                gamma_grad,
                beta_grad,
            );
        }
    }
}

/// Maximal runs of consecutive envs with the same flag, in order: `(envs, flag)`.
fn env_runs(flags: &[bool]) -> impl Iterator<Item = (std::ops::Range<usize>, bool)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let &flag = flags.get(start)?;
        let end = start + flags[start..].iter().take_while(|&&f| f == flag).count();
        let run = start..end;
        start = end;
        Some((run, flag))
    })
}

/// A block's batch norm → ReLU (→ pool): each run of consecutive envs on the same path (fused into
/// `pooled`, or op by op into `block_out`) as one call of that path on the run's rows — one call over
/// every env unless the block is mixed.
fn norm_forward<T: Real>(shape: NormShape, cur: &mut BlockActs<T>, norm: Norm<'_, T>) {
    let (e, c) = (shape.envs, shape.channels);
    let (act, pl, st) = (cur.block_out.len() / e, cur.pooled.len() / e, cur.plane_stats.len() / e);
    let rows = |r: &std::ops::Range<usize>| {
        (
            r.start * act..r.end * act,
            r.start * pl..r.end * pl,
            r.start * c..r.end * c,
            r.start * st..r.end * st,
        )
    };
    match norm {
        Norm::Train { gamma, beta, mean, var } => {
            for (r, fused) in env_runs(&cur.fused_envs) {
                let sub = NormShape { envs: r.len(), ..shape };
                let (a, p, k, s) = rows(&r);
                if fused {
                    ops::batch_norm_relu_max_pool_train_forward(
                        sub,
                        &cur.conv_out[a],
                        &cur.plane_stats[s],
                        &gamma[k.clone()],
                        &beta[k.clone()],
                        &mut cur.bn_mean[k.clone()],
                        &mut cur.bn_inv_std[k.clone()],
                        &mut mean[k.clone()],
                        &mut var[k],
                        &mut cur.pooled[p.clone()],
                        &mut cur.argmax[p.clone()],
                        &mut cur.winner[p],
                    );
                } else {
                    ops::batch_norm_relu_train_forward(
                        sub,
                        &cur.conv_out[a.clone()],
                        &cur.plane_stats[s],
                        &gamma[k.clone()],
                        &beta[k.clone()],
                        &mut cur.block_out[a],
                        &mut cur.bn_mean[k.clone()],
                        &mut cur.bn_inv_std[k.clone()],
                        &mut mean[k.clone()],
                        &mut var[k],
                    );
                }
            }
        }
        Norm::Eval { gamma, beta, mean, var } => {
            for (r, fused) in env_runs(&cur.fused_envs) {
                let sub = NormShape { envs: r.len(), ..shape };
                let (a, p, k, _) = rows(&r);
                let (g, b, m, v) = (&gamma[k.clone()], &beta[k.clone()], &mean[k.clone()], &var[k]);
                if fused {
                    ops::batch_norm_relu_max_pool_eval_forward(
                        sub,
                        &cur.conv_out[a],
                        g,
                        b,
                        m,
                        v,
                        &mut cur.pooled[p],
                    );
                } else {
                    ops::batch_norm_relu_eval_forward(
                        sub,
                        &cur.conv_out[a.clone()],
                        g,
                        b,
                        m,
                        v,
                        &mut cur.block_out[a],
                    );
                }
            }
        }
    }
}

/// The batch norm of a block forward: training (batch statistics; running statistics updated) or eval.
enum Norm<'a, T> {
    Train { gamma: &'a [T], beta: &'a [T], mean: &'a mut [T], var: &'a mut [T] },
    Eval { gamma: &'a [T], beta: &'a [T], mean: &'a [T], var: &'a [T] },
}
