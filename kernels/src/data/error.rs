//! What can go wrong when loading data or cutting it into per-env batches.

use std::fmt;
use std::path::PathBuf;

/// A data error. Every message names the file (or the numbers) involved and what is wrong with it, so
/// the CLI can print it as is.
#[derive(Debug)]
pub enum DataError {
    /// The data directory itself does not exist or is not a directory.
    NoDirectory { dir: PathBuf },
    /// A required file is not in the data directory.
    MissingFile { file: String, dir: PathBuf },
    /// A file exists but could not be read.
    Io { path: PathBuf, source: std::io::Error },
    /// A file is empty.
    EmptyFile { path: PathBuf },
    /// A file's size is not a whole number of records.
    BadSize { path: PathBuf, size: u64, record: usize },
    /// A record's label is not a valid class.
    BadLabel { path: PathBuf, record: usize, label: u8, num_classes: usize },
    /// `n_envs` or `batch_per_env` is zero.
    EmptyBatch { n_envs: usize, batch_per_env: usize },
    /// The combined batch `batch_per_env × n_envs` is larger than the training set, so training would
    /// see zero batches per epoch (the reference silently does; we refuse).
    CannotFeedEnvs { batch_per_env: usize, n_envs: usize, n_train: usize },
    /// There are fewer test images than envs, so some env would validate on nothing.
    TooFewTestImages { n_envs: usize, n_test: usize },
    /// A synthetic-data spec that cannot produce a dataset.
    BadSpec { reason: String },
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDirectory { dir } => {
                write!(f, "data directory {} does not exist or is not a directory", dir.display())
            }
            Self::MissingFile { file, dir } => write!(f, "{file}: missing in {}", dir.display()),
            Self::Io { path, source } => write!(f, "{}: cannot be read: {source}", path.display()),
            Self::EmptyFile { path } => write!(f, "{}: file is empty", path.display()),
            Self::BadSize { path, size, record } => write!(
                f,
                "{}: size {size} is not a multiple of {record} bytes (1 label byte + pixel bytes per record)",
                path.display()
            ),
            Self::BadLabel { path, record, label, num_classes } => write!(
                f,
                "{}: label {label} out of range at record {record} (expected 0..{num_classes})",
                path.display()
            ),
            Self::EmptyBatch { n_envs, batch_per_env } => {
                write!(f, "batch_per_env {batch_per_env} × {n_envs} envs: both must be at least 1")
            }
            Self::CannotFeedEnvs { batch_per_env, n_envs, n_train } => write!(
                f,
                "batch_per_env {batch_per_env} × {n_envs} envs = {} exceeds the {n_train} training images: \
                 no full batch per epoch",
                batch_per_env.saturating_mul(*n_envs)
            ),
            Self::TooFewTestImages { n_envs, n_test } => {
                write!(f, "{n_test} test images cannot give each of {n_envs} envs its own validation slice")
            }
            Self::BadSpec { reason } => write!(f, "synthetic data: {reason}"),
        }
    }
}

impl std::error::Error for DataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
