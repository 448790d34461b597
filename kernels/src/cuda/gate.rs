//! The GatedBlend gate on the device for every env of a slot: the CUDA twin of
//! [`crate::seeds::gate_forward`] and the parameter half of [`crate::seeds::gate_backward`]:
//! `g = σ(W2·relu(W1·GAP(x) + b1) + b2)` per sample, parameters tensor-major ([`TensorRows`]: `fc1.weight`,
//! `fc1.bias`, `fc2.weight`, `fc2.bias`).

use cudarc::driver::CudaSlice;

use super::ops;
use super::parity::{Device, ParityError};
use super::rows::TensorRows;
use crate::ops::LinearShape;
use crate::seeds::SeedShape;
use crate::seeds::{gate_hidden, gate_layout};

type R = Result<(), ParityError>;

/// A slot's gates, one per env.
pub struct DeviceGate {
    /// The activations the launches run over (the batch [`Self::set_rows`] set; the buffers hold the
    /// batch it was made with).
    dims: SeedShape,
    /// Parameters, gradients, momentum (tensor-major), snapshots and gradient statistics.
    pub rows: TensorRows,
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
    pub fn new(device: &Device, dims: SeedShape) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let samples = dims.envs * dims.batch;
        let hidden = gate_hidden(dims.channels);
        let alloc = |n: usize| stream.alloc_zeros::<f32>(n.max(1));
        Ok(Self {
            dims,
            rows: TensorRows::new(device, gate_layout(dims.channels), dims.envs)?,
            pooled: alloc(samples * dims.channels)?,
            hidden: alloc(samples * hidden)?,
            gate: alloc(samples)?,
            d_logit: alloc(samples)?,
            d_hidden: alloc(samples * hidden)?,
            d_hidden_pre: alloc(samples * hidden)?,
        })
    }

    /// Runs the launches that follow over the first `rows` images per env: set by its slot
    /// ([`DeviceSlot::set_rows`](super::slot::DeviceSlot::set_rows), which checks `rows` against the
    /// batch the buffers hold).
    pub(super) fn set_rows(&mut self, rows: usize) {
        self.dims.batch = rows;
    }

    fn linears(&self) -> (LinearShape, LinearShape) {
        let d = self.dims;
        let hidden = gate_hidden(d.channels);
        (
            LinearShape { envs: d.envs, batch: d.batch, in_features: d.channels, out_features: hidden },
            LinearShape { envs: d.envs, batch: d.batch, in_features: hidden, out_features: 1 },
        )
    }

    /// `g = gate(x)` for every sample into [`Self::gate`], keeping what the backward reads.
    pub fn forward(&mut self, device: &Device, x: &CudaSlice<f32>) -> R {
        let d = self.dims;
        let samples = d.envs * d.batch;
        let (fc1, fc2) = self.linears();
        ops::global_avg_pool(device, x, &mut self.pooled, samples * d.channels, d.h * d.w)?;
        ops::linear(
            device,
            &fc1,
            &self.pooled,
            &self.rows.params[0],
            Some(&self.rows.params[1]),
            &mut self.hidden,
        )?;
        ops::relu_in_place(device, &mut self.hidden, samples * fc1.out_features)?;
        ops::linear(
            device,
            &fc2,
            &self.hidden,
            &self.rows.params[2],
            Some(&self.rows.params[3]),
            &mut self.gate,
        )?;
        ops::sigmoid_in_place(device, &mut self.gate, samples)
    }

    /// The parameter gradients (overwriting [`Self::grads`]) from `grad_g = ∂L/∂g` `[E·B]`.
    pub fn backward(&mut self, device: &Device, grad_g: &CudaSlice<f32>) -> R {
        let samples = self.dims.envs * self.dims.batch;
        let (fc1, fc2) = self.linears();
        let [d_w1, d_b1, d_w2, d_b2] = &mut self.rows.grads[..] else { unreachable!("four gate tensors") };
        ops::sigmoid_backward(device, &self.gate, grad_g, &mut self.d_logit, samples)?;
        ops::linear_backward_params(device, &fc2, &self.hidden, &self.d_logit, d_w2, Some(d_b2))?;
        ops::linear_backward_input(device, &fc2, &self.d_logit, &self.rows.params[2], &mut self.d_hidden)?;
        ops::relu_backward(
            device,
            &self.hidden,
            &self.d_hidden,
            &mut self.d_hidden_pre,
            samples * fc1.out_features,
        )?;
        ops::linear_backward_params(device, &fc1, &self.pooled, &self.d_hidden_pre, d_w1, Some(d_b1))
    }
}
