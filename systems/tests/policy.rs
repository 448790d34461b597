//! The policy interface: the random baseline only ever picks legal actions, and the heuristic waits
//! until it has signals.

use esper_components::heuristic::HeuristicConfig;
use esper_components::masks::{MaskParams, MaskSeedInfo, compute_action_masks};
use esper_components::reference::ReferenceLifecycle;
use esper_components::{AlphaMode, LifecycleConfig, LifecycleOp, SeedStage, Topology};
use esper_systems::ActionBatch;
use esper_systems::host_resources::StepClock;
use esper_systems::policy::{HeuristicPolicy, Observations, Policy, RandomPolicy};

#[test]
fn random_policy_picks_only_legal_actions() {
    let params = MaskParams {
        topology: Topology::Cnn,
        max_seeds: 0,
        allow_governor_override: false,
        disable_advance: false,
    };
    let stages = [
        SeedStage::Germinated,
        SeedStage::Training,
        SeedStage::Blending,
        SeedStage::Holding,
        SeedStage::Embargoed,
    ];
    let masks: Vec<_> = (0..64)
        .map(|e| {
            let slot = |k: usize| {
                // Env 0 is empty (GERMINATE legal); the others get mixed stages.
                let s = if e == 0 { 5 } else { (e * (k + 3) + k) % 7 };
                (s < 5).then(|| MaskSeedInfo {
                    stage: stages[s],
                    seed_age_epochs: (e % 9) as u32,
                    alpha_mode: AlphaMode::Hold,
                })
            };
            compute_action_masks(&[slot(0), slot(1), slot(2)], 0, &params)
        })
        .collect();
    let signals = vec![None; 64];
    let mut actions = ActionBatch::new(64);
    let mut policy = RandomPolicy;
    let mut ops_seen = [false; LifecycleOp::COUNT];
    for epoch in 1..=20 {
        let obs = Observations {
            clock: StepClock { seed: 3, round: 0, epoch, step: epoch, episode_epochs: 0 },
            features: &[],
            blueprint_indices: &[],
            signals: &signals,
            reports: &[],
            n_slots: 3,
        };
        policy.decide(&obs, &masks, &mut actions);
        for (e, m) in masks.iter().enumerate() {
            let a = actions.get(e);
            assert!(m.allows(&a), "env {e}: {a:?}");
            ops_seen[a.op as usize] = true;
        }
    }
    assert!(ops_seen.iter().all(|&s| s), "every op was drawn at least once: {ops_seen:?}");
}

#[test]
fn heuristic_policy_waits_without_signals() {
    let world = ReferenceLifecycle::new(4, 3, LifecycleConfig::default());
    let masks = world.masks();
    let signals = vec![None; 4];
    let reports = vec![Default::default(); 12];
    let mut policy = HeuristicPolicy::new(HeuristicConfig::new(Topology::Cnn).unwrap(), 4);
    let mut actions = ActionBatch::new(4);
    let obs = Observations {
        clock: StepClock::default(),
        features: &[],
        blueprint_indices: &[],
        signals: &signals,
        reports: &reports,
        n_slots: 3,
    };
    policy.decide(&obs, &masks, &mut actions);
    for e in 0..4 {
        assert_eq!(actions.get(e).op, LifecycleOp::Wait as u8);
    }
    assert_eq!(policy.name(), "heuristic");
}
