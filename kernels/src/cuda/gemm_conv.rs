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

use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaSlice, PushKernelArg};

use super::parity::{Device, ParityError, elementwise};
use crate::ops::Conv2dShape;

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

/// cuBLAS on the device's stream and the scratch of the largest convolution it has run.
pub struct GemmConv {
    blas: CudaBlas,
    /// The column matrix (forward, weight gradient) or its gradient (input gradient).
    col: CudaSlice<f32>,
    /// The GEMM's channel-major output, or the output gradient moved into that layout.
    rows: CudaSlice<f32>,
}

impl GemmConv {
    /// cuBLAS on `device`'s stream, with scratch for convolutions up to `largest` (their
    /// column matrices and [`Conv2dShape::output_len`]).
    pub fn new(device: &Device, largest: &[Conv2dShape]) -> Result<Self, ParityError> {
        let col = largest.iter().map(col_len).max().unwrap_or(1).max(1);
        let rows = largest.iter().map(Conv2dShape::output_len).max().unwrap_or(1).max(1);
        Ok(Self {
            blas: CudaBlas::new(device.stream.clone())?,
            col: device.stream.alloc_zeros::<f32>(col)?,
            rows: device.stream.alloc_zeros::<f32>(rows)?,
        })
    }

    fn check(&self, d: &Conv2dShape) {
        assert!(
            col_len(d) <= self.col.len() && d.output_len() <= self.rows.len(),
            "GemmConv scratch was sized for smaller convolutions than {d:?}"
        );
        assert_eq!(d.groups, 1, "the GEMM form takes one group");
        assert!(
            col_columns(d) <= i32::MAX as usize && col_rows(d) <= i32::MAX as usize,
            "GEMM dimensions exceed i32"
        );
    }

    fn im2col(&mut self, device: &Device, d: &Conv2dShape, x: &CudaSlice<f32>) -> Result<(), ParityError> {
        let args = im2col_args(d);
        let mut launch = device.stream.launch_builder(device.function("im2col_f32"));
        launch.arg(x).arg(&mut self.col);
        for a in &args {
            launch.arg(a);
        }
        unsafe { launch.launch(elementwise(col_len(d))) }?;
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
        self.im2col(device, d, x)?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major Y'ᵀ (n × c_out) = colᵀ (n × k) · Wᵀ (k × c_out).
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_N,
                transb: CUBLAS_OP_N,
                m: n as i32,
                n: c_out as i32,
                k: k as i32,
                alpha: 1.0f32,
                lda: n as i32,
                ldb: k as i32,
                beta: 0.0f32,
                ldc: n as i32,
            },
            batch_size: d.envs as i32,
            stride_a: (k * n) as i64,
            stride_b: (c_out * k) as i64,
            stride_c: (c_out * n) as i64,
        };
        unsafe { self.blas.gemm_strided_batched(cfg, &self.col, weight, &mut self.rows) }?;
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
        Self::swap(device, dy, &mut self.rows, [d.envs, d.batch, d.c_out, out_positions(d)])?;
        self.im2col(device, d, x)?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major dWᵀ (k × c_out) = (colᵀ)ᵀ · dY'ᵀ, colᵀ stored n × k, dY'ᵀ stored n × c_out.
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_T,
                transb: CUBLAS_OP_N,
                m: k as i32,
                n: c_out as i32,
                k: n as i32,
                alpha: 1.0f32,
                lda: n as i32,
                ldb: n as i32,
                beta: 0.0f32,
                ldc: k as i32,
            },
            batch_size: d.envs as i32,
            stride_a: (k * n) as i64,
            stride_b: (c_out * n) as i64,
            stride_c: (c_out * k) as i64,
        };
        unsafe { self.blas.gemm_strided_batched(cfg, &self.col, &self.rows, grad_weight) }?;
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
        Self::swap(device, dy, &mut self.rows, [d.envs, d.batch, d.c_out, out_positions(d)])?;
        let (k, n, c_out) = (col_rows(d), col_columns(d), d.c_out);
        // Column-major dcolᵀ (n × k) = dY'ᵀ (n × c_out) · W (c_out × k), W stored as Wᵀ (k × c_out).
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_N,
                transb: CUBLAS_OP_T,
                m: n as i32,
                n: k as i32,
                k: c_out as i32,
                alpha: 1.0f32,
                lda: n as i32,
                ldb: k as i32,
                beta: 0.0f32,
                ldc: n as i32,
            },
            batch_size: d.envs as i32,
            stride_a: (c_out * n) as i64,
            stride_b: (c_out * k) as i64,
            stride_c: (k * n) as i64,
        };
        unsafe { self.blas.gemm_strided_batched(cfg, &self.rows, weight, &mut self.col) }?;
        let args = im2col_args(d);
        let overwrite = 0i32;
        let mut launch = device.stream.launch_builder(device.function("col2im_f32"));
        launch.arg(&self.col).arg(dx);
        for a in &args {
            launch.arg(a);
        }
        launch.arg(&overwrite);
        unsafe { launch.launch(elementwise(d.envs * d.batch * d.c_in * d.h * d.w)) }?;
        Ok(())
    }
}
