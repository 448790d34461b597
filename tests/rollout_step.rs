//! The learner's rollout row through the real training schedule (simic §1.3 D.9, §3.4): which steps
//! give the contribution predictor a target.

use esper_components::{BlueprintAction, SeedStage};
use esper_ecs::config::RunConfig;
use esper_ecs::run::Session;
use esper_systems::build_observations::ObsBatch;
use esper_systems::learner::Rollout;

use crate::common::force_seed;

/// Reference behaviour kept (simic §1.3: D.7 adds 1 to every present slot's "epochs since
/// counterfactual" before D.9 tests that every ablated slot's counter is 0): a slot measured this
/// step reads 1 at the test, so no step is fresh and the predictor gets no target, although every
/// env had its seeds measured this step.
#[test]
fn a_measured_step_gives_no_contribution_target_as_in_the_reference() {
    let out = std::env::temp_dir().join(format!("esper-rollout-step-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig { envs: 2, epochs: 3, ..crate::ppo_train::small(1) };
    let plan = config.plan_in(out.clone(), true).expect("a valid tiny config");
    let mut s = Session::new(&plan).unwrap();
    s.start_round(0);
    for env in 0..2 {
        for slot in 0..2 {
            force_seed(&mut s.world, env, slot, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
        }
    }
    s.run_epoch(1);

    // Measured this step (the observation's inputs, after Validate and before D.7): both BLENDING
    // seeds of both envs.
    let inputs = &s.world.resource::<ObsBatch>().inputs;
    let measured = (0..inputs.contribution.len())
        .filter(|&i| inputs.contribution[i].is_some() && inputs.epochs_since_counterfactual[i] == Some(0))
        .count();
    assert_eq!(measured, 4, "two measured seeds per env");

    let buffer = &s.world.resource::<Rollout>().0;
    assert_eq!(buffer.lens, vec![1, 1], "one row per env");
    let s_slots = buffer.n_slots;
    let row = |e: usize| e * buffer.capacity * s_slots..(e * buffer.capacity + 1) * s_slots;
    for e in 0..2 {
        assert_eq!(&buffer.contribution_mask[row(e)], &vec![false; s_slots][..], "env {e}: no target");
    }
    let _ = std::fs::remove_dir_all(&out);
}
