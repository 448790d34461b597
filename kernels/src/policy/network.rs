//! The factored LSTM policy (tamiyo §4.1–4.2) in candle: blueprint embedding, feature net, a one-layer
//! residual LSTM, the eight action heads, the critic V(s), the telemetry head Q(s, op) and the
//! contribution predictor. One batched forward for all envs per step ([`PolicyNet::step`]), and the
//! same computation over whole sequences for the PPO update ([`PolicyNet::sequence`], autograd through
//! time). Every weight is drawn from our own seeded streams (candle's CPU generator cannot be seeded).
//!
//! ```text
//! x = concat(obs [D], embedding(blueprint index per slot) [4·S])     (index −1 → the "null" row 13)
//! f = ReLU(LN(Linear(x)))                                             [F]
//! y = LN(LSTM(f; h, c));  lstm_out = y + f                            [H]  (F = H: identity projection)
//! head h: Linear → ReLU → … → logits;  V: 256 LN ReLU 128 LN ReLU 64 ReLU 1
//! Q(s, op): the V stack over concat(lstm_out.detach(), onehot(op))
//! contribution: 256 LN ReLU 128 ReLU S   (the reference's dropout 0.1 sits after the first ReLU;
//!                                          it is off at inference and in this implementation)
//! ```
//!
//! Linear layers are `y = x·Wᵀ + b` with `W: [out, in]` (PyTorch's layout), LayerNorm has eps 1e-5, the
//! LSTM stacks its gates as i, f, g, o in the 4H dimension with two bias vectors.

use candle_core::{D, DType, Device, Result, Tensor, Var};

use crate::rng::{Purpose, Stream, StreamKey};

/// Blueprint ids the embedding knows (0..13); index −1 ("no seed") maps to the extra row 13.
pub const BLUEPRINT_IDS: usize = 13;
pub const EMBED_DIM: usize = 4;
const LN_EPS: f64 = 1e-5;

/// The sizes of the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyShape {
    pub n_slots: usize,
    /// Observation features per env (`23 + 31·S` for Obs V3).
    pub obs_dim: usize,
    /// Feature width F = LSTM hidden H (the residual LSTM's input projection is the identity).
    pub hidden: usize,
    /// Width of the heads' hidden layers (H/2 in the reference).
    pub head_hidden: usize,
}

impl PolicyShape {
    /// The reference's network for `n_slots` slots: H = 512, heads 256.
    pub fn reference(n_slots: usize) -> Self {
        Self { n_slots, obs_dim: 23 + 31 * n_slots, hidden: 512, head_hidden: 256 }
    }

    /// Logits per head, in `Head` order: slot, blueprint, style, tempo, alpha_target, alpha_speed,
    /// alpha_curve, op.
    pub fn head_sizes(&self) -> [usize; 8] {
        [self.n_slots, BLUEPRINT_IDS, 4, 3, 3, 4, 5, 6]
    }
}

/// `y = x·Wᵀ + b` over `[N, in]`.
#[derive(Debug)]
struct Linear {
    weight: Var,
    bias: Var,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.weight.as_tensor().t()?)?.broadcast_add(self.bias.as_tensor())
    }
}

/// LayerNorm over the last dimension (biased variance, eps 1e-5), affine.
#[derive(Debug)]
struct LayerNorm {
    gamma: Var,
    beta: Var,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        let normed = centred.broadcast_div(&(var + LN_EPS)?.sqrt()?)?;
        normed.broadcast_mul(self.gamma.as_tensor())?.broadcast_add(self.beta.as_tensor())
    }
}

/// Hidden layers `Linear → (LayerNorm) → ReLU`, then a last `Linear` with no activation.
#[derive(Debug)]
struct Mlp {
    hidden: Vec<(Linear, Option<LayerNorm>)>,
    last: Linear,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (linear, norm) in &self.hidden {
            h = linear.forward(&h)?;
            if let Some(norm) = norm {
                h = norm.forward(&h)?;
            }
            h = h.relu()?;
        }
        self.last.forward(&h)
    }
}

/// One LSTM layer, PyTorch's gate layout.
#[derive(Debug)]
struct Lstm {
    w_ih: Var,
    w_hh: Var,
    b_ih: Var,
    b_hh: Var,
}

impl Lstm {
    /// One step: `(h, c)` for input `x` from `(h, c)`, all `[N, ·]`.
    fn step(&self, x: &Tensor, h: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        let gates = (x.matmul(&self.w_ih.as_tensor().t()?)?.broadcast_add(self.b_ih.as_tensor())?
            + h.matmul(&self.w_hh.as_tensor().t()?)?.broadcast_add(self.b_hh.as_tensor())?)?;
        let n = h.dim(D::Minus1)?;
        let gate = |k: usize| gates.narrow(D::Minus1, k * n, n);
        let (i, f, g, o) = (sigmoid(&gate(0)?)?, sigmoid(&gate(1)?)?, gate(2)?.tanh()?, sigmoid(&gate(3)?)?);
        let c = ((f * c)? + (i * g)?)?;
        let h = (o * c.tanh()?)?;
        Ok((h, c))
    }
}

fn sigmoid(x: &Tensor) -> Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// The LSTM's recurrent state for a batch of envs: `h`, `c`: `[N, H]`.
#[derive(Clone, Debug)]
pub struct Recurrent {
    pub h: Tensor,
    pub c: Tensor,
}

impl Recurrent {
    pub fn zeros(n: usize, hidden: usize, dtype: DType, device: &Device) -> Result<Self> {
        Ok(Self {
            h: Tensor::zeros((n, hidden), dtype, device)?,
            c: Tensor::zeros((n, hidden), dtype, device)?,
        })
    }

    /// The state with the rows where `zero[row]` holds set to zero (a new episode starts there); the
    /// state itself when none does.
    pub fn zero_rows(&self, zero: &[bool]) -> Result<Self> {
        if !zero.iter().any(|&z| z) {
            return Ok(self.clone());
        }
        let keep: Vec<f32> = zero.iter().map(|&z| if z { 0.0 } else { 1.0 }).collect();
        let keep = Tensor::from_vec(keep, (zero.len(), 1), self.h.device())?.to_dtype(self.h.dtype())?;
        Ok(Self { h: self.h.broadcast_mul(&keep)?, c: self.c.broadcast_mul(&keep)? })
    }
}

/// What one forward gives: per head `[N, size]` logits (unmasked), V `[N]`, the trunk's output
/// `[N, H]` (for Q and the contribution predictor) and the new recurrent state. For a sequence the
/// leading `N` is `B·T`, batch-major (row `b·T + t`).
#[derive(Debug)]
pub struct PolicyOutput {
    pub logits: Vec<Tensor>,
    pub value: Tensor,
    pub lstm_out: Tensor,
    pub state: Recurrent,
}

/// The network's weights (candle `Var`s, so the update can differentiate and step them).
#[derive(Debug)]
pub struct PolicyNet {
    pub shape: PolicyShape,
    embedding: Var,
    feature: Linear,
    feature_norm: LayerNorm,
    lstm: Lstm,
    lstm_norm: LayerNorm,
    heads: Vec<Mlp>,
    value: Mlp,
    q: Mlp,
    contribution: Mlp,
}

/// Draws weights from one stream in a fixed order.
struct Init<'a> {
    stream: Stream,
    dtype: DType,
    device: &'a Device,
}

impl Init<'_> {
    fn var(&self, data: Vec<f64>, shape: &[usize]) -> Result<Var> {
        Var::from_tensor(&Tensor::from_vec(data, shape, self.device)?.to_dtype(self.dtype)?)
    }

    fn normal(&mut self) -> f64 {
        // Box–Muller on two uniforms from (0, 1].
        let u1 = 1.0 - self.stream.next_f64();
        let u2 = self.stream.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `torch.nn.init.orthogonal_` for a `[rows, cols]` weight: a Gaussian matrix, made tall, its
    /// reduced QR (modified Gram–Schmidt, which gives R a positive diagonal, as the reference's sign
    /// fix does), transposed back, times `gain`.
    fn orthogonal(&mut self, rows: usize, cols: usize, gain: f64) -> Vec<f64> {
        let (tall, narrow) = (rows.max(cols), rows.min(cols));
        // Columns of the tall matrix, each `tall` long.
        let mut q: Vec<Vec<f64>> = (0..narrow).map(|_| Vec::new()).collect();
        let gaussian: Vec<f64> = (0..tall * narrow).map(|_| self.normal()).collect();
        for (j, column) in q.iter_mut().enumerate() {
            *column = (0..tall).map(|i| gaussian[i * narrow + j]).collect();
        }
        for j in 0..narrow {
            for k in 0..j {
                let dot: f64 = q[j].iter().zip(&q[k]).map(|(a, b)| a * b).sum();
                let qk = q[k].clone();
                q[j].iter_mut().zip(&qk).for_each(|(a, b)| *a -= dot * b);
            }
            let norm = q[j].iter().map(|a| a * a).sum::<f64>().sqrt();
            q[j].iter_mut().for_each(|a| *a /= norm);
        }
        // Tall is [tall, narrow] = Q; the weight is Q itself when rows ≥ cols, else Qᵀ.
        let mut w = vec![0.0; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                w[r * cols + c] = gain * if rows >= cols { q[c][r] } else { q[r][c] };
            }
        }
        w
    }

    fn linear(&mut self, inputs: usize, outputs: usize, gain: f64) -> Result<Linear> {
        let weight = self.orthogonal(outputs, inputs, gain);
        Ok(Linear {
            weight: self.var(weight, &[outputs, inputs])?,
            bias: self.var(vec![0.0; outputs], &[outputs])?,
        })
    }

    fn norm(&mut self, width: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: self.var(vec![1.0; width], &[width])?,
            beta: self.var(vec![0.0; width], &[width])?,
        })
    }

    /// Hidden layers of `widths` (with LayerNorm where `norms` says), then the last layer with `last_gain`.
    fn mlp(
        &mut self,
        inputs: usize,
        widths: &[usize],
        norms: &[bool],
        outputs: usize,
        last_gain: f64,
    ) -> Result<Mlp> {
        let mut hidden = Vec::new();
        let mut width = inputs;
        for (&w, &norm) in widths.iter().zip(norms) {
            let linear = self.linear(width, w, std::f64::consts::SQRT_2)?;
            hidden.push((linear, if norm { Some(self.norm(w)?) } else { None }));
            width = w;
        }
        Ok(Mlp { hidden, last: self.linear(width, outputs, last_gain)? })
    }
}

impl PolicyNet {
    /// Fresh weights (tamiyo §4.2) from the stream `key`: every Linear orthogonal with gain √2 and zero
    /// bias, the last layer of each policy head gain 0.01, of V and Q gain 0.1, of the contribution
    /// predictor 0.1; LSTM weights orthogonal (gain 1), biases 0 but the forget slice `[H, 2H)` = 1 in
    /// both bias vectors (`1 + ln L`, L = 1 layer); embedding N(0, 0.02); LayerNorm γ = 1, β = 0.
    pub fn init(shape: PolicyShape, key: StreamKey, dtype: DType, device: &Device) -> Result<Self> {
        let mut init = Init { stream: key.stream(0), dtype, device };
        let (s, h, hh) = (shape.n_slots, shape.hidden, shape.head_hidden);
        let embedding: Vec<f64> =
            (0..(BLUEPRINT_IDS + 1) * EMBED_DIM).map(|_| 0.02 * init.normal()).collect();
        let embedding = init.var(embedding, &[BLUEPRINT_IDS + 1, EMBED_DIM])?;
        let feature = init.linear(shape.obs_dim + EMBED_DIM * s, h, std::f64::consts::SQRT_2)?;
        let feature_norm = init.norm(h)?;
        let w_ih = init.orthogonal(4 * h, h, 1.0);
        let w_hh = init.orthogonal(4 * h, h, 1.0);
        let bias: Vec<f64> = (0..4 * h).map(|i| if (h..2 * h).contains(&i) { 1.0 } else { 0.0 }).collect();
        let lstm = Lstm {
            w_ih: init.var(w_ih, &[4 * h, h])?,
            w_hh: init.var(w_hh, &[4 * h, h])?,
            b_ih: init.var(bias.clone(), &[4 * h])?,
            b_hh: init.var(bias, &[4 * h])?,
        };
        let lstm_norm = init.norm(h)?;
        let mut heads = Vec::new();
        for (k, size) in shape.head_sizes().into_iter().enumerate() {
            // The blueprint head has a hidden layer of H before the H/2 one (3 layers).
            let widths: &[usize] = if k == 1 { &[h, hh] } else { &[hh] };
            heads.push(init.mlp(h, widths, &vec![false; widths.len()], size, 0.01)?);
        }
        let critic_widths = [hh, hh / 2, hh / 4];
        let value = init.mlp(h, &critic_widths, &[true, true, false], 1, 0.1)?;
        let q = init.mlp(h + 6, &critic_widths, &[true, true, false], 1, 0.1)?;
        let contribution = init.mlp(h, &[hh, hh / 2], &[true, false], s, 0.1)?;
        Ok(Self { shape, embedding, feature, feature_norm, lstm, lstm_norm, heads, value, q, contribution })
    }

    /// Every trainable variable, in a fixed order (the optimizer's and the checkpoint's).
    pub fn vars(&self) -> Vec<Var> {
        let mut out = vec![self.embedding.clone()];
        let linear = |l: &Linear, out: &mut Vec<Var>| out.extend([l.weight.clone(), l.bias.clone()]);
        let norm = |n: &LayerNorm, out: &mut Vec<Var>| out.extend([n.gamma.clone(), n.beta.clone()]);
        let mlp = |m: &Mlp, out: &mut Vec<Var>| {
            for (l, n) in &m.hidden {
                linear(l, out);
                if let Some(n) = n {
                    norm(n, out);
                }
            }
            linear(&m.last, out);
        };
        linear(&self.feature, &mut out);
        norm(&self.feature_norm, &mut out);
        out.extend([
            self.lstm.w_ih.clone(),
            self.lstm.w_hh.clone(),
            self.lstm.b_ih.clone(),
            self.lstm.b_hh.clone(),
        ]);
        norm(&self.lstm_norm, &mut out);
        for head in self.heads.iter().chain([&self.value, &self.q, &self.contribution]) {
            mlp(head, &mut out);
        }
        out
    }

    /// The feature net's output `[N, H]` for observations `[N, D]` and blueprint indices `[N, S]`
    /// (−1 for an empty slot). An index outside −1..13 is an error.
    fn features(&self, obs: &Tensor, blueprints: &[i64]) -> Result<Tensor> {
        let n = obs.dim(0)?;
        let s = self.shape.n_slots;
        if blueprints.len() != n * s {
            candle_core::bail!("{} blueprint indices for {n} rows of {s} slots", blueprints.len());
        }
        let rows = blueprints
            .iter()
            .map(|&b| match b {
                -1 => Ok(BLUEPRINT_IDS as u32),
                0..13 => Ok(b as u32),
                _ => candle_core::bail!("blueprint index {b} is not in −1..13"),
            })
            .collect::<Result<Vec<u32>>>()?;
        let ids = Tensor::from_vec(rows, n * s, obs.device())?;
        let embedded = self.embedding.as_tensor().index_select(&ids, 0)?.reshape((n, s * EMBED_DIM))?;
        let x = Tensor::cat(&[obs, &embedded], 1)?;
        self.feature_norm.forward(&self.feature.forward(&x)?)?.relu()
    }

    fn outputs(&self, lstm_out: Tensor, state: Recurrent) -> Result<PolicyOutput> {
        let logits = self.heads.iter().map(|head| head.forward(&lstm_out)).collect::<Result<Vec<_>>>()?;
        let value = self.value.forward(&lstm_out)?.squeeze(1)?;
        Ok(PolicyOutput { logits, value, lstm_out, state })
    }

    /// One step for `N` envs: observations `[N, D]`, blueprint indices `[N·S]` (row-major), state `[N, H]`.
    pub fn step(&self, obs: &Tensor, blueprints: &[i64], state: &Recurrent) -> Result<PolicyOutput> {
        let f = self.features(obs, blueprints)?;
        let (h, c) = self.lstm.step(&f, &state.h, &state.c)?;
        let lstm_out = (self.lstm_norm.forward(&h)? + &f)?;
        self.outputs(lstm_out, Recurrent { h, c })
    }

    /// `T` steps for `B` envs from `state` (the PPO update's full-sequence pass): observations
    /// `[B, T, D]`, blueprint indices `[B·T·S]`; outputs with rows `b·T + t`. Gradients flow through
    /// time to the start. `resets` (`[B·T]`, or empty for none) marks the steps before which a row's
    /// state goes back to zero (a new episode after a rollback ended one mid-row).
    pub fn sequence(
        &self,
        obs: &Tensor,
        blueprints: &[i64],
        state: &Recurrent,
        resets: &[bool],
    ) -> Result<PolicyOutput> {
        let (b, t, d) = obs.dims3()?;
        if !resets.is_empty() && resets.len() != b * t {
            candle_core::bail!("{} reset flags for {b} rows of {t} steps", resets.len());
        }
        // The feature net has no recurrence: all B·T rows at once.
        let f = self.features(&obs.reshape((b * t, d))?, blueprints)?.reshape((b, t, self.shape.hidden))?;
        let mut state = state.clone();
        let mut hs = Vec::with_capacity(t);
        let mut reset_now = vec![false; b];
        for step in 0..t {
            if !resets.is_empty() {
                reset_now.iter_mut().enumerate().for_each(|(row, r)| *r = resets[row * t + step]);
                state = state.zero_rows(&reset_now)?;
            }
            let x = f.narrow(1, step, 1)?.squeeze(1)?;
            let (h, c) = self.lstm.step(&x, &state.h, &state.c)?;
            hs.push(h.clone());
            state = Recurrent { h, c };
        }
        let hs = Tensor::stack(&hs, 1)?.reshape((b * t, self.shape.hidden))?;
        let lstm_out = (self.lstm_norm.forward(&hs)? + f.reshape((b * t, self.shape.hidden))?)?;
        self.outputs(lstm_out, state)
    }

    /// Q(s, op) `[N]` from the trunk's output (detached here: only the Q head learns from it) and the op
    /// indices `[N]`.
    pub fn q_value(&self, lstm_out: &Tensor, ops: &[u8]) -> Result<Tensor> {
        let n = lstm_out.dim(0)?;
        let mut onehot = vec![0f32; n * 6];
        for (row, &op) in ops.iter().enumerate() {
            onehot[row * 6 + (op as usize).min(5)] = 1.0;
        }
        let onehot = Tensor::from_vec(onehot, (n, 6), lstm_out.device())?.to_dtype(lstm_out.dtype())?;
        self.q.forward(&Tensor::cat(&[&lstm_out.detach(), &onehot], 1)?)?.squeeze(1)
    }

    /// The contribution predictor's `[N, S]` from the trunk's output (detached: it does not shape the
    /// trunk, the reference's default).
    pub fn contribution(&self, lstm_out: &Tensor) -> Result<Tensor> {
        self.contribution.forward(&lstm_out.detach())
    }
}

/// The stream the network is drawn from for run `seed`.
pub fn init_key(seed: u64) -> StreamKey {
    StreamKey::new(seed, 0, 0, Purpose::PolicyInit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> PolicyShape {
        PolicyShape { n_slots: 2, obs_dim: 5, hidden: 8, head_hidden: 8 }
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()
    }

    fn input(n: usize, d: usize, seed: u64) -> Tensor {
        let mut s = StreamKey::new(seed, 0, 0, Purpose::Test).stream(0);
        let data: Vec<f64> = (0..n * d).map(|_| s.uniform(-1.0, 1.0)).collect();
        Tensor::from_vec(data, (n, d), &Device::Cpu).unwrap()
    }

    #[test]
    fn init_follows_the_reference_recipe() {
        let shape = PolicyShape::reference(3);
        let net = PolicyNet::init(shape, init_key(1), DType::F32, &Device::Cpu).unwrap();
        // W_ih [2048, 512] is tall: its columns are orthonormal, WᵀW = I.
        let w = net.lstm.w_ih.as_tensor().to_dtype(DType::F64).unwrap();
        let wtw = values(&w.t().unwrap().matmul(&w).unwrap());
        for i in 0..512 {
            for j in 0..512 {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((wtw[i * 512 + j] - want).abs() < 1e-4, "WᵀW[{i},{j}] = {}", wtw[i * 512 + j]);
            }
        }
        // The forget slice of both biases is 1, the rest 0.
        for b in [&net.lstm.b_ih, &net.lstm.b_hh] {
            let b = values(b.as_tensor());
            assert!(
                b.iter().enumerate().all(|(i, &v)| v == if (512..1024).contains(&i) { 1.0 } else { 0.0 })
            );
        }
        // A policy head's last layer [6, 256] is wide: orthonormal rows times 0.01.
        let last = net.heads[7].last.weight.as_tensor().to_dtype(DType::F64).unwrap();
        let wwt = values(&last.matmul(&last.t().unwrap()).unwrap());
        for i in 0..6 {
            for j in 0..6 {
                let want = if i == j { 1e-4 } else { 0.0 };
                assert!((wwt[i * 6 + j] - want).abs() < 1e-8, "{i},{j}: {}", wwt[i * 6 + j]);
            }
        }
        // The feature layer [512, 116 + 12] is tall, gain √2: WᵀW = 2I.
        let f = net.feature.weight.as_tensor().to_dtype(DType::F64).unwrap();
        assert_eq!(f.dims(), [512, 128]);
        let ftf = values(&f.t().unwrap().matmul(&f).unwrap());
        assert!((ftf[0] - 2.0).abs() < 1e-4 && ftf[1].abs() < 1e-4);
        // The same key gives the same weights; another key others.
        let again = PolicyNet::init(shape, init_key(1), DType::F32, &Device::Cpu).unwrap();
        let other = PolicyNet::init(shape, init_key(2), DType::F32, &Device::Cpu).unwrap();
        let first = |n: &PolicyNet| values(n.vars()[1].as_tensor());
        assert_eq!(first(&net), first(&again));
        assert_ne!(first(&net), first(&other));
        assert_eq!(net.vars().len(), again.vars().len());
    }

    /// The LSTM cell against the equations written out in f64 for one row.
    #[test]
    fn lstm_step_matches_the_gate_equations() {
        let shape = tiny();
        let net = PolicyNet::init(shape, init_key(3), DType::F64, &Device::Cpu).unwrap();
        let h_dim = shape.hidden;
        let x = input(1, h_dim, 1);
        let h0 = input(1, h_dim, 2);
        let c0 = input(1, h_dim, 3);
        let (h, c) = net.lstm.step(&x, &h0, &c0).unwrap();
        let (w_ih, w_hh) = (values(net.lstm.w_ih.as_tensor()), values(net.lstm.w_hh.as_tensor()));
        let (b_ih, b_hh) = (values(net.lstm.b_ih.as_tensor()), values(net.lstm.b_hh.as_tensor()));
        let (x, h0, c0) = (values(&x), values(&h0), values(&c0));
        let pre = |row: usize| -> f64 {
            let a: f64 = (0..h_dim).map(|k| w_ih[row * h_dim + k] * x[k]).sum();
            let b: f64 = (0..h_dim).map(|k| w_hh[row * h_dim + k] * h0[k]).sum();
            a + b + b_ih[row] + b_hh[row]
        };
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let (h, c) = (values(&h), values(&c));
        for j in 0..h_dim {
            let (i, f, g, o) =
                (sig(pre(j)), sig(pre(h_dim + j)), pre(2 * h_dim + j).tanh(), sig(pre(3 * h_dim + j)));
            let c_want = f * c0[j] + i * g;
            assert!((c[j] - c_want).abs() < 1e-12);
            assert!((h[j] - o * c_want.tanh()).abs() < 1e-12);
        }
    }

    /// T single steps from the same state give what one sequence pass gives (rows b·T + t).
    #[test]
    fn sequence_equals_repeated_steps() {
        let shape = tiny();
        let net = PolicyNet::init(shape, init_key(4), DType::F64, &Device::Cpu).unwrap();
        let (b, t) = (3, 4);
        let obs = input(b * t, shape.obs_dim, 5).reshape((b, t, shape.obs_dim)).unwrap();
        let blueprints: Vec<i64> = (0..b * t * 2).map(|i| [-1, 0, 1, 7, 12][i % 5]).collect();
        let start = Recurrent { h: input(b, shape.hidden, 6), c: input(b, shape.hidden, 7) };
        let seq = net.sequence(&obs, &blueprints, &start, &[]).unwrap();
        let mut state = start.clone();
        for step in 0..t {
            let o = obs.narrow(1, step, 1).unwrap().squeeze(1).unwrap();
            let bp: Vec<i64> = (0..b)
                .flat_map(|row| blueprints[(row * t + step) * 2..(row * t + step) * 2 + 2].to_vec())
                .collect();
            let out = net.step(&o, &bp, &state).unwrap();
            for row in 0..b {
                let r = row * t + step;
                for (k, logits) in out.logits.iter().enumerate() {
                    let size = logits.dim(1).unwrap();
                    let a = values(&logits.narrow(0, row, 1).unwrap());
                    let s = values(&seq.logits[k].narrow(0, r, 1).unwrap());
                    assert_eq!(a.len(), size);
                    assert!(
                        a.iter().zip(&s).all(|(x, y)| (x - y).abs() < 1e-12),
                        "head {k} row {row} step {step}"
                    );
                }
                let (va, vs) = (values(&out.value)[row], values(&seq.value)[r]);
                assert!((va - vs).abs() < 1e-12);
            }
            state = out.state;
        }
        assert!(values(&state.h).iter().zip(values(&seq.state.h)).all(|(a, b)| (a - b).abs() < 1e-12));
        // A blueprint index outside −1..13 is an error, not a panic.
        assert!(
            net.step(
                &input(1, shape.obs_dim, 8),
                &[13, 0],
                &Recurrent::zeros(1, 8, DType::F64, &Device::Cpu).unwrap()
            )
            .is_err()
        );
    }

    /// A reset before step k of a row gives that row's steps k.. what a fresh sequence from the zero
    /// state over the same inputs gives; the other rows are untouched.
    #[test]
    fn a_reset_restarts_the_row_from_the_zero_state() {
        let shape = tiny();
        let net = PolicyNet::init(shape, init_key(12), DType::F64, &Device::Cpu).unwrap();
        let (b, t, k) = (2, 5, 2);
        let obs = input(b * t, shape.obs_dim, 13).reshape((b, t, shape.obs_dim)).unwrap();
        let blueprints: Vec<i64> = (0..b * t * 2).map(|i| [-1, 3, 5][i % 3]).collect();
        let start = Recurrent { h: input(b, shape.hidden, 14), c: input(b, shape.hidden, 15) };
        let mut resets = vec![false; b * t];
        resets[k] = true; // row 0, before step k
        let with = net.sequence(&obs, &blueprints, &start, &resets).unwrap();
        let without = net.sequence(&obs, &blueprints, &start, &[]).unwrap();
        let tail = obs.narrow(0, 0, 1).unwrap().narrow(1, k, t - k).unwrap();
        let fresh = net
            .sequence(
                &tail,
                &blueprints[k * 2..t * 2],
                &Recurrent::zeros(1, 8, DType::F64, &Device::Cpu).unwrap(),
                &[],
            )
            .unwrap();
        let v = |x: &PolicyOutput| values(&x.value);
        let (w, wo, f) = (v(&with), v(&without), v(&fresh));
        for step in 0..t {
            if step < k {
                assert_eq!(w[step], wo[step], "before the reset");
            } else {
                assert!((w[step] - f[step - k]).abs() < 1e-12, "step {step}");
                assert!((w[step] - wo[step]).abs() > 1e-9, "the reset changed step {step}");
            }
            assert_eq!(w[t + step], wo[t + step], "row 1 has no reset");
        }
    }

    /// Autograd through two LSTM steps, every head and the critic, against central differences on a
    /// few weights of the LSTM and the embedding (f64).
    #[test]
    fn gradients_through_time_match_finite_differences() {
        let shape = tiny();
        let net = PolicyNet::init(shape, init_key(9), DType::F64, &Device::Cpu).unwrap();
        let obs = input(2 * 2, shape.obs_dim, 10).reshape((2, 2, shape.obs_dim)).unwrap();
        let blueprints = [1, -1, 3, 7, 0, 2, -1, -1];
        let start = Recurrent::zeros(2, shape.hidden, DType::F64, &Device::Cpu).unwrap();
        let weights = input(8, 1, 11);
        let loss = |net: &PolicyNet| -> Tensor {
            let out = net.sequence(&obs, &blueprints, &start, &[]).unwrap();
            let mut total = out.value.sqr().unwrap().sum_all().unwrap();
            for (k, logits) in out.logits.iter().enumerate() {
                let w = weights.narrow(0, k, 1).unwrap().squeeze(0).unwrap().squeeze(0).unwrap();
                total =
                    (total + logits.tanh().unwrap().sum_all().unwrap().broadcast_mul(&w).unwrap()).unwrap();
            }
            total
        };
        let grads = loss(&net).backward().unwrap();
        for var in [&net.lstm.w_hh, &net.lstm.w_ih, &net.embedding, &net.feature.weight] {
            let analytic = values(grads.get(var).unwrap());
            let base = values(var.as_tensor());
            for &i in &[0usize, 5, 17, 30] {
                let i = i % base.len();
                let eps = 1e-6;
                let mut plus = base.clone();
                plus[i] += eps;
                var.set(&Tensor::from_vec(plus, var.dims(), &Device::Cpu).unwrap()).unwrap();
                let up = values(&loss(&net))[0];
                let mut minus = base.clone();
                minus[i] -= eps;
                var.set(&Tensor::from_vec(minus, var.dims(), &Device::Cpu).unwrap()).unwrap();
                let down = values(&loss(&net))[0];
                var.set(&Tensor::from_vec(base.clone(), var.dims(), &Device::Cpu).unwrap()).unwrap();
                let numeric = (up - down) / (2.0 * eps);
                assert!(
                    (numeric - analytic[i]).abs() < 1e-6 * (1.0 + numeric.abs()),
                    "{i}: {numeric} vs {}",
                    analytic[i]
                );
            }
        }
    }
}
