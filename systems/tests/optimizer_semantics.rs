//! The optimizer semantics of the reference (spec kasmina §5.2, §8.2 b–e), each a named test: a
//! parameter group with no gradient takes no step at all, momentum resets at germinate, fossilize and
//! rollback, and the lifecycle decides which groups have gradients.

use esper_components::{AlphaAlgorithm, BlueprintAction, SeedStage, SlotState};
use esper_kernels::host::train::Trainer;
use esper_kernels::host::{
    HostArch, HostParams, HostWorkspace, SeedBank, SeedMode, SlotParams, SlotWorkspace,
};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;
use esper_systems::seed_sync::seed_env_state;

const ARCH: HostArch = HostArch {
    in_channels: 3,
    image_size: 8,
    num_classes: 4,
    base_channels: 4,
    n_blocks: 2,
    kernel_size: 3,
    pool_layers: 2,
};
const SLOT: (u8, u8) = (0, 1);

fn slot_at(stage: SeedStage, algorithm: AlphaAlgorithm, alpha: f64) -> SlotState {
    let mut s = SlotState::default();
    s.stage.current = stage;
    s.blueprint.0 = BlueprintAction::ConvLight;
    s.blend.algorithm = algorithm;
    s.blend.has_gate = algorithm == AlphaAlgorithm::Gate;
    s.alpha.0 = alpha;
    s.controller.alpha = alpha;
    s
}

/// One training step of a one-env host whose slot r0c1 holds `slot`; returns (before, after) banks.
fn step_once(slot: &SlotState) -> (SeedBank<f32>, SeedBank<f32>) {
    let mut params = HostParams::init(ARCH, 1, 0, &[0]);
    let mut bank = SeedBank::new(&ARCH, 1, &[SLOT]);
    let key = StreamKey::new(1, 0, 0, Purpose::SeedInit);
    let sp = bank.get_mut(SLOT.0, SLOT.1).unwrap();
    sp.germinate(0, CnnBlueprint::ConvLight, false, key, 0);
    sp.create_gate(0, key, 1);
    sp.state[0] = seed_env_state(slot);
    let before = bank.clone();
    let mut s = StreamKey::new(2, 0, 0, Purpose::Test).stream(0);
    let batch = 4;
    let images: Vec<f32> = (0..batch * ARCH.image_len()).map(|_| s.normal() as f32).collect();
    let labels: Vec<u8> = (0..batch).map(|_| s.below(4) as u8).collect();
    let mut ws = HostWorkspace::with_slots(ARCH, 1, batch, &bank);
    let mut trainer = Trainer::new(&params, &bank);
    trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, true);
    (before, bank)
}

fn seed_row(bank: &SeedBank<f32>) -> Vec<f32> {
    bank.get(SLOT.0, SLOT.1).unwrap().pool(CnnBlueprint::ConvLight).row(0).to_vec()
}

fn gate_row(bank: &SeedBank<f32>) -> Vec<f32> {
    bank.get(SLOT.0, SLOT.1).unwrap().gate.row(0).to_vec()
}

#[test]
fn germinated_seed_has_no_gradient_and_takes_no_step() {
    let germinated = slot_at(SeedStage::Germinated, AlphaAlgorithm::Add, 0.0);
    assert_eq!(seed_env_state(&germinated).mode, SeedMode::Off);
    let (before, after) = step_once(&germinated);
    assert_eq!(before, after, "a GERMINATED seed is not in the forward and its group takes no step");
}

/// §8.2 b: with ADD at alpha 1 (HOLDING, FOSSILIZED) the host upstream of a CNN slot receives zero
/// gradient through it; MULTIPLY and GATE still pass host gradient.
#[test]
fn quirk_8_2_b_cnn_isolation_persists_after_blending() {
    let (c, size, batch) = (4, 4, 2);
    let n = batch * c * size * size;
    let mut s = StreamKey::new(3, 0, 0, Purpose::Test).stream(0);
    let h: Vec<f64> = (0..n).map(|_| s.normal()).collect();
    for (algorithm, expect_zero) in
        [(AlphaAlgorithm::Add, true), (AlphaAlgorithm::Multiply, false), (AlphaAlgorithm::Gate, false)]
    {
        let mut sp = SlotParams::<f64>::new(1, c, size);
        let key = StreamKey::new(4, 0, 0, Purpose::SeedInit);
        sp.germinate(0, CnnBlueprint::ConvLight, false, key, 0);
        sp.create_gate(0, key, 1);
        sp.state[0] = seed_env_state(&slot_at(SeedStage::Holding, algorithm, 1.0));
        let mut ws = SlotWorkspace::new(1, batch, c, size);
        ws.forward(&sp, &h, true);
        let mut dh = vec![0.0; n];
        ws.backward(&mut sp, &h, &vec![1.0; n], &mut dh);
        let zero = dh.iter().all(|&g| g == 0.0);
        assert_eq!(zero, expect_zero, "{algorithm:?}: host gradient through the slot");
    }
}

/// §8.2 c: gate parameters are not in the seed optimizer before fossilization: their gradients are
/// computed (and clipped) but never applied; after FOSSILIZE the rebuilt optimizer steps them.
#[test]
fn quirk_8_2_c_gate_params_wait_for_fossilization() {
    let blending = slot_at(SeedStage::Blending, AlphaAlgorithm::Gate, 0.6);
    let st = seed_env_state(&blending);
    assert!(st.gate_grad && !st.gate_step);
    let (before, after) = step_once(&blending);
    assert_eq!(gate_row(&before), gate_row(&after), "gate not stepped before fossilization");
    let grads = &after.get(SLOT.0, SLOT.1).unwrap().gate.grads;
    assert!(grads.iter().any(|&g| g != 0.0), "gate gradients are still computed");
    assert_ne!(seed_row(&before), seed_row(&after), "the seed itself trains");

    let fossilized = slot_at(SeedStage::Fossilized, AlphaAlgorithm::Gate, 1.0);
    assert!(seed_env_state(&fossilized).gate_step);
    let (before, after) = step_once(&fossilized);
    assert_ne!(gate_row(&before), gate_row(&after), "the rebuilt optimizer steps the gate");
}

/// §8.2 d: fossilized seeds keep training in the RL loop (a new SGD after fossilize).
#[test]
fn quirk_8_2_d_fossilized_seeds_keep_training() {
    let fossilized = slot_at(SeedStage::Fossilized, AlphaAlgorithm::Add, 1.0);
    assert!(seed_env_state(&fossilized).train_seed);
    let (before, after) = step_once(&fossilized);
    assert_ne!(seed_row(&before), seed_row(&after));
}

/// §8.2 e: during a blend-out (controller ramping DOWN) the seed and gate are frozen: no gradient, no
/// step, no momentum move — while the host still gets gradient through the blend. (The one-epoch lag
/// after the ramp ends is the lifecycle's, tested in esper-components.)
#[test]
fn quirk_8_2_e_blend_out_freeze_skips_seed_and_gate_steps() {
    let mut frozen = slot_at(SeedStage::Blending, AlphaAlgorithm::Gate, 0.5);
    frozen.flags.blend_out_frozen = true;
    let st = seed_env_state(&frozen);
    assert_eq!((st.mode, st.train_seed, st.gate_grad), (SeedMode::Gate, false, false));
    let (before, after) = step_once(&frozen);
    assert_eq!(before.get(SLOT.0, SLOT.1).unwrap().pools, after.get(SLOT.0, SLOT.1).unwrap().pools);
    assert_eq!(gate_row(&before), gate_row(&after));
}

#[test]
fn momentum_resets_at_germinate_fossilize_and_rollback() {
    let training = slot_at(SeedStage::Training, AlphaAlgorithm::Add, 0.0);
    assert_eq!(seed_env_state(&training).mode, SeedMode::Incubator);
    let (_, mut bank) = step_once(&training);
    let sp = bank.get_mut(SLOT.0, SLOT.1).unwrap();
    let momentum = |sp: &SlotParams<f32>| sp.pool(CnnBlueprint::ConvLight).momentum.clone();
    assert!(momentum(sp).iter().any(|&m| m != 0.0), "a step leaves momentum");
    // Fossilize and rollback rebuild the optimizer.
    let mut copy = sp.clone();
    copy.reset_momentum(0);
    assert!(momentum(&copy).iter().all(|&m| m == 0.0));
    // Germinate re-initialises the row and zeroes its momentum.
    sp.germinate(0, CnnBlueprint::ConvLight, false, StreamKey::new(9, 0, 0, Purpose::SeedInit), 0);
    assert!(momentum(sp).iter().all(|&m| m == 0.0));
}

#[test]
fn lifecycle_to_kernel_state_mapping() {
    use SeedStage::*;
    let cases = [
        (Dormant, 0.0, SeedMode::Off),
        (Germinated, 0.0, SeedMode::Off),
        (Training, 0.0, SeedMode::Incubator),
        (Blending, 0.3, SeedMode::Add),
        (Holding, 1.0, SeedMode::Add),
        (Fossilized, 1.0, SeedMode::Add),
        (Pruned, 0.0, SeedMode::Off),
        (Embargoed, 0.0, SeedMode::Off),
        (Resetting, 0.0, SeedMode::Off),
    ];
    for (stage, alpha, mode) in cases {
        let st = seed_env_state(&slot_at(stage, AlphaAlgorithm::Add, alpha));
        assert_eq!(st.mode, mode, "{stage}");
        assert_eq!(st.train_seed, mode != SeedMode::Off, "{stage}");
        assert_eq!(st.collect_stats, matches!(stage, Training | Blending), "{stage}");
        assert_eq!(st.blueprint.is_some(), mode != SeedMode::Off, "{stage}");
    }
    assert_eq!(seed_env_state(&slot_at(Blending, AlphaAlgorithm::Multiply, 0.5)).mode, SeedMode::Multiply);
}
