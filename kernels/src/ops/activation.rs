//! Element-wise activations (ReLU, tanh, sigmoid) and the element-wise add a residual needs.
//!
//! These do not mix elements, so any split of the work gives the same bits; they run over fixed-size
//! chunks in parallel. Backward passes take the forward *output* (enough for all three).

use rayon::prelude::*;

use super::real::Real;

/// Elements per parallel task: big enough to amortise scheduling, small enough to balance two cores.
const CHUNK: usize = 1 << 14;

#[inline]
fn map_into<T: Real>(x: &[T], y: &mut [T], f: impl Fn(T) -> T + Sync) {
    assert_eq!(x.len(), y.len(), "element-wise op: input and output lengths differ");
    y.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(y, x)| {
        for (out, &v) in y.iter_mut().zip(x) {
            *out = f(v);
        }
    });
}

#[inline]
fn zip_into<T: Real>(a: &[T], b: &[T], out: &mut [T], f: impl Fn(T, T) -> T + Sync) {
    assert!(a.len() == out.len() && b.len() == out.len(), "element-wise op: lengths differ");
    out.par_chunks_mut(CHUNK).zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK))).for_each(|(out, (a, b))| {
        for ((o, &u), &v) in out.iter_mut().zip(a).zip(b) {
            *o = f(u, v);
        }
    });
}

#[inline]
fn update_in_place<T: Real>(data: &mut [T], other: &[T], f: impl Fn(T, T) -> T + Sync) {
    assert_eq!(data.len(), other.len(), "element-wise op: lengths differ");
    data.par_chunks_mut(CHUNK).zip(other.par_chunks(CHUNK)).for_each(|(d, o)| {
        for (v, &w) in d.iter_mut().zip(o) {
            *v = f(*v, w);
        }
    });
}

/// `y = max(x, 0)`, NaN propagating as in PyTorch (`relu(NaN) = NaN`: a broken env must show a
/// non-finite loss to the governor, not be silently zeroed).
pub fn relu_forward<T: Real>(x: &[T], y: &mut [T]) {
    map_into(x, y, relu);
}

/// `x = max(x, 0)` in place, NaN propagating.
pub fn relu_forward_in_place<T: Real>(x: &mut [T]) {
    x.par_chunks_mut(CHUNK).for_each(|c| {
        for v in c {
            *v = relu(*v);
        }
    });
}

#[inline(always)]
pub(crate) fn relu<T: Real>(v: T) -> T {
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(v <= 0)` is true for NaN, which must pass through
    let keep = !(v <= T::ZERO);
    if keep { v } else { T::ZERO }
}

/// `dx = dy · [y > 0]` from the forward output `y` (the subgradient at 0 is 0, as in PyTorch).
pub fn relu_backward<T: Real>(y: &[T], grad_output: &[T], grad_input: &mut [T]) {
    zip_into(y, grad_output, grad_input, |v, d| if v > T::ZERO { d } else { T::ZERO });
}

/// `grad = grad · [y > 0]` in place: turns the gradient at the ReLU output into the one at its input.
pub fn relu_backward_in_place<T: Real>(y: &[T], grad: &mut [T]) {
    update_in_place(grad, y, |d, v| if v > T::ZERO { d } else { T::ZERO });
}

/// `y = tanh(x)`.
pub fn tanh_forward<T: Real>(x: &[T], y: &mut [T]) {
    map_into(x, y, |v| v.tanh());
}

/// `dx = dy · (1 − y²)` from the forward output `y`.
pub fn tanh_backward<T: Real>(y: &[T], grad_output: &[T], grad_input: &mut [T]) {
    zip_into(y, grad_output, grad_input, |v, d| d * (T::ONE - v * v));
}

/// The logistic function, in the form that never overflows: `1/(1 + e^−x)` for `x ≥ 0`, else
/// `e^x/(1 + e^x)`.
#[inline(always)]
pub fn sigmoid<T: Real>(v: T) -> T {
    if v >= T::ZERO {
        T::ONE / (T::ONE + (-v).exp())
    } else {
        let z = v.exp();
        z / (T::ONE + z)
    }
}

/// `y = σ(x)`.
pub fn sigmoid_forward<T: Real>(x: &[T], y: &mut [T]) {
    map_into(x, y, sigmoid);
}

/// `dx = dy · y · (1 − y)` from the forward output `y`.
pub fn sigmoid_backward<T: Real>(y: &[T], grad_output: &[T], grad_input: &mut [T]) {
    zip_into(y, grad_output, grad_input, |v, d| d * v * (T::ONE - v));
}

/// `dst += src`: a residual's forward sum, or the gradient of a value that feeds two paths.
pub fn add_in_place<T: Real>(dst: &mut [T], src: &[T]) {
    update_in_place(dst, src, |a, b| a + b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    type Forward = fn(&[f64], &mut [f64]);
    type Backward = fn(&[f64], &[f64], &mut [f64]);

    fn check(name: &str, forward: Forward, backward: Backward, x: &[f64]) {
        let r = signed(99, x.len());
        let mut y = vec![0.0; x.len()];
        forward(x, &mut y);
        let mut dx = vec![f64::NAN; x.len()];
        backward(&y, &r, &mut dx);
        let mut probe = vec![0.0; x.len()];
        let numeric = numeric_gradient(x, |xp| {
            forward(xp, &mut probe);
            project(&r, &probe)
        });
        assert_gradient(name, &dx, &numeric);
    }

    #[test]
    fn gradients_match_finite_differences() {
        // 3 envs × 2 images × 2 channels × 3 × 3, flattened: these ops do not care about the shape.
        let n = 3 * 2 * 2 * 9;
        check("relu", relu_forward, relu_backward, &away_from_zero(1, n));
        check("tanh", tanh_forward, tanh_backward, &uniform(2, n, -3.0, 3.0));
        check("sigmoid", sigmoid_forward, sigmoid_backward, &uniform(3, n, -8.0, 8.0));
    }

    #[test]
    fn in_place_variants_match() {
        let x = away_from_zero(4, 100);
        let r = signed(5, 100);
        let mut y = vec![0.0; 100];
        relu_forward(&x, &mut y);
        let mut y2 = x.clone();
        relu_forward_in_place(&mut y2);
        assert_eq!(y, y2);
        let mut dx = vec![0.0; 100];
        relu_backward(&y, &r, &mut dx);
        let mut g = r.clone();
        relu_backward_in_place(&y, &mut g);
        assert_eq!(dx, g);
        let mut sum = x.clone();
        add_in_place(&mut sum, &r);
        for i in 0..100 {
            assert_eq!(sum[i], x[i] + r[i]);
        }
    }

    #[test]
    fn sigmoid_is_stable_at_extremes() {
        assert_eq!(sigmoid(-1000.0f32), 0.0);
        assert_eq!(sigmoid(1000.0f32), 1.0);
        assert_eq!(sigmoid(0.0f64), 0.5);
    }
}

#[cfg(test)]
mod nan_tests {
    use super::*;

    #[test]
    fn relu_propagates_nan_like_pytorch() {
        let x = [f32::NAN, -1.0, 0.0, 2.0];
        let mut y = [0.0f32; 4];
        relu_forward(&x, &mut y);
        assert!(y[0].is_nan());
        assert_eq!(&y[1..], &[0.0, 0.0, 2.0]);
        let mut z = x;
        relu_forward_in_place(&mut z);
        assert!(z[0].is_nan() && z[3] == 2.0);
    }
}
