//! The numeric state of a run as resources (DESIGN §4: components hold what the lifecycle branches on,
//! resources hold what kernels crunch): every env's host and seed parameters, the trainer and
//! workspaces, the fused validator, and the data with its reused batch buffers.

use crate::resources::ParamCounts;
use bevy_ecs::resource::Resource;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::train::Trainer;
use esper_kernels::host::{FusedValidator, HostArch, HostParams, HostWorkspace, SeedBank};
use esper_kernels::seeds::{self, CnnBlueprint};

/// Where the step is: the run seed, the round (fresh hosts each round), the epoch (1-based), the step
/// index (0-based, counting every step of the run across rounds; the profile's step axis) and the
/// episode length `T` (the epoch that ends an episode; 0 = none, for worlds stepped by hand).
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepClock {
    pub seed: u64,
    pub round: u64,
    pub epoch: u64,
    pub step: u64,
    pub episode_epochs: u64,
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

    /// The trainable parameter counts of the host and of each blueprint at each slot.
    pub fn param_counts(&self) -> ParamCounts {
        let seed = self
            .bank
            .slots()
            .map(|slot| {
                let mut row = [0u64; esper_components::BlueprintAction::COUNT];
                for bp in CnnBlueprint::ALL {
                    row[bp.action_index() as usize] = seeds::param_count(bp, slot.channels) as u64;
                }
                row
            })
            .collect();
        let gate = self.bank.slots().map(|slot| seeds::gate_param_count(slot.channels) as u64).collect();
        ParamCounts { host: self.arch.param_count() as u64, seed, gate }
    }

    /// Zero env `env`'s host and seed optimizer state (momentum), as after a rollback: the weights were
    /// copied in place, so the reference clears its optimizers (tamiyo §6.5).
    pub fn clear_optimizer_state(&mut self, env: usize) {
        self.trainer.momentum.zero_env(env);
        for slot in self.bank.slots_mut() {
            slot.reset_momentum(env);
        }
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

/// A fossil seed's row as a governor snapshot holds it: its blueprint's pool row, and the gate row
/// when the seed has a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FossilRow {
    pub blueprint: CnnBlueprint,
    pub gate: bool,
}

/// The governor's last known good weights of every env, as the reference keeps them (tamiyo §6.4): the
/// host (weights and batch-norm statistics) plus the seeds that were FOSSILIZED when the snapshot was
/// taken. Live seeds are excluded, so a restore leaves their rows alone (the rollback prunes them),
/// and a seed fossilized after the snapshot keeps its current weights. Refreshed per env when its
/// governor says so (every 5 epochs and after a fossilization).
#[derive(Resource)]
pub struct Snapshots {
    pub params: HostParams<f32>,
    /// Same shapes as the hosts' bank; only the rows named in `fossils` are ever written or read.
    pub bank: SeedBank<f32>,
    /// `[E × S]`: the fossil row each env's snapshot holds at each slot.
    pub fossils: Vec<Option<FossilRow>>,
    n_slots: usize,
}

impl Snapshots {
    /// Every env's host as it is now, with no fossils (taken when a round starts: fresh hosts, empty
    /// slots).
    pub fn of(hosts: &Hosts) -> Self {
        let n_envs = hosts.params.n_envs();
        let n_slots = hosts.slot_ids.len();
        Self {
            params: hosts.params.clone(),
            bank: SeedBank::new(&hosts.arch, n_envs, &hosts.slot_ids),
            fossils: vec![None; n_envs * n_slots],
            n_slots,
        }
    }

    /// Snapshot env `env`: its host, and the rows of the fossils in `fossils_now` (slot `k` of the env
    /// at position `k`; None for a slot without a fossil).
    pub fn take(&mut self, hosts: &Hosts, env: usize, fossils_now: &[Option<FossilRow>]) {
        assert_eq!(fossils_now.len(), self.n_slots);
        self.params.copy_env_from(&hosts.params, env);
        for (k, fossil) in fossils_now.iter().enumerate() {
            if let Some(f) = fossil {
                self.bank.copy_seed_row_from(&hosts.bank, k, f.blueprint, f.gate, env);
            }
        }
        self.env_fossils_mut(env).copy_from_slice(fossils_now);
    }

    /// Restore env `env` from its snapshot (the reference's non-strict load): the host, and exactly the
    /// fossil rows the snapshot holds. Every other seed row keeps its current values. Optimizer state
    /// is the caller's ([`Hosts::clear_optimizer_state`]).
    pub fn restore(&self, hosts: &mut Hosts, env: usize) {
        hosts.params.copy_env_from(&self.params, env);
        for (k, fossil) in self.env_fossils(env).iter().enumerate() {
            if let Some(f) = fossil {
                hosts.bank.copy_seed_row_from(&self.bank, k, f.blueprint, f.gate, env);
            }
        }
    }

    /// The fossil rows env `env`'s snapshot holds, by slot.
    pub fn env_fossils(&self, env: usize) -> &[Option<FossilRow>] {
        &self.fossils[env * self.n_slots..(env + 1) * self.n_slots]
    }

    fn env_fossils_mut(&mut self, env: usize) -> &mut [Option<FossilRow>] {
        &mut self.fossils[env * self.n_slots..(env + 1) * self.n_slots]
    }
}
