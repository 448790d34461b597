//! A trace whose checksums would make the device wait (`HostBackend::fingerprints_wait`) lets each
//! record wait a step: a `TraceSink::deferring` sink queues the parameters at Record, writes the record
//! at the next step's Record, and the last one at `flush`. Through the unchanged step schedule, a
//! backend that defers (the CPU backend wrapped so that it asks to, queuing by hashing at queue time as
//! a device's copy would capture the values) gives exactly the records an immediate sink gives on the
//! plain CPU backend, each one step later, without ever reading the fingerprints immediately.

use esper_ecs::config::PolicyKind;
use esper_ecs::run::Session;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::{
    CpuHostBackend, EnvCounterfactuals, EpochTrain, FossilRow, HostArch, HostBackend, ParamPrint,
    SeedTelemetry, SlotSync, ValidationPlan,
};
use esper_systems::host_resources::Hosts;
use esper_systems::write_trace::{StepRecord, StepSink, TraceSink};
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common;

/// The CPU backend asking for deferred fingerprints: `queue` hashes the parameters as they are then
/// (what a device's queued copy holds), `queued` hands that back; immediate reads are counted.
struct DeferringCpu {
    cpu: CpuHostBackend,
    queued: Mutex<Option<(Vec<u64>, Vec<ParamPrint>)>>,
    queues: AtomicUsize,
    immediate: AtomicUsize,
}

impl HostBackend for DeferringCpu {
    fn arch(&self) -> HostArch {
        self.cpu.arch()
    }
    fn n_envs(&self) -> usize {
        self.cpu.n_envs()
    }
    fn slot_ids(&self) -> &[(u8, u8)] {
        self.cpu.slot_ids()
    }
    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync) {
        self.cpu.sync_slot(env, slot, sync)
    }
    fn train_epoch(&mut self, data: &Dataset, batcher: &Batcher) {
        self.cpu.train_epoch(data, batcher)
    }
    fn epoch_train(&mut self) -> &[EpochTrain] {
        self.cpu.epoch_train()
    }
    fn validate(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals] {
        self.cpu.validate(data, batcher, plan)
    }
    fn validation_configs(&self, env: usize) -> usize {
        self.cpu.validation_configs(env)
    }
    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry> {
        self.cpu.seed_telemetry(slot, env)
    }
    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]) {
        self.cpu.take_snapshot(env, fossils)
    }
    fn restore_snapshot(&mut self, env: usize) {
        self.cpu.restore_snapshot(env)
    }
    fn reset_round(&mut self, seed: u64, round: u64) {
        self.cpu.reset_round(seed, round)
    }
    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        self.immediate.fetch_add(1, Ordering::Relaxed);
        self.cpu.param_fingerprints(checksums, prints)
    }
    fn fingerprints_wait(&self) -> bool {
        true
    }
    fn queue_param_fingerprints(&self) {
        let groups = 1 + self.cpu.slot_ids().len();
        let (mut sums, mut prints) =
            (vec![0; self.n_envs()], vec![ParamPrint::default(); self.n_envs() * groups]);
        self.cpu.param_fingerprints(&mut sums, &mut prints);
        *self.queued.lock().unwrap() = Some((sums, prints));
        self.queues.fetch_add(1, Ordering::Relaxed);
    }
    fn queued_param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        let (sums, p) = self.queued.lock().unwrap().take().expect("a queued copy");
        checksums.copy_from_slice(&sums);
        prints.copy_from_slice(&p);
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Collects every record written.
struct Collector(Arc<Mutex<Vec<StepRecord>>>);

impl StepSink for Collector {
    fn write_step(&mut self, step: &StepRecord) -> Result<(), String> {
        self.0.lock().unwrap().push(step.clone());
        Ok(())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[test]
fn a_deferring_trace_writes_the_immediate_records_one_step_later() {
    let dir = std::env::temp_dir().join(format!("esper-deferred-trace-{}", std::process::id()));
    let plan = common::tiny_plan(&dir, |c| (c.rounds, c.policy) = (2, PolicyKind::Heuristic));
    let (immediate, deferred) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));

    let mut plain = Session::new(&plan).unwrap();
    plain.world.insert_resource(TraceSink::new(Box::new(Collector(Arc::clone(&immediate)))));
    let mut session = Session::new(&plan).unwrap();
    common::install_cpu_double(&mut session.world, &plan, |cpu| DeferringCpu {
        cpu,
        queued: Mutex::new(None),
        queues: AtomicUsize::new(0),
        immediate: AtomicUsize::new(0),
    });
    session.world.insert_resource(TraceSink::deferring(Box::new(Collector(Arc::clone(&deferred)))));

    let mut steps = 0;
    for round in 0..2u64 {
        plain.start_round(round);
        session.start_round(round);
        for epoch in 1..=3u64 {
            plain.run_epoch(epoch);
            session.run_epoch(epoch);
            steps += 1;
            assert_eq!(immediate.lock().unwrap().len(), steps);
            // The step's own record waits for the next step (or the flush).
            assert_eq!(deferred.lock().unwrap().len(), steps - 1, "after step {steps}");
        }
        plain.finish_round();
        session.finish_round();
    }
    session.world.resource_scope(|world, mut sink: bevy_ecs::prelude::Mut<TraceSink>| {
        sink.flush(&*world.resource::<Hosts>().0)
    });
    assert!(session.world.resource::<TraceSink>().error().is_none());

    let (immediate, deferred) = (immediate.lock().unwrap(), deferred.lock().unwrap());
    assert_eq!((immediate.len(), deferred.len()), (6, 6));
    for (a, b) in immediate.iter().zip(deferred.iter()) {
        assert_eq!(a, b, "step {}", a.step);
    }
    // The checksums moved as the hosts trained: the records are not all the same.
    assert!(immediate.windows(2).all(|w| w[0].envs[0].checksum != w[1].envs[0].checksum));
    let hosts = session.world.resource::<Hosts>();
    let backend = hosts.0.as_any().downcast_ref::<DeferringCpu>().unwrap();
    assert_eq!(backend.queues.load(Ordering::Relaxed), 6);
    assert_eq!(backend.immediate.load(Ordering::Relaxed), 0, "no immediate read: no second copy");
    // A second flush has nothing left to write.
    session.world.resource_scope(|world, mut sink: bevy_ecs::prelude::Mut<TraceSink>| {
        sink.flush(&*world.resource::<Hosts>().0)
    });
    assert_eq!(deferred.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}
