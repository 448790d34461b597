//! The training loop end to end through the library: a tiny heuristic run on synthetic data writes one
//! metrics line per env per epoch, a summary, and its hosts learn over the episode.

use esper_components::{SlotConfig, TaskPreset};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run;
use esper_kernels::data::{DataSource, SyntheticSpec};
use std::sync::atomic::AtomicBool;

fn tiny_plan(name: &str, policy: PolicyKind, rounds: usize, epochs: usize) -> RunPlan {
    let out = std::env::temp_dir().join(format!("esper-train-loop-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig {
        envs: 4,
        rounds,
        epochs,
        policy,
        batch_per_env: 32,
        synthetic_train_per_env: 512,
        synthetic_test_per_env: 128,
        ..RunConfig::default()
    };
    let spec = SyntheticSpec {
        n_train: config.envs * config.synthetic_train_per_env,
        n_test: config.envs * config.synthetic_test_per_env,
        ..SyntheticSpec::with_seed(config.seed)
    };
    RunPlan {
        task: TaskPreset::CifarBaseline,
        slots: SlotConfig::parse_list(&config.slots).unwrap(),
        data: DataSource::Synthetic(spec),
        out_dir: out,
        quiet: true,
        config,
    }
}

fn metrics(plan: &RunPlan) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(plan.out_dir.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn heuristic_run_writes_metrics_and_learns() {
    let plan = tiny_plan("heuristic", PolicyKind::Heuristic, 2, 6);
    let summary = run::train(&plan, &AtomicBool::new(false)).unwrap();
    assert_eq!((summary.rounds_completed, summary.epochs_completed, summary.interrupted), (2, 12, false));
    let lines = metrics(&plan);
    assert_eq!(lines.len(), 4 * 12, "one line per env per epoch");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["env"].as_u64().unwrap() as usize, i % 4);
        assert_eq!(l["stages"].as_array().unwrap().len(), 3);
    }
    // Mean validation accuracy rises over each episode.
    for round in 0..2 {
        let acc = |epoch: u64| {
            let v: Vec<f64> = lines
                .iter()
                .filter(|l| l["round"] == round && l["epoch"] == epoch)
                .map(|l| l["val_acc"].as_f64().unwrap())
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        assert!(acc(6) > acc(1), "round {round}: epoch 6 {:.1} % vs epoch 1 {:.1} %", acc(6), acc(1));
    }
    let summary_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan.out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary_json["epochs_completed"], 12);
    assert_eq!(summary_json["final_val_accuracy"].as_array().unwrap().len(), 4);
    // The summary's counts agree with the ops the metrics recorded.
    let germinations = lines.iter().filter(|l| l["op"] == "GERMINATE" && l["outcome"] == "Succeeded").count();
    assert_eq!(summary.seeds_germinated as usize, germinations);
}

#[test]
fn a_stop_request_ends_the_run_after_the_current_epoch() {
    let plan = tiny_plan("stop", PolicyKind::Random, 1, 5);
    let summary = run::train(&plan, &AtomicBool::new(true)).unwrap();
    assert_eq!((summary.epochs_completed, summary.interrupted), (1, true));
    assert_eq!(metrics(&plan).len(), 4);
    assert!(plan.out_dir.join("summary.json").exists());
}
