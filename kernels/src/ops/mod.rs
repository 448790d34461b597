//! Batched ops over envs: each op is a pure function over flat `[E, …]` buffers with the env as a parallel
//! dimension (rayon inside the op), with its forward and backward side by side.
//!
//! Conventions shared by every op:
//! * Activations are `[E, B, C, H, W]` (NCHW per env); per-env parameters lead with `E`.
//! * Every function *overwrites* its outputs, gradients included, unless its name ends in `_accumulate`
//!   (those add into the destination: for inputs that also feed a residual path).
//! * Every reduction has a fixed order that depends only on the shape, never on the env count or the
//!   number of threads: env `e` computed inside a batch of E envs is bit-identical to env `e` alone.
//! * Generic over [`Real`]: `f32` for training, `f64` for the finite-difference gradient tests.

// Lane and tile loops index several fixed-size arrays in lockstep; an index reads better there than zips.
#![allow(clippy::needless_range_loop)]

pub mod activation;
pub mod blend;
pub mod conv;
mod conv_avx512;
pub mod fused;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod pool;
pub mod precision;
pub mod real;

#[cfg(test)]
pub(crate) mod testing;

pub use activation::{
    add_in_place, relu_backward, relu_backward_in_place, relu_forward, relu_forward_in_place, sigmoid,
    sigmoid_backward, sigmoid_forward, tanh_backward, tanh_forward,
};
pub use blend::{
    Amplitude, BlendShape, blend_add_backward, blend_add_backward_from_pooled, blend_add_forward,
    blend_gate_backward, blend_gate_forward, blend_multiply_backward, blend_multiply_forward,
};
pub use conv::{
    Conv2dShape, conv2d_backward_input, conv2d_backward_input_accumulate, conv2d_backward_weight,
    conv2d_forward, conv2d_forward_with_plane_stats,
};
pub use fused::{
    NO_GRADIENT, batch_norm_backward_window_order, batch_norm_relu_eval_forward,
    batch_norm_relu_max_pool_backward, batch_norm_relu_max_pool_eval_forward,
    batch_norm_relu_max_pool_train_forward, batch_norm_relu_train_forward,
    relu_batch_norm_backward_window_order,
};
pub use linear::{LinearShape, linear_backward_input, linear_backward_params, linear_forward};
pub use loss::{ClassifierShape, count_correct, softmax_cross_entropy};
pub use norm::{
    BATCH_NORM_MOMENTUM, NORM_EPS, NormShape, batch_norm_backward, batch_norm_eval_forward,
    batch_norm_train_forward, group_norm_backward, group_norm_backward_accumulate, group_norm_forward,
    group_norm_relu_forward, plane_mean_and_m2, relu_group_norm_backward,
};
pub use pool::{
    PoolShape, global_avg_pool_backward, global_avg_pool_backward_accumulate, global_avg_pool_forward,
    max_pool2x2_backward, max_pool2x2_forward,
};
pub use real::Real;
