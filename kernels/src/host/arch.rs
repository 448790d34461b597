//! The CNN host's shape (spec kasmina §6.1): `n_blocks` blocks of k×k conv (no bias) → batch norm → ReLU,
//! a 2×2 max-pool after each of the first `pool_layers` blocks, then global average pool and a linear head.
//! The same code serves every CIFAR preset; `esper_components::CnnHostSpec` converts into this.

/// The host architecture, shared by every env.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostArch {
    pub in_channels: usize,
    pub image_size: usize,
    pub num_classes: usize,
    pub base_channels: usize,
    pub n_blocks: usize,
    pub kernel_size: usize,
    pub pool_layers: usize,
}

impl HostArch {
    /// cifar_baseline: base 8, 3 blocks, k = 3, pool after every block (6,418 parameters).
    pub const CIFAR_BASELINE: HostArch = HostArch {
        in_channels: 3,
        image_size: 32,
        num_classes: 10,
        base_channels: 8,
        n_blocks: 3,
        kernel_size: 3,
        pool_layers: 3,
    };

    pub fn block_in_channels(&self, block: usize) -> usize {
        if block == 0 { self.in_channels } else { self.block_channels(block - 1) }
    }

    pub fn block_channels(&self, block: usize) -> usize {
        self.base_channels << block
    }

    /// Block `block`'s convolution over `envs` × `batch` images: k×k, padding k / 2, one group.
    pub fn block_conv(&self, block: usize, envs: usize, batch: usize) -> crate::ops::Conv2dShape {
        let size = self.block_size(block);
        crate::ops::Conv2dShape {
            envs,
            batch,
            c_in: self.block_in_channels(block),
            c_out: self.block_channels(block),
            h: size,
            w: size,
            k: self.kernel_size,
            pad: self.kernel_size / 2,
            groups: 1,
        }
    }

    /// Block `block`'s batch norm (and the ReLU after it) over `envs` × `batch` images: the conv's output.
    pub fn block_norm(&self, block: usize, envs: usize, batch: usize) -> crate::ops::norm::NormShape {
        let size = self.block_size(block);
        crate::ops::norm::NormShape { envs, batch, channels: self.block_channels(block), h: size, w: size }
    }

    /// Spatial size of block `block`'s input and output (the conv keeps it).
    pub fn block_size(&self, block: usize) -> usize {
        self.image_size >> block.min(self.pool_layers)
    }

    pub fn pools_after(&self, block: usize) -> bool {
        block < self.pool_layers.min(self.n_blocks)
    }

    /// Spatial size after block `block` and its pool, if any.
    pub fn block_output_size(&self, block: usize) -> usize {
        self.block_size(block) >> usize::from(self.pools_after(block))
    }

    pub fn head_in(&self) -> usize {
        self.block_channels(self.n_blocks - 1)
    }

    /// Per-env length of every trainable tensor, in [`HostParams`](super::HostParams) order:
    /// for each block conv weight, BN γ, BN β; then head weight, head bias.
    pub fn tensor_lens(&self) -> Vec<usize> {
        let k2 = self.kernel_size * self.kernel_size;
        let mut lens = Vec::with_capacity(3 * self.n_blocks + 2);
        for b in 0..self.n_blocks {
            let c = self.block_channels(b);
            lens.extend([k2 * self.block_in_channels(b) * c, c, c]);
        }
        lens.extend([self.num_classes * self.head_in(), self.num_classes]);
        lens
    }

    pub fn param_count(&self) -> usize {
        self.tensor_lens().iter().sum()
    }

    pub fn image_len(&self) -> usize {
        self.in_channels * self.image_size * self.image_size
    }

    /// Multiply-adds of one image's forward: each block's k×k convolution (`c_in → c_out` at the
    /// block's size) and the head. The norms, ReLUs and pools (a few operations per value) are left out.
    pub fn forward_macs(&self) -> u64 {
        (0..self.n_blocks).map(|b| self.block_macs(b)).sum::<u64>() + self.head_macs()
    }

    /// Multiply-adds of block `block`'s convolution for one image.
    pub fn block_macs(&self, block: usize) -> u64 {
        let k2 = (self.kernel_size * self.kernel_size) as u64;
        let plane = (self.block_size(block) * self.block_size(block)) as u64;
        k2 * plane * (self.block_in_channels(block) * self.block_channels(block)) as u64
    }

    /// Multiply-adds of the linear head for one image.
    pub fn head_macs(&self) -> u64 {
        (self.head_in() * self.num_classes) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-derived for cifar_baseline (3 → 8 → 16 → 32 channels at 32, 16, 8): 9·1024·3·8 +
    /// 9·256·8·16 + 9·64·16·32 for the convolutions, 32·10 for the head.
    #[test]
    fn cifar_baselines_forward_is_811_328_multiply_adds_per_image() {
        assert_eq!(HostArch::CIFAR_BASELINE.forward_macs(), 221_184 + 294_912 + 294_912 + 320);
        assert_eq!(HostArch::CIFAR_BASELINE.forward_macs(), 811_328);
    }
}
