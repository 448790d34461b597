//! Learning checks on the embedded synthetic task: the cifar_baseline host trained for 5 epochs ends
//! between 40 % and 70 %, and a wider preset (cifar_highres, 16/32/64 channels) scores higher.

use esper_kernels::data::{Batcher, DataSource, Dataset, SyntheticSpec};
use esper_kernels::host::train::{Trainer, ValTotals, validate_batch};
use esper_kernels::host::{HostArch, HostParams, HostWorkspace, SeedBank};

/// Train one env for `epochs` epochs on the default synthetic task and return its test accuracy.
fn train_and_validate(arch: HostArch, epochs: u64, batch: usize) -> f64 {
    let seed = 0;
    let data = Dataset::load(&DataSource::Synthetic(SyntheticSpec::with_seed(seed))).unwrap();
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
fn baseline_host_learns_the_synthetic_task_and_a_wider_host_learns_more() {
    let baseline = train_and_validate(HostArch::CIFAR_BASELINE, 5, 128);
    assert!((40.0..=70.0).contains(&baseline), "cifar_baseline after 5 epochs: {baseline:.1} %");
    let wide = HostArch { base_channels: 16, ..HostArch::CIFAR_BASELINE };
    let wider = train_and_validate(wide, 5, 128);
    assert!(wider > baseline, "cifar_highres {wider:.1} % should beat cifar_baseline {baseline:.1} %");
    eprintln!("synthetic, 5 epochs: cifar_baseline {baseline:.1} %, cifar_highres {wider:.1} %");
}
