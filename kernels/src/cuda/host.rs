//! The seedless host network on the device: the first piece of the CUDA `HostBackend` (issue 16). It
//! composes the kernels that [`super::parity`] checks one by one — the convolutions as cuBLAS GEMMs
//! ([`GemmConv`]), batch norm (training statistics or the running ones) with the ReLU, 2×2 max pool, global average pool, linear head, cross-entropy,
//! their backwards, per-env clipping and SGD with momentum — over env-stacked parameters, gradients and
//! momentum resident on the device. The selftest checks the evaluation forward against
//! [`HostWorkspace::forward_eval`](crate::host::HostWorkspace::forward_eval) and two training steps
//! against [`Trainer::step`](crate::host::Trainer::step) on the same inputs. Seeds and validation
//! plans come next.
//!
//! Nothing is copied back within a step: the losses, gradient norms and parameters stay on the device
//! until [`DeviceHost::losses`], [`DeviceHost::grad_norms`] or [`DeviceHost::download`] asks for them.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::gemm_conv::{BatchNormGrad, GemmConv, stats_runs};
use super::ops;
use super::parity::{Device, ParityError, elementwise, per_env_block};
use super::seed_module::DeviceSeedShape;
use super::slot::{DeviceSlot, SlotGrad};
use crate::host::{HostArch, HostParams};
use crate::ops::Conv2dShape;
use crate::optim::SgdConfig;
use crate::seeds::CnnBlueprint;
use crate::seeds::SeedShape;

/// Blocks per env of the first stage of the per-env squared norms (`sq_norms_partial_f32`).
const NORM_BLOCKS_PER_ENV: u32 = 32;

/// Block `b`'s running statistics and activations on the device.
struct DeviceBlock {
    running_mean: CudaSlice<f32>,
    running_var: CudaSlice<f32>,
    /// This batch's statistics per (env, channel) (training forward).
    save_mean: CudaSlice<f32>,
    save_inv_std: CudaSlice<f32>,
    /// The conv's output `[E, B, C, H, W]`.
    conv_out: CudaSlice<f32>,
    /// Batch norm → ReLU, `[E, B, C, H, W]`.
    act: CudaSlice<f32>,
    /// The 2×2 max pool of the slot r0's output and its winners (blocks that pool).
    pooled: Option<(CudaSlice<f32>, CudaSlice<u8>)>,
    /// The seeds after the ReLU (r0, before the pool) and after the pool (r1), when enabled, and
    /// whether each took part in the last forward (else its output is its input).
    r0: Option<DeviceSlot>,
    r1: Option<DeviceSlot>,
    r0_ran: bool,
    r1_ran: bool,
}

impl DeviceBlock {
    /// Whether the block pools `size × size` planes in whole 2×2 windows: where the pool can run inside
    /// the pass before it (batch norm's, or an r0 slot's blend) and its backward inside the pass after.
    fn pools_whole_windows(&self, size: u32) -> bool {
        self.pooled.is_some() && size.is_multiple_of(2)
    }

    /// The block's output where it does not pool: slot r0's output, or the ReLU's. (Where the block
    /// pools, a slot's fused forward may leave its output unwritten: see `DeviceSlot::forward`.)
    fn r0_output(&self) -> &CudaSlice<f32> {
        debug_assert!(self.pooled.is_none(), "a pooling block's output is its pool's");
        match (&self.r0, self.r0_ran) {
            (Some(slot), true) => &slot.out,
            _ => &self.act,
        }
    }

    /// What the next block (or the global pool) reads: conv → BN → ReLU → r0 → pool → r1.
    fn output(&self) -> &CudaSlice<f32> {
        match (&self.r1, self.r1_ran, &self.pooled) {
            (Some(slot), true, _) => &slot.out,
            (_, _, Some((pooled, _))) => pooled,
            _ => self.r0_output(),
        }
    }
}

/// Which forward a block runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Batch statistics, every seed not off.
    Train,
    /// Running statistics, the blending seeds with validation pass `k`'s selection.
    Eval(usize),
}

/// Where a host block's backward computes batch norm's input gradient as its convolution's kernels load
/// it instead of writing it (`ESPER_CUDA_BN_ON_LOAD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NormGradOnLoad {
    /// Nowhere (`0`).
    Never,
    /// The default: where each value is loaded exactly once — the first block (no input gradient) whose
    /// square tensor-core weight gradient takes all its channels in one block
    /// ([`GemmConv::reads_norm_grad_once`]), from the pool's gradient: the write and the read back of
    /// the block's largest activation saved (at W16 268 MB each a training batch), for two gathers a
    /// pixel pair in the weight gradient. Built in a session without a device.
    Once,
    /// Wherever a staged kernel runs the convolution (`1`): each value is then computed once per
    /// output group and input chunk of the weight gradient and the input gradient, which on an H200
    /// was slower than the write (W16 at TF32: 41.6 against 37.2 ms a step bare, 106.3 against 103.3
    /// with seeds; a gather per value where the staging otherwise reads four values at once).
    Always,
}

impl NormGradOnLoad {
    fn from_setting(value: Option<&str>) -> Self {
        match value {
            Some("1") => Self::Always,
            Some("0") => Self::Never,
            _ => Self::Once,
        }
    }
}

/// An env-stacked host on the device for one `(E, B)`: parameters (in [`HostParams`]' tensor order:
/// per block conv, γ, β, then the head's weight and bias), their gradients and momentum, running
/// statistics and activations.
pub struct DeviceHost {
    arch: HostArch,
    envs: usize,
    /// The images per env every launch runs over: `capacity`, or fewer for an evaluation forward of a
    /// short test batch ([`Self::set_rows`]).
    batch: usize,
    /// The images per env the buffers hold.
    capacity: usize,
    blocks: Vec<DeviceBlock>,
    /// The convolutions, as GEMMs.
    conv: GemmConv,
    /// Where no seed runs at a block's r0 slot: batch norm's normalisation, the ReLU and the pool in one
    /// pass (`batch_norm_relu_pool_f32`). In every block's backward: batch norm's output gradient never
    /// written — the ReLU's backward (and the pool's, where no seed runs at r0) recomputed, the ReLU's
    /// mask from the norm's input, by the pass that sums dγ and dβ (`relu_bn_backward_partial_f32`) and
    /// by the one that writes the input gradient (`batch_norm_backward_input_from_f32`). The same bits as
    /// the kernels one by one. Where a seed runs at r0 before the block's pool: the pool in the slot's
    /// blend (`DeviceSlot::forward`'s `pooled`), the slot's output never written. Off with
    /// `ESPER_CUDA_FUSE=0` (to measure the gain) or [`Self::set_fuse`].
    fuse: bool,
    /// With `fuse`, where a staged 3×3 kernel runs a block's convolution: whether its backwards compute
    /// batch norm's input gradient as they load it ([`GemmConv::reads_norm_grad`]) instead of reading it
    /// written by `batch_norm_backward_input_from_f32`. The same bits either way.
    norm_grad_on_load: NormGradOnLoad,
    params: Vec<CudaSlice<f32>>,
    grads: Vec<CudaSlice<f32>>,
    momentum: Vec<CudaSlice<f32>>,
    features: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    correct: CudaSlice<u32>,
    /// Per env: the training batch's mean cross-entropy.
    loss: CudaSlice<f32>,
    grad_logits: CudaSlice<f32>,
    grad_features: CudaSlice<f32>,
    /// Two gradient buffers as large as the largest activation, used in turn down the network.
    grad_a: CudaSlice<f32>,
    grad_b: CudaSlice<f32>,
    /// Per env: the first stage of the squared gradient norm, the norm's square and the clip factor.
    norm_partial: CudaSlice<f64>,
    /// Batch norm's reductions' partial sums, for the largest block.
    bn_partial: CudaSlice<f64>,
    /// Batch norm's training statistics as a tensor-core convolution's epilogue sums them
    /// ([`GemmConv::forward_with_stats`]), for the largest block that can.
    conv_stats: CudaSlice<f64>,
    /// Batch norm's input-gradient coefficients per (env, channel) ([`ops::BN_COEF`] each), for the
    /// widest block.
    bn_coef: CudaSlice<f32>,
    sq_norms: CudaSlice<f64>,
    clip: CudaSlice<f64>,
    /// Per env: the squared host gradient norm of the last collection batch (the seed/host ratio's).
    sq_norms_collected: CudaSlice<f64>,
    /// Every env trains its host every step.
    all_envs: CudaSlice<u8>,
    sgd: SgdConfig,
}

impl DeviceHost {
    /// Uploads `params` (its running statistics too), zero momentum, and allocates the activations and
    /// gradients of `batch` images per env, and a [`DeviceSlot`] at each enabled slot `(row, col)` of
    /// `slot_ids` (every seed off).
    pub fn upload(
        device: &Device,
        params: &HostParams<f32>,
        slot_ids: &[(u8, u8)],
        batch: usize,
    ) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let (arch, envs) = (params.arch, params.n_envs());
        let mut blocks = Vec::with_capacity(arch.n_blocks);
        let mut largest = 0;
        let mut conv_dims_all: Vec<Conv2dShape> = Vec::new();
        for b in 0..arch.n_blocks {
            let size = arch.block_size(b);
            let act = envs * batch * arch.block_channels(b) * size * size;
            largest = largest.max(act).max(envs * batch * arch.block_in_channels(b) * size * size);
            let pooled = match arch.pools_after(b) {
                // Floor mode: an odd row or column is dropped.
                true => {
                    let windows = envs * batch * arch.block_channels(b) * (size / 2) * (size / 2);
                    Some((stream.alloc_zeros::<f32>(windows)?, stream.alloc_zeros::<u8>(windows)?))
                }
                false => None,
            };
            let stats = envs * arch.block_channels(b);
            let mut slot = |row: u8, size: usize| -> Result<Option<DeviceSlot>, ParityError> {
                if !slot_ids.contains(&(row, b as u8)) {
                    return Ok(None);
                }
                assert!(row == 0 || arch.pools_after(b), "slot r1c{b}: block {b} has no pool");
                let dims = SeedShape { envs, batch, channels: arch.block_channels(b), h: size, w: size };
                for bp in CnnBlueprint::ALL {
                    conv_dims_all.extend(dims.convs(bp));
                }
                Ok(Some(DeviceSlot::new(device, dims)?))
            };
            let (r0, r1) = (slot(0, size)?, slot(1, size / 2)?);
            blocks.push(DeviceBlock {
                running_mean: stream.clone_htod(&params.running_mean[b])?,
                running_var: stream.clone_htod(&params.running_var[b])?,
                save_mean: stream.alloc_zeros::<f32>(stats)?,
                save_inv_std: stream.alloc_zeros::<f32>(stats)?,
                conv_out: stream.alloc_zeros::<f32>(act)?,
                act: stream.alloc_zeros::<f32>(act)?,
                pooled,
                r0,
                r1,
                r0_ran: false,
                r1_ran: false,
            });
        }
        let tensors = &params.weights.tensors;
        let mut device_params = Vec::with_capacity(tensors.len());
        let (mut grads, mut momentum) =
            (Vec::with_capacity(tensors.len()), Vec::with_capacity(tensors.len()));
        for t in tensors {
            device_params.push(stream.clone_htod(t)?);
            grads.push(stream.alloc_zeros::<f32>(t.len())?);
            momentum.push(stream.alloc_zeros::<f32>(t.len())?);
        }
        let samples = envs * batch;
        let bn_partial =
            (0..arch.n_blocks).map(|b| ops::batch_norm_partial_len(&arch.block_norm(b, envs, batch))).max();
        let widest = (0..arch.n_blocks).map(|b| arch.block_channels(b)).max().unwrap_or(0);
        let conv_stats = (0..arch.n_blocks)
            .map(|b| arch.block_conv(b, envs, batch))
            .filter(Conv2dShape::fits_staged_3x3)
            .map(|d| d.envs * d.c_out * stats_runs(&d).0 * 3)
            .max();
        conv_dims_all.extend((0..arch.n_blocks).map(|b| arch.block_conv(b, envs, batch)));
        Ok(Self {
            arch,
            envs,
            batch,
            capacity: batch,
            fuse: std::env::var("ESPER_CUDA_FUSE").map_or(true, |v| v != "0"),
            norm_grad_on_load: NormGradOnLoad::from_setting(
                std::env::var("ESPER_CUDA_BN_ON_LOAD").ok().as_deref(),
            ),
            blocks,
            conv: GemmConv::new(device, &conv_dims_all)?,
            params: device_params,
            grads,
            momentum,
            features: stream.alloc_zeros::<f32>(samples * arch.head_in())?,
            logits: stream.alloc_zeros::<f32>(samples * arch.num_classes)?,
            correct: stream.alloc_zeros::<u32>(envs)?,
            loss: stream.alloc_zeros::<f32>(envs)?,
            grad_logits: stream.alloc_zeros::<f32>(samples * arch.num_classes)?,
            grad_features: stream.alloc_zeros::<f32>(samples * arch.head_in())?,
            grad_a: stream.alloc_zeros::<f32>(largest)?,
            grad_b: stream.alloc_zeros::<f32>(largest)?,
            norm_partial: stream.alloc_zeros::<f64>(envs * NORM_BLOCKS_PER_ENV as usize)?,
            bn_partial: stream.alloc_zeros::<f64>(bn_partial.unwrap_or(0).max(1))?,
            bn_coef: stream.alloc_zeros::<f32>(envs * widest.max(1) * ops::BN_COEF)?,
            conv_stats: stream.alloc_zeros::<f64>(conv_stats.unwrap_or(0).max(1))?,
            sq_norms: stream.alloc_zeros::<f64>(envs)?,
            clip: stream.alloc_zeros::<f64>(envs)?,
            sq_norms_collected: stream.alloc_zeros::<f64>(envs)?,
            all_envs: stream.clone_htod(&vec![1u8; envs])?,
            sgd: SgdConfig::HOST,
        })
    }

    fn check_batch(&self, images: &CudaSlice<f32>, labels: &CudaSlice<u8>) {
        assert_eq!(
            images.len(),
            self.envs * self.capacity * self.arch.image_len(),
            "device images [E, B, C, H, W]"
        );
        assert_eq!(labels.len(), self.envs * self.capacity, "device labels [E, B]");
    }

    /// Fuses the normalisation, ReLU and pool where no r0 seed runs and batch norm's backward (`on`,
    /// [`Self::fuse`]'s passes), or runs them one by one.
    pub fn set_fuse(&mut self, on: bool) {
        self.fuse = on;
    }

    /// Runs the 3×3 convolutions at f32 on the direct kernels (`on`, as `ESPER_CUDA_CONV=direct`) or the
    /// implicit GEMM: the selftest's way to the staged kernels' paths at f32, where they give the same
    /// bits as the kernels one by one.
    pub(super) fn set_direct_conv(&mut self, on: bool) {
        self.conv.set_direct(on);
    }

    /// Runs the launches that follow over the first `rows` images per env (`[E, rows, …]` packed densely
    /// at the start of every buffer), up to the batch the buffers hold: an evaluation forward of a test
    /// batch whose envs hold fewer images than a training batch, without the padding rows. Each image's
    /// evaluation is its own (running statistics, per-image group norms and pools, per-row heads), so
    /// its results are the same bits either way with the f32 implicit or direct convolutions (cuBLAS may
    /// sum a smaller matrix in another order). `set_rows(capacity)` goes back; a training step needs it.
    pub fn set_rows(&mut self, rows: usize) {
        assert!(
            (1..=self.capacity).contains(&rows),
            "{rows} rows per env: the buffers hold 1 to {}",
            self.capacity
        );
        self.batch = rows;
        for block in &mut self.blocks {
            for slot in [&mut block.r0, &mut block.r1].into_iter().flatten() {
                slot.set_rows(rows);
            }
        }
    }

    /// Block `b`'s forward: conv, batch norm with the ReLU fused — this batch's statistics (running
    /// averages updated) when `train`, else the running ones —, then the pool.
    fn block_forward(
        &mut self,
        device: &Device,
        b: usize,
        images: &CudaSlice<f32>,
        pass: Pass,
        from_row: Option<u8>,
    ) -> Result<(), ParityError> {
        let train = pass == Pass::Train;
        assert!(!(train && from_row.is_some()), "a training forward runs whole blocks");
        let (arch, stream) = (self.arch, &device.stream);
        let (envs, batch) = (self.envs as u32, self.batch as u32);
        let (done, rest) = self.blocks.split_at_mut(b);
        let block = &mut rest[0];
        let input = done.last().map_or(images, DeviceBlock::output);
        let size = arch.block_size(b) as u32;
        let c_out = arch.block_channels(b) as u32;
        let act_len = block.act.len();
        let (conv_w, gamma, beta) = (&self.params[3 * b], &self.params[3 * b + 1], &self.params[3 * b + 2]);

        let plane = size * size;
        // The conv (padding k / 2, one group) as a GEMM; its twin is ops::conv::conv2d_forward. In training
        // on the tensor cores (with fusion on) its epilogue sums batch norm's statistics, so they need no
        // pass of their own over its output.
        let dims = arch.block_conv(b, self.envs, self.batch);
        let stats_in_epilogue = from_row.is_none() && train && self.fuse && self.conv.sums_stats(&dims);
        // From slot r0 or r1 on (a validation pass that starts there), what lies before is the main
        // pass's, still in the buffers.
        if from_row.is_none() {
            if stats_in_epilogue {
                let out = &mut block.conv_out;
                self.conv.forward_with_stats(device, &dims, input, conv_w, out, &mut self.conv_stats)?;
                let (runs, per_run) = stats_runs(&dims);
                ops::batch_norm_stats_finish_runs(
                    device,
                    &arch.block_norm(b, self.envs, self.batch),
                    &self.conv_stats,
                    runs,
                    per_run,
                    &mut block.save_mean,
                    &mut block.save_inv_std,
                    &mut block.running_mean,
                    &mut block.running_var,
                )?;
            } else {
                self.conv.forward(device, &dims, input, conv_w, &mut block.conv_out)?;
            }
        }
        if from_row.is_none() && train && !stats_in_epilogue {
            ops::batch_norm_train_stats(
                device,
                &arch.block_norm(b, self.envs, self.batch),
                &block.conv_out,
                &mut self.bn_partial,
                &mut block.save_mean,
                &mut block.save_inv_std,
                &mut block.running_mean,
                &mut block.running_var,
            )?;
        }
        let (mean, scale) = match train {
            true => (&block.save_mean, &block.save_inv_std),
            false => (&block.running_mean, &block.running_var),
        };
        let (eval, relu) = (i32::from(!train), 1i32);
        let from_r1 = from_row == Some(1);
        let eval_pass = match pass {
            Pass::Train => None,
            Pass::Eval(k) => Some(k),
        };
        // A slot runs when some env's seed takes part in this forward (in a validation pass: is not
        // ablated there). With no seed at r0 in this forward, the normalisation, ReLU and pool run as
        // one pass.
        let r0_runs = !from_r1 && block.r0.as_ref().is_some_and(|slot| slot.runs_in(eval_pass));
        let fused_pool = self.fuse && from_row.is_none() && !r0_runs && block.pools_whole_windows(size);
        if fused_pool {
            let (pooled, argmax) = block.pooled.as_mut().expect("checked above");
            let windows = pooled.len();
            // Training leaves the ReLU's output unwritten: nothing reads it (the backward recomputes the
            // ReLU's mask from the norm's input, max_pool2x2_relu_bn_backward_partial_f32).
            let write_act = eval;
            let mut launch = stream.launch_builder(device.function("batch_norm_relu_pool_f32"));
            launch.arg(&block.conv_out).arg(&mut block.act).arg(&mut *pooled).arg(&mut *argmax);
            launch.arg(mean).arg(scale).arg(gamma).arg(beta);
            launch.arg(&envs).arg(&batch).arg(&c_out).arg(&size).arg(&size).arg(&eval).arg(&write_act);
            unsafe { launch.launch(elementwise(windows)) }?;
        } else if from_row.is_none() {
            let mut launch = stream.launch_builder(device.function("batch_norm_apply_f32"));
            launch.arg(&block.conv_out).arg(&mut block.act).arg(mean).arg(scale).arg(gamma).arg(beta);
            launch.arg(&envs).arg(&batch).arg(&c_out).arg(&plane).arg(&eval).arg(&relu);
            unsafe { launch.launch(elementwise(act_len)) }?;
        }

        // The seeds: each slot runs when some env's seed takes part in this forward. Where r0 runs before
        // the block's pool on even planes, the pool is fused into the slot's output
        // (`DeviceSlot::forward`'s `pooled`: the slot's output is never written).
        let slot_pools = self.fuse && r0_runs && block.pools_whole_windows(size);
        if !from_r1 {
            block.r0_ran = false;
            if let (Some(slot), true) = (block.r0.as_mut(), r0_runs) {
                let pooled = match (&mut block.pooled, slot_pools) {
                    (Some((pooled, argmax)), true) => Some((pooled, argmax)),
                    _ => None,
                };
                slot.forward(device, &mut self.conv, &block.act, eval_pass, pooled)?;
                block.r0_ran = true;
            }
        }
        block.r1_ran = false;
        if let Some((pooled, argmax)) = &mut block.pooled {
            let pool_in = match (&block.r0, block.r0_ran) {
                (Some(slot), true) => &slot.out,
                _ => &block.act,
            };
            if !from_r1 && !fused_pool && !slot_pools {
                let planes = (self.envs * self.batch * arch.block_channels(b)) as u64;
                let mut launch = stream.launch_builder(device.function("max_pool2x2_forward_f32"));
                let windows = pooled.len();
                launch.arg(pool_in).arg(&mut *pooled).arg(argmax).arg(&planes).arg(&size).arg(&size);
                unsafe { launch.launch(elementwise(windows)) }?;
            }
            if let Some(slot) = block.r1.as_mut().filter(|slot| slot.runs_in(eval_pass)) {
                slot.forward(device, &mut self.conv, pooled, eval_pass, None)?;
                block.r1_ran = true;
            }
        }
        Ok(())
    }

    /// The slot with canonical index `k` (every enabled r0 in block order, then every r1).
    pub fn slot_mut(&mut self, k: usize) -> Option<&mut DeviceSlot> {
        let r0 = self.blocks.iter().filter(|b| b.r0.is_some()).count();
        match k < r0 {
            true => self.blocks.iter_mut().filter_map(|b| b.r0.as_mut()).nth(k),
            false => self.blocks.iter_mut().filter_map(|b| b.r1.as_mut()).nth(k - r0),
        }
    }

    /// Uploads every slot's per-env controls where its states changed (see [`DeviceSlot::prepare`]).
    pub fn prepare_slots(&mut self, device: &Device) -> Result<(), ParityError> {
        for block in &mut self.blocks {
            for slot in [&mut block.r0, &mut block.r1].into_iter().flatten() {
                slot.prepare(device)?;
            }
        }
        Ok(())
    }

    /// Every enabled slot in canonical order.
    pub fn slots(&self) -> impl Iterator<Item = &DeviceSlot> {
        let r0 = self.blocks.iter().filter_map(|b| b.r0.as_ref());
        r0.chain(self.blocks.iter().filter_map(|b| b.r1.as_ref()))
    }

    /// Global average pool of the last block and the linear head: logits `[E, B, K]`.
    fn head_forward(&mut self, device: &Device) -> Result<(), ParityError> {
        let (arch, stream) = (self.arch, &device.stream);
        let (envs, batch) = (self.envs as u32, self.batch as u32);
        let last_out = self.blocks.last().expect("a host has blocks").output();
        let out_size = arch.block_output_size(arch.n_blocks - 1) as u32;
        let planes = (self.envs * self.batch * arch.head_in()) as u64;
        let plane_len = out_size * out_size;
        let mut launch = stream.launch_builder(device.function("global_avg_pool_forward_f32"));
        launch.arg(last_out).arg(&mut self.features).arg(&planes).arg(&plane_len);
        // One warp per plane.
        unsafe { launch.launch(LaunchConfig::for_num_elems((planes * 32).min(1 << 24) as u32)) }?;

        let (n_in, n_out, with_bias) = (arch.head_in() as u32, arch.num_classes as u32, 1i32);
        let head = 3 * arch.n_blocks;
        let logits_len = self.logits.len();
        let mut launch = stream.launch_builder(device.function("linear_forward_f32"));
        launch.arg(&self.features).arg(&self.params[head]).arg(&self.params[head + 1]).arg(&mut self.logits);
        launch.arg(&envs).arg(&batch).arg(&n_in).arg(&n_out).arg(&with_bias);
        unsafe { launch.launch(elementwise(logits_len)) }?;
        Ok(())
    }

    /// The evaluation forward of `images` (`[E, B, C, H, W]` on the device) with the running statistics:
    /// the logits stay on the device ([`Self::logits`]; [`Self::count_correct`] counts them against
    /// labels). `labels` (`[E, B]`) only has its shape checked.
    pub fn forward_eval(
        &mut self,
        device: &Device,
        images: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
    ) -> Result<(), ParityError> {
        self.check_batch(images, labels);
        self.forward_eval_from(device, images, labels, 0, None)
    }

    /// The evaluation forward with validation pass `pass`'s seed selection (see [`DeviceSlot::plan_eval`];
    /// pass 0 is the main configuration), from slot `start` (`(block, row)`) on: everything before it is the
    /// previous forward's, still in the buffers — the main pass's, when the passes run in order of
    /// later starts first (a pass rewrites only what lies at or after its start). None: the whole
    /// network.
    pub fn forward_eval_from(
        &mut self,
        device: &Device,
        images: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
        pass: usize,
        start: Option<(usize, u8)>,
    ) -> Result<(), ParityError> {
        self.check_batch(images, labels);
        let (first, row) = start.map_or((0, None), |(b, row)| (b, Some(row)));
        for b in first..self.arch.n_blocks {
            let from_row = if b == first { row } else { None };
            self.block_forward(device, b, images, Pass::Eval(pass), from_row)?;
        }
        self.head_forward(device)
    }

    /// Each env's correct count of the last forward's logits against `labels` (`[E, B]`; a label no class
    /// has, as padding rows carry, never counts), into [`Self::correct_counts`].
    pub fn count_correct(&mut self, device: &Device, labels: &CudaSlice<u8>) -> Result<(), ParityError> {
        let (envs, batch, classes) = (self.envs as u32, self.batch as u32, self.arch.num_classes as u32);
        let mut launch = device.stream.launch_builder(device.function("count_correct_f32"));
        launch.arg(&self.logits).arg(labels).arg(&mut self.correct).arg(&envs).arg(&batch).arg(&classes);
        unsafe { launch.launch(per_env_block(self.envs)) }?;
        Ok(())
    }

    /// One training step for every env, as [`Trainer::step`](crate::host::Trainer::step) does it without
    /// seeds: the forward with batch statistics (running statistics updated), per-env mean
    /// cross-entropy, the backward of every host tensor, each env's gradient clipped to norm
    /// [`MAX_GRAD_NORM`] over all its tensors, then SGD with momentum and weight decay
    /// ([`SgdConfig::HOST`]); then each slot's seed optimizer. With `collect` (a collection batch) the
    /// host's gradient norm and the seeds' per-tensor norms are kept for the telemetry
    /// ([`Self::sq_norms_collected`], [`DeviceSlot::collect`]). Nothing is copied back.
    pub fn train_step(
        &mut self,
        device: &Device,
        images: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
        collect: bool,
    ) -> Result<(), ParityError> {
        self.check_batch(images, labels);
        assert_eq!(self.batch, self.capacity, "a training step runs the whole batch (set_rows)");
        for b in 0..self.arch.n_blocks {
            self.block_forward(device, b, images, Pass::Train, None)?;
        }
        self.head_forward(device)?;
        let (envs, batch, classes) = (self.envs as u32, self.batch as u32, self.arch.num_classes as u32);
        let grad_on = 1i32;
        let mut launch = device.stream.launch_builder(device.function("softmax_cross_entropy_f32"));
        launch.arg(&self.logits).arg(labels).arg(&mut self.loss).arg(&mut self.grad_logits);
        launch.arg(&envs).arg(&batch).arg(&classes).arg(&grad_on);
        unsafe { launch.launch(per_env_block(self.envs)) }?;
        self.backward(device, images)?;
        self.clip_and_step(device)?;
        if collect {
            device.stream.memcpy_dtod(&self.sq_norms, &mut self.sq_norms_collected)?;
        }
        // Then each slot's statistics and seed optimizer (Trainer::step).
        for block in &mut self.blocks {
            for (slot, ran) in [(&mut block.r0, block.r0_ran), (&mut block.r1, block.r1_ran)] {
                if let (Some(slot), true) = (slot, ran) {
                    if collect {
                        slot.collect(device)?;
                    }
                    slot.step(device)?;
                }
            }
        }
        Ok(())
    }

    /// Every host gradient from `grad_logits`, overwriting `grads`.
    fn backward(&mut self, device: &Device, images: &CudaSlice<f32>) -> Result<(), ParityError> {
        let (arch, stream) = (self.arch, &device.stream);
        let (envs, batch) = (self.envs as u32, self.batch as u32);
        let n = arch.n_blocks;
        let head = 3 * n;
        let (n_in, n_out, with_bias) = (arch.head_in() as u32, arch.num_classes as u32, 1i32);
        let (head_w, head_b) = self.grads[head..].split_at_mut(1);
        let mut launch = stream.launch_builder(device.function("linear_backward_params_f32"));
        let head_w_len = head_w[0].len();
        launch.arg(&self.features).arg(&self.grad_logits).arg(&mut head_w[0]).arg(&mut head_b[0]);
        launch.arg(&envs).arg(&batch).arg(&n_in).arg(&n_out).arg(&with_bias);
        unsafe { launch.launch(elementwise(head_w_len)) }?;
        let features_len = self.grad_features.len();
        let mut launch = stream.launch_builder(device.function("linear_backward_input_f32"));
        launch.arg(&self.grad_logits).arg(&self.params[head]).arg(&mut self.grad_features);
        launch.arg(&envs).arg(&batch).arg(&n_in).arg(&n_out);
        unsafe { launch.launch(elementwise(features_len)) }?;

        // grad_a: ∂L/∂(the last block's output).
        let out_size = arch.block_output_size(n - 1) as u32;
        let (planes, plane_len, accumulate) =
            ((self.envs * self.batch * arch.head_in()) as u64, out_size * out_size, 0i32);
        let mut launch = stream.launch_builder(device.function("global_avg_pool_backward_f32"));
        launch.arg(&self.grad_features).arg(&mut self.grad_a).arg(&planes).arg(&plane_len).arg(&accumulate);
        unsafe { launch.launch(elementwise(planes as usize * plane_len as usize)) }?;

        for b in (0..n).rev() {
            let size = arch.block_size(b) as u32;
            let c_out = arch.block_channels(b) as u32;
            let block = &mut self.blocks[b];
            let act_len = block.act.len();
            if let (Some(slot), true, Some((pooled, _))) = (&mut block.r1, block.r1_ran, &block.pooled) {
                // grad_a (after r1) → grad_b (the pool's output), then the two trade places.
                slot.backward(
                    device,
                    &mut self.conv,
                    pooled,
                    SlotGrad::Output(&self.grad_a),
                    &mut self.grad_b,
                )?;
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            // With fusion on, batch norm's output gradient is never written: the ReLU's backward (and, with
            // no seed at r0, the pool's) runs inside batch norm's two backward passes.
            let fuse_pool = self.fuse && !block.r0_ran && block.pooled.is_some();
            // Behind an r0 seed on even planes (no GATE seed there), the pool's backward runs inside the
            // slot's split (`SlotGrad::Pooled`).
            let slot_pool_grad = self.fuse
                && block.pools_whole_windows(size)
                && block.r0.as_ref().is_some_and(|slot| block.r0_ran && !slot.gated());
            // And where the slot's envs are all OFF, INCUBATOR or ADD, the host's gradient is not written
            // either: batch norm's backward recomputes it from the pool's gradient and the slot's
            // per-env factors (`ops::SlotFactor`).
            let slot_scales =
                slot_pool_grad && block.r0.as_ref().is_some_and(|slot| slot.host_grad_recomputable());
            if let (Some((_, argmax)), false, false) = (&block.pooled, fuse_pool, slot_pool_grad) {
                // grad_a (pooled) → grad_b (the ReLU's output), then the two trade places.
                let planes = (self.envs * self.batch * arch.block_channels(b)) as u64;
                let mut launch = stream.launch_builder(device.function("max_pool2x2_backward_f32"));
                launch.arg(&self.grad_a).arg(argmax).arg(&mut self.grad_b).arg(&planes).arg(&size).arg(&size);
                unsafe { launch.launch(elementwise(act_len)) }?;
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
            if let (Some(slot), true) = (&mut block.r0, block.r0_ran) {
                // grad_a (after r0, or the pool's output gradient) → grad_b (the ReLU's output), then the
                // two trade places.
                let grad_y = match (&block.pooled, slot_pool_grad) {
                    (Some((_, argmax)), true) => {
                        SlotGrad::Pooled { dy: &self.grad_a, argmax, host_grad: !slot_scales }
                    }
                    _ => SlotGrad::Output(&self.grad_a),
                };
                slot.backward(device, &mut self.conv, &block.act, grad_y, &mut self.grad_b)?;
                // Where the host's gradient was not written, grad_a keeps the pool's.
                if !slot_scales {
                    std::mem::swap(&mut self.grad_a, &mut self.grad_b);
                }
            }
            let block = &self.blocks[b];
            let norm = arch.block_norm(b, self.envs, self.batch);
            let dims = arch.block_conv(b, self.envs, self.batch);
            let (conv_g, bn_g) = self.grads[3 * b..3 * b + 3].split_at_mut(1);
            let (gamma_g, beta_g) = bn_g.split_at_mut(1);
            let (gamma, beta) = (&self.params[3 * b + 1], &self.params[3 * b + 2]);
            // The conv's output gradient (batch norm's input gradient): written into grad_a, or, where the
            // staged 3×3 kernels run the conv (with fusion on), computed from grad_a as they load it and
            // never written (`on_load`).
            let mut on_load = None;
            if self.fuse {
                // grad_a: the pool's output gradient (fuse_pool; or slot_scales, the r0 slot's factors
                // applied) or the ReLU's; dγ, dβ and the input gradient's coefficients.
                let argmax =
                    block.pooled.as_ref().filter(|_| fuse_pool || slot_scales).map(|(_, argmax)| argmax);
                let slot_factor = block.r0.as_ref().filter(|_| slot_scales).map(DeviceSlot::factor);
                ops::relu_batch_norm_backward_params(
                    device,
                    &norm,
                    &self.grad_a,
                    argmax,
                    slot_factor,
                    &block.conv_out,
                    &block.save_mean,
                    &block.save_inv_std,
                    gamma,
                    beta,
                    &mut self.bn_partial,
                    &mut gamma_g[0],
                    &mut beta_g[0],
                    &mut self.bn_coef,
                )?;
                let on_load_here = match self.norm_grad_on_load {
                    NormGradOnLoad::Never => false,
                    // The first block has no input gradient to compute, so its weight gradient is the
                    // gradient's one reader.
                    NormGradOnLoad::Once => {
                        b == 0 && argmax.is_some() && self.conv.reads_norm_grad_once(&dims)
                    }
                    NormGradOnLoad::Always => self.conv.reads_norm_grad(&dims),
                };
                if on_load_here {
                    on_load = Some(BatchNormGrad {
                        x: &block.conv_out,
                        dy: &self.grad_a,
                        argmax,
                        coef: &self.bn_coef,
                    });
                } else {
                    // The input gradient into grad_b, then the two trade places.
                    ops::batch_norm_backward_input_from(
                        device,
                        &norm,
                        &self.grad_a,
                        argmax,
                        &block.conv_out,
                        &self.bn_coef,
                        &mut self.grad_b,
                    )?;
                    std::mem::swap(&mut self.grad_a, &mut self.grad_b);
                }
            } else {
                // The ReLU: grad_b = grad_a where the activation is positive (batch norm's output gradient).
                let act_len64 = act_len as u64;
                let mut launch = stream.launch_builder(device.function("relu_backward_f32"));
                launch.arg(&block.act).arg(&self.grad_a).arg(&mut self.grad_b).arg(&act_len64);
                unsafe { launch.launch(elementwise(act_len)) }?;
                // Batch norm's dγ, dβ, then the conv output's gradient into grad_a.
                ops::batch_norm_backward_params(
                    device,
                    &norm,
                    &block.conv_out,
                    &self.grad_b,
                    &block.save_mean,
                    &block.save_inv_std,
                    &mut self.bn_partial,
                    &mut gamma_g[0],
                    &mut beta_g[0],
                )?;
                let plane = size * size;
                let mut launch = stream.launch_builder(device.function("batch_norm_backward_input_f32"));
                launch.arg(&block.conv_out).arg(&self.grad_b).arg(gamma);
                launch.arg(&block.save_mean).arg(&block.save_inv_std).arg(&gamma_g[0]).arg(&beta_g[0]);
                launch.arg(&mut self.grad_a).arg(&envs).arg(&batch).arg(&c_out).arg(&plane);
                unsafe { launch.launch(elementwise(act_len)) }?;
            }

            // The conv: its weight gradient, and (above block 0) the gradient at its input into grad_b, then
            // the two trade places.
            let input = if b == 0 { images } else { self.blocks[b - 1].output() };
            match &on_load {
                Some(grad) => {
                    self.conv.backward_weight_from_norm(device, &dims, input, grad, &mut conv_g[0])?
                }
                None => self.conv.backward_weight(device, &dims, input, &self.grad_a, &mut conv_g[0])?,
            }
            if b > 0 {
                let weight = &self.params[3 * b];
                match &on_load {
                    Some(grad) => {
                        self.conv.backward_input_from_norm(device, &dims, grad, weight, &mut self.grad_b)?
                    }
                    None => {
                        self.conv.backward_input(device, &dims, &self.grad_a, weight, &mut self.grad_b)?
                    }
                }
                std::mem::swap(&mut self.grad_a, &mut self.grad_b);
            }
        }
        Ok(())
    }

    /// Per-env norms over every host gradient (two fixed-order stages), clip factors, the scaling, and
    /// SGD for every tensor: the twin of the host half of `Trainer::step`.
    fn clip_and_step(&mut self, device: &Device) -> Result<(), ParityError> {
        device.stream.memset_zeros(&mut self.sq_norms)?;
        for g in &self.grads {
            ops::add_sq_norms(device, g, &mut self.norm_partial, &mut self.sq_norms.slice_mut(..))?;
        }
        ops::clip_factors(device, &self.sq_norms, &mut self.clip)?;
        let all_envs = self.all_envs.slice(..);
        ops::scale_and_step(
            device,
            &mut self.params,
            &mut self.grads,
            &mut self.momentum,
            &self.clip,
            &all_envs,
            self.sgd,
        )
    }

    /// The env count and the images per env of a batch (the buffers' batch, whatever [`Self::set_rows`]
    /// set).
    pub fn shape(&self) -> (usize, usize) {
        (self.envs, self.capacity)
    }

    /// The last forward's logits `[E, B, K]` (B the rows [`Self::set_rows`] set), on the device.
    pub fn logits_on_device(&self) -> &CudaSlice<f32> {
        &self.logits
    }

    /// The last training step's per-env mean cross-entropy `[E]`, on the device.
    pub fn losses_on_device(&self) -> &CudaSlice<f32> {
        &self.loss
    }

    /// The last [`Self::count_correct`]'s counts `[E]`, on the device.
    pub fn correct_counts(&self) -> &CudaSlice<u32> {
        &self.correct
    }

    /// Every buffer an env's state lives in, in [`HostParams::env_rows`]' order: the weight tensors, then
    /// the running means and the running variances block by block; each is `[E, n]`.
    pub(super) fn state(&self) -> impl Iterator<Item = &CudaSlice<f32>> {
        let means = self.blocks.iter().map(|b| &b.running_mean);
        let vars = self.blocks.iter().map(|b| &b.running_var);
        self.params.iter().chain(means).chain(vars)
    }

    fn state_mut(&mut self) -> impl Iterator<Item = &mut CudaSlice<f32>> {
        let (means, vars): (Vec<_>, Vec<_>) =
            self.blocks.iter_mut().map(|b| (&mut b.running_mean, &mut b.running_var)).unzip();
        self.params.iter_mut().chain(means).chain(vars)
    }

    /// Overwrites the parameters and running statistics with `params` (same shape) and zeroes the
    /// momentum: a new round's hosts.
    pub fn upload_params(&mut self, device: &Device, params: &HostParams<f32>) -> Result<(), ParityError> {
        assert_eq!((params.arch, params.n_envs()), (self.arch, self.envs), "upload of another host's shape");
        let rows = params.weights.tensors.iter().chain(&params.running_mean).chain(&params.running_var);
        let stream = device.stream.clone();
        for (dst, src) in self.state_mut().zip(rows) {
            stream.memcpy_htod(src.as_slice(), dst)?;
        }
        for m in &mut self.momentum {
            stream.memset_zeros(m)?;
        }
        Ok(())
    }

    /// A device copy of every env's parameters and running statistics (a governor snapshot store).
    pub fn snapshot(&self, device: &Device) -> Result<Vec<CudaSlice<f32>>, ParityError> {
        self.state().map(|b| Ok(device.stream.clone_dtod(b)?)).collect()
    }

    /// Env `env`'s parameters and running statistics into `store` (from [`Self::snapshot`]).
    pub fn save_env(
        &self,
        device: &Device,
        env: usize,
        store: &mut [CudaSlice<f32>],
    ) -> Result<(), ParityError> {
        for (src, dst) in self.state().zip(store.iter_mut()) {
            let rows = env_rows(src.len(), self.envs, env);
            device.stream.memcpy_dtod(&src.slice(rows.clone()), &mut dst.slice_mut(rows))?;
        }
        Ok(())
    }

    /// Env `env`'s parameters and running statistics from `store`, and its momentum zeroed (the
    /// reference rebuilds its optimizer after a rollback).
    pub fn restore_env(
        &mut self,
        device: &Device,
        env: usize,
        store: &[CudaSlice<f32>],
    ) -> Result<(), ParityError> {
        let envs = self.envs;
        let stream = device.stream.clone();
        for (dst, src) in self.state_mut().zip(store) {
            let rows = env_rows(src.len(), envs, env);
            stream.memcpy_dtod(&src.slice(rows.clone()), &mut dst.slice_mut(rows))?;
        }
        for m in &mut self.momentum {
            let rows = env_rows(m.len(), envs, env);
            stream.memset_zeros(&mut m.slice_mut(rows))?;
        }
        Ok(())
    }

    /// The last forward's logits `[E, B, K]`, copied to the host.
    pub fn logits(&self, device: &Device) -> Result<Vec<f32>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.logits)?)
    }

    /// The last [`Self::count_correct`]'s counts, copied to the host.
    pub fn correct(&self, device: &Device) -> Result<Vec<u32>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.correct)?)
    }

    /// The last training step's per-env mean cross-entropy, copied to the host.
    pub fn losses(&self, device: &Device) -> Result<Vec<f32>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.loss)?)
    }

    /// Per env, the squared host gradient norm of the last collection batch, on the device.
    pub fn sq_norms_collected(&self) -> &CudaSlice<f64> {
        &self.sq_norms_collected
    }

    /// The last training step's per-env host gradient norm before clipping, copied to the host.
    pub fn grad_norms(&self, device: &Device) -> Result<Vec<f64>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.sq_norms)?.into_iter().map(f64::sqrt).collect())
    }

    /// The parameters and running statistics, copied into `params` (same architecture and env count).
    pub fn download(&self, device: &Device, params: &mut HostParams<f32>) -> Result<(), ParityError> {
        assert_eq!(
            (params.arch, params.n_envs()),
            (self.arch, self.envs),
            "download into another host's shape"
        );
        let HostParams { weights, running_mean, running_var, .. } = params;
        let rows = weights.tensors.iter_mut().chain(running_mean.iter_mut()).chain(running_var.iter_mut());
        for (src, dst) in self.state().zip(rows) {
            device.stream.memcpy_dtoh(src, dst.as_mut_slice())?;
        }
        Ok(())
    }

    /// The momentum buffers in [`HostParams`]' tensor order, copied to the host.
    pub fn momentum(&self, device: &Device) -> Result<Vec<Vec<f32>>, ParityError> {
        self.momentum.iter().map(|m| Ok(device.stream.clone_dtoh(m)?)).collect()
    }
}

/// Env `env`'s rows of an `[E, n]` buffer of `len` values.
fn env_rows(len: usize, envs: usize, env: usize) -> std::ops::Range<usize> {
    let per_env = len / envs;
    env * per_env..(env + 1) * per_env
}

#[cfg(test)]
mod tests {
    use super::NormGradOnLoad;

    #[test]
    fn bn_on_load_is_once_unless_set_to_1_or_0() {
        assert_eq!(NormGradOnLoad::from_setting(None), NormGradOnLoad::Once);
        assert_eq!(NormGradOnLoad::from_setting(Some("1")), NormGradOnLoad::Always);
        assert_eq!(NormGradOnLoad::from_setting(Some("0")), NormGradOnLoad::Never);
        assert_eq!(NormGradOnLoad::from_setting(Some("yes")), NormGradOnLoad::Once);
    }
}
