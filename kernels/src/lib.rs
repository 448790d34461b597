//! esper-kernels: all numeric work over batches of envs.
//!
//! The host network and the seed blueprints are built from our own batched ops, each with an explicit
//! forward and backward over flat `[E, …]` buffers (the env is a parallel dimension inside each op).
//! No ECS types live here.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod host;
pub mod obs_normalizer;
pub mod observation;
pub mod ops;
pub mod optim;
pub mod policy;
pub mod reward;
pub mod rng;
pub mod seeds;
