//! CUDA graphs of the training epoch. Within an epoch every batch makes the same launches, and from
//! one epoch to the next they change only when what decides them changes — the batch count, the
//! dataset's upload, the plan's buffer, and each slot's per-env states (which blueprints run, train,
//! collect, gate) — not with alpha, which the kernels read from a device buffer. So an epoch whose
//! [`EpochShape`] was seen the epoch before is captured into a graph (its kernels, cuBLAS calls and
//! device copies; the per-env controls and the plan are uploaded before the capture), and later epochs
//! of that shape replay it: one launch for the whole epoch instead of one per kernel.
//!
//! A replay runs the kernels but none of the host code around them: what that code notes on the host
//! during an epoch (the slots' [`StatsTaken`]) is kept with the graph and put back. A capture that
//! fails turns graphs off for the backend's life (the epoch then runs without one, and the report
//! says why): a run is never stopped by a graph.

use cudarc::driver::{CudaGraph, DriverError};

use super::slot::StatsTaken;
use crate::host::SeedEnvState;

/// What decides a training epoch's launches (their kernels, arguments and buffers).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochShape {
    pub batches: usize,
    /// The plan buffer's length (it is reallocated only to grow).
    pub plan_len: usize,
    /// How many times the dataset was uploaded (each upload is new buffers).
    pub data_uploads: u64,
    /// Every slot's every env's state without alpha ([`super::slot::DeviceSlot::launch_states`]).
    pub states: Vec<SeedEnvState>,
}

/// How the coming epoch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochRun {
    /// Launch by launch (graphs off, or a shape not seen the epoch before).
    Eager,
    /// Capture it into a graph, then launch the graph.
    Capture,
    /// Launch the graph captured for this shape.
    Replay,
}

/// A captured epoch: its shape, its graph, and what its host code noted at each slot.
pub struct CapturedEpoch {
    shape: EpochShape,
    graph: ExclusiveGraph,
    stats: Vec<StatsTaken>,
}

impl CapturedEpoch {
    pub fn new(shape: EpochShape, graph: CudaGraph, stats: Vec<StatsTaken>) -> Self {
        Self { shape, graph: ExclusiveGraph(graph), stats }
    }
}

/// cudarc's graph is neither `Send` nor `Sync`: the driver requires calls on one graph to be
/// serialized. This one is launched only through `&mut EpochGraphs` ([`EpochGraphs::launch`]) and has
/// no method reachable through `&`, so Rust's borrows serialize every call; the backend that holds it
/// (`Send + Sync`, as every `HostBackend`) may move between threads.
struct ExclusiveGraph(CudaGraph);

// Safety: see above — every use of the graph goes through `&mut`, so no two threads call into it at
// once, and `&ExclusiveGraph` gives access to nothing.
unsafe impl Send for ExclusiveGraph {}
unsafe impl Sync for ExclusiveGraph {}

/// The backend's graph policy and its one captured epoch.
pub struct EpochGraphs {
    enabled: bool,
    /// Why graphs were turned off (a capture failed).
    failure: Option<String>,
    /// The last epoch that ran launch by launch, to capture it when it repeats.
    last_eager: Option<EpochShape>,
    captured: Option<CapturedEpoch>,
}

impl EpochGraphs {
    pub fn new(enabled: bool) -> Self {
        Self { enabled, failure: None, last_eager: None, captured: None }
    }

    pub fn enabled(&self) -> bool {
        self.enabled && self.failure.is_none()
    }

    pub fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
    }

    /// Why graphs are off after a failed capture, if one failed.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// How an epoch of `shape` runs: replayed when it is the captured shape, captured when it is the
    /// shape of the epoch before, else launch by launch (and remembered).
    pub fn plan(&mut self, shape: &EpochShape) -> EpochRun {
        if !self.enabled() {
            return EpochRun::Eager;
        }
        if self.captured.as_ref().is_some_and(|c| &c.shape == shape) {
            return EpochRun::Replay;
        }
        if self.last_eager.as_ref() == Some(shape) {
            return EpochRun::Capture;
        }
        self.last_eager = Some(shape.clone());
        EpochRun::Eager
    }

    /// Launches the captured epoch ([`EpochRun::Replay`] said it is this shape's) and returns what its
    /// host code noted at each slot.
    pub fn launch(&mut self) -> Result<&[StatsTaken], DriverError> {
        let captured = self.captured.as_mut().expect("a replay has its graph");
        captured.graph.0.launch()?;
        Ok(&captured.stats)
    }

    pub fn store(&mut self, captured: CapturedEpoch) {
        self.captured = Some(captured);
    }

    /// A capture failed: no graphs from now on.
    pub fn fail(&mut self, why: String) {
        self.failure = Some(why);
        self.captured = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::SeedMode;
    use crate::seeds::CnnBlueprint;

    fn shape(mode: SeedMode) -> EpochShape {
        let state =
            SeedEnvState { mode, blueprint: Some(CnnBlueprint::ConvLight), ..SeedEnvState::default() };
        EpochShape { batches: 6, plan_len: 100, data_uploads: 1, states: vec![state; 3] }
    }

    /// A new shape runs launch by launch; the same shape again is captured; then replayed; another shape
    /// starts over; off, everything runs launch by launch.
    #[test]
    fn an_epoch_shape_is_captured_when_it_repeats_and_replayed_after() {
        let mut graphs = EpochGraphs::new(true);
        let (add, off) = (shape(SeedMode::Add), shape(SeedMode::Off));
        assert_eq!(graphs.plan(&add), EpochRun::Eager);
        assert_eq!(graphs.plan(&off), EpochRun::Eager, "another shape");
        assert_eq!(graphs.plan(&off), EpochRun::Capture, "the same shape twice");
        assert_eq!(graphs.plan(&add), EpochRun::Eager);
        let mut longer = add.clone();
        longer.batches = 7;
        assert_eq!(graphs.plan(&longer), EpochRun::Eager, "the batch count is part of the shape");
        graphs.set_enabled(false);
        assert_eq!(graphs.plan(&longer), EpochRun::Eager);
        graphs.fail("test".into());
        graphs.set_enabled(true);
        assert!(!graphs.enabled() && graphs.failure() == Some("test"));
        assert_eq!(graphs.plan(&longer), EpochRun::Eager, "a failed capture turns graphs off");
    }
}
