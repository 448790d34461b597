//! The seam between the systems and the numeric layer: [`HostBackend`] is every operation the systems
//! ask of the hosts, at the granularity of an epoch (sync the lifecycle rows, train an epoch, validate
//! with the counterfactual plan, read seed gradient telemetry, snapshot / restore an env, start a
//! round). Per-batch results stay inside the backend and come back reduced per env and epoch, so a
//! device backend reads back once per stage, not once per batch. [`CpuHostBackend`] is the CPU
//! implementation: the batched kernels of this module behind the seam.

use std::any::Any;

use rayon::prelude::*;

use super::arch::HostArch;
use super::counterfactual::{EnvCounterfactuals, FusedValidator};
use super::network::HostWorkspace;
use super::params::HostParams;
use super::seed_bank::{SeedBank, SeedEnvState, SeedMode};
use super::train::{SeedGradStats, Trainer};
use crate::data::{Batcher, Dataset};
use crate::ops::{ClassifierShape, count_correct};
use crate::rng::StreamKey;
use crate::seeds::CnnBlueprint;

/// Gradient-health statistics are collected on every 10th training batch of an epoch (the reference's
/// `gradient_telemetry_stride`).
pub const TELEMETRY_STRIDE: usize = 10;

/// What the lifecycle did to one env's seed at one slot this epoch, and how the seed takes part in the
/// coming epoch's forward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotSync {
    /// Germinated this epoch: a fresh row of this blueprint (MULTIPLY-initialised when `.1`).
    pub germinate: Option<(CnnBlueprint, bool)>,
    /// A new gate (entering gated blending, or switching to GATE).
    pub create_gate: bool,
    /// The seed optimizer is rebuilt (fossilization): momentum restarts from zero.
    pub reset_momentum: bool,
    pub state: SeedEnvState,
    /// The stream of this seed's births: the germination draws at `counter`, the gate at `counter | 1`.
    pub draws: StreamKey,
    pub counter: u64,
}

/// One env's training epoch, reduced over its batches.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochTrain {
    /// Mean over the epoch's batches of the batch-mean cross-entropy.
    pub loss: f64,
    /// Percent of the epoch's training images classified right.
    pub accuracy: f64,
}

/// One env's seed gradient telemetry of this epoch's last collection batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeedTelemetry {
    pub stats: SeedGradStats,
    /// The env's host gradient norm on the same batch (for the seed/host ratio).
    pub host_norm: f64,
}

/// A fossil seed's row as a governor snapshot holds it: its blueprint's row, and the gate row when the
/// seed has a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FossilRow {
    pub blueprint: CnnBlueprint,
    pub gate: bool,
}

/// A sum and a sum of squares (f64) over one group of an env's parameters: a fingerprint that two
/// devices can compare within a tolerance, where the bit-exact checksum of
/// [`HostBackend::param_fingerprints`] only matches on the same build and device.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ParamPrint {
    pub sum: f64,
    pub sum_sq: f64,
}

impl ParamPrint {
    /// Add `values` to the group's sums and continue the env's checksum `hash` over them, in one pass:
    /// 64-bit FNV-1a over the bit patterns, one 32-bit word at a time. Equal hashes mean (to 2^-64)
    /// bit-identical values: −0 and +0, or two NaN payloads, differ.
    pub(crate) fn add_hashed(&mut self, mut hash: u64, values: &[f32]) -> u64 {
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        for &v in values {
            hash ^= v.to_bits() as u64;
            hash = hash.wrapping_mul(PRIME);
            let v = v as f64;
            self.sum += v;
            self.sum_sq += v * v;
        }
        hash
    }
}

/// FNV-1a's offset basis: the hash of nothing.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The start of env `env`'s checksum (see [`HostBackend::param_fingerprints`]): 64-bit FNV-1a over its
/// host rows ([`HostParams::env_rows`]), their sums added to `print`. A backend continues the hash over
/// the env's seed rows.
pub fn host_fingerprint(params: &HostParams<f32>, env: usize, print: &mut ParamPrint) -> u64 {
    let mut hash = FNV_OFFSET;
    for row in params.env_rows(env) {
        hash = print.add_hashed(hash, row);
    }
    hash
}

/// What a device backend measured (see [`HostBackend::take_device_report`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeviceReport {
    /// Device→host copies that waited for the device's queued work.
    pub syncs: u64,
    /// Device time of the training epochs (CUDA events around each), ms.
    pub train_ms: f64,
    /// Device time of the validation passes, ms.
    pub validate_ms: f64,
    /// How the last training epoch and the last validation pass ran with respect to CUDA graphs (None:
    /// none since the last take; a report is taken per step, so these are the step's).
    pub train_run: Option<GraphUse>,
    pub validation_run: Option<GraphUse>,
}

/// How a device ran one training epoch or validation pass with respect to CUDA graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphUse {
    /// Launch by launch (graphs off, or a shape not seen just before).
    Launches,
    /// Captured into a graph, then launched.
    Captured,
    /// Replayed from a kept graph.
    Replayed,
    /// The capture failed: launch by launch, and graphs off from now on.
    CaptureFailed,
}

/// How many of a run's training epochs (or validation passes) ran each way ([`GraphUse`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphCounts {
    pub launches: u64,
    pub captured: u64,
    pub replayed: u64,
    pub capture_failed: u64,
}

impl GraphCounts {
    pub fn add(&mut self, run: Option<GraphUse>) {
        match run {
            Some(GraphUse::Launches) => self.launches += 1,
            Some(GraphUse::Captured) => self.captured += 1,
            Some(GraphUse::Replayed) => self.replayed += 1,
            Some(GraphUse::CaptureFailed) => self.capture_failed += 1,
            None => {}
        }
    }

    /// The counts of `runs`.
    pub fn of(runs: impl IntoIterator<Item = Option<GraphUse>>) -> Self {
        let mut counts = Self::default();
        runs.into_iter().for_each(|run| counts.add(run));
        counts
    }
}

impl GraphUse {
    /// The name a profile records (`graph` field of TrainHosts' and Validate's spans).
    pub fn name(self) -> &'static str {
        match self {
            GraphUse::Launches => "launches",
            GraphUse::Captured => "captured",
            GraphUse::Replayed => "replayed",
            GraphUse::CaptureFailed => "capture failed",
        }
    }
}

impl DeviceReport {
    /// How the last training epoch and validation pass ran, for a line of text: `epoch replayed,
    /// validation captured` (CUDA graphs; `launches`: launch by launch).
    pub fn epochs_ran(&self) -> String {
        let name = |run: Option<GraphUse>| run.map_or("–", GraphUse::name);
        format!("epoch {}, validation {}", name(self.train_run), name(self.validation_run))
    }
}

/// Which seeds validation ablates.
#[derive(Clone, Copy, Debug)]
pub struct ValidationPlan<'a> {
    /// `[slot][env]`: the seed is FOSSILIZED (not ablatable unless `ablate_fossils`).
    pub fossilized: &'a [Vec<bool>],
    /// Keep fossils in the ablation set (the BASIC_PLUS drip, simic §3.1).
    pub ablate_fossils: bool,
}

/// Every operation the systems use on the hosts. Env and slot indices are the run's (`EnvIndex`,
/// canonical `SlotIndex`).
pub trait HostBackend: Send + Sync + 'static {
    fn arch(&self) -> HostArch;
    fn n_envs(&self) -> usize;
    /// Enabled slots `(row, col)` in canonical order.
    fn slot_ids(&self) -> &[(u8, u8)];
    /// Bring env `env`'s seed at slot `slot` in line with the lifecycle (see [`SlotSync`]).
    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync);
    /// One epoch of training for every env over `batcher`'s current epoch (`begin_epoch` already
    /// called); seed gradient telemetry refreshed on the collection batches. The per-env results are
    /// read with [`Self::epoch_train`] and [`Self::seed_telemetry`]: a device backend returns them with
    /// the validation pass's sums, so that a step waits for the device once.
    fn train_epoch(&mut self, data: &Dataset, batcher: &Batcher);
    /// The last epoch's per-env loss and accuracy (`[E]`; zeros before the first epoch). A device
    /// backend has them once [`Self::validate`] ran after the epoch; asked before that, it reads them
    /// back (and the epoch's telemetry) in one copy of their own.
    fn epoch_train(&mut self) -> &[EpochTrain];
    /// The fused validation pass over every env's test slice with the counterfactual configurations of
    /// `plan`: one result per env.
    fn validate(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals];
    /// How many configurations (main included) env `env` was validated in by the last [`Self::validate`]
    /// (0 before the first).
    fn validation_configs(&self, env: usize) -> usize;
    /// Env `env`'s telemetry at slot `slot` from this epoch's collection batches (None: not collected).
    /// It arrives with the epoch's results (see [`Self::epoch_train`]), so it may read them back.
    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry>;
    /// Env `env`'s governor snapshot: its host as it is now and the rows of the fossils in `fossils`
    /// (`[S]`, None for a slot without a fossil). Live seeds are left out.
    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]);
    /// Roll env `env` back to its snapshot as the reference does (tamiyo §6.5): the host and exactly the
    /// fossil rows the snapshot holds (every other seed row keeps its values), then the host and seed
    /// optimizer state cleared.
    fn restore_snapshot(&mut self, env: usize);
    /// Fresh hosts for `round` (env `e` from its stream `(seed, round, e, HostInit)`), empty seeds, zero
    /// optimizer state, and every snapshot the fresh host with no fossils.
    fn reset_round(&mut self, seed: u64, round: u64);
    /// Every env's parameters as the forward reads them, for `trace.bin`, in one call per step (on a
    /// device, part of the step's one read-back): `checksums[e]` (`[E]`) a bit-exact checksum of env
    /// `e` (64-bit FNV-1a over [`HostParams::env_rows`], then per slot the seed's blueprint row and, in
    /// GATE mode, its gate row) and `prints[e·(1 + S)..]` (`[E, 1 + S]`) a [`ParamPrint`] of its host
    /// and of each slot's seed (zeros for an empty slot).
    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]);
    /// Whether [`Self::param_fingerprints`] makes the device wait (a GPU backend reads the parameters
    /// back for it: a second copy in the step). A trace that can wait a step for its checksums then
    /// takes them with [`Self::queue_param_fingerprints`] and [`Self::queued_param_fingerprints`].
    fn fingerprints_wait(&self) -> bool {
        false
    }
    /// Starts copying every env's parameters as they are now (and which seed each slot holds), without
    /// waiting for the device: the copies finish with the device's queued work, at the latest by the
    /// next step's read-back. A backend whose [`Self::fingerprints_wait`] is false queues nothing.
    fn queue_param_fingerprints(&self) {}
    /// [`Self::param_fingerprints`] of the parameters as the last [`Self::queue_param_fingerprints`]
    /// found them (waiting for its copies only if they have not finished); with none queued, of the
    /// parameters now.
    fn queued_param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        self.param_fingerprints(checksums, prints)
    }
    /// A device backend's counters since the last call (then reset): copies back that waited for the
    /// device, and each stage's device time. None on the CPU.
    fn take_device_report(&mut self) -> Option<DeviceReport> {
        None
    }
    /// The counters so far, without resetting them (a stage's system reads its device time).
    fn peek_device_report(&self) -> Option<DeviceReport> {
        None
    }
    /// The implementation, for tests and tools that inspect it.
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The governor snapshots of every env: the host rows and each env's fossil rows (only those, not a
/// whole seed bank).
#[derive(Clone, Debug)]
pub struct SnapshotStore {
    pub params: HostParams<f32>,
    /// `[E × S]`: the fossil row each env's snapshot holds at each slot.
    pub fossils: Vec<Option<FossilRow>>,
    /// `[E × S]`: that fossil's blueprint row followed by its gate row (when it has one); capacity for
    /// the largest, so taking a snapshot allocates nothing.
    pub rows: Vec<Vec<f32>>,
    n_slots: usize,
}

impl SnapshotStore {
    /// Every env's host as it is in `params`, no fossils.
    fn of(params: &HostParams<f32>, bank: &SeedBank<f32>) -> Self {
        let n_envs = params.n_envs();
        let capacities: Vec<usize> = bank
            .slots()
            .map(|s| s.pools.iter().map(|p| p.row_len).max().unwrap_or(0) + s.gate.row_len)
            .collect();
        let n_slots = capacities.len();
        let rows = (0..n_envs * n_slots).map(|i| Vec::with_capacity(capacities[i % n_slots])).collect();
        Self { params: params.clone(), fossils: vec![None; n_envs * n_slots], rows, n_slots }
    }

    /// The fossil rows env `env`'s snapshot holds, by slot.
    pub fn env_fossils(&self, env: usize) -> &[Option<FossilRow>] {
        &self.fossils[env * self.n_slots..(env + 1) * self.n_slots]
    }

    /// The blueprint row (without the gate) env `env`'s snapshot holds at slot `slot`.
    pub fn seed_row(&self, env: usize, slot: usize, bank: &SeedBank<f32>) -> Option<&[f32]> {
        let fossil = self.env_fossils(env)[slot]?;
        let len = bank.slots().nth(slot)?.pool(fossil.blueprint).row_len;
        Some(&self.rows[env * self.n_slots + slot][..len])
    }
}

/// The CPU backend: every env's host and seeds stacked, trained and validated by the batched kernels.
#[derive(Debug)]
pub struct CpuHostBackend {
    pub arch: HostArch,
    slot_ids: Vec<(u8, u8)>,
    pub params: HostParams<f32>,
    pub bank: SeedBank<f32>,
    pub trainer: Trainer<f32>,
    pub workspace: HostWorkspace<f32>,
    pub validator: FusedValidator<f32>,
    pub snapshots: SnapshotStore,
    /// Batch buffers `[E, B, C, H, W]`, `[E, B]`, `[E]`.
    images: Vec<f32>,
    labels: Vec<u8>,
    counts: Vec<usize>,
    correct: Vec<u32>,
    /// Per env over the epoch: Σ batch losses, Σ correct.
    totals: Vec<(f64, u64)>,
    /// The last epoch's per-env results.
    epoch: Vec<EpochTrain>,
    results: Vec<EnvCounterfactuals>,
}

impl CpuHostBackend {
    /// Fresh hosts for round `round` of run `seed`, `n_envs` envs training `batch` images each per batch.
    pub fn new(
        arch: HostArch,
        slot_ids: &[(u8, u8)],
        n_envs: usize,
        batch: usize,
        seed: u64,
        round: u64,
    ) -> Self {
        let params = init_params(arch, n_envs, seed, round);
        let bank = SeedBank::new(&arch, n_envs, slot_ids);
        let trainer = Trainer::new(&params, &bank);
        let workspace = HostWorkspace::with_slots(arch, n_envs, batch, &bank);
        let validator = FusedValidator::new(arch, &bank, slot_ids, n_envs.clamp(1, 64), batch);
        let snapshots = SnapshotStore::of(&params, &bank);
        Self {
            arch,
            slot_ids: slot_ids.to_vec(),
            params,
            bank,
            trainer,
            workspace,
            validator,
            snapshots,
            images: vec![0.0; n_envs * batch * arch.image_len()],
            labels: vec![0; n_envs * batch],
            counts: vec![0; n_envs],
            correct: vec![0; n_envs],
            totals: vec![(0.0, 0); n_envs],
            epoch: vec![EpochTrain::default(); n_envs],
            results: Vec::new(),
        }
    }
}

/// Round `round`'s fresh hosts for `n_envs` envs of run `seed` (env `e` from its own stream).
pub(crate) fn init_params(arch: HostArch, n_envs: usize, seed: u64, round: u64) -> HostParams<f32> {
    let ids: Vec<u64> = (0..n_envs as u64).collect();
    HostParams::init(arch, seed, round, &ids)
}

impl CpuHostBackend {
    /// Env `env`'s checksum and prints (see [`HostBackend::param_fingerprints`]).
    fn env_fingerprint(&self, env: usize, groups: &mut [ParamPrint]) -> u64 {
        groups.fill(ParamPrint::default());
        let mut hash = host_fingerprint(&self.params, env, &mut groups[0]);
        for (slot, group) in self.bank.slots().zip(&mut groups[1..]) {
            let state = slot.state[env];
            let Some(bp) = state.blueprint else { continue };
            let gate = (state.mode == SeedMode::Gate).then(|| slot.gate.row(env));
            for row in std::iter::once(slot.pool(bp).row(env)).chain(gate) {
                hash = group.add_hashed(hash, row);
            }
        }
        hash
    }
}

impl HostBackend for CpuHostBackend {
    fn arch(&self) -> HostArch {
        self.arch
    }

    fn n_envs(&self) -> usize {
        self.params.n_envs()
    }

    fn slot_ids(&self) -> &[(u8, u8)] {
        &self.slot_ids
    }

    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync) {
        let s = self.bank.slot_mut(slot).expect("every slot has its bank slot");
        if let Some((bp, multiply)) = sync.germinate {
            s.germinate(env, bp, multiply, sync.draws, sync.counter);
        }
        if sync.create_gate {
            s.create_gate(env, sync.draws, sync.counter | 1);
        }
        if sync.reset_momentum {
            s.reset_momentum(env);
        }
        s.state[env] = sync.state;
    }

    fn train_epoch(&mut self, data: &Dataset, batcher: &Batcher) {
        let n_envs = self.n_envs();
        let batch = self.workspace.batch;
        self.trainer.clear_stats();
        self.totals.fill((0.0, 0));
        let n_batches = batcher.sharding().num_train_batches();
        let shape = ClassifierShape { envs: n_envs, batch, classes: self.arch.num_classes };
        for b in 0..n_batches {
            batcher.fill_train(data, b, &mut self.images, &mut self.labels);
            let Self { params, bank, trainer, workspace, .. } = self;
            trainer.step(params, bank, workspace, &self.images, &self.labels, b % TELEMETRY_STRIDE == 0);
            count_correct(shape, &workspace.logits, &self.labels, &mut self.correct);
            for ((loss_sum, right), (&loss, &c)) in
                self.totals.iter_mut().zip(workspace.loss.iter().zip(self.correct.iter()))
            {
                *loss_sum += loss as f64;
                *right += c as u64;
            }
        }
        for (o, &(loss_sum, right)) in self.epoch.iter_mut().zip(&self.totals) {
            *o = EpochTrain {
                loss: loss_sum / n_batches as f64,
                accuracy: 100.0 * right as f64 / (n_batches * batch) as f64,
            };
        }
    }

    /// The main configuration's forward runs in the training workspace (its activations and logits are
    /// the evaluation's afterwards; the next training batch overwrites them).
    fn validate(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals] {
        self.validator.ablate_fossils = plan.ablate_fossils;
        self.validator.plan(&self.bank, plan.fossilized);
        for b in 0..batcher.sharding().num_test_batches() {
            batcher.fill_test(data, b, &mut self.images, &mut self.labels, &mut self.counts);
            let Self { validator, workspace, params, bank, images, labels, counts, .. } = self;
            validator.run_batch(workspace, params, bank, images, labels, counts);
        }
        self.validator.results_into(&mut self.results);
        &self.results
    }

    fn validation_configs(&self, env: usize) -> usize {
        self.validator.configs.get(env).map_or(0, |c| c.masks.len())
    }

    fn epoch_train(&mut self) -> &[EpochTrain] {
        &self.epoch
    }

    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry> {
        let stats = self.trainer.seed_stats[slot][env]?;
        Some(SeedTelemetry { stats, host_norm: self.trainer.host_norm_at_collection[env] })
    }

    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]) {
        let n_slots = self.slot_ids.len();
        assert_eq!(fossils.len(), n_slots, "one entry per slot");
        self.snapshots.params.copy_env_from(&self.params, env);
        for (k, fossil) in fossils.iter().enumerate() {
            let i = env * n_slots + k;
            self.snapshots.fossils[i] = *fossil;
            let row = &mut self.snapshots.rows[i];
            row.clear();
            if let Some(f) = *fossil {
                let slot = self.bank.slots().nth(k).expect("the slot exists");
                row.extend_from_slice(slot.pool(f.blueprint).row(env));
                if f.gate {
                    row.extend_from_slice(slot.gate.row(env));
                }
            }
        }
    }

    fn restore_snapshot(&mut self, env: usize) {
        self.params.copy_env_from(&self.snapshots.params, env);
        let n_slots = self.slot_ids.len();
        for k in 0..n_slots {
            let Some(fossil) = self.snapshots.fossils[env * n_slots + k] else { continue };
            let slot = self.bank.slot_mut(k).expect("the slot exists");
            let pool = slot.pool_mut(fossil.blueprint);
            // The snapshot row is the blueprint row, then the gate row when there is one.
            let (seed, gate) = self.snapshots.rows[env * n_slots + k].split_at(pool.row_len);
            pool.row_mut(env).copy_from_slice(seed);
            if fossil.gate {
                slot.gate.row_mut(env).copy_from_slice(gate);
            }
        }
        // The weights were copied in place, so the reference clears its optimizers (tamiyo §6.5).
        self.trainer.momentum.zero_env(env);
        for slot in self.bank.slots_mut() {
            slot.reset_momentum(env);
        }
    }

    fn reset_round(&mut self, seed: u64, round: u64) {
        let n = self.n_envs();
        self.params = init_params(self.arch, n, seed, round);
        self.bank = SeedBank::new(&self.arch, n, &self.slot_ids);
        self.trainer = Trainer::new(&self.params, &self.bank);
        self.snapshots = SnapshotStore::of(&self.params, &self.bank);
    }

    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        let groups = 1 + self.slot_ids.len();
        assert_eq!(
            (checksums.len(), prints.len()),
            (self.n_envs(), self.n_envs() * groups),
            "[E] and [E, 1 + S]"
        );
        checksums.par_iter_mut().zip(prints.par_chunks_mut(groups)).enumerate().for_each(
            |(env, (checksum, groups))| {
                *checksum = self.env_fingerprint(env, groups);
            },
        );
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each run counts once under its kind; a step without the stage (None) counts nowhere.
    #[test]
    fn graph_counts_count_each_kind_of_run() {
        use GraphUse::*;
        let runs =
            [Some(Launches), Some(Captured), Some(Replayed), Some(Replayed), None, Some(CaptureFailed)];
        let counts = GraphCounts::of(runs);
        assert_eq!(counts, GraphCounts { launches: 1, captured: 1, replayed: 2, capture_failed: 1 });
        let report =
            DeviceReport { train_run: Some(Replayed), validation_run: None, ..DeviceReport::default() };
        assert_eq!(report.epochs_ran(), "epoch replayed, validation –");
    }
}
