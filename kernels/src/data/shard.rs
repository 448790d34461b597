//! Per-env sharding, as the reference does it (kasmina §6.5, simic §1.1 "Data sharding").
//!
//! One loader yields combined batches of `batch_per_env × n_envs` samples, and each combined batch is
//! split into `n_envs` contiguous chunks, chunk `e` → env `e`:
//!
//! * **Train**: shuffled every epoch, last incomplete combined batch dropped, so
//!   `num_train_batches = ⌊n_train / (batch_per_env·n_envs)⌋` and every env gets exactly `batch_per_env`
//!   samples per batch (a different random `1/n_envs` of the set each epoch). Which samples an env sees
//!   depends on the env count by design, as in the reference.
//! * **Test**: in file order, not shuffled, last batch kept, so
//!   `num_test_batches = ⌈n_test / (batch_per_env·n_envs)⌉`. Each batch of length `L` is split like
//!   `torch.tensor_split(batch, n_envs)`: the first `L mod n_envs` chunks get `⌊L/n_envs⌋ + 1` samples,
//!   the others `⌊L/n_envs⌋`, as the reference's iterators split every batch (`utils/data.py`:
//!   "tensor_split preserves env count on partial batches"). Each env therefore validates on its own
//!   fixed, disjoint slice of the test set, and the slices cover it.
//!
//! Randomness (DESIGN §7), all pure functions of their key and counter:
//! * data order of an epoch: `StreamKey { seed, round, env: epoch, purpose: DataOrder }` from counter 0,
//!   a Fisher–Yates shuffle of `0..n_train` ([`Stream::shuffle`](crate::rng::Stream::shuffle)); the
//!   `env` field carries the epoch because one order is shared by all envs.
//! * augmentation of the sample at position `p` of the epoch's order (`p = batch·B·E + env·B + i`):
//!   `StreamKey { seed, round, env: epoch, purpose: Augmentation }` at counters `3p, 3p+1, 3p+2`; so
//!   results never depend on the thread count.

use std::ops::Range;

use rayon::prelude::*;

use super::augment::DRAWS_PER_IMAGE;
use super::{DataError, Dataset};
use crate::rng::{Purpose, StreamKey};

/// How `n_train` / `n_test` samples are cut into per-env batches. Plain arithmetic, no data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharding {
    pub n_train: usize,
    pub n_test: usize,
    pub n_envs: usize,
    pub batch_per_env: usize,
}

impl Sharding {
    /// Errors when the data cannot feed the requested envs: an empty batch, a combined batch larger than
    /// the training set (zero batches per epoch), or fewer test images than envs.
    pub fn new(
        n_train: usize,
        n_test: usize,
        n_envs: usize,
        batch_per_env: usize,
    ) -> Result<Self, DataError> {
        if n_envs == 0 || batch_per_env == 0 {
            return Err(DataError::EmptyBatch { n_envs, batch_per_env });
        }
        match batch_per_env.checked_mul(n_envs) {
            Some(combined) if combined <= n_train => {}
            _ => {
                return Err(DataError::CannotFeedEnvs { batch_per_env, n_envs, n_train });
            }
        }
        if n_test < n_envs {
            return Err(DataError::TooFewTestImages { n_envs, n_test });
        }
        Ok(Self { n_train, n_test, n_envs, batch_per_env })
    }

    /// Samples per combined batch, `batch_per_env · n_envs`.
    pub fn combined_batch(&self) -> usize {
        self.batch_per_env * self.n_envs
    }

    /// Training batches per epoch (the incomplete last one is dropped).
    pub fn num_train_batches(&self) -> usize {
        self.n_train / self.combined_batch()
    }

    /// Test batches per validation pass (the last one may be short).
    pub fn num_test_batches(&self) -> usize {
        self.n_test.div_ceil(self.combined_batch())
    }

    /// Positions in the epoch's order that env `env` trains on in batch `batch`.
    pub fn train_chunk(&self, batch: usize, env: usize) -> Range<usize> {
        assert!(
            batch < self.num_train_batches() && env < self.n_envs,
            "train batch {batch} env {env} out of range"
        );
        let start = batch * self.combined_batch() + env * self.batch_per_env;
        start..start + self.batch_per_env
    }

    /// Test-set indices that env `env` validates on in batch `batch` (at most `batch_per_env` of them).
    pub fn test_chunk(&self, batch: usize, env: usize) -> Range<usize> {
        assert!(
            batch < self.num_test_batches() && env < self.n_envs,
            "test batch {batch} env {env} out of range"
        );
        let first = batch * self.combined_batch();
        let len = self.combined_batch().min(self.n_test - first);
        let (q, r) = (len / self.n_envs, len % self.n_envs);
        let start = first + env * q + env.min(r);
        start..start + q + usize::from(env < r)
    }

    /// How many test images env `env` validates on over a whole pass (the denominator of its accuracy).
    pub fn env_test_len(&self, env: usize) -> usize {
        (0..self.num_test_batches()).map(|b| self.test_chunk(b, env).len()).sum()
    }
}

/// The label of a padding row in a short test batch: never a class (datasets have at most 255).
pub const PAD_LABEL: u8 = u8::MAX;

/// Fills per-env batch buffers from a [`Dataset`]. Holds the current epoch's order, computed once per
/// epoch into a reused buffer; filling a batch allocates nothing.
///
/// Buffers are env-major: images `[n_envs, batch_per_env, C, H, W]`, labels `[n_envs, batch_per_env]`.
#[derive(Clone, Debug)]
pub struct Batcher {
    sharding: Sharding,
    seed: u64,
    round: u64,
    epoch: u64,
    order: Vec<u32>,
}

impl Batcher {
    /// A batcher for `dataset` split over `n_envs` envs of `batch_per_env` samples, positioned at round 0,
    /// epoch 0 (call [`Batcher::begin_epoch`] to move).
    pub fn new(dataset: &Dataset, seed: u64, n_envs: usize, batch_per_env: usize) -> Result<Self, DataError> {
        let sharding = Sharding::new(dataset.n_train(), dataset.n_test(), n_envs, batch_per_env)?;
        assert!(dataset.n_train() <= u32::MAX as usize, "training set too large for u32 indices");
        assert!(dataset.num_classes <= PAD_LABEL as usize, "PAD_LABEL must not be a class");
        let mut batcher =
            Self { sharding, seed, round: 0, epoch: 0, order: Vec::with_capacity(dataset.n_train()) };
        batcher.shuffle();
        Ok(batcher)
    }

    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The (round, epoch) whose order is current.
    pub fn epoch(&self) -> (u64, u64) {
        (self.round, self.epoch)
    }

    /// Makes `(round, epoch)` current: its training order is a pure function of (seed, round, epoch).
    pub fn begin_epoch(&mut self, round: u64, epoch: u64) {
        if (round, epoch) != (self.round, self.epoch) {
            self.round = round;
            self.epoch = epoch;
            self.shuffle();
        }
    }

    /// The current epoch's order: `order[p]` is the training index at position `p`.
    pub fn order(&self) -> &[u32] {
        &self.order
    }

    fn shuffle(&mut self) {
        self.order.clear();
        self.order.extend(0..self.sharding.n_train as u32);
        StreamKey::new(self.seed, self.round, self.epoch, Purpose::DataOrder)
            .stream(0)
            .shuffle(&mut self.order);
    }

    /// Writes training batch `batch` of the current epoch, augmented with the dataset's train
    /// augmentation, into `images` (`[E, B, C, H, W]`) and `labels` (`[E, B]`).
    pub fn fill_train<L: From<u8> + Send>(
        &self,
        data: &Dataset,
        batch: usize,
        images: &mut [f32],
        labels: &mut [L],
    ) {
        let s = &self.sharding;
        assert!(batch < s.num_train_batches(), "train batch {batch} of {}", s.num_train_batches());
        self.check_buffers(data, images, labels);
        let image_len = data.image_len();
        let first = batch * s.combined_batch();
        let aug = &data.augment;
        let key = StreamKey::new(self.seed, self.round, self.epoch, Purpose::Augmentation);
        images.par_chunks_mut(image_len).zip(labels.par_iter_mut()).enumerate().for_each(
            |(slot, (dst, label))| {
                // Chunk e of the combined batch is env e's, so slot (e, i) is position first + e·B + i.
                let position = first + slot;
                let index = self.order[position] as usize;
                let src = data.train.image(index, image_len);
                *label = L::from(data.train.labels[index]);
                if aug.is_identity() {
                    dst.copy_from_slice(src);
                } else {
                    let draw = aug.draw(&mut key.stream(DRAWS_PER_IMAGE * position as u64));
                    aug.apply(draw, src, dst, data.height, data.width);
                }
            },
        );
    }

    /// Training batch `batch` as the device gathers it: for slot `t = e·B + i`, the training image
    /// `index[t]` and its augmentation draw `draw[t]` ([`AugDraw::pack`](super::AugDraw::pack); 0 when
    /// the dataset's augmentation is the identity). Applying `draw[t]` to image `index[t]` is slot
    /// `t` of [`Self::fill_train`].
    pub fn train_gather(&self, data: &Dataset, batch: usize, index: &mut [u32], draw: &mut [u32]) {
        let s = &self.sharding;
        assert!(batch < s.num_train_batches(), "train batch {batch} of {}", s.num_train_batches());
        assert!(index.len() == s.combined_batch() && draw.len() == s.combined_batch(), "one entry per slot");
        let first = batch * s.combined_batch();
        let aug = &data.augment;
        let key = StreamKey::new(self.seed, self.round, self.epoch, Purpose::Augmentation);
        for (slot, (index, draw)) in index.iter_mut().zip(draw.iter_mut()).enumerate() {
            let position = first + slot;
            *index = self.order[position];
            *draw = match aug.is_identity() {
                true => 0,
                false => aug.draw(&mut key.stream(DRAWS_PER_IMAGE * position as u64)).pack(),
            };
        }
    }

    /// Writes test batch `batch` into `images` / `labels` and each env's number of valid samples into
    /// `counts` (`[E]`). Env `e`'s samples are rows `0..counts[e]` of its block. The remaining rows (only
    /// in the last batch, and only when a chunk is shorter than `batch_per_env`) are padding: zero images
    /// labelled [`PAD_LABEL`], which is never a class, so an arg-max count never counts them; a loss must
    /// skip them (rows `≥ counts[e]`). An env's accuracy over a pass is its correct count over
    /// [`Sharding::env_test_len`].
    pub fn fill_test<L: From<u8> + Send>(
        &self,
        data: &Dataset,
        batch: usize,
        images: &mut [f32],
        labels: &mut [L],
        counts: &mut [usize],
    ) {
        let s = &self.sharding;
        assert!(batch < s.num_test_batches(), "test batch {batch} of {}", s.num_test_batches());
        assert_eq!(counts.len(), s.n_envs, "counts must be [n_envs]");
        self.check_buffers(data, images, labels);
        for (env, count) in counts.iter_mut().enumerate() {
            *count = s.test_chunk(batch, env).len();
        }
        let image_len = data.image_len();
        images.par_chunks_mut(image_len).zip(labels.par_iter_mut()).enumerate().for_each(
            |(slot, (dst, label))| {
                let (env, row) = (slot / s.batch_per_env, slot % s.batch_per_env);
                let chunk = s.test_chunk(batch, env);
                if row < chunk.len() {
                    let index = chunk.start + row;
                    dst.copy_from_slice(data.test.image(index, image_len));
                    *label = L::from(data.test.labels[index]);
                } else {
                    dst.fill(0.0);
                    *label = L::from(PAD_LABEL);
                }
            },
        );
    }

    fn check_buffers<L>(&self, data: &Dataset, images: &[f32], labels: &[L]) {
        let s = &self.sharding;
        assert_eq!(
            (data.n_train(), data.n_test()),
            (s.n_train, s.n_test),
            "batcher was built for another dataset"
        );
        let slots = s.combined_batch();
        assert_eq!(images.len(), slots * data.image_len(), "images must be [n_envs, batch_per_env, C, H, W]");
        assert_eq!(labels.len(), slots, "labels must be [n_envs, batch_per_env]");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{AugDraw, Augment, Split};

    #[test]
    fn data_shard_reference_counts() {
        let s = Sharding::new(50_000, 10_000, 4, 512).unwrap();
        assert_eq!(s.combined_batch(), 2048);
        assert_eq!(s.num_train_batches(), 24);
        assert_eq!(s.num_test_batches(), 5);
        for env in 0..4 {
            assert_eq!(s.test_chunk(4, env).len(), 452);
            assert_eq!(s.test_chunk(0, env), env * 512..(env + 1) * 512);
            assert_eq!(s.env_test_len(env), 2500);
        }
        assert_eq!(s.test_chunk(4, 0), 8192..8644);
        assert_eq!(s.test_chunk(4, 3), 9548..10_000);
        // Every env trains on 24 × 512 = 12,288 images per epoch.
        assert_eq!((0..24).map(|b| s.train_chunk(b, 2).len()).sum::<usize>(), 12_288);
    }

    #[test]
    fn data_shard_test_slices_are_disjoint_fixed_and_cover_the_set() {
        // Uneven on purpose: 1,003 test images over 3 envs × 100 → batches of 300, 300, 300, 103.
        let s = Sharding::new(5_000, 1_003, 3, 100).unwrap();
        assert_eq!(s.num_test_batches(), 4);
        let mut owner = vec![usize::MAX; 1_003];
        for b in 0..s.num_test_batches() {
            let mut next = b * 300;
            for env in 0..3 {
                let chunk = s.test_chunk(b, env);
                assert_eq!(chunk.start, next, "chunks are contiguous and in env order");
                assert!(chunk.len() <= 100);
                next = chunk.end;
                for i in chunk {
                    assert_eq!(owner[i], usize::MAX, "image {i} given twice");
                    owner[i] = env;
                }
            }
        }
        assert!(owner.iter().all(|&e| e < 3), "every test image belongs to an env");
        // tensor_split of 103 into 3: 35, 34, 34.
        let last: Vec<usize> = (0..3).map(|e| s.test_chunk(3, e).len()).collect();
        assert_eq!(last, vec![35, 34, 34]);
        assert_eq!((0..3).map(|e| s.env_test_len(e)).sum::<usize>(), 1_003);
    }

    #[test]
    fn data_shard_refuses_data_that_cannot_feed_the_envs() {
        let err = Sharding::new(50_000, 10_000, 128, 512).unwrap_err();
        assert!(matches!(err, DataError::CannotFeedEnvs { .. }));
        assert_eq!(
            err.to_string(),
            "batch_per_env 512 × 128 envs = 65536 exceeds the 50000 training images: no full batch per epoch"
        );
        // Exactly one full batch is fine.
        assert_eq!(Sharding::new(4_096, 8, 8, 512).unwrap().num_train_batches(), 1);
        assert!(matches!(Sharding::new(100, 10, 0, 5), Err(DataError::EmptyBatch { .. })));
        assert!(matches!(Sharding::new(100, 10, 2, 0), Err(DataError::EmptyBatch { .. })));
        assert!(matches!(Sharding::new(100, 3, 4, 5), Err(DataError::TooFewTestImages { .. })));
        assert!(matches!(Sharding::new(10, 10, usize::MAX, 2), Err(DataError::CannotFeedEnvs { .. })));
    }

    /// A dataset of 1×2×2 images whose every pixel is the image's index; label = index mod 10.
    fn indexed_dataset(n_train: usize, n_test: usize) -> Dataset {
        let split = |n: usize, offset: f32| Split {
            images: (0..n).flat_map(|i| [i as f32 + offset; 4]).collect(),
            labels: (0..n).map(|i| (i % 10) as u8).collect(),
        };
        Dataset {
            name: "indexed".into(),
            train: split(n_train, 0.0),
            test: split(n_test, 0.5),
            num_classes: 10,
            channels: 1,
            height: 2,
            width: 2,
            augment: Augment::none(1),
        }
    }

    #[test]
    fn data_shard_order_is_deterministic_per_epoch_and_a_permutation() {
        let data = indexed_dataset(1_000, 10);
        let mut a = Batcher::new(&data, 42, 2, 100).unwrap();
        let mut b = Batcher::new(&data, 42, 2, 100).unwrap();
        assert_eq!(a.order(), b.order());
        let epoch0 = a.order().to_vec();
        a.begin_epoch(0, 1);
        assert_ne!(a.order(), &epoch0[..], "a new epoch reshuffles");
        let mut sorted = a.order().to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1_000).collect::<Vec<u32>>());
        // The order depends only on (seed, round, epoch), not on the epochs visited before.
        b.begin_epoch(3, 7);
        b.begin_epoch(0, 1);
        assert_eq!(a.order(), b.order());
        a.begin_epoch(1, 1);
        assert_ne!(a.order(), b.order(), "a new round reshuffles");
        let c = Batcher::new(&data, 43, 2, 100).unwrap();
        assert_ne!(c.order(), &epoch0[..], "a new seed reshuffles");
    }

    #[test]
    fn data_shard_train_batches_follow_the_order_in_env_chunks() {
        let data = indexed_dataset(1_050, 10);
        let mut batcher = Batcher::new(&data, 9, 3, 50).unwrap();
        batcher.begin_epoch(2, 5);
        assert_eq!(batcher.sharding().num_train_batches(), 7);
        let mut images = vec![0.0; 150 * 4];
        let mut labels = vec![0u32; 150];
        let mut seen = vec![0u32; 1_050];
        for batch in 0..7 {
            batcher.fill_train(&data, batch, &mut images, &mut labels);
            for env in 0..3 {
                for (row, p) in batcher.sharding().train_chunk(batch, env).enumerate() {
                    let index = batcher.order()[p];
                    let slot = env * 50 + row;
                    assert_eq!(images[slot * 4..slot * 4 + 4], [index as f32; 4]);
                    assert_eq!(labels[slot], index % 10);
                    seen[index as usize] += 1;
                }
            }
        }
        // 7 × 150 = 1,050: every image exactly once per epoch.
        assert!(seen.iter().all(|&n| n == 1));
    }

    /// What the device gathers from `train_gather`'s plan — image `index[t]` with draw `draw[t]` — is
    /// slot `t` of `fill_train`, with the reference's crop-and-flip augmentation on 3×8×8 images whose
    /// pixels all differ (a wrong counter, image or unpacked offset changes pixels).
    #[test]
    fn data_shard_train_gather_plan_rebuilds_fill_train() {
        let (n_train, image_len) = (240usize, 3 * 8 * 8);
        let data = Dataset {
            name: "coded".into(),
            train: Split {
                images: (0..n_train * image_len).map(|i| i as f32).collect(),
                labels: (0..n_train).map(|i| (i % 7) as u8).collect(),
            },
            test: Split { images: vec![0.0; 4 * image_len], labels: vec![0; 4] },
            num_classes: 7,
            channels: 3,
            height: 8,
            width: 8,
            augment: Augment::crop_flip(4, &[0.5, 0.4, 0.3], &[0.25, 0.2, 0.1]),
        };
        let mut batcher = Batcher::new(&data, 5, 3, 20).unwrap();
        batcher.begin_epoch(1, 2);
        let slots = 60;
        let (mut images, mut labels) = (vec![0.0f32; slots * image_len], vec![0u8; slots]);
        let (mut index, mut draw) = (vec![0u32; slots], vec![0u32; slots]);
        let (mut flips, mut shifted) = (0, 0);
        for batch in [0, 3] {
            batcher.fill_train(&data, batch, &mut images, &mut labels);
            batcher.train_gather(&data, batch, &mut index, &mut draw);
            for t in 0..slots {
                let d = AugDraw::unpack(draw[t]);
                flips += usize::from(d.flip);
                shifted += usize::from(d.top != 4 || d.left != 4);
                let mut rebuilt = vec![0.0f32; image_len];
                data.augment.apply(d, data.train.image(index[t] as usize, image_len), &mut rebuilt, 8, 8);
                assert_eq!(rebuilt, images[t * image_len..(t + 1) * image_len], "slot {t} of batch {batch}");
                assert_eq!(data.train.labels[index[t] as usize], labels[t]);
            }
        }
        // The draws vary: some flip, most crop off-centre.
        assert!(flips > 20 && flips < 100 && shifted > 90, "{flips} flips, {shifted} shifted of 120");
        for d in [AugDraw { top: 0, left: 8, flip: true }, AugDraw { top: 255, left: 3, flip: false }] {
            assert_eq!(AugDraw::unpack(d.pack()), d);
        }
        // Without augmentation every draw is 0 (the kernel's plain copy).
        let plain = indexed_dataset(100, 10);
        let batcher = Batcher::new(&plain, 5, 2, 10).unwrap();
        let (mut index, mut draw) = (vec![0u32; 20], vec![7u32; 20]);
        batcher.train_gather(&plain, 1, &mut index, &mut draw);
        assert_eq!(draw, vec![0; 20]);
        assert_eq!(index[..], batcher.order()[20..40]);
    }

    #[test]
    fn data_shard_test_batches_pad_and_count() {
        let data = indexed_dataset(100, 23);
        let batcher = Batcher::new(&data, 1, 2, 5).unwrap();
        assert_eq!(batcher.sharding().num_test_batches(), 3);
        let mut images = vec![f32::NAN; 10 * 4];
        let mut labels = vec![99u8; 10];
        let mut counts = vec![0; 2];
        batcher.fill_test(&data, 2, &mut images, &mut labels, &mut counts);
        // Last batch: images 20, 21, 22 → env 0 gets 20, 21; env 1 gets 22.
        assert_eq!(counts, vec![2, 1]);
        let firsts: Vec<f32> = images.chunks(4).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![20.5, 21.5, 0.0, 0.0, 0.0, 22.5, 0.0, 0.0, 0.0, 0.0]);
        const P: u8 = PAD_LABEL;
        assert_eq!(labels, vec![0, 1, P, P, P, 2, P, P, P, P]);
        // Test batches do not depend on the epoch.
        let mut again = batcher.clone();
        again.begin_epoch(4, 4);
        let mut images2 = vec![0.0; 10 * 4];
        again.fill_test(&data, 2, &mut images2, &mut labels, &mut counts);
        assert_eq!(images, images2);
    }
}
