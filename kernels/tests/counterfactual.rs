//! Fused validation with counterfactual ablations (kasmina §8.3, simic §3.1): the configuration sets,
//! and the fused pass equal to evaluating every configuration separately, bit for bit.

use esper_kernels::host::{
    EnvConfigs, FusedValidator, HostParams, HostWorkspace, SeedBank, SeedEnvState, SeedMode,
};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;

mod common;
use common::ARCH;

const SLOTS: [(u8, u8); 4] = [(0, 0), (0, 1), (0, 2), (1, 1)];

#[test]
fn configuration_sets_and_their_deduplication() {
    let none = EnvConfigs::new(&[]);
    assert_eq!(none.masks, vec![0]);
    assert!(none.solo_off.is_empty() && none.all_off.is_none() && none.committed.is_none());
    // n = 1: K = 4 before dedupe (main, solo-off, solo-on = main, committed = solo-off) → 2 distinct.
    let one = EnvConfigs::new(&[2]);
    assert_eq!(one.masks, vec![0, 0b100]);
    assert_eq!((one.solo_off.clone(), one.solo_on.clone(), one.committed), (vec![1], vec![0], Some(1)));
    // n = 2: main, 2 solo-off, 2 solo-on (= the other's solo-off), all-off, committed = all-off → 4.
    let two = EnvConfigs::new(&[0, 3]);
    assert_eq!(two.masks, vec![0, 0b0001, 0b1000, 0b1001]);
    assert_eq!(two.solo_on, vec![2, 1]);
    assert_eq!((two.all_off, two.committed), (Some(3), Some(3)));
    assert!(two.pairs.is_empty());
    // n = 3: K = 12 before dedupe; pairs (all but i, j off) are the third slot's solo-off → 8 distinct.
    let three = EnvConfigs::new(&[0, 1, 2]);
    assert_eq!(three.masks.len(), 8);
    assert_eq!(
        three.pairs,
        vec![(0, 1, three.solo_off[2]), (0, 2, three.solo_off[1]), (1, 2, three.solo_off[0])]
    );
    // n = 5: no all-off, no pairs, but committed (every ablatable seed off) still exists.
    let five = EnvConfigs::new(&[0, 1, 2, 3, 4]);
    assert!(five.all_off.is_none() && five.pairs.is_empty());
    assert_eq!(five.masks.len(), 1 + 5 + 5 + 1);
    assert_eq!(five.committed, Some(11));
    // Fossils in the ablation set (BASIC_PLUS drip): committed switches off only the non-fossils.
    let mut drip = EnvConfigs::default();
    drip.rebuild(&[0, 2], 0b001);
    assert_eq!(drip.masks, vec![0, 0b001, 0b100, 0b101]);
    assert_eq!((drip.all_off, drip.committed), (Some(3), Some(2)));
    drip.rebuild(&[1], 0b010);
    assert_eq!((drip.masks.clone(), drip.committed), (vec![0, 0b010], None));
}

fn blend(mode: SeedMode, bp: CnnBlueprint, alpha: f32) -> SeedEnvState {
    SeedEnvState {
        mode,
        blueprint: Some(bp),
        alpha,
        train_seed: true,
        gate_grad: mode == SeedMode::Gate,
        ..Default::default()
    }
}

/// Env e holds e ablatable seeds (0..=3), plus env 3 has a fossilized seed that must not be ablated.
fn world(envs: usize) -> (HostParams<f32>, SeedBank<f32>, Vec<Vec<bool>>) {
    let ids: Vec<u64> = (0..envs as u64).collect();
    let params = HostParams::init(ARCH, 9, 0, &ids);
    let mut bank = SeedBank::new(&ARCH, envs, &SLOTS);
    let mut s = StreamKey::new(3, 0, 0, Purpose::Test).stream(0);
    for slot in bank.slots_mut() {
        for pool in slot.pools.iter_mut().chain([&mut slot.gate]) {
            for v in &mut pool.params {
                *v = (0.3 * s.normal()) as f32;
            }
        }
    }
    let modes = [SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
    let bps = [CnnBlueprint::ConvLight, CnnBlueprint::Attention, CnnBlueprint::Norm, CnnBlueprint::ConvHeavy];
    let mut fossilized = vec![vec![false; envs]; SLOTS.len()];
    for e in 0..envs {
        for k in 0..e.min(3) {
            bank.slots_mut().nth(k).unwrap().state[e] =
                blend(modes[(e + k) % 3], bps[(e + k) % 4], 0.3 + 0.2 * k as f32);
        }
    }
    // Env 3: a fossilized ADD seed at alpha 1 in the fourth slot, and an incubating seed in env 1.
    if envs > 3 {
        bank.slots_mut().nth(3).unwrap().state[3] = blend(SeedMode::Add, CnnBlueprint::Depthwise, 1.0);
        fossilized[3][3] = true;
    }
    bank.slots_mut().nth(3).unwrap().state[1] = blend(SeedMode::Incubator, CnnBlueprint::Bottleneck, 0.0);
    (params, bank, fossilized)
}

/// Every env with a blending seed in every slot (ADD, MULTIPLY, GATE in turn, alphas 0.3 … 0.9): every
/// env has every configuration, so the passes are one row per env in env order.
fn full_world(envs: usize) -> (HostParams<f32>, SeedBank<f32>, Vec<Vec<bool>>) {
    let (params, mut bank, _) = world(envs);
    let modes = [SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
    let bps = [CnnBlueprint::ConvLight, CnnBlueprint::Attention, CnnBlueprint::ConvHeavy, CnnBlueprint::Norm];
    for (k, slot) in bank.slots_mut().enumerate() {
        for e in 0..envs {
            slot.state[e] = blend(modes[(e + k) % 3], bps[k], 0.3 + 0.2 * k as f32);
        }
    }
    (params, bank, vec![vec![false; envs]; SLOTS.len()])
}

/// Runs the fused pass over `envs` envs in chunks of `chunk` virtual envs and checks every
/// configuration's accuracy against that configuration evaluated alone. Returns the passes that read
/// the main activation in place.
fn check_fused_equals_alone(
    envs: usize,
    chunk: usize,
    (params, mut bank, fossilized): (HostParams<f32>, SeedBank<f32>, Vec<Vec<bool>>),
) -> (FusedValidator<f32>, usize) {
    let batch = 6;
    let mut s = StreamKey::new(4, 0, 0, Purpose::Test).stream(0);
    let images: Vec<f32> = (0..envs * batch * ARCH.image_len()).map(|_| s.normal() as f32).collect();
    let labels: Vec<u8> = (0..envs * batch).map(|_| s.below(10) as u8).collect();
    let counts: Vec<usize> = (0..envs).map(|e| [6, 5, 6, 4][e % 4]).collect();
    let mut fused = FusedValidator::new(ARCH, &bank, &SLOTS, chunk, batch);
    let mut main = HostWorkspace::with_slots(ARCH, envs, batch, &bank);
    fused.plan(&bank, &fossilized);
    fused.run_batch(&mut main, &params, &mut bank, &images, &labels, &counts);
    let in_place = fused.in_place_passes();
    let results = fused.results();
    let image_len = ARCH.image_len();
    for (e, configs) in fused.configs.iter().enumerate() {
        for (k, &mask) in configs.masks.iter().enumerate() {
            // This configuration alone: env e's parameters, the masked slots' alpha set to 0.
            let alone_params = params.extract_env(e);
            let mut alone_bank = bank.extract_env(e);
            for (slot_k, slot) in alone_bank.slots_mut().enumerate() {
                if mask & (1 << slot_k) != 0 {
                    slot.state[0].alpha = 0.0;
                }
            }
            let mut ws = HostWorkspace::with_slots(ARCH, 1, batch, &alone_bank);
            let imgs = &images[e * batch * image_len..(e + 1) * batch * image_len];
            ws.forward_eval(&alone_params, &alone_bank, imgs);
            let mut correct = 0;
            for row in 0..counts[e] {
                let z = &ws.logits[row * 10..(row + 1) * 10];
                let best = (0..10).fold(0, |b, i| if z[i] > z[b] { i } else { b });
                correct += usize::from(best == labels[e * batch + row] as usize);
            }
            let acc = 100.0 * correct as f64 / counts[e] as f64;
            assert_eq!(results[e].config_acc[k], acc, "chunk {chunk}: env {e} config {k} (mask {mask:#b})");
        }
        // Derived quantities follow from the configuration accuracies.
        let r = &results[e];
        assert_eq!(r.slots, configs.slots);
        for (i, &k) in configs.solo_off.iter().enumerate() {
            assert_eq!(r.contribution[i], r.val_acc - r.config_acc[k]);
        }
        assert_eq!(r.val_acc, r.config_acc[0]);
    }
    (fused, in_place)
}

#[test]
fn fused_validation_equals_each_configuration_evaluated_alone() {
    // Chunks of 5, 2 and 1 virtual envs: the passes are split across forwards and must not care.
    for chunk in [5, 2, 1] {
        let envs = 4;
        let (fused, in_place) = check_fused_equals_alone(envs, chunk, world(envs));
        let n_ablatable: Vec<usize> = fused.configs.iter().map(|c| c.slots.len()).collect();
        assert_eq!(
            n_ablatable,
            vec![0, 1, 2, 3],
            "env e has e ablatable seeds; fossilized and incubating excluded"
        );
        assert_eq!(fused.virtual_env_count(), 1 + 2 + 4 + 8);
        assert_eq!(in_place, 0, "env 0 has only its main configuration: no pass is one row per env");
        let results = fused.results();
        assert_eq!(results[3].interactions.len(), 3);
        let r = &results[3];
        let c = &fused.configs[3];
        let (i, j, k) = c.pairs[0];
        let expected = r.config_acc[k] - r.solo_on_acc[i] - r.solo_on_acc[j] + r.all_off_acc.unwrap();
        assert_eq!(r.interactions[0], (i, j, expected));
    }
}

#[test]
fn fused_validation_reads_the_main_activation_in_place_and_gives_the_same_bits() {
    let envs = 3;
    // Four ablatable slots per env: main, 4 leave-one-out, 4 solo-on, all-off, 6 pairs = 16 masks.
    let (fused, in_place) = check_fused_equals_alone(envs, envs, full_world(envs));
    assert_eq!(fused.virtual_env_count(), envs * 16);
    assert_eq!(in_place, 15, "every configuration but the main one runs as one pass over the envs, in place");
    // The same plan in chunks smaller than the env count gathers every pass, with the same results.
    let (gathered, none) = check_fused_equals_alone(envs, 2, full_world(envs));
    assert_eq!(none, 0);
    assert_eq!(gathered.results(), fused.results());
}

#[test]
fn fused_validation_bits_match_alone_logits() {
    // The bit-level statement behind the accuracies: a virtual env's logits equal its configuration's
    // logits evaluated alone, for an ADD seed ablated by alpha 0 (h + 0·(s − h) = h).
    let (envs, batch) = (3, 4);
    let (params, bank, fossilized) = world(envs);
    let mut s = StreamKey::new(5, 0, 0, Purpose::Test).stream(0);
    let images: Vec<f32> = (0..envs * batch * ARCH.image_len()).map(|_| s.normal() as f32).collect();
    let alone_params = params.extract_env(2);
    let mut off_bank = bank.extract_env(2);
    off_bank.slots_mut().next().unwrap().state[0].alpha = 0.0;
    let mut gone_bank = bank.extract_env(2);
    gone_bank.slots_mut().next().unwrap().state[0].mode = SeedMode::Off;
    let image_len = ARCH.image_len();
    let imgs = &images[2 * batch * image_len..3 * batch * image_len];
    let mut ws = HostWorkspace::with_slots(ARCH, 1, batch, &off_bank);
    ws.forward_eval(&alone_params, &off_bank, imgs);
    let with_zero_alpha = ws.logits.clone();
    ws.forward_eval(&alone_params, &gone_bank, imgs);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&with_zero_alpha), bits(&ws.logits), "alpha 0 is the host exactly");
    let _ = fossilized;
}
