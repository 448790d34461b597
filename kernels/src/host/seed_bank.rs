//! The seed parameters of every slot of every env ("sleeper seeds", DESIGN §2 rule 3): for each slot,
//! one `[E, P]` pool per blueprint and one `[E, G]` pool for the GatedBlend gate, each with gradients
//! and momentum. Germinate re-initialises one env's row in place; prune and fossilize only flip the
//! env's [`SeedEnvState`] or zero its momentum. Nothing is allocated by a lifecycle op.

use crate::ops::Real;
use crate::rng::{Purpose, StreamKey};
use crate::seeds::{self, CnnBlueprint};

/// How one env's seed at a slot takes part in this epoch's forward pass (kasmina §4.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SeedMode {
    /// Identity: empty slot, GERMINATED, or a cooldown stage. The seed is not evaluated.
    #[default]
    Off,
    /// TRAINING at alpha 0 without an override: `y = h + (s − stopgrad(s))`, value exactly `h`, the
    /// seed gets the full output gradient, the host the same gradient as without a seed.
    Incubator,
    /// `y = h + a·(s − h)`.
    Add,
    /// `y = h·(1 + a·tanh(s − x_s))`.
    Multiply,
    /// `y = h + clamp01(a·g(x_s))·(s − h)` with a per-sample gate.
    Gate,
}

impl SeedMode {
    /// The seed runs in a training forward (every mode but Off) or an evaluation forward (the blending
    /// modes only: an incubator's output value is exactly `h`).
    pub fn runs_in(self, train: bool) -> bool {
        match self {
            SeedMode::Off => false,
            SeedMode::Incubator => train,
            SeedMode::Add | SeedMode::Multiply | SeedMode::Gate => true,
        }
    }
}

/// One env's seed at one slot, as the lifecycle sets it at each epoch boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SeedEnvState {
    pub mode: SeedMode,
    /// The module the slot holds (GERMINATED..FOSSILIZED); None when empty or in cooldown.
    pub blueprint: Option<CnnBlueprint>,
    pub alpha: f32,
    /// The seed's parameters get gradients and take SGD steps (active stage, not blend-out frozen).
    pub train_seed: bool,
    /// Gate gradients are computed (and clipped with the seed's) — GATE mode, not frozen.
    pub gate_grad: bool,
    /// The gate is in the seed optimizer: only after the optimizer is rebuilt at fossilization
    /// (kasmina §8.2 c); before that its gradients are computed and clipped but never applied.
    pub gate_step: bool,
    /// Gradient-health statistics are collected for this seed (TRAINING or BLENDING).
    pub collect_stats: bool,
}

/// `[E, P]` parameters with their gradients and momentum.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool<T> {
    pub row_len: usize,
    pub params: Vec<T>,
    pub grads: Vec<T>,
    pub momentum: Vec<T>,
}

impl<T: Real> Pool<T> {
    fn new(n_envs: usize, row_len: usize) -> Self {
        let zeros = || vec![T::ZERO; n_envs * row_len];
        Self { row_len, params: zeros(), grads: zeros(), momentum: zeros() }
    }

    pub fn row(&self, env: usize) -> &[T] {
        &self.params[env * self.row_len..(env + 1) * self.row_len]
    }

    pub fn row_mut(&mut self, env: usize) -> &mut [T] {
        &mut self.params[env * self.row_len..(env + 1) * self.row_len]
    }

    pub fn grad_row(&self, env: usize) -> &[T] {
        &self.grads[env * self.row_len..(env + 1) * self.row_len]
    }

    pub fn zero_momentum(&mut self, env: usize) {
        self.momentum[env * self.row_len..(env + 1) * self.row_len].fill(T::ZERO);
    }
}

/// Every env's seed parameters at one slot.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotParams<T> {
    pub channels: usize,
    /// Spatial size (height = width) of the activation at this slot.
    pub size: usize,
    /// Indexed by `CnnBlueprint as usize − 1`.
    pub pools: Vec<Pool<T>>,
    pub gate: Pool<T>,
    /// `[E]`: what each env's seed does this epoch.
    pub state: Vec<SeedEnvState>,
}

impl<T: Real> SlotParams<T> {
    pub fn new(n_envs: usize, channels: usize, size: usize) -> Self {
        Self {
            channels,
            size,
            pools: CnnBlueprint::ALL
                .iter()
                .map(|&bp| Pool::new(n_envs, seeds::param_count(bp, channels)))
                .collect(),
            gate: Pool::new(n_envs, seeds::gate_param_count(channels)),
            state: vec![SeedEnvState::default(); n_envs],
        }
    }

    pub fn n_envs(&self) -> usize {
        self.state.len()
    }

    pub fn pool(&self, bp: CnnBlueprint) -> &Pool<T> {
        &self.pools[bp as usize - 1]
    }

    pub fn pool_mut(&mut self, bp: CnnBlueprint) -> &mut Pool<T> {
        &mut self.pools[bp as usize - 1]
    }

    /// Any env's seed takes part in a forward: in training every seed that is not off, in evaluation only
    /// the blending ones (an incubator's output value is exactly `h`, so eval never runs it).
    pub fn any_active_in(&self, train: bool) -> bool {
        self.state.iter().any(|s| s.mode.runs_in(train))
    }

    /// Germinate: re-initialise env `env`'s row of `bp` from its own stream and reset its optimizer
    /// state (momentum). `stream_key` names the draw: `(seed, round, env_id, SeedInit)` at `counter`.
    pub fn germinate(&mut self, env: usize, bp: CnnBlueprint, multiply: bool, key: StreamKey, counter: u64) {
        debug_assert_eq!(key.purpose, Purpose::SeedInit);
        let channels = self.channels;
        let pool = self.pool_mut(bp);
        let mut stream = key.stream(counter);
        let row_len = pool.row_len;
        seeds::init_row(
            bp,
            channels,
            multiply,
            &mut stream,
            &mut pool.params[env * row_len..(env + 1) * row_len],
        );
        pool.zero_momentum(env);
    }

    /// A new gate for env `env` (entering gated BLENDING, or switching to GATE).
    pub fn create_gate(&mut self, env: usize, key: StreamKey, counter: u64) {
        let mut stream = key.stream(counter);
        let g = &mut self.gate;
        let n = g.row_len;
        seeds::gate_init_row(self.channels, &mut stream, &mut g.params[env * n..(env + 1) * n]);
        g.zero_momentum(env);
    }

    /// Fossilize / rollback: the seed optimizer is rebuilt, so momentum starts again from zero.
    pub fn reset_momentum(&mut self, env: usize) {
        for pool in &mut self.pools {
            pool.zero_momentum(env);
        }
        self.gate.zero_momentum(env);
    }

    /// A one-env copy of env `env` (parameters, momentum and state).
    pub fn extract_env(&self, env: usize) -> Self {
        let mut out = Self::new(1, self.channels, self.size);
        self.gather_rows(&[env], &mut out);
        for (dst, src) in
            out.pools.iter_mut().chain([&mut out.gate]).zip(self.pools.iter().chain([&self.gate]))
        {
            dst.momentum.copy_from_slice(&src.momentum[env * src.row_len..(env + 1) * src.row_len]);
        }
        out
    }

    /// A copy holding the rows `rows[v]` for each new env `v` (validation's virtual envs).
    pub fn gather_rows(&self, rows: &[usize], out: &mut SlotParams<T>) {
        assert_eq!(out.n_envs(), rows.len());
        for (dst, src) in
            out.pools.iter_mut().chain([&mut out.gate]).zip(self.pools.iter().chain([&self.gate]))
        {
            for (v, &e) in rows.iter().enumerate() {
                dst.params[v * src.row_len..(v + 1) * src.row_len].copy_from_slice(src.row(e));
            }
        }
        for (v, &e) in rows.iter().enumerate() {
            out.state[v] = self.state[e];
        }
    }
}

/// The seed parameters of every enabled slot: `r0[b]` after block `b` (before its pool), `r1[b]` after
/// its pool. Slots that are not enabled are None and cost nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct SeedBank<T> {
    pub r0: Vec<Option<SlotParams<T>>>,
    pub r1: Vec<Option<SlotParams<T>>>,
}

impl<T: Real> SeedBank<T> {
    /// Pools for the enabled slots `(row, col)` of `arch` for `n_envs` envs.
    pub fn new(arch: &super::HostArch, n_envs: usize, slots: &[(u8, u8)]) -> Self {
        let mut bank = Self { r0: vec![None; arch.n_blocks], r1: vec![None; arch.n_blocks] };
        for &(row, col) in slots {
            let b = col as usize;
            assert!(b < arch.n_blocks, "slot r{row}c{col}: the host has {} blocks", arch.n_blocks);
            let c = arch.block_channels(b);
            match row {
                0 => bank.r0[b] = Some(SlotParams::new(n_envs, c, arch.block_size(b))),
                1 => {
                    assert!(arch.pools_after(b), "slot r1c{col}: block {b} has no pool");
                    bank.r1[b] = Some(SlotParams::new(n_envs, c, arch.block_size(b) / 2));
                }
                _ => panic!("slot r{row}c{col}: CNN hosts have rows 0 and 1"),
            }
        }
        bank
    }

    /// A one-env copy of env `env`'s seeds.
    pub fn extract_env(&self, env: usize) -> Self {
        let one = |v: &Vec<Option<SlotParams<T>>>| {
            v.iter().map(|s| s.as_ref().map(|s| s.extract_env(env))).collect()
        };
        Self { r0: one(&self.r0), r1: one(&self.r1) }
    }

    /// No slots at all (the plain host).
    pub fn empty(arch: &super::HostArch) -> Self {
        Self { r0: vec![None; arch.n_blocks], r1: vec![None; arch.n_blocks] }
    }

    pub fn get(&self, row: u8, col: u8) -> Option<&SlotParams<T>> {
        let v = if row == 0 { &self.r0 } else { &self.r1 };
        v.get(col as usize).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, row: u8, col: u8) -> Option<&mut SlotParams<T>> {
        let v = if row == 0 { &mut self.r0 } else { &mut self.r1 };
        v.get_mut(col as usize).and_then(Option::as_mut)
    }

    /// Every enabled slot, in canonical (row, col) order.
    pub fn slots(&self) -> impl Iterator<Item = &SlotParams<T>> {
        self.r0.iter().chain(&self.r1).flatten()
    }

    /// The enabled slot with canonical index `k` (its `SlotIndex`).
    pub fn slot_mut(&mut self, k: usize) -> Option<&mut SlotParams<T>> {
        self.slots_mut().nth(k)
    }

    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut SlotParams<T>> {
        self.r0.iter_mut().chain(&mut self.r1).flatten()
    }
}
