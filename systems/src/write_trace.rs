//! Record: one [`StepRecord`] per step into the run's [`TraceSink`] (`trace.bin`, DESIGN §7): for every
//! env the action its policy sampled, the op that counted and what became of it, the reward (raw and
//! normalised) when there is one, every slot's stage, alpha and events (germinated, fossilized, pruned
//! this step), the validation and training figures, and its parameters as a bit-exact checksum plus a
//! per-group sum / sum of squares (for comparing runs made on different devices), read from the
//! backend for every env in one call. The record lives in the system's `Local` and is refilled in
//! place, so a step allocates nothing here once the first one has sized it; the sink encodes it.
//!
//! On a device that would have to wait for those checksums (a second copy back in the step), a
//! [`TraceSink::deferring`] sink lets the record wait a step: its parameters are copied without
//! waiting and hashed at the next step's Record, when the step's one read-back has waited for the
//! device anyway; [`TraceSink::flush`] writes the last one when the run ends.
//!
//! Nothing in a record depends on wall-clock time or on the thread count: the same config run twice
//! gives the same records.

use crate::compute_rewards::RewardBatch;
use crate::host_resources::{Hosts, StepClock};
use crate::resources::{ActionBatch, EffectiveOps, EnvCount, OpOutcomes};
use crate::step_span::StepInfo;
use bevy_ecs::prelude::*;
use esper_components::{
    EnvIndex, FactoredAction, HostMetrics, LifecycleOp, OpOutcome, SeedAlpha, SeedStage, SlotEvents,
    SlotIndex, Stage,
};
use esper_kernels::host::{HostBackend, ParamPrint};
use serde::{Deserialize, Serialize};

/// One env's step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvStep {
    /// The factored action the policy sampled (kept as sampled, simic §1.3 D).
    pub action: FactoredAction,
    /// The op that counts for the reward (`action_for_reward`).
    pub effective_op: LifecycleOp,
    /// What became of the sampled op.
    pub outcome: OpOutcome,
    /// Raw and normalised reward; None for an env that rolled back (it gets none).
    pub reward: Option<f64>,
    pub reward_norm: Option<f64>,
    pub val_acc: f64,
    pub val_loss: f64,
    pub train_acc: f64,
    pub train_loss: f64,
    /// `[S]` in canonical slot order, after the step's tick.
    pub stages: Vec<SeedStage>,
    pub alphas: Vec<f64>,
    /// `[S]`: what happened to each slot this step, as [`EVENT_GERMINATED`] | [`EVENT_FOSSILIZED`] |
    /// [`EVENT_PRUNED`] bits (the slot's `SlotEvents`: a prune by the policy, a completed scheduled
    /// prune or a rollback). Stages alone miss most prunes: the tick of a prune's own step already
    /// moves PRUNED on to EMBARGOED.
    pub events: Vec<u8>,
    /// Bit-exact checksum of the env's parameters (see `HostBackend::param_fingerprints`).
    pub checksum: u64,
    /// `[1 + S]`: the host, then each slot's seed.
    pub fingerprint: Vec<ParamPrint>,
}

pub const EVENT_GERMINATED: u8 = 1;
pub const EVENT_FOSSILIZED: u8 = 2;
pub const EVENT_PRUNED: u8 = 4;

/// Every env's record of one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub round: u64,
    /// 1-based epoch of the round.
    pub epoch: u64,
    /// 0-based index of the step in the run.
    pub step: u64,
    pub envs: Vec<EnvStep>,
}

/// Where the records go: the app's `trace.bin` writer, or the replay's comparison.
pub trait StepSink: Send + Sync + 'static {
    fn write_step(&mut self, step: &StepRecord) -> Result<(), String>;
    /// The sink itself, for its owner to finish it or read what it collected.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

/// The run's trace sink. An error stops the recording and is kept for the run driver to report after
/// the step (a system has no caller to return it to).
#[derive(Resource)]
pub struct TraceSink {
    out: Box<dyn StepSink>,
    error: Option<String>,
    /// Whether a record may wait a step for its checksums (see [`Self::deferring`]).
    defer: bool,
    /// The last step's record, its parameters queued for checksums, not yet written; and the
    /// allocation of the one before, reused for the next.
    pending: Option<StepRecord>,
    spare: StepRecord,
    /// The `[E]` checksums and `[E, 1 + S]` prints a record is completed with.
    checksums: Vec<u64>,
    prints: Vec<ParamPrint>,
}

impl TraceSink {
    /// A sink that gets every step's record at that step's Record (the replay compares each at once).
    pub fn new(out: Box<dyn StepSink>) -> Self {
        Self {
            out,
            error: None,
            defer: false,
            pending: None,
            spare: StepRecord::default(),
            checksums: Vec::new(),
            prints: Vec::new(),
        }
    }

    /// A sink whose records may wait a step for their checksums where taking them would make the device
    /// wait (`HostBackend::fingerprints_wait`): the parameters are queued for copying at Record and
    /// the record written at the next step's Record or at [`Self::flush`]. The same records, each one
    /// step later; what `train` writes its `trace.bin` with. A run killed outright (not interrupted,
    /// which ends with the flush) loses the step whose record was waiting.
    pub fn deferring(out: Box<dyn StepSink>) -> Self {
        Self { defer: true, ..Self::new(out) }
    }

    /// Writes the record still waiting for its checksums, if any (waiting for its copies if they have
    /// not finished). The run calls it before it finishes the sink.
    pub fn flush(&mut self, hosts: &dyn HostBackend) {
        let Some(mut record) = self.pending.take() else { return };
        if self.error.is_none() {
            self.complete_and_write(&mut record, hosts, |c, p| hosts.queued_param_fingerprints(c, p));
        }
        self.spare = record;
    }

    /// Fills each env's checksum and prints into `record` from `read` (the backend's fingerprints,
    /// `[E]` and `[E, 1 + S]`, through the sink's reused buffers), then writes it.
    fn complete_and_write(
        &mut self,
        record: &mut StepRecord,
        hosts: &dyn HostBackend,
        read: impl FnOnce(&mut [u64], &mut [ParamPrint]),
    ) {
        let groups = 1 + hosts.slot_ids().len();
        self.checksums.resize(record.envs.len(), 0);
        self.prints.resize(record.envs.len() * groups, ParamPrint::default());
        read(&mut self.checksums, &mut self.prints);
        for (e, env) in record.envs.iter_mut().enumerate() {
            env.checksum = self.checksums[e];
            env.fingerprint.clear();
            env.fingerprint.extend_from_slice(&self.prints[e * groups..(e + 1) * groups]);
        }
        if let Err(err) = self.out.write_step(record) {
            self.error = Some(format!("trace: {err}"));
        }
    }

    /// The first write error, if any (nothing is recorded after it).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The sink, to finish it (the app's writer) or read what it collected (the replay).
    pub fn into_inner(self) -> Box<dyn std::any::Any> {
        self.out.into_any()
    }
}

/// The system's reused record (the sink keeps the fingerprints' buffers).
#[derive(Default)]
pub struct TraceScratch {
    record: StepRecord,
}

#[allow(clippy::too_many_arguments)] // a system: each parameter is one resource or query it touches
pub fn write_trace(
    envs: Query<(&EnvIndex, &HostMetrics)>,
    slots: Query<(&EnvIndex, &SlotIndex, &Stage, &SeedAlpha, &SlotEvents)>,
    actions: Res<ActionBatch>,
    effective: Res<EffectiveOps>,
    outcomes: Res<OpOutcomes>,
    clock: Res<StepClock>,
    n_envs: Res<EnvCount>,
    rewards: Res<RewardBatch>,
    hosts: Option<Res<Hosts>>,
    sink: Option<ResMut<TraceSink>>,
    mut scratch: Local<TraceScratch>,
    info: StepInfo,
) {
    let _span = crate::system_span!(info, "Record::write_trace");
    let (Some(mut sink), Some(hosts)) = (sink, hosts) else { return };
    if sink.error.is_some() {
        return;
    }
    let n_slots = hosts.slot_ids().len();
    let deferred = sink.defer && hosts.0.fingerprints_wait();
    if deferred {
        // The last step's record: its copies finished with this step's read-back.
        sink.flush(&*hosts.0);
        if sink.error.is_some() {
            return;
        }
    }
    let record = &mut scratch.record;
    record.round = clock.round;
    record.epoch = clock.epoch;
    record.step = clock.step;
    record.envs.resize_with(n_envs.0, EnvStep::default);
    for (e, env) in record.envs.iter_mut().enumerate() {
        env.action = actions.get(e);
        env.effective_op = effective.0[e];
        env.outcome = outcomes.0[e];
        let rewarded = rewards.rewarded(e);
        env.reward = rewarded.then(|| rewards.outputs.raw[e]);
        env.reward_norm = rewarded.then(|| rewards.normalized[e]);
        env.stages.resize(n_slots, SeedStage::Dormant);
        env.alphas.resize(n_slots, 0.0);
        env.events.resize(n_slots, 0);
    }
    for (env, m) in &envs {
        let r = &mut record.envs[env.0 as usize];
        r.val_acc = m.val_accuracy;
        r.val_loss = m.val_loss;
        r.train_acc = m.train_accuracy;
        r.train_loss = m.train_loss;
    }
    for (env, index, stage, alpha, events) in &slots {
        let r = &mut record.envs[env.0 as usize];
        let k = index.0 as usize;
        r.stages[k] = stage.current;
        r.alphas[k] = alpha.0;
        r.events[k] = u8::from(events.germinated) * EVENT_GERMINATED
            + u8::from(events.fossilized) * EVENT_FOSSILIZED
            + u8::from(events.pruned) * EVENT_PRUNED;
    }
    let sink = &mut *sink;
    if deferred {
        // Copied now, hashed at the next Record: the record waits in the sink, and the scratch takes
        // the allocation of the record written before it (no allocation once both are sized).
        hosts.queue_param_fingerprints();
        std::mem::swap(record, &mut sink.spare);
        sink.pending = Some(std::mem::take(&mut sink.spare));
        return;
    }
    sink.complete_and_write(record, &*hosts.0, |c, p| hosts.param_fingerprints(c, p));
}
