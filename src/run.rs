//! The training run behind `esper-ecs train`: builds the world for a [`RunPlan`], runs the step
//! schedule for every epoch of every round (fresh hosts each round), streams `metrics.jsonl` and writes
//! `summary.json`. A stop request (Ctrl-C) is honoured after the current epoch, with everything written
//! so far intact.

use crate::checkpoint::{self, CheckpointHeader};
use crate::config::{PolicyKind, RunPlan};
use crate::profile::{mean, min_max};
use crate::trace::{TraceHeader, TraceWriter, partial_path};
use bevy_ecs::prelude::*;
use esper_components::governor::GovernorConfig;
use esper_components::heuristic::HeuristicConfig;
use esper_components::signals::{SignalConfig, SignalTracker};
use esper_components::{
    EnvIndex, EpisodeReturn, HostMetrics, LifecycleConfig, LifecycleTally, ScaffoldLedger, Topology,
};
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::{CpuHostBackend, GraphCounts, HostArch};
use esper_kernels::observation::obs_dim;
use esper_kernels::ops::precision::Precision;
use esper_kernels::policy::network::PolicyShape;
use esper_kernels::policy::ppo::{PpoAgent, UpdateMetrics};
use esper_kernels::policy::rollout::RolloutBuffer;
use esper_systems::compute_rewards::SharedRewardNormalizer;
use esper_systems::episode_end::episode_end_schedule;
use esper_systems::host_resources::{Hosts, StepClock, TrainData};
use esper_systems::learner::{FINITENESS_FAILURE_LIMIT, Learner, Rollout};
use esper_systems::normalize_observations::ObsNormalization;
use esper_systems::policy::{ActivePolicy, HeuristicPolicy, Policy, RandomPolicy, StaticPolicy};
use esper_systems::update_obs_normalizer::round_end_schedule;
use esper_systems::update_signals::{EnvSignals, SlotReports};
use esper_systems::write_metrics::MetricsSink;
use esper_systems::write_trace::TraceSink;
use esper_systems::{add_training_systems, empty_step_schedule};
use esper_systems::{insert_run_resources, spawn_env, spawn_slot};
use std::fmt;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What a finished (or interrupted) run reports; also written as `summary.json`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RunSummary {
    pub rounds_completed: usize,
    pub epochs_completed: usize,
    pub interrupted: bool,
    pub wall_seconds: f64,
    pub env_epochs_per_second: f64,
    /// Each env's validation accuracy (pp) after its last epoch.
    pub final_val_accuracy: Vec<f64>,
    pub mean_final_val_accuracy: f64,
    /// Per round: the mean over envs of the raw episode return (Σ of the env's rewards; a rollback
    /// rewrites the env's rewards since its last one to the death penalty, simic §1.6). An interrupted
    /// round counts its epochs so far.
    pub mean_episode_return: Vec<f64>,
    pub seeds_germinated: u64,
    pub seeds_fossilized: u64,
    pub seeds_pruned: u64,
    pub failed_ops: u64,
    pub rollbacks: u64,
    pub vetoed_ops: u64,
    /// Rounds whose PPO update stepped the optimizer (0 for the other policies; an update the finiteness
    /// gate skipped whole does not count).
    pub policy_updates: u64,
    /// On a device (`--device cuda`): its own figures per step; absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceRunReport>,
}

/// A device backend's figures over a run's steps ([`esper_kernels::host::DeviceReport`] per step).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct DeviceRunReport {
    /// How the device multiplied the convolutions: the run's `precision`, or the device's default where
    /// the config leaves it out (it stays out of the config, so a resume on another device takes that
    /// device's default).
    pub precision: Precision,
    pub steps: u64,
    /// Copies back that waited for the device, per step: mean and most.
    pub syncs_per_step: f64,
    pub max_syncs_in_a_step: u64,
    /// Device time (CUDA events) of the training epoch and the validation pass, mean per step, ms.
    pub train_ms_per_step: f64,
    pub validate_ms_per_step: f64,
    /// How the training epochs ran with respect to CUDA graphs (after a failed capture, the run goes
    /// on without them).
    pub train_graphs: GraphCounts,
    /// The same for the validation passes.
    pub validation_graphs: GraphCounts,
}

impl DeviceRunReport {
    fn add(&mut self, step: &esper_kernels::host::DeviceReport) {
        let n = self.steps as f64;
        let mean = |old: f64, new: f64| (old * n + new) / (n + 1.0);
        self.syncs_per_step = mean(self.syncs_per_step, step.syncs as f64);
        self.train_ms_per_step = mean(self.train_ms_per_step, step.train_ms);
        self.validate_ms_per_step = mean(self.validate_ms_per_step, step.validate_ms);
        self.max_syncs_in_a_step = self.max_syncs_in_a_step.max(step.syncs);
        self.train_graphs.add(step.train_run);
        self.validation_graphs.add(step.validation_run);
        self.steps += 1;
    }
}

/// A run that could not start or stopped on an error (I/O, data).
#[derive(Debug)]
pub struct RunError(pub String);

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}

fn io_error(what: &str, e: std::io::Error) -> RunError {
    RunError(format!("{what}: {e}"))
}

/// The host architecture of a task preset.
pub fn host_arch(plan: &RunPlan) -> HostArch {
    let h = plan.task.host();
    HostArch {
        in_channels: h.in_channels as usize,
        image_size: h.image_size as usize,
        num_classes: h.num_classes as usize,
        base_channels: h.base_channels as usize,
        n_blocks: h.n_blocks as usize,
        kernel_size: h.kernel_size as usize,
        pool_layers: h.pool_layers as usize,
    }
}

/// Where the hosts train and validate (`--device` of `train`, `compare` and `bench`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostDevice {
    /// The batched CPU kernels ([`CpuHostBackend`]).
    Cpu,
    /// GPU `N` with the CUDA backend (a `cuda` build).
    Cuda(usize),
}

/// Why a `--device` name cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    Unknown(String),
    /// `cuda` / `cuda:N` in a build without CUDA.
    NotBuilt,
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Unknown(name) => write!(f, "unknown device '{name}' (known: cpu, cuda, cuda:N)"),
            DeviceError::NotBuilt => f.write_str(crate::bench::cuda_unavailable()),
        }
    }
}

impl HostDevice {
    pub fn name(self) -> String {
        match self {
            HostDevice::Cpu => "cpu".to_string(),
            HostDevice::Cuda(i) => format!("cuda:{i}"),
        }
    }

    /// Parses `cpu`, or `cuda` / `cuda:N`, which a build without CUDA refuses.
    pub fn parse(name: &str) -> Result<Self, DeviceError> {
        match name {
            "cpu" => Ok(HostDevice::Cpu),
            other => match crate::bench::cuda_ordinal(other) {
                Some(i) if cfg!(feature = "cuda") => Ok(HostDevice::Cuda(i)),
                Some(_) => Err(DeviceError::NotBuilt),
                None => Err(DeviceError::Unknown(other.to_string())),
            },
        }
    }
}

/// GPU `ordinal` opened with the kernels loaded, or why it cannot be used.
#[cfg(feature = "cuda")]
fn open_gpu(ordinal: usize) -> Result<esper_kernels::cuda::parity::Device, RunError> {
    use esper_kernels::cuda::{KernelCache, parity::Device};
    Device::open(ordinal, &KernelCache::default_location())
        .map_err(|e| RunError(format!("cuda:{ordinal} cannot be used: {e}")))
}

/// A GPU asked of a build without CUDA (parsing refuses it first; a plan built by hand may not).
#[cfg(not(feature = "cuda"))]
fn open_gpu(ordinal: usize) -> Result<std::convert::Infallible, RunError> {
    Err(RunError(format!("--device cuda:{ordinal}: {}", crate::bench::cuda_unavailable())))
}

/// Build the world: resources, one entity per env and per (env, slot), the hosts on the CPU.
pub fn build_world(plan: &RunPlan) -> Result<World, RunError> {
    build_world_on(plan, HostDevice::Cpu)
}

/// The hosts' backend for `plan` on `device`.
fn host_backend(plan: &RunPlan, device: HostDevice, slot_ids: &[(u8, u8)]) -> Result<Hosts, RunError> {
    let (cfg, arch) = (&plan.config, host_arch(plan));
    match device {
        HostDevice::Cpu => {
            Ok(Hosts::from(CpuHostBackend::new(arch, slot_ids, cfg.envs, cfg.batch_per_env, cfg.seed, 0)))
        }
        #[cfg(feature = "cuda")]
        HostDevice::Cuda(ordinal) => {
            let device = open_gpu(ordinal)?.with_precision(cfg.precision_on(HostDevice::Cuda(ordinal)));
            esper_kernels::cuda::CudaHostBackend::new(
                device,
                arch,
                slot_ids,
                cfg.envs,
                cfg.batch_per_env,
                cfg.seed,
                0,
            )
            .map(|mut backend| {
                backend.set_graphs(cfg.cuda_graphs);
                Hosts::from(backend)
            })
            .map_err(|e| RunError(format!("cuda:{ordinal} cannot be used: {e}")))
        }
        #[cfg(not(feature = "cuda"))]
        HostDevice::Cuda(ordinal) => match open_gpu(ordinal)? {},
    }
}

/// Opens `device` once and lets it go: a GPU that cannot be used is found before any work (CPU: Ok).
pub fn probe_device(device: HostDevice) -> Result<(), RunError> {
    match device {
        HostDevice::Cpu => Ok(()),
        HostDevice::Cuda(ordinal) => open_gpu(ordinal).map(drop),
    }
}

/// [`build_world`] with the hosts on `device`.
pub fn build_world_on(plan: &RunPlan, device: HostDevice) -> Result<World, RunError> {
    let cfg = &plan.config;
    let n_envs = cfg.envs;
    let dataset = Dataset::load(&plan.data).map_err(|e| RunError(e.to_string()))?;
    let batcher =
        Batcher::new(&dataset, cfg.seed, n_envs, cfg.batch_per_env).map_err(|e| RunError(e.to_string()))?;
    let arch = host_arch(plan);
    let slot_ids: Vec<(u8, u8)> = plan.slots.ids().iter().map(|id| (id.row, id.col)).collect();
    let mut world = World::new();
    let lifecycle = LifecycleConfig { topology: Topology::Cnn, ..LifecycleConfig::default() };
    insert_run_resources(&mut world, n_envs, plan.slots.clone(), lifecycle);
    world.insert_resource(StepClock {
        seed: cfg.seed,
        round: 0,
        epoch: 0,
        step: 0,
        episode_epochs: cfg.epochs as u64,
    });
    world.insert_resource(host_backend(plan, device, &slot_ids)?);
    world.insert_resource(GovernorConfig::for_classes(arch.num_classes as u32));
    world.insert_resource(TrainData { dataset, batcher });
    let signal_config = SignalConfig::default();
    world.insert_resource(signal_config);
    let policy: Box<dyn Policy> = match cfg.policy {
        PolicyKind::Heuristic => {
            let config = HeuristicConfig::new(Topology::Cnn).map_err(|e| RunError(e.to_string()))?;
            Box::new(HeuristicPolicy::new(config, n_envs))
        }
        PolicyKind::Random => Box::new(RandomPolicy),
        PolicyKind::Static => Box::new(StaticPolicy),
        PolicyKind::Ppo => {
            install_learner(&mut world, plan)?;
            return finish_world(world, plan, n_envs);
        }
    };
    world.insert_resource(ActivePolicy(policy));
    finish_world(world, plan, n_envs)
}

/// The learned policy: a fresh agent (or one from `policy_checkpoint`, with the observation and
/// reward normalisers it was trained with), and the rollout buffer unless it only evaluates.
fn install_learner(world: &mut World, plan: &RunPlan) -> Result<(), RunError> {
    let cfg = &plan.config;
    let n_slots = plan.slots.len();
    let shape = PolicyShape {
        hidden: cfg.policy_hidden,
        head_hidden: cfg.policy_hidden / 2,
        ..PolicyShape::reference(n_slots)
    };
    let device = candle_core::Device::Cpu;
    let error = |e: candle_core::Error| RunError(format!("policy: {e}"));
    let agent = PpoAgent::new(shape, cfg.seed, cfg.ppo(), &device).map_err(error)?;
    let learner = Learner::new(agent, cfg.envs, cfg.deterministic).map_err(error)?;
    world.insert_resource(learner);
    if let Some(path) = &cfg.policy_checkpoint {
        restore_checkpoint(world, path, false)?;
    }
    if !cfg.eval {
        let buffer = RolloutBuffer::new(cfg.envs, cfg.epochs, obs_dim(n_slots), n_slots);
        world.insert_resource(Rollout(buffer));
    }
    Ok(())
}

/// Load the checkpoint at `path` into the world's learner (its weights and value normaliser; with
/// `optimizer` also Adam's state and the update count) and the world's observation and reward
/// normalisers. Returns the round the checkpoint continues at.
fn restore_checkpoint(world: &mut World, path: &Path, optimizer: bool) -> Result<u64, RunError> {
    let checkpoint = checkpoint::load(path).map_err(RunError)?;
    let mut learner = world.resource_mut::<Learner>();
    checkpoint
        .restore(&mut learner.agent, optimizer)
        .map_err(|e| RunError(format!("{}: {e}", path.display())))?;
    let header = checkpoint.header;
    world.insert_resource(ObsNormalization::from_normalizer(header.obs_normalizer));
    world.insert_resource(SharedRewardNormalizer(header.reward_normalizer));
    Ok(header.next_round)
}

/// The resources and entities every policy's world has.
fn finish_world(mut world: World, plan: &RunPlan, n_envs: usize) -> Result<World, RunError> {
    let cfg = &plan.config;
    world.insert_resource(SlotReports::default());
    world.insert_resource(world.resource::<Hosts>().param_counts());
    world.insert_resource(cfg.reward());
    let ledger_capacity = ScaffoldLedger::episode_capacity(plan.slots.len(), cfg.epochs);
    for e in 0..n_envs as u32 {
        let env = spawn_env(&mut world, e, ledger_capacity);
        let signal_config = *world.resource::<SignalConfig>();
        world.entity_mut(env).insert((SignalTracker::new(&signal_config), EnvSignals::default()));
        for s in 0..plan.slots.len() as u8 {
            spawn_slot(&mut world, env, e, s);
        }
    }
    Ok(world)
}

/// A built world and its step schedule: what [`train`] drives, and what tests step by hand.
pub struct Session {
    pub world: World,
    /// The first round this session plays (after a resumed checkpoint's last, else 0).
    pub first_round: u64,
    schedule: Schedule,
    episode_end: Schedule,
    round_end: Schedule,
    /// Built once: a query state made per epoch would allocate in the run's loop.
    env_metrics: QueryState<(&'static EnvIndex, &'static HostMetrics)>,
    env_returns: QueryState<&'static EpisodeReturn>,
}

impl Session {
    /// The world for `plan` at round 0, before its first epoch.
    pub fn new(plan: &RunPlan) -> Result<Self, RunError> {
        Self::with_systems(plan, |_| {})
    }

    /// [`Session::new`] with more systems in the step schedule (tests put probes and faults between
    /// the stages this way; the sets order them).
    pub fn with_systems(plan: &RunPlan, add: impl FnOnce(&mut Schedule)) -> Result<Self, RunError> {
        let mut world = build_world_on(plan, plan.device)?;
        let mut schedule = empty_step_schedule();
        add_training_systems(&mut schedule);
        add(&mut schedule);
        schedule.initialize(&mut world).map_err(|e| RunError(format!("schedule: {e:?}")))?;
        let mut episode_end = episode_end_schedule();
        episode_end.initialize(&mut world).map_err(|e| RunError(format!("episode-end schedule: {e:?}")))?;
        let mut round_end = round_end_schedule();
        round_end.initialize(&mut world).map_err(|e| RunError(format!("round-end schedule: {e:?}")))?;
        let env_metrics = world.query();
        let env_returns = world.query();
        let mut session =
            Self { world, first_round: 0, schedule, episode_end, round_end, env_metrics, env_returns };
        if let Some(path) = &plan.resume {
            session.resume(path)?;
        }
        Ok(session)
    }

    /// Continue from a checkpoint: the learner's weights, Adam state and update count, the three
    /// normalisers, and the next round.
    fn resume(&mut self, path: &Path) -> Result<(), RunError> {
        if !self.world.contains_resource::<Learner>() {
            return Err(RunError("--resume: only a --policy ppo run has a checkpoint to resume".into()));
        }
        self.first_round = restore_checkpoint(&mut self.world, path, true)?;
        Ok(())
    }

    /// The learner's state as a checkpoint header (None when the policy does not learn).
    fn checkpoint_header(&self, plan: &RunPlan, next_round: u64) -> Option<CheckpointHeader> {
        self.world.get_resource::<Rollout>()?;
        let learner = self.world.get_resource::<Learner>()?;
        Some(CheckpointHeader {
            format_version: checkpoint::CHECKPOINT_FORMAT,
            program_version: env!("CARGO_PKG_VERSION").to_string(),
            config: plan.config.clone(),
            next_round,
            train_steps: learner.agent.train_steps,
            adam_step: learner.agent.adam.step,
            shape: learner.agent.net.shape,
            obs_normalizer: self.world.resource::<ObsNormalization>().normalizer.clone(),
            reward_normalizer: self.world.resource::<SharedRewardNormalizer>().0,
            value_normalizer: learner.agent.value_normalizer,
        })
    }

    /// Write the learner's checkpoint for `next_round` to `path` (nothing when it does not learn).
    pub fn save_checkpoint(&self, plan: &RunPlan, next_round: u64, path: &Path) -> Result<bool, RunError> {
        let Some(header) = self.checkpoint_header(plan, next_round) else { return Ok(false) };
        let learner = self.world.resource::<Learner>();
        checkpoint::save(path, &header, &learner.agent).map_err(RunError)?;
        Ok(true)
    }

    /// Every env's raw episode return this round, in no particular order.
    pub fn episode_returns(&mut self) -> Vec<f64> {
        self.env_returns.iter(&self.world).map(|r| r.raw).collect()
    }

    /// Fresh hosts, empty slots and fresh per-env state for `round` (round 0 is set up by `new`).
    pub fn start_round(&mut self, round: u64) {
        self.world.resource_mut::<StepClock>().round = round;
        if round > 0 {
            self.episode_end.run(&mut self.world);
        }
    }

    /// After a round's last epoch (or the epoch a stop request ended it at): what learns from the
    /// round — the observation normaliser's one update from the round's raw observations (and, with
    /// the learned policy, its update).
    pub fn finish_round(&mut self) {
        self.round_end.run(&mut self.world);
    }

    /// One step: host epoch `epoch` (1-based) for every env. The step index advances after it.
    pub fn run_epoch(&mut self, epoch: u64) {
        self.world.resource_mut::<StepClock>().epoch = epoch;
        self.schedule.run(&mut self.world);
        self.world.resource_mut::<StepClock>().step += 1;
    }

    /// Run the step and round-end schedules on bevy's single-threaded executor (the allocation test
    /// does: the multi-threaded executor allocates its tasks). The executors are set up here, not on
    /// their schedule's first run.
    pub fn use_single_threaded_executor(&mut self) {
        for schedule in [&mut self.schedule, &mut self.round_end] {
            schedule.set_executor(bevy_ecs::schedule::SingleThreadedExecutor::new());
            schedule.initialize(&mut self.world).expect("initialised in Session::with_systems");
        }
    }

    /// Each env's latest validation accuracy, in env order, into `out`.
    pub fn val_accuracy_into(&mut self, out: &mut Vec<f64>) {
        let n_envs = self.world.resource::<esper_systems::EnvCount>().0;
        out.clear();
        out.resize(n_envs, 0.0);
        for (env, metrics) in self.env_metrics.iter(&self.world) {
            out[env.0 as usize] = metrics.val_accuracy;
        }
    }

    /// The mean over envs of the raw episode return so far this round.
    pub fn mean_episode_return(&mut self) -> f64 {
        let (sum, n) = self.env_returns.iter(&self.world).fold((0.0, 0usize), |(s, n), r| (s + r.raw, n + 1));
        if n == 0 { 0.0 } else { sum / n as f64 }
    }

    /// The names of the step schedule's systems (module path included), in execution order.
    pub fn system_names(&self) -> Vec<String> {
        match self.schedule.systems() {
            Ok(systems) => systems.map(|(_, s)| s.name().to_string()).collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Run `plan` to completion, or until `stop` reads true after an epoch.
pub fn train(plan: &RunPlan, stop: &AtomicBool) -> Result<RunSummary, RunError> {
    let started = Instant::now();
    train_session(Session::new(plan)?, plan, stop, started)
}

/// [`train`] on a session built for `plan` (with [`Session::with_systems`], or prepared by hand),
/// timed from `started`.
pub fn train_session(
    mut session: Session,
    plan: &RunPlan,
    stop: &AtomicBool,
    started: Instant,
) -> Result<RunSummary, RunError> {
    let cfg = &plan.config;
    if session.first_round >= cfg.rounds as u64 {
        return Err(RunError(format!(
            "--resume: the checkpoint already holds {} rounds; give --rounds more than that to continue",
            session.first_round
        )));
    }

    let metrics_path = plan.out_dir.join("metrics.jsonl");
    let file = File::create(&metrics_path).map_err(|e| io_error(&metrics_path.display().to_string(), e))?;
    let sink = MetricsSink::new(Box::new(BufWriter::new(file)), &plan.slots)
        .with_reward(&cfg.reward(), cfg.log_reward_inputs)
        .with_observations(cfg.log_observations);
    session.world.insert_resource(sink);
    let trace_path = plan.trace_path();
    let writer = TraceWriter::create(&trace_path, &trace_header(plan))
        .map_err(|e| io_error(&partial_path(&trace_path).display().to_string(), e))?;
    // On a device the checksums of a step's record are read with the next step's read-back.
    session.world.insert_resource(TraceSink::deferring(Box::new(writer)));
    let first_round = session.first_round;
    let rounds_left = (cfg.rounds as u64).saturating_sub(first_round) as usize;
    let progress = (!plan.quiet).then(|| progress_bar(rounds_left * cfg.epochs));

    let mut summary = RunSummary::default();
    let mut tallies = LifecycleTally::default();
    let mut halted: Option<RunError> = None;
    // What a device's report records as its convolutions' precision (the config may leave it out).
    let device_precision = cfg.precision_on(plan.device);
    for round in first_round..cfg.rounds as u64 {
        let round_started = Instant::now();
        let _round_span = tracing::info_span!(target: "esper", "round", round).entered();
        session.start_round(round);
        for epoch in 1..=cfg.epochs as u64 {
            // The step span covers the whole schedule, `metrics.jsonl`'s Record system included, so the
            // profile's epoch boundary (end of Validate → start of the next TrainHosts) includes it.
            let step = session.world.resource::<StepClock>().step;
            let step_span =
                tracing::info_span!(target: "esper", "step", round, epoch, step, envs = cfg.envs).entered();
            session.run_epoch(epoch);
            drop(step_span);
            let report = session.world.resource_mut::<Hosts>().0.take_device_report();
            if let Some(report) = &report {
                summary
                    .device
                    .get_or_insert_with(|| DeviceRunReport {
                        precision: device_precision,
                        ..Default::default()
                    })
                    .add(report);
            }
            if plan.count_syncs {
                let line = match &report {
                    Some(r) => format!(
                        "step {step}: {} copies back from the device (train {:.2} ms, validate {:.2} ms on it; \
                         {})",
                        r.syncs,
                        r.train_ms,
                        r.validate_ms,
                        r.epochs_ran()
                    ),
                    None => format!("step {step}: 0 copies back (no device: the hosts run on the CPU)"),
                };
                // On stdout in every case (a hidden bar's println would drop the line): the bar steps
                // aside while it prints.
                match &progress {
                    Some(bar) => bar.suspend(|| println!("{line}")),
                    None => println!("{line}"),
                }
            }
            if let Some(err) = session.world.resource::<MetricsSink>().error() {
                return Err(RunError(err.to_string()));
            }
            if let Some(err) = session.world.resource::<TraceSink>().error() {
                return Err(RunError(err.to_string()));
            }
            session.val_accuracy_into(&mut summary.final_val_accuracy);
            summary.epochs_completed += 1;
            if let Some(bar) = &progress {
                let mean = mean(&summary.final_val_accuracy);
                let ret = session.mean_episode_return();
                bar.set_message(format!(
                    "round {}/{} epoch {epoch}/{} | val acc {mean:5.1}% | return {ret:6.2}",
                    round + 1,
                    cfg.rounds,
                    cfg.epochs
                ));
                bar.inc(1);
            }
            if stop.load(Ordering::SeqCst) {
                summary.interrupted = true;
                break;
            }
        }
        // As the reference on a graceful stop: a partial round's observations still make the round-end
        // update (the learner's update needs a complete round, see `ppo_update`).
        session.finish_round();
        add_tallies(&mut session.world, &mut tallies);
        let returns = session.episode_returns();
        summary.mean_episode_return.push(mean(&returns));
        if session.world.resource::<StepClock>().is_last_epoch() {
            summary.rounds_completed += 1;
            // This round's update (only a learner's) and the finiteness gate's count after it.
            let (update, failures) = session
                .world
                .get_resource::<Learner>()
                .map_or((None, 0), |l| (l.last_update.clone(), l.finiteness_failures));
            let stepped = update.as_ref().is_some_and(|m| m.epochs_run > 0);
            if session.save_checkpoint(plan, round + 1, &checkpoint::path_in(&plan.out_dir))? && stepped {
                summary.policy_updates += 1;
            }
            let seconds = round_started.elapsed().as_secs_f64();
            write_round_line(&mut session, round, &returns, seconds, cfg.envs * cfg.epochs);
            if let Some(err) = session.world.resource::<MetricsSink>().error() {
                return Err(RunError(err.to_string()));
            }
            // simic §1.4.3: a warning for an update skipped whole for non-finite values, and the run
            // stops at the third (counted as the reference counts them, `finiteness_failures_after`),
            // after this round's lines and checkpoint are written.
            if update.as_ref().is_some_and(UpdateMetrics::skipped_for_nonfinite) {
                let line = format!(
                    "round {}: the PPO update was skipped, every epoch hit non-finite values \
                     ({failures} of the {FINITENESS_FAILURE_LIMIT} that stop the run)",
                    round + 1
                );
                match &progress {
                    Some(bar) => bar.suspend(|| eprintln!("{line}")),
                    None => eprintln!("{line}"),
                }
            }
            if failures >= FINITENESS_FAILURE_LIMIT {
                halted = Some(RunError(format!(
                    "PPO training failed: {failures} updates were skipped for non-finite values \
                     (the policy's or the critic's outputs hold NaN or infinity); the rounds so far are written in {}",
                    plan.out_dir.display()
                )));
                break;
            }
        }
        if summary.interrupted {
            break;
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    // The last step's record, if it waits for its checksums (the one copy back the run adds).
    session.world.resource_scope(|world, mut sink: Mut<TraceSink>| sink.flush(&*world.resource::<Hosts>().0));
    if let Some(err) = session.world.resource::<TraceSink>().error() {
        return Err(RunError(err.to_string()));
    }
    let writer = session
        .world
        .remove_resource::<TraceSink>()
        .and_then(|sink| sink.into_inner().downcast::<TraceWriter>().ok())
        .expect("the trace writer installed above");
    writer
        .finish(summary.rounds_completed as u64, summary.interrupted)
        .map_err(|e| io_error(&trace_path.display().to_string(), e))?;
    summary.wall_seconds = started.elapsed().as_secs_f64();
    summary.env_epochs_per_second =
        (summary.epochs_completed * cfg.envs) as f64 / summary.wall_seconds.max(1e-9);
    summary.mean_final_val_accuracy = mean(&summary.final_val_accuracy);
    summary.seeds_germinated = tallies.germinated as u64;
    summary.seeds_fossilized = tallies.fossilized as u64;
    summary.seeds_pruned = tallies.pruned as u64;
    summary.failed_ops = tallies.failed_ops as u64;
    summary.rollbacks = tallies.rollbacks as u64;
    summary.vetoed_ops = tallies.vetoed as u64;
    write_summary(plan, &summary)?;
    if let Some(err) = halted {
        return Err(err);
    }
    if !plan.quiet && plan.table {
        print_table(plan, &summary);
    }
    Ok(summary)
}

/// The round's line in `metrics.jsonl`: the raw episode returns' mean and spread, throughput, and
/// the learner's update (losses, KL, clip fraction, explained variance, per-head entropy, grad norm)
/// when it learned.
fn write_round_line(session: &mut Session, round: u64, returns: &[f64], seconds: f64, env_epochs: usize) {
    let mean = mean(returns);
    let std = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / returns.len().max(1) as f64).sqrt();
    let update = session.world.get_resource::<Learner>().and_then(|l| l.last_update.clone());
    let line = serde_json::json!({
        "kind": "round",
        "round": round,
        "episode_return_mean": mean,
        "episode_return_std": std,
        "env_epochs_per_second": env_epochs as f64 / seconds.max(1e-9),
        "update": update,
    });
    session.world.resource_mut::<MetricsSink>().write_line(&line);
}

/// The header of `plan`'s trace.
pub fn trace_header(plan: &RunPlan) -> TraceHeader {
    let cfg = &plan.config;
    TraceHeader {
        program_version: env!("CARGO_PKG_VERSION").to_string(),
        git_commit: crate::trace::git_commit(),
        config_json: serde_json::to_string(cfg).expect("a config serialises"),
        task: plan.task.name().to_string(),
        data: cfg.data.name().to_string(),
        policy: cfg.policy.name().to_string(),
        seed: cfg.seed,
        envs: cfg.envs as u64,
        rounds: cfg.rounds as u64,
        epochs: cfg.epochs as u64,
        slots: plan.slots.ids().iter().map(|s| s.to_string()).collect(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}

/// Sum every env's lifecycle tally into `total` and clear them (one round's worth).
fn add_tallies(world: &mut World, total: &mut LifecycleTally) {
    let mut envs = world.query::<&mut LifecycleTally>();
    for mut t in envs.iter_mut(world) {
        total.germinated += t.germinated;
        total.fossilized += t.fossilized;
        total.pruned += t.pruned;
        total.failed_ops += t.failed_ops;
        total.rollbacks += t.rollbacks;
        total.vetoed += t.vetoed;
        *t = LifecycleTally::default();
    }
}

fn progress_bar(len: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len as u64);
    let style =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} epochs  {per_sec}  eta {eta}  {msg}")
            .expect("static template");
    bar.set_style(style);
    bar
}

#[derive(serde::Serialize)]
struct SummaryFile<'a> {
    config: &'a crate::config::RunConfig,
    task: &'a str,
    data: &'a str,
    #[serde(flatten)]
    summary: &'a RunSummary,
}

fn write_summary(plan: &RunPlan, summary: &RunSummary) -> Result<(), RunError> {
    let path = plan.out_dir.join("summary.json");
    let file =
        SummaryFile { config: &plan.config, task: plan.task.name(), data: plan.config.data.name(), summary };
    let text = serde_json::to_string_pretty(&file).map_err(|e| RunError(format!("summary.json: {e}")))?;
    write_atomically(&path, &text)
}

/// Write `contents` to `path` through a temporary file and a rename, so an interrupted write never
/// leaves a torn file.
pub fn write_atomically(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), RunError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| io_error(&tmp.display().to_string(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(&path.display().to_string(), e))
}

fn print_table(plan: &RunPlan, s: &RunSummary) {
    let accs = &s.final_val_accuracy;
    let (min, max) = min_max(accs);
    println!(
        "esper-ecs train — {} envs, {} task, {} policy",
        plan.config.envs,
        plan.task.name(),
        plan.config.policy
    );
    println!(
        "  rounds {}  epochs {}{}",
        s.rounds_completed,
        s.epochs_completed,
        if s.interrupted { "  (interrupted)" } else { "" }
    );
    println!("  wall {:.1} s  {:.2} env-epochs/s", s.wall_seconds, s.env_epochs_per_second);
    println!("  final val acc  mean {:.1} %  min {min:.1} %  max {max:.1} %", s.mean_final_val_accuracy);
    let returns: Vec<String> = s.mean_episode_return.iter().map(|r| format!("{r:.2}")).collect();
    let reward = match plan.config.reward_family {
        esper_components::RewardFamily::Contribution => plan.config.reward_mode.to_string(),
        esper_components::RewardFamily::Loss => "loss".to_string(),
    };
    println!("  mean episode return ({reward} reward)  {}", returns.join("  "));
    println!(
        "  seeds  germinated {}  fossilized {}  pruned {}  failed ops {}  rollbacks {}",
        s.seeds_germinated, s.seeds_fossilized, s.seeds_pruned, s.failed_ops, s.rollbacks
    );
    if let Some(d) = &s.device {
        println!(
            "  device  {} convolutions  train {:.1} ms  validate {:.1} ms per step (CUDA events)  {:.1} copies \
             back per step (most {})",
            d.precision.name(),
            d.train_ms_per_step,
            d.validate_ms_per_step,
            d.syncs_per_step,
            d.max_syncs_in_a_step
        );
        let (t, v) = (d.train_graphs, d.validation_graphs);
        let failed = match t.capture_failed + v.capture_failed {
            0 => String::new(),
            _ => " (a capture failed: graphs off after it)".to_string(),
        };
        println!(
            "  device  from a CUDA graph: training epochs {} of {} ({} captured), validation passes {} ({} \
             captured){failed}",
            t.replayed, d.steps, t.captured, v.replayed, v.captured
        );
    }
    println!("  output {}", plan.out_dir.display());
}
