//! Pieces every seed module shares: reusable buffers and the per-channel scaling of
//! squeeze-excite (an op the generic `ops` do not have).

use rayon::prelude::*;

use crate::ops::Real;
use crate::ops::blend::blend_add;
use crate::ops::real::dot;

/// The first `len` elements of `buffer`, growing it (with zeros) only when it is too short: after the
/// first call of a given size this never allocates, and it never shrinks.
pub(crate) fn grown<T: Real>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::ZERO);
    }
    &mut buffer[..len]
}

/// Activation buffers a seed module keeps between its forward and its backward, plus backward
/// temporaries. Which buffer holds what is decided by each module (documented there).
#[derive(Debug, Default)]
pub(crate) struct Buffers<T> {
    /// Activations the backward reads, written by the forward.
    pub saved: [Vec<T>; 4],
    /// Group-norm statistics (`mean`, `inv_std` of up to two norms), written by the forward.
    pub stats: [Vec<T>; 4],
    /// Backward temporaries.
    pub temp: [Vec<T>; 3],
}

impl<T> Buffers<T> {
    pub fn capacity(&self) -> usize {
        self.saved.iter().chain(&self.stats).chain(&self.temp).map(Vec::capacity).sum()
    }
}

/// `y[p, :] = x[p, :] · scale[p]` for every plane `p` of `plane` elements (`scale` has one value per
/// plane, i.e. `[E, B, C]` for an activation `[E, B, C, H, W]`). Overwrites `y`.
pub(crate) fn scale_planes<T: Real>(plane: usize, x: &[T], scale: &[T], y: &mut [T]) {
    assert_eq!(x.len(), scale.len() * plane, "plane scaling input length");
    assert_eq!(y.len(), x.len(), "plane scaling output length");
    if plane == 0 {
        return;
    }
    y.par_chunks_mut(plane).zip(x.par_chunks(plane)).zip(scale.par_iter()).for_each(|((y, x), &s)| {
        for (out, &v) in y.iter_mut().zip(x) {
            *out = v * s;
        }
    });
}

/// `grad_scale[p] = Σ grad_y[p, :] · x[p, :]`: the gradient of [`scale_planes`] with respect to the scale,
/// one fixed-order dot product per plane. Overwrites `grad_scale`.
pub(crate) fn scale_planes_backward_scale<T: Real>(
    plane: usize,
    x: &[T],
    grad_y: &[T],
    grad_scale: &mut [T],
) {
    assert_eq!(x.len(), grad_scale.len() * plane, "plane scaling input length");
    assert_eq!(grad_y.len(), x.len(), "plane scaling output gradient length");
    if plane == 0 {
        grad_scale.fill(T::ZERO);
        return;
    }
    grad_scale.par_iter_mut().zip(x.par_chunks(plane).zip(grad_y.par_chunks(plane))).for_each(
        |(g, (x, dy))| {
            *g = dot(dy, x);
        },
    );
}

/// `y = blend_add(x, y, alpha[e])` for every sample (of `sample` elements, `batch` per env `e`): the ADD
/// blend of a seed output held in `y` with its input `x`, `alpha` per env and already clamped.
pub(crate) fn blend_add_in_place<T: Real>(batch: usize, sample: usize, x: &[T], alpha: &[T], y: &mut [T]) {
    assert!(x.len() == y.len() && y.len() == alpha.len() * batch * sample, "blend lengths");
    if sample == 0 {
        return;
    }
    y.par_chunks_mut(sample).zip(x.par_chunks(sample)).enumerate().for_each(|(i, (y, x))| {
        let a = alpha[i / batch];
        for (y, &h) in y.iter_mut().zip(x) {
            *y = blend_add(h, *y, a);
        }
    });
}
