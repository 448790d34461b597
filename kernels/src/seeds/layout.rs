//! Packed parameter layouts: where each tensor of a seed lives inside its `P`-element row, how it is
//! initialised at birth, and the conversion between the row-per-env pool `[E, P]` and the tensor-major
//! staging the batched ops read (`[tensor][E][len]`).
//!
//! The pool keeps one contiguous row per env so that germinating an env rewrites one row, the optimizer
//! runs element-wise over the whole pool, and a per-env gradient norm is a reduction over one row. The
//! ops want each tensor as its own `[E, …]` block, so the seed forward copies the gathered rows into
//! tensor-major order once (a cheap transpose: parameters are tiny next to activations) and the backward
//! copies the parameter gradients back.

use crate::ops::Real;
use crate::rng::Stream;

/// Most tensors any seed module has (conv_heavy: two convs and two norms' γ, β).
pub const MAX_TENSORS: usize = 6;

/// How a tensor is initialised at birth (before the MULTIPLY zeroing).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// `U(−1/√fan_in, 1/√fan_in)`: PyTorch's default for conv/linear weights (kaiming-uniform with
    /// `a = √5`) and for their biases. `fan_in = c_in/groups · k · k` (`in_features` for a linear).
    Uniform { fan_in: usize },
    /// Every element equal to the value (GroupNorm γ = 1, β = 0; λ = 0; the stated special inits).
    Const(f64),
}

/// One tensor of a seed's packed row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorSpec {
    /// PyTorch-style name, e.g. `"conv.weight"`, `"norm.bias"`.
    pub name: &'static str,
    /// First element of the tensor within the row.
    pub offset: usize,
    /// Elements (the tensor's PyTorch shape, flattened row-major).
    pub len: usize,
    pub init: Init,
    /// Part of the last Linear/Conv in module order: set to zero at germination under MULTIPLY.
    pub zeroed_by_multiply: bool,
}

impl TensorSpec {
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len
    }
}

/// The tensors of one seed module, packed back to back in module order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamLayout {
    tensors: [TensorSpec; MAX_TENSORS],
    count: usize,
}

impl ParamLayout {
    pub(crate) fn builder() -> LayoutBuilder {
        LayoutBuilder { layout: ParamLayout { tensors: [EMPTY; MAX_TENSORS], count: 0 }, offset: 0 }
    }

    /// The tensors in row order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors[..self.count]
    }

    /// The tensor called `name`, if the module has one.
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors().iter().find(|t| t.name == name)
    }

    /// `P`: elements of one env's row.
    pub fn param_count(&self) -> usize {
        self.tensors().last().map_or(0, |t| t.offset + t.len)
    }

    /// Writes a freshly born module into `row` (length `P`): every random tensor draws `len` values from
    /// `stream` in row order (so the draws never depend on `multiply`), constants draw nothing, and with
    /// `multiply` the tensors of the last Linear/Conv are then set to zero.
    pub fn init_row<T: Real>(&self, multiply: bool, stream: &mut Stream, row: &mut [T]) {
        assert_eq!(row.len(), self.param_count(), "seed parameter row length");
        for t in self.tensors() {
            let values = &mut row[t.range()];
            match t.init {
                Init::Uniform { fan_in } => {
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    for v in values.iter_mut() {
                        *v = T::from_f64(stream.uniform(-bound, bound));
                    }
                }
                Init::Const(c) => values.fill(T::from_f64(c)),
            }
            if multiply && t.zeroed_by_multiply {
                values.fill(T::ZERO);
            }
        }
    }

    /// Copies gathered rows `[envs, P]` into tensor-major order: tensor `t` of env `e` goes to
    /// `envs·offset_t + e·len_t`, so each tensor becomes one `[envs, …]` block.
    pub fn rows_to_tensors<T: Copy>(&self, envs: usize, rows: &[T], tensor_major: &mut [T]) {
        let p = self.param_count();
        assert_eq!(rows.len(), envs * p, "seed parameter rows length");
        assert_eq!(tensor_major.len(), envs * p, "seed tensor-major length");
        for t in self.tensors() {
            let block = &mut tensor_major[envs * t.offset..envs * (t.offset + t.len)];
            for (e, dst) in block.chunks_exact_mut(t.len).enumerate() {
                dst.copy_from_slice(&rows[e * p + t.offset..e * p + t.offset + t.len]);
            }
        }
    }

    /// The inverse of [`ParamLayout::rows_to_tensors`] (overwrites `rows`).
    pub fn tensors_to_rows<T: Copy>(&self, envs: usize, tensor_major: &[T], rows: &mut [T]) {
        let p = self.param_count();
        assert_eq!(rows.len(), envs * p, "seed parameter rows length");
        assert_eq!(tensor_major.len(), envs * p, "seed tensor-major length");
        for t in self.tensors() {
            let block = &tensor_major[envs * t.offset..envs * (t.offset + t.len)];
            for (e, src) in block.chunks_exact(t.len).enumerate() {
                rows[e * p + t.offset..e * p + t.offset + t.len].copy_from_slice(src);
            }
        }
    }

    /// The `[envs, …]` blocks of a tensor-major buffer, in row order (unused entries are empty).
    pub(crate) fn split<'a, T>(&self, envs: usize, tensor_major: &'a [T]) -> [&'a [T]; MAX_TENSORS] {
        assert_eq!(tensor_major.len(), envs * self.param_count(), "seed tensor-major length");
        let mut rest = tensor_major;
        std::array::from_fn(|i| {
            let len = if i < self.count { envs * self.tensors[i].len } else { 0 };
            let (head, tail) = rest.split_at(len);
            rest = tail;
            head
        })
    }

    /// As [`ParamLayout::split`], mutably.
    pub(crate) fn split_mut<'a, T>(
        &self,
        envs: usize,
        tensor_major: &'a mut [T],
    ) -> [&'a mut [T]; MAX_TENSORS] {
        assert_eq!(tensor_major.len(), envs * self.param_count(), "seed tensor-major length");
        let mut rest = tensor_major;
        std::array::from_fn(|i| {
            let len = if i < self.count { envs * self.tensors[i].len } else { 0 };
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            head
        })
    }
}

const EMPTY: TensorSpec =
    TensorSpec { name: "", offset: 0, len: 0, init: Init::Const(0.0), zeroed_by_multiply: false };

/// Appends tensors to a layout, each right after the previous one.
pub(crate) struct LayoutBuilder {
    layout: ParamLayout,
    offset: usize,
}

impl LayoutBuilder {
    fn push(mut self, name: &'static str, len: usize, init: Init, zeroed_by_multiply: bool) -> Self {
        assert!(self.layout.count < MAX_TENSORS, "seed layout has more than {MAX_TENSORS} tensors");
        self.layout.tensors[self.layout.count] =
            TensorSpec { name, offset: self.offset, len, init, zeroed_by_multiply };
        self.layout.count += 1;
        self.offset += len;
        self
    }

    /// A conv/linear weight (or bias) with PyTorch's default init.
    pub fn uniform(self, name: &'static str, len: usize, fan_in: usize) -> Self {
        self.push(name, len, Init::Uniform { fan_in }, false)
    }

    /// A tensor with a constant init.
    pub fn constant(self, name: &'static str, len: usize, value: f64) -> Self {
        self.push(name, len, Init::Const(value), false)
    }

    /// GroupNorm affine `γ = 1`, `β = 0` over `channels`.
    pub fn group_norm(self, weight: &'static str, bias: &'static str, channels: usize) -> Self {
        self.constant(weight, channels, 1.0).constant(bias, channels, 0.0)
    }

    /// Marks the most recently pushed tensor as part of the last Linear/Conv (zeroed under MULTIPLY).
    pub fn last_layer(mut self) -> Self {
        let last = self.layout.count.checked_sub(1).expect("no tensor to mark");
        self.layout.tensors[last].zeroed_by_multiply = true;
        self
    }

    pub fn build(self) -> ParamLayout {
        self.layout
    }
}
