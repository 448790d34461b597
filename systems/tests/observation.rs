//! The Observe stage's observation, through its systems: `build_observations` on a hand-built world
//! equals hand-written vectors derived from the spec (tamiyo §1.1–1.2) for the base block and for a
//! slot in each of: empty (sentinels), TRAINING, BLENDING with a counterfactual, FOSSILIZED; and
//! `normalize_observations` keeps the statistics frozen within a round, while the round-end schedule
//! applies one EMA step from the round's raw observations.

use bevy_ecs::prelude::*;
use esper_components::signals::{EpochObservation, SignalConfig, SignalTracker};
use esper_components::{
    AlphaAlgorithm, AlphaController, AlphaCurve, AlphaMode, BlueprintAction, EnvIndex, GradientTelemetry,
    LastAction, LifecycleConfig, LifecycleOp, SeedStage, SlotConfig, SlotIndex, SlotState, SlotTracking,
};
use esper_kernels::observation::obs_dim;
use esper_systems::build_observations::{ObsBatch, build_observations};
use esper_systems::host_resources::StepClock;
use esper_systems::normalize_observations::{ObsNormalization, normalize_observations};
use esper_systems::slot_query::SlotLifecycle;
use esper_systems::update_obs_normalizer::round_end_schedule;
use esper_systems::update_signals::EnvSignals;
use esper_systems::world::build_world;

/// Episode length `E` of the hand-built world.
const E: u64 = 20;

fn observe_schedule() -> Schedule {
    let mut schedule = Schedule::default();
    schedule.add_systems((build_observations, normalize_observations).chain());
    schedule
}

fn controller(
    start: f64,
    target: f64,
    mode: AlphaMode,
    total: u32,
    done: u32,
    alpha: f64,
) -> AlphaController {
    AlphaController {
        alpha,
        start,
        target,
        mode,
        curve: AlphaCurve::Linear,
        steepness: 12.0,
        steps_total: total,
        steps_done: done,
    }
}

/// One env, slots r0c0..r0c3 at epoch 3 of 20: r0c0 empty, r0c1 TRAINING, r0c2 BLENDING with a
/// counterfactual, r0c3 FOSSILIZED. The env's last action was a refused GERMINATE.
fn hand_built_world() -> World {
    let slots = SlotConfig::parse_list("r0c0,r0c1,r0c2,r0c3").unwrap();
    let mut world = build_world(1, slots, LifecycleConfig::default());
    *world.resource_mut::<StepClock>() =
        StepClock { seed: 1, round: 0, epoch: 3, step: 2, episode_epochs: E };

    // The signals of epochs 1–3 through the tracker: losses 2.5, 2.0, 1.5; accuracies 30, 38, 42 pp.
    let config = SignalConfig::default();
    let mut tracker = SignalTracker::new(&config);
    let mut signals = None;
    for (epoch, (loss, acc)) in [(2.5, 30.0), (2.0, 38.0), (1.5, 42.0)].into_iter().enumerate() {
        let obs = EpochObservation {
            epoch: epoch as u32 + 1,
            global_step: epoch as u64 + 1,
            train_loss: loss,
            train_accuracy: acc,
            val_loss: loss,
            val_accuracy: acc,
        };
        signals = Some(tracker.update(&config, &obs, &[]));
    }
    let env = world.query_filtered::<Entity, (With<EnvIndex>, With<LastAction>)>().single(&world).unwrap();
    world
        .entity_mut(env)
        .insert((EnvSignals(signals), LastAction { op: LifecycleOp::Germinate, success: false }));

    let mut training = SlotState::default();
    training.stage.current = SeedStage::Training;
    training.blueprint.0 = BlueprintAction::ConvLight;
    training.tempo.epochs = 8;
    training.counters.epochs_in_stage = 2;
    training.counters.epochs_total = 4;
    training.telemetry = GradientTelemetry {
        gradient_norm: Some(2.0),
        gradient_health: Some(0.8),
        has_vanishing: Some(false),
        has_exploding: None,
    };

    let mut blending = SlotState::default();
    blending.stage.current = SeedStage::Blending;
    blending.blueprint.0 = BlueprintAction::Attention;
    blending.alpha.0 = 0.4;
    // The controller's own copy lags the canonical amplitude (it catches up at the next tick): the
    // observation reads the canonical one, `metrics.current_alpha`.
    blending.controller = controller(0.0, 1.0, AlphaMode::Up, 5, 2, 0.3);
    blending.blend.algorithm = AlphaAlgorithm::Multiply;
    blending.metrics.counterfactual_contribution = Some(3.5);
    blending.metrics.contribution_velocity = 12.0;
    blending.metrics.interaction_sum = -2.5;
    blending.tempo.epochs = 5;
    blending.counters.epochs_in_stage = 3;
    blending.counters.epochs_total = 9;

    let mut fossil = SlotState::default();
    fossil.stage.current = SeedStage::Fossilized;
    fossil.blueprint.0 = BlueprintAction::ConvHeavy;
    fossil.alpha.0 = 1.0;
    fossil.controller = controller(0.0, 1.0, AlphaMode::Hold, 5, 5, 1.0);
    fossil.blend.algorithm = AlphaAlgorithm::Gate;
    fossil.metrics.counterfactual_contribution = Some(2.0);
    fossil.metrics.contribution_velocity = -0.5;
    fossil.metrics.interaction_sum = 25.0;
    fossil.tempo.epochs = 3;
    fossil.counters.epochs_in_stage = 12;
    fossil.counters.epochs_total = 40;
    fossil.telemetry = GradientTelemetry {
        gradient_norm: Some(f64::NAN),
        gradient_health: Some(1.7),
        has_vanishing: Some(true),
        has_exploding: Some(true),
    };

    let tracking = [
        SlotTracking::default(),
        SlotTracking::default(),
        SlotTracking {
            gradient_health_prev: Some(0.6),
            epochs_since_counterfactual: Some(2),
            ..Default::default()
        },
        SlotTracking {
            gradient_health_prev: Some(0.9),
            epochs_since_counterfactual: Some(0),
            ..Default::default()
        },
    ];
    let states = [SlotState::default(), training, blending, fossil];
    let mut query = world.query::<(&SlotIndex, SlotLifecycle, &mut SlotTracking)>();
    let mut written = 0;
    for (index, mut slot, mut t) in query.iter_mut(&mut world) {
        slot.view().write(&states[index.0 as usize]);
        *t = tracking[index.0 as usize];
        written += 1;
    }
    assert_eq!(written, 4);
    world
}

fn assert_features(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((f64::from(g) - w).abs() < 1e-6, "{what}[{i}]: got {g}, want {w}");
    }
}

/// Expected values, each from the spec's formula by hand (E = 20).
#[test]
fn hand_built_world_matches_the_spec_by_hand() {
    let mut world = hand_built_world();
    observe_schedule().run(&mut world);
    let batch = world.resource::<ObsBatch>();
    assert_eq!(batch.dim(), obs_dim(4));
    assert_eq!(batch.raw.len(), 23 + 31 * 4);
    let row = batch.raw_row(0);

    #[rustfmt::skip]
    let base = [
        3.0 / 20.0,                          // 0 epoch: min(3, 20)/20
        0.130_898_676,                       // 1 symlog(1.5)/7 = ln 2.5 / 7
        0.42,                                // 2 accuracy 42 pp / 100
        -1.0, -1.0,                          // 3–4 history holds 3 values: the 2 oldest are unknown
        0.178_966_138, 0.156_944_613, 0.130_898_676, // 5–7 ln 3.5/7, ln 3/7, ln 2.5/7
        -1.0, -1.0, 0.30, 0.38, 0.42,        // 8–12 accuracy history
        0.25, 0.25, 0.25,                    // 13–15 1 TRAINING, 1 BLENDING, 1 FOSSILIZED (counts as HOLDING) of 4
        0.0,                                 // 16 last action failed
        0.0, 1.0, 0.0, 0.0, 0.0, 0.0,        // 17–22 last op GERMINATE
    ];
    assert_features("base", &row[..23], &base);

    let slot = |k: usize| &row[23 + 31 * k..23 + 31 * (k + 1)];
    assert_features("empty slot", slot(0), &[0.0; 31]);

    #[rustfmt::skip]
    let training = [
        1.0,                                               // 0 is_active
        0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,  // 1–10 TRAINING (3) → one-hot index 3
        0.0,                                               // 11 alpha
        0.0, 0.0,                                          // 12–13 no contribution yet, velocity 0
        8.0 / 12.0,                                        // 14 tempo 8 / 12
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0,                      // 15–20 controller holding at 0, no steps
        0.0,                                               // 21 ADD: (1 − 1)/2
        0.0,                                               // 22 interaction sum
        0.156_944_613,                                     // 23 symlog(2)/7 = ln 3 / 7
        0.8, 0.0, 0.0,                                     // 24–26 health 0.8, not vanishing, exploding unmeasured
        -1.0,                                              // 27 no previous gradient health
        2.0 / 20.0,                                        // 28 epochs in stage
        -1.0,                                              // 29 never ablated
        4.0 / 20.0,                                        // 30 seed age
    ];
    assert_features("TRAINING slot", slot(1), &training);

    #[rustfmt::skip]
    let blending = [
        1.0,
        0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0,  // BLENDING (4) → index 4
        0.4,                                               // 11 alpha
        0.35,                                              // 12 clamp(3.5/10, ±1)
        1.0,                                               // 13 clamp(12/10, ±1)
        5.0 / 12.0,                                        // 14 tempo
        1.0,                                               // 15 alpha target
        0.5,                                               // 16 UP (1) / 2
        5.0 / 20.0, 2.0 / 20.0, 3.0 / 20.0,                // 17–19 steps total, done, to target
        0.2,                                               // 20 (1 − 0)/5
        0.5,                                               // 21 MULTIPLY: (2 − 1)/2
        -0.25,                                             // 22 clamp(−2.5/10, ±1)
        0.0, 0.0, 0.0, 0.0,                                // 23–26 no telemetry: "not healthy"
        0.6,                                               // 27 previous gradient health
        3.0 / 20.0,                                        // 28
        0.990_025,                                         // 29 0.995²
        9.0 / 20.0,                                        // 30
    ];
    assert_features("BLENDING slot", slot(2), &blending);

    #[rustfmt::skip]
    let fossil = [
        1.0,
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0,  // FOSSILIZED (7) → index 6
        1.0,                                               // 11
        0.2,                                               // 12 2/10
        -0.05,                                             // 13 −0.5/10
        0.25,                                              // 14 3/12
        1.0, 0.0,                                          // 15–16 target 1, HOLD
        0.25, 0.25, 0.0,                                   // 17–19 5/20, 5/20, 0 to go
        0.0,                                               // 20 HOLD: velocity 0
        1.0,                                               // 21 GATE: (3 − 1)/2
        1.0,                                               // 22 clamp(25/10, ±1)
        0.0,                                               // 23 a NaN gradient norm is not measured
        1.0,                                               // 24 clamp(1.7, ±1)
        1.0, 1.0,                                          // 25–26
        0.9,                                               // 27
        12.0 / 20.0,                                       // 28
        1.0,                                               // 29 ablated this epoch: 0.995⁰
        1.0,                                               // 30 min(40, 20)/20
    ];
    assert_features("FOSSILIZED slot", slot(3), &fossil);

    let indices: Vec<i64> = batch.blueprint_row(0).to_vec();
    assert_eq!(indices, vec![-1, 1, 2, 7]);
}

/// The statistics stay frozen for a round: two steps on the same world give the same normalised
/// observation, equal to the fresh normaliser's `clamp((x − 0)/sqrt(1 + 1e-4), ±10)`. The round end
/// then takes one EMA step from the two (identical) rows: μ = 0.01·x, σ² = 0.99 + 0.0099·x² (batch
/// variance 0, δ = x).
#[test]
fn statistics_are_frozen_within_a_round_and_step_at_its_end() {
    let mut world = hand_built_world();
    let mut observe = observe_schedule();
    observe.run(&mut world);
    let first = world.resource::<ObsBatch>().normalized.clone();
    observe.run(&mut world);
    let batch = world.resource::<ObsBatch>();
    assert_eq!(batch.normalized, first);
    let raw = batch.raw.clone();
    for (&x, &z) in raw.iter().zip(&first) {
        let want = (f64::from(x) / (1.0f64 + 1e-4).sqrt()).clamp(-10.0, 10.0);
        assert!((f64::from(z) - want).abs() < 1e-6, "{x} → {z}, want {want}");
    }
    assert_eq!(world.resource::<ObsNormalization>().round.rows, 2);

    let mut round_end = round_end_schedule();
    round_end.run(&mut world);
    let norm = world.resource::<ObsNormalization>();
    assert_eq!(norm.round.rows, 0, "the next round starts with no observations");
    for (j, &x) in raw.iter().enumerate() {
        let x = f64::from(x);
        assert!((norm.normalizer.mean[j] - 0.01 * x).abs() < 1e-12, "mean[{j}]");
        assert!((norm.normalizer.var[j] - (0.99 + 0.0099 * x * x)).abs() < 1e-12, "var[{j}]");
    }
    observe.run(&mut world);
    let after = &world.resource::<ObsBatch>().normalized;
    let moved = after.iter().zip(&first).filter(|(a, b)| a != b).count();
    let nonzero = raw.iter().filter(|&&x| x != 0.0).count();
    assert_eq!(moved, nonzero, "every feature with a non-zero value normalises differently after the update");
    assert!(nonzero > 40, "{nonzero}");
}
