//! CIFAR-10 from the standard binary distribution (`cifar-10-batches-bin`).
//!
//! Each file is a run of 3,073-byte records: one label byte (0–9), then 3,072 pixel bytes, channel-major
//! (the 32×32 red plane, then green, then blue, each row-major). Training data is `data_batch_1.bin` …
//! `data_batch_5.bin` in that order, test data `test_batch.bin`. Pixels are scaled to [0, 1] and
//! normalised with the CIFAR means and stds, exactly as torchvision's `ToTensor` + `Normalize`.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::{Augment, CIFAR_MEAN, CIFAR_STD, DataError, Dataset, Split};

pub const CHANNELS: usize = 3;
pub const SIDE: usize = 32;
pub const NUM_CLASSES: usize = 10;
/// Pixel bytes per image.
pub const IMAGE_BYTES: usize = CHANNELS * SIDE * SIDE;
/// Bytes per record: the label byte and the pixels.
pub const RECORD_BYTES: usize = 1 + IMAGE_BYTES;
pub const TRAIN_FILES: [&str; 5] =
    ["data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"];
pub const TEST_FILE: &str = "test_batch.bin";
/// The folder the official archive unpacks to; `load` also looks inside it.
pub const ARCHIVE_DIR: &str = "cifar-10-batches-bin";

/// Loads CIFAR-10 from `dir`. If the files are not in `dir` itself but in `dir/cifar-10-batches-bin`
/// (the archive unpacked into `dir`), that folder is used. Train images get the reference's
/// crop-and-flip augmentation.
pub fn load(dir: &Path) -> Result<Dataset, DataError> {
    if !dir.is_dir() {
        return Err(DataError::NoDirectory { dir: dir.to_path_buf() });
    }
    let nested = dir.join(ARCHIVE_DIR);
    let dir = if !dir.join(TEST_FILE).exists() && nested.join(TEST_FILE).exists() {
        nested
    } else {
        dir.to_path_buf()
    };
    // Check every file is there before reading ~180 MB.
    for name in TRAIN_FILES.iter().chain(std::iter::once(&TEST_FILE)) {
        if !dir.join(name).is_file() {
            return Err(DataError::MissingFile { file: (*name).to_string(), dir });
        }
    }
    let mut train = Split::default();
    for name in TRAIN_FILES {
        read_records(&dir.join(name), &mut train)?;
    }
    let mut test = Split::default();
    read_records(&dir.join(TEST_FILE), &mut test)?;
    Ok(Dataset {
        name: "cifar10".to_string(),
        train,
        test,
        num_classes: NUM_CLASSES,
        channels: CHANNELS,
        height: SIDE,
        width: SIDE,
        augment: Augment::crop_flip(4, &CIFAR_MEAN, &CIFAR_STD),
    })
}

/// `(p / 255 − mean[c]) / std[c]` for every byte value and channel, so decoding is a table look-up.
fn normalisation_table() -> [[f32; 256]; CHANNELS] {
    let mut table = [[0.0; 256]; CHANNELS];
    for (c, row) in table.iter_mut().enumerate() {
        for (p, v) in row.iter_mut().enumerate() {
            *v = (p as f32 / 255.0 - CIFAR_MEAN[c]) / CIFAR_STD[c];
        }
    }
    table
}

/// Appends the records of one file to `split`.
fn read_records(path: &Path, split: &mut Split) -> Result<(), DataError> {
    let bytes = std::fs::read(path).map_err(|source| io_error(path, source))?;
    decode_records(path, &bytes, split)
}

fn io_error(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io { path: path.to_path_buf(), source }
}

/// Validates and decodes `bytes` (the content of `path`) onto the end of `split`.
fn decode_records(path: &Path, bytes: &[u8], split: &mut Split) -> Result<(), DataError> {
    let to_path = || PathBuf::from(path);
    if bytes.is_empty() {
        return Err(DataError::EmptyFile { path: to_path() });
    }
    if !bytes.len().is_multiple_of(RECORD_BYTES) {
        return Err(DataError::BadSize { path: to_path(), size: bytes.len() as u64, record: RECORD_BYTES });
    }
    if let Some((record, label)) = bytes
        .chunks_exact(RECORD_BYTES)
        .map(|r| r[0])
        .enumerate()
        .find(|&(_, label)| label as usize >= NUM_CLASSES)
    {
        return Err(DataError::BadLabel { path: to_path(), record, label, num_classes: NUM_CLASSES });
    }
    let n = bytes.len() / RECORD_BYTES;
    let first = split.labels.len();
    split.labels.extend(bytes.chunks_exact(RECORD_BYTES).map(|r| r[0]));
    split.images.resize((first + n) * IMAGE_BYTES, 0.0);
    let table = normalisation_table();
    split.images[first * IMAGE_BYTES..]
        .par_chunks_mut(IMAGE_BYTES)
        .zip(bytes.par_chunks_exact(RECORD_BYTES))
        .for_each(|(dst, record)| {
            let pixels = &record[1..];
            for (c, (dst_c, src_c)) in
                dst.chunks_exact_mut(SIDE * SIDE).zip(pixels.chunks_exact(SIDE * SIDE)).enumerate()
            {
                for (d, &p) in dst_c.iter_mut().zip(src_c) {
                    *d = table[c][p as usize];
                }
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh, empty folder under the system temp dir, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "esper-data-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A record whose pixel at (c, y, x) is `(seed + 7c + 3y + x) mod 256`.
    fn record(label: u8, seed: usize) -> Vec<u8> {
        let mut r = vec![label];
        for c in 0..CHANNELS {
            for y in 0..SIDE {
                for x in 0..SIDE {
                    r.push(((seed + 7 * c + 3 * y + x) % 256) as u8);
                }
            }
        }
        r
    }

    /// Writes the six files with `per_file` records each; file `f`, record `i` has label `(f + i) % 10`
    /// and pixel seed `100 f + i`.
    fn write_cifar(dir: &Path, per_file: usize) {
        for (f, name) in TRAIN_FILES.iter().chain(std::iter::once(&TEST_FILE)).enumerate() {
            let bytes: Vec<u8> =
                (0..per_file).flat_map(|i| record(((f + i) % 10) as u8, 100 * f + i)).collect();
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }

    fn pixel(split: &Split, image: usize, c: usize, y: usize, x: usize) -> f32 {
        split.images[image * IMAGE_BYTES + (c * SIDE + y) * SIDE + x]
    }

    #[test]
    fn data_cifar_decodes_labels_pixels_and_normalisation() {
        let tmp = TempDir::new("decode");
        write_cifar(&tmp.0, 3);
        let ds = load(&tmp.0).unwrap();
        assert_eq!((ds.n_train(), ds.n_test()), (15, 3));
        assert_eq!(ds.train.images.len(), 15 * 3072);
        assert_eq!((ds.channels, ds.height, ds.width, ds.num_classes), (3, 32, 32, 10));
        // Train records are file 0 (data_batch_1) then file 1 …: record 4 is file 1, record 1.
        assert_eq!(ds.train.labels, vec![0, 1, 2, 1, 2, 3, 2, 3, 4, 3, 4, 5, 4, 5, 6]);
        assert_eq!(ds.test.labels, vec![5, 6, 7]);
        // Train image 4 = file 1 record 1, pixel seed 101. Green (c=1) at y=2, x=5:
        // byte (101 + 7 + 6 + 5) = 119 → (119/255 − 0.4822)/0.2435 = −0.063_791_9.
        let v = pixel(&ds.train, 4, 1, 2, 5);
        assert!((v - (-0.063_791_9)).abs() < 1e-5, "{v}");
        // Test image 2 = seed 502: blue (c=2) at y=31, x=31: (502 + 14 + 93 + 31) % 256 = 128
        // → (128/255 − 0.4465)/0.2616 = 0.212_006_1.
        let v = pixel(&ds.test, 2, 2, 31, 31);
        assert!((v - 0.212_006_1).abs() < 1e-5, "{v}");
        // Red plane comes first: red at (0, 0) of train image 0 is byte 0 → −0.4914/0.2470.
        let v = pixel(&ds.train, 0, 0, 0, 0);
        assert!((v - (-1.989_473_7)).abs() < 1e-5, "{v}");
        // Byte 255 in blue → (1 − 0.4465)/0.2616 = 2.115_825_7; seed 241 puts 241 + 14 = 255 at (0, 0).
        let bytes = record(9, 241);
        let mut split = Split::default();
        decode_records(Path::new("x.bin"), &bytes, &mut split).unwrap();
        assert!((pixel(&split, 0, 2, 0, 0) - 2.115_825_7).abs() < 1e-5);
        assert_eq!(split.labels, vec![9]);
    }

    #[test]
    fn data_cifar_finds_the_archive_folder_inside_the_data_dir() {
        let tmp = TempDir::new("nested");
        let nested = tmp.0.join(ARCHIVE_DIR);
        std::fs::create_dir(&nested).unwrap();
        write_cifar(&nested, 1);
        let ds = load(&tmp.0).unwrap();
        assert_eq!((ds.n_train(), ds.n_test()), (5, 1));
    }

    #[test]
    fn data_cifar_missing_file_is_named() {
        let tmp = TempDir::new("missing");
        write_cifar(&tmp.0, 1);
        std::fs::remove_file(tmp.0.join(TEST_FILE)).unwrap();
        let err = load(&tmp.0).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::MissingFile { .. }), "{err:?}");
        assert!(msg.starts_with("test_batch.bin: missing in "), "{msg}");
        assert!(msg.contains(&tmp.0.display().to_string()), "{msg}");

        let err = load(&tmp.0.join("nope")).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn data_cifar_wrong_size_is_named() {
        let tmp = TempDir::new("size");
        write_cifar(&tmp.0, 2);
        let path = tmp.0.join("data_batch_3.bin");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(3073 + 100);
        std::fs::write(&path, bytes).unwrap();
        let msg = load(&tmp.0).unwrap_err().to_string();
        assert!(msg.contains("data_batch_3.bin: size 3173 is not a multiple of 3073 bytes"), "{msg}");

        std::fs::write(&path, []).unwrap();
        let msg = load(&tmp.0).unwrap_err().to_string();
        assert!(msg.contains("data_batch_3.bin: file is empty"), "{msg}");
    }

    #[test]
    fn data_cifar_bad_label_is_named_with_its_record() {
        let tmp = TempDir::new("label");
        write_cifar(&tmp.0, 9);
        let path = tmp.0.join("data_batch_2.bin");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[7 * RECORD_BYTES] = 11;
        std::fs::write(&path, bytes).unwrap();
        let err = load(&tmp.0).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::BadLabel { record: 7, label: 11, .. }), "{err:?}");
        assert!(msg.contains("data_batch_2.bin: label 11 out of range at record 7"), "{msg}");
    }
}
