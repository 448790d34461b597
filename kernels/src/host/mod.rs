//! The batched host: the CNN of spec kasmina §6.1 with every parameter stacked over envs, trained and
//! evaluated as one computation over all envs.

pub mod arch;
pub mod backend;
pub mod counterfactual;
pub mod network;
pub mod params;
pub mod seed_bank;
pub mod slot;
pub mod train;

pub use arch::HostArch;
pub use backend::{
    CpuHostBackend, DeviceReport, EpochTrain, FossilRow, GraphCounts, GraphUse, HostBackend, ParamPrint,
    SeedTelemetry, SlotSync, SnapshotStore, TELEMETRY_STRIDE, ValidationPlan, host_fingerprint,
};
pub use counterfactual::{
    EnvConfigs, EnvCounterfactuals, FusedValidator, PassStart, ValidationPassOrder, counterfactuals_into,
    plan_env_configs,
};
pub use network::HostWorkspace;
pub use params::{HostParams, Stacked};
pub use seed_bank::{Pool, SeedBank, SeedEnvState, SeedMode, SlotParams};
pub use slot::SlotWorkspace;
