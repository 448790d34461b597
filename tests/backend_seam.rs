//! The host seam: a test double installed as the `Hosts` backend drives the unchanged step schedule. The
//! systems sync every slot through it, take its per-env epoch results, validation results and gradient
//! telemetry into the components, and take / restore governor snapshots through it — nothing else.

use esper_components::governor::GovernorState;
use esper_components::{BlueprintAction, GradientTelemetry, HostMetrics, SeedStage};
use esper_ecs::config::{PolicyKind, RunConfig, RunPlan};
use esper_ecs::run::Session;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::train::SeedGradStats;
use esper_kernels::host::{
    EnvCounterfactuals, EpochTrain, FossilRow, HostArch, HostBackend, ParamPrint, SeedMode, SeedTelemetry,
    SlotSync, ValidationPlan,
};
use esper_kernels::seeds::CnnBlueprint;
use esper_systems::host_resources::Hosts;
use std::any::Any;

use crate::common;
use common::{env_row, force_seed, slot_component};

const ENVS: usize = 2;
/// The epoch at which the double reports a NaN validation loss for env 0.
const NAN_EPOCH: u64 = 7;

/// Scripted numbers, and a log of every call the systems make.
struct Double {
    arch: HostArch,
    slot_ids: Vec<(u8, u8)>,
    epoch: u64,
    results: Vec<EnvCounterfactuals>,
    syncs: Vec<(u64, usize, usize, SlotSync)>,
    train_calls: usize,
    /// The last epoch's scripted results.
    trained: Vec<EpochTrain>,
    /// Train, validate and the reads of the epoch's results and telemetry, in call order.
    calls: Vec<&'static str>,
    /// `[slot][env]` fossil flags of the last validation plan.
    last_plan: Vec<Vec<bool>>,
    snapshots: Vec<(u64, usize, Vec<Option<FossilRow>>)>,
    restored: Vec<(u64, usize)>,
    resets: Vec<(u64, u64)>,
}

impl Double {
    fn new(arch: HostArch, slot_ids: &[(u8, u8)]) -> Self {
        Self {
            arch,
            slot_ids: slot_ids.to_vec(),
            epoch: 0,
            results: vec![],
            syncs: vec![],
            train_calls: 0,
            trained: vec![],
            calls: vec![],
            last_plan: vec![],
            snapshots: vec![],
            restored: vec![],
            resets: vec![],
        }
    }

    fn val_acc(epoch: u64, env: usize) -> f64 {
        30.0 + epoch as f64 + 10.0 * env as f64
    }
}

impl HostBackend for Double {
    fn arch(&self) -> HostArch {
        self.arch
    }
    fn n_envs(&self) -> usize {
        ENVS
    }
    fn slot_ids(&self) -> &[(u8, u8)] {
        &self.slot_ids
    }
    fn sync_slot(&mut self, env: usize, slot: usize, sync: &SlotSync) {
        self.syncs.push((self.epoch + 1, env, slot, *sync));
    }
    fn train_epoch(&mut self, _data: &Dataset, _batcher: &Batcher) {
        self.epoch += 1;
        self.train_calls += 1;
        self.calls.push("train");
        self.trained = (0..ENVS)
            .map(|e| EpochTrain { loss: 2.0 + e as f64, accuracy: 20.0 + self.epoch as f64 })
            .collect();
    }
    fn epoch_train(&mut self) -> &[EpochTrain] {
        self.calls.push("results");
        &self.trained
    }
    fn validate(
        &mut self,
        _data: &Dataset,
        _batcher: &Batcher,
        plan: ValidationPlan<'_>,
    ) -> &[EnvCounterfactuals] {
        self.calls.push("validate");
        self.last_plan = plan.fossilized.to_vec();
        self.results = (0..ENVS)
            .map(|e| EnvCounterfactuals {
                val_acc: Self::val_acc(self.epoch, e),
                val_loss: if e == 0 && self.epoch == NAN_EPOCH { f64::NAN } else { 1.5 },
                config_acc: vec![Self::val_acc(self.epoch, e)],
                ..EnvCounterfactuals::default()
            })
            .collect();
        &self.results
    }
    fn validation_configs(&self, env: usize) -> usize {
        self.results.get(env).map_or(0, |r| r.config_acc.len())
    }
    fn seed_telemetry(&mut self, slot: usize, env: usize) -> Option<SeedTelemetry> {
        if self.calls.last() != Some(&"telemetry") {
            self.calls.push("telemetry");
        }
        (slot == 0 && env == 1).then_some(SeedTelemetry {
            stats: SeedGradStats { norm: 0.25, health: 0.75, elements: 100, ..SeedGradStats::default() },
            host_norm: 0.5,
        })
    }
    fn take_snapshot(&mut self, env: usize, fossils: &[Option<FossilRow>]) {
        self.snapshots.push((self.epoch, env, fossils.to_vec()));
    }
    fn restore_snapshot(&mut self, env: usize) {
        self.restored.push((self.epoch, env));
    }
    fn reset_round(&mut self, seed: u64, round: u64) {
        self.resets.push((seed, round));
    }
    fn param_fingerprints(&self, checksums: &mut [u64], prints: &mut [ParamPrint]) {
        for (env, checksum) in checksums.iter_mut().enumerate() {
            *checksum = self.epoch * 100 + env as u64;
        }
        let groups = prints.len() / checksums.len();
        for (env, p) in prints.chunks_mut(groups).enumerate() {
            p.fill(ParamPrint { sum: env as f64, sum_sq: self.epoch as f64 });
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn plan(epochs: usize) -> RunPlan {
    let out = std::env::temp_dir().join(format!("esper-seam-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let config = RunConfig {
        envs: ENVS,
        epochs,
        policy: PolicyKind::Static,
        batch_per_env: 16,
        synthetic_train_per_env: 32,
        synthetic_test_per_env: 16,
        ..RunConfig::default()
    };
    config.plan_in(out, true).expect("a valid tiny config")
}

#[test]
fn a_test_double_backend_runs_the_step_schedule_unchanged() {
    let plan = plan(10);
    let mut s = Session::new(&plan).unwrap();
    let (arch, slot_ids) = {
        let hosts = s.world.resource::<Hosts>();
        (hosts.arch(), hosts.slot_ids().to_vec())
    };
    let n_slots = slot_ids.len();
    assert!(n_slots >= 1);
    s.world.insert_resource(Hosts::from(Double::new(arch, &slot_ids)));
    // A seed in env 1, slot 0 (the lifecycle's state; the double gets the germination through its sync).
    force_seed(&mut s.world, 1, 0, SeedStage::Blending, BlueprintAction::ConvLight, 0.5);
    for epoch in 1..=NAN_EPOCH {
        s.run_epoch(epoch);
        let w = &mut s.world;
        for e in 0..ENVS {
            let m = env_row(w, e, |m: &HostMetrics| *m);
            assert_eq!(m.train_loss, 2.0 + e as f64, "epoch {epoch} env {e}: the backend's training loss");
            assert_eq!(m.train_accuracy, 20.0 + epoch as f64);
            assert_eq!(m.val_accuracy, Double::val_acc(epoch, e), "epoch {epoch} env {e}: validation");
        }
    }
    let w = &mut s.world;
    let telemetry = slot_component::<GradientTelemetry>(w, 1, 0);
    assert_eq!((telemetry.gradient_norm, telemetry.gradient_health), (Some(0.25), Some(0.75)));
    assert_eq!(slot_component::<GradientTelemetry>(w, 0, 0).gradient_norm, None, "no telemetry, none copied");
    let double = w.resource::<Hosts>().as_any().downcast_ref::<Double>().unwrap();
    assert_eq!(double.train_calls, NAN_EPOCH as usize);
    // Each epoch's results and telemetry are read after validation, once (what lets a device return
    // them with the validation pass's sums, in one copy).
    let per_epoch = ["train", "validate", "results", "telemetry"];
    assert_eq!(double.calls.len(), per_epoch.len() * NAN_EPOCH as usize, "{:?}", double.calls);
    for (i, epoch) in double.calls.chunks(per_epoch.len()).enumerate() {
        assert_eq!(epoch, per_epoch, "epoch {}", i + 1);
    }
    // Every slot of every env synced once per epoch; the forced seed arrives as a germination with its
    // blueprint, then runs ADD at 0.5; every other slot is off.
    assert_eq!(double.syncs.len(), NAN_EPOCH as usize * ENVS * n_slots);
    for &(epoch, env, slot, sync) in &double.syncs {
        if (env, slot) == (1, 0) {
            let expected = (epoch == 1).then_some((CnnBlueprint::ConvLight, false));
            assert_eq!(sync.germinate, expected, "epoch {epoch}");
            assert_eq!((sync.state.mode, sync.state.alpha), (SeedMode::Add, 0.5), "epoch {epoch}");
        } else {
            assert_eq!(
                (sync.germinate, sync.state.mode),
                (None, SeedMode::Off),
                "epoch {epoch} env {env} slot {slot}"
            );
        }
    }
    assert_eq!(double.last_plan.len(), n_slots, "validation plan is [slot][env]");
    assert!(double.last_plan.iter().all(|v| v.len() == ENVS && v.iter().all(|&f| !f)));
    // The governor snapshots healthy envs through the backend (no fossils here), and rolls env 0 back
    // when the backend reports a NaN validation loss.
    assert!(double.snapshots.len() >= ENVS, "{:?}", double.snapshots);
    assert!(double.snapshots.iter().all(|(_, _, f)| f.len() == n_slots && f.iter().all(Option::is_none)));
    assert_eq!(double.restored, vec![(NAN_EPOCH, 0)]);
    assert_eq!(env_row(w, 0, |g: &GovernorState| g.panic_reason), None, "rolled back and reset");
    // A new round resets the backend.
    s.start_round(1);
    let double = s.world.resource::<Hosts>().as_any().downcast_ref::<Double>().unwrap();
    assert_eq!(double.resets, vec![(plan.config.seed, 1)]);
}
