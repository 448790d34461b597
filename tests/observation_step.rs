//! The observation in the training step: what `--log-observations` writes agrees with the rest of each
//! `metrics.jsonl` line (checked from the spec's formulas, outside the program); the policy receives
//! exactly the normalised observation and the blueprint indices of [`ObsBatch`]; the normaliser stays
//! frozen during a round and takes one EMA step from the round's raw observations when it completes,
//! and the next round keeps the statistics.

use bevy_ecs::prelude::*;
use esper_components::{ActionMasks, LifecycleOp, LifecycleTally, SeedStage};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run::{self, Session};
use esper_systems::build_observations::ObsBatch;
use esper_systems::normalize_observations::ObsNormalization;
use esper_systems::policy::{ActivePolicy, Observations, Policy, RandomPolicy};
use esper_systems::record_train_metrics::record_train_metrics;
use esper_systems::{ActionBatch, StepSet};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::common;
use common::{ValidationFault, env_row, inject_validation_fault};

fn plan(name: &str, rounds: usize, epochs: usize) -> RunPlan {
    let out = std::env::temp_dir().join(format!("esper-observation-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig {
        envs: 2,
        rounds,
        epochs,
        policy: PolicyKind::Random,
        batch_per_env: 16,
        synthetic_train_per_env: 64,
        synthetic_test_per_env: 32,
        log_observations: true,
        ..RunConfig::default()
    };
    config.plan_in(out, true).expect("a valid tiny config")
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// The index of a stage name in the observation's one-hot (tamiyo §1.2's map, stage 5 skipped).
fn one_hot_index(stage: &str) -> usize {
    let order = [
        "UNKNOWN",
        "DORMANT",
        "GERMINATED",
        "TRAINING",
        "BLENDING",
        "HOLDING",
        "FOSSILIZED",
        "PRUNED",
        "EMBARGOED",
        "RESETTING",
    ];
    order.iter().position(|s| *s == stage).unwrap_or_else(|| panic!("stage {stage}"))
}

#[test]
fn logged_observations_agree_with_their_metrics_lines() {
    let (rounds, epochs) = (2, 3);
    let plan = plan("log", rounds, epochs);
    run::train(&plan, &AtomicBool::new(false)).unwrap();
    let text = std::fs::read_to_string(plan.out_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), 2 * rounds * epochs);
    let by_key: HashMap<(u64, u64, u64), &serde_json::Value> = lines
        .iter()
        .map(|l| {
            ((l["round"].as_u64().unwrap(), l["env"].as_u64().unwrap(), l["epoch"].as_u64().unwrap()), l)
        })
        .collect();
    assert_eq!(SeedStage::ALL.len(), 10);
    let e_len = epochs as f64;
    let mut seen_seed = 0;
    for line in &lines {
        let (round, env, epoch) =
            (line["round"].as_u64().unwrap(), line["env"].as_u64().unwrap(), line["epoch"].as_u64().unwrap());
        let obs = f64s(&line["observation"]);
        let indices: Vec<i64> =
            line["blueprint_indices"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
        assert_eq!(obs.len(), 23 + 31 * 3, "Obs V3 for 3 slots");
        assert_eq!(indices.len(), 3);
        close(obs[0], epoch as f64 / e_len, "epoch feature");
        let loss = line["val_loss"].as_f64().unwrap();
        close(obs[1], loss.signum() * loss.abs().ln_1p() / 7.0, "symlog(val_loss)/7");
        close(obs[2], line["val_acc"].as_f64().unwrap() / 100.0, "val_acc/100");
        close(obs[7], obs[1], "newest loss history value is this epoch's");
        close(obs[12], obs[2], "newest accuracy history value is this epoch's");
        // Missing history positions are −1: epoch t holds t values.
        let missing = 5usize.saturating_sub(epoch as usize);
        assert!(obs[3..3 + missing].iter().chain(&obs[8..8 + missing]).all(|&v| v == -1.0), "epoch {epoch}");
        assert!(obs[3 + missing..8].iter().all(|&v| v != -1.0));
        // The previous step's action and the slots as its line left them (the observation is built
        // before this step's action).
        let op_hot = &obs[17..23];
        assert_eq!(op_hot.iter().filter(|&&v| v == 1.0).count(), 1);
        assert_eq!(op_hot.iter().sum::<f64>(), 1.0);
        let hot = op_hot.iter().position(|&v| v == 1.0).unwrap();
        match by_key.get(&(round, env, epoch - 1)) {
            None => {
                assert_eq!(
                    (hot, obs[16]),
                    (LifecycleOp::Wait as usize, 1.0),
                    "a new episode: (WAIT, success)"
                );
                assert!(indices.iter().all(|&i| i == -1), "a new episode has empty slots");
            }
            Some(prev) => {
                let expected = if prev["outcome"] == "rolled_back" {
                    "WAIT"
                } else {
                    prev["sampled_op"].as_str().unwrap()
                };
                assert_eq!(LifecycleOp::ALL[hot].name(), expected, "last op one-hot");
                let stages: Vec<&str> =
                    prev["stages"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
                let alphas = f64s(&prev["alphas"]);
                for (k, stage) in stages.iter().enumerate() {
                    let block = &obs[23 + 31 * k..23 + 31 * (k + 1)];
                    if *stage == "DORMANT" {
                        assert!(block.iter().all(|&v| v == 0.0), "empty slot {k} is all zeros");
                        assert_eq!(indices[k], -1);
                    } else {
                        seen_seed += 1;
                        assert_eq!(block[0], 1.0);
                        assert_eq!(block[1 + one_hot_index(stage)], 1.0, "{stage}");
                        assert_eq!(block[1..11].iter().sum::<f64>(), 1.0);
                        close(block[11], alphas[k], "alpha");
                        assert!((0..13).contains(&indices[k]), "blueprint index {}", indices[k]);
                    }
                }
                let count = |names: &[&str]| stages.iter().filter(|s| names.contains(s)).count() as f64 / 3.0;
                close(obs[13], count(&["TRAINING"]), "#TRAINING / S");
                close(obs[14], count(&["BLENDING"]), "#BLENDING / S");
                close(obs[15], count(&["HOLDING", "FOSSILIZED"]), "#HOLDING+FOSSILIZED / S");
            }
        }
    }
    assert!(seen_seed > 0, "the random policy germinated something to look at");
}

/// What the policy was given at one step: features, blueprint indices, features per env.
type Given = (Vec<f32>, Vec<i64>, usize);

/// Records what the policy was given, then decides like the random policy.
struct Probe {
    seen: Arc<Mutex<Vec<Given>>>,
}

impl Policy for Probe {
    fn decide(&mut self, obs: &Observations, masks: &[ActionMasks], actions: &mut ActionBatch) {
        self.seen.lock().unwrap().push((
            obs.features.to_vec(),
            obs.blueprint_indices.to_vec(),
            obs.obs_dim(),
        ));
        RandomPolicy.decide(obs, masks, actions);
    }
    fn reset(&mut self) {}
    fn name(&self) -> &'static str {
        "probe"
    }
}

#[test]
fn the_policy_reads_frozen_normalised_observations_and_the_round_end_updates_them() {
    let plan = plan("normaliser", 2, 3);
    let mut session = Session::new(&plan).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    session.world.insert_resource(ActivePolicy(Box::new(Probe { seen: seen.clone() })));
    let fresh = session.world.resource::<ObsNormalization>().normalizer.clone();
    assert_eq!(fresh.dim(), 116);

    session.start_round(0);
    let mut raw_rows: Vec<Vec<f32>> = Vec::new();
    for epoch in 1..=3 {
        session.run_epoch(epoch);
        let batch = session.world.resource::<ObsBatch>();
        let (features, indices, dim) = seen.lock().unwrap().last().cloned().unwrap();
        assert_eq!((dim, features.len(), indices.len()), (116, 2 * 116, 2 * 3));
        assert_eq!(features, batch.normalized, "the policy got this step's normalised observation");
        assert_eq!(indices, batch.blueprint_indices);
        // Frozen statistics = the fresh normaliser's: x / sqrt(1 + 1e-4), clipped.
        for (&x, &z) in batch.raw.iter().zip(&batch.normalized) {
            let want = (f64::from(x) / 1.0001f64.sqrt()).clamp(-10.0, 10.0) as f32;
            assert!((z - want).abs() <= 1e-6, "{x} → {z}");
        }
        raw_rows.extend(batch.raw.chunks(116).map(<[f32]>::to_vec));
        assert_eq!(session.world.resource::<ObsNormalization>().normalizer, fresh, "frozen during the round");
    }
    session.finish_round();
    let after = session.world.resource::<ObsNormalization>().normalizer.clone();
    assert_eq!(raw_rows.len(), 6);
    close(after.count, 1e-4 + 6.0, "count");
    // One EMA step from the batch moments of the round's six rows, computed here in two passes.
    for j in 0..116 {
        let xs: Vec<f64> = raw_rows.iter().map(|r| f64::from(r[j])).collect();
        let m = xs.iter().sum::<f64>() / 6.0;
        let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / 6.0;
        close(after.mean[j], 0.01 * m, &format!("mean[{j}]"));
        close(after.var[j], 0.99 + 0.01 * v + 0.99 * 0.01 * m * m, &format!("var[{j}]"));
    }
    // The next round starts from the updated statistics (an episode reset does not touch them).
    session.start_round(1);
    session.run_epoch(1);
    assert_eq!(session.world.resource::<ObsNormalization>().normalizer, after);
    let batch = session.world.resource::<ObsBatch>();
    for (j, (&x, &z)) in batch.raw.iter().zip(&batch.normalized).enumerate() {
        let d = j % 116;
        let want = ((f64::from(x) - after.mean[d]) / (after.var[d] + 1e-4).sqrt()).clamp(-10.0, 10.0) as f32;
        assert!((z - want).abs() <= 1e-5, "feature {d}: {x} → {z}, want {want}");
    }
}

/// A rolled-back env's observation still enters the round's statistics (simic §1.3 C.6 appends every
/// env's observation before the rollback branch), and its NaN validation loss reaches the raw features
/// (`symlog(NaN)`) but neither the policy (it normalises to 0) nor the statistics (that feature's
/// moments leave it out).
#[test]
fn a_rolled_back_envs_observation_counts_and_its_nan_stays_out_of_the_statistics() {
    let plan = plan("rollback", 1, 3);
    let mut session = Session::with_systems(&plan, |schedule| {
        schedule.add_systems(inject_validation_fault.after(record_train_metrics).in_set(StepSet::Validate));
    })
    .unwrap();
    session.world.insert_resource(ValidationFault {
        epoch: 2,
        env: 1,
        val_loss: Some(f64::NAN),
        val_accuracy: None,
    });
    session.start_round(0);
    let mut raw_rows: Vec<Vec<f32>> = Vec::new();
    for epoch in 1..=3 {
        session.run_epoch(epoch);
        let batch = session.world.resource::<ObsBatch>();
        if epoch == 2 {
            assert!(
                batch.raw_row(1)[1].is_nan() && batch.raw_row(1)[7].is_nan(),
                "NaN loss in the raw features"
            );
            assert_eq!(batch.normalized_row(1)[1], 0.0, "the policy sees 0 for it");
            assert!(batch.raw_row(0)[1].is_finite());
        }
        raw_rows.extend(batch.raw.chunks(116).map(<[f32]>::to_vec));
    }
    let outcome = session.world.resource::<esper_systems::OpOutcomes>().0.clone();
    assert_eq!(session.world.resource::<ObsNormalization>().round.rows, 6, "every env, every step");
    let rolled_back = env_row(&mut session.world, 1, |t: &LifecycleTally| t.rollbacks);
    assert_eq!(rolled_back, 1, "env 1 rolled back once ({outcome:?})");
    session.finish_round();
    let norm = session.world.resource::<ObsNormalization>().normalizer.clone();
    for j in [0usize, 1, 2] {
        let xs: Vec<f64> = raw_rows.iter().map(|r| f64::from(r[j])).filter(|x| x.is_finite()).collect();
        assert_eq!(xs.len(), if j == 1 { 5 } else { 6 }, "feature {j}");
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        close(norm.mean[j], 0.01 * m, &format!("mean[{j}]"));
    }
}

/// A one-round session of `epochs` whose policy always WAITs, its round started.
fn waiting_session(name: &str, epochs: usize) -> Session {
    let mut s = Session::new(&plan(name, 1, epochs)).unwrap();
    s.world.insert_resource(ActivePolicy(Box::new(common::Script(vec![]))));
    s.start_round(0);
    s
}

/// tamiyo §1.3's freshness quirk, kept: a seed that is never ablated (TRAINING at alpha 0) reads the
/// sentinel −1 at its first decision, its "epochs since counterfactual" is created at 0 by that step's
/// bookkeeping (D.7), so it reads 0.995^0 = 1.0 at the next decision and 0.995, 0.990 after that.
#[test]
fn a_never_ablated_seed_reads_the_sentinel_then_a_fresh_counterfactual() {
    let mut s = waiting_session("freshness", 5);
    common::force_seed(
        &mut s.world,
        0,
        0,
        SeedStage::Training,
        esper_components::BlueprintAction::ConvLight,
        0.0,
    );
    let mut freshness = Vec::new();
    for epoch in 1..=4 {
        s.run_epoch(epoch);
        let inputs = &s.world.resource::<ObsBatch>().inputs;
        assert_eq!(inputs.contribution[0], None, "epoch {epoch}: a TRAINING seed is never ablated");
        let raw = &s.world.resource::<ObsBatch>().raw;
        freshness.push(raw[23 + 29]);
    }
    assert_eq!(freshness, [-1.0, 1.0, 0.995, (0.995f64 * 0.995) as f32]);
}

/// The reference resets a slot's interaction terms at validation only where a seed module is in the
/// slot (`has_active_seed_in_slot`): a slot in cooldown keeps its last pass's terms, and its observation
/// shows them (feature 22, `clamp(interaction_sum / 10)`) until the slot empties; a live seed's are
/// reset (and, not ablated here, stay 0).
#[test]
fn a_slot_in_cooldown_keeps_its_interaction_terms_through_validation() {
    let mut s = waiting_session("cooldown-interactions", 3);
    let bp = esper_components::BlueprintAction::ConvLight;
    common::force_seed(&mut s.world, 0, 0, SeedStage::Embargoed, bp, 0.0);
    common::force_seed(&mut s.world, 0, 1, SeedStage::Training, bp, 0.0);
    let mut q = s.world.query::<(
        &esper_components::EnvIndex,
        &esper_components::SlotIndex,
        &mut esper_components::SeedMetrics,
    )>();
    for (env, _, mut m) in q.iter_mut(&mut s.world) {
        if env.0 == 0 {
            (m.interaction_sum, m.boost_received) = (3.0, 1.5);
        }
    }
    s.run_epoch(1);
    let metrics: Vec<(u8, f64, f64)> = q
        .iter(&s.world)
        .filter(|(env, ..)| env.0 == 0)
        .map(|(_, slot, m)| (slot.0, m.interaction_sum, m.boost_received))
        .collect();
    assert!(metrics.contains(&(0, 3.0, 1.5)), "the EMBARGOED slot keeps them: {metrics:?}");
    assert!(metrics.contains(&(1, 0.0, 0.0)), "the TRAINING seed's are reset: {metrics:?}");
    let raw = &s.world.resource::<ObsBatch>().raw;
    assert_eq!((raw[23 + 22], raw[23 + 31 + 22]), (0.3, 0.0));
}
