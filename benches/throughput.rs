//! The throughput bench (`cargo bench --bench throughput`): the same code as `esper-ecs bench`, at
//! 1, 4, 16 and 64 envs with its default workload (2 training batches of 64 images and 128
//! validation images per env per step, three BLENDING seeds per env), printing the table. For 256
//! envs, other presets or the JSON report use `esper-ecs bench` (see docs/profiling.md).

use esper_ecs::bench::{self, BenchConfig};

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing and wants a quick check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let config = if quick {
        BenchConfig {
            envs: vec![1, 2],
            batch_per_env: 8,
            test_per_env: 8,
            warmup: 0,
            reps: 1,
            ..BenchConfig::default()
        }
    } else {
        BenchConfig { envs: vec![1, 4, 16, 64], ..BenchConfig::default() }
    };
    if let Err(e) = bench::run(&config, |line| println!("{line}")) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
