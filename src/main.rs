//! The `esper-ecs` binary: parses the command line (see [`esper_ecs::cli`]), validates the run config
//! and runs it. Exit codes: 0 success (also after Ctrl-C), 1 the run failed, 2 bad input.

use clap::Parser;
use esper_ecs::cli::{Cli, Command, EXIT_BAD_INPUT, EXIT_RUN_FAILED, TrainArgs};
use esper_ecs::run;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

fn main() -> ExitCode {
    // Usage errors (unknown flags, non-numeric values, unknown --data / --policy) exit 2 here, and no
    // subcommand prints the help to stderr with exit code 2.
    let cli = Cli::parse();
    match cli.command {
        Command::Train(args) => train(&args),
    }
}

fn train(args: &TrainArgs) -> ExitCode {
    let plan = match args.to_config().and_then(|config| config.resolve(args.force, args.quiet)) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    // First Ctrl-C: finish the current epoch, then write the summary. Second: exit at once.
    let stop = Arc::new(AtomicBool::new(false));
    let handler_stop = Arc::clone(&stop);
    let handler = ctrlc::set_handler(move || {
        if handler_stop.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: exiting now");
            std::process::exit(130);
        }
        eprintln!("\nstopping after the current epoch (Ctrl-C again to exit now)");
    });
    if let Err(e) = handler {
        eprintln!("error: cannot install the Ctrl-C handler: {e}");
        return ExitCode::from(EXIT_RUN_FAILED);
    }
    match run::train(&plan, &stop) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_RUN_FAILED)
        }
    }
}
