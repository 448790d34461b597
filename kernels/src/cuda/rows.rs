//! A packed-row module's parameters on the device for every env: what a seed blueprint
//! ([`super::seed_module::DeviceSeed`]) and the GatedBlend gate ([`super::gate::DeviceGate`]) share.
//! The host keeps one row of `P` values per env, packed as the module's [`ParamLayout`]; the device
//! keeps each layout tensor as its own `[E, len]` buffer (tensor-major, what
//! [`ParamLayout::rows_to_tensors`] gives), so every op reads its tensor as the host's ops read theirs.
//! Rows go in and out here: at germination (one env), for snapshots (a device copy of one env's rows),
//! and for checksums and checks (every env's at once).

use cudarc::driver::{CudaSlice, CudaView};

use super::ops;
use super::parity::{Device, ParityError};
use crate::seeds::ParamLayout;

type R = Result<(), ParityError>;

/// Blocks per env of the first stage of the per-tensor squared norms.
const STAT_BLOCKS_PER_ENV: u32 = 8;

/// Parameters, gradients and momentum of one module for every env, tensor-major.
pub struct TensorRows {
    envs: usize,
    layout: ParamLayout,
    /// One `[E, len]` buffer per layout tensor.
    pub params: Vec<CudaSlice<f32>>,
    pub grads: Vec<CudaSlice<f32>>,
    pub momentum: Vec<CudaSlice<f32>>,
    /// Governor snapshots of single envs' rows; made at the first snapshot.
    snapshot: Option<Vec<CudaSlice<f32>>>,
    /// `[T, E]`: each tensor's squared gradient norm per env at the last collection batch (f64), and
    /// the first stage of those sums.
    pub stat_sq: CudaSlice<f64>,
    stat_partial: CudaSlice<f64>,
}

impl TensorRows {
    /// Zero parameters, gradients and momentum of `layout` for `envs` envs.
    pub fn new(device: &Device, layout: ParamLayout, envs: usize) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let tensors = || -> Result<Vec<CudaSlice<f32>>, ParityError> {
            layout.tensors().iter().map(|t| Ok(stream.alloc_zeros::<f32>((envs * t.len).max(1))?)).collect()
        };
        Ok(Self {
            envs,
            params: tensors()?,
            grads: tensors()?,
            momentum: tensors()?,
            snapshot: None,
            stat_sq: stream.alloc_zeros::<f64>(layout.tensors().len() * envs)?,
            stat_partial: stream.alloc_zeros::<f64>(envs * STAT_BLOCKS_PER_ENV as usize)?,
            layout,
        })
    }

    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The env count every buffer is sized for.
    pub fn envs(&self) -> usize {
        self.envs
    }

    /// Every env's row (`[E, P]`) into the parameters.
    pub fn upload_rows(&mut self, device: &Device, rows: &[f32]) -> R {
        let mut tensor_major = vec![0.0f32; rows.len()];
        self.layout.rows_to_tensors(self.envs, rows, &mut tensor_major);
        let mut start = 0;
        for (spec, t) in self.layout.tensors().iter().zip(&mut self.params) {
            let len = self.envs * spec.len;
            device.stream.memcpy_htod(&tensor_major[start..start + len], &mut t.slice_mut(..len))?;
            start += len;
        }
        Ok(())
    }

    fn download(&self, device: &Device, tensors: &[CudaSlice<f32>]) -> Result<Vec<f32>, ParityError> {
        let mut tensor_major = Vec::new();
        for (spec, t) in self.layout.tensors().iter().zip(tensors) {
            tensor_major.extend(device.stream.clone_dtoh(&t.slice(..self.envs * spec.len))?);
        }
        Ok(rows_of(&self.layout, self.envs, &tensor_major))
    }

    /// The parameters' `[E, len]` buffers in layout order (what [`rows_of`] puts back into rows).
    pub fn param_tensors(&self) -> impl Iterator<Item = CudaView<'_, f32>> {
        self.layout.tensors().iter().zip(&self.params).map(|(spec, t)| t.slice(..self.envs * spec.len))
    }

    /// The parameters as rows `[E, P]`.
    pub fn download_rows(&self, device: &Device) -> Result<Vec<f32>, ParityError> {
        self.download(device, &self.params)
    }

    /// The last backward's gradients as rows `[E, P]`.
    pub fn download_grad_rows(&self, device: &Device) -> Result<Vec<f32>, ParityError> {
        self.download(device, &self.grads)
    }

    /// Env `env`'s row (`P` values, packed as the layout) into the parameters, and its momentum zeroed:
    /// a birth drawn on the host.
    pub fn upload_env_row(&mut self, device: &Device, env: usize, row: &[f32]) -> R {
        assert_eq!(row.len(), self.layout.param_count(), "one row of the module");
        for ((spec, t), m) in self.layout.tensors().iter().zip(&mut self.params).zip(&mut self.momentum) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_htod(&row[spec.range()], &mut t.slice_mut(at.clone()))?;
            device.stream.memset_zeros(&mut m.slice_mut(at))?;
        }
        Ok(())
    }

    /// Zeroes env `env`'s momentum (the optimizer rebuilt at fossilization or rollback).
    pub fn zero_momentum(&mut self, device: &Device, env: usize) -> R {
        for (spec, m) in self.layout.tensors().iter().zip(&mut self.momentum) {
            device.stream.memset_zeros(&mut m.slice_mut(env * spec.len..(env + 1) * spec.len))?;
        }
        Ok(())
    }

    /// Env `env`'s row into the snapshot store (a fossil in a governor snapshot), on the device.
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

    /// Env `env`'s row back from the snapshot store (rollback); its momentum is the caller's to clear.
    pub fn restore_env_row(&mut self, device: &Device, env: usize) -> R {
        let store = self.snapshot.as_ref().expect("a row is restored only after it was saved");
        for ((spec, t), s) in self.layout.tensors().iter().zip(&mut self.params).zip(store) {
            let at = env * spec.len..(env + 1) * spec.len;
            device.stream.memcpy_dtod(&s.slice(at.clone()), &mut t.slice_mut(at))?;
        }
        Ok(())
    }

    /// Every tensor's squared gradient norm per env into [`Self::stat_sq`] (the gradient-health
    /// statistics of a collection batch, before clipping): f64 sums in two fixed-order stages.
    pub fn collect_sq_norms(&mut self, device: &Device) -> R {
        device.stream.memset_zeros(&mut self.stat_sq)?;
        for (t, g) in self.grads.iter().enumerate() {
            let mut sq = self.stat_sq.slice_mut(t * self.envs..(t + 1) * self.envs);
            ops::add_sq_norms(device, g, &mut self.stat_partial, &mut sq)?;
        }
        Ok(())
    }
}

/// Every env's row `[E, P]` of `layout` from its tensors one after another, each `[E, len]`.
pub fn rows_of(layout: &ParamLayout, envs: usize, tensor_major: &[f32]) -> Vec<f32> {
    let mut rows = vec![0.0f32; tensor_major.len()];
    layout.tensors_to_rows(envs, tensor_major, &mut rows);
    rows
}
