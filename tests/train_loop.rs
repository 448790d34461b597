//! The training loop end to end through the library: a tiny heuristic run on synthetic data writes one
//! metrics line per env per epoch, a summary, and its hosts learn over the episode.

use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run;
use esper_kernels::data::DataSource;
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
    config.plan_in(out, true).expect("a valid tiny config")
}

fn metrics(plan: &RunPlan) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(plan.out_dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect()
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
    let germinations =
        lines.iter().filter(|l| l["sampled_op"] == "GERMINATE" && l["outcome"] == "executed").count();
    assert_eq!(summary.seeds_germinated as usize, germinations);
}

#[test]
fn a_stop_request_ends_the_run_after_the_current_epoch() {
    let plan = tiny_plan("stop", PolicyKind::Random, 1, 5);
    let summary = run::train(&plan, &AtomicBool::new(true)).unwrap();
    assert_eq!((summary.epochs_completed, summary.interrupted), (1, true));
    assert_eq!(metrics(&plan).len(), 4);
    assert!(plan.out_dir.join("summary.json").exists());
    // The trace is finished too: renamed from .partial, with a footer saying the run was interrupted.
    let trace = esper_ecs::trace::Trace::read(&plan.out_dir.join("trace.bin")).unwrap();
    let esper_ecs::trace::TraceEnd::Complete(footer) = trace.end else { panic!("{:?}", trace.end) };
    assert_eq!((footer.steps, footer.rounds_completed, footer.interrupted), (1, 0, true));
}

/// A NaN in one env's host weights among 8: the governor rolls that env back to its snapshot bit for
/// bit with its live seeds pruned, the other 7 envs match a clean run bit for bit, and the run goes on.
#[test]
fn governor_rolls_back_a_nan_env_and_leaves_the_others_untouched() {
    use esper_components::{EnvIndex, LifecycleTally, SeedStage, SlotIndex, Stage};
    use esper_ecs::run::Session;
    use esper_systems::host_resources::Hosts;
    let mut plan = tiny_plan("governor", PolicyKind::Random, 1, 7);
    plan.config.envs = 8;
    if let DataSource::Synthetic(spec) = &mut plan.data {
        spec.n_train = 8 * 256;
        spec.n_test = 8 * 64;
    }
    let (victim, nan_after) = (3usize, 5u64);
    let mut clean = Session::new(&plan).unwrap();
    let mut broken = Session::new(&plan).unwrap();
    clean.start_round(0);
    broken.start_round(0);
    for epoch in 1..=nan_after {
        clean.run_epoch(epoch);
        broken.run_epoch(epoch);
    }
    // Epoch 5's healthy check took the last snapshot; poison the victim's first conv weight now.
    let snapshot = broken.world.resource::<Hosts>().as_cpu().unwrap().snapshots.params.extract_env(victim);
    broken.world.resource_mut::<Hosts>().as_cpu_mut().unwrap().params.weights.env_mut(0, victim)[0] =
        f32::NAN;
    let epoch = nan_after + 1;
    clean.run_epoch(epoch);
    broken.run_epoch(epoch);
    let b = broken.world.resource::<Hosts>().as_cpu().unwrap();
    let c = clean.world.resource::<Hosts>().as_cpu().unwrap();
    assert_eq!(b.params.extract_env(victim), snapshot, "victim restored to its snapshot bit for bit");
    for e in (0..8).filter(|&e| e != victim) {
        assert_eq!(b.params.extract_env(e), c.params.extract_env(e), "env {e} differs from the clean run");
        assert_eq!(b.bank.extract_env(e), c.bank.extract_env(e), "env {e} seeds differ from the clean run");
    }
    let mut slots = broken.world.query::<(&EnvIndex, &SlotIndex, &Stage)>();
    for (env, _, stage) in slots.iter(&broken.world) {
        if env.0 as usize == victim {
            assert!(!stage.current.has_seed() || stage.current == SeedStage::Fossilized, "live seeds pruned");
        }
    }
    let mut tallies = broken.world.query::<(&EnvIndex, &LifecycleTally)>();
    for (env, tally) in tallies.iter(&broken.world) {
        assert_eq!(tally.rollbacks, u32::from(env.0 as usize == victim), "env {}", env.0);
    }
    // The run goes on: the victim trains again from its snapshot and stays finite.
    for epoch in epoch + 1..=7 {
        broken.run_epoch(epoch);
    }
    let b = broken.world.resource::<Hosts>().as_cpu().unwrap();
    assert!(b.params.extract_env(victim).weights.tensors.iter().flatten().all(|v| v.is_finite()));
}

/// The real binary: 4 envs, heuristic, a tiny synthetic task, 2 rounds; the files exist and parse, hold
/// one metrics line per env per epoch, and validation accuracy improves over the episode on average.
#[test]
fn the_binary_trains_and_writes_its_files() {
    let dir = std::env::temp_dir().join(format!("esper-train-binary-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tiny.toml");
    std::fs::write(&config, "synthetic_train_per_env = 256\nsynthetic_test_per_env = 64\n").unwrap();
    let out = dir.join("run");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_esper-ecs"))
        .args(["train", "--envs", "4", "--rounds", "2", "--epochs", "5", "--batch-per-env", "32", "--quiet"])
        .arg("--config")
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), 4 * 2 * 5);
    let mean_at = |epoch: u64| {
        let v: Vec<f64> =
            lines.iter().filter(|l| l["epoch"] == epoch).map(|l| l["val_acc"].as_f64().unwrap()).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    assert!(mean_at(5) > mean_at(1), "epoch 5 {:.1} % vs epoch 1 {:.1} %", mean_at(5), mean_at(1));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rounds_completed"], 2);
    assert_eq!(summary["config"]["envs"], 4);
    assert!(summary["env_epochs_per_second"].as_f64().unwrap() > 0.0);
}

/// The whole training step's schedule builds with ambiguity detection at error level: no two systems
/// that conflict are left unordered.
#[test]
fn training_schedule_builds_with_ambiguity_detection_at_error() {
    let mut schedule = esper_systems::empty_step_schedule();
    esper_systems::add_training_systems(&mut schedule);
    let mut world = bevy_ecs::world::World::new();
    schedule.initialize(&mut world).expect("no ambiguities in the training step");
}

/// The episode-end schedule gives every env a fresh host for the new round (its own stream for that
/// round), empty slots and a fresh snapshot.
#[test]
fn a_new_round_starts_from_fresh_hosts_and_empty_slots() {
    use esper_components::{SlotState, Stage};
    use esper_ecs::run::{Session, host_arch};
    use esper_kernels::host::HostParams;
    use esper_systems::host_resources::Hosts;
    let plan = tiny_plan("rounds", PolicyKind::Random, 2, 6);
    let mut session = Session::new(&plan).unwrap();
    session.start_round(0);
    for epoch in 1..=6 {
        session.run_epoch(epoch);
    }
    let mut stages = session.world.query::<&Stage>();
    assert!(
        stages.iter(&session.world).any(|s| s.current != SlotState::default().stage.current),
        "random ops germinated"
    );
    session.start_round(1);
    let fresh = HostParams::init(host_arch(&plan), plan.config.seed, 1, &[0, 1, 2, 3]);
    let hosts = session.world.resource::<Hosts>().as_cpu().unwrap();
    assert_eq!(hosts.params, fresh);
    assert_eq!(hosts.snapshots.params, fresh);
    assert!(hosts.snapshots.fossils.iter().all(Option::is_none), "no fossils in a fresh round's snapshots");
    let mut stages = session.world.query::<&Stage>();
    assert!(stages.iter(&session.world).all(|s| *s == SlotState::default().stage));
}
