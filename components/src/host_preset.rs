//! Host presets (spec kasmina §6.1, §6.3): the CIFAR CNN hosts as configurations of one architecture,
//! their injection points and parameter counts. Pure data; the kernels build the batched network from it.

use crate::slot_id::{SlotConfig, SlotId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The CNNHost constructor arguments: `n_blocks` conv blocks (k×k conv without bias → batch norm →
/// ReLU), block `i` with `base_channels · 2^i` output channels, a 2×2 max-pool after the first
/// `pool_layers` blocks, then global average pool and a linear head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CnnHostSpec {
    pub in_channels: u32,
    pub image_size: u32,
    pub num_classes: u32,
    pub base_channels: u32,
    pub n_blocks: u32,
    pub kernel_size: u32,
    pub pool_layers: u32,
}

/// Where a seed can be injected: after block `col` (row 0, before its pool) or after pool `col` (row 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectionPoint {
    pub id: SlotId,
    /// Spec `order`: row 0 gets 0..n_blocks, row 1 gets n_blocks + i (row-major = canonical order).
    pub order: u32,
    pub channels: u32,
    /// Spatial size (height = width) of the activation at this point.
    pub size: u32,
}

impl CnnHostSpec {
    pub fn block_channels(&self, block: u32) -> u32 {
        self.base_channels << block
    }

    /// Spatial size at the output of block `block` (before its pool).
    pub fn block_size(&self, block: u32) -> u32 {
        self.image_size >> block.min(self.pool_layers)
    }

    fn pools_after(&self, block: u32) -> bool {
        block < self.pool_layers.min(self.n_blocks)
    }

    /// Every injection point, in canonical (row, col) order.
    pub fn injection_points(&self) -> Vec<InjectionPoint> {
        let pre = (0..self.n_blocks).map(|i| InjectionPoint {
            id: SlotId::new(0, i as u8),
            order: i,
            channels: self.block_channels(i),
            size: self.block_size(i),
        });
        let post = (0..self.n_blocks).filter(|&i| self.pools_after(i)).map(|i| InjectionPoint {
            id: SlotId::new(1, i as u8),
            order: self.n_blocks + i,
            channels: self.block_channels(i),
            size: self.block_size(i) / 2,
        });
        pre.chain(post).collect()
    }

    /// Forward execution order of the injection points: r0c0, r1c0, r0c1, r1c1, …
    pub fn execution_order(&self) -> Vec<SlotId> {
        (0..self.n_blocks)
            .flat_map(|i| {
                let post = self.pools_after(i).then_some(SlotId::new(1, i as u8));
                std::iter::once(SlotId::new(0, i as u8)).chain(post)
            })
            .collect()
    }

    pub fn injection_point(&self, id: SlotId) -> Option<InjectionPoint> {
        self.injection_points().into_iter().find(|p| p.id == id)
    }

    /// Trainable host parameters: conv weights, batch-norm affine pairs, the linear head.
    pub fn param_count(&self) -> u64 {
        let k2 = (self.kernel_size * self.kernel_size) as u64;
        let mut total = 0u64;
        let mut c_in = self.in_channels as u64;
        for i in 0..self.n_blocks {
            let c_out = self.block_channels(i) as u64;
            total += k2 * c_in * c_out + 2 * c_out;
            c_in = c_out;
        }
        total + c_in * self.num_classes as u64 + self.num_classes as u64
    }

    /// The enabled slots of this host in canonical order; ids the host does not have are an error.
    pub fn slot_config(&self, enabled: &SlotConfig) -> Result<SlotConfig, HostSlotError> {
        for &id in enabled.ids() {
            if self.injection_point(id).is_none() {
                let available = self.injection_points().iter().map(|p| p.id.to_string()).collect();
                return Err(HostSlotError { id, available });
            }
        }
        Ok(enabled.clone())
    }
}

/// A requested slot is not an injection point of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSlotError {
    pub id: SlotId,
    pub available: Vec<String>,
}

impl fmt::Display for HostSlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {} is not an injection point of this host (it has {})",
            self.id,
            self.available.join(", ")
        )
    }
}

impl std::error::Error for HostSlotError {}

/// The CIFAR task presets of the reference (`runtime/tasks.py`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskPreset {
    #[default]
    CifarBaseline,
    CifarMultichannel,
    CifarScale,
    CifarDeepMultichannel,
    CifarImpaired,
    CifarMinimal,
    CifarPostpool,
    CifarHighres,
    CifarDeepImpaired,
}

impl TaskPreset {
    pub const ALL: [TaskPreset; 9] = [
        Self::CifarBaseline,
        Self::CifarMultichannel,
        Self::CifarScale,
        Self::CifarDeepMultichannel,
        Self::CifarImpaired,
        Self::CifarMinimal,
        Self::CifarPostpool,
        Self::CifarHighres,
        Self::CifarDeepImpaired,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::CifarBaseline => "cifar_baseline",
            Self::CifarMultichannel => "cifar_multichannel",
            Self::CifarScale => "cifar_scale",
            Self::CifarDeepMultichannel => "cifar_deep_multichannel",
            Self::CifarImpaired => "cifar_impaired",
            Self::CifarMinimal => "cifar_minimal",
            Self::CifarPostpool => "cifar_postpool",
            Self::CifarHighres => "cifar_highres",
            Self::CifarDeepImpaired => "cifar_deep_impaired",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    pub fn host(self) -> CnnHostSpec {
        let spec = |base, n_blocks, kernel_size, pool_layers| CnnHostSpec {
            in_channels: 3,
            image_size: 32,
            num_classes: 10,
            base_channels: base,
            n_blocks,
            kernel_size,
            pool_layers,
        };
        match self {
            Self::CifarBaseline | Self::CifarMultichannel => spec(8, 3, 3, 3),
            Self::CifarScale | Self::CifarDeepMultichannel => spec(8, 5, 3, 5),
            Self::CifarImpaired => spec(1, 3, 1, 3),
            Self::CifarMinimal => spec(2, 3, 1, 0),
            Self::CifarPostpool | Self::CifarHighres => spec(16, 3, 3, 3),
            Self::CifarDeepImpaired => spec(2, 5, 1, 5),
        }
    }
}

impl fmt::Display for TaskPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
