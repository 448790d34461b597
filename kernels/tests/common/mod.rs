//! Set-up shared by the kernels' integration tests (each test file is its own crate and takes the items
//! it needs: `mod common;`).
#![allow(dead_code)]

use esper_kernels::host::{HostArch, SeedBank, SeedEnvState, SeedMode};
use esper_kernels::ops::Real;
use esper_kernels::rng::{Purpose, Stream, StreamKey};
use esper_kernels::seeds::CnnBlueprint;

/// A small host (16×16 images, 4 base channels, three pooled blocks) that tests with seeds run fast on.
pub const ARCH: HostArch = HostArch {
    in_channels: 3,
    image_size: 16,
    num_classes: 10,
    base_channels: 4,
    n_blocks: 3,
    kernel_size: 3,
    pool_layers: 3,
};

/// Three slots: before and after the pool of block 0, after the pool of block 1.
pub const SLOTS: [(u8, u8); 3] = [(0, 0), (0, 1), (1, 1)];

/// The test stream `seed`.
pub fn stream(seed: u64) -> Stream {
    StreamKey::new(seed, 0, 0, Purpose::Test).stream(0)
}

/// A seed of blueprint `bp` blending (or incubating) by `mode` at `alpha`, trained, with gradient
/// statistics collected.
pub fn seed_state(mode: SeedMode, bp: CnnBlueprint, alpha: f32) -> SeedEnvState {
    SeedEnvState {
        mode,
        blueprint: Some(bp),
        alpha,
        train_seed: true,
        gate_grad: mode == SeedMode::Gate,
        gate_step: false,
        collect_stats: true,
    }
}

/// Random (not birth) rows, `0.3 · normal` from `s`, for every pool and gate of every slot, so no seed
/// starts dead.
pub fn randomize_pools<T: Real>(bank: &mut SeedBank<T>, s: &mut Stream) {
    for slot in bank.slots_mut() {
        for pool in slot.pools.iter_mut().chain([&mut slot.gate]) {
            for v in &mut pool.params {
                *v = T::from_f64(0.3 * s.normal());
            }
        }
    }
}

/// Runs `f` inside a fresh rayon pool of `threads` threads.
pub fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool").install(f)
}
