//! Training data: the [`Dataset`] resource, where it comes from, and how it is cut into per-env batches.
//!
//! * [`Dataset`] holds a train and a test [`Split`] of images stored as f32, already normalised, flat
//!   `[N, C, H, W]`, with `u8` labels, plus the augmentation the train split gets.
//! * [`DataSource`] says where it comes from: the embedded, seeded [`synthetic`] task (the default; needs
//!   no files) or the CIFAR-10 binary files in a directory ([`cifar`]).
//! * [`Sharding`] is the reference's batch arithmetic; [`Batcher`] fills caller-owned `[E, B, C, H, W]`
//!   buffers from it, train batches shuffled and augmented, test batches in order with per-env counts.
//!
//! Every random draw (synthetic images, data order, augmentation) comes from a keyed counter stream
//! ([`crate::rng`]); the keys are documented in [`synthetic`] and [`shard`]. Results are bit-identical
//! whatever the number of threads.

pub mod augment;
pub mod cifar;
pub mod error;
pub mod shard;
pub mod synthetic;

use std::path::PathBuf;

pub use augment::{AugDraw, Augment};
pub use error::DataError;
pub use shard::{Batcher, PAD_LABEL, Sharding};
pub use synthetic::SyntheticSpec;

/// CIFAR-10 per-channel means (R, G, B) of raw [0, 1] pixels, as the reference normalises.
pub const CIFAR_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// CIFAR-10 per-channel standard deviations (R, G, B).
pub const CIFAR_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];

/// One split of a dataset: `labels.len()` images, `images` flat `[N, C, H, W]`, normalised.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    pub images: Vec<f32>,
    pub labels: Vec<u8>,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Image `index` (`image_len = C·H·W` values).
    pub fn image(&self, index: usize, image_len: usize) -> &[f32] {
        &self.images[index * image_len..(index + 1) * image_len]
    }
}

/// The data every env trains and validates on (a resource; one copy shared by all envs).
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// `"synthetic"` or `"cifar10"`; for logs and the trace header.
    pub name: String,
    pub train: Split,
    pub test: Split,
    pub num_classes: usize,
    pub channels: usize,
    pub height: usize,
    pub width: usize,
    /// What the train split gets each time a batch is drawn (test batches are never augmented).
    pub augment: Augment,
}

impl Dataset {
    /// Builds or loads the dataset `source` describes.
    pub fn load(source: &DataSource) -> Result<Self, DataError> {
        match source {
            DataSource::Synthetic(spec) => synthetic::generate(spec),
            DataSource::Cifar10 { dir } => cifar::load(dir),
        }
    }

    /// Values per image, `C·H·W`.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    pub fn n_train(&self) -> usize {
        self.train.len()
    }

    pub fn n_test(&self) -> usize {
        self.test.len()
    }
}

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// The embedded synthetic CIFAR-shaped task, generated from its seed (the run seed).
    Synthetic(SyntheticSpec),
    /// CIFAR-10 binary files (`data_batch_1.bin` … `data_batch_5.bin`, `test_batch.bin`) in `dir`
    /// (or in `dir/cifar-10-batches-bin`).
    Cifar10 { dir: PathBuf },
}

impl Default for DataSource {
    fn default() -> Self {
        Self::Synthetic(SyntheticSpec::default())
    }
}
