//! `trace.bin`: every step of a run, recorded as it runs, readable after a crash, and verifiable by
//! `esper-ecs replay --verify` (DESIGN §7).
//!
//! # Layout (format version [`FORMAT_VERSION`]; all integers little-endian)
//!
//! ```text
//! offset 0      magic          8 bytes  "ESPERTRC"
//!        8      version        u32      FORMAT_VERSION of the writer
//!       12      header length  u32      N
//!       16      header         N bytes  postcard(TraceHeader)
//!       16 + N  header CRC     u32      CRC-32 of bytes 8 .. 16 + N (version, length, header)
//! then frames, one after another, to the end of the file:
//!               kind           u8       b'C' a chunk (one step), b'F' the footer (last frame)
//!               length         u32      M
//!               ¬length        u32      the bitwise complement of M (a flipped length is caught
//!                                       before it is trusted)
//!               payload        M bytes  postcard(StepRecord) or postcard(TraceFooter)
//!               CRC            u32      CRC-32 of kind, length and payload
//! ```
//!
//! A run streams to `trace.bin.partial`, one chunk per step, flushed after each, and renames it to
//! `trace.bin` after the footer when it ends (also after Ctrl-C). A killed run leaves the `.partial`
//! file: its complete chunks read back, and the reader says where the file stops.
//!
//! Postcard is not self-describing: a record type that changes shape needs a new [`FORMAT_VERSION`];
//! the reader refuses traces newer than itself. The run config is stored as JSON text inside the
//! header, so a config that gains a field still reads. Wall-clock figures live in the header only
//! (`created_unix`): the record section of two runs of the same config is byte-identical.

use esper_systems::write_trace::{StepRecord, StepSink};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"ESPERTRC";
/// The layout and record types this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const KIND_CHUNK: u8 = b'C';
const KIND_FOOTER: u8 = b'F';
/// kind + length + ¬length.
const FRAME_HEAD: usize = 9;
/// A frame longer than this is corrupt, whatever its length field says (a step is about 165 bytes per
/// env with 3 slots: 4,096 envs with 8 slots take about 1.2 MB).
const MAX_FRAME: u32 = 256 << 20;

/// What a trace says about the run that wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub program_version: String,
    /// The git commit the binary was built from, when the build could tell.
    pub git_commit: Option<String>,
    /// The full run config (`RunConfig`) as JSON.
    pub config_json: String,
    pub task: String,
    pub data: String,
    pub policy: String,
    /// The run seed (every random stream derives from it).
    pub seed: u64,
    pub envs: u64,
    pub rounds: u64,
    pub epochs: u64,
    /// Enabled slots, canonical order (the order of every `[S]` row of a record).
    pub slots: Vec<String>,
    /// Seconds since the Unix epoch when the run started (the only wall-clock figure of a trace).
    pub created_unix: u64,
}

/// The last frame of a finished run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceFooter {
    pub steps: u64,
    /// Env records over all steps.
    pub env_records: u64,
    pub rounds_completed: u64,
    /// Stopped by Ctrl-C before its last epoch.
    pub interrupted: bool,
}

/// Why a file cannot be read as a trace. Every one is a bad input (exit 2).
#[derive(Debug, Clone, PartialEq)]
pub enum TraceError {
    Io(String),
    /// The first bytes are not [`MAGIC`] (or there are fewer than 8).
    NotATrace,
    /// Written by a newer format than this build reads.
    NewerVersion {
        found: u32,
    },
    /// The header is damaged or cut short.
    Header {
        reason: String,
    },
    /// A frame fails its checks: `checksum` its CRC, its length's complement or its kind (what a flipped
    /// byte hits); else its length limit, payload (does not decode, or leaves bytes over), its place (a
    /// step index out of sequence) or the footer's counts.
    Corrupt {
        chunk: u64,
        offset: u64,
        checksum: bool,
        reason: String,
    },
}

impl TraceError {
    /// A short name of the error's class (the property test checks it).
    pub fn class(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::NotATrace => "not_a_trace",
            Self::NewerVersion { .. } => "newer_version",
            Self::Header { .. } => "header",
            Self::Corrupt { .. } => "corrupt",
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => f.write_str(e),
            Self::NotATrace => {
                write!(f, "not an esper-ecs trace (no {:?} magic)", std::str::from_utf8(MAGIC).unwrap())
            }
            Self::NewerVersion { found } => write!(
                f,
                "trace format version {found} is newer than this build reads ({FORMAT_VERSION}): replay it with the \
                 esper-ecs that wrote it"
            ),
            Self::Header { reason } => write!(f, "trace header: {reason}"),
            Self::Corrupt { chunk, offset, checksum: true, reason } => {
                write!(f, "checksum error in chunk {chunk} at byte offset {offset} ({reason})")
            }
            Self::Corrupt { chunk, offset, checksum: false, reason } => {
                write!(f, "damaged chunk {chunk} at byte offset {offset}: {reason}")
            }
        }
    }
}

impl std::error::Error for TraceError {}

/// How the record section ends.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEnd {
    /// The footer was read.
    Complete(TraceFooter),
    /// No footer: the file stops after `chunks` complete chunks, at byte `offset` (a `.partial` trace
    /// of a killed run, or a cut file); `partial_bytes` of an incomplete frame follow.
    Truncated { chunks: u64, offset: u64, partial_bytes: u64 },
}

/// A decoded trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub version: u32,
    pub header: TraceHeader,
    pub steps: Vec<StepRecord>,
    pub end: TraceEnd,
    /// Byte range of the record section (the frames after the header, footer included when present).
    pub records: std::ops::Range<usize>,
}

impl Trace {
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let bytes = std::fs::read(path).map_err(|e| TraceError::Io(format!("{}: {e}", path.display())))?;
        Self::parse(&bytes)
    }

    /// Decodes a whole trace from memory. Never panics: every malformed input is an error.
    pub fn parse(bytes: &[u8]) -> Result<Trace, TraceError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(TraceError::NotATrace);
        }
        let short =
            || TraceError::Header { reason: format!("file ends inside the header ({} bytes)", bytes.len()) };
        let version = read_u32(bytes, 8).ok_or_else(short)?;
        let len = read_u32(bytes, 12).ok_or_else(short)? as usize;
        let end = 16usize.checked_add(len).filter(|&e| e.checked_add(4).is_some_and(|t| t <= bytes.len()));
        let Some(end) = end else {
            // A version from the future may have a different header: say that first.
            if version > FORMAT_VERSION {
                return Err(TraceError::NewerVersion { found: version });
            }
            return Err(short());
        };
        let crc = read_u32(bytes, end).ok_or_else(short)?;
        if crc32fast::hash(&bytes[8..end]) != crc {
            let newer = if version > FORMAT_VERSION {
                format!(" (or a newer format, version {version}, than this build reads)")
            } else {
                String::new()
            };
            return Err(TraceError::Header { reason: format!("checksum mismatch{newer}") });
        }
        if version > FORMAT_VERSION {
            return Err(TraceError::NewerVersion { found: version });
        }
        if version == 0 {
            return Err(TraceError::Header { reason: "format version 0 does not exist".into() });
        }
        let header: TraceHeader = decode_all(&bytes[16..end])
            .map_err(|e| TraceError::Header { reason: format!("does not decode: {e}") })?;
        let first = end + 4;
        let mut at = first;
        let mut steps: Vec<StepRecord> = Vec::new();
        loop {
            let chunk = steps.len() as u64;
            let corrupt =
                |reason: String| TraceError::Corrupt { chunk, offset: at as u64, checksum: false, reason };
            let truncated = |partial_bytes: usize| {
                let end = TraceEnd::Truncated {
                    chunks: chunk,
                    offset: at as u64,
                    partial_bytes: partial_bytes as u64,
                };
                (end, first..at)
            };
            let rest = bytes.len() - at;
            if rest < FRAME_HEAD {
                let (end, records) = truncated(rest);
                return Ok(Trace { version, header, steps, end, records });
            }
            let kind = bytes[at];
            let len = read_u32(bytes, at + 1).expect("checked");
            let not_len = read_u32(bytes, at + 5).expect("checked");
            // The complement and the kind are checks too: a flipped byte there is a checksum error.
            let checksum =
                |reason: String| TraceError::Corrupt { chunk, offset: at as u64, checksum: true, reason };
            if len != !not_len {
                return Err(checksum("the frame's length and its complement disagree".into()));
            }
            if kind != KIND_CHUNK && kind != KIND_FOOTER {
                return Err(checksum(format!("unknown frame kind {kind:#04x}")));
            }
            if len > MAX_FRAME {
                return Err(corrupt(format!("frame length {len} is over the {MAX_FRAME}-byte limit")));
            }
            let payload = at + FRAME_HEAD;
            let frame_end = payload + len as usize;
            if frame_end + 4 > bytes.len() {
                let (end, records) = truncated(rest);
                return Ok(Trace { version, header, steps, end, records });
            }
            if frame_crc(&bytes[at..payload], &bytes[payload..frame_end])
                != read_u32(bytes, frame_end).expect("checked")
            {
                return Err(checksum("CRC mismatch".into()));
            }
            let body = &bytes[payload..frame_end];
            let after = frame_end + 4;
            if kind == KIND_FOOTER {
                let footer: TraceFooter =
                    decode_all(body).map_err(|e| corrupt(format!("footer does not decode: {e}")))?;
                if after != bytes.len() {
                    return Err(corrupt(format!("{} bytes follow the footer", bytes.len() - after)));
                }
                // Chunks are checked one by one; the footer's counts catch a whole chunk gone missing.
                let env_records: u64 = steps.iter().map(|s| s.envs.len() as u64).sum();
                if (footer.steps, footer.env_records) != (steps.len() as u64, env_records) {
                    return Err(corrupt(format!(
                        "the footer counts {} steps and {} env records, the file holds {} and {env_records}",
                        footer.steps,
                        footer.env_records,
                        steps.len()
                    )));
                }
                return Ok(Trace {
                    version,
                    header,
                    steps,
                    end: TraceEnd::Complete(footer),
                    records: first..after,
                });
            }
            let step: StepRecord =
                decode_all(body).map_err(|e| corrupt(format!("record does not decode: {e}")))?;
            // Steps are written in order from 0: a repeated, swapped or missing chunk shows here.
            if step.step != chunk {
                return Err(corrupt(format!(
                    "step {} where step {chunk} belongs (a chunk missing, repeated or out of order)",
                    step.step
                )));
            }
            steps.push(step);
            at = after;
        }
    }
}

/// Decodes a whole payload: bytes left over after the value are an error (postcard would ignore them).
fn decode_all<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    let (value, rest) = postcard::take_from_bytes(bytes).map_err(|e| e.to_string())?;
    if rest.is_empty() { Ok(value) } else { Err(format!("{} bytes left over after the value", rest.len())) }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// A frame's CRC-32: over its kind and length (the first 5 bytes of its head) and its payload.
fn frame_crc(head: &[u8], payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&head[..5]);
    hasher.update(payload);
    hasher.finalize()
}

/// Writes a frame of `kind` around `payload` to `out` (a buffer, or the trace file's writer).
fn write_frame(kind: u8, payload: &[u8], out: &mut impl Write) -> std::io::Result<()> {
    let len = u32::try_from(payload.len()).expect("a frame fits in u32");
    let mut head = [0u8; FRAME_HEAD];
    head[0] = kind;
    head[1..5].copy_from_slice(&len.to_le_bytes());
    head[5..9].copy_from_slice(&(!len).to_le_bytes());
    out.write_all(&head)?;
    out.write_all(payload)?;
    out.write_all(&frame_crc(&head, payload).to_le_bytes())
}

/// The header bytes (magic through header CRC).
pub fn encode_header(header: &TraceHeader) -> Vec<u8> {
    let body = postcard::to_allocvec(header).expect("a header encodes");
    let mut out = Vec::with_capacity(20 + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&u32::try_from(body.len()).expect("header fits in u32").to_le_bytes());
    out.extend_from_slice(&body);
    let crc = crc32fast::hash(&out[8..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// One chunk frame for `step` (tests use it to build traces by hand).
pub fn encode_chunk(step: &StepRecord) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(KIND_CHUNK, &postcard::to_allocvec(step).expect("a record encodes"), &mut out)
        .expect("into memory");
    out
}

/// The footer frame.
pub fn encode_footer(footer: &TraceFooter) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame(KIND_FOOTER, &postcard::to_allocvec(footer).expect("a footer encodes"), &mut out)
        .expect("into memory");
    out
}

/// Streams a run's records to `<path>.partial` and renames it to `path` when finished.
pub struct TraceWriter {
    file: BufWriter<File>,
    partial: PathBuf,
    path: PathBuf,
    /// The reused encode buffer.
    payload: Vec<u8>,
    footer: TraceFooter,
}

impl TraceWriter {
    /// Creates `<path>.partial` and writes the header. An older trace at `path` (a run folder reused
    /// with `--force`) is removed first, so that it cannot be taken for this run's if this run is killed.
    pub fn create(path: &Path, header: &TraceHeader) -> std::io::Result<Self> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let partial = partial_path(path);
        let mut file = BufWriter::new(File::create(&partial)?);
        file.write_all(&encode_header(header))?;
        file.flush()?;
        Ok(Self {
            file,
            partial,
            path: path.to_path_buf(),
            payload: Vec::new(),
            footer: TraceFooter::default(),
        })
    }

    /// The footer, a flush to disk and the rename to the final name.
    pub fn finish(mut self, rounds_completed: u64, interrupted: bool) -> std::io::Result<PathBuf> {
        self.footer.rounds_completed = rounds_completed;
        self.footer.interrupted = interrupted;
        self.file.write_all(&encode_footer(&self.footer))?;
        self.file.flush()?;
        self.file.get_ref().sync_all()?;
        std::fs::rename(&self.partial, &self.path)?;
        Ok(self.path)
    }
}

impl StepSink for TraceWriter {
    fn write_step(&mut self, step: &StepRecord) -> Result<(), String> {
        self.payload.clear();
        self.payload =
            postcard::to_extend(step, std::mem::take(&mut self.payload)).map_err(|e| e.to_string())?;
        if self.payload.len() > MAX_FRAME as usize {
            return Err(format!(
                "a step of {} bytes is over the {MAX_FRAME}-byte frame limit",
                self.payload.len()
            ));
        }
        // Flushed per step: a run killed at any moment leaves every finished step readable.
        write_frame(KIND_CHUNK, &self.payload, &mut self.file)
            .and_then(|()| self.file.flush())
            .map_err(|e| format!("{}: {e}", self.partial.display()))?;
        self.footer.steps += 1;
        self.footer.env_records += step.envs.len() as u64;
        Ok(())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// Where a trace being written lives until it is finished: `<path>.partial`.
pub fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// The commit the binary was built from, when the build could ask git (see build.rs).
pub fn git_commit() -> Option<String> {
    option_env!("ESPER_GIT_COMMIT").filter(|c| !c.is_empty()).map(str::to_string)
}

/// A header for hand-built traces in tests: a heuristic run on cifar_baseline, slots `r0c0, r0c1, …`.
#[cfg(test)]
pub(crate) fn test_header(envs: u64, slots: usize, rounds: u64, epochs: u64) -> TraceHeader {
    TraceHeader {
        program_version: "test".into(),
        git_commit: None,
        config_json: "{}".into(),
        task: "cifar_baseline".into(),
        data: "synthetic".into(),
        policy: "heuristic".into(),
        seed: 0,
        envs,
        rounds,
        epochs,
        slots: (0..slots).map(|s| format!("r0c{s}")).collect(),
        created_unix: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use esper_components::{FactoredAction, LifecycleOp, OpOutcome, SeedStage};
    use esper_kernels::host::ParamPrint;
    use esper_systems::write_trace::{EVENT_GERMINATED, EnvStep};

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The bytes of a fixed chunk, pinned: the record types live in three crates, and a change to any of
    /// them (a field, an enum's order) changes what traces hold. When this fails, the change needs a new
    /// `FORMAT_VERSION` (and these bytes updated with it).
    #[test]
    fn a_chunk_is_encoded_as_format_version_1_says() {
        let step = StepRecord {
            round: 1,
            epoch: 2,
            step: 3,
            envs: vec![EnvStep {
                action: FactoredAction { slot: 1, blueprint: 2, op: 1, ..FactoredAction::default() },
                effective_op: LifecycleOp::Germinate,
                outcome: OpOutcome::Executed,
                reward: Some(0.5),
                reward_norm: None,
                val_acc: 50.0,
                val_loss: 1.25,
                train_acc: 40.0,
                train_loss: 2.0,
                stages: vec![SeedStage::Germinated, SeedStage::Dormant],
                alphas: vec![0.0, 1.0],
                events: vec![EVENT_GERMINATED, 0],
                checksum: 0x0123_4567_89ab_cdef,
                fingerprint: vec![ParamPrint { sum: 1.0, sum_sq: 2.0 }],
            }],
        };
        assert_eq!(FORMAT_VERSION, 1);
        // 'C', length 105 and its complement; round, epoch, step; one env: the eight heads, op 1
        // (GERMINATE), outcome 0, Some(0.5), None, four f64 metrics, stages [2, 1], alphas, events [1, 0],
        // the checksum as a varint, one (sum, sum_sq) pair; the CRC.
        let expected = "436900000096ffffff010203010102000000000001010001000000000000\
                        e03f000000000000004940000000000000f43f0000000000004440000000000000004002020102000000000000\
                        0000000000000000f03f020100ef9bafcdf8acd1910101000000000000f03f0000000000000040b06cbddf";
        assert_eq!(hex(&encode_chunk(&step)), expected);
    }

    #[test]
    fn a_header_and_footer_round_trip() {
        let header = TraceHeader {
            program_version: "0.1.0".into(),
            git_commit: Some("abc".into()),
            config_json: "{\"envs\":2}".into(),
            task: "cifar_baseline".into(),
            data: "synthetic".into(),
            policy: "random".into(),
            seed: 9,
            envs: 2,
            rounds: 1,
            epochs: 0,
            slots: vec!["r0c0".into()],
            created_unix: 1,
        };
        let footer = TraceFooter { steps: 0, env_records: 0, rounds_completed: 1, interrupted: false };
        let mut bytes = encode_header(&header);
        bytes.extend(encode_footer(&footer));
        let trace = Trace::parse(&bytes).unwrap();
        assert_eq!((&trace.header, &trace.end), (&header, &TraceEnd::Complete(footer)));
        // A payload that decodes but leaves bytes over is damage, not a valid frame.
        let mut padded = postcard::to_allocvec(&footer).unwrap();
        padded.push(0);
        let mut bytes = encode_header(&trace.header);
        write_frame(KIND_FOOTER, &padded, &mut bytes).unwrap();
        let err = Trace::parse(&bytes).unwrap_err();
        assert!(err.to_string().contains("1 bytes left over"), "{err}");
    }
}
