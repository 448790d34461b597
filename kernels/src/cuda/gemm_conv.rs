//! The host's convolutions as GEMMs (stride 1, one group): `im2col_f32` lays every env's input out as a
//! `(c_in·k·k) × (B·P)` matrix, one strided-batched cuBLAS SGEMM over the envs multiplies it by the
//! weights, and `swap_middle_axes_f32` moves between the GEMM's channel-major rows `[E, C, B·P]` and the
//! network's `[E, B, C, P]`. The backward does the same with the transposes; `col2im_f32` gathers the
//! column gradient back onto the input. The selftest checks all three against `ops::conv` (their CPU
//! twin) to a tolerance: cuBLAS sums in its own order. cuBLAS gives the same bits run after run on
//! the same GPU model, so runs stay reproducible.
//!
//! Row-major `C = A·B` is column-major `Cᵀ = Bᵀ·Aᵀ`: each call below passes cuBLAS the row-major
//! buffers as the column-major transposes they are.
//!
//! The multiply's precision is the device's ([`Precision`], `--precision`): f32 SGEMM; TF32 (the same
//! SGEMM in cuBLAS's tensor-core math mode); or bf16, where the column matrix, the output gradient's
//! rows and the weights are written as bfloat16 (`im2col_bf16`, `swap_middle_axes_to_bf16`,
//! `round_to_bf16`) and one `cublasGemmStridedBatchedEx` sums their products into f32. The results,
//! the gradients and the weights the optimizer keeps stay f32. At TF32 the 3×3 convolutions that
//! [`direct_fits`] takes (every host block and 3×3 seed) skip cuBLAS and its column matrix: they run on
//! the tensor cores from input tiles staged in shared memory (`conv3x3_tc_*_tf32`,
//! `conv3x3_wgrad_tc_*_tf32`), and the rest (the seeds' 1×1 convolutions) by the f32
//! implicit GEMM, which beat cuBLAS's TF32 GEMMs on these thin shapes as a whole (W16 with seeds on
//! an H100: 254 ms at f32 against 378 ms at cuBLAS TF32). `ESPER_CUDA_CONV=im2col` sends them all to
//! cuBLAS, to compare.

use cudarc::cublas::sys::cublasOperation_t::{self, CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cudaDataType_t};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchArgs, LaunchConfig, PushKernelArg};

use super::ops;
use super::parity::{Device, NULL, ParityError, blocks_of_256, elementwise, push_dims, push_optional};
use crate::ops::conv::TC_SQUARE_WIDTHS;
use crate::ops::precision::Precision;
use crate::ops::{Conv2dShape, NormShape};

/// Rows of a convolution's column matrix, `c_in·k·k` (one group).
fn col_rows(c: &Conv2dShape) -> usize {
    c.c_in * c.k * c.k
}

/// Output positions of one image, `h_out·w_out`.
fn out_positions(c: &Conv2dShape) -> usize {
    c.h_out() * c.w_out()
}

/// Columns of the column matrix, `B·P`.
fn col_columns(c: &Conv2dShape) -> usize {
    c.batch * out_positions(c)
}

/// Values of every env's column matrix.
fn col_len(c: &Conv2dShape) -> usize {
    c.envs * col_rows(c) * col_columns(c)
}

/// `im2col_f32` / `col2im_f32`'s shape arguments.
fn im2col_args(c: &Conv2dShape) -> [u32; 7] {
    [c.envs, c.batch, c.c_in, c.h, c.w, c.k, c.pad].map(|d| d as u32)
}

/// cuBLAS's workspace: NVIDIA's recommendation for Hopper. Given explicitly, so that cuBLAS never
/// allocates one inside a CUDA graph capture.
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// cuBLAS on the device's stream and the scratch of the largest convolution it has run.
pub struct GemmConv {
    blas: CudaBlas,
    /// cuBLAS's workspace (kept alive while the handle may use it).
    _workspace: CudaSlice<u8>,
    /// The column matrix (forward, weight gradient) or its gradient (input gradient).
    col: CudaSlice<f32>,
    /// The GEMM's channel-major output, or the output gradient moved into that layout.
    rows: CudaSlice<f32>,
    /// With bf16 multiplies: the GEMMs' inputs as bfloat16 bits.
    bf16: Option<Bf16Scratch>,
    /// f32 multiplies (and at TF32 the convolutions the tensor-core kernels do not take): the forward,
    /// the input gradient and the weight gradient as implicit GEMMs (`conv2d_implicit_*`,
    /// `conv2d_wgrad_*`), no column matrix: `col` then holds only the weight gradient's partial sums
    /// and `rows` nothing. Off with `ESPER_CUDA_CONV=im2col` (to measure the two against each other)
    /// or [`Self::set_implicit`].
    implicit: bool,
    /// With `implicit`: the 3×3 convolutions by `conv3x3_direct_f32` (forward, input gradient) and
    /// `conv3x3_wgrad_direct_f32` (weight gradient) where [`direct_fits`] (the rest stays implicit). On with `ESPER_CUDA_CONV=direct` or
    /// [`Self::set_direct`]; off by default until an H100 has measured it against the implicit GEMM.
    direct: bool,
    /// TF32 multiplies: the 3×3 convolutions [`direct_fits`] takes on the tensor cores
    /// (`conv3x3_tc_*_tf32`, `conv3x3_wgrad_tc_*_tf32`), the rest as implicit GEMMs (with `implicit`).
    /// On at TF32 unless `ESPER_CUDA_CONV=im2col` (all through cuBLAS), or by [`Self::set_tensor_cores`].
    tensor_cores: bool,
    /// With `tensor_cores`: square planes of 8, 16 or 32 by the kernels specialised to their width
    /// (`conv3x3_tc_n*_w{8,16,32}_tf32`, `conv3x3_wgrad_tc_n*_w{8,16,32}_tf32`: the same sums, bit for
    /// bit, with fewer instructions a step), the others by the general ones. Off with
    /// `ESPER_CUDA_TC_SQUARE=0` (to measure the two on one machine) or [`Self::set_square_kernels`].
    square: bool,
    /// The lengths `col` and `rows` need for the im2col + GEMM form of the largest convolutions, and
    /// the length `col` needs for the weight gradients' partial sums (implicit, direct or tensor-core).
    im2col_lens: (usize, usize),
    implicit_col_len: usize,
    /// The implicit GEMMs multiply in f32, and run at f32 and TF32.
    precision: Precision,
}

/// The bf16 GEMM's inputs: the column matrix, the output gradient's channel-major rows and the weights.
struct Bf16Scratch {
    col: CudaSlice<u16>,
    rows: CudaSlice<u16>,
    weight: CudaSlice<u16>,
}

impl GemmConv {
    /// cuBLAS on `device`'s stream at the device's [`Precision`], with scratch for convolutions up to
    /// `largest` (their column matrices, [`Conv2dShape::output_len`] and, in bf16, their weights).
    pub fn new(device: &Device, largest: &[Conv2dShape]) -> Result<Self, ParityError> {
        let most = |len: fn(&Conv2dShape) -> usize| largest.iter().map(len).max().unwrap_or(1).max(1);
        let (col, rows) = (most(col_len), most(Conv2dShape::output_len));
        let stream = &device.stream;
        let blas = CudaBlas::new(stream.clone())?;
        let mut workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
        {
            let (ptr, _write) = workspace.device_ptr_mut(stream);
            // Safety: the workspace lives as long as the handle (both fields of this struct) and is
            // used only on the stream the handle was given.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut _,
                    CUBLAS_WORKSPACE_BYTES,
                )
            }
            .result()?;
        }
        let bf16 = match device.precision() {
            Precision::F32 => None,
            Precision::Tf32 => {
                // f32 data, multiplied on the tensor cores with TF32 inputs.
                let mode = cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH;
                unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) }.result()?;
                None
            }
            Precision::Bf16 => Some(Bf16Scratch {
                col: stream.alloc_zeros::<u16>(col)?,
                rows: stream.alloc_zeros::<u16>(rows)?,
                weight: stream.alloc_zeros::<u16>(most(Conv2dShape::weight_len))?,
            }),
        };
        let choice = std::env::var("ESPER_CUDA_CONV").ok();
        let implicit = device.precision() != Precision::Bf16 && choice.as_deref() != Some("im2col");
        let direct = device.precision() == Precision::F32 && implicit && choice.as_deref() == Some("direct");
        let tensor_cores = device.precision() == Precision::Tf32 && implicit;
        let square = std::env::var("ESPER_CUDA_TC_SQUARE").map_or(true, |v| v != "0");
        // Any weight gradient's partial sums: the implicit one's, the direct one's (`ESPER_CUDA_CONV=direct`)
        // or the tensor cores' (TF32), all in `col`.
        let partial_len = |d: &Conv2dShape| {
            let staged = |kernel| staged_wgrad_partial_len(d, kernel);
            wgrad_partial_len(d).max(staged(Staged::Direct)).max(staged(Staged::TensorCores))
        };
        let (im2col_lens, implicit_col_len) = ((col, rows), most(partial_len));
        // The implicit GEMMs write no column matrix: at W16 that is gigabytes of device memory the
        // scratch no longer takes (a seed's 3×3 convolution at 32×32: 16 · 72 · 512 · 1024 floats).
        let (col, rows) = if implicit { (implicit_col_len, 1) } else { im2col_lens };
        let (col, rows) = (stream.alloc_zeros::<f32>(col)?, stream.alloc_zeros::<f32>(rows)?);
        let precision = device.precision();
        Ok(Self {
            blas,
            _workspace: workspace,
            col,
            rows,
            bf16,
            implicit,
            direct,
            tensor_cores,
            square,
            im2col_lens,
            implicit_col_len,
            precision,
        })
    }

    /// Runs the convolutions as implicit GEMMs (`on`, at f32 or TF32) or as im2col + GEMM, growing the
    /// scratch to what the chosen form needs.
    pub(super) fn set_implicit(&mut self, device: &Device, on: bool) -> R {
        assert!(!on || self.precision != Precision::Bf16, "the bf16 GEMMs take the column matrix");
        if on && self.col.len() < self.implicit_col_len {
            self.col = device.stream.alloc_zeros::<f32>(self.implicit_col_len)?;
        }
        let (col, rows) = self.im2col_lens;
        if !on && self.col.len() < col {
            self.col = device.stream.alloc_zeros::<f32>(col)?;
        }
        if !on && self.rows.len() < rows {
            self.rows = device.stream.alloc_zeros::<f32>(rows)?;
        }
        self.implicit = on;
        self.direct &= on;
        Ok(())
    }

    /// Runs the 3×3 convolutions [`direct_fits`] takes directly (`on`, implicit GEMMs only) or as
    /// implicit GEMMs.
    pub(super) fn set_direct(&mut self, on: bool) {
        assert!(!on || self.implicit, "the direct convolution replaces the implicit GEMM");
        self.direct = on;
    }

    /// At TF32: the 3×3 convolutions [`direct_fits`] takes on the tensor cores and the rest as implicit
    /// GEMMs (`on`), or all through cuBLAS, growing the scratch to what the chosen form needs.
    pub(super) fn set_tensor_cores(&mut self, device: &Device, on: bool) -> R {
        assert!(!on || self.precision == Precision::Tf32, "the tensor-core convolutions multiply in TF32");
        self.set_implicit(device, on)?;
        self.tensor_cores = on;
        Ok(())
    }

    /// At TF32 on the tensor cores: the square planes [`Conv2dShape::tc_square_width`] takes by their
    /// specialised kernels (`on`, the default) or by the general ones.
    pub(super) fn set_square_kernels(&mut self, on: bool) {
        self.square = on;
    }

    /// The width of the specialised tensor-core kernels that run `d`'s planes, if they do.
    fn square(&self, d: &Conv2dShape) -> Option<usize> {
        if self.square { d.tc_square_width() } else { None }
    }

    /// The staged 3×3 kernel that runs `d`, if one does: the tensor-core one at TF32, the direct one
    /// when chosen at f32.
    fn staged(&self, d: &Conv2dShape) -> Option<Staged> {
        if !direct_fits(d) {
            None
        } else if self.tensor_cores {
            Some(Staged::TensorCores)
        } else if self.direct {
            Some(Staged::Direct)
        } else {
            None
        }
    }

    fn check(&self, d: &Conv2dShape) {
        // The implicit GEMMs use no column matrix (the weight gradient checks its partial sums).
        assert!(
            self.implicit || (col_len(d) <= self.col.len() && d.output_len() <= self.rows.len()),
            "GemmConv scratch was sized for smaller convolutions than {d:?}"
        );
        if let Some(h) = &self.bf16 {
            assert!(
                d.weight_len() <= h.weight.len(),
                "GemmConv scratch was sized for smaller weights than {d:?}"
            );
        }
        assert_eq!(d.groups, 1, "the GEMM form takes one group");
        assert!(
            col_columns(d) <= i32::MAX as usize && col_rows(d) <= i32::MAX as usize,
            "GEMM dimensions exceed i32"
        );
    }

    /// The column matrix of `x`, in f32 or (bf16 multiplies) in bf16.
    fn im2col(&mut self, device: &Device, d: &Conv2dShape, x: &CudaSlice<f32>) -> Result<(), ParityError> {
        let args = im2col_args(d);
        let mut launch;
        match &mut self.bf16 {
            None => {
                launch = device.stream.launch_builder(device.function("im2col_f32"));
                launch.arg(x).arg(&mut self.col);
            }
            Some(h) => {
                launch = device.stream.launch_builder(device.function("im2col_bf16"));
                launch.arg(x).arg(&mut h.col);
            }
        }
        push_dims(&mut launch, &args);
        unsafe { launch.launch(elementwise(col_len(d))) }?;
        Ok(())
    }

    /// The output gradient `dy` (`[E, B, c_out, P]`) into channel-major rows `[E, c_out, B·P]`: f32
    /// in [`Self::rows`], or bf16 for bf16 multiplies.
    fn dy_rows(&mut self, device: &Device, d: &Conv2dShape, dy: &CudaSlice<f32>) -> Result<(), ParityError> {
        let dims = [d.envs, d.batch, d.c_out, out_positions(d)];
        let Some(h) = &mut self.bf16 else { return Self::swap(device, dy, &mut self.rows, dims) };
        let [envs, a, b, plane] = dims.map(|v| v as u32);
        let mut launch = device.stream.launch_builder(device.function("swap_middle_axes_to_bf16"));
        launch.arg(dy).arg(&mut h.rows).arg(&envs).arg(&a).arg(&b).arg(&plane);
        unsafe { launch.launch(elementwise(dims.iter().product())) }?;
        Ok(())
    }

    /// bf16 multiplies: the weights (`[E, c_out, K]`) rounded into the scratch.
    fn weight_bf16(device: &Device, d: &Conv2dShape, weight: &CudaSlice<f32>, h: &mut Bf16Scratch) -> R {
        let n = d.weight_len() as u64;
        let mut launch = device.stream.launch_builder(device.function("round_to_bf16"));
        launch.arg(weight).arg(&mut h.weight).arg(&n);
        unsafe { launch.launch(elementwise(d.weight_len())) }?;
        Ok(())
    }

    /// `dst[e][b][a][p] = src[e][a][b][p]`.
    fn swap(
        device: &Device,
        src: &CudaSlice<f32>,
        dst: &mut CudaSlice<f32>,
        dims: [usize; 4],
    ) -> Result<(), ParityError> {
        let [envs, a, b, plane] = dims.map(|d| d as u32);
        let mut launch = device.stream.launch_builder(device.function("swap_middle_axes_f32"));
        launch.arg(src).arg(dst).arg(&envs).arg(&a).arg(&b).arg(&plane);
        unsafe { launch.launch(elementwise(dims.iter().product())) }?;
        Ok(())
    }

    /// `y = conv(x, weight)`: per env `Y' (c_out × B·P) = W (c_out × K) · col (K × B·P)`, then `Y'` into
    /// `[E, B, c_out, P]`.
    pub fn forward(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), ParityError> {
        self.check(d);
        if let Some(kernel) = self.staged(d) {
            return staged_conv(device, kernel, d, x, weight, y, false, None, None, self.square(d));
        }
        if self.implicit {
            return implicit_conv(device, d, x, weight, y, false);
        }
        self.im2col(device, d, x)?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major Y'ᵀ (n × c_out) = colᵀ (n × k) · Wᵀ (k × c_out).
        let cfg = batched(d.envs, CUBLAS_OP_N, CUBLAS_OP_N, n, c_out, k);
        match &mut self.bf16 {
            None => unsafe { self.blas.gemm_strided_batched(cfg, &self.col, weight, &mut self.rows) }?,
            Some(h) => {
                Self::weight_bf16(device, d, weight, h)?;
                gemm_bf16(&self.blas, device, &cfg, &h.col, &h.weight, &mut self.rows)?;
            }
        }
        Self::swap(device, &self.rows, y, [d.envs, c_out, d.batch, out_positions(d)])
    }

    /// The weight gradient: per env `dW (c_out × K) = dY' (c_out × B·P) · colᵀ (B·P × K)`, with `dY'` the
    /// output gradient `dy` moved into channel-major rows.
    pub fn backward_weight(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        grad_weight: &mut CudaSlice<f32>,
    ) -> Result<(), ParityError> {
        self.check(d);
        if let Some(kernel) = self.staged(d) {
            let square = self.square(d);
            return staged_weight_grad(device, kernel, d, x, dy, &mut self.col, grad_weight, None, square);
        }
        if self.implicit {
            return implicit_weight_grad(device, d, x, dy, &mut self.col, grad_weight);
        }
        self.dy_rows(device, d, dy)?;
        self.im2col(device, d, x)?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major dWᵀ (k × c_out) = (colᵀ)ᵀ · dY'ᵀ, colᵀ stored n × k, dY'ᵀ stored n × c_out.
        let cfg = batched(d.envs, CUBLAS_OP_T, CUBLAS_OP_N, k, c_out, n);
        match &self.bf16 {
            None => unsafe { self.blas.gemm_strided_batched(cfg, &self.col, &self.rows, grad_weight) }?,
            Some(h) => gemm_bf16(&self.blas, device, &cfg, &h.col, &h.rows, grad_weight)?,
        }
        Ok(())
    }

    /// The input gradient (overwriting `dx`): per env `dcol (K × B·P) = Wᵀ (K × c_out) · dY' (c_out ×
    /// B·P)`, then `col2im_f32`. Moves `dy` into channel-major rows itself, so it does not depend on a
    /// [`Self::backward_weight`] before it.
    pub fn backward_input(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        dy: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), ParityError> {
        self.check(d);
        if let Some(kernel) = self.staged(d) {
            return staged_conv(device, kernel, d, dy, weight, dx, true, None, None, self.square(d));
        }
        if self.implicit {
            return implicit_conv(device, d, dy, weight, dx, true);
        }
        self.dy_rows(device, d, dy)?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major dcolᵀ (n × k) = dY'ᵀ (n × c_out) · W (c_out × k), W stored as Wᵀ (k × c_out).
        let cfg = batched(d.envs, CUBLAS_OP_N, CUBLAS_OP_T, n, k, c_out);
        match &mut self.bf16 {
            None => unsafe { self.blas.gemm_strided_batched(cfg, &self.rows, weight, &mut self.col) }?,
            Some(h) => {
                Self::weight_bf16(device, d, weight, h)?;
                gemm_bf16(&self.blas, device, &cfg, &h.rows, &h.weight, &mut self.col)?;
            }
        }
        let args = im2col_args(d);
        let overwrite = 0i32;
        let mut launch = device.stream.launch_builder(device.function("col2im_f32"));
        launch.arg(&self.col).arg(dx);
        push_dims(&mut launch, &args);
        launch.arg(&overwrite);
        unsafe { launch.launch(elementwise(d.envs * d.batch * d.c_in * d.h * d.w)) }?;
        Ok(())
    }

    /// Whether `d`'s forward can sum batch norm's training statistics of its output in its epilogue
    /// ([`Self::forward_with_stats`]): the tensor-core 3×3 kernels run it.
    pub fn sums_stats(&self, d: &Conv2dShape) -> bool {
        self.staged(d) == Some(Staged::TensorCores)
    }

    /// [`Self::forward`], with batch norm's training statistics of `y` summed in the epilogue into
    /// `stats` (`[E·c_out, runs, 3]`, runs = [`stats_runs`]; `ops::batch_norm_stats_finish_runs` turns
    /// them into the statistics): `y` the same bits as `forward`'s. Only where [`Self::sums_stats`].
    pub fn forward_with_stats(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        x: &CudaSlice<f32>,
        weight: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        stats: &mut CudaSlice<f64>,
    ) -> R {
        self.check(d);
        assert!(self.sums_stats(d), "forward_with_stats: the tensor-core kernels run {d:?}");
        assert!(
            stats.len() >= d.envs * d.c_out * stats_runs(d).0 * 3,
            "convolution statistics exceed their buffer"
        );
        staged_conv(device, Staged::TensorCores, d, x, weight, y, false, None, Some(stats), self.square(d))
    }

    /// Whether `d`'s backward can read its output gradient as batch norm's input gradient computed on load
    /// ([`Self::backward_weight_from_norm`], [`Self::backward_input_from_norm`]): the staged 3×3 kernels
    /// run it (TF32 on the tensor cores, or the direct f32 kernels).
    pub fn reads_norm_grad(&self, d: &Conv2dShape) -> bool {
        self.staged(d).is_some()
    }

    /// Whether [`Self::backward_weight_from_norm`] loads each value of batch norm's input gradient of
    /// `d` once, from the pool's gradient: on a square tensor-core weight gradient
    /// (`conv3x3_wgrad_tc_n*_w*_bnpool_tf32`) whose blocks each take all of `d`'s input and output
    /// channels (one chunk of 4 by one output group), as the host's first block's (3 → 8). Where the
    /// input gradient is not wanted either, the gradient is then computed exactly once and never
    /// written, which `DeviceHost` takes by default.
    pub fn reads_norm_grad_once(&self, d: &Conv2dShape) -> bool {
        self.staged(d) == Some(Staged::TensorCores) && self.square && d.tc_weight_grad_single_block()
    }

    /// [`Self::backward_weight`] with the output gradient batch norm's input gradient, computed as the
    /// staged kernel loads it from `grad` (never written): the same bits as `backward_weight` on that
    /// gradient written by `ops::batch_norm_backward_input_from`. Only where [`Self::reads_norm_grad`].
    pub fn backward_weight_from_norm(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        x: &CudaSlice<f32>,
        grad: &BatchNormGrad,
        grad_weight: &mut CudaSlice<f32>,
    ) -> R {
        self.check(d);
        let kernel = self.staged(d).expect("backward_weight_from_norm: a staged kernel runs the shape");
        grad.check(d);
        // The square tensor-core weight gradients compute batch norm's gradient from the pool's
        // (`_bnpool`); the ReLU's alone, and the direct kernels, take the general ones.
        let square = self.square(d).filter(|_| kernel == Staged::TensorCores && grad.argmax.is_some());
        staged_weight_grad(device, kernel, d, x, grad.dy, &mut self.col, grad_weight, Some(grad), square)
    }

    /// [`Self::backward_input`] from batch norm's input gradient computed on load, as
    /// [`Self::backward_weight_from_norm`].
    pub fn backward_input_from_norm(
        &mut self,
        device: &Device,
        d: &Conv2dShape,
        grad: &BatchNormGrad,
        weight: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> R {
        self.check(d);
        let kernel = self.staged(d).expect("backward_input_from_norm: a staged kernel runs the shape");
        grad.check(d);
        staged_conv(device, kernel, d, grad.dy, weight, dx, true, Some(grad), None, self.square(d))
    }
}

type R = Result<(), ParityError>;

/// A convolution's output gradient as batch norm's input gradient, read by the staged kernels as they
/// load it (conv.cu's `BnLoad`): batch norm's input `x` (the convolution's output), the gradient `dy`
/// that reached the block — the pool's output gradient with `argmax`, else the ReLU's — and the
/// coefficients `ops::relu_batch_norm_backward_params` wrote (`[E·C, BN_COEF]`).
pub struct BatchNormGrad<'a> {
    pub x: &'a CudaSlice<f32>,
    pub dy: &'a CudaSlice<f32>,
    pub argmax: Option<&'a CudaSlice<u8>>,
    pub coef: &'a CudaSlice<f32>,
}

/// conv.cu's `BN_LOAD_*` modes.
const BN_LOAD_NONE: i32 = 0;
const BN_LOAD_RELU: i32 = 1;
const BN_LOAD_POOLED: i32 = 2;

impl BatchNormGrad<'_> {
    /// The buffers cover the convolution `d`'s output.
    fn check(&self, d: &Conv2dShape) {
        let norm = NormShape { envs: d.envs, batch: d.batch, channels: d.c_out, h: d.h, w: d.w };
        ops::check_grad_source(&norm, self.dy, self.argmax);
        assert!(self.x.len() >= norm.len(), "batch norm's input is smaller than the convolution's output");
        assert!(self.coef.len() >= norm.params_len() * ops::BN_COEF, "batch norm's coefficients are too few");
    }
}

/// The staged kernels' last five arguments (`BN_ARGS`): `grad`'s buffers and mode, or none.
fn push_bn<'a>(launch: &mut LaunchArgs<'a>, grad: Option<&'a BatchNormGrad<'a>>) {
    match grad {
        Some(g) => {
            launch.arg(g.x).arg(g.dy);
            push_optional(launch, g.argmax);
            launch.arg(g.coef).arg(if g.argmax.is_some() { &BN_LOAD_POOLED } else { &BN_LOAD_RELU });
        }
        None => {
            launch.arg(&NULL).arg(&NULL).arg(&NULL).arg(&NULL).arg(&BN_LOAD_NONE);
        }
    }
}

/// The smallest block height of 8, 16 or 32 output channels that holds `c_out` (more blocks above 32),
/// and its index in the kernels' name tables ([`IMPLICIT_KERNELS`], [`WGRAD_KERNELS`]).
fn block_height(c_out: usize) -> (usize, usize) {
    match c_out {
        0..=8 => (8, 0),
        9..=16 => (16, 1),
        _ => (32, 2),
    }
}

/// `conv2d_implicit_m{8,16,32}_f32` and `conv2d_wgrad_m{8,16,32}_f32`, by [`block_height`]'s index.
const IMPLICIT_KERNELS: [&str; 3] =
    ["conv2d_implicit_m8_f32", "conv2d_implicit_m16_f32", "conv2d_implicit_m32_f32"];
const WGRAD_KERNELS: [&str; 3] = ["conv2d_wgrad_m8_f32", "conv2d_wgrad_m16_f32", "conv2d_wgrad_m32_f32"];

/// Blocks the weight gradient aims for: about two waves of an H100 (132 SMs, eight 256-thread blocks
/// each); its output is small, so it is the column runs (chunks) that fill the GPU.
const WGRAD_TARGET_BLOCKS: usize = 2048;

/// How [`implicit_weight_grad`] cuts `d`'s `B·P` columns: (runs, columns per run, a multiple of 16).
/// Enough runs to make about [`WGRAD_TARGET_BLOCKS`] blocks, each at least 256 columns long, no more
/// than `B·P / c_out` (the partial sums never outgrow the column matrix they replace) and within the
/// grid's 65 535 in z (envs · runs).
fn wgrad_chunks(d: &Conv2dShape) -> (usize, usize) {
    let (columns, depth) = (col_columns(d), col_rows(d));
    let (rows, _) = block_height(d.c_out);
    let tiles = depth.div_ceil(64) * d.c_out.div_ceil(rows);
    let most = (columns / 256).min(columns / d.c_out.max(1)).min(65_535 / d.envs.max(1)).max(1);
    let wanted = WGRAD_TARGET_BLOCKS.div_ceil(tiles * d.envs.max(1)).clamp(1, most);
    let chunk_len = columns.div_ceil(wanted).next_multiple_of(16).max(16);
    (columns.div_ceil(chunk_len).max(1), chunk_len)
}

/// Room for the partial sums [`implicit_weight_grad`] writes for `d`, `[E, runs, c_out, K]`, at the
/// most runs [`wgrad_chunks`] cuts (the target's share per tile and env, whatever the batch): so
/// scratch sized for a shape also holds it at any smaller batch.
fn wgrad_partial_len(d: &Conv2dShape) -> usize {
    let (rows, _) = block_height(d.c_out);
    let tiles = col_rows(d).div_ceil(64) * d.c_out.div_ceil(rows);
    let most_runs = WGRAD_TARGET_BLOCKS.div_ceil(tiles * d.envs.max(1)).max(1);
    d.envs * most_runs * d.c_out * col_rows(d)
}

/// `d`'s weight gradient (overwritten) as an implicit GEMM: `conv2d_wgrad_m{8,16,32}_f32` sums runs of
/// the `B·P` columns into `partial` (the column scratch, sized by [`wgrad_partial_len`]), then
/// `conv2d_wgrad_reduce_f32` adds the runs in order.
pub(super) fn implicit_weight_grad(
    device: &Device,
    d: &Conv2dShape,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    partial: &mut CudaSlice<f32>,
    grad_weight: &mut CudaSlice<f32>,
) -> R {
    assert_eq!(d.groups, 1, "the implicit GEMM takes one group");
    let (columns, depth) = (col_columns(d), col_rows(d));
    let (rows, kernel) = block_height(d.c_out);
    let (chunks, chunk_len) = wgrad_chunks(d);
    assert!(
        d.envs * chunks * d.c_out * depth <= partial.len() && columns < 1 << 31, // run ends within u32
        "implicit weight gradient: partial sums exceed the scratch"
    );
    let dims = [d.batch, d.c_in, d.c_out, d.h, d.w, d.k, d.pad, chunks, chunk_len].map(|v| v as u32);
    let mut launch = device.stream.launch_builder(device.function(WGRAD_KERNELS[kernel]));
    launch.arg(x).arg(dy).arg(&mut *partial);
    push_dims(&mut launch, &dims);
    let grid = (depth.div_ceil(64) as u32, d.c_out.div_ceil(rows) as u32, (d.envs * chunks) as u32);
    unsafe { launch.launch(blocks_of_256(grid)) }?;
    reduce_runs(device, d, chunks, partial, grad_weight)
}

/// `conv2d_wgrad_reduce_f32`: `d`'s weight gradient (overwritten) from the `runs` partial sums
/// `[E, runs, c_out, K]` a weight-gradient kernel wrote, added in order.
fn reduce_runs(
    device: &Device,
    d: &Conv2dShape,
    runs: usize,
    partial: &CudaSlice<f32>,
    grad_weight: &mut CudaSlice<f32>,
) -> R {
    let per_env = d.c_out * col_rows(d);
    let (envs, runs32, per_env32) = (d.envs as u32, runs as u32, per_env as u32);
    let mut launch = device.stream.launch_builder(device.function("conv2d_wgrad_reduce_f32"));
    launch.arg(partial).arg(grad_weight).arg(&envs).arg(&runs32).arg(&per_env32);
    unsafe { launch.launch(elementwise(d.envs * per_env)) }?;
    Ok(())
}

/// `conv2d_implicit_m{8,16,32}_f32` (conv.cu): the forward `y = conv(x, weight)` of `d`, or with
/// `input_grad` its input gradient `dx` (overwritten) from the output gradient `dy` passed as `x` — the
/// same kernel over the transposed, flipped weights with padding `k − 1 − pad`. Blocks of 8, 16 or 32
/// output channels (the smallest that holds them; more blocks above 32) by 128 output columns.
pub(super) fn implicit_conv(
    device: &Device,
    d: &Conv2dShape,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    input_grad: bool,
) -> R {
    assert_eq!(d.groups, 1, "the implicit GEMM takes one group");
    // The kernel's view: (input channels, output channels, input size, padding).
    let (c_in, c_out, h, w, pad) = if input_grad {
        (d.c_out, d.c_in, d.h_out(), d.w_out(), d.k - 1 - d.pad)
    } else {
        (d.c_in, d.c_out, d.h, d.w, d.pad)
    };
    let columns = d.batch * (h + 2 * pad + 1 - d.k) * (w + 2 * pad + 1 - d.k);
    // Column indices (block start + 128) stay within u32; rows past K fail the bounds by a shift of
    // 2^14 rows (conv2d_implicit's tap table).
    assert!(columns < 1 << 31 && d.envs <= 65_535, "implicit GEMM: grid exceeds the device's");
    assert!(h < 1 << 14, "implicit GEMM: planes taller than 16 383 rows");
    // The kernel's tap offsets within an image are i32.
    assert!(c_in * h * w <= i32::MAX as usize, "implicit GEMM: an image exceeds i32 offsets");
    let (block_rows, kernel) = block_height(c_out);
    let dims = [d.batch, c_in, c_out, h, w, d.k, pad].map(|v| v as u32);
    let flip = i32::from(input_grad);
    let mut launch = device.stream.launch_builder(device.function(IMPLICIT_KERNELS[kernel]));
    launch.arg(x).arg(weight).arg(y);
    push_dims(&mut launch, &dims);
    launch.arg(&flip);
    let grid = (columns.div_ceil(128) as u32, c_out.div_ceil(block_rows) as u32, d.envs as u32);
    unsafe { launch.launch(blocks_of_256(grid)) }?;
    Ok(())
}

/// Whether `conv3x3_direct_f32` (conv.cu) and the other staged 3×3 kernels take `d`
/// ([`Conv2dShape::fits_staged_3x3`]).
pub(super) fn direct_fits(d: &Conv2dShape) -> bool {
    d.fits_staged_3x3()
}

/// The 3×3 kernels that stage zero-padded input tiles (4 input channels of `1024 / (h·w)` images) in
/// shared memory, for the shapes [`direct_fits`] takes: forward and input gradient (one kernel, `flip`)
/// and weight gradient, with the same arguments and grids whichever runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Staged {
    /// f32 multiply-adds in the twins' order (`conv3x3_direct_f32`, `conv3x3_wgrad_direct_f32`).
    Direct,
    /// TF32 on the tensor cores (`conv3x3_tc_n{8,16}_tf32`, `conv3x3_wgrad_tc_n{8,16}_tf32`).
    TensorCores,
}

impl Staged {
    /// The output channels a block takes when there are `c_out` (the kernel's view): 8, or for the
    /// tensor cores two n-tiles of 8 above 8.
    fn outputs(self, c_out: usize) -> usize {
        match self {
            Staged::TensorCores if c_out > 8 => 16,
            _ => 8,
        }
    }

    /// The forward / input-gradient kernel for `c_out` output channels (the kernel's view), on the
    /// tensor cores the one specialised to `square` planes (a [`Conv2dShape::tc_square_width`]) where
    /// one is named.
    fn conv_kernel(self, c_out: usize, square: Option<usize>) -> &'static str {
        match self {
            Staged::Direct => "conv3x3_direct_f32",
            Staged::TensorCores => TC_CONV_KERNELS[self.n_tiles(c_out)][square_index(square)],
        }
    }

    /// The threads a block of [`Self::conv_kernel`] runs: 256, or the square n16 forwards' warps
    /// ([`super::tc_n16_warps`], 16 unless `ESPER_CUDA_TC_WIDE=0`), as conv.cu compiled them.
    fn conv_threads(self, c_out: usize, square: Option<usize>) -> u32 {
        match self {
            Staged::TensorCores if self.n_tiles(c_out) == 1 && square.is_some() => 32 * super::tc_n16_warps(),
            _ => 256,
        }
    }

    /// The weight-gradient kernel for `c_out` output channels, as [`Self::conv_kernel`].
    fn wgrad_kernel(self, c_out: usize, square: Option<usize>) -> &'static str {
        match self {
            Staged::Direct => "conv3x3_wgrad_direct_f32",
            Staged::TensorCores => TC_WGRAD_KERNELS[self.n_tiles(c_out)][square_index(square)],
        }
    }

    /// The square tensor-core weight gradient of planes `width` × `width` that computes batch norm's
    /// input gradient from the pool's as it loads it (`conv3x3_wgrad_tc_n*_w*_bnpool_tf32`).
    fn wgrad_bn_pooled_kernel(self, c_out: usize, width: usize) -> &'static str {
        assert_eq!(
            self,
            Staged::TensorCores,
            "batch norm on load in the square kernels is the tensor cores'"
        );
        TC_WGRAD_BN_POOLED_KERNELS[self.n_tiles(c_out)][square_index(Some(width)) - 1]
    }

    /// The tensor-core kernels' row of [`TC_CONV_KERNELS`] / [`TC_WGRAD_KERNELS`]: one n-tile of 8
    /// output channels (0) or two (1).
    fn n_tiles(self, c_out: usize) -> usize {
        self.outputs(c_out) / 8 - 1
    }
}

/// The tensor-core kernels by n-tiles (one, two) and plane (general, square of 8, 16, 32).
const TC_CONV_KERNELS: [[&str; 4]; 2] = [
    ["conv3x3_tc_n8_tf32", "conv3x3_tc_n8_w8_tf32", "conv3x3_tc_n8_w16_tf32", "conv3x3_tc_n8_w32_tf32"],
    ["conv3x3_tc_n16_tf32", "conv3x3_tc_n16_w8_tf32", "conv3x3_tc_n16_w16_tf32", "conv3x3_tc_n16_w32_tf32"],
];
const TC_WGRAD_KERNELS: [[&str; 4]; 2] = [
    [
        "conv3x3_wgrad_tc_n8_tf32",
        "conv3x3_wgrad_tc_n8_w8_tf32",
        "conv3x3_wgrad_tc_n8_w16_tf32",
        "conv3x3_wgrad_tc_n8_w32_tf32",
    ],
    [
        "conv3x3_wgrad_tc_n16_tf32",
        "conv3x3_wgrad_tc_n16_w8_tf32",
        "conv3x3_wgrad_tc_n16_w16_tf32",
        "conv3x3_wgrad_tc_n16_w32_tf32",
    ],
];

/// [`Staged::wgrad_bn_pooled_kernel`]'s, by n-tiles and width (8, 16, 32).
const TC_WGRAD_BN_POOLED_KERNELS: [[&str; 3]; 2] = [
    [
        "conv3x3_wgrad_tc_n8_w8_bnpool_tf32",
        "conv3x3_wgrad_tc_n8_w16_bnpool_tf32",
        "conv3x3_wgrad_tc_n8_w32_bnpool_tf32",
    ],
    [
        "conv3x3_wgrad_tc_n16_w8_bnpool_tf32",
        "conv3x3_wgrad_tc_n16_w16_bnpool_tf32",
        "conv3x3_wgrad_tc_n16_w32_bnpool_tf32",
    ],
];

/// The column of [`TC_CONV_KERNELS`] / [`TC_WGRAD_KERNELS`] for `square`: 0 for the general kernels,
/// else 1 + the width's place in [`TC_SQUARE_WIDTHS`].
fn square_index(square: Option<usize>) -> usize {
    square.map_or(0, |w| 1 + TC_SQUARE_WIDTHS.iter().position(|&s| s == w).expect("a square kernel's width"))
}

/// How the tensor-core forward of `d` (a shape [`direct_fits`] takes) cuts batch norm's statistics per
/// (env, channel): (runs, images per run), a run per block of `1024 / (h·w)` images.
pub fn stats_runs(d: &Conv2dShape) -> (usize, usize) {
    assert!(direct_fits(d), "the tensor-core kernels do not take {d:?}");
    let per_run = direct_images_per_block(d);
    (d.batch.div_ceil(per_run), per_run)
}

/// `kernel`'s forward `y = conv(x, weight)` of `d`, or with `input_grad` its input gradient `dx`
/// (overwritten) from the output gradient passed as `x` — or, with `bn`, computed on load as batch
/// norm's input gradient (`x` unread). With `stats` (tensor cores, forward only) batch norm's training
/// statistics of `y` summed in the epilogue. Blocks of 256 threads over `1024 / (h·w)` images of one env
/// and [`Staged::outputs`] output channels; `square`: the tensor-core kernel specialised to `d`'s planes
/// ([`Conv2dShape::tc_square_width`]) instead of the general one.
#[allow(clippy::too_many_arguments)]
pub(super) fn staged_conv(
    device: &Device,
    kernel: Staged,
    d: &Conv2dShape,
    x: &CudaSlice<f32>,
    weight: &CudaSlice<f32>,
    y: &mut CudaSlice<f32>,
    input_grad: bool,
    bn: Option<&BatchNormGrad>,
    stats: Option<&mut CudaSlice<f64>>,
    square: Option<usize>,
) -> R {
    assert!(
        stats.is_none() || (kernel == Staged::TensorCores && !input_grad),
        "statistics are a TF32 forward's"
    );
    assert!(bn.is_none() || input_grad, "batch norm's gradient is a backward's input");
    assert!(direct_fits(d), "the staged 3×3 kernels do not take {d:?}");
    let (c_in, c_out) = if input_grad { (d.c_out, d.c_in) } else { (d.c_in, d.c_out) };
    let image_blocks = d.batch.div_ceil(direct_images_per_block(d));
    let outputs = kernel.outputs(c_out);
    assert!(
        d.envs <= 65_535 && c_out.div_ceil(outputs) <= 65_535 && image_blocks <= i32::MAX as usize,
        "staged conv: grid exceeds the device's"
    );
    let dims = [d.batch, c_in, c_out, d.h, d.w].map(|v| v as u32);
    let flip = i32::from(input_grad);
    assert!(square.is_none() || square == d.tc_square_width(), "the square kernels take {d:?}'s planes");
    let mut launch = device.stream.launch_builder(device.function(kernel.conv_kernel(c_out, square)));
    launch.arg(x).arg(weight).arg(y);
    push_dims(&mut launch, &dims);
    launch.arg(&flip);
    push_bn(&mut launch, bn);
    // The tensor-core kernels' last argument: where the epilogue sums batch norm's statistics, or null.
    if kernel == Staged::TensorCores {
        match stats {
            Some(stats) => launch.arg(stats),
            None => launch.arg(&NULL),
        };
    }
    let grid = (image_blocks as u32, c_out.div_ceil(outputs) as u32, d.envs as u32);
    let threads = kernel.conv_threads(c_out, square);
    unsafe {
        launch.launch(LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
    }?;
    Ok(())
}

/// How [`staged_weight_grad`] cuts `d`'s image groups (`1024 / (h·w)` images each) into runs, one block
/// per run, input-channel chunk of 4 and output group: (runs, groups per run). About
/// [`WGRAD_TARGET_BLOCKS`] blocks in all, every run non-empty.
fn staged_wgrad_runs(d: &Conv2dShape, kernel: Staged) -> (usize, usize) {
    let groups = d.batch.div_ceil(direct_images_per_block(d)).max(1);
    let per_run = groups.div_ceil(staged_wgrad_most_runs(d, kernel).min(groups));
    (groups.div_ceil(per_run), per_run)
}

/// The images a staged kernel's block takes: 1 024 output positions, `1024 / (h·w)` images.
fn direct_images_per_block(d: &Conv2dShape) -> usize {
    1024 / (d.h * d.w)
}

/// The staged weight gradients' (input-channel chunk, output group) tiles of `d`: 4 input channels by
/// [`Staged::outputs`] output channels.
fn staged_tiles(d: &Conv2dShape, kernel: Staged) -> usize {
    d.c_in.div_ceil(4) * d.c_out.div_ceil(kernel.outputs(d.c_out))
}

/// The most runs [`staged_wgrad_runs`] cuts, whatever the batch: its share of [`WGRAD_TARGET_BLOCKS`]
/// per tile and env.
fn staged_wgrad_most_runs(d: &Conv2dShape, kernel: Staged) -> usize {
    WGRAD_TARGET_BLOCKS.div_ceil(staged_tiles(d, kernel) * d.envs.max(1)).max(1)
}

/// Room for [`staged_weight_grad`]'s partial sums of `d`, `[E, runs, c_out, K]`, at the most runs
/// [`staged_wgrad_runs`] cuts whatever the batch (0 where [`direct_fits`] does not take `d`).
fn staged_wgrad_partial_len(d: &Conv2dShape, kernel: Staged) -> usize {
    if !direct_fits(d) {
        return 0;
    }
    d.envs * staged_wgrad_most_runs(d, kernel) * d.c_out * col_rows(d)
}

/// `d`'s weight gradient (overwritten) by a staged kernel: it sums each run of image groups into
/// `partial` (sized by [`staged_wgrad_partial_len`]), then `conv2d_wgrad_reduce_f32` adds the runs in
/// order. With `bn` the output gradient is batch norm's input gradient computed on load (`dy` unread);
/// `square` as [`staged_conv`]'s (with `bn` only on the tensor cores and from the pool's gradient: the
/// `_bnpool` kernels).
#[allow(clippy::too_many_arguments)]
pub(super) fn staged_weight_grad(
    device: &Device,
    kernel: Staged,
    d: &Conv2dShape,
    x: &CudaSlice<f32>,
    dy: &CudaSlice<f32>,
    partial: &mut CudaSlice<f32>,
    grad_weight: &mut CudaSlice<f32>,
    bn: Option<&BatchNormGrad>,
    square: Option<usize>,
) -> R {
    assert!(direct_fits(d), "the staged 3×3 weight gradients do not take {d:?}");
    assert!(square.is_none() || square == d.tc_square_width(), "the square kernels take {d:?}");
    let bn_pooled = bn.is_some_and(|g| g.argmax.is_some());
    assert!(
        square.is_none() || bn.is_none() || (kernel == Staged::TensorCores && bn_pooled),
        "the square weight gradients take batch norm's gradient only on the tensor cores, from the pool's"
    );
    let (runs, per_run) = staged_wgrad_runs(d, kernel);
    let depth = col_rows(d);
    assert!(
        d.envs * runs * d.c_out * depth <= partial.len(),
        "staged weight gradient: partial sums exceed the scratch"
    );
    assert!(
        d.envs <= 65_535 && staged_tiles(d, kernel) <= 65_535,
        "staged weight gradient: grid exceeds the device's"
    );
    let dims = [d.batch, d.c_in, d.c_out, d.h, d.w, runs, per_run].map(|v| v as u32);
    let name = match (square, bn) {
        (Some(width), Some(_)) => kernel.wgrad_bn_pooled_kernel(d.c_out, width),
        _ => kernel.wgrad_kernel(d.c_out, square),
    };
    let mut launch = device.stream.launch_builder(device.function(name));
    launch.arg(x).arg(dy).arg(&mut *partial);
    push_dims(&mut launch, &dims);
    push_bn(&mut launch, bn);
    let grid = (runs as u32, staged_tiles(d, kernel) as u32, d.envs as u32);
    unsafe { launch.launch(blocks_of_256(grid)) }?;
    reduce_runs(device, d, runs, partial, grad_weight)
}

/// One GEMM per env over `envs` densely packed column-major matrices, `C (m × n) = op(A) (m × k) ·
/// op(B) (k × n)` (`op` transposes when `trans` is `CUBLAS_OP_T`): the leading dimensions and strides
/// follow from the shape.
fn batched(
    envs: usize,
    transa: cublasOperation_t,
    transb: cublasOperation_t,
    m: usize,
    n: usize,
    k: usize,
) -> StridedBatchedConfig<f32> {
    let lead = |trans: cublasOperation_t, rows: usize, cols: usize| match trans {
        CUBLAS_OP_N => rows,
        _ => cols,
    } as i32;
    StridedBatchedConfig {
        gemm: GemmConfig {
            transa,
            transb,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: lead(transa, m, k),
            ldb: lead(transb, k, n),
            beta: 0.0f32,
            ldc: m as i32,
        },
        batch_size: envs as i32,
        stride_a: (m * k) as i64,
        stride_b: (k * n) as i64,
        stride_c: (m * n) as i64,
    }
}

/// `cfg`'s strided-batched GEMM with `a` and `b` as bfloat16 bits and `c` in f32, the products summed
/// in f32 (`cublasGemmStridedBatchedEx`, compute type 32F): what [`Gemm::gemm_strided_batched`] does for
/// f32 operands.
fn gemm_bf16(
    blas: &CudaBlas,
    device: &Device,
    cfg: &StridedBatchedConfig<f32>,
    a: &CudaSlice<u16>,
    b: &CudaSlice<u16>,
    c: &mut CudaSlice<f32>,
) -> R {
    let stream = &device.stream;
    let g = &cfg.gemm;
    let (a, _read_a) = a.device_ptr(stream);
    let (b, _read_b) = b.device_ptr(stream);
    let (c, _write_c) = c.device_ptr_mut(stream);
    // Safety: the operands hold the matrices `cfg` describes (sized by `GemmConv::check`), on the
    // stream cuBLAS was given; alpha and beta are host values read before the call returns.
    unsafe {
        cudarc::cublas::result::gemm_strided_batched_ex(
            *blas.handle(),
            g.transa,
            g.transb,
            g.m,
            g.n,
            g.k,
            (&g.alpha) as *const f32 as *const _,
            a as *const _,
            cudaDataType_t::CUDA_R_16BF,
            g.lda,
            cfg.stride_a,
            b as *const _,
            cudaDataType_t::CUDA_R_16BF,
            g.ldb,
            cfg.stride_b,
            (&g.beta) as *const f32 as *const _,
            c as *mut _,
            cudaDataType_t::CUDA_R_32F,
            g.ldc,
            cfg.stride_c,
            cfg.batch_size,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three GEMMs of a convolution with K = 3 column rows, B·P = 6 columns and 4 output channels,
    /// as they were written out by hand: (lda, ldb, ldc) and the three strides.
    #[test]
    fn batched_gemms_take_their_leading_dimensions_and_strides_from_the_shape() {
        let dims = |c: StridedBatchedConfig<f32>| {
            let g = c.gemm;
            ((g.m, g.n, g.k), (g.lda, g.ldb, g.ldc), (c.stride_a, c.stride_b, c.stride_c), c.batch_size)
        };
        let (k, n, c_out) = (3, 6, 4);
        // Forward: Y'ᵀ (n × c_out) = colᵀ (n × k) · Wᵀ (k × c_out).
        assert_eq!(
            dims(batched(2, CUBLAS_OP_N, CUBLAS_OP_N, n, c_out, k)),
            ((6, 4, 3), (6, 3, 6), (18, 12, 24), 2)
        );
        // Weight gradient: dWᵀ (k × c_out) = (colᵀ)ᵀ · dY'ᵀ.
        assert_eq!(
            dims(batched(2, CUBLAS_OP_T, CUBLAS_OP_N, k, c_out, n)),
            ((3, 4, 6), (6, 6, 3), (18, 24, 12), 2)
        );
        // Input gradient: dcolᵀ (n × k) = dY'ᵀ (n × c_out) · W.
        assert_eq!(
            dims(batched(2, CUBLAS_OP_N, CUBLAS_OP_T, n, k, c_out)),
            ((6, 3, 4), (6, 3, 6), (24, 12, 18), 2)
        );
    }

    /// The weight gradient's runs cover every column once, fit the grid, and fit the scratch sized for
    /// the shape at its largest batch at every smaller batch: the host's and seeds' convolutions (k = 1
    /// and 3, 3 to 64 channels, 1×1 to 32×32) at 1, 16 and 256 envs.
    #[test]
    fn weight_gradient_runs_cover_the_columns_and_fit_the_scratch() {
        let mut checked = 0;
        for envs in [1, 16, 256] {
            for (c_in, c_out) in [(3, 8), (8, 8), (8, 16), (16, 32), (32, 32), (32, 8), (64, 64), (5, 40)] {
                for (size, k, pad) in [(32, 3, 1), (16, 3, 1), (8, 1, 0), (4, 3, 1), (1, 3, 1), (2, 1, 0)] {
                    let shape =
                        |batch| Conv2dShape { envs, batch, c_in, c_out, h: size, w: size, k, pad, groups: 1 };
                    let room = wgrad_partial_len(&shape(512));
                    for batch in [1, 3, 64, 100, 511, 512] {
                        let d = shape(batch);
                        let (chunks, chunk_len) = wgrad_chunks(&d);
                        let columns = col_columns(&d);
                        assert!(chunks >= 1 && chunk_len % 16 == 0, "{d:?}");
                        assert!(chunks * chunk_len >= columns && (chunks - 1) * chunk_len < columns, "{d:?}");
                        assert!(envs * chunks <= 65_535 || chunks == 1, "{d:?}: grid z");
                        assert!(envs * chunks * c_out * col_rows(&d) <= room, "{d:?}: scratch");
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 8 * 6 * 6);
    }

    /// Both staged weight gradients' runs cover every image group once, none empty, and fit the scratch
    /// sized for the shape at its largest batch at every smaller batch.
    #[test]
    fn staged_weight_gradient_runs_cover_the_images_and_fit_the_scratch() {
        let mut checked = 0;
        for kernel in [Staged::Direct, Staged::TensorCores] {
            for envs in [1, 16, 256] {
                for (c_in, c_out) in [(3, 8), (8, 8), (8, 16), (16, 32), (32, 32), (5, 12), (6, 40)] {
                    for (h, w) in [(32, 32), (16, 16), (8, 8), (4, 4), (6, 8)] {
                        let shape =
                            |batch| Conv2dShape { envs, batch, c_in, c_out, h, w, k: 3, pad: 1, groups: 1 };
                        let room = staged_wgrad_partial_len(&shape(512), kernel);
                        for batch in [1, 3, 22, 64, 100, 512] {
                            let d = shape(batch);
                            let groups = batch.div_ceil(1024 / (h * w));
                            let (runs, per_run) = staged_wgrad_runs(&d, kernel);
                            assert!(runs >= 1 && per_run >= 1, "{d:?}");
                            assert!(
                                runs * per_run >= groups && (runs - 1) * per_run < groups,
                                "{d:?}: cover"
                            );
                            assert!(envs * runs * c_out * c_in * 9 <= room, "{d:?}: scratch");
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 3 * 7 * 5 * 6);
    }

    /// The tensor-core kernels take blocks of one n-tile of 8 output channels up to 8 and two above, the
    /// direct ones 8, each with its own kernel names.
    #[test]
    fn staged_kernels_take_their_output_groups_by_channel_count() {
        let tc = Staged::TensorCores;
        assert_eq!([1, 8, 9, 16, 40].map(|c| tc.outputs(c)), [8, 8, 16, 16, 16]);
        assert_eq!([1, 8, 9, 40].map(|c| Staged::Direct.outputs(c)), [8; 4]);
        assert_eq!(
            (tc.conv_kernel(8, None), tc.conv_kernel(12, None)),
            ("conv3x3_tc_n8_tf32", "conv3x3_tc_n16_tf32")
        );
        assert_eq!(tc.wgrad_kernel(32, None), "conv3x3_wgrad_tc_n16_tf32");
        assert_eq!(Staged::Direct.conv_kernel(32, Some(8)), "conv3x3_direct_f32");
        // The square kernels by width and n-tiles.
        assert_eq!(tc.conv_kernel(8, Some(32)), "conv3x3_tc_n8_w32_tf32");
        assert_eq!(tc.conv_kernel(16, Some(16)), "conv3x3_tc_n16_w16_tf32");
        assert_eq!(tc.wgrad_kernel(32, Some(8)), "conv3x3_wgrad_tc_n16_w8_tf32");
        assert_eq!(tc.wgrad_kernel(3, Some(16)), "conv3x3_wgrad_tc_n8_w16_tf32");
        assert_eq!(tc.wgrad_bn_pooled_kernel(8, 32), "conv3x3_wgrad_tc_n8_w32_bnpool_tf32");
        assert_eq!(tc.wgrad_bn_pooled_kernel(32, 8), "conv3x3_wgrad_tc_n16_w8_bnpool_tf32");
        // Threads a block: the square n16 forwards' warps as conv.cu compiles them (16 unless
        // ESPER_CUDA_TC_WIDE=0), 256 for the rest.
        let wide = 32 * crate::cuda::tc_n16_warps();
        if std::env::var_os("ESPER_CUDA_TC_WIDE").is_none() {
            assert_eq!(wide, 512);
        }
        assert_eq!([Some(8), Some(16), Some(32)].map(|sq| tc.conv_threads(16, sq)), [wide; 3]);
        assert_eq!([None, Some(8), Some(32)].map(|sq| tc.conv_threads(8, sq)), [256; 3]);
        assert_eq!((tc.conv_threads(40, None), Staged::Direct.conv_threads(16, Some(16))), (256, 256));
        // Every name the launchers pick is a function the loader loads from conv.cu.
        let conv_cu = crate::cuda::sources::KERNEL_FILES.iter().find(|f| f.name == "conv.cu").unwrap();
        let mut picked = std::collections::BTreeSet::new();
        for kernel in [Staged::Direct, tc] {
            for c_out in [3, 8, 9, 40] {
                for square in [None, Some(8), Some(16), Some(32)] {
                    picked.insert(kernel.conv_kernel(c_out, square));
                    picked.insert(kernel.wgrad_kernel(c_out, square));
                }
            }
        }
        for c_out in [3, 8, 9, 40] {
            for width in TC_SQUARE_WIDTHS {
                picked.insert(tc.wgrad_bn_pooled_kernel(c_out, width));
            }
        }
        assert_eq!(picked.len(), 2 + 2 * 2 * 4 + 2 * 3, "{picked:?}");
        assert!(picked.iter().all(|name| conv_cu.functions.contains(name)), "{picked:?}");
        let d = Conv2dShape { envs: 2, batch: 5, c_in: 9, c_out: 40, h: 8, w: 8, k: 3, pad: 1, groups: 1 };
        // 3 input chunks of 4 by 5 output groups of 8 (direct) or 3 of 16 (tensor cores).
        assert_eq!((staged_tiles(&d, Staged::Direct), staged_tiles(&d, tc)), (15, 9));
        // One tensor-core block takes all of the host's first block (3 → 8 at 32×32), as
        // Conv2dShape::tc_weight_grad_single_block says; not the second (8 → 16) nor 5 → 20 channels.
        let first = Conv2dShape { c_in: 3, c_out: 8, h: 32, w: 32, ..d };
        assert_eq!(staged_tiles(&first, tc), 1);
        assert!(first.tc_weight_grad_single_block());
        for other in [
            Conv2dShape { c_in: 8, c_out: 16, h: 16, w: 16, ..d },
            Conv2dShape { c_in: 5, c_out: 20, ..first },
        ] {
            assert!(staged_tiles(&other, tc) > 1 && !other.tc_weight_grad_single_block(), "{other:?}");
        }
        assert!(Conv2dShape { c_in: 4, c_out: 16, h: 8, w: 8, ..d }.tc_weight_grad_single_block());
        assert!(!Conv2dShape { h: 6, w: 8, ..first }.tc_weight_grad_single_block(), "square planes only");
    }

    /// The specialised tensor-core kernels take square planes of 8, 16 and 32 (the host's three blocks) and
    /// nothing else.
    #[test]
    fn square_kernels_take_square_planes_of_8_16_and_32() {
        let plane =
            |h, w| Conv2dShape { envs: 1, batch: 2, c_in: 3, c_out: 8, h, w, k: 3, pad: 1, groups: 1 };
        let taken: Vec<_> = [(32, 32), (16, 16), (8, 8), (4, 4), (6, 8), (16, 8), (2, 2), (12, 12)]
            .map(|(h, w)| plane(h, w).tc_square_width())
            .to_vec();
        assert_eq!(taken, [Some(32), Some(16), Some(8), None, None, None, None, None]);
    }

    /// Every plane `direct_fits` takes fits the kernel's block: its images' threads within 256 and its
    /// staged chunk (`DC_CHUNK` channels of every image's zero-padded plane) within the shared tile
    /// (`DC_TILE` floats), both read from conv.cu — and the host's planes (32×32 to 4×4) are taken.
    #[test]
    fn the_direct_convolution_fits_its_block_for_every_plane_it_takes() {
        let conv = crate::cuda::KERNEL_FILES.iter().find(|f| f.name == "conv.cu").expect("conv.cu");
        let define = |name: &str| -> usize {
            let line = conv.source.lines().find(|l| l.starts_with(&format!("#define {name} ")));
            line.and_then(|l| l.split_whitespace().nth(2)).and_then(|v| v.parse().ok()).expect(name)
        };
        let (tile, chunk) = (define("DC_TILE"), define("DC_CHUNK"));
        // The tensor-core kernels' block takes TC_PIXELS output positions: as many images as
        // direct_images_per_block says.
        assert_eq!(define("TC_PIXELS"), 1024);
        let shape =
            |h, w| Conv2dShape { envs: 1, batch: 1, c_in: 8, c_out: 8, h, w, k: 3, pad: 1, groups: 1 };
        let mut taken = 0;
        for h in 1..=1100 {
            for w in 1..=1100 {
                let d = shape(h, w);
                if !direct_fits(&d) {
                    continue;
                }
                let per_block = 1024 / (h * w);
                assert!(per_block >= 1 && per_block * (h * w / 4) <= 256, "{h}×{w}: threads");
                assert!(per_block * chunk * (h + 2) * (w + 2) <= tile, "{h}×{w}: staged tile");
                taken += 1;
            }
        }
        // w ∈ {4, 8, …} and 4 ≤ h ≤ 1024 / w: Σ over w = 4k of (⌊256 / k⌋ − 3) while that is positive.
        let expected: usize = (1..=64usize).map(|k| (256 / k).saturating_sub(3)).sum();
        assert_eq!(taken, expected);
        for size in [32, 16, 8, 4] {
            assert!(direct_fits(&shape(size, size)), "{size}×{size}");
        }
        for (k, pad) in [(1, 0), (3, 0), (5, 2)] {
            assert!(!direct_fits(&Conv2dShape { k, pad, ..shape(8, 8) }), "k {k} pad {pad}");
        }
        assert!(!direct_fits(&Conv2dShape { groups: 8, ..shape(8, 8) }));
        assert!(!direct_fits(&shape(8, 6)) && !direct_fits(&shape(2, 8)) && !direct_fits(&shape(64, 32)));
    }
}
