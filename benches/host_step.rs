//! One host training step and one validation pass over all envs on CPU, 512 images per env (the
//! reference's per-env batch), in two workloads:
//! - `train/E`, `validate/E` (E = 1, 4, 16, 64): the plain host, no seeds;
//! - `train_seeded/E`, `eval_seeded/E`, `validate_seeded/E` (E = 1, 16): the forced state of
//!   `esper-ecs bench` — three BLENDING seeds per env (conv_light at r0c0, attention at r0c1,
//!   conv_heavy at r0c2; ADD at alpha 0.5). `eval_seeded` is one eval forward with those seeds;
//!   `validate_seeded` is the full counterfactual plan (8 configurations per env) through the fused
//!   validator, so `validate_seeded / (8 × eval_seeded)` is the share of a forward each configuration
//!   costs.
//!
//! `cargo bench --bench host_step` (add `-- train_seeded/16` to run one case). Throughput is reported in
//! training (or validation) images per second.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use esper_kernels::host::{
    FusedValidator, HostArch, HostParams, HostWorkspace, SeedBank, SeedEnvState, SeedMode, train::Trainer,
};
use esper_kernels::rng::{Purpose, StreamKey};
use esper_kernels::seeds::CnnBlueprint;
use std::time::Duration;

const BATCH_PER_ENV: usize = 512;
const ENV_COUNTS: [usize; 4] = [1, 4, 16, 64];
const SEEDED_ENV_COUNTS: [usize; 2] = [1, 16];
/// The forced state of `esper-ecs bench`: slot, blueprint.
const SEEDS: [((u8, u8), CnnBlueprint); 3] =
    [((0, 0), CnnBlueprint::ConvLight), ((0, 1), CnnBlueprint::Attention), ((0, 2), CnnBlueprint::ConvHeavy)];

fn batch(arch: HostArch, envs: usize) -> (Vec<f32>, Vec<u8>) {
    let mut s = StreamKey::new(1, 0, 0, Purpose::Test).stream(0);
    let images = (0..envs * BATCH_PER_ENV * arch.image_len()).map(|_| s.normal() as f32).collect();
    let labels = (0..envs * BATCH_PER_ENV).map(|_| s.below(arch.num_classes as u64) as u8).collect();
    (images, labels)
}

/// Every env with the three forced seeds, germinated from their own streams, blending (ADD) at 0.5.
fn seeded_bank(arch: HostArch, envs: usize) -> SeedBank<f32> {
    let slots: Vec<(u8, u8)> = SEEDS.iter().map(|&(id, _)| id).collect();
    let mut bank = SeedBank::new(&arch, envs, &slots);
    for (k, &(_, bp)) in SEEDS.iter().enumerate() {
        let slot = bank.slot_mut(k).unwrap();
        for e in 0..envs {
            slot.germinate(e, bp, false, StreamKey::new(1, 0, e as u64, Purpose::SeedInit), k as u64);
            slot.state[e] = SeedEnvState {
                mode: SeedMode::Add,
                blueprint: Some(bp),
                alpha: 0.5,
                train_seed: true,
                gate_grad: false,
                gate_step: false,
                collect_stats: true,
            };
        }
    }
    bank
}

fn host_step(c: &mut Criterion) {
    let arch = HostArch::CIFAR_BASELINE;
    let mut group = c.benchmark_group("host");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    for envs in ENV_COUNTS {
        let ids: Vec<u64> = (0..envs as u64).collect();
        let (images, labels) = batch(arch, envs);
        let mut params = HostParams::init(arch, 1, 0, &ids);
        let mut ws = HostWorkspace::<f32>::new(arch, envs, BATCH_PER_ENV);
        let mut bank = SeedBank::empty(&arch);
        let mut trainer = Trainer::new(&params, &bank);
        group.throughput(Throughput::Elements((envs * BATCH_PER_ENV) as u64));
        group.bench_function(BenchmarkId::new("train", envs), |b| {
            b.iter(|| trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, false))
        });
        group.bench_function(BenchmarkId::new("validate", envs), |b| {
            b.iter(|| ws.forward_eval(&params, &bank, &images))
        });
    }
    for envs in SEEDED_ENV_COUNTS {
        let ids: Vec<u64> = (0..envs as u64).collect();
        let (images, labels) = batch(arch, envs);
        let mut params = HostParams::init(arch, 1, 0, &ids);
        let mut bank = seeded_bank(arch, envs);
        let mut ws = HostWorkspace::<f32>::with_slots(arch, envs, BATCH_PER_ENV, &bank);
        let mut trainer = Trainer::new(&params, &bank);
        group.throughput(Throughput::Elements((envs * BATCH_PER_ENV) as u64));
        // Statistics on every 10th batch, as the loop collects them.
        let mut step = 0usize;
        group.bench_function(BenchmarkId::new("train_seeded", envs), |b| {
            b.iter(|| {
                trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, step.is_multiple_of(10));
                step += 1;
            })
        });
        group.bench_function(BenchmarkId::new("eval_seeded", envs), |b| {
            b.iter(|| ws.forward_eval(&params, &bank, &images))
        });
        let slot_ids: Vec<(u8, u8)> = SEEDS.iter().map(|&(id, _)| id).collect();
        let mut validator = FusedValidator::new(arch, &bank, &slot_ids, envs.clamp(1, 64), BATCH_PER_ENV);
        let fossilized = vec![vec![false; envs]; SEEDS.len()];
        let counts = vec![BATCH_PER_ENV; envs];
        validator.plan(&bank, &fossilized);
        assert_eq!(validator.virtual_env_count(), 8 * envs, "three seeds give 8 configurations per env");
        group.bench_function(BenchmarkId::new("validate_seeded", envs), |b| {
            b.iter(|| {
                validator.plan(&bank, &fossilized);
                validator.run_batch(&mut ws, &params, &mut bank, &images, &labels, &counts)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, host_step);
criterion_main!(benches);
