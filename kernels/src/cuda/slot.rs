//! One injection point's seeds on the device, for every env at once: the CUDA twin of
//! [`SlotWorkspace`](crate::host::SlotWorkspace) for every mode: OFF, INCUBATOR, ADD, MULTIPLY and GATE
//! (with the slot's [`DeviceGate`]). Each blueprint that some env holds runs as one [`DeviceSeed`] over all envs
//! (dense: the GPU has no use for gathering a few envs); the blend writes only the rows of the envs that
//! blend that blueprint, every other row of the output is the input. The seed's input is the
//! detached host activation (isolation), so the host gets only the blend's direct path.
//!
//! The seed optimizer is the CPU's `Trainer::step_seeds`: each env's gradient over all of the slot's
//! blueprints clipped to norm 1, then SGD (no weight decay) for the envs that train each blueprint.

use cudarc::driver::{CudaSlice, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::gate::DeviceGate;
use super::gemm_conv::GemmConv;
use super::ops::{self, SlotFactor};
use super::parity::{Device, NULL, ParityError, elementwise};
use super::seed_module::DeviceSeed;
use crate::host::{SeedEnvState, SeedMode};
use crate::optim::SgdConfig;
use crate::seeds::CnnBlueprint;
use crate::seeds::SeedShape;

type R = Result<(), ParityError>;

/// Blocks per env of the first stage of the per-env squared norms.
const NORM_BLOCKS_PER_ENV: u32 = 32;

/// The modes the slot kernels know, as `slot_backward_split_f32` reads them.
fn mode_code(mode: SeedMode) -> u8 {
    match mode {
        SeedMode::Off => 0,
        SeedMode::Incubator => 1,
        SeedMode::Add => 2,
        SeedMode::Multiply => 3,
        SeedMode::Gate => 4,
    }
}

/// A slot's seeds, their per-env controls and its activations on the device.
pub struct DeviceSlot {
    /// The activations the launches run over: `capacity` images per env, or fewer ([`Self::set_rows`]).
    dims: SeedShape,
    /// The images per env the buffers hold.
    capacity: usize,
    /// By `CnnBlueprint as usize − 1`, made at the first germination of that blueprint.
    modules: Vec<Option<DeviceSeed>>,
    /// The GatedBlend gates, made at the first gate's birth, and the gate's gradient per sample.
    gate: Option<DeviceGate>,
    dg: CudaSlice<f32>,
    /// `[E]`: the env's gate gets no gradient (its rows are zeroed, as the CPU leaves them zero), and
    /// the env's gate takes SGD steps (`gate_step && gate_grad`).
    gate_no_grad: CudaSlice<u8>,
    gate_steps: CudaSlice<u8>,
    state: Vec<SeedEnvState>,
    /// What the states, together, make the slot launch (derived when a state changes, not per batch).
    roles: SlotRoles,
    /// The controls below no longer match `state`.
    dirty: bool,
    /// `[E]`: each env's alpha and mode code.
    alpha: CudaSlice<f32>,
    mode: CudaSlice<u8>,
    /// `[7, E]`: the env's seed is blueprint `bp` and runs in a training forward; the env trains `bp`;
    /// and its complement (rows whose gradients are zeroed, as the CPU leaves them zero).
    holds: CudaSlice<u8>,
    trains: CudaSlice<u8>,
    not_trains: CudaSlice<u8>,
    /// `[K, 7, E]`: validation pass `k`'s envs whose blending seed is `bp` and is not ablated.
    eval_holds: CudaSlice<u8>,
    eval_passes: usize,
    /// `[K]`: the blueprints some env runs in validation pass `k` (held in a mode that runs in
    /// evaluation and not ablated by the pass): a pass runs only those modules, and none at all (the
    /// slot skipped, its input passed on) where that is empty.
    eval_running: Vec<u8>,
    /// The slot's output, a seed's output, each env's own seed's output (for the backward), and the
    /// seed's output gradient, `[E, B, C, H, W]`.
    pub out: CudaSlice<f32>,
    s: CudaSlice<f32>,
    s_mine: CudaSlice<f32>,
    ds: CudaSlice<f32>,
    norm_partial: CudaSlice<f64>,
    sq_norms: CudaSlice<f64>,
    clip: CudaSlice<f64>,
    sgd: SgdConfig,
    /// What the last collection batch noted (see [`Self::collect`]).
    pub taken: StatsTaken,
    /// Host staging of the per-env controls' uploads, kept between epochs.
    staged: Vec<u8>,
    staged_alpha: Vec<f32>,
}

/// The launch of `slot_passthrough_f32` over `envs` rows of `row` values: a grid of (blocks of an env's
/// row, envs) of 1 024 threads, at most 1 024 blocks in all unless there are more envs (the grid-stride
/// loops of `elementwise`'s).
fn per_env_rows(envs: usize, row: usize) -> LaunchConfig {
    assert!(envs <= 65_535, "slot_passthrough_f32: {envs} envs exceed the grid's y");
    let per_env = row.div_ceil(1024).clamp(1, (1024 / envs.max(1)).max(1));
    LaunchConfig { grid_dim: (per_env as u32, envs as u32, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 }
}

/// `dst[..n] = values` through the reused host buffer `staged` (a pageable copy: staged before the
/// call returns).
fn upload<D: DevicePtrMut<u8>>(
    device: &Device,
    staged: &mut Vec<u8>,
    values: impl Iterator<Item = u8>,
    dst: &mut D,
) -> R {
    staged.clear();
    staged.extend(values);
    device.stream.memcpy_htod(staged.as_slice(), dst)?;
    Ok(())
}

/// A `[7, E]` mask over `states`: row `bp − 1`, column `e` is `f(state of e)` where env `e` holds `bp`.
fn per_blueprint(states: &[SeedEnvState], f: fn(&SeedEnvState) -> bool) -> impl Iterator<Item = u8> + '_ {
    CnnBlueprint::ALL
        .into_iter()
        .flat_map(move |bp| states.iter().map(move |s| u8::from(s.blueprint == Some(bp) && f(s))))
}

/// Bit `bp − 1` of a blueprint mask.
fn bit(bp: CnnBlueprint) -> u8 {
    1 << (bp as u8 - 1)
}

/// The blueprints of `mask`, in [`CnnBlueprint::ALL`] order.
pub fn blueprints(mask: u8) -> impl Iterator<Item = CnnBlueprint> {
    CnnBlueprint::ALL.into_iter().filter(move |&bp| mask & bit(bp) != 0)
}

/// What a slot's envs, together, make it launch: whether it runs in a training and in an evaluation
/// forward and which blueprints run there (some env holds it in a mode that runs), which blueprints
/// some env trains, whether some env blends through its gate, gives its gate a gradient, steps it,
/// and what a collection batch takes (some env collects; the blueprints some env collects for and
/// trains; the gate's, when a collecting env's gate gets a gradient). Blueprint sets are masks
/// ([`blueprints`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SlotRoles {
    runs_train: bool,
    runs_eval: bool,
    running_train: u8,
    running_eval: u8,
    trained: u8,
    gated: bool,
    gate_grad: bool,
    gate_step: bool,
    collecting: u8,
    takes_stats: bool,
    gate_collects: bool,
    /// Some env's seed in MULTIPLY mode (its host gradient needs the seed's output).
    multiplies: bool,
}

impl SlotRoles {
    fn of(states: &[SeedEnvState]) -> Self {
        let mut r = Self::default();
        for s in states {
            let (train, eval) = (s.mode.runs_in(true), s.mode.runs_in(false));
            r.runs_train |= train;
            r.runs_eval |= eval;
            r.gated |= s.mode == SeedMode::Gate;
            r.multiplies |= s.mode == SeedMode::Multiply;
            r.gate_grad |= s.gate_grad;
            r.gate_step |= s.gate_step && s.gate_grad;
            let Some(bp) = s.blueprint else { continue };
            let b = bit(bp);
            r.running_train |= if train { b } else { 0 };
            r.running_eval |= if eval { b } else { 0 };
            r.trained |= if s.train_seed { b } else { 0 };
            r.collecting |= if s.collect_stats && s.train_seed { b } else { 0 };
            r.takes_stats |= s.collect_stats;
            r.gate_collects |= s.collect_stats && s.gate_grad;
        }
        r
    }
}

/// What decides a slot's launches in a training step — whether it runs, which blueprints run, train
/// and collect, whether a gate exists, runs, gets a gradient or steps, what a collection batch notes —
/// as opposed to which env does what, which the kernels read from the per-env buffers
/// [`DeviceSlot::prepare`] uploads (alpha, mode, which env holds and trains which blueprint, the gate
/// masks). Two epochs with the same keys make the same launches with the same arguments, whatever
/// their envs' states: what lets a CUDA graph of one replay the other (`super::epoch_graph`). (One
/// exception, harmless: the host's two gradient scratch buffers trade places per slot backward — not
/// behind an r0 slot that leaves the host's gradient to batch norm — so a replay may bind them the
/// other way round; each step writes both before it reads them.) A buffer a
/// graph holds is never freed while its key can recur: the ones reallocated to grow (the plan, the
/// validation's sums and selections) have their lengths in the keys, the dataset its upload count,
/// and modules and gates, once made, are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLaunchKey {
    runs: bool,
    gated: bool,
    has_gate: bool,
    /// Blueprint masks ([`blueprints`]).
    running: u8,
    trained: u8,
    gate_grad: bool,
    gate_step: bool,
    collecting: u8,
    takes_stats: bool,
    gate_collects: bool,
    /// Whether the backward leaves the host's gradient to batch norm
    /// ([`DeviceSlot::host_grad_recomputable`]: no MULTIPLY or GATE env), which changes the launches of
    /// the slot's split and of the block's norm.
    host_grad_recomputable: bool,
}

/// What decides a slot's launches in an evaluation forward: whether it runs, which blueprints run,
/// whether a gate exists and runs, and the validation selections' buffer and passes (their content is
/// uploaded by [`DeviceSlot::plan_eval`] before the pass) with the blueprints each pass runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalLaunchKey {
    runs: bool,
    gated: bool,
    has_gate: bool,
    running: u8,
    eval_holds_len: usize,
    eval_passes: usize,
    eval_running: Vec<u8>,
}

/// What a collection batch notes on the host side of a slot ([`DeviceSlot::taken`]): whether it took
/// statistics here (some env holds a seed that collects, trained or not: a frozen one reports empty
/// norms), the blueprints whose norms it took (a mask, [`blueprints`]), and whether it took the gate's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StatsTaken {
    pub took_stats: bool,
    pub collected: u8,
    pub gate_collected: bool,
}

/// The gradient at a slot's output as [`DeviceSlot::backward`] takes it: written out, or — before its
/// block's 2×2 max-pool, on even square planes — the pool's output gradient `dy` with the winners
/// `argmax`, the pool's backward fused into the slot's split (`slot_backward_split_pool_f32`: the same
/// bits, the routed gradient never written). A slot with a GATE seed takes it written out.
///
/// `Pooled { host_grad: false }`: the host's gradient is left unwritten (a slot whose envs are all
/// OFF, INCUBATOR or ADD, [`DeviceSlot::host_grad_recomputable`]): batch norm's backward recomputes it
/// from the pool's gradient with [`DeviceSlot::factor`], and only the seeds' gradient is split off.
#[derive(Clone, Copy)]
pub enum SlotGrad<'a> {
    Output(&'a CudaSlice<f32>),
    Pooled { dy: &'a CudaSlice<f32>, argmax: &'a CudaSlice<u8>, host_grad: bool },
}

impl DeviceSlot {
    /// A slot whose activations are `dims`, every env's seed off.
    pub fn new(device: &Device, dims: SeedShape) -> Result<Self, ParityError> {
        let stream = &device.stream;
        let (envs, len) = (dims.envs, dims.envs * dims.batch * dims.channels * dims.h * dims.w);
        let n = CnnBlueprint::ALL.len() * envs;
        Ok(Self {
            dims,
            capacity: dims.batch,
            modules: CnnBlueprint::ALL.iter().map(|_| None).collect(),
            gate: None,
            dg: stream.alloc_zeros::<f32>(envs * dims.batch)?,
            gate_no_grad: stream.alloc_zeros::<u8>(envs)?,
            gate_steps: stream.alloc_zeros::<u8>(envs)?,
            state: vec![SeedEnvState::default(); envs],
            roles: SlotRoles::default(),
            dirty: true,
            alpha: stream.alloc_zeros::<f32>(envs)?,
            mode: stream.alloc_zeros::<u8>(envs)?,
            holds: stream.alloc_zeros::<u8>(n)?,
            trains: stream.alloc_zeros::<u8>(n)?,
            not_trains: stream.alloc_zeros::<u8>(n)?,
            eval_holds: stream.alloc_zeros::<u8>(n)?,
            eval_passes: 1,
            eval_running: vec![0],
            out: stream.alloc_zeros::<f32>(len)?,
            s: stream.alloc_zeros::<f32>(len)?,
            s_mine: stream.alloc_zeros::<f32>(len)?,
            ds: stream.alloc_zeros::<f32>(len)?,
            norm_partial: stream.alloc_zeros::<f64>(envs * NORM_BLOCKS_PER_ENV as usize)?,
            sq_norms: stream.alloc_zeros::<f64>(envs)?,
            clip: stream.alloc_zeros::<f64>(envs)?,
            sgd: SgdConfig::SEED,
            taken: StatsTaken::default(),
            staged: Vec::with_capacity(n),
            staged_alpha: Vec::with_capacity(envs),
        })
    }

    pub fn dims(&self) -> SeedShape {
        self.dims
    }

    /// The buffers' shape, whatever [`Self::set_rows`] set.
    fn full_dims(&self) -> SeedShape {
        SeedShape { batch: self.capacity, ..self.dims }
    }

    /// Runs the launches that follow over the first `rows` images per env, up to the buffers' batch (see
    /// [`DeviceHost::set_rows`](super::host::DeviceHost::set_rows)), in the seeds and the gate too.
    pub fn set_rows(&mut self, rows: usize) {
        assert!(
            (1..=self.capacity).contains(&rows),
            "{rows} rows per env: the slot holds 1 to {}",
            self.capacity
        );
        self.dims.batch = rows;
        for module in self.modules.iter_mut().flatten() {
            module.set_rows(rows);
        }
        if let Some(gate) = &mut self.gate {
            gate.set_rows(rows);
        }
    }

    /// Env `env`'s seed state this epoch (its mode decides what the forward and backward do).
    pub fn set_state(&mut self, env: usize, state: SeedEnvState) {
        mode_code(state.mode);
        let old = std::mem::replace(&mut self.state[env], state);
        if old != state {
            self.dirty = true;
            // Alpha lives in a device buffer: only the rest decides the roles.
            let roles_changed = SeedEnvState { alpha: state.alpha, ..old } != state;
            if roles_changed {
                self.roles = SlotRoles::of(&self.state);
            }
        }
    }

    pub fn state(&self, env: usize) -> SeedEnvState {
        self.state[env]
    }

    /// A germinated seed: env `env`'s row of `bp` (drawn on the host, packed as the layout) and its
    /// momentum zeroed; the blueprint's module is made at its first germination.
    pub fn germinate(&mut self, device: &Device, env: usize, bp: CnnBlueprint, row: &[f32]) -> R {
        let (full, rows) = (self.full_dims(), self.dims.batch);
        let slot = &mut self.modules[bp as usize - 1];
        if slot.is_none() {
            let mut module = DeviceSeed::new(device, bp, full)?;
            module.set_rows(rows);
            *slot = Some(module);
        }
        slot.as_mut().expect("made above").rows.upload_env_row(device, env, row)
    }

    /// A new gate for env `env` (drawn on the host, packed as the gate's layout), momentum zeroed.
    pub fn create_gate(&mut self, device: &Device, env: usize, row: &[f32]) -> R {
        if self.gate.is_none() {
            let mut gate = DeviceGate::new(device, self.full_dims())?;
            gate.set_rows(self.dims.batch);
            self.gate = Some(gate);
        }
        self.gate.as_mut().expect("made above").rows.upload_env_row(device, env, row)
    }

    /// The gates, if any env ever had one.
    pub fn gate(&self) -> Option<&DeviceGate> {
        self.gate.as_ref()
    }

    pub fn gate_mut(&mut self) -> Option<&mut DeviceGate> {
        self.gate.as_mut()
    }

    /// Zeroes env `env`'s momentum in every blueprint and its gate (fossilization, rollback).
    pub fn reset_momentum(&mut self, device: &Device, env: usize) -> R {
        for m in self.modules.iter_mut().flatten() {
            m.rows.zero_momentum(device, env)?;
        }
        if let Some(gate) = &mut self.gate {
            gate.rows.zero_momentum(device, env)?;
        }
        Ok(())
    }

    /// The module of `bp`, if some env ever held it.
    pub fn module(&self, bp: CnnBlueprint) -> Option<&DeviceSeed> {
        self.modules[bp as usize - 1].as_ref()
    }

    pub fn module_mut(&mut self, bp: CnnBlueprint) -> Option<&mut DeviceSeed> {
        self.modules[bp as usize - 1].as_mut()
    }

    /// Any env's seed takes part in this forward (as [`crate::host::SlotParams::any_active_in`]): a
    /// training one (`pass` None), or validation pass `k` — some env's blending seed is not ablated
    /// there (states changed since the plan: the main configuration's answer, as pass 0 is then).
    pub fn runs_in(&self, pass: Option<usize>) -> bool {
        match pass {
            None => self.roles.runs_train,
            Some(k) if !self.dirty && k < self.eval_running.len() => self.eval_running[k] != 0,
            Some(_) => self.roles.runs_eval,
        }
    }

    /// What decides this slot's launches in a training step (see [`SlotLaunchKey`]): its roles.
    pub fn launch_key(&self) -> SlotLaunchKey {
        let r = self.roles;
        SlotLaunchKey {
            runs: r.runs_train,
            gated: r.gated,
            has_gate: self.gate.is_some(),
            running: r.running_train,
            trained: r.trained,
            gate_grad: r.gate_grad,
            gate_step: r.gate_step,
            collecting: r.collecting,
            takes_stats: r.takes_stats,
            gate_collects: r.gate_collects,
            host_grad_recomputable: self.host_grad_recomputable(),
        }
    }

    /// What decides this slot's launches in an evaluation forward (see [`EvalLaunchKey`]).
    pub fn eval_launch_key(&self) -> EvalLaunchKey {
        EvalLaunchKey {
            runs: self.roles.runs_eval,
            gated: self.roles.gated,
            has_gate: self.gate.is_some(),
            running: self.roles.running_eval,
            eval_holds_len: self.eval_holds.len(),
            eval_passes: self.eval_passes,
            eval_running: self.eval_running.clone(),
        }
    }

    /// Forget the statistics of an earlier epoch (`Trainer::clear_stats`).
    pub fn clear_stats(&mut self) {
        self.taken = StatsTaken::default();
    }

    /// Uploads the per-env controls when the states changed (a forward does it first; a training
    /// epoch captured into a CUDA graph does it before the capture, which must copy nothing from the
    /// host).
    pub(crate) fn prepare(&mut self, device: &Device) -> R {
        if !self.dirty {
            return Ok(());
        }
        let Self { state, staged, staged_alpha, .. } = self;
        staged_alpha.clear();
        staged_alpha.extend(state.iter().map(|s| s.alpha));
        device.stream.memcpy_htod(staged_alpha.as_slice(), &mut self.alpha)?;
        upload(device, staged, state.iter().map(|s| mode_code(s.mode)), &mut self.mode)?;
        upload(device, staged, per_blueprint(state, |s| s.mode.runs_in(true)), &mut self.holds)?;
        upload(device, staged, per_blueprint(state, |s| s.train_seed), &mut self.trains)?;
        // Rows whose gradients are zeroed, as the CPU leaves them zero: not (holds bp and trains).
        let trains = per_blueprint(state, |s| s.train_seed);
        upload(device, staged, trains.map(|t| 1 - t), &mut self.not_trains)?;
        upload(device, staged, state.iter().map(|s| u8::from(!s.gate_grad)), &mut self.gate_no_grad)?;
        let steps = state.iter().map(|s| u8::from(s.gate_step && s.gate_grad));
        upload(device, staged, steps, &mut self.gate_steps)?;
        // Until a validation plans its passes, pass 0 is the main configuration.
        let n = CnnBlueprint::ALL.len() * self.dims.envs;
        let blending = per_blueprint(state, |s| s.mode.runs_in(false));
        upload(device, staged, blending, &mut self.eval_holds.slice_mut(..n))?;
        self.eval_passes = 1;
        self.eval_running.clear();
        self.eval_running.push(self.roles.running_eval);
        self.dirty = false;
        Ok(())
    }

    /// The validation passes' selections: pass `k` of `passes` switches this slot off for the envs
    /// where `off(k, e)`, the main selection otherwise. Holds until the states change (then pass 0
    /// alone, the main configuration).
    pub fn plan_eval(&mut self, device: &Device, passes: usize, off: impl Fn(usize, usize) -> bool) -> R {
        self.prepare(device)?;
        let passes = passes.max(1);
        let n = CnnBlueprint::ALL.len() * self.dims.envs;
        if self.eval_holds.len() < passes * n {
            self.eval_holds = device.stream.alloc_zeros::<u8>(passes * n)?;
        }
        let Self { state, staged, .. } = self;
        let holds = (0..passes).flat_map(|k| {
            let off = &off;
            let envs = state.len();
            per_blueprint(state, |s| s.mode.runs_in(false))
                .enumerate()
                .map(move |(i, h)| h & u8::from(!off(k, i % envs)))
        });
        upload(device, staged, holds, &mut self.eval_holds.slice_mut(..passes * n))?;
        self.eval_passes = passes;
        self.eval_running.clear();
        self.eval_running.extend((0..passes).map(|k| {
            state.iter().enumerate().fold(0u8, |mask, (e, st)| match st.blueprint {
                Some(bp) if st.mode.runs_in(false) && !off(k, e) => mask | bit(bp),
                _ => mask,
            })
        }));
        Ok(())
    }

    /// The slot's forward over `h` into [`Self::out`]: a training forward (`pass` None) runs every seed
    /// not off; an evaluation forward runs the blending ones with validation pass `pass`'s selection.
    /// The caller reads `out` only when [`Self::runs`] is true.
    ///
    /// With `pooled` (the block's 2×2 max-pool after the slot, on even square planes), the pool is
    /// fused in: its output and winners are written instead of `out` (`slot_passthrough_pool_f32`,
    /// `slot_blend_select_pool_f32`: the same bits as the pool over `out`), and `out` is left as it was.
    pub fn forward(
        &mut self,
        device: &Device,
        conv: &mut GemmConv,
        h: &CudaSlice<f32>,
        pass: Option<usize>,
        mut pooled: Option<(&mut CudaSlice<f32>, &mut CudaSlice<u8>)>,
    ) -> R {
        self.prepare(device)?;
        let d = self.dims;
        let len = self.out.len();
        let windows = len / 4;
        if let Some((values, argmax)) = &pooled {
            assert!(d.h == d.w && d.h.is_multiple_of(2), "the slot's fused pool takes even square planes");
            assert!(values.len() >= windows && argmax.len() >= windows, "the pool's buffers are too short");
        }
        let (channels, size) = (d.channels as u32, d.h as u32);
        // The rows no seed blends into are h; the select below writes the others.
        {
            let n = CnnBlueprint::ALL.len() * d.envs;
            let holds = match pass {
                None => self.holds.slice(..n),
                Some(k) => {
                    assert!(k < self.eval_passes, "validation pass {k} was not planned");
                    self.eval_holds.slice(k * n..(k + 1) * n)
                }
            };
            let dims = [d.envs, d.batch, d.channels * d.h * d.w].map(|v| v as u32);
            match &mut pooled {
                None => {
                    let mut launch = device.stream.launch_builder(device.function("slot_passthrough_f32"));
                    launch.arg(h).arg(&self.mode).arg(&holds).arg(&mut self.out);
                    launch.arg(&dims[0]).arg(&dims[1]).arg(&dims[2]);
                    unsafe { launch.launch(per_env_rows(d.envs, len / d.envs)) }?;
                }
                Some((values, argmax)) => {
                    let mut launch =
                        device.stream.launch_builder(device.function("slot_passthrough_pool_f32"));
                    launch.arg(h).arg(&self.mode).arg(&holds).arg(&mut **values).arg(&mut **argmax);
                    launch.arg(&dims[0]).arg(&dims[1]).arg(&channels).arg(&size);
                    unsafe { launch.launch(per_env_rows(d.envs, windows / d.envs)) }?;
                }
            }
        }
        if self.roles.gated {
            self.gate.as_mut().expect("a GATE seed has its gate").forward(device, h)?;
        }
        // A validation pass runs only the blueprints some env does not ablate there.
        let running = match pass {
            None => self.roles.running_train,
            Some(k) => self.eval_running[k],
        };
        for bp in blueprints(running) {
            let module = self.modules[bp as usize - 1].as_mut().expect("a held blueprint has its module");
            module.forward(device, conv, h, &mut self.s)?;
            let at = match pass {
                None => (bp as usize - 1) * d.envs,
                Some(k) => {
                    assert!(k < self.eval_passes, "validation pass {k} was not planned");
                    (k * 7 + bp as usize - 1) * d.envs
                }
            };
            let holds = match pass {
                None => self.holds.slice(at..at + d.envs),
                Some(_) => self.eval_holds.slice(at..at + d.envs),
            };
            let dims = [d.envs, d.batch, d.channels * d.h * d.w].map(|v| v as u32);
            // Without a gate the kernel reads none (no env is in GATE mode): alpha stands in.
            let gate = self.gate.as_ref().map_or(&self.alpha, |g| &g.gate);
            match &mut pooled {
                None => {
                    let mut launch = device.stream.launch_builder(device.function("slot_blend_select_f32"));
                    launch.arg(h).arg(&self.s).arg(&self.alpha).arg(gate).arg(&self.mode).arg(&holds);
                    launch.arg(&mut self.s_mine).arg(&mut self.out);
                    launch.arg(&dims[0]).arg(&dims[1]).arg(&dims[2]);
                    unsafe { launch.launch(elementwise(len)) }?;
                }
                Some((values, argmax)) => {
                    let mut launch =
                        device.stream.launch_builder(device.function("slot_blend_select_pool_f32"));
                    launch.arg(h).arg(&self.s).arg(&self.alpha).arg(gate).arg(&self.mode).arg(&holds);
                    launch.arg(&mut self.s_mine).arg(&mut **values).arg(&mut **argmax);
                    launch.arg(&dims[0]).arg(&dims[1]).arg(&channels).arg(&size);
                    unsafe { launch.launch(elementwise(windows)) }?;
                }
            }
        }
        Ok(())
    }

    /// Whether some env's seed here is in GATE mode: its backward reads the gradient at the slot's
    /// output written out ([`SlotGrad::Output`]).
    pub fn gated(&self) -> bool {
        self.roles.gated
    }

    /// Whether the host's gradient through this slot is the routed gradient times a per-env factor
    /// (every env OFF, INCUBATOR or ADD: `dy`, `dy`, `dy·(1 − a)`), so that batch norm's backward can
    /// recompute it ([`Self::factor`]) instead of reading it written. MULTIPLY's and GATE's need the
    /// seed's output.
    pub fn host_grad_recomputable(&self) -> bool {
        !self.roles.gated && !self.roles.multiplies
    }

    /// The per-env modes and amplitudes batch norm's backward reads to recompute the host's gradient
    /// (as uploaded for the last forward).
    pub fn factor(&self) -> SlotFactor<'_> {
        SlotFactor { mode: &self.mode, alpha: &self.alpha }
    }

    /// The backward of the last training forward over `h`: `grad_h` (overwritten) the host's direct
    /// path, and every trained blueprint's parameter gradients (the rows of envs that do not train it
    /// zero).
    pub fn backward(
        &mut self,
        device: &Device,
        conv: &mut GemmConv,
        h: &CudaSlice<f32>,
        grad_y: SlotGrad<'_>,
        grad_h: &mut CudaSlice<f32>,
    ) -> R {
        let d = self.dims;
        let len = self.out.len();
        let dims = [d.envs, d.batch, d.channels * d.h * d.w].map(|v| v as u32);
        let gate = self.gate.as_ref().map_or(&self.alpha, |g| &g.gate);
        let grad_y = match grad_y {
            SlotGrad::Output(grad_y) => {
                let mut launch = device.stream.launch_builder(device.function("slot_backward_split_f32"));
                launch.arg(grad_y).arg(h).arg(&self.s_mine).arg(&self.alpha).arg(gate).arg(&self.mode);
                launch.arg(&mut *grad_h).arg(&mut self.ds);
                launch.arg(&dims[0]).arg(&dims[1]).arg(&dims[2]);
                unsafe { launch.launch(elementwise(len)) }?;
                Some(grad_y)
            }
            SlotGrad::Pooled { dy, argmax, host_grad } => {
                assert!(
                    host_grad || self.host_grad_recomputable(),
                    "MULTIPLY's host gradient needs the seed's output"
                );
                assert!(
                    !self.roles.gated,
                    "a GATE seed's backward reads the slot's output gradient written out"
                );
                assert!(
                    d.h == d.w && d.h.is_multiple_of(2),
                    "the slot's fused pool takes even square planes"
                );
                let windows = len / 4;
                assert!(
                    dy.len() >= windows && argmax.len() >= windows,
                    "the pool's gradient exceeds its buffers"
                );
                let (channels, size) = (d.channels as u32, d.h as u32);
                let mut launch =
                    device.stream.launch_builder(device.function("slot_backward_split_pool_f32"));
                launch
                    .arg(dy)
                    .arg(argmax)
                    .arg(h)
                    .arg(&self.s_mine)
                    .arg(&self.alpha)
                    .arg(gate)
                    .arg(&self.mode);
                match host_grad {
                    true => launch.arg(&mut *grad_h),
                    false => launch.arg(&NULL),
                };
                launch.arg(&mut self.ds);
                launch.arg(&dims[0]).arg(&dims[1]).arg(&channels).arg(&size);
                unsafe { launch.launch(elementwise(windows)) }?;
                None
            }
        };
        // The gate's gradient (GATE envs), then its parameters' for the envs whose gate gets one.
        if self.roles.gated {
            let grad_y = grad_y.expect("checked above: a gated slot's gradient is written out");
            let gate = self.gate.as_ref().expect("a GATE seed has its gate");
            let mut launch = device.stream.launch_builder(device.function("slot_gate_grad_f32"));
            launch.arg(grad_y).arg(h).arg(&self.s_mine).arg(&self.alpha).arg(&gate.gate).arg(&self.mode);
            launch.arg(&mut self.dg).arg(&dims[0]).arg(&dims[1]).arg(&dims[2]);
            unsafe { launch.launch(elementwise(d.envs * d.batch)) }?;
        }
        if self.roles.gate_grad {
            let gate = self.gate.as_mut().expect("a gate with a gradient exists");
            gate.backward(device, &self.dg)?;
            let envs32 = d.envs as u32;
            for g in &mut gate.rows.grads {
                let (n, per_env) = (g.len(), (g.len() / d.envs) as u64);
                let mut launch = device.stream.launch_builder(device.function("zero_masked_rows_f32"));
                launch.arg(g).arg(&self.gate_no_grad).arg(&per_env).arg(&envs32);
                unsafe { launch.launch(elementwise(n)) }?;
            }
        }
        let envs32 = d.envs as u32;
        for bp in blueprints(self.roles.trained) {
            let module = self.modules[bp as usize - 1].as_mut().expect("a held blueprint has its module");
            module.backward(device, conv, h, &self.ds)?;
            let mask = self.not_trains.slice((bp as usize - 1) * d.envs..(bp as usize) * d.envs);
            for g in &mut module.rows.grads {
                let per_env = (g.len() / d.envs) as u64;
                let n = g.len();
                let mut launch = device.stream.launch_builder(device.function("zero_masked_rows_f32"));
                launch.arg(g).arg(&mask).arg(&per_env).arg(&envs32);
                unsafe { launch.launch(elementwise(n)) }?;
            }
        }
        Ok(())
    }

    /// The gradient-health statistics of a collection batch (after the backward, before the seed
    /// optimizer clips): each blueprint that an env collects for and trains gets its per-tensor squared
    /// norms ([`DeviceSeed::stat_sq`]), listed in [`Self::collected`].
    pub fn collect(&mut self, device: &Device) -> R {
        let r = self.roles;
        for bp in blueprints(r.collecting) {
            let module = self.modules[bp as usize - 1].as_mut().expect("a held blueprint has its module");
            module.rows.collect_sq_norms(device)?;
        }
        self.taken = StatsTaken {
            took_stats: r.takes_stats,
            collected: r.collecting,
            gate_collected: r.gate_collects,
        };
        if r.gate_collects {
            self.gate.as_mut().expect("a gate with a gradient exists").rows.collect_sq_norms(device)?;
        }
        Ok(())
    }

    /// The seed optimizer after a backward: per env, the norm over every blueprint's gradient, the clip
    /// factor, then SGD for the envs that train each blueprint.
    pub fn step(&mut self, device: &Device) -> R {
        let d = self.dims;
        let stream = &device.stream;
        let (trained, gate_grads) = (self.roles.trained, self.roles.gate_grad);
        if trained == 0 && !gate_grads {
            return Ok(());
        }
        stream.memset_zeros(&mut self.sq_norms)?;
        // Blueprints nobody trains, and gates nobody's gradient reaches, have zero gradients on the CPU
        // and add nothing to the norm.
        let gate_tensors =
            self.gate.as_ref().filter(|_| gate_grads).into_iter().flat_map(|g| g.rows.grads.iter());
        let seed_tensors = blueprints(trained).flat_map(|bp| {
            self.modules[bp as usize - 1]
                .as_ref()
                .expect("a trained blueprint has its module")
                .rows
                .grads
                .iter()
        });
        for g in seed_tensors.chain(gate_tensors) {
            ops::add_sq_norms(device, g, &mut self.norm_partial, &mut self.sq_norms.slice_mut(..))?;
        }
        ops::clip_factors(device, &self.sq_norms, &mut self.clip)?;
        if let (true, Some(gate)) = (self.roles.gate_step, &mut self.gate) {
            let rows = &mut gate.rows;
            let active = self.gate_steps.slice(..);
            ops::scale_and_step(
                device,
                &mut rows.params,
                &mut rows.grads,
                &mut rows.momentum,
                &self.clip,
                &active,
                self.sgd,
            )?;
        }
        for bp in blueprints(trained) {
            let active = self.trains.slice((bp as usize - 1) * d.envs..(bp as usize) * d.envs);
            let module = self.modules[bp as usize - 1].as_mut().expect("a trained blueprint has its module");
            let rows = &mut module.rows;
            ops::scale_and_step(
                device,
                &mut rows.params,
                &mut rows.grads,
                &mut rows.momentum,
                &self.clip,
                &active,
                self.sgd,
            )?;
        }
        Ok(())
    }
}
