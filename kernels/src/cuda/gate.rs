//! The GatedBlend gate on the device for every env of a slot: the CUDA twin of
//! [`crate::seeds::gate_forward`] and the parameter half of [`crate::seeds::gate_backward`]:
//! `g = σ(W2·relu(W1·GAP(x) + b1) + b2)` per sample, parameters tensor-major (`fc1.weight`, `fc1.bias`,
//! `fc2.weight`, `fc2.bias`, each `[E, len]`).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::ops::{self, LinearDims};
use super::parity::{Device, ParityError, elementwise};
use super::seed_module::SeedDims;
use crate::seeds::{ParamLayout, gate_hidden, gate_layout};

type R = Result<(), ParityError>;

/// Blocks per env of the first stage of the per-tensor squared norms.
const STAT_BLOCKS_PER_ENV: u32 = 8;

/// A slot's gates, one per env.
pub struct DeviceGate {
    dims: SeedDims,
    layout: ParamLayout,
    pub params: Vec<CudaSlice<f32>>,
    pub grads: Vec<CudaSlice<f32>>,
    pub momentum: Vec<CudaSlice<f32>>,
    snapshot: Option<Vec<CudaSlice<f32>>>,
    /// `[T, E]`: each tensor's squared gradient norm per env at the last collection batch.
    pub stat_sq: CudaSlice<f64>,
    stat_partial: CudaSlice<f64>,
    /// `GAP(x)` `[E·B, C]`, the hidden ReLU output `[E·B, hidden]`, the gate `g` `[E·B]`.
    pooled: CudaSlice<f32>,
    hidden: CudaSlice<f32>,
    pub gate: CudaSlice<f32>,
    /// Backward temporaries: ∂L/∂logit, ∂L/∂hidden, after the ReLU.
    d_logit: CudaSlice<f32>,
    d_hidden: CudaSlice<f32>,
    d_hidden_pre: CudaSlice<f32>,
}

impl DeviceGate {
    /// Zero gates for every env at `dims`.
    pub fn new(device: &Device, dims: SeedDims) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let layout = gate_layout(dims.channels);
        let samples = dims.envs * dims.batch;
        let hidden = gate_hidden(dims.channels);
        let alloc = |n: usize| stream.alloc_zeros::<f32>(n.max(1));
        let tensors = |layout: &ParamLayout| -> Result<Vec<CudaSlice<f32>>, ParityError> {
            layout.tensors().iter().map(|t| Ok(alloc(dims.envs * t.len)?)).collect()
        };
        Ok(Self {
            dims,
            params: tensors(&layout)?,
            grads: tensors(&layout)?,
            momentum: tensors(&layout)?,
            snapshot: None,
            stat_sq: stream.alloc_zeros::<f64>(layout.tensors().len() * dims.envs)?,
            stat_partial: stream.alloc_zeros::<f64>(dims.envs * STAT_BLOCKS_PER_ENV as usize)?,
            pooled: alloc(samples * dims.channels)?,
            hidden: alloc(samples * hidden)?,
            gate: alloc(samples)?,
            d_logit: alloc(samples)?,
            d_hidden: alloc(samples * hidden)?,
            d_hidden_pre: alloc(samples * hidden)?,
            layout,
        })
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn linears(&self) -> (LinearDims, LinearDims) {
        let d = self.dims;
        let hidden = gate_hidden(d.channels);
        (
            LinearDims { envs: d.envs, batch: d.batch, n_in: d.channels, n_out: hidden },
            LinearDims { envs: d.envs, batch: d.batch, n_in: hidden, n_out: 1 },
        )
    }

    /// Env `env`'s gate row (drawn on the host, packed as the layout), momentum zeroed.
    pub fn upload_env_row(&mut self, device: &Device, env: usize, row: &[f32]) -> R {
        assert_eq!(row.len(), self.layout.param_count(), "one gate row");
        for ((spec, t), m) in self.layout.tensors().iter().zip(&mut self.params).zip(&mut self.momentum) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_htod(&row[spec.range()], &mut t.slice_mut(at.clone()))?;
            device.stream.memset_zeros(&mut m.slice_mut(at))?;
        }
        Ok(())
    }

    /// Env `env`'s gate row as the layout packs it.
    pub fn download_env_row(&self, device: &Device, env: usize) -> Result<Vec<f32>, ParityError> {
        let mut row = vec![0.0f32; self.layout.param_count()];
        for (spec, t) in self.layout.tensors().iter().zip(&self.params) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_dtoh(&t.slice(at), &mut row[spec.range()])?;
        }
        Ok(row)
    }

    pub fn zero_momentum(&mut self, device: &Device, env: usize) -> R {
        for (spec, m) in self.layout.tensors().iter().zip(&mut self.momentum) {
            device.stream.memset_zeros(&mut m.slice_mut(env * spec.len..(env + 1) * spec.len))?;
        }
        Ok(())
    }

    /// Env `env`'s gate row into the snapshot store, on the device.
    pub fn save_env_row(&mut self, device: &Device, env: usize) -> R {
        if self.snapshot.is_none() {
            let copies: Result<Vec<_>, ParityError> =
                self.params.iter().map(|t| Ok(device.stream.alloc_zeros::<f32>(t.len())?)).collect();
            self.snapshot = Some(copies?);
        }
        let store = self.snapshot.as_mut().expect("made above");
        for ((spec, t), s) in self.layout.tensors().iter().zip(&self.params).zip(store) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_dtod(&t.slice(at.clone()), &mut s.slice_mut(at))?;
        }
        Ok(())
    }

    /// Env `env`'s gate row back from the snapshot store.
    pub fn restore_env_row(&mut self, device: &Device, env: usize) -> R {
        let store = self.snapshot.as_ref().expect("a gate row is restored only after it was saved");
        for ((spec, t), s) in self.layout.tensors().iter().zip(&mut self.params).zip(store) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_dtod(&s.slice(at.clone()), &mut t.slice_mut(at))?;
        }
        Ok(())
    }

    /// `g = gate(x)` for every sample into [`Self::gate`], keeping what the backward reads.
    pub fn forward(&mut self, device: &Device, x: &CudaSlice<f32>) -> R {
        let d = self.dims;
        let samples = d.envs * d.batch;
        let (fc1, fc2) = self.linears();
        ops::global_avg_pool(device, x, &mut self.pooled, samples * d.channels, d.size * d.size)?;
        ops::linear(device, &fc1, &self.pooled, &self.params[0], Some(&self.params[1]), &mut self.hidden)?;
        ops::relu_in_place(device, &mut self.hidden, samples * fc1.n_out)?;
        ops::linear(device, &fc2, &self.hidden, &self.params[2], Some(&self.params[3]), &mut self.gate)?;
        ops::sigmoid_in_place(device, &mut self.gate, samples)
    }

    /// The parameter gradients (overwriting [`Self::grads`]) from `grad_g = ∂L/∂g` `[E·B]`.
    pub fn backward(&mut self, device: &Device, grad_g: &CudaSlice<f32>) -> R {
        let samples = self.dims.envs * self.dims.batch;
        let (fc1, fc2) = self.linears();
        let [d_w1, d_b1, d_w2, d_b2] = &mut self.grads[..] else { unreachable!("four gate tensors") };
        ops::sigmoid_backward(device, &self.gate, grad_g, &mut self.d_logit, samples)?;
        ops::linear_backward_params(device, &fc2, &self.hidden, &self.d_logit, d_w2, Some(d_b2))?;
        ops::linear_backward_input(device, &fc2, &self.d_logit, &self.params[2], &mut self.d_hidden)?;
        ops::relu_backward(
            device,
            &self.hidden,
            &self.d_hidden,
            &mut self.d_hidden_pre,
            samples * fc1.n_out,
        )?;
        ops::linear_backward_params(device, &fc1, &self.pooled, &self.d_hidden_pre, d_w1, Some(d_b1))
    }

    /// Every tensor's squared gradient norm per env into [`Self::stat_sq`].
    pub fn collect_sq_norms(&mut self, device: &Device) -> R {
        let envs = self.dims.envs;
        let envs32 = envs as u32;
        let config = LaunchConfig {
            grid_dim: (STAT_BLOCKS_PER_ENV, envs32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        device.stream.memset_zeros(&mut self.stat_sq)?;
        for (t, g) in self.grads.iter().enumerate() {
            let per_env = (g.len() / envs) as u64;
            let mut launch = device.stream.launch_builder(device.function("sq_norms_partial_f32"));
            launch.arg(g).arg(&mut self.stat_partial).arg(&per_env).arg(&STAT_BLOCKS_PER_ENV);
            unsafe { launch.launch(config) }?;
            let mut sq = self.stat_sq.slice_mut(t * envs..(t + 1) * envs);
            let mut launch = device.stream.launch_builder(device.function("sq_norms_finish"));
            launch.arg(&self.stat_partial).arg(&mut sq).arg(&envs32).arg(&STAT_BLOCKS_PER_ENV);
            unsafe { launch.launch(elementwise(envs)) }?;
        }
        Ok(())
    }
}
