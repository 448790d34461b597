//! DESIGN §2 rule 4: no allocation in the hot loop once the first step has run. A counting global
//! allocator counts the allocations made on the thread that runs the work (a one-thread rayon pool, so
//! every op runs on that thread) during a training step and a fused validation pass after a warm-up.

use esper_kernels::host::train::Trainer;
use esper_kernels::host::{
    EnvCounterfactuals, FusedValidator, HostParams, HostWorkspace, SeedBank, SeedMode,
};
use esper_kernels::seeds::CnnBlueprint;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;
use common::{ARCH, SLOTS, randomize_pools, seed_state as state, stream, with_threads};

struct Counting;

thread_local! {
    /// Allocations on this thread while counting; None when not counting.
    static COUNT: Cell<Option<usize>> = const { Cell::new(None) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note_allocation() {
    // `try_with`: the thread-local may already be gone while a thread shuts down.
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations made on this thread by `f`.
fn allocations(f: impl FnOnce()) -> usize {
    COUNT.with(|c| c.set(Some(0)));
    f();
    COUNT.with(|c| c.replace(None)).unwrap_or(0)
}

/// Three envs with 0, 2 and 3 blending seeds of different blueprints and blends.
fn world(envs: usize, batch: usize) -> (HostParams<f32>, SeedBank<f32>, Vec<f32>, Vec<u8>) {
    let ids: Vec<u64> = (0..envs as u64).collect();
    let params = HostParams::init(ARCH, 5, 0, &ids);
    let mut bank = SeedBank::new(&ARCH, envs, &SLOTS);
    let mut s = stream(6);
    randomize_pools(&mut bank, &mut s);
    let seeds = [
        (1, 0, state(SeedMode::Add, CnnBlueprint::ConvLight, 0.5)),
        (1, 2, state(SeedMode::Gate, CnnBlueprint::Attention, 0.4)),
        (2, 0, state(SeedMode::Multiply, CnnBlueprint::Depthwise, 0.6)),
        (2, 1, state(SeedMode::Add, CnnBlueprint::ConvHeavy, 0.3)),
        (2, 2, state(SeedMode::Add, CnnBlueprint::Bottleneck, 0.7)),
    ];
    for (env, slot, st) in seeds {
        bank.slots_mut().nth(slot).unwrap().state[env] = st;
    }
    let images = (0..envs * batch * ARCH.image_len()).map(|_| s.normal() as f32).collect();
    let labels = (0..envs * batch).map(|_| s.below(10) as u8).collect();
    (params, bank, images, labels)
}

/// The bench's state: every env blends a seed by ADD at every slot (`blueprints` in slot order: r0c0,
/// r0c1, r1c1), so each r0 slot hands its host gradient back in the pool's terms.
fn world_all_add(
    envs: usize,
    batch: usize,
    blueprints: [CnnBlueprint; 3],
) -> (HostParams<f32>, SeedBank<f32>, Vec<f32>, Vec<u8>) {
    let (params, mut bank, images, labels) = world(envs, batch);
    for (slot, bp) in bank.slots_mut().zip(blueprints) {
        for e in 0..envs {
            slot.state[e] = state(SeedMode::Add, bp, 0.5);
        }
    }
    (params, bank, images, labels)
}

/// Allocations in the third and fourth training step (with statistics, without), after two warm-ups.
fn step_allocations(world: (HostParams<f32>, SeedBank<f32>, Vec<f32>, Vec<u8>), batch: usize) -> [usize; 2] {
    let (mut params, mut bank, images, labels) = world;
    let mut ws = HostWorkspace::with_slots(ARCH, params.n_envs(), batch, &bank);
    let mut trainer = Trainer::new(&params, &bank);
    let counts = with_threads(1, || {
        // Warm-up: buffers and per-thread scratch reach their sizes, with and without statistics.
        trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, true);
        trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, false);
        [true, false].map(|stats| {
            allocations(|| trainer.step(&mut params, &mut bank, &mut ws, &images, &labels, stats))
        })
    });
    assert!(trainer.seed_stats.iter().flatten().any(Option::is_some), "statistics were collected");
    counts
}

#[test]
fn a_training_step_allocates_nothing_after_the_first() {
    let counts = step_allocations(world(3, 8), 8);
    assert_eq!(counts, [0, 0], "allocations in a step with statistics, without");
}

#[test]
fn a_training_step_with_every_env_blending_by_add_allocates_nothing_after_the_first() {
    use CnnBlueprint::{Attention, ConvHeavy, ConvLight};
    // Each conv seed once at an r0 slot (its gradient from the pool's), attention at r0 (from the blend).
    for blueprints in [[ConvLight, Attention, ConvHeavy], [ConvHeavy, Attention, ConvLight]] {
        let counts = step_allocations(world_all_add(3, 8, blueprints), 8);
        assert_eq!(counts, [0, 0], "{blueprints:?}: allocations in a step with statistics, without");
    }
}

/// Plans and runs one validation batch twice over `bank` in chunks of `chunk` virtual envs; returns the
/// validator, the results and the allocations of the second pass.
fn second_validation_pass(
    bank: &mut SeedBank<f32>,
    params: &HostParams<f32>,
    images: &[f32],
    labels: &[u8],
    chunk: usize,
) -> (FusedValidator<f32>, Vec<EnvCounterfactuals>, usize) {
    let (envs, batch) = (params.n_envs(), labels.len() / params.n_envs());
    let fossilized = vec![vec![false; envs]; SLOTS.len()];
    let counts = [6, 4, 5];
    let mut validator = FusedValidator::new(ARCH, bank, &SLOTS, chunk, batch);
    let mut main = HostWorkspace::with_slots(ARCH, envs, batch, bank);
    let mut results: Vec<EnvCounterfactuals> = Vec::new();
    let mut pass = |validator: &mut FusedValidator<f32>, results: &mut Vec<EnvCounterfactuals>| {
        validator.plan(bank, &fossilized);
        validator.run_batch(&mut main, params, bank, images, labels, &counts);
        validator.results_into(results);
    };
    let count = with_threads(1, || {
        pass(&mut validator, &mut results);
        allocations(|| pass(&mut validator, &mut results))
    });
    (validator, results, count)
}

#[test]
fn a_fused_validation_pass_allocates_nothing_after_the_first() {
    let (params, mut bank, images, labels) = world(3, 6);
    let (validator, results, count) = second_validation_pass(&mut bank, &params, &images, &labels, 4);
    // The plan is the one the seeds call for (1 + 4 + 8 configurations), and the results are filled in.
    assert_eq!(validator.virtual_env_count(), 13);
    assert_eq!(results.iter().map(|r| r.config_acc.len()).collect::<Vec<_>>(), vec![1, 4, 8]);
    assert_eq!(results[2].interactions.len(), 3);
    assert_eq!(count, 0, "allocations in the second validation pass");
}

/// The passes that run on the caller's parameters and bank in place (one row per env, the seeds'
/// states swapped in for the pass) allocate nothing either, and leave the bank as it was.
#[test]
fn an_in_place_validation_pass_allocates_nothing_after_the_first() {
    let envs = 3;
    let (params, mut bank, images, labels) = world(envs, 6);
    for e in 0..envs {
        bank.slots_mut().next().unwrap().state[e] = state(SeedMode::Add, CnnBlueprint::ConvLight, 0.5);
        bank.slots_mut().nth(1).unwrap().state[e] = state(SeedMode::Multiply, CnnBlueprint::Attention, 0.4);
        bank.slots_mut().nth(2).unwrap().state[e] = Default::default();
    }
    let before = bank.clone();
    let (validator, _, count) = second_validation_pass(&mut bank, &params, &images, &labels, envs);
    // Two ablatable seeds per env: main, each one off, both off — the three non-main ones in place.
    assert_eq!(validator.virtual_env_count(), 4 * envs);
    assert_eq!(validator.in_place_passes(), 3);
    assert_eq!(count, 0, "allocations in the second validation pass");
    assert_eq!(bank, before, "the bank's states are put back");
}
