//! Conv → GroupNorm → ReLU, the unit of conv_small, conv_light, conv_heavy and of depthwise's pointwise
//! stage. A forward and its backward over one gathered batch of envs.

use crate::ops::{
    Conv2dShape, NormShape, Real, conv2d_backward_input, conv2d_backward_input_accumulate,
    conv2d_backward_weight, conv2d_forward, group_norm_backward, group_norm_relu_forward, relu_backward,
    relu_backward_in_place,
};

/// The shapes of one conv → norm → ReLU unit (conv without bias, stride 1, size-preserving padding).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvNormRelu {
    pub conv: Conv2dShape,
    /// GroupNorm groups over the conv's output channels.
    pub groups: usize,
}

/// The unit's parameters, each `[E, …]`.
#[derive(Clone, Copy)]
pub(crate) struct BlockParams<'a, T> {
    pub weight: &'a [T],
    pub gamma: &'a [T],
    pub beta: &'a [T],
}

/// The unit's parameter gradients, each `[E, …]` (overwritten).
pub(crate) struct BlockGrads<'a, T> {
    pub weight: &'a mut [T],
    pub gamma: &'a mut [T],
    pub beta: &'a mut [T],
}

/// What the forward keeps for the backward.
#[derive(Clone, Copy)]
pub(crate) struct BlockState<'a, T> {
    /// The unit's input.
    pub input: &'a [T],
    /// The conv output (the norm's input).
    pub conv_out: &'a [T],
    /// The unit's output (after ReLU).
    pub out: &'a [T],
    pub mean: &'a [T],
    pub inv_std: &'a [T],
}

/// What the backward does with the gradient at the unit's input.
pub(crate) enum InputGrad<'a, T> {
    /// Not needed.
    Skip,
    /// Write it into the `grad` buffer (which held the output gradient on entry).
    IntoGrad,
    /// Add it into this buffer (the input also feeds a residual path).
    AccumulateInto(&'a mut [T]),
}

impl ConvNormRelu {
    pub fn norm_shape(&self) -> NormShape {
        let c = &self.conv;
        NormShape { envs: c.envs, batch: c.batch, channels: c.c_out, h: c.h_out(), w: c.w_out() }
    }

    /// Elements of each saved norm statistic `[E, B, G]`.
    pub fn stats_len(&self) -> usize {
        self.conv.envs * self.conv.batch * self.groups
    }

    /// `out = relu(GN(conv(input)))`, keeping the conv output and the norm statistics. The ReLU is applied
    /// in the norm's own pass (the same values as a separate pass, one read and write fewer).
    pub fn forward<T: Real>(
        &self,
        input: &[T],
        p: BlockParams<'_, T>,
        conv_out: &mut [T],
        out: &mut [T],
        mean: &mut [T],
        inv_std: &mut [T],
    ) {
        conv2d_forward(self.conv, input, p.weight, conv_out);
        group_norm_relu_forward(
            self.norm_shape(),
            self.groups,
            conv_out,
            p.gamma,
            p.beta,
            out,
            mean,
            inv_std,
        );
    }

    /// ∂L/∂out is `grad_out`, or (`None`) `grad`'s content on entry; `grad` (output sized) receives the
    /// gradient at the ReLU's input (read from `grad_out` in the same pass, without a copy first), and
    /// `scratch` (conv-output sized) is clobbered. Writes the parameter gradients and handles the input
    /// gradient as `input_grad` says (with [`InputGrad::IntoGrad`] the input and output must have the same
    /// size, true of every seed unit).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Real>(
        &self,
        state: BlockState<'_, T>,
        p: BlockParams<'_, T>,
        grad_out: Option<&[T]>,
        grad: &mut [T],
        scratch: &mut [T],
        g: BlockGrads<'_, T>,
        input_grad: InputGrad<'_, T>,
    ) {
        match grad_out {
            Some(grad_out) => relu_backward(state.out, grad_out, grad),
            None => relu_backward_in_place(state.out, grad),
        }
        let grad_conv_out = scratch;
        group_norm_backward(
            self.norm_shape(),
            self.groups,
            state.conv_out,
            p.gamma,
            state.mean,
            state.inv_std,
            grad,
            grad_conv_out,
            g.gamma,
            g.beta,
        );
        conv2d_backward_weight(self.conv, state.input, grad_conv_out, g.weight);
        match input_grad {
            InputGrad::Skip => {}
            InputGrad::IntoGrad => conv2d_backward_input(self.conv, grad_conv_out, p.weight, grad),
            InputGrad::AccumulateInto(dst) => {
                conv2d_backward_input_accumulate(self.conv, grad_conv_out, p.weight, dst)
            }
        }
    }
}
