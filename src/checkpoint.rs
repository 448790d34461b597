//! Checkpoints of the learned policy: one safetensors file with the network's weights, Adam's two
//! moments per weight and, in the file's metadata under `esper_checkpoint`, a JSON header — the format
//! version, the program version, the run's whole config, the next round, the update and optimizer step
//! counts, the network's shape and the three normalisers (observation, reward, value; their f64
//! fields round-trip exactly through JSON). Random streams need no saved position: every draw is
//! keyed by (seed, round, env, purpose) and counted from the epoch, so the round number is the
//! position. Written through a temporary file and a rename at the end of every round.

use crate::config::RunConfig;
use candle_core::{Device, Tensor};
use esper_kernels::obs_normalizer::ObsNormalizer;
use esper_kernels::policy::network::PolicyShape;
use esper_kernels::policy::ppo::{PpoAgent, set_vars};
use esper_kernels::policy::value_normalizer::ValueNormalizer;
use esper_kernels::reward::RewardNormalizer;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Bumped when the header or the tensor names change.
pub const CHECKPOINT_FORMAT: u32 = 1;
const METADATA_KEY: &str = "esper_checkpoint";
/// The file a learning run writes into its `--out` folder.
pub const CHECKPOINT_FILE: &str = "checkpoint.safetensors";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointHeader {
    pub format_version: u32,
    pub program_version: String,
    pub config: RunConfig,
    /// The first round a resumed run plays.
    pub next_round: u64,
    pub train_steps: u64,
    pub adam_step: u64,
    pub shape: PolicyShape,
    pub obs_normalizer: ObsNormalizer,
    pub reward_normalizer: RewardNormalizer,
    pub value_normalizer: ValueNormalizer,
}

/// A loaded checkpoint: its header and tensors by name.
pub struct Checkpoint {
    pub header: CheckpointHeader,
    tensors: HashMap<String, Tensor>,
}

fn name(kind: &str, i: usize) -> String {
    format!("{kind}.{i:03}")
}

/// Write `agent` with `header` to `path` atomically.
pub fn save(path: &Path, header: &CheckpointHeader, agent: &PpoAgent) -> Result<(), String> {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (i, var) in agent.net.vars().iter().enumerate() {
        tensors.push((name("policy", i), var.as_tensor().clone()));
    }
    for (i, (m, v)) in agent.adam.m.iter().zip(&agent.adam.v).enumerate() {
        tensors.push((name("adam_m", i), m.clone()));
        tensors.push((name("adam_v", i), v.clone()));
    }
    let json = serde_json::to_string(header).map_err(|e| e.to_string())?;
    let metadata = HashMap::from([(METADATA_KEY.to_string(), json)]);
    let bytes = safetensors::serialize(tensors, Some(metadata)).map_err(|e| e.to_string())?;
    crate::run::write_atomically(path, bytes).map_err(|e| e.to_string())
}

/// The header of the checkpoint at `path`, reading only the file's safetensors header (a run's
/// config without its 48 MB of tensors).
pub fn read_header(path: &Path) -> Result<CheckpointHeader, String> {
    use std::io::Read;
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let short = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => what(&"not an esper-ecs checkpoint (the file ends early)"),
        _ => what(&e),
    };
    let mut file = std::fs::File::open(path).map_err(|e| what(&e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(short)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER_BYTES {
        return Err(what(&format!("not an esper-ecs checkpoint (a {len}-byte safetensors header)")));
    }
    let mut prefix = len.to_le_bytes().to_vec();
    prefix.resize(8 + len as usize, 0);
    file.read_exact(&mut prefix[8..]).map_err(short)?;
    header_of(&prefix).map_err(|e| what(&e))
}

/// safetensors' own limit on its header.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Our header from the bytes of a safetensors file: its first `8 + n` bytes are enough (the length
/// `n`, then the JSON header whose `__metadata__` holds ours). The tensors are checked by `load`.
fn header_of(bytes: &[u8]) -> Result<CheckpointHeader, String> {
    let not_ours = "not an esper-ecs checkpoint";
    let len = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).ok_or(not_ours)?;
    let json = usize::try_from(len).ok().and_then(|n| bytes.get(8..8 + n)).ok_or(not_ours)?;
    let table: serde_json::Value = serde_json::from_slice(json).map_err(|e| format!("{not_ours} ({e})"))?;
    let ours = table["__metadata__"][METADATA_KEY]
        .as_str()
        .ok_or("not an esper-ecs checkpoint (no esper_checkpoint metadata)")?;
    let header: CheckpointHeader = serde_json::from_str(ours).map_err(|e| e.to_string())?;
    if header.format_version > CHECKPOINT_FORMAT {
        return Err(format!(
            "checkpoint format {} is newer than this build's {CHECKPOINT_FORMAT}",
            header.format_version
        ));
    }
    Ok(header)
}

/// Read a checkpoint (any damage or a newer format is an error naming the file).
pub fn load(path: &Path) -> Result<Checkpoint, String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let bytes = std::fs::read(path).map_err(|e| what(&e))?;
    let header = header_of(&bytes).map_err(|e| what(&e))?;
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| what(&e))?;
    Ok(Checkpoint { header, tensors })
}

impl Checkpoint {
    fn series(&self, kind: &str, n: usize) -> Result<Vec<Tensor>, String> {
        (0..n)
            .map(|i| {
                self.tensors
                    .get(&name(kind, i))
                    .cloned()
                    .ok_or_else(|| format!("missing tensor {}", name(kind, i)))
            })
            .collect()
    }

    /// The network's weights into `agent` (its shape must match), and with `optimizer` also Adam's
    /// moments and the update counts.
    pub fn restore(&self, agent: &mut PpoAgent, optimizer: bool) -> Result<(), String> {
        if agent.net.shape != self.header.shape {
            return Err(format!(
                "the checkpoint's policy has shape {:?}; this run's is {:?} (slots and --policy-hidden must match)",
                self.header.shape, agent.net.shape
            ));
        }
        let vars = agent.net.vars();
        set_vars(&vars, &self.series("policy", vars.len())?).map_err(|e| e.to_string())?;
        agent.value_normalizer = self.header.value_normalizer;
        if optimizer {
            let device = agent.device.clone();
            let to = |t: Vec<Tensor>| -> Result<Vec<Tensor>, String> {
                t.into_iter().map(|t| t.to_device(&device).map_err(|e| e.to_string())).collect()
            };
            agent.adam.m = to(self.series("adam_m", vars.len())?)?;
            agent.adam.v = to(self.series("adam_v", vars.len())?)?;
            agent.adam.step = self.header.adam_step;
            agent.train_steps = self.header.train_steps;
        }
        Ok(())
    }
}

/// `<out>/checkpoint.safetensors`.
pub fn path_in(out_dir: &Path) -> PathBuf {
    out_dir.join(CHECKPOINT_FILE)
}
