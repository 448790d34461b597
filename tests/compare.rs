//! The static baseline and `esper-ecs compare`, through the binary: `train --policy static` never
//! germinates; `compare` runs every policy × seed into its own folder and writes the table (checked
//! here against the runs' own summaries).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("esper-compare-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A config file with a small synthetic set, so each run takes a few seconds.
fn tiny_config(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.toml");
    std::fs::write(&path, "synthetic_train_per_env = 128\nsynthetic_test_per_env = 64\nbatch_per_env = 32\n")
        .unwrap();
    path
}

fn esper(args: &[&str], config: &Path, out: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_esper-ecs"))
        .args(args)
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out)
        .output()
        .expect("the esper-ecs binary runs")
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn train_policy_static_only_ever_waits() {
    let dir = temp_dir("static");
    let out = dir.join("run");
    let result = esper(
        &["train", "--policy", "static", "--envs", "3", "--epochs", "4", "--quiet"],
        &tiny_config(&dir),
        &out,
    );
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    let summary = json(&out.join("summary.json"));
    assert_eq!(summary["config"]["policy"], "static");
    assert_eq!(summary["seeds_germinated"], 0);
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), 3 * 4);
    for line in &lines {
        assert_eq!(line["sampled_op"], "WAIT", "{line}");
        assert!(line["stages"].as_array().unwrap().iter().all(|s| s == "DORMANT"), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_runs_every_policy_and_seed_and_writes_the_table() {
    let dir = temp_dir("table");
    let out = dir.join("cmp");
    let result = esper(
        &[
            "compare",
            "--policies",
            "static,random",
            "--seeds",
            "5,6",
            "--envs",
            "2",
            "--epochs",
            "3",
            "--quiet",
        ],
        &tiny_config(&dir),
        &out,
    );
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&result.stderr));

    // Every run has its folder and summary, with its own policy and seed and the shared settings.
    let mut per_policy: Vec<(String, Vec<f64>)> = Vec::new();
    for policy in ["static", "random"] {
        let mut accs = Vec::new();
        for seed in [5u64, 6] {
            let summary = json(&out.join(format!("{policy}-seed{seed}")).join("summary.json"));
            assert_eq!(summary["config"]["policy"], policy);
            assert_eq!(summary["config"]["seed"], seed);
            assert_eq!(
                (summary["config"]["envs"].as_u64(), summary["config"]["epochs"].as_u64()),
                (Some(2), Some(3))
            );
            if policy == "static" {
                assert_eq!(summary["seeds_germinated"], 0);
            }
            accs.push(summary["mean_final_val_accuracy"].as_f64().unwrap());
        }
        per_policy.push((policy.to_string(), accs));
    }

    // compare.csv: a header and one row per run, the runs' own figures.
    let csv = std::fs::read_to_string(out.join("compare.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{csv}");
    for row in &rows {
        let accs = &per_policy.iter().find(|(p, _)| p == row[0]).unwrap().1;
        let seed_index = if row[1] == "5" { 0 } else { 1 };
        assert!((row[2].parse::<f64>().unwrap() - accs[seed_index]).abs() < 1e-3, "{row:?}");
        assert_eq!(row[6], "false");
    }

    // compare.json: per policy the mean and sample sd of the two seeds' figures.
    let report = json(&out.join("compare.json"));
    assert_eq!(report["runs"].as_array().unwrap().len(), 4);
    for (policy, accs) in &per_policy {
        let stat =
            report["stats"].as_array().unwrap().iter().find(|s| s["policy"] == policy.as_str()).unwrap();
        let mean = (accs[0] + accs[1]) / 2.0;
        let sd = (accs[0] - accs[1]).abs() / 2f64.sqrt();
        assert!((stat["mean"].as_f64().unwrap() - mean).abs() < 1e-9, "{policy}");
        assert!((stat["sd"].as_f64().unwrap() - sd).abs() < 1e-9, "{policy}");
        assert_eq!(stat["runs"], 2);
        // The printed table has the policy's row with its mean.
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(policy.as_str()) && l.contains(&format!("{mean:.2}"))),
            "{stdout}"
        );
    }
    assert_eq!(report["interrupted"], false);
    let _ = std::fs::remove_dir_all(&dir);
}
