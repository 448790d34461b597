//! The numeric state of a run as resources (DESIGN §4: components hold what the lifecycle branches on,
//! resources hold what kernels crunch): the hosts behind their backend seam, and the data.

use crate::resources::ParamCounts;
use bevy_ecs::resource::Resource;
use esper_kernels::data::{Batcher, Dataset};
use esper_kernels::host::{CpuHostBackend, HostBackend};
use esper_kernels::seeds::{self, CnnBlueprint};

/// Where the step is: the run seed, the round (fresh hosts each round), the epoch (1-based), the step
/// index (0-based, counting every step of the run across rounds; the profile's step axis) and the
/// episode length `T` (the epoch that ends an episode; 0 = none, for worlds stepped by hand).
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepClock {
    pub seed: u64,
    pub round: u64,
    pub epoch: u64,
    pub step: u64,
    pub episode_epochs: u64,
}

impl StepClock {
    /// The epoch that ends the round (the episode's time limit; every epoch when none is set).
    pub fn is_last_epoch(&self) -> bool {
        self.epoch >= self.episode_epochs
    }
}

/// Every env's host and seeds behind the [`HostBackend`] seam: systems see only its operations, so a
/// second implementation (a device backend, a test double) installs without touching a system.
#[derive(Resource)]
pub struct Hosts(pub Box<dyn HostBackend>);

impl Hosts {
    /// The CPU backend, when that is the one installed (tests and tools inspect it).
    pub fn as_cpu(&self) -> Option<&CpuHostBackend> {
        self.0.as_any().downcast_ref()
    }

    pub fn as_cpu_mut(&mut self) -> Option<&mut CpuHostBackend> {
        self.0.as_any_mut().downcast_mut()
    }

    /// The trainable parameter counts of the host and of each blueprint at each slot.
    pub fn param_counts(&self) -> ParamCounts {
        let arch = self.0.arch();
        let channels = |&(_, col): &(u8, u8)| arch.block_channels(col as usize);
        let slots = self.0.slot_ids();
        let seed = slots
            .iter()
            .map(|id| {
                let mut row = [0u64; esper_components::BlueprintAction::COUNT];
                for bp in CnnBlueprint::ALL {
                    row[bp.action_index() as usize] = seeds::param_count(bp, channels(id)) as u64;
                }
                row
            })
            .collect();
        let gate = slots.iter().map(|id| seeds::gate_param_count(channels(id)) as u64).collect();
        ParamCounts { host: arch.param_count() as u64, seed, gate }
    }
}

/// Install a backend: `Hosts::from(CpuHostBackend::new(…))`.
impl<B: HostBackend> From<B> for Hosts {
    fn from(backend: B) -> Self {
        Self(Box::new(backend))
    }
}

impl std::ops::Deref for Hosts {
    type Target = dyn HostBackend;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::ops::DerefMut for Hosts {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.0
    }
}

/// The dataset and the per-env batcher (the backend owns its batch buffers).
#[derive(Resource)]
pub struct TrainData {
    pub dataset: Dataset,
    pub batcher: Batcher,
}
