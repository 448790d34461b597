//! `esper-ecs bench` (and `benches/throughput.rs`): the throughput of one step at several env counts,
//! in three tiers as Isaac Lab reports them.
//!
//! 1. **train**: host training only (the TrainHosts system).
//! 2. **+ validate & policy**: + fused validation with its counterfactual configurations, Observe and
//!    the policy's decision (inference).
//! 3. **full loop**: + Reward, Act, Tick and Record — the whole step. The policy update joins this
//!    tier with the learned policy.
//!
//! The workload is fixed: synthetic data sized so that every env count runs `train_batches` batches of
//! `batch_per_env` images per env per step and one validation pass over `test_per_env` images per
//! env, and a forced lifecycle state restored before every step outside the timing, so each step has
//! the same number of counterfactual configurations whatever the policy did: by default three
//! BLENDING seeds (conv_light at the first enabled slot, attention at the second, conv_heavy at the
//! third; ADD, held at alpha 0.5) in every env under the heuristic policy, or with `--seeds none` every
//! slot empty under the static policy (the bare host's step). Each measurement is `warmup` unmeasured steps, then
//! `reps` timed steps; the table shows the median and the spread (min–max).
//!
//! Tier 3 runs as five schedules in the step's order — the host part (TrainHosts, Validate), Observe,
//! Decide, Reward, Act … Record — timed separately: the epoch boundary's (Observe … Record) host time
//! per step is reported at every env count with its growth from 16 to 256 envs, the Observe set's time
//! per step and per env, and the Reward set's time with its share of the whole step.

use crate::config::{DataKind, PolicyKind, RunConfig, RunPlan};
use crate::memory::{available_bytes, bytes, resident_bytes};
use crate::run::{HostDevice, RunError, build_world_on, probe_device};
use bevy_ecs::prelude::*;
use esper_components::{
    AlphaAlgorithm, AlphaController, BlendId, BlendStyle, Blueprint, BlueprintAction, SeedAlpha, SeedStage,
    SlotEvents, SlotIndex, SlotState, TaskPreset,
};
use esper_kernels::host::{DeviceReport, EnvConfigs, GraphCounts, HostArch, ValidationPassOrder};
use esper_kernels::ops::precision::Precision;
use esper_kernels::seeds::{CnnBlueprint, forward_macs};
use esper_systems::host_resources::{Hosts, StepClock};
use esper_systems::slot_query::SlotLifecycle;
use esper_systems::{
    StepSet, add_act_record_systems, add_decide_systems, add_host_systems, add_observe_decide_systems,
    add_observe_systems, add_reward_systems, empty_step_schedule,
};
use std::fmt::Write as _;
use std::time::Instant;

/// The blueprints of the forced state, one per slot in canonical slot order.
pub const FORCED_BLUEPRINTS: [BlueprintAction; 3] =
    [BlueprintAction::ConvLight, BlueprintAction::Attention, BlueprintAction::ConvHeavy];
/// The forced seeds' alpha.
pub const FORCED_ALPHA: f64 = 0.5;

/// The GPU a `--device` name picks: `cuda` is 0, `cuda:N` is N; anything else is none.
pub fn cuda_ordinal(name: &str) -> Option<usize> {
    match name {
        "cuda" => Some(0),
        other => other.strip_prefix("cuda:").and_then(|i| i.parse().ok()),
    }
}

/// Why `--device cuda` cannot run in this build.
pub fn cuda_unavailable() -> &'static str {
    "this binary was built without CUDA; build it with `bash ../shared/tools/cuda-build.sh` (cargo build \
     --release --features cuda with the CUDA 13 toolkit), see docs/gpu.md"
}

/// The lifecycle state every step starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchSeeds {
    /// Three BLENDING seeds per env ([`FORCED_BLUEPRINTS`], ADD at [`FORCED_ALPHA`]) under the heuristic
    /// policy: the workload with live seeds and their counterfactual configurations.
    #[default]
    Blending,
    /// Every slot empty under the static policy (every decision WAIT): the bare host's step, with the
    /// observation, decision, reward and lifecycle still run.
    None,
}

impl BenchSeeds {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "blending" => Ok(BenchSeeds::Blending),
            "none" => Ok(BenchSeeds::None),
            other => Err(format!("unknown --seeds '{other}' (known: blending, none)")),
        }
    }

    /// The policy the workload runs under.
    fn policy(self) -> PolicyKind {
        match self {
            BenchSeeds::Blending => PolicyKind::Heuristic,
            BenchSeeds::None => PolicyKind::Static,
        }
    }

    /// The state slot `index` (canonical order) is forced into before every step.
    fn forced_slot(self, index: usize) -> SlotState {
        match self {
            BenchSeeds::Blending => forced_slot(FORCED_BLUEPRINTS[index.min(FORCED_BLUEPRINTS.len() - 1)]),
            BenchSeeds::None => SlotState::default(),
        }
    }

    /// How the report and the table's header name the forced state.
    fn describe(self) -> String {
        match self {
            BenchSeeds::Blending => format!(
                "{} BLENDING seeds per env ({}; ADD, held at alpha {FORCED_ALPHA}), heuristic policy, restored \
                 before every step",
                FORCED_BLUEPRINTS.len(),
                FORCED_BLUEPRINTS.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")
            ),
            BenchSeeds::None => {
                "no seeds (every slot empty), static policy (every decision WAIT), restored before every step"
                    .to_string()
            }
        }
    }
}

/// The bench's settings (the CLI's defaults are [`BenchConfig::default`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchConfig {
    pub envs: Vec<usize>,
    pub task: TaskPreset,
    pub device: HostDevice,
    /// How the GPU multiplies the convolutions (f32 on the CPU).
    pub precision: Precision,
    /// Training epochs from CUDA graphs where their launches repeat (GPU only).
    pub cuda_graphs: bool,
    pub seeds: BenchSeeds,
    pub batch_per_env: usize,
    /// Training batches per env per step.
    pub train_batches: usize,
    /// Validation images per env per step.
    pub test_per_env: usize,
    pub warmup: usize,
    pub reps: usize,
    pub seed: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            envs: vec![1, 4, 16, 64, 256],
            task: TaskPreset::CifarBaseline,
            device: HostDevice::Cpu,
            precision: Precision::F32,
            cuda_graphs: true,
            seeds: BenchSeeds::Blending,
            batch_per_env: 64,
            train_batches: 2,
            test_per_env: 128,
            warmup: 1,
            reps: 3,
            seed: 0,
        }
    }
}

/// The three tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Train,
    ValidatePolicy,
    FullLoop,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Train, Tier::ValidatePolicy, Tier::FullLoop];

    pub fn label(self) -> &'static str {
        match self {
            Tier::Train => "1 train",
            Tier::ValidatePolicy => "2 +validate+policy",
            Tier::FullLoop => "3 full loop",
        }
    }
}

/// Median and spread of repeated timings, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Timing {
    pub fn of(samples_ms: &[f64]) -> Self {
        let mut v = samples_ms.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median_ms = if n == 0 {
            0.0
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        };
        Self {
            median_ms,
            min_ms: v.first().copied().unwrap_or(0.0),
            max_ms: v.last().copied().unwrap_or(0.0),
        }
    }

    /// (max − min) / median.
    pub fn spread(&self) -> f64 {
        if self.median_ms > 0.0 { (self.max_ms - self.min_ms) / self.median_ms } else { 0.0 }
    }
}

/// One tier at one env count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TierResult {
    pub envs: usize,
    pub tier: Tier,
    pub step: Timing,
    pub ms_per_env: f64,
    /// Training images per second (the step's training images over its median time).
    pub train_images_per_s: f64,
    /// Env-epochs (env-steps) per second.
    pub env_epochs_per_s: f64,
    /// Slots the policy or the lifecycle moved out of the forced state, per timed step: their seeds
    /// were re-initialised inside the timed step (0 once the warm-up has germinated every seed).
    pub regerminated_slots_per_step: f64,
    /// What a device backend measured in the timed steps (None on the CPU).
    pub device: Option<DeviceStep>,
}

/// A device backend's own figures per timed step: the stages' device time (CUDA events, median over
/// the steps) and the copies back that waited for the device (mean).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DeviceStep {
    pub train_ms: f64,
    pub validate_ms: f64,
    pub syncs_per_step: f64,
    /// Timed steps whose training epoch was replayed from a CUDA graph, or captured into one; the same
    /// for the validation pass.
    pub train_graphs: GraphCounts,
    pub validation_graphs: GraphCounts,
}

impl DeviceStep {
    fn of(reports: &[DeviceReport]) -> Option<Self> {
        if reports.is_empty() {
            return None;
        }
        let median =
            |f: fn(&DeviceReport) -> f64| Timing::of(&reports.iter().map(f).collect::<Vec<_>>()).median_ms;
        Some(Self {
            train_ms: median(|r| r.train_ms),
            validate_ms: median(|r| r.validate_ms),
            syncs_per_step: reports.iter().map(|r| r.syncs as f64).sum::<f64>() / reports.len() as f64,
            train_graphs: GraphCounts::of(reports.iter().map(|r| r.train_run)),
            validation_graphs: GraphCounts::of(reports.iter().map(|r| r.validation_run)),
        })
    }
}

/// The arithmetic of one step at one env count, counted from the shapes (convolutions and linears, 2
/// FLOP per multiply-add; the norms, activations and pools, a few operations per value, left out).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct StepWork {
    pub envs: usize,
    /// One image's forward: the host's and the forced seeds' multiply-adds.
    pub host_macs_per_image: u64,
    pub seed_macs_per_image: u64,
    /// Validation configurations per env (the one the validation below counts).
    pub configurations: usize,
    /// The training epoch: forward, input gradient and weight gradient, about 3× the forward.
    pub train_gflop: f64,
    /// The validation pass as its passes run ([`validation_work_per_image`]), and with every
    /// configuration a whole forward of every test image (what running them one by one would cost).
    pub validate_gflop: f64,
    pub validate_whole_gflop: f64,
    /// The host's activation traffic, f32 (see [`host_bytes_per_image`]): the training epoch's, and
    /// the validation pass's as its passes run and with every configuration a whole forward, GB (10⁹
    /// bytes). Beside the GFLOP, the floor memory bandwidth sets for the GPU's kernels as they run
    /// (the training figure for the host without seeds).
    pub train_host_gbytes: f64,
    pub validate_host_gbytes: f64,
    pub validate_whole_host_gbytes: f64,
}

/// Bytes of activations one image moves through the host's kernels as the GPU backend runs them by
/// default (fusion on, `ESPER_CUDA_FUSE` unset) with no seed, f32, each tensor counted once per kernel
/// that reads or writes it (weights, the seeds, the head, batch norm's statistics and max-pool's
/// argmax left out): `(training, evaluation)`. Per block of `i` input and `o` output values (`p` after
/// the pool, `g` = `p` the values of the gradient arriving at the block: `o` where it does not pool).
/// Training forward — the convolution reads `i` and writes `o`, batch norm's statistics read `o`, its
/// normalisation + ReLU + pool reads `o` and writes `p` (one pass on even planes; apart, the
/// normalisation + ReLU reads and writes `o` and the pool reads `o` and writes `p`): `i + 3o + p`.
/// Backward — batch norm's parameter sums read `g` and `o` (the ReLU's and the pool's backwards
/// recomputed inside), its input gradient reads `g` and `o` and writes `o`, the weight gradient reads
/// `i` and `o`, and past the first block the input gradient reads `o` and writes `i`: `2g + 4o + i`,
/// `+ o + i`. With `staged` (`--precision tf32`: the 3×3 convolutions on the staged tensor-core
/// kernels, where the shape fits them), the forward's epilogue sums batch norm's statistics (`i + 2o +
/// p`); in the backward, batch norm's input gradient is written and read back, except in the first
/// block when its weight gradient takes all its channels in one block
/// ([`Conv2dShape::tc_weight_grad_single_block`]) from the pool's gradient: the weight gradient then
/// computes it as it loads it, reading `i`, `o` and `g` (`2g + 2o + i`; elsewhere, computing it on load,
/// `ESPER_CUDA_BN_ON_LOAD=1`, repeats it per output group and input chunk and was slower on an H200).
/// Evaluation: [`eval_block_floats`].
pub fn host_bytes_per_image(arch: &HostArch, staged: bool) -> (u64, u64) {
    let (mut train, mut eval) = (0u64, 0u64);
    for b in 0..arch.n_blocks {
        let BlockValues { i, o, p } = BlockValues::of(arch, b);
        let pools = arch.pools_after(b);
        let norm_and_pool = match (pools, fused_pool(arch, b)) {
            (true, true) => o + p,
            (true, false) => 2 * o + o + p,
            (false, _) => 2 * o,
        };
        let g = if pools { p } else { o };
        let conv = arch.block_conv(b, 1, 1);
        let on_tensor_cores = staged && conv.fits_staged_3x3();
        let grad_on_load = on_tensor_cores && b == 0 && pools && conv.tc_weight_grad_single_block();
        let weight_grad = match grad_on_load {
            true => (g + o) + (i + o + g),
            false => (g + o) + (g + 2 * o) + (i + o),
        };
        let input_grad = if b > 0 { o + i } else { 0 };
        // The statistics read the conv's output, unless its epilogue summed them.
        let stats = if on_tensor_cores { 0 } else { o };
        train += (i + o) + stats + norm_and_pool + weight_grad + input_grad;
        eval += eval_block_floats(arch, b);
    }
    (4 * train, 4 * eval)
}

/// Whether block `b`'s 2×2 pool runs inside the pass before it on the GPU: it pools, on even planes —
/// then with no seed running at its r0 slot, batch norm's normalisation, ReLU and pool are one pass
/// (`batch_norm_relu_pool_f32`), and with one, the slot's blend writes the pool's output
/// (`slot_blend_select_pool_f32`), its own output never written or read.
fn fused_pool(arch: &HostArch, b: usize) -> bool {
    arch.pools_after(b) && arch.block_size(b).is_multiple_of(2)
}

/// Activation floats one image's evaluation moves through host block `b` as the GPU runs it, a seed at
/// its r0 slot running or not (the slot's own traffic is the seed's): the convolution reads `i` and
/// writes `o`; the normalisation + ReLU reads `o` and writes `o` (the activation a later validation pass
/// from the r0 slot, and the slot, read); then the pool writes `p` from the values the pass before it
/// made ([`fused_pool`]), or reads `o` and writes `p`: `i + 3o + p`, `i + 4o + p` on odd planes, `i +
/// 3o` without a pool.
fn eval_block_floats(arch: &HostArch, b: usize) -> u64 {
    let BlockValues { i, o, p } = BlockValues::of(arch, b);
    let pool = match (arch.pools_after(b), fused_pool(arch, b)) {
        (true, true) => p,
        (true, false) => o + p,
        (false, _) => 0,
    };
    i + 3 * o + pool
}

/// Bytes of activations one test image's whole forward moves through the host ([`eval_block_floats`]:
/// the same with every seed on as without).
fn whole_forward_bytes(arch: &HostArch) -> u64 {
    4 * (0..arch.n_blocks).map(|b| eval_block_floats(arch, b)).sum::<u64>()
}

/// One block's activation sizes per image: `i` input, `o` output and `p` pooled values.
struct BlockValues {
    i: u64,
    o: u64,
    p: u64,
}

impl BlockValues {
    fn of(arch: &HostArch, b: usize) -> Self {
        let (size, out_size) = (arch.block_size(b) as u64, arch.block_output_size(b) as u64);
        let c = arch.block_channels(b) as u64;
        Self {
            i: arch.block_in_channels(b) as u64 * size * size,
            o: c * size * size,
            p: c * out_size * out_size,
        }
    }
}

/// One test image's validation work as the passes run ([`ValidationPassOrder`], every env with the
/// same configurations, as the forced state has them): `(multiply-adds, activation bytes)`, host and
/// seeds for the first, the host alone (as [`host_bytes_per_image`] counts evaluation) for the second.
/// A pass from slot `(b, row)` runs the blocks after `b`, block `b`'s pool when it starts before it
/// (row 0), the seeds at or after its start that its configuration leaves on, and the head.
/// `slots`: every slot's `(block, row)` and its seed's forward multiply-adds, all ablatable (none: the
/// main forward alone).
pub fn validation_work_per_image(arch: &HostArch, slots: &[((usize, u8), u64)]) -> (u64, u64) {
    let positions: Vec<(usize, u8)> = slots.iter().map(|&(position, _)| position).collect();
    let configs = [EnvConfigs::new(&(0..slots.len()).collect::<Vec<_>>())];
    let mut planner = ValidationPassOrder::default();
    let (mut macs, mut floats) = (0u64, 0u64);
    for &(j, start) in planner.plan(&configs, &positions) {
        let mask = configs[0].masks[j];
        for b in 0..arch.n_blocks {
            let v = BlockValues::of(arch, b);
            match start {
                Some((first, _)) if b < first => {}
                Some((first, row)) if b == first => {
                    floats += if row == 0 && arch.pools_after(b) { v.o + v.p } else { 0 }
                }
                _ => {
                    macs += arch.block_macs(b);
                    floats += eval_block_floats(arch, b);
                }
            }
        }
        macs += arch.head_macs();
        for (k, &(position, seed_macs)) in slots.iter().enumerate() {
            if mask & (1 << k) == 0 && start.is_none_or(|s| position >= s) {
                macs += seed_macs;
            }
        }
    }
    (macs, 4 * floats)
}

impl StepWork {
    fn of(config: &BenchConfig, plan: &RunPlan, configs: usize) -> Self {
        let arch = crate::run::host_arch(plan);
        // Every slot's position and its forced seed's forward multiply-adds.
        let seeds: Vec<((usize, u8), u64)> = match config.seeds {
            BenchSeeds::None => vec![],
            BenchSeeds::Blending => plan
                .slots
                .ids()
                .iter()
                .enumerate()
                .map(|(i, id)| {
                    let action = FORCED_BLUEPRINTS[i.min(FORCED_BLUEPRINTS.len() - 1)];
                    let bp =
                        CnnBlueprint::from_action_index(action as u8).expect("a forced seed is a module");
                    let b = id.col as usize;
                    // r0 sits after the block's ReLU, r1 after its pool.
                    let size = if id.row == 0 { arch.block_size(b) } else { arch.block_output_size(b) };
                    ((b, id.row), forward_macs(bp, arch.block_channels(b), size, size))
                })
                .collect(),
        };
        let seed_macs_per_image = seeds.iter().map(|&(_, macs)| macs).sum();
        let host_macs_per_image = arch.forward_macs();
        let (train_bytes, _) = host_bytes_per_image(&arch, config.precision == Precision::Tf32);
        let (validate_macs, validate_bytes) = validation_work_per_image(&arch, &seeds);
        let forward_gflop = 2.0 * (host_macs_per_image + seed_macs_per_image) as f64 / 1e9;
        let envs = plan.config.envs;
        let train_images = (envs * config.batch_per_env * config.train_batches) as f64;
        let test_images = (envs * config.test_per_env) as f64;
        Self {
            envs,
            host_macs_per_image,
            seed_macs_per_image,
            configurations: configs,
            train_gflop: 3.0 * forward_gflop * train_images,
            validate_gflop: 2.0 * validate_macs as f64 * test_images / 1e9,
            validate_whole_gflop: forward_gflop * test_images * configs.max(1) as f64,
            train_host_gbytes: train_bytes as f64 * train_images / 1e9,
            validate_host_gbytes: validate_bytes as f64 * test_images / 1e9,
            validate_whole_host_gbytes: whole_forward_bytes(&arch) as f64
                * test_images
                * configs.max(1) as f64
                / 1e9,
        }
    }
}

/// The epoch boundary (tier 3, Observe … Record) at one env count.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BoundaryResult {
    pub envs: usize,
    pub step: Timing,
    pub us_per_env: f64,
    /// The Observe set alone (governor check, signals, the observation and its normalisation, masks):
    /// median µs per step and per env.
    pub observe_us: f64,
    pub observe_us_per_env: f64,
    /// The Reward set alone (median µs per step) and its share of the whole step's median.
    pub reward_us: f64,
    pub reward_share_of_step: f64,
}

/// An env count that was not run, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Skipped {
    pub envs: usize,
    pub reason: String,
}

/// Everything the bench measured; also written as JSON.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub config: BenchConfig,
    pub threads: usize,
    pub forced_state: String,
    /// The CUDA backend's measuring switches set for this run (`ESPER_CUDA_*=value`, docs/gpu.md), so
    /// that a report of an A/B run says which side it was; empty on the CPU.
    pub kernel_switches: Vec<String>,
    /// Validation configurations per env (the full model, each seed off, all off, pairs, …).
    pub counterfactual_configs: usize,
    pub tiers: Vec<TierResult>,
    pub boundary: Vec<BoundaryResult>,
    /// Boundary time per step at 256 envs over that at 16 (when both ran).
    pub boundary_growth_16_to_256: Option<f64>,
    pub skipped: Vec<Skipped>,
    /// Each env count's arithmetic per step.
    pub work: Vec<StepWork>,
}

/// The run plan of one env count: synthetic data sized to exactly `train_batches` training batches
/// and `test_per_env` validation images per env, the first three injection points of the preset as
/// slots; validated like any run.
fn plan_for(config: &BenchConfig, envs: usize) -> Result<RunPlan, RunError> {
    let points = config.task.host().injection_points();
    let slots: Vec<String> = points.iter().take(FORCED_BLUEPRINTS.len()).map(|p| p.id.to_string()).collect();
    let run = RunConfig {
        envs,
        task: config.task.name().to_string(),
        data: DataKind::Synthetic,
        slots: slots.join(","),
        policy: config.seeds.policy(),
        seed: config.seed,
        device: config.device.name(),
        precision: Some(config.precision),
        cuda_graphs: config.cuda_graphs,
        batch_per_env: config.batch_per_env,
        synthetic_train_per_env: config.batch_per_env * config.train_batches,
        synthetic_test_per_env: config.test_per_env,
        ..RunConfig::default()
    };
    run.plan_in(std::env::temp_dir(), true).map_err(|e| RunError(format!("{envs} envs: {e}")))
}

fn forced_slot(blueprint: BlueprintAction) -> SlotState {
    let mut s = SlotState::default();
    s.stage.current = SeedStage::Blending;
    s.stage.previous = SeedStage::Training;
    s.blueprint = Blueprint(blueprint);
    s.blend = BlendStyle {
        blend: BlendId::Linear,
        algorithm: AlphaAlgorithm::Add,
        alpha_target: FORCED_ALPHA,
        has_gate: false,
    };
    s.alpha = SeedAlpha(FORCED_ALPHA);
    s.controller = AlphaController::holding_at(FORCED_ALPHA);
    s.counters.epochs_total = 10;
    s.flags.isolate_gradients = true;
    s
}

/// Write the forced state into every slot (so counters, controller and flags — the policy's input —
/// are the same every step). With seeds, a slot that the policy or the lifecycle moved out of it (stage,
/// alpha or blueprint changed) also gets a germination event, so the kernels give it a fresh seed; the
/// others' events are cleared. Without seeds the empty state turns any seed off. Returns how many slots
/// had moved out of the forced state.
fn force_state(world: &mut World, seeds: BenchSeeds) -> usize {
    let mut regerminated = 0;
    let mut slots = world.query::<(&SlotIndex, &mut SlotEvents, SlotLifecycle)>();
    for (index, mut events, mut slot) in slots.iter_mut(world) {
        let forced = seeds.forced_slot(index.0 as usize);
        let moved = slot.stage.current != forced.stage.current
            || slot.alpha.0 != forced.alpha.0
            || slot.blueprint.0 != forced.blueprint.0;
        slot.view().write(&forced);
        let germinated = moved && seeds == BenchSeeds::Blending;
        *events = SlotEvents { germinated, ..SlotEvents::default() };
        regerminated += usize::from(moved);
    }
    regerminated
}

fn schedule_with(add: &[fn(&mut Schedule)]) -> Schedule {
    let mut schedule = empty_step_schedule();
    for f in add {
        f(&mut schedule);
    }
    schedule
}

/// Training alone: the epoch and its metrics (on a device, the metrics' read-back is what waits for the
/// epoch to finish, so the tier's time is the epoch's).
fn add_train_only(schedule: &mut Schedule) {
    schedule.add_systems((
        esper_systems::train_hosts::train_hosts.in_set(StepSet::TrainHosts),
        esper_systems::record_train_metrics::record_train_metrics.in_set(StepSet::Validate),
    ));
}

/// One env count, all three tiers (and the boundary). Returns the tiers, the boundary, the number of
/// counterfactual configurations per env and the resident memory after the run.
fn bench_envs(
    config: &BenchConfig,
    envs: usize,
    mut on_line: impl FnMut(&str),
) -> Result<(Vec<TierResult>, BoundaryResult, StepWork, Option<u64>), RunError> {
    let plan = plan_for(config, envs)?;
    let mut world = build_world_on(&plan, config.device)?;
    world.resource_mut::<StepClock>().epoch = 1;
    let train_images = (envs * config.batch_per_env * config.train_batches) as f64;
    let mut tiers = Vec::new();
    let mut boundary = None;
    let mut configs = 0;
    for tier in Tier::ALL {
        let mut parts: Vec<Schedule> = match tier {
            Tier::Train => vec![schedule_with(&[add_train_only])],
            Tier::ValidatePolicy => vec![schedule_with(&[add_host_systems, add_observe_decide_systems])],
            Tier::FullLoop => vec![
                schedule_with(&[add_host_systems]),
                schedule_with(&[add_observe_systems]),
                schedule_with(&[add_decide_systems]),
                schedule_with(&[add_reward_systems]),
                schedule_with(&[add_act_record_systems]),
            ],
        };
        for part in &mut parts {
            part.initialize(&mut world).map_err(|e| RunError(format!("bench schedule: {e:?}")))?;
        }
        let (mut totals, mut boundaries, mut observes, mut rewards, mut regerminated) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
        let mut device_steps = Vec::new();
        for rep in 0..config.warmup + config.reps {
            let forced = force_state(&mut world, config.seeds);
            // Whatever a device counted before this step is not the step's.
            world.resource_mut::<Hosts>().0.take_device_report();
            let mut part_ms = Vec::with_capacity(parts.len());
            for part in &mut parts {
                let started = Instant::now();
                part.run(&mut world);
                part_ms.push(started.elapsed().as_secs_f64() * 1e3);
            }
            {
                let mut clock = world.resource_mut::<StepClock>();
                clock.epoch += 1;
                clock.step += 1;
            }
            let device_step = world.resource_mut::<Hosts>().0.take_device_report();
            if rep >= config.warmup {
                device_steps.extend(device_step);
                totals.push(part_ms.iter().sum::<f64>());
                regerminated += forced;
                if tier == Tier::FullLoop {
                    boundaries.push(part_ms[1..].iter().sum::<f64>());
                    observes.push(part_ms[1]);
                    rewards.push(part_ms[3]);
                }
            }
        }
        if tier != Tier::Train {
            configs = world.resource::<Hosts>().validation_configs(0);
        }
        let step = Timing::of(&totals);
        let result = TierResult {
            envs,
            tier,
            step,
            ms_per_env: step.median_ms / envs as f64,
            train_images_per_s: train_images / (step.median_ms / 1e3),
            env_epochs_per_s: envs as f64 / (step.median_ms / 1e3),
            regerminated_slots_per_step: regerminated as f64 / config.reps as f64,
            device: DeviceStep::of(&device_steps),
        };
        on_line(&format_tier_row(&result));
        if let Some(d) = result.device {
            on_line(&format!(
                "        device (CUDA events): train {:.2} ms, validate {:.2} ms per step ({:.0} % of the step); \
                 {:.1} copies back per step; from a CUDA graph of {} steps: {} epochs ({} captured), {} \
                 validation passes ({} captured)",
                d.train_ms,
                d.validate_ms,
                100.0 * (d.train_ms + d.validate_ms) / step.median_ms,
                d.syncs_per_step,
                config.reps,
                d.train_graphs.replayed,
                d.train_graphs.captured,
                d.validation_graphs.replayed,
                d.validation_graphs.captured
            ));
        }
        tiers.push(result);
        if tier == Tier::FullLoop {
            let full_step_ms = step.median_ms;
            let boundary_step = Timing::of(&boundaries);
            let reward_ms = Timing::of(&rewards).median_ms;
            let observe_ms = Timing::of(&observes).median_ms;
            boundary = Some(BoundaryResult {
                envs,
                step: boundary_step,
                us_per_env: 1e3 * boundary_step.median_ms / envs as f64,
                observe_us: 1e3 * observe_ms,
                observe_us_per_env: 1e3 * observe_ms / envs as f64,
                reward_us: 1e3 * reward_ms,
                reward_share_of_step: reward_ms / full_step_ms,
            });
        }
    }
    let boundary = boundary.expect("the full-loop tier always runs");
    let work = StepWork::of(config, &plan, configs);
    let (configurations, whole_bytes) = match work.configurations {
        0 | 1 => ("the main forward alone".to_string(), String::new()),
        n => (
            format!(
                "{n} configurations run as a tree of passes, {:.1} GFLOP as whole forwards",
                work.validate_whole_gflop
            ),
            format!("; {:.1} GB as whole forwards", work.validate_whole_host_gbytes),
        ),
    };
    on_line(&format!(
        "        work per step: {:.1} GFLOP training + {:.1} GFLOP validation ({} + {} multiply-adds per \
         image, host + seeds; {configurations})",
        work.train_gflop, work.validate_gflop, work.host_macs_per_image, work.seed_macs_per_image,
    ));
    on_line(&format!(
        "        host activation traffic per step: {:.1} GB training + {:.1} GB validation (f32, each tensor \
         once per kernel as the GPU runs them; seeds left out{whole_bytes})",
        work.train_host_gbytes, work.validate_host_gbytes
    ));
    Ok((tiers, boundary, work, resident_bytes()))
}

const HEADER: &str =
    "  envs  tier                  ms/step   spread   ms/env   train img/s  env-epochs/s  re-germinated/step";

fn format_tier_row(r: &TierResult) -> String {
    format!(
        "{:>6}  {:<20} {:>9.1} {:>7.1}% {:>8.2} {:>13.0} {:>13.2} {:>19.1}",
        r.envs,
        r.tier.label(),
        r.step.median_ms,
        100.0 * r.step.spread(),
        r.ms_per_env,
        r.train_images_per_s,
        r.env_epochs_per_s,
        r.regerminated_slots_per_step
    )
}

/// The `ESPER_CUDA_*` settings among `vars`, as `NAME=value`, sorted.
fn cuda_switches(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut set: Vec<String> = vars
        .filter(|(name, _)| name.starts_with("ESPER_CUDA_"))
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    set.sort();
    set
}

/// Run the bench. `on_line` receives each table line as soon as it is measured (the CLI prints them).
pub fn run(config: &BenchConfig, mut on_line: impl FnMut(&str)) -> Result<BenchReport, RunError> {
    if config.reps == 0 {
        return Err(RunError("--reps must be at least 1".into()));
    }
    probe_device(config.device)?;
    let forced_state = config.seeds.describe();
    let threads = rayon::current_num_threads();
    on_line(&format!(
        "esper-ecs bench — {} host on {}{}, {threads} threads; per env per step: {} × {} training images, {} \
         validation images",
        config.task.name(),
        config.device.name(),
        match (config.precision, config.device, config.cuda_graphs) {
            (_, HostDevice::Cpu, _) => String::new(),
            (p, _, graphs) => format!(
                " ({} convolutions, {})",
                p.name(),
                if graphs { "CUDA graphs" } else { "no CUDA graphs" }
            ),
        },
        config.train_batches,
        config.batch_per_env,
        config.test_per_env
    ));
    on_line(&format!("forced state: {forced_state}"));
    let kernel_switches =
        if config.device == HostDevice::Cpu { Vec::new() } else { cuda_switches(std::env::vars()) };
    if !kernel_switches.is_empty() {
        on_line(&format!("kernel switches: {}", kernel_switches.join(" ")));
    }
    on_line(&format!(
        "{} warm-up + {} timed steps per tier; median, spread = (max − min) / median",
        config.warmup, config.reps
    ));
    on_line(HEADER);
    let mut report = BenchReport {
        config: config.clone(),
        threads,
        forced_state,
        kernel_switches,
        counterfactual_configs: 0,
        tiers: Vec::new(),
        boundary: Vec::new(),
        boundary_growth_16_to_256: None,
        skipped: Vec::new(),
        work: Vec::new(),
    };
    // Memory per env, learnt from the env counts already run: (resident bytes, envs) of the last two.
    let mut seen: Vec<(usize, u64)> = Vec::new();
    let base = resident_bytes().unwrap_or(0);
    for &envs in &config.envs {
        // What this process holds now is freed before the next count is built, so only the difference
        // has to come from MemAvailable.
        let held = resident_bytes().unwrap_or(0);
        // Before any count has run there is nothing to extrapolate: the run's estimate stands in.
        let need = estimate_bytes(base, &seen, envs)
            .or_else(|| plan_for(config, envs).ok().map(|plan| plan.memory.total()));
        if let Some(need) = need
            && let Some(avail) = available_bytes()
            && need.saturating_sub(held) as f64 > 0.9 * avail as f64
        {
            let reason = format!(
                "will not fit in memory: needs about {}, {} available",
                bytes(need),
                bytes(avail + held)
            );
            on_line(&format!("{envs:>6}  skipped: {reason}"));
            report.skipped.push(Skipped { envs, reason });
            continue;
        }
        match bench_envs(config, envs, &mut on_line) {
            Ok((tiers, boundary, work, resident)) => {
                report.counterfactual_configs = work.configurations;
                report.work.push(work);
                report.tiers.extend(tiers);
                report.boundary.push(boundary);
                if let Some(r) = resident {
                    seen.push((envs, r));
                }
            }
            Err(e) => {
                on_line(&format!("{envs:>6}  skipped: {e}"));
                report.skipped.push(Skipped { envs, reason: e.to_string() });
            }
        }
    }
    let boundary_at = |n: usize| report.boundary.iter().find(|b| b.envs == n).map(|b| b.step.median_ms);
    if let (Some(b16), Some(b256)) = (boundary_at(16), boundary_at(256)) {
        report.boundary_growth_16_to_256 = Some(b256 / b16);
    }
    on_line(&format!("validation configurations per env: {}", report.counterfactual_configs));
    on_line(&format_boundary(&report));
    Ok(report)
}

/// Expected resident bytes at `envs`, extrapolated linearly from the env counts run so far (the line
/// through the last two, or through `base` and the only one).
fn estimate_bytes(base: u64, seen: &[(usize, u64)], envs: usize) -> Option<u64> {
    let (n1, r1) = *seen.last()?;
    let (n0, r0) = match seen {
        [.., (n0, r0), _] if *n0 < n1 => (*n0, *r0),
        _ => (0, base),
    };
    let per_env = (r1 as f64 - r0 as f64).max(0.0) / (n1 - n0) as f64;
    Some((r1 as f64 + per_env * (envs as f64 - n1 as f64)).max(base as f64) as u64)
}

/// The epoch boundary's table: host time per step, per env, and the growth from 16 to 256 envs.
pub fn format_boundary(report: &BenchReport) -> String {
    let mut out = String::from("epoch boundary (Observe … Record, host time per step):\n");
    for b in &report.boundary {
        let _ = writeln!(
            out,
            "{:>6} envs  {:>9.3} ms/step  {:>8.2} µs/env  spread {:.1}%   observe {:>8.1} µs/step \
             ({:.2} µs/env)   reward {:>8.1} µs/step ({:.4}% of the step)",
            b.envs,
            b.step.median_ms,
            b.us_per_env,
            100.0 * b.step.spread(),
            b.observe_us,
            b.observe_us_per_env,
            b.reward_us,
            100.0 * b.reward_share_of_step
        );
    }
    match report.boundary_growth_16_to_256 {
        Some(g) => {
            let _ = write!(
                out,
                "growth 16 → 256 envs: {g:.2}× (the design goal on a GPU device: ≤ 1.5×; on CPU the \
                boundary is per-env work, so read µs/env)"
            );
        }
        None => {
            let _ = write!(out, "growth 16 → 256 envs: needs both env counts");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn cuda_switches_are_the_esper_cuda_settings_sorted() {
        let vars = [
            ("PATH", "/bin"),
            ("ESPER_CUDA_TC_WIDE", "0"),
            ("ESPER_KERNEL_CACHE", "/tmp/k"),
            ("ESPER_CUDA_FUSE", "0"),
        ]
        .map(|(n, v)| (n.to_string(), v.to_string()));
        assert_eq!(super::cuda_switches(vars.into_iter()), ["ESPER_CUDA_FUSE=0", "ESPER_CUDA_TC_WIDE=0"]);
        assert!(super::cuda_switches(std::iter::empty()).is_empty());
    }

    use super::*;

    /// Hand-derived for W16 on cifar_baseline: the host's 811,328 multiply-adds per image (its own test
    /// in esper_kernels); the seeds at r0c0 (conv_light, 8 channels at 32×32: 9·1024·64), r0c1
    /// (attention, 16 channels: 16 → 4 → 16) and r0c2 (conv_heavy, 32 channels at 8×8: 2·9·64·1024).
    #[test]
    fn step_work_counts_the_w16_workload() {
        let w16 = BenchConfig {
            envs: vec![16],
            batch_per_env: 512,
            train_batches: 6,
            test_per_env: 625,
            ..BenchConfig::default()
        };
        let plan = plan_for(&w16, 16).unwrap();
        let seeded = StepWork::of(&w16, &plan, 8);
        assert_eq!(seeded.host_macs_per_image, 811_328);
        assert_eq!(seeded.seed_macs_per_image, 589_824 + 128 + 1_179_648);
        let forward = 2.0 * (811_328.0 + 1_769_600.0);
        assert!((seeded.train_gflop - 3.0 * forward * 16.0 * 512.0 * 6.0 / 1e9).abs() < 1e-9);
        assert!((seeded.validate_whole_gflop - forward * 10_000.0 * 8.0 / 1e9).abs() < 1e-9);
        // As the passes run (validation_work_per_image's test): 7 301 888 multiply-adds per test image.
        assert!((seeded.validate_gflop - 2.0 * 7_301_888.0 * 10_000.0 / 1e9).abs() < 1e-9);
        let bare = BenchConfig { seeds: BenchSeeds::None, ..w16 };
        let none = StepWork::of(&bare, &plan_for(&bare, 16).unwrap(), 1);
        assert_eq!(none.seed_macs_per_image, 0);
        // ≈ 255 GFLOP per step without seeds.
        assert!((none.train_gflop + none.validate_gflop - 255.5).abs() < 0.1, "{none:?}");
        // 530 432 training and 210 944 evaluation bytes per image (host_bytes_per_image's test):
        // 49 152 training images, 10 000 test images.
        assert!((none.train_host_gbytes - 530_432.0 * 49_152.0 / 1e9).abs() < 1e-9, "{none:?}");
        assert!((none.validate_host_gbytes - 210_944.0 * 10_000.0 / 1e9).abs() < 1e-9, "{none:?}");
        assert!((none.validate_whole_host_gbytes - none.validate_host_gbytes).abs() < 1e-9);
        // With a seed at every block's r0 slot each whole forward pools inside the slots' blends: 4 ·
        // 52 736 bytes, as without seeds.
        assert!((seeded.validate_whole_host_gbytes - 8.0 * 210_944.0 * 10_000.0 / 1e9).abs() < 1e-9);
        assert!((seeded.validate_host_gbytes - 487_424.0 * 10_000.0 / 1e9).abs() < 1e-9);
    }

    /// Hand-derived for the forced seeds of W16 on cifar_baseline. The segment after each slot, with
    /// its seed on / off: r0c0, conv_light 589 824 and block 1's conv 294 912 / the conv alone; r0c1,
    /// attention 128 and block 2's conv 294 912 / the conv; r0c2, conv_heavy 1 179 648 and the head 320
    /// / the head. The main forward is 2 580 928. The tree's passes (as in the test
    /// validation_passes_form_a_tree_over_three_slots), by off-mask in network order: 001 from r0c2
    /// (320), 010 from r0c1 (294 912 and 1 179 968), 011 from r0c2 (320), 100 from r0c0 (294 912,
    /// 295 040 and 1 179 968), 101 from r0c2 (320), 110 from r0c1 (294 912 and 1 179 968), 111 from
    /// r0c2 (320): 4 720 960 in all. Bytes, in floats per image (evaluation i + 3o + p per block, the
    /// pool inside the r0 slot's blend where its seed runs: 29 696, 15 360, 7 680 — every block a pass
    /// runs whole has its seed on, the ablated ones lying at or before the pass's start; a start at a
    /// block's r0 slot, its seed off, pools the activation, o + p: 10 240, 5 120, 2 560): the main
    /// forward 52 736, the passes 4 · 2 560 from r0c2, 2 · (5 120 + 7 680) from r0c1 and 10 240 +
    /// 15 360 + 7 680 from r0c0, 69 120 in all. Without seeds, the main forward alone: 52 736.
    #[test]
    fn validation_work_counts_the_tree_of_passes() {
        let arch = HostArch::CIFAR_BASELINE;
        let seeds = [((0, 0), 589_824), ((1, 0), 128), ((2, 0), 1_179_648)];
        assert_eq!(validation_work_per_image(&arch, &seeds), (2_580_928 + 4_720_960, 4 * (52_736 + 69_120)));
        // Without seeds, the main forward alone.
        assert_eq!(validation_work_per_image(&arch, &[]), (arch.forward_macs(), 4 * 52_736));
        assert_eq!(host_bytes_per_image(&arch, false).1, 4 * 52_736);
        // One seed at r1 (after block 1's pool) leaves every block's normalisation, ReLU and pool fused.
        assert_eq!(validation_work_per_image(&arch, &[((1, 1), 100)]).1, 4 * (52_736 + 7_680));
    }

    /// Hand-derived for cifar_baseline (3 → 8 channels at 32×32, 8 → 16 at 16×16, 16 → 32 at 8×8, each
    /// pooled): per block i, o, p values of 3072, 8192, 2048; 2048, 4096, 1024; 1024, 2048, 512.
    /// Training (i + 3o + p) + (2p + 4o + i), plus o + i past the first block: 69 632 + 41 984 + 20 992
    /// floats; evaluation i + 3o + p: 29 696 + 15 360 + 7 680 floats. cifar_minimal (3 → 2 → 4 → 8
    /// channels at 32×32: 1×1 convolutions, nothing pooled): i, o of 3072, 2048; 2048, 4096; 4096, 8192;
    /// training (i + 4o) + (6o + i) [g = o], plus o + i past the first: 26 624 + 51 200 + 102 400
    /// floats; evaluation i + 3o: 9 216 + 14 336 + 28 672.
    #[test]
    fn host_bytes_per_image_counts_the_kernels_as_they_run() {
        let arch = HostArch::CIFAR_BASELINE;
        assert_eq!(host_bytes_per_image(&arch, false), (4 * 132_608, 4 * 52_736));
        // At TF32 the tensor-core kernels sum the statistics in the forward's epilogue: one read of
        // each block's output fewer, o = 8 192 + 4 096 + 2 048 floats; and the first block's weight
        // gradient computes batch norm's input gradient as it loads it: its write and read back, 2 ·
        // 8 192, fewer.
        assert_eq!(host_bytes_per_image(&arch, true), (4 * (132_608 - 14_336 - 16_384), 4 * 52_736));
        let minimal =
            HostArch { base_channels: 2, pool_layers: 0, kernel_size: 1, ..HostArch::CIFAR_BASELINE };
        assert_eq!(host_bytes_per_image(&minimal, false), (4 * 180_224, 4 * 52_224));
        // 1×1 convolutions never run staged.
        assert_eq!(host_bytes_per_image(&minimal, true), host_bytes_per_image(&minimal, false));
    }

    #[test]
    fn timing_median_and_spread() {
        let t = Timing::of(&[3.0, 1.0, 2.0]);
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (2.0, 1.0, 3.0));
        assert_eq!(t.spread(), 1.0);
        assert_eq!(Timing::of(&[4.0, 1.0, 2.0, 3.0]).median_ms, 2.5);
    }

    #[test]
    fn memory_estimate_extrapolates_per_env_growth() {
        assert_eq!(estimate_bytes(100, &[], 4), None);
        assert_eq!(estimate_bytes(100, &[(1, 200)], 4), Some(500));
        // Through the last two points, intercept kept: 500 + 100·(16 − 4).
        assert_eq!(estimate_bytes(100, &[(1, 200), (4, 500)], 16), Some(1700));
        assert_eq!(estimate_bytes(1000, &[(1, 1100), (4, 1400), (16, 3000)], 64), Some(3000 + 400 * 48 / 3));
    }
}
