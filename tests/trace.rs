//! `trace.bin` and `esper-ecs replay` end to end: a run's trace decodes back to exactly the bytes it was
//! written as and agrees with `metrics.jsonl`; `replay --verify` passes on it and fails at exactly the
//! (round, epoch, env) of a changed action; the record section does not depend on the thread count; a
//! killed run leaves a `.partial` trace that replays up to its last complete chunk; and no damaged file
//! makes the reader panic (a bounded property test over random bytes, truncations and byte flips).

use esper_ecs::trace::{FORMAT_VERSION, MAGIC, Trace, TraceEnd, TraceError, encode_chunk, encode_footer};
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_esper-ecs");

/// A fresh folder under the temp dir (left behind on failure, for a look).
fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("esper-trace-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

/// A small run: 4 envs, 2 rounds × 6 epochs, the random policy (so seeds germinate, blend and get pruned).
const TINY: &[&str] = &[
    "train",
    "--envs",
    "4",
    "--rounds",
    "2",
    "--epochs",
    "6",
    "--policy",
    "random",
    "--batch-per-env",
    "16",
    "--quiet",
];

fn tiny_config(dir: &Path) -> PathBuf {
    let file = dir.join("tiny.toml");
    std::fs::write(&file, "synthetic_train_per_env = 64\nsynthetic_test_per_env = 32\n").unwrap();
    file
}

fn esper(args: &[&str], threads: Option<&str>) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if let Some(t) = threads {
        cmd.env("RAYON_NUM_THREADS", t);
    }
    cmd.output().expect("the esper-ecs binary runs")
}

/// Trains the tiny run into `<dir>/run` (with `extra` flags) and returns its trace path.
fn tiny_run(dir: &Path, seed: &str, threads: Option<&str>, extra: &[&str]) -> PathBuf {
    let out = dir.join("run");
    let config = tiny_config(dir);
    // A flag in `extra` replaces TINY's (clap refuses a flag given twice).
    let mut args: Vec<&str> = Vec::new();
    for pair in TINY[1..].chunks(2) {
        if !extra.contains(&pair[0]) {
            args.extend(pair);
        }
    }
    args.insert(0, TINY[0]);
    args.extend(["--seed", seed, "--config", config.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    args.extend(extra);
    let o = esper(&args, threads);
    assert!(o.status.success(), "train failed: {}", String::from_utf8_lossy(&o.stderr));
    out.join("trace.bin")
}

/// One tiny run's trace, shared by the tests that only read it.
fn shared_trace() -> &'static (PathBuf, Vec<u8>) {
    static TRACE: OnceLock<(PathBuf, Vec<u8>)> = OnceLock::new();
    TRACE.get_or_init(|| {
        let path = tiny_run(&temp_dir("shared"), "3", None, &[]);
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    })
}

/// Encodes `trace` again: its original header bytes, a chunk per step and the footer.
fn reencode(original: &[u8], trace: &Trace) -> Vec<u8> {
    let mut bytes = original[..trace.records.start].to_vec();
    for step in &trace.steps {
        bytes.extend(encode_chunk(step));
    }
    if let TraceEnd::Complete(footer) = &trace.end {
        bytes.extend(encode_footer(footer));
    }
    bytes
}

#[test]
fn trace_of_a_run_decodes_to_its_steps_and_agrees_with_the_metrics() {
    let (path, bytes) = shared_trace();
    let trace = Trace::parse(bytes).unwrap();
    assert_eq!(trace.version, FORMAT_VERSION);
    assert_eq!((trace.header.envs, trace.header.rounds, trace.header.epochs), (4, 2, 6));
    assert_eq!(trace.header.slots, ["r0c0", "r0c1", "r0c2"]);
    assert_eq!(trace.steps.len(), 12);
    let TraceEnd::Complete(footer) = trace.end else { panic!("no footer: {:?}", trace.end) };
    assert_eq!(
        (footer.steps, footer.env_records, footer.rounds_completed, footer.interrupted),
        (12, 48, 2, false)
    );
    assert_eq!(reencode(bytes, &trace), *bytes, "decoding and encoding again gives the same bytes");
    assert!(!path.with_extension("bin.partial").exists(), "the .partial file was renamed");
    for (i, step) in trace.steps.iter().enumerate() {
        assert_eq!((step.round, step.epoch, step.step), (i as u64 / 6, i as u64 % 6 + 1, i as u64));
    }
    // Every record agrees with the run's metrics.jsonl line for the same env and step (written by
    // another system from the same components).
    let metrics = std::fs::read_to_string(path.parent().unwrap().join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), 48);
    // serde_json parses floats to within an ulp or so (no float_roundtrip): compare to 1e-12.
    let close = |json: &serde_json::Value, x: f64| {
        json.as_f64().is_some_and(|j| (j - x).abs() <= 1e-12 * x.abs().max(1.0))
    };
    let mut germinated = 0;
    for (l, (step, env)) in
        lines.iter().zip(trace.steps.iter().flat_map(|s| s.envs.iter().map(move |e| (s, e))))
    {
        assert_eq!((l["round"].as_u64().unwrap(), l["epoch"].as_u64().unwrap()), (step.round, step.epoch));
        assert!(close(&l["val_acc"], env.val_acc), "{} vs {}", l["val_acc"], env.val_acc);
        assert_eq!(l["effective_op"], env.effective_op.name());
        assert_eq!(l["outcome"], env.outcome.name());
        let stages: Vec<&str> = l["stages"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
        assert_eq!(stages, env.stages.iter().map(|s| s.name()).collect::<Vec<_>>());
        match env.reward {
            Some(r) => assert!(close(&l["reward"], r), "{} vs {r}", l["reward"]),
            None => assert!(l["reward"].is_null()),
        }
        assert_eq!(env.fingerprint.len(), 4, "host + 3 slots");
        assert!(env.fingerprint[0].sum_sq > 0.0, "the host has non-zero weights");
        germinated += env.stages.iter().filter(|s| s.name() == "GERMINATED").count();
    }
    assert!(germinated > 0, "the random policy germinated something in 12 epochs × 4 envs");
    // Parameters change every step: no two consecutive checksums of an env are equal.
    for w in trace.steps.windows(2).filter(|w| w[0].round == w[1].round) {
        for (a, b) in w[0].envs.iter().zip(&w[1].envs) {
            assert_ne!(a.checksum, b.checksum, "round {} epoch {}", w[1].round, w[1].epoch);
        }
    }
}

#[test]
fn replay_verify_passes_and_fails_at_exactly_the_changed_action() {
    let (path, bytes) = shared_trace();
    let o = esper(&["replay", "--verify", "--quiet", path.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "verify failed: {stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.starts_with("verified 12 steps × 4 envs"), "{stdout}");

    // Change one sampled action in round 1, epoch 3, env 2; the chunk is re-encoded with a valid CRC.
    let mut trace = Trace::parse(bytes).unwrap();
    let (round, epoch, env) = (1u64, 3u64, 2usize);
    let step = trace.steps.iter_mut().find(|s| s.round == round && s.epoch == epoch).unwrap();
    step.envs[env].action.op = (step.envs[env].action.op + 1) % 6;
    let dir = temp_dir("changed");
    let changed = dir.join("trace.bin");
    std::fs::write(&changed, reencode(bytes, &trace)).unwrap();
    let o = esper(&["replay", "--verify", "--quiet", changed.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.starts_with(&format!(
            "divergence at round {round}, epoch {epoch}, env {env}: sampled action head op"
        )),
        "{stdout}"
    );

    // With a tolerance the same trace passes when only a float moved within it, and fails when the
    // host fingerprint moved beyond it.
    let mut trace = Trace::parse(bytes).unwrap();
    trace.steps[4].envs[1].val_loss *= 1.0 + 1e-9;
    std::fs::write(&changed, reencode(bytes, &trace)).unwrap();
    let exact = esper(&["replay", "--verify", "--quiet", changed.to_str().unwrap()], None);
    assert_eq!(exact.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&exact.stdout).contains("round 0, epoch 5, env 1: val_loss"));
    let loose =
        esper(&["replay", "--verify", "--quiet", "--tolerance", "1e-6", changed.to_str().unwrap()], None);
    assert!(loose.status.success(), "{}", String::from_utf8_lossy(&loose.stdout));
    trace.steps[4].envs[1].fingerprint[0].sum += 1.0;
    std::fs::write(&changed, reencode(bytes, &trace)).unwrap();
    let o = esper(&["replay", "--verify", "--quiet", "--tolerance", "1e-6", changed.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("parameter fingerprint (host)"));

    // A range with no recorded round is bad input, not a pass over nothing.
    let o = esper(&["replay", "--verify", "--quiet", "--rounds", "5..7", path.to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the trace holds rounds 0 to 1"));

    // --rounds 1 compares round 1 only: the round-0 change above is not looked at.
    let o = esper(&["replay", "--verify", "--quiet", "--rounds", "1", changed.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    assert!(stdout.starts_with("verified 6 steps × 4 envs"), "{stdout}");
}

#[test]
fn record_section_is_identical_with_one_and_two_threads() {
    // 3 envs: with 2 threads the kernels cannot split the envs evenly, so a split inside an env's rows
    // is exercised too (4 envs would split 2 + 2, the same whole-env work as with 1 thread).
    let run = |tag: &str, threads: &str| {
        let path = tiny_run(&temp_dir(tag), "5", Some(threads), &["--envs", "3"]);
        std::fs::read(path).unwrap()
    };
    let (one, two) = (run("threads1", "1"), run("threads2", "2"));
    let (a, b) = (Trace::parse(&one).unwrap(), Trace::parse(&two).unwrap());
    assert_eq!((a.steps.len(), a.steps[0].envs.len()), (12, 3));
    assert!(one[a.records.clone()] == two[b.records.clone()], "record sections differ");
}

#[test]
fn trace_flag_puts_the_trace_where_asked_and_refuses_a_missing_folder() {
    let dir = temp_dir("flag");
    let file = dir.join("elsewhere.bin");
    let path =
        tiny_run(&dir, "1", None, &["--rounds", "1", "--epochs", "2", "--trace", file.to_str().unwrap()]);
    assert!(!path.exists(), "no trace in the run folder when --trace is given");
    assert_eq!(Trace::read(&file).unwrap().steps.len(), 2);
    let missing = dir.join("no-such-folder").join("t.bin");
    let o = esper(
        &[
            "train",
            "--envs",
            "2",
            "--trace",
            missing.to_str().unwrap(),
            "--out",
            dir.join("x").to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: --trace (trace): "));
    assert!(!dir.join("x").exists(), "nothing created for a run refused");
}

#[test]
fn killed_run_leaves_a_partial_trace_that_replays_to_its_last_complete_chunk() {
    let dir = temp_dir("killed");
    let out = dir.join("run");
    let config = tiny_config(&dir);
    let mut child = Command::new(BIN)
        .args([
            "train",
            "--envs",
            "4",
            "--epochs",
            "1000",
            "--batch-per-env",
            "16",
            "--quiet",
            "--policy",
            "random",
        ])
        .args(["--config", config.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .spawn()
        .unwrap();
    let partial = out.join("trace.bin.partial");
    let started = std::time::Instant::now();
    // Wait for at least three whole steps on disk.
    loop {
        if let Ok(bytes) = std::fs::read(&partial)
            && Trace::parse(&bytes).is_ok_and(|t| t.steps.len() >= 3)
        {
            break;
        }
        assert!(started.elapsed().as_secs() < 120, "no three steps written in 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!out.join("trace.bin").exists(), "a killed run never renames its trace");
    let bytes = std::fs::read(&partial).unwrap();
    let trace = Trace::parse(&bytes).unwrap();
    let TraceEnd::Truncated { chunks, offset, .. } = trace.end else { panic!("{:?}", trace.end) };
    assert!(chunks >= 3 && chunks as usize == trace.steps.len());
    assert!(offset as usize <= bytes.len());
    for (i, s) in trace.steps.iter().enumerate() {
        assert_eq!((s.round, s.epoch, s.envs.len()), (0, i as u64 + 1, 4));
    }
    // The CLI reads it: the report, with a note on where it stops, and a verify of its complete steps.
    let o = esper(&["replay", partial.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains(&format!("stops after {chunks} complete chunks, at byte {offset}")), "{stderr}");
    let o = esper(&["replay", "--verify", "--quiet", partial.to_str().unwrap()], None);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.starts_with(&format!("verified {chunks} steps × 4 envs")), "{stdout}");
    // Asking for trace.bin points at the .partial.
    let o = esper(&["replay", out.join("trace.bin").to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("trace.bin.partial"));
}

#[test]
fn replay_report_json_and_plot_describe_the_run() {
    let (path, bytes) = shared_trace();
    let trace = Trace::parse(bytes).unwrap();
    let o = esper(&["replay", path.to_str().unwrap()], None);
    assert!(o.status.success());
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(
        report.contains("run: 4 envs, task cifar_baseline, data synthetic, policy random, seed 3"),
        "{report}"
    );
    assert!(report.contains("records: 12 steps × 4 envs, complete"), "{report}");
    // One timeline line per (round, env, slot), six characters each.
    let lanes: Vec<&str> = report.lines().filter(|l| l.starts_with("    r0c")).collect();
    assert_eq!(lanes.len(), 2 * 4 * 3, "{report}");
    assert!(lanes.iter().all(|l| l.split_whitespace().nth(1).is_some_and(|t| t.chars().count() == 6)));
    // The round summaries count what the run's summary.json counted (from the lifecycle tallies).
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.parent().unwrap().join("summary.json")).unwrap())
            .unwrap();
    let totals = esper_ecs::replay::rounds(&trace).iter().fold([0usize; 3], |t, (r, steps)| {
        let s = esper_ecs::replay::summarize_round(*r, steps);
        [t[0] + s.germinated, t[1] + s.fossilized, t[2] + s.pruned]
    });
    let counted = ["seeds_germinated", "seeds_fossilized", "seeds_pruned"]
        .map(|k| summary[k].as_u64().unwrap() as usize);
    assert_eq!(totals, counted);
    // The timeline marks every germination the records show.
    let germinations: usize = lanes.iter().map(|l| l.matches('G').count()).sum();
    let recorded = esper_ecs::replay::rounds(&trace)
        .iter()
        .map(|(r, steps)| esper_ecs::replay::summarize_round(*r, steps).germinated)
        .sum::<usize>();
    assert!(recorded > 0);
    assert_eq!(germinations, recorded);

    let o = esper(&["replay", "--json", path.to_str().unwrap()], None);
    assert!(o.status.success());
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1 + 48 + 1);
    assert_eq!(lines[0]["header"]["config"]["envs"], 4);
    assert_eq!(lines[1]["env"], 0);
    assert_eq!(lines[5]["epoch"], 2);
    assert_eq!(lines[49]["end"]["complete"], true);

    let dir = temp_dir("plot");
    let svg = dir.join("run.svg");
    let o = esper(&["replay", "--plot", svg.to_str().unwrap(), path.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn replay_refuses_bad_files_with_exit_2() {
    let (_, bytes) = shared_trace();
    let dir = temp_dir("bad");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not-a-trace", b"hello, this is not a trace".to_vec(), "not an esper-ecs trace"),
        ("empty", Vec::new(), "not an esper-ecs trace"),
        (
            "newer",
            {
                let mut b = bytes.clone();
                b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
                let end = Trace::parse(bytes).unwrap().records.start - 4;
                let crc = crc32fast::hash(&b[8..end]);
                b[end..end + 4].copy_from_slice(&crc.to_le_bytes());
                b
            },
            "trace format version 2 is newer than this build reads",
        ),
        (
            "missing-chunk",
            {
                let mut trace = Trace::parse(bytes).unwrap();
                trace.steps.remove(5);
                reencode(bytes, &trace)
            },
            "damaged chunk 5 at byte offset",
        ),
        (
            "flipped-header",
            {
                let mut b = bytes.clone();
                b[20] ^= 0x10;
                b
            },
            "trace header: ",
        ),
        (
            "flipped-chunk",
            {
                let mut b = bytes.clone();
                let at = Trace::parse(bytes).unwrap().records.start + 40;
                b[at] ^= 0x01;
                b
            },
            "checksum error in chunk 0 at byte offset",
        ),
    ];
    for (name, content, message) in cases {
        let file = dir.join(name);
        std::fs::write(&file, content).unwrap();
        let o = esper(&["replay", file.to_str().unwrap()], None);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: one line: {stderr}");
        assert!(stderr.contains(message) && stderr.starts_with("error: "), "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}");
    }
    let o = esper(&["replay", dir.join("missing.bin").to_str().unwrap()], None);
    assert_eq!(o.status.code(), Some(2));
}

/// The class a damaged copy of a real trace must report, from where the damage is.
fn expected_flip_class(offset: usize, records_start: usize) -> &'static [&'static str] {
    if offset < MAGIC.len() {
        &["not_a_trace"]
    } else if offset < records_start {
        // A flipped version byte may read as a newer version; anything else fails the header CRC.
        &["header", "newer_version"]
    } else {
        &["corrupt"]
    }
}

fn class(result: &Result<Trace, TraceError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => e.class(),
    }
}

/// Where each complete frame of `trace` ends (chunks, then the footer).
fn frame_ends(bytes: &[u8], trace: &Trace) -> Vec<usize> {
    let mut at = trace.records.start;
    let mut ends = Vec::new();
    while at < trace.records.end {
        let len = u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        at += 9 + len + 4;
        ends.push(at);
    }
    ends
}

/// `esper-ecs replay FILE` (the report) run in-process on `bytes` — the function the binary calls:
/// its exit code and what it wrote to stderr. `tag` names the scratch file (one per property).
fn replay_exit(bytes: &[u8], tag: &str) -> (u8, String) {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let file = DIR.get_or_init(|| temp_dir("prop")).join(tag);
    std::fs::write(&file, bytes).unwrap();
    let args = esper_ecs::cli::ReplayArgs {
        trace: file,
        verify: false,
        tolerance: None,
        rounds: None,
        json: false,
        plot: None,
        quiet: true,
    };
    let mut err = Vec::new();
    let code = esper_ecs::replay::command::command(&args, &mut std::io::sink(), &mut err);
    (code, String::from_utf8(err).unwrap())
}

/// Exit 2 with exactly one `error:` line, naming `what`.
fn is_bad_input(code: u8, stderr: &str, what: &str) -> bool {
    code == 2 && stderr.lines().count() == 1 && stderr.starts_with("error: ") && stderr.contains(what)
}

proptest! {
    // 3 properties × 4,000 cases: 12,000 damaged or random inputs per run, each read by the reader and
    // by the replay command (exit codes as documented: 0 readable, 2 bad input).
    #![proptest_config(ProptestConfig {
        cases: 4_000, failure_persistence: None, ..ProptestConfig::default()
    })]

    /// Every single-byte change of a real trace is caught, as the class its position calls for.
    #[test]
    fn reader_reports_every_flipped_byte(pos in any::<prop::sample::Index>(), mask in 1u8..=255) {
        let (_, bytes) = shared_trace();
        let start = Trace::parse(bytes).unwrap().records.start;
        let mut damaged = bytes.clone();
        let at = pos.index(bytes.len());
        damaged[at] ^= mask;
        let result = Trace::parse(&damaged);
        prop_assert!(expected_flip_class(at, start).contains(&class(&result)),
            "flip at {} (records from {}): {:?}", at, start, result.err());
        if let Err(TraceError::Corrupt { offset, .. }) = &result {
            prop_assert!(*offset as usize <= at, "the reported frame starts at or before the flip");
        }
        let (code, stderr) = replay_exit(&damaged, "flip");
        let what = if at < MAGIC.len() {
            "not an esper-ecs trace"
        } else if at < start {
            "trace"
        } else {
            "checksum error in chunk"
        };
        prop_assert!(is_bad_input(code, &stderr, what), "flip at {}: exit {}, {}", at, code, stderr);
    }

    /// A trace cut anywhere reads back every complete chunk before the cut (or fails in the header).
    #[test]
    fn reader_reads_every_complete_chunk_of_a_cut_trace(pos in any::<prop::sample::Index>()) {
        let (_, bytes) = shared_trace();
        let full = Trace::parse(bytes).unwrap();
        let cut = pos.index(bytes.len());
        let result = Trace::parse(&bytes[..cut]);
        let (code, stderr) = replay_exit(&bytes[..cut], "cut");
        if cut < MAGIC.len() {
            prop_assert_eq!(class(&result), "not_a_trace");
            prop_assert!(is_bad_input(code, &stderr, "not an esper-ecs trace"), "{}", stderr);
        } else if cut < full.records.start {
            prop_assert_eq!(class(&result), "header");
            prop_assert!(is_bad_input(code, &stderr, "trace header: "), "{}", stderr);
        } else {
            // Readable up to the cut: exit 0, and a note on where it stops.
            prop_assert!(code == 0 && stderr.starts_with("note: "), "cut at {}: exit {}, {}", cut, code, stderr);
            let trace = result.unwrap();
            let complete = frame_ends(bytes, &full).iter().filter(|&&e| e <= cut).count();
            // The footer is the last frame: a cut file never has it.
            prop_assert_eq!(trace.steps.len(), complete.min(full.steps.len()));
            let truncated = matches!(trace.end, TraceEnd::Truncated { .. });
            prop_assert!(truncated, "a cut trace has no footer: {:?}", trace.end);
            prop_assert_eq!(&trace.steps[..], &full.steps[..complete.min(full.steps.len())]);
        }
    }

    /// Random bytes, with and without the magic and a real header in front, never panic.
    #[test]
    fn reader_never_panics_on_random_bytes(
        noise in prop::collection::vec(any::<u8>(), 0..600),
        prefix in 0usize..3,
    ) {
        let (_, bytes) = shared_trace();
        let start = Trace::parse(bytes).unwrap().records.start;
        let mut input = match prefix {
            0 => Vec::new(),
            1 => MAGIC.to_vec(),
            _ => bytes[..start].to_vec(),
        };
        input.extend(&noise);
        let result = Trace::parse(&input);
        let (code, stderr) = replay_exit(&input, "random");
        match &result {
            Ok(_) => prop_assert_eq!(code, 0),
            Err(e) => prop_assert!(is_bad_input(code, &stderr, &e.to_string()), "exit {}, {}", code, stderr),
        }
        match prefix {
            0 if noise.len() < 8 || noise[..8] != MAGIC[..] => prop_assert_eq!(class(&result), "not_a_trace"),
            2 => prop_assert!(matches!(class(&result), "ok" | "corrupt"), "{:?}", result.err()),
            _ => {}
        }
    }
}
