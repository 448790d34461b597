//! Learning checks on the embedded synthetic tasks, one env, 5 epochs of 64 batches of 128: the
//! cifar_baseline host learns the default task well above chance (measured 45.5 %; chance is 10 %) and
//! a wider host (cifar_highres, 16/32/64 channels) learns more (47.1 %); on the first, cluttered task the
//! host ends between 40 % and 70 % (49.4 %) and the wider host also scores higher (55.1 %).

use esper_kernels::data::{Batcher, DataSource, Dataset, SyntheticSpec};
use esper_kernels::host::train::{Trainer, ValTotals, validate_batch};
use esper_kernels::host::{HostArch, HostParams, HostWorkspace, SeedBank};

/// Train one env for `epochs` epochs on `spec` and return its test accuracy.
fn train_and_validate(spec: SyntheticSpec, arch: HostArch, epochs: u64, batch: usize) -> f64 {
    let seed = spec.seed;
    let data = Dataset::load(&DataSource::Synthetic(spec)).unwrap();
    let mut batcher = Batcher::new(&data, seed, 1, batch).unwrap();
    let mut params = HostParams::init(arch, seed, 0, &[0]);
    let mut ws = HostWorkspace::<f32>::new(arch, 1, batch);
    let mut bank = SeedBank::empty(&arch);
    let mut trainer = Trainer::new(&params, &bank);
    let mut images = vec![0.0f32; batch * data.image_len()];
    let mut labels = vec![0u8; batch];
    for epoch in 1..=epochs {
        batcher.begin_epoch(0, epoch);
        for b in 0..batcher.sharding().num_train_batches() {
            batcher.fill_train(&data, b, &mut images, &mut labels);
            trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, false);
        }
    }
    let mut totals = ValTotals::new(1);
    let mut counts = [0usize];
    for b in 0..batcher.sharding().num_test_batches() {
        batcher.fill_test(&data, b, &mut images, &mut labels, &mut counts);
        validate_batch(&params, &bank, &mut ws, &images, &labels, &counts, &mut totals);
    }
    assert_eq!(totals.total[0] as usize, data.n_test());
    totals.accuracy(0)
}

#[test]
fn baseline_host_learns_the_default_task_and_a_wider_host_learns_more() {
    let spec = SyntheticSpec::with_seed(0);
    let baseline = train_and_validate(spec, HostArch::CIFAR_BASELINE, 5, 128);
    let wide = HostArch { base_channels: 16, ..HostArch::CIFAR_BASELINE };
    let wider = train_and_validate(spec, wide, 5, 128);
    eprintln!("default synthetic, 5 epochs: cifar_baseline {baseline:.1} %, cifar_highres {wider:.1} %");
    assert!(baseline >= 25.0, "cifar_baseline after 5 epochs: {baseline:.1} % (chance is 10 %)");
    assert!(wider > baseline, "cifar_highres {wider:.1} % should beat cifar_baseline {baseline:.1} %");
}

#[test]
fn baseline_host_learns_the_cluttered_task_and_a_wider_host_learns_more() {
    let spec = SyntheticSpec::cluttered(0);
    let baseline = train_and_validate(spec, HostArch::CIFAR_BASELINE, 5, 128);
    assert!((40.0..=70.0).contains(&baseline), "cifar_baseline after 5 epochs: {baseline:.1} %");
    let wide = HostArch { base_channels: 16, ..HostArch::CIFAR_BASELINE };
    let wider = train_and_validate(spec, wide, 5, 128);
    assert!(wider > baseline, "cifar_highres {wider:.1} % should beat cifar_baseline {baseline:.1} %");
    eprintln!("cluttered synthetic, 5 epochs: cifar_baseline {baseline:.1} %, cifar_highres {wider:.1} %");
}

/// A conv_heavy seed at slot r0c1 incubates for 2 epochs, then blends in with ADD (alpha 0.5, then 1)
/// for 3: training does not break (the host+seed model still learns the task).
#[test]
fn a_blended_conv_heavy_seed_does_not_break_training() {
    use esper_kernels::host::{SeedEnvState, SeedMode};
    use esper_kernels::rng::{Purpose, StreamKey};
    use esper_kernels::seeds::CnnBlueprint;
    let (arch, seed, batch) = (HostArch::CIFAR_BASELINE, 0, 128);
    let data = Dataset::load(&DataSource::Synthetic(SyntheticSpec::cluttered(seed))).unwrap();
    let mut batcher = Batcher::new(&data, seed, 1, batch).unwrap();
    let mut params = HostParams::init(arch, seed, 0, &[0]);
    let mut bank = SeedBank::new(&arch, 1, &[(0, 1)]);
    let slot = bank.get_mut(0, 1).unwrap();
    slot.germinate(0, CnnBlueprint::ConvHeavy, false, StreamKey::new(seed, 0, 0, Purpose::SeedInit), 0);
    let mut ws = HostWorkspace::<f32>::with_slots(arch, 1, batch, &bank);
    let mut trainer = Trainer::new(&params, &bank);
    let mut images = vec![0.0f32; batch * data.image_len()];
    let mut labels = vec![0u8; batch];
    for epoch in 1..=5u64 {
        let (mode, alpha) = match epoch {
            1 | 2 => (SeedMode::Incubator, 0.0),
            3 => (SeedMode::Add, 0.5),
            _ => (SeedMode::Add, 1.0),
        };
        bank.get_mut(0, 1).unwrap().state[0] = SeedEnvState {
            mode,
            blueprint: Some(CnnBlueprint::ConvHeavy),
            alpha,
            train_seed: true,
            collect_stats: true,
            ..Default::default()
        };
        batcher.begin_epoch(0, epoch);
        for b in 0..batcher.sharding().num_train_batches() {
            batcher.fill_train(&data, b, &mut images, &mut labels);
            trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, b % 10 == 0);
        }
    }
    let stats = trainer.seed_stats[0][0].expect("collected on batch 0, 10, …");
    assert!(stats.norm.is_finite() && stats.health > 0.0);
    let mut totals = ValTotals::new(1);
    let mut counts = [0usize];
    for b in 0..batcher.sharding().num_test_batches() {
        batcher.fill_test(&data, b, &mut images, &mut labels, &mut counts);
        validate_batch(&params, &bank, &mut ws, &images, &labels, &counts, &mut totals);
    }
    let acc = totals.accuracy(0);
    eprintln!("synthetic, 5 epochs with a conv_heavy seed blended in: {acc:.1} %");
    assert!(acc >= 40.0, "training broke with a conv_heavy seed: {acc:.1} %");
}
