//! Profiling a run (DESIGN §8): the Chrome/Perfetto trace `train --profile` writes, and the per-system
//! table `train --profile table` and `esper-ecs profile` print from such a trace.
//!
//! Every system opens a span `<Set>::<system>` (target `esper`) carrying the env count and the step
//! index; the run driver adds `round`, `step` (the schedule plus the run's metrics writer) and
//! `Record::write_metrics`. Only spans of target `esper` are traced: bevy_ecs's own `trace` spans are
//! all named "system" and would double the file without telling more.
//!
//! The table is built from the trace file alone, so a saved trace can be read again later and two
//! runs can be compared. Device time (CUDA events, recorded as a span's `device_us` argument) has its
//! own columns; on CPU they show `–`. The training epoch's device time is recorded after validation,
//! when its results come back, as `train_device_us`, and shown on TrainHosts' row.

use serde_json::Value;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::path::{Path, PathBuf};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// The span target of everything esper-ecs traces.
pub const TARGET: &str = "esper";
/// The span that wraps one step.
pub const STEP_SPAN: &str = "step";
/// The system whose start ends the epoch boundary.
pub const TRAIN_SPAN: &str = "TrainHosts::train_hosts";
/// The system whose end starts the epoch boundary.
pub const VALIDATE_SPAN: &str = "Validate::validate";

/// Why a trace cannot be written or read.
#[derive(Debug)]
pub enum ProfileError {
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not a Chrome trace (a JSON array of events), or one without a single `step` span.
    Parse {
        path: PathBuf,
        message: String,
    },
    /// A tracing subscriber is already installed in this process.
    AlreadyInstalled,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Create { path, source } => {
                write!(f, "cannot create the trace {}: {source}", path.display())
            }
            Self::Read { path, source } => write!(f, "cannot read {}: {source}", path.display()),
            Self::Parse { path, message } => write!(f, "{}: {message}", path.display()),
            Self::AlreadyInstalled => write!(f, "a tracing subscriber is already installed"),
        }
    }
}

impl std::error::Error for ProfileError {}

/// Keeps the trace writer alive; dropping it flushes and closes the file.
pub struct TraceGuard(#[allow(dead_code)] tracing_chrome::FlushGuard);

/// Install a process-wide subscriber that writes every `esper` span to the Chrome trace `path`, one
/// track per thread. Process-wide because systems and kernels run on worker threads.
pub fn install_chrome_trace(path: &Path) -> Result<TraceGuard, ProfileError> {
    let file =
        File::create(path).map_err(|source| ProfileError::Create { path: path.to_path_buf(), source })?;
    let (layer, guard) = tracing_chrome::ChromeLayerBuilder::new()
        .writer(file)
        .include_args(true)
        .include_locations(false)
        .build();
    let only_ours = tracing_subscriber::filter::filter_fn(|meta| meta.target() == TARGET);
    let subscriber = tracing_subscriber::registry().with(layer.with_filter(only_ours));
    tracing::subscriber::set_global_default(subscriber).map_err(|_| ProfileError::AlreadyInstalled)?;
    Ok(TraceGuard(guard))
}

/// One closed span of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub name: String,
    pub tid: u64,
    pub start_us: f64,
    pub end_us: f64,
    /// The span's fields (`envs`, `step`, …; `device_us` on a CUDA device).
    pub args: serde_json::Map<String, Value>,
}

impl SpanRecord {
    pub fn duration_us(&self) -> f64 {
        self.end_us - self.start_us
    }
}

/// The profile of a trace file: [`read_trace`], then [`analyze`].
pub fn load(path: &Path) -> Result<Profile, ProfileError> {
    let spans = read_trace(path)?;
    analyze(&spans).map_err(|message| ProfileError::Parse { path: path.to_path_buf(), message })
}

/// Read a Chrome trace file (see [`parse_trace`]).
pub fn read_trace(path: &Path) -> Result<Vec<SpanRecord>, ProfileError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ProfileError::Read { path: path.to_path_buf(), source })?;
    parse_trace(&text).map_err(|message| ProfileError::Parse { path: path.to_path_buf(), message })
}

/// The closed spans of a Chrome trace: `B`/`E` pairs matched per thread, and `X` complete events. A
/// trace cut short (a run killed while its writer was mid-file) is read up to its last whole event —
/// tracing-chrome writes one event per line, so the lines are read one by one until one does not parse;
/// spans still open at the end are dropped.
pub fn parse_trace(text: &str) -> Result<Vec<SpanRecord>, String> {
    let events: Vec<Value> = match serde_json::from_str(text) {
        Ok(events) => events,
        Err(first) => {
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            if lines.next() != Some("[") {
                return Err(format!("not a Chrome trace (a JSON array of events): {first}"));
            }
            lines
                .map(|l| l.trim_end_matches(','))
                .take_while(|l| *l != "]")
                .map_while(|l| serde_json::from_str::<Value>(l).ok())
                .collect()
        }
    };
    let mut open: HashMap<u64, Vec<SpanRecord>> = HashMap::new();
    let mut spans = Vec::new();
    for event in &events {
        let field = |key: &str| event.get(key);
        let (Some(ph), Some(ts)) = (field("ph").and_then(Value::as_str), field("ts").and_then(Value::as_f64))
        else {
            continue; // metadata (thread names) and anything without a time
        };
        let tid = field("tid").and_then(Value::as_u64).unwrap_or(0);
        let name = field("name").and_then(Value::as_str).unwrap_or("").to_string();
        let args = field("args").and_then(Value::as_object).cloned().unwrap_or_default();
        match ph {
            "B" => {
                open.entry(tid).or_default().push(SpanRecord { name, tid, start_us: ts, end_us: ts, args })
            }
            "E" => {
                let stack = open.entry(tid).or_default();
                // Spans close innermost first; tolerate a missing end by closing back to the name.
                if let Some(i) = stack.iter().rposition(|s| s.name == name) {
                    let mut span = stack.remove(i);
                    stack.truncate(i);
                    span.end_us = ts;
                    // Fields recorded while the span was open (a device's `device_us`) come with its end.
                    span.args.extend(args);
                    spans.push(span);
                }
            }
            "X" => {
                let dur = field("dur").and_then(Value::as_f64).unwrap_or(0.0);
                spans.push(SpanRecord { name, tid, start_us: ts, end_us: ts + dur, args });
            }
            _ => {}
        }
    }
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    Ok(spans)
}

/// One system's (or driver stage's) timings over the run, in milliseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SystemRow {
    pub name: String,
    pub calls: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub total_ms: f64,
    /// `total_ms` over the total step time.
    pub share_of_step: f64,
    /// Device time (CUDA events), where the trace has it.
    pub device_mean_ms: Option<f64>,
    pub device_total_ms: Option<f64>,
    /// How its calls used CUDA graphs (the span's `graph` field: `replayed`, `captured`, `launches`,
    /// `capture failed`) and how many calls each, where the trace has it.
    pub graph: Vec<(String, usize)>,
}

/// What a trace says about a run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Profile {
    pub steps: usize,
    pub envs: Option<u64>,
    pub step_mean_ms: f64,
    pub step_p50_ms: f64,
    pub step_total_ms: f64,
    /// Sorted by total time, largest first.
    pub systems: Vec<SystemRow>,
    /// Host time per step from the end of Validate up to the next TrainHosts (Observe … Record, the
    /// metrics writer, an episode-end reset; the end of the last step): the epoch boundary.
    pub boundary_mean_ms: Option<f64>,
    /// The boundaries' total over the run's time from the first step's start to the last step's end.
    pub boundary_share: Option<f64>,
}

/// A span argument as a number: tracing-chrome writes recorded fields as strings ("16"); a number is
/// accepted too.
pub fn arg_f64(args: &serde_json::Map<String, Value>, key: &str) -> Option<f64> {
    match args.get(key)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The arithmetic mean; 0 for no values.
pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
}

/// Smallest and largest value (+∞, −∞ when empty).
pub fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)))
}

/// The per-system table of a trace. Systems are the spans named `<Set>::<name>`.
pub fn analyze(spans: &[SpanRecord]) -> Result<Profile, String> {
    let steps: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == STEP_SPAN).collect();
    if steps.is_empty() {
        return Err("the trace holds no `step` span (was it written by `esper-ecs train --profile`?)".into());
    }
    let mut step_ms: Vec<f64> = steps.iter().map(|s| s.duration_us() / 1e3).collect();
    let step_total_ms: f64 = step_ms.iter().sum();
    let envs = arg_f64(&steps[0].args, "envs").map(|e| e as u64);

    let mut by_name: HashMap<&str, (Vec<f64>, Vec<f64>)> = HashMap::new();
    let mut graphs: HashMap<&str, Vec<(String, usize)>> = HashMap::new();
    for span in spans.iter().filter(|s| s.name.contains("::")) {
        let (host, device) = by_name.entry(&span.name).or_default();
        host.push(span.duration_us() / 1e3);
        if let Some(Value::String(how)) = span.args.get("graph") {
            // Recorded with `display` it is the bare word; a `&str` recorded as is comes quoted.
            let how = how.trim_matches('"').to_string();
            let counts = graphs.entry(&span.name).or_default();
            match counts.iter_mut().find(|(h, _)| *h == how) {
                Some((_, n)) => *n += 1,
                None => counts.push((how, 1)),
            }
        }
        if let Some(d) = arg_f64(&span.args, "device_us") {
            device.push(d / 1e3);
        }
        // The training epoch's device time is known only when its results come back, after validation:
        // the system that reads them records it as `train_device_us`, and it belongs to TrainHosts.
        if let Some(d) = arg_f64(&span.args, "train_device_us") {
            by_name.entry(TRAIN_SPAN).or_default().1.push(d / 1e3);
        }
    }
    let mut systems: Vec<SystemRow> = by_name
        .into_iter()
        .map(|(name, (mut host, device))| {
            host.sort_by(f64::total_cmp);
            let total_ms: f64 = host.iter().sum();
            SystemRow {
                name: name.to_string(),
                calls: host.len(),
                mean_ms: mean(&host),
                p50_ms: percentile(&host, 0.5),
                p95_ms: percentile(&host, 0.95),
                total_ms,
                share_of_step: total_ms / step_total_ms.max(f64::MIN_POSITIVE),
                device_mean_ms: (!device.is_empty()).then(|| mean(&device)),
                device_total_ms: (!device.is_empty()).then(|| device.iter().sum()),
                graph: graphs.remove(name).unwrap_or_default(),
            }
        })
        .collect();
    systems.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then_with(|| a.name.cmp(&b.name)));

    // The epoch boundary of each step: from the end of its (last) Validate up to the start of the next
    // TrainHosts (so an episode-end reset between rounds counts), or to the end of the run's last step.
    let validates: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == VALIDATE_SPAN).collect();
    let trains: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == TRAIN_SPAN).collect();
    let mut boundary = Vec::new();
    for (k, step) in steps.iter().enumerate() {
        let validate_end = validates
            .iter()
            .filter(|v| v.start_us >= step.start_us && v.end_us <= step.end_us)
            .map(|v| v.end_us)
            .fold(None, |acc: Option<f64>, end| Some(acc.map_or(end, |a| a.max(end))));
        let Some(from) = validate_end else { continue };
        let next_train =
            trains.iter().map(|t| t.start_us).filter(|&t| t >= from).fold(f64::INFINITY, f64::min);
        let to = if k + 1 < steps.len() { next_train.min(steps[k + 1].end_us) } else { step.end_us };
        boundary.push((to - from) / 1e3);
    }
    let run_ms = (steps[steps.len() - 1].end_us - steps[0].start_us) / 1e3;
    let boundary_total: f64 = boundary.iter().sum();
    step_ms.sort_by(f64::total_cmp);
    Ok(Profile {
        steps: steps.len(),
        envs,
        step_mean_ms: step_total_ms / steps.len() as f64,
        step_p50_ms: percentile(&step_ms, 0.5),
        step_total_ms,
        systems,
        boundary_mean_ms: (!boundary.is_empty()).then(|| boundary_total / boundary.len() as f64),
        boundary_share: (!boundary.is_empty()).then(|| boundary_total / run_ms.max(f64::MIN_POSITIVE)),
    })
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
}

/// The per-system table: calls, mean, p50, p95, total, share of the step (host time), then device
/// time, sorted by total; then the step and the epoch boundary.
pub fn format_table(source: &str, p: &Profile) -> String {
    let mut out = String::new();
    let envs = p.envs.map_or_else(String::new, |e| format!(" × {e} envs"));
    let _ = writeln!(
        out,
        "profile of {source}: {} steps{envs}, step mean {:.2} ms (p50 {:.2}), total {:.1} s",
        p.steps,
        p.step_mean_ms,
        p.step_p50_ms,
        p.step_total_ms / 1e3
    );
    let w = p.systems.iter().map(|r| r.name.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(out, "{:w$}  {:>6}  {:-^52}  {:-^22}", "", "", " host ms ", " device ms ");
    let _ = writeln!(
        out,
        "{:w$}  {:>6}  {:>10} {:>10} {:>10} {:>11} {:>7}  {:>10} {:>11}",
        "system", "calls", "mean", "p50", "p95", "total", "share", "mean", "total"
    );
    for r in &p.systems {
        let _ = writeln!(
            out,
            "{:w$}  {:>6}  {:>10.3} {:>10.3} {:>10.3} {:>11.3} {:>6.2}%  {:>10} {:>11}",
            r.name,
            r.calls,
            r.mean_ms,
            r.p50_ms,
            r.p95_ms,
            r.total_ms,
            100.0 * r.share_of_step,
            opt_ms(r.device_mean_ms),
            opt_ms(r.device_total_ms),
        );
    }
    for r in p.systems.iter().filter(|r| !r.graph.is_empty()) {
        let counts: Vec<String> = r.graph.iter().map(|(how, n)| format!("{n} {how}")).collect();
        let _ = writeln!(out, "CUDA graphs, {}: {} of {} calls", r.name, counts.join(", "), r.calls);
    }
    match (p.boundary_mean_ms, p.boundary_share) {
        (Some(ms), Some(share)) => {
            let _ = writeln!(
                out,
                "epoch boundary (end of Validate → next TrainHosts): {ms:.3} ms per step, {:.2} % of the run",
                100.0 * share
            );
        }
        _ => {
            let _ = writeln!(out, "epoch boundary: no Validate span inside the steps");
        }
    }
    out
}

/// Two runs side by side, system by system: mean per call in each and the ratio B / A (below 1: B is
/// faster). Rows in A's order (by total), then the systems only B has.
pub fn format_comparison(a_name: &str, a: &Profile, b_name: &str, b: &Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A = {a_name} ({} steps)\nB = {b_name} ({} steps)", a.steps, b.steps);
    let mut names: Vec<&str> = a.systems.iter().map(|r| r.name.as_str()).collect();
    names.extend(
        b.systems.iter().map(|r| r.name.as_str()).filter(|n| !a.systems.iter().any(|r| r.name == *n)),
    );
    let w = names.iter().map(|n| n.len()).max().unwrap_or(6).max("epoch boundary".len());
    let _ = writeln!(out, "{:w$}  {:>12} {:>12} {:>8}", "mean ms per call", "A", "B", "B/A");
    let row = |out: &mut String, name: &str, x: Option<f64>, y: Option<f64>| {
        let ratio = match (x, y) {
            (Some(x), Some(y)) if x > 0.0 => format!("{:.3}", y / x),
            _ => "–".to_string(),
        };
        let _ = writeln!(out, "{name:w$}  {:>12} {:>12} {ratio:>8}", opt_ms(x), opt_ms(y));
    };
    row(&mut out, "step", Some(a.step_mean_ms), Some(b.step_mean_ms));
    row(&mut out, "epoch boundary", a.boundary_mean_ms, b.boundary_mean_ms);
    let find = |p: &Profile, n: &str| p.systems.iter().find(|r| r.name == n).map(|r| r.mean_ms);
    for name in names {
        row(&mut out, name, find(a, name), find(b, name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ph: &str, name: &str, tid: u64, ts: f64) -> String {
        format!(r#"{{"ph":"{ph}","pid":1,"name":"{name}","tid":{tid},"ts":{ts},"args":{{"envs":"4"}}}}"#)
    }

    /// Two steps by hand: step 0 = [0, 100] µs with train 0–60, validate 60–80, masks 85–90 on another
    /// thread; 10 µs between steps; step 1 = [110, 310] with train 110–210, validate 210–260, masks
    /// 270–290.
    fn two_steps() -> String {
        let events = [
            r#"{"ph":"M","pid":1,"name":"thread_name","tid":1,"args":{"name":"main"}}"#.to_string(),
            ev("B", "step", 1, 0.0),
            ev("B", "TrainHosts::train_hosts", 1, 0.0),
            ev("E", "TrainHosts::train_hosts", 1, 60.0),
            ev("B", "Validate::validate", 1, 60.0),
            ev("E", "Validate::validate", 1, 80.0),
            ev("B", "Observe::build_masks", 2, 85.0),
            ev("E", "Observe::build_masks", 2, 90.0),
            ev("E", "step", 1, 100.0),
            ev("B", "step", 1, 110.0),
            ev("B", "TrainHosts::train_hosts", 1, 110.0),
            ev("E", "TrainHosts::train_hosts", 1, 210.0),
            ev("B", "Validate::validate", 2, 210.0),
            ev("E", "Validate::validate", 2, 260.0),
            ev("B", "Observe::build_masks", 1, 270.0),
            ev("E", "Observe::build_masks", 1, 290.0),
            ev("E", "step", 1, 310.0),
        ];
        format!("[\n{}\n]", events.join(",\n"))
    }

    #[test]
    fn table_numbers_match_a_hand_built_trace() {
        let spans = parse_trace(&two_steps()).unwrap();
        assert_eq!(spans.len(), 8);
        let p = analyze(&spans).unwrap();
        assert_eq!((p.steps, p.envs), (2, Some(4)));
        assert!((p.step_total_ms - 0.3).abs() < 1e-12 && (p.step_mean_ms - 0.15).abs() < 1e-12);
        let names: Vec<&str> = p.systems.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["TrainHosts::train_hosts", "Validate::validate", "Observe::build_masks"]);
        let train = &p.systems[0];
        assert_eq!(train.calls, 2);
        assert!((train.total_ms - 0.16).abs() < 1e-12 && (train.mean_ms - 0.08).abs() < 1e-12);
        assert!((train.p50_ms - 0.06).abs() < 1e-12 && (train.p95_ms - 0.1).abs() < 1e-12);
        assert!((train.share_of_step - 0.16 / 0.3).abs() < 1e-12);
        assert_eq!(train.device_mean_ms, None);
        // Boundary: (110 − 80) up to the next TrainHosts and (310 − 260) to the end, over the 310 µs run.
        assert!((p.boundary_mean_ms.unwrap() - 0.04).abs() < 1e-12);
        assert!((p.boundary_share.unwrap() - 0.08 / 0.31).abs() < 1e-12);
        let table = format_table("t.json", &p);
        assert!(table.contains("Observe::build_masks") && table.contains("25.81 % of the run"), "{table}");
        let widths: Vec<usize> = table.lines().skip(1).take(3).map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "header and rows align: {widths:?}\n{table}");
    }

    /// A device's time is recorded into the span while it is open, so tracing-chrome writes it with the
    /// span's end (as a string, as it writes every field): the table's device column reads it there.
    #[test]
    fn device_time_recorded_at_the_span_end_fills_the_device_column() {
        let with_device = |ts: f64, us: f64| {
            format!(
                r#"{{"ph":"E","pid":1,"name":"Validate::validate","tid":1,"ts":{ts},"args":{{"envs":"4","device_us":"{us}"}}}}"#
            )
        };
        let events = [
            ev("B", "step", 1, 0.0),
            ev("B", "Validate::validate", 1, 10.0),
            with_device(60.0, 40.0),
            ev("E", "step", 1, 100.0),
            ev("B", "step", 1, 100.0),
            ev("B", "Validate::validate", 1, 110.0),
            with_device(190.0, 70.0),
            ev("E", "step", 1, 200.0),
        ];
        let p = analyze(&parse_trace(&format!("[\n{}\n]", events.join(",\n"))).unwrap()).unwrap();
        let validate = p.systems.iter().find(|r| r.name == "Validate::validate").unwrap();
        assert_eq!(validate.calls, 2);
        assert!((validate.device_mean_ms.unwrap() - 0.055).abs() < 1e-12, "{validate:?}");
        assert!((validate.device_total_ms.unwrap() - 0.11).abs() < 1e-12, "{validate:?}");
        assert!((validate.total_ms - 0.13).abs() < 1e-12, "host time stays the span's own: {validate:?}");
    }

    /// The epoch's device time comes back after validation: the span that reads it records it as
    /// `train_device_us`, and the table shows it on TrainHosts' row, not on the reader's.
    #[test]
    fn the_epochs_device_time_read_after_validation_goes_to_train_hosts() {
        let reader_end = |ts: f64, us: f64| {
            format!(
                r#"{{"ph":"E","pid":1,"name":"Validate::record_train_metrics","tid":1,"ts":{ts},"args":{{"train_device_us":"{us}"}}}}"#
            )
        };
        let events = [
            ev("B", "step", 1, 0.0),
            ev("B", "TrainHosts::train_hosts", 1, 0.0),
            ev("E", "TrainHosts::train_hosts", 1, 5.0),
            ev("B", "Validate::record_train_metrics", 1, 60.0),
            reader_end(61.0, 3000.0),
            ev("E", "step", 1, 100.0),
        ];
        let p = analyze(&parse_trace(&format!("[\n{}\n]", events.join(",\n"))).unwrap()).unwrap();
        let row = |name: &str| p.systems.iter().find(|r| r.name == name).unwrap().clone();
        let (train, reader) = (row("TrainHosts::train_hosts"), row("Validate::record_train_metrics"));
        assert_eq!((train.calls, reader.calls), (1, 1));
        assert!((train.device_mean_ms.unwrap() - 3.0).abs() < 1e-12, "{train:?}");
        assert!((train.total_ms - 0.005).abs() < 1e-12, "host time stays the span's own: {train:?}");
        assert_eq!(reader.device_mean_ms, None, "{reader:?}");
    }

    /// How a device ran each epoch (the TrainHosts span's `graph` field) is counted per system and
    /// printed under the table; a failed capture shows as such.
    #[test]
    fn cuda_graph_use_is_counted_per_system_and_printed() {
        let end = |ts: f64, how: &str| {
            format!(
                r#"{{"ph":"E","pid":1,"name":"TrainHosts::train_hosts","tid":1,"ts":{ts},"args":{{"graph":"{how}"}}}}"#
            )
        };
        let mut events = Vec::new();
        for (k, how) in ["launches", "captured", "replayed", "replayed", "capture failed"].iter().enumerate()
        {
            let t = 100.0 * k as f64;
            events.push(ev("B", "step", 1, t));
            events.push(ev("B", "TrainHosts::train_hosts", 1, t));
            events.push(end(t + 50.0, how));
            events.push(ev("E", "step", 1, t + 100.0));
        }
        let p = analyze(&parse_trace(&format!("[\n{}\n]", events.join(",\n"))).unwrap()).unwrap();
        let train = p.systems.iter().find(|r| r.name == "TrainHosts::train_hosts").unwrap();
        let counts = |how: &str| train.graph.iter().find(|(h, _)| h == how).map_or(0, |c| c.1);
        assert_eq!(
            (counts("launches"), counts("captured"), counts("replayed"), counts("capture failed")),
            (1, 1, 2, 1)
        );
        let table = format_table("t.json", &p);
        assert!(
            table.contains("CUDA graphs, TrainHosts::train_hosts: 1 launches, 1 captured, 2 replayed, 1 capture failed of 5 calls"),
            "{table}"
        );
        // On the CPU no span has the field: no line.
        let cpu = analyze(&parse_trace(&two_steps()).unwrap()).unwrap();
        assert!(!format_table("t.json", &cpu).contains("CUDA graphs"));
    }

    #[test]
    fn a_cut_trace_is_read_to_its_last_whole_event() {
        let full = two_steps();
        let cut = &full[..full.rfind(",\n").unwrap() + 1]; // the last `E step` and `]` lost
        let spans = parse_trace(cut).unwrap();
        assert_eq!(spans.iter().filter(|s| s.name == "step").count(), 1, "the open step is dropped");
        // Cut in the middle of an event, as a killed writer leaves it.
        let mid = full.find("\"E\",\"pid\":1,\"name\":\"Observe::build_masks\",\"tid\":1").unwrap();
        let spans = parse_trace(&full[..mid]).unwrap();
        assert_eq!(spans.iter().filter(|s| s.name == "Validate::validate").count(), 2, "{spans:?}");
        assert_eq!(spans.iter().filter(|s| s.name == "step").count(), 1);
        assert!(parse_trace("not json").is_err());
        assert!(analyze(&[]).is_err(), "no step span is an error, not an empty table");
    }

    #[test]
    fn comparison_ratios_are_b_over_a() {
        let a = analyze(&parse_trace(&two_steps()).unwrap()).unwrap();
        let mut b = a.clone();
        b.step_mean_ms *= 0.5;
        b.systems[0].mean_ms *= 2.0;
        let text = format_comparison("a", &a, "b", &b);
        let line = |n: &str| text.lines().find(|l| l.starts_with(n)).unwrap().to_string();
        assert!(line("step ").ends_with("0.500"), "{text}");
        assert!(line("TrainHosts::train_hosts").ends_with("2.000"), "{text}");
        assert!(line("Validate::validate").ends_with("1.000"), "{text}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.95)), (10.0, 19.0));
        assert_eq!(percentile(&[7.0], 0.95), 7.0);
    }
}
