//! Profiling end to end through the real binary: `train --profile chrome=…` writes a trace with a span
//! for every system of the schedule at every step, `profile` reads it back as a table (and compares
//! two), `train --profile table` prints it; `bench` measures its three tiers on a tiny workload.

use esper_ecs::config::RunConfig;
use esper_ecs::run::Session;
use esper_systems::step_span::TRAINING_SYSTEM_SPANS;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const EPOCHS: u64 = 3;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("esper-profile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn esper(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_esper-ecs")).args(args).output().expect("the binary runs")
}

/// A tiny run: 2 envs, 3 epochs, 2 batches of 16 images per epoch.
fn tiny_train(dir: &Path, profile: &[&str]) -> Output {
    let config = dir.join("tiny.toml");
    std::fs::write(
        &config,
        "synthetic_train_per_env = 32\nsynthetic_test_per_env = 16\nbatch_per_env = 16\n",
    )
    .unwrap();
    let out = dir.join("run");
    let epochs = EPOCHS.to_string();
    let mut args = vec![
        "train",
        "--envs",
        "2",
        "--epochs",
        &epochs,
        "--config",
        config.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--quiet",
        // A small learned policy: its once-per-round update stays below the hosts' training, as in a
        // run of real length.
        "--policy-hidden",
        "32",
    ];
    for p in profile {
        args.extend(["--profile", p]);
    }
    esper(&args)
}

/// A span argument (tracing-chrome writes fields as strings).
fn arg(event: &Value, key: &str) -> u64 {
    let v = &event["args"][key];
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(u64::MAX)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_span_list_has_one_name_per_system_of_the_schedule() {
    let config = RunConfig {
        envs: 2,
        synthetic_train_per_env: 16,
        synthetic_test_per_env: 8,
        batch_per_env: 8,
        ..RunConfig::default()
    };
    let plan = config.plan_in(std::env::temp_dir(), true).unwrap();
    let session = Session::new(&plan).unwrap();
    // bevy_ecs gives system names only with its `debug` feature; the count plus the trace test below
    // (each listed span exactly once per step) pins one span per system.
    assert_eq!(session.system_names().len(), TRAINING_SYSTEM_SPANS.len());
}

#[test]
fn chrome_trace_has_every_system_at_every_step_and_profile_reads_it() {
    let dir = scratch("chrome");
    let trace = dir.join("trace.json");
    let run = tiny_train(&dir, &[&format!("chrome={}", trace.display())]);
    assert!(run.status.success(), "train failed: {}", stderr(&run));

    let events: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let begins: Vec<&Value> = events.iter().filter(|e| e["ph"] == "B").collect();
    let ends = events.iter().filter(|e| e["ph"] == "E").count();
    assert_eq!(begins.len(), ends, "every span is closed");
    for step in 0..EPOCHS {
        for name in TRAINING_SYSTEM_SPANS.iter().chain(&["step"]) {
            let found = begins.iter().filter(|e| e["name"] == *name && arg(e, "step") == step).count();
            assert_eq!(found, 1, "span {name} at step {step}");
        }
    }
    let train = begins.iter().find(|e| e["name"] == "TrainHosts::train_hosts").unwrap();
    assert_eq!(arg(train, "envs"), 2);
    assert!(!begins.iter().any(|e| e["name"] == "system"), "bevy's own spans are filtered out");

    // `profile` on the file: every system, called once per step, with plausible numbers.
    let out = esper(&["profile", trace.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains(&format!("{EPOCHS} steps × 2 envs")), "{table}");
    let mut total_share = 0.0;
    for name in TRAINING_SYSTEM_SPANS {
        let line = table.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| {
            panic!("{name} missing from\n{table}");
        });
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols[1].parse::<u64>().unwrap(), EPOCHS, "{line}");
        let num = |i: usize| cols[i].trim_end_matches('%').parse::<f64>().unwrap();
        let (mean, p50, p95, total, share) = (num(2), num(3), num(4), num(5), num(6));
        assert!(
            mean >= 0.0 && p50 <= p95 && (mean * EPOCHS as f64 - total).abs() <= 0.1 + 1e-3 * total,
            "{line}"
        );
        assert!((0.0..=100.0).contains(&share), "{line}");
        assert_eq!(cols[7], "–", "no device time on CPU: {line}");
        total_share += share;
    }
    assert!(total_share <= 100.5, "systems run inside the step: {total_share}");
    let train_line = table.lines().find(|l| l.starts_with("TrainHosts::train_hosts")).unwrap();
    let first_row = table.lines().nth(3).unwrap();
    assert_eq!(first_row, train_line, "sorted by total: training dominates\n{table}");
    assert!(table.contains("epoch boundary (end of Validate → next TrainHosts)"), "{table}");

    // Comparing the trace with itself gives ratio 1 everywhere.
    let out = esper(&["profile", trace.to_str().unwrap(), trace.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let cmp = stdout(&out);
    for name in TRAINING_SYSTEM_SPANS {
        let line = cmp.lines().find(|l| l.starts_with(name)).unwrap();
        assert!(line.ends_with("1.000"), "{line}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profile_table_prints_at_the_end_of_train() {
    let dir = scratch("table");
    let run = tiny_train(&dir, &["table"]);
    assert!(run.status.success(), "train failed: {}", stderr(&run));
    let text = stdout(&run);
    assert!(text.contains("TrainHosts::train_hosts") && text.contains("epoch boundary"), "{text}");
    assert!(dir.join("run/trace.json").is_file() && dir.join("run/profile.txt").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn profile_bad_input_is_one_line_and_exit_2() {
    let dir = scratch("bad");
    let missing = dir.join("missing.json");
    let out = esper(&["profile", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot read") && stderr(&out).contains("missing.json"),
        "{}",
        stderr(&out)
    );

    let not_trace = dir.join("x.json");
    std::fs::write(&not_trace, "[{\"ph\":\"B\",\"name\":\"a\",\"ts\":1,\"tid\":1}]").unwrap();
    let out = esper(&["profile", not_trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no `step` span"), "{}", stderr(&out));

    let out = esper(&["train", "--profile", "flamegraph"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected `table` or `chrome=FILE.json`"), "{}", stderr(&out));

    let twice = ["train", "--profile", "chrome=a.json", "--profile", "chrome=b.json"];
    let out = esper(&twice);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("may be given once"), "{}", stderr(&out));
    let run_dir = dir.join("never");
    let bad_trace = format!("chrome={}", dir.join("no/such/dir/t.json").display());
    let out = esper(&["train", "--out", run_dir.to_str().unwrap(), "--profile", &bad_trace]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!run_dir.exists(), "a bad trace path leaves no run folder behind");

    let out = esper(&["bench", "--envs", "4,0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = esper(&["bench", "--device", "tpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown device 'tpu'"), "{}", stderr(&out));
    // A CPU build refuses CUDA with one line, before any work, saying how to get a CUDA build. (A CUDA
    // build runs the bench on the GPU: not something a test here can do.)
    let cuda_refused = if cfg!(feature = "cuda") { &[][..] } else { &["cuda", "cuda:1"][..] };
    for device in cuda_refused {
        let out = esper(&["bench", "--device", device]);
        assert_eq!(out.status.code(), Some(2), "{device}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&format!("--device {device}: this binary was built without CUDA")), "{err}");
        assert!(err.contains("cuda-build.sh") && err.contains("--features cuda"), "{err}");
    }
    // selftest checks CUDA kernels: a CPU build refuses it the same way, and a CPU device is no device for it.
    if !cfg!(feature = "cuda") {
        let out = esper(&["selftest"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(
            stderr(&out).contains("--device cuda: this binary was built without CUDA"),
            "{}",
            stderr(&out)
        );
    }
    let out = esper(&["selftest", "--device", "cpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("give --device cuda or cuda:N"), "{}", stderr(&out));
    let out = esper(&["bench", "--device", "cuda:x"]);
    assert!(stderr(&out).contains("unknown device 'cuda:x'"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_reports_three_tiers_per_env_count() {
    let dir = scratch("bench");
    let json = dir.join("bench.json");
    let out = esper(&[
        "bench",
        "--envs",
        "1,2",
        "--batch-per-env",
        "8",
        "--test-per-env",
        "8",
        "--train-batches",
        "1",
        "--warmup",
        "0",
        "--reps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("validation configurations per env: 8"), "{text}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let tiers = report["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 6);
    for (i, t) in tiers.iter().enumerate() {
        assert_eq!(t["envs"], [1, 1, 1, 2, 2, 2][i]);
        assert_eq!(t["tier"], ["train", "validate_policy", "full_loop"][i % 3]);
        let (median, min, max) = (
            t["step"]["median_ms"].as_f64().unwrap(),
            t["step"]["min_ms"].as_f64().unwrap(),
            t["step"]["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= median && median <= max, "{t}");
        let envs = t["envs"].as_f64().unwrap();
        let images = t["train_images_per_s"].as_f64().unwrap();
        assert!((images - envs * 8.0 / (median / 1e3)).abs() < 1e-6 * images, "{t}");
    }
    for (i, t) in tiers.iter().enumerate() {
        // Without warm-up the first timed train step germinates the forced seeds; after that nothing moves.
        let expected = if i % 3 == 0 { 3.0 * t["envs"].as_f64().unwrap() / 2.0 } else { 0.0 };
        assert_eq!(t["regerminated_slots_per_step"].as_f64().unwrap(), expected, "{t}");
    }
    let boundary = report["boundary"].as_array().unwrap();
    assert_eq!(boundary.len(), 2);
    for b in boundary {
        let median = b["step"]["median_ms"].as_f64().unwrap();
        assert!(median > 0.0 && median < tiers[2]["step"]["median_ms"].as_f64().unwrap(), "{b}");
    }
    assert_eq!(report["counterfactual_configs"], 8);
    assert!(report["boundary_growth_16_to_256"].is_null());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--seeds none`: the bare host under the static policy — one validation configuration (no seed to
/// ablate), and no slot ever leaves the empty state, so nothing is re-germinated or reset.
#[test]
fn bench_without_seeds_runs_the_bare_host() {
    let dir = scratch("bench-none");
    let json = dir.join("bench.json");
    let args = ["bench", "--seeds", "none", "--envs", "2", "--batch-per-env", "8", "--test-per-env", "8"];
    let rest = ["--train-batches", "1", "--warmup", "0", "--reps", "2", "--json", json.to_str().unwrap()];
    let out = esper(&[&args[..], &rest[..]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("forced state: no seeds (every slot empty), static policy"), "{text}");
    assert!(text.contains("validation configurations per env: 1"), "{text}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["config"]["seeds"], "none");
    let tiers = report["tiers"].as_array().unwrap();
    assert_eq!(tiers.len(), 3);
    for t in tiers {
        assert_eq!(t["regerminated_slots_per_step"].as_f64().unwrap(), 0.0, "{t}");
    }
    let out = esper(&["bench", "--seeds", "some"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown --seeds 'some' (known: blending, none)"), "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--count-syncs` prints one line per step; on the CPU there is no device to wait for, and the
/// summary has no device figures.
#[test]
fn count_syncs_prints_a_line_per_step() {
    let dir = scratch("count-syncs");
    let config = dir.join("tiny.toml");
    std::fs::write(
        &config,
        "synthetic_train_per_env = 32\nsynthetic_test_per_env = 16\nbatch_per_env = 16\n",
    )
    .unwrap();
    let run = dir.join("run");
    let epochs = EPOCHS.to_string();
    let args =
        ["train", "--envs", "2", "--epochs", &epochs, "--policy", "static", "--count-syncs", "--quiet"];
    let out =
        esper(&[&args[..], &["--config", config.to_str().unwrap(), "--out", run.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("copies back")).collect();
    assert_eq!(lines.len() as u64, EPOCHS, "{text}");
    for (step, line) in lines.iter().enumerate() {
        assert_eq!(*line, format!("step {step}: 0 copies back (no device: the hosts run on the CPU)"));
    }
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert!(summary.get("device").is_none(), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}
