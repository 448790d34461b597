//! The seedless host network's evaluation forward on the device: the first piece of the CUDA
//! `HostBackend` (issue 16). It composes the kernels that [`super::parity`] checks one by one — conv,
//! batch norm with the running statistics and the ReLU, 2×2 max pool, global average pool, linear head,
//! correct counts — over env-stacked parameters resident on the device, and the selftest checks it
//! against [`HostWorkspace::forward_eval`](crate::host::HostWorkspace::forward_eval) on the same inputs.
//! Seeds, training and validation plans come next.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::parity::{Device, ParityError, elementwise, push_dims};
use crate::host::{HostArch, HostParams};

/// Block `b`'s parameters and running statistics on the device, each `[E, …]`.
struct DeviceBlock {
    conv: CudaSlice<f32>,
    gamma: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    running_mean: CudaSlice<f32>,
    running_var: CudaSlice<f32>,
    /// The conv's output `[E, B, C, H, W]`.
    conv_out: CudaSlice<f32>,
    /// Batch norm → ReLU, `[E, B, C, H, W]`.
    act: CudaSlice<f32>,
    /// The 2×2 max pool of `act` and its winners (blocks that pool).
    pooled: Option<(CudaSlice<f32>, CudaSlice<u8>)>,
}

/// An env-stacked host on the device for one `(E, B)`: parameters, running statistics and activations.
pub struct DeviceHost {
    arch: HostArch,
    envs: usize,
    batch: usize,
    blocks: Vec<DeviceBlock>,
    head_weight: CudaSlice<f32>,
    head_bias: CudaSlice<f32>,
    features: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    correct: CudaSlice<u32>,
}

impl DeviceHost {
    /// Uploads `params` and allocates the activations of `batch` images per env.
    pub fn upload(device: &Device, params: &HostParams<f32>, batch: usize) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let (arch, envs) = (params.arch, params.n_envs());
        let mut blocks = Vec::with_capacity(arch.n_blocks);
        for b in 0..arch.n_blocks {
            let size = arch.block_size(b);
            let act = envs * batch * arch.block_channels(b) * size * size;
            let pooled = match arch.pools_after(b) {
                true => Some((stream.alloc_zeros::<f32>(act / 4)?, stream.alloc_zeros::<u8>(act / 4)?)),
                false => None,
            };
            blocks.push(DeviceBlock {
                conv: stream.clone_htod(params.conv(b))?,
                gamma: stream.clone_htod(params.gamma(b))?,
                beta: stream.clone_htod(params.beta(b))?,
                running_mean: stream.clone_htod(&params.running_mean[b])?,
                running_var: stream.clone_htod(&params.running_var[b])?,
                conv_out: stream.alloc_zeros::<f32>(act)?,
                act: stream.alloc_zeros::<f32>(act)?,
                pooled,
            });
        }
        Ok(Self {
            arch,
            envs,
            batch,
            blocks,
            head_weight: stream.clone_htod(params.head_weight())?,
            head_bias: stream.clone_htod(params.head_bias())?,
            features: stream.alloc_zeros::<f32>(envs * batch * arch.head_in())?,
            logits: stream.alloc_zeros::<f32>(envs * batch * arch.num_classes)?,
            correct: stream.alloc_zeros::<u32>(envs)?,
        })
    }

    /// The evaluation forward of `images` (`[E, B, C, H, W]` on the device) with the running statistics,
    /// then each env's correct count against `labels` (`[E, B]`): the logits and counts stay on the
    /// device ([`Self::logits`], [`Self::correct`]).
    pub fn forward_eval(
        &mut self,
        device: &Device,
        images: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
    ) -> Result<(), ParityError> {
        let (arch, stream) = (self.arch, &device.stream);
        let (envs, batch) = (self.envs as u32, self.batch as u32);
        assert_eq!(images.len(), self.envs * self.batch * arch.image_len(), "device images [E, B, C, H, W]");
        assert_eq!(labels.len(), self.envs * self.batch, "device labels [E, B]");
        for b in 0..arch.n_blocks {
            let (done, rest) = self.blocks.split_at_mut(b);
            let block = &mut rest[0];
            let input = match done.last() {
                None => images,
                Some(prev) => prev.pooled.as_ref().map_or(&prev.act, |(pooled, _)| pooled),
            };
            let size = arch.block_size(b) as u32;
            let (c_in, c_out) = (arch.block_in_channels(b) as u32, arch.block_channels(b) as u32);
            let k = arch.kernel_size as u32;
            let act_len = block.act.len();

            // conv2d_forward: the twin of ops::conv::conv2d_forward (padding k / 2, one group).
            let dims = [envs, batch, c_in, c_out, size, size, k, k / 2, 1];
            let mut launch = stream.launch_builder(device.function("conv2d_forward_f32"));
            launch.arg(input).arg(&block.conv).arg(&mut block.conv_out);
            push_dims(&mut launch, &dims);
            unsafe { launch.launch(elementwise(act_len)) }?;

            // Batch norm with the running statistics, the ReLU fused (eval = 1, relu = 1).
            let (plane, eval, relu) = (size * size, 1i32, 1i32);
            let mut launch = stream.launch_builder(device.function("batch_norm_apply_f32"));
            launch.arg(&block.conv_out).arg(&mut block.act).arg(&block.running_mean).arg(&block.running_var);
            launch.arg(&block.gamma).arg(&block.beta);
            launch.arg(&envs).arg(&batch).arg(&c_out).arg(&plane).arg(&eval).arg(&relu);
            unsafe { launch.launch(elementwise(act_len)) }?;

            if let Some((pooled, argmax)) = &mut block.pooled {
                let planes = (self.envs * self.batch * arch.block_channels(b)) as u64;
                let mut launch = stream.launch_builder(device.function("max_pool2x2_forward_f32"));
                launch.arg(&block.act).arg(pooled).arg(argmax).arg(&planes).arg(&size).arg(&size);
                unsafe { launch.launch(elementwise(act_len / 4)) }?;
            }
        }
        let last = self.blocks.last().expect("a host has blocks");
        let last_out = last.pooled.as_ref().map_or(&last.act, |(pooled, _)| pooled);
        let out_size = arch.block_output_size(arch.n_blocks - 1) as u32;
        let planes = (self.envs * self.batch * arch.head_in()) as u64;
        let plane_len = out_size * out_size;
        let mut launch = stream.launch_builder(device.function("global_avg_pool_forward_f32"));
        launch.arg(last_out).arg(&mut self.features).arg(&planes).arg(&plane_len);
        // One warp per plane.
        unsafe { launch.launch(LaunchConfig::for_num_elems((planes * 32).min(1 << 24) as u32)) }?;

        let (n_in, n_out, with_bias) = (arch.head_in() as u32, arch.num_classes as u32, 1i32);
        let logits_len = self.logits.len();
        let mut launch = stream.launch_builder(device.function("linear_forward_f32"));
        launch.arg(&self.features).arg(&self.head_weight).arg(&self.head_bias).arg(&mut self.logits);
        launch.arg(&envs).arg(&batch).arg(&n_in).arg(&n_out).arg(&with_bias);
        unsafe { launch.launch(elementwise(logits_len)) }?;

        let mut launch = stream.launch_builder(device.function("count_correct_f32"));
        launch.arg(&self.logits).arg(labels).arg(&mut self.correct).arg(&envs).arg(&batch).arg(&n_out);
        unsafe { launch.launch(elementwise(self.envs)) }?;
        Ok(())
    }

    /// The last forward's logits `[E, B, K]`, copied to the host.
    pub fn logits(&self, device: &Device) -> Result<Vec<f32>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.logits)?)
    }

    /// The last forward's correct count per env, copied to the host.
    pub fn correct(&self, device: &Device) -> Result<Vec<u32>, ParityError> {
        Ok(device.stream.clone_dtoh(&self.correct)?)
    }
}
