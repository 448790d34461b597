//! `train --policy ppo` end to end through the library: checkpoints and `--resume` (bit-exact on the
//! CPU), `--eval` of a checkpoint (no learning), and learning on a small configuration.

use candle_core::{DType, Device};
use esper_ecs::checkpoint;
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run;
use esper_ecs::trace::Trace;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("esper-ppo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A learned-policy run small enough for a test (3 envs × 4 epochs, LSTM 32, 64 + 32 images per env).
pub(crate) fn small(rounds: usize) -> RunConfig {
    RunConfig {
        envs: 3,
        rounds,
        epochs: 4,
        policy: PolicyKind::Ppo,
        policy_hidden: 32,
        batch_per_env: 16,
        synthetic_train_per_env: 64,
        synthetic_test_per_env: 32,
        ..RunConfig::default()
    }
}

fn plan(config: RunConfig, out: &Path) -> RunPlan {
    config.plan_in(out.to_path_buf(), true).expect("a valid config")
}

/// Every tensor of a checkpoint, by name, as f32 bits.
fn tensors(path: &Path) -> Vec<(String, Vec<u32>)> {
    let map = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    let mut out: Vec<(String, Vec<u32>)> = map
        .into_iter()
        .map(|(k, t)| {
            let v: Vec<f32> = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            (k, v.iter().map(|x| x.to_bits()).collect())
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// 2 rounds in one run, and 1 round + its checkpoint + `--resume` for the second: the second round's
/// actions, rewards and parameter checksums, and the final weights, Adam moments and normalisers, are
/// identical bit for bit.
#[test]
fn resume_continues_bit_exactly() {
    let (a, a1, b) = (scratch("resume-a"), scratch("resume-a1"), scratch("resume-b"));
    let stop = AtomicBool::new(false);
    let whole = run::train(&plan(small(2), &a), &stop).unwrap();
    let first = run::train(&plan(small(1), &a1), &stop).unwrap();
    assert_eq!((whole.policy_updates, first.policy_updates), (2, 1));
    let saved = checkpoint::load(&checkpoint::path_in(&a1)).unwrap();
    assert_eq!((saved.header.next_round, saved.header.train_steps, saved.header.adam_step), (1, 1, 1));

    let mut resumed = plan(RunConfig { rounds: 2, ..saved.header.config.clone() }, &b);
    resumed.resume = Some(checkpoint::path_in(&a1));
    let summary = run::train(&resumed, &stop).unwrap();
    assert_eq!((summary.rounds_completed, summary.epochs_completed), (1, 4));

    let (ta, tb) = (Trace::read(&a.join("trace.bin")).unwrap(), Trace::read(&b.join("trace.bin")).unwrap());
    let round1: Vec<_> = ta.steps.iter().filter(|s| s.round == 1).collect();
    assert_eq!((round1.len(), tb.steps.len()), (4, 4));
    for (x, y) in round1.iter().zip(&tb.steps) {
        assert_eq!((x.round, x.epoch), (y.round, y.epoch));
        for (ex, ey) in x.envs.iter().zip(&y.envs) {
            assert_eq!(ex.action, ey.action, "round 1 epoch {}", x.epoch);
            assert_eq!(ex.reward.map(f64::to_bits), ey.reward.map(f64::to_bits));
            assert_eq!(ex.reward_norm.map(f64::to_bits), ey.reward_norm.map(f64::to_bits));
            assert_eq!(ex.checksum, ey.checksum);
        }
    }
    // The resumed run's actions are not the first round's replayed: the round is new.
    assert_ne!(
        ta.steps[0].envs.iter().map(|e| e.checksum).collect::<Vec<_>>(),
        tb.steps[0].envs.iter().map(|e| e.checksum).collect::<Vec<_>>()
    );

    let (ca, cb) = (checkpoint::path_in(&a), checkpoint::path_in(&b));
    let (ha, hb) = (checkpoint::load(&ca).unwrap().header, checkpoint::load(&cb).unwrap().header);
    assert_eq!((ha.next_round, ha.train_steps, ha.adam_step), (2, 2, 2));
    assert_eq!((hb.next_round, hb.train_steps, hb.adam_step), (2, 2, 2));
    assert_eq!(ha.obs_normalizer, hb.obs_normalizer);
    assert_eq!(ha.reward_normalizer, hb.reward_normalizer);
    assert_eq!(ha.value_normalizer, hb.value_normalizer);
    let (wa, wb) = (tensors(&ca), tensors(&cb));
    assert!(wa.len() > 100, "{} tensors", wa.len());
    assert_eq!(wa, wb);
    // And the second round changed the weights.
    assert_ne!(tensors(&checkpoint::path_in(&a1)), wa);
    for d in [a, a1, b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--eval` runs a checkpoint's policy without learning: no checkpoint is written and the round's line
/// has no update; a checkpoint of another shape is refused with an error that says why.
#[test]
fn eval_runs_a_checkpoint_without_learning() {
    let (train_dir, eval_dir) = (scratch("eval-train"), scratch("eval-run"));
    let stop = AtomicBool::new(false);
    run::train(&plan(small(1), &train_dir), &stop).unwrap();
    let ckpt = checkpoint::path_in(&train_dir);
    let config =
        RunConfig { policy_checkpoint: Some(ckpt.clone()), eval: true, deterministic: true, ..small(1) };
    let summary = run::train(&plan(config.clone(), &eval_dir), &stop).unwrap();
    assert_eq!((summary.rounds_completed, summary.policy_updates), (1, 0));
    assert!(!checkpoint::path_in(&eval_dir).exists(), "eval writes no checkpoint");
    let text = std::fs::read_to_string(eval_dir.join("metrics.jsonl")).unwrap();
    let round: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] == "round")
        .collect();
    assert_eq!(round.len(), 1);
    assert!(round[0]["update"].is_null());
    // A checkpoint of another shape is refused with a clear error.
    let wrong = RunConfig { policy_hidden: 64, ..config };
    let err = run::train(&plan(wrong, &scratch("eval-wrong")), &stop).unwrap_err().to_string();
    assert!(err.contains("shape") && err.contains("--policy-hidden"), "{err}");
    for d in [train_dir, eval_dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// Learning on a configuration that fits in CI: with a fixed seed the PPO policy's mean episode
/// return over its last rounds is above its first rounds' and above the random policy's over the same
/// rounds (the shaped reward; both runs see the same hosts and data).
#[test]
fn ppo_learns_to_beat_its_start_and_random() {
    const ROUNDS: usize = 30;
    const WINDOW: usize = 6;
    let config =
        RunConfig { envs: 4, epochs: 8, rounds: ROUNDS, ppo_lr: 3e-3, policy_hidden: 64, ..small(ROUNDS) };
    let stop = AtomicBool::new(false);
    let (ppo_dir, random_dir) = (scratch("learn-ppo"), scratch("learn-random"));
    let ppo = run::train(&plan(config.clone(), &ppo_dir), &stop).unwrap();
    let random =
        run::train(&plan(RunConfig { policy: PolicyKind::Random, ..config }, &random_dir), &stop).unwrap();
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    let r = &ppo.mean_episode_return;
    assert_eq!(r.len(), ROUNDS);
    let (first, last) = (mean(&r[..WINDOW]), mean(&r[ROUNDS - WINDOW..]));
    let random_mean = mean(&random.mean_episode_return);
    let random_last = mean(&random.mean_episode_return[ROUNDS - WINDOW..]);
    eprintln!(
        "ppo returns {r:.2?}\nfirst {first:.3} last {last:.3} random {random_mean:.3} (last {random_last:.3})"
    );
    assert!(last > first, "PPO's last {WINDOW} rounds {last:.3} vs its first {first:.3}");
    assert!(
        last > random_last && last > random_mean,
        "PPO {last:.3} vs random {random_last:.3} / {random_mean:.3}"
    );
    for d in [ppo_dir, random_dir] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--resume` through the binary: it continues with a larger `--rounds` (one more round line), and
/// refuses a `--rounds` the checkpoint already holds, or a file that is no checkpoint, with exit 2
/// before creating the run's folder.
#[test]
fn the_binary_resumes_and_refuses_what_it_cannot_continue() {
    let dir = scratch("cli-resume");
    std::fs::write(
        dir.join("c.toml"),
        "envs = 2\nepochs = 3\nsynthetic_train_per_env = 32\nsynthetic_test_per_env = 16\nbatch_per_env = 16\npolicy_hidden = 32\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_esper-ecs"))
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap()
    };
    let first = run(&["train", "--config", "c.toml", "--rounds", "1", "--out", "a", "--quiet"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let resumed =
        run(&["train", "--resume", "a/checkpoint.safetensors", "--rounds", "2", "--out", "b", "--quiet"]);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let lines = std::fs::read_to_string(dir.join("b/metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().filter(|l| l.contains("\"kind\":\"round\"")).count(), 1);
    assert_eq!(checkpoint::load(&dir.join("b/checkpoint.safetensors")).unwrap().header.next_round, 2);

    let held = run(&["train", "--resume", "a/checkpoint.safetensors", "--out", "c", "--quiet"]);
    assert_eq!(held.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&held.stderr).contains("already holds 1 rounds"));
    std::fs::write(dir.join("junk.safetensors"), "junk").unwrap();
    let junk = run(&["train", "--resume", "junk.safetensors", "--rounds", "2", "--out", "c", "--quiet"]);
    assert_eq!(junk.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&junk.stderr).contains("not an esper-ecs checkpoint"));
    assert!(!dir.join("c").exists(), "nothing is created for a refused resume");
    // The device may change on a resume (it is checked like any --device); the config may not.
    let args = ["train", "--resume", "a/checkpoint.safetensors", "--rounds", "2", "--out", "c", "--quiet"];
    let device = run(&[&args[..], &["--device", "tpu"]].concat());
    assert_eq!(device.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&device.stderr).contains("unknown device 'tpu'"));
    // So may the GPU's precision (checked like any: on the CPU only f32).
    let precision = run(&[&args[..], &["--precision", "bf16"]].concat());
    assert_eq!(precision.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&precision.stderr).contains("--precision (precision): bf16 is how a GPU")
    );
    let seed = run(&[&args[..], &["--seed", "5"]].concat());
    assert_eq!(seed.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&seed.stderr)
            .contains("--trace, --device, --precision, --cuda-graphs, --quiet, --count-syncs and --profile")
    );
    assert!(!dir.join("c").exists(), "nothing is created for a refused resume");
    std::fs::remove_dir_all(dir).unwrap();
}

/// simic §1.4.3 as the reference runs it: an update whose every epoch the finiteness gate skipped
/// counts as a failure, and the third stops the run with an error, after that round's lines
/// are written. NaN weights make every output non-finite.
#[test]
fn three_updates_skipped_for_non_finite_values_stop_the_run() {
    let dir = scratch("nonfinite");
    let config = RunConfig { ppo_epochs: 2, ..small(5) };
    let plan = plan(config, &dir);
    let session = run::Session::new(&plan).unwrap();
    {
        let learner = session.world.resource::<esper_systems::learner::Learner>();
        for var in learner.agent.net.vars() {
            var.set(&(var.as_tensor() * f64::NAN).unwrap()).unwrap();
        }
    }
    let stop = AtomicBool::new(false);
    let err = run::train_session(session, &plan, &stop, std::time::Instant::now()).unwrap_err();
    assert!(err.to_string().contains("3 updates were skipped"), "{err}");

    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let rounds: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "round")
        .collect();
    assert_eq!(rounds.len(), 3, "the run stops after the third round");
    for r in &rounds {
        assert_eq!(
            (r["update"]["epochs_run"].as_u64(), r["update"]["nonfinite_skips"].as_u64()),
            (Some(0), Some(2))
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
