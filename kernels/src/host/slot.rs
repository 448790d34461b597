//! One injection point's forward and backward over all envs (kasmina §4.3, §5.1; DESIGN §5): each
//! blueprint runs once over the envs that hold it (their activations gathered, then scattered back), and
//! within that gathered batch the envs are ordered by how they blend, so each blend is one op call over
//! a contiguous range. Envs whose seed is off pass `h` through untouched.
//!
//! CNN isolation: the seed (and gate) input is always the detached host activation, so no gradient flows
//! back into the host through the seed branch — the host gets only the direct path of the blend.

use super::seed_bank::{SeedMode, SlotParams};
use crate::ops::real::clamp01;
use crate::ops::{self, Amplitude, BlendShape, PoolShape, Real};
use crate::seeds::{self, CnnBlueprint, GateWorkspace, PooledSeedGrad, SeedOutputGrad, SeedShape, Workspace};
use rayon::prelude::*;

const MODES: [SeedMode; 4] = [SeedMode::Incubator, SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];
/// The index of ADD in [`MODES`].
const ADD: usize = 1;

/// Only a pooled output gradient lets [`SlotWorkspace::backward_from`] go without `grad_h`.
const NEEDS_GRAD_H: &str = "grad_h (only a pooled output gradient may go without)";

/// The gradient at a slot's output, as [`SlotWorkspace::backward_from`] takes it.
#[derive(Clone, Copy)]
pub enum SlotOutputGrad<'a, T> {
    /// `[E, B, C, H, W]`.
    Whole(&'a [T]),
    /// The gradient at the output of the 2×2 max pool (`pool`) that reads the slot's output, and the
    /// pool's winners (`argmax`, `0..4` per window).
    Pooled { pool: PoolShape, grad: &'a [T], argmax: &'a [u8] },
}

/// The envs running one blueprint at this slot this step, ordered by blend mode, and its buffers.
#[derive(Debug, Default)]
struct Group<T> {
    /// Env indices, grouped by mode in [`MODES`] order.
    envs: Vec<usize>,
    /// `ranges[m]`: positions in `envs` of mode `MODES[m]`.
    ranges: [std::ops::Range<usize>; 4],
    /// The group's envs are the consecutive envs `first..first + envs.len()` (every env on one blueprint,
    /// say): the kernels then read the input, the parameters and the output gradient where they are, and
    /// the blend writes straight into the slot's output, with no gather or scatter. None: gathered.
    first: Option<usize>,
    alpha: Vec<T>,
    /// `clamp01(alpha)`, for a group that blends inside the seed's forward (every env ADD).
    clamped: Vec<T>,
    params: Vec<T>,
    grad_params: Vec<T>,
    gate_params: Vec<T>,
    gate_grads: Vec<T>,
    /// Gathered host activation (the detached seed input) `[Eb, B, C, H, W]`; unused when `first` is set.
    x: Vec<T>,
    /// Seed output.
    s: Vec<T>,
    /// Gathered blend output, then the gathered output gradient in the backward (unused when `first`).
    y: Vec<T>,
    dh: Vec<T>,
    ds: Vec<T>,
    /// Per-sample gate `[Eb_gate, B]` and its gradient.
    g: Vec<T>,
    dg: Vec<T>,
    ws: Workspace<T>,
    gate_ws: GateWorkspace<T>,
}

/// `Some(first)` when `envs` is `first, first + 1, …`.
fn consecutive(envs: &[usize]) -> Option<usize> {
    let first = *envs.first()?;
    envs.iter().enumerate().all(|(i, &e)| e == first + i).then_some(first)
}

/// `dst` row `i` = `src` row `rows[i]` (rows of `len` elements), rows copied in parallel.
fn gather<T: Real>(src: &[T], rows: &[usize], len: usize, dst: &mut [T]) {
    dst[..rows.len() * len].par_chunks_mut(len).zip(rows.par_iter()).for_each(|(d, &r)| {
        d.copy_from_slice(&src[r * len..(r + 1) * len]);
    });
}

/// `dst` row `rows[i]` = `src` row `i`, for the (distinct) `rows`, in parallel over `dst`'s rows; `at`
/// is scratch (`dst` row → position in `rows`).
fn scatter<T: Real>(src: &[T], rows: &[usize], len: usize, dst: &mut [T], at: &mut Vec<usize>) {
    at.clear();
    at.resize(dst.len() / len, usize::MAX);
    for (i, &r) in rows.iter().enumerate() {
        at[r] = i;
    }
    dst.par_chunks_mut(len).zip(at.par_iter()).for_each(|(d, &i)| {
        if i != usize::MAX {
            d.copy_from_slice(&src[i * len..(i + 1) * len]);
        }
    });
}

/// `dst` row `e` = `src` row `e` for every env `e` whose `copied[e]` is set, in parallel.
fn copy_rows<T: Real>(src: &[T], copied: &[bool], len: usize, dst: &mut [T]) {
    dst.par_chunks_mut(len).zip(src.par_chunks(len)).zip(copied.par_iter()).for_each(|((d, s), &c)| {
        if c {
            d.copy_from_slice(s);
        }
    });
}

fn fit<T: Real>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::ZERO);
    }
    &mut v[..len]
}

/// Activations and scratch of one slot for one `(E, B)` run shape.
#[derive(Debug)]
pub struct SlotWorkspace<T> {
    pub envs: usize,
    pub batch: usize,
    channels: usize,
    size: usize,
    groups: Vec<Group<T>>,
    /// `[E]`: the env's output (forward) or input gradient (backward) rows are copied through: its output
    /// is not a blend (ADD / MULTIPLY / GATE) this pass, so it is `h` and its input gradient the output
    /// gradient, and either the caller reads every env's rows or the env's seed runs (an incubator).
    copied: Vec<bool>,
    /// Scatter scratch: env → position in a group.
    at: Vec<usize>,
    /// The slot's output `[E, B, C, H, W]`; valid after a forward with any env active.
    pub out: Vec<T>,
    /// Whether the last forward ran (any env active); otherwise the output is the input itself.
    pub active: bool,
    /// The last forward was a training forward (its backward may follow).
    trained: bool,
    /// Where the last forward's input lives: the backward must get the same `h` (in-place groups read it).
    input_at: usize,
}

impl<T: Real> SlotWorkspace<T> {
    pub fn new(envs: usize, batch: usize, channels: usize, size: usize) -> Self {
        Self {
            envs,
            batch,
            channels,
            size,
            groups: CnnBlueprint::ALL.iter().map(|_| Group::default()).collect(),
            copied: vec![false; envs],
            at: Vec::with_capacity(envs),
            out: vec![T::ZERO; envs * batch * channels * size * size],
            active: false,
            trained: false,
            input_at: 0,
        }
    }

    fn sample_len(&self) -> usize {
        self.channels * self.size * self.size
    }

    fn shape(&self, envs: usize) -> SeedShape {
        SeedShape { envs, batch: self.batch, channels: self.channels, h: self.size, w: self.size }
    }

    fn blend_shape(&self, envs: usize) -> BlendShape {
        BlendShape { envs, batch: self.batch, features: self.sample_len() }
    }

    /// Partition the envs by blueprint and mode, and mark the rows copied through (see `copied`). In
    /// eval, incubating seeds are not run at all (their output value is exactly `h`).
    fn plan(&mut self, params: &SlotParams<T>, train: bool, every_row: bool) {
        for (copied, st) in self.copied.iter_mut().zip(&params.state) {
            *copied = every_row || st.mode.runs_in(train);
        }
        for (gi, group) in self.groups.iter_mut().enumerate() {
            group.envs.clear();
            for (m, &mode) in MODES.iter().enumerate() {
                let start = group.envs.len();
                let wanted = |s: &super::seed_bank::SeedEnvState| {
                    s.mode == mode
                        && s.blueprint.map(|b| b as usize - 1) == Some(gi)
                        && (train || mode != SeedMode::Incubator)
                };
                group.envs.extend(params.state.iter().enumerate().filter(|(_, s)| wanted(s)).map(|(e, _)| e));
                group.ranges[m] = start..group.envs.len();
                if mode != SeedMode::Incubator {
                    for &e in &group.envs[start..] {
                        self.copied[e] = false;
                    }
                }
            }
            group.first = consecutive(&group.envs);
        }
    }

    /// The slot's forward over `h` (`[E, B, C, H, W]`). Returns false when no env's seed is active, in
    /// which case the output is `h` itself and nothing was written.
    pub fn forward(&mut self, params: &SlotParams<T>, h: &[T], train: bool) -> bool {
        self.forward_with(params, h, train, true)
    }

    /// [`Self::forward`]; with `every_row` false the caller reads only the rows of envs whose seed runs,
    /// so the output rows of the others are not written (nor their input-gradient rows in the backward).
    pub fn forward_with(&mut self, params: &SlotParams<T>, h: &[T], train: bool, every_row: bool) -> bool {
        assert_eq!(params.n_envs(), self.envs, "slot parameters and workspace disagree on the env count");
        assert_eq!(h.len(), self.out.len(), "slot input must be [E, B, C, H, W]");
        self.active = params.any_active_in(train);
        self.trained = train;
        self.input_at = h.as_ptr() as usize;
        if !self.active {
            return false;
        }
        self.plan(params, train, every_row);
        let sample = self.sample_len() * self.batch;
        copy_rows(h, &self.copied, sample, &mut self.out);
        for (gi, bp) in CnnBlueprint::ALL.into_iter().enumerate() {
            let eb = self.groups[gi].envs.len();
            if eb == 0 {
                continue;
            }
            let (shape, blend) = (self.shape(eb), self.blend_shape(eb));
            let Self { groups, out, at, batch, .. } = self;
            let group = &mut groups[gi];
            let pool = params.pool(bp);
            let len = pool.row_len;
            for (i, &e) in group.envs.iter().enumerate() {
                fit(&mut group.alpha, eb)[i] = T::from_f64(params.state[e].alpha as f64);
            }
            // The seed's input and parameters: in place for consecutive envs, else gathered.
            let (x, p): (&[T], &[T]) = match group.first {
                Some(e0) => (&h[e0 * sample..(e0 + eb) * sample], &pool.params[e0 * len..(e0 + eb) * len]),
                None => {
                    gather(h, &group.envs, sample, fit(&mut group.x, eb * sample));
                    gather(&pool.params, &group.envs, len, fit(&mut group.params, eb * len));
                    (&group.x[..eb * sample], &group.params[..eb * len])
                }
            };
            if group.ranges[ADD] == (0..eb) {
                // Every env blends by ADD: the seed blends in its own last pass (the same bits as the
                // blend below), straight into the slot's output rows or the gathered ones.
                for (c, &a) in fit(&mut group.clamped, eb).iter_mut().zip(&group.alpha) {
                    *c = clamp01(a);
                }
                let y = match group.first {
                    Some(e0) => &mut out[e0 * sample..(e0 + eb) * sample],
                    None => fit(&mut group.y, eb * sample),
                };
                seeds::forward_blended_add(bp, shape, p, x, &group.clamped[..eb], y, &mut group.ws);
                if group.first.is_none() {
                    scatter(&group.y[..eb * sample], &group.envs, sample, out, at);
                }
                continue;
            }
            let s = fit(&mut group.s, eb * sample);
            seeds::forward(bp, shape, p, x, s, &mut group.ws);
            if group.first.is_none() {
                fit(&mut group.y, eb * sample);
            }
            for (m, &mode) in MODES.iter().enumerate() {
                let r = group.ranges[m].clone();
                if r.is_empty() || mode == SeedMode::Incubator {
                    continue;
                }
                let n = r.len();
                let rows = r.start * sample..r.end * sample;
                let (xs, ss) = (&x[rows.clone()], &group.s[rows.clone()]);
                let ys = match group.first {
                    Some(e0) => &mut out[(e0 + r.start) * sample..(e0 + r.end) * sample],
                    None => &mut group.y[rows.clone()],
                };
                let a = Amplitude::PerEnv(&group.alpha[r.clone()]);
                let bs = BlendShape { envs: n, ..blend };
                match mode {
                    SeedMode::Add => ops::blend_add_forward(bs, xs, ss, a, ys),
                    SeedMode::Multiply => ops::blend_multiply_forward(bs, xs, ss, xs, a, ys),
                    SeedMode::Gate => {
                        let gate = &params.gate;
                        let gp = fit(&mut group.gate_params, n * gate.row_len);
                        gather(&gate.params, &group.envs[r.clone()], gate.row_len, gp);
                        let g = fit(&mut group.g, n * *batch);
                        let gshape = SeedShape { envs: n, ..shape };
                        seeds::gate_forward(
                            gshape,
                            &group.gate_params[..n * gate.row_len],
                            xs,
                            g,
                            &mut group.gate_ws,
                        );
                        ops::blend_gate_forward(bs, xs, ss, a, &group.g[..n * *batch], ys);
                    }
                    SeedMode::Incubator | SeedMode::Off => unreachable!(),
                }
                if group.first.is_none() {
                    scatter(&group.y[rows], &group.envs[r], sample, out, at);
                }
            }
        }
        true
    }

    /// Backward of the last training forward over `h` (the same input): `grad_h = ∂L/∂h` through the
    /// blend's direct path (equal to `grad_y` for envs whose seed is off or incubating), and the seed
    /// and gate parameter gradients of every env that trains them written into `params`' pools (other
    /// rows zero).
    pub fn backward(&mut self, params: &mut SlotParams<T>, h: &[T], grad_y: &[T], grad_h: &mut [T]) {
        self.backward_from(params, h, SlotOutputGrad::Whole(grad_y), Some(grad_h));
    }

    /// Per env, the host's share `1 − clamp01(α)` of the gradient at an all-ADD slot's output (the ADD
    /// blend's `∂y/∂h`), as the last training forward blended: with [`SlotOutputGrad::Pooled`] and no
    /// `grad_h`, the host's gradient is `g·share` at each pool window's winner, zero elsewhere (what
    /// [`ops::blend_add_backward_from_pooled`] writes as `grad_h`, the same product); an env in no group
    /// passes its gradient through (share 1). Overwrites `shares` (`[E]`); needs
    /// [`Self::takes_pooled_gradient`].
    pub fn host_shares(&self, shares: &mut [T]) {
        assert!(self.takes_pooled_gradient(), "host shares need an all-ADD slot with every group in place");
        assert_eq!(shares.len(), self.envs, "one share per env");
        shares.fill(T::ONE);
        for group in self.groups.iter().filter(|g| !g.envs.is_empty()) {
            let e0 = group.first.expect("in place");
            let n = group.envs.len();
            for (share, &a) in shares[e0..e0 + n].iter_mut().zip(&group.clamped[..n]) {
                *share = T::ONE - a;
            }
        }
    }

    /// Whether [`Self::backward_from`] can take the gradient at the output of a max pool that reads the
    /// slot's output ([`SlotOutputGrad::Pooled`]): after a training forward in which every env blends by
    /// ADD and each blueprint's envs are consecutive (nothing copied through, gathered or incubating).
    pub fn takes_pooled_gradient(&self) -> bool {
        self.active
            && self.trained
            && !self.copied.iter().any(|&c| c)
            && self.groups.iter().all(|g| {
                g.envs.is_empty()
                    || (g.first.is_some()
                        && g.ranges.iter().enumerate().all(|(m, r)| m == ADD || r.is_empty()))
            })
    }

    /// [`Self::backward`] from the gradient at the slot's output, whole or (where
    /// [`Self::takes_pooled_gradient`]) as the gradient at the output of the 2×2 max pool that reads it:
    /// then the ADD blend's backward takes it straight from the pool's windows
    /// ([`ops::blend_add_backward_from_pooled`], the same bits) and the slot's full-size output gradient
    /// is never written. `grad_h` may then be `None`: the caller takes the host's gradient from the pooled
    /// one itself (`g·share` at each window's winner, [`Self::host_shares`]), and no full-size `grad_h`
    /// is written either.
    pub fn backward_from(
        &mut self,
        params: &mut SlotParams<T>,
        h: &[T],
        grad_out: SlotOutputGrad<'_, T>,
        mut grad_h: Option<&mut [T]>,
    ) {
        assert!(self.active && self.trained, "slot backward needs a training forward with an active seed");
        assert_eq!(h.len(), self.out.len(), "slot input must be [E, B, C, H, W]");
        assert_eq!(h.as_ptr() as usize, self.input_at, "the backward must get the forward's input `h`");
        let sample = self.sample_len() * self.batch;
        let grad_y = match grad_out {
            SlotOutputGrad::Whole(grad_y) => {
                let grad_h = grad_h.as_deref_mut().expect("a whole output gradient needs grad_h");
                copy_rows(grad_y, &self.copied, sample, grad_h);
                Some(grad_y)
            }
            SlotOutputGrad::Pooled { pool, grad, argmax } => {
                assert!(self.takes_pooled_gradient(), "a pooled output gradient needs an all-ADD slot");
                assert_eq!(pool.input_len(), h.len(), "the pool reads the slot's output");
                assert_eq!((grad.len(), argmax.len()), (pool.max_pool_output_len(), grad.len()), "pool");
                None
            }
        };
        for pool in params.pools.iter_mut().chain([&mut params.gate]) {
            pool.grads.fill(T::ZERO);
        }
        for (gi, bp) in CnnBlueprint::ALL.into_iter().enumerate() {
            let eb = self.groups[gi].envs.len();
            if eb == 0 {
                continue;
            }
            let (shape, blend) = (self.shape(eb), self.blend_shape(eb));
            let Self { groups, at, batch, .. } = self;
            let group = &mut groups[gi];
            // The seed's input and the output gradient: in place for consecutive envs, else gathered.
            // `dy` is None with a pooled output gradient (then every group is in place).
            let (x, dy): (&[T], Option<&[T]>) = match (group.first, grad_y) {
                (Some(e0), grad_y) => {
                    (&h[e0 * sample..(e0 + eb) * sample], grad_y.map(|g| &g[e0 * sample..(e0 + eb) * sample]))
                }
                (None, Some(grad_y)) => {
                    gather(grad_y, &group.envs, sample, fit(&mut group.y, eb * sample));
                    (&group.x[..eb * sample], Some(&group.y[..eb * sample]))
                }
                (None, None) => unreachable!("a pooled output gradient needs every group in place"),
            };
            if group.first.is_none() {
                fit(&mut group.dh, eb * sample);
            }
            // Without `grad_h` the blend only feeds the seed: nothing to do when no env trains it.
            if grad_h.is_none() && !group.envs.iter().any(|&e| params.state[e].train_seed) {
                continue;
            }
            // A pooled output gradient: the group's envs' windows (every group is in place and all ADD).
            let pooled = match grad_out {
                SlotOutputGrad::Pooled { pool, grad, argmax } => {
                    let e0 = group.first.expect("in place");
                    let per_env = pool.max_pool_output_len() / pool.envs;
                    let windows = e0 * per_env..(e0 + eb) * per_env;
                    Some((PoolShape { envs: eb, ..pool }, &grad[windows.clone()], &argmax[windows]))
                }
                SlotOutputGrad::Whole(_) => None,
            };
            // Without `grad_h`, a blueprint whose backward reads its output gradient an image at a time
            // takes it in the pool's terms too: then no blend runs for the group and nothing full-size is
            // written.
            let seed_pooled = pooled.filter(|_| grad_h.is_none() && seeds::takes_pooled_gradient(bp));
            let ds = fit(&mut group.ds, eb * sample);
            for (m, &mode) in MODES.iter().enumerate() {
                let r = group.ranges[m].clone();
                if r.is_empty() || seed_pooled.is_some() {
                    continue;
                }
                let n = r.len();
                let rows = r.start * sample..r.end * sample;
                let a = Amplitude::PerEnv(&group.alpha[r.clone()]);
                let bs = BlendShape { envs: n, ..blend };
                // The seed's output is read only by the MULTIPLY and GATE blends (an all-ADD group never
                // writes it).
                let xs = &x[rows.clone()];
                let dys =
                    || &dy.expect("a whole output gradient (only ADD takes a pooled one)")[rows.clone()];
                let dss = &mut ds[rows.clone()];
                // Straight-through: the seed gets the output gradient, the host keeps it whole (copied
                // with the unblended envs above).
                if mode == SeedMode::Incubator {
                    dss.copy_from_slice(dys());
                    continue;
                }
                let dhs = match group.first {
                    Some(e0) => {
                        grad_h.as_deref_mut().map(|g| &mut g[(e0 + r.start) * sample..(e0 + r.end) * sample])
                    }
                    None => Some(&mut group.dh[rows.clone()]),
                };
                match mode {
                    SeedMode::Add => match pooled {
                        None => ops::blend_add_backward(bs, a, dys(), dhs.expect(NEEDS_GRAD_H), dss),
                        Some((pool, g, k)) => {
                            assert_eq!(r, 0..eb, "a pooled output gradient: the whole group blends by ADD");
                            ops::blend_add_backward_from_pooled(bs, pool, a, g, k, dhs, dss)
                        }
                    },
                    SeedMode::Multiply => ops::blend_multiply_backward(
                        bs,
                        xs,
                        &group.s[rows.clone()],
                        xs,
                        a,
                        dys(),
                        dhs.expect(NEEDS_GRAD_H),
                        dss,
                        None,
                    ),
                    SeedMode::Gate => {
                        let gate_len = params.gate.row_len;
                        let dg = fit(&mut group.dg, n * *batch);
                        let ss = &group.s[rows.clone()];
                        ops::blend_gate_backward(
                            bs,
                            xs,
                            ss,
                            a,
                            &group.g[..n * *batch],
                            dys(),
                            dhs.expect(NEEDS_GRAD_H),
                            dss,
                            dg,
                        );
                        let gshape = SeedShape { envs: n, ..shape };
                        let gg = fit(&mut group.gate_grads, n * gate_len);
                        seeds::gate_backward(gshape, &group.dg[..n * *batch], gg, None, &mut group.gate_ws);
                        for (i, &e) in group.envs[r.clone()].iter().enumerate() {
                            if params.state[e].gate_grad {
                                let src = &group.gate_grads[i * gate_len..(i + 1) * gate_len];
                                params.gate.grads[e * gate_len..(e + 1) * gate_len].copy_from_slice(src);
                            }
                        }
                    }
                    SeedMode::Incubator | SeedMode::Off => unreachable!(),
                }
                if group.first.is_none() {
                    let grad_h = grad_h.as_deref_mut().expect("a gathered group has a whole output gradient");
                    scatter(&group.dh[rows], &group.envs[r], sample, grad_h, at);
                }
            }
            if !group.envs.iter().any(|&e| params.state[e].train_seed) {
                continue;
            }
            let pool = &mut params.pools[bp as usize - 1];
            let state = &params.state;
            let len = pool.row_len;
            let gp = fit(&mut group.grad_params, eb * len);
            let grad_y = match seed_pooled {
                // The blend's `ds` (`g·a` at each winner), as `blend_add_backward_from_pooled` forms it.
                Some((_, grad, argmax)) => {
                    SeedOutputGrad::Pooled(PooledSeedGrad { grad, argmax, amplitude: &group.clamped[..eb] })
                }
                None => SeedOutputGrad::Whole(&group.ds[..eb * sample]),
            };
            seeds::backward_from(bp, shape, x, grad_y, gp, None, &mut group.ws);
            for (i, &e) in group.envs.iter().enumerate() {
                if state[e].train_seed {
                    pool.grads[e * len..(e + 1) * len]
                        .copy_from_slice(&group.grad_params[i * len..(i + 1) * len]);
                }
            }
        }
    }
}
