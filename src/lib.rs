//! esper-ecs: vectorized morphogenetic training environments as a data-oriented bevy_ecs simulation.
//!
//! The app crate: schedule assembly, CLI, run config and (as they land) trace/replay files, telemetry,
//! profiling sinks and checkpoints. The world's data lives in [`components`], the systems of one step in
//! [`systems`].

pub use esper_components as components;
pub use esper_systems as systems;
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod config;
pub mod memory;
pub mod profile;
pub mod replay;
pub mod run;
pub mod trace;
