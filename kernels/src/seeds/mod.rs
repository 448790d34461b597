//! The CNN seed blueprints (kasmina §7.1) and the GatedBlend gate (§4.4), each a batched module over a
//! gathered batch of `Eb` envs that hold that blueprint at one slot.
//!
//! * Parameters of one (slot, blueprint) live in a pool `[E, P]`: one row of `P =`[`param_count`]
//!   elements per env, packed as documented by each blueprint's [`ParamLayout`] (see [`layout`]; the
//!   module files list the tensors). Germinating env `e` is [`init_row`] on its row: no allocation.
//! * The caller gathers the rows and the seed inputs `x` (`[Eb, B, C, H, W]`) of the envs that run this
//!   blueprint, calls [`forward`] (→ `y`, same shape), later [`backward`] with `∂L/∂y`, and scatters the
//!   parameter gradients `[Eb, P]` back. Envs never mix: env `e` inside a gathered batch gives the same
//!   bits as env `e` alone, whatever the thread count (every reduction has a fixed order per env).
//! * A [`Workspace`] keeps the activations the backward needs; it grows to the largest shape it has seen
//!   and is reused, so after the first step nothing allocates.
//! * In the CNN RL loop the seed input is always detached (isolation, kasmina §5.1), so the backward's
//!   input gradient is optional; it is implemented for every module (it costs one extra conv backward
//!   where there is one) and is what the residual-structure tests check.
//!
//! Birth: PyTorch's default init unless stated (conv/linear weights and biases `U(±1/√fan_in)`, GroupNorm
//! `γ = 1`, `β = 0`), then each blueprint's special init; with the MULTIPLY blend the tensors of the *last
//! Linear/Conv in module order* are zeroed. Module order is the order of the tensors in each layout
//! (the order the reference module registers them), and the last Linear/Conv is:
//!
//! | blueprint | last Linear/Conv | at birth (ADD/GATE) | at birth (MULTIPLY) |
//! |---|---|---|---|
//! | conv_light | `conv` | non-identity | identity |
//! | attention | `fc2` (weight and bias) | `σ(3)·x ≈ 0.9526·x` | `0.5·x` |
//! | norm | none (GroupNorm is not Linear/Conv) | identity | identity |
//! | depthwise | `pointwise` | non-identity | identity |
//! | bottleneck | `up` (already zero) | identity | identity |
//! | conv_small | `conv` (already zero) | identity | identity |
//! | conv_heavy | `conv2` | non-identity | identity |

pub(crate) mod attention;
mod block;
pub(crate) mod bottleneck;
pub(crate) mod common;
mod conv;
mod depthwise;
mod gate;
mod layout;
mod norm;
#[cfg(test)]
mod tests;

pub use block::PooledSeedGrad;
use block::UnitOutputGrad;
pub use gate::{
    GateWorkspace, gate_backward, gate_forward, gate_hidden, gate_init_row, gate_layout, gate_param_count,
};
pub use layout::{Init, MAX_TENSORS, ParamLayout, TensorSpec};

use crate::ops::{Conv2dShape, LinearShape, NormShape, PoolShape, Real};
use crate::rng::Stream;
use common::{Buffers, grown};

/// A CNN seed blueprint. The values are the policy's blueprint action indices and match
/// `esper_components::BlueprintAction` (1..=7; NOOP = 0 has no module and is not a variant here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CnnBlueprint {
    ConvLight = 1,
    Attention = 2,
    Norm = 3,
    Depthwise = 4,
    Bottleneck = 5,
    ConvSmall = 6,
    ConvHeavy = 7,
}

impl CnnBlueprint {
    pub const ALL: [CnnBlueprint; 7] = [
        Self::ConvLight,
        Self::Attention,
        Self::Norm,
        Self::Depthwise,
        Self::Bottleneck,
        Self::ConvSmall,
        Self::ConvHeavy,
    ];

    /// The blueprint of a `BlueprintAction` value; `None` for NOOP (0) and non-CNN blueprints.
    pub fn from_action_index(index: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|bp| *bp as u8 == index)
    }

    pub fn action_index(self) -> u8 {
        self as u8
    }

    /// The reference's registry name (`cnn:<name>`).
    pub fn name(self) -> &'static str {
        match self {
            Self::ConvLight => "conv_light",
            Self::Attention => "attention",
            Self::Norm => "norm",
            Self::Depthwise => "depthwise",
            Self::Bottleneck => "bottleneck",
            Self::ConvSmall => "conv_small",
            Self::ConvHeavy => "conv_heavy",
        }
    }
}

/// GroupNorm group count `G(C)` (kasmina §7): the first of 32, 16, 8, 4, 2, 1 that divides `C` with at
/// least 16 channels per group; if none, the first of them that divides `C`.
pub fn group_norm_groups(channels: usize) -> usize {
    const CANDIDATES: [usize; 6] = [32, 16, 8, 4, 2, 1];
    CANDIDATES
        .into_iter()
        .find(|&g| channels.is_multiple_of(g) && channels / g >= 16)
        .or_else(|| CANDIDATES.into_iter().find(|&g| channels.is_multiple_of(g)))
        .expect("1 divides everything")
}

/// The packed parameter layout of `bp` at `channels` (its tensors, offsets and inits).
pub fn layout(bp: CnnBlueprint, channels: usize) -> ParamLayout {
    assert!(channels > 0, "a seed needs channels");
    match bp {
        CnnBlueprint::Norm => norm::layout(channels),
        CnnBlueprint::Attention => attention::layout(channels),
        CnnBlueprint::Depthwise => depthwise::layout(channels),
        CnnBlueprint::Bottleneck => bottleneck::layout(channels),
        CnnBlueprint::ConvSmall => conv::small_layout(channels),
        CnnBlueprint::ConvLight => conv::light_layout(channels),
        CnnBlueprint::ConvHeavy => conv::heavy_layout(channels),
    }
}

/// Multiply-adds of one image's forward through `bp` at `channels` × `h` × `w`: its convolutions and
/// linears (the norms and element-wise ops, a few operations per value, are left out).
pub fn forward_macs(bp: CnnBlueprint, channels: usize, h: usize, w: usize) -> u64 {
    let (c, plane) = (channels as u64, (h * w) as u64);
    let conv = |c_in: u64, c_out: u64, k: u64| k * k * plane * c_in * c_out;
    match bp {
        CnnBlueprint::ConvSmall => conv(c, c, 1),
        CnnBlueprint::ConvLight => conv(c, c, 3),
        CnnBlueprint::ConvHeavy => 2 * conv(c, c, 3),
        CnnBlueprint::Attention => 2 * c * attention::reduced(channels) as u64,
        CnnBlueprint::Norm => 0,
        // 3×3 depthwise (one input channel per output), then 1×1 pointwise.
        CnnBlueprint::Depthwise => conv(1, c, 3) + conv(c, c, 1),
        CnnBlueprint::Bottleneck => {
            let b = bottleneck::width(channels) as u64;
            conv(c, b, 1) + conv(b, b, 3) + conv(b, c, 1)
        }
    }
}

/// `P`: parameters of one env's `bp` module at `channels` (the spec's counts, kasmina §7.1).
pub fn param_count(bp: CnnBlueprint, channels: usize) -> usize {
    layout(bp, channels).param_count()
}

/// Germinates one env: writes a freshly born `bp` module into `row` (`P` elements) from `stream`
/// (e.g. `StreamKey::new(seed, round, env, Purpose::SeedInit).stream(slot_counter)`). With `multiply`
/// (the MULTIPLY blend algorithm) the last Linear/Conv is zeroed (module doc). Draws are independent of
/// `multiply`: the two rows differ exactly in the zeroed tensors.
pub fn init_row<T: Real>(
    bp: CnnBlueprint,
    channels: usize,
    multiply: bool,
    stream: &mut Stream,
    row: &mut [T],
) {
    layout(bp, channels).init_row(multiply, stream, row);
}

/// Shape of a gathered seed batch: activations `[envs, batch, channels, h, w]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedShape {
    pub envs: usize,
    pub batch: usize,
    pub channels: usize,
    pub h: usize,
    pub w: usize,
}

impl SeedShape {
    /// Elements of the input (and of the output).
    pub fn len(&self) -> usize {
        self.activation_len(self.channels)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `envs · batch`.
    pub fn samples(&self) -> usize {
        self.envs * self.batch
    }
    pub(crate) fn plane(&self) -> usize {
        self.h * self.w
    }
    /// Elements of an activation with `channels` channels at this batch and spatial size.
    pub(crate) fn activation_len(&self, channels: usize) -> usize {
        self.samples() * channels * self.plane()
    }
    /// A stride-1 convolution at this size; `k = 3` pads by 1, `k = 1` by 0, so the size is kept.
    pub(crate) fn conv(&self, c_in: usize, c_out: usize, k: usize, groups: usize) -> Conv2dShape {
        Conv2dShape {
            envs: self.envs,
            batch: self.batch,
            c_in,
            c_out,
            h: self.h,
            w: self.w,
            k,
            pad: k / 2,
            groups,
        }
    }
    pub(crate) fn norm(&self, channels: usize) -> NormShape {
        NormShape { envs: self.envs, batch: self.batch, channels, h: self.h, w: self.w }
    }
    fn pool(&self) -> PoolShape {
        PoolShape { envs: self.envs, batch: self.batch, channels: self.channels, h: self.h, w: self.w }
    }
    pub(crate) fn linear(&self, in_features: usize, out_features: usize) -> LinearShape {
        LinearShape { envs: self.envs, batch: self.batch, in_features, out_features }
    }
}

/// Reusable buffers of one gathered seed module: its parameters staged tensor-major, their gradients,
/// and the activations its backward reads. Grows to the largest shape seen, never shrinks.
#[derive(Debug, Default)]
pub struct Workspace<T> {
    /// The gathered parameters in tensor-major order (`ParamLayout::rows_to_tensors`).
    params: Vec<T>,
    /// Parameter gradients in tensor-major order, before packing into rows.
    grads: Vec<T>,
    buffers: Buffers<T>,
    /// What the last forward computed: the backward must match it.
    last_forward: Option<(CnnBlueprint, SeedShape)>,
}

impl<T: Real> Workspace<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Elements currently reserved (for memory accounting; constant once every shape has been seen).
    pub fn capacity(&self) -> usize {
        self.params.capacity() + self.grads.capacity() + self.buffers.capacity()
    }
}

/// `y = bp(x)` for a gathered batch. `params` is `[Eb, P]` (rows in the order of the envs in `x`), `x`
/// and `y` are `[Eb, B, C, H, W]`. Overwrites `y`; keeps in `ws` what [`backward`] needs.
pub fn forward<T: Real>(
    bp: CnnBlueprint,
    shape: SeedShape,
    params: &[T],
    x: &[T],
    y: &mut [T],
    ws: &mut Workspace<T>,
) {
    forward_then_blend(bp, shape, params, x, None, y, ws);
}

/// [`forward`], then the slot's ADD blend with the seed's input as the host activation:
/// `y = lerp(x, bp(x), a)` with `alpha` the per-env amplitude, already clamped (`[Eb]`). The same bits
/// as [`forward`] then `ops::blend_add_forward`; the conv seeds blend in the last pass over their output
/// while it is in cache, so the seed's own output is never written. [`backward`] is unchanged (the ADD
/// blend's backward needs only `a`).
pub fn forward_blended_add<T: Real>(
    bp: CnnBlueprint,
    shape: SeedShape,
    params: &[T],
    x: &[T],
    alpha: &[T],
    y: &mut [T],
    ws: &mut Workspace<T>,
) {
    assert_eq!(alpha.len(), shape.envs, "blend amplitude per env [Eb]");
    forward_then_blend(bp, shape, params, x, Some(alpha), y, ws);
}

fn forward_then_blend<T: Real>(
    bp: CnnBlueprint,
    shape: SeedShape,
    params: &[T],
    x: &[T],
    blend: Option<&[T]>,
    y: &mut [T],
    ws: &mut Workspace<T>,
) {
    let layout = layout(bp, shape.channels);
    assert_eq!(params.len(), shape.envs * layout.param_count(), "seed params length [Eb, P]");
    assert_eq!(x.len(), shape.len(), "seed input length [Eb, B, C, H, W]");
    assert_eq!(y.len(), shape.len(), "seed output length [Eb, B, C, H, W]");
    ws.last_forward = Some((bp, shape));
    let staged = grown(&mut ws.params, params.len());
    layout.rows_to_tensors(shape.envs, params, staged);
    if shape.is_empty() {
        return;
    }
    let p = layout.split(shape.envs, staged);
    let buffers = &mut ws.buffers;
    match bp {
        CnnBlueprint::Norm => norm::forward(shape, p, x, y, buffers),
        CnnBlueprint::Attention => attention::forward(shape, p, x, y, buffers),
        CnnBlueprint::Bottleneck => bottleneck::forward(shape, p, x, y, buffers),
        CnnBlueprint::Depthwise => return depthwise::forward(shape, p, x, y, blend, buffers),
        CnnBlueprint::ConvSmall => return conv::single_forward(shape, 1, p, x, y, blend, buffers),
        CnnBlueprint::ConvLight => return conv::single_forward(shape, 3, p, x, y, blend, buffers),
        CnnBlueprint::ConvHeavy => return conv::heavy_forward(shape, p, x, y, blend, buffers),
    }
    if let Some(alpha) = blend {
        common::blend_add_in_place(shape.batch, shape.channels * shape.h * shape.w, x, alpha, y);
    }
}

/// The gradients of the last [`forward`] (same `bp`, `shape` and `x`; its parameters are kept in `ws`)
/// given `grad_y = ∂L/∂y`. Overwrites `grad_params` (`[Eb, P]`, packed like the rows) and, when given,
/// `grad_x` (`[Eb, B, C, H, W]`, residual path included).
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Real>(
    bp: CnnBlueprint,
    shape: SeedShape,
    x: &[T],
    grad_y: &[T],
    grad_params: &mut [T],
    grad_x: Option<&mut [T]>,
    ws: &mut Workspace<T>,
) {
    assert_eq!(grad_y.len(), shape.len(), "seed output gradient length [Eb, B, C, H, W]");
    backward_from(bp, shape, x, SeedOutputGrad::Whole(grad_y), grad_params, grad_x, ws);
}

/// The gradient at a seed's output, as [`backward_from`] takes it.
#[derive(Clone, Copy)]
pub enum SeedOutputGrad<'a, T> {
    /// `[Eb, B, C, H, W]`.
    Whole(&'a [T]),
    /// From the 2×2 max pool after the slot's ADD blend, for a blueprint that
    /// [`takes_pooled_gradient`] and no input gradient (an isolated seed).
    Pooled(PooledSeedGrad<'a, T>),
}

impl<'a, T> SeedOutputGrad<'a, T> {
    fn unit(self) -> UnitOutputGrad<'a, T> {
        match self {
            SeedOutputGrad::Whole(g) => UnitOutputGrad::Whole(g),
            SeedOutputGrad::Pooled(p) => UnitOutputGrad::Pooled(p),
        }
    }
}

/// Whether `bp`'s backward reads its output gradient a conv unit's image at a time, so it can take it
/// as a [`SeedOutputGrad::Pooled`] (conv_small, conv_light, conv_heavy).
pub fn takes_pooled_gradient(bp: CnnBlueprint) -> bool {
    matches!(bp, CnnBlueprint::ConvSmall | CnnBlueprint::ConvLight | CnnBlueprint::ConvHeavy)
}

/// [`backward`] with the output gradient whole or, for a blueprint that [`takes_pooled_gradient`], in
/// the pool's terms: the same bits either way.
#[allow(clippy::too_many_arguments)]
pub fn backward_from<T: Real>(
    bp: CnnBlueprint,
    shape: SeedShape,
    x: &[T],
    grad_y: SeedOutputGrad<'_, T>,
    grad_params: &mut [T],
    grad_x: Option<&mut [T]>,
    ws: &mut Workspace<T>,
) {
    assert_eq!(ws.last_forward, Some((bp, shape)), "seed backward must follow a forward of the same module");
    let layout = layout(bp, shape.channels);
    let n = shape.envs * layout.param_count();
    assert_eq!(grad_params.len(), n, "seed parameter gradient length [Eb, P]");
    assert_eq!(x.len(), shape.len(), "seed input length [Eb, B, C, H, W]");
    if let Some(gx) = &grad_x {
        assert_eq!(gx.len(), shape.len(), "seed input gradient length [Eb, B, C, H, W]");
    }
    let whole = match grad_y {
        SeedOutputGrad::Whole(g) => {
            assert_eq!(g.len(), shape.len(), "seed output gradient length [Eb, B, C, H, W]");
            Some(g)
        }
        SeedOutputGrad::Pooled(_) => {
            assert!(takes_pooled_gradient(bp), "{bp:?} takes its output gradient whole");
            assert!(grad_x.is_none(), "a pooled output gradient is for an isolated seed");
            None
        }
    };
    if shape.is_empty() {
        grad_params.fill(T::ZERO);
        return;
    }
    let p = layout.split(shape.envs, &ws.params[..n]);
    let grads = grown(&mut ws.grads, n);
    let g = layout.split_mut(shape.envs, grads);
    let buffers = &mut ws.buffers;
    let whole = || whole.expect("checked above");
    match bp {
        CnnBlueprint::Norm => norm::backward(shape, p, x, whole(), g, grad_x, buffers),
        CnnBlueprint::Attention => attention::backward(shape, p, x, whole(), g, grad_x, buffers),
        CnnBlueprint::Depthwise => depthwise::backward(shape, p, x, whole(), g, grad_x, buffers),
        CnnBlueprint::Bottleneck => bottleneck::backward(shape, p, x, whole(), g, grad_x, buffers),
        CnnBlueprint::ConvSmall => conv::single_backward(shape, 1, p, x, grad_y, g, grad_x, buffers),
        CnnBlueprint::ConvLight => conv::single_backward(shape, 3, p, x, grad_y, g, grad_x, buffers),
        CnnBlueprint::ConvHeavy => conv::heavy_backward(shape, p, x, grad_y, g, grad_x, buffers),
    }
    layout.tensors_to_rows(shape.envs, &ws.grads[..n], grad_params);
}

/// The parameter blocks of a gathered module, `[Eb, …]` each, in layout order.
type Tensors<'a, T> = [&'a [T]; MAX_TENSORS];
/// Their gradients, same order.
type TensorsMut<'a, T> = [&'a mut [T]; MAX_TENSORS];
