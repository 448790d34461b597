//! The run configuration: every setting of `esper-ecs train`, with the defaults `--help` shows.
//! A TOML file (`--config`) may set any field; command-line flags override it.

use esper_components::host_preset::HostSlotError;
use esper_components::{
    RewardConfig, RewardConfigError, RewardFamily, RewardMode, SlotConfig, SlotIdError, TaskPreset,
};
use esper_kernels::data::{DataError, DataSource, Sharding, SyntheticSpec, cifar};
use esper_kernels::ops::precision::Precision;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::memory::MemoryEstimate;

/// Which data the hosts train on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// The embedded synthetic CIFAR-shaped task (no files needed), sized to the env count.
    #[default]
    Synthetic,
    /// CIFAR-10 binary files from `data_dir`.
    Cifar10,
}

impl DataKind {
    pub const ALL: [DataKind; 2] = [Self::Synthetic, Self::Cifar10];

    /// The name used on the command line, in configs and in `summary.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Synthetic => "synthetic",
            Self::Cifar10 => "cifar10",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }
}

/// Which policy decides the lifecycle ops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Heuristic Tamiyo (spec tamiyo §5).
    Heuristic,
    /// Uniformly random legal actions (a baseline).
    Random,
    /// Never germinates: every decision is WAIT — the static host, the baseline every morphogenetic
    /// result is judged against.
    Static,
    /// The learned policy (factored LSTM), trained with PPO once per round — or only run, with `eval`.
    #[default]
    Ppo,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [Self::Ppo, Self::Heuristic, Self::Random, Self::Static];

    /// The name used on the command line, in configs and in `summary.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Heuristic => "heuristic",
            Self::Random => "random",
            Self::Static => "static",
            Self::Ppo => "ppo",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Every field of a training run. Unknown keys in a config file are an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Parallel environments (one host network each).
    pub envs: usize,
    /// Where the hosts train and validate: `cpu`, or `cuda` / `cuda:N` (a build with the `cuda`
    /// feature; see docs/gpu.md).
    pub device: String,
    /// How a GPU multiplies the convolutions' matrices: `f32`, `tf32` (tensor cores, f32 data) or
    /// `bf16` (bf16 inputs, f32 sums; weights and gradients stay f32). Only f32 on the CPU. Not given:
    /// the device's default ([`default_precision`]: tf32 on a GPU, f32 on the CPU).
    pub precision: Option<Precision>,
    /// On a GPU, run each training epoch whose launches repeat the last one's from a CUDA graph
    /// (captured once, then replayed: one launch per epoch). Off: launch by launch.
    pub cuda_graphs: bool,
    /// Rounds (batches of episodes); every round starts fresh hosts.
    pub rounds: usize,
    /// Host epochs per episode (policy decisions per env per round).
    pub epochs: usize,
    /// Host preset: cifar_baseline, cifar_multichannel, cifar_scale, cifar_deep_multichannel,
    /// cifar_impaired, cifar_minimal, cifar_postpool, cifar_highres, cifar_deep_impaired.
    pub task: String,
    pub data: DataKind,
    /// Directory with the CIFAR-10 binary files (data = cifar10).
    pub data_dir: Option<PathBuf>,
    /// Enabled seed slots, comma-separated `r<row>c<col>` ids.
    pub slots: String,
    pub policy: PolicyKind,
    /// Run seed: every random draw derives from it.
    pub seed: u64,
    /// Training images per env per step.
    pub batch_per_env: usize,
    /// Synthetic training images per env (the synthetic set is sized to the env count).
    pub synthetic_train_per_env: usize,
    /// Synthetic test images per env.
    pub synthetic_test_per_env: usize,
    /// Output directory (default `runs/<timestamp>`).
    pub out: Option<PathBuf>,
    /// Where the run's `trace.bin` goes (default `<out>/trace.bin`).
    pub trace: Option<PathBuf>,
    /// Reward mode of the contribution family: shaped, escrow, basic, basic_plus, sparse, minimal,
    /// simplified (simic §2.1).
    pub reward_mode: RewardMode,
    /// contribution or loss (loss only with reward_mode shaped).
    pub reward_family: RewardFamily,
    /// Drop the PBRS stage-potential bonus (and the germinate bonus and clawback built on it).
    pub disable_pbrs: bool,
    /// Drop the terminal accuracy terms (and the fossilize bonus gated on them).
    pub disable_terminal_reward: bool,
    /// Drop the anti-gaming ratio penalty and the alpha shock.
    pub disable_anti_gaming: bool,
    /// Parameter budget of BASIC's rent and SPARSE's fossil cost.
    pub param_budget: f64,
    /// Weight of BASIC's rent and SPARSE's fossil cost.
    pub param_penalty_weight: f64,
    /// Scale of the SPARSE / MINIMAL terminal reward.
    pub sparse_reward_scale: f64,
    /// Floor of the host parameter count in the rent and shock ratios.
    pub rent_host_params_floor: f64,
    /// Weight of BASIC's terminal accuracy delta.
    pub basic_acc_delta_weight: f64,
    /// Every metrics.jsonl line also carries the inputs the reward read (`reward_inputs`).
    pub log_reward_inputs: bool,
    /// Every metrics.jsonl line also carries the env's raw observation (`observation`, the
    /// `23 + 31·S` Obs V3 features the policy's input was normalised from) and `blueprint_indices`.
    pub log_observations: bool,
    /// PPO: passes over each round's batch (K).
    pub ppo_epochs: usize,
    /// PPO: Adam's learning rate.
    pub ppo_lr: f64,
    /// PPO: the entropy coefficient (per-head multipliers on top); the anneal's start.
    pub entropy_coef: f64,
    /// PPO: where the entropy coefficient's linear anneal ends (None: no anneal; simic §4.1).
    pub entropy_coef_end: Option<f64>,
    /// PPO: episodes the anneal takes, as the reference counts them: over ceil(episodes / envs) updates
    /// (0: no anneal).
    pub entropy_anneal_episodes: usize,
    /// PPO: early stop of the K passes when the approximate KL exceeds 1.5× this (0: never).
    pub target_kl: f64,
    /// The learned policy's LSTM width (the reference's 512; heads are half of it).
    pub policy_hidden: usize,
    /// Start the learned policy from this checkpoint (its weights and normalisers).
    pub policy_checkpoint: Option<PathBuf>,
    /// Run the learned policy without learning (needs `policy_checkpoint`).
    pub eval: bool,
    /// The learned policy takes each head's most probable legal choice instead of sampling.
    pub deterministic: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        let reward = RewardConfig::default();
        Self {
            envs: 16,
            device: "cpu".into(),
            precision: None,
            cuda_graphs: true,
            rounds: 1,
            // The README configuration on the built-in task (README, "The default task"): short epochs
            // of 512 images at batch 32 (16 SGD steps each), 80 of them, so the heuristic's epoch-counted
            // lifecycle (≥ 17 epochs from germination to fossilization) has room, and 1,024 validation
            // images per env so that a 0.5-point plateau is not lost in the epoch-to-epoch jitter.
            epochs: 80,
            task: "cifar_baseline".into(),
            data: DataKind::Synthetic,
            data_dir: None,
            slots: "r0c0,r0c1,r0c2".into(),
            policy: PolicyKind::Ppo,
            seed: 0,
            batch_per_env: 32,
            synthetic_train_per_env: 512,
            synthetic_test_per_env: 1024,
            out: None,
            trace: None,
            reward_mode: reward.mode,
            reward_family: reward.family,
            disable_pbrs: reward.disable_pbrs,
            disable_terminal_reward: reward.disable_terminal_reward,
            disable_anti_gaming: reward.disable_anti_gaming,
            param_budget: reward.param_budget,
            param_penalty_weight: reward.param_penalty_weight,
            sparse_reward_scale: reward.sparse_reward_scale,
            rent_host_params_floor: reward.rent_host_params_floor,
            basic_acc_delta_weight: reward.basic_acc_delta_weight,
            log_reward_inputs: false,
            log_observations: false,
            ppo_epochs: 1,
            ppo_lr: 3e-4,
            entropy_coef: 0.05,
            entropy_coef_end: None,
            entropy_anneal_episodes: 0,
            target_kl: 0.015,
            policy_hidden: 512,
            policy_checkpoint: None,
            eval: false,
            deterministic: false,
        }
    }
}

impl RunConfig {
    /// The PPO settings of this run (the rest are the reference's defaults, simic §5).
    pub fn ppo(&self) -> esper_kernels::policy::ppo::PpoConfig {
        esper_kernels::policy::ppo::PpoConfig {
            epochs: self.ppo_epochs,
            lr: self.ppo_lr,
            entropy_coef: self.entropy_coef,
            entropy_coef_end: self.entropy_coef_end,
            entropy_anneal_updates: self.entropy_anneal_episodes.div_ceil(self.envs.max(1)) as u64,
            target_kl: (self.target_kl > 0.0).then_some(self.target_kl),
            total_updates: self.rounds as u64,
            ..Default::default()
        }
    }

    /// The reward settings of this run (every other reward constant is the reference's).
    pub fn reward(&self) -> RewardConfig {
        RewardConfig {
            mode: self.reward_mode,
            family: self.reward_family,
            disable_pbrs: self.disable_pbrs,
            disable_terminal_reward: self.disable_terminal_reward,
            disable_anti_gaming: self.disable_anti_gaming,
            param_budget: self.param_budget,
            param_penalty_weight: self.param_penalty_weight,
            sparse_reward_scale: self.sparse_reward_scale,
            rent_host_params_floor: self.rent_host_params_floor,
            basic_acc_delta_weight: self.basic_acc_delta_weight,
            ..RewardConfig::default()
        }
    }
}

/// A validated run: the config plus everything resolved from it. Built by `RunConfig::resolve`.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub config: RunConfig,
    pub task: esper_components::TaskPreset,
    /// Enabled slots, validated against the task's host, in canonical order.
    pub slots: esper_components::SlotConfig,
    pub data: esper_kernels::data::DataSource,
    /// Where metrics.jsonl and summary.json go (created, empty or `--force`d).
    pub out_dir: PathBuf,
    /// No progress bar (and no summary table).
    pub quiet: bool,
    /// Print the summary table at the end (unless quiet).
    pub table: bool,
    /// The run's estimated peak memory (data, hosts, seeds in every slot).
    pub memory: MemoryEstimate,
    /// Continue the learned policy's run from this checkpoint (`--resume`): its state, from its next
    /// round.
    pub resume: Option<PathBuf>,
    /// Where the hosts train and validate (`config.device`, parsed).
    pub device: crate::run::HostDevice,
    /// Print each step's device copies back (`--count-syncs`).
    pub count_syncs: bool,
}

impl RunPlan {
    /// Where the run's trace goes: `trace` when set, else `<out>/trace.bin`.
    pub fn trace_path(&self) -> PathBuf {
        self.config.trace.clone().unwrap_or_else(|| self.out_dir.join("trace.bin"))
    }

    /// Refuses a run whose estimated memory exceeds what the machine has available now (where that
    /// can be read), before anything is allocated.
    pub fn check_memory(&self) -> Result<(), ConfigError> {
        match crate::memory::available_bytes() {
            Some(available) if self.memory.total() > available => Err(ConfigError::WontFit {
                estimate: self.memory,
                available,
                synthetic: self.config.data == DataKind::Synthetic,
            }),
            _ => Ok(()),
        }
    }
}

/// Why a run configuration cannot be used. `Display` is the one-line message the CLI prints after
/// `error: `; it names the flag or key, the bad value and what is accepted.
#[derive(Debug)]
pub enum ConfigError {
    /// A count that must be positive is 0. `name` is the flag (and the config key where it differs).
    Zero {
        name: &'static str,
    },
    UnknownTask {
        name: String,
    },
    /// The `slots` list does not parse (malformed or legacy id, empty, duplicate, too many).
    BadSlots {
        list: String,
        source: SlotIdError,
    },
    /// A listed slot is not an injection point of the task's host.
    SlotNotOnHost {
        task: TaskPreset,
        source: HostSlotError,
    },
    /// A reward setting the reference refuses, or one that is not a usable number.
    Reward(RewardConfigError),
    /// A flag whose value cannot be used, and why.
    Invalid {
        name: &'static str,
        reason: String,
    },
    /// `data = cifar10` without `data_dir`.
    NoDataDir,
    /// `data_dir` given with synthetic data, where it would be silently ignored.
    DataDirUnused {
        dir: PathBuf,
    },
    /// The CIFAR-10 data directory is missing, incomplete or holds files of the wrong size.
    DataDir(DataError),
    /// The data cannot give every env a full batch and a validation slice.
    CannotFeed(DataError),
    /// The synthetic set sized to the env count would exceed 2^32 − 1 images.
    SyntheticTooLarge {
        envs: usize,
        per_env: usize,
        split: &'static str,
    },
    OutExists {
        path: PathBuf,
    },
    OutNotDirectory {
        path: PathBuf,
    },
    OutUnwritable {
        path: PathBuf,
        source: std::io::Error,
    },
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The config file is not valid TOML, has an unknown key or a value of the wrong type.
    ConfigParse {
        path: PathBuf,
        line: Option<usize>,
        key: Option<String>,
        message: String,
    },
    /// The run's estimated memory exceeds what the machine has available.
    WontFit {
        estimate: MemoryEstimate,
        available: u64,
        synthetic: bool,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero { name } => write!(f, "{name} must be at least 1 (got 0)"),
            Self::UnknownTask { name } => {
                let known: Vec<&str> = TaskPreset::ALL.iter().map(|t| t.name()).collect();
                write!(f, "unknown task '{name}' (known: {})", known.join(", "))
            }
            Self::BadSlots { list, source } => write!(f, "--slots '{list}': {source}"),
            Self::SlotNotOnHost { task, source } => write!(
                f,
                "--slots: slot {} is not an injection point of the {task} host (it has {})",
                source.id,
                source.available.join(", ")
            ),
            Self::Reward(e) => write!(f, "{e}"),
            Self::Invalid { name, reason } => write!(f, "{name}: {reason}"),
            Self::NoDataDir => write!(
                f,
                "--data cifar10 needs --data-dir DIR (a folder with {} … {} and {})",
                cifar::TRAIN_FILES[0],
                cifar::TRAIN_FILES[4],
                cifar::TEST_FILE
            ),
            Self::DataDirUnused { dir } => {
                write!(f, "--data-dir {} is only used with --data cifar10 (data is synthetic)", dir.display())
            }
            Self::DataDir(e) => write!(f, "--data-dir: {e}"),
            Self::CannotFeed(e) => write!(f, "the data cannot feed the envs: {e}"),
            Self::SyntheticTooLarge { envs, per_env, split } => write!(
                f,
                "synthetic data: {envs} envs × synthetic_{split}_per_env {per_env} exceeds {} {split} images",
                u32::MAX
            ),
            Self::OutExists { path } => {
                write!(f, "--out {} already exists (add --force to write into it)", path.display())
            }
            Self::OutNotDirectory { path } => {
                write!(f, "--out {} exists and is not a directory", path.display())
            }
            Self::OutUnwritable { path, source } => {
                write!(f, "--out {} is not writable: {source}", path.display())
            }
            Self::ConfigRead { path, source } => {
                write!(f, "--config {}: cannot read: {source}", path.display())
            }
            Self::ConfigParse { path, line, key, message } => {
                write!(f, "--config {}", path.display())?;
                if let Some(line) = line {
                    write!(f, ", line {line}")?;
                }
                if let Some(key) = key {
                    write!(f, ", key `{key}`")?;
                }
                write!(f, ": {message}")
            }
            Self::WontFit { estimate, available, synthetic } => {
                write!(
                    f,
                    "this run would need {estimate}, but {} is available: lower --envs or \
                     --batch-per-env",
                    crate::memory::bytes(*available)
                )?;
                if *synthetic {
                    write!(f, " (or synthetic_train_per_env / synthetic_test_per_env, which size the data)")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::BadSlots { source, .. } => Some(source),
            Self::SlotNotOnHost { source, .. } => Some(source),
            Self::DataDir(e) | Self::CannotFeed(e) => Some(e),
            Self::Reward(e) => Some(e),
            Self::OutUnwritable { source, .. } | Self::ConfigRead { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl RunConfig {
    /// Reads a TOML config file. Every key is optional (missing ones keep their defaults); an unknown
    /// key, a value of the wrong type or invalid TOML is an error naming the file, the line and the key.
    pub fn from_toml_file(path: &Path) -> Result<RunConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::ConfigRead { path: path.to_path_buf(), source })?;
        Self::from_toml_str(&text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => locate(&text, span.start),
                None => (None, None),
            };
            let message = e.message().trim().replace('\n', " ");
            // Unknown-field messages already name the key; do not repeat it.
            let key = key.filter(|k| !message.contains(&format!("`{k}`")));
            ConfigError::ConfigParse { path: path.to_path_buf(), line, key, message }
        })
    }

    /// Parses TOML text (see [`RunConfig::from_toml_file`]).
    pub fn from_toml_str(text: &str) -> Result<RunConfig, toml::de::Error> {
        toml::from_str(text)
    }

    /// Validates the config and resolves everything a run needs; last of all creates the output
    /// directory (so a config that fails validation leaves nothing behind).
    ///
    /// * `envs`, `rounds`, `epochs`, `batch_per_env` and the synthetic sizes must be at least 1.
    /// * `task` must name a preset, `slots` must parse and be injection points of that task's host.
    /// * `data = cifar10` needs a `data_dir` holding the six CIFAR-10 binary files (directly or in
    ///   `cifar-10-batches-bin/`), each a non-empty whole number of records (checked from file sizes;
    ///   labels are checked when the run loads them); synthetic data must not get a `data_dir`.
    /// * The data must feed every env: `batch_per_env × envs` at most the training images and at
    ///   least one test image per env (synthetic: `envs × synthetic_{train,test}_per_env` images).
    /// * `out`: default `runs/<UTC yyyymmdd-HHMMSS>` (with `-2`, `-3`, … appended if that exists). An
    ///   existing `out` is an error unless `force`; it is created and checked writable, and stored back
    ///   into the plan's `config.out`.
    pub fn resolve(self, force: bool, quiet: bool) -> Result<RunPlan, ConfigError> {
        let out = self.out.clone();
        let mut plan = self.plan_in(PathBuf::new(), quiet)?;
        plan.check_memory()?;
        let out_dir = match &out {
            Some(path) => prepare_out(path, force)?,
            None => create_default_out(Path::new("runs"), SystemTime::now())?,
        };
        plan.config.out = Some(out_dir.clone());
        plan.out_dir = out_dir;
        Ok(plan)
    }

    /// Every check of [`RunConfig::resolve`] except the output directory, which is taken as given and
    /// neither created nor checked: for runs that write nothing there (the bench, tests).
    pub fn plan_in(self, out_dir: PathBuf, quiet: bool) -> Result<RunPlan, ConfigError> {
        let positive = [
            (self.envs, "--envs"),
            (self.rounds, "--rounds"),
            (self.epochs, "--epochs"),
            (self.batch_per_env, "--batch-per-env (batch_per_env)"),
            (self.synthetic_train_per_env, "synthetic_train_per_env"),
            (self.synthetic_test_per_env, "synthetic_test_per_env"),
            (self.ppo_epochs, "--ppo-epochs"),
            (self.policy_hidden, "--policy-hidden"),
        ];
        if let Some(&(_, name)) = positive.iter().find(|(v, _)| *v == 0) {
            return Err(ConfigError::Zero { name });
        }
        let invalid =
            |name: &'static str, reason: &str| Err(ConfigError::Invalid { name, reason: reason.into() });
        if !(self.ppo_lr.is_finite() && self.ppo_lr > 0.0) {
            return invalid("--ppo-lr", &format!("must be a positive number (got {})", self.ppo_lr));
        }
        if !(self.entropy_coef.is_finite() && self.entropy_coef >= 0.0) {
            return invalid("--entropy-coef", &format!("must be a number ≥ 0 (got {})", self.entropy_coef));
        }
        if let Some(end) = self.entropy_coef_end
            && !(end.is_finite() && end >= 0.0)
        {
            return invalid("--entropy-coef-end", &format!("must be a number ≥ 0 (got {end})"));
        }
        if !(self.target_kl.is_finite() && self.target_kl >= 0.0) {
            return invalid(
                "--target-kl",
                &format!("must be a number ≥ 0, 0 for none (got {})", self.target_kl),
            );
        }
        if !self.policy_hidden.is_multiple_of(4) {
            return invalid(
                "--policy-hidden",
                &format!("must be a multiple of 4 (got {})", self.policy_hidden),
            );
        }
        let learned = self.policy == PolicyKind::Ppo;
        if (self.eval || self.deterministic || self.policy_checkpoint.is_some()) && !learned {
            return invalid("--eval, --deterministic, --policy-checkpoint", "only apply to --policy ppo");
        }
        if self.eval && self.policy_checkpoint.is_none() {
            return invalid("--eval", "needs --policy-checkpoint FILE (the policy to run)");
        }
        if let Some(path) = &self.policy_checkpoint
            && !path.is_file()
        {
            return invalid("--policy-checkpoint", &format!("{} is not a file", path.display()));
        }
        self.reward().validate().map_err(ConfigError::Reward)?;
        if let Some(trace) = &self.trace {
            let folder = trace.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !folder.is_dir() {
                return Err(ConfigError::Invalid {
                    name: "--trace (trace)",
                    reason: format!("{}: the folder {} does not exist", trace.display(), folder.display()),
                });
            }
        }
        let task = TaskPreset::from_name(&self.task)
            .ok_or_else(|| ConfigError::UnknownTask { name: self.task.clone() })?;
        let slots = SlotConfig::parse_list(&self.slots)
            .map_err(|source| ConfigError::BadSlots { list: self.slots.clone(), source })?;
        let slots =
            task.host().slot_config(&slots).map_err(|source| ConfigError::SlotNotOnHost { task, source })?;

        let (data, n_train, n_test) = match (self.data, &self.data_dir) {
            (DataKind::Synthetic, Some(dir)) => return Err(ConfigError::DataDirUnused { dir: dir.clone() }),
            (DataKind::Cifar10, None) => return Err(ConfigError::NoDataDir),
            (DataKind::Synthetic, None) => {
                let size = |per_env: usize, split| {
                    self.envs
                        .checked_mul(per_env)
                        .filter(|&n| n <= u32::MAX as usize)
                        .ok_or(ConfigError::SyntheticTooLarge { envs: self.envs, per_env, split })
                };
                let n_train = size(self.synthetic_train_per_env, "train")?;
                let n_test = size(self.synthetic_test_per_env, "test")?;
                let spec = SyntheticSpec { n_train, n_test, seed: self.seed, ..SyntheticSpec::default() };
                (DataSource::Synthetic(spec), n_train, n_test)
            }
            (DataKind::Cifar10, Some(dir)) => {
                let (n_train, n_test) = cifar_sizes(dir).map_err(ConfigError::DataDir)?;
                (DataSource::Cifar10 { dir: dir.clone() }, n_train, n_test)
            }
        };
        Sharding::new(n_train, n_test, self.envs, self.batch_per_env).map_err(ConfigError::CannotFeed)?;
        let memory =
            MemoryEstimate::new(&task.host(), &slots, self.batch_per_env, self.envs, n_train + n_test);
        let device = parse_device(&self.device)?;
        check_precision(device, self.precision)?;
        Ok(RunPlan {
            config: self,
            task,
            slots,
            data,
            out_dir,
            quiet,
            table: !quiet,
            memory,
            resume: None,
            device,
            count_syncs: false,
        })
    }
}

impl RunConfig {
    /// Where the hosts train and validate, from `device` (also checked when the run is planned).
    pub fn host_device(&self) -> Result<crate::run::HostDevice, ConfigError> {
        parse_device(&self.device)
    }

    /// The precision the run's convolutions multiply in on `device`: the one given, else the device's
    /// default.
    pub fn precision_on(&self, device: crate::run::HostDevice) -> Precision {
        self.precision.unwrap_or(default_precision(device))
    }
}

/// The precision a device multiplies the convolutions in when none is given: TF32 on a GPU — what the
/// reference's convolutions do there (PyTorch's `torch.backends.cudnn.allow_tf32` is on by default, and
/// esper-lite leaves it so), and on the tensor-core 3×3 kernels the fastest (docs/gpu.md) — and f32 on
/// the CPU, the only precision it computes in.
pub fn default_precision(device: crate::run::HostDevice) -> Precision {
    match device {
        crate::run::HostDevice::Cpu => Precision::F32,
        crate::run::HostDevice::Cuda(_) => Precision::Tf32,
    }
}

/// A precision other than f32 is a GPU's multiply: the CPU computes in f32 (none given: the device's
/// default, always allowed).
pub fn check_precision(
    device: crate::run::HostDevice,
    precision: Option<Precision>,
) -> Result<(), ConfigError> {
    match (device, precision) {
        (crate::run::HostDevice::Cpu, Some(p)) if p != Precision::F32 => Err(ConfigError::Invalid {
            name: "--precision (precision)",
            reason: format!(
                "{} is how a GPU multiplies the convolutions (give --device cuda); the CPU computes in f32",
                p.name()
            ),
        }),
        _ => Ok(()),
    }
}

/// `cpu`, or `cuda` / `cuda:N` in a build with the `cuda` feature.
fn parse_device(name: &str) -> Result<crate::run::HostDevice, ConfigError> {
    crate::run::HostDevice::parse(name)
        .map_err(|e| ConfigError::Invalid { name: "--device (device)", reason: e.to_string() })
}

/// The 1-based line of byte `offset` in `text` and the key set on that line (`key = …`), if any.
fn locate(text: &str, offset: usize) -> (Option<usize>, Option<String>) {
    let offset = offset.min(text.len());
    let line_no = text.as_bytes()[..offset].iter().filter(|&&b| b == b'\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .filter(|k| !k.is_empty() && !k.starts_with('#') && !k.starts_with('['));
    (Some(line_no), key)
}

/// Train and test image counts of the CIFAR-10 files in `dir` (or `dir/cifar-10-batches-bin`, as the
/// loader looks there too), from the file sizes alone: the same checks and messages as
/// [`cifar::load`] up to the label check, without reading ~180 MB.
fn cifar_sizes(dir: &Path) -> Result<(usize, usize), DataError> {
    if !dir.is_dir() {
        return Err(DataError::NoDirectory { dir: dir.to_path_buf() });
    }
    let nested = dir.join(cifar::ARCHIVE_DIR);
    let dir = if !dir.join(cifar::TEST_FILE).exists() && nested.join(cifar::TEST_FILE).exists() {
        nested
    } else {
        dir.to_path_buf()
    };
    for name in cifar::TRAIN_FILES.iter().chain(std::iter::once(&cifar::TEST_FILE)) {
        if !dir.join(name).is_file() {
            return Err(DataError::MissingFile { file: (*name).to_string(), dir });
        }
    }
    let records = |name: &str| -> Result<usize, DataError> {
        let path = dir.join(name);
        let size =
            std::fs::metadata(&path).map_err(|source| DataError::Io { path: path.clone(), source })?.len();
        if size == 0 {
            return Err(DataError::EmptyFile { path });
        }
        if !size.is_multiple_of(cifar::RECORD_BYTES as u64) {
            return Err(DataError::BadSize { path, size, record: cifar::RECORD_BYTES });
        }
        Ok((size / cifar::RECORD_BYTES as u64) as usize)
    };
    let mut n_train = 0;
    for name in cifar::TRAIN_FILES {
        n_train += records(name)?;
    }
    Ok((n_train, records(cifar::TEST_FILE)?))
}

/// Creates `root/<UTC yyyymmdd-HHMMSS>` for `now` (with `-2`, `-3`, … appended while that exists, so
/// runs started in the same second never share a folder) and checks it is writable.
fn create_default_out(root: &Path, now: SystemTime) -> Result<PathBuf, ConfigError> {
    let stamp = utc_timestamp(now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    let mut n = 1;
    loop {
        let path = if n == 1 { root.join(&stamp) } else { root.join(format!("{stamp}-{n}")) };
        match create_dir_new(&path) {
            Ok(true) => return check_writable(path),
            Ok(false) if n < 1000 => n += 1,
            Ok(false) => return Err(ConfigError::OutExists { path }),
            Err(source) => return Err(ConfigError::OutUnwritable { path, source }),
        }
    }
}

/// `yyyymmdd-HHMMSS` in UTC for seconds since the Unix epoch (proleptic Gregorian calendar).
pub fn utc_timestamp(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's `civil_from_days`), in u64 for secs ≥ 0.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The folder of an `esper-ecs compare`: `out` (created; an existing one only with `force`), or a new
/// `runs/compare/<UTC timestamp>`.
pub fn prepare_compare_out(out: Option<&Path>, force: bool) -> Result<PathBuf, ConfigError> {
    match out {
        Some(path) => prepare_out(path, force),
        None => create_default_out(&Path::new("runs").join("compare"), SystemTime::now()),
    }
}

/// Creates `path` (or, with `force`, accepts an existing directory) and checks a file can be written
/// in it.
fn prepare_out(path: &Path, force: bool) -> Result<PathBuf, ConfigError> {
    let path = path.to_path_buf();
    match create_dir_new(&path) {
        Ok(true) => {}
        Ok(false) if !path.is_dir() => return Err(ConfigError::OutNotDirectory { path }),
        Ok(false) if !force => return Err(ConfigError::OutExists { path }),
        Ok(false) => {}
        Err(source) => return Err(ConfigError::OutUnwritable { path, source }),
    }
    check_writable(path)
}

/// Creates the directory `path` and its missing parents: `Ok(true)` if this call created it,
/// `Ok(false)` if something already exists at `path` (atomic, unlike checking first).
fn create_dir_new(path: &Path) -> std::io::Result<bool> {
    use std::io::ErrorKind;
    match std::fs::create_dir(path) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => std::fs::create_dir_all(parent)?,
            _ => return Err(e),
        },
        Err(e) => return Err(e),
    }
    match std::fs::create_dir(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// Writes and removes a probe file in the directory `path`.
fn check_writable(path: PathBuf) -> Result<PathBuf, ConfigError> {
    let probe = path.join(".esper-ecs-write-check");
    let result = std::fs::write(&probe, b"").and_then(|()| std::fs::remove_file(&probe));
    match result {
        Ok(()) => Ok(path),
        Err(source) => Err(ConfigError::OutUnwritable { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_timestamps_match_date_u() {
        // Reference values from `date -u -d @SECS +%Y%m%d-%H%M%S`.
        assert_eq!(utc_timestamp(0), "19700101-000000");
        assert_eq!(utc_timestamp(951_782_400), "20000229-000000");
        assert_eq!(utc_timestamp(1_795_469_695), "20261123-213455");
        assert_eq!(utc_timestamp(4_107_542_399), "21000228-235959");
    }

    /// The precision left out is the device's default: tf32 on a GPU (the reference's PyTorch default for
    /// convolutions), f32 on the CPU; one given in a file or a checkpoint's JSON header (all of which
    /// before this default named one, "f32") stays what it was, on either device.
    #[test]
    fn precision_left_out_is_the_devices_default() {
        use crate::run::HostDevice::{Cpu, Cuda};
        let unset = RunConfig::from_toml_str("rounds = 1\n").unwrap();
        assert_eq!(unset.precision, None);
        assert_eq!((unset.precision_on(Cpu), unset.precision_on(Cuda(1))), (Precision::F32, Precision::Tf32));
        assert!(check_precision(Cpu, unset.precision).is_ok());
        let given = RunConfig::from_toml_str("precision = \"f32\"\n").unwrap();
        assert_eq!((given.precision_on(Cpu), given.precision_on(Cuda(0))), (Precision::F32, Precision::F32));
        let old_header: RunConfig = serde_json::from_str(r#"{"precision": "f32"}"#).unwrap();
        assert_eq!(old_header.precision_on(Cuda(0)), Precision::F32);
        let round_trip: RunConfig = serde_json::from_str(&serde_json::to_string(&unset).unwrap()).unwrap();
        assert_eq!(round_trip.precision, None);
        assert!(check_precision(Cpu, Some(Precision::Tf32)).is_err());
    }

    #[test]
    fn parse_errors_name_line_and_key() {
        let dir = std::env::temp_dir().join(format!("esper-config-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "rounds = 2\nenvs = \"many\"\n").unwrap();
        let msg = RunConfig::from_toml_file(&file).unwrap_err().to_string();
        assert!(msg.starts_with(&format!("--config {}, line 2, key `envs`: ", file.display())), "{msg}");
        assert!(msg.contains("invalid type"), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        std::fs::write(&file, "rounds = 2\nslots = \"r0c0\"\n").unwrap();
        let cfg = RunConfig::from_toml_file(&file).unwrap();
        assert_eq!((cfg.rounds, cfg.slots.as_str(), cfg.envs), (2, "r0c0", 16));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reward_settings_come_from_the_config_file() {
        let text = "reward_mode = \"basic_plus\"\nparam_budget = 100000\nrent_host_params_floor = 500\n\
                    disable_pbrs = true\nlog_reward_inputs = true\nlog_observations = true\n";
        let cfg = RunConfig::from_toml_str(text).unwrap();
        let reward = cfg.reward();
        assert_eq!((reward.mode, reward.family), (RewardMode::BasicPlus, RewardFamily::Contribution));
        assert_eq!((reward.param_budget, reward.rent_host_params_floor), (100_000.0, 500.0));
        assert!(reward.disable_pbrs && !reward.disable_terminal_reward && cfg.log_reward_inputs);
        assert!(cfg.log_observations && !RunConfig::default().log_observations);
        assert!(RunConfig::from_toml_str("reward_mode = \"dense\"\n").is_err());
        let loss = RunConfig::from_toml_str("reward_family = \"loss\"\nreward_mode = \"sparse\"\n").unwrap();
        assert!(matches!(
            loss.plan_in(PathBuf::new(), true),
            Err(ConfigError::Reward(RewardConfigError::LossFamilyNeedsShaped(RewardMode::Sparse)))
        ));
    }

    /// simic §4.1: `entropy_anneal_episodes > 0` anneals linearly from `entropy_coef` to its end over
    /// ceil(episodes / envs) updates, floored at `entropy_coef_min`; without an end there is none.
    #[test]
    fn the_entropy_anneal_runs_over_ceil_episodes_per_envs_updates() {
        let text = "envs = 16\nentropy_coef = 0.1\nentropy_coef_end = 0.02\nentropy_anneal_episodes = 100\n";
        let ppo = RunConfig::from_toml_str(text).unwrap().ppo();
        assert_eq!((ppo.entropy_anneal_updates, ppo.entropy_coef_end), (7, Some(0.02)));
        let at = |steps| ppo.entropy_coef_at(steps);
        for (steps, want) in [(0, 0.1), (3, 0.1 - 0.08 * 3.0 / 7.0), (7, 0.02), (70, 0.02)] {
            assert!((at(steps) - want).abs() < 1e-15, "after {steps} updates: {} against {want}", at(steps));
        }
        let low = RunConfig { entropy_coef_end: Some(0.0), ..RunConfig::from_toml_str(text).unwrap() }.ppo();
        assert_eq!(low.entropy_coef_at(7), 0.01, "floored at entropy_coef_min");
        let none = RunConfig::from_toml_str("entropy_anneal_episodes = 100\n").unwrap().ppo();
        assert_eq!((none.entropy_coef_at(0), none.entropy_coef_at(50)), (0.05, 0.05));
        let bad = RunConfig { entropy_coef_end: Some(-1.0), ..RunConfig::default() };
        assert!(bad.plan_in(PathBuf::new(), true).unwrap_err().to_string().contains("--entropy-coef-end"));
    }

    #[test]
    fn default_out_dirs_never_collide() {
        let root = std::env::temp_dir().join(format!("esper-config-unit-runs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let now = UNIX_EPOCH + std::time::Duration::from_secs(1_795_469_695);
        let first = create_default_out(&root.join("runs"), now).unwrap();
        let second = create_default_out(&root.join("runs"), now).unwrap();
        let third = create_default_out(&root.join("runs"), now).unwrap();
        assert_eq!(first, root.join("runs/20261123-213455"));
        assert_eq!(second, root.join("runs/20261123-213455-2"));
        assert_eq!(third, root.join("runs/20261123-213455-3"));
        assert!(first.is_dir() && second.is_dir() && third.is_dir());
        // Existing out: an error without force, accepted with it; nested missing parents are created.
        assert!(matches!(prepare_out(&first, false), Err(ConfigError::OutExists { .. })));
        assert_eq!(prepare_out(&first, true).unwrap(), first);
        let nested = root.join("a/b/c");
        assert_eq!(prepare_out(&nested, false).unwrap(), nested);
        assert!(nested.is_dir());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn synthetic_sizes_follow_the_env_count() {
        let out = std::env::temp_dir().join(format!("esper-config-unit-out-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let cfg = RunConfig { envs: 3, seed: 9, out: Some(out.clone()), ..RunConfig::default() };
        let plan = cfg.resolve(false, true).unwrap();
        match plan.data {
            DataSource::Synthetic(spec) => {
                assert_eq!((spec.n_train, spec.n_test, spec.seed), (3 * 512, 3 * 1024, 9));
                assert_eq!(
                    spec,
                    SyntheticSpec { n_train: 1536, n_test: 3072, ..SyntheticSpec::with_seed(9) }
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(plan.slots, SlotConfig::default_three());
        assert_eq!(plan.config.out.as_deref(), Some(out.as_path()));
        assert!(out.is_dir());
        std::fs::remove_dir_all(&out).unwrap();
    }
}
