//! How much memory a run will need, estimated from its configuration before anything is allocated,
//! and how much the machine has: a run that cannot fit says so at once (exit 2) instead of aborting
//! inside the data generator or at the first seed.

use std::fmt;

use esper_components::{CnnHostSpec, SlotConfig};

/// Bytes per activation value of the host's forward caches and gradients, per value of one image's
/// activations (input plus every injection point's tensor). Measured: cifar_baseline, batch 128, no
/// seeds: 29 MB per env resident over the data (227 KB per image against 84 KB of activations).
const HOST_BYTES_PER_ACTIVATION: u64 = 4 * 3;
/// The same for a seeded slot, per value of the slot's tensor: a seed's forward caches, gradients and
/// the slot's output. Measured (`esper-ecs bench`, cifar_baseline, batch 64, three BLENDING seeds in
/// r0c0, r0c1, r0c2, 8 validation configurations; every env on one blueprint per slot, so the slot layer
/// reads in place): 788 MB resident at 16 envs, 3,119 MB at 64, 48.6 MB per added env of which 3 MB is
/// data — 32 bytes per seed value over the host's. Envs on different blueprints at one slot are gathered
/// instead, which adds the gathered input, blend output and host gradient (12 bytes per value): 44.
const SEED_BYTES_PER_ACTIVATION: u64 = 4 * 11;
/// Program, thread stacks, allocator slack and the small per-run buffers.
const FIXED_BYTES: u64 = 64 << 20;

/// A run's estimated peak memory. The per-env part assumes every enabled slot holds a seed (a run can
/// grow into that at any epoch), so it errs on the large side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// The dataset as the run holds it: every train and test image as f32.
    pub data: u64,
    /// One env: host workspaces for `batch_per_env` images plus a seed in every enabled slot.
    pub per_env: u64,
    pub envs: usize,
}

impl MemoryEstimate {
    pub fn new(
        host: &CnnHostSpec,
        slots: &SlotConfig,
        batch_per_env: usize,
        envs: usize,
        images: usize,
    ) -> Self {
        let size2 = |s: u32| u64::from(s) * u64::from(s);
        let input = u64::from(host.in_channels) * size2(host.image_size);
        let points = host.injection_points();
        let host_values: u64 =
            input + points.iter().map(|p| u64::from(p.channels) * size2(p.size)).sum::<u64>();
        let seed_values: u64 = slots
            .ids()
            .iter()
            .filter_map(|&id| host.injection_point(id))
            .map(|p| u64::from(p.channels) * size2(p.size))
            .sum();
        let per_image = host_values * HOST_BYTES_PER_ACTIVATION + seed_values * SEED_BYTES_PER_ACTIVATION;
        Self {
            data: (images as u64).saturating_mul(input * 4 + 1),
            per_env: per_image.saturating_mul(batch_per_env as u64),
            envs,
        }
    }

    pub fn total(&self) -> u64 {
        self.data.saturating_add(self.per_env.saturating_mul(self.envs as u64)).saturating_add(FIXED_BYTES)
    }
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "about {} of memory (data {} + {} envs × {} with a seed in every slot)",
            bytes(self.total()),
            bytes(self.data),
            self.envs,
            bytes(self.per_env)
        )
    }
}

/// `1.5 GiB`, `142 MiB`, `3.2 TiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// A `Key:   N kB` line of a /proc file, in bytes (Linux).
fn proc_kib_bytes(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.strip_prefix(key).is_some_and(|rest| rest.starts_with(':')))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident set size of this process.
pub fn resident_bytes() -> Option<u64> {
    proc_kib_bytes("/proc/self/status", "VmRSS")
}

/// Memory the system can still give (`MemAvailable`); `None` where it cannot be read (not Linux), and
/// then no run is refused.
pub fn available_bytes() -> Option<u64> {
    proc_kib_bytes("/proc/meminfo", "MemAvailable")
}

#[cfg(test)]
mod tests {
    use super::*;
    use esper_components::TaskPreset;

    #[test]
    fn memory_estimate_counts_data_and_every_slot_by_hand() {
        let host = TaskPreset::CifarBaseline.host();
        let slots = SlotConfig::parse_list("r0c0,r0c1,r0c2").unwrap();
        let est = MemoryEstimate::new(&host, &slots, 128, 16, 16 * 1280);
        // Activations of one image: input 3·32² + r0c0 8·32² + r1c0 8·16² + r0c1 16·16² + r1c1 16·8²
        // + r0c2 32·8² + r1c2 32·4² = 3072 + 8192 + 2048 + 4096 + 1024 + 2048 + 512 = 20,992;
        // the seeded slots r0c0, r0c1, r0c2 hold 8192 + 4096 + 2048 = 14,336.
        assert_eq!(est.per_env, 128 * (20_992 * 12 + 14_336 * 44));
        assert_eq!(est.data, 16 * 1280 * (3072 * 4 + 1));
        assert_eq!(est.total(), est.data + 16 * est.per_env + FIXED_BYTES);
        // Fewer slots, less memory; the data term does not move.
        let one = MemoryEstimate::new(&host, &SlotConfig::parse_list("r0c2").unwrap(), 128, 16, 16 * 1280);
        assert_eq!(one.per_env, 128 * (20_992 * 12 + 2048 * 44));
        assert_eq!(one.data, est.data);
    }

    #[test]
    fn memory_estimate_saturates_instead_of_overflowing() {
        let host = TaskPreset::CifarBaseline.host();
        let slots = SlotConfig::parse_list("r0c0").unwrap();
        let est = MemoryEstimate::new(&host, &slots, usize::MAX, usize::MAX, usize::MAX);
        assert_eq!(est.total(), u64::MAX);
    }

    #[test]
    fn bytes_reads_naturally() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(142 << 20), "142.0 MiB");
        assert_eq!(bytes(3 << 30 | 1 << 29), "3.5 GiB");
    }
}
