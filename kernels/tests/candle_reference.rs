//! Candle autograd as a second reference for the batched ops, next to the f64 finite differences in each
//! op's unit tests.
//!
//! Every comparison builds the op out of candle-core 0.11.1 primitives in f64 on the CPU (`Var`,
//! `.backward()`, `GradStore::get`) and checks our forward and backward against it, over two envs
//! (E = 2). Ops with per-env parameters (conv, norms, linear, loss) run one candle graph per env; ops
//! that are the same function for every env (activations, pools, blends) use candle's own batching over
//! the flattened `[E·B, …]` tensor, which is the same computation. Backward passes are driven by the
//! projection `L = Σ r ⊙ y` with a random `r`, so `∂L/∂y = r` is our `grad_output`.
//!
//! Candle is only trusted where a hand-computed case shows it is right: each comparison first runs the
//! spot checks of the candle ops it uses, so a candle bug cannot silently pass. Candle 0.11.1 is known
//! wrong for the max-pool backward (see `candle_max_pool_backward_is_wrong_ours_matches_hand_and_fd`),
//! and differs from PyTorch's subgradient conventions at two kinks (ReLU at 0, clamp at its bounds), so
//! the inputs here keep away from those points.
//!
//! Tolerances are norm-wise, `‖ours − candle‖ / ‖candle‖`:
//! * f64 runs: 1e-10. Both sides are exact formulas in f64 that differ only in summation order and in how
//!   the backward is composed (closed form vs autograd); that costs a few ulps times √n (≈1e-14 here),
//!   so 1e-10 leaves four orders of margin while a wrong term would be off by O(1).
//! * f32 runs (our training precision, with its own AVX2 paths) against the same f64 reference: 1e-5.
//!   f32 rounds at 6e-8; the longest reductions here (≈100 terms) give norm-wise errors around 1e-7.
//!
//! Inputs are drawn from the crate's counter-based test streams and rounded to f32 once, so the f32 and
//! f64 runs see identical inputs and the f32 comparison measures only arithmetic.

use candle_core::backprop::GradStore;
use candle_core::{Device, Result, Tensor, Var};
use esper_kernels::ops::{
    self, Amplitude, BlendShape, ClassifierShape, Conv2dShape, LinearShape, NormShape, PoolShape, Real,
};
use esper_kernels::rng::{Purpose, StreamKey};

const E: usize = 2;
const F64_TOL: f64 = 1e-10;
const F32_TOL: f64 = 1e-5;
/// Hand-computed spot checks: exact small numbers, so anything beyond rounding is a bug.
const HAND_TOL: f64 = 1e-12;

/// Named outputs of one op (forward values and gradients), flattened in our `[E, …]` layout.
type Outputs = Vec<(&'static str, Vec<f64>)>;

// ---------------------------------------------------------------------------------------------------
// Inputs

fn test_stream(seed: u64) -> esper_kernels::rng::Stream {
    StreamKey::new(seed, 0, 0, Purpose::Test).stream(0)
}

/// `n` standard normals, rounded to f32.
fn normals(seed: u64, n: usize) -> Vec<f64> {
    let mut s = test_stream(seed);
    (0..n).map(|_| s.normal() as f32 as f64).collect()
}

/// `n` values uniform in `[lo, hi)`, rounded to f32.
fn uniforms(seed: u64, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = test_stream(seed);
    (0..n).map(|_| (lo + (hi - lo) * s.next_f64()) as f32 as f64).collect()
}

/// `n` values with magnitude in `[0.1, 2)` and random sign: never at ReLU's kink.
fn away_from_zero(seed: u64, n: usize) -> Vec<f64> {
    let mut s = test_stream(seed);
    (0..n)
        .map(|_| {
            let m = 0.1 + 1.9 * s.next_f64();
            let v = if s.next_f64() < 0.5 { -m } else { m };
            v as f32 as f64
        })
        .collect()
}

fn cast<T: Real>(v: &[f64]) -> Vec<T> {
    v.iter().map(|&x| T::from_f64(x)).collect()
}

fn widen<T: Real>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

// ---------------------------------------------------------------------------------------------------
// Candle helpers (f64, CPU)

fn constant(data: &[f64], shape: &[usize]) -> Result<Tensor> {
    Tensor::from_slice(data, shape, &Device::Cpu)
}

fn variable(data: &[f64], shape: &[usize]) -> Result<Var> {
    Var::from_slice(data, shape, &Device::Cpu)
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.flatten_all()?.to_vec1::<f64>()
}

fn grad(grads: &GradStore, v: &Var) -> Result<Vec<f64>> {
    values(grads.get(v).expect("candle produced no gradient for a variable"))
}

/// Backward of `L = Σ r ⊙ y`.
fn projected_backward(y: &Tensor, r: &[f64]) -> Result<GradStore> {
    (y * constant(r, y.dims())?)?.sum_all()?.backward()
}

// ---------------------------------------------------------------------------------------------------
// Comparison

fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    let diff = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let norm = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    diff / norm
}

/// `‖ours − reference‖ / ‖reference‖ ≤ tol`, and the reference is not vacuous (non-zero, finite).
fn assert_close(name: &str, ours: &[f64], reference: &[f64], tol: f64) {
    assert_eq!(ours.len(), reference.len(), "{name}: lengths differ");
    assert!(reference.iter().all(|v| v.is_finite()), "{name}: reference is not finite");
    assert!(ours.iter().all(|v| v.is_finite()), "{name}: ours is not finite");
    let norm = reference.iter().map(|y| y * y).sum::<f64>().sqrt();
    assert!(norm > 1e-8, "{name}: reference is zero, the comparison would be vacuous");
    let err = relative_error(ours, reference);
    assert!(err <= tol, "{name}: norm-wise relative error {err:.3e} > {tol:.0e}");
}

/// Element-wise `|got − expected| ≤ HAND_TOL` against hand-computed numbers.
fn assert_values(name: &str, got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len(), "{name}: lengths differ: {got:?} vs {expected:?}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= HAND_TOL, "{name}[{i}]: got {g}, expected {e} (all: {got:?})");
    }
}

/// Checks an f64 run and an f32 run of ours against the candle reference, output by output.
fn check_outputs(op: &str, reference: &Outputs, ours_f64: Outputs, ours_f32: Outputs) {
    for (run, tol, precision) in [(ours_f64, F64_TOL, "f64"), (ours_f32, F32_TOL, "f32")] {
        assert_eq!(run.len(), reference.len(), "{op}: number of outputs");
        for ((name, ours), (ref_name, reference)) in run.iter().zip(reference) {
            assert_eq!(name, ref_name, "{op}: outputs out of order");
            assert_close(&format!("{op}: {name} ({precision})"), ours, reference, tol);
        }
    }
}

/// Runs `f` for env `e` of `E`, collecting each output's env slices in env order (our `[E, …]` layout).
fn per_env(mut f: impl FnMut(usize) -> Result<Outputs>) -> Result<Outputs> {
    let mut all: Outputs = Vec::new();
    for e in 0..E {
        let outputs = f(e)?;
        if all.is_empty() {
            all = outputs;
        } else {
            for ((name, acc), (n, v)) in all.iter_mut().zip(outputs) {
                assert_eq!(*name, n);
                acc.extend(v);
            }
        }
    }
    Ok(all)
}

// ---------------------------------------------------------------------------------------------------
// Spot checks of the candle ops used below, against hand-computed tiny cases

/// A 1-channel 3×3 image `1..9` with kernel `[[1,0,0],[0,0,0],[0,0,2]]`, pad 1:
/// `y[i][j] = x[i−1][j−1] + 2·x[i+1][j+1]` (cross-correlation, zero padding), and with `L = Σ y`,
/// `dx[m][n] = [m+1 < 3 ∧ n+1 < 3] + 2·[m ≥ 1 ∧ n ≥ 1]`, `dw[a][b] = Σ_{i,j} x[i+a−1][j+b−1]`.
/// Then a grouped k=1 case: channels `[2], [3]`, weights `[5], [7]`, groups 2: `y = [10, 21]`.
/// Our conv must give the same hand numbers.
fn spot_check_conv2d() -> Result<()> {
    let x: Vec<f64> = (1..=9).map(f64::from).collect();
    let w = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0];
    let y_hand = [10.0, 12.0, 0.0, 16.0, 19.0, 2.0, 0.0, 4.0, 5.0];
    let dx_hand = [1.0, 1.0, 0.0, 1.0, 3.0, 2.0, 0.0, 2.0, 2.0];
    // Window sums of the zero-padded image: corners take 2×2 blocks, edges 2×3, the centre all nine.
    let dw_hand = [12.0, 21.0, 16.0, 27.0, 45.0, 33.0, 24.0, 39.0, 28.0];

    let xv = variable(&x, &[1, 1, 3, 3])?;
    let wv = variable(&w, &[1, 1, 3, 3])?;
    let y = xv.conv2d(&wv, 1, 1, 1, 1)?;
    let grads = y.sum_all()?.backward()?;
    assert_values("candle conv2d 3x3 forward", &values(&y)?, &y_hand);
    assert_values("candle conv2d 3x3 input gradient", &grad(&grads, &xv)?, &dx_hand);
    assert_values("candle conv2d 3x3 weight gradient", &grad(&grads, &wv)?, &dw_hand);

    let s = Conv2dShape { envs: 1, batch: 1, c_in: 1, c_out: 1, h: 3, w: 3, k: 3, pad: 1, groups: 1 };
    let mut y_ours = vec![0.0; 9];
    ops::conv2d_forward(s, &x, &w, &mut y_ours);
    let mut dx_ours = vec![f64::NAN; 9];
    ops::conv2d_backward_input(s, &[1.0; 9], &w, &mut dx_ours);
    let mut dw_ours = vec![f64::NAN; 9];
    ops::conv2d_backward_weight(s, &x, &[1.0; 9], &mut dw_ours);
    assert_values("our conv2d 3x3 forward", &y_ours, &y_hand);
    assert_values("our conv2d 3x3 input gradient", &dx_ours, &dx_hand);
    assert_values("our conv2d 3x3 weight gradient", &dw_ours, &dw_hand);

    let xv = variable(&[2.0, 3.0], &[1, 2, 1, 1])?;
    let wv = variable(&[5.0, 7.0], &[2, 1, 1, 1])?;
    let y = xv.conv2d(&wv, 0, 1, 1, 2)?;
    let grads = y.sum_all()?.backward()?;
    assert_values("candle grouped conv2d forward", &values(&y)?, &[10.0, 21.0]);
    assert_values("candle grouped conv2d input gradient", &grad(&grads, &xv)?, &[5.0, 7.0]);
    assert_values("candle grouped conv2d weight gradient", &grad(&grads, &wv)?, &[2.0, 3.0]);
    Ok(())
}

/// ReLU, tanh, the sigmoid built from `neg`/`exp`/`+1`/`recip`, and the other element-wise primitives,
/// at points with known values and derivatives (`L = Σ y`).
fn spot_check_elementwise() -> Result<()> {
    // ReLU away from its kink. At exactly 0 candle 0.11.1 uses `x ≥ 0` for the derivative (1); ours and
    // PyTorch use 0. Both are valid subgradients; the comparisons below never evaluate ReLU at 0.
    let x = variable(&[-2.0, -0.5, 0.0, 0.5, 3.0], &[5])?;
    let y = x.relu()?;
    let g = grad(&y.sum_all()?.backward()?, &x)?;
    assert_values("candle relu forward", &values(&y)?, &[0.0, 0.0, 0.0, 0.5, 3.0]);
    assert_values("candle relu gradient", &g, &[0.0, 0.0, 1.0, 1.0, 1.0]);

    // tanh(atanh(1/2)) = 1/2 with derivative 1 − 1/4.
    let x = variable(&[0.0, 0.5f64.atanh(), -(0.5f64.atanh())], &[3])?;
    let y = x.tanh()?;
    let g = grad(&y.sum_all()?.backward()?, &x)?;
    assert_values("candle tanh forward", &values(&y)?, &[0.0, 0.5, -0.5]);
    assert_values("candle tanh gradient", &g, &[1.0, 0.75, 0.75]);

    // σ(0) = 1/2, σ(ln 3) = 3/4, σ(−ln 3) = 1/4; σ' = σ(1 − σ).
    let x = variable(&[0.0, 3f64.ln(), -(3f64.ln())], &[3])?;
    let y = candle_sigmoid(&x)?;
    let g = grad(&y.sum_all()?.backward()?, &x)?;
    assert_values("candle sigmoid forward", &values(&y)?, &[0.5, 0.75, 0.25]);
    assert_values("candle sigmoid gradient", &g, &[0.25, 0.1875, 0.1875]);

    // Primitives of the norms and the loss, one variable each.
    let a = variable(&[4.0], &[1])?;
    let b = variable(&[3.0], &[1])?;
    let c = variable(&[2.0], &[1])?;
    let d = variable(&[1.0], &[1])?;
    let f = variable(&[4.0], &[1])?;
    let terms = [a.sqrt()?, b.sqr()?, c.log()?, d.exp()?, f.recip()?];
    let expected = [2.0, 9.0, 2f64.ln(), 1f64.exp(), 0.25];
    for (t, e) in terms.iter().zip(expected) {
        assert_values("candle primitive forward", &values(t)?, &[e]);
    }
    let total =
        terms.iter().try_fold(Tensor::zeros(1, candle_core::DType::F64, &Device::Cpu)?, |acc, t| acc + t)?;
    let grads = total.sum_all()?.backward()?;
    assert_values("candle sqrt gradient", &grad(&grads, &a)?, &[0.25]);
    assert_values("candle sqr gradient", &grad(&grads, &b)?, &[6.0]);
    assert_values("candle log gradient", &grad(&grads, &c)?, &[0.5]);
    assert_values("candle exp gradient", &grad(&grads, &d)?, &[1f64.exp()]);
    assert_values("candle recip gradient", &grad(&grads, &f)?, &[-1.0 / 16.0]);

    // Broadcast arithmetic sums the gradient over the broadcast axis: y = (u − v)·v + v/u with u [3, 2]
    // = [[1,2],[3,4],[5,6]], v [1, 2] = [2, 4]. dL/du = v − v/u², dL/dv = Σ_rows (u − 2v + 1/u).
    let u = variable(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    let v = variable(&[2.0, 4.0], &[1, 2])?;
    let y = (u.broadcast_sub(&v)?.broadcast_mul(&v)? + v.broadcast_div(&u)?)?;
    let grads = y.sum_all()?.backward()?;
    let y_hand = [-2.0 + 2.0, -8.0 + 2.0, 2.0 + 2.0 / 3.0, 0.0 + 1.0, 6.0 + 0.4, 8.0 + 4.0 / 6.0];
    assert_values("candle broadcast forward", &values(&y)?, &y_hand);
    let du_hand = [0.0, 3.0, 2.0 - 2.0 / 9.0, 4.0 - 0.25, 2.0 - 2.0 / 25.0, 4.0 - 4.0 / 36.0];
    assert_values("candle broadcast lhs gradient", &grad(&grads, &u)?, &du_hand);
    let dv_hand = [
        (1.0 + 3.0 + 5.0) - 12.0 + (1.0 + 1.0 / 3.0 + 0.2),
        (2.0 + 4.0 + 6.0) - 24.0 + (0.5 + 0.25 + 1.0 / 6.0),
    ];
    assert_values("candle broadcast rhs gradient", &grad(&grads, &v)?, &dv_hand);

    // clamp(0, 1) inside and outside its range. At exactly a bound candle 0.11.1 halves the gradient
    // (its max/min backward splits ties); ours and PyTorch give 1 on the closed interval. The gate
    // comparison keeps every clamped value strictly inside (0, 1).
    let x = variable(&[-0.5, 0.3, 1.5, 1.0], &[4])?;
    let y = x.clamp(0.0, 1.0)?;
    let g = grad(&y.sum_all()?.backward()?, &x)?;
    assert_values("candle clamp forward", &values(&y)?, &[0.0, 0.3, 1.0, 1.0]);
    assert_values("candle clamp gradient", &g, &[0.0, 1.0, 0.0, 0.5]);
    Ok(())
}

/// The reductions over chosen axes and the matmul with a transposed operand.
fn spot_check_reductions_and_matmul() -> Result<()> {
    // x [2, 2, 1, 2] = 1..8: channel 0 holds 1, 2, 5, 6 and channel 1 holds 3, 4, 7, 8.
    let x = variable(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[2, 2, 1, 2])?;
    let mean = x.mean_keepdim((0, 2, 3))?;
    assert_eq!(mean.dims(), &[1, 2, 1, 1]);
    assert_values("candle mean over (N, H, W)", &values(&mean)?, &[3.5, 5.5]);
    let weighted = (mean * constant(&[1.0, 3.0], &[1, 2, 1, 1])?)?;
    let g = grad(&weighted.sum_all()?.backward()?, &x)?;
    assert_values("candle mean gradient", &g, &[0.25, 0.25, 0.75, 0.75, 0.25, 0.25, 0.75, 0.75]);

    let sum = x.sum_keepdim(3)?;
    assert_values("candle sum over W", &values(&sum)?, &[3.0, 7.0, 11.0, 15.0]);
    let spatial = x.mean((2, 3))?;
    assert_eq!(spatial.dims(), &[2, 2]);
    assert_values("candle mean over (H, W)", &values(&spatial)?, &[1.5, 3.5, 5.5, 7.5]);
    let max = constant(&[1.0, 5.0, 3.0, -2.0, -1.0, -4.0], &[2, 3])?.max_keepdim(1)?;
    assert_values("candle max over classes", &values(&max)?, &[5.0, -1.0]);

    // Unbiased variance over one axis: [1, 2, 3, 6] has mean 3 and Σ(x − 3)² = 14, so 14/3.
    let var = constant(&[1.0, 2.0, 3.0, 6.0], &[1, 4])?.var_keepdim(1)?;
    assert_values("candle unbiased variance", &values(&var)?, &[14.0 / 3.0]);

    // A·Bᵀ with A = [[1,2],[3,4]], B = [[5,7],[6,8]] gives [[19,22],[43,50]]; with L = Σ,
    // dA[i][k] = Σ_j B[j][k] = [[11,15],[11,15]] and dB[j][k] = Σ_i A[i][k] = [[4,6],[4,6]].
    let a = variable(&[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
    let b = variable(&[5.0, 7.0, 6.0, 8.0], &[2, 2])?;
    let y = a.matmul(&b.t()?)?;
    let grads = y.sum_all()?.backward()?;
    assert_values("candle matmul forward", &values(&y)?, &[19.0, 22.0, 43.0, 50.0]);
    assert_values("candle matmul lhs gradient", &grad(&grads, &a)?, &[11.0, 15.0, 11.0, 15.0]);
    assert_values("candle matmul rhs gradient", &grad(&grads, &b)?, &[4.0, 6.0, 4.0, 6.0]);
    Ok(())
}

/// Log-softmax from primitives on `z = [0, ln 2, ln 3]`: softmax `[1, 2, 3]/6`, so the cross-entropy
/// with label 2 is `−ln(1/2) = ln 2` and its gradient is `softmax − onehot = [1/6, 1/3, −1/2]`.
fn spot_check_log_softmax() -> Result<()> {
    let z = variable(&[0.0, 2f64.ln(), 3f64.ln()], &[1, 3])?;
    let onehot = constant(&[0.0, 0.0, 1.0], &[1, 3])?;
    let loss = candle_cross_entropy(&z, &onehot)?;
    let g = grad(&loss.backward()?, &z)?;
    assert_values("candle cross-entropy", &values(&loss)?, &[2f64.ln()]);
    assert_values("candle cross-entropy gradient", &g, &[1.0 / 6.0, 1.0 / 3.0, -0.5]);
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Candle models of our ops

fn candle_sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// Mean over the batch of `−log_softmax(z)[label]`, `z`: `[B, K]`, `onehot`: `[B, K]`.
fn candle_cross_entropy(z: &Tensor, onehot: &Tensor) -> Result<Tensor> {
    let batch = z.dim(0)?;
    let max = z.max_keepdim(1)?.detach();
    let shifted = z.broadcast_sub(&max)?;
    let log_sum = shifted.exp()?.sum_keepdim(1)?.log()?;
    let log_softmax = shifted.broadcast_sub(&log_sum)?;
    (log_softmax * onehot)?.sum_all()?.affine(-1.0 / batch as f64, 0.0)
}

/// `(x − mean)·inv_std` with biased statistics over `dims`, returning `(x̂, mean, inv_std)`.
fn candle_normalise<D: candle_core::shape::Dims + Copy>(
    x: &Tensor,
    dims: D,
) -> Result<(Tensor, Tensor, Tensor)> {
    let mean = x.mean_keepdim(dims)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(dims)?;
    let inv_std = (var + ops::NORM_EPS)?.sqrt()?.recip()?;
    Ok((centred.broadcast_mul(&inv_std)?, mean, inv_std))
}

// ---------------------------------------------------------------------------------------------------
// Conv2d

fn ours_conv<T: Real>(s: Conv2dShape, x: &[f64], w: &[f64], r: &[f64]) -> Outputs {
    let (x, w, r) = (cast::<T>(x), cast::<T>(w), cast::<T>(r));
    let mut y = vec![T::ZERO; s.output_len()];
    ops::conv2d_forward(s, &x, &w, &mut y);
    let mut dx = vec![T::from_f64(f64::NAN); s.input_len()];
    ops::conv2d_backward_input(s, &r, &w, &mut dx);
    let mut dw = vec![T::from_f64(f64::NAN); s.weight_len()];
    ops::conv2d_backward_weight(s, &x, &r, &mut dw);
    vec![("forward", widen(&y)), ("input gradient", widen(&dx)), ("weight gradient", widen(&dw))]
}

#[test]
fn conv2d_matches_candle() -> Result<()> {
    spot_check_conv2d()?;
    let base = Conv2dShape { envs: E, batch: 2, c_in: 3, c_out: 8, h: 5, w: 6, k: 3, pad: 1, groups: 1 };
    let cases = [
        ("k3 pad1", base),
        ("k1", Conv2dShape { c_out: 5, h: 4, w: 4, k: 1, pad: 0, ..base }),
        ("k3 pad0", Conv2dShape { c_out: 4, h: 6, w: 5, pad: 0, ..base }),
        ("k5 pad2", Conv2dShape { c_out: 2, h: 7, w: 6, k: 5, pad: 2, ..base }),
        ("groups 2", Conv2dShape { c_in: 4, c_out: 6, h: 5, w: 5, groups: 2, ..base }),
        ("depthwise", Conv2dShape { c_in: 4, c_out: 4, h: 6, w: 5, groups: 4, ..base }),
    ];
    for (i, (name, s)) in cases.into_iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        let x = normals(seed, s.input_len());
        let w = normals(seed + 1, s.weight_len());
        let r = normals(seed + 2, s.output_len());
        let (x_env, w_env, y_env) = (s.input_len() / E, s.weight_len() / E, s.output_len() / E);
        let reference = per_env(|e| {
            let xv = variable(&x[e * x_env..(e + 1) * x_env], &[s.batch, s.c_in, s.h, s.w])?;
            let wv = variable(&w[e * w_env..(e + 1) * w_env], &[s.c_out, s.c_in_per_group(), s.k, s.k])?;
            let y = xv.conv2d(&wv, s.pad, 1, 1, s.groups)?;
            assert_eq!(y.dims(), &[s.batch, s.c_out, s.h_out(), s.w_out()]);
            let grads = projected_backward(&y, &r[e * y_env..(e + 1) * y_env])?;
            Ok(vec![
                ("forward", values(&y)?),
                ("input gradient", grad(&grads, &xv)?),
                ("weight gradient", grad(&grads, &wv)?),
            ])
        })?;
        check_outputs(
            &format!("conv2d {name}"),
            &reference,
            ours_conv::<f64>(s, &x, &w, &r),
            ours_conv::<f32>(s, &x, &w, &r),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Batch norm (training mode) and group norm

struct NormInputs {
    x: Vec<f64>,
    gamma: Vec<f64>,
    beta: Vec<f64>,
    r: Vec<f64>,
}

fn norm_inputs(s: NormShape, seed: u64) -> NormInputs {
    // A shifted, scaled input so the mean and variance matter.
    let x = normals(seed, s.len()).iter().map(|v| (1.5 * v + 0.7) as f32 as f64).collect();
    NormInputs {
        x,
        gamma: uniforms(seed + 1, s.params_len(), 0.5, 1.5),
        beta: normals(seed + 2, s.params_len()),
        r: normals(seed + 3, s.len()),
    }
}

fn ours_batch_norm<T: Real>(s: NormShape, i: &NormInputs, running: (&[f64], &[f64])) -> Outputs {
    let (x, gamma, beta, r) = (cast::<T>(&i.x), cast::<T>(&i.gamma), cast::<T>(&i.beta), cast::<T>(&i.r));
    let (mut running_mean, mut running_var) = (cast::<T>(running.0), cast::<T>(running.1));
    let nan = T::from_f64(f64::NAN);
    let mut y = vec![nan; s.len()];
    let (mut mean, mut inv_std) = (vec![nan; s.params_len()], vec![nan; s.params_len()]);
    ops::batch_norm_train_forward(
        s,
        &x,
        &gamma,
        &beta,
        &mut y,
        &mut mean,
        &mut inv_std,
        &mut running_mean,
        &mut running_var,
    );
    let mut dx = vec![nan; s.len()];
    let (mut dgamma, mut dbeta) = (vec![nan; s.params_len()], vec![nan; s.params_len()]);
    ops::batch_norm_backward(s, &x, &gamma, &mean, &inv_std, &r, &mut dx, &mut dgamma, &mut dbeta);
    vec![
        ("forward", widen(&y)),
        ("saved mean", widen(&mean)),
        ("saved inv_std", widen(&inv_std)),
        ("running mean", widen(&running_mean)),
        ("running var", widen(&running_var)),
        ("input gradient", widen(&dx)),
        ("gamma gradient", widen(&dgamma)),
        ("beta gradient", widen(&dbeta)),
    ]
}

#[test]
fn batch_norm_training_matches_candle() -> Result<()> {
    spot_check_elementwise()?;
    spot_check_reductions_and_matmul()?;
    let s = NormShape { envs: E, batch: 3, channels: 4, h: 3, w: 5 };
    let inputs = norm_inputs(s, 200);
    let running_mean = normals(210, s.params_len());
    let running_var = uniforms(211, s.params_len(), 0.5, 1.5);
    let (c, x_env) = (s.channels, s.len() / E);
    let momentum = ops::BATCH_NORM_MOMENTUM;
    let reference = per_env(|e| {
        let params = e * c..(e + 1) * c;
        let x = variable(&inputs.x[e * x_env..(e + 1) * x_env], &[s.batch, c, s.h, s.w])?;
        let gamma = variable(&inputs.gamma[params.clone()], &[1, c, 1, 1])?;
        let beta = variable(&inputs.beta[params.clone()], &[1, c, 1, 1])?;
        let (x_hat, mean, inv_std) = candle_normalise(&x, (0, 2, 3))?;
        let y = x_hat.broadcast_mul(&gamma)?.broadcast_add(&beta)?;
        let grads = projected_backward(&y, &inputs.r[e * x_env..(e + 1) * x_env])?;
        // Running statistics take the unbiased variance (candle's `var_keepdim`) over N·H·W.
        let per_channel = x.detach().transpose(0, 1)?.contiguous()?.reshape((c, ()))?;
        let unbiased = per_channel.var_keepdim(1)?;
        let new_mean = ((constant(&running_mean[params.clone()], &[c])? * (1.0 - momentum))?
            + (mean.flatten_all()? * momentum)?)?;
        let new_var = ((constant(&running_var[params], &[c])? * (1.0 - momentum))?
            + (unbiased.flatten_all()? * momentum)?)?;
        Ok(vec![
            ("forward", values(&y)?),
            ("saved mean", values(&mean)?),
            ("saved inv_std", values(&inv_std)?),
            ("running mean", values(&new_mean)?),
            ("running var", values(&new_var)?),
            ("input gradient", grad(&grads, &x)?),
            ("gamma gradient", grad(&grads, &gamma)?),
            ("beta gradient", grad(&grads, &beta)?),
        ])
    })?;
    let running = (running_mean.as_slice(), running_var.as_slice());
    check_outputs(
        "batch norm",
        &reference,
        ours_batch_norm::<f64>(s, &inputs, running),
        ours_batch_norm::<f32>(s, &inputs, running),
    );
    Ok(())
}

fn ours_group_norm<T: Real>(s: NormShape, groups: usize, i: &NormInputs) -> Outputs {
    let (x, gamma, beta, r) = (cast::<T>(&i.x), cast::<T>(&i.gamma), cast::<T>(&i.beta), cast::<T>(&i.r));
    let nan = T::from_f64(f64::NAN);
    let stats = s.envs * s.batch * groups;
    let mut y = vec![nan; s.len()];
    let (mut mean, mut inv_std) = (vec![nan; stats], vec![nan; stats]);
    ops::group_norm_forward(s, groups, &x, &gamma, &beta, &mut y, &mut mean, &mut inv_std);
    let mut dx = vec![nan; s.len()];
    let (mut dgamma, mut dbeta) = (vec![nan; s.params_len()], vec![nan; s.params_len()]);
    ops::group_norm_backward(s, groups, &x, &gamma, &mean, &inv_std, &r, &mut dx, &mut dgamma, &mut dbeta);
    vec![
        ("forward", widen(&y)),
        ("saved mean", widen(&mean)),
        ("saved inv_std", widen(&inv_std)),
        ("input gradient", widen(&dx)),
        ("gamma gradient", widen(&dgamma)),
        ("beta gradient", widen(&dbeta)),
    ]
}

#[test]
fn group_norm_matches_candle() -> Result<()> {
    spot_check_elementwise()?;
    spot_check_reductions_and_matmul()?;
    let s = NormShape { envs: E, batch: 3, channels: 6, h: 3, w: 4 };
    for groups in [1, 3, 6] {
        let inputs = norm_inputs(s, 300 + groups as u64 * 10);
        let (c, x_env) = (s.channels, s.len() / E);
        let reference = per_env(|e| {
            let params = e * c..(e + 1) * c;
            let x = variable(&inputs.x[e * x_env..(e + 1) * x_env], &[s.batch, c, s.h, s.w])?;
            let gamma = variable(&inputs.gamma[params.clone()], &[1, c, 1, 1])?;
            let beta = variable(&inputs.beta[params], &[1, c, 1, 1])?;
            let grouped = x.reshape((s.batch, groups, ()))?;
            let (x_hat, mean, inv_std) = candle_normalise(&grouped, 2usize)?;
            let x_hat = x_hat.reshape((s.batch, c, s.h, s.w))?;
            let y = x_hat.broadcast_mul(&gamma)?.broadcast_add(&beta)?;
            let grads = projected_backward(&y, &inputs.r[e * x_env..(e + 1) * x_env])?;
            Ok(vec![
                ("forward", values(&y)?),
                ("saved mean", values(&mean)?),
                ("saved inv_std", values(&inv_std)?),
                ("input gradient", grad(&grads, &x)?),
                ("gamma gradient", grad(&grads, &gamma)?),
                ("beta gradient", grad(&grads, &beta)?),
            ])
        })?;
        check_outputs(
            &format!("group norm, {groups} groups"),
            &reference,
            ours_group_norm::<f64>(s, groups, &inputs),
            ours_group_norm::<f32>(s, groups, &inputs),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Activations

type Forward<T> = fn(&[T], &mut [T]);
type Backward<T> = fn(&[T], &[T], &mut [T]);

fn ours_activation<T: Real>(forward: Forward<T>, backward: Backward<T>, x: &[f64], r: &[f64]) -> Outputs {
    let (x, r) = (cast::<T>(x), cast::<T>(r));
    let mut y = vec![T::from_f64(f64::NAN); x.len()];
    forward(&x, &mut y);
    let mut dx = vec![T::from_f64(f64::NAN); x.len()];
    backward(&y, &r, &mut dx);
    vec![("forward", widen(&y)), ("input gradient", widen(&dx))]
}

/// Compares one element-wise activation, as one candle tensor `[E, B, C, H, W]` (the op is the same for
/// every element, so candle's own batching is the per-env computation).
fn check_activation(
    name: &str,
    x: &[f64],
    candle_op: fn(&Tensor) -> Result<Tensor>,
    ours_f64: (Forward<f64>, Backward<f64>),
    ours_f32: (Forward<f32>, Backward<f32>),
) -> Result<()> {
    let shape = [E, 2, 3, 3, 3];
    assert_eq!(x.len(), shape.iter().product::<usize>());
    let r = normals(400, x.len());
    let xv = variable(x, &shape)?;
    let y = candle_op(&xv)?;
    let grads = projected_backward(&y, &r)?;
    let reference = vec![("forward", values(&y)?), ("input gradient", grad(&grads, &xv)?)];
    check_outputs(
        name,
        &reference,
        ours_activation(ours_f64.0, ours_f64.1, x, &r),
        ours_activation(ours_f32.0, ours_f32.1, x, &r),
    );
    Ok(())
}

#[test]
fn activations_match_candle() -> Result<()> {
    spot_check_elementwise()?;
    let n = E * 2 * 3 * 3 * 3;
    check_activation(
        "relu",
        &away_from_zero(401, n),
        Tensor::relu,
        (ops::relu_forward, ops::relu_backward),
        (ops::relu_forward, ops::relu_backward),
    )?;
    check_activation(
        "tanh",
        &uniforms(402, n, -3.0, 3.0),
        Tensor::tanh,
        (ops::tanh_forward, ops::tanh_backward),
        (ops::tanh_forward, ops::tanh_backward),
    )?;
    check_activation(
        "sigmoid",
        &uniforms(403, n, -8.0, 8.0),
        candle_sigmoid,
        (ops::sigmoid_forward, ops::sigmoid_backward),
        (ops::sigmoid_forward, ops::sigmoid_backward),
    )
}

// ---------------------------------------------------------------------------------------------------
// Global average pool

fn ours_global_avg_pool<T: Real>(s: PoolShape, x: &[f64], r: &[f64]) -> Outputs {
    let (x, r) = (cast::<T>(x), cast::<T>(r));
    let mut y = vec![T::from_f64(f64::NAN); s.global_pool_output_len()];
    ops::global_avg_pool_forward(s, &x, &mut y);
    let mut dx = vec![T::from_f64(f64::NAN); s.input_len()];
    ops::global_avg_pool_backward(s, &r, &mut dx);
    vec![("forward", widen(&y)), ("input gradient", widen(&dx))]
}

#[test]
fn global_avg_pool_matches_candle() -> Result<()> {
    spot_check_reductions_and_matmul()?;
    let s = PoolShape { envs: E, batch: 2, channels: 3, h: 4, w: 5 };
    let x = normals(500, s.input_len());
    let r = normals(501, s.global_pool_output_len());
    let xv = variable(&x, &[s.envs * s.batch, s.channels, s.h, s.w])?;
    let y = xv.mean((2, 3))?;
    let grads = projected_backward(&y, &r)?;
    let reference = vec![("forward", values(&y)?), ("input gradient", grad(&grads, &xv)?)];
    check_outputs(
        "global average pool",
        &reference,
        ours_global_avg_pool::<f64>(s, &x, &r),
        ours_global_avg_pool::<f32>(s, &x, &r),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Linear

fn ours_linear<T: Real>(s: LinearShape, x: &[f64], w: &[f64], b: &[f64], r: &[f64]) -> Outputs {
    let (x, w, b, r) = (cast::<T>(x), cast::<T>(w), cast::<T>(b), cast::<T>(r));
    let nan = T::from_f64(f64::NAN);
    let mut y = vec![nan; s.output_len()];
    ops::linear_forward(s, &x, &w, Some(&b), &mut y);
    let mut dx = vec![nan; s.input_len()];
    ops::linear_backward_input(s, &r, &w, &mut dx);
    let (mut dw, mut db) = (vec![nan; s.weight_len()], vec![nan; s.bias_len()]);
    ops::linear_backward_params(s, &x, &r, &mut dw, Some(&mut db));
    vec![
        ("forward", widen(&y)),
        ("input gradient", widen(&dx)),
        ("weight gradient", widen(&dw)),
        ("bias gradient", widen(&db)),
    ]
}

#[test]
fn linear_matches_candle() -> Result<()> {
    spot_check_reductions_and_matmul()?;
    let s = LinearShape { envs: E, batch: 4, in_features: 6, out_features: 5 };
    let x = normals(600, s.input_len());
    let w = normals(601, s.weight_len());
    let b = normals(602, s.bias_len());
    let r = normals(603, s.output_len());
    let (n_in, n_out) = (s.in_features, s.out_features);
    let (x_env, w_env, y_env) = (s.input_len() / E, s.weight_len() / E, s.output_len() / E);
    let reference = per_env(|e| {
        let xv = variable(&x[e * x_env..(e + 1) * x_env], &[s.batch, n_in])?;
        let wv = variable(&w[e * w_env..(e + 1) * w_env], &[n_out, n_in])?;
        let bv = variable(&b[e * n_out..(e + 1) * n_out], &[n_out])?;
        let y = xv.matmul(&wv.t()?)?.broadcast_add(&bv)?;
        let grads = projected_backward(&y, &r[e * y_env..(e + 1) * y_env])?;
        Ok(vec![
            ("forward", values(&y)?),
            ("input gradient", grad(&grads, &xv)?),
            ("weight gradient", grad(&grads, &wv)?),
            ("bias gradient", grad(&grads, &bv)?),
        ])
    })?;
    check_outputs(
        "linear",
        &reference,
        ours_linear::<f64>(s, &x, &w, &b, &r),
        ours_linear::<f32>(s, &x, &w, &b, &r),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Softmax cross-entropy

fn ours_cross_entropy<T: Real>(s: ClassifierShape, z: &[f64], labels: &[u8]) -> Outputs {
    let z = cast::<T>(z);
    let mut loss = vec![T::from_f64(f64::NAN); s.envs];
    let mut dz = vec![T::from_f64(f64::NAN); s.logits_len()];
    ops::softmax_cross_entropy(s, &z, labels, &mut loss, Some(&mut dz));
    vec![("loss", widen(&loss)), ("logit gradient", widen(&dz))]
}

#[test]
fn softmax_cross_entropy_matches_candle() -> Result<()> {
    spot_check_elementwise()?;
    spot_check_reductions_and_matmul()?;
    spot_check_log_softmax()?;
    let s = ClassifierShape { envs: E, batch: 4, classes: 5 };
    let z: Vec<f64> = normals(700, s.logits_len()).iter().map(|v| v * 2.0).collect();
    let mut stream = test_stream(701);
    let labels: Vec<u8> = (0..s.labels_len()).map(|_| stream.below(s.classes as u64) as u8).collect();
    let (b, k) = (s.batch, s.classes);
    // Each env's loss is the mean over its own samples, and the objective is their sum, so each env's
    // logit gradient is that of its own loss: one candle graph per env.
    let reference = per_env(|e| {
        let zv = variable(&z[e * b * k..(e + 1) * b * k], &[b, k])?;
        let mut onehot = vec![0.0; b * k];
        for i in 0..b {
            onehot[i * k + labels[e * b + i] as usize] = 1.0;
        }
        let loss = candle_cross_entropy(&zv, &constant(&onehot, &[b, k])?)?;
        let grads = loss.backward()?;
        Ok(vec![("loss", values(&loss)?), ("logit gradient", grad(&grads, &zv)?)])
    })?;
    check_outputs(
        "softmax cross-entropy",
        &reference,
        ours_cross_entropy::<f64>(s, &z, &labels),
        ours_cross_entropy::<f32>(s, &z, &labels),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Blends

const BLEND: BlendShape = BlendShape { envs: E, batch: 3, features: 10 };

struct BlendInputs {
    h: Vec<f64>,
    s: Vec<f64>,
    x_s: Vec<f64>,
    /// `[E]`, inside (0, 1).
    alpha_env: Vec<f64>,
    /// `[E, B]`, inside (0, 1).
    alpha_sample: Vec<f64>,
    /// `[E, B]`, inside (0, 1).
    gate: Vec<f64>,
    r: Vec<f64>,
}

fn blend_inputs() -> BlendInputs {
    let n = BLEND.len();
    BlendInputs {
        h: normals(800, n),
        s: normals(801, n),
        x_s: normals(802, n),
        alpha_env: uniforms(803, BLEND.envs, 0.1, 0.9),
        alpha_sample: uniforms(804, BLEND.samples(), 0.1, 0.9),
        gate: uniforms(805, BLEND.samples(), 0.1, 0.9),
        r: normals(806, n),
    }
}

/// Which amplitude a blend run uses.
#[derive(Clone, Copy)]
enum Amp {
    PerEnv,
    PerSample,
}

impl Amp {
    fn ours<'a, T>(self, per_env: &'a [T], per_sample: &'a [T]) -> Amplitude<'a, T> {
        match self {
            Amp::PerEnv => Amplitude::PerEnv(per_env),
            Amp::PerSample => Amplitude::PerSample(per_sample),
        }
    }

    /// `clamp01(a)` broadcastable against `[E, B, F]` (a constant: the amplitude gets no gradient).
    fn candle(self, i: &BlendInputs) -> Result<Tensor> {
        let a = match self {
            Amp::PerEnv => constant(&i.alpha_env, &[BLEND.envs, 1, 1])?,
            Amp::PerSample => constant(&i.alpha_sample, &[BLEND.envs, BLEND.batch, 1])?,
        };
        a.clamp(0.0, 1.0)
    }
}

fn blend_dims() -> [usize; 3] {
    [BLEND.envs, BLEND.batch, BLEND.features]
}

fn ours_blend_add<T: Real>(i: &BlendInputs, amp: Amp) -> Outputs {
    let (h, s, r) = (cast::<T>(&i.h), cast::<T>(&i.s), cast::<T>(&i.r));
    let (a_env, a_sample) = (cast::<T>(&i.alpha_env), cast::<T>(&i.alpha_sample));
    let alpha = amp.ours(&a_env, &a_sample);
    let nan = T::from_f64(f64::NAN);
    let mut y = vec![nan; BLEND.len()];
    ops::blend_add_forward(BLEND, &h, &s, alpha, &mut y);
    let (mut dh, mut ds) = (vec![nan; BLEND.len()], vec![nan; BLEND.len()]);
    ops::blend_add_backward(BLEND, alpha, &r, &mut dh, &mut ds);
    vec![("forward", widen(&y)), ("h gradient", widen(&dh)), ("s gradient", widen(&ds))]
}

/// MULTIPLY with a separate seed input `x_s` (gradient isolation off the host path) when `shared` is
/// false; with `x_s = h` otherwise, where our caller adds `dx_s` into `dh`.
fn ours_blend_multiply<T: Real>(i: &BlendInputs, amp: Amp, shared: bool) -> Outputs {
    let (h, s, r) = (cast::<T>(&i.h), cast::<T>(&i.s), cast::<T>(&i.r));
    let x_s = if shared { h.clone() } else { cast::<T>(&i.x_s) };
    let (a_env, a_sample) = (cast::<T>(&i.alpha_env), cast::<T>(&i.alpha_sample));
    let alpha = amp.ours(&a_env, &a_sample);
    let nan = T::from_f64(f64::NAN);
    let mut y = vec![nan; BLEND.len()];
    ops::blend_multiply_forward(BLEND, &h, &s, &x_s, alpha, &mut y);
    let (mut dh, mut ds, mut dx_s) = (vec![nan; BLEND.len()], vec![nan; BLEND.len()], vec![nan; BLEND.len()]);
    ops::blend_multiply_backward(BLEND, &h, &s, &x_s, alpha, &r, &mut dh, &mut ds, Some(&mut dx_s));
    if shared {
        ops::add_in_place(&mut dh, &dx_s);
        vec![("forward", widen(&y)), ("h gradient", widen(&dh)), ("s gradient", widen(&ds))]
    } else {
        vec![
            ("forward", widen(&y)),
            ("h gradient", widen(&dh)),
            ("s gradient", widen(&ds)),
            ("x_s gradient", widen(&dx_s)),
        ]
    }
}

fn ours_blend_gate<T: Real>(i: &BlendInputs, amp: Amp) -> Outputs {
    let (h, s, r, gate) = (cast::<T>(&i.h), cast::<T>(&i.s), cast::<T>(&i.r), cast::<T>(&i.gate));
    let (a_env, a_sample) = (cast::<T>(&i.alpha_env), cast::<T>(&i.alpha_sample));
    let alpha = amp.ours(&a_env, &a_sample);
    let nan = T::from_f64(f64::NAN);
    let mut y = vec![nan; BLEND.len()];
    ops::blend_gate_forward(BLEND, &h, &s, alpha, &gate, &mut y);
    let (mut dh, mut ds, mut dg) =
        (vec![nan; BLEND.len()], vec![nan; BLEND.len()], vec![nan; BLEND.samples()]);
    ops::blend_gate_backward(BLEND, &h, &s, alpha, &gate, &r, &mut dh, &mut ds, &mut dg);
    vec![
        ("forward", widen(&y)),
        ("h gradient", widen(&dh)),
        ("s gradient", widen(&ds)),
        ("gate gradient", widen(&dg)),
    ]
}

#[test]
fn blends_match_candle() -> Result<()> {
    spot_check_elementwise()?;
    let i = blend_inputs();
    let dims = blend_dims();
    for (amp, amp_name) in [(Amp::PerEnv, "per-env"), (Amp::PerSample, "per-sample")] {
        let a = amp.candle(&i)?;

        // ADD: y = h + a·(s − h).
        let h = variable(&i.h, &dims)?;
        let s = variable(&i.s, &dims)?;
        let y = (&*h + (&*s - &*h)?.broadcast_mul(&a)?)?;
        let grads = projected_backward(&y, &i.r)?;
        let reference = vec![
            ("forward", values(&y)?),
            ("h gradient", grad(&grads, &h)?),
            ("s gradient", grad(&grads, &s)?),
        ];
        check_outputs(
            &format!("ADD blend, {amp_name} alpha"),
            &reference,
            ours_blend_add::<f64>(&i, amp),
            ours_blend_add::<f32>(&i, amp),
        );

        // MULTIPLY: y = h·(1 + a·tanh(s − x_s)), with a separate x_s and with x_s = h.
        let x_s = variable(&i.x_s, &dims)?;
        let y = (&*h * ((&*s - &*x_s)?.tanh()?.broadcast_mul(&a)? + 1.0)?)?;
        let grads = projected_backward(&y, &i.r)?;
        let reference = vec![
            ("forward", values(&y)?),
            ("h gradient", grad(&grads, &h)?),
            ("s gradient", grad(&grads, &s)?),
            ("x_s gradient", grad(&grads, &x_s)?),
        ];
        check_outputs(
            &format!("MULTIPLY blend, {amp_name} alpha"),
            &reference,
            ours_blend_multiply::<f64>(&i, amp, false),
            ours_blend_multiply::<f32>(&i, amp, false),
        );
        let y = (&*h * ((&*s - &*h)?.tanh()?.broadcast_mul(&a)? + 1.0)?)?;
        let grads = projected_backward(&y, &i.r)?;
        let reference = vec![
            ("forward", values(&y)?),
            ("h gradient", grad(&grads, &h)?),
            ("s gradient", grad(&grads, &s)?),
        ];
        check_outputs(
            &format!("MULTIPLY blend, x_s = h, {amp_name} alpha"),
            &reference,
            ours_blend_multiply::<f64>(&i, amp, true),
            ours_blend_multiply::<f32>(&i, amp, true),
        );

        // GATE: y = h + a_eff·(s − h), a_eff = clamp01(clamp01(a)·clamp01(g)), g per sample.
        let g = variable(&i.gate, &[BLEND.envs, BLEND.batch, 1])?;
        let a_eff = g.clamp(0.0, 1.0)?.broadcast_mul(&a)?.clamp(0.0, 1.0)?;
        let y = (&*h + (&*s - &*h)?.broadcast_mul(&a_eff)?)?;
        let grads = projected_backward(&y, &i.r)?;
        let reference = vec![
            ("forward", values(&y)?),
            ("h gradient", grad(&grads, &h)?),
            ("s gradient", grad(&grads, &s)?),
            ("gate gradient", grad(&grads, &g)?),
        ];
        check_outputs(
            &format!("GATE blend, {amp_name} alpha"),
            &reference,
            ours_blend_gate::<f64>(&i, amp),
            ours_blend_gate::<f32>(&i, amp),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Max pool: candle's backward is wrong, so ours is checked against finite differences and a hand case

/// Central finite differences (step 1e-6) of `L = Σ r ⊙ maxpool(x)` with our forward.
fn max_pool_numeric_gradient(s: PoolShape, x: &[f64], r: &[f64]) -> Vec<f64> {
    const STEP: f64 = 1e-6;
    let mut y = vec![0.0; s.max_pool_output_len()];
    let mut idx = vec![0u8; y.len()];
    let mut loss = |xp: &[f64]| {
        ops::max_pool2x2_forward(s, xp, &mut y, &mut idx);
        r.iter().zip(&y).map(|(a, b)| a * b).sum::<f64>()
    };
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            probe[i] = x[i] + STEP;
            let up = loss(&probe);
            probe[i] = x[i] - STEP;
            let down = loss(&probe);
            probe[i] = x[i];
            (up - down) / (2.0 * STEP)
        })
        .collect()
}

fn ours_max_pool(s: PoolShape, x: &[f64], r: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![f64::NAN; s.max_pool_output_len()];
    let mut idx = vec![0u8; y.len()];
    ops::max_pool2x2_forward(s, x, &mut y, &mut idx);
    let mut dx = vec![f64::NAN; s.input_len()];
    ops::max_pool2x2_backward(s, r, &idx, &mut dx);
    (y, dx)
}

fn candle_max_pool(s: PoolShape, x: &[f64], r: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    let xv = variable(x, &[s.envs * s.batch, s.channels, s.h, s.w])?;
    let y = xv.max_pool2d(2)?;
    let grads = projected_backward(&y, r)?;
    Ok((values(&y)?, grad(&grads, &xv)?))
}

#[test]
fn candle_max_pool_backward_is_wrong_ours_matches_hand_and_fd() -> Result<()> {
    // Hand case on one window per candle image: [[1, 2], [3, 4]] → 4 with a unique maximum.
    let (y, dx) = candle_max_pool(
        PoolShape { envs: 1, batch: 1, channels: 1, h: 2, w: 2 },
        &[1.0, 2.0, 3.0, 4.0],
        &[1.0],
    )?;
    assert_values("candle max pool forward, hand case", &y, &[4.0]);
    // Measured: the unique maximum gets 0.25 of the gradient instead of all of it.
    assert_values("candle max pool gradient, hand case", &dx, &[0.0, 0.0, 0.0, 0.25]);

    // Tie-free inputs: distinct values 0.01 apart in random order, so a 1e-6 probe never flips a max.
    let s = PoolShape { envs: E, batch: 2, channels: 3, h: 4, w: 6 };
    let mut x: Vec<f64> = (0..s.input_len()).map(|i| i as f64 * 0.01 - 1.0).collect();
    test_stream(900).shuffle(&mut x);
    let r = normals(901, s.max_pool_output_len());
    let (y, dx) = ours_max_pool(s, &x, &r);
    let numeric = max_pool_numeric_gradient(s, &x, &r);
    assert_close("our max pool gradient vs finite differences", &dx, &numeric, 1e-4);
    let (y_candle, dx_candle) = candle_max_pool(s, &x, &r)?;
    // The forward is a selection: exact.
    assert_eq!(y, y_candle, "max pool forward differs from candle's");
    // Candle's backward is exactly a quarter of the true gradient on tie-free inputs.
    let quarter: Vec<f64> = dx.iter().map(|g| 0.25 * g).collect();
    assert_eq!(dx_candle, quarter, "candle 0.11.1 max-pool backward was expected to give 0.25 × grad");
    assert!(relative_error(&dx_candle, &dx) > 0.5, "candle's max-pool backward is not the reference");

    // Ties, one plane of two windows per env, gradients [5, 7] and [−3, 2]:
    // env 0: [1 3 | 2 2; 3 3 | 2 2]  — the max 3 first at window index 1; window 1 all tied (index 0).
    // env 1: [−1 0 | 4 2; 0 −2 | 6 6] — 0 first at index 1 (tied with 2); 6 first at index 2 (tied with 3).
    let s = PoolShape { envs: E, batch: 1, channels: 1, h: 2, w: 4 };
    let x = [1.0, 3.0, 2.0, 2.0, 3.0, 3.0, 2.0, 2.0, -1.0, 0.0, 4.0, 2.0, 0.0, -2.0, 6.0, 6.0];
    let r = [5.0, 7.0, -3.0, 2.0];
    let (y, dx) = ours_max_pool(s, &x, &r);
    assert_values("our max pool forward, ties", &y, &[3.0, 2.0, 0.0, 6.0]);
    // The first maximum in row-major window order takes the whole gradient.
    let dx_hand = [0.0, 5.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0];
    assert_values("our max pool gradient, ties", &dx, &dx_hand);
    let (y_candle, dx_candle) = candle_max_pool(s, &x, &r)?;
    assert_values("candle max pool forward, ties", &y_candle, &[3.0, 2.0, 0.0, 6.0]);
    // Measured: each of t tied maxima gets grad × t/4 (3 ties: 5·3/4; 4 ties: 7; 2 ties: −3/2 and 1).
    let dx_candle_observed =
        [0.0, 3.75, 7.0, 7.0, 3.75, 3.75, 7.0, 7.0, 0.0, -1.5, 0.0, 0.0, -1.5, 0.0, 1.0, 1.0];
    assert_values("candle max pool gradient, ties", &dx_candle, &dx_candle_observed);
    Ok(())
}
