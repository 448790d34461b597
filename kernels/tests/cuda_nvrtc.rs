//! Every CUDA kernel file compiles with NVRTC (`cuda` build only; no GPU needed, only the CUDA 13
//! libraries), defines exactly the kernels its table lists, and the on-disk cache keys what it should.
//!
//! Run here with `CUDA_BUILD_CMD=test bash ../shared/tools/cuda-build.sh -p esper-kernels --test
//! cuda_nvrtc` (see docs/gpu.md for the library path the executable needs).
#![cfg(feature = "cuda")]

use esper_kernels::cuda::{
    CacheOutcome, DEFAULT_ARCH, KERNEL_FILES, KernelCache, KernelFile, KernelSwitches, cache_key, compile,
    compile_all, compile_options_with, translation_unit,
};

/// Asserts that `ptx`, compiled from `file`, defines exactly the kernels its table lists; returns how many.
fn assert_defines_its_kernels(file: &KernelFile, ptx: &str) -> usize {
    let mut found = entries(ptx);
    found.sort();
    let mut listed: Vec<String> = file.functions.iter().map(|f| f.to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "{}: the PTX's kernels differ from the table", file.name);
    found.len()
}

/// The names after `.entry` in a PTX text: the kernels it defines.
fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| line.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or("").to_string())
        .collect()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("esper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_kernel_file_compiles_and_defines_its_listed_kernels() {
    assert!(KERNEL_FILES.len() >= 3, "kernel table lost files");
    let mut total = 0;
    for file in KERNEL_FILES {
        let ptx = compile(file, DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}")).to_src();
        total += assert_defines_its_kernels(file, &ptx);
        assert!(ptx.contains(".target sm_90"), "{}: not compiled for sm_90", file.name);
    }
    assert_eq!(total, KERNEL_FILES.iter().map(|f| f.functions.len()).sum::<usize>());
}

#[test]
fn a_broken_kernel_reports_its_file_and_line() {
    let broken = KernelFile {
        name: "broken.cu",
        source: "extern \"C\" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n",
        functions: &["k"],
    };
    let err = compile(&broken, DEFAULT_ARCH).unwrap_err().to_string();
    assert!(err.starts_with("kernels/cuda/broken.cu: "), "{err}");
    assert!(err.contains("undefined_name"), "{err}");
}

#[test]
fn the_cache_compiles_once_then_reads_and_keys_by_architecture() {
    let dir = temp_dir("kernel-cache");
    let cache = KernelCache::new(Some(dir.clone()));
    let first = compile_all(&cache, DEFAULT_ARCH).unwrap();
    assert!(first.iter().all(|(_, _, outcome)| *outcome == CacheOutcome::Compiled));
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, KERNEL_FILES.len(), "one PTX file per kernel file");
    let second = compile_all(&cache, DEFAULT_ARCH).unwrap();
    assert!(second.iter().all(|(_, _, outcome)| *outcome == CacheOutcome::Hit));
    for ((_, a, _), (_, b, _)) in first.iter().zip(&second) {
        assert_eq!(a, b, "the cached PTX is the compiled PTX");
    }
    // Another architecture is another key and another file; the sm_90 files stay.
    let file = &KERNEL_FILES[0];
    assert_ne!(cache_key(file, DEFAULT_ARCH), cache_key(file, "compute_80"));
    let (ptx80, outcome) = cache.ptx(file, "compute_80").unwrap();
    assert_eq!(outcome, CacheOutcome::Compiled);
    assert!(ptx80.contains(".target sm_80"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), KERNEL_FILES.len() + 1);
    // No cache folder: compiles every time, still correct.
    let (text, outcome) = KernelCache::new(None).ptx(file, DEFAULT_ARCH).unwrap();
    assert_eq!((text.as_str(), outcome), (first[0].1.as_str(), CacheOutcome::Compiled));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The PTX of kernel file `name` (as KERNEL_FILES lists it) compiled with `switches`, as the backend
/// compiles it when the environment sets them.
fn ptx_with(name: &str, switches: KernelSwitches) -> Result<String, cudarc::nvrtc::CompileError> {
    let file = KERNEL_FILES.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} is listed"));
    let options = compile_options_with(DEFAULT_ARCH, switches);
    cudarc::nvrtc::compile_ptx_with_opts(translation_unit(file), options).map(|ptx| ptx.to_src())
}

/// Each kernel of `ptx` with its `.maxntid` (threads a block) and `.minnctapersm` (blocks an SM), in order.
fn launch_bounds(ptx: &str) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = Vec::new();
    for line in ptx.lines().map(str::trim_start) {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            out.push((rest.split(['(', ' ']).next().unwrap_or("").to_string(), 0, 0));
        } else if let (Some(rest), Some(last)) = (line.strip_prefix(".maxntid "), out.last_mut()) {
            last.1 = rest.split(',').next().unwrap().trim().parse().expect("a number of threads");
        } else if let (Some(rest), Some(last)) = (line.strip_prefix(".minnctapersm "), out.last_mut()) {
            last.2 = rest.trim().parse().expect("a number of blocks");
        }
    }
    out
}

#[test]
fn the_tensor_core_kernels_launch_bounds_are_their_own_unless_the_switches_say_otherwise() {
    let compile_with = |min_blocks, n16_warps| {
        let ptx = ptx_with("conv.cu", KernelSwitches { min_blocks, n16_warps, ..KernelSwitches::OWN })
            .expect("conv.cu compiles");
        let mut found: Vec<(String, u32, u32)> =
            launch_bounds(&ptx).into_iter().filter(|(name, _, _)| name.contains("_tc_")).collect();
        found.sort();
        found
    };
    // Each kernel's own (conv.cu's table: three or four blocks where ptxas fits it without spilling in
    // its loops; the square n16 forwards 16 warps).
    let own = compile_with(None, 16);
    assert_eq!(own.len(), 22, "22 tensor-core kernels (6 of them _bnpool): {own:?}");
    let of = |name: &str| own.iter().find(|(n, _, _)| n == name).map(|(_, t, b)| (*t, *b));
    assert_eq!(of("conv3x3_tc_n8_w32_tf32"), Some((256, 3)));
    assert_eq!(of("conv3x3_tc_n16_tf32"), Some((256, 2)));
    assert_eq!(of("conv3x3_tc_n16_w16_tf32"), Some((512, 2)));
    assert_eq!(of("conv3x3_wgrad_tc_n8_w32_tf32"), Some((256, 4)));
    assert_eq!(of("conv3x3_wgrad_tc_n16_w16_tf32"), Some((256, 3)));
    assert_eq!(of("conv3x3_wgrad_tc_n8_w32_bnpool_tf32"), Some((256, 4)));
    assert_eq!(own.iter().filter(|(_, _, b)| *b > 2).count(), 13, "{own:?}");
    assert_eq!(own.iter().filter(|(_, t, _)| *t == 512).count(), 3, "{own:?}");
    // ESPER_CUDA_TC_MIN_BLOCKS=2 and ESPER_CUDA_TC_WIDE=0's options: every one 256 threads and 2 blocks.
    let before = compile_with(Some(2), 8);
    assert_eq!(before.len(), 22);
    assert!(before.iter().all(|(_, t, b)| (*t, *b) == (256, 2)), "{before:?}");
    // Past 2 048 threads an SM the 512-thread forwards keep 4 (ptxas would ignore more).
    let eight = compile_with(Some(8), 16);
    let of = |name: &str| eight.iter().find(|(n, _, _)| n == name).map(|(_, t, b)| (*t, *b));
    assert_eq!((of("conv3x3_tc_n16_w8_tf32"), of("conv3x3_tc_n8_w8_tf32")), (Some((512, 4)), Some((256, 8))));
}

/// The PTX text of kernel `name`: from its `.entry` to the end of its body.
fn kernel_body<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} is in the PTX"));
    let body = &ptx[start..];
    &body[..body.find("\n}").expect("the kernel's body ends")]
}

/// The longest run of 8-byte global loads (`ld.global.v2.f32`: the square weight gradients' dy, one per
/// k-step and n-tile) with no `mma.sync` between them, in the kernel `name` of `ptx`.
fn loads_ahead_of_multiplies(ptx: &str, name: &str) -> usize {
    let body = kernel_body(ptx, name);
    let (mut run, mut longest) = (0, 0);
    for line in body.lines().map(str::trim) {
        if line.starts_with("ld.global.v2.f32") {
            run += 1;
            longest = longest.max(run);
        } else if line.starts_with("mma.sync") {
            run = 0;
        }
    }
    longest
}

#[test]
fn the_square_weight_gradients_issue_a_batch_of_loads_before_its_multiplies() {
    let conv_with = |wg_batch| ptx_with("conv.cu", KernelSwitches { wg_batch, ..KernelSwitches::OWN });
    let ahead = |batch: Option<u32>| {
        let ptx = conv_with(batch).unwrap_or_else(|e| panic!("batch {batch:?}: {e:?}"));
        // n16: two n-tiles, so two loads a k-step.
        loads_ahead_of_multiplies(&ptx, "conv3x3_wgrad_tc_n16_w8_tf32")
    };
    // ESPER_CUDA_WG_BATCH=1, as they ran before: each k-step's two loads, then its multiplies.
    assert_eq!(ahead(Some(1)), 2);
    // conv.cu's own batch of 4 k-steps: eight loads ahead of the first multiply.
    assert_eq!(ahead(None), 8);
    assert_eq!(ahead(Some(16)), 32);
    // conv.cu refuses a batch that does not divide an image group's 16 k-steps.
    assert!(conv_with(Some(3)).is_err(), "a batch of 3 compiled");
}

/// The `cp.async` copies kernel `name` of `ptx` issues after it waits for its earlier ones
/// (`cp.async.wait_all`: a staging landed) and before its next `mma.sync`: the most in one such stretch
/// (the next staging copied while the block goes on to multiply this one), and in all.
fn copies_before_multiplies(ptx: &str, name: &str) -> (usize, usize) {
    let body = kernel_body(ptx, name);
    let (mut run, mut most, mut all) = (0, 0, 0);
    let mut landed = false;
    for line in body.lines().map(str::trim) {
        if line.starts_with("cp.async.wait_all") {
            landed = true;
            run = 0;
        } else if line.starts_with("cp.async.cg.shared.global") {
            all += 1;
            if landed {
                run += 1;
            }
        } else if line.starts_with("mma.sync") && landed {
            most = most.max(run);
            landed = false;
        }
    }
    (most, all)
}

#[test]
fn the_square_tensor_core_kernels_copy_the_next_staging_while_they_multiply() {
    let ptx = |cp_async| {
        ptx_with("conv.cu", KernelSwitches { cp_async, ..KernelSwitches::OWN }).expect("conv.cu compiles")
    };
    let (on, off) = (ptx(true), ptx(false));
    let square: Vec<String> = entries(&on)
        .into_iter()
        .filter(|name| {
            name.contains("_tc_")
                && (name.contains("_w8_") || name.contains("_w16_") || name.contains("_w32_"))
        })
        .collect();
    assert_eq!(
        square.len(),
        18,
        "6 square forwards, 6 square weight gradients and their 6 _bnpool twins: {square:?}"
    );
    for name in &square {
        // CP_ASYNC: after landing a staging (waiting for its copies) a thread issues the next one's
        // copies (a loop: at least one cp.async in the PTX) before it multiplies the landed one.
        let (ahead, all) = copies_before_multiplies(&on, name);
        assert!(ahead >= 1, "{name}: no copy between a landing and the multiplies ({all} in all)");
        // ESPER_CUDA_CP_ASYNC=0: staged between two barriers as before, no copy at all.
        assert_eq!(copies_before_multiplies(&off, name), (0, 0), "{name}");
    }
    // The general kernels (any plane) stage as they load, either way.
    for name in ["conv3x3_tc_n8_tf32", "conv3x3_wgrad_tc_n16_tf32"] {
        assert_eq!(copies_before_multiplies(&on, name), (0, 0), "{name}");
    }
}

#[test]
fn the_staged_group_norms_copy_their_groups_with_cp_async() {
    let ptx = |cp_async| {
        ptx_with("seeds.cu", KernelSwitches { cp_async, ..KernelSwitches::OWN }).expect("seeds.cu compiles")
    };
    let (on, off) = (ptx(true), ptx(false));
    // (kernel, tensors it stages: x; dy and x)
    for (name, tensors) in [("group_norm_forward_staged_f32", 1), ("group_norm_backward_input_staged_f32", 2)]
    {
        let count = |ptx: &str, what: &str| {
            kernel_body(ptx, name).lines().filter(|l| l.trim().starts_with(what)).count()
        };
        // A copy per tensor in the copy loop, waited for once before the barrier.
        assert_eq!(count(&on, "cp.async.cg.shared.global"), tensors, "{name}");
        assert_eq!(count(&on, "cp.async.wait_all"), 1, "{name}");
        // ESPER_CUDA_CP_ASYNC=0: through registers, as before.
        assert_eq!(count(&off, "cp.async"), 0, "{name}");
    }
}

/// The most global loads kernel `name` issues before a global store, since the previous store (or the
/// body's start), in the PTX's order: how many loads a thread of an element-wise pass can have in flight
/// before it must wait (a store holds the loads written after it: the compiler cannot tell the output
/// from the inputs). A warp shuffle ends a run uncounted: it waits for the values it exchanges, so group
/// norm's sums (runs of loads that end in its shuffles) do not count as its epilogue's.
fn loads_between_stores(ptx: &str, name: &str) -> usize {
    let body = kernel_body(ptx, name);
    let (mut run, mut longest) = (0, 0);
    for line in body.lines().map(str::trim) {
        // A predicated instruction: `@%p1 ld.global.f32 …`, `@!%p2 st.global.f32 …`.
        let op = match line.strip_prefix('@') {
            Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, op)| op.trim_start()),
            None => line,
        };
        if op.starts_with("ld.global") {
            run += 1;
        } else if op.starts_with("st.global") {
            longest = longest.max(run);
            run = 0;
        } else if op.starts_with("shfl.sync") {
            run = 0;
        }
    }
    longest
}

#[test]
fn the_element_wise_passes_issue_their_loads_before_their_stores() {
    let ptx_of = |file: &str, loads_ahead| {
        ptx_with(file, KernelSwitches { loads_ahead, ..KernelSwitches::OWN })
            .unwrap_or_else(|e| panic!("{file}: {e:?}"))
    };
    // (file, kernel, the loads a thread issues together with LOADS_AHEAD at least: a 2×2 window's four
    // values with the channel's four parameters, or with the pair's eight coefficients, its routed
    // gradient and winner; two tensors' windows in the slot's blend with the env's mode and selection;
    // a gather's run of four with its slot's draw and index; four elements of for_each_loads_ahead
    // with their second operand.)
    let cases = [
        ("batchnorm.cu", "batch_norm_relu_pool_f32", 8),
        ("batchnorm.cu", "batch_norm_backward_input_from_f32", 14),
        ("seeds.cu", "slot_blend_select_pool_f32", 10),
        ("data.cu", "gather_train_f32", 6),
        ("data.cu", "gather_test_f32", 4),
        ("seeds.cu", "scale_planes_f32", 8),
        ("pool.cu", "global_avg_pool_backward_f32", 8),
        // Group norm's epilogue: eight steps' x and residual (the unstaged kernel: the staged one's copy
        // to shared memory has runs of eight global loads either way).
        ("seeds.cu", "group_norm_forward_f32", 16),
    ];
    let mut report = Vec::new();
    for (file, kernel, least) in cases {
        let ahead = loads_between_stores(&ptx_of(file, true), kernel);
        let one_at_a_time = loads_between_stores(&ptx_of(file, false), kernel);
        report.push(format!("{kernel}: {ahead} ahead, {one_at_a_time} one at a time"));
        assert!(ahead >= least && ahead > one_at_a_time, "{}", report.join("; "));
    }
    // PASS_BOUNDS: the passes whose loads ahead would leave one 1 024-thread block an SM ask for two
    // (at most 32 registers), and only with LOADS_AHEAD.
    for (file, kernel) in [
        ("batchnorm.cu", "batch_norm_relu_pool_f32"),
        ("batchnorm.cu", "batch_norm_backward_input_from_f32"),
        ("pool.cu", "global_avg_pool_backward_f32"),
    ] {
        let blocks = |loads_ahead| {
            let bounds = launch_bounds(&ptx_of(file, loads_ahead));
            let (_, threads, blocks) =
                bounds.into_iter().find(|(name, ..)| name == kernel).expect("in the PTX");
            (threads, blocks)
        };
        assert_eq!(blocks(true), (1024, 2), "{kernel}");
        assert_eq!(blocks(false), (1024, 0), "{kernel}");
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn every_kernel_file_compiles_with_every_switch_set_back() {
    // The switches that restore the kernels as they were measured last (docs/gpu.md): each one's other
    // side of the preprocessor must compile too, or an A/B on the device would fail where it starts.
    let before = KernelSwitches {
        min_blocks: Some(2),
        n16_warps: 8,
        wg_batch: Some(1),
        loads_ahead: false,
        cp_async: false,
        spaced_tiles: false,
    };
    let options = compile_options_with(DEFAULT_ARCH, before).options;
    assert!(options.iter().any(|o| o == "-DLOADS_ONE_AT_A_TIME"), "{options:?}");
    assert!(options.iter().any(|o| o == "-DCP_ASYNC_OFF"), "{options:?}");
    assert!(options.iter().any(|o| o == "-DTC_PACKED_TILES"), "{options:?}");
    for file in KERNEL_FILES {
        let ptx = ptx_with(file.name, before).unwrap_or_else(|e| panic!("{}: {e:?}", file.name));
        assert_defines_its_kernels(file, &ptx);
    }
}
