//! The `esper-ecs` binary on bad input: every case exits with code 2 and a clear `error:` line, never a
//! panic, and before anything is created. Plus the help texts. None of these tests reaches training.

use esper_ecs::config::RunConfig;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty folder under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("esper-cli-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }

    /// The folder as a string argument.
    fn s(&self) -> String {
        self.0.to_str().unwrap().to_string()
    }

    /// `self/p` as a string argument.
    fn arg(&self, p: &str) -> String {
        self.join(p).to_str().unwrap().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the binary with `args` in a fresh working directory (so a default `runs/` would land there).
fn esper(args: &[&str]) -> (Output, TempDir) {
    let cwd = TempDir::new("cwd");
    let out = Command::new(env!("CARGO_BIN_EXE_esper-ecs"))
        .args(args)
        .current_dir(cwd.path())
        .output()
        .expect("the esper-ecs binary runs");
    (out, cwd)
}

/// Asserts exit code 2, no panic, nothing created in the working directory, and that the first
/// stderr line is `error: ` followed by text starting with `prefix`; returns that line.
fn bad_input(args: &[&str], prefix: &str) -> String {
    let (out, cwd) = esper(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}: stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(!cwd.join("runs").exists(), "{args:?}: created runs/");
    let first = stderr.lines().next().unwrap_or("").to_string();
    assert!(
        first.starts_with(&format!("error: {prefix}")),
        "{args:?}: expected 'error: {prefix}…', got:\n{stderr}"
    );
    first
}

/// As [`bad_input`], for the config errors of `RunConfig::resolve`: the whole message is one line.
fn config_error(args: &[&str], prefix: &str) -> String {
    let (out, _cwd) = esper(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{args:?}: not one line:\n{stderr}");
    bad_input(args, prefix)
}

/// CIFAR-10 files of the right size (sparse, all-zero), so only sizes and presence are real.
fn fake_cifar(dir: &Path, train_records: u64, test_records: u64) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 1..=5 {
        let f = std::fs::File::create(dir.join(format!("data_batch_{i}.bin"))).unwrap();
        f.set_len(train_records * 3073).unwrap();
    }
    let f = std::fs::File::create(dir.join("test_batch.bin")).unwrap();
    f.set_len(test_records * 3073).unwrap();
}

#[test]
fn envs_zero() {
    config_error(&["train", "--envs", "0"], "--envs must be at least 1 (got 0)");
}

#[test]
fn rounds_epochs_and_batch_zero() {
    config_error(&["train", "--rounds", "0"], "--rounds must be at least 1 (got 0)");
    config_error(&["train", "--epochs", "0"], "--epochs must be at least 1 (got 0)");
    config_error(
        &["train", "--batch-per-env", "0"],
        "--batch-per-env (batch_per_env) must be at least 1 (got 0)",
    );
}

#[test]
fn non_numeric_values() {
    bad_input(&["train", "--envs", "abc"], "invalid value 'abc' for '--envs <N>': invalid digit");
    bad_input(&["train", "--envs", "-3"], "invalid value '-3' for '--envs <N>'");
    bad_input(&["train", "--epochs", "2.5"], "invalid value '2.5' for '--epochs <T>'");
    bad_input(&["train", "--rounds", ""], "invalid value '' for '--rounds <R>'");
    bad_input(&["train", "--seed", "x"], "invalid value 'x' for '--seed <S>'");
    bad_input(&["train", "--batch-per-env", "1e3"], "invalid value '1e3' for '--batch-per-env <B>'");
}

#[test]
fn unknown_task() {
    let line = config_error(
        &["train", "--task", "cifar_huge"],
        "unknown task 'cifar_huge' (known: cifar_baseline, ",
    );
    for name in ["cifar_minimal", "cifar_deep_impaired", "cifar_highres"] {
        assert!(line.contains(name), "{line}");
    }
}

#[test]
fn unknown_data_kind() {
    bad_input(
        &["train", "--data", "mnist"],
        "invalid value 'mnist' for '--data <KIND>': unknown data kind (known: synthetic, cifar10)",
    );
}

#[test]
fn unknown_policy() {
    bad_input(
        &["train", "--policy", "dqn"],
        "invalid value 'dqn' for '--policy <POLICY>': unknown policy (known: ppo, heuristic, random, static)",
    );
}

#[test]
fn compare_refuses_single_run_flags_and_repeats() {
    bad_input(&["compare", "--policy", "static"], "--policy: compare takes --policies LIST");
    bad_input(&["compare", "--seed", "3"], "--seed: compare takes --seeds LIST");
    bad_input(&["compare", "--policies", "static,static"], "--policies: static is listed twice");
    bad_input(&["compare", "--seeds", "1,2,1"], "--seeds: a seed is listed twice");
    // compare runs where --device says, checked before any folder is made.
    bad_input(&["compare", "--device", "tpu"], "--device (device): unknown device 'tpu'");
    if !cfg!(feature = "cuda") {
        bad_input(&["compare", "--device", "cuda"], "--device (device): this binary was built without CUDA");
    }
    bad_input(
        &["compare", "--policies", "dqn"],
        "invalid value 'dqn' for '--policies <LIST>': unknown policy",
    );
    bad_input(&["compare", "--envs", "0"], "--envs must be at least 1");
}

#[test]
fn train_device_is_cpu_or_a_cuda_build() {
    config_error(
        &["train", "--device", "tpu"],
        "--device (device): unknown device 'tpu' (known: cpu, cuda, cuda:N)",
    );
    if !cfg!(feature = "cuda") {
        let line = config_error(
            &["train", "--device", "cuda:1"],
            "--device (device): this binary was built without CUDA",
        );
        assert!(line.contains("cuda-build.sh"), "{line}");
    }
}

/// `--precision` is how a GPU multiplies: tf32 and bf16 on the CPU are refused in one line that says
/// so, before any folder is made; an unknown name lists the known ones; a config file sets it too.
#[test]
fn precision_other_than_f32_needs_a_gpu() {
    for p in ["tf32", "bf16"] {
        let line = config_error(&["train", "--precision", p], "--precision (precision): ");
        assert!(
            line.contains(&format!("{p} is how a GPU multiplies")) && line.contains("--device cuda"),
            "{line}"
        );
        let line = bad_input(&["bench", "--precision", p], "--precision (precision): ");
        assert!(line.contains("the CPU computes in f32"), "{line}");
    }
    bad_input(
        &["train", "--precision", "fp16"],
        "invalid value 'fp16' for '--precision <P>': unknown precision 'fp16' (known: f32, tf32, bf16)",
    );
    bad_input(&["bench", "--precision", "half"], "invalid value 'half' for '--precision <P>'");
    for command in ["train", "bench"] {
        bad_input(
            &[command, "--cuda-graphs", "maybe"],
            "invalid value 'maybe' for '--cuda-graphs <on|off>': expected on or off, got 'maybe'",
        );
    }
    let dir = std::env::temp_dir().join(format!("esper-precision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bf16.toml");
    std::fs::write(&config, "precision = \"bf16\"\n").unwrap();
    config_error(&["train", "--config", config.to_str().unwrap()], "--precision (precision): bf16 is how");
    std::fs::write(&config, "precision = \"f16\"\n").unwrap();
    let (out, _) = esper(&["train", "--config", config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("precision") && err.contains("f16"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_reward_settings() {
    bad_input(
        &["train", "--reward-mode", "dense"],
        "invalid value 'dense' for '--reward-mode <MODE>': unknown reward mode (known: shaped, escrow, \
         basic, basic_plus, sparse, minimal, simplified)",
    );
    bad_input(
        &["train", "--reward-family", "accuracy"],
        "invalid value 'accuracy' for '--reward-family <FAMILY>': unknown reward family (known: \
         contribution, loss)",
    );
    config_error(
        &["train", "--reward-family", "loss", "--reward-mode", "escrow"],
        "--reward-family loss only works with --reward-mode shaped (got --reward-mode escrow; config keys",
    );
    config_error(
        &["train", "--param-budget", "0"],
        "--param-budget (param_budget) must be a positive number (got 0)",
    );
    config_error(
        &["train", "--rent-host-params-floor", "-5"],
        "--rent-host-params-floor (rent_host_params_floor) must be a positive number (got -5)",
    );
    config_error(
        &["train", "--sparse-reward-scale", "nan"],
        "--sparse-reward-scale (sparse_reward_scale) must be a finite number (got NaN)",
    );
}

#[test]
fn unknown_slot_id() {
    config_error(
        &["train", "--slots", "r0c0,bogus"],
        "--slots 'r0c0,bogus': slot id 'bogus' is not of the form r<row>c<col>",
    );
    config_error(&["train", "--slots", "early"], "--slots 'early': slot id 'early' is a retired legacy name");
}

#[test]
fn duplicate_slots() {
    config_error(
        &["train", "--slots", "r0c1,r0c0,r0c1"],
        "--slots 'r0c1,r0c0,r0c1': slot id r0c1 is listed twice",
    );
}

#[test]
fn empty_slots() {
    config_error(&["train", "--slots", ""], "--slots '': the slot list is empty");
    config_error(&["train", "--slots", " , "], "--slots ' , ': the slot list is empty");
}

#[test]
fn slot_the_task_does_not_have() {
    config_error(
        &["train", "--task", "cifar_minimal", "--slots", "r0c0,r1c0"],
        "--slots: slot r1c0 is not an injection point of the cifar_minimal host (it has r0c0, r0c1, r0c2)",
    );
    config_error(
        &["train", "--slots", "r0c3"],
        "--slots: slot r0c3 is not an injection point of the cifar_baseline host (it has r0c0, r0c1, r0c2, \
         r1c0, r1c1, r1c2)",
    );
}

#[test]
fn config_with_unknown_key() {
    let tmp = TempDir::new("unknown-key");
    std::fs::write(tmp.join("run.toml"), "envs = 4\nlearning_rate = 0.1\n").unwrap();
    let file = tmp.arg("run.toml");
    let line = config_error(
        &["train", "--config", &file],
        &format!("--config {file}, line 2: unknown field `learning_rate`, expected one of `envs`, "),
    );
    assert!(line.contains("`synthetic_test_per_env`"), "{line}");
}

#[test]
fn config_with_wrong_type() {
    let tmp = TempDir::new("wrong-type");
    std::fs::write(tmp.join("run.toml"), "# a run\nrounds = 2\nenvs = \"four\"\n").unwrap();
    let file = tmp.arg("run.toml");
    config_error(
        &["train", "--config", &file],
        &format!("--config {file}, line 3, key `envs`: invalid type: string \"four\", expected usize"),
    );
    std::fs::write(tmp.join("run.toml"), "data = \"mnist\"\n").unwrap();
    config_error(
        &["train", "--config", &file],
        &format!(
            "--config {file}, line 1, key `data`: unknown variant `mnist`, expected `synthetic` or `cifar10`"
        ),
    );
    std::fs::write(tmp.join("run.toml"), "envs = 0\n").unwrap();
    config_error(&["train", "--config", &file], "--envs must be at least 1 (got 0)");
}

#[test]
fn config_that_is_not_toml_or_missing() {
    let tmp = TempDir::new("not-toml");
    std::fs::write(tmp.join("run.toml"), "envs: 4\n").unwrap();
    let file = tmp.arg("run.toml");
    config_error(&["train", "--config", &file], &format!("--config {file}, line 1"));
    let missing = tmp.arg("missing.toml");
    config_error(&["train", "--config", &missing], &format!("--config {missing}: cannot read: "));
}

#[test]
fn unwritable_out() {
    // A path under a regular file cannot be created, even as root.
    let tmp = TempDir::new("unwritable");
    std::fs::write(tmp.join("file"), "x").unwrap();
    let out = tmp.arg("file/out");
    config_error(&["train", "--out", &out], &format!("--out {out} is not writable: "));
    let file = tmp.arg("file");
    config_error(
        &["train", "--out", &file, "--force"],
        &format!("--out {file} exists and is not a directory"),
    );
}

#[test]
fn existing_out_without_force() {
    let tmp = TempDir::new("existing");
    let out = tmp.s();
    config_error(
        &["train", "--out", &out],
        &format!("--out {out} already exists (add --force to write into it)"),
    );
}

#[test]
fn cifar10_without_data_dir() {
    config_error(&["train", "--data", "cifar10"], "--data cifar10 needs --data-dir DIR");
}

#[test]
fn data_dir_with_synthetic_data() {
    let tmp = TempDir::new("synthetic-dir");
    let dir = tmp.s();
    config_error(&["train", "--data-dir", &dir], "--data-dir ");
    let (out, _cwd) = esper(&["train", "--data-dir", &dir]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is only used with --data cifar10"));
}

#[test]
fn data_dir_without_cifar_files() {
    let tmp = TempDir::new("no-cifar");
    let dir = tmp.s();
    let dir = dir.as_str();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", dir],
        &format!("--data-dir: data_batch_1.bin: missing in {dir}"),
    );
    let nowhere = tmp.arg("nowhere");
    config_error(
        &["train", "--data", "cifar10", "--data-dir", &nowhere],
        &format!("--data-dir: data directory {nowhere} does not exist or is not a directory"),
    );
    // All files but the test batch.
    fake_cifar(tmp.path(), 10, 10);
    std::fs::remove_file(tmp.join("test_batch.bin")).unwrap();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", dir],
        &format!("--data-dir: test_batch.bin: missing in {dir}"),
    );
}

#[test]
fn data_dir_with_wrong_file_sizes() {
    let tmp = TempDir::new("bad-size");
    fake_cifar(tmp.path(), 10, 10);
    let dir = tmp.s();
    std::fs::write(tmp.join("data_batch_3.bin"), vec![0u8; 3074]).unwrap();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", &dir],
        &format!("--data-dir: {}: size 3074 is not a multiple of 3073 bytes", tmp.arg("data_batch_3.bin")),
    );
    std::fs::write(tmp.join("data_batch_3.bin"), b"").unwrap();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", &dir],
        &format!("--data-dir: {}: file is empty", tmp.arg("data_batch_3.bin")),
    );
}

#[test]
fn more_envs_than_the_data_can_feed() {
    // Full-size CIFAR-10 (50,000 train / 10,000 test) in the archive's folder: 400 × 128 > 50,000.
    let tmp = TempDir::new("feed");
    fake_cifar(&tmp.join("cifar-10-batches-bin"), 10_000, 10_000);
    let dir = tmp.s();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", &dir, "--envs", "400", "--batch-per-env", "128"],
        "the data cannot feed the envs: batch_per_env 128 × 400 envs = 51200 exceeds the 50000 training images",
    );
    // Fewer test images than envs.
    let small = TempDir::new("feed-small");
    fake_cifar(small.path(), 100, 3);
    let dir = small.s();
    config_error(
        &["train", "--data", "cifar10", "--data-dir", &dir, "--envs", "4", "--batch-per-env", "1"],
        "the data cannot feed the envs: 3 test images cannot give each of 4 envs its own validation slice",
    );
    // Synthetic data is sized to the env count, so only a batch above the per-env size cannot be fed.
    let per_env = RunConfig::default().synthetic_train_per_env;
    let b = (per_env + 1).to_string();
    config_error(
        &["train", "--envs", "2", "--batch-per-env", &b],
        &format!(
            "the data cannot feed the envs: batch_per_env {b} × 2 envs = {} exceeds the {} training images",
            2 * (per_env + 1),
            2 * per_env
        ),
    );
}

#[test]
fn synthetic_data_too_large() {
    // Sized to the env count, the synthetic set would pass 2^32 − 1 images (it is indexed by u32).
    config_error(
        &["train", "--envs", "9000000"],
        "synthetic data: 9000000 envs × synthetic_train_per_env 512 exceeds 4294967295 train images",
    );
    config_error(
        &["train", "--envs", "5000000"],
        "synthetic data: 5000000 envs × synthetic_test_per_env 1024 exceeds 4294967295 test images",
    );
}

#[test]
fn run_too_big_for_memory_exits_2_before_allocating() {
    // 1,000,000 envs of synthetic data alone are 1.536e9 images × 12 KiB ≈ 17 TiB: no machine this runs
    // on has that available, so the preflight refuses it in one line, before the generator or any
    // host is allocated (no abort, no `runs/`), naming both figures and what to lower.
    for command in ["train", "compare"] {
        let line = config_error(&[command, "--envs", "1000000"], "this run would need about ");
        assert!(line.contains("of memory (data 17.2 TiB + 1000000 envs × "), "{line}");
        assert!(line.contains(" is available: lower --envs or --batch-per-env"), "{line}");
        assert!(line.contains("synthetic_train_per_env"), "{line}");
    }
}

#[test]
fn flags_override_config_in_validation() {
    // The file's bad value is overridden by a good flag; the flag's bad value wins over a good file.
    let tmp = TempDir::new("override");
    std::fs::write(tmp.join("run.toml"), "task = \"cifar_huge\"\nenvs = 2\n").unwrap();
    let file = tmp.arg("run.toml");
    config_error(
        &["train", "--config", &file, "--task", "cifar_minimal", "--envs", "0"],
        "--envs must be at least 1",
    );
    config_error(&["train", "--config", &file], "unknown task 'cifar_huge'");
}

#[test]
fn no_subcommand_prints_help_and_exits_2() {
    let (out, _cwd) = esper(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Usage: esper-ecs <COMMAND>"), "{stderr}");
    assert!(stderr.contains("train"), "{stderr}");
}

#[test]
fn unknown_flag_and_subcommand() {
    bad_input(&["train", "--gpus", "2"], "unexpected argument '--gpus' found");
    bad_input(&["fly"], "unrecognized subcommand 'fly'");
}

#[test]
fn top_level_help() {
    let (out, _cwd) = esper(&["--help"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Vectorized morphogenetic training"), "{stdout}");
    assert!(stdout.contains("train"), "{stdout}");
    assert!(stdout.contains("--version"), "{stdout}");
}

/// The help entry of `flag`: its line and the indented description lines under it.
fn help_entry(help: &str, flag: &str) -> String {
    let lines: Vec<&str> = help.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{flag} ")) || l.trim() == flag)
        .unwrap_or_else(|| panic!("{flag} missing from help:\n{help}"));
    let mut entry = lines[start].to_string();
    for l in &lines[start + 1..] {
        let t = l.trim_start();
        if t.is_empty() || t.starts_with('-') {
            break;
        }
        entry.push(' ');
        entry.push_str(t);
    }
    entry
}

#[test]
fn train_help_lists_every_flag_with_its_default() {
    let (out, _cwd) = esper(&["train", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    let d = RunConfig::default();
    let defaults = [
        ("--envs <N>", d.envs.to_string()),
        ("--rounds <R>", d.rounds.to_string()),
        ("--epochs <T>", d.epochs.to_string()),
        ("--task <PRESET>", d.task.clone()),
        ("--data <KIND>", "synthetic".to_string()),
        ("--data-dir <DIR>", "none".to_string()),
        ("--slots <LIST>", "r0c0,r0c1,r0c2".to_string()),
        ("--policy <POLICY>", "ppo".to_string()),
        ("--ppo-epochs <K>", "1".to_string()),
        ("--ppo-lr <LR>", "0.0003".to_string()),
        ("--entropy-coef <C>", "0.05".to_string()),
        ("--target-kl <KL>", "0.015".to_string()),
        ("--policy-hidden <H>", "512".to_string()),
        ("--policy-checkpoint <FILE>", "none".to_string()),
        ("--resume <FILE>", "none".to_string()),
        ("--seed <S>", d.seed.to_string()),
        ("--device <DEVICE>", "cpu".to_string()),
        ("--batch-per-env <B>", d.batch_per_env.to_string()),
        ("--config <FILE>", "none".to_string()),
        ("--out <DIR>", "runs/<UTC timestamp>".to_string()),
        ("--reward-mode <MODE>", "shaped".to_string()),
        ("--reward-family <FAMILY>", "contribution".to_string()),
        ("--param-budget <P>", "500000".to_string()),
        ("--param-penalty-weight <W>", "0.1".to_string()),
        ("--sparse-reward-scale <S>", "1".to_string()),
        ("--rent-host-params-floor <N>", "200".to_string()),
        ("--basic-acc-delta-weight <W>", "5".to_string()),
    ];
    for (flag, default) in &defaults {
        let entry = help_entry(&help, flag);
        assert!(entry.contains(&format!("[default: {default}]")), "{flag}: {entry}");
    }
    assert!(help_entry(&help, "--force").contains("existing --out"), "{help}");
    assert!(help_entry(&help, "--quiet").contains("progress"), "{help}");
    assert!(help_entry(&help, "--log-observations").contains("observation"), "{help}");
    for flag in
        ["--disable-pbrs", "--disable-terminal-reward", "--disable-anti-gaming", "--log-reward-inputs"]
    {
        assert!(help_entry(&help, flag).contains("eward"), "{flag}: {help}");
    }
    for mode in esper_ecs::components::RewardMode::ALL {
        assert!(help_entry(&help, "--reward-mode <MODE>").contains(mode.name()), "{help}");
    }
    // The synthetic sizing and every task preset are stated.
    let data = help_entry(&help, "--data <KIND>");
    assert!(data.contains(&format!("{} train + {} test images per env", 512, 1024)), "{data}");
    assert_eq!((d.synthetic_train_per_env, d.synthetic_test_per_env), (512, 1024));
    let task = help_entry(&help, "--task <PRESET>");
    for t in esper_ecs::components::TaskPreset::ALL {
        assert!(task.contains(t.name()), "{task}");
    }
}
