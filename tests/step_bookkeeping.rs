//! The step's bookkeeping through the real training schedule (simic §1.3 D, tamiyo §1.3, §6.4–6.7):
//! sampled vs effective op vs outcome, the governor's veto, rollback as the reference does it, the
//! auto-prune penalty, the fossil counters and the metrics lines.
//!
//! Faults are injected by test systems placed between the stages (`Session::with_systems`), so every
//! other system runs as in a real run.

use bevy_ecs::prelude::*;
use esper_components::governor::GovernorState;
use esper_components::{
    BlueprintAction, EnvIndex, FossilCounters, HostMetrics, LastAction, LifecycleOp, LifecycleTally,
    OpOutcome, PendingRewardTerms, ScaffoldBoost, ScaffoldLedger, SeedStage, SlotEvents, SlotTracking,
};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run::{self, Session};
use esper_kernels::host::SeedBank;
use esper_kernels::seeds::CnnBlueprint;
use esper_systems::host_resources::Hosts;
use esper_systems::policy::ActivePolicy;
use esper_systems::record_train_metrics::record_train_metrics;
use esper_systems::{ActionBatch, EffectiveOps, OpOutcomes, StepSet};
use std::sync::atomic::AtomicBool;

use crate::common;
use common::{
    Script, ValidationFault, env_row, force_seed, germinate, inject_validation_fault, op, slot_component,
    slot_state,
};

const ENVS: usize = 2;
const VICTIM: usize = 0;

fn plan(name: &str, epochs: usize) -> RunPlan {
    let out = std::env::temp_dir().join(format!("esper-bookkeeping-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig {
        envs: ENVS,
        epochs,
        policy: PolicyKind::Random,
        batch_per_env: 16,
        synthetic_train_per_env: 64,
        synthetic_test_per_env: 32,
        ..RunConfig::default()
    };
    config.plan_in(out, true).expect("a valid tiny config")
}

/// Every env's seed bank and the victim's scaffold ledger just before Act (after training and
/// validation): "no other row written", and the ledger a FOSSILIZE settles.
#[derive(Resource, Default)]
struct BeforeAct {
    bank: Option<SeedBank<f32>>,
    ledger: Vec<ScaffoldBoost>,
}

fn capture_before_act(
    hosts: Res<Hosts>,
    envs: Query<(&EnvIndex, &ScaffoldLedger)>,
    mut held: ResMut<BeforeAct>,
) {
    held.bank = Some(hosts.as_cpu().unwrap().bank.clone());
    let victim = envs.iter().find(|(e, _)| e.0 as usize == VICTIM).unwrap();
    held.ledger = victim.1.entries.clone();
}

fn session(plan: &RunPlan, script: Script) -> Session {
    let mut session = Session::with_systems(plan, |schedule| {
        schedule.add_systems((
            inject_validation_fault.after(record_train_metrics).in_set(StepSet::Validate),
            capture_before_act.in_set(StepSet::Reward),
        ));
    })
    .unwrap();
    session.world.insert_resource(BeforeAct::default());
    session.world.insert_resource(ActivePolicy(Box::new(script)));
    session.start_round(0);
    session
}

fn row(bank: &SeedBank<f32>, slot: usize, bp: CnnBlueprint, env: usize) -> Vec<f32> {
    bank.slots().nth(slot).unwrap().pool(bp).row(env).to_vec()
}

#[test]
fn vetoed_germinate_keeps_the_raw_op_executes_nothing_and_counts_as_wait() {
    let plan = plan("veto", 3);
    // Epoch 2: both envs germinate conv_light into slot 0; the victim's validation accuracy is NaN (its
    // loss stays finite, so the governor does not panic) and the preflight vetoes its mutation.
    let script = Script(vec![
        (2, 0, germinate(0, BlueprintAction::ConvLight)),
        (2, 1, germinate(0, BlueprintAction::ConvLight)),
    ]);
    let mut s = session(&plan, script);
    s.world.insert_resource(ValidationFault {
        epoch: 2,
        env: VICTIM,
        val_loss: None,
        val_accuracy: Some(f64::NAN),
    });
    s.run_epoch(1);
    s.run_epoch(2);
    let w = &mut s.world;
    // The sampled action is kept as sampled.
    assert_eq!(w.resource::<ActionBatch>().get(VICTIM), germinate(0, BlueprintAction::ConvLight));
    assert_eq!(w.resource::<OpOutcomes>().0, vec![OpOutcome::Vetoed, OpOutcome::Executed]);
    assert_eq!(w.resource::<EffectiveOps>().0, vec![LifecycleOp::Wait, LifecycleOp::Germinate]);
    assert_eq!(
        env_row(w, VICTIM, |l: &LastAction| *l),
        LastAction { op: LifecycleOp::Germinate, success: false }
    );
    assert_eq!(env_row(w, 1, |l: &LastAction| *l), LastAction { op: LifecycleOp::Germinate, success: true });
    // Nothing executed for the victim; the other env's germination went through.
    assert_eq!(slot_state(w, VICTIM, 0).stage.current, SeedStage::Dormant);
    assert!(!slot_component::<SlotEvents>(w, VICTIM, 0).germinated);
    assert_eq!(slot_state(w, 1, 0).stage.current, SeedStage::Germinated);
    let tally = env_row(w, VICTIM, |t: &LifecycleTally| *t);
    assert_eq!((tally.vetoed, tally.germinated, tally.failed_ops), (1, 0, 0));
    // The germinated env recorded its germination accuracy and the parameter counts.
    let acc = env_row(w, 1, |m: &HostMetrics| m.val_accuracy);
    assert_eq!(slot_component::<SlotTracking>(w, 1, 0).acc_at_germination, Some(acc));
    let metrics = slot_state(w, 1, 0).metrics;
    let counts = w.resource::<Hosts>().param_counts();
    assert_eq!(metrics.host_param_count, w.resource::<Hosts>().arch().param_count() as u64);
    assert_eq!(
        metrics.seed_param_count,
        esper_kernels::seeds::param_count(
            CnnBlueprint::ConvLight,
            w.resource::<Hosts>().as_cpu().unwrap().bank.slots().next().unwrap().channels
        ) as u64
    );
    assert_eq!(metrics.gate_param_count, counts.gate[0]);
    assert!(metrics.host_param_count > 0 && metrics.seed_param_count > 0 && metrics.gate_param_count > 0);
}

/// A seed fossilized at t and a NaN validation loss at t + 1 (tamiyo §6.4–6.7): the host returns to the
/// snapshot, the fossil the snapshot holds gets its weights and state back, the fossil made after the
/// snapshot keeps its stage and weights, the live seed is pruned, and no other seed row is written.
#[test]
fn rollback_restores_the_host_and_the_snapshot_fossils_only() {
    let plan = plan("rollback", 9);
    let (fossil_t, nan_t) = (6u64, 7u64);
    let script = Script(vec![(fossil_t, VICTIM, op(LifecycleOp::Fossilize, 1))]);
    let mut s = session(&plan, script);
    // The victim holds a fossil (slot 0), a HOLDING seed to fossilize at t (slot 1), a live BLENDING
    // seed (slot 2). The other env holds the same live seed.
    force_seed(&mut s.world, VICTIM, 0, SeedStage::Fossilized, BlueprintAction::ConvLight, 1.0);
    // At alpha 0.7 the HOLDING seed lets gradient through to the fossil upstream of it (at alpha 1 a
    // CNN seed's isolation cuts everything upstream off, kasmina §8.2 b).
    force_seed(&mut s.world, VICTIM, 1, SeedStage::Holding, BlueprintAction::Attention, 0.7);
    force_seed(&mut s.world, VICTIM, 2, SeedStage::Blending, BlueprintAction::ConvHeavy, 0.5);
    force_seed(&mut s.world, 1, 2, SeedStage::Blending, BlueprintAction::ConvHeavy, 0.5);
    s.world.insert_resource(ValidationFault {
        epoch: nan_t,
        env: VICTIM,
        val_loss: Some(f64::NAN),
        val_accuracy: None,
    });
    for epoch in 1..=4 {
        s.run_epoch(epoch);
    }
    // Epoch 5's healthy check (Observe, before that epoch's record_accuracy) takes the snapshot: the
    // fossil's state then is its state at the end of epoch 4.
    let snap_fossil_state = slot_state(&mut s.world, VICTIM, 0);
    s.run_epoch(5);
    // The snapshot holds the host and the slot-0 fossil, nothing else.
    {
        let snaps = &s.world.resource::<Hosts>().as_cpu().unwrap().snapshots;
        let held: Vec<bool> = snaps.env_fossils(VICTIM).iter().map(Option::is_some).collect();
        assert_eq!(held, vec![true, false, false]);
    }
    s.run_epoch(fossil_t);
    assert_eq!(s.world.resource::<OpOutcomes>().0[VICTIM], OpOutcome::Executed, "FOSSILIZE passed G5");
    assert_eq!(slot_state(&mut s.world, VICTIM, 1).stage.current, SeedStage::Fossilized);
    assert_eq!(env_row(&mut s.world, VICTIM, |c: &FossilCounters| c.fossilized), 1);
    let fossil_1_state_before = slot_state(&mut s.world, VICTIM, 1);

    s.run_epoch(nan_t);
    let w = &mut s.world;
    assert_eq!(w.resource::<OpOutcomes>().0, vec![OpOutcome::RolledBack, OpOutcome::Executed]);
    assert_eq!(w.resource::<EffectiveOps>().0[VICTIM], LifecycleOp::Wait);
    assert_eq!(env_row(w, VICTIM, |l: &LastAction| *l), LastAction { op: LifecycleOp::Wait, success: false });
    let before = w.resource::<BeforeAct>().bank.clone().unwrap();
    let hosts = w.resource::<Hosts>().as_cpu().unwrap();
    let snaps = &hosts.snapshots;
    assert_eq!(hosts.params.extract_env(VICTIM), snaps.params.extract_env(VICTIM), "host restored");
    // Slot 0: the snapshot's fossil row is back, and differs from what training had made of it.
    let restored = row(&hosts.bank, 0, CnnBlueprint::ConvLight, VICTIM);
    assert_eq!(&restored[..], snaps.seed_row(VICTIM, 0, &hosts.bank).unwrap());
    assert_ne!(restored, row(&before, 0, CnnBlueprint::ConvLight, VICTIM), "fossils keep training (§8.2 d)");
    // Every other row of every env, every pool, every slot and the gates: as before Act.
    for (k, (now, then)) in hosts.bank.slots().zip(before.slots()).enumerate() {
        for bp in CnnBlueprint::ALL {
            for e in 0..ENVS {
                if (k, bp, e) != (0, CnnBlueprint::ConvLight, VICTIM) {
                    assert_eq!(now.pool(bp).row(e), then.pool(bp).row(e), "slot {k} {bp:?} env {e} written");
                }
            }
        }
        assert_eq!(now.gate.params, then.gate.params, "slot {k} gate written");
    }
    // Optimizer state cleared for the victim only.
    assert!(hosts.trainer.momentum.tensors.iter().all(|t| t[..t.len() / ENVS].iter().all(|&v| v == 0.0)));
    assert!(hosts.trainer.momentum.tensors.iter().any(|t| t[t.len() / ENVS..].iter().any(|&v| v != 0.0)));
    // Stages: the snapshot fossil is back at its snapshot-time state, the later fossil untouched, the
    // live seed pruned by the governor (and not ticked this step: the rollback ends the transaction).
    assert_eq!(slot_state(w, VICTIM, 0), snap_fossil_state, "fossil state reverted to the snapshot");
    assert_eq!(slot_state(w, VICTIM, 1).stage.current, SeedStage::Fossilized);
    assert_eq!(
        slot_state(w, VICTIM, 1).counters.epochs_total,
        fossil_1_state_before.counters.epochs_total + 1
    );
    let pruned = slot_state(w, VICTIM, 2);
    assert_eq!(pruned.stage.current, SeedStage::Pruned);
    assert!(pruned.metrics.auto_pruned.is_some(), "read only at the env's next tick");
    assert_eq!(slot_state(w, 1, 2).stage.current, SeedStage::Blending, "the other env keeps its seed");
    let tally = env_row(w, VICTIM, |t: &LifecycleTally| *t);
    assert_eq!((tally.rollbacks, tally.pruned), (1, 1));
    assert_eq!(env_row(w, VICTIM, |p: &PendingRewardTerms| p.auto_prune_penalty), 0.0);
    let governor = env_row(w, VICTIM, |g: &GovernorState| *g);
    assert_eq!(governor.panic_reason, None, "the rollback reset the panic state");

    // Next step: healthy. The tick moves the pruned seed on and turns its flag into the penalty.
    s.run_epoch(nan_t + 1);
    let w = &mut s.world;
    assert_eq!(w.resource::<OpOutcomes>().0[VICTIM], OpOutcome::Executed);
    assert_eq!(env_row(w, VICTIM, |l: &LastAction| *l), LastAction { op: LifecycleOp::Wait, success: true });
    assert_eq!(slot_state(w, VICTIM, 2).stage.current, SeedStage::Embargoed);
    assert_eq!(slot_state(w, VICTIM, 2).metrics.auto_pruned, None);
    assert_eq!(env_row(w, VICTIM, |p: &PendingRewardTerms| p.auto_prune_penalty), -0.2);
    assert_eq!(env_row(w, 1, |p: &PendingRewardTerms| p.auto_prune_penalty), 0.0);
}

/// A NaN host from the first epoch through `train`: the governor rolls the env back and prunes its live
/// seed, and the run's summary and metrics show it.
#[test]
fn governor_prunes_reach_the_summary_and_the_metrics() {
    let plan = plan("summary", 2);
    let mut s = Session::new(&plan).unwrap();
    s.world.insert_resource(ActivePolicy(Box::new(Script(Vec::new()))));
    force_seed(&mut s.world, VICTIM, 1, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    s.world.resource_mut::<Hosts>().as_cpu_mut().unwrap().params.weights.env_mut(0, VICTIM)[0] = f32::NAN;
    let summary = run::train_session(s, &plan, &AtomicBool::new(false), std::time::Instant::now()).unwrap();
    assert_eq!((summary.rollbacks, summary.seeds_pruned, summary.seeds_germinated), (1, 1, 0));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan.out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["seeds_pruned"], 1);
    assert_eq!(json["rollbacks"], 1);
    let text = std::fs::read_to_string(plan.out_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), ENVS * 2);
    let first = &lines[VICTIM];
    assert_eq!((first["epoch"].as_u64(), first["env"].as_u64()), (Some(1), Some(VICTIM as u64)));
    assert_eq!(first["outcome"], "rolled_back");
    assert_eq!((first["sampled_op"].as_str(), first["effective_op"].as_str()), (Some("WAIT"), Some("WAIT")));
    assert_eq!(first["stages"][1], "PRUNED");
    assert_eq!(lines[1]["outcome"], "executed");
}

/// The fossil counters and the scaffold ledger's hindsight credit at a successful FOSSILIZE (simic
/// §2.9 step 4), through the real step: three live seeds measured in pairs until the ledger holds a
/// boost of a HOLDING seed, then that seed fossilizes.
#[test]
fn fossilize_counts_the_fossil_and_settles_its_scaffold_credit() {
    let mut plan = plan("ledger", 6);
    if let esper_kernels::data::DataSource::Synthetic(spec) = &mut plan.data {
        spec.n_test = ENVS * 256; // finer accuracies, so that pair interactions are not all 0
    }
    let mut s = session(&plan, Script(Vec::new()));
    force_seed(&mut s.world, VICTIM, 0, SeedStage::Holding, BlueprintAction::ConvLight, 1.0);
    force_seed(&mut s.world, VICTIM, 1, SeedStage::Holding, BlueprintAction::Attention, 0.7);
    force_seed(&mut s.world, VICTIM, 2, SeedStage::Blending, BlueprintAction::ConvHeavy, 0.5);
    for epoch in 1..=4 {
        s.run_epoch(epoch);
    }
    // Three ablated seeds: pair interactions are measured; the positive ones are in the ledger, in both
    // directions.
    let ledger = s.world.resource::<BeforeAct>().ledger.clone();
    assert!(!ledger.is_empty(), "a positive pair interaction by epoch 4");
    assert_eq!(ledger.len() % 2, 0);
    assert!(
        ledger.iter().all(|b| b.boost > 0.0 && b.scaffold != b.beneficiary && (1..=4).contains(&b.epoch))
    );
    // Every pair has slot 0 or 1 in it: fossilize a HOLDING seed that some scaffold boosted.
    let fossil_slot = ledger.iter().map(|b| b.beneficiary).find(|&b| b < 2).unwrap();
    let script = Script(vec![(5, VICTIM, op(LifecycleOp::Fossilize, fossil_slot))]);
    s.world.insert_resource(ActivePolicy(Box::new(script)));
    s.run_epoch(5);
    let w = &mut s.world;
    let ledger = w.resource::<BeforeAct>().ledger.clone();
    assert_eq!(w.resource::<OpOutcomes>().0[VICTIM], OpOutcome::Executed);
    let fossil = slot_state(w, VICTIM, fossil_slot);
    assert_eq!(fossil.stage.current, SeedStage::Fossilized);
    let counters = env_row(w, VICTIM, |c: &FossilCounters| *c);
    let improvement = fossil.metrics.total_improvement();
    assert_eq!(counters.fossilized, 1);
    assert_eq!(counters.contributing, u32::from(improvement >= 1.0));
    // The credit by the spec's formula, from the ledger as the FOSSILIZE found it.
    let mut expected = 0.0;
    if improvement > 0.0 {
        for b in ledger.iter().filter(|b| b.beneficiary == fossil_slot) {
            expected += 0.1 * (0.1 * b.boost * improvement).tanh() * 0.995f64.powi(5 - b.epoch as i32);
        }
    }
    let expected = f64::min(expected, 0.2);
    assert!(expected > 0.0, "the fossil improved and was boosted");
    let credit = env_row(w, VICTIM, |p: &PendingRewardTerms| p.hindsight_credit);
    assert!((credit - expected).abs() < 1e-12, "credit {credit} vs {expected}");
    let after = {
        let mut q = w.query::<(&EnvIndex, &ScaffoldLedger)>();
        q.iter(w).find(|(e, _)| e.0 as usize == VICTIM).unwrap().1.entries.clone()
    };
    let kept: Vec<ScaffoldBoost> = ledger.iter().copied().filter(|b| b.beneficiary != fossil_slot).collect();
    assert_eq!(after, kept, "exactly the fossil's boosts were settled");
    assert_eq!(slot_component::<SlotTracking>(w, VICTIM, fossil_slot).acc_at_germination, None);
}
