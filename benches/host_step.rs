//! One host training step and one validation pass over all envs, at E = 1, 4, 16, 64 with 512 images
//! per env (the reference's per-env batch), on CPU. Throughput is reported in images per second.
//!
//! `cargo bench --bench host_step` (add `-- train/16` to run one case). The target on 2 cores: at least
//! 6,500 training images/s at E = 16 (the reference's PyTorch speed), and a lower per-env time at E = 16
//! than at E = 1.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use esper_kernels::host::{HostArch, HostParams, HostWorkspace, SeedBank, train::Trainer};
use esper_kernels::rng::{Purpose, StreamKey};
use std::time::Duration;

const BATCH_PER_ENV: usize = 512;
const ENV_COUNTS: [usize; 4] = [1, 4, 16, 64];

fn batch(arch: HostArch, envs: usize) -> (Vec<f32>, Vec<u8>) {
    let mut s = StreamKey::new(1, 0, 0, Purpose::Test).stream(0);
    let images = (0..envs * BATCH_PER_ENV * arch.image_len()).map(|_| s.normal() as f32).collect();
    let labels = (0..envs * BATCH_PER_ENV).map(|_| s.below(arch.num_classes as u64) as u8).collect();
    (images, labels)
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
    group.finish();
}

criterion_group!(benches, host_step);
criterion_main!(benches);
