//! Per-env cost of one training step and one validation pass at E = 16 against E = 1, measured as
//! paired rounds so that the machine's drift cancels.
//!
//! `cargo bench --bench env_scaling` (add `-- ROUNDS` to change the number of rounds, default 8).
//!
//! Why not criterion: on a shared 2-core machine the speed drifts by ±10 % over seconds, more than the
//! difference being measured, and criterion times one case after the other. Here every round times 16
//! steps at E = 1 and one step at E = 16 (the same 16 env-steps of work) back to back, alternating which
//! goes first, and the per-round ratio is what is reported: its median, and in how many rounds E = 16 was
//! cheaper per env. The whole comparison runs on one thread and on all of them.

use esper_ecs::bench::Timing;
use esper_kernels::host::{HostArch, HostParams, HostWorkspace, SeedBank, train::Trainer};
use esper_kernels::rng::{Purpose, StreamKey};
use std::time::Instant;

const BATCH_PER_ENV: usize = 512;
const LARGE: usize = 16;

/// One env count's host, data and buffers.
struct Case {
    envs: usize,
    images: Vec<f32>,
    labels: Vec<u8>,
    params: HostParams<f32>,
    ws: HostWorkspace<f32>,
    bank: SeedBank<f32>,
    trainer: Trainer<f32>,
    /// The state every timed call starts from, so that E = 1 (16 calls per round) and E = 16 (one) time
    /// the same step of training, not hosts at different points of it.
    start: (HostParams<f32>, Trainer<f32>),
}

impl Case {
    fn new(arch: HostArch, envs: usize) -> Self {
        let ids: Vec<u64> = (0..envs as u64).collect();
        let mut s = StreamKey::new(1, 0, 0, Purpose::Test).stream(0);
        let images = (0..envs * BATCH_PER_ENV * arch.image_len()).map(|_| s.normal() as f32).collect();
        let labels = (0..envs * BATCH_PER_ENV).map(|_| s.below(arch.num_classes as u64) as u8).collect();
        let params = HostParams::init(arch, 1, 0, &ids);
        let bank = SeedBank::empty(&arch);
        let trainer = Trainer::new(&params, &bank);
        let ws = HostWorkspace::new(arch, envs, BATCH_PER_ENV);
        let start = (params.clone(), trainer.clone());
        Self { envs, images, labels, params, ws, bank, trainer, start }
    }

    fn train_step(&mut self) {
        let Self { images, labels, params, ws, bank, trainer, .. } = self;
        trainer.step(params, bank, ws, images, labels, false);
    }

    fn validate(&mut self) {
        self.ws.forward_eval(&self.params, &self.bank, &self.images);
    }

    /// Milliseconds per env of `LARGE` env-steps of `work`: `LARGE / envs` timed calls, each from the
    /// starting state (restored outside the timing).
    fn ms_per_env(&mut self, work: fn(&mut Self)) -> f64 {
        let mut seconds = 0.0;
        for _ in 0..LARGE / self.envs {
            self.params.clone_from(&self.start.0);
            self.trainer.clone_from(&self.start.1);
            let start = Instant::now();
            work(self);
            seconds += start.elapsed().as_secs_f64();
        }
        seconds * 1e3 / LARGE as f64
    }
}

/// Per-round `(E = 1 ms/env, E = 16 ms/env)`.
fn paired_rounds(
    single: &mut Case,
    batched: &mut Case,
    rounds: usize,
    work: fn(&mut Case),
) -> Vec<(f64, f64)> {
    work(single);
    work(batched);
    (0..rounds)
        .map(|r| {
            if r % 2 == 0 {
                let a = single.ms_per_env(work);
                (a, batched.ms_per_env(work))
            } else {
                let b = batched.ms_per_env(work);
                (single.ms_per_env(work), b)
            }
        })
        .collect()
}

fn report(threads: usize, what: &str, pairs: &[(f64, f64)]) {
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| b / a).collect();
    let single = Timing::of(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
    let batched = Timing::of(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
    // A `Timing` of ratios: median, min and max of the dimensionless per-round ratio.
    let ratio = Timing::of(&ratios);
    let lower = ratios.iter().filter(|r| **r < 1.0).count();
    println!(
        "{threads:>7}  {what:<8}  {:>10.2}  {:>11.2}  {:>11.3}  {:>5.3}–{:<5.3}  {lower:>2} of {}",
        single.median_ms,
        batched.median_ms,
        ratio.median_ms,
        ratio.min_ms,
        ratio.max_ms,
        pairs.len()
    );
}

fn main() {
    let rounds = match std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        None => 8,
        Some(a) => match a.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("env_scaling: the number of rounds must be a whole number above 0, not {a:?}");
                std::process::exit(2);
            }
        },
    };
    let arch = HostArch::CIFAR_BASELINE;
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut thread_counts = vec![1];
    if all > 1 {
        thread_counts.push(all);
    }
    println!(
        "cifar_baseline, {BATCH_PER_ENV} images per env; each round: 16 steps at E = 1 and 1 step at E = {LARGE}"
    );
    println!(
        "{rounds} rounds, alternating which goes first; medians over rounds; ratio = E={LARGE} / E=1 per env"
    );
    println!("threads  work      E=1 ms/env  E={LARGE} ms/env  ratio (med)  range        E={LARGE} cheaper");
    for threads in thread_counts {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
        pool.install(|| {
            let mut single = Case::new(arch, 1);
            let mut batched = Case::new(arch, LARGE);
            let train = paired_rounds(&mut single, &mut batched, rounds, Case::train_step);
            report(threads, "train", &train);
            let validate = paired_rounds(&mut single, &mut batched, rounds, Case::validate);
            report(threads, "validate", &validate);
        });
    }
}
