//! Fully connected layer per env: `y[e, b] = W[e] · x[e, b] + bias[e]`.
//!
//! Layouts: `x` `[E, B, in]`, `weight` `[E, out, in]`, `bias` `[E, out]`, `y` `[E, B, out]`. The forward
//! and input gradient run one task per (env, sample); the weight gradient one task per (env, output row),
//! summing over the env's samples in order.

use rayon::prelude::*;

use super::real::{Real, dot};

/// Shape of a batched linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    pub envs: usize,
    pub batch: usize,
    pub in_features: usize,
    pub out_features: usize,
}

impl LinearShape {
    pub fn input_len(&self) -> usize {
        self.envs * self.batch * self.in_features
    }
    pub fn output_len(&self) -> usize {
        self.envs * self.batch * self.out_features
    }
    pub fn weight_len(&self) -> usize {
        self.envs * self.out_features * self.in_features
    }
    pub fn bias_len(&self) -> usize {
        self.envs * self.out_features
    }
}

/// `y = x·Wᵀ + bias` per env (no bias when `bias` is `None`). Overwrites `y`.
pub fn linear_forward<T: Real>(shape: LinearShape, x: &[T], weight: &[T], bias: Option<&[T]>, y: &mut [T]) {
    assert_eq!(x.len(), shape.input_len(), "linear input length");
    assert_eq!(weight.len(), shape.weight_len(), "linear weight length");
    assert_eq!(y.len(), shape.output_len(), "linear output length");
    if let Some(b) = bias {
        assert_eq!(b.len(), shape.bias_len(), "linear bias length");
    }
    let (n_in, n_out) = (shape.in_features, shape.out_features);
    if y.is_empty() {
        return;
    }
    y.par_chunks_mut(n_out).enumerate().for_each(|(i, y_row)| {
        let e = i / shape.batch;
        let x_row = &x[i * n_in..(i + 1) * n_in];
        for (o, out) in y_row.iter_mut().enumerate() {
            let w_row = &weight[(e * n_out + o) * n_in..(e * n_out + o + 1) * n_in];
            let b = bias.map_or(T::ZERO, |b| b[e * n_out + o]);
            *out = dot(x_row, w_row) + b;
        }
    });
}

/// `dx = dy·W` per env, summed over outputs in order. Overwrites `grad_input`.
pub fn linear_backward_input<T: Real>(
    shape: LinearShape,
    grad_output: &[T],
    weight: &[T],
    grad_input: &mut [T],
) {
    assert_eq!(grad_output.len(), shape.output_len(), "linear output gradient length");
    assert_eq!(weight.len(), shape.weight_len(), "linear weight length");
    assert_eq!(grad_input.len(), shape.input_len(), "linear input gradient length");
    let (n_in, n_out) = (shape.in_features, shape.out_features);
    if grad_input.is_empty() {
        return;
    }
    grad_input.par_chunks_mut(n_in).enumerate().for_each(|(i, dx_row)| {
        let e = i / shape.batch;
        let dy_row = &grad_output[i * n_out..(i + 1) * n_out];
        dx_row.fill(T::ZERO);
        for (o, &dy) in dy_row.iter().enumerate() {
            let w_row = &weight[(e * n_out + o) * n_in..(e * n_out + o + 1) * n_in];
            for (dx, &w) in dx_row.iter_mut().zip(w_row) {
                *dx += dy * w;
            }
        }
    });
}

/// `dW = dyᵀ·x` and `dbias = Σ_b dy` per env, summed over the env's samples in order. Overwrites
/// `grad_weight` and `grad_bias`.
pub fn linear_backward_params<T: Real>(
    shape: LinearShape,
    x: &[T],
    grad_output: &[T],
    grad_weight: &mut [T],
    grad_bias: Option<&mut [T]>,
) {
    assert_eq!(x.len(), shape.input_len(), "linear input length");
    assert_eq!(grad_output.len(), shape.output_len(), "linear output gradient length");
    assert_eq!(grad_weight.len(), shape.weight_len(), "linear weight gradient length");
    let (n_in, n_out) = (shape.in_features, shape.out_features);
    if n_in > 0 {
        grad_weight.par_chunks_mut(n_in).enumerate().for_each(|(row, dw_row)| {
            let (e, o) = (row / n_out, row % n_out);
            dw_row.fill(T::ZERO);
            for b in 0..shape.batch {
                let i = e * shape.batch + b;
                let dy = grad_output[i * n_out + o];
                for (dw, &v) in dw_row.iter_mut().zip(&x[i * n_in..(i + 1) * n_in]) {
                    *dw += dy * v;
                }
            }
        });
    }
    if let Some(db) = grad_bias {
        assert_eq!(db.len(), shape.bias_len(), "linear bias gradient length");
        db.par_iter_mut().enumerate().for_each(|(row, db)| {
            let (e, o) = (row / n_out, row % n_out);
            let mut sum = T::ZERO;
            for b in 0..shape.batch {
                sum += grad_output[(e * shape.batch + b) * n_out + o];
            }
            *db = sum;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    const SHAPE: LinearShape = LinearShape { envs: 3, batch: 4, in_features: 11, out_features: 5 };

    #[test]
    fn gradients_match_finite_differences() {
        let s = SHAPE;
        let x = signed(1, s.input_len());
        let w = signed(2, s.weight_len());
        let b = signed(3, s.bias_len());
        let r = signed(4, s.output_len());
        let mut y = vec![0.0; s.output_len()];
        let mut dx = vec![f64::NAN; s.input_len()];
        let mut dw = vec![f64::NAN; s.weight_len()];
        let mut db = vec![f64::NAN; s.bias_len()];
        linear_backward_input(s, &r, &w, &mut dx);
        linear_backward_params(s, &x, &r, &mut dw, Some(&mut db));
        let num_dx = numeric_gradient(&x, |xp| {
            linear_forward(s, xp, &w, Some(&b), &mut y);
            project(&r, &y)
        });
        let num_dw = numeric_gradient(&w, |wp| {
            linear_forward(s, &x, wp, Some(&b), &mut y);
            project(&r, &y)
        });
        let num_db = numeric_gradient(&b, |bp| {
            linear_forward(s, &x, &w, Some(bp), &mut y);
            project(&r, &y)
        });
        assert_gradient("linear dx", &dx, &num_dx);
        assert_gradient("linear dW", &dw, &num_dw);
        assert_gradient("linear dbias", &db, &num_db);
    }

    #[test]
    fn forward_matches_definition_and_no_bias_is_zero_bias() {
        let s = SHAPE;
        let x = signed(5, s.input_len());
        let w = signed(6, s.weight_len());
        let mut y = vec![0.0; s.output_len()];
        linear_forward(s, &x, &w, None, &mut y);
        let mut y0 = vec![0.0; s.output_len()];
        linear_forward(s, &x, &w, Some(&vec![0.0; s.bias_len()]), &mut y0);
        assert_eq!(y, y0);
        let (e, b, o) = (2, 3, 4);
        let expected: f64 = (0..s.in_features)
            .map(|i| {
                x[(e * s.batch + b) * s.in_features + i] * w[(e * s.out_features + o) * s.in_features + i]
            })
            .sum();
        assert!((y[(e * s.batch + b) * s.out_features + o] - expected).abs() < 1e-14);
    }

    fn run_f32(s: LinearShape, x: &[f32], w: &[f32], b: &[f32], r: &[f32]) -> [Vec<f32>; 4] {
        let mut y = vec![0.0; s.output_len()];
        let mut dx = vec![0.0; s.input_len()];
        let mut dw = vec![0.0; s.weight_len()];
        let mut db = vec![0.0; s.bias_len()];
        linear_forward(s, x, w, Some(b), &mut y);
        linear_backward_input(s, r, w, &mut dx);
        linear_backward_params(s, x, r, &mut dw, Some(&mut db));
        [y, dx, dw, db]
    }

    #[test]
    fn env_in_a_batch_equals_env_alone_and_ignores_thread_count() {
        let s = LinearShape { envs: 3, batch: 37, in_features: 32, out_features: 10 };
        let x = to_f32(&signed(7, s.input_len()));
        let w = to_f32(&signed(8, s.weight_len()));
        let b = to_f32(&signed(9, s.bias_len()));
        let r = to_f32(&signed(10, s.output_len()));
        let all = run_f32(s, &x, &w, &b, &r);
        let one = LinearShape { envs: 1, ..s };
        for e in 0..s.envs {
            let (xi, wi, bi, yi) = (one.input_len(), one.weight_len(), one.bias_len(), one.output_len());
            let alone =
                run_f32(one, &x[e * xi..][..xi], &w[e * wi..][..wi], &b[e * bi..][..bi], &r[e * yi..][..yi]);
            for (k, (batched, single)) in all.iter().zip(&alone).enumerate() {
                let n = single.len();
                assert_eq!(bits(&batched[e * n..][..n]), bits(single), "output {k}, env {e}");
            }
        }
        let t1 = with_threads(1, || run_f32(s, &x, &w, &b, &r));
        let t2 = with_threads(2, || run_f32(s, &x, &w, &b, &r));
        for (a, b) in t1.iter().zip(&t2) {
            assert_eq!(bits(a), bits(b));
        }
    }
}
