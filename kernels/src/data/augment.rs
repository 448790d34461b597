//! The reference's training augmentation: `RandomCrop(32, padding=4)` then `RandomHorizontalFlip(0.5)`.
//!
//! torchvision pads with zeros *before* `Normalize`, so a padded pixel is 0 in raw [0, 1] space and
//! `−mean/std` after normalisation. Our images are stored already normalised, so [`Augment::fill`] holds
//! that per-channel value and cropping/flipping act on normalised pixels (both commute with the
//! per-channel affine normalisation, so the result is identical).

use crate::rng::Stream;

/// Which augmentation the training split gets. Test images are never augmented.
#[derive(Clone, Debug, PartialEq)]
pub struct Augment {
    /// Zero-padding on every side before the random crop back to the original size; 0 = no crop.
    pub pad: usize,
    /// Random horizontal flip with probability 0.5.
    pub hflip: bool,
    /// Per-channel value of a padded pixel, in the stored (normalised) space.
    pub fill: Vec<f32>,
}

/// The random choices for one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AugDraw {
    /// Top row of the crop window in the padded image, in `0..=2·pad` (torchvision's `i`).
    pub top: usize,
    /// Left column of the crop window in the padded image, in `0..=2·pad` (torchvision's `j`).
    pub left: usize,
    /// Mirror the crop left–right.
    pub flip: bool,
}

impl AugDraw {
    /// The draw in one word, as the device's batch gather reads it: `top | left << 8 | flip << 16`
    /// (offsets are at most `2·pad`, and [`Augment::crop_flip`] pads 4).
    pub fn pack(self) -> u32 {
        assert!(
            self.top < 256 && self.left < 256,
            "crop offsets {} and {} do not fit a byte",
            self.top,
            self.left
        );
        self.top as u32 | (self.left as u32) << 8 | u32::from(self.flip) << 16
    }

    pub fn unpack(word: u32) -> Self {
        Self { top: (word & 0xff) as usize, left: (word >> 8 & 0xff) as usize, flip: word >> 16 & 1 != 0 }
    }
}

/// Stream counters one image's draw uses. Every image consumes the same number whatever the settings,
/// so image `p` of an epoch always reads counters `DRAWS_PER_IMAGE·p ..`.
pub const DRAWS_PER_IMAGE: u64 = 3;

impl Augment {
    /// No augmentation.
    pub fn none(channels: usize) -> Self {
        Self { pad: 0, hflip: false, fill: vec![0.0; channels] }
    }

    /// The reference's CIFAR train transform for images normalised with `mean`/`std`.
    pub fn crop_flip(pad: usize, mean: &[f32], std: &[f32]) -> Self {
        let fill = mean.iter().zip(std).map(|(m, s)| -m / s).collect();
        Self { pad, hflip: true, fill }
    }

    /// True when applying it is a plain copy.
    pub fn is_identity(&self) -> bool {
        self.pad == 0 && !self.hflip
    }

    /// Draws one image's crop offsets (top, then left, as torchvision) and flip. Always reads exactly
    /// [`DRAWS_PER_IMAGE`] values from `stream`.
    pub fn draw(&self, stream: &mut Stream) -> AugDraw {
        let span = 2 * self.pad as u64 + 1;
        let top = stream.below(span) as usize;
        let left = stream.below(span) as usize;
        let flip = self.hflip && stream.next_f64() < 0.5;
        AugDraw { top, left, flip }
    }

    /// Writes the augmented `src` (`[C, H, W]`, normalised) into `dst` (same shape):
    /// `dst[c][y][x] = padded[c][y + top][x' + left]` with `x' = W−1−x` when flipped, where `padded` is
    /// `src` surrounded by `pad` pixels of `fill[c]`.
    pub fn apply(&self, draw: AugDraw, src: &[f32], dst: &mut [f32], height: usize, width: usize) {
        let plane = height * width;
        debug_assert_eq!(src.len(), dst.len());
        debug_assert_eq!(src.len(), plane * self.fill.len());
        let pad = self.pad as isize;
        let (h, w) = (height as isize, width as isize);
        for (c, (src_c, dst_c)) in src.chunks_exact(plane).zip(dst.chunks_exact_mut(plane)).enumerate() {
            let fill = self.fill[c];
            for (y, dst_row) in dst_c.chunks_exact_mut(width).enumerate() {
                let sy = y as isize + draw.top as isize - pad;
                if !(0..h).contains(&sy) {
                    dst_row.fill(fill);
                    continue;
                }
                let src_row = &src_c[sy as usize * width..(sy as usize + 1) * width];
                for (x, out) in dst_row.iter_mut().enumerate() {
                    let xc = if draw.flip { w - 1 - x as isize } else { x as isize };
                    let sx = xc + draw.left as isize - pad;
                    *out = if (0..w).contains(&sx) { src_row[sx as usize] } else { fill };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{CIFAR_MEAN, CIFAR_STD};
    use crate::rng::{Purpose, StreamKey};

    /// A 3×4×5 image whose value encodes its coordinates: 100·c + 10·y + x.
    fn coded_image() -> Vec<f32> {
        let mut v = Vec::new();
        for c in 0..3 {
            for y in 0..4 {
                for x in 0..5 {
                    v.push((100 * c + 10 * y + x) as f32);
                }
            }
        }
        v
    }

    fn at(img: &[f32], c: usize, y: usize, x: usize) -> f32 {
        img[(c * 4 + y) * 5 + x]
    }

    #[test]
    fn data_augment_crop_pads_with_normalised_zero() {
        let aug = Augment::crop_flip(2, &CIFAR_MEAN, &CIFAR_STD);
        let src = coded_image();
        let mut dst = vec![f32::NAN; src.len()];
        // Window at the padded image's top-left corner: image shifted down-right by 2.
        aug.apply(AugDraw { top: 0, left: 0, flip: false }, &src, &mut dst, 4, 5);
        for c in 0..3 {
            let fill = -CIFAR_MEAN[c] / CIFAR_STD[c];
            for y in 0..4 {
                for x in 0..5 {
                    let want = if y < 2 || x < 2 { fill } else { at(&src, c, y - 2, x - 2) };
                    assert_eq!(at(&dst, c, y, x), want, "c{c} y{y} x{x}");
                }
            }
        }
        // -mean/std for the red channel, by hand: -0.4914 / 0.2470.
        assert!((at(&dst, 0, 0, 0) + 1.989_473_7).abs() < 1e-5);
        // Window at the bottom-right corner (top = left = 2·pad): shifted up-left by 2.
        aug.apply(AugDraw { top: 4, left: 4, flip: false }, &src, &mut dst, 4, 5);
        assert_eq!(at(&dst, 1, 0, 0), at(&src, 1, 2, 2));
        assert_eq!(at(&dst, 1, 1, 2), at(&src, 1, 3, 4));
        assert_eq!(at(&dst, 1, 2, 0), -CIFAR_MEAN[1] / CIFAR_STD[1]);
        assert_eq!(at(&dst, 1, 0, 3), -CIFAR_MEAN[1] / CIFAR_STD[1]);
    }

    #[test]
    fn data_augment_centre_crop_is_identity_and_flip_mirrors_exactly() {
        let aug = Augment::crop_flip(4, &CIFAR_MEAN, &CIFAR_STD);
        let src = coded_image();
        let mut dst = vec![f32::NAN; src.len()];
        aug.apply(AugDraw { top: 4, left: 4, flip: false }, &src, &mut dst, 4, 5);
        assert_eq!(dst, src);
        aug.apply(AugDraw { top: 4, left: 4, flip: true }, &src, &mut dst, 4, 5);
        for c in 0..3 {
            for y in 0..4 {
                for x in 0..5 {
                    assert_eq!(at(&dst, c, y, x), at(&src, c, y, 4 - x));
                }
            }
        }
        // Crop then flip: the shift is applied in the unflipped frame, as torchvision does.
        aug.apply(AugDraw { top: 4, left: 5, flip: true }, &src, &mut dst, 4, 5);
        // Unflipped crop would be the image shifted left by 1; flipped, column x shows source 5-x.
        assert_eq!(at(&dst, 2, 3, 0), -CIFAR_MEAN[2] / CIFAR_STD[2]);
        for x in 1..5 {
            assert_eq!(at(&dst, 2, 3, x), at(&src, 2, 3, 5 - x));
        }
    }

    #[test]
    fn data_augment_draws_cover_the_range_and_flip_half_the_time() {
        let aug = Augment::crop_flip(4, &CIFAR_MEAN, &CIFAR_STD);
        let key = StreamKey::new(1, 0, 0, Purpose::Augmentation);
        let mut seen = [[0u32; 9]; 2];
        let mut flips = 0;
        let n = 9000;
        for p in 0..n {
            let d = aug.draw(&mut key.stream(DRAWS_PER_IMAGE * p));
            seen[0][d.top] += 1;
            seen[1][d.left] += 1;
            flips += d.flip as u32;
        }
        for counts in seen {
            assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
        }
        assert!((4300..4700).contains(&flips), "{flips}");
        // No flip and always the centre when augmentation is off.
        let none = Augment::none(3);
        assert!(none.is_identity());
        let d = none.draw(&mut key.stream(0));
        assert_eq!(d, AugDraw { top: 0, left: 0, flip: false });
    }
}
