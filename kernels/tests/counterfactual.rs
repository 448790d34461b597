//! Fused validation with counterfactual ablations (kasmina §8.3, simic §3.1): the configuration sets,
//! and the fused pass equal to evaluating every configuration separately, bit for bit.

use esper_kernels::host::{
    EnvConfigs, FusedValidator, HostParams, HostWorkspace, SeedBank, SeedEnvState, SeedMode,
    ValidationPassOrder,
};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;

use crate::common;
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
    // Every env has the same 16 configurations (every subset of the 4 slots): the passes run as a tree.
    // In network order (r0c0, r0c1, r1c1, r0c2) the masks run as binary numbers 1 … 15, each from
    // where it first differs from the one before (the lowest set bit of v); it reads the main pass's
    // activation there unless an earlier pass started before it (v not a power of two): 15 − 4 = 11.
    assert_eq!(fused.reused_passes(), 11);
    // The same plan in chunks smaller than the env count gathers every pass, with the same results.
    let (gathered, none) = check_fused_equals_alone(envs, 2, full_world(envs));
    assert_eq!((none, gathered.reused_passes()), (0, 0));
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

/// Three ablatable slots, one per block at r0 (the bench's seeded workload), the same in every env:
/// hand-derived, the passes run in lexicographic order of their off-masks read in network order, each
/// from where it first differs from the pass before it.
#[test]
fn validation_passes_form_a_tree_over_three_slots() {
    let positions = [(0, 0), (1, 0), (2, 0)];
    let configs = vec![EnvConfigs::new(&[0, 1, 2]); 2];
    // masks: 0, {0}, {1}, {2}, {1,2}, {0,2}, {0,1}, {0,1,2} (bit k = slot k).
    assert_eq!(configs[0].masks, vec![0, 0b001, 0b010, 0b100, 0b110, 0b101, 0b011, 0b111]);
    let mut planner = ValidationPassOrder::default();
    let order = planner.plan(&configs, &positions).to_vec();
    // Network-order keys (slot 0 first): pass 3 = 001, 2 = 010, 4 = 011, 1 = 100, 5 = 101, 6 = 110, 7 = 111.
    let expected = [
        (0, None),
        (3, Some((2, 0))),
        (2, Some((1, 0))),
        (4, Some((2, 0))),
        (1, Some((0, 0))),
        (5, Some((2, 0))),
        (6, Some((1, 0))),
        (7, Some((2, 0))),
    ];
    assert_eq!(order, expected);
    // Slot segments run: 3 (main) + 1 + 2 + 1 + 3 + 1 + 2 + 1 = 14, where starting every pass at its
    // first switched-off slot runs 3 + 4·3 + 2·2 + 1 = 20.
    assert_eq!(segments(&order, &positions), 14);
    assert_eq!(planner.segments(), 14);
}

/// Slot segments a pass order runs: the main pass all of them, every other pass those from its start.
fn segments(order: &[(usize, Option<(usize, u8)>)], positions: &[(usize, u8)]) -> usize {
    let n = positions.len();
    let index = |start: (usize, u8)| positions.iter().filter(|&&p| p < start).count();
    order.iter().map(|&(_, start)| n - start.map_or(0, index)).sum()
}

/// A stand-in network of slot segments: the value at each slot input folds in every choice before it,
/// so a pass that starts from an input computed with other choices ends on another value.
fn segment(value: u64, network_index: usize, off: bool) -> u64 {
    let choice = 2 * network_index as u64 + if off { 1 } else { 2 };
    value.wrapping_mul(1_000_003).wrapping_add(choice)
}

proptest::proptest! {
    /// Any mix of envs and ablatable slots (canonical slot order is not network order): running the
    /// passes as a device does — one stored input per slot, each pass reading its start's and
    /// rewriting every input after it — ends every env on what its configuration computed from the
    /// images gives, and the order never runs more segments than starting every pass at the first slot
    /// it switches off, latest first.
    #[test]
    fn validation_pass_order_reads_only_inputs_its_choices_made(
        subsets in proptest::collection::vec(proptest::collection::vec(proptest::bool::ANY, 5), 1..5),
        n_slots in 1usize..=5,
    ) {
        // Canonical order is the bank's: the r0 slots by column, then the r1 slots.
        let positions = &[(0usize, 0u8), (1, 0), (2, 0), (0, 1), (1, 1)][..n_slots];
        let network: Vec<usize> = {
            let mut k: Vec<usize> = (0..n_slots).collect();
            k.sort_by_key(|&k| positions[k]);
            k
        };
        let configs: Vec<EnvConfigs> = subsets
            .iter()
            .map(|held| EnvConfigs::new(&(0..n_slots).filter(|&k| held[k]).collect::<Vec<_>>()))
            .collect();
        let mut planner = ValidationPassOrder::default();
        let order = planner.plan(&configs, positions).to_vec();
        proptest::prop_assert_eq!(planner.segments(), segments(&order, positions));
        let passes = configs.iter().map(|c| c.masks.len()).max().unwrap();
        let mut seen: Vec<usize> = order.iter().map(|&(j, _)| j).collect();
        seen.sort();
        proptest::prop_assert_eq!(seen, (0..passes).collect::<Vec<_>>());
        proptest::prop_assert_eq!(order[0], (0, None));

        let off = |j: usize, e: usize, k: usize| configs[e].masks.get(j).is_some_and(|m| m & (1 << k) != 0);
        let from_images = |j: usize, e: usize| {
            network.iter().enumerate().fold(e as u64 + 17, |v, (i, &k)| segment(v, i, off(j, e, k)))
        };
        // stored[e][i]: the input of the i-th slot in network order; the main pass writes them all.
        let mut stored: Vec<Vec<u64>> = (0..configs.len())
            .map(|e| {
                let mut v = e as u64 + 17;
                network.iter().enumerate().map(|(i, &k)| { let input = v; v = segment(v, i, off(0, e, k)); input }).collect()
            })
            .collect();
        for &(j, start) in &order[1..] {
            let start = start.expect("every pass but the main one starts at a slot");
            let p = network.iter().position(|&k| positions[k] == start).expect("a slot's position");
            for (e, inputs) in stored.iter_mut().enumerate() {
                let mut v = inputs[p];
                for (i, &k) in network.iter().enumerate().skip(p) {
                    if i > p {
                        inputs[i] = v;
                    }
                    v = segment(v, i, off(j, e, k));
                }
                proptest::prop_assert_eq!(v, from_images(j, e), "pass {} env {} from {:?}", j, e, start);
            }
        }
        let first_off = |j: usize| {
            (0..configs.len())
                .filter_map(|e| network.iter().position(|&k| off(j, e, k)))
                .min()
                .expect("every pass but the main one switches a slot off in some env")
        };
        let latest_first: usize = n_slots + (1..passes).map(|j| n_slots - first_off(j)).sum::<usize>();
        proptest::prop_assert!(segments(&order, positions) <= latest_first);
    }
}
