//! The reward through the real training schedule (simic §1.3 D.2–D.5, §2): which slot a WAIT looks at,
//! no reward for a rolled-back env, the pending penalty paid one step later, escrow credit and the
//! BASIC_PLUS drip carried on the slots between steps, and the metrics and summary a run writes.
//! Expected numbers are derived by hand from the spec; contributions are injected after Validate by a
//! test system so that they are known exactly.

use bevy_ecs::prelude::*;
use esper_components::{
    BlueprintAction, EnvIndex, EpisodeReturn, FactoredAction, HostMetrics, LifecycleOp, PendingRewardTerms,
    RewardConfig, RewardFamily, RewardMode, SeedMetrics, SeedStage, SlotFlags, SlotIndex, SlotRewardState,
    SlotTracking,
};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run::{self, Session};
use esper_kernels::reward::Term;
use esper_systems::compute_rewards::{RewardBatch, SharedRewardNormalizer};
use esper_systems::host_resources::{Hosts, StepClock};
use esper_systems::policy::ActivePolicy;
use esper_systems::record_train_metrics::record_train_metrics;
use esper_systems::{OpOutcomes, ParamCounts, StepSet};
use std::sync::atomic::AtomicBool;

use crate::common;
use common::{Script, ValidationFault, env_row, force_seed, inject_validation_fault, op, slot_component};

fn plan(name: &str, epochs: usize, mode: RewardMode) -> RunPlan {
    plan_of_family(name, epochs, mode, RewardFamily::Contribution)
}

fn plan_of_family(name: &str, epochs: usize, mode: RewardMode, family: RewardFamily) -> RunPlan {
    let out = std::env::temp_dir().join(format!("esper-reward-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig {
        envs: 2,
        epochs,
        policy: PolicyKind::Random,
        batch_per_env: 16,
        synthetic_train_per_env: 64,
        synthetic_test_per_env: 32,
        reward_mode: mode,
        reward_family: family,
        log_reward_inputs: true,
        ..RunConfig::default()
    };
    config.plan_in(out, true).expect("a valid tiny config")
}

/// Injected after Validate: env `env`'s slot `slot` measured contribution `c`, and the env's `cf_imp`.
#[derive(Resource, Clone, Copy)]
struct Measured {
    epoch: u64,
    env: usize,
    slot: u8,
    contribution: f64,
    cf_imp: f64,
}

fn inject_measurement(
    measured: Option<Res<Measured>>,
    clock: Res<StepClock>,
    mut slots: Query<(&EnvIndex, &SlotIndex, &mut SeedMetrics, &mut SlotTracking)>,
    mut envs: Query<(&EnvIndex, &mut HostMetrics)>,
) {
    let Some(m) = measured else { return };
    if clock.epoch != m.epoch {
        return;
    }
    for (env, index, mut metrics, mut tracking) in &mut slots {
        if env.0 as usize == m.env && index.0 == m.slot {
            metrics.counterfactual_contribution = Some(m.contribution);
            tracking.epochs_since_counterfactual = Some(0);
        }
    }
    for (env, mut host) in &mut envs {
        if env.0 as usize == m.env {
            host.counterfactual_improvement = Some(m.cf_imp);
        }
    }
}

fn session(plan: &RunPlan, script: Script) -> Session {
    let mut session = Session::with_systems(plan, |schedule| {
        schedule.add_systems(
            (inject_validation_fault, inject_measurement)
                .chain()
                .after(record_train_metrics)
                .in_set(StepSet::Validate),
        );
    })
    .unwrap();
    session.world.insert_resource(ActivePolicy(Box::new(script)));
    session.start_round(0);
    session
}

fn term(world: &World, term: Term, env: usize) -> f64 {
    world.resource::<RewardBatch>().outputs.term(term, env)
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-9 * (1.0 + want.abs()), "{what}: got {got}, want {want}");
}

#[test]
fn wait_looks_at_the_first_enabled_slot() {
    // Both envs hold only a BLENDING seed in slot 2. Env 0 samples WAIT with its slot head on 2, env 1
    // ADVANCE on slot 2. Reference quirk kept: WAIT canonicalises the slot head to the first enabled
    // slot, so env 0's reward looks at the empty slot 0 and pays no PBRS for the seed in slot 2.
    let plan = plan("wait", 3, RewardMode::Shaped);
    let wait_on_2 = FactoredAction { slot: 2, ..FactoredAction::wait() };
    let script = Script(vec![(1, 0, wait_on_2), (1, 1, op(LifecycleOp::Advance, 2))]);
    let mut s = session(&plan, script);
    for env in 0..2 {
        force_seed(&mut s.world, env, 2, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    }
    s.run_epoch(1);
    let batch = s.world.resource::<RewardBatch>();
    assert_eq!(batch.inputs.target_slot, vec![0, 2]);
    // The seed was forced 2 epochs into BLENDING and recorded once this epoch: e = 3, so PBRS =
    // 0.3·(γ·(3.5 + 0.9) − (3.5 + 0.6)) = 0.0834 for the env that looked at it.
    close(term(&s.world, Term::Pbrs, 0), 0.0, "WAIT: slot 0 has no seed");
    close(term(&s.world, Term::Pbrs, 1), 0.0834, "ADVANCE on slot 2");
    // Both envs pay the seed's rent: it is an env-wide term, whatever slot the reward looks at.
    close(term(&s.world, Term::Rent, 0), term(&s.world, Term::Rent, 1), "rent is env-wide");
    assert!(term(&s.world, Term::Rent, 0) < 0.0);
}

#[test]
fn a_rolled_back_env_gets_no_reward_and_pays_its_auto_prune_penalty_two_steps_later() {
    let plan = plan("rollback", 5, RewardMode::Shaped);
    let mut s = session(&plan, Script(Vec::new()));
    force_seed(&mut s.world, 0, 1, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    s.world.insert_resource(ValidationFault {
        epoch: 2,
        env: 0,
        val_loss: Some(f64::NAN),
        val_accuracy: None,
    });
    // A forced seed has no parameter count; germination would have recorded the run's.
    let seed_params = s.world.resource::<ParamCounts>().for_seed(1, BlueprintAction::ConvLight).1;
    assert!(seed_params > 0);
    s.world.query::<(&EnvIndex, &SlotIndex, &mut SeedMetrics)>().iter_mut(&mut s.world).for_each(
        |(env, index, mut m)| {
            if (env.0, index.0) == (0, 1) {
                m.seed_param_count = seed_params;
            }
        },
    );
    s.run_epoch(1);
    assert_eq!(s.world.resource::<SharedRewardNormalizer>().0.count, 2);
    // The reward kept the seed's alpha and parameter count for the next step's alpha shock.
    let kept = slot_component::<SlotRewardState>(&mut s.world, 0, 1);
    assert_eq!((kept.prev_alpha, kept.prev_params), (0.5, seed_params as f64));
    // Epoch 2: env 0 panics and rolls back; the governor prunes its seed.
    s.run_epoch(2);
    assert_eq!(
        slot_component::<SlotRewardState>(&mut s.world, 0, 1),
        kept,
        "a rollback writes no reward state"
    );
    assert!(s.world.resource::<OpOutcomes>().rolled_back(0));
    let batch = s.world.resource::<RewardBatch>();
    assert!(!batch.rewarded(0) && batch.rewarded(1));
    assert_eq!((batch.outputs.raw[0], batch.normalized[0]), (0.0, 0.0));
    assert_eq!(s.world.resource::<SharedRewardNormalizer>().0.count, 3, "one update: env 1's");
    // The episode's return as the buffer has it (simic §1.6): epoch 1's reward rewritten to the death
    // penalty, raw −10.
    close(env_row(&mut s.world, 0, |r: &EpisodeReturn| r.raw), -10.0, "return after the rollback");
    // Epoch 3: the tick that the rollback skipped reads the auto-prune flag: −0.2 pending.
    s.run_epoch(3);
    let raw_3 = s.world.resource::<RewardBatch>().outputs.raw[0];
    close(term(&s.world, Term::AutoPrunePenalty, 0), 0.0, "not yet paid");
    assert_eq!(env_row(&mut s.world, 0, |p: &PendingRewardTerms| p.auto_prune_penalty), -0.2);
    // Epoch 4: paid, and reset.
    s.run_epoch(4);
    close(term(&s.world, Term::AutoPrunePenalty, 0), -0.2, "paid");
    assert_eq!(env_row(&mut s.world, 0, |p: &PendingRewardTerms| p.auto_prune_penalty), 0.0);
    close(term(&s.world, Term::AutoPrunePenalty, 1), 0.0, "the other env never owed it");
    // Env 0 was rewarded on 3 of its 4 steps, env 1 on all 4; env 0's return is the penalty and the
    // two steps after it.
    let raw_4 = s.world.resource::<RewardBatch>().outputs.raw[0];
    close(env_row(&mut s.world, 0, |r: &EpisodeReturn| r.raw), -10.0 + raw_3 + raw_4, "return");
    assert_eq!(env_row(&mut s.world, 0, |r: &EpisodeReturn| r.steps), 3);
    assert_eq!(env_row(&mut s.world, 1, |r: &EpisodeReturn| r.steps), 4);
    assert_eq!(s.world.resource::<SharedRewardNormalizer>().0.count, 7);
}

#[test]
fn escrow_credit_is_kept_on_the_slot_and_repaid_by_a_prune() {
    let plan = plan("escrow", 4, RewardMode::Escrow);
    let germinate_0 = common::germinate(0, BlueprintAction::ConvSmall);
    let script = Script(vec![(2, 0, op(LifecycleOp::Prune, 0)), (1, 1, germinate_0)]);
    let mut s = session(&plan, script);
    // Env 1's empty slot 0 carries a stale credit: its germination (epoch 1) must zero it.
    s.world.query::<(&EnvIndex, &SlotIndex, &mut SlotRewardState)>().iter_mut(&mut s.world).for_each(
        |(env, index, mut state)| {
            if (env.0, index.0) == (1, 0) {
                state.escrow_credit = 1.0;
            }
        },
    );
    // In slot 0, which a WAIT looks at. A BLENDING seed 10 epochs old (old enough to prune), no germination accuracy (progress unknown).
    force_seed(&mut s.world, 0, 0, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    // Epoch 1: c = 4, cf_imp = 3: att = 0.5·c = 2, ρ = 4/3 (no penalty) → credit 0 → 2, paid 2.
    s.world.insert_resource(Measured { epoch: 1, env: 0, slot: 0, contribution: 4.0, cf_imp: 3.0 });
    s.run_epoch(1);
    close(term(&s.world, Term::Attribution, 0), 2.0, "credit paid");
    assert_eq!(slot_component::<SlotRewardState>(&mut s.world, 1, 0).escrow_credit, 0.0, "germination");
    close(slot_component::<SlotRewardState>(&mut s.world, 0, 0).escrow_credit, 2.0, "credit kept");
    // Epoch 2: PRUNE repays it (A = −2) and the credit is 0.
    s.world.insert_resource(Measured { epoch: 2, env: 0, slot: 0, contribution: 4.0, cf_imp: 3.0 });
    s.run_epoch(2);
    assert_eq!(s.world.resource::<esper_systems::EffectiveOps>().0[0], LifecycleOp::Prune);
    close(term(&s.world, Term::Attribution, 0), -2.0, "credit repaid");
    close(slot_component::<SlotRewardState>(&mut s.world, 0, 0).escrow_credit, 0.0, "credit gone");
}

#[test]
fn basic_plus_drips_from_a_successful_fossilization_and_keeps_fossils_ablated() {
    let plan = plan("drip", 4, RewardMode::BasicPlus);
    let script = Script(vec![(1, 0, op(LifecycleOp::Fossilize, 0))]);
    let mut s = session(&plan, script);
    force_seed(&mut s.world, 0, 0, SeedStage::Holding, BlueprintAction::ConvLight, 1.0);
    // Epoch 1 (of 4): HOLDING for e = 3 epochs (L = 0.6), c = 2, I = cf_imp 2 → harmonic 2,
    // full = (0.3 + 0.5·2)·0.6 = 0.78; 0.3·0.78 = 0.234 now, drip 0.7·0.78/max(4 − 1, 5) = 0.1092.
    s.world.insert_resource(Measured { epoch: 1, env: 0, slot: 0, contribution: 2.0, cf_imp: 2.0 });
    s.run_epoch(1);
    assert_eq!(s.world.resource::<OpOutcomes>().0[0], esper_components::OpOutcome::Executed);
    close(term(&s.world, Term::Fossilize, 0), 0.234, "immediate part");
    let state = slot_component::<SlotRewardState>(&mut s.world, 0, 0);
    close(state.drip_scale.expect("kept after the fossilization succeeded"), 0.1092, "drip scale");
    close(term(&s.world, Term::Drip, 0), 0.0, "no drip on the fossilize step");
    // Epoch 2: the fossil is still in the ablation set (basic_plus measures it); with c = 0.5 the
    // drip is 0.1092·0.5 = 0.0546.
    s.world.insert_resource(Measured { epoch: 2, env: 0, slot: 0, contribution: 0.5, cf_imp: 0.5 });
    s.run_epoch(2);
    assert_eq!(
        s.world.resource::<Hosts>().as_cpu().unwrap().validator.configs[0].slots,
        vec![0],
        "fossil ablated"
    );
    close(term(&s.world, Term::Drip, 0), 0.0546, "drip");
}

#[test]
fn a_run_writes_rewards_their_inputs_and_the_mean_episode_return() {
    let plan = plan("run", 4, RewardMode::Shaped);
    let summary = run::train(&plan, &AtomicBool::new(false)).unwrap();
    let text = std::fs::read_to_string(plan.out_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["kind"] != "round")
        .collect();
    assert_eq!(lines.len(), 2 * 4);
    let mut returns = [0.0; 2];
    for line in &lines {
        let reward = line["reward"].as_f64().expect("no rollback in this run");
        returns[line["env"].as_u64().unwrap() as usize] += reward;
        let comps = line["reward_components"].as_object().unwrap();
        let mut names: Vec<&str> = Term::of(&RewardConfig::default()).iter().map(|t| t.name()).collect();
        let mut keys: Vec<&str> = comps.keys().map(String::as_str).collect();
        names.sort_unstable();
        keys.sort_unstable();
        assert_eq!(keys, names, "exactly the shaped mode's terms");
        let sum: f64 = comps.values().map(|v| v.as_f64().unwrap()).sum();
        close(sum, reward, "components add up to the reward");
        // Recompute two terms from the logged inputs, outside the program.
        let inputs = &line["reward_inputs"];
        let (esp, host) =
            (inputs["effective_seed_params"].as_f64().unwrap(), inputs["host_params"].as_f64().unwrap());
        let rent = if esp > 0.0 { -(0.5 * (1.0 + esp / host.max(200.0)).ln()).min(1.5) } else { 0.0 };
        close(comps["compute_rent"].as_f64().unwrap(), rent, "rent from the logged inputs");
        let terminal = if line["epoch"] == 4 { 0.05 * inputs["val_acc"].as_f64().unwrap() } else { 0.0 };
        close(comps["terminal_bonus"].as_f64().unwrap(), terminal, "terminal from the logged inputs");
        assert!(line["reward_norm"].as_f64().unwrap().abs() <= 10.0);
    }
    assert_eq!(summary.mean_episode_return.len(), 1);
    close(
        summary.mean_episode_return[0],
        (returns[0] + returns[1]) / 2.0,
        "summary = mean Σ metrics rewards",
    );
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan.out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(file["mean_episode_return"][0].as_f64(), Some(summary.mean_episode_return[0]));
    assert_eq!(file["config"]["reward_mode"], "shaped");
}

#[test]
fn validation_reports_cf_imp_and_the_committed_accuracy() {
    // Env 0: two BLENDING seeds (an all-off configuration exists); env 1: one (cf_imp falls back to
    // its leave-one-out accuracy). Shaped: fossils are not ablated.
    let cf_plan = plan("cf-imp", 2, RewardMode::Shaped);
    let mut s = session(&cf_plan, Script(Vec::new()));
    force_seed(&mut s.world, 0, 0, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    force_seed(&mut s.world, 0, 1, SeedStage::Blending, BlueprintAction::Attention, 0.5);
    force_seed(&mut s.world, 1, 2, SeedStage::Blending, BlueprintAction::ConvHeavy, 0.5);
    s.run_epoch(1);
    let (configs, results) = {
        let v = &s.world.resource::<Hosts>().as_cpu().unwrap().validator;
        (v.configs.clone(), v.results())
    };
    let (r0, r1) = (&results[0], &results[1]);
    let m0 = env_row(&mut s.world, 0, |m: &HostMetrics| *m);
    let m1 = env_row(&mut s.world, 1, |m: &HostMetrics| *m);
    assert_eq!(m0.counterfactual_improvement, Some(r0.val_acc - r0.all_off_acc.unwrap()));
    assert_eq!(m0.committed_val_accuracy, r0.committed_acc.unwrap());
    assert_eq!(configs[1].slots, vec![2]);
    assert_eq!(m1.counterfactual_improvement, Some(r1.val_acc - r1.config_acc[configs[1].solo_off[0]]));
    assert_eq!(m1.committed_val_accuracy, r1.config_acc[configs[1].solo_off[0]]);

    // basic_plus: a fossil stays in the ablation set, but the committed configuration leaves it on.
    let drip_plan = plan("committed", 2, RewardMode::BasicPlus);
    let mut s = session(&drip_plan, Script(Vec::new()));
    force_seed(&mut s.world, 0, 0, SeedStage::Fossilized, BlueprintAction::ConvLight, 1.0);
    force_seed(&mut s.world, 0, 1, SeedStage::Blending, BlueprintAction::Attention, 0.5);
    s.run_epoch(1);
    let v = &s.world.resource::<Hosts>().as_cpu().unwrap().validator;
    let c = &v.configs[0];
    assert_eq!(c.slots, vec![0, 1]);
    assert_eq!(c.masks[c.committed.unwrap()], 0b10, "only the BLENDING seed is switched off");
    let r = &v.results()[0];
    let committed = r.committed_acc.unwrap();
    assert_eq!(env_row(&mut s.world, 0, |m: &HostMetrics| m.committed_val_accuracy), committed);
}

#[test]
fn loss_rent_leaves_out_a_seed_the_blend_out_freeze_holds() {
    // kasmina §8.2e: the loss family's rent is on `total_params − host_params`, and the reference's
    // `active_seed_params` counts only `requires_grad` parameters, so a seed ramping down (frozen) pays
    // none. Both envs hold a BLENDING seed 10 epochs old (past the 3-epoch grace) in slot 0; env 0's
    // is held by the blend-out freeze.
    let plan = plan_of_family("frozen-rent", 3, RewardMode::Shaped, RewardFamily::Loss);
    let mut s = session(&plan, Script(vec![]));
    for env in 0..2 {
        force_seed(&mut s.world, env, 0, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    }
    // The count germination would have cached (a forced seed has none).
    let mut q = s.world.query::<(&EnvIndex, &SlotIndex, &mut SeedMetrics, &mut SlotFlags)>();
    for (env, index, mut metrics, mut flags) in q.iter_mut(&mut s.world) {
        if index.0 == 0 {
            metrics.seed_param_count = 1_234;
            flags.blend_out_frozen = env.0 == 0;
        }
    }
    s.run_epoch(1);
    let x = &s.world.resource::<RewardBatch>().inputs;
    let (seed, host) = (x.params[0], x.host_params);
    assert_eq!((seed, x.params[x.n_slots]), (1_234.0, 1_234.0), "both seeds counted in `params`");
    assert_eq!((x.trainable_params[0], x.trainable_params[x.n_slots]), (0.0, seed));
    close(term(&s.world, Term::Rent, 0), 0.0, "frozen: no rent");
    close(term(&s.world, Term::Rent, 1), -(0.05 * (seed / host).ln_1p()).min(5.0), "trainable: rent");
    assert!(term(&s.world, Term::Rent, 1) < 0.0);
}
