//! `esper-ecs replay` as a function of its arguments: what it prints on `out` and `err` and the exit
//! code it returns (0 done, 1 a divergence or a re-run that failed, 2 bad input). The binary calls it
//! with the process's stdout and stderr; tests call it in-process.

use super::{Exactness, VerifyError, VerifyOutcome, end_line, plot, report, verify, write_json};
use crate::cli::{EXIT_BAD_INPUT, EXIT_RUN_FAILED, ReplayArgs};
use crate::trace::{Trace, TraceEnd, partial_path};
use std::io::Write;

/// Runs `replay` for `args`. Errors are one `error: …` line on `err`.
pub fn command(args: &ReplayArgs, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let fail = |err: &mut dyn Write, code: u8, message: String| {
        let _ = writeln!(err, "error: {message}");
        code
    };
    if let Some(tol) = args.tolerance
        && !(tol.is_finite() && tol >= 0.0)
    {
        return fail(err, EXIT_BAD_INPUT, format!("--tolerance {tol}: must be a finite number ≥ 0"));
    }
    if !args.trace.exists() && partial_path(&args.trace).exists() {
        let message = format!(
            "{} does not exist, but {} does (a run still going, or killed): replay that",
            args.trace.display(),
            partial_path(&args.trace).display()
        );
        return fail(err, EXIT_BAD_INPUT, message);
    }
    let trace = match Trace::read(&args.trace) {
        Ok(t) => t,
        Err(e) => return fail(err, EXIT_BAD_INPUT, format!("{}: {e}", args.trace.display())),
    };
    if let TraceEnd::Truncated { .. } = trace.end {
        let _ = writeln!(err, "note: {}", end_line(&trace));
    }
    if args.json {
        return match write_json(&trace, out).and_then(|()| out.flush()) {
            Ok(()) => 0,
            // A closed pipe (`| head`) is not a failure of the replay.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
            Err(e) => fail(err, EXIT_RUN_FAILED, format!("writing JSON: {e}")),
        };
    }
    if let Some(path) = &args.plot {
        if let Err(e) = plot::render(&trace, path) {
            return fail(err, EXIT_BAD_INPUT, format!("--plot {}: {e}", path.display()));
        }
        let _ = writeln!(out, "wrote {}", path.display());
        return 0;
    }
    if !args.verify {
        let _ = write!(out, "{}", report(&trace));
        return 0;
    }
    let how = args.tolerance.map_or(Exactness::Exact, Exactness::Tolerance);
    let bar = (!args.quiet).then(|| {
        let bar = indicatif::ProgressBar::new(trace.steps.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("verifying {bar:30} {pos}/{len} steps  eta {eta}")
                .expect("static template"),
        );
        bar
    });
    let result = verify(&trace, how, args.rounds.clone(), |i| {
        if let Some(bar) = &bar {
            bar.set_position(i as u64);
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let what = match how {
        Exactness::Exact => {
            "every action, outcome, reward, metric and parameter checksum matches bit for bit".to_string()
        }
        Exactness::Tolerance(t) => {
            format!("every action and outcome matches, floats and parameter fingerprints within {t}")
        }
    };
    match result {
        Ok(VerifyOutcome::Match { steps, envs }) => {
            let _ = writeln!(out, "verified {steps} steps × {envs} envs of {}: {what}", args.trace.display());
            0
        }
        Ok(VerifyOutcome::Diverged(d)) => {
            let _ = writeln!(out, "{d}");
            EXIT_RUN_FAILED
        }
        Err(VerifyError::BadInput(e)) => fail(err, EXIT_BAD_INPUT, e),
        Err(VerifyError::Failed(e)) => fail(err, EXIT_RUN_FAILED, format!("the re-run failed: {e}")),
    }
}
