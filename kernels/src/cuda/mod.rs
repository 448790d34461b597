//! The CUDA side of the numeric layer (cargo feature `cuda`): the kernel sources in `kernels/cuda/*.cu`,
//! each the twin of a CPU op, compiled at run time with NVRTC and cached on disk.
//!
//! Compiling needs only NVRTC, not a GPU, so [`compile_all`] runs on any machine with the CUDA 13
//! libraries (the `cuda` build's tests do it here); loading and launching need the driver:
//! [`parity::run`] checks every kernel against its CPU twin on a device (`esper-ecs selftest`).
//! The device backend is being built: [`host::DeviceHost`] trains and evaluates the seedless host on
//! the device, and [`CudaHostBackend`] puts it behind the `HostBackend` seam for seedless workloads
//! (both checked by the selftest against their CPU twins); seeds on the device come next.

pub mod backend;
mod cache;
pub mod epoch_graph;
pub mod gate;
pub mod gemm_conv;
pub mod host;
pub mod ops;
pub mod parity;
pub mod rows;
pub mod seed_module;
pub mod slot;
mod sources;

pub use backend::CudaHostBackend;
pub use cache::{CacheOutcome, KernelCache, cache_key, default_cache_dir};
pub use sources::{COMMON_HEADER, KERNEL_FILES, KernelFile};

use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

/// The GPU architecture the kernels are compiled for when none is named: sm_90 (H100 / H200).
pub const DEFAULT_ARCH: &str = "compute_90";

/// Why a kernel file did not compile.
#[derive(Debug)]
pub struct KernelCompileError {
    pub file: &'static str,
    pub message: String,
}

impl std::fmt::Display for KernelCompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernels/cuda/{}: {}", self.file, self.message)
    }
}

impl std::error::Error for KernelCompileError {}

/// The NVRTC options every kernel file is compiled with, for `arch` (`compute_90`, …).
///
/// `--fmad=false`: the CPU twins never fuse a multiply and an add (Rust does not contract), so the
/// element-wise kernels (SGD, scaling, blends) give the same bits only without contraction.
///
/// The kernels' measuring switches ([`KernelSwitches::from_env`]) reach them as NVRTC defines, part of
/// the cache key, so builds of the two sides never mix, to measure them on one machine.
pub fn compile_options(arch: &'static str) -> CompileOptions {
    compile_options_with(arch, KernelSwitches::from_env())
}

/// The measuring switches that reach the kernels as NVRTC defines (docs/gpu.md lists them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSwitches {
    /// `ESPER_CUDA_TC_MIN_BLOCKS=N` (1 to 8): every kernel's launch bounds ask for N blocks an SM
    /// (`-DTC_MIN_BLOCKS=N`) instead of each kernel's own choice (conv.cu, `TC_BLOCKS`).
    pub min_blocks: Option<u32>,
    /// The square n16 forwards' warps: 16, or 8 with `ESPER_CUDA_TC_WIDE=0` (`-DTC_N16_NARROW`;
    /// [`tc_n16_warps`], which the launcher reads too).
    pub n16_warps: u32,
    /// `ESPER_CUDA_WG_BATCH=N` (1, 2, 4, 8 or 16): the k-steps of the square weight gradients whose
    /// global loads are issued together (`-DTC_WG_BATCH=N`; conv.cu's own: 4). 1 is how they ran
    /// before: a load's whole latency waited per k-step.
    pub wg_batch: Option<u32>,
    /// `ESPER_CUDA_LOADS_AHEAD=0` (`-DLOADS_ONE_AT_A_TIME`): batch norm's reductions, the square
    /// tensor-core kernels' staging and the square forwards' weights, the 2×2 windows of the fused
    /// normalisation + pool, its backward and the slots' blend + pool, the batch gathers, the
    /// attention seed's scaling, the average pool's backward and group norm's residual epilogue use
    /// each global load right after issuing it (or after the previous store), instead of issuing
    /// several first (common.cuh, `LOADS_AHEAD`), and three of those passes no longer ask for two
    /// blocks an SM (`PASS_BOUNDS`). What it does not put back: `relu_bn_backward_partial_f32`'s loop
    /// per case, the pooled one with the routed gradient as selects rather than branches (2026-11-28,
    /// the same values either way).
    pub loads_ahead: bool,
    /// `ESPER_CUDA_CP_ASYNC=0` (`-DCP_ASYNC_OFF`): no `cp.async` (common.cuh, `CP_ASYNC`; also off
    /// with `loads_ahead` off). The square tensor-core kernels stage each chunk (forward) or image
    /// group (weight gradient) between two barriers, as they did, instead of copying the next one
    /// into shared memory while they multiply the current one; the staged group norms copy their
    /// groups through registers, eight loads a thread at a time. The same values either way.
    pub cp_async: bool,
    /// `ESPER_CUDA_TC_SPACED=0` (`-DTC_PACKED_TILES`): the square tensor-core kernels stage their
    /// padded planes packed, as they did, instead of in rows and planes spaced so that their K loops'
    /// shared loads are free of bank conflicts (conv.cu, `square_strides`: 1.7 – 2.7 passes over the
    /// banks a load packed at W = 32, 1.0 spaced, as the kernel emulator counts them). The same values
    /// either way.
    pub spaced_tiles: bool,
}

impl KernelSwitches {
    /// Every kernel's own choice: no define.
    pub const OWN: KernelSwitches = KernelSwitches {
        min_blocks: None,
        n16_warps: 16,
        wg_batch: None,
        loads_ahead: true,
        cp_async: true,
        spaced_tiles: true,
    };

    /// The switches as the environment sets them, read once (a warning, once, on a value out of range,
    /// which leaves the kernels' own choice).
    pub fn from_env() -> KernelSwitches {
        static SWITCHES: std::sync::LazyLock<KernelSwitches> = std::sync::LazyLock::new(|| KernelSwitches {
            min_blocks: switch_from_env(
                "ESPER_CUDA_TC_MIN_BLOCKS",
                parse_min_blocks,
                "a number of blocks from 1 to 8",
            ),
            n16_warps: if std::env::var("ESPER_CUDA_TC_WIDE").is_ok_and(|v| v == "0") { 8 } else { 16 },
            wg_batch: switch_from_env("ESPER_CUDA_WG_BATCH", parse_wg_batch, "1, 2, 4, 8 or 16 k-steps"),
            loads_ahead: on_unless_zero("ESPER_CUDA_LOADS_AHEAD"),
            cp_async: on_unless_zero("ESPER_CUDA_CP_ASYNC"),
            spaced_tiles: on_unless_zero("ESPER_CUDA_TC_SPACED"),
        });
        *SWITCHES
    }
}

/// [`compile_options`] with the kernels' switches given.
pub fn compile_options_with(arch: &'static str, tc: KernelSwitches) -> CompileOptions {
    assert!(
        matches!(tc.n16_warps, 8 | 16),
        "the square n16 forwards run 8 or 16 warps, not {}",
        tc.n16_warps
    );
    let mut options = vec!["--std=c++17".to_string()];
    if let Some(blocks) = tc.min_blocks {
        options.push(format!("-DTC_MIN_BLOCKS={blocks}"));
    }
    if tc.n16_warps == 8 {
        options.push("-DTC_N16_NARROW".to_string());
    }
    if let Some(batch) = tc.wg_batch {
        options.push(format!("-DTC_WG_BATCH={batch}"));
    }
    if !tc.loads_ahead {
        options.push("-DLOADS_ONE_AT_A_TIME".to_string());
    }
    if !tc.cp_async {
        options.push("-DCP_ASYNC_OFF".to_string());
    }
    if !tc.spaced_tiles {
        options.push("-DTC_PACKED_TILES".to_string());
    }
    CompileOptions { fmad: Some(false), arch: Some(arch), options, ..Default::default() }
}

/// The warps of the square n16 tensor-core forwards (`conv3x3_tc_n16_w{8,16,32}_tf32`): 16 of 4
/// m-tiles each (64 registers, two blocks of 512 threads an SM), or 8 of 8 with `ESPER_CUDA_TC_WIDE=0`
/// (126 registers, two blocks of 256), as they were built before. The same sums, bit for bit.
pub fn tc_n16_warps() -> u32 {
    KernelSwitches::from_env().n16_warps
}

/// The switch `name` as `parse` reads it; `None` where it is unset, or set to something `parse` refuses
/// (with a warning that says what `expected` is: the kernels' own choice then stands).
fn switch_from_env<T>(name: &str, parse: fn(&str) -> Option<T>, expected: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    parse(&text).or_else(|| {
        eprintln!("warning: {name}={text:?} ignored: expected {expected}");
        None
    })
}

/// `ESPER_CUDA_TC_MIN_BLOCKS`: a number of blocks from 1 to 8.
fn parse_min_blocks(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|blocks| (1..=8).contains(blocks))
}

/// An on/off switch `name`: false where it is `0`, true otherwise (`1` or unset; anything else warns).
fn on_unless_zero(name: &str) -> bool {
    let parse = |text: &str| match text {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    };
    switch_from_env(name, parse, "0 or 1").unwrap_or(true)
}

/// `ESPER_CUDA_WG_BATCH`: 1, 2, 4, 8 or 16 k-steps, a batch that divides an image group's 16 (conv.cu's
/// static_assert says the same).
fn parse_wg_batch(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|batch: &u32| batch.is_power_of_two() && *batch <= 16)
}

/// The text NVRTC compiles for `file`: the shared header, then the file.
pub fn translation_unit(file: &KernelFile) -> String {
    format!("{COMMON_HEADER}\n// ---- {} ----\n{}", file.name, file.source)
}

/// Compiles one kernel file to PTX with NVRTC (no cache).
pub fn compile(file: &KernelFile, arch: &'static str) -> Result<Ptx, KernelCompileError> {
    let options = compile_options(arch);
    let options = CompileOptions { name: Some(file.name.to_string()), ..options };
    compile_ptx_with_opts(translation_unit(file), options).map_err(|e| KernelCompileError {
        file: file.name,
        message: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// Every kernel file's PTX for `arch`, through `cache`: `(file, PTX text, hit or compiled)`.
pub fn compile_all(
    cache: &KernelCache,
    arch: &'static str,
) -> Result<Vec<(&'static KernelFile, String, CacheOutcome)>, KernelCompileError> {
    KERNEL_FILES.iter().map(|file| cache.ptx(file, arch).map(|(ptx, outcome)| (file, ptx, outcome))).collect()
}

#[cfg(test)]
mod tests {
    use super::{parse_min_blocks, parse_wg_batch};

    #[test]
    fn min_blocks_takes_one_to_eight_and_nothing_else() {
        assert_eq!(parse_min_blocks("2"), Some(2));
        assert_eq!(parse_min_blocks(" 4\n"), Some(4));
        assert_eq!(parse_min_blocks("8"), Some(8));
        for bad in ["0", "9", "-1", "", "two", "2.5"] {
            assert_eq!(parse_min_blocks(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn wg_batch_takes_the_divisors_of_sixteen_and_nothing_else() {
        let accepted: Vec<u32> = (0..=40).filter_map(|n| parse_wg_batch(&n.to_string())).collect();
        assert_eq!(accepted, [1, 2, 4, 8, 16]);
        assert_eq!(parse_wg_batch(" 8\n"), Some(8));
        for bad in ["", "four", "-4", "4.0", "32"] {
            assert_eq!(parse_wg_batch(bad), None, "{bad:?}");
        }
    }
}
