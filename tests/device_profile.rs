//! A device's figures reach the profile: a backend that reports device time and CUDA-graph use (the
//! CPU backend wrapped so that it reports fixed figures, as a GPU's would) runs the unchanged step
//! schedule under the Chrome trace writer, and the profile read back from the file shows the epoch's
//! device time on TrainHosts' row (recorded after validation), the validation's on Validate's, and how
//! each used graphs. Its own test binary (Cargo.toml): the trace writer is the process's global
//! subscriber, so it must not share a process with other tests' sessions.

use esper_ecs::profile;
use esper_ecs::run::Session;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::{
    CpuHostBackend, DeviceReport, EnvCounterfactuals, EpochTrain, FossilRow, GraphUse, HostArch, HostBackend,
    ParamPrint, SeedTelemetry, SlotSync, ValidationPlan,
};
use std::any::Any;

mod common;

/// The CPU backend, reporting a GPU's figures for every step.
struct ReportingCpu(CpuHostBackend);

const TRAIN_MS: f64 = 3.0;
const VALIDATE_MS: f64 = 2.0;

impl HostBackend for ReportingCpu {
    fn arch(&self) -> HostArch {
        self.0.arch()
    }
    fn n_envs(&self) -> usize {
        self.0.n_envs()
    }
    fn slot_ids(&self) -> &[(u8, u8)] {
        self.0.slot_ids()
    }
    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync) {
        self.0.sync_slot(env, slot, sync)
    }
    fn train_epoch(&mut self, data: &Dataset, batcher: &Batcher) {
        self.0.train_epoch(data, batcher)
    }
    fn epoch_train(&mut self) -> &[EpochTrain] {
        self.0.epoch_train()
    }
    fn validate(
        &mut self,
        data: &Dataset,
        batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals] {
        self.0.validate(data, batcher, plan)
    }
    fn validation_configs(&self, env: usize) -> usize {
        self.0.validation_configs(env)
    }
    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry> {
        self.0.seed_telemetry(slot, env)
    }
    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]) {
        self.0.take_snapshot(env, fossils)
    }
    fn restore_snapshot(&mut self, env: usize) {
        self.0.restore_snapshot(env)
    }
    fn reset_round(&mut self, seed: u64, round: u64) {
        self.0.reset_round(seed, round)
    }
    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        self.0.param_fingerprints(checksums, prints)
    }
    fn peek_device_report(&self) -> Option<DeviceReport> {
        Some(DeviceReport {
            syncs: 1,
            train_ms: TRAIN_MS,
            validate_ms: VALIDATE_MS,
            train_run: Some(GraphUse::Replayed),
            validation_run: Some(GraphUse::Captured),
        })
    }
    fn take_device_report(&mut self) -> Option<DeviceReport> {
        self.peek_device_report()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

#[test]
fn a_devices_time_and_graph_use_reach_the_profile_table() {
    let dir = std::env::temp_dir().join(format!("esper-device-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let plan = common::tiny_plan(&dir, |_| {});
    let guard = profile::install_chrome_trace(&trace).unwrap();
    let mut s = Session::new(&plan).unwrap();
    common::install_cpu_double(&mut s.world, &plan, ReportingCpu);
    s.start_round(0);
    for epoch in 1..=3u64 {
        let step = tracing::info_span!(target: "esper", "step", epoch, envs = 2u64).entered();
        s.run_epoch(epoch);
        drop(step);
    }
    drop(guard);
    let p = profile::load(&trace).unwrap();
    let row = |name: &str| p.systems.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name}"));
    let (train, validate) = (row("TrainHosts::train_hosts"), row("Validate::validate"));
    assert_eq!((train.calls, validate.calls), (3, 3));
    // The epoch's time was recorded by record_train_metrics (after validation), shown on TrainHosts.
    assert_eq!(train.device_mean_ms, Some(TRAIN_MS), "{train:?}");
    assert_eq!(validate.device_mean_ms, Some(VALIDATE_MS), "{validate:?}");
    assert_eq!(row("Validate::record_train_metrics").device_mean_ms, None);
    assert_eq!(train.graph, vec![("replayed".to_string(), 3)]);
    assert_eq!(validate.graph, vec![("captured".to_string(), 3)]);
    let table = profile::format_table("trace.json", &p);
    assert!(table.contains("CUDA graphs, TrainHosts::train_hosts: 3 replayed of 3 calls"), "{table}");
    assert!(table.contains("CUDA graphs, Validate::validate: 3 captured of 3 calls"), "{table}");
    std::fs::remove_dir_all(&dir).unwrap();
}
