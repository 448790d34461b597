//! Blending a seed's output `s` into the host activation `h` at a slot (kasmina §4.3).
//!
//! Activations `h`, `s`, `x_s`, `y` are `[E, B, F]` with `F = C·H·W` (or `T·D`) features per sample. The
//! amplitude `a` is one value per env (the slot's alpha) or one per sample (counterfactual overrides), and
//! is always used as `clamp01(a)`; it is a schedule, so no gradient flows to it.
//!
//! * ADD:      `y = lerp(h, s, a) = h + a·(s − h)`
//! * MULTIPLY: `y = h·(1 + a·tanh(s − x_s))` (`x_s` is the seed's input: `h`, or `h` detached)
//! * GATE:     `y = lerp(h, s, a_eff)`, `a_eff = clamp01(clamp01(a)·clamp01(g))`, `g` per sample
//!
//! `lerp` is evaluated as the reference's `torch.lerp` is: `h + a·(s − h)` for `|a| < 0.5`, else
//! `s − (s − h)·(1 − a)`, so that `a = 1` gives the seed's output exactly (kasmina §8.1: "ADD at a = 0
//! → host exactly; at a = 1 → seed exactly"); the one-branch form rounds `h + (s − h)` away from `s`
//! where `|h| ≫ |s|`. Unfused, as the CUDA twins are compiled (`--fmad=false`); PyTorch's own CPU and
//! CUDA kernels fuse the multiply-add, so no build of the reference has one set of bits.
//!
//! Clamp subgradient (PyTorch's): `d clamp01(v)/dv = 1` on the closed interval `[0, 1]`, else 0. It only
//! matters for the gate, whose `g` is a sigmoid output and so normally lies strictly inside.
//!
//! One task per (env, sample); the gate gradient sums over the sample's features with [`LaneSums`].

use rayon::prelude::*;

use super::pool::{PoolShape, unpool_image};
use super::real::{LaneSums, Real, clamp01, clamp01_grad};

/// Shape of a blend: `[E, B, F]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlendShape {
    pub envs: usize,
    pub batch: usize,
    /// Features per sample, e.g. `C·H·W`.
    pub features: usize,
}

impl BlendShape {
    pub fn len(&self) -> usize {
        self.envs * self.batch * self.features
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn samples(&self) -> usize {
        self.envs * self.batch
    }
}

/// The blend amplitude before clamping.
#[derive(Clone, Copy, Debug)]
pub enum Amplitude<'a, T> {
    /// `[E]`: the slot's alpha.
    PerEnv(&'a [T]),
    /// `[E, B]`: a per-sample override (counterfactual ablations).
    PerSample(&'a [T]),
}

impl<T: Real> Amplitude<'_, T> {
    fn check(&self, shape: &BlendShape) {
        match self {
            Amplitude::PerEnv(a) => assert_eq!(a.len(), shape.envs, "per-env amplitude length [E]"),
            Amplitude::PerSample(a) => {
                assert_eq!(a.len(), shape.samples(), "per-sample amplitude length [E, B]")
            }
        }
    }

    /// `clamp01(a)` for sample `i = e·B + b`.
    #[inline]
    fn clamped(&self, i: usize, batch: usize) -> T {
        match self {
            Amplitude::PerEnv(a) => clamp01(a[i / batch]),
            Amplitude::PerSample(a) => clamp01(a[i]),
        }
    }
}

fn check_activations<T>(shape: &BlendShape, buffers: &[&[T]]) {
    for b in buffers {
        assert_eq!(b.len(), shape.len(), "blend activation length [E, B, F]");
    }
}

/// ADD forward: `y = h + a·(s − h)`. Overwrites `y`.
pub fn blend_add_forward<T: Real>(shape: BlendShape, h: &[T], s: &[T], alpha: Amplitude<'_, T>, y: &mut [T]) {
    check_activations(&shape, &[h, s, y]);
    alpha.check(&shape);
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    y.par_chunks_mut(f).enumerate().for_each(|(i, y)| {
        let a = alpha.clamped(i, shape.batch);
        for ((out, &hv), &sv) in y.iter_mut().zip(&h[i * f..(i + 1) * f]).zip(&s[i * f..(i + 1) * f]) {
            *out = blend_add(hv, sv, a);
        }
    });
}

/// One value of the ADD blend, `lerp(h, s, a)` with `a` already clamped to `[0, 1]`: the arithmetic of
/// [`blend_add_forward`] and [`blend_gate_forward`], for the seeds that blend in their own last pass.
/// `torch.lerp`'s two branches (module docs): exact at both ends.
#[inline(always)]
pub(crate) fn blend_add<T: Real>(h: T, s: T, a: T) -> T {
    if a < T::HALF { h + a * (s - h) } else { s - (s - h) * (T::ONE - a) }
}

/// ADD backward: `dh = dy·(1 − a)`, `ds = dy·a`. Overwrites `grad_h` and `grad_s`.
pub fn blend_add_backward<T: Real>(
    shape: BlendShape,
    alpha: Amplitude<'_, T>,
    grad_output: &[T],
    grad_h: &mut [T],
    grad_s: &mut [T],
) {
    check_activations(&shape, &[grad_output, grad_h, grad_s]);
    alpha.check(&shape);
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    grad_h.par_chunks_mut(f).zip(grad_s.par_chunks_mut(f)).enumerate().for_each(|(i, (dh, ds))| {
        let a = alpha.clamped(i, shape.batch);
        for ((dh, ds), &dy) in dh.iter_mut().zip(ds.iter_mut()).zip(&grad_output[i * f..(i + 1) * f]) {
            *dh = dy * (T::ONE - a);
            *ds = dy * a;
        }
    });
}

/// [`max_pool2x2_backward`](super::max_pool2x2_backward) (`pool`: the pool after the blend) then
/// [`blend_add_backward`], from the pool's output gradient, without the full-size output gradient between
/// them: the same bits (where no window's winner sits both give `+0`, as `+0·(1 − a)` and `+0·a` are `+0`
/// for the clamped `a ∈ [0, 1]`). Overwrites `grad_s` and, when given, `grad_h` (a caller that takes the
/// host's gradient `g·(1 − a)` from the pooled one itself passes `None`, and no full-size `grad_h` is
/// written either).
#[allow(clippy::too_many_arguments)]
pub fn blend_add_backward_from_pooled<T: Real>(
    shape: BlendShape,
    pool: PoolShape,
    alpha: Amplitude<'_, T>,
    grad_pooled: &[T],
    argmax: &[u8],
    grad_h: Option<&mut [T]>,
    grad_s: &mut [T],
) {
    check_activations(&shape, &[grad_s]);
    if let Some(grad_h) = &grad_h {
        check_activations(&shape, &[grad_h]);
    }
    alpha.check(&shape);
    assert_eq!(pool.input_len(), shape.len(), "the pool reads the blend's output");
    assert_eq!(grad_pooled.len(), pool.max_pool_output_len(), "max pool output gradient length");
    assert_eq!(argmax.len(), grad_pooled.len(), "max pool argmax length");
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    let (g, code) = (grad_pooled, argmax);
    match grad_h {
        Some(grad_h) => {
            grad_h.par_chunks_mut(f).zip(grad_s.par_chunks_mut(f)).enumerate().for_each(|(i, (dh, ds))| {
                let a = alpha.clamped(i, shape.batch);
                unpool_image(&pool, i, g, code, |dy| dy * (T::ONE - a), dh);
                unpool_image(&pool, i, g, code, |dy| dy * a, ds);
            })
        }
        None => grad_s.par_chunks_mut(f).enumerate().for_each(|(i, ds)| {
            let a = alpha.clamped(i, shape.batch);
            unpool_image(&pool, i, g, code, |dy| dy * a, ds);
        }),
    }
}

/// MULTIPLY forward: `y = h·(1 + a·tanh(s − x_s))`. Overwrites `y`.
pub fn blend_multiply_forward<T: Real>(
    shape: BlendShape,
    h: &[T],
    s: &[T],
    x_s: &[T],
    alpha: Amplitude<'_, T>,
    y: &mut [T],
) {
    check_activations(&shape, &[h, s, x_s, y]);
    alpha.check(&shape);
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    y.par_chunks_mut(f).enumerate().for_each(|(i, y)| {
        let a = alpha.clamped(i, shape.batch);
        let r = i * f..(i + 1) * f;
        for (((out, &hv), &sv), &xv) in
            y.iter_mut().zip(&h[r.clone()]).zip(&s[r.clone()]).zip(&x_s[r.clone()])
        {
            *out = hv * (T::ONE + a * (sv - xv).tanh());
        }
    });
}

/// MULTIPLY backward, with `t = tanh(s − x_s)` and `m = dy·h·a·(1 − t²)`: `dh = dy·(1 + a·t)`, `ds = m`,
/// and, when asked for, `dx_s = −m`. Overwrites every gradient it writes. When `x_s` is `h` itself (no
/// gradient isolation), the caller adds `dx_s` (and the seed's input gradient) into `dh`.
#[allow(clippy::too_many_arguments)]
pub fn blend_multiply_backward<T: Real>(
    shape: BlendShape,
    h: &[T],
    s: &[T],
    x_s: &[T],
    alpha: Amplitude<'_, T>,
    grad_output: &[T],
    grad_h: &mut [T],
    grad_s: &mut [T],
    grad_x_s: Option<&mut [T]>,
) {
    check_activations(&shape, &[h, s, x_s, grad_output, grad_h, grad_s]);
    alpha.check(&shape);
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    grad_h.par_chunks_mut(f).zip(grad_s.par_chunks_mut(f)).enumerate().for_each(|(i, (dh, ds))| {
        let a = alpha.clamped(i, shape.batch);
        let r = i * f..(i + 1) * f;
        let inputs = h[r.clone()].iter().zip(&s[r.clone()]).zip(&x_s[r.clone()]).zip(&grad_output[r]);
        for ((dh, ds), (((&hv, &sv), &xv), &dy)) in dh.iter_mut().zip(ds.iter_mut()).zip(inputs) {
            let t = (sv - xv).tanh();
            *dh = dy * (T::ONE + a * t);
            *ds = dy * hv * a * (T::ONE - t * t);
        }
    });
    if let Some(dx_s) = grad_x_s {
        assert_eq!(dx_s.len(), shape.len(), "blend activation length [E, B, F]");
        dx_s.par_chunks_mut(f).zip(grad_s.par_chunks(f)).for_each(|(dx, ds)| {
            for (dx, &d) in dx.iter_mut().zip(ds) {
                *dx = -d;
            }
        });
    }
}

/// GATE forward: `y = h + a_eff·(s − h)` with `a_eff = clamp01(clamp01(a)·clamp01(g))`, `g`: `[E, B]`.
/// Overwrites `y`.
pub fn blend_gate_forward<T: Real>(
    shape: BlendShape,
    h: &[T],
    s: &[T],
    alpha: Amplitude<'_, T>,
    gate: &[T],
    y: &mut [T],
) {
    check_activations(&shape, &[h, s, y]);
    alpha.check(&shape);
    assert_eq!(gate.len(), shape.samples(), "gate length [E, B]");
    if shape.is_empty() {
        return;
    }
    let f = shape.features;
    y.par_chunks_mut(f).enumerate().for_each(|(i, y)| {
        let a = clamp01(alpha.clamped(i, shape.batch) * clamp01(gate[i]));
        for ((out, &hv), &sv) in y.iter_mut().zip(&h[i * f..(i + 1) * f]).zip(&s[i * f..(i + 1) * f]) {
            *out = blend_add(hv, sv, a);
        }
    });
}

/// GATE backward: `dh = dy·(1 − a_eff)`, `ds = dy·a_eff`, and
/// `dg = Σ_features dy·(s − h) · clamp01(a) · clamp01'(clamp01(a)·clamp01(g)) · clamp01'(g)` per sample.
/// Overwrites `grad_h`, `grad_s`, `grad_gate`.
#[allow(clippy::too_many_arguments)]
pub fn blend_gate_backward<T: Real>(
    shape: BlendShape,
    h: &[T],
    s: &[T],
    alpha: Amplitude<'_, T>,
    gate: &[T],
    grad_output: &[T],
    grad_h: &mut [T],
    grad_s: &mut [T],
    grad_gate: &mut [T],
) {
    check_activations(&shape, &[h, s, grad_output, grad_h, grad_s]);
    alpha.check(&shape);
    assert_eq!(gate.len(), shape.samples(), "gate length [E, B]");
    assert_eq!(grad_gate.len(), shape.samples(), "gate gradient length [E, B]");
    if shape.is_empty() {
        grad_gate.fill(T::ZERO);
        return;
    }
    let f = shape.features;
    grad_h
        .par_chunks_mut(f)
        .zip(grad_s.par_chunks_mut(f))
        .zip(grad_gate.par_iter_mut())
        .enumerate()
        .for_each(|(i, ((dh, ds), dg))| {
            let a = alpha.clamped(i, shape.batch);
            let g = clamp01(gate[i]);
            let a_eff = clamp01(a * g);
            let r = i * f..(i + 1) * f;
            for ((dh, ds), &dy) in dh.iter_mut().zip(ds.iter_mut()).zip(&grad_output[r.clone()]) {
                *dh = dy * (T::ONE - a_eff);
                *ds = dy * a_eff;
            }
            let mut sum = LaneSums::new();
            sum.add_zip3(&grad_output[r.clone()], &s[r.clone()], &h[r], |d, sv, hv| d * (sv - hv));
            *dg = sum.total() * a * clamp01_grad(a * g) * clamp01_grad(gate[i]);
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    const SHAPE: BlendShape = BlendShape { envs: 3, batch: 2, features: 13 };

    /// Per-env and per-sample amplitudes inside (0, 1), so every clamp is on its linear piece.
    fn amplitudes() -> (Vec<f64>, Vec<f64>) {
        (uniform(100, SHAPE.envs, 0.1, 0.9), uniform(101, SHAPE.samples(), 0.1, 0.9))
    }

    /// The ADD blend's backward from a max pool's output gradient is the pool's backward then the
    /// blend's, bit for bit: odd planes (the pool drops the last row and column), amplitudes at 0, at 1,
    /// clamped from above 1 and in between, per env and per sample.
    #[test]
    fn add_backward_from_pooled_is_pool_backward_then_add_backward() {
        use crate::ops::{max_pool2x2_backward, max_pool2x2_forward};
        let pool = PoolShape { envs: 3, batch: 2, channels: 2, h: 5, w: 7 };
        let shape = BlendShape { envs: 3, batch: 2, features: 2 * 5 * 7 };
        let y: Vec<f32> = signed(4, shape.len()).iter().map(|&v| v as f32).collect();
        let (mut pooled, mut argmax) =
            (vec![0.0f32; pool.max_pool_output_len()], vec![0u8; pool.max_pool_output_len()]);
        max_pool2x2_forward(pool, &y, &mut pooled, &mut argmax);
        assert!(argmax.contains(&3) && argmax.contains(&0), "winners spread");
        let g: Vec<f32> = signed(5, pool.max_pool_output_len()).iter().map(|&v| v as f32).collect();
        let per_env = [0.0f32, 1.3, 0.37];
        let per_sample = [1.0f32, 0.5, 0.0, 0.81, 2.0, 0.25];
        let mut checked = 0;
        for alpha in [Amplitude::PerEnv(&per_env[..]), Amplitude::PerSample(&per_sample[..])] {
            let mut dy = vec![f32::NAN; shape.len()];
            max_pool2x2_backward(pool, &g, &argmax, &mut dy);
            let (mut dh, mut ds) = (vec![f32::NAN; shape.len()], vec![f32::NAN; shape.len()]);
            blend_add_backward(shape, alpha, &dy, &mut dh, &mut ds);
            let (mut dh_p, mut ds_p) = (vec![f32::NAN; shape.len()], vec![f32::NAN; shape.len()]);
            blend_add_backward_from_pooled(shape, pool, alpha, &g, &argmax, Some(&mut dh_p), &mut ds_p);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dh_p), bits(&dh), "grad_h");
            assert_eq!(bits(&ds_p), bits(&ds), "grad_s");
            let mut ds_only = vec![f32::NAN; shape.len()];
            blend_add_backward_from_pooled(shape, pool, alpha, &g, &argmax, None, &mut ds_only);
            assert_eq!(bits(&ds_only), bits(&ds), "grad_s without grad_h");
            checked += dh.iter().filter(|v| **v != 0.0).count() + ds.iter().filter(|v| **v != 0.0).count();
        }
        // Per env: a = 0 leaves ds zero, a = 1 (clamped) leaves dh zero, a = 0.37 neither.
        assert!(checked >= 4 * pool.max_pool_output_len() / 3, "non-zero gradients compared: {checked}");
    }

    #[test]
    fn add_gradients_match_finite_differences() {
        let sh = SHAPE;
        let (per_env, per_sample) = amplitudes();
        for alpha in [Amplitude::PerEnv(&per_env[..]), Amplitude::PerSample(&per_sample[..])] {
            let (h, s, r) = (signed(1, sh.len()), signed(2, sh.len()), signed(3, sh.len()));
            let (mut dh, mut ds) = (vec![f64::NAN; sh.len()], vec![f64::NAN; sh.len()]);
            blend_add_backward(sh, alpha, &r, &mut dh, &mut ds);
            let mut y = vec![0.0; sh.len()];
            let num_dh = numeric_gradient(&h, |hp| {
                blend_add_forward(sh, hp, &s, alpha, &mut y);
                project(&r, &y)
            });
            let num_ds = numeric_gradient(&s, |sp| {
                blend_add_forward(sh, &h, sp, alpha, &mut y);
                project(&r, &y)
            });
            assert_gradient("add dh", &dh, &num_dh);
            assert_gradient("add ds", &ds, &num_ds);
        }
    }

    #[test]
    fn multiply_gradients_match_finite_differences() {
        let sh = SHAPE;
        let (per_env, per_sample) = amplitudes();
        for alpha in [Amplitude::PerEnv(&per_env[..]), Amplitude::PerSample(&per_sample[..])] {
            let (h, s, x, r) =
                (signed(4, sh.len()), signed(5, sh.len()), signed(6, sh.len()), signed(7, sh.len()));
            let (mut dh, mut ds, mut dx) =
                (vec![f64::NAN; sh.len()], vec![f64::NAN; sh.len()], vec![f64::NAN; sh.len()]);
            blend_multiply_backward(sh, &h, &s, &x, alpha, &r, &mut dh, &mut ds, Some(&mut dx));
            let mut y = vec![0.0; sh.len()];
            let num_dh = numeric_gradient(&h, |p| {
                blend_multiply_forward(sh, p, &s, &x, alpha, &mut y);
                project(&r, &y)
            });
            let num_ds = numeric_gradient(&s, |p| {
                blend_multiply_forward(sh, &h, p, &x, alpha, &mut y);
                project(&r, &y)
            });
            let num_dx = numeric_gradient(&x, |p| {
                blend_multiply_forward(sh, &h, &s, p, alpha, &mut y);
                project(&r, &y)
            });
            assert_gradient("multiply dh", &dh, &num_dh);
            assert_gradient("multiply ds", &ds, &num_ds);
            assert_gradient("multiply dx_s", &dx, &num_dx);
        }
    }

    #[test]
    fn gate_gradients_match_finite_differences() {
        let sh = SHAPE;
        let (per_env, per_sample) = amplitudes();
        let gate = uniform(8, sh.samples(), 0.05, 0.95);
        for alpha in [Amplitude::PerEnv(&per_env[..]), Amplitude::PerSample(&per_sample[..])] {
            let (h, s, r) = (signed(9, sh.len()), signed(10, sh.len()), signed(11, sh.len()));
            let (mut dh, mut ds) = (vec![f64::NAN; sh.len()], vec![f64::NAN; sh.len()]);
            let mut dg = vec![f64::NAN; sh.samples()];
            blend_gate_backward(sh, &h, &s, alpha, &gate, &r, &mut dh, &mut ds, &mut dg);
            let mut y = vec![0.0; sh.len()];
            let num_dh = numeric_gradient(&h, |p| {
                blend_gate_forward(sh, p, &s, alpha, &gate, &mut y);
                project(&r, &y)
            });
            let num_ds = numeric_gradient(&s, |p| {
                blend_gate_forward(sh, &h, p, alpha, &gate, &mut y);
                project(&r, &y)
            });
            let num_dg = numeric_gradient(&gate, |p| {
                blend_gate_forward(sh, &h, &s, alpha, p, &mut y);
                project(&r, &y)
            });
            assert_gradient("gate dh", &dh, &num_dh);
            assert_gradient("gate ds", &ds, &num_ds);
            assert_gradient("gate dg", &dg, &num_dg);
        }
    }

    #[test]
    fn amplitude_is_clamped_and_zero_is_exact_identity() {
        let sh = BlendShape { envs: 2, batch: 1, features: 4 };
        let (h, s, x) = (signed(12, sh.len()), signed(13, sh.len()), signed(14, sh.len()));
        let mut y = vec![0.0; sh.len()];
        let mut y_ref = vec![0.0; sh.len()];
        // a = 0 → y = h exactly, for every blend.
        let zero = [0.0, -0.5];
        blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&zero), &mut y);
        assert_eq!(y, h);
        blend_multiply_forward(sh, &h, &s, &x, Amplitude::PerEnv(&zero), &mut y);
        assert_eq!(y, h);
        blend_gate_forward(sh, &h, &s, Amplitude::PerEnv(&zero), &[0.7, 0.7], &mut y);
        assert_eq!(y, h);
        // a above 1 acts as 1; a gate above 1 acts as 1.
        blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&[1.7, 3.0]), &mut y);
        blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&[1.0, 1.0]), &mut y_ref);
        assert_eq!(y, y_ref);
        blend_gate_forward(sh, &h, &s, Amplitude::PerEnv(&[0.6, 0.6]), &[1.5, 1.0], &mut y);
        blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&[0.6, 0.6]), &mut y_ref);
        assert_eq!(y, y_ref);
        // Outside [0, 1] the gate gets no gradient.
        let (mut dh, mut ds, mut dg) = (vec![0.0; sh.len()], vec![0.0; sh.len()], vec![f64::NAN; 2]);
        blend_gate_backward(
            sh,
            &h,
            &s,
            Amplitude::PerEnv(&[0.6, 0.6]),
            &[1.5, -0.2],
            &x,
            &mut dh,
            &mut ds,
            &mut dg,
        );
        assert_eq!(dg, [0.0, 0.0]);
    }

    /// kasmina §8.1: ADD (and GATE at a full gate) at a = 1 gives the seed's output exactly, as
    /// `torch.lerp` does, also where the host's values dwarf the seed's (`h + (s − h)` would round:
    /// 1e8 + (1.5 − 1e8) is 0 in f32); between the ends the blend stays within an ulp or two of the
    /// exact `h + a·(s − h)` (f64 over f32 inputs).
    #[test]
    fn add_and_gate_at_one_give_the_seed_output_exactly() {
        let sh = BlendShape { envs: 2, batch: 2, features: 5 };
        let h: Vec<f32> =
            (0..sh.len()).map(|i| if i % 2 == 0 { 1e8 } else { -3e7 } * (1.0 + i as f32 / 7.0)).collect();
        let s: Vec<f32> = signed(15, sh.len()).iter().map(|&v| v as f32 * 1.5).collect();
        let mut y = vec![0.0f32; sh.len()];
        blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&[1.0, 1.0]), &mut y);
        assert_eq!(y, s);
        blend_gate_forward(sh, &h, &s, Amplitude::PerEnv(&[1.0, 1.0]), &[1.0; 4], &mut y);
        assert_eq!(y, s);
        let inexact = h.iter().zip(&s).filter(|&(&h, &s)| h + 1.0 * (s - h) != s).count();
        eprintln!("h + 1·(s − h) misses s in {inexact} of {} values", sh.len());
        assert!(
            inexact >= 5,
            "the one-branch form misses the seed's output in {inexact} of {} values",
            sh.len()
        );
        for a in [0.25f32, 0.5, 0.75, 0.999] {
            blend_add_forward(sh, &h, &s, Amplitude::PerEnv(&[a, a]), &mut y);
            for ((&y, &h), &s) in y.iter().zip(&h).zip(&s) {
                let exact = h as f64 + a as f64 * (s as f64 - h as f64);
                assert!(
                    (y as f64 - exact).abs() <= 2.0 * f32::EPSILON as f64 * h.abs() as f64,
                    "a = {a}: {y} against {exact}"
                );
            }
        }
    }

    fn gate_f32(
        sh: BlendShape,
        alpha: &[f32],
        gate: &[f32],
        h: &[f32],
        s: &[f32],
        r: &[f32],
    ) -> [Vec<f32>; 4] {
        let mut y = vec![0.0; sh.len()];
        blend_gate_forward(sh, h, s, Amplitude::PerEnv(alpha), gate, &mut y);
        let (mut dh, mut ds, mut dg) = (vec![0.0; sh.len()], vec![0.0; sh.len()], vec![0.0; sh.samples()]);
        blend_gate_backward(sh, h, s, Amplitude::PerEnv(alpha), gate, r, &mut dh, &mut ds, &mut dg);
        [y, dh, ds, dg]
    }

    #[test]
    fn gate_env_in_a_batch_equals_env_alone_and_ignores_thread_count() {
        let sh = BlendShape { envs: 3, batch: 5, features: 8 * 9 * 9 };
        let alpha = to_f32(&uniform(20, sh.envs, 0.0, 1.0));
        let gate = to_f32(&uniform(21, sh.samples(), 0.0, 1.0));
        let (h, s, r) =
            (to_f32(&signed(22, sh.len())), to_f32(&signed(23, sh.len())), to_f32(&signed(24, sh.len())));
        let all = gate_f32(sh, &alpha, &gate, &h, &s, &r);
        let one = BlendShape { envs: 1, ..sh };
        for e in 0..sh.envs {
            let (n, b) = (one.len(), one.samples());
            let alone = gate_f32(
                one,
                &alpha[e..e + 1],
                &gate[e * b..][..b],
                &h[e * n..][..n],
                &s[e * n..][..n],
                &r[e * n..][..n],
            );
            for (k, (batched, single)) in all.iter().zip(&alone).enumerate() {
                let len = single.len();
                assert_eq!(bits(&batched[e * len..][..len]), bits(single), "output {k}, env {e}");
            }
        }
        let t1 = with_threads(1, || gate_f32(sh, &alpha, &gate, &h, &s, &r));
        let t2 = with_threads(2, || gate_f32(sh, &alpha, &gate, &h, &s, &r));
        for (a, b) in t1.iter().zip(&t2) {
            assert_eq!(bits(a), bits(b));
        }
    }
}
