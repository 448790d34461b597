//! The host with seeds in its slots: isolation invariants (kasmina §5.1, §8.1), blend gradients against
//! finite differences, and the batch-equivalence guarantee with mixed seed stages and blueprints.

use esper_kernels::host::train::Trainer;
use esper_kernels::host::{
    HostParams, HostWorkspace, SeedBank, SeedEnvState, SeedMode, SlotParams, SlotWorkspace, Stacked,
};
use esper_kernels::seeds::CnnBlueprint;

use crate::common;
use common::{ARCH, SLOTS, randomize_pools, seed_state as state, stream, with_threads};

fn random_batch(envs: usize, batch: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut s = stream(seed);
    let images = (0..envs * batch * ARCH.image_len()).map(|_| s.normal() as f32).collect();
    let labels = (0..envs * batch).map(|_| s.below(10) as u8).collect();
    (images, labels)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn incubating_seeds_leave_host_output_and_gradients_bit_identical() {
    let (envs, batch) = (3, 4);
    let ids: Vec<u64> = (0..envs as u64).collect();
    let (images, labels) = random_batch(envs, batch, 1);
    let run = |bank: &mut SeedBank<f32>| {
        let mut params = HostParams::init(ARCH, 3, 0, &ids);
        let base = params.clone();
        let mut ws = HostWorkspace::with_slots(ARCH, envs, batch, bank);
        let mut grads = Stacked::zeros(envs, &ARCH.tensor_lens());
        ws.forward_train(&mut params, bank, &images, &labels);
        ws.backward(&base, bank, &images, &mut grads);
        (ws.logits.clone(), grads)
    };
    let (plain_logits, plain_grads) = run(&mut SeedBank::empty(&ARCH));
    for bps in [
        [CnnBlueprint::ConvLight, CnnBlueprint::Attention, CnnBlueprint::Norm],
        [CnnBlueprint::Depthwise, CnnBlueprint::Bottleneck, CnnBlueprint::ConvHeavy],
    ] {
        let mut bank = SeedBank::new(&ARCH, envs, &SLOTS);
        randomize_pools(&mut bank, &mut stream(9));
        for slot in bank.slots_mut() {
            for (e, bp) in bps.iter().enumerate() {
                slot.state[e] = state(SeedMode::Incubator, *bp, 0.0);
            }
        }
        let (logits, grads) = run(&mut bank);
        assert_eq!(bits(&logits), bits(&plain_logits), "incubating seeds changed the host output");
        assert_eq!(grads, plain_grads, "incubating seeds changed the host gradient");
        for slot in bank.slots() {
            for (e, bp) in bps.iter().enumerate() {
                let g = slot.pool(*bp).grad_row(e);
                assert!(g.iter().any(|&v| v != 0.0), "{bp:?} in env {e} got no gradient");
            }
        }
    }
}

/// Evaluation skips a slot whose seeds all incubate (their value is exactly `h`), so it costs nothing and
/// keeps its block on the fused path; training runs them (the seeds learn through the straight-through
/// path).
#[test]
fn eval_never_runs_incubating_seeds() {
    let (envs, batch, c, size) = (2, 2, 4, 4);
    let mut slot = SlotParams::<f32>::new(envs, c, size);
    slot.state = vec![state(SeedMode::Incubator, CnnBlueprint::ConvLight, 0.0); envs];
    let h = vec![0.5f32; envs * batch * c * size * size];
    let mut ws = SlotWorkspace::new(envs, batch, c, size);
    assert!(!ws.forward(&slot, &h, false), "eval: incubators only, the slot is skipped");
    assert!(!slot.any_active_in(false) && slot.any_active_in(true));
    assert!(ws.forward(&slot, &h, true), "training runs the incubators");
    slot.state[1] = state(SeedMode::Add, CnnBlueprint::ConvLight, 0.5);
    assert!(ws.forward(&slot, &h, false), "eval runs a blending seed");
    assert_eq!(&ws.out[..ws.out.len() / 2], &h[..h.len() / 2], "the incubating env passes h");
}

/// A slot alone: `h` in, `y` out, with `L = Σ w·y` for a fixed random `w`.
fn slot_loss(slot: &SlotParams<f64>, h: &[f64], w: &[f64], batch: usize) -> f64 {
    let mut ws = SlotWorkspace::new(slot.n_envs(), batch, slot.channels, slot.size);
    assert!(ws.forward(slot, h, true));
    ws.out.iter().zip(w).map(|(y, w)| y * w).sum()
}

#[test]
fn cnn_add_blend_scales_the_host_gradient_by_one_minus_alpha() {
    let (envs, batch, c, size) = (2, 3, 4, 4);
    let mut slot = SlotParams::<f64>::new(envs, c, size);
    let mut s = stream(4);
    for v in &mut slot.pool_mut(CnnBlueprint::ConvLight).params {
        *v = 0.3 * s.normal();
    }
    slot.state = vec![state(SeedMode::Add, CnnBlueprint::ConvLight, 0.5); envs];
    let n = envs * batch * c * size * size;
    let h: Vec<f64> = (0..n).map(|_| s.normal()).collect();
    let mut ws = SlotWorkspace::new(envs, batch, c, size);
    ws.forward(&slot, &h, true);
    let mut dh = vec![0.0; n];
    ws.backward(&mut slot, &h, &vec![1.0; n], &mut dh);
    assert!(dh.iter().all(|&g| g == 0.5), "isolation: dL/dh = 1 − a for loss Σy");
    // a = 0: exactly the host; a = 1: exactly the seed output.
    slot.state[0].alpha = 0.0;
    slot.state[1].alpha = 1.0;
    ws.forward(&slot, &h, false);
    let per_env = n / envs;
    assert_eq!(&ws.out[..per_env], &h[..per_env]);
    let y1 = ws.out[per_env..].to_vec();
    slot.state[1].alpha = 0.5;
    ws.forward(&slot, &h, false);
    let mid = &ws.out[per_env..];
    // ADD is affine in a: y(0.5) = (h + y(1)) / 2.
    for ((m, h), y1) in mid.iter().zip(&h[per_env..]).zip(&y1) {
        assert!((m - (h + y1) / 2.0).abs() < 1e-12);
    }
}

#[test]
fn seed_and_gate_gradients_through_every_blend_match_finite_differences() {
    let (envs, batch, c, size) = (4, 2, 4, 4);
    let n = envs * batch * c * size * size;
    for bp in [CnnBlueprint::ConvLight, CnnBlueprint::Attention, CnnBlueprint::Norm, CnnBlueprint::Bottleneck]
    {
        let mut slot = SlotParams::<f64>::new(envs, c, size);
        let mut s = stream(bp as u64 + 10);
        for pool in slot.pools.iter_mut().chain([&mut slot.gate]) {
            for v in &mut pool.params {
                *v = 0.4 * s.normal();
            }
        }
        let modes = [SeedMode::Incubator, SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
        for (e, mode) in modes.into_iter().enumerate() {
            slot.state[e] = state(mode, bp, if mode == SeedMode::Incubator { 0.0 } else { 0.6 });
        }
        let h: Vec<f64> = (0..n).map(|_| s.normal()).collect();
        let w: Vec<f64> = (0..n).map(|_| s.normal()).collect();
        let mut ws = SlotWorkspace::new(envs, batch, c, size);
        ws.forward(&slot, &h, true);
        let mut dh = vec![0.0; n];
        ws.backward(&mut slot, &h, &w, &mut dh);
        let analytic_seed = slot.pool(bp).grads.clone();
        let analytic_gate = slot.gate.grads.clone();
        let eps = 1e-6;
        let fd = |slot: &mut SlotParams<f64>, gate: bool, i: usize| {
            let get = |s: &mut SlotParams<f64>| {
                if gate {
                    &mut s.gate.params[i] as *mut f64
                } else {
                    &mut s.pool_mut(bp).params[i] as *mut f64
                }
            };
            let p = get(slot);
            // SAFETY: `p` points into `slot`, which is alive and not otherwise borrowed here.
            unsafe { *p += eps };
            let plus = slot_loss(slot, &h, &w, batch);
            unsafe { *p -= 2.0 * eps };
            let minus = slot_loss(slot, &h, &w, batch);
            unsafe { *p += eps };
            (plus - minus) / (2.0 * eps)
        };
        // The incubator's value ignores the seed (STE), so its finite-difference reference is the same
        // seed under ADD at alpha 1, where y = s exactly and dy/ds = 1 as for the straight-through path.
        slot.state[0] = state(SeedMode::Add, bp, 1.0);
        let numeric_seed: Vec<f64> = (0..analytic_seed.len()).map(|i| fd(&mut slot, false, i)).collect();
        let numeric_gate: Vec<f64> = (0..analytic_gate.len()).map(|i| fd(&mut slot, true, i)).collect();
        let rel = |a: &[f64], b: &[f64]| {
            let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
            d / b.iter().map(|y| y * y).sum::<f64>().sqrt()
        };
        assert!(
            rel(&analytic_seed, &numeric_seed) <= 1e-4,
            "{bp:?}: seed gradient {}",
            rel(&analytic_seed, &numeric_seed)
        );
        assert!(
            rel(&analytic_gate, &numeric_gate) <= 1e-4,
            "{bp:?}: gate gradient {}",
            rel(&analytic_gate, &numeric_gate)
        );
        let row = slot.pool(bp).row_len;
        for e in 0..envs {
            assert!(analytic_seed[e * row..(e + 1) * row].iter().any(|&g| g != 0.0), "{bp:?} env {e}");
        }
        let gl = slot.gate.row_len;
        assert!(analytic_gate[..3 * gl].iter().all(|&g| g == 0.0), "only the GATE env has gate gradients");
        assert!(analytic_gate[3 * gl..].iter().any(|&g| g != 0.0));
    }
}

/// A group of envs that are not consecutive (gathered and scattered) gives every env the bits of the
/// same envs laid out consecutively (read in place): output, host gradient and seed/gate gradients.
#[test]
fn gathered_and_in_place_groups_give_the_same_bits() {
    let (batch, c, size) = (2, 4, 4);
    let sample = batch * c * size * size;
    let modes = [SeedMode::Incubator, SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
    for bp in [CnnBlueprint::ConvLight, CnnBlueprint::Attention, CnnBlueprint::ConvHeavy] {
        let mut s = stream(bp as u64 + 40);
        // Five envs, env 2 empty: the group is envs 0, 1, 3, 4 (gathered).
        let mut gapped = SlotParams::<f64>::new(5, c, size);
        for pool in gapped.pools.iter_mut().chain([&mut gapped.gate]) {
            for v in &mut pool.params {
                *v = 0.4 * s.normal();
            }
        }
        let members = [0usize, 1, 3, 4];
        for (&e, mode) in members.iter().zip(modes) {
            gapped.state[e] = state(mode, bp, if mode == SeedMode::Incubator { 0.0 } else { 0.6 });
        }
        // The same four envs, consecutive (read in place).
        let mut packed = SlotParams::<f64>::new(4, c, size);
        gapped.gather_rows(&members, &mut packed);
        let h: Vec<f64> = (0..5 * sample).map(|_| s.normal()).collect();
        let w: Vec<f64> = (0..5 * sample).map(|_| s.normal()).collect();
        let rows = |v: &[f64]| {
            members.iter().flat_map(|&e| v[e * sample..(e + 1) * sample].to_vec()).collect::<Vec<_>>()
        };
        let (h4, w4) = (rows(&h), rows(&w));
        let mut ws5 = SlotWorkspace::new(5, batch, c, size);
        let mut ws4 = SlotWorkspace::new(4, batch, c, size);
        assert!(ws5.forward(&gapped, &h, true) && ws4.forward(&packed, &h4, true));
        assert_eq!(rows(&ws5.out), ws4.out, "{bp:?}: outputs");
        assert_eq!(
            &ws5.out[2 * sample..3 * sample],
            &h[2 * sample..3 * sample],
            "{bp:?}: the empty env passes h"
        );
        let (mut dh5, mut dh4) = (vec![f64::NAN; 5 * sample], vec![f64::NAN; 4 * sample]);
        ws5.backward(&mut gapped, &h, &w, &mut dh5);
        ws4.backward(&mut packed, &h4, &w4, &mut dh4);
        assert_eq!(rows(&dh5), dh4, "{bp:?}: host gradients");
        assert_eq!(
            &dh5[2 * sample..3 * sample],
            &w[2 * sample..3 * sample],
            "{bp:?}: the empty env's gradient"
        );
        for (a, b) in gapped.pools.iter().chain([&gapped.gate]).zip(packed.pools.iter().chain([&packed.gate]))
        {
            for (i, &e) in members.iter().enumerate() {
                assert_eq!(a.grad_row(e), b.grad_row(i), "{bp:?}: parameter gradients of env {e}");
            }
        }
        assert!(gapped.pool(bp).grads.iter().any(|&g| g != 0.0), "{bp:?}: the seeds have gradients");
        assert!(gapped.gate.grads.iter().any(|&g| g != 0.0), "{bp:?}: the GATE env has gate gradients");
    }
}

/// 16 envs with a mix of empty, incubating, ADD, MULTIPLY and GATE seeds of every blueprint over three
/// slots; some frozen, one with its gate in the optimizer.
fn mixed_bank(envs: usize) -> SeedBank<f32> {
    let mut bank = SeedBank::new(&ARCH, envs, &SLOTS);
    randomize_pools(&mut bank, &mut stream(77));
    let mut s = stream(78);
    let modes = [SeedMode::Off, SeedMode::Incubator, SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
    for slot in bank.slots_mut() {
        for e in 0..envs {
            let mode = modes[s.below(5) as usize];
            let bp = CnnBlueprint::ALL[s.below(7) as usize];
            let alpha = if mode == SeedMode::Incubator { 0.0 } else { s.next_f64() as f32 };
            let mut st = if mode == SeedMode::Off { SeedEnvState::default() } else { state(mode, bp, alpha) };
            if mode != SeedMode::Off && s.below(4) == 0 {
                st.train_seed = false; // blend-out frozen
                st.gate_grad = false;
            }
            st.gate_step = mode == SeedMode::Gate && s.below(2) == 0;
            slot.state[e] = st;
        }
    }
    bank
}

fn train(
    params: &mut HostParams<f32>,
    bank: &mut SeedBank<f32>,
    data: &[(Vec<f32>, Vec<u8>)],
    batch: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut ws = HostWorkspace::with_slots(params.arch, params.n_envs(), batch, bank);
    let mut trainer = Trainer::new(params, bank);
    let mut losses = vec![];
    for (step, (images, labels)) in data.iter().enumerate() {
        trainer.step(params, bank, &mut ws, images, labels, step % 2 == 0);
        losses.extend_from_slice(&ws.loss);
    }
    ws.forward_eval(params, bank, &data[0].0);
    (losses, ws.logits.clone())
}

#[test]
fn mixed_seed_envs_in_a_batch_equal_each_env_trained_alone() {
    let (envs, batch, steps) = (16, 4, 5);
    let ids: Vec<u64> = (0..envs as u64).collect();
    let data: Vec<(Vec<f32>, Vec<u8>)> = (0..steps).map(|s| random_batch(envs, batch, 200 + s)).collect();
    let run = || {
        let mut params = HostParams::init(ARCH, 5, 0, &ids);
        let mut bank = mixed_bank(envs);
        let (losses, logits) = train(&mut params, &mut bank, &data, batch);
        (params, bank, losses, logits)
    };
    let (params, bank, losses, logits) = with_threads(2, run);
    let (params_1t, bank_1t, losses_1t, _) = with_threads(1, run);
    assert_eq!(bits(&losses), bits(&losses_1t));
    assert_eq!(params, params_1t);
    assert_eq!(bank, bank_1t);
    let initial_bank = mixed_bank(envs);
    let image_len = ARCH.image_len();
    let logits_len = batch * ARCH.num_classes;
    for e in 0..envs {
        let mut alone = HostParams::init(ARCH, 5, 0, &[e as u64]);
        let mut alone_bank = initial_bank.extract_env(e);
        let chunk: Vec<(Vec<f32>, Vec<u8>)> = data
            .iter()
            .map(|(im, lb)| {
                (
                    im[e * batch * image_len..(e + 1) * batch * image_len].to_vec(),
                    lb[e * batch..(e + 1) * batch].to_vec(),
                )
            })
            .collect();
        let (alone_losses, alone_logits) = train(&mut alone, &mut alone_bank, &chunk, batch);
        assert_eq!(alone, params.extract_env(e), "env {e}: host parameters");
        let mine = bank.extract_env(e);
        for (a, b) in alone_bank.slots().zip(mine.slots()) {
            for (pa, pb) in a.pools.iter().chain([&a.gate]).zip(b.pools.iter().chain([&b.gate])) {
                assert_eq!(bits(&pa.params), bits(&pb.params), "env {e}: seed parameters");
            }
        }
        let batch_losses: Vec<f32> = (0..steps as usize).map(|s| losses[s * envs + e]).collect();
        assert_eq!(bits(&alone_losses), bits(&batch_losses), "env {e}: losses");
        assert_eq!(
            bits(&alone_logits),
            bits(&logits[e * logits_len..(e + 1) * logits_len]),
            "env {e}: validation logits"
        );
    }
    // The run trained seeds: some seed parameters moved.
    assert_ne!(bank, mixed_bank(envs));
}

#[test]
fn allocated_seed_buffers_have_the_spec_parameter_counts() {
    // kasmina §7.1 at C = 8, 16, 32, 64, for the pools a slot allocates.
    let expected: [(CnnBlueprint, [usize; 4]); 7] = [
        (CnnBlueprint::Norm, [17, 33, 65, 129]),
        (CnnBlueprint::Attention, [40, 144, 544, 2112]),
        (CnnBlueprint::Depthwise, [152, 432, 1376, 4800]),
        (CnnBlueprint::Bottleneck, [720, 864, 1152, 4480]),
        (CnnBlueprint::ConvSmall, [80, 288, 1088, 4224]),
        (CnnBlueprint::ConvLight, [592, 2336, 9280, 36992]),
        (CnnBlueprint::ConvHeavy, [1184, 4672, 18560, 73984]),
    ];
    for (i, c) in [8, 16, 32, 64].into_iter().enumerate() {
        let slot = SlotParams::<f32>::new(3, c, 4);
        for (bp, counts) in expected {
            let pool = slot.pool(bp);
            assert_eq!(pool.row_len, counts[i], "{bp:?} at C={c}");
            assert_eq!(
                (pool.params.len(), pool.grads.len(), pool.momentum.len()),
                (3 * counts[i], 3 * counts[i], 3 * counts[i])
            );
        }
        assert_eq!(slot.gate.row_len, [81, 145, 273, 1057][i], "gate at C={c}");
    }
}

/// With at least as many envs as threads, a pooled block's backward hands its batch norm's input gradient
/// to the conv's backward an image at a time, per env, in runs of images; with fewer, the norm writes the
/// whole gradient and the conv's ops read it. Both give the same bits, on a fused block and on a block
/// whose slot r0 runs a seed (by ADD: in runs, the norm's sums and input gradient and the seed's backward
/// then take the pool's output gradient), with batches that take several runs (32×32 images, 7 per env:
/// runs of 5 and 2 at block 0). On two threads with two blueprints, each seed's unit (one env) runs its
/// whole-batch backward from the pooled gradient; attention, which takes its gradient whole, gets it from
/// the blend alone.
#[test]
fn host_backward_in_runs_of_images_equals_the_whole_batch_backward() {
    use esper_kernels::host::HostArch;
    let arch = HostArch::CIFAR_BASELINE;
    let (envs, batch) = (2, 7);
    let ids: Vec<u64> = (0..envs as u64).collect();
    let mut s = stream(31);
    let images: Vec<f32> = (0..envs * batch * arch.image_len()).map(|_| s.normal() as f32).collect();
    let labels: Vec<u8> = (0..envs * batch).map(|_| s.below(10) as u8).collect();
    let (light, heavy, attention) =
        (CnnBlueprint::ConvLight, CnnBlueprint::ConvHeavy, CnnBlueprint::Attention);
    let cases = [
        (None, 1),
        (Some([light, light]), 1),
        (Some([light, heavy]), 2),
        (Some([light, attention]), 1),
        (Some([attention, heavy]), 2),
    ];
    for (seeds, threads) in cases {
        let run = || {
            let slots: &[(u8, u8)] = if seeds.is_some() { &[(0, 0)] } else { &[] };
            let mut bank = SeedBank::new(&arch, envs, slots);
            randomize_pools(&mut bank, &mut stream(32));
            for slot in bank.slots_mut() {
                for (e, bp) in seeds.into_iter().flatten().enumerate() {
                    // Two amplitudes other than 0.5, so the host's share `1 − a` is neither `a` nor shared.
                    slot.state[e] = state(SeedMode::Add, bp, [0.3, 0.8][e]);
                }
            }
            let mut params = HostParams::init(arch, 3, 0, &ids);
            let base = params.clone();
            let mut ws = HostWorkspace::with_slots(arch, envs, batch, &bank);
            let mut grads = Stacked::zeros(envs, &arch.tensor_lens());
            ws.forward_train(&mut params, &bank, &images, &labels);
            ws.backward(&base, &mut bank, &images, &mut grads);
            (grads, bank)
        };
        // In runs (2 envs ≥ 1 or 2 threads) against the whole-batch ops (2 envs < 4 threads).
        let (in_runs, bank_in_runs) = with_threads(threads, run);
        let (whole, bank_whole) = with_threads(4, run);
        for (t, (a, b)) in in_runs.tensors.iter().zip(&whole.tensors).enumerate() {
            assert_eq!(bits(a), bits(b), "seeds {seeds:?}: host gradient tensor {t}");
            assert!(a.iter().filter(|v| **v != 0.0).count() > a.len() / 2, "tensor {t} has a gradient");
        }
        assert_eq!(bank_in_runs, bank_whole, "seeds {seeds:?}: seed gradients");
        let seed_grads: usize = bank_in_runs
            .slots()
            .map(|p| p.pools.iter().map(|q| q.grads.iter().filter(|g| **g != 0.0).count()).sum::<usize>())
            .sum();
        assert!(seeds.is_none() || seed_grads > 100, "seeds {seeds:?}: {seed_grads} non-zero seed gradients");
    }
}
