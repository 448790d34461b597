//! Fused validation with counterfactual ablations (kasmina §8.3, simic §3.1).
//!
//! Each env's ablation configurations become extra rows of the env axis: configuration `k` of env `e`
//! is a *virtual env* with env `e`'s parameters, env `e`'s test images and the alpha of every slot in
//! the configuration's off-set forced to 0. All virtual envs run through one eval forward (in chunks of
//! at most `max_virtual_envs` to bound memory). Because every op is env-parallel with a fixed
//! reduction order, each virtual env's result is bit-identical to evaluating that configuration alone.
//!
//! An ablated seed at alpha 0 contributes exactly `h` (ADD `h + 0·(s − h)`, MULTIPLY `h·(1 + 0)`, GATE
//! `a_eff = 0`), so it is switched off rather than evaluated. (The reference would propagate a NaN seed
//! output through `0·NaN`; the governor catches such envs anyway.) Identical configurations are
//! evaluated once: for one ablatable seed, solo-on is the main configuration, and committed is all-off
//! while fossilized seeds are not ablatable.

use super::arch::HostArch;
use super::network::HostWorkspace;
use super::params::HostParams;
use super::seed_bank::{SeedBank, SeedEnvState, SeedMode, SlotParams};
use super::train::{ValTotals, accumulate_validation};
use crate::ops::Real;
use rayon::prelude::*;

/// Most slots an ablation mask can name.
pub const MAX_ABLATABLE: usize = 16;

/// The configurations of one env, as indices into its list of distinct off-masks (index 0 = main).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvConfigs {
    /// Ablatable slots (indices into the bank's canonical slot order), ascending.
    pub slots: Vec<usize>,
    /// Distinct off-masks (bit k = canonical slot k forced to alpha 0); `masks[0] == 0` (main).
    pub masks: Vec<u16>,
    /// `solo_off[i]`: slot `slots[i]` off (leave-one-out).
    pub solo_off: Vec<usize>,
    /// `solo_on[i]`: every ablatable slot but `slots[i]` off.
    pub solo_on: Vec<usize>,
    /// Every ablatable slot off, when 2 ≤ n ≤ 4.
    pub all_off: Option<usize>,
    /// `(i, j, config)`: all but `slots[i]`, `slots[j]` off, when 3 ≤ n ≤ 4.
    pub pairs: Vec<(usize, usize, usize)>,
    /// Every non-fossilized ablatable slot off, when there is one (fossils are ablatable only while
    /// the BASIC_PLUS drip is on).
    pub committed: Option<usize>,
}

impl EnvConfigs {
    /// The configurations for an env whose ablatable slots (alpha > 0, not FOSSILIZED) are `slots`.
    pub fn new(slots: &[usize]) -> Self {
        let mut c = EnvConfigs::default();
        c.rebuild(slots, 0);
        c
    }

    /// Replans in place for the ablatable `slots`, of which those with bit `k` set in `fossils` hold a
    /// fossil (left on in the committed configuration), reusing the lists' memory (once every list has
    /// reached its size, a replan allocates nothing).
    pub fn rebuild(&mut self, slots: &[usize], fossils: u16) {
        assert!(slots.iter().all(|&s| s < MAX_ABLATABLE), "at most {MAX_ABLATABLE} slots");
        self.slots.clear();
        self.slots.extend_from_slice(slots);
        self.masks.clear();
        self.masks.push(0);
        self.solo_off.clear();
        self.solo_on.clear();
        self.pairs.clear();
        self.all_off = None;
        self.committed = None;
        let bit = |i: usize| 1u16 << slots[i];
        let all: u16 = (0..slots.len()).map(bit).fold(0, |a, b| a | b);
        let n = slots.len();
        for i in 0..n {
            let k = self.intern(bit(i));
            self.solo_off.push(k);
        }
        for i in 0..n {
            let k = self.intern(all & !bit(i));
            self.solo_on.push(k);
        }
        if (2..=4).contains(&n) {
            self.all_off = Some(self.intern(all));
        }
        if (3..=4).contains(&n) {
            for i in 0..n {
                for j in i + 1..n {
                    let k = self.intern(all & !bit(i) & !bit(j));
                    self.pairs.push((i, j, k));
                }
            }
        }
        let non_fossil = all & !fossils;
        if non_fossil != 0 {
            self.committed = Some(self.intern(non_fossil));
        }
    }

    fn intern(&mut self, mask: u16) -> usize {
        match self.masks.iter().position(|&m| m == mask) {
            Some(k) => k,
            None => {
                self.masks.push(mask);
                self.masks.len() - 1
            }
        }
    }
}

/// Per-env results of one fused validation pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvCounterfactuals {
    /// The ablated slots (canonical indices), ascending: `contribution[i]` and the pair indices of
    /// `interactions` refer to `slots[i]`.
    pub slots: Vec<usize>,
    pub val_acc: f64,
    pub val_loss: f64,
    /// Accuracy of every configuration (`configs.masks` order; index 0 = main).
    pub config_acc: Vec<f64>,
    /// `contribution[i] = val_acc − acc(slot i off)`, for `configs.slots[i]`.
    pub contribution: Vec<f64>,
    pub solo_on_acc: Vec<f64>,
    pub all_off_acc: Option<f64>,
    /// f(∅): the all-off accuracy, or the lowest leave-one-out accuracy when there is no all-off
    /// configuration; None when nothing was ablated. `cf_imp = val_acc − f(∅)` (simic §3.2).
    pub empty_acc: Option<f64>,
    pub committed_acc: Option<f64>,
    /// `(i, j, I_ij)` with `I_ij = f({i,j}) − f({i}) − f({j}) + f(∅)`; f(∅) falls back to the lowest
    /// leave-one-out accuracy when there is no all-off configuration.
    pub interactions: Vec<(usize, usize, f64)>,
}

/// A run of the virtual-env workspace: every row starts from the same slot.
#[derive(Clone, Debug)]
struct Pass {
    /// The slot the rows start from (`(block, row)`): the first slot, in network order, each row's
    /// configuration turns off.
    start: (usize, u8),
    /// Rows: a range of `FusedValidator::pass_rows` (virtual env indices), at most `chunk` of them.
    rows: std::ops::Range<usize>,
}

/// Runs the fused pass: owns the virtual-env parameters, workspace and totals, reused every epoch.
///
/// Every configuration of an env agrees with the main one (every seed as it is) up to the first slot it
/// turns off, so only the main configuration runs from the images, over the real envs (in the caller's
/// workspace, with the real parameters). Every other configuration starts from the main forward's
/// activation at its first ablated slot: the virtual rows that share that slot run together, reading
/// the activation in place when they are one row per env in env order (else gathered), with their host
/// and seed parameter rows gathered (kilobytes per row; no images are copied).
#[derive(Debug)]
pub struct FusedValidator<T> {
    arch: HostArch,
    slot_ids: Vec<(u8, u8)>,
    chunk: usize,
    batch: usize,
    pub configs: Vec<EnvConfigs>,
    /// Keep FOSSILIZED seeds in the ablation set (the BASIC_PLUS drip needs their contribution,
    /// simic §3.1). Off by default.
    pub ablate_fossils: bool,
    /// `(env, mask)` of every virtual env; an env's configurations are consecutive, main first.
    virtual_envs: Vec<(usize, u16)>,
    /// Per canonical slot: its `(block, row)` in the network.
    positions: Vec<(usize, u8)>,
    passes: Vec<Pass>,
    pass_rows: Vec<usize>,
    /// Plan scratch: per env, its virtual envs starting at one slot.
    per_env: Vec<Vec<usize>>,
    /// Per slot `[E]`: the seed states of an in-place pass (the configuration's off-set switched off),
    /// swapped into the caller's bank for that pass and back.
    held_states: Vec<Vec<SeedEnvState>>,
    params: HostParams<T>,
    bank: SeedBank<T>,
    ws: HostWorkspace<T>,
    /// A gathered start activation `[chunk, B, …]`, for passes whose rows are not one per env in order.
    start_input: Vec<T>,
    labels: Vec<u8>,
    counts: Vec<usize>,
    chunk_totals: ValTotals,
    totals: ValTotals,
    /// Passes of the last batch that read the main activation in place.
    in_place_passes: usize,
    /// Every env has the same configurations and the workspace holds one row per env: the passes run
    /// in place in [`ValidationPassOrder`]'s order, each from the latest slot input its own choices
    /// made (the main pass's or an earlier counterfactual pass's).
    tree: bool,
    pass_order: ValidationPassOrder,
    /// Passes of the last batch that started from an activation an earlier counterfactual pass
    /// computed (the tree).
    reused_passes: usize,
}

impl<T: Real> FusedValidator<T> {
    /// A validator for `bank`'s slots, evaluating at most `max_virtual_envs` virtual envs per forward
    /// and `batch` test images per env per forward.
    pub fn new(
        arch: HostArch,
        bank: &SeedBank<T>,
        slot_ids: &[(u8, u8)],
        max_virtual_envs: usize,
        batch: usize,
    ) -> Self {
        let chunk = max_virtual_envs.max(1);
        let params = HostParams::zeros(arch, chunk);
        let chunk_bank = SeedBank::new(&arch, chunk, slot_ids);
        assert_eq!(chunk_bank.slots().count(), bank.slots().count(), "slot list does not match the bank");
        let ws = HostWorkspace::with_slots(arch, chunk, batch, &chunk_bank);
        let mut positions: Vec<(usize, u8)> =
            slot_ids.iter().map(|&(row, col)| (col as usize, row)).collect();
        // Canonical slot order is the bank's: every row-0 slot by column, then every row-1 slot.
        positions.sort_by_key(|&(block, row)| (row, block));
        let largest_slot_input = (0..arch.n_blocks)
            .map(|b| batch * arch.block_channels(b) * arch.block_size(b).pow(2))
            .max()
            .unwrap_or(0);
        Self {
            arch,
            slot_ids: slot_ids.to_vec(),
            chunk,
            batch,
            configs: vec![],
            ablate_fossils: false,
            virtual_envs: vec![],
            positions,
            passes: vec![],
            pass_rows: vec![],
            per_env: vec![],
            held_states: vec![],
            params,
            bank: chunk_bank,
            ws,
            start_input: vec![T::ZERO; chunk * largest_slot_input],
            labels: vec![0; chunk * batch],
            counts: vec![0; chunk],
            chunk_totals: ValTotals::new(chunk),
            totals: ValTotals::default(),
            in_place_passes: 0,
            tree: false,
            pass_order: ValidationPassOrder::default(),
            reused_passes: 0,
        }
    }

    /// Plan this epoch's configurations from the bank's current states: a slot is ablatable in env `e`
    /// when its seed blends (ADD / MULTIPLY / GATE) at alpha > 0 and `fossilized[slot][e]` is false
    /// (or [`Self::ablate_fossils`] is set).
    /// Reuses the plan's memory: once the lists have reached their sizes, a replan allocates nothing.
    pub fn plan(&mut self, bank: &SeedBank<T>, fossilized: &[Vec<bool>]) {
        let n_envs = bank.slots().next().map_or(0, |s| s.n_envs());
        plan_env_configs(n_envs, bank, fossilized, self.ablate_fossils, &mut self.configs);
        self.virtual_envs.clear();
        for (e, configs) in self.configs.iter().enumerate() {
            self.virtual_envs.extend(configs.masks.iter().map(|&m| (e, m)));
        }
        self.totals.resize(self.virtual_envs.len());
        self.held_states.resize_with(self.positions.len(), Vec::new);
        for held in &mut self.held_states {
            held.clear();
            held.reserve(n_envs);
        }
        let configs = &self.configs;
        self.tree = n_envs == self.chunk && configs.iter().all(|c| c.masks == configs[0].masks);
        if self.tree {
            self.pass_order.plan(&self.configs, &self.positions);
        } else {
            self.plan_passes(n_envs);
        }
    }

    /// The passes: for each start slot in network order, the `j`-th virtual env of every env that has
    /// one starting there, in env order, cut into chunks.
    fn plan_passes(&mut self, n_envs: usize) {
        self.passes.clear();
        self.pass_rows.clear();
        self.per_env.resize_with(n_envs, Vec::new);
        let mut by_network_order: [usize; MAX_ABLATABLE] = std::array::from_fn(|k| k);
        let n_slots = self.positions.len();
        by_network_order[..n_slots].sort_by_key(|&k| self.positions[k]);
        for &k in &by_network_order[..n_slots] {
            for list in &mut self.per_env {
                list.clear();
            }
            for (v, &(e, mask)) in self.virtual_envs.iter().enumerate() {
                let first_off = by_network_order[..n_slots].iter().find(|&&j| mask & (1 << j) != 0);
                if first_off == Some(&k) {
                    self.per_env[e].push(v);
                }
            }
            let depth = self.per_env.iter().map(Vec::len).max().unwrap_or(0);
            for j in 0..depth {
                let first = self.pass_rows.len();
                self.pass_rows.extend(self.per_env.iter().filter_map(|list| list.get(j)));
                for start in (first..self.pass_rows.len()).step_by(self.chunk) {
                    let end = (start + self.chunk).min(self.pass_rows.len());
                    self.passes.push(Pass { start: self.positions[k], rows: start..end });
                }
            }
        }
    }

    /// How many passes of the last batch read the main forward's activation in place (one row per env,
    /// in env order) rather than gathering it.
    pub fn in_place_passes(&self) -> usize {
        self.in_place_passes
    }

    /// How many passes of the last batch started from an activation an earlier counterfactual pass
    /// computed rather than the main forward's (the passes ran as a tree: every env has the same
    /// configurations).
    pub fn reused_passes(&self) -> usize {
        self.reused_passes
    }

    /// Number of virtual envs (Σ configurations) this epoch.
    pub fn virtual_env_count(&self) -> usize {
        self.virtual_envs.len()
    }

    /// Evaluate one test batch (`images` `[E, B, C, H, W]`, `labels` `[E, B]` with this validator's batch
    /// `B`, `counts[e]` valid rows of env `e`, at most `B`) for every configuration. The main configuration
    /// runs in `main` (a workspace over the real envs with the validator's batch and the bank's slots:
    /// the trainer's, say), which then holds its activations for the others to start from. A pass of one
    /// row per env in env order runs on `params` and `bank` themselves, with the configuration's seeds
    /// switched off for that pass only (the bank's states are put back before this returns); other passes
    /// gather their rows.
    #[allow(clippy::too_many_arguments)]
    pub fn run_batch(
        &mut self,
        main: &mut HostWorkspace<T>,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        images: &[T],
        labels: &[u8],
        counts: &[usize],
    ) {
        let b = self.batch;
        assert_eq!(main.batch, b, "the main workspace must have the validator's batch");
        for &c in counts {
            assert!(c <= b, "test batch of {c} images per env exceeds the validator's {b}");
        }
        main.forward_eval(params, &*bank, images);
        self.chunk_totals.resize(main.envs);
        accumulate_validation(&main.logits, b, self.arch.num_classes, labels, counts, &mut self.chunk_totals);
        let mut first = 0;
        for (e, c) in self.configs.iter().enumerate() {
            self.totals.add_row(first, &self.chunk_totals, e);
            first += c.masks.len();
        }
        self.chunk_totals.resize(self.chunk);
        self.in_place_passes = 0;
        self.reused_passes = 0;
        if self.tree {
            self.run_tree(main, params, bank, labels, counts);
            return;
        }
        for p in 0..self.passes.len() {
            let Pass { start: (block, row), rows: range } = self.passes[p].clone();
            let rows = &self.pass_rows[range.clone()];
            let n = rows.len();
            // One row per env, in env order, filling the workspace: the main activation is read in place.
            let in_place = n == self.chunk
                && n == main.envs
                && rows.iter().enumerate().all(|(i, &v)| self.virtual_envs[v].0 == i);
            let h = main.slot_input(block, row);
            self.chunk_totals.reset();
            if in_place {
                self.in_place_passes += 1;
                // Every env's own parameters and activation, in place: only the seeds' modes differ.
                let virtual_envs = &self.virtual_envs;
                let off = |k: usize, e: usize| virtual_envs[rows[e]].1 & (1 << k) != 0;
                let (ws, held) = (&mut self.ws, &mut self.held_states);
                forward_with_seeds_off(ws, held, bank, params, (block, row), Some(h), off);
                let classes = self.arch.num_classes;
                accumulate_validation(&self.ws.logits, b, classes, labels, counts, &mut self.chunk_totals);
            } else {
                self.run_gathered(range.clone(), block, row, h, main.envs, params, &*bank, labels, counts);
            }
            let rows = &self.pass_rows[range];
            for (i, &v) in rows.iter().enumerate() {
                self.totals.add_row(v, &self.chunk_totals, i);
            }
        }
    }

    /// The counterfactual passes of a batch when every env has the same configurations (see
    /// [`Self::tree`]): in [`ValidationPassOrder`]'s order, in place, each from the main forward's
    /// activation at its start or, where an earlier pass rewrote it, the workspace's own.
    fn run_tree(
        &mut self,
        main: &HostWorkspace<T>,
        params: &HostParams<T>,
        bank: &mut SeedBank<T>,
        labels: &[u8],
        counts: &[usize],
    ) {
        let (b, classes) = (self.batch, self.arch.num_classes);
        let masks = &self.configs[0].masks;
        // The workspace holds every slot input after the earliest start so far.
        let mut earliest: Option<(usize, u8)> = None;
        for &(j, start) in &self.pass_order.order()[1..] {
            let start = start.expect("every counterfactual pass starts at a slot");
            let (block, row) = start;
            let own = earliest.is_some_and(|first| start > first);
            let h = (!own).then(|| main.slot_input(block, row));
            let off = |k: usize, _: usize| masks[j] & (1 << k) != 0;
            forward_with_seeds_off(&mut self.ws, &mut self.held_states, bank, params, start, h, off);
            self.chunk_totals.reset();
            accumulate_validation(&self.ws.logits, b, classes, labels, counts, &mut self.chunk_totals);
            for e in 0..main.envs {
                self.totals.add_row(e * masks.len() + j, &self.chunk_totals, e);
            }
            earliest = Some(earliest.map_or(start, |first| first.min(start)));
            self.in_place_passes += 1;
            self.reused_passes += usize::from(own);
        }
    }

    /// A pass whose rows are not one per env in env order: their parameter rows, seed rows (the
    /// configuration's off-set switched off), labels and start activations gathered into the
    /// validator's own buffers; unused rows count nothing.
    #[allow(clippy::too_many_arguments)]
    fn run_gathered(
        &mut self,
        range: std::ops::Range<usize>,
        block: usize,
        row: u8,
        h: &[T],
        main_envs: usize,
        params: &HostParams<T>,
        bank: &SeedBank<T>,
        labels: &[u8],
        counts: &[usize],
    ) {
        let (b, chunk, classes) = (self.batch, self.chunk, self.arch.num_classes);
        let Self { pass_rows, virtual_envs, start_input, ws, chunk_totals, .. } = self;
        let (vparams, vbank, vlabels, vcounts) =
            (&mut self.params, &mut self.bank, &mut self.labels, &mut self.counts);
        let rows = &pass_rows[range];
        let n = rows.len();
        let per_row = h.len() / main_envs;
        for (i, &v) in rows.iter().enumerate() {
            let (e, mask) = virtual_envs[v];
            vparams.copy_env_row_from(params, e, i);
            for (k, (src, dst)) in bank.slots().zip(vbank.slots_mut()).enumerate() {
                copy_slot_row(src, dst, e, i);
                if mask & (1 << k) != 0 {
                    dst.state[i].mode = SeedMode::Off;
                }
            }
            vlabels[i * b..(i + 1) * b].copy_from_slice(&labels[e * b..(e + 1) * b]);
            vcounts[i] = counts[e];
        }
        // Unused rows of a short pass: nothing to count, seeds off, the start slot's input zero.
        vcounts[n..chunk].fill(0);
        for slot in vbank.slots_mut() {
            for st in &mut slot.state[n..chunk] {
                st.mode = SeedMode::Off;
            }
        }
        let buf = &mut start_input[..chunk * per_row];
        buf.par_chunks_mut(per_row).enumerate().for_each(|(i, dst)| match rows.get(i) {
            Some(&v) => {
                let e = virtual_envs[v].0;
                dst.copy_from_slice(&h[e * per_row..(e + 1) * per_row]);
            }
            None => dst.fill(T::ZERO),
        });
        ws.forward_eval_from_slot(block, row, Some(&start_input[..chunk * per_row]), vparams, vbank);
        accumulate_validation(&ws.logits, b, classes, vlabels, vcounts, chunk_totals);
    }

    /// Per-env results of the pass so far.
    pub fn results(&self) -> Vec<EnvCounterfactuals> {
        let mut out = Vec::new();
        self.results_into(&mut out);
        out
    }

    /// [`Self::results`] into `out`, reusing its memory (once it has held a pass of the same shape, this
    /// allocates nothing).
    pub fn results_into(&self, out: &mut Vec<EnvCounterfactuals>) {
        counterfactuals_into(&self.configs, &self.totals, out);
    }

    pub fn slot_ids(&self) -> &[(u8, u8)] {
        &self.slot_ids
    }
}

/// `ws`'s evaluation forward from slot `(block, row)` over `h` (None: `ws`'s own activation there) on
/// the caller's parameters and bank, with the seed of slot `k` switched off in env `e` where `off(k, e)`
/// for this forward only: the bank's states are swapped with `held` (one list per slot) and back.
fn forward_with_seeds_off<T: Real>(
    ws: &mut HostWorkspace<T>,
    held: &mut [Vec<SeedEnvState>],
    bank: &mut SeedBank<T>,
    params: &HostParams<T>,
    (block, row): (usize, u8),
    h: Option<&[T]>,
    off: impl Fn(usize, usize) -> bool,
) {
    for (k, (slot, held)) in bank.slots_mut().zip(held.iter_mut()).enumerate() {
        held.clear();
        held.extend(slot.state.iter().enumerate().map(|(e, st)| match off(k, e) {
            true => SeedEnvState { mode: SeedMode::Off, ..*st },
            false => *st,
        }));
        std::mem::swap(&mut slot.state, held);
    }
    ws.forward_eval_from_slot(block, row, h, params, &*bank);
    for (slot, held) in bank.slots_mut().zip(held.iter_mut()) {
        std::mem::swap(&mut slot.state, held);
    }
}

/// Every env's configurations from `bank`'s current states into `configs` (`[E]`, `n_envs`; an env with
/// no slot has the main configuration alone): a slot is ablatable
/// in env `e` when its seed blends (ADD / MULTIPLY / GATE) at alpha > 0 and `fossilized[slot][e]` is
/// false (or `ablate_fossils`). Reuses the lists' memory.
pub fn plan_env_configs<T: Real>(
    n_envs: usize,
    bank: &SeedBank<T>,
    fossilized: &[Vec<bool>],
    ablate_fossils: bool,
    configs: &mut Vec<EnvConfigs>,
) {
    configs.resize_with(n_envs, EnvConfigs::default);
    let mut ablatable = [0usize; MAX_ABLATABLE];
    for (e, configs) in configs.iter_mut().enumerate() {
        let (mut n, mut fossils) = (0, 0u16);
        for (k, slot) in bank.slots().enumerate() {
            let st = slot.state[e];
            if matches!(st.mode, SeedMode::Add | SeedMode::Multiply | SeedMode::Gate)
                && st.alpha > 0.0
                && (ablate_fossils || !fossilized[k][e])
            {
                assert!(n < MAX_ABLATABLE, "at most {MAX_ABLATABLE} ablatable slots");
                ablatable[n] = k;
                if fossilized[k][e] {
                    fossils |= 1 << k;
                }
                n += 1;
            }
        }
        configs.rebuild(&ablatable[..n], fossils);
    }
}

/// Per-env results from the totals of every virtual env (`totals` row `v`: the `v`-th configuration
/// counting env by env, each env's in `configs[e].masks` order, main first) into `out`, reusing its
/// memory.
pub fn counterfactuals_into(configs: &[EnvConfigs], totals: &ValTotals, out: &mut Vec<EnvCounterfactuals>) {
    out.resize_with(configs.len(), EnvCounterfactuals::default);
    let mut first = 0;
    for (c, r) in configs.iter().zip(out.iter_mut()) {
        r.slots.clear();
        r.slots.extend_from_slice(&c.slots);
        r.config_acc.clear();
        r.config_acc.extend((0..c.masks.len()).map(|k| totals.accuracy(first + k)));
        r.val_loss = totals.loss(first);
        first += c.masks.len();
        let acc = &r.config_acc;
        r.val_acc = acc[0];
        r.contribution.clear();
        r.contribution.extend(c.solo_off.iter().map(|&k| acc[0] - acc[k]));
        r.solo_on_acc.clear();
        r.solo_on_acc.extend(c.solo_on.iter().map(|&k| acc[k]));
        r.all_off_acc = c.all_off.map(|k| acc[k]);
        r.committed_acc = c.committed.map(|k| acc[k]);
        // f(∅): all-off, or the lowest leave-one-out accuracy when there is none.
        r.empty_acc = (!c.slots.is_empty()).then(|| {
            r.all_off_acc.unwrap_or_else(|| c.solo_off.iter().map(|&k| acc[k]).fold(f64::INFINITY, f64::min))
        });
        r.interactions.clear();
        if let Some(empty) = r.empty_acc {
            r.interactions.extend(
                c.pairs.iter().map(|&(i, j, k)| (i, j, acc[k] - r.solo_on_acc[i] - r.solo_on_acc[j] + empty)),
            );
        }
    }
}

fn copy_slot_row<T: Real>(src: &SlotParams<T>, dst: &mut SlotParams<T>, from: usize, to: usize) {
    let st = src.state[from];
    dst.state[to] = st;
    if let Some(bp) = st.blueprint.filter(|_| st.mode != SeedMode::Off) {
        let (s, d) = (src.pool(bp), dst.pool_mut(bp));
        d.params[to * s.row_len..(to + 1) * s.row_len].copy_from_slice(s.row(from));
        if st.mode == SeedMode::Gate {
            let (s, d) = (&src.gate, &mut dst.gate);
            d.params[to * s.row_len..(to + 1) * s.row_len].copy_from_slice(s.row(from));
        }
    }
}

/// A validation pass of a [`ValidationPassOrder`]: `(pass, start)`, the pass evaluating every env's
/// `pass`-th configuration from slot `start` (`(block, row)`; None: from the images).
pub type PassStart = (usize, Option<(usize, u8)>);

/// The order validation passes run in when one activation per slot input is kept (the device's, and
/// the CPU's when every env has the same configurations), and where each starts. Pass 0, the main
/// configuration, runs first and whole; pass `j ≥ 1` evaluates every env's `j`-th configuration (an
/// env with fewer configurations its main one). A pass from slot `s` rewrites every slot input after
/// `s`. A pass can start at a slot when, for every env, the input stored there was computed with the
/// pass's own choices at every slot before it; each starts at the latest such slot (the first slot in
/// network order always qualifies: nothing before it is ablated).
///
/// Two orders are tried and the one that runs fewer slot segments (a slot and what follows it up to the
/// next) is kept, the first on a tie:
/// * the passes in lexicographic order of their off-masks read in network order (first slot most
///   significant, env by env). When every env has the same configurations, each pass then shares with
///   the one before it the longest prefix any earlier pass shares with it: the passes form a tree over
///   the slots' on/off choices, each branch computed once. For three ablatable slots (8 configurations)
///   the segments run 1 + 3 + 7 times beside the main pass instead of 4 + 6 + 7;
/// * the passes that first switch a slot off latest first, so each finds the main pass's activations
///   where it first differs from it (the order before the tree; never worse when envs differ).
///
/// Planning reuses its lists: once they have reached their sizes, a replan allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct ValidationPassOrder {
    order: Vec<PassStart>,
    latest_first: Vec<PassStart>,
    /// `stored[e * n_slots + p]`: the off-mask the input of the `p`-th slot in network order was last
    /// computed with, for env `e`.
    stored: Vec<u16>,
    segments: usize,
}

impl ValidationPassOrder {
    /// Plans the passes of `configs` (every env's, from [`plan_env_configs`]); `positions[k]` is
    /// canonical slot `k`'s `(block, row)`.
    pub fn plan(&mut self, configs: &[EnvConfigs], positions: &[(usize, u8)]) -> &[PassStart] {
        let n_slots = positions.len();
        assert!(n_slots <= MAX_ABLATABLE, "at most {MAX_ABLATABLE} slots");
        let passes = configs.iter().map(|c| c.masks.len()).max().unwrap_or(1).max(1);
        let mut network: [usize; MAX_ABLATABLE] = std::array::from_fn(|k| k);
        network[..n_slots].sort_by_key(|&k| positions[k]);
        let network = &network[..n_slots];
        let mask = |j: usize, e: usize| configs[e].masks.get(j).copied().unwrap_or(0);
        // The off-mask as a number whose most significant bit is the first slot in network order.
        let key = |m: u16| network.iter().fold(0u32, |acc, &k| (acc << 1) | u32::from((m >> k) & 1));
        let keys = |j: usize| (0..configs.len()).map(move |e| key(mask(j, e)));
        // The network index of the first slot the pass switches off in any env (n_slots: none).
        let first_off = |j: usize| (0..configs.len()).map(|e| key(mask(j, e)).leading_zeros()).min();

        self.order.clear();
        self.order.extend((0..passes).map(|j| (j, None)));
        // Two passes never have the same masks in every env (an env's masks are distinct), so the
        // unstable sort is deterministic.
        self.order[1..].sort_unstable_by(|a, b| keys(a.0).cmp(keys(b.0)));
        let envs = configs.len();
        let tree = place_pass_starts(&mut self.order, &mut self.stored, envs, network, positions, mask);
        self.latest_first.clear();
        self.latest_first.extend((0..passes).map(|j| (j, None)));
        self.latest_first[1..].sort_unstable_by_key(|&(j, _)| (std::cmp::Reverse(first_off(j)), j));
        let latest_first =
            place_pass_starts(&mut self.latest_first, &mut self.stored, envs, network, positions, mask);
        self.segments = tree.min(latest_first);
        if latest_first < tree {
            std::mem::swap(&mut self.order, &mut self.latest_first);
        }
        &self.order
    }

    /// The last plan's passes, in the order they run.
    pub fn order(&self) -> &[PassStart] {
        &self.order
    }

    /// Slot segments the last plan's passes run, the main pass's included.
    pub fn segments(&self) -> usize {
        self.segments
    }
}

/// Gives every pass of `order` after the first (the main pass, whole) its latest start (see
/// [`ValidationPassOrder`]); returns how many slot segments the passes run, the main pass's included.
fn place_pass_starts(
    order: &mut [PassStart],
    stored: &mut Vec<u16>,
    envs: usize,
    network: &[usize],
    positions: &[(usize, u8)],
    mask: impl Fn(usize, usize) -> u16,
) -> usize {
    let n_slots = network.len();
    // The main pass computed every input.
    stored.clear();
    stored.resize(envs * n_slots, 0);
    let before = |p: usize| network[..p].iter().fold(0u16, |acc, &k| acc | 1 << k);
    let mut segments = n_slots;
    for (j, start) in order.iter_mut().skip(1) {
        let reusable = |p: usize| (0..envs).all(|e| (stored[e * n_slots + p] ^ mask(*j, e)) & before(p) == 0);
        let p = (0..n_slots).rev().find(|&p| reusable(p)).expect("the first slot's input is always reusable");
        for e in 0..envs {
            stored[e * n_slots + p + 1..(e + 1) * n_slots].fill(mask(*j, e));
        }
        *start = Some(positions[network[p]]);
        segments += n_slots - p;
    }
    segments
}
