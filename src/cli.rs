//! The `esper-ecs` command line (clap derive). Every `train` flag is optional so that a flag given on
//! the command line overrides the `--config` file, which overrides [`RunConfig::default`]; the help text
//! states each default.
//!
//! Exit codes: 0 success (also a run stopped by Ctrl-C), 1 the run failed, 2 bad input (usage errors
//! from clap, and every [`ConfigError`]); no subcommand prints the help to stderr with exit code 2.

use crate::config::{ConfigError, DataKind, PolicyKind, RunConfig};
use clap::{Args, Parser, Subcommand};
use esper_components::{RewardFamily, RewardMode, TaskPreset};
use esper_kernels::ops::precision::Precision;
use std::fmt::Display;
use std::path::PathBuf;

/// Exit code of a run that started and failed.
pub const EXIT_RUN_FAILED: u8 = 1;
/// Exit code of bad input: usage errors and invalid configurations (clap uses 2 as well).
pub const EXIT_BAD_INPUT: u8 = 2;

/// Vectorized morphogenetic training: many small host networks train side by side, one per environment,
/// while a policy grows, blends, keeps or prunes seed modules in fixed slots once per host epoch.
///
/// Every stage of an epoch runs as one batched operation over all environments, scheduled by bevy_ecs.
/// The seed lifecycle (stages, gates, alpha ramps, action masks), the batched host kernels and fused
/// validation are implemented; `esper-ecs train` runs them: N envs, a heuristic, random or static
/// policy, on built-in synthetic data or CIFAR-10, and records every step in `trace.bin`.
/// `esper-ecs replay` reports, verifies, exports or draws a `trace.bin`; `compare` runs policies ×
/// seeds; `profile` reads a run's timing trace as a per-system table; `bench` measures step throughput.
#[derive(Parser, Debug)]
#[command(name = "esper-ecs", version, about, long_about, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Train(TrainArgs),
    Compare(CompareArgs),
    Replay(ReplayArgs),
    Profile(ProfileArgs),
    Bench(BenchArgs),
    Selftest(SelftestArgs),
}

/// Check a CUDA build on a machine with a GPU: compile every kernel with NVRTC (or read it from the
/// on-disk cache), then run each kernel on the device against its CPU twin on the same inputs and print
/// a table (kernel, twin, elements, largest difference, tolerance). Needs a build with the `cuda`
/// feature (docs/gpu.md); the test executables are not needed.
#[derive(Args, Debug)]
#[command(after_help = "Exit codes: 0 every check passed, 1 a check failed or no device could be used, 2 \
                        bad input (a build without CUDA).")]
pub struct SelftestArgs {
    #[arg(long, value_name = "DEVICE", default_value = "cuda", help = "The device to check: cuda or cuda:N")]
    pub device: String,
}

/// Read a run's trace.bin: a report, a verification by re-running it, JSON lines, or a picture.
///
/// Without flags: the run config, a summary per round (mean final validation accuracy, mean return,
/// executed ops by kind, seeds germinated / fossilized / pruned, rollbacks) and per env a lifecycle
/// timeline, one line per slot and one character per epoch. Reads `trace.bin` and the
/// `trace.bin.partial` of a run that is still going or was killed (up to its last complete step).
/// `--verify` re-runs the recorded config with this build on the CPU and checks every step of every
/// env: the sampled action, the effective op and its outcome, stages, rewards, metrics and the
/// parameter checksum, bit for bit; it reports the first divergence. `--json` and `--plot` export.
#[derive(Args, Debug)]
#[command(
    after_help = "Exit codes: 0 done (verify: every compared step matches), 1 verify found a divergence \
                  or the re-run failed, 2 bad input (a missing, damaged or unsupported trace, bad \
                  flags, a --rounds range the trace does not hold)."
)]
pub struct ReplayArgs {
    /// The trace: <run folder>/trace.bin, or trace.bin.partial.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    #[arg(long, help = "Re-run the recorded config and check every step against the trace")]
    pub verify: bool,

    #[arg(
        long,
        value_name = "X",
        requires = "verify",
        help = "With --verify: compare floats within a \
          relative tolerance X and the parameter fingerprints instead of the bit-exact checksum (for a \
          trace made on another device)"
    )]
    pub tolerance: Option<f64>,

    #[arg(long, value_name = "A..B", requires = "verify", value_parser = parse_round_range,
          help = "With --verify: compare rounds A to B−1 only (also A..=B, or one round A). The rounds \
                  before A are re-run, not compared, since no checkpoint of the policy exists to start from")]
    pub rounds: Option<std::ops::Range<u64>>,

    #[arg(long, conflicts_with_all = ["verify", "plot"],
          help = "Print the header and every env's record of every step as JSON lines (for jq or pandas)")]
    pub json: bool,

    #[arg(
        long,
        value_name = "FILE.svg|FILE.png",
        conflicts_with = "verify",
        help = "Draw every env's slots as swimlanes over the epochs, coloured by stage, with the mean \
                  validation accuracy (and return) below, to an SVG or PNG file"
    )]
    pub plot: Option<PathBuf>,

    #[arg(long, help = "No progress bar while verifying")]
    pub quiet: bool,
}

fn parse_round_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    crate::replay::parse_rounds(s)
}

/// Train every policy × run seed with the same settings and compare their final accuracy.
///
/// Runs `train` once per policy and seed (policies outer, seeds inner) with every other setting shared —
/// any `train` flag or `--config` applies to all runs — each into `<out>/<policy>-seed<S>/` with its own
/// metrics.jsonl and summary.json. Prints per policy the mean ± sd over the seeds of the runs' mean final
/// validation accuracy, and every run's figure, and writes them as `<out>/compare.json` and
/// `<out>/compare.csv`. `--quiet` drops the progress (the table is still printed). Ctrl-C stops the
/// current run after its epoch, skips the rest and still writes the comparison of what ran.
#[derive(Args, Debug)]
#[command(after_help = "Exit codes: 0 done (also when stopped by Ctrl-C), 1 a run failed, 2 bad input.")]
pub struct CompareArgs {
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_policy_kind,
          default_value = "static,random,heuristic",
          help = "Policies to compare, comma-separated (ppo, heuristic, random, static); ppo evaluates \
                  --policy-checkpoint FILE when given (else it trains from scratch for --rounds)")]
    pub policies: Vec<PolicyKind>,

    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,2,3",
        help = "Run seeds, comma-separated; each seed also generates its own synthetic data"
    )]
    pub seeds: Vec<u64>,

    #[command(flatten)]
    pub train: TrainArgs,
}

impl CompareArgs {
    /// The settings every run shares: the `train` flags, without `--policy`, `--seed` and `--profile`
    /// (each run's policy and seed come from `--policies` and `--seeds`).
    pub fn to_config(&self) -> Result<RunConfig, ConfigError> {
        let refuse =
            |name: &'static str, reason: &str| Err(ConfigError::Invalid { name, reason: reason.into() });
        if self.train.policy.is_some() {
            return refuse("--policy", "compare takes --policies LIST");
        }
        if self.train.seed.is_some() {
            return refuse("--seed", "compare takes --seeds LIST");
        }
        if !self.train.profile.is_empty() {
            return refuse("--profile", "profile a single run with `esper-ecs train --profile`");
        }
        if self.train.trace.is_some() {
            return refuse("--trace", "every run writes its own <run folder>/trace.bin");
        }
        let mut seen = Vec::new();
        for p in &self.policies {
            if seen.contains(p) {
                return refuse("--policies", &format!("{p} is listed twice"));
            }
            seen.push(*p);
        }
        let mut seeds = self.seeds.clone();
        seeds.sort_unstable();
        if seeds.windows(2).any(|w| w[0] == w[1]) {
            return refuse("--seeds", "a seed is listed twice");
        }
        let mut config = self.train.to_config()?;
        config.out = None; // the compare folder is `--out`; each run gets a folder inside it
        config.trace = None; // and writes its trace.bin there
        Ok(config)
    }
}

/// What `train --profile` records and prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileMode {
    /// Print the per-system table at the end (the trace goes to `<out>/trace.json`).
    Table,
    /// Write the Chrome/Perfetto trace to this file.
    Chrome(PathBuf),
}

fn parse_profile_mode(s: &str) -> Result<ProfileMode, String> {
    match s.split_once('=') {
        None if s == "table" => Ok(ProfileMode::Table),
        Some(("chrome", path)) if !path.is_empty() => Ok(ProfileMode::Chrome(PathBuf::from(path))),
        Some(("chrome", _)) => Err("chrome=FILE needs a file name".into()),
        _ => Err("expected `table` or `chrome=FILE.json`".into()),
    }
}

/// Read saved traces: a per-system table, or two runs compared system by system.
///
/// With one file: calls, mean, p50, p95, total and share of the step for every system (span
/// `<Set>::<system>`), sorted by total, and the share of the step spent in the epoch boundary (end
/// of Validate to the end of the step). With two: the mean per call of each system in A and B and the
/// ratio B / A. The files are Chrome traces written by `esper-ecs train --profile chrome=FILE` or
/// `--profile table` (`<out>/trace.json`); see docs/profiling.md.
#[derive(Args, Debug)]
#[command(after_help = "Exit codes: 0 done, 2 a file is missing or not a trace of esper-ecs train.")]
pub struct ProfileArgs {
    /// The trace to read (A when comparing).
    #[arg(value_name = "TRACE.json")]
    pub trace: PathBuf,
    /// A second trace (B) to compare with the first.
    #[arg(value_name = "OTHER.json")]
    pub other: Option<PathBuf>,
}

/// Measure the throughput of one step at several env counts, in three tiers.
///
/// Tier 1 trains the hosts only; tier 2 adds fused validation (with its counterfactual
/// configurations), observation and the policy's decision; tier 3 is the full loop (+ lifecycle ops,
/// tick, record). The workload is fixed: synthetic data giving every env `--train-batches` batches of
/// `--batch-per-env` images per step and `--test-per-env` validation images, and three BLENDING seeds
/// per env at alpha 0.5 (conv_light, attention, conv_heavy) restored before every step. Prints a
/// table (median ms per step, spread, ms per env, training images/s, env-epochs/s) and the epoch
/// boundary's host time per step with its growth from 16 to 256 envs, and writes it all as JSON. An
/// env count that would not fit in memory is skipped with the reason.
#[derive(Args, Debug)]
#[command(after_help = "Exit codes: 0 done, 1 the bench failed, 2 bad input.")]
pub struct BenchArgs {
    #[arg(long, value_name = "LIST", default_value = "1,4,16,64,256", value_parser = parse_env_list,
          help = "Env counts, comma-separated")]
    pub envs: EnvList,

    #[arg(long, value_name = "PRESET", default_value = "cifar_baseline", help = "Host preset")]
    pub task: String,

    #[arg(
        long,
        value_name = "DEVICE",
        default_value = "cpu",
        help = "Device: cpu; cuda or cuda:N needs a build with --features cuda (bash ../shared/tools/cuda-build.sh; docs/gpu.md)"
    )]
    pub device: String,

    #[arg(long, value_name = "P", value_parser = Precision::parse, help = with_default(PRECISION_HELP,
        PRECISION_DEFAULT))]
    pub precision: Option<Precision>,

    #[arg(
        long,
        value_name = "on|off",
        default_value = "on",
        action = clap::ArgAction::Set,
        value_parser = parse_on_off,
        help = "On a GPU, replay each training epoch whose launches repeat the last one's from a CUDA graph \
                (one launch per epoch); off: launch by launch"
    )]
    pub cuda_graphs: bool,

    #[arg(
        long,
        value_name = "STATE",
        default_value = "blending",
        help = "The lifecycle state every step starts from: blending (three BLENDING seeds per env, \
                heuristic policy: live seeds and their counterfactual validation) or none (empty slots, \
                static policy: the bare host)"
    )]
    pub seeds: String,

    #[arg(long, value_name = "B", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..),
          help = "Training images per env per batch (64 keeps 256 envs within 24 GiB with three seeds each)")]
    pub batch_per_env: u32,

    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..),
          help = "Training batches per env per step")]
    pub train_batches: u32,

    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..),
          help = "Validation images per env per step")]
    pub test_per_env: u32,

    #[arg(long, value_name = "N", default_value_t = 1, help = "Unmeasured warm-up steps per tier")]
    pub warmup: u32,

    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..),
          help = "Timed steps per tier (median and spread are over these)")]
    pub reps: u32,

    #[arg(long, value_name = "S", default_value_t = 0, help = "Seed of the synthetic data and the hosts")]
    pub seed: u64,

    #[arg(
        long,
        value_name = "FILE",
        help = "Where to write the JSON report [default: runs/bench-<UTC timestamp>.json]"
    )]
    pub json: Option<PathBuf>,
}

/// A comma-separated list of env counts, each at least 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvList(pub Vec<usize>);

fn parse_env_list(s: &str) -> Result<EnvList, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let n: usize = part.trim().parse().map_err(|_| format!("'{part}' is not a whole number"))?;
        if n == 0 {
            return Err("every env count must be at least 1".into());
        }
        out.push(n);
    }
    Ok(EnvList(out))
}

/// Train host networks in parallel envs while the policy drives the seed lifecycle.
///
/// Runs `--rounds` rounds of `--epochs` host epochs in `--envs` environments (fresh hosts every round),
/// writes metrics.jsonl and summary.json to `--out` and prints a summary table. Every setting can also
/// come from a TOML file (`--config`, keys as in the flags with `_` for `-`, plus
/// synthetic_train_per_env and synthetic_test_per_env); flags override it. Relative paths are relative
/// to the working directory. The on/off flags (--disable-…, --log-reward-inputs) can only switch a
/// setting on; to switch off one that a config file sets, edit the file. Ctrl-C (or SIGTERM, SIGHUP)
/// stops after the current epoch and still writes the summary; a second one exits at once.
#[derive(Args, Debug, Default)]
#[command(after_help = "Exit codes: 0 done (also when stopped by Ctrl-C), 1 the run failed, 2 bad input.")]
pub struct TrainArgs {
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          help = with_default("Parallel environments, one host network each", d().envs))]
    pub envs: Option<usize>,

    #[arg(long, value_name = "R", allow_negative_numbers = true,
          help = with_default("Rounds; every round starts fresh hosts", d().rounds))]
    pub rounds: Option<usize>,

    #[arg(long, value_name = "T", allow_negative_numbers = true,
          help = with_default("Host epochs per episode (policy decisions per env per round)", d().epochs))]
    pub epochs: Option<usize>,

    #[arg(long, value_name = "PRESET", help = with_default(
        &format!("Host preset: {}", TaskPreset::ALL.map(|t| t.name()).join(", ")), d().task))]
    pub task: Option<String>,

    #[arg(long, value_name = "KIND", value_parser = parse_data_kind, help = with_default(
        &format!(
            "Data: synthetic (built in, sized to the env count: {} train + {} test images per env) or \
             cifar10 (needs --data-dir)",
            d().synthetic_train_per_env, d().synthetic_test_per_env
        ),
        "synthetic"))]
    pub data: Option<DataKind>,

    #[arg(long, value_name = "DIR", help = with_default(
        "Folder with the CIFAR-10 binary files (data_batch_1.bin … data_batch_5.bin, test_batch.bin), \
         directly or in cifar-10-batches-bin/",
        "none"))]
    pub data_dir: Option<PathBuf>,

    #[arg(long, value_name = "LIST", help = with_default(
        "Enabled seed slots, comma-separated r<row>c<col> ids of the task's host", d().slots))]
    pub slots: Option<String>,

    #[arg(long, value_name = "POLICY", value_parser = parse_policy_kind,
          help = with_default("Policy: ppo (the learned LSTM policy, trained with PPO once per round; \
                               saves <out>/checkpoint.safetensors after every round), heuristic (Tamiyo's \
                               rules), random (uniform legal actions) or static (never germinates: the \
                               static host, the baseline to judge the others by)",
                              "ppo"))]
    pub policy: Option<PolicyKind>,

    #[arg(long, value_name = "K", allow_negative_numbers = true,
          help = with_default("PPO passes over each round's batch", d().ppo_epochs))]
    pub ppo_epochs: Option<usize>,

    #[arg(long, value_name = "LR", allow_negative_numbers = true,
          help = with_default("PPO: Adam's learning rate", d().ppo_lr))]
    pub ppo_lr: Option<f64>,

    #[arg(long, value_name = "C", allow_negative_numbers = true,
          help = with_default("PPO: entropy coefficient (per-head multipliers on top)", d().entropy_coef))]
    pub entropy_coef: Option<f64>,

    #[arg(
        long,
        value_name = "C",
        allow_negative_numbers = true,
        help = "PPO: anneal the entropy coefficient linearly from --entropy-coef to this \
                  over --entropy-anneal-episodes (default: no anneal)"
    )]
    pub entropy_coef_end: Option<f64>,

    #[arg(long, value_name = "N",
          help = with_default("PPO: episodes the entropy anneal takes, ceil(N / envs) updates (0: none)",
                              d().entropy_anneal_episodes))]
    pub entropy_anneal_episodes: Option<usize>,

    #[arg(long, value_name = "KL", allow_negative_numbers = true,
          help = with_default("PPO: stop a round's passes when the approximate KL exceeds 1.5× this (0: never)",
                              d().target_kl))]
    pub target_kl: Option<f64>,

    #[arg(long, value_name = "H", allow_negative_numbers = true,
          help = with_default("The learned policy's LSTM width (heads are half of it)", d().policy_hidden))]
    pub policy_hidden: Option<usize>,

    #[arg(long, value_name = "FILE", help = with_default(
        "Start the learned policy from this checkpoint (weights and normalisers; a run's \
         checkpoint.safetensors)", "none"))]
    pub policy_checkpoint: Option<PathBuf>,

    #[arg(long, help = "Run the --policy-checkpoint policy without learning (no updates, no checkpoints)")]
    pub eval: bool,

    #[arg(
        long,
        help = "The learned policy takes each head's most probable legal choice instead of sampling"
    )]
    pub deterministic: bool,

    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "policy_checkpoint"], help = with_default(
        "Continue the run a checkpoint.safetensors was saved from, at its next round, with its config \
         (only --rounds, --out, --force, --trace, --device, --precision, --cuda-graphs, --quiet, --count-syncs and --profile may be given with it)", "none"))]
    pub resume: Option<PathBuf>,

    #[arg(long, value_name = "S", allow_negative_numbers = true,
          help = with_default("Run seed; every random draw derives from it", d().seed))]
    pub seed: Option<u64>,

    #[arg(long, value_name = "DEVICE", help = with_default(
        "Where the hosts train and validate: cpu, or cuda / cuda:N (a build with --features cuda: bash \
         ../shared/tools/cuda-build.sh; docs/gpu.md)", "cpu"))]
    pub device: Option<String>,

    #[arg(long, value_name = "P", value_parser = Precision::parse, help = with_default(PRECISION_HELP,
        PRECISION_DEFAULT))]
    pub precision: Option<Precision>,

    #[arg(long, value_name = "on|off", value_parser = parse_on_off, help = with_default(
        "On a GPU, replay each training epoch whose launches repeat the last one's from a CUDA graph \
         (one launch per epoch); off: launch by launch", "on"))]
    pub cuda_graphs: Option<bool>,

    #[arg(long, value_name = "B", allow_negative_numbers = true,
          help = with_default("Training images per env per step", d().batch_per_env))]
    pub batch_per_env: Option<usize>,

    #[arg(long, value_name = "MODE", value_parser = parse_reward_mode, help = with_default(
        &format!("Reward mode (simic §2): {}", RewardMode::ALL.map(|m| m.name()).join(", ")), "shaped"))]
    pub reward_mode: Option<RewardMode>,

    #[arg(long, value_name = "FAMILY", value_parser = parse_reward_family, help = with_default(
        "Reward family: contribution (the modes above) or loss (validation-loss based; only with \
         --reward-mode shaped)", "contribution"))]
    pub reward_family: Option<RewardFamily>,

    #[arg(
        long,
        help = "Reward without the PBRS stage-potential terms (also drops the germinate bonus and \
                        its end-of-episode clawback)"
    )]
    pub disable_pbrs: bool,

    #[arg(
        long,
        help = "Reward without the terminal accuracy terms of shaped, escrow and simplified (and the \
                        fossilize bonus gated on them); basic's last-epoch delta, sparse and the loss family \
                        keep theirs, as in the reference"
    )]
    pub disable_terminal_reward: bool,

    #[arg(long, help = "Reward without the anti-gaming ratio penalty and alpha shock")]
    pub disable_anti_gaming: bool,

    #[arg(long, value_name = "P", allow_negative_numbers = true, help = with_default(
        "Parameter budget of the basic modes' rent and sparse's fossil cost", d().param_budget))]
    pub param_budget: Option<f64>,

    #[arg(long, value_name = "W", allow_negative_numbers = true, help = with_default(
        "Weight of the basic modes' rent and sparse's fossil cost", d().param_penalty_weight))]
    pub param_penalty_weight: Option<f64>,

    #[arg(long, value_name = "S", allow_negative_numbers = true, help = with_default(
        "Scale of the sparse / minimal terminal reward", d().sparse_reward_scale))]
    pub sparse_reward_scale: Option<f64>,

    #[arg(long, value_name = "N", allow_negative_numbers = true, help = with_default(
        "Floor of the host parameter count in the shaped/escrow rent and alpha-shock ratios",
        d().rent_host_params_floor))]
    pub rent_host_params_floor: Option<f64>,

    #[arg(long, value_name = "W", allow_negative_numbers = true, help = with_default(
        "Weight of the basic modes' terminal accuracy delta", d().basic_acc_delta_weight))]
    pub basic_acc_delta_weight: Option<f64>,

    #[arg(
        long,
        help = "Every metrics.jsonl line also carries the inputs its reward was computed from \
                        (reward_inputs)"
    )]
    pub log_reward_inputs: bool,

    #[arg(
        long,
        help = "Every metrics.jsonl line also carries the env's raw observation (observation: the \
                23 + 31·S Obs V3 features the policy's input was normalised from) and its \
                blueprint_indices — for debugging a policy"
    )]
    pub log_observations: bool,

    #[arg(long, value_name = "FILE", help = with_default(
        "TOML file setting any run field (unknown keys are an error); flags override it", "none"))]
    pub config: Option<PathBuf>,

    #[arg(long, value_name = "DIR",
          help = with_default("Output directory (must not exist unless --force)", "runs/<UTC timestamp>"))]
    pub out: Option<PathBuf>,

    #[arg(long, help = "Write into an existing --out directory")]
    pub force: bool,

    #[arg(long, value_name = "FILE", help = with_default(
        "Write the run's trace (every step's actions, outcomes, rewards, stages, metrics and parameter \
         checksums; read it with `esper-ecs replay`) to FILE instead of <out>/trace.bin",
        "<out>/trace.bin"))]
    pub trace: Option<PathBuf>,

    #[arg(long, help = "No progress bar and no summary table")]
    pub quiet: bool,

    #[arg(
        long,
        help = "Print, after every step, how many copies back from the device it waited for (and the \
                device's training and validation ms); on --device cpu there is no device: 0"
    )]
    pub count_syncs: bool,

    #[arg(long, value_name = "MODE", value_parser = parse_profile_mode, help = with_default(
        "Profile the run: `table` prints a per-system timing table at the end (trace in <out>/trace.json); \
         `chrome=FILE.json` writes a Chrome/Perfetto trace (open it in ui.perfetto.dev). Give both to get both",
        "off"))]
    pub profile: Vec<ProfileMode>,
}

impl TrainArgs {
    /// The run config: [`RunConfig::default`], then the `--config` file, then the flags given.
    /// `--data synthetic` on the command line also drops a `data_dir` that came from the file (it would
    /// be an error with synthetic data); a `--data-dir` flag is kept and rejected by `resolve`.
    pub fn to_config(&self) -> Result<RunConfig, ConfigError> {
        if let Some(path) = &self.resume {
            return self.resumed_config(path);
        }
        let base = match &self.config {
            Some(path) => RunConfig::from_toml_file(path)?,
            None => RunConfig::default(),
        };
        Ok(self.apply(base))
    }

    /// `--resume`: the checkpoint's config with `--rounds`, `--out` and `--trace` applied; any other
    /// setting given is an error (the run would not be the one the checkpoint continues), and so is a
    /// `--rounds` the checkpoint already holds.
    fn resumed_config(&self, path: &std::path::Path) -> Result<RunConfig, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { name: "--resume", reason };
        let header = crate::checkpoint::read_header(path).map_err(invalid)?;
        let saved = RunConfig { out: None, trace: None, ..header.config };
        let given = self.apply(saved.clone());
        // Where the hosts run may change (a run begun on the CPU may go on on a GPU, or back).
        let allowed = RunConfig {
            rounds: given.rounds,
            out: given.out.clone(),
            trace: given.trace.clone(),
            device: given.device.clone(),
            precision: given.precision,
            cuda_graphs: given.cuda_graphs,
            ..saved
        };
        if given != allowed {
            return Err(invalid(
                "continues the checkpoint's run with its config; only --rounds, --out, --force, --trace, \
                 --device, --precision, --cuda-graphs, --quiet, --count-syncs and --profile may be given with it"
                    .into(),
            ));
        }
        if given.rounds as u64 <= header.next_round {
            return Err(invalid(format!(
                "the checkpoint already holds {} rounds; give --rounds more than that to continue",
                header.next_round
            )));
        }
        Ok(given)
    }

    /// The flags given, over `c`.
    fn apply(&self, mut c: RunConfig) -> RunConfig {
        set(&mut c.envs, self.envs);
        set(&mut c.rounds, self.rounds);
        set(&mut c.epochs, self.epochs);
        set(&mut c.task, self.task.clone());
        set(&mut c.data, self.data);
        if self.data == Some(DataKind::Synthetic) {
            c.data_dir = None;
        }
        if self.data_dir.is_some() {
            c.data_dir = self.data_dir.clone();
        }
        set(&mut c.slots, self.slots.clone());
        set(&mut c.policy, self.policy);
        set(&mut c.seed, self.seed);
        set(&mut c.device, self.device.clone());
        set(&mut c.precision, self.precision.map(Some));
        set(&mut c.cuda_graphs, self.cuda_graphs);
        set(&mut c.batch_per_env, self.batch_per_env);
        set(&mut c.reward_mode, self.reward_mode);
        set(&mut c.reward_family, self.reward_family);
        c.disable_pbrs |= self.disable_pbrs;
        c.disable_terminal_reward |= self.disable_terminal_reward;
        c.disable_anti_gaming |= self.disable_anti_gaming;
        set(&mut c.param_budget, self.param_budget);
        set(&mut c.param_penalty_weight, self.param_penalty_weight);
        set(&mut c.sparse_reward_scale, self.sparse_reward_scale);
        set(&mut c.rent_host_params_floor, self.rent_host_params_floor);
        set(&mut c.basic_acc_delta_weight, self.basic_acc_delta_weight);
        c.log_reward_inputs |= self.log_reward_inputs;
        c.log_observations |= self.log_observations;
        if self.out.is_some() {
            c.out = self.out.clone();
        }
        if self.trace.is_some() {
            c.trace = self.trace.clone();
        }
        set(&mut c.ppo_epochs, self.ppo_epochs);
        set(&mut c.ppo_lr, self.ppo_lr);
        set(&mut c.entropy_coef, self.entropy_coef);
        if self.entropy_coef_end.is_some() {
            c.entropy_coef_end = self.entropy_coef_end;
        }
        set(&mut c.entropy_anneal_episodes, self.entropy_anneal_episodes);
        set(&mut c.target_kl, self.target_kl);
        set(&mut c.policy_hidden, self.policy_hidden);
        if self.policy_checkpoint.is_some() {
            c.policy_checkpoint = self.policy_checkpoint.clone();
        }
        c.eval |= self.eval;
        c.deterministic |= self.deterministic;
        c
    }
}

/// `on` or `off`.
fn parse_on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, got '{other}'")),
    }
}

fn set<T>(field: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *field = v;
    }
}

fn d() -> RunConfig {
    RunConfig::default()
}

/// `--precision`'s help, the same on `train` and `bench`.
const PRECISION_HELP: &str = "How a GPU multiplies the convolutions: tf32 (the 3×3 ones on the tensor \
    cores, f32 data rounded to TF32 for the multiply, as the reference's PyTorch convolutions do by default; \
    the fastest), f32 (implicit GEMMs) or bf16 (bf16 inputs summed in f32, through im2col + cuBLAS); weights, \
    gradients and optimizer stay f32. The CPU computes in f32";
const PRECISION_DEFAULT: &str = "tf32 on a GPU, f32 on the CPU";

fn with_default(text: &str, default: impl Display) -> String {
    format!("{text} [default: {default}]")
}

fn parse_data_kind(s: &str) -> Result<DataKind, String> {
    DataKind::from_name(s).ok_or_else(|| {
        let known: Vec<&str> = DataKind::ALL.iter().map(|d| d.name()).collect();
        format!("unknown data kind (known: {})", known.join(", "))
    })
}

fn parse_reward_mode(s: &str) -> Result<RewardMode, String> {
    RewardMode::from_name(s).ok_or_else(|| {
        format!("unknown reward mode (known: {})", RewardMode::ALL.map(|m| m.name()).join(", "))
    })
}

fn parse_reward_family(s: &str) -> Result<RewardFamily, String> {
    match s {
        "contribution" => Ok(RewardFamily::Contribution),
        "loss" => Ok(RewardFamily::Loss),
        _ => Err("unknown reward family (known: contribution, loss)".into()),
    }
}

fn parse_policy_kind(s: &str) -> Result<PolicyKind, String> {
    PolicyKind::from_name(s).ok_or_else(|| {
        let known: Vec<&str> = PolicyKind::ALL.iter().map(|p| p.name()).collect();
        format!("unknown policy (known: {})", known.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn the_entropy_anneal_flags_reach_the_ppo_settings() {
        let cli = Cli::try_parse_from([
            "esper-ecs",
            "train",
            "--envs",
            "4",
            "--entropy-coef-end",
            "0.02",
            "--entropy-anneal-episodes",
            "10",
        ]);
        let Command::Train(args) = cli.unwrap().command else { panic!("not train") };
        let ppo = args.to_config().unwrap().ppo();
        assert_eq!((ppo.entropy_coef_end, ppo.entropy_anneal_updates), (Some(0.02), 3));
    }

    #[test]
    fn flags_override_the_config_file() {
        let dir = std::env::temp_dir().join(format!("esper-cli-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run.toml");
        std::fs::write(&file, "envs = 4\nrounds = 3\ndata = \"cifar10\"\ndata_dir = \"/data\"\nseed = 5\n")
            .unwrap();
        let cli =
            Cli::try_parse_from(["esper-ecs", "train", "--config", file.to_str().unwrap(), "--envs", "2"]);
        let Command::Train(args) = cli.unwrap().command else { panic!("not train") };
        let c = args.to_config().unwrap();
        assert_eq!((c.envs, c.rounds, c.seed, c.data), (2, 3, 5, DataKind::Cifar10));
        assert_eq!(c.data_dir, Some(PathBuf::from("/data")));
        assert_eq!(c.batch_per_env, RunConfig::default().batch_per_env);

        let cli = Cli::try_parse_from([
            "esper-ecs",
            "train",
            "--reward-mode",
            "escrow",
            "--disable-pbrs",
            "--param-budget",
            "1000",
            "--log-reward-inputs",
        ]);
        let Command::Train(args) = cli.unwrap().command else { panic!("not train") };
        let c = args.to_config().unwrap();
        let reward = c.reward();
        assert_eq!((reward.mode, reward.param_budget), (RewardMode::Escrow, 1000.0));
        assert!(reward.disable_pbrs && !reward.disable_anti_gaming && c.log_reward_inputs);

        let cli = Cli::try_parse_from([
            "esper-ecs",
            "train",
            "--config",
            file.to_str().unwrap(),
            "--data",
            "synthetic",
        ]);
        let Command::Train(args) = cli.unwrap().command else { panic!("not train") };
        let c = args.to_config().unwrap();
        assert_eq!((c.data, c.data_dir), (DataKind::Synthetic, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
