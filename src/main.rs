//! The `esper-ecs` binary: parses the command line (see [`esper_ecs::cli`]) and runs the subcommand.
//! Exit codes: 0 success (also after Ctrl-C), 1 the run failed, 2 bad input.

use clap::Parser;
use esper_components::TaskPreset;
use esper_ecs::bench::{self, BenchConfig, BenchSeeds};
use esper_ecs::cli::{
    BenchArgs, Cli, Command, CompareArgs, EXIT_BAD_INPUT, EXIT_RUN_FAILED, ProfileArgs, ProfileMode,
    ReplayArgs, SelftestArgs, TrainArgs,
};
use esper_ecs::profile;
use esper_ecs::run;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

fn main() -> ExitCode {
    // Usage errors (unknown flags, non-numeric values, unknown --data / --policy) exit 2 here, and no
    // subcommand prints the help to stderr with exit code 2.
    let cli = Cli::parse();
    match cli.command {
        Command::Train(args) => train(&args),
        Command::Compare(args) => compare_command(&args),
        Command::Replay(args) => replay_command(&args),
        Command::Profile(args) => profile_command(&args),
        Command::Bench(args) => bench_command(&args),
        Command::Selftest(args) => selftest_command(&args),
    }
}

/// `selftest --device cuda[:N]`: the CUDA kernels against their CPU twins (docs/gpu.md).
fn selftest_command(args: &SelftestArgs) -> ExitCode {
    let device = &args.device;
    let Some(ordinal) = bench::cuda_ordinal(device) else {
        return bad_input(format!(
            "selftest --device {device}: selftest checks the CUDA kernels against their CPU twins; give \
             --device cuda or cuda:N (the CPU ops are checked by cargo test)"
        ));
    };
    #[cfg(feature = "cuda")]
    return cuda_selftest(ordinal);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        bad_input(format!("--device {device}: {}", bench::cuda_unavailable()))
    }
}

#[cfg(feature = "cuda")]
fn cuda_selftest(ordinal: usize) -> ExitCode {
    use esper_kernels::cuda::{CacheOutcome, DEFAULT_ARCH, KernelCache, compile_all, parity};
    let cache = KernelCache::default_location();
    let start = std::time::Instant::now();
    let compiled = match compile_all(&cache, DEFAULT_ARCH) {
        Ok(compiled) => compiled,
        Err(e) => return failed(format!("a kernel did not compile: {e}")),
    };
    let where_ = cache.dir().map_or("no cache folder".to_string(), |d| d.display().to_string());
    println!(
        "kernels ({DEFAULT_ARCH}, cache: {where_}), {:.1} ms in all",
        start.elapsed().as_secs_f64() * 1e3
    );
    for (file, _, outcome) in &compiled {
        let how = if *outcome == CacheOutcome::Hit { "cache hit" } else { "compiled" };
        println!("  {:<16} {:>2} kernels  {how}", file.name, file.functions.len());
    }
    println!(
        "\n{:<40} {:<48} {:>9} {:>11} {:>9}  result",
        "kernel", "CPU twin", "elements", "max diff", "tolerance"
    );
    // Each row as soon as its group is done: a run cut short still shows how far it got.
    let mut print_row = |row: &parity::ParityRow| {
        let result = if row.passed() { "ok" } else { "FAILED" };
        println!(
            "{:<40} {:<48} {:>9} {:>11.3e} {:>9.1e}  {result}",
            row.kernel, row.twin, row.elements, row.max_diff, row.tolerance
        );
    };
    let rows = match parity::run(ordinal, &cache, &mut print_row) {
        Ok(rows) => rows,
        Err(e) => return failed(format!("no parity checks on cuda:{ordinal}: {e}")),
    };
    let failures = rows.iter().filter(|r| !r.passed()).count();
    if failures > 0 {
        return failed(format!("{failures} of {} parity checks failed", rows.len()));
    }
    println!("all {} parity checks passed on cuda:{ordinal}", rows.len());
    ExitCode::SUCCESS
}

fn replay_command(args: &ReplayArgs) -> ExitCode {
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let mut out = std::io::BufWriter::new(stdout.lock());
    let code = esper_ecs::replay::command::command(args, &mut out, &mut stderr.lock());
    // Flushing into a closed pipe (`| head`) is not a failure of the replay.
    let _ = std::io::Write::flush(&mut out);
    ExitCode::from(code)
}

fn bad_input(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

fn failed(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_RUN_FAILED)
}

/// The trace writer of a profiled run, where the second Ctrl-C can flush it before exiting.
static TRACE_GUARD: Mutex<Option<profile::TraceGuard>> = Mutex::new(None);

/// First Ctrl-C: sets the returned flag (the run stops after its current epoch and writes what it has)
/// and prints `first`. Second: exits at once with 130, flushing a chrome trace first, if one is being
/// written, so that it stays readable.
fn install_stop_handler(first: &'static str) -> Result<Arc<AtomicBool>, ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let handler_stop = Arc::clone(&stop);
    ctrlc::set_handler(move || {
        if handler_stop.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: exiting now");
            drop(TRACE_GUARD.lock().ok().and_then(|mut g| g.take()));
            std::process::exit(130);
        }
        eprintln!("\n{first}");
    })
    .map_err(|e| failed(format!("cannot install the Ctrl-C handler: {e}")))?;
    Ok(stop)
}

fn train(args: &TrainArgs) -> ExitCode {
    let chromes: Vec<&PathBuf> = args
        .profile
        .iter()
        .filter_map(|m| match m {
            ProfileMode::Chrome(path) => Some(path),
            ProfileMode::Table => None,
        })
        .collect();
    if chromes.len() > 1 {
        return bad_input("--profile chrome=FILE may be given once (add --profile table for the table)");
    }
    // A chrome=FILE that cannot be created is bad input: found before the run's folder is created.
    if let Some(path) = chromes.first()
        && let Err(e) = std::fs::File::create(path)
    {
        return bad_input(format!("--profile chrome={}: {e}", path.display()));
    }
    let remove_chrome = || {
        if let Some(path) = chromes.first() {
            let _ = std::fs::remove_file(path);
        }
    };
    let config = match args.to_config() {
        Ok(config) => config,
        Err(e) => {
            remove_chrome();
            return bad_input(e);
        }
    };
    // A GPU that cannot be used fails before any work, before the run's folder is made.
    if let Ok(device) = config.host_device()
        && let Err(e) = run::probe_device(device)
    {
        remove_chrome();
        return failed(e);
    }
    let plan = match config.resolve(args.force, args.quiet) {
        Ok(mut plan) => {
            plan.resume = args.resume.clone();
            plan.count_syncs = args.count_syncs;
            plan
        }
        Err(e) => {
            remove_chrome();
            return bad_input(e);
        }
    };
    // The trace goes to the chrome=FILE given, else (for `table`) into the run's folder.
    let table = args.profile.contains(&ProfileMode::Table);
    let trace_path =
        chromes.first().map(|p| p.to_path_buf()).or_else(|| table.then(|| plan.out_dir.join("trace.json")));
    if let Some(path) = &trace_path {
        match profile::install_chrome_trace(path) {
            Ok(guard) => *TRACE_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard),
            Err(e) => return bad_input(format!("--profile: {e}")),
        }
    }
    let stop = match install_stop_handler("stopping after the current epoch (Ctrl-C again to exit now)") {
        Ok(stop) => stop,
        Err(code) => return code,
    };
    let result = run::train(&plan, &stop);
    drop(TRACE_GUARD.lock().ok().and_then(|mut g| g.take())); // flushes and closes the trace
    if let Err(e) = result {
        return failed(e);
    }
    if let Some(path) = &trace_path {
        if table {
            match profile::load(path) {
                Ok(p) => {
                    let text = profile::format_table(&path.display().to_string(), &p);
                    print!("{text}");
                    let saved = plan.out_dir.join("profile.txt");
                    if let Err(e) = std::fs::write(&saved, &text) {
                        return failed(format!("{}: {e}", saved.display()));
                    }
                }
                Err(e) => return failed(e),
            }
        }
        if !args.quiet {
            println!("trace: {} (open in ui.perfetto.dev, or `esper-ecs profile {0}`)", path.display());
        }
    }
    ExitCode::SUCCESS
}

fn compare_command(args: &CompareArgs) -> ExitCode {
    let base = match args.to_config() {
        Ok(config) => config,
        Err(e) => return bad_input(e),
    };
    // Every run's configuration is checked before the folder is made or the first run starts.
    if let Err(e) = esper_ecs::compare::check(&base, &args.policies, &args.seeds) {
        return bad_input(e);
    }
    // A GPU (config key `device`) that cannot be used fails before the folder is made.
    if let Ok(device) = base.host_device()
        && let Err(e) = run::probe_device(device)
    {
        return failed(e);
    }
    let out_dir = match esper_ecs::config::prepare_compare_out(args.train.out.as_deref(), args.train.force) {
        Ok(dir) => dir,
        Err(e) => return bad_input(e),
    };
    let stop = match install_stop_handler(
        "stopping the current run after its epoch; the comparison of what ran is still written",
    ) {
        Ok(stop) => stop,
        Err(code) => return code,
    };
    let progress = !args.train.quiet;
    let job = esper_ecs::compare::CompareJob {
        base: &base,
        policies: &args.policies,
        seeds: &args.seeds,
        out_dir: &out_dir,
        force: args.train.force,
        progress,
    };
    let report = match esper_ecs::compare::compare(&job, &stop, |line| println!("{line}")) {
        Ok(report) => report,
        Err(e) => return failed(e),
    };
    print!("{}", esper_ecs::compare::format_table(&report));
    println!("  output {} (compare.json, compare.csv, one folder per run)", out_dir.display());
    ExitCode::SUCCESS
}

fn profile_command(args: &ProfileArgs) -> ExitCode {
    let a = match profile::load(&args.trace) {
        Ok(p) => p,
        Err(e) => return bad_input(e),
    };
    match &args.other {
        None => print!("{}", profile::format_table(&args.trace.display().to_string(), &a)),
        Some(other) => {
            let b = match profile::load(other) {
                Ok(p) => p,
                Err(e) => return bad_input(e),
            };
            let (a_name, b_name) = (args.trace.display().to_string(), other.display().to_string());
            print!("{}", profile::format_comparison(&a_name, &a, &b_name, &b));
        }
    }
    ExitCode::SUCCESS
}

fn bench_command(args: &BenchArgs) -> ExitCode {
    let Some(task) = TaskPreset::from_name(&args.task) else {
        let known: Vec<&str> = TaskPreset::ALL.iter().map(|t| t.name()).collect();
        return bad_input(format!("unknown task '{}' (known: {})", args.task, known.join(", ")));
    };
    let device = match run::HostDevice::parse(&args.device) {
        Ok(device) => device,
        Err(e @ run::DeviceError::NotBuilt) => return bad_input(format!("--device {}: {e}", args.device)),
        Err(e) => return bad_input(e),
    };
    if let Err(e) = esper_ecs::config::check_precision(device, args.precision) {
        return bad_input(e);
    }
    let seeds = match BenchSeeds::parse(&args.seeds) {
        Ok(seeds) => seeds,
        Err(message) => return bad_input(message),
    };
    let json_path = args.json.clone().unwrap_or_else(|| {
        PathBuf::from("runs").join(format!(
            "bench-{}.json",
            esper_ecs::config::utc_timestamp(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            )
        ))
    });
    if let Some(parent) = json_path.parent().filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return bad_input(format!("--json {}: cannot create {}: {e}", json_path.display(), parent.display()));
    }
    // Open the report now: a path that cannot be written is found before the measuring, not after.
    let mut json_file = match std::fs::File::create(&json_path) {
        Ok(file) => file,
        Err(e) => return bad_input(format!("--json {}: {e}", json_path.display())),
    };
    let config = BenchConfig {
        envs: args.envs.0.clone(),
        task,
        device,
        precision: args.precision.unwrap_or(esper_ecs::config::default_precision(device)),
        cuda_graphs: args.cuda_graphs,
        seeds,
        batch_per_env: args.batch_per_env as usize,
        train_batches: args.train_batches as usize,
        test_per_env: args.test_per_env as usize,
        warmup: args.warmup as usize,
        reps: args.reps as usize,
        seed: args.seed,
    };
    let report = match bench::run(&config, |line| println!("{line}")) {
        Ok(report) => report,
        Err(e) => {
            // Opened empty above: a failed bench leaves no report behind.
            drop(json_file);
            let _ = std::fs::remove_file(&json_path);
            return failed(e);
        }
    };
    let text = match serde_json::to_string_pretty(&report) {
        Ok(text) => text,
        Err(e) => return failed(format!("bench report: {e}")),
    };
    if let Err(e) = std::io::Write::write_all(&mut json_file, text.as_bytes()) {
        return failed(format!("{}: {e}", json_path.display()));
    }
    println!("report: {}", json_path.display());
    ExitCode::SUCCESS
}
