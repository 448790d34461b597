//! 2×2 max pooling (stride 2) and global average pooling over `[E, B, C, H, W]`.
//!
//! Both run one task per (env, image). Max pooling stores which element of each window won (0..4, row
//! major) so the backward is a scatter; on ties the first maximum in row-major window order wins and takes
//! the whole gradient, as in PyTorch. Odd trailing rows/columns are dropped (floor mode).

use rayon::prelude::*;

use super::real::{LaneSums, Real};

/// Shape of a pooled activation `[E, B, C, H, W]` (the input side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    pub envs: usize,
    pub batch: usize,
    pub channels: usize,
    pub h: usize,
    pub w: usize,
}

impl PoolShape {
    pub fn input_len(&self) -> usize {
        self.envs * self.batch * self.channels * self.h * self.w
    }
    /// Elements of the 2×2 max-pool output `[E, B, C, H/2, W/2]`.
    pub fn max_pool_output_len(&self) -> usize {
        self.envs * self.batch * self.channels * (self.h / 2) * (self.w / 2)
    }
    /// Elements of the global-average-pool output `[E, B, C]`.
    pub fn global_pool_output_len(&self) -> usize {
        self.envs * self.batch * self.channels
    }
}

/// `y[.., i, j] = max of x[.., 2i..2i+2, 2j..2j+2]`; `argmax` gets the winner's row-major window index
/// (`0..4`). Overwrites `y` and `argmax`.
pub fn max_pool2x2_forward<T: Real>(shape: PoolShape, x: &[T], y: &mut [T], argmax: &mut [u8]) {
    assert_eq!(x.len(), shape.input_len(), "max pool input length");
    assert_eq!(y.len(), shape.max_pool_output_len(), "max pool output length");
    assert_eq!(argmax.len(), y.len(), "max pool argmax length");
    let (h, w, ho, wo) = (shape.h, shape.w, shape.h / 2, shape.w / 2);
    let out_image = shape.channels * ho * wo;
    if out_image == 0 {
        return;
    }
    let in_image = shape.channels * h * w;
    y.par_chunks_mut(out_image).zip(argmax.par_chunks_mut(out_image)).enumerate().for_each(
        |(i, (y_img, idx_img))| {
            let x_img = &x[i * in_image..(i + 1) * in_image];
            for c in 0..shape.channels {
                let plane = &x_img[c * h * w..(c + 1) * h * w];
                for oy in 0..ho {
                    let (top, bottom) = plane[2 * oy * w..(2 * oy + 2) * w].split_at(w);
                    let out = (c * ho + oy) * wo..(c * ho + oy + 1) * wo;
                    pool_rows(top, bottom, &mut y_img[out.clone()], &mut idx_img[out]);
                }
            }
        },
    );
}

/// Pools one pair of rows into `out` and `index`: `V` windows at a time, then `V/2`, then one.
#[inline(always)]
fn pool_rows<T: Real>(top: &[T], bottom: &[T], out: &mut [T], index: &mut [u8]) {
    let mut ox0 = 0;
    while ox0 < out.len() {
        ox0 += match out.len() - ox0 {
            n if n >= V => pool_windows::<T, V>(top, bottom, out, index, ox0),
            n if n >= V / 2 => pool_windows::<T, { V / 2 }>(top, bottom, out, index, ox0),
            _ => pool_windows::<T, 1>(top, bottom, out, index, ox0),
        };
    }
}

#[inline(always)]
fn pool_windows<T: Real, const N: usize>(
    top: &[T],
    bottom: &[T],
    out: &mut [T],
    index: &mut [u8],
    ox0: usize,
) -> usize {
    let windows = gather_windows::<T, N>(top, bottom, ox0);
    let (best, k, _) = winners(&windows, &windows);
    out[ox0..ox0 + N].copy_from_slice(&best);
    for l in 0..N {
        index[ox0 + l] = k[l] as u8;
    }
    N
}

/// Windows pooled together (one AVX2 vector of f32).
pub(crate) const V: usize = 8;

/// Element `k` (row-major) of `V` consecutive 2×2 windows starting at window `ox0` of a row pair:
/// `[k][l]` for window `ox0 + l`.
#[inline(always)]
pub(crate) fn gather_windows<T: Real, const N: usize>(top: &[T], bottom: &[T], ox0: usize) -> [[T; N]; 4] {
    let (t, b) = (&top[2 * ox0..2 * ox0 + 2 * N], &bottom[2 * ox0..2 * ox0 + 2 * N]);
    let mut windows = [[T::ZERO; N]; 4];
    for l in 0..N {
        windows[0][l] = t[2 * l];
        windows[1][l] = t[2 * l + 1];
        windows[2][l] = b[2 * l];
        windows[3][l] = b[2 * l + 1];
    }
    windows
}

/// Each of `N` windows' winner, without branches so the loop vectorises: `(winning values, their indices,
/// the elements of `companion` at those indices)`. Strictly greater: an equal later element never displaces
/// the first maximum (ties give the whole gradient to the first). A NaN wins and stays (PyTorch propagates
/// NaN through max-pool, and the governor relies on a non-finite loss to see a broken env).
#[inline(always)]
pub(crate) fn winners<T: Real, const N: usize>(
    windows: &[[T; N]; 4],
    companion: &[[T; N]; 4],
) -> ([T; N], [u32; N], [T; N]) {
    let mut best = windows[0];
    let mut other = companion[0];
    let mut index = [0u32; N];
    for k in 1..4 {
        for l in 0..N {
            let v = windows[k][l];
            let take = !best[l].is_nan() & ((v > best[l]) | v.is_nan());
            best[l] = if take { v } else { best[l] };
            other[l] = if take { companion[k][l] } else { other[l] };
            index[l] = if take { k as u32 } else { index[l] };
        }
    }
    (best, index, other)
}

/// Routes each output gradient to the window element that won. Overwrites `grad_input` (zero elsewhere,
/// including dropped odd rows/columns).
pub fn max_pool2x2_backward<T: Real>(
    shape: PoolShape,
    grad_output: &[T],
    argmax: &[u8],
    grad_input: &mut [T],
) {
    assert_eq!(grad_input.len(), shape.input_len(), "max pool input gradient length");
    assert_eq!(grad_output.len(), shape.max_pool_output_len(), "max pool output gradient length");
    assert_eq!(argmax.len(), grad_output.len(), "max pool argmax length");
    let (h, w) = (shape.h, shape.w);
    let in_image = shape.channels * h * w;
    if in_image == 0 {
        return;
    }
    grad_input.par_chunks_mut(in_image).enumerate().for_each(|(i, dx_img)| {
        unpool_image(&shape, i, grad_output, argmax, |g| g, dx_img);
    });
}

/// Image `i`'s 2×2 max-pool input gradient (`C·H·W` of `shape`, overwrites `dst`) from the pool's output
/// gradient `g` and winners `argmax` (whole tensors, `[…, C, H/2, W/2]`): `f(g[o])` at each window's
/// winner, `+0` everywhere else (an odd plane's dropped row and column included).
#[inline(always)]
pub(crate) fn unpool_image<T: Real>(
    shape: &PoolShape,
    i: usize,
    g: &[T],
    argmax: &[u8],
    f: impl Fn(T) -> T,
    dst: &mut [T],
) {
    assert_eq!(dst.len(), shape.channels * shape.h * shape.w, "one image of the max pool's input gradient");
    let windows = shape.channels * (shape.h / 2) * (shape.w / 2);
    let image = i * windows..(i + 1) * windows;
    let (g, argmax) = (&g[image.clone()], &argmax[image]);
    dst.fill(T::ZERO);
    for_each_argmax(shape, argmax, |o, at| dst[at] = f(g[o]));
}

/// Calls `f(o, at)` for every window `o` of one image's 2×2 max pool (`argmax` of one image, `C·H/2·W/2`)
/// with the position `at` of its winner in the image (`C·H·W`): where the window's gradient goes.
#[inline(always)]
fn for_each_argmax(shape: &PoolShape, argmax: &[u8], mut f: impl FnMut(usize, usize)) {
    let (h, w, ho, wo) = (shape.h, shape.w, shape.h / 2, shape.w / 2);
    assert_eq!(argmax.len(), shape.channels * ho * wo, "one image's max pool argmax");
    for c in 0..shape.channels {
        for oy in 0..ho {
            for ox in 0..wo {
                let o = (c * ho + oy) * wo + ox;
                let k = argmax[o] as usize;
                let (dy, dx) = (k / 2, k % 2);
                f(o, (c * h + 2 * oy + dy) * w + 2 * ox + dx);
            }
        }
    }
}

/// `y[e, b, c] = mean over H×W of x[e, b, c]`. Overwrites `y`.
pub fn global_avg_pool_forward<T: Real>(shape: PoolShape, x: &[T], y: &mut [T]) {
    assert_eq!(x.len(), shape.input_len(), "global pool input length");
    assert_eq!(y.len(), shape.global_pool_output_len(), "global pool output length");
    let plane = shape.h * shape.w;
    if y.is_empty() || plane == 0 {
        y.fill(T::ZERO);
        return;
    }
    let n = T::from_usize(plane);
    y.par_chunks_mut(shape.channels).enumerate().for_each(|(i, y_img)| {
        let x_img = &x[i * shape.channels * plane..(i + 1) * shape.channels * plane];
        for (c, out) in y_img.iter_mut().enumerate() {
            let mut sum = LaneSums::new();
            sum.add_map(&x_img[c * plane..(c + 1) * plane], |v| v);
            *out = sum.total() / n;
        }
    });
}

/// `dx[e, b, c, :, :] = dy[e, b, c] / (H·W)`. Overwrites `grad_input`.
pub fn global_avg_pool_backward<T: Real>(shape: PoolShape, grad_output: &[T], grad_input: &mut [T]) {
    global_avg_pool_backward_impl(shape, grad_output, grad_input, false);
}

/// As [`global_avg_pool_backward`] but adds into `grad_input` (the input also feeds another path, e.g.
/// the squeeze-excite seed multiplies `x` by a gate computed from `GAP(x)`).
pub fn global_avg_pool_backward_accumulate<T: Real>(
    shape: PoolShape,
    grad_output: &[T],
    grad_input: &mut [T],
) {
    global_avg_pool_backward_impl(shape, grad_output, grad_input, true);
}

fn global_avg_pool_backward_impl<T: Real>(
    shape: PoolShape,
    grad_output: &[T],
    grad_input: &mut [T],
    accumulate: bool,
) {
    assert_eq!(grad_input.len(), shape.input_len(), "global pool input gradient length");
    assert_eq!(grad_output.len(), shape.global_pool_output_len(), "global pool output gradient length");
    let plane = shape.h * shape.w;
    if grad_input.is_empty() {
        return;
    }
    let n = T::from_usize(plane);
    grad_input.par_chunks_mut(plane).zip(grad_output.par_iter()).for_each(|(dx, &dy)| {
        let g = dy / n;
        for v in dx {
            if accumulate {
                *v += g;
            } else {
                *v = g;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::*;

    /// Distinct values spaced 0.01 apart in random order: no ties, and a 1e-6 probe never flips a max.
    fn tie_free(seed: u64, n: usize) -> Vec<f64> {
        let mut values: Vec<f64> = (0..n).map(|i| i as f64 * 0.01 - 1.0).collect();
        crate::rng::StreamKey::new(seed, 0, 0, crate::rng::Purpose::Test).stream(0).shuffle(&mut values);
        values
    }

    #[test]
    fn max_pool_gradient_matches_finite_differences() {
        for (h, w) in [(4, 6), (5, 5)] {
            let s = PoolShape { envs: 2, batch: 2, channels: 3, h, w };
            let x = tie_free(1, s.input_len());
            let r = signed(2, s.max_pool_output_len());
            let mut y = vec![0.0; s.max_pool_output_len()];
            let mut idx = vec![0u8; y.len()];
            max_pool2x2_forward(s, &x, &mut y, &mut idx);
            let mut dx = vec![f64::NAN; s.input_len()];
            max_pool2x2_backward(s, &r, &idx, &mut dx);
            let numeric = numeric_gradient(&x, |xp| {
                max_pool2x2_forward(s, xp, &mut y, &mut idx);
                project(&r, &y)
            });
            assert_gradient(&format!("max pool {h}x{w}"), &dx, &numeric);
        }
    }

    #[test]
    fn max_pool_tie_gives_whole_gradient_to_first_maximum() {
        // One 2×4 plane = two windows. Window 0: [1 3; 3 3] → the max 3 first appears at (0,1).
        // Window 1: [2 2; 2 2] → all tie, (0,0) wins.
        let s = PoolShape { envs: 1, batch: 1, channels: 1, h: 2, w: 4 };
        let x = [1.0, 3.0, 2.0, 2.0, 3.0, 3.0, 2.0, 2.0];
        let mut y = [0.0; 2];
        let mut idx = [0u8; 2];
        max_pool2x2_forward(s, &x, &mut y, &mut idx);
        assert_eq!(y, [3.0, 2.0]);
        assert_eq!(idx, [1, 0]);
        let mut dx = [f64::NAN; 8];
        max_pool2x2_backward(s, &[5.0, 7.0], &idx, &mut dx);
        assert_eq!(dx, [0.0, 5.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn global_avg_pool_gradient_matches_finite_differences() {
        let s = PoolShape { envs: 3, batch: 2, channels: 4, h: 3, w: 5 };
        let x = signed(3, s.input_len());
        let r = signed(4, s.global_pool_output_len());
        let mut dx = vec![f64::NAN; s.input_len()];
        global_avg_pool_backward(s, &r, &mut dx);
        let mut y = vec![0.0; s.global_pool_output_len()];
        let numeric = numeric_gradient(&x, |xp| {
            global_avg_pool_forward(s, xp, &mut y);
            project(&r, &y)
        });
        assert_gradient("global average pool", &dx, &numeric);
        let prior = signed(5, s.input_len());
        let mut acc = prior.clone();
        global_avg_pool_backward_accumulate(s, &r, &mut acc);
        for i in 0..acc.len() {
            assert_eq!(acc[i], prior[i] + dx[i]);
        }
        // The forward is the plain mean.
        global_avg_pool_forward(s, &x, &mut y);
        let direct: f64 = x[..15].iter().sum::<f64>() / 15.0;
        assert!((y[0] - direct).abs() < 1e-15);
    }
}

#[cfg(test)]
mod nan_tests {
    use super::*;

    /// The window rule written out one window at a time, with branches: the reference for the
    /// vectorised pool on rows of 8, 4 and 1 windows, with ties, zeros and NaNs.
    #[test]
    fn vectorised_pool_matches_the_scalar_rule() {
        let shape = PoolShape { envs: 2, batch: 2, channels: 3, h: 6, w: 27 };
        let mut s = crate::rng::StreamKey::new(5, 0, 0, crate::rng::Purpose::Test).stream(0);
        let x: Vec<f32> = (0..shape.input_len())
            .map(|_| match s.below(10) {
                0 => f32::NAN,
                1..=3 => 0.0,
                _ => (s.below(5) as f32) * 0.5,
            })
            .collect();
        let (mut y, mut idx) =
            (vec![0.0f32; shape.max_pool_output_len()], vec![9u8; shape.max_pool_output_len()]);
        max_pool2x2_forward(shape, &x, &mut y, &mut idx);
        let (ho, wo) = (shape.h / 2, shape.w / 2);
        for p in 0..shape.envs * shape.batch * shape.channels {
            for oy in 0..ho {
                for ox in 0..wo {
                    let at = |dy: usize, dx: usize| {
                        x[p * shape.h * shape.w + (2 * oy + dy) * shape.w + 2 * ox + dx]
                    };
                    let window = [at(0, 0), at(0, 1), at(1, 0), at(1, 1)];
                    let mut best = 0;
                    for k in 1..4 {
                        if !window[best].is_nan() && (window[k] > window[best] || window[k].is_nan()) {
                            best = k;
                        }
                    }
                    let o = (p * ho + oy) * wo + ox;
                    assert_eq!(idx[o] as usize, best, "window {o}");
                    assert_eq!(y[o].to_bits(), window[best].to_bits(), "window {o}");
                }
            }
        }
    }

    #[test]
    fn max_pool_propagates_nan_like_pytorch() {
        let shape = PoolShape { envs: 1, batch: 1, channels: 1, h: 2, w: 4 };
        // Window 1: a NaN after the maximum; window 2: a NaN first.
        let x = [1.0f32, 5.0, f32::NAN, 2.0, 3.0, f32::NAN, 9.0, 1.0];
        let (mut y, mut idx) = ([0.0f32; 2], [0u8; 2]);
        max_pool2x2_forward(shape, &x, &mut y, &mut idx);
        assert!(y[0].is_nan() && y[1].is_nan(), "{y:?}");
        assert_eq!(idx, [3, 0]);
    }
}
