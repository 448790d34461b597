//! [`CudaHostBackend`]: the [`HostBackend`] seam on one GPU. The dataset is uploaded once; each training
//! batch is gathered on the device from the epoch's order and augmentation draws (a few bytes per
//! image, computed on the CPU by [`Batcher::train_gather`]); [`DeviceHost`] trains and evaluates the
//! hosts and their seeds ([`DeviceSlot`]: every mode, OFF, INCUBATOR, ADD, MULTIPLY and GATE);
//! validation runs the counterfactual plan the CPU's validator makes, one evaluation pass per
//! configuration index, each from the first slot it switches off (the main pass's activations before
//! it are reused). The epoch's per-env sums and gradient statistics stay on the device until the
//! validation pass's sums are ready, and come back with them: one copy back per step. Governor snapshots
//! are device copies. Seeds are born on the host from the
//! env's own stream, exactly as the CPU backend draws them, and their rows uploaded.

use std::any::Any;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaSlice, CudaView, PinnedHostSlice, PushKernelArg};

use super::epoch_graph::{CapturedEpoch, EpochGraphs, EpochRun, EpochShape, ValidationShape};
use super::host::DeviceHost;
use super::parity::{Device, ParityError, elementwise, per_env_block};
use super::slot::{DeviceSlot, StatsTaken, blueprints};
use crate::data::{Batcher, Dataset, PAD_LABEL};
use crate::host::SeedMode;
use crate::host::train::{SeedGradStats, ValTotals};
use crate::host::{
    DeviceReport, EnvConfigs, EnvCounterfactuals, EpochTrain, FossilRow, GraphUse, HostArch, HostBackend,
    HostParams, ParamPrint, SeedBank, SeedEnvState, SeedTelemetry, SlotSync, TELEMETRY_STRIDE,
    ValidationPassOrder, ValidationPlan, counterfactuals_into, host_fingerprint, plan_env_configs,
};
use crate::seeds::{CnnBlueprint, ParamLayout};

/// The dataset resident on the device, and what it was uploaded from.
struct DeviceData {
    /// What it was uploaded from: a different dataset is uploaded anew.
    source: DataKey,
    train_images: CudaSlice<f32>,
    train_labels: CudaSlice<u8>,
    test_images: CudaSlice<f32>,
    test_labels: CudaSlice<u8>,
    /// Per channel: the value of a padded pixel of the training augmentation.
    fill: CudaSlice<f32>,
    pad: u32,
}

/// What identifies a dataset's upload: its splits' sizes and addresses, and its augmentation.
#[derive(Clone, Debug, PartialEq)]
struct DataKey {
    splits: [(usize, usize); 2],
    fill: Vec<f32>,
    pad: usize,
}

impl DataKey {
    fn splits(data: &Dataset) -> [(usize, usize); 2] {
        let at = |s: &crate::data::Split| (s.images.len(), s.images.as_ptr() as usize);
        [at(&data.train), at(&data.test)]
    }

    fn of(data: &Dataset) -> Self {
        Self { splits: Self::splits(data), fill: data.augment.fill.clone(), pad: data.augment.pad }
    }

    /// `data` is what was uploaded (compared without building a key: this runs at every stage).
    fn matches(&self, data: &Dataset) -> bool {
        self.splits == Self::splits(data) && self.fill == data.augment.fill && self.pad == data.augment.pad
    }
}

/// The hosts and seeds of every env on one GPU.
pub struct CudaHostBackend {
    device: Device,
    arch: HostArch,
    slot_ids: Vec<(u8, u8)>,
    host: DeviceHost,
    /// The seeds' states and birth draws, on the host: each germination is drawn here, exactly as the
    /// CPU backend draws it, and its row uploaded (the rows here are not trained).
    bank: SeedBank<f32>,
    snapshots: Vec<CudaSlice<f32>>,
    /// `[E × S]`: the fossil row each env's snapshot holds at each slot (its row is in the module's
    /// snapshot store on the device).
    snapshot_fossils: Vec<Option<FossilRow>>,
    /// This validation's configurations per env.
    configs: Vec<EnvConfigs>,
    /// The validation passes' order and starts (a tree over the slots' choices where the envs agree),
    /// and every slot's `(block, row)` in the network, in `slot_ids` order.
    pass_order: ValidationPassOrder,
    slot_positions: Vec<(usize, u8)>,
    /// `[slot][env]`: the seeds' gradient health at this epoch's last collection batch (None: not
    /// collected), and per env the host's gradient norm on that batch.
    telemetry: Vec<Vec<Option<SeedGradStats>>>,
    host_norm_at_collection: Vec<f64>,
    data: Option<DeviceData>,
    /// How many times a dataset was uploaded.
    data_uploads: u64,
    /// The training epoch's and the validation pass's CUDA graphs (see [`super::epoch_graph`]).
    graphs: EpochGraphs<EpochShape>,
    validation_graphs: EpochGraphs<ValidationShape>,
    /// The epoch's gather plan, on the host and the device: every batch's `[E·B]` image indices, then
    /// every batch's packed augmentation draws; uploaded in one copy when the epoch starts.
    plan: Vec<u32>,
    plan_dev: CudaSlice<u32>,
    /// The batch: images `[E, B, C, H, W]`, labels `[E, B]`, a test batch's valid rows per env `[E]`.
    images: CudaSlice<f32>,
    labels: CudaSlice<u8>,
    counts: CudaSlice<u32>,
    /// `[2, E]`: per env over the epoch Σ batch losses and Σ correct (a buffer of its own, never
    /// reallocated, so that a captured epoch may add into it).
    epoch_sums: CudaSlice<f64>,
    /// `[2 + 4·P, E]`: the validation's sums — rows `2 + 4j .. 6 + 4j` pass `j`'s correct, total, Σ
    /// batch-mean losses and batches (the layout `data.cu` describes; rows 0, 1 unused). A buffer of its
    /// own, reallocated only to grow with the passes, so that a captured validation may add into it.
    val_sums: CudaSlice<f64>,
    /// The step's read-back, assembled on the device from the buffers above: `[2 + 4·P, E]` (the
    /// epoch's sums in rows 0, 1, then the validation's) and then [`PendingEpoch::stats`].
    sums: CudaSlice<f64>,
    /// The read-back on the host (kept between steps).
    read: Vec<f64>,
    /// The epoch trained but not yet read back (its results arrive with the validation pass's).
    pending: Option<PendingEpoch>,
    /// The last epoch's per-env results, once read back.
    epoch: Vec<EpochTrain>,
    results: Vec<EnvCounterfactuals>,
    /// Timing events around the last training epoch and validation pass.
    train_events: (CudaEvent, CudaEvent),
    validate_events: (CudaEvent, CudaEvent),
    /// Since the last [`HostBackend::take_device_report`]: device→host copies that wait for the device,
    /// and the stages' device time.
    report: DeviceReport,
    /// The read-backs of [`HostBackend::param_fingerprints`] (which only borrows the backend).
    fingerprint_syncs: AtomicU64,
    /// A trace's parameter copies in flight (behind a lock: the trace only borrows the backend).
    queued: Mutex<QueuedFingerprints>,
    /// Each test batch's evaluation runs over as many images per env as its largest share holds, not
    /// the training batch: W16's 625 test images per env are a batch of 512 and one of 113, which
    /// padded to 512 would be 39 % of the validation's work. Off with `ESPER_CUDA_TRIM_TEST=0` (to
    /// measure it); the results are the same bits either way with the f32 implicit or direct
    /// convolutions (cuBLAS, at tf32 / bf16 or `ESPER_CUDA_CONV=im2col`, may sum a smaller matrix in
    /// another order).
    trim_test_batches: bool,
}

/// An epoch whose results are still on the device: what to read back and how to form it.
struct PendingEpoch {
    batches: usize,
    /// The gradient statistics of the epoch's last collection batch, in the order they are appended
    /// to the read-back: the host's per-env squared norm first, then each collected gate and seed.
    stats: Vec<StatBlock>,
    /// Every (slot, env) that collected statistics, and which of `stats` its telemetry is formed from.
    collectors: Vec<Collector>,
}

/// One buffer of squared gradient norms on the device (`[T, E]`, a layout's tensors; `[E]` for the
/// host's total) and its place in the read-back's statistics.
struct StatBlock {
    source: StatSource,
    offset: usize,
    len: usize,
}

#[derive(Clone, Copy)]
enum StatSource {
    Host,
    Gate { slot: usize, layout: ParamLayout },
    Seed { slot: usize, blueprint: CnnBlueprint, layout: ParamLayout },
}

/// An env collecting at a slot: its seed's statistics when it trains the seed, then its gate's when
/// the gate's gradient counts (indices into [`PendingEpoch::stats`]), as the CPU's `collect_seed_stats`.
struct Collector {
    slot: usize,
    env: usize,
    seed: Option<usize>,
    gate: Option<usize>,
}

impl PendingEpoch {
    fn stats_len(&self) -> usize {
        self.stats.last().map_or(0, |b| b.offset + b.len)
    }
}

/// A device failure inside a stage: the seam's operations cannot return one, and a step cannot go on.
fn on_device<T>(result: Result<T, ParityError>) -> T {
    result.unwrap_or_else(|e| panic!("CUDA host backend: {e}"))
}

/// What a trace's checksums read besides the host (see [`CudaHostBackend::fingerprint_plan`]): per
/// slot, each env's seed state, the blueprints some env holds (with their layouts) and, when some env's
/// seed is in GATE mode, the gate's layout.
struct FingerprintPlan {
    slots: Vec<SlotPrintPlan>,
}

/// A slot's planned seed rows `[E, P]` by blueprint, and the gate's.
type SlotRows = (Vec<(CnnBlueprint, Vec<f32>)>, Option<Vec<f32>>);

struct SlotPrintPlan {
    states: Vec<SeedEnvState>,
    seeds: Vec<(CnnBlueprint, ParamLayout)>,
    gate: Option<ParamLayout>,
}

/// A trace's parameter copies in flight ([`HostBackend::queue_param_fingerprints`]): page-locked
/// buffers, and the last queue's plan, the buffer each copied device buffer went to (in source order)
/// and the event recorded after its copies. The buffers are kept for the run and reused by length, so
/// that a change of which seeds are held allocates at most new ones and never frees one mid-run
/// (freeing page-locked memory waits for the device).
#[derive(Default)]
struct QueuedFingerprints {
    pinned: Vec<PinnedHostSlice<f32>>,
    copied: Option<(FingerprintPlan, Vec<usize>, CudaEvent)>,
}

impl CudaHostBackend {
    /// Which seed rows the checksums read now.
    fn fingerprint_plan(&self) -> FingerprintPlan {
        let envs = self.n_envs();
        let slots = self
            .host
            .slots()
            .map(|slot| {
                let states: Vec<SeedEnvState> = (0..envs).map(|e| slot.state(e)).collect();
                let seeds = CnnBlueprint::ALL
                    .into_iter()
                    .filter(|&bp| states.iter().any(|s| s.blueprint == Some(bp)))
                    .map(|bp| (bp, *slot.module(bp).expect("a held blueprint").rows.layout()))
                    .collect();
                let gated = states.iter().any(|s| s.mode == SeedMode::Gate);
                let gate = gated.then(|| *slot.gate().expect("a GATE seed has its gate").rows.layout());
                SlotPrintPlan { states, seeds, gate }
            })
            .collect();
        FingerprintPlan { slots }
    }

    /// The device buffers the checksums read, in order: the host's state ([`DeviceHost::state`]), then
    /// per slot each planned blueprint's parameter tensors and the gate's.
    fn fingerprint_sources(&self, plan: &FingerprintPlan) -> Vec<CudaView<'_, f32>> {
        let mut sources: Vec<CudaView<'_, f32>> = self.host.state().map(|t| t.slice(..)).collect();
        for (slot, p) in self.host.slots().zip(&plan.slots) {
            for (bp, _) in &p.seeds {
                sources.extend(slot.module(*bp).expect("a held blueprint").rows.param_tensors());
            }
            if p.gate.is_some() {
                sources.extend(slot.gate().expect("a GATE seed has its gate").rows.param_tensors());
            }
        }
        sources
    }

    /// [`HostBackend::param_fingerprints`] from `values`, the buffers of [`Self::fingerprint_sources`]
    /// for `plan` on the host: each env's host rows, then per slot its seed's row and, in GATE mode, its
    /// gate row, as the CPU backend hashes them.
    fn fingerprints_from(
        &self,
        plan: &FingerprintPlan,
        values: &[&[f32]],
        checksums: &mut [u64],
        prints: &mut [ParamPrint],
    ) {
        let (envs, groups) = (self.n_envs(), 1 + self.slot_ids.len());
        assert_eq!((checksums.len(), prints.len()), (envs, envs * groups), "[E] and [E, 1 + S]");
        let mut params = HostParams::zeros(self.arch, envs);
        let mut values = values.iter();
        {
            let HostParams { weights, running_mean, running_var, .. } = &mut params;
            let rows =
                weights.tensors.iter_mut().chain(running_mean.iter_mut()).chain(running_var.iter_mut());
            for dst in rows {
                dst.copy_from_slice(values.next().expect("a host buffer"));
            }
        }
        // Each module's tensors, one after another, back into rows `[E, P]`.
        let mut rows_of_module = |layout: &ParamLayout| {
            let tensor_major: Vec<f32> = layout
                .tensors()
                .iter()
                .flat_map(|_| values.next().expect("a module tensor").iter().copied())
                .collect();
            crate::cuda::rows::rows_of(layout, envs, &tensor_major)
        };
        let slots: Vec<SlotRows> = plan
            .slots
            .iter()
            .map(|p| {
                let seeds = p.seeds.iter().map(|(bp, layout)| (*bp, rows_of_module(layout))).collect();
                (seeds, p.gate.as_ref().map(&mut rows_of_module))
            })
            .collect();
        assert!(values.next().is_none(), "every copied buffer is hashed");
        for (env, (checksum, prints)) in checksums.iter_mut().zip(prints.chunks_mut(groups)).enumerate() {
            prints.fill(ParamPrint::default());
            let mut hash = host_fingerprint(&params, env, &mut prints[0]);
            for ((p, (seeds, gate)), print) in plan.slots.iter().zip(&slots).zip(&mut prints[1..]) {
                let state = p.states[env];
                let Some(bp) = state.blueprint else { continue };
                let rows = &seeds.iter().find(|(b, _)| *b == bp).expect("planned above").1;
                let n = rows.len() / envs;
                hash = print.add_hashed(hash, &rows[env * n..(env + 1) * n]);
                if state.mode == SeedMode::Gate {
                    let rows = gate.as_ref().expect("planned above");
                    let n = rows.len() / envs;
                    hash = print.add_hashed(hash, &rows[env * n..(env + 1) * n]);
                }
            }
            *checksum = hash;
        }
    }
}

impl CudaHostBackend {
    /// Fresh hosts on `device` ([`Device::open`]) for round `round` of run `seed`: `n_envs` envs of
    /// `batch` images per batch, initialised exactly as [`crate::host::CpuHostBackend`] initialises them.
    pub fn new(
        device: Device,
        arch: HostArch,
        slot_ids: &[(u8, u8)],
        n_envs: usize,
        batch: usize,
        seed: u64,
        round: u64,
    ) -> Result<Self, ParityError> {
        let params = crate::host::backend::init_params(arch, n_envs, seed, round);
        let host = DeviceHost::upload(&device, &params, slot_ids, batch)?;
        let snapshots = host.snapshot(&device)?;
        let bank = SeedBank::new(&arch, n_envs, slot_ids);
        let stream = &device.stream;
        let slots = n_envs * batch;
        Ok(Self {
            arch,
            slot_ids: slot_ids.to_vec(),
            snapshots,
            bank,
            snapshot_fossils: vec![None; n_envs * slot_ids.len()],
            configs: Vec::new(),
            pass_order: ValidationPassOrder::default(),
            slot_positions: slot_ids.iter().map(|&(row, col)| (col as usize, row)).collect(),
            telemetry: vec![vec![None; n_envs]; slot_ids.len()],
            host_norm_at_collection: vec![0.0; n_envs],
            data: None,
            data_uploads: 0,
            graphs: EpochGraphs::new(true),
            validation_graphs: EpochGraphs::new(true),
            plan: Vec::new(),
            plan_dev: stream.alloc_zeros::<u32>(1)?,
            images: stream.alloc_zeros::<f32>(slots * arch.image_len())?,
            labels: stream.alloc_zeros::<u8>(slots)?,
            counts: stream.alloc_zeros::<u32>(n_envs)?,
            epoch_sums: stream.alloc_zeros::<f64>(2 * n_envs)?,
            val_sums: stream.alloc_zeros::<f64>(6 * n_envs)?,
            sums: stream.alloc_zeros::<f64>(6 * n_envs)?,
            read: Vec::new(),
            pending: None,
            epoch: vec![EpochTrain::default(); n_envs],
            results: Vec::new(),
            train_events: (timing_event(&device)?, timing_event(&device)?),
            validate_events: (timing_event(&device)?, timing_event(&device)?),
            report: DeviceReport::default(),
            fingerprint_syncs: AtomicU64::new(0),
            queued: Mutex::new(QueuedFingerprints::default()),
            trim_test_batches: std::env::var("ESPER_CUDA_TRIM_TEST").map_or(true, |v| v != "0"),
            host,
            device,
        })
    }

    /// Uploads `data` unless it is what the device holds.
    fn ensure_data(&mut self, data: &Dataset) -> Result<(), ParityError> {
        if self.data.as_ref().is_some_and(|d| d.source.matches(data)) {
            return Ok(());
        }
        let source = DataKey::of(data);
        assert_eq!(data.image_len(), self.arch.image_len(), "the dataset's images are not the host's");
        // A label is an index into a row of logits on the device.
        assert!(data.num_classes <= self.arch.num_classes, "the dataset has more classes than the head");
        assert!(data.augment.pad < 128, "crop padding {} does not fit the packed draw", data.augment.pad);
        let stream = &self.device.stream;
        self.data_uploads += 1;
        self.data = Some(DeviceData {
            source,
            train_images: stream.clone_htod(&data.train.images)?,
            train_labels: stream.clone_htod(&data.train.labels)?,
            test_images: stream.clone_htod(&data.test.images)?,
            test_labels: stream.clone_htod(&data.test.labels)?,
            fill: stream.clone_htod(&data.augment.fill)?,
            pad: data.augment.pad as u32,
        });
        Ok(())
    }

    fn train_epoch_on_device(&mut self, data: &Dataset, batcher: &Batcher) -> Result<(), ParityError> {
        self.ensure_data(data)?;
        let (envs, batch) = self.host.shape();
        let stream = self.device.stream.clone();
        self.train_events.0.record(&stream)?;
        stream.memset_zeros(&mut self.epoch_sums)?;
        let sharding = batcher.sharding();
        assert_eq!(
            (sharding.n_envs, sharding.batch_per_env),
            (envs, batch),
            "the batcher's envs and batch are the backend's"
        );
        let slots = envs * batch;
        let n_batches = sharding.num_train_batches();
        // The whole epoch's plan in one copy (a pageable copy may wait for the device: once per epoch,
        // not once per batch).
        let per_epoch = n_batches * slots;
        self.plan.resize(2 * per_epoch, 0);
        let (index, draw) = self.plan.split_at_mut(per_epoch);
        for (b, (index, draw)) in index.chunks_mut(slots).zip(draw.chunks_mut(slots)).enumerate() {
            batcher.train_gather(data, b, index, draw);
        }
        if self.plan_dev.len() < self.plan.len() {
            self.plan_dev = stream.alloc_zeros::<u32>(self.plan.len())?;
        }
        stream.memcpy_htod(self.plan.as_slice(), &mut self.plan_dev.slice_mut(..2 * per_epoch))?;
        // The slots' per-env controls go up now, outside any capture.
        self.host.prepare_slots(&self.device)?;
        let shape = EpochShape {
            batches: n_batches,
            plan_len: self.plan_dev.len(),
            data_uploads: self.data_uploads,
            slots: self.host.slots().map(DeviceSlot::launch_key).collect(),
        };
        let run = |b: &mut Self| {
            // Statistics are kept only for slots with a collection batch this epoch (Trainer::clear_stats;
            // host-side only: nothing launches, so it may run inside a capture).
            for k in 0..b.slot_ids.len() {
                b.host.slot_mut(k).expect("every slot id has its slot").clear_stats();
            }
            b.epoch_batches(data, n_batches)
        };
        let notes = |b: &Self| b.host.slots().map(|slot| slot.taken).collect();
        let (used, kept) = self.run_stage(|b| &mut b.graphs, shape, "training epoch", &run, notes)?;
        if let Some(stats) = kept {
            // What the epoch's host code would have noted (the replay ran none of it).
            for (k, taken) in stats.iter().enumerate() {
                self.host.slot_mut(k).expect("every slot id has its slot").taken = *taken;
            }
        }
        self.report.train_run = Some(used);
        // Nothing is read back here: the sums and statistics come back with the validation pass's.
        self.train_events.1.record(&stream)?;
        self.pending = Some(self.pending_epoch(n_batches));
        Ok(())
    }

    /// The epoch's batches, launch by launch: each gathered from the uploaded plan, trained, counted
    /// and added into the epoch's sums. Copies nothing from the host, so it can be captured.
    fn epoch_batches(&mut self, data: &Dataset, n_batches: usize) -> Result<(), ParityError> {
        let (envs, batch) = self.host.shape();
        let slots = envs * batch;
        let per_epoch = n_batches * slots;
        let stream = self.device.stream.clone();
        let d = self.data.as_ref().expect("uploaded before the epoch");
        let slots32 = slots as u32;
        let (channels, height, width) = (data.channels as u32, data.height as u32, data.width as u32);
        let image_values = self.images.len();
        for b in 0..n_batches {
            let index = self.plan_dev.slice(b * slots..(b + 1) * slots);
            let draw = self.plan_dev.slice(per_epoch + b * slots..per_epoch + (b + 1) * slots);
            let mut launch = stream.launch_builder(self.device.function("gather_train_f32"));
            launch.arg(&d.train_images).arg(&d.train_labels).arg(&index).arg(&draw);
            launch.arg(&d.fill).arg(&mut self.images).arg(&mut self.labels);
            launch.arg(&slots32).arg(&channels).arg(&height).arg(&width).arg(&d.pad);
            unsafe { launch.launch(elementwise(image_values)) }?;

            let collect = b % TELEMETRY_STRIDE == 0;
            self.host.train_step(&self.device, &self.images, &self.labels, collect)?;
            self.host.count_correct(&self.device, &self.labels)?;
            let envs32 = envs as u32;
            let mut launch = stream.launch_builder(self.device.function("train_epoch_accumulate"));
            launch.arg(self.host.losses_on_device()).arg(self.host.correct_counts());
            launch.arg(&mut self.epoch_sums).arg(&envs32);
            unsafe { launch.launch(elementwise(envs)) }?;
        }
        Ok(())
    }

    /// The validation pass's batches, launch by launch: each test batch gathered and split over the
    /// envs, then every configuration pass in `shape.order` from its start, each added into its rows
    /// of the read-back. Copies nothing from the host, so it can be captured.
    fn validation_batches(&mut self, shape: &ValidationShape) -> Result<(), ParityError> {
        let result = self.validation_batches_trimmed(shape);
        // The launches that follow (training) run the whole batch, whatever happened.
        let (_, batch) = self.host.shape();
        self.host.set_rows(batch);
        result
    }

    /// [`Self::validation_batches`]' launches, each test batch over its rows ([`Self::trim_test_batches`]),
    /// leaving the host at the last batch's.
    fn validation_batches_trimmed(&mut self, shape: &ValidationShape) -> Result<(), ParityError> {
        let (envs, batch) = self.host.shape();
        let stream = self.device.stream.clone();
        let d = self.data.as_ref().expect("uploaded before the pass");
        let combined = envs * batch;
        let envs32 = envs as u32;
        let (image_len, classes) = (self.arch.image_len() as u32, self.arch.num_classes as u32);
        debug_assert_eq!(PAD_LABEL, 255, "gather_test_f32 pads with label 255");
        for b in 0..shape.test_batches {
            let first = (b * combined) as u64;
            let len = combined.min(shape.n_test - first as usize);
            // The envs' shares of the batch differ by at most one image (Sharding::test_chunk): the
            // largest is ⌈len / E⌉, and the batch's evaluation runs over that many rows per env.
            let rows = if self.trim_test_batches { len.div_ceil(envs).clamp(1, batch) } else { batch };
            self.host.set_rows(rows);
            let (rows32, len32) = (rows as u32, len as u32);
            let mut launch = stream.launch_builder(self.device.function("gather_test_f32"));
            launch.arg(&d.test_images).arg(&d.test_labels).arg(&mut self.images).arg(&mut self.labels);
            launch.arg(&mut self.counts).arg(&first).arg(&len32).arg(&envs32).arg(&rows32).arg(&image_len);
            unsafe { launch.launch(elementwise(envs * rows * self.arch.image_len())) }?;

            for &(j, start) in &shape.order {
                self.host.forward_eval_from(&self.device, &self.images, &self.labels, j, start)?;
                // The kernel adds into rows 2..6 of its view: pass j's rows are 2 + 4j .. 6 + 4j.
                let mut sums = self.val_sums.slice_mut(4 * j * envs..);
                let mut launch = stream.launch_builder(self.device.function("validation_accumulate_f32"));
                launch.arg(self.host.logits_on_device()).arg(&self.labels).arg(&self.counts);
                launch.arg(&mut sums).arg(&envs32).arg(&rows32).arg(&classes);
                unsafe { launch.launch(per_env_block(envs)) }?;
            }
        }
        Ok(())
    }

    /// Runs one stage's launches (`run`: the training epoch's or the validation pass's) as its graphs
    /// (`graphs`) say for `shape`: replayed from a kept graph (returning what the stage's host code
    /// noted when it was captured), captured and launched (keeping `notes` of it), or launch by launch
    /// — also when a capture fails, which turns that stage's graphs off (one line on stderr).
    fn run_stage<S: Clone + PartialEq>(
        &mut self,
        graphs: fn(&mut Self) -> &mut EpochGraphs<S>,
        shape: S,
        what: &str,
        run: &dyn Fn(&mut Self) -> Result<(), ParityError>,
        notes: impl Fn(&Self) -> Vec<StatsTaken>,
    ) -> Result<(GraphUse, Option<Vec<StatsTaken>>), ParityError> {
        match graphs(self).plan(&shape) {
            EpochRun::Eager => {
                run(self)?;
                Ok((GraphUse::Launches, None))
            }
            EpochRun::Replay => {
                let kept = graphs(self).launch()?.to_vec();
                Ok((GraphUse::Replayed, Some(kept)))
            }
            EpochRun::Capture => match self.capture(|b| run(b)) {
                Ok(graph) => {
                    graph.launch()?;
                    let kept = notes(self);
                    graphs(self).store(CapturedEpoch::new(shape, graph, kept));
                    Ok((GraphUse::Captured, None))
                }
                Err(why) => {
                    // Nothing captured ran: this one runs launch by launch, and so do the next ones.
                    eprintln!(
                        "esper-ecs: capturing the {what} into a CUDA graph failed ({why}); it runs launch by \
                         launch from now on"
                    );
                    graphs(self).fail(why.to_string());
                    run(self)?;
                    Ok((GraphUse::CaptureFailed, None))
                }
            },
        }
    }

    /// Captures what `run` launches into a graph (nothing runs: the caller launches the graph). The
    /// capture is ended whatever happens inside it.
    fn capture(
        &mut self,
        run: impl FnOnce(&mut Self) -> Result<(), ParityError>,
    ) -> Result<cudarc::driver::CudaGraph, ParityError> {
        let stream = self.device.stream.clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = run(self);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        if captured.is_err() || graph.is_err() {
            // cudarc's end_capture first returns any error it stored earlier (from code that cannot
            // return one), without ending the capture: end it here, so that the work can run without
            // one. On a stream no longer capturing this fails, harmlessly.
            // Safety: the stream is this device's, alive; a graph it returns is ours to destroy.
            unsafe {
                if let Ok(raw) = cudarc::driver::result::stream::end_capture(stream.cu_stream())
                    && !raw.is_null()
                {
                    let _ = cudarc::driver::result::graph::destroy(raw);
                }
            }
        }
        captured?;
        Ok(graph?.ok_or("the capture recorded no work")?)
    }

    /// Short test batches evaluated over their rows only (`on`, the default) or padded to the training
    /// batch (`ESPER_CUDA_TRIM_TEST=0`): the same bits either way with the f32 implicit or direct
    /// convolutions.
    pub fn set_trim_test_batches(&mut self, on: bool) {
        self.trim_test_batches = on;
    }

    /// The host's fused passes on (the default) or off (`ESPER_CUDA_FUSE=0`): [`DeviceHost::set_fuse`].
    pub fn set_fuse(&mut self, on: bool) {
        self.host.set_fuse(on);
    }

    /// The host's and seeds' 3×3 convolutions at f32 on the direct kernels or not
    /// ([`DeviceHost::set_direct_conv`]); before the first epoch.
    pub(super) fn set_direct_conv(&mut self, on: bool) {
        self.host.set_direct_conv(on);
    }

    /// Whether training epochs and validation passes may run from CUDA graphs (on by default; the
    /// selftest compares both).
    pub fn set_graphs(&mut self, enabled: bool) {
        self.graphs.set_enabled(enabled);
        self.validation_graphs.set_enabled(enabled);
    }

    /// Why graphs were turned off, if a capture failed.
    pub fn graph_failure(&self) -> Option<&str> {
        self.graphs.failure().or(self.validation_graphs.failure())
    }

    /// What the epoch that just ended leaves to read back: the slots' statistics of its last
    /// collection batch, as the CPU's `collect_seed_stats` forms them — for each env collecting at a
    /// slot, its blueprint's per-tensor norms when it trains the seed, then its gate's.
    fn pending_epoch(&self, batches: usize) -> PendingEpoch {
        let envs = self.n_envs();
        let mut stats = Vec::new();
        let mut collectors = Vec::new();
        let push = |stats: &mut Vec<StatBlock>, source: StatSource, len: usize| {
            let offset = stats.last().map_or(0, |b: &StatBlock| b.offset + b.len);
            stats.push(StatBlock { source, offset, len });
            stats.len() - 1
        };
        let slots: Vec<&DeviceSlot> = self.host.slots().collect();
        if slots.iter().any(|s| s.taken.took_stats) {
            push(&mut stats, StatSource::Host, envs);
        }
        for (k, slot) in slots.iter().enumerate() {
            if !slot.taken.took_stats {
                continue;
            }
            let gate = match (slot.taken.gate_collected, slot.gate()) {
                (true, Some(gate)) => {
                    let layout = *gate.rows.layout();
                    Some(push(
                        &mut stats,
                        StatSource::Gate { slot: k, layout },
                        layout.tensors().len() * envs,
                    ))
                }
                _ => None,
            };
            let seeds: Vec<(CnnBlueprint, usize)> = blueprints(slot.taken.collected)
                .map(|blueprint| {
                    let module = slot.module(blueprint).expect("a collected blueprint has its module");
                    let layout = *module.rows.layout();
                    let source = StatSource::Seed { slot: k, blueprint, layout };
                    (blueprint, push(&mut stats, source, layout.tensors().len() * envs))
                })
                .collect();
            for env in 0..envs {
                let st = slot.state(env);
                let Some(bp) = st.blueprint.filter(|_| st.collect_stats) else { continue };
                let seed = st.train_seed.then(|| {
                    seeds.iter().find(|(b, _)| *b == bp).expect("a training collector was collected").1
                });
                let gate = st.gate_grad.then(|| gate.expect("a collecting gate was collected"));
                collectors.push(Collector { slot: k, env, seed, gate });
            }
        }
        PendingEpoch { batches, stats, collectors }
    }

    /// The step's one copy back: the epoch's sums (`[2, E]`), `validation` more values after them (the
    /// validation pass's, from [`Self::val_sums`]), and the pending epoch's gradient statistics, all
    /// gathered into the read-back on the device first, then into [`Self::read`]. Forms the epoch's
    /// results and telemetry when an epoch is pending.
    fn read_back(&mut self, validation: usize) -> Result<(), ParityError> {
        let envs = self.n_envs();
        let stats_at = (2 * envs) + validation;
        let pending = self.pending.take();
        let stats_len = pending.as_ref().map_or(0, PendingEpoch::stats_len);
        let stream = self.device.stream.clone();
        if self.sums.len() < stats_at + stats_len {
            self.sums = stream.alloc_zeros::<f64>(stats_at + stats_len)?;
        }
        if pending.is_some() {
            stream.memcpy_dtod(&self.epoch_sums, &mut self.sums.slice_mut(..2 * envs))?;
        }
        if validation > 0 {
            stream.memcpy_dtod(
                &self.val_sums.slice(2 * envs..stats_at),
                &mut self.sums.slice_mut(2 * envs..stats_at),
            )?;
        }
        for block in pending.iter().flat_map(|p| &p.stats) {
            let mut to = self.sums.slice_mut(stats_at + block.offset..stats_at + block.offset + block.len);
            match block.source {
                StatSource::Host => stream.memcpy_dtod(self.host.sq_norms_collected(), &mut to)?,
                StatSource::Gate { slot, .. } => {
                    let slot = self.host.slots().nth(slot).expect("the slot exists");
                    stream.memcpy_dtod(&slot.gate().expect("a collected gate").rows.stat_sq, &mut to)?
                }
                StatSource::Seed { slot, blueprint, .. } => {
                    let slot = self.host.slots().nth(slot).expect("the slot exists");
                    let module = slot.module(blueprint).expect("a collected blueprint has its module");
                    stream.memcpy_dtod(&module.rows.stat_sq, &mut to)?
                }
            }
        }
        // Into pageable memory: returns once the copy is done.
        let mut read = std::mem::take(&mut self.read);
        read.resize(stats_at + stats_len, 0.0);
        stream.memcpy_dtoh(&self.sums.slice(..stats_at + stats_len), read.as_mut_slice())?;
        self.report.syncs += 1;
        if let Some(pending) = pending {
            self.report.train_ms += self.train_events.0.elapsed_ms(&self.train_events.1)? as f64;
            self.form_epoch(&pending, &read[..2 * envs], &read[stats_at..]);
        }
        self.read = read;
        Ok(())
    }

    /// The epoch's per-env results from its sums, and the seeds' telemetry from its statistics.
    fn form_epoch(&mut self, pending: &PendingEpoch, sums: &[f64], stats: &[f64]) {
        let envs = self.n_envs();
        let (_, batch) = self.host.shape();
        let (loss_sum, right) = sums.split_at(envs);
        for ((o, &loss_sum), &right) in self.epoch.iter_mut().zip(loss_sum).zip(right) {
            *o = EpochTrain {
                loss: loss_sum / pending.batches as f64,
                accuracy: 100.0 * right / (pending.batches * batch) as f64,
            };
        }
        for slot in &mut self.telemetry {
            slot.fill(None);
        }
        // The host's norm is kept from the last epoch that collected (as the CPU's trainer keeps it).
        if let Some(host) = pending.stats.iter().find(|b| matches!(b.source, StatSource::Host)) {
            for (norm, sq) in self.host_norm_at_collection.iter_mut().zip(&stats[host.offset..]) {
                *norm = sq.sqrt();
            }
        }
        for c in &pending.collectors {
            let mut norms = Vec::new();
            for block in [c.seed, c.gate].into_iter().flatten().map(|i| &pending.stats[i]) {
                let (StatSource::Gate { layout, .. } | StatSource::Seed { layout, .. }) = block.source else {
                    unreachable!("a collector reads a gate's or a seed's statistics")
                };
                for (t, spec) in layout.tensors().iter().enumerate() {
                    norms.push((stats[block.offset + t * envs + c.env].sqrt(), spec.len));
                }
            }
            self.telemetry[c.slot][c.env] = Some(SeedGradStats::from_tensor_norms(&norms));
        }
    }

    fn validate_on_device(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> Result<(), ParityError> {
        self.ensure_data(data)?;
        let (envs, batch) = self.host.shape();
        let stream = self.device.stream.clone();
        self.validate_events.0.record(&stream)?;
        // The counterfactual plan, as the CPU's validator makes it; pass j evaluates every env's j-th
        // configuration (an env with fewer has that pass's rows ignored), each slot off where that
        // configuration's mask says so.
        plan_env_configs(envs, &self.bank, plan.fossilized, plan.ablate_fossils, &mut self.configs);
        let passes = self.configs.iter().map(|c| c.masks.len()).max().unwrap_or(1).max(1);
        for k in 0..self.slot_ids.len() {
            let configs = &self.configs;
            let off = |j: usize, e: usize| configs[e].masks.get(j).is_some_and(|m| m & (1 << k) != 0);
            self.host.slot_mut(k).expect("every slot id has its slot").plan_eval(
                &self.device,
                passes,
                off,
            )?;
        }
        // The passes' order and starts: each from the latest slot whose stored input its own choices
        // made (a pass rewrites only what lies after its start), as a tree over the slots' choices
        // where the envs agree (ValidationPassOrder).
        let order = self.pass_order.plan(&self.configs, &self.slot_positions).to_vec();
        // Four rows per pass, after two unused (where the read-back has the epoch's).
        let needed = (2 + 4 * passes) * envs;
        if self.val_sums.len() < needed {
            self.val_sums = stream.alloc_zeros::<f64>(needed)?;
        }
        stream.memset_zeros(&mut self.val_sums.slice_mut(2 * envs..needed))?;
        let sharding = batcher.sharding();
        assert_eq!(
            (sharding.n_envs, sharding.batch_per_env),
            (envs, batch),
            "the batcher's envs and batch are the backend's"
        );
        let shape = ValidationShape {
            test_batches: sharding.num_test_batches(),
            n_test: sharding.n_test,
            order,
            sums_len: self.val_sums.len(),
            data_uploads: self.data_uploads,
            slots: self.host.slots().map(DeviceSlot::eval_launch_key).collect(),
            trim_test_batches: self.trim_test_batches,
        };
        let run = |b: &mut Self| b.validation_batches(&shape);
        let (used, _) = self.run_stage(
            |b| &mut b.validation_graphs,
            shape.clone(),
            "validation pass",
            &run,
            |_| Vec::new(),
        )?;
        self.report.validation_run = Some(used);
        // The step's one read-back: the pass's sums, with the epoch's.
        self.validate_events.1.record(&stream)?;
        self.read_back(needed - 2 * envs)?;
        let sums = &self.read[2 * envs..needed];
        self.report.validate_ms += self.validate_events.0.elapsed_ms(&self.validate_events.1)? as f64;
        // Every env's configurations in order, as the CPU's validator counts its virtual envs.
        let virtual_envs: usize = self.configs.iter().map(|c| c.masks.len()).sum();
        let mut totals = ValTotals::new(virtual_envs);
        let mut v = 0;
        for (e, c) in self.configs.iter().enumerate() {
            for j in 0..c.masks.len() {
                let row = |r: usize| sums[(4 * j + r) * envs + e];
                totals.correct[v] = row(0) as u64;
                totals.total[v] = row(1) as u64;
                totals.loss_sum[v] = row(2);
                totals.batches[v] = row(3) as u64;
                v += 1;
            }
        }
        counterfactuals_into(&self.configs, &totals, &mut self.results);
        Ok(())
    }
}

/// An event that records time (cudarc's default disables timing).
fn timing_event(device: &Device) -> Result<CudaEvent, ParityError> {
    Ok(device.stream.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
}

impl HostBackend for CudaHostBackend {
    fn arch(&self) -> HostArch {
        self.arch
    }

    fn n_envs(&self) -> usize {
        self.host.shape().0
    }

    fn slot_ids(&self) -> &[(u8, u8)] {
        &self.slot_ids
    }

    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync) {
        let s = self.bank.slot_mut(slot).expect("every slot has its bank slot");
        let device_slot = self.host.slot_mut(slot).expect("every slot id has its device slot");
        if let Some((bp, multiply)) = sync.germinate {
            // Drawn on the host from the env's own stream, exactly as the CPU backend draws it.
            s.germinate(env, bp, multiply, sync.draws, sync.counter);
            on_device(device_slot.germinate(&self.device, env, bp, s.pool(bp).row(env)));
        }
        if sync.create_gate {
            s.create_gate(env, sync.draws, sync.counter | 1);
            on_device(device_slot.create_gate(&self.device, env, s.gate.row(env)));
        }
        if sync.reset_momentum {
            s.reset_momentum(env);
            on_device(device_slot.reset_momentum(&self.device, env));
        }
        s.state[env] = sync.state;
        device_slot.set_state(env, sync.state);
    }

    fn train_epoch(&mut self, data: &Dataset, batcher: &Batcher) {
        on_device(self.train_epoch_on_device(data, batcher));
    }

    fn epoch_train(&mut self) -> &[EpochTrain] {
        if self.pending.is_some() {
            // No validation pass since the epoch: its results come back alone.
            on_device(self.read_back(0));
        }
        &self.epoch
    }

    fn validate(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals] {
        on_device(self.validate_on_device(data, batcher, plan));
        &self.results
    }

    fn validation_configs(&self, env: usize) -> usize {
        self.configs.get(env).map_or(0, |c| c.masks.len())
    }

    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry> {
        if self.pending.is_some() {
            on_device(self.read_back(0));
        }
        let stats = self.telemetry[slot][env]?;
        Some(SeedTelemetry { stats, host_norm: self.host_norm_at_collection[env] })
    }

    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]) {
        let n_slots = self.slot_ids.len();
        assert_eq!(fossils.len(), n_slots, "one entry per slot");
        on_device(self.host.save_env(&self.device, env, &mut self.snapshots));
        for (k, fossil) in fossils.iter().enumerate() {
            self.snapshot_fossils[env * n_slots + k] = *fossil;
            if let Some(f) = fossil {
                let slot = self.host.slot_mut(k).expect("the slot exists");
                let module = slot.module_mut(f.blueprint).expect("a fossil's blueprint has its module");
                on_device(module.rows.save_env_row(&self.device, env));
                if f.gate {
                    let gate = slot.gate_mut().expect("a gated fossil has its gate");
                    on_device(gate.rows.save_env_row(&self.device, env));
                }
            }
        }
    }

    fn restore_snapshot(&mut self, env: usize) {
        on_device(self.host.restore_env(&self.device, env, &self.snapshots));
        let n_slots = self.slot_ids.len();
        for k in 0..n_slots {
            let slot = self.host.slot_mut(k).expect("the slot exists");
            if let Some(f) = self.snapshot_fossils[env * n_slots + k] {
                let module = slot.module_mut(f.blueprint).expect("a fossil's blueprint has its module");
                on_device(module.rows.restore_env_row(&self.device, env));
                if f.gate {
                    let gate = slot.gate_mut().expect("a gated fossil has its gate");
                    on_device(gate.rows.restore_env_row(&self.device, env));
                }
            }
            // The reference clears its optimizers after a rollback (tamiyo §6.5).
            on_device(slot.reset_momentum(&self.device, env));
            self.bank.slot_mut(k).expect("the slot exists").reset_momentum(env);
        }
    }

    fn reset_round(&mut self, seed: u64, round: u64) {
        // An epoch not yet read back is the old round's last: its results are read before they go.
        if self.pending.is_some() {
            on_device(self.read_back(0));
        }
        let envs = self.n_envs();
        let params = crate::host::backend::init_params(self.arch, envs, seed, round);
        on_device(self.host.upload_params(&self.device, &params));
        self.snapshots = on_device(self.host.snapshot(&self.device));
        self.bank = SeedBank::new(&self.arch, envs, &self.slot_ids);
        self.snapshot_fossils.fill(None);
        for slot in &mut self.telemetry {
            slot.fill(None);
        }
        self.host_norm_at_collection.fill(0.0);
        for k in 0..self.slot_ids.len() {
            let slot = self.host.slot_mut(k).expect("the slot exists");
            for env in 0..envs {
                slot.set_state(env, SeedEnvState::default());
            }
        }
    }

    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        let plan = self.fingerprint_plan();
        // Copies of every buffer; the first waits for the device, the rest find it idle.
        self.fingerprint_syncs.fetch_add(1, Ordering::Relaxed);
        let values: Vec<Vec<f32>> = self
            .fingerprint_sources(&plan)
            .iter()
            .map(|src| on_device(self.device.stream.clone_dtoh(src).map_err(Into::into)))
            .collect();
        let values: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
        self.fingerprints_from(&plan, &values, checksums, prints);
    }

    fn fingerprints_wait(&self) -> bool {
        true
    }

    fn queue_param_fingerprints(&self) {
        let plan = self.fingerprint_plan();
        let sources = self.fingerprint_sources(&plan);
        let mut queue = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let ctx = self.device.stream.context().clone();
        let mut used = vec![false; queue.pinned.len()];
        let mut targets = Vec::with_capacity(sources.len());
        for src in &sources {
            let free = (0..queue.pinned.len()).find(|&i| !used[i] && queue.pinned[i].len() == src.len());
            let i = match free {
                Some(i) => i,
                None => {
                    // Page-locked (the copy runs without the host), not write-combined (the host reads it).
                    // Safety: every value is written by the copy below before it is read.
                    let buffer = unsafe { ctx.alloc_pinned_with_flags::<f32>(src.len(), 0) };
                    queue.pinned.push(on_device(buffer.map_err(Into::into)));
                    used.push(false);
                    queue.pinned.len() - 1
                }
            };
            used[i] = true;
            on_device(self.device.stream.memcpy_dtoh(src, &mut queue.pinned[i]).map_err(Into::into));
            targets.push(i);
        }
        let done = on_device(self.device.stream.record_event(None).map_err(Into::into));
        queue.copied = Some((plan, targets, done));
    }

    fn queued_param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        let mut queue = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        let Some((plan, targets, done)) = queue.copied.take() else {
            drop(queue);
            return self.param_fingerprints(checksums, prints);
        };
        if !done.is_complete() {
            // Not finished with a later read-back (the run's last step): this read waits.
            self.fingerprint_syncs.fetch_add(1, Ordering::Relaxed);
        }
        let values: Vec<&[f32]> =
            targets.iter().map(|&i| on_device(queue.pinned[i].as_slice().map_err(Into::into))).collect();
        self.fingerprints_from(&plan, &values, checksums, prints);
    }

    fn peek_device_report(&self) -> Option<DeviceReport> {
        let syncs = self.report.syncs + self.fingerprint_syncs.load(Ordering::Relaxed);
        Some(DeviceReport { syncs, ..self.report })
    }

    fn take_device_report(&mut self) -> Option<DeviceReport> {
        let mut report = std::mem::take(&mut self.report);
        report.syncs += self.fingerprint_syncs.swap(0, Ordering::Relaxed);
        Some(report)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
