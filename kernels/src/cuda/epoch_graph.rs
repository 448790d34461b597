//! CUDA graphs of the training epoch and of the validation pass. Within an epoch every batch makes the same launches, and from
//! one epoch to the next they change only when what decides them changes — the batch count, the
//! dataset's upload, the plan's buffer, and at each slot which blueprints run, train and collect and
//! what its gate does ([`SlotLaunchKey`]) — not with which env does what, nor with alpha: the kernels
//! read those from per-env device buffers. So an epoch whose [`EpochShape`] was seen the epoch before
//! is captured into a graph (its kernels, cuBLAS calls and device copies; the per-env controls and the
//! plan are uploaded before the capture), and later epochs of that shape replay it: one launch for the
//! whole epoch instead of one per kernel. The last [`GRAPHS_KEPT`] shapes' graphs are kept, so a run
//! that returns to a shape (a seed pruned, another germinated) replays it again.
//!
//! The validation pass is the same: its launches are decided by the test batches, the order and
//! starts of its configuration passes, and at each slot which blueprints run in evaluation and how
//! many passes its selections hold ([`ValidationShape`]); the selections themselves are device
//! buffers uploaded before it.
//!
//! A replay runs the kernels but none of the host code around them: what that code notes on the host
//! during an epoch (the slots' [`StatsTaken`]) is kept with the graph and put back. A capture that
//! fails turns graphs off for the backend's life (the epoch then runs without one, and the report
//! says why): a run is never stopped by a graph.

use cudarc::driver::{CudaGraph, DriverError};

use super::slot::{EvalLaunchKey, SlotLaunchKey, StatsTaken};

/// How many captured epochs (the most recent shapes) are kept for replay.
pub const GRAPHS_KEPT: usize = 4;

/// What decides a training epoch's launches (their kernels, arguments and buffers).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochShape {
    pub batches: usize,
    /// The plan buffer's length (it is reallocated only to grow).
    pub plan_len: usize,
    /// How many times the dataset was uploaded (each upload is new buffers).
    pub data_uploads: u64,
    /// Every slot's launch key ([`super::slot::DeviceSlot::launch_key`]).
    pub slots: Vec<SlotLaunchKey>,
}

/// What decides a validation pass's launches (their kernels, arguments and buffers).
#[derive(Clone, Debug, PartialEq)]
pub struct ValidationShape {
    pub test_batches: usize,
    pub n_test: usize,
    /// The configuration passes in the order they run, each with the slot it starts from.
    pub order: Vec<(usize, Option<(usize, u8)>)>,
    /// The validation sums' length (reallocated only to grow).
    pub sums_len: usize,
    pub data_uploads: u64,
    /// Every slot's evaluation launch key ([`super::slot::DeviceSlot::eval_launch_key`]).
    pub slots: Vec<EvalLaunchKey>,
    /// Whether short test batches run over their rows only (the launches' shapes differ).
    pub trim_test_batches: bool,
}

/// How the coming epoch (or validation pass) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochRun {
    /// Launch by launch (graphs off, or a shape not seen the epoch before).
    Eager,
    /// Capture it into a graph, then launch the graph.
    Capture,
    /// Launch the graph kept for this shape.
    Replay,
}

/// A captured epoch (or validation pass): its shape, its graph, and what its host code noted at each
/// slot (nothing, for a validation pass).
pub struct CapturedEpoch<S, G = ExclusiveGraph> {
    shape: S,
    graph: G,
    stats: Vec<StatsTaken>,
}

impl<S> CapturedEpoch<S> {
    pub fn new(shape: S, graph: CudaGraph, stats: Vec<StatsTaken>) -> Self {
        Self { shape, graph: ExclusiveGraph(graph), stats }
    }
}

/// What a kept graph does: launch.
pub trait Replay {
    fn replay(&mut self) -> Result<(), DriverError>;
}

/// cudarc's graph is neither `Send` nor `Sync`: the driver requires calls on one graph to be
/// serialized. This one is launched only through `&mut EpochGraphs` ([`EpochGraphs::launch`]) and has
/// no method reachable through `&`, so Rust's borrows serialize every call; the backend that holds it
/// (`Send + Sync`, as every `HostBackend`) may move between threads.
pub struct ExclusiveGraph(CudaGraph);

// Safety: see above — every use of the graph goes through `&mut`, so no two threads call into it at
// once, and `&ExclusiveGraph` gives access to nothing.
unsafe impl Send for ExclusiveGraph {}
unsafe impl Sync for ExclusiveGraph {}

impl Replay for ExclusiveGraph {
    fn replay(&mut self) -> Result<(), DriverError> {
        self.0.launch()
    }
}

/// The backend's graph policy for one stage (the training epoch, shapes `S` = [`EpochShape`], or the
/// validation pass, [`ValidationShape`]) and its captured graphs.
pub struct EpochGraphs<S, G = ExclusiveGraph> {
    enabled: bool,
    /// Why graphs were turned off (a capture failed).
    failure: Option<String>,
    /// The last one that ran launch by launch, to capture it when it repeats.
    last_eager: Option<S>,
    /// The most recently captured or replayed first, at most [`GRAPHS_KEPT`].
    captured: Vec<CapturedEpoch<S, G>>,
}

impl<S: Clone + PartialEq, G: Replay> EpochGraphs<S, G> {
    pub fn new(enabled: bool) -> Self {
        Self { enabled, failure: None, last_eager: None, captured: Vec::new() }
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

    /// How an epoch of `shape` runs: replayed when a kept graph has its shape (which then goes to the
    /// front), captured when it is the shape of the epoch before, else launch by launch (and
    /// remembered).
    pub fn plan(&mut self, shape: &S) -> EpochRun {
        if !self.enabled() {
            return EpochRun::Eager;
        }
        if let Some(i) = self.captured.iter().position(|c| &c.shape == shape) {
            let kept = self.captured.remove(i);
            self.captured.insert(0, kept);
            return EpochRun::Replay;
        }
        if self.last_eager.as_ref() == Some(shape) {
            self.last_eager = None;
            return EpochRun::Capture;
        }
        self.last_eager = Some(shape.clone());
        EpochRun::Eager
    }

    /// Launches the graph [`Self::plan`] chose to replay (now the first kept) and returns what its
    /// host code noted at each slot.
    pub fn launch(&mut self) -> Result<&[StatsTaken], DriverError> {
        let captured = self.captured.first_mut().expect("a replay has its graph");
        captured.graph.replay()?;
        Ok(&captured.stats)
    }

    pub fn store(&mut self, captured: CapturedEpoch<S, G>) {
        self.captured.insert(0, captured);
        self.captured.truncate(GRAPHS_KEPT);
    }

    /// A capture failed: no graphs from now on.
    pub fn fail(&mut self, why: String) {
        self.failure = Some(why);
        self.captured.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in graph that counts its launches.
    struct Counted(usize);

    impl Replay for Counted {
        fn replay(&mut self) -> Result<(), DriverError> {
            self.0 += 1;
            Ok(())
        }
    }

    fn shape(batches: usize) -> EpochShape {
        EpochShape { batches, plan_len: 100, data_uploads: 1, slots: Vec::new() }
    }

    fn captured(shape: EpochShape) -> CapturedEpoch<EpochShape, Counted> {
        let stats = vec![StatsTaken { took_stats: true, ..StatsTaken::default() }; shape.batches];
        CapturedEpoch { shape, graph: Counted(0), stats }
    }

    /// A new shape runs launch by launch; the same shape again is captured, then replayed; another
    /// shape starts over, and a shape seen before replays its kept graph; the oldest of more than
    /// GRAPHS_KEPT goes; off, or after a failed capture, everything runs launch by launch.
    #[test]
    fn an_epoch_shape_is_captured_when_it_repeats_and_replayed_after() {
        let mut graphs = EpochGraphs::<EpochShape, Counted>::new(true);
        let (a, b) = (shape(1), shape(2));
        assert_eq!(graphs.plan(&a), EpochRun::Eager);
        assert_eq!(graphs.plan(&b), EpochRun::Eager, "another shape");
        assert_eq!(graphs.plan(&b), EpochRun::Capture, "the same shape twice");
        graphs.store(captured(b.clone()));
        assert_eq!(graphs.plan(&b), EpochRun::Replay);
        assert_eq!(graphs.launch().unwrap().len(), 2, "what b noted");
        assert_eq!(graphs.plan(&a), EpochRun::Eager);
        assert_eq!(graphs.plan(&a), EpochRun::Capture);
        graphs.store(captured(a.clone()));
        // Back to b: its graph is still kept.
        assert_eq!(graphs.plan(&b), EpochRun::Replay);
        assert_eq!(graphs.launch().unwrap().len(), 2);
        assert_eq!(graphs.captured[0].graph.0, 2, "b's graph replayed twice");
        assert_eq!(graphs.captured[1].graph.0, 0, "a's never");
        // Three more shapes: five kept is one too many, so the least recently used (a) goes and b
        // (used last) stays.
        for n in 3..=5 {
            graphs.store(captured(shape(n)));
        }
        assert_eq!(graphs.captured.len(), GRAPHS_KEPT);
        assert_eq!(graphs.plan(&b), EpochRun::Replay);
        assert_ne!(graphs.plan(&a), EpochRun::Replay, "a's graph was the oldest");
        graphs.set_enabled(false);
        assert_eq!(graphs.plan(&b), EpochRun::Eager);
        graphs.fail("test".into());
        graphs.set_enabled(true);
        assert!(!graphs.enabled() && graphs.failure() == Some("test"));
        assert_eq!(graphs.plan(&b), EpochRun::Eager, "a failed capture turns graphs off");
    }
}
