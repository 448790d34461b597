//! The kernel sources, embedded in the binary so a build carries its kernels (the device machine has
//! no source tree), with the functions each file must define.

/// Prepended to every file: typedefs and the grid-stride loop.
pub const COMMON_HEADER: &str = include_str!("../../cuda/common.cuh");

/// One `.cu` file and the `extern "C"` kernels it defines.
#[derive(Debug)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    /// Each is the CUDA twin of the CPU function named beside it in the file's comments.
    pub functions: &'static [&'static str],
}

pub const KERNEL_FILES: &[KernelFile] = &[
    KernelFile {
        name: "activation.cu",
        source: include_str!("../../cuda/activation.cu"),
        functions: &["relu_forward_f32", "relu_backward_f32", "add_f32", "add_relu_f32"],
    },
    KernelFile {
        name: "pool.cu",
        source: include_str!("../../cuda/pool.cu"),
        functions: &[
            "max_pool2x2_forward_f32",
            "max_pool2x2_backward_f32",
            "global_avg_pool_forward_f32",
            "global_avg_pool_backward_f32",
        ],
    },
    KernelFile {
        name: "batchnorm.cu",
        source: include_str!("../../cuda/batchnorm.cu"),
        functions: &[
            "batch_norm_stats_partial_f32",
            "batch_norm_stats_finish_f32",
            "batch_norm_stats_finish_runs_f32",
            "batch_norm_apply_f32",
            "batch_norm_relu_pool_f32",
            "relu_bn_backward_partial_f32",
            "batch_norm_backward_params_partial_f32",
            "batch_norm_backward_params_finish_f32",
            "batch_norm_backward_input_f32",
            "batch_norm_backward_input_from_f32",
        ],
    },
    KernelFile {
        name: "head.cu",
        source: include_str!("../../cuda/head.cu"),
        functions: &[
            "linear_forward_f32",
            "linear_backward_input_f32",
            "linear_backward_params_f32",
            "softmax_cross_entropy_f32",
            "count_correct_f32",
        ],
    },
    KernelFile {
        name: "conv.cu",
        source: include_str!("../../cuda/conv.cu"),
        functions: &[
            "conv2d_forward_f32",
            "conv2d_backward_input_f32",
            "conv2d_backward_weight_f32",
            "im2col_f32",
            "im2col_bf16",
            "round_to_bf16",
            "swap_middle_axes_to_bf16",
            "col2im_f32",
            "swap_middle_axes_f32",
            "depthwise_backward_weight_fast_f32",
            "fast_div_u32",
            "conv2d_implicit_m8_f32",
            "conv2d_implicit_m16_f32",
            "conv2d_implicit_m32_f32",
            "conv2d_wgrad_m8_f32",
            "conv2d_wgrad_m16_f32",
            "conv2d_wgrad_m32_f32",
            "conv2d_wgrad_reduce_f32",
            "conv3x3_direct_f32",
            "conv3x3_wgrad_direct_f32",
            "conv3x3_tc_n8_tf32",
            "conv3x3_tc_n8_w8_tf32",
            "conv3x3_tc_n8_w16_tf32",
            "conv3x3_tc_n8_w32_tf32",
            "conv3x3_tc_n16_tf32",
            "conv3x3_tc_n16_w8_tf32",
            "conv3x3_tc_n16_w16_tf32",
            "conv3x3_tc_n16_w32_tf32",
            "conv3x3_wgrad_tc_n8_tf32",
            "conv3x3_wgrad_tc_n8_w8_tf32",
            "conv3x3_wgrad_tc_n8_w16_tf32",
            "conv3x3_wgrad_tc_n8_w32_tf32",
            "conv3x3_wgrad_tc_n16_tf32",
            "conv3x3_wgrad_tc_n16_w8_tf32",
            "conv3x3_wgrad_tc_n16_w16_tf32",
            "conv3x3_wgrad_tc_n16_w32_tf32",
        ],
    },
    KernelFile {
        name: "seeds.cu",
        source: include_str!("../../cuda/seeds.cu"),
        functions: &[
            "group_norm_forward_f32",
            "group_norm_backward_params_f32",
            "group_norm_backward_params_fast_f32",
            "group_norm_backward_input_f32",
            "blend_add_forward_f32",
            "blend_add_backward_f32",
            "sigmoid_forward_f32",
            "sigmoid_backward_f32",
            "scale_planes_f32",
            "scale_planes_backward_scale_f32",
            "norm_seed_forward_f32",
            "norm_seed_scale_grad_f32",
            "norm_seed_image_partials_f32",
            "norm_seed_lambda_grad_f32",
            "slot_passthrough_f32",
            "slot_blend_select_f32",
            "slot_backward_split_f32",
            "slot_gate_grad_f32",
        ],
    },
    KernelFile {
        name: "data.cu",
        source: include_str!("../../cuda/data.cu"),
        functions: &[
            "gather_train_f32",
            "gather_test_f32",
            "train_epoch_accumulate",
            "validation_accumulate_f32",
        ],
    },
    KernelFile {
        name: "optim.cu",
        source: include_str!("../../cuda/optim.cu"),
        functions: &[
            "sq_norms_partial_f32",
            "sq_norms_finish",
            "clip_coefficients",
            "scale_per_env_f32",
            "sgd_step_f32",
            "zero_masked_rows_f32",
            "copy_masked_rows_f32",
        ],
    },
];
