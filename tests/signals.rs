//! A run stopped by SIGTERM (a job scheduler's stop, `kill`) ends as Ctrl-C does: after the current
//! epoch, with its summary, metrics and a finished trace written, not killed mid-write.

#![cfg(unix)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigterm_stops_the_run_and_still_writes_summary_and_trace() {
    let out = std::env::temp_dir().join(format!("esper-sigterm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    // Long enough that it is still training when the signal comes (a few hundred epochs of 4 envs).
    let mut child = Command::new(env!("CARGO_BIN_EXE_esper-ecs"))
        .args(["train", "--envs", "4", "--epochs", "400", "--policy", "heuristic", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start esper-ecs");
    // Wait until the first epoch is on disk, so that the handler is installed and training runs.
    let metrics: PathBuf = out.join("metrics.jsonl");
    let started = Instant::now();
    while std::fs::metadata(&metrics).map(|m| m.len() == 0).unwrap_or(true) {
        assert!(started.elapsed() < Duration::from_secs(120), "no epoch written within 2 minutes");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before the signal");
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("run kill");
    assert!(killed.success());
    let status = child.wait().expect("wait for esper-ecs");
    assert!(status.code().is_some(), "ended by the signal itself instead of the handler: {status:?}");

    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("summary.json")).expect("summary.json written"),
    )
    .unwrap();
    assert_eq!(summary["interrupted"], true);
    let epochs = summary["epochs_completed"].as_u64().unwrap();
    assert!((1..400).contains(&epochs), "stopped after {epochs} epochs");
    assert!(out.join("trace.bin").exists(), "the trace is finished (renamed from .partial)");
    assert!(!out.join("trace.bin.partial").exists());
    let _ = std::fs::remove_dir_all(&out);
}
