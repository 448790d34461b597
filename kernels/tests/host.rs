//! The batched host: whole-network gradients against finite differences, and the batch-equivalence
//! guarantee of DESIGN §5 (env e trained inside a batch equals env e trained alone, bit for bit).

use esper_kernels::host::{HostArch, HostParams, HostWorkspace, SeedBank, Stacked, train::Trainer};
use esper_kernels::rng::{Purpose, StreamKey};

use crate::common;
use common::with_threads;

const TINY: HostArch = HostArch {
    in_channels: 3,
    image_size: 8,
    num_classes: 3,
    base_channels: 2,
    n_blocks: 2,
    kernel_size: 3,
    pool_layers: 2,
};

fn random_batch(arch: HostArch, envs: usize, batch: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
    let images = (0..envs * batch * arch.image_len()).map(|_| s.normal() as f32).collect();
    let labels = (0..envs * batch).map(|_| s.below(arch.num_classes as u64) as u8).collect();
    (images, labels)
}

/// Σ over envs of each env's mean cross-entropy, after a training forward.
fn total_loss(params: &HostParams<f64>, images: &[f64], labels: &[u8], batch: usize) -> f64 {
    let mut p = params.clone();
    let mut ws = HostWorkspace::<f64>::new(p.arch, p.n_envs(), batch);
    ws.forward_train(&mut p, &SeedBank::empty(&params.arch), images, labels);
    ws.loss.iter().sum()
}

#[test]
fn host_gradients_match_finite_differences() {
    let (envs, batch) = (2, 3);
    let params32 = HostParams::init(TINY, 11, 0, &[0, 1]);
    let mut params = params32.convert::<f64>();
    let (images, labels) = random_batch(TINY, envs, batch, 5);
    let images: Vec<f64> = images.iter().map(|&v| v as f64).collect();
    let mut ws = HostWorkspace::<f64>::new(TINY, envs, batch);
    let mut grads = Stacked::<f64>::zeros(envs, &TINY.tensor_lens());
    let base = params.clone();
    let mut bank = SeedBank::empty(&TINY);
    ws.forward_train(&mut params, &bank, &images, &labels);
    ws.backward(&base, &mut bank, &images, &mut grads);
    let h = 1e-6;
    for t in 0..grads.tensors.len() {
        let mut numeric = vec![0.0; grads.tensors[t].len()];
        for (i, slot) in numeric.iter_mut().enumerate() {
            let mut plus = base.clone();
            plus.weights.tensors[t][i] += h;
            let mut minus = base.clone();
            minus.weights.tensors[t][i] -= h;
            *slot = (total_loss(&plus, &images, &labels, batch)
                - total_loss(&minus, &images, &labels, batch))
                / (2.0 * h);
        }
        let analytic = &grads.tensors[t];
        let diff: f64 = analytic.iter().zip(&numeric).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = numeric.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(norm > 0.0, "tensor {t}: zero gradient");
        assert!(diff / norm <= 1e-4, "tensor {t}: relative error {}", diff / norm);
    }
}

fn train_steps(params: &mut HostParams<f32>, data: &[(Vec<f32>, Vec<u8>)], batch: usize) -> Vec<f32> {
    let mut ws = HostWorkspace::<f32>::new(params.arch, params.n_envs(), batch);
    train_steps_in(params, &mut ws, data)
}

/// One training step (no seeds) per batch of `data` in workspace `ws`: every step's per-env losses.
fn train_steps_in(
    params: &mut HostParams<f32>,
    ws: &mut HostWorkspace<f32>,
    data: &[(Vec<f32>, Vec<u8>)],
) -> Vec<f32> {
    let mut bank = SeedBank::empty(&params.arch);
    let mut trainer = Trainer::new(params, &bank);
    let mut losses = vec![];
    for (images, labels) in data {
        trainer.step(params, &mut bank, ws, images, labels, false);
        losses.extend_from_slice(&ws.loss);
    }
    losses
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn env_trained_in_a_batch_equals_env_trained_alone() {
    let arch = HostArch { image_size: 16, ..HostArch::CIFAR_BASELINE };
    let (envs, batch, steps) = (16, 8, 5);
    let ids: Vec<u64> = (0..envs as u64).collect();
    let data: Vec<(Vec<f32>, Vec<u8>)> =
        (0..steps).map(|s| random_batch(arch, envs, batch, 100 + s)).collect();
    let run_batch = || {
        let mut p = HostParams::init(arch, 7, 0, &ids);
        let losses = train_steps(&mut p, &data, batch);
        (p, losses)
    };
    let (batched, losses) = with_threads(2, run_batch);
    let (batched_1t, losses_1t) = with_threads(1, run_batch);
    assert_eq!(bits(&losses), bits(&losses_1t), "thread count changed the losses");
    for t in 0..batched.weights.tensors.len() {
        assert_eq!(
            bits(&batched.weights.tensors[t]),
            bits(&batched_1t.weights.tensors[t]),
            "threads: tensor {t}"
        );
    }
    let image_len = arch.image_len();
    for e in [0, 5, 15] {
        let mut alone = HostParams::init(arch, 7, 0, &[e as u64]);
        let chunk: Vec<(Vec<f32>, Vec<u8>)> = data
            .iter()
            .map(|(im, lb)| {
                (
                    im[e * batch * image_len..(e + 1) * batch * image_len].to_vec(),
                    lb[e * batch..(e + 1) * batch].to_vec(),
                )
            })
            .collect();
        let alone_losses = train_steps(&mut alone, &chunk, batch);
        let mine = batched.extract_env(e);
        assert_eq!(alone.weights, mine.weights, "env {e}: parameters differ from the batch");
        assert_eq!(alone.running_mean, mine.running_mean, "env {e}: running mean");
        assert_eq!(alone.running_var, mine.running_var, "env {e}: running var");
        let batch_losses: Vec<f32> = (0..steps as usize).map(|s| losses[s * envs + e]).collect();
        assert_eq!(bits(&alone_losses), bits(&batch_losses), "env {e}: losses");
    }
}

#[test]
fn host_init_matches_pytorch_defaults() {
    let p = HostParams::init(HostArch::CIFAR_BASELINE, 3, 0, &[0, 1]);
    assert_eq!(HostArch::CIFAR_BASELINE.param_count(), 6_418);
    let bound0 = 1.0 / (27.0f32).sqrt();
    assert!(p.weights.env(0, 0).iter().all(|v| v.abs() <= bound0));
    assert!(p.weights.env(0, 0).iter().any(|v| v.abs() > 0.8 * bound0), "spread over the bound");
    assert!(p.weights.env(1, 1).iter().all(|&v| v == 1.0) && p.weights.env(2, 1).iter().all(|&v| v == 0.0));
    assert_ne!(p.weights.env(0, 0), p.weights.env(0, 1), "envs draw their own init");
    assert!(p.running_var.iter().all(|v| v.iter().all(|&x| x == 1.0)));
}

/// The fused batch norm → ReLU → pool blocks give the same bits as the op-by-op blocks (the path a block
/// takes when a seed sits between its ReLU and its pool), so a seed in one env never changes another's.
#[test]
fn fused_blocks_equal_op_by_op_blocks_bit_for_bit() {
    // Odd sizes after the first pool: 10 → 5 → 2 (the pools drop a row and a column).
    let arch = HostArch { image_size: 10, ..HostArch::CIFAR_BASELINE };
    let (envs, batch, steps) = (3, 4, 3);
    let ids: Vec<u64> = (0..envs as u64).collect();
    let data: Vec<(Vec<f32>, Vec<u8>)> =
        (0..steps).map(|s| random_batch(arch, envs, batch, 40 + s)).collect();
    let run = |fuse: bool| {
        let mut params = HostParams::init(arch, 9, 0, &ids);
        let mut ws = HostWorkspace::<f32>::new(arch, envs, batch);
        ws.set_fusion(fuse);
        let losses = train_steps_in(&mut params, &mut ws, &data);
        ws.forward_eval(&params, &SeedBank::empty(&arch), &data[0].0);
        (params, losses, ws.logits.clone())
    };
    let (fused, fused_losses, fused_logits) = run(true);
    let (plain, plain_losses, plain_logits) = run(false);
    assert_eq!(bits(&fused_losses), bits(&plain_losses), "losses");
    assert_eq!(bits(&fused_logits), bits(&plain_logits), "eval logits");
    for t in 0..fused.weights.tensors.len() {
        assert_eq!(bits(&fused.weights.tensors[t]), bits(&plain.weights.tensors[t]), "tensor {t}");
    }
    for b in 0..arch.n_blocks {
        assert_eq!(bits(&fused.running_mean[b]), bits(&plain.running_mean[b]), "running mean {b}");
        assert_eq!(bits(&fused.running_var[b]), bits(&plain.running_var[b]), "running var {b}");
    }
}
