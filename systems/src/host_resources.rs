//! The numeric state of a run as resources (DESIGN §4: components hold what the lifecycle branches on,
//! resources hold what kernels crunch): every env's host and seed parameters, the trainer and
//! workspaces, the fused validator, and the data with its reused batch buffers.

use bevy_ecs::resource::Resource;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::train::Trainer;
use esper_kernels::host::{FusedValidator, HostArch, HostParams, HostWorkspace, SeedBank};

/// Where the step is: the run seed, the round (fresh hosts each round), the epoch (1-based) and the
/// step index (0-based, counting every step of the run across rounds; the profile's step axis).
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepClock {
    pub seed: u64,
    pub round: u64,
    pub epoch: u64,
    pub step: u64,
}

/// Every env's host and seeds with what trains and validates them.
#[derive(Resource)]
pub struct Hosts {
    pub arch: HostArch,
    /// Enabled slots `(row, col)` in canonical order (= the bank's slot order).
    pub slot_ids: Vec<(u8, u8)>,
    pub params: HostParams<f32>,
    pub bank: SeedBank<f32>,
    pub trainer: Trainer<f32>,
    pub workspace: HostWorkspace<f32>,
    pub validator: FusedValidator<f32>,
}

impl Hosts {
    /// Fresh hosts for `round`: env `e` initialised from its own stream `(seed, round, e, HostInit)`.
    pub fn new(
        arch: HostArch,
        slot_ids: &[(u8, u8)],
        n_envs: usize,
        batch: usize,
        seed: u64,
        round: u64,
    ) -> Self {
        let ids: Vec<u64> = (0..n_envs as u64).collect();
        let params = HostParams::init(arch, seed, round, &ids);
        let bank = SeedBank::new(&arch, n_envs, slot_ids);
        let trainer = Trainer::new(&params, &bank);
        let workspace = HostWorkspace::with_slots(arch, n_envs, batch, &bank);
        let validator = FusedValidator::new(arch, &bank, slot_ids, n_envs.clamp(1, 64), batch);
        Self { arch, slot_ids: slot_ids.to_vec(), params, bank, trainer, workspace, validator }
    }

    /// Start a new round in place: new host weights, empty seeds, zero optimizer state; the
    /// workspaces are kept (same shapes), so nothing large is reallocated.
    pub fn reset_round(&mut self, seed: u64, round: u64) {
        let n = self.params.n_envs();
        let ids: Vec<u64> = (0..n as u64).collect();
        self.params = HostParams::init(self.arch, seed, round, &ids);
        self.bank = SeedBank::new(&self.arch, n, &self.slot_ids);
        self.trainer = Trainer::new(&self.params, &self.bank);
    }
}

/// The dataset, the per-env batcher and the reused batch buffers `[E, B, C, H, W]` / `[E, B]`.
#[derive(Resource)]
pub struct TrainData {
    pub dataset: Dataset,
    pub batcher: Batcher,
    pub images: Vec<f32>,
    pub labels: Vec<u8>,
    pub counts: Vec<usize>,
}

impl TrainData {
    pub fn new(dataset: Dataset, batcher: Batcher, n_envs: usize, batch: usize) -> Self {
        let image_len = dataset.image_len();
        Self {
            dataset,
            batcher,
            images: vec![0.0; n_envs * batch * image_len],
            labels: vec![0; n_envs * batch],
            counts: vec![0; n_envs],
        }
    }
}

/// The governor's last known good weights of every env (host and seeds), refreshed per env when its
/// governor says so (every 5 epochs and after a fossilization) and restored on a rollback.
#[derive(Resource)]
pub struct Snapshots {
    pub params: HostParams<f32>,
    pub bank: SeedBank<f32>,
}

impl Snapshots {
    /// Every env's current weights (taken at the start of a round).
    pub fn of(hosts: &Hosts) -> Self {
        Self { params: hosts.params.clone(), bank: hosts.bank.clone() }
    }
}
