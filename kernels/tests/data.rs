//! The data pipeline end to end through the public API: files or seed → `Dataset` → `Batcher` →
//! per-env batch buffers.

use std::path::PathBuf;

use esper_kernels::data::augment::DRAWS_PER_IMAGE;
use esper_kernels::data::{Batcher, DataError, DataSource, Dataset, PAD_LABEL, SyntheticSpec, cifar};
use esper_kernels::rng::{Purpose, StreamKey};

/// Writes a tiny CIFAR-10 directory: `per_file` records per file, pixel (c, y, x) of record i in file f
/// = (31·f + 17·i + 5·c + 3·y + 7·x) mod 256, label (f + 3·i) mod 10.
fn tiny_cifar(tag: &str, per_file: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("esper-data-it-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let files = cifar::TRAIN_FILES.iter().chain(std::iter::once(&cifar::TEST_FILE));
    for (f, name) in files.enumerate() {
        let mut bytes = Vec::with_capacity(per_file * cifar::RECORD_BYTES);
        for i in 0..per_file {
            bytes.push(((f + 3 * i) % 10) as u8);
            for c in 0..3 {
                for y in 0..32 {
                    for x in 0..32 {
                        bytes.push(((31 * f + 17 * i + 5 * c + 3 * y + 7 * x) % 256) as u8);
                    }
                }
            }
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    dir
}

#[test]
fn data_cifar_train_batches_are_augmented_copies_keyed_by_position() {
    let dir = tiny_cifar("aug", 40);
    let data = Dataset::load(&DataSource::Cifar10 { dir: dir.clone() }).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((data.n_train(), data.n_test()), (200, 40));
    let (n_envs, batch_per_env, seed) = (2, 16, 11);
    let mut batcher = Batcher::new(&data, seed, n_envs, batch_per_env).unwrap();
    assert_eq!(batcher.sharding().num_train_batches(), 6);
    batcher.begin_epoch(3, 2);
    let len = data.image_len();
    let mut images = vec![0.0f32; n_envs * batch_per_env * len];
    let mut labels = vec![0i64; n_envs * batch_per_env];
    batcher.fill_train(&data, 4, &mut images, &mut labels);

    let key = StreamKey::new(seed, 3, 2, Purpose::Augmentation);
    let mut expected = vec![0.0f32; len];
    let (mut flipped, mut shifted) = (0, 0);
    for env in 0..n_envs {
        for (row, position) in batcher.sharding().train_chunk(4, env).enumerate() {
            let index = batcher.order()[position] as usize;
            let draw = data.augment.draw(&mut key.stream(DRAWS_PER_IMAGE * position as u64));
            data.augment.apply(draw, data.train.image(index, len), &mut expected, 32, 32);
            let slot = env * batch_per_env + row;
            assert_eq!(images[slot * len..(slot + 1) * len], expected[..], "env {env} row {row}");
            assert_eq!(labels[slot], i64::from(data.train.labels[index]));
            flipped += usize::from(draw.flip);
            shifted += usize::from((draw.top, draw.left) != (4, 4));
        }
    }
    // The reference's augmentation really is on for CIFAR train batches.
    assert!(flipped > 0 && shifted > 0, "flipped {flipped}, shifted {shifted} of 32");

    // Same batch, one thread: bit-identical.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let mut again = vec![0.0f32; images.len()];
    pool.install(|| batcher.fill_train(&data, 4, &mut again, &mut labels));
    assert!(again == images);
}

#[test]
fn data_cifar_test_batches_are_plain_and_fixed_per_env() {
    let dir = tiny_cifar("val", 30);
    let data = Dataset::load(&DataSource::Cifar10 { dir: dir.clone() }).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // 30 test images, 3 envs × 4: batches of 12, 12, 6 → the last gives each env 2.
    let mut batcher = Batcher::new(&data, 0, 3, 4).unwrap();
    assert_eq!(batcher.sharding().num_test_batches(), 3);
    let len = data.image_len();
    let mut images = vec![0.0f32; 12 * len];
    let mut labels = vec![0u8; 12];
    let mut counts = vec![0usize; 3];
    let mut per_env: Vec<Vec<u8>> = vec![Vec::new(); 3];
    for epoch in 0..2 {
        batcher.begin_epoch(0, epoch);
        let mut seen: Vec<Vec<u8>> = vec![Vec::new(); 3];
        for batch in 0..3 {
            batcher.fill_test(&data, batch, &mut images, &mut labels, &mut counts);
            assert_eq!(counts, if batch < 2 { vec![4, 4, 4] } else { vec![2, 2, 2] });
            for env in 0..3 {
                let chunk = batcher.sharding().test_chunk(batch, env);
                for row in 0..counts[env] {
                    let slot = env * 4 + row;
                    // Test images are exactly the decoded file, no augmentation.
                    assert_eq!(
                        images[slot * len..(slot + 1) * len],
                        *data.test.image(chunk.start + row, len)
                    );
                    seen[env].push(labels[slot]);
                }
                for row in counts[env]..4 {
                    assert_eq!(labels[env * 4 + row], PAD_LABEL, "padding rows never match a class");
                }
            }
        }
        if epoch == 0 {
            per_env = seen;
        } else {
            assert_eq!(per_env, seen, "an env's validation slice is the same every epoch");
        }
    }
    let total: usize = (0..3).map(|e| batcher.sharding().env_test_len(e)).sum();
    assert_eq!(total, 30);
}

#[test]
fn data_synthetic_batches_are_deterministic_whatever_the_thread_count() {
    let spec = SyntheticSpec { n_train: 600, n_test: 100, ..SyntheticSpec::with_seed(9) };
    let data = Dataset::load(&DataSource::Synthetic(spec)).unwrap();
    let run = || {
        let mut batcher = Batcher::new(&data, 9, 4, 32).unwrap();
        let mut images = vec![0.0f32; 4 * 32 * data.image_len()];
        let mut labels = vec![0u32; 4 * 32];
        let mut out = Vec::new();
        for epoch in 0..2 {
            batcher.begin_epoch(1, epoch);
            batcher.fill_train(&data, 3, &mut images, &mut labels);
            out.push((images.clone(), labels.clone()));
        }
        out
    };
    let a = run();
    let b = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(run);
    assert!(a == b);
    assert!(a[0] != a[1], "a new epoch gives new batches");
}

#[test]
fn data_errors_are_readable() {
    let data = Dataset::load(&DataSource::Synthetic(SyntheticSpec {
        n_train: 100,
        n_test: 50,
        ..Default::default()
    }))
    .unwrap();
    let err = Batcher::new(&data, 0, 4, 32).unwrap_err();
    assert_eq!(
        err.to_string(),
        "batch_per_env 32 × 4 envs = 128 exceeds the 100 training images: no full batch per epoch"
    );
    let err: Box<dyn std::error::Error> = Box::new(err);
    assert!(err.source().is_none());
    let missing = std::env::temp_dir().join(format!("esper-data-it-none-{}", std::process::id()));
    let err = Dataset::load(&DataSource::Cifar10 { dir: missing }).unwrap_err();
    assert!(matches!(err, DataError::NoDirectory { .. }));
}
