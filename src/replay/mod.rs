//! `esper-ecs replay`: reads a `trace.bin` (or the `.partial` of a run that was killed) and reports it,
//! verifies it by re-running its config, exports it as JSON lines, or draws it ([`plot`]).
//!
//! * [`report`]: the run config, a summary per round (mean final accuracy, mean return, ops by kind,
//!   seeds germinated / fossilized / pruned, rollbacks) and per env a lifecycle timeline, one line per
//!   slot, one character per epoch.
//! * [`verify`]: re-runs the recorded config (same build, CPU) step by step and compares every field of
//!   every env record exactly (floats bit for bit, the parameter checksum), or with `tolerance` every
//!   float within it and the parameter fingerprints instead of the checksum (a trace made on another
//!   device); stops at the first divergence.
//! * [`write_json`]: the header, then one JSON object per env per step, then how the trace ends.

pub mod command;
pub mod plot;

use crate::config::RunConfig;
use crate::run::Session;
use crate::trace::{Trace, TraceEnd};
use esper_components::{EpisodeReturn, LifecycleOp, OpOutcome, SeedStage};
use esper_kernels::policy::rollout::DEATH_PENALTY;
use esper_systems::write_trace::{
    EVENT_FOSSILIZED, EVENT_GERMINATED, EVENT_PRUNED, EnvStep, StepRecord, StepSink, TraceSink,
};
use std::fmt::Write as _;
use std::io::Write;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// One character per stage in the timeline; the epoch a seed germinates, fossilizes or is pruned shows
/// the upper-case mark of [`event_mark`] instead.
pub fn stage_char(stage: SeedStage) -> char {
    match stage {
        SeedStage::Unknown => '?',
        SeedStage::Dormant => '.',
        SeedStage::Germinated => 'g',
        SeedStage::Training => 't',
        SeedStage::Blending => 'b',
        SeedStage::Holding => 'h',
        SeedStage::Fossilized => 'f',
        SeedStage::Pruned => 'x',
        SeedStage::Embargoed => 'e',
        SeedStage::Resetting => 'r',
    }
}

/// The timeline's mark for a slot's events of one step: germinate `G`, fossilize `F`, prune `X`.
pub fn event_mark(events: u8) -> Option<char> {
    if events & EVENT_PRUNED != 0 {
        Some('X')
    } else if events & EVENT_GERMINATED != 0 {
        Some('G')
    } else if events & EVENT_FOSSILIZED != 0 {
        Some('F')
    } else {
        None
    }
}

/// The steps of each round, in order: `(round, steps)`.
pub fn rounds(trace: &Trace) -> Vec<(u64, &[StepRecord])> {
    let mut out: Vec<(u64, &[StepRecord])> = Vec::new();
    let mut start = 0;
    for i in 1..=trace.steps.len() {
        if i == trace.steps.len() || trace.steps[i].round != trace.steps[start].round {
            out.push((trace.steps[start].round, &trace.steps[start..i]));
            start = i;
        }
    }
    out
}

/// Per-round figures of the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundSummary {
    pub round: u64,
    pub epochs: usize,
    /// Mean over envs of the validation accuracy at the round's last recorded epoch.
    pub mean_final_acc: f64,
    /// Mean over envs of the round's summed raw reward.
    pub mean_return: f64,
    /// Executed ops other than WAIT, by op, in op order.
    pub ops: Vec<(LifecycleOp, usize)>,
    pub failed_ops: usize,
    pub germinated: usize,
    pub fossilized: usize,
    pub pruned: usize,
    pub rollbacks: usize,
}

/// One recorded step of an env into its episode return, as the run's `compute_rewards` counts it: a
/// rollback (no reward of its own) rewrites the env's rewards since its last one to the death penalty
/// (simic §1.6); a rewarded step adds its raw reward.
pub(crate) fn add_to_return(total: &mut EpisodeReturn, outcome: OpOutcome, reward: Option<f64>) {
    match (outcome, reward) {
        (OpOutcome::RolledBack, _) => total.end_with_rollback(f64::from(DEATH_PENALTY)),
        (_, Some(r)) => total.add(r),
        (_, None) => {}
    }
}

pub fn summarize_round(round: u64, steps: &[StepRecord]) -> RoundSummary {
    let mut s = RoundSummary { round, epochs: steps.len(), ..RoundSummary::default() };
    let Some(last) = steps.last() else { return s };
    let n_envs = last.envs.len().max(1);
    s.mean_final_acc = last.envs.iter().map(|e| e.val_acc).sum::<f64>() / n_envs as f64;
    let mut returns = vec![EpisodeReturn::default(); last.envs.len()];
    let mut ops = [0usize; LifecycleOp::COUNT];
    for step in steps {
        for (e, env) in step.envs.iter().enumerate() {
            if let Some(total) = returns.get_mut(e) {
                add_to_return(total, env.outcome, env.reward);
            }
            match env.outcome {
                OpOutcome::Executed if env.effective_op != LifecycleOp::Wait => {
                    ops[env.effective_op as usize] += 1
                }
                OpOutcome::RolledBack => s.rollbacks += 1,
                o if o.failed() => s.failed_ops += 1,
                _ => {}
            }
            for &events in &env.events {
                s.germinated += usize::from(events & EVENT_GERMINATED != 0);
                s.fossilized += usize::from(events & EVENT_FOSSILIZED != 0);
                s.pruned += usize::from(events & EVENT_PRUNED != 0);
            }
        }
    }
    s.mean_return = crate::profile::mean(&returns.iter().map(|r| r.raw).collect::<Vec<_>>());
    s.ops = LifecycleOp::ALL
        .iter()
        .filter(|&&op| ops[op as usize] > 0)
        .map(|&op| (op, ops[op as usize]))
        .collect();
    s
}

/// The readable report of a trace.
pub fn report(trace: &Trace) -> String {
    let h = &trace.header;
    let mut out = String::new();
    let commit = h.git_commit.as_deref().map_or(String::new(), |c| format!(" (commit {c})"));
    let _ = writeln!(
        out,
        "esper-ecs trace, format {}, written by esper-ecs {}{commit}",
        trace.version, h.program_version
    );
    let _ = writeln!(
        out,
        "run: {} envs, task {}, data {}, policy {}, seed {}, {} round(s) × {} epochs, slots {}",
        h.envs,
        h.task,
        h.data,
        h.policy,
        h.seed,
        h.rounds,
        h.epochs,
        h.slots.join(",")
    );
    let _ = writeln!(out, "     settings not at their default: {}", non_default_settings(&h.config_json));
    let _ = writeln!(out, "{}", end_line(trace));
    let rounds = rounds(trace);
    if rounds.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nround  epochs  final acc  return   germ  foss  prune  rollbacks  failed  ops (executed)"
    );
    for (round, steps) in &rounds {
        let s = summarize_round(*round, steps);
        let ops: Vec<String> = s.ops.iter().map(|(op, n)| format!("{} {n}", op.name())).collect();
        let _ = writeln!(
            out,
            "{:>5}  {:>6}  {:>8.2}%  {:>7.3}  {:>4}  {:>4}  {:>5}  {:>9}  {:>6}  {}",
            s.round,
            s.epochs,
            s.mean_final_acc,
            s.mean_return,
            s.germinated,
            s.fossilized,
            s.pruned,
            s.rollbacks,
            s.failed_ops,
            if ops.is_empty() { "-".to_string() } else { ops.join(", ") }
        );
    }
    let _ = writeln!(
        out,
        "\ntimeline: one character per epoch after its step: . dormant  g germinated  t training  b blending  \
         h holding  f fossilized  x pruned  e embargoed  r resetting; G germinate, F fossilize, X prune"
    );
    let slot_width = h.slots.iter().map(String::len).max().unwrap_or(4);
    for (round, steps) in &rounds {
        let _ = writeln!(out, "\nround {round}");
        let n_envs = steps.first().map_or(0, |s| s.envs.len());
        for e in 0..n_envs {
            let final_acc = steps.last().and_then(|s| s.envs.get(e)).map_or(f64::NAN, |r| r.val_acc);
            let _ = writeln!(out, "  env {e}  final val acc {final_acc:.2}%");
            for (k, name) in h.slots.iter().enumerate() {
                let mut line = String::with_capacity(steps.len());
                for step in steps.iter() {
                    let record = step.envs.get(e);
                    let now = record.and_then(|r| r.stages.get(k)).copied().unwrap_or(SeedStage::Unknown);
                    let events = record.and_then(|r| r.events.get(k)).copied().unwrap_or(0);
                    line.push(event_mark(events).unwrap_or(stage_char(now)));
                }
                let _ = writeln!(out, "    {name:<slot_width$}  {line}");
            }
        }
    }
    out
}

/// The run config's keys whose value is not `RunConfig::default()`'s, as `key = value` (the whole
/// config is in `--json`'s header line).
pub fn non_default_settings(config_json: &str) -> String {
    let Ok(serde_json::Value::Object(config)) = serde_json::from_str::<serde_json::Value>(config_json) else {
        return "(the config does not read)".to_string();
    };
    let defaults = serde_json::to_value(RunConfig::default()).unwrap_or_default();
    let changed: Vec<String> = config
        .iter()
        .filter(|(key, value)| defaults.get(key.as_str()) != Some(*value))
        .map(|(key, value)| format!("{key} = {value}"))
        .collect();
    if changed.is_empty() { "none".to_string() } else { changed.join(", ") }
}

/// One line saying how the record section ends.
pub fn end_line(trace: &Trace) -> String {
    let n_steps = trace.steps.len();
    let n_envs = trace.steps.first().map_or(0, |s| s.envs.len());
    match &trace.end {
        TraceEnd::Complete(f) => format!(
            "records: {n_steps} steps × {n_envs} envs, complete{}",
            if f.interrupted { " (the run was stopped by Ctrl-C)" } else { "" }
        ),
        TraceEnd::Truncated { chunks, offset, partial_bytes } => format!(
            "records: {n_steps} steps × {n_envs} envs; the trace has no footer: it stops after {chunks} complete chunks, \
             at byte {offset}{} (a run that was killed, or a cut file)",
            if *partial_bytes > 0 {
                format!(", followed by {partial_bytes} bytes of an incomplete chunk")
            } else {
                String::new()
            }
        ),
    }
}

/// `{"header": …}`, then one object per env per step (`round`, `epoch`, `step`, `env` and the record's
/// fields, ops, outcomes and stages by name), then `{"end": …}`.
pub fn write_json(trace: &Trace, out: &mut dyn Write) -> std::io::Result<()> {
    // The header's own fields, with the config as an object instead of its JSON text.
    let mut fields = serde_json::to_value(&trace.header)?;
    if let Some(map) = fields.as_object_mut() {
        let text = &trace.header.config_json;
        map.remove("config_json");
        map.insert(
            "config".into(),
            serde_json::from_str(text).unwrap_or(serde_json::Value::String(text.clone())),
        );
    }
    let header = serde_json::json!({ "format_version": trace.version, "header": fields });
    writeln!(out, "{header}")?;
    for step in &trace.steps {
        for (e, r) in step.envs.iter().enumerate() {
            let line = serde_json::json!({
                "round": step.round,
                "epoch": step.epoch,
                "step": step.step,
                "env": e,
                "action": r.action,
                "sampled_op": LifecycleOp::from_index(r.action.op).map_or("?", LifecycleOp::name),
                "effective_op": r.effective_op.name(),
                "outcome": r.outcome.name(),
                "reward": r.reward,
                "reward_norm": r.reward_norm,
                "val_acc": r.val_acc,
                "val_loss": r.val_loss,
                "train_acc": r.train_acc,
                "train_loss": r.train_loss,
                "stages": r.stages.iter().map(|s| s.name()).collect::<Vec<_>>(),
                "alphas": r.alphas,
                "checksum": format!("{:016x}", r.checksum),
                "fingerprint": r.fingerprint.iter().map(|p| [p.sum, p.sum_sq]).collect::<Vec<_>>(),
            });
            writeln!(out, "{line}")?;
        }
    }
    let end = match &trace.end {
        TraceEnd::Complete(f) => serde_json::json!({"complete": true, "steps": f.steps,
            "env_records": f.env_records, "rounds_completed": f.rounds_completed, "interrupted": f.interrupted}),
        TraceEnd::Truncated { chunks, offset, partial_bytes } => serde_json::json!({"complete": false,
            "chunks": chunks, "offset": offset, "partial_bytes": partial_bytes}),
    };
    writeln!(out, "{}", serde_json::json!({ "end": end }))
}

/// The first place a replay differs from the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    pub round: u64,
    pub epoch: u64,
    /// None: the step itself differs (its index or env count).
    pub env: Option<usize>,
    pub field: String,
    pub recorded: String,
    pub replayed: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "divergence at round {}, epoch {}", self.round, self.epoch)?;
        if let Some(env) = self.env {
            write!(f, ", env {env}")?;
        }
        write!(f, ": {} recorded {}, replayed {}", self.field, self.recorded, self.replayed)
    }
}

/// How floats are compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Exactness {
    /// Bit for bit, and the parameter checksum.
    Exact,
    /// `|a − b| ≤ tol · max(1, |a|, |b|)`, and the parameter fingerprints instead of the checksum.
    Tolerance(f64),
}

fn floats_match(a: f64, b: f64, how: Exactness) -> bool {
    match how {
        Exactness::Exact => a.to_bits() == b.to_bits(),
        // An infinity matches only itself: `|inf − x| ≤ tol · inf` would pass any x.
        Exactness::Tolerance(tol) => {
            (a.is_nan() && b.is_nan())
                || a == b
                || (a.is_finite() && b.is_finite() && (a - b).abs() <= tol * 1f64.max(a.abs()).max(b.abs()))
        }
    }
}

/// The first field where `replayed` differs from `recorded` (same step), if any.
pub fn compare_steps(recorded: &StepRecord, replayed: &StepRecord, how: Exactness) -> Option<Divergence> {
    let at = |env: Option<usize>, field: String, a: String, b: String| Divergence {
        round: recorded.round,
        epoch: recorded.epoch,
        env,
        field,
        recorded: a,
        replayed: b,
    };
    if (recorded.round, recorded.epoch, recorded.step) != (replayed.round, replayed.epoch, replayed.step) {
        return Some(at(
            None,
            "step (round, epoch, index)".into(),
            format!("({}, {}, {})", recorded.round, recorded.epoch, recorded.step),
            format!("({}, {}, {})", replayed.round, replayed.epoch, replayed.step),
        ));
    }
    if recorded.envs.len() != replayed.envs.len() {
        return Some(at(
            None,
            "env count".into(),
            recorded.envs.len().to_string(),
            replayed.envs.len().to_string(),
        ));
    }
    for (e, (a, b)) in recorded.envs.iter().zip(&replayed.envs).enumerate() {
        if let Some((field, x, y)) = compare_env(a, b, how) {
            return Some(at(Some(e), field, x, y));
        }
    }
    None
}

fn compare_env(a: &EnvStep, b: &EnvStep, how: Exactness) -> Option<(String, String, String)> {
    for head in esper_components::Head::ALL {
        if a.action.head(head) != b.action.head(head) {
            let (x, y) = (a.action.head(head), b.action.head(head));
            return Some((format!("sampled action head {}", head.name()), x.to_string(), y.to_string()));
        }
    }
    if a.effective_op != b.effective_op {
        return Some(("effective_op".into(), a.effective_op.name().into(), b.effective_op.name().into()));
    }
    if a.outcome != b.outcome {
        return Some(("outcome".into(), a.outcome.name().into(), b.outcome.name().into()));
    }
    if a.stages != b.stages {
        let names = |s: &[SeedStage]| s.iter().map(|s| s.name()).collect::<Vec<_>>().join(",");
        return Some(("stages".into(), names(&a.stages), names(&b.stages)));
    }
    let opt = |x: Option<f64>| x.map_or("none".to_string(), |v| format!("{v:?}"));
    for (name, x, y) in [("reward", a.reward, b.reward), ("reward_norm", a.reward_norm, b.reward_norm)] {
        let same = match (x, y) {
            (Some(x), Some(y)) => floats_match(x, y, how),
            (None, None) => true,
            _ => false,
        };
        if !same {
            return Some((name.into(), opt(x), opt(y)));
        }
    }
    for (name, x, y) in [
        ("val_acc", a.val_acc, b.val_acc),
        ("val_loss", a.val_loss, b.val_loss),
        ("train_acc", a.train_acc, b.train_acc),
        ("train_loss", a.train_loss, b.train_loss),
    ] {
        if !floats_match(x, y, how) {
            return Some((name.into(), format!("{x:?}"), format!("{y:?}")));
        }
    }
    if a.alphas.len() != b.alphas.len()
        || a.alphas.iter().zip(&b.alphas).any(|(&x, &y)| !floats_match(x, y, how))
    {
        return Some(("alphas".into(), format!("{:?}", a.alphas), format!("{:?}", b.alphas)));
    }
    match how {
        Exactness::Exact => {
            if a.checksum != b.checksum {
                return Some((
                    "parameter checksum".into(),
                    format!("{:016x}", a.checksum),
                    format!("{:016x}", b.checksum),
                ));
            }
        }
        Exactness::Tolerance(_) => {
            if a.fingerprint.len() != b.fingerprint.len() {
                return Some((
                    "parameter fingerprint groups".into(),
                    a.fingerprint.len().to_string(),
                    b.fingerprint.len().to_string(),
                ));
            }
            for (g, (x, y)) in a.fingerprint.iter().zip(&b.fingerprint).enumerate() {
                if !floats_match(x.sum, y.sum, how) || !floats_match(x.sum_sq, y.sum_sq, how) {
                    let group = if g == 0 { "host".to_string() } else { format!("slot {}", g - 1) };
                    return Some((
                        format!("parameter fingerprint ({group})"),
                        format!("sum {:?}, sum of squares {:?}", x.sum, x.sum_sq),
                        format!("sum {:?}, sum of squares {:?}", y.sum, y.sum_sq),
                    ));
                }
            }
        }
    }
    None
}

/// Collects the replayed run's latest step for the verifier.
struct Collector(Arc<Mutex<StepRecord>>);

impl StepSink for Collector {
    fn write_step(&mut self, step: &StepRecord) -> Result<(), String> {
        self.0.lock().map_err(|_| "collector poisoned".to_string())?.clone_from(step);
        Ok(())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Why `verify` could not give an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum VerifyError {
    /// The trace's config cannot be run here, or nothing in the trace is in the asked rounds (exit 2).
    BadInput(String),
    /// The re-run failed on the way (exit 1).
    Failed(String),
}

/// What `verify` found.
#[derive(Clone, Debug, PartialEq)]
pub enum VerifyOutcome {
    /// Every compared step matched.
    Match {
        steps: usize,
        envs: usize,
    },
    Diverged(Divergence),
}

/// Re-runs `trace`'s config and compares its steps with the recorded ones: every step of the rounds in
/// `rounds` (all when None) that the trace holds. Rounds before the range are re-run but not compared
/// (a round's start depends on the rounds before it, e.g. the observation normaliser). `on_step` is
/// called after every replayed step (progress).
pub fn verify(
    trace: &Trace,
    how: Exactness,
    rounds: Option<Range<u64>>,
    mut on_step: impl FnMut(usize),
) -> Result<VerifyOutcome, VerifyError> {
    let bad = VerifyError::BadInput;
    let config: RunConfig = serde_json::from_str(&trace.header.config_json)
        .map_err(|e| bad(format!("the trace's run config does not read: {e}")))?;
    if let Some(r) = &rounds
        && !trace.steps.iter().any(|s| r.contains(&s.round))
    {
        let held = match (trace.steps.first(), trace.steps.last()) {
            (Some(a), Some(b)) => format!("rounds {} to {}", a.round, b.round),
            _ => "no step".to_string(),
        };
        return Err(bad(format!("--rounds {}..{}: the trace holds {held}", r.start, r.end)));
    }
    if trace.steps.is_empty() {
        return Err(bad("the trace holds no step to verify".into()));
    }
    let plan = config
        .plan_in(std::env::temp_dir(), true)
        .map_err(|e| bad(format!("the trace's run config: {e}")))?;
    let mut session = Session::new(&plan).map_err(|e| bad(e.to_string()))?;
    let latest = Arc::new(Mutex::new(StepRecord::default()));
    session.world.insert_resource(TraceSink::new(Box::new(Collector(Arc::clone(&latest)))));
    let wanted = |round: u64| rounds.as_ref().is_none_or(|r| r.contains(&round));
    let last_round = rounds.as_ref().map_or(u64::MAX, |r| r.end);
    let (mut index, mut compared) = (0usize, 0usize);
    'rounds: for round in 0..plan.config.rounds as u64 {
        if round >= last_round {
            break;
        }
        session.start_round(round);
        for epoch in 1..=plan.config.epochs as u64 {
            let Some(recorded) = trace.steps.get(index) else { break 'rounds };
            session.run_epoch(epoch);
            if let Some(err) = session.world.resource::<TraceSink>().error() {
                return Err(VerifyError::Failed(err.to_string()));
            }
            index += 1;
            on_step(index);
            if wanted(recorded.round) {
                let replayed = latest.lock().map_err(|_| VerifyError::Failed("collector poisoned".into()))?;
                if let Some(d) = compare_steps(recorded, &replayed, how) {
                    return Ok(VerifyOutcome::Diverged(d));
                }
                compared += 1;
            }
        }
        session.finish_round();
    }
    if index < trace.steps.len() && rounds.is_none() {
        let extra = &trace.steps[index];
        return Ok(VerifyOutcome::Diverged(Divergence {
            round: extra.round,
            epoch: extra.epoch,
            env: None,
            field: "step".into(),
            recorded: "present".into(),
            replayed: "beyond the config's rounds × epochs".into(),
        }));
    }
    Ok(VerifyOutcome::Match { steps: compared, envs: trace.header.envs as usize })
}

/// Parses `--rounds`: `A..B` (rounds A to B−1), `A..=B`, or `A` (one round).
pub fn parse_rounds(s: &str) -> Result<Range<u64>, String> {
    let num = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("'{t}' is not a round number"));
    let range = if let Some((a, b)) = s.split_once("..=") {
        num(a)?..num(b)?.checked_add(1).ok_or("round number too large")?
    } else if let Some((a, b)) = s.split_once("..") {
        num(a)?..num(b)?
    } else {
        let a = num(s)?;
        a..a.checked_add(1).ok_or("round number too large")?
    };
    if range.is_empty() {
        return Err(format!("{s} holds no round (A..B means rounds A to B−1)"));
    }
    Ok(range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TraceFooter, test_header};
    use SeedStage::*;

    /// One env, one slot, a round following `stages` (after each step) with `events`, and `executed` ops.
    fn trace_of(stages: &[SeedStage], events: &[(usize, u8)], executed: &[(usize, LifecycleOp)]) -> Trace {
        let steps = stages
            .iter()
            .enumerate()
            .map(|(i, &stage)| {
                let op = executed.iter().find(|(at, _)| *at == i).map_or(LifecycleOp::Wait, |(_, op)| *op);
                let bits = events.iter().find(|(at, _)| *at == i).map_or(0, |(_, b)| *b);
                StepRecord {
                    round: 0,
                    epoch: i as u64 + 1,
                    step: i as u64,
                    envs: vec![EnvStep {
                        effective_op: op,
                        stages: vec![stage],
                        events: vec![bits],
                        alphas: vec![0.0],
                        val_acc: 10.0 + i as f64,
                        reward: Some(0.5),
                        ..EnvStep::default()
                    }],
                }
            })
            .collect();
        Trace {
            version: 1,
            header: test_header(1, 1, 1, stages.len() as u64),
            steps,
            end: TraceEnd::Complete(TraceFooter::default()),
            records: 0..0,
        }
    }

    #[test]
    fn timeline_marks_the_recorded_germinate_fossilize_and_prune_events() {
        // A prune's own tick already moves PRUNED on to EMBARGOED: the stage never shows it, the event does.
        let stages = [
            Dormant, Germinated, Training, Embargoed, Embargoed, Resetting, Dormant, Germinated, Training,
            Blending, Holding, Fossilized, Fossilized,
        ];
        let events =
            [(1, EVENT_GERMINATED), (3, EVENT_PRUNED), (7, EVENT_GERMINATED), (11, EVENT_FOSSILIZED)];
        let ops = [(1, LifecycleOp::Germinate), (3, LifecycleOp::Prune), (7, LifecycleOp::Germinate)];
        let trace = trace_of(&stages, &events, &ops);
        let report = report(&trace);
        let lane = report.lines().find(|l| l.trim_start().starts_with("r0c0")).unwrap();
        assert_eq!(lane.split_whitespace().nth(1), Some(".GtXer.GtbhFf"), "{report}");
        let s = summarize_round(0, &trace.steps);
        assert_eq!((s.germinated, s.fossilized, s.pruned, s.epochs), (2, 1, 1, 13));
        assert_eq!(s.ops, [(LifecycleOp::Germinate, 2), (LifecycleOp::Prune, 1)]);
        assert!((s.mean_return - 6.5).abs() < 1e-12 && (s.mean_final_acc - 22.0).abs() < 1e-12);
    }

    /// simic §1.6 as the run's `EpisodeReturn` counts it: a rollback (no reward of its own) rewrites the
    /// env's rewards since its last rollback to the death penalty. 13 steps of 0.5 with a rollback at
    /// step 4 (after 4 rewarded steps) and one at step 9: −10, then 4 steps to the second rollback
    /// (−10 again), then 3 steps: −20 + 1.5.
    #[test]
    fn round_return_counts_a_rollback_as_the_run_does() {
        let mut trace = trace_of(&[Dormant; 13], &[], &[]);
        for at in [4, 9] {
            let env = &mut trace.steps[at].envs[0];
            (env.outcome, env.reward) = (OpOutcome::RolledBack, None);
        }
        let s = summarize_round(0, &trace.steps);
        assert_eq!(s.rollbacks, 2);
        assert!((s.mean_return - (-20.0 + 1.5)).abs() < 1e-12, "{}", s.mean_return);
    }

    #[test]
    fn rounds_range_parses_half_open_inclusive_and_single() {
        assert_eq!(parse_rounds("2..4"), Ok(2..4));
        assert_eq!(parse_rounds("2..=4"), Ok(2..5));
        assert_eq!(parse_rounds("3"), Ok(3..4));
        assert!(parse_rounds("4..4").is_err() && parse_rounds("a..b").is_err() && parse_rounds("").is_err());
    }
}
