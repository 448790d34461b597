//! One injection point's forward and backward over all envs (kasmina §4.3, §5.1; DESIGN §5): each
//! blueprint runs once over the envs that hold it (their activations gathered, then scattered back), and
//! within that gathered batch the envs are ordered by how they blend, so each blend is one op call over
//! a contiguous range. Envs whose seed is off pass `h` through untouched.
//!
//! CNN isolation: the seed (and gate) input is always the detached host activation, so no gradient flows
//! back into the host through the seed branch — the host gets only the direct path of the blend.

use super::seed_bank::{SeedMode, SlotParams};
use crate::ops::{self, Amplitude, BlendShape, Real};
use crate::seeds::{self, CnnBlueprint, GateWorkspace, SeedShape, Workspace};

const MODES: [SeedMode; 4] = [SeedMode::Incubator, SeedMode::Add, SeedMode::Multiply, SeedMode::Gate];

/// The envs running one blueprint at this slot this step, ordered by blend mode, and its buffers.
#[derive(Debug, Default)]
struct Group<T> {
    /// Env indices, grouped by mode in [`MODES`] order.
    envs: Vec<usize>,
    /// `ranges[m]`: positions in `envs` of mode `MODES[m]`.
    ranges: [std::ops::Range<usize>; 4],
    alpha: Vec<T>,
    params: Vec<T>,
    grad_params: Vec<T>,
    gate_params: Vec<T>,
    gate_grads: Vec<T>,
    /// Gathered host activation (the detached seed input) `[Eb, B, C, H, W]`.
    x: Vec<T>,
    /// Seed output.
    s: Vec<T>,
    /// Blend output, then the gathered output gradient in the backward.
    y: Vec<T>,
    dh: Vec<T>,
    ds: Vec<T>,
    /// Per-sample gate `[Eb_gate, B]` and its gradient.
    g: Vec<T>,
    dg: Vec<T>,
    ws: Workspace<T>,
    gate_ws: GateWorkspace<T>,
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
    /// The slot's output `[E, B, C, H, W]`; valid after a forward with any env active.
    pub out: Vec<T>,
    /// Whether the last forward ran (any env active); otherwise the output is the input itself.
    pub active: bool,
    /// The last forward was a training forward (its backward may follow).
    trained: bool,
}

impl<T: Real> SlotWorkspace<T> {
    pub fn new(envs: usize, batch: usize, channels: usize, size: usize) -> Self {
        Self {
            envs,
            batch,
            channels,
            size,
            groups: CnnBlueprint::ALL.iter().map(|_| Group::default()).collect(),
            out: vec![T::ZERO; envs * batch * channels * size * size],
            active: false,
            trained: false,
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

    /// Partition the envs by blueprint and mode. In eval, incubating seeds are not run at all (their
    /// output value is exactly `h`).
    fn plan(&mut self, params: &SlotParams<T>, train: bool) {
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
            }
        }
    }

    /// The slot's forward over `h` (`[E, B, C, H, W]`). Returns false when no env's seed is active, in
    /// which case the output is `h` itself and nothing was written.
    pub fn forward(&mut self, params: &SlotParams<T>, h: &[T], train: bool) -> bool {
        assert_eq!(params.n_envs(), self.envs, "slot parameters and workspace disagree on the env count");
        assert_eq!(h.len(), self.out.len(), "slot input must be [E, B, C, H, W]");
        self.active = params.any_active();
        self.trained = train;
        if !self.active {
            return false;
        }
        self.plan(params, train);
        self.out.copy_from_slice(h);
        let sample = self.sample_len() * self.batch;
        for (gi, bp) in CnnBlueprint::ALL.into_iter().enumerate() {
            let eb = self.groups[gi].envs.len();
            if eb == 0 {
                continue;
            }
            let (shape, blend) = (self.shape(eb), self.blend_shape(eb));
            let group = &mut self.groups[gi];
            let pool = params.pool(bp);
            let p = fit(&mut group.params, eb * pool.row_len);
            let x = fit(&mut group.x, eb * sample);
            let alpha = fit(&mut group.alpha, eb);
            for (i, &e) in group.envs.iter().enumerate() {
                p[i * pool.row_len..(i + 1) * pool.row_len].copy_from_slice(pool.row(e));
                x[i * sample..(i + 1) * sample].copy_from_slice(&h[e * sample..(e + 1) * sample]);
                alpha[i] = T::from_f64(params.state[e].alpha as f64);
            }
            let s = fit(&mut group.s, eb * sample);
            seeds::forward(
                bp,
                shape,
                &group.params[..eb * pool.row_len],
                &group.x[..eb * sample],
                s,
                &mut group.ws,
            );
            let y = fit(&mut group.y, eb * sample);
            for (m, &mode) in MODES.iter().enumerate() {
                let r = group.ranges[m].clone();
                if r.is_empty() || mode == SeedMode::Incubator {
                    continue;
                }
                let n = r.len();
                let rows = r.start * sample..r.end * sample;
                let (xs, ss, ys) = (&group.x[rows.clone()], &group.s[rows.clone()], &mut y[rows.clone()]);
                let a = Amplitude::PerEnv(&group.alpha[r.clone()]);
                let bs = BlendShape { envs: n, ..blend };
                match mode {
                    SeedMode::Add => ops::blend_add_forward(bs, xs, ss, a, ys),
                    SeedMode::Multiply => ops::blend_multiply_forward(bs, xs, ss, xs, a, ys),
                    SeedMode::Gate => {
                        let gate = &params.gate;
                        let gp = fit(&mut group.gate_params, n * gate.row_len);
                        for (i, &e) in group.envs[r.clone()].iter().enumerate() {
                            gp[i * gate.row_len..(i + 1) * gate.row_len].copy_from_slice(gate.row(e));
                        }
                        let g = fit(&mut group.g, n * self.batch);
                        let gshape = SeedShape { envs: n, ..shape };
                        seeds::gate_forward(
                            gshape,
                            &group.gate_params[..n * gate.row_len],
                            xs,
                            g,
                            &mut group.gate_ws,
                        );
                        ops::blend_gate_forward(bs, xs, ss, a, &group.g[..n * self.batch], ys);
                    }
                    SeedMode::Incubator | SeedMode::Off => unreachable!(),
                }
                for (i, &e) in group.envs[r.clone()].iter().enumerate() {
                    let src = &y[(r.start + i) * sample..(r.start + i + 1) * sample];
                    self.out[e * sample..(e + 1) * sample].copy_from_slice(src);
                }
            }
        }
        true
    }

    /// Backward of the last training forward: `grad_h = ∂L/∂h` through the blend's direct path (equal to
    /// `grad_y` for envs whose seed is off or incubating), and the seed and gate parameter gradients of
    /// every env that trains them written into `params`' pools (other rows zero).
    pub fn backward(&mut self, params: &mut SlotParams<T>, grad_y: &[T], grad_h: &mut [T]) {
        assert!(self.active && self.trained, "slot backward needs a training forward with an active seed");
        grad_h.copy_from_slice(grad_y);
        for pool in params.pools.iter_mut().chain([&mut params.gate]) {
            pool.grads.fill(T::ZERO);
        }
        let sample = self.sample_len() * self.batch;
        for (gi, bp) in CnnBlueprint::ALL.into_iter().enumerate() {
            let eb = self.groups[gi].envs.len();
            if eb == 0 {
                continue;
            }
            let (shape, blend) = (self.shape(eb), self.blend_shape(eb));
            let group = &mut self.groups[gi];
            let dy = fit(&mut group.y, eb * sample);
            for (i, &e) in group.envs.iter().enumerate() {
                dy[i * sample..(i + 1) * sample].copy_from_slice(&grad_y[e * sample..(e + 1) * sample]);
            }
            let dh = fit(&mut group.dh, eb * sample);
            let ds = fit(&mut group.ds, eb * sample);
            for (m, &mode) in MODES.iter().enumerate() {
                let r = group.ranges[m].clone();
                if r.is_empty() {
                    continue;
                }
                let n = r.len();
                let rows = r.start * sample..r.end * sample;
                let a = Amplitude::PerEnv(&group.alpha[r.clone()]);
                let bs = BlendShape { envs: n, ..blend };
                let (xs, ss, dys) = (&group.x[rows.clone()], &group.s[rows.clone()], &group.y[rows.clone()]);
                let (dhs, dss) = (&mut dh[rows.clone()], &mut ds[rows.clone()]);
                match mode {
                    // Straight-through: the seed gets the output gradient, the host keeps it whole.
                    SeedMode::Incubator => {
                        dss.copy_from_slice(dys);
                        continue;
                    }
                    SeedMode::Add => ops::blend_add_backward(bs, a, dys, dhs, dss),
                    SeedMode::Multiply => {
                        ops::blend_multiply_backward(bs, xs, ss, xs, a, dys, dhs, dss, None)
                    }
                    SeedMode::Gate => {
                        let gate_len = params.gate.row_len;
                        let dg = fit(&mut group.dg, n * self.batch);
                        ops::blend_gate_backward(
                            bs,
                            xs,
                            ss,
                            a,
                            &group.g[..n * self.batch],
                            dys,
                            dhs,
                            dss,
                            dg,
                        );
                        let gshape = SeedShape { envs: n, ..shape };
                        let gg = fit(&mut group.gate_grads, n * gate_len);
                        seeds::gate_backward(
                            gshape,
                            &group.dg[..n * self.batch],
                            gg,
                            None,
                            &mut group.gate_ws,
                        );
                        for (i, &e) in group.envs[r.clone()].iter().enumerate() {
                            if params.state[e].gate_grad {
                                let src = &group.gate_grads[i * gate_len..(i + 1) * gate_len];
                                params.gate.grads[e * gate_len..(e + 1) * gate_len].copy_from_slice(src);
                            }
                        }
                    }
                    SeedMode::Off => unreachable!(),
                }
                for (i, &e) in group.envs[r.clone()].iter().enumerate() {
                    let src = &dh[(r.start + i) * sample..(r.start + i + 1) * sample];
                    grad_h[e * sample..(e + 1) * sample].copy_from_slice(src);
                }
            }
            if !group.envs.iter().any(|&e| params.state[e].train_seed) {
                continue;
            }
            let pool = &mut params.pools[bp as usize - 1];
            let state = &params.state;
            let len = pool.row_len;
            let gp = fit(&mut group.grad_params, eb * len);
            seeds::backward(
                bp,
                shape,
                &group.x[..eb * sample],
                &group.ds[..eb * sample],
                gp,
                None,
                &mut group.ws,
            );
            for (i, &e) in group.envs.iter().enumerate() {
                if state[e].train_seed {
                    pool.grads[e * len..(e + 1) * len]
                        .copy_from_slice(&group.grad_params[i * len..(i + 1) * len]);
                }
            }
        }
    }
}
