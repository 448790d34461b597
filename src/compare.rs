//! `esper-ecs compare`: the table a user wants before believing any policy — every policy × run seed
//! trained with the same configuration, each run's mean final validation accuracy, and per policy the
//! mean ± sd over the seeds. Each run writes its own folder (`<out>/<policy>-seed<S>/`, with its
//! `metrics.jsonl` and `summary.json`); the comparison is written as `compare.json` and `compare.csv`.

use crate::config::{ConfigError, PolicyKind, RunConfig, RunPlan};
use crate::profile::{mean, min_max};
use crate::run::{self, RunError, write_atomically};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// One policy × seed run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CompareRun {
    pub policy: String,
    pub seed: u64,
    /// The run's mean over envs of the final validation accuracy (pp).
    pub mean_final_val_accuracy: f64,
    pub seeds_germinated: u64,
    pub seeds_fossilized: u64,
    pub wall_seconds: f64,
    /// Stopped by Ctrl-C before its last epoch (its figure is not comparable).
    pub interrupted: bool,
    /// The run's folder.
    pub out_dir: PathBuf,
}

/// One policy over every seed that completed.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PolicyStats {
    pub policy: String,
    /// Completed runs.
    pub runs: usize,
    /// Mean over the seeds of the runs' mean final validation accuracy (pp).
    pub mean: f64,
    /// Sample standard deviation over the seeds (0 with one run).
    pub sd: f64,
    pub min: f64,
    pub max: f64,
}

/// Everything `compare` measured; also `compare.json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CompareReport {
    /// The configuration every run shares (its `policy` and `seed` are each run's own).
    pub config: RunConfig,
    pub policies: Vec<String>,
    pub seeds: Vec<u64>,
    pub runs: Vec<CompareRun>,
    pub stats: Vec<PolicyStats>,
    pub interrupted: bool,
}

/// Mean and sample standard deviation.
pub fn mean_sd(values: &[f64]) -> (f64, f64) {
    let m = mean(values);
    if values.len() < 2 {
        return (m, 0.0);
    }
    let var = values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (values.len() - 1) as f64;
    (m, var.sqrt())
}

/// The config of one run: `base` with the run's policy and seed. The learned policy's settings
/// (`--policy-checkpoint`, `--eval`, `--deterministic`) apply to the `ppo` runs only; with a checkpoint
/// the `ppo` runs evaluate it (`--eval` is implied), without one they train from scratch.
pub fn run_config(base: &RunConfig, policy: PolicyKind, seed: u64) -> RunConfig {
    let mut config = RunConfig { policy, seed, ..base.clone() };
    if policy == PolicyKind::Ppo {
        config.eval |= config.policy_checkpoint.is_some();
    } else {
        config.policy_checkpoint = None;
        config.eval = false;
        config.deterministic = false;
    }
    config
}

/// The plan of one run: [`run_config`], writing into `dir`.
pub fn run_plan(
    base: &RunConfig,
    policy: PolicyKind,
    seed: u64,
    dir: &Path,
    force: bool,
) -> Result<RunPlan, ConfigError> {
    let config = RunConfig { out: Some(dir.to_path_buf()), ..run_config(base, policy, seed) };
    config.resolve(force, true)
}

/// Check every run's configuration before the first starts (a bad flag fails at once, not after
/// an hour of runs), without creating anything.
pub fn check(base: &RunConfig, policies: &[PolicyKind], seeds: &[u64]) -> Result<(), ConfigError> {
    for &seed in seeds {
        for &policy in policies {
            RunConfig { out: None, ..run_config(base, policy, seed) }
                .plan_in(PathBuf::new(), true)?
                .check_memory()?;
        }
    }
    if policies.is_empty() {
        return Err(ConfigError::Invalid { name: "--policies", reason: "give at least one policy".into() });
    }
    if seeds.is_empty() {
        return Err(ConfigError::Invalid { name: "--seeds", reason: "give at least one seed".into() });
    }
    Ok(())
}

/// What one `compare` runs.
pub struct CompareJob<'a> {
    /// The settings every run shares.
    pub base: &'a RunConfig,
    pub policies: &'a [PolicyKind],
    pub seeds: &'a [u64],
    /// The comparison's folder (already created); each run gets a folder inside it.
    pub out_dir: &'a Path,
    /// Write into run folders that exist.
    pub force: bool,
    /// Progress lines and each run's progress bar.
    pub progress: bool,
}

/// Run every policy × seed (policies outer, seeds inner) into `out_dir`, then write the comparison.
/// `on_line` receives each progress line. A stop request ends the current run after its epoch and
/// skips the rest; the report then holds the runs so far.
pub fn compare(
    job: &CompareJob,
    stop: &AtomicBool,
    mut on_line: impl FnMut(&str),
) -> Result<CompareReport, RunError> {
    let CompareJob { base, policies, seeds, out_dir, force, progress } = *job;
    let total = policies.len() * seeds.len();
    let mut runs = Vec::with_capacity(total);
    'all: for &policy in policies {
        for &seed in seeds {
            if stop.load(Ordering::SeqCst) {
                break 'all;
            }
            let dir = out_dir.join(format!("{policy}-seed{seed}"));
            let mut plan = run_plan(base, policy, seed, &dir, force).map_err(|e| RunError(e.to_string()))?;
            plan.quiet = !progress;
            plan.table = false;
            if progress {
                on_line(&format!("[{}/{total}] {policy}, seed {seed} → {}", runs.len() + 1, dir.display()));
            }
            let summary = run::train(&plan, stop)?;
            let run = CompareRun {
                policy: policy.to_string(),
                seed,
                mean_final_val_accuracy: summary.mean_final_val_accuracy,
                seeds_germinated: summary.seeds_germinated,
                seeds_fossilized: summary.seeds_fossilized,
                wall_seconds: summary.wall_seconds,
                interrupted: summary.interrupted,
                out_dir: dir,
            };
            if progress {
                on_line(&format!(
                    "      mean final val acc {:.2} %  ({} germinated, {} fossilized, {:.0} s){}",
                    run.mean_final_val_accuracy,
                    run.seeds_germinated,
                    run.seeds_fossilized,
                    run.wall_seconds,
                    if run.interrupted { "  — interrupted" } else { "" }
                ));
            }
            runs.push(run);
        }
    }
    let stats = policies
        .iter()
        .filter_map(|p| {
            let accs: Vec<f64> = runs
                .iter()
                .filter(|r| r.policy == p.name() && !r.interrupted)
                .map(|r| r.mean_final_val_accuracy)
                .collect();
            (!accs.is_empty()).then(|| {
                let (m, sd) = mean_sd(&accs);
                let (min, max) = min_max(&accs);
                PolicyStats { policy: p.to_string(), runs: accs.len(), mean: m, sd, min, max }
            })
        })
        .collect();
    let report = CompareReport {
        config: RunConfig { out: Some(out_dir.to_path_buf()), ..base.clone() },
        policies: policies.iter().map(|p| p.to_string()).collect(),
        seeds: seeds.to_vec(),
        interrupted: runs.len() < total || runs.iter().any(|r| r.interrupted),
        runs,
        stats,
    };
    write_report(out_dir, &report)?;
    Ok(report)
}

/// `compare.json` (the whole report) and `compare.csv` (one row per run).
pub fn write_report(out_dir: &Path, report: &CompareReport) -> Result<(), RunError> {
    let json = serde_json::to_string_pretty(report).map_err(|e| RunError(format!("compare.json: {e}")))?;
    write_atomically(&out_dir.join("compare.json"), &json)?;
    let mut csv = String::from(
        "policy,seed,mean_final_val_accuracy,seeds_germinated,seeds_fossilized,wall_seconds,interrupted\n",
    );
    for r in &report.runs {
        let _ = writeln!(
            csv,
            "{},{},{:.4},{},{},{:.1},{}",
            r.policy,
            r.seed,
            r.mean_final_val_accuracy,
            r.seeds_germinated,
            r.seeds_fossilized,
            r.wall_seconds,
            r.interrupted
        );
    }
    write_atomically(&out_dir.join("compare.csv"), &csv)
}

/// The comparison as a terminal table: per policy mean ± sd, then every run.
pub fn format_table(report: &CompareReport) -> String {
    let c = &report.config;
    let mut out = format!(
        "esper-ecs compare — {} envs × {} epochs × {} round(s), {} task, {} data; mean final validation \
         accuracy (%) over the envs of each run\n",
        c.envs,
        c.epochs,
        c.rounds,
        c.task,
        c.data.name()
    );
    let seed_cols: Vec<String> = report.seeds.iter().map(|s| format!("seed {s}")).collect();
    let _ = writeln!(
        out,
        "  {:<10} {:>16}  {}",
        "policy",
        "mean ± sd",
        seed_cols.iter().map(|s| format!("{s:>8}")).collect::<String>()
    );
    for policy in &report.policies {
        let stat = report.stats.iter().find(|s| &s.policy == policy);
        let summary = stat.map_or("–".to_string(), |s| format!("{:.2} ± {:.2}", s.mean, s.sd));
        let cells: String = report
            .seeds
            .iter()
            .map(|seed| {
                let run = report.runs.iter().find(|r| &r.policy == policy && r.seed == *seed);
                match run {
                    Some(r) if !r.interrupted => format!("{:>8.2}", r.mean_final_val_accuracy),
                    Some(_) => format!("{:>8}", "stopped"),
                    None => format!("{:>8}", "–"),
                }
            })
            .collect();
        let _ = writeln!(out, "  {policy:<10} {summary:>16}  {cells}");
    }
    if report.interrupted {
        let _ = writeln!(out, "  (interrupted: runs marked – did not run, `stopped` did not finish)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: 1, 2, 3, 4 → mean 2.5, sample variance (2.25 + 0.25 + 0.25 + 2.25)/3 = 5/3.
    #[test]
    fn mean_and_sample_sd_by_hand() {
        let (m, sd) = mean_sd(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_sd(&[7.0]), (7.0, 0.0));
    }
}
