//! The ECS world against the slot-by-slot reference: 64 envs × 3 slots spawned in shuffled order, random
//! ops (illegal ones too) every epoch for 50 epochs, and exactly the same per-slot state, masks and op
//! outcomes as the pure functions applied env by env.

use bevy_ecs::prelude::*;
use esper_components::masks::sample_masked;
use esper_components::reference::ReferenceLifecycle;
use esper_components::*;
use esper_systems::slot_query::SlotLifecycle;
use esper_systems::*;

const ENVS: usize = 64;
const EPOCHS: u32 = 50;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn draw(key: u64) -> u64 {
    let mut s = key;
    splitmix(&mut s)
}

fn unit(key: u64) -> f64 {
    (draw(key) >> 11) as f64 / (1u64 << 53) as f64
}

/// This epoch's per-env randomness, shared by both sides.
#[derive(Resource, Clone, Copy)]
struct Epoch(u32);

/// What validation would write onto live seeds: contribution and gradient health, keyed by
/// (epoch, env, slot).
fn inject_measurements(epoch: u32, env: usize, slot: usize, state: &mut SlotMut) {
    let key = (epoch as u64) << 32 | (env as u64) << 8 | slot as u64;
    let stage = state.stage.current;
    if stage.has_seed() && state.alpha.0 > 0.0 && stage != SeedStage::Fossilized {
        state.metrics.counterfactual_contribution = Some(unit(key ^ 0xC0) * 6.0 - 2.0);
    }
    if matches!(stage, SeedStage::Training | SeedStage::Blending) {
        state.telemetry.gradient_health = Some(0.5 + 0.5 * unit(key ^ 0xBE));
        state.telemetry.has_exploding = Some(false);
    }
}

fn val_accuracy(epoch: u32, env: usize) -> f64 {
    100.0 * unit((epoch as u64) << 40 | env as u64 | 1 << 20)
}

/// Half the envs sample a legal action (biased toward progress), half draw raw head values (mostly
/// illegal, some out of range).
fn choose_action(epoch: u32, env: usize, masks: &ActionMasks) -> FactoredAction {
    let mut state = (epoch as u64) << 32 ^ (env as u64) << 4 ^ 0xA5;
    if splitmix(&mut state).is_multiple_of(2) {
        let mut a = sample_masked(masks, |n| (splitmix(&mut state) % n as u64) as usize);
        // Prefer ADVANCE/FOSSILIZE when legal so seeds live long enough to reach late stages.
        for op in [LifecycleOp::Fossilize, LifecycleOp::Advance] {
            if masks.op[op as usize] && !splitmix(&mut state).is_multiple_of(3) {
                a.op = op as u8;
                let row = masks.slots_for_op(op);
                a.slot = row.iter().position(|&b| b).unwrap() as u8;
                break;
            }
        }
        a
    } else {
        let mut below = |n: usize| (splitmix(&mut state) % n as u64) as u8;
        FactoredAction {
            slot: below(4),
            blueprint: below(14),
            style: below(5),
            tempo: below(4),
            alpha_target: below(4),
            alpha_speed: below(5),
            alpha_curve: below(6),
            op: below(7),
        }
    }
}

fn validate_system(epoch: Res<Epoch>, mut slots: Query<(&EnvIndex, &SlotIndex, SlotLifecycle)>) {
    for (env, index, mut slot) in &mut slots {
        let (env, index) = (env.0 as usize, index.0 as usize);
        inject_measurements(epoch.0, env, index, &mut slot.view());
    }
}

fn host_metrics_system(epoch: Res<Epoch>, mut envs: Query<(&EnvIndex, &mut HostMetrics)>) {
    for (env, mut metrics) in &mut envs {
        metrics.val_accuracy = val_accuracy(epoch.0, env.0 as usize);
    }
}

fn decide_system(epoch: Res<Epoch>, masks: Res<MaskBatch>, mut actions: ResMut<ActionBatch>) {
    for (env, m) in masks.0.iter().enumerate() {
        actions.set(env, choose_action(epoch.0, env, m));
    }
}

fn ecs_slots(world: &mut World, n_slots: usize) -> Vec<SlotState> {
    let mut out = vec![SlotState::default(); ENVS * n_slots];
    let mut q = world.query::<(&EnvIndex, &SlotIndex, SlotLifecycle)>();
    for (env, index, mut slot) in q.iter_mut(world) {
        let row = env.0 as usize * n_slots + index.0 as usize;
        out[row] = slot.view().snapshot();
    }
    out
}

#[test]
fn ecs_world_matches_the_slot_by_slot_reference() {
    let slot_config = SlotConfig::default_three();
    let n_slots = slot_config.len();
    let config = LifecycleConfig::default();

    // Spawn envs and slots in shuffled order: batch rows must come from EnvIndex, not archetype order.
    let mut world = World::new();
    insert_run_resources(&mut world, ENVS, slot_config, config);
    world.insert_resource(Epoch(0));
    let mut order: Vec<usize> = (0..ENVS).collect();
    let mut rng = 0x5EED_u64;
    for i in (1..order.len()).rev() {
        order.swap(i, (splitmix(&mut rng) % (i as u64 + 1)) as usize);
    }
    let mut env_entities = vec![Entity::PLACEHOLDER; ENVS];
    for &e in &order {
        env_entities[e] = spawn_env(&mut world, e as u32, 0);
    }
    let mut pairs: Vec<(usize, usize)> = (0..ENVS).flat_map(|e| (0..n_slots).map(move |s| (e, s))).collect();
    for i in (1..pairs.len()).rev() {
        pairs.swap(i, (splitmix(&mut rng) % (i as u64 + 1)) as usize);
    }
    assert_ne!(pairs[0], (0, 0), "shuffled");
    for (e, s) in pairs {
        spawn_slot(&mut world, env_entities[e], e as u32, s as u8);
    }

    let mut schedule = empty_step_schedule();
    add_lifecycle_systems(&mut schedule);
    schedule.add_systems((
        (host_metrics_system, validate_system).in_set(StepSet::Validate),
        decide_system.in_set(PolicySet).in_set(StepSet::Decide),
    ));

    let mut reference = ReferenceLifecycle::new(ENVS, n_slots, config);
    let mut outcome_counts = std::collections::HashMap::new();
    let mut stages_seen = std::collections::HashSet::new();
    for epoch in 1..=EPOCHS {
        world.resource_mut::<Epoch>().0 = epoch;
        schedule.run(&mut world);

        // The reference, env by env and slot by slot, in the same order of operations.
        for e in 0..ENVS {
            for s in 0..n_slots {
                inject_measurements(epoch, e, s, &mut reference.env_mut(e)[s].view());
            }
        }
        let accs: Vec<f64> = (0..ENVS).map(|e| val_accuracy(epoch, e)).collect();
        reference.record(&accs);
        let masks = reference.masks();
        let actions: Vec<FactoredAction> = (0..ENVS).map(|e| choose_action(epoch, e, &masks[e])).collect();
        let outcomes = reference.apply(&actions, &masks);
        reference.tick();

        assert_eq!(world.resource::<MaskBatch>().0, masks, "epoch {epoch}: masks");
        assert_eq!(world.resource::<OpOutcomes>().0, outcomes, "epoch {epoch}: outcomes");
        let ecs = ecs_slots(&mut world, n_slots);
        for (row, (a, b)) in ecs.iter().zip(&reference.slots).enumerate() {
            assert_eq!(a, b, "epoch {epoch}: env {} slot {}", row / n_slots, row % n_slots);
        }
        for o in outcomes {
            *outcome_counts.entry(o).or_insert(0) += 1;
        }
        stages_seen.extend(reference.slots.iter().map(|s| s.stage.current));
    }
    // The run exercised what it claims to: the outcome kinds and the whole lifecycle. (A mask-legal op
    // always meets its handler precondition here, so FailedPrecondition cannot occur; the components
    // tests cover it with hand-built masks.)
    for o in [OpOutcome::Executed, OpOutcome::RefusedByMask, OpOutcome::FailedInHandler] {
        assert!(outcome_counts.get(&o).copied().unwrap_or(0) > 0, "{o:?} never happened: {outcome_counts:?}");
    }
    use SeedStage::*;
    for stage in [Germinated, Training, Blending, Holding, Fossilized, Embargoed, Resetting] {
        assert!(stages_seen.contains(&stage), "{stage} never reached: {stages_seen:?}");
    }

    // Tallies agree with the outcomes the reference saw.
    let mut q = world.query::<(&EnvIndex, &LifecycleTally)>();
    let failed: u32 = q.iter(&world).map(|(_, t)| t.failed_ops).sum();
    let expected_failed: u32 =
        outcome_counts.iter().filter(|(o, _)| o.failed()).map(|(_, n)| *n as u32).sum();
    assert_eq!(failed, expected_failed);
}

#[test]
fn step_schedule_builds_with_ambiguity_detection_at_error() {
    let mut world = build_world(4, SlotConfig::default_three(), LifecycleConfig::default());
    let mut schedule = empty_step_schedule();
    add_lifecycle_systems(&mut schedule);
    schedule.initialize(&mut world).expect("the lifecycle schedule has no ambiguities");
    schedule.run(&mut world);

    // Detection is really on: two unordered writers of the same component in one set are an error.
    fn writer_a(mut q: Query<&mut Stage>) {
        q.iter_mut().for_each(|mut s| s.previous = SeedStage::Unknown);
    }
    fn writer_b(mut q: Query<&mut Stage>) {
        q.iter_mut().for_each(|mut s| s.previous = SeedStage::Unknown);
    }
    let mut world = build_world(2, SlotConfig::default_three(), LifecycleConfig::default());
    let mut bad = empty_step_schedule();
    bad.add_systems((writer_a, writer_b).in_set(StepSet::Record));
    assert!(bad.initialize(&mut world).is_err(), "ambiguity must be an error");
}
