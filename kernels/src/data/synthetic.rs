//! The embedded default task `synthetic`: CIFAR-shaped (3×32×32, 10 classes), generated from a seed,
//! learnable, and built so that the cifar_baseline host is **short of capacity** on it: a class is the
//! union of [`SyntheticSpec::prototypes`] unrelated colour patterns (16 by default, 160 in all), and
//! carving 160 modes into 10 classes takes more than the host's 6.4 k parameters and 8 full-resolution
//! channels. The host learns the easiest modes quickly and then gains slowly; seeds (more depth at full
//! resolution, a deeper middle block, channel attention) let it separate more of them. No files needed.
//!
//! Each prototype is a smooth random colour template on a 38×38 grid (32 + 2·[`MAX_SHIFT`]): a base
//! colour, [`WAVES`] coloured plane waves (1.5–4.5 cycles per 32 px, random orientation and phase) and
//! [`BLOBS`] coloured Gaussian blobs. One image of class `y` is, in raw [0, 1] pixel space:
//!
//! ```text
//! mix      = (1 − g)·T_y,p[shift] + g·T_j,q[shift']      // a window of another class j ≠ y blended in
//! pixel[c] = clamp(offset[c] + gain[c]·(mix[c] − 0.5 + clutter[c]) + noise·n, 0, 1)
//! ```
//!
//! with a random prototype `p` of the class, a random shift of ±[`MAX_SHIFT`] px per template, a
//! Gaussian window `g` (σ 4–8 px, random centre, peak `distractor·U(0.5, 1)`), per-channel gain
//! `contrast·U(0.8, 1.2)` with `contrast ∈ [0.6, 1.4]`, offset `0.5 + U(±0.1) + U(±0.05)[c]`,
//! [`CLUTTER_WAVES`] random coloured plane waves drawn per image (the same family as the templates'
//! waves, so they cannot be told apart by their statistics, only by which combinations a class uses),
//! and per-pixel noise `n ≈ N(0, 1)`. Pixels are then normalised with the CIFAR means and stds, so the
//! images look to a host like CIFAR does, and the train split takes the same augmentation (random crop
//! with padding 4, flip).
//!
//! **Knobs:** [`SyntheticSpec::prototypes`] (modes per class: the capacity the task asks for),
//! [`SyntheticSpec::clutter`] (amplitude of the per-image waves relative to a template's waves),
//! [`SyntheticSpec::noise`] (per-pixel noise std in raw pixel units) and [`SyntheticSpec::distractor`]
//! (peak weight of the other class's window). The default is 16 prototypes with light clutter (0.2),
//! noise 0.1 and distractor 0.3: the difficulty is in the number of modes, not in the noise, so what a
//! bigger network buys is capacity. [`SyntheticSpec::cluttered`] is the first generator of this project
//! (4 prototypes under heavy clutter: 1.0, 0.2, 0.6), on which a static host keeps learning slowly for
//! the whole run and seeds made no measurable difference; it stays for the tests calibrated on it.
//!
//! Measured on the README configuration (cifar_baseline, 16 envs, 80 epochs of 512 images at batch 32,
//! 1,024 test images per env; mean final validation accuracy): see the README's `compare` table.
//!
//! Randomness: prototype `p` of class `k` from `StreamKey { seed, round: 0, env: k·P + p, purpose:
//! SyntheticData }` with `P` the prototype count, image `i` of the train (test) split from `StreamKey {
//! seed, round: 1 (2), env: i, purpose: SyntheticData }`, each read from counter 0. Every image is a pure
//! function of (spec, split, index): generation is parallel and bit-identical whatever the thread count,
//! and the test split does not depend on `n_train` (nor the train split on `n_test`).

use rayon::prelude::*;

use super::{Augment, CIFAR_MEAN, CIFAR_STD, DataError, Dataset, Split};
use crate::rng::{Purpose, Stream, StreamKey};

pub const NUM_CLASSES: usize = 10;
pub const CHANNELS: usize = 3;
pub const SIDE: usize = 32;
/// Largest shift of a template, in pixels, either way on both axes.
pub const MAX_SHIFT: usize = 3;
/// Side of the template grid the shifted 32×32 window is cut from.
pub const GRID: usize = SIDE + 2 * MAX_SHIFT;
/// Coloured plane waves per class template.
pub const WAVES: usize = 3;
/// Coloured Gaussian blobs per class template.
pub const BLOBS: usize = 2;
/// The most prototypes per class a spec may ask for.
pub const MAX_PROTOTYPES: usize = 64;
/// Random coloured plane waves laid over each image, unrelated to its class.
pub const CLUTTER_WAVES: usize = 3;

const PLANE: usize = SIDE * SIDE;
const IMAGE_LEN: usize = CHANNELS * PLANE;
const GRID_PLANE: usize = GRID * GRID;
const TEMPLATE_LEN: usize = CHANNELS * GRID_PLANE;

/// What to generate. `Default` is a small task that runs fast on 2 CPU cores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticSpec {
    pub n_train: usize,
    pub n_test: usize,
    /// Templates (prototypes) per class; an image shows one of its class's prototypes (1 to
    /// [`MAX_PROTOTYPES`]). The capacity knob: more modes per class need a bigger network.
    pub prototypes: usize,
    /// Per-pixel noise standard deviation in raw [0, 1] pixel units (difficulty knob).
    pub noise: f32,
    /// Peak weight, in [0, 1], of the other class's pattern blended into each image (difficulty knob).
    pub distractor: f32,
    /// Amplitude of the per-image random waves laid over every image, relative to a template's own
    /// waves (difficulty knob).
    pub clutter: f32,
    /// The run seed.
    pub seed: u64,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            n_train: 8192,
            n_test: 2048,
            prototypes: 16,
            noise: 0.1,
            distractor: 0.3,
            clutter: 0.2,
            seed: 0,
        }
    }
}

impl SyntheticSpec {
    /// The default task for `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self { seed, ..Self::default() }
    }

    /// The project's first synthetic task for `seed`: 4 prototypes per class under heavy clutter (1.0),
    /// noise 0.2 and distractor 0.6. Hard through noise rather than through the number of modes; the
    /// calibrated learning tests use it.
    pub fn cluttered(seed: u64) -> Self {
        Self { prototypes: 4, noise: 0.2, distractor: 0.6, clutter: 1.0, ..Self::with_seed(seed) }
    }

    fn validate(&self) -> Result<(), DataError> {
        let bad = |reason: String| Err(DataError::BadSpec { reason });
        if self.n_train == 0 || self.n_test == 0 {
            return bad(format!(
                "n_train {} and n_test {} must both be at least 1",
                self.n_train, self.n_test
            ));
        }
        if self.n_train > u32::MAX as usize || self.n_test > u32::MAX as usize {
            return bad("at most 2^32 − 1 images per split".to_string());
        }
        if !(1..=MAX_PROTOTYPES).contains(&self.prototypes) {
            return bad(format!("prototypes {} must be between 1 and {MAX_PROTOTYPES}", self.prototypes));
        }
        if !(self.noise.is_finite() && self.noise >= 0.0) {
            return bad(format!("noise {} must be a finite number ≥ 0", self.noise));
        }
        if !(self.clutter.is_finite() && self.clutter >= 0.0) {
            return bad(format!("clutter {} must be a finite number ≥ 0", self.clutter));
        }
        if !(0.0..=1.0).contains(&self.distractor) {
            return bad(format!("distractor {} must be in [0, 1]", self.distractor));
        }
        Ok(())
    }
}

/// Generates the dataset `spec` describes.
pub fn generate(spec: &SyntheticSpec) -> Result<Dataset, DataError> {
    spec.validate()?;
    let templates = class_templates(spec.seed, spec.prototypes);
    Ok(Dataset {
        name: "synthetic".to_string(),
        train: generate_split(spec, &templates, 1, spec.n_train),
        test: generate_split(spec, &templates, 2, spec.n_test),
        num_classes: NUM_CLASSES,
        channels: CHANNELS,
        height: SIDE,
        width: SIDE,
        augment: Augment::crop_flip(4, &CIFAR_MEAN, &CIFAR_STD),
    })
}

/// The class prototypes, raw [0, 1] pixel space, `[NUM_CLASSES, prototypes, CHANNELS, GRID, GRID]`.
pub fn class_templates(seed: u64, prototypes: usize) -> Vec<f32> {
    let mut templates = vec![0.0f32; NUM_CLASSES * prototypes * TEMPLATE_LEN];
    templates.par_chunks_mut(TEMPLATE_LEN).enumerate().for_each(|(id, t)| {
        let mut s = StreamKey::new(seed, 0, id as u64, Purpose::SyntheticData).stream(0);
        let base: [f64; CHANNELS] = std::array::from_fn(|_| s.uniform(0.4, 0.6));
        let waves: [Wave; WAVES] = std::array::from_fn(|_| Wave::draw(&mut s, 0.2));
        // Blobs: centre, 1/(2σ²), colour.
        let blobs: [([f64; 3], [f64; CHANNELS]); BLOBS] = std::array::from_fn(|_| {
            let cx = s.uniform(0.0, GRID as f64);
            let cy = s.uniform(0.0, GRID as f64);
            let sigma = s.uniform(3.0, 7.0);
            let colour = std::array::from_fn(|_| s.uniform(-0.25, 0.25));
            ([cx, cy, 0.5 / (sigma * sigma)], colour)
        });
        for gy in 0..GRID {
            for gx in 0..GRID {
                let (x, y) = (gx as f64, gy as f64);
                let mut v = base;
                for wave in &waves {
                    wave.add(x, y, &mut v);
                }
                for ([cx, cy, inv], colour) in &blobs {
                    let g = (-((x - cx).powi(2) + (y - cy).powi(2)) * inv).exp();
                    v.iter_mut().zip(colour).for_each(|(v, c)| *v += c * g);
                }
                for (c, v) in v.iter().enumerate() {
                    t[c * GRID_PLANE + gy * GRID + gx] = *v as f32;
                }
            }
        }
    });
    templates
}

/// A coloured plane wave: `colour[c] · sin(kx·x + ky·y + phase)`, 1.5–4.5 cycles per 32 px.
#[derive(Clone, Copy)]
struct Wave {
    kx: f64,
    ky: f64,
    phase: f64,
    colour: [f64; CHANNELS],
}

impl Wave {
    fn draw(s: &mut Stream, amplitude: f64) -> Self {
        let cycles = s.uniform(1.5, 4.5);
        let angle = s.uniform(0.0, std::f64::consts::PI);
        let k = std::f64::consts::TAU * cycles / SIDE as f64;
        let phase = s.uniform(0.0, std::f64::consts::TAU);
        let colour = std::array::from_fn(|_| s.uniform(-amplitude, amplitude));
        Self { kx: k * angle.cos(), ky: k * angle.sin(), phase, colour }
    }

    #[inline]
    fn add(&self, x: f64, y: f64, v: &mut [f64; CHANNELS]) {
        let w = (self.kx * x + self.ky * y + self.phase).sin();
        v.iter_mut().zip(&self.colour).for_each(|(v, c)| *v += c * w);
    }
}

fn generate_split(spec: &SyntheticSpec, templates: &[f32], round: u64, n: usize) -> Split {
    let mut split = Split { images: vec![0.0; n * IMAGE_LEN], labels: vec![0; n] };
    split.images.par_chunks_mut(IMAGE_LEN).zip(split.labels.par_iter_mut()).enumerate().for_each(
        |(index, (image, label))| {
            let stream = StreamKey::new(spec.seed, round, index as u64, Purpose::SyntheticData).stream(0);
            *label = render(spec, templates, stream, image);
        },
    );
    split
}

/// A standard-normal-like draw from one u64: the sum of four 16-bit uniforms (Irwin–Hall), centred and
/// scaled to unit variance. Cheaper than Box–Muller and plenty for image noise (tails cut at ±3.46).
#[inline]
fn approx_normal(bits: u64) -> f32 {
    let sum: u32 = (0..4).map(|k| ((bits >> (16 * k)) & 0xFFFF) as u32).sum();
    // Each term is (b + 0.5)/65536, mean 1/2, variance 1/12.
    let u = (sum as f32 + 2.0) / 65_536.0;
    (u - 2.0) * 3.0f32.sqrt()
}

/// Draws one image into `image` (normalised) and returns its label.
fn render(spec: &SyntheticSpec, templates: &[f32], mut s: Stream, image: &mut [f32]) -> u8 {
    let span = 2 * MAX_SHIFT as u64 + 1;
    let class = s.below(NUM_CLASSES as u64) as usize;
    let prototypes = spec.prototypes;
    let own = s.below(prototypes as u64) as usize + class * prototypes;
    let (ox, oy) = (s.below(span) as usize, s.below(span) as usize);
    let other_class = (class + 1 + s.below(NUM_CLASSES as u64 - 1) as usize) % NUM_CLASSES;
    let other = s.below(prototypes as u64) as usize + other_class * prototypes;
    let (ox2, oy2) = (s.below(span) as usize, s.below(span) as usize);
    let (cx, cy) = (s.uniform(0.0, SIDE as f64), s.uniform(0.0, SIDE as f64));
    let sigma = s.uniform(4.0, 8.0);
    let weight = spec.distractor as f64 * s.uniform(0.5, 1.0);
    let contrast = s.uniform(0.6, 1.4);
    let brightness = s.uniform(-0.1, 0.1);
    let gain: [f64; CHANNELS] = std::array::from_fn(|_| contrast * s.uniform(0.8, 1.2));
    let offset: [f64; CHANNELS] = std::array::from_fn(|_| 0.5 + brightness + s.uniform(-0.05, 0.05));
    let clutter: [Wave; CLUTTER_WAVES] =
        std::array::from_fn(|_| Wave::draw(&mut s, 0.2 * spec.clutter as f64));

    // Both the clutter waves and the distractor window are separable in x and y:
    // sin(kx·x + ky·y + φ) = sin(kx·x)·cos(ky·y + φ) + cos(kx·x)·sin(ky·y + φ), and
    // exp(−(dx² + dy²)/2σ²) = exp(−dx²/2σ²)·exp(−dy²/2σ²); tabulate the factors per axis.
    let mut wave_x = [[(0.0f64, 0.0f64); SIDE]; CLUTTER_WAVES];
    let mut wave_y = [[(0.0f64, 0.0f64); SIDE]; CLUTTER_WAVES];
    for (wave, (wx, wy)) in clutter.iter().zip(wave_x.iter_mut().zip(wave_y.iter_mut())) {
        for i in 0..SIDE {
            wx[i] = (wave.kx * i as f64).sin_cos();
            wy[i] = (wave.ky * i as f64 + wave.phase).sin_cos();
        }
    }
    let window = |centre: f64, i: usize| (-(i as f64 - centre).powi(2) / (2.0 * sigma * sigma)).exp();
    let window_x: [f64; SIDE] = std::array::from_fn(|x| window(cx, x));
    let window_y: [f64; SIDE] = std::array::from_fn(|y| weight * window(cy, y));

    let own = &templates[own * TEMPLATE_LEN..(own + 1) * TEMPLATE_LEN];
    let theirs = &templates[other * TEMPLATE_LEN..(other + 1) * TEMPLATE_LEN];
    for y in 0..SIDE {
        for x in 0..SIDE {
            let g = window_y[y] * window_x[x];
            let mut v = [0.0f64; CHANNELS];
            for (wave, (wx, wy)) in clutter.iter().zip(wave_x.iter().zip(&wave_y)) {
                let ((sx, cx), (sy, cy)) = (wx[x], wy[y]);
                let w = sx * cy + cx * sy;
                v.iter_mut().zip(&wave.colour).for_each(|(v, c)| *v += c * w);
            }
            for (c, v) in v.iter_mut().enumerate() {
                let mix = (1.0 - g) * own[c * GRID_PLANE + (y + oy) * GRID + x + ox] as f64
                    + g * theirs[c * GRID_PLANE + (y + oy2) * GRID + x + ox2] as f64;
                let raw = offset[c]
                    + gain[c] * (mix - 0.5 + *v)
                    + (spec.noise * approx_normal(s.next_u64())) as f64;
                image[c * PLANE + y * SIDE + x] = (raw.clamp(0.0, 1.0) as f32 - CIFAR_MEAN[c]) / CIFAR_STD[c];
            }
        }
    }
    class as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seed: u64) -> SyntheticSpec {
        SyntheticSpec { n_train: 2_000, n_test: 1_000, seed, ..SyntheticSpec::default() }
    }

    #[test]
    fn data_synthetic_is_deterministic_and_thread_count_free() {
        let spec = small(5);
        let a = generate(&spec).unwrap();
        let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let b = one_thread.install(|| generate(&spec).unwrap());
        assert!(a == b, "same seed, different thread count: different data");
        assert_eq!(a.train.images.len(), 2_000 * 3072);
        assert_eq!((a.channels, a.height, a.width, a.num_classes), (3, 32, 32, 10));
        let c = generate(&small(6)).unwrap();
        assert_ne!(a.train.images, c.train.images);
        // The test split does not depend on the size of the train split.
        let d = generate(&SyntheticSpec { n_train: 10, ..spec }).unwrap();
        assert_eq!(a.test, d.test);
        assert_eq!(a.train.images[..10 * 3072], d.train.images[..]);
    }

    #[test]
    fn data_synthetic_looks_like_normalised_cifar() {
        let data = generate(&small(1)).unwrap();
        let n = data.n_train() as f64;
        // Every class appears, none dominates.
        let mut counts = [0usize; NUM_CLASSES];
        data.train.labels.iter().for_each(|&l| counts[l as usize] += 1);
        assert!(counts.iter().all(|&c| (c as f64) > 0.07 * n && (c as f64) < 0.13 * n), "{counts:?}");
        // Per-channel statistics in the range CIFAR's normalised images have (mean ≈ 0, std ≈ 1).
        for c in 0..CHANNELS {
            let values = data.train.images.chunks(PLANE).skip(c).step_by(CHANNELS).flatten();
            let (sum, sq, count) = values.fold((0.0f64, 0.0f64, 0usize), |(s, q, k), &v| {
                (s + v as f64, q + (v as f64).powi(2), k + 1)
            });
            let mean = sum / count as f64;
            let std = (sq / count as f64 - mean * mean).sqrt();
            assert!(mean.abs() < 0.5 && (0.4..1.6).contains(&std), "channel {c}: mean {mean}, std {std}");
        }
        // Values are normalised [0, 1] pixels: each channel within [−mean/std, (1 − mean)/std].
        for (i, plane) in data.train.images.chunks(PLANE).enumerate() {
            let c = i % CHANNELS;
            let lo = -CIFAR_MEAN[c] / CIFAR_STD[c] - 1e-5;
            let hi = (1.0 - CIFAR_MEAN[c]) / CIFAR_STD[c] + 1e-5;
            assert!(plane.iter().all(|v| (lo..=hi).contains(v)), "plane {i}");
        }
    }

    /// Nearest-class-mean classifier: class means estimated on the train split, accuracy on the test
    /// split. Evidence that the task is learnable (well above the 10 % of chance) and not trivial.
    fn nearest_mean_accuracy(data: &Dataset) -> f64 {
        let len = data.image_len();
        let mut means = vec![0.0f64; NUM_CLASSES * len];
        let mut counts = [0usize; NUM_CLASSES];
        for (i, &label) in data.train.labels.iter().enumerate() {
            let mean = &mut means[label as usize * len..(label as usize + 1) * len];
            mean.iter_mut().zip(data.train.image(i, len)).for_each(|(m, &v)| *m += v as f64);
            counts[label as usize] += 1;
        }
        for (mean, &count) in means.chunks_mut(len).zip(&counts) {
            mean.iter_mut().for_each(|m| *m /= count.max(1) as f64);
        }
        let correct = (0..data.n_test())
            .into_par_iter()
            .filter(|&i| {
                let image = data.test.image(i, len);
                let distance = |k: usize| -> f64 {
                    means[k * len..(k + 1) * len]
                        .iter()
                        .zip(image)
                        .map(|(m, &v)| (m - v as f64).powi(2))
                        .sum()
                };
                let best = (0..NUM_CLASSES).min_by(|&a, &b| distance(a).total_cmp(&distance(b))).unwrap();
                best == data.test.labels[i] as usize
            })
            .count();
        correct as f64 / data.n_test() as f64
    }

    #[test]
    fn data_synthetic_is_learnable_but_not_trivial() {
        for seed in [0, 1] {
            let accuracy = nearest_mean_accuracy(&generate(&small(seed)).unwrap());
            eprintln!("seed {seed}: nearest-class-mean test accuracy {accuracy:.3}");
            assert!((0.25..0.90).contains(&accuracy), "seed {seed}: nearest-class-mean accuracy {accuracy}");
        }
        // The knobs work. Fewer modes per class: a class mean describes its class better.
        let accuracy = |spec: SyntheticSpec| nearest_mean_accuracy(&generate(&spec).unwrap());
        let default = accuracy(small(0));
        let one_mode = accuracy(SyntheticSpec { prototypes: 1, ..small(0) });
        let four_modes = accuracy(SyntheticSpec { prototypes: 4, ..small(0) });
        eprintln!("nearest-class-mean by prototypes: 1 {one_mode:.3}, 4 {four_modes:.3}, 16 {default:.3}");
        assert!(one_mode > four_modes && four_modes > default, "{one_mode}, {four_modes}, {default}");
        // Noise, distractor and clutter: noise-free data is easier, heavy noise harder.
        let easy = accuracy(SyntheticSpec { noise: 0.0, distractor: 0.0, clutter: 0.0, ..small(0) });
        let hard = accuracy(SyntheticSpec { noise: 0.4, distractor: 1.0, clutter: 2.0, ..small(0) });
        eprintln!("nearest-class-mean: easy {easy:.3}, default {default:.3}, hard {hard:.3}");
        assert!(easy > default && default > hard, "easy {easy}, default {default}, hard {hard}");
        // The first, cluttered task is the one its learning tests were calibrated on.
        let cluttered = SyntheticSpec::cluttered(0);
        assert_eq!(
            (cluttered.prototypes, cluttered.noise, cluttered.distractor, cluttered.clutter),
            (4, 0.2, 0.6, 1.0)
        );
    }

    #[test]
    fn data_synthetic_rejects_bad_specs() {
        for spec in [
            SyntheticSpec { n_train: 0, ..SyntheticSpec::default() },
            SyntheticSpec { n_test: 0, ..SyntheticSpec::default() },
            SyntheticSpec { noise: -0.1, ..SyntheticSpec::default() },
            SyntheticSpec { noise: f32::NAN, ..SyntheticSpec::default() },
            SyntheticSpec { distractor: 1.5, ..SyntheticSpec::default() },
            SyntheticSpec { prototypes: 0, ..SyntheticSpec::default() },
            SyntheticSpec { prototypes: MAX_PROTOTYPES + 1, ..SyntheticSpec::default() },
        ] {
            let err = generate(&spec).unwrap_err();
            assert!(matches!(err, DataError::BadSpec { .. }), "{spec:?}: {err:?}");
            assert!(err.to_string().starts_with("synthetic data: "));
        }
    }

    #[test]
    fn data_synthetic_noise_draw_is_centred_with_unit_variance() {
        let mut s = StreamKey::new(3, 0, 0, Purpose::Test).stream(0);
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|_| approx_normal(s.next_u64()) as f64).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.03, "mean {mean}, var {var}");
    }
}
